"""`xrun nightly` end to end on the local backend.

Night 1: three "branches" of the same image, 4 repeats each, interleaved: the base, a
candidate with identical code, and a candidate whose branch env (XRUN_TEST_STEP_DELAY, the
workload's slowdown switch) makes each step slower. With 4 runs a side the verdict rests on
per-run figures: the identical one is "within noise", the slow one "regressed". Night 1's 12
runs are stored synthetic runs (tests/synthetic_runs.py): the nightly's own planning,
interleaving, verdicts, report and history run for real on them, only its submit and follow
are replaced (each planned run's spec decides its stored run: the branch's step delay sets
its step time). One real nightly of real runs is tests/test_nightly_git.py's. Night 2 (a
crashing candidate, one repeat) runs for real, the real workload on the local backend: the
comparison is INCOMPLETE (never "no regression"), the history has both nights and the
report shows the trend.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import run_in_process, xrun, xrun_env
from synthetic_runs import RunShape, write_stored_run

from orchestrator.analysis.compare import RUN_METRICS
from orchestrator.readers.history import night_order
from orchestrator.readers.loaders import load_run
from orchestrator.services import nightly
from xrun_contract import Env

STEPS = 8
REPEATS = 4
DELAY = 0.10  # seconds added to every step of every branch ...
SLOW_DELAY = 0.30  # ... and this much for the slow branch: +200%, far above a loaded CPU's noise
IMAGE = "xrun-workload:dev"


def _nightly_file(tmp, store, branches: dict, repeats: int, name: str):
    spec = {
        "prefix": "nt",
        "storage": str(store),
        "slice": {"accelerator": "cpu-1", "cpu_devices_per_host": 1},
        "base": "main",
        "branches": branches,
        "configs": {"tiny": {"command": f"python3 -m workload.train --preset tiny steps={STEPS} checkpoint_every=0",
                             "repeats": repeats}},
        "backend": "local",
        "threshold": "25%",  # margin for a CPU shared with other jobs; the slowdown is about +190%
        "timeout": 600,  # a bound on a hung run, not a timing: a loaded CI host took 91 s for one
    }
    path = tmp / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _branch(commit: str, delay: float, **env: str) -> dict:
    return {"image": IMAGE, "commit": commit, "env": {"XRUN_TEST_STEP_DELAY": str(delay), **env}}


@dataclass
class _SameLoss(RunShape):
    """Seeded step times, one loss curve for every run (the same code trains the same)."""

    def samples(self) -> list[dict[str, float]]:
        out = super().samples()
        for s in out:
            s["loss"] = self.loss0 * (1 - self.loss_decay) ** s["step"]
        return out


SUBMITTED: list[Any] = []  # night 1's planned runs, as the nightly submitted them


def _synthetic_submit(run: Any) -> None:
    """A stored run in place of a real one: the step time is the branch env's step delay
    on top of a 0.05 s step, so the slow branch is slow because its env says so."""
    SUBMITTED.append(run)
    delay = float(run.spec.env.get(Env.TEST_STEP_DELAY, "0"))
    shape = _SameLoss(steps=STEPS, seconds=0.05 + delay, jitter=0.004, compile_s=2.0, devices=1,
                      accelerator="cpu-1", commit=run.branch.commit, seed=run.index,
                      config={"preset": "tiny", "steps": STEPS})
    write_stored_run(Path(run.spec.storage), run.name, shape, branch=run.branch.name)


def _synthetic_follow(run: Any, timeout_s: float, poll_s: float, on_view: Any = None) -> Any:
    state = json.loads((Path(run.spec.storage) / "runs" / run.name / "state.json").read_text())
    return nightly.RunOutcome(run, state["state"], "", 1.0)


@pytest.fixture(scope="module")
def nights(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nightly")
    store = tmp / "store"
    one = _nightly_file(tmp, store, {"main": _branch("aaaa1111", DELAY), "same": _branch("bbbb2222", DELAY),
                                     "feat/slow": _branch("cccc3333", SLOW_DELAY)}, REPEATS, "one.yaml")
    SUBMITTED.clear()
    with pytest.MonkeyPatch.context() as mp:  # the CLI runs in this process: the patches hold
        mp.setattr(nightly, "submit_run", _synthetic_submit)
        mp.setattr(nightly, "follow", _synthetic_follow)
        r1 = run_in_process(["nightly", "-f", str(one)],
                            env=xrun_env(store, XDG_STATE_HOME=str(tmp / "state")))
    two = _nightly_file(tmp, store, {"main": _branch("dddd4444", DELAY),
                                     "feat/crash": _branch("eeee5555", DELAY, XRUN_TEST_FAIL_AT_STEP="2:1")},
                        1, "two.yaml")
    r2 = xrun("nightly", "-f", str(two), storage=store, timeout=200, XDG_STATE_HOME=str(tmp / "state"))
    return r1, r2, store


def _reports(store):
    return sorted(p for p in (store / "reports").iterdir())


def test_repeats_run_interleaved_and_the_verdict_rests_on_runs(nights):
    r1, _, store = nights
    assert r1.returncode == 1, r1.stderr[-3000:] + r1.stdout[:3000]  # something regressed
    first = _reports(store)[0]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-\d{6}", first.name)
    summary = json.loads((first / "summary.json").read_text())
    assert summary["verdict"] == "REGRESSED" and not summary["incomplete"]
    assert [run["branch"] for run in summary["runs"]] == ["main", "same", "feat/slow"] * REPEATS
    assert [run["repeat"] for run in summary["runs"]] == [i for i in range(REPEATS) for _ in range(3)]
    # What each run was submitted with: its branch's image, commit and env, in plan order.
    assert [run.name for run in SUBMITTED] == [run["name"] for run in summary["runs"]]
    delays = {"main": DELAY, "same": DELAY, "feat/slow": SLOW_DELAY}
    for run in SUBMITTED:
        assert run.spec.image == IMAGE and run.spec.storage == str(store)
        assert run.spec.env[Env.TEST_STEP_DELAY] == str(delays[run.branch.name])
        assert f"steps={STEPS}" in run.spec.command
    for i, run in enumerate(summary["runs"]):
        assert re.fullmatch(rf"nt-(main|same|feat-slow)-\d{{8}}-\d{{6}}-{i}", run["name"]), run["name"]
        assert json.loads((store / "runs" / run["name"] / "state.json").read_text())["state"] == "Succeeded"
    by_cand = {c["candidate"]: c for c in summary["comparisons"]}
    same, slow = by_cand["same"], by_cand["feat/slow"]
    for c in (same, slow):
        assert c["comparison"]["on_runs"] and c["comparison"]["n_base_runs"] == REPEATS
        assert "per-run values" in c["basis"]
    assert same["state"] == "within noise" and same["verdict"].startswith("within noise") and same["regressions"] == []
    assert slow["state"] == "REGRESSED" and "Steady-state s/step (median)" in slow["regressions"]
    rows = {row["metric"]: row for row in slow["comparison"]["rows"]}
    steady = rows["Steady-state s/step (median)"]
    assert steady["verdict"] == "regressed" and steady["delta_pct"] > 100
    assert steady["n_base"] == steady["n_cand"] == REPEATS and "runs" in steady["diff"]
    assert steady["p_value"] == pytest.approx(2 / 70)  # exact Mann-Whitney, 4 vs 4, no overlap
    assert rows["Tok/s (steady median)"]["verdict"] == "regressed"  # marked; the steady-state row gates
    assert slow["regressions"] == ["Steady-state s/step (median)"]
    same_rows = {row["metric"]: row for row in same["comparison"]["rows"]}
    assert not same_rows["Steady-state s/step (median)"]["beyond_threshold"]
    assert same_rows["Final loss"]["verdict"] == "identical"  # same code: every run's loss matches
    # The per-step detail: same versions, devices, config, steps. The last step's TFLOP/s and
    # Tok/s are one step each: when they point the other way than the steady-state median, the
    # warning says so, and nothing else is said.
    # On a loaded machine a late-compiling second step can decide a few steps' mean; that is
    # said too, with its cause, and is no verdict.
    assert [w for w in same["warnings"] if "but the steady-state median says" not in w
            and not (w.startswith("Avg s/step differs by") and "first steps: compilation" in w)] == []
    # The per-step test of the first pair stays as supporting detail.
    per_step = {row["metric"]: row for row in slow["comparison"]["per_step"]["rows"]}
    assert per_step["Steady-state s/step (median)"]["verdict"] == "regressed"
    md = r1.stdout
    assert md == (first / "summary.md").read_text()
    assert re.search(r"\| tiny \| feat/slow \| (nt-feat-slow-\S+, ){3}nt-feat-slow-\S+ "
                     r"\| REGRESSED: .*Steady-state s/step", md)
    assert re.search(r"\| tiny \| same \| [^|]+ "
                     r"\| within noise: no regression beyond 25% \(per-run test, n=4/4 runs\) \|", md)
    assert "| Metric (per-run median) | main aaaa1111 | feat/slow cccc3333 |" in md


def test_a_crashing_candidate_is_incomplete_and_history_has_both_nights(nights):
    _, r2, store = nights
    assert r2.returncode == 1, r2.stderr[-3000:] + r2.stdout[:3000]
    first, second = _reports(store)  # the second nightly wrote its own folder
    summary = json.loads((second / "summary.json").read_text())
    assert summary["verdict"] == "INCOMPLETE" and summary["incomplete"]
    (entry,) = summary["comparisons"]
    assert entry["state"] == "INCOMPLETE" and entry["regressed"] is False
    crash = next(r for r in summary["runs"] if r["branch"] == "feat/crash")
    assert crash["state"] == "Failed" and crash["name"] in entry["verdict"] and "Failed" in entry["verdict"]
    assert "INCOMPLETE" in r2.stdout and "no regression" not in r2.stdout
    assert re.search(rf"\| {crash['name']} \| feat/crash \| tiny \| 1 \| Failed", r2.stdout)
    # History: one object per nightly, one record per run.
    objs = sorted((store / "history").iterdir(), key=lambda o: night_order(o.name))
    assert [o.name for o in objs] == [f"{first.name}.jsonl", f"{second.name}.jsonl"]
    recs = [json.loads(line) for o in objs for line in o.read_text().splitlines()]
    assert len(recs) == 3 * REPEATS + 2
    main1 = [r for r in recs if r["branch"] == "main" and r["nightly"] == first.name]
    assert len(main1) == REPEATS and all(r["figures"]["steady_s_per_step"] > DELAY for r in main1)
    assert main1[0]["commit"] == "aaaa1111" and main1[0]["versions"]["jax"]
    bad = next(r for r in recs if r["branch"] == "feat/crash")
    assert bad["state"] == "Failed"
    # The trend: `xrun history` and the report's trend charts over both nights.
    r = xrun("history", "--branch", "main", "--metric", "steady_s_per_step", storage=store)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("20",))]
    assert [ln.split()[:3] for ln in lines] == [[first.name, "aaaa1111", str(REPEATS)], [second.name, "dddd4444", "1"]]
    page = (second / "index.html").read_text()
    assert page.count('<div class="plot" id="trend-') == len(RUN_METRICS)  # one per figure
    assert first.name in page and second.name in page
    assert "INCOMPLETE" in page
    rec = load_run(crash["name"], str(store))
    assert not rec.finished
