"""Metrics records: one typed record per kind, written by the workload, read by the readers.

Each record is one JSON line under ``runs/<name>/metrics/`` (process 0 writes them). Every
record carries ``kind``, ``time`` (unix seconds) and ``attempt`` (the JobSet restart
attempt). The writer builds these dataclasses and calls :func:`to_json`; readers call
:func:`parse` and get the same dataclass back (or None for a line that is not a record of
a known kind), so a field renamed on one side is renamed on the other.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass
class Record:
    kind: ClassVar[str] = ""
    time: float | None = None  # unix seconds
    attempt: int = 0


@dataclass
class Header(Record):
    """Versions and identity of the run (every key of HEADER_KEYS that is known)."""

    kind: ClassVar[str] = "header"
    versions: dict[str, str] = field(default_factory=dict)
    config: Any = None
    total_steps: int | None = None


@dataclass
class Params(Record):
    kind: ClassVar[str] = "params"
    params: int = 0  # total parameter count


@dataclass
class Flops(Record):
    kind: ClassVar[str] = "flops"
    tflops_per_step: float = 0.0
    learnable_pct: float = 0.0
    attention_pct: float = 0.0
    tflops_per_device: float = 0.0


@dataclass
class Memory(Record):
    kind: ClassVar[str] = "memory"
    used_gb: float = 0.0
    total_gb: float = 0.0
    pct: float = 0.0
    device: str = ""


@dataclass
class Step(Record):
    """One training step. ``tflops_per_device`` and ``tokens_per_s_per_device`` are rates."""

    kind: ClassVar[str] = "step"
    step: int = 0
    seconds: float = math.nan
    tflops_per_device: float = math.nan
    tokens_per_s_per_device: float = math.nan
    total_weights: int | None = None
    loss: float = math.nan
    checkpoint_blocked_s: float = 0.0
    grad_norm: float | None = None
    learning_rate: float | None = None
    tokens_per_s: float | None = None  # over all devices
    # Run by the quickly compiled train step while the optimized one compiled (the workload's
    # quick_compile): slower than steady state, never counted in it.
    quick: bool | None = None
    # Seconds the device sat idle between the previous step's end and this step's start,
    # waiting for the host to dispatch it (host work, a save blocking training): the steps'
    # ``seconds`` and these add up to the wall time between the first and last step's end.
    # ``time`` is when the device finished the step.
    idle_s: float | None = None


@dataclass
class Checkpoint(Record):
    """A checkpoint event, one of ``xrun_contract.CHECKPOINT_EVENTS``."""

    kind: ClassVar[str] = "checkpoint"
    step: int = 0
    event: str = ""
    seconds: float | None = None
    previous: int | None = None  # deferred: the step still being written
    error: str | None = None  # restore_failed, write_failed
    process: int | None = None  # write_failed: which process
    sync_s: float | None = None  # committed: seconds of cross-process agreement
    copy_s: float | None = None  # blocked: of those seconds, copying the state out (staging,
    # the host copy) before Orbax's save(); the rest is Orbax's own


@dataclass
class End(Record):
    kind: ClassVar[str] = "end"
    exit_code: int | None = None
    reason: str = ""
    data_bytes_read: int | None = None
    failure: str | None = None  # FAILURE_KINDS: infrastructure | user | platform


@dataclass
class Phase(Record):
    """A startup milestone (``PHASES``) reached ``seconds`` after process start; ``activity``
    is what the process does from then on (``PHASE_ACTIVITY``)."""

    kind: ClassVar[str] = "phase"
    phase: str = ""
    seconds: float = 0.0
    activity: str = ""
    step: int | None = None
    # Work done in a thread beside the main path (the "compiled" phase: the compile thread)
    # began here, seconds after process start; such a milestone's ``seconds`` is when that
    # work ended, which may be before the main path's previous milestone.
    began: float | None = None
    # The "compiled" phase: "loaded" when the executables came from the workload's
    # executable cache (no tracing or compiling), "compiled" or "compiled, written" (written
    # to that cache) otherwise.
    source: str | None = None


KINDS: dict[str, type[Record]] = {
    cls.kind: cls for cls in (Header, Params, Flops, Memory, Step, Checkpoint, End, Phase)
}


def to_dict(rec: Record) -> dict[str, Any]:
    out = {"kind": rec.kind}
    out.update({k: v for k, v in dataclasses.asdict(rec).items() if v is not None})
    return out


def to_json(rec: Record) -> str:
    """One line; NaN/inf become null (JSON has neither)."""
    data = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in to_dict(rec).items()}
    return json.dumps(data, sort_keys=True, default=str)


def _coerce(value: Any, kind: Any) -> Any:
    """A JSON value as the field's type; a value of the wrong type reads as missing."""
    text = str(kind)
    if value is None:
        return None
    if text.startswith("float"):
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    if text.startswith("int"):
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if text.startswith("str"):
        return value if isinstance(value, str) else str(value)
    if text.startswith("dict"):
        return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else None
    return value


def parse(obj: Any) -> Record | None:
    """The typed record of one decoded JSON line; None when it is not a known record."""
    if not isinstance(obj, dict):
        return None
    cls = KINDS.get(str(obj.get("kind")))
    if cls is None:
        return None
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in obj:
            continue
        value = _coerce(obj[f.name], f.type)
        if value is not None:
            kwargs[f.name] = value
    return cls(**kwargs)
