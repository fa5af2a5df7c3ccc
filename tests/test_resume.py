"""`xrun submit --resume NAME` (issue #41 item 1): a run whose local supervisor was killed
with -9 after a committed checkpoint goes on from that checkpoint, keeping its history,
and every step it trains has the loss the same run had uninterrupted.

Everything runs for real: the CLI, the local supervisor, xrun's launcher and log shipper,
the JAX workload (tiny preset) and Orbax checkpoints.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from cli_helpers import xrun
from test_faults_storage import _wait

from orchestrator.backends.local.backend import run_processes, stop_processes
from orchestrator.readers.checkpoints import list_checkpoints
from xrun_contract import Layout
from xrun_contract.storage import open_storage

STEPS = 16
COMMAND = f"python3 -m workload.train --preset tiny steps={STEPS} checkpoint_every=4"
# One host: what resumes is the run (its stored spec, attempt, checkpoint, metrics), the same
# for one host as for two; two hosts' restart and restore are tests/test_e2e_local.py's.
SPEC = ["--accelerator", "cpu-1", "--image", "img", "--command", COMMAND, "--max-restarts", "0",
        "--termination-grace-seconds", "20"]


def _state(root: Path, name: str) -> dict:
    return open_storage(str(root)).read_json(Layout.state(name)) or {}


def _steps(root: Path, name: str) -> dict[int, dict[int, float]]:
    """attempt -> step -> loss, from the stored metrics chunks."""
    out: dict[int, dict[int, float]] = {}
    for path in sorted((root / Layout.metrics(name)).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line) if line.strip() else {}
            if rec.get("kind") == "step":
                out.setdefault(int(rec["attempt"]), {})[int(rec["step"])] = rec["loss"]
    return out


@pytest.fixture
def started():
    """(root, name) of every run a test started: none of its processes outlives the test."""
    runs: list[tuple[Path, str]] = []
    yield runs
    for root, name in runs:
        pids = run_processes(str(root), name)
        if pids:
            stop_processes(pids, 2.0)


def test_resume_after_kill_9_of_the_supervisor_continues_with_the_same_losses(tmp_path, started):
    root = tmp_path / "store"
    started += [(root, "ref"), (root, "res")]
    # The reference, uninterrupted, and the run to kill, side by side (same seed, same root:
    # one compilation cache).
    for name, delay in (("ref", "0"), ("res", "0.5")):
        r = xrun("submit", "--name", name, *SPEC, "--env", f"XRUN_TEST_STEP_DELAY={delay}", "--detach",
                 storage=root, timeout=120)
        assert r.returncode == 0, r.stderr
    st = open_storage(str(root))
    # Live: refused in one line, nothing changed. Asked before the first save, not between
    # it and the kill below: on a loaded host two CLI calls there let the run end first.
    _wait(lambda: _state(root, "res").get("state") == "Running", 120, "never Running")
    r = xrun("submit", "--resume", "res", "--detach", storage=root, timeout=60)
    assert r.returncode == 2 and "is Running; only an ended run resumes" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = xrun("submit", "--resume", "nosuch", "--detach", storage=root, timeout=60)
    assert r.returncode == 2 and "no run named 'nosuch'" in r.stderr, r.stderr

    _wait(lambda: any(c.state == "committed" and c.step >= 4 for c in list_checkpoints(st, "res")), 240,
          "no committed checkpoint", every=0.02)
    sup = _state(root, "res")["supervisor_pid"]
    assert sup in run_processes(str(root), "res")  # the supervisor this test started, by PID
    os.kill(sup, signal.SIGKILL)
    _wait(lambda: not run_processes(str(root), "res"), 60, "processes outlived the supervisor")
    committed = max(c.step for c in list_checkpoints(st, "res") if c.state == "committed")
    before = _steps(root, "res")
    assert list(before) == [0] and committed < STEPS, (before, committed)

    r = xrun("submit", "--resume", "res", "--detach", storage=root, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "resumed res (local backend, its stored spec)" in r.stderr, r.stderr
    for name in ("ref", "res"):
        r = xrun("wait", name, "--timeout", "240", storage=root, timeout=300)
        assert r.returncode == 0, (name, r.stdout, r.stderr, _state(root, name).get("message"))
    _wait(lambda: not run_processes(str(root), "res"), 30, "a process of the resumed run is left")

    ref = _steps(root, "ref")[0]
    after = _steps(root, "res")
    assert after[0] == before[0]  # the first attempt's metrics are kept
    resumed = after[1]
    assert min(resumed) == committed + 1, (committed, sorted(resumed))  # from the checkpoint, not 0
    assert max(resumed) == STEPS
    assert {s: resumed[s] for s in resumed} == {s: ref[s] for s in resumed}  # every step, the same loss
    state = _state(root, "res")
    assert [t["state"] for t in state["transitions"]] == ["Running", "Failed", "Pending", "Running", "Succeeded"]
    assert "resumed" in state["transitions"][2]["reason"]
    logs = root / Layout.logs("res")
    assert sorted(p.name for p in (logs / "0-0").iterdir()) == ["attempt-000", "attempt-001"]
    run = json.loads((root / Layout.run_json("res")).read_text())
    assert [r["attempt"] for r in run["resumed"]] == [1] and run["workload"]["attempt"] == 1
    # The resumed attempt restored the first attempt's checkpoint (Orbax's max_to_keep may
    # have pruned it since).
    restored = [json.loads(line) for p in sorted((root / Layout.metrics("res")).glob("attempt-001-*.jsonl"))
                for line in p.read_text().splitlines() if '"restored"' in line]
    assert [(r["kind"], r["step"]) for r in restored if r.get("event") == "restored"] == [("checkpoint", committed)]


# ---------------------------------------------------------------------------------------
# The kube backend, on the real control plane: the JobSet is re-created in the same prefix


def test_resume_on_the_cluster_recreates_the_jobset_and_keeps_the_history(cluster, gcs_bucket, tmp_path):
    from cluster_helpers import timing, unique
    from test_cluster_lifecycle import PodFailer, cli, run_file

    from xrun_contract import Env

    storage = f"{gcs_bucket}/xrun"
    name = unique("res")
    failer = PodFailer(cluster, name, "0-0", 1)
    failer.start()
    r = cli(cluster, storage, "submit", "-f", run_file(tmp_path, name, pod_annotations=timing(run_s=30)))
    failer.stop.set()
    assert r.returncode == 1 and failer.failed, r.stderr
    old_uid = cluster.jobset(name)["metadata"]["uid"]
    st = open_storage(storage)
    assert st.read_json(Layout.state(name))["state"] == "Failed"

    # With a run file (shorter pods this time): the run file's spec replaces the stored one.
    r = cli(cluster, storage, "submit", "--resume", name, "--detach", "-f",
            run_file(tmp_path, name, pod_annotations=timing(run_s=6.0)))
    assert r.returncode == 0, r.stderr
    assert f"resumed {name} (kube backend, the given run file)" in r.stderr, r.stderr
    js = cluster.jobset(name)
    assert js["metadata"]["uid"] != old_uid  # re-created, not the failed one
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    for c in [pod["containers"][0], *[i for i in pod["initContainers"] if i.get("restartPolicy") == "Always"]]:
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env[Env.ATTEMPT_BASE] == "1" and env[Env.STORAGE] == storage, (c["name"], env)
    from orchestrator.backends.kube.state import run_attempt

    pods = _wait(lambda: cluster.pods(name), 60, "no pod of the re-created JobSet")
    assert {run_attempt(p) for p in pods} == {1}  # live lines go with attempt-001's stored chunks
    # Live now: a second resume is refused in one line.
    r = cli(cluster, storage, "submit", "--resume", name, "--detach")
    assert r.returncode == 2 and "only an ended run resumes" in r.stderr, r.stderr
    r = cli(cluster, storage, "wait", name, "--timeout", "120", timeout=180)
    assert r.returncode == 0, (r.stdout, r.stderr)
    state = st.read_json(Layout.state(name))
    kinds = [t["state"] for t in state["transitions"]]
    assert kinds[0] != "Failed" and "Failed" in kinds and kinds[-1] == "Succeeded", kinds
    resumed = kinds.index("Pending", kinds.index("Failed"))
    assert "resumed" in state["transitions"][resumed]["reason"]
    run = st.read_json(Layout.run_json(name))
    assert [x["attempt"] for x in run["resumed"]] == [1]
    assert run["spec"]["pod_annotations"] == timing(run_s=6.0)
