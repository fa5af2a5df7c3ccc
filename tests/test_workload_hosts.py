"""The workload as real host processes: 2 processes x 2 CPU devices over gloo, a 1 x 4
topology, kill-and-resume, SIGTERM, and the same save/restore through gs:// (emulator).

One uninterrupted 2 x 2 run (tiny, 10 steps, saves every 4) is the reference every other
run's losses are held against.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pytest
import workload_helpers
from cli_helpers import xrun
from workload_helpers import (
    assert_tensorboard_matches,
    events,
    launch,
    losses,
    metrics,
    run_hosts,
    wait_all,
    wait_for_line,
)

from orchestrator.analysis.goodput import goodput
from orchestrator.readers.loaders import read_stored_run
from xrun_contract import HEADER_RE, PHASE_RE, PHASES, STEP_RE, Layout, header_fields
from xrun_contract.storage import open_storage

ARGS = ("--preset", "tiny", "steps=10", "checkpoint_every=4")


@pytest.fixture(scope="module", autouse=True)
def own_compilation_cache(tmp_path_factory):
    """This module's runs share a compilation cache of their own: the reference run always
    compiles (the startup timeline test reads that compile) and the later runs load what it
    wrote, whichever modules ran before in the session. With the session's cache, a module
    that ran the same program first made the reference load its executables instead."""
    kept = workload_helpers.compilation_cache()  # the session's: a run whose compile no test reads
    with workload_helpers.compilation_cache_at(str(tmp_path_factory.mktemp("jax-cache"))):
        yield kept


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("ref")
    codes, hosts = run_hosts("ref", root, root / "logs", args=ARGS)
    assert codes == [0, 0], "\n".join(h.output()[-3000:] for h in hosts)
    return root, hosts, metrics(root, "ref")


def test_two_hosts_train_and_report(reference):
    root, hosts, records = reference
    ref = losses(records)
    assert sorted(ref) == list(range(1, 11))
    assert ref[10] < ref[1] - 1.0  # it learns
    # No thread ended inside jaxlib at exit (a watch's poll returning during finalization:
    # SIGABRT after a finished run, which the supervisor then restarted).
    assert not any("terminate called" in h.output() for h in hosts), hosts[1].output()[-2000:]
    # Process 0 prints the header once: versions on one line, the config folded to what
    # differs from the preset; the other host prints none of it.
    lines = [m for line in hosts[0].output().splitlines() if (m := HEADER_RE.match(line))]
    assert [m["key"] for m in lines] == ["versions", "config"]
    header = header_fields("versions", lines[0]["value"])
    assert header["process_id"] == "0" and header["jax"] and header["backend"] == "cpu"
    assert header["process_count"] == "2" and header["local_devices"] == "2"
    assert header["global_devices"] == "4" and json.loads(header["mesh"]) == {"data": 1, "fsdp": 4}
    assert lines[1]["value"] == "preset=tiny steps=10 checkpoint_every=4"
    assert not HEADER_RE.search(hosts[1].output())
    # Startup phases: a line on process 0 and a record each, in order, times increasing.
    phases = [r for r in records if r["kind"] == "phase"]
    assert [p["phase"] for p in phases] == [
        "process_start", "imports", "distributed", "checkpoint_manager", "initialized",
        "compiled", "first_step"]
    assert all(p["phase"] in PHASES for p in phases)
    # The main path's milestones in time order; "compiled" is the compile thread's own span
    # (it began after "distributed" and ended by the first step, maybe before "initialized").
    main = [p for p in phases if p["phase"] != "compiled"]
    assert [p["seconds"] for p in main] == sorted(p["seconds"] for p in main)
    assert [p["time"] for p in main] == sorted(p["time"] for p in main)
    compiled = next(p for p in phases if p["phase"] == "compiled")
    assert phases[2]["seconds"] < compiled["began"] < compiled["seconds"] <= phases[-1]["seconds"]
    assert phases[0]["seconds"] == 0 and phases[-1]["step"] == 1
    # Each record is stamped when its milestone was reached: time - seconds is the start.
    starts = [p["time"] - p["seconds"] for p in phases]
    assert max(starts) - min(starts) < 0.01
    activities = [m["activity"] for line in hosts[0].output().splitlines()
                  if (m := PHASE_RE.search(line))]
    assert activities == ["initializing distributed", "opening checkpoints",
                          "initializing state", "compiling", "training", "first step done"]
    assert not PHASE_RE.search(hosts[1].output())
    steps_logged = [int(m["step"]) for line in hosts[0].output().splitlines()
                    if (m := STEP_RE.search(line))]
    assert steps_logged == list(range(1, 11))
    assert not STEP_RE.search(hosts[1].output())
    # JSONL: one header/params/flops, a step record per step, checkpoint events, the end.
    kinds = [r["kind"] for r in records]
    assert kinds.count("header") == kinds.count("params") == kinds.count("flops") == 1
    assert records[-1]["kind"] == "end" and records[-1]["exit_code"] == 0
    steps = {r["step"]: r for r in records if r["kind"] == "step"}
    assert all(r["total_weights"] == 8 * 64 and r["seconds"] > 0.001 for r in steps.values())
    # Saves every 4 steps and at the last one; a save due while the previous one is still
    # being written is deferred (never waited for), so on a slow machine 8 may move later.
    saved = events(records, "started")
    assert saved == events(records, "committed") and saved[0] == 4 and saved[-1] == 10
    assert all(b - a >= 4 for a, b in zip(saved[:-2], saved[1:-1], strict=True))
    blocked = {s: r["checkpoint_blocked_s"] for s, r in steps.items()}
    # The forced last save is taken after the loop when step 8's is still being written.
    assert set(saved[:-1]) <= {s for s, b in blocked.items() if b > 0} <= set(saved), (blocked, saved)
    flops = next(r for r in records if r["kind"] == "flops")
    assert flops["tflops_per_device"] == pytest.approx(flops["tflops_per_step"] / 4)
    # run.json (created by process 0 here: no orchestrator wrote it first).
    wl = json.loads((root / "runs/ref/run.json").read_text())["workload"]
    assert wl["exit_code"] == 0 and wl["processes"] == 2 and wl["devices"] == 4
    assert wl["config"]["steps"] == 10 and wl["mesh"] == {"data": 1, "fsdp": 4}
    assert wl["end_time"] >= wl["start_time"] and wl["versions"]["jax"]
    # Committed checkpoints only: the last three saves (max_to_keep 3; 4, 8, 10 unless step
    # 8's save was deferred, see above), each with both items.
    ck = root / "runs/ref/checkpoints"
    assert sorted(int(p.name) for p in ck.iterdir()) == saved[-3:]
    assert {p.name for p in (ck / "10").iterdir()} >= {"state", "data"}
    # TensorBoard reads the same numbers as the metrics JSONL.
    assert_tensorboard_matches(str(root / Layout.tensorboard("ref")), records)


def test_startup_timeline_of_a_real_run(reference):
    """The goodput breakdown's startup timeline, from the phase records the run stored, and
    `xrun status` showing it."""
    root, _, records = reference
    (timeline,) = goodput(read_stored_run(open_storage(str(root)), "ref"))["startup_timeline"]
    phases = {r["phase"]: r for r in records if r["kind"] == "phase"}
    assert timeline["attempt"] == 0 and timeline["basis"] == "process start"  # no submit here
    names = [s["name"] for s in timeline["segments"]]
    assert [n for n in names if n != "waiting for compile"] == [
        "imports", "distributed init", "program + checkpoint manager", "init state", "first step"]
    # Segments plus the named wait for the compile sum to the time to the first step.
    assert sum(s["seconds"] for s in timeline["segments"]) == pytest.approx(
        timeline["to_first_step_s"], rel=0.02)
    assert timeline["to_first_step_s"] == pytest.approx(phases["first_step"]["seconds"], abs=1e-6)
    seg = {s["name"]: s for s in timeline["segments"]}
    assert seg["imports"]["seconds"] == pytest.approx(phases["imports"]["seconds"], abs=1e-6)
    assert seg["distributed init"]["seconds"] == pytest.approx(
        phases["distributed"]["seconds"] - phases["imports"]["seconds"], abs=1e-6)
    # Segments tile the main path; the compile ran beside it and ended by the first step.
    for a, b in zip(timeline["segments"], timeline["segments"][1:], strict=False):
        assert b["start_s"] == pytest.approx(a["start_s"] + a["seconds"], abs=1e-5)
    (comp,) = timeline["parallel"]
    assert comp["name"] == "compile" and comp["seconds"] == pytest.approx(
        phases["compiled"]["seconds"] - phases["compiled"]["began"], abs=1e-5)
    assert comp["waited_s"] == pytest.approx(
        max(0.0, phases["compiled"]["seconds"] - phases["initialized"]["seconds"]), abs=1e-5)
    r = xrun("status", "ref", storage=root)
    assert r.returncode == 0, r.stderr
    row = " ".join(r.stdout.split())
    assert ("Startup " in row
            and "to the first step (from process start; goodput's startup + compilation): imports" in row)
    assert "distributed init" in row and "compile" in row and "in a thread alongside" in row
    report = root / "report.html"
    r = xrun("report", "ref", "-o", str(report), storage=root)
    assert r.returncode == 0, r.stderr
    assert "<br>startup " in report.read_text() and "to the first step" in report.read_text()


def test_one_host_four_devices_matches_two_hosts(reference, own_compilation_cache, tmp_path):
    _, _, records = reference
    # 1 x 4 is another program than the module's 2 x 2: from the kept cache (warm after the
    # first session), not compiled afresh in the module's (18.8 s of CPU at a load of 13).
    with workload_helpers.compilation_cache_at(own_compilation_cache):
        codes, hosts = run_hosts("one", tmp_path, tmp_path / "logs", hosts=1, devices=4, args=ARGS)
    assert codes == [0], hosts[0].output()[-3000:]
    ref, one = losses(records), losses(metrics(tmp_path, "one"))
    assert sorted(one) == list(range(1, 11))
    np.testing.assert_allclose([one[s] for s in range(1, 11)], [ref[s] for s in range(1, 11)],
                               rtol=0, atol=1e-5)


def test_two_slices_quick_executable_first_then_every_host_switches_at_one_step(reference,
                                                                                  tmp_path):
    """2 slices x 1 host x 2 devices: mesh data=2 (across slices), fsdp=2; same losses.

    And quick_compile=on on it (a cold start: no cache): the first steps run the quickly
    compiled executable; host 1's optimized compile is held 2 s, so host 0 (whose own is
    ready first) must keep running the quick one until host 1 has its optimized one too, then
    both switch at the same step, by step 6 at the latest (XRUN_TEST_SWITCH_BY: however slow
    the machine compiles). The losses are the reference run's (same function, other compile
    and topology), and readers keep the quick steps out of steady state."""
    _, _, records = reference
    codes, hosts = run_hosts("slices", tmp_path, tmp_path / "logs", slices=2, cache=False,
                             args=(*ARGS, "quick_compile=on"), XRUN_TEST_OPTIMIZED_DELAY="2:1",
                             XRUN_TEST_SWITCH_BY="6", XRUN_TEST_STEP_DELAY="0.3")
    assert codes == [0, 0], "\n".join(h.output()[-3000:] for h in hosts)
    assert 'mesh={"data":2,"fsdp":2}' in hosts[0].output()
    switched = [[int(line.split("from step ")[1].split()[0]) for line in h.output().splitlines()
                 if line.startswith("xrun: optimized train step from step ")] for h in hosts]
    assert len(switched[0]) == 1 and switched[0] == switched[1], switched
    first_optimized = switched[0][0]
    assert 2 <= first_optimized <= 6
    quick = metrics(tmp_path, "slices")
    steps = {r["step"]: r for r in quick if r["kind"] == "step"}
    assert sorted(steps) == list(range(1, 11))
    assert [s for s in steps if steps[s].get("quick")] == list(range(1, first_optimized))
    compiled = next(r for r in quick if r["kind"] == "phase" and r["phase"] == "compiled")
    assert compiled["source"] == "quick"
    ref, got = losses(records), losses(quick)
    np.testing.assert_allclose([got[s] for s in range(1, 11)], [ref[s] for s in range(1, 11)],
                               rtol=0, atol=1e-5)
    rec = read_stored_run(open_storage(str(tmp_path)), "slices")
    assert rec.quick_steps == {(0, s) for s in range(1, first_optimized)}
    steady = dict(zip(rec.steps.step, rec.steady_mask(0), strict=True))
    assert not any(steady[s] for s in range(1, first_optimized))


def test_kill_and_resume_continues_exactly(reference, tmp_path):
    _, _, records = reference
    ref = losses(records)
    # Slowed steps, so that the kill lands mid-run and step 4 has committed by then.
    hosts = launch("kill", tmp_path, tmp_path / "logs", args=ARGS, XRUN_TEST_STEP_DELAY="0.2")
    wait_for_line(hosts[0], "checkpoint committed: step 4,")
    wait_for_line(hosts[0], "completed step: 6,")
    for h in hosts:
        h.signal(signal.SIGKILL)
    assert wait_all(hosts) == [-9, -9]
    ck = tmp_path / "runs/kill/checkpoints"
    # A half-written step as a kill mid-save leaves it: must never be restored.
    (ck / "8.orbax-checkpoint-tmp-1234567" / "state").mkdir(parents=True)
    codes, hosts = run_hosts("kill", tmp_path, tmp_path / "logs", args=ARGS, attempt=1)
    assert codes == [0, 0], hosts[0].output()[-3000:]
    again = metrics(tmp_path, "kill")
    restored = events(again, "restored", attempt=1)
    assert restored in ([4], [8])
    resumed = losses(again, attempt=1)
    assert sorted(resumed) == list(range(restored[0] + 1, 11))
    for s in resumed:
        assert resumed[s] == ref[s], s
    assert sorted(p.name for p in ck.iterdir()) == ["10", "4", "8"]
    # Both attempts ran the executables the reference left in the session's cache (the same
    # program): loaded, not traced or compiled, and they restored into their shardings.
    compiled = [r for r in again if r["kind"] == "phase" and r["phase"] == "compiled"]
    assert [(r["attempt"], r["source"]) for r in compiled] == [(0, "loaded"), (1, "loaded")]


def test_sigterm_saves_that_step_and_exits_restartable(reference, tmp_path):
    _, _, records = reference
    ref = losses(records)
    hosts = launch("term", tmp_path, tmp_path / "logs", args=ARGS, XRUN_TEST_STEP_DELAY="0.3")
    wait_for_line(hosts[0], "completed step: 2,")
    for h in hosts:
        h.signal(signal.SIGTERM)
    assert wait_all(hosts, timeout=60) == [42, 42], hosts[0].output()[-3000:]
    first = metrics(tmp_path, "term")
    last = max(losses(first))
    assert 2 <= last < 10
    assert events(first, "committed")[-1] == last
    assert first[-1]["kind"] == "end" and first[-1]["exit_code"] == 42
    assert (tmp_path / f"runs/term/checkpoints/{last}/commit_success.txt").exists()
    slow = [r for r in first if r["kind"] == "step"]
    assert all(r["seconds"] >= 0.3 for r in slow)  # the delay is inside the timed region
    # The restart resumes from that very step and trains as if never interrupted.
    codes, hosts = run_hosts("term", tmp_path, tmp_path / "logs", args=ARGS, attempt=1)
    assert codes == [0, 0], hosts[0].output()[-3000:]
    again = metrics(tmp_path, "term")
    assert events(again, "restored", attempt=1) == [last]
    resumed = losses(again, attempt=1)
    assert sorted(resumed) == list(range(last + 1, 11))
    assert all(resumed[s] == ref[s] for s in resumed)


def test_gcs_save_restore_with_token_file(gcs_bucket, tmp_path):
    """Storage and data on gs://: attempt 0 saves synchronously and fails at step 6; attempt
    1 resumes from step 4 past a half-written step 8, saves asynchronously, and redoes steps
    5-6 with the same losses."""
    root = f"{gcs_bucket}/root"
    store = open_storage(root)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, size=20_000, dtype=np.uint16)
    store.write_bytes("data/tokens.bin", tokens.tobytes())
    args = (*ARGS, f"data={root}/data/tokens.bin", "data_dtype=uint16")
    codes, hosts = run_hosts("gcs", root, tmp_path / "logs", args=(*args, "async_checkpoint=false"),
                             XRUN_TEST_FAIL_AT_STEP="6:3")
    assert codes == [3, 3], hosts[0].output()[-3000:]
    first = metrics(root, "gcs")
    assert sorted(losses(first)) == list(range(1, 7))
    assert events(first, "committed") == [4]
    assert first[-1]["kind"] == "end" and first[-1]["exit_code"] == 3
    # Process 0 read only its own rows: 2 devices x 2 rows of 65 tokens (one read per
    # device), for 6 batches (steps 1-6: the step the process stops at makes no next batch),
    # uint16.
    assert first[-1]["data_bytes_read"] == 6 * 2 * (2 * 64 + 1) * 2
    ck = Layout.checkpoints("gcs")
    # Half-written step 8 on GCS: objects but no commit_success.txt.
    store.write_bytes(f"{ck}/8/state/manifest.ocdbt", b"partial")
    codes, hosts = run_hosts("gcs", root, tmp_path / "logs", args=args, attempt=1,
                             XRUN_TEST_FAIL_AT_STEP="6:3")
    assert codes == [0, 0], hosts[0].output()[-3000:]
    records = metrics(root, "gcs")
    assert events(records, "restored", attempt=1) == [4]
    before, after = losses(records, attempt=0), losses(records, attempt=1)
    assert sorted(after) == list(range(5, 11))
    assert after[5] == before[5] and after[6] == before[6]
    assert after[10] < before[1]
    _, steps = store.list(ck)
    assert sorted(int(p.rsplit("/", 1)[1]) for p in steps) == [4, 8, 10]
    assert store.exists(f"{ck}/8/commit_success.txt") or store.exists(f"{ck}/8/state/commit_success.txt")
    assert store.read_json(Layout.run_json("gcs"))["workload"]["exit_code"] == 0
    # TensorBoard on gs:// (its fsspec filesystem, gcsfs on the emulator): both attempts'
    # files; steps 5-6 of attempt 0 dropped in favour of attempt 1's (SessionLog.START).
    assert_tensorboard_matches(f"{root}/{Layout.tensorboard('gcs')}", records)
    phases = [r for r in records if r["kind"] == "phase" and r["attempt"] == 1]
    assert [p["phase"] for p in phases][3:5] == ["checkpoint_manager", "restored"]
    assert phases[3]["activity"] == "restoring step 4" and phases[4]["step"] == 4
    assert not Path("runs").exists()
