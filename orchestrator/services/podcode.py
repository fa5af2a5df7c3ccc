"""xrun's pod code for cluster runs without ``xrun_image``: packed, named, uploaded once.

``bundle`` zips ``manifests.podcode.POD_CODE_FILES`` from this installation deterministically
(sorted names, fixed timestamps), so one xrun version has one sha256 and a submit uploads
``<root>/xrun-pod/<sha256>.zip`` only when absent (an exclusive create), as a ``workdir``
archive. ``with_pod_code`` names it in a cluster spec that sets no ``xrun_image``.
"""

from __future__ import annotations

import functools
import hashlib
import io
import zipfile
from dataclasses import replace
from pathlib import Path

from manifests.podcode import POD_CODE_FILES
from manifests.spec import RunSpec
from xrun_contract import Layout
from xrun_contract.errors import EXIT_UNREACHABLE, XrunError
from xrun_contract.storage import Storage

ROOT = Path(__file__).resolve().parents[2]  # the folder holding xrun_contract/ and workload/


@functools.cache
def bundle() -> tuple[str, bytes]:
    """(sha256, zip bytes) of xrun's pod code."""
    paths = sorted({p for pattern in POD_CODE_FILES for p in ROOT.glob(pattern) if p.is_file()})
    missing = [f for f in POD_CODE_FILES if "*" not in f and not (ROOT / f).is_file()]
    if missing:  # an installation without its package data: pods would fail at start
        raise XrunError(f"xrun's pod code is incomplete in {ROOT}: no {', '.join(missing)}; reinstall xrun")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path in paths:
            info = zipfile.ZipInfo(path.relative_to(ROOT).as_posix(), date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, path.read_bytes())
    data = buf.getvalue()
    return hashlib.sha256(data).hexdigest(), data


def with_pod_code(spec: RunSpec) -> RunSpec:
    """A cluster spec without ``xrun_image`` names this xrun's pod code (a resumed run's
    stored name is replaced: its pods run the xrun that submits them)."""
    if spec.xrun_image:  # xrun's built image runs its own code: nothing to fetch or upload
        return replace(spec, pod_code_sha256="") if spec.pod_code_sha256 else spec
    if spec.backend_name != "kube":
        return spec
    return replace(spec, pod_code_sha256=bundle()[0])


def upload(storage: Storage, spec: RunSpec) -> bool:
    """Write the spec's pod code unless it is there; True when this call wrote it."""
    if not spec.pod_code_sha256:
        return False
    sha, data = bundle()
    if sha != spec.pod_code_sha256:
        raise XrunError(f"pod_code_sha256: {spec.pod_code_sha256} is not this xrun's pod code ({sha}); "
                        "leave it unset (xrun sets it)")
    key = Layout.pod_code(sha)
    try:
        if storage.exists_object(key):
            return False
        return storage.create_exclusive(key, data)
    except XrunError:
        raise
    except Exception as e:  # noqa: BLE001 - a local folder we cannot write
        raise XrunError(f"storage: cannot write {storage.url(key)}: {e}", EXIT_UNREACHABLE) from None
