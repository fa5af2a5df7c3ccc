"""Faults: a killed supervisor orphans nothing, racing submits start one run, names never
leave the storage root, failing GCS ends in a bounded exit 3, a typo'd program does not
crash-loop, chunk names are never reused."""

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
from cli_helpers import pid_alive, xrun

from orchestrator.backends.local.backend import LocalBackend, run_processes
from orchestrator.cli import main
from xrun_contract import COMMAND_NOT_FOUND_EXIT_CODE, Env, Layout, check_run_name
from xrun_contract.errors import XrunError
from xrun_contract.storage import LocalStorage, open_storage

SLEEPER = ["--accelerator", "cpu-2", "--image", "img", "--command", "sleep 300"]


def _wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _state(store: Path, name: str) -> dict:
    return json.loads((store / Layout.state(name)).read_text())


# ---------------------------------------------------------------------------------------
# The supervisor is not a single point of loss


def test_kill_9_supervisor_leaves_no_orphan_and_replace_then_works(tmp_path):
    store = tmp_path / "store"
    r = xrun("submit", "--name", "orph", *SLEEPER, "--detach", storage=store, timeout=60)
    assert r.returncode == 0, r.stderr
    _wait(lambda: all(h.get("pid") for h in _state(store, "orph").get("hosts", {}).values())
          and len(_state(store, "orph")["hosts"]) == 2, 30, "pods started")
    procs = run_processes(str(store), "orph")
    sup = _state(store, "orph")["supervisor_pid"]
    assert sup in procs and len(procs) >= 3  # supervisor + 2 wrappers (+ their shells/sleeps)
    # The supervisor's own log is with the run, not under $HOME.
    assert (store / Layout.supervisor_log("orph")).exists()
    assert not (tmp_path / "state").exists()

    os.kill(sup, signal.SIGKILL)
    _wait(lambda: not run_processes(str(store), "orph"), 15, "pods outlived the supervisor")
    assert not any(pid_alive(p) for p in procs)

    # storage still says Running; status knows better, and --replace may go ahead.
    r = xrun("status", "orph", "-o", "json", storage=store, timeout=60)
    assert json.loads(r.stdout)["state"] == "Failed"
    folders = [Path(h["folder"]) for h in _state(store, "orph")["hosts"].values()]
    assert len(folders) == 2 and all(f.is_dir() for f in folders)  # left by the lost supervisor
    r = xrun("submit", "--name", "orph", *SLEEPER, "--detach", "--replace", storage=store, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not any(f.exists() for f in folders), folders  # removed with the old run
    r = xrun("delete", "orph", storage=store, timeout=60)
    assert r.returncode == 0 and "stopped orph" in r.stderr
    assert not run_processes(str(store), "orph")


class _SupervisorFinishesAfterTheRead(LocalStorage):
    """The interleaving the follow loop can meet: status reads a Running state.json, then the
    supervisor records Succeeded and exits before status checks whether it lives."""

    def __init__(self, root: str, name: str, supervisor: subprocess.Popen):
        super().__init__(root)
        self.name, self.supervisor, self.reads = name, supervisor, 0

    def read_json(self, key: str):
        data = super().read_json(key)
        if key == Layout.state(self.name):
            self.reads += 1
            if self.reads == 1:
                self.write_json(key, {**data, "state": "Succeeded", "message": "all hosts exited 0"})
                self.supervisor.wait()
        return data


def test_status_of_a_supervisor_that_finished_between_read_and_liveness_check(tmp_path):
    """A supervisor that exits after recording its terminal state is not 'gone': status
    reads state.json again once it finds the pid dead (CI saw a finished run called Failed)."""
    store = tmp_path / "store"
    sup = subprocess.Popen(["sleep", "0.2"])
    LocalStorage(str(store)).write_json(Layout.state("race"), {
        "backend": "local", "state": "Running", "supervisor_pid": sup.pid, "hosts": {}})
    backend = LocalBackend(str(store))
    backend.storage = _SupervisorFinishesAfterTheRead(str(store), "race", sup)
    st = backend.status("race")
    assert backend.storage.reads == 2
    assert (st.state, st.message) == ("Succeeded", "all hosts exited 0")
    # A supervisor that died without recording anything is still reported lost.
    LocalStorage(str(store)).write_json(Layout.state("lost"), {
        "backend": "local", "state": "Running", "supervisor_pid": sup.pid, "hosts": {}})
    st = LocalBackend(str(store)).status("lost")
    assert st.state == "Failed" and "supervisor is gone" in st.message


def test_delete_and_replace_find_orphans_from_the_os(tmp_path):
    """A pod process state.json does not name (a supervisor died before recording it):
    ``--replace`` refuses while it lives and ``delete`` finds and stops it."""
    store = tmp_path / "store"
    st = LocalStorage(str(store))
    st.write_json(Layout.run_json("ghost"), {"name": "ghost", "backend": "local"})
    st.write_json(Layout.state("ghost"), {"backend": "local", "state": "Running",
                                          "supervisor_pid": 2 ** 22 + 7, "hosts": {}})
    env = {**os.environ, Env.RUN_NAME: "ghost", Env.STORAGE: str(store)}
    orphan = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    other = subprocess.Popen(["sleep", "300"], env={**env, Env.RUN_NAME: "ghost2"},
                             start_new_session=True)
    try:
        _wait(lambda: orphan.pid in run_processes(str(store), "ghost"), 5, "orphan not found")
        assert other.pid not in run_processes(str(store), "ghost")
        r = xrun("submit", "--name", "ghost", *SLEEPER, "--replace", "--detach", storage=store)
        assert r.returncode == 2 and "live process" in r.stderr and str(orphan.pid) in r.stderr
        assert st.read_json(Layout.run_json("ghost")) == {"name": "ghost", "backend": "local"}
        r = xrun("delete", "ghost", storage=store)
        assert r.returncode == 0 and "stopped ghost" in r.stderr, r.stderr
        assert orphan.wait(timeout=10) == -signal.SIGTERM
        assert other.poll() is None
        assert _state(store, "ghost")["state"] == "Deleted"
        # --replace --force stops such orphans itself, then starts the new run.
        orphan2 = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
        _wait(lambda: orphan2.pid in run_processes(str(store), "ghost"), 5, "orphan not found")
        r = xrun("submit", "--name", "ghost", *SLEEPER, "--replace", "--force", "--detach",
                 storage=store)
        assert r.returncode == 0, r.stderr
        assert orphan2.wait(timeout=10) == -signal.SIGTERM
        assert xrun("delete", "ghost", storage=store).returncode == 0
        assert not run_processes(str(store), "ghost")
    finally:
        for p in (orphan, other):
            p.kill()
            p.wait()


def test_missing_program_fails_for_good_without_restarts(tmp_path):
    store = tmp_path / "store"
    r = xrun("submit", "--name", "typo", "--accelerator", "cpu-2", "--image", "i",
             "--command", "no-such-program-xrun --flag", "--max-restarts", "3",
             storage=store, timeout=120)
    assert r.returncode == 1, r.stderr
    state = _state(store, "typo")
    assert state["state"] == "Failed" and state["restarts"] == 0
    assert f"code {COMMAND_NOT_FOUND_EXIT_CODE}" in state["message"]
    # The first host to fail decides; a slower one may have been stopped (143) meanwhile.
    assert COMMAND_NOT_FOUND_EXIT_CODE in {h["exit_code"] for h in state["hosts"].values()}


def test_launcher_not_found_codes(tmp_path):
    from test_manifests import run_launcher

    for i, command in enumerate(("no-such-program-xrun", "/no/such/program --flag")):
        (tmp_path / str(i)).mkdir()
        p, pod_dir = run_launcher(tmp_path / str(i), command)
        assert p.wait(timeout=30) == COMMAND_NOT_FOUND_EXIT_CODE
        out = (pod_dir / "output.log").read_text()
        assert out.endswith(f"EXIT_CODE={COMMAND_NOT_FOUND_EXIT_CODE}\n"), out


# ---------------------------------------------------------------------------------------
# Exclusive submit


def _cmdline(pid: int) -> bytes:
    """A process's argv, or b"" when it ended since it was listed."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _ppid(pid: int) -> int | None:
    """A process's parent (proc(5): the field after the parenthesised command), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])


def _race(storage, key: str, n: int = 8) -> list[bool]:
    barrier, results = threading.Barrier(n), []

    def one(i: int) -> None:
        barrier.wait()
        results.append(storage.create_exclusive(key, f"claim {i}".encode()))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_create_exclusive_local_race(tmp_path):
    st = LocalStorage(str(tmp_path))
    assert sorted(_race(st, "runs/a/run.json")) == [False] * 7 + [True]


def test_create_exclusive_gcs_race(gcs_bucket):
    """ifGenerationMatch=0 on the emulator: one create wins, the others get 412."""
    st = open_storage(f"{gcs_bucket}/root")
    assert sorted(_race(st, "runs/a/run.json", 4)) == [False] * 3 + [True]
    assert st.read_text("runs/a/run.json").startswith("claim ")


def test_racing_submits_start_one_run(tmp_path):
    store = tmp_path / "store"
    args = [sys.executable, "-m", "orchestrator.cli", "submit", "--name", "race", *SLEEPER,
            "--detach", "--storage", str(store)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for _ in range(3)]
    outs = [(p.wait(timeout=90), p.stderr.read()) for p in procs]
    try:
        codes = sorted(c for c, _ in outs)
        assert codes == [0, 2, 2], outs
        assert all("race" in e for c, e in outs if c == 2)
        sups = [p for p in run_processes(str(store), "race") if b"supervise" in _cmdline(p)]
        # A pod process the supervisor has forked but not yet exec'd still carries the
        # supervisor's argv (seen once on a slow machine): a supervisor's own child is not a
        # second supervisor.
        sups = [p for p in sups if _ppid(p) not in sups]
        assert len(sups) == 1, sups
    finally:
        assert xrun("delete", "race", storage=store).returncode == 0
    assert not run_processes(str(store), "race")


# ---------------------------------------------------------------------------------------
# Nothing outside <root>/runs/<name>/


@pytest.mark.parametrize("name", ["..", "../x", "a/b", "/etc", "x/../../y", "A", "-a", "a" * 64, ""])
def test_run_names_are_checked(name):
    with pytest.raises(XrunError) as e:
        check_run_name(name)
    assert e.value.exit_code == 2


def test_storage_refuses_keys_escaping_the_root(tmp_path):
    root = tmp_path / "root"
    (tmp_path / "other" / "runs" / "x").mkdir(parents=True)
    (tmp_path / "other" / "runs" / "x" / "f").write_text("keep")
    st = LocalStorage(str(root))
    for key in ("../other/runs/x", "runs/../../other", "runs/a/../../.."):
        with pytest.raises(XrunError):
            st.delete_prefix(key)
        with pytest.raises(XrunError):
            st.read_bytes(key)
    root.mkdir()
    (root / "runs").mkdir()
    os.symlink(tmp_path / "other" / "runs" / "x", root / "runs" / "link")
    with pytest.raises(XrunError):
        st.delete_prefix("runs/link")
    with pytest.raises(XrunError):
        st.delete_prefix("")
    assert (tmp_path / "other" / "runs" / "x" / "f").read_text() == "keep"


# ---------------------------------------------------------------------------------------
# Unreachable or failing GCS: bounded retries, then exit 3 naming the root


@pytest.fixture
def proxied_root(gcs_proxy, gcs_bucket, monkeypatch):
    """A gs:// root with run 'r' in it, reached through the fault proxy."""
    root = f"{gcs_bucket}/xrun"
    st = open_storage(root)
    st.write_json(Layout.run_json("r"), {"name": "r", "backend": "local", "spec": {}})
    st.write_json(Layout.state("r"), {"backend": "local", "state": "Succeeded", "hosts": {}})
    st.write_text(Layout.log_chunk("r", "0-0", 0, 0), "hello\n")
    for k, v in gcs_proxy.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("XRUN_STORAGE_TIMEOUT", "30")
    return root


@pytest.mark.parametrize("mode", ["503", "drop"])
def test_storage_outage_is_a_bounded_exit_3(proxied_root, gcs_proxy, capsys, mode):
    gcs_proxy.outage(60, mode)
    for argv in (["list"], ["status", "r"], ["checkpoints", "r"], ["logs", "r"],
                 ["submit", "--name", "new", "--accelerator", "cpu-2", "--image", "i"]):
        started = time.monotonic()
        rc = main([*argv, "--storage", proxied_root, "--storage-timeout", "2"])
        took = time.monotonic() - started
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 3, (argv, err)
        assert len(err) == 1 and proxied_root in err[0] and "Traceback" not in err[0], err
        assert took < 12, (argv, took)
    gcs_proxy.clear()
    assert open_storage(proxied_root).read_json(Layout.run_json("new")) is None


def test_transient_errors_are_retried(proxied_root, gcs_proxy, capsys):
    gcs_proxy.fail(503, 2)
    gcs_proxy.fail(429, 1)
    assert main(["logs", "r", "--storage", proxied_root]) == 0
    assert "hello" in capsys.readouterr().out
    assert sum(gcs_proxy.stats.injected.values()) == 3


def test_forbidden_is_exit_3_at_once(proxied_root, gcs_proxy, capsys):
    gcs_proxy.fail(403, 100)
    started = time.monotonic()
    assert main(["status", "r", "--storage", proxied_root]) == 3
    assert time.monotonic() - started < 5
    assert "403" in capsys.readouterr().err


@pytest.mark.parametrize("failure", ["connection refused", "DNS lookup failed"])
def test_unreachable_endpoint_is_exit_3_at_once(failure, monkeypatch, capsys):
    """A closed port or a name that does not resolve is known at once: every command ends
    in seconds with exit 3 and one line naming the root, not after the whole default
    30 s storage timeout of retries (27-30.5 s each before). No network: the port is a
    closed one on 127.0.0.1, and the name's lookup fails in this process's resolver."""
    import socket

    from orchestrator.backends.local import free_port

    port = free_port()  # bound and closed: nothing listens there
    host = "127.0.0.1"
    if failure.startswith("DNS"):
        host = "storage.xrun-test.invalid"
        real = socket.getaddrinfo

        def getaddrinfo(name, *args, **kwargs):
            if name == host:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return real(name, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://{host}:{port}")
    monkeypatch.delenv("XRUN_STORAGE_TIMEOUT", raising=False)  # the default: 30 s
    root = "gs://xrun-unreachable/xrun"
    for argv in (["list"], ["status", "r"], ["logs", "r"], ["checkpoints", "r"],
                 ["submit", "--name", "new", "--accelerator", "cpu-2", "--image", "i"]):
        started = time.monotonic()
        rc = main([*argv, "--storage", root])
        took = time.monotonic() - started
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 3, (argv, err)
        assert len(err) == 1 and "Traceback" not in err[0], err
        assert err[0].startswith(f"xrun: error: storage: cannot reach {root}: {failure} ({host}:{port};"), err
        assert took < 5, (argv, took)


# ---------------------------------------------------------------------------------------
# Corrupt stored records: Unknown, the reason and the file, in every command


@pytest.mark.parametrize("damage", ["state.json garbage", "state.json empty", "state.json list",
                                    "run.json half"])
def test_corrupt_records_are_unknown_in_every_command(tmp_path, monkeypatch, capsys, damage):
    """A half-written run.json or a garbage state.json: status, list, logs and checkpoints
    all show the state Unknown and say which file is corrupt and why (before: exit 0, no
    word, list said Pending while status said Succeeded from the metrics' end record)."""
    from synthetic_runs import RunShape, write_stored_run

    root = tmp_path / "store"
    run = write_stored_run(root, "r", RunShape(steps=10))
    LocalStorage(str(root)).write_text(Layout.log_chunk("r", "0-0", 0, 0), "hello\n")
    (run / "checkpoints" / "10").mkdir(parents=True)
    (run / "checkpoints" / "10" / "data").write_bytes(b"x")
    file = run / damage.split()[0]
    text = file.read_text()
    file.write_bytes({"garbage": b"\x00\x17{garbage", "empty": b"", "list": b"[1, 2]",
                      "half": text[:len(text) // 2].encode()}[damage.split()[1]])
    damaged = file.read_bytes()
    monkeypatch.setenv("XRUN_STORAGE", str(root))
    warning = f"xrun: warning: run r: {file} is corrupt ("

    def run_cli(*argv: str) -> tuple[str, list[str]]:
        rc = main(list(argv))
        out, err = capsys.readouterr()
        assert rc == 0, (argv, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(warning) and lines[0].endswith("): state Unknown"), (argv, err)
        return out, lines

    out, _ = run_cli("status", "r", "-o", "json")
    view = json.loads(out)
    assert view["state"] == "Unknown" and view["phase"] == "unknown", view["state"]
    assert view["message"].startswith(f"{file} is corrupt ("), view["message"]
    out, _ = run_cli("status", "r")
    assert "Unknown" in out and "Succeeded" not in out
    out, _ = run_cli("list", "-o", "json")
    assert [(r["name"], r["state"]) for r in json.loads(out)] == [("r", "Unknown")]
    out, _ = run_cli("list")
    assert out.splitlines()[1].split()[:2] == ["r", "Unknown"]
    out, _ = run_cli("logs", "r")
    assert "hello" in out
    out, _ = run_cli("checkpoints", "r")
    assert "10" in out
    assert file.read_bytes() == damaged, "a reader rewrote the corrupt record"


# ---------------------------------------------------------------------------------------
# Chunk names


def test_a_second_shipper_incarnation_never_overwrites_chunks(tmp_path, monkeypatch):
    """Two log shippers of the same host and attempt (a replacement pod, a stray process),
    each starting its numbering at 0, write distinct chunk names."""
    from workload.sidecar import storage_writer

    for k, v in {Env.STORAGE: str(tmp_path), Env.RUN_NAME: "inc", Env.SLICE_INDEX: "0",
                 Env.HOST_INDEX: "0", Env.RESTART_ATTEMPT: "0"}.items():
        monkeypatch.setenv(k, v)
    for word in ("first", "second"):
        write = storage_writer()
        assert write is not None
        write(0, f"{word}\n".encode())
        time.sleep(0.01)  # distinct write times: the readers order chunks by them
    st = LocalStorage(str(tmp_path))
    objects, _ = st.list(Layout.host_logs("inc", "0-0", 0))
    assert len(objects) == 2 and len({o.key.rsplit("-", 1)[-1] for o in objects}) == 2
    assert sorted(st.read_text(o.key) for o in objects) == ["first\n", "second\n"]
