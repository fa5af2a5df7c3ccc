"""Follow a run to its end: a stream of views (and log lines) the CLI renders.

One loop for every backend: each tick observes the backend (recording its state into
storage), folds new metrics into the run's record, and yields the view; with logs, the
hosts' new lines come first. The last view is yielded as :class:`Done`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from orchestrator.backends.base import Backend
from orchestrator.readers.loaders import StoredRun
from orchestrator.readers.logs import LogFollower
from orchestrator.services.runs import live_view
from xrun_contract import is_terminal
from xrun_contract.storage import Storage

TICK_SECONDS = 0.5


@dataclass
class Tick:
    view: dict[str, Any]


@dataclass
class Line:
    host: str
    attempt: int
    text: str


@dataclass
class Done:
    view: dict[str, Any]


Event = Tick | Line | Done


def follow(storage: Storage, name: str, backend: Backend, *, logs: bool = False,
           warn: Callable[[str], None] | None = None,
           tick_seconds: float = TICK_SECONDS) -> Iterator[Event]:
    reader = StoredRun(storage, name)
    follower = LogFollower(storage, name) if logs else None
    while True:
        view = live_view(reader, backend, warn)
        if follower is not None:
            for host, attempt, text in follower.poll():
                yield Line(host, attempt, text)
        if is_terminal(view["state"]):
            if follower is not None:  # the last chunks are written before the pods exit
                for host, attempt, text in follower.poll():
                    yield Line(host, attempt, text)
            yield Done(view)
            return
        yield Tick(view)
        time.sleep(tick_seconds)
