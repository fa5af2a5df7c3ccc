"""The nightly file: base and candidate branches, configs, slice, storage, schedule; and
the plan of runs it implies (every run spec validated before anything is submitted).

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
      tiny: {command: "python3 -m workload.train --preset tiny steps=200", repeats: 5}
    threshold: 5%
    backend: kube
    namespace: team
    cronjob: {image: us-docker.pkg.dev/p/r/xrun-cli:0.1.0, gcp_service_account: xrun@p.iam.gserviceaccount.com}

From git instead of prebuilt images (``repo:``, a local checkout): every branch is a name
in it, resolved to its head commit when the nightly starts (``commit:`` is refused), checked
out into a temporary ``git worktree`` and shipped as the run's ``workdir`` on ``image``
(or the branch's own ``image``)::

    repo: ~/src/maxtext
    image: us-docker.pkg.dev/p/r/maxtext:stable
    base: main
    branches: {main: {}, feat/nnx: {}}
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

from manifests.spec import FIELDS, RunSpec, build_spec, env_values, max_name_length
from orchestrator import settings
from orchestrator.runfile import load_yaml_mapping, read_text
from xrun_contract.errors import XrunError, did_you_mean, short_repr

# ---------------------------------------------------------------------------------------
# The nightly file

TOP_KEYS = ("prefix", "repo", "image", "base", "branches", "configs", "slice", "storage", "schedule", "time_zone",
            "threshold", "alpha", "warmup", "backend", "context", "namespace", "run", "timeout", "cronjob")
SLICE_KEYS = ("accelerator", "num_slices", "nodes", "cpu_devices_per_host")
BRANCH_KEYS = ("image", "commit", "env")
CONFIG_KEYS = ("command", "env", "repeats")
MAX_REPEATS = 50
CRONJOB_KEYS = ("name", "namespace", "image", "service_account", "gcp_service_account", "time_zone", "suspend",
                "git_url", "git_secret")
# RunSpec fields a nightly sets itself; the rest may be given for every run under `run:`.
NIGHTLY_SET = {"name", "image", "command", "branch", "commit", "storage", "backend", "context",
               "namespace", "workdir", "code_sha256", *SLICE_KEYS}
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
    workdir: str = ""  # with repo: the branch's worktree, while the nightly runs

    @property
    def slug(self) -> str:
        """The branch as a DNS-1035 fragment: 'feat/X_y' -> 'feat-x-y'."""
        return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", self.name.lower())).strip("-") or "branch"


@dataclass
class Config:
    name: str
    command: str
    env: dict[str, str] = field(default_factory=dict)
    repeats: int = 1  # runs per branch; a verdict on runs needs >= 4 per side (benchstat)


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
    repo: str = ""  # a local git checkout: branches are built from it (services.nightly.checkouts)

    @property
    def candidates(self) -> list[Branch]:
        return self.branches[1:]

    def with_storage(self, root: str) -> NightlyConfig:
        cfg = replace(self, storage=settings.absolute_root(root))
        plan_runs(cfg)  # revalidate the run specs against the new root
        return cfg


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise XrunError(f"{where}: must be a mapping, got {type(value).__name__}")
    return value


def _keys(d: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(k) for k in d if k not in allowed)
    if unknown:
        raise XrunError(f"{where}: unknown key {short_repr(unknown[0])}{did_you_mean(unknown[0], allowed)}; "
                        f"allowed: {', '.join(allowed)}")


def _str(value: Any, where: str, required: bool = True) -> str:
    if value is None or value == "":
        if required:
            raise XrunError(f"{where}: required")
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise XrunError(f"{where}: must be a string")
    return str(value)


def _env(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    return env_values(_mapping(value, where), where)


def parse_percent(value: Any, where: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        pct = float(value)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%?\s*", str(value))
        if not m:
            raise XrunError(f"{where}: {short_repr(value)} is not a percentage; use e.g. 5% or 2.5")
        pct = float(m[1])
    if not 0 <= pct <= 1000:
        raise XrunError(f"{where}: must be 0% to 1000%, got {short_repr(value)}")
    return pct


def parse_seconds(value: Any, where: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(value))
        if not m:
            raise XrunError(f"{where}: {short_repr(value)} is not a duration; use seconds or e.g. 90s, 30m, 6h")
        seconds = float(m[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[m[2]]
    if seconds <= 0:
        raise XrunError(f"{where}: must be positive")
    return seconds


def check_schedule(schedule: str) -> None:
    """Five cron fields (numbers, ranges, steps, lists, month/day names) or a macro."""
    s = schedule.strip()
    if s in CRON_MACROS:
        return
    parts = s.split()
    if len(parts) != 5:
        raise XrunError(f"schedule: {short_repr(schedule)} must have 5 fields (minute hour day-of-month month "
                           "day-of-week) or be a macro like @daily")
    for text, (name, lo, hi) in zip(parts, CRON_FIELDS, strict=True):
        for item in text.split(","):
            rng, _, step = item.partition("/")
            if step and not step.isdigit():
                raise XrunError(f"schedule: {name} step {short_repr(step)} is not a number")
            if rng in ("*", "?"):
                continue
            for bound in rng.split("-", 1):
                v = CRON_NAMES.get(bound.lower()) if not bound.isdigit() else int(bound)
                if v is None or not lo <= v <= hi:
                    raise XrunError(f"schedule: {name} value {short_repr(bound)} is outside {lo}-{hi}")


def load_nightly(path: str) -> NightlyConfig:
    """Read and validate a nightly file; every run spec it implies is validated too."""
    text = read_text(path, "--file")
    d = load_yaml_mapping(text, "nightly file", path)
    _keys(d, TOP_KEYS, "nightly file")
    base = _str(d.get("base"), "base")
    raw_branches = _mapping(d.get("branches") or {}, "branches")
    if base not in raw_branches:
        known = ", ".join(map(str, raw_branches)) or "none"
        raise XrunError(f"base: branch {short_repr(base)} is not under branches ({known})")
    if len(raw_branches) < 2:
        raise XrunError("branches: need the base and at least one candidate branch")
    repo = _str(d.get("repo"), "repo", required=False)
    if repo:
        repo = os.path.abspath(os.path.expanduser(repo))  # from here, as storage: is
    image = _str(d.get("image"), "image", required=False)
    branches = []
    for name, b in raw_branches.items():
        where = f"branches.{name}"
        b = _mapping({} if b is None else b, where)
        _keys(b, BRANCH_KEYS, where)
        if repo and b.get("commit") not in (None, ""):
            raise XrunError(f"{where}.commit: with repo: the commit is the branch's head, resolved when the nightly "
                            "starts; remove it (a commit typed by hand goes stale)")
        branch_image = _str(b.get("image"), f"{where}.image", required=False) or image
        if not branch_image:
            raise XrunError(f"{where}.image: required (or a top-level image: for every branch)")
        branches.append(Branch(str(name), branch_image,
                               _str(b.get("commit"), f"{where}.commit", required=False),
                               _env(b.get("env"), f"{where}.env")))
    branches.sort(key=lambda br: br.name != base)  # base first, then file order
    raw_configs = _mapping(d.get("configs") or {}, "configs")
    if not raw_configs:
        raise XrunError("configs: need at least one config (name: {command: ...})")
    configs = []
    for name, c in raw_configs.items():
        where = f"configs.{name}"
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", str(name)):
            raise XrunError(f"{where}: config names are letters, digits, '.', '_' and '-'")
        c = _mapping(c, where)
        _keys(c, CONFIG_KEYS, where)
        repeats = c.get("repeats", 1)
        if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= MAX_REPEATS:
            raise XrunError(f"{where}.repeats: must be a whole number of runs per branch, 1 to {MAX_REPEATS}, "
                            f"got {short_repr(repeats)}")
        configs.append(Config(str(name), _str(c.get("command"), f"{where}.command"), _env(c.get("env"), f"{where}.env"),
                              repeats))
    slice_ = _mapping(d.get("slice") or {}, "slice")
    _keys(slice_, SLICE_KEYS, "slice")
    _str(slice_.get("accelerator"), "slice.accelerator")
    storage = settings.absolute_root(_str(d.get("storage"), "storage"))  # from here, as repo: is
    prefix = _str(d.get("prefix", "nightly"), "prefix")
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,18}[a-z0-9])?", prefix):
        raise XrunError(f"prefix: {short_repr(prefix)} must be 1-20 lowercase letters, digits or '-', "
                        "starting with a letter")
    schedule = _str(d.get("schedule", "0 3 * * *"), "schedule")
    check_schedule(schedule)
    run = _mapping(d.get("run") or {}, "run")
    _keys(run, RUN_KEYS, "run")
    cron = _mapping(d.get("cronjob") or {}, "cronjob")
    _keys(cron, CRONJOB_KEYS, "cronjob")
    backend = _str(d.get("backend"), "backend", required=False)
    if backend not in ("", "local", "kube"):
        raise XrunError(f"backend: must be local or kube, got {short_repr(backend)}")
    warmup = d.get("warmup", 3)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise XrunError(f"warmup: must be a whole number of steps >= 0, got {short_repr(warmup)}")
    alpha = d.get("alpha", 0.05)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha <= 0.5:
        raise XrunError(f"alpha: must be a number in (0, 0.5], got {short_repr(alpha)}")
    cfg = NightlyConfig(
        path=path, text=text, base=base, branches=branches, configs=configs, slice=dict(slice_),
        storage=storage, prefix=prefix, schedule=schedule,
        time_zone=_str(d.get("time_zone"), "time_zone", required=False),
        threshold_pct=parse_percent(d.get("threshold", "5%"), "threshold"), alpha=float(alpha),
        warmup=warmup, backend=backend, context=_str(d.get("context"), "context", required=False),
        namespace=_str(d.get("namespace", "default"), "namespace"), run=dict(run),
        timeout_s=parse_seconds(d.get("timeout", 6 * 3600), "timeout"), cronjob=dict(cron), repo=repo,
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
    repeat: int = 0  # 0-based repeat of this (config, branch)


def run_name(prefix: str, branch: Branch, stamp: str, index: int, limit: int) -> str:
    """'<prefix>-<branch>-<YYYYmmdd-HHMMSS>-<i>', the branch cut to fit the name limit."""
    fixed = f"{prefix}--{stamp}-{index}"
    room = max(1, limit - len(fixed))
    slug = branch.slug[:room].strip("-") or "b"
    return f"{prefix}-{slug}-{stamp}-{index}"


def plan_runs(cfg: NightlyConfig, when: _dt.datetime | None = None) -> list[PlannedRun]:
    """Every (config, repeat, branch) run in submission order, base first within each round.

    Repeats are interleaved (A B A B ..., not A A B B) so a drift of the machine during the
    night (thermal, a noisy neighbour, a cache filling) hits every branch alike."""
    stamp = (when or _dt.datetime.now(_dt.UTC)).strftime(STAMP)
    planned: list[PlannedRun] = []
    rounds = [(config, r, branch) for config in cfg.configs for r in range(config.repeats)
              for branch in cfg.branches]
    for index, (config, repeat, branch) in enumerate(rounds):
        values: dict[str, Any] = {
            **cfg.run, **cfg.slice, "image": branch.image, "command": config.command,
            "storage": cfg.storage, "branch": branch.name, "commit": branch.commit,
            "namespace": cfg.namespace, **({"workdir": branch.workdir} if branch.workdir else {}),
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
        except XrunError as e:
            raise XrunError(f"{where}: {e}") from None
        planned.append(PlannedRun(index, branch, config, values["name"], values, spec, repeat))
    return planned


