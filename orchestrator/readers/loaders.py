"""Build a :class:`RunRecord` from what a run left: a storage root, a log file, or JSONL.

Sources, most to least precise: xrun's metrics JSONL (``runs/<name>/metrics/*.jsonl``,
typed records of :mod:`xrun_contract.records`), ``run.json`` / ``state.json`` (spec,
versions, submit time, transitions), and training logs in MaxText/XPK form (stored log
chunks, or any log file, ``.gz`` too). :class:`StoredRun` reads a run incrementally (each
metrics chunk once) for the live views; :func:`load_run` resolves a user's argument.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gzip
import json
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from orchestrator.background import io_map
from orchestrator.readers.cursor import AttemptCursor
from orchestrator.readers.logparse import READ_CHARS, LogParser
from orchestrator.readers.record import RunRecord, _maybe_json, format_params
from orchestrator.readers.seen import SeenKeys
from xrun_contract import (
    ATTEMPT_RE,
    METRICS_CHUNK_RE,
    METRICS_ROLLUP_EVERY,
    TERMINAL_STATES,
    UNKNOWN,
    Env,
    Layout,
    check_run_name,
    records,
)
from xrun_contract.errors import XrunError
from xrun_contract.storage import Storage, file_kind, open_storage, read_chunks

ALLOWED = "; give a run name, a run path <root>/runs/<name>, or a log or metrics file"

# ---------------------------------------------------------------------------------------
# JSONL metrics and run.json


def apply_metric(rec: RunRecord, r: records.Record) -> None:
    """Fold one typed metrics record (:mod:`xrun_contract.records`) into the run record."""
    attempt = r.attempt
    t = r.time
    if isinstance(r, records.Step):
        rec.steps.append(
            r.step, r.seconds, r.tflops_per_device, r.tokens_per_s_per_device, r.loss,
            blocked=r.checkpoint_blocked_s, time=t if t is not None else math.nan,
            attempt=attempt, total_weights=r.total_weights,
            idle=r.idle_s if r.idle_s is not None else math.nan,
        )
        if r.quick:
            rec.quick_steps.add((attempt, r.step))
        if r.idle_s is not None:
            rec.idle_recorded = True
        for name in ("grad_norm", "learning_rate"):
            value = getattr(r, name)
            if value is not None and math.isfinite(value):
                rec.add_extra(name, r.step, float(value))
    elif isinstance(r, records.Header):
        rec.set_versions(r.versions)
        if rec.config is None and r.config is not None:
            rec.config = _maybe_json(r.config)
        if r.total_steps is not None:
            rec.total_steps = r.total_steps
        if rec.start_time is None and t is not None:
            rec.start_time = t
    elif isinstance(r, records.Params):
        rec.params = float(r.params)
        rec.params_text = format_params(rec.params)
        rec.params_exact = True
    elif isinstance(r, records.Flops):
        rec.flops = {"tflops_per_step": r.tflops_per_step, "learnable_pct": r.learnable_pct,
                     "attention_pct": r.attention_pct, "tflops_per_device": r.tflops_per_device}
    elif isinstance(r, records.Memory):
        rec.set_memory(r.used_gb, r.total_gb, r.pct, r.device)
    elif isinstance(r, records.Checkpoint):
        # xrun's workload times a step before its save: the step record's
        # checkpoint_blocked_s marks it, no later step absorbs the stall.
        rec.add_checkpoint(r.event, r.step, r.seconds, attempt, t, previous=r.previous,
                           error=r.error, process=r.process)
    elif isinstance(r, records.Phase):
        rec.phases.append({"phase": r.phase, "activity": r.activity, "seconds": r.seconds,
                           "step": r.step, "time": t, "attempt": attempt, "began": r.began,
                           "source": r.source})
        rec.phase = {"phase": r.phase, "activity": r.activity, "step": r.step,
                     "seconds": r.seconds, "attempt": attempt, "time": t}
        if rec.start_time is None and t is not None:
            rec.start_time = t - r.seconds  # the process start the phases count from
    elif isinstance(r, records.End):
        if r.exit_code is not None:
            rec.exit_code = r.exit_code
        rec.end_reason = r.reason
        if r.failure:
            rec.failure = {"kind": r.failure, "why": r.reason, "code": r.exit_code}
        if t is not None:
            rec.end_time = max(rec.end_time or 0.0, t)


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
        if not (isinstance(obj, dict) and "kind" in obj):
            bad += 1
            continue
        typed = records.parse(obj)
        if typed is not None:  # a kind this reader does not know yet is skipped, not bad
            apply_metric(rec, typed)
    return bad


def apply_run_json(rec: RunRecord, run: dict[str, Any]) -> None:
    """run.json: spec (name, accelerator, branch, commit, image), submit time, workload."""
    rec.run_info = run
    spec = run.get("spec") or {}
    rec.spec = spec
    rec.name = rec.name or str(run.get("name") or spec.get("name") or "")
    env = spec.get("env") or {}
    rec.branch = str(spec.get("branch") or env.get(Env.BRANCH) or rec.branch or "")
    rec.commit = str(spec.get("commit") or env.get(Env.COMMIT) or rec.commit or "")
    rec.image = str(spec.get("image") or rec.image or "")
    code = run.get("code")
    rec.code = code if isinstance(code, dict) else {}
    _label_from_code(rec, spec)
    rec.accelerator = str(spec.get("accelerator") or rec.accelerator or "")
    if isinstance(run.get("submitted_at"), int | float):
        rec.submitted_at = float(run["submitted_at"])
    wl = run.get("workload") or {}
    if not isinstance(wl, dict):
        return
    rec.set_versions(wl.get("versions") or {})
    if wl.get("config") is not None:
        rec.config = wl["config"]
        steps = wl["config"].get("steps") if isinstance(wl["config"], dict) else None
        if isinstance(steps, int) and rec.total_steps is None:
            rec.total_steps = steps
    if wl.get("accelerator") and not rec.accelerator:
        rec.accelerator = str(wl["accelerator"])
    for key in ("start_time", "end_time"):
        if isinstance(wl.get(key), int | float):
            setattr(rec, key, float(wl[key]))
    if isinstance(wl.get("exit_code"), int):
        rec.exit_code = wl["exit_code"]
    if isinstance(wl.get("profile"), dict):
        rec.profile = wl["profile"]


def _label_from_code(rec: RunRecord, spec: dict[str, Any]) -> None:
    """A run that shipped a working tree ran that tree's code: its branch and commit (the
    tree's git; the label adds "-dirty" for uncommitted changes) name it, not the image's or the
    checkout's the submit came from. The spec's branch stays only for the same commit (a
    nightly's detached worktree of that branch)."""
    git = (rec.code or {}).get("git") or {}
    commit = str(git.get("commit") or "") if isinstance(git, dict) else ""
    if not commit:
        return
    spec_commit = str(spec.get("commit") or "")
    same = bool(spec_commit) and (commit.startswith(spec_commit) or spec_commit.startswith(commit))
    rec.branch = str(git.get("branch") or (rec.branch if same else ""))
    rec.commit = commit


def apply_state(rec: RunRecord, state: dict[str, Any]) -> None:
    rec.state_info = state
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


# Bounds on a log or metrics file given to compare/report: what no training log holds, so
# a wrong file (a disk image, a compression bomb) is refused in one line, not parsed for
# minutes. Logs compress 5-30x; a line glued by a log shipper is a few MiB at most.
MAX_LINE_BYTES = 16 << 20  # bytes without a newline
MAX_GZIP_RATIO = 200  # decompressed / compressed, checked past GZIP_RATIO_FLOOR
GZIP_RATIO_FLOOR = 32 << 20
NUL_SHARE = 0.1  # of a piece: binary data, not text


class _Bounds:
    """Checks each piece read from ``path`` against the bounds above (exit 2 naming why)."""

    def __init__(self, path: Path):
        self.path, self.read, self.line = path, 0, 0
        self.compressed = path.stat().st_size if path.suffix == ".gz" else 0

    def check(self, piece: bytes) -> None:
        at = self.read
        self.read += len(piece)
        cut = piece.rfind(b"\n")
        self.line = len(piece) - cut - 1 if cut >= 0 else self.line + len(piece)
        if piece.count(b"\0") > NUL_SHARE * len(piece):
            self._refuse(f"holds binary data (NUL bytes) near byte {at:,}: not a text log or metrics file")
        if self.line > MAX_LINE_BYTES:
            self._refuse(f"has a line over {MAX_LINE_BYTES >> 20} MiB long (at byte {self.read:,}): "
                         "not a text log or metrics file")
        if self.compressed and self.read > GZIP_RATIO_FLOOR and self.read > MAX_GZIP_RATIO * self.compressed:
            self._refuse(f"decompresses to over {MAX_GZIP_RATIO} times its {self.compressed:,} bytes: "
                         "not a compressed log")

    def _refuse(self, why: str) -> None:
        raise XrunError(f"{self.path}: {why}")


def iter_file_bytes(path: Path) -> Iterator[bytes]:
    """A file's bytes in bounded pieces (gunzipped when it ends in .gz), within the bounds."""
    bounds = _Bounds(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        while data := f.read(READ_CHARS):
            bounds.check(data)
            yield data


def iter_file_text(path: Path) -> Iterator[str]:
    """A file's text in bounded pieces (gzip when it ends in .gz); bad bytes replaced."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for data in iter_file_bytes(path):
        if piece := decoder.decode(data):
            yield piece
    if tail := decoder.decode(b"", final=True):
        yield tail


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
    for data in iter_file_bytes(path):  # the parser takes bytes: it decodes only what it reads
        parser.feed(data)
    return parser.finish()


def _looks_like_jsonl(path: Path) -> bool:
    if path.name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        return True
    try:
        first = next(iter_file_text(path), "")[:4096].lstrip()
    except (OSError, EOFError, XrunError):  # the reading proper says why
        return False
    line = first.split("\n", 1)[0]
    if not line.startswith("{"):
        return False
    try:
        return "kind" in json.loads(line)
    except json.JSONDecodeError:
        return False


# A stored JSON record as ``Storage.read_record`` reads it: (object, why it is corrupt).
Record = tuple[dict[str, Any] | None, str | None]
Records = tuple[Record, Record]  # run.json's, state.json's


class StoredRun:
    """A run under a storage root, read incrementally: each metrics chunk is read once.

    ``poll`` re-reads the small run.json and state.json and folds new metrics chunks into
    one :class:`RunRecord`, so a live view (``xrun submit --follow``, ``logs -f``) and a
    one-shot read (``status``, ``compare``) build the very same record.
    """

    def __init__(self, storage: Storage, name: str, charts: bool = True):
        """``charts=False``: a live view's record, without the per-step figures only charts
        read (``RunRecord.charts``)."""
        self.storage, self.name = storage, name
        self.rec = RunRecord(name=name, source=storage.url(Layout.run(name)), kind="storage", charts=charts)
        self._seen = SeenKeys()  # bounded: a range per writer, not a name per chunk
        self._cursor = AttemptCursor()  # each poll lists the chunks from the last one read
        self.listed = 0  # metrics objects the last poll listed (what its listing cost)
        self.bad_lines = 0
        self.found = False  # run.json or state.json exists

    def poll(self, metrics: bool = True, records: Records | None = None) -> RunRecord:
        """``records``: run.json and state.json as ``Storage.read_record`` gave them, read
        already by the caller (``status`` reads them first to know whom to ask), so that
        they are not read twice."""
        run_read, state_read = records or (None, None)
        run = self._record(Layout.run_json(self.name), run_read)
        state = self._record(Layout.state(self.name), state_read)
        if run:
            apply_run_json(self.rec, run)
        if metrics:
            self._poll_metrics()
        if state:
            apply_state(self.rec, state)
        self.found = self.found or run is not None or state is not None or bool(self.rec.problems)
        if self.rec.problems:
            mark_unknown(self.rec)
        return self.rec

    def _poll_metrics(self) -> None:
        """The metrics chunks listed from the last one read (``AttemptCursor``: new chunks
        and new attempts sort after it), each new one read and folded once, in key order."""
        folder = Layout.metrics(self.name)
        self._cursor.begin()
        objects = self.storage.list_from(folder, self._cursor.start(f"{folder}/attempt-", "-"))
        self.listed = len(objects)
        new = [o.key for o in objects if o.key not in self._seen]
        if not self._seen and len(new) > METRICS_ROLLUP_EVERY:
            new = self._with_rollups(new)
        # Fetched together (a long run has a chunk per 2 s), folded in key order.
        for key, data in zip(new, _read_many(self.storage, new), strict=True):
            if data is None:
                continue
            self._mark(key)
            self.bad_lines += read_jsonl_lines(
                self.rec, data.decode("utf-8", errors="replace").splitlines())
        self._cursor.end()

    def _mark(self, key: str) -> None:
        self._seen.add(key)
        m = METRICS_CHUNK_RE.search(key)
        if m and "/metrics/" in key:  # a rollup (metrics-rollup/) is not a chunk of the folder
            self._cursor.read(int(m[1]), int(m[2]))

    def _with_rollups(self, keys: list[str]) -> list[str]:
        """The objects to read for every record of ``keys`` (all metrics chunks, in order):
        each writer's latest rollup in place of the chunks it covers (those are marked
        seen, unread). A run of an hour is then a rollup or two and the chunks since."""
        objects, _ = self.storage.list(Layout.metrics_rollups(self.name))
        best: dict[tuple[int, str], tuple[int, str]] = {}
        for o in objects:
            m = METRICS_CHUNK_RE.search(o.key)
            if m and m[3]:
                k = (int(m[1]), m[3])
                if k not in best or int(m[2]) > best[k][0]:
                    best[k] = (int(m[2]), o.key)
        if not best:
            return keys
        out: list[tuple[tuple[int, int, int], str]] = []
        placed: set[tuple[int, str]] = set()
        for key in keys:
            m = METRICS_CHUNK_RE.search(key)
            if not m:
                out.append(((1 << 30, 0, 0), key))
                continue
            attempt, seq, tag = int(m[1]), int(m[2]), m[3] or ""
            rollup = best.get((attempt, tag))
            if rollup is not None and seq <= rollup[0]:
                self._mark(key)
                if (attempt, tag) not in placed:  # where its first chunk was
                    placed.add((attempt, tag))
                    out.append(((attempt, seq, 0), rollup[1]))
                continue
            out.append(((attempt, seq, 1), key))
        out.sort(key=lambda x: x[0])
        return [k for _, k in out]

    def _record(self, key: str, read: Record | None = None) -> dict[str, Any] | None:
        """run.json or state.json, checked: a corrupt one is a problem of the record (its
        state becomes UNKNOWN) until a later poll reads it whole."""
        obj, why = read if read is not None else self.storage.read_record(key)
        problem = f"{self.storage.url(key)} is corrupt ({why})" if why else None
        self.rec.problems = [p for p in self.rec.problems if not p.startswith(f"{self.storage.url(key)} ")]
        if problem:
            self.rec.problems.append(problem)
        return obj


def _read_many(storage: Storage, keys: list[str]) -> list[bytes | None]:
    """The objects' contents, in order; several at once when there are several."""
    return list(io_map(storage.read_bytes, keys))


def record_problems(storage: Storage, name: str) -> list[str]:
    """'<file> is corrupt (<why>)' for each of the run's run.json and state.json that exists
    but is not a whole JSON object (what status, list, logs and checkpoints all report)."""
    out = []
    for key in (Layout.run_json(name), Layout.state(name)):
        _obj, why = storage.read_record(key)
        if why:
            out.append(f"{storage.url(key)} is corrupt ({why})")
    return out


def corrupt_line(name: str, problem: str) -> str:
    """The one warning line status, logs and checkpoints give for a corrupt record."""
    return f"run {name}: {problem}: state {UNKNOWN}"


def mark_unknown(rec: RunRecord) -> None:
    """A run with a corrupt stored record: state UNKNOWN, the reason and the file as its
    message (a state.json read earlier, or the metrics' end record, is not trusted)."""
    rec.state = UNKNOWN
    rec.state_info = {**rec.state_info, "message": "; ".join(rec.problems)}


def read_stored_run(storage: Storage, name: str, metrics: bool = True,
                    records: Records | None = None) -> RunRecord:
    """A run under a storage root: run.json, state.json, metrics; logs when metrics lack
    steps. ``metrics=False`` reads only the two small JSON files (``xrun list``);
    ``records``: those two as the caller read them (:meth:`StoredRun.poll`)."""
    reader = StoredRun(storage, name)
    rec = reader.poll(metrics=metrics, records=records)
    if reader.bad_lines:
        rec.notes.append(f"{reader.bad_lines} metrics lines were not valid JSON records; skipped")
    found_logs = False
    if metrics and rec.steps.count == 0:
        found_logs = _read_stored_logs(storage, name, rec)
        if rec.state_info:
            apply_state(rec, rec.state_info)
        if rec.problems:
            mark_unknown(rec)
    if not reader.found and rec.steps.count == 0 and not found_logs:
        raise XrunError(f"run: nothing stored for {name!r} under {storage.root}")
    if rec.process_id is None and rec.kind == "storage" and rec.versions.get("process_id") is None:
        rec.process_id = 0  # metrics and the fallback log are process 0's
    if metrics:
        from orchestrator.readers.profile import with_top_ops

        rec.profile = with_top_ops(storage, name, rec.profile)
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
            parser.feed(strip_stamps(data))
    out = parser.finish()
    if out.steps.count:
        rec.notes.append(f"no step metrics stored: read from host {host}'s log")
    return True


# The storage copy's line stamps (``xrun_contract.stamp_line``), found after each newline:
# a pattern that begins with a literal is searched at memchr speed, not tried at every byte.
_STAMP = rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?Z "
_STAMP_AT_START = re.compile(_STAMP)
_STAMP_AFTER_NEWLINE = re.compile(rb"\n" + _STAMP)


def strip_stamps(data: bytes) -> bytes:
    """A stored log chunk without its line stamps (unstamped lines are kept as they are)."""
    m = _STAMP_AT_START.match(data)
    if m:
        data = data[m.end():]
    return _STAMP_AFTER_NEWLINE.sub(b"\n", data)


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


def roots_holding(name: str, root: str = "", most: int = 200) -> list[str]:
    """Local storage roots near here that hold run ``name`` (the current folder and its
    subfolders, e.g. a nightly's ``./xrun-nightly``), as a --storage value; never ``root``.
    A bounded look (``most`` folders), for the hint of a name not found."""
    here = Path(".")
    try:
        folders = [here] + sorted(p for p in here.iterdir() if p.is_dir() and not p.name.startswith("."))[:most]
    except OSError:
        return []
    mine = Path(root).resolve() if root and not root.startswith("gs://") else None
    found = []
    for folder in folders:
        with contextlib.suppress(OSError):
            run = folder / Layout.RUNS / name
            if ((run / "run.json").is_file() or (run / "state.json").is_file()) and folder.resolve() != mine:
                found.append("." if folder == here else f"./{folder.name}")
    return found


def elsewhere_hint(name: str, root: str = "") -> str:
    """'; it is under ./xrun-nightly: add --storage ./xrun-nightly' ('' when no root near
    here holds it)."""
    found = roots_holding(name, root)
    if not found:
        return ""
    return f"; it is under {found[0]}: add --storage {found[0]}"


def load_run(arg: str, storage_root: str | None = None, what: str = "run") -> RunRecord:
    """A run name (under ``storage_root``), a storage path ``.../runs/<name>``, or a log file.

    ``what`` names the argument in errors (BASE, CANDIDATE).
    """
    if not arg or not arg.strip():
        raise XrunError(f"{what}: empty; give a run name, a storage path .../runs/<name>, or a log file")
    try:
        if arg.startswith("gs://"):
            parts = split_storage_path(arg)
            if parts is None:
                raise XrunError(f"{what}: {arg!r} is not a run path like gs://bucket/prefix/runs/<name>")
            check_run_name(parts[1], what)
            return _checked(read_stored_run(open_storage(parts[0]), parts[1]), what, arg)
        path = Path(arg).expanduser()
        if path.is_file():
            try:
                rec = read_log_file(path)
            except OSError as e:
                raise XrunError(f"{what}: cannot read {arg}: {e.strerror or e}") from None
            return _checked(rec, what, arg)
        if path.is_dir():
            if not any((path / n).exists() for n in ("run.json", "state.json", "metrics", "logs")):
                raise XrunError(f"{what}: folder {arg} is not a run (no run.json, state.json, metrics/ or logs/)")
            root = path.resolve().parent
            if root.name == Layout.RUNS:
                root = root.parent
                return _checked(read_stored_run(open_storage(str(root)), path.resolve().name), what, arg)
            rec = read_stored_run(_FolderRun(path), path.resolve().name)
            rec.source = str(path)
            return _checked(rec, what, arg)
        if path.exists():  # a device, FIFO or socket: reading it would never end or block
            kind = file_kind(path.stat().st_mode)
            raise XrunError(f"{what}: {arg} is {kind}, not a regular file" if kind.startswith("a ")
                            else f"{what}: {arg} is not a regular file or a run folder")
        if "/" in arg or arg.endswith((".log", ".txt", ".jsonl", ".gz")):
            raise XrunError(f"{what}: no such file or folder: {arg}{ALLOWED}")
        if storage_root is None:
            raise XrunError(f"{what}: {arg!r} is not a file; give --storage to read run names")
        check_run_name(arg, what)
        storage = open_storage(storage_root)
        if (storage.read_record(Layout.run_json(arg)) == (None, None)
                and storage.read_record(Layout.state(arg)) == (None, None)):
            hint = elsewhere_hint(arg, storage.root) or " (see 'xrun list'), and no such file"
            raise XrunError(f"{what}: no run named {arg!r} under {storage.root}{hint}")
        return _checked(read_stored_run(storage, arg), what, arg)
    except XrunError:
        raise
    except (OSError, ValueError) as e:
        raise XrunError(f"{what}: cannot read {arg}: {e}") from None


def _checked(rec: RunRecord, what: str, arg: str) -> RunRecord:
    """A source with nothing recognisable is bad input, not an empty run."""
    if rec.kind != "storage" and rec.steps.count == 0 and not rec.versions and rec.exit_code is None:
        raise XrunError(f"{what}: {arg} has no training lines (no 'completed step:', 'xrun header' "
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
