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
- ``eta_seconds``: remaining steps times that median step time (none once ended).
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
                           "window_steps": 0, "attempt": 0}
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
    out["window_steps"] = n - start
    last_s, last_tok = steps.seconds[-1], steps.tokens[-1]
    out["last_step_seconds"] = last_s if math.isfinite(last_s) else None
    out["last_tokens_per_s"] = last_tok * devices if math.isfinite(last_tok) else None
    state = rec.state if state is None else state
    if rec.total_steps and out["step_seconds"] and not is_terminal(state) and state != UNKNOWN:
        out["eta_seconds"] = max(0, rec.total_steps - out["step"]) * out["step_seconds"]
    return out
