"""The top ops of a run's ``profile=START:STEPS`` trace, for ``xrun status`` and ``report``.

The workload puts them in run.json's profile record when it writes the trace; a record
without them (a trace this xrun could not read then, or one written before it summarised)
is filled here from the trace itself, ``runs/<name>/profile/**.xplane.pb``, read from storage
(one listing and one read; ``xrun_contract.xplane`` decodes it)."""

from __future__ import annotations

from typing import Any

from xrun_contract import Layout
from xrun_contract.storage import Storage
from xrun_contract.xplane import top_ops

TOP_OPS = 10


def with_top_ops(storage: Storage | None, run: str, profile: dict[str, Any] | None
                 ) -> dict[str, Any] | None:
    """``profile`` (run.json's record) with its "top_ops", read from the stored trace where
    the record has none; "top_ops_error" says why where the trace cannot be read. Never
    raises: a profile's summary is no reason for status to fail."""
    if not profile or storage is None or "top_ops" in profile or "top_ops_error" in profile:
        return profile
    try:
        objects, _ = storage.list(Layout.profile(run), delimiter=None)
        traces = sorted(o.key for o in objects if o.key.endswith(".xplane.pb"))
        if not traces:
            return {**profile, "top_ops_error": f"no .xplane.pb under {storage.url(Layout.profile(run))}"}
        data = storage.read_bytes(traces[0])
        if data is None:
            return {**profile, "top_ops_error": f"{traces[0]} vanished"}
        return {**profile, "top_ops": top_ops(data, TOP_OPS)}
    except Exception as e:  # noqa: BLE001 - unreachable storage or a trace not understood
        return {**profile, "top_ops_error": f"{type(e).__name__}: {e}"[:300]}
