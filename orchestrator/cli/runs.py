"""Run lifecycle commands: render, submit, status, logs, checkpoints, list, delete.

Each command parses its flags, calls a service (``orchestrator.services``) and prints.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.text import Text

from orchestrator.cli.common import (
    OUTPUT,
    PROGRESS_INTERVAL,
    VERBOSE,
    dump,
    info,
    open_storage,
    plain_table,
    print_table,
    storage_option,
    storage_timeout_option,
    wait_timeout,
    warn,
    warn_corrupt,
)
from orchestrator.cli.logs import logs
from orchestrator.cli.screen import _duration, fold, render_table, summary_lines
from orchestrator.collector import collector_paused
from orchestrator.readers.logs import parse_duration
from orchestrator.services import follow as following
from orchestrator.services import runs
from orchestrator.services.code import GRACE_S, PackOptions
from orchestrator.workdir import DEFAULT_MAX_MB
from orchestrator.workdir import resolve as resolve_workdir
from xrun_contract import RUN_STATES, SUCCEEDED, UNKNOWN
from xrun_contract.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, XrunError

if TYPE_CHECKING:  # imported by the commands that read a run spec, not by every command
    from manifests.spec import RunSpec


# ---------------------------------------------------------------------------------------
# Run spec options, shared by render and submit.

SPEC_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("-f", "--file", "run_file"),
     {"type": click.Path(dir_okay=False), "help": "YAML run file; flags override its keys."}),
    (("--name",), {"help": "Run (JobSet) name: a DNS-1035 label."}),
    (("--image",), {"help": "The user's container image: xrun's own, MaxText's, any image with /bin/sh."}),
    (("--xrun-image",),
     {"help": "xrun's built image for the pod's init container and log shipper, in a registry "
              "(e.g. us-docker.pkg.dev/P/R/xrun-workload:TAG). Default: none; a cluster run's pods run "
              "xrun_python_image (python:3.12-slim) with xrun's code from the storage root."}),
    (("--command",), {"help": "Command run in every host (through /bin/sh -c). Default: python3 -m workload.train"}),
    (("--accelerator", "--tpu", "accelerator"),
     {"help": "Shape: v6e-1..v6e-256, v5litepod-N, v5p-N, v4-N, h100-80gb-8, h100-mega-80gb-8, "
              "h200-141gb-8, b200-8, cpu-N."}),
    (("--num-slices",), {"type": int, "help": "TPU slices (multislice). Default 1."}),
    (("--nodes",), {"type": int, "help": "GPU nodes. Default 1."}),
    (("--cpu-devices-per-host",), {"type": int, "help": "CPU devices per host for cpu-N shapes. Default 2."}),
    (("--storage",), {"help": "Storage root: a folder or gs://bucket/prefix (env XRUN_STORAGE)."}),
    (("--env", "env_pairs"),
     {"multiple": True, "metavar": "KEY=VAL", "help": "Env var for every host (repeatable)."}),
    (("--env-file",), {"type": click.Path(dir_okay=False), "help": "File of KEY=VAL lines."}),
    (("--max-restarts",), {"type": int, "help": "JobSet failurePolicy.maxRestarts. Default 3."}),
    (("--restartable-exit-codes",),
     {"metavar": "CODES", "help": "Comma list of exit codes that restart the run (default 42,127-255)."}),
    (("--termination-grace-seconds",), {"type": int, "help": "Pod grace period. Default 120."}),
    (("--ttl-seconds-after-finished",), {"type": int, "help": "JobSet TTL. Default 86400."}),
    (("--service-account",),
     {"help": "Pod service account. TPU pods (and GPU pods without a networking stack) use hostNetwork, "
              "where Workload Identity does not apply: GCS sees the node pool's account ('xrun doctor' checks)."}),
    (("--priority-class",), {"help": "Pod priorityClassName (raw; prefer --priority)."}),
    (("--priority",),
     {"help": "very-low|low|medium|high|very-high (xpk's PriorityClasses, 100..1000) or a PriorityClass name."}),
    (("--capacity",), {"help": "on-demand (default) | spot | reservation:NAME | flex-start (needs --queue)."}),
    (("--node-selector", "node_selector"),
     {"multiple": True, "metavar": "KEY=VAL", "help": "Extra pod nodeSelector (repeatable)."}),
    (("--tolerations", "tolerations"),
     {"multiple": True, "metavar": "KEY[=VAL][:EFFECT]",
      "help": "Extra toleration, kubectl taint syntax (repeatable)."}),
    (("--pod-annotations", "pod_annotations"),
     {"multiple": True, "metavar": "KEY=VAL", "help": "Extra pod annotation (repeatable)."}),
    (("--pod-labels", "pod_labels"),
     {"multiple": True, "metavar": "KEY=VAL", "help": "Extra pod label (repeatable)."}),
    (("--mounts", "mounts"),
     {"multiple": True, "metavar": "SOURCE:PATH[:ro]",
      "help": "gs://BUCKET:/path or pvc:CLAIM:/path, :ro for read-only (repeatable)."}),
    (("--scheduler",),
     {"help": "Pod schedulerName, or gke.io/topology-aware-auto (a scheduling gate, like xpk)."}),
    (("--kueue-topology",),
     {"metavar": "MODE:LABEL", "help": "Kueue topology-aware scheduling: required:LABEL or preferred:LABEL."}),
    (("--queue",),
     {"help": "Kueue LocalQueue name. Default: the namespace's only LocalQueue ($XRUN_QUEUE first); "
              "'none': no Kueue."}),
    (("--image-pull-secret", "image_pull_secrets"),
     {"multiple": True, "metavar": "SECRET",
      "help": "Secret to pull the pod's images with (a private registry; repeatable)."}),
    (("--kueue-priority",), {"help": "Kueue WorkloadPriorityClass name."}),
    (("--privileged",), {"is_flag": True, "default": None, "help": "Run the container privileged."}),
    (("--branch",), {"help": "Branch the image was built from (for reports)."}),
    (("--commit",), {"help": "Commit the image was built from (for reports)."}),
    (("--workdir",),
     {"metavar": "DIR",
      "help": "Ship this folder (git's files in a checkout, minus .xrunignore) through storage; the command "
              "runs in it, first on PYTHONPATH. Commit and branch are read from git."}),
    (("--backend",),
     {"type": click.Choice(["local", "kube"]), "help": "Default: kube when a --context is named, else local."}),
    (("--context",), {"help": "kubeconfig context (selects the GKE backend)."}),
    (("-n", "--namespace"), {"help": "Kubernetes namespace. Default: the kubeconfig context's."}),
]



PACK_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--max-workdir-mb",),
     {"type": click.FloatRange(min=0, min_open=True), "default": DEFAULT_MAX_MB, "show_default": True,
      "help": "Refuse a --workdir whose files add up to more (exit 2, the five largest named)."}),
    (("--allow-file", "allow_files"),
     {"multiple": True, "metavar": "PATH",
      "help": "Ship this credential-looking file of the workdir (*.pem, *.key, .env, credentials*.json, "
              "id_rsa*) anyway (repeatable)."}),
]


def spec_options(fn: Any) -> Any:
    for decls, kwargs in reversed(SPEC_OPTIONS + PACK_OPTIONS):
        fn = click.option(*decls, **kwargs)(fn)
    return fn


def pack_options(opts: dict[str, Any]) -> PackOptions:
    """The packing flags (popped from ``opts``: they are no RunSpec fields)."""
    return PackOptions(max_mb=float(opts.pop("max_workdir_mb", DEFAULT_MAX_MB) or DEFAULT_MAX_MB),
                       allow_files=tuple(opts.pop("allow_files", ()) or ()))


def spec_from_options(opts: dict[str, Any], base: dict[str, Any] | None = None) -> RunSpec:
    """The validated RunSpec of a command's options (file first, flags over it; without a
    file, flags over ``base``)."""
    from orchestrator.runfile import parse_mount, parse_pairs, parse_toleration, spec_from_inputs

    opts = dict(opts)
    for name in ("node_selector", "pod_annotations", "pod_labels"):
        opts[name] = parse_pairs(list(opts.get(name) or ()), name) or None
    opts["tolerations"] = [parse_toleration(x) for x in opts.get("tolerations") or ()] or None
    opts["mounts"] = [parse_mount(x) for x in opts.get("mounts") or ()] or None
    opts["image_pull_secrets"] = list(opts.get("image_pull_secrets") or ()) or None
    opts.pop("max_workdir_mb", None)
    opts.pop("allow_files", None)
    run_file = opts.pop("run_file", None)
    spec = spec_from_inputs(
        run_file, opts, env_file=opts.pop("env_file", None),
        env_pairs=tuple(opts.pop("env_pairs", ()) or ()),
        restartable_exit_codes=opts.pop("restartable_exit_codes", None), base=base,
    )
    if spec.workdir:  # a flag's path is from here, a run file's from the file's folder
        base = None if opts.get("workdir") or not run_file else os.path.dirname(os.path.abspath(run_file))
        spec = dataclasses.replace(spec, workdir=resolve_workdir(spec.workdir, base))
    return spec


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
    pack = pack_options(dict(opts))
    text = dump(runs.render(spec_from_options(opts), pack), fmt)
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
@click.option("--force", is_flag=True,
              help="Submit a cluster run no node pool can hold (auto-provisioning); "
                   "with --replace also replace a live run (it is stopped first).")
@click.option("--resume", "resume_name", metavar="NAME",
              help="Continue the ended run NAME from its last committed checkpoint, keeping its history. "
                   "Its stored spec is reused, with any flags over it; -f replaces it.")
@VERBOSE
@PROGRESS_INTERVAL
@storage_timeout_option
def submit(detach: bool, follow_logs: bool, dry_run: bool, replace: bool, force: bool, verbose: bool,
           progress_interval: float, resume_name: str | None, **opts: Any) -> int:
    """Submit a run and follow it until it ends.

    Without --context the run executes on this machine: the rendered JobSet's pods become
    local host processes with the env a pod would get. With --follow the hosts' lines
    stream above a progress line (phase, step/total, loss, tokens/s, ETA, checkpoint);
    without a terminal a plain progress line every --progress-interval seconds. Exit code:
    0 Succeeded, 1 Failed, 2 bad input, 3 cluster or storage unreachable, 130 interrupted
    (the run goes on). Scripts: `xrun submit --detach` then `xrun wait NAME` (0
    succeeded, 124 timed out, 125 failed, as xpk).

    \b
    Examples:
      xrun submit -f examples/local-tiny.yaml --follow
      xrun submit -f run.yaml --context gke_p_z_c -n team --detach
      xrun submit --name smoke --accelerator cpu-2 --image local \\
                  --command "python3 -m workload.train --preset tiny steps=20"
    """
    pack = pack_options(dict(opts))
    if resume_name is not None:
        return _resume(resume_name, opts, pack, detach=detach, follow_logs=follow_logs,
                       dry_run=dry_run, replace=replace or force, verbose=verbose,
                       interval=progress_interval)
    spec = spec_from_options(opts)
    if dry_run:  # the checks a submit makes, then the manifest it would send
        _, manifest, notes, warnings = runs.dry_run(spec, force=force, pack=pack)
        for line in notes:
            info(line)
        for line in warnings:
            warn(line)
        click.echo(runs.dump_yaml(manifest), nl=False)
        return EXIT_OK
    sub = runs.submit(spec, replace=replace, force=force, pack=pack)
    spec = sub.spec
    for line in sub.notes:
        info(line)
    for line in sub.warnings:
        warn(line)
    if sub.packed is not None:
        p = sub.packed
        git = (f", git {p.git.commit[:7]}{' on ' + p.git.branch if p.git.branch else ''}"
               f"{' + uncommitted changes' if p.git.dirty else ''}" if p.git and p.git.commit else "")
        info(f"workdir {p.workdir}: {len(p.files)} files, {_megabytes(p.total_bytes)} -> "
             f"code/{p.sha256[:12]}… ({'uploaded' if sub.uploaded else 'already in storage'}{git})")
        if p.skipped:
            shown = "; ".join(p.skipped[:5]) + (f"; and {len(p.skipped) - 5} more" if len(p.skipped) > 5 else "")
            warn(f"workdir: left out {len(p.skipped)} entr{'y' if len(p.skipped) == 1 else 'ies'}: {shown}")
    slices = f" x{spec.slices} slices" if spec.slices > 1 else ""
    info(f"submitted {spec.name} ({spec.backend_name} backend, {spec.accelerator}{slices}); storage {sub.url}")
    if detach:
        info(f"follow with: xrun logs {spec.name} -f   |   xrun status {spec.name}")
        return EXIT_OK
    return follow_run(sub, follow_logs, verbose=verbose, interval=progress_interval)


# Flags that choose where the stored run is, not what it runs: with only these, --resume
# reuses the stored spec.
RESUME_WHERE = {"storage", "max_workdir_mb", "allow_files"}


def _resume(name: str, opts: dict[str, Any], pack: Any, *, detach: bool, follow_logs: bool,
            dry_run: bool, replace: bool, verbose: bool, interval: float) -> int:
    """``submit --resume NAME``: the stored spec, or the flags' and run file's when any is given."""
    if replace:
        raise XrunError("--resume: not with --replace/--force (--replace starts over, --resume goes on)")
    if dry_run:
        raise XrunError("--resume: not with --dry-run")
    from orchestrator import settings

    given = {k for k, v in opts.items() if v not in (None, (), []) and k not in RESUME_WHERE}
    root = settings.storage_root(opts.get("storage"))
    spec = None
    if given:
        opts = dict(opts)
        if not opts.get("name"):  # the run resumed is NAME, whatever a run file calls it
            opts["name"] = name
        base = None
        if not opts.get("run_file"):  # flags change the stored spec, they do not replace it
            stored = (runs.run_info(settings.open_root(root), name).get("spec") or {})
            base = {k: v for k, v in stored.items()
                    if v is not None and k not in ("workdir", "storage", "name")}
        spec = spec_from_options(opts, base)
    sub = runs.resume(root, name, spec, pack)
    how = ("its stored spec" if spec is None else "the given run file" if opts.get("run_file")
           else "its stored spec with the given flags")
    info(f"resumed {name} ({sub.spec.backend_name} backend, {how}) from its last committed checkpoint; "
         f"storage {sub.url}")
    if detach:
        info(f"follow with: xrun logs {name} -f   |   xrun status {name}")
        return EXIT_OK
    return follow_run(sub, follow_logs, verbose=verbose, interval=interval)


def follow_run(sub: runs.Submitted, show_logs: bool, *, verbose: bool = False,
               interval: float = 10.0) -> int:
    """Follow a run to its end. With logs: the hosts' lines above a pinned progress line
    (TTY) or plain progress lines every ``interval`` seconds; without logs on a TTY the
    live status table."""
    from rich.live import Live

    from orchestrator.cli.progress import ProgressScreen

    name, started = sub.spec.name, time.time()
    out = Console()
    table_screen = out.is_terminal and not show_logs
    live_ctx = Live(console=out, refresh_per_second=4, transient=False) if table_screen else None
    # Quiet on a terminal only: piped, every line goes through as stored (kubectl logs' way).
    screen = None if table_screen else ProgressScreen(out, interval=interval,
                                                      verbose=verbose or not out.is_terminal)
    last_state = None
    said_end = False  # the summary's first line, printed when the backend said the end
    seen_events: set[str] = set()
    view: dict[str, Any] = {}
    try:
        if live_ctx:
            live_ctx.start()
        if screen:
            screen.__enter__()
        for event in following.follow(sub.storage, name, sub.backend, logs=show_logs, warn=warn,
                                      live_goodput=table_screen):
            if isinstance(event, following.Line):
                if screen:
                    screen.line(event.host, event.attempt, event.text)
                continue
            view = event.view
            if isinstance(event, following.Done):
                break  # the summary says how it ended (once)
            if isinstance(event, following.Ended):
                if screen:  # the end as the summary says it, before the hosts' last lines
                    screen.note(summary_lines(view)[0], prefix="")
                    said_end = True
                continue
            if live_ctx:
                live_ctx.update(render_table(view))
                continue
            assert screen is not None
            reasons = [f"host {h.get('host')} {h.get('state')}: {h['reason']}"
                       for h in view["hosts"] if h.get("reason") and h.get("state") != SUCCEEDED]
            for ev in [*reasons, *(view.get("events") or [])]:  # why pods wait, once each
                if ev not in seen_events:
                    seen_events.add(ev)
                    screen.note(f"{name} event: {ev}")
            if view["state"] != last_state:
                msg = f" ({view['message']})" if view["message"] else ""
                screen.note(f"{name} {view['state']}{msg}")
                last_state = view["state"]
            screen.update(view)
    except KeyboardInterrupt:
        if live_ctx:
            live_ctx.stop()
            live_ctx = None
        if screen:
            screen.stop()
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
        if screen:
            screen.stop()
    width = shutil.get_terminal_size().columns if sys.stderr.isatty() else None
    for line in summary_lines(view, started)[1 if said_end else 0:]:
        click.echo(fold(line, width), err=True)
    quiet = screen.quiet_summary() if screen is not None else ""
    if quiet:
        click.echo(fold(f"  {quiet.replace('NAME', name)}", width), err=True)
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
    # One-shot, and all it builds it keeps until it prints: the collector would only walk
    # it (0.15 s of a 1,024-pod run's status on the 2-core machine).
    with collector_paused():
        st = open_storage(storage)
        view = runs.status(st, name, context, namespace, warn=warn)  # warns of corrupt records too
        if fmt == "table":
            console = Console(soft_wrap=True)
            console.print(render_table(view, console.width if console.is_terminal else None))
        else:
            click.echo(dump(view, fmt), nl=False)
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
    warn_corrupt(st, name)
    if fmt != "table":
        click.echo(dump(items, fmt), nl=False)
        return EXIT_OK
    table = plain_table("STEP", "STATE", "WRITE", "AGE", "SIZE", "PATH")
    for c in items:
        size = f"{c['size_bytes'] / 2**20:.1f} MiB" if c["size_bytes"] is not None else "-"
        write = f"{c['write_seconds']:.2f}s" if c["write_seconds"] is not None else "-"
        table.add_row(str(c["step"]), c["state"], write, _duration(c["age_seconds"]), size, st.url(c["path"]))
    print_table(table)  # piped: paths whole
    return EXIT_OK


def _filter_options(fn: Any) -> Any:
    for decl in reversed([
        click.option("-l", "--selector", default="", help="Label selector, kubectl syntax: team=ml,queue!=x,key,!key."),
        click.option("--state", "states", multiple=True, type=click.Choice(list(RUN_STATES)),
                     help="Only runs in this state (repeatable)."),
        click.option("--older-than", metavar="AGE", help="Only runs submitted more than AGE ago (30s/10m/2h/1d)."),
        click.option("--newer-than", metavar="AGE", help="Only runs submitted less than AGE ago."),
    ]):
        fn = decl(fn)
    return fn


def _run_filter(selector: str, states: tuple[str, ...], older_than: str | None,
                newer_than: str | None) -> runs.RunFilter:
    def age(flag: str, text: str | None) -> float | None:
        if text is None:
            return None
        try:
            return parse_duration(text)
        except ValueError:
            raise XrunError(f"{flag}: {text!r} is not a duration like 30s, 10m, 2h or 1d") from None
    return runs.RunFilter(runs.parse_selector(selector), tuple(states), age("--older-than", older_than),
                          age("--newer-than", newer_than))


@click.command("list")
@storage_option
@click.option("-o", "--output", "fmt", type=click.Choice(["table", "wide", "json", "yaml"]),
              default="table", show_default=True, help="wide: also backend, accelerator, restarts, submit time.")
@click.option("--context", default=None, help="Also list xrun JobSets in this cluster context.")
@click.option("-n", "--namespace", default=None, help="Default: the kubeconfig context's namespace.")
@_filter_options
def list_cmd(storage: str | None, fmt: str, context: str | None, namespace: str | None, selector: str,
             states: tuple[str, ...], older_than: str | None, newer_than: str | None) -> int:
    """List runs under the storage root, newest first: state, step/total, loss, age.

    \b
    Examples:
      xrun list
      xrun list -o wide
      xrun list --storage gs://bucket/xrun -o json
      xrun list --context gke_p_z_c -n team
      xrun list -l team=ml --state Failed --older-than 7d
    """
    from orchestrator.cli.common import rfc3339
    from orchestrator.cli.screen import STATE_STYLE, age
    from orchestrator.readers.loaders import corrupt_line
    from xrun_contract import significant

    where = _run_filter(selector, states, older_than, newer_than)
    st = open_storage(storage)
    cluster = runs.backend_for("kube", st.root, context, namespace) if context else None
    items = runs.list_runs(st, cluster, where, warn=warn)
    for r in items:
        if r.get("state") == UNKNOWN and r.get("message"):
            warn(corrupt_line(r["name"], r["message"]))
    if fmt in ("json", "yaml"):
        click.echo(dump(items, fmt), nl=False)
        return EXIT_OK
    if not items:  # kubectl's "No resources found in NAMESPACE namespace.", on stderr
        hint = runs.root_hint(st) if where.empty and cluster is None else ""
        info(f"No runs found under {st.root}" + (" matching the filters" if not where.empty else "")
             + (f" ({hint})" if hint else ""))
        return EXIT_OK
    wide = fmt == "wide"
    cols = ["NAME", "STATE", "STEP", "LOSS", "AGE"]
    if wide:
        cols += ["RESTARTS", "BACKEND", "ACCELERATOR", "SUBMITTED"]
    table = plain_table(*cols)
    for r in items:
        ts = r.get("submitted_at")
        step = "-" if r.get("step") is None else str(r["step"])
        if r.get("total_steps"):
            step += f"/{r['total_steps']}"
        loss = "-" if r.get("loss") is None else significant(float(r["loss"]), 5)
        row = [r["name"], Text(r["state"], style=STATE_STYLE.get(r["state"], "")), step, loss,
               age(ts) if isinstance(ts, int | float) else "-"]
        if wide:
            row += [str(r.get("restarts", 0)), r.get("backend", ""), r.get("accelerator", ""),
                    rfc3339(ts) if isinstance(ts, int | float) else str(ts or "-")]
        table.add_row(*row)
    print_table(table)
    return EXIT_OK


@click.command()
@click.argument("name")
@storage_option
@click.option("--timeout", "timeout_text", default=None, metavar="DURATION",
              help="Give up after this long (exit 124): seconds (3600) or 90s, 30m, 1h30m. "
              "Default: wait until the run ends.")
@click.option("--context", default=None, help="Override the kubeconfig context recorded at submit.")
@click.option("-n", "--namespace", default=None,
              help="Override the namespace recorded at submit (cluster runs).")
def wait(name: str, storage: str | None, timeout_text: str | None, context: str | None,
         namespace: str | None) -> int:
    """Wait for a run to end, for scripts; exit codes as xpk's: 0 succeeded, 124 timed out,
    125 failed (or deleted); and 123 stalled: still Running but no progress past its stall
    limit (see 'xrun status'; the run is left running); 2 no such run; 3 cluster or storage
    unreachable.

    \b
    Examples:
      xrun submit -f run.yaml --detach && xrun wait mt-07 --timeout 3600
      xrun wait mt-07; echo $?
    """
    from orchestrator.readers.figures import stall_text
    from xrun_contract.errors import EXIT_WAIT_FAILED, EXIT_WAIT_STALLED, EXIT_WAIT_TIMEOUT

    timeout_s = wait_timeout(timeout_text)
    st = open_storage(storage)
    outcome = runs.wait(st, name, timeout_s, context, namespace, warn=warn)
    if outcome is None:
        info(f"{name}: still running after {timeout_s:g}s")
        return EXIT_WAIT_TIMEOUT
    if outcome.state == runs.STALLED and outcome.stall is not None:
        info(f"{name}: stalled: {stall_text(outcome.stall)}, past its limit of "
             f"{outcome.stall['limit_seconds']:.0f}s; it is still running ('xrun delete {name}' stops it)")
        return EXIT_WAIT_STALLED
    info(f"{name}: {outcome.state}")
    return EXIT_OK if outcome.state == SUCCEEDED else EXIT_WAIT_FAILED


@click.command()
@click.argument("name", required=False)
@storage_option
@click.option("--purge", is_flag=True, help="Also remove the run's stored data (logs, metrics, checkpoints).")
@click.option("-y", "--yes", is_flag=True, help="Do not ask before purging or deleting several runs.")
@click.option("--no-wait", is_flag=True, help="Return without waiting for the hosts to be gone.")
@_filter_options
def delete(name: str | None, storage: str | None, purge: bool, yes: bool, no_wait: bool, selector: str,
           states: tuple[str, ...], older_than: str | None, newer_than: str | None) -> int:
    """Stop a live run (NAME, or every run the filters match); with --purge also delete its data.

    \b
    Examples:
      xrun delete mt-07
      xrun delete mt-07 --purge --yes
      xrun delete -l team=ml --state Failed --older-than 7d --purge --yes
    """
    where = _run_filter(selector, states, older_than, newer_than)
    if name and not where.empty:
        raise XrunError("delete: give a run NAME or filters (--selector, --state, --older-than, --newer-than), "
                        "not both")
    if not name and where.empty:
        raise XrunError("delete: give a run NAME or at least one filter "
                        "(--selector, --state, --older-than, --newer-than)")
    st = open_storage(storage)
    if name:
        runs.run_info(st, name)
        if purge and not yes:
            if not sys.stdin.isatty():
                raise XrunError("--purge: refusing to delete data without confirmation; add --yes")
            click.confirm(f"Delete every stored object of run {name} under {st.url(f'runs/{name}')}?", abort=True)
        names = [name]
    else:
        names = [r["name"] for r in runs.list_runs(st, None, where, warn=warn)]
        if not names:
            info("no runs match")
            return EXIT_OK
        if not yes:
            if not sys.stdin.isatty():
                raise XrunError(f"delete: refusing to {'purge' if purge else 'stop'} {len(names)} run(s) "
                                f"({', '.join(names)}) without confirmation; add --yes")
            click.confirm(f"{'Stop and purge' if purge else 'Stop'} {', '.join(names)} under {st.url('runs')}?",
                          abort=True)
    for n in names:
        done = runs.delete(st, n, purge=purge, wait=not no_wait)
        info(f"{'stopped' if done.stopped else 'no live hosts for'} {n}" + (f": {done.found}" if done.found else ""))
        if done.purged is not None:
            info(f"purged {done.purged} objects under {done.url}")
        if done.code_removed:
            info(f"removed its workdir archive code/{done.code_removed}.tar.gz (no other run names it)")
    return EXIT_OK


class Seconds(click.ParamType):
    """A finite number of seconds, 0 or more: FloatRange lets nan through (every comparison
    with nan is false), and a nan grace made every unnamed archive removable."""

    name = "seconds"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        try:
            out = float(value)
        except (TypeError, ValueError):
            out = math.nan
        if not math.isfinite(out) or out < 0:
            self.fail(f"must be a finite number of seconds, 0 or more; got {str(value)[:40]!r}", param, ctx)
        return out


SECONDS = Seconds()


@click.command()
@storage_option
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@click.option("--grace", "grace_s", type=SECONDS, default=GRACE_S, show_default=True,
              help="Spare unnamed archives younger than this many seconds "
                   "(a submit uploads its archive before its run.json).")
def gc(storage: str | None, dry_run: bool, grace_s: float) -> int:
    """Remove shipped working trees (<storage>/code/*.tar.gz) that no run names.

    
    Examples:
      xrun gc --dry-run
      xrun gc --grace 0
    """
    st = open_storage(storage)
    if not st.root.startswith("gs://") and not os.path.isdir(st.root):
        # Nothing to collect in a root that does not exist: a mistyped --storage, said so.
        what = "is not a folder (a storage root is a folder)" if os.path.lexists(st.root) else \
            "does not exist (no runs or archives there)"
        raise XrunError(f"--storage: {st.root} {what}; check the path")
    out = runs.code.gc(st, dry_run=dry_run, grace_s=grace_s)
    verb = "would remove" if dry_run else "removed"
    for sha in out.removed:
        click.echo(f"{verb} code/{sha}.tar.gz")
    if out.corrupt:
        shown = ", ".join(out.corrupt[:5]) + (f" and {len(out.corrupt) - 5} more" if len(out.corrupt) > 5 else "")
        warn(f"kept {len(out.unnamed_kept)} unnamed archive(s): the run.json of {shown} is corrupt and may "
             "name any of them (see 'xrun status NAME'; 'xrun delete NAME --purge' removes such a run)")
    info(f"{verb} {len(out.removed)} archive(s), {_megabytes(out.bytes_removed)}; kept {out.kept} named by runs"
         + (f", {len(out.leased)} being reused by a submit now" if out.leased else "")
         + (f", {len(out.young)} unnamed but younger than {grace_s:g}s" if out.young else ""))
    return EXIT_OK


def _megabytes(n: int) -> str:
    """'0.0031 MB', '12.4 MB' (3 significant digits, never '0.00 MB' for a small tree); '0 MB'
    only when nothing."""
    from xrun_contract import significant

    return f"{significant(n / 1e6, 3)} MB"


def _alias(command: click.Command, name: str, of: str) -> click.Command:
    """kubectl's verbs for the same command (``get`` = list, ``describe`` = status)."""
    return click.Command(name, callback=command.callback, params=list(command.params),
                         help=f"Same as 'xrun {of}' (kubectl's verb).\n\n{command.help or ''}",
                         short_help=f"Same as 'xrun {of}'.")


get = _alias(list_cmd, "get", "list")
describe = _alias(status, "describe", "status")

COMMANDS = (wait, render, submit, status, logs, checkpoints, list_cmd, delete, gc, get, describe)
