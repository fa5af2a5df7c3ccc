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

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from manifests.spec import RunSpec
from orchestrator.workdir import DEFAULT_MAX_MB, Packed, pack
from xrun_contract import RUN_NAME_RE, Layout
from xrun_contract.errors import EXIT_UNREACHABLE, XrunError
from xrun_contract.storage import Storage

GRACE_S = 3600.0  # an archive this young may belong to a submit whose run.json is not written yet


@dataclass(frozen=True)
class PackOptions:
    max_mb: float = DEFAULT_MAX_MB
    allow_files: tuple[str, ...] = ()


def prepare(spec: RunSpec, options: PackOptions | None = None) -> tuple[RunSpec, Packed | None]:
    """Pack ``spec.workdir``: the spec naming the archive (git commit and branch filled in
    when the spec has none), and the packed tree. A spec without workdir is returned as is."""
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


def named_archives(storage: Storage, except_run: str = "") -> set[str]:
    """The sha256 of every archive some run.json names (``spec.code_sha256``)."""
    _, prefixes = storage.list(Layout.RUNS)
    names: set[str] = set()
    for p in prefixes:
        run = p.rsplit("/", 1)[-1]
        if run == except_run or not RUN_NAME_RE.fullmatch(run):
            continue
        record = storage.read_json(Layout.run_json(run)) or {}
        sha = ((record.get("spec") or {}).get("code_sha256") or (record.get("code") or {}).get("sha256") or "")
        if sha:
            names.add(sha)
    return names


@dataclass
class GcResult:
    removed: list[str] = field(default_factory=list)  # sha256s
    kept: int = 0  # named by some run
    young: list[str] = field(default_factory=list)  # unnamed but within GRACE_S
    bytes_removed: int = 0


def gc(storage: Storage, *, dry_run: bool = False, grace_s: float = GRACE_S,
       now: float | None = None) -> GcResult:
    """Remove every archive under ``code/`` that no run names (older than ``grace_s``)."""
    if not math.isfinite(grace_s) or grace_s < 0:  # nan would make every archive "old"
        raise XrunError(f"--grace: must be a finite number of seconds, 0 or more; got {grace_s!r}")
    objects, _ = storage.list(Layout.CODE)
    named = named_archives(storage)
    now = time.time() if now is None else now
    out = GcResult()
    for o in objects:
        name = o.key.rsplit("/", 1)[-1]
        if not name.endswith(".tar.gz"):
            continue
        sha = name.removesuffix(".tar.gz")
        if sha in named:
            out.kept += 1
        elif now - o.updated < grace_s:
            out.young.append(sha)
        else:
            out.removed.append(sha)
            out.bytes_removed += o.size
            if not dry_run:
                storage.delete_object(o.key)
    return out


def release(storage: Storage, run: str, sha256: str) -> bool:
    """``delete --purge``: remove the run's archive unless another run names it; True if removed."""
    if not sha256 or sha256 in named_archives(storage, except_run=run):
        return False
    return storage.delete_object(Layout.code(sha256))
