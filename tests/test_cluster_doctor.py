"""`xrun doctor` against the real control plane (tests/cluster/up.sh): kube-apiserver
v1.36.3 with RBAC, the JobSet v0.12.0 controller (a process with its webhooks, no
Deployment), Kueue v0.17.0 with xpk's LocalQueue, KWOK nodes shaped like GKE pools.

Each test runs the real CLI (subprocess, KUBECONFIG at the cluster, gs:// storage on the
emulator) and asserts on its lines and exit code. What a test changes cluster-wide (a
webhook configuration) is scoped to a namespace of its own and removed after it.
"""

from __future__ import annotations

import base64
import json
import subprocess
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
    name = unique(prefix)
    cluster.core.create_namespace({"metadata": {"name": name, "labels": labels or {}}})
    return name


def run_file(tmp_path: Path, **values: Any) -> str:
    spec = {"name": unique("doc"), "accelerator": "v6e-8", "context": CONTEXT, "command": "python3 -m workload.train"}
    spec.update(values)
    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def user_kubeconfig(cluster: Cluster, tmp_path: Path, user: str, groups: tuple[str, ...] = ()) -> str:
    """A kubeconfig for a client-certificate user (CN=user, O=groups) signed by the
    cluster's CA: the API server authenticates it, RBAC decides what it may do."""
    pki, d = cluster.root / "pki", tmp_path / user
    d.mkdir()
    subj = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
    ssl = ["openssl"]
    subprocess.run([*ssl, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(d / "key"), "-out", str(d / "csr"), "-subj", subj], check=True, capture_output=True)
    (d / "ext").write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                           "extendedKeyUsage=clientAuth\n")
    subprocess.run([*ssl, "x509", "-req", "-in", str(d / "csr"), "-CA", str(pki / "ca.crt"), "-CAkey",
                    str(pki / "ca.key"), "-CAcreateserial", "-days", "1", "-extfile", str(d / "ext"),
                    "-out", str(d / "crt")], check=True, capture_output=True)
    cfg = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    b64 = lambda p: base64.b64encode(p.read_bytes()).decode()  # noqa: E731
    cfg["users"] = [{"name": user, "user": {"client-certificate-data": b64(d / "crt"),
                                            "client-key-data": b64(d / "key")}}]
    cfg["contexts"] = [{"name": user, "context": {"cluster": cfg["clusters"][0]["name"], "user": user}}]
    cfg["current-context"] = user
    path = d / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def rbac(cluster: Cluster, ns: str, name: str, user: str, rules: list[dict[str, Any]]) -> None:
    from kubernetes import client

    api = client.RbacAuthorizationV1Api(cluster.api_client)
    api.create_namespaced_role(ns, {"metadata": {"name": name}, "rules": rules})
    api.create_namespaced_role_binding(ns, {
        "metadata": {"name": name}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})


# --- a ready cluster -----------------------------------------------------------------------

def test_doctor_on_the_real_cluster_reads_what_the_api_shows(cluster, storage, tmp_path):
    path = run_file(tmp_path, queue="multislice-queue", priority="high", storage=storage)
    r, checks = doctor(cluster.kubeconfig, storage, "-f", path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert list(checks) == ["api", "jobset", "jobset-controller", "rbac", "kueue", "priority", "nodes", "storage",
                            "pod-storage"]
    api = checks["api"]
    assert api["result"] == "ok" and f"(context {CONTEXT}, Kubernetes {KUBE_VERSION}), namespace default" in api["detail"]
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
    assert checks["storage"]["result"] == "ok"
    assert r.stderr.strip() == "xrun: doctor: all checks passed (1 warning(s))"
    # The dry run went through the webhooks and stored nothing.
    audit = [a for a in cluster.audit_lines() if a.get("verb") == "create"
             and (a.get("objectRef") or {}).get("resource") == "jobsets"
             and (a.get("objectRef") or {}).get("name", "").startswith("xrun-doctor-")]
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
        return any(c["type"] == "Active" and c["status"] == "False" for c in (lq.get("status") or {}).get("conditions") or [])

    cluster.wait("Kueue to mark the LocalQueue inactive", inactive, 30)
    r, checks = doctor(cluster.kubeconfig, storage, "-f", run_file(tmp_path, queue="orphan", namespace=ns, storage=storage))
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
    assert checks["jobset"]["result"] == "ok" and "the CRD itself is not readable with your RBAC" in checks["jobset"]["detail"]
    # Cluster-scoped reads: the server says "at the cluster scope", and so does doctor.
    for name, verb, resource in (("priority", "list", "priorityclasses.scheduling.k8s.io"), ("nodes", "list", "nodes")):
        assert checks[name]["result"] == "warn"
        assert (f"forbidden: RBAC must allow verb '{verb}' on resource '{resource}' cluster-wide (a ClusterRole and "
                f"ClusterRoleBinding: a namespace's RoleBinding cannot grant it) (context {user})") in checks[name]["detail"]
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
        assert "but they do not answer, so every JobSet create is refused: create jobsets.jobset.x-k8s.io " in ctl["detail"]
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
