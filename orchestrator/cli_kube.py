"""Cluster-side pieces of the CLI: the ``doctor`` command and the logs of a cluster run.

``orchestrator.cli`` calls :func:`register` to add ``doctor``; its ``logs`` command hands a
run submitted with the kube backend to :func:`kube_logs`. This module does not import
``orchestrator.cli`` (which imports it), so errors are plain ``click.ClickException``s
carrying the CLI's exit codes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import click

from orchestrator.backends import BackendError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class KubeCliError(click.ClickException):
    """One line on stderr (``xrun: error: ...``) and the exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code


# ---------------------------------------------------------------------------------------
# Logs of a cluster run: live pods first, storage for what the pods no longer hold.


def kube_log_lines(storage, name: str, backend, *, follow: bool = False, hosts: set[str] | None = None,
                   since_seconds: float | None = None, tail: int | None = None) -> Iterator[tuple[str, int, str]]:
    """(host, attempt, line) of a cluster run.

    Restart attempts whose pods are gone (or every attempt, when the JobSet is gone) come
    from the chunks the pod wrapper shipped to storage; attempts with pods are streamed from
    the pods (concurrently, following new pods after a restart when ``follow``). ``tail``
    is the last lines of each live pod, or of each host in storage when no pod is left.
    """
    from orchestrator.readers import LogFollower
    from xrun_contract import TERMINAL_STATES

    try:
        live = backend.live_attempts(name)
        status = backend.status(name) if follow and not live else None
    except BackendError as e:
        click.echo(f"xrun: warning: kube backend: {e}; showing the logs in storage", err=True)
        live, status = set(), None
    from_pods = bool(live) or (status is not None and status.state not in TERMINAL_STATES)
    first_live = min(live) if live else None
    since_ts = time.time() - since_seconds if since_seconds is not None else None
    stored = [x for x in LogFollower(storage, name, hosts, since_ts).poll()
              if not from_pods or first_live is None or x[1] < first_live]
    if tail is not None and live:
        stored = []  # the last lines of each host are its live pod's
    if tail is not None:
        per_host: dict[str, list[tuple[str, int, str]]] = {}
        for item in stored:
            per_host.setdefault(item[0], []).append(item)
        keep = {id(x) for items in per_host.values() for x in (items[-tail:] if tail else [])}
        stored = [x for x in stored if id(x) in keep]
    yield from stored
    if from_pods:
        yield from backend.stream_logs(
            name, follow=follow, since_seconds=int(since_seconds) if since_seconds is not None else None,
            tail_lines=tail, hosts=hosts,
        )


def kube_logs(storage, name: str, backend, *, follow: bool = False, hosts: set[str] | None = None,
              since_seconds: float | None = None, tail: int | None = None, prefix: bool = True) -> int:
    """Print a cluster run's logs as ``xrun logs`` does; returns the exit code."""
    from orchestrator.readers import host_prefix

    try:
        for host, attempt, line in kube_log_lines(storage, name, backend, follow=follow, hosts=hosts,
                                                  since_seconds=since_seconds, tail=tail):
            click.echo(f"{host_prefix(host, attempt)} {line}" if prefix else line)
    except BackendError as e:
        raise KubeCliError(str(e), e.exit_code) from None
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_OK


# ---------------------------------------------------------------------------------------
# xrun doctor


def _doctor_inputs(run_file: str | None, flags: dict[str, Any]) -> dict[str, Any]:
    """The few run fields doctor needs: file values, flags over them, defaults under both."""
    import os

    from orchestrator.spec import default_storage, read_run_file
    from xrun_contract import Env

    values: dict[str, Any] = {}
    if run_file:
        data = read_run_file(run_file)
        values = {k: data[k] for k in ("accelerator", "num_slices", "nodes", "cpu_devices_per_host",
                                       "queue", "namespace", "context", "storage") if data.get(k) is not None}
    values.update({k: v for k, v in flags.items() if v is not None})
    values.setdefault("namespace", "default")
    values.setdefault("num_slices", 1)
    values.setdefault("nodes", 1)
    values["storage"] = values.get("storage") or os.environ.get(Env.STORAGE) or default_storage()
    for key in ("num_slices", "nodes"):
        if not isinstance(values[key], int) or isinstance(values[key], bool) or values[key] < 1:
            raise KubeCliError(f"{key}: must be an integer >= 1, got {values[key]!r}")
    return values


@click.command()
@click.option("--context", default=None, help="kubeconfig context. Default: the run file's, else the current one.")
@click.option("-n", "--namespace", default=None, help="Namespace. Default: the run file's, else 'default'.")
@click.option("-f", "--file", "run_file", type=click.Path(dir_okay=False),
              help="Run file: accelerator, num_slices, nodes, queue, namespace, context and storage come from it.")
@click.option("--accelerator", "--tpu", "accelerator", help="Shape to look for nodes of (e.g. v6e-32).")
@click.option("--num-slices", type=int, help="TPU slices (nodes needed = hosts per slice x slices).")
@click.option("--nodes", type=int, help="GPU nodes.")
@click.option("--queue", help="Kueue LocalQueue that must exist.")
@click.option("--storage", help="Storage root to write a probe to. Default: $XRUN_STORAGE.")
@click.option("-o", "--output", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def doctor(context: str | None, namespace: str | None, run_file: str | None, accelerator: str | None,
           num_slices: int | None, nodes: int | None, queue: str | None, storage: str | None, fmt: str) -> int:
    """Check that a cluster can run xrun's JobSets: API, JobSet CRD, Kueue queue, nodes, storage.

    Exit code: 0 all checks passed (warnings allowed), 1 a check failed, 2 bad input,
    3 the API or the storage root cannot be reached.

    \b
    Examples:
      xrun doctor --context gke_proj_zone_cluster
      xrun doctor -f run.yaml
      xrun doctor --context gke_p_z_c -n team --tpu v6e-32 --num-slices 2 --queue lq --storage gs://b/xrun
    """
    from manifests import catalogue
    from orchestrator import doctor as checks
    from orchestrator.backends.kube import KubeBackend

    v = _doctor_inputs(run_file, {"context": context, "namespace": namespace, "accelerator": accelerator,
                                  "num_slices": num_slices, "nodes": nodes, "queue": queue, "storage": storage})
    shape, needed = None, 0
    if v.get("accelerator"):
        try:
            shape = catalogue.lookup(str(v["accelerator"]), int(v.get("cpu_devices_per_host", 2)))
        except catalogue.UnknownAccelerator as e:
            raise KubeCliError(f"accelerator: {e}") from None
        needed = shape.vms * v["num_slices"] if shape.kind == "tpu" else v["nodes"]
    backend = KubeBackend(v.get("context") or None, v["namespace"])
    results = checks.run_checks(backend, shape=shape, needed_nodes=needed, queue=v.get("queue") or "",
                                storage_root=str(v["storage"]))
    code = checks.exit_code(results)
    if fmt == "json":
        click.echo(json.dumps({"checks": [c.as_dict() for c in results], "exit_code": code}, indent=2))
    else:
        for c in results:
            click.echo(f"{c.result:<5} {c.name:<8} {c.detail}")
    failed = [c for c in results if c.result == checks.FAIL]
    warned = [c for c in results if c.result == checks.WARN]
    if failed:
        click.echo(f"xrun: doctor: {len(failed)} check(s) failed: {', '.join(c.name for c in failed)}", err=True)
    else:
        click.echo(f"xrun: doctor: all checks passed{f' ({len(warned)} warning(s))' if warned else ''}", err=True)
    return code


def register(cli: click.Group) -> None:
    """Add the cluster commands to the ``xrun`` group (called by ``orchestrator.cli``)."""
    cli.add_command(doctor)
