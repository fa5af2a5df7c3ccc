"""TensorBoard scalars as event files under ``runs/<name>/tensorboard/`` (#14).

Why a small writer of our own instead of a library: the event-file format is tiny (TFRecord
framing around ``tensorboard.Event`` protos), GCS has no append, and the writers that exist
either append to one open file (``tensorboardX``, ``tf.summary``: fine on a disk, on gs://
they need TensorFlow's GCS filesystem) or pull in TensorFlow/protobuf-generated classes the
workload image does not need. Here each flush writes one *complete* events file as a new
object through :mod:`xrun_contract.storage` (folder or gs:// alike), and TensorBoard reads
every ``*tfevents*`` file of a folder in name order (``tensorboard/backend/event_processing/
directory_watcher.py``, ``io_wrapper.IsSummaryEventsFile``), so ``tensorboard --logdir
<storage>/runs`` shows the run while it trains.

The encoding mirrors ``tensorboard/compat/proto/event.proto`` (Event: wall_time=1 double,
step=2 int64, file_version=3 string, summary=5, session_log=6), ``summary.proto`` (Summary.
value=1; Value.tag=1, simple_value=2 float) and the TFRecord framing of ``tensorboard/
summary/writer/record_writer.py`` (length, masked CRC-32C of the length, data, masked CRC of
the data). Each file starts with ``file_version: "brain.Event:2"``; the first file of an
attempt adds ``SessionLog.START`` at its first step, so that TensorBoard drops the steps a
restarted attempt redoes (``EventAccumulator._CheckForRestartAndMaybePurge``).
"""

from __future__ import annotations

import struct
import threading
import time
from typing import Any

import google_crc32c

from xrun_contract import TENSORBOARD_SCALARS, Layout
from xrun_contract.storage import PeriodicFlush, Storage

SESSION_START = 1  # SessionLog.SessionStatus.START


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 as protobuf encodes negatives
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _bytes(number: int, data: bytes) -> bytes:
    return _field(number, 2) + _varint(len(data)) + data


def encode_event(wall_time: float, step: int, *, scalars: dict[str, float] | None = None,
                 file_version: str | None = None, session_start: bool = False) -> bytes:
    """One serialized ``Event``."""
    out = _field(1, 1) + struct.pack("<d", wall_time) + _field(2, 0) + _varint(step)
    if file_version is not None:
        out += _bytes(3, file_version.encode())
    if scalars:
        values = b"".join(
            _bytes(1, _bytes(1, tag.encode()) + _field(2, 5) + struct.pack("<f", value))
            for tag, value in scalars.items())
        out += _bytes(5, values)
    if session_start:
        out += _bytes(6, _field(1, 0) + _varint(SESSION_START))
    return out


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """TFRecord framing of one record."""
    length = struct.pack("<Q", len(record))
    return (length + struct.pack("<I", _masked_crc(length)) + record
            + struct.pack("<I", _masked_crc(record)))


class EventWriter(PeriodicFlush):
    """Buffers scalar events; a background thread (and ``close``) writes each batch as a new
    events file ``events.out.tfevents.<attempt start>.xrun.a<attempt>.<seq>``."""

    def __init__(self, storage: Storage, run: str, attempt: int, interval: float = 10.0):
        self._storage, self._attempt = storage, attempt
        self._prefix = (f"{Layout.tensorboard(run)}/events.out.tfevents."
                        f"{int(time.time()):010d}.xrun.a{attempt:03d}")
        self._seq = 0
        self._events: list[bytes] = []
        self._started = False
        self._lock = threading.Lock()
        self._start_flushing(interval, "xrun-tensorboard")

    def scalars(self, step: int, values: dict[str, float], wall_time: float | None = None) -> None:
        wall = time.time() if wall_time is None else wall_time
        with self._lock:
            if not self._started:  # this attempt's first step: TensorBoard drops later ones
                self._started = True
                self._events.append(encode_event(wall, step, session_start=True))
            self._events.append(encode_event(wall, step, scalars=values))

    def flush(self) -> None:
        with self._lock:
            events, self._events = self._events, []
            if not events:
                return
            seq = self._seq
            self._seq += 1
        head = encode_event(time.time(), 0, file_version="brain.Event:2")
        data = b"".join(frame(e) for e in (head, *events))
        try:
            self._storage.write_bytes(f"{self._prefix}.{seq:06d}", data)
        except Exception:
            with self._lock:  # keep them for the next flush, under the next name
                self._events[:0] = events
            raise


def step_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard tags of one metrics "step" record (TENSORBOARD_SCALARS)."""
    return {tag: float(record[key]) for key, tag in TENSORBOARD_SCALARS.items()
            if record.get(key) is not None}
