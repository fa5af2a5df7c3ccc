"""GKE backend: JobSets through the Kubernetes API, with the official ``kubernetes`` client.

The backend takes the manifest ``manifests.jobset.jobset(spec)`` rendered and sends it as is
(CustomObjectsApi, ``jobset.x-k8s.io/v1alpha2``); it never runs kubectl or gcloud. Status is
read from the JobSet (conditions, restarts), its pods (label ``jobset.sigs.k8s.io/jobset-name``)
and, while something is Pending, the namespace's events. Logs are streamed from every pod at
once (watch + follow), resuming dropped connections without repeating lines.

Errors are :class:`BackendError` with a one-line message and the CLI's exit code:

* 3: the cluster cannot be reached or will not let us in: connection refused / timeout /
  TLS failure, 401 (expired or missing credentials), 5xx, or no usable kubeconfig.
* 2: ``--context`` names a context the kubeconfig does not have (bad input).
* 1: the cluster answered and refused: JobSet CRD not installed (404 on the resource, with the
  install hint), name already exists (409, unless ``replace``), forbidden (403, naming the
  verb and resource RBAC must allow; webhook denials quote the webhook), invalid (422/400,
  quoting the server), namespace missing, delete timeouts.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from manifests.jobset import API_VERSION, CONTAINER, JOBSET_NAME_LABEL, QUEUE_LABEL, RUN_LABEL
from orchestrator.backends import BackendError, BackendStatus, HostStatus
from xrun_contract import DELETED, FAILED, PENDING, RESTARTING, RUNNING, SUCCEEDED, host_id

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "jobsets"
JOBSET_CRD = f"{PLURAL}.{GROUP}"
INSTALL_HINT = (
    "install JobSet: kubectl apply --server-side -f "
    "https://github.com/kubernetes-sigs/jobset/releases/download/v0.8.1/manifests.yaml"
)
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
JOB_GLOBAL_INDEX_LABEL = "jobset.sigs.k8s.io/job-global-index"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # annotation (and label on 1.28+)
KUEUE_GROUP = "kueue.x-k8s.io"
# Re-fetch a log from this many seconds before its last line when a stream is resumed;
# the overlap (clock skew between us and the node) is dropped by timestamp.
LOG_RESUME_SLACK_SECONDS = 10
MAX_EVENTS = 6
# A followed log silent this long is reopened (from its last line): cheap, and it notices a
# connection that died without a FIN.
FOLLOW_READ_TIMEOUT = 300.0

_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")


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


# ---------------------------------------------------------------------------------------
# Reading pods and JobSets (plain dicts, as the API serves them).


def pod_host(pod: dict[str, Any]) -> tuple[str, int]:
    """("<slice>-<host>", restart attempt) of a JobSet pod, from its labels and annotations."""
    meta = pod.get("metadata") or {}
    labels, ann = meta.get("labels") or {}, meta.get("annotations") or {}
    slice_index = labels.get(JOB_GLOBAL_INDEX_LABEL, labels.get(JOB_INDEX_LABEL, "?"))
    host_index = ann.get(COMPLETION_INDEX, labels.get(COMPLETION_INDEX, "?"))
    try:
        attempt = int(labels.get(RESTART_ATTEMPT_LABEL, 0))
    except ValueError:
        attempt = 0
    return host_id(slice_index, host_index), attempt


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
        (pod.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed")
    )


def container_done(pod: dict[str, Any]) -> bool:
    state = _container_status(pod).get("state") or {}
    return bool(state.get("terminated")) or (pod.get("status") or {}).get("phase") in (
        "Succeeded", "Failed",
    )


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
    if phase == "Pending":
        waiting = state.get("waiting") or {}
        scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
        if waiting.get("reason"):
            reason = waiting["reason"] + (f": {waiting['message']}" if waiting.get("message") else "")
        elif scheduled.get("status") == "False":
            reason = scheduled.get("reason", "Unschedulable") + (
                f": {scheduled['message']}" if scheduled.get("message") else "")
        elif any(g for g in (pod.get("spec") or {}).get("schedulingGates") or []):
            reason = "SchedulingGated"
    elif phase == "Failed" and not reason:
        reason = status.get("reason", "")
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


def expected_pods(jobset: dict[str, Any]) -> int:
    total = 0
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        job = (rj.get("template") or {}).get("spec") or {}
        total += int(rj.get("replicas", 1)) * int(job.get("parallelism", job.get("completions", 1)))
    return total


def true_conditions(jobset: dict[str, Any]) -> dict[str, dict[str, Any]]:
    conds = (jobset.get("status") or {}).get("conditions") or []
    return {c.get("type", ""): c for c in conds if c.get("status") == "True"}


def jobset_state(jobset: dict[str, Any], hosts: list[HostStatus] | None) -> tuple[str, str]:
    """(contract state, message). ``hosts=None`` judges from replicatedJobsStatus alone."""
    meta, status, spec = jobset.get("metadata") or {}, jobset.get("status") or {}, jobset.get("spec") or {}
    conds = true_conditions(jobset)
    restarts = int(status.get("restarts") or 0)
    if meta.get("deletionTimestamp"):
        return DELETED, "deleting"
    if "Completed" in conds:
        return SUCCEEDED, one_line(conds["Completed"].get("message", ""))
    if "Failed" in conds:
        return FAILED, one_line(conds["Failed"].get("message", "") or conds["Failed"].get("reason", ""))
    if "Suspended" in conds or spec.get("suspend"):
        queue_name = (meta.get("labels") or {}).get(QUEUE_LABEL)
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
    started = [h for h in current if h.state in ("Running", "Succeeded", "Failed")]
    if len(started) >= max(1, expected_pods(jobset)):
        return RUNNING, ""
    if restarts:
        return RESTARTING, restart_msg
    return PENDING, ""


def summarize_events(events: list[dict[str, Any]], jobset_name: str, pod_names: set[str]) -> list[str]:
    """The recent events about this JobSet, its pods and its Kueue workload, one line each."""
    mine = []
    for ev in events:
        obj = ev.get("involvedObject") or ev.get("regarding") or {}
        name = obj.get("name", "")
        if name == jobset_name or name in pod_names or name.startswith(f"jobset-{jobset_name}-"):
            when = ev.get("lastTimestamp") or ev.get("eventTime") or (ev.get("metadata") or {}).get("creationTimestamp")
            mine.append((when or "", obj.get("kind", ""), name, ev.get("reason", ""), one_line(ev.get("message", ""), 200)))
    mine.sort(key=lambda e: e[0])
    grouped: dict[tuple[str, str], list[tuple]] = {}
    for e in mine:
        grouped.setdefault((e[3], e[4]), []).append(e)
    lines = []
    for (reason, message), items in sorted(grouped.items(), key=lambda kv: kv[1][-1][0]):
        kind, name = items[-1][1], items[-1][2]
        who = f"{len({i[2] for i in items})} pods" if kind == "Pod" and len({i[2] for i in items}) > 1 else f"{kind.lower()}/{name}"
        lines.append(f"{reason} ({who}): {message}")
    return lines[-MAX_EVENTS:]


# ---------------------------------------------------------------------------------------


class KubeBackend:
    """Backend protocol over the Kubernetes API of one kubeconfig context and namespace."""

    name = "kube"

    def __init__(
        self,
        context: str | None,
        namespace: str = "default",
        kubeconfig: str | None = None,
        *,
        poll_seconds: float = 1.0,
        watch_timeout_seconds: int = 10,
        delete_timeout_seconds: float = 900.0,
        request_timeout: tuple[float, float] = (10.0, 60.0),
    ):
        self.context = context or None
        self.namespace = namespace or "default"
        self.kubeconfig = kubeconfig
        self.poll_seconds = poll_seconds
        self.watch_timeout_seconds = watch_timeout_seconds
        self.delete_timeout_seconds = delete_timeout_seconds
        self.request_timeout = request_timeout
        self._client = None
        self._client_lock = threading.Lock()
        self.context_name = context or ""

    # --- client ---------------------------------------------------------------------
    @property
    def api_client(self):
        """The ApiClient for the context, built on first use (errors then, not at import)."""
        with self._client_lock:
            if self._client is None:
                self._client = self._new_client()
            return self._client

    def _new_client(self):
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        path = self.kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        cfg = client.Configuration()
        cfg.retries = 2  # urllib3: a refused connection fails in well under a second
        cfg.connection_pool_maxsize = 128  # one connection per followed pod log
        try:
            api = config.new_client_from_config(
                config_file=path, context=self.context, persist_config=False, client_configuration=cfg,
            )
            if not self.context:
                _, active = config.list_kube_config_contexts(config_file=path)
                self.context_name = (active or {}).get("name", "")
        except ConfigException as e:
            if self.context and "Expected object with name" in str(e):
                raise BackendError(f"--context: no context {self.context!r} in kubeconfig {path}", 2) from None
            raise BackendError(f"kubeconfig {path}: {one_line(str(e))} (for GKE: gcloud container clusters "
                               "get-credentials CLUSTER --location LOCATION)", 3) from None
        except OSError as e:
            raise BackendError(f"kubeconfig {path}: {e.strerror or e}", 3) from None
        return api

    @property
    def host(self) -> str:
        return self.api_client.configuration.host

    def _where(self) -> str:
        return f"{self.host} (context {self.context_name or '?'})"

    def _apis(self):
        from kubernetes import client

        api = self.api_client
        return client.CustomObjectsApi(api), client.CoreV1Api(api)

    def _raw(self, fn: Callable, *args: Any, timeout: Any = None, **kwargs: Any):
        """Call a client method without model decoding: the urllib3 response."""
        return fn(*args, _preload_content=False, _request_timeout=timeout or self.request_timeout, **kwargs)

    def _json(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        resp = self._raw(fn, *args, **kwargs)
        try:
            data = resp.data
        finally:
            resp.release_conn()
        return json.loads(data) if data else None

    def call(self, verb: str, resource: str, fn: Callable, *args: Any, name: str = "",
             missing_ok: bool = False, **kwargs: Any) -> Any:
        """One API call as JSON; failures become one-line BackendErrors (None for 404 if asked)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return self._json(fn, *args, **kwargs)
        except ApiException as e:
            if e.status == 404 and missing_ok and _object_missing(e):
                return None
            raise self.api_error(e, verb, resource, name) from None
        except (HTTPError, OSError) as e:
            raise self.unreachable(e) from None
        except ValueError:  # a proxy or login page answering instead of the API server
            raise BackendError(f"{self._where()} answered {verb} {resource} with something that is not JSON; "
                               "is the kubeconfig's server the Kubernetes API?", 3) from None

    def unreachable(self, e: BaseException) -> BackendError:
        reason = getattr(e, "reason", None) or e
        return BackendError(f"cannot reach the Kubernetes API at {self._where()}: {one_line(str(reason), 200)}", 3)

    def api_error(self, e: Any, verb: str, resource: str, name: str = "") -> BackendError:
        """Map an ApiException to the one-line message and exit code of the module docstring."""
        status_obj = _status_body(e)
        msg = one_line(status_obj.get("message") or (e.body or "").strip() or e.reason or "")
        ns, what = self.namespace, f"{resource} {name!r}" if name else resource
        if e.status == 0:
            return BackendError(f"TLS error talking to {self._where()}: {one_line(e.reason or '', 200)}", 3)
        if e.status == 401:
            return BackendError(
                f"credentials rejected (401 Unauthorized) by {self._where()}: refresh them, e.g. "
                "gcloud container clusters get-credentials CLUSTER --location LOCATION", 3)
        if e.status == 403:
            if "admission webhook" in msg:
                return BackendError(f"{what} rejected by an admission webhook: {msg}", 1)
            return BackendError(
                f"forbidden: RBAC must allow verb '{verb}' on resource '{resource}' in namespace '{ns}' "
                f"(context {self.context_name or '?'}): {msg}", 1)
        if e.status == 404:
            details = status_obj.get("details") or {}
            if details.get("kind") == "namespaces":
                return BackendError(f"namespace {ns!r} does not exist in context {self.context_name or '?'}", 1)
            if resource == JOBSET_CRD and not details.get("name"):
                return BackendError(
                    f"JobSet CRD not installed: {API_VERSION} {PLURAL} is not served by {self._where()}; {INSTALL_HINT}", 1)
            return BackendError(f"{what} not found in namespace '{ns}': {msg}", 1)
        if e.status == 409:
            return BackendError(f"{what} already exists in namespace '{ns}'; use --replace or another name", 1)
        if e.status in (400, 422):
            return BackendError(f"{what} rejected by the cluster ({e.status} {status_obj.get('reason') or e.reason}): {msg}", 1)
        if e.status >= 500:
            return BackendError(f"Kubernetes API at {self._where()} failed ({e.status}): {msg}", 3)
        return BackendError(f"{verb} {what}: {e.status} {e.reason}: {msg}", 1)

    # --- JobSets --------------------------------------------------------------------
    def submit(self, manifest: dict[str, Any], *, replace: bool = False) -> None:
        """Create the JobSet exactly as rendered; on a name clash with ``replace``, delete the
        old one (foreground, waiting for its pods) and create again."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        name = manifest["metadata"]["name"]
        self.namespace = manifest["metadata"].get("namespace") or self.namespace
        custom, _ = self._apis()
        create = (custom.create_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, manifest)
        try:
            self._json(*create)
            return
        except ApiException as e:
            if e.status != 409 or not replace:
                raise self.api_error(e, "create", JOBSET_CRD, name) from None
        except (HTTPError, OSError) as e:
            raise self.unreachable(e) from None
        self.delete(name, wait=True)
        self.call("create", JOBSET_CRD, *create, name=name)

    def get_jobset(self, name: str) -> dict[str, Any] | None:
        custom, _ = self._apis()
        return self.call("get", JOBSET_CRD, custom.get_namespaced_custom_object,
                         GROUP, VERSION, self.namespace, PLURAL, name, name=name, missing_ok=True)

    def list_pods(self, name: str) -> tuple[list[dict[str, Any]], str]:
        """The JobSet's pods and the list's resourceVersion (to watch from)."""
        _, core = self._apis()
        data = self.call("list", "pods", core.list_namespaced_pod, self.namespace,
                         label_selector=f"{JOBSET_NAME_LABEL}={name}")
        return data.get("items") or [], (data.get("metadata") or {}).get("resourceVersion", "")

    def list_events(self) -> list[dict[str, Any]]:
        _, core = self._apis()
        return (self.call("list", "events", core.list_namespaced_event, self.namespace) or {}).get("items") or []

    def status(self, name: str) -> BackendStatus | None:
        jobset = self.get_jobset(name)
        if jobset is None:
            return None
        pods, _ = self.list_pods(name)
        hosts = latest_hosts(pods)
        state, message = jobset_state(jobset, hosts)
        events: list[str] = []
        if state in (PENDING, RESTARTING) or any(h.state == "Pending" for h in hosts):
            pod_names = {(p.get("metadata") or {}).get("name", "") for p in pods}
            try:
                events = summarize_events(self.list_events(), name, pod_names)
            except BackendError as e:  # events are a hint; RBAC may hide them
                events = [f"(events unavailable: {e})"]
        status = jobset.get("status") or {}
        return BackendStatus(
            state=state, restarts=int(status.get("restarts") or 0), hosts=hosts, message=message,
            conditions=list(status.get("conditions") or []), events=events,
        )

    def delete(self, name: str, *, wait: bool = True) -> bool:
        """Foreground delete (pods go before the JobSet); with ``wait`` until no pod is left."""
        from kubernetes import client

        custom, _ = self._apis()
        opts = client.V1DeleteOptions(propagation_policy="Foreground")
        gone = self.call("delete", JOBSET_CRD, custom.delete_namespaced_custom_object,
                         GROUP, VERSION, self.namespace, PLURAL, name, body=opts, name=name, missing_ok=True)
        if gone is None:
            return False
        if wait:
            deadline = time.monotonic() + self.delete_timeout_seconds
            while True:
                pods, _ = self.list_pods(name)
                if not pods and self.get_jobset(name) is None:
                    break
                if time.monotonic() > deadline:
                    left = ", ".join(sorted(p["metadata"]["name"] for p in pods)) or "the JobSet itself"
                    raise BackendError(
                        f"JobSet {name!r} deleted but still present after {self.delete_timeout_seconds:.0f} s: {left}", 1)
                time.sleep(self.poll_seconds)
        return True

    def list(self) -> list[dict[str, Any]]:
        """xrun's JobSets in the namespace (label xrun.dev/run), state from the JobSet alone."""
        custom, _ = self._apis()
        data = self.call("list", JOBSET_CRD, custom.list_namespaced_custom_object,
                         GROUP, VERSION, self.namespace, PLURAL, label_selector=RUN_LABEL)
        out = []
        for js in (data or {}).get("items") or []:
            meta = js.get("metadata") or {}
            state, message = jobset_state(js, None)
            out.append({
                "name": meta.get("name", ""), "state": state, "message": message,
                "created": _epoch(meta.get("creationTimestamp")),
                "restarts": int((js.get("status") or {}).get("restarts") or 0),
                "namespace": meta.get("namespace", self.namespace),
            })
        out.sort(key=lambda r: r["created"] or 0, reverse=True)
        return out

    # --- logs -----------------------------------------------------------------------
    def live_attempts(self, name: str) -> set[int]:
        """Restart attempts that have pods with a log now (empty when the pods are gone)."""
        pods, _ = self.list_pods(name)
        return {pod_host(p)[1] for p in pods if container_started(p)}

    def stream_logs(
        self,
        name: str,
        follow: bool = False,
        since_seconds: int | None = None,
        tail_lines: int | None = None,
        hosts: set[str] | None = None,
    ) -> Iterator[tuple[str, int, str]]:
        """Every pod's log at once as (host "<slice>-<host>", restart attempt, line).

        With ``follow`` new pods (a JobSet restart) are picked up from a pod watch, dropped
        watches resume from their resourceVersion and dropped log streams from the last
        line's timestamp; it ends when the JobSet is finished (or gone) and every stream ended.
        """
        session = _LogSession(self, name, follow, since_seconds, tail_lines, hosts)
        yield from session.run()

    # --- doctor ---------------------------------------------------------------------
    def server_version(self) -> str:
        from kubernetes import client

        data = self.call("get", "version", client.VersionApi(self.api_client).get_code)
        return (data or {}).get("gitVersion", "?")

    def api_group(self, group: str) -> dict[str, Any] | None:
        """The APIGroup entry of /apis (versions, preferredVersion), None when not served."""
        from kubernetes import client

        data = self.call("get", "apis", client.ApisApi(self.api_client).get_api_versions) or {}
        return next((g for g in data.get("groups") or [] if g.get("name") == group), None)

    def api_resources(self, group: str, version: str) -> dict[str, Any] | None:
        custom, _ = self._apis()
        return self.call("get", f"apis/{group}/{version}", custom.get_api_resources, group, version,
                         missing_ok=True)

    def jobset_crd(self) -> dict[str, Any] | None:
        from kubernetes import client

        ext = client.ApiextensionsV1Api(self.api_client)
        return self.call("get", "customresourcedefinitions.apiextensions.k8s.io",
                         ext.read_custom_resource_definition, JOBSET_CRD, name=JOBSET_CRD, missing_ok=True)

    def local_queue(self, queue_name: str, version: str) -> dict[str, Any] | None:
        custom, _ = self._apis()
        return self.call("get", f"localqueues.{KUEUE_GROUP}", custom.get_namespaced_custom_object,
                         KUEUE_GROUP, version, self.namespace, "localqueues", queue_name,
                         name=queue_name, missing_ok=True)

    def nodes(self, label_selector: str) -> list[dict[str, Any]]:
        _, core = self._apis()
        return (self.call("list", "nodes", core.list_node, label_selector=label_selector) or {}).get("items") or []

    def config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        _, core = self._apis()
        return self.call("get", "configmaps", core.read_namespaced_config_map, name, namespace,
                         name=name, missing_ok=True)


def _status_body(e: Any) -> dict[str, Any]:
    try:
        body = json.loads(e.body or "")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) and body.get("kind") == "Status" else {}


def _object_missing(e: Any) -> bool:
    """A 404 about the object itself (Status naming it), not about an unserved resource."""
    details = _status_body(e).get("details") or {}
    return bool(details.get("name")) and details.get("kind") != "namespaces"


# ---------------------------------------------------------------------------------------
# Log streaming: one thread per pod log, one pod watch, a queue to the caller.

_DONE = object()


class _LogSession:
    def __init__(self, backend: KubeBackend, name: str, follow: bool, since_seconds: int | None,
                 tail_lines: int | None, hosts: set[str] | None):
        self.b, self.name, self.follow = backend, name, follow
        self.since_seconds, self.tail_lines, self.hosts = since_seconds, tail_lines, hosts
        self.q: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.started: set[str] = set()  # pod uids with a pump
        self.pumps: list[threading.Thread] = []
        self.watcher: threading.Thread | None = None
        self.stop = threading.Event()
        self.responses: set[Any] = set()

    # Lifecycle
    def run(self) -> Iterator[tuple[str, int, str]]:
        pods, rv = self.b.list_pods(self.name)
        if not pods and self.follow and self.b.get_jobset(self.name) is None:
            return
        for pod in pods:
            self.consider(pod)
        if self.follow:
            self.watcher = threading.Thread(target=self._guard, args=(self._watch, rv), daemon=True,
                                            name=f"xrun-watch-{self.name}")
            self.watcher.start()
        try:
            while True:
                try:
                    item = self.q.get(timeout=0.1)
                except queue.Empty:
                    if self._finished():
                        while not self.q.empty():
                            yield from self._emit(self.q.get_nowait())
                        return
                    continue
                yield from self._emit(item)
        finally:
            self.close()

    def _emit(self, item: Any) -> Iterator[tuple[str, int, str]]:
        if isinstance(item, BackendError):
            raise item
        yield item

    def _finished(self) -> bool:
        with self.lock:
            pumps_done = all(not t.is_alive() for t in self.pumps)
        return pumps_done and (self.watcher is None or not self.watcher.is_alive())

    def close(self) -> None:
        self.stop.set()
        with self.lock:
            open_responses = list(self.responses)
        for resp in open_responses:
            with contextlib.suppress(Exception):
                resp.shutdown()  # unblocks a thread waiting in a socket read
            with contextlib.suppress(Exception):
                resp.release_conn()

    def _guard(self, fn: Callable, *args: Any) -> None:
        """Run a worker; its BackendError reaches the caller through the queue."""
        try:
            fn(*args)
        except BackendError as e:
            if not self.stop.is_set():
                self.q.put(e)
        except Exception as e:  # noqa: BLE001 - a bug must surface, not end the stream quietly
            if not self.stop.is_set():
                self.q.put(BackendError(f"log streaming failed: {type(e).__name__}: {one_line(str(e), 200)}", 1))

    def _open(self, fn: Callable, *args: Any, **kwargs: Any):
        resp = self.b._raw(fn, *args, **kwargs)
        with self.lock:
            self.responses.add(resp)
        return resp

    def _release(self, resp: Any) -> None:
        with self.lock:
            self.responses.discard(resp)
        with contextlib.suppress(Exception):
            resp.release_conn()

    # Pods
    def consider(self, pod: dict[str, Any]) -> None:
        """Start a log pump for a pod whose container has started, once per pod."""
        meta = pod.get("metadata") or {}
        uid = meta.get("uid") or meta.get("name", "")
        host, _ = pod_host(pod)
        if self.hosts and host not in self.hosts:
            return
        if not container_started(pod):
            return
        with self.lock:
            if uid in self.started or self.stop.is_set():
                return
            self.started.add(uid)
            t = threading.Thread(target=self._guard, args=(self._pump, pod), daemon=True,
                                 name=f"xrun-log-{meta.get('name')}")
            self.pumps.append(t)
        t.start()

    def _terminal(self) -> bool:
        jobset = self.b.get_jobset(self.name)
        if jobset is None:
            return True
        return jobset_state(jobset, [])[0] in (SUCCEEDED, FAILED, DELETED)

    def _watch(self, rv: str) -> None:
        """Follow the pod list from ``rv`` until the JobSet is finished or gone.

        A dropped connection resumes from the last resourceVersion seen (no event twice);
        a 410 Gone lists again. The JobSet is checked whenever a pod ends or goes, and
        whenever the server closes the watch (``timeoutSeconds``).
        """
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines
        from urllib3.exceptions import HTTPError

        _, core = self.b._apis()
        failures = 0
        while not self.stop.is_set():
            try:
                resp = self._open(
                    core.list_namespaced_pod, self.b.namespace,
                    label_selector=f"{JOBSET_NAME_LABEL}={self.name}", watch=True, resource_version=rv,
                    allow_watch_bookmarks=True, timeout_seconds=self.b.watch_timeout_seconds,
                    timeout=(self.b.request_timeout[0], self.b.watch_timeout_seconds + 30),
                )
                failures = 0
                try:
                    for line in iter_resp_lines(resp):
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        etype = event.get("type")
                        if etype == "ERROR":
                            if obj.get("code") == 410:
                                raise _Expired
                            raise BackendError(f"watching pods of {self.name}: {one_line(obj.get('message', ''))}", 1)
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        if etype in ("ADDED", "MODIFIED"):
                            self.consider(obj)
                        ended = etype == "DELETED" or (etype == "MODIFIED" and container_done(obj))
                        if ended and self._terminal():
                            return
                finally:
                    self._release(resp)
            except _Expired:
                rv = self._relist()
                continue
            except ApiException as e:
                if e.status == 410:
                    rv = self._relist()
                    continue
                raise self.b.api_error(e, "watch", "pods") from None
            except (HTTPError, OSError, ValueError) as e:
                if self.stop.is_set():
                    return
                failures += 1  # a dropped connection: resume from the last resourceVersion
                if failures > 5:
                    raise self.b.unreachable(e) from None
                time.sleep(min(0.2 * failures, 2.0))
            if self.stop.is_set() or self._terminal():
                return

    def _relist(self) -> str:
        pods, rv = self.b.list_pods(self.name)
        for pod in pods:
            self.consider(pod)
        return rv

    def _pump(self, pod: dict[str, Any]) -> None:
        """Stream one pod's log; resume after a drop without repeating a line."""
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines
        from urllib3.exceptions import HTTPError

        _, core = self.b._apis()
        meta = pod["metadata"]
        pod_name, uid = meta["name"], meta.get("uid") or meta["name"]
        host, attempt = pod_host(pod)
        last: tuple[int, int] | None = None  # timestamp of the last line passed on
        at_last = 0  # lines passed on with exactly that timestamp
        first, follow, failures = True, self.follow, 0
        while not self.stop.is_set():
            kwargs: dict[str, Any] = {"container": CONTAINER, "follow": follow, "timestamps": True}
            if first:
                if self.since_seconds is not None:
                    kwargs["since_seconds"] = self.since_seconds
                if self.tail_lines is not None:
                    kwargs["tail_lines"] = self.tail_lines
            elif last is not None:
                kwargs["since_seconds"] = max(1, math.ceil(time.time() - last[0]) + LOG_RESUME_SLACK_SECONDS)
            elif self.since_seconds is not None:
                kwargs["since_seconds"] = self.since_seconds
            clean = False
            try:
                resp = self._open(core.read_namespaced_pod_log, pod_name, self.b.namespace,
                                  timeout=(self.b.request_timeout[0], FOLLOW_READ_TIMEOUT if follow
                                           else self.b.request_timeout[1]), **kwargs)
                failures, skip = 0, at_last
                try:
                    for raw in iter_resp_lines(resp):
                        stamp, _, text = raw.partition(" ")
                        ts = parse_time(stamp)
                        if ts is None:
                            text = raw
                        elif last is not None and (ts < last or (ts == last and skip > 0)):
                            if ts == last:
                                skip -= 1
                            continue  # already passed on before the reconnect
                        self.q.put((host, attempt, text))
                        if ts is not None:
                            at_last = at_last + 1 if ts == last else 1
                            last = ts
                            skip = 0
                finally:
                    self._release(resp)
                clean = True
            except ApiException as e:
                if e.status == 404:
                    return  # pod gone
                if e.status == 400 and first:
                    with self.lock:  # container not started after all: a later event retries
                        self.started.discard(uid)
                    return
                raise self.b.api_error(e, "get", "pods/log", pod_name) from None
            except (HTTPError, OSError) as e:
                if self.stop.is_set():
                    return
                failures += 1
                if failures > 10:
                    raise self.b.unreachable(e) from None
                time.sleep(min(0.1 * failures, 1.0))
            first = False
            if clean and not follow:
                return
            if not follow:
                continue  # the final read was cut: read it again
            current = self.b.call("get", "pods", core.read_namespaced_pod, pod_name, self.b.namespace,
                                  name=pod_name, missing_ok=True)
            if current is None:
                return
            if container_done(current):
                follow = False  # one last read (from the last line on) catches a cut tail
            elif clean:
                time.sleep(0.1)


class _Expired(Exception):
    """The watch's resourceVersion is too old (410): list again."""
