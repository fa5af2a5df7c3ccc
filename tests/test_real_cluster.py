"""The real control plane that tests/cluster/up.sh starts: what it is, and that an xrun
JobSet runs on it.

These talk to real upstream binaries (kube-apiserver v1.36, JobSet v0.12, Kueue v0.17,
KWOK v0.8) through the real ``kubernetes`` client; nothing is scripted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import pid_alive
from cluster_helpers import NAMESPACE, start, stop, timing, unique
from kubernetes.client.exceptions import ApiException

from manifests.jobset import jobset
from manifests.spec import build_spec

REPO = Path(__file__).resolve().parent.parent


def versions() -> dict[str, str]:
    out = {}
    for line in (REPO / "tests/cluster/versions.env").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k] = v
    return out


def render(name: str, **values) -> dict:
    base = {"name": name, "accelerator": "v6e-8", "image": "example.com/xrun:1",
            "storage": "gs://xrun-bucket/runs", "command": "python3 -m workload.train",
            "backend": "kube", "xrun_image": "example.com/xrun-workload:1"}
    return jobset(build_spec({**base, **values}, {}))


def test_the_server_is_real_kubernetes_at_the_built_version(cluster):
    from kubernetes import client

    info = client.VersionApi(cluster.api_client).get_code()
    assert info.git_version == versions()["KUBE_VERSION"]
    assert (info.major, info.minor) == ("1", versions()["KUBE_VERSION"].split(".")[1])
    assert info.git_tree_state == "clean"


def test_jobset_and_kueue_crds_are_installed_from_their_modules(cluster):
    from kubernetes import client

    ext = client.ApiextensionsV1Api(cluster.api_client)
    names = {c.metadata.name for c in ext.list_custom_resource_definition().items}
    assert "jobsets.jobset.x-k8s.io" in names
    assert {"clusterqueues.kueue.x-k8s.io", "localqueues.kueue.x-k8s.io",
            "workloads.kueue.x-k8s.io", "resourceflavors.kueue.x-k8s.io"} <= names
    wl = ext.read_custom_resource_definition("workloads.kueue.x-k8s.io")
    assert wl.spec.conversion.strategy == "Webhook"  # Kueue's conversion webhook, by url
    assert wl.spec.conversion.webhook.client_config.url.startswith("https://127.0.0.1:")


def test_a_hyphen_in_a_failure_rule_name_is_denied_by_jobsets_webhook(cluster):
    body = render(unique("hyphen"))
    body["spec"]["failurePolicy"]["rules"][0]["name"] = "fail-on-user-error"
    with pytest.raises(ApiException) as info:
        cluster.custom.create_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", NAMESPACE, "jobsets", body)
    status = json.loads(info.value.body)
    assert info.value.status == 422, status
    assert 'admission webhook "vjobset.kb.io" denied the request' in status["message"]
    assert "fail-on-user-error" in status["message"]


def test_an_xrun_v6e8_jobset_runs_to_completed_on_kwok_nodes(cluster):
    name = unique("v6e8")
    body = render(name, pod_annotations=timing(run_s=2.0))
    cluster.custom.create_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", NAMESPACE, "jobsets", body)
    js = cluster.wait_condition(name, "Completed", timeout=120)
    assert js["status"].get("restarts", 0) == 0
    pods = cluster.pods(name)
    assert len(pods) == 2 and all(p["status"]["phase"] == "Succeeded" for p in pods)
    # Scheduled by the real scheduler onto a v6e 2x4 slice's two VMs, one pool for both
    # (JobSet's exclusive-topology placement on cloud.google.com/gke-nodepool).
    nodes = {p["spec"]["nodeName"] for p in pods}
    assert len(nodes) == 2
    pools = {cluster.core.read_node(n).metadata.labels["cloud.google.com/gke-nodepool"] for n in nodes}
    assert len(pools) == 1 and next(iter(pools)).startswith("v6e-2x4-")


def test_up_and_down_scripts_leave_no_process(tmp_path):
    """A second cluster beside the session's (free ports), started and stopped by the
    scripts themselves: down.sh leaves none of the recorded processes."""
    root = tmp_path / "c2"
    up = subprocess.run(["bash", str(REPO / "tests/cluster/up.sh"), str(root)],
                        capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip() == str(root / "kubeconfig")
    state = json.loads((root / "state.json").read_text())
    pids = [state["supervisor"], *state["pids"].values()]
    assert sorted(state["pids"]) == sorted(
        ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "jobset", "kueue", "kwok"])
    assert all(pid_alive(p) for p in pids)
    down = subprocess.run(["bash", str(REPO / "tests/cluster/down.sh"), str(root)],
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    assert [p for p in pids if pid_alive(p)] == []


def test_a_killed_owner_takes_its_cluster_with_it(tmp_path):
    """The fixture passes --owner: if the test session is SIGKILLed, its cluster stops."""
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    root = tmp_path / "c3"
    try:
        start(root, owner=owner.pid)
        state = json.loads((root / "state.json").read_text())
        pids = [state["supervisor"], *state["pids"].values()]
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 30
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [p for p in pids if pid_alive(p)] == []
    finally:
        owner.kill()
        stop(root)


def test_a_sigkilled_supervisor_leaves_no_component(tmp_path):
    root = tmp_path / "c4"
    start(root, owner=os.getpid())
    try:
        state = json.loads((root / "state.json").read_text())
        os.kill(state["supervisor"], 9)
        deadline = time.monotonic() + 15
        while any(pid_alive(p) for p in state["pids"].values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [n for n, p in state["pids"].items() if pid_alive(p)] == []
    finally:
        stop(root)
