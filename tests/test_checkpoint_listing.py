"""`xrun checkpoints` on a run with 1,000 steps, measured in HTTP requests to GCS."""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from http_counter import CountingProxy

from orchestrator.readers.checkpoints import list_checkpoints
from xrun_contract.storage import open_storage

STEPS = 1000
DATA_FILES = 5  # objects inside each committed step's item folder (never listed)


def _seed(root: str) -> None:
    """The run's objects, written straight to the emulator's upload endpoint (the JSON API's
    ``uploadType=media``), 8 at a time: the storage client's own stack costs ~30x the CPU per
    object on a loaded machine, and only the listing is under test."""
    bucket, prefix = root.removeprefix("gs://").split("/", 1)
    base_url = os.environ["STORAGE_EMULATOR_HOST"]

    def put(key: str, data: bytes) -> None:
        name = urllib.parse.quote(f"{prefix}/{key}", safe="")
        req = urllib.request.Request(
            f"{base_url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}", data=data,
            method="POST", headers={"Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200, r.status

    def step(i: int) -> None:
        base = f"runs/big/checkpoints/{i * 10}"
        meta = {"init_timestamp_nsecs": 1_700_000_000_000_000_000 + i,
                "commit_timestamp_nsecs": 1_700_000_002_500_000_000 + i}
        put(f"{base}/_CHECKPOINT_METADATA", json.dumps(meta).encode())
        if i != STEPS - 1:  # the newest step has not committed yet
            put(f"{base}/commit_success.txt", b"ok")
        if i % 100 == 0:
            for f in range(DATA_FILES):
                put(f"{base}/state/ocdbt.process_0/d/{f:04x}", b"x" * 1000)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(step, range(STEPS)))
    put("runs/big/run.json", json.dumps({"name": "big", "backend": "local"}).encode())


def test_thousand_steps_listing_cost(gcs_bucket, monkeypatch):
    root = f"{gcs_bucket}/x"
    _seed(root)
    proxy = CountingProxy(os.environ["STORAGE_EMULATOR_HOST"])
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        st = open_storage(root)
        proxy.reset()
        items = list_checkpoints(st, "big")
        calls = list(proxy.requests)
    finally:
        proxy.close()
    assert len(items) == STEPS
    assert [c.step for c in items[:3]] == [0, 10, 20]
    assert all(c.state == "committed" for c in items[:-1]) and items[-1].state == "in progress"
    assert abs(items[0].write_seconds - 2.5) < 1e-6
    # One delimiter listing of checkpoints/, then per step one delimiter listing of its top
    # level and one read of _CHECKPOINT_METADATA: ~2 requests a step, whatever the step holds.
    lists = [p for m, p in calls if m == "GET" and "/o?" in p]
    reads = [p for m, p in calls if m == "GET" and "alt=media" in p]
    assert all("delimiter=%2F" in p for p in lists), lists[:3]
    assert len(lists) <= STEPS + 2
    assert len(reads) == STEPS
    assert all("_CHECKPOINT_METADATA" in p for p in reads)
    assert len(calls) <= 2 * STEPS + 5, len(calls)
    # Nothing inside the item folders was listed or read.
    assert not any("ocdbt" in p for _, p in calls)
