"""Doctor's checks in-process against the scripted API server: the cases the CLI test skips."""

from __future__ import annotations

import pytest
from kube_api import status

from manifests.catalogue import lookup
from orchestrator.backends.kube.backend import KubeBackend
from orchestrator.services import doctor


@pytest.fixture
def backend(kubeconfig):
    return KubeBackend(None, "default", kubeconfig)


def test_rbac_hidden_crd_falls_back_to_discovery(api, backend):
    api.fail("GET", "/customresourcedefinitions/", 403, status(
        403, "Forbidden", 'customresourcedefinitions.apiextensions.k8s.io "jobsets.jobset.x-k8s.io" is forbidden'))
    check = doctor.check_jobset(backend)
    assert check.result == "ok"
    assert check.detail == ("JobSet API jobset.x-k8s.io/v1alpha2 served (served v1alpha2; "
                            "the CRD itself is not readable with your RBAC)")
    assert [r.path for r in api.requests][-2:] == [
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/jobsets.jobset.x-k8s.io", "/apis/"]


def test_old_jobset_version_fails(api, backend):
    api.jobset_versions = ["v1alpha1"]
    check = doctor.check_jobset(backend)
    assert (check.result, check.exit_code) == ("FAIL", 1)
    assert check.detail.startswith("JobSet CRD serves v1alpha1, xrun needs v1alpha2: upgrade JobSet")


def test_missing_local_queue_and_autoscaled_node_pool(api, backend):
    api.kueue_versions = ["v1beta1"]
    check = doctor.check_queue(backend, "lq")
    assert (check.result, check.detail) == (
        "FAIL", "LocalQueue 'lq' not found in namespace 'default' (kueue.x-k8s.io/v1beta1)")
    api.config_maps[("kube-system", "cluster-autoscaler-status")] = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cluster-autoscaler-status", "namespace": "kube-system"}, "data": {"status": "Health: Healthy"}}
    check = doctor.check_nodes(backend, lookup("v6e-32"), 16)
    assert check.result == "warn"
    assert check.detail.startswith(
        "0 node(s) labelled cloud.google.com/gke-tpu-accelerator=tpu-v6e-slice,cloud.google.com/gke-tpu-topology=4x8,"
        "node.kubernetes.io/instance-type=ct6e-standard-4t (0 Ready); v6e-32 needs 16; the cluster autoscaler is on")
    (nodes,) = api.requests_to("GET", "^/api/v1/nodes$")
    assert nodes.query["labelSelector"] == ("cloud.google.com/gke-tpu-accelerator=tpu-v6e-slice,"
                                           "cloud.google.com/gke-tpu-topology=4x8,"
                                           "node.kubernetes.io/instance-type=ct6e-standard-4t")
    assert doctor.exit_code([check]) == 0


def test_gpu_nodes_and_forbidden_node_list(api, backend):
    shape = lookup("h200-141gb-8")
    assert doctor.node_selector(shape) == f"cloud.google.com/gke-accelerator={shape.gke_accelerator}"
    api.fail("GET", "^/api/v1/nodes$", 403, status(403, "Forbidden", 'nodes is forbidden: User "dev" cannot list resource "nodes"'))
    check = doctor.check_nodes(backend, shape, 2)
    assert check.result == "warn" and "cannot list nodes to look for cloud.google.com/gke-accelerator=" in check.detail
    assert "RBAC must allow verb 'list' on resource 'nodes'" in check.detail
    assert doctor.check_nodes(backend, lookup("cpu-2"), 2).result == "skip"


def _priority_class(name: str, value: int) -> dict:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value}


def test_priority_classes_of_the_ladder_and_the_runs(api, backend):
    api.priority_classes = [_priority_class("low", 250), _priority_class("high", 750),
                            _priority_class("system-node-critical", 2000001000), _priority_class("batch", 10)]
    check = doctor.check_priority(backend, "high")
    assert (check.result, check.detail) == ("ok", "priority 'high' exists; PriorityClasses: very-low missing, low=250, "
                                                  "medium missing, high=750, very-high missing; others: batch")
    check = doctor.check_priority(backend, "very-high")
    assert (check.result, check.exit_code) == ("FAIL", 1)
    assert check.detail.startswith("priority 'very-high' has no PriorityClass (pods would be refused); PriorityClasses:")
    assert api.requests_to("GET", "^/apis/scheduling.k8s.io/v1/priorityclasses$")


def test_nodes_of_the_runs_capacity(api, backend):
    gpu = {"cloud.google.com/gke-accelerator": "nvidia-h100-mega-80gb"}
    ready = {"conditions": [{"type": "Ready", "status": "True"}]}
    api.nodes = [{"metadata": {"name": "od-0", "labels": gpu}, "status": ready},
                 {"metadata": {"name": "spot-0", "labels": {**gpu, "cloud.google.com/gke-spot": "true"}}, "status": ready}]
    shape = lookup("h100-mega-80gb-8")
    check = doctor.check_nodes(backend, shape, 1, "spot")
    assert (check.result, check.detail) == ("ok", "1 node(s) labelled cloud.google.com/gke-accelerator=nvidia-h100-mega-80gb,"
                                                  "cloud.google.com/gke-spot=true (1 Ready); h100-mega-80gb-8 needs 1")
    check = doctor.check_nodes(backend, shape, 2, "flex-start")
    assert check.result == "warn" and "flex-start nodes are created when Kueue's ProvisioningRequest" in check.detail
    assert api.requests_to("GET", "^/api/v1/nodes$")[-1].query["labelSelector"] == (
        "cloud.google.com/gke-accelerator=nvidia-h100-mega-80gb,cloud.google.com/gke-queued=true")


@pytest.mark.parametrize("git_version, gate_note", [("v1.28.15-gke.1435000", True), ("v1.27.16-gke.2703000", False)])
def test_a_server_without_native_sidecars_fails_the_api_check(api, backend, tmp_path, git_version, gate_note):
    """Every pod's log shipper is a native sidecar (restartPolicy: Always init container):
    before 1.29 the API server drops that field and the pod waits in Init for ever."""
    api.git_version = git_version
    checks = doctor.run_checks(backend, shape=None, needed_nodes=0, queue="", storage_root=str(tmp_path))
    api_check = checks[0]
    assert (api_check.name, api_check.result, api_check.exit_code) == ("api", "FAIL", 1)
    assert f"Kubernetes {git_version}), namespace default; Kubernetes {git_version} has no native sidecars: " \
           "xrun's log shipper (xrun-logs, an init container with restartPolicy: Always) needs Kubernetes >= 1.29" \
        in api_check.detail
    assert ("1.28 has them only behind the SidecarContainers feature gate" in api_check.detail) == gate_note
    # The API answered: the cluster's other checks still run.
    assert [(c.name, c.result) for c in checks][1:5] == [("jobset", "ok"), ("jobset-controller", "ok"), ("rbac", "ok"),
                                                          ("priority", "ok")]
    assert doctor.exit_code(checks) == 1


@pytest.mark.parametrize("git_version", ["v1.29.0", "v1.31.4-gke.1000", "v2.0.0"])
def test_a_server_with_native_sidecars_passes(api, backend, git_version):
    api.git_version = git_version
    check = doctor.check_api(backend)
    assert check.result == "ok" and f"Kubernetes {git_version})" in check.detail
