"""Streaming parser of training logs (MaxText / Orbax / XPK lines and xrun's own lines).

Logs are parsed as a stream of bounded pieces (a 1 GB log, or one 1 GB "line", never sits in
memory): lines are split at every known message start and at absl prefixes
(``I1203 05:12:33.123456 140234 train.py:812]``), so several messages glued into one line
parse like separate lines. This module is the scanner (where the messages are, their times,
hosts and attempts, step lines in bulk); what each message means is its handler's, in
``orchestrator.readers.loglines`` (xrun's lines by the contract's regexes, the foreign ones,
MaxText, Orbax, XPK, each with the upstream function that prints it).

MaxText's step timing, which decides where a checkpoint stall shows up
(``maxtext/trainers/pre_train/train.py``, ``training_loop_iteration()``): step k's
``seconds`` is host time from step k-1's dispatch to step k's, so the save at step k
(MaxText's ``block_until_ready`` and Orbax's blocking save, including "Waiting for previous
save") lands in the ``seconds`` of step k+1. Step lines are buffered one step
(``MetricLogger.buffer_and_write_metrics()``), so the save lines of step k come *before*
the line of step k-1 in the file: stalls are attributed by step number, never by position.

Speed (a nightly reads 1 GB logs; ``bench/bench_logparse.py``): the text is handled as bytes
and one Aho-Corasick pass (``ahocorasick_rs``, Rust's ``aho-corasick``) finds every message
start of a piece; only the lines holding one are decoded and parsed, each by the handler of
its start. Runs of step lines, most of what is left, are read by one ``findall`` and wait,
across other messages, until something needs them in order (a restore, a restart, a step
read line by line); their numbers are then converted column by column, and the times and
fields only for the samples :class:`StepSeries` keeps.
"""

from __future__ import annotations

import calendar
import datetime as _dt
import functools
import itertools
import math
import operator
import re
from collections.abc import Callable, Iterator
from typing import Any

import ahocorasick_rs

from orchestrator.readers.loglines import (
    _HANDLERS,
    MESSAGE_STARTS,
    NOTE_CHARS,
    LineHandlers,
    _HostParse,
)
from orchestrator.readers.record import RunRecord
from xrun_contract import HOST_PREFIX_RE, STEP_RE

# ---------------------------------------------------------------------------------------
# Log parsing

# absl / glog prefix: "I1203 05:12:33.123456 140234 train.py:812] " (level, MMDD, time, tid, file:line)
ABSL_RE = re.compile(
    r"(?P<level>[IWEF])(?P<month>\d\d)(?P<day>\d\d) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)(?:\.(?P<us>\d{1,6}))?"
    r"\s+\d+\s+[^\s:\]]+:\d+\]\s?"
)
# Where a very long line may be cut (_cut_pending): an absl prefix or a message start.
SEGMENT_RE_B = re.compile(
    ("(?P<absl>" + ABSL_RE.pattern + ")|(?=" + "|".join(re.escape(s) for s in MESSAGE_STARTS)
     + ")").encode())
# Every message start at once: bytes for whole pieces, str for one decoded line.
_STARTS_B = ahocorasick_rs.BytesAhoCorasick([s.encode() for s in MESSAGE_STARTS],
                                            matchkind=ahocorasick_rs.MatchKind.LeftmostLongest)
_STARTS = ahocorasick_rs.AhoCorasick(list(MESSAGE_STARTS),
                                     matchkind=ahocorasick_rs.MatchKind.LeftmostLongest)
_STEP_START = MESSAGE_STARTS.index("completed step: ")
# A chunk's match kinds as bytes (one per match): where a run of step messages ends is
# then one search in C, not a Python loop over millions of matches.
_NOT_A_STEP_KIND = re.compile(b"[^" + re.escape(bytes([_STEP_START])) + b"]")
_KIND, _POS = operator.itemgetter(0), operator.itemgetter(1)
_STEP_FIELD, _SECONDS_FIELD = operator.itemgetter(0), operator.itemgetter(1)
# A whole step line after its host prefix: an optional absl prefix, then the step message
# running to the end of the line (what STEP_RE.search reads in the general path; another
# message start on the line, or a carriage return, takes that path instead). Possessive
# quantifiers (never backtracking) match the same lines twice as fast.
_STEP_B = STEP_RE.pattern.replace("]+", "]++").replace(r"\d+", r"\d++").encode()
_STEP_LINE_B = re.compile(
    rb"(?:[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?[ \t]+\d+[ \t]+[^\s:\]]+:\d+\][ \t]?)?"
    + _STEP_B + rb"[^\r\n]*+\n")
# The step message alone (for findall over a run of step lines with no carriage return).
_STEP_ONLY_B = re.compile(_STEP_B)
_HOST_PREFIX_B = re.compile(HOST_PREFIX_RE.pattern.encode())
_HOST_LINE_B = re.compile(rb"\n\[(\d+-\d+(?: #\d+)?)\] ")
_ABSL_B = re.compile(ABSL_RE.pattern.encode())
_ABSL_LINE_B = re.compile(rb"\n" + ABSL_RE.pattern.encode())  # the first absl line after a newline

_FRACTION_SCALE = [10 ** n for n in range(7)]  # an absl time's fraction has 1-6 digits
READ_CHARS = 1 << 20  # file read size (bytes)
MAX_PENDING = 1 << 16  # longest unterminated line kept before it is cut at a message start
MARGIN = 4096  # longer than any message the regexes match




class LogParser(LineHandlers):
    """Streaming parser: ``feed`` arbitrary pieces (bytes, or text), then ``finish``.

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
        self._pending = b""
        self._continuing = False  # the pending text continues a line already partly parsed
        self._cur_host = ""
        self._year = year or _dt.datetime.now(_dt.UTC).year
        self._days: dict[tuple[int, Any, Any], float | None] = {}  # absl MMDD -> its midnight
        self._batched: list[_HostParse] = []  # hosts whose step batch is not converted yet
        self._run: list[tuple] = []  # step rows of the unprefixed stream (_step_region)
        self._run_steps: list[int] = []  # their step numbers, converted once
        self._run_pos: list[int] = []  # where each row's message starts in _run_body
        self._run_body = b""
        self._run_last = 0  # the last step of _run
        self._handlers = {kind: getattr(self, name) for kind, name in _HANDLERS.items()}
        self._last_key: Any = None  # the last absl second read, and its time: _absl_time
        self._last_base: float | None = None
        self._last_hour: Any = None  # ... and its hour
        self._hour_base: float | None = None

    def set_attempt(self, attempt: int) -> None:
        """The attempt of what comes next (stored logs name it in their path)."""
        self.flush_line()
        root = self._hosts[""]
        root.attempt, root.attempt_known, root.last_step = attempt, True, None

    # -- input ------------------------------------------------------------------------
    def feed(self, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode("utf-8", "replace")
        buf = self._pending + data if self._pending else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            self._pending = buf
        else:
            self._pending = buf[cut + 1:]
            self._lines(buf[:cut + 1])
        if len(self._pending) > MAX_PENDING:
            self._cut_pending()

    def flush_line(self) -> None:
        """End the current unterminated line (end of a file or chunk sequence)."""
        if self._pending:
            line, self._pending = self._pending, b""
            self._physical_line(_decode(line), continuation=self._continuing)
            if not self._continuing:
                prefixes = self._register_hosts(line, 0)
                self._log_times(line + b"\n", 0, prefixes, first=True)
                self._log_times(line + b"\n", 0, prefixes, first=False)
        self._continuing = False
        self._flush_steps()

    def _cut_pending(self) -> None:
        """A very long line: parse up to its last message start, keep the rest pending.

        Cutting at a message start splits nothing a regex could match; with no start in
        sight the cut keeps a margin longer than any message.
        """
        starts = [m.start() for m in SEGMENT_RE_B.finditer(self._pending) if m.start() > 0]
        cut = starts[-1] if starts else 0
        if cut <= 0 or len(self._pending) - cut > MAX_PENDING:
            cut = len(self._pending) - MARGIN
        head, self._pending = self._pending[:cut], self._pending[cut:]
        self._physical_line(_decode(head), continuation=self._continuing)
        self._continuing = True  # what remains belongs to the same physical line

    def _lines(self, body: bytes) -> None:
        """Whole lines (``body`` ends with a newline): only those holding a message start
        are looked at; step lines are batched (see module doc)."""
        start = 0
        if self._continuing:  # the first line ends a line already partly parsed
            start = body.index(b"\n") + 1
            self._physical_line(_decode(body[:start - 1]), continuation=True)
            self._continuing = False
        prefixes = self._register_hosts(body, start)
        self._log_times(body, start, prefixes, first=True)
        matches = _STARTS_B.find_matches_as_indexes(body)
        kinds = bytes(map(_KIND, matches))  # MESSAGE_STARTS has fewer than 256 entries
        n = len(matches)
        i = 0
        while i < n:
            index, pos, _ = matches[i]
            if pos < start:
                i += 1
                continue
            line_start = body.rfind(b"\n", 0, pos) + 1
            line_end = body.index(b"\n", pos)
            j = i + 1
            while j < n and matches[j][1] < line_end:
                j += 1
            if j == i + 1 and index == _STEP_START:
                if body[line_start] != 0x5B:  # "[": a host prefix takes the per-line path
                    k = self._step_region(body, line_start, matches, kinds, i, bool(prefixes))
                    if k > i:
                        i = k
                        continue
                if self._step_line(body, line_start, pos):
                    i = j
                    continue
            # Step rows wait: the handlers that need them in order flush them.
            raw = body[line_start:line_end]
            line = _decode(raw)
            if j == i + 1 and len(line) == len(raw):
                # One message start, ASCII: its place is known already.
                self._one_start(line, index, pos - line_start)
            else:
                self._physical_line(line, continuation=False)
            i = j
        self._flush_steps()
        self._log_times(body, start, prefixes, first=False)

    def _register_hosts(self, body: bytes, start: int) -> list[bytes]:
        """Every host prefix of these lines, in order, as the general path would see them
        (a host that logged nothing parseable is still a host of the log)."""
        found = _HOST_LINE_B.findall(body, max(start - 1, 0))
        m = _HOST_PREFIX_B.match(body, start)
        if m:
            found.insert(0, body[start + 1:m.end() - 2])
        prefixes = list(dict.fromkeys(found))
        for prefix in prefixes:
            host = prefix.split(b" ", 1)[0].decode()
            if host not in self._hosts:
                self._hosts[host] = _HostParse(RunRecord(hosts_seen=[host]))
        return prefixes

    def _host_state(self, host: str, attempt: int | None) -> _HostParse:
        self._cur_host = host
        state = self._hosts.get(host)
        if state is None:
            state = self._hosts[host] = _HostParse(RunRecord(hosts_seen=[host]))
        if attempt is not None and (attempt != state.attempt or not state.attempt_known):
            self._flush_steps()
            state.attempt, state.attempt_known = attempt, True
            if attempt:
                state.last_step = None
        return state

    def _step_region(self, body: bytes, line_start: int, matches: list[tuple[int, int, int]],
                     kinds: bytes, i: int, prefixed: bool) -> int:
        """The step lines from ``line_start`` up to the next other message, read at once:
        one ``findall`` for their fields, converted column by column; the index of the
        first message start after them (``i``: none taken, read line by line instead).

        Taken only when every step message there is alone on its line (the chunk's one pass
        saw no other start there), no line carries a host prefix or a carriage return; then
        each step's time is its line's absl time, looked up only for the first, the last and
        the samples the series keeps."""
        n = len(matches)
        other = _NOT_A_STEP_KIND.search(kinds, i)
        k = n if other is None else other.start()
        end = body.index(b"\n", matches[k - 1][1]) + 1
        if k < n and matches[k][1] < end:
            return i  # the last line holds another message after its step
        if prefixed and _HOST_LINE_B.search(body, line_start, end) is not None:
            return i
        if body.find(b"\r", line_start, end) >= 0:
            return i  # a progress bar's carriage return: the general path splits there
        rows = _STEP_ONLY_B.findall(body, line_start, end)
        if len(rows) != k - i:
            return i  # a step message that does not parse: the general path decides
        root = self._hosts[""]
        if root.batch:
            self._flush_batches()  # what came before, first
        self._cur_host = ""
        steps = list(map(int, map(_STEP_FIELD, rows)))
        last = self._run_last if self._run else root.last_step
        self._run += rows
        self._run_steps += steps
        self._run_pos += map(_POS, matches[i:k])
        self._run_body = body
        self._run_last = steps[-1]
        if (last is not None and steps[0] <= last) or any(map(operator.le, steps[1:], steps[:-1])):
            self._flush_run()  # steps went back: a restart counts from here on
        return k

    def _step_line(self, body: bytes, line_start: int, pos: int) -> bool:
        """A line that is one step message: batch its fields; False when it is anything
        more (the general path then reads it)."""
        host, attempt, at = "", None, line_start
        if body[line_start] == 0x5B:  # "["
            h = _HOST_PREFIX_B.match(body, line_start)
            if h is None:
                return False
            host, at = h[1].decode(), h.end()
            attempt = int(h[2] or 0)
        m = _STEP_LINE_B.match(body, at)
        if m is None or m.start(7) != pos + len("completed step: "):
            return False
        st = self._hosts[""] if not host else self._host_state(host, attempt)
        if not host:
            self._cur_host = ""
            self._flush_run()  # keep the unprefixed stream's steps in order
        step = int(m[7])
        last = st.batch_last if st.batch else st.last_step
        if not st.batch:
            self._batched.append(st)
        st.batch.append(m.groups())
        st.batch_last = step
        if last is not None and step <= last:
            self._flush_steps()  # steps went back: a restart counts from here on
        return True

    def _flush_steps(self) -> None:
        """Convert every pending step row: the unprefixed stream's run, the per-line batches."""
        self._flush_run()
        self._flush_batches()

    def _flush_run(self) -> None:
        """The unprefixed stream's step runs waiting since the last flush (``_step_region``).
        They, and the per-line batches, wait across other messages: only what reads or
        changes a host's steps or attempt (a step read line by line, a restore, a wrapper
        line, XPK's year, steps going back) flushes them first, so a run of step lines
        between checkpoint lines is converted at once."""
        if not self._run:
            return
        rows, steps, pos, body = self._run, self._run_steps, self._run_pos, self._run_body
        self._run, self._run_steps, self._run_pos, self._run_body = [], [], [], b""
        self._add_steps(self._hosts[""], rows, lambda r: self._time_at(body, pos[r]), steps)

    def _flush_batches(self) -> None:
        """Convert the per-line batches: rows of (absl fields, step fields)."""
        batched, self._batched = self._batched, []
        for st in batched:
            rows, st.batch = st.batch, []
            if rows:
                self._add_steps(st, [r[6:] for r in rows], functools.partial(self._nth_time, rows))

    def _add_steps(self, st: _HostParse, rows: list[tuple], time_of: Callable[[int], float | None],
                   steps: list[int] | None = None) -> None:
        """Step rows (step, seconds, tflops, tokens, total_weights, loss as bytes) in log
        order; ``time_of(i)`` is row i's time; ``steps`` their step numbers where the caller
        has converted them. Totals over every row; the columns only for the samples the
        series keeps."""
        rec = st.record
        unshifted = time_of
        if steps is None:
            steps = list(map(int, map(_STEP_FIELD, rows)))
        backwards = (st.last_step is not None and steps[0] <= st.last_step) or any(
            map(operator.le, steps[1:], steps[:-1]))
        first_ts = time_of(0)
        last_ts = time_of(len(rows) - 1) if len(rows) > 1 else first_ts
        # absl times carry no year: past a new year every time reads ~365 days early and is
        # moved on (``_note_time``); a batch wholly past it moves as one.
        half_year, shift = 180 * 86400, 0.0
        if (first_ts is not None and rec.log_last_time is not None
                and first_ts < rec.log_last_time - half_year):
            shift = 365 * 86400.0
            first_ts += shift
            last_ts = None if last_ts is None else last_ts + shift
            time_of = functools.partial(_shifted, time_of, shift)
        crossed = first_ts is not None and (
            (rec.log_last_time is not None and first_ts < rec.log_last_time - half_year)
            or (last_ts is not None and last_ts < first_ts - half_year))
        if (backwards and not st.attempt_known) or crossed:
            # A restart or a new year inside: step by step, as the general path reads them.
            for i, r in enumerate(rows):
                ts = self._note_time(rec, unshifted(i))
                self._step(st, int(r[0]), _float_b(r[1]), _float_b(r[2]), _float_b(r[3]),
                           _float_b(r[5]), int(r[4]), ts)
            return
        if first_ts is not None:
            if rec.log_first_time is None:
                rec.log_first_time = first_ts
            if rec.log_first_step_time is None:
                rec.log_first_step_time = first_ts
        if last_ts is not None and (rec.log_last_time is None or last_ts > rec.log_last_time):
            rec.log_last_time = last_ts  # (messages after a waiting run may be later)
        st.last_step = steps[-1]
        try:
            seconds_total = math.fsum(map(float, map(_SECONDS_FIELD, rows)))
        except ValueError:
            seconds_total = math.nan
        if not math.isfinite(seconds_total):
            seconds_total = math.fsum(x for x in map(_float_b, map(_SECONDS_FIELD, rows))
                                      if math.isfinite(x))
        attempt = st.attempt
        last = len(rows) - 1

        def row(i: int) -> tuple:
            r = rows[i]
            ts = first_ts if i == 0 else last_ts if i == last else time_of(i)
            try:
                return (steps[i], float(r[1]), float(r[2]), float(r[3]), float(r[5]),
                        0.0, math.nan if ts is None else ts, attempt)
            except ValueError:
                return (steps[i], _float_b(r[1]), _float_b(r[2]), _float_b(r[3]), _float_b(r[5]),
                        0.0, math.nan if ts is None else ts, attempt)

        rec.steps.add_many(len(rows), seconds_total, int(rows[0][4]), int(rows[-1][4]), row)

    def _time_at(self, body: bytes, pos: int) -> float | None:
        """The time of the message at ``pos``: the last absl prefix before it on its line
        (after any carriage return), as the general path cuts it."""
        line_start = body.rfind(b"\n", 0, pos) + 1
        cr = body.rfind(b"\r", line_start, pos)
        if cr >= 0:
            line_start = cr + 1
        m = _ABSL_B.match(body, line_start)
        if m is None or m.end() != pos:
            m = None
            for m in _ABSL_B.finditer(body, line_start, pos):  # noqa: B007 - the last one
                pass
        return None if m is None else self._absl_time(m)

    def _nth_time(self, rows: list[tuple], i: int) -> float | None:
        return self._row_time(rows[i])

    def _row_time(self, r: tuple) -> float | None:
        """A batched row's absl time (as ``_absl_time``), or None without a prefix."""
        return None if r[0] is None else self._time_of(r[0], r[1], r[2], r[3], r[4], r[5])

    def _log_times(self, body: bytes, start: int, prefixes: list[bytes], first: bool) -> None:
        """The first and last absl times of each host's log, not only of its message lines:
        what goodput takes as the log's start and end."""
        if not prefixes:
            self._first_last(self._hosts[""].record, body, start, b"", first)
            return
        for prefix in prefixes:
            st = self._hosts[prefix.split(b" ", 1)[0].decode()]
            self._first_last(st.record, body, start, b"[" + prefix + b"] ", first)

    def _first_last(self, rec: RunRecord, body: bytes, start: int, prefix: bytes,
                    first: bool) -> None:
        if first:
            if rec.log_first_time is not None:
                return
            m = None
            if prefix:
                for line_start in itertools.islice(_line_starts(body, start, prefix), 64):
                    m = _ABSL_B.match(body, line_start + len(prefix))
                    if m is not None:
                        break  # this host's first absl line among its first lines
            else:
                m = _ABSL_B.match(body, start) or _ABSL_LINE_B.search(body, start)
            if m is not None:
                self._note_time(rec, self._absl_time(m))
            return
        end = len(body) - 1
        for _ in range(64):  # the last absl line among the last lines (of this host)
            if prefix:
                found = body.rfind(b"\n" + prefix, start - 1 if start else 0, end)
                if found < 0 and not body.startswith(prefix, start):
                    return
                line_start = found + 1 if found >= 0 else start
            else:
                line_start = max(body.rfind(b"\n", start, end) + 1, start)
            m = _ABSL_B.match(body, line_start + len(prefix))
            if m is not None:
                ts = self._absl_time(m)
                last = rec.log_last_time
                if ts is not None and last is not None and ts < last - 180 * 86400:
                    ts += 365 * 86400
                if ts is not None and (last is None or ts > last):
                    rec.log_last_time = ts
                return
            if line_start <= start:
                return
            end = line_start - 1

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
            state = self._host_state(host, attempt)
        if state.batch:
            self._flush_batches()
        if state is self._hosts[""]:
            self._flush_run()
        if "\r" in line:  # progress bars redraw with carriage returns
            for piece in line.split("\r"):
                self._scan(state, piece)
        else:
            self._scan(state, line)

    def _one_start(self, line: str, index: int, at: int) -> None:
        """A whole line whose one message start (``index``) is at ``at``."""
        text, st = line, None
        if line.startswith("["):
            h = HOST_PREFIX_RE.match(line)
            if h is not None:
                st = self._host_state(h["host"], int(h["attempt"] or 0))
                text, at = line[h.end():], at - h.end()
        if st is None:
            self._cur_host = ""
            st = self._hosts[""]
        if "\r" in line or at < 0 or not self._one_message(st, text, index, at):
            self._physical_line(line, continuation=False)

    def _one_message(self, st: _HostParse, line: str, index: int, at: int) -> bool:
        """The common case: one message, no absl prefix after its start (an absl prefix
        needs a "]"); its time is the line's leading absl prefix's, if any. False: the
        line needs the general cut."""
        if line.find("]", at) >= 0:
            return False
        m = ABSL_RE.match(line) if at else None
        if at and m is None and ("] " in line or "]\t" in line):
            return False  # an absl prefix elsewhere before the message
        ts = self._absl_time(m) if m is not None and m.end() <= at else None
        self._segment(st, line[at:], ts, MESSAGE_STARTS[index])
        return True

    def _scan(self, st: _HostParse, line: str) -> None:
        """Cut a line at every message start and absl prefix; parse each message."""
        starts = _STARTS.find_matches_as_indexes(line)
        if not starts:
            return  # no message here (absl prefixes alone do not matter)
        if len(starts) == 1 and self._one_message(st, line, starts[0][0], starts[0][1]):
            return
        cuts: list[tuple[int, int, re.Match | None, str]] = [
            (s, s, None, MESSAGE_STARTS[i]) for i, s, _ in starts]
        if "] " in line or "]\t" in line:
            cuts += [(m.start(), m.end(), m, "") for m in ABSL_RE.finditer(line)]
        cuts.sort(key=lambda c: (c[0], c[2] is None))
        pos = 0
        seg_time = None
        kind = ""  # the message start the piece from pos on begins with ("": none)
        for start, end, m, what in cuts:
            if start < pos:
                continue  # inside an absl prefix already consumed
            if start > pos:
                if kind:
                    self._segment(st, line[pos:start], seg_time, kind)
                elif seg_time is not None:
                    self._note_time(st.record, seg_time)
            if m is not None:
                seg_time = self._absl_time(m)
            pos, kind = end, what
        if pos < len(line) and kind:
            self._segment(st, line[pos:], seg_time, kind)
        elif seg_time is not None:
            self._note_time(st.record, seg_time)
        if len(starts) > 1:
            st.lines_split += 1  # several messages glued into one line

    def _absl_time(self, m: re.Match) -> float | None:
        """An absl prefix's time (str or bytes match): the year is assumed (``_year``).
        Lines come in bursts within one second: the last second's start is kept."""
        at = m.start(1)  # the level letter
        key = m.string[at + 1:at + 14]  # "MMDD HH:MM:SS": fixed width
        if key == self._last_key:
            base = self._last_base
        else:
            # Another second: from its hour's start (the samples a long log keeps are often
            # minutes apart). Whole seconds, so these sums are exact.
            hour, mi, second = key[:7], int(m[5]), int(m[6])
            if hour == self._last_hour and self._hour_base is not None and mi < 60 and second < 60:
                base = self._hour_base + mi * 60 + second
            else:
                base = self._time_of(m[2], m[3], m[4], m[5], m[6], None)  # month ... second
                self._last_hour = hour
                self._hour_base = None if base is None else base - mi * 60 - second
            self._last_key, self._last_base = key, base
        us = m[7]  # the fraction: int(us) / 10**len(us) is us.ljust(6, "0") / 1e6, rounded once
        if base is None or not us:
            return base
        return base + int(us) / _FRACTION_SCALE[len(us)]

    def _time_of(self, month: Any, day: Any, h: Any, mi: Any, s: Any, us: Any) -> float | None:
        key = (self._year, month, day)
        midnight = self._days.get(key, 0.0)
        if midnight == 0.0:
            try:
                _dt.date(self._year, int(month), int(day))
                midnight = float(calendar.timegm((self._year, int(month), int(day), 0, 0, 0)))
            except ValueError:
                midnight = None
            self._days[key] = midnight
        if midnight is None or int(h) > 23 or int(mi) > 59 or int(s) > 59:
            return None
        micro = int(us.ljust(6, b"0" if isinstance(us, bytes) else "0")) if us else 0
        return midnight + int(h) * 3600 + int(mi) * 60 + int(s) + micro / 1e6

    # -- one message --------------------------------------------------------------------
    def _segment(self, st: _HostParse, seg: str, ts: float | None, kind: str) -> None:
        """One message: ``kind`` is the message start it begins with (MESSAGE_STARTS)."""
        self._handlers[kind](st, seg, self._note_time(st.record, ts))
































    # -- output -------------------------------------------------------------------------
    def finish(self) -> RunRecord:
        """The record of the host that logged steps (ties: the unprefixed stream, then 0-0)."""
        self.flush_line()  # also converts the last batch of step lines
        for st in self._hosts.values():
            self._save_flush(st)
            if st.lines_split:
                st.record.notes.append(f"{st.lines_split} lines held several glued messages; split")
            # A note quotes at most a short piece of a log line, never a whole glued one.
            st.record.notes = [n if len(n) <= NOTE_CHARS else n[:NOTE_CHARS - 3] + "..."
                               for n in st.record.notes]
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





def _shifted(time_of: Callable[[int], float | None], shift: float, i: int) -> float | None:
    ts = time_of(i)
    return None if ts is None else ts + shift


def _line_starts(body: bytes, start: int, prefix: bytes) -> Iterator[int]:
    """Where the lines beginning with ``prefix`` start, from ``start`` on."""
    if body.startswith(prefix, start):
        yield start
    i = body.find(b"\n" + prefix, start)
    while i >= 0:
        yield i + 1
        i = body.find(b"\n" + prefix, i + 1)


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _float_b(text: bytes) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan






