"""Checkpoints that never stall and never lose a committed step (workload/checkpointing.py,
xrun_contract/checkpoints.py) and the storage fault proxy (tests/gcs_proxy.py).

In-process: the commit rule on folders and on the GCS emulator, the proxy's faults, the
deferral with a real CheckpointManager writing through a throttled proxy, an empty step
folder. As host processes: a corrupt latest step falls back (one host), a checkpoint write
failing on one of two hosts stops both with the restartable code within seconds.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
from workload_helpers import events, launch, losses, metrics, run_hosts, wait_all

from xrun_contract import CKPT_WAIT_PREVIOUS_RE, RESTARTABLE_EXIT_CODE, Layout
from xrun_contract.checkpoints import (
    COMMITTED,
    EMPTY,
    IN_PROGRESS,
    committed_steps,
    latest_committed_step,
    step_folders,
)
from xrun_contract.storage import gcs_client, open_storage

# ---------------------------------------------------------------------------------------
# The commit rule (no jax)


def test_commit_rule_on_folders(tmp_path):
    ck = tmp_path / "runs/r/checkpoints"
    (ck / "4/state").mkdir(parents=True)
    (ck / "4/state/manifest.ocdbt").write_bytes(b"x")
    (ck / "8").mkdir()  # empty: not committed, although Orbax's rename rule accepts it
    (ck / "12.orbax-checkpoint-tmp-1712345678").mkdir()  # rename not done yet
    (ck / "12.orbax-checkpoint-tmp-1712345678/state").mkdir()
    (ck / "007").mkdir()  # not Orbax's step name format
    (ck / "007/x").write_bytes(b"x")
    st = open_storage(str(tmp_path))
    folders = {(f.step, f.state) for f in step_folders(st, Layout.checkpoints("r"))}
    assert folders == {(4, COMMITTED), (8, EMPTY), (12, IN_PROGRESS)}
    assert committed_steps(st, Layout.checkpoints("r")) == [4]
    assert latest_committed_step(st, Layout.checkpoints("nothing")) is None


def test_commit_rule_on_gcs_needs_the_commit_file(gcs_bucket):
    st = open_storage(f"{gcs_bucket}/root")
    ck = Layout.checkpoints("r")
    st.write_bytes(f"{ck}/4/state/manifest.ocdbt", b"x")
    st.write_bytes(f"{ck}/4/commit_success.txt", b"ok")
    st.write_bytes(f"{ck}/8/state/manifest.ocdbt", b"x")  # objects, no commit file
    st.write_bytes(f"{ck}/9/state/commit_success.txt", b"ok")  # an item's, not the step's
    assert [(f.step, f.state) for f in step_folders(st, ck)] == [
        (4, COMMITTED), (8, IN_PROGRESS), (9, IN_PROGRESS)]
    assert committed_steps(st, ck) == [4]


def test_new_checkpoint_lines_parse_back():
    from xrun_contract import (
        CKPT_DEFERRED_LINE,
        CKPT_DEFERRED_RE,
        CKPT_EXIT_WAIT_LINE,
        CKPT_EXIT_WAIT_RE,
        CKPT_RESTORE_FAILED_LINE,
        CKPT_RESTORE_FAILED_RE,
        CKPT_WRITE_FAILED_LINE,
        CKPT_WRITE_FAILED_RE,
    )

    m = CKPT_DEFERRED_RE.search(CKPT_DEFERRED_LINE.format(step=10, previous=5))
    assert (m["step"], m["previous"]) == ("10", "5")
    m = CKPT_EXIT_WAIT_RE.search(CKPT_EXIT_WAIT_LINE.format(step=60, seconds=13.4216))
    assert (m["step"], m["seconds"]) == ("60", "13.422")
    m = CKPT_RESTORE_FAILED_RE.search(
        CKPT_RESTORE_FAILED_LINE.format(step=8, error="process 1: ValueError: DATA_LOSS: x"))
    assert (m["step"], m["error"]) == ("8", "process 1: ValueError: DATA_LOSS: x")
    m = CKPT_WRITE_FAILED_RE.search(
        CKPT_WRITE_FAILED_LINE.format(step=4, process=1, error="PERMISSION_DENIED: y"))
    assert (m["step"], m["process"], m["error"]) == ("4", "1", "PERMISSION_DENIED: y")


# ---------------------------------------------------------------------------------------
# The proxy


def test_proxy_throttles_fails_and_has_outages(gcs_proxy, gcs_bucket, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_proxy.url)
    bucket = gcs_client().bucket(gcs_bucket[len("gs://"):])
    data = os.urandom(2 << 20)
    t = time.monotonic()
    bucket.blob("a").upload_from_string(data)
    fast = time.monotonic() - t
    gcs_proxy.throttle(4 << 20)  # 4 MiB/s: 2 MiB up and 2 MiB down take ~1 s
    t = time.monotonic()
    bucket.blob("b").upload_from_string(data)
    assert bucket.blob("b").download_as_bytes() == data
    slow = time.monotonic() - t
    # 4 MiB through 4 MiB/s: at least ~1 s of waits; at most that plus the same transfers'
    # own work, bounded by the unthrottled upload measured here (so a loaded machine, which
    # slows both, cannot break it).
    assert 0.9 < slow < 2.0 + 4 * fast and slow > fast + 0.5, (fast, slow)
    gcs_proxy.throttle(None)

    from google.api_core.exceptions import Forbidden, ServiceUnavailable

    rule = gcs_proxy.fail(403, 2, method="GET", match=r"/o/c\b")
    bucket.blob("c").upload_from_string(b"c")
    for _ in range(2):
        with pytest.raises(Forbidden):
            bucket.blob("c").download_as_bytes(retry=None)
    assert bucket.blob("c").download_as_bytes() == b"c" and rule.hits == 2
    assert bucket.blob("a").download_as_bytes(retry=None) == data  # no match: untouched

    gcs_proxy.outage(0.5, "503")
    with pytest.raises(ServiceUnavailable):
        bucket.blob("a").download_as_bytes(retry=None)
    time.sleep(0.6)
    assert bucket.blob("c").download_as_bytes(retry=None) == b"c"
    assert gcs_proxy.stats.injected == {403: 2} and gcs_proxy.stats.outage_hits == 1


# ---------------------------------------------------------------------------------------
# In-process checkpoints: deferral on throttled storage, an empty step folder


class RecordingMetrics:
    """Metrics without storage that keeps every checkpoint event (and prints its line)."""

    def __init__(self):
        from workload.metrics import Metrics

        self.inner = Metrics(None, None, 0, True)
        self.events: list[tuple[str, int, float | None, dict]] = []

    def checkpoint(self, event, step, seconds=None, **fields):
        self.events.append((event, step, seconds, fields))
        self.inner.checkpoint(event, step, seconds, **fields)

    def steps(self, event: str) -> list[int]:
        return [s for e, s, _, _ in self.events if e == event]

    def __getattr__(self, name):
        return getattr(self.inner, name)


def make_checkpoints(storage_root: str, every: int, **cfg):
    from workload.checkpointing import Checkpoints
    from workload.config import Config

    m = RecordingMetrics()
    config = Config(checkpoint_every=every, max_to_keep=10, **cfg)
    ck = Checkpoints(open_storage(storage_root), Layout.checkpoints("r"), config, m)
    return ck, m


def random_state(seed: int, mib: int):
    import jax

    n = mib * (1 << 20) // 4
    return {"w": jax.random.normal(jax.random.key(seed), (n // 1024, 1024))}


def test_deferral_never_waits_for_a_previous_save(gcs_proxy, gcs_bucket, monkeypatch):
    """Saves every 2 steps of 40 ms into storage throttled so that one save takes seconds:
    the due save is deferred, never waited for; it happens at the first step boundary after
    the commit; the next one is due as many steps later as the last write took; each
    boundary holds training only for the device-to-host copy. A 1 s outage (503) in the
    first write is retried by TensorStore and is not a failed write."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_proxy.url)
    monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", gcs_proxy.url)
    root = f"{gcs_bucket}/root"
    ck, m = make_checkpoints(root, every=2)
    assert ck.restore_latest(None) is None  # nothing committed yet
    waits: list[bool] = []  # was a save in progress whenever Orbax's wait was called?
    original = ck.manager.wait_until_finished

    def recorded_wait():
        waits.append(ck.manager.is_saving_in_progress())
        return original()

    ck.manager.wait_until_finished = recorded_wait
    gcs_proxy.throttle(2 << 20)  # 2 MiB/s for a 2 MiB state (plus the emulator's own pace)
    state = random_state(0, 2)
    held, step = [], 0
    # Ends at the third save; the cap only stops a hang. Under load the first write took 351
    # of 400 capped steps, so the third save fell past a cap of 400 (counts, not seconds, move).
    while len(m.steps("started")) < 3 and step < 4000:
        step += 1
        time.sleep(0.04)  # the "step"
        held.append(ck.after_step(step, state, lambda s=step: {"position": s}))
        if step == 2:  # a transient outage during the first write: retried, not a failure
            gcs_proxy.outage(1.0, "503")
    waited = ck.finish(step, state, lambda: {"position": step})
    ck.close()

    assert not any(waits), waits  # Orbax's wait only ever found nothing to wait for
    assert not m.steps("waited")
    started, deferred, committed = m.steps("started"), m.steps("deferred"), m.steps("committed")
    assert started[:1] == [2] and deferred[:1] == [4], m.events
    names = [(e, s) for e, s, _, _ in m.events]
    # The deferred save starts at the very boundary that saw step 2 commit.
    assert names.index(("committed", 2)) + 1 == names.index(("started", started[1]))
    first_write = started[1] - 2
    assert first_write > 2  # slower than the interval: that is why it was deferred
    # Cadence follows the storage: the next save is due first_write steps later, not 2.
    assert started[2] >= started[1] + first_write, started
    assert set(committed) == set(started)  # every started save committed
    assert m.steps("exit_wait") == [step] and waited > 0
    # The copy, never a write: each hold is shorter than the quickest write (throttled to
    # seconds), both measured in this run.
    writes = [seconds for e, _, seconds, _ in m.events if e == "committed"]
    assert max(held) < min(writes), (held, writes)
    assert gcs_proxy.stats.outage_hits >= 1 and not m.steps("write_failed")
    assert committed_steps(open_storage(root), Layout.checkpoints("r")) == sorted(set(started))


def test_empty_step_folder_is_ignored_and_saved_over(tmp_path):
    root = str(tmp_path)
    ck, m = make_checkpoints(root, every=2)
    ck.restore_latest(None)
    state = random_state(1, 1)
    ck.after_step(2, state, lambda: {"position": 2})
    ck.finish(2, state, lambda: {"position": 2})
    ck.close()
    (tmp_path / "runs/r/checkpoints/4").mkdir()  # an empty "newer" step
    import jax

    abstract = jax.eval_shape(lambda: state)
    abstract = {"w": jax.ShapeDtypeStruct(abstract["w"].shape, abstract["w"].dtype,
                                          sharding=state["w"].sharding)}
    ck, m = make_checkpoints(root, every=2)
    step, restored, data = ck.restore_latest(abstract)
    assert step == 2 and data == {"position": 2}
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(state["w"]))
    ck.after_step(3, state, lambda: {"position": 3})
    ck.after_step(4, state, lambda: {"position": 4})  # step 4 is saved over the empty folder
    ck.finish(4, state, lambda: {"position": 4})
    ck.close()
    assert m.steps("committed") == [4]
    assert committed_steps(open_storage(root), Layout.checkpoints("r")) == [2, 4]
    # A rerun of the finished run restores step 4 and has nothing to save at its end.
    ck, m = make_checkpoints(root, every=2)
    assert ck.restore_latest(abstract)[0] == 4
    ck.finish(4, state, lambda: {"position": 4})
    ck.close()
    assert m.steps("started") == [] and m.steps("exit_wait") == [4]


def test_a_failed_restore_falls_back_in_one_bounded_line(tmp_path, capsys, monkeypatch):
    """Issue #53 item 6: an Orbax error whose text is a whole spec was printed whole (a
    39,961-character line); each failed restore is one short line, and the fallback holds."""
    root = str(tmp_path)
    ck, m = make_checkpoints(root, every=2)
    ck.restore_latest(None)
    state = random_state(1, 1)
    for step in (2, 4):
        ck.after_step(step, state, lambda step=step: {"position": step})
    ck.finish(4, state, lambda: {"position": 4})
    ck.close()
    ck, m = make_checkpoints(root, every=2)
    real = ck._restore_step

    def restore(step: int, abstract: object):
        if step == 4:
            raise ValueError("spec " + "{'driver': 'zarr', 'kvstore': 'file'} " * 1000)
        return real(step, abstract)

    monkeypatch.setattr(ck, "_restore_step", restore)
    import jax

    abstract = jax.eval_shape(lambda: state)
    abstract = {"w": jax.ShapeDtypeStruct(abstract["w"].shape, abstract["w"].dtype,
                                          sharding=state["w"].sharding)}
    capsys.readouterr()
    assert ck.restore_latest(abstract)[0] == 2
    ck.close()
    err = capsys.readouterr().err
    assert "checkpoint restore of step 4 failed" in err, err[:500]
    assert max(len(line) for line in err.splitlines()) < 1000


# ---------------------------------------------------------------------------------------
# Host processes

ARGS = ("--preset", "tiny", "steps=10", "checkpoint_every=4")


def test_corrupt_latest_falls_back_and_trains_to_the_same_loss(tmp_path):
    """Uninterrupted run (saves 4, 8, 10; 8 moves to 9 when step 4's save is still being
    written at step 8, and past 10 when it is written slower still, on a loaded machine);
    then step 10 loses its data files and the middle save's (if any) are garbage: the rerun
    logs each failure, restores 4, and reaches the same losses."""
    codes, hosts = run_hosts("fb", tmp_path, tmp_path / "logs", hosts=1, args=ARGS)
    assert codes == [0], hosts[0].output()[-3000:]
    ref = losses(metrics(tmp_path, "fb"))
    steps = committed_steps(open_storage(str(tmp_path)), Layout.checkpoints("fb"))
    assert steps[0] == 4 and steps[-1] == 10 and len(steps) in (2, 3), steps
    middle = steps[1] if len(steps) == 3 else None
    assert middle in (None, 8, 9)
    ck = tmp_path / "runs/fb/checkpoints"
    for f in (ck / "10/state").rglob("d/*"):
        f.unlink()  # missing files
    if middle is not None:
        corrupted = list((ck / f"{middle}/state").rglob("d/*"))
        assert corrupted
        for f in corrupted:
            f.write_bytes(b"\0garbage" * 64)  # corrupt data
    codes, hosts = run_hosts("fb", tmp_path, tmp_path / "logs", hosts=1, args=ARGS, attempt=1)
    out = hosts[0].output()
    assert codes == [0], out[-3000:]
    records = metrics(tmp_path, "fb")
    failed = [10] if middle is None else [10, middle]
    assert events(records, "restore_failed", attempt=1) == failed
    assert events(records, "restored", attempt=1) == [4]
    for step in failed:
        assert f"checkpoint restore failed: step {step}, error: process 0:" in out
    again = losses(records, attempt=1)
    assert sorted(again) == list(range(5, 11))
    assert all(again[s] == ref[s] for s in again), (again, ref)
    saved = events(records, "committed", attempt=1)  # the rerun's own saves: 8 or 9, and 10
    final = committed_steps(open_storage(str(tmp_path)), Layout.checkpoints("fb"))
    assert final[-1] == 10 and set(saved) <= set(final), (final, saved)
    if middle == 8 and saved == [8, 10]:  # no save deferred in either run
        assert final == [4, 8, 10]


def test_failed_write_on_one_host_stops_every_host_restartable(gcs_proxy, gcs_bucket, tmp_path):
    """Host 1 cannot write its checkpoint shards (403 on its OCDBT uploads): both hosts exit
    with the restartable code within seconds, and the log names the step and the process."""
    root = f"{gcs_bucket}/root"
    gcs_proxy.fail(403, 10_000, method="POST", match=r"ocdbt\.process_1/")
    hosts = launch("wf", root, tmp_path / "logs", args=("--preset", "tiny", "steps=400",
                                                        "checkpoint_every=4"),
                   XRUN_TEST_STEP_DELAY="0.05", **gcs_proxy.env())
    from workload_helpers import wait_for_line

    wait_for_line(hosts[0], "checkpoint save started: step 4", timeout=120)
    codes = wait_all(hosts, timeout=90)
    out = hosts[0].output()
    assert codes == [RESTARTABLE_EXIT_CODE] * 2, (codes, out[-3000:], hosts[1].output()[-3000:])
    assert gcs_proxy.stats.injected.get(403, 0) >= 1
    assert "checkpoint write failed: step 4, process 1, error:" in out
    records = metrics(root, "wf")
    end = records[-1]
    assert end["kind"] == "end" and end["exit_code"] == RESTARTABLE_EXIT_CODE
    assert "checkpoint write failed" in end["reason"]
    # It stopped right after, not at the end: counted in steps, which a loaded machine slows
    # as much as the failure's detection (a bound in seconds was not load-proof).
    assert max(losses(records)) < 30
    assert not CKPT_WAIT_PREVIOUS_RE.search(out)
    assert committed_steps(open_storage(root), Layout.checkpoints("wf")) == []
    wl = json.loads(open_storage(root).read_text(Layout.run_json("wf")))["workload"]
    assert wl["exit_code"] == RESTARTABLE_EXIT_CODE
