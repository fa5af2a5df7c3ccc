"""The verdicts: one pair's (:class:`Comparison`) and repeated runs' (:class:`RunSetComparison`),
the one line every output of a comparison shows (terminal, markdown, JSON, HTML)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.analysis.rows import MIN_SAMPLES, Row, _md_cell, delta_text
from orchestrator.analysis.runfigures import RunFigures, _restored_step
from orchestrator.analysis.stats import median_ci
from orchestrator.readers.record import RunRecord
from xrun_contract.errors import EXIT_FAILED, EXIT_NOT_COMPARABLE, EXIT_OK


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
    def markdown(self, verdict: bool = True) -> str:
        """Verdict first, as on the terminal, and again as the last line (what `tail -n 1`
        in CI reads). ``verdict=False``: without either line, for the per-step detail of a
        nightly pair, whose verdict is the run-level one said above it."""
        line = self.verdict[1]
        lines = [f"**Verdict:** {line}", ""] if verdict else []
        lines += [f"**Warning:** {w}\n" for w in self.warnings]
        lines.append(table_markdown(self))
        lines.append("")
        lines.append("Notes:")
        lines += [f"- {n}" for n in self.notes]
        if verdict:
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
    unshown = [r for r in c.rows if r.gating and _worse_unshown(r, c.threshold_pct)]
    if unshown:
        # One run a side: the steps of one run say nothing about how much a second run of
        # the same code would differ, so a large move that the test cannot separate from
        # noise is neither a regression nor "OK".
        moved = ", ".join(f"{r.metric} {delta_text(r)} ({r.verdict}{_p_text(r)})" for r in unshown)
        return "inconclusive", (f"INCONCLUSIVE: {moved}: one run a side cannot show this is significant; "
                                "repeat the runs (with 4 or more a side, a nightly's repeats: 4, the test is "
                                "on per-run values)")
    improved = [r for r in c.rows if r.verdict == "improved"]
    under = [r for r in c.rows if r.verdict == "regressed" and r.gating]
    other = [r for r in c.rows if r.verdict == "regressed" and not r.gating]
    bits = [f"{len(improved)} improved" if improved else "",
            f"{len(under)} regressed under {c.threshold_pct:g}%" if under else "",
            f"{', '.join(r.metric for r in other)} regressed (not a gating row)" if other else ""]
    tail = "; ".join(b for b in bits if b)
    return "ok", f"OK: no significant regression beyond {c.threshold_pct:g}%" + (f" ({tail})" if tail else "")


def _worse_unshown(r: Row, threshold_pct: float) -> bool:
    """A row that moved the wrong way by at least the threshold, which the test could not
    tell from noise (or had too few samples to test)."""
    if r.verdict not in ("within noise", "not tested") or r.delta_pct is None or r.delta is None:
        return False
    worse = r.delta > 0 if r.better == "lower" else r.delta < 0
    return worse and abs(r.delta_pct) >= threshold_pct


def _p_text(r: Row) -> str:
    if r.p_value is None:
        return f", n={r.n_base}/{r.n_cand} steps" if r.n_base is not None else ""
    return (f", p={r.p_value:.3f}" if r.p_value >= 0.001 else ", p<0.001") + (
        f", n={r.n_base}/{r.n_cand} steps" if r.n_base is not None else "")


def table_markdown(c: Comparison) -> str:
    """The table: header row exactly '| Metric | <base> | <cand> | Diff (<cand> − <base>) |'."""
    b, k = _md_cell(c.base_label), _md_cell(c.cand_label)
    out = [f"| Metric | {b} | {k} | Diff ({k} − {b}) |", "|---|---|---|---|"]
    for r in c.rows:
        out.append(f"| {_md_cell(r.metric)} | {_md_cell(r.base)} | {_md_cell(r.cand)} | {_md_cell(r.diff)} |")
    return "\n".join(out)


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
        out = [f"**Verdict:** {self.verdict[1]}", "", f"Basis: {self.basis}.", "",
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


def _finite_values(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]
