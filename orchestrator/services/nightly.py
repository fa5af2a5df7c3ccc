"""`xrun nightly`: run every branch's image on the same slice and compare it with the base.

Every (config, branch) run of the plan (``orchestrator.nightly_file``) is submitted with
the very service ``xrun submit`` uses and followed to its end, one after another so the
runs never share the slice. Then each candidate is compared with the base of its config
and ``reports/<date>/summary.md``, ``summary.json`` and ``index.html`` are written under
the storage root. The exit code says whether anything regressed (or failed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from orchestrator import settings
from orchestrator.nightly_file import NightlyConfig, PlannedRun, _str, plan_runs
from orchestrator.services import runs
from xrun_contract import TERMINAL_STATES
from xrun_contract.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, XrunError


@dataclass
class RunOutcome:
    planned: PlannedRun
    state: str  # Succeeded | Failed | Deleted | Timeout | Stalled | NotSubmitted
    message: str = ""
    seconds: float = 0.0


def submit_run(run: PlannedRun) -> None:
    """The service a user's ``xrun submit`` calls: the same validation, run.json, manifest,
    admission and backend call."""
    try:
        runs.submit(run.spec)
    except XrunError as e:
        raise XrunError(f"submit {run.name}: {e}", e.exit_code) from None


def follow(run: PlannedRun, timeout_s: float, poll_s: float,
           on_view: Callable[[dict[str, Any]], None] | None = None) -> RunOutcome:
    """Poll the backend until the run ends; past the timeout, or once it stalled (no
    progress past its stall limit: ``figures.stall``), it is deleted and the next run goes
    on. ``on_view`` gets the run's status view (phase, step, loss, ...) at each poll."""
    from orchestrator.readers.figures import stall_text
    from orchestrator.readers.loaders import StoredRun
    from orchestrator.services.view import run_view
    from xrun_contract.storage import open_storage

    backend = runs.backend_for_spec(run.spec)
    floor = settings.stall_floor()
    reader = StoredRun(open_storage(run.spec.storage), run.name)
    started = time.monotonic()
    missing_since: float | None = None
    while True:
        try:
            status = backend.status(run.name)
        except XrunError as e:
            if e.exit_code == EXIT_UNREACHABLE:
                raise XrunError(f"follow {run.name}: {e}", EXIT_UNREACHABLE) from None
            status = None
        view: dict[str, Any] = {}
        if status is not None:
            with contextlib.suppress(XrunError, OSError):
                view = run_view(reader.storage, reader.poll(), status, stall_floor=floor)
                if on_view is not None:
                    on_view(view)
        elapsed = time.monotonic() - started
        if status is not None:
            missing_since = None
            if status.state in TERMINAL_STATES:
                return RunOutcome(run, status.state, status.message, elapsed)
        elif missing_since is None:
            missing_since = elapsed
        elif elapsed - missing_since > 300:
            return RunOutcome(run, "Failed", "the backend lost the run", elapsed)
        if view.get("stall"):
            with contextlib.suppress(XrunError):
                backend.delete(run.name, wait=True)
            return RunOutcome(run, runs.STALLED, f"{stall_text(view['stall'])}: deleted", elapsed)
        if elapsed > timeout_s:
            with contextlib.suppress(XrunError):
                backend.delete(run.name, wait=True)
            return RunOutcome(run, "Timeout", f"still running after {timeout_s:.0f}s: deleted", elapsed)
        time.sleep(poll_s)


def resolve_branches(cfg: NightlyConfig) -> dict[str, str]:
    """Each branch's head commit in ``cfg.repo`` now; an unknown branch is exit 2."""
    from orchestrator.workdir import is_git_checkout

    if not os.path.exists(cfg.repo):
        made = ("; examples/nightly-local.yaml's is made by 'bash examples/make-nightly-repo.sh nightly-repo'"
                if os.path.basename(cfg.repo) == "nightly-repo" else "")
        raise XrunError(f"repo: {cfg.repo} does not exist (a relative repo: is from the current folder, "
                        f"{os.getcwd()}{made})", EXIT_USAGE)
    if not os.path.isdir(cfg.repo) or not is_git_checkout(cfg.repo):
        raise XrunError(f"repo: {cfg.repo} is not a git checkout", EXIT_USAGE)
    out = {}
    for b in cfg.branches:
        commit = ""
        if b.name.startswith("-") or "\0" in b.name:  # git refuses such names; never an option to git
            raise XrunError(f"branches.{b.name}: not a git branch name", EXIT_USAGE)
        # A local branch, a remote one of a clone (the CronJob's), or any other name git knows.
        for ref in (f"refs/heads/{b.name}", f"refs/remotes/origin/{b.name}", b.name):
            r = subprocess.run(["git", "-C", cfg.repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                               capture_output=True, text=True, timeout=60)
            if r.returncode == 0:
                commit = r.stdout.strip()
                break
        if not commit:
            raise XrunError(f"branches.{b.name}: no branch {b.name!r} in {cfg.repo}", EXIT_USAGE)
        out[b.name] = commit
    return out


@contextlib.contextmanager
def checkouts(cfg: NightlyConfig, log: Callable[[str], None] = print) -> Iterator[NightlyConfig]:
    """With ``repo:``: every branch resolved to its head commit and checked out into a
    temporary ``git worktree`` (detached at that commit), yielded as the config whose
    branches carry commit and workdir. The worktrees are removed afterwards, whatever
    happened. Without ``repo:`` the config as it is."""
    if not cfg.repo:
        yield cfg
        return
    commits = resolve_branches(cfg)  # before anything is made or run
    top = tempfile.mkdtemp(prefix="xrun-nightly-")
    made: list[str] = []
    try:
        branches = []
        for b in cfg.branches:
            path = os.path.join(top, b.slug)
            r = subprocess.run(["git", "-C", cfg.repo, "worktree", "add", "--detach", path, commits[b.name]],
                               capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                raise XrunError(f"repo: git worktree add for {b.name} failed: {r.stderr.strip()[-300:]}", EXIT_USAGE)
            made.append(path)
            log(f"nightly: {b.name} at {commits[b.name][:12]} ({path})")
            branches.append(dataclasses.replace(b, commit=commits[b.name], workdir=path))
        yield dataclasses.replace(cfg, branches=branches)
    finally:
        for path in made:
            subprocess.run(["git", "-C", cfg.repo, "worktree", "remove", "--force", path],
                           capture_output=True, timeout=300)
        shutil.rmtree(top, ignore_errors=True)
        subprocess.run(["git", "-C", cfg.repo, "worktree", "prune"], capture_output=True, timeout=300)


@dataclass
class NightlyResult:
    exit_code: int
    summary_md: str
    summary: dict[str, Any]
    report_url: str
    outcomes: list[RunOutcome]


def run_nightly(cfg: NightlyConfig, log: Callable[[str], None] = print,
                now: _dt.datetime | None = None,
                on_view: Callable[[int, int, dict[str, Any]], None] | None = None) -> NightlyResult:
    """Submit and follow every run, compare, append the history, write the report folder.
    ``on_view(i, n, view)``: run i of the plan's n, as it goes (its phase, step, loss).
    With ``repo:`` every branch is its head commit's worktree, shipped as the runs' workdir
    (``checkouts``)."""
    with checkouts(cfg, log) as resolved:
        return _run_nightly(resolved, log, now, on_view)


def _run_nightly(cfg: NightlyConfig, log: Callable[[str], None],
                 now: _dt.datetime | None,
                 on_view: Callable[[int, int, dict[str, Any]], None] | None) -> NightlyResult:
    from orchestrator.analysis.compare import compare_runs, figures, run_values
    from orchestrator.analysis.report import Section, render_report
    from orchestrator.readers.history import read_history
    from orchestrator.readers.loaders import load_run
    from xrun_contract import Layout
    from xrun_contract.storage import open_storage

    started = now or _dt.datetime.now(_dt.UTC)
    date = started.strftime("%Y-%m-%d")
    try:
        storage = open_storage(cfg.storage)
    except ValueError as e:
        raise XrunError(f"storage: {e}") from None
    planned = _plan_unused(cfg, started, storage)
    poll_s = 0.2 if planned[0].spec.backend_name == "local" else 10.0
    outcomes: list[RunOutcome] = []
    for index, run in enumerate(planned, 1):
        log(f"nightly: [{index}/{len(planned)}] {run.name} ({run.branch.name}, {run.config.name}, "
            f"run {run.repeat + 1}/{run.config.repeats}) submitting")
        try:
            submit_run(run)
        except XrunError as e:
            if e.exit_code in (EXIT_UNREACHABLE, EXIT_USAGE):
                raise
            outcomes.append(RunOutcome(run, "NotSubmitted", str(e)))
            log(f"nightly: {run.name} not submitted: {e}")
            continue
        out = follow(run, cfg.timeout_s, poll_s, on_view=None if on_view is None else
                     functools.partial(on_view, index, len(planned)))
        outcomes.append(out)
        log(f"nightly: {run.name} {out.state} after {out.seconds:.0f}s{f' ({out.message})' if out.message else ''}")
    stamp = _report_stamp(storage, started)
    records: dict[str, Any] = {}
    for o in outcomes:
        if o.state == "NotSubmitted":
            continue
        try:
            records[o.planned.name] = load_run(o.planned.name, cfg.storage, f"run {o.planned.name}")
        except XrunError as e:
            o.message = f"{o.message}; {e}".strip("; ")
    for o in outcomes:  # a run that "succeeded" without a single step did not measure anything
        rec = records.get(o.planned.name)
        if o.state == "Succeeded" and (rec is None or not rec.steps.count):
            o.state, o.message = "Failed", (o.message + "; " if o.message else "") + "no step recorded"
    history = [_history_record(cfg, o, records.get(o.planned.name), stamp, started, figures, run_values)
               for o in outcomes]
    sections, entries = [], []
    for config in cfg.configs:
        mine = [o for o in outcomes if o.planned.config.name == config.name]
        side = {b.name: [o for o in mine if o.planned.branch.name == b.name] for b in cfg.branches}
        base_ok = [records[o.planned.name] for o in side[cfg.base] if o.state == "Succeeded"]
        section_sets = []
        for cand in cfg.candidates:
            cand_ok = [records[o.planned.name] for o in side[cand.name] if o.state == "Succeeded"]
            bad = [o for o in side[cfg.base] + side[cand.name] if o.state != "Succeeded"]
            entry: dict[str, Any] = {
                "config": config.name, "candidate": cand.name, "repeats": config.repeats,
                "runs": [o.planned.name for o in side[cand.name]],
                "base_runs": [o.planned.name for o in side[cfg.base]],
                "incomplete": bool(bad), "regressed": False, "regressions": [],
            }
            rs = compare_runs(base_ok, cand_ok, cfg.threshold_pct, cfg.alpha, cfg.warmup) \
                if base_ok and cand_ok else None
            if rs is not None:
                section_sets.append(rs)
                entry.update(comparison=rs.to_dict(), basis=rs.basis,
                             warnings=rs.per_step.warnings if rs.per_step else [])
            if bad:
                reasons = "; ".join(f"{o.planned.name} ({o.planned.branch.name}) {o.state}"
                                    + (f": {o.message}" if o.message else "") for o in bad)
                entry.update(state="INCOMPLETE", verdict=f"INCOMPLETE: {reasons}")
                if rs is not None and rs.regressed:  # what the runs that did finish already show
                    entry.update(regressed=True, regressions=[r.metric for r in rs.regressions])
                    entry["verdict"] += (f"; the {rs.n_base}/{rs.n_cand} runs that succeeded already regressed: "
                                         + ", ".join(_delta(r, rs.on_runs) for r in rs.regressions))
            elif rs is not None and rs.regressed:
                entry.update(state="REGRESSED", regressed=True, regressions=[r.metric for r in rs.regressions],
                             verdict="REGRESSED: " + ", ".join(_delta(r, rs.on_runs) for r in rs.regressions))
            elif rs is None:  # unreachable: every run succeeded, so both sides have records
                entry.update(state="INCOMPLETE", incomplete=True, verdict="INCOMPLETE: no run to compare")
            else:
                entry.update(state="within noise",
                             verdict=f"within noise: no regression beyond {cfg.threshold_pct:g}% "
                                     f"({'per-run test' if rs.on_runs else 'per-step test only'}, "
                                     f"n={rs.n_base}/{rs.n_cand} runs)")
            if rs is not None:  # the report shows this pair's verdict, the one above
                rs.stated = (("regressed" if entry["regressed"] else "failed") if entry["state"] != "within noise"
                             else "ok", entry["verdict"])
            entries.append(entry)
        runs_in = [(o, records.get(o.planned.name)) for o in mine]
        sections.append(Section(f"Config {config.name}", [r for _, r in runs_in if r is not None],
                                [rs.per_step for rs in section_sets if rs.per_step], run_sets=section_sets,
                                states={o.planned.name: (o.state, o.message) for o in mine}))
    failed = [o for o in outcomes if o.state != "Succeeded"]
    regressed = any(e["regressed"] for e in entries)
    incomplete = any(e["incomplete"] for e in entries)
    exit_code = EXIT_FAILED if regressed or incomplete or failed else EXIT_OK
    overall = "INCOMPLETE" if incomplete else "REGRESSED" if regressed else "within noise"
    summary = {
        "date": date, "started": started.isoformat(), "nightly": stamp, "prefix": cfg.prefix,
        "base": cfg.base, "threshold_pct": cfg.threshold_pct, "alpha": cfg.alpha, "slice": cfg.slice,
        "verdict": overall,
        "repo": cfg.repo,
        "runs": [{"name": o.planned.name, "branch": o.planned.branch.name, "commit": o.planned.branch.commit,
                  "code": _code_sha(records.get(o.planned.name)), "config": o.planned.config.name,
                  "repeat": o.planned.repeat, "state": o.state,
                  "message": o.message, "seconds": round(o.seconds, 1)} for o in outcomes],
        "comparisons": entries, "regressed": regressed, "incomplete": incomplete,
        "failed_runs": [o.planned.name for o in failed], "exit_code": exit_code,
    }
    try:
        storage.write_text(Layout.history(stamp), "".join(json.dumps(h, default=str) + "\n" for h in history))
        past = read_history(storage)
    except XrunError:
        raise
    except Exception as e:  # noqa: BLE001 - any client error: storage is unreachable
        raise XrunError(f"storage: cannot write {storage.url(Layout.history(stamp))}: {e}", EXIT_UNREACHABLE) from None
    trends = _trends(cfg, past)
    summary["change_points"] = [t for tr in trends for t in tr["change_points"]]
    md = summary_markdown(cfg, summary, outcomes, sections)
    page = render_report(sections, title=f"xrun nightly {stamp}",
                         subtitle=(f"base {cfg.base} · threshold {cfg.threshold_pct:g}% · "
                                   f"{cfg.slice.get('accelerator')}"),
                         trends=trends, verdict=(overall, _overall_line(summary)))
    prefix = Layout.report(stamp)
    try:
        storage.write_text(f"{prefix}/summary.md", md)
        storage.write_text(f"{prefix}/summary.json", json.dumps(summary, indent=2, default=str) + "\n")
        storage.write_text(f"{prefix}/index.html", page)
    except Exception as e:  # noqa: BLE001 - any client error: storage is unreachable
        raise XrunError(f"storage: cannot write {storage.url(prefix)}: {e}", EXIT_UNREACHABLE) from None
    return NightlyResult(exit_code, md, summary, storage.url(f"{prefix}/index.html"), outcomes)


def _code_sha(rec: Any) -> str:
    """The shipped tree's sha256 a run recorded ("" without a workdir)."""
    return str((getattr(rec, "code", None) or {}).get("sha256") or "")


TREND_NIGHTS = 30  # nights shown in the report's trend charts


def _plan_unused(cfg: NightlyConfig, started: _dt.datetime, storage: Any) -> list[PlannedRun]:
    """The night's runs, named with the first second from ``started`` whose names no stored
    run holds: two nights started within one second (a scheduler's retry, a quick first
    night) would otherwise meet "already exists" on the second's first submit."""
    from xrun_contract import Layout

    try:
        for k in range(60):
            planned = plan_runs(cfg, started + _dt.timedelta(seconds=k))
            if not any(storage.exists(Layout.run_json(p.name)) for p in planned):
                return planned
    except XrunError:
        raise
    except Exception as e:  # noqa: BLE001 - any client error: storage is unreachable
        raise XrunError(f"storage: cannot read {storage.url()}: {e}", EXIT_UNREACHABLE) from None
    return planned  # a minute of nights already: submit says "already exists" by name


def _report_stamp(storage: Any, started: _dt.datetime) -> str:
    """``YYYY-mm-dd-HHMMSS``, with ``-2``, ``-3`` ... when a nightly of the same second left a
    report already: reports are never overwritten."""
    from xrun_contract import Layout

    base = started.strftime("%Y-%m-%d-%H%M%S")
    stamp, n = base, 1
    try:
        while storage.exists(f"{Layout.report(stamp)}/summary.json") or storage.exists(Layout.history(stamp)):
            n += 1
            stamp = f"{base}-{n}"
    except Exception as e:  # noqa: BLE001 - any client error: storage is unreachable
        raise XrunError(f"storage: cannot read {storage.url()}: {e}", EXIT_UNREACHABLE) from None
    return stamp


def _history_record(cfg: NightlyConfig, o: RunOutcome, rec: Any, stamp: str, started: _dt.datetime,
                    figures: Callable, run_values: Callable) -> dict[str, Any]:
    """One run of tonight, as the history keeps it (schema 1)."""
    figs = run_values(figures(rec, cfg.warmup)) if rec is not None and rec.steps.count else {}
    return {
        "schema": 1, "nightly": stamp, "date": started.strftime("%Y-%m-%d"), "started": started.isoformat(),
        "prefix": cfg.prefix, "branch": o.planned.branch.name, "commit": o.planned.branch.commit,
        "image": o.planned.branch.image, "code": _code_sha(rec), "config": o.planned.config.name,
        "repeat": o.planned.repeat,
        "run": o.planned.name, "state": o.state, "message": o.message,
        "accelerator": cfg.slice.get("accelerator"),
        "versions": dict(rec.versions) if rec is not None else {}, "figures": figs,
    }


def _trends(cfg: NightlyConfig, past: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per config and metric: every branch's nights (last TREND_NIGHTS) and the base's change points."""
    from orchestrator.analysis.compare import RUN_METRICS
    from orchestrator.analysis.history import detect, nights

    out = []
    mine = [r for r in past if r.get("prefix") == cfg.prefix]
    for config in cfg.configs:
        for key, label, _better, _gating, _d in RUN_METRICS:
            per_branch = {b.name: nights(mine, b.name, key, config.name, TREND_NIGHTS) for b in cfg.branches}
            cps = detect(per_branch[cfg.base], key, cfg.alpha, cfg.threshold_pct)
            out.append({"config": config.name, "metric": key, "label": label,
                        "nights": {b: [{"nightly": n.nightly, "date": n.date, "commit": n.commit,
                                        "values": n.values, "runs": n.runs} for n in ns]
                                   for b, ns in per_branch.items()},
                        "change_points": [{"config": config.name, "metric": key, "branch": cfg.base,
                                           "nightly": cp.night.nightly, "after_commit": cp.night.commit,
                                           "before_commit": cp.previous.commit, "delta_pct": cp.delta_pct,
                                           "p_value": cp.p_value, "text": cp.sentence(key)} for cp in cps]})
    return out


def _delta(row: Any, on_runs: bool = True) -> str:
    if getattr(row, "diverged_step", None) is not None:
        return f"{row.metric}: diverged (loss not finite from step {row.diverged_step})"
    basis = "runs" if on_runs else "steps"
    return (f"{row.metric} {row.delta_pct:+.1f}% ({basis} p={row.p_value:.3g})"
            if row.delta_pct is not None and row.p_value is not None else row.metric)


def _overall_line(summary: dict[str, Any]) -> str:
    v = summary["verdict"]
    n_inc = sum(e["incomplete"] for e in summary["comparisons"])
    n_reg = sum(e["regressed"] for e in summary["comparisons"])
    if v == "INCOMPLETE":
        return (f"INCOMPLETE: {n_inc} comparison(s) lack runs that succeeded; no verdict for them"
                + (f"; {n_reg} regressed" if n_reg else ""))
    if v == "REGRESSED":
        worst = "; ".join(f"{e['candidate']} on {e['config']}: {e['verdict'].removeprefix('REGRESSED: ')}"
                          for e in summary["comparisons"] if e["regressed"])
        return f"REGRESSED: {n_reg} comparison(s): {worst}"
    return f"within noise: no regression beyond {summary['threshold_pct']:g}%"


def summary_markdown(cfg: NightlyConfig, summary: dict[str, Any], outcomes: list[RunOutcome],
                     sections: list) -> str:
    lines = [f"# xrun nightly {summary['nightly']}", ""]
    lines += [f"Base `{cfg.base}`, threshold {cfg.threshold_pct:g}%, slice {cfg.slice.get('accelerator')}: "
              f"**{_overall_line(summary)}**.", ""]
    lines += ["| Config | Candidate | Runs | Verdict |", "|---|---|---|---|"]
    for e in summary["comparisons"]:
        lines.append(f"| {e['config']} | {e['candidate']} | {', '.join(e['runs'])} | {e['verdict']} |")
    lines += ["", "| Run | Branch | Config | Repeat | State | Seconds | Commit | Code |",
              "|---|---|---|---|---|---|---|---|"]
    codes = {r["name"]: r.get("code") or "" for r in summary["runs"]}
    for o in outcomes:
        state = o.state + (f" ({o.message})" if o.message and o.state != "Succeeded" else "")
        lines.append(f"| {o.planned.name} | {o.planned.branch.name} | {o.planned.config.name} | "
                     f"{o.planned.repeat + 1} | {state} | {o.seconds:.0f} | {o.planned.branch.commit[:12]} | "
                     f"{codes.get(o.planned.name, '')} |")
    for cp in summary.get("change_points", []):
        lines += ["", f"**Change point on {cp['branch']}** ({cp['config']}): {cp['text']}."]
    for section in sections:
        for rs in section.run_sets:
            lines += ["", f"## {section.title}: {rs.cand_label} vs {rs.base_label}", "", rs.markdown().rstrip()]
            if rs.per_step is not None:
                lines += ["", "Per-step detail (first run of each side; the verdict is the one above):", "",
                          rs.per_step.markdown(verdict=False).rstrip()]
    # The last line is the night's verdict whatever the sections hold: what `tail -n 1` reads.
    lines += ["", f"Verdict: {_overall_line(summary)}"]
    return "\n".join(lines) + "\n"


def render_cronjob_yaml(cfg: NightlyConfig, text: str) -> str:
    """`--render-cronjob`: the objects as one multi-document YAML stream."""
    from manifests.nightly import CronJobSpec, nightly_objects

    if cfg.backend != "kube" and not cfg.context:
        raise XrunError("backend: --render-cronjob needs 'backend: kube' (a CronJob cannot run local runs)")
    cron = cfg.cronjob
    name = _str(cron.get("name", f"xrun-{cfg.prefix}"), "cronjob.name")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?", name):
        raise XrunError(f"cronjob.name: {name!r} must be a DNS-1123 label of at most 52 characters")
    sa = _str(cron.get("service_account", name), "cronjob.service_account")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", sa):
        raise XrunError(f"cronjob.service_account: {sa!r} is not a valid Kubernetes name")
    suspend = cron.get("suspend", False)
    if not isinstance(suspend, bool):
        raise XrunError("cronjob.suspend: must be true or false")
    runs = sum(c.repeats for c in cfg.configs) * len(cfg.branches)
    git_url = _str(cron.get("git_url"), "cronjob.git_url", required=False)
    git_secret = _str(cron.get("git_secret"), "cronjob.git_secret", required=False)
    if cfg.repo and not git_url:
        raise XrunError("cronjob.git_url: with repo: the CronJob needs its own checkout: give git_url (cloned by "
                        "an init container of cronjob.image, which needs git) and git_secret (a Secret with a "
                        "read-only deploy key), or run 'xrun nightly' from a CI job that checks the repository out")
    if git_url and not cfg.repo:
        raise XrunError("cronjob.git_url: only with repo: (the branches are then built from that clone)")
    if git_secret and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", git_secret):
        raise XrunError(f"cronjob.git_secret: {git_secret!r} is not a valid Secret name")
    spec = CronJobSpec(
        name=name, namespace=_str(cron.get("namespace", cfg.namespace), "cronjob.namespace"),
        schedule=cfg.schedule,
        image=_str(cron.get("image"), "cronjob.image (an image with the xrun CLI, e.g. built from the Dockerfile)"),
        nightly_yaml=text, service_account=sa,
        gcp_service_account=_str(cron.get("gcp_service_account"), "cronjob.gcp_service_account", required=False),
        time_zone=_str(cron.get("time_zone", cfg.time_zone), "cronjob.time_zone", required=False),
        active_deadline_seconds=int(cfg.timeout_s * runs + 3600), suspend=suspend,
        git_url=git_url, git_secret=git_secret,
    )
    return yaml.safe_dump_all(nightly_objects(spec), sort_keys=False, default_flow_style=False, width=100)
