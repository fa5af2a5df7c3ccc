"""What ``xrun status`` (and the live follow of ``submit``/``logs -f``) shows about a run.

Built from the one :class:`RunRecord` a run reads back as (``readers.loaders.StoredRun``),
the backend's live view when there is one, and the checkpoint listing. The result is a
plain dict: what ``-o json|yaml`` prints and what the CLI's screen renders. A service, not
a reader: it joins what the readers read with the analysis (goodput), and readers never
import analysis.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.backends.base import BackendStatus
from orchestrator.readers import figures
from orchestrator.readers.checkpoints import latest_committed, list_checkpoints
from orchestrator.readers.profile import with_top_ops
from orchestrator.readers.record import RunRecord
from xrun_contract import (
    DELETED,
    FAILED,
    PENDING,
    RESTARTING,
    RUNNING,
    SUCCEEDED,
    UNKNOWN,
    Layout,
    is_terminal,
)
from xrun_contract.storage import Storage


def progress(rec: RunRecord) -> dict[str, Any]:
    """Step, loss, throughput (all devices) and ETA: :func:`orchestrator.readers.figures.progress`."""
    return figures.progress(rec)


def phase(rec: RunRecord, state: str, restarts: int, hosts: list[dict[str, Any]],
          checkpoints_in_progress: list[int]) -> str:
    """What the run is doing now, in words: scheduling / starting / the workload's startup
    activity (``PHASE_ACTIVITY``: initializing distributed, restoring step N, compiling) /
    training / checkpointing / restarting attempt K; the state itself once it ended."""
    if is_terminal(state) or state == UNKNOWN:
        return state.lower()
    if state == RESTARTING:
        return f"restarting attempt {restarts}"
    attempt = restarts
    started = [h for h in hosts if h.get("state") in (RUNNING, SUCCEEDED, FAILED)]
    if state == PENDING and not started:
        return "scheduling"
    steps = rec.steps
    trained = bool(len(steps)) and steps.attempt[-1] >= attempt
    ph = rec.phase if rec.phase and rec.phase.get("attempt", 0) >= attempt else None
    if not trained and ph is None:
        return "starting"
    if not trained and ph is not None and ph.get("activity") not in ("training", "first step done"):
        return str(ph.get("activity") or "starting")
    # Checkpointing while no step finished after the save began (training waits on it, or
    # the last save commits before exit); an async write under later steps is "training".
    latest = steps.step[-1] if len(steps) else None
    if checkpoints_in_progress and latest is not None and latest <= max(checkpoints_in_progress):
        return "checkpointing"
    last = next((c for c in reversed(rec.checkpoints) if c.get("attempt", 0) >= attempt), None)
    if last and last["event"] == "exit_wait":
        return "checkpointing"
    return "training"


def host_reason(h: dict[str, Any]) -> str:
    """Why a host is where it is, when the backend gave no reason: kubelet's terminated
    reasons (``Completed``, ``Error``, ``OOMKilled``) and the exit code's signal."""
    if h.get("reason"):
        return str(h["reason"])
    code = h.get("exit_code")
    if code is None:
        return ""
    if code == 0:
        return "Completed"
    sig = _signal_name(int(code))
    return f"Error: exit code {code}" + (f" ({sig})" if sig else "")


def _signal_name(exit_code: int) -> str:
    """'SIGKILL' for 137 (128 + N, as kubelet reports a signalled container), else ''."""
    import signal

    try:
        return signal.Signals(exit_code - 128).name if exit_code > 128 else ""
    except ValueError:
        return ""


def _state_from_end(rec: RunRecord) -> str | None:
    if rec.exit_code is None:
        return None
    return SUCCEEDED if rec.exit_code == 0 else FAILED


def run_view(storage: Storage, rec: RunRecord, live: BackendStatus | None = None,
             checkpoints: list[Any] | None = None,
             stall_floor: float = figures.STALL_FLOOR_S, goodput: bool = True) -> dict[str, Any]:
    """Everything known about a run, as a plain dict (``checkpoints``: a listing already
    made, else one is made here; ``stall_floor``: the least silence that is a stall,
    ``figures.stall``). ``goodput=False``: None in its place, for a live screen that does
    not show it: it walks every step of the run, each tick of a follow that would make a
    20,000-step run's follow cost (and allocate) 20,000 rows twice a second."""
    if checkpoints is None:
        checkpoints = list_checkpoints(storage, rec.name)
    latest = latest_committed(checkpoints)
    state_info = rec.state_info
    if live is not None:
        current, restarts, message = live.state, live.restarts, live.message
        hosts = [h.as_dict() for h in live.hosts]
        events = list(live.events)
    else:
        current = rec.state or _state_from_end(rec) or PENDING
        restarts, message = rec.restarts, str(state_info.get("message", ""))
        hosts = [{"host": h, **v} for h, v in sorted((state_info.get("hosts") or {}).items())]
        events = []
    if rec.problems:  # a corrupt run.json or state.json: what list, logs, checkpoints say too
        current, message = UNKNOWN, "; ".join(rec.problems)
    rec.state = current  # the ETA and goodput read the state as shown
    rec.profile = with_top_ops(storage, rec.name, rec.profile)  # read once per record
    for h in hosts:
        if current == DELETED and h.get("state") == FAILED and h.get("exit_code") in (143, 137):
            # Stopped by the deletion (SIGTERM, or SIGKILL after the grace period): not a
            # failure of the host.
            h["state"] = DELETED
            h["reason"] = f"stopped by xrun delete ({_signal_name(int(h['exit_code']))})"
        h["reason"] = host_reason(h)
    in_progress = [c.step for c in checkpoints if c.state != "committed"]
    view: dict[str, Any] = {
        "name": rec.name,
        "state": current,
        "restarts": restarts,
        "message": message,
        "events": events,
        "backend": rec.run_info.get("backend", state_info.get("backend", "")),
        "accelerator": rec.spec.get("accelerator", ""),
        "submitted_at": rec.submitted_at,
        "storage": storage.url(Layout.run(rec.name)),
        "profile": rec.profile,  # the workload's jax.profiler trace (profile=START:STEPS)
        "code": rec.code or None,  # the shipped working tree (workdir), as run.json records it
        "hosts": hosts,
        **progress(rec),
        "latest_checkpoint": latest.as_dict() if latest else None,
        "checkpoints_in_progress": in_progress,
        "phase": phase(rec, current, restarts, hosts, in_progress),
        "phase_since": None,
        "transitions": list(state_info.get("transitions", [])),
        "goodput": goodput_of(rec) if goodput else None,
        "stall": figures.stall(rec, current, restarts, time.time(), stall_floor),
    }
    view["phase_since"] = phase_since(rec, view)
    return view


def phase_since(rec: RunRecord, view: dict[str, Any]) -> float | None:
    """When the run entered the phase the view shows (unix time; None once it ended), so
    the live line can say how long it has been in it."""
    ph, restarts = str(view.get("phase") or ""), view.get("restarts") or 0
    if is_terminal(view["state"]) or view["state"] == UNKNOWN:
        return None
    transitions = view.get("transitions") or []

    def last_transition(state: str) -> float | None:
        times = [t.get("time") for t in transitions if t.get("state") == state]
        return float(times[-1]) if times and isinstance(times[-1], int | float) else None

    if ph == "scheduling":
        return rec.submitted_at
    if ph.startswith("restarting"):
        return last_transition(RESTARTING)
    if ph == "starting":
        return last_transition(RUNNING) or rec.submitted_at
    if ph in ("training", "checkpointing"):
        began = [p["time"] for p in rec.phases
                 if p.get("phase") == "compiled" and p.get("attempt", 0) >= restarts and p.get("time")]
        if ph == "training":
            return max(began) if began else rec.steps.first_time_from(restarts)
        return None
    if rec.phase and rec.phase.get("time") is not None:
        return float(rec.phase["time"])
    return None


def goodput_of(rec: RunRecord) -> dict[str, Any] | None:
    """Wall-time breakdown (None while there is nothing to break down)."""
    from orchestrator.analysis.goodput import goodput  # statistics and all: when asked

    if not rec.steps.count:
        return None
    try:
        return goodput(rec)
    except Exception:  # noqa: BLE001 - a partial run must still show its status
        return None
