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


class RestartingApi:
    """A kube-like backend (pods serve logs) whose API server is restarting for its first
    ``down`` asks (exit code 3, as kube's ApiUnavailable), then serves one live pod's lines."""

    name, serves_logs = "fake-kube", True

    def __init__(self, down: int):
        self.down, self.asks = down, 0

    def _ask(self) -> None:
        from xrun_contract.errors import EXIT_UNREACHABLE, XrunError

        self.asks += 1
        if self.asks <= self.down:
            raise XrunError("cannot reach the Kubernetes API: Connection refused", EXIT_UNREACHABLE)

    def live_attempts(self, name: str) -> set[int]:
        self._ask()
        return {0}

    def status(self, name: str) -> BackendStatus:
        self._ask()
        return BackendStatus("Running", hosts=[HostStatus("0-0", "Running")])

    def stream_logs(self, name, follow=False, since_seconds=None, tail_lines=None, hosts=None):
        yield from (("0-0", 0, f"n={n}") for n in range(3))


def test_logs_follow_started_during_an_api_outage_waits_for_the_pods(tmp_path, monkeypatch):
    """`xrun logs -f` started while the API server restarts: it used to read storage only
    (the pods' lines never shown) and end at once, "ended: Pending"; it waits the outage out."""
    from orchestrator.services import logs as logs_service

    monkeypatch.setattr("time.sleep", lambda s: None)
    write_stored_run(tmp_path, "r", RunShape(steps=0), state="Pending")
    st = open_storage(str(tmp_path))
    said: list[str] = []
    backend = RestartingApi(down=3)
    got = [x[3] for x in logs_service.stamped_log_lines(st, "r", backend, follow=True, warn=said.append)]
    assert got == ["n=0", "n=1", "n=2"], (got, said)
    assert len(said) == 1 and "waiting for it" in said[0], said


def test_a_storage_follow_waits_out_an_outage_and_gives_up_with_exit_3(tmp_path, monkeypatch):
    """A follow reading storage (the backend serves no logs) whose backend cannot be asked
    goes on until it can, or until the outage passes its bound: then exit 3, not a quiet end."""
    import pytest

    from orchestrator.services import logs as logs_service
    from xrun_contract.errors import XrunError

    clock = iter(range(0, 10_000, 50))
    monkeypatch.setattr(logs_service.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(logs_service.time, "sleep", lambda s: None)
    write_stored_run(tmp_path, "r", RunShape(steps=0), state="Running")
    st = open_storage(str(tmp_path))
    backend = RestartingApi(down=10**6)
    backend.serves_logs = False
    with pytest.raises(XrunError) as info:
        list(logs_service.stamped_log_lines(st, "r", backend, follow=True))
    assert info.value.exit_code == 3 and backend.asks > 3
