"""Storage roots: a local folder or ``gs://bucket/prefix``, behind one small interface.

Both the workload (metrics, run.json, log chunks from the pod's log shipper) and the orchestrator
readers (status, logs, checkpoints, reports) use this, so a run reads back the same way from
a laptop folder or from GCS. GCS objects are never appended to: growing files (logs,
metrics) are written as numbered chunk objects by :class:`ChunkWriter`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # relative to the storage root
    size: int
    updated: float  # unix seconds


class Storage:
    """Keys are '/'-separated paths relative to the root."""

    root: str

    def read_bytes(self, key: str) -> bytes | None:
        raise NotImplementedError

    def write_bytes(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def list(self, prefix: str, delimiter: str | None = "/") -> tuple[list[ObjectInfo], list[str]]:
        """Objects directly under ``prefix`` and (with a delimiter) the sub-prefixes there.

        ``prefix`` names a folder (a trailing '/' is added); sub-prefixes come back without
        the trailing '/'. With ``delimiter=None`` every object below is returned.
        """
        raise NotImplementedError

    def delete_prefix(self, prefix: str) -> int:
        raise NotImplementedError

    def url(self, key: str = "") -> str:
        """The full path or gs:// URL of a key (what Orbax or a user is given)."""
        raise NotImplementedError

    # Conveniences built on the primitives.
    def exists(self, key: str) -> bool:
        return self.read_bytes(key) is not None

    def read_text(self, key: str) -> str | None:
        data = self.read_bytes(key)
        return None if data is None else data.decode("utf-8", errors="replace")

    def write_text(self, key: str, text: str) -> None:
        self.write_bytes(key, text.encode())

    def read_json(self, key: str) -> dict | None:
        text = self.read_text(key)
        if text is None:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return None

    def write_json(self, key: str, obj: dict) -> None:
        self.write_text(key, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


class LocalStorage(Storage):
    def __init__(self, root: str):
        self.root = str(Path(root).expanduser().absolute())

    def _path(self, key: str) -> Path:
        return Path(self.root, *[p for p in key.split("/") if p])

    def read_bytes(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def write_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # readers never see a half-written file

    def list(self, prefix: str, delimiter: str | None = "/") -> tuple[list[ObjectInfo], list[str]]:
        base = self._path(prefix)
        prefix = prefix.strip("/")
        if not base.is_dir():
            return [], []
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        if delimiter is None:
            for dirpath, _dirs, files in os.walk(base):
                for f in files:
                    if f.startswith("."):
                        continue
                    p = Path(dirpath, f)
                    rel = p.relative_to(self.root).as_posix()
                    st = p.stat()
                    objects.append(ObjectInfo(rel, st.st_size, st.st_mtime))
        else:
            for entry in os.scandir(base):
                if entry.name.startswith("."):
                    continue
                rel = f"{prefix}/{entry.name}" if prefix else entry.name
                if entry.is_dir():
                    prefixes.append(rel)
                else:
                    st = entry.stat()
                    objects.append(ObjectInfo(rel, st.st_size, st.st_mtime))
        objects.sort(key=lambda o: o.key)
        prefixes.sort()
        return objects, prefixes

    def delete_prefix(self, prefix: str) -> int:
        path = self._path(prefix)
        if not path.exists():
            return 0
        count = sum(len(files) for _, _, files in os.walk(path))
        shutil.rmtree(path)
        return count

    def url(self, key: str = "") -> str:
        return str(self._path(key)) if key else self.root


def gcs_client():
    """A google-cloud-storage client; anonymous against STORAGE_EMULATOR_HOST (tests, local)."""
    from google.cloud import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project="xrun-local", credentials=AnonymousCredentials())
    return storage.Client()


class GCSStorage(Storage):
    def __init__(self, root: str):
        assert root.startswith("gs://")
        bucket, _, prefix = root[len("gs://"):].partition("/")
        self.root = root.rstrip("/")
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self._client = gcs_client()
        self._bucket = self._client.bucket(bucket)

    def _name(self, key: str) -> str:
        key = key.strip("/")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _key(self, name: str) -> str:
        return name[len(self.prefix) + 1:] if self.prefix else name

    def read_bytes(self, key: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            return self._bucket.blob(self._name(key)).download_as_bytes()
        except NotFound:
            return None

    def write_bytes(self, key: str, data: bytes) -> None:
        self._bucket.blob(self._name(key)).upload_from_string(data)

    def list(self, prefix: str, delimiter: str | None = "/") -> tuple[list[ObjectInfo], list[str]]:
        name = self._name(prefix)
        name = f"{name}/" if name else ""
        it = self._client.list_blobs(self._bucket, prefix=name, delimiter=delimiter)
        objects = [
            ObjectInfo(self._key(b.name), b.size or 0, b.updated.timestamp() if b.updated else 0.0)
            for b in it
            if not b.name.endswith("/")
        ]
        prefixes = sorted(self._key(p.rstrip("/")) for p in it.prefixes) if delimiter else []
        objects.sort(key=lambda o: o.key)
        return objects, prefixes

    def delete_prefix(self, prefix: str) -> int:
        objects, _ = self.list(prefix, delimiter=None)
        for o in objects:
            self._bucket.blob(self._name(o.key)).delete()
        return len(objects)

    def url(self, key: str = "") -> str:
        return f"{self.root}/{key.strip('/')}" if key else self.root


def open_storage(root: str) -> Storage:
    if root.startswith("gs://"):
        return GCSStorage(root)
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

    def __init__(self, storage: Storage, key_for, interval: float = 2.0, start_seq: int = 0):
        self._storage = storage
        self._key_for = key_for
        self._seq = start_seq
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
                return
            for attempt in range(5):
                try:
                    self._storage.write_bytes(self._key_for(self._seq), data.encode())
                    break
                except Exception:  # noqa: BLE001 - storage hiccups must not kill the job
                    if attempt == 4:
                        raise
                    time.sleep(0.5 * (attempt + 1))
            self._seq += 1

    def __enter__(self) -> ChunkWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
