"""The run parser: MaxText/XPK log lines (clean, glued, absl-prefixed, host-prefixed, huge),
xrun's metrics JSONL and run.json, and every form of run argument."""

from __future__ import annotations

import gzip
import json
import math
import random
import time
import tracemalloc

import pytest
from synthetic_runs import RunShape, glue, log_lines, write_log, write_stored_run

from orchestrator.readers.loaders import load_run, read_log_file
from orchestrator.readers.logparse import MAX_PENDING, LogParser
from orchestrator.readers.record import StepSeries
from xrun_contract import STEP_LINE, Layout
from xrun_contract.errors import XrunError as RunLogError

SHAPE = RunShape(steps=40, ckpt_every=10, stall_s=2.5, wait_previous_s=0.75, commit="0123456789abcdef",
                 process_id=0, memory_pct=2.528, seed=7)


def parse_text(text: str, pieces: list[int] | None = None) -> object:
    p = LogParser()
    if pieces is None:
        p.feed(text)
    else:
        i = 0
        for n in pieces:
            p.feed(text[i:i + n])
            i += n
        p.feed(text[i:])
    return p.finish()


def rows(rec, with_time: bool = False):
    return [r if with_time else r[:6] + r[7:] for r in rec.steps.rows()]


def test_every_field_of_a_maxtext_log(tmp_path):
    rec = read_log_file(write_log(tmp_path / "main.log", SHAPE))
    assert rec.params == pytest.approx(0.853e9) and rec.params_text == "0.853 billion"
    assert rec.steps.count == 40 and rec.steps.last_step == 40
    expected = SHAPE.samples()
    for got, want in zip(rec.steps.rows(), expected, strict=True):
        step, seconds, tflops, tokens, loss, _blocked, _t, attempt = got
        assert step == want["step"] and attempt == 0
        assert seconds == pytest.approx(want["seconds"], abs=5e-4)
        assert tokens == pytest.approx(want["tokens"], abs=5e-4)
        assert tflops == pytest.approx(want["tflops"], abs=5e-4)
        assert loss == pytest.approx(want["loss"], abs=5e-5)
    assert rec.memory == {"used_gb": 0.79, "total_gb": 31.25, "pct": 2.528, "device": "TPU_0(process=0,(0,0,0,0))"}
    assert rec.flops == {"tflops_per_step": 2.0, "learnable_pct": 93.93, "attention_pct": 6.07}
    assert (rec.jax, rec.jaxlib, rec.backend) == ("0.10.2", "0.10.2", "tpu")
    assert (rec.process_id, rec.process_count, rec.devices) == (0, 2, 4)
    assert rec.accelerator == "v6e-8" and rec.config == {"preset": "tiny", "steps": 60}
    assert rec.exit_code == 0 and rec.finished and rec.wrapper_seconds > 5
    # Checkpoints: blocking, background (commit) and waiting-for-previous, per save.
    assert rec.checkpoint_totals == {"blocked": pytest.approx(10.0), "waited": pytest.approx(3.0),
                                     "committed": pytest.approx(18.0), "saves": 4}
    assert [c["step"] for c in rec.checkpoints if c["event"] == "waited"] == [10, 20, 30, 40]
    assert rec.stalled_steps == {(0, 10), (0, 20), (0, 30), (0, 40)}
    assert rec.label == "main 0123456"  # the file name stands in for the branch


def test_glued_and_absl_prefixed_lines_parse_like_clean_ones(tmp_path):
    clean = parse_text("\n".join(log_lines(SHAPE)) + "\n")
    for every in (2, 3, 7):
        glued = parse_text("\n".join(glue(log_lines(SHAPE, absl=True), every)) + "\n")
        assert rows(glued) == rows(clean)
        assert glued.checkpoint_totals == clean.checkpoint_totals
        assert glued.memory == clean.memory and glued.versions["jax"] == "0.10.2"
        assert glued.params == clean.params and glued.exit_code == 0
        assert any("glued" in n for n in glued.notes)
    absl = parse_text("\n".join(log_lines(SHAPE, absl=True)) + "\n")
    assert rows(absl) == rows(clean)
    times = list(absl.steps.time)
    assert all(math.isfinite(t) for t in times) and times == sorted(times)
    assert (absl.log_first_step_time - absl.log_first_time
            == pytest.approx(SHAPE.samples()[0]["seconds"] + 0.5, abs=0.01))


def test_an_absl_prefix_glued_after_a_number_is_not_read_as_an_exponent():
    line = (STEP_LINE.format(step=7, seconds=0.25, tflops=1.0, tokens=10.0, total_weights=8, loss=5.4321)
            + "E1203 05:12:33.123456 140234 train.py:812] "
            + STEP_LINE.format(step=8, seconds=0.5, tflops=1.0, tokens=10.0, total_weights=8, loss=5.0)
            + "W1203 05:12:34.000000 1 x.py:1] warning text"
            + STEP_LINE.format(step=9, seconds=0.5, tflops=1.0, tokens=10.0, total_weights=8, loss=4.0))
    rec = parse_text(line)
    assert [(r[0], r[4]) for r in rec.steps.rows()] == [(7, 5.4321), (8, 5.0), (9, 4.0)]


def test_piece_boundaries_do_not_change_the_result():
    text = "\n".join(glue(log_lines(SHAPE, absl=True), 3)) + "\n"
    whole = parse_text(text)
    rng = random.Random(3)
    pieces = [rng.randint(1, 97) for _ in range(len(text) // 40)]
    split = parse_text(text, pieces)
    assert rows(split, with_time=True) == rows(whole, with_time=True)
    assert split.checkpoint_totals == whole.checkpoint_totals and split.versions == whole.versions


def test_a_huge_line_without_newlines_is_parsed_in_bounded_pieces():
    noise = "x" * 3000
    one_line = "".join(
        noise + STEP_LINE.format(step=i, seconds=0.1, tflops=1.0, tokens=2.0, total_weights=4, loss=1.0)
        for i in range(1, 2001))  # about 6 MB, one line
    parser = LogParser()
    longest = 0
    for i in range(0, len(one_line), 65536):
        parser.feed(one_line[i:i + 65536])
        longest = max(longest, len(parser._pending))
    rec = parser.finish()
    assert [r[0] for r in rec.steps.rows()] == list(range(1, 2001))
    assert longest <= MAX_PENDING + 65536  # never more than one read piece beyond the cap


def test_host_prefixed_xrun_logs_output_reads_the_training_host():
    lines = []
    for line in log_lines(SHAPE):
        lines.append(f"[0-0] {line}")
        if "xrun header process_id" in line:
            lines.append("[0-1] xrun header process_id: 1")
            lines.append("[0-1] Using (GB) 9.99 / 31.25 (31.968000%) on TPU_4(process=1,(0,1,0,0))")
    after_restart = [f"[0-0 #1] {ln}" for ln in log_lines(RunShape(steps=5, seed=2), attempt=1)]
    rec = parse_text("\n".join(lines + after_restart))
    assert rec.process_id == 0 and rec.memory["pct"] == 2.528  # not host 0-1's reading
    assert rec.hosts_seen == ["0-0", "0-1"]
    attempts = [r[7] for r in rec.steps.rows()]
    assert attempts == [0] * 40 + [1] * 5
    assert any("read host 0-0" in n for n in rec.notes)


def test_a_restart_without_wrapper_lines_is_detected_from_the_step_numbers():
    first = [ln for ln in log_lines(RunShape(steps=12, seed=1)) if "wrapper" not in ln and "EXIT" not in ln]
    second = [ln for ln in log_lines(RunShape(steps=20, seed=1))[-14:] if "wrapper" not in ln]
    rec = parse_text("\n".join(first + ["checkpoint restored: step 8"] + second))
    got = [(r[0], r[7]) for r in rec.steps.rows()]
    assert got[:12] == [(s, 0) for s in range(1, 13)]
    assert got[12:] == [(s, 1) for s in range(9, 21)]  # restored 8: step 9 onwards is attempt 1
    assert rec.final_mask()[:12] == [True] * 8 + [False] * 4  # steps 9-12 were redone


def test_step_columns_decimate_past_the_cap():
    series = StepSeries(cap=1000)
    for i in range(1, 10_001):
        series.append(i, 0.5, 1.0, 2.0, 3.0)
    assert series.count == 10_000 and series.total_seconds == pytest.approx(5000.0)
    assert len(series) <= 1000 and series.stride == 16
    assert list(series.step[:3]) == [1, 17, 33]  # evenly thinned, first step kept


def test_a_100mb_log_streams_in_bounded_memory(tmp_path):
    """1 GB logs must not be loaded whole: parse a ~100 MB log under tracemalloc and require
    the peak to stay far below the file size (the step columns are the only growth)."""
    path = tmp_path / "big.log"
    noise = ("I1203 05:12:33.123456 140234 xla_bridge.py:123] compilation cache miss for "
             "jit_train_step; HLO module has 1234 instructions, fusion passes done\n") * 40
    step = 0
    with open(path, "w") as f:
        for _ in range(14_000):
            block = []
            for _ in range(10):
                step += 1
                block.append("I1203 05:12:34.000000 140234 train.py:812] " + STEP_LINE.format(
                    step=step, seconds=0.153, tflops=0.012, tokens=1234.0, total_weights=512, loss=5.4321))
            f.write(noise + "\n".join(block) + "\n")
    size = path.stat().st_size
    assert size > 95e6
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        rec = read_log_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    elapsed = time.monotonic() - t0
    assert rec.steps.count == step == 140_000 and rec.steps.last_step == 140_000
    assert peak < size / 5, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.0f} MB log"
    print(f"parsed {size / 1e6:.0f} MB in {elapsed:.1f}s (under tracemalloc), peak {peak / 1e6:.1f} MB")


def test_gzip_and_jsonl_files(tmp_path):
    text = "\n".join(log_lines(SHAPE)) + "\n"
    gz = tmp_path / "run.log.gz"
    with gzip.open(gz, "wt") as f:
        f.write(text)
    assert rows(load_run(str(gz))) == rows(parse_text(text))
    root = tmp_path / "root"
    run_dir = write_stored_run(root, "jr", SHAPE)
    jsonl = tmp_path / "metrics.jsonl"
    jsonl.write_text("".join(p.read_text() for p in sorted((run_dir / "metrics").iterdir())) + "not json\n")
    rec = load_run(str(jsonl))
    assert rec.kind == "metrics" and rec.steps.count == 40 and rec.jax == "0.10.2"
    assert any("not metrics records" in n for n in rec.notes)


def test_a_stored_run_by_name_by_path_and_by_folder(tmp_path):
    root = tmp_path / "root"
    write_stored_run(root, "nightly-main-1", SHAPE, branch="main", restart_at=25)
    by_name = load_run("nightly-main-1", str(root))
    by_path = load_run(str(root / "runs" / "nightly-main-1"))
    assert rows(by_name) == rows(by_path)
    rec = by_name
    assert rec.kind == "storage" and rec.label == "main 0123456"
    assert rec.state == "Succeeded" and rec.restarts == 1 and rec.finished
    assert rec.submitted_at is not None and rec.end_time > rec.submitted_at
    assert [r[7] for r in rec.steps.rows()].count(1) == 20  # attempt 1 redid 21..40
    assert rec.params == 853_000_000 and rec.memory["pct"] == 2.528
    # A run folder copied anywhere (no runs/ parent) reads the same.
    copy = tmp_path / "copied-run"
    import shutil

    shutil.copytree(root / "runs" / "nightly-main-1", copy)
    assert rows(load_run(str(copy))) == rows(rec)


def test_a_stored_run_without_metrics_reads_process_0s_log(tmp_path):
    root = tmp_path / "root"
    name = "logs-only"
    (root / "runs" / name).mkdir(parents=True)
    (root / Layout.run_json(name)).write_text(json.dumps({"name": name, "spec": {"branch": "b", "commit": "c0ffee12"}}))
    lines = log_lines(SHAPE)
    for host, text in (("0-0", lines[:30]), ("0-1", ["xrun header process_id: 1"])):
        d = root / Layout.host_logs(name, host, 0)
        d.mkdir(parents=True)
        (d / "00000000.log").write_text("\n".join(text[:15]) + "\n")
        (d / "00000001.log").write_text("\n".join(text[15:]) + "\n")
    d = root / Layout.host_logs(name, "0-0", 1)
    d.mkdir(parents=True)
    (d / "00000000.log").write_text("\n".join(lines[30:]) + "\n")
    rec = load_run(name, str(root))
    assert rec.steps.count == 40 and rec.process_id == 0 and rec.label == "b c0ffee12"
    split = [r[7] for r in rec.steps.rows()]
    assert split[0] == 0 and split[-1] == 1  # the attempt comes from the path
    assert any("host 0-0's log" in n for n in rec.notes)


def test_a_stored_run_on_gcs(gcs_bucket, tmp_path):
    from xrun_contract.storage import open_storage

    local = tmp_path / "root"
    write_stored_run(local, "gcs-run", SHAPE)
    store = open_storage(f"{gcs_bucket}/xr")
    for p in (local / "runs").rglob("*"):
        if p.is_file():
            store.write_bytes(p.relative_to(local).as_posix(), p.read_bytes())
    by_url = load_run(f"{gcs_bucket}/xr/runs/gcs-run")
    by_name = load_run("gcs-run", f"{gcs_bucket}/xr")
    assert rows(by_url) == rows(by_name) == rows(load_run(str(local / "runs" / "gcs-run")))
    assert by_url.source == f"{gcs_bucket}/xr/runs/gcs-run"


@pytest.mark.parametrize("arg, message", [
    ("missing.log", "BASE: no such file or folder: missing.log"),
    ("./nope/", "BASE: no such file or folder: ./nope/"),
    ("ghost-run", "BASE: no run named 'ghost-run' under"),
    ("gs://bucket/no-runs-segment", "BASE: 'gs://bucket/no-runs-segment' is not a run path"),
    ("", "BASE: empty"),
])
def test_bad_run_arguments_name_the_argument(arg, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "root").mkdir()
    with pytest.raises(RunLogError) as e:
        load_run(arg, str(tmp_path / "root"), "BASE")
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_file_with_no_training_lines_is_bad_input(tmp_path):
    junk = tmp_path / "notes.txt"
    junk.write_text("hello\nthis is not a training log\n")
    (tmp_path / "folder").mkdir()
    with pytest.raises(RunLogError, match="CANDIDATE: .*notes.txt has no training lines"):
        load_run(str(junk), None, "CANDIDATE")
    with pytest.raises(RunLogError, match="is not a run"):
        load_run(str(tmp_path / "folder"), None, "CANDIDATE")


# ---------------------------------------------------------------------------------------
# xrun's own lines and records: the one-line header, phases, failures, every checkpoint event


def _xrun_log() -> str:
    from xrun_contract import (
        CKPT_BLOCKED_LINE,
        CKPT_COMMIT_LINE,
        CKPT_DEFERRED_LINE,
        CKPT_EXIT_WAIT_LINE,
        CKPT_RESTORE_FAILED_LINE,
        CKPT_START_LINE,
        CKPT_WRITE_FAILED_LINE,
        FAILURE_LINE,
        HEADER_LINE,
        PHASE_LINE,
        format_header_fields,
        format_step_line,
    )

    versions = {"xrun": "0.1.0", "jax": "0.10.2", "jaxlib": "0.10.2", "backend": "tpu", "process_id": "0",
                "process_count": "2", "global_devices": "8", "device_kind": "TPU v6 lite",
                "mesh": '{"data":1,"fsdp":8}', "commit": "0123456789abcdef"}
    lines = [HEADER_LINE.format(key="versions", value=format_header_fields(versions)),
             HEADER_LINE.format(key="config", value="preset=tiny steps=10 checkpoint_every=4 lr=0.001"),
             PHASE_LINE.format(activity="initializing distributed", seconds=1.25),
             PHASE_LINE.format(activity="restoring step 4", seconds=5.5),
             CKPT_RESTORE_FAILED_LINE.format(step=8, error="ValueError: missing array"),
             PHASE_LINE.format(activity="training", seconds=9.75)]
    for step in range(5, 11):
        lines.append(format_step_line(step, 0.5, 1.0, 100.0, 2048, 7.0 - step / 10))
        if step == 6:
            lines += [CKPT_START_LINE.format(step=6), CKPT_BLOCKED_LINE.format(step=6, seconds=0.25)]
        if step == 8:
            lines.append(CKPT_DEFERRED_LINE.format(step=8, previous=6))
    lines += [CKPT_COMMIT_LINE.format(step=6, seconds=4.0),
              CKPT_EXIT_WAIT_LINE.format(step=10, seconds=2.5),
              CKPT_WRITE_FAILED_LINE.format(step=10, process=1, error="OSError: 503"),
              FAILURE_LINE.format(kind="infrastructure", why="checkpoint write failed", code=42)]
    return "\n".join(lines) + "\n"


def test_xrun_header_phase_failure_and_checkpoint_lines():
    from orchestrator.analysis.goodput import format_goodput, goodput

    rec = parse_text(_xrun_log())
    assert (rec.jax, rec.backend, rec.process_count, rec.devices) == ("0.10.2", "tpu", 2, 8)
    assert rec.device_kind == "TPU_v6_lite" and rec.versions["mesh"] == '{"data":1,"fsdp":8}'
    assert rec.commit == "0123456789abcdef" and "versions" not in rec.versions
    assert rec.config == {"preset": "tiny", "steps": 10, "checkpoint_every": 4, "lr": 0.001}
    assert [(p["activity"], p["step"], p["seconds"]) for p in rec.phases] == [
        ("initializing distributed", None, 1.25), ("restoring", 4, 5.5), ("training", None, 9.75)]
    assert rec.failure == {"kind": "infrastructure", "why": "checkpoint write failed", "code": 42}
    t = rec.checkpoint_totals
    assert (t["blocked"], t["waited"], t["exit_wait"], t["deferred"]) == (0.25, 0.0, 2.5, 1)
    assert (t["restore_failed"], t["write_failed"]) == (1, 1)
    evs = {e["event"]: e for e in rec.checkpoints}
    assert evs["deferred"]["previous"] == 6 and evs["write_failed"]["process"] == 1
    assert evs["restore_failed"]["error"] == "ValueError: missing array"
    gp = goodput(rec)
    assert gp["categories"]["checkpoint"] == 0.25  # the exit wait is not a stall
    assert (gp["deferred_saves"], gp["exit_wait_s"]) == (1, 2.5)
    assert "(1 save(s) deferred; exit wait 2.5s, not a stall)" in format_goodput(gp)


def test_xrun_metrics_records_phase_deferred_and_exit_wait(tmp_path):
    from orchestrator.analysis.compare import compare
    from orchestrator.analysis.goodput import goodput
    from xrun_contract import records

    t0 = 1_700_000_000.0
    recs = [records.Phase(time=t0 + 2.0, phase="imports", seconds=2.0, activity="initializing distributed"),
            records.Header(time=t0 + 3.0, versions={"jax": "0.10.2"}, config={"steps": 12}, total_steps=12)]
    for step in range(1, 13):
        recs.append(records.Step(time=t0 + 10 + step, step=step, seconds=1.0, tflops_per_device=1.0,
                                 tokens_per_s_per_device=100.0, loss=5.0 - step / 100))
    recs += [records.Checkpoint(time=t0 + 15, step=4, event="started"),
             records.Checkpoint(time=t0 + 15, step=4, event="blocked", seconds=0.5),
             records.Checkpoint(time=t0 + 19, step=8, event="deferred", previous=4),
             records.Checkpoint(time=t0 + 25, step=12, event="exit_wait", seconds=3.0),
             records.End(time=t0 + 26, exit_code=0, reason="completed")]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(records.to_json(r) + "\n" for r in recs))
    rec = read_log_file(path)
    assert rec.start_time == t0 and rec.phases[0]["activity"] == "initializing distributed"
    assert rec.checkpoint_totals["exit_wait"] == 3.0 and rec.checkpoint_totals["deferred"] == 1
    gp = goodput(rec)
    assert gp["categories"]["checkpoint"] == 0.5 and gp["exit_wait_s"] == 3.0
    assert gp["wall_s"] == 26.0 and gp["basis"] == "process start"
    notes = "\n".join(compare(rec, rec).notes)
    assert "1 save(s) deferred" in notes and "3.000 s waiting for the last save to commit" in notes
