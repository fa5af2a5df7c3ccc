"""Faults, round 3 (#32 items 1-6): no process outlives its pod, a stale attempt never
writes run.json, the local supervisor survives what the run survives (a GCS outage, a full
disk), status after a killed supervisor, and permanent storage errors end in seconds.

Everything runs for real: the local backend's supervisor and its pods (xrun's launcher,
init container and log shipper), fake-gcs-server behind tests/gcs_proxy.py, a tmpfs.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from cli_helpers import xrun, xrun_popen

from manifests.spec import build_spec
from orchestrator.backends.local.backend import LocalBackend, run_processes, stop_processes
from orchestrator.services.runs import dump_yaml, render
from workload.metrics import update_run_json
from xrun_contract import Env, Layout, PodFiles, records
from xrun_contract.errors import XrunError
from xrun_contract.storage import (
    LocalStorage,
    StorageError,
    classify_storage_error,
    open_storage,
)

REPO = Path(__file__).resolve().parent.parent


def _wait(pred, timeout: float, what: str, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, what
        time.sleep(every)


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return "(gone)"


_STARTED: list[tuple[str, str]] = []
_SHIPPERS: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _stop_what_a_test_started():
    """Every run a test started is gone after it, also when it failed (by the OS's view)."""
    yield
    while _SHIPPERS:  # a log shipper that never ended (the drain retried for ever)
        proc = _SHIPPERS.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    while _STARTED:
        root, name = _STARTED.pop()
        pids = run_processes(root, name)
        if pids:
            stop_processes(pids, 2.0)


def _submit(root: str | Path, name: str, command: str, **spec) -> dict:
    """The local backend's real path: render, store the manifest, start the supervisor."""
    _STARTED.append((str(root), name))
    values = {"name": name, "accelerator": "cpu-2", "image": "img", "command": command,
              "storage": str(root), **spec}
    manifest = render(build_spec(values, {}))
    st = open_storage(str(root))
    st.write_text(Layout.manifest(name), dump_yaml(manifest))
    st.write_json(Layout.run_json(name), {"name": name, "backend": "local"})
    LocalBackend(str(root)).submit(manifest)
    return manifest


def _state(root: str | Path, name: str) -> dict:
    """state.json, or {} while storage does not answer (a test's own outage)."""
    try:
        return open_storage(str(root), timeout=5 if str(root).startswith("gs://") else None
                            ).read_json(Layout.state(name)) or {}
    except XrunError:  # storage's exit-3 error (StorageError)
        return {}


# ---------------------------------------------------------------------------------------
# 1. A kill -9 during a save: no orphan, no stale run.json write

# One host of attempt 0 is killed with -9 while its peer is "inside a checkpoint save": the
# peer catches SIGTERM (as JAX's preemption notifier does), keeps saving past the grace
# period and then writes run.json as attempt 0. It runs under `sh -c` (the launcher's), not as
# its last command (which dash execs), so the shell stays and dies of the SIGTERM. Before the
# fix the launcher then exited 143 (1 s later: it lets tail print the last lines), no SIGKILL
# came, and the peer outlived its pod and overwrote attempt 1's run.json. The grace period
# (2 s) must outlast that second, or the launcher itself meets the SIGKILL of its group.
SAVER = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from workload.metrics import update_run_json
    from xrun_contract.storage import open_storage

    attempt, me = int(os.environ["XRUN_RESTART_ATTEMPT"]), int(os.environ["XRUN_PROCESS_ID"])
    run, st = os.environ["XRUN_RUN_NAME"], open_storage(os.environ["XRUN_STORAGE"])
    if attempt == 0:
        signal.signal(signal.SIGTERM, lambda *a: print("SIGTERM caught", flush=True))
        pidfile = Path(os.environ["XRUN_STORAGE"], "saver.pid")
        if me == 0:  # killed once its peer is inside the save (however loaded the machine)
            end = time.time() + 30
            while not pidfile.exists() and time.time() < end:
                time.sleep(0.02)
            os.kill(os.getpid(), signal.SIGKILL)
        pidfile.write_text(str(os.getpid()))
        print("saving", flush=True)
        end = time.time() + SAVE_S
        while time.time() < end:
            time.sleep(0.05)
        update_run_json(st, run, attempt=0, exit_code=42)
        Path(os.environ["XRUN_STORAGE"], "saver.done").write_text("outlived its pod")
        sys.exit(42)
    update_run_json(st, run, attempt=attempt, exit_code=0)
""")
SAVE_S = 8.0  # well past the failure judgement (1 s) and the grace period (2 s), under load


def test_kill_9_during_a_save_leaves_no_orphan_and_no_stale_run_json_20_times(tmp_path):
    prog = tmp_path / "saver.py"
    prog.write_text(f"SAVE_S = {SAVE_S}\n" + SAVER)
    runs = 20
    batch = 10  # 10 runs at a time: 20 in a loop, in two rounds
    roots = [tmp_path / f"root{i}" for i in range(runs)]
    found: list[str] = []
    for first in range(0, runs, batch):
        group = list(range(first, min(runs, first + batch)))
        for i in group:
            # Not the shell's last command: dash would exec it, and no shell would be there.
            _submit(roots[i], "save", f'python3 {prog}; code=$?; echo "saver exited $code"; exit $code', max_restarts=1,
                    termination_grace_seconds=2)
        for i in group:
            _wait(lambda i=i: _state(roots[i], "save").get("state") in ("Succeeded", "Failed"), 60,
                  f"run {i} did not end")
        for i in group:
            st = _state(roots[i], "save")
            assert (st["state"], st["restarts"]) == ("Succeeded", 1), (i, st.get("message"))
            saver = int((roots[i] / "saver.pid").read_text())
            # Ended with its pod, before attempt 1 started: dead by the end state.
            if _pid_alive(saver):
                found.append(f"run {i}: attempt-0 process {saver} alive after Succeeded")
        for i in group:  # and nothing of the run lives once its supervisor has gone
            with contextlib.suppress(AssertionError):
                _wait(lambda i=i: not run_processes(str(roots[i]), "save"), 10, "")
            for pid in run_processes(str(roots[i]), "save"):
                found.append(f"run {i}: process {pid} alive 10 s after the end: {_cmdline(pid)}")
    # An orphan (a saver seen alive above, already a finding) would finish its "save" and
    # write within SAVE_S: give it that time, so that what it wrote is reported too. A saver
    # seen dead writes nothing more: with none alive there is nothing to wait for.
    if any(_pid_alive(int((r / "saver.pid").read_text())) for r in roots):
        time.sleep(SAVE_S)
    for i in range(runs):
        workload = json.loads((roots[i] / Layout.run_json("save")).read_text())["workload"]
        if workload != {"attempt": 1, "exit_code": 0}:
            found.append(f"run {i}: run.json workload {workload}")
        if (roots[i] / "saver.done").exists():  # its pod's SIGKILL would have stopped it
            found.append(f"run {i}: the attempt-0 saver finished its save: it outlived its pod")
        log = (roots[i] / Layout.supervisor_log("save")).read_text()
        assert "Traceback" not in log, log
    assert not found, "\n".join(found)


def test_run_json_writes_are_fenced_by_the_attempt(tmp_path, gcs_bucket):
    """An older attempt's write is refused, atomically (racing writers: no lost update)."""
    for root in (str(tmp_path / "local"), f"{gcs_bucket}/root"):
        st = open_storage(root)
        st.write_json(Layout.run_json("f"), {"name": "f", "backend": "local"})
        assert update_run_json(st, "f", attempt=0, start_time=1.0)
        assert update_run_json(st, "f", attempt=1, start_time=2.0)
        assert not update_run_json(st, "f", attempt=0, exit_code=42)  # refused
        doc = st.read_json(Layout.run_json("f"))
        assert doc == {"name": "f", "backend": "local",
                       "workload": {"attempt": 1, "start_time": 2.0}}, root
        # Racing read-modify-writes of one attempt lose nothing.
        threads = [threading.Thread(target=update_run_json, args=(st, "f"),
                                    kwargs={"attempt": 1, f"k{i}": i}) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        section = st.read_json(Layout.run_json("f"))["workload"]
        assert {f"k{i}" for i in range(6)} <= set(section), (root, section)


def test_a_pods_leftover_process_dies_with_its_container(tmp_path):
    """A container is its process group: a background process its command left behind
    ends with the container (the kubelet kills a container's processes with its PID 1)."""
    root = tmp_path / "root"
    _submit(root, "bg", f"sleep 300 & echo $! > {tmp_path}/bg-$XRUN_PROCESS_ID.pid; exit 0",
            max_restarts=0, termination_grace_seconds=1)
    _wait(lambda: _state(root, "bg").get("state") in ("Succeeded", "Failed"), 30, "run did not end")
    assert _state(root, "bg")["state"] == "Succeeded"
    pids = [int((tmp_path / f"bg-{i}.pid").read_text()) for i in (0, 1)]
    _wait(lambda: not any(_pid_alive(p) for p in pids), 5, f"left behind: {pids}")


# ---------------------------------------------------------------------------------------
# 2. The supervisor survives a storage outage (its own writes are kept and retried)


@pytest.fixture
def proxied_root(gcs_proxy, gcs_bucket, monkeypatch):
    """A gs:// root reached through the fault proxy (this process and what it starts)."""
    for k, v in gcs_proxy.env().items():
        monkeypatch.setenv(k, v)
    return f"{gcs_bucket}/root"


def test_supervisor_survives_an_outage_longer_than_its_storage_timeout(proxied_root, gcs_proxy,
                                                                       monkeypatch):
    """Before: the supervisor's state.json write failed after the storage timeout and the
    run Failed with 'local supervisor error'. Now the write is kept and done after the
    outage, and the run ends as its pods say (both exit 0 during the outage)."""
    monkeypatch.setenv("XRUN_STORAGE_TIMEOUT", "2")  # the supervisor's per-call deadline
    _submit(proxied_root, "outage", "sleep 3", max_restarts=0, termination_grace_seconds=2)
    _wait(lambda: _state(proxied_root, "outage").get("state") == "Running", 30, "never Running")
    gcs_proxy.outage(5, "503")  # over twice the storage timeout; the pods end inside it
    time.sleep(5.5)
    _wait(lambda: _state(proxied_root, "outage").get("state") in ("Succeeded", "Failed"), 60,
          "the end state was never written")
    st = _state(proxied_root, "outage")
    assert (st["state"], st["restarts"]) == ("Succeeded", 0), st["message"]
    assert gcs_proxy.stats.outage_hits > 0


# ---------------------------------------------------------------------------------------
# 4. A full disk: the run ends Failed "storage full", status tells the truth, no tracebacks


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    return r.returncode == 0


def _fill(path: Path) -> Path:
    """Write until ENOSPC, down to the last byte; the file that fills the disk."""
    big = path / "filler"
    fd = os.open(big, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for size in (1 << 16, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return big


def test_full_disk_ends_the_run_failed_with_storage_full(tmp_path):
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "4m"):
        pytest.skip("cannot mount a tmpfs here (not root?)")
    try:
        _STARTED.append((str(disk), "full"))
        go = tmp_path / "go"  # off the full disk: the pods exit 42 only once it is full
        follow = xrun_popen("submit", "--name", "full", "--accelerator", "cpu-2", "--image", "img",
                            "--command", f"while [ ! -e {go} ]; do sleep 0.1; done; exit 42",
                            "--max-restarts", "3", "--termination-grace-seconds", "1", "--follow",
                            storage=disk)
        _wait(lambda: _state(disk, "full").get("state") == "Running", 60, "never Running")
        _fill(disk)
        go.touch()
        # The pods exit 42: the restart's state.json write finds the disk full.
        out, err = follow.communicate(timeout=120)
        assert "Traceback" not in out + err, err[-3000:]
        assert follow.returncode == 1, (follow.returncode, err[-2000:])
        assert "storage full" in err, err[-2000:]
        st = _state(disk, "full")
        assert st["state"] == "Failed", st
        assert "storage full" in st["message"], st["message"]
        # The pods' exit is saved by the write thread while the main loop judges it: the
        # restart may be decided (and counted) before the full disk is known, or not.
        assert st["restarts"] in (0, 1), st
        for args in (("status", "full"), ("status", "full", "-o", "json"), ("list",),
                     ("logs", "full")):
            r = xrun(*args, storage=disk, timeout=60)
            assert "Traceback" not in r.stdout + r.stderr, (args, r.stdout, r.stderr)
            assert r.returncode in (0, 1), (args, r.returncode, r.stderr)
        status = json.loads(xrun("status", "full", "-o", "json", storage=disk).stdout)
        assert status["state"] == "Failed" and "storage full" in status["message"]
        _wait(lambda: not run_processes(str(disk), "full"), 30, "processes outlived the run")
        leftovers = [p.name for p in disk.rglob(".*.tmp-*")]
        assert not leftovers, leftovers
    finally:
        for pid in run_processes(str(disk), "full"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_local_storage_full_disk_is_permanent_and_leaves_no_tmp(tmp_path):
    """ENOSPC and ENOTDIR from LocalStorage: a StorageError sorted permanent, no .tmp left."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "1m"):
        pytest.skip("cannot mount a tmpfs here (not root?)")
    try:
        st = LocalStorage(str(disk))
        st.write_json("runs/x/state.json", {"state": "Running", "hosts": {"0-0": {"state": "Running"}}})
        _fill(disk)
        with pytest.raises(StorageError) as e:
            st.write_json("runs/x/state.json", {"state": "Failed", "message": "x" * 9000})
        assert e.value.permanent and "storage full" in str(e.value) and e.value.exit_code == 3
        assert not list(disk.rglob(".*.tmp-*"))
        # The last resort of the supervisor's final write: the file's own blocks.
        assert st.overwrite_in_place("runs/x/state.json", b'{"state": "Failed"}\n')
        assert st.read_json("runs/x/state.json") == {"state": "Failed"}
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError) as e:
        LocalStorage(str(tmp_path / "file" / "root")).write_text("a/b", "x")
    assert e.value.permanent and "ENOTDIR" in str(e.value)


# ---------------------------------------------------------------------------------------
# 5. After kill -9 of the supervisor: no host shown Running, delete says what it found


def test_status_and_delete_after_kill_9_of_the_supervisor(tmp_path):
    root = tmp_path / "root"
    _submit(root, "lost", "sleep 300", max_restarts=0, termination_grace_seconds=1)
    _wait(lambda: len([h for h in _state(root, "lost").get("hosts", {}).values() if h.get("pid")]) == 2,
          30, "pods never started")
    # What the workload had recorded: 22 of 40 steps (written as process 0's chunks are).
    t = time.time()
    chunks = {0: [records.Header(time=t, total_steps=40)],
              1: [records.Step(time=t + i, step=i, seconds=0.1, loss=5.0 - i / 10) for i in range(1, 23)]}
    (root / Layout.metrics("lost")).mkdir(parents=True, exist_ok=True)
    for seq, recs in chunks.items():
        (root / Layout.metrics_chunk("lost", 0, seq, "0a1b2c3d")).write_text(
            "".join(records.to_json(r) + "\n" for r in recs))
    os.kill(_state(root, "lost")["supervisor_pid"], signal.SIGKILL)
    # The pod runners get SIGTERM at once (PR_SET_PDEATHSIG) and end their containers within
    # the grace and the log drain; 15 s was missed by 0.07 s once in a fresh-clone run.
    _wait(lambda: not run_processes(str(root), "lost"), 30, "pods outlived the supervisor")
    # list first (status records what it finds): Failed, not state.json's Running; 22/40.
    (listed,) = json.loads(xrun("list", "-o", "json", storage=root).stdout)
    assert (listed["state"], listed["step"], listed["total_steps"]) == ("Failed", 22, 40), listed
    assert _state(root, "lost")["state"] == "Running"  # list only reads
    status = json.loads(xrun("status", "lost", "-o", "json", storage=root).stdout)
    assert (status["step"], status["total_steps"]) == (22, 40), status
    assert status["state"] == "Failed" and "supervisor is gone" in status["message"]
    hosts = status["hosts"]
    assert len(hosts) == 2
    for h in hosts:
        assert h["state"] == "Unknown", h
        assert "supervisor is gone" in h["reason"] and "is gone" in h["reason"], h
    table = xrun("status", "lost", storage=root).stdout
    rows = [line.split() for line in table.splitlines() if line.strip().startswith("0-")]
    assert [r[1] for r in rows] == ["Unknown", "Unknown"], table
    # The pods' emptyDir folders: nobody removed them (the supervisor does as each pod ends).
    folders = [Path(h["folder"]) for h in _state(root, "lost")["hosts"].values()]
    assert len(folders) == 2 and all(f.is_dir() for f in folders), folders
    r = xrun("delete", "lost", storage=root)
    assert r.returncode == 0
    assert "no live process" in r.stderr and "supervisor" in r.stderr, r.stderr
    assert "removed the 2 pod folders it left" in r.stderr, r.stderr
    assert not any(f.exists() for f in folders), folders
    assert _state(root, "lost")["state"] == "Failed"  # recorded now, as status reported it


# ---------------------------------------------------------------------------------------
# 6. The log shipper's final drain: permanent errors end at once, transient ones by a deadline


def test_storage_errors_are_sorted_in_one_place():
    import socket

    from google.api_core import exceptions as gexc

    perm = [OSError(errno.ENOSPC, "No space left on device"), NotADirectoryError(errno.ENOTDIR, "x"),
            PermissionError(errno.EACCES, "x"), gexc.Forbidden("no"), gexc.NotFound("bucket"),
            ConnectionRefusedError(errno.ECONNREFUSED, "refused"), socket.gaierror(-2, "Name or service not known")]
    trans = [gexc.ServiceUnavailable("503"), gexc.TooManyRequests("429"), gexc.InternalServerError("500"),
             ConnectionResetError(errno.ECONNRESET, "reset"), TimeoutError("timed out"),
             ValueError("ABORTED: All 32 retry attempts failed [http_response_code='503']")]
    assert [classify_storage_error(e).permanent for e in perm] == [True] * len(perm)
    assert [classify_storage_error(e).permanent for e in trans] == [False] * len(trans)
    assert "storage full" in classify_storage_error(perm[0]).why


def _shipper(pod_dir: Path, storage: str, drain_s: int, **env: str) -> subprocess.Popen:
    pod_dir.mkdir(parents=True, exist_ok=True)
    (pod_dir / PodFiles.OUTPUT).write_text("a line\nthe last line, unfinished")
    full = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    full.update({Env.STORAGE: storage, Env.RUN_NAME: "ship", Env.POD_DIR: str(pod_dir),
                 Env.LOG_FLUSH_SECONDS: "0.2", Env.DRAIN_SECONDS: str(drain_s),
                 "PYTHONPATH": str(REPO)}, **env)
    proc = subprocess.Popen([sys.executable, "-m", "workload.sidecar", "ship"], env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _SHIPPERS.append(proc)
    return proc


def _started(pod_dir: Path, proc: subprocess.Popen) -> None:
    """Until the shipper takes SIGTERM (its ready file), as the launcher waits for it: a
    fixed 0.5 s was too short under load, and SIGTERM's default action ended it (-15)."""
    deadline = time.monotonic() + 60
    while not (pod_dir / PodFiles.SHIPPER_READY).exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.returncode
        time.sleep(0.02)


@pytest.mark.parametrize("damage", ["enotdir", "forbidden", "no-bucket"])
def test_log_shipper_final_drain_ends_at_once_on_a_permanent_error(tmp_path, damage, gcs_proxy,
                                                                    gcs_bucket):
    if damage == "enotdir":
        (tmp_path / "file").write_text("x")
        storage, env = str(tmp_path / "file" / "root"), {}
    elif damage == "forbidden":
        gcs_proxy.fail(403, 10_000, method="POST")
        storage, env = f"{gcs_bucket}/root", gcs_proxy.env()
    else:
        storage, env = "gs://no-such-bucket-xrun/root", gcs_proxy.env()
    proc = _shipper(tmp_path / "pod", storage, drain_s=60, **env)
    _started(tmp_path / "pod", proc)
    time.sleep(0.5)  # a chunk or two tried while running
    t = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    took = time.monotonic() - t
    assert proc.returncode == 0
    assert took < 10, (took, out)  # not the 60 s deadline, not for ever
    assert "final shipping failed, not retried (permanent" in out, out
    assert "Traceback" not in out


def test_log_shipper_final_drain_gives_up_on_a_transient_error_at_its_deadline(tmp_path, gcs_proxy,
                                                                               gcs_bucket):
    proc = _shipper(tmp_path / "pod", f"{gcs_bucket}/root", drain_s=2, **gcs_proxy.env())
    _started(tmp_path / "pod", proc)
    gcs_proxy.outage(120, "503")
    t = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=90)
    took = time.monotonic() - t
    # Its deadline, not at once, and not the outage's 120 s. The deadline bounds when the last
    # try starts: that try (a call's timeout, drain_s) and a running-phase call in flight at
    # SIGTERM come on top, ~6 s here; 12.6 and 18.6 s were measured at a load of 22-29.
    assert proc.returncode == 0 and 1.5 < took < 45, (took, out)
    assert "giving up" in out, out


# ---------------------------------------------------------------------------------------
# 2 and 3, the whole run: a 90 s GCS outage during training and saves


def _records(root: str | Path, name: str) -> list[dict]:
    st = open_storage(str(root))
    objects, _ = st.list(Layout.metrics(name))
    return [json.loads(line) for o in objects for line in (st.read_text(o.key) or "").splitlines() if line]


def _final_loss(records: list[dict]) -> tuple[int, float]:
    steps = {r["step"]: r["loss"] for r in records if r["kind"] == "step"}
    last = max(steps)
    return last, steps[last]


# The give-up the outage must outlast: every storage call's deadline, the supervisor's and
# the pods' (--storage-timeout, env XRUN_STORAGE_TIMEOUT, README "Storage calls"), 30 s by
# default. Set to 3 s here, the outage lasts over three of them: the same race in seconds.
GIVE_UP_S = 3.0
OUTAGE_S = 10.0


def test_an_outage_past_the_storage_timeout_is_survived_with_the_identical_final_loss(
        proxied_root, gcs_proxy, tmp_path, monkeypatch):
    """Issue #32 item 2: an outage (every request 503) from just before a save comes due,
    past the storage timeout after which the supervisor's state.json write used to give up
    (the run Failed with no restart). Now the run Succeeds and ends on the very loss of the
    same run with no outage; the saves that came due while storage was out were deferred,
    not waited on. (Once 90 s, then 35 s past the default 30 s timeout; the timeout is a
    knob, so 10 s past a 3 s one: outlasting it is the point.)"""
    name = "outage"
    command = "python3 -m workload.train --preset tiny steps=40 checkpoint_every=15"
    # The reference, on a local root with no faults, first: once it took a step its hosts
    # have compiled the program into the session's compilation cache (tests/conftest.py), and
    # the run's hosts (the same command and mesh) load it. Started together, both compiled it
    # at once, cold: four compiling hosts on two cores. The cache changes no value computed.
    ref = tmp_path / "ref"
    _submit(ref, name, command, max_restarts=0, termination_grace_seconds=15)
    _wait(lambda: _state(ref, name).get("state") in ("Succeeded", "Failed")
          or any(r["kind"] == "step" for r in _records(ref, name)), 300, "the reference never took a step")
    monkeypatch.setenv("XRUN_STORAGE_TIMEOUT", f"{GIVE_UP_S:g}")  # the supervisor's (LocalBackend.submit)
    _submit(proxied_root, name, command, max_restarts=2, termination_grace_seconds=15,
            env={Env.TEST_STEP_DELAY: "0.4",  # ~16 s of steps: the outage meets training
                 "XRUN_STORAGE_TIMEOUT": f"{GIVE_UP_S:g}"})  # and the pods'
    # From before the first save (step 15) comes due: it meets the outage. Step 1's record is
    # written when step 3 has been dispatched (workload.train.STEPS_AHEAD) and reaches storage
    # up to the metrics writer's 2 s later: the outage began at step 6-9, so a save at step 10
    # could start before it (one fresh-clone run: no save deferred, the write failed instead).
    _wait(lambda: any(r["kind"] == "step" and r["step"] >= 1 for r in _records(proxied_root, name)),
          240, "the run never reached step 3")
    gcs_proxy.outage(OUTAGE_S, "503")
    outage_end = time.time() + OUTAGE_S
    _wait(lambda: _state(ref, name).get("state") in ("Succeeded", "Failed"), 300, "reference never ended")
    assert _state(ref, name)["state"] == "Succeeded", _state(ref, name)["message"]
    _wait(lambda: _state(proxied_root, name).get("state") in ("Succeeded", "Failed"), 300,
          "the run never ended after the outage")
    assert time.time() > outage_end
    st = _state(proxied_root, name)
    assert st["state"] == "Succeeded", st["message"]
    records = _records(proxied_root, name)
    assert _final_loss(records) == _final_loss(_records(ref, name))
    assert _final_loss(records)[0] == 40
    assert gcs_proxy.stats.outage_hits > 0
    # Saves that came due while storage was out were deferred, and goodput says so.
    deferred = [r for r in records if r["kind"] == "checkpoint" and r["event"] == "deferred"
                and "storage" in (r.get("error") or "")]
    assert deferred, [r for r in records if r["kind"] == "checkpoint"]
    view = json.loads(xrun("status", name, "-o", "json", storage=proxied_root).stdout)
    assert view["goodput"]["deferred_storage_saves"] >= 1, view["goodput"]
    table = " ".join(xrun("status", name, storage=proxied_root).stdout.split())
    assert "while storage was unavailable" in table, table
