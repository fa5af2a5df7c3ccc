"""`xrun nightly`: run every branch's image on the same slice and compare it with the base.

The nightly file names a base branch and candidate branches (image and commit each),
configs (the training command), the slice, the storage root and the schedule. Every
(config, branch) run is submitted with the very code path of ``xrun submit`` (the Click
command, in process, with a run file) and followed to its end, one after another so the
runs never share the slice. Then each candidate is compared with the base of its config and
``reports/<date>/summary.md``, ``summary.json`` and ``index.html`` are written under the
storage root. The exit code says whether anything regressed (or failed).

Example file::

    prefix: nightly
    schedule: "0 3 * * *"
    storage: gs://my-bucket/xrun
    slice: {accelerator: v6e-8}
    base: main
    branches:
      main: {image: us-docker.pkg.dev/p/r/xrun:main-abc1234, commit: abc1234}
      feat/x: {image: us-docker.pkg.dev/p/r/xrun:feat-x-def5678, commit: def5678}
    configs:
      tiny: {command: "python3 -m workload.train --preset tiny steps=200"}
    threshold: 5%
    backend: kube
    namespace: team
    cronjob: {image: us-docker.pkg.dev/p/r/xrun-cli:0.1.0, gcp_service_account: xrun@p.iam.gserviceaccount.com}
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from orchestrator.spec import FIELDS, RunSpec, SpecError, build_spec, env_values, max_name_length

EXIT_OK, EXIT_REGRESSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


class NightlyError(ValueError):
    """One line naming the field of the nightly file (or the step) and what is allowed."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code


# ---------------------------------------------------------------------------------------
# The nightly file

TOP_KEYS = ("prefix", "base", "branches", "configs", "slice", "storage", "schedule", "time_zone",
            "threshold", "alpha", "warmup", "backend", "context", "namespace", "run", "timeout", "cronjob")
SLICE_KEYS = ("accelerator", "num_slices", "nodes", "cpu_devices_per_host")
BRANCH_KEYS = ("image", "commit", "env")
CONFIG_KEYS = ("command", "env")
CRONJOB_KEYS = ("name", "namespace", "image", "service_account", "gcp_service_account", "time_zone", "suspend")
# RunSpec fields a nightly sets itself; the rest may be given for every run under `run:`.
NIGHTLY_SET = {"name", "image", "command", "branch", "commit", "storage", "backend", "context",
               "namespace", *SLICE_KEYS}
RUN_KEYS = tuple(sorted(set(FIELDS) - NIGHTLY_SET))
CRON_MACROS = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12),
               ("day of week", 0, 7))
CRON_NAMES = {"jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6, "jul": 7, "aug": 8, "sep": 9,
              "oct": 10, "nov": 11, "dec": 12, "sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5,
              "sat": 6}
STAMP = "%Y%m%d-%H%M%S"


@dataclass
class Branch:
    name: str
    image: str
    commit: str = ""
    env: dict[str, str] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        """The branch as a DNS-1035 fragment: 'feat/X_y' -> 'feat-x-y'."""
        return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", self.name.lower())).strip("-") or "branch"


@dataclass
class Config:
    name: str
    command: str
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class NightlyConfig:
    path: str
    text: str
    base: str
    branches: list[Branch]  # the base first
    configs: list[Config]
    slice: dict[str, Any]
    storage: str
    prefix: str = "nightly"
    schedule: str = "0 3 * * *"
    time_zone: str = ""
    threshold_pct: float = 5.0
    alpha: float = 0.05
    warmup: int = 3
    backend: str = ""
    context: str = ""
    namespace: str = "default"
    run: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 6 * 3600.0
    cronjob: dict[str, Any] = field(default_factory=dict)

    @property
    def base_branch(self) -> Branch:
        return self.branches[0]

    @property
    def candidates(self) -> list[Branch]:
        return self.branches[1:]

    def with_storage(self, root: str) -> NightlyConfig:
        cfg = replace(self, storage=root)
        plan_runs(cfg)  # revalidate the run specs against the new root
        return cfg


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise NightlyError(f"{where}: must be a mapping, got {type(value).__name__}")
    return value


def _keys(d: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(k) for k in d if k not in allowed)
    if unknown:
        raise NightlyError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(allowed)}")


def _str(value: Any, where: str, required: bool = True) -> str:
    if value is None or value == "":
        if required:
            raise NightlyError(f"{where}: required")
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise NightlyError(f"{where}: must be a string")
    return str(value)


def _env(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    try:
        return env_values(_mapping(value, where), where)
    except SpecError as e:
        raise NightlyError(str(e)) from None


def parse_percent(value: Any, where: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        pct = float(value)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%?\s*", str(value))
        if not m:
            raise NightlyError(f"{where}: {value!r} is not a percentage; use e.g. 5% or 2.5")
        pct = float(m[1])
    if not 0 <= pct <= 1000:
        raise NightlyError(f"{where}: must be 0% to 1000%, got {value!r}")
    return pct


def parse_seconds(value: Any, where: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(value))
        if not m:
            raise NightlyError(f"{where}: {value!r} is not a duration; use seconds or e.g. 90s, 30m, 6h")
        seconds = float(m[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[m[2]]
    if seconds <= 0:
        raise NightlyError(f"{where}: must be positive")
    return seconds


def check_schedule(schedule: str) -> None:
    """Five cron fields (numbers, ranges, steps, lists, month/day names) or a macro."""
    s = schedule.strip()
    if s in CRON_MACROS:
        return
    parts = s.split()
    if len(parts) != 5:
        raise NightlyError(f"schedule: {schedule!r} must have 5 fields (minute hour day-of-month month "
                           "day-of-week) or be a macro like @daily")
    for text, (name, lo, hi) in zip(parts, CRON_FIELDS, strict=True):
        for item in text.split(","):
            rng, _, step = item.partition("/")
            if step and not step.isdigit():
                raise NightlyError(f"schedule: {name} step {step!r} is not a number")
            if rng in ("*", "?"):
                continue
            for bound in rng.split("-", 1):
                v = CRON_NAMES.get(bound.lower()) if not bound.isdigit() else int(bound)
                if v is None or not lo <= v <= hi:
                    raise NightlyError(f"schedule: {name} value {bound!r} is outside {lo}-{hi}")


def load_nightly(path: str) -> NightlyConfig:
    """Read and validate a nightly file; every run spec it implies is validated too."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise NightlyError(f"--file: cannot read {path}: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise NightlyError(f"--file: {path} is not valid YAML{f' (line {mark.line + 1})' if mark else ''}") from None
    d = _mapping(data, f"nightly file {path}")
    _keys(d, TOP_KEYS, "nightly file")
    base = _str(d.get("base"), "base")
    raw_branches = _mapping(d.get("branches") or {}, "branches")
    if base not in raw_branches:
        raise NightlyError(f"base: branch {base!r} is not under branches ({', '.join(map(str, raw_branches)) or 'none'})")
    if len(raw_branches) < 2:
        raise NightlyError("branches: need the base and at least one candidate branch")
    branches = []
    for name, b in raw_branches.items():
        where = f"branches.{name}"
        b = _mapping(b, where)
        _keys(b, BRANCH_KEYS, where)
        branches.append(Branch(str(name), _str(b.get("image"), f"{where}.image"),
                               _str(b.get("commit"), f"{where}.commit", required=False),
                               _env(b.get("env"), f"{where}.env")))
    branches.sort(key=lambda br: br.name != base)  # base first, then file order
    raw_configs = _mapping(d.get("configs") or {}, "configs")
    if not raw_configs:
        raise NightlyError("configs: need at least one config (name: {command: ...})")
    configs = []
    for name, c in raw_configs.items():
        where = f"configs.{name}"
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", str(name)):
            raise NightlyError(f"{where}: config names are letters, digits, '.', '_' and '-'")
        c = _mapping(c, where)
        _keys(c, CONFIG_KEYS, where)
        configs.append(Config(str(name), _str(c.get("command"), f"{where}.command"), _env(c.get("env"), f"{where}.env")))
    slice_ = _mapping(d.get("slice") or {}, "slice")
    _keys(slice_, SLICE_KEYS, "slice")
    _str(slice_.get("accelerator"), "slice.accelerator")
    storage = _str(d.get("storage"), "storage")
    prefix = _str(d.get("prefix", "nightly"), "prefix")
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,18}[a-z0-9])?", prefix):
        raise NightlyError(f"prefix: {prefix!r} must be 1-20 lowercase letters, digits or '-', starting with a letter")
    schedule = _str(d.get("schedule", "0 3 * * *"), "schedule")
    check_schedule(schedule)
    run = _mapping(d.get("run") or {}, "run")
    _keys(run, RUN_KEYS, "run")
    cron = _mapping(d.get("cronjob") or {}, "cronjob")
    _keys(cron, CRONJOB_KEYS, "cronjob")
    backend = _str(d.get("backend"), "backend", required=False)
    if backend not in ("", "local", "kube"):
        raise NightlyError(f"backend: must be local or kube, got {backend!r}")
    warmup = d.get("warmup", 3)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise NightlyError(f"warmup: must be a whole number of steps >= 0, got {warmup!r}")
    alpha = d.get("alpha", 0.05)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha <= 0.5:
        raise NightlyError(f"alpha: must be a number in (0, 0.5], got {alpha!r}")
    cfg = NightlyConfig(
        path=path, text=text, base=base, branches=branches, configs=configs, slice=dict(slice_),
        storage=storage, prefix=prefix, schedule=schedule,
        time_zone=_str(d.get("time_zone"), "time_zone", required=False),
        threshold_pct=parse_percent(d.get("threshold", "5%"), "threshold"), alpha=float(alpha),
        warmup=warmup, backend=backend, context=_str(d.get("context"), "context", required=False),
        namespace=_str(d.get("namespace", "default"), "namespace"), run=dict(run),
        timeout_s=parse_seconds(d.get("timeout", 6 * 3600), "timeout"), cronjob=dict(cron),
    )
    plan_runs(cfg)  # every run spec must validate now, before anything is submitted
    return cfg


# ---------------------------------------------------------------------------------------
# Runs


@dataclass
class PlannedRun:
    index: int
    branch: Branch
    config: Config
    name: str
    run_file: dict[str, Any]
    spec: RunSpec


def run_name(prefix: str, branch: Branch, stamp: str, index: int, limit: int) -> str:
    """'<prefix>-<branch>-<YYYYmmdd-HHMMSS>-<i>', the branch cut to fit the name limit."""
    fixed = f"{prefix}--{stamp}-{index}"
    room = max(1, limit - len(fixed))
    slug = branch.slug[:room].strip("-") or "b"
    return f"{prefix}-{slug}-{stamp}-{index}"


def plan_runs(cfg: NightlyConfig, when: _dt.datetime | None = None) -> list[PlannedRun]:
    """Every (config, branch) run in submission order, base first within each config."""
    stamp = (when or _dt.datetime.now(_dt.UTC)).strftime(STAMP)
    planned: list[PlannedRun] = []
    index = 0
    for config in cfg.configs:
        for branch in cfg.branches:
            values: dict[str, Any] = {
                **cfg.run, **cfg.slice, "image": branch.image, "command": config.command,
                "storage": cfg.storage, "branch": branch.name, "commit": branch.commit,
                "namespace": cfg.namespace,
                "env": {**(cfg.run.get("env") or {}), **config.env, **branch.env},
            }
            if cfg.backend:
                values["backend"] = cfg.backend
            if cfg.context:
                values["context"] = cfg.context
            if not values["env"]:
                del values["env"]
            where = f"branches.{branch.name} x configs.{config.name}"
            try:
                limit = max_name_length(build_spec({**values, "name": "x"}, {}))
                values["name"] = run_name(cfg.prefix, branch, stamp, index, limit)
                spec = build_spec(values, {})
            except SpecError as e:
                raise NightlyError(f"{where}: {e}") from None
            planned.append(PlannedRun(index, branch, config, values["name"], values, spec))
            index += 1
    return planned


@dataclass
class RunOutcome:
    planned: PlannedRun
    state: str  # Succeeded | Failed | Deleted | Timeout | NotSubmitted
    message: str = ""
    seconds: float = 0.0


def submit_run(run: PlannedRun, workdir: Path) -> None:
    """`xrun submit -f <run file> --detach`, in process: the same validation, run.json,
    manifest and backend call as a user's submit."""
    import click

    from orchestrator.cli import cli

    path = workdir / f"{run.name}.yaml"
    path.write_text(yaml.safe_dump(run.run_file, sort_keys=False))
    try:
        rv = cli.main(args=["submit", "-f", str(path), "--detach"], prog_name="xrun", standalone_mode=False)
    except SpecError as e:
        raise NightlyError(f"submit {run.name}: {e}") from None
    except click.ClickException as e:
        raise NightlyError(f"submit {run.name}: {e.format_message()}", e.exit_code) from None
    if rv not in (None, 0):
        raise NightlyError(f"submit {run.name}: exit code {rv}", int(rv))


def follow(run: PlannedRun, timeout_s: float, poll_s: float) -> RunOutcome:
    """Poll the backend until the run ends; past the timeout it is deleted."""
    from orchestrator.backends import BackendError
    from orchestrator.cli import backend_for

    spec = run.spec
    backend = backend_for(spec.backend_name, spec.storage_root, spec.context, spec.namespace)
    started = time.monotonic()
    missing_since: float | None = None
    while True:
        try:
            status = backend.status(run.name)
        except BackendError as e:
            if e.exit_code == EXIT_UNREACHABLE:
                raise NightlyError(f"follow {run.name}: {e}", EXIT_UNREACHABLE) from None
            status = None
        elapsed = time.monotonic() - started
        if status is not None:
            missing_since = None
            if status.state in ("Succeeded", "Failed", "Deleted"):
                return RunOutcome(run, status.state, status.message, elapsed)
        elif missing_since is None:
            missing_since = elapsed
        elif elapsed - missing_since > 300:
            return RunOutcome(run, "Failed", "the backend lost the run", elapsed)
        if elapsed > timeout_s:
            with contextlib.suppress(BackendError):
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
                now: _dt.datetime | None = None) -> NightlyResult:
    """Submit and follow every run, compare, write reports/<date>/ under the storage root."""
    from orchestrator.compare import compare
    from orchestrator.report import Section, render_report
    from orchestrator.runlog import RunLogError, load_run
    from xrun_contract import Layout
    from xrun_contract.storage import open_storage

    started = now or _dt.datetime.now(_dt.UTC)
    date = started.strftime("%Y-%m-%d")
    planned = plan_runs(cfg, started)
    try:
        storage = open_storage(cfg.storage)
    except ValueError as e:
        raise NightlyError(f"storage: {e}") from None
    poll_s = 0.5 if planned[0].spec.backend_name == "local" else 10.0
    outcomes: list[RunOutcome] = []
    with tempfile.TemporaryDirectory(prefix="xrun-nightly-") as tmp:
        for run in planned:
            log(f"nightly: {run.name} ({run.branch.name}, {run.config.name}) submitting")
            try:
                submit_run(run, Path(tmp))
            except NightlyError as e:
                if e.exit_code in (EXIT_UNREACHABLE, EXIT_USAGE):
                    raise
                outcomes.append(RunOutcome(run, "NotSubmitted", str(e)))
                log(f"nightly: {run.name} not submitted: {e}")
                continue
            out = follow(run, cfg.timeout_s, poll_s)
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
            except RunLogError as e:
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
    exit_code = EXIT_REGRESSED if regressed or failed else EXIT_OK
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
        raise NightlyError(f"storage: cannot write {storage.url(prefix)}: {e}", EXIT_UNREACHABLE) from None
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
        raise NightlyError("backend: --render-cronjob needs 'backend: kube' (a CronJob cannot run local runs)")
    cron = cfg.cronjob
    name = _str(cron.get("name", f"xrun-{cfg.prefix}"), "cronjob.name")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?", name):
        raise NightlyError(f"cronjob.name: {name!r} must be a DNS-1123 label of at most 52 characters")
    sa = _str(cron.get("service_account", name), "cronjob.service_account")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", sa):
        raise NightlyError(f"cronjob.service_account: {sa!r} is not a valid Kubernetes name")
    suspend = cron.get("suspend", False)
    if not isinstance(suspend, bool):
        raise NightlyError("cronjob.suspend: must be true or false")
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
