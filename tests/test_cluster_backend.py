"""KubeBackend and the `xrun` CLI against the real control plane (tests/cluster/up.sh):
kube-apiserver v1.36.3 with RBAC, the JobSet and Job controllers, the scheduler, Kueue, KWOK
nodes shaped like GKE pools.

What crossed the wire is read from the API server's audit log (JobSet writes are logged
with their request bodies: controlplane.py's audit policy); what a cluster without JobSet
or of another version answers comes through tests/kube_fault_proxy.py, the one hand-written
part, for what the session's one cluster cannot be made to be.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import xrun
from cluster_helpers import NAMESPACE, Cluster, dead_kubeconfig, timing, unique
from kube_fault_proxy import KubeFaultProxy
from kubernetes.client.exceptions import ApiException

from manifests import admission
from manifests.jobset import jobset
from manifests.spec import build_spec
from orchestrator.backends.kube.backend import KubeBackend
from orchestrator.backends.kube.state import host_status, latest_hosts, one_line, pod_host
from xrun_contract import Layout
from xrun_contract.errors import XrunError
from xrun_contract.storage import open_storage

CONTEXT = "xrun-test"
NOWHERE = {"cloud.google.com/gke-nodepool": "no-such-pool"}  # no node has it: Unschedulable


@pytest.fixture
def storage(gcs_bucket) -> str:
    return f"{gcs_bucket}/xrun"


@pytest.fixture
def proxy(cluster):
    p = KubeFaultProxy(cluster).start()
    yield p
    p.stop()


def values(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "accelerator": "v6e-8", "image": "example.com/xrun:1", "backend": "kube",
            "xrun_image": "example.com/xrun-workload:1", "storage": "gs://xrun-bucket/runs",
            "command": "python3 -m workload.train", "termination_grace_seconds": 2,
            "pod_annotations": timing(run_s=60), **extra}


def manifest(name: str, **extra: Any) -> dict[str, Any]:
    return jobset(build_spec(values(name, **extra), {}))


def backend_for(kubeconfig: str, namespace: str | None = NAMESPACE, context: str | None = None) -> KubeBackend:
    return KubeBackend(context, namespace, kubeconfig, poll_seconds=0.1, watch_timeout_seconds=5)


def run_file(tmp_path: Path, name: str, **extra: Any) -> str:
    spec = values(name, context=CONTEXT, **extra)
    del spec["backend"], spec["storage"]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def one_error_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xrun: error: "), r.stderr
    return lines[0][len("xrun: error: "):]


def error_of(fn, *args, **kwargs) -> XrunError:
    with pytest.raises(XrunError) as info:
        fn(*args, **kwargs)
    assert "\n" not in str(info.value)
    return info.value


def running(cluster: Cluster, name: str, n: int, attempt: int = 0) -> list[dict[str, Any]]:
    def ok():
        pods = [p for p in cluster.pods(name) if p["status"].get("phase") == "Running"
                and pod_host(p)[1] == attempt and not p["metadata"].get("deletionTimestamp")]
        return pods if len(pods) == n else None
    return cluster.wait(f"{n} pods of {name} Running (attempt {attempt})", ok, 60, every=0.2)


def writes(cluster: Cluster, name: str, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The audit log's JobSet writes of ``name`` (its create posts and its deletes), in order."""
    base = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets"
    out = [e for e in cluster.audit_lines() if e.get("stage") == "ResponseComplete"
           and e["verb"] in ("create", "delete") and e["requestURI"].split("?")[0] in (base, f"{base}/{name}")
           and (e["verb"] == "delete" or (e.get("requestObject") or {}).get("metadata", {}).get("name") == name)]
    return sorted(out, key=lambda e: e["stageTimestamp"])


# --- submit, and why a run is Pending ------------------------------------------------------

def test_submit_sends_the_rendered_body_and_pending_says_why(cluster, proxy, storage, tmp_path):
    """The JobSet is created exactly as rendered (the body as it left the client: the audit
    log's is the object after the mutating webhooks); its pods find no node: the scheduler's
    reason per host and its events. Then the kubelet's reports of init containers that cannot
    start (its status of each pod, as KWOK cannot pull images) show as themselves."""
    name = unique("why")
    backend = backend_for(proxy.kubeconfig(tmp_path / "proxied"))
    body = manifest(name, num_slices=3, node_selector=NOWHERE)
    try:
        backend.submit(body)
        assert proxy.sent("POST", "/jobsets$") == [body]
        (create,) = cluster.wait("the create in the audit log", lambda: writes(cluster, name), 20)
        assert create["responseStatus"]["code"] == 201

        def unschedulable():
            st = backend.status(name)
            return st if len(st.hosts) == 3 and any(e.startswith("FailedScheduling (") for e in st.events) and all(
                h.reason.startswith("Unschedulable: ") for h in st.hosts) else None
        st = cluster.wait("the scheduler's verdict", unschedulable, 60, every=0.5)
        assert st.state == "Pending"
        # JobSet's exclusive placement: a slice's followers wait for its leader to be placed.
        assert [h.host for h in st.hosts] == ["0-0", "1-0", "2-0"]
        assert any("leader pod not yet scheduled" in e for e in st.events), st.events
        reason = st.hosts[0].reason
        assert "node(s) didn't match Pod's node affinity/selector" in reason and reason.startswith("Unschedulable: 0/")
        assert any(e.startswith("FailedScheduling (") and "didn't match Pod's node affinity/selector" in e
                   for e in st.events), st.events
        pods = [e for e in cluster.audit_lines() if e["verb"] == "list" and e["requestURI"].startswith(
            f"/api/v1/namespaces/{NAMESPACE}/pods?") and name in e["requestURI"]]
        assert pods and all(f"labelSelector=jobset.sigs.k8s.io/jobset-name={name}" in urllib.parse.unquote(
            e["requestURI"]) for e in pods)

        # The kubelet's report of each stuck pod (Init:ErrImagePull and the like).
        pull = ('failed to pull and unpack image "docker.io/library/xrun-workload:0.1.0": pull access denied, '
                'repository does not exist or may require authorization')
        cases = {
            "0-0": ([{"waiting": {"reason": "ErrImagePull", "message": pull}}, INITIALIZING],
                    f"ErrImagePull: init container xrun-init: {pull}"),
            "1-0": ([{"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x:1"'}},
                     INITIALIZING], 'ImagePullBackOff: init container xrun-init: Back-off pulling image "x:1"'),
            "2-0": ([INIT_DONE, {"waiting": {"reason": "CreateContainerConfigError",
                                             "message": 'secret "gcs-key" not found'}}],
                    'CreateContainerConfigError: init container xrun-logs: secret "gcs-key" not found'),
        }
        for pod in cluster.pods(name):
            host, _ = pod_host(pod)
            if host in cases:
                stuck(cluster, pod, cases[host][0])
                assert host_status(cluster.core.api_client.sanitize_for_serialization(
                    cluster.core.read_namespaced_pod(pod["metadata"]["name"], NAMESPACE))).reason == \
                    one_line(cases[host][1], 160)
        open_storage(storage).write_json(Layout.run_json(name), {
            "name": name, "backend": "kube", "context": CONTEXT, "namespace": NAMESPACE,
            "spec": {"accelerator": "v6e-8"}})
        r = xrun("status", name, "-o", "json", storage=storage, timeout=60, KUBECONFIG=cluster.kubeconfig)
        assert r.returncode == 0, r.stderr
        shown = {h["host"]: (h["state"], h["reason"]) for h in json.loads(r.stdout)["hosts"]}
        for host, (_, reason) in cases.items():
            assert shown[host] == ("Pending", one_line(reason, 160)), shown
        r = xrun("status", name, storage=storage, timeout=60, KUBECONFIG=cluster.kubeconfig, COLUMNS="400")
        assert r.returncode == 0 and one_line(cases["2-0"][1], 160) in r.stdout, r.stdout
        # status's LIST keeps only the fields it reads: the same hosts as the whole pods say
        (full, _), (lean, _) = backend.list_pods(name), backend.list_pods(name, lean=True)
        assert latest_hosts(lean) == latest_hosts(full) and "managedFields" not in lean[0]["metadata"]
    finally:
        cluster.delete_jobset(name)


INIT_DONE = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "2026-12-04T20:00:03Z",
                            "finishedAt": "2026-12-04T20:00:04Z", "containerID": "containerd://abc"}}
INITIALIZING = {"waiting": {"reason": "PodInitializing"}}


def stuck(cluster: Cluster, pod: dict[str, Any], init_states: list[dict[str, Any]]) -> None:
    """Patch a (never scheduled) pod's status as the kubelet reports one whose init container
    cannot start: Initialized False, the workload waiting on PodInitializing."""
    inits = pod["spec"]["initContainers"]
    statuses = [{"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
                 "started": False, "state": s, "lastState": {}} for c, s in zip(inits, init_states, strict=True)]
    containers = [{"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
                   "started": False, "state": INITIALIZING, "lastState": {}} for c in pod["spec"]["containers"]]
    cluster.core.patch_namespaced_pod_status(pod["metadata"]["name"], NAMESPACE, {"status": {
        "initContainerStatuses": statuses, "containerStatuses": containers}})


# --- errors: one line, the right exit code, nothing created --------------------------------

def test_backend_errors_are_one_line_with_exit_codes(cluster, proxy, tmp_path):
    name = unique("errs")
    body = manifest(name)
    # No JobSet CRD (the proxy answers as such a cluster does): submit and status say so.
    proxy.hide_group("jobset.x-k8s.io")
    hidden = backend_for(proxy.kubeconfig(tmp_path / "proxied"))
    e = error_of(hidden.submit, body)
    assert e.exit_code == 1 and str(e).startswith(
        "JobSet CRD not installed: jobset.x-k8s.io/v1alpha2 jobsets is not served by https://127.0.0.1:")
    assert "kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/releases/download/" in str(e)
    assert "JobSet CRD not installed" in str(error_of(hidden.status, name))

    # A namespace that does not exist: the real server's 404 names it.
    nope = unique("nope")
    e = error_of(backend_for(cluster.kubeconfig, nope).submit, manifest(name, namespace=nope))
    assert e.exit_code == 1 and str(e) == f"namespace '{nope}' does not exist in context {CONTEXT}"
    e = error_of(backend_for(cluster.kubeconfig, context="elsewhere").status, name)
    assert e.exit_code == 2 and str(e).startswith("--context: no context 'elsewhere' in kubeconfig")

    # A CA the server's certificate is not signed by: TLS fails, exit 3.
    cfg = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    import base64
    import subprocess

    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(tmp_path / "other.key"), "-out", str(tmp_path / "other.crt"), "-days", "1",
                    "-subj", "/CN=other-ca"], check=True, capture_output=True)
    cfg["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(
        (tmp_path / "other.crt").read_bytes()).decode()
    (tmp_path / "untrusted").write_text(yaml.safe_dump(cfg))
    e = error_of(backend_for(str(tmp_path / "untrusted")).list)
    assert e.exit_code == 3 and "CERTIFICATE_VERIFY_FAILED" in str(e)
    with pytest.raises(ApiException) as info:
        cluster.jobset(name)
    assert info.value.status == 404  # nothing was created by any failed attempt


def test_submit_rejections_are_one_line_with_exit_codes(cluster, proxy, storage, tmp_path):
    store = open_storage(storage)
    created: list[str] = []

    def submit(name: str, *extra: str, config: str = cluster.kubeconfig, **values: Any):
        created.append(name)
        return xrun("submit", "-f", run_file(tmp_path, name, **values), "--detach", *extra, storage=storage,
                    timeout=90, KUBECONFIG=config)

    try:
        proxy.hide_group("jobset.x-k8s.io")
        nocrd = unique("nocrd")
        r = submit(nocrd, config=proxy.kubeconfig(tmp_path / "proxied"))
        assert r.returncode == 1
        assert one_error_line(r).startswith(
            "JobSet CRD not installed: jobset.x-k8s.io/v1alpha2 jobsets is not served by https://127.0.0.1:")
        # Traceable although rejected: manifest and run.json were written first.
        assert store.read_json(Layout.run_json(nocrd))["name"] == nocrd
        assert yaml.safe_load(store.read_text(Layout.manifest(nocrd)))["kind"] == "JobSet"

        taken = unique("taken")
        backend_for(cluster.kubeconfig).submit(manifest(taken))
        r = submit(taken)
        assert r.returncode == 1
        assert one_error_line(r) == (f"jobsets.jobset.x-k8s.io '{taken}' already exists in namespace 'default'; "
                                     "use --replace or another name")
        r = submit(taken, "--replace")  # the JobSet is live: its checkpoints are not deleted
        assert r.returncode == 2 and one_error_line(r).startswith(f"name: run '{taken}' is ")
        assert (f"--replace would delete its checkpoints: wait for it to end, 'xrun delete {taken}', or add --force"
                in r.stderr)
        r = submit(taken, "--replace", "--force")
        assert r.returncode == 0, r.stderr
        assert [(w["verb"], w["requestURI"].split("?")[0].rsplit("/", 1)[-1]) for w in writes(cluster, taken)] == [
            ("create", "jobsets"), ("create", "jobsets"), ("delete", taken), ("create", "jobsets")]

        # A user whose RBAC lets them read JobSets but not create them.
        user = unique("dev")
        cluster.grant(NAMESPACE, user, user, [{"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"],
                                               "verbs": ["get", "list", "watch"]}])
        r = submit(unique("rbac"), config=cluster.user_kubeconfig(tmp_path, user, context=CONTEXT))
        assert r.returncode == 1
        line = one_error_line(r)
        assert line.startswith("forbidden: RBAC must allow verb 'create' on resource 'jobsets.jobset.x-k8s.io' "
                               f"in namespace 'default' (context {CONTEXT}): ")
        assert f'User "{user}" cannot create resource "jobsets" in API group "jobset.x-k8s.io"' in line

        # JobSet's webhook refuses a failure-policy rule name with a hyphen.
        hooked = unique("hook")
        bad = manifest(hooked)
        bad["spec"]["failurePolicy"]["rules"][0]["name"] = "fail-on-user-error"
        e = error_of(backend_for(cluster.kubeconfig).submit, bad)
        assert e.exit_code == 1 and str(e).startswith(
            f"jobsets.jobset.x-k8s.io '{hooked}' rejected by the cluster (422 Invalid): "
            'admission webhook "vjobset.kb.io" denied the request:')
        assert "failure policy rule name 'fail-on-user-error'" in str(e)

        # Credentials the server does not know: 401, exit 3.
        cfg = yaml.safe_load(Path(cluster.kubeconfig).read_text())
        cfg["users"][0]["user"] = {"token": "expired-token"}
        (tmp_path / "expired").write_text(yaml.safe_dump(cfg))
        r = submit(unique("expired"), config=str(tmp_path / "expired"))
        assert r.returncode == 3 and one_error_line(r).startswith("credentials rejected (401 Unauthorized) by https://")

        r = submit(unique("far"), config=dead_kubeconfig(cluster, tmp_path / "dead"))
        assert r.returncode == 3 and one_error_line(r).startswith("cannot reach the Kubernetes API at https://127.0.0.1:")
        live = {j["metadata"]["name"] for j in cluster.custom.list_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", NAMESPACE, "jobsets")["items"]}
        assert set(created) & live == {taken}
    finally:
        for n in created:
            cluster.delete_jobset(n)


def test_cluster_submit_refuses_an_xrun_image_without_a_registry(cluster, storage, tmp_path):
    """An xrun_image without a registry host (xrun-workload:<version>, the local runs' name):
    on a cluster the nodes would look for it on Docker Hub and every pod would stay
    Init:ErrImagePull. Unset, the pods run the public python image (README "Any image")."""
    flags = ["--tpu", "v6e-8", "--image", "us-docker.pkg.dev/p/r/xrun-workload:1", "--context", CONTEXT]
    allowed = ("cluster runs need an image in a registry the nodes can pull from, its first path component a "
               "registry host (with a '.' or ':', or localhost), e.g. us-docker.pkg.dev/PROJECT/REPO/"
               "xrun-workload:0.1.0: build the Dockerfile, push it, set xrun_image (README \"Any image\")")
    noreg = unique("noreg")
    for extra in (["--xrun-image", "xrun-workload:0.1.0"], ["--xrun-image", "xrun/xrun-workload:0.1.0"],
                  ["--xrun-image", "xrun-workload:0.1.0", "--dry-run"]):
        r = xrun("submit", "--name", noreg, *flags, *extra, "--detach", storage=storage, KUBECONFIG=cluster.kubeconfig)
        image = extra[1]
        assert r.returncode == 2, (extra, r.stderr)
        assert one_error_line(r) == (f"xrun_image: {image!r} names no registry, so the cluster's nodes cannot "
                                     f"pull it; {allowed}"), extra
        assert r.stdout == ""
    assert open_storage(storage).list("", delimiter=None)[0] == []  # nothing written
    assert writes(cluster, noreg) == []
    names = []
    try:
        # A registry host: a '.', a ':' (port) or localhost (kind's locally loaded images).
        for image in ["localhost/xrun:1", "localhost:5000/xrun:1", "registry.test/xrun:1"]:
            names.append(unique("reg"))
            r = xrun("submit", "--name", names[-1], *flags, "--xrun-image", image, "--detach", storage=storage,
                     KUBECONFIG=cluster.kubeconfig)
            assert r.returncode == 0, r.stderr
            assert cluster.jobset(names[-1])["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
                "initContainers"][0]["image"] == image
    finally:
        for n in names:
            cluster.delete_jobset(n)
    r = xrun("submit", "--name", "local", "--accelerator", "cpu-2", "--image", "local", "--dry-run",
             storage=tmp_path / "local")
    assert r.returncode == 0 and "image: xrun-workload:0.1.0" in r.stdout, r.stderr
    # No xrun_image: the public python image, with xrun's pod code uploaded to the storage root.
    from orchestrator.services.podcode import bundle

    default = unique("pub")
    try:
        r = xrun("submit", "--name", default, *flags, "--detach", storage=storage, KUBECONFIG=cluster.kubeconfig)
        assert r.returncode == 0, r.stderr
        inits = cluster.jobset(default)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
            "initContainers"]
        assert [c["image"] for c in inits] == ["python:3.12-slim", "python:3.12-slim"]
        sha, data = bundle()
        assert open_storage(storage).read_bytes(Layout.pod_code(sha)) == data
    finally:
        cluster.delete_jobset(default)


def test_a_server_without_native_sidecars_is_refused(cluster, proxy, storage, tmp_path):
    """Kubernetes 1.28 drops restartPolicy: Always from init containers: the log shipper would
    hold every pod in Init for ever, so nothing is created (the proxy reports the version)."""
    from orchestrator.backends.kube.backend import sidecar_problem
    from orchestrator.services import doctor

    config = proxy.kubeconfig(tmp_path / "proxied")
    name = unique("old")
    proxy.git_version("v1.28.15-gke.1435000")
    r = xrun("submit", "-f", run_file(tmp_path, name), "--detach", storage=storage, KUBECONFIG=config)
    assert r.returncode == 1, r.stderr
    assert one_error_line(r).startswith(
        "Kubernetes v1.28.15-gke.1435000 has no native sidecars: xrun's log shipper (xrun-logs, an init container "
        "with restartPolicy: Always) needs Kubernetes >= 1.29 (1.28 has them only behind the SidecarContainers "
        "feature gate, off by default)")
    assert not [m for m, u in proxy.seen if m == "POST"]
    assert open_storage(storage).list("", delimiter=None)[0] == []  # nothing written: the name stays free
    for version, gate_note in (("v1.28.15-gke.1435000", True), ("v1.27.16-gke.2703000", False)):
        proxy.git_version(version)
        checks = doctor.run_checks(backend_for(config), shape=None, needed_nodes=0, queue="",
                                   storage_root=str(tmp_path))
        api = checks[0]
        assert (api.name, api.result, api.exit_code) == ("api", "FAIL", 1)
        assert (f"Kubernetes {version}), namespace default; Kubernetes {version} has no native sidecars: xrun's "
                "log shipper (xrun-logs, an init container with restartPolicy: Always) needs Kubernetes >= 1.29"
                ) in api.detail
        assert ("1.28 has them only behind the SidecarContainers feature gate" in api.detail) == gate_note
        # The API answered: the cluster's other checks still run.
        assert [(c.name, c.result) for c in checks][1:4] == [("jobset", "ok"), ("jobset-controller", "warn"),
                                                             ("rbac", "ok")]
    proxy.git_version(None)
    try:
        r = xrun("submit", "-f", run_file(tmp_path, name), "--detach", storage=storage, KUBECONFIG=config)
        assert r.returncode == 0, r.stderr
        assert len([m for m, u in proxy.seen if u.split("?")[0].rstrip("/") == "/version"]) >= 2  # each submit
        check = doctor.check_api(backend_for(cluster.kubeconfig))
        assert check.result == "ok" and "Kubernetes v1.36.3)" in check.detail
    finally:
        cluster.delete_jobset(name)
    for version in ("v1.29.0", "v1.31.4-gke.1000", "v2.0.0"):
        assert sidecar_problem(version) == ""


# --- replace, list, delete -----------------------------------------------------------------

def pool_free(cluster: Cluster, pool: str = "v6e-2x4") -> None:
    """Wait until no pod sits on ``pool``'s nodes: the JobSets earlier tests deleted in the
    background may still hold its slices while their pods end."""
    node = re.compile(rf"{re.escape(pool)}-\d+-\d+$")

    def free():
        pods = json.loads(cluster.core.list_pod_for_all_namespaces(_preload_content=False).data)["items"]
        held = [p["metadata"]["name"] for p in pods if node.match(p["spec"].get("nodeName") or "")]
        return not held or None
    cluster.wait(f"the {pool} pool free of earlier tests' pods", free, 120, every=0.5)


def test_replace_list_and_delete(cluster):
    backend = backend_for(cluster.kubeconfig)
    one, two, foreign = unique("one"), unique("two"), unique("foreign")
    pool_free(cluster)  # one and two take both of its slices
    try:
        backend.submit(manifest(one))
        backend.submit(manifest(two))
        alien = manifest(foreign, node_selector=NOWHERE)  # listed only: it takes no slice of the 2x4 pool
        del alien["metadata"]["labels"]["xrun.dev/run"]
        backend.submit(alien)
        running(cluster, one, 2)
        # --replace: the old JobSet is deleted in the foreground, its pods waited for.
        backend.submit(manifest(one, command="python3 -m workload.train --preset tiny"), replace=True)
        verbs = [(w["verb"], w.get("requestObject", {}).get("propagationPolicy")) for w in writes(cluster, one)]
        assert verbs == [("create", None), ("create", None), ("delete", "Foreground"), ("create", None)]
        command = cluster.jobset(one)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
            "containers"][0]["command"]
        assert "--preset tiny" in str(command)
        assert all(p["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-uid"] == cluster.jobset(one)["metadata"]["uid"]
                   for p in cluster.pods(one))  # none of the old JobSet's pods is left
        # Only xrun's JobSets are listed; a failed one as Failed.
        failed = running(cluster, two, 2)[0]
        cluster.fail_pod(failed["metadata"]["name"], 1)
        cluster.wait_condition(two, "Failed", 60)
        listed = {r["name"]: r for r in backend.list()}
        assert one in listed and two in listed and foreign not in listed
        assert listed[two]["state"] == "Failed" and listed[one]["state"] in ("Pending", "Running")
        assert isinstance(listed[one]["created"], float)
        lists = [e for e in cluster.audit_lines() if e["verb"] == "list"
                 and e["requestURI"].startswith(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NAMESPACE}/jobsets?")]
        assert lists and "labelSelector=xrun.dev/run" in urllib.parse.unquote(lists[-1]["requestURI"])
        # --no-wait returns at once; waiting returns once the pods and the JobSet are gone.
        running(cluster, one, 2)
        assert backend.delete(one, wait=False) is True
        assert backend.delete(two, wait=True) is True
        assert cluster.pods(two) == [] and backend.get_jobset(two) is None
        assert backend.delete(two) is False  # already gone
        assert {w["requestObject"]["propagationPolicy"] for n in (one, two) for w in writes(cluster, n)
                if w["verb"] == "delete"} == {"Foreground"}
    finally:
        for n in (one, two, foreign):
            cluster.delete_jobset(n)


# --- a run that restarted: the screen, logs from pods and storage, prefixes ----------------

@pytest.fixture(scope="module")
def restarted(cluster, gcs_emulator):
    """A run whose host 0-0 exited 42 once: JobSet restarted it (attempt 1 Running), each
    pod's log served by KWOK from a file; yields (name, the attempt-1 pods by host)."""
    name = unique("rs")
    backend = backend_for(cluster.kubeconfig)
    backend.submit(manifest(name, pod_annotations=timing(run_s=120, start_s=0.4)))
    try:
        first = running(cluster, name, 2)
        victim = next(p for p in first if pod_host(p)[0] == "0-0")
        cluster.fail_pod(victim["metadata"]["name"], 42)
        pods = {pod_host(p)[0]: p["metadata"]["name"] for p in running(cluster, name, 2, attempt=1)}
        for host, pod in pods.items():
            cluster.serve_logs(pod, ["workload"])
            cluster.write_log(pod, "workload", [f"{host} second try", f"{host} step 7"])
        yield name, pods
    finally:
        cluster.delete_jobset(name)


def test_the_status_screen_is_the_local_one(cluster, restarted, tmp_path):
    """The live view of a cluster run renders through orchestrator.screen like a local run."""
    from rich.console import Console

    from orchestrator.cli.screen import render_table
    from orchestrator.readers.loaders import read_stored_run
    from orchestrator.services.view import run_view

    name, pods = restarted
    storage = open_storage(str(tmp_path / "store"))
    storage.write_json(Layout.run_json(name), {"name": name, "backend": "kube", "spec": {"accelerator": "v6e-8"}})
    view = run_view(storage, read_stored_run(storage, name), backend_for(cluster.kubeconfig).status(name))
    console = Console(record=True, width=200)
    console.print(render_table(view))
    text = console.export_text()
    assert "restarts 1" in text and "kube backend, v6e-8" in text
    assert pods["0-0"] in text and pods["0-1"] in text


def test_logs_take_attempts_without_pods_from_storage(cluster, restarted, tmp_path):
    from orchestrator.services.logs import log_lines

    name, pods = restarted
    storage = open_storage(str(tmp_path / "store"))
    backend = backend_for(cluster.kubeconfig)
    for host in ("0-0", "0-1"):  # what the pod wrapper shipped: attempt 0 (pods gone), attempt 1
        storage.write_text(Layout.log_chunk(name, host, 0, 0), f"{host} first try\n{host} exit 42\n")
        storage.write_text(Layout.log_chunk(name, host, 1, 0), f"{host} second try\n")
    got = list(log_lines(storage, name, backend))
    assert got[:4] == [("0-0", 0, "0-0 first try"), ("0-0", 0, "0-0 exit 42"),
                       ("0-1", 0, "0-1 first try"), ("0-1", 0, "0-1 exit 42")]
    assert sorted(got[4:]) == [("0-0", 1, "0-0 second try"), ("0-0", 1, "0-0 step 7"),
                               ("0-1", 1, "0-1 second try"), ("0-1", 1, "0-1 step 7")]  # from the pods, once
    assert list(log_lines(storage, name, backend, tail=1, hosts={"0-1"})) == [("0-1", 1, "0-1 step 7")]
    # Each pod's log read once, without follow, tailLines passed to the server.
    logs = [e["requestURI"] for e in cluster.audit_lines()
            if e["verb"] == "get" and e.get("stage") == "ResponseComplete"
            and any(e["requestURI"].startswith(f"/api/v1/namespaces/{NAMESPACE}/pods/{p}/log") for p in pods.values())]
    assert logs and not [u for u in logs if "follow=true" in u]
    assert any("tailLines=1" in u for u in logs) and all(pods["0-0"] not in u for u in logs if "tailLines=1" in u)


def test_kube_logs_prints_prefixed_lines_and_one_line_errors(cluster, restarted, storage, tmp_path):
    name, pods = restarted
    store = open_storage(storage)
    store.write_json(Layout.run_json(name), {"name": name, "backend": "kube", "context": CONTEXT,
                                             "namespace": NAMESPACE})
    r = xrun("logs", name, "--host", "0-0", storage=storage, KUBECONFIG=cluster.kubeconfig)
    assert r.returncode == 0 and r.stdout == "[0-0 #1] 0-0 second try\n[0-0 #1] 0-0 step 7\n", r.stderr
    r = xrun("logs", name, "--host", "0-0", "--no-prefix", storage=storage, KUBECONFIG=cluster.kubeconfig)
    assert r.stdout == "0-0 second try\n0-0 step 7\n"
    # A user who may read pods but not their logs.
    user = unique("nolog")
    cluster.grant(NAMESPACE, user, user, [
        {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["get", "list", "watch"]}])
    r = xrun("logs", name, "--host", "0-0", storage=storage,
             KUBECONFIG=cluster.user_kubeconfig(tmp_path, user, context=CONTEXT))
    assert r.returncode == 1
    assert r.stderr.startswith("xrun: error: forbidden: RBAC must allow verb 'get' on resource 'pods/log' in "
                               "namespace 'default'"), r.stderr
    assert r.stderr.count("\n") == 1


# --- the context's namespace; events by field selector; Job creation refused ---------------

def test_namespace_comes_from_the_context_and_a_quota_refusal_shows(cluster, storage, tmp_path):
    """The kubeconfig context's namespace is the run's; there a ResourceQuota of no pods makes
    the real Job controller's creates fail (FailedCreate), which status shows, read by
    field-selected event lists."""
    from kubernetes import client

    ns = cluster.namespace("team")
    try:
        client.CoreV1Api(cluster.api_client).create_namespaced_resource_quota(ns, {
            "metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}})
        cfg = yaml.safe_load(Path(cluster.kubeconfig).read_text())
        cfg["contexts"][0]["context"]["namespace"] = ns
        kc = tmp_path / "kc"
        kc.write_text(yaml.safe_dump(cfg))
        assert backend_for(str(kc), namespace=None).namespace == ns
        name = unique("ns")
        rendered = xrun("render", "-f", run_file(tmp_path, name), "-o", "json", storage=storage, KUBECONFIG=str(kc))
        assert "namespace" not in json.loads(rendered.stdout)["metadata"]  # kubectl apply: the context's
        r = xrun("submit", "-f", run_file(tmp_path, name), "--detach", storage=storage, KUBECONFIG=str(kc))
        assert r.returncode == 0, r.stderr
        assert cluster.custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", name)
        assert open_storage(storage).read_json(Layout.run_json(name))["namespace"] == ns
        backend = backend_for(str(kc), namespace=None)

        def failed_create():
            st = backend.status(name)
            return st if any(e.startswith("FailedCreate (job/") for e in st.events) else None
        st = cluster.wait("FailedCreate in status", failed_create, 60, every=1)
        assert st.state == "Pending" and st.hosts == []
        line = next(e for e in st.events if e.startswith("FailedCreate (job/"))
        assert "Error creating: pods " in line and "is forbidden: exceeded quota: no-pods" in line
        asked = [e["requestURI"] for e in cluster.audit_lines()
                 if e["verb"] == "list" and e["requestURI"].startswith(f"/api/v1/namespaces/{ns}/events?")]
        assert asked and all("fieldSelector=involvedObject." in u for u in asked)
        r = xrun("status", name, "-o", "json", storage=storage, KUBECONFIG=str(kc))
        assert r.returncode == 0 and json.loads(r.stdout)["state"] == "Pending"
    finally:
        cluster.drop_namespace(ns)


# --- a run's end outlives its JobSet -------------------------------------------------------

def test_status_of_a_run_whose_jobset_the_ttl_deleted(cluster, storage, tmp_path):
    """JobSet's ttlSecondsAfterFinished deletes it after a restart and a success: a backend
    that never saw it reads the end (and the restart) from the events JobSet recorded; `xrun
    status` says Succeeded before and after (storage learnt the end)."""
    name = unique("ttl")
    r = xrun("submit", "-f", run_file(tmp_path, name, pod_annotations=timing(run_s=2, start_s=0.4)), "--detach",
             storage=storage, KUBECONFIG=cluster.kubeconfig)
    assert r.returncode == 0, r.stderr
    try:
        victim = next(p for p in running(cluster, name, 2) if pod_host(p)[0] == "0-1")
        cluster.fail_pod(victim["metadata"]["name"], 42)
        cluster.custom.patch_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NAMESPACE, "jobsets", name,
                                                      {"spec": {"ttlSecondsAfterFinished": 5}})
        # (5 s, not 1: with 1 the TTL once deleted it between two polls of a loaded machine)
        cluster.wait_condition(name, "Completed", 90)
        r = xrun("status", name, "-o", "json", storage=storage, KUBECONFIG=cluster.kubeconfig)
        before = json.loads(r.stdout)
        assert (before["state"], before["restarts"]) == ("Succeeded", 1), r.stderr
        seen = backend_for(cluster.kubeconfig)
        assert seen.status(name).restarts == 1

        def gone():
            try:
                cluster.jobset(name)
            except ApiException as e:
                return e.status == 404
            return False
        cluster.wait("the TTL deleted the JobSet", gone, 60, every=0.5)
        for b in (seen, backend_for(cluster.kubeconfig)):  # one that saw it, one that never did
            st = b.status(name)
            assert (st.state, st.restarts) == ("Succeeded", 1), st
            assert "completed" in st.message.lower(), st.message
        r = xrun("status", name, "-o", "json", storage=storage, KUBECONFIG=cluster.kubeconfig)
        after = json.loads(r.stdout)
        assert r.returncode == 0 and (after["state"], after["restarts"]) == ("Succeeded", 1)
        state = open_storage(storage).read_json(Layout.state(name))
        assert state["state"] == "Succeeded"
    finally:
        cluster.delete_jobset(name)


# --- logs followed while a kubelet is unreachable -----------------------------------------

def test_logs_follow_across_an_unreachable_kubelet(cluster, storage, tmp_path):
    """Host 0-1's kubelet goes away mid-stream: the API server's log proxy answers 500 (it
    cannot dial it) and the follower keeps retrying; once the kubelet is back it resumes
    from the last line it printed, every line exactly once, also those written meanwhile."""
    from test_cluster_logs import Feeder, follow_logs, printed, wait_line

    name = unique("kl")
    feeder = Feeder(cluster, name, lines=30, every=0.1)
    seen: dict[str, Any] = {}

    def disrupt() -> None:
        wait_line(feeder, 8)
        pod = next(p for p in cluster.pods(name) if pod_host(p)[0] == "0-1")
        with cluster.kubelet_unreachable(pod["spec"]["nodeName"]):
            with pytest.raises(ApiException) as info:
                cluster.core.read_namespaced_pod_log(pod["metadata"]["name"], NAMESPACE, container="workload")
            seen["status"], seen["body"] = info.value.status, info.value.body
            wait_line(feeder, 20)  # written while nobody can read them
            refused = [e for e in cluster.audit_lines() if e["verb"] == "get" and e["requestURI"].startswith(
                f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}/log?")
                and e.get("responseStatus", {}).get("code") == 500]
            seen["refused"] = len(refused)

    try:
        out, err = follow_logs(cluster, storage, tmp_path, name, feeder, run_s=5, disrupt=disrupt)
    finally:
        cluster.delete_jobset(name)
    assert seen["status"] == 500 and "connect: connection refused" in seen["body"], seen
    assert seen["refused"] >= 2, seen  # ours, and the follower's reconnects
    got = printed(out)
    for host, lines in feeder.written.items():
        assert got.get(host) == lines, (host, err[-2000:])


# --- what the server stores; what it refuses to decode -------------------------------------

def test_an_admitted_jobset_is_stored_as_offline_admission_defaults_it(cluster):
    name = unique("good")
    body = manifest(name, num_slices=2)
    backend_for(cluster.kubeconfig).submit(body)
    try:
        stored = cluster.jobset(name)
        expected = admission.default(body)
        # Before offline admission knew the webhook's round trip, every container without
        # resources came back with resources: {} here.
        assert stored["spec"] == expected["spec"]
        assert stored["spec"]["network"]["publishNotReadyAddresses"] is True
        assert stored["spec"]["startupPolicy"] == {"startupPolicyOrder": "AnyOrder"}
        assert stored["spec"]["failurePolicy"]["restartStrategy"] == "Recreate"
    finally:
        cluster.delete_jobset(name)


def test_what_the_mutating_webhook_cannot_decode_comes_back_as_its_400(cluster):
    """JobSet's mutating webhook decodes the JobSet first: an int32 overflow is its decode
    error alone, 400 BadRequest with no field."""
    name = unique("huge")
    body = manifest(name)
    body["spec"]["replicatedJobs"][0]["replicas"] = 2**31
    with pytest.raises(ApiException) as info:
        cluster.custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NAMESPACE, "jobsets", body)
    status = json.loads(info.value.body)
    assert info.value.status == 400 and "reason" not in status and "details" not in status, status
    assert status["message"] == (
        'admission webhook "mjobset.kb.io" denied the request: json: cannot unmarshal number 2147483648 into Go '
        "struct field ReplicatedJob.spec.replicatedJobs.replicas of type int32")
    e = error_of(backend_for(cluster.kubeconfig).submit, body)
    assert e.exit_code == 1 and str(e) == (f"jobsets.jobset.x-k8s.io '{name}' rejected by the cluster (400 Bad "
                                           f"Request): {status['message']}")


def test_a_template_the_job_api_refuses_stalls_the_jobset_and_status_says_why(cluster):
    """JobSet's webhooks let a pod template through that the Job API refuses: the JobSet is
    stored, every Job create fails (JobCreationFailed), no pod ever appears."""
    name = unique("ev-env")
    body = manifest(name)
    env = body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]
    env.append({"name": "A=B", "value": "x"})
    backend = backend_for(cluster.kubeconfig)
    backend.submit(body)
    try:
        def stalled():
            st = backend.status(name)
            return st if any(e.startswith("JobCreationFailed (jobset/") for e in st.events) else None
        st = cluster.wait("JobCreationFailed in status", stalled, 60, every=0.5)
        assert st.state == "Pending" and st.hosts == [] and cluster.pods(name) == []
        line = next(e for e in st.events if e.startswith("JobCreationFailed (jobset/"))
        assert f'job "{name}-slice-0" creation failed with error: Job.batch "{name}-slice-0" is invalid: ' in line
        assert f'spec.template.spec.containers[0].env[{len(env) - 1}].name: Invalid value: "A=B"' in line
    finally:
        cluster.delete_jobset(name)


# --- GKE's capacity knobs on GKE-shaped nodes ------------------------------------------------

def test_a_spot_run_lands_only_on_the_spot_pool(cluster):
    backend = backend_for(cluster.kubeconfig)
    spot, od, spot2 = unique("spot"), unique("od"), unique("spot2")
    try:
        backend.submit(manifest(spot, capacity="spot"))
        nodes = {p["spec"]["nodeName"] for p in running(cluster, spot, 2)}
        assert {n.rsplit("-", 1)[0] for n in nodes} == {"v6e-2x4-spot-0"}, nodes
        backend.submit(manifest(od))
        nodes = {p["spec"]["nodeName"] for p in running(cluster, od, 2)}
        assert all("spot" not in n and n.startswith("v6e-2x4-") for n in nodes), nodes
        # The spot pool's one slice is taken: a second spot run cannot schedule.
        backend.submit(manifest(spot2, capacity="spot"))

        def unschedulable():
            st = backend.status(spot2)
            return st if st.hosts and all(h.reason.startswith("Unschedulable: ") for h in st.hosts) else None
        st = cluster.wait("the second spot run Unschedulable", unschedulable, 60, every=0.5)
        assert all(not p["spec"].get("nodeName") for p in cluster.pods(spot2))
        assert "Insufficient google.com/tpu" in st.hosts[0].reason or "didn't match" in st.hosts[0].reason
    finally:
        for n in (spot, od, spot2):
            cluster.delete_jobset(n)


def test_a_flex_start_run_waits_suspended_for_kueue(cluster, proxy, tmp_path):
    """flex-start goes through Kueue (a ProvisioningRequest admission check on GKE): the
    JobSet is created suspended and stays so, with no pod, until Kueue admits it."""
    name = unique("flex")
    backend = backend_for(proxy.kubeconfig(tmp_path / "proxied"))
    backend.submit(jobset(build_spec(values(name, accelerator="h100-mega-80gb-8", nodes=2, capacity="flex-start",
                                            queue="multislice-queue"), {})))
    try:
        (create,) = proxy.sent("POST", "/jobsets$")
        assert create["spec"]["suspend"] is True
        # xpk's queue has quota for TPUs only: Kueue says so, and status shows it.
        st = cluster.wait("Kueue's word", lambda: (s if (s := backend.status(name)).message.startswith(
            "Kueue: ") else None), 30, every=0.5)
        assert st.state == "Pending" and st.message.startswith(
            "Kueue: couldn't assign flavors to pod set slice: resource nvidia.com/gpu unavailable in ClusterQueue"
        ), st.message
        # Its place in the queue, from Kueue's visibility API (#38): nothing ahead of it.
        assert "Kueue queue: 0 ahead in LocalQueue default/multislice-queue" in st.message, st.message
        # A Kueue whose visibility API serves v1beta2 only (what Kueue documents): read there.
        proxy.hide_version("visibility.kueue.x-k8s.io", "v1beta1")
        fresh = backend_for(proxy.kubeconfig(tmp_path / "proxied-v1beta2"))
        assert "Kueue queue: 0 ahead in LocalQueue default/multislice-queue" in fresh.status(name).message
        assert any("/apis/visibility.kueue.x-k8s.io/v1beta2/" in p and "limit=1000" in p
                   for _, p in proxy.seen), proxy.seen[-5:]
        time.sleep(1)
        assert cluster.pods(name) == [] and cluster.jobset(name)["spec"]["suspend"] is True
    finally:
        cluster.delete_jobset(name)


def test_a_reservation_run_lands_on_its_reservation_pool(cluster):
    """The reservation pool's nodes carry cloud.google.com/reservation-name, as a Standard
    pool made with --reservation does, and nothing more: the run selects that alone."""
    backend = backend_for(cluster.kubeconfig)
    name = unique("resv")
    try:
        backend.submit(manifest(name, capacity="reservation:xrun-resv"))
        nodes = {p["spec"]["nodeName"] for p in running(cluster, name, 2)}
        assert {n.rsplit("-", 1)[0] for n in nodes} == {"v6e-2x4-resv-0"}, nodes
    finally:
        cluster.delete_jobset(name)


def test_a_flex_start_run_lands_on_the_flex_start_pool_and_no_other_run_does(cluster):
    """The flex-start pool's node is labelled gke-flex-start=true and tainted gke-queued (as
    GKE's queued provisioning makes them): a flex-start run without a queue (plain
    flex-start) selects and tolerates it; an on-demand run of the same shape cannot land."""
    backend = backend_for(cluster.kubeconfig)
    flex, od = unique("flex"), unique("odflex")
    try:
        backend.submit(manifest(flex, accelerator="v6e-4", capacity="flex-start", queue="none"))
        assert [p["spec"]["nodeName"] for p in running(cluster, flex, 1)] == ["v6e-2x2-flex-0-0"]
        backend.submit(manifest(od, accelerator="v6e-4", queue="none"))

        def unschedulable():
            st = backend.status(od)
            return st if st.hosts and all(h.reason.startswith("Unschedulable: ") for h in st.hosts) else None
        st = cluster.wait("the on-demand v6e-4 run Unschedulable", unschedulable, 60, every=0.5)
        assert "cloud.google.com/gke-queued" in st.hosts[0].reason or "didn't match" in st.hosts[0].reason, st
    finally:
        for n in (flex, od):
            cluster.delete_jobset(n)


# --- the CLI end to end ----------------------------------------------------------------------

def test_submit_follows_a_cluster_run_then_status_list_delete(cluster, proxy, storage, tmp_path):
    name = unique("ct")
    path = run_file(tmp_path, name, pod_annotations=timing(run_s=2, start_s=0.4))
    rendered = json.loads(xrun("render", "-f", path, "-o", "json", storage=storage,
                               KUBECONFIG=cluster.kubeconfig).stdout)
    try:
        r = xrun("submit", "-f", path, storage=storage, timeout=120, KUBECONFIG=proxy.kubeconfig(tmp_path / "p"))
        assert r.returncode == 0, r.stderr
        assert proxy.sent("POST", "/jobsets$") == [rendered]
        states = [ln for ln in r.stderr.splitlines() if ln.startswith(f"xrun: {name} ") and " | " not in ln
                  and " event: " not in ln]
        assert states[-1] == f"xrun: {name} Running" and f"xrun: {name} Pending" in states[:1] + states, r.stderr
        assert f"run {name}: Succeeded" in r.stderr
        store = open_storage(storage)
        assert yaml.safe_load(store.read_text(Layout.manifest(name))) == rendered
        run = store.read_json(Layout.run_json(name))
        assert (run["backend"], run["context"], run["namespace"]) == ("kube", CONTEXT, NAMESPACE)
        view = json.loads(xrun("status", name, "-o", "json", storage=storage, KUBECONFIG=cluster.kubeconfig).stdout)
        assert (view["state"], view["restarts"], view["backend"]) == ("Succeeded", 0, "kube")
        assert [(h["host"], h["attempt"], h["state"]) for h in view["hosts"]] == [
            (host, 0, "Succeeded") for host in ("0-0", "0-1")]
        r = xrun("list", "--context", CONTEXT, "-o", "json", storage=storage, KUBECONFIG=cluster.kubeconfig)
        assert [(x["name"], x["state"], x.get("in_cluster")) for x in json.loads(r.stdout)
                if x["name"] == name] == [(name, "Succeeded", True)]
        r = xrun("delete", name, storage=storage, KUBECONFIG=cluster.kubeconfig)
        assert r.returncode == 0 and f"xrun: stopped {name}" in r.stderr
        assert writes(cluster, name)[-1]["requestObject"]["propagationPolicy"] == "Foreground"
        assert cluster.pods(name) == []  # waited until everything was gone
        state = store.read_json(Layout.state(name))
        assert [t["state"] for t in state["transitions"]][-1] == "Succeeded"
        view = json.loads(xrun("status", name, "-o", "json", storage=storage, KUBECONFIG=cluster.kubeconfig).stdout)
        assert (view["state"], view["restarts"]) == ("Succeeded", 0)
    finally:
        cluster.delete_jobset(name)


