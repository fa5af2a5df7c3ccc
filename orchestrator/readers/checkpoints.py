"""A run's checkpoints as Orbax left them in storage: committed steps and saves in flight.

One delimiter listing of the checkpoints folder, then per step only its top level and the
small ``_CHECKPOINT_METADATA`` object, so a run with thousands of steps stays cheap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from xrun_contract import Layout
from xrun_contract.checkpoints import (
    COMMIT_SUCCESS_FILE,
    COMMITTED,
    EMPTY,
    IN_PROGRESS,
    STEP_NAME_RE,
    TMP_STEP_NAME_RE,
    state_of,
    uses_commit_file,
)
from xrun_contract.storage import ObjectInfo, Storage

CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"


@dataclass
class CheckpointInfo:
    step: int
    state: str  # committed | in progress
    written_at: float | None = None  # commit time (unix seconds)
    write_seconds: float | None = None  # init -> commit
    size_bytes: int | None = None
    key: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step, "state": self.state, "written_at": self.written_at,
            "write_seconds": self.write_seconds, "size_bytes": self.size_bytes,
            "age_seconds": (time.time() - self.written_at) if self.written_at else None,
            "path": self.key,
        }


def list_checkpoints(storage: Storage, name: str, sizes: bool = False) -> list[CheckpointInfo]:
    """One delimiter listing of the checkpoints folder, then per step only its top level and
    the small ``_CHECKPOINT_METADATA`` object (``sizes=True`` lists every object: costly)."""
    base = Layout.checkpoints(name)
    _, prefixes = storage.list(base)
    out: list[CheckpointInfo] = []
    gcs = uses_commit_file(storage)
    for prefix in prefixes:
        leaf = prefix.rsplit("/", 1)[-1]
        tmp = TMP_STEP_NAME_RE.match(leaf)
        if tmp:
            out.append(CheckpointInfo(int(tmp[1]), IN_PROGRESS, key=prefix))
            continue
        m = STEP_NAME_RE.match(leaf)
        if not m:
            continue
        objects, subfolders = storage.list(prefix)
        names = {o.key.rsplit("/", 1)[-1]: o for o in objects}
        # Orbax's own rule (xrun_contract.checkpoints): rename on file systems, the commit
        # file on GCS; an empty step folder is not a checkpoint.
        state = state_of(leaf, set(names), bool(subfolders), gcs)
        if state == EMPTY:
            continue
        info = CheckpointInfo(int(m[1]), state, key=prefix)
        meta_obj: ObjectInfo | None = names.get(CHECKPOINT_METADATA)
        meta = (storage.read_json(meta_obj.key) or {}) if meta_obj is not None else {}
        init, commit = meta.get("init_timestamp_nsecs"), meta.get("commit_timestamp_nsecs")
        if info.state == COMMITTED:
            info.written_at = commit / 1e9 if commit else (names[COMMIT_SUCCESS_FILE].updated
                                                          if COMMIT_SUCCESS_FILE in names else None)
            if init and commit:
                info.write_seconds = (commit - init) / 1e9
        if sizes:
            everything, _ = storage.list(prefix, delimiter=None)
            info.size_bytes = sum(o.size for o in everything)
        out.append(info)
    out.sort(key=lambda c: c.step)
    return out


def latest_committed(checkpoints: list[CheckpointInfo]) -> CheckpointInfo | None:
    done = [c for c in checkpoints if c.state == COMMITTED]
    return done[-1] if done else None


