"""Read a run as it is now: ``status``'s whole view, ``wait`` for its end, and a followed
run's refresh; each asks the backend and records what it says (``runcore.observe``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from orchestrator import settings
from orchestrator.backends.base import Backend
from orchestrator.background import Background
from orchestrator.readers.checkpoints import list_checkpoints
from orchestrator.readers.figures import stall
from orchestrator.readers.loaders import StoredRun, apply_state, corrupt_line, read_stored_run
from orchestrator.readers.record import RunRecord
from orchestrator.services.runcore import (
    _backend_for_run,
    _read,
    _read_record,
    _says,
    backend_of,
    observe,
    run_info,
)
from orchestrator.services.view import run_view
from xrun_contract import (
    FAILED,
    SUCCEEDED,
    Layout,
    check_run_name,
    is_terminal,
)
from xrun_contract.errors import XrunError
from xrun_contract.storage import Storage

# ---------------------------------------------------------------------------------------
# Reading runs


def status(storage: Storage, name: str, context: str | None = None,
           namespace: str | None = None, warn: Any = None) -> dict[str, Any]:
    """Everything known about a run (the dict ``xrun status -o json`` prints). A cluster
    run whose state.json says it succeeded or failed is over: its backend is not asked (no
    JobSet or pod listing); ``record_state`` recorded its hosts when it ended. (A local
    run's backend is asked: it is cheap, and only it knows what a lost supervisor left.)

    A cluster is asked in a thread while storage is read (metrics, checkpoints): the API
    server's answer (a LIST of every pod: 37 MB at 1,024 pods) and storage's come in
    together rather than one after the other; so do run.json and state.json, and the
    metrics and the checkpoints. ``warn`` hears each corrupt record of the run."""
    check_run_name(name)
    state_read = Background(_read_record, storage, Layout.state(name))  # beside run.json's
    run_read = _read_record(storage, Layout.run_json(name))
    records = (run_read, state_read.result())
    (run, run_problem), (recorded, state_problem) = records
    if run is None and not run_problem and recorded is None and not state_problem:
        run_info(storage, name)  # no such run: the message every command gives
    backend = _backend_for_run(run or {}, storage, context, namespace)
    recorded = recorded or {}
    hosts = recorded.get("hosts") or {}
    ended = (backend.name != "local" and not (run_problem or state_problem)
             and recorded.get("state") in (SUCCEEDED, FAILED)
             and all((h or {}).get("state") not in ("Running", "Pending") for h in hosts.values()))
    asking = None if ended or backend.name == "local" else Background(backend.status, name)
    listing = Background(list_checkpoints, storage, name)
    rec = read_stored_run(storage, name, records=records)
    checkpoints = listing.result()
    if warn is not None:
        for problem in rec.problems:
            warn(corrupt_line(name, problem))
    if ended:
        live = None
    elif asking is None:
        live = observe(storage, name, backend, warn, recorded=recorded)
    else:
        live = observe(storage, name, backend, warn, asked=asking.result, recorded=recorded)
    if live is not None and not _says(recorded, live):
        state = _read(storage, Layout.state(name))  # observe recorded the change: its transition
        if state is not None:
            apply_state(rec, state)
    return run_view(storage, rec, live, checkpoints=checkpoints, stall_floor=settings.stall_floor())


STALLED = "Stalled"  # wait's and the nightly's outcome for a run that stopped making progress


@dataclass
class WaitOutcome:
    state: str  # a terminal state, or STALLED
    stall: dict[str, Any] | None = None  # figures.stall's finding when STALLED


def wait(storage: Storage, name: str, timeout_s: float | None = None, context: str | None = None,
         namespace: str | None = None, warn: Any = None, poll_seconds: float = 1.0) -> WaitOutcome | None:
    """The run's end state once it ended, STALLED once it stopped making progress
    (``figures.stall``: it is left running), or None when ``timeout_s`` passed first.

    The backend is asked every ``poll_seconds``; the run's metrics (for the stall check)
    are read every tenth of the stall floor, 1 to 10 s, so an hours-long wait lists a
    long run's metrics a few times a minute, not every second."""
    run_info(storage, name)  # no such run: exit 2 at once
    floor = settings.stall_floor()
    metrics_every = max(poll_seconds, min(10.0, floor / 10))
    backend = backend_of(storage, name, context, namespace)
    reader = StoredRun(storage, name)
    metrics_at = -float("inf")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    procs = getattr(backend, "live_processes", None)
    lingering = False  # said once: the run ended, but processes of it still live
    while True:
        live = observe(storage, name, backend, warn)
        due = time.monotonic() - metrics_at >= metrics_every
        rec: RunRecord | None = None
        if due or live is None:
            try:
                rec = reader.poll(metrics=due)
                metrics_at = time.monotonic() if due else metrics_at
            except XrunError:
                if live is None:  # neither answers: exit 3
                    raise
                # the backend still knows the state; the stall check waits for storage
        state = live.state if live is not None else (rec.state if rec is not None else "") or ""
        pids = procs(name) if procs is not None and is_terminal(state) else []
        if is_terminal(state) and not pids:
            return WaitOutcome(state)
        if pids and not lingering and warn:
            lingering = True  # the end is not said while any process of the run lives
            warn(f"run {name} is recorded {state}, but {len(pids)} process(es) of it still live "
                 f"(pids {', '.join(map(str, pids[:8]))}); waiting for them to end ('xrun delete {name}' stops them)")
        found = None if pids or rec is None or not due else stall(
            rec, state, live.restarts if live is not None else rec.restarts, time.time(), floor)
        if found is not None:
            return WaitOutcome(STALLED, found)
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(poll_seconds if deadline is None else max(0.0, min(poll_seconds, deadline - time.monotonic())))


def live_view(reader: StoredRun, backend: Backend, warn: Any = None, goodput: bool = True) -> dict[str, Any]:
    """One refresh of a followed run: the backend's view, then storage's (incrementally);
    ``goodput``: as ``run_view`` takes it."""
    live = observe(reader.storage, reader.name, backend, warn)
    return run_view(reader.storage, reader.poll(), live, stall_floor=settings.stall_floor(), goodput=goodput)


