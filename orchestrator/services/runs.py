"""The run lifecycle as services: render, submit, observe, status, list, checkpoints, delete.

The CLI and ``nightly`` both call these; nothing here prints or parses flags. Every
failure is an :class:`~xrun_contract.errors.XrunError` carrying its exit code. Whatever
the backend, its view of a run is recorded into ``state.json`` the same way
(:func:`observe`), so status, list and reports read a run from storage alone after the
pods, the processes or the JobSet are gone.

One name for callers, four modules along the lifecycle's seams: ``runcore`` (backends,
stored records, state recording), ``submit`` (render, submit, resume), ``observe``
(status, wait, a followed run's refresh) and ``listing`` (list, filters, checkpoints,
delete and purge).
"""

from __future__ import annotations

from orchestrator.services import code
from orchestrator.services.listing import (
    Deleted,
    RunFilter,
    checkpoints,
    delete,
    list_runs,
    matches,
    parse_selector,
    purge_run,
    stop,
)
from orchestrator.services.observe import STALLED, WaitOutcome, live_view, status, wait
from orchestrator.services.runcore import (
    backend_for,
    backend_for_spec,
    backend_of,
    dump_yaml,
    observe,
    record_state,
    root_hint,
    run_info,
    run_labels,
)
from orchestrator.services.submit import (
    RESUME_LOCK_STALE_S,
    SHELL_OPERATORS,
    Submitted,
    admit,
    check_workload_args,
    dry_run,
    render,
    render_for_submit,
    resume,
    store_run,
    submit,
    with_attempt_base,
    workload_train_args,
)

__all__ = [
    "RESUME_LOCK_STALE_S", "SHELL_OPERATORS", "STALLED", "Deleted", "RunFilter",
    "Submitted", "WaitOutcome", "admit", "backend_for", "backend_for_spec", "backend_of",
    "check_workload_args", "checkpoints", "dry_run", "code", "delete", "dump_yaml", "list_runs", "live_view",
    "matches", "observe", "parse_selector", "purge_run", "record_state", "render",
    "render_for_submit", "resume", "root_hint", "run_info", "run_labels", "status", "stop",
    "store_run", "submit", "wait", "with_attempt_base", "workload_train_args",
]
