"""The end of a run reaches the follower before the hosts' last lines are drained (#40: at a
thousand hosts the drain's poll of every host's chunks takes seconds)."""

from __future__ import annotations

import threading

from synthetic_runs import RunShape, write_stored_run

from orchestrator.backends.base import BackendStatus, HostStatus
from orchestrator.readers.logs import LogFollower
from orchestrator.services.follow import Done, Ended, Line, Tick, follow
from xrun_contract.storage import open_storage


class EndsAfter:
    """A backend whose run is Running for ``ticks`` asks, then Succeeded."""

    name, serves_logs = "fake", False

    def __init__(self, ticks: int):
        self.ticks = ticks

    def status(self, name: str) -> BackendStatus:
        self.ticks -= 1
        state = "Running" if self.ticks >= 0 else "Succeeded"
        return BackendStatus(state, hosts=[HostStatus("0-0", state)])


def test_the_end_is_said_before_the_hosts_last_lines(tmp_path, monkeypatch):
    write_stored_run(tmp_path, "r", RunShape(steps=5), state="Running")
    drain_may_go = threading.Event()
    polls: list[int] = []

    def poll(self):
        polls.append(len(polls))
        if drain_may_go.is_set():
            return [("0-0", 0, "last line, written before the pod exited")]
        return [("0-0", 0, f"line {len(polls)}")]

    monkeypatch.setattr(LogFollower, "poll", poll)
    events = []
    for e in follow(open_storage(str(tmp_path)), "r", EndsAfter(3), logs=True,
                    tick_seconds=0.01, storage_seconds=0.01):
        events.append(e)
        if isinstance(e, Ended):
            drain_may_go.set()  # the drain runs only once the end was yielded
    kinds = [type(e) for e in events]
    assert kinds.count(Ended) == 1 and kinds[-1] is Done and Tick in kinds
    end = kinds.index(Ended)
    assert events[end].view["state"] == "Succeeded"
    after = [e.text for e in events[end:] if isinstance(e, Line)]
    assert after and after[-1] == "last line, written before the pod exited"
    assert "last line, written before the pod exited" not in [
        e.text for e in events[:end] if isinstance(e, Line)]
