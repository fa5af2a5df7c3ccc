"""Goodput: where a run's wall time went, in seconds per category; they sum to wall time.

Productive time is what the run's final steps would have taken at the run's own best
steady rate (``best_step_s``: the 10th percentile of its steady-state step times, the median
when it has fewer than 10): a branch whose steps got slower gains no productive time. The
rest is named: startup (submit to the first step), compilation (what the first steps of each
attempt took beyond a best step), slow steps (steady steps' time beyond the best rate),
checkpoint saves that blocked training, restarts (from the last step of a failed attempt to
the first step of the next) and the steps they redid, between steps (time inside an
attempt that no step's time covers: host work, logging), teardown (from the last step to
the end). ``other`` is what is left, only clock skew and rounding when every record is
there.

Input is the one :class:`~orchestrator.readers.record.RunRecord` a run reads back as (metrics
JSONL, logs, run.json and state.json's transitions).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from orchestrator.readers.record import RunRecord

CATEGORIES = ("startup", "compilation", "productive", "slow_steps", "checkpoint", "restarts",
              "redone_steps", "between_steps", "teardown", "other")
BEST_PERCENTILE = 10  # the run's best rate: this percentile of its steady step times
DEFAULT_WARMUP = 3


def goodput(rec: RunRecord, transitions: list[dict[str, Any]] | None = None,
            warmup: int = DEFAULT_WARMUP) -> dict[str, Any]:
    """Seconds per category (see module doc), the wall time and productive share.

    ``partial`` is True when times are missing (a log without timestamps): then only the
    step-time categories are known and ``wall_s`` is their sum.
    """
    transitions = transitions if transitions is not None else rec.transitions
    notes: list[str] = []
    cats = dict.fromkeys(CATEGORIES, 0.0)
    steps = rec.steps
    stride = steps.stride  # each kept sample stands for `stride` steps once decimated
    if stride > 1:
        notes.append(f"long run: estimated from every {stride}th step")
    steady = rec.steady_mask(warmup)
    final = rec.final_mask()
    steady_seconds = [s for s, ok in zip(steps.seconds, steady, strict=True) if ok]
    median = statistics.median(steady_seconds) if steady_seconds else None
    best = best_step_seconds(steady_seconds)

    # Stall seconds inside each step's time: none where the records time each step on the
    # device (``idle_s``), which puts a save that held training between steps.
    stalls = [0.0] * len(steps) if rec.idle_recorded else _stall_per_execution(rec, median)
    stall_total = rec.checkpoint_totals["blocked"] + rec.checkpoint_totals["waited"]
    if stall_total == 0.0:
        stall_total = sum(stalls) * stride

    # Step time by kind of execution: compile excess, stall, then productive or redone.
    first_of_attempt: dict[int, int] = {}
    compile_s = redone_s = final_work = 0.0
    redone_n = final_n = 0
    per_attempt: dict[int, dict[str, float]] = {}
    rows = zip(steps.rows(), final, stalls, strict=True)
    for (step, seconds, _tf, _tok, _loss, _b, t, attempt), is_final, stall in rows:
        if not math.isfinite(seconds):
            continue
        first = first_of_attempt.setdefault(attempt, step)
        work = seconds - stall
        excess = 0.0
        if step < first + warmup and best is not None:
            excess = max(0.0, work - best)
        compile_s += excess * stride
        work -= excess
        if is_final:  # split below, over all of them: a step cut short by async dispatch
            final_work += max(0.0, work) * stride  # pays for the next one's long time
            final_n += stride
        else:
            redone_s += work * stride
            redone_n += stride
        a = per_attempt.setdefault(attempt, {"start": math.nan, "end": math.nan, "steps": 0.0})
        a["steps"] += seconds * stride
        if math.isfinite(t):
            if math.isnan(a["start"]):
                a["start"] = t - seconds
            a["end"] = t
    cats["checkpoint"] = stall_total
    cats["compilation"] = compile_s
    cats["redone_steps"] = redone_s
    productive_s = min(final_work, final_n * best) if best is not None else final_work
    cats["productive"] = max(0.0, productive_s)
    cats["slow_steps"] = max(0.0, final_work - productive_s)

    # Times: submit (or process start) to first step, restarts, end.
    attempts = sorted(a for a in per_attempt if math.isfinite(per_attempt[a]["start"]))
    origin, basis = _origin(rec)
    end = _end(rec, transitions, per_attempt)
    if attempts:
        first_start = per_attempt[attempts[0]]["start"]
        if origin is not None:
            cats["startup"] = max(0.0, first_start - origin)
        for prev, cur in zip(attempts, attempts[1:], strict=False):
            cats["restarts"] += max(0.0, per_attempt[cur]["start"] - per_attempt[prev]["end"])
        # Inside each attempt, the time its steps' own times do not cover (the stalls a
        # step record leaves out are counted in "checkpoint" already).
        inside = sum(per_attempt[a]["end"] - per_attempt[a]["start"] - per_attempt[a]["steps"]
                     for a in attempts)
        cats["between_steps"] = max(0.0, inside - max(0.0, stall_total - sum(stalls) * stride))
        last_end = per_attempt[attempts[-1]]["end"]
    timelines = startup_timelines(rec, origin if basis == "submit" else None)
    waits = {t["attempt"]: sum(s["seconds"] for s in t["segments"] if s.get("wait")) for t in timelines}
    for attempt, wait in waits.items():
        key = "startup" if attempts and attempt == attempts[0] else "restarts"
        moved = min(wait, cats[key])
        cats[key] -= moved  # the first step waited for the compile: compilation, not startup
        cats["compilation"] += moved
    partial = origin is None or end is None
    known = sum(cats.values())
    if partial:
        wall = known
        notes.append("no timestamps for submit/start or end: wall time is the sum of step times")
    else:
        if not attempts:
            notes.append("steps carry no timestamps: startup and restarts are inside 'other'")
        assert end is not None and origin is not None  # not partial
        wall = max(0.0, end - origin)
        if attempts:
            cats["teardown"] = max(0.0, min(end - last_end, wall - known))
            known = sum(cats.values())
        cats["other"] = wall - known
        if cats["other"] < 0:
            if cats["other"] < -0.05 * wall:
                notes.append(f"records overlap by {-cats['other']:.1f}s (clock skew?): 'other' set to 0")
            cats["other"] = 0.0
            wall = known
    return {
        "wall_s": wall,
        "categories": {k: round(v, 6) for k, v in cats.items()},
        # What "startup" consists of, per attempt, from the workload's phase records.
        "startup_timeline": timelines,
        "goodput_pct": 100.0 * cats["productive"] / wall if wall > 0 else 0.0,
        "partial": partial,
        "basis": basis,
        "steady_step_s": median,
        "best_step_s": best,
        "steps": {"executed": steps.count, "redone": redone_n, "attempts": len(per_attempt)},
        # Not stalls, shown beside them: saves deferred instead of waited for (they cost
        # checkpoint age, not training time) and the last save committing before exit
        # (inside "other": no step waits for it).
        "deferred_saves": int(rec.checkpoint_totals.get("deferred", 0)),
        # Of them, deferred because storage did not answer (an outage), not behind a save.
        "deferred_storage_saves": int(rec.checkpoint_totals.get("deferred_storage", 0)),
        "exit_wait_s": float(rec.checkpoint_totals.get("exit_wait", 0.0)),
        "notes": notes,
    }


def best_step_seconds(steady_seconds: list[float]) -> float | None:
    """The run's best steady rate as a step time: the BEST_PERCENTILE-th percentile of its
    steady steps (one fast outlier does not set it), their median below 10 steps."""
    xs = sorted(s for s in steady_seconds if math.isfinite(s))
    if not xs:
        return None
    if len(xs) < 10:
        return statistics.median(xs)
    return xs[int(len(xs) * BEST_PERCENTILE / 100)]


# The startup timeline: the main path's milestones (xrun_contract.PHASES) in order, each
# segment named by what ran up to it; "compiled" is the compile thread's own span beside them.
_SEGMENTS = (("imports", "imports"), ("distributed", "distributed init"),
             ("checkpoint_manager", "program + checkpoint manager"), ("restored", "restore"),
             ("initialized", "init state"), ("first_step", "first step"))


def startup_timelines(rec: RunRecord, submitted_at: float | None = None) -> list[dict[str, Any]]:
    """Per attempt with phase records: where its startup went, in seconds.

    ``segments`` follow the main path: ``launch`` (submit to process start, first attempt
    only, when the submit time is known), then one per milestone reached (``imports``,
    ``distributed init``, ``program + checkpoint manager`` (the abstract model and
    shardings, or the executables loaded from the workload's executable cache; the
    checkpoint listing and, when one restores, Orbax's manager), ``restore step N`` or
    ``init state``, ``first step``: from the previous milestone, or from the compile's end
    when the first step waited for it). ``parallel`` holds the compile thread's span with
    ``waited_s``, the part of it the main path waited for (named "executables loaded" when
    nothing was compiled). ``start_s`` counts from submit (first attempt, when known) or
    from the attempt's process start.
    """
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for ph in rec.phases:
        if ph.get("phase") and isinstance(ph.get("seconds"), int | float):
            by_attempt.setdefault(int(ph.get("attempt") or 0), []).append(ph)
    out = []
    for attempt in sorted(by_attempt):
        phases = {ph["phase"]: ph for ph in by_attempt[attempt]}  # the latest of each
        timed = [ph["time"] - ph["seconds"] for ph in by_attempt[attempt]
                 if isinstance(ph.get("time"), int | float)]
        # Each record's time minus its seconds is the process start (the earliest one:
        # older workloads stamped the early phases when written, not when reached).
        process_start = min(timed) if timed else None
        origin = 0.0
        if attempt == min(by_attempt) and submitted_at is not None and process_start is not None:
            origin = process_start - submitted_at
        segments: list[dict[str, Any]] = []
        if origin > 0:
            segments.append({"name": "launch", "start_s": 0.0, "seconds": round(origin, 6)})
        prev = 0.0
        compiled = phases.get("compiled")
        compile_end = float(compiled["seconds"]) if compiled else None
        parallel: list[dict[str, Any]] = []
        for phase, label in _SEGMENTS:
            found = phases.get(phase)
            if found is None:
                continue
            ph = found
            at = float(ph["seconds"])
            begin = prev
            if phase == "first_step" and compile_end is not None and compile_end > prev:
                # The first step could start only once compiled: the wait is a named segment,
                # so the segments cover the whole span to the first step.
                segments.append({"name": "waiting for compile", "start_s": round(origin + prev, 6),
                                 "seconds": round(compile_end - prev, 6), "wait": True})
                begin = compile_end
            if phase == "restored" and ph.get("step") is not None:
                label = f"restore step {ph['step']}"
            segments.append({"name": label, "start_s": round(origin + begin, 6),
                             "seconds": round(max(0.0, at - begin), 6)})
            prev = max(prev, at)
            if phase in ("restored", "initialized") and compile_end is not None and compiled:
                began = compiled.get("began")
                began = float(began) if isinstance(began, int | float) else None
                parallel.append({
                    # Loaded from the workload's executable cache: nothing was compiled.
                    "name": ("executables loaded" if compiled.get("source") == "loaded"
                             else "compile"),
                    "start_s": round(origin + (began if began is not None else compile_end), 6),
                    "seconds": round(compile_end - began, 6) if began is not None else None,
                    "waited_s": round(max(0.0, compile_end - at), 6)})
        first = phases.get("first_step")
        out.append({
            "attempt": attempt,
            "basis": "submit" if origin > 0 else "process start",
            "process_start_s": round(origin, 6),
            "to_first_step_s": round(origin + float(first["seconds"]), 6) if first else None,
            "segments": segments,
            "parallel": parallel,
        })
    return out


def format_startup(timeline: dict[str, Any]) -> str:
    """One line: 'startup 5.2s to step 1: launch 0.6s, imports 2.0s, ...; compile 1.2s
    beside them (first step waited 0.1s for it)'."""
    parts = [f"{s['name']} {_dur(s['seconds'])}" for s in timeline["segments"]]
    waited = any(s.get("wait") for s in timeline["segments"])
    total = timeline.get("to_first_step_s")
    # Goodput's "startup" stops where the first step starts and the compile it waited for
    # is its "compilation": this span is both, so say so (two "startup" figures otherwise).
    both = "; goodput's startup + compilation" if total is not None and not timeline["attempt"] else ""
    head = (f"{_dur(total)} to the first step" if total is not None
            else "no first step yet") + f" (from {timeline['basis']}{both})"
    if timeline["attempt"]:
        head = f"attempt {timeline['attempt']}: {head}"
    text = head + (": " + ", ".join(parts) if parts else "")
    for p in timeline.get("parallel", []):
        if p.get("seconds") is not None:
            # Its own span, overlapping the segments: what the main path waited for is the
            # "waiting for compile" segment, never counted twice.
            text += (f"; {p['name']} ran {_dur(p['seconds'])} in a thread alongside"
                     + ("" if waited else ", no wait"))
    return text


def _stall_per_execution(rec: RunRecord, median: float | None) -> list[float]:
    """Seconds of checkpoint stall inside each kept step's time.

    Step records that carry ``checkpoint_blocked_s`` say it exactly. A log that says which
    step absorbed a stall (MaxText: the step after the save, ``rec.absorbed_stalls``) puts
    it there; a stall whose absorbing step never ran (a save at the last step) stays
    between steps. For xrun's own log lines only the save's step is known: the stall is
    put in the step after the save, or the save's own step, whichever took that much
    longer than a steady step; a stall found in neither happened between steps (the time
    gaps hold it). "exit_wait" is never a stall: no step waits for it.
    """
    steps = rec.steps
    stalls = [b if b > 0 else 0.0 for b in steps.blocked]
    if any(stalls):
        return stalls
    index = {(a, s): i for i, (s, a) in enumerate(zip(steps.step, steps.attempt, strict=True))}
    for key, seconds in rec.absorbed_stalls.items():
        i = index.get(key)
        if i is not None and math.isfinite(steps.seconds[i]):
            stalls[i] += min(seconds, max(0.0, steps.seconds[i]))
    per_save: dict[tuple[int, int], float] = {}
    for ev in rec.checkpoints:
        if ev["event"] in ("blocked", "waited") and ev.get("seconds") and "absorbed_by" not in ev:
            key = (ev["attempt"], ev["step"])
            per_save[key] = per_save.get(key, 0.0) + ev["seconds"]
    base = median or 0.0
    for (attempt, step), seconds in per_save.items():
        for candidate in (step + 1, step):
            i = index.get((attempt, candidate))
            if i is not None and steps.seconds[i] - base >= 0.5 * seconds:
                stalls[i] += min(seconds, max(0.0, steps.seconds[i] - base))
                break
    return stalls


def _origin(rec: RunRecord) -> tuple[float | None, str]:
    """When the run started, as precisely as the records allow."""
    if rec.submitted_at is not None:
        return rec.submitted_at, "submit"
    if rec.transitions and isinstance(rec.transitions[0].get("time"), int | float):
        return float(rec.transitions[0]["time"]), "first state transition"
    if rec.start_time is not None:
        return rec.start_time, rec.start_basis or "process start"
    if rec.log_first_time is not None:
        return rec.log_first_time, "first log line"
    return None, "step times only"


def _end(rec: RunRecord, transitions: list[dict[str, Any]], per_attempt: dict[int, dict[str, float]]) -> float | None:
    for t in reversed(transitions or []):
        if t.get("state") in ("Succeeded", "Failed", "Deleted") and isinstance(t.get("time"), int | float):
            return float(t["time"])
    if rec.end_time is not None:
        return rec.end_time
    if rec.log_last_time is not None and rec.log_first_time is not None:
        return rec.log_last_time
    ends = [a["end"] for a in per_attempt.values() if math.isfinite(a["end"])]
    return max(ends) if ends else None


def format_goodput(gp: dict[str, Any]) -> str:
    """One line: 'goodput 81.2% of 12m03s: productive 9m47s, startup 1m10s, ...'."""
    parts = [f"{k.replace('_', ' ')} {_dur(v)}" for k, v in gp["categories"].items() if v >= 0.0005]
    head = f"goodput {gp['goodput_pct']:.1f}% of {_dur(gp['wall_s'])}"
    if gp.get("partial"):
        head += " (step times only)"
    tail = []
    if gp.get("deferred_saves"):
        out = gp.get("deferred_storage_saves") or 0
        tail.append(f"{gp['deferred_saves']} save(s) deferred"
                    + (f", {out} while storage was unavailable" if out else ""))
    if gp.get("exit_wait_s"):
        tail.append(f"exit wait {_dur(gp['exit_wait_s'])}, not a stall")
    return head + (": " + ", ".join(parts) if parts else "") + (f" ({'; '.join(tail)})" if tail else "")


def _dur(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"
