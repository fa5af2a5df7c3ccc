"""Daily use as a new user meets it (issue #39): a relative storage root, storage that cannot
be reached, an empty or misnamed root, a run that stops making progress, small screen
wording.

The stall and the relative root share one real local run (the issue's repro: the README's
nightly repository shipped with ``--workdir .``, ``--storage ./relstore``): once it has
committed a checkpoint its workload container's process group is frozen with SIGSTOP, and
``wait``, ``status`` and the follow's progress line must say so; the group is resumed and
killed, and the run deleted, whatever the test found.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cli_helpers import REPO, xrun, xrun_env
from test_faults_storage import _wait

from orchestrator.backends.local.backend import run_processes
from orchestrator.readers.checkpoints import list_checkpoints
from orchestrator.readers.loaders import StoredRun
from xrun_contract import Layout
from xrun_contract.storage import open_storage

NAME = "nb-rel"


def _workload_pgid(root: Path) -> int | None:
    """The process group of the run's workload container (the one running train.py): the
    only processes this test freezes."""
    for pid in run_processes(str(root), NAME):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(b"train.py") for part in cmd) and b"-c" not in cmd[:2]:
            with contextlib.suppress(ProcessLookupError):
                return os.getpgid(pid)
    return None


@pytest.fixture(scope="module")
def frozen_run(tmp_path_factory):
    """The issue's repro, detached, frozen once a checkpoint committed and steps went on."""
    tmp = tmp_path_factory.mktemp("daily")
    repo = tmp / "nightly-repo"
    subprocess.run(["bash", str(REPO / "examples/make-nightly-repo.sh"), str(repo)], check=True,
                   capture_output=True, cwd=tmp)
    root = repo / "relstore"  # what ./relstore means where the user typed it
    env = {"XRUN_STALL_SECONDS": "3"}
    sub = xrun("submit", "--name", NAME, "--storage", "./relstore", "--accelerator", "cpu-1",
               "--image", "xrun-workload:dev", "--workdir", ".", "--detach", "--command",
               "python3 train.py --preset tiny steps=100000 checkpoint_every=5",
               storage=tmp / "unused", cwd=repo, **env)
    assert sub.returncode == 0, sub.stderr
    pgid = None
    try:
        storage = open_storage(str(root))
        reader = StoredRun(storage, NAME)
        _wait(lambda: any(c.state == "committed" for c in list_checkpoints(storage, NAME))
              and (reader.poll().steps.last_step or 0) > 5, 240,
              "a committed checkpoint and the steps after it under ./relstore")
        pgid = _wait(lambda: _workload_pgid(root), 30, "the workload's process group")
        os.killpg(pgid, signal.SIGSTOP)
        out = {"tmp": tmp, "repo": repo, "root": root, "submit": sub}
        follow = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "logs", NAME, "-f", "--storage", str(root),
             "--progress-interval", "0.5"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env=xrun_env(root, **env))
        guard = threading.Timer(240, follow.kill)  # a silent follow ends the loop below
        guard.start()
        try:
            out["wait"] = xrun("wait", NAME, "--timeout", "120", storage=root, **env)
            out["status_json"] = xrun("status", NAME, "-o", "json", storage=root, **env)
            out["status"] = xrun("status", NAME, storage=root, **env)
            lines: list[str] = []
            assert follow.stderr is not None
            for line in follow.stderr:  # the stall is past its limit already: the next line says it
                lines.append(line)
                if "no step for" in line or len(lines) > 200:
                    break
            out["follow"] = "".join(lines)
        finally:
            guard.cancel()
            follow.kill()
            follow.wait()
        yield out
    finally:
        # The deletion stops the supervisor (no restart), the frozen group is killed rather
        # than left to save a checkpoint on SIGTERM, then nothing of the run may be left.
        deleted = xrun("delete", NAME, "--no-wait", storage=root, timeout=120)
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGCONT)
                os.killpg(pgid, signal.SIGKILL)
        _wait(lambda: not run_processes(str(root), NAME), 120, "every process of the run to end")
        assert deleted.returncode == 0, deleted.stderr


def test_a_relative_storage_root_is_where_the_user_named_it(frozen_run):
    root, repo = frozen_run["root"], frozen_run["repo"]
    assert f"storage {root}/runs/{NAME}" in frozen_run["submit"].stderr
    run = json.loads((root / Layout.run_json(NAME)).read_text())
    assert run["spec"]["storage"] == str(root) and run["storage"] == str(root)
    manifest = (root / Layout.manifest(NAME)).read_text()
    assert f"value: {root}\n" in manifest and "value: ./relstore" not in manifest
    # The pod ran in its unpacked copy of the tree, yet its checkpoints and step records
    # are in the root the user named.
    committed = [c.step for c in list_checkpoints(open_storage(str(root)), NAME) if c.state == "committed"]
    records = [json.loads(ln) for p in sorted((root / Layout.metrics(NAME)).glob("*.jsonl"))
               for ln in p.read_text().splitlines() if ln.strip()]
    # Saves fall every 5 steps, or later after a deferral: a save due while the one before
    # it is still being written waits until that one commits (in CI, step 10's at step 11).
    deferred = {r["step"] for r in records if r.get("kind") == "checkpoint"
                and r.get("event") == "deferred"}
    assert committed and all(step % 5 == 0 or any(d < step for d in deferred)
                             for step in committed), (committed, deferred)
    steps = [r for r in records if r.get("kind") == "step"]
    assert len(steps) > 5 and steps[0]["step"] >= 1
    assert not (repo / "relstore" / "relstore").exists()
    state = json.loads((root / Layout.state(NAME)).read_text())
    assert state["transitions"][0]["reason"] == "attempt 0: 1 pod started"


def test_wait_ends_a_stalled_run_with_its_own_code(frozen_run):
    w = frozen_run["wait"]
    assert w.returncode == 123, (w.returncode, w.stderr)
    assert f"{NAME}: stalled: no step for" in w.stderr and "(last: step " in w.stderr, w.stderr
    assert "Traceback" not in w.stderr


def test_status_and_the_follow_say_no_step_for(frozen_run):
    view = json.loads(frozen_run["status_json"].stdout)
    assert view["state"] == "Running"
    stall = view["stall"]
    assert stall["last_step"] >= 5 and stall["seconds"] > stall["limit_seconds"] >= 3
    assert "no step for" in frozen_run["status"].stdout
    assert f"(last: step {stall['last_step']}): past its limit of" in frozen_run["status"].stdout
    assert "stalled: no step for" in frozen_run["follow"], frozen_run["follow"][-2000:]


def test_gcs_without_credentials_or_endpoint_is_one_line_exit_3(tmp_path, capsys, monkeypatch):
    """No Google credentials (none configured, or a credentials file that is not there), and
    an endpoint that accepts connections but never answers: one line, exit 3, no traceback."""
    root = "gs://no-such-bucket/x"
    home = tmp_path / "home"
    home.mkdir()
    for key in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "XRUN_STORAGE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("XRUN_STORAGE_TIMEOUT", "5")  # restored after: --storage-timeout sets it
    for key, value in (("HOME", str(home)), ("CLOUDSDK_CONFIG", str(home / "gcloud")), ("NO_GCE_CHECK", "True")):
        monkeypatch.setenv(key, value)  # no gcloud config, and not on GCE (a CI runner may be)

    def one_line_exit_3(*args: str) -> str:
        code, out, err = _cli(capsys, *args, "--storage", root)
        lines = err.strip().splitlines()
        assert code == 3 and not out and len(lines) == 1, (code, out, err)
        assert lines[0].startswith("xrun: error: storage: ") and root in lines[0] and "Traceback" not in err
        return lines[0]

    for args in (["list", "--storage-timeout", "5"], ["status", "mt-07", "--storage-timeout", "5"]):
        line = one_line_exit_3(*args)
        assert "no usable Google credentials" in line and "gcloud auth application-default login" in line, line
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(home / "no-such-key.json"))
    line = one_line_exit_3("submit", "--name", "mt-07", "--accelerator", "cpu-1", "--image", "img",
                           "--command", "true", "--storage-timeout", "5")
    assert "no-such-key.json was not found" in line, line
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # connections complete in the kernel; nothing ever answers
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{silent.getsockname()[1]}")
        line = one_line_exit_3("list", "--storage-timeout", "1")
        assert "timed out" in line.lower() or "timeout" in line.lower(), line
    finally:
        silent.close()


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    """The CLI in this process (no interpreter start): exit code, stdout, stderr."""
    from orchestrator.cli import main

    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_an_empty_or_misnamed_root_says_so_and_names_close_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("XRUN_STORAGE", raising=False)
    root = tmp_path / "xrun"
    (root / "runs" / "mt-07").mkdir(parents=True)
    (root / "runs" / "mt-07" / "run.json").write_text(json.dumps(
        {"name": "mt-07", "backend": "local", "submitted_at": time.time(), "spec": {"name": "mt-07"}}))
    (root / "runs" / "mt-07" / "state.json").write_text(json.dumps({"state": "Succeeded", "backend": "local"}))
    code, out, err = _cli(capsys, "list", "--storage", str(root))
    assert code == 0 and "mt-07" in out and not err
    for given, hint in [(tmp_path / "nope", f"{tmp_path / 'nope'} does not exist"),
                        (root / "runs", f"did you mean --storage {root}?"),
                        (root / "runs" / "mt-07", f"its storage root is {root}")]:
        code, out, err = _cli(capsys, "list", "--storage", str(given))
        assert (code, out) == (0, ""), (code, out, err)
        assert err.startswith(f"xrun: No runs found under {given} (") and err.endswith(f"{hint})\n"), err
    code, out, err = _cli(capsys, "list", "--storage", str(root), "--state", "Failed")
    assert (code, out, err) == (0, "", f"xrun: No runs found under {root} matching the filters\n")
    code, out, err = _cli(capsys, "status", "mt-7", "--storage", str(root))
    assert code == 2 and err == f"xrun: error: run: no run named 'mt-7' under {root}; did you mean mt-07?\n", err
    code, out, err = _cli(capsys, "status", "zz", "--storage", str(root))
    assert code == 2 and "see 'xrun list'" in err and "did you mean" not in err


def _record(now: float, last_step_age: float, restarts_seen: int = 0):
    """A run that logged steps 1..10 (0.1 s each, the first 5 s: compilation), the last
    ``last_step_age`` seconds before ``now``, and committed step 5 in 2 s."""
    from orchestrator.readers.record import RunRecord

    rec = RunRecord(name="r")
    t0 = now - last_step_age - 1.0
    for step in range(1, 11):
        rec.steps.append(step, 5.0 if step == 1 else 0.1, 0.0, 1.0, 1.0, time=now - last_step_age - (10 - step) / 10,
                         attempt=0)
    rec.add_checkpoint("committed", 5, 2.0, 0, time=t0 + 0.6)
    rec.phases.append({"phase": "first_step", "seconds": 12.0, "attempt": 0, "time": t0})
    rec.restarts = restarts_seen
    return rec


def test_the_stall_limit_comes_from_the_runs_own_times():
    from orchestrator.readers.figures import stall, stall_text

    now = 1_000_000.0
    found = stall(_record(now, 30.0), "Running", 0, now, floor=3.0)
    # max(floor 3, 10 x slowest step 0.1 (the compile step left out), 2 x the 2 s save) = 4 s
    assert found is not None and found["limit_seconds"] == 4.0 and "longest save" in found["limit_from"]
    assert found["last_step"] == 10 and found["seconds"] == 30.0
    assert stall_text(found) == "no step for 30s (last: step 10)"
    assert stall(_record(now, 3.5), "Running", 0, now, floor=3.0) is None  # within 2 x the save
    assert stall(_record(now, 30.0), "Running", 0, now, floor=60.0) is None  # the floor
    assert stall(_record(now, 30.0), "Running", 0, now, floor=0.0) is None  # off
    for state in ("Pending", "Restarting", "Succeeded", "Failed"):
        assert stall(_record(now, 30.0), state, 0, now, floor=3.0) is None
    # A restart with no step yet: 2 x the longest start-up (12 s to the first step), from
    # its newest sign of life (the restart's transition, then its phase records).
    rec = _record(now, 100.0, restarts_seen=1)
    rec.transitions.append({"state": "Running", "time": now - 20.0})
    assert stall(rec, "Running", 1, now, floor=3.0) is None  # 20 s < 24 s
    rec.transitions[-1]["time"] = now - 30.0
    late = stall(rec, "Running", 1, now, floor=3.0)
    assert late is not None and late["limit_seconds"] == 24.0 and "start-up" in late["limit_from"]
    assert stall_text(late) == "no step for 1m40s (last: step 10)"
    rec.phases.append({"phase": "initialized", "seconds": 5.0, "attempt": 1, "time": now - 2.0})
    assert stall(rec, "Running", 1, now, floor=3.0) is None


def test_a_nightly_deletes_a_stalled_run_and_goes_on(tmp_path, monkeypatch):
    """nightly.follow: a Running run past its stall limit is deleted and recorded Stalled."""
    from types import SimpleNamespace

    from orchestrator.backends.base import BackendStatus
    from orchestrator.services import nightly
    from orchestrator.services import runs as runs_service

    root = tmp_path / "store"
    folder = root / "runs" / "n-1"
    (folder / "metrics").mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"name": "n-1", "backend": "local", "spec": {"name": "n-1"}}))
    t0 = time.time() - 60
    (folder / "metrics" / "attempt-000-00000000-w.jsonl").write_text("".join(
        json.dumps({"kind": "step", "step": s, "seconds": 0.1, "loss": 1.0, "attempt": 0, "time": t0 + s}) + "\n"
        for s in range(1, 6)))
    deleted: list[str] = []

    class Backend:
        name = "local"

        def status(self, name: str) -> BackendStatus:
            return BackendStatus(state="Running", restarts=0)

        def delete(self, name: str, wait: bool = True) -> bool:
            deleted.append(name)
            return True

    monkeypatch.setattr(runs_service, "backend_for_spec", lambda spec: Backend())
    monkeypatch.setenv("XRUN_STALL_SECONDS", "5")
    run = SimpleNamespace(name="n-1", spec=SimpleNamespace(storage=str(root)))
    out = nightly.follow(run, timeout_s=600, poll_s=0.05)  # type: ignore[arg-type]
    assert out.state == "Stalled" and deleted == ["n-1"]
    assert out.message.startswith("no step for ") and out.message.endswith("(last: step 5): deleted")


def test_small_screen_wording(tmp_path):
    """'1 pod started', parameter counts in a unit that shows them, a restart's reason in the
    plain progress line, and two ranks' Gloo lines glued then split kept out as noise."""
    from orchestrator.cli.progress import LineFilter, plain_progress
    from orchestrator.readers.loaders import read_log_file
    from xrun_contract import format_params_line

    assert [format_params_line(n) for n in (853_100_000, 106_816, 42_816)] == [
        "number parameters: 0.853 billion", "number parameters: 0.107 million", "number parameters: 42,816"]
    for n, text in ((106_816, "0.107 million"), (42_816, "42,816"), (853_100_000, "0.853 billion")):
        log = tmp_path / f"{n}.log"
        log.write_text(format_params_line(n) + "\n")
        rec = read_log_file(log)
        assert rec.params_text == text and abs((rec.params or 0) - n) <= 0.005 * n, (rec.params, rec.params_text)
    keep = LineFilter().keep
    glued = ["[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1[Gloo] Rank ",
             "0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1",
             "nk 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1"]
    assert not any(keep(line) for line in glued)
    assert keep("10 is connected to the data server") and keep("completed step: 3, loss: 2.5")
    view = {"name": "mt-07", "state": "Running", "phase": "starting", "phase_since": None, "step": 30,
            "total_steps": 100, "loss": 2.5, "tokens_per_s": 1000.0, "eta_seconds": None,
            "latest_checkpoint": None, "checkpoints_in_progress": [], "restarts": 3,
            "transitions": [{"state": "Running", "reason": "attempt 0: 1 pod started"},
                            {"state": "Restarting", "reason": "host 0-0 exited with code 42; restart 3/3"}],
            "stall": {"seconds": 2165.0, "last_step": 30, "limit_seconds": 600.0}}
    line = plain_progress(view)
    assert "| restarts 3 (last: host 0-0 exited with code 42; restart 3/3)" in line, line
    assert "starting | stalled: no step for 36m05s (last: step 30) |" in line, line


def test_logs_by_attempt_exclude_and_kubectls_verbs(tmp_path, capsys, monkeypatch):
    """logs --previous / --attempt N / --exclude on a stored run with a restart; get and
    describe answer as list and status."""
    monkeypatch.delenv("XRUN_STORAGE", raising=False)
    root = tmp_path / "xrun"
    run = root / "runs" / "rs-1"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"name": "rs-1", "backend": "local", "submitted_at": time.time(),
                                              "spec": {"name": "rs-1", "accelerator": "cpu-1"}}))
    (run / "state.json").write_text(json.dumps({"state": "Succeeded", "backend": "local", "restarts": 1}))
    for attempt, lines in ((0, ["first try", "noisy line", "died"]), (1, ["second try", "noisy again"])):
        chunk = run / "logs" / "0-0" / f"attempt-{attempt:03d}" / "00000000-w.log"
        chunk.parent.mkdir(parents=True)
        chunk.write_text("".join(f"2026-01-02T15:04:0{i}.000000Z {t}\n" for i, t in enumerate(lines)))

    def logs(*args: str) -> tuple[int, list[str], str]:
        code, out, err = _cli(capsys, "logs", "rs-1", "--no-prefix", "--storage", str(root), *args)
        return code, out.splitlines(), err

    assert logs("--previous")[:2] == (0, ["first try", "noisy line", "died"])
    assert logs("--attempt", "1")[:2] == (0, ["second try", "noisy again"])
    assert logs("--exclude", "nois")[:2] == (0, ["first try", "died", "second try"])
    assert logs("--previous", "--exclude", "nois", "--tail", "1")[:2] == (0, ["died"])
    code, _, err = logs("--attempt", "5")
    assert code == 2 and err == "xrun: error: --attempt: run rs-1 has no attempt 5; attempts logged: 0, 1\n", err
    code, _, err = logs("--exclude", "(")
    assert code == 2 and err.startswith("xrun: error: --exclude: '(' is not a regular expression"), err
    assert _cli(capsys, "get", "--storage", str(root))[1] == _cli(capsys, "list", "--storage", str(root))[1]
    described = json.loads(_cli(capsys, "describe", "rs-1", "-o", "json", "--storage", str(root))[1])
    assert described == json.loads(_cli(capsys, "status", "rs-1", "-o", "json", "--storage", str(root))[1])
    assert described["state"] == "Succeeded" and described["restarts"] == 1


def test_relative_roots_in_run_and_nightly_files_are_from_the_current_folder(tmp_path, capsys, monkeypatch):
    """storage: ./x in a run file, in a nightly file and in $XRUN_STORAGE: the folder the
    command was run from, made absolute before anything is rendered."""
    from orchestrator.nightly_file import load_nightly

    here = tmp_path / "here"
    (here / "conf").mkdir(parents=True)
    monkeypatch.chdir(here)
    (here / "conf" / "run.yaml").write_text("name: rf-1\naccelerator: cpu-1\nimage: img\ncommand: 'true'\n"
                                            "storage: ./from-file\n")
    code, out, err = _cli(capsys, "render", "-f", "conf/run.yaml", "-o", "json")
    assert code == 0, err
    envs = [e for c in json.loads(out)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
            ["containers"] for e in c.get("env", []) if e["name"] == "XRUN_STORAGE"]
    assert envs and {e["value"] for e in envs} == {str(here / "from-file")}
    monkeypatch.setenv("XRUN_STORAGE", "./from-env")
    code, out, err = _cli(capsys, "render", "--name", "rf-2", "--accelerator", "cpu-1", "--image", "img",
                          "--command", "true")
    assert code == 0 and f"value: {here / 'from-env'}\n" in out, err
    nightly = (REPO / "examples/nightly-local.yaml").read_text()
    (here / "conf" / "nightly.yaml").write_text(nightly)
    assert load_nightly("conf/nightly.yaml").storage == str(here / "xrun-nightly")
