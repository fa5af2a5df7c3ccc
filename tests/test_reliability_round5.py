"""Reliability round 5 (issue #53): a resume stays in the root it is given and follows its
own attempt, resuming is exclusive per name, gc never guesses, and the hostile inputs of
the round end in one line.

In-process (``orchestrator.cli.main``) with the local backend's process start replaced by
a recorder wherever the process itself is not what is tested.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.local import backend as local_backend
from orchestrator.cli import main
from xrun_contract import Env, Layout
from xrun_contract.storage import open_storage

COMMAND = "python3 -m workload.train --preset tiny steps=8"


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _stored_run(root: Path, name: str, state: str = "Succeeded", **spec: Any) -> dict[str, Any]:
    """An ended local run as storage holds it (run.json, state.json), without running it."""
    from manifests.spec import build_spec

    s = build_spec({"name": name, "accelerator": "cpu-2", "image": "img", "command": COMMAND,
                    "storage": str(root), **spec}, {})
    st = open_storage(str(root))
    run = {"name": name, "spec": s.to_dict(), "submitted_at": time.time() - 60, "backend": "local",
           "context": "", "namespace": "", "storage": str(root)}
    st.write_json(Layout.run_json(name), run)
    st.write_json(Layout.state(name), {"backend": "local", "state": state, "restarts": 0,
                                       "supervisor_pid": 0, "transitions": [
                                           {"time": time.time(), "state": state, "reason": ""}]})
    return run


class _Recorder:
    """LocalBackend.submit without a supervisor: what it was given, and where."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, backend: Any, manifest: dict[str, Any], *, replace: bool = False) -> None:
        self.calls.append((backend.storage_root, manifest))


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    rec = _Recorder()
    def submit(backend: Any, manifest: dict[str, Any], *, replace: bool = False) -> None:
        rec(backend, manifest, replace=replace)

    monkeypatch.setattr(local_backend.LocalBackend, "submit", submit)
    monkeypatch.delenv(Env.STORAGE, raising=False)
    return rec


def _pod_env(manifest: dict[str, Any]) -> list[dict[str, str]]:
    out = []
    for rj in manifest["spec"]["replicatedJobs"]:
        pod = rj["template"]["spec"]["template"]["spec"]
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            out += [e for e in c.get("env") or [] if e.get("name") == Env.STORAGE]
    return out


# ---------------------------------------------------------------------------------------
# 1. A resumed run writes into the root the user names


def test_resume_of_a_moved_root_writes_into_the_named_root(tmp_path, capsys, recorded):
    a, b = tmp_path / "A", tmp_path / "B"
    _stored_run(a, "rs")
    shutil.move(str(a), str(b))
    rc, _, err = _cli(capsys, "submit", "--resume", "rs", "--storage", str(b), "--detach")
    assert rc == 0, err
    (root, manifest), = recorded.calls
    assert root == str(b)
    envs = _pod_env(manifest)
    assert envs and all(e["value"] == str(b) for e in envs), envs
    run = json.loads((b / Layout.run_json("rs")).read_text())
    assert run["storage"] == str(b) and run["spec"]["storage"] == str(b)
    assert str(a) not in (b / Layout.manifest("rs")).read_text()
    assert not a.exists()


# ---------------------------------------------------------------------------------------
# 2. A followed resume follows the new attempt


@pytest.fixture
def started():
    """(root, name) of every run a test started: none of its processes outlives the test."""
    from orchestrator.backends.local.backend import run_processes, stop_processes

    runs: list[tuple[Path, str]] = []
    yield runs
    for root, name in runs:
        pids = run_processes(str(root), name)
        if pids:
            stop_processes(pids, 2.0)


def test_followed_resume_follows_the_new_attempt_not_the_last_end(tmp_path, capsys, monkeypatch, started):
    monkeypatch.delenv(Env.STORAGE, raising=False)
    root = tmp_path / "store"
    started.append((root, "fol"))
    # Failed before; the resumed attempt succeeds after a second: a follow that printed the
    # stored end would exit 1 at once.
    _stored_run(root, "fol", state="Failed", command="sleep 1")
    t0 = time.monotonic()
    rc, _, err = _cli(capsys, "submit", "--resume", "fol", "--storage", str(root))
    assert rc == 0, err
    assert time.monotonic() - t0 >= 1.0
    state = json.loads((root / Layout.state("fol")).read_text())
    assert state["state"] == "Succeeded" and state["attempt"] >= 1, state
    assert "run fol: Succeeded" in err and "Failed" not in err, err


# ---------------------------------------------------------------------------------------
# 3. Resuming is exclusive per name; wait says no end while the run's processes live


def test_two_concurrent_resumes_start_one(tmp_path, capsys, recorded, monkeypatch):
    """The second resume arrives while the first is between its checks and its start."""
    import threading

    from orchestrator.services import runs
    from orchestrator.services import submit as submit_service

    root = tmp_path / "store"
    _stored_run(root, "ex")
    inside, release = threading.Event(), threading.Event()
    real = submit_service._check_over

    def slow_check(storage: Any, name: str, backend: Any) -> None:
        real(storage, name, backend)
        inside.set()
        release.wait(10)

    monkeypatch.setattr(submit_service, "_check_over", slow_check)
    out: dict[str, Any] = {}
    first = threading.Thread(target=lambda: out.setdefault("sub", runs.resume(str(root), "ex")))
    first.start()
    assert inside.wait(10)
    rc, _, err = _cli(capsys, "submit", "--resume", "ex", "--storage", str(root), "--detach")
    release.set()
    first.join(10)
    assert rc == 2 and "another resume of run 'ex' is under way" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert len(recorded.calls) == 1 and "sub" in out
    assert not (root / Layout.resume_lock("ex")).exists()  # released once started
    run = json.loads((root / Layout.run_json("ex")).read_text())
    assert len(run["resumed"]) == 1


def test_a_resume_lock_left_by_a_dead_resume_is_taken_over(tmp_path, capsys, recorded):
    import subprocess

    root = tmp_path / "store"
    _stored_run(root, "stale")
    gone = subprocess.Popen(["true"])
    gone.wait()
    import socket

    (root / Layout.resume_lock("stale")).write_text(json.dumps(
        {"pid": gone.pid, "host": socket.gethostname(), "time": time.time()}))
    rc, _, err = _cli(capsys, "submit", "--resume", "stale", "--storage", str(root), "--detach")
    assert rc == 0, err
    assert len(recorded.calls) == 1


def test_wait_does_not_say_succeeded_while_processes_of_the_run_live(tmp_path, capsys, monkeypatch):
    import os
    import subprocess

    monkeypatch.delenv(Env.STORAGE, raising=False)
    root = tmp_path / "store"
    _stored_run(root, "lw")
    # A pod process of the run (its environ names the run and the root), outliving the record.
    env = {**os.environ, Env.RUN_NAME: "lw", Env.STORAGE: str(root)}
    pod = subprocess.Popen(["sleep", "30"], env=env)
    try:
        rc, _, err = _cli(capsys, "wait", "lw", "--storage", str(root), "--timeout", "1.5")
        assert rc == 124, err
        assert "recorded Succeeded, but 1 process(es) of it still live" in err, err
    finally:
        pod.kill()
        pod.wait()
    rc, _, err = _cli(capsys, "wait", "lw", "--storage", str(root), "--timeout", "5")
    assert rc == 0 and "lw: Succeeded" in err, err


# ---------------------------------------------------------------------------------------
# 4. gc never guesses


def _archive(root: Path, sha: str, age_s: float = 7200.0) -> Path:
    import os

    path = root / Layout.code(sha)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"tar")
    os.utime(path, (time.time() - age_s, time.time() - age_s))
    return path


def test_gc_keeps_every_archive_while_a_run_json_is_corrupt(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(Env.STORAGE, raising=False)
    root = tmp_path / "store"
    mine, other = "a" * 64, "b" * 64
    _stored_run(root, "cut", code_sha256=mine)
    path = root / Layout.run_json("cut")
    text = path.read_text()
    path.write_text(text[: len(text) // 3])  # truncated: the name it held is lost
    kept = _archive(root, mine)
    _archive(root, other)
    for dry in (["--dry-run"], []):
        rc, out, err = _cli(capsys, "gc", "--storage", str(root), "--grace", "0", *dry)
        assert rc == 0, err
        assert "code/" not in out, out
        assert "the run.json of cut is corrupt" in err and "kept 2 unnamed archive(s)" in err, err
    assert kept.exists() and (root / Layout.code(other)).exists()
    # delete --purge of another run keeps them too (its release is the same decision)
    from orchestrator.services import code

    assert code.release(open_storage(str(root)), "other", other) is False
    assert (root / Layout.code(other)).exists()


def test_gc_dry_run_lists_exactly_what_gc_removes(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(Env.STORAGE, raising=False)
    root = tmp_path / "store"
    leased, free = "c" * 64, "d" * 64
    _archive(root, leased)
    _archive(root, free)
    lease = root / Layout.code_lease(leased, "lease-x")
    lease.parent.mkdir(parents=True, exist_ok=True)
    lease.write_text(str(time.time()))
    rc, dry, err = _cli(capsys, "gc", "--storage", str(root), "--grace", "0", "--dry-run")
    assert rc == 0, err
    assert "1 being reused by a submit now" in err, err
    rc, real, err = _cli(capsys, "gc", "--storage", str(root), "--grace", "0")
    assert rc == 0, err
    assert dry.replace("would remove", "removed") == real == f"removed code/{free}.tar.gz\n"
    assert (root / Layout.code(leased)).exists() and not (root / Layout.code(free)).exists()


def test_gc_on_a_root_that_is_a_file_says_so(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    rc, _, err = _cli(capsys, "gc", "--storage", str(f))
    assert rc == 2 and "is not a folder" in err and "does not exist" not in err, err


# ---------------------------------------------------------------------------------------
# 5, 6. --workdir: nothing dropped or counted in silence, no traceback


def test_workdir_skips_a_fifo_and_says_so(tmp_path):
    import os

    from orchestrator.workdir import pack

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "train.py").write_text("print(1)\n")
    os.mkfifo(tree / "pipe")
    packed = pack(str(tree))
    assert packed.files == ["train.py"]
    assert packed.skipped == ["pipe (a FIFO: not shipped)"]


def test_workdir_file_vanishing_during_the_walk_is_no_traceback(tmp_path, capsys, monkeypatch, recorded):
    from orchestrator import workdir

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "train.py").write_text("print(1)\n")
    real = workdir.list_files
    monkeypatch.setattr(workdir, "list_files", lambda folder, unlisted=None: [*real(folder), "build.tmp"])
    rc, _, err = _cli(capsys, "submit", "--name", "van", "--accelerator", "cpu-2", "--image", "img",
                      "--command", "python3 train.py", "--workdir", str(tree), "--storage", str(tmp_path / "s"),
                      "--detach")
    assert rc == 0, err
    assert "left out 1 entry: build.tmp (vanished while packing)" in err, err


def _git_tree(tmp_path: Path) -> Path:
    import subprocess

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "train.py").write_text("print(1)\n")
    git = ["git", "-C", str(tree), "-c", "user.email=x@y", "-c", "user.name=x"]
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    (tree / "build.tmp").write_text("temporary\n")  # untracked: git lists it, then it goes
    return tree


def test_workdir_git_file_vanishing_after_git_lists_it_is_skipped_and_said(tmp_path, capsys, monkeypatch,
                                                                          recorded):
    """A git checkout: git lists the untracked files and xrun then reads each to fingerprint
    the tree; a build's temporary file removed in between raised FileNotFoundError."""
    import os

    tree = _git_tree(tmp_path)
    real = os.path.isfile

    def isfile_then_gone(path: Any) -> bool:  # the file goes right after the check
        answer = real(path)
        if str(path).endswith("build.tmp") and answer:
            os.remove(path)
        return answer

    monkeypatch.setattr(os.path, "isfile", isfile_then_gone)
    rc, _, err = _cli(capsys, "submit", "--name", "vang", "--accelerator", "cpu-2", "--image", "img",
                      "--command", "python3 train.py", "--workdir", str(tree), "--storage", str(tmp_path / "s"),
                      "--detach")
    assert rc == 0, err
    assert "Traceback" not in err and len(recorded.calls) == 1, err


def test_workdir_file_vanishing_while_archived_is_skipped_and_said(tmp_path, capsys, monkeypatch, recorded):
    """Listed, measured, then removed before the archive reads it: a skip that is said, as
    the walk's, not a refused submit ("changed while it was packed", exit 2)."""
    from orchestrator import workdir

    tree = _git_tree(tmp_path)
    real = workdir._archive

    def archive(root: str, files: list[str], *args: Any) -> bytes:
        (tree / "build.tmp").unlink()
        return real(root, files, *args)

    monkeypatch.setattr(workdir, "_archive", archive)
    rc, _, err = _cli(capsys, "submit", "--name", "vana", "--accelerator", "cpu-2", "--image", "img",
                      "--command", "python3 train.py", "--workdir", str(tree), "--storage", str(tmp_path / "s"),
                      "--detach")
    assert rc == 0, err
    assert "left out 1 entry: build.tmp (vanished while packing)" in err, err


def test_workdir_folder_past_path_max_is_refused_by_name(tmp_path, capsys, monkeypatch):
    import os

    monkeypatch.delenv(Env.STORAGE, raising=False)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "train.py").write_text("print(1)\n")
    fd = os.open(tree, os.O_RDONLY)
    try:
        for _ in range(24):  # 24 x 201 characters: past PATH_MAX (4096)
            os.mkdir("d" * 200, dir_fd=fd)
            nfd = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        os.close(os.open("deep.py", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    finally:
        os.close(fd)
    rc, _, err = _cli(capsys, "render", "--name", "deep", "--accelerator", "cpu-2", "--image", "img",
                      "--command", "python3 train.py", "--workdir", str(tree), "--storage", str(tmp_path / "s"))
    assert rc == 2, err
    assert "workdir: cannot list" in err and "File name too long" in err, err
    assert len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------
# 5. No traceback: a root past NAME_MAX, a number past Python's int-to-str limit


@pytest.mark.parametrize("argv", [["list"], ["delete", "-l", "team=ml", "--yes"]])
def test_a_root_with_a_component_past_name_max_is_one_line(tmp_path, capsys, argv):
    root = tmp_path / ("x" * 300) / "r"
    rc, _, err = _cli(capsys, *argv, "--storage", str(root))
    assert rc in (2, 3) and "name too long" in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("field", ["max_restarts", "termination_grace_seconds", "coordinator_port"])
@pytest.mark.parametrize("digits", [4000, 5000])
def test_a_huge_integer_in_a_run_file_is_refused_in_one_short_line(tmp_path, capsys, field, digits):
    f = tmp_path / "run.yaml"
    f.write_text(f"name: big\naccelerator: cpu-2\nimage: img\ncommand: sleep 1\n{field}: {'9' * digits}\n")
    rc, _, err = _cli(capsys, "render", "-f", str(f))
    assert rc == 2, err
    assert len(err) < 200 and len(err.strip().splitlines()) == 1, err[:300]
    assert (field in err) if digits < 4300 else "over 4,300 digits" in err, err


# ---------------------------------------------------------------------------------------
# 6. Not silent: --resume with a flag keeps the stored spec


def test_resume_with_a_flag_changes_the_stored_spec_not_replaces_it(tmp_path, capsys, recorded):
    root = tmp_path / "store"
    _stored_run(root, "fl", env={"A": "1"})
    rc, _, err = _cli(capsys, "submit", "--resume", "fl", "--storage", str(root), "--env", "B=2", "--detach")
    assert rc == 0, err
    assert "its stored spec with the given flags" in err, err
    (_, manifest), = recorded.calls
    pod = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for c in pod["containers"] for e in c.get("env") or []}
    assert env.get("A") == "1" and env.get("B") == "2", env
    run = json.loads((root / Layout.run_json("fl")).read_text())
    assert run["spec"]["accelerator"] == "cpu-2" and run["spec"]["command"] == COMMAND
    assert run["spec"]["env"] == {"A": "1", "B": "2"}


def test_resume_of_a_run_whose_checkpoints_path_is_a_file_is_refused(tmp_path, capsys, recorded):
    root = tmp_path / "store"
    _stored_run(root, "cf")
    (root / Layout.checkpoints("cf")).write_text("not a folder")
    before = (root / Layout.run_json("cf")).read_text()
    rc, _, err = _cli(capsys, "submit", "--resume", "cf", "--storage", str(root), "--detach")
    assert rc == 2 and "checkpoints is a file, not the run's checkpoint folder" in err, err
    assert len(err.strip().splitlines()) == 1
    assert recorded.calls == [] and (root / Layout.run_json("cf")).read_text() == before


# ---------------------------------------------------------------------------------------
# 7. compare's input is bounded


def test_compare_of_a_gzip_of_nul_bytes_is_refused_at_once(tmp_path, capsys):
    import gzip

    bomb = tmp_path / "bomb.log.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        for _ in range(16):
            f.write(b"\0" * (4 << 20))
    t0 = time.monotonic()
    rc, _, err = _cli(capsys, "compare", str(bomb), str(bomb))
    assert rc == 2 and "binary data (NUL bytes)" in err, err
    assert len(err.strip().splitlines()) == 1 and time.monotonic() - t0 < 10


def test_compare_bounds_line_length_and_gzip_ratio(tmp_path, capsys, monkeypatch):
    import gzip

    from orchestrator.readers import loaders

    monkeypatch.setattr(loaders, "MAX_LINE_BYTES", 2 << 20)
    monkeypatch.setattr(loaders, "GZIP_RATIO_FLOOR", 2 << 20)
    long = tmp_path / "long.log"
    long.write_bytes(b"x" * (3 << 20))
    rc, _, err = _cli(capsys, "compare", str(long), str(long))
    assert rc == 2 and "has a line over 2 MiB long" in err, err
    lines = tmp_path / "nl.log.gz"
    with gzip.open(lines, "wb") as f:
        f.write(b"\n" * (4 << 20))
    rc, _, err = _cli(capsys, "compare", str(lines), str(lines))
    assert rc == 2 and "decompresses to over 200 times" in err, err


# ---------------------------------------------------------------------------------------
# Found by the soak: a pod whose main container ends at once stored none of its output


def test_a_pod_ending_while_its_log_shipper_starts_still_stores_its_output(tmp_path):
    """The shipper is made slow to start (a sitecustomize that sleeps in it alone): the
    supervisor SIGTERMed it mid-start, it died, and the pod's lines were never stored."""
    from cli_helpers import REPO, xrun

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import time\n"
        "argv = open('/proc/self/cmdline', 'rb').read().split(b'\\0')\n"
        "if b'workload.sidecar' in argv and b'ship' in argv:\n"
        "    time.sleep(1.5)\n")
    store = tmp_path / "store"
    r = xrun("submit", "--name", "quick", "--accelerator", "cpu-2", "--image", "img",
             "--command", "echo hello-$XRUN_HOST_INDEX", "--follow", storage=store, timeout=120,
             PYTHONPATH=f"{site}:{REPO}")
    assert r.returncode == 0, r.stderr
    assert "[0-0] hello-0" in r.stdout and "[0-1] hello-1" in r.stdout, r.stdout
    assert sorted(p.name for p in (store / "runs/quick/logs").iterdir()) == ["0-0", "0-1"]


def test_follow_keeps_memory_per_chunk_bounded(tmp_path: Path) -> None:
    """The soak's RSS growth: a follower kept every chunk name it had read (a set: ~150 bytes
    a chunk) and every step's grad_norm and learning_rate as Python floats (~70 bytes a
    step); over 20,000 steps that is megabytes on a ~36 MB follow. What it keeps now grows by
    the step's typed columns only."""
    import gc
    import tracemalloc

    from orchestrator.readers.loaders import StoredRun
    from orchestrator.readers.logs import LogFollower

    st = open_storage(str(tmp_path))
    name, n = "long", 1200
    for seq in range(n):  # written as files (the store's atomic writes cost 20 s here)
        rec = {"kind": "step", "time": 1e9 + seq, "attempt": seq // 600, "step": seq + 1, "seconds": 0.7,
               "loss": 1.0 / (seq + 1), "grad_norm": 0.5 + seq * 1e-5, "learning_rate": 1e-3 * (1 + seq * 1e-7)}
        for key, text in ((Layout.metrics_chunk(name, seq // 600, seq, "ab12cd34"), json.dumps(rec) + "\n"),
                          (Layout.log_chunk(name, "0-0", seq // 600, seq, "ab12cd34"), f"step {seq}\n")):
            path = tmp_path / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    StoredRun(st, "other").poll()  # the imports a first poll makes, outside the count
    list(LogFollower(st, "other").poll())
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        reader, follower = StoredRun(st, name), LogFollower(st, name)
        reader.poll()
        assert sum(1 for _ in follower.poll()) == n
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert reader.rec.steps.count == n and len(reader.rec.extra["grad_norm"][1]) == n
    assert "".join(follower.poll()) == "" and reader.poll().steps.count == n  # each chunk once still
    # The step columns (9 typed values a step) and two extras' (2 typed values each): ~104 bytes.
    assert kept / n < 160, f"{kept / n:.0f} bytes kept a step"
