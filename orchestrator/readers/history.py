"""The nightly history under the storage root: ``history/<nightly>.jsonl``, one object per
nightly, one JSON record per run (``Layout.history``). Read back by listing the prefix."""

from __future__ import annotations

import json
from typing import Any

from xrun_contract import Layout
from xrun_contract.errors import EXIT_UNREACHABLE, XrunError
from xrun_contract.storage import Storage


def read_history(storage: Storage) -> list[dict[str, Any]]:
    """Every run record of every nightly, in object-name (time) order; bad lines are skipped."""
    try:
        objects, _ = storage.list(f"{Layout.HISTORY}/", delimiter=None)
        out: list[dict[str, Any]] = []
        for obj in sorted(objects, key=lambda o: o.key):
            if not obj.key.endswith(".jsonl"):
                continue
            for line in (storage.read_text(obj.key) or "").splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    out.append(rec)
        return out
    except XrunError:
        raise
    except Exception as e:  # noqa: BLE001 - any client error: storage is unreachable
        raise XrunError(f"storage: cannot read {storage.url(Layout.HISTORY)}: {e}", EXIT_UNREACHABLE) from None
