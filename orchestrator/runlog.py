"""Read a training run back into one record: from a storage root, a log file, or JSONL.

The nightly comparison must be right, so everything it shows comes from here: per-step
samples (seconds, TFLOP/s, tokens/s, loss), parameters, memory, versions, process identity,
checkpoint events, exit code and times. Sources, most to least precise:

* xrun's metrics JSONL (``runs/<name>/metrics/*.jsonl``, written by process 0),
* ``run.json`` / ``state.json`` (spec, versions, submit time, transitions),
* training logs in MaxText/XPK form: stored log chunks or any log file (``.gz`` too).

Logs are parsed as a stream of bounded pieces (a 1 GB log, or one 1 GB "line", never sits in
memory): lines are split at every known message start and at absl prefixes
(``I1203 05:12:33.123456 140234 train.py:812]``), so several messages glued into one line
parse like separate lines. Per-step samples live in compact columns that halve their
resolution past a cap, so memory stays bounded however long the run was.
"""

from __future__ import annotations

import calendar
import contextlib
import datetime as _dt
import gzip
import json
import math
import re
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xrun_contract import (
    ATTEMPT_RE,
    CKPT_BLOCKED_RE,
    CKPT_COMMIT_RE,
    CKPT_RESTORED_RE,
    CKPT_START_RE,
    CKPT_WAIT_PREVIOUS_RE,
    EXIT_CODE_RE,
    FLOPS_RE,
    HEADER_RE,
    MEMORY_RE,
    PARAMS_RE,
    STEP_RE,
    SUCCEEDED,
    TERMINAL_STATES,
    Env,
    Layout,
)
from xrun_contract.storage import Storage, open_storage, read_chunks

ALLOWED = "; give a run name, a run path <root>/runs/<name>, or a log or metrics file"


class RunLogError(ValueError):
    """A run argument that cannot be read: one line naming what and why."""


# ---------------------------------------------------------------------------------------
# Per-step samples


STEP_CAP = 200_000  # samples kept per run before decimating (about 13 MB of columns)


class StepSeries:
    """Per-step samples as typed columns; keeps every ``stride``-th step past ``cap``.

    Totals (``count``, ``total_seconds``) are exact over every step seen; the columns are an
    evenly thinned sample once a run has more than ``cap`` steps, which keeps a 1 GB log's
    memory bounded while medians and tests stay representative.
    """

    COLUMNS = ("step", "seconds", "tflops", "tokens", "loss", "blocked", "time", "attempt")

    def __init__(self, cap: int = STEP_CAP):
        self.cap = cap
        self.stride = 1
        self.count = 0  # every step seen, kept or not
        self.total_seconds = 0.0
        self.step = array("q")
        self.attempt = array("l")
        self.seconds = array("d")
        self.tflops = array("d")
        self.tokens = array("d")
        self.loss = array("d")
        self.blocked = array("d")
        self.time = array("d")  # unix seconds the step was logged; nan when unknown
        self.total_weights_first: int | None = None
        self.total_weights_last: int | None = None

    def __len__(self) -> int:
        return len(self.step)

    def append(self, step: int, seconds: float, tflops: float, tokens: float, loss: float,
               blocked: float = 0.0, time: float = math.nan, attempt: int = 0,
               total_weights: int | None = None) -> None:
        index = self.count
        self.count += 1
        if math.isfinite(seconds):
            self.total_seconds += seconds
        if total_weights is not None:
            if self.total_weights_first is None:
                self.total_weights_first = total_weights
            self.total_weights_last = total_weights
        if index % self.stride:
            return
        self.step.append(step)
        self.attempt.append(attempt)
        self.seconds.append(seconds)
        self.tflops.append(tflops)
        self.tokens.append(tokens)
        self.loss.append(loss)
        self.blocked.append(blocked)
        self.time.append(time)
        if len(self.step) > self.cap:
            self._halve()

    def _halve(self) -> None:
        for name in self.COLUMNS:
            col = getattr(self, name)
            setattr(self, name, col[::2])
        self.stride *= 2

    def rows(self) -> Iterator[tuple[int, float, float, float, float, float, float, int]]:
        return zip(self.step, self.seconds, self.tflops, self.tokens, self.loss, self.blocked,
                   self.time, self.attempt, strict=True)

    @property
    def last_step(self) -> int | None:
        return self.step[-1] if self.step else None


# ---------------------------------------------------------------------------------------
# The run record


EVENT_CAP = 100_000  # checkpoint events kept individually (totals stay exact)


@dataclass
class RunRecord:
    """Everything the comparison and the report know about one run."""

    name: str = ""
    source: str = ""  # path or URL that was read
    kind: str = ""  # storage | log | metrics
    branch: str = ""
    commit: str = ""
    image: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    config: Any = None
    accelerator: str = ""
    process_id: int | None = None
    process_count: int | None = None
    devices: int | None = None  # global device count
    device_kind: str = ""
    backend: str = ""
    params: float | None = None  # parameter count
    params_text: str = ""  # as logged, e.g. "0.853 billion"
    params_exact: bool = False  # an exact count (metrics), not a log line's rounded billions
    flops: dict[str, float] | None = None
    memory: dict[str, Any] | None = None  # the device reading with the highest %
    steps: StepSeries = field(default_factory=StepSeries)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    checkpoint_totals: dict[str, float] = field(
        default_factory=lambda: {"blocked": 0.0, "waited": 0.0, "committed": 0.0, "saves": 0}
    )
    # (attempt, step) of saves that blocked or waited: their steps are not steady state.
    stalled_steps: set[tuple[int, int]] = field(default_factory=set)
    submitted_at: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    end_reason: str = ""
    state: str = ""
    restarts: int = 0
    transitions: list[dict[str, Any]] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)
    hosts_seen: list[str] = field(default_factory=list)
    wrapper_seconds: float | None = None
    log_first_time: float | None = None  # from absl prefixes (the year is assumed)
    log_last_time: float | None = None
    log_first_step_time: float | None = None
    notes: list[str] = field(default_factory=list)

    # -- identity -------------------------------------------------------------------
    @property
    def short_commit(self) -> str:
        c = self.commit.strip()
        return c[:7] if re.fullmatch(r"[0-9a-fA-F]{8,40}", c) else c

    @property
    def label(self) -> str:
        """'<branch> <short commit>', else what is known, else the run or file name."""
        parts = [p for p in (self.branch, self.short_commit) if p]
        if parts and not self.branch:
            parts.insert(0, self.name)
        return " ".join(parts) or self.name or self.source

    @property
    def jax(self) -> str:
        return self.versions.get("jax", "")

    @property
    def jaxlib(self) -> str:
        return self.versions.get("jaxlib", "")

    @property
    def libtpu(self) -> str:
        return self.versions.get("libtpu") or self.versions.get("libtpu_version", "")

    @property
    def finished(self) -> bool:
        """Did the run end successfully? Unknown (a log cut short) counts as not finished."""
        if self.state:
            return self.state == SUCCEEDED
        return self.exit_code == 0

    @property
    def outcome(self) -> str:
        if self.state:
            return self.state
        if self.exit_code is None:
            return "unknown (no exit code)"
        return "exit code 0" if self.exit_code == 0 else f"exit code {self.exit_code}"

    # -- derived ----------------------------------------------------------------------
    def steady_mask(self, warmup: int) -> list[bool]:
        """Which kept step samples are steady state.

        Not steady: the first ``warmup`` steps of every attempt (compilation, restore), steps
        next to a checkpoint save that blocked or waited (which of the two absorbed the stall
        depends on where the workload takes its timestamp), steps whose record says they were
        blocked, and unreadable values.
        """
        first_of_attempt: dict[int, int] = {}
        out: list[bool] = []
        stalled = self.stalled_steps
        for step, seconds, _tf, _tok, _loss, blocked, _t, attempt in self.steps.rows():
            first = first_of_attempt.setdefault(attempt, step)
            ok = (step >= first + warmup and math.isfinite(seconds) and not blocked
                  and (attempt, step) not in stalled and (attempt, step - 1) not in stalled)
            out.append(ok)
        return out

    def final_mask(self) -> list[bool]:
        """False for executions that a later attempt redid (the same step ran again)."""
        last: dict[int, int] = {}
        for i, step in enumerate(self.steps.step):
            last[step] = i
        return [last[step] == i for i, step in enumerate(self.steps.step)]

    # -- building ---------------------------------------------------------------------
    def add_checkpoint(self, event: str, step: int, seconds: float | None, attempt: int,
                       time: float | None = None) -> None:
        if event in ("blocked", "waited", "committed") and seconds is not None:
            self.checkpoint_totals[event] += seconds
        if event == "started":
            self.checkpoint_totals["saves"] += 1
        if event in ("blocked", "waited"):
            self.stalled_steps.add((attempt, step))
        if len(self.checkpoints) < EVENT_CAP:
            self.checkpoints.append({"event": event, "step": step, "seconds": seconds,
                                     "attempt": attempt, "time": time})
        elif len(self.checkpoints) == EVENT_CAP:
            self.notes.append(f"more than {EVENT_CAP} checkpoint events: later ones only counted")

    def set_memory(self, used: float, total: float, pct: float, device: str) -> None:
        if self.memory is None or pct > self.memory["pct"]:
            self.memory = {"used_gb": used, "total_gb": total, "pct": pct, "device": device}
        m = re.search(r"process=(\d+)", device)
        if m and self.process_id is None:
            self.process_id = int(m[1])

    def set_versions(self, versions: dict[str, Any]) -> None:
        """Header keys: versions, process identity, devices, commit, config."""
        for key, value in versions.items():
            if value is None or value == "":
                continue
            self.versions[str(key)] = str(value)
        v = self.versions
        for key, attr in (("process_id", "process_id"), ("process_count", "process_count"),
                          ("global_devices", "devices")):
            if key in v:
                with contextlib.suppress(ValueError):
                    setattr(self, attr, int(v[key]))
        self.device_kind = v.get("device_kind", self.device_kind)
        self.backend = v.get("backend", self.backend)
        self.accelerator = self.accelerator or v.get("accelerator", "")
        self.image = self.image or v.get("image", "")
        self.commit = self.commit or v.get("commit", "")
        if self.config is None and v.get("config"):
            self.config = _maybe_json(v["config"])


def _maybe_json(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    with contextlib.suppress(ValueError):
        return json.loads(text)
    return text


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


# ---------------------------------------------------------------------------------------
# Log parsing

# absl / glog prefix: "I1203 05:12:33.123456 140234 train.py:812] " (level, MMDD, time, tid, file:line)
ABSL_RE = re.compile(
    r"(?P<level>[IWEF])(?P<month>\d\d)(?P<day>\d\d) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)(?:\.(?P<us>\d{1,6}))?"
    r"\s+\d+\s+[^\s:\]]+:\d+\]\s?"
)
# `xrun logs` output prefixes every line with its host: "[0-1] ..." or "[0-1 #2] ...".
HOST_PREFIX_RE = re.compile(r"\[(?P<host>\d+-\d+)(?: #(?P<attempt>\d+))?\] ")
WRAPPER_START_RE = re.compile(r"xrun-wrapper: start host=(?P<host>\S+) attempt=(?P<attempt>\d+)")
WRAPPER_END_RE = re.compile(
    r"xrun-wrapper: end host=(?P<host>\S+) exit_code=(?P<code>-?\d+) seconds=(?P<seconds>[\d.]+)"
)
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
            state = self._hosts.get(host)
            if state is None:
                state = self._hosts[host] = _HostParse(RunRecord(hosts_seen=[host]))
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


# ---------------------------------------------------------------------------------------
# JSONL metrics and run.json


def apply_metric(rec: RunRecord, r: dict[str, Any]) -> None:
    """Fold one metrics JSONL record (see xrun_contract.METRIC_KINDS) into the record."""
    kind = r.get("kind")
    attempt = int(r.get("attempt") or 0)
    t = r.get("time")
    if kind == "step":
        rec.steps.append(
            int(r.get("step", 0)), _num(r.get("seconds")), _num(r.get("tflops_per_device")),
            _num(r.get("tokens_per_s_per_device")), _num(r.get("loss")),
            blocked=_num(r.get("checkpoint_blocked_s"), 0.0), time=_num(t), attempt=attempt,
            total_weights=r.get("total_weights") if isinstance(r.get("total_weights"), int) else None,
        )
    elif kind == "header":
        rec.set_versions(r.get("versions") or {})
        if rec.config is None and r.get("config") is not None:
            rec.config = _maybe_json(r["config"])
        if rec.start_time is None and isinstance(t, int | float):
            rec.start_time = float(t)
    elif kind == "params":
        with contextlib.suppress(TypeError, ValueError):
            rec.params = float(r["params"])
            rec.params_text = format_params(rec.params)
            rec.params_exact = True
    elif kind == "flops":
        rec.flops = {k: r[k] for k in ("tflops_per_step", "learnable_pct", "attention_pct",
                                       "tflops_per_device") if k in r}
    elif kind == "memory":
        with contextlib.suppress(KeyError, TypeError, ValueError):
            rec.set_memory(float(r["used_gb"]), float(r["total_gb"]), float(r["pct"]), str(r.get("device", "")))
    elif kind == "checkpoint":
        seconds = r.get("seconds")
        rec.add_checkpoint(str(r.get("event", "")), int(r.get("step", 0)),
                           float(seconds) if isinstance(seconds, int | float) else None, attempt,
                           float(t) if isinstance(t, int | float) else None)
    elif kind == "end":
        if isinstance(r.get("exit_code"), int):
            rec.exit_code = r["exit_code"]
        rec.end_reason = str(r.get("reason") or "")
        if isinstance(t, int | float):
            rec.end_time = max(rec.end_time or 0.0, float(t))


def format_params(count: float) -> str:
    """'0.853 billion' as MaxText logs it; small models in millions or as a plain count."""
    if count >= 1e8:
        return f"{count / 1e9:.3f} billion"
    if count >= 1e5:
        return f"{count / 1e6:.3f} million"
    return f"{count:,.0f}"


def _num(value: Any, default: float = math.nan) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(value)


def read_jsonl_lines(rec: RunRecord, lines: Iterable[str]) -> int:
    """Apply every JSON line; returns how many were not valid records (skipped)."""
    bad = 0
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(obj, dict) and "kind" in obj:
            apply_metric(rec, obj)
        else:
            bad += 1
    return bad


def apply_run_json(rec: RunRecord, run: dict[str, Any]) -> None:
    """run.json: spec (name, accelerator, branch, commit, image), submit time, workload."""
    spec = run.get("spec") or {}
    rec.spec = spec
    rec.name = rec.name or str(run.get("name") or spec.get("name") or "")
    env = spec.get("env") or {}
    rec.branch = str(spec.get("branch") or env.get(Env.BRANCH) or rec.branch or "")
    rec.commit = str(spec.get("commit") or env.get(Env.COMMIT) or rec.commit or "")
    rec.image = str(spec.get("image") or rec.image or "")
    rec.accelerator = str(spec.get("accelerator") or rec.accelerator or "")
    if isinstance(run.get("submitted_at"), int | float):
        rec.submitted_at = float(run["submitted_at"])
    wl = run.get("workload") or {}
    if not isinstance(wl, dict):
        return
    rec.set_versions(wl.get("versions") or {})
    if wl.get("config") is not None:
        rec.config = wl["config"]
    if wl.get("accelerator") and not rec.accelerator:
        rec.accelerator = str(wl["accelerator"])
    for key in ("start_time", "end_time"):
        if isinstance(wl.get(key), int | float):
            setattr(rec, key, float(wl[key]))
    if isinstance(wl.get("exit_code"), int):
        rec.exit_code = wl["exit_code"]


def apply_state(rec: RunRecord, state: dict[str, Any]) -> None:
    rec.state = str(state.get("state") or "")
    rec.restarts = int(state.get("restarts") or 0)
    rec.transitions = list(state.get("transitions") or [])
    hosts = state.get("hosts") or {}
    if hosts and rec.process_count is None:
        rec.process_count = len(hosts)
    if rec.state in TERMINAL_STATES:
        ends = [t.get("time") for t in rec.transitions if t.get("state") == rec.state]
        if ends and isinstance(ends[-1], int | float):
            rec.end_time = float(ends[-1])


# ---------------------------------------------------------------------------------------
# Sources


def iter_file_text(path: Path) -> Iterator[str]:
    """A file's text in bounded pieces (gzip when it ends in .gz); bad bytes replaced."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace", newline="") as f:
        while True:
            piece = f.read(READ_CHARS)
            if not piece:
                return
            yield piece


def read_log_file(path: str | Path, record: RunRecord | None = None) -> RunRecord:
    """Parse one log file (or JSONL metrics file) of any size in bounded memory."""
    path = Path(path)
    rec = record or RunRecord()
    rec.kind = rec.kind or "log"
    rec.source = rec.source or str(path)
    rec.name = rec.name or path.name.split(".")[0]
    if _looks_like_jsonl(path):
        rec.kind = "metrics"
        pending = ""
        bad = 0
        for piece in iter_file_text(path):
            lines = (pending + piece).split("\n")
            pending = lines.pop()
            bad += read_jsonl_lines(rec, lines)
        bad += read_jsonl_lines(rec, [pending])
        if bad:
            rec.notes.append(f"{bad} lines of {path.name} were not metrics records; skipped")
        return rec
    year = None
    with contextlib.suppress(OSError):
        year = _dt.datetime.fromtimestamp(path.stat().st_mtime, _dt.UTC).year
    parser = LogParser(rec, year=year)
    for piece in iter_file_text(path):
        parser.feed(piece)
    return parser.finish()


def _looks_like_jsonl(path: Path) -> bool:
    if path.name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        return True
    try:
        first = next(iter_file_text(path), "")[:4096].lstrip()
    except (OSError, EOFError):
        return False
    line = first.split("\n", 1)[0]
    if not line.startswith("{"):
        return False
    try:
        return "kind" in json.loads(line)
    except json.JSONDecodeError:
        return False


def read_stored_run(storage: Storage, name: str) -> RunRecord:
    """A run under a storage root: run.json, state.json, metrics; logs when metrics lack steps."""
    run = storage.read_json(Layout.run_json(name))
    state = storage.read_json(Layout.state(name))
    rec = RunRecord(name=name, source=storage.url(Layout.run(name)), kind="storage")
    if run:
        apply_run_json(rec, run)
    bad = 0
    for _key, data in read_chunks(storage, Layout.metrics(name)):
        bad += read_jsonl_lines(rec, data.decode("utf-8", errors="replace").splitlines())
    if bad:
        rec.notes.append(f"{bad} metrics lines were not valid JSON records; skipped")
    found_logs = False
    if rec.steps.count == 0:
        found_logs = _read_stored_logs(storage, name, rec)
    if state:
        apply_state(rec, state)
    if run is None and state is None and rec.steps.count == 0 and not found_logs:
        raise RunLogError(f"run: nothing stored for {name!r} under {storage.root}")
    if rec.process_id is None and rec.kind == "storage" and rec.versions.get("process_id") is None:
        rec.process_id = 0  # metrics and the fallback log are process 0's
    return rec


def _read_stored_logs(storage: Storage, name: str, rec: RunRecord) -> bool:
    """Process 0's log chunks (host 0-0, else the first host), attempt by attempt."""
    _, host_prefixes = storage.list(Layout.logs(name))
    hosts = [p.rsplit("/", 1)[-1] for p in host_prefixes]
    if not hosts:
        return False
    host = "0-0" if "0-0" in hosts else hosts[0]
    rec.hosts_seen = hosts
    parser = LogParser(rec, attempt=0)
    _, attempt_prefixes = storage.list(f"{Layout.logs(name)}/{host}")
    for ap in attempt_prefixes:
        m = ATTEMPT_RE.search(ap.rsplit("/", 1)[-1])
        if not m:
            continue
        parser.set_attempt(int(m[1]))
        for _key, data in read_chunks(storage, ap):
            parser.feed(data.decode("utf-8", errors="replace"))
    out = parser.finish()
    if out.steps.count:
        rec.notes.append(f"no step metrics stored: read from host {host}'s log")
    return True


def split_storage_path(path: str) -> tuple[str, str] | None:
    """'<root>/runs/<name>' (a folder or gs:// URL) -> (root, name)."""
    p = path.rstrip("/")
    marker = f"/{Layout.RUNS}/"
    idx = p.rfind(marker)
    if idx < 0:
        return None
    root, name = p[:idx], p[idx + len(marker):]
    if not name or "/" in name:
        return None
    return (root or "/"), name


def load_run(arg: str, storage_root: str | None = None, what: str = "run") -> RunRecord:
    """A run name (under ``storage_root``), a storage path ``.../runs/<name>``, or a log file.

    ``what`` names the argument in errors (BASE, CANDIDATE).
    """
    if not arg or not arg.strip():
        raise RunLogError(f"{what}: empty; give a run name, a storage path .../runs/<name>, or a log file")
    try:
        if arg.startswith("gs://"):
            parts = split_storage_path(arg)
            if parts is None:
                raise RunLogError(f"{what}: {arg!r} is not a run path like gs://bucket/prefix/runs/<name>")
            return _checked(read_stored_run(open_storage(parts[0]), parts[1]), what, arg)
        path = Path(arg).expanduser()
        if path.is_file():
            try:
                rec = read_log_file(path)
            except OSError as e:
                raise RunLogError(f"{what}: cannot read {arg}: {e.strerror or e}") from None
            return _checked(rec, what, arg)
        if path.is_dir():
            if not any((path / n).exists() for n in ("run.json", "state.json", "metrics", "logs")):
                raise RunLogError(f"{what}: folder {arg} is not a run (no run.json, state.json, metrics/ or logs/)")
            root = path.resolve().parent
            if root.name == Layout.RUNS:
                root = root.parent
                return _checked(read_stored_run(open_storage(str(root)), path.resolve().name), what, arg)
            rec = read_stored_run(_FolderRun(path), path.resolve().name)
            rec.source = str(path)
            return _checked(rec, what, arg)
        if "/" in arg or arg.endswith((".log", ".txt", ".jsonl", ".gz")):
            raise RunLogError(f"{what}: no such file or folder: {arg}{ALLOWED}")
        if storage_root is None:
            raise RunLogError(f"{what}: {arg!r} is not a file; give --storage to read run names")
        storage = open_storage(storage_root)
        if storage.read_json(Layout.run_json(arg)) is None and storage.read_json(Layout.state(arg)) is None:
            raise RunLogError(f"{what}: no run named {arg!r} under {storage.root} (see 'xrun list'), "
                              "and no such file")
        return _checked(read_stored_run(storage, arg), what, arg)
    except RunLogError:
        raise
    except (OSError, ValueError) as e:
        raise RunLogError(f"{what}: cannot read {arg}: {e}") from None


def _checked(rec: RunRecord, what: str, arg: str) -> RunRecord:
    """A source with nothing recognisable is bad input, not an empty run."""
    if rec.kind != "storage" and rec.steps.count == 0 and not rec.versions and rec.exit_code is None:
        raise RunLogError(f"{what}: {arg} has no training lines (no 'completed step:', 'xrun header' "
                          "or metrics records)")
    return rec


class _FolderRun(Storage):
    """A copied run folder (run.json, metrics/, logs/) outside any runs/ root."""

    def __init__(self, path: Path):
        from xrun_contract.storage import LocalStorage

        self._inner = LocalStorage(str(path))
        self.root = self._inner.root
        self.name = path.resolve().name

    def _k(self, key: str) -> str:
        return key.split("/", 2)[2] if key.startswith(f"{Layout.RUNS}/") and key.count("/") >= 2 else ""

    def read_bytes(self, key: str) -> bytes | None:
        return self._inner.read_bytes(self._k(key))

    def list(self, prefix: str, delimiter: str | None = "/"):
        objects, prefixes = self._inner.list(self._k(prefix), delimiter)
        from xrun_contract.storage import ObjectInfo

        base = Layout.run(self.name)
        return ([ObjectInfo(f"{base}/{o.key}", o.size, o.updated) for o in objects],
                [f"{base}/{p}" for p in prefixes])

    def url(self, key: str = "") -> str:
        return self._inner.url(self._k(key))
