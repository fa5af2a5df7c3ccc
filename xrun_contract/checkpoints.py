"""Which checkpoint steps are committed: Orbax's own rules, in the one place both sides use.

The workload restores only from a step this module calls committed; the orchestrator's
``xrun checkpoints`` listing uses the same functions. No jax/orbax import: it reads a
:class:`xrun_contract.storage.Storage` listing.

The rules mirror orbax-checkpoint 0.12.8 (google/orbax):

* ``checkpoint/orbax/checkpoint/_src/path/step.py``: ``is_checkpoint_finalized =
  is_path_finalized``; ``_StandardNameFormat._build_metadata`` accepts a step folder only if
  it is finalized and its name matches ``^(0|[1-9]\\d*)$`` (no prefix, no padding, which is
  how ``CheckpointManager`` names xrun's steps).
* ``_src/path/temporary_paths.py`` ``is_path_finalized`` -> the path class chosen by
  ``_src/path/atomicity_defaults.py`` ``get_default_temporary_path_class``: gs:// paths use
  ``CommitFileTemporaryPath``, everything else ``AtomicRenameTemporaryPath``.
* ``_src/path/atomicity.py``: ``CommitFileTemporaryPath.validate_final`` requires
  ``<step>/commit_success.txt`` (``COMMIT_SUCCESS_FILE`` in ``atomicity_types.py``);
  ``validate_atomic_rename_final_path`` requires a folder whose name does not contain
  ``.orbax-checkpoint-tmp`` (``TMP_DIR_SUFFIX``): the tmp folder is renamed only after every
  process's data and the metadata were written.

One rule is stricter than Orbax's: a local folder that is empty is not committed. Orbax's
``validate_atomic_rename_final_path`` accepts an empty ``<step>/`` (it checks only that the
folder exists), so ``CheckpointManager.latest_step()`` would pick it and the restore fails;
an atomic rename can never produce an empty step, so an empty one was made by something else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from xrun_contract.storage import Storage

COMMIT_SUCCESS_FILE = "commit_success.txt"  # orbax _src/path/atomicity_types.py
TMP_DIR_SUFFIX = ".orbax-checkpoint-tmp"  # orbax _src/path/atomicity_types.py
STEP_NAME_RE = re.compile(r"^(0|[1-9]\d*)$")  # orbax step.py _StandardNameFormat (no prefix)
TMP_STEP_NAME_RE = re.compile(r"^(0|[1-9]\d*)" + re.escape(TMP_DIR_SUFFIX))  # step.py TMP_DIR_STEP_PATTERN

COMMITTED, IN_PROGRESS, EMPTY = "committed", "in progress", "empty"


@dataclass(frozen=True)
class StepFolder:
    """One step-like entry under a checkpoint directory and what Orbax's rules make of it."""

    step: int
    key: str  # storage key of the folder (relative to the storage root)
    state: str  # COMMITTED | IN_PROGRESS (tmp folder, or gs:// without the commit file) | EMPTY

    @property
    def committed(self) -> bool:
        return self.state == COMMITTED


def uses_commit_file(storage: Storage) -> bool:
    """gs:// storage commits with ``commit_success.txt``; folders by atomic rename
    (orbax ``atomicity_defaults.get_default_temporary_path_class``: ``is_gcs_path``)."""
    return storage.url().startswith("gs://")


def state_of(name: str, object_names: set[str], has_subfolders: bool, commit_file: bool) -> str:
    """The rule itself, on one listing of the step folder ``name``: COMMITTED, IN_PROGRESS
    or EMPTY (``commit_file``: the storage commits with commit_success.txt, i.e. gs://)."""
    if not STEP_NAME_RE.match(name):
        return IN_PROGRESS  # a tmp folder (rename not done yet) or anything else
    if commit_file:
        if COMMIT_SUCCESS_FILE in object_names:
            return COMMITTED
        return IN_PROGRESS if object_names or has_subfolders else EMPTY
    return COMMITTED if object_names or has_subfolders else EMPTY


def step_state(storage: Storage, key: str) -> str:
    """COMMITTED, IN_PROGRESS or EMPTY for the step folder at ``key`` (its name is a step)."""
    name = key.rstrip("/").rsplit("/", 1)[-1]
    if not STEP_NAME_RE.match(name):
        return IN_PROGRESS
    objects, prefixes = storage.list(key)
    return state_of(name, {o.key.rsplit("/", 1)[-1] for o in objects}, bool(prefixes),
                    uses_commit_file(storage))


def step_folders(storage: Storage, checkpoints_key: str) -> list[StepFolder]:
    """Every step folder (committed, in progress or empty) under ``checkpoints_key``, by step."""
    _, prefixes = storage.list(checkpoints_key)
    out = []
    for key in prefixes:
        name = key.rsplit("/", 1)[-1]
        m = STEP_NAME_RE.match(name) or TMP_STEP_NAME_RE.match(name)
        if m:
            out.append(StepFolder(int(m.group(1)), key, step_state(storage, key)))
    return sorted(out, key=lambda f: (f.step, f.key))


def committed_steps(storage: Storage, checkpoints_key: str) -> list[int]:
    """Committed steps under ``checkpoints_key``, ascending: the only ones a restore may use."""
    return [f.step for f in step_folders(storage, checkpoints_key) if f.committed]


def latest_committed_step(storage: Storage, checkpoints_key: str) -> int | None:
    steps = committed_steps(storage, checkpoints_key)
    return steps[-1] if steps else None
