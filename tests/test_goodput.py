"""Goodput: a run's wall time split into startup, compilation, productive steps, checkpoint
stalls, restarts and redone steps, checked against runs whose timeline we built."""

from __future__ import annotations

import json

import pytest
from cli_helpers import xrun
from synthetic_runs import RunShape, write_log, write_stored_run

from orchestrator.analysis.goodput import CATEGORIES, format_goodput, goodput
from orchestrator.readers.loaders import load_run, read_stored_run
from xrun_contract.storage import open_storage

SHAPE = RunShape(steps=40, ckpt_every=10, stall_s=1.5, compile_s=4.0, seed=11)


def test_breakdown_of_a_run_with_a_restart(tmp_path):
    root = tmp_path / "root"
    write_stored_run(root, "r", SHAPE, submitted_at=1_000_000.0, restart_at=25)
    rec = load_run("r", str(root))
    gp = goodput(rec)
    c = gp["categories"]
    assert list(c) == list(CATEGORIES) and not gp["partial"] and gp["basis"] == "submit"
    assert c["startup"] == pytest.approx(20.0, abs=1e-6)  # submit -> first step began
    assert c["restarts"] == pytest.approx(13.0, abs=1e-6)  # failure detection + restart
    assert c["compilation"] == pytest.approx(4.0, abs=0.05)
    assert c["checkpoint"] == pytest.approx(4 * 1.5)  # saves at 10, 20 (attempt 0), 30, 40 (attempt 1)
    samples = {s["step"]: s["seconds"] for s in SHAPE.samples()}
    # Attempt 0 ran 21-25 before dying; their work was redone (the save-20 stall in step 21
    # is checkpoint time, not redone work).
    assert c["redone_steps"] == pytest.approx(sum(samples[s] for s in range(21, 26)) - 1.5, abs=1e-6)
    assert gp["steps"] == {"executed": 45, "redone": 5, "attempts": 2}
    # 3 s after the last step, of which the final save (step 40) blocked 1.5 s: teardown.
    assert c["teardown"] == pytest.approx(3.0 - 1.5, abs=1e-6) and c["other"] == pytest.approx(0, abs=1e-6)
    # Productive: the final steps at the run's best rate; slow steps the rest of their time.
    assert c["productive"] == pytest.approx(40 * gp["best_step_s"], rel=0.01)
    assert gp["best_step_s"] < gp["steady_step_s"] and c["slow_steps"] > 0
    assert sum(c.values()) == pytest.approx(gp["wall_s"])
    assert gp["wall_s"] == pytest.approx(rec.end_time - 1_000_000.0)
    assert gp["goodput_pct"] == pytest.approx(100 * c["productive"] / gp["wall_s"])
    line = format_goodput(gp)
    assert line.startswith("goodput ") and "restarts 13s" in line and "startup 20s" in line


def test_status_entry_point_matches_and_xrun_status_shows_it(tmp_path):
    root = tmp_path / "root"
    run_dir = write_stored_run(root, "st", SHAPE, submitted_at=2_000_000.0)
    assert (run_dir / "metrics").is_dir()
    gp = goodput(read_stored_run(open_storage(str(root)), "st"))  # what status reads
    assert gp["categories"] == goodput(load_run("st", str(root)))["categories"]
    r = xrun("status", "st", "-o", "json", storage=root)
    assert r.returncode == 0, r.stderr
    view = json.loads(r.stdout)
    assert view["goodput"]["categories"]["startup"] == pytest.approx(20.0)
    assert view["goodput"]["categories"] == pytest.approx(gp["categories"])
    table = xrun("status", "st", storage=root)
    assert "Goodput" in table.stdout and "productive" in table.stdout


def test_a_log_without_timestamps_gives_a_partial_breakdown(tmp_path):
    rec = load_run(str(write_log(tmp_path / "plain.log", SHAPE)))
    gp = goodput(rec)
    assert gp["partial"] and gp["basis"] == "step times only"
    c = gp["categories"]
    assert c["startup"] == 0 and c["restarts"] == 0
    assert gp["wall_s"] == pytest.approx(sum(c.values()))
    assert c["checkpoint"] == pytest.approx(4 * 1.5) and c["compilation"] == pytest.approx(4.0, abs=0.05)
    assert "step times only" in format_goodput(gp)
