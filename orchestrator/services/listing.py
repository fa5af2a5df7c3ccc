"""Many runs at once and their end: ``list`` (with kubectl-style filters), checkpoints,
``delete`` and ``purge``.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.backends.base import Backend, BackendStatus
from orchestrator.background import io_map
from orchestrator.readers import figures
from orchestrator.readers.checkpoints import CheckpointInfo, list_checkpoints
from orchestrator.readers.loaders import read_stored_run
from orchestrator.readers.record import RunRecord
from orchestrator.services import code
from orchestrator.services.runcore import (
    _read_record,
    backend_for,
    backend_of,
    observe,
    record_state,
    run_info,
    run_labels,
)
from xrun_contract import (
    DELETED,
    FAILED,
    RUN_NAME_RE,
    SUCCEEDED,
    Layout,
    check_run_name,
    is_terminal,
    summary,
)
from xrun_contract.errors import EXIT_USAGE, XrunError
from xrun_contract.storage import Storage

# kubectl -l syntax, equality-based (apimachinery labels/selector.go Parse): key=value,
# key==value, key!=value, key (exists), !key (absent), comma-separated and ANDed.
_REQUIREMENT = re.compile(r"^(?P<neg>!)?(?P<key>[A-Za-z0-9][-A-Za-z0-9_./]*)"
                          r"(?:(?P<op>==|=|!=)(?P<value>[-A-Za-z0-9_.]*))?$")


@dataclass
class RunFilter:
    """``xrun list`` / ``xrun delete`` filters, like ``kubectl get -l`` and xpk's filters."""

    selector: list[tuple[str, str, str]]  # (key, op, value); op in =, !=, exists, !exists
    states: tuple[str, ...] = ()
    older_than: float | None = None  # seconds since submission
    newer_than: float | None = None

    @property
    def empty(self) -> bool:
        return not (self.selector or self.states or self.older_than is not None or self.newer_than is not None)


def parse_selector(text: str) -> list[tuple[str, str, str]]:
    out = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        m = _REQUIREMENT.match(part)
        if not m or (m["neg"] and m["op"]):
            raise XrunError(f"--selector: {part!r} is not key=value, key!=value, key or !key", EXIT_USAGE)
        op = ("!exists" if m["neg"] else "exists") if not m["op"] else ("!=" if m["op"] == "!=" else "=")
        out.append((m["key"], op, m["value"] or ""))
    return out




def matches(run: dict[str, Any], f: RunFilter, now: float) -> bool:
    labels = run.get("labels") or {}
    for key, op, value in f.selector:
        if (op == "exists" and key not in labels) or (op == "!exists" and key in labels):
            return False
        if (op == "=" and labels.get(key) != value) or (op == "!=" and labels.get(key) == value):
            return False
    if f.states and run.get("state") not in f.states:
        return False
    submitted = run.get("submitted_at")
    age = now - submitted if isinstance(submitted, int | float) else None
    if f.older_than is not None and (age is None or age < f.older_than):
        return False
    return not (f.newer_than is not None and (age is None or age > f.newer_than))


def list_runs(storage: Storage, cluster: Backend | None = None,
              where: RunFilter | None = None, warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every run under the root, newest first; with ``cluster`` its JobSets are merged in.
    A cluster run that storage says is live is asked of its own cluster (``_ask_clusters``)
    before the filters, so ``--state`` matches what ``status`` would say.

    One listing of ``runs/`` and one of ``summaries/`` (``xrun_contract.summary``) serve
    every run that keeps a summary; a run without one (written by an older xrun) is read
    as before: run.json, state.json and its newest metrics chunks."""
    _, prefixes = storage.list(Layout.RUNS)
    names = [n for p in prefixes if RUN_NAME_RE.fullmatch(n := p.rsplit("/", 1)[-1])]
    summaries = summary.read_all(storage)

    # A folder root costs nothing to read: there a run.json or state.json that is corrupt
    # (truncated, not JSON) lists as Unknown with its warning, as status shows it, whatever
    # the summary kept. On GCS the listing alone serves (its requests do not grow with runs).
    local_root = not storage.root.startswith("gs://")

    def corrupt(name: str) -> bool:
        return local_root and any(_read_record(storage, key)[1] for key in (Layout.run_json(name), Layout.state(name)))

    def read(name: str) -> dict[str, Any] | None:
        s = summaries.get(name)
        if s is not None and s.run is not None and not corrupt(name):
            return _summary_row(storage, s)
        try:
            rec = read_stored_run(storage, name, metrics=False)
        except XrunError:
            return None  # a folder with nothing of a run in it
        _latest_steps(storage, rec)
        return _record_row(rec)

    # Runs without a summary take a few small reads each, independent: in parallel (1,000
    # runs one after the other is 5,000 round trips in a row).
    rows = [r for r in io_map(read, names) if r is not None]
    runs = []
    local: Backend | None = None  # made once, for the first live local run
    for row in rows:
        if row["backend"] in ("local", "") and not is_terminal(row["state"]) and "message" not in row:
            # As status sees it: a supervisor killed with -9 left state.json saying Running;
            # the local backend knows it is gone (Failed). list only reads (status records).
            with contextlib.suppress(XrunError):
                local = local or backend_for("local", storage.root)
                live = local.status(row["name"])
                if live is not None:
                    row["state"] = live.state
        runs.append(row)
    if cluster is not None:
        by_name = {r["name"]: r for r in runs}
        for item in cluster.list():
            if item["name"] in by_name:
                by_name[item["name"]]["state"] = item.get("state") or by_name[item["name"]]["state"]
                by_name[item["name"]]["in_cluster"] = True
            else:
                runs.append({"name": item["name"], "state": item.get("state", ""), "backend": "kube",
                             "accelerator": "", "submitted_at": item.get("created"),
                             "restarts": item.get("restarts", 0), "in_cluster": True,
                             "labels": item.get("labels") or {}})
    _ask_clusters(storage, [r for r in runs if r["backend"] == "kube" and not r.get("in_cluster")
                            and not is_terminal(r["state"])], warn)
    runs.sort(key=lambda r: r.get("submitted_at") or 0, reverse=True)
    if where is not None and not where.empty:
        now = time.time()
        runs = [r for r in runs if matches(r, where, now)]
    return runs


def _ask_clusters(storage: Storage, rows: list[dict[str, Any]], warn: Callable[[str], None] | None) -> None:
    """The live state of cluster runs storage calls live (Pending or Running as last
    recorded), one JobSet and one pod LIST per context and namespace, as the run was
    submitted: storage lags (state.json is written when someone follows the run), and list
    showed Pending, and ``delete --state Pending`` stopped, runs whose pods ran. A cluster
    that cannot be asked leaves storage's word, said once; a JobSet that is gone too (the
    run's end is in its events: ``status`` reads them)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        try:
            run = run_info(storage, row["name"])
        except XrunError:
            continue
        groups.setdefault((str(run.get("context") or ""), str(run.get("namespace") or "")), []).append(row)
    for (context, namespace), members in groups.items():
        try:
            live = {item["name"]: item for item in backend_for("kube", storage.root, context, namespace).list()}
        except XrunError as e:
            if warn:
                warn(f"cluster {context or '(current context)'}: {e}; {len(members)} run(s) show what storage says")
            continue
        for row in members:
            item = live.get(row["name"])
            if item is not None:
                row["state"], row["in_cluster"] = item.get("state") or row["state"], True


def _record_row(r: RunRecord) -> dict[str, Any]:
    """A list row from run.json, state.json and the newest metrics (a run with no summary)."""
    state = r.state or ("Pending" if r.run_info else "Unknown")
    fig = figures.progress(r, state)
    return {
        "name": r.name,
        "state": state,
        "backend": r.run_info.get("backend", ""),
        "accelerator": r.spec.get("accelerator", ""),
        "submitted_at": r.submitted_at,
        "restarts": r.restarts,
        "step": fig["step"],
        "total_steps": r.total_steps,
        "loss": fig["loss"],
        "labels": run_labels(r.spec, r.name),
        **({"message": "; ".join(r.problems)} if r.problems else {}),
    }


def _summary_row(storage: Storage, s: summary.RunSummary) -> dict[str, Any]:
    """A list row from a run's summary parts: no read. A run that ran but has no metrics
    part (a workload that keeps none: another program, an older image) reads its newest
    metrics chunks as before."""
    run, st = s.run or {}, s.state
    state = str(st.get("state") or "Pending")
    fig = s.figures()
    if not s.has_metrics and state != "Pending":
        rec = RunRecord(name=s.name)
        _latest_steps(storage, rec)
        steps = figures.progress(rec, state)
        fig = {"step": steps["step"], "loss": steps["loss"], "total_steps": rec.total_steps}
    return {
        "name": s.name,
        "state": state,
        "backend": str(run.get("backend") or "local"),
        "accelerator": str(run.get("accelerator") or ""),
        "submitted_at": run.get("submitted_at"),
        "restarts": int(st.get("restarts") or 0),
        "step": fig["step"],
        "total_steps": fig["total_steps"],
        "loss": fig["loss"],
        "labels": dict(run.get("labels") or {}),
    }


_STEP_RECORD = re.compile(r'"kind":\s*"step"')


def _latest_steps(storage: Storage, rec: RunRecord) -> None:
    """Fold the first metrics chunk (the header: total steps, unless run.json has them from
    the workload) and the newest chunks back to the last one holding a step (the latest step
    and loss; a run's last chunk often holds only its end record) into ``rec``: a few reads
    per run however long it trained."""
    from orchestrator.readers.loaders import read_jsonl_lines

    objects, _ = storage.list(Layout.metrics(rec.name))
    keys = sorted(o.key for o in objects)
    tail: list[list[str]] = []
    for key in reversed(keys[1:]):
        lines = _chunk_lines(storage, key)
        tail.append(lines)
        if any(_STEP_RECORD.search(ln) for ln in lines):
            break
    stepped = any(_STEP_RECORD.search(ln) for lines in tail for ln in lines)
    head = keys[:1] if rec.total_steps is None or not stepped else []
    for lines in [_chunk_lines(storage, k) for k in head] + tail[::-1]:
        read_jsonl_lines(rec, lines)


def _chunk_lines(storage: Storage, key: str) -> list[str]:
    data = storage.read_bytes(key)
    return [] if data is None else data.decode("utf-8", errors="replace").splitlines()


def checkpoints(storage: Storage, name: str, sizes: bool = False) -> list[CheckpointInfo]:
    run_info(storage, name)  # checks the name
    return list_checkpoints(storage, name, sizes=sizes)


# ---------------------------------------------------------------------------------------
# Stopping


@dataclass
class Deleted:
    stopped: bool
    purged: int | None = None
    url: str = ""
    found: str = ""  # what the backend found, in words (local: processes, supervisor)
    code_removed: str = ""  # the sha256 of the archive purged with the run


def delete(storage: Storage, name: str, *, purge: bool = False, wait: bool = True) -> Deleted:
    """Stop a live run (recording ``Deleted`` unless it had already ended); ``purge`` also
    removes everything stored under the run's folder."""
    check_run_name(name)
    backend = backend_of(storage, name)
    stopped = backend.delete(name, wait=wait)
    recorded = storage.read_json(Layout.state(name)) or {}
    if stopped and recorded.get("state") not in (SUCCEEDED, FAILED, DELETED):
        record_state(storage, name, BackendStatus(state=DELETED, restarts=recorded.get("restarts", 0),
                                                  message="deleted by xrun delete"), backend.name)
    elif not stopped:  # nothing live: record what the backend sees (a lost supervisor: Failed)
        with contextlib.suppress(XrunError):
            observe(storage, name, backend)
    out = Deleted(stopped, url=storage.url(Layout.run(name)), found=str(getattr(backend, "found", "") or ""))
    if purge:
        sha = ((storage.read_json(Layout.run_json(name)) or {}).get("spec") or {}).get("code_sha256", "")
        out.purged = purge_run(storage, name)
        # Its shipped tree too, unless another run still names it.
        out.code_removed = sha if sha and code.release(storage, name, sha) else ""
    return out


def purge_run(storage: Storage, name: str) -> int:
    """Remove a run's stored data: its summary first, then its folder (run.json last:
    ``Storage.delete_prefix``), so a new submit of the name, which can only begin once
    run.json is gone, writes nothing this removes."""
    storage.delete_prefix(Layout.summaries(name))
    return storage.delete_prefix(Layout.run(name))


def stop(backend: Backend, name: str) -> bool:
    """Ctrl-C's 'stop' answer: delete and wait for the hosts to be gone."""
    return backend.delete(name, wait=True)

