"""Repeats, run-level verdicts, history and change points, without running JAX: nightly
files, synthetic stored runs and history objects in a storage folder."""

from __future__ import annotations

import datetime as dt
import json
import random
import re

import pytest
import yaml
from cli_helpers import xrun
from synthetic_runs import RunShape, write_stored_run

from orchestrator.analysis.compare import compare_runs
from orchestrator.analysis.history import detect, nights
from orchestrator.analysis.stats import change_points
from orchestrator.nightly_file import load_nightly, plan_runs
from orchestrator.readers.history import read_history
from orchestrator.readers.loaders import load_run
from orchestrator.services.nightly import _report_stamp
from xrun_contract import Layout
from xrun_contract.errors import XrunError
from xrun_contract.storage import open_storage

LOCAL = {
    "prefix": "nt", "storage": "/tmp/unused", "slice": {"accelerator": "cpu-1"}, "base": "main",
    "branches": {"main": {"image": "i:a"}, "feat": {"image": "i:b"}},
    "configs": {"tiny": {"command": "python3 -m workload.train --preset tiny steps=8", "repeats": 3},
                "one": {"command": "python3 -m workload.train --preset tiny steps=4"}},
    "backend": "local",
}


def _file(tmp_path, data):
    p = tmp_path / "n.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(p)


def test_repeats_are_interleaved_per_config(tmp_path):
    cfg = load_nightly(_file(tmp_path, LOCAL))
    runs = plan_runs(cfg, dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
    assert [(r.config.name, r.branch.name, r.repeat) for r in runs] == [
        ("tiny", "main", 0), ("tiny", "feat", 0), ("tiny", "main", 1), ("tiny", "feat", 1),
        ("tiny", "main", 2), ("tiny", "feat", 2), ("one", "main", 0), ("one", "feat", 0)]
    assert [r.name for r in runs][:2] == ["nt-main-20260102-030405-0", "nt-feat-20260102-030405-1"]
    assert len({r.name for r in runs}) == 8


@pytest.mark.parametrize("repeats", [0, -1, 51, "3", True, 2.5])
def test_bad_repeats_name_the_field(tmp_path, repeats):
    data = json.loads(json.dumps(LOCAL))
    data["configs"]["tiny"]["repeats"] = repeats
    r = xrun("nightly", "-f", _file(tmp_path, data), "--dry-run", storage=tmp_path / "s")
    assert r.returncode == 2 and "configs.tiny.repeats: must be a whole number of runs per branch, 1 to 50" in r.stderr
    assert not (tmp_path / "s").exists()


def _stored(root, prefix, n, seconds, seed0=0, branch="main"):
    names = []
    for i in range(n):
        name = f"{prefix}-{i}"
        write_stored_run(root, name, RunShape(seconds=seconds, seed=seed0 + i, commit="abc1234aaaa"), branch=branch)
        names.append(load_run(name, str(root)))
    return names


def test_run_level_verdict_with_four_runs_and_benchstat_rule_below(tmp_path):
    root = tmp_path / "root"
    base = _stored(root, "b", 4, 0.150)
    slow = _stored(root, "s", 4, 0.180, seed0=10, branch="feat")
    same = _stored(root, "m", 4, 0.150, seed0=20, branch="feat")
    rs = compare_runs(base, slow, threshold_pct=5.0)
    assert rs.on_runs and rs.regressed and "per-run values" in rs.basis
    steady = next(r for r in rs.rows if r.metric.startswith("Steady"))
    assert steady.verdict == "regressed" and steady.n_base == 4 and steady.p_value == pytest.approx(2 / 70)
    assert "n=4/4 runs" in steady.diff
    ok = compare_runs(base, same, threshold_pct=5.0)
    assert not ok.regressed and ok.on_runs
    # Three runs a side: the rank test cannot decide; the verdict says so and falls back.
    few = compare_runs(base[:3], slow[:3], threshold_pct=5.0)
    assert not few.on_runs and "below benchstat's n >= 4" in few.basis
    steady = next(r for r in few.rows if r.metric.startswith("Steady"))
    assert steady.verdict == "not tested" and "benchstat needs n >= 4 runs per side" in steady.diff
    assert few.regressed  # on the per-step test of the first pair, said in the basis
    assert "| Metric (per-run median) |" in few.markdown()


def test_change_points_find_the_step_and_ignore_noise():
    rng = random.Random(3)
    flat = [[1 + rng.gauss(0, 0.01) for _ in range(4)] for _ in range(8)]
    assert change_points(flat) == []
    step = flat[:4] + [[1.3 + rng.gauss(0, 0.01) for _ in range(4)] for _ in range(4)]
    (cp,) = change_points(step)
    assert cp[0] == 4 and cp[2] == pytest.approx(30, abs=3) and cp[1] < 0.05
    one_run = [[1.0], [1.01], [0.99], [1.0], [1.3], [1.31], [1.29], [1.3]]
    assert [c[0] for c in change_points(one_run)] == [4]  # 4 nights a side when a night has one run
    assert change_points([[1.0], [1.3]]) == []  # 1 vs 1: nothing can be significant


def _history(storage, nights_values: list[tuple[str, list[float]]]):
    for i, (commit, values) in enumerate(nights_values):
        stamp = f"2026-01-{i + 1:02d}-030000"
        recs = [{"schema": 1, "nightly": stamp, "date": stamp[:10], "started": f"{stamp[:10]}T03:00:00",
                 "prefix": "nt", "branch": "main", "commit": commit, "config": "tiny", "repeat": k,
                 "run": f"nt-main-{i}-{k}", "state": "Succeeded", "figures": {"steady_s_per_step": v}}
                for k, v in enumerate(values)]
        recs.append({**recs[0], "branch": "feat", "commit": "f" * 8, "run": f"nt-feat-{i}"})
        storage.write_text(Layout.history(stamp), "".join(json.dumps(r) + "\n" for r in recs))


def test_history_cli_prints_the_trend_and_the_bracketing_commits(tmp_path):
    root = tmp_path / "store"
    storage = open_storage(str(root))
    _history(storage, [(f"c{i}000000", [0.10, 0.101, 0.099, 0.1005]) for i in range(4)]
             + [(f"d{i}000000", [0.13, 0.131, 0.129, 0.1305]) for i in range(3)])
    recs = read_history(storage)
    assert len(recs) == 7 * 5
    ns = nights(recs, "main", "steady_s_per_step", "tiny")
    (cp,) = detect(ns, "steady_s_per_step")
    assert cp.night.nightly == "2026-01-05-030000" and cp.previous.commit == "c3000000"
    assert cp.night.commit == "d0000000" and cp.delta_pct == pytest.approx(30, abs=1)
    r = xrun("history", "--branch", "main", "--metric", "steady_s_per_step", storage=root)
    assert r.returncode == 0, r.stderr
    assert len([ln for ln in r.stdout.splitlines() if ln.startswith("2026-01-")]) == 7
    assert re.search(r"^2026-01-05-030000 +d0000000 +4 +0\.13025 +0\.129 +0\.131  <- change \+29\.9%$", r.stdout, re.M)
    assert ("Change point: Steady-state s/step (median) changed +29.9% on the night of 2026-01-05 "
            "(2026-01-05-030000): between commit c3000000 (2026-01-04-030000) and d0000000") in r.stdout
    r = xrun("history", "--branch", "feat", "--last", "2", storage=root)
    assert r.returncode == 0 and "2 night(s)" in r.stdout and "fewer than 4 runs" in r.stdout
    for args, msg in ((["--metric", "speed"], "--metric: 'speed' is not a history figure"),
                      (["--branch", "nope"], "--branch: no history for 'nope'; branches with history: feat, main"),
                      (["--config", "big"], "--config: no history for 'big' on main")):
        r = xrun("history", *args, storage=root)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr
    r = xrun("history", storage=tmp_path / "empty")
    assert r.returncode == 2 and "no nightly history" in r.stderr


def test_a_second_report_of_the_same_second_gets_its_own_folder(tmp_path):
    storage = open_storage(str(tmp_path / "s"))
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    first = _report_stamp(storage, when)
    assert first == "2026-01-02-030405"
    storage.write_text(f"{Layout.report(first)}/summary.json", "{}")
    assert _report_stamp(storage, when) == "2026-01-02-030405-2"
    storage.write_text(Layout.history("2026-01-02-030405-2"), "")
    assert _report_stamp(storage, when) == "2026-01-02-030405-3"


def test_unreadable_history_is_unreachable_not_a_traceback(tmp_path):
    class Broken:
        def list(self, *a, **k):
            raise OSError("connection refused")

        def url(self, key=""):
            return f"gs://b/{key}"

    with pytest.raises(XrunError) as e:
        read_history(Broken())  # type: ignore[arg-type]
    assert e.value.exit_code == 3 and "connection refused" in str(e.value)


TREND_PROBE = """<script>
window.addEventListener('load', function () { setTimeout(function () {
  const plots = Array.from(document.querySelectorAll('.plot[id^=trend]')).map(d => ({
    id: d.id, points: d.data.reduce((n, t) => n + t.y.length, 0), names: d.data.map(t => t.name),
    shapes: (d.layout.shapes || []).length, note: (d.layout.annotations || []).map(a => a.text),
    drawn: d.querySelectorAll('.main-svg .scatterlayer .trace').length}));
  const runset = Array.from(document.querySelectorAll('table.runset tr')).map(r => r.cells[0].textContent);
  const outcomes = Array.from(document.querySelectorAll('table.runs tr')).map(r => r.cells[2].textContent);
  document.body.setAttribute('data-probe', JSON.stringify({plots, runset, outcomes,
    verdict: document.querySelector('.verdict').textContent,
    requests: performance.getEntriesByType('resource').length}));
}, 200); });
</script>"""


def test_the_nightly_page_shows_run_sets_states_and_the_trend_in_chromium(tmp_path):
    """The nightly report of repeated runs with a history: the run-level table, the states
    the summary gives (a run that never started too), and a trend chart per figure with the
    change point on the base marked and its commits named."""
    import html as _html

    from test_report import chromium

    from orchestrator.analysis.report import Section, render_report
    from orchestrator.services.nightly import _trends

    root = tmp_path / "store"
    storage = open_storage(str(root))
    _history(storage, [(f"c{i}000000", [0.10, 0.101, 0.099, 0.1005]) for i in range(4)]
             + [(f"d{i}000000", [0.13, 0.131, 0.129, 0.1305]) for i in range(2)])
    cfg = load_nightly(_file(tmp_path, {**LOCAL, "storage": str(root)}))
    trends = _trends(cfg, read_history(storage))
    base = _stored(root, "b", 4, 0.150)
    cand = _stored(root, "s", 4, 0.180, seed0=10, branch="feat")
    rs = compare_runs(base, cand)
    states = {r.name: ("Succeeded", "") for r in base + cand} | {"nt-feat-x": ("NotSubmitted", "quota exceeded")}
    page = render_report([Section("Config tiny", base + cand, [rs.per_step], run_sets=[rs], states=states)],
                         trends=trends, verdict=("INCOMPLETE", "INCOMPLETE: 1 comparison(s) lack runs"))
    probe = tmp_path / "p.html"
    probe.write_text(page.replace("</body>", TREND_PROBE + "</body>"))
    r = chromium("--dump-dom", "--window-size=1280,2000", probe.as_uri(), tmp=tmp_path)
    got = json.loads(_html.unescape(re.search(r'data-probe="([^"]*)"', r.stdout)[1]))
    assert got["requests"] == 0 and got["verdict"].startswith("INCOMPLETE")
    assert got["runset"][:2] == ["Metric (per-run median)", "Steady-state s/step (median)"]
    assert "NotSubmitted: quota exceeded" in got["outcomes"] and got["outcomes"].count("Succeeded") == 8
    tiny = [p for p in got["plots"] if p["points"]]
    steady = tiny[0]
    assert steady["points"] == (6 * 4 + 6) + (6 + 6)  # main: runs + medians; feat: 1 run a night + medians
    assert steady["names"] == ["main runs", "main", "feat runs", "feat"] and steady["drawn"] == 4
    assert steady["shapes"] == 1 and steady["note"] == ["+29.9% (c3000000 → d0000000)"]  # commits as given, up to 12


def test_every_failure_path_is_incomplete_with_its_reason(tmp_path, monkeypatch):
    """A run deleted from outside, a run whose supervisor died, a run that never started:
    each comparison is INCOMPLETE with the reason, the run table says the same state, and
    nothing reads "no regression". Only the submission is replaced (it writes the stored
    run each case leaves); the nightly follows it through the real local backend's status."""
    import subprocess
    import sys

    from orchestrator.services import nightly as svc

    root = tmp_path / "store"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs: the supervisor "died"

    def submit(run):
        branch = run.branch.name
        if branch == "never":
            raise XrunError("backend refused the run: quota exceeded", 1)
        state = "Deleted" if branch == "killed" else "Succeeded"
        write_stored_run(root, run.name, RunShape(seed=run.index, commit="abc1234aaaa"), branch=branch, state=state)
        if branch == "orphan":  # the supervisor was killed mid-run: state.json says Running
            p = root / "runs" / run.name / "state.json"
            st = json.loads(p.read_text())
            p.write_text(json.dumps({**st, "state": "Running", "supervisor_pid": dead.pid}))

    monkeypatch.setattr(svc, "submit_run", submit)
    data = {**LOCAL, "storage": str(root), "configs": {"tiny": LOCAL["configs"]["one"]},
            "branches": {"main": {"image": "i:a", "commit": "a1"}, "killed": {"image": "i:b"},
                         "orphan": {"image": "i:c"}, "never": {"image": "i:d"}}}
    res = svc.run_nightly(load_nightly(_file(tmp_path, data)), log=lambda m: None)
    assert res.exit_code == 1 and res.summary["verdict"] == "INCOMPLETE"
    by = {e["candidate"]: e for e in res.summary["comparisons"]}
    assert all(e["state"] == "INCOMPLETE" and not e["regressed"] for e in by.values())
    assert "killed) Deleted" in by["killed"]["verdict"]
    assert "orphan) Failed: local supervisor is gone" in by["orphan"]["verdict"]
    assert "never) NotSubmitted: backend refused the run: quota exceeded" in by["never"]["verdict"]
    states = {r["branch"]: r["state"] for r in res.summary["runs"]}
    assert states == {"main": "Succeeded", "killed": "Deleted", "orphan": "Failed", "never": "NotSubmitted"}
    md = res.summary_md
    assert "no regression" not in md and "**INCOMPLETE: 3 comparison(s)" in md
    for branch, state in states.items():  # the run table agrees with the verdicts
        assert re.search(rf"\| {branch} \| tiny \| 1 \| {state}", md), branch
    page = (root / "reports" / res.summary["nightly"] / "index.html").read_text()
    assert "INCOMPLETE: 3 comparison(s)" in page and "Failed: local supervisor is gone" in page
    hist = [json.loads(ln) for ln in (root / Layout.history(res.summary["nightly"])).read_text().splitlines()]
    assert {h["branch"]: h["state"] for h in hist} == states
