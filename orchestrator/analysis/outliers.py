"""Outlier steps: every step far outside its run's steady distribution, named with a cause.

One slow step (a host-side pause, a save's wait that MaxText prints only at the *next*
save, steps later) moves a mean and, in a short run, a median's confidence interval; its
partner step (async dispatch: the step after a stall returns at once, 0.006 s) claims a
throughput no chip has. Both are named in compare's notes and kept out of the steady state.

The rule, robust so the outliers themselves do not widen it: the centre is the median of
the steady-state steps (``RunRecord.steady_mask``) and the spread their MAD x 1.4826 (one
standard deviation for normal noise). A step is an outlier when it is more than
``K_SD`` of those from the median *and* at least ``MIN_REL`` of the median away (so the
0.1% jitter of a TPU step is never "far"), or when its TFLOP/s/device exceeds the chip's
peak (impossible: its time was counted in another step). Pure standard library.

Fast steps are judged by ratio: a step is fast when it is under half the median *and* more
than ``K_SD`` robust SDs of the log step times below the median's log, i.e. under
``m * min(1 - MIN_REL, exp(-K_SD * sd_log))``. A pause or a save's wait *adds* seconds to a
step, so the slow side measures seconds; a fast step is one whose time was counted in a
neighbour (async dispatch), a *fraction* of a step, and load noise on a shared host is
multiplicative. The additive bound ``m - margin`` named no fast step at all once 5 robust
SD exceeded the median (a 2-core host under load: robust SD half the median), not even the
0.005 s partner of a 54 s step against a 4.9 s median (tests/data/maxtext/
outliers-faults.log.gz, step 22); the mirrored ratio ``m / (1 + margin / m)`` named an
ordinary 1.36 s step of the same run. With a small spread the bound is ``m / 2`` as before.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.readers.record import RunRecord

K_SD = 5.0  # robust standard deviations from the median
MIN_REL = 0.5  # and at least half the median away (x >= 1.5 m or x <= 0.5 m)
MIN_BASE = 4  # steady steps needed to estimate the centre and spread
MAX_NAMED = 12  # steps named in one note (the rest counted)
RULE_TEXT = (f"Outlier steps: beyond their run's steady median ± max({K_SD:g} robust SD, {MIN_REL:.0%} of "
             "the median) (robust SD = 1.4826 x the median absolute deviation of the steady steps; a fast step: "
             f"under half the median and {K_SD:g} robust SD of the log step times below it), or over "
             "the chip's peak TFLOP/s/device (impossible: the step's time was counted in another); they are "
             "named with their cause and kept out of the steady state and its CI")

# Device kinds as JAX names them (``device.device_kind``) -> accelerator family of the catalogue.
_KIND_FAMILY = (("tpu v6", "v6e"), ("tpu v5 lite", "v5e"), ("tpu v5e", "v5e"), ("tpu v5p", "v5p"),
                ("tpu v5", "v5p"), ("tpu v4", "v4"), ("h100", "h100"), ("h200", "h200"), ("b200", "b200"))


@dataclass
class Outlier:
    attempt: int
    step: int
    seconds: float
    slow: bool
    cause: str  # compilation | restart | checkpoint | impossible | partner | unexplained
    why: str  # in words
    impossible: bool = False

    def text(self) -> str:
        return f"step {self.step}{_attempt(self.attempt)}: {_secs(self.seconds)} s, {self.why}"


@dataclass
class OutlierScan:
    """The outliers of one run and the steady distribution they were judged against."""

    median: float | None = None
    robust_sd: float | None = None
    peak_tflops: float | None = None
    peak_name: str = ""
    outliers: list[Outlier] = field(default_factory=list)

    @property
    def keys(self) -> set[tuple[int, int]]:
        return {(o.attempt, o.step) for o in self.outliers}

    def note(self, label: str) -> str:
        """The note that names every outlier step of ``label`` ('' when there is none)."""
        if not self.outliers:
            return ""
        named = "; ".join(o.text() for o in self.outliers[:MAX_NAMED])
        more = len(self.outliers) - MAX_NAMED
        if more > 0:
            named += f"; and {more} more"
        basis = (f"steady median {_secs(self.median)} s, robust SD {_secs(self.robust_sd)} s"
                 if self.median is not None else "too few steady steps for a spread: over the peak only")
        peak = f", peak {self.peak_tflops:g} TFLOP/s/device ({self.peak_name})" if self.peak_tflops else ""
        count = "1 outlier step" if len(self.outliers) == 1 else f"{len(self.outliers)} outlier steps"
        return f"{label}: {count} ({basis}{peak}): {named}"


def _attempt(attempt: int) -> str:
    return f" (attempt {attempt})" if attempt else ""


def _secs(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    if x == 0:
        return "0"
    return f"{x:.3f}" if abs(x) >= 0.01 else f"{x:.2g}"


def peak_tflops(rec: RunRecord) -> tuple[float | None, str]:
    """The chip's bf16 peak TFLOP/s per device, and where it comes from; (None, '') unknown
    (CPU, or a log that names no accelerator)."""
    env = ((rec.spec or {}).get("env") or {}) if isinstance(rec.spec, dict) else {}
    from xrun_contract import Env

    raw = env.get(Env.PEAK_TFLOPS_PER_DEVICE)
    try:
        if raw and float(raw) > 0:
            return float(raw), rec.accelerator or "run file"
    except (TypeError, ValueError):
        pass
    from manifests import catalogue

    family = ""
    if rec.accelerator:
        try:
            shape = catalogue.lookup(rec.accelerator)
        except Exception:  # noqa: BLE001 - an unknown name: no peak, not an error here
            shape = None
        if shape is not None and shape.peak_bf16_tflops > 0:
            return shape.peak_bf16_tflops, rec.accelerator
    kind = (rec.device_kind or "").lower()
    for text, fam in _KIND_FAMILY:
        if text in kind:
            family = fam
            break
    if family:
        for shape in catalogue.shapes().values():
            if shape.family == family and shape.peak_bf16_tflops > 0:
                return shape.peak_bf16_tflops, rec.device_kind
    return None, ""


def scan(rec: RunRecord, steady: list[bool], warmup: int, peak: float | None = None,
         peak_name: str = "") -> OutlierScan:
    """Every outlier execution of ``rec`` (see the module), given its steady mask."""
    steps = rec.steps
    if peak is None:
        peak, peak_name = peak_tflops(rec)
    out = OutlierScan(peak_tflops=peak, peak_name=peak_name)
    base = [s for s, ok in zip(steps.seconds, steady, strict=True) if ok and math.isfinite(s)]
    if len(base) >= MIN_BASE:
        m = statistics.median(base)
        sd = 1.4826 * statistics.median(abs(x - m) for x in base)
        out.median, out.robust_sd = m, sd
        margin = max(K_SD * sd, MIN_REL * m)
        logs = [math.log(x) for x in base if x > 0]
        if len(logs) >= MIN_BASE:  # fast: by ratio, with the spread of log step times (module)
            mid = statistics.median(logs)
            sd_log = 1.4826 * statistics.median(abs(x - mid) for x in logs)
            fast_below = m * min(1 - MIN_REL, math.exp(-K_SD * sd_log))
        else:
            fast_below = m - margin
    else:
        m, margin, fast_below = math.nan, math.inf, -math.inf
    rows = list(zip(steps.step, steps.seconds, steps.tflops, steps.attempt, strict=True))
    firsts: dict[int, int] = {}
    for st, _s, _t, a in rows:
        firsts.setdefault(a, st)
    causes = step_causes(rec)
    waits = sorted((c["step"], c.get("attempt", 0), float(c["seconds"])) for c in rec.checkpoints
                   if c["event"] == "waited" and c["seconds"] is not None and c["seconds"] >= 0.5)
    saves = {(c.get("attempt", 0), c["step"]) for c in rec.checkpoints
             if c["event"] in ("started", "device_wait", "blocked", "waited")}
    # A wait whose absorbing step shows it (slow) is that step's; only the others are free
    # to explain a slow step elsewhere.
    seconds_of = {(a, st): s for st, s, _t, a in rows}
    used_waits = {(c.get("attempt", 0), c["step"]) for c in rec.checkpoints
                  if c["event"] == "waited" and c.get("absorbed_by") is not None
                  and seconds_of.get((c.get("attempt", 0), c["absorbed_by"]), 0.0) > m + margin}
    prev: Outlier | None = None
    prev_key: tuple[int, int] | None = None
    for st, s, tf, a in rows:
        if not math.isfinite(s):
            prev, prev_key = None, None
            continue
        over_peak = peak is not None and math.isfinite(tf) and tf > peak
        slow = s > m + margin
        fast = s < fast_below
        if not (slow or fast or over_peak):
            prev, prev_key = None, (a, st)
            continue
        after_fast = prev is not None and not prev.slow and prev_key == (a, st - 1)
        if slow and after_fast and st >= firsts[a] + warmup and s <= 2.5 * m:
            cause, why = "partner", (f"two steps' work after the fast step {st - 1} (async dispatch: "
                                     "it waited for both)")
        elif slow:
            cause, why = _slow_cause(rec, st, s, a, m, firsts[a], warmup, causes, waits, used_waits, saves)
        else:
            partner = prev is not None and prev.slow and prev_key == (a, st - 1)
            if partner and prev is not None:
                cause, why = "partner", (f"the step after step {prev.step}'s {_secs(prev.seconds)} s: "
                                         "its time was counted there (async dispatch)")
            elif (a, st - 2) in saves and st - 1 >= firsts[a] + warmup:
                # MaxText's save at step k blocks until step k is done (absorbed by step k+1's
                # time), so step k+2's result is ready when its line asks: ~0 s. Seen after
                # every save of tests/data/maxtext/outliers-*.log.gz.
                cause, why = "partner", (f"the step after step {st - 1}, which absorbed the save of step "
                                         f"{st - 2}: its time was counted there (async dispatch)")
            elif st < firsts[a] + warmup:
                cause, why = ("compilation" if a == 0 else "restart"), _first_steps(a)
            else:
                cause, why = "unexplained", "unexplained: no log line names a cause"
            if over_peak:
                why = f"impossible: {_tflops(tf)} TFLOP/s/device over the peak {peak:g}; " + why
        o = Outlier(a, st, s, slow, "impossible" if over_peak and not slow else cause, why, over_peak)
        out.outliers.append(o)
        prev, prev_key = o, (a, st)
    return out


def _tflops(x: float) -> str:
    from xrun_contract import significant

    return f"{x:,.0f}" if x >= 100 else significant(x, 3)


def _first_steps(attempt: int) -> str:
    return ("the run's first steps: compilation" if attempt == 0
            else f"restart: the first steps of attempt {attempt}, restore and compilation")


def _slow_cause(rec: RunRecord, st: int, s: float, a: int, m: float, first: int, warmup: int,
                causes: dict[tuple[int, int], str], waits: list[tuple[int, int, float]],
                used: set[tuple[int, int]], saves: set[tuple[int, int]]) -> tuple[str, str]:
    if st < first + warmup:
        return ("compilation" if a == 0 else "restart"), _first_steps(a)
    if (a, st) in causes:
        return "checkpoint", causes[(a, st)]
    excess = s - m
    # MaxText prints "Waiting for previous save to complete took N seconds" at the save after
    # the one that was slow, often steps after the step whose time it took: an unused wait
    # of about this step's excess at one of the next two saves (from the step before on).
    upcoming = sorted({k[1] for k in saves if k[0] == a and k[1] >= st - 1})[:2]
    for wstep, wa, w in waits:
        if wa == a and wstep in upcoming and (wa, wstep) not in used and 0.5 * excess <= w <= 1.5 * excess + 1.0:
            used.add((wa, wstep))
            return "checkpoint", (f"a checkpoint save's wait: \"Waiting for previous save to complete took "
                                  f"{w:.1f} seconds\", printed at the save of step {wstep}")
    near = sorted(k[1] for k in saves if k[0] == a and k[1] in (st - 1, st))
    if near:
        return "checkpoint", f"next to the save of step {near[0]} (no wait line names it)"
    return "unexplained", "unexplained: no log line names a cause (a host-side pause?)"


def step_causes(rec: RunRecord) -> dict[tuple[int, int], str]:
    """(attempt, step) -> why that step took long, as far as the records say."""
    from orchestrator.analysis.goodput import _stall_per_execution

    out: dict[tuple[int, int], str] = {}
    steps = rec.steps
    stalls = _stall_per_execution(rec, None)
    waited = {(c.get("attempt", 0), c["step"]) for c in rec.checkpoints if c["event"] == "waited"}
    for step, attempt, stall in zip(steps.step, steps.attempt, stalls, strict=True):
        key = (attempt, step)
        if stall > 0 or key in rec.absorbed_stalls or (attempt, step - 1) in rec.stalled_steps \
                or key in rec.stalled_steps:
            what = ("waiting for the previous checkpoint save" if (attempt, step - 1) in waited
                    or key in waited else "waiting on a checkpoint save")
            out[key] = f"{what} ({stall:.1f} s of it)" if stall > 0 else what
        elif key in rec.stall_outliers:
            out[key] = "next to a checkpoint save (a stall no log line named)"
    firsts: dict[int, int] = {}
    for step, attempt in zip(steps.step, steps.attempt, strict=True):
        firsts.setdefault(attempt, step)
    for attempt, step in firsts.items():
        if attempt:
            out.setdefault((attempt, step), f"the first step of restart attempt {attempt} (compile)")
    return out


def avg_share(seconds: list[float], outliers: list[Outlier]) -> str:
    """'one step of 23 s is 40% of it' when the slow outliers among ``seconds`` (the steps a
    mean averages) make at least 10% of their sum; '' otherwise."""
    total = math.fsum(seconds)
    slow = sorted((o.seconds for o in outliers if o.slow), reverse=True)
    if total <= 0 or not slow:
        return ""
    share = math.fsum(slow) / total
    if share < 0.10:
        return ""
    if len(slow) == 1:
        return f"one step of {_short(slow[0])} s is {share:.0%} of it"
    lo, hi = _short(slow[-1]), _short(slow[0])
    return f"{len(slow)} steps of {lo if lo == hi else f'{lo}-{hi}'} s are {share:.0%} of it"


def _short(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.2g}" if x < 1 else f"{x:.1f}"

