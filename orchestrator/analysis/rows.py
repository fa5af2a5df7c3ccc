"""The rows of a comparison: one figure of each side, its difference and the test's mark.

A row backed by per-step (or per-run) samples is marked by a two-sided test
(:class:`Comparator`); a one-value figure is shown with its difference, never marked by sign.
Pure standard library.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from orchestrator.analysis.stats import mann_whitney_u, mean_diff_test

DEFAULT_THRESHOLD_PCT = 5.0
DEFAULT_ALPHA = 0.05
MIN_SAMPLES = 4  # with 3 vs 3 the smallest two-sided p is 0.1: nothing could be significant


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


def _direction(row: Row) -> int:
    """+1 the candidate looks better on this row, -1 worse, 0 no change or unknown."""
    if row.delta is None or row.delta == 0 or row.better is None:
        return 0
    return 1 if (row.delta < 0) == (row.better == "lower") else -1
