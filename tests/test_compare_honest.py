"""compare's outputs say the same thing everywhere, and only what was measured (issue 39, 5):
one verdict on every output, goodput in points, no zero for what was not measured, runs on
different shapes "not comparable" (exit 4), a shipped tree labels its run, the live
median's window says its true count, one verdict per pair in the HTML report."""

from __future__ import annotations

import json
import re

from cli_helpers import xrun
from synthetic_runs import RunShape, write_log, write_stored_run

from orchestrator.analysis.compare import Comparison, Row, RunSetComparison, compare
from orchestrator.analysis.report import Section, comparison_html, render_report
from orchestrator.readers import figures
from orchestrator.readers.loaders import load_run
from xrun_contract.errors import EXIT_NOT_COMPARABLE


def _rows(c: Comparison) -> dict[str, Row]:
    return {r.metric: r for r in c.rows}


def _screen(c: Comparison) -> str:
    from rich.console import Console

    from orchestrator.cli.screen import comparison_screen

    console = Console(record=True, width=250, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(comparison_screen(c))
    return console.export_text()


def test_goodput_differs_in_points_on_the_terminal_and_in_markdown(tmp_path):
    base = load_run(str(write_log(tmp_path / "a.log", RunShape(seed=1))))
    cand = load_run(str(write_log(tmp_path / "b.log", RunShape(seed=2, compile_s=30.0))))
    c = compare(base, cand)
    row = _rows(c)["Goodput %"]
    assert row.delta is not None and row.delta < 0 and row.delta_pct is None
    assert re.fullmatch(r"-\d+\.\d pp", row.delta_text), row.delta_text
    assert row.diff.startswith(row.delta_text + " ")
    line = next(ln for ln in _screen(c).splitlines() if ln.startswith("Goodput %"))
    assert row.delta_text in line and "%" not in line.replace("Goodput %", "")
    assert f"| {row.diff} |" in c.markdown()


def test_figures_that_were_not_measured_are_na(tmp_path):
    tiny = RunShape(seed=1, params_billions=0.000107, ckpt_every=0)
    c = compare(load_run(str(write_log(tmp_path / "a.log", tiny))),
                load_run(str(write_log(tmp_path / "b.log", RunShape(seed=2, params_billions=0.000107)))))
    rows = _rows(c)
    assert (rows["Parameters"].base, rows["Parameters"].cand) == ("n/a", "n/a")
    assert (rows["Checkpoint stall total"].base, rows["Checkpoint stall total"].cand) == ("n/a (no saves)",) * 2
    md = c.markdown()
    assert "0.000 billion" not in md and "0.000 s" not in md


def test_different_shapes_are_not_comparable_with_their_own_exit_code(tmp_path):
    root = tmp_path / "store"
    write_stored_run(root, "one", RunShape(seed=1, accelerator="cpu-1", devices=2))
    # Slower too: on one shape that would be REGRESSED (exit 1).
    write_stored_run(root, "two", RunShape(seed=2, accelerator="cpu-2", devices=4, seconds=0.3))
    r = xrun("compare", "one", "two", storage=root)
    assert r.returncode == EXIT_NOT_COMPARABLE == 4, r.stdout + r.stderr
    want = ("NOT COMPARABLE: different shapes (accelerator cpu-1 vs cpu-2; devices 2 vs 4): "
            "figures shown, no verdict on speed")
    lines = r.stdout.splitlines()
    assert lines[0] == f"**Verdict:** {want}" and lines[-1] == f"Verdict: {want}"
    assert "| Steady-state s/step (median) |" in r.stdout  # the figures are still shown
    r = xrun("compare", "one", "two", "--format", "table", storage=root)
    assert r.returncode == 4 and r.stdout.splitlines()[0] == want
    r = xrun("compare", "one", "two", "--format", "json", storage=root)
    doc = json.loads(r.stdout)
    assert r.returncode == 4 and doc["exit_code"] == 4 and doc["verdict"] == want and not doc["regressions"]
    assert doc["not_comparable"] == ["accelerator cpu-1 vs cpu-2", "devices 2 vs 4"]
    out = tmp_path / "r.html"
    r = xrun("report", "one", "two", "-o", str(out), storage=root)
    assert r.returncode == 4 and want in r.stderr
    page = out.read_text()
    assert "1 comparison(s) not comparable: different shapes" in page and 'class="verdict good"' not in page


def test_a_shipped_tree_labels_its_run(tmp_path):
    root = tmp_path / "store"
    write_stored_run(root, "base", RunShape(seed=1, commit="89b075f"), branch="main")
    write_stored_run(root, "cand", RunShape(seed=2, commit="89b075f"), branch="main")
    path = root / "runs" / "cand" / "run.json"
    run = json.loads(path.read_text())
    run["code"] = {"sha256": "ab" * 32, "files": 3,
                   "git": {"commit": "1234567890abcdef1234567890abcdef12345678", "branch": "feat/x", "dirty": True}}
    path.write_text(json.dumps(run))
    c = compare(load_run("base", str(root)), load_run("cand", str(root)))
    assert (c.base_label, c.cand_label) == ("main 89b075f", "feat/x 1234567-dirty")
    assert not any("same commit" in w for w in c.warnings)


def test_the_live_median_says_its_true_window():
    assert figures.window_text(10) == "median of the last 10 steps"
    assert figures.window_text(20) == figures.window_text(None) == figures.WINDOW_TEXT
    assert figures.window_text(500) == "median of the last 20 steps"
    from orchestrator.cli.progress import progress_parts
    from orchestrator.cli.screen import summary_lines

    view = {"state": "Running", "phase": "training", "step": 9, "total_steps": 10, "loss": 1.0,
            "tokens_per_s": 100.0, "window_steps": 10, "eta_seconds": 1.0, "latest_checkpoint": None,
            "restarts": 0, "name": "r", "message": "", "step_seconds": 0.1, "storage": "/s"}
    labels = [k for k, _ in progress_parts(view)]
    assert "tokens/s (total, 10-step median)" in labels
    assert "median of the last 10 steps: s/step" in "\n".join(summary_lines(view))


def test_a_pair_has_one_verdict_in_the_html_report(tmp_path):
    base = load_run(str(write_log(tmp_path / "a.log", RunShape(seed=1))))
    cand = load_run(str(write_log(tmp_path / "b.log", RunShape(seed=2))))
    per_step = compare(base, cand)
    assert per_step.verdict[0] == "ok"  # the first pair alone: no regression
    # The run-level comparison of the same pair (4 runs a side) regressed.
    gate = Row("Steady-state s/step (median)", "0.150", "0.180", "+0.030 (+20.0%) **regressed**",
               delta=0.03, delta_pct=20.0, verdict="regressed", gating=True, beyond_threshold=True)
    rs = RunSetComparison(per_step.base_label, per_step.cand_label, [{}] * 4, [{}] * 4, [gate], per_step, 5.0, 0.05)
    kind, line = rs.verdict
    assert kind == "regressed" and line == "REGRESSED beyond 5%: Steady-state s/step (median) +20.0%"
    page = render_report([Section("Config tiny", [base, cand], [per_step], run_sets=[rs])])
    assert f"verdict for this pair (run-level, above): {line}" in page
    assert 'class="verdict good"' not in page and "no regression" not in page
    # A verdict the nightly stated for the pair (INCOMPLETE) is the one both banners show.
    rs.stated = ("failed", "INCOMPLETE: r-3 (feat) Deleted")
    page = render_report([Section("Config tiny", [base, cand], [per_step], run_sets=[rs])])
    assert page.count("INCOMPLETE: r-3 (feat) Deleted") == 2 and "REGRESSED" not in page
    # Alone (no repeated runs), a pair's banner is its own verdict, the terminal's line.
    assert f'data-verdict="ok">{per_step.verdict[1]}</div>' in comparison_html(per_step)


def test_small_sizes_keep_their_digits():
    from orchestrator.cli.runs import _megabytes

    assert _megabytes(3_100) == "0.00310 MB" and _megabytes(12_400_000) == "12.4 MB"
