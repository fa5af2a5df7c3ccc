"""The nightly history under the storage root: ``history/<nightly>.jsonl``, one object per
nightly, one JSON record per run (``Layout.history``). Read back by listing the prefix."""

from __future__ import annotations

import json
import re
from typing import Any

from xrun_contract import Layout
from xrun_contract.errors import EXIT_UNREACHABLE, XrunError
from xrun_contract.storage import Storage

# A nightly's name: its start ``YYYY-mm-dd-HHMMSS``, then ``-2``, ``-3`` ... for a second
# nightly of the same second (services/nightly.py _report_stamp).
_STAMP = re.compile(r"(\d{4}-\d{2}-\d{2}-\d{6})(?:-(\d+))?\.jsonl")


def night_order(key: str) -> tuple[str, int, str]:
    """Sort key of a history object: by start, then by the same second's count ("-2" after
    none; as plain names, "...-2.jsonl" sorts before ".jsonl")."""
    name = key.rsplit("/", 1)[-1]
    m = _STAMP.fullmatch(name)
    return (m[1], int(m[2] or 1), "") if m else (name, 0, name)


def read_history(storage: Storage) -> list[dict[str, Any]]:
    """Every run record of every nightly, in time order (``night_order``); bad lines are
    skipped."""
    try:
        objects, _ = storage.list(f"{Layout.HISTORY}/", delimiter=None)
        out: list[dict[str, Any]] = []
        for obj in sorted(objects, key=lambda o: night_order(o.key)):
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
