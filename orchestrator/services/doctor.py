"""``xrun doctor``: can this cluster and storage root run xrun's JobSets? One line per check.

Checks, in order: the API answers, and its Kubernetes runs native sidecars (>= 1.29: every
pod's log shipper is one; an older server fails the check); the JobSet CRD is installed
and serves ``v1alpha2`` (falling back to API discovery when RBAC hides CRDs); the JobSet
controller's version (its Deployment's image tag: job-global-index needs >= 0.6, xrun targets
0.12), telling "RBAC forbids me to look" from "not there", and where no Deployment shows it,
JobSet's webhooks answering a dry-run create; RBAC lets this user do what xrun does in the
namespace (SelfSubjectAccessReviews, naming each verb and resource missing); the Kueue LocalQueue exists when a
queue is named; nodes carry the accelerator, TPU topology and machine-type labels the
manifest's nodeSelector asks for, or a cluster autoscaler could add them; the storage root
takes a write from here; and, given a full run spec (``-f run.yaml``), a pod on the target
node pool takes one too (``pod-storage``: a probe JobSet with the run's pod settings, see
``manifests.probe``). That last one matters because TPU pods use hostNetwork, where GKE
Workload Identity does not apply: GCS sees the node pool's service account and scopes, not
``--service-account``. Everything goes through :class:`KubeBackend` (the official
client) and the storage interface; nothing shells out.

Exit code: 3 when the API or the storage root cannot be reached (nothing else can be
trusted), 1 when any other check fails, 0 otherwise (warnings included).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from manifests.catalogue import Shape
from manifests.jobset import capacity_placement, pod_spec, uses_pod_code, xrun_image_of
from manifests.spec import QUEUE_NONE, RunSpec
from orchestrator.backends.kube.backend import (
    INSTALL_HINT,
    JOBSET_CRD,
    KUEUE_GROUP,
    VERSION,
    KubeBackend,
    sidecar_problem,
)
from xrun_contract import PROBE_RE
from xrun_contract.errors import XrunError
from xrun_contract.k8s import JOBSET_GROUP, Labels

OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"
AUTOSCALER_STATUS = ("kube-system", "cluster-autoscaler-status")
# Where JobSet's release manifests install the controller (config/default: namespace
# jobset-system, namePrefix jobset-, Deployment controller-manager).
JOBSET_CONTROLLER = ("jobset-system", "jobset-controller-manager")
# jobset.sigs.k8s.io/job-global-index (XRUN_SLICE_INDEX, MEGASCALE_SLICE_ID) arrived in v0.6.0;
# the webhook rules manifests.admission mirrors are v0.12's.
JOBSET_MIN, JOBSET_TARGET = (0, 6), (0, 12)
PROBE_TIMEOUT_S = 300.0
GCS_SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",
              "https://www.googleapis.com/auth/devstorage.full_control",
              "https://www.googleapis.com/auth/cloud-platform")


@dataclass
class Check:
    name: str
    result: str  # ok | warn | FAIL | skip
    detail: str
    exit_code: int = 0  # what a FAIL means for the command's exit code

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_api(backend: KubeBackend) -> Check:
    return api_check(backend)[0]


def api_check(backend: KubeBackend) -> tuple[Check, bool]:
    """The API's check and whether it answered. A server that answers but is too old for
    native sidecars (``sidecar_problem``) fails the check, and the other checks still run."""
    try:
        version = backend.server_version()
    except XrunError as e:
        return Check("api", FAIL, str(e), e.exit_code), False
    where = (f"API reachable at {backend.host} (context {backend.context_name or '?'}, "
             f"Kubernetes {version}), namespace {backend.namespace}")
    problem = sidecar_problem(version)
    if problem:
        return Check("api", FAIL, f"{where}; {problem}", 1), True
    return Check("api", OK, where), True


def check_jobset(backend: KubeBackend) -> Check:
    try:
        crd = backend.jobset_crd()
    except XrunError as e:
        if e.exit_code != 1 or "forbidden" not in str(e):
            return Check("jobset", FAIL, str(e), e.exit_code)
        return _jobset_by_discovery(backend)
    if crd is None:
        return Check("jobset", FAIL, f"JobSet CRD {JOBSET_CRD} not installed; {INSTALL_HINT}", 1)
    versions = (crd.get("spec") or {}).get("versions") or []
    served = [v.get("name", "") for v in versions if v.get("served")]
    stored = next((v.get("name") for v in versions if v.get("storage")), "?")
    if VERSION not in served:
        return Check("jobset", FAIL, f"JobSet CRD serves {', '.join(served) or 'nothing'}, xrun needs {VERSION}: "
                                     f"upgrade JobSet ({INSTALL_HINT})", 1)
    return Check("jobset", OK, f"JobSet CRD {JOBSET_CRD} installed: served {', '.join(served)} "
                               f"(storage {stored}); xrun uses {VERSION}")


def _jobset_by_discovery(backend: KubeBackend) -> Check:
    group = JOBSET_CRD.split(".", 1)[1]
    try:
        entry = backend.api_group(group)
    except XrunError as e:
        return Check("jobset", FAIL, str(e), e.exit_code)
    served = [v.get("version", "") for v in (entry or {}).get("versions") or []]
    if VERSION not in served:
        what = f"serves {', '.join(served)}" if served else "is not served"
        return Check("jobset", FAIL, f"{group} {what}; xrun needs {VERSION} ({INSTALL_HINT})", 1)
    return Check("jobset", OK, f"JobSet API {group}/{VERSION} served (served {', '.join(served)}; "
                               "the CRD itself is not readable with your RBAC)")


def _version(tag: str) -> tuple[int, ...] | None:
    import re

    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", tag)
    return tuple(int(x) for x in m.groups("0")) if m else None


def check_jobset_controller(backend: KubeBackend) -> Check:
    """The controller's release, from its Deployment's image tag (the CRD does not carry it).

    Looked for where JobSet's release manifests put it; else through what the API shows:
    the webhook configurations that register JobSet's own webhooks (``vjobset.kb.io``,
    ``mjobset.kb.io``; Kueue registers webhooks of the same names, so a configuration that
    also serves Kueue's resources does not count), the Deployment behind their Service, and
    a dry-run JobSet create that only passes, defaulted, when those webhooks answer (the
    controller serves them from the same process)."""
    ns, name = JOBSET_CONTROLLER
    try:
        dep = backend.deployment(ns, name)
    except XrunError as e:
        if e.exit_code == 1 and "forbidden" in str(e):
            return Check("jobset-controller", WARN, f"RBAC forbids reading Deployment {ns}/{name}, so its version is "
                                                    f"unchecked (needs get on deployments.apps in {ns}); xrun needs "
                                                    f"JobSet >= {_release(JOBSET_MIN)}, "
                                                    f"targets {_release(JOBSET_TARGET)}")
        return Check("jobset-controller", FAIL, str(e), e.exit_code)
    if dep is not None:
        return _controller_deployment(dep)
    return _controller_from_api(backend, f"Deployment {ns}/{name}")


def _release(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def _controller_deployment(dep: dict[str, Any]) -> Check:
    meta = dep.get("metadata") or {}
    containers = (((dep.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
    image = next((c.get("image", "") for c in containers if "jobset" in c.get("image", "")),
                 containers[0].get("image", "") if containers else "")
    tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
    version = _version(tag)
    ready = (dep.get("status") or {}).get("readyReplicas") or 0
    where = f"{meta.get('namespace', '?')}/{meta.get('name', '?')} runs {image or '?'} ({ready} ready)"
    if version is None:
        return Check("jobset-controller", WARN, f"{where}: no release in the image tag; xrun targets "
                                                f"v{_release(JOBSET_TARGET)}")
    if version[:2] < JOBSET_MIN:
        return Check("jobset-controller", FAIL, f"{where}: older than v{_release(JOBSET_MIN)}, which "
                                                f"sets the job-global-index label every pod reads; {INSTALL_HINT}", 1)
    if not ready:
        return Check("jobset-controller", FAIL, f"{where}: no ready replica, JobSets would not be reconciled", 1)
    if version[:2] < JOBSET_TARGET:
        return Check("jobset-controller", WARN, f"{where}: works, but xrun's admission rules are v"
                                                f"{_release(JOBSET_TARGET)}'s; upgrade ({INSTALL_HINT})")
    return Check("jobset-controller", OK, where)


def jobset_webhooks(configurations: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(configuration name, webhook) for each webhook of JobSet's own configurations: those
    with a webhook on jobset.x-k8s.io jobsets and none on Kueue's resources (Kueue's JobSet
    integration registers ``vjobset.kb.io``/``mjobset.kb.io`` too)."""

    def groups(w: dict[str, Any]) -> set[str]:
        return {g for r in w.get("rules") or [] for g in r.get("apiGroups") or []}

    def on_jobsets(w: dict[str, Any]) -> bool:
        return any(JOBSET_GROUP in (r.get("apiGroups") or []) and "jobsets" in (r.get("resources") or [])
                   for r in w.get("rules") or [])

    out = []
    for conf in configurations:
        hooks = conf.get("webhooks") or []
        if any(on_jobsets(w) for w in hooks) and not any(KUEUE_GROUP in groups(w) for w in hooks):
            out += [((conf.get("metadata") or {}).get("name", "?"), w) for w in hooks if on_jobsets(w)]
    return out


def _probe_jobset(name: str) -> dict[str, Any]:
    """The smallest JobSet, left for JobSet's mutating webhook to default (dry run only)."""
    return {"apiVersion": f"{JOBSET_GROUP}/{VERSION}", "kind": "JobSet", "metadata": {"name": name},
            "spec": {"replicatedJobs": [{"name": "probe", "replicas": 1, "template": {"spec": {"template": {
                "spec": {"containers": [{"name": "probe", "image": "registry.k8s.io/pause:3.10"}]}}}}}]}}


def _controller_from_api(backend: KubeBackend, looked: str) -> Check:
    need = f"xrun needs JobSet >= {_release(JOBSET_MIN)}, targets {_release(JOBSET_TARGET)}"
    try:
        hooks: list[tuple[str, dict[str, Any]]] | None = jobset_webhooks(backend.webhook_configurations())
    except XrunError as e:
        if e.exit_code != 1 or "forbidden" not in str(e):
            return Check("jobset-controller", FAIL, str(e), e.exit_code)
        hooks = None  # RBAC hides them: the dry run below still tells
    if hooks == []:
        return Check("jobset-controller", FAIL, f"no JobSet controller: no {looked}, and no webhook configuration "
                                                "registers JobSet's webhooks (vjobset.kb.io, mjobset.kb.io; "
                                                f"Kueue's of the same names do not count), so JobSets would never "
                                                f"get Jobs; {INSTALL_HINT}", 1)
    served_by = sorted({(w.get("clientConfig") or {}).get("url") or "service {namespace}/{name}".format(
        **((w.get("clientConfig") or {}).get("service") or {"namespace": "?", "name": "?"})) for _, w in hooks or []})
    # A Service in front of the webhooks: the controller's Deployment is beside it.
    for ns in sorted({((w.get("clientConfig") or {}).get("service") or {}).get("namespace", "")
                      for _, w in hooks or []} - {""}):
        with contextlib.suppress(XrunError):
            deps = [d for d in backend.deployments(ns)
                    if any("jobset" in c.get("image", "") for c in
                           (((d.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or [])]
            if deps:
                return _controller_deployment(deps[0])
    names = ", ".join(sorted({f"{w.get('name', '?')} ({conf})" for conf, w in hooks or []}))
    registered = (f"JobSet's webhooks {names} are registered, served by {', '.join(served_by)}"
                  if hooks else "the webhook configurations are not readable with your RBAC")
    try:
        got = backend.dry_run_jobset(_probe_jobset(f"xrun-doctor-{uuid.uuid4().hex[:8]}"))
    except XrunError as e:
        if e.exit_code == 1 and "forbidden: RBAC" in str(e):
            return Check("jobset-controller", WARN, f"no {looked}; {registered}; a dry-run JobSet create would "
                                                    f"prove they answer, but {e}; {need}")
        if e.exit_code == 1 and "webhook could not be called" in str(e):
            return Check("jobset-controller", FAIL, f"no {looked}; {registered}, but they do not answer, so every "
                                                    f"JobSet create is refused: {e}", 1)
        return Check("jobset-controller", FAIL, f"no {looked}; a dry-run JobSet create failed: {e}", e.exit_code)
    network = (got.get("spec") or {}).get("network") or {}
    if network.get("enableDNSHostnames") is not True:
        return Check("jobset-controller", FAIL, f"no JobSet controller: no {looked}, and a dry-run JobSet came back "
                                                "without JobSet's defaults (spec.network.enableDNSHostnames), so "
                                                f"JobSet's mutating webhook did not run; {INSTALL_HINT}", 1)
    return Check("jobset-controller", WARN, f"JobSet controller answers: {registered}, and a dry-run JobSet "
                                            "passed them, defaulted by JobSet's mutating webhook; its release is "
                                            f"unknown (no {looked} and no Deployment behind the webhooks to read "
                                            f"an image tag from); {need}")


def check_rbac(backend: KubeBackend) -> Check:
    """Whether this user may do what xrun's cluster backend does in the namespace (the same
    rules the nightly's Role grants), each asked of the API server's authorizer with a
    SelfSubjectAccessReview. A missing one is named as the verb and resource to allow."""
    from manifests.nightly import RBAC_RULES

    missing: dict[str, list[str]] = {}
    asked = 0
    try:
        for rule in RBAC_RULES:
            for group in rule["apiGroups"]:
                for res in rule["resources"]:
                    resource, _, sub = res.partition("/")
                    # A subresource such as pods/log is only read (GET): list/watch mean nothing there.
                    for verb in (["get"] if sub else rule["verbs"]):
                        asked += 1
                        allowed, _reason = backend.can(verb, group, resource, sub)
                        if not allowed:
                            missing.setdefault(f"{res}.{group}" if group else res, []).append(verb)
    except XrunError as e:
        if e.exit_code == 1:
            return Check("rbac", WARN, f"cannot ask the API server what RBAC allows: {e}")
        return Check("rbac", FAIL, str(e), e.exit_code)
    ns, ctx = backend.namespace, backend.context_name or "?"
    if missing:
        named = "; ".join(f"verb{'s' if len(verbs) > 1 else ''} {', '.join(repr(v) for v in verbs)} on resource {r!r}"
                          for r, verbs in missing.items())
        return Check("rbac", FAIL, f"RBAC must allow {named} in namespace '{ns}' (context {ctx}): xrun submits, "
                                   "follows and deletes JobSets and reads their pods, logs and events there", 1)
    return Check("rbac", OK, f"RBAC allows the {asked} verbs xrun uses in namespace '{ns}' "
                             "(jobsets create/get/list/watch/delete; pods and events get/list/watch; pods/log get)")


def check_pod_storage(backend: KubeBackend, spec: RunSpec, timeout_s: float = PROBE_TIMEOUT_S) -> Check:
    """Run the probe JobSet (``manifests.probe``) and report what its pod saw."""
    from manifests.probe import probe_jobset, probe_name
    from orchestrator.services.podcode import upload, with_pod_code
    from orchestrator.services.runs import admit
    from xrun_contract.storage import open_storage

    spec = with_pod_code(spec)  # no xrun_image: the probe fetches xrun's pod code, as the run's pods
    try:
        upload(open_storage(spec.storage), spec)
    except XrunError as e:
        return Check("pod-storage", FAIL, f"cannot upload xrun's pod code for the probe: {e}", e.exit_code)
    name = probe_name(spec, uuid.uuid4().hex)
    manifest = probe_jobset(spec, name)
    admit(manifest)
    try:
        backend.submit(manifest)
    except XrunError as e:
        return Check("pod-storage", FAIL, f"cannot create the probe JobSet {name}: {e}", e.exit_code)
    try:
        return _await_probe(backend, spec, name, timeout_s)
    finally:
        with contextlib.suppress(XrunError):  # the TTL removes it anyway
            backend.delete(name, wait=False)


def _await_probe(backend: KubeBackend, spec: RunSpec, name: str, timeout_s: float) -> Check:
    deadline = time.monotonic() + timeout_s
    where = f"on {node_selector(spec.shape) or 'any node'}" if spec.shape.kind != "cpu" else "in the cluster"
    why = "no pod yet"
    while time.monotonic() < deadline:
        pods, _ = backend.list_pods(name)
        for pod in pods:
            status = pod.get("status") or {}
            state = ((status.get("containerStatuses") or [{}])[0].get("state")) or {}
            waiting = (state.get("waiting") or {})
            if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName"):
                image = xrun_image_of(spec)
                field = "xrun_python_image" if uses_pod_code(spec) else "xrun_image"
                return Check("pod-storage", FAIL, f"probe pod cannot pull {field} {image}: {waiting.get('reason')} "
                                                  f"{waiting.get('message', '')}".strip(), 1)
            if status.get("phase") in ("Succeeded", "Failed"):
                return _probe_verdict(backend, spec, pod, where)
            cond = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"
                         and c.get("status") == "False"), None)
            why = f"pod Pending: {cond.get('message', '')}" if cond else f"pod {status.get('phase', 'Pending')}"
        time.sleep(backend.poll_seconds)
    return Check("pod-storage", WARN, f"probe pod {where} did not finish within {timeout_s:.0f} s ({why}); "
                                      "GCS access from the node pool is unproven")


def _probe_verdict(backend: KubeBackend, spec: RunSpec, pod: dict[str, Any], where: str) -> Check:
    import json

    pod_name = pod["metadata"]["name"]
    try:
        text = backend.pod_log(pod_name)
    except XrunError as e:  # no log: its init container (xrun's pod code) failed first
        return Check("pod-storage", FAIL, f"probe pod {pod_name} ended {pod['status'].get('phase')} with no log "
                                          f"({_stopped_containers(pod)}): {e}", e.exit_code)
    result = next((json.loads(m[1]) for m in map(PROBE_RE.match, text.splitlines()) if m), None)
    if result is None:
        tail = " | ".join(text.strip().splitlines()[-3:])[:300]
        return Check("pod-storage", FAIL, f"probe pod {pod_name} ended {pod['status'].get('phase')} without a "
                                          f"result (is {xrun_image_of(spec)} an image with xrun's workload package, "
                                          f"or a python3 >= 3.12?): {tail}", 1)
    account, scopes = result.get("account", "unknown"), result.get("scopes") or []
    who = f"as {account}" if account != "unknown" else "as the pod's identity"
    if result.get("ok"):
        return Check("pod-storage", OK, f"a pod {where} wrote and deleted {spec.storage}/{result.get('key')} {who}")
    fixes = []
    if pod_spec(spec).host_network:  # TPU pods; GPU pods whose stack attaches NICs by annotation do not
        fixes.append("these pods use hostNetwork, where GKE Workload Identity does not apply"
                     + (f" (service_account {spec.service_account!r} does not grant GCS)"
                        if spec.service_account else "")
                     + ": GCS sees the node pool's service account")
    if scopes and not any(s in GCS_SCOPES for s in scopes):
        fixes.append(f"the node pool's scopes ({', '.join(scopes)}) exclude GCS writes: recreate it with "
                     "--scopes=https://www.googleapis.com/auth/cloud-platform")
    fixes.append(f"grant {account if account != 'unknown' else 'the node service account'} "
                 f"roles/storage.objectUser on the bucket of {spec.storage}")
    return Check("pod-storage", FAIL, f"a pod {where} cannot write {spec.storage} {who}: {result.get('error')}; "
                                      + "; ".join(fixes), 1)


def _stopped_containers(pod: dict[str, Any]) -> str:
    """Each container that ended or waits, with its reason: why a pod has no log."""
    status = pod.get("status") or {}
    out = []
    for c in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        state = c.get("state") or {}
        for kind in ("terminated", "waiting"):
            if state.get(kind):
                detail = state[kind]
                out.append(f"{c.get('name', '?')} {kind} {detail.get('reason', '')} "
                           f"{detail.get('exitCode', '')}".strip())
    return "; ".join(out) or f"phase {status.get('phase', '?')}"


def check_queue(backend: KubeBackend, queue: str) -> Check:
    try:
        group = backend.api_group(KUEUE_GROUP)
        if group is None:
            return Check("kueue", FAIL, f"queue {queue!r} is named but Kueue is not installed "
                                        f"(the API serves no {KUEUE_GROUP})", 1)
        version = (group.get("preferredVersion") or {}).get("version") or group["versions"][0]["version"]
        lq = backend.local_queue(queue, version)
    except XrunError as e:
        return Check("kueue", FAIL, str(e), e.exit_code)
    if lq is None:
        try:
            others = sorted((q.get("metadata") or {}).get("name", "") for q in backend.local_queues(version))
        except XrunError:
            others = []
        there = f"; LocalQueues there: {', '.join(others)}" if others else ""
        return Check("kueue", FAIL, f"LocalQueue {queue!r} not found in namespace {backend.namespace!r} "
                                    f"({KUEUE_GROUP}/{version}){there}", 1)
    cq = (lq.get("spec") or {}).get("clusterQueue", "?")
    where = f"LocalQueue {backend.namespace}/{queue} (ClusterQueue {cq}, {KUEUE_GROUP}/{version})"
    # Kueue's own verdict: Active False (its ClusterQueue missing or inactive) means workloads
    # sent there are never admitted, and the run's JobSet stays suspended.
    active = next((c for c in (lq.get("status") or {}).get("conditions") or [] if c.get("type") == "Active"), None)
    if active is not None and active.get("status") == "False":
        return Check("kueue", FAIL, f"{where} is not active ({active.get('reason', '?')}: "
                                    f"{active.get('message', '')}), so Kueue would never admit the run", 1)
    return Check("kueue", OK, f"LocalQueue {backend.namespace}/{queue} exists "
                              f"(ClusterQueue {cq}, {KUEUE_GROUP}/{version})"
                              + ("; Kueue reports it active" if active is not None else ""))


def check_found_queue(backend: KubeBackend) -> Check:
    """No queue named: what ``xrun submit`` would do (``services.cluster.resolve_queue``)."""
    from orchestrator.services.cluster import find_queue

    try:
        queue, kind, detail = find_queue(backend)
    except XrunError as e:
        return Check("kueue", FAIL, str(e), e.exit_code)
    ns = backend.namespace
    if kind == "one":
        return Check("kueue", OK, f"no queue named: submit uses LocalQueue {ns}/{queue}, "
                                  f"the only one in namespace {ns}")
    if kind == "several":  # submit refuses this (services.cluster.resolve_queue): exit 2
        return Check("kueue", FAIL, f"no queue named and namespace {ns} has several LocalQueues ({detail}): "
                                    f"submit refuses to guess; name one with --queue NAME (or --queue {QUEUE_NONE})", 1)
    if kind == "none":
        return Check("kueue", WARN, f"Kueue is installed but namespace {ns} has no LocalQueue: runs here are not "
                                    "queued (no ClusterQueue's quota holds them)")
    if kind == "forbidden":
        return Check("kueue", WARN, f"cannot list LocalQueues: {detail}")
    return Check("kueue", SKIP, "Kueue is not installed: runs are not queued")


def check_priority(backend: KubeBackend, wanted: str) -> Check:
    """Which of xpk's ladder PriorityClasses (very-low..very-high) exist, and the run's."""
    from manifests.spec import PRIORITY_LADDER

    try:
        classes = {(pc.get("metadata") or {}).get("name", ""): pc.get("value") for pc in backend.priority_classes()}
    except XrunError as e:
        if e.exit_code == 1:
            return Check("priority", WARN, f"cannot list PriorityClasses: {e}")
        return Check("priority", FAIL, str(e), e.exit_code)
    ladder = ", ".join(f"{n}={classes[n]}" if n in classes else f"{n} missing" for n in PRIORITY_LADDER)
    others = sorted(set(classes) - set(PRIORITY_LADDER) - {"system-cluster-critical", "system-node-critical"})
    detail = f"PriorityClasses: {ladder}" + (f"; others: {', '.join(others)}" if others else "")
    if wanted and wanted not in classes:
        return Check("priority", FAIL, f"priority {wanted!r} has no PriorityClass (pods would be refused); {detail}", 1)
    return Check("priority", OK, (f"priority {wanted!r} exists; " if wanted else "") + detail)


def node_selector(shape: Shape, capacity: str = "on-demand") -> str:
    """The label selector matching the nodeSelector the manifest gives this shape's pods
    (with the capacity's labels: spot, reservation, queued)."""

    extra = "".join(f",{k}={v}" for k, v in capacity_placement(capacity)[0].items())
    if shape.kind == "tpu":
        return (f"{Labels.TPU_ACCELERATOR}={shape.gke_accelerator},{Labels.TPU_TOPOLOGY}={shape.topology},"
                f"{Labels.INSTANCE_TYPE}={shape.machine_type}{extra}")
    return f"{Labels.GPU_ACCELERATOR}={shape.gke_accelerator}{extra}"


def check_nodes(backend: KubeBackend, shape: Shape, needed: int, capacity: str = "on-demand") -> Check:
    if shape.kind == "cpu":
        return Check("nodes", SKIP, f"{shape.name} needs no accelerator nodes")
    selector = node_selector(shape, capacity)
    try:
        nodes = backend.nodes(selector)
    except XrunError as e:
        if e.exit_code == 1:
            return Check("nodes", WARN, f"cannot list nodes to look for {selector}: {e}")
        return Check("nodes", FAIL, str(e), e.exit_code)
    ready = sum(
        1 for n in list(nodes)
        if any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (n.get("status") or {}).get("conditions") or [])
    )
    have = f"{len(nodes)} node(s) labelled {selector} ({ready} Ready); {shape.name} needs {needed}"
    if len(nodes) >= needed:
        return Check("nodes", OK, have)
    if capacity == "flex-start":
        return Check("nodes", WARN, f"{have}; flex-start nodes are created for the run (by the autoscaler, or "
                                    "by Kueue's ProvisioningRequest for queued provisioning), so none may exist yet")
    try:
        autoscaler = backend.config_map(*AUTOSCALER_STATUS)
    except XrunError:
        autoscaler = None
    if autoscaler is not None:
        return Check("nodes", WARN, f"{have}; the cluster autoscaler is on ({'/'.join(AUTOSCALER_STATUS)}), so an "
                                    "autoscaling node pool with these labels can add them (node pools are not "
                                    "visible through the Kubernetes API: check yours has this accelerator and "
                                    "topology)")
    what = f"topology {shape.topology}" if shape.topology else "accelerator"
    return Check("nodes", FAIL, f"{have}, and no cluster autoscaler: create a node pool with "
                                f"{shape.gke_accelerator} {what} and {needed} nodes", 1)


def check_networks(backend: KubeBackend, shape: Shape, named: list[str]) -> Check:
    """The GKE Network objects the GPU stack's NICs would attach to, as submit picks them
    (``services.cluster.pick_networks``)."""
    from orchestrator.services.cluster import device_networks, pick_networks

    stack = shape.networking
    assert stack is not None
    try:
        have = device_networks(backend)
        picked, _ = pick_networks(shape.name, stack, named, have)
    except XrunError as e:
        if e.exit_code == 1 and "forbidden" in str(e):
            return Check("networks", WARN, f"cannot read the cluster's Network objects: {e}")
        return Check("networks", FAIL, str(e), 1 if e.exit_code == 2 else e.exit_code)
    used = picked or named or list(stack.networks)
    return Check("networks", OK, f"eth1..eth{len(used)} attach to Networks {', '.join(used)}"
                                 + (" (read from the cluster)" if picked else ""))


def check_mounts(buckets: list[str], timeout_s: float = 20.0) -> Check:
    """Each GCS FUSE bucket of the run exists and lists (one object asked for) with this
    machine's credentials: cheap, and it catches a misspelt or missing bucket. The pods read
    it as their own service account (hostNetworkPodKSA on TPU pods), which only they can prove."""
    from google.api_core.exceptions import GoogleAPICallError, NotFound

    from xrun_contract.storage import gcs_client

    client = gcs_client()
    for bucket in buckets:
        try:
            list(client.list_blobs(bucket, max_results=1, timeout=timeout_s))
        except NotFound:
            return Check("mounts", FAIL, f"mounts: bucket gs://{bucket} does not exist (the pods' GCS FUSE volume "
                                         "would fail to mount, and the pods with it)", 1)
        except (GoogleAPICallError, OSError) as e:
            return Check("mounts", FAIL, f"mounts: cannot list gs://{bucket} from here: "
                                         f"{' '.join(str(e).split())[:200]}", 1)
    return Check("mounts", OK, f"bucket(s) {', '.join(f'gs://{b}' for b in buckets)} exist and list from here "
                               "(the pods read them as their service account)")


def check_storage(root: str, for_cluster: bool = True) -> Check:
    from xrun_contract.storage import open_storage

    if for_cluster and not root.startswith("gs://"):
        return Check("storage", FAIL, f"storage root {root} is a local folder: cluster runs need gs://bucket/prefix "
                                      "(--storage or XRUN_STORAGE)", 1)
    folder = f".xrun-doctor/{uuid.uuid4().hex}"
    key = f"{folder}/probe"
    try:
        storage = open_storage(root)
        payload = f"xrun doctor {time.time()}".encode()
        storage.write_bytes(key, payload)
        back = storage.read_bytes(key)
        storage.delete_prefix(folder)
    except Exception as e:  # noqa: BLE001 - any client error means the root is unusable
        why = " ".join(str(e).split())[:200]
        return Check("storage", FAIL, f"storage root {root} not writable: {type(e).__name__}: {why}", 3)
    if back != payload:
        return Check("storage", FAIL, f"storage root {root}: wrote a probe object but read back something else", 3)
    return Check("storage", OK, f"storage root {storage.url()} writable")


def guarded(name: str, check: Callable[..., Check], *args: Any, **kwargs: Any) -> Check:
    """One check that cannot end doctor: an error it did not expect is its own FAIL line
    (doctor printed a traceback, and none of the checks it had passed, for one 400)."""
    try:
        return check(*args, **kwargs)
    except XrunError as e:
        return Check(name, FAIL, str(e), e.exit_code)
    except Exception as e:  # noqa: BLE001 - one line per check, never a traceback
        return Check(name, FAIL, f"unexpected {type(e).__name__}: {' '.join(str(e).split())[:300]}", 1)


def check_capacity(backend: KubeBackend, spec: RunSpec) -> Check:
    """What submit itself decides (``services.cluster.check_capacity``): a node pool per
    slice whose labels the pods select and whose taints they tolerate, capacity included."""
    from orchestrator.services.cluster import check_capacity as submit_check

    try:
        warning = submit_check(spec, backend)
    except XrunError as e:
        if e.exit_code == 2:
            return Check("capacity", FAIL, f"submit would refuse the run: {e}", 1)
        raise
    if warning:
        return Check("capacity", WARN, warning)
    if spec.capacity == "flex-start":
        return Check("capacity", OK, "flex-start: nodes labelled cloud.google.com/gke-flex-start=true are added "
                                     "for the run (the autoscaler, or Kueue's ProvisioningRequest with a queue)")
    return Check("capacity", OK, f"a node pool per slice holds {spec.accelerator}"
                                 + (f" x{spec.slices}" if spec.slices > 1 else "")
                                 + (f" ({spec.capacity})" if spec.capacity != "on-demand" else ""))


def check_fuse_identity(backend: KubeBackend, spec: RunSpec, read_iam: Callable[[str], Any] | None = None) -> Check:
    """Who the GCS FUSE volumes authenticate as: on a hostNetwork pod (TPU) the driver uses
    the pod's Kubernetes service account through Workload Identity (``hostNetworkPodKSA``),
    not the node's account the rest of the pod uses; with only the node account granted the
    pod stays in ContainerCreating (gcs-fuse-csi-driver docs/authentication.md). The bucket's
    IAM policy is read where this user may; else the grant to make is named."""
    buckets = [m for m in spec.mounts if "bucket" in m]
    ksa = spec.service_account or "default"
    ns = backend.namespace
    role = "roles/storage.objectUser" if any(not m.get("read_only") for m in buckets) else "roles/storage.objectViewer"
    principal = (f"principal://iam.googleapis.com/projects/PROJECT_NUMBER/locations/global/workloadIdentityPools/"
                 f"PROJECT_ID.svc.id.goog/subject/ns/{ns}/sa/{ksa}")
    if not pod_spec(spec).host_network:
        return Check("fuse-identity", OK, f"GCS FUSE mounts authenticate as KSA {ns}/{ksa} through Workload Identity")
    subject = f"subject/ns/{ns}/sa/{ksa}"
    if read_iam is None:
        read_iam = _bucket_iam
    missing, unread = [], []
    for m in buckets:
        try:
            members = read_iam(m["bucket"])
        except Exception:  # noqa: BLE001 - no getIamPolicy permission: say what to grant
            unread.append(m["bucket"])
            continue
        if not any(subject in member or f"svc.id.goog[{ns}/{ksa}]" in member for member in members):
            missing.append(m["bucket"])
    grant = (f"gcloud storage buckets add-iam-policy-binding gs://BUCKET --role={role} --member={principal} "
             "(GKE with Workload Identity enabled on the cluster and its node pools)")
    if missing:
        return Check("fuse-identity", FAIL, f"TPU pods mount GCS with FUSE as KSA {ns}/{ksa} (hostNetworkPodKSA), "
                                            f"not the node's account, and {', '.join(f'gs://{b}' for b in missing)} "
                                            f"grant it nothing: the pods would hang in ContainerCreating; {grant}", 1)
    if unread:
        return Check("fuse-identity", WARN, f"TPU pods mount GCS with FUSE as KSA {ns}/{ksa} (hostNetworkPodKSA), not "
                                            f"the node's account; cannot read the IAM policy of "
                                            f"{', '.join(f'gs://{b}' for b in unread)} to check; {grant}")
    named = ", ".join("gs://" + m["bucket"] for m in buckets)
    return Check("fuse-identity", OK, f"KSA {ns}/{ksa} is granted on {named} (TPU pods mount GCS with FUSE as it)")


def _bucket_iam(bucket: str) -> list[str]:
    """Every member of every binding of the bucket's IAM policy."""
    from xrun_contract.storage import gcs_client

    policy = gcs_client().bucket(bucket).get_iam_policy(requested_policy_version=3, timeout=20)
    return [m for b in policy.bindings for m in b.get("members", ())]


def unproven_node_account(shape: Shape | None) -> Check:
    """Without a probe pod nothing shows the node pool can write: name what decides it."""
    if shape is None or shape.kind == "cpu":
        return Check("pod-storage", SKIP, "give the run's image (-f run.yaml or --image) to prove a pod on "
                                          "the target node pool can write the storage root")
    return Check("pod-storage", WARN, "unproven: TPU pods (hostNetwork) write the storage root as the node "
                                      "pool's service account with the pool's OAuth scopes (gcloud's default, "
                                      "gke-default, only reads storage: 403 on every write); give the run's "
                                      "image (-f run.yaml or --image) to run a probe pod there")


def run_checks(backend: KubeBackend, *, shape: Shape | None, needed_nodes: int, queue: str,
               storage_root: str, probe: RunSpec | None = None,
               probe_timeout_s: float = PROBE_TIMEOUT_S, priority: str = "",
               capacity: str = "on-demand", networks: list[str] | None = None,
               spec: RunSpec | None = None, on_check: Callable[[Check], None] | None = None) -> list[Check]:
    """Every check, in order; ``on_check`` hears each as it ends (doctor prints it then)."""
    checks: list[Check] = []

    def add(check: Check) -> None:
        checks.append(check)
        if on_check is not None:
            on_check(check)

    api, answered = api_check(backend)
    add(api)
    if not answered:
        add(Check("cluster", SKIP, "JobSet, Kueue and node checks skipped: the API is not reachable"))
    else:
        add(guarded("jobset", check_jobset, backend))
        add(guarded("jobset-controller", check_jobset_controller, backend))
        add(guarded("rbac", check_rbac, backend))
        if queue and queue != QUEUE_NONE:
            add(guarded("kueue", check_queue, backend, queue))
        elif not queue:
            add(guarded("kueue", check_found_queue, backend))
        add(guarded("priority", check_priority, backend, priority))
        if shape is not None:
            add(guarded("nodes", check_nodes, backend, shape, needed_nodes, capacity))
            if spec is not None and shape.kind != "cpu":
                add(guarded("capacity", check_capacity, backend, spec))
            if shape.kind == "gpu" and shape.networking and shape.networking.networks:
                add(guarded("networks", check_networks, backend, shape, networks or []))
    add(guarded("storage", check_storage, storage_root))
    mounted = probe or spec
    buckets = [m["bucket"] for m in (mounted.mounts if mounted else []) if "bucket" in m]
    if buckets:
        add(guarded("mounts", check_mounts, buckets))
        if mounted is not None and answered:
            add(guarded("fuse-identity", check_fuse_identity, backend, mounted))
    if probe is None:
        add(unproven_node_account(shape))
    elif api.result == FAIL or not storage_root.startswith("gs://"):
        add(Check("pod-storage", SKIP, "needs a reachable API of Kubernetes >= 1.29 and a gs:// storage root"))
    else:
        add(guarded("pod-storage", check_pod_storage, backend, probe, probe_timeout_s))
    return checks


def exit_code(checks: list[Check]) -> int:
    codes = {c.exit_code or 1 for c in checks if c.result == FAIL}
    return 3 if 3 in codes else (max(codes) if codes else 0)


@dataclass
class DoctorInputs:
    """The few run fields doctor needs: file values, flags over them, defaults under both."""

    context: str = ""
    namespace: str = ""  # "": the kubeconfig context's
    accelerator: str = ""
    num_slices: int = 1
    nodes: int = 1
    cpu_devices_per_host: int = 2
    queue: str = ""
    storage: str = ""
    probe: RunSpec | None = None  # the run's spec, for the pod-storage probe
    spec: RunSpec | None = None  # the run as submit would build it (any image), for its checks
    probe_timeout_s: float = PROBE_TIMEOUT_S
    priority: str = ""  # the run's PriorityClass (priority or priority_class)
    capacity: str = "on-demand"  # adds spot / reservation / queued node labels to the node check
    networks: list[str] | None = None  # the run file's GPU networks


def inputs(run_file: str | None, flags: dict[str, Any]) -> DoctorInputs:
    from orchestrator import settings
    from orchestrator.runfile import read_run_file

    values: dict[str, Any] = {}
    data: dict[str, Any] = {}
    flags = dict(flags)
    probe_timeout = flags.pop("probe_timeout", None)
    if run_file:
        data = read_run_file(run_file)
        values = {k: data[k] for k in ("accelerator", "num_slices", "nodes", "cpu_devices_per_host",
                                       "queue", "namespace", "context", "storage", "capacity", "priority",
                                       "networks")
                  if data.get(k) is not None}
    values.update({k: v for k, v in flags.items() if v is not None and k not in ("image", "service_account")})
    for key in ("num_slices", "nodes"):
        value = values.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise XrunError(f"{key}: must be an integer >= 1, got {value!r}")
    values["storage"] = settings.storage_root(values.get("storage"))
    out = DoctorInputs(**{k: v for k, v in values.items() if k in DoctorInputs.__dataclass_fields__})
    out.priority = str(values.get("priority") or data.get("priority_class") or "")
    if not out.queue:
        out.queue = settings.default_queue()
    if probe_timeout is not None:
        out.probe_timeout_s = float(probe_timeout)
    image = flags.get("image") or (data.get("image") if run_file else None)
    if out.accelerator:
        from manifests.spec import DEFAULT_XRUN_PYTHON_IMAGE, FIELDS, build_spec

        file_values = {k: v for k, v in data.items() if k in FIELDS} if run_file else {}
        chosen_image = image or file_values.get("image") or DEFAULT_XRUN_PYTHON_IMAGE
        overrides = {k: v for k, v in {**values, "image": chosen_image,
                                       "service_account": flags.get("service_account")}.items()
                     if k in FIELDS and v is not None}
        overrides.setdefault("name", file_values.get("name") or "probe")
        overrides["backend"] = "kube"
        if not image and not str(values["storage"]).startswith("gs://"):
            # The storage check fails a local root on its own line; submit's checks still run.
            overrides["storage"] = "gs://xrun-doctor/unused"
        out.spec = build_spec(file_values, overrides)
        out.probe = out.spec if image else None
    return out


def doctor(v: DoctorInputs, on_check: Callable[[Check], None] | None = None) -> tuple[list[Check], int]:
    """Every check for the inputs' cluster, shape and storage, and the exit code."""
    from manifests import catalogue

    shape, needed = None, 0
    if v.accelerator:
        try:
            shape = catalogue.lookup(str(v.accelerator), int(v.cpu_devices_per_host))
        except catalogue.UnknownAccelerator as e:
            raise XrunError(f"accelerator: {e}") from None
        needed = shape.vms * v.num_slices if shape.kind == "tpu" else v.nodes
    backend = KubeBackend(v.context or None, v.namespace or None)
    results = run_checks(backend, shape=shape, needed_nodes=needed, queue=v.queue,
                         storage_root=v.storage, probe=v.probe, probe_timeout_s=v.probe_timeout_s,
                         priority=v.priority, capacity=str(v.capacity), networks=v.networks,
                         spec=v.spec, on_check=on_check)
    return results, exit_code(results)
