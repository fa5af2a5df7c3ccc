"""GPU shapes on GKE: each family renders the node label, networking stack and env its
nodes need (accelerators.yaml), and the local backend still runs them on CPU."""

from __future__ import annotations

import json
from typing import Any

import pytest

from manifests import catalogue
from manifests.admission import violations
from manifests.jobset import jobset
from manifests.spec import build_spec
from orchestrator.backends.local.supervisor import plan_pods

GPU_SHAPES = sorted(n for n, s in catalogue.shapes().items() if s.kind == "gpu")
# Family facts as GKE and xpk name them: (node label, machine type, stack, sidecar).
FAMILIES = {
    "h100-80gb-8": ("nvidia-h100-80gb", "a3-highgpu-8g", "tcpx", "tcpx-daemon"),
    "h100-mega-80gb-8": ("nvidia-h100-mega-80gb", "a3-megagpu-8g", "tcpxo", "tcpxo-daemon"),
    "h200-141gb-8": ("nvidia-h200-141gb", "a3-ultragpu-8g", "rdma", None),
    "b200-8": ("nvidia-b200", "a4-highgpu-8g", "rdma", None),
}

XRUN_CONTAINERS = ("xrun-init", "xrun-logs")  # every pod's, from xrun_image (README "Any image")


def render(accelerator: str, nodes: int = 2, **extra: Any) -> dict[str, Any]:
    values = {"name": "gpu-run", "accelerator": accelerator, "nodes": nodes, "image": "example.com/xrun:1-gpu", **extra}
    return jobset(build_spec(values, {}, storage_default="gs://bucket-a/xrun"))


def template(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]


def workload_env(obj: dict[str, Any]) -> dict[str, str]:
    (ctr,) = template(obj)["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in ctr["env"] if "valueFrom" not in e}


def test_every_gpu_family_is_known():
    assert set(GPU_SHAPES) == set(FAMILIES)


@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_gpu_pod_has_its_family_decorations(shape):
    label, machine, stack, sidecar = FAMILIES[shape]
    s = catalogue.lookup(shape)
    assert (s.gke_accelerator, s.machine_type, s.networking.name) == (label, machine, stack)
    obj = render(shape)
    assert violations(obj) == []
    tmpl = template(obj)
    pod, (ctr,) = tmpl["spec"], tmpl["spec"]["containers"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": label}
    # NICs arrive through multi-networking annotations: no hostNetwork, default DNS.
    assert "hostNetwork" not in pod and "dnsPolicy" not in pod
    nics = json.loads(tmpl["metadata"]["annotations"]["networking.gke.io/interfaces"])
    assert [n["interfaceName"] for n in nics] == [f"eth{i}" for i in range(s.nics)]
    assert nics[0] == {"interfaceName": "eth0", "network": "default"}
    assert tmpl["metadata"]["annotations"]["networking.gke.io/default-interface"] == "eth0"
    assert {"key": "user-workload", "operator": "Equal", "value": "true", "effect": "NoSchedule"} in pod["tolerations"]
    env = workload_env(obj)
    assert env["JAX_PLATFORMS"] == "cuda"
    assert "/usr/local/nvidia/lib64" in env["LD_LIBRARY_PATH"].split(":")
    assert env["XRUN_PEAK_TFLOPS_PER_DEVICE"] == f"{s.peak_bf16_tflops:g}"
    assert ctr["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    # xrun's own two (launcher installer, log shipper) come first; the stack's daemons after.
    assert [c["name"] for c in pod["initContainers"][:2]] == list(XRUN_CONTAINERS)
    sidecars = pod["initContainers"][2:]
    if sidecar:
        (daemon,) = sidecars
        assert daemon["name"] == sidecar and daemon["restartPolicy"] == "Always"
        assert f"devices.gke.io/container.{sidecar}" in tmpl["metadata"]["annotations"]
        assert "NET_ADMIN" in daemon["securityContext"]["capabilities"]["add"]
    else:
        assert sidecars == []
    mounts = {m["mountPath"]: m["name"] for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    if stack == "tcpx":
        assert volumes[mounts["/run/tcpx"]]["hostPath"]["path"] == "/run/tcpx"
        assert env["NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX"] == "/run/tcpx"
        assert [n["network"] for n in nics[1:]] == ["vpc1", "vpc2", "vpc3", "vpc4"]
    if stack == "tcpxo":
        assert volumes[mounts["/dev/aperture_devices"]]["hostPath"]["path"] == "/dev/aperture_devices"
        assert env["NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY"] == "/dev/aperture_devices"
        assert len(nics) == 9
    if stack == "rdma":
        assert volumes[mounts["/usr/local/gib"]]["hostPath"]["path"] == "/home/kubernetes/bin/gib"
        assert env["NCCL_NET"] == "gIB"
        assert env["LD_LIBRARY_PATH"].split(":")[0] == "/usr/local/gib/lib64"
        assert [n["network"] for n in nics[1:]] == ["gvnic-1"] + [f"rdma-{i}" for i in range(8)]


def test_tpu_pods_keep_host_network_and_get_no_gpu_env():
    obj = jobset(build_spec({"name": "t", "accelerator": "v6e-16", "image": "i"}, {}, storage_default="gs://bucket-a/x"))
    pod = template(obj)["spec"]
    assert pod["hostNetwork"] is True
    assert [c["name"] for c in pod["initContainers"]] == list(XRUN_CONTAINERS)  # no stack daemons
    assert "JAX_PLATFORMS" not in workload_env(obj) and "annotations" not in template(obj)["metadata"]


def test_a_users_env_replaces_the_stacks_value_once():
    obj = render("h200-141gb-8", env={"NCCL_IB_TC": "106", "LD_LIBRARY_PATH": "/opt/lib:/usr/local/nvidia/lib64"})
    (ctr,) = template(obj)["spec"]["containers"]
    names = [e["name"] for e in ctr["env"]]
    assert names.count("NCCL_IB_TC") == 1 and names.count("LD_LIBRARY_PATH") == 1
    env = workload_env(obj)
    assert env["NCCL_IB_TC"] == "106" and env["LD_LIBRARY_PATH"] == "/opt/lib:/usr/local/nvidia/lib64"
    assert violations(obj) == []


def test_the_catalogues_sidecars_are_not_shared_between_renders():
    first = render("h100-mega-80gb-8")
    render("h100-mega-80gb-8")
    assert len(template(first)["spec"]["initContainers"]) == len(XRUN_CONTAINERS) + 1
    assert len(catalogue.lookup("h100-mega-80gb-8").networking.sidecars) == 1


def test_local_backend_runs_a_gpu_manifest_on_cpu():
    """The local backend runs the one workload container (sidecars are cluster-only) with
    JAX pinned to CPU instead of cuda."""
    pods = plan_pods(render("h100-80gb-8", nodes=2), attempt=0, port=12345)
    assert len(pods) == 2
    for p in pods:
        assert p.env["JAX_PLATFORMS"] == "cpu" and p.env["XRUN_PLATFORM"] == "cpu"
        assert "tcpgpudmarxd" not in " ".join(p.argv)
