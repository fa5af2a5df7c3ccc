"""GKE backend: JobSets through the Kubernetes API, with the official ``kubernetes`` client.

The backend takes the manifest ``manifests.jobset.jobset(spec)`` rendered and sends it as is
(CustomObjectsApi, ``jobset.x-k8s.io/v1alpha2``); it never runs kubectl or gcloud. Status is
read from the JobSet (conditions, restarts), its pods (label ``jobset.sigs.k8s.io/jobset-name``)
and, while something is Pending, the namespace's events. Logs are streamed from every pod at
once (watch + follow), resuming dropped connections without repeating lines.

Errors are :class:`~xrun_contract.errors.XrunError` with a one-line message and the CLI's exit code:

* 3: the cluster cannot be reached or will not let us in: connection refused / timeout /
  TLS failure, 401 (expired or missing credentials), 5xx, or no usable kubeconfig.
* 2: ``--context`` names a context the kubeconfig does not have (bad input).
* 1: the cluster answered and refused: JobSet CRD not installed (404 on the resource, with the
  install hint), name already exists (409, unless ``replace``), forbidden (403, naming the
  verb and resource RBAC must allow; webhook denials quote the webhook), invalid (422/400,
  quoting the server), namespace missing, delete timeouts.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.backends.base import BackendStatus, LogItem
from orchestrator.backends.kube.logs import _LogSession
from orchestrator.backends.kube.state import (
    PENDING,
    RESTARTING,
    RUNNING,
    ApiUnavailable,
    JobSetEvents,
    _epoch,
    attempt_ending,
    container_started,
    expected_jobs,
    jobset_state,
    latest_hosts,
    loads,
    loads_pods,
    one_line,
    restarts_from_events,
    run_attempt,
    summarize_events,
    true_conditions,
)
from orchestrator.background import Background
from xrun_contract.errors import EXIT_FAILED, EXIT_UNREACHABLE, EXIT_USAGE, XrunError
from xrun_contract.k8s import (
    JOBSET_API_VERSION,
    JOBSET_GROUP,
    JOBSET_PLURAL,
    JOBSET_VERSION,
    KUEUE_GROUP,
    Conditions,
    Labels,
)

GROUP, VERSION, PLURAL = JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL
API_VERSION = JOBSET_API_VERSION
JOBSET_CRD = f"{PLURAL}.{GROUP}"
INSTALL_HINT = (
    "install JobSet: kubectl apply --server-side -f "
    "https://github.com/kubernetes-sigs/jobset/releases/download/v0.12.0/manifests.yaml"
)
__all__ = ["KUEUE_GROUP", "KubeBackend"]
# Every pod's log shipper (xrun-logs) and the GPU stacks' daemons are native sidecars: init
# containers with restartPolicy Always (KEP-753). The SidecarContainers feature gate is on
# by default from Kubernetes 1.29 (beta); 1.28 has it alpha, off unless the cluster turns it
# on. Without it the API server drops the field, the sidecar becomes a plain init container
# that never exits, and the pod stays in Init for ever.
NATIVE_SIDECARS_MIN = (1, 29)
# Event lists for a waiting run: at most this often, and Pending pods asked about by name.
# A watched (followed) run lists them at most every WATCHED_EVENTS_SECONDS, whichever pods
# are Pending: the one periodic request a follow makes, bounded whatever the pod count.
EVENTS_SECONDS = 2.0
WATCHED_EVENTS_SECONDS = 5.0
# The User-Agent of every request (kube-apiserver's audit log and APF see it).
USER_AGENT = "xrun/{version} (python kubernetes client)"
MAX_PENDING_PODS_ASKED = 3
# Resources that are not namespaced: a RoleBinding cannot grant them, so a refusal names
# the cluster scope (kube-apiserver's own message says "at the cluster scope").
CLUSTER_SCOPED = frozenset({
    "nodes", "namespaces", "priorityclasses.scheduling.k8s.io",
    "customresourcedefinitions.apiextensions.k8s.io",
    "validatingwebhookconfigurations.admissionregistration.k8s.io",
    "mutatingwebhookconfigurations.admissionregistration.k8s.io",
})


def _light_kubernetes() -> None:
    """Let ``from kubernetes import client, config`` load just those two subpackages.

    The ``kubernetes`` package's ``__init__`` also imports ``dynamic`` (jsonschema through
    kubernetes_validate), ``stream`` (websocket), ``watch``, ``utils``, ``leaderelection`` and
    ``informer``: 0.3-0.4 s before the first request of a one-shot ``xrun status``, for code
    xrun never calls (what it uses of ``watch`` it imports by name, which still works). So,
    unless something imported the package already, it is registered as a bare package of the
    same directory: every submodule imports as before, on first use."""
    import importlib.util
    import sys
    import types

    if "kubernetes" in sys.modules:
        return
    spec = importlib.util.find_spec("kubernetes")
    if spec is None or not spec.submodule_search_locations:
        return  # not installed: the import below says so
    pkg = types.ModuleType("kubernetes")
    pkg.__file__ = spec.origin
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    pkg.__package__ = "kubernetes"
    sys.modules["kubernetes"] = pkg


_light_kubernetes()


class KubeBackend:
    """Backend protocol over the Kubernetes API of one kubeconfig context and namespace."""

    name = "kube"
    serves_logs = True

    def __init__(
        self,
        context: str | None,
        namespace: str | None = None,
        kubeconfig: str | None = None,
        *,
        poll_seconds: float = 1.0,
        watch_timeout_seconds: int = 10,
        delete_timeout_seconds: float = 900.0,
        request_timeout: tuple[float, float] = (10.0, 60.0),
    ):
        self.context = context or None
        # None: the kubeconfig context's namespace (else "default"), as kubectl resolves it
        # (client-go tools/clientcmd ClientConfig.Namespace); known once the client is built.
        self._namespace = namespace or None
        self.kubeconfig = kubeconfig
        self.poll_seconds = poll_seconds
        self.watch_timeout_seconds = watch_timeout_seconds
        self.delete_timeout_seconds = delete_timeout_seconds
        self.request_timeout = request_timeout
        self._client = None
        self._client_lock = threading.Lock()
        self.context_name = context or ""
        self._jobset_uids: dict[str, str] = {}  # JobSets seen, to find their events once gone
        self._jobset_restarts: dict[str, int] = {}  # their status.restarts as last read
        self._ran_attempt: dict[str, int] = {}  # the attempt last seen Running, per run
        self._events_cache: tuple[float, Any, list[dict[str, Any]]] | None = None
        self._events_lock = threading.Lock()
        self._events_asking: set[str] = set()  # followed runs whose events a thread is asking
        self._followed_events: dict[str, list[str]] = {}  # their events as last summarised
        self._sidecars_checked = False
        self._watches: dict[str, Any] = {}  # run name -> RunWatch while followed
        self._no_visibility = False  # Kueue's visibility API found not served

    @property
    def namespace(self) -> str:
        if self._namespace is None:
            self.api_client  # noqa: B018 - building the client reads the context's namespace
        return self._namespace or "default"

    @namespace.setter
    def namespace(self, value: str) -> None:
        self._namespace = value or None

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
            contexts, active = config.list_kube_config_contexts(config_file=path)
            if self.context:
                active = next((c for c in contexts if c.get("name") == self.context), active)
            else:
                self.context_name = (active or {}).get("name", "")
            if self._namespace is None:
                self._namespace = ((active or {}).get("context") or {}).get("namespace") or "default"
            from xrun_contract import XRUN_VERSION

            api.user_agent = USER_AGENT.format(version=XRUN_VERSION)
        except ConfigException as e:
            if self.context and "Expected object with name" in str(e):
                raise XrunError(f"--context: no context {self.context!r} in kubeconfig {path}", EXIT_USAGE) from None
            raise XrunError(f"kubeconfig {path}: {one_line(str(e))} (for GKE: gcloud container clusters "
                               "get-credentials CLUSTER --location LOCATION)", EXIT_UNREACHABLE) from None
        except OSError as e:
            raise XrunError(f"kubeconfig {path}: {e.strerror or e}", EXIT_UNREACHABLE) from None
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

    def _json(self, fn: Callable, *args: Any, decode: Callable[[bytes], Any] = loads, **kwargs: Any) -> Any:
        resp = self._raw(fn, *args, **kwargs)
        try:
            data = resp.data
        finally:
            resp.release_conn()
        return decode(data) if data else None

    def call(self, verb: str, resource: str, fn: Callable, *args: Any, name: str = "",
             missing_ok: bool = False, decode: Callable[[bytes], Any] = loads, **kwargs: Any) -> Any:
        """One API call as JSON (``decode``d); failures become one-line XrunErrors (None for
        404 if asked)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return self._json(fn, *args, decode=decode, **kwargs)
        except ApiException as e:
            if e.status == 404 and missing_ok and _object_missing(e):
                return None
            raise self.api_error(e, verb, resource, name) from None
        except (HTTPError, OSError) as e:
            raise self.unreachable(e) from None
        except ValueError:  # a proxy or login page answering instead of the API server
            raise XrunError(f"{self._where()} answered {verb} {resource} with something that is not JSON; "
                               "is the kubeconfig's server the Kubernetes API?", EXIT_UNREACHABLE) from None

    def unreachable(self, e: BaseException) -> XrunError:
        reason = getattr(e, "reason", None) or e
        return ApiUnavailable(f"cannot reach the Kubernetes API at {self._where()}: {one_line(str(reason), 200)}",
                              EXIT_UNREACHABLE)

    def api_error(self, e: Any, verb: str, resource: str, name: str = "") -> XrunError:
        """Map an ApiException to the one-line message and exit code of the module docstring."""
        status_obj = _status_body(e)
        msg = one_line(status_obj.get("message") or (e.body or "").strip() or e.reason or "")
        ns, what = self._namespace or "default", f"{resource} {name!r}" if name else resource
        if e.status == 0:
            return XrunError(f"TLS error talking to {self._where()}: {one_line(e.reason or '', 200)}", EXIT_UNREACHABLE)
        if e.status == 401:
            return XrunError(
                f"credentials rejected (401 Unauthorized) by {self._where()}: refresh them, e.g. "
                "gcloud container clusters get-credentials CLUSTER --location LOCATION", EXIT_UNREACHABLE)
        if e.status == 403:
            if "admission webhook" in msg:
                return XrunError(f"{what} rejected by an admission webhook: {msg}", EXIT_FAILED)
            where = ("cluster-wide (a ClusterRole and ClusterRoleBinding: a namespace's RoleBinding cannot "
                     "grant it)" if resource in CLUSTER_SCOPED or "at the cluster scope" in msg
                     else f"in namespace '{ns}'")
            return XrunError(
                f"forbidden: RBAC must allow verb '{verb}' on resource '{resource}' {where} "
                f"(context {self.context_name or '?'}): {msg}", EXIT_FAILED)
        if e.status == 404:
            details = status_obj.get("details") or {}
            if details.get("kind") == "namespaces":
                return XrunError(f"namespace {ns!r} does not exist in context {self.context_name or '?'}", EXIT_FAILED)
            if resource == JOBSET_CRD and not details.get("name"):
                return XrunError(
                    f"JobSet CRD not installed: {API_VERSION} {PLURAL} is not served by {self._where()}; "
                    f"{INSTALL_HINT}", EXIT_FAILED)
            return XrunError(f"{what} not found in namespace '{ns}': {msg}", EXIT_FAILED)
        if e.status == 409:
            return XrunError(f"{what} already exists in namespace '{ns}'; use --replace or another name", EXIT_FAILED)
        if e.status in (400, 422):
            return XrunError(f"{what} rejected by the cluster ({e.status} {status_obj.get('reason') or e.reason}): "
                             f"{msg}", EXIT_FAILED)
        if e.status == 500 and "failed calling webhook" in msg:
            # The API answered; an admission webhook it must call (failurePolicy Fail) did not:
            # its controller is down or unreachable. Nothing of this kind can be created.
            return XrunError(f"{verb} {what} refused: an admission webhook could not be called (is the "
                             f"controller serving it running?): {msg}", EXIT_FAILED)
        if e.status >= 500:
            return ApiUnavailable(f"Kubernetes API at {self._where()} failed ({e.status}): {msg}", EXIT_UNREACHABLE)
        return XrunError(f"{verb} {what}: {e.status} {e.reason}: {msg}", EXIT_FAILED)

    # --- JobSets --------------------------------------------------------------------
    def submit(self, manifest: dict[str, Any], *, replace: bool = False) -> None:
        """Create the JobSet exactly as rendered; on a name clash with ``replace``, delete the
        old one (foreground, waiting for its pods) and create again."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        name = manifest["metadata"]["name"]
        self.check_native_sidecars()
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
        return self.call("get", JOBSET_CRD, self._get_path,
                         f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}/{name}",
                         name=name, missing_ok=True)

    def list_pods(self, name: str, *, lean: bool = False) -> tuple[list[dict[str, Any]], str]:
        """The JobSet's pods and the list's resourceVersion (to watch from). ``lean``: each
        pod with only the fields ``state`` reads (``state.loads_pods``), what ``status``
        needs of 18 MB at 1,024 pods."""
        data = self.call("list", "pods", self._get_path, f"/api/v1/namespaces/{self.namespace}/pods",
                         query=[("labelSelector", f"{Labels.JOBSET_NAME}={name}")],
                         decode=loads_pods if lean else loads) or {}
        return data.get("items") or [], (data.get("metadata") or {}).get("resourceVersion", "")

    def list_events(self, field_selector: str) -> list[dict[str, Any]]:
        """Events about one kind of object or one object (a field selector on involvedObject:
        the server filters, so a busy namespace costs nothing)."""
        return (self.call("list", "events", self._get_path, f"/api/v1/namespaces/{self.namespace}/events",
                          query=[("fieldSelector", field_selector)]) or {}).get("items") or []

    def run_events(self, jobset: dict[str, Any], pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The events that explain a wait: the JobSet's, its Jobs' (FailedCreate: quota, a
        webhook), a few Pending pods' (FailedScheduling) and, while Kueue holds the JobSet,
        its Workload's. A handful of selected lists, at most one round every EVENTS_SECONDS."""
        meta = jobset.get("metadata") or {}
        name = meta.get("name", "")
        pending = sorted((p.get("metadata") or {}).get("name", "") for p in pods
                         if (p.get("status") or {}).get("phase") == "Pending")[:MAX_PENDING_PODS_ASKED]
        queued = bool((jobset.get("spec") or {}).get("suspend")) or Conditions.SUSPENDED in true_conditions(jobset)
        watched = name in self._watches
        key = (name, meta.get("uid"), () if watched else tuple(pending), queued)
        every = WATCHED_EVENTS_SECONDS if watched else EVENTS_SECONDS
        now = time.monotonic()
        if self._events_cache and self._events_cache[1] == key and now - self._events_cache[0] < every:
            return self._events_cache[2]
        selectors = [f"involvedObject.kind=JobSet,involvedObject.name={name}", "involvedObject.kind=Job"]
        selectors += [f"involvedObject.kind=Pod,involvedObject.name={p}" for p in pending]
        if queued:
            selectors.append("involvedObject.kind=Workload")
        events: list[dict[str, Any]] = []
        for sel in selectors:
            events += self.list_events(sel)
        self._events_cache = (now, key, events)
        return events

    def ended_from_events(self, name: str) -> BackendStatus | None:
        """How a JobSet that is gone (its TTL after finishing deleted it) ended, from the
        events its controller recorded (they outlive it: kube-apiserver --event-ttl, 1 h by
        default); None when they say nothing of an end (deleted while running, or expired)."""
        uid = self._jobset_uids.get(name)
        sel = f"involvedObject.uid={uid}" if uid else f"involvedObject.kind=JobSet,involvedObject.name={name}"
        try:
            events = self.list_events(sel)
        except XrunError:
            return None
        events.sort(key=lambda e: (e.get("lastTimestamp") or e.get("eventTime") or "",
                                   int((e.get("metadata") or {}).get("resourceVersion") or 0)))
        # status.restarts as last read is the count; the events only a lower bound.
        restarts = max(restarts_from_events(events), self._jobset_restarts.get(name, 0))
        for ev in reversed(events):
            state = JobSetEvents.TERMINAL.get(ev.get("reason", ""))
            if state:
                return BackendStatus(state=state, restarts=restarts, hosts=[], message=one_line(ev.get("message", "")))
        return None

    @contextlib.contextmanager
    def watch(self, name: str) -> Iterator[None]:
        """While the block runs, ``status(name)`` answers from a list-then-watch cache of
        the JobSet and its pods (``watch.RunWatch``) instead of a GET and a LIST each time:
        what ``submit --follow`` uses, at a request rate that does not grow with pods."""
        from orchestrator.backends.kube.watch import RunWatch

        w = RunWatch(self, name).start()
        self._watches[name] = w
        try:
            yield
        finally:
            self._watches.pop(name, None)
            w.close()

    def status(self, name: str) -> BackendStatus | None:
        w = self._watches.get(name)
        listing: Background | None = None
        if w is not None:
            jobset, pods = w.snapshot()
        else:
            # The pods' LIST beside the JobSet's GET: a running run needs both, and the LIST
            # (37 MB at 1,024 pods) is most of the wait. A gone JobSet's is dropped.
            self.api_client  # noqa: B018 - built once, before the two threads use it
            listing = Background(self.list_pods, name, lean=True)
            jobset = self.get_jobset(name)
            pods = None
        if jobset is None:
            return self.ended_from_events(name)
        self._jobset_uids[name] = (jobset.get("metadata") or {}).get("uid", "")
        self._jobset_restarts[name] = int((jobset.get("status") or {}).get("restarts") or 0)
        if pods is None:
            assert listing is not None
            pods, _ = listing.result()
        hosts = latest_hosts(pods)
        restarts = self._jobset_restarts[name]
        # Once this attempt was seen Running, it is not Pending again until JobSet restarts
        # it (suspension, deletion and the end are decided before): its pods can all be
        # gone first (a node lost: the pod GC deletes the orphan, the Job the rest) with
        # status.restarts not yet bumped. Measured: Running, Pending, Restarting.
        ran = self._ran_attempt.get(name) == restarts
        state, message = jobset_state(jobset, hosts, ending=ran or attempt_ending(pods, jobset))
        if state == RUNNING:
            self._ran_attempt[name] = restarts
        elif (jobset.get("spec") or {}).get("suspend"):  # Kueue evicted it: starts over
            self._ran_attempt.pop(name, None)
        if state == PENDING and (jobset.get("spec") or {}).get("suspend"):
            message = self.kueue_message(jobset) or message
        events: list[str] = []
        if state in (PENDING, RESTARTING) or any(h.state == "Pending" for h in hosts):
            events = self._watched_events(name, jobset, pods) if w is not None else self._events(name, jobset, pods)
        elif w is not None:
            with self._events_lock:
                self._followed_events.pop(name, None)  # a later wait starts from none
        status = jobset.get("status") or {}
        return BackendStatus(
            state=state, restarts=int(status.get("restarts") or 0), hosts=hosts, message=message,
            conditions=list(status.get("conditions") or []), events=events,
        )

    def _events(self, name: str, jobset: dict[str, Any], pods: list[dict[str, Any]]) -> list[str]:
        pod_names = {(p.get("metadata") or {}).get("name", "") for p in pods}
        try:
            return summarize_events(self.run_events(jobset, pods), name, pod_names, expected_jobs(jobset))
        except XrunError as e:  # events are a hint; RBAC may hide them
            return [f"(events unavailable: {e})"]

    def _watched_events(self, name: str, jobset: dict[str, Any], pods: list[dict[str, Any]]) -> list[str]:
        """A followed run's events as last summarised, asked again in a thread of their own:
        the follow prints a state change without waiting for the event LISTs (at a 1,024-pod
        restart, thousands of Job events in the namespace: the bench's restart lag was 1.3 to
        7.5 s with the LISTs before the print). A wait's first view has none yet."""
        with self._events_lock:
            if name not in self._events_asking:
                self._events_asking.add(name)
                threading.Thread(target=self._ask_events, args=(name, jobset, pods), daemon=True,
                                 name=f"xrun-events-{name}").start()
            return list(self._followed_events.get(name, []))

    def _ask_events(self, name: str, jobset: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        try:
            events = self._events(name, jobset, pods)
            with self._events_lock:
                self._followed_events[name] = events
        finally:
            with self._events_lock:
                self._events_asking.discard(name)

    def kueue_message(self, jobset: dict[str, Any]) -> str:
        """Kueue's word on a suspended, queued JobSet (``kube.kueue``), or ""."""
        from orchestrator.backends.kube import kueue

        return kueue.message(self, jobset)

    def _get_path(self, path: str, query: list[tuple[str, str]] | None = None, _preload_content: bool = False,
                  _request_timeout: Any = None) -> Any:
        """GET an API path: one no generated client method covers (an aggregated API's
        subresource), or what ``status`` reads (the JobSet, its pods, events) without the
        generated API classes: CoreV1Api's module imports every core/v1 model (pydantic),
        CustomObjectsApi wraps each of its methods in pydantic's validate_call, together
        over a second of a one-shot command's start on the 2-core machine. The urllib3
        response, as the generated methods give it."""
        from kubernetes.client.exceptions import ApiException

        api = self.api_client
        request = api.param_serialize("GET", path, query_params=query or None,
                                      header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
        resp = api.call_api(*request, _request_timeout=_request_timeout)
        if not 200 <= resp.status <= 299:
            resp.read()
            raise ApiException(http_resp=resp)
        return resp.response

    def queue_position(self, queue: str, workloads: set[str]) -> str:
        """Where a pending Workload stands in its queue (``kube.kueue``), or ""."""
        from orchestrator.backends.kube import kueue

        return kueue.queue_position(self, queue, workloads)

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
                    raise XrunError(
                        f"JobSet {name!r} deleted but still present after {self.delete_timeout_seconds:.0f} s: "
                        f"{left}", EXIT_FAILED)
                time.sleep(self.poll_seconds)
        return True

    def list(self) -> list[dict[str, Any]]:
        """xrun's JobSets in the namespace (label xrun.dev/run), each state judged as
        ``status`` judges it: from the JobSet and its pods (one LIST of xrun's pods in the
        namespace), so a run whose pods run is Running, not the JobSet's Pending."""
        custom, _ = self._apis()
        data = self.call("list", JOBSET_CRD, custom.list_namespaced_custom_object,
                         GROUP, VERSION, self.namespace, PLURAL, label_selector=Labels.RUN)
        items = (data or {}).get("items") or []
        by_jobset: dict[str, list[dict[str, Any]]] = {}
        if items:
            pods = (self.call("list", "pods", self._get_path, f"/api/v1/namespaces/{self.namespace}/pods",
                              query=[("labelSelector", f"{Labels.RUN},{Labels.JOBSET_NAME}")],
                              decode=loads_pods) or {}).get("items") or []
            for pod in pods:
                owner = ((pod.get("metadata") or {}).get("labels") or {}).get(Labels.JOBSET_NAME, "")
                by_jobset.setdefault(owner, []).append(pod)
        out = []
        for js in items:
            meta = js.get("metadata") or {}
            pods = by_jobset.get(meta.get("name", ""), [])
            state, message = jobset_state(js, latest_hosts(pods), ending=attempt_ending(pods, js))
            out.append({
                "name": meta.get("name", ""), "state": state, "message": message,
                "created": _epoch(meta.get("creationTimestamp")),
                "restarts": int((js.get("status") or {}).get("restarts") or 0),
                "namespace": meta.get("namespace", self.namespace),
                "labels": dict(meta.get("labels") or {}),
            })
        out.sort(key=lambda r: r["created"] or 0, reverse=True)
        return out

    # --- logs -----------------------------------------------------------------------
    def live_attempts(self, name: str) -> set[int]:
        """Restart attempts that have pods with a log now (empty when the pods are gone)."""
        pods, _ = self.list_pods(name)
        return {run_attempt(p) for p in pods if container_started(p)}

    def stream_logs(
        self,
        name: str,
        follow: bool = False,
        since_seconds: int | None = None,
        tail_lines: int | None = None,
        hosts: set[str] | None = None,
    ) -> Iterator[LogItem]:
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

    def check_native_sidecars(self) -> None:
        """Refuse (exit 1: the cluster answered, and cannot run the pods) a server older
        than NATIVE_SIDECARS_MIN, once per backend."""
        if self._sidecars_checked:
            return
        problem = sidecar_problem(self.server_version())
        if problem:
            raise XrunError(f"{problem} (API {self._where()})", EXIT_FAILED)
        self._sidecars_checked = True

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

    def local_queues(self, version: str) -> builtins.list[dict[str, Any]]:
        custom, _ = self._apis()
        return (self.call("list", f"localqueues.{KUEUE_GROUP}", custom.list_namespaced_custom_object,
                          KUEUE_GROUP, version, self.namespace, "localqueues") or {}).get("items") or []

    def cluster_objects(self, group: str, version: str, plural: str) -> builtins.list[dict[str, Any]]:
        """Every object of a cluster-scoped custom resource."""
        custom, _ = self._apis()
        return (self.call("list", f"{plural}.{group}", custom.list_cluster_custom_object, group, version, plural)
                or {}).get("items") or []

    def nodes(self, label_selector: str) -> builtins.list[dict[str, Any]]:
        _, core = self._apis()
        return (self.call("list", "nodes", core.list_node, label_selector=label_selector) or {}).get("items") or []

    def priority_classes(self) -> builtins.list[dict[str, Any]]:
        """Every PriorityClass (scheduling.k8s.io/v1, cluster-scoped)."""
        from kubernetes import client

        api = client.SchedulingV1Api(self.api_client)
        found = self.call("list", "priorityclasses.scheduling.k8s.io", api.list_priority_class) or {}
        return found.get("items") or []

    def dry_run_jobset(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create the JobSet with dryRun=All: every admission webhook runs, nothing is stored;
        the answer is the object as it would have been stored (defaulted)."""
        custom, _ = self._apis()
        name = manifest.get("metadata", {}).get("name", "")
        return self.call("create", JOBSET_CRD, custom.create_namespaced_custom_object, GROUP, VERSION,
                         self.namespace, PLURAL, manifest, dry_run="All", name=name) or {}

    def webhook_configurations(self) -> builtins.list[dict[str, Any]]:
        """Every Validating- and MutatingWebhookConfiguration (cluster-scoped), with its kind."""
        from kubernetes import client

        api = client.AdmissionregistrationV1Api(self.api_client)
        out: builtins.list[dict[str, Any]] = []
        for kind, fn in (("ValidatingWebhookConfiguration", api.list_validating_webhook_configuration),
                         ("MutatingWebhookConfiguration", api.list_mutating_webhook_configuration)):
            resource = f"{kind.lower()}s.admissionregistration.k8s.io"
            for item in (self.call("list", resource, fn) or {}).get("items") or []:
                out.append({**item, "kind": kind})
        return out

    def deployments(self, namespace: str) -> builtins.list[dict[str, Any]]:
        from kubernetes import client

        apps = client.AppsV1Api(self.api_client)
        return (self.call("list", "deployments.apps", apps.list_namespaced_deployment, namespace)
                or {}).get("items") or []

    def can(self, verb: str, group: str, resource: str, subresource: str = "") -> tuple[bool, str]:
        """Whether this user may ``verb`` the resource in the backend's namespace, as the
        API server's authorizer answers a SelfSubjectAccessReview (allowed, reason)."""
        from kubernetes import client

        api = client.AuthorizationV1Api(self.api_client)
        attrs = {"namespace": self.namespace, "verb": verb, "group": group, "resource": resource}
        if subresource:
            attrs["subresource"] = subresource
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attrs}}
        out = self.call("create", "selfsubjectaccessreviews.authorization.k8s.io",
                        api.create_self_subject_access_review, body) or {}
        status = out.get("status") or {}
        return bool(status.get("allowed")), str(status.get("reason") or status.get("evaluationError") or "")

    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes import client

        apps = client.AppsV1Api(self.api_client)
        return self.call("get", "deployments.apps", apps.read_namespaced_deployment, name, namespace,
                         name=name, missing_ok=True)

    def pod_log(self, pod: str) -> str:
        """A (finished) pod's whole log, for doctor's probe."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        _, core = self._apis()
        try:  # 400 "no logs found for container": it never started (an init container failed)
            resp = self._raw(core.read_namespaced_pod_log, pod, self.namespace)
        except ApiException as e:
            raise self.api_error(e, "get", "pods/log", pod) from None
        except (HTTPError, OSError) as e:
            raise self.unreachable(e) from None
        try:
            return resp.data.decode("utf-8", errors="replace")
        finally:
            resp.release_conn()

    def config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        _, core = self._apis()
        return self.call("get", "configmaps", core.read_namespaced_config_map, name, namespace,
                         name=name, missing_ok=True)


def kube_version(git_version: str) -> tuple[int, int] | None:
    """(major, minor) of a server's gitVersion (``v1.28.15-gke.1435000``), None if unreadable."""
    import re

    m = re.match(r"v?(\d+)\.(\d+)", git_version or "")
    return (int(m[1]), int(m[2])) if m else None


def sidecar_problem(git_version: str) -> str:
    """Why a server of ``git_version`` cannot run xrun's pods ("" when it can, or when the
    version cannot be read)."""
    version = kube_version(git_version)
    if version is None or version >= NATIVE_SIDECARS_MIN:
        return ""
    need = ".".join(map(str, NATIVE_SIDECARS_MIN))
    gate = (" (1.28 has them only behind the SidecarContainers feature gate, off by default)"
            if version == (1, 28) else "")
    return (f"Kubernetes {git_version} has no native sidecars: xrun's log shipper (xrun-logs, an init "
            f"container with restartPolicy: Always) needs Kubernetes >= {need}{gate}, else every pod "
            f"waits in Init for ever; upgrade the cluster to {need} or later")


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


