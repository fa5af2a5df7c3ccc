"""One run's figures for a comparison: the steady-state samples and the one-value figures.

Steady state is each attempt's steps after ``warmup``, without the steps whose time absorbed
a checkpoint stall and without outlier steps (:mod:`orchestrator.analysis.outliers`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from orchestrator.analysis.goodput import DEFAULT_WARMUP, goodput
from orchestrator.analysis.outliers import OutlierScan, avg_share, scan
from orchestrator.analysis.rows import Row
from orchestrator.readers.record import RunRecord


@dataclass
class RunFigures:
    """What the table shows for one run, with the samples behind each figure."""

    label: str
    steady_seconds: list[float]
    steady_tflops: list[float]
    steady_tokens: list[float]
    all_seconds: list[float]
    avg_seconds: list[float]  # every step after the first: what "Avg s/step" averages
    last_tflops: float | None  # the last step line's TFLOP/s/device
    last_tokens: float | None  # the last step line's Tokens/s/device
    loss_tail: list[float]
    final_loss: float | None
    final_step: int | None
    steps_executed: int
    steps_distinct: int  # steps trained, each counted once however often a restart redid it
    total_step_seconds: float  # exact, over every step (samples may be thinned)
    stall_events: list[float]
    stall_total: float
    stall_in_steps: float  # the part of stall_total inside step times (a last save's is not)
    stall_saves: int
    time_to_first_step: float | None
    ttfs_basis: str
    goodput: dict[str, Any]
    warmup: int
    stride: int
    # Diverged: the first step (of the executions that count) whose loss is NaN or Inf, and
    # that value as logged ("nan", "inf"); None when every loss is finite.
    diverged_step: int | None = None
    diverged_value: str = ""
    # Steps far outside the steady distribution (analysis/outliers.py): out of steady state.
    outliers: OutlierScan = field(default_factory=OutlierScan)

    @property
    def steady_median(self) -> float | None:
        return statistics.median(self.steady_seconds) if self.steady_seconds else None

    @property
    def step_share_of_stalls(self) -> float:
        """The share of all step time that checkpoint stalls took (only stalls that some
        step's time absorbed: a last save's wait is after every step)."""
        total = self.total_step_seconds
        return self.stall_in_steps / total if total > 0 else 0.0


def figures(rec: RunRecord, warmup: int = DEFAULT_WARMUP, peak: float | None = None) -> RunFigures:
    """One run's figures; ``peak`` (TFLOP/s per device) overrides the chip's catalogue peak
    for the impossible-step check."""
    steps = rec.steps
    steady = rec.steady_mask(warmup)
    found = scan(rec, steady, warmup, peak, "--peak-tflops" if peak else "")
    out_keys = found.keys
    steady = [ok and (a, st) not in out_keys for ok, a, st in zip(steady, steps.attempt, steps.step, strict=True)]
    final = rec.final_mask()
    # A step's wall time: the device's seconds and the device's idle time before it where the
    # records say it (an input pipeline that starves the device is slower training, though no
    # step's device time moved); the rates are scaled to it, as a user's throughput is.
    wall = steps.wall()
    ss, tf, tok = [], [], []
    for (_step, seconds, tflops, tokens, _loss, _b, _t, _a), w, ok in zip(steps.rows(), wall, steady, strict=True):
        if ok:
            share = seconds / w if w > 0 else 1.0
            ss.append(w)
            if math.isfinite(tflops):
                tf.append(tflops * share)
            if math.isfinite(tokens):
                tok.append(tokens * share)
    losses = [(st, loss) for st, loss, is_final in zip(steps.step, steps.loss, final, strict=True)
              if is_final and math.isfinite(loss)]
    losses.sort()
    not_finite = min(((st, loss) for st, loss, is_final in zip(steps.step, steps.loss, final, strict=True)
                      if is_final and not math.isfinite(loss)), default=None)
    k = max(5, min(50, len(losses) // 10))
    # One stall per save: its wait for the previous save plus its blocking part.
    per_save: dict[tuple[int, int], float] = {}
    for c in rec.checkpoints:
        if c["event"] in ("blocked", "waited") and c["seconds"] is not None:
            key = (c["attempt"], c["step"])
            per_save[key] = per_save.get(key, 0.0) + c["seconds"]
    events = list(per_save.values())
    stall_total = rec.checkpoint_totals["blocked"] + rec.checkpoint_totals["waited"]
    if not events:  # only per-step blocked times (JSONL without checkpoint records)
        events = [b for b in steps.blocked if b > 0]
        stall_total = stall_total or sum(events) * steps.stride
    all_seconds = [s for s in steps.seconds if math.isfinite(s)]
    last_i = len(steps) - 1
    ran = set(zip(steps.attempt, steps.step, strict=True))
    outside = sum(v for k, v in rec.absorbed_stalls.items() if k not in ran)  # no step absorbed it
    ttfs, basis = _time_to_first_step(rec)
    return RunFigures(
        label=rec.label, steady_seconds=ss, steady_tflops=tf, steady_tokens=tok,
        all_seconds=all_seconds,
        avg_seconds=[s for s in wall[1:] if math.isfinite(s)],
        last_tflops=(_finite(steps.tflops[last_i]) or None) if last_i >= 0 else None,  # 0: not measured
        last_tokens=_finite(steps.tokens[last_i]) if last_i >= 0 else None,
        loss_tail=[loss for _, loss in losses[-k:]],
        final_loss=losses[-1][1] if losses else None,
        final_step=max(steps.step) if len(steps) else None,  # a diverged run's last step too
        steps_executed=steps.count, steps_distinct=sum(final) * steps.stride,
        total_step_seconds=steps.total_seconds, stall_events=events, stall_total=stall_total,
        stall_in_steps=max(0.0, stall_total - outside),
        stall_saves=int(rec.checkpoint_totals["saves"]), time_to_first_step=ttfs,
        ttfs_basis=basis, goodput=goodput(rec, warmup=warmup), warmup=warmup, stride=steps.stride,
        diverged_step=not_finite[0] if not_finite else None,
        diverged_value=str(not_finite[1]) if not_finite else "", outliers=found,
    )


def _avg_decided(fig: RunFigures, rec: RunRecord) -> str:
    """'one step of 23 s is 40% of it': the outlier steps that decide a run's Avg s/step."""
    steps = rec.steps
    first = (steps.attempt[0], steps.step[0]) if len(steps) else None
    return avg_share(fig.avg_seconds, [o for o in fig.outliers.outliers if (o.attempt, o.step) != first])


def diverged_text(fig: RunFigures) -> str:
    """'its loss stopped being finite at step 37 (nan)'."""
    return f"its loss stopped being finite at step {fig.diverged_step} ({fig.diverged_value})"


def mark_diverged(row: Row, fig: RunFigures) -> None:
    """The Final loss row of a candidate that diverged: a regression, whatever the test of
    its last finite losses said (they are what is left before the NaN)."""
    row.cand = f"{fig.diverged_value} from step {fig.diverged_step}"
    row.cand_value = None
    row.delta = row.delta_pct = row.p_value = None
    row.verdict, row.gating, row.beyond_threshold = "regressed", True, True
    row.diverged_step = fig.diverged_step
    row.diff = f"**diverged**: loss not finite from step {fig.diverged_step} ({fig.diverged_value})"


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _time_to_first_step(rec: RunRecord) -> tuple[float | None, str]:
    """Submit (or process or XPK start, or first log line) to the first step's line."""
    t = rec.steps.time[0] if len(rec.steps) else math.nan
    if not math.isfinite(t):
        return None, ""
    start = f"from {rec.start_basis}" if rec.start_basis else "from process start"
    for origin, basis in ((rec.submitted_at, "from submit"), (rec.start_time, start),
                          (rec.log_first_time, "from the first log line")):
        if origin is not None and t >= origin:
            return t - origin, basis
    return None, ""


def _restored_step(rec: RunRecord) -> int | None:
    """The step the run's first attempt restored (a resumed run), if it did."""
    for ev in rec.checkpoints:
        if ev["event"] == "restored":
            return ev["step"]
    return None
