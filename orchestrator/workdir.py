"""``workdir``: the user's working tree packed into one deterministic, content-addressed archive.

What is packed: in a git checkout, the files git would track (``git ls-files --cached
--others --exclude-standard``: committed, staged and new files, never .gitignored ones);
elsewhere every file. In both, the patterns of an ``.xrunignore`` at the tree's top are
left out too. The archive is a tar.gz whose bytes depend only on the files' paths, contents
and executable bits (sorted entries, mtime 0, uid/gid 0, no user names, modes 0644/0755, a
gzip header without name or time), so its sha256 names it: ``<root>/code/<sha256>.tar.gz``
(``xrun_contract.Layout.code``), and an unchanged tree is the same object.

Refused with exit 2, nothing uploaded: a tree over the size limit (the five largest files
named), files that look like credentials (``*.pem``, ``*.key``, ``.env``,
``credentials*.json``, ``id_rsa*``) unless allowed in ``.xrunignore``'s ``[allow]`` section
or with ``--allow-file``, and symlinks that are absolute or leave the tree.

``.xrunignore``: one gitignore-style glob per line (``#`` comments; ``dir/`` a folder
anywhere; a pattern with a ``/`` inside is anchored at the top). Lines after a line
``[allow]`` are paths or globs of credential-looking files that may be shipped.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import os
import stat
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xrun_contract.errors import EXIT_USAGE, XrunError
from xrun_contract.storage import file_kind

IGNORE_FILE = ".xrunignore"
MAX_IGNORE_BYTES = 1 << 20  # patterns, not data
ALLOW_SECTION = "[allow]"
DEFAULT_MAX_MB = 200.0
# What a credential looks like (matched against the file's name).
CREDENTIAL_PATTERNS = ("*.pem", "*.key", ".env", "credentials*.json", "id_rsa*")
GIT_TIMEOUT_S = 60


@dataclass
class GitInfo:
    """Where the tree came from: the checkout's HEAD, its branch, and what is uncommitted."""

    commit: str = ""
    branch: str = ""  # "" when HEAD is detached
    dirty: bool = False
    diff_sha256: str = ""  # of the uncommitted changes (tracked diff + untracked files); "" when clean

    def to_dict(self) -> dict[str, Any]:
        return {"commit": self.commit, "branch": self.branch, "dirty": self.dirty,
                "diff_sha256": self.diff_sha256}


@dataclass
class Packed:
    """One packed tree: the archive's bytes, its sha256 and what went into it."""

    sha256: str
    data: bytes
    files: list[str]
    total_bytes: int  # of the files, before compression
    workdir: str
    git: GitInfo | None = None
    left_out: list[str] = field(default_factory=list)  # .xrunignore matches
    skipped: list[str] = field(default_factory=list)  # "path (why)": nothing to ship, said

    def record(self) -> dict[str, Any]:
        """What run.json keeps under ``code``."""
        out: dict[str, Any] = {"sha256": self.sha256, "archive_bytes": len(self.data),
                               "files": len(self.files), "file_bytes": self.total_bytes,
                               "workdir": self.workdir}
        if self.git is not None:
            out["git"] = self.git.to_dict()
        return out


def _git(folder: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    try:
        r = subprocess.run(["git", "-C", folder, *args], capture_output=True, timeout=GIT_TIMEOUT_S)
    except FileNotFoundError:
        raise XrunError("workdir: git is not installed, but the folder is a git checkout", EXIT_USAGE) from None
    except subprocess.TimeoutExpired:
        raise XrunError(f"workdir: git {args[0]} in {folder} did not answer within {GIT_TIMEOUT_S}s",
                        EXIT_USAGE) from None
    if check and r.returncode != 0:
        why = r.stderr.decode(errors="replace").strip().splitlines()
        raise XrunError(f"workdir: git {' '.join(args[:2])} failed in {folder}: {why[-1] if why else r.returncode}",
                        EXIT_USAGE)
    return r


def is_git_checkout(folder: str) -> bool:
    try:
        r = subprocess.run(["git", "-C", folder, "rev-parse", "--is-inside-work-tree"], capture_output=True,
                           timeout=GIT_TIMEOUT_S)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and r.stdout.strip() == b"true"


def _broken_git(root: str) -> None:
    """A ``.git`` git cannot use (a worktree's file naming a gone repository, a damaged
    folder): exit 2, not a tree shipped as plain files with no commit recorded."""
    try:
        r = subprocess.run(["git", "-C", root, "rev-parse", "--git-dir"], capture_output=True,
                           timeout=GIT_TIMEOUT_S)
    except FileNotFoundError:
        return  # no git here: the folder is shipped as files (as before)
    except subprocess.TimeoutExpired:
        r = None
    why = (r.stderr.decode(errors="replace").strip().splitlines() or [""])[-1] if r is not None else "no answer"
    raise XrunError(f"workdir: {os.path.join(root, '.git')} is not a usable git checkout"
                    + (f" ({why.removeprefix('fatal: ')})" if why else "")
                    + "; repair or remove it to ship the folder", EXIT_USAGE)


def git_info(folder: str) -> GitInfo:
    """HEAD's commit and branch, and whether (and how) the tree differs from it."""
    head = _git(folder, "rev-parse", "--verify", "--quiet", "HEAD", check=False)
    commit = head.stdout.decode().strip() if head.returncode == 0 else ""
    ref = _git(folder, "symbolic-ref", "--quiet", "--short", "HEAD", check=False)
    branch = ref.stdout.decode().strip() if ref.returncode == 0 else ""
    diff = _git(folder, "diff", "--binary", "HEAD", "--", ".").stdout if commit else b""
    untracked = _git(folder, "ls-files", "-z", "--others", "--exclude-standard").stdout
    h = hashlib.sha256(diff)
    for name in sorted(n for n in untracked.decode("utf-8", "surrogateescape").split("\0") if n):
        path = os.path.join(folder, name)
        h.update(b"\0untracked\0" + name.encode("utf-8", "surrogateescape") + b"\0")
        if os.path.isfile(path) and not os.path.islink(path):
            try:
                with open(path, "rb") as f:
                    h.update(hashlib.sha256(f.read()).digest())
            except FileNotFoundError:  # removed since git listed it (a build's temporary file)
                h.update(b"\0vanished\0")
            except OSError as e:
                raise XrunError(f"workdir: cannot read {_shown(name)} ({e.strerror}); it would not be shipped: "
                                f"fix it or leave it out in {IGNORE_FILE}", EXIT_USAGE) from None
    dirty = bool(diff or untracked)
    return GitInfo(commit, branch, dirty, h.hexdigest() if dirty else "")


@dataclass
class IgnoreRules:
    exclude: list[str] = field(default_factory=list)
    allow: list[str] = field(default_factory=list)

    @staticmethod
    def read(folder: str) -> IgnoreRules:
        path = os.path.join(folder, IGNORE_FILE)
        rules = IgnoreRules()
        if not os.path.isfile(path):
            return rules
        section = rules.exclude
        with open(path, "rb") as f:
            data = f.read(MAX_IGNORE_BYTES + 1)
        try:
            if b"\0" in data or len(data) > MAX_IGNORE_BYTES:
                raise ValueError
            text = data.decode("utf-8")
        except ValueError:
            raise XrunError(f"workdir: {path} is not a text file of patterns (binary, not UTF-8 or over "
                            f"{MAX_IGNORE_BYTES // 1024} KiB); its patterns would match nothing", EXIT_USAGE) from None
        for raw in text.removeprefix("\ufeff").splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.lower() == ALLOW_SECTION:
                section = rules.allow
                continue
            section.append(line)
        return rules


def matches(path: str, pattern: str) -> bool:
    """gitignore-style: 'name' or 'glob' matches any path component (or a folder of that name
    and everything below); 'dir/' a folder anywhere; 'a/b*' (a '/' inside) is anchored."""
    pattern = pattern.strip()
    folder_only = pattern.endswith("/")
    pattern = pattern.rstrip("/")
    parts = path.split("/")
    if "/" in pattern:  # anchored at the top
        pattern = pattern.lstrip("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + (0 if folder_only else 1))]
        return any(fnmatch.fnmatchcase(p, pattern) for p in prefixes)
    candidates = parts[:-1] if folder_only else parts
    return any(fnmatch.fnmatchcase(c, pattern) for c in candidates)


def looks_like_credential(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(name, p) for p in CREDENTIAL_PATTERNS)


def list_files(folder: str, unlisted: list[tuple[str, str]] | None = None) -> list[str]:
    """Relative '/'-paths of what would be packed, before .xrunignore (git's view in a checkout).
    ``unlisted`` hears each folder that could not be listed (its path, why): no permission,
    a path past PATH_MAX; the caller decides (the walk itself would drop it in silence)."""
    if is_git_checkout(folder):
        out = _git(folder, "ls-files", "-z", "--cached", "--others", "--exclude-standard").stdout
        names = sorted({n for n in out.decode("utf-8", "surrogateescape").split("\0") if n})
        # --cached still names files deleted from the tree, and submodules (folders): skip both.
        return [n for n in names if os.path.islink(os.path.join(folder, n)) or os.path.isfile(os.path.join(folder, n))]
    found = []

    def failed(e: OSError) -> None:
        if unlisted is not None and not isinstance(e, FileNotFoundError):  # vanished: nothing to list
            rel = os.path.relpath(str(e.filename or folder), folder).replace(os.sep, "/")
            unlisted.append((rel, e.strerror or str(e)))

    for dirpath, dirs, files in os.walk(folder, onerror=failed):
        dirs.sort()
        rel = os.path.relpath(dirpath, folder)
        for f in files:
            found.append(f if rel == "." else f"{rel}/{f}".replace(os.sep, "/"))
        for d in list(dirs):  # a symlinked folder is an entry, not walked into
            if os.path.islink(os.path.join(dirpath, d)):
                found.append(d if rel == "." else f"{rel}/{d}".replace(os.sep, "/"))
                dirs.remove(d)
    return sorted(found)


def _symlink_target(folder: str, rel: str) -> str:
    """A symlink's target when it stays inside the tree (relative) and exists, else exit 2."""
    target = os.readlink(os.path.join(folder, rel))
    inside = os.path.normpath(os.path.join(os.path.dirname(rel), target))
    if os.path.isabs(target) or inside == ".." or inside.startswith("../"):
        raise XrunError(f"workdir: {rel} is a symlink to {target!r}, outside the tree: "
                        f"replace it with the file or list it in {IGNORE_FILE}", EXIT_USAGE)
    if not os.path.exists(os.path.join(folder, rel)):  # it would arrive broken
        raise XrunError(f"workdir: {rel} is a dangling symlink (to {target!r}, which does not exist): "
                        f"remove it or list it in {IGNORE_FILE}", EXIT_USAGE)
    return target


def pack(folder: str, *, max_mb: float = DEFAULT_MAX_MB, allow_files: tuple[str, ...] | list[str] = ()) -> Packed:
    """The deterministic archive of ``folder`` (see the module docstring); exit 2 on what it refuses."""
    root = os.path.abspath(os.path.expanduser(folder))
    if not os.path.isdir(root):
        raise XrunError(f"workdir: {folder!r} is not a folder", EXIT_USAGE)
    checkout = is_git_checkout(root)
    if not checkout and os.path.lexists(os.path.join(root, ".git")):
        _broken_git(root)
    git = git_info(root) if checkout else None
    rules = IgnoreRules.read(root)
    files, left_out = [], []
    unlisted: list[tuple[str, str]] = []
    for rel in list_files(root, unlisted):
        if any(matches(rel, p) for p in rules.exclude):
            left_out.append(rel)
        else:
            files.append(rel)
    for rel, why in unlisted:
        if not any(matches(rel, p) or matches(f"{rel}/x", p) for p in rules.exclude):
            raise XrunError(f"workdir: cannot list {_shown(rel)} in {root} ({why}); its files would not be "
                            f"shipped: fix it or leave it out in {IGNORE_FILE}", EXIT_USAGE)
    allowed = [*rules.allow, *allow_files]
    secrets = [f for f in files if looks_like_credential(f)
               and not any(f == a.strip("/") or matches(f, a) for a in allowed)]
    if secrets:
        shown = ", ".join(secrets[:10]) + (f" and {len(secrets) - 10} more" if len(secrets) > 10 else "")
        raise XrunError(f"workdir: refusing to ship files that look like credentials: {shown}; leave them out "
                        f"({IGNORE_FILE} or .gitignore), or allow them in {IGNORE_FILE}'s {ALLOW_SECTION} "
                        "section or with --allow-file", EXIT_USAGE)
    sizes: dict[str, int] = {}
    skipped: list[str] = []
    for rel in files:
        try:
            st = os.lstat(os.path.join(root, rel))
        except FileNotFoundError:  # removed since the walk (a build's temporary file)
            skipped.append(f"{rel} (vanished while packing)")
            continue
        except OSError as e:  # a path past PATH_MAX, no permission
            raise XrunError(f"workdir: cannot read {_shown(rel)} ({e.strerror}); it would not be shipped: "
                            f"fix it or leave it out in {IGNORE_FILE}", EXIT_USAGE) from None
        if stat.S_ISLNK(st.st_mode) or stat.S_ISREG(st.st_mode):
            sizes[rel] = 0 if stat.S_ISLNK(st.st_mode) else st.st_size
        else:  # a FIFO, a socket, a device: nothing a pod could use
            skipped.append(f"{rel} ({file_kind(st.st_mode)}: not shipped)")
    files = list(sizes)
    total = sum(sizes.values())
    if total > max_mb * 1e6:
        largest = sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
        raise XrunError(f"workdir: {root} holds {total / 1e6:.1f} MB, over the {max_mb:g} MB limit "
                        f"(--max-workdir-mb); largest: "
                        + ", ".join(f"{name} ({size / 1e6:.1f} MB)" for name, size in largest)
                        + f"; leave them out in {IGNORE_FILE}", EXIT_USAGE)
    data = _archive(root, files, skipped)
    return Packed(hashlib.sha256(data).hexdigest(), data, files, total, root, git, left_out, skipped)


def _shown(rel: str) -> str:
    """A path for a one-line message: a path past PATH_MAX shown by its two ends."""
    return rel if len(rel) <= 200 else f"{rel[:80]}…{rel[-80:]} ({len(rel)} characters)"


def _archive(root: str, files: list[str], skipped: list[str]) -> bytes:
    """The tar.gz of ``files``; one removed since it was listed is dropped from ``files``
    and said in ``skipped`` (as the walk does), any other change refused in one line."""
    raw = io.BytesIO()
    vanished: set[str] = set()
    # No name and mtime 0 in the gzip header; a fixed level: the bytes depend on the tree only.
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for rel in sorted(files):
            path = os.path.join(root, rel)
            try:
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode):
                    f = open(path, "rb")  # noqa: SIM115 - closed below, after tar has read it
                target = _symlink_target(root, rel) if stat.S_ISLNK(st.st_mode) else ""
            except FileNotFoundError:  # removed since it was listed (a build's temporary file)
                vanished.add(rel)
                skipped.append(f"{rel} (vanished while packing)")
                continue
            except OSError as e:  # changed since it was listed: the tree is still being written
                raise XrunError(f"workdir: {_shown(rel)} changed while it was packed ({e.strerror}); "
                                "submit again once the tree is still, or leave it out in "
                                f"{IGNORE_FILE}", EXIT_USAGE) from None
            info = tarfile.TarInfo(rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if stat.S_ISLNK(st.st_mode):
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
                tar.addfile(info)
                continue
            if not stat.S_ISREG(st.st_mode):
                continue  # replaced by a FIFO or socket since it was listed: nothing to ship
            info.mode = 0o755 if st.st_mode & 0o111 else 0o644
            info.size = st.st_size
            with f:
                try:
                    tar.addfile(info, f)
                except OSError:  # it shrank while read
                    raise XrunError(f"workdir: {_shown(rel)} changed while it was packed; submit again "
                                    f"once the tree is still, or leave it out in {IGNORE_FILE}", EXIT_USAGE) from None
    files[:] = [f for f in files if f not in vanished]
    return raw.getvalue()


def short(sha256: str) -> str:
    return sha256[:12]


def resolve(workdir: str, base: str | Path | None = None) -> str:
    """A workdir as an absolute path (relative ones from ``base``: the run file's folder)."""
    path = os.path.expanduser(workdir)
    if not os.path.isabs(path) and base is not None:
        path = os.path.join(str(base), path)
    return os.path.abspath(path)
