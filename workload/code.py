"""The init container's part of ``workdir``: fetch the shipped tree, check it, unpack it.

``<storage>/code/<sha256>.tar.gz`` (``xrun_contract.Layout.code``) is read from the run's
storage, its sha256 must equal the one in the manifest (``XRUN_CODE_SHA256``), and it is
unpacked into ``$XRUN_POD_DIR/code`` with tarfile's ``data`` filter (no absolute paths, no
``..``, no links out of the folder, no device files), where the launcher runs the user's
command. A missing or corrupt archive fails the init container, so the pod never starts the
command in an empty folder. Imports neither jax nor kubernetes.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import sys
import tarfile
from pathlib import Path

from xrun_contract import Env, Layout, PodFiles
from xrun_contract.storage import open_storage


class CodeError(Exception):
    """The archive cannot be used: the init container exits non-zero with this line."""


def unpack(data: bytes, sha256: str, dest: Path) -> int:
    """Check ``data`` against ``sha256`` and unpack it into ``dest`` (emptied first); the
    number of entries."""
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise CodeError(f"archive sha256 is {got}, the manifest names {sha256}: corrupt or replaced")
    if dest.exists():
        shutil.rmtree(dest)  # a restarted init container starts from nothing
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
        tar.extractall(dest, filter="data")
    return len(members)


def fetch(pod_dir: Path) -> Path | None:
    """Download, check and unpack the run's tree when the manifest names one."""
    sha256 = os.environ.get(Env.CODE_SHA256, "")
    if not sha256:
        return None
    root = os.environ.get(Env.STORAGE, "")
    if not root:
        raise CodeError(f"{Env.CODE_SHA256} is set but {Env.STORAGE} is not")
    from xrun_contract.errors import XrunError

    try:
        storage = open_storage(root)
        data = storage.read_bytes(Layout.code(sha256))
    except XrunError as e:  # storage unreachable: one line, and the pod's init fails
        raise CodeError(str(e)) from None
    if data is None:
        raise CodeError(f"no archive {storage.url(Layout.code(sha256))} (removed by 'xrun gc'?)")
    dest = pod_dir / PodFiles.CODE
    n = unpack(data, sha256, dest)
    print(f"xrun-init: workdir {sha256[:12]} ({len(data)} bytes, {n} entries) unpacked into {dest}",
          file=sys.stderr, flush=True)
    return dest
