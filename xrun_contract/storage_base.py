"""The storage interface both sides use: keys, per-call deadlines, how a failure is
sorted (permanent or transient, unreachable), and the ``Storage`` base class."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass

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


def object_name(prefix: str, key: str) -> str:
    """A key's object name in a bucket whose root is under ``prefix`` (both GCS clients)."""
    key = check_key(key).strip("/")
    return f"{prefix}/{key}" if prefix else key


def listing_offset(prefix: str, start: str) -> str:
    """A key as a listing's bound (``startOffset``): its trailing '/' kept (``a/`` sorts
    after ``a-b``)."""
    start = check_key(start).lstrip("/")
    return f"{prefix}/{start}" if prefix else start


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


Objects = list[ObjectInfo]  # (``Storage.list`` hides the builtin inside the classes)


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

    # What one listing request costs, in objects listed: a reader picks one listing of many
    # writers' chunks or one per writer by it. 0 where a listing is a folder read (local).
    listing_cost = 0

    def list_from(self, prefix: str, start: str) -> Objects:
        """Every object below ``prefix`` (recursively) whose key sorts at or after ``start``,
        in key order: what a follow lists to find only the chunks written since its last
        poll. Here a whole listing, filtered; GCS asks the store (``startOffset``), a folder
        skips the names before ``start`` without reading their metadata."""
        objects, _ = self.list(prefix, delimiter=None)
        return [o for o in objects if o.key >= start]

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
