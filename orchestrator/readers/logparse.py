"""Streaming parser of training logs (MaxText / XPK form and xrun's own lines).

Logs are parsed as a stream of bounded pieces (a 1 GB log, or one 1 GB "line", never sits in
memory): lines are split at every known message start and at absl prefixes
(``I1203 05:12:33.123456 140234 train.py:812]``), so several messages glued into one line
parse like separate lines. xrun's own line formats and regexes come from the contract.
"""

from __future__ import annotations

import calendar
import datetime as _dt
import math
import re
from dataclasses import dataclass

from orchestrator.readers.record import RunRecord, _float
from xrun_contract import (
    CKPT_BLOCKED_RE,
    CKPT_COMMIT_RE,
    CKPT_RESTORED_RE,
    CKPT_START_RE,
    CKPT_WAIT_PREVIOUS_RE,
    EXIT_CODE_RE,
    FLOPS_RE,
    HEADER_RE,
    HOST_PREFIX_RE,
    MEMORY_RE,
    PARAMS_RE,
    STEP_RE,
    WRAPPER_END_RE,
    WRAPPER_START_RE,
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

# Where one message starts: every line form above. A line is cut at each of these (and at
# absl prefixes), so messages glued into one physical line are parsed one by one.
MESSAGE_STARTS = (
    "completed step: ", "number parameters: ", "Using (GB) ", "Per train step: ",
    "xrun header ", "checkpoint save ", "checkpoint waiting ", "checkpoint committed: ",
    "checkpoint restored: ", "xrun-wrapper: ", "EXIT_CODE=", "System Information: ",
)
SEGMENT_RE = re.compile(
    "(?P<absl>" + ABSL_RE.pattern + ")|(?=" + "|".join(re.escape(s) for s in MESSAGE_STARTS) + ")"
)
# Cheap substring pre-filter: most lines of a real log contain none of these.
_QUICK = ("completed step: ", "number parameters: ", "Using (GB) ", "Per train step: ", "xrun",
          "checkpoint ", "EXIT_CODE=", "System Information: ")

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
                rec.set_versions({m["key"]: m["value"]})
            return
        if head.startswith("checkpoint"):
            for event, regex in (("started", CKPT_START_RE), ("blocked", CKPT_BLOCKED_RE),
                                 ("waited", CKPT_WAIT_PREVIOUS_RE), ("committed", CKPT_COMMIT_RE),
                                 ("restored", CKPT_RESTORED_RE)):
                m = regex.search(seg)
                if m:
                    seconds = _float(m["seconds"]) if "seconds" in regex.groupindex else None
                    if event == "restored":
                        if st.last_step is not None and not st.attempt_known:
                            st.attempt += 1  # a restore after steps: the job restarted
                            rec.notes.append(f"checkpoint restored after step {st.last_step}: "
                                             f"counted as attempt {st.attempt}")
                        st.last_step = int(m["step"])  # the next step follows the restored one
                    rec.add_checkpoint(event, int(m["step"]), seconds, st.attempt, ts)
                    return
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
            m = FLOPS_RE.search(seg)
            if m:
                rec.flops = {"tflops_per_step": float(m["total"]),
                             "learnable_pct": float(m["learnable_pct"]),
                             "attention_pct": float(m["attention_pct"])}
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

    # -- output -------------------------------------------------------------------------
    def finish(self) -> RunRecord:
        """The record of the host that logged steps (ties: the unprefixed stream, then 0-0)."""
        self.flush_line()
        for st in self._hosts.values():
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
                                                                "stalled_steps"):
            setattr(dst, name, value)

