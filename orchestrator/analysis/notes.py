"""What a comparison says beside its table: the confounders above it (different versions,
shapes, configs; a mean dominated by stalls), familiar rows that disagree with the
steady-state row, the few steps that decide "Avg s/step", and the notes under it."""

from __future__ import annotations

import math
import statistics
from typing import Any

from orchestrator.analysis.goodput import format_goodput
from orchestrator.analysis.outliers import RULE_TEXT as OUTLIER_RULE
from orchestrator.analysis.outliers import step_causes
from orchestrator.analysis.rows import MIN_SAMPLES, Row, _direction, _fmt
from orchestrator.analysis.runfigures import RunFigures, _restored_step
from orchestrator.analysis.stats import median_ci
from orchestrator.readers.record import RunRecord, format_params

STALL_SHARE_WARN = 0.10  # stalls above this share of all step time make "Avg s/step" misleading
LAST_STEP_NOTE = ("the last step's {what}, as its step line says (MaxText's reports show this "
                  "one value): no noise estimate; the steady-state row is the tested figure")
AVG_NOTE = ("mean of every step after the first (checkpoint stalls and restarts included, "
            "compilation of the first step not); marked by a test of means, never sets the exit code")
# The familiar rows and the honest row that measures the same thing (lower s/step is
# higher throughput): a warning when they point different ways.
HONEST_ROW = "Steady-state s/step (median)"
FAMILIAR_ROWS = ("TFLOP/s", "Tok/s", "Avg s/step")


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


def _params(p: float | None) -> str:
    return format_params(p) if p else ""


def _params_differ(base: RunRecord, cand: RunRecord) -> bool:
    if not base.params or not cand.params:
        return False
    if base.params_exact and cand.params_exact:
        return base.params != cand.params
    return round(base.params / 1e9, 3) != round(cand.params / 1e9, 3)


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


def _robust_sd(values: list[float]) -> float | None:
    """1.4826 x the median absolute deviation: a step's noise, blind to a few outliers."""
    if len(values) < MIN_SAMPLES:
        return None
    m = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - m) for v in values)


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
        rows = [(s, st, a) for st, s, a in zip(rec.steps.step[1:], rec.steps.wall()[1:],
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
            known = step_causes(rec)
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
