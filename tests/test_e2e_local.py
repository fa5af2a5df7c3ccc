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
    root = tmp_path / "store"
    r = xrun("submit", "-f", str(EXAMPLE), "--name", "boom", "--env", "XRUN_TEST_FAIL_AT_STEP=2:3:1",
             "--command", "python3 -m workload.train --preset tiny steps=6 checkpoint_every=3",
             storage=root, timeout=600)
    assert r.returncode == 1
    state = json.loads((root / "runs/boom/state.json").read_text())
    assert state["state"] == "Failed" and state["restarts"] == 0
    assert "host 0-1 exited with code 3" in state["message"]


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
