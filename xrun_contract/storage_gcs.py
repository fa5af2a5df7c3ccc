"""A ``gs://bucket/prefix`` root through google-cloud-storage (``GCSStorage``)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from xrun_contract import summary as _summary
from xrun_contract.errors import EXIT_USAGE, XrunError
from xrun_contract.storage_base import (
    ObjectInfo,
    Objects,
    Storage,
    StorageError,
    _one_line,
    check_key,
    classify_storage_error,
    listing_offset,
    object_name,
    storage_timeout,
    unreachable_reason,
)


def gcs_client():
    """A google-cloud-storage client; anonymous against STORAGE_EMULATOR_HOST (tests, local)."""
    from google.cloud import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project="xrun-local", credentials=AnonymousCredentials())
    try:
        return storage.Client()
    except OSError as e:  # credentials that name no project: reading and writing objects needs none
        if "Project was not passed" not in str(e):
            raise
        return storage.Client(project="xrun-no-project")


class GCSStorage(Storage):
    """GCS through google-cloud-storage, with the library's own retry (exponential backoff on
    429/5xx and connection errors: ``google.cloud.storage.retry.DEFAULT_RETRY``) bounded by a
    total deadline per call; past it, one line naming the root and the error, exit 3."""

    def __init__(self, root: str, timeout: float | None = None):
        assert root.startswith("gs://")
        bucket, _, prefix = root[len("gs://"):].partition("/")
        self.root = root.rstrip("/")
        if not bucket:
            raise XrunError(f"storage: {root!r} names no bucket (gs://bucket/prefix)", EXIT_USAGE)
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        check_key(self.prefix)
        self.timeout = storage_timeout(timeout)
        from google.cloud.storage.retry import DEFAULT_RETRY

        # Retry.with_timeout (google-api-core >= 2.17) / with_deadline: the total time over
        # every attempt and backoff sleep; the per-request transport timeout is capped too.
        # Connection refused and DNS failures are permanent for this call (unreachable_reason).
        transient = DEFAULT_RETRY._predicate
        retry = DEFAULT_RETRY.with_predicate(
            lambda e: transient(e) and unreachable_reason(e) is None
        ).with_delay(initial=0.25, multiplier=2.0, maximum=4.0)
        self._retry = (retry.with_timeout(self.timeout) if hasattr(retry, "with_timeout")
                       else retry.with_deadline(self.timeout))
        self._rpc_timeout = (min(10.0, self.timeout), min(60.0, self.timeout))
        self._client = self._make_client()
        self._bucket = self._client.bucket(bucket)

    def _make_client(self):
        """The client, or one line (exit 3) when Google's credentials cannot be found or
        loaded: google-auth raises them as a 40-line traceback otherwise."""
        from google.auth.exceptions import GoogleAuthError

        try:
            return gcs_client()
        except GoogleAuthError as e:
            why = _one_line(e).split(". ")[0].rstrip(".")[:200]
            raise StorageError(
                f"storage: cannot reach {self.root}: no usable Google credentials ({why}); "
                "run 'gcloud auth application-default login' or set GOOGLE_APPLICATION_CREDENTIALS",
                permanent=True, why="no Google credentials", unreachable=True) from None

    def _call(self, what: str, key: str, fn):
        """Run one client call; anything but NotFound ends as exit 3 within the deadline."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        started = time.monotonic()
        try:
            return fn()
        except PreconditionFailed:
            raise
        except NotFound as e:
            if what in ("read", "delete"):  # no such object: None, or already gone
                raise
            # A write, list or delete finds no bucket: permanent (classify_storage_error).
            raise StorageError(f"storage: {self.url(key)}: cannot {what}: no such bucket "
                               f"{self.bucket_name!r} (root {self.root}): {_one_line(e)}",
                               permanent=True, why="no such bucket (HTTP 404)") from None
        except XrunError:
            raise
        except Exception as e:  # noqa: BLE001 - api errors, RetryError, transport errors
            took = time.monotonic() - started
            fault = classify_storage_error(e)
            why = unreachable_reason(e)
            if why:
                raise StorageError(f"storage: cannot reach {self.root}: {why} ({self._endpoint()}; "
                                   f"{what} {key or '/'} after {took:.1f}s)", permanent=True,
                                   why=why, unreachable=True) from None
            raise StorageError(f"storage: {self.url(key)}: cannot {what} after {took:.0f}s "
                               f"(root {self.root}): {_one_line(e)}", permanent=fault.permanent,
                               why=fault.why) from None

    def _endpoint(self) -> str:
        """The host the client talks to (the emulator's, or storage.googleapis.com)."""
        from urllib.parse import urlsplit

        url = getattr(getattr(self._client, "_connection", None), "API_BASE_URL", "") or ""
        return urlsplit(url).netloc or url or "storage.googleapis.com"

    def _name(self, key: str) -> str:
        return object_name(self.prefix, key)

    def _offset(self, start: str) -> str:
        return listing_offset(self.prefix, start)

    def _key(self, name: str) -> str:
        return name[len(self.prefix) + 1:] if self.prefix else name

    def read_bytes(self, key: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        blob = self._bucket.blob(self._name(key))
        try:
            return self._call("read", key, lambda: blob.download_as_bytes(
                retry=self._retry, timeout=self._rpc_timeout))
        except NotFound:
            return None

    def exists_object(self, key: str) -> bool:
        blob = self._bucket.blob(self._name(key))
        return bool(self._call("stat", key, lambda: blob.exists(retry=self._retry, timeout=self._rpc_timeout)))

    def delete_object(self, key: str) -> bool:
        from google.api_core.exceptions import NotFound

        blob = self._bucket.blob(self._name(key))
        try:
            self._call("delete", key, lambda: blob.delete(retry=self._retry, timeout=self._rpc_timeout))
        except NotFound:
            return False
        return True

    def write_bytes(self, key: str, data: bytes) -> None:
        blob = self._bucket.blob(self._name(key))
        self._call("write", key, lambda: blob.upload_from_string(
            data, retry=self._retry, timeout=self._rpc_timeout))

    def create_exclusive(self, key: str, data: bytes) -> bool:
        """ifGenerationMatch=0: GCS creates the object only if none exists (412 otherwise)."""
        from google.api_core.exceptions import PreconditionFailed

        blob = self._bucket.blob(self._name(key))
        try:
            self._call("create", key, lambda: blob.upload_from_string(
                data, if_generation_match=0, retry=self._retry, timeout=self._rpc_timeout))
        except PreconditionFailed:
            # A retried attempt gets 412 when our own first attempt landed but its answer was
            # lost: the object then holds exactly our (unique) bytes.
            return self.read_bytes(key) == data
        return True

    def write_summary(self, key: str, fields: dict) -> None:
        """Content and custom metadata in one upload: a reader of either sees the same."""
        text = json.dumps(fields, sort_keys=True, default=str)
        blob = self._bucket.blob(self._name(key))
        if len(text.encode()) <= _summary.METADATA_MAX:
            blob.metadata = {_summary.METADATA_KEY: text}
        self._call("write", key, lambda: blob.upload_from_string(
            text + "\n", content_type="application/json", retry=self._retry, timeout=self._rpc_timeout))

    def list_summaries(self, prefix: str) -> dict[str, dict]:
        """One listing (its pages) carries every summary in the objects' metadata (GCS's
        default projection, noAcl, includes custom metadata); one without it is read."""
        name = self._name(prefix)
        name = f"{name}/" if name else ""

        def run() -> list:
            return list(self._client.list_blobs(self._bucket, prefix=name, retry=self._retry,
                                                timeout=self._rpc_timeout))

        out: dict[str, dict] = {}
        unread: list[str] = []
        for b in self._call("list", prefix, run):
            key = self._key(b.name)
            text = (b.metadata or {}).get(_summary.METADATA_KEY)
            doc = None
            if text:
                with contextlib.suppress(ValueError):
                    doc = json.loads(text)
            if isinstance(doc, dict):
                out[key] = doc
            else:
                unread.append(key)
        for key in unread:
            doc = self.read_json(key)
            if doc is not None:
                out[key] = doc
        return out

    def update_json(self, key: str, change: Callable[[dict | None], dict | None]) -> bool:
        """ifGenerationMatch on the generation read: a write that raced ours makes GCS answer
        412, and the change is applied again to what that write left."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        for _ in range(50):
            blob = self._bucket.blob(self._name(key))
            try:
                data: bytes | None = self._call("read", key, lambda b=blob: b.download_as_bytes(
                    retry=self._retry, timeout=self._rpc_timeout))
                generation = int(blob.generation or 0)
            except NotFound:
                data, generation = None, 0
            doc = None
            if data is not None:
                with contextlib.suppress(ValueError):
                    loaded = json.loads(data.decode("utf-8"))
                    doc = loaded if isinstance(loaded, dict) else None
            new = change(doc)
            if new is None:
                return False
            text = json.dumps(new, indent=2, sort_keys=True, default=str) + "\n"
            try:
                self._call("write", key, lambda b=blob, t=text, g=generation: b.upload_from_string(
                    t, if_generation_match=g, retry=self._retry, timeout=self._rpc_timeout))
                return True
            except PreconditionFailed:
                time.sleep(0.05)
        raise StorageError(f"storage: {self.url(key)}: cannot update: 50 writes raced this one",
                           permanent=False, why="contended")

    def list(self, prefix: str, delimiter: str | None = "/") -> tuple[list[ObjectInfo], list[str]]:
        name = self._name(prefix)
        name = f"{name}/" if name else ""

        def run() -> tuple[list, list[str]]:
            it = self._client.list_blobs(self._bucket, prefix=name, delimiter=delimiter,
                                         retry=self._retry, timeout=self._rpc_timeout)
            blobs = list(it)  # pages are fetched here: inside the deadline
            return blobs, list(it.prefixes) if delimiter else []

        blobs, raw_prefixes = self._call("list", prefix, run)
        prefixes = sorted(self._key(p.rstrip("/")) for p in raw_prefixes)
        return self._objects(blobs), prefixes

    # A request answers at most 1,000 objects; its round trip costs about what listing a
    # hundred more does (the client builds a Blob of each item).
    listing_cost = 100

    def list_from(self, prefix: str, start: str) -> Objects:
        """objects.list with ``startOffset``: "Filter results to objects whose names are
        lexicographically equal to or after startOffset" (the JSON API reference,
        https://cloud.google.com/storage/docs/json_api/v1/objects/list): the store skips the
        names before it, so a poll transfers what is new, not the run's every chunk."""
        name = self._name(prefix)
        name = f"{name}/" if name else ""
        offset = self._offset(start) if start.strip("/") else None

        def run() -> list:
            return list(self._client.list_blobs(self._bucket, prefix=name, start_offset=offset,
                                                retry=self._retry, timeout=self._rpc_timeout))

        return self._objects(self._call("list", prefix, run))

    def _objects(self, blobs: Iterable[Any]) -> Objects:
        objects = [
            ObjectInfo(self._key(b.name), b.size or 0, b.updated.timestamp() if b.updated else 0.0)
            for b in blobs
            if not b.name.endswith("/")
        ]
        objects.sort(key=lambda o: o.key)
        return objects

    def delete_prefix(self, prefix: str) -> int:
        from google.api_core.exceptions import NotFound

        if not check_key(prefix).strip("/"):
            raise XrunError(f"storage: refusing to delete the whole root {self.root}", EXIT_USAGE)
        objects, _ = self.list(prefix, delimiter=None)
        # run.json last: a new submit of the name can only begin once it is gone (its
        # exclusive create), so nothing a new run writes is in this listing's deletions.
        objects.sort(key=lambda o: o.key.endswith("/run.json"))
        for o in objects:
            blob = self._bucket.blob(self._name(o.key))
            with contextlib.suppress(NotFound):  # deleted meanwhile: gone is what we want
                self._call("delete", o.key, lambda b=blob: b.delete(retry=self._retry,
                                                                   timeout=self._rpc_timeout))
        return len(objects)

    def url(self, key: str = "") -> str:
        return f"{self.root}/{key.strip('/')}" if key else self.root
