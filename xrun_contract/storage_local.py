"""A local folder as a storage root (``LocalStorage``)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from xrun_contract.errors import EXIT_USAGE, XrunError
from xrun_contract.storage_base import (
    ObjectInfo,
    Objects,
    Storage,
    StorageError,
    check_key,
    classify_storage_error,
)


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

    def list_from(self, prefix: str, start: str) -> Objects:
        """A walk that enters only the folders holding keys at or after ``start`` and stats
        only the files it keeps: a chunk folder of 20,000 names costs its directory read,
        not 20,000 stats and objects. Hidden names (temporary files, a folder being
        deleted) are skipped, as ``list`` skips them."""
        self._check_root()
        base = self._path(prefix)
        out: Objects = []
        try:
            self._walk_from(base, prefix.strip("/"), start, out)
        except OSError as e:
            raise self._failed("list", base, e) from None
        out.sort(key=lambda o: o.key)
        return out

    def _walk_from(self, folder: Path, rel: str, start: str, out: Objects) -> None:
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):  # gone, or not a folder: nothing below
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            key = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_dir():
                # Every key below sorts after ``key + "/"``: the folder holds keys at or after
                # ``start`` when that does, or when ``start`` itself lies inside it.
                below = key + "/"
                if below >= start or start.startswith(below):
                    self._walk_from(Path(entry.path), key, start, out)
                continue
            if key < start:
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:  # deleted since the folder was read: gone
                continue
            out.append(ObjectInfo(key, st.st_size, st.st_mtime))

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
