"""Figures that add up (#31): one definition of step, loss, tokens/s and ETA, the same in
`list`, `status` and the follow's progress line; goodput that names where the time went.

The runs are written straight into a storage folder in xrun's own layout (metrics chunks
as the workload writes them: the last chunk of a finished run holds only its end record);
a "running" run has a live supervisor pid (a `sleep` this test starts and stops).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from cli_helpers import xrun, xrun_popen
from synthetic_runs import RunShape, write_stored_run

from orchestrator.readers import figures
from orchestrator.readers.record import RunRecord


def _rechunk(run_dir: Path, running: bool) -> list[dict]:
    """The run's metrics as the workload chunks them: header and 3 steps, the other steps,
    the end record alone (dropped while running)."""
    chunks = sorted((run_dir / "metrics").glob("*.jsonl"))
    records = [json.loads(ln) for c in chunks for ln in c.read_text().splitlines()]
    for c in chunks:
        c.unlink()
    end = [r for r in records if r["kind"] == "end"]
    body = [r for r in records if r["kind"] != "end"]
    cut = [i for i, r in enumerate(body) if r["kind"] == "step"][2] + 1
    parts = [body[:cut], body[cut:]] + ([] if running else [end])
    for i, part in enumerate(parts):
        (run_dir / "metrics" / f"attempt-000-{i:08d}-abcd1234.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in part))
    return body


def _progress_line_figures(line: str) -> dict[str, str]:
    """'xrun: NAME phase | step 40/100 | loss 1.2 | ...' -> {'step': '40/100', ...}."""
    out = {}
    for part in line.split(" | ")[1:]:
        key, _, value = part.rpartition(" ")
        out[key] = value
    return out


def _agree(root: Path, name: str, progress_line: str) -> dict:
    (listed,) = [r for r in json.loads(xrun("list", "-o", "json", storage=root).stdout) if r["name"] == name]
    view = json.loads(xrun("status", name, "-o", "json", storage=root).stdout)
    shown = _progress_line_figures(progress_line)
    assert listed["step"] == view["step"] and listed["loss"] == view["loss"], (listed, view)
    assert shown["step"] == f"{view['step']}/{view['total_steps']}", (shown, view)
    assert float(shown["loss"]) == float(f"{view['loss']:.5g}"), (shown, view)
    tokens = shown[f"tokens/s (total, {figures.WINDOW}-step median)"]
    assert float(tokens.replace(",", "")) == round(view["tokens_per_s"]), (shown, view)
    table = xrun("list", storage=root).stdout
    row = next(ln.split() for ln in table.splitlines() if ln.split()[:1] == [name])
    assert row[2] == shown["step"]
    return view


def test_list_status_and_follow_agree_running_and_finished(tmp_path: Path):
    root = tmp_path / "store"
    shape = RunShape(steps=30, config={"preset": "tiny", "steps": 30}, ckpt_every=10, stall_s=2.0)
    run_dir = write_stored_run(root, "agree", shape, state="Running")
    body = _rechunk(run_dir, running=True)
    sleeper = subprocess.Popen(["sleep", "120"])  # the run's "supervisor" while it runs
    follow = None
    try:
        state = json.loads((run_dir / "state.json").read_text())
        done_transitions = state["transitions"]
        state.update(state="Running", supervisor_pid=sleeper.pid,
                     transitions=[t for t in done_transitions if t["state"] != "Running"][:0]
                     + done_transitions[:1])
        (run_dir / "state.json").write_text(json.dumps(state))
        follow = xrun_popen("logs", "agree", "-f", "--progress-interval", "0.5", storage=root)
        deadline = time.time() + 30
        assert follow.stderr is not None
        running_line = ""
        while time.time() < deadline and not running_line:
            ln = follow.stderr.readline()
            if ln.startswith("xrun: agree "):
                running_line = ln.strip()
        assert running_line, "no progress line"
        view = _agree(root, "agree", running_line)
        last = [r for r in body if r["kind"] == "step"][-1]
        assert view["step"] == last["step"] == 30 and view["eta_seconds"] == 0
        # The last 20 steps' median, not the last step's: a stall never moves it.
        secs = sorted(r["seconds"] for r in body if r["kind"] == "step")
        assert view["step_seconds"] < 2 * shape.seconds and view["last_step_seconds"] is not None
        assert secs[-1] > 2.0  # (there was a stall to ignore)
        # It finishes: the end record arrives alone in its chunk, state.json says so.
        end = {"kind": "end", "time": time.time(), "attempt": 0, "exit_code": 0, "reason": "Succeeded"}
        (run_dir / "metrics" / "attempt-000-00000002-abcd1234.jsonl").write_text(json.dumps(end) + "\n")
        state.update(state="Succeeded", transitions=done_transitions)
        (run_dir / "state.json").write_text(json.dumps(state))
        follow.wait(timeout=30)
        lines = [ln for ln in follow.stderr.read().splitlines() if ln.startswith("xrun: agree ")]
        final_line = (lines or [running_line])[-1]
        done = _agree(root, "agree", final_line)
        assert done["state"] == "Succeeded" and done["step"] == 30 and done["eta_seconds"] is None
        r = xrun("logs", "agree", "-f", storage=root)  # a finished run: one progress line
        (finished,) = [ln for ln in r.stderr.splitlines() if ln.startswith("xrun: agree ")]
        assert finished.startswith("xrun: agree succeeded | step 30/30")
        _agree(root, "agree", finished)
    finally:
        if follow is not None and follow.poll() is None:
            follow.kill()
            follow.wait()
        sleeper.kill()
        sleeper.wait()


def test_live_figures_are_the_window_median():
    """tokens/s is what the window's median step implies, not the last step's."""
    rec = RunRecord(devices=4, total_steps=100)
    for step in range(1, 31):
        sec = 0.2 if step % 3 else 0.1  # alternating rates: the last step's is not the median
        rec.steps.append(step, sec, 1.0, 512 / 4 / sec, 1.0)
    fig = figures.progress(rec, "Running")
    assert fig["step_seconds"] == 0.2 and fig["window_steps"] == figures.WINDOW
    assert fig["tokens_per_s"] == 512 / 0.2
    assert fig["last_step_seconds"] == 0.1 and fig["last_tokens_per_s"] == 512 / 0.1
    assert fig["eta_seconds"] == 70 * 0.2
    # A restart: the window starts at the newest attempt.
    rec.steps.append(25, 5.0, 1.0, 512 / 4 / 5.0, 1.0, attempt=1)
    rec.steps.append(26, 0.3, 1.0, 512 / 4 / 0.3, 1.0, attempt=1)
    fig = figures.progress(rec, "Running")
    assert fig["window_steps"] == 2 and re.fullmatch(r"2\.65\d*", str(fig["step_seconds"]))
