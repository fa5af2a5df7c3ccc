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

import re
import statistics

from orchestrator.analysis.goodput import DEFAULT_WARMUP
from orchestrator.analysis.notes import (
    AVG_NOTE,
    FAMILIAR_ROWS,
    HONEST_ROW,
    LAST_STEP_NOTE,
    STALL_SHARE_WARN,
    _notes,
    _params,
    _params_differ,
    avg_decider,
    config_diff,
    confounders,
    disagreements,
    shape_differences,
)
from orchestrator.analysis.rows import (
    DEFAULT_ALPHA,
    DEFAULT_THRESHOLD_PCT,
    MIN_SAMPLES,
    PERCENT_METRICS,
    STEP_TIME_METRICS,
    Comparator,
    Row,
    _fmt,
    delta_text,
    in_points,
    slower_goodput,
)
from orchestrator.analysis.runfigures import (
    RunFigures,
    _avg_decided,
    diverged_text,
    figures,
    mark_diverged,
)
from orchestrator.analysis.stats import iqr
from orchestrator.analysis.verdicts import (
    MIN_RUNS,
    RUN_METRIC_KEYS,
    RUN_METRICS,
    Comparison,
    RunSetComparison,
    _finite_values,
    run_values,
    table_markdown,
    verdict_of,
)
from orchestrator.readers.record import RunRecord

# What callers import from here: the comparison's pieces live in rows, runfigures, notes and
# verdicts (one module each, none over 800 lines); this module builds a comparison from them.
__all__ = [
    "AVG_NOTE", "DEFAULT_ALPHA", "DEFAULT_THRESHOLD_PCT", "FAMILIAR_ROWS", "HONEST_ROW",
    "LAST_STEP_NOTE", "MIN_RUNS", "MIN_SAMPLES", "PERCENT_METRICS", "RUN_METRICS",
    "RUN_METRIC_KEYS", "STALL_SHARE_WARN", "STEP_TIME_METRICS", "Comparator", "Comparison", "Row",
    "RunFigures", "RunSetComparison", "avg_decider", "compare", "compare_runs", "config_diff",
    "confounders", "delta_text", "disagreements", "diverged_text", "figures", "in_points",
    "mark_diverged", "run_values", "shape_differences", "slower_goodput", "table_markdown",
    "verdict_of",
]

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
    steady.note = (f"median of steady-state steps' wall time (the device's seconds and its idle time before "
                   f"the step, where the metrics say it: a slow input pipeline counts): after the first {warmup} "
                   "of each attempt, without the steps whose time absorbed a checkpoint stall and without "
                   "outlier steps")
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
    # A narrower spread is steadier steps, not a faster branch: never an "improvement" (nor
    # a wider one a "regression"); said as what it is.
    word = {"improved": "narrower", "regressed": "wider"}.get(row.verdict)
    if word:
        row.diff = row.diff.replace("**", "").replace(f", under the {cmp.threshold_pct:g}% threshold", "")
        row.diff = row.diff.replace(row.verdict, f"{word} (not a speed change)", 1)
        row.verdict, row.beyond_threshold = word, False
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
