"""The log parser's line handlers: one per message start (``_HANDLERS``), each reading one
message into its host's record. xrun's own lines are read by the contract's regexes
(``xrun_contract.lines``); the foreign ones (MaxText, Orbax, XPK) by the regexes here, each
with the upstream function that prints it (verbatim examples: ``tests/data/maxtext/LINES.md``).
Which piece of a stream is a message, and when, is the scanner's (``logparse``).
"""

from __future__ import annotations

import calendar
import datetime as _dt
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from orchestrator.readers.record import RunRecord, _float
from xrun_contract import (
    CKPT_BLOCKED_RE,
    CKPT_COMMIT_RE,
    CKPT_DEFERRED_RE,
    CKPT_DEFERRED_STORAGE_RE,
    CKPT_EXIT_WAIT_RE,
    CKPT_RESTORE_FAILED_RE,
    CKPT_RESTORED_RE,
    CKPT_START_RE,
    CKPT_WAIT_PREVIOUS_RE,
    CKPT_WRITE_FAILED_RE,
    EXIT_CODE_RE,
    FAILURE_RE,
    HEADER_RE,
    MEMORY_RE,
    PARAMS_RE,
    PARAMS_UNITS,
    PHASE_RE,
    STEP_RE,
    WRAPPER_END_RE,
    WRAPPER_START_RE,
    header_fields,
)

# MaxText's print_system_information lines.
MAXTEXT_VERSION_RE = re.compile(
    r"System Information: (?P<what>Jax Version|Jaxlib Version|Jax Backend): (?P<value>.*?)\s*$"
)
MAXTEXT_VERSION_KEYS = {"Jax Version": "jax", "Jaxlib Version": "jaxlib", "Jax Backend": "backend"}

# -- Orbax (google/orbax, checkpoint/orbax/checkpoint/...) ---------------------------------
# checkpoint_manager.py, CheckpointManager.save(): a warning when the wait for the previous
# save took more than 1 s (_WAIT_FOR_PREV_SAVE_WARNING_THRESHOLD_SECS); the step is on the
# "Saving checkpoint at step" line that follows it.
ORBAX_WAIT_PREVIOUS_RE = re.compile(
    r"Waiting for previous save to complete took (?P<seconds>[\d.eE+-]+) seconds")
ORBAX_SAVING_RE = re.compile(r"Saving checkpoint at step (?P<step>\d+)")
# _src/checkpointers/async_checkpointer.py, AsyncCheckpointer._save() (older releases).
ORBAX_ASYNC_START_RE = re.compile(r"Started async saving checkpoint to (?P<path>\S+?)/(?P<step>\d+)\.?\s*$")
# Blocking part of a save, timed from the start of the save (so it includes the wait):
# _src/logging/event_tracking.py, OperationRecorder.record_blocking_completion() (0.12:
# "[async] Finished blocking save in 3.66 seconds. Continuing save @ DIR/5."); older
# async_checkpointer.py: "... in N seconds. Continuing to save asynchronously to DIR." /
# "Continuing to write to DIR." and "Finished blocking save. Time taken: Ns. ...".
ORBAX_BLOCKING_RE = re.compile(
    r"Finished blocking save(?: in (?P<seconds>[\d.]+) seconds| ?\. Time taken: (?P<taken>[\d.]+) ?s)")
# The save committed: OperationRecorder.record_completion() ("[async] Finished save
# (blocking + background) in 22.65 seconds @ DIR/5", sync: "Finished save in N seconds @
# DIR/5"); older: "Finished async_save (blocking + background). Time taken: 124.16s.
# directory=DIR/50".
ORBAX_SAVED_RE = re.compile(
    r"Finished (?:async_)?save(?: \(blocking \+ background\))?"
    r"(?: in (?P<seconds>[\d.]+) seconds @ |\. Time taken: (?P<taken>[\d.]+) ?s\. directory=)"
    r"(?P<path>\S*?)/(?P<step>\d+)\.?\s*$")
# _src/logging/standard_logger.py, StandardLogger.log_entry(): the dataclasses.asdict() of
# SaveStepStatistics / RestoreStepStatistics (_src/logging/step_statistics.py) as a Python
# dict repr (single quotes, None/False) on one line: "{'step': 5, 'event_type': 'save', ...}".
# Only the scalar entries below are read, each found by its key (ast.literal_eval of the whole
# dict cost ~0.2 ms a line: most of a 1 GB log's time).
_STATS_KEYS = ("step", "event_type", "wait_for_prev_duration_secs",
               "checkpointer_blocking_duration_secs", "checkpoint_manager_duration_secs")
_STATS_VALUE_RE = re.compile(
    r"(?:None|True|False|'[^'\\]*'|-?\d+(?P<real>\.\d*)?(?P<exp>[eE][+-]?\d+)?)(?=[,}])")
_STATS_CONSTANTS = {"None": None, "True": True, "False": False}
# CheckpointManager._load_checkpoint_infos(), at construction.
ORBAX_FOUND_RE = re.compile(r"Found (?P<count>\d+) checkpoint steps in (?P<path>\S+)")
# _src/checkpointers/checkpointer.py, Checkpointer.restore().
ORBAX_RESTORING_RE = re.compile(r"Restoring checkpoint from (?P<path>\S*?)/(?P<step>\d+)\.?\s*$")
STATS_MAX_CHARS = 4096  # a statistics dict is ~900 characters; never read more

# -- MaxText (AI-Hypercomputer/maxtext, src/maxtext/...) -----------------------------------
# common/checkpointing.py, save_checkpoint(): block_until_ready(state) before the save. The
# device is still computing step k: not a checkpoint stall, but step k+1 absorbs it too.
MAXTEXT_WAITED_RE = re.compile(
    r"Waited (?P<seconds>[\d.eE+-]+) seconds for step (?P<step>\d+) to finish before starting checkpointing")
# common/checkpointing.py, load_state_if_possible().
MAXTEXT_RESTORING_RE = re.compile(r"restoring from this run's directory step (?P<step>\d+)")
# utils/maxtext_utils.py, calculate_tflops_training_per_device(): a print() of three
# arguments, so three lines ("Per train step:", " Total TFLOPs: 0.02 ", " split as ...");
# xrun's FLOPS_LINE is the same text on one line. Either way the pieces come in this order.
MAXTEXT_FLOPS_TOTAL_RE = re.compile(r"Total TFLOPs: (?P<total>[\d.]+)")
MAXTEXT_FLOPS_SPLIT_RE = re.compile(
    r"split as (?P<learnable_pct>[\d.]+)% learnable weight flops and (?P<attention_pct>[\d.]+)% attention flops")

# -- XPK (AI-Hypercomputer/xpk, src/xpk/core/docker_container.py, get_main_container()) ----
# "echo XPK Start: $(date)" before the user command, "XPK End: $(date)" and "EXIT_CODE=N"
# after it; $(date) unquoted, so date's padding spaces collapse to one.
# The date is read by its form, so a line glued to it (a shipper that lost the newline) is
# not part of it: "Thu Dec 3 10:03:56 UTC 2026[DECOUPLED NO-OP] ..." is Dec 3 10:03:56.
_DATE = r"[A-Z][a-z]{2} +[A-Z][a-z]{2} +\d{1,2} +\d\d:\d\d:\d\d +[A-Za-z0-9:+-]{1,6} +\d{4}"
XPK_START_RE = re.compile(rf"^XPK Start: (?:(?P<date>{_DATE})|(?P<other>.*))")
XPK_END_RE = re.compile(rf"^XPK End: (?:(?P<date>{_DATE})|(?P<other>.*))")

NOTE_CHARS = 200  # longest note (a quoted line is cut)

# Where one message starts (every line form above), and the LogParser method that reads it.
# A line is cut at each start (and at absl prefixes), so messages glued into one physical
# line are parsed one by one; a line holding none is never looked at.
_HANDLERS = {
    "completed step: ": "_on_step", "number parameters: ": "_on_params",
    "Using (GB) ": "_on_memory", "Per train step:": "_on_flops_start",
    "Total TFLOPs: ": "_on_flops_total", "split as ": "_on_flops_split",
    "xrun header ": "_on_header", "xrun phase: ": "_on_phase", "xrun failure: ": "_on_failure",
    "checkpoint save started: ": "_xrun_checkpoint",
    "checkpoint save blocked training: ": "_xrun_checkpoint",
    "checkpoint save deferred: ": "_xrun_checkpoint", "checkpoint waiting ": "_xrun_checkpoint",
    "checkpoint committed: ": "_xrun_checkpoint", "checkpoint restored: ": "_xrun_checkpoint",
    "checkpoint restore failed: ": "_xrun_checkpoint",
    "checkpoint write failed: ": "_xrun_checkpoint", "xrun-wrapper: ": "_on_wrapper",
    "EXIT_CODE=": "_on_exit_code", "System Information: ": "_on_system",
    "Waiting for previous save to complete": "_on_wait_previous",
    "Saving checkpoint at step ": "_on_saving", "Started async saving checkpoint": "_on_async_start",
    "Finished blocking save": "_on_blocking", "Finished save": "_on_saved",
    "Finished async_save": "_on_saved", "{'step': ": "_stats", "Found ": "_on_found",
    "Restoring checkpoint from ": "_on_orbax_restoring",
    "restoring from this run's directory": "_on_maxtext_restoring", "Waited ": "_on_waited",
    "XPK Start: ": "_on_xpk", "XPK End: ": "_on_xpk",
}
MESSAGE_STARTS = tuple(_HANDLERS)


@dataclass
class _HostParse:
    """Parse state of one host's stream: its record and restart-attempt tracking."""

    record: RunRecord
    attempt: int = 0
    attempt_known: bool = False  # set from a wrapper line, a host prefix or the storage path
    last_step: int | None = None
    lines_split: int = 0
    # Orbax save in progress: the wait seen before its "Saving checkpoint at step" line,
    # then {"step", "wait", "blocking", "time"} until its statistics dict or the next save.
    pending_wait: float | None = None
    save: dict | None = None
    flops: dict | None = None  # the TFLOPs block read so far ("Per train step:" seen)
    restored_step: int | None = None
    batch: list[tuple] = field(default_factory=list)  # step lines not yet converted
    batch_last: int = 0  # the last step of batch


class LineHandlers:
    """The handlers of ``LogParser`` (its base): what each message means for the record.
    The scanner's state they read or move on is declared here."""

    _year: int
    _last_key: Any
    _last_hour: Any

    def _flush_steps(self) -> None:
        """Convert the step rows the scanner holds back (before anything that reads or
        changes a host's steps or attempt)."""
        raise NotImplementedError

    # -- one handler per message start (_HANDLERS) ---------------------------------------
    def _on_step(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = STEP_RE.match(seg)
        if m:
            self._step(st, int(m["step"]), _float(m["seconds"]), _float(m["tflops"]),
                       _float(m["tokens"]), _float(m["loss"]), int(m["total_weights"]), ts)

    def _on_header(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = HEADER_RE.match(seg)
        if m:
            self._header(st.record, m["key"], m["value"])

    def _on_params(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = PARAMS_RE.match(seg)
        if m:
            st.record.params = float(m["value"].replace(",", "")) * PARAMS_UNITS[m["unit"]]
            st.record.params_text = f"{m['value']} {m['unit']}" if m["unit"] else m["value"]

    def _on_memory(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = MEMORY_RE.match(seg)
        if m:
            st.record.set_memory(float(m["used"]), float(m["total"]), float(m["pct"]), m["device"])

    def _on_flops_start(self, st: _HostParse, seg: str, ts: float | None) -> None:
        st.flops = {}

    def _on_flops_total(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = MAXTEXT_FLOPS_TOTAL_RE.match(seg)
        if m and st.flops is not None:
            st.flops["tflops_per_step"] = float(m["total"])

    def _on_flops_split(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = MAXTEXT_FLOPS_SPLIT_RE.match(seg)
        if m and st.flops and "tflops_per_step" in st.flops:
            st.record.flops = {"tflops_per_step": st.flops["tflops_per_step"],
                               "learnable_pct": float(m["learnable_pct"]),
                               "attention_pct": float(m["attention_pct"])}
            st.flops = None

    def _on_wrapper(self, st: _HostParse, seg: str, ts: float | None) -> None:
        self._flush_steps()  # the attempt changes here
        rec = st.record
        m = WRAPPER_START_RE.match(seg)
        if m:
            st.attempt, st.attempt_known, st.last_step = int(m["attempt"]), True, None
            if rec.start_time is None and ts is not None:
                rec.start_time = ts
            return
        m = WRAPPER_END_RE.match(seg)
        if m:
            rec.exit_code = int(m["code"])
            rec.wrapper_seconds = (rec.wrapper_seconds or 0.0) + float(m["seconds"])

    def _on_exit_code(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = EXIT_CODE_RE.match(seg.strip())
        if m:
            st.record.exit_code = int(m["code"])

    def _on_system(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = MAXTEXT_VERSION_RE.match(seg)
        if m:
            st.record.set_versions({MAXTEXT_VERSION_KEYS[m["what"]]: m["value"]})

    def _on_phase(self, st: _HostParse, seg: str, ts: float | None) -> None:
        rec = st.record
        m = PHASE_RE.match(seg)
        if m:
            seconds = float(m["seconds"])
            rec.phases.append({"activity": m["activity"], "seconds": seconds,
                               "step": int(m["step"]) if m["step"] else None, "time": ts})
            if ts is not None and rec.start_time is None:
                rec.start_time = ts - seconds  # the process start the phase counts from

    def _on_failure(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = FAILURE_RE.match(seg)
        if m:
            st.record.failure = {"kind": m["kind"], "why": m["why"], "code": int(m["code"])}

    def _on_xpk(self, st: _HostParse, seg: str, ts: float | None) -> None:
        self._xpk(st.record, seg, ts)

    @staticmethod
    def _note_time(rec: RunRecord, ts: float | None) -> float | None:
        """Keep the log's first and last time; a time far before the last is next year's."""
        if ts is not None:
            if rec.log_first_time is None:
                rec.log_first_time = ts
            elif rec.log_last_time is not None and ts < rec.log_last_time - 180 * 86400:
                ts += 365 * 86400  # the log crossed a new year
            rec.log_last_time = ts
        return ts

    def _step(self, st: _HostParse, step: int, seconds: float, tflops: float, tokens: float,
              loss: float, total_weights: int, ts: float | None) -> None:
        self._flush_steps()  # the steps before this one first
        rec = st.record
        if st.last_step is not None and step <= st.last_step and not st.attempt_known:
            st.attempt += 1  # steps went back without a wrapper line: a restart
            rec.notes.append(f"steps restart at {step} after {st.last_step}: counted as attempt {st.attempt}")
        st.last_step = step
        if ts is not None and rec.log_first_step_time is None:
            rec.log_first_step_time = ts
        rec.steps.append(step, seconds, tflops, tokens, loss,
                         time=ts if ts is not None else math.nan, attempt=st.attempt,
                         total_weights=total_weights)

    def _header(self, rec: RunRecord, key: str, value: str) -> None:
        """``xrun header versions: k=v ...`` (one line of HEADER_KEYS) and ``xrun header
        config: k=v ...`` (the folded config); older logs: one key per line, config as JSON."""
        if key == "config":
            if value.startswith("{"):
                rec.set_versions({"config": value})
            elif rec.config is None:
                rec.config = {k: _scalar(v) for k, v in header_fields("versions", value).items()}
            return
        rec.set_versions(header_fields(key, value))

    def _xrun_checkpoint(self, st: _HostParse, seg: str, ts: float | None) -> None:
        """xrun's own checkpoint lines (the contract's CKPT_*_RE)."""
        rec = st.record
        for event, regex in (("started", CKPT_START_RE), ("blocked", CKPT_BLOCKED_RE),
                             ("waited", CKPT_WAIT_PREVIOUS_RE), ("committed", CKPT_COMMIT_RE),
                             ("restored", CKPT_RESTORED_RE), ("deferred", CKPT_DEFERRED_RE),
                             ("deferred", CKPT_DEFERRED_STORAGE_RE),
                             ("exit_wait", CKPT_EXIT_WAIT_RE),
                             ("restore_failed", CKPT_RESTORE_FAILED_RE),
                             ("write_failed", CKPT_WRITE_FAILED_RE)):
            m = regex.search(seg)
            if not m:
                continue
            groups = m.groupdict()
            seconds = _float(groups["seconds"]) if "seconds" in groups else None
            if event == "restored":
                self._restored(st, int(m["step"]))
            extra: dict[str, Any] = {
                     "previous": int(groups["previous"]) if "previous" in groups else None,
                     "error": groups.get("error"),
                     "process": int(groups["process"]) if "process" in groups else None}
            rec.add_checkpoint(event, int(m["step"]), seconds, st.attempt, ts, **extra)
            return

    def _restored(self, st: _HostParse, step: int) -> None:
        self._flush_steps()  # the steps before the restore first: they decide the attempt
        rec = st.record
        if st.last_step is not None and not st.attempt_known:
            st.attempt += 1  # a restore after steps: the job restarted
            rec.notes.append(f"checkpoint restored after step {st.last_step}: counted as attempt {st.attempt}")
        st.last_step = step  # the next step follows the restored one
        st.restored_step = step

    def _xpk(self, rec: RunRecord, seg: str, ts: float | None) -> None:
        self._flush_steps()  # their times are read in the year known so far
        """XPK's wrapper lines: the container's start and end (wall clock, its time zone)."""
        for regex, attr in ((XPK_START_RE, "start_time"), (XPK_END_RE, "end_time")):
            m = regex.match(seg)
            if not m:
                continue
            when = _parse_date(m["date"]) if m["date"] else None
            if when is None:
                text = (m["date"] or m["other"] or "").strip()
                shown = text if len(text) <= 60 else text[:57] + "..."
                rec.notes.append(f"XPK date {shown!r} not understood")
                return
            setattr(rec, attr, when[0])
            if attr == "start_time":
                rec.start_basis = "XPK Start"
                if when[1] is not None and when[1] != self._year:
                    self._year = when[1]  # absl prefixes carry no year: take XPK's
                    self._last_key = self._last_hour = None
            return

    # Orbax's checkpoint lines and MaxText's checkpointing lines (see module doc).
    def _on_wait_previous(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = ORBAX_WAIT_PREVIOUS_RE.match(seg)
        if m:
            st.pending_wait = _float(m["seconds"])

    def _on_saving(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = ORBAX_SAVING_RE.match(seg)
        if m:
            self._save_start(st, int(m["step"]), ts)

    def _on_async_start(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = ORBAX_ASYNC_START_RE.match(seg)
        if m and not (st.save and st.save["step"] == int(m["step"])):
            self._save_start(st, int(m["step"]), ts)

    def _on_blocking(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = ORBAX_BLOCKING_RE.match(seg)
        if m and st.save is not None:
            st.save["blocking"] = _float(m["seconds"] or m["taken"])

    def _on_saved(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = ORBAX_SAVED_RE.match(seg)
        if m:
            step = int(m["step"])
            if st.save is not None and st.save["step"] == step:
                self._save_flush(st)
            st.record.add_checkpoint("committed", step, _float(m["seconds"] or m["taken"]),
                                     st.attempt, ts)

    def _on_found(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = ORBAX_FOUND_RE.match(seg)
        if m:
            st.record.checkpoints_found = int(m["count"])

    def _on_maxtext_restoring(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = MAXTEXT_RESTORING_RE.match(seg)
        if m:
            self._restored(st, int(m["step"]))
            st.record.add_checkpoint("restored", int(m["step"]), None, st.attempt, ts)

    def _on_orbax_restoring(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = ORBAX_RESTORING_RE.match(seg)
        if m and st.restored_step != int(m["step"]):
            self._restored(st, int(m["step"]))
            st.record.add_checkpoint("restored", int(m["step"]), None, st.attempt, ts)

    def _on_waited(self, st: _HostParse, seg: str, ts: float | None) -> None:
        m = MAXTEXT_WAITED_RE.match(seg)
        if m:
            st.record.add_checkpoint("device_wait", int(m["step"]), _float(m["seconds"]),
                                     st.attempt, ts)

    def _save_start(self, st: _HostParse, step: int, ts: float | None) -> None:
        """A save at ``step`` begins: the wait logged just before it was this save's."""
        self._save_flush(st)
        st.save = {"step": step, "wait": st.pending_wait, "blocking": None, "time": ts}
        st.pending_wait = None
        st.record.add_checkpoint("started", step, None, st.attempt, ts)

    def _save_flush(self, st: _HostParse, stats: dict | None = None) -> None:
        """Record the save's stalls once, from its statistics dict when there is one (exact,
        every save), else from its lines (the wait is logged only above 1 s)."""
        save, st.save = st.save, None
        if save is None:
            return
        step = save["step"]
        if stats is not None:
            wait = _num(stats.get("wait_for_prev_duration_secs"))
            blocked = _num(stats.get("checkpointer_blocking_duration_secs"))
        else:
            wait = save["wait"]
            blocked = None
            if save["blocking"] is not None:
                blocked = max(0.0, save["blocking"] - (wait or 0.0))
        # MaxText: the save after step k's timestamp lands in step k+1's seconds.
        for event, seconds in (("waited", wait), ("blocked", blocked)):
            if seconds is not None:
                st.record.add_checkpoint(event, step, seconds, st.attempt, save["time"],
                                         absorbed_by=step + 1)

    def _stats(self, st: _HostParse, seg: str, ts: float | None) -> None:
        """Orbax's step statistics dict (save or restore)."""
        text = seg.rstrip()
        if not text.endswith("}") or len(text) > STATS_MAX_CHARS:
            return  # not the whole dict on this line
        stats = _stats_fields(text)
        if not isinstance(stats.get("step"), int):
            return
        step, kind = stats["step"], stats.get("event_type")
        if kind == "save":
            if st.save is None or st.save["step"] != step:
                self._save_flush(st)
                st.save = {"step": step, "wait": None, "blocking": None, "time": ts}
            self._save_flush(st, stats)
        elif kind == "restore":
            seconds = _num(stats.get("checkpoint_manager_duration_secs"))
            for ev in reversed(st.record.checkpoints):
                if ev["event"] == "restored" and ev["step"] == step and ev["attempt"] == st.attempt:
                    ev["seconds"] = seconds
                    return
            self._restored(st, step)
            st.record.add_checkpoint("restored", step, seconds, st.attempt, ts)


def _stats_fields(text: str) -> dict[str, Any]:
    """The entries of an Orbax statistics dict repr that the parser reads (first of each)."""
    out: dict[str, Any] = {}
    for key in _STATS_KEYS:
        at = text.find(f"'{key}': ")
        if at < 0:
            continue
        at += len(key) + 4
        m = _STATS_VALUE_RE.match(text, at)
        if m is None:
            continue
        value = m[0]
        if value[0] == "'":
            out[key] = value[1:-1]
        elif value in _STATS_CONSTANTS:
            out[key] = _STATS_CONSTANTS[value]
        else:
            out[key] = float(value) if m["real"] is not None or m["exp"] else int(value)
    return out


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _scalar(text: str) -> object:
    """A folded-config value as its JSON type when it is one ("10" -> 10), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _parse_date(text: str) -> tuple[float, int | None] | None:
    """``date``'s default output ("Thu Dec 3 10:03:56 UTC 2026") -> (unix seconds, year).

    UTC/GMT (what a container has unless TZ is set) parses exactly; another zone name is
    read as UTC with the year kept (the offset is unknown without a tz database entry).
    """
    words = text.split()
    if len(words) == 6:
        zone = words[4]
        try:
            t = _dt.datetime.strptime(" ".join(words[:4] + words[5:]), "%a %b %d %H:%M:%S %Y")
        except ValueError:
            return None
        offset = 0.0
        if zone not in ("UTC", "GMT", "Z"):
            m = re.fullmatch(r"([+-])(\d\d):?(\d\d)", zone)
            if m:
                offset = (1 if m[1] == "+" else -1) * (int(m[2]) * 3600 + int(m[3]) * 60)
        return calendar.timegm(t.timetuple()) - offset, t.year
    return None
