"""End to end on the embedded default: the README's run command trains 2 hosts x 2 CPU
devices, and faults restart and resume exactly. Real processes, real JAX, real Orbax."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from cli_helpers import REPO, xrun

EXAMPLE = REPO / "examples" / "local-tiny.yaml"


def metrics(root, name):
    import json

    from xrun_contract import Layout
    from xrun_contract.storage import open_storage, read_chunks

    return [json.loads(line) for _key, data in read_chunks(open_storage(str(root)), Layout.metrics(name))
            for line in data.decode().splitlines() if line.strip()]


def step_losses(records):
    out = {}
    for r in records:
        if r.get("kind") == "step":
            out[r["step"]] = r["loss"]  # a redone step keeps its latest value
    return out


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    """`xrun submit -f examples/local-tiny.yaml --follow` from a clean folder, default storage."""
    home = tmp_path_factory.mktemp("home")
    cwd = tmp_path_factory.mktemp("clean")
    shutil.copy(EXAMPLE, cwd / "local-tiny.yaml")
    env = {"HOME": str(home), "XDG_DATA_HOME": str(home / "data"), "XDG_STATE_HOME": str(home / "state")}
    store = home / "data" / "xrun"
    r = xrun("submit", "-f", "local-tiny.yaml", "--follow", storage="", cwd=cwd, timeout=600, **env)
    return r, store, env


def test_readme_run_end_to_end(readme_run):
    r, store, env = readme_run
    assert r.returncode == 0, r.stderr[-3000:]
    assert "run local-tiny: Succeeded" in r.stderr
    # Logs of both hosts streamed with prefixes; process 0 logs the MaxText step lines.
    assert "[0-0] completed step: 40," in r.stdout
    assert "[0-1] xrun-wrapper: start" in r.stdout and "[0-1] EXIT_CODE=0" in r.stdout
    run_dir = store / "runs" / "local-tiny"
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == ["0-0", "0-1"]
    losses = step_losses(metrics(store, "local-tiny"))
    assert sorted(losses) == list(range(1, 41))
    assert losses[40] < losses[1]  # it trains
    run_json = json.loads((run_dir / "run.json").read_text())
    assert run_json["workload"]["exit_code"] == 0
    # Status and checkpoints from storage, through the CLI.
    view = json.loads(xrun("status", "local-tiny", "-o", "json", storage=store, **env).stdout)
    assert view["state"] == "Succeeded" and view["step"] == 40
    assert view["latest_checkpoint"]["step"] == 40
    cks = json.loads(xrun("checkpoints", "local-tiny", "-o", "json", storage=store, **env).stdout)
    assert [c["step"] for c in cks if c["state"] == "committed"][-1] == 40
    assert xrun("list", storage=store, **env).stdout.count("local-tiny") == 1


def test_restartable_fault_resumes_to_the_same_loss(readme_run, tmp_path):
    _, store, env = readme_run
    reference = step_losses(metrics(store, "local-tiny"))
    root = tmp_path / "store"
    # Host 0-1 exits 42 after logging step 15 in attempt 0; checkpoints every 10 steps.
    r = xrun("submit", "-f", str(EXAMPLE), "--name", "fault", "--env", "XRUN_TEST_FAIL_AT_STEP=15:42:1",
             storage=root, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    state = json.loads((root / "runs/fault/state.json").read_text())
    assert state["restarts"] == 1
    assert [t["state"] for t in state["transitions"]] == ["Running", "Restarting", "Running", "Succeeded"]
    records = metrics(root, "fault")
    restored = [r for r in records if r.get("kind") == "checkpoint" and r.get("event") == "restored"]
    assert [r["step"] for r in restored] == [10]
    second = [r["step"] for r in records if r.get("kind") == "step" and r["attempt"] == 1]
    assert second[0] == 11 and second[-1] == 40
    losses = step_losses(records)
    assert losses[40] == pytest.approx(reference[40], abs=1e-6)
    for step in (11, 25, 40):
        assert losses[step] == pytest.approx(reference[step], abs=1e-6)


def test_non_restartable_exit_fails_the_run(tmp_path):
    """Host 0-1 exits 3 (a bug) at step 2. The run fails without a restart, naming it; host
    0-0, left waiting in a checkpoint round that 0-1 never joins, learns of the exit from the
    coordination service and exits restartable at once (it waited for the supervisor's
    SIGKILL at the end of the 15 s grace period before: exit 137)."""
    root = tmp_path / "store"
    r = xrun("submit", "-f", str(EXAMPLE), "--name", "boom", "--env", "XRUN_TEST_FAIL_AT_STEP=2:3:1",
             "--command", "python3 -m workload.train --preset tiny steps=6 checkpoint_every=3",
             storage=root, timeout=600)
    assert r.returncode == 1
    state = json.loads((root / "runs/boom/state.json").read_text())
    assert state["state"] == "Failed" and state["restarts"] == 0
    assert "host 0-1 exited with code 3" in state["message"]
    logs = xrun("logs", "boom", storage=root).stdout
    assert ("[0-0] xrun failure: infrastructure: process 1 exited with code 3 (test failure at "
            "step 2") in logs, logs[-3000:]
    assert "[0-0] EXIT_CODE=42" in logs and "[0-1] EXIT_CODE=3" in logs, logs[-3000:]


def test_gcs_root_reads_back_through_gcs(gcs_bucket, tmp_path):
    root = f"{gcs_bucket}/runs-root"
    r = xrun("submit", "-f", str(EXAMPLE), "--name", "gcs-tiny", "--storage", root,
             "--command", "python3 -m workload.train --preset tiny steps=8 checkpoint_every=4",
             storage=root, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    logs = xrun("logs", "gcs-tiny", storage=root).stdout
    assert "[0-0] completed step: 8," in logs and "[0-1] EXIT_CODE=0" in logs
    view = json.loads(xrun("status", "gcs-tiny", "-o", "json", storage=root).stdout)
    assert view["state"] == "Succeeded" and view["step"] == 8
    assert view["latest_checkpoint"]["step"] == 8
    cks = json.loads(xrun("checkpoints", "gcs-tiny", "-o", "json", storage=root).stdout)
    assert [c["step"] for c in cks if c["state"] == "committed"] == [4, 8]
    assert not os.path.exists(tmp_path / "runs")  # nothing went to a local folder


def step_records(records):
    return sorted((r for r in records if r.get("kind") == "step" and r.get("attempt", 0) == 0),
                  key=lambda r: r["step"])


def training_goodput(gp):
    """Goodput of the span from the first step to the last: productive over the step, stall
    and between-step categories (startup and teardown left out: on a shared CI host they
    vary by seconds between identical runs, as the compile cache and the load do)."""
    cats = gp["categories"]
    span = sum(cats[k] for k in ("productive", "slow_steps", "checkpoint", "between_steps",
                                 "redone_steps", "restarts"))
    return 100.0 * cats["productive"] / span


def test_readme_runs_step_seconds_are_the_devices(readme_run):
    """Two runs of the README's file: each step's seconds are the device's (no step at a
    fraction of its neighbours because its predecessor's results were read late), the steps
    and the device's idle times between them add up to the wall time, and the two runs'
    goodput agrees (issue 50, item 3)."""
    _, store, env = readme_run
    # --replace: a rerun of this test (.ci/test.sh --reruns) finds its first try's "again"
    r = xrun("submit", "-f", str(EXAMPLE), "--name", "again", "--replace", "--follow", storage=store,
             timeout=600, **env)
    assert r.returncode == 0, r.stderr[-3000:]
    spreads = {}
    for name in ("local-tiny", "again"):
        steps = step_records(metrics(store, name))
        assert [s["step"] for s in steps] == list(range(1, 41))
        seconds = [s["seconds"] for s in steps[1:]]
        median = sorted(seconds)[len(seconds) // 2]
        walls = sorted(s["seconds"] + s["idle_s"] for s in steps[1:])  # each step's wall, idle in
        spreads[name] = 100.0 * (walls[3 * len(walls) // 4] - walls[len(walls) // 4]) / walls[len(walls) // 2]
        fast = [(s["step"], round(s["seconds"], 4)) for s in steps[1:]
                if s["seconds"] < median / 5]
        assert not fast, f"{name}: steps under a fifth of the median {median:.4f} s: {fast}"
        # Steps 2..40 and the idle time before each span step 1's end to step 40's end.
        idle = [s["idle_s"] for s in steps[1:]]
        assert all(i >= 0 for i in idle), idle
        wall = steps[-1]["time"] - steps[0]["time"]
        assert sum(seconds) + sum(idle) == pytest.approx(wall, rel=0.02)
        assert sum(idle) < wall / 2  # the device was busy most of the time
    cmp = json.loads(xrun("compare", "local-tiny", "again", "--format", "json", storage=store,
                          **env).stdout)
    a, b = training_goodput(cmp["base"]["goodput"]), training_goodput(cmp["candidate"]["goodput"])
    print(f"\ngoodput of the training span: {a:.1f}% and {b:.1f}%; overall "
          f"{cmp['base']['goodput']['goodput_pct']:.1f}% and "
          f"{cmp['candidate']['goodput']['goodput_pct']:.1f}%")
    # The 5-point target of issue 50 holds on a quiet host (65.0/66.0, 63.6/59.2); on this
    # shared 2-core CI host under load the steps' own spread moved it 9 points once and 16.6
    # once, so the check that fails on mistimed steps is the best rate's (below), this one
    # only coarse: 15 points, or twice the wider of the two runs' step spreads (interquartile
    # range of the steps' wall times over their median, in points) where the load spread the steps further than that.
    assert abs(a - b) <= max(15.0, 2 * max(spreads.values())), (a, b, spreads)
    for side in ("base", "candidate"):
        gp = cmp[side]["goodput"]
        # The best rate (a low percentile of the steps) is a real step's, not an artefact's:
        # with late reads moving time between steps it was ~0.005 s against a 0.15 s median
        # (30x). A fifth, as for each step above: under a load of 8 on the 2 cores real steps
        # spread 2.4x (0.199 s best against a 0.479 s steady step in a full run at 829ba60).
        assert gp["best_step_s"] >= gp["steady_step_s"] / 5, gp
        assert gp["categories"]["other"] == pytest.approx(0.0, abs=0.05 * gp["wall_s"]), gp
        # No fast step named an unexplained outlier: a fast one is a timing artefact.
        assert not [o for o in cmp[side].get("outliers", [])
                    if not o["slow"] and o["cause"] == "unexplained"], cmp[side]["outliers"]
