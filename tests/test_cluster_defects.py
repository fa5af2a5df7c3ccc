"""Defects a real cluster run would hit (issue 11 §3), each tested on what really comes out:
the pod's exit code with storage down, the node selectors and flag envs of rendered
manifests, ``--replace`` on a live cluster run, JAX writing its cache to gs://, and doctor's
controller-version and pod-storage checks against the scripted API server, where a small
controller thread runs the probe pod's real command against the GCS emulator.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from cli_helpers import REPO, xrun
from kube_api import KubeAPI, deployment, status

from manifests import catalogue
from manifests.jobset import jobset
from manifests.spec import build_spec
from orchestrator.backends.kube.backend import KubeBackend
from orchestrator.services import doctor
from xrun_contract import EXIT_CODE_LINE, Env, Layout, split_stamp
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
    side = subprocess.Popen(ship, env=env, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    side.terminate()  # the kubelet's SIGTERM once the workload container ended
    time.sleep(2)
    side.kill()  # the grace period is over: the final shipping could not finish
    err = side.communicate(timeout=30)[1]
    assert "Traceback" not in err
    if mode == "403":
        line = next(ln for ln in err.splitlines() if "xrun-logs: shipping failed, retrying:" in ln)
        assert "403" in line
    gcs_proxy.clear()
    storage = open_storage(f"{gcs_bucket}/xrun")
    assert storage.list(Layout.run("wr"), delimiter=None)[0] == []
    side = subprocess.Popen(ship, env=env, stderr=subprocess.PIPE, text=True)  # restarted
    time.sleep(2)
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
    (["--tpu", "v6e-16", "--env", "XLA_FLAGS=--megascale_grpc_premap_memory_bytes=1"], "env: XLA_FLAGS carries the TPU flag --megascale_grpc"),
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


# --- doctor: the JobSet controller's version ---------------------------------------------

@pytest.fixture
def backend(kubeconfig):
    return KubeBackend(None, "default", kubeconfig, poll_seconds=0.1)


@pytest.mark.parametrize(("image", "ready", "result", "detail"), [
    ("registry.k8s.io/jobset/jobset:v0.12.0", 1, "ok", "jobset-system/jobset-controller-manager runs "
     "registry.k8s.io/jobset/jobset:v0.12.0 (1 ready)"),
    ("registry.k8s.io/jobset/jobset:v0.10.1", 1, "warn", "jobset-system/jobset-controller-manager runs "
     "registry.k8s.io/jobset/jobset:v0.10.1 (1 ready): works, but xrun's admission rules are v0.12's"),
    ("registry.k8s.io/jobset/jobset:v0.5.2", 1, "FAIL", "jobset-system/jobset-controller-manager runs "
     "registry.k8s.io/jobset/jobset:v0.5.2 (1 ready): older than v0.6, which sets the job-global-index label"),
    ("registry.k8s.io/jobset/jobset:v0.12.0", 0, "FAIL", "jobset-system/jobset-controller-manager runs "
     "registry.k8s.io/jobset/jobset:v0.12.0 (0 ready): no ready replica"),
    ("example.com/jobset@sha256:abc", 1, "warn", "jobset-system/jobset-controller-manager runs "
     "example.com/jobset@sha256:abc (1 ready): no release in the image tag"),
])
def test_doctor_reads_the_controller_version(api, backend, image, ready, result, detail):
    api.deployments[("jobset-system", "jobset-controller-manager")] = deployment(
        "jobset-system", "jobset-controller-manager", image, ready)
    check = doctor.check_jobset_controller(backend)
    assert (check.result, check.detail[:len(detail)]) == (result, detail)
    (req,) = api.requests_to("GET", "/deployments/")
    assert req.path == "/apis/apps/v1/namespaces/jobset-system/deployments/jobset-controller-manager"


def test_doctor_tells_forbidden_from_missing(api, backend):
    api.fail("GET", "/deployments/", 403, status(403, "Forbidden", 'deployments.apps "jobset-controller-manager" is '
                                                 'forbidden: User "dev" cannot get resource "deployments"'))
    check = doctor.check_jobset_controller(backend)
    assert check.result == "warn" and check.detail.startswith(
        "RBAC forbids reading Deployment jobset-system/jobset-controller-manager, so its version is unchecked "
        "(needs get on deployments.apps in jobset-system)")
    api.faults.clear()
    # No Deployment where the release manifests put it is not "no controller" (a Helm install
    # names it otherwise; the real test cluster runs it as a process: test_cluster_doctor.py).
    # JobSet's webhooks are registered behind a Service: the controller's Deployment is the
    # one beside that Service.
    del api.deployments[("jobset-system", "jobset-controller-manager")]
    api.deployments[("jobset-system", "jobset")] = deployment("jobset-system", "jobset",
                                                              "registry.k8s.io/jobset/jobset:v0.11.1")
    check = doctor.check_jobset_controller(backend)
    assert (check.result, check.detail) == ("warn", "jobset-system/jobset runs registry.k8s.io/jobset/jobset:v0.11.1 "
                                                    "(1 ready): works, but xrun's admission rules are v0.12's; upgrade "
                                                    "(install JobSet: kubectl apply --server-side -f https://github.com/"
                                                    "kubernetes-sigs/jobset/releases/download/v0.12.0/manifests.yaml)")
    # No Deployment to read: the webhooks answering a dry-run create (defaulted) prove it runs.
    del api.deployments[("jobset-system", "jobset")]
    check = doctor.check_jobset_controller(backend)
    assert check.result == "warn" and check.detail.startswith(
        "JobSet controller answers: JobSet's webhooks mjobset.kb.io (jobset-mutating-webhook-configuration), "
        "vjobset.kb.io (jobset-validating-webhook-configuration) are registered, served by service "
        "jobset-system/jobset-webhook-service, and a dry-run JobSet passed them")
    (create,) = api.requests_to("POST", "/jobsets$")
    assert create.query["dryRun"] == "All" and not api.jobsets
    # Kueue's JobSet webhooks have the same names: alone, they are no JobSet controller.
    kueue = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
             "metadata": {"name": "kueue-validating-webhook-configuration"}, "webhooks": [
                 {"name": "vjobset.kb.io", "rules": [{"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"]}]},
                 {"name": "vworkload.kb.io", "rules": [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"]}]}]}
    api.webhook_configurations = [kueue]
    check = doctor.check_jobset_controller(backend)
    assert (check.result, check.exit_code) == ("FAIL", 1)
    assert check.detail.startswith("no JobSet controller: no Deployment jobset-system/jobset-controller-manager, "
                                   "and no webhook configuration registers JobSet's webhooks (vjobset.kb.io, "
                                   "mjobset.kb.io; Kueue's of the same names do not count), so JobSets would "
                                   "never get Jobs; install JobSet")


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


class Kubelet:
    """Plays the JobSet controller and the kubelet on its own clock: every probe JobSet gets
    its pod, whose container command runs here with the pod's env (plus ``pod_env``: the
    network a hostNetwork pod sees); other JobSets get pods that run ``run_lines`` and succeed."""

    def __init__(self, api: KubeAPI, pod_env: dict[str, str], run_lines: list[str] | None = None):
        self.api, self.pod_env, self.run_lines = api, pod_env, run_lines or []
        self.seen: set[tuple[str, str]] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)

    def _loop(self) -> None:
        while not self.stop.wait(0.05):
            for key in list(self.api.jobsets):
                if key not in self.seen:
                    self.seen.add(key)
                    threading.Thread(target=self._play, args=(key,), daemon=True).start()

    def _play(self, key: tuple[str, str]) -> None:
        ns, name = key
        js = self.api.jobsets.get(key)
        if js is None:
            return
        if not name.startswith("xrun-doctor-"):
            return self._play_run(ns, name)
        pod_spec = pod_of(js)
        container = pod_spec["containers"][0]
        (pod_name,) = self.api.set_pods(name, 0, "Running", namespace=ns)
        env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
        env.update({e["name"]: e["value"] for e in container["env"] if "value" in e})
        env.update(self.pod_env, PYTHONPATH=str(REPO), **{Env.POD_NAME: pod_name})
        argv = [sys.executable if a == "python3" else a for a in container["command"]]
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
        self.api.log(pod_name, *(r.stdout + r.stderr).splitlines())
        self.api.set_pods(name, 0, "Succeeded" if r.returncode == 0 else "Failed", namespace=ns,
                          exit_code=r.returncode)

    def _play_run(self, ns: str, name: str) -> None:
        names = self.api.set_pods(name, 0, "Running", namespace=ns)
        time.sleep(0.5)
        for pod in names:
            self.api.log(pod, *self.run_lines)
        time.sleep(0.5)
        self.api.set_pods(name, 0, "Succeeded", namespace=ns, exit_code=0)
        self.api.set_jobset_status(name, namespace=ns, conditions=[
            {"type": "Completed", "status": "True", "reason": "AllJobsCompleted",
             "message": "jobset completed successfully"}])


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
        "service_account": "trainer", "context": "test-ctx", "command": "python3 -m workload.train"}))
    return path


def test_doctor_proves_a_pod_on_the_node_pool_can_write_storage(api, kubeconfig, gcs_bucket, gcs_proxy, metadata,
                                                                tmp_path, monkeypatch):
    root = f"{gcs_bucket}/xrun"
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    kubelet = Kubelet(api, {**gcs_proxy.env(), "GCE_METADATA_HOST": metadata.host})
    try:
        v = doctor.inputs(str(doctor_run_file(tmp_path, root)), {"probe_timeout": 60})
        results, code = doctor.doctor(v)
        check = results[-1]
        assert (check.name, check.result) == ("pod-storage", "ok"), check
        assert re.fullmatch(
            rf"a pod on cloud\.google\.com/gke-tpu-accelerator=tpu-v6e-slice,cloud\.google\.com/gke-tpu-topology=2x4,"
            rf"node\.kubernetes\.io/instance-type=ct6e-standard-4t wrote and deleted {root}/\.xrun-doctor/"
            rf"xrun-doctor-[0-9a-f]{{8}}/xrun-doctor-[0-9a-f]{{8}}-slice-0-0-[0-9a-f]{{5}} as "
            rf"tpu-nodes@proj\.iam\.gserviceaccount\.com", check.detail), check.detail
        # The probe JobSet carried the run's pod settings, no chips, and was deleted after.
        (post,) = api.requests_to("POST", "/jobsets$")
        pod = pod_of(post.body)
        run_pod = pod_of(jobset(v.probe))
        for key in ("nodeSelector", "tolerations", "hostNetwork", "dnsPolicy", "serviceAccountName"):
            assert pod[key] == run_pod[key], key
        assert pod["serviceAccountName"] == "trainer"
        assert "resources" not in pod["containers"][0] and "ports" not in pod["containers"][0]
        assert pod["containers"][0]["command"] == ["python3", "-m", "workload.probe"]
        assert "annotations" not in post.body["metadata"]  # no exclusive placement
        (delete,) = api.requests_to("DELETE", "/jobsets/xrun-doctor-")
        assert delete.path.endswith(post.body["metadata"]["name"])
        assert open_storage(root).list("", delimiter=None)[0] == []

        # The node pool's identity cannot write: the host can, the pod cannot, and doctor says why.
        gcs_proxy.fail(403, 1000, match=r"xrun-doctor")
        results, code = doctor.doctor(v)
        check = results[-1]
        assert (check.result, code) == ("FAIL", 1)
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
        kubelet.close()


def test_doctor_probe_that_never_schedules_or_cannot_pull(api, backend, tmp_path):
    spec = spec_for("v6e-16", storage="gs://bkt/xrun")
    check = doctor.check_pod_storage(backend, spec, timeout_s=0.5)
    assert check.result == "warn" and "did not finish within 0 s (no pod yet)" in check.detail

    def pull_error(s: KubeAPI, n: str) -> None:
        s.set_pods(n, 0, "Pending", waiting="ErrImagePull")

    api.script([pull_error])
    check = doctor.check_pod_storage(backend, spec, timeout_s=10)
    assert (check.result, check.exit_code) == ("FAIL", 1)
    # The probe runs xrun_image (the run's image may have no xrun code): that is what failed.
    assert check.detail.startswith("probe pod cannot pull xrun_image xrun-workload:0.1.0: ErrImagePull")


# --- submit --replace never deletes a live cluster run's checkpoints ----------------------

def test_replace_waits_for_the_old_run_to_be_over(api, kubeconfig, gcs_bucket, tmp_path):
    root = f"{gcs_bucket}/xrun"
    storage = open_storage(root)
    flags = ["--name", "rp", "--tpu", "v6e-16", "--image", "img:1", "--xrun-image", "registry.test/xrun:1",
             "--context", "test-ctx", "--detach"]
    assert xrun("submit", *flags, storage=root, timeout=60, KUBECONFIG=kubeconfig).returncode == 0
    storage.write_bytes(f"{Layout.checkpoints('rp')}/100/commit_success.txt", b"ok")
    ckpt = f"{Layout.checkpoints('rp')}/100/commit_success.txt"

    r = xrun("submit", *flags, "--force", storage=root, timeout=60, KUBECONFIG=kubeconfig)
    assert r.returncode == 2 and one_error_line(r) == "--force: only with --replace (it replaces a run that is still live)"
    r = xrun("submit", *flags, "--replace", storage=root, timeout=60, KUBECONFIG=kubeconfig)
    assert r.returncode == 2 and one_error_line(r).startswith("name: run 'rp' is Pending on the kube backend; "
                                                              "--replace would delete its checkpoints")
    assert storage.exists(ckpt) and len(api.requests_to("POST", "/jobsets$")) == 1

    # Cluster unreachable and state.json not terminal: nobody can tell, so nothing is deleted.
    dead = KubeAPI().start()
    unreachable = str(dead.kubeconfig(tmp_path / "dead"))
    dead.stop()
    r = xrun("submit", *flags, "--replace", storage=root, timeout=60, KUBECONFIG=unreachable)
    assert r.returncode == 3 and one_error_line(r).startswith("name: cannot tell whether run 'rp' is over (cannot "
                                                              "reach the Kubernetes API")
    assert storage.exists(ckpt)

    # The JobSet ended and its TTL removed it: replacing is fine.
    api.jobsets.pop(("default", "rp"))
    r = xrun("submit", *flags, "--replace", storage=root, timeout=60, KUBECONFIG=kubeconfig)
    assert r.returncode == 0, r.stderr
    assert not storage.exists(ckpt) and len(api.requests_to("POST", "/jobsets$")) == 2
    # Finished as state.json says, cluster unreachable: replacing is fine too.
    storage.write_json(Layout.state("rp"), {"backend": "kube", "state": "Succeeded", "transitions": []})
    api.jobsets.pop(("default", "rp"))
    r = xrun("submit", *flags, "--replace", storage=root, timeout=60, KUBECONFIG=unreachable)
    assert r.returncode == 3 and "cannot reach the Kubernetes API" in r.stderr  # the create itself, not the check
    assert "cannot tell whether" not in r.stderr


def test_force_stops_the_live_run_before_its_data_goes(api, kubeconfig, gcs_bucket):
    root = f"{gcs_bucket}/xrun"
    flags = ["--name", "fr", "--tpu", "v6e-16", "--image", "img:1", "--xrun-image", "registry.test/xrun:1",
             "--context", "test-ctx", "--detach"]
    assert xrun("submit", *flags, storage=root, timeout=60, KUBECONFIG=kubeconfig).returncode == 0
    api.set_pods("fr", 0, "Running")
    r = xrun("submit", *flags, "--replace", "--force", storage=root, timeout=60, KUBECONFIG=kubeconfig)
    assert r.returncode == 0, r.stderr
    writes = [(q.method, q.path.rsplit("/", 1)[-1]) for q in api.requests if q.method in ("POST", "DELETE")]
    assert writes == [("POST", "jobsets"), ("DELETE", "fr"), ("POST", "jobsets")]
    state = open_storage(root).read_json(Layout.state("fr"))
    assert state is None or state.get("state") != "Running"


# --- the README's "First run on GKE", command by command --------------------------------

def readme_first_run() -> tuple[list[str], dict[str, str], dict]:
    text = (REPO / "README.md").read_text()
    section = text.split("### First run on GKE", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, re.S)
    lines = [ln.split("  #")[0].strip() for lang, b in blocks if lang == "bash" for ln in b.splitlines()]
    commands = [ln for ln in lines if ln.startswith("xrun ")]
    exports = dict(ln[len("export "):].split("=", 1) for ln in lines if ln.startswith("export "))
    run_file = next(yaml.safe_load(b) for lang, b in blocks if lang == "yaml")
    return commands, exports, run_file


def test_readme_first_run_on_gke_against_the_scripted_cluster(api, gcs_emulator, gcs_proxy, metadata, tmp_path):
    commands, exports, run_file = readme_first_run()
    assert exports == {"XRUN_STORAGE": run_file["storage"]}
    assert commands[0].startswith("xrun doctor") and any(c.startswith("xrun submit") for c in commands)
    example = REPO / "examples" / "gke-first-run.yaml"
    assert yaml.safe_load(example.read_text()) == run_file  # the README shows the file as it is
    bucket = run_file["storage"][len("gs://"):].split("/")[0]
    with contextlib.suppress(Exception):  # the session's emulator may have it already
        gcs_client().create_bucket(bucket)
    kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig", context=run_file["context"]))
    name = run_file["name"]
    api.nodes = [{"metadata": {"name": f"gke-tpu-{i}", "labels": {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice", "cloud.google.com/gke-tpu-topology": "2x4",
        "node.kubernetes.io/instance-type": "ct6e-standard-4t"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}} for i in range(2)]
    kubelet = Kubelet(api, {**gcs_proxy.env(), "GCE_METADATA_HOST": metadata.host},
                      run_lines=["step 1 loss 2.5", "EXIT_CODE=0"])
    outputs = {}
    try:
        for command in commands:
            argv = command.split()[1:]
            r = xrun(*argv, storage=exports["XRUN_STORAGE"], timeout=180, cwd=REPO, KUBECONFIG=kubeconfig)
            assert r.returncode == 0, (command, r.stdout[-2000:], r.stderr[-2000:])
            outputs[argv[0]] = r
    finally:
        kubelet.close()
    assert [ln.split()[1] for ln in outputs["doctor"].stdout.splitlines()] == [
        "api", "jobset", "jobset-controller", "rbac", "priority", "nodes", "storage", "pod-storage"]
    assert all(ln.split()[0] == "ok" for ln in outputs["doctor"].stdout.splitlines())
    assert yaml.safe_load(outputs["render"].stdout)["metadata"]["name"] == name
    assert "step 1 loss 2.5" in outputs["logs"].stdout
    assert "Succeeded" in outputs["status"].stdout
    stored = open_storage(run_file["storage"]).read_json(Layout.run_json(name))
    assert stored["backend"] == "kube" and stored["context"] == run_file["context"]


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
