"""Storage roots: a local folder or ``gs://bucket/prefix``, behind one small interface.

Both the workload (metrics, run.json, log chunks from the pod's log shipper) and the orchestrator
readers (status, logs, checkpoints, reports) use this, so a run reads back the same way from
a laptop folder or from GCS. GCS objects are never appended to: growing files (logs,
metrics) are written as numbered chunk objects by :class:`ChunkWriter`.

The interface and how failures are sorted live in ``storage_base``, the two roots in
``storage_local`` and ``storage_gcs`` (and ``gcs_http``, the standard library's); this
module picks one (``open_storage``) and writes chunks. Every name is re-exported here.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable

from xrun_contract.storage_base import (
    DEFAULT_STORAGE_TIMEOUT,
    MAX_STORAGE_TIMEOUT,
    STORAGE_TIMEOUT_ENV,
    ObjectInfo,
    Storage,
    StorageError,
    StorageFault,
    check_key,
    classify_storage_error,
    file_kind,
    http_status_of,
    storage_timeout,
    unreachable_reason,
)
from xrun_contract.storage_gcs import GCSStorage, gcs_client
from xrun_contract.storage_local import LocalStorage

# Re-exported: callers import every storage name from here.
__all__ = [
    "DEFAULT_STORAGE_TIMEOUT", "MAX_STORAGE_TIMEOUT", "STORAGE_TIMEOUT_ENV", "ChunkWriter",
    "GCSStorage", "LocalStorage", "ObjectInfo", "PeriodicFlush", "Storage", "StorageError",
    "StorageFault", "check_key", "classify_storage_error", "file_kind", "gcs_client",
    "http_status_of", "open_storage", "read_chunks", "storage_timeout", "unreachable_reason",
]
def open_storage(root: str, timeout: float | None = None) -> Storage:
    if root.startswith("gs://"):
        import importlib.util

        try:
            has_client = importlib.util.find_spec("google.cloud.storage") is not None
        except ModuleNotFoundError:  # no google namespace package at all
            has_client = False
        if not has_client:  # a plain python image (xrun's pod code): the standard library's
            from xrun_contract.gcs_http import GCSHttpStorage

            return GCSHttpStorage(root, timeout)
        return GCSStorage(root, timeout)
    if "://" in root:
        raise ValueError(f"storage: unsupported scheme in {root!r}; use a folder or gs://bucket/prefix")
    return LocalStorage(root)


def read_chunks(storage: Storage, prefix: str) -> Iterable[tuple[str, bytes]]:
    """Every object under ``prefix`` (recursively), in key order, with its content."""
    objects, _ = storage.list(prefix, delimiter=None)
    for o in objects:
        data = storage.read_bytes(o.key)
        if data is not None:
            yield o.key, data


class PeriodicFlush:
    """A daemon thread calling ``flush`` every ``interval`` seconds until ``close`` (which
    flushes once more): storage writers that batch small writes into whole objects."""

    _interval: float

    def flush(self) -> None:
        raise NotImplementedError

    def _start_flushing(self, interval: float, name: str) -> None:
        self._interval = interval
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=name)
        self._thread.start()

    def _loop(self) -> None:
        while not self._closed.wait(self._interval):
            with contextlib.suppress(Exception):  # retried at the next tick and on close
                self.flush()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        self.flush()


class ChunkWriter(PeriodicFlush):
    """Append-only text output to storage as numbered chunk objects.

    ``key_for(seq)`` names chunk ``seq``. Lines are buffered and written as a new object at
    most every ``interval`` seconds (by a background thread) and on ``close``. Nothing is
    ever rewritten, so a reader listing the chunks sees a growing, consistent prefix.
    """

    def __init__(self, storage: Storage, key_for, interval: float = 2.0, start_seq: int = 0,
                 rollup_key_for=None, rollup_every: int = 0,
                 after_write: Callable[[str | None, str], None] | None = None):
        self._storage = storage
        # Called with each chunk's key and text once it is written (the run summary's
        # writer), and with (None, "") on a flush with nothing new (a retry of its own).
        self._after_write = after_write
        self._key_for = key_for
        self._seq = start_seq
        # With ``rollup_key_for``: every ``rollup_every`` chunks, one more object holding all
        # this writer wrote so far (``rollup_key_for(last seq)``), for readers of the whole.
        self._rollup_key_for, self._rollup_every = rollup_key_for, rollup_every
        self._all: list[str] = []
        self._start = start_seq
        self._buf: list[str] = []
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._start_flushing(interval, "xrun-chunks")

    def write(self, text: str) -> None:
        with self._lock:
            self._buf.append(text)

    def flush(self) -> None:
        with self._flush_lock:
            with self._lock:
                data, self._buf = "".join(self._buf), []
            if not data:
                if self._after_write is not None:
                    with contextlib.suppress(Exception):
                        self._after_write(None, "")
                return
            try:
                for attempt in range(5):
                    try:
                        self._storage.write_bytes(self._key_for(self._seq), data.encode())
                        break
                    except Exception as e:  # noqa: BLE001 - storage hiccups must not kill the job
                        if attempt == 4 or classify_storage_error(e).permanent:
                            raise
                        time.sleep(0.5 * (attempt + 1))
            except BaseException:
                with self._lock:  # kept, in order: the next flush (or close) writes it
                    self._buf.insert(0, data)
                raise
            key = self._key_for(self._seq)
            self._seq += 1
            if self._after_write is not None:
                with contextlib.suppress(Exception):  # it retries at the next flush
                    self._after_write(key, data)
            if self._rollup_key_for is not None and self._rollup_every > 0:
                self._all.append(data)
                if (self._seq - self._start) % self._rollup_every == 0:
                    with contextlib.suppress(Exception):  # a rollup is an optimisation only
                        self._storage.write_bytes(self._rollup_key_for(self._seq - 1),
                                                  "".join(self._all).encode())

    def __enter__(self) -> ChunkWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
