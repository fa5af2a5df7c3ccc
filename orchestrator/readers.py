"""Read runs back from storage alone: state, progress, logs, checkpoints, the run list.

Everything here works after the pods (or the local processes) are gone, from a local folder
or gs://. Listing uses prefix + delimiter and reads only small objects, so a run with
thousands of checkpoints or log chunks stays cheap to inspect.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from xrun_contract import ATTEMPT_RE, PENDING, TERMINAL_STATES, Layout
from xrun_contract.storage import ObjectInfo, Storage

# ---------------------------------------------------------------------------------------
# Metrics


class MetricsReader:
    """Incremental reader of the metrics JSONL chunks (reads each chunk object once)."""

    def __init__(self, storage: Storage, name: str):
        self.storage, self.name = storage, name
        self.seen: set[str] = set()
        self.records: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        objects, _ = self.storage.list(Layout.metrics(self.name))
        new: list[dict[str, Any]] = []
        for o in objects:
            if o.key in self.seen:
                continue
            data = self.storage.read_bytes(o.key)
            if data is None:
                continue
            self.seen.add(o.key)
            for line in data.decode("utf-8", errors="replace").splitlines():
                try:
                    new.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        self.records.extend(new)
        return new


@dataclass
class Progress:
    """What the status screen shows about training, derived from metrics records."""

    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    tokens_per_s: float | None = None  # all devices
    step_seconds: float | None = None  # median of recent steps
    eta_seconds: float | None = None
    attempt: int = 0
    devices: int | None = None


def progress(records: list[dict[str, Any]], run_json: dict[str, Any] | None = None) -> Progress:
    p = Progress()
    steps = [r for r in records if r.get("kind") == "step"]
    config = ((run_json or {}).get("workload") or {}).get("config") or {}
    if isinstance(config.get("steps"), int):
        p.total_steps = config["steps"]
    for r in records:
        if r.get("kind") == "header":
            d = (r.get("versions") or {}).get("global_devices")
            if d:
                with contextlib.suppress(TypeError, ValueError):
                    p.devices = int(d)
            total = r.get("total_steps") or (r.get("config") or {}).get("steps")
            if isinstance(total, int):
                p.total_steps = total
    if steps:
        last = steps[-1]
        p.step, p.loss, p.attempt = last.get("step"), last.get("loss"), last.get("attempt", 0)
        recent = sorted(s.get("seconds", 0.0) for s in steps[-20:])
        p.step_seconds = recent[len(recent) // 2]
        tok = last.get("tokens_per_s_per_device")
        if tok is not None:
            p.tokens_per_s = tok * (p.devices or 1)
        if p.total_steps and p.step is not None and p.step_seconds:
            p.eta_seconds = max(0, p.total_steps - p.step) * p.step_seconds
    return p


# ---------------------------------------------------------------------------------------
# Logs


@dataclass(frozen=True)
class LogChunk:
    host: str
    attempt: int
    key: str
    updated: float


def list_log_chunks(storage: Storage, name: str, hosts: set[str] | None = None) -> list[LogChunk]:
    """All log chunk objects of a run: one listing per host and attempt folder."""
    chunks: list[LogChunk] = []
    _, host_prefixes = storage.list(Layout.logs(name))
    for hp in host_prefixes:
        host = hp.rsplit("/", 1)[-1]
        if hosts and host not in hosts:
            continue
        _, attempt_prefixes = storage.list(hp)
        for ap in attempt_prefixes:
            m = ATTEMPT_RE.search(ap.rsplit("/", 1)[-1])
            if not m:
                continue
            objects, _ = storage.list(ap)
            chunks += [LogChunk(host, int(m[1]), o.key, o.updated) for o in objects]
    # Merge order: attempt, then write time, then host and sequence.
    chunks.sort(key=lambda c: (c.attempt, c.updated, c.host, c.key))
    return chunks


def host_prefix(host: str, attempt: int) -> str:
    return f"[{host}]" if attempt == 0 else f"[{host} #{attempt}]"


class LogFollower:
    """Yields (host, attempt, line) for chunks not yet seen; call ``poll`` repeatedly."""

    def __init__(self, storage: Storage, name: str, hosts: set[str] | None = None,
                 since: float | None = None):
        self.storage, self.name, self.hosts, self.since = storage, name, hosts, since
        self.seen: set[str] = set()

    def poll(self) -> Iterator[tuple[str, int, str]]:
        for c in list_log_chunks(self.storage, self.name, self.hosts):
            if c.key in self.seen:
                continue
            if self.since is not None and c.updated < self.since:
                self.seen.add(c.key)
                continue
            data = self.storage.read_bytes(c.key)
            if data is None:
                continue
            self.seen.add(c.key)
            for line in data.decode("utf-8", errors="replace").splitlines():
                yield c.host, c.attempt, line


def parse_duration(text: str) -> float:
    """'90s', '10m', '2h', '1d' -> seconds."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if not m:
        raise ValueError(f"--since: {text!r} is not a duration like 30s, 10m, 2h or 1d")
    return float(m[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]


# ---------------------------------------------------------------------------------------
# Checkpoints

STEP_DIR = re.compile(r"^(\d+)$")
TMP_DIR = re.compile(r"^(\d+)\.orbax-checkpoint-tmp-\d+$")
CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"
COMMIT_SUCCESS = "commit_success.txt"


@dataclass
class CheckpointInfo:
    step: int
    state: str  # committed | in progress
    written_at: float | None = None  # commit time (unix seconds)
    write_seconds: float | None = None  # init -> commit
    size_bytes: int | None = None
    key: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step, "state": self.state, "written_at": self.written_at,
            "write_seconds": self.write_seconds, "size_bytes": self.size_bytes,
            "age_seconds": (time.time() - self.written_at) if self.written_at else None,
            "path": self.key,
        }


def list_checkpoints(storage: Storage, name: str, sizes: bool = False) -> list[CheckpointInfo]:
    """One delimiter listing of the checkpoints folder, then per step only its top level and
    the small ``_CHECKPOINT_METADATA`` object (``sizes=True`` lists every object: costly)."""
    base = Layout.checkpoints(name)
    _, prefixes = storage.list(base)
    out: list[CheckpointInfo] = []
    for prefix in prefixes:
        leaf = prefix.rsplit("/", 1)[-1]
        tmp = TMP_DIR.match(leaf)
        if tmp:
            out.append(CheckpointInfo(int(tmp[1]), "in progress", key=prefix))
            continue
        m = STEP_DIR.match(leaf)
        if not m:
            continue
        objects, _ = storage.list(prefix)
        names = {o.key.rsplit("/", 1)[-1]: o for o in objects}
        info = CheckpointInfo(int(m[1]), "in progress", key=prefix)
        # Orbax commits a step by atomic rename on file systems (a digits-only folder is
        # final) and by writing commit_success.txt last on GCS, which cannot rename.
        if not storage.root.startswith("gs://") or COMMIT_SUCCESS in names:
            info.state = "committed"
        meta_obj: ObjectInfo | None = names.get(CHECKPOINT_METADATA)
        meta = (storage.read_json(meta_obj.key) or {}) if meta_obj is not None else {}
        init, commit = meta.get("init_timestamp_nsecs"), meta.get("commit_timestamp_nsecs")
        if info.state == "committed":
            info.written_at = commit / 1e9 if commit else (names[COMMIT_SUCCESS].updated
                                                          if COMMIT_SUCCESS in names else None)
            if init and commit:
                info.write_seconds = (commit - init) / 1e9
        if sizes:
            everything, _ = storage.list(prefix, delimiter=None)
            info.size_bytes = sum(o.size for o in everything)
        out.append(info)
    out.sort(key=lambda c: c.step)
    return out


def latest_committed(checkpoints: list[CheckpointInfo]) -> CheckpointInfo | None:
    done = [c for c in checkpoints if c.state == "committed"]
    return done[-1] if done else None


# ---------------------------------------------------------------------------------------
# Runs


def list_runs(storage: Storage) -> list[dict[str, Any]]:
    """Every run under the root, newest first, with its recorded state."""
    _, prefixes = storage.list(Layout.RUNS)
    runs = []
    for p in prefixes:
        name = p.rsplit("/", 1)[-1]
        run = storage.read_json(Layout.run_json(name)) or {}
        state = storage.read_json(Layout.state(name)) or {}
        runs.append({
            "name": name,
            "state": state.get("state", PENDING if run else "Unknown"),
            "backend": run.get("backend", ""),
            "accelerator": (run.get("spec") or {}).get("accelerator", ""),
            "submitted_at": run.get("submitted_at"),
            "restarts": state.get("restarts", 0),
        })
    runs.sort(key=lambda r: r.get("submitted_at") or 0, reverse=True)
    return runs


def is_terminal(state: str) -> bool:
    return state in TERMINAL_STATES
