"""Render, submit and resume a run: the manifest admitted offline, run.json created
exclusively per name, and a resume that is exclusive per name too (``_resuming``) and
writes into the root it is given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shlex
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.backends.base import Backend
from orchestrator.services import code
from orchestrator.services.code import PackOptions
from orchestrator.services.listing import purge_run
from orchestrator.services.runcore import (
    _open,
    _read,
    _read_record,
    _reading,
    backend_for_spec,
    backend_of,
    dump_yaml,
    observe,
    record_state,
    run_info,
    run_labels,
)
from orchestrator.workdir import Packed
from xrun_contract import (
    PENDING,
    XRUN_VERSION,
    Env,
    Layout,
    check_run_name,
    is_terminal,
    summary,
    writer_id,
)
from xrun_contract.errors import EXIT_UNREACHABLE, EXIT_USAGE, XrunError
from xrun_contract.storage import Storage, StorageError

if TYPE_CHECKING:  # the manifests are imported where a run is rendered or submitted, not
    # by every command (``xrun status`` needs none of them)
    from manifests.spec import RunSpec


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
    from manifests.limits import MAX_ARG_STRLEN

    if len(command) > MAX_ARG_STRLEN:  # refused at render (manifests.limits); shlex is quadratic
        return None
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

    devices = spec.slices * spec.hosts_per_slice * spec.shape.jax_devices_per_vm
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


def dry_run(spec: RunSpec, *, force: bool = False,
            pack: PackOptions | None = None) -> tuple[RunSpec, dict[str, Any], list[str], list[str]]:
    """What ``submit`` would send, after the same checks (a cluster run: the queue found or
    checked, the networks, the capacity), with nothing written or created: the manifest
    carries the queue label submit would add. A cluster that cannot be reached leaves the
    spec as given, with a warning saying what went unchecked."""
    spec, _ = code.prepare(spec, pack)
    manifest = render_for_submit(spec)
    notes: list[str] = []
    warnings: list[str] = []
    if spec.backend_name == "kube":
        found, notes, warnings = _from_cluster(spec, backend_for_spec(spec), force, dry=True)
        if found != spec:
            spec, manifest = found, render_for_submit(found)
    return spec, manifest, notes, warnings


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


def _from_cluster(spec: RunSpec, backend: Backend, force: bool,
                  dry: bool = False) -> tuple[RunSpec, list[str], list[str]]:
    """The queue found or checked and the capacity checked (``services.cluster``), before
    anything is written or created; ``force`` submits a shape no node pool holds
    (auto-provisioning). ``dry``: an unreachable cluster is a warning, not silence."""
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
        if dry:
            return spec, [], [f"queue, networks and capacity unchecked: {e}"]
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
    _check_checkpoints(storage, name)
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


def _check_checkpoints(storage: Storage, name: str) -> None:
    """A resume goes on from the run's checkpoints: where their folder is a file, the pods
    could neither read nor write one (they would start over from step 1 and then fail
    at their first save): refused, naming it."""
    key = Layout.checkpoints(name)
    if storage.root.startswith("gs://"):
        blocked = _reading(storage, key, storage.exists_object)
    else:
        path = storage.url(key)
        blocked = os.path.lexists(path) and not os.path.isdir(path)
    if blocked:
        raise XrunError(f"--resume: {storage.url(key)} is a file, not the run's checkpoint folder: "
                        f"run {name!r} cannot go on from a checkpoint; move it aside, or --replace "
                        "starts the run over")


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
        raise XrunError(f"name: run {spec.name!r} already exists under {storage.root}"
                        f"{f' ({live.state})' if live is not None else ''}; "
                        "to run it again: --replace (removes the old run's data) or "
                        f"--name {_free_name(storage, spec.name)}")
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


def _free_name(storage: Storage, name: str) -> str:
    """``name-2``, ``name-3`` ...: the first that no stored run has (a suggestion only: the
    submit with it is still exclusive)."""
    for n in range(2, 100):
        free = f"{name}-{n}"
        with contextlib.suppress(StorageError):
            if storage.read_record(Layout.run_json(free)) == (None, None):
                return free
    return f"{name}-{int(time.time())}"


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
