"""Run lifecycle commands: render, submit, status, logs, checkpoints, list, delete.

Each command parses its flags, calls a service (``orchestrator.services``) and prints.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any

import click
from rich.console import Console

from manifests.spec import RunSpec
from orchestrator.cli.common import (
    OUTPUT,
    dump,
    info,
    open_storage,
    plain_table,
    storage_option,
    warn,
)
from orchestrator.cli.screen import _duration, render_table, summary_lines
from orchestrator.readers.logs import parse_duration
from orchestrator.runfile import spec_from_inputs
from orchestrator.services import follow as following
from orchestrator.services import logs as logs_service
from orchestrator.services import runs
from xrun_contract import SUCCEEDED, host_prefix
from xrun_contract.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, XrunError

# ---------------------------------------------------------------------------------------
# Run spec options, shared by render and submit.

SPEC_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("-f", "--file", "run_file"), {"type": click.Path(dir_okay=False), "help": "YAML run file; flags override its keys."}),
    (("--name",), {"help": "Run (JobSet) name: a DNS-1035 label."}),
    (("--image",), {"help": "The user's container image: xrun's own, MaxText's, any image with /bin/sh."}),
    (("--xrun-image",), {"help": "xrun's image for the pod's init container and log shipper (default xrun-workload:<version>)."}),
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
    (("--service-account",), {"help": "Pod service account. TPU/GPU pods use hostNetwork, where Workload Identity does not apply: GCS sees the node pool's account ('xrun doctor' checks)."}),
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



def spec_options(fn: Any) -> Any:
    for decls, kwargs in reversed(SPEC_OPTIONS):
        fn = click.option(*decls, **kwargs)(fn)
    return fn


def spec_from_options(opts: dict[str, Any]) -> RunSpec:
    """The validated RunSpec of a command's options (file first, flags over it)."""
    opts = dict(opts)
    return spec_from_inputs(
        opts.pop("run_file", None), opts, env_file=opts.pop("env_file", None),
        env_pairs=tuple(opts.pop("env_pairs", ()) or ()),
        restartable_exit_codes=opts.pop("restartable_exit_codes", None),
    )


@click.command()
@spec_options
@click.option("-o", "--output", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@click.option("--output-file", type=click.Path(dir_okay=False), help="Write here instead of stdout.")
def render(fmt: str, output_file: str | None, **opts: Any) -> int:
    """Print the JobSet manifest of a run spec (nothing is submitted).

    \b
    Examples:
      xrun render --name mt-07-eval --tpu v6e-32 --num-slices 2 --image IMG \\
                  --command "python3 -m workload.train --preset 1b"
      xrun render -f run.yaml -o json --output-file jobset.json
      xrun render -f run.yaml | kubectl apply -f -
    """
    text = dump(runs.render(spec_from_options(opts)), fmt)
    if output_file:
        try:
            with open(output_file, "w") as f:
                f.write(text)
        except OSError as e:
            raise XrunError(f"--output-file: cannot write {output_file}: {e.strerror}") from None
    else:
        click.echo(text, nl=False)
    return EXIT_OK


@click.command()
@spec_options
@click.option("-d", "--detach", is_flag=True, help="Return once submitted.")
@click.option("--follow", "follow_logs", is_flag=True, help="Stream every host's log while following.")
@click.option("--dry-run", is_flag=True, help="Print the manifest that would be submitted; submit and write nothing.")
@click.option("--replace", is_flag=True, help="Replace a finished run of the same name (its stored data is removed).")
@click.option("--force", is_flag=True, help="With --replace: also when the old run is still live (it is stopped first).")
def submit(detach: bool, follow_logs: bool, dry_run: bool, replace: bool, force: bool, **opts: Any) -> int:
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
    spec = spec_from_options(opts)
    if dry_run:
        click.echo(runs.dump_yaml(runs.render(spec)), nl=False)
        return EXIT_OK
    sub = runs.submit(spec, replace=replace, force=force)
    slices = f" x{spec.slices} slices" if spec.slices > 1 else ""
    info(f"submitted {spec.name} ({spec.backend_name} backend, {spec.accelerator}{slices}); storage {sub.url}")
    if detach:
        info(f"follow with: xrun logs {spec.name} -f   |   xrun status {spec.name}")
        return EXIT_OK
    return follow_run(sub, follow_logs)


def follow_run(sub: runs.Submitted, show_logs: bool) -> int:
    """Follow a run to its end: live status (TTY) or progress lines, logs when asked."""
    from rich.live import Live

    name, started = sub.spec.name, time.time()
    console = Console(stderr=True)
    live_screen = console.is_terminal and not show_logs
    live_ctx = Live(console=console, refresh_per_second=4, transient=False) if live_screen else None
    last_state, last_report = None, 0.0
    seen_events: set[str] = set()
    view: dict[str, Any] = {}
    try:
        if live_ctx:
            live_ctx.start()
        for event in following.follow(sub.storage, name, sub.backend, logs=show_logs, warn=warn):
            if isinstance(event, following.Line):
                click.echo(f"{host_prefix(event.host, event.attempt)} {event.text}")
                continue
            view = event.view
            if live_ctx:
                live_ctx.update(render_table(view))
                continue
            reasons = [f"host {h.get('host')} {h.get('state')}: {h['reason']}"
                       for h in view["hosts"] if h.get("reason")]
            for ev in [*reasons, *(view.get("events") or [])]:  # why pods wait, once each
                if ev not in seen_events:
                    seen_events.add(ev)
                    info(f"{name} event: {ev}")
            if view["state"] != last_state:
                msg = f" ({view['message']})" if view["message"] else ""
                info(f"{name} {view['state']}{msg}")
                last_state = view["state"]
            elif not show_logs and view["step"] is not None and time.time() - last_report > 10:
                info(f"{name} step {view['step']} loss {view['loss']:.4f}")
                last_report = time.time()
    except KeyboardInterrupt:
        if live_ctx:
            live_ctx.stop()
            live_ctx = None
        if sys.stdin.isatty():
            choice = click.prompt("\nStop the run, or detach and leave it running?",
                                  type=click.Choice(["stop", "detach"]), default="detach")
            if choice == "stop":
                runs.stop(sub.backend, name)
                info(f"stopped {name}")
                return EXIT_INTERRUPTED
        click.echo(f"\nxrun: detached; {name} keeps running (xrun status {name}, xrun delete {name})", err=True)
        return EXIT_INTERRUPTED
    finally:
        if live_ctx:
            live_ctx.stop()
    for line in summary_lines(view, started):
        click.echo(line, err=True)
    return EXIT_OK if view["state"] == SUCCEEDED else EXIT_FAILED


@click.command()
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
    view = runs.status(open_storage(storage), name, context, namespace, warn=warn)
    if fmt == "table":
        Console(soft_wrap=True).print(render_table(view))
    else:
        click.echo(dump(view, fmt), nl=False)
    return EXIT_OK


@click.command()
@click.argument("name")
@storage_option
@click.option("-f", "--follow", is_flag=True, help="Keep streaming new lines (and new restart attempts).")
@click.option("--host", "hosts", multiple=True, metavar="S-H", help="Only this host, e.g. 0-1 (repeatable).")
@click.option("--since", help="Only chunks written in the last 30s/10m/2h/1d.")
@click.option("--tail", type=int, help="Only the last N lines of each host (before following).")
@click.option("--prefix/--no-prefix", default=True, show_default=True, help="Prefix lines with [slice-host].")
def logs(name: str, storage: str | None, follow: bool, hosts: tuple[str, ...],
         since: str | None, tail: int | None, prefix: bool) -> int:
    """Print every host's log from storage, merged, each line prefixed by its host.

    \b
    Examples:
      xrun logs mt-07 -f
      xrun logs mt-07 --host 0-1 --tail 50
      xrun logs mt-07 --since 10m
    """
    for h in hosts:
        if not re.fullmatch(r"\d+-\d+", h):
            raise XrunError(f"--host: {h!r} is not <slice>-<host>, e.g. 0-1")
    if tail is not None and tail < 0:
        raise XrunError("--tail: must be >= 0")
    try:
        since_s = parse_duration(since) if since else None
    except ValueError as e:
        raise XrunError(str(e)) from None
    st = open_storage(storage)
    backend = runs.backend_of(st, name)
    try:
        for host, attempt, line in logs_service.log_lines(
                st, name, backend, follow=follow, hosts=set(hosts) or None,
                since_seconds=since_s, tail=tail, warn=warn):
            click.echo(f"{host_prefix(host, attempt)} {line}" if prefix else line)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_OK


@click.command()
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
    st = open_storage(storage)
    items = [c.as_dict() for c in runs.checkpoints(st, name, sizes=sizes)]
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


@click.command("list")
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

    st = open_storage(storage)
    cluster = runs.backend_for("kube", st.root, context, namespace) if context else None
    items = runs.list_runs(st, cluster)
    if fmt != "table":
        click.echo(dump(items, fmt), nl=False)
        return EXIT_OK
    table = plain_table("NAME", "STATE", "BACKEND", "ACCELERATOR", "RESTARTS", "SUBMITTED")
    for r in items:
        ts = r.get("submitted_at")
        when = (datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")
                if isinstance(ts, int | float) else str(ts or "-"))
        table.add_row(r["name"], r["state"], r.get("backend", ""), r.get("accelerator", ""),
                      str(r.get("restarts", 0)), when)
    Console(soft_wrap=True).print(table)
    return EXIT_OK


@click.command()
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
    st = open_storage(storage)
    runs.run_info(st, name)
    if purge and not yes:
        if not sys.stdin.isatty():
            raise XrunError("--purge: refusing to delete data without confirmation; add --yes")
        click.confirm(f"Delete every stored object of run {name} under {st.url(f'runs/{name}')}?", abort=True)
    done = runs.delete(st, name, purge=purge, wait=not no_wait)
    info(f"{'stopped' if done.stopped else 'no live hosts for'} {name}")
    if done.purged is not None:
        info(f"purged {done.purged} objects under {done.url}")
    return EXIT_OK


COMMANDS = (render, submit, status, logs, checkpoints, list_cmd, delete)
