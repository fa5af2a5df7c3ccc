"""`xrun compare`: the statistics, the table's exact form, verdicts that respect noise, the
confounders said above the table, and the CLI's outputs and exit codes."""

from __future__ import annotations

import json
import random

import pytest
from cli_helpers import xrun
from synthetic_runs import RunShape, write_log, write_stored_run

from orchestrator.analysis.compare import compare
from orchestrator.analysis.stats import mann_whitney_u, mean_diff_test, median_ci
from orchestrator.readers.loaders import load_run

ROW_NAMES = ["Parameters", "Final loss", "TFLOP/s", "Tok/s", "Avg s/step", "Memory %", "JAX",
             "Steady-state s/step (median)", "Step time spread (IQR)", "Checkpoint stall total",
             "Time to first step", "Goodput %"]


def run(tmp_path, name: str, **kw) -> object:
    return load_run(str(write_log(tmp_path / f"{name}.log", RunShape(**kw))))


def rows(c) -> dict:
    return {r.metric: r for r in c.rows}


def SHAPE_LAST(**kw) -> dict:  # noqa: N802 - reads like the shape it builds
    """The last step's sample of a RunShape (what TFLOP/s and Tok/s show)."""
    return RunShape(**kw).samples()[-1]


# ---------------------------------------------------------------------------------------
# Statistics against scipy (a test-only oracle: the CLI itself has no numpy or scipy).


def test_mann_whitney_matches_scipy_exact_and_asymptotic():
    from scipy.stats import mannwhitneyu

    rng = random.Random(5)
    for trial in range(200):
        n1, n2 = rng.randint(1, 40), rng.randint(1, 40)
        rounded = trial % 2 == 0  # ties force the asymptotic branch
        x = [round(rng.gauss(0, 1), 1 if rounded else 9) for _ in range(n1)]
        y = [round(rng.gauss(0.6, 1), 1 if rounded else 9) for _ in range(n2)]
        u, p = mann_whitney_u(x, y)
        ref = mannwhitneyu(x, y, alternative="two-sided")
        assert u == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-12)


def test_median_ci_and_mean_test():
    assert median_ci([float(i) for i in range(1, 21)]) == (6.0, 15.0)  # binomial order statistics
    assert median_ci([1.0, 2.0, 3.0]) is None  # too few for 95%
    rng = random.Random(1)
    x = [rng.gauss(1.0, 0.05) for _ in range(50)]
    d, p = mean_diff_test(x, [v + 0.1 for v in x])
    assert d == pytest.approx(0.1) and p < 0.001
    d, p = mean_diff_test(x, [rng.gauss(1.0, 0.05) for _ in range(50)])
    assert p > 0.05 or abs(d) < 0.03
    big = [rng.gauss(1.0, 0.05) for _ in range(3000)]  # Welch branch
    assert mean_diff_test(big, [v * 1.05 for v in big])[1] < 1e-6


# ---------------------------------------------------------------------------------------
# The table


def test_table_has_the_exact_form_and_rows(tmp_path):
    base = run(tmp_path, "main", commit="abc1234ffff", seed=1)
    cand = run(tmp_path, "feat", commit="def5678eeee", seed=2)
    md = compare(base, cand).markdown()
    table = [ln for ln in md.splitlines() if ln.startswith("|")]
    assert table[0] == "| Metric | main abc1234ffff | feat def5678eeee | Diff (feat def5678eeee − main abc1234ffff) |"
    assert table[1] == "|---|---|---|---|"
    assert [ln.split(" | ")[0].lstrip("| ") for ln in table[2:]] == ROW_NAMES
    cells = {ln.split(" | ")[0].lstrip("| "): ln.strip("| ").split(" | ") for ln in table[2:]}
    assert cells["Parameters"][1:] == ["0.853 billion", "0.853 billion", "—"]
    assert cells["JAX"][1:] == ["0.10.2", "0.10.2", "—"]
    assert cells["Memory %"][1:] == ["2.07", "2.07", "0"]
    # The familiar rows mean what they mean in MaxText's reports: TFLOP/s and Tok/s are the
    # last step's (one value, never marked), Avg s/step the mean of the steps after the first.
    last = SHAPE_LAST(seed=1), SHAPE_LAST(seed=2)
    assert cells["TFLOP/s"][1:3] == [f"{last[0]['tflops']:.3f}", f"{last[1]['tflops']:.3f}"]
    assert cells["Tok/s"][1:3] == [f"{last[0]['tokens']:.1f}", f"{last[1]['tokens']:.1f}"]
    assert "not tested: one step's value" in cells["Tok/s"][3]
    assert "n=57/57 steps" in cells["Steady-state s/step (median)"][3]
    assert "n=59/59 steps after the first" in cells["Avg s/step"][3]
    notes = md.split("Notes:")[1]
    assert "57 of 60 steps" in notes and "Mann-Whitney" in notes
    assert "TFLOP/s: the last step's TFLOP/s/device" in notes
    assert "Avg s/step: mean of every step after the first" in notes


def test_a_real_slowdown_is_regressed_and_exits_1(tmp_path):
    base = run(tmp_path, "main", seed=1)
    slow = run(tmp_path, "slow", seed=2, seconds=0.150 * 1.10)
    c = compare(base, slow, threshold_pct=5)
    r = rows(c)
    assert r["Steady-state s/step (median)"].verdict == "regressed"
    assert r["Steady-state s/step (median)"].beyond_threshold
    assert r["Steady-state s/step (median)"].delta_pct == pytest.approx(10, abs=1.5)
    # The last step's Tok/s and TFLOP/s show the change but are one value each: never marked.
    assert r["Tok/s"].verdict == "not tested" and r["Tok/s"].delta < 0 and not r["Tok/s"].gating
    assert r["TFLOP/s"].verdict == "not tested" and r["TFLOP/s"].delta < 0
    # The mean is marked too, but the familiar rows never set the exit code: the steady-state does.
    assert r["Avg s/step"].verdict == "regressed" and not r["Avg s/step"].gating
    assert [x.metric for x in c.regressions] == ["Steady-state s/step (median)"]
    assert "**regressed**" in r["Steady-state s/step (median)"].diff
    assert c.exit_code == 1
    assert not any("says" in w for w in c.warnings)  # familiar and honest rows agree
    # The same slowdown is below a 15% threshold: still marked, but no alert.
    c15 = compare(base, slow, threshold_pct=15)
    steady15 = rows(c15)["Steady-state s/step (median)"]
    assert steady15.verdict == "regressed" and c15.exit_code == 0
    assert "under the 15% threshold" in steady15.diff
    # And the other way round it is an improvement.
    back = compare(slow, base)
    assert rows(back)["Steady-state s/step (median)"].verdict == "improved" and back.exit_code == 0


def test_same_code_is_within_noise_across_seeds(tmp_path):
    flagged = 0
    for seed in range(8):
        c = compare(run(tmp_path, f"a{seed}", seed=100 + seed, jitter=0.01),
                    run(tmp_path, f"b{seed}", seed=200 + seed, jitter=0.01))
        flagged += c.exit_code
        for name in ("Avg s/step", "Steady-state s/step (median)"):
            assert rows(c)[name].verdict in ("within noise", "regressed", "improved")
        for name in ("TFLOP/s", "Tok/s"):  # one step's value: shown, never marked
            assert rows(c)[name].verdict in ("not tested", "same")
        assert c.warnings == []  # one step's noise is no disagreement
    assert flagged == 0


def test_a_sign_alone_is_never_a_verdict(tmp_path):
    """A 3% shift under 20% noise is within noise, whichever sign the medians have."""
    base = run(tmp_path, "noisy-a", seed=3, jitter=0.03, steps=30)
    cand = run(tmp_path, "noisy-b", seed=4, jitter=0.03, steps=30, seconds=0.155)
    r = rows(compare(base, cand))["Steady-state s/step (median)"]
    assert r.delta != 0 and r.verdict == "within noise" and "within noise (p=" in r.diff
    assert r.p_value >= 0.05


def test_one_checkpoint_stall_does_not_pass_for_a_slowdown(tmp_path):
    """The trap: 'Avg s/step' dominated by one checkpoint stall. The warning says so, the
    steady-state row excludes it, and no regression is reported."""
    base = run(tmp_path, "main", seed=1)
    stalled = run(tmp_path, "feat", seed=2, ckpt_every=50, stall_s=30.0)
    c = compare(base, stalled)
    r = rows(c)
    assert r["Avg s/step"].delta_pct > 50  # the naive figure looks terrible ...
    assert r["Avg s/step"].verdict == "within noise"  # ... but one stall is not a trend
    assert r["Steady-state s/step (median)"].verdict == "within noise"
    assert r["Checkpoint stall total"].cand == "30.000 s" and r["Checkpoint stall total"].base == "0.000 s"
    assert any("'Avg s/step' of feat" in w and "dominated by checkpoint stalls" in w for w in c.warnings)
    assert c.exit_code == 0
    md = c.markdown()
    assert md.index("dominated by checkpoint stalls") < md.index("| Metric |")  # above the table


def test_confounders_are_said_above_the_table(tmp_path):
    base = run(tmp_path, "main", commit="abc1234aaaa", config={"steps": 60, "batch": 8})
    cand = run(tmp_path, "feat", commit="abc1234aaaa", jax="0.9.2", jaxlib="0.9.1", devices=8,
               accelerator="v6e-16", process_id=3, steps=50, exit_code=None,
               config={"steps": 50, "batch": 8})
    c = compare(base, cand)
    text = "\n".join(c.warnings)
    for expected in ("different JAX: main abc1234aaaa ran 0.10.2, feat abc1234aaaa ran 0.9.2",
                     "different jaxlib", "different accelerators",
                     "different device counts: main abc1234aaaa 4, feat abc1234aaaa 8",
                     "same commit abc1234aaaa on both sides", "logs from different processes",
                     "different step counts", "different configs: steps 60 -> 50",
                     "feat abc1234aaaa did not finish: unknown (no exit code)"):
        assert expected in text, expected
    assert rows(c)["JAX"].diff == "**differs** (see warnings)"
    assert c.candidate_failed and c.exit_code == 1  # a candidate that did not finish alerts
    md = c.markdown()
    assert md.index("different JAX") < md.index("| Metric |")
    clean = compare(run(tmp_path, "x", commit="1111111a"), run(tmp_path, "y", commit="2222222b", seed=9))
    assert clean.warnings == []


def test_labels_come_from_branch_and_commit(tmp_path):
    root = tmp_path / "root"
    write_stored_run(root, "nightly-main-1", RunShape(commit="abcdef0123456789"), branch="main")
    write_stored_run(root, "nightly-feat-2", RunShape(commit="0123456789abcdef", seed=3), branch="feat/x")
    c = compare(load_run("nightly-main-1", str(root)), load_run("nightly-feat-2", str(root)))
    assert (c.base_label, c.cand_label) == ("main abcdef0", "feat/x 0123456")
    same = compare(load_run("nightly-main-1", str(root)), load_run("nightly-main-1", str(root)))
    assert same.base_label != same.cand_label  # disambiguated
    assert any("the same run on both sides" in w for w in same.warnings)
    assert all(r.verdict in ("identical", "same", "") or r.metric == "Goodput %" for r in same.rows)


def test_json_output(tmp_path):
    c = compare(run(tmp_path, "main", seed=1), run(tmp_path, "slow", seed=2, seconds=0.2))
    d = json.loads(c.json())
    assert d["exit_code"] == 1 and d["regressed"] is True and d["threshold_pct"] == 5.0
    assert [r["metric"] for r in d["rows"]] == ROW_NAMES
    steady = next(r for r in d["rows"] if r["metric"].startswith("Steady"))
    assert steady["verdict"] == "regressed" and steady["n_base"] == 57 and steady["p_value"] < 0.001
    assert d["base"]["steady_steps"] == 57 and len(d["base"]["steady_median_ci95_s"]) == 2
    assert set(d["candidate"]["goodput"]["categories"]) >= {"productive", "compilation", "checkpoint"}


# ---------------------------------------------------------------------------------------
# The CLI


def test_cli_outputs_and_exit_codes(tmp_path):
    main = write_log(tmp_path / "main.log", RunShape(seed=1))
    same = write_log(tmp_path / "same.log", RunShape(seed=2))
    slow = write_log(tmp_path / "slow.log", RunShape(seed=3, seconds=0.18))
    r = xrun("compare", str(main), str(same), storage=tmp_path / "root")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # Markdown (what CI pipes): the verdict first, as on the terminal, and as the last line.
    assert lines[0] == "**Verdict:** OK: no significant regression beyond 5%"
    assert lines[2] == "| Metric | main | same | Diff (same − main) |"
    assert lines[-1] == "Verdict: OK: no significant regression beyond 5%"
    r = xrun("compare", str(main), str(slow), storage=tmp_path / "root")
    assert r.returncode == 1 and "**regressed**" in r.stdout
    assert r.stdout.splitlines()[-1].startswith("Verdict: REGRESSED beyond 5%: Steady-state s/step (median) +")
    r = xrun("compare", str(main), str(slow), "--threshold", "25%", storage=tmp_path / "root")
    assert r.returncode == 0
    r = xrun("compare", str(main), str(slow), "--format", "json", storage=tmp_path / "root")
    assert r.returncode == 1 and json.loads(r.stdout)["regressions"]
    out = tmp_path / "cmp.html"
    r = xrun("compare", str(main), str(slow), "--format", "html", "-o", str(out), storage=tmp_path / "root")
    assert r.returncode == 1 and out.read_text().startswith("<!DOCTYPE html>") and r.stdout == ""


@pytest.mark.parametrize("args, field", [
    (["--threshold", "5x"], "--threshold"),
    (["--threshold", "-3%"], "--threshold"),
    (["--format", "xml"], "--format"),
    (["--warmup", "-1"], "--warmup"),
    (["--alpha", "2"], "--alpha"),
])
def test_cli_bad_options_exit_2_and_write_nothing(tmp_path, args, field):
    main = write_log(tmp_path / "main.log", RunShape(seed=1))
    out = tmp_path / "out.md"
    r = xrun("compare", str(main), str(main), *args, "-o", str(out), storage=tmp_path / "root")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], r.stderr
    assert not out.exists()


def test_cli_bad_runs_exit_2_and_write_nothing(tmp_path):
    main = write_log(tmp_path / "main.log", RunShape(seed=1))
    junk = tmp_path / "junk.txt"
    junk.write_text("nothing useful\n")
    out = tmp_path / "out.md"
    cases = [
        ([str(main), str(tmp_path / "missing.log")], "CANDIDATE: no such file"),
        ([str(junk), str(main)], "BASE: "),
        (["no-such-run", str(main)], "BASE: no run named 'no-such-run'"),
        ([str(main), str(main), "-o", str(tmp_path / "nodir" / "x.md")], "--output: folder"),
    ]
    for args, message in cases:
        r = xrun("compare", *args, "-o", str(out), storage=tmp_path / "root") if "-o" not in args else \
            xrun("compare", *args, storage=tmp_path / "root")
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, r.stderr
        assert not out.exists() and r.stdout == ""


def test_parameter_counts_compare_at_the_log_lines_precision(tmp_path):
    from orchestrator.readers.record import format_params

    root = tmp_path / "root"
    write_stored_run(root, "exact", RunShape(params_billions=0.8531))  # 853,100,000 from metrics
    write_stored_run(root, "exact2", RunShape(params_billions=0.8532, seed=2))
    logged = run(tmp_path, "logged", params_billions=0.853)  # "0.853 billion" from a log line
    exact, exact2 = load_run("exact", str(root)), load_run("exact2", str(root))
    c = compare(logged, exact)
    assert rows(c)["Parameters"].diff == "—" and not any("parameter counts" in w for w in c.warnings)
    c = compare(exact, exact2)  # exact on both sides: 100,000 parameters apart is a difference
    assert rows(c)["Parameters"].verdict == "differs"
    assert any("different parameter counts" in w for w in c.warnings)
    assert [format_params(n) for n in (853_100_000, 106_816, 4_321)] == ["0.853 billion", "0.107 million", "4,321"]


def test_a_restart_is_said_but_its_redone_steps_are_not_a_step_count_difference(tmp_path):
    root = tmp_path / "root"
    write_stored_run(root, "plain", RunShape(steps=40, ckpt_every=10, stall_s=0.2, seed=1))
    write_stored_run(root, "restarted", RunShape(steps=40, ckpt_every=10, stall_s=0.2, seed=2), restart_at=25)
    c = compare(load_run("plain", str(root)), load_run("restarted", str(root)))
    assert any("restarted 1 time(s)" in w for w in c.warnings)
    assert not any("different step counts" in w for w in c.warnings)
    d = c.to_dict()["candidate"]
    assert (d["steps_executed"], d["steps_distinct"], d["final_step"]) == (45, 40, 40)
    fewer = compare(load_run("plain", str(root)), run(tmp_path, "short", steps=30))
    assert "different step counts: main trained 40 steps (last step 40), short trained 30 (last step 30)" \
        in fewer.warnings


# ---------------------------------------------------------------------------------------
# A loss that went NaN or Inf: diverged, a regression, never a dropped value


def _diverge(path, from_step: int, value: str = "nan"):
    """The log at ``path`` with the loss of every step from ``from_step`` on set to ``value``."""
    import re

    out = []
    for line in path.read_text().splitlines(keepends=True):
        m = re.search(r"completed step: (\d+),", line)
        if m and int(m[1]) >= from_step:
            line = re.sub(r"loss: \S+", f"loss: {value}", line)
        out.append(line)
    path.write_text("".join(out))
    return path


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_diverged_candidate_is_a_regression(tmp_path, capsys, value):
    """Before: exit 0, 'Final loss' showed the last finite loss (or '-'), no word."""
    from orchestrator.cli import main as cli

    base = write_log(tmp_path / "main.log", RunShape(seed=1))
    cand = _diverge(write_log(tmp_path / "feat.log", RunShape(seed=2)), 40, value)
    assert cli(["compare", str(base), str(cand), "--format", "json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["warnings"][0] == (f"candidate feat diverged: its loss stopped being finite at step 40 ({value}); "
                                  "counted as a regression")
    assert out["regressions"] == ["Final loss"] and out["exit_code"] == 1
    assert cli(["compare", str(base), str(cand), "--format", "md"]) == 1
    loss_line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| Final loss |"))
    assert loss_line.endswith(f"| {value} from step 40 | **diverged**: loss not finite from step 40 ({value}) |")
    html = tmp_path / "r.html"
    assert cli(["report", str(base), str(cand), "-o", str(html)]) == 1
    assert "diverged" in html.read_text()
    capsys.readouterr()
    # The other way round the base diverged: said above the table; the candidate is no regression.
    assert cli(["compare", str(cand), str(base), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["warnings"][0] == f"base feat diverged: its loss stopped being finite at step 40 ({value})"


@pytest.mark.parametrize("runs", [4, 2])
def test_nightly_flags_a_diverged_candidate_run(tmp_path, runs):
    """Per-run verdict (4 runs a side) or per-step of the first pair (2): a candidate run
    that diverged, even the second, regresses the comparison, its step in the verdict."""
    from orchestrator.analysis.compare import compare_runs
    from orchestrator.services.nightly import _delta

    base = [run(tmp_path, f"b{i}", seed=i) for i in range(runs)]
    cand = [load_run(str(write_log(tmp_path / f"c{i}.log", RunShape(seed=10 + i)))) for i in range(runs)]
    cand[1] = load_run(str(_diverge(write_log(tmp_path / "c1.log", RunShape(seed=11)), 30)))
    rs = compare_runs(base, cand)
    assert rs.on_runs == (runs >= 4) and rs.regressed
    assert [_delta(r, rs.on_runs) for r in rs.regressions] == [
        "Final loss: diverged (loss not finite from step 30)"]


def test_a_diverged_run_trained_its_steps(tmp_path):
    """Its last step is the last it trained, not the last with a finite loss: no
    'different step counts' warning for two 60-step runs."""
    base = run(tmp_path, "main", seed=1)
    cand = load_run(str(_diverge(write_log(tmp_path / "feat.log", RunShape(seed=2)), 40)))
    c = compare(base, cand)
    assert not [w for w in c.warnings if w.startswith("different step counts")], c.warnings
    assert c.to_dict()["candidate"]["final_step"] == 60


def test_a_starved_device_is_a_slowdown_though_no_steps_seconds_moved(tmp_path):
    """The workload's step seconds are the device's; an input pipeline that makes the device
    wait (``idle_s``) is slower training all the same (the README's nightly: feat-slow's
    pipeline), so the steady-state row and the rates stand on each step's wall time."""
    def stored(name: str, idle: float):
        path = write_stored_run(tmp_path, name, RunShape(seed=3))
        for f in (path / "metrics").glob("*.jsonl"):
            lines = [json.loads(x) for x in f.read_text().splitlines()]
            f.write_text("".join(json.dumps({**x, "idle_s": idle} if x["kind"] == "step" else x) + "\n"
                                 for x in lines))
        return load_run(str(path))

    base, starved = stored("fed", 0.0), stored("starved", 0.075)
    assert list(base.steps.seconds) == list(starved.steps.seconds)  # the device's: the same
    c = compare(base, starved, threshold_pct=10)
    r = rows(c)
    steady = r["Steady-state s/step (median)"]
    assert steady.verdict == "regressed" and steady.delta_pct == pytest.approx(50, abs=3)
    assert "idle time" in steady.note
    assert r["Avg s/step"].verdict == "regressed"
    assert c.exit_code == 1 and [x.metric for x in c.regressions] == ["Steady-state s/step (median)"]
