"""What every run service shares: the backend a run was submitted to, its stored records
read with one error for an unreachable root, and its state recorded into ``state.json``
the same way for every backend (:func:`observe`), so status, list and reports read a run
from storage alone after the pods, the processes or the JobSet are gone.
"""

from __future__ import annotations

import difflib
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from orchestrator.backends.base import Backend, BackendStatus
from orchestrator.readers.loaders import roots_holding
from xrun_contract import (
    RUN_NAME_RE,
    Layout,
    check_run_name,
    summary,
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
        found = roots_holding(name, storage.root)
        if found:
            hint = f"it is under {found[0]}: add --storage {found[0]}"
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




def run_labels(spec: dict[str, Any], name: str) -> dict[str, str]:
    """The labels a run carries (its JobSet's and pods'): xrun's run label, the Kueue queue
    and priority, and the run file's pod_labels."""
    out = {Labels.RUN: name, **(spec.get("pod_labels") or {})}
    if spec.get("queue"):
        out[Labels.QUEUE_NAME] = spec["queue"]
    if spec.get("kueue_priority"):
        out[Labels.KUEUE_PRIORITY] = spec["kueue_priority"]
    return out


def _open(root: str) -> Storage:
    try:
        return open_storage(root)
    except ValueError as e:
        raise XrunError(f"storage: {e}", EXIT_USAGE) from None
