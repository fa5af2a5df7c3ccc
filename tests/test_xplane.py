"""``xrun_contract.xplane``: the top ops of a trace by device time, on XSpace messages encoded
here by hand in the wire format (a TPU-shaped and a GPU-shaped device plane; the CPU shape is
checked on a real trace in test_profile.py)."""

from __future__ import annotations

import pytest

from xrun_contract.xplane import ops_text, top_ops


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value: int | bytes | str) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _plane(name: str, lines: dict[str, list[tuple[str, int, int]]]) -> bytes:
    """XPlane: name 2, lines 3 (XLine: name 2, events 4 (XEvent: metadata_id 1, offset_ps 2,
    duration_ps 3)), event_metadata 4 (map entry: key 1, value 2 (XEventMetadata: id 1,
    name 2))."""
    ids: dict[str, int] = {}
    body = _field(1, 7) + _field(2, name)
    for line_name, events in lines.items():
        line = _field(1, len(ids)) + _field(2, line_name) + _field(3, 1_000)
        for op, offset, duration in events:
            meta = ids.setdefault(op, len(ids) + 1)
            line += _field(4, _field(1, meta) + _field(2, offset) + _field(3, duration))
        body += _field(3, line)
    for op, meta in ids.items():
        body += _field(4, _field(1, meta) + _field(2, _field(1, meta) + _field(2, op)))
    return _field(1, body)


def test_a_tpu_plane_counts_its_xla_ops_line_by_self_time():
    data = (_plane("/host:CPU", {"tf_XLACpu": [("host_fusion", 0, 10**12)]})
            + _plane("/device:TPU:0", {
                "XLA Modules": [("jit_train_step", 0, 100)],
                # while.1 holds fusion.1 (its body): 50 - 20 of its own.
                "XLA Ops": [("while.1", 0, 50), ("fusion.1", 10, 20), ("fusion.2", 60, 30),
                            ("fusion.1", 95, 5)],
                "Steps": [("1", 0, 100)]}))
    summary = top_ops(data)
    assert summary["where"] == "/device:TPU:0"
    assert summary["total_s"] == pytest.approx(85e-12)
    assert [(o["name"], round(o["seconds"] * 1e12), o["count"]) for o in summary["ops"]] == [
        ("fusion.2", 30, 1), ("while.1", 30, 1), ("fusion.1", 25, 2)]
    assert sum(o["share"] for o in summary["ops"]) == pytest.approx(1.0)
    assert top_ops(data, limit=1)["ops"][0]["name"] == "fusion.2"
    assert ops_text(summary, 2).startswith("fusion.2 35.3% (3e-08 ms x1), while.1 35.3%")
    assert ops_text(summary).endswith("of 8.5e-08 ms on /device:TPU:0")


def test_a_gpu_plane_without_an_xla_ops_line_counts_its_streams():
    data = _plane("/device:GPU:0", {"Stream #7(Compute)": [("gemm_fusion", 0, 40)],
                                    "Stream #9(MemcpyD2D)": [("copy.3", 5, 10)],
                                    "XLA Modules": [("jit_step", 0, 50)]})
    ops = top_ops(data)["ops"]
    assert [(o["name"], round(o["seconds"] * 1e12)) for o in ops] == [("gemm_fusion", 40), ("copy.3", 10)]


@pytest.mark.parametrize("data", [b"", b"\x0a\x05abc", b"garbage" * 10, b"\x0a\x02\x10\x01"])
def test_bytes_that_are_no_trace_raise_a_value_error(data):
    with pytest.raises(ValueError, match="not an xplane trace"):
        top_ops(data)
