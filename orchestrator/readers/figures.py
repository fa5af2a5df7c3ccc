"""The figures xrun prints about a run's progress, each defined once, here.

``status``, ``list``, ``submit --follow``, ``logs -f`` and the follow summary all show a
run's step, loss, tokens/s and ETA; they all take them from :func:`progress` over the one
:class:`~orchestrator.readers.record.RunRecord` a run reads back as, so the same stored run
gives the same figures in each. What each figure is:

- ``step``, ``loss``: the newest step record, whole (both from the same record).
- ``step_seconds``: the median step time over the last ``WINDOW`` steps of the newest
  attempt (a checkpoint stall or one slow step does not move it).
- ``tokens_per_s``: tokens of one step over all devices divided by that median step time
  (so it is the rate the median implies, never one step's).
- ``eta_seconds``: remaining steps times the window's *mean* step time (none once ended):
  a save's stall or a slow input batch in the window will come again, and the median, kind
  to them, made the ETA too kind (#39: 3,943 tokens/s shown where 3,530 was the rate).
  ``eta_step_seconds`` is that mean.
- ``last_step_seconds`` / ``last_tokens_per_s``: the newest step's own figures.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from orchestrator.readers.record import RunRecord
from xrun_contract import UNKNOWN, is_terminal

WINDOW = 20  # steps the live step time, tokens/s and ETA are smoothed over
WINDOW_TEXT = f"median of the last {WINDOW} steps"


def window_text(steps: int | None = None, short: bool = False) -> str:
    """What the live step time is a median of, with the true count: 'median of the last 20
    steps', 'median of the last 10 steps' for a 10-step run ('10-step median' when short);
    ``steps`` is the view's ``window_steps`` (None: the full window)."""
    n = WINDOW if steps is None or steps <= 0 or steps > WINDOW else int(steps)
    if short:
        return f"{n}-step median"
    return f"median of the last {n} steps" if n > 1 else "the last step"


def window_figures(seconds: list[float], tokens_per_step: list[float]) -> tuple[float | None, float | None]:
    """(median step seconds, tokens/s it implies) over the given window's finite values."""
    secs = [s for s in seconds if math.isfinite(s) and s > 0]
    if not secs:
        return None, None
    med = statistics.median(secs)
    toks = [t for t in tokens_per_step if math.isfinite(t) and t > 0]
    return med, (statistics.median(toks) / med if toks else None)


def progress(rec: RunRecord, state: str | None = None) -> dict[str, Any]:
    """Step, loss, step time, tokens/s (all devices) and ETA of ``rec`` (see the module)."""
    out: dict[str, Any] = {"step": None, "total_steps": rec.total_steps, "loss": None,
                           "tokens_per_s": None, "step_seconds": None, "eta_seconds": None,
                           "last_step_seconds": None, "last_tokens_per_s": None,
                           "eta_step_seconds": None, "window_steps": 0, "attempt": 0}
    steps = rec.steps
    if not len(steps):
        return out
    loss = steps.loss[-1]
    out["step"], out["attempt"] = steps.step[-1], steps.attempt[-1]
    out["loss"] = loss if math.isfinite(loss) else None
    devices = rec.devices or 1
    # The window: the newest attempt's last WINDOW steps (a restart's compile step and the
    # previous attempt's rate are not this attempt's).
    n = len(steps)
    start = max(0, n - WINDOW)
    while start < n - 1 and steps.attempt[start] != steps.attempt[-1]:
        start += 1
    secs = list(steps.seconds[start:])
    per_step = [tok * sec * devices for tok, sec in zip(steps.tokens[start:], secs, strict=True)]
    out["step_seconds"], out["tokens_per_s"] = window_figures(secs, per_step)
    finite = [x for x in secs if math.isfinite(x) and x > 0]
    out["eta_step_seconds"] = statistics.fmean(finite) if finite else None
    out["window_steps"] = n - start
    last_s, last_tok = steps.seconds[-1], steps.tokens[-1]
    out["last_step_seconds"] = last_s if math.isfinite(last_s) else None
    out["last_tokens_per_s"] = last_tok * devices if math.isfinite(last_tok) else None
    state = rec.state if state is None else state
    if rec.total_steps and out["eta_step_seconds"] and not is_terminal(state) and state != UNKNOWN:
        out["eta_seconds"] = max(0, rec.total_steps - out["step"]) * out["eta_step_seconds"]
    return out


# ---------------------------------------------------------------------------------------
# Stalls: a live run that stopped making progress.

STALL_STEP_FACTOR = 10  # x the slowest step seen (each attempt's first step left out)
STALL_SAVE_FACTOR = 2  # x the longest checkpoint save seen
STALL_STARTUP_FACTOR = 2  # x the longest start-up seen, while an attempt has no step yet
STALL_FLOOR_S = 600.0  # never less than this (XRUN_STALL_SECONDS sets it; 0 turns it off)
STALL_RULE = (f"no progress record (step, checkpoint event, start-up phase, restart) for longer than "
              f"max({STALL_STEP_FACTOR} x the slowest step, {STALL_SAVE_FACTOR} x the longest save, "
              f"{STALL_STARTUP_FACTOR} x the longest start-up while a restart has no step yet, the floor)")


def _finite(values: Any) -> list[float]:
    return [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]


def stall(rec: RunRecord, state: str, restarts: int, now: float,
          floor: float = STALL_FLOOR_S) -> dict[str, Any] | None:
    """Whether a Running run stopped making progress, judged by its own times (``STALL_RULE``).

    Only a run that has logged a step is judged (before that, its own step and save times
    say nothing about how long a start-up may take), and only while it is Running (Pending
    may wait for a queue, Restarting is on its way). Silence is measured from the newest
    record of any progress, so a long save or a restart's start-up that still writes its
    phase records is not a stall; a frozen process, a hung collective or a restart that
    never reaches its first step is. None when the run is not stalled (or ``floor`` <= 0)."""
    steps = rec.steps
    if floor <= 0 or state != "Running" or not len(steps):
        return None
    last_step_time = steps.last_time()
    if last_step_time is None:
        return None  # a log without times: nothing to measure from
    activity = [last_step_time,
                *_finite(c.get("time") for c in rec.checkpoints),
                *_finite(p.get("time") for p in rec.phases),
                *_finite(t.get("time") for t in rec.transitions)]
    idle = now - max(activity)
    slowest = steps.slowest_after_first()
    slowest = 0.0 if slowest is None else slowest
    saves = _finite(c.get("seconds") for c in rec.checkpoints
                    if c.get("event") in ("committed", "blocked", "waited", "exit_wait"))
    longest_save = max(saves, default=0.0)
    terms = {f"the floor, {floor:g}s": floor,
             f"{STALL_STEP_FACTOR} x the slowest step, {slowest:.3g}s": STALL_STEP_FACTOR * slowest,
             f"{STALL_SAVE_FACTOR} x the longest save, {longest_save:.3g}s": STALL_SAVE_FACTOR * longest_save}
    if steps.attempt[-1] < restarts:  # a restart that has not logged a step yet
        startups = _finite(p.get("seconds") for p in rec.phases if p.get("phase") == "first_step")
        startup = max(startups or _finite(steps.seconds[i] for i in steps.first_rows().values()), default=0.0)
        terms[f"{STALL_STARTUP_FACTOR} x the longest start-up, {startup:.3g}s"] = STALL_STARTUP_FACTOR * startup
    limit = max(terms.values())
    if idle <= limit:
        return None
    return {"seconds": now - last_step_time, "idle_seconds": idle, "last_step": steps.step[-1],
            "limit_seconds": limit, "limit_from": max(terms, key=lambda k: terms[k]),
            "slowest_step_seconds": slowest, "longest_save_seconds": longest_save}


def stall_text(found: dict[str, Any]) -> str:
    """'no step for 2m05s (last: step 30)': a stall in one line, as status, the follow's
    progress line, wait and the nightly say it."""
    s = int(found["seconds"])
    m, sec = divmod(s, 60)
    h, m = divmod(m, 60)
    took = f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")
    return f"no step for {took} (last: step {found['last_step']})"
