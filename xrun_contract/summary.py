"""Run summaries: what ``xrun list`` shows of a run, kept where one listing reads it.

Each writer of a run's state keeps a small summary object of its own under
``summaries/<run>/`` (``Layout.summary``), written right after the record it summarises:

- ``run.json``: the submit service (backend, accelerator, submit time, labels);
- ``state.json``: whoever writes state.json (the local supervisor, ``record_state``);
- ``metrics-<attempt>-<writer>.json``: the workload's metrics writer, after each chunk it
  writes (the newest step record's step and loss, the header's total steps, and the key of
  the chunk they were read from, so a reader picks them in the key order status uses).

The summary is the object's content and, on GCS, also its custom metadata (one upload
writes both, atomically), which a listing returns with every object: ``list`` over a
thousand runs is one listing of ``summaries/`` (a page per 1,000 objects), not reads per run.
No writer reads or merges another's object, so none races another.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from xrun_contract.layout import Layout

METADATA_KEY = "xrun-summary"  # the custom metadata key holding the summary's JSON
METADATA_MAX = 4096  # bytes; GCS allows 8 KiB of custom metadata: larger summaries are read
RUN_PART, STATE_PART = "run", "state"
METRICS_PART = "metrics-"


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def write(storage: Any, name: str, part: str, fields: dict[str, Any]) -> None:
    """Write one summary part (content, and metadata where the storage keeps it)."""
    storage.write_summary(Layout.summary(name, part), fields)


def write_state(storage: Any, name: str, state: dict[str, Any]) -> None:
    """The state.json part: called right after state.json itself was written."""
    write(storage, name, STATE_PART, {
        "state": str(state.get("state") or ""), "restarts": int(state.get("restarts") or 0),
        "message": str(state.get("message") or ""), "updated": state.get("updated"),
    })


def write_run(storage: Any, name: str, fields: dict[str, Any]) -> None:
    """The run.json part: called by submit right after run.json was created."""
    write(storage, name, RUN_PART, fields)


class MetricsSummary:
    """Kept by the workload's metrics writer: fed each chunk it wrote (``after_write``),
    it writes its summary part when the newest step or the header changed."""

    def __init__(self, storage: Any, run: str, attempt: int, writer: str):
        self.storage, self.run = storage, run
        self.part = f"{METRICS_PART}{attempt:03d}-{writer}"
        self.fields: dict[str, Any] = {"attempt": attempt}
        self._dirty = False

    def after_write(self, key: str | None, data: str) -> None:
        """``data`` (JSONL records) was just written as chunk ``key`` (None: nothing new;
        a summary not written yet is tried again)."""
        for line in data.splitlines() if key is not None else ():
            if '"kind": "step"' not in line and '"kind": "header"' not in line:
                continue
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    continue
                if obj.get("kind") == "step" and isinstance(obj.get("step"), int):
                    self.fields.update(step=obj["step"], loss=_finite(obj.get("loss")),
                                       step_attempt=obj.get("attempt", 0), chunk=key)
                    self._dirty = True
                elif obj.get("kind") == "header" and obj.get("total_steps") is not None:
                    self.fields.update(total_steps=obj["total_steps"], header_chunk=key)
                    self._dirty = True
        if self._dirty:
            write(self.storage, self.run, self.part, self.fields)  # raises: retried next chunk
            self._dirty = False


@dataclass
class RunSummary:
    """What one listing of ``summaries/`` says about one run."""

    name: str
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def run(self) -> dict[str, Any] | None:
        return self.parts.get(RUN_PART)

    @property
    def state(self) -> dict[str, Any]:
        return self.parts.get(STATE_PART) or {}

    @property
    def has_metrics(self) -> bool:
        return any(p.startswith(METRICS_PART) for p in self.parts)

    def figures(self) -> dict[str, Any]:
        """Step and loss of the newest step record in chunk-key order (as status folds the
        chunks), and the total steps of the last header in that order."""
        metrics = [v for k, v in self.parts.items() if k.startswith(METRICS_PART)]
        stepped = [m for m in metrics if isinstance(m.get("chunk"), str)]
        headed = [m for m in metrics if isinstance(m.get("header_chunk"), str)]
        out: dict[str, Any] = {"step": None, "loss": None, "total_steps": None}
        if stepped:
            last = max(stepped, key=lambda m: m["chunk"])
            out.update(step=last.get("step"), loss=_finite(last.get("loss")))
        if headed:
            out["total_steps"] = max(headed, key=lambda m: m["header_chunk"]).get("total_steps")
        return out


def read_all(storage: Any) -> dict[str, RunSummary]:
    """Every run's summary parts, from one listing of ``summaries/`` (and its pages)."""
    out: dict[str, RunSummary] = {}
    for key, fields in storage.list_summaries(Layout.SUMMARIES).items():
        parts = key.split("/")
        if len(parts) != 3 or not parts[2].endswith(".json"):
            continue
        name, part = parts[1], parts[2].removesuffix(".json")
        out.setdefault(name, RunSummary(name)).parts[part] = fields
    return out
