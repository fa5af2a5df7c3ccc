"""One run, read back: :class:`RunRecord` and its per-step samples (:class:`StepSeries`).

Every reader of a run (status, list, follow, compare, report, goodput) works on this one
record, whatever the source: a storage root, a log file or metrics JSONL
(``orchestrator.readers.loaders`` builds it). Per-step samples live in compact columns
that halve their resolution past a cap, so memory stays bounded however long the run was.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from xrun_contract import SUCCEEDED

# ---------------------------------------------------------------------------------------
# Per-step samples


STEP_CAP = 200_000  # samples kept per run before decimating (about 13 MB of columns)


class StepSeries:
    """Per-step samples as typed columns; keeps every ``stride``-th step past ``cap``.

    Totals (``count``, ``total_seconds``) are exact over every step seen; the columns are an
    evenly thinned sample once a run has more than ``cap`` steps, which keeps a 1 GB log's
    memory bounded while medians and tests stay representative.
    """

    COLUMNS = ("step", "seconds", "tflops", "tokens", "loss", "blocked", "time", "attempt")

    def __init__(self, cap: int = STEP_CAP):
        self.cap = cap
        self.stride = 1
        self.count = 0  # every step seen, kept or not
        self.total_seconds = 0.0
        self.step = array("q")
        self.attempt = array("l")
        self.seconds = array("d")
        self.tflops = array("d")
        self.tokens = array("d")
        self.loss = array("d")
        self.blocked = array("d")
        self.time = array("d")  # unix seconds the step was logged; nan when unknown
        # The device's idle time before the step (metrics records' ``idle_s``: the host's
        # input pipeline, a save); nan where the source does not say. Beside the columns, not
        # in rows(): the step's wall time is seconds + idle.
        self.idle = array("d")
        self.total_weights_first: int | None = None
        self.total_weights_last: int | None = None
        # What the live views ask on every tick (``figures.stall``, the phase's start),
        # folded in as rows arrive (``_scan``): a follow's tick costs the same at step 20,000
        # as at step 20, and allocates nothing per row.
        self._reset_aggregates()

    def __len__(self) -> int:
        return len(self.step)

    def append(self, step: int, seconds: float, tflops: float, tokens: float, loss: float,
               blocked: float = 0.0, time: float = math.nan, attempt: int = 0,
               total_weights: int | None = None, idle: float = math.nan) -> None:
        index = self.count
        self.count += 1
        if math.isfinite(seconds):
            self.total_seconds += seconds
        if total_weights is not None:
            if self.total_weights_first is None:
                self.total_weights_first = total_weights
            self.total_weights_last = total_weights
        if index % self.stride:
            return
        self.step.append(step)
        self.attempt.append(attempt)
        self.seconds.append(seconds)
        self.tflops.append(tflops)
        self.tokens.append(tokens)
        self.loss.append(loss)
        self.blocked.append(blocked)
        self.time.append(time)
        self.idle.append(idle)
        if len(self.step) > self.cap:
            self._halve()

    def add_many(self, n: int, seconds_total: float, total_weights_first: int,
                 total_weights_last: int,
                 row: Callable[[int], tuple[int, float, float, float, float, float, float, int]]
                 ) -> None:
        """``n`` steps at once, as ``n`` calls of :meth:`append` would add them; ``row(i)``
        (the i-th step's columns) is called only for the steps kept, so a long log's
        thinned-out steps are never converted."""
        first = self.count
        self.count += n
        self.total_seconds += seconds_total
        if self.total_weights_first is None:
            self.total_weights_first = total_weights_first
        self.total_weights_last = total_weights_last
        i = (-first) % self.stride
        while i < n:
            room = self.cap + 1 - len(self.step)  # one more than this and the series halves
            kept = range(i, n, self.stride)[:room]
            for name, column in zip(self.COLUMNS, zip(*map(row, kept), strict=True), strict=True):
                getattr(self, name).extend(column)
            self.idle.extend([math.nan] * len(kept))  # logs do not say
            if len(self.step) > self.cap:
                self._halve()
            index = first + kept[-1] + 1
            i = kept[-1] + 1 + (-index) % self.stride

    def _halve(self) -> None:
        for name in (*self.COLUMNS, "idle"):
            col = getattr(self, name)
            setattr(self, name, col[::2])
        self.stride *= 2
        self._reset_aggregates()

    def _reset_aggregates(self) -> None:
        self._scanned = 0
        self._max_time: float | None = None
        self._first_row: dict[int, int] = {}  # attempt -> its first kept row
        self._slowest: float | None = None  # rows after the first of their attempt

    def _scan(self) -> None:
        for i in range(self._scanned, len(self.step)):
            attempt, t = self.attempt[i], self.time[i]
            if math.isfinite(t) and (self._max_time is None or t > self._max_time):
                self._max_time = t
            if attempt not in self._first_row:
                self._first_row[attempt] = i
                continue
            seconds = self.seconds[i]
            if math.isfinite(seconds) and (self._slowest is None or seconds > self._slowest):
                self._slowest = seconds
        self._scanned = len(self.step)

    def last_time(self) -> float | None:
        """The newest finite time a kept step was logged at (None: none has one)."""
        self._scan()
        return self._max_time

    def slowest_after_first(self) -> float | None:
        """The slowest finite step seconds, each attempt's first kept step left out."""
        self._scan()
        return self._slowest

    def first_rows(self) -> dict[int, int]:
        """Each attempt's first kept row (attempts in the order they first appear)."""
        self._scan()
        return self._first_row

    def first_time_from(self, attempt: int) -> float | None:
        """The first finite time among the kept steps of ``attempt`` or a later one."""
        rows = [i for a, i in self.first_rows().items() if a >= attempt]
        for i in range(min(rows), len(self.step)) if rows else ():
            if self.attempt[i] >= attempt and math.isfinite(self.time[i]):
                return self.time[i]
        return None

    def rows(self) -> Iterator[tuple[int, float, float, float, float, float, float, int]]:
        return zip(self.step, self.seconds, self.tflops, self.tokens, self.loss, self.blocked,
                   self.time, self.attempt, strict=True)

    def wall(self) -> list[float]:
        """Each kept step's wall time: its seconds and the idle time before it, where known."""
        return [s + i if math.isfinite(i) else s for s, i in zip(self.seconds, self.idle, strict=True)]

    @property
    def last_step(self) -> int | None:
        return self.step[-1] if self.step else None


# ---------------------------------------------------------------------------------------
# The run record


EVENT_CAP = 100_000  # checkpoint events kept individually (totals stay exact)


@dataclass
class RunRecord:
    """Everything the comparison and the report know about one run."""

    name: str = ""
    source: str = ""  # path or URL that was read
    kind: str = ""  # storage | log | metrics
    branch: str = ""
    commit: str = ""
    image: str = ""
    # The shipped working tree (run.json "code": sha256, files, git commit/branch/dirty/diff).
    code: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    config: Any = None
    accelerator: str = ""
    process_id: int | None = None
    process_count: int | None = None
    devices: int | None = None  # global device count
    device_kind: str = ""
    backend: str = ""
    params: float | None = None  # parameter count
    params_text: str = ""  # as logged, e.g. "0.853 billion"
    params_exact: bool = False  # an exact count (metrics), not a log line's rounded billions
    flops: dict[str, float] | None = None
    memory: dict[str, Any] | None = None  # the device reading with the highest %
    steps: StepSeries = field(default_factory=StepSeries)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    checkpoint_totals: dict[str, float] = field(
        default_factory=lambda: {"blocked": 0.0, "waited": 0.0, "committed": 0.0, "saves": 0}
    )
    # (attempt, step) of saves that blocked or waited: their steps are not steady state.
    stalled_steps: set[tuple[int, int]] = field(default_factory=set)
    # (attempt, step) -> stall seconds that step's "seconds" absorbed, where the log says
    # which step that is (MaxText: the step after the save's, see readers/logparse.py).
    absorbed_stalls: dict[tuple[int, int], float] = field(default_factory=dict)
    # (attempt, step) run by the workload's quick executable (quick_compile): slower by
    # design while the optimized step compiled; not steady state.
    quick_steps: set[tuple[int, int]] = field(default_factory=set)
    # The step records say the device's idle time before each step (``idle_s``): a step's
    # seconds are the device's, and a save that held training sits in the idle time between
    # steps, never inside a step's seconds (goodput).
    idle_recorded: bool = False
    # The workload's jax.profiler trace (run.json workload.profile: path, steps, files).
    profile: dict[str, Any] | None = None
    events_dropped: int = 0  # checkpoint events past EVENT_CAP: counted in totals, not kept
    # Per-step figures beyond the step line's (metrics records: grad_norm, learning_rate):
    # name -> (steps, values), thinned like the steps past STEP_CAP (add_extra).
    # Typed columns as the steps' (a float object per value: ~70 bytes a step more).
    extra: dict[str, tuple[array[int], array[float]]] = field(default_factory=dict)
    # False: add_extra keeps nothing. A live follow (``submit --follow``, ``logs -f``) never
    # draws a chart: a third of what its record would grow by a step.
    charts: bool = True
    # (attempt, step) of steps that took a stall no line attributed (steady_mask found them).
    stall_outliers: set[tuple[int, int]] = field(default_factory=set)
    submitted_at: float | None = None
    start_time: float | None = None
    start_basis: str = ""  # what start_time is: "" (process start), "XPK Start", ...
    end_time: float | None = None
    exit_code: int | None = None
    end_reason: str = ""
    state: str = ""
    restarts: int = 0
    transitions: list[dict[str, Any]] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)
    hosts_seen: list[str] = field(default_factory=list)
    wrapper_seconds: float | None = None
    log_first_time: float | None = None  # from absl prefixes (the year is assumed)
    log_last_time: float | None = None
    log_first_step_time: float | None = None
    notes: list[str] = field(default_factory=list)
    total_steps: int | None = None  # what the run was asked to train (header / config)
    phases: list[dict[str, Any]] = field(default_factory=list)  # xrun startup milestones
    failure: dict[str, Any] | None = None  # "xrun failure:" line / end record: kind, why, code
    checkpoints_found: int | None = None  # Orbax "Found N checkpoint steps" at start
    # Raw run.json and state.json of a stored run (xrun backend, context, hosts, message).
    run_info: dict[str, Any] = field(default_factory=dict)
    state_info: dict[str, Any] = field(default_factory=dict)
    # The latest startup "phase" record (phase, activity, step, seconds, attempt, time).
    phase: dict[str, Any] | None = None
    # Stored records that exist but cannot be read (a corrupt run.json or state.json), each
    # "<file> is corrupt (<why>)": the run's state is then UNKNOWN, whatever else says.
    problems: list[str] = field(default_factory=list)

    # -- identity -------------------------------------------------------------------
    @property
    def short_commit(self) -> str:
        return short_commit(self.commit)

    @property
    def code_text(self) -> str:
        """'code 1a2b3c4d5e6f (git abc1234 on main, dirty: diff 9f8e7d6c5b4a)', '' without a workdir."""
        return code_text(self.code)

    @property
    def label(self) -> str:
        """'<branch> <short commit>', else what is known, else the run or file name."""
        git = (self.code or {}).get("git") or {}
        dirty = "-dirty" if self.commit and isinstance(git, dict) and git.get("dirty") else ""
        parts = [p for p in (self.branch, self.short_commit + dirty if self.commit else "") if p]
        if parts and not self.branch:
            parts.insert(0, self.name)
        return " ".join(parts) or self.name or self.source

    @property
    def jax(self) -> str:
        return self.versions.get("jax", "")

    @property
    def jaxlib(self) -> str:
        return self.versions.get("jaxlib", "")

    @property
    def libtpu(self) -> str:
        return self.versions.get("libtpu") or self.versions.get("libtpu_version", "")

    @property
    def finished(self) -> bool:
        """Did the run end successfully? Unknown (a log cut short) counts as not finished."""
        if self.state:
            return self.state == SUCCEEDED
        return self.exit_code == 0

    @property
    def outcome(self) -> str:
        if self.state:
            return self.state
        if self.exit_code is None:
            return "unknown (no exit code)"
        return "exit code 0" if self.exit_code == 0 else f"exit code {self.exit_code}"

    # -- derived ----------------------------------------------------------------------
    def steady_mask(self, warmup: int) -> list[bool]:
        """Which kept step samples are steady state.

        Not steady: the first ``warmup`` steps of every attempt (compilation, restore), the
        steps run by the quick executable (``quick_steps``), steps
        whose ``seconds`` absorbed a checkpoint stall (known exactly for MaxText logs and
        metrics records; from xrun's log lines, both the save's step and the next, since
        which of the two absorbed it depends on where the workload takes its timestamp),
        and unreadable values.
        """
        first_of_attempt: dict[int, int] = {}
        out: list[bool] = []
        stalled = self.stalled_steps
        absorbed = self.absorbed_stalls
        quick = self.quick_steps
        for step, seconds, _tf, _tok, _loss, blocked, _t, attempt in self.steps.rows():
            first = first_of_attempt.setdefault(attempt, step)
            # The two steps after one that absorbed a stall are out too: with async dispatch
            # the device ran the first during the stall (MaxText: 0.008 s) and the second
            # waits for both (4.7 s, two steps' work).
            ok = (step >= first + warmup and math.isfinite(seconds) and not blocked
                  and (attempt, step) not in quick
                  and (attempt, step) not in stalled and (attempt, step - 1) not in stalled
                  and (attempt, step) not in absorbed and (attempt, step - 1) not in absorbed
                  and (attempt, step - 2) not in absorbed)
            out.append(ok)
        return self._without_stall_outliers(out)

    def _without_stall_outliers(self, mask: list[bool]) -> list[bool]:
        """Also out: a step next to a checkpoint save (its step or the one before) that took
        over 3x the steady median and 1 s more, with the step after it: a stall the log's
        lines did not attribute (a line glued or cut), which no steady-state figure or its
        CI may keep."""
        # Read from the columns in place: a list of every row (a tuple and its numbers, ~120
        # bytes a step) was the summary's largest allocation at the end of a long follow.
        seconds, step_col, attempt_col = self.steps.seconds, self.steps.step, self.steps.attempt
        kept = sorted(s for s, ok in zip(seconds, mask, strict=True) if ok)
        if len(kept) < 3:
            return mask
        med = kept[len(kept) // 2]
        del kept
        limit = max(3 * med, med + 1.0)
        saves = {(c.get("attempt", 0), c["step"]) for c in self.checkpoints
                 if c["event"] in ("started", "device_wait", "blocked", "waited")}
        out = list(mask)
        n = len(out)
        for i in range(n):
            if out[i] and seconds[i] > limit:
                step, attempt = step_col[i], attempt_col[i]
                if {(attempt, step), (attempt, step - 1)} & saves:
                    out[i] = False
                    self.stall_outliers.add((attempt, step))
                    if i + 1 < n and attempt_col[i + 1] == attempt:
                        out[i + 1] = False
        return out

    def final_mask(self) -> list[bool]:
        """False for executions that a later attempt redid (the same step ran again)."""
        steps = self.steps.step
        if all(a < b for a, b in pairwise(steps)):  # no step ran twice (restarts resumed
            return [True] * len(steps)  # after their save): no map of every step to build
        last: dict[int, int] = {}
        for i, step in enumerate(self.steps.step):
            last[step] = i
        return [last[step] == i for i, step in enumerate(self.steps.step)]

    # -- building ---------------------------------------------------------------------
    def add_checkpoint(self, event: str, step: int, seconds: float | None, attempt: int,
                       time: float | None = None, absorbed_by: int | None = None,
                       **extra: Any) -> None:
        """One checkpoint event (``xrun_contract.CHECKPOINT_EVENTS``).

        "blocked" and "waited" are stalls: training was held. ``absorbed_by`` names the step
        whose ``seconds`` holds the stall when the log says so; otherwise the save's step
        and the next are both kept out of steady state. "exit_wait" (the last save
        committing before the process exits) is not a stall: no step waits for it.
        "deferred" saves are counted: they cost no training time, only checkpoint age.
        Readers add "device_wait" (MaxText's ``block_until_ready`` before a save: the
        device finishing the step, not a stall) to the contract's events.
        """
        totals = self.checkpoint_totals
        if event in ("blocked", "waited", "committed") and seconds is not None:
            totals[event] += seconds
        elif event == "exit_wait" and seconds is not None:
            totals["exit_wait"] = totals.get("exit_wait", 0.0) + seconds
        elif event in ("deferred", "restore_failed", "write_failed"):
            totals[event] = totals.get(event, 0) + 1
            if event == "deferred" and extra.get("error"):  # storage was out (not a slow save)
                totals["deferred_storage"] = totals.get("deferred_storage", 0) + 1
        if event == "started":
            totals["saves"] += 1
        if event in ("blocked", "waited"):
            if absorbed_by is None:
                self.stalled_steps.add((attempt, step))
                size = len(self.stalled_steps)
                if size > STEP_CAP and size > 2 * len(self.steps.step):
                    self._prune_absorbed()
            elif seconds:
                key = (attempt, absorbed_by)
                self.absorbed_stalls[key] = self.absorbed_stalls.get(key, 0.0) + seconds
                size = len(self.absorbed_stalls)
                if size > STEP_CAP and size > 2 * len(self.steps.step):
                    self._prune_absorbed()  # (amortised: it at least halves the dict)
        if len(self.checkpoints) < EVENT_CAP:
            ev = {"event": event, "step": step, "seconds": seconds, "attempt": attempt, "time": time}
            if absorbed_by is not None:
                ev["absorbed_by"] = absorbed_by
            ev.update({k: v for k, v in extra.items() if v is not None})
            self.checkpoints.append(ev)
        else:
            if not self.events_dropped:
                self.notes.append(f"more than {EVENT_CAP} checkpoint events: later ones only counted")
            self.events_dropped += 1

    def _prune_absorbed(self) -> None:
        """Keep the stalls of kept step samples (and of steps not logged yet): a step the
        series thinned out needs none, and a long log's memory stays bounded (the stall
        seconds stay in ``checkpoint_totals``). Both stall maps, whichever grew."""
        steps = self.steps
        kept = set(zip(steps.attempt, steps.step, strict=True))
        last = (steps.attempt[-1], steps.step[-1]) if len(steps.step) else None
        # (an absorbing step's next step is out of steady state too: steady_mask)
        self.absorbed_stalls = {k: v for k, v in self.absorbed_stalls.items()
                                if k in kept or (k[0], k[1] + 1) in kept or (k[0], k[1] + 2) in kept
                                or last is None or k >= (last[0], last[1] - 1)}
        # A stalled save's step and the next are out of steady state (steady_mask).
        self.stalled_steps = {k for k in self.stalled_steps if k in kept or (k[0], k[1] + 1) in kept
                              or last is None or k >= last}

    def add_extra(self, name: str, step: int, value: float) -> None:
        """One per-step figure for the charts (every other one dropped past STEP_CAP)."""
        if not self.charts:
            return
        steps, values = self.extra.setdefault(name, (array("q"), array("d")))
        steps.append(step)
        values.append(value)
        if len(steps) > STEP_CAP:
            self.extra[name] = (steps[::2], values[::2])

    def set_memory(self, used: float, total: float, pct: float, device: str) -> None:
        if self.memory is None or pct > self.memory["pct"]:
            self.memory = {"used_gb": used, "total_gb": total, "pct": pct, "device": device}
        m = re.search(r"process=(\d+)", device)
        if m and self.process_id is None:
            self.process_id = int(m[1])

    def set_versions(self, versions: dict[str, Any]) -> None:
        """Header keys: versions, process identity, devices, commit, config."""
        for key, value in versions.items():
            if value is None or value == "":
                continue
            self.versions[str(key)] = str(value)
        v = self.versions
        for key, attr in (("process_id", "process_id"), ("process_count", "process_count"),
                          ("global_devices", "devices")):
            if key in v:
                with contextlib.suppress(ValueError):
                    setattr(self, attr, int(v[key]))
        self.device_kind = v.get("device_kind", self.device_kind)
        self.backend = v.get("backend", self.backend)
        self.accelerator = self.accelerator or v.get("accelerator", "")
        self.image = self.image or v.get("image", "")
        self.commit = self.commit or v.get("commit", "")
        if self.config is None and v.get("config"):
            self.config = _maybe_json(v["config"])


def short_commit(commit: str) -> str:
    """A commit as given when it is already abbreviated (up to 12 hex digits, git's longest
    auto abbreviation: what the log or the run file had, a 9-digit one stays 9), a full
    hash cut to git's default 7."""
    c = (commit or "").strip()
    return c[:7] if re.fullmatch(r"[0-9a-fA-F]{13,64}", c) else c


def _maybe_json(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    with contextlib.suppress(ValueError):
        return json.loads(text)
    return text


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def format_params(count: float) -> str:
    """'0.853 billion' as MaxText logs it; small models in millions or as a plain count."""
    if count >= 1e8:
        return f"{count / 1e9:.3f} billion"
    if count >= 1e5:
        return f"{count / 1e6:.3f} million"
    return f"{count:,.0f}"


def code_text(code: dict[str, Any] | None) -> str:
    """One line for run.json's ``code`` record (status, compare notes, nightly summary)."""
    if not code or not code.get("sha256"):
        return ""
    git = code.get("git") or {}
    where = ""
    if git.get("commit"):
        where = f"git {str(git['commit'])[:7]}" + (f" on {git['branch']}" if git.get("branch") else "")
        if git.get("dirty"):
            where += f", dirty: diff {str(git.get('diff_sha256') or '')[:12]}"
    return f"code {str(code['sha256'])[:12]}" + (f" ({where})" if where else "")
