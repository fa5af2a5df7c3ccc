"""A long follow's cost per tick does not grow with the run (#53's soak: the follow's RSS
grew 23.9% over 20,000 steps). Each tick of ``submit --follow`` and ``logs -f`` built the
run's view, and the view walked every step: the goodput (masks and lists of every step),
the stall check (a list of every step's time) and the phase's start. Now the goodput is
the summary's only, unless the screen shows it, and the stall check and the phase's start
read aggregates the step series folds in as rows arrive. The readers' concurrent reads go
through one pool the process keeps (``orchestrator.background.io_map``), not a pool made
per poll."""

from __future__ import annotations

import math
import random
import threading

from synthetic_runs import RunShape, write_stored_run
from test_follow_end import EndsAfter

from orchestrator import background
from orchestrator.analysis import goodput as goodput_module
from orchestrator.readers.logs import LogFollower
from orchestrator.readers.record import StepSeries
from orchestrator.services.follow import Done, Tick, follow
from xrun_contract import Layout
from xrun_contract.storage import open_storage


def _brute(series: StepSeries) -> tuple[float | None, float | None, dict[int, int], dict[int, float | None]]:
    """What the live views computed before, from every kept row."""
    times = [t for t in series.time if math.isfinite(t)]
    firsts: dict[int, int] = {}
    steady = []
    for i, a in enumerate(series.attempt):
        if firsts.setdefault(a, i) != i:
            steady.append(series.seconds[i])
    finite = [s for s in steady if math.isfinite(s)]
    starts: dict[int, float | None] = {}
    for a in range(-1, 8):
        ts = [t for t, x in zip(series.time, series.attempt, strict=True) if x >= a and t == t]
        starts[a] = ts[0] if ts else None
    return (max(times) if times else None, max(finite) if finite else None, firsts, starts)


def test_the_series_aggregates_equal_a_scan_of_every_row_as_rows_arrive_and_thin():
    rng = random.Random(7)
    series = StepSeries(cap=64)  # small: the series halves several times on the way
    attempt, step = 0, 0
    for n in range(1, 600):
        if rng.random() < 0.02:
            attempt += 1
            step = max(0, step - rng.randrange(5))  # a restart redoes a few steps
        step += 1
        seconds = rng.choice([rng.random(), math.nan, rng.random() * 5])
        t = rng.choice([1000.0 + n, math.nan])
        series.append(step, seconds, 1.0, 1.0, 0.5, time=t, attempt=attempt)
        if n % 7 == 0 or n < 10:
            last, slowest, firsts, starts = _brute(series)
            assert series.last_time() == last
            assert series.slowest_after_first() == slowest
            assert series.first_rows() == firsts and list(series.first_rows()) == list(firsts)
            for a, expected in starts.items():
                assert series.first_time_from(a) == expected, (n, a)
    assert series.stride > 1  # it did thin


def test_a_follows_ticks_leave_the_goodput_to_the_summary(tmp_path, monkeypatch):
    write_stored_run(tmp_path, "r", RunShape(steps=40), state="Running")
    calls = []
    real = goodput_module.goodput
    monkeypatch.setattr(goodput_module, "goodput", lambda rec: calls.append(1) or real(rec))
    events = list(follow(open_storage(str(tmp_path)), "r", EndsAfter(6), tick_seconds=0.01,
                         storage_seconds=0.01))
    ticks = [e for e in events if isinstance(e, Tick)]
    assert len(ticks) >= 5 and all(t.view["goodput"] is None for t in ticks)
    assert isinstance(events[-1], Done) and events[-1].view["goodput"]["categories"]["productive"] > 0
    assert len(calls) == 1  # the summary's, once
    # A screen that shows it (the live table) gets it on every tick.
    calls.clear()
    events = list(follow(open_storage(str(tmp_path)), "r", EndsAfter(3), tick_seconds=0.01,
                         storage_seconds=0.01, live_goodput=True))
    assert all(e.view["goodput"] for e in events if isinstance(e, Tick | Done))
    assert len(calls) == sum(isinstance(e, Tick | Done) for e in events)


def test_polls_share_one_pool_and_a_nested_map_runs_inline(tmp_path, monkeypatch):
    write_stored_run(tmp_path, "r", RunShape(steps=30), state="Running")
    storage = open_storage(str(tmp_path))
    follower = LogFollower(storage, "r")
    started: list[str] = []
    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(self.name) or real_start(self))
    lines = 0
    for i in range(5):
        for h in range(4):  # each poll: a new chunk of each of 4 hosts
            storage.write_bytes(Layout.log_chunk("r", f"0-{h}", 0, i, "w"), f"line {i} of host {h}\n".encode())
        lines += len(list(follower.poll()))
    assert lines == 20 and follower.chunks_read == 20
    # At most the pool's threads, once (a pool per poll started threads on every poll).
    assert all(n.startswith("xrun-io") for n in started) and len(started) <= background.IO_THREADS
    # A map called from one of the pool's own threads runs there: no wait on itself.
    inner = list(background.io_map(lambda i: list(background.io_map(lambda j: (i, j), range(4))),
                                   range(2 * background.IO_THREADS)))
    assert inner[3] == [(3, j) for j in range(4)] and len(inner) == 2 * background.IO_THREADS


def test_a_live_followers_record_keeps_no_chart_series(tmp_path, monkeypatch):
    """grad_norm and learning_rate per step are drawn by ``xrun report`` only: a follow's
    record (its reader made with ``charts=False``) does not keep them; status's and
    report's do."""
    from orchestrator.readers.loaders import StoredRun
    from orchestrator.services import follow as follow_module

    write_stored_run(tmp_path, "r", RunShape(steps=10), state="Running")
    storage = open_storage(str(tmp_path))
    storage.write_text(Layout.metrics("r") + "/attempt-000-00000009.jsonl", "".join(
        f'{{"kind": "step", "attempt": 0, "step": {s}, "seconds": 0.1, "loss": 1.0, "grad_norm": 0.5, '
        f'"learning_rate": 0.001}}\n' for s in range(11, 15)))
    assert set(StoredRun(storage, "r").poll().extra) == {"grad_norm", "learning_rate"}
    readers: list[StoredRun] = []

    class Recorded(StoredRun):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            readers.append(self)

    monkeypatch.setattr(follow_module, "StoredRun", Recorded)
    events = list(follow(storage, "r", EndsAfter(2), tick_seconds=0.01, storage_seconds=0.01))
    assert events[-1].view["step"] == 14
    assert len(readers) == 1 and readers[0].rec.extra == {} and len(readers[0].rec.steps) == 14
