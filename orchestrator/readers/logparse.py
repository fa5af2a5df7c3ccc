"""Streaming parser of training logs (MaxText / Orbax / XPK lines and xrun's own lines).

Logs are parsed as a stream of bounded pieces (a 1 GB log, or one 1 GB "line", never sits in
memory): lines are split at every known message start and at absl prefixes
(``I1203 05:12:33.123456 140234 train.py:812]``), so several messages glued into one line
parse like separate lines. xrun's own line formats and regexes come from the contract; the
foreign ones (MaxText, Orbax, XPK) are here, each with the upstream function that prints it
(verbatim examples: ``tests/data/maxtext/LINES.md``).

MaxText's step timing, which decides where a checkpoint stall shows up
(``maxtext/trainers/pre_train/train.py``, ``training_loop_iteration()``): step k's
``seconds`` is host time from step k-1's dispatch to step k's, so the save at step k
(MaxText's ``block_until_ready`` and Orbax's blocking save, including "Waiting for previous
save") lands in the ``seconds`` of step k+1. Step lines are buffered one step
(``MetricLogger.buffer_and_write_metrics()``), so the save lines of step k come *before*
the line of step k-1 in the file: stalls are attributed by step number, never by position.
"""

from __future__ import annotations

import ast
import calendar
import datetime as _dt
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from orchestrator.readers.record import RunRecord, _float
from xrun_contract import (
    CKPT_BLOCKED_RE,
    CKPT_COMMIT_RE,
    CKPT_DEFERRED_RE,
    CKPT_EXIT_WAIT_RE,
    CKPT_RESTORE_FAILED_RE,
    CKPT_RESTORED_RE,
    CKPT_START_RE,
    CKPT_WAIT_PREVIOUS_RE,
    CKPT_WRITE_FAILED_RE,
    EXIT_CODE_RE,
    FAILURE_RE,
    HEADER_RE,
    HOST_PREFIX_RE,
    MEMORY_RE,
    PARAMS_RE,
    PHASE_RE,
    STEP_RE,
    WRAPPER_END_RE,
    WRAPPER_START_RE,
    header_fields,
)

# ---------------------------------------------------------------------------------------
# Log parsing

# absl / glog prefix: "I1203 05:12:33.123456 140234 train.py:812] " (level, MMDD, time, tid, file:line)
ABSL_RE = re.compile(
    r"(?P<level>[IWEF])(?P<month>\d\d)(?P<day>\d\d) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)(?:\.(?P<us>\d{1,6}))?"
    r"\s+\d+\s+[^\s:\]]+:\d+\]\s?"
)
# `xrun logs` output prefixes every line with its host: "[0-1] ..." or "[0-1 #2] ...".
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
# dict repr (single quotes, None/False), read with ast.literal_eval.
ORBAX_STATS_RE = re.compile(r"(?P<dict>\{'step': .*\})\s*$")
# CheckpointManager._load_checkpoint_infos(), at construction.
ORBAX_FOUND_RE = re.compile(r"Found (?P<count>\d+) checkpoint steps in (?P<path>\S+)")
# _src/checkpointers/checkpointer.py, Checkpointer.restore().
ORBAX_RESTORING_RE = re.compile(r"Restoring checkpoint from (?P<path>\S*?)/(?P<step>\d+)\.?\s*$")
STATS_MAX_CHARS = 4096  # a statistics dict is ~900 characters; never literal_eval more

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
XPK_START_RE = re.compile(r"^XPK Start: (?P<date>.+?)\s*$")
XPK_END_RE = re.compile(r"^XPK End: (?P<date>.+?)\s*$")

# Where one message starts: every line form above. A line is cut at each of these (and at
# absl prefixes), so messages glued into one physical line are parsed one by one.
MESSAGE_STARTS = (
    "completed step: ", "number parameters: ", "Using (GB) ", "Per train step:",
    "Total TFLOPs: ", "split as ",
    "xrun header ", "xrun phase: ", "xrun failure: ", "checkpoint save ", "checkpoint waiting ",
    "checkpoint committed: ", "checkpoint restored: ", "checkpoint restore failed: ",
    "checkpoint write failed: ", "xrun-wrapper: ", "EXIT_CODE=", "System Information: ",
    "Waiting for previous save to complete", "Saving checkpoint at step ",
    "Started async saving checkpoint", "Finished blocking save", "Finished save",
    "Finished async_save", "{'step': ", "Found ", "Restoring checkpoint from ",
    "restoring from this run's directory", "Waited ", "XPK Start: ", "XPK End: ",
)
SEGMENT_RE = re.compile(
    "(?P<absl>" + ABSL_RE.pattern + ")|(?=" + "|".join(re.escape(s) for s in MESSAGE_STARTS) + ")"
)
# Cheap substring pre-filter: most lines of a real log contain none of these.
_QUICK = ("completed step: ", "number parameters: ", "Using (GB) ", "Per train step:", "xrun",
          "checkpoint", "EXIT_CODE=", "System Information: ", "TFLOPs: ", "split as ",
          "previous save", "Finished ", "{'step': ", "Waited ", "XPK ", "restoring from")

READ_CHARS = 1 << 20  # file read size (characters)
MAX_PENDING = 1 << 16  # longest unterminated line kept before it is cut at a message start
MARGIN = 4096  # longer than any message the regexes match


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


class LogParser:
    """Streaming parser: ``feed`` arbitrary text pieces, then ``finish``.

    Lines prefixed by host (``xrun logs`` output) are kept per host; ``finish`` returns the
    record of the host that logged the training steps (process 0 in xrun and MaxText).
    """

    def __init__(self, record: RunRecord | None = None, attempt: int | None = None,
                 year: int | None = None):
        self._hosts: dict[str, _HostParse] = {}
        self._base = record or RunRecord()
        root = _HostParse(self._base)
        if attempt is not None:
            root.attempt, root.attempt_known = attempt, True
        self._hosts[""] = root
        self._pending = ""
        self._continuing = False  # the pending text continues a line already partly parsed
        self._cur_host = ""
        self._year = year or _dt.datetime.now(_dt.UTC).year

    def set_attempt(self, attempt: int) -> None:
        """The attempt of what comes next (stored logs name it in their path)."""
        self.flush_line()
        root = self._hosts[""]
        root.attempt, root.attempt_known, root.last_step = attempt, True, None

    # -- input ------------------------------------------------------------------------
    def feed(self, text: str) -> None:
        if self._pending:
            text = self._pending + text
        parts = text.split("\n")
        self._pending = parts.pop()
        for line in parts:
            self._physical_line(line, continuation=self._continuing)
            self._continuing = False
        if len(self._pending) > MAX_PENDING:
            self._cut_pending()

    def flush_line(self) -> None:
        """End the current unterminated line (end of a file or chunk sequence)."""
        if self._pending:
            line, self._pending = self._pending, ""
            self._physical_line(line, continuation=self._continuing)
        self._continuing = False

    def _cut_pending(self) -> None:
        """A very long line: parse up to its last message start, keep the rest pending.

        Cutting at a message start splits nothing a regex could match; with no start in
        sight the cut keeps a margin longer than any message.
        """
        starts = [m.start() for m in SEGMENT_RE.finditer(self._pending) if m.start() > 0]
        cut = starts[-1] if starts else 0
        if cut <= 0 or len(self._pending) - cut > MAX_PENDING:
            cut = len(self._pending) - MARGIN
        head, self._pending = self._pending[:cut], self._pending[cut:]
        self._physical_line(head, continuation=self._continuing)
        self._continuing = True  # what remains belongs to the same physical line

    def _physical_line(self, line: str, continuation: bool) -> None:
        if continuation:
            state = self._hosts[self._cur_host]
        else:
            host, attempt = "", None
            if line.startswith("["):
                m = HOST_PREFIX_RE.match(line)
                if m:
                    host, attempt = m["host"], int(m["attempt"] or 0)
                    line = line[m.end():]
            self._cur_host = host
            found = self._hosts.get(host)
            if found is None:
                found = self._hosts[host] = _HostParse(RunRecord(hosts_seen=[host]))
            state = found
            if attempt is not None and (attempt != state.attempt or not state.attempt_known):
                state.attempt, state.attempt_known = attempt, True
                if attempt:
                    state.last_step = None
        if "\r" in line:  # progress bars redraw with carriage returns
            for piece in line.split("\r"):
                self._scan(state, piece)
        else:
            self._scan(state, line)

    def _scan(self, st: _HostParse, line: str) -> None:
        """Cut a line at every message start and absl prefix; parse each piece."""
        if not any(q in line for q in _QUICK):
            return  # no message here (absl prefixes alone do not matter)
        cuts: list[tuple[int, int, re.Match | None]] = []  # (start, end of prefix, absl match)
        for s in MESSAGE_STARTS:
            i = line.find(s)
            while i >= 0:
                cuts.append((i, i, None))
                i = line.find(s, i + len(s))
        if "] " in line or "]\t" in line:
            cuts += [(m.start(), m.end(), m) for m in ABSL_RE.finditer(line)]
        cuts.sort(key=lambda c: (c[0], c[2] is None))
        pos = 0
        seg_time = None
        for start, end, m in cuts:
            if start < pos:
                continue  # inside an absl prefix already consumed
            if start > pos:
                self._segment(st, line[pos:start], seg_time)
            if m is not None:
                seg_time = self._absl_time(m)
            pos = end
        if pos < len(line):
            self._segment(st, line[pos:], seg_time)
        if sum(1 for c in cuts if c[2] is None) > 1:
            st.lines_split += 1  # several messages glued into one line

    def _absl_time(self, m: re.Match) -> float | None:
        try:
            t = _dt.datetime(self._year, int(m["month"]), int(m["day"]), int(m["h"]), int(m["m"]),
                             int(m["s"]), int((m["us"] or "0").ljust(6, "0")))
        except ValueError:
            return None
        return calendar.timegm(t.timetuple()) + t.microsecond / 1e6

    # -- one message --------------------------------------------------------------------
    def _segment(self, st: _HostParse, seg: str, ts: float | None) -> None:
        rec = st.record
        if ts is not None:
            if rec.log_first_time is None:
                rec.log_first_time = ts
            elif rec.log_last_time is not None and ts < rec.log_last_time - 180 * 86400:
                ts += 365 * 86400  # the log crossed a new year
            rec.log_last_time = ts
        head = seg[:12]
        if head.startswith("completed st"):
            m = STEP_RE.search(seg)
            if m:
                step = int(m["step"])
                if st.last_step is not None and step <= st.last_step and not st.attempt_known:
                    st.attempt += 1  # steps went back without a wrapper line: a restart
                    rec.notes.append(f"steps restart at {step} after {st.last_step}: counted as attempt {st.attempt}")
                st.last_step = step
                if ts is not None and rec.log_first_step_time is None:
                    rec.log_first_step_time = ts
                rec.steps.append(step, _float(m["seconds"]), _float(m["tflops"]),
                                 _float(m["tokens"]), _float(m["loss"]),
                                 time=ts if ts is not None else math.nan, attempt=st.attempt,
                                 total_weights=int(m["total_weights"]))
            return
        if head.startswith("xrun header"):
            m = HEADER_RE.search(seg)
            if m:
                self._header(rec, m["key"], m["value"])
            return
        if head.startswith("checkpoint"):
            self._xrun_checkpoint(st, seg, ts)
            return
        if head.startswith("number param"):
            m = PARAMS_RE.search(seg)
            if m:
                rec.params = float(m["billions"]) * 1e9
                rec.params_text = f"{m['billions']} billion"
            return
        if head.startswith("Using (GB)"):
            m = MEMORY_RE.search(seg)
            if m:
                rec.set_memory(float(m["used"]), float(m["total"]), float(m["pct"]), m["device"])
            return
        if head.startswith("Per train st"):
            st.flops = {}
            return
        if head.startswith("Total TFLOPs"):
            m = MAXTEXT_FLOPS_TOTAL_RE.match(seg)
            if m and st.flops is not None:
                st.flops["tflops_per_step"] = float(m["total"])
            return
        if head.startswith("split as "):
            m = MAXTEXT_FLOPS_SPLIT_RE.match(seg)
            if m and st.flops and "tflops_per_step" in st.flops:
                rec.flops = {"tflops_per_step": st.flops["tflops_per_step"],
                             "learnable_pct": float(m["learnable_pct"]),
                             "attention_pct": float(m["attention_pct"])}
                st.flops = None
            return
        if head.startswith("xrun-wrappe"):
            m = WRAPPER_START_RE.search(seg)
            if m:
                st.attempt, st.attempt_known, st.last_step = int(m["attempt"]), True, None
                if rec.start_time is None and ts is not None:
                    rec.start_time = ts
                return
            m = WRAPPER_END_RE.search(seg)
            if m:
                rec.exit_code = int(m["code"])
                rec.wrapper_seconds = (rec.wrapper_seconds or 0.0) + float(m["seconds"])
            return
        if head.startswith("EXIT_CODE="):
            m = EXIT_CODE_RE.match(seg.strip())
            if m:
                rec.exit_code = int(m["code"])
            return
        if head.startswith("System Infor"):
            m = MAXTEXT_VERSION_RE.search(seg)
            if m:
                rec.set_versions({MAXTEXT_VERSION_KEYS[m["what"]]: m["value"]})
            return
        if head.startswith("xrun phase: "):
            m = PHASE_RE.search(seg)
            if m:
                seconds = float(m["seconds"])
                rec.phases.append({"activity": m["activity"], "seconds": seconds,
                                   "step": int(m["step"]) if m["step"] else None, "time": ts})
                if ts is not None and rec.start_time is None:
                    rec.start_time = ts - seconds  # the process start the phase counts from
            return
        if head.startswith("xrun failure"):
            m = FAILURE_RE.search(seg)
            if m:
                rec.failure = {"kind": m["kind"], "why": m["why"], "code": int(m["code"])}
            return
        if head.startswith("XPK "):
            self._xpk(rec, seg, ts)
            return
        self._orbax_maxtext(st, seg, ts)

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
        rec = st.record
        if st.last_step is not None and not st.attempt_known:
            st.attempt += 1  # a restore after steps: the job restarted
            rec.notes.append(f"checkpoint restored after step {st.last_step}: counted as attempt {st.attempt}")
        st.last_step = step  # the next step follows the restored one
        st.restored_step = step

    def _xpk(self, rec: RunRecord, seg: str, ts: float | None) -> None:
        """XPK's wrapper lines: the container's start and end (wall clock, its time zone)."""
        for regex, attr in ((XPK_START_RE, "start_time"), (XPK_END_RE, "end_time")):
            m = regex.match(seg)
            if not m:
                continue
            when = _parse_date(m["date"])
            if when is None:
                rec.notes.append(f"XPK date {m['date']!r} not understood")
                return
            setattr(rec, attr, when[0])
            if attr == "start_time":
                rec.start_basis = "XPK Start"
                if when[1] is not None:
                    self._year = when[1]  # absl prefixes carry no year: take XPK's
            return

    def _orbax_maxtext(self, st: _HostParse, seg: str, ts: float | None) -> None:
        """Orbax's checkpoint lines and MaxText's checkpointing lines (see module doc)."""
        rec = st.record
        if seg.startswith("Waiting for previous"):
            m = ORBAX_WAIT_PREVIOUS_RE.match(seg)
            if m:
                st.pending_wait = _float(m["seconds"])
        elif seg.startswith("Saving checkpoint at"):
            m = ORBAX_SAVING_RE.match(seg)
            if m:
                self._save_start(st, int(m["step"]), ts)
        elif seg.startswith("Started async saving"):
            m = ORBAX_ASYNC_START_RE.match(seg)
            if m and not (st.save and st.save["step"] == int(m["step"])):
                self._save_start(st, int(m["step"]), ts)
        elif seg.startswith("Finished blocking save"):
            m = ORBAX_BLOCKING_RE.match(seg)
            if m and st.save is not None:
                st.save["blocking"] = _float(m["seconds"] or m["taken"])
        elif seg.startswith("Finished save") or seg.startswith("Finished async_save"):
            m = ORBAX_SAVED_RE.match(seg)
            if m:
                step = int(m["step"])
                if st.save is not None and st.save["step"] == step:
                    self._save_flush(st)
                rec.add_checkpoint("committed", step, _float(m["seconds"] or m["taken"]),
                                   st.attempt, ts)
        elif seg.startswith("{'step': "):
            self._stats(st, seg, ts)
        elif seg.startswith("Found "):
            m = ORBAX_FOUND_RE.match(seg)
            if m:
                rec.checkpoints_found = int(m["count"])
        elif seg.startswith("restoring from this run"):
            m = MAXTEXT_RESTORING_RE.match(seg)
            if m:
                self._restored(st, int(m["step"]))
                rec.add_checkpoint("restored", int(m["step"]), None, st.attempt, ts)
        elif seg.startswith("Restoring checkpoint from"):
            m = ORBAX_RESTORING_RE.match(seg)
            if m and st.restored_step != int(m["step"]):
                self._restored(st, int(m["step"]))
                rec.add_checkpoint("restored", int(m["step"]), None, st.attempt, ts)
        elif seg.startswith("Waited "):
            m = MAXTEXT_WAITED_RE.match(seg)
            if m:
                rec.add_checkpoint("device_wait", int(m["step"]), _float(m["seconds"]), st.attempt, ts)

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
        m = ORBAX_STATS_RE.match(seg)
        if not m or len(m["dict"]) > STATS_MAX_CHARS:
            return
        try:
            stats = ast.literal_eval(m["dict"])
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return
        if not isinstance(stats, dict) or not isinstance(stats.get("step"), int):
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

    # -- output -------------------------------------------------------------------------
    def finish(self) -> RunRecord:
        """The record of the host that logged steps (ties: the unprefixed stream, then 0-0)."""
        self.flush_line()
        for st in self._hosts.values():
            self._save_flush(st)
            if st.lines_split:
                st.record.notes.append(f"{st.lines_split} lines held several glued messages; split")
        hosts = [h for h in self._hosts if h]
        candidates = sorted(self._hosts.items(),
                            key=lambda kv: (-kv[1].record.steps.count, kv[0] != "", kv[0]))
        host, st = candidates[0]
        rec = st.record
        if host:
            if rec is not self._base:
                _merge_into(self._base, rec)
                rec = self._base
            rec.hosts_seen = hosts
            if len(hosts) > 1:
                rec.notes.append(f"log holds {len(hosts)} hosts ({', '.join(hosts[:8])}); read host {host}")
            if rec.process_id is None and host == "0-0":
                # "[s-h]": without the hosts-per-slice only host 0-0's process id is certain.
                rec.process_id = 0
        return rec


def _merge_into(dst: RunRecord, src: RunRecord) -> None:
    """Fill an empty base record from a per-host record (fields the base lacks)."""
    for name in src.__dataclass_fields__:
        value = getattr(src, name)
        current = getattr(dst, name)
        if name == "steps":
            if dst.steps.count == 0:
                dst.steps = value
        elif name in ("versions",):
            dst.versions = {**value, **current}
        elif name in ("notes",):
            dst.notes.extend(value)
        elif current in (None, "", [], {}, set()) or name in ("checkpoints", "checkpoint_totals",
                                                                "stalled_steps", "absorbed_stalls"):
            setattr(dst, name, value)



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
