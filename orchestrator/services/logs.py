"""A run's log lines, whatever the backend: storage for what the pods no longer hold, the
live pods (where the backend serves logs) for the rest.

Restart attempts whose pods are gone (or every attempt, when the JobSet is gone or the
backend keeps no pods) come from the chunks the pod's log shipper shipped to storage; attempts
with live pods are streamed from them. Following ends when the run is over.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Iterator

from orchestrator.backends.base import Backend, BackendStatus, LogItem
from orchestrator.readers.logs import (
    LogFollower,
    StampedLine,
    known_hosts,
    list_log_chunks,
    tail_lines,
)
from orchestrator.services.runcore import observe
from xrun_contract import is_terminal
from xrun_contract.errors import EXIT_UNREACHABLE, XrunError
from xrun_contract.storage import Storage

POLL_SECONDS = 0.5
# A follow whose cluster cannot be reached (its API server restarting: exit code 3) waits
# it out this long, as a pod stream already being followed does
# (backends/kube/logs.py API_RETRY_SECONDS), then gives up with exit 3. It used to end at
# once, with what storage held then: `logs -f` started during a restart printed nothing
# and "ended: Pending".
FOLLOW_OUTAGE_SECONDS = 300.0


class _Outage:
    """A run of unreachable answers while following: waited out, backing off, for
    ``FOLLOW_OUTAGE_SECONDS`` from the first; said once."""

    def __init__(self, warn: Callable[[str], None] | None):
        self.warn, self.count, self.said = warn, 0, False
        self.since: float | None = None

    def ok(self) -> None:
        self.since, self.count = None, 0

    def wait(self, what: str, error: XrunError) -> None:
        """Sleep before the next try; raise ``error`` once the outage is too long."""
        now = time.monotonic()
        self.since = now if self.since is None else self.since
        if now - self.since > FOLLOW_OUTAGE_SECONDS:
            raise error
        if self.warn and not self.said:
            self.warn(f"{what}: {error}; waiting for it (up to {FOLLOW_OUTAGE_SECONDS:.0f} s)")
            self.said = True
        self.count += 1
        time.sleep(min(0.2 * self.count, 2.0))


def _unreachable(e: XrunError) -> bool:
    return e.exit_code == EXIT_UNREACHABLE


def check_hosts(storage: Storage, name: str, hosts: set[str] | None) -> None:
    """An unknown ``--host`` is bad input (exit 2) naming the hosts that exist; nothing is
    checked before any host has logged (a pending run)."""
    if not hosts:
        return
    known = known_hosts(storage, name)
    unknown = sorted(hosts - set(known))
    if known and unknown:
        raise XrunError(f"--host: no host {', '.join(unknown)} in run {name}; "
                        f"hosts: {', '.join(known)}")


def resolve_attempt(storage: Storage, name: str, attempt: int | None, previous: bool) -> int | None:
    """``--attempt N`` / ``--previous`` (kubectl's: the attempt before the newest) checked
    against the attempts the run's hosts logged; exit 2 naming those that exist."""
    if attempt is None and not previous:
        return None
    if attempt is not None and previous:
        raise XrunError("--attempt, --previous: give only one")
    logged = sorted({c.attempt for c in list_log_chunks(storage, name)})
    if previous:
        if len(logged) < 2 and (not logged or logged[-1] == 0):
            raise XrunError(f"--previous: run {name} has not restarted (attempts logged: "
                            f"{', '.join(map(str, logged)) or 'none yet'})")
        return logged[-1] - 1
    assert attempt is not None
    if attempt < 0 or (logged and attempt not in logged):
        raise XrunError(f"--attempt: run {name} has no attempt {attempt}; attempts logged: "
                        f"{', '.join(map(str, logged)) or 'none yet'}")
    return attempt


def log_lines(storage: Storage, name: str, backend: Backend, *, follow: bool = False,
              hosts: set[str] | None = None, since_seconds: float | None = None,
              tail: int | None = None,
              warn: Callable[[str], None] | None = None) -> Iterator[LogItem]:
    """(host, attempt, line) of a run, in order; ``tail`` lines per host."""
    since = time.time() - since_seconds if since_seconds is not None else None
    for host, attempt, _t, line in stamped_log_lines(
            storage, name, backend, follow=follow, hosts=hosts, since=since,
            tail_per_host=tail, warn=warn):
        yield host, attempt, line


def stamped_log_lines(storage: Storage, name: str, backend: Backend, *, follow: bool = False,
                      hosts: set[str] | None = None, since: float | None = None,
                      tail: int | None = None, tail_per_host: int | None = None,
                      grep: re.Pattern[str] | None = None,
                      warn: Callable[[str], None] | None = None,
                      shown: Callable[[str, str], bool] | None = None,
                      exclude: re.Pattern[str] | None = None,
                      attempt: int | None = None) -> Iterator[StampedLine]:
    """(host, attempt, time, line) of a run, in order; with ``follow`` until the run ends.

    ``since`` (epoch seconds) filters per line; ``grep`` keeps matching lines, ``exclude``
    drops them (stern's ``--exclude``); ``attempt`` keeps one restart attempt's; ``tail`` is
    the last N matching (and ``shown``) lines in total (kubectl's ``--tail`` over one merged stream),
    ``tail_per_host`` the last N of each host (stern's ``--tail``). Lines from live pods are
    dated when received."""
    def keep(item: StampedLine) -> bool:
        # ``shown``: the lines the caller will print (quiet mode hides some), so --tail N
        # counts N lines the reader sees.
        return ((grep is None or grep.search(item[3]) is not None) and (since is None or item[2] >= since)
                and (exclude is None or exclude.search(item[3]) is None)
                and (attempt is None or item[1] == attempt) and (shown is None or shown(item[3], item[0])))

    live: set[int] = set()
    from_pods = False
    outage = _Outage(warn)
    while backend.serves_logs:
        try:
            live = backend.live_attempts(name)
            status = backend.status(name) if follow and not live else None
        except XrunError as e:
            if follow and _unreachable(e):  # which attempts the pods hold decides where lines come from
                outage.wait(f"{backend.name} backend", e)
                continue
            if warn:
                warn(f"{backend.name} backend: {e}; showing the logs in storage")
            live, status = set(), None
        from_pods = bool(live) or (status is not None and not is_terminal(status.state))
        break
    outage.ok()
    first_live = min(live) if live else None
    follower = LogFollower(storage, name, hosts, since)

    def stored_attempt(attempt: int) -> bool:
        return not from_pods or first_live is None or attempt < first_live

    if (tail is not None or tail_per_host is not None) and live:
        pass  # the last lines of each host are its live pod's
    elif tail is not None or tail_per_host is not None:
        # only the chunks the tail needs, newest first (follow goes on from every chunk seen)
        chunks = list_log_chunks(storage, name, hosts)
        follower.skip(chunks)  # -f goes on after them
        yield from tail_lines(storage, name, hosts=hosts, since=since, tail=tail,
                              tail_per_host=tail_per_host, keep=keep, attempts=stored_attempt,
                              chunks=chunks)
    else:
        yield from (x for x in follower.poll_stamped() if stored_attempt(x[1]) and keep(x))
    if from_pods:
        pod_tail = tail_per_host if tail_per_host is not None else tail
        since_s = int(max(0.0, time.time() - since)) if since is not None else None
        pod_items = (
            (h, a, time.time(), line) for h, a, line in backend.stream_logs(
                name, follow=follow, since_seconds=since_s, tail_lines=pod_tail, hosts=hosts))
        if tail is not None and not follow:
            got = [x for x in pod_items if keep(x)]
            yield from (got[len(got) - tail:] if tail else [])
            return
        yield from (x for x in pod_items if keep(x))
        return
    if not follow:
        return
    while True:  # storage only: poll new chunks until the run is over (or the backend lost it)
        failed: list[XrunError] = []
        status = observe(storage, name, backend, asked=functools.partial(_asked, backend, name, failed))
        yield from (x for x in follower.poll_stamped() if keep(x))
        if failed and _unreachable(failed[0]):
            outage.wait(f"{backend.name} backend", failed[0])  # not over: not known yet
            continue
        if failed and warn:
            warn(f"{backend.name} backend: {failed[0]}; showing what storage says")
        outage.ok()
        if status is None or is_terminal(status.state):
            # the last chunks are written before the pods exit
            yield from (x for x in follower.poll_stamped() if keep(x))
            return
        time.sleep(POLL_SECONDS)


def _asked(backend: Backend, name: str, failed: list[XrunError]) -> BackendStatus | None:
    """``backend.status(name)``, its error kept in ``failed`` (None then)."""
    try:
        return backend.status(name)
    except XrunError as e:
        failed.append(e)
        return None
