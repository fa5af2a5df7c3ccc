"""A run's log lines, whatever the backend: storage for what the pods no longer hold, the
live pods (where the backend serves logs) for the rest.

Restart attempts whose pods are gone (or every attempt, when the JobSet is gone or the
backend keeps no pods) come from the chunks the pod's log shipper shipped to storage; attempts
with live pods are streamed from them. Following ends when the run is over.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from orchestrator.backends.base import Backend, LogItem
from orchestrator.readers.logs import LogFollower
from orchestrator.services.runs import observe
from xrun_contract import is_terminal
from xrun_contract.errors import XrunError
from xrun_contract.storage import Storage

POLL_SECONDS = 0.5


def _tail(items: list[LogItem], tail: int) -> list[LogItem]:
    """The last ``tail`` lines of each host."""
    per_host: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        per_host.setdefault(item[0], []).append(i)
    keep = {i for idx in per_host.values() for i in (idx[-tail:] if tail else [])}
    return [x for i, x in enumerate(items) if i in keep]


def log_lines(storage: Storage, name: str, backend: Backend, *, follow: bool = False,
              hosts: set[str] | None = None, since_seconds: float | None = None,
              tail: int | None = None,
              warn: Callable[[str], None] | None = None) -> Iterator[LogItem]:
    """(host, attempt, line) of a run, in order; with ``follow`` until the run ends."""
    live: set[int] = set()
    from_pods = False
    if backend.serves_logs:
        try:
            live = backend.live_attempts(name)
            status = backend.status(name) if follow and not live else None
        except XrunError as e:
            if warn:
                warn(f"{backend.name} backend: {e}; showing the logs in storage")
            live, status = set(), None
        from_pods = bool(live) or (status is not None and not is_terminal(status.state))
    first_live = min(live) if live else None
    since_ts = time.time() - since_seconds if since_seconds is not None else None
    follower = LogFollower(storage, name, hosts, since_ts)
    stored = [x for x in follower.poll() if not from_pods or first_live is None or x[1] < first_live]
    if tail is not None and live:
        stored = []  # the last lines of each host are its live pod's
    if tail is not None:
        stored = _tail(stored, tail)
    yield from stored
    if from_pods:
        yield from backend.stream_logs(
            name, follow=follow, since_seconds=int(since_seconds) if since_seconds is not None else None,
            tail_lines=tail, hosts=hosts,
        )
        return
    if not follow:
        return
    while True:  # storage only: poll new chunks until the run is over (or the backend lost it)
        status = observe(storage, name, backend, warn)
        yield from follower.poll()
        if status is None or is_terminal(status.state):
            yield from follower.poll()  # the last chunks are written before the pods exit
            return
        time.sleep(POLL_SECONDS)
