"""The `xrun` command line (Click), in kubectl's manner.

Exit codes: 0 ok; 1 the run (or comparison) failed / regressed; 2 bad input (one line on
stderr naming the field, nothing submitted or written); 3 cluster or storage unreachable;
130 interrupted.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click
import yaml

from orchestrator.spec import (
    RunSpec,
    SpecError,
    build_spec,
    parse_env_pairs,
    read_env_file,
    read_run_file,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class XrunError(click.ClickException):
    """A one-line error with an exit code (2 for bad input unless said otherwise)."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code


class _ManifestDumper(yaml.SafeDumper):
    """Block style, except that lists of plain numbers (exit codes) stay on one line."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = bool(data) and all(isinstance(v, int) and not isinstance(v, bool) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_ManifestDumper.add_representer(list, _represent_list)


def dump_yaml(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_ManifestDumper, sort_keys=False, default_flow_style=False, width=100)


def dump(obj: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(obj, indent=2) + "\n"
    return dump_yaml(obj)


# ---------------------------------------------------------------------------------------
# Run spec options, shared by render and submit.

SPEC_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("-f", "--file", "run_file"), {"type": click.Path(dir_okay=False), "help": "YAML run file; flags override its keys."}),
    (("--name",), {"help": "Run (JobSet) name: a DNS-1035 label."}),
    (("--image",), {"help": "Workload container image."}),
    (("--command",), {"help": "Command run in every host (through /bin/sh -c). Default: python3 -m workload.train"}),
    (("--accelerator", "--tpu", "accelerator"), {"help": "Shape: v6e-1..v6e-256, v5litepod-N, v5p-N, v4-N, h100-80gb-8, h200-141gb-8, cpu-N."}),
    (("--num-slices",), {"type": int, "help": "TPU slices (multislice). Default 1."}),
    (("--nodes",), {"type": int, "help": "GPU nodes. Default 1."}),
    (("--cpu-devices-per-host",), {"type": int, "help": "CPU devices per host for cpu-N shapes. Default 2."}),
    (("--storage",), {"help": "Storage root: a folder or gs://bucket/prefix (env XRUN_STORAGE)."}),
    (("--env", "env_pairs"), {"multiple": True, "metavar": "KEY=VAL", "help": "Env var for every host (repeatable)."}),
    (("--env-file",), {"type": click.Path(dir_okay=False), "help": "File of KEY=VAL lines."}),
    (("--max-restarts",), {"type": int, "help": "JobSet failurePolicy.maxRestarts. Default 3."}),
    (("--restartable-exit-codes",), {"metavar": "CODES", "help": "Comma list of exit codes that restart the run (default 42,127-255)."}),
    (("--termination-grace-seconds",), {"type": int, "help": "Pod grace period. Default 120."}),
    (("--ttl-seconds-after-finished",), {"type": int, "help": "JobSet TTL. Default 86400."}),
    (("--service-account",), {"help": "Pod service account (Workload Identity for GCS)."}),
    (("--priority-class",), {"help": "Pod priorityClassName."}),
    (("--queue",), {"help": "Kueue LocalQueue name."}),
    (("--kueue-priority",), {"help": "Kueue WorkloadPriorityClass name."}),
    (("--privileged",), {"is_flag": True, "default": None, "help": "Run the container privileged."}),
    (("--branch",), {"help": "Branch the image was built from (for reports)."}),
    (("--commit",), {"help": "Commit the image was built from (for reports)."}),
    (("--backend",), {"type": click.Choice(["local", "kube"]), "help": "Default: kube when a --context is named, else local."}),
    (("--context",), {"help": "kubeconfig context (selects the GKE backend)."}),
    (("-n", "--namespace"), {"help": "Kubernetes namespace. Default 'default'."}),
]


def spec_options(fn):
    for decls, kwargs in reversed(SPEC_OPTIONS):
        fn = click.option(*decls, **kwargs)(fn)
    return fn


def _exit_codes(text: str) -> list[int]:
    codes: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not (lo.isdigit() and (not sep or hi.isdigit())):
            raise SpecError(f"restartable_exit_codes: {part!r} is not a code or range like 127-255")
        codes.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return codes


def spec_from_options(opts: dict[str, Any]) -> RunSpec:
    """Build and validate the RunSpec from a command's options (file first, flags over it)."""
    opts = dict(opts)
    run_file = opts.pop("run_file", None)
    file_values = read_run_file(run_file) if run_file else {}
    env = read_env_file(opts.pop("env_file")) if opts.get("env_file") else {}
    opts.pop("env_file", None)
    flag_env = parse_env_pairs(list(opts.pop("env_pairs", ()) or ()))
    for key in flag_env:
        if key in env:
            raise SpecError(f"--env: duplicate env key {key!r} (also in --env-file)")
    env.update(flag_env)
    codes = opts.pop("restartable_exit_codes", None)
    flags = {k: v for k, v in opts.items() if v is not None}
    if codes is not None:
        flags["restartable_exit_codes"] = _exit_codes(codes)
    if env:
        flags["env"] = env
    return build_spec(file_values, flags)


def render_manifest(spec: RunSpec) -> dict[str, Any]:
    from manifests.jobset import jobset

    return jobset(spec)


# ---------------------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="xrun")
def cli() -> None:
    """xrun: run multi-host JAX training on GKE TPU slices (JobSet), or locally.

    \b
    Examples:
      xrun submit -f examples/local-tiny.yaml            # 2 local hosts, trains, follows
      xrun render --name mt-07 --tpu v6e-32 --num-slices 2 --image IMG > jobset.yaml
      xrun submit -f run.yaml --context gke_proj_zone_cluster -n team
      xrun logs mt-07 -f
      xrun status mt-07 -o json
    """


@cli.command()
@spec_options
@click.option("-o", "--output", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@click.option("--output-file", type=click.Path(dir_okay=False), help="Write here instead of stdout.")
def render(fmt: str, output_file: str | None, **opts: Any) -> None:
    """Print the JobSet manifest of a run spec (nothing is submitted).

    \b
    Examples:
      xrun render --name mt-07-eval --tpu v6e-32 --num-slices 2 --image IMG \\
                  --command "python3 -m workload.train --preset 1b"
      xrun render -f run.yaml -o json --output-file jobset.json
      xrun render -f run.yaml | kubectl apply -f -
    """
    spec = spec_from_options(opts)
    text = dump(render_manifest(spec), fmt)
    if output_file:
        with open(output_file, "w") as f:
            f.write(text)
    else:
        click.echo(text, nl=False)


# ---------------------------------------------------------------------------------------
# Run lifecycle: submit, status, logs, checkpoints, list, delete.


def storage_option(fn):
    return click.option("--storage", help="Storage root (folder or gs://bucket/prefix). Default: $XRUN_STORAGE or ~/.local/share/xrun.")(fn)


def _storage(root: str | None):
    from orchestrator.spec import default_storage
    from xrun_contract import Env
    from xrun_contract.storage import open_storage

    root = root or os.environ.get(Env.STORAGE) or default_storage()
    try:
        return open_storage(root)
    except ValueError as e:
        raise XrunError(str(e)) from None


def backend_for(backend: str, storage_root: str, context: str = "", namespace: str = "default"):
    """The backend a run was (or is to be) submitted to."""
    if backend == "kube":
        from orchestrator.backends.kube import KubeBackend

        return KubeBackend(context or None, namespace or "default")
    from orchestrator.backends.local import LocalBackend

    return LocalBackend(storage_root)


def _run_record(storage, name: str) -> dict[str, Any]:
    from xrun_contract import Layout

    run = storage.read_json(Layout.run_json(name))
    if run is None and storage.read_json(Layout.state(name)) is None:
        raise XrunError(f"run: no run named {name!r} under {storage.root} (see 'xrun list')")
    return run or {}


def _backend_of(storage, name: str, context: str | None = None, namespace: str | None = None):
    run = _run_record(storage, name)
    kind = run.get("backend", "local")
    ctx = context if context is not None else run.get("context", "")
    ns = namespace or run.get("namespace", "default")
    return backend_for(kind, storage.root, ctx, ns)


def _live_status(backend, name: str, storage=None):
    """The backend's view of a run; for cluster runs also recorded into state.json, so
    storage still knows how the run ended after the JobSet (and its TTL) are gone."""
    from orchestrator.backends import BackendError

    try:
        status = backend.status(name)
    except BackendError as e:
        click.echo(f"xrun: warning: {backend.name} backend: {e}; showing what storage says", err=True)
        return None
    if status is not None and storage is not None and backend.name == "kube":
        record_cluster_state(storage, name, status.state, status.restarts, status.message)
    return status


def record_cluster_state(storage, name: str, state: str, restarts: int, message: str) -> None:
    """Append a transition to state.json when a cluster run's state changed."""
    import time

    from xrun_contract import Layout

    current = storage.read_json(Layout.state(name)) or {"backend": "kube", "transitions": []}
    if current.get("state") == state and current.get("restarts") == restarts:
        return
    current.update(state=state, restarts=restarts, message=message, updated=time.time())
    current.setdefault("transitions", []).append({"time": time.time(), "state": state, "reason": message})
    storage.write_json(Layout.state(name), current)


@cli.command()
@spec_options
@click.option("-d", "--detach", is_flag=True, help="Return once submitted.")
@click.option("--follow", "follow_logs", is_flag=True, help="Stream every host's log while following.")
@click.option("--dry-run", is_flag=True, help="Print the manifest that would be submitted; submit and write nothing.")
@click.option("--replace", is_flag=True, help="Replace a finished run of the same name (its stored data is removed).")
def submit(detach: bool, follow_logs: bool, dry_run: bool, replace: bool, **opts: Any) -> int:
    """Submit a run and follow it until it ends.

    Without --context the run executes on this machine: the rendered JobSet's pods become
    local host processes with the env a pod would get. Exit code: 0 Succeeded, 1 Failed,
    2 bad input, 3 cluster or storage unreachable, 130 interrupted (the run goes on).

    \b
    Examples:
      xrun submit -f examples/local-tiny.yaml --follow
      xrun submit -f run.yaml --context gke_p_z_c -n team --detach
      xrun submit --name smoke --accelerator cpu-2 --image local \\
                  --command "python3 -m workload.train --preset tiny steps=20"
    """
    import time

    from orchestrator.backends import BackendError
    from xrun_contract import XRUN_VERSION, Layout

    spec = spec_from_options(opts)
    manifest = render_manifest(spec)
    if dry_run:
        click.echo(dump_yaml(manifest), nl=False)
        return EXIT_OK
    storage = _storage(spec.storage_root)
    backend = backend_for(spec.backend_name, spec.storage_root, spec.context, spec.namespace)
    try:
        existing = storage.read_json(Layout.state(spec.name)) or storage.read_json(Layout.run_json(spec.name))
    except Exception as e:  # noqa: BLE001 - any client error here means storage is unreachable
        raise XrunError(f"storage: cannot read {storage.root}: {e}", EXIT_UNREACHABLE) from None
    if existing is not None:
        live = _live_status(backend, spec.name) if spec.backend_name == "local" else None
        if live is not None and live.state not in ("Succeeded", "Failed", "Deleted"):
            raise XrunError(f"name: run {spec.name!r} is {live.state}; choose another name or 'xrun delete {spec.name}'")
        if not replace:
            raise XrunError(f"name: run {spec.name!r} already exists under {storage.root}; use --replace or another name")
        storage.delete_prefix(Layout.run(spec.name))
    run_json = {
        "name": spec.name, "spec": spec.to_dict(), "submitted_at": time.time(),
        "backend": spec.backend_name, "context": spec.context, "namespace": spec.namespace,
        "xrun_version": XRUN_VERSION, "storage": storage.root,
    }
    try:  # manifest and run.json first: the run is traceable even if the cluster rejects it
        storage.write_json(Layout.run_json(spec.name), run_json)
        storage.write_text(Layout.manifest(spec.name), dump_yaml(manifest))
    except Exception as e:  # noqa: BLE001
        raise XrunError(f"storage: cannot write to {storage.root}: {e}", EXIT_UNREACHABLE) from None
    try:
        backend.submit(manifest, replace=replace)
    except BackendError as e:
        raise XrunError(str(e), e.exit_code) from None
    click.echo(f"xrun: submitted {spec.name} ({spec.backend_name} backend, {spec.accelerator}"
               f"{f' x{spec.slices} slices' if spec.slices > 1 else ''}); storage {storage.url(Layout.run(spec.name))}",
               err=True)
    if detach:
        click.echo(f"xrun: follow with: xrun logs {spec.name} -f   |   xrun status {spec.name}", err=True)
        return EXIT_OK
    return follow_run(storage, spec.name, backend, follow_logs)


def follow_run(storage, name: str, backend, show_logs: bool) -> int:
    """Follow a run to its end: live status (TTY) or progress lines, logs when asked."""
    import time

    from rich.console import Console
    from rich.live import Live

    from orchestrator.readers import LogFollower, MetricsReader, host_prefix, is_terminal
    from orchestrator.screen import render_table, run_view, summary_lines

    started = time.time()
    console = Console(stderr=True)
    metrics = MetricsReader(storage, name)
    logs = LogFollower(storage, name) if show_logs else None
    live_screen = console.is_terminal and not show_logs
    last_state, last_report = None, 0.0
    seen_events: set[str] = set()
    view = None
    live_ctx = Live(console=console, refresh_per_second=4, transient=False) if live_screen else None
    try:
        if live_ctx:
            live_ctx.start()
        while True:
            status = _live_status(backend, name, storage)
            view = run_view(storage, name, status, metrics)
            if view is None:
                time.sleep(0.5)
                continue
            done = is_terminal(view["state"])
            if logs:
                for host, attempt, line in logs.poll():
                    click.echo(f"{host_prefix(host, attempt)} {line}")
            if live_ctx:
                live_ctx.update(render_table(view))
            else:
                reasons = [f"host {h.get('host')} {h.get('state')}: {h['reason']}"
                           for h in view["hosts"] if h.get("reason")]
                for event in [*reasons, *(view.get("events") or [])]:  # why pods wait, once each
                    if event not in seen_events:
                        seen_events.add(event)
                        click.echo(f"xrun: {name} event: {event}", err=True)
                if view["state"] != last_state:
                    msg = f" ({view['message']})" if view["message"] else ""
                    click.echo(f"xrun: {name} {view['state']}{msg}", err=True)
                    last_state = view["state"]
                elif not show_logs and view["step"] is not None and time.time() - last_report > 10:
                    click.echo(f"xrun: {name} step {view['step']} loss {view['loss']:.4f}", err=True)
                    last_report = time.time()
            if done:
                if logs:  # the last chunks are written before the pods exit
                    for host, attempt, line in logs.poll():
                        click.echo(f"{host_prefix(host, attempt)} {line}")
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        if live_ctx:
            live_ctx.stop()
            live_ctx = None
        if sys.stdin.isatty():
            choice = click.prompt("\nStop the run, or detach and leave it running?",
                                  type=click.Choice(["stop", "detach"]), default="detach")
            if choice == "stop":
                backend.delete(name, wait=True)
                click.echo(f"xrun: stopped {name}", err=True)
                return EXIT_INTERRUPTED
        click.echo(f"\nxrun: detached; {name} keeps running (xrun status {name}, xrun delete {name})", err=True)
        return EXIT_INTERRUPTED
    finally:
        if live_ctx:
            live_ctx.stop()
    for line in summary_lines(view, started):
        click.echo(line, err=True)
    return EXIT_OK if view["state"] == "Succeeded" else EXIT_FAILED


def plain_table(*columns: str):
    """kubectl-style table: no borders, bold headers."""
    from rich.table import Table

    table = Table(box=None, header_style="bold", show_edge=False)
    for col in columns:
        table.add_column(col)
    return table


OUTPUT = click.option("-o", "--output", "fmt", type=click.Choice(["table", "json", "yaml"]), default="table", show_default=True)


@cli.command()
@click.argument("name")
@storage_option
@OUTPUT
@click.option("--context", default=None, help="Override the kubeconfig context recorded at submit.")
@click.option("-n", "--namespace", default=None)
def status(name: str, storage: str | None, fmt: str, context: str | None, namespace: str | None) -> int:
    """Show a run's state, hosts, progress, latest checkpoint and goodput.

    Works from storage alone when the pods (or the cluster objects) are gone.

    \b
    Examples:
      xrun status mt-07
      xrun status mt-07 -o json | jq .state
    """
    from rich.console import Console

    from orchestrator.screen import render_table, run_view

    st = _storage(storage)
    backend = _backend_of(st, name, context, namespace)
    view = run_view(st, name, _live_status(backend, name, st))
    if view is None:
        raise XrunError(f"run: no run named {name!r} under {st.root}")
    if fmt == "table":
        Console(soft_wrap=True).print(render_table(view))
    else:
        click.echo(dump(view, fmt), nl=False)
    return EXIT_OK


@cli.command()
@click.argument("name")
@storage_option
@click.option("-f", "--follow", is_flag=True, help="Keep streaming new lines (and new restart attempts).")
@click.option("--host", "hosts", multiple=True, metavar="S-H", help="Only this host, e.g. 0-1 (repeatable).")
@click.option("--all", "all_hosts", is_flag=True, help="Every host (the default).")
@click.option("--since", help="Only chunks written in the last 30s/10m/2h/1d.")
@click.option("--tail", type=int, help="Only the last N lines of each host (before following).")
@click.option("--prefix/--no-prefix", default=True, show_default=True, help="Prefix lines with [slice-host].")
def logs(name: str, storage: str | None, follow: bool, hosts: tuple[str, ...], all_hosts: bool,
         since: str | None, tail: int | None, prefix: bool) -> int:
    """Print every host's log from storage, merged, each line prefixed by its host.

    \b
    Examples:
      xrun logs mt-07 -f
      xrun logs mt-07 --host 0-1 --tail 50
      xrun logs mt-07 --since 10m
    """
    import re
    import time

    from orchestrator.readers import LogFollower, host_prefix, is_terminal, parse_duration
    from xrun_contract import Layout

    for h in hosts:
        if not re.fullmatch(r"\d+-\d+", h):
            raise XrunError(f"--host: {h!r} is not <slice>-<host>, e.g. 0-1")
    if tail is not None and tail < 0:
        raise XrunError("--tail: must be >= 0")
    try:
        since_ts = time.time() - parse_duration(since) if since else None
    except ValueError as e:
        raise XrunError(str(e)) from None
    st = _storage(storage)
    run = _run_record(st, name)
    if run.get("backend") == "kube":  # live pods, storage for attempts whose pods are gone
        from orchestrator.cli_kube import kube_logs

        return kube_logs(st, name, _backend_of(st, name), follow=follow, hosts=set(hosts) or None,
                         since_seconds=parse_duration(since) if since else None, tail=tail, prefix=prefix)
    follower = LogFollower(st, name, set(hosts) or None, since_ts)

    def show(batch):
        for host, attempt, line in batch:
            click.echo(f"{host_prefix(host, attempt)} {line}" if prefix else line)

    first = list(follower.poll())
    if tail is not None:
        kept: dict[str, list] = {}
        for item in first:
            kept.setdefault(item[0], []).append(item)
        allowed = {id(x) for v in kept.values() for x in (v[-tail:] if tail else [])}
        first = [x for x in first if id(x) in allowed]
    show(first)
    if not follow:
        return EXIT_OK
    backend = _backend_of(st, name)
    try:
        while True:
            status = _live_status(backend, name)
            state = status.state if status else (st.read_json(Layout.state(name)) or {}).get("state", "")
            show(follower.poll())
            if is_terminal(state):
                show(follower.poll())
                return EXIT_OK
            time.sleep(0.5)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


@cli.command()
@click.argument("name")
@storage_option
@OUTPUT
@click.option("--sizes", is_flag=True, help="Also sum each step's bytes (lists every object: slow on big runs).")
def checkpoints(name: str, storage: str | None, fmt: str, sizes: bool) -> int:
    """List a run's checkpoint steps: committed or in progress, write time, age, size.

    \b
    Examples:
      xrun checkpoints mt-07
      xrun checkpoints mt-07 -o json --sizes
    """
    from rich.console import Console

    from orchestrator.readers import list_checkpoints
    from orchestrator.screen import _duration

    st = _storage(storage)
    _run_record(st, name)
    items = [c.as_dict() for c in list_checkpoints(st, name, sizes=sizes)]
    if fmt != "table":
        click.echo(dump(items, fmt), nl=False)
        return EXIT_OK
    table = plain_table("STEP", "STATE", "WRITE", "AGE", "SIZE", "PATH")
    for c in items:
        size = f"{c['size_bytes'] / 2**20:.1f} MiB" if c["size_bytes"] is not None else "-"
        write = f"{c['write_seconds']:.2f}s" if c["write_seconds"] is not None else "-"
        table.add_row(str(c["step"]), c["state"], write, _duration(c["age_seconds"]), size, st.url(c["path"]))
    Console(soft_wrap=True).print(table)
    return EXIT_OK


@cli.command("list")
@storage_option
@OUTPUT
@click.option("--context", default=None, help="Also list xrun JobSets in this cluster context.")
@click.option("-n", "--namespace", default="default", show_default=True)
def list_cmd(storage: str | None, fmt: str, context: str | None, namespace: str) -> int:
    """List runs under the storage root, newest first, with their state.

    \b
    Examples:
      xrun list
      xrun list --storage gs://bucket/xrun -o json
      xrun list --context gke_p_z_c -n team
    """
    import datetime

    from rich.console import Console

    from orchestrator.backends import BackendError
    from orchestrator.readers import list_runs

    st = _storage(storage)
    runs = list_runs(st)
    if context:
        try:
            cluster = backend_for("kube", st.root, context, namespace).list()
        except BackendError as e:
            raise XrunError(str(e), e.exit_code) from None
        by_name = {r["name"]: r for r in runs}
        for item in cluster:
            if item["name"] in by_name:
                by_name[item["name"]]["state"] = item.get("state", by_name[item["name"]]["state"])
                by_name[item["name"]]["in_cluster"] = True
            else:
                runs.append({"name": item["name"], "state": item.get("state", ""), "backend": "kube",
                             "accelerator": "", "submitted_at": item.get("created"), "restarts": 0,
                             "in_cluster": True})
    if fmt != "table":
        click.echo(dump(runs, fmt), nl=False)
        return EXIT_OK
    table = plain_table("NAME", "STATE", "BACKEND", "ACCELERATOR", "RESTARTS", "SUBMITTED")
    for r in runs:
        ts = r.get("submitted_at")
        when = datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if isinstance(ts, int | float) else str(ts or "-")
        table.add_row(r["name"], r["state"], r.get("backend", ""), r.get("accelerator", ""), str(r.get("restarts", 0)), when)
    Console(soft_wrap=True).print(table)
    return EXIT_OK


@cli.command()
@click.argument("name")
@storage_option
@click.option("--purge", is_flag=True, help="Also remove the run's stored data (logs, metrics, checkpoints).")
@click.option("-y", "--yes", is_flag=True, help="Do not ask before purging.")
@click.option("--no-wait", is_flag=True, help="Return without waiting for the hosts to be gone.")
def delete(name: str, storage: str | None, purge: bool, yes: bool, no_wait: bool) -> int:
    """Stop a live run; with --purge also delete its data.

    \b
    Examples:
      xrun delete mt-07
      xrun delete mt-07 --purge --yes
    """
    from orchestrator.backends import BackendError
    from xrun_contract import Layout

    st = _storage(storage)
    _run_record(st, name)
    if purge and not yes:
        if not sys.stdin.isatty():
            raise XrunError("--purge: refusing to delete data without confirmation; add --yes")
        click.confirm(f"Delete every stored object of run {name} under {st.url(Layout.run(name))}?", abort=True)
    backend = _backend_of(st, name)
    try:
        stopped = backend.delete(name, wait=not no_wait)
    except BackendError as e:
        raise XrunError(str(e), e.exit_code) from None
    recorded = st.read_json(Layout.state(name)) or {}
    if stopped and backend.name == "kube" and recorded.get("state") not in ("Succeeded", "Failed"):
        record_cluster_state(st, name, "Deleted", recorded.get("restarts", 0), "deleted by xrun delete")
    click.echo(f"xrun: {'stopped' if stopped else 'no live hosts for'} {name}", err=True)
    if purge:
        count = st.delete_prefix(Layout.run(name))
        click.echo(f"xrun: purged {count} objects under {st.url(Layout.run(name))}", err=True)
    return EXIT_OK


# Commands that live in their own modules register themselves on the group.
for _module in ("orchestrator.cli_compare", "orchestrator.cli_kube"):
    try:
        __import__(_module, fromlist=["register"]).register(cli)
    except ModuleNotFoundError as _e:
        if _e.name != _module:
            raise


def main(argv: list[str] | None = None) -> int:
    """Entry point: every error is one line on stderr with a meaningful exit code."""
    try:
        rv = cli.main(args=argv, prog_name="xrun", standalone_mode=False)
        return rv if isinstance(rv, int) else EXIT_OK
    except SpecError as e:
        click.echo(f"xrun: error: {e}", err=True)
        return EXIT_USAGE
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else str(e), err=True)
        return EXIT_USAGE
    except click.UsageError as e:
        msg = e.format_message().replace("\n", " ")
        hint = f" (see '{e.ctx.command_path} --help')" if e.ctx else ""
        click.echo(f"xrun: error: {msg}{hint}", err=True)
        return EXIT_USAGE
    except click.ClickException as e:
        click.echo(f"xrun: error: {e.format_message()}", err=True)
        return e.exit_code
    except click.exceptions.Exit as e:
        return e.exit_code
    except (click.Abort, KeyboardInterrupt):
        click.echo("xrun: interrupted", err=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
