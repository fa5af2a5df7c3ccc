"""The nightly's Kubernetes objects (`xrun nightly --render-cronjob`) on the real control
plane (tests/cluster/up.sh, kube-apiserver v1.36.3 with RBAC): created for real in a fresh
namespace with strict field validation, read back, the CronJob's Job and pod admitted
(dryRun=All), and the nightly's ServiceAccount, with the Role xrun grants it and the
kubeconfig its ConfigMap carries, doing what the cluster backend does.
"""

from __future__ import annotations

import http.client
import json
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import yaml
from cli_helpers import xrun
from cluster_helpers import Cluster, unique

from manifests.nightly import SA_DIR

PATHS = {  # kind -> (API prefix, plural)
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "CronJob": ("/apis/batch/v1", "cronjobs"),
    "Job": ("/apis/batch/v1", "jobs"),
    "Pod": ("/api/v1", "pods"),
}


def nightly_file(tmp_path: Path, ns: str) -> Path:
    data = {
        "prefix": "nightly", "schedule": "30 2 * * 1-5", "time_zone": "Europe/Paris",
        "storage": "gs://team-bucket/xrun", "slice": {"accelerator": "v6e-8"}, "base": "main",
        "branches": {"main": {"image": "example.com/xrun:main", "commit": "abc1234"},
                     "feature": {"image": "example.com/xrun:feature", "commit": "def5678"}},
        "configs": {"tiny": {"command": "python3 -m workload.train --preset tiny steps=100"}},
        "backend": "kube", "namespace": ns, "timeout": "2h",
        "cronjob": {"image": "example.com/xrun-cli:0.1.0", "gcp_service_account": "xrun@p.iam.gserviceaccount.com"},
    }
    path = tmp_path / "nightly.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def request(cluster: Cluster, method: str, path: str, body: Any = None, **query: str) -> tuple[int, Any]:
    """One call to the API server as the cluster's admin (its client certificate)."""
    ctx = ssl.create_default_context(cafile=str(cluster.root / "pki/ca.crt"))
    ctx.load_cert_chain(str(cluster.root / "pki/admin.crt"), str(cluster.root / "pki/admin.key"))
    conn = http.client.HTTPSConnection("127.0.0.1", cluster.state["ports"]["apiserver"], context=ctx, timeout=30)
    try:
        conn.request(method, path + (f"?{urlencode(query)}" if query else ""),
                     body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def collection(kind: str, ns: str) -> str:
    prefix, plural = PATHS[kind]
    return f"{prefix}/namespaces/{ns}/{plural}"


def subset(want: Any, got: Any, where: str = "") -> list[str]:
    """Where ``got`` (what the server stored) lacks or changed something of ``want``."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return [f"{where}: {got!r}"]
        return [d for k, v in want.items() for d in subset(v, got.get(k), f"{where}.{k}")]
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{where}: {got!r}"]
        return [d for i, (w, g) in enumerate(zip(want, got, strict=True)) for d in subset(w, g, f"{where}[{i}]")]
    return [] if want == got else [f"{where}: sent {want!r}, stored {got!r}"]


@pytest.fixture
def nightly(cluster, tmp_path):
    """The rendered objects, created for real, in order, in a fresh namespace."""
    ns = unique("nightly")
    cluster.core.create_namespace({"metadata": {"name": ns}})
    r = xrun("nightly", "-f", str(nightly_file(tmp_path, ns)), "--render-cronjob", storage=tmp_path / "root")
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "CronJob"]
    for doc in docs:
        # Strict: a field the server does not know is an error, not silently dropped.
        code, body = request(cluster, "POST", collection(doc["kind"], ns), doc, fieldValidation="Strict")
        assert code == 201, (doc["kind"], code, body)
    return ns, {d["kind"]: d for d in docs}


def test_the_nightly_objects_are_created_and_read_back_as_rendered(cluster, nightly):
    ns, docs = nightly
    for kind, doc in docs.items():
        code, got = request(cluster, "GET", f"{collection(kind, ns)}/{doc['metadata']['name']}")
        assert code == 200, (kind, got)
        assert subset(doc, got, kind) == [], kind
    code, cron = request(cluster, "GET", f"{collection('CronJob', ns)}/{docs['CronJob']['metadata']['name']}")
    assert cron["spec"]["timeZone"] == "Europe/Paris" and cron["spec"]["concurrencyPolicy"] == "Forbid"


def test_the_cronjobs_job_and_pod_are_admitted(cluster, nightly):
    """What the CronJob controller would create, dry-run: the Job from its jobTemplate (as
    `kubectl create job --from=cronjob/...` makes it), and that Job's pod, which goes through
    the pod admission plugins (ServiceAccount: the account exists and its token is mounted
    where the ConfigMap's kubeconfig reads it)."""
    ns, docs = nightly
    cron_name = docs["CronJob"]["metadata"]["name"]
    _, cron = request(cluster, "GET", f"{collection('CronJob', ns)}/{cron_name}")
    template = cron["spec"]["jobTemplate"]
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": f"{cron_name}-manual", "labels": template["metadata"].get("labels", {}),
                        "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
                        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": cron_name,
                                             "uid": cron["metadata"]["uid"], "controller": True}]},
           "spec": template["spec"]}
    code, got = request(cluster, "POST", collection("Job", ns), job, dryRun="All", fieldValidation="Strict")
    assert code == 201, got
    assert subset(template["spec"], got["spec"], "job") == []
    code, jobs = request(cluster, "GET", collection("Job", ns))
    assert jobs["items"] == []  # dry run: nothing stored

    pod_spec = got["spec"]["template"]["spec"]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"{cron_name}-manual-abcde", "labels": got["spec"]["template"]["metadata"]["labels"]},
           "spec": pod_spec}
    code, admitted = request(cluster, "POST", collection("Pod", ns), pod, dryRun="All", fieldValidation="Strict")
    assert code == 201, admitted
    spec = admitted["spec"]
    assert spec["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]
    (container,) = spec["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/etc/xrun"]["readOnly"] is True
    # The token the in-cluster kubeconfig (ConfigMap) reads is where the server mounts it.
    kubeconfig = yaml.safe_load(docs["ConfigMap"]["data"]["kubeconfig"])
    assert kubeconfig["users"][0]["user"]["tokenFile"] == f"{SA_DIR}/token"
    assert kubeconfig["clusters"][0]["cluster"]["certificate-authority"] == f"{SA_DIR}/ca.crt"
    token_volume = next(v for v in spec["volumes"] if v["name"] == mounts[SA_DIR]["name"])
    sources = token_volume["projected"]["sources"]
    assert any("serviceAccountToken" in s and s["serviceAccountToken"]["path"] == "token" for s in sources)
    assert any(i["path"] == "ca.crt" for s in sources for i in (s.get("configMap") or {}).get("items", []))

    # Without its ServiceAccount the pod is refused: the objects' order matters.
    request(cluster, "DELETE", f"{collection('ServiceAccount', ns)}/{spec['serviceAccountName']}")
    code, refused = request(cluster, "POST", collection("Pod", ns), pod, dryRun="All")
    assert code == 403 and "serviceaccount" in refused["message"].lower(), refused


def test_the_nightlys_service_account_can_do_what_xrun_does(cluster, nightly, gcs_bucket, tmp_path):
    """The pod's identity: a token of the nightly's ServiceAccount (TokenRequest, as the
    kubelet mounts it) in the kubeconfig the ConfigMap carries, pointed at this server. With
    only the Role xrun renders, doctor's rbac check passes and a run is submitted, read,
    and deleted."""
    ns, docs = nightly
    sa = docs["ServiceAccount"]["metadata"]["name"]
    token = cluster.core.create_namespaced_service_account_token(
        sa, ns, {"spec": {"audiences": [], "expirationSeconds": 3600}}).status.token
    (tmp_path / "token").write_text(token)
    kubeconfig = yaml.safe_load(docs["ConfigMap"]["data"]["kubeconfig"])
    server = yaml.safe_load(Path(cluster.kubeconfig).read_text())["clusters"][0]["cluster"]["server"]
    kubeconfig["clusters"][0]["cluster"] = {"server": server, "certificate-authority": str(cluster.root / "pki/ca.crt")}
    kubeconfig["users"][0]["user"]["tokenFile"] = str(tmp_path / "token")
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    storage = f"{gcs_bucket}/xrun"

    r = xrun("doctor", "-o", "json", "--storage", storage, storage=storage, KUBECONFIG=str(path))
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks["api"]["result"] == "ok" and f"namespace {ns}" in checks["api"]["detail"]
    assert checks["rbac"]["result"] == "ok", checks["rbac"]
    assert r.returncode == 0, r.stdout + r.stderr

    name = unique("nightly-run")
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({"name": name, "accelerator": "v6e-8", "image": "example.com/xrun:1",
                                   "xrun_image": "example.com/xrun-workload:1", "command": "python3 -m workload.train",
                                   "termination_grace_seconds": 2}))
    for args in (("submit", "-f", str(run), "--detach"), ("status", name), ("delete", name)):
        r = xrun(*args, storage=storage, timeout=180, KUBECONFIG=str(path))
        assert r.returncode == 0, (args, r.stdout, r.stderr)
