"""Follow a run to its end: a stream of views (and log lines) the CLI renders.

One loop for every backend: each tick asks the backend for the run's state (recording a
change into storage), and yields the view; every ``storage_seconds`` it also folds new
metrics and checkpoints into the run's record and, with logs, yields the hosts' new lines
first. The last view is yielded as :class:`Done`.

What a tick costs does not grow with the run (the goodput, which walks every step, is
computed for the summary only, unless the screen shows it: ``live_goodput``; the stall
check and the phase's start read aggregates the step series keeps): a backend that can watch (kube:
``KubeBackend.watch``) answers from its list-then-watch cache, so a tick makes no request;
state.json is written only when the state or the restart count changes (not read back each
tick); storage is polled every ``storage_seconds``, each poll one listing of the metrics
chunks written since the last one read (``orchestrator.readers.cursor``) and one of the
checkpoints; with logs, a thread of its own lists the hosts' new chunks (from each host's
last chunk read; early in a run of many hosts on GCS, one paged listing of them all) and
reads them, spaced by how long that takes.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from orchestrator import settings
from orchestrator.backends.base import Backend, BackendStatus
from orchestrator.readers.checkpoints import list_checkpoints
from orchestrator.readers.loaders import StoredRun
from orchestrator.readers.logs import LogFollower
from orchestrator.services.runcore import record_state
from orchestrator.services.view import goodput_of, run_view
from xrun_contract import is_terminal
from xrun_contract.errors import XrunError
from xrun_contract.storage import Storage

TICK_SECONDS = 0.5
STORAGE_SECONDS = 2.0


@dataclass
class Tick:
    view: dict[str, Any]


@dataclass
class Line:
    host: str
    attempt: int
    text: str


@dataclass
class Ended:
    """The backend says the run ended; the hosts' last lines (if followed) and Done follow."""

    view: dict[str, Any]


@dataclass
class Done:
    view: dict[str, Any]


Event = Tick | Line | Ended | Done


def follow(storage: Storage, name: str, backend: Backend, *, logs: bool = False,
           warn: Callable[[str], None] | None = None,
           tick_seconds: float = TICK_SECONDS,
           storage_seconds: float = STORAGE_SECONDS, live_goodput: bool = False) -> Iterator[Event]:
    """``live_goodput``: every view carries the goodput (a screen that shows it); else
    only Done's, for the summary (``run_view``'s ``goodput``: Ended's view gives the end
    state only)."""
    watch = getattr(backend, "watch", None)
    with watch(name) if watch is not None else contextlib.nullcontext():
        yield from _follow(storage, name, backend, logs, warn, tick_seconds, storage_seconds, live_goodput)


def _follow(storage: Storage, name: str, backend: Backend, logs: bool,
            warn: Callable[[str], None] | None, tick_seconds: float,
            storage_seconds: float, live_goodput: bool) -> Iterator[Event]:
    reader = StoredRun(storage, name, charts=False)
    lines = _LinePoller(LogFollower(storage, name), storage_seconds) if logs else None
    recorded: tuple[str, int] | None = None
    polled_at = -float("inf")
    checkpoints: list[Any] = []
    floor = settings.stall_floor()
    try:
        while True:
            live = _ask(backend, name, warn)
            changed = live is not None and (live.state, live.restarts) != recorded
            ended = live is not None and is_terminal(live.state)
            # A change goes on screen first, as soon as the backend says it: recording it
            # (a read and two writes of storage), the hosts' lines polled meanwhile (at a
            # thousand hosts, ten thousand lines every few seconds), the storage poll and the
            # hosts' last lines (a whole poll of every host's chunks: seconds at a thousand
            # hosts) come after it, as Ended says for the end.
            if ended and lines is not None:
                yield Ended(run_view(storage, reader.rec, live, checkpoints=checkpoints, goodput=live_goodput))
            elif changed and not ended and recorded is not None:  # (the first view: after the poll below)
                yield Tick(run_view(storage, reader.rec, live, checkpoints=checkpoints, stall_floor=floor,
                                    goodput=live_goodput))
            if changed:
                assert live is not None
                record_state(storage, name, live, backend.name)
                recorded = (live.state, live.restarts)
            now = time.monotonic()
            if lines is not None:
                yield from lines.take()
            if ended or now - polled_at >= storage_seconds:
                polled_at = now
                reader.poll()
                checkpoints = list_checkpoints(storage, name)
            view = run_view(storage, reader.rec, live, checkpoints=checkpoints, stall_floor=floor,
                            goodput=live_goodput)
            if is_terminal(view["state"]):
                if not live_goodput:  # the summary's
                    view["goodput"] = goodput_of(reader.rec)
                if lines is not None:  # the last chunks are written before the pods exit
                    yield from lines.last()
                yield Done(view)
                return
            yield Tick(view)
            time.sleep(tick_seconds)
    finally:
        if lines is not None:
            lines.stop.set()


class _LinePoller:
    """Every host's new log lines, polled from storage in a thread of its own: a poll makes a
    listing per host (or one of every chunk, a request per 1,000), which at a thousand hosts
    takes longer than a tick, and must not hold up the state's ticks. Polls are spaced by
    ``every`` or by four times what the last one took, whichever is longer."""

    def __init__(self, follower: LogFollower, every: float):
        self.follower, self.every = follower, every
        self.q: queue.Queue[Line | BaseException] = queue.Queue()
        self.stop = threading.Event()
        self.idle = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True, name="xrun-follow-logs")
        self.thread.start()

    def _poll(self) -> None:
        with self.idle:
            for host, attempt, text in self.follower.poll():
                self.q.put(Line(host, attempt, text))

    def _run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                self._poll()
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
                self.q.put(e)
                return
            self.stop.wait(max(self.every, 4 * (time.monotonic() - started)))

    def take(self) -> Iterator[Line]:
        while True:
            try:
                item = self.q.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def last(self) -> Iterator[Line]:
        """Everything up to now: the poll under way ends, one more is made."""
        self.stop.set()
        self.thread.join()
        yield from self.take()
        self._poll()
        yield from self.take()


def _ask(backend: Backend, name: str, warn: Callable[[str], None] | None) -> BackendStatus | None:
    """The backend's view, or None (``warn`` hears why: storage then speaks)."""
    try:
        return backend.status(name)
    except XrunError as e:
        if warn:
            warn(f"{backend.name} backend: {e}; showing what storage says")
        return None
