"""Compare two runs honestly: per-step samples, a significance test, and the confounders.

A diff is marked *improved* or *regressed* only when a two-sided Mann-Whitney U test on the
per-step samples rejects "same distribution" at ``alpha`` (benchstat's method: medians as
the summary, a rank test as the judge); otherwise it is *within noise*. One-value figures
(the last step's TFLOP/s and Tok/s, time to first step, memory, goodput) have no noise
estimate and are never marked by sign. ``exit_code`` is 1 only for a significant regression
beyond the threshold on a gating row (steady-state step time, loss, checkpoint stalls) or
a candidate that failed where the base did not. Everything that makes a comparison unfair is said above
the table, including a familiar row that points the other way than the steady-state row.

Pure standard library: the CLI is installed without numpy.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.analysis.goodput import DEFAULT_WARMUP, format_goodput, goodput
from orchestrator.analysis.outliers import RULE_TEXT as OUTLIER_RULE
from orchestrator.analysis.outliers import OutlierScan, avg_share, scan
from orchestrator.analysis.stats import iqr, mann_whitney_u, mean_diff_test, median_ci
from orchestrator.readers.record import RunRecord, format_params
from xrun_contract.errors import EXIT_FAILED, EXIT_NOT_COMPARABLE, EXIT_OK

DEFAULT_THRESHOLD_PCT = 5.0
DEFAULT_ALPHA = 0.05
MIN_SAMPLES = 4  # with 3 vs 3 the smallest two-sided p is 0.1: nothing could be significant
STALL_SHARE_WARN = 0.10  # stalls above this share of all step time make "Avg s/step" misleading
LAST_STEP_NOTE = ("the last step's {what}, as its step line says (MaxText's reports show this "
                  "one value): no noise estimate; the steady-state row is the tested figure")
AVG_NOTE = ("mean of every step after the first (checkpoint stalls and restarts included, "
            "compilation of the first step not); marked by a test of means, never sets the exit code")
# The familiar rows and the honest row that measures the same thing (lower s/step is
# higher throughput): a warning when they point different ways.
HONEST_ROW = "Steady-state s/step (median)"
FAMILIAR_ROWS = ("TFLOP/s", "Tok/s", "Avg s/step")


# ---------------------------------------------------------------------------------------
# One run's figures


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
    ss, tf, tok = [], [], []
    for (_step, seconds, tflops, tokens, _loss, _b, _t, _a), ok in zip(steps.rows(), steady, strict=True):
        if ok:
            ss.append(seconds)
            if math.isfinite(tflops):
                tf.append(tflops)
            if math.isfinite(tokens):
                tok.append(tokens)
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
        avg_seconds=[s for s in steps.seconds[1:] if math.isfinite(s)],
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


# ---------------------------------------------------------------------------------------
# Rows


@dataclass
class Row:
    metric: str
    base: str  # formatted cells
    cand: str
    diff: str
    base_value: Any = None
    cand_value: Any = None
    delta: float | None = None
    delta_pct: float | None = None
    verdict: str = ""  # improved | regressed | within noise | identical | same | differs | not tested | missing
    p_value: float | None = None
    n_base: int | None = None
    n_cand: int | None = None
    better: str | None = None  # lower | higher
    gating: bool = False  # may set the exit code
    beyond_threshold: bool = False
    note: str = ""  # what the figure is, said under the table
    diverged_step: int | None = None  # the candidate's loss went NaN/Inf at this step
    decided_by: str = ""  # the few steps that decide this row's difference, in words
    delta_text: str = ""  # the difference as the terminal's DELTA column shows it, when not a %


def _fmt(v: float | None, decimals: int, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if v != 0 and abs(v) < 10 ** -(decimals - 1):  # tiny figures (CPU step times) keep 4 digits
        return f"{v:.4g}{unit}"
    return f"{v:.{decimals}f}{unit}"


def _signed(v: float, decimals: int) -> str:
    if v == 0:
        return "0"
    s = _fmt(abs(v), decimals)
    return ("+" if v > 0 else "-") + s


def _p(p: float) -> str:
    return "p<0.001" if p < 0.001 else f"p={p:.3f}"


class Comparator:
    """Builds the rows of one base-vs-candidate comparison."""

    def __init__(self, threshold_pct: float, alpha: float):
        self.threshold_pct = threshold_pct
        self.alpha = alpha

    def sampled(self, metric: str, base_vals: list[float], cand_vals: list[float], center: str,
                better: str, decimals: int, gating: bool = True, unit: str = "",
                shown: tuple[float | None, float | None] | None = None, what: str = "steps") -> Row:
        """A figure backed by per-step samples: value, difference, and the test's verdict.

        ``center`` "median" is judged by the Mann-Whitney U test, "mean" by a test of the
        difference of means, so the verdict always speaks about the figure shown.
        """
        nb, nc = len(base_vals), len(cand_vals)
        fb = _center(base_vals, center) if shown is None else shown[0]
        fc = _center(cand_vals, center) if shown is None else shown[1]
        row = Row(metric, _fmt(fb, decimals, unit), _fmt(fc, decimals, unit), "",
                  base_value=fb, cand_value=fc, n_base=nb, n_cand=nc, better=better, gating=gating)
        if fb is None or fc is None:
            row.verdict = "missing"
            row.diff = f"n/a (no samples: {nb}/{nc} {what})"
            return row
        row.delta = fc - fb
        row.delta_pct = 100 * row.delta / abs(fb) if fb else None
        pct = f" ({row.delta_pct:+.1f}%)" if row.delta_pct is not None and row.delta else ""
        counts = f"n={nb}/{nc} {what}"
        change = f"{_signed(row.delta, decimals)}{pct}"
        if base_vals == cand_vals:
            row.verdict = "identical"
            row.diff = f"0 (identical; {counts})"
            return row
        if nb < MIN_SAMPLES or nc < MIN_SAMPLES:
            row.verdict = "not tested"
            row.diff = f"{change} not tested: too few samples ({counts})"
            return row
        if center == "mean":
            _d, p = mean_diff_test(base_vals, cand_vals)
            cand_larger = _d > 0
        else:
            u1, p = mann_whitney_u(base_vals, cand_vals)
            cand_larger = u1 < nb * nc / 2  # U of base small: candidate values rank higher
        row.p_value = p
        if p >= self.alpha:
            row.verdict = "within noise"
            row.diff = f"{change} within noise ({_p(p)}, {counts})"
            return row
        if row.delta == 0 or (row.delta > 0) != cand_larger:
            # The samples shifted one way while the shown figure moved the other (or not).
            row.verdict = "not tested"
            row.diff = f"{change} direction unclear: the samples shifted the other way ({_p(p)}, {counts})"
            return row
        worse = cand_larger if better == "lower" else not cand_larger
        row.verdict = "regressed" if worse else "improved"
        beyond = row.delta_pct is not None and abs(row.delta_pct) >= self.threshold_pct
        row.beyond_threshold = worse and beyond
        mark = f"**{row.verdict}**" if row.beyond_threshold else row.verdict
        if worse and not beyond:
            mark += f", under the {self.threshold_pct:g}% threshold"
        row.diff = f"{change} {mark} ({_p(p)}, {counts})"
        return row

    @staticmethod
    def single(metric: str, fb: float | None, fc: float | None, decimals: int, unit: str = "",
               why: str = "one value per run: no noise estimate") -> Row:
        """A figure with one value per run: shown with its difference, never marked by sign."""
        row = Row(metric, _fmt(fb, decimals, unit), _fmt(fc, decimals, unit), "",
                  base_value=fb, cand_value=fc, n_base=1 if fb is not None else 0,
                  n_cand=1 if fc is not None else 0)
        if fb is None or fc is None:
            row.verdict, row.diff = "missing", "n/a"
            return row
        row.delta = fc - fb
        row.delta_pct = 100 * row.delta / abs(fb) if fb else None
        if row.delta == 0:
            row.verdict, row.diff = "same", "0"
            return row
        pct = f" ({row.delta_pct:+.1f}%)" if row.delta_pct is not None else ""
        row.verdict = "not tested"
        row.diff = f"{_signed(row.delta, decimals)}{pct} not tested: {why}"
        return row

    @staticmethod
    def text(metric: str, vb: str, vc: str) -> Row:
        same = vb == vc
        return Row(metric, vb or "unknown", vc or "unknown", "—" if same else "**differs** (see warnings)",
                   base_value=vb, cand_value=vc, verdict="same" if same else "differs")


def _center(values: list[float], center: str) -> float | None:
    if not values:
        return None
    return statistics.median(values) if center == "median" else statistics.fmean(values)


# ---------------------------------------------------------------------------------------
# The comparison


@dataclass
class Comparison:
    base: RunRecord
    cand: RunRecord
    base_label: str
    cand_label: str
    base_fig: RunFigures
    cand_fig: RunFigures
    rows: list[Row]
    warnings: list[str]
    notes: list[str]
    threshold_pct: float
    alpha: float
    warmup: int
    candidate_failed: bool = False
    # What differs in the two runs' shapes (accelerator, devices, hosts): no verdict on speed.
    not_comparable: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Row]:
        if self.not_comparable:  # only a diverged loss is a regression whatever the shape
            return [r for r in self.rows if r.diverged_step is not None]
        return [r for r in self.rows if r.gating and r.beyond_threshold]

    @property
    def regressed(self) -> bool:
        return bool(self.regressions) or self.candidate_failed

    @property
    def exit_code(self) -> int:
        if self.regressed:
            return EXIT_FAILED
        return EXIT_NOT_COMPARABLE if self.not_comparable else EXIT_OK

    @property
    def verdict(self) -> tuple[str, str]:
        """(kind, line): the one verdict every output shows (terminal, markdown, JSON, HTML).
        kind is failed | regressed | not comparable | ok."""
        return verdict_of(self)

    # -- output -------------------------------------------------------------------------
    def markdown(self) -> str:
        """Verdict first, as on the terminal, and again as the last line (what `tail -n 1`
        in CI reads)."""
        line = self.verdict[1]
        lines = [f"**Verdict:** {line}", ""]
        lines += [f"**Warning:** {w}\n" for w in self.warnings]
        lines.append(table_markdown(self))
        lines.append("")
        lines.append("Notes:")
        lines += [f"- {n}" for n in self.notes]
        lines += ["", f"Verdict: {line}"]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        def run(rec: RunRecord, fig: RunFigures, label: str) -> dict[str, Any]:
            return {
                "label": label, "name": rec.name, "source": rec.source, "kind": rec.kind,
                "branch": rec.branch, "commit": rec.commit, "image": rec.image, "code": rec.code,
                "state": rec.state, "exit_code": rec.exit_code, "finished": rec.finished,
                "restarts": rec.restarts, "versions": rec.versions, "accelerator": rec.accelerator,
                "devices": rec.devices, "process_id": rec.process_id,
                "steps_executed": fig.steps_executed, "steps_distinct": fig.steps_distinct,
                "final_step": fig.final_step,
                "steady_steps": len(fig.steady_seconds), "steady_median_s": fig.steady_median,
                "steady_median_ci95_s": median_ci(fig.steady_seconds),
                "time_to_first_step_s": fig.time_to_first_step, "goodput": fig.goodput,
                "checkpoint": {**rec.checkpoint_totals, "stall_total_s": fig.stall_total,
                               "stall_in_steps_s": fig.stall_in_steps,
                               "restored_step": _restored_step(rec),
                               "found_at_start": rec.checkpoints_found},
                "failure": rec.failure,
                "outliers": [asdict(o) for o in fig.outliers.outliers],
                "notes": rec.notes,
            }

        return {
            "base": run(self.base, self.base_fig, self.base_label),
            "candidate": run(self.cand, self.cand_fig, self.cand_label),
            "warnings": self.warnings,
            "rows": [asdict(r) for r in self.rows],
            "notes": self.notes,
            "threshold_pct": self.threshold_pct,
            "alpha": self.alpha,
            "warmup_steps": self.warmup,
            "candidate_failed": self.candidate_failed,
            "not_comparable": self.not_comparable,
            "verdict": self.verdict[1],
            "regressions": [r.metric for r in self.regressions],
            "regressed": self.regressed,
            "exit_code": self.exit_code,
        }

    def json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=_json_default) + "\n"


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, set | tuple):
        return list(o)
    return str(o)


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def delta_text(r: Row) -> str:
    """A row's difference in a few characters (the terminal's DELTA column, the verdict)."""
    if r.delta_text:
        return r.delta_text
    if r.delta_pct is not None:
        return f"{r.delta_pct:+.1f}%"
    if r.verdict in ("identical", "same") or r.diff in ("—", "0", ""):
        return "~"
    return r.diff.replace("**", "") if len(r.diff) <= 24 else ""


def verdict_of(c: Comparison) -> tuple[str, str]:
    """See :attr:`Comparison.verdict`."""
    if c.candidate_failed:
        return "failed", f"FAILED: the candidate {c.cand_label} did not finish"
    if c.regressions:
        worst = ", ".join(f"{r.metric} {delta_text(r)}" for r in c.regressions)
        return "regressed", f"REGRESSED beyond {c.threshold_pct:g}%: {worst}"
    if c.not_comparable:
        return "not comparable", ("NOT COMPARABLE: different shapes (" + "; ".join(c.not_comparable)
                                  + "): figures shown, no verdict on speed")
    improved = [r for r in c.rows if r.verdict == "improved"]
    regressed = [r for r in c.rows if r.verdict == "regressed"]
    bits = [f"{len(improved)} improved" if improved else "",
            f"{len(regressed)} regressed under {c.threshold_pct:g}%" if regressed else ""]
    tail = "; ".join(b for b in bits if b)
    return "ok", f"OK: no significant regression beyond {c.threshold_pct:g}%" + (f" ({tail})" if tail else "")


def shape_differences(base: RunRecord, cand: RunRecord) -> list[str]:
    """What differs in the two runs' shapes ('accelerator cpu-1 vs cpu-2'): step times of
    different shapes are not a regression or an improvement of the code."""
    out = []
    for what, vb, vc in (("accelerator", base.accelerator, cand.accelerator),
                         ("device kind", base.device_kind, cand.device_kind),
                         ("devices", base.devices, cand.devices),
                         ("hosts", base.process_count, cand.process_count)):
        if vb and vc and vb != vc:
            out.append(f"{what} {vb} vs {vc}")
    return out


def table_markdown(c: Comparison) -> str:
    """The table: header row exactly '| Metric | <base> | <cand> | Diff (<cand> − <base>) |'."""
    b, k = _md_cell(c.base_label), _md_cell(c.cand_label)
    out = [f"| Metric | {b} | {k} | Diff ({k} − {b}) |", "|---|---|---|---|"]
    for r in c.rows:
        out.append(f"| {_md_cell(r.metric)} | {_md_cell(r.base)} | {_md_cell(r.cand)} | {_md_cell(r.diff)} |")
    return "\n".join(out)


def _labels(base: RunRecord, cand: RunRecord) -> tuple[str, str]:
    lb, lc = base.label, cand.label
    if lb == lc:
        nb, nc = base.name or "base", cand.name or "candidate"
        if nb == nc:
            nb, nc = "base", "candidate"
        lb, lc = f"{lb} ({nb})", f"{lc} ({nc})"
    return lb, lc


def compare(base: RunRecord, cand: RunRecord, threshold_pct: float = DEFAULT_THRESHOLD_PCT,
            alpha: float = DEFAULT_ALPHA, warmup: int = DEFAULT_WARMUP,
            peak_tflops: float | None = None) -> Comparison:
    """The table, warnings and notes of CANDIDATE against BASE."""
    fb, fc = figures(base, warmup, peak_tflops), figures(cand, warmup, peak_tflops)
    lb, lc = _labels(base, cand)
    cmp = Comparator(threshold_pct, alpha)
    # The familiar rows mean what they mean in the reports people already have (MaxText's
    # step line, its last value; the mean step time), then the rows that decide a verdict.
    tflops = Comparator.single("TFLOP/s", fb.last_tflops, fc.last_tflops, 3,
                               why="one step's value")
    tflops.better, tflops.note = "higher", LAST_STEP_NOTE.format(what="TFLOP/s/device")
    tokens = Comparator.single("Tok/s", fb.last_tokens, fc.last_tokens, 1, why="one step's value")
    tokens.better, tokens.note = "higher", LAST_STEP_NOTE.format(what="Tokens/s/device")
    # Marked by a test of means, but it does not set the exit code: a mean moves with
    # stalls, restarts and machine load; the steady-state row decides.
    avg = cmp.sampled("Avg s/step", fb.avg_seconds, fc.avg_seconds, "mean", "lower", 3,
                      what="steps after the first", gating=False)
    avg.note = AVG_NOTE
    for fig, rec, side in ((fb, base, "base"), (fc, cand, "cand")):
        said = _avg_decided(fig, rec)
        if said:
            setattr(avg, side, f"{getattr(avg, side)} ({said})")
    steady = cmp.sampled("Steady-state s/step (median)", fb.steady_seconds, fc.steady_seconds,
                         "median", "lower", 3)
    steady.note = (f"median of steady-state steps: after the first {warmup} of each attempt, "
                   "without the steps whose time absorbed a checkpoint stall and without outlier steps")
    rows = [
        cmp.text("Parameters", *_params_cells(base, cand)),
        cmp.sampled("Final loss", fb.loss_tail, fc.loss_tail, "median", "lower", 4,
                    shown=(fb.final_loss, fc.final_loss), what="last steps"),
        tflops,
        tokens,
        avg,
        Comparator.single("Memory %", _mem(base), _mem(cand), 2,
                          why="one reading per run"),
        cmp.text("JAX", base.jax, cand.jax),
        steady,
        _spread_row(cmp, fb, fc),
        _stall_row(cmp, fb, fc),
        Comparator.single("Time to first step", fb.time_to_first_step, fc.time_to_first_step, 1, " s"),
        Comparator.single("Goodput %", fb.goodput["goodput_pct"] if fb.steps_executed else None,
                          fc.goodput["goodput_pct"] if fc.steps_executed else None, 1,
                          why="one value per run"),
    ]
    in_points(rows)
    slower_goodput(rows)
    # A loss that changed only within noise is still not identical numerics: say so.
    warnings = confounders(base, cand, fb, fc, lb, lc)
    warnings += disagreements(rows, fb, fc, lc, threshold_pct)
    decider = avg_decider(base, cand, lb, lc, figs=(fb, fc))
    if decider:
        avg.decided_by = decider
        warnings.insert(0, decider)
    candidate_failed = (not cand.finished and base.finished) or (fc.steps_executed == 0 < fb.steps_executed)
    if candidate_failed:
        warnings.insert(0, f"candidate {lc} did not succeed ({cand.outcome}) while the base did: "
                           "counted as a regression")
    # A NaN/Inf loss is a diverged run, never a "Final loss -" dropped from the verdict.
    if fb.diverged_step is not None:
        warnings.insert(0, f"base {lb} diverged: {diverged_text(fb)}")
    if fc.diverged_step is not None:
        mark_diverged(rows[1], fc)
        warnings.insert(0, f"candidate {lc} diverged: {diverged_text(fc)}; counted as a regression")
    notes = _notes(fb, fc, lb, lc, threshold_pct, alpha, warmup, rows, base, cand)
    return Comparison(base, cand, lb, lc, fb, fc, rows, warnings, notes, threshold_pct, alpha,
                      warmup, candidate_failed, shape_differences(base, cand))


STEP_TIME_METRICS = ("Steady-state s/step (median)", "Avg s/step")
PERCENT_METRICS = ("Goodput %",)  # figures that are percentages: differences in points


def in_points(rows: list[Row]) -> None:
    """A percentage's difference in percentage points ('+41.0 pp'), the same on every output:
    a relative change of a share (+1125%) reads as a speed-up it is not."""
    for r in rows:
        if r.metric not in PERCENT_METRICS or r.delta is None:
            continue
        pct = f" ({r.delta_pct:+.1f}%)" if r.delta_pct is not None else ""
        r.delta_pct = None
        r.delta_text = f"{_signed(r.delta, 1)} pp" if r.delta else "0 pp"
        r.diff = r.diff.replace(pct, "", 1)
        if r.diff.startswith(_signed(r.delta, 1)):
            r.diff = r.delta_text + r.diff[len(_signed(r.delta, 1)):]


def slower_goodput(rows: list[Row]) -> None:
    """A candidate whose steps are slower is never "improved" in goodput: a higher share
    there means its slower steps outweigh the same startup, not that less time was lost."""
    times = [r for r in rows if r.metric in STEP_TIME_METRICS and r.delta is not None]
    slower = [r for r in times if (r.delta or 0.0) > 0]
    for r in rows:
        if r.metric != "Goodput %" or r.delta is None or r.delta <= 0:
            continue
        if slower:
            worst = max(slower, key=lambda x: x.delta_pct or 0.0)
            pct = f" ({worst.delta_pct:+.1f}%)" if worst.delta_pct is not None else ""
            r.verdict = "not improved"
            r.beyond_threshold = False
            r.diff = (f"{_signed(r.delta, 1)} pp not improved: the candidate's steps are slower "
                      f"({worst.metric}{pct}), so its startup is a smaller share of a longer run")


def _params(p: float | None) -> str:
    return format_params(p) if p else ""


def _params_cells(base: RunRecord, cand: RunRecord) -> tuple[str, str]:
    """Both sides at the precision of the less precise one (a log line has 3 decimals of
    billions); a count that reads as zero there (a model under 0.5 million parameters) is
    not measured at that precision: "n/a", never "0.000 billion"."""
    if base.params and cand.params and not (base.params_exact and cand.params_exact):
        tb, tc = f"{base.params / 1e9:.3f} billion", f"{cand.params / 1e9:.3f} billion"
    else:
        tb, tc = base.params_text or _params(base.params), cand.params_text or _params(cand.params)
        if tb == tc and _params_differ(base, cand):  # exact counts that round alike: show them whole
            return f"{base.params:,.0f}", f"{cand.params:,.0f}"
    return _zero_na(tb), _zero_na(tc)


def _zero_na(text: str) -> str:
    """'n/a' for a figure that reads as zero ('0.000 billion', '0'): it was not measured."""
    return "n/a" if re.fullmatch(r"\s*0(?:\.0*)?(?:\s+\w+)?\s*", text or "") else text


def _params_differ(base: RunRecord, cand: RunRecord) -> bool:
    if not base.params or not cand.params:
        return False
    if base.params_exact and cand.params_exact:
        return base.params != cand.params
    return round(base.params / 1e9, 3) != round(cand.params / 1e9, 3)


def _mem(rec: RunRecord) -> float | None:
    return rec.memory["pct"] if rec.memory else None


def _spread_row(cmp: Comparator, fb: RunFigures, fc: RunFigures) -> Row:
    """IQR of steady step times; tested on absolute deviations from each side's median."""
    def dev(xs: list[float]) -> list[float]:
        if not xs:
            return []
        m = statistics.median(xs)
        return [abs(x - m) for x in xs]

    row = cmp.sampled("Step time spread (IQR)", dev(fb.steady_seconds), dev(fc.steady_seconds),
                      "median", "lower", 3, gating=False,
                      shown=(iqr(fb.steady_seconds), iqr(fc.steady_seconds)))
    return row


def _stall_row(cmp: Comparator, fb: RunFigures, fc: RunFigures) -> Row:
    """Total seconds saves blocked or waited; tested on the per-save stalls."""
    if not fb.stall_events and not fc.stall_events:
        def cell(fig: RunFigures) -> str:  # no save at all: nothing was measured
            if fig.stall_total == 0:
                return "0 s" if fig.stall_saves else "n/a (no saves)"
            return _fmt(fig.stall_total, 3, " s")

        same = fb.stall_total == fc.stall_total == 0
        return Row("Checkpoint stall total", cell(fb), cell(fc),
                   ("0 (no save blocked or waited)" if fb.stall_saves or fc.stall_saves else "n/a (no saves)")
                   if same else "n/a",
                   base_value=fb.stall_total, cand_value=fc.stall_total, verdict="identical",
                   n_base=0, n_cand=0, better="lower")
    row = cmp.sampled("Checkpoint stall total", fb.stall_events, fc.stall_events, "mean", "lower", 3,
                      unit=" s", shown=(fb.stall_total, fc.stall_total), what="stalls")
    return row


def confounders(base: RunRecord, cand: RunRecord, fb: RunFigures, fc: RunFigures,
                lb: str, lc: str) -> list[str]:
    """What makes this comparison unfair or its figures misleading, one sentence each."""
    w: list[str] = []
    for key, name in (("jax", "JAX"), ("jaxlib", "jaxlib"), ("libtpu", "libtpu")):
        vb = base.libtpu if key == "libtpu" else base.versions.get(key, "")
        vc = cand.libtpu if key == "libtpu" else cand.versions.get(key, "")
        if vb and vc and vb != vc:
            w.append(f"different {name}: {lb} ran {vb}, {lc} ran {vc}; differences may come from "
                     f"{name}, not the branch")
        elif key != "libtpu" and bool(vb) != bool(vc):
            w.append(f"{name} version unknown for {lc if vb else lb}: cannot tell whether both sides ran the same")
    # MaxText's "System Information: Jax Backend" is the backend's platform_version (a
    # libtpu/PJRT or CUDA build string on accelerators); xrun's header has the platform.
    vb, vc = base.versions.get("backend", ""), cand.versions.get("backend", "")
    if vb and vc and vb != vc:
        w.append(f"different JAX backends: {lb} ran {vb}, {lc} ran {vc}")
    if not base.jax and not cand.jax:
        w.append("JAX version unknown on both sides (no header or System Information lines)")
    if base.accelerator and cand.accelerator and base.accelerator != cand.accelerator:
        w.append(f"different accelerators: {lb} on {base.accelerator}, {lc} on {cand.accelerator}")
    if base.devices and cand.devices and base.devices != cand.devices:
        w.append(f"different device counts: {lb} {base.devices}, {lc} {cand.devices}")
    if base.device_kind and cand.device_kind and base.device_kind != cand.device_kind:
        w.append(f"different device kinds: {lb} {base.device_kind}, {lc} {cand.device_kind}")
    if base.process_count and cand.process_count and base.process_count != cand.process_count:
        w.append(f"different process counts: {lb} {base.process_count}, {lc} {cand.process_count}")
    if base.source and base.source == cand.source:
        w.append("the same run on both sides: every difference is zero by construction")
    elif base.commit and cand.commit and base.commit == cand.commit and _same_tree(base, cand):
        w.append(f"same commit {base.short_commit} on both sides: any difference is noise or environment, "
                 "not code")
    if base.process_id is not None and cand.process_id is not None and base.process_id != cand.process_id:
        w.append(f"logs from different processes: {lb} is process {base.process_id}, "
                 f"{lc} is process {cand.process_id}")
    if fb.steps_distinct != fc.steps_distinct or fb.final_step != fc.final_step:
        w.append(f"different step counts: {lb} trained {fb.steps_distinct} steps (last step {fb.final_step}), "
                 f"{lc} trained {fc.steps_distinct} (last step {fc.final_step})")
    diff = config_diff(base.config, cand.config)
    if diff:
        w.append(f"different configs: {diff}")
    if _params_differ(base, cand):
        w.append(f"different parameter counts: {lb} {_params(base.params)}, {lc} {_params(cand.params)}")
    tw_b, tw_c = base.steps.total_weights_last, cand.steps.total_weights_last
    if tw_b and tw_c and tw_b != tw_c:
        w.append(f"different tokens per step (total_weights): {lb} {tw_b}, {lc} {tw_c}")
    if fb.time_to_first_step is not None and fc.time_to_first_step is not None and fb.ttfs_basis != fc.ttfs_basis:
        w.append(f"time to first step is measured {fb.ttfs_basis} for {lb} but {fc.ttfs_basis} for {lc}: "
                 "not comparable")
    for rec, lab in ((base, lb), (cand, lc)):
        if not rec.finished:
            w.append(f"{lab} did not finish: {rec.outcome}")
        if rec.restarts:
            w.append(f"{lab} restarted {rec.restarts} time(s): redone steps are in its samples")
    for fig, lab in ((fb, lb), (fc, lc)):
        share = fig.step_share_of_stalls
        if share >= STALL_SHARE_WARN:
            mean = statistics.fmean(fig.avg_seconds) if fig.avg_seconds else 0.0
            w.append(f"'Avg s/step' of {lab} ({_fmt(mean, 3)}) is dominated by checkpoint stalls: "
                     f"{fig.stall_in_steps:.3f} s of {fig.total_step_seconds:.3f} s step time "
                     f"({100 * share:.0f}%); read the steady-state row instead")
        if 0 < len(fig.steady_seconds) < MIN_SAMPLES:
            w.append(f"{lab} has only {len(fig.steady_seconds)} steady-state steps: too few to test; "
                     "run more steps or lower --warmup")
    return w


def _same_tree(base: RunRecord, cand: RunRecord) -> bool:
    """False when both shipped a working tree and the trees differ (uncommitted changes on
    the same commit): then the code is not the same."""
    sb, sc = (base.code or {}).get("sha256"), (cand.code or {}).get("sha256")
    return not (sb and sc and sb != sc)


def _restored_step(rec: RunRecord) -> int | None:
    """The step the run's first attempt restored (a resumed run), if it did."""
    for ev in rec.checkpoints:
        if ev["event"] == "restored":
            return ev["step"]
    return None


def _direction(row: Row) -> int:
    """+1 the candidate looks better on this row, -1 worse, 0 no change or unknown."""
    if row.delta is None or row.delta == 0 or row.better is None:
        return 0
    return 1 if (row.delta < 0) == (row.better == "lower") else -1


def _robust_sd(values: list[float]) -> float | None:
    """1.4826 x the median absolute deviation: a step's noise, blind to a few outliers."""
    if len(values) < MIN_SAMPLES:
        return None
    m = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - m) for v in values)


def _step_causes(rec: RunRecord) -> dict[tuple[int, int], str]:
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


def avg_decider(base: RunRecord, cand: RunRecord, lb: str, lc: str, most: int = 3,
                figs: tuple[RunFigures, RunFigures] | None = None) -> str:
    """'Avg s/step differs by one step: step 7 (main) took 22.7 s waiting on a checkpoint
    save' when at most ``most`` steps of one side make the difference of the means (without
    them it shrinks to a quarter or turns); '' otherwise. With ``figs`` a step's cause is
    the one its outlier note gives (the same words in both places)."""
    named = {id(rec): {(o.attempt, o.step): o.why for o in f.outliers.outliers}
             for rec, f in zip((base, cand), figs or (), strict=False)}
    sides = []
    for rec, label in ((base, lb), (cand, lc)):
        rows = [(s, st, a) for st, s, a in zip(rec.steps.step[1:], rec.steps.seconds[1:],
                                                rec.steps.attempt[1:], strict=True) if math.isfinite(s)]
        if len(rows) < 2:
            return ""
        sides.append((rec, label, rows))
    mb = statistics.fmean(r[0] for r in sides[0][2])
    mc = statistics.fmean(r[0] for r in sides[1][2])
    delta = mc - mb
    if delta == 0:
        return ""
    rec, label, rows = sides[1] if delta > 0 else sides[0]
    other = mb if delta > 0 else mc
    if abs(delta) < 0.05 * other:
        return ""  # no difference worth explaining
    top = sorted(rows, key=lambda r: -r[0])
    typical = statistics.median(r[0] for r in rows)
    for k in range(1, most + 1):
        rest = top[k:]
        if not rest:
            return ""
        left = statistics.fmean(r[0] for r in rest) - other
        if top[k - 1][0] < 2 * typical:
            return ""  # not a few outlying steps: the steps differ throughout
        if abs(left) <= 0.25 * abs(delta) or left * delta < 0:
            known = _step_causes(rec)
            causes = {**{k: f"({why})" for k, why in named.get(id(rec), {}).items()}, **known}
            picked = sorted(top[:k], key=lambda r: (r[2], r[1]))
            what = [causes.get((a, st), "with no recorded cause") for _s, st, a in picked]
            count = "one step" if k == 1 else f"{k} steps"
            if len(set(what)) == 1:
                steps = ", ".join(str(st) for _s, st, _a in picked)
                secs = ", ".join(f"{s:.1f}" for s, _st, _a in picked)
                return (f"Avg s/step differs by {count}: step{'s' if k > 1 else ''} {steps} ({label}) "
                        f"took {secs} s {what[0]}")
            parts = [f"step {st} took {s:.1f} s {w}" for (s, st, _a), w in zip(picked, what, strict=True)]
            return f"Avg s/step differs by {count} of {label}: " + "; ".join(parts)
    return ""


def disagreements(rows: list[Row], fb: RunFigures, fc: RunFigures, lc: str,
                  threshold_pct: float) -> list[str]:
    """A familiar row and the steady-state row pointing different ways, when the familiar
    one moved enough to be believed: by at least the threshold and, for one step's value,
    by more than 3 sigma of one step's noise (the steady steps' spread on both sides), or
    when the steady-state row is significant. The steady-state row is tested on every step."""
    by = {r.metric: r for r in rows}
    honest = by.get(HONEST_ROW)
    if honest is None or not _direction(honest):
        return []
    samples = {"TFLOP/s": (fb.steady_tflops, fc.steady_tflops),
               "Tok/s": (fb.steady_tokens, fc.steady_tokens)}
    out = []
    word = {1: "better", -1: "worse"}
    for name in FAMILIAR_ROWS:
        row = by.get(name)
        if row is None or not _direction(row) or _direction(row) == _direction(honest):
            continue
        moved = row.delta_pct is not None and abs(row.delta_pct) >= threshold_pct
        if name in samples and moved:
            sds = [_robust_sd(x) for x in samples[name]]
            known = [sd for sd in sds if sd is not None]
            noise = math.hypot(*known) if len(known) == len(sds) else None
            moved = noise is not None and abs(row.delta or 0.0) > 3 * noise
        if not (moved or honest.verdict in ("improved", "regressed")):
            continue
        pct = f" ({row.delta_pct:+.1f}%)" if row.delta_pct is not None else ""
        hpct = f" ({honest.delta_pct:+.1f}%, {honest.verdict})" if honest.delta_pct is not None else ""
        why = ("one step's value" if name != "Avg s/step"
               else "a mean that checkpoint stalls and restarts move")
        out.append(f"'{name}' says {lc} is {word[_direction(row)]}{pct} but the steady-state "
                   f"median says {word[_direction(honest)]}{hpct}: '{name}' is {why}; "
                   "read the steady-state row")
    return out


def config_diff(a: Any, b: Any, limit: int = 5) -> str:
    """'steps 40 -> 20, batch 8 -> 16' for differing keys; '' when equal or unknown."""
    if a is None or b is None or a == b:
        return ""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return f"{str(a)[:80]!r} vs {str(b)[:80]!r}"
    fa, fb = _flatten(a), _flatten(b)
    keys = sorted(k for k in set(fa) | set(fb) if fa.get(k, "<unset>") != fb.get(k, "<unset>"))
    parts = [f"{k} {fa.get(k, '<unset>')} -> {fb.get(k, '<unset>')}" for k in keys[:limit]]
    if len(keys) > limit:
        parts.append(f"and {len(keys) - limit} more")
    return ", ".join(parts)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _notes(fb: RunFigures, fc: RunFigures, lb: str, lc: str, threshold: float, alpha: float,
           warmup: int, rows: list[Row], base: RunRecord, cand: RunRecord) -> list[str]:
    n: list[str] = []
    n.append(f"Steady state: steps after the first {warmup} of each attempt, without the steps whose "
             f"time absorbed a checkpoint stall and without outlier steps: {lb} {len(fb.steady_seconds)} of "
             f"{fb.steps_executed} steps, {lc} {len(fc.steady_seconds)} of {fc.steps_executed}.")
    if fb.outliers.outliers or fc.outliers.outliers:
        n.append(OUTLIER_RULE + ".")
    for fig, lab in ((fb, lb), (fc, lc)):
        outlier_note = fig.outliers.note(lab)
        if outlier_note:
            n.append(outlier_note + ".")
    for fig, lab in ((fb, lb), (fc, lc)):
        ci = median_ci(fig.steady_seconds)
        if fig.steady_median is not None:
            extra = f", 95% CI {_fmt(ci[0], 3)}–{_fmt(ci[1], 3)}" if ci else ""
            n.append(f"{lab}: steady-state median {_fmt(fig.steady_median, 3)} s/step{extra}; "
                     f"{format_goodput(fig.goodput)}.")
    n.append(f"Marks: two-sided Mann-Whitney U test on per-step samples at alpha={alpha:g}; 'within noise' "
             f"means p >= {alpha:g}. The exit code is 1 for a significant regression of at least "
             f"{threshold:g}% in Final loss, steady-state s/step or checkpoint "
             "stalls, or a failed candidate.")
    for row in rows:
        if row.note:
            n.append(f"{row.metric}: {row.note}.")
    n.append(f"Final loss is the last step's, tested on the last {len(fb.loss_tail)}/{len(fc.loss_tail)} "
             "steps.")
    for rec, lab in ((base, lb), (cand, lc)):
        t = rec.checkpoint_totals
        said: list[str] = []
        restored = _restored_step(rec)
        if restored is not None:
            found = f" ({rec.checkpoints_found} found)" if rec.checkpoints_found else ""
            said.append(f"resumed from checkpoint step {restored}{found}")
        if t.get("deferred"):
            said.append(f"{int(t['deferred'])} save(s) deferred (taken after the previous one "
                         "committed; no training time lost)")
        if t.get("exit_wait"):
            said.append(f"{t['exit_wait']:.3f} s waiting for the last save to commit before exit "
                         "(not a stall)")
        for key, what in (("restore_failed", "restores failed"), ("write_failed", "writes failed")):
            if t.get(key):
                said.append(f"{int(t[key])} checkpoint {what}")
        if said:
            n.append(f"{lab}: " + "; ".join(said) + ".")
    loss_row = rows[1]
    if loss_row.verdict not in ("identical", "missing") and not config_diff(base.config, cand.config):
        n.append("The losses differ although the configs match: the two sides are not numerically "
                 "identical (code, versions or nondeterminism).")
    mem = rows[5]
    if mem.delta_pct is not None and abs(mem.delta_pct) >= threshold:
        n.append(f"Memory % changed by {mem.delta_pct:+.1f}% (one reading per run, not noise-tested).")
    for fig, lab in ((fb, lb), (fc, lc)):
        if fig.stride > 1:
            n.append(f"{lab}: a long run; statistics use every {fig.stride}th step.")
    for rec, lab in ((base, lb), (cand, lc)):
        if rec.code_text:  # the shipped working tree (workdir) each side ran
            n.append(f"{lab}: {rec.code_text}.")
    for rec, lab in ((base, lb), (cand, lc)):
        for note in rec.notes[:5]:
            n.append(f"{lab}: {note}.")
    return n


# ---------------------------------------------------------------------------------------
# Repeated runs: the verdict on per-run values


MIN_RUNS = MIN_SAMPLES  # benchstat: "need >= 4 samples" per side before it reports a p-value

# (key, table label, better, gating, decimals): one figure per run; also the history record's
# "figures" and the metrics `xrun history --metric` accepts. Gating as in the per-step table:
# the steady-state step time, the loss and checkpoint stalls decide; throughput (the same
# measurement as step time, inverted) and the mean step time are marked, never gate.
RUN_METRICS: tuple[tuple[str, str, str, bool, int], ...] = (
    ("steady_s_per_step", "Steady-state s/step (median)", "lower", True, 3),
    ("tokens_per_s", "Tok/s (steady median)", "higher", False, 1),
    ("tflops_per_device", "TFLOP/s (steady median)", "higher", False, 3),
    ("avg_s_per_step", "Avg s/step", "lower", False, 3),
    ("final_loss", "Final loss", "lower", True, 4),
    ("checkpoint_stall_s", "Checkpoint stall total", "lower", True, 3),
    ("time_to_first_step_s", "Time to first step", "lower", False, 1),
    ("goodput_pct", "Goodput %", "higher", False, 1),
)
RUN_METRIC_KEYS = tuple(m[0] for m in RUN_METRICS)


def run_values(fig: RunFigures) -> dict[str, float | None]:
    """One run's figures, one number each: what the run-level test and the history use."""
    def med(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    return {
        "steady_s_per_step": fig.steady_median,
        "tokens_per_s": med(fig.steady_tokens),
        "tflops_per_device": med(fig.steady_tflops),
        "avg_s_per_step": statistics.fmean(fig.avg_seconds) if fig.avg_seconds else None,
        "final_loss": fig.final_loss,
        "checkpoint_stall_s": fig.stall_total if fig.steps_executed else None,
        "time_to_first_step_s": fig.time_to_first_step,
        "goodput_pct": fig.goodput.get("goodput_pct") if fig.steps_executed else None,
    }


@dataclass
class RunSetComparison:
    """CANDIDATE's repeated runs against BASE's: a row per figure tested on per-run values
    (each run one sample: between-run noise is what a nightly must beat), and the per-step
    comparison of the first pair as supporting detail."""

    base_label: str
    cand_label: str
    base_values: list[dict[str, float | None]]
    cand_values: list[dict[str, float | None]]
    rows: list[Row]
    per_step: Comparison | None
    threshold_pct: float
    alpha: float
    # (kind, line) the caller decided for this pair (the nightly's INCOMPLETE / REGRESSED /
    # within noise): then every output of the pair shows that one.
    stated: tuple[str, str] | None = None

    @property
    def n_base(self) -> int:
        return len(self.base_values)

    @property
    def n_cand(self) -> int:
        return len(self.cand_values)

    @property
    def on_runs(self) -> bool:
        """Enough runs per side for the run-level test to decide (benchstat's n >= 4)."""
        return self.n_base >= MIN_RUNS and self.n_cand >= MIN_RUNS

    @property
    def regressions(self) -> list[Row]:
        if self.on_runs:
            return [r for r in self.rows if r.gating and r.beyond_threshold]
        found = self.per_step.regressions if self.per_step else []
        # A candidate run that diverged regresses whatever the basis (not only the first pair).
        return found + [r for r in self.rows if r.diverged_step is not None
                        and all(f.metric != r.metric for f in found)]

    @property
    def regressed(self) -> bool:
        return bool(self.regressions) or bool(self.per_step and self.per_step.candidate_failed)

    @property
    def verdict(self) -> tuple[str, str]:
        """(kind, line) of this pair, the one every output shows: on per-run values with
        enough runs, else the first pair's per-step verdict (plus a diverged candidate run);
        what the caller stated for the pair when it did."""
        if self.stated is not None:
            return self.stated
        if self.per_step is not None and self.per_step.candidate_failed:
            return self.per_step.verdict
        if self.regressions:
            worst = ", ".join(f"{r.metric} {delta_text(r)}" for r in self.regressions)
            return "regressed", f"REGRESSED beyond {self.threshold_pct:g}%: {worst}"
        if not self.on_runs and self.per_step is not None:
            return self.per_step.verdict
        return "ok", f"OK: no significant regression beyond {self.threshold_pct:g}%"

    @property
    def basis(self) -> str:
        """One sentence: what the verdict rests on."""
        n = f"n={self.n_base}/{self.n_cand} runs"
        if self.on_runs:
            return (f"verdict on per-run values ({n}, two-sided Mann-Whitney U at alpha={self.alpha:g}); "
                    "the per-step test of the first pair is supporting detail")
        return (f"verdict on per-step samples of the first pair: {n} is below benchstat's n >= {MIN_RUNS} "
                "runs per side, so between-run noise is not measured; use repeats >= 4")

    def markdown(self) -> str:
        b, k = _md_cell(self.base_label), _md_cell(self.cand_label)
        out = [f"Basis: {self.basis}.", "",
               f"| Metric (per-run median) | {b} | {k} | Diff ({k} − {b}) |", "|---|---|---|---|"]
        out += [f"| {_md_cell(r.metric)} | {_md_cell(r.base)} | {_md_cell(r.cand)} | {_md_cell(r.diff)} |"
                for r in self.rows]
        return "\n".join(out) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "base_label": self.base_label, "candidate_label": self.cand_label,
            "n_base_runs": self.n_base, "n_candidate_runs": self.n_cand, "on_runs": self.on_runs,
            "basis": self.basis, "base_values": self.base_values, "candidate_values": self.cand_values,
            "rows": [asdict(r) for r in self.rows],
            "regressions": [r.metric for r in self.regressions], "regressed": self.regressed,
            "verdict": self.verdict[1],
            "per_step": self.per_step.to_dict() if self.per_step else None,
        }


def compare_runs(base: list[RunRecord], cand: list[RunRecord], threshold_pct: float = DEFAULT_THRESHOLD_PCT,
                 alpha: float = DEFAULT_ALPHA, warmup: int = DEFAULT_WARMUP) -> RunSetComparison:
    """Repeated runs of two branches: each figure tested on the per-run values."""
    bv = [run_values(figures(r, warmup)) for r in base]
    cand_figs = [figures(r, warmup) for r in cand]
    cv = [run_values(f) for f in cand_figs]
    per_step = compare(base[0], cand[0], threshold_pct, alpha, warmup) if base and cand else None
    lb, lc = (per_step.base_label, per_step.cand_label) if per_step else ("base", "candidate")
    cmp = Comparator(threshold_pct, alpha)
    rows = []
    for key, label, better, gating, decimals in RUN_METRICS:
        xb = _finite_values(v[key] for v in bv)
        xc = _finite_values(v[key] for v in cv)
        row = cmp.sampled(label, xb, xc, "median", better, decimals, gating=gating, what="runs")
        if row.verdict == "not tested" and (len(xb) < MIN_RUNS or len(xc) < MIN_RUNS):
            row.diff = row.diff.replace("too few samples", f"benchstat needs n >= {MIN_RUNS} runs per side")
        rows.append(row)
    in_points(rows)
    slower_goodput(rows)
    diverged = [f for f in cand_figs if f.diverged_step is not None]
    if diverged:
        loss_row = next(r for r in rows if r.metric == "Final loss")
        mark_diverged(loss_row, min(diverged, key=lambda f: f.diverged_step or 0))
        loss_row.diff += f" in {len(diverged)}/{len(cand)} candidate runs"
    return RunSetComparison(lb, lc, bv, cv, rows, per_step, threshold_pct, alpha)


def _finite_values(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]
