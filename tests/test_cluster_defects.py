"""Defects a real cluster run would hit (issue 11 §3), each tested on what really comes out:
the pod's exit code with storage down, the node selectors and flag envs of rendered
manifests, ``--replace`` on a live cluster run, JAX writing its cache to gs://, and doctor's
pod-storage probe on the real control plane (tests/cluster/up.sh), where a small runtime
thread runs the probe pod's real command against the GCS emulator (KWOK runs no container).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import REPO, xrun
from cluster_helpers import COMPLETE_DELAY, COMPLETE_JITTER, Cluster

from manifests import catalogue
from manifests.jobset import jobset
from manifests.spec import build_spec
from orchestrator.backends.kube.backend import KubeBackend
from orchestrator.services import doctor
from xrun_contract import EXIT_CODE_LINE, Env, Layout, PodFiles, split_stamp
from xrun_contract.storage import gcs_client, open_storage, read_chunks


def one_error_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xrun: error: "), r.stderr
    return lines[0][len("xrun: error: "):]


# --- the pod keeps the user's exit code ---------------------------------------------------

@pytest.mark.parametrize("mode", ["403", "drop"])
def test_exit_code_survives_unreachable_storage(gcs_proxy, gcs_bucket, mode, tmp_path):
    """Storage refusing (403) or dropping every connection: the user's container still exits
    42 (its launcher never touches storage; shipping is the log sidecar's, another
    container), so JobSet restarts it instead of failing it for good. The sidecar says why
    on stderr without a traceback, and the lines wait in the emptyDir: a sidecar started
    when storage is back ships every one of them."""
    from test_manifests import run_launcher

    if mode == "403":
        gcs_proxy.fail(403, 10_000)
    else:
        gcs_proxy.outage(120, "drop")
    p, pod_dir = run_launcher(tmp_path, "echo hello; exit 42")
    assert p.wait(timeout=30) == 42
    written = (pod_dir / "output.log").read_text()
    assert written.splitlines()[-1] == EXIT_CODE_LINE.format(code=42) and "hello" in written
    env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    env.update(gcs_proxy.env(), PYTHONPATH=str(REPO), **{
        Env.STORAGE: f"{gcs_bucket}/xrun", Env.RUN_NAME: "wr", Env.LOG_FLUSH_SECONDS: "0.2",
        Env.POD_DIR: str(pod_dir)})
    ship = [sys.executable, "-m", "workload.sidecar", "ship"]
    ready = pod_dir / PodFiles.SHIPPER_READY

    def started(side: subprocess.Popen) -> None:  # it takes SIGTERM: a 2 s sleep was short
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert side.poll() is None and time.monotonic() < deadline, side.returncode
            time.sleep(0.02)
        time.sleep(2)  # shipping tried while running

    ready.unlink()  # run_launcher's stand-in: the real one comes
    side = subprocess.Popen(ship, env=env, stderr=subprocess.PIPE, text=True)
    said: list[str] = []  # its stderr lines as they come (list.extend appends each as read)
    reader = threading.Thread(target=said.extend, args=(side.stderr,), daemon=True)
    reader.start()
    started(side)
    permanent = "xrun-logs: shipping failed (permanent), retrying:"
    if mode == "403":  # said while running: wait for it (2 s were short at a load of 20)
        deadline = time.monotonic() + 60
        while not any(permanent in ln for ln in said) and time.monotonic() < deadline:
            time.sleep(0.05)
    side.terminate()  # the kubelet's SIGTERM once the workload container ended
    time.sleep(2)
    side.kill()  # the grace period is over: the final shipping could not finish
    side.wait(timeout=30)
    reader.join(timeout=30)
    err = "".join(said)
    assert "Traceback" not in err
    if mode == "403":
        # A 403 is permanent: said once while running, and the final drain gives up at once.
        line = next(ln for ln in err.splitlines() if permanent in ln)
        assert "403" in line
        assert "xrun-logs: final shipping failed, not retried (permanent" in err, err
    gcs_proxy.clear()
    storage = open_storage(f"{gcs_bucket}/xrun")
    assert storage.list(Layout.run("wr"), delimiter=None)[0] == []
    ready.unlink()
    side = subprocess.Popen(ship, env=env, stderr=subprocess.PIPE, text=True)  # restarted
    started(side)
    side.terminate()
    assert side.wait(timeout=60) == 0
    shipped = "".join(d.decode() for _, d in read_chunks(storage, Layout.host_logs("wr", "0-0", 0)))
    assert "".join(split_stamp(ln)[1] for ln in shipped.splitlines(keepends=True)) == written


# --- catalogue: both v6e-8s, the machine type pinned -------------------------------------

def spec_for(accelerator: str, **extra):
    values = {"name": "m", "accelerator": accelerator, "image": "img:1", "storage": "gs://bkt/xrun", **extra}
    return build_spec(values, {})


def pod_of(obj: dict) -> dict:
    return obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


@pytest.mark.parametrize(("shape", "vms", "chips", "machine"), [
    ("v6e-8", 2, 4, "ct6e-standard-4t"), ("v6e-8-single-host", 1, 8, "ct6e-standard-8t"),
    ("v5litepod-8", 2, 4, "ct5lp-hightpu-4t"), ("v5litepod-8-single-host", 1, 8, "ct5lp-hightpu-8t"),
    ("v6e-1", 1, 1, "ct6e-standard-1t"), ("v6e-4", 1, 4, "ct6e-standard-4t"),
])
def test_eight_chip_shapes_both_ways_and_pinned_to_their_machine_type(shape, vms, chips, machine):
    obj = jobset(spec_for(shape))
    job = obj["spec"]["replicatedJobs"][0]["template"]["spec"]
    pod = pod_of(obj)
    assert job["parallelism"] == vms
    assert pod["containers"][0]["resources"]["limits"] == {"google.com/tpu": str(chips)}
    assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": catalogue.lookup(shape).gke_accelerator,
                                   "cloud.google.com/gke-tpu-topology": catalogue.lookup(shape).topology,
                                   "node.kubernetes.io/instance-type": machine}


def test_every_tpu_shape_names_its_machine_type():
    for name, s in catalogue.shapes().items():
        if s.kind == "tpu":
            assert s.machine_type and pod_of(jobset(spec_for(name)))["nodeSelector"][
                "node.kubernetes.io/instance-type"] == s.machine_type, name


@pytest.mark.parametrize(("args", "message"), [
    (["--tpu", "v6e-8-single-host", "--num-slices", "2"],
     "num_slices: v6e-8-single-host is a single-host slice and GKE runs multislice only on multi-host slices; "
     "use num_slices 1 or a multi-host shape (e.g. v6e-8)"),
    (["--tpu", "v5p-8", "--num-slices", "2"], "num_slices: v5p-8 is a single-host slice"),
    (["--tpu", "v6e-16", "--env", "XLA_FLAGS=--xla_dump_to=/tmp --xla_tpu_enable_async_collective_fusion=true"],
     "env: XLA_FLAGS carries the TPU flag --xla_tpu_enable_async_collective_fusion, which jaxlib does not know "
     "(it aborts at start-up: 'Unknown flag in XLA_FLAGS'); put TPU flags in LIBTPU_INIT_ARGS"),
    (["--tpu", "v6e-16", "--env", "XLA_FLAGS=--megascale_grpc_premap_memory_bytes=1"],
     "env: XLA_FLAGS carries the TPU flag --megascale_grpc"),
    (["--tpu", "v6e-16", "--env", "LIBTPU_INIT_ARGS=--xla_gpu_enable_latency_hiding_scheduler=true"],
     "env: LIBTPU_INIT_ARGS carries the GPU flag --xla_gpu_enable_latency_hiding_scheduler"),
    (["--accelerator", "h100-80gb-8", "--env", "LIBTPU_INIT_ARGS=--xla_tpu_x=1"],
     "env: LIBTPU_INIT_ARGS is read only by libtpu and h100-80gb-8 has no TPU"),
])
def test_render_refuses_what_gke_or_jaxlib_would_refuse(tmp_path, args, message):
    r = xrun("render", "--name", "r", "--image", "img:1", *args, storage=tmp_path, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert one_error_line(r).startswith(message)


def test_flags_in_the_env_that_carries_them_render():
    spec = spec_for("v6e-16", num_slices=2, env={
        "LIBTPU_INIT_ARGS": "--xla_tpu_enable_async_collective_fusion=true --megascale_grpc_premap_memory_bytes=1",
        "XLA_FLAGS": "--xla_dump_to=/tmp/dump"})
    env = {e["name"]: e.get("value") for e in pod_of(jobset(spec))["containers"][0]["env"]}
    assert env["LIBTPU_INIT_ARGS"].startswith("--xla_tpu_enable_async_collective_fusion=true")


def test_jaxlib_really_aborts_on_a_tpu_flag_in_xla_flags():
    """What the validation prevents, on this machine's jaxlib (CPU)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_tpu_enable_async_collective_fusion=true")
    r = subprocess.run([sys.executable, "-c", "import jax; jax.numpy.zeros(1).block_until_ready()"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and re.search(r"parse_flags_from_env.cc:\d+\] Unknown flags? in XLA_FLAGS: "
                                           r"--xla_tpu_enable_async_collective_fusion", r.stderr), r.stderr


# --- the compilation cache under the gs:// root ------------------------------------------

def test_cluster_manifest_puts_the_compilation_cache_under_the_gs_root_and_jax_writes_there(gcs_bucket):
    root = f"{gcs_bucket}/xrun"
    env = {e["name"]: e.get("value") for e in pod_of(jobset(spec_for("v6e-16", storage=root)))["containers"][0]["env"]}
    cache = env[Env.COMPILATION_CACHE]
    assert cache == f"{root}/{Layout.compilation_cache()}"
    assert Env.COMPILATION_CACHE not in {e["name"] for e in pod_of(jobset(spec_for("cpu-2", storage="/tmp/x")))[
        "containers"][0]["env"]}
    # The workload's own configure_platform with that env, then one jitted function.
    script = ("import os, jax, jax.numpy as jnp\n"
              "from workload.distributed import configure_platform, Cluster\n"
              "configure_platform(Cluster.from_env())\n"
              "print(float(jax.jit(lambda x: (x * 2 + 1).sum())(jnp.arange(4.0))))\n")
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    run_env.update(PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", **{
        Env.COMPILATION_CACHE: cache, Env.PLATFORM: "cpu", Env.DEVICES_PER_HOST: "1"})
    r = subprocess.run([sys.executable, "-c", script], env=run_env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and r.stdout.strip() == "16.0", r.stderr[-2000:]
    objects, _ = open_storage(root).list(Layout.compilation_cache(), delimiter=None)
    assert any(o.key.rsplit("/", 1)[-1].startswith("jit__lambda") and o.size > 0 for o in objects), objects


# --- doctor: a pod on the node pool writes storage ---------------------------------------

class Metadata(http.server.ThreadingHTTPServer):
    """The GCE metadata server's two answers the probe asks for (Metadata-Flavor required)."""

    def __init__(self, email: str, scopes: list[str]):
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                base = "/computeMetadata/v1/instance/service-accounts/default/"
                body = {base + "email": email, base + "scopes": "\n".join(scopes)}.get(self.path)
                if self.headers.get("Metadata-Flavor") != "Google" or body is None:
                    self.send_response(403 if body else 404)
                    self.end_headers()
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        super().__init__(("127.0.0.1", 0), Handler)
        self.daemon_threads = True
        threading.Thread(target=outer.serve_forever, daemon=True).start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class Runtime:
    """What KWOK is not: a container runtime. KWOK plays each node's kubelet (pod phases,
    logs from files) but runs nothing, so this thread runs the containers that matter here.
    Every new pod of the cluster's JobSets is held Running (KWOK's completion delay pushed
    out); a doctor probe pod's container command then runs here with the pod's env (plus
    ``pod_env``: the network a hostNetwork pod sees), its output served as the pod's log
    (a KWOK Logs object), and KWOK ends the pod with its exit code. Other runs' pods print
    ``run_lines`` and succeed."""

    def __init__(self, cluster: Cluster, pod_env: dict[str, str], run_lines: list[str] | None = None):
        self.c, self.pod_env, self.run_lines = cluster, pod_env, run_lines or []
        self.seen: set[str] = set()
        self.ran: list[str] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        assert not self.errors, self.errors

    def _loop(self) -> None:
        from cluster_helpers import NAMESPACE

        while not self.stop.wait(0.05):
            try:
                pods = json.loads(self.c.core.list_namespaced_pod(
                    NAMESPACE, label_selector="jobset.sigs.k8s.io/jobset-name", _preload_content=False).data)["items"]
            except Exception:  # noqa: BLE001 - the API server is busy; next round
                continue
            for pod in pods:
                name = pod["metadata"]["name"]
                if name in self.seen or pod["metadata"].get("deletionTimestamp"):
                    continue
                self.seen.add(name)
                try:
                    self.c.core.patch_namespaced_pod(name, NAMESPACE, {"metadata": {"annotations": {
                        COMPLETE_DELAY: "600s", COMPLETE_JITTER: "600s"}}})
                except Exception as e:  # noqa: BLE001
                    self.errors.append(e)
                    continue
                threading.Thread(target=self._play, args=(pod,), daemon=True).start()

    def _play(self, pod: dict[str, Any]) -> None:
        from cluster_helpers import NAMESPACE

        name = pod["metadata"]["name"]
        try:
            self.c.wait(f"{name} Running", lambda: self.c.core.read_namespaced_pod(name, NAMESPACE).status.phase
                        == "Running", 60, every=0.1)
            container = pod["spec"]["containers"][0]
            self.c.serve_logs(name, [container["name"]])
            if pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"].startswith("xrun-doctor-"):
                env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
                env.update({e["name"]: e["value"] for e in container.get("env") or [] if "value" in e})
                # The pod's emptyDir (the pod-code bootstrap unpacks xrun's code into it).
                pod_dir = tempfile.mkdtemp(prefix="xrun-pod-")
                env.update(self.pod_env, PYTHONPATH=str(REPO), **{Env.POD_NAME: name, Env.POD_DIR: pod_dir})
                argv = [sys.executable if a == "python3" else a.replace("$$", "$") for a in container["command"]]
                try:
                    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
                finally:
                    shutil.rmtree(pod_dir, ignore_errors=True)
                lines, code = (r.stdout + r.stderr).splitlines(), r.returncode
            else:
                lines, code = self.run_lines, 0
            self.c.write_log(name, container["name"], lines)
            self.ran.append(name)
            if code:
                self.c.fail_pod(name, code, container["name"])
            else:
                self.c.core.patch_namespaced_pod(name, NAMESPACE, {"metadata": {"annotations": {
                    COMPLETE_DELAY: "1ms", COMPLETE_JITTER: "1ms"}}})
        except BaseException as e:  # noqa: BLE001 - the test asserts there were none
            self.errors.append(e)


@pytest.fixture
def proxy(cluster):
    from kube_fault_proxy import KubeFaultProxy

    p = KubeFaultProxy(cluster).start()
    yield p
    p.stop()


@pytest.fixture
def metadata():
    server = Metadata("tpu-nodes@proj.iam.gserviceaccount.com",
                      ["https://www.googleapis.com/auth/devstorage.read_only",
                       "https://www.googleapis.com/auth/logging.write"])
    yield server
    server.shutdown()
    server.server_close()


def doctor_run_file(tmp_path: Path, root: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({
        "name": "first-run", "accelerator": "v6e-8", "image": "img:1", "storage": root,
        "xrun_image": "example.com/xrun-workload:1", "service_account": "trainer", "context": "xrun-test",
        "command": "python3 -m workload.train"}))
    return path


def test_doctor_proves_a_pod_on_the_node_pool_can_write_storage(cluster, proxy, gcs_bucket, gcs_proxy, metadata,
                                                                tmp_path, monkeypatch):
    root = f"{gcs_bucket}/xrun"
    monkeypatch.setenv("KUBECONFIG", proxy.kubeconfig(tmp_path / "proxied"))
    runtime = Runtime(cluster, {**gcs_proxy.env(), "GCE_METADATA_HOST": metadata.host})
    # The run's Kubernetes service account (without it no pod of the run, or of the probe,
    # can be created: the ServiceAccount admission plugin refuses them).
    cluster.core.create_namespaced_service_account("default", {"metadata": {"name": "trainer"}})
    try:
        v = doctor.inputs(str(doctor_run_file(tmp_path, root)), {"probe_timeout": 60})
        results, code = doctor.doctor(v)
        check = results[-1]
        assert (check.name, check.result) == ("pod-storage", "ok"), check
        assert re.fullmatch(
            rf"a pod on cloud\.google\.com/gke-tpu-accelerator=tpu-v6e-slice,cloud\.google\.com/gke-tpu-topology=2x4,"
            rf"node\.kubernetes\.io/instance-type=ct6e-standard-4t wrote and deleted {root}/\.xrun-doctor/"
            rf"xrun-doctor-[0-9a-f]{{8}}/xrun-doctor-[0-9a-f]{{8}}-slice-0-0-[a-z0-9]{{5}} as "
            rf"tpu-nodes@proj\.iam\.gserviceaccount\.com", check.detail), check.detail
        # The probe JobSet carried the run's pod settings, no chips, and was deleted after.
        post = next(b for m, u, b in proxy.bodies if m == "POST" and u.split("?")[0].endswith("/jobsets")
                    and "dryRun" not in u)
        pod = pod_of(post)
        run_pod = pod_of(jobset(v.probe))
        for key in ("nodeSelector", "tolerations", "hostNetwork", "dnsPolicy", "serviceAccountName"):
            assert pod[key] == run_pod[key], key
        assert pod["serviceAccountName"] == "trainer"
        assert "resources" not in pod["containers"][0] and "ports" not in pod["containers"][0]
        assert pod["containers"][0]["command"] == ["python3", "-m", "workload.probe"]
        assert "annotations" not in post["metadata"]  # no exclusive placement
        assert [u for m, u in proxy.seen if m == "DELETE" and u.split("?")[0].endswith(post["metadata"]["name"])]
        assert open_storage(root).list("", delimiter=None)[0] == []

        # The node pool's identity cannot write: the host can, the pod cannot, and doctor says why.
        gcs_proxy.fail(403, 1000, match=r"xrun-doctor")
        results, code = doctor.doctor(v)
        check = results[-1]
        assert (check.result, code) == ("FAIL", 1), check
        assert [c.result for c in results if c.name == "storage"] == ["ok"]
        assert f"cannot write {root} as tpu-nodes@proj.iam.gserviceaccount.com: " in check.detail
        assert "403" in check.detail
        assert ("these pods use hostNetwork, where GKE Workload Identity does not apply (service_account 'trainer' "
                "does not grant GCS): GCS sees the node pool's service account") in check.detail
        assert ("the node pool's scopes (https://www.googleapis.com/auth/devstorage.read_only, "
                "https://www.googleapis.com/auth/logging.write) exclude GCS writes: recreate it with "
                "--scopes=https://www.googleapis.com/auth/cloud-platform") in check.detail
        assert check.detail.endswith(f"grant tpu-nodes@proj.iam.gserviceaccount.com roles/storage.objectUser on the "
                                     f"bucket of {root}")
    finally:
        runtime.close()
        cluster.core.delete_namespaced_service_account("trainer", "default")


def test_doctor_probe_that_never_schedules_or_cannot_pull(cluster):
    """v6e-16 (topology 4x4): no pool has it, the probe pod stays Pending. Then a probe pod
    whose image the kubelet cannot pull (its status as the kubelet reports it: KWOK pulls
    nothing) fails naming xrun_image."""
    from cluster_helpers import NAMESPACE

    backend = KubeBackend(None, "default", cluster.kubeconfig, poll_seconds=0.1)
    check = doctor.check_pod_storage(backend, spec_for("v6e-16", storage="gs://bkt/xrun"), timeout_s=3)
    assert check.result == "warn" and "did not finish within 3 s (pod Pending: 0/" in check.detail, check.detail
    stop = threading.Event()

    def cannot_pull() -> None:
        done: set[str] = set()
        while not stop.wait(0.1):
            listed = cluster.core.list_namespaced_pod(NAMESPACE, label_selector="jobset.sigs.k8s.io/jobset-name")
            for pod in listed.items:
                if pod.metadata.labels["jobset.sigs.k8s.io/jobset-name"].startswith("xrun-doctor-") and \
                        pod.metadata.name not in done and not pod.metadata.deletion_timestamp:
                    done.add(pod.metadata.name)
                    cluster.core.patch_namespaced_pod_status(pod.metadata.name, NAMESPACE, {"status": {
                        "containerStatuses": [{"name": c.name, "image": c.image, "imageID": "", "ready": False,
                                               "restartCount": 0, "state": {"waiting": {"reason": "ErrImagePull"}}}
                                              for c in pod.spec.containers]}})

    t = threading.Thread(target=cannot_pull, daemon=True)
    t.start()
    try:
        spec = spec_for("v6e-16", storage="gs://bkt/xrun", node_selector={"cloud.google.com/gke-nodepool": "none"})
        check = doctor.check_pod_storage(backend, spec, timeout_s=30)
    finally:
        stop.set()
        t.join(5)
    assert (check.result, check.exit_code) == ("FAIL", 1), check
    # The probe runs xrun_image (the run's image may have no xrun code): that is what failed.
    assert check.detail.startswith("probe pod cannot pull xrun_image xrun-workload:0.1.0: ErrImagePull")


# --- submit --replace never deletes a live cluster run's checkpoints ----------------------

def test_replace_waits_for_the_old_run_to_be_over(cluster, gcs_bucket, tmp_path):
    from cluster_helpers import dead_kubeconfig, timing, unique

    root = f"{gcs_bucket}/xrun"
    storage = open_storage(root)
    name = unique("rp")
    run = tmp_path / "rp.yaml"
    run.write_text(yaml.safe_dump({"name": name, "accelerator": "v6e-8", "image": "img:1", "context": "xrun-test",
                                   "xrun_image": "registry.test/xrun:1", "pod_annotations": timing(run_s=600),
                                   "termination_grace_seconds": 2}))
    flags = ["-f", str(run), "--detach"]
    kube = {"KUBECONFIG": cluster.kubeconfig}
    unreachable = dead_kubeconfig(cluster, tmp_path / "dead")
    try:
        assert xrun("submit", *flags, storage=root, timeout=60, **kube).returncode == 0
        ckpt = f"{Layout.checkpoints(name)}/100/commit_success.txt"
        storage.write_bytes(ckpt, b"ok")

        r = xrun("submit", *flags, "--force", storage=root, timeout=60, **kube)  # --force alone replaces nothing
        assert r.returncode == 2 and one_error_line(r).startswith(f"name: run '{name}' already exists under ")
        r = xrun("submit", *flags, "--replace", storage=root, timeout=60, **kube)
        assert r.returncode == 2 and one_error_line(r).startswith(f"name: run '{name}' is ")
        assert "on the kube backend; --replace would delete its checkpoints" in r.stderr
        assert storage.exists(ckpt)

        # Cluster unreachable and state.json not terminal: nobody can tell, so nothing is deleted.
        r = xrun("submit", *flags, "--replace", storage=root, timeout=60, KUBECONFIG=unreachable)
        assert r.returncode == 3 and one_error_line(r).startswith(
            f"name: cannot tell whether run '{name}' is over (cannot reach the Kubernetes API")
        assert storage.exists(ckpt)

        # The JobSet ended and its TTL removed it: replacing is fine.
        cluster.delete_jobset(name)
        cluster.wait("the JobSet gone", lambda: name not in {
            j["metadata"]["name"] for j in cluster.custom.list_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", "default", "jobsets")["items"]}, 30)
        r = xrun("submit", *flags, "--replace", storage=root, timeout=60, **kube)
        assert r.returncode == 0, r.stderr
        assert not storage.exists(ckpt) and cluster.jobset(name)
        # Finished as state.json says, cluster unreachable: replacing is fine too.
        storage.write_json(Layout.state(name), {"backend": "kube", "state": "Succeeded", "transitions": []})
        r = xrun("submit", *flags, "--replace", storage=root, timeout=60, KUBECONFIG=unreachable)
        assert r.returncode == 3 and "cannot reach the Kubernetes API" in r.stderr  # the create itself, not the check
        assert "cannot tell whether" not in r.stderr

        # --force stops the live run (a foreground delete, waited for) before its data goes.
        r = xrun("submit", *flags, "--replace", "--force", storage=root, timeout=90, **kube)
        assert r.returncode == 0, r.stderr
        writes = [(e["verb"], (e.get("requestObject") or {}).get("propagationPolicy"))
                  for e in cluster.audit_lines() if e.get("stage") == "ResponseComplete"
                  and (e.get("objectRef") or {}).get("resource") == "jobsets"
                  and (e.get("objectRef") or {}).get("name") == name and e["verb"] in ("create", "delete")]
        assert writes[-2:] == [("delete", "Foreground"), ("create", None)], writes
        state = storage.read_json(Layout.state(name))
        assert state is None or state.get("state") != "Running"
    finally:
        cluster.delete_jobset(name)


# --- the README's "First run on GKE", command by command --------------------------------

def readme_first_run() -> tuple[list[str], dict[str, str], dict, list[str]]:
    """The section's xrun commands, exports, run file, and every bash line."""
    text = (REPO / "README.md").read_text()
    section = text.split("### First run on GKE", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, re.S)
    lines = [ln.split("  #")[0].strip() for lang, b in blocks if lang == "bash" for ln in b.splitlines()]
    commands = [ln for ln in lines if ln.startswith("xrun ")]
    exports = dict(ln[len("export "):].split("=", 1) for ln in lines if ln.startswith("export "))
    run_file = next(yaml.safe_load(b) for lang, b in blocks if lang == "yaml")
    return commands, exports, run_file, lines


def test_readme_first_run_on_gke_against_the_real_cluster(cluster, gcs_emulator, gcs_proxy, metadata, tmp_path):
    from test_public_images import images, readme_public_images

    from orchestrator.services.podcode import bundle

    commands, exports, run_file, lines = readme_first_run()
    assert exports == {"XRUN_STORAGE": run_file["storage"]}
    # From get-credentials to logs in the terminal, and no Docker (issue #38).
    assert lines[0].startswith("gcloud container clusters get-credentials ")
    assert not [ln for ln in lines if "docker" in ln.split()[:2]], lines
    assert "xrun_image" not in run_file and run_file["image"] in readme_public_images()
    assert commands[0].startswith("xrun doctor") and any(c.startswith("xrun submit") for c in commands)
    assert any(c.startswith(f"xrun logs {run_file['name']} -f") for c in commands)
    example = REPO / "examples" / "gke-first-run.yaml"
    assert yaml.safe_load(example.read_text()) == run_file  # the README shows the file as it is
    bucket = run_file["storage"][len("gs://"):].split("/")[0]
    with contextlib.suppress(Exception):  # the session's emulator may have it already
        gcs_client().create_bucket(bucket)
    cfg = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    cfg["contexts"][0]["name"] = cfg["current-context"] = run_file["context"]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(cfg))
    name = run_file["name"]
    runtime = Runtime(cluster, {**gcs_proxy.env(), "GCE_METADATA_HOST": metadata.host},
                      run_lines=["step 1 loss 2.5", "EXIT_CODE=0"])
    outputs = {}
    try:
        for command in commands:
            argv = command.split()[1:]
            r = xrun(*argv, storage=exports["XRUN_STORAGE"], timeout=180, cwd=REPO, KUBECONFIG=str(kubeconfig))
            assert r.returncode == 0, (command, r.stdout[-2000:], r.stderr[-2000:])
            outputs[argv[0]] = r
    finally:
        runtime.close()
        cluster.delete_jobset(name)
    lines = outputs["doctor"].stdout.splitlines()
    assert [ln.split()[1] for ln in lines] == [
        "api", "jobset", "jobset-controller", "rbac", "priority", "nodes", "capacity", "storage", "pod-storage"]
    # JobSet runs as a process here, without the Deployment doctor reads a release from: warn.
    assert [ln.split()[0] for ln in lines] == ["ok", "ok", "warn", "ok", "ok", "ok", "ok", "ok", "ok"], lines
    assert yaml.safe_load(outputs["render"].stdout)["metadata"]["name"] == name
    assert "step 1 loss 2.5" in outputs["logs"].stdout
    assert "Succeeded" in outputs["status"].stdout
    storage = open_storage(run_file["storage"])
    stored = storage.read_json(Layout.run_json(name))
    assert stored["backend"] == "kube" and stored["context"] == run_file["context"]
    # Only public images; the shipped tree and xrun's pod code are in the bucket for the pods.
    manifest = yaml.safe_load(storage.read_text(Layout.manifest(name)) or "")
    assert images(manifest) == set(readme_public_images())
    assert storage.read_bytes(Layout.pod_code(bundle()[0])) == bundle()[1]
    assert storage.exists_object(Layout.code(stored["spec"]["code_sha256"]))


def test_the_probe_runs_xrun_image_whatever_the_run_image():
    """The probe's command is xrun's (``python3 -m workload.probe``): a MaxText run's image
    has no xrun code, so the probe pod runs ``xrun_image`` on the same node settings."""
    from manifests.probe import PROBE_COMMAND, probe_jobset
    from manifests.spec import build_spec

    spec = build_spec({"name": "mt", "accelerator": "v6e-16", "image": "maxtext:stock",
                       "storage": "gs://bkt/xrun", "xrun_image": "us-docker.pkg.dev/p/r/xrun:1"}, {})
    pod = probe_jobset(spec, "xrun-doctor-1")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "us-docker.pkg.dev/p/r/xrun:1" and container["command"] == PROBE_COMMAND
    # Its pull policy is the probe image's own default, not the run image's.
    latest = build_spec({"name": "mt", "accelerator": "v6e-16", "image": "maxtext:stock", "storage": "gs://bkt/xrun",
                         "xrun_image": "us-docker.pkg.dev/p/r/xrun:latest"}, {})
    pod = probe_jobset(latest, "xrun-doctor-2")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert [(c["image"], c["imagePullPolicy"]) for c in pod["containers"]] == [
        ("us-docker.pkg.dev/p/r/xrun:latest", "Always")]
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "4x4"
