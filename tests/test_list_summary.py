"""`xrun list` from one listing (#40): each run keeps a summary that its writers update
right after the records they summarise, and `list` reads every run's from one listing of
``summaries/``, however many runs there are. Runs without a summary list as before.

The runs are written by the writers xrun itself uses: the workload's ``Metrics`` (its chunk
writer and summary hook), ``record_state`` (what status and the kube follow use) and the
submit service's run summary. Requests are counted through a proxy in front of
the GCS emulator.
"""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from synthetic_runs import RunShape, write_stored_run

from orchestrator.backends.base import BackendStatus
from orchestrator.readers.loaders import read_stored_run
from orchestrator.services import runs
from orchestrator.services.view import run_view
from workload.metrics import Metrics
from xrun_contract import Layout, records, summary
from xrun_contract.storage import ChunkWriter, LocalStorage, Storage, open_storage


def write_run(storage: Storage, name: str, steps: int, state: str = "Succeeded",
              submitted_at: float | None = None, flush_every: int = 4, quick: bool = False) -> None:
    """One run through xrun's own writers: run.json and its summary (as submit writes
    them), metrics chunks through the workload's writer and summary hook, state.json
    through ``record_state``. ``quick``: the chunk writer and the workload's summary hook
    alone (no TensorBoard events, no Running state first), for many runs."""
    submitted_at = time.time() - 600 if submitted_at is None else submitted_at
    spec = {"name": name, "accelerator": "v6e-8", "pod_labels": {"team": "t" + name[-1]}}
    storage.write_json(Layout.run_json(name), {"name": name, "spec": spec, "backend": "kube",
                                               "submitted_at": submitted_at})
    summary.write_run(storage, name, {"name": name, "backend": "kube", "accelerator": "v6e-8",
                                      "submitted_at": submitted_at,
                                      "labels": runs.run_labels(spec, name)})
    if quick:
        hook = summary.MetricsSummary(storage, name, 0, "abcd1234")
        with ChunkWriter(storage, lambda seq: Layout.metrics_chunk(name, 0, seq, "abcd1234"), interval=3600,
                         after_write=hook.after_write) as w:
            w.write(records.to_json(records.Header(total_steps=steps)) + "\n")
            for step in range(1, steps + 1):
                w.write(records.to_json(records.Step(step=step, seconds=0.1, loss=7.0 / step)) + "\n")
        runs.record_state(storage, name, BackendStatus(state=state, restarts=1), "kube")
        return
    runs.record_state(storage, name, BackendStatus(state="Running", restarts=0), "kube")
    metrics = Metrics(storage, name, 0, primary=True, interval=3600, tensorboard_interval=3600)
    assert metrics.writer is not None
    try:
        metrics.header({"jax": "0"}, {"preset": "tiny", "steps": steps})
        for step in range(1, steps + 1):
            loss = 7.0 / step if step != 3 else math.nan  # a NaN loss reads as none in both
            metrics.step(step, 0.1, 1.0, 10.0, 100, loss, 0.0)
            if step % flush_every == 0:
                metrics.writer.flush()
        metrics.end(0, "done")
    finally:
        metrics.close()
    runs.record_state(storage, name, BackendStatus(state=state, restarts=1), "kube")


def shown(storage: Storage, name: str) -> dict:
    """What status shows of a stored run (no backend: storage alone)."""
    return run_view(storage, read_stored_run(storage, name))


def agree(storage: Storage, listed: list[dict]) -> None:
    for row in listed:
        view = shown(storage, row["name"])
        for key in ("state", "step", "loss", "total_steps", "restarts", "submitted_at", "accelerator"):
            assert row[key] == view[key], (key, row, view)


class CountingLocal(LocalStorage):
    """A folder root that counts listings and reads (what a bucket would bill)."""

    def __init__(self, root: str):
        super().__init__(root)
        self.lists, self.reads = 0, 0

    def list(self, prefix: str, delimiter: str | None = "/"):
        self.lists += 1
        return super().list(prefix, delimiter)

    def read_bytes(self, key: str):
        self.reads += 1
        return super().read_bytes(key)


def test_folder_list_reads_summaries_and_agrees_with_status(tmp_path):
    st = CountingLocal(str(tmp_path))
    for i in range(6):
        write_run(st, f"run{i}", steps=5 + i, state="Succeeded" if i % 2 else "Failed",
                  submitted_at=1000.0 + i)
    # An old run (no summary) still lists, the old way.
    write_stored_run(tmp_path, "old", RunShape(steps=12, config={"steps": 12}), submitted_at=999.0)
    st.lists = st.reads = 0
    listed = runs.list_runs(st)
    assert [r["name"] for r in listed] == [f"run{i}" for i in reversed(range(6))] + ["old"]
    assert [r["step"] for r in listed[:6]] == [10, 9, 8, 7, 6, 5]
    assert listed[0]["labels"]["team"] == "t5"
    assert listed[-1]["step"] == 12 and listed[-1]["state"] == "Succeeded"
    # runs/ and summaries/ once each; the old run's listing of its metrics, and reads of
    # its run.json, state.json and chunks: nothing per summarised run but its summaries
    # and, on a folder root, its run.json and state.json (a corrupt one lists as Unknown).
    assert st.lists == 3, st.lists
    assert st.reads == 6 * (3 + 2) + 3, st.reads  # its newest chunk holds a step: one chunk read
    agree(st, listed)


def test_list_and_status_agree_while_a_run_writes(tmp_path):
    """After each chunk the writer flushes, list's step and loss are status's."""
    st = LocalStorage(str(tmp_path))
    name = "live"
    summary.write_run(st, name, {"name": name, "backend": "kube", "submitted_at": 1.0})
    st.write_json(Layout.run_json(name), {"name": name, "spec": {}, "backend": "kube", "submitted_at": 1.0})
    runs.record_state(st, name, BackendStatus(state="Running", restarts=0), "kube")
    hook = summary.MetricsSummary(st, name, 0, "feed0001")
    writer = ChunkWriter(st, lambda seq: Layout.metrics_chunk(name, 0, seq, "feed0001"), interval=3600,
                         after_write=hook.after_write)
    try:
        writer.write(records.to_json(records.Header(total_steps=9)) + "\n")
        for step in range(1, 10):
            writer.write(records.to_json(records.Step(step=step, loss=1.0 / step, seconds=0.1)) + "\n")
            if step % 2:
                writer.flush()
                (row,) = runs.list_runs(st)
                assert (row["step"], row["total_steps"]) == (step, 9)
                agree(st, [row])
    finally:
        writer.close()
    (row,) = runs.list_runs(st)
    assert row["step"] == 9
    agree(st, [row])


@pytest.fixture
def counted_gcs(gcs_bucket, monkeypatch):
    """(a maker of storages through a counting proxy, the proxy, a storage straight to the
    emulator)."""
    import os

    from http_counter import CountingProxy

    direct = open_storage(gcs_bucket + "/p")
    proxy = CountingProxy(os.environ["STORAGE_EMULATOR_HOST"])
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        yield lambda: open_storage(gcs_bucket + "/p"), proxy, direct
    finally:
        proxy.close()


def test_gcs_list_requests_do_not_grow_with_runs(counted_gcs):
    counted, proxy, direct = counted_gcs
    made = 0
    counts = {}
    for n in (30, 120):
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: write_run(direct, f"r{i:04d}", steps=3, submitted_at=1000.0 + i,
                                              quick=True), range(made, n)))
        made = n
        proxy.reset()
        listed = runs.list_runs(counted())  # a fresh client: what one `xrun list` makes
        counts[n] = len(proxy.requests)
        assert len(listed) == n and all(r["step"] == 3 and r["state"] == "Succeeded" for r in listed)
        assert listed[0]["name"] == f"r{n - 1:04d}" and listed[0]["labels"]["team"] == f"t{(n - 1) % 10}"
    # The client's bucket lookup, one listing of runs/ and one of summaries/ (a page each
    # at these sizes): no read per run.
    assert counts == {30: 3, 120: 3}, (counts, proxy.requests[:6])
    agree(direct, runs.list_runs(direct)[:3])
    # A run without summaries among them lists too, at the old cost (its own reads).
    direct.write_json(Layout.run_json("old"), {"name": "old", "spec": {}, "submitted_at": 5.0})
    direct.write_json(Layout.state("old"), {"state": "Failed", "restarts": 0})
    proxy.reset()
    old = [r for r in runs.list_runs(counted()) if r["name"] == "old"]
    assert old and old[0]["state"] == "Failed" and 3 < len(proxy.requests) <= 3 + 6, proxy.requests


def test_gcs_summary_is_in_the_listing_metadata(gcs_bucket):
    st = open_storage(gcs_bucket)
    summary.write_state(st, "x", {"state": "Running", "restarts": 2})
    key = Layout.summary("x", summary.STATE_PART)
    got = st.list_summaries(Layout.SUMMARIES)
    assert got == {key: {"state": "Running", "restarts": 2, "message": "", "updated": None}}
    assert json.loads(st.read_text(key) or "") == got[key]  # the content says the same


@pytest.mark.parametrize("state", ["Succeeded", "Failed", "Running"])
def test_status_of_a_finished_run_asks_no_backend(tmp_path, monkeypatch, state):
    """A run recorded as ended is over: status reads storage only (no JobSet, no pods)."""
    from orchestrator.backends.kube.backend import KubeBackend

    asked: list[str] = []
    monkeypatch.setattr(KubeBackend, "status", lambda self, name: asked.append(name))
    st = LocalStorage(str(tmp_path))
    write_run(st, "k", steps=4, state=state)
    view = runs.status(st, "k")
    assert view["state"] == state and view["step"] == 4
    assert asked == ([] if state != "Running" else ["k"])


class _CountingStorage(LocalStorage):
    """Folder storage that counts the reads of each key."""

    def __init__(self, root: str):
        super().__init__(root)
        self.reads: dict[str, int] = {}

    def read_bytes(self, key: str) -> bytes | None:
        self.reads[key] = self.reads.get(key, 0) + 1
        return super().read_bytes(key)


@pytest.mark.parametrize("live", ["Running", "Failed"])
def test_status_reads_each_record_once_and_records_only_a_change(tmp_path, monkeypatch, live):
    """``status`` of a running cluster run reads run.json and state.json once each: the state
    it read first decides whether the backend's answer is news (Running: nothing read or
    written again; Failed: state.json is read fresh and the transition appended)."""
    from orchestrator.backends.kube.backend import KubeBackend

    st = _CountingStorage(str(tmp_path))
    write_run(st, "k", steps=4, state="Running")
    monkeypatch.setattr(KubeBackend, "status", lambda self, name: BackendStatus(state=live, restarts=0))
    before = (st.read_json(Layout.state("k")) or {})["transitions"]
    st.reads.clear()
    warned: list[str] = []
    view = runs.status(st, "k", warn=warned.append)
    assert view["state"] == live and view["step"] == 4 and warned == []
    assert st.reads[Layout.run_json("k")] == 1
    assert st.reads[Layout.state("k")] == (1 if live == "Running" else 3)  # + record_state's, + the view's
    stored = st.read_json(Layout.state("k")) or {}
    assert stored["state"] == live
    assert [t["state"] for t in stored["transitions"]] == [t["state"] for t in before] + (
        [] if live == "Running" else ["Failed"])


def test_status_warns_of_a_corrupt_record_it_read(tmp_path, monkeypatch):
    """The corrupt state.json ``status`` read is said through ``warn`` (the CLI's one line),
    without reading the records again."""
    from orchestrator.backends.kube.backend import KubeBackend

    monkeypatch.setattr(KubeBackend, "status", lambda self, name: None)  # the JobSet is gone
    st = _CountingStorage(str(tmp_path))
    write_run(st, "k", steps=4, state="Succeeded")
    st.write_text(Layout.state("k"), '{"state": "Succ')
    st.reads.clear()
    warned: list[str] = []
    view = runs.status(st, "k", warn=warned.append)
    assert view["state"] == "Unknown"
    assert len(warned) == 1 and warned[0].startswith(f"run k: {st.url(Layout.state('k'))} is corrupt (not valid JSON")
    assert warned[0].endswith("): state Unknown")
    assert st.reads[Layout.state("k")] == 1 and st.reads[Layout.run_json("k")] == 1
