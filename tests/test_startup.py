"""Startup: JAX's persistent compilation cache written by every process on CPU, and the
startup timeline the goodput breakdown derives from the workload's phase records.

(The timeline of a real two-host run is checked in test_workload_hosts.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.analysis.goodput import format_startup, startup_timelines
from orchestrator.readers.loaders import read_jsonl_lines
from orchestrator.readers.record import RunRecord
from xrun_contract import records

REPO = Path(__file__).resolve().parent.parent

# Host 1 of a job as JAX sees it (jax._src.distributed.global_state.process_id), without a
# second process: JAX writes no cache entry; with xrun's hook it writes its own.
CACHE_SCRIPT = r"""
import json, os, sys
sys.path.insert(0, sys.argv[2])
import jax
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
from jax._src import distributed
from workload.distributed import cache_writes_on_every_process
distributed.global_state.process_id = 1
jax.jit(lambda x: x * 2.0)(jax.numpy.float32(1)).block_until_ready()
before = sorted(os.listdir(sys.argv[1]))
hooked = cache_writes_on_every_process()
again = cache_writes_on_every_process()  # idempotent
jax.jit(lambda x: x * 3.0 + 1.0)(jax.numpy.float32(1)).block_until_ready()
print(json.dumps({"before": before, "after": sorted(os.listdir(sys.argv[1])),
                  "hooked": hooked, "again": again}))
"""


def test_a_process_other_than_0_writes_its_own_cache_entries(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    out = subprocess.run([sys.executable, "-c", CACHE_SCRIPT, str(cache), str(REPO)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["before"] == []  # JAX alone: "Not writing ... since process_id != 0"
    assert result["hooked"] is True and result["again"] is True
    written = [n for n in result["after"] if n.startswith("jit__lambda-")]
    assert len(written) == 1 and written[0].endswith("-cache"), result["after"]
    assert (cache / written[0]).stat().st_size > 0


def _record(attempt: int, start: float, phase: str, seconds: float, **extra) -> str:
    rec = records.Phase(phase=phase, seconds=seconds, activity="", **extra)
    rec.time, rec.attempt = start + seconds, attempt
    return records.to_json(rec)


def test_timeline_segments_the_main_path_and_shows_the_compile_beside_it():
    rec = RunRecord(name="t")
    p0, p1 = 1_000_010.0, 1_000_100.0  # the processes of attempts 0 and 1 started here
    lines = [
        _record(0, p0, "process_start", 0.0), _record(0, p0, "imports", 2.0),
        _record(0, p0, "distributed", 3.0), _record(0, p0, "checkpoint_manager", 3.5),
        _record(0, p0, "initialized", 4.0),
        # The compile thread began at 3.25 and ended after the state was ready: the first
        # step waited 0.5 s for it, and ran from 4.5 to 5.0.
        _record(0, p0, "compiled", 4.5, began=3.25, source="compiled, written"),
        _record(0, p0, "first_step", 5.0, step=1),
        _record(1, p1, "process_start", 0.0), _record(1, p1, "imports", 1.5),
        _record(1, p1, "distributed", 2.0), _record(1, p1, "checkpoint_manager", 2.5, step=4),
        _record(1, p1, "restored", 4.0, step=4),
        # The restart loaded both executables from the workload's executable cache.
        _record(1, p1, "compiled", 3.0, began=2.25, source="loaded"),
        _record(1, p1, "first_step", 4.25, step=5),
    ]
    assert read_jsonl_lines(rec, lines) == 0
    first, restart = startup_timelines(rec, submitted_at=1_000_000.0)
    assert first["basis"] == "submit" and first["process_start_s"] == pytest.approx(10.0)
    assert first["to_first_step_s"] == pytest.approx(15.0)
    assert [(s["name"], s["start_s"], s["seconds"]) for s in first["segments"]] == [
        ("launch", 0.0, 10.0), ("imports", 10.0, 2.0), ("distributed init", 12.0, 1.0),
        ("program + checkpoint manager", 13.0, 0.5), ("init state", 13.5, 0.5),
        ("waiting for compile", 14.0, 0.5), ("first step", 14.5, 0.5)]
    # The segments and the named wait cover the whole span to the first step.
    assert sum(s["seconds"] for s in first["segments"]) == pytest.approx(first["to_first_step_s"])
    assert first["parallel"] == [{"name": "compile", "start_s": 13.25, "seconds": 1.25,
                                  "waited_s": 0.5}]
    # A restart counts from its own process start; the compile ended before the restore.
    assert restart["attempt"] == 1 and restart["basis"] == "process start"
    assert [s["name"] for s in restart["segments"]] == [
        "imports", "distributed init", "program + checkpoint manager", "restore step 4", "first step"]
    assert restart["segments"][-1]["start_s"] == pytest.approx(4.0)
    assert restart["parallel"][0]["waited_s"] == 0.0
    assert restart["parallel"][0]["name"] == "executables loaded"
    assert format_startup(first) == (
        "15s to the first step (from submit; goodput's startup + compilation): launch 10s, imports 2.0s, "
        "distributed init 1.0s, program + checkpoint manager 0.5s, init state 0.5s, waiting for compile 0.5s, "
        "first step 0.5s; compile ran 1.2s in a thread alongside")
    assert format_startup(restart).startswith("attempt 1: 4.2s to the first step (from process")
    assert format_startup(restart).endswith("executables loaded ran 0.8s in a thread alongside, no wait")
    assert sum(s["seconds"] for s in restart["segments"]) == pytest.approx(restart["to_first_step_s"])


def test_no_phase_records_no_timeline():
    assert startup_timelines(RunRecord(name="maxtext-log"), submitted_at=1.0) == []


def test_a_host_waits_for_the_coordinators_port_before_jax_connects():
    """workload.distributed.wait_for_coordinator: returns True only once something listens
    (here a socket opened 0.3 s after the wait began, as process 0's coordination service
    starts after the other hosts), False when nothing does by the deadline, and at once for
    an address that is not host:port."""
    import socket
    import threading

    from workload.distributed import wait_for_coordinator

    with socket.socket() as probe:  # a free port, closed again: nothing listens on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert wait_for_coordinator(f"127.0.0.1:{port}", timeout=0.2) is False

    opened = threading.Event()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen_later():
        threading.Event().wait(0.3)
        server.bind(("127.0.0.1", port))
        server.listen()
        opened.set()

    thread = threading.Thread(target=listen_later)
    thread.start()
    try:
        assert not opened.is_set()
        assert wait_for_coordinator(f"127.0.0.1:{port}", timeout=60) is True
        assert opened.is_set()  # it returned because the port opened, not before
    finally:
        thread.join()
        server.close()
    assert wait_for_coordinator("coordinator-without-a-port", timeout=60) is False


def test_waiting_for_a_name_backs_off_but_an_address_is_polled_fast(monkeypatch):
    """Each attempt at a name is a DNS query (cluster DNS, for as long as pod 0's image
    pulls): its polls grow to every 0.25 s. A refused IP address costs nothing: every 10 ms."""
    import socket

    from workload import distributed

    attempts: list[str] = []
    real = socket.create_connection

    def counting(address, *args, **kwargs):
        attempts.append(address[0])
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", counting)
    with socket.socket() as probe:  # a free port, closed again: nothing listens on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert distributed.wait_for_coordinator(f"127.0.0.1:{port}", timeout=0.5) is False
    fast = len(attempts)
    attempts.clear()
    # .invalid never resolves (RFC 6761): a gaierror, an OSError, every attempt.
    assert distributed.wait_for_coordinator(f"coordinator.xrun.invalid:{port}",
                                            timeout=1.5) is False
    named = len(attempts)
    assert fast >= 20, fast  # ~50 in 0.5 s, less on a loaded machine
    # 10, 15, 22, 34, 51, 76, 114, 171, then 250 ms: ~11 in 1.5 s (fewer where DNS is slow).
    assert 1 <= named <= 14, named


KEY_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import jax
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_enable_x64", sys.argv[2] == "x64")
import numpy as np
from workload.program import init_key
compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, *_, **__: compiles.append(event) if "compile" in event else None)
seeds = [0, 1, 5, 42, 2**31 - 1, 2**31, 2**32 + 3, 2**40 + 7, -1, -2, -2**31, -2**40]
mine = [init_key(s) for s in seeds]
ran = list(compiles)
jaxs = [np.asarray(jax.random.key_data(jax.random.key(s))).tolist() for s in seeds]
print(json.dumps({"ran": ran, "jax_ran": len(compiles) > len(ran),
                  "pairs": [[m.tolist(), str(m.dtype), j] for m, j in zip(mine, jaxs)]}))
"""


@pytest.mark.parametrize("mode", ["x32", "x64"])
def test_init_key_computed_on_the_host_is_jaxs_key(mode):
    """init's key without running a program on the device (the first costs a compile): the
    same uint32 words as ``jax.random.key``'s, with and without x64, negative seeds too."""
    out = subprocess.run([sys.executable, "-c", KEY_SCRIPT, str(REPO), mode], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["ran"] == [] and result["jax_ran"]  # jax.random.key compiles; init_key does not
    pairs = result["pairs"]
    assert all(dtype == "uint32" for _, dtype, _ in pairs)
    assert [mine for mine, _, _ in pairs] == [jaxs for _, _, jaxs in pairs]
    assert pairs[-1][0] == ([4294967040, 0] if mode == "x64" else [0, 0])  # -2**40's words
