"""Any image runs under xrun: the user's container needs /bin/sh and nothing of xrun.

xrun's part of every pod comes from xrun's image (``manifests.jobset.xrun_containers``): an
init container installs a POSIX-sh launcher into a shared emptyDir, and a native sidecar
ships the launcher's output file to storage. These tests run that launcher and that
shipper for real, a stock-MaxText run file through render + admission, and a JAX program
that knows nothing of xrun on the local backend (2 hosts, gloo).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from cli_helpers import REPO, xrun
from test_manifests import run_launcher

from manifests.spec import DEFAULT_XRUN_PYTHON_IMAGE
from orchestrator.runfile import spec_from_inputs
from orchestrator.services.runs import render
from workload.failures import NATIVE_FATAL_TEXT, classify_output
from workload.sidecar import Shipper, run
from xrun_contract import (
    EXIT_CODE_RE,
    FAILURE_RE,
    WRAPPER_END_RE,
    WRAPPER_START_RE,
    Layout,
    split_stamp,
)
from xrun_contract.storage import LocalStorage, read_chunks

XRUN_MODULES = ("workload", "xrun_contract", "orchestrator", "manifests", "xrun-wrapper")


def shipped_text(storage: LocalStorage, name: str = "r", host: str = "0-0", attempt: int = 0) -> str:
    """The stored log without its stamps; every stored line must carry one."""
    stored = "".join(d.decode() for _, d in read_chunks(storage, Layout.host_logs(name, host, attempt)))
    lines = [split_stamp(ln) for ln in stored.splitlines(keepends=True)]
    assert all(t is not None for t, _ in lines)
    return "".join(text for _, text in lines)


def writer_for(storage: LocalStorage, name: str = "r"):
    def write(seq: int, data: bytes) -> None:
        storage.write_bytes(Layout.log_chunk(name, "0-0", 0, seq), data)
    return write


def test_maxtext_example_renders_admits_and_runs_no_xrun_module():
    """examples/maxtext-v6e.yaml: render runs admission (services.runs.render); the user's
    container is MaxText's image running MaxText through xrun's sh launcher only."""
    spec = spec_from_inputs(str(REPO / "examples/maxtext-v6e.yaml"), {"context": "gke_proj_zone_cluster"})
    assert spec.accelerator == "v6e-32" and spec.hosts_per_slice == 8
    manifest = render(spec)
    pod = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (user,) = pod["containers"]
    assert user["image"] == spec.image and "maxtext" in user["image"]
    shell, launcher, command = user["command"]
    assert (shell, launcher) == ("/bin/sh", "$(XRUN_POD_DIR)/bin/xrun-launch")
    assert command.startswith("python3 -m MaxText.train ")
    assert not any(m in command for m in XRUN_MODULES)
    assert "base_output_directory=$$XRUN_STORAGE/runs/$$XRUN_RUN_NAME/maxtext" in command
    # xrun's own containers run the public python image (no xrun_image: xrun's pod code comes
    # from storage, tests/test_public_images.py); the sidecar is a native one.
    assert [(c["name"], c["image"], c.get("restartPolicy")) for c in pod["initContainers"]] == [
        ("xrun-init", DEFAULT_XRUN_PYTHON_IMAGE, None), ("xrun-logs", DEFAULT_XRUN_PYTHON_IMAGE, "Always")]
    env = {e["name"]: e.get("value") for e in user["env"]}
    assert env["JAX_COORDINATOR_ADDRESS"] == "mt-1b-v6e-slice-0-0.mt-1b-v6e:8476"
    assert env["XRUN_NUM_PROCESSES"] == "8" and env["XRUN_POD_DIR"] == "/xrun"
    # The podFailurePolicy still reads the user's container.
    rule = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"][0]
    assert rule["onExitCodes"]["containerName"] == "workload"


def test_gpu_shape_gets_maxtexts_gpu_env():
    spec = spec_from_inputs(None, {"name": "g", "accelerator": "h100-80gb-8", "nodes": 2,
                                   "image": "maxtext-gpu", "storage": "gs://bkt/x", "context": "c"})
    pod = render(spec)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["JAX_COORDINATOR_IP"]["value"] == "g-slice-0-0.g"
    assert env["JAX_COORDINATOR_PORT"]["value"] == "8476" and env["NNODES"]["value"] == "2"
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']")


def test_launcher_turns_jax_fatal_abort_into_the_restartable_code(tmp_path):
    """absl QFATAL after a missed heartbeat exits 1 from native code; the launcher reads the
    fatal line and exits restartable, with the classifier's own words. A plain exit 1 stays 1."""
    fatal = ("F0926 17:26:32.075587  157988 client.h:77] " + NATIVE_FATAL_TEXT + ". This most "
             "likely indicates that another task died; absl::Status: UNAVAILABLE")
    for i, (text, want) in enumerate(((fatal, 42), ("Traceback ...\nValueError: bug", 1))):
        (tmp_path / str(i)).mkdir()
        script = f"import sys; print({text!r}, file=sys.stderr); sys.exit(1)"
        cmd = f"{sys.executable} -c \"{script}\""
        p, pod_dir = run_launcher(tmp_path / str(i), cmd, {"XRUN_RESTARTABLE_EXIT_CODE": "42"})
        assert p.wait(timeout=60) == want
        out = (pod_dir / "output.log").read_text()
        assert EXIT_CODE_RE.match(out.splitlines()[-1])["code"] == str(want)
        m = FAILURE_RE.search(out)
        assert bool(m) == (want == 42)
        if m:
            assert m["why"] == classify_output(out).why and m["code"] == "42"


def test_no_line_lost_when_the_user_process_or_the_pod_is_killed(tmp_path):
    """The user's process writes straight into the emptyDir file, so a SIGKILL (of the
    process, or of the whole pod's processes) loses no line it wrote; the shipper, stopped
    afterwards as the kubelet stops a sidecar, ships every one of them exactly once."""
    storage = LocalStorage(str(tmp_path / "store"))
    # 1. The user's process kills itself with SIGKILL after 5000 lines: exit code 137. (The
    # launcher exports PYTHONUNBUFFERED=1, so Python's print holds nothing back either.)
    script = ("import os,signal\nfor i in range(5000): print(f'line {i}')\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    (tmp_path / "k.py").write_text(script)
    (tmp_path / "a").mkdir()
    p, pod_dir = run_launcher(tmp_path / "a", f"{sys.executable} {tmp_path / 'k.py'}")
    assert p.wait(timeout=60) == 137
    stop = threading.Event()
    stop.set()  # SIGTERM to the sidecar: drain and exit
    run(pod_dir, writer_for(storage, "a"), 0.1, stop)
    text = shipped_text(storage, "a")
    assert [ln for ln in text.splitlines() if ln.startswith("line ")] == [f"line {i}" for i in range(5000)]
    assert WRAPPER_END_RE.search(text)["code"] == "137" and text.endswith("EXIT_CODE=137\n")

    # 2. The pod is SIGKILLed (grace period over) mid-run, while the shipper ships live.
    (tmp_path / "b").mkdir()
    slow = "import time\nfor i in range(100000):\n    print(f'line {i}', flush=True)\n    time.sleep(0.0005)\n"
    (tmp_path / "s.py").write_text(slow)
    p, pod_dir = run_launcher(tmp_path / "b", f"{sys.executable} {tmp_path / 's.py'}")
    stop = threading.Event()
    shipper = threading.Thread(target=run, args=(pod_dir, writer_for(storage, "b"), 0.05, stop))
    shipper.start()
    time.sleep(1.5)
    os.killpg(p.pid, signal.SIGKILL)
    assert p.wait(timeout=10) == -signal.SIGKILL
    written = (pod_dir / "output.log").read_text()
    stop.set()
    shipper.join(timeout=30)
    text = shipped_text(storage, "b")
    # Every byte, once, in order. print() writes a line and its newline separately, so the
    # kill can land between them: the final drain ends that last line (the shipper test's
    # "tail without newline" case).
    if not written.endswith("\n"):
        written += "\n"
    assert text == written and WRAPPER_START_RE.match(text)
    numbers = [int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("line ")]
    assert numbers == list(range(len(numbers))) and len(numbers) > 100


def test_shipper_resumes_after_a_storage_failure_and_a_restart(tmp_path):
    """A failed chunk write records nothing: the next try (or a restarted shipper, which
    reads shipped.json) rewrites it from the same offset; no line twice, none lost."""
    storage = LocalStorage(str(tmp_path / "store"))
    pod_dir = tmp_path / "pod"
    pod_dir.mkdir()
    out = pod_dir / "output.log"
    out.write_text("one\ntwo\npartial")
    calls = []

    def flaky(seq: int, data: bytes) -> None:
        calls.append(seq)
        if len(calls) == 2:
            raise ConnectionError("503")
        writer_for(storage)(seq, data)

    s = Shipper(pod_dir, flaky)
    assert s.ship_once(final=False) == len("one\ntwo\n")  # whole lines only while running
    with open(out, "a") as f:
        f.write(" line\nthree\n")
    with pytest.raises(ConnectionError):
        s.ship_once(final=False)
    restarted = Shipper(pod_dir, writer_for(storage))  # the kubelet restarted the sidecar
    assert (restarted.offset, restarted.seq) == (len("one\ntwo\n"), 1)
    with open(out, "a") as f:
        f.write("tail without newline")
    restarted.drain()
    assert shipped_text(storage) == "one\ntwo\npartial line\nthree\ntail without newline\n"
    assert json.loads((pod_dir / "shipped.json").read_text())["seq"] == 2


STOP_WHILE_THE_LOCK_IS_HELD = """
import os, signal, sys, threading, time
from workload.sidecar import stop_on_signals
stop = threading.Event()
if sys.argv[1] == "handler":
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
else:
    stop_on_signals(stop)
with stop._cond:  # held as stop.wait() holds it, between its checks
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.3)  # a Python handler runs here, between two bytecodes
print("stopped" if stop.wait(10) else "still waiting", flush=True)
"""


def test_a_stop_signal_while_the_main_thread_holds_the_events_lock():
    """The shipper's SIGTERM arrives at a random moment of its loop, which waits on an Event.
    A signal handler calling ``stop.set()`` while the main thread is inside ``stop.wait()``
    (the Condition's lock held) hangs for ever: the control run shows this Python does, and
    the shipper then never drains (CI: the wrapper's last lines lost, a 120 s hang until
    SIGKILL). ``stop_on_signals`` takes the signal in a thread of its own: it stops."""
    def run_child(mode: str, timeout: float):
        return subprocess.run([sys.executable, "-c", STOP_WHILE_THE_LOCK_IS_HELD, mode],
                              capture_output=True, text=True, timeout=timeout, cwd=REPO)

    with pytest.raises(subprocess.TimeoutExpired):
        run_child("handler", timeout=3)
    r = run_child("thread", timeout=60)
    assert (r.returncode, r.stdout) == (0, "stopped\n"), r.stderr


def test_sidecar_drains_to_the_exit_code_line_on_sigterm(tmp_path):
    """``python -m workload.sidecar ship`` as the pod runs it: SIGTERM (the workload container
    ended) drains the file to its last line, partial line included, and exits 0."""
    pod_dir = tmp_path / "pod"
    pod_dir.mkdir()
    out = pod_dir / "output.log"
    out.write_text("xrun-wrapper: start host=0-0\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "XRUN_POD_DIR": str(pod_dir),
           "XRUN_STORAGE": str(tmp_path / "store"), "XRUN_RUN_NAME": "r",
           "XRUN_LOG_FLUSH_SECONDS": "0.1"}
    p = subprocess.Popen([sys.executable, "-m", "workload.sidecar", "ship"], env=env,
                         stderr=subprocess.PIPE, text=True)
    storage = LocalStorage(str(tmp_path / "store"))
    deadline = time.monotonic() + 60
    while not list(read_chunks(storage, Layout.host_logs("r", "0-0", 0))):
        assert p.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    with open(out, "a") as f:
        f.write("xrun-wrapper: end host=0-0 exit_code=0\nEXIT_CODE=0")
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 0, p.stderr.read() if p.stderr else ""
    assert shipped_text(storage).splitlines()[-2:] == [
        "xrun-wrapper: end host=0-0 exit_code=0", "EXIT_CODE=0"]


def test_foreign_jax_program_on_the_local_backend(tmp_path):
    """A JAX program with no xrun import (tests/foreign/psum.py) runs on 2 local hosts from
    the contract env alone; its logs, status and exit code read back with the CLI."""
    store = tmp_path / "store"
    script = REPO / "tests" / "foreign" / "psum.py"
    r = xrun("submit", "--name", "foreign", "--accelerator", "cpu-2", "--image", "python:3.12",
             "--command", f"python3 {script}", "--env", "PSUM_EXIT=3", "--max-restarts", "0",
             "--follow", storage=store, timeout=240)
    assert r.returncode == 1, r.stderr  # the run failed: the program's exit code 3
    logs = xrun("logs", "foreign", storage=store).stdout
    for host, pid in (("0-0", 0), ("0-1", 1)):
        assert f"[{host}] psum: process {pid} of 2 total 3 xrun modules []" in logs
        assert f"[{host}] EXIT_CODE=3" in logs
        start = next(ln for ln in logs.splitlines() if ln.startswith(f"[{host}] xrun-wrapper: start"))
        argv = json.loads(start.split("argv=", 1)[1])
        assert argv == ["/bin/sh", "-c", f"python3 {script}"]
    status = json.loads(xrun("status", "foreign", "-o", "json", storage=store).stdout)
    assert status["state"] == "Failed" and "exited with code 3" in status["message"]
    assert "podFailurePolicy FailJob" in status["message"]
    manifest = yaml.safe_load((store / "runs/foreign/manifest.yaml").read_text())
    pod = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["xrun-init", "xrun-logs"]
    # Nothing of the pods outlives the run: no temporary pod folders left behind.
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("foreign-slice-0-*"))
