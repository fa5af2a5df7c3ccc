"""A scripted Kubernetes API server on 127.0.0.1, reached by the real ``kubernetes`` client.

Being retired. The real control plane (tests/cluster/up.sh: kube-apiserver, JobSet, Kueue,
KWOK) now answers for Kubernetes semantics: admission both ways (test_admission_real.py),
the run lifecycle (test_cluster_lifecycle.py), Kueue (test_cluster_kueue.py). What stays
here is what a real server cannot be made to do on demand (5xx answers, latency, a kubelet
that is unreachable) and the older tests not yet moved; where this fake mirrors a rule, the
rule cites its upstream source, and the real cluster tests check the same behaviour.

It speaks plain HTTP/1.1 (chunked streams for watches and followed logs) and serves the
paths xrun uses: JobSet create/get/list/delete (+ CRD discovery), pods list/get/watch, pod
logs (follow, timestamps, sinceSeconds, tailLines), events, nodes, config maps and Kueue
LocalQueues. Errors are real ``Status`` objects (or the apiserver's plain "404 page not
found" for an unserved resource). Every request is recorded with its parsed body, so tests
assert on the HTTP traffic, which is the contract; nothing in the client is patched.

A JobSet create goes through admission as a cluster does it (``admit_jobset``): the
mutating webhook and CRD defaults (``manifests.admission.default``, and the defaulted object
is what is stored), then the apiserver's own checks, then JobSet's validating webhook, each
refusal answered in the form the real server sends. A pod template the Job API would refuse
is refused at create too (``job_template_errors = "reject"``), or played as a real cluster
plays it (``"event"``: stored, JobCreationFailed, no pods).

The world changes through methods (``put_pod``, ``set_jobset_status``, ``log``...), each
mutation getting a resourceVersion and a watch event. ``JobSetController(api, Program(...))``
is the cluster: JobSet, Job and scheduler controllers and kubelets on their own clock
(restarts after the old pods' grace period, failure policies, TTL, Kueue's suspend, GKE's
TPU webhook), each rule citing its upstream source. ``script(phases, hold)`` is the older,
read-driven player (phase 0 at create, each later phase once the JobSet was read ``hold``
times): kept for tests that walk a poller through every state, not for timing behaviour.

Strict where the real server is: watches list first without a resourceVersion, expire with
410 (in-stream or HTTP), send BOOKMARKs; pod logs answer 400 before a node is assigned and
500 while the node's kubelet is unreachable; events expire and are selected by field;
cluster-scoped reads can be RBAC-forbidden; an object's namespace must match the URL's.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import hashlib
import json
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import yaml

from manifests import admission

JOBSET_PREFIX = "/apis/jobset.x-k8s.io/"
# The Job controller syncs a Job at most once per this period after its pods' events
# (kubernetes pkg/controller/job/job_controller.go, syncJobBatchPeriod): the failures of one
# Job within it are judged in one syncJob (× the controller's time_scale here).
SYNC_JOB_BATCH_PERIOD = 1.0
# The JobSet's condition while it restarts (jobset api/jobset/v1alpha2/jobset_types.go
# JobSetRestarting).
RESTARTING_CONDITION = "RestartingJobSet"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/jobsets.jobset.x-k8s.io"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    headers: dict[str, str]


@dataclass
class Fault:
    method: str
    path: re.Pattern
    code: int
    body: Any
    times: int


def status(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A metav1.Status as the apiserver sends it with an error."""
    obj: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": message, "reason": reason, "code": code}
    if details is not None:
        obj["details"] = details
    return obj


def invalid(kind: str, group: str, name: str, errors: list[admission.Violation]) -> dict[str, Any]:
    """422 Invalid as apimachinery pkg/api/errors/errors.go ``NewInvalid`` builds it: one cause
    per field error (reason = its type, message = its ErrorBody, field), and the message
    ``<Kind>.<group> "<name>" is invalid: <aggregate>`` (utilerrors aggregate: one error as
    is, several as ``[e1, e2]``, duplicates dropped)."""
    causes = []
    for v in errors:
        cause = {"reason": v.cause, "message": v.error_body()}
        if v.upstream_field:
            cause["field"] = v.upstream_field
        causes.append(cause)
    texts = list(dict.fromkeys(v.upstream_error() for v in errors))
    agg = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    return status(422, "Invalid", f'{kind}.{group} "{name}" is invalid: {agg}',
                  {"name": name, "group": group, "kind": kind, "causes": causes})


def webhook_denial(webhook: str, result: dict[str, Any]) -> dict[str, Any]:
    """What kube-apiserver makes of a validating webhook's refusal
    (k8s.io/apiserver v0.33 pkg/admission/plugin/webhook/errors/statuserror.go ``ToStatusErr``,
    unchanged through v0.36): the webhook's Status kept, a code below 400 raised to 400, the
    message prefixed. (Unreleased master also prefixes ``<resource> "<name>" is forbidden:``.)"""
    out = dict(result)
    out["code"] = out.get("code") if (out.get("code") or 0) >= 400 else 400
    out["status"] = "Failure"
    out["message"] = f'admission webhook "{webhook}" denied the request: {result.get("message", "")}'
    return out


def not_found(kind: str, name: str, group: str = "") -> dict[str, Any]:
    full = f"{kind}.{group}" if group else kind
    details = {"name": name, "kind": kind, **({"group": group} if group else {})}
    return status(404, "NotFound", f'{full} "{name}" not found', details)


def rfc3339(ns: int) -> str:
    """RFC3339Nano as Go writes it (trailing zeros of the fraction trimmed)."""
    sec, frac = divmod(ns, 10**9)
    base = dt.datetime.fromtimestamp(sec, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    frac_s = f"{frac:09d}".rstrip("0")
    return f"{base}.{frac_s}Z" if frac_s else f"{base}Z"


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def match_labels(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = re.split("==?", term, maxsplit=1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


# The field labels events can be selected on (kubernetes pkg/registry/core/event/strategy.go
# ``ToSelectableFields``); any other label is refused with 400 "field label not supported".
EVENT_FIELDS = ("metadata.name", "metadata.namespace", "involvedObject.kind", "involvedObject.namespace",
                "involvedObject.name", "involvedObject.uid", "involvedObject.apiVersion",
                "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
                "reportingComponent", "source", "type")


def parse_field_selector(selector: str, allowed: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(field, op, value) terms of a field selector (apimachinery pkg/fields/selector.go:
    ``=``, ``==``, ``!=`` joined by commas); an unsupported field is a ValueError."""
    terms = []
    for term in filter(None, (t.strip() for t in selector.split(","))):
        m = re.fullmatch(r"([^=!]+)(!=|==|=)(.*)", term)
        if not m:
            raise ValueError(f"invalid selector: '{selector}'; can't understand '{term}'")
        if m[1] not in allowed:
            raise ValueError(f"field label not supported: {m[1]}")
        terms.append((m[1], "!=" if m[2] == "!=" else "=", m[3]))
    return terms


def match_fields(terms: list[tuple[str, str, str]], fields: dict[str, str]) -> bool:
    return all((fields.get(f, "") == v) == (op == "=") for f, op, v in terms)


def event_fields(ev: dict[str, Any]) -> dict[str, str]:
    obj, meta = ev.get("involvedObject") or {}, ev.get("metadata") or {}
    out = {f"involvedObject.{k}": str(obj.get(k, "")) for k in
           ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")}
    out.update({"metadata.name": meta.get("name", ""), "metadata.namespace": meta.get("namespace", ""),
                "reason": ev.get("reason", ""), "type": ev.get("type", ""),
                "reportingComponent": ev.get("reportingComponent", ""),
                "source": (ev.get("source") or {}).get("component", "")})
    return out


def deployment(namespace: str, name: str, image: str, ready: int = 1) -> dict[str, Any]:
    """An apps/v1 Deployment with one container, as the API returns it."""
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "manager", "image": image}]}}},
            "status": {"replicas": 1, "readyReplicas": ready} if ready else {"replicas": 1}}


def jobset_webhook_configurations(service: tuple[str, str] | None = ("jobset-system", "jobset-webhook-service"),
                                  url: str = "") -> list[dict[str, Any]]:
    """JobSet's Validating/MutatingWebhookConfiguration (config/components/webhook, namePrefix
    jobset-): the JobSet webhooks and the pod webhooks, behind a Service or at a URL."""
    def hook(name: str, path: str, resources: list[str], group: str) -> dict[str, Any]:
        client = {"url": url} if url else {"service": {"namespace": service[0], "name": service[1], "path": path}}
        return {"name": name, "clientConfig": client, "failurePolicy": "Fail", "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "rules": [{"apiGroups": [group], "apiVersions": ["v1alpha2" if group else "v1"],
                           "operations": ["CREATE", "UPDATE"], "resources": resources}]}
    return [{"apiVersion": "admissionregistration.k8s.io/v1", "kind": f"{kind}WebhookConfiguration",
             "metadata": {"name": f"jobset-{kind.lower()}-webhook-configuration"},
             "webhooks": [hook(f"{k}jobset.kb.io", f"/{verb}-jobset-x-k8s-io-v1alpha2-jobset", ["jobsets"], "jobset.x-k8s.io"),
                          hook(f"{k}pod.kb.io", f"/{verb}--v1-pod", ["pods"], "")]}
            for kind, k, verb in (("Validating", "v", "validate"), ("Mutating", "m", "mutate"))]


def pod_name(jobset: str, slice_index: int, host_index: int, attempt: int) -> str:
    suffix = hashlib.md5(f"{jobset}/{attempt}/{slice_index}/{host_index}".encode()).hexdigest()[:5]
    return f"{jobset}-slice-{slice_index}-{host_index}-{suffix}"


def make_pod(jobset: str, slice_index: int, host_index: int, attempt: int, phase: str, *,
             namespace: str = "default", waiting: str | None = None, unschedulable: str | None = None,
             exit_code: int | None = None) -> dict[str, Any]:
    """A JobSet pod with the labels and annotations the JobSet and Job controllers set."""
    name = pod_name(jobset, slice_index, host_index, attempt)
    labels = {
        "jobset.sigs.k8s.io/jobset-name": jobset,
        "jobset.sigs.k8s.io/replicatedjob-name": "slice",
        "jobset.sigs.k8s.io/job-index": str(slice_index),
        "jobset.sigs.k8s.io/job-global-index": str(slice_index),
        "jobset.sigs.k8s.io/restart-attempt": str(attempt),
        "batch.kubernetes.io/job-completion-index": str(host_index),
        "job-name": f"{jobset}-slice-{slice_index}",
        "xrun.dev/run": jobset,
    }
    status: dict[str, Any] = {"phase": phase}
    container: dict[str, Any] = {"name": "workload", "image": "img", "ready": phase == "Running"}
    if phase == "Pending":
        if waiting:
            container["state"] = {"waiting": {"reason": waiting, "message": f'Back-off pulling image "img": {waiting}'}}
            status["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        elif unschedulable:
            status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": unschedulable}]
            container = {}
        else:
            container["state"] = {"waiting": {"reason": "ContainerCreating"}}
    elif phase == "Running":
        container["state"] = {"running": {"startedAt": now_rfc3339()}}
    else:
        code = exit_code if exit_code is not None else (0 if phase == "Succeeded" else 1)
        container["state"] = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}}
    if container:
        status["containerStatuses"] = [container]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels,
                     "annotations": {"batch.kubernetes.io/job-completion-index": str(host_index)},
                     "creationTimestamp": now_rfc3339()},
        # A pod past scheduling has a node (the scheduler's binding sets spec.nodeName); log
        # requests go to that node's kubelet.
        "spec": {"containers": [{"name": "workload", "image": "img"}],
                 **({} if phase == "Pending" and not waiting else {"nodeName": f"node-{slice_index}-{host_index}"})},
        "status": status,
    }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self.server.api.handle(self)

    do_POST = do_DELETE = do_PUT = do_PATCH = do_GET


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    api: KubeAPI


class _Drop(Exception):
    """Close the connection abruptly (no terminating chunk): a dropped stream."""


class KubeAPI:
    def __init__(self, token: str = "xrun-test-token"):
        self.token = token
        self.cond = threading.Condition()
        self.requests: list[Request] = []
        self.rv = 1000
        self.history: list[tuple[int, str, str, str, dict[str, Any]]] = []  # rv, kind, ns, type, obj
        self.namespaces = {"default", "team"}
        self.jobsets: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.logs: dict[str, list[tuple[int, str]]] = {}  # pod name -> [(ns timestamp, line)]
        self.events: list[dict[str, Any]] = []
        self.nodes: list[dict[str, Any]] = []
        self.config_maps: dict[tuple[str, str], dict[str, Any]] = {}
        self.local_queues: dict[tuple[str, str], dict[str, Any]] = {}
        self.priority_classes: list[dict[str, Any]] = []  # scheduling.k8s.io/v1 PriorityClass
        # Deployments (apps/v1) by (namespace, name): the JobSet controller as its release
        # manifests install it (config/default: namespace jobset-system, jobset-controller-manager).
        self.deployments: dict[tuple[str, str], dict[str, Any]] = {
            ("jobset-system", "jobset-controller-manager"): deployment(
                "jobset-system", "jobset-controller-manager", "registry.k8s.io/jobset/jobset:v0.12.0")}
        # JobSet's webhook configurations as its release manifests register them (served by
        # the Service jobset-system/jobset-webhook-service in front of the Deployment above).
        self.webhook_configurations: list[dict[str, Any]] = jobset_webhook_configurations()
        self.crd_installed = True
        # What GET /version reports (apimachinery version.Info; GKE's minor has no "+").
        self.git_version = "v1.31.4-gke.1000"
        self.jobset_versions = ["v1alpha2"]
        # The JobSet controller release serving vjobset.kb.io: from v0.12 its refusals are 422
        # Invalid with causes (jobset #1207), before that 403 Forbidden with the joined errors.
        self.jobset_webhook_version = (0, 12)
        # A template the Job API refuses: "reject" answers the create with 422 Invalid (so no
        # test can pass on a manifest whose Jobs could never exist); "event" is what a real
        # cluster does: it stores the JobSet, and its controller records JobCreationFailed
        # and never makes pods.
        self.job_template_errors = "reject"
        self.kueue_versions: list[str] = []
        # What the LocalQueues' ClusterQueue covers (its resourceGroups' coveredResources):
        # xpk's unless a test says otherwise (admission.XPK_COVERED_RESOURCES).
        self.kueue_covered_resources: tuple[str, ...] = admission.XPK_COVERED_RESOURCES
        self.faults: list[Fault] = []
        self.phases: list[Callable[[KubeAPI, str], None]] = []
        self.hold = 2
        self.phase = -1
        self.reads_in_phase = 0
        self.delete_step_seconds = 0.2
        self.drop_watch_after: dict[str, int] = {}  # kind -> events on the first watch
        self.drop_log_after: dict[str, int] = {}  # pod -> lines on its first follow stream
        self.watch_connections: dict[str, int] = {}
        self.watch_sent: list[tuple[str, int, int]] = []  # kind, connection, resourceVersion
        self.bookmarks_sent: list[tuple[str, int, int]] = []  # the same, for BOOKMARK events
        self.expire_next_watches = 0  # that many watches get 410 Gone (as after compaction)
        self.log_connections: dict[str, int] = {}
        self.log_sent: list[tuple[str, int, str]] = []  # pod, connection, line
        # Watch cache history (k8s.io/apiserver pkg/storage/cacher/watch_cache.go): a watch
        # from a resourceVersion at or below ``compacted_rv`` is too old. The cacher answers it
        # in-stream (cacher.go Watch -> newErrWatcher: a 200 stream with one ERROR event holding
        # a 410 Expired Status); with the watch cache off the etcd3 store's watcher does the
        # same, and ``expired_as_status`` plays a server (or proxy) answering a plain HTTP 410.
        self.compacted_rv = 0
        self.expired_as_status = False
        self.expired_sent = 0  # watches answered 410
        # cacher.go dispatchEvents: with allowWatchBookmarks, a BOOKMARK (only
        # metadata.resourceVersion) reaches quiet watchers; real period ~1 min, here short.
        self.bookmark_seconds = 0.1
        # kube-apiserver --event-ttl (default 1h): events are stored with an etcd lease and
        # vanish after it (pkg/registry/core/event/storage/storage.go TTLFunc).
        self.event_ttl = 3600.0
        # RBAC: cluster-scoped resources this user may not read (e.g. "nodes",
        # "customresourcedefinitions"); the authorizer's refusal is a 403 Forbidden.
        self.forbidden: set[str] = set()
        self.user = "tester"
        # Nodes whose kubelet the apiserver cannot reach: pod log requests proxied to it fail.
        self.kubelets_down: set[str] = set()
        self.log_refused: list[tuple[str, int]] = []  # (pod, status) of log requests answered 5xx
        self.controller: JobSetController | None = None
        self.stopping = False
        self._server: _Server | None = None
        self.ca_pem: bytes | None = None  # set when serving TLS

    # --- lifecycle ------------------------------------------------------------------
    def start(self, tls: bool = False) -> KubeAPI:
        """Serve on 127.0.0.1; ``tls`` serves HTTPS with a fresh self-signed certificate."""
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.api = self
        if tls:
            import ssl

            cert_pem, key_pem = _self_signed_cert()
            self.ca_pem = cert_pem
            folder = Path(tempfile.mkdtemp(prefix="kube-api-tls-"))
            (folder / "cert.pem").write_bytes(cert_pem)
            (folder / "key.pem").write_bytes(key_pem)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(folder / "cert.pem", folder / "key.pem")
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True, name="kube-api").start()
        return self

    def stop(self) -> None:
        if self.controller:
            self.controller.stop()
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server
        scheme = "https" if self.ca_pem else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

    def kubeconfig(self, path: Path, context: str = "test-ctx", token: str | None = None,
                   namespace: str = "default", trust_ca: bool = True) -> Path:
        """A kubeconfig whose context (also the current one) points at this server."""
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": "scripted", "cluster": {"server": self.url, **(
                {"certificate-authority-data": base64.b64encode(self.ca_pem).decode()}
                if self.ca_pem and trust_ca else {})}}],
            "users": [{"name": "tester", "user": {"token": token or self.token}}],
            "contexts": [{"name": context, "context": {"cluster": "scripted", "user": "tester",
                                                       "namespace": namespace}}],
        }
        path.write_text(yaml.safe_dump(cfg))
        return path

    # --- inspection -----------------------------------------------------------------
    def requests_to(self, method: str, pattern: str) -> list[Request]:
        with self.cond:
            return [r for r in self.requests if r.method == method and re.search(pattern, r.path)]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("timed out waiting for the client")
            time.sleep(0.01)

    # --- the world ------------------------------------------------------------------
    def _record(self, kind: str, ns: str, etype: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.history.append((self.rv, kind, ns, etype, copy.deepcopy(obj)))
        self.cond.notify_all()

    def put_pod(self, pod: dict[str, Any]) -> None:
        with self.cond:
            meta = pod["metadata"]
            key = (meta["namespace"], meta["name"])
            etype = "MODIFIED" if key in self.pods else "ADDED"
            self.pods[key] = pod = copy.deepcopy(pod)
            self.logs.setdefault(meta["name"], [])
            self._record("pods", key[0], etype, pod)

    def remove_pod(self, name: str, namespace: str = "default") -> None:
        with self.cond:
            pod = self.pods.pop((namespace, name), None)
            if pod:
                self._record("pods", namespace, "DELETED", pod)

    def pods_of(self, jobset: str, namespace: str = "default") -> list[dict[str, Any]]:
        with self.cond:
            return [copy.deepcopy(p) for (ns, _), p in self.pods.items() if ns == namespace
                    and p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == jobset]

    def set_pods(self, jobset: str, attempt: int, phase: str, namespace: str = "default", **kw: Any) -> list[str]:
        """Every pod of the JobSet's restart ``attempt`` in ``phase``; returns their names."""
        with self.cond:
            js = self.jobsets[(namespace, jobset)]
            names = []
            for rj in js["spec"]["replicatedJobs"]:
                for j in range(rj.get("replicas", 1)):
                    for p in range(rj["template"]["spec"].get("parallelism", 1)):
                        pod = make_pod(jobset, j, p, attempt, phase, namespace=namespace, **kw)
                        old = self.pods.get((namespace, pod["metadata"]["name"]))
                        if old:
                            pod["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"]
                        self.put_pod(pod)
                        names.append(pod["metadata"]["name"])
            return names

    def remove_pods(self, jobset: str, namespace: str = "default") -> None:
        with self.cond:
            for pod in self.pods_of(jobset, namespace):
                self.remove_pod(pod["metadata"]["name"], namespace)

    def set_jobset_status(self, name: str, namespace: str = "default", **status_fields: Any) -> None:
        with self.cond:
            js = self.jobsets[(namespace, name)]
            js.setdefault("status", {}).update(copy.deepcopy(status_fields))
            self._record("jobsets", namespace, "MODIFIED", js)

    def log(self, pod: str, *lines: str) -> None:
        with self.cond:
            for line in lines:
                self.logs.setdefault(pod, []).append((time.time_ns(), line))
            self.cond.notify_all()

    def add_event(self, kind: str, name: str, reason: str, message: str, etype: str = "Warning",
                  namespace: str = "default", uid: str | None = None) -> None:
        with self.cond:
            self.rv += 1
            involved = {"kind": kind, "name": name, "namespace": namespace}
            if uid:
                involved["uid"] = uid
            self.events.append({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{name}.{self.rv}", "namespace": namespace, "resourceVersion": str(self.rv),
                             "creationTimestamp": now_rfc3339()},
                "_stored_at": time.monotonic(),
                "involvedObject": involved,
                "reason": reason, "message": message, "type": etype, "count": 1,
                "lastTimestamp": rfc3339(time.time_ns() // 10**9 * 10**9 + self.rv),
            })

    def fail(self, method: str, path: str, code: int, body: Any, times: int = 1) -> None:
        """The next ``times`` requests matching answer ``code`` with ``body`` (a Status or text)."""
        with self.cond:
            self.faults.append(Fault(method, re.compile(path), code, body, times))

    def script(self, phases: list[Callable[[KubeAPI, str], None]], hold: int = 2) -> None:
        self.phases, self.hold, self.phase = phases, hold, -1

    def _advance(self, name: str) -> None:
        self.phase += 1
        self.reads_in_phase = 0
        self.phases[self.phase](self, name)

    # --- HTTP -----------------------------------------------------------------------
    def handle(self, h: _Handler) -> None:
        parts = urlsplit(h.path)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        req = Request(h.command, parts.path, query, body, dict(h.headers.items()))
        with self.cond:
            self.requests.append(req)
        try:
            if h.headers.get("Authorization") != f"Bearer {self.token}":
                return self._send(h, 401, status(401, "Unauthorized", "Unauthorized"))
            with self.cond:
                for f in self.faults:
                    if f.times > 0 and f.method == h.command and f.path.search(parts.path):
                        f.times -= 1
                        return self._send(h, f.code, f.body)
            self._route(h, req)
        except _Drop:
            h.close_connection = True
            try:
                h.wfile.flush()
                h.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        except (BrokenPipeError, ConnectionResetError):
            h.close_connection = True

    def _send(self, h: _Handler, code: int, obj: Any) -> None:
        if isinstance(obj, str):
            data, ctype = obj.encode(), "text/plain; charset=utf-8"
        else:
            data, ctype = json.dumps(obj).encode(), "application/json"
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _start_stream(self, h: _Handler, ctype: str) -> None:
        h.send_response(200)
        h.send_header("Content-Type", ctype)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

    @staticmethod
    def _chunk(h: _Handler, data: bytes) -> None:
        h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        h.wfile.flush()

    @staticmethod
    def _end_stream(h: _Handler) -> None:
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()

    def _route(self, h: _Handler, req: Request) -> None:
        p, m, q = req.path, req.method, req.query
        if p.rstrip("/") == "/version":
            major, minor = self.git_version.lstrip("v").split(".")[:2]
            return self._send(h, 200, {"major": major, "minor": minor, "gitVersion": self.git_version,
                                       "platform": "linux/amd64"})
        if p.rstrip("/") == "/apis":
            return self._send(h, 200, self._groups())
        if p == CRD_PATH:
            if "customresourcedefinitions" in self.forbidden:
                return self._send(h, 403, self.rbac_denied("get", "customresourcedefinitions", "apiextensions.k8s.io",
                                                           "jobsets.jobset.x-k8s.io"))
            if not self.crd_installed:
                return self._send(h, 404, not_found("customresourcedefinitions", "jobsets.jobset.x-k8s.io",
                                                    "apiextensions.k8s.io"))
            return self._send(h, 200, self._crd())
        if p.startswith(JOBSET_PREFIX):
            return self._jobsets(h, req)
        if p.startswith("/apis/kueue.x-k8s.io/"):
            mm = re.fullmatch(r"/apis/kueue\.x-k8s\.io/([^/]+)/namespaces/([^/]+)/localqueues/([^/]+)", p)
            version = p.split("/")[3]
            if version not in self.kueue_versions:
                return self._send(h, 404, "404 page not found\n")
            if mm:
                lq = self.local_queues.get((mm[2], mm[3]))
                return self._send(h, 200, lq) if lq else self._send(h, 404, not_found("localqueues", mm[3], "kueue.x-k8s.io"))
            return self._send(h, 404, "404 page not found\n")
        if p == "/api/v1/nodes":
            if "nodes" in self.forbidden:
                return self._send(h, 403, self.rbac_denied("list", "nodes", ""))
            sel = q.get("labelSelector", "")
            items = [n for n in self.nodes if match_labels(sel, n["metadata"].get("labels", {}))]
            return self._send(h, 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.rv)}, "items": items})
        if p == "/apis/scheduling.k8s.io/v1/priorityclasses" and m == "GET":
            return self._send(h, 200, {"kind": "PriorityClassList", "apiVersion": "scheduling.k8s.io/v1",
                                       "metadata": {"resourceVersion": str(self.rv)}, "items": self.priority_classes})
        mm = re.fullmatch(r"/apis/admissionregistration\.k8s\.io/v1/(validating|mutating)webhookconfigurations", p)
        if mm and m == "GET":
            kind = f"{mm[1].capitalize()}WebhookConfiguration"
            if f"{mm[1]}webhookconfigurations" in self.forbidden:
                return self._send(h, 403, self.rbac_denied("list", f"{mm[1]}webhookconfigurations",
                                                           "admissionregistration.k8s.io"))
            return self._send(h, 200, {"kind": f"{kind}List", "apiVersion": "admissionregistration.k8s.io/v1",
                                       "metadata": {"resourceVersion": str(self.rv)},
                                       "items": [c for c in self.webhook_configurations if c["kind"] == kind]})
        mm = re.fullmatch(r"/apis/apps/v1/namespaces/([^/]+)/deployments", p)
        if mm and m == "GET":
            return self._send(h, 200, {"kind": "DeploymentList", "apiVersion": "apps/v1",
                                       "metadata": {"resourceVersion": str(self.rv)},
                                       "items": [d for (ns, _), d in sorted(self.deployments.items()) if ns == mm[1]]})
        mm = re.fullmatch(r"/apis/apps/v1/namespaces/([^/]+)/deployments/([^/]+)", p)
        if mm and m == "GET":
            dep = self.deployments.get((mm[1], mm[2]))
            return self._send(h, 200, dep) if dep else self._send(h, 404, not_found("deployments", mm[2], "apps"))
        mm = re.fullmatch(r"/api/v1/namespaces/([^/]+)/configmaps/([^/]+)", p)
        if mm:
            cm = self.config_maps.get((mm[1], mm[2]))
            return self._send(h, 200, cm) if cm else self._send(h, 404, not_found("configmaps", mm[2]))
        mm = re.fullmatch(r"/api/v1/namespaces/([^/]+)/events", p)
        if mm and m == "GET":
            try:
                fields = parse_field_selector(q.get("fieldSelector", ""), EVENT_FIELDS)
            except ValueError as e:
                return self._send(h, 400, status(400, "BadRequest", str(e)))
            with self.cond:
                now = time.monotonic()
                self.events = [e for e in self.events if now - e["_stored_at"] < self.event_ttl]
                items = [{k: v for k, v in copy.deepcopy(e).items() if k != "_stored_at"} for e in self.events
                         if e["metadata"]["namespace"] == mm[1] and match_fields(fields, event_fields(e))]
            return self._send(h, 200, {"kind": "EventList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.rv)}, "items": items})
        mm = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", p)
        if mm and m == "GET":
            if q.get("watch") in ("true", "True", "1"):
                return self._watch(h, "pods", mm[1], q)
            sel = q.get("labelSelector", "")
            with self.cond:
                items = [copy.deepcopy(x) for (ns, _), x in sorted(self.pods.items())
                         if ns == mm[1] and match_labels(sel, x["metadata"]["labels"])]
                rv = str(self.rv)
            return self._send(h, 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": items})
        mm = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)", p)
        if mm and m == "GET":
            with self.cond:
                pod = copy.deepcopy(self.pods.get((mm[1], mm[2])))
            return self._send(h, 200, pod) if pod else self._send(h, 404, not_found("pods", mm[2]))
        mm = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log", p)
        if mm and m == "GET":
            return self._log(h, mm[1], mm[2], q)
        if p == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews" and m == "POST":
            # The authorizer's answer (every user may ask: system:basic-user): allowed unless
            # the resource (or resource/subresource) is in ``forbidden``.
            attrs = ((req.body or {}).get("spec") or {}).get("resourceAttributes") or {}
            res = attrs.get("resource", "")
            full = f"{res}/{attrs['subresource']}" if attrs.get("subresource") else res
            allowed = res not in self.forbidden and full not in self.forbidden
            return self._send(h, 201, {**req.body, "status": {"allowed": allowed, **(
                {} if allowed else {"reason": ""})}})
        return self._send(h, 404, "404 page not found\n")

    def rbac_denied(self, verb: str, resource: str, group: str, name: str = "") -> dict[str, Any]:
        """The authorizer's refusal of a cluster-scoped request as kube-apiserver words it
        (k8s.io/apiserver pkg/endpoints/handlers/responsewriters/errors.go ``forbiddenMessage``
        + ``apierrors.NewForbidden``)."""
        what = f'resource "{resource}" in API group "{group}" at the cluster scope'
        who = f'User "{self.user}" cannot {verb} {what}'
        full = f"{resource}.{group}" if group else resource
        msg = f'{full} "{name}" is forbidden: {who}' if name else f"{full} is forbidden: {who}"
        return status(403, "Forbidden", msg, {"name": name, "group": group, "kind": resource} if name
                      else {"group": group, "kind": resource})

    # --- discovery ------------------------------------------------------------------
    def _groups(self) -> dict[str, Any]:
        groups = []
        for name, versions in (("jobset.x-k8s.io", self.jobset_versions if self.crd_installed else []),
                               ("kueue.x-k8s.io", self.kueue_versions)):
            if versions:
                vs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
                groups.append({"name": name, "versions": vs, "preferredVersion": vs[0]})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def _crd(self) -> dict[str, Any]:
        versions = [{"name": v, "served": True, "storage": i == 0, "schema": {"openAPIV3Schema": {"type": "object"}}}
                    for i, v in enumerate(self.jobset_versions)]
        return {
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "jobsets.jobset.x-k8s.io", "resourceVersion": "1",
                         "annotations": {"controller-gen.kubebuilder.io/version": "v0.16.5"}},
            "spec": {"group": "jobset.x-k8s.io", "scope": "Namespaced",
                     "names": {"plural": "jobsets", "singular": "jobset", "kind": "JobSet", "listKind": "JobSetList"},
                     "versions": versions},
            "status": {"storedVersions": self.jobset_versions[:1]},
        }

    # --- JobSets --------------------------------------------------------------------
    def admit_jobset(self, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None,
                                                          list[admission.Violation]]:
        """(the object to store, the error Status or None, what the Job API will refuse), in
        kube-apiserver's order: mutating admission (mjobset.kb.io decoding the JobSet, then
        Default and the CRD's structural defaults), the apiserver's validation (object metadata, CRD schema), then
        validating admission (vjobset.kb.io ValidateCreate).

        Violations of the ``job`` layer only surface on a real cluster when the controller
        creates the Jobs: see ``job_template_errors`` for how this server plays them.
        """
        obj = admission.default(body)
        name = str(obj.get("metadata", {}).get("name", ""))
        found = admission.violations(obj)
        group = "jobset.x-k8s.io"
        job_errors = [v for v in found if v.layer == admission.JOB]
        errors = [v for v in found if v.layer == admission.MUTATING]
        if errors:
            # The mutating webhook's decode fails first, on the first bad field alone:
            # controller-runtime's admission.Errored(400) with the bare error text.
            return obj, webhook_denial(admission.MUTATING_WEBHOOK,
                                       status(400, "BadRequest", errors[0].upstream_error())), job_errors
        errors = [v for v in found if v.layer == admission.APISERVER]
        if errors:
            return obj, invalid("JobSet", group, name, errors), job_errors
        errors = [v for v in found if v.layer == admission.WEBHOOK]
        if not errors:
            if job_errors and self.job_template_errors == "reject":
                return obj, invalid("JobSet", group, name, job_errors), job_errors
            return obj, None, job_errors
        if self.jobset_webhook_version >= (0, 12):
            # ValidateCreate returns invalidError(): apierrors.NewInvalid over the errors,
            # plain fmt errors wrapped as field.InternalError(nil, err).
            result = invalid("JobSet", group, name, errors)
        else:
            # errors.Join(allErrs...): controller-runtime's admission.Denied (403 Forbidden).
            result = status(403, "Forbidden", "\n".join(
                v.detail if v.field == "<nil>" else v.upstream_error() for v in errors))
        return obj, webhook_denial(admission.VALIDATING_WEBHOOK, result), job_errors

    def _job_creation_failed(self, js: dict[str, Any], errors: list[admission.Violation]) -> str:
        """The JobCreationFailed event text (jobset_controller.go: createJobs joins
        ``job %q creation failed with error: <err>`` per Job; each err is the Job API's
        NewInvalid, with paths relative to the Job)."""
        name = js["metadata"]["name"]
        lines = []
        for i, rj in enumerate(js["spec"]["replicatedJobs"]):
            prefix = f"spec.replicatedJobs[{i}].template."
            mine = [v for v in errors if v.path.startswith(prefix)]
            if not mine:
                continue
            texts = list(dict.fromkeys(v.upstream_error()[len(prefix):] for v in mine))
            agg = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
            for j in range(rj.get("replicas", 1)):
                job = f"{name}-{rj['name']}-{j}"
                lines.append(f'job "{job}" creation failed with error: Job.batch "{job}" is invalid: {agg}')
        return "\n".join(lines)

    def _jobsets(self, h: _Handler, req: Request) -> None:
        p, m = req.path, req.method
        rest = p[len(JOBSET_PREFIX):].split("/")
        version = rest[0]
        if not self.crd_installed or version not in self.jobset_versions:
            return self._send(h, 404, "404 page not found\n")
        if len(rest) == 1:
            return self._send(h, 200, {"kind": "APIResourceList", "apiVersion": "v1",
                                       "groupVersion": f"jobset.x-k8s.io/{version}",
                                       "resources": [{"name": "jobsets", "namespaced": True, "kind": "JobSet",
                                                      "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}]})
        if len(rest) < 4 or rest[1] != "namespaces" or rest[3] != "jobsets":
            return self._send(h, 404, "404 page not found\n")
        ns, name = rest[2], (rest[4] if len(rest) > 4 else None)
        if ns not in self.namespaces:
            return self._send(h, 404, not_found("namespaces", ns))
        with self.cond:
            if name is None and m == "POST":
                body = req.body
                # k8s.io/apiserver pkg/registry/rest/meta.go
                # EnsureObjectNamespaceMatchesRequestNamespace: an object without a namespace
                # takes the request's; a different one is refused.
                body_ns = (body.get("metadata") or {}).get("namespace") if isinstance(body, dict) else None
                if body_ns and body_ns != ns:
                    return self._send(h, 400, status(400, "BadRequest", "the namespace of the provided object "
                                                                        "does not match the namespace sent on the request"))
                js, refusal, job_errors = self.admit_jobset(body)
                js.setdefault("metadata", {})["namespace"] = ns
                if refusal is not None:
                    return self._send(h, refusal["code"], refusal)
                key = (ns, body["metadata"]["name"])
                if req.query.get("dryRun") == "All":  # admitted and defaulted, never stored
                    return self._send(h, 201, js)
                if key in self.jobsets:
                    return self._send(h, 409, status(409, "AlreadyExists",
                                                     f'jobsets.jobset.x-k8s.io "{key[1]}" already exists',
                                                     {"name": key[1], "group": "jobset.x-k8s.io", "kind": "jobsets"}))
                js["metadata"].update(uid=f"uid-{key[1]}", creationTimestamp=now_rfc3339(), generation=1)
                labels = js["metadata"].get("labels") or {}
                if self.kueue_versions and labels.get("kueue.x-k8s.io/queue-name"):
                    # Kueue's JobSet webhook (kueue pkg/controller/jobs/jobset/jobset_webhook.go
                    # Default -> jobframework.ApplyDefaultForSuspend): a queued JobSet is created
                    # suspended; Kueue's workload controller unsuspends it on admission.
                    js["spec"]["suspend"] = True
                js["status"] = {"restarts": 0}
                self.jobsets[key] = js
                self._record("jobsets", ns, "ADDED", js)
                if job_errors:  # the controller cannot create the Jobs: no pods, ever
                    self.add_event("JobSet", key[1], "JobCreationFailed", self._job_creation_failed(js, job_errors),
                                   namespace=ns)
                elif self.phases:
                    self._advance(key[1])
                return self._send(h, 201, js)
            if name is None and m == "GET":
                sel = req.query.get("labelSelector", "")
                items = [copy.deepcopy(x) for (n, _), x in sorted(self.jobsets.items())
                         if n == ns and match_labels(sel, x["metadata"].get("labels", {}))]
                return self._send(h, 200, {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSetList",
                                           "metadata": {"resourceVersion": str(self.rv)}, "items": items})
            js = self.jobsets.get((ns, name))
            if js is None:
                return self._send(h, 404, not_found("jobsets", name, "jobset.x-k8s.io"))
            if m == "GET":
                if self.phases and self.phase < len(self.phases) - 1 and self.reads_in_phase >= self.hold:
                    self._advance(name)
                self.reads_in_phase += 1
                return self._send(h, 200, copy.deepcopy(self.jobsets[(ns, name)]))
            if m == "DELETE":
                self.delete_jobset(name, ns)
                return self._send(h, 200, copy.deepcopy(js))
        return self._send(h, 405, status(405, "MethodNotAllowed", f"{m} not allowed"))

    def delete_jobset(self, name: str, namespace: str = "default") -> None:
        """Foreground deletion (the API call, or the JobSet controller's TTL after finishing)."""
        with self.cond:
            js = self.jobsets.get((namespace, name))
            if js is None or js["metadata"].get("deletionTimestamp"):
                return
            js["metadata"]["deletionTimestamp"] = now_rfc3339()
            js["metadata"]["finalizers"] = ["foregroundDeletion"]
            self._record("jobsets", namespace, "MODIFIED", js)
            threading.Thread(target=self._collect, args=(namespace, name), daemon=True).start()

    def kueue_admit(self, name: str, namespace: str = "default") -> bool:
        """Kueue tries to admit the JobSet's Workload (quota is there). If a pod set requests
        a resource the ClusterQueue does not cover, the flavor assigner answers "resource X
        unavailable in ClusterQueue" (kueue v0.17 pkg/scheduler/flavorassigner/
        flavorassigner.go findFlavorForPodSets, on the totals of pkg/workload/workload.go
        totalRequestsFromPodSets, sidecars included) and the scheduler records a Warning
        ``Pending`` event on the Workload (pkg/scheduler/scheduler.go requeueAndUpdate,
        message from Assignment.Message): it stays suspended, False returned. Else
        spec.suspend goes false (the JobSet controller then resumes it and creates its Jobs)."""
        with self.cond:
            js = self.jobsets[(namespace, name)]
            reasons = []
            for rj in js["spec"]["replicatedJobs"]:
                pod_spec = rj["template"]["spec"]["template"]["spec"]
                missing = admission.kueue_uncovered(pod_spec, self.kueue_covered_resources)
                if missing:  # assignFlavors stops at the first resource it cannot place
                    reasons.append(f"couldn't assign flavors to pod set {rj['name']}: "
                                   f"resource {missing[0]} unavailable in ClusterQueue")
            if reasons:
                # The Workload is named by jobframework GetWorkloadNameForOwnerWithGVK:
                # jobset-<name>-<hash of the owner's uid>.
                suffix = hashlib.sha1(js["metadata"]["uid"].encode()).hexdigest()[:5]
                self.add_event("Workload", f"jobset-{name}-{suffix}", "Pending", "; ".join(reasons),
                               namespace=namespace)
                return False
            js["spec"]["suspend"] = False
            js["metadata"]["generation"] = js["metadata"].get("generation", 1) + 1
            self._record("jobsets", namespace, "MODIFIED", js)
            return True

    def compact(self) -> None:
        """etcd compaction: every resourceVersion up to now is too old to watch from."""
        with self.cond:
            self.compacted_rv = self.rv

    def _collect(self, ns: str, name: str) -> None:
        """Foreground deletion as the garbage collector does it: pods terminate, go, then the JobSet."""
        time.sleep(self.delete_step_seconds)
        with self.cond:
            for pod in self.pods_of(name, ns):
                pod["metadata"]["deletionTimestamp"] = now_rfc3339()
                self.put_pod(pod)
        time.sleep(self.delete_step_seconds)
        with self.cond:
            self.remove_pods(name, ns)
            js = self.jobsets.pop((ns, name), None)
            if js:
                self._record("jobsets", ns, "DELETED", js)

    # --- watch ----------------------------------------------------------------------
    def _watch(self, h: _Handler, kind: str, ns: str, q: dict[str, str]) -> None:
        """A watch as the watch cache serves it (k8s.io/apiserver pkg/storage/cacher).

        ``resourceVersion`` unset or "0": synthetic ADDED events for every object that exists,
        then changes (the "Get State and Start at Most Recent" semantics of the API concepts
        doc; cacher.go Watch -> watch_cache.go getAllEventsSinceLocked with the cache's
        current state); a resourceVersion at or below the compacted one: 410 Expired; with
        ``allowWatchBookmarks``, BOOKMARK events while nothing happens.
        """
        sel = q.get("labelSelector", "")
        rv_param = q.get("resourceVersion") or ""
        bookmarks = q.get("allowWatchBookmarks") in ("true", "True", "1")
        deadline = time.monotonic() + float(q.get("timeoutSeconds") or 300)
        with self.cond:
            self.watch_connections[kind] = conn = self.watch_connections.get(kind, 0) + 1
            drop_after = self.drop_watch_after.get(kind) if conn == 1 else None
            expire = self.expire_next_watches > 0
            self.expire_next_watches -= int(expire)
            initial: list[tuple[int, str, dict[str, Any]]] = []
            if rv_param in ("", "0"):
                since = self.rv
                store = self.pods if kind == "pods" else self.jobsets
                initial = [(int(o["metadata"]["resourceVersion"]), "ADDED", copy.deepcopy(o))
                           for (n, _), o in sorted(store.items())
                           if n == ns and match_labels(sel, o["metadata"].get("labels", {}))]
            else:
                since = int(rv_param)
                expire = expire or since <= self.compacted_rv
            current = self.rv
        if expire:
            with self.cond:
                self.expired_sent += 1
            err = status(410, "Expired", f"too old resource version: {since} ({current})")
            if self.expired_as_status:
                return self._send(h, 410, err)
            self._start_stream(h, "application/json")
            self._chunk(h, json.dumps({"type": "ERROR", "object": err}).encode() + b"\n")
            return self._end_stream(h)
        self._start_stream(h, "application/json")
        sent, last_sent = 0, time.monotonic()
        batch = initial
        while True:
            mark = None
            if not batch:
                with self.cond:
                    batch = [(rv, t, o) for rv, k, n, t, o in self.history
                             if rv > since and k == kind and n == ns and match_labels(sel, o["metadata"].get("labels", {}))]
                    if not batch:
                        if self.stopping or time.monotonic() >= deadline:
                            break
                        if bookmarks and time.monotonic() - last_sent >= self.bookmark_seconds:
                            mark = {"kind": "Pod" if kind == "pods" else "JobSet",
                                    "apiVersion": "v1" if kind == "pods" else "jobset.x-k8s.io/v1alpha2",
                                    "metadata": {"resourceVersion": str(self.rv)}}
                            since = self.rv
                        else:
                            self.cond.wait(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
                            continue
                if mark is not None:
                    self._chunk(h, json.dumps({"type": "BOOKMARK", "object": mark}).encode() + b"\n")
                    with self.cond:
                        self.bookmarks_sent.append((kind, conn, since))
                    last_sent = time.monotonic()
                    continue
            for rv, etype, obj in batch:
                if drop_after is not None and sent >= drop_after:
                    raise _Drop
                self._chunk(h, json.dumps({"type": etype, "object": obj}).encode() + b"\n")
                with self.cond:
                    self.watch_sent.append((kind, conn, rv))
                since, sent = max(since, rv), sent + 1
            batch, last_sent = [], time.monotonic()
        self._end_stream(h)

    # --- logs -----------------------------------------------------------------------
    def _log(self, h: _Handler, ns: str, name: str, q: dict[str, str]) -> None:
        with self.cond:
            pod = self.pods.get((ns, name))
            if pod is None:
                return self._send(h, 404, not_found("pods", name))
            # kubernetes pkg/registry/core/pod/strategy.go streamLocation: no node yet -> 400.
            node = (pod.get("spec") or {}).get("nodeName")
            if not node:
                return self._send(h, 400, status(400, "BadRequest", f"pod {name} does not have a host assigned"))
            # The apiserver proxies the request to the node's kubelet (pod/rest/log.go,
            # LocationStreamer); a dial failure is not an API error: 500 with Go's error text.
            if node in self.kubelets_down:
                self.log_refused.append((name, 500))
                return self._send(h, 500, status(500, "InternalError", (
                    f'Get "https://{node}:10250/containerLogs/{ns}/{name}/workload": '
                    f"dial tcp {node}:10250: connect: connection refused")))
            state = ((pod["status"].get("containerStatuses") or [{}])[0].get("state")) or {}
            if not (state.get("running") or state.get("terminated")):
                reason = (state.get("waiting") or {}).get("reason", "PodInitializing")
                return self._send(h, 400, status(400, "BadRequest",
                                                 f'container "workload" in pod "{name}" is waiting to start: {reason}'))
            follow = q.get("follow") in ("true", "True", "1")
            self.log_connections[name] = conn = self.log_connections.get(name, 0) + 1
            drop_after = self.drop_log_after.get(name) if follow and conn == 1 else None
        stamps = q.get("timestamps") in ("true", "True", "1")
        since_ns = time.time_ns() - int(q["sinceSeconds"]) * 10**9 if "sinceSeconds" in q else None
        tail = int(q["tailLines"]) if "tailLines" in q else None

        def select(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
            out = [x for x in lines if since_ns is None or x[0] >= since_ns]
            return out[-tail:] if tail is not None and tail > 0 else ([] if tail == 0 else out)

        self._start_stream(h, "text/plain")
        with self.cond:
            pending = select(list(self.logs.get(name, [])))
            index = len(self.logs.get(name, []))
        sent = 0
        while True:
            for ts, line in pending:
                if (drop_after is not None and sent >= drop_after) or node in self.kubelets_down:
                    raise _Drop
                text = f"{rfc3339(ts)} {line}" if stamps else line
                self._chunk(h, (text + "\n").encode())
                with self.cond:
                    self.log_sent.append((name, conn, line))
                sent += 1
            if not follow:
                break
            with self.cond:
                lines = self.logs.get(name, [])
                if len(lines) > index:
                    pending, index = lines[index:], len(lines)
                    continue
                pod = self.pods.get((ns, name))
                st = ((pod or {}).get("status", {}).get("containerStatuses") or [{}])[0].get("state") or {}
                if pod is None or st.get("terminated") or self.stopping:
                    break
                if node in self.kubelets_down:
                    raise _Drop  # the kubelet went away under an open stream
                self.cond.wait(timeout=0.05)
                pending = []
        self._end_stream(h)


@dataclass
class Program:
    """What each pod's container does once it runs, played by the fake kubelet: ``lines``
    log lines, one per ``line_every`` seconds, then exit ``exit_code``. ``fail`` makes the
    pod of (host "<slice>-<host>", restart attempt) exit with a code after that many lines
    (137: SIGKILLed). On SIGTERM (pod deletion) it exits ``sigterm_code`` after
    ``sigterm_seconds`` (xrun's workload checkpoints and exits 42), unless the grace period
    ends first (then 137)."""

    lines: int = 5
    line_every: float = 0.02
    exit_code: int = 0
    fail: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    sigterm_seconds: float = 0.05
    sigterm_code: int = 42

    def text(self, host: str, attempt: int, i: int) -> str:
        return f"host {host} attempt {attempt} line {i}"


def tolerates(tol: dict[str, Any], taint: dict[str, Any]) -> bool:
    """kubernetes staging/src/k8s.io/api/core/v1/toleration.go ``ToleratesTaint``."""
    if tol.get("effect") and tol["effect"] != taint.get("effect"):
        return False
    if tol.get("key") and tol["key"] != taint.get("key"):
        return False
    op = tol.get("operator") or "Equal"
    return op == "Exists" or (op == "Equal" and (tol.get("value") or "") == (taint.get("value") or ""))


def node_misfit(pod_spec: dict[str, Any], node: dict[str, Any]) -> str:
    """Why kube-scheduler's filters refuse ``node`` for the pod ('' when it fits):
    NodeAffinity (pkg/scheduler/framework/plugins/nodeaffinity: every nodeSelector entry
    equals a node label) and TaintToleration (plugins/tainttoleration:
    v1helper.FindMatchingUntoleratedTaint over NoSchedule/NoExecute taints)."""
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return "node(s) didn't match Pod's node affinity/selector"
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(
                tolerates(t, taint) for t in pod_spec.get("tolerations") or []):
            return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
    return ""


def pick_node(api: KubeAPI, pod: dict[str, Any]) -> tuple[str | None, str]:
    """The node the scheduler binds ``pod`` to, or why none fits (FailedScheduling's
    "0/N nodes are available: ..."). With no nodes in ``api.nodes`` every pod fits a
    node of its own (the older tests' world). A pod with schedulingGates is not scheduled
    (SchedulingGated). One pod per node: xrun's pods take all of a node's chips
    (NodeResourcesFit: "Insufficient <resource>")."""
    spec = pod["spec"]
    if spec.get("schedulingGates"):
        return None, "pod has schedulingGates"
    if not api.nodes:
        return None, ""
    taken = {p["spec"].get("nodeName") for p in api.pods.values() if p is not pod and p["spec"].get("nodeName")}
    limits = (spec["containers"][0].get("resources") or {}).get("limits") or {}
    resource = next((k for k in limits if "/" in k), "cpu")
    reasons: dict[str, int] = {}
    for node in api.nodes:
        name = node["metadata"]["name"]
        why = node_misfit(spec, node) or (f"Insufficient {resource}" if name in taken else "")
        if not why:
            return name, ""
        reasons[why] = reasons.get(why, 0) + 1
    return None, f"0/{len(api.nodes)} nodes are available: " + ", ".join(
        f"{n} {why}" for why, n in sorted(reasons.items())) + "."


class JobSetController:
    """The JobSet, Job and scheduler controllers and the kubelets, on their own clock.

    Every ``tick`` it reconciles each JobSet from the objects alone, whatever the client
    does (kubernetes-sigs/jobset pkg/controllers/jobset_controller.go ``reconcile``):

    * Suspended (``spec.suspend``, e.g. by Kueue): no Jobs; condition Suspended
      (SuspendedJobs / "jobset is suspended"), resumed with ResumeJobs when unsuspended.
    * Jobs of an older restart attempt are deleted (``deleteJobs``, foreground): their pods
      get a deletionTimestamp and their containers SIGTERM, and are gone when the container
      exits or ``terminationGracePeriodSeconds`` (× ``time_scale``) ends. The next attempt's
      Jobs have the same names, so they are created only once the old ones are gone.
    * A Job fails as the Job controller decides (kubernetes pkg/controller/job/
      pod_failure_policy.go ``matchPodFailurePolicy``: a FailJob rule -> reason
      PodFailurePolicy; else failures beyond ``backoffLimit`` -> BackoffLimitExceeded),
      judged one sync period (``SYNC_JOB_BATCH_PERIOD`` × ``time_scale``) after its first
      failed pod, so that failures within one sync are judged together. As since
      Kubernetes 1.31 (job_controller.go ``delayTerminalCondition``) it first gets
      FailureTarget and its active pods are deleted; it is Failed once none is left.
    * The JobSet controller, ``jobset_latency`` seconds after the first Job's Failed, applies
      its failurePolicy to every Job failed by then (``executeFailurePolicy``): the rules in
      order, the first that any failed Job matches wins, naming the earliest-failed Job it
      matches (``findFirstFailedPolicyRuleAndJob``); none -> RestartJobSet for the first
      failed Job (``findFirstFailedJob``); restarts counted towards maxRestarts beyond it ->
      Failed ReachedMaxRestarts; no failurePolicy -> Failed FailedJobs.
    * All Jobs succeeded (successPolicy All) -> Completed (AllJobsCompleted); a finished
      JobSet is deleted ``ttlSecondsAfterFinished`` later (``ttl_after_finished`` overrides:
      a day is long for a test).

    Pods are scheduled (spec.nodeName) ``schedule_after`` seconds after creation and start
    ``start_after`` later; GKE's TPU webhook runs at pod creation (see ``gke_tpu_env``).
    ``create_error`` makes the Job controller fail every pod creation (quota, a webhook),
    recording FailedCreate on the Job (job_controller.go: "Error creating: <err>").
    """

    def __init__(self, api: KubeAPI, program: Program | None = None, *, tick: float = 0.01,
                 time_scale: float = 0.002, schedule_after: float = 0.03, start_after: float = 0.03,
                 ttl_after_finished: float | None = None, create_error: str | None = None,
                 jobset_latency: float = 0.0):
        self.api, self.program = api, program or Program()
        self.tick, self.time_scale = tick, time_scale
        self.schedule_after, self.start_after = schedule_after, start_after
        self.ttl_after_finished, self.create_error = ttl_after_finished, create_error
        self.rt: dict[str, dict[str, Any]] = {}  # pod uid -> what the kubelet knows
        self.finished: dict[str, float] = {}  # JobSet uid -> when it finished
        self.failed_create: set[str] = set()
        self.event_series: dict[tuple[str, str, str], dict[str, int]] = {}
        self.jobs: dict[tuple[str, int, str], dict[str, Any]] = {}  # (JobSet uid, attempt, Job) -> failure
        self.jobset_latency = jobset_latency
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="jobset-controller")

    def start(self) -> JobSetController:
        self.api.controller = self
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self.api.cond:
                for (ns, name) in list(self.api.jobsets):
                    self._reconcile(ns, name)
            self._stop.wait(self.tick)

    # --- helpers ----------------------------------------------------------------------
    def _event(self, js: dict[str, Any], reason: str, message: str, etype: str = "Normal") -> None:
        """An event as JobSet v0.12 records it: through the events.k8s.io recorder
        (jobset_controller.go: ``r.Record.Eventf(obj, nil, type, reason, "Reconciling", msg)``),
        whose broadcaster (client-go tools/events event_broadcaster.go recordToSink) folds an
        event with the same type, reason, action and object (the message is not part of the
        key) into the first one's series: the second writes ``series.count`` 2, later ones
        only count in the cache until the series is refreshed (30 min) or finished (6 min
        idle), so events undercount repeats."""
        m = js["metadata"]
        key = (m["uid"], etype, reason)
        seen = self.event_series.get(key)
        if seen is None:
            self.event_series[key] = {"count": 1}
            self.api.add_event("JobSet", m["name"], reason, message, etype, namespace=m["namespace"], uid=m["uid"])
            return
        seen["count"] += 1
        if seen["count"] == 2:
            with self.api.cond:
                first = next(e for e in reversed(self.api.events) if e["reason"] == reason and e["type"] == etype
                             and e["involvedObject"].get("uid") == m["uid"])
                first["series"] = {"count": 2, "lastObservedTime": now_rfc3339()}
                self.api.rv += 1
                first["metadata"]["resourceVersion"] = str(self.api.rv)

    def _condition(self, js: dict[str, Any], ctype: str, value: bool, reason: str, message: str,
                   etype: str = "Normal") -> None:
        """jobset_controller.go setCondition / updateCondition: a new condition is added only
        when True; one of the same type is replaced when its status changes, and updated in
        place (keeping lastTransitionTime) when only its reason or message does; each change
        records an event with the condition's reason and message."""
        conds = js["status"].setdefault("conditions", [])
        old = next((c for c in conds if c["type"] == ctype), None)
        new = {"type": ctype, "status": "True" if value else "False", "reason": reason, "message": message,
               "lastTransitionTime": now_rfc3339()}
        if old is None and not value:
            return
        if old is not None:
            if old["status"] == new["status"]:
                if (old["reason"], old["message"]) == (reason, message):
                    return
                new["lastTransitionTime"] = old["lastTransitionTime"]
            conds[conds.index(old)] = new
        else:
            conds.append(new)
        self.api._record("jobsets", js["metadata"]["namespace"], "MODIFIED", js)
        self._event(js, reason, message, etype)

    def _restarting_false(self, js: dict[str, Any], reason: str, message: str) -> None:
        """jobset_controller.go setRestartingConditionFalse (a Normal event if it changed)."""
        self._condition(js, RESTARTING_CONDITION, False, reason, message)

    def _pods(self, ns: str, name: str) -> list[dict[str, Any]]:
        return [p for (n, _), p in list(self.api.pods.items()) if n == ns
                and p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name]

    # --- the JobSet controller ---------------------------------------------------------
    def _reconcile(self, ns: str, name: str) -> None:
        js = self.api.jobsets[(ns, name)]
        meta, spec = js["metadata"], js["spec"]
        st = js.setdefault("status", {})
        if meta.get("deletionTimestamp"):
            return  # the garbage collector's (KubeAPI._collect)
        now = time.monotonic()
        pods = self._pods(ns, name)
        for pod in pods:
            self._kubelet(pod, now)
        pods = self._pods(ns, name)
        done = {c["type"] for c in st.get("conditions", []) if c["status"] == "True"} & {"Completed", "Failed"}
        if done:
            finished = self.finished.setdefault(meta["uid"], now)
            ttl = self.ttl_after_finished
            if ttl is None and spec.get("ttlSecondsAfterFinished") is not None:
                ttl = spec["ttlSecondsAfterFinished"] * self.time_scale
            if ttl is not None and now - finished >= ttl:
                self.api.delete_jobset(name, ns)
            return
        if spec.get("suspend"):  # jobset_controller.go setJobSetSuspendedCondition
            self._condition(js, "Suspended", True, "SuspendedJobs", "jobset is suspended")
            self._restarting_false(js, "JobSetSuspended", "jobset is suspended")
            return
        if any(c["type"] == "Suspended" and c["status"] == "True" for c in st.get("conditions", [])):
            self._condition(js, "Suspended", False, "ResumeJobs", "jobset is resumed")
        attempt = int(st.get("restarts") or 0)
        old = [p for p in pods if int(p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"]) < attempt]
        for pod in old:
            if not pod["metadata"].get("deletionTimestamp"):
                self._terminate(pod, now)
        if old:
            return
        current = [p for p in pods if int(p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"]) == attempt]
        if not current:
            self._create_pods(js, attempt)
            return
        failed, succeeded, ready, total, rj_status = [], 0, 0, 0, []
        global_index = 0
        for rj in spec["replicatedJobs"]:
            job_spec = rj["template"]["spec"]
            parallelism = int(job_spec.get("parallelism", 1))
            counts = {"name": rj["name"], "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0}
            for j in range(int(rj.get("replicas", 1))):
                total += 1
                mine = [p for p in current if p["metadata"]["labels"]["jobset.sigs.k8s.io/job-global-index"]
                        == str(global_index + j)]
                job_name = f"{name}-{rj['name']}-{j}"
                failed_at, reason = self._job_controller(meta["uid"], attempt, job_name, job_spec, mine, now)
                if reason is not None:
                    if failed_at is None:  # FailureTarget: its other pods are terminating
                        counts["active"] += 1
                    else:
                        failed.append((failed_at, global_index + j, rj["name"], job_name, reason))
                        counts["failed"] += 1
                elif len(mine) == parallelism and all(p["status"]["phase"] == "Succeeded" for p in mine):
                    succeeded += 1
                    counts["succeeded"] += 1
                else:
                    counts["active"] += 1
                    if len(mine) == parallelism and all(p["status"]["phase"] == "Running" for p in mine):
                        ready += 1
                        counts["ready"] += 1
            global_index += int(rj.get("replicas", 1))
            rj_status.append(counts)
        if st.get("replicatedJobsStatus") != rj_status:
            st["replicatedJobsStatus"] = rj_status
            self.api._record("jobsets", ns, "MODIFIED", js)
        if ready + succeeded == total:  # jobset_controller.go reconcile: allJobsReady
            self._restarting_false(js, "JobsReady", "all jobs are ready")
        if failed:
            # The JobSet controller acts on the Jobs failed when it syncs, some time after
            # the first Job's Failed condition (its informer and queue: ``jobset_latency``).
            if now >= min(f[0] for f in failed) + self.jobset_latency:
                self._failure_policy(js, sorted(failed))
        elif succeeded == total:
            # jobset_controller.go setJobSetCompletedCondition
            self._condition(js, "Completed", True, "AllJobsCompleted", "jobset completed successfully")
            self._restarting_false(js, "JobSetCompleted", "jobset completed successfully")

    def _job_controller(self, js_uid: str, attempt: int, job: str, job_spec: dict[str, Any],
                        pods: list[dict[str, Any]], now: float) -> tuple[float | None, str | None]:
        """(when the Job got its Failed condition or None, its failure reason or None), as the
        Job controller of Kubernetes >= 1.31 gets there (job_controller.go syncJob with
        delayTerminalCondition): once it judges the Job failed (``_job_failed``) it sets
        FailureTarget and deletes the Job's active pods (deleteActivePods: SIGTERM, the
        grace period), and sets Failed, the condition JobSet reads and orders by, only when
        none is left running or terminating (enactJobFinished)."""
        key = (js_uid, attempt, job)
        state = self.jobs.get(key)
        if state is None:
            decided = self._job_failed(job_spec, pods, now)
            if not decided:
                return None, None
            state = self.jobs[key] = {"reason": decided[1], "failed_at": None}
            for pod in pods:
                if pod["status"]["phase"] in ("Pending", "Running") and not pod["metadata"].get("deletionTimestamp"):
                    self._terminate(pod, now)
        if state["failed_at"] is None and not any(p["status"]["phase"] in ("Pending", "Running") for p in pods):
            state["failed_at"] = now
        return state["failed_at"], state["reason"]

    def _job_failed(self, job_spec: dict[str, Any], pods: list[dict[str, Any]],
                    now: float) -> tuple[float, str] | None:
        """(when its first pod failed, the Job's failure reason) once the Job controller has
        synced after that failure, else None: pods that fail within one sync period of each
        other are judged together (a FailJob match among them wins, ``job_failure``)."""
        first = min((self.rt.get(p["metadata"]["uid"], {}).get("ended", now) for p in pods
                     if p["status"]["phase"] == "Failed"), default=None)
        if first is None or now < first + SYNC_JOB_BATCH_PERIOD * self.time_scale:
            return None
        reason = job_failure(job_spec, pods)
        return (first, reason) if reason else None

    def _failure_policy(self, js: dict[str, Any], failed: list[tuple[float, int, str, str, str]]) -> None:
        """jobset pkg/controllers/failure_policy.go executeFailurePolicy and its action
        appliers, with the conditions and events they record. ``failed``: (Failed time,
        global index, replicatedJob, Job, reason) of every Job failed by now, oldest first."""
        policy = js["spec"].get("failurePolicy")
        st = js["status"]
        first_failed = failed[0][3]  # findFirstFailedJob (ties: list order)
        if policy is None:
            self._failed(js, "FailedJobs", f"jobset failed due to one or more job failures (first failed job: {first_failed})")
            return
        rule, job = first_failed_policy_rule_and_job(policy.get("rules") or [], failed)
        if rule is None:  # defaultFailurePolicyRuleAction
            action, rule_name, job_name = "RestartJobSet", None, first_failed
        else:
            action, rule_name, job_name = rule["action"], rule.get("name"), job
        if action == "FailJobSet":
            self._failed(js, "FailJobSetFailurePolicyAction",
                         f"applying FailJobSet failure policy action (first failed job: {job_name})")
            return
        if action == "RestartJobSet" and int(st.get("restartsCountTowardsMax") or 0) >= int(policy.get("maxRestarts", 0)):
            self._failed(js, "ReachedMaxRestarts",
                         f"jobset failed due to reaching max number of restarts (first failed job: {job_name})")
            return
        # restartJobSetActionApplier / restartJobSetAndIgnoreMaxRestartsActionApplier ->
        # failurePolicyRecreateAll: restarts+1, the RestartingJobSet condition (reason
        # FailurePolicy_<rule>, or DefaultFailurePolicy when no rule matched: an event only
        # if the condition changed), then always the action's event.
        st["restarts"] = int(st.get("restarts") or 0) + 1
        if action == "RestartJobSet":
            st["restartsCountTowardsMax"] = int(st.get("restartsCountTowardsMax") or 0) + 1
        message = f"applying {action} failure policy action (first failed job: {job_name})"
        self._condition(js, RESTARTING_CONDITION, True,
                        f"FailurePolicy_{rule_name}" if rule_name else "DefaultFailurePolicy", message, "Warning")
        self.api._record("jobsets", js["metadata"]["namespace"], "MODIFIED", js)
        self._event(js, f"{action}FailurePolicyAction", message, "Warning")

    def _failed(self, js: dict[str, Any], reason: str, message: str) -> None:
        """failure_policy.go setJobSetFailedCondition: Failed (a Warning event), then the
        RestartingJobSet condition False (JobSetFailed) if it exists."""
        self._condition(js, "Failed", True, reason, message, "Warning")
        self._restarting_false(js, "JobSetFailed", "jobset failed")

    def _create_pods(self, js: dict[str, Any], attempt: int) -> None:
        """The Jobs' pods as JobSet's constructJob and the Job controller make them."""
        meta, spec = js["metadata"], js["spec"]
        name, ns = meta["name"], meta["namespace"]
        network = spec.get("network") or {}
        subdomain = network.get("subdomain") or name if network.get("enableDNSHostnames", True) else ""
        global_index = 0
        for rj in spec["replicatedJobs"]:
            job_spec = rj["template"]["spec"]
            for j in range(int(rj.get("replicas", 1))):
                job = f"{name}-{rj['name']}-{j}"
                if self.create_error:
                    if job not in self.failed_create:
                        self.failed_create.add(job)
                        self.api.add_event("Job", job, "FailedCreate", f"Error creating: {self.create_error}",
                                           namespace=ns, uid=f"uid-{job}-{attempt}")
                    continue
                for p in range(int(job_spec.get("parallelism", 1))):
                    self.api.put_pod(self._pod(js, rj, job, global_index + j, j, p, attempt, subdomain))
            global_index += int(rj.get("replicas", 1))

    def _pod(self, js: dict[str, Any], rj: dict[str, Any], job: str, global_index: int, j: int, p: int,
             attempt: int, subdomain: str) -> dict[str, Any]:
        name, ns = js["metadata"]["name"], js["metadata"]["namespace"]
        job_spec = rj["template"]["spec"]
        tmpl = copy.deepcopy(job_spec["template"])
        suffix = hashlib.md5(f"{job}/{attempt}/{p}".encode()).hexdigest()[:5]
        pod_name_ = f"{job}-{p}-{suffix}"
        labels = {**(tmpl.get("metadata") or {}).get("labels", {}),
                  "jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": rj["name"],
                  "jobset.sigs.k8s.io/job-index": str(j), "jobset.sigs.k8s.io/job-global-index": str(global_index),
                  "jobset.sigs.k8s.io/restart-attempt": str(attempt), "job-name": job,
                  "batch.kubernetes.io/job-completion-index": str(p)}
        annotations = {**(tmpl.get("metadata") or {}).get("annotations", {}),
                       "batch.kubernetes.io/job-completion-index": str(p)}
        pod_spec = tmpl["spec"]
        if job_spec.get("completionMode") == "Indexed":
            pod_spec["hostname"] = f"{job}-{p}"  # job controller: $(job-name)-$(index)
        if subdomain:
            pod_spec["subdomain"] = subdomain
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": pod_name_, "namespace": ns, "uid": f"uid-{pod_name_}", "labels": labels,
                            "annotations": annotations, "creationTimestamp": now_rfc3339()},
               "spec": pod_spec, "status": {"phase": "Pending"}}
        gke_tpu_env(pod, job_spec, job)
        return pod

    # --- scheduler + kubelet ------------------------------------------------------------
    def _terminate(self, pod: dict[str, Any], now: float) -> None:
        grace = float(pod["spec"].get("terminationGracePeriodSeconds", 30)) * self.time_scale
        pod["metadata"]["deletionTimestamp"] = now_rfc3339()
        pod["metadata"]["deletionGracePeriodSeconds"] = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
        rt = self.rt.setdefault(pod["metadata"]["uid"], {"created": now, "emitted": 0})
        if self.program.sigterm_seconds < grace:
            rt["exit_at"], rt["exit_code"] = now + self.program.sigterm_seconds, self.program.sigterm_code
        else:
            rt["exit_at"], rt["exit_code"] = now + grace, 137  # SIGKILL at the end of the grace period
        self.api.put_pod(pod)

    def _kubelet(self, pod: dict[str, Any], now: float) -> None:
        meta, status_ = pod["metadata"], pod["status"]
        rt = self.rt.setdefault(meta["uid"], {"created": now, "emitted": 0})
        phase = status_["phase"]
        if meta.get("deletionTimestamp"):
            if phase in ("Succeeded", "Failed") or phase == "Pending":
                self.api.remove_pod(meta["name"], meta["namespace"])
            elif now >= rt["exit_at"]:
                self._exit(pod, rt["exit_code"], now)
            return
        if phase == "Pending":
            if "scheduled" not in rt and now - rt["created"] >= self.schedule_after:
                node, why = pick_node(self.api, pod)
                if why:  # Unschedulable until a node fits (retried every tick, reported once)
                    if rt.get("unschedulable") != why:
                        rt["unschedulable"] = why
                        status_["conditions"] = [{"type": "PodScheduled", "status": "False",
                                                  "reason": "Unschedulable", "message": why}]
                        self.api.put_pod(pod)
                        self.api.add_event("Pod", meta["name"], "FailedScheduling", why, namespace=meta["namespace"])
                    return
                rt["scheduled"] = now
                pod["spec"]["nodeName"] = node or f"gke-node-{meta['labels']['jobset.sigs.k8s.io/job-global-index']}-" \
                                                  f"{meta['labels']['batch.kubernetes.io/job-completion-index']}"
                status_["conditions"] = [{"type": "PodScheduled", "status": "True"}]
                status_["containerStatuses"] = [{"name": c["name"], "ready": False, "restartCount": 0, "image": c.get("image", ""),
                                                 "state": {"waiting": {"reason": "ContainerCreating"}}}
                                                for c in pod["spec"]["containers"]]
                self.api.put_pod(pod)
            elif "scheduled" in rt and now - rt["scheduled"] >= self.start_after:
                rt["started"] = now
                status_["phase"] = "Running"
                for cs in status_["containerStatuses"]:
                    cs.update(ready=True, state={"running": {"startedAt": now_rfc3339()}})
                self.api.put_pod(pod)
            return
        if phase != "Running":
            return
        host = f"{meta['labels']['jobset.sigs.k8s.io/job-global-index']}-{meta['labels']['batch.kubernetes.io/job-completion-index']}"
        attempt = int(meta["labels"]["jobset.sigs.k8s.io/restart-attempt"])
        fail = self.program.fail.get((host, attempt))
        due = int((now - rt["started"]) / self.program.line_every)
        while rt["emitted"] < min(due, self.program.lines):
            if fail and rt["emitted"] >= fail[0]:
                break
            self.api.log(meta["name"], self.program.text(host, attempt, rt["emitted"]))
            rt["emitted"] += 1
        if fail and rt["emitted"] >= fail[0]:
            self._exit(pod, fail[1], now)
        elif rt["emitted"] >= self.program.lines and due > self.program.lines:
            self._exit(pod, self.program.exit_code, now)

    def _exit(self, pod: dict[str, Any], code: int, now: float) -> None:
        self.rt[pod["metadata"]["uid"]]["ended"] = now  # when _job_failed's window opens
        status_ = pod["status"]
        status_["phase"] = "Succeeded" if code == 0 else "Failed"
        for cs in status_.get("containerStatuses") or []:
            started = (cs.get("state") or {}).get("running", {}).get("startedAt", now_rfc3339())
            cs.update(ready=False, state={"terminated": {
                "exitCode": code, "reason": "Completed" if code == 0 else "Error",
                "startedAt": started, "finishedAt": now_rfc3339()}})
        self.api.put_pod(pod)


def first_failed_policy_rule_and_job(rules: list[dict[str, Any]], failed: list[tuple[float, int, str, str, str]]
                                     ) -> tuple[dict[str, Any] | None, str | None]:
    """jobset v0.12.0 pkg/controllers/failure_policy.go findFirstFailedPolicyRuleAndJob: the
    rules in order; for each, the earliest-failed Job it applies to (ruleIsApplicable:
    onJobFailureReasons, targetReplicatedJobs; a strictly earlier failure replaces the
    match, so ties keep list order); the first rule with a match wins. (rule, Job name)."""
    for rule in rules:
        match = None
        for failed_at, _, rj_name, job_name, reason in failed:
            reasons, targets = rule.get("onJobFailureReasons") or [], rule.get("targetReplicatedJobs") or []
            applies = (not reasons or reason in reasons) and (not targets or rj_name in targets)
            if applies and (match is None or failed_at < match[0]):
                match = (failed_at, job_name)
        if match is not None:
            return rule, match[1]
    return None, None


def job_failure(job_spec: dict[str, Any], pods: list[dict[str, Any]]) -> str | None:
    """Why the Job controller fails a Job with these pods, or None (kubernetes
    pkg/controller/job/pod_failure_policy.go ``matchPodFailurePolicy`` and
    job_controller.go: failures counted against ``backoffLimit``, default 6)."""
    counted = 0
    for pod in pods:
        if pod["status"]["phase"] != "Failed":
            continue
        action = "Count"
        for cs in pod["status"].get("containerStatuses") or []:
            code = ((cs.get("state") or {}).get("terminated") or {}).get("exitCode")
            for rule in (job_spec.get("podFailurePolicy") or {}).get("rules") or []:
                on = rule.get("onExitCodes")
                if not on or code in (None, 0) or (on.get("containerName") not in (None, cs["name"])):
                    continue
                if (code in on.get("values", [])) == (on.get("operator") == "In"):
                    action = rule["action"]
                    break
            if action != "Count":
                break
        if action == "FailJob":
            return "PodFailurePolicy"
        counted += action == "Count"
    return "BackoffLimitExceeded" if counted > int(job_spec.get("backoffLimit", 6)) else None


TPU_RESOURCE = "google.com/tpu"


def gke_tpu_env(pod: dict[str, Any], job_spec: dict[str, Any], job_name: str) -> bool:
    """GKE's TPU mutating webhook: TPU_WORKER_ID and TPU_WORKER_HOSTNAMES, only "when a Job is
    created with the completionMode: Indexed, subdomain, parallelism > 1, and requesting
    google.com/tpu properties" (GKE docs, "Deploy TPU workloads in GKE Standard", multi-host
    slices). TPU_WORKER_ID is the completion index; the hostnames are the Indexed Job's pod
    hostnames ``<job>-<i>.<subdomain>``, in index order. Returns whether it injected."""
    spec = pod["spec"]
    parallelism = int(job_spec.get("parallelism", 1))
    subdomain = spec.get("subdomain")
    tpu = [c for c in spec.get("containers", [])
           if TPU_RESOURCE in ((c.get("resources") or {}).get("requests") or {})
           or TPU_RESOURCE in ((c.get("resources") or {}).get("limits") or {})]
    if job_spec.get("completionMode") != "Indexed" or parallelism <= 1 or not subdomain or not tpu:
        return False
    index = pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
    hosts = ",".join(f"{job_name}-{i}.{subdomain}" for i in range(parallelism))
    for c in tpu:
        env = c.setdefault("env", [])
        names = {e.get("name") for e in env}
        env.extend(e for e in ({"name": "TPU_WORKER_ID", "value": index},
                               {"name": "TPU_WORKER_HOSTNAMES", "value": hosts}) if e["name"] not in names)
    return True


def _self_signed_cert() -> tuple[bytes, bytes]:
    """A throwaway certificate for 127.0.0.1 (IP SAN), and its key, as PEM."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-api-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem
