"""`xrun nightly` end to end on the local backend with the real workload (JAX on CPU).

Three "branches" of the same image run one after another on one local host: the base, a
candidate with identical code, and a candidate with the workload's deliberate slowdown
switch (XRUN_TEST_STEP_DELAY). The report must flag the slow one and nothing else, and the
exit code must say so. Every branch sleeps a fixed time per step so that CPU noise on a
2-core CI machine is small next to a step; the slow branch sleeps twice as long.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from cli_helpers import xrun

from orchestrator.readers.loaders import load_run

STEPS = 24
DELAY = 0.05  # seconds added to every step of every branch ...
SLOW_DELAY = 0.10  # ... and this much for the slow branch


@pytest.fixture(scope="module")
def nightly(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nightly")
    store = tmp / "store"
    image = "xrun-workload:dev"
    spec = {
        "prefix": "nt",
        "storage": str(store),
        "slice": {"accelerator": "cpu-1", "cpu_devices_per_host": 1},
        "base": "main",
        "branches": {
            "main": {"image": image, "commit": "aaaa1111", "env": {"XRUN_TEST_STEP_DELAY": str(DELAY)}},
            "same": {"image": image, "commit": "bbbb2222", "env": {"XRUN_TEST_STEP_DELAY": str(DELAY)}},
            "feat/slow": {"image": image, "commit": "cccc3333", "env": {"XRUN_TEST_STEP_DELAY": str(SLOW_DELAY)}},
        },
        "configs": {"tiny": {"command": f"python3 -m workload.train --preset tiny steps={STEPS} checkpoint_every=0"}},
        "backend": "local",
        "threshold": "10%",  # CPU-noise margin; the slowdown is about +90%
        "timeout": 240,
    }
    path = tmp / "nightly.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    r = xrun("nightly", "-f", str(path), storage=store, timeout=600, XDG_STATE_HOME=str(tmp / "state"))
    return r, store


def test_nightly_flags_the_slow_branch_and_only_it(nightly):
    r, store = nightly
    assert r.returncode == 1, r.stderr[-4000:]  # something regressed
    (day,) = [p for p in (store / "reports").iterdir()]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", day.name)
    summary = json.loads((day / "summary.json").read_text())
    names = [run["name"] for run in summary["runs"]]
    assert [run["branch"] for run in summary["runs"]] == ["main", "same", "feat/slow"]
    for i, name in enumerate(names):
        assert re.fullmatch(rf"nt-(main|same|feat-slow)-\d{{8}}-\d{{6}}-{i}", name), name
        assert json.loads((store / "runs" / name / "state.json").read_text())["state"] == "Succeeded"
    by_cand = {c["candidate"]: c for c in summary["comparisons"]}
    same, slow = by_cand["same"], by_cand["feat/slow"]
    assert same["regressed"] is False and same["regressions"] == []
    assert slow["regressed"] is True and "Steady-state s/step (median)" in slow["regressions"]
    rows = {row["metric"]: row for row in slow["comparison"]["rows"]}
    steady = rows["Steady-state s/step (median)"]
    assert steady["verdict"] == "regressed" and steady["delta_pct"] > 50
    assert rows["Tok/s"]["delta"] < 0  # the last step's value: shown, never marked
    same_rows = {row["metric"]: row for row in same["comparison"]["rows"]}
    assert not same_rows["Steady-state s/step (median)"]["beyond_threshold"]
    assert same_rows["Final loss"]["verdict"] in ("identical", "within noise")
    # Same versions, devices, config, steps; both finished. The last step's TFLOP/s and Tok/s
    # are one step each (on a shared CPU one step can swing by a third): when they point the
    # other way than the steady-state median, the warning says so, and nothing else is said.
    assert [w for w in same["warnings"] if "but the steady-state median says" not in w] == []
    # Both sides measured the same way: steps from the metrics, time from submit.
    for side in ("base", "candidate"):
        run = slow["comparison"][side]
        assert run["steps_executed"] == STEPS and run["time_to_first_step_s"] > 0
        assert run["versions"]["jax"] and run["goodput"]["categories"]["productive"] > 0
    md = r.stdout
    assert md == (day / "summary.md").read_text()
    assert re.search(r"\| tiny \| feat/slow \| nt-feat-slow-\S+ \| REGRESSED: .*Steady-state s/step", md)
    assert re.search(r"\| tiny \| same \| nt-same-\S+ \| no regression beyond the threshold \|", md)
    assert "| Metric | main aaaa111 | feat/slow cccc333 | Diff (feat/slow cccc333 − main aaaa111) |" in md
    page = (day / "index.html").read_text()
    assert page.count('<table class="cmp">') == 2 and page.count('<svg class="chart"') == 3
    assert "REGRESSED" in page


def test_compare_cli_on_the_nightly_runs(nightly):
    _, store = nightly
    runs = sorted((store / "runs").iterdir(), key=lambda p: p.name.rsplit("-", 1)[-1])
    base, same, slow = (p.name for p in runs)
    assert xrun("compare", base, same, storage=store).returncode == 0
    r = xrun("compare", base, slow, "--format", "json", storage=store)
    assert r.returncode == 1 and "Steady-state s/step (median)" in json.loads(r.stdout)["regressions"]
    rec = load_run(base, str(store))
    assert rec.label == "main aaaa111" and rec.finished and rec.kind == "storage"
    assert rec.steps.count == STEPS and rec.process_id == 0
    assert Path(rec.source).name == base
