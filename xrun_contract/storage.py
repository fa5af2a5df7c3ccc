"""Storage roots: a local folder or ``gs://bucket/prefix``, behind one small interface.

Both the workload (metrics, run.json, log chunks from the pod's log shipper) and the orchestrator
readers (status, logs, checkpoints, reports) use this, so a run reads back the same way from
a laptop folder or from GCS. GCS objects are never appended to: growing files (logs,
metrics) are written as numbered chunk objects by :class:`ChunkWriter`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from xrun_contract import summary as _summary
from xrun_contract.errors import EXIT_UNREACHABLE, EXIT_USAGE, XrunError

# The total time one storage call may take, retries included, before the command gives up
# with exit 3: ``--storage-timeout`` or this env var (seconds), default 30.
STORAGE_TIMEOUT_ENV = "XRUN_STORAGE_TIMEOUT"
DEFAULT_STORAGE_TIMEOUT = 30.0
MAX_STORAGE_TIMEOUT = 3600.0


def storage_timeout(value: str | float | None = None) -> float:
    """The per-call deadline: ``value``, else $XRUN_STORAGE_TIMEOUT, else 30 s (bad = exit 2)."""
    raw = value if value is not None else os.environ.get(STORAGE_TIMEOUT_ENV)
    if raw is None or raw == "":
        return DEFAULT_STORAGE_TIMEOUT
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not 0 < seconds <= MAX_STORAGE_TIMEOUT:
        raise XrunError(f"storage timeout: {raw!r} must be seconds in (0, {MAX_STORAGE_TIMEOUT:g}] "
                        f"(--storage-timeout or {STORAGE_TIMEOUT_ENV})", EXIT_USAGE)
    return seconds


def check_key(key: str) -> str:
    """A key must stay under the root: no '..' or '.' segments, no NUL, no backslash."""
    parts = [p for p in key.split("/") if p]
    if any(p in (".", "..") for p in parts) or "\\" in key or "\0" in key:
        raise XrunError(f"storage: key {key!r} would leave the storage root", EXIT_USAGE)
    return key


def file_kind(mode: int) -> str:
    """'a FIFO', 'a character device', ... for a file that is not a regular file."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def unreachable_reason(e: BaseException) -> str | None:
    """'connection refused' or 'DNS lookup failed' when ``e`` (or what it wraps: requests
    -> urllib3 MaxRetryError -> NewConnectionError -> the OSError) says the endpoint cannot
    be reached at all; None for anything else. Both are known at once and do not heal in a
    retry's seconds: retrying them only spent the whole storage timeout (27-30 s) before
    the same exit 3."""
    import socket

    seen: set[int] = set()
    todo: list[BaseException] = [e]
    while todo:
        c = todo.pop()
        if id(c) in seen or len(seen) > 32:
            continue
        seen.add(id(c))
        if isinstance(c, ConnectionRefusedError):
            return "connection refused"
        if isinstance(c, socket.gaierror) or type(c).__name__ == "NameResolutionError":
            return "DNS lookup failed"
        for nxt in (c.__cause__, c.__context__, getattr(c, "reason", None), getattr(c, "cause", None),
                    *getattr(c, "args", ())):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
    return None


# The one place storage errors are sorted (the supervisor, the log shipper, the workload and
# the CLI all ask ``classify_storage_error``). Permanent: retrying cannot help within the
# call's deadline (a full disk, a path through a file, no permission, no such bucket; a
# refused connection or a failed DNS lookup, for that call), so the caller is told in
# seconds with one line. Transient: 5xx, 429, 408, resets and timeouts, retried within the
# caller's deadline.
PERMANENT_ERRNOS = {
    errno.ENOSPC: "storage full",
    errno.EDQUOT: "storage full (quota)",
    errno.ENOTDIR: "a path component is a file, not a folder",
    errno.EISDIR: "is a folder",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
    errno.ENAMETOOLONG: "name too long",
}
_HTTP_TEXT_RE = re.compile(
    r"(?:HTTP (?:response )?(?:code|status)[: ]+|http_response_code='|^)(?P<code>[1-5]\d\d)\b", re.I)
_TRANSIENT_NAMES = {
    "ConnectionResetError", "ConnectionAbortedError", "BrokenPipeError", "TimeoutError",
    "timeout", "ReadTimeout", "ConnectTimeout", "Timeout", "ReadTimeoutError", "ProtocolError",
    "RemoteDisconnected", "IncompleteRead", "ChunkedEncodingError", "RetryError", "DeadlineExceeded",
    "ServerError", "TooManyRequests", "ServiceUnavailable", "InternalServerError", "BadGateway",
    "GatewayTimeout",
}


@dataclass(frozen=True)
class StorageFault:
    """What a storage error is: ``permanent`` (do not retry) or transient, and why, in words."""

    permanent: bool
    why: str
    # Permanent for this call only: the endpoint refused the connection or its name did not
    # resolve. Known at once, not worth retrying within the call; a later call may work.
    unreachable: bool = False


def _causes(e: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    todo: list[BaseException] = [e]
    seen: set[int] = set()
    while todo and len(seen) <= 32:
        c = todo.pop(0)
        if id(c) in seen:
            continue
        seen.add(id(c))
        out.append(c)
        for nxt in (c.__cause__, c.__context__, getattr(c, "reason", None), getattr(c, "cause", None),
                    *getattr(c, "args", ()), *(getattr(c, "exceptions", None) or ())):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
    return out


def http_status_of(e: BaseException) -> int | None:
    """The HTTP status a storage client error carries (google-api-core ``code``, gcsfs
    ``code``, requests' ``response.status_code``), or None."""
    for attr in ("code", "status", "status_code"):
        value = getattr(e, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value < 600:
            return value
    response = getattr(e, "response", None)
    value = getattr(response, "status_code", None)
    return value if isinstance(value, int) and 100 <= value < 600 else None


def _http_fault(code: int) -> StorageFault | None:
    if code in (408, 429) or code >= 500:
        return StorageFault(False, f"HTTP {code}")
    if code in (401, 403):
        return StorageFault(True, f"permission denied (HTTP {code})")
    if code == 404:
        return StorageFault(True, "no such bucket or object (HTTP 404)")
    if code in (400, 405, 409, 411, 413, 414):
        return StorageFault(True, f"refused (HTTP {code})")
    return None


def classify_storage_error(e: BaseException) -> StorageFault:
    """Permanent or transient, for any error a storage call raised (the exception, what
    caused it, what it wraps). Unknown errors are transient: retried within a deadline."""
    chain = _causes(e)
    for c in chain:
        if isinstance(c, StorageError):
            return StorageFault(c.permanent, c.why, c.unreachable)
    why = unreachable_reason(e)
    if why:
        return StorageFault(True, why, unreachable=True)
    for c in chain:
        if isinstance(c, OSError) and c.errno in PERMANENT_ERRNOS:
            return StorageFault(True, f"{PERMANENT_ERRNOS[c.errno]} ({errno.errorcode[c.errno]})")
        code = http_status_of(c)
        if code is not None and (fault := _http_fault(code)):
            return fault
    for c in chain:
        m = _HTTP_TEXT_RE.search(str(c)) if not isinstance(c, OSError) else None
        if m and (fault := _http_fault(int(m["code"]))):
            return fault
        if type(c).__name__ in _TRANSIENT_NAMES or isinstance(c, ConnectionError | TimeoutError):
            return StorageFault(False, type(c).__name__)
    return StorageFault(False, _one_line(e))


class StorageError(XrunError):
    """A storage call that failed, sorted (``classify_storage_error``): exit 3, one line."""

    def __init__(self, message: str, *, permanent: bool, why: str, unreachable: bool = False):
        super().__init__(message, EXIT_UNREACHABLE)
        self.permanent, self.why, self.unreachable = permanent, why, unreachable


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 300 else text[:300] + "..."


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

    def create_exclusive(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if no object of that name exists; False when one did (atomic:
        of racing creators exactly one gets True)."""
        raise NotImplementedError

    def url(self, key: str = "") -> str:
        """The full path or gs:// URL of a key (what Orbax or a user is given)."""
        raise NotImplementedError

    # Conveniences built on the primitives.
    def exists(self, key: str) -> bool:
        return self.read_bytes(key) is not None

    def exists_object(self, key: str) -> bool:
        """Whether ``key`` exists, without reading it (a metadata request on GCS): for large
        objects such as shipped working trees (``Layout.code``)."""
        return self.exists(key)

    def delete_object(self, key: str) -> bool:
        """Remove one object; False when there was none."""
        raise NotImplementedError

    def read_text(self, key: str) -> str | None:
        data = self.read_bytes(key)
        return None if data is None else data.decode("utf-8", errors="replace")

    def write_text(self, key: str, text: str) -> None:
        self.write_bytes(key, text.encode())

    def read_json(self, key: str) -> dict | None:
        """A JSON object, or None when there is none or it is not one (``read_record`` says
        which: readers of run records must tell a corrupt record from a missing one)."""
        return self.read_record(key)[0]

    def read_record(self, key: str) -> tuple[dict | None, str | None]:
        """A stored JSON record checked: (the object, None); (None, None) when there is no
        such object; (None, why) when there is one but it is not a whole JSON object (a
        truncated write, a disk error, a hand edit)."""
        data = self.read_bytes(key)
        if data is None:
            return None, None
        try:
            obj = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError:
            return None, "not UTF-8 text"
        except json.JSONDecodeError as e:
            what = "empty" if not data.strip() else f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
            return None, what
        except RecursionError:
            return None, "not valid JSON: nested too deeply"
        if not isinstance(obj, dict):
            return None, f"not a JSON object (a {type(obj).__name__})"
        return obj, None

    def write_json(self, key: str, obj: dict) -> None:
        self.write_text(key, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")

    def write_summary(self, key: str, fields: dict) -> None:
        """A small JSON summary (``xrun_contract.summary``), written atomically; where the
        storage keeps object metadata (GCS), also as metadata, so a listing returns it."""
        self.write_json(key, fields)

    def list_summaries(self, prefix: str) -> dict[str, dict]:
        """Every summary below ``prefix``: key -> fields. One listing, plus a read per
        summary the listing did not carry (a folder's: local reads, cheap)."""
        objects, _ = self.list(prefix, delimiter=None)
        out: dict[str, dict] = {}
        for o in objects:
            doc = self.read_json(o.key)
            if doc is not None:
                out[o.key] = doc
        return out

    def update_json(self, key: str, change: Callable[[dict | None], dict | None]) -> bool:
        """Read-modify-write of a JSON record with no lost update: ``change`` gets the stored
        object (None when there is none or it is corrupt) and returns the new one, or None to
        write nothing (a refused write: False). Atomic against other ``update_json`` callers
        (a lock file locally, a generation precondition on GCS)."""
        new = change(self.read_json(key))
        if new is None:
            return False
        self.write_json(key, new)
        return True


class LocalStorage(Storage):
    def __init__(self, root: str):
        self.root = str(Path(root).expanduser().absolute())

    def _path(self, key: str) -> Path:
        return Path(self.root, *[p for p in check_key(key).split("/") if p])

    def _check_root(self) -> None:
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise XrunError(f"storage: {self.root} is not a folder (a storage root is a folder "
                            "or gs://bucket/prefix)", EXIT_USAGE)

    def _failed(self, what: str, path: Path, e: OSError) -> StorageError:
        self._check_root()  # a root that is a file is bad input, whichever write found it
        fault = classify_storage_error(e)
        return StorageError(f"storage: {path}: cannot {what}: {fault.why}", permanent=fault.permanent,
                            why=fault.why)

    def read_bytes(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as e:
            raise self._failed("read", path, e) from None

    def write_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, path)  # readers never see a half-written file
        except OSError as e:
            with contextlib.suppress(OSError):  # a full disk leaves no empty .tmp behind
                tmp.unlink()
            raise self._failed("write", path, e) from None

    def update_json(self, key: str, change: Callable[[dict | None], dict | None]) -> bool:
        """flock(2) on a hidden lock file beside the record (every writer is on this machine)."""
        import fcntl

        path = self._path(key)
        lock = path.with_name(f".{path.name}.lock")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise self._failed("lock", lock, e) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return super().update_json(key, change)
        finally:
            os.close(fd)  # closing the last descriptor releases the lock

    def overwrite_in_place(self, key: str, data: bytes) -> bool:
        """Last resort on a full disk: write ``data`` into the blocks ``key`` already has
        (no new file, no rename), padded with spaces to the old size. False when the file is
        missing or its blocks are too small. Not atomic: for a final record only (the
        supervisor's end state)."""
        path = self._path(key)
        try:
            with open(path, "r+b") as f:
                st = os.fstat(f.fileno())
                room = max(st.st_size, getattr(st, "st_blocks", 0) * 512)
                if len(data) > room:
                    return False
                f.write(data + b" " * max(0, st.st_size - len(data)))
                f.flush()
                os.fsync(f.fileno())
            return True
        except OSError:
            return False

    def _list(self, base: Path, prefix: str, delimiter: str | None) -> tuple[list[ObjectInfo], list[str]]:
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
                    try:
                        st = p.stat()
                    except FileNotFoundError:  # deleted since the folder was read: gone
                        continue
                    objects.append(ObjectInfo(rel, st.st_size, st.st_mtime))
        else:
            for entry in os.scandir(base):
                if entry.name.startswith("."):
                    continue
                rel = f"{prefix}/{entry.name}" if prefix else entry.name
                if entry.is_dir():
                    prefixes.append(rel)
                else:
                    try:
                        st = entry.stat()
                    except FileNotFoundError:  # deleted since the folder was read: gone
                        continue
                    objects.append(ObjectInfo(rel, st.st_size, st.st_mtime))
        objects.sort(key=lambda o: o.key)
        prefixes.sort()
        return objects, prefixes

    def list(self, prefix: str, delimiter: str | None = "/") -> tuple[list[ObjectInfo], list[str]]:
        self._check_root()
        base = self._path(prefix)
        try:
            return self._list(base, prefix.strip("/"), delimiter)
        except OSError as e:  # a name past NAME_MAX, no permission: said, never a traceback
            raise self._failed("list", base, e) from None

    def delete_prefix(self, prefix: str) -> int:
        path = self._path(prefix)
        root = Path(self.root).resolve()
        resolved = path.resolve()
        if resolved == root or root not in resolved.parents:  # a symlink out, or the root
            raise XrunError(f"storage: refusing to delete {path}: not below {self.root}", EXIT_USAGE)
        if not path.exists():
            return 0
        # Renamed aside first (one atomic step, the name is free at once and nothing written
        # under it afterwards, by a new run of the name, is in what is removed); the hidden
        # name is skipped by listings.
        trash = path.with_name(f".{path.name}.deleting-{os.getpid()}-{threading.get_ident()}")
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return 0
        count = sum(len(files) for _, _, files in os.walk(trash))
        shutil.rmtree(trash)
        return count

    def create_exclusive(self, key: str, data: bytes) -> bool:
        """A whole file or none: written aside, then hard-linked into place (link(2) fails
        with EEXIST, so the kernel lets exactly one racing creator make it), so a reader
        never sees it half-written (a gc reading an empty run.json as corrupt). Where the
        file system has no hard links, O_CREAT|O_EXCL then the write."""
        self._check_root()
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(path):  # taken: the folder left untouched (link(2) decides a race)
            return False
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.excl")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            try:
                os.link(tmp, path)
                return True
            except FileExistsError:
                return False
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                    raise self._failed("create", path, e) from None
        except OSError as e:
            raise self._failed("create", path, e) from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        except OSError as e:
            raise self._failed("create", path, e) from None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        except OSError as e:
            with contextlib.suppress(OSError):
                path.unlink()
            raise self._failed("write", path, e) from None
        return True

    def url(self, key: str = "") -> str:
        return str(self._path(key)) if key else self.root

    def exists_object(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete_object(self, key: str) -> bool:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            return False
        return True


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
            raise StorageError(
                f"storage: cannot reach {self.root}: no usable Google credentials ({_one_line(e).split('. ')[0].rstrip('.')[:200]}); "
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
        key = check_key(key).strip("/")
        return f"{self.prefix}/{key}" if self.prefix else key

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
        objects = [
            ObjectInfo(self._key(b.name), b.size or 0, b.updated.timestamp() if b.updated else 0.0)
            for b in blobs
            if not b.name.endswith("/")
        ]
        prefixes = sorted(self._key(p.rstrip("/")) for p in raw_prefixes)
        objects.sort(key=lambda o: o.key)
        return objects, prefixes

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
