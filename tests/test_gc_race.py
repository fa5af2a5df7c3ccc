"""gc and delete --purge racing a submit that reuses a shared archive (#40): nothing a run
needs is ever deleted.

Each round a new run is submitted (``runs.store_run`` under ``code.leased``: submit's
storage steps, without a backend) reusing one shared archive, while the previous round's
run, which names the same archive, is purged (``runs.purge_run`` and ``code.release``, as
``delete --purge`` does) and ``gc`` runs, all three started together. After the round the
new run's run.json and the archive it names must both be there. The storage is wrapped so
that every call may yield the processor first: the three threads interleave differently
every round. Folders and the GCS emulator, 200 rounds each.
"""

from __future__ import annotations

import hashlib
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from manifests.spec import RunSpec
from orchestrator.services import code, runs
from orchestrator.workdir import Packed
from xrun_contract import Layout
from xrun_contract.storage import LocalStorage, Storage, open_storage

ROUNDS = 200


class Jitter(Storage):
    """Delegates to ``inner``; before a call, with chance ``p``, yields (under 1 ms) to
    shuffle the threads."""

    def __init__(self, inner: Storage, seed: int, p: float = 0.5):
        self.inner, self.root, self._p = inner, inner.root, p
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def __getattribute__(self, name: str) -> Any:
        if name in ("inner", "root", "_p", "_rng", "_lock", "_yield") or name.startswith("__"):
            return object.__getattribute__(self, name)
        attr = getattr(object.__getattribute__(self, "inner"), name)
        if not callable(attr):
            return attr

        def call(*a: Any, **kw: Any) -> Any:
            object.__getattribute__(self, "_yield")()
            return attr(*a, **kw)
        return call

    def _yield(self) -> None:
        with self._lock:
            r = self._rng.random()
        if r < self._p:
            time.sleep(r / 1000)


def archive() -> Packed:
    data = b"a shared working tree"
    return Packed(hashlib.sha256(data).hexdigest(), data, ["train.py"], len(data), "/w")


def race(storage: Storage, rounds: int, spread_s: float, seed: int) -> dict[str, int]:
    """``spread_s``: each thread starts up to this long after the others (about one
    submit's time), so that every order of their steps comes up, whole ones included. On a
    loaded machine a submit takes longer: the spread follows the median of the last
    submits' times, so that the orders stay as mixed as on an idle one."""
    packed = archive()
    rng = random.Random(seed)
    seen = {"gc removed": 0, "purge removed": 0}

    took: list[float] = []

    def submit(name: str) -> None:
        t0 = time.perf_counter()
        spec = RunSpec(name=name, accelerator="cpu-2", storage=storage.root, code_sha256=packed.sha256,
                       workdir="/w")
        with code.leased(storage, packed.sha256):
            runs.store_run(storage, spec, packed, lambda: None)
        took.append(time.perf_counter() - t0)

    def purge(name: str) -> None:
        runs.purge_run(storage, name)
        seen["purge removed"] += code.release(storage, name, packed.sha256)

    def gc() -> None:
        seen["gc removed"] += len(code.gc(storage, grace_s=0).removed)

    submit("r0000")
    with ThreadPoolExecutor(3) as pool:
        for k in range(1, rounds + 1):
            new, old = f"r{k:04d}", f"r{k - 1:04d}"
            barrier = threading.Barrier(3)

            def go(fn: Any, *args: Any, b: threading.Barrier = barrier, after: float = 0.0) -> None:
                b.wait(timeout=30)
                time.sleep(after)  # a staggered start, not a wait for a condition
                fn(*args)

            spread = max(spread_s, statistics.median(took[-20:]))
            starts = [rng.uniform(0, spread) for _ in range(3)]
            for f in [pool.submit(go, submit, new, after=starts[0]), pool.submit(go, purge, old, after=starts[1]),
                      pool.submit(go, gc, after=starts[2])]:
                f.result(timeout=120)
            assert storage.read_json(Layout.run_json(new)) is not None, f"round {k}: {new}'s run.json lost"
            assert storage.read_json(Layout.run_json(old)) is None, f"round {k}: {old} not purged"
            assert storage.read_bytes(Layout.code(packed.sha256)) == packed.data, (
                f"round {k}: the archive {new} names is gone ({seen})")
    leftovers, _ = storage.list(Layout.CODE_LEASES, delimiter=None)
    assert leftovers == [], leftovers  # every lease and gc intent was removed
    return seen


def test_gc_and_purge_never_delete_a_reused_archive_folder(tmp_path):
    seen = race(Jitter(LocalStorage(str(tmp_path)), seed=1), ROUNDS, spread_s=0.003, seed=1)
    # The race was run, not dodged: the archive was deleted (and put back) many times.
    assert seen["purge removed"] + seen["gc removed"] > ROUNDS // 20, seen


@pytest.mark.usefixtures("gcs_emulator")
def test_gc_and_purge_never_delete_a_reused_archive_gcs(gcs_bucket):
    # (the emulator's own latency shuffles the threads: few yields needed)
    seen = race(Jitter(open_storage(gcs_bucket + "/race"), seed=2, p=0.1), ROUNDS, spread_s=0.012, seed=2)
    # The emulator's timing decides how many rounds delete: 10 of 200 in one full run, more
    # in others; a few show the race was run.
    assert seen["purge removed"] + seen["gc removed"] >= ROUNDS // 40, seen


def test_purge_of_a_folder_leaves_what_a_new_run_of_the_name_writes(tmp_path):
    """The run folder is renamed aside before it is removed: a new run.json of the same
    name written meanwhile is not in what is removed."""
    st = LocalStorage(str(tmp_path))
    st.write_json(Layout.run_json("x"), {"name": "x"})
    st.write_text(f"{Layout.run('x')}/logs/a.log", "old\n")
    assert runs.purge_run(st, "x") == 2
    st.write_json(Layout.run_json("x"), {"name": "x", "new": True})
    assert runs.purge_run(st, "nothing") == 0
    assert st.read_json(Layout.run_json("x")) == {"name": "x", "new": True}
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["x"]
