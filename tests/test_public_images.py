"""A first cluster run needs no image of xrun's (issue #38): its pods run only public images.

The init step and the log shipper run ``xrun_python_image`` (Docker Hub's python) with xrun's
pod code fetched from the run's storage (``manifests.podcode``). Here they run exactly as the
rendered manifest says, with only what that image holds: ``python3 -I -S`` (the standard
library, no site-packages, none of the test's environment), against fake-gcs-server and a
folder root; the workdir must arrive in the pod folder and the shipped lines must be what
``xrun logs`` prints.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import REPO, xrun

from manifests.jobset import INIT_CONTAINER, LOGS_CONTAINER
from manifests.spec import DEFAULT_XRUN_PYTHON_IMAGE, RunSpec, build_spec
from orchestrator.services import code, podcode
from orchestrator.services.runs import render
from xrun_contract import Layout, PodFiles
from xrun_contract.storage import open_storage


def readme_public_images() -> list[str]:
    """The images of the README's "Public images" table (first column)."""
    text = (REPO / "README.md").read_text()
    section = text.split("### Public images", 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, re.M)


def images(manifest: dict[str, Any]) -> set[str]:
    out = set()
    for rj in manifest["spec"]["replicatedJobs"]:
        pod = rj["template"]["spec"]["template"]["spec"]
        out |= {c["image"] for c in pod["containers"] + pod.get("initContainers", [])}
    return out


def first_run_spec(**extra: Any) -> RunSpec:
    public = readme_public_images()
    return build_spec({"name": "pub", "accelerator": "v6e-32", "image": public[1], "storage": "gs://bkt/xrun",
                       "context": "gke_p_us-east5_c", "command": "python3 train.py", **extra}, {})


def test_a_v6e_32_manifest_names_only_the_readmes_public_images():
    public = readme_public_images()
    assert public[0] == DEFAULT_XRUN_PYTHON_IMAGE and "jax" in public[1], public
    manifest = render(first_run_spec())
    assert images(manifest) == set(public)
    pod = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "4x8"
    xrun_own = {c["name"]: c for c in pod["initContainers"]}
    sha = podcode.bundle()[0]
    for name in (INIT_CONTAINER, LOGS_CONTAINER):
        c = xrun_own[name]
        assert c["image"] == DEFAULT_XRUN_PYTHON_IMAGE and c["command"][:4] == ["python3", "-I", "-u", "-c"]
        assert {"name": "XRUN_POD_CODE_SHA256", "value": sha} in c["env"]
    # The stock MaxText example (v6e-32) runs its own image and the public python image only.
    from orchestrator.runfile import spec_from_inputs

    maxtext = render(spec_from_inputs(str(REPO / "examples/maxtext-v6e.yaml"), {"context": "gke_p_z_c"}))
    assert images(maxtext) == {DEFAULT_XRUN_PYTHON_IMAGE, yaml_image(REPO / "examples/maxtext-v6e.yaml")}
    # A built xrun_image stays an option: then both of xrun's containers run it, no pod code.
    built = render(first_run_spec(xrun_image="us-docker.pkg.dev/p/r/xrun-workload:1"))
    assert images(built) == {public[1], "us-docker.pkg.dev/p/r/xrun-workload:1"}
    assert "XRUN_POD_CODE_SHA256" not in json.dumps(built)


def yaml_image(path: Path) -> str:
    import yaml

    return yaml.safe_load(path.read_text())["image"]


def container_argv_env(c: dict[str, Any], pod_dir: Path, root: str) -> tuple[list[str], dict[str, str]]:
    """What the kubelet would run, on this machine: the Downward API values of host 0-0,
    attempt 0; the emptyDir at ``pod_dir``, the storage root ``root``; ``$(VAR)`` expanded and ``$$`` undone as
    Kubernetes does; python3 as this interpreter with -S (the standard library only)."""
    env = {e["name"]: e.get("value", "0") for e in c["env"]}
    env["XRUN_POD_DIR"] = str(pod_dir)
    env["XRUN_STORAGE"] = root

    def expand(s: str) -> str:
        return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m[1]] if m[1] else "$", s)

    env = {k: expand(v) for k, v in env.items()}
    argv = [expand(a) for a in c["command"]]
    assert argv[0] == "python3"
    return [sys.executable, "-S", *argv[1:]], env


@pytest.mark.parametrize("where", ["gcs", "folder"])
def test_init_and_shipper_run_with_only_the_python_images_contents(where, request, tmp_path):
    root = f"{request.getfixturevalue('gcs_bucket')}/xrun" if where == "gcs" else str(tmp_path / "root")
    name = f"pub-{where}"
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "train.py").write_text("print('hello from the shipped tree')\n")
    (tree / "pkg" / "__init__.py").write_text("X = 1\n")
    # A cluster spec names a gs:// root; the folder case hands the pod a folder instead.
    rendered_root = root if where == "gcs" else "gs://unused/xrun"
    spec, packed = code.prepare(first_run_spec(name=name, storage=rendered_root, workdir=str(tree)))
    assert packed is not None and spec.pod_code_sha256 == podcode.bundle()[0]
    storage = open_storage(root)
    assert code.upload(storage, packed) and podcode.upload(storage, spec)
    assert not podcode.upload(storage, spec)  # once per xrun version
    pod = render(spec)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    xrun_own = {c["name"]: c for c in pod["initContainers"]}
    pod_dir = tmp_path / "pod"
    pod_dir.mkdir()
    # The pod's env only: no PYTHONPATH, no site-packages; the emulator as a pod would have
    # its metadata server (tests/test_gcs_http below covers the token).
    base = {"PATH": "/usr/bin:/bin"}
    if where == "gcs":
        base["STORAGE_EMULATOR_HOST"] = os.environ["STORAGE_EMULATOR_HOST"]

    argv, env = container_argv_env(xrun_own[INIT_CONTAINER], pod_dir, root)
    r = subprocess.run(argv, env={**base, **env}, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (pod_dir / "bin" / "xrun-launch").read_bytes() == (REPO / "workload/launcher.sh").read_bytes()
    assert (pod_dir / "code" / "train.py").read_text() == "print('hello from the shipped tree')\n"
    assert (pod_dir / "code" / "pkg" / "__init__.py").read_text() == "X = 1\n"
    assert "unpacked into" in r.stderr
    # Nothing of the test's environment was imported: no google-cloud-storage under -S.
    probe = subprocess.run([sys.executable, "-S", "-c", "import google.cloud.storage"], env=base,
                           capture_output=True, text=True)
    assert probe.returncode != 0

    argv, env = container_argv_env(xrun_own[LOGS_CONTAINER], pod_dir, root)
    env["XRUN_LOG_FLUSH_SECONDS"] = "0.2"
    out = pod_dir / "output.log"
    shipper = subprocess.Popen(argv, env={**base, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=tmp_path)
    try:
        with out.open("a") as f:
            f.write("step 1 loss 2.5\n")
            f.flush()
            deadline = time.monotonic() + 60
            while not any(b"step 1 loss 2.5" in d for _, d in chunks(storage, name)):
                assert time.monotonic() < deadline and shipper.poll() is None, shipper.stderr
                time.sleep(0.1)
            f.write("EXIT_CODE=0\nno newline at the end")  # drained on SIGTERM, partial line too
        # It takes SIGTERM, so the launcher may end (workload.sidecar.say_ready).
        assert (pod_dir / PodFiles.SHIPPER_READY).read_text() == f"{shipper.pid}\n"
        shipper.send_signal(signal.SIGTERM)
        assert shipper.wait(60) == 0, shipper.stderr.read() if shipper.stderr else ""
    finally:
        if shipper.poll() is None:
            shipper.kill()
            shipper.wait()
    # xrun logs reads what the shipper wrote (a stored run: run.json and its end state).
    storage.write_json(Layout.run_json(name), {"name": name, "spec": {"name": name}, "backend": "local",
                                               "submitted_at": time.time()})
    storage.write_json(Layout.state(name), {"state": "Succeeded", "transitions": []})
    r = xrun("logs", name, storage=root, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [ln.split(" ", 1)[-1] for ln in r.stdout.splitlines()][-3:] == [
        "step 1 loss 2.5", "EXIT_CODE=0", "no newline at the end"], r.stdout


def chunks(storage: Any, name: str) -> list[tuple[str, bytes]]:
    from xrun_contract.storage import read_chunks

    return list(read_chunks(storage, Layout.run(name)))


def test_gcs_http_takes_its_token_from_the_metadata_server(gcs_emulator, tmp_path):
    """Off the emulator the standard-library client asks the metadata server for a token
    (Metadata-Flavor: Google) and sends it as a Bearer token; a 403 is permanent, one line."""
    import http.server
    import threading

    seen: list[tuple[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append((self.path, self.headers.get("Metadata-Flavor") or self.headers.get("Authorization", "")))
            if self.path.endswith("/token"):
                body = json.dumps({"access_token": "tok-1", "expires_in": 3600, "token_type": "Bearer"}).encode()
                self.send_response(200)
            else:
                body = b'{"error": {"code": 403}}'
                self.send_response(403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        from xrun_contract import gcs_http
        from xrun_contract.storage import StorageError

        host = f"127.0.0.1:{server.server_address[1]}"
        env = {"GCE_METADATA_HOST": host}
        old = {k: os.environ.pop(k, None) for k in ("STORAGE_EMULATOR_HOST",)}
        os.environ.update(env)
        try:
            storage = gcs_http.GCSHttpStorage("gs://bkt/pre", timeout=5)
            storage.api = f"http://{host}"  # the JSON API, served by the same fake
            with pytest.raises(StorageError) as e:
                storage.read_bytes("k")
        finally:
            os.environ.pop("GCE_METADATA_HOST")
            os.environ.update({k: v for k, v in old.items() if v is not None})
        assert e.value.permanent and "permission denied (HTTP 403)" in str(e.value)
        assert seen == [("/computeMetadata/v1/instance/service-accounts/default/token", "Google"),
                        ("/storage/v1/b/bkt/o/pre%2Fk?alt=media", "Bearer tok-1")]
    finally:
        server.shutdown()
        server.server_close()


def test_gcs_http_does_what_the_probe_and_shipper_ask_of_storage(gcs_bucket):
    """The standard-library client against fake-gcs-server: what the pod side calls (the
    probe's write, read back and delete; exclusive create; listing with and without a
    delimiter), agreeing with google-cloud-storage's view of the same bucket."""
    from xrun_contract.gcs_http import GCSHttpStorage

    plain = GCSHttpStorage(f"{gcs_bucket}/pre fix")
    full = open_storage(f"{gcs_bucket}/pre fix")
    assert type(full).__name__ == "GCSStorage"  # this environment has the client
    plain.write_bytes("a/one.log", b"1")
    plain.write_bytes("a/b/two.log", b"22")
    assert full.read_bytes("a/one.log") == b"1" and plain.read_bytes("a/b/two.log") == b"22"
    assert plain.read_bytes("a/none") is None and not plain.exists_object("a/none") and plain.exists_object("a/one.log")
    objects, prefixes = plain.list("a")
    assert [(o.key, o.size) for o in objects] == [("a/one.log", 1)] and prefixes == ["a/b"]
    assert [o.key for o in plain.list("a", delimiter=None)[0]] == ["a/b/two.log", "a/one.log"]
    assert objects[0].updated > time.time() - 600
    assert plain.create_exclusive("x", b"mine") and not plain.create_exclusive("x", b"theirs")
    assert full.read_bytes("x") == b"mine"
    assert plain.delete_prefix("a") == 2 and full.list("a", delimiter=None)[0] == []
    assert plain.delete_object("x") and not plain.delete_object("x")


def test_the_pod_code_is_named_only_where_it_is_fetched():
    """A cluster run without xrun_image names this xrun's pod code (a stale name from a
    resumed run's record is replaced); with xrun_image, or a local run, none is named."""
    sha = podcode.bundle()[0]
    assert podcode.with_pod_code(first_run_spec(pod_code_sha256="0" * 64)).pod_code_sha256 == sha
    built = podcode.with_pod_code(first_run_spec(xrun_image="registry.test/x:1", pod_code_sha256="0" * 64))
    assert built.pod_code_sha256 == ""
    local = build_spec({"name": "l", "accelerator": "cpu-2", "image": "x", "storage": "/tmp/s"}, {})
    assert podcode.with_pod_code(local).pod_code_sha256 == ""
    # Deterministic: the same bytes every time (one upload per xrun version).
    podcode.bundle.cache_clear()
    assert podcode.bundle()[0] == sha
