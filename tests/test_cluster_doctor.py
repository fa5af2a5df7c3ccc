"""`xrun doctor` against the real control plane (tests/cluster/up.sh): kube-apiserver
v1.36.3 with RBAC, the JobSet v0.12.0 controller (a process with its webhooks, no
Deployment), Kueue v0.17.0 with xpk's LocalQueue, KWOK nodes shaped like GKE pools.

Each test runs the real CLI (subprocess, KUBECONFIG at the cluster, gs:// storage on the
emulator) and asserts on its lines and exit code. What a test changes cluster-wide (a
webhook configuration) is scoped to a namespace of its own and removed after it.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import xrun
from cluster_helpers import Cluster, unique

CONTEXT = "xrun-test"
KUBE_VERSION = "v1.36.3"


@pytest.fixture
def storage(gcs_bucket) -> str:
    return f"{gcs_bucket}/xrun"


def doctor(kubeconfig: str, storage: str, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, dict[str, Any]]]:
    r = xrun("doctor", "-o", "json", *args, storage=storage, timeout=120, KUBECONFIG=kubeconfig)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    return r, checks


def namespace(cluster: Cluster, prefix: str, labels: dict[str, str] | None = None) -> str:
    return cluster.namespace(prefix, labels)


def run_file(tmp_path: Path, **values: Any) -> str:
    spec = {"name": unique("doc"), "accelerator": "v6e-8", "context": CONTEXT, "command": "python3 -m workload.train"}
    spec.update(values)
    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def user_kubeconfig(cluster: Cluster, tmp_path: Path, user: str, groups: tuple[str, ...] = ()) -> str:
    return cluster.user_kubeconfig(tmp_path, user, groups)


def rbac(cluster: Cluster, ns: str, name: str, user: str, rules: list[dict[str, Any]]) -> None:
    cluster.grant(ns, name, user, rules)


# --- a ready cluster -----------------------------------------------------------------------

def test_doctor_on_the_real_cluster_reads_what_the_api_shows(cluster, storage, tmp_path):
    import datetime as dt

    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")  # other tests' probes ran for real
    path = run_file(tmp_path, queue="multislice-queue", priority="high", storage=storage)
    r, checks = doctor(cluster.kubeconfig, storage, "-f", path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert list(checks) == ["api", "jobset", "jobset-controller", "rbac", "kueue", "priority", "nodes", "capacity",
                            "storage", "pod-storage"]
    api = checks["api"]
    assert (api["result"] == "ok"
            and f"(context {CONTEXT}, Kubernetes {KUBE_VERSION}), namespace default" in api["detail"])
    assert checks["jobset"] == {"name": "jobset", "result": "ok", "exit_code": 0, "detail": (
        "JobSet CRD jobsets.jobset.x-k8s.io installed: served v1alpha2 (storage v1alpha2); xrun uses v1alpha2")}
    # The controller runs as a process here: no Deployment, and JobSet's webhooks at a URL.
    # Kueue's webhooks of the same names (vjobset.kb.io, mjobset.kb.io) are not JobSet's.
    port = cluster.state["ports"]["jobset-webhook"]
    ctl = checks["jobset-controller"]
    assert (ctl["result"], ctl["exit_code"]) == ("warn", 0)
    assert ctl["detail"] == (
        "JobSet controller answers: JobSet's webhooks mjobset.kb.io (jobset-mutating-webhook-configuration), "
        "vjobset.kb.io (jobset-validating-webhook-configuration) are registered, served by "
        f"https://127.0.0.1:{port}/mutate-jobset-x-k8s-io-v1alpha2-jobset, "
        f"https://127.0.0.1:{port}/validate-jobset-x-k8s-io-v1alpha2-jobset, and a dry-run JobSet passed them, "
        "defaulted by JobSet's mutating webhook; its release is unknown (no Deployment "
        "jobset-system/jobset-controller-manager and no Deployment behind the webhooks to read an image tag "
        "from); xrun needs JobSet >= 0.6, targets 0.12")
    assert checks["rbac"]["result"] == "ok" and checks["rbac"]["detail"].startswith(
        "RBAC allows the 12 verbs xrun uses in namespace 'default'")
    assert checks["kueue"] == {"name": "kueue", "result": "ok", "exit_code": 0, "detail": (
        "LocalQueue default/multislice-queue exists (ClusterQueue xpk-cluster-queue, kueue.x-k8s.io/v1beta2); "
        "Kueue reports it active")}
    assert checks["priority"]["result"] == "ok" and checks["priority"]["detail"].startswith(
        "priority 'high' exists; PriorityClasses: very-low=100, low=250, medium=500, high=750, very-high=1000")
    assert checks["nodes"]["result"] == "ok" and "v6e-8 needs 2" in checks["nodes"]["detail"]
    assert checks["capacity"] == {"name": "capacity", "result": "ok", "exit_code": 0,
                                  "detail": "a node pool per slice holds v6e-8"}
    assert checks["storage"]["result"] == "ok"
    # No image, no probe pod: the node pool's account and scopes are unproven, said so.
    assert (checks["pod-storage"]["result"] == "warn"
            and "gke-default, only reads storage" in checks["pod-storage"]["detail"])
    assert r.stderr.strip() == "xrun: doctor: all checks passed (2 warning(s))"
    # The dry run went through the webhooks and stored nothing.
    audit = [a for a in cluster.audit_lines() if a.get("verb") == "create"
             and (a.get("objectRef") or {}).get("resource") == "jobsets"
             and (a.get("objectRef") or {}).get("name", "").startswith("xrun-doctor-")
             and a["requestReceivedTimestamp"] >= started]
    assert audit and all("dryRun=All" in a["requestURI"] for a in audit)
    assert all(a["responseStatus"]["code"] == 201 for a in audit)
    names = [j["metadata"]["name"] for j in cluster.custom.list_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", "default", "jobsets")["items"]]
    assert not [n for n in names if n.startswith("xrun-doctor-")]


# --- the queue the run file names ----------------------------------------------------------

def test_a_missing_queue_fails_naming_it(cluster, storage, tmp_path):
    r, checks = doctor(cluster.kubeconfig, storage, "-f", run_file(tmp_path, queue="no-such-queue", storage=storage))
    assert r.returncode == 1
    assert checks["kueue"] == {"name": "kueue", "result": "FAIL", "exit_code": 1, "detail": (
        "LocalQueue 'no-such-queue' not found in namespace 'default' (kueue.x-k8s.io/v1beta2); "
        "LocalQueues there: cpu-memory-queue, multislice-queue")}
    assert r.stderr.strip() == "xrun: doctor: 1 check(s) failed: kueue"


def test_a_queue_kueue_reports_inactive_fails(cluster, storage, tmp_path):
    """A LocalQueue whose ClusterQueue does not exist: Kueue marks it Active=False and never
    admits what is sent there. Doctor used to report it ok because the object exists."""
    ns = namespace(cluster, "doc-q")
    cluster.custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", ns, "localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "orphan"},
        "spec": {"clusterQueue": "no-such-cluster-queue"}})

    def inactive() -> bool:
        lq = cluster.custom.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", ns, "localqueues", "orphan")
        return any(c["type"] == "Active" and c["status"] == "False"
                   for c in (lq.get("status") or {}).get("conditions") or [])

    cluster.wait("Kueue to mark the LocalQueue inactive", inactive, 30)
    r, checks = doctor(cluster.kubeconfig, storage, "-f",
                       run_file(tmp_path, queue="orphan", namespace=ns, storage=storage))
    assert r.returncode == 1
    assert checks["kueue"] == {"name": "kueue", "result": "FAIL", "exit_code": 1, "detail": (
        f"LocalQueue {ns}/orphan (ClusterQueue no-such-cluster-queue, kueue.x-k8s.io/v1beta2) is not active "
        "(ClusterQueueDoesNotExist: Can't submit new workloads to clusterQueue), so Kueue would never admit the run")}


# --- RBAC ----------------------------------------------------------------------------------

def test_a_user_with_too_few_rights_is_told_what_rbac_must_allow(cluster, storage, tmp_path):
    """A client-certificate user bound to a Role that may only read JobSets. Before the
    rbac check, doctor passed this user (nothing it read needed more), and `xrun submit`
    then failed; and a refusal on a cluster-scoped resource asked for it 'in namespace'."""
    ns = namespace(cluster, "doc-rbac")
    user = unique("dev")
    kubeconfig = user_kubeconfig(cluster, tmp_path, user, ("xrun-devs",))
    rbac(cluster, ns, "jobsets-read", user, [
        {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["get", "list"]}])
    r, checks = doctor(kubeconfig, storage, "-n", ns, "--tpu", "v6e-8", "--storage", storage)
    assert r.returncode == 1
    assert checks["api"]["result"] == "ok" and f"Kubernetes {KUBE_VERSION}" in checks["api"]["detail"]
    assert checks["rbac"] == {"name": "rbac", "result": "FAIL", "exit_code": 1, "detail": (
        "RBAC must allow verbs 'create', 'watch', 'delete' on resource 'jobsets.jobset.x-k8s.io'; "
        "verbs 'get', 'list', 'watch' on resource 'pods'; verb 'get' on resource 'pods/log'; "
        f"verbs 'get', 'list', 'watch' on resource 'events' in namespace '{ns}' (context {user}): xrun submits, "
        "follows and deletes JobSets and reads their pods, logs and events there")}
    assert r.stderr.strip() == "xrun: doctor: 1 check(s) failed: rbac"
    # The CRD is hidden from this user: discovery still shows the API.
    assert (checks["jobset"]["result"] == "ok"
            and "the CRD itself is not readable with your RBAC" in checks["jobset"]["detail"])
    # No Deployment to read for this user: forbidden is not missing.
    assert checks["jobset-controller"]["result"] == "warn" and checks["jobset-controller"]["detail"].startswith(
        "RBAC forbids reading Deployment jobset-system/jobset-controller-manager, so its version is unchecked "
        "(needs get on deployments.apps in jobset-system)"), checks["jobset-controller"]
    # Cluster-scoped reads: the server says "at the cluster scope", and so does doctor.
    for name, verb, resource in (("priority", "list", "priorityclasses.scheduling.k8s.io"), ("nodes", "list", "nodes")):
        assert checks[name]["result"] == "warn"
        assert (f"forbidden: RBAC must allow verb '{verb}' on resource '{resource}' cluster-wide (a ClusterRole and "
                f"ClusterRoleBinding: a namespace's RoleBinding cannot grant it) (context {user})"
                ) in checks[name]["detail"]
        assert "at the cluster scope" in checks[name]["detail"] and "in namespace" not in checks[name]["detail"]

    # With the nightly's Role (what the cluster backend calls) the rbac check passes.
    from manifests.nightly import RBAC_RULES

    rbac(cluster, ns, "xrun", user, RBAC_RULES)
    r, checks = doctor(kubeconfig, storage, "-n", ns, "--storage", storage)
    assert checks["rbac"]["result"] == "ok", checks["rbac"]
    assert r.returncode == 0, r.stdout + r.stderr


# --- JobSet's webhooks down ----------------------------------------------------------------

def test_jobset_webhooks_that_do_not_answer_fail_doctor_and_submit(cluster, storage, tmp_path):
    """A JobSet webhook (failurePolicy Fail) nobody serves: the API server answers every
    JobSet create with 500 "failed calling webhook". Doctor's dry run shows it, and submit
    exits 1 naming the webhook (it used to exit 3, 'the API failed')."""
    from kubernetes import client

    ns = namespace(cluster, "doc-hook", {"xrun-test/webhook": "down"})
    name = unique("jobset-broken-webhook")
    admission = client.AdmissionregistrationV1Api(cluster.api_client)
    admission.create_validating_webhook_configuration({
        "metadata": {"name": name},
        "webhooks": [{"name": "vjobset.kb.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                      "failurePolicy": "Fail", "timeoutSeconds": 2,
                      "namespaceSelector": {"matchLabels": {"xrun-test/webhook": "down"}},
                      "clientConfig": {"url": "https://127.0.0.1:1/validate-jobset-x-k8s-io-v1alpha2-jobset"},
                      "rules": [{"apiGroups": ["jobset.x-k8s.io"], "apiVersions": ["v1alpha2"],
                                 "operations": ["CREATE"], "resources": ["jobsets"]}]}]})
    try:
        r, checks = doctor(cluster.kubeconfig, storage, "-n", ns, "--storage", storage)
        assert r.returncode == 1
        ctl = checks["jobset-controller"]
        assert (ctl["result"], ctl["exit_code"]) == ("FAIL", 1)
        assert f"vjobset.kb.io ({name})" in ctl["detail"]
        assert ("but they do not answer, so every JobSet create is refused: create jobsets.jobset.x-k8s.io "
                in ctl["detail"])
        assert ("refused: an admission webhook could not be called (is the controller serving it running?): Internal "
                'error occurred: failed calling webhook "vjobset.kb.io"') in ctl["detail"]
        path = run_file(tmp_path, namespace=ns, storage=storage, image="example.com/xrun:1",
                        xrun_image="example.com/xrun-workload:1")
        r = xrun("submit", "-f", path, "--detach", storage=storage, timeout=120, KUBECONFIG=cluster.kubeconfig)
        assert r.returncode == 1, r.stdout + r.stderr
        assert 'an admission webhook could not be called (is the controller serving it running?): Internal error ' \
               'occurred: failed calling webhook "vjobset.kb.io"' in r.stderr
    finally:
        admission.delete_validating_webhook_configuration(name)


# --- offline admission against the server --------------------------------------------------

def test_indexed_job_defaults_agree_with_the_server(cluster):
    """JobSet's webhook makes every Job Indexed. With neither completions nor parallelism the
    Job API defaults both to 1 and admits it; with parallelism alone it refuses. xrun's
    offline admission (manifests.admission) said both were refused."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from manifests.admission import violations

    batch = client.BatchV1Api(cluster.api_client)

    def job(**spec: Any) -> dict[str, Any]:
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": unique("idx")},
                "spec": {"completionMode": "Indexed", **spec, "template": {"spec": {
                    "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}

    def jobset(spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "idx"},
                "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": spec["spec"]}}]}}

    both_unset = job()
    got = batch.create_namespaced_job("default", both_unset, dry_run="All")
    assert (got.spec.completions, got.spec.parallelism) == (1, 1)
    assert violations(jobset(both_unset)) == []

    parallel = job(parallelism=2)
    with pytest.raises(ApiException) as e:
        batch.create_namespaced_job("default", parallel, dry_run="All")
    assert e.value.status == 422 and "spec.completions: Required value: when completion mode is Indexed" in e.value.body
    assert [v.rule for v in violations(jobset(parallel))] == ["job-indexed-completions"]


# --- a cluster without JobSet or Kueue, one that cannot be reached ---------------------------

def test_doctor_names_every_problem(cluster, tmp_path):
    """JobSet's and Kueue's APIs absent (the fault proxy answers as such a cluster: the
    session's one cannot lose their CRDs), no node of the shape, local storage; then no
    API server at all."""
    from cluster_helpers import dead_kubeconfig
    from kube_fault_proxy import KubeFaultProxy

    proxy = KubeFaultProxy(cluster).start()
    try:
        proxy.hide_group("jobset.x-k8s.io")
        proxy.hide_group("kueue.x-k8s.io")
        r = xrun("doctor", "--tpu", "v6e-16", "--queue", "lq", "--storage", str(tmp_path / "local"), storage=tmp_path,
                 KUBECONFIG=proxy.kubeconfig(tmp_path / "proxied"))
    finally:
        proxy.stop()
    assert r.returncode == 1, r.stdout + r.stderr
    got = {ln.split()[1]: ln for ln in r.stdout.splitlines()}
    assert got["api"].startswith("ok ")
    assert got["jobset"].startswith("FAIL  jobset   JobSet CRD jobsets.jobset.x-k8s.io not installed; install JobSet: "
                                    "kubectl apply")
    assert got["kueue"] == ("FAIL  kueue    queue 'lq' is named but Kueue is not installed "
                            "(the API serves no kueue.x-k8s.io)")
    assert got["nodes"].startswith("FAIL  nodes    0 node(s) labelled "
                                   "cloud.google.com/gke-tpu-accelerator=tpu-v6e-slice,"
                                   "cloud.google.com/gke-tpu-topology=4x4,"
                                   "node.kubernetes.io/instance-type=ct6e-standard-4t "
                                   "(0 Ready); v6e-16 needs 4, and no cluster autoscaler"), got["nodes"]
    assert (got["storage"].startswith("FAIL  storage  storage root ")
            and "cluster runs need gs://bucket/prefix" in got["storage"])
    assert (r.stderr.strip().startswith("xrun: doctor: ") and "jobset, " in r.stderr
            and "kueue, nodes, capacity, storage" in r.stderr)

    r = xrun("doctor", "-o", "json", storage=tmp_path, KUBECONFIG=dead_kubeconfig(cluster, tmp_path / "dead"))
    assert r.returncode == 3
    report = json.loads(r.stdout)
    assert [(c["name"], c["result"]) for c in report["checks"]] == [
        ("api", "FAIL"), ("cluster", "skip"), ("storage", "FAIL"), ("pod-storage", "skip")]
    assert report["checks"][0]["detail"].startswith("cannot reach the Kubernetes API at https://127.0.0.1:")
    r = xrun("doctor", "--tpu", "v9z-8", storage=tmp_path, KUBECONFIG=cluster.kubeconfig)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("xrun: error: accelerator: ")


# --- nodes, capacity, priorities, the autoscaler ---------------------------------------------

def test_doctor_reads_the_pools_priorities_and_the_autoscaler(cluster):
    """In process, on the GKE-shaped KWOK pools and xpk's priority ladder."""
    from manifests.catalogue import lookup
    from orchestrator.backends.kube.backend import KubeBackend
    from orchestrator.services import doctor as checks

    backend = KubeBackend(None, "default", cluster.kubeconfig)
    check = checks.check_priority(backend, "high")
    assert check.result == "ok" and check.detail.startswith(
        "priority 'high' exists; PriorityClasses: very-low=100, low=250, medium=500, high=750, very-high=1000"), check
    check = checks.check_priority(backend, "team-a-batch")
    assert (check.result, check.exit_code) == ("FAIL", 1)
    assert check.detail.startswith("priority 'team-a-batch' has no PriorityClass (pods would be refused); "
                                   "PriorityClasses:")

    check = checks.check_nodes(backend, lookup("v6e-8"), 2, "spot")
    assert (check.result, check.detail) == ("ok", (
        "2 node(s) labelled cloud.google.com/gke-tpu-accelerator=tpu-v6e-slice,cloud.google.com/gke-tpu-topology=2x4,"
        "node.kubernetes.io/instance-type=ct6e-standard-4t,cloud.google.com/gke-spot=true (2 Ready); v6e-8 needs 2"))
    check = checks.check_nodes(backend, lookup("h100-mega-80gb-8"), 2, "flex-start")
    assert check.result == "warn" and "flex-start nodes are created for the run" in check.detail
    assert checks.check_nodes(backend, lookup("h100-mega-80gb-8"), 2).result == "ok"
    assert checks.check_nodes(backend, lookup("cpu-2"), 2).result == "skip"
    # A shape no pool has: FAIL, or warn where the cluster autoscaler would make the nodes.
    assert checks.check_nodes(backend, lookup("v6e-16"), 4).result == "FAIL"
    cm = {"metadata": {"name": "cluster-autoscaler-status", "namespace": "kube-system"},
          "data": {"status": "Health: Healthy"}}
    cluster.core.create_namespaced_config_map("kube-system", cm)
    try:
        check = checks.check_nodes(backend, lookup("v6e-16"), 4)
    finally:
        cluster.core.delete_namespaced_config_map("cluster-autoscaler-status", "kube-system")
    assert check.result == "warn" and check.detail.startswith(
        "0 node(s) labelled cloud.google.com/gke-tpu-accelerator=tpu-v6e-slice,cloud.google.com/gke-tpu-topology=4x4,"
        "node.kubernetes.io/instance-type=ct6e-standard-4t (0 Ready); v6e-16 needs 4; "
        "the cluster autoscaler is on"), check
    assert checks.exit_code([check]) == 0
    nodes = [e["requestURI"] for e in cluster.audit_lines() if e["verb"] == "list"
             and e["requestURI"].startswith("/api/v1/nodes?")]
    assert any("gke-tpu-topology%3D4x4" in u or "gke-tpu-topology=4x4" in u for u in nodes)


# --- the JobSet controller's Deployment ------------------------------------------------------

def test_doctor_reads_the_controller_version_from_its_deployment(cluster):
    """Where the release manifests put it: a Deployment jobset-system/jobset-controller-manager
    (here one whose pods KWOK runs on the system pool), its image tag the release and its
    ready replicas whether it runs."""
    from cluster_helpers import timing
    from kubernetes import client

    from orchestrator.backends.kube.backend import KubeBackend
    from orchestrator.services import doctor as checks

    apps = client.AppsV1Api(cluster.api_client)
    backend = KubeBackend(None, "default", cluster.kubeconfig)
    created_ns = False
    try:
        cluster.core.create_namespace({"metadata": {"name": "jobset-system"}})
        created_ns = True
    except Exception:  # noqa: BLE001 - already there
        pass
    where = "jobset-system/jobset-controller-manager runs "
    cases = [
        ("registry.k8s.io/jobset/jobset:v0.12.0", True, "ok",
         f"{where}registry.k8s.io/jobset/jobset:v0.12.0 (1 ready)"),
        ("registry.k8s.io/jobset/jobset:v0.10.1", True, "warn", f"{where}registry.k8s.io/jobset/jobset:v0.10.1 "
         "(1 ready): works, but xrun's admission rules are v0.12's"),
        ("registry.k8s.io/jobset/jobset:v0.5.2", True, "FAIL", f"{where}registry.k8s.io/jobset/jobset:v0.5.2 "
         "(1 ready): older than v0.6, which sets the job-global-index label"),
        ("registry.k8s.io/jobset/jobset:v0.12.0", False, "FAIL", f"{where}registry.k8s.io/jobset/jobset:v0.12.0 "
         "(0 ready): no ready replica"),
        ("example.com/jobset@sha256:abc", True, "warn", f"{where}example.com/jobset@sha256:abc (1 ready): no release "
         "in the image tag"),
    ]

    def deployment(image: str, placed: bool) -> dict[str, Any]:
        selector = {"cloud.google.com/gke-nodepool": "system" if placed else "no-such-pool"}
        return {"metadata": {"name": "jobset-controller-manager", "namespace": "jobset-system"}, "spec": {
            "replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": {"app": "jobset"}},
            "template": {"metadata": {"labels": {"app": "jobset"}, "annotations": timing(run_s=600, start_s=0.2)},
                         "spec": {"nodeSelector": selector, "terminationGracePeriodSeconds": 0,
                                  "containers": [{"name": "manager", "image": image}]}}}}

    def settled(ready: int):
        """The rollout is over: the controller saw this spec, its one pod is of it
        (updated), no old pod is left (Recreate stops it first: seen ready, then gone),
        and ``ready`` of it are ready."""
        def ok():
            d = apps.read_namespaced_deployment("jobset-controller-manager", "jobset-system").to_dict()
            st = d["status"] or {}
            return d if (st.get("observed_generation") == d["metadata"]["generation"]
                         and (st.get("updated_replicas") or 0) == 1 and (st.get("replicas") or 0) == 1
                         and (st.get("ready_replicas") or 0) == ready) else None
        return ok

    try:
        for i, (image, placed, result, detail) in enumerate(cases):
            if i == 0:
                apps.create_namespaced_deployment("jobset-system", deployment(image, placed))
            else:
                apps.replace_namespaced_deployment("jobset-controller-manager", "jobset-system",
                                                   deployment(image, placed))
            # Generous: under CI's load the deployment controller and KWOK lag by tens of seconds.
            cluster.wait(f"the Deployment running {image}", settled(1 if placed else 0), 180, every=0.2)
            check = checks.check_jobset_controller(backend)
            assert (check.result, check.detail[:len(detail)]) == (result, detail), check
    finally:
        apps.delete_namespaced_deployment("jobset-controller-manager", "jobset-system",
                                          body={"propagationPolicy": "Background"})
        if created_ns:
            cluster.drop_namespace("jobset-system")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
                d.metadata.name == "jobset-controller-manager"
                for d in apps.list_namespaced_deployment("jobset-system").items):
            time.sleep(0.2)
