"""The soak of bench/bench_soak.py, shortened for CI (issue #53): 30 steps of the tiny run
with a forced restart every 10 (two restarts, three saves: as many as 60 every 20 had, for
half the steps), followed end to end by ``xrun submit --follow``; the follow's
RSS stays bounded, every stored log line is printed exactly once, checkpoints stay within
their retention and the final loss is the uninterrupted run's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from orchestrator.backends.local.backend import run_processes, stop_processes

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_soak.py"


def _soak(root: Path, **kw: object) -> dict:
    """bench_soak.soak under ``root``; every process of its two runs stopped after."""
    spec = importlib.util.spec_from_file_location("bench_soak", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    try:
        return bench.soak(root, **kw)
    finally:
        for name in ("ref", "soak"):
            pids = run_processes(str(root), name)
            if pids:
                stop_processes(pids, 2.0)


def test_soak_shortened(tmp_path):
    figures = _soak(tmp_path / "store", steps=30, every=10, timeout_s=600)
    assert all(figures["checks"].values()), figures
    assert figures["restarts"] == 2 and figures["stored_log_lines"] > 0


def test_soak_fast_form_with_the_jax_free_trainer(tmp_path):
    """``bench_soak.py --trainer fake`` (bench/soak_trainer.py: the workload's own lines,
    records, saves and forced restarts without JAX), the form that runs the issue's 20,000
    steps in minutes: it restarts, resumes after the saved step, and passes the same checks."""
    figures = _soak(tmp_path / "store", steps=300, every=100, timeout_s=300, trainer="fake", step_seconds=0.01)
    assert all(figures["checks"].values()), figures
    assert figures["restarts"] == 2 and figures["trainer"] == "fake"
    # Every step's line once: 300 step lines, each attempt's resumed after the last save.
    assert figures["followed_log_lines"] == figures["stored_log_lines"] >= 300
    assert figures["objects"]["checkpoint_steps"] == 3
    # Each attempt resumed after the save its restart made: no step ran twice.
    assert figures["steps_logged"] == 300 and figures["steps_redone"] == 0
