"""The top ops of a ``jax.profiler`` trace by device time, read from its ``*.xplane.pb``.

Why here: the workload summarises the trace it wrote into run.json, and ``xrun status`` /
``report`` read the trace themselves where run.json holds no summary; neither side may need
TensorFlow, xprof or (the orchestrator) jax to do it. So this is a small protobuf
wire-format reader of the XSpace message, fields as tsl/profiler/protobuf/xplane.proto
(openxla/xla) numbers them:

- XSpace: ``planes`` 1 (XPlane).
- XPlane: ``name`` 2, ``lines`` 3 (XLine), ``event_metadata`` 4 (map<int64, XEventMetadata>:
  entry key 1, value 2).
- XLine: ``name`` 2, ``events`` 4 (XEvent).
- XEvent: ``metadata_id`` 1, ``duration_ps`` 3.
- XEventMetadata: ``id`` 1, ``name`` 2.

Which events are ops: on an accelerator's plane (``/device:TPU:0``, ``/device:GPU:0``) the
events of its "XLA Ops" line (TensorBoard's op profile reads the same line); a GPU's planes
name a line per stream instead, so a device plane without that line counts every line but
the modules' and steps'. A CPU run has no device plane: XLA:CPU's thunks run on the host's
``tf_XLA...`` threads, and every event there whose name is not the runtime's own
(``ThunkExecutor::Execute``: names with ``::``) is an HLO op (``broadcast_select_fusion.1``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

_NOT_OPS_LINES = ("XLA Modules", "Steps", "XLA TraceMe", "Framework Name Scope", "Framework Ops",
                  "Source code", "Launch Stats", "Sparse Core Ops")


def _varint(mv: memoryview, pos: int) -> tuple[int, int]:
    """The base-128 varint at ``pos`` and the position after it."""
    value, shift = 0, 0
    while True:
        b = mv[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, pos


def _fields(buf: bytes | memoryview, start: int = 0, end: int | None = None
            ) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of one message: ints for varints and fixed widths,
    memoryviews for length-delimited fields."""
    mv = memoryview(buf)
    pos, end = start, len(mv) if end is None else end
    while pos < end:
        key, pos = _varint(mv, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(mv, pos)
            yield field, wire, value
        elif wire == 2:
            size, pos = _varint(mv, pos)
            if pos + size > end:
                raise ValueError(f"a field of {size} bytes runs past its message's end")
            yield field, wire, mv[pos:pos + size]
            pos += size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if pos + size > end:
                raise ValueError(f"a field of {size} bytes runs past its message's end")
            yield field, wire, int.from_bytes(mv[pos:pos + size], "little")
            pos += size
        else:
            raise ValueError(f"unsupported wire type {wire}")


def _text(value: Any) -> str:
    return bytes(value).decode("utf-8", "replace")


def _plane(buf: memoryview) -> tuple[str, dict[int, str], list[tuple[str, memoryview]]]:
    """A plane's name, its event names by metadata id, its lines (name, raw message)."""
    name, names, lines = "", {}, []
    for field, wire, value in _fields(buf):
        if wire != 2:  # none of the fields read here is a number
            continue
        if field == 2:
            name = _text(value)
        elif field == 3:
            line_name = ""
            for f, w, v in _fields(value):
                if f == 2 and w == 2:
                    line_name = _text(v)
            lines.append((line_name, value))
        elif field == 4:
            meta_id, meta_name = 0, ""
            for f, w, v in _fields(value):
                if f == 1 and w == 0:
                    meta_id = v
                elif f == 2 and w == 2:  # the XEventMetadata
                    for mf, mw, mv in _fields(v):
                        if mf == 1 and mw == 0:
                            meta_id = mv
                        elif mf == 2 and mw == 2:
                            meta_name = _text(mv)
            names[meta_id] = meta_name
    return name, names, lines


def _events(line: memoryview) -> Iterator[tuple[int, int, int]]:
    """(metadata id, offset, duration; picoseconds) of each event of a line."""
    for field, wire, value in _fields(line):
        if field == 4 and wire == 2:
            meta_id = offset = duration = 0
            for f, w, v in _fields(value):
                if w != 0:
                    continue
                if f == 1:
                    meta_id = v
                elif f == 2:
                    offset = v
                elif f == 3:
                    duration = v
            yield meta_id, offset, duration


def _self_times(events: list[tuple[str, int, int]]) -> Iterator[tuple[str, int]]:
    """(name, self time) of one line's ops: an op's duration less that of the ops nested in
    it (a while loop holds its body's ops), so that no time counts twice."""
    stack: list[list[Any]] = []  # [name, end, self time]
    for name, offset, duration in sorted(events, key=lambda e: (e[1], -e[2])):
        while stack and stack[-1][1] <= offset:
            done = stack.pop()
            yield done[0], done[2]
        if stack:
            stack[-1][2] -= min(duration, stack[-1][1] - offset)
        stack.append([name, offset + duration, duration])
    for name, _, own in reversed(stack):
        yield name, own


def top_ops(data: bytes, limit: int = 10) -> dict[str, Any]:
    """The trace's ops by device time (self time: less the ops nested in each), longest first:
    ``{"where": "/device:TPU:0" or "/host:CPU", "total_s": all ops' seconds, "ops": [{"name",
    "seconds", "count", "share"}, ...]}`` (``limit`` ops; share of total_s). Raises
    ValueError on bytes that are not a trace."""
    try:
        planes = [_plane(value) for field, wire, value in _fields(data) if field == 1 and wire == 2]
    except (IndexError, ValueError) as e:
        raise ValueError(f"not an xplane trace ({e})") from None
    if not any(name for name, _, _ in planes):
        raise ValueError("not an xplane trace (no named plane)")
    devices = [p for p in planes if p[0].startswith("/device:")]
    chosen: list[tuple[str, dict[int, str], list[memoryview]]] = []
    for name, names, plane_lines in devices:
        op_lines = [raw for line_name, raw in plane_lines if line_name == "XLA Ops"]
        if not op_lines:
            op_lines = [raw for line_name, raw in plane_lines if line_name not in _NOT_OPS_LINES]
        chosen.append((name, names, op_lines))
    if not devices:
        chosen = [(name, names, [raw for line_name, raw in plane_lines if line_name.startswith("tf_XLA")])
                  for name, names, plane_lines in planes if name.startswith("/host:")]
    sums: dict[str, list[int]] = {}
    for _, names, raws in chosen:
        for raw in raws:
            events = [(names.get(meta_id, ""), offset, duration)
                      for meta_id, offset, duration in _events(raw)]
            for op, own in _self_times([e for e in events if e[0] and (devices or "::" not in e[0])]):
                entry = sums.setdefault(op, [0, 0])
                entry[0] += max(own, 0)
                entry[1] += 1
    total = sum(ps for ps, _ in sums.values())
    ranked = sorted(sums.items(), key=lambda kv: (-kv[1][0], kv[0]))[:limit]
    where = ", ".join(sorted({name for name, _, lines in chosen if lines})) or "none"
    return {"where": where, "total_s": total / 1e12,
            "ops": [{"name": op, "seconds": ps / 1e12, "count": n,
                     "share": ps / total if total else 0.0} for op, (ps, n) in ranked]}


def ops_text(summary: dict[str, Any], limit: int = 5) -> str:
    """One line of ``top_ops``'s answer: "copy.177 17.1% (5.16 ms x2), ... of 30.2 ms on
    /host:CPU"."""
    ops = ", ".join(f"{o['name']} {100 * o['share']:.1f}% ({1e3 * o['seconds']:.3g} ms x{o['count']})"
                    for o in (summary.get("ops") or [])[:limit])
    return f"{ops or 'no ops'} of {1e3 * float(summary.get('total_s') or 0.0):.3g} ms on {summary.get('where')}"
