"""The nightly's verdict as CI reads it (issue 52): the last line of the terminal output and
of reports/<stamp>/summary.md is the night's run-level verdict, agreeing with the exit code
and summary.json, whatever the per-pair sections hold (a per-step detail that reads OK
under a REGRESSED night, an INCOMPLETE pair). Synthetic stored runs, no JAX: only the
submission is replaced (it writes the run); the nightly follows it through the real local
backend and the CLI runs in this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import xrun_here
from synthetic_runs import RunShape, write_nightly_file, write_stored_run

from orchestrator.services import nightly as svc

STEADY = dict(loss_decay=0.0, jitter=0.004)


def _night(tmp_path: Path, monkeypatch, shape_of, state_of=lambda run: "Succeeded"):
    root = tmp_path / "store"
    path = write_nightly_file(tmp_path / "nightly.yaml", root, repeats=4)

    def submit(run):
        write_stored_run(root, run.name, shape_of(run), branch=run.branch.name, state=state_of(run))

    monkeypatch.setattr(svc, "submit_run", submit)
    r = xrun_here("nightly", "-f", str(path))
    (report,) = (root / "reports").iterdir()
    md = (report / "summary.md").read_text()
    summary = json.loads((report / "summary.json").read_text())
    return r, md, summary


def _check_tail(r, md: str, summary: dict) -> str:
    """`tail -n 1` of summary.md and of the terminal: one line, the run-level verdict."""
    last = md.rstrip("\n").splitlines()[-1]
    assert r.stdout.rstrip("\n").splitlines()[-1] == last, r.stdout[-500:]
    assert last.startswith(f"Verdict: {summary['verdict']}"), (last, summary["verdict"])
    assert r.returncode == summary["exit_code"] == (0 if summary["verdict"] == "within noise" else 1)
    # No other "Verdict:" line can be taken for the night's.
    assert [ln for ln in md.splitlines() if ln.startswith("Verdict:")] == [last]
    return last


def test_a_regressed_night_ends_with_regressed_though_the_first_pair_reads_ok(tmp_path, monkeypatch):
    """The first pair's per-step test finds nothing (the candidate's first run has too few
    steady steps to test), the per-run test of 4 a side finds +33%: the night is REGRESSED
    and that is the last line, not the per-step detail's own verdict."""
    def shape(run):
        if run.branch.name == "main":
            return RunShape(seed=run.index, **STEADY)
        if run.repeat == 0:
            return RunShape(seed=run.index, seconds=0.200, steps=6, **STEADY)
        return RunShape(seed=run.index, seconds=0.200, **STEADY)

    r, md, summary = _night(tmp_path, monkeypatch, shape)
    assert summary["verdict"] == "REGRESSED", summary["comparisons"][0]["verdict"]
    (entry,) = summary["comparisons"]
    # The first pair alone does not regress (too few steady steps to test): what once ended the file.
    assert entry["comparison"]["per_step"]["verdict"].startswith("INCONCLUSIVE")
    last = _check_tail(r, md, summary)
    assert "feat on tiny" in last and "Steady-state s/step (median) +33" in last, last
    assert "**Verdict:** REGRESSED" in md.split("## Config tiny", 1)[1]  # the pair's section says it too


def test_an_incomplete_night_ends_with_incomplete(tmp_path, monkeypatch):
    r, md, summary = _night(tmp_path, monkeypatch, lambda run: RunShape(seed=run.index, **STEADY),
                            lambda run: "Deleted" if (run.branch.name, run.repeat) == ("feat", 2) else "Succeeded")
    assert summary["verdict"] == "INCOMPLETE"
    assert _check_tail(r, md, summary).startswith("Verdict: INCOMPLETE: 1 comparison(s)")


@pytest.mark.parametrize("slower", [1.0, 1.03])
def test_a_quiet_night_ends_within_noise(tmp_path, monkeypatch, slower):
    r, md, summary = _night(tmp_path, monkeypatch,
                            lambda run: RunShape(seed=run.index,
                                                 seconds=0.150 * (slower if run.branch.name == "feat" else 1),
                                                 **STEADY))
    assert summary["verdict"] == "within noise"
    assert _check_tail(r, md, summary) == "Verdict: within noise: no regression beyond 10%"
    page = next((tmp_path / "store" / "reports").iterdir()) / "index.html"
    html = page.read_text()  # one night: said once, not under each of the 8 trend charts
    assert html.count("One night so far") == 1 and "No step change beyond noise" not in html


def test_two_nights_started_in_one_second_get_names_of_their_own(tmp_path, monkeypatch):
    """A second nightly in the same second (a scheduler's retry; a quick first night) once
    met "already exists" on its first submit: its runs take the next free second."""
    import datetime as dt

    from orchestrator.nightly_file import load_nightly

    root = tmp_path / "store"
    path = write_nightly_file(tmp_path / "nightly.yaml", root, repeats=1)
    monkeypatch.setattr(svc, "submit_run", lambda run: write_stored_run(
        root, run.name, RunShape(seed=run.index, **STEADY), branch=run.branch.name))
    when = dt.datetime(2026, 12, 7, 3, 14, 51, tzinfo=dt.UTC)
    first = svc.run_nightly(load_nightly(str(path)), log=lambda _line: None, now=when)
    second = svc.run_nightly(load_nightly(str(path)), log=lambda _line: None, now=when)
    names = [[o.planned.name for o in night.outcomes] for night in (first, second)]
    assert names[0] == ["nv-main-20261207-031451-0", "nv-feat-20261207-031451-1"], names
    assert names[1] == ["nv-main-20261207-031452-0", "nv-feat-20261207-031452-1"], names
    assert all(o.state == "Succeeded" for night in (first, second) for o in night.outcomes)
    # Their reports and history: "<second>" then "<second>-2", read back in that order
    # (as plain names "...-2.jsonl" sorts first).
    from orchestrator.readers.history import read_history
    from xrun_contract.storage import LocalStorage

    stamps = [night.summary["nightly"] for night in (first, second)]
    assert stamps == ["2026-12-07-031451", "2026-12-07-031451-2"], stamps
    assert [r["nightly"] for r in read_history(LocalStorage(str(root)))] == [stamps[0]] * 2 + [stamps[1]] * 2
