"""The parser and `xrun compare` on real MaxText 0.2.5 / Orbax 0.12.8 logs (tests/data/maxtext,
made by make_logs.sh; every figure below is read off the files, see README.md and LINES.md
there): checkpoint waits, the step that absorbed each stall (one-step buffering), the stall
total, the three-line TFLOPs block, the restore, XPK's start/end lines and exit code."""

from __future__ import annotations

import calendar
import datetime as dt
import json
import random
import statistics
from pathlib import Path

import pytest
from cli_helpers import xrun

from orchestrator.analysis.compare import compare, figures
from orchestrator.analysis.goodput import goodput
from orchestrator.readers.loaders import load_run, read_log_file
from orchestrator.readers.logparse import LogParser

DATA = Path(__file__).parent / "data" / "maxtext"
STALL, RESUME, XPK = DATA / "save-stall.log", DATA / "resume.log", DATA / "xpk.log"

# README.md, table "save-stall.log": Orbax's "Waiting for previous save to complete took N
# seconds" per save step, and the step line that absorbed each save.
WAITS = {5: 3.64, 10: 6.02, 15: 5.21, 19: 8.62}
ABSORBING = {5: (6, 8.759), 10: (11, 10.751), 15: (16, 9.693)}
# "Finished blocking save in N seconds" (includes the wait) per save: 0, 5, 10, 15, 19.
BLOCKING = {0: 0.09, 5: 3.66, 10: 6.05, 15: 5.25, 19: 8.67}


def events(rec, kind: str) -> dict[int, float]:
    return {e["step"]: e["seconds"] for e in rec.checkpoints if e["event"] == kind}


def by_metric(c) -> dict:
    return {r.metric: r for r in c.rows}


@pytest.fixture(scope="module")
def stall():
    return read_log_file(STALL)


@pytest.fixture(scope="module")
def resume():
    return read_log_file(RESUME)


def test_the_save_stall_log_reads_every_wait_and_the_step_that_absorbed_it(stall):
    assert stall.steps.count == 20 and list(stall.steps.step) == list(range(20))  # 0-based
    waited = events(stall, "waited")
    assert {k: round(v, 2) for k, v in waited.items() if v > 1} == WAITS
    assert waited[0] < 1e-3  # the statistics dict has the wait of every save, also save 0's
    # Orbax's blocking time is its wait plus the device-to-host copy: per save, the sum of
    # our two events is its "Finished blocking save in N seconds".
    blocked = events(stall, "blocked")
    for step, seconds in BLOCKING.items():
        assert waited[step] + blocked[step] == pytest.approx(seconds, abs=0.011), step
    assert stall.checkpoint_totals["saves"] == 5
    assert stall.checkpoint_totals["waited"] + stall.checkpoint_totals["blocked"] == \
        pytest.approx(sum(BLOCKING.values()), abs=0.03)
    # Each stall sits in step k+1's seconds, although in the file the wait comes before the
    # line of step k-1 (one-step buffering): attributed by number, not position.
    seconds = dict(zip(stall.steps.step, stall.steps.seconds, strict=True))
    for save, (step, took) in ABSORBING.items():
        assert seconds[step] == pytest.approx(took)
        assert stall.absorbed_stalls[(0, step)] == pytest.approx(waited[save] + blocked[save])
        assert all(e.get("absorbed_by") == step for e in stall.checkpoints
                   if e["step"] == save and e["event"] in ("waited", "blocked"))
    text = STALL.read_text().splitlines()
    wait_line = next(i for i, ln in enumerate(text) if "took 3.640194 seconds" in ln)
    first_after = next(ln for ln in text[wait_line:] if "completed step:" in ln)
    assert "completed step: 4," in first_after  # the next step line is not the absorbing one
    # The final save (19) waited 8.62 s after every step: no step line holds it.
    assert (0, 20) in stall.absorbed_stalls and 20 not in seconds
    assert events(stall, "committed") == {0: 18.83, 5: 22.65, 10: 26.15, 15: 24.17, 19: 25.59}


def test_steady_state_leaves_out_the_absorbing_steps_and_the_stall_total_is_right(stall):
    steady = [s for s, ok in zip(stall.steps.step, stall.steady_mask(3), strict=True) if ok]
    # Out: the steps that absorbed a stall (1, 6, 11, 16) and the two after each, which the
    # device ran during the stall (0.008 s) and which caught up (3.7 s, two steps' work).
    assert steady == [4, 5, 9, 10, 14, 15, 19]
    fig = figures(stall)
    assert fig.stall_total == pytest.approx(23.725, abs=0.005)
    assert sorted(round(s, 2) for s in fig.stall_events) == [0.09, 3.66, 5.25, 6.05, 8.67]
    # Only the stalls some step absorbed are inside step time (save 19's is not).
    assert fig.stall_in_steps == pytest.approx(23.725 - 8.668, abs=0.005)
    assert fig.steady_median == pytest.approx(statistics.median(
        [s for st, s in zip(stall.steps.step, stall.steps.seconds, strict=True) if st in steady]))
    gp = goodput(stall)
    assert gp["categories"]["checkpoint"] == pytest.approx(23.725, abs=0.005)
    assert not gp["partial"] and gp["wall_s"] == pytest.approx(stall.log_last_time - stall.log_first_time)


def test_the_run_facts_of_a_maxtext_log(stall):
    assert stall.flops == {"tflops_per_step": 0.02, "learnable_pct": 97.93, "attention_pct": 2.07}
    assert stall.params == pytest.approx(0.021e9) and stall.params_text == "0.021 billion"
    assert (stall.jax, stall.jaxlib, stall.backend) == ("0.12.0.1", "0.12.0.1", "cpu")
    assert stall.checkpoints_found == 0 and stall.exit_code is None  # no wrapper: unknown
    # MaxText's "Waited N seconds for step k" (the device finishing step k) is kept, apart.
    assert round(events(stall, "device_wait")[5], 2) == 5.06


def test_the_resumed_run_restores_step_19_and_trains_from_20(resume):
    assert resume.checkpoints_found == 5
    restored = [e for e in resume.checkpoints if e["event"] == "restored"]
    assert [(e["step"], round(e["seconds"], 2)) for e in restored] == [(19, 1.76)]
    assert list(resume.steps.step) == [20, 21, 22, 23, 24, 25]
    assert set(resume.steps.attempt) == {0} and not resume.notes  # a resume, not a restart
    assert round(events(resume, "waited")[25], 2) == 4.99
    fig = figures(resume)
    assert fig.final_step == 25 and fig.steps_distinct == 6
    assert fig.stall_in_steps == pytest.approx(events(resume, "waited")[20] + events(resume, "blocked")[20])


def test_xpk_start_end_and_exit_code_give_time_to_first_step_and_goodput():
    rec = read_log_file(XPK)
    utc = dict(tzinfo=dt.UTC)
    assert rec.start_time == dt.datetime(2026, 12, 3, 10, 3, 56, **utc).timestamp()
    assert rec.end_time == dt.datetime(2026, 12, 3, 10, 5, 11, **utc).timestamp()
    assert rec.start_basis == "XPK Start" and rec.exit_code == 0 and rec.finished
    assert list(rec.steps.step) == list(range(10))
    first_line = next(ln for ln in XPK.read_text().splitlines() if "completed step: 0," in ln)
    t = dt.datetime.strptime("2026" + first_line[1:21], "%Y%m%d %H:%M:%S.%f")
    fig = figures(rec)
    assert fig.ttfs_basis == "from XPK Start"
    assert fig.time_to_first_step == pytest.approx(calendar.timegm(t.timetuple()) + t.microsecond / 1e6
                                                   - rec.start_time)
    gp = fig.goodput
    assert gp["basis"] == "XPK Start" and gp["wall_s"] == 75.0 and not gp["partial"]
    assert 0 < gp["goodput_pct"] < 100 and gp["categories"]["startup"] == pytest.approx(
        fig.time_to_first_step - rec.steps.seconds[0], abs=1e-6)


def test_pieces_glue_and_host_prefixes_do_not_change_the_reading(stall):
    text = STALL.read_text()
    rng = random.Random(4)
    p = LogParser(year=2026)
    i = 0
    while i < len(text):
        n = rng.randint(1, 5000)
        p.feed(text[i:i + n])
        i += n
    pieces = p.finish()
    assert list(pieces.steps.rows()) == list(stall.steps.rows())
    assert pieces.checkpoint_totals == stall.checkpoint_totals
    assert pieces.absorbed_stalls == stall.absorbed_stalls and pieces.flops == stall.flops
    p = LogParser(year=2026)
    p.feed("".join(f"[0-0] {ln}\n" for ln in text.splitlines()))
    prefixed = p.finish()
    assert prefixed.absorbed_stalls == stall.absorbed_stalls and prefixed.flops == stall.flops


def test_compare_flags_the_stall_dominated_avg_step_time(tmp_path):
    c = compare(load_run(str(STALL)), load_run(str(RESUME)))
    rows = by_metric(c)
    assert rows["Checkpoint stall total"].base == "23.725 s"
    assert any(w.startswith("'Avg s/step' of save-stall (3.462) is dominated by checkpoint stalls")
               for w in c.warnings), c.warnings
    assert "n=19/5 steps after the first" in rows["Avg s/step"].diff
    # The familiar rows mean what MaxText's reports mean: the last step's line, the mean.
    assert rows["TFLOP/s"].base == "0.009" and rows["Tok/s"].base == "117.6"  # step 19's line
    assert rows["Avg s/step"].base_value == pytest.approx(
        statistics.fmean(list(c.base.steps.seconds)[1:]))
    # Against the XPK run the mean says "worse" while the steady-state median says "better".
    x = compare(load_run(str(XPK)), load_run(str(STALL)))
    assert any(w.startswith("'Avg s/step' says save-stall is worse (+29.2%) but the steady-state "
                            "median says better") for w in x.warnings), x.warnings
    md = x.markdown()
    assert md.index("'Avg s/step' says") < md.index("| Metric |")


def test_labels_from_the_command_line_and_jax_versions_from_system_information(tmp_path):
    storage = tmp_path / "root"
    r = xrun("compare", str(STALL), str(RESUME), "--label-a", "main@574ad3fb9",
             "--label-b", "feat/x@574ad3fb9", "--format", "json", storage=storage)
    d = json.loads(r.stdout)
    assert (d["base"]["label"], d["candidate"]["label"]) == ("main 574ad3fb9", "feat/x 574ad3fb9")
    assert any("same commit 574ad3fb9 on both sides" in w for w in d["warnings"])
    r = xrun("compare", str(STALL), str(RESUME), "--label-a", "main@574ad3fb9",
             "--label-b", "feat/x@def456", storage=storage)
    header = next(ln for ln in r.stdout.splitlines() if ln.startswith("| Metric"))
    assert header.startswith("| Metric | main 574ad3fb9 | feat/x def456 |")
    assert "same commit" not in r.stdout
    # Another JAX on one side, from its "System Information" lines (a copy with them edited).
    other = tmp_path / "resume-jax.log"
    other.write_text(RESUME.read_text().replace("Jax Version: 0.12.0.1", "Jax Version: 0.11.3")
                     .replace("Jax Backend: cpu", "Jax Backend: PJRT C API 0.59"))
    c = compare(load_run(str(STALL)), load_run(str(other)))
    assert any("different JAX: save-stall ran 0.12.0.1, resume-jax ran 0.11.3" in w for w in c.warnings)
    assert any("different JAX backends: save-stall ran cpu, resume-jax ran PJRT C API 0.59" in w
               for w in c.warnings)


@pytest.mark.parametrize("option, value", [("--label-a", "main@not-hex"), ("--label-b", "a b"),
                                           ("--label-a", "@"), ("--label-b", "feat..x@abc123")])
def test_a_bad_label_is_bad_input(tmp_path, option, value):
    out = tmp_path / "out.md"
    r = xrun("compare", str(STALL), str(RESUME), option, value, "-o", str(out), storage=tmp_path / "root")
    assert r.returncode == 2 and r.stdout == "" and not out.exists()
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "branch@commit" in lines[0], r.stderr


def test_older_orbax_wordings_read_the_same_way():
    """Orbax releases before the event-tracking lines logged a save from
    AsyncCheckpointer._save() (checkpoint/orbax/checkpoint/_src/checkpointers/
    async_checkpointer.py): "[process=N] Started async saving checkpoint to DIR.", "Finished
    blocking save in N seconds. Continuing to save asynchronously to DIR." (its timer starts
    before wait_until_finished(), so the wait is inside), and the commit as "Finished
    async_save (blocking + background). Time taken: Ns. directory=DIR" (the form
    GoogleCloudPlatform/ml-auto-solutions greps for); Checkpointer.restore() logs
    "Restoring checkpoint from DIR."."""
    prefix = "I0105 10:00:{:02d}.000000 1 {}] "
    lines = [
        prefix.format(0, "checkpointer.py:200") + "Restoring checkpoint from gs://b/run/checkpoints/40.",
        prefix.format(1, "metric_logger.py:265") + "completed step: 41, seconds: 9.000, TFLOP/s/device: 1.0, "
        "Tokens/s/device: 10.0, total_weights: 8, loss: 3.0",
        prefix.format(2, "checkpoint_manager.py:1408") + "[process=0] Saving checkpoint at step 50",
        prefix.format(2, "async_checkpointer.py:439") + "[process=0] Started async saving checkpoint to "
        "gs://b/run/checkpoints/50.",
        prefix.format(9, "async_checkpointer.py:470") + "Finished blocking save in 7.25 seconds. Continuing "
        "to save asynchronously to gs://b/run/checkpoints/50.",
        prefix.format(30, "async_checkpointer.py:300") + "Finished async_save (blocking + background). "
        "Time taken: 28.161461s. directory=gs://b/run/checkpoints/50",
        prefix.format(40, "checkpoint_manager.py:1408") + "[process=0] Saving checkpoint at step 60",
        prefix.format(40, "async_checkpointer.py:470") + "Finished blocking save. Time taken: 1.50s. "
        "Continuing background save to gs://b/run/checkpoints/60.",
    ]
    p = LogParser(year=2026)
    p.feed("\n".join(lines) + "\n")
    rec = p.finish()
    assert [(e["event"], e["step"]) for e in rec.checkpoints][:4] == [
        ("restored", 40), ("started", 50), ("blocked", 50), ("committed", 50)]
    assert events(rec, "blocked")[50] == 7.25 and events(rec, "committed")[50] == pytest.approx(28.161461)
    assert rec.absorbed_stalls == {(0, 51): 7.25, (0, 61): 1.5} and rec.checkpoint_totals["saves"] == 2
    assert list(rec.steps.step) == [41] and rec.steps.attempt[0] == 0  # resumed after step 40


def test_the_comparison_says_where_a_resumed_run_started(resume, stall):
    c = compare(stall, resume)
    assert "resume: resumed from checkpoint step 19 (5 found)." in c.notes
    d = c.to_dict()
    assert d["candidate"]["checkpoint"]["restored_step"] == 19 and d["base"]["checkpoint"]["restored_step"] is None
    assert d["candidate"]["checkpoint"]["found_at_start"] == 5
