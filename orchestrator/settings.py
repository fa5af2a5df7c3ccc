"""Where things are when the user does not say: resolved once, here, from the environment.

Nothing below the services reads the environment for these: ``manifests`` stays pure and
the readers take a storage object.
"""

from __future__ import annotations

import os
from pathlib import Path

from xrun_contract import Env
from xrun_contract.errors import EXIT_USAGE, XrunError
from xrun_contract.storage import STORAGE_TIMEOUT_ENV, Storage, open_storage, storage_timeout


def default_storage() -> str:
    """Where runs live without --storage/XRUN_STORAGE: a per-user local folder."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base) / "xrun")


def absolute_root(root: str) -> str:
    """A local root as an absolute path (``~`` expanded), from the current folder; a gs://
    root (or an empty one) as given. A pod runs elsewhere (``--workdir`` unpacks the code
    into its own folder and runs there), so ``./relstore`` must be resolved before a
    manifest is rendered, or the run writes its checkpoints and metrics where nobody looks."""
    if not root or "://" in root:
        return root
    return os.path.abspath(os.path.expanduser(root))


def storage_root(explicit: str | None = None) -> str:
    """The storage root: the flag (or run file) value, else $XRUN_STORAGE, else the default;
    a local one absolute (:func:`absolute_root`)."""
    return absolute_root(explicit or os.environ.get(Env.STORAGE) or default_storage())


def open_root(explicit: str | None = None) -> Storage:
    """The storage of :func:`storage_root`; a malformed root is bad input (exit 2)."""
    root = storage_root(explicit)
    try:
        return open_storage(root)
    except ValueError as e:
        raise XrunError(f"storage: {e}", EXIT_USAGE) from None


def set_storage_timeout(seconds: str | float | None) -> None:
    """``--storage-timeout``: validated (exit 2 when bad), then exported as
    $XRUN_STORAGE_TIMEOUT, the one place every ``open_storage`` of this process reads."""
    if seconds is None:
        storage_timeout()  # a bad $XRUN_STORAGE_TIMEOUT is bad input too
        return
    os.environ[STORAGE_TIMEOUT_ENV] = repr(storage_timeout(seconds))


STALL_ENV = "XRUN_STALL_SECONDS"


def stall_floor() -> float:
    """$XRUN_STALL_SECONDS: the least silence of a Running run that counts as a stall (the
    limit is also derived from the run's own step and save times: ``figures.stall``);
    default 600, 0 turns stall detection off. A bad value is bad input (exit 2)."""
    from orchestrator.readers.figures import STALL_FLOOR_S

    text = os.environ.get(STALL_ENV, "").strip()
    if not text:
        return STALL_FLOOR_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0 and value < float("inf")):
        raise XrunError(f"{STALL_ENV}: {text!r} is not a number of seconds >= 0 (0 turns stall detection off)",
                        EXIT_USAGE)
    return value


# The Kueue LocalQueue of a cluster run that names none (run file or --queue), before the
# namespace's only LocalQueue is looked for; "none" submits without Kueue.
QUEUE_ENV = "XRUN_QUEUE"


def default_queue() -> str:
    return os.environ.get(QUEUE_ENV, "").strip()
