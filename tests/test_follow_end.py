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


class Restarts:
    """A backend whose run is Running, then Restarting, then Running again (attempt 1)."""

    name, serves_logs = "fake", False

    def __init__(self, polled: threading.Event):
        self.asks, self.polled = 0, polled

    def status(self, name: str) -> BackendStatus:
        self.asks += 1
        if self.asks in (3, 5):  # a change: the hosts' lines polled meanwhile wait in the queue
            self.polled.clear()
            assert self.polled.wait(30)
        state, restarts = ("Running", 0) if self.asks <= 2 else ("Restarting", 1) if self.asks <= 4 else (
            ("Running", 1) if self.asks <= 6 else ("Succeeded", 1))
        return BackendStatus(state, restarts=restarts, hosts=[HostStatus("0-0", state)])


def test_a_state_change_is_yielded_before_it_is_recorded_and_before_waiting_lines(tmp_path, monkeypatch):
    """#40, Running again 2.15 s late at 1,024 hosts: the change reaches the screen before
    recording it in storage and before the hosts' lines polled meanwhile."""
    import orchestrator.services.follow as following

    write_stored_run(tmp_path, "r", RunShape(steps=5), state="Running")
    polled = threading.Event()
    monkeypatch.setattr(LogFollower, "poll", lambda self: (polled.set(), [("0-0", 0, "a line")])[1])
    events: list = []
    recorded: list[tuple[str, int]] = []  # (state, events yielded when it was recorded)
    real = following.record_state
    monkeypatch.setattr(following, "record_state", lambda storage, name, live, backend: (
        recorded.append((live.state, len(events))), real(storage, name, live, backend)))
    for e in follow(open_storage(str(tmp_path)), "r", Restarts(polled), logs=True, tick_seconds=0.01,
                    storage_seconds=0.01):
        events.append(e)
    states = [(type(e).__name__, e.view["state"], e.view["restarts"]) for e in events if not isinstance(e, Line)]
    for state, restarts in (("Restarting", 1), ("Running", 1)):
        first = next(i for i, e in enumerate(events) if not isinstance(e, Line)
                     and (e.view["state"], e.view["restarts"]) == (state, restarts))
        at = next(n for s, n in recorded if s == state and n > 2)  # when it was recorded
        assert first < at, (state, first, at, states)
        # the lines polled while the backend had not said it yet come after it
        assert not isinstance(events[first], Line) and isinstance(events[first + 1], Line), states
    assert [s for s, _ in recorded] == ["Running", "Restarting", "Running", "Succeeded"]
