"""A JobSet and its pods as the API serves them (plain dicts), read into xrun's terms.

Pure functions: which host and restart attempt a pod is, why it is Pending or Failed, the
JobSet's state from its conditions (kubernetes-sigs/jobset ``jobset_types.go``) and the
events that explain a wait. Used by the kube backend and by tests on recorded objects.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import re
import typing
from typing import Any, TypedDict, is_typeddict

from orchestrator.backends.base import HostStatus
from orchestrator.collector import collector_paused
from xrun_contract import DELETED, FAILED, PENDING, RESTARTING, RUNNING, SUCCEEDED, Env, host_id
from xrun_contract.errors import XrunError
from xrun_contract.k8s import Annotations, Conditions, KueueWorkload, Labels, PodPhases

CONTAINER = "workload"  # manifests.jobset.CONTAINER: the user's container
MAX_EVENTS = 6

_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")


class ApiUnavailable(XrunError):
    """The API server could not be reached or answered 5xx: an outage (a restart, an
    upgrade of the control plane) that a follower waits out, unlike a refusal."""


def parse_time(text: str | None) -> tuple[int, int] | None:
    """RFC3339(Nano) -> (unix seconds, nanoseconds), exact enough to order log lines."""
    if not text:
        return None
    m = _TS.match(text)
    if not m:
        return None
    zone = "+00:00" if m[3] == "Z" else m[3]
    base = dt.datetime.fromisoformat(m[1] + zone)
    return int(base.timestamp()), int((m[2] or "0").ljust(9, "0"))


def _epoch(text: str | None) -> float | None:
    t = parse_time(text)
    return None if t is None else t[0] + t[1] / 1e9


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shut_down(responses: list[Any]) -> None:
    """Close streaming responses (watches, followed logs) another thread may be reading:
    ``shutdown`` unblocks a thread waiting in a socket read."""
    for resp in responses:
        with contextlib.suppress(Exception):
            resp.shutdown()
        with contextlib.suppress(Exception):
            resp.release_conn()



def loads(data: bytes | str) -> Any:
    """``json.loads`` of an API answer, with the collector paused: decoding a LIST of
    1,024 pods (18 MB of JSON, 17 KB a pod of which 8 KB managedFields) makes millions of
    dicts, lists and strings, and the collections they set off cost more than the parse
    (0.42 s with the collector, 0.16 s without, on the 2-core machine)."""
    with collector_paused():
        return json.loads(data)


# What xrun reads of a pod (this module's functions, the kube backend's status and the
# follower's watch): the one projection of a pod, however it came (a LIST, a WATCH event).
# Decoded into these (TypedDicts: plain dicts holding only these keys) a pod skips the rest,
# managedFields (8 of 17 KB a pod), the spec's volumes and most of the status. A field read
# from a listed or watched pod must be named here.
class _Meta(TypedDict, total=False):
    name: str | None
    namespace: str | None
    uid: str | None
    labels: dict[str, str] | None
    annotations: dict[str, str] | None
    creationTimestamp: str | None
    deletionTimestamp: str | None
    resourceVersion: str | None  # a watch resumes from it (bookmarks carry only it)


class _EnvVar(TypedDict, total=False):
    name: str | None
    value: str | None


class _Container(TypedDict, total=False):
    name: str | None
    env: list[_EnvVar] | None


class _Spec(TypedDict, total=False):
    containers: list[_Container] | None
    schedulingGates: list[dict[str, Any]] | None
    nodeName: str | None


class _ContainerStatus(TypedDict, total=False):
    name: str | None
    state: dict[str, Any] | None
    restartCount: int | None


class _PodStatus(TypedDict, total=False):
    phase: str | None
    reason: str | None
    message: str | None
    conditions: list[dict[str, Any]] | None
    containerStatuses: list[_ContainerStatus] | None
    initContainerStatuses: list[_ContainerStatus] | None


class _Pod(TypedDict, total=False):
    metadata: _Meta | None
    spec: _Spec | None
    status: _PodStatus | None


class _PodList(TypedDict, total=False):
    metadata: dict[str, Any] | None
    items: list[_Pod] | None


class _PodEvent(TypedDict, total=False):
    type: str | None
    object: _Pod | None


_decoders: dict[type, Any] = {}


@functools.cache
def _fields(shape: type) -> dict[str, Any]:
    return typing.get_type_hints(shape)


def _project(value: Any, hint: Any) -> Any:
    """``value`` with only the keys its TypedDict ``hint`` names (through ``X | None`` and
    ``list[X]``): what msgspec's decode into the same types keeps, for a value already
    decoded (an answer that does not fit the types, read whole)."""
    if is_typeddict(hint):
        if not isinstance(value, dict):
            return value
        return {k: _project(value[k], h) for k, h in _fields(hint).items() if k in value}
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        return [_project(v, item) for v in value] if isinstance(value, list) else value
    for arg in typing.get_args(hint):  # X | None
        if is_typeddict(arg) or typing.get_origin(arg) is list:
            return _project(value, arg)
    return value


def project_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """A whole pod (as ``json.loads`` reads one) as xrun keeps it: ``_Pod``'s fields."""
    return _project(pod, _Pod)


def _lean(data: bytes | str, shape: type, whole: Any) -> Any:
    """``data`` decoded by msgspec into ``shape`` (TypedDicts: unknown fields are skipped,
    not built); ``whole(data)`` projected to ``shape`` without msgspec or for an answer
    that does not fit the types."""
    try:
        import msgspec
    except ImportError:  # pragma: no cover - a dependency; the full decode still works
        return _project(whole(data), shape)
    decoder = _decoders.get(shape)
    if decoder is None:
        decoder = _decoders[shape] = msgspec.json.Decoder(shape)
    try:
        return decoder.decode(data)
    except msgspec.ValidationError:
        return _project(whole(data), shape)


def loads_pods(data: bytes | str) -> Any:
    """A pod LIST's JSON with only the fields of ``_Pod`` in each pod: 1,024 pods (18 MB)
    in 0.04 s, where ``json.loads`` took 0.17 s even with the collector paused. An answer
    that does not fit the types: the whole list as :func:`loads` reads it."""
    with collector_paused():
        return _lean(data, _PodList, loads)


def loads_pod_event(line: bytes | str) -> Any:
    """One line of a pod WATCH (``{"type", "object"}``) with only ``_Pod``'s fields of the
    pod: a JobSet's restart at 1,024 pods is thousands of events of 17 KB in a few seconds,
    decoded in the watch thread while the follow waits to print the change. An ERROR's
    Status (it does not fit a pod) is read whole."""
    event = _lean(line, _PodEvent, json.loads)
    return json.loads(line) if event.get("type") == "ERROR" else event


def pod_host(pod: dict[str, Any]) -> tuple[str, int]:
    """("<slice>-<host>", restart attempt) of a JobSet pod, from its labels and annotations."""
    meta = pod.get("metadata") or {}
    labels, ann = meta.get("labels") or {}, meta.get("annotations") or {}
    slice_index = labels.get(Labels.JOB_GLOBAL_INDEX, labels.get(Labels.JOB_INDEX, "?"))
    host_index = ann.get(Annotations.COMPLETION_INDEX, labels.get(Labels.COMPLETION_INDEX, "?"))
    try:
        attempt = int(labels.get(Labels.RESTART_ATTEMPT, 0))
    except ValueError:
        attempt = 0
    return host_id(slice_index, host_index), attempt


def run_attempt(pod: dict[str, Any]) -> int:
    """The pod's attempt as the run counts them (its stored logs and metrics are filed so):
    the JobSet's restart attempt plus the ``XRUN_ATTEMPT_BASE`` a resumed run's workload
    container carries (``xrun submit --resume``; the JobSet counts from 0 again)."""
    base = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        for e in c.get("env") or []:
            if e.get("name") == Env.ATTEMPT_BASE:
                with contextlib.suppress(ValueError):
                    base = max(base, int(e.get("value") or 0))
    return pod_host(pod)[1] + base


def _container_status(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for cs in statuses:
        if cs.get("name") == CONTAINER:
            return cs
    return statuses[0] if statuses else {}


def container_started(pod: dict[str, Any]) -> bool:
    """True once the workload container has a log to read (running or already exited)."""
    state = _container_status(pod).get("state") or {}
    return bool(state.get("running") or state.get("terminated")) or (
        (pod.get("status") or {}).get("phase") in PodPhases.STARTED
    )


def restart_count(pod: dict[str, Any]) -> int:
    """How often the kubelet restarted the workload container of this pod."""
    try:
        return int(_container_status(pod).get("restartCount") or 0)
    except (TypeError, ValueError):
        return 0


def container_done(pod: dict[str, Any]) -> bool:
    state = _container_status(pod).get("state") or {}
    return bool(state.get("terminated")) or (pod.get("status") or {}).get("phase") in PodPhases.DONE


# Waiting reasons of a container that is on its way (kubelet's ContainerCreating, and the
# PodInitializing every later container shows while an init container has not finished):
# not why a pod is stuck.
STARTING_REASONS = ("ContainerCreating", "PodInitializing")


def init_container_problem(pod: dict[str, Any]) -> str:
    """Why an init container (xrun-init, the xrun-logs native sidecar, a GPU stack's daemon)
    holds the pod, naming it: a waiting reason other than a start (ErrImagePull,
    ImagePullBackOff, CreateContainerConfigError, CrashLoopBackOff of a sidecar...) or a
    plain init container that exited non-zero. "" when none does. The workload container
    meanwhile only says PodInitializing."""
    for cs in (pod.get("status") or {}).get("initContainerStatuses") or []:
        state, name = cs.get("state") or {}, cs.get("name", "?")
        waiting = state.get("waiting") or {}
        if waiting.get("reason") and waiting["reason"] not in STARTING_REASONS:
            return f"{waiting['reason']}: init container {name}" + (
                f": {waiting['message']}" if waiting.get("message") else "")
        done = state.get("terminated") or {}
        if done and done.get("exitCode", 0) != 0:
            return (f"{done.get('reason') or 'Error'}: init container {name} exited {done.get('exitCode')}"
                    + (f": {done['message']}" if done.get("message") else ""))
    return ""


def host_status(pod: dict[str, Any]) -> HostStatus:
    """One pod as the status screen shows it, with why it is Pending or Failed."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    host, attempt = pod_host(pod)
    phase = status.get("phase") or PENDING
    cs = _container_status(pod)
    state = cs.get("state") or {}
    exit_code, reason = None, ""
    if state.get("terminated"):
        exit_code = state["terminated"].get("exitCode")
        reason = state["terminated"].get("reason", "")
    init_problem = init_container_problem(pod) if not state.get("terminated") else ""
    if phase == "Pending":
        waiting = state.get("waiting") or {}
        scheduled: dict[str, Any] = next(
            (c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
        if init_problem:
            reason = init_problem
        elif waiting.get("reason"):
            reason = waiting["reason"] + (f": {waiting['message']}" if waiting.get("message") else "")
        elif scheduled.get("status") == "False":
            reason = scheduled.get("reason", "Unschedulable") + (
                f": {scheduled['message']}" if scheduled.get("message") else "")
        elif any(g for g in (pod.get("spec") or {}).get("schedulingGates") or []):
            reason = "SchedulingGated"
    elif phase == "Failed" and not reason:
        reason = init_problem or status.get("reason", "")
    shown = "Terminating" if meta.get("deletionTimestamp") and phase in ("Pending", "Running") else phase
    return HostStatus(host=host, state=shown, attempt=attempt, exit_code=exit_code,
                      reason=one_line(reason, 160), pod=meta.get("name", ""))


def _host_key(host: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in host.split("-"))


def latest_hosts(pods: list[dict[str, Any]]) -> list[HostStatus]:
    """Per host, the pod of the newest restart attempt (older ones may still be terminating)."""
    best: dict[str, tuple[tuple, HostStatus]] = {}
    for pod in pods:
        hs = host_status(pod)
        key = (hs.attempt, (pod.get("metadata") or {}).get("creationTimestamp") or "")
        if hs.host not in best or key > best[hs.host][0]:
            best[hs.host] = (key, hs)
    return [best[h][1] for h in sorted(best, key=_host_key)]


class JobSetEvents:
    """Event reasons the JobSet controller records (kubernetes-sigs/jobset v0.12.0
    pkg/constants/constants.go), and the run state each terminal one means."""

    # One per restart of the whole set: failure_policy.go restartJobSetActionApplier and
    # restartJobSetAndIgnoreMaxRestartsActionApplier enqueue it unconditionally
    # (failurePolicyRecreateAll -> enqueueEvent). Not counted: the RestartingJobSet
    # condition's reasons (DefaultFailurePolicy, FailurePolicy_<rule>), recorded only when
    # the condition changes, and "Restarting" (JobSetRestartReason), which v0.12 defines
    # and never records.
    RESTARTS = ("RestartJobSetFailurePolicyAction",  # RestartJobSetActionReason
                "RestartJobSetAndIgnoreMaxRestartsFailurePolicyAction")  # ...AndIgnoreMaxRestartsActionReason
    TERMINAL = {
        "AllJobsCompleted": SUCCEEDED,  # AllJobsCompletedReason
        "FailedJobs": FAILED,  # FailedJobsReason
        "ReachedMaxRestarts": FAILED,  # ReachedMaxRestartsReason
        "FailJobSetFailurePolicyAction": FAILED,  # FailJobSetActionReason
        "DeadlineExceeded": FAILED,  # DeadlineExceededReason
    }


def restarts_from_events(events: list[dict[str, Any]]) -> int:
    """How many times the JobSet restarted, as far as its events tell (a lower bound:
    ``status.restarts`` is the count). JobSet v0.12 records through the events.k8s.io
    recorder, whose broadcaster folds a repeat (same type, reason, action and object,
    whatever the message) into the first event's ``series`` (client-go tools/events
    event_broadcaster.go recordToSink); the count it shows lags until the series is
    refreshed (30 min) or finished (6 min idle)."""
    total = 0
    for ev in events:
        if ev.get("reason") in JobSetEvents.RESTARTS:
            series = ev.get("series") or {}
            total += max(1, int(series.get("count") or 0), int(ev.get("count") or 0))
    return total


def expected_jobs(jobset: dict[str, Any]) -> set[str]:
    """The names of the JobSet's Jobs: ``<jobset>-<replicatedJob>-<index>`` (jobset
    controller ``placeholderJobName``/constructJob)."""
    name = (jobset.get("metadata") or {}).get("name", "")
    return {f"{name}-{rj.get('name')}-{j}" for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []
            for j in range(int(rj.get("replicas", 1)))}


def expected_pods(jobset: dict[str, Any]) -> int:
    total = 0
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        job = (rj.get("template") or {}).get("spec") or {}
        total += int(rj.get("replicas", 1)) * int(job.get("parallelism", job.get("completions", 1)))
    return total


def true_conditions(jobset: dict[str, Any]) -> dict[str, dict[str, Any]]:
    conds = (jobset.get("status") or {}).get("conditions") or []
    return {c.get("type", ""): c for c in conds if c.get("status") == "True"}


def attempt_ending(pods: list[dict[str, Any]], jobset: dict[str, Any]) -> bool:
    """Whether the JobSet's current attempt ran and is ending: a pod of it whose workload
    container started (running, or exited) has failed or is being deleted (an exit, a
    node lost under it, its Job deleting the others) before JobSet restarts or fails the
    set. An init container's failure is not a start."""
    restarts = int(((jobset.get("status") or {}).get("restarts")) or 0)
    for pod in pods:
        if pod_host(pod)[1] != restarts:
            continue
        state = _container_status(pod).get("state") or {}
        ran = bool(state.get("running") or state.get("terminated"))
        going = (pod.get("status") or {}).get("phase") == PodPhases.FAILED or bool(
            (pod.get("metadata") or {}).get("deletionTimestamp"))
        if ran and going:
            return True
    return False


def jobset_state(jobset: dict[str, Any], hosts: list[HostStatus] | None, *,
                 ending: bool = False) -> tuple[str, str]:
    """(contract state, message). ``hosts=None`` judges from replicatedJobsStatus alone.
    ``ending`` (:func:`attempt_ending`): the current attempt ran and is being torn down;
    it stays Running until JobSet says Restarting or Failed (`submit --follow` printed
    Running, Pending, Restarting for one exit 42 before)."""
    meta, status, spec = jobset.get("metadata") or {}, jobset.get("status") or {}, jobset.get("spec") or {}
    conds = true_conditions(jobset)
    restarts = int(status.get("restarts") or 0)
    # A finished JobSet that is being deleted (its TTL: ttlSecondsAfterFinished 0 deletes
    # it at once) ended as its condition says, not Deleted.
    if Conditions.COMPLETED in conds:
        return SUCCEEDED, one_line(conds[Conditions.COMPLETED].get("message", ""))
    if Conditions.FAILED in conds:
        failed = conds[Conditions.FAILED]
        return FAILED, one_line(failed.get("message", "") or failed.get("reason", ""))
    if meta.get("deletionTimestamp"):
        return DELETED, "deleting"
    if Conditions.SUSPENDED in conds or spec.get("suspend"):
        queue_name = (meta.get("labels") or {}).get(Labels.QUEUE_NAME)
        why = f"suspended: waiting for Kueue admission in queue {queue_name}" if queue_name else "suspended"
        return PENDING, why
    max_restarts = ((spec.get("failurePolicy") or {}).get("maxRestarts"))
    restart_msg = f"restart {restarts}" + (f"/{max_restarts}" if max_restarts is not None else "")
    if hosts is None:
        rjs = status.get("replicatedJobsStatus") or []
        replicas = {rj.get("name"): int(rj.get("replicas", 1)) for rj in spec.get("replicatedJobs") or []}
        ready = bool(rjs) and all(
            int(r.get("ready", 0)) + int(r.get("succeeded", 0)) >= replicas.get(r.get("name"), 1) for r in rjs
        )
        if ready:
            return RUNNING, ""
        return (RESTARTING, restart_msg) if restarts else (PENDING, "")
    current = [h for h in hosts if h.attempt == restarts]
    started = [h for h in current if h.state in PodPhases.STARTED]
    if len(started) >= max(1, expected_pods(jobset)):
        return RUNNING, ""
    if ending:  # the attempt ran and is being torn down: not Pending again
        return RUNNING, ""
    if restarts:
        return RESTARTING, restart_msg
    return PENDING, ""


def kueue_message(workload: dict[str, Any]) -> str:
    """Why Kueue holds a queued run, from its Workload's conditions: an eviction (e.g.
    "Preempted to accommodate a workload ... due to prioritization in the ClusterQueue"),
    else why quota is not reserved ("couldn't assign flavors to pod set slice: insufficient
    quota ..."). Empty once admitted."""
    conds = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    evicted, reserved = conds.get(KueueWorkload.EVICTED), conds.get(KueueWorkload.QUOTA_RESERVED)
    # Evicted, and its quota not reserved again since: while Kueue evicts, the quota is
    # still reserved (the JobSet suspended first, the quota released after), and a
    # follower that asked then said only "waiting for admission" (1 of 2 preemption drills).
    readmitted = bool(reserved and reserved.get("status") == "True"
                      and str(reserved.get("lastTransitionTime") or "") > str(evicted.get("lastTransitionTime") or "")
                      ) if evicted else False
    if evicted and evicted.get("status") == "True" and not readmitted:
        return one_line(f"Kueue evicted it ({evicted.get('reason', '')}): {evicted.get('message', '')}", 300)
    if reserved and reserved.get("status") == "False" and reserved.get("message"):
        return one_line(f"Kueue: {reserved['message']}", 300)
    return ""


def summarize_events(events: list[dict[str, Any]], jobset_name: str, pod_names: set[str],
                     job_names: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The recent events about this JobSet, its Jobs, its pods and its Kueue workload, one
    line each."""
    mine = []
    seen: set[str] = set()
    for ev in events:
        obj = ev.get("involvedObject") or ev.get("regarding") or {}
        name = obj.get("name", "")
        uid = (ev.get("metadata") or {}).get("uid") or (ev.get("metadata") or {}).get("name", "")
        if uid in seen:
            continue
        seen.add(uid)
        if (name == jobset_name or name in pod_names or name.startswith(f"jobset-{jobset_name}-")
                or (obj.get("kind") == "Job" and name in job_names)):
            when = ev.get("lastTimestamp") or ev.get("eventTime") or (ev.get("metadata") or {}).get("creationTimestamp")
            mine.append((when or "", obj.get("kind", ""), name, ev.get("reason", ""),
                         one_line(ev.get("message", ""), 200)))
    mine.sort(key=lambda e: e[0])
    grouped: dict[tuple[str, str], list[tuple]] = {}
    for e in mine:
        grouped.setdefault((e[3], e[4]), []).append(e)
    lines = []
    for (reason, message), items in sorted(grouped.items(), key=lambda kv: kv[1][-1][0]):
        kind, name = items[-1][1], items[-1][2]
        n_pods = len({i[2] for i in items})
        who = f"{n_pods} pods" if kind == "Pod" and n_pods > 1 else f"{kind.lower()}/{name}"
        lines.append(f"{reason} ({who}): {message}")
    return lines[-MAX_EVENTS:]


