"""The `xrun` CLI against the scripted Kubernetes API server (kube backend, gs:// storage).

The CLI runs as a subprocess with KUBECONFIG pointing at the server; assertions are on its
exit codes and printed lines, on what the server received, and on what storage holds.
"""

from __future__ import annotations

import json

import yaml
from cli_helpers import xrun
from kube_api import KubeAPI, make_pod, status

from orchestrator.backends.kube.backend import KubeBackend
from xrun_contract import Layout
from xrun_contract.storage import open_storage

# A cluster run's xrun_image must name a registry its nodes can pull from.
FLAGS = ["--tpu", "v6e-8", "--num-slices", "2", "--image", "img:1", "--xrun-image", "registry.test/xrun:1",
         "--context", "test-ctx"]


def one_error_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xrun: error: "), r.stderr
    return lines[0][len("xrun: error: "):]


def test_submit_follows_a_cluster_run_then_status_list_delete(api, kubeconfig, gcs_bucket):
    root = f"{gcs_bucket}/xrun"
    flags = ["--name", "ct", *FLAGS]

    def restart(s: KubeAPI, n: str) -> None:
        s.put_pod(make_pod(n, 1, 0, 0, "Failed", exit_code=42))
        s.set_jobset_status(n, restarts=1)
        s.remove_pods(n)
        s.set_pods(n, 1, "Pending")

    api.script([
        lambda s, n: None,
        lambda s, n: s.set_pods(n, 0, "Pending", unschedulable="0/2 nodes are available: Insufficient google.com/tpu."),
        lambda s, n: s.set_pods(n, 0, "Running"),
        restart,
        lambda s, n: s.set_pods(n, 1, "Running"),
        lambda s, n: (s.set_pods(n, 1, "Succeeded"), s.set_jobset_status(
            n, conditions=[{"type": "Completed", "status": "True", "message": "jobset completed successfully"}])),
    ], hold=1)
    rendered = json.loads(xrun("render", *flags, "-o", "json", storage=root, KUBECONFIG=kubeconfig).stdout)
    r = xrun("submit", *flags, storage=root, timeout=60, KUBECONFIG=kubeconfig)
    assert r.returncode == 0, r.stderr
    (post,) = api.requests_to("POST", "/jobsets$")
    assert post.body == rendered
    states = [ln for ln in r.stderr.splitlines() if ln.startswith("xrun: ct ") and " event: " not in ln]
    assert [ln for ln in states if " | " not in ln] == [
        "xrun: ct Pending", "xrun: ct Running", "xrun: ct Restarting (restart 1/3)", "xrun: ct Running",
    ]  # the end state once, in the summary
    assert r.stderr.count("Succeeded (jobset completed successfully)") == 1
    assert "run ct: Succeeded (jobset completed successfully)" in r.stderr
    # No terminal: a plain progress line at each phase change (and every interval).
    progress = [ln.split(" | ")[0] for ln in states if " | " in ln]
    assert progress[0] == "xrun: ct scheduling" and "xrun: ct restarting attempt 1" in progress
    # Why pods were Pending is shown while following, once.
    pending = [ln for ln in r.stderr.splitlines() if ln.startswith("xrun: ct event: ")]
    assert len(pending) == len(set(pending)) >= 1
    assert any("Insufficient google.com/tpu" in ln for ln in pending), pending
    assert "  restarts 1" in r.stderr
    storage = open_storage(root)
    assert yaml.safe_load(storage.read_text(Layout.manifest("ct"))) == rendered
    run = storage.read_json(Layout.run_json("ct"))
    assert (run["backend"], run["context"], run["namespace"]) == ("kube", "test-ctx", "default")

    r = xrun("status", "ct", "-o", "json", storage=root, KUBECONFIG=kubeconfig)
    view = json.loads(r.stdout)
    assert (view["state"], view["restarts"], view["backend"]) == ("Succeeded", 1, "kube")
    assert [(h["host"], h["attempt"], h["state"]) for h in view["hosts"]] == [
        (host, 1, "Succeeded") for host in ("0-0", "0-1", "1-0", "1-1")]  # v6e-8: 2 hosts per slice

    r = xrun("list", "--context", "test-ctx", "-o", "json", storage=root, KUBECONFIG=kubeconfig)
    assert [(x["name"], x["state"], x.get("in_cluster")) for x in json.loads(r.stdout)] == [("ct", "Succeeded", True)]

    r = xrun("delete", "ct", storage=root, KUBECONFIG=kubeconfig)
    assert r.returncode == 0 and "xrun: stopped ct" in r.stderr
    (delete,) = api.requests_to("DELETE", "/jobsets/ct$")
    assert delete.body == {"propagationPolicy": "Foreground"}
    assert api.pods_of("ct") == [] and not api.jobsets  # waited until everything was gone
    # The cluster objects are gone; storage still tells how the run went.
    state = storage.read_json(Layout.state("ct"))
    assert [t["state"] for t in state["transitions"]] == [
        "Pending", "Running", "Restarting", "Running", "Succeeded"]
    view = json.loads(xrun("status", "ct", "-o", "json", storage=root, KUBECONFIG=kubeconfig).stdout)
    assert (view["state"], view["restarts"]) == ("Succeeded", 1)


def test_submit_rejections_are_one_line_with_exit_codes(api, kubeconfig, gcs_bucket, tmp_path):
    root = f"{gcs_bucket}/xrun"
    storage = open_storage(root)

    def submit(name: str, *extra: str, config: str = kubeconfig):
        return xrun("submit", "--name", name, *FLAGS, "--detach", *extra, storage=root, timeout=60, KUBECONFIG=config)

    api.crd_installed = False
    r = submit("nocrd")
    assert r.returncode == 1
    assert one_error_line(r).startswith("JobSet CRD not installed: jobset.x-k8s.io/v1alpha2 jobsets is not served by http://127.0.0.1:")
    assert "kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/releases/download/" in r.stderr
    # Traceable although rejected: manifest and run.json were written first.
    assert storage.read_json(Layout.run_json("nocrd"))["name"] == "nocrd"
    assert yaml.safe_load(storage.read_text(Layout.manifest("nocrd")))["kind"] == "JobSet"
    api.crd_installed = True

    KubeBackend("test-ctx", "default", kubeconfig).submit(
        json.loads(xrun("render", "--name", "taken", *FLAGS, "-o", "json", storage=root).stdout))
    r = submit("taken")
    assert r.returncode == 1
    assert one_error_line(r) == "jobsets.jobset.x-k8s.io 'taken' already exists in namespace 'default'; use --replace or another name"
    r = submit("taken", "--replace")  # the JobSet is live: its checkpoints are not deleted
    assert r.returncode == 2 and one_error_line(r).startswith("name: run 'taken' is ")
    assert "--replace would delete its checkpoints: wait for it to end, 'xrun delete taken', or add --force" in r.stderr
    r = submit("taken", "--replace", "--force")
    assert r.returncode == 0, r.stderr
    assert [(q.method, q.path.rsplit("/", 1)[-1]) for q in api.requests if q.method in ("POST", "DELETE")][-3:] == [
        ("POST", "jobsets"), ("DELETE", "taken"), ("POST", "jobsets")]

    api.fail("POST", "/jobsets$", 403, status(403, "Forbidden", 'jobsets.jobset.x-k8s.io is forbidden: User "dev" cannot create resource "jobsets"'))
    r = submit("rbac")
    assert r.returncode == 1
    assert one_error_line(r).startswith("forbidden: RBAC must allow verb 'create' on resource 'jobsets.jobset.x-k8s.io' in namespace 'default'")

    webhook = 'admission webhook "vjobset.kb.io" denied the request: spec.replicatedJobs[0].name: Invalid value: "slice"'
    api.fail("POST", "/jobsets$", 422, status(422, "Invalid", webhook))
    r = submit("hook")
    assert r.returncode == 1 and one_error_line(r) == f"jobsets.jobset.x-k8s.io 'hook' rejected by the cluster (422 Invalid): {webhook}"

    r = submit("expired", config=str(api.kubeconfig(tmp_path / "expired", token="old")))
    assert r.returncode == 3 and one_error_line(r).startswith("credentials rejected (401 Unauthorized)")

    dead = KubeAPI().start()
    unreachable = str(dead.kubeconfig(tmp_path / "dead"))
    dead.stop()
    r = submit("far", config=unreachable)
    assert r.returncode == 3 and one_error_line(r).startswith("cannot reach the Kubernetes API at http://127.0.0.1:")
    assert sorted(n for _, n in api.jobsets) == ["taken"]


def tpu_node(i: int, accelerator: str = "tpu-v6e-slice", topology: str = "2x4",
             machine: str = "ct6e-standard-4t") -> dict:
    return {"metadata": {"name": f"gke-tpu-{i}", "labels": {"cloud.google.com/gke-tpu-accelerator": accelerator,
                                                            "cloud.google.com/gke-tpu-topology": topology,
                                                            "node.kubernetes.io/instance-type": machine}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def test_submit_refuses_a_cluster_without_native_sidecars(api, kubeconfig, gcs_bucket):
    """Kubernetes 1.28 drops restartPolicy: Always from init containers: the log shipper would
    hold every pod in Init for ever, so nothing is created."""
    api.git_version = "v1.28.15-gke.1435000"
    r = xrun("submit", "--name", "old", *FLAGS, "--detach", storage=f"{gcs_bucket}/xrun", KUBECONFIG=kubeconfig)
    assert r.returncode == 1, r.stderr
    line = one_error_line(r)
    assert line.startswith("Kubernetes v1.28.15-gke.1435000 has no native sidecars: xrun's log shipper (xrun-logs, "
                           "an init container with restartPolicy: Always) needs Kubernetes >= 1.29 (1.28 has them "
                           "only behind the SidecarContainers feature gate, off by default)"), line
    assert not api.requests_to("POST", "/jobsets$")
    assert open_storage(f"{gcs_bucket}/xrun").list("", delimiter=None)[0] == []  # nothing written: the name stays free
    api.git_version = "v1.29.1-gke.1589000"
    r = xrun("submit", "--name", "old", *FLAGS, "--detach", storage=f"{gcs_bucket}/xrun", KUBECONFIG=kubeconfig)
    assert r.returncode == 0, r.stderr
    assert len(api.requests_to("POST", "/jobsets$")) == 1
    assert len(api.requests_to("GET", "^/version")) == 2  # once per submit


def test_cluster_submit_refuses_an_xrun_image_without_a_registry(api, kubeconfig, gcs_bucket, tmp_path):
    """The default xrun_image (xrun-workload:<version>) is for local runs: on a cluster the
    nodes would look for it on Docker Hub and every pod would stay Init:ErrImagePull."""
    root = f"{gcs_bucket}/xrun"
    cluster = ["--tpu", "v6e-8", "--image", "us-docker.pkg.dev/p/r/xrun-workload:1", "--context", "test-ctx"]
    allowed = ("cluster runs need an image in a registry the nodes can pull from, its first path component a "
               "registry host (with a '.' or ':', or localhost), e.g. us-docker.pkg.dev/PROJECT/REPO/"
               "xrun-workload:0.1.0: build the Dockerfile, push it, set xrun_image (README \"Any image\")")
    for extra in ([], ["--xrun-image", "xrun/xrun-workload:0.1.0"], ["--dry-run"]):
        r = xrun("submit", "--name", "noreg", *cluster, *extra, "--detach", storage=root, KUBECONFIG=kubeconfig)
        image = extra[1] if extra[:1] == ["--xrun-image"] else "xrun-workload:0.1.0"
        assert r.returncode == 2, (extra, r.stderr)
        assert one_error_line(r) == (f"xrun_image: {image!r} names no registry, so the cluster's nodes cannot "
                                     f"pull it; {allowed}"), extra
        assert r.stdout == ""
    assert not api.requests_to("POST", "/jobsets$")
    assert open_storage(root).list("", delimiter=None)[0] == []  # nothing written
    # A registry host: a '.', a ':' (port) or localhost (kind's locally loaded images).
    for i, image in enumerate(["localhost/xrun:1", "localhost:5000/xrun:1", "registry.test/xrun:1"]):
        r = xrun("submit", "--name", f"reg{i}", *cluster, "--xrun-image", image, "--detach", storage=root,
                 KUBECONFIG=kubeconfig)
        assert r.returncode == 0, r.stderr
    assert len(api.requests_to("POST", "/jobsets$")) == 3
    # Local runs keep the default.
    r = xrun("submit", "--name", "local", "--accelerator", "cpu-2", "--image", "local", "--dry-run",
             storage=tmp_path / "local")
    assert r.returncode == 0, r.stderr
    assert "image: xrun-workload:0.1.0" in r.stdout


def test_doctor_passes_on_a_ready_cluster(api, kubeconfig, gcs_bucket, tmp_path):
    api.kueue_versions = ["v1beta1"]
    api.local_queues[("team", "lq")] = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                                        "metadata": {"name": "lq", "namespace": "team"}, "spec": {"clusterQueue": "cq-tpu"}}
    # v6e-8 x 2 slices: 4 hosts of ct6e-standard-4t; a single-host v6e-8 node does not count.
    api.nodes = [*(tpu_node(i) for i in range(4)), tpu_node(4, topology="4x4"),
                 tpu_node(5, machine="ct6e-standard-8t")]
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump({"name": "x", "accelerator": "v6e-8", "num_slices": 2, "queue": "lq",
                                        "namespace": "team", "context": "test-ctx", "storage": f"{gcs_bucket}/xrun"}))
    r = xrun("doctor", "-f", str(run_file), storage="/nonexistent", KUBECONFIG=kubeconfig)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split()[:2] for ln in lines] == [["ok", "api"], ["ok", "jobset"], ["ok", "jobset-controller"], ["ok", "rbac"], ["ok", "kueue"],
                                                ["ok", "priority"], ["ok", "nodes"], ["ok", "storage"], ["skip", "pod-storage"]]
    assert "jobset-system/jobset-controller-manager runs registry.k8s.io/jobset/jobset:v0.12.0 (1 ready)" in lines[2]
    assert "RBAC allows the 12 verbs xrun uses in namespace 'team'" in lines[3]
    del lines[2:4]
    assert "(context test-ctx, Kubernetes v1.31.4-gke.1000), namespace team" in lines[0]
    assert "served v1alpha2 (storage v1alpha2); xrun uses v1alpha2" in lines[1]
    assert "LocalQueue team/lq exists (ClusterQueue cq-tpu, kueue.x-k8s.io/v1beta1)" in lines[2]
    assert "PriorityClasses: very-low missing, low missing" in lines[3]
    assert ("4 node(s) labelled cloud.google.com/gke-tpu-accelerator=tpu-v6e-slice,cloud.google.com/gke-tpu-topology=2x4,"
            "node.kubernetes.io/instance-type=ct6e-standard-4t (4 Ready); v6e-8 needs 4") in lines[4]
    assert f"storage root {gcs_bucket}/xrun writable" in lines[5]
    assert r.stderr.strip() == "xrun: doctor: all checks passed"
    assert open_storage(f"{gcs_bucket}/xrun").list("", delimiter=None)[0] == []  # the probe was removed
    (lq,) = api.requests_to("GET", "/localqueues/")
    assert lq.path == "/apis/kueue.x-k8s.io/v1beta1/namespaces/team/localqueues/lq"


def test_doctor_names_every_problem(api, kubeconfig, tmp_path):
    api.crd_installed = False
    api.nodes = [tpu_node(0, topology="4x4")]
    r = xrun("doctor", "--tpu", "v6e-8", "--queue", "lq", "--storage", str(tmp_path / "local"), storage=tmp_path,
             KUBECONFIG=kubeconfig)
    assert r.returncode == 1
    got = {ln.split()[1]: ln for ln in r.stdout.splitlines()}
    assert got["api"].startswith("ok ")
    assert got["jobset"].startswith("FAIL  jobset   JobSet CRD jobsets.jobset.x-k8s.io not installed; install JobSet: kubectl apply")
    assert got["kueue"] == "FAIL  kueue    queue 'lq' is named but Kueue is not installed (the API serves no kueue.x-k8s.io)"
    assert got["nodes"].startswith("FAIL  nodes    0 node(s) labelled cloud.google.com/gke-tpu-accelerator=tpu-v6e-slice,"
                                   "cloud.google.com/gke-tpu-topology=2x4,node.kubernetes.io/instance-type=ct6e-standard-4t "
                                   "(0 Ready); v6e-8 needs 2, and no cluster autoscaler")
    assert got["storage"].startswith("FAIL  storage  storage root ") and "cluster runs need gs://bucket/prefix" in got["storage"]
    assert r.stderr.strip() == "xrun: doctor: 4 check(s) failed: jobset, kueue, nodes, storage"

    dead = KubeAPI().start()
    unreachable = str(dead.kubeconfig(tmp_path / "dead"))
    dead.stop()
    r = xrun("doctor", "-o", "json", storage=tmp_path, KUBECONFIG=unreachable)
    assert r.returncode == 3
    report = json.loads(r.stdout)
    assert [(c["name"], c["result"]) for c in report["checks"]] == [("api", "FAIL"), ("cluster", "skip"), ("storage", "FAIL"),
                                                                    ("pod-storage", "skip")]
    assert report["checks"][0]["detail"].startswith("cannot reach the Kubernetes API at http://127.0.0.1:")
    r = xrun("doctor", "--tpu", "v9z-8", storage=tmp_path, KUBECONFIG=kubeconfig)
    assert r.returncode == 2 and one_error_line(r).startswith("accelerator: ")
