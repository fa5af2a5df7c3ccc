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

import pytest
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
        # compare (and so report and nightly, which print its rows) reads the same final loss.
        cmp = json.loads(xrun("compare", "agree", "agree", "--format", "json", storage=root).stdout)
        (final,) = [row for row in cmp["rows"] if row["metric"] == "Final loss"]
        assert final["base_value"] == done["loss"], (final, done)
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
    window = [0.2 if step % 3 else 0.1 for step in range(11, 31)]
    assert fig["eta_seconds"] == pytest.approx(70 * sum(window) / 20)  # the mean: stalls count
    # A restart: the window starts at the newest attempt.
    rec.steps.append(25, 5.0, 1.0, 512 / 4 / 5.0, 1.0, attempt=1)
    rec.steps.append(26, 0.3, 1.0, 512 / 4 / 0.3, 1.0, attempt=1)
    fig = figures.progress(rec, "Running")
    assert fig["window_steps"] == 2 and re.fullmatch(r"2\.65\d*", str(fig["step_seconds"]))


# ---------------------------------------------------------------------------------------
# The live line under a PTY: the newest step read, and the time in a startup phase


def test_live_line_shows_newest_step_and_phase_time_in_a_pty(tmp_path: Path):
    """A run whose metrics lag its log by 4 steps (as the metrics chunks flush every 2 s and
    the log every second): every redraw of the pinned line shows the step of the newest
    step line printed above it, and a startup phase shows how long it has lasted."""
    import os
    import pty
    import select
    import sys

    from cli_helpers import REPO, xrun_env

    from xrun_contract import Layout, format_step_line, stamp_line

    root = tmp_path / "store"
    run_dir = write_stored_run(root, "live", RunShape(steps=2, config={"preset": "tiny", "steps": 40}))
    for c in (run_dir / "metrics").glob("*.jsonl"):
        c.unlink()
    sleeper = subprocess.Popen(["sleep", "120"])
    now = time.time()
    state = {"state": "Running", "restarts": 0, "supervisor_pid": sleeper.pid,
             "transitions": [{"time": now - 60, "state": "Running", "reason": ""}],
             "hosts": {"0-0": {"state": "Running"}, "0-1": {"state": "Running"}}}
    (run_dir / "state.json").write_text(json.dumps(state))
    seq = {"m": 0, "log": 0}

    def metrics(*recs: dict) -> None:
        (run_dir / "metrics" / f"attempt-000-{seq['m']:08d}-abcd1234.jsonl").write_text(
            "".join(json.dumps({"attempt": 0, "time": time.time(), **r}) + "\n" for r in recs))
        seq["m"] += 1

    def log(text: str) -> None:
        key = root / Layout.log_chunk("live", "0-0", 0, seq["log"], "abcd1234")
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_text(stamp_line(time.time(), text + "\n"))
        seq["log"] += 1

    metrics({"kind": "header", "versions": {"global_devices": "4"}, "total_steps": 40,
             "config": {"steps": 40}},
            {"kind": "phase", "phase": "initialized", "activity": "compiling", "seconds": 5.0,
             "time": now - 35})
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "logs", "live", "-f"],
                         stdin=slave, stdout=slave, stderr=slave, close_fds=True, cwd=REPO,
                         env={**xrun_env(root), "COLUMNS": "200"})
    os.close(slave)
    out = b""

    def read_for(seconds: float) -> None:
        nonlocal out
        end = time.time() + seconds
        while time.time() < end:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    out += os.read(master, 65536)
                except OSError:
                    return

    try:
        read_for(2.5)
        steps: list[dict] = []
        for step in range(1, 25):
            line = format_step_line(step, 0.2, 1.0, 100.0, 2048, 5.0 - step / 10)
            log(line)
            steps.append({"kind": "step", "step": step, "seconds": 0.2, "tflops_per_device": 1.0,
                          "tokens_per_s_per_device": 100.0, "total_weights": 2048,
                          "loss": 5.0 - step / 10})
            if step % 4 == 0 and step > 4:
                metrics(*steps[-8:-4])  # four steps behind the log
            read_for(0.35)
        state.update(state="Succeeded", transitions=[*state["transitions"],
                                                     {"time": time.time(), "state": "Succeeded"}])
        (run_dir / "state.json").write_text(json.dumps(state))
        p.wait(timeout=30)
        read_for(0.5)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        sleeper.kill()
        sleeper.wait()
        os.close(master)
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode("utf-8", "replace"))
    assert re.search(r"live compiling\s+for (3[5-9]|4\d)s", screen), screen[:3000]
    newest = None
    shown: list[tuple[int | None, int]] = []
    for m in re.finditer(r"completed step: (\d+),|live training .*?step (\d+)/40", screen):
        if m[1]:
            newest = int(m[1])
        elif newest is not None:
            shown.append((newest, int(m[2])))
    assert len(shown) >= 10, screen[-3000:]
    assert all(s == n for n, s in shown), shown


# ---------------------------------------------------------------------------------------
# Goodput


def test_goodput_categories_sum_to_wall_and_a_slower_branch_is_never_improved(tmp_path: Path):
    from orchestrator.analysis.compare import compare, compare_runs
    from orchestrator.analysis.goodput import goodput
    from orchestrator.readers.loaders import load_run

    root = tmp_path / "store"
    base, cand = [], []
    for seed in range(4):
        for branch, secs, out in (("main", 0.15, base), ("slow", 0.54, cand)):
            name = f"{branch}-{seed}"
            write_stored_run(root, name, RunShape(steps=40, seconds=secs, jitter=0.01 * secs, seed=seed,
                                                  ckpt_every=10, stall_s=1.0), branch=branch,
                             submitted_at=1_000_000.0 + seed)
            out.append(load_run(name, str(root)))
    for rec in base + cand:
        gp = goodput(rec)
        c = gp["categories"]
        assert sum(c.values()) == pytest.approx(gp["wall_s"], rel=1e-6)
        assert c["other"] < 0.05 * gp["wall_s"], c  # every second named
        assert c["productive"] <= 40 * gp["best_step_s"] * 1.0001
    # Each slow run's goodput share is higher (the same 20 s startup in a longer run) ...
    assert min(goodput(r)["goodput_pct"] for r in cand) > max(goodput(r)["goodput_pct"] for r in base)
    runs = compare_runs(base, cand)
    row = next(r for r in runs.rows if r.metric == "Goodput %")
    steady = next(r for r in runs.rows if r.metric.startswith("Steady-state"))
    # ... but the branch is 3.6x slower: never "improved".
    assert steady.verdict == "regressed" and row.verdict == "not improved", (steady.diff, row.diff)
    assert "steps are slower" in row.diff
    single = next(r for r in compare(base[0], cand[0]).rows if r.metric == "Goodput %")
    assert single.verdict == "not improved"
    # The faster branch against the slower one may improve (no guard the other way).
    back = next(r for r in compare_runs(cand, base).rows if r.metric == "Goodput %")
    assert back.verdict != "not improved"


def test_the_compile_wait_is_one_named_segment_and_counted_as_compilation(tmp_path: Path):
    """Segments plus the named wait sum to the time to the first step (within 2%); the wait
    for the compile is a segment once, and goodput counts it as compilation, not startup."""
    from orchestrator.analysis.goodput import format_startup, goodput
    from orchestrator.readers.loaders import load_run

    root = tmp_path / "store"
    run_dir = write_stored_run(root, "st", RunShape(steps=20), submitted_at=1_000_000.0)
    start = 1_000_020.0  # write_stored_run: the process starts 20 s after submit
    first = start + RunShape(steps=20).samples()[0]["seconds"]
    phases = [("process_start", 0.0, None), ("imports", 0.5, None), ("distributed", 1.0, None),
              ("checkpoint_manager", 1.2, None), ("initialized", 1.5, None),
              ("compiled", 3.5, 1.1), ("first_step", first - start, None)]
    extra = [{"kind": "phase", "phase": ph, "activity": "", "seconds": sec, "time": start + sec,
              "attempt": 0, **({"began": began} if began is not None else {})} for ph, sec, began in phases]
    (run_dir / "metrics" / "attempt-000-00000009.jsonl").write_text("".join(json.dumps(r) + "\n" for r in extra))
    rec = load_run("st", str(root))
    gp = goodput(rec)
    (timeline,) = gp["startup_timeline"]
    names = [s["name"] for s in timeline["segments"]]
    assert names.count("waiting for compile") == 1 and "compile" not in names
    assert sum(s["seconds"] for s in timeline["segments"]) == pytest.approx(timeline["to_first_step_s"], rel=0.02)
    wait = next(s["seconds"] for s in timeline["segments"] if s["name"] == "waiting for compile")
    assert wait == pytest.approx(2.0)
    assert gp["categories"]["compilation"] >= wait and gp["categories"]["startup"] == pytest.approx(20.0 - wait)
    assert sum(gp["categories"].values()) == pytest.approx(gp["wall_s"])
    assert "waiting for compile 2.0s" in format_startup(timeline) and "waited" not in format_startup(timeline)


# ---------------------------------------------------------------------------------------
# The smaller defects (#31 item 8), each against the real CLI or the real reader


def _in_pty(root: Path, *args: str, columns: int = 200) -> str:
    import os
    import pty
    import select
    import sys

    from cli_helpers import REPO, xrun_env

    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], stdin=slave, stdout=slave,
                         stderr=slave, close_fds=True, cwd=REPO, env={**xrun_env(root), "COLUMNS": str(columns)})
    os.close(slave)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 30)
            try:
                chunk = os.read(master, 65536) if ready else b""
            except OSError:
                chunk = b""
            if not chunk:
                break
            out += chunk
    finally:
        p.wait(timeout=30)
        os.close(master)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode("utf-8", "replace")).replace("\r", "")


def test_logs_tail_counts_shown_lines_and_torn_gloo_lines_are_quiet(tmp_path: Path):
    from orchestrator.cli.progress import LineFilter
    from xrun_contract import Layout, stamp_line

    root = tmp_path / "store"
    write_stored_run(root, "tl", RunShape(steps=5))
    now = time.time()
    lines = []
    for i in range(10):
        lines += [f"useful {i}",
                  "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1",
                  "I1203 10:39:13.123456 123 file.cc:12] chatter"]
    lines += ["[Glo", "oo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1"]
    d = root / Layout.host_logs("tl", "0-0", 0)
    d.mkdir(parents=True)
    (d / "00000000.log").write_text("".join(stamp_line(now - 100 + i, x + "\n") for i, x in enumerate(lines)))
    screen = _in_pty(root, "logs", "tl", "--tail", "4")
    shown = [ln for ln in screen.splitlines() if ln.strip()]
    assert [ln.split()[-1] for ln in shown] == ["6", "7", "8", "9"], shown
    assert "peer ranks" not in screen and "[Glo" not in screen
    keep = LineFilter().keep
    assert not keep("oo] Rank 1 is connected to 1 peer ranks.") and keep("completed step: 3, loss: 2")
    r = xrun("logs", "tl", "--tail", "2", storage=root)  # piped: every line as stored
    assert r.stdout.splitlines()[-1].endswith("peer ranks is : 1")


def test_checkpoint_paths_whole_when_piped_and_deleted_hosts_not_failed(tmp_path: Path):
    root = tmp_path / "store"
    run_dir = write_stored_run(root, "a-rather-long-run-name-for-paths", RunShape(steps=5))
    (run_dir / "checkpoints" / "5" / "state").mkdir(parents=True)
    (run_dir / "checkpoints" / "5" / "state" / "data").write_text("x")
    r = xrun("checkpoints", "a-rather-long-run-name-for-paths", storage=root, COLUMNS="60")
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout and str(run_dir / "checkpoints" / "5") in r.stdout
    state = json.loads((run_dir / "state.json").read_text())
    state.update(state="Deleted", hosts={"0-0": {"state": "Failed", "exit_code": 143},
                                         "0-1": {"state": "Failed", "exit_code": 1}})
    (run_dir / "state.json").write_text(json.dumps(state))
    view = json.loads(xrun("status", "a-rather-long-run-name-for-paths", "-o", "json", storage=root).stdout)
    hosts = {h["host"]: h for h in view["hosts"]}
    assert hosts["0-0"]["state"] == "Deleted" and "xrun delete" in hosts["0-0"]["reason"]
    assert hosts["0-1"]["state"] == "Failed"  # a real failure stays one


def test_report_exit_reason_single_run_title_commit_and_history_one_night(tmp_path: Path):
    from synthetic_runs import write_log

    from orchestrator.analysis.history import Night, trend_text
    from orchestrator.readers.record import RunRecord, short_commit

    main = write_log(tmp_path / "main.log", RunShape(seed=1))
    slow = write_log(tmp_path / "slow.log", RunShape(seconds=0.2, seed=2))
    out = tmp_path / "r.html"
    r = xrun("report", str(main), str(slow), "-o", str(out), storage=tmp_path / "store")
    assert r.returncode == 1 and "REGRESSED" in r.stderr and "Steady-state s/step" in r.stderr, r.stderr
    r = xrun("report", str(main), "-o", str(out), storage=tmp_path / "store")
    assert r.returncode == 0 and "<title>xrun run report" in out.read_text()
    assert "comparison" not in out.read_text().split("<title>")[1].split("</title>")[0]
    assert short_commit("574ad3fb9") == "574ad3fb9" and short_commit("a" * 40) == "a" * 7
    assert RunRecord(branch="main", commit="574ad3fb9").label == "main 574ad3fb9"
    one = [Night("2026-01-02-030000", "2026-01-02", "574ad3fb9", values=[1.0, 1.1, 1.0, 1.05])]
    text = trend_text(one, "steady_s_per_step", "main", [])
    assert "needs a second night" in text and "repeats" not in text and "574ad3fb9" in text


def test_tensorboard_names_each_run_by_its_name(tmp_path: Path):
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    from workload.tensorboard import EventWriter
    from xrun_contract.storage import open_storage

    store = open_storage(str(tmp_path))
    w = EventWriter(store, "tb-run", attempt=0, interval=3600)
    w.scalars(1, {"learning/loss": 2.0})
    w.close()
    mux = EventMultiplexer().AddRunsFromDirectory(str(tmp_path / "runs"))
    mux.Reload()
    assert list(mux.Runs()) == ["tb-run"]


# ---------------------------------------------------------------------------------------
# Real MaxText logs (tests/data/maxtext): glued lines, a stall after step 0, the stall that
# decides Avg s/step


def test_maxtext_comparison_names_the_deciding_stall_with_glued_lines(tmp_path: Path):
    from synthetic_runs import glue

    from orchestrator.analysis.compare import compare
    from orchestrator.analysis.compare import figures as run_figures
    from orchestrator.analysis.report import comparison_html
    from orchestrator.analysis.stats import median_ci
    from orchestrator.cli.screen import comparison_screen
    from orchestrator.readers.loaders import read_log_file

    data = Path(__file__).parent / "data" / "maxtext"
    # Every 3 lines glued into one (what a shipper that loses newlines does): the XPK Start
    # line is glued to the MaxText lines after it.
    for name in ("xpk.log", "save-stall.log"):
        (tmp_path / name).write_text("\n".join(glue((data / name).read_text().splitlines())) + "\n")
    xpk, stall = read_log_file(tmp_path / "xpk.log"), read_log_file(tmp_path / "save-stall.log")
    clean = read_log_file(data / "xpk.log")
    # Time to first step counts from XPK Start, glued or not; no note quotes a glued line.
    assert xpk.start_basis == "XPK Start" and xpk.start_time == clean.start_time
    assert run_figures(xpk).time_to_first_step == pytest.approx(run_figures(clean).time_to_first_step)
    for rec in (xpk, stall):
        assert all(len(n) <= 200 and "not understood" not in n for n in rec.notes), rec.notes
    # Save 0's stall lands in step 1 (3.765 s): out of steady state with the other absorbing
    # steps and the steps the device ran during them; the CI holds no stall step.
    fig = run_figures(stall)
    steady = [st for st, ok in zip(stall.steps.step, stall.steady_mask(3), strict=True) if ok]
    assert not {1, 2, 3, 6, 7, 8, 11, 12, 13, 16, 17, 18} & set(steady)
    lo, hi = median_ci(fig.steady_seconds)
    assert lo > 1.0 and hi < 3.0 and max(fig.steady_seconds) < 3.0
    # Every save's stall (its wait for the previous save included), save 0's too.
    assert fig.stall_total == pytest.approx(0.09 + 3.66 + 6.05 + 5.25 + 8.67, abs=0.02)
    c = compare(xpk, stall)
    (decider,) = [w for w in c.warnings if w.startswith("Avg s/step differs by")]
    assert "step 11 took 10.8 s waiting for the previous checkpoint save" in decider, decider
    assert "save-stall" in decider
    from rich.console import Console

    console = Console(record=True, width=200, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(comparison_screen(c))
    assert "step 11 took 10.8 s" in console.export_text()
    assert "step 11 took 10.8 s" in comparison_html(c)


def test_report_charts_learning_rate_grad_norm_and_captions_say_what_is_shown(tmp_path: Path):
    from orchestrator.analysis.compare import compare
    from orchestrator.analysis.report import log_ticks, report_for
    from orchestrator.readers.loaders import load_run

    root = tmp_path / "store"
    for name, seed in (("a", 1), ("b", 2)):
        run_dir = write_stored_run(root, name, RunShape(steps=30, seed=seed, ckpt_every=10, stall_s=3.0))
        for c in (run_dir / "metrics").glob("*.jsonl"):
            recs = [json.loads(ln) for ln in c.read_text().splitlines()]
            for r in recs:
                if r["kind"] == "step":
                    r.update(grad_norm=1.0 / r["step"], learning_rate=1e-3 * min(1.0, r["step"] / 10))
            c.write_text("".join(json.dumps(r) + "\n" for r in recs))
    a, b = load_run("a", str(root)), load_run("b", str(root))
    assert a.extra["learning_rate"][1][-1] == pytest.approx(1e-3)
    page = report_for(a, [b], [compare(a, b)])
    ids = re.findall(r'<div class="plot" id="([a-z]+)-0"', page)
    assert ids == ["loss", "steptime", "tokens", "lr", "gradnorm", "goodput"]
    assert "Learning rate" in page and "Gradient norm" in page and '"hovermode":"x unified"' in page
    # The step-time caption says what the zoomed axis leaves out (compilation, stalls).
    cap = re.search(r"Seconds of every executed step of 2 run\(s\).*?</figcaption>", page)[0]
    assert re.search(r"The y axis shows 0–0\.4\d* s \(3x the slowest run's median step\): \d+ step\(s\) above", cap)
    assert log_ticks([0.13, 26.6]) == ([0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0],
                                       ["0.1", "0.2", "0.5", "1", "2", "5", "10", "20", "50"])


def test_the_eta_counts_the_windows_stalls():
    """#39: the ETA from the window's mean step time: a save's stall in the window comes again
    (the median, kind to it, made the ETA too kind); tokens/s stays the median's."""
    rec = RunRecord(devices=1, total_steps=100)
    for step in range(1, 21):
        sec = 2.2 if step == 10 else 0.2  # one step held 2 s by a save
        rec.steps.append(step, sec, 1.0, 512 / sec, 1.0)
    fig = figures.progress(rec, "Running")
    assert fig["step_seconds"] == 0.2 and fig["tokens_per_s"] == 512 / 0.2
    assert fig["eta_step_seconds"] == pytest.approx(0.3)
    assert fig["eta_seconds"] == pytest.approx(80 * 0.3)


def test_the_pinned_line_fits_80_columns():
    """#39: at 80 columns the pinned line wrapped (a wrapped live line is redrawn as two)."""
    from orchestrator.cli.progress import rich_progress

    view = {"name": "local-tiny", "state": "Running", "phase": "training", "step": 37,
            "total_steps": 40, "loss": 7.123456, "tokens_per_s": 3530.2, "window_steps": 20,
            "eta_seconds": 12.0, "latest_checkpoint": {"step": 30},
            "checkpoints_in_progress": [35], "restarts": 1}
    wide = rich_progress(view).plain
    assert len(wide) > 80  # what it used to print at any width
    for columns in (200, 120, 80, 60, 40):
        line = rich_progress(view, columns=columns).plain
        assert len(line) <= columns, (columns, line)
        assert "\n" not in line and line.startswith("local-tiny training")
    assert rich_progress(view, columns=200).plain == wide
    fit = rich_progress(view, columns=80).plain
    assert "step 37/40" in fit and "ETA 12s" in fit, fit
