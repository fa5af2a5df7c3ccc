"""The run lifecycle as services: render, submit, observe, status, list, checkpoints, delete.

The CLI and ``nightly`` both call these; nothing here prints or parses flags. Every
failure is an :class:`~xrun_contract.errors.XrunError` carrying its exit code. Whatever
the backend, its view of a run is recorded into ``state.json`` the same way
(:func:`observe`), so status, list and reports read a run from storage alone after the
pods, the processes or the JobSet are gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import os
import re
import shlex
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from orchestrator import settings
from orchestrator.backends.base import Backend, BackendStatus
from orchestrator.background import Background
from orchestrator.readers import figures
from orchestrator.readers.checkpoints import CheckpointInfo, list_checkpoints
from orchestrator.readers.figures import stall
from orchestrator.readers.loaders import StoredRun, apply_state, corrupt_line, read_stored_run
from orchestrator.readers.record import RunRecord
from orchestrator.readers.view import run_view
from orchestrator.services import code
from orchestrator.services.code import PackOptions
from orchestrator.workdir import Packed
from xrun_contract import (
    DELETED,
    FAILED,
    PENDING,
    RUN_NAME_RE,
    SUCCEEDED,
    XRUN_VERSION,
    Env,
    Layout,
    check_run_name,
    is_terminal,
    summary,
    writer_id,
)
from xrun_contract.errors import EXIT_UNREACHABLE, EXIT_USAGE, XrunError
from xrun_contract.k8s import Labels
from xrun_contract.storage import Storage, StorageError, open_storage

if TYPE_CHECKING:  # the manifests are imported where a run is rendered or submitted, not
    # by every command (``xrun status`` needs none of them)
    from manifests.spec import RunSpec


class _ManifestDumper(yaml.SafeDumper):
    """Block style, except that lists of plain numbers (exit codes) stay on one line."""


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = bool(data) and all(isinstance(v, int) and not isinstance(v, bool) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_ManifestDumper.add_representer(list, _represent_list)


def dump_yaml(obj: Any) -> str:
    """Manifests and views as YAML people can review (keys in rendering order)."""
    return yaml.dump(obj, Dumper=_ManifestDumper, sort_keys=False, default_flow_style=False, width=100)


# ---------------------------------------------------------------------------------------
# Backends


def backend_for(kind: str, storage_root: str, context: str = "", namespace: str | None = None) -> Backend:
    """The backend a run was (or is to be) submitted to; no namespace means the kubeconfig
    context's (as kubectl)."""
    if kind == "kube":
        from orchestrator.backends.kube.backend import KubeBackend

        return KubeBackend(context or None, namespace or None)
    from orchestrator.backends.local import LocalBackend

    return LocalBackend(storage_root)


def backend_for_spec(spec: RunSpec) -> Backend:
    return backend_for(spec.backend_name, spec.storage, spec.context, spec.namespace)


def run_info(storage: Storage, name: str) -> dict[str, Any]:
    """run.json of a stored run; a name with nothing stored is bad input, and a name that is
    not a run name (a path, '..') is refused before any key is built from it."""
    check_run_name(name)
    run, run_problem = _read_record(storage, Layout.run_json(name))
    if run is None and not run_problem and _read_record(storage, Layout.state(name)) == (None, None):
        close = difflib.get_close_matches(name, _run_names(storage), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else "see 'xrun list'"
        where = root_hint(storage)
        raise XrunError(f"run: no run named {name!r} under {storage.root}; {hint}" + (f" ({where})" if where else ""))
    return run or {}


def _run_names(storage: Storage) -> list[str]:
    """The names of the run folders under the root (one delimiter listing)."""
    try:
        _, prefixes = storage.list(Layout.RUNS)
    except StorageError:
        return []
    return [n for p in prefixes if RUN_NAME_RE.fullmatch(n := p.rstrip("/").rsplit("/", 1)[-1])]


def root_hint(storage: Storage) -> str:
    """Why a root holds no runs, when it looks like a mistake: it is itself a run's folder
    or a ``runs`` folder (a root given a level or two too deep), or it does not exist (a
    local folder). '' when nothing suggests a better root."""
    try:
        if storage.exists_object("run.json"):
            return f"{storage.root} is a run's folder; its storage root is {_parent(storage.root, 2)}"
        _, prefixes = storage.list("")
        for p in prefixes[:20]:
            if storage.exists_object(f"{p.rstrip('/')}/run.json"):
                return f"{storage.root} holds run folders itself; did you mean --storage {_parent(storage.root, 1)}?"
    except StorageError:
        return ""
    if not storage.root.startswith("gs://") and not os.path.isdir(storage.root):
        return f"{storage.root} does not exist"
    return ""


def _parent(root: str, levels: int) -> str:
    for _ in range(levels):
        head, _sep, _tail = root.rstrip("/").rpartition("/")
        root = head if head and not head.endswith(":/") else root
    return root


def backend_of(storage: Storage, name: str, context: str | None = None,
               namespace: str | None = None) -> Backend:
    """The backend a stored run was submitted to (context/namespace as recorded unless given)."""
    return _backend_for_run(run_info(storage, name), storage, context, namespace)


def _backend_for_run(run: dict[str, Any], storage: Storage, context: str | None,
                     namespace: str | None) -> Backend:
    kind = run.get("backend", "local")
    ctx = context if context is not None else run.get("context", "")
    ns = namespace or run.get("namespace") or None
    return backend_for(kind, storage.root, ctx, ns)


_T = TypeVar("_T")


def _reading(storage: Storage, key: str, read: Callable[[str], _T]) -> _T:
    try:
        return read(key)
    except XrunError:
        raise
    except Exception as e:  # noqa: BLE001 - any client error here means storage is unreachable
        raise XrunError(f"storage: cannot read {storage.url(key)}: {e}", EXIT_UNREACHABLE) from None


def _read_record(storage: Storage, key: str) -> tuple[dict[str, Any] | None, str | None]:
    return _reading(storage, key, storage.read_record)


def _read(storage: Storage, key: str) -> dict[str, Any] | None:
    return _reading(storage, key, storage.read_json)


# ---------------------------------------------------------------------------------------
# State, recorded the same way for every backend


def _says(state: dict[str, Any], status: BackendStatus) -> bool:
    """Whether state.json ``state`` records ``status`` already. Restarts only grow: a view
    rebuilt after the JobSet is gone (from its events) may know fewer."""
    restarts = max(status.restarts, int(state.get("restarts") or 0))
    return state.get("state") == status.state and state.get("restarts", 0) == restarts


def record_state(storage: Storage, name: str, status: BackendStatus, backend: str,
                 recorded: dict[str, Any] | None = None) -> None:
    """Append a transition to state.json when the run's state or restart count changed.
    ``recorded``: state.json as read moments ago; when it says this state already, nothing
    is read again (one GET less for every ``status``).

    The local supervisor writes state.json itself, so for it this only ever records what
    the supervisor cannot: that it is gone. For a cluster run it is how storage learns how
    the run ended, before the JobSet's TTL deletes it.
    """
    if recorded is not None and _says(recorded, status):
        return
    current = storage.read_json(Layout.state(name)) or {"backend": backend, "transitions": []}
    if _says(current, status):
        return
    now = time.time()
    restarts = max(status.restarts, int(current.get("restarts") or 0))
    current.update(state=status.state, restarts=restarts, message=status.message, updated=now)
    if status.hosts and backend != "local":
        current["hosts"] = {h.host: {k: v for k, v in h.as_dict().items() if k != "host"}
                            for h in status.hosts}
    current.setdefault("transitions", []).append({"time": now, "state": status.state,
                                                  "reason": status.message})
    try:
        storage.write_json(Layout.state(name), current)
        summary.write_state(storage, name, current)  # what list reads, right after what status reads
    except StorageError as e:
        if e.permanent:  # a full disk: the reader still shows the truth, unrecorded
            return
        raise


def observe(storage: Storage, name: str, backend: Backend, warn: Any = None,
            asked: Callable[[], BackendStatus | None] | None = None,
            recorded: dict[str, Any] | None = None) -> BackendStatus | None:
    """The backend's live view of a run, recorded into state.json; None when the backend
    has no such run or cannot be asked (``warn`` hears why; storage then speaks).
    ``asked``: the backend's answer, asked for already (``status`` asks in a thread);
    ``recorded``: state.json as the caller read it moments ago (``record_state``)."""
    try:
        status = asked() if asked is not None else backend.status(name)
    except XrunError as e:
        if warn:
            warn(f"{backend.name} backend: {e}; showing what storage says")
        return None
    if status is not None:
        record_state(storage, name, status, backend.name, recorded)
    return status


# ---------------------------------------------------------------------------------------
# Render and submit


def render(spec: RunSpec, pack: PackOptions | None = None) -> dict[str, Any]:
    """The JobSet for ``spec``, admitted offline as the cluster would admit it; a ``workdir``
    is packed (nothing uploaded) so the manifest names its archive."""
    spec, _ = code.prepare(spec, pack)
    return _render(spec)


def _render(spec: RunSpec) -> dict[str, Any]:
    from manifests.jobset import jobset

    check_workload_args(spec)
    manifest = jobset(spec)
    admit(manifest)
    from manifests import limits

    limits.check(manifest, set(spec.env))  # E2BIG and etcd's request limit: exit 2, not a crash loop
    return manifest


def render_for_submit(spec: RunSpec) -> dict[str, Any]:
    """:func:`render`, and what only a submission needs: a cluster run's ``xrun_image``, when
    set, must be pullable by its nodes (``render`` alone prints the manifest for any image)."""
    from manifests.spec import check_cluster_xrun_image

    check_cluster_xrun_image(spec)
    return _render(spec)


def admit(manifest: dict[str, Any]) -> None:
    """JobSet webhook and API-server rules (``manifests.admission``) before anything is sent."""
    try:
        from manifests import admission
    except ImportError:  # pragma: no cover - the admission module arrives with its issue
        return
    try:
        admission.check(admission.default(manifest))
    except admission.AdmissionError as e:
        raise XrunError(f"manifest rejected: {e}", EXIT_USAGE) from None


SHELL_OPERATORS = {"&&", "||", ";", "|", "&", ";;", "(", ")"}


def workload_train_args(command: str) -> list[str] | None:
    """The arguments of ``python3 -m workload.train ...`` when the command runs xrun's own
    workload directly (the first simple command), else None: another program, or arguments
    the shell will expand ($VAR, globs) that cannot be known here."""
    try:
        lex = shlex.shlex(command, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        tokens = list(lex)
    except ValueError:
        return None
    while tokens and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0]):
        tokens = tokens[1:]  # VAR=value prefixes
    if tokens[:1] == ["exec"]:
        tokens = tokens[1:]
    if len(tokens) < 3 or not re.fullmatch(r"(.*/)?python3?(\.\d+)?", tokens[0]):
        return None
    flags = tokens[1:tokens.index("-m")] if "-m" in tokens else None
    if flags is None or any(not f.startswith("-") for f in flags):
        return None
    i = tokens.index("-m")
    if tokens[i + 1:i + 2] != ["workload.train"]:
        return None
    args: list[str] = []
    for t in tokens[i + 2:]:
        if t in SHELL_OPERATORS:
            break
        args.append(t)
    if any(c in a for a in args for c in "$`*?["):
        return None
    return args


def check_workload_args(spec: RunSpec) -> None:
    """xrun's workload's arguments checked here (workload.config is jax-free), so a run that
    would fail at once is never written or started: exit 2 naming the field."""
    args = workload_train_args(spec.command)
    if args is None:
        return
    from workload.config import check_command_args

    devices = spec.slices * spec.hosts_per_slice * spec.shape.devices_per_vm
    try:
        check_command_args(args, devices)
    except ValueError as e:
        raise XrunError(f"command: {e}", EXIT_USAGE) from None


@dataclass
class Submitted:
    spec: RunSpec
    manifest: dict[str, Any]
    storage: Storage
    backend: Backend
    packed: Packed | None = None  # the shipped working tree, when the spec has a workdir
    uploaded: bool = False  # whether this submit uploaded its archive (False: already stored)
    notes: list[str] = field(default_factory=list)  # what was read from the cluster (the queue found)
    warnings: list[str] = field(default_factory=list)  # what could not be checked there

    @property
    def url(self) -> str:
        return self.storage.url(Layout.run(self.spec.name))


def submit(spec: RunSpec, *, replace: bool = False, force: bool = False,
           pack: PackOptions | None = None) -> Submitted:
    """Write manifest.yaml and run.json under the run's folder, then hand the manifest to the
    backend. ``replace`` removes an earlier run of the same name first (its stored data and
    checkpoints with it), and only once that run is over as its backend and state.json say
    and no process of it lives; ``force`` replaces a live one too, stopping it first, and
    submits a cluster run no node pool can hold (``services.cluster.check_capacity``).

    Exclusive per name: run.json is created atomically (``Storage.create_exclusive``: O_EXCL
    locally, ifGenerationMatch=0 on GCS), so of racing submits exactly one starts.

    A ``workdir`` is packed first (bad input: exit 2, nothing written) and its archive
    uploaded before run.json, only when absent (``code.upload``)."""
    spec, packed = code.prepare(spec, pack)
    manifest = render_for_submit(spec)  # bad input: exit 2 before the cluster is asked anything
    backend = backend_for_spec(spec)
    notes: list[str] = []
    warnings: list[str] = []
    if spec.backend_name == "kube":
        found, notes, warnings = _from_cluster(spec, backend, force)
        if found != spec:  # the queue or the networks read from the cluster
            spec, manifest = found, render_for_submit(found)
    storage = _open(spec.storage)
    _preflight(backend)
    with code.leased(storage, spec.code_sha256):  # gc and purge leave the archive alone
        record, uploaded = store_run(storage, spec, packed,
                                     lambda: _make_room(storage, spec, backend, replace, force))
    try:  # run.json first: the run is traceable even if the cluster rejects it
        storage.write_text(Layout.manifest(spec.name), dump_yaml(manifest))
    except XrunError:
        raise
    except Exception as e:  # noqa: BLE001
        raise XrunError(f"storage: cannot write to {storage.root}: {e}", EXIT_UNREACHABLE) from None
    backend.submit(manifest, replace=replace)
    resolved = getattr(backend, "namespace", "") if spec.backend_name == "kube" else ""
    if resolved and resolved != spec.namespace:  # the context's namespace: status/logs/delete go there
        storage.write_json(Layout.run_json(spec.name), {**record, "namespace": resolved})
    return Submitted(spec, manifest, storage, backend, packed, uploaded, notes, warnings)


def store_run(storage: Storage, spec: RunSpec, packed: Packed | None,
              make_room: Callable[[], None]) -> tuple[dict[str, Any], bool]:
    """Submit's storage part, under a lease on the spec's archive (``code.leased``): the
    archive (uploaded unless there), run.json (exclusive; ``make_room`` when the name is
    taken) and its summary, then ``code.settle``. Returns run.json's record and whether
    this call uploaded the archive."""
    from orchestrator.services import podcode

    uploaded = False
    podcode.upload(storage, spec)  # xrun's pod code (no xrun_image), once per xrun version
    if packed is not None:
        uploaded = code.upload(storage, packed)
    elif spec.code_sha256:
        code.check_uploaded(storage, spec.code_sha256)
    record = {
        "name": spec.name, "spec": spec.to_dict(), "submitted_at": time.time(),
        "backend": spec.backend_name, "context": spec.context, "namespace": spec.namespace,
        "xrun_version": XRUN_VERSION, "storage": storage.root, "submit_id": writer_id(),
    }
    if packed is not None:
        record["code"] = {**packed.record(), "uploaded": uploaded}
    elif spec.code_sha256:
        record["code"] = {"sha256": spec.code_sha256}
    data = (json.dumps(record, indent=2, sort_keys=True, default=str) + "\n").encode()
    if not _create(storage, Layout.run_json(spec.name), data):
        make_room()
        if not _create(storage, Layout.run_json(spec.name), data):
            raise XrunError(f"name: another submit of {spec.name!r} won the race under "
                            f"{storage.root}; choose another name")
    with contextlib.suppress(XrunError):  # without it the run lists the old way (reads)
        summary.write_run(storage, spec.name, {
            "name": spec.name, "backend": spec.backend_name, "accelerator": spec.accelerator,
            "submitted_at": record["submitted_at"], "labels": run_labels(spec.to_dict(), spec.name)})
    code.settle(storage, spec.code_sha256, packed)  # a gc or purge deciding on it: its archive is back
    return record, uploaded


def _from_cluster(spec: RunSpec, backend: Backend, force: bool) -> tuple[RunSpec, list[str], list[str]]:
    """The queue found and the capacity checked (``services.cluster``), before anything is
    written or created; ``force`` submits a shape no node pool holds (auto-provisioning)."""
    from orchestrator.backends.kube.backend import KubeBackend
    from orchestrator.services import cluster

    if not isinstance(backend, KubeBackend):
        return spec, [], []
    try:
        found = cluster.resolve_queue(spec, backend)
        nets = cluster.resolve_networks(found.spec, backend)
        found.spec = nets.spec
        found.notes += nets.notes
        found.warnings += nets.warnings
        if not force:
            problem = cluster.check_capacity(found.spec, backend)
            if problem:
                found.warnings.append(problem)
    except XrunError as e:
        if e.exit_code != EXIT_UNREACHABLE:
            raise
        return spec, [], []  # the steps below say the cluster is unreachable, where they always did
    return found.spec, found.notes, found.warnings


def resume(storage_root: str, name: str, spec: RunSpec | None = None,
           pack: PackOptions | None = None) -> Submitted:
    """Continue the ended run ``name`` from its last committed checkpoint, keeping its
    stored history (state.json's transitions, metrics, logs and checkpoints of every
    earlier attempt).

    ``spec`` (the user's flags or run file) replaces the stored one; None reuses the spec
    run.json recorded (its shipped tree by sha256: nothing is packed again). Its pods count
    their restart attempts on from the last one stored (``XRUN_ATTEMPT_BASE``), so nothing an
    earlier attempt wrote is overwritten or fenced out, and the workload restores the newest
    committed checkpoint as after any restart. A live run is refused (exit 2), as is a name
    with nothing stored; the run's backend is the one it was submitted to."""
    check_run_name(name)
    if spec is not None and spec.name != name:
        raise XrunError(f"--resume: the given spec (run file or --name) names {spec.name!r}, not {name!r}")
    storage = _open(spec.storage if spec is not None else storage_root)
    run = run_info(storage, name)  # nothing stored: exit 2
    if not run.get("spec"):
        raise XrunError(f"--resume: the run.json of run {name!r} under {storage.root} records no spec; "
                        "it cannot be resumed (--replace starts it over)")
    recorded = run.get("backend", "local")
    if spec is None:
        from manifests.spec import build_spec

        # The archive is by sha; the root is the one named now (a moved or copied root: its
        # pods must write here, never recreate the root the run was first submitted to).
        stored = {k: v for k, v in run["spec"].items() if k not in ("workdir", "storage")}
        spec = build_spec(stored, {}, storage_default=storage.root)
    elif spec.storage != storage.root:
        spec = dataclasses.replace(spec, storage=storage.root)
    if spec.backend_name != recorded:
        raise XrunError(f"--resume: run {name!r} ran on the {recorded} backend, not {spec.backend_name}; "
                        "resume it where it ran")
    spec, packed = code.prepare(spec, pack)
    backend = backend_of(storage, name, spec.context if recorded == "kube" else None,
                         spec.namespace or None)
    with _resuming(storage, name):
        return _resume(storage, name, run, spec, packed, backend)


def _resume(storage: Storage, name: str, run: dict[str, Any], spec: RunSpec, packed: Packed | None,
            backend: Backend) -> Submitted:
    """:func:`resume`'s steps, under the run's resume lock."""
    _check_over(storage, name, backend)
    base = _next_attempt(storage, name, run)
    manifest = with_attempt_base(render_for_submit(spec), base)
    _preflight(backend)
    from orchestrator.services import podcode

    podcode.upload(storage, spec)
    if packed is not None:
        code.upload(storage, packed)
    elif spec.code_sha256:
        code.check_uploaded(storage, spec.code_sha256)
    now = time.time()
    record = {**run, "spec": spec.to_dict(), "backend": spec.backend_name, "context": spec.context,
              "storage": storage.root,
              "namespace": spec.namespace or run.get("namespace", ""),
              "resumed": [*(run.get("resumed") or []), {"time": now, "attempt": base}]}
    if packed is not None:
        record["code"] = {**packed.record(), "uploaded": True}
    elif spec.code_sha256:
        record["code"] = {**(run.get("code") or {}), "sha256": spec.code_sha256}
    try:
        storage.write_json(Layout.run_json(name), record)
        storage.write_text(Layout.manifest(name), dump_yaml(manifest))
        if spec.backend_name != "local":  # the local supervisor records its own resumption
            _record_resumed(storage, name, base, backend.name)
    except XrunError:
        raise
    except Exception as e:  # noqa: BLE001
        raise XrunError(f"storage: cannot write to {storage.root}: {e}", EXIT_UNREACHABLE) from None
    backend.submit(manifest, replace=True)  # a cluster's ended JobSet of this name goes first
    return Submitted(spec, manifest, storage, backend, packed, False)


RESUME_LOCK_STALE_S = 900.0  # a resume lock this old was left by a resume that died


@contextlib.contextmanager
def _resuming(storage: Storage, name: str) -> Iterator[None]:
    """Resuming is exclusive per name, as submitting is: a lock object created exclusively
    (O_EXCL locally, ifGenerationMatch=0 on GCS) from before the run is checked to be over
    until its new attempt is started (the backend then says it is live), so of two
    concurrent resumes one starts and the other is refused. A lock left by a resume that
    died (its process gone on this machine, or older than RESUME_LOCK_STALE_S) is taken over."""
    key = Layout.resume_lock(name)
    mine = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(), "id": writer_id()}
    data = json.dumps(mine).encode()
    if not _create(storage, key, data):
        held, _ = _read_record(storage, key)
        if not _stale_lock(held or {}):
            held = held or {}
            since = time.time() - held["time"] if isinstance(held.get("time"), int | float) else None
            who = (f" (pid {held.get('pid')} on {held.get('host')}"
                   + (f", {since:.0f}s ago" if since is not None else "") + ")") if held.get("pid") else ""
            raise XrunError(f"--resume: another resume of run {name!r} is under way{who}; "
                            f"see 'xrun status {name}' once it has started")
        with contextlib.suppress(XrunError):
            storage.delete_object(key)
        if not _create(storage, key, data):
            raise XrunError(f"--resume: another resume of run {name!r} is under way; "
                            f"see 'xrun status {name}' once it has started")
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            storage.delete_object(key)


def _stale_lock(held: dict[str, Any]) -> bool:
    """Whether a resume lock was left by a resume that is gone: its process, when it ran on
    this machine, or its age; an unreadable lock counts by age alone (here: stale)."""
    at = held.get("time")
    if not isinstance(at, int | float) or time.time() - at > RESUME_LOCK_STALE_S:
        return True
    pid = held.get("pid")
    if held.get("host") == socket.gethostname() and isinstance(pid, int) and not isinstance(pid, bool):
        from orchestrator.backends.local.backend import _pid_alive

        return not _pid_alive(pid)
    return False


def _check_over(storage: Storage, name: str, backend: Backend) -> None:
    """A run resumes only once over: its backend says it ended (or has no such run) and, on
    this machine, no process of it lives; a lost local supervisor's leftovers are cleared."""
    live = backend.status(name)
    if live is not None and not is_terminal(live.state):
        raise XrunError(f"--resume: run {name!r} is {live.state}; only an ended run resumes: "
                        f"wait for it to end or 'xrun delete {name}' first")
    procs = getattr(backend, "live_processes", None)
    pids = procs(name) if procs else []
    if pids:
        raise XrunError(f"--resume: run {name!r} still has {len(pids)} live process(es) "
                        f"(pids {', '.join(map(str, pids[:8]))}); 'xrun delete {name}' first")
    if procs:  # nothing live: removes the pod folders a lost supervisor left, records Failed
        backend.delete(name, wait=True)
        with contextlib.suppress(XrunError):
            observe(storage, name, backend)


def _next_attempt(storage: Storage, name: str, run: dict[str, Any]) -> int:
    """One past every attempt the run's storage shows (state.json, run.json's workload,
    metrics chunks, log folders, earlier resumptions): the resumed pods' first attempt."""
    from xrun_contract import ATTEMPT_RE

    seen = [0]
    state = _read(storage, Layout.state(name)) or {}
    for value in (state.get("attempt"), (run.get("workload") or {}).get("attempt")):
        if isinstance(value, int) and not isinstance(value, bool):
            seen.append(value)
    last = [r.get("attempt") for r in run.get("resumed") or [] if isinstance(r, dict)]
    base = max([a for a in last if isinstance(a, int)] or [0])
    restarts = state.get("restarts")
    if isinstance(restarts, int) and not isinstance(restarts, bool):
        seen.append(base + restarts)
    objects, _ = _reading(storage, Layout.metrics(name), storage.list)
    seen += [int(m.group(1)) for o in objects if (m := ATTEMPT_RE.search(o.key.rsplit("/", 1)[-1]))]
    _, hosts = _reading(storage, Layout.logs(name), storage.list)
    for host in hosts:
        _, attempts = _reading(storage, host, storage.list)
        seen += [int(m.group(1)) for a in attempts if (m := ATTEMPT_RE.fullmatch(a.rstrip("/").rsplit("/", 1)[-1]))]
    return max(seen) + 1


def with_attempt_base(manifest: dict[str, Any], base: int) -> dict[str, Any]:
    """The manifest with ``XRUN_ATTEMPT_BASE=base`` beside every container's restart attempt
    (the workload's and the log shipper's), so a resumed run's attempts count on."""
    for rj in manifest["spec"]["replicatedJobs"]:
        pod = rj["template"]["spec"]["template"]["spec"]
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            env = c.get("env") or []
            if any(e.get("name") == Env.RESTART_ATTEMPT for e in env):
                c["env"] = [e for e in env if e.get("name") != Env.ATTEMPT_BASE] + [
                    {"name": Env.ATTEMPT_BASE, "value": str(base)}]
    return manifest


def _record_resumed(storage: Storage, name: str, base: int, backend: str) -> None:
    """state.json says the run is pending again, after every transition it had."""
    current = _read(storage, Layout.state(name)) or {"backend": backend, "transitions": []}
    now = time.time()
    why = f"resumed (xrun submit --resume): attempt {base}"
    current.update(state=PENDING, message=why, updated=now)
    current.setdefault("transitions", []).append({"time": now, "state": PENDING, "reason": why})
    current["resumed"] = [*(current.get("resumed") or []), {"time": now, "attempt": base}]
    storage.write_json(Layout.state(name), current)


def _preflight(backend: Backend) -> None:
    """A cluster that answers but cannot run xrun's pods (no native sidecars) is refused
    before anything is written, so the name stays free for a retry after an upgrade. One
    that does not answer is left to the steps below, which say so where they always did."""
    check = getattr(backend, "check_native_sidecars", None)
    if check is None:
        return
    try:
        check()
    except XrunError as e:
        if e.exit_code != EXIT_UNREACHABLE:
            raise


def _create(storage: Storage, key: str, data: bytes) -> bool:
    try:
        return storage.create_exclusive(key, data)
    except XrunError:
        raise
    except Exception as e:  # noqa: BLE001 - a local folder we cannot write
        raise XrunError(f"storage: cannot write to {storage.root}: {e}", EXIT_UNREACHABLE) from None


def _make_room(storage: Storage, spec: RunSpec, backend: Backend, replace: bool,
               force: bool) -> None:
    """A run of this name exists: refuse unless ``replace``, the old run is over
    (:func:`_retire`) and no process of it lives (the OS's view, not only state.json's)."""
    if not replace:
        live = observe(storage, spec.name, backend) if spec.backend_name == "local" else None
        if live is not None and not is_terminal(live.state):
            raise XrunError(f"name: run {spec.name!r} is {live.state}; choose another name or "
                            f"'xrun delete {spec.name}'")
        raise XrunError(f"name: run {spec.name!r} already exists under {storage.root}; "
                        "use --replace or another name")
    _retire(storage, spec, force)
    procs = getattr(backend, "live_processes", None)
    pids = procs(spec.name) if procs else []
    if pids and force:  # orphans of a dead supervisor: --force stops them too
        backend.delete(spec.name, wait=True)
        pids = procs(spec.name) if procs else []
    if pids:
        raise XrunError(f"name: run {spec.name!r} still has {len(pids)} live process(es) "
                        f"(pids {', '.join(map(str, pids[:8]))}); 'xrun delete {spec.name}' first")
    if procs:  # nothing live: a local delete only removes what a lost supervisor left (pod folders)
        backend.delete(spec.name, wait=True)
    purge_run(storage, spec.name)


def _retire(storage: Storage, spec: RunSpec, force: bool) -> None:
    """Make sure the stored run ``spec.name`` is over before --replace removes its data.

    Asks the backend the run was submitted to (run.json's backend, context and namespace):
    no such run there (finished and removed, e.g. by the JobSet's TTL) or a terminal state is
    over. A live run is refused unless ``force``, which stops it first (its pods would go on
    writing checkpoints into the replacement's folder). When the backend cannot be asked,
    state.json decides: a recorded terminal state is over, anything else is refused (exit 3)."""
    name = spec.name
    recorded = (_read(storage, Layout.state(name)) or {}).get("state", "")
    try:
        old = backend_of(storage, name)
    except XrunError:
        old = backend_for_spec(spec)
    try:
        live = old.status(name)
    except XrunError as e:
        if is_terminal(recorded):
            return
        raise XrunError(f"name: cannot tell whether run {name!r} is over ({e}); --replace removes its "
                        "checkpoints only once it is: retry when the cluster answers", e.exit_code) from None
    if live is None or is_terminal(live.state):
        return
    record_state(storage, name, live, old.name)
    if not force:
        raise XrunError(f"name: run {name!r} is {live.state} on the {old.name} backend; --replace would delete "
                        f"its checkpoints: wait for it to end, 'xrun delete {name}', or add --force")
    old.delete(name, wait=True)


def _open(root: str) -> Storage:
    try:
        return open_storage(root)
    except ValueError as e:
        raise XrunError(f"storage: {e}", EXIT_USAGE) from None


# ---------------------------------------------------------------------------------------
# Reading runs


def status(storage: Storage, name: str, context: str | None = None,
           namespace: str | None = None, warn: Any = None) -> dict[str, Any]:
    """Everything known about a run (the dict ``xrun status -o json`` prints). A cluster
    run whose state.json says it succeeded or failed is over: its backend is not asked (no
    JobSet or pod listing); ``record_state`` recorded its hosts when it ended. (A local
    run's backend is asked: it is cheap, and only it knows what a lost supervisor left.)

    A cluster is asked in a thread while storage is read (metrics, checkpoints): the API
    server's answer (a LIST of every pod: 37 MB at 1,024 pods) and storage's come in
    together rather than one after the other; so do run.json and state.json, and the
    metrics and the checkpoints. ``warn`` hears each corrupt record of the run."""
    check_run_name(name)
    state_read = Background(_read_record, storage, Layout.state(name))  # beside run.json's
    run_read = _read_record(storage, Layout.run_json(name))
    records = (run_read, state_read.result())
    (run, run_problem), (recorded, state_problem) = records
    if run is None and not run_problem and recorded is None and not state_problem:
        run_info(storage, name)  # no such run: the message every command gives
    backend = _backend_for_run(run or {}, storage, context, namespace)
    recorded = recorded or {}
    hosts = recorded.get("hosts") or {}
    ended = (backend.name != "local" and not (run_problem or state_problem)
             and recorded.get("state") in (SUCCEEDED, FAILED)
             and all((h or {}).get("state") not in ("Running", "Pending") for h in hosts.values()))
    asking = None if ended or backend.name == "local" else Background(backend.status, name)
    listing = Background(list_checkpoints, storage, name)
    rec = read_stored_run(storage, name, records=records)
    checkpoints = listing.result()
    if warn is not None:
        for problem in rec.problems:
            warn(corrupt_line(name, problem))
    if ended:
        live = None
    elif asking is None:
        live = observe(storage, name, backend, warn, recorded=recorded)
    else:
        live = observe(storage, name, backend, warn, asked=asking.result, recorded=recorded)
    if live is not None and not _says(recorded, live):
        state = _read(storage, Layout.state(name))  # observe recorded the change: its transition
        if state is not None:
            apply_state(rec, state)
    return run_view(storage, rec, live, checkpoints=checkpoints, stall_floor=settings.stall_floor())


STALLED = "Stalled"  # wait's and the nightly's outcome for a run that stopped making progress


@dataclass
class WaitOutcome:
    state: str  # a terminal state, or STALLED
    stall: dict[str, Any] | None = None  # figures.stall's finding when STALLED


def wait(storage: Storage, name: str, timeout_s: float | None = None, context: str | None = None,
         namespace: str | None = None, warn: Any = None, poll_seconds: float = 1.0) -> WaitOutcome | None:
    """The run's end state once it ended, STALLED once it stopped making progress
    (``figures.stall``: it is left running), or None when ``timeout_s`` passed first.

    The backend is asked every ``poll_seconds``; the run's metrics (for the stall check)
    are read every tenth of the stall floor, 1 to 10 s, so an hours-long wait lists a
    long run's metrics a few times a minute, not every second."""
    run_info(storage, name)  # no such run: exit 2 at once
    floor = settings.stall_floor()
    metrics_every = max(poll_seconds, min(10.0, floor / 10))
    backend = backend_of(storage, name, context, namespace)
    reader = StoredRun(storage, name)
    metrics_at = -float("inf")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    procs = getattr(backend, "live_processes", None)
    lingering = False  # said once: the run ended, but processes of it still live
    while True:
        live = observe(storage, name, backend, warn)
        due = time.monotonic() - metrics_at >= metrics_every
        rec: RunRecord | None = None
        if due or live is None:
            try:
                rec = reader.poll(metrics=due)
                metrics_at = time.monotonic() if due else metrics_at
            except XrunError:
                if live is None:  # neither answers: exit 3
                    raise
                # the backend still knows the state; the stall check waits for storage
        state = live.state if live is not None else (rec.state if rec is not None else "") or ""
        pids = procs(name) if procs is not None and is_terminal(state) else []
        if is_terminal(state) and not pids:
            return WaitOutcome(state)
        if pids and not lingering and warn:
            lingering = True  # the end is not said while any process of the run lives
            warn(f"run {name} is recorded {state}, but {len(pids)} process(es) of it still live "
                 f"(pids {', '.join(map(str, pids[:8]))}); waiting for them to end ('xrun delete {name}' stops them)")
        found = None if pids or rec is None or not due else stall(
            rec, state, live.restarts if live is not None else rec.restarts, time.time(), floor)
        if found is not None:
            return WaitOutcome(STALLED, found)
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(poll_seconds if deadline is None else max(0.0, min(poll_seconds, deadline - time.monotonic())))


def live_view(reader: StoredRun, backend: Backend, warn: Any = None) -> dict[str, Any]:
    """One refresh of a followed run: the backend's view, then storage's (incrementally)."""
    live = observe(reader.storage, reader.name, backend, warn)
    return run_view(reader.storage, reader.poll(), live, stall_floor=settings.stall_floor())


# kubectl -l syntax, equality-based (apimachinery labels/selector.go Parse): key=value,
# key==value, key!=value, key (exists), !key (absent), comma-separated and ANDed.
_REQUIREMENT = re.compile(r"^(?P<neg>!)?(?P<key>[A-Za-z0-9][-A-Za-z0-9_./]*)(?:(?P<op>==|=|!=)(?P<value>[-A-Za-z0-9_.]*))?$")


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


def run_labels(spec: dict[str, Any], name: str) -> dict[str, str]:
    """The labels a run carries (its JobSet's and pods'): xrun's run label, the Kueue queue
    and priority, and the run file's pod_labels."""
    out = {Labels.RUN: name, **(spec.get("pod_labels") or {})}
    if spec.get("queue"):
        out[Labels.QUEUE_NAME] = spec["queue"]
    if spec.get("kueue_priority"):
        out[Labels.KUEUE_PRIORITY] = spec["kueue_priority"]
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


LIST_THREADS = 8  # below the storage client's connection pool (10)


def list_runs(storage: Storage, cluster: Backend | None = None,
              where: RunFilter | None = None) -> list[dict[str, Any]]:
    """Every run under the root, newest first; with ``cluster`` its JobSets are merged in.

    One listing of ``runs/`` and one of ``summaries/`` (``xrun_contract.summary``) serve
    every run that keeps a summary; a run without one (written by an older xrun) is read
    as before: run.json, state.json and its newest metrics chunks."""
    _, prefixes = storage.list(Layout.RUNS)
    names = [n for p in prefixes if RUN_NAME_RE.fullmatch(n := p.rsplit("/", 1)[-1])]
    summaries = summary.read_all(storage)

    def read(name: str) -> dict[str, Any] | None:
        s = summaries.get(name)
        if s is not None and s.run is not None:
            return _summary_row(storage, s)
        try:
            rec = read_stored_run(storage, name, metrics=False)
        except XrunError:
            return None  # a folder with nothing of a run in it
        _latest_steps(storage, rec)
        return _record_row(rec)

    # Runs without a summary take a few small reads each, independent: in parallel (1,000
    # runs one after the other is 5,000 round trips in a row).
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(LIST_THREADS) as pool:
        rows = [r for r in pool.map(read, names) if r is not None]
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
    runs.sort(key=lambda r: r.get("submitted_at") or 0, reverse=True)
    if where is not None and not where.empty:
        now = time.time()
        runs = [r for r in runs if matches(r, where, now)]
    return runs


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
