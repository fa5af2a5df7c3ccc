"""The parser's fast path (bytes, one Aho-Corasick pass, batched step lines) reads exactly
what the line-by-line path reads: on the real MaxText logs, on host-prefixed and glued text,
across restarts and a new year, and with the step series thinned past its cap."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from orchestrator.readers.loaders import read_log_file
from orchestrator.readers.loglines import _stats_fields
from orchestrator.readers.logparse import LogParser
from orchestrator.readers.record import StepSeries

DATA = Path(__file__).parent / "data" / "maxtext"
LOGS = sorted(DATA.glob("*.log"))


def parse(data: bytes | str, pieces: int | None = None, seed: int = 0) -> object:
    p = LogParser(year=2026)
    if pieces is None:
        p.feed(data)
    else:
        rng = random.Random(seed)
        i = 0
        while i < len(data):
            n = rng.randint(1, pieces)
            p.feed(data[i:i + n])
            i += n
    return p.finish()


def summary(rec) -> tuple:
    nan = [(-1.0 if math.isnan(x) else x) for x in rec.steps.time]
    return (rec.steps.count, list(rec.steps.step), list(rec.steps.seconds), nan,
            list(rec.steps.attempt), list(rec.steps.loss), rec.checkpoints, rec.checkpoint_totals,
            rec.notes, rec.flops, rec.versions, rec.log_first_time, rec.log_last_time,
            rec.log_first_step_time, rec.exit_code, rec.start_time)


@pytest.mark.parametrize("log", LOGS, ids=[p.name for p in LOGS])
def test_bytes_and_text_in_any_pieces_read_the_same(log):
    data = log.read_bytes()
    whole = summary(parse(data))
    assert whole[0] > 0 and whole[6]  # steps and checkpoint events were read
    assert summary(parse(data.decode(), pieces=97, seed=1)) == whole
    assert summary(parse(data, pieces=5000, seed=2)) == whole
    assert summary(read_log_file(log)) [:11] == whole[:11]  # the file path reads bytes too


def test_first_and_last_times_are_the_logs_not_its_messages():
    """Goodput's start and end: the first and last absl lines, even with no message."""
    text = (
        "[transformers] PyTorch was not found.\n"
        "I1203 10:00:00.500000 1 pyconfig.py:591] Config param steps: 10\n"
        "I1203 10:00:05.000000 1 metric_logger.py:265] completed step: 0, seconds: 1.0, "
        "TFLOP/s/device: 1.0, Tokens/s/device: 10.0, total_weights: 8, loss: 9.0\n"
        "I1203 10:00:09.250000 1 checkpoint_manager.py:2097] Done waiting for Save Finalize\n"
    )
    for rec in (parse(text), parse(text, pieces=7), parse(text.encode(), pieces=30, seed=3)):
        assert rec.log_first_time == pytest.approx(1796292000.5)
        assert rec.log_last_time == pytest.approx(1796292009.25)
        assert rec.log_first_step_time == pytest.approx(1796292005.0)
    prefixed = "".join(f"[0-{i % 2}] {ln}\n" for i, ln in enumerate(text.splitlines()))
    rec = parse(prefixed)
    assert rec.hosts_seen == ["0-0", "0-1"]


def step_line(step: int, hh: int = 10, day: str = "1203", loss: float = 2.0) -> str:
    return (f"I{day} {hh:02d}:00:{step % 60:02d}.000001 1 metric_logger.py:265] completed step: "
            f"{step}, seconds: 0.5, TFLOP/s/device: 1.0, Tokens/s/device: 10.0, "
            f"total_weights: 8, loss: {loss}, lm_loss: {loss}, perplexity: 7.4\n")


def test_steps_going_back_inside_one_batch_count_as_a_restart():
    text = "".join(step_line(s) for s in (1, 2, 3, 4, 2, 3))
    rec = parse(text)
    assert list(rec.steps.step) == [1, 2, 3, 4, 2, 3]
    assert list(rec.steps.attempt) == [0, 0, 0, 0, 1, 1]
    assert rec.notes == ["steps restart at 2 after 4: counted as attempt 1"]


def test_a_new_year_inside_one_batch():
    text = step_line(1, 23, "1231") + step_line(2, 0, "0101")
    out = parse(text)
    assert out.steps.time[1] - out.steps.time[0] == pytest.approx(3601)  # not a year earlier
    assert out.log_last_time - out.log_first_time == pytest.approx(3601)
    # Batches wholly past the new year (each piece one batch) move on as one.
    later = "".join(step_line(s, 1 + s // 60, "0101") for s in range(3, 200))
    p = LogParser(year=2026)
    p.feed(text)
    for i in range(0, len(later), 1000):
        p.feed(later[i:i + 1000])
    out = p.finish()
    times = list(out.steps.time)
    assert out.steps.count == 199 and all(b > a for a, b in zip(times, times[1:], strict=False))
    assert out.log_last_time == pytest.approx(times[-1]) and times[-1] - times[0] < 86400


def test_a_step_line_with_anything_more_takes_the_general_path():
    glued = step_line(1).rstrip("\n") + "xrun phase: compiled, seconds: 3.000\n" + step_line(2)
    rec = parse(glued)
    assert list(rec.steps.step) == [1, 2]
    assert [p["activity"] for p in rec.phases] == ["compiled"]
    assert rec.notes == ["1 lines held several glued messages; split"]
    crlf = step_line(1).replace("\n", "\r\n") + step_line(2)
    assert list(parse(crlf).steps.step) == [1, 2]


def test_add_many_keeps_what_append_keeps():
    rng = random.Random(5)
    for cap in (4, 7, 16):
        one, many = StepSeries(cap=cap), StepSeries(cap=cap)
        n = 0
        for _ in range(30):
            k = rng.randint(1, 23)
            rows = [(n + i, 0.5 + i, 1.0, 2.0, 3.0 - i / 100, 0.0, float(n + i), 0) for i in range(k)]
            for r in rows:
                one.append(r[0], r[1], r[2], r[3], r[4], time=r[6], attempt=r[7], total_weights=8)
            many.add_many(k, sum(r[1] for r in rows), 8, 8, lambda i, rows=rows: rows[i])
            n += k
        assert list(one.rows()) == list(many.rows()) and one.stride == many.stride
        assert one.count == many.count and one.total_seconds == pytest.approx(many.total_seconds)


def test_orbax_statistics_entries_without_evaluating_the_dict():
    line = next(ln for ln in (DATA / "save-stall.log").read_text().splitlines() if "{'step': 5," in ln)
    stats = _stats_fields(line[line.index("{"):])
    assert stats["step"] == 5 and stats["event_type"] == "save"
    assert stats["wait_for_prev_duration_secs"] == pytest.approx(3.6401944160461426)
    assert stats["checkpointer_blocking_duration_secs"] == pytest.approx(0.01685786247253418)
    assert _stats_fields("{'step': 3, 'event_type': None, 'checkpoint_manager_duration_secs': 1e-05}") == {
        "step": 3, "event_type": None, "checkpoint_manager_duration_secs": 1e-05}


def test_every_contract_line_begins_with_a_message_start():
    """A new line format in the contract without a message start would be skipped unseen
    by the parser (it only looks at lines holding one)."""
    import xrun_contract
    from orchestrator.readers.logparse import MESSAGE_STARTS

    formats = {name: value for name, value in vars(xrun_contract).items()
               if name.endswith("_LINE") and isinstance(value, str)}
    formats.pop("PROBE_LINE")  # xrun doctor reads the probe's output itself, not the parser
    assert len(formats) >= 15
    for name, fmt in formats.items():
        literal = fmt.split("{", 1)[0]
        assert any(literal.startswith(s) for s in MESSAGE_STARTS), name


def test_a_stored_run_without_metrics_reads_its_stamped_log_chunks(tmp_path):
    """A stock MaxText image under xrun stores no metrics records: status, compare and
    report read its log chunks, stamped line by line by the log shipper."""
    from orchestrator.readers.loaders import load_run
    from xrun_contract import Layout, stamp_line

    lines = (DATA / "save-stall.log").read_text().splitlines(keepends=True)
    folder = tmp_path / Layout.host_logs("mt", "0-0", 0)
    folder.mkdir(parents=True)
    t0 = 1796292000.0
    for seq, start in enumerate(range(0, len(lines), 400)):
        chunk = "".join(stamp_line(t0 + i * 0.01, ln) for i, ln in
                        enumerate(lines[start:start + 400], start))
        (folder / f"{seq:08d}.log").write_text(chunk)
    (folder / "00000009.log").write_text("unstamped (an older chunk)\n")
    rec = load_run(str(tmp_path / "runs" / "mt"))
    plain = parse((DATA / "save-stall.log").read_bytes())
    assert rec.steps.count == plain.steps.count == 20
    assert list(rec.steps.rows()) == list(plain.steps.rows())
    assert rec.checkpoint_totals == plain.checkpoint_totals
    assert "no step metrics stored: read from host 0-0's log" in rec.notes


def test_steps_waiting_across_messages_keep_their_order():
    """Runs of step lines wait across checkpoint lines; a restart (steps going back) or a
    restore still takes effect where it is in the log."""
    save = "I1203 10:00:{s:02d}.5 1 checkpoint.py:1] checkpoint save started: step {n}\n"
    text = ("".join(step_line(s) for s in (1, 2, 3, 4, 5)) + save.format(s=6, n=5)
            + "".join(step_line(s) for s in (3, 4)) + save.format(s=9, n=4)
            + "I1203 10:00:10.5 1 checkpointing.py:1] restoring from this run's directory step 4\n"
            + "".join(step_line(s) for s in (5, 6)))
    for rec in (parse(text), parse(text, pieces=50, seed=9)):
        assert list(rec.steps.step) == [1, 2, 3, 4, 5, 3, 4, 5, 6]
        assert list(rec.steps.attempt) == [0, 0, 0, 0, 0, 1, 1, 2, 2]
        assert [(c["event"], c["step"], c["attempt"]) for c in rec.checkpoints] == [
            ("started", 5, 0), ("started", 4, 1), ("restored", 4, 2)]
    # A host prefix names the attempt ("[0-0]": 0), so nothing counts as a restart there.
    rec = parse("".join(f"[0-0] {ln}\n" for ln in text.splitlines()))
    assert list(rec.steps.step) == [1, 2, 3, 4, 5, 3, 4, 5, 6] and set(rec.steps.attempt) == {0}
    assert [(c["event"], c["step"], c["attempt"]) for c in rec.checkpoints] == [
        ("started", 5, 0), ("started", 4, 0), ("restored", 4, 0)]
    text = ("".join(step_line(s) for s in (1, 2, 3))
            + "I1203 10:00:10.5 1 checkpointing.py:1] restoring from this run's directory step 2\n"
            + "".join(step_line(s) for s in (3, 4)))
    rec = parse(text)
    assert list(rec.steps.attempt) == [0, 0, 0, 1, 1]
    assert rec.notes == ["checkpoint restored after step 3: counted as attempt 1"]


def test_stall_maps_stay_bounded_and_keep_what_kept_steps_need(monkeypatch):
    """A long log's per-save stall entries are pruned to the kept step samples; the steady
    state of every kept sample reads the same as with nothing pruned."""
    from orchestrator.readers import record

    def run(cap: int) -> tuple:
        monkeypatch.setattr(record, "STEP_CAP", cap)
        rec = record.RunRecord(steps=StepSeries(cap=16))
        sizes = []
        for step in range(1, 2001):
            rec.steps.append(step, 1.0, 1.0, 1.0, 1.0)
            if step % 3 == 0:  # a MaxText save: its stall lands in the next step
                rec.add_checkpoint("waited", step, 2.0, 0, absorbed_by=step + 1)
            if step % 7 == 0:  # an xrun save line: the save's step and the next
                rec.add_checkpoint("blocked", step, 0.5, 0)
            sizes.append(len(rec.absorbed_stalls) + len(rec.stalled_steps))
        return rec.steady_mask(warmup=2), max(sizes), rec.checkpoint_totals

    pruned, most, totals = run(cap=40)
    unpruned, everything, totals_all = run(cap=10**9)
    assert pruned == unpruned and totals == totals_all
    assert everything > 900 and most <= 3 * 40 + 2


def test_checkpoint_events_past_the_cap_are_counted_once_noted(monkeypatch):
    from orchestrator.readers import record

    monkeypatch.setattr(record, "EVENT_CAP", 10)
    rec = record.RunRecord()
    for step in range(50):
        rec.add_checkpoint("started", step, None, 0)
    assert len(rec.checkpoints) == 10 and rec.events_dropped == 40
    assert rec.checkpoint_totals["saves"] == 50
    assert rec.notes == ["more than 10 checkpoint events: later ones only counted"]


def test_absl_times_of_kept_samples_minutes_hours_and_days_apart_are_exact():
    """A thinned series keeps steps far apart in time: each kept step's time is its absl
    prefix's to the bit (the year given), however far the previous kept one was (same
    second, minute, hour or day, or not) and however many digits its fraction has."""
    import calendar
    import time

    from orchestrator.readers.record import RunRecord

    rng = random.Random(11)
    t = calendar.timegm((2026, 1, 1, 0, 0, 0))
    lines, want = [], {}
    for step in range(4000):
        t += rng.choices([0, 1, 7, 59, 60, 61, 3540, 3600, 3661, 86400 - 1],
                         [6, 4, 3, 3, 3, 3, 1, 1, 1, 0.05])[0]
        digits = rng.randint(1, 6)
        frac = rng.randrange(10 ** digits)
        tm = time.gmtime(t)
        prefix = (f"I{tm.tm_mon:02d}{tm.tm_mday:02d} {tm.tm_hour:02d}:{tm.tm_min:02d}:"
                  f"{tm.tm_sec:02d}.{frac:0{digits}d} 140243555933056 metric_logger.py:265] ")
        lines.append(prefix + f"completed step: {step}, seconds: 0.5, TFLOP/s/device: 1.0, "
                     "Tokens/s/device: 100.0, total_weights: 256, loss: 2.5\n")
        want[step] = t + frac / 10 ** digits
    assert time.gmtime(t).tm_year == 2026  # no new year inside: that is another test
    data = "".join(lines).encode()
    for pieces in (None, 3000, 70000):
        p = LogParser(record=RunRecord(steps=StepSeries(cap=64)), year=2026)
        if pieces is None:
            p.feed(data)
        else:
            for i in range(0, len(data), pieces):
                p.feed(data[i:i + pieces])
        rec = p.finish()
        assert rec.steps.stride > 1 and rec.steps.count == 4000
        assert {s: rec.steps.time[i] for i, s in enumerate(rec.steps.step)} == {
            s: want[s] for s in rec.steps.step}
        assert (rec.log_first_time, rec.log_last_time) == (want[0], want[3999])
