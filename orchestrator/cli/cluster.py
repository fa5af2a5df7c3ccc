"""Cluster commands: ``xrun doctor``."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap

import click

from orchestrator.services import doctor as checks

DETAIL_COLUMN = 15  # "FAIL  storage  " : where a check's detail starts


@click.command()
@click.option("--context", default=None, help="kubeconfig context. Default: the run file's, else the current one.")
@click.option("-n", "--namespace", default=None, help="Namespace. Default: the run file's, else 'default'.")
@click.option("-f", "--file", "run_file", type=click.Path(dir_okay=False),
              help="Run file: accelerator, num_slices, nodes, queue, namespace, context and storage come from it.")
@click.option("--accelerator", "--tpu", "accelerator", help="Shape to look for nodes of (e.g. v6e-32).")
@click.option("--num-slices", type=int, help="TPU slices (nodes needed = hosts per slice x slices).")
@click.option("--nodes", type=int, help="GPU nodes.")
@click.option("--queue", help="Kueue LocalQueue that must exist.")
@click.option("--capacity", help="on-demand|spot|reservation:NAME|flex-start: count only nodes of that capacity.")
@click.option("--priority", help="PriorityClass the run uses (very-low..very-high or a class name) that must exist.")
@click.option("--storage", help="Storage root to write a probe to. Default: $XRUN_STORAGE.")
@click.option("--image", help="The run's image: doctor runs a probe pod with it on the target node pool.")
@click.option("--service-account", help="The run's pod service account (for the probe pod).")
@click.option("--probe-timeout", type=click.IntRange(1, 3600), help="Seconds to wait for the probe pod. Default 300.")
@click.option("-o", "--output", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def doctor(context: str | None, namespace: str | None, run_file: str | None, accelerator: str | None,
           num_slices: int | None, nodes: int | None, queue: str | None, capacity: str | None,
           priority: str | None, storage: str | None, image: str | None, service_account: str | None,
           probe_timeout: int | None, fmt: str) -> int:
    """Check that a cluster can run xrun's JobSets: API, JobSet CRD and controller version, Kueue
    queue, PriorityClasses, nodes, storage from here and (given the run's image) from a pod on
    the node pool.

    Exit code: 0 all checks passed (warnings allowed), 1 a check failed, 2 bad input,
    3 the API or the storage root cannot be reached.

    \b
    Examples:
      xrun doctor --context gke_proj_zone_cluster
      xrun doctor -f run.yaml
      xrun doctor --context gke_p_z_c -n team --tpu v6e-32 --num-slices 2 \\
          --queue lq --storage gs://b/xrun
    """
    v = checks.inputs(run_file, {"context": context, "namespace": namespace, "accelerator": accelerator,
                                 "num_slices": num_slices, "nodes": nodes, "queue": queue, "storage": storage,
                                 "capacity": capacity, "priority": priority,
                                 "image": image, "service_account": service_account,
                                 "probe_timeout": probe_timeout})
    # On a terminal a long detail (a 400-character capacity error) wraps under its own column;
    # piped, each check stays one line for grep.
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None

    def line(c: checks.Check) -> None:  # each check as it ends: a later one can take minutes
        text = f"{c.result:<5} {c.name:<8} {c.detail}"
        if width is not None and len(text) > width:
            text = "\n".join(textwrap.wrap(text, width, subsequent_indent=" " * DETAIL_COLUMN,
                                            break_on_hyphens=False))
        click.echo(text)

    results, code = checks.doctor(v, on_check=line if fmt != "json" else None)
    if fmt == "json":
        click.echo(json.dumps({"checks": [c.as_dict() for c in results], "exit_code": code}, indent=2))
    failed = [c for c in results if c.result == checks.FAIL]
    warned = [c for c in results if c.result == checks.WARN]
    if failed:
        click.echo(f"xrun: doctor: {len(failed)} check(s) failed: {', '.join(c.name for c in failed)}", err=True)
    else:
        # No FAIL: submit would pass its own checks (several LocalQueues, a shape no node pool
        # holds and a missing queue are FAILs).
        click.echo(f"xrun: doctor: all checks passed{f' ({len(warned)} warning(s))' if warned else ''}", err=True)
    return code


COMMANDS = (doctor,)
