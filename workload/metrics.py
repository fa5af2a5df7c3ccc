"""What the run tells the outside world: contract log lines on stdout and JSONL records in
storage (``runs/<name>/metrics/``), plus the ``workload`` section of ``run.json``.

Only process 0 writes records, TensorBoard events (``runs/<name>/tensorboard/``) and lines:
the header once per run (versions on one line, the config folded to the keys that differ
from its preset; the full config is in the "header" record and run.json), startup phases,
steps, checkpoints. Lines use the formats of :mod:`xrun_contract`, so the orchestrator's
parsers read them as-is.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any, NoReturn

from xrun_contract import (
    CKPT_BLOCKED_LINE,
    CKPT_COMMIT_LINE,
    CKPT_DEFERRED_LINE,
    CKPT_DEFERRED_STORAGE_LINE,
    CKPT_EXIT_WAIT_LINE,
    CKPT_RESTORE_FAILED_LINE,
    CKPT_RESTORED_LINE,
    CKPT_START_LINE,
    CKPT_WAIT_PREVIOUS_LINE,
    CKPT_WRITE_FAILED_LINE,
    HEADER_LINE,
    HEADER_VERSIONS_KEY,
    MEMORY_LINE,
    METRICS_ROLLUP_EVERY,
    PHASE_ACTIVITY,
    PHASE_LINE,
    PHASE_TOOK,
    Layout,
    format_flops_line,
    format_header_fields,
    format_params_line,
    format_step_line,
    records,
    significant,
    writer_id,
)
from xrun_contract.storage import ChunkWriter, Storage
from xrun_contract.summary import MetricsSummary

CHECKPOINT_LINES = {
    "started": CKPT_START_LINE,
    "blocked": CKPT_BLOCKED_LINE,
    "waited": CKPT_WAIT_PREVIOUS_LINE,
    "committed": CKPT_COMMIT_LINE,
    "restored": CKPT_RESTORED_LINE,
    "deferred": CKPT_DEFERRED_LINE,
    "exit_wait": CKPT_EXIT_WAIT_LINE,
    "restore_failed": CKPT_RESTORE_FAILED_LINE,
    "write_failed": CKPT_WRITE_FAILED_LINE,
}


def say(line: str) -> None:
    print(line, flush=True)  # logs are shipped live


def process_start_time() -> float:
    """When this process started (unix seconds), interpreter start-up included: its age is
    /proc/uptime minus /proc/self/stat's starttime (clock ticks after boot, field 22), both
    with 10 ms resolution. Elsewhere: now."""
    import os

    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # [0] is field 3
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        now = time.time()
        return now - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def next_chunk_seq(storage: Storage, run: str, attempt: int) -> int:
    """First free chunk number for this attempt, so a rerun with the same attempt appends."""
    objects, _ = storage.list(Layout.metrics(run))
    pattern = re.compile(rf"attempt-{attempt:03d}-(\d+)(?:-[0-9a-f]+)?\.jsonl$")
    seqs = [int(m.group(1)) for o in objects if (m := pattern.search(o.key))]
    return max(seqs) + 1 if seqs else 0


def folded_config(config: dict[str, Any]) -> str:
    """"preset=tiny steps=10 checkpoint_every=4": the preset and what differs from it."""
    from workload.config import PRESETS, Config

    base = {**Config().to_dict(), **PRESETS.get(config.get("preset", ""), {})}
    diff = {k: v for k, v in config.items() if k != "preset" and base.get(k) != v}
    return format_header_fields({"preset": config.get("preset", ""), **diff})


class Metrics:
    def __init__(self, storage: Storage | None, run: str | None, attempt: int, primary: bool,
                 interval: float = 2.0, process_start: float | None = None,
                 tensorboard_interval: float = 10.0):
        self.attempt, self.primary = attempt, primary
        self.process_start = time.time() if process_start is None else process_start
        self._last_activity, self._last_at = "starting", self.process_start
        self.writer: ChunkWriter | None = None
        self.events = None
        if primary and storage is not None and run:
            from workload.tensorboard import EventWriter

            start = next_chunk_seq(storage, run, attempt)
            tag = writer_id()
            self.summary = MetricsSummary(storage, run, attempt, tag)  # what `xrun list` reads
            self.writer = ChunkWriter(
                storage, lambda seq: Layout.metrics_chunk(run, attempt, seq, tag), interval, start,
                rollup_key_for=lambda seq: Layout.metrics_rollup(run, attempt, seq, tag),
                rollup_every=METRICS_ROLLUP_EVERY, after_write=self.summary.after_write)
            self.events = EventWriter(storage, run, attempt, tensorboard_interval)

    def record(self, rec: records.Record, at: float | None = None) -> None:
        """Write ``rec`` stamped now, or at ``at`` (unix time) for what happened earlier."""
        if self.writer is not None:
            rec.time, rec.attempt = time.time() if at is None else at, self.attempt
            self.writer.write(records.to_json(rec) + "\n")

    def header(self, versions: dict[str, str], config: dict[str, Any]) -> None:
        """Two lines on process 0: versions/devices/mesh, and the folded config."""
        if self.primary:
            line = {k: v for k, v in versions.items() if k != "config"}
            say(HEADER_LINE.format(key=HEADER_VERSIONS_KEY, value=format_header_fields(line)))
            say(HEADER_LINE.format(key="config", value=folded_config(config)))
            self.record(records.Header(versions=versions, config=config,
                                       total_steps=config.get("steps")))

    def phase(self, phase: str, step: int | None = None, at: float | None = None,
              quiet: bool = False, began: float | None = None,
              source: str | None = None) -> None:
        """A startup milestone (xrun_contract.PHASES) reached now (or at ``at``, unix time);
        ``quiet``: the record only (its line was printed before this object existed);
        ``began``: unix time a thread's work ending here began (records.Phase.began);
        ``source``: where the executables came from (records.Phase.source)."""
        if self.primary:
            at = time.time() if at is None else at  # one clock read: the record's time too
            seconds = at - self.process_start
            activity = PHASE_ACTIVITY[phase]
            if phase == "checkpoint_manager":
                activity = "initializing state" if step is None else activity.format(step=step)
            # The line says how long the activity that ended here took (from its own start
            # when a thread did it, ``began``); its offset is when the next one can begin:
            # never before the previous milestone (a compile thread may end first).
            ended, since = self._last_activity, self._last_at
            took = at - (began if began is not None else since)
            shown = max(at, since) - self.process_start
            if not quiet:
                say(PHASE_LINE.format(activity=activity, seconds=shown)
                    + PHASE_TOOK.format(activity=ended, seconds=significant(max(0.0, took), 3)))
            self._last_activity, self._last_at = activity, max(at, since)
            # Stamped when the milestone was reached (not when written): a record's time
            # minus its seconds is the process start, for every phase alike.
            self.record(records.Phase(
                phase=phase, seconds=seconds, activity=activity, step=step,
                began=None if began is None else began - self.process_start,
                source=source), at=at)

    def params(self, count: int) -> None:
        if self.primary:
            say(format_params_line(count))
            self.record(records.Params(params=count))

    def flops(self, tflops_per_step: float, learnable_pct: float, attention_pct: float,
              tflops_per_device: float) -> None:
        if self.primary:
            say(format_flops_line(tflops_per_device, learnable_pct, attention_pct))
            self.record(records.Flops(tflops_per_step=tflops_per_step, learnable_pct=learnable_pct,
                                      attention_pct=attention_pct,
                                      tflops_per_device=tflops_per_device))

    def memory(self, used_gb: float, total_gb: float, device: str) -> None:
        if self.primary:
            pct = 100.0 * used_gb / total_gb if total_gb else 0.0
            say(MEMORY_LINE.format(used=used_gb, total=total_gb, pct=pct, device=device))
            self.record(records.Memory(used_gb=used_gb, total_gb=total_gb, pct=pct, device=device))

    def step(self, step: int, seconds: float, tflops_per_device: float, tokens_per_s_per_device: float,
             total_weights: int, loss: float, checkpoint_blocked_s: float,
             grad_norm: float | None = None, learning_rate: float | None = None,
             tokens_per_s: float | None = None, quick: bool = False,
             idle_s: float | None = None, at: float | None = None) -> None:
        """``tflops_per_device`` is the rate, TFLOP/s per device, as in the step line;
        ``tokens_per_s`` is over all devices; ``quick``: run by the quick executable;
        ``idle_s``: the device's idle time before the step; ``at``: when it finished."""
        if self.primary:
            say(format_step_line(step, seconds, tflops_per_device, tokens_per_s_per_device,
                                 total_weights, loss))
            rec = records.Step(
                step=step, seconds=seconds, tflops_per_device=tflops_per_device,
                tokens_per_s_per_device=tokens_per_s_per_device, total_weights=total_weights,
                loss=loss, checkpoint_blocked_s=checkpoint_blocked_s, grad_norm=grad_norm,
                learning_rate=learning_rate, tokens_per_s=tokens_per_s, quick=quick or None,
                idle_s=idle_s)
            self.record(rec, at=at)
            if self.events is not None:
                from workload.tensorboard import step_scalars

                self.events.scalars(step, step_scalars(records.to_dict(rec)))

    def checkpoint(self, event: str, step: int, seconds: float | None = None,
                   **fields: Any) -> None:
        """One checkpoint event (xrun_contract.CHECKPOINT_EVENTS); ``fields`` fill the event's
        line and go into the record (deferred: previous; *_failed: error, process)."""
        if self.primary:
            line = (CKPT_DEFERRED_STORAGE_LINE if event == "deferred" and fields.get("error")
                    else CHECKPOINT_LINES[event])
            say(line.format(step=step, seconds=seconds or 0.0, **fields))
            self.record(records.Checkpoint(step=step, event=event, seconds=seconds, **fields))

    def end(self, exit_code: int, reason: str, data_bytes_read: int | None = None,
            failure: str | None = None) -> None:
        if self.primary:
            self.record(records.End(exit_code=exit_code, reason=reason,
                                    data_bytes_read=data_bytes_read, failure=failure))

    def end_and_exit(self, exit_code: int, reason: str, failure: str | None = None) -> NoReturn:
        """From a watching thread, while the main thread is stuck where only a lost peer could
        free it: the end record, then the process's exit (no interpreter shutdown, which
        would wait for the stuck thread)."""
        try:
            self.end(exit_code, reason, failure=failure)
            self.close()
        finally:
            sys.stdout.flush()
            os._exit(exit_code)

    def close(self) -> None:
        if self.events is not None:
            try:
                self.events.close()
            except Exception as e:  # noqa: BLE001 - plots are not worth the exit code
                say(f"xrun: tensorboard events not written: {type(e).__name__}: {e}")
            self.events = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def update_run_json(storage: Storage, run: str, **workload: Any) -> bool:
    """Merge ``workload`` into run.json's "workload" section (creating the file if absent).

    Fenced by the restart attempt: when the section already holds a newer ``attempt`` than
    this write's, the write is refused (False, and a line says so). A process of an older
    attempt that outlived its pod must never overwrite what the current attempt recorded;
    the read-check-write is atomic (``Storage.update_json``)."""
    attempt = workload.get("attempt")

    def change(doc: dict | None) -> dict | None:
        doc = doc or {"name": run}
        section: dict[str, Any] = dict(doc["workload"]) if isinstance(doc.get("workload"), dict) else {}
        stored = section.get("attempt")
        if (isinstance(attempt, int) and isinstance(stored, int) and not isinstance(stored, bool)
                and stored > attempt):
            return None
        section.update(workload)
        return {**doc, "workload": section}

    written = storage.update_json(Layout.run_json(run), change)
    if not written:
        say(f"xrun: run.json not written: it holds a newer attempt than this process's ({attempt})")
    return written
