"""Shipped working trees (``workdir``): pack, upload once, and remove the ones no run names.

``prepare`` packs a spec's ``workdir`` (``orchestrator.workdir``) and returns the spec with
the archive's sha256 (and, from a git checkout, the commit and branch unless given);
``upload`` writes ``<root>/code/<sha256>.tar.gz`` only when absent (an exclusive create, so
an unchanged tree, a repeat or a restart uploads nothing). ``gc`` removes archives no
run.json names; ``release`` is ``delete --purge``'s part: the purged run's archive goes only
when no other run names it. Both spare archives younger than ``GRACE_S``: a submit uploads
its archive before its run.json exists.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from orchestrator.workdir import DEFAULT_MAX_MB, Packed, pack
from xrun_contract import RUN_NAME_RE, Layout, writer_id
from xrun_contract.errors import EXIT_UNREACHABLE, XrunError
from xrun_contract.storage import ObjectInfo, Storage

if TYPE_CHECKING:  # imported where a run is rendered, not by every command
    from manifests.spec import RunSpec

GRACE_S = 3600.0  # an archive this young may belong to a submit whose run.json is not written yet
LEASE_STALE_S = 3600.0  # a lease or gc intent this old was left by a process that died
SETTLE_TIMEOUT_S = 600.0  # how long a submit waits for a gc deciding on its archive

# The race between gc / delete --purge and a submit reusing an archive (#40), closed with
# two markers under code-leases/<sha256>/ and this order of steps (every step a single
# strongly consistent storage call: a folder's, or GCS's, listings and writes):
#
#   submit: s1 write lease-<id>; s2 upload unless present; s3 create run.json;
#           s4 wait until no gc-* intent is there, then upload again if absent; s5 drop lease
#   gc:     g1 write gc-<id>; g2 list leases; g3 read every run.json (names);
#           g4 delete if no lease at g2 and no name at g3; g5 drop gc-<id>
#
# Suppose g4 deleted the archive a submit needs. g2 saw no lease, so g2 < s1 (the lease
# lives until s5, after s4). If s5 < g2, then g3 > s3 and the name is seen: no deletion.
# So g1 < g2 < s1 < s4: at s4 the intent is there unless g5 (> g4) already passed; the
# submit waits for g5 either way, and its check after that finds the archive deleted and
# uploads it again. One gc's g5 cannot hide another's intent: each has its own.


def _lease_prefix(sha256: str) -> str:
    return Layout.code_lease(sha256, "").rstrip("/")


def _fresh(objects: list[ObjectInfo], now: float, kind: str) -> list[ObjectInfo]:
    return [o for o in objects if o.key.rsplit("/", 1)[-1].startswith(kind)
            and now - o.updated < LEASE_STALE_S]


@contextlib.contextmanager
def leased(storage: Storage, sha256: str) -> Iterator[None]:
    """s1 and s5: hold a lease on ``sha256`` while a submit reuses or uploads it and writes
    the run.json that names it (then the name protects it)."""
    if not sha256:
        yield
        return
    key = Layout.code_lease(sha256, f"lease-{writer_id()}")
    storage.write_bytes(key, str(time.time()).encode())
    try:
        yield
    finally:
        with contextlib.suppress(XrunError):
            storage.delete_object(key)


def settle(storage: Storage, sha256: str, packed: Packed | None,
           timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    """s4: after run.json names the archive, wait for any gc deciding on it to finish, then
    put the archive back if it removed it (a run file's ``code_sha256`` without the tree:
    exit 2, the run would not start)."""
    if not sha256:
        return
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        objects, _ = storage.list(_lease_prefix(sha256))
        if not _fresh(objects, time.time(), "gc-") or time.monotonic() > deadline:
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
    if storage.exists_object(Layout.code(sha256)):
        return
    if packed is None:
        raise XrunError(f"code_sha256: {storage.url(Layout.code(sha256))} was removed by a gc or purge "
                        "while this run was submitted; ship the tree with workdir (or --workdir DIR)")
    upload(storage, packed)


def _remove_unused(storage: Storage, candidates: list[str], except_run: str = "") -> list[str]:
    """g1-g5 for ``candidates`` (sha256s): the ones removed; leased or named ones stay, and
    all stay while some run.json is corrupt (it may name any of them)."""
    if not candidates:
        return []
    intents = [Layout.code_lease(sha, f"gc-{writer_id()}") for sha in candidates]
    for key in intents:  # g1
        storage.write_bytes(key, str(time.time()).encode())
    try:
        leased_shas = _leased(storage)  # g2
        named = read_names(storage, except_run=except_run)  # g3
        if named.corrupt:
            return []
        removed = []
        for sha in candidates:
            if sha in leased_shas or sha in named.shas:
                continue
            storage.delete_object(Layout.code(sha))  # g4
            removed.append(sha)
        return removed
    finally:
        for key in intents:  # g5
            with contextlib.suppress(XrunError):
                storage.delete_object(key)


def _leased(storage: Storage) -> set[str]:
    """The sha256s a submit holds a fresh lease on."""
    leases, _ = storage.list(Layout.CODE_LEASES, delimiter=None)
    return {o.key.split("/")[1] for o in _fresh(leases, time.time(), "lease-")}


@dataclass(frozen=True)
class PackOptions:
    max_mb: float = DEFAULT_MAX_MB
    allow_files: tuple[str, ...] = ()


def prepare(spec: RunSpec, options: PackOptions | None = None) -> tuple[RunSpec, Packed | None]:
    """Pack ``spec.workdir``: the spec naming the archive (git commit and branch filled in
    when the spec has none), and the packed tree; a cluster spec without ``xrun_image`` also
    names xrun's pod code (``podcode.with_pod_code``). Without workdir, no tree is packed."""
    from orchestrator.services.podcode import with_pod_code

    spec = with_pod_code(spec)  # a cluster run without xrun_image: its pods fetch xrun's code
    if not spec.workdir:
        return spec, None
    opts = options or PackOptions()
    packed = pack(spec.workdir, max_mb=opts.max_mb, allow_files=opts.allow_files)
    changes: dict[str, Any] = {"code_sha256": packed.sha256, "workdir": packed.workdir}
    if packed.git is not None:
        if not spec.commit and packed.git.commit:
            changes["commit"] = packed.git.commit
        if not spec.branch and packed.git.branch:
            changes["branch"] = packed.git.branch
    return replace(spec, **changes), packed


def upload(storage: Storage, packed: Packed) -> bool:
    """Write the archive unless it is there already; True when this call uploaded it."""
    key = Layout.code(packed.sha256)
    try:
        if storage.exists_object(key):
            return False
        return storage.create_exclusive(key, packed.data)
    except XrunError:
        raise
    except Exception as e:  # noqa: BLE001 - a local folder we cannot write
        raise XrunError(f"storage: cannot write {storage.url(key)}: {e}", EXIT_UNREACHABLE) from None


def check_uploaded(storage: Storage, sha256: str) -> None:
    """A run file naming ``code_sha256`` without a workdir: the archive must be there."""
    if not storage.exists_object(Layout.code(sha256)):
        raise XrunError(f"code_sha256: no archive {storage.url(Layout.code(sha256))}; ship the tree with "
                        "workdir (or --workdir DIR) instead")


@dataclass
class Names:
    shas: set[str] = field(default_factory=set)  # every archive some run.json names
    corrupt: list[str] = field(default_factory=list)  # runs whose run.json cannot be read


def named_archives(storage: Storage, except_run: str = "") -> set[str]:
    """The sha256 of every archive some readable run.json names (``spec.code_sha256``)."""
    return read_names(storage, except_run).shas


def read_names(storage: Storage, except_run: str = "") -> Names:
    """:func:`named_archives`, and the runs whose run.json is corrupt (truncated, not JSON):
    such a record may name any archive, so gc and purge keep every one while it is there."""
    _, prefixes = storage.list(Layout.RUNS)
    out = Names()
    for p in prefixes:
        run = p.rstrip("/").rsplit("/", 1)[-1]
        if run == except_run or not RUN_NAME_RE.fullmatch(run):
            continue
        record, problem = storage.read_record(Layout.run_json(run))
        if problem:
            out.corrupt.append(run)
            continue
        record = record or {}
        spec, shipped = record.get("spec"), record.get("code")
        sha = ((spec.get("code_sha256") if isinstance(spec, dict) else "")
               or (shipped.get("sha256") if isinstance(shipped, dict) else "") or "")
        if isinstance(sha, str) and sha:
            out.shas.add(sha)
    return out


@dataclass
class GcResult:
    removed: list[str] = field(default_factory=list)  # sha256s
    kept: int = 0  # named by some run
    young: list[str] = field(default_factory=list)  # unnamed but within GRACE_S
    leased: list[str] = field(default_factory=list)  # unnamed, but a submit is reusing it now
    corrupt: list[str] = field(default_factory=list)  # runs whose corrupt run.json may name any
    unnamed_kept: list[str] = field(default_factory=list)  # unnamed, kept for ``corrupt``
    bytes_removed: int = 0


def gc(storage: Storage, *, dry_run: bool = False, grace_s: float = GRACE_S,
       now: float | None = None) -> GcResult:
    """Remove every archive under ``code/`` that no run names (older than ``grace_s``).

    Never a guess: an archive a submit holds a lease on stays, and while any run.json is
    corrupt every archive stays (it may be the one that record names). ``dry_run`` decides
    the same way, so it lists exactly what gc would remove now."""
    if not math.isfinite(grace_s) or grace_s < 0:  # nan would make every archive "old"
        raise XrunError(f"--grace: must be a finite number of seconds, 0 or more; got {grace_s!r}")
    objects, _ = storage.list(Layout.CODE)
    names = read_names(storage)
    now = time.time() if now is None else now
    out = GcResult(corrupt=names.corrupt)
    candidates: dict[str, int] = {}
    for o in objects:
        name = o.key.rsplit("/", 1)[-1]
        if not name.endswith(".tar.gz"):
            continue
        sha = name.removesuffix(".tar.gz")
        if sha in names.shas:
            out.kept += 1
        elif now - o.updated < grace_s:
            out.young.append(sha)
        else:
            candidates[sha] = o.size
    if names.corrupt:
        out.unnamed_kept = list(candidates)
        return out
    leased = _leased(storage)
    out.leased = [sha for sha in candidates if sha in leased]
    candidates = {sha: size for sha, size in candidates.items() if sha not in leased}
    if dry_run:
        out.removed = list(candidates)
    else:  # decided again under the protocol above: a submit may be reusing one right now
        out.removed = _remove_unused(storage, list(candidates))
        out.kept += len(candidates) - len(out.removed)
    out.bytes_removed = sum(candidates[sha] for sha in out.removed)
    return out


def release(storage: Storage, run: str, sha256: str) -> bool:
    """``delete --purge``: remove the run's archive unless another run names it; True if removed."""
    if not sha256:
        return False
    return bool(_remove_unused(storage, [sha256], except_run=run))
