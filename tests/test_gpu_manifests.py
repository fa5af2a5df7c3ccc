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
from xrun_contract import PodFiles

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


# --- the NCCL plugin's own env profile, not a copy of one release's values ----------------

@pytest.mark.parametrize("shape, profile", [("h100-mega-80gb-8", "/usr/local/nvidia/lib64/nccl-env-profile.sh"),
                                            ("h200-141gb-8", "/usr/local/gib/scripts/set_nccl_env.sh"),
                                            ("b200-8", "/usr/local/gib/scripts/set_nccl_env.sh"),
                                            ("h100-80gb-8", None)])
def test_gpu_stacks_render_the_plugins_env_profile(shape, profile):
    """TCPXO's guest config checker aborts a workload whose NCCL env does not match the
    installed plugin, so the pod sources the profile the plugin installs (GKE: the TCPXO
    installer's nccl-env-profile.sh, gIB's set_nccl_env.sh); the values xrun carried are only a
    fallback for when it is absent."""
    obj = render(shape, env={"NCCL_DEBUG": "INFO", "NCCL_MIN_NCHANNELS": "8"})
    env = workload_env(obj)
    if profile is None:  # A3 High's TCPX ships no profile: its env stays as rendered
        assert not {"XRUN_NCCL_ENV_PROFILE", "XRUN_NCCL_ENV_FALLBACK", "XRUN_USER_ENV"} & set(env)
        assert env["NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"] == "eth1,eth2,eth3,eth4"
        return
    assert env["XRUN_NCCL_ENV_PROFILE"] == profile
    assert env["XRUN_USER_ENV"] == "NCCL_DEBUG NCCL_MIN_NCHANNELS"
    fallback = dict(line.split("=", 1) for line in env["XRUN_NCCL_ENV_FALLBACK"].split("\n"))
    stack = catalogue.lookup(shape).networking
    assert fallback == {k: v for k, v in stack.env_fallback.items() if k != "NCCL_MIN_NCHANNELS"}
    assert not set(fallback) & set(env)  # the profile's values are never fixed in the pod spec
    if shape == "h100-mega-80gb-8":
        assert env["NCCL_LIB_DIR"] == "/usr/local/nvidia/lib64"
        assert fallback["NCCL_PROTO"] == "Simple" and "NCCL_PROTO" not in env
        assert "NCCL_NVLSTREE_MAX_CHUNKSIZE" not in fallback
    else:
        assert fallback["NCCL_IB_TC"] == "52" and env["NCCL_NET"] == "gIB"
    assert violations(obj) == []


PROFILE = """# nccl-env-profile.sh as a newer TCPXO plugin release installs it
export NCCL_PROTO=Simple,LL128
export NCCL_NVLSTREE_MAX_CHUNKSIZE=131072
export NCCL_MIN_NCHANNELS=4
export NCCL_TUNER_CONFIG_PATH=${NCCL_LIB_DIR}/a3plus_tuner_config_ll128.textproto
export NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE=${NCCL_LIB_DIR}/a3plus_guest_config_ll128.textproto
echo "profile: sourced"
"""
NAMES = ("NCCL_PROTO", "NCCL_NVLSTREE_MAX_CHUNKSIZE", "NCCL_MIN_NCHANNELS", "NCCL_TUNER_CONFIG_PATH",
         "NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE", "NCCL_ALGO", "NCCL_DEBUG")


@pytest.mark.parametrize("profile", ["present", "absent", "broken"])
def test_the_launcher_sources_the_profile_and_falls_back_without_it(tmp_path, profile):
    """The pod's command as rendered for A3 Mega, run here under /bin/sh with the container's
    env (the profile's path moved under tmp_path): the profile's values win when it exists,
    xrun's fallback values are exported when it does not (or /bin/sh cannot source it), and
    the run file's env (NCCL_MIN_NCHANNELS=8) wins over both."""
    import subprocess

    from manifests.jobset import launcher_argv
    from orchestrator.backends.local.k8s_env import expand
    from workload.sidecar import install

    obj = render("h100-mega-80gb-8", env={"NCCL_DEBUG": "INFO", "NCCL_MIN_NCHANNELS": "8"})
    (ctr,) = template(obj)["spec"]["containers"]
    lib = tmp_path / "nvidia" / "lib64"
    lib.mkdir(parents=True)
    path = lib / "nccl-env-profile.sh"
    if profile == "present":
        path.write_text(PROFILE)
    elif profile == "broken":  # a bash array: a syntax error that stops dash
        path.write_text("export NCCL_PROTO=LL\nNICS=(eth1 eth2)\n")
    pod_dir = tmp_path / "pod"
    install(pod_dir)
    (pod_dir / PodFiles.SHIPPER_READY).write_text("")  # the log shipper started
    env = {**workload_env(obj), "PATH": "/usr/bin:/bin", "XRUN_POD_DIR": str(pod_dir),
           "XRUN_NCCL_ENV_PROFILE": str(path), "NCCL_LIB_DIR": str(lib)}
    report = "for n in " + " ".join(NAMES) + '; do eval "echo $n=\\${$n-unset}"; done'
    argv = [expand(a, env) for a in launcher_argv(report)]
    assert argv[0] == "/bin/sh" and argv[1] == f"{pod_dir}/bin/xrun-launch"
    p = subprocess.run(argv, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=60,
                       start_new_session=True)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = (pod_dir / "output.log").read_text().splitlines()
    got = dict(ln.split("=", 1) for ln in lines if ln.split("=", 1)[0] in NAMES)
    if profile == "present":
        assert lines[1:3] == ["profile: sourced", f"xrun-wrapper: nccl env from {path}"]
        assert got == {"NCCL_PROTO": "Simple,LL128", "NCCL_NVLSTREE_MAX_CHUNKSIZE": "131072",
                       "NCCL_MIN_NCHANNELS": "8",
                       "NCCL_TUNER_CONFIG_PATH": f"{lib}/a3plus_tuner_config_ll128.textproto",
                       "NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE": f"{lib}/a3plus_guest_config_ll128.textproto",
                       "NCCL_ALGO": "unset", "NCCL_DEBUG": "INFO"}  # no fallback value leaks in
    else:
        why = f"no {path}" if profile == "absent" else f"{path} failed in /bin/sh"
        assert lines[1] == f"xrun-wrapper: nccl env: {why}; xrun's fallback values (accelerators.yaml env_fallback)"
        assert got == {"NCCL_PROTO": "Simple", "NCCL_NVLSTREE_MAX_CHUNKSIZE": "unset", "NCCL_MIN_NCHANNELS": "8",
                       "NCCL_TUNER_CONFIG_PATH": "/usr/local/nvidia/lib64/a3plus_tuner_config.textproto",
                       "NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE":
                           "/usr/local/nvidia/lib64/a3plus_guest_config.textproto",
                       "NCCL_ALGO": "Ring,Tree", "NCCL_DEBUG": "INFO"}
    assert lines[-1] == "EXIT_CODE=0"
