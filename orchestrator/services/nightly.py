"""`xrun nightly`: run every branch's image on the same slice and compare it with the base.

Every (config, branch) run of the plan (``orchestrator.nightly_file``) is submitted with
the very service ``xrun submit`` uses and followed to its end, one after another so the
runs never share the slice. Then each candidate is compared with the base of its config
and ``reports/<date>/summary.md``, ``summary.json`` and ``index.html`` are written under
the storage root. The exit code says whether anything regressed (or failed).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from orchestrator.nightly_file import NightlyConfig, PlannedRun, _str, plan_runs
from orchestrator.services import runs
from xrun_contract import TERMINAL_STATES
from xrun_contract.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, XrunError


@dataclass
class RunOutcome:
    planned: PlannedRun
    state: str  # Succeeded | Failed | Deleted | Timeout | NotSubmitted
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
    """Poll the backend until the run ends; past the timeout it is deleted. ``on_view``
    gets the run's status view (phase, step, loss, ...) at each poll."""
    backend = runs.backend_for_spec(run.spec)
    reader = None
    if on_view is not None:
        from orchestrator.readers.loaders import StoredRun
        from xrun_contract.storage import open_storage

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
        if reader is not None and on_view is not None and status is not None:
            from orchestrator.readers.view import run_view

            with contextlib.suppress(XrunError, OSError):
                on_view(run_view(reader.storage, reader.poll(), status))
        elapsed = time.monotonic() - started
        if status is not None:
            missing_since = None
            if status.state in TERMINAL_STATES:
                return RunOutcome(run, status.state, status.message, elapsed)
        elif missing_since is None:
            missing_since = elapsed
        elif elapsed - missing_since > 300:
            return RunOutcome(run, "Failed", "the backend lost the run", elapsed)
        if elapsed > timeout_s:
            with contextlib.suppress(XrunError):
                backend.delete(run.name, wait=True)
            return RunOutcome(run, "Timeout", f"still running after {timeout_s:.0f}s: deleted", elapsed)
        time.sleep(poll_s)


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
    """Submit and follow every run, compare, write reports/<date>/ under the storage root.
    ``on_view(i, n, view)``: run i of the plan's n, as it goes (its phase, step, loss)."""
    from orchestrator.analysis.compare import compare
    from orchestrator.analysis.report import Section, render_report
    from orchestrator.readers.loaders import load_run
    from xrun_contract import Layout
    from xrun_contract.storage import open_storage

    started = now or _dt.datetime.now(_dt.UTC)
    date = started.strftime("%Y-%m-%d")
    planned = plan_runs(cfg, started)
    try:
        storage = open_storage(cfg.storage)
    except ValueError as e:
        raise XrunError(f"storage: {e}") from None
    poll_s = 0.5 if planned[0].spec.backend_name == "local" else 10.0
    outcomes: list[RunOutcome] = []
    for index, run in enumerate(planned, 1):
        log(f"nightly: [{index}/{len(planned)}] {run.name} ({run.branch.name}, {run.config.name}) submitting")
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
    by_key = {(o.planned.config.name, o.planned.branch.name): o for o in outcomes}
    sections, comparisons, entries = [], [], []
    for config in cfg.configs:
        records = {}
        for branch in cfg.branches:
            o = by_key[(config.name, branch.name)]
            if o.state == "NotSubmitted":
                continue
            try:
                records[branch.name] = load_run(o.planned.name, cfg.storage, f"run {o.planned.name}")
            except XrunError as e:
                o.message = f"{o.message}; {e}".strip("; ")
        base = records.get(cfg.base)
        section_cmps = []
        for cand in cfg.candidates:
            o = by_key[(config.name, cand.name)]
            entry: dict[str, Any] = {"config": config.name, "candidate": cand.name, "run": o.planned.name,
                                     "base_run": by_key[(config.name, cfg.base)].planned.name,
                                     "state": o.state}
            rec = records.get(cand.name)
            if base is None or rec is None:
                entry["verdict"] = "not compared: " + ("the base run has no record" if base is None
                                                       else f"the candidate run {o.state}")
                entry["regressed"] = True
            else:
                c = compare(base, rec, threshold_pct=cfg.threshold_pct, alpha=cfg.alpha, warmup=cfg.warmup)
                section_cmps.append(c)
                comparisons.append((config, c))
                entry.update(regressed=c.regressed, regressions=[r.metric for r in c.regressions],
                             warnings=c.warnings, comparison=c.to_dict(),
                             verdict=("REGRESSED: " + (", ".join(_delta(r) for r in c.regressions)
                                                       or "candidate failed")) if c.regressed
                             else "no regression beyond the threshold")
            entries.append(entry)
        runs = [records[b.name] for b in cfg.branches if b.name in records]
        sections.append(Section(f"Config {config.name}", runs, section_cmps))
    failed = [o for o in outcomes if o.state != "Succeeded"]
    regressed = any(e["regressed"] for e in entries)
    exit_code = EXIT_FAILED if regressed or failed else EXIT_OK
    summary = {
        "date": date, "started": started.isoformat(), "prefix": cfg.prefix, "base": cfg.base,
        "threshold_pct": cfg.threshold_pct, "alpha": cfg.alpha, "slice": cfg.slice,
        "runs": [{"name": o.planned.name, "branch": o.planned.branch.name, "commit": o.planned.branch.commit,
                  "config": o.planned.config.name, "state": o.state, "message": o.message,
                  "seconds": round(o.seconds, 1)} for o in outcomes],
        "comparisons": entries, "regressed": regressed, "failed_runs": [o.planned.name for o in failed],
        "exit_code": exit_code,
    }
    md = summary_markdown(cfg, summary, comparisons, outcomes)
    page = render_report(sections, title=f"xrun nightly {date}",
                         subtitle=f"base {cfg.base} · threshold {cfg.threshold_pct:g}% · {cfg.slice.get('accelerator')}")
    prefix = Layout.report(date)
    try:
        storage.write_text(f"{prefix}/summary.md", md)
        storage.write_text(f"{prefix}/summary.json", json.dumps(summary, indent=2, default=str) + "\n")
        storage.write_text(f"{prefix}/index.html", page)
    except Exception as e:  # noqa: BLE001 - any client error: storage is unreachable
        raise XrunError(f"storage: cannot write {storage.url(prefix)}: {e}", EXIT_UNREACHABLE) from None
    return NightlyResult(exit_code, md, summary, storage.url(f"{prefix}/index.html"), outcomes)


def _delta(row: Any) -> str:
    return f"{row.metric} {row.delta_pct:+.1f}%" if row.delta_pct is not None else row.metric


def summary_markdown(cfg: NightlyConfig, summary: dict[str, Any], comparisons: list, outcomes: list[RunOutcome]) -> str:
    lines = [f"# xrun nightly {summary['date']}", ""]
    verdict = "**REGRESSED**" if summary["regressed"] else "no regression"
    if summary["failed_runs"]:
        verdict += f"; {len(summary['failed_runs'])} run(s) did not succeed"
    lines += [f"Base `{cfg.base}`, threshold {cfg.threshold_pct:g}%, slice {cfg.slice.get('accelerator')}: {verdict}.", ""]
    lines += ["| Config | Candidate | Run | Verdict |", "|---|---|---|---|"]
    for e in summary["comparisons"]:
        lines.append(f"| {e['config']} | {e['candidate']} | {e['run']} | {e['verdict']} |")
    lines += ["", "| Run | Branch | Config | State | Seconds |", "|---|---|---|---|---|"]
    for o in outcomes:
        state = o.state + (f" ({o.message})" if o.message and o.state != "Succeeded" else "")
        lines.append(f"| {o.planned.name} | {o.planned.branch.name} | {o.planned.config.name} | {state} | {o.seconds:.0f} |")
    for config, c in comparisons:
        lines += ["", f"## {config.name}: {c.cand_label} vs {c.base_label}", "", c.markdown().rstrip()]
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
    runs = len(cfg.configs) * len(cfg.branches)
    spec = CronJobSpec(
        name=name, namespace=_str(cron.get("namespace", cfg.namespace), "cronjob.namespace"),
        schedule=cfg.schedule,
        image=_str(cron.get("image"), "cronjob.image (an image with the xrun CLI, e.g. built from the Dockerfile)"),
        nightly_yaml=text, service_account=sa,
        gcp_service_account=_str(cron.get("gcp_service_account"), "cronjob.gcp_service_account", required=False),
        time_zone=_str(cron.get("time_zone", cfg.time_zone), "cronjob.time_zone", required=False),
        active_deadline_seconds=int(cfg.timeout_s * runs + 3600), suspend=suspend,
    )
    return yaml.safe_dump_all(nightly_objects(spec), sort_keys=False, default_flow_style=False, width=100)
