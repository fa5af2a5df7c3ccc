"""Daily use, round 3 (issue 52): the README's commands as a new user types them, and the
small habits of other tools. In-process CLI calls on synthetic stored runs, no JAX."""

from __future__ import annotations

import json
import re
import shlex

from cli_helpers import REPO, xrun_here
from synthetic_runs import RunShape, write_stored_run


def test_compare_of_a_nightlys_runs_names_the_storage_to_add(tmp_path, monkeypatch):
    """`xrun compare A B` in the folder the nightly ran in, with the default root: exit 2
    naming ./xrun-nightly; with that --storage the comparison runs."""
    monkeypatch.chdir(tmp_path)
    night = tmp_path / "xrun-nightly"
    write_stored_run(night, "nightly-main-20261206-030000-0", RunShape(seed=1))
    write_stored_run(night, "nightly-feat-20261206-030000-1", RunShape(seed=2), branch="feat")
    default = tmp_path / "home-root"
    args = ("nightly-main-20261206-030000-0", "nightly-feat-20261206-030000-1")
    r = xrun_here("compare", *args, storage=default)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (f"xrun: error: BASE: no run named {args[0]!r} under {default}; it is under "
                                "./xrun-nightly: add --storage ./xrun-nightly")
    r = xrun_here("status", args[0], storage=default)
    assert r.returncode == 2 and "it is under ./xrun-nightly: add --storage ./xrun-nightly" in r.stderr
    r = xrun_here("compare", *args, "--storage", "./xrun-nightly", storage=default)
    assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith("Verdict: OK"), r.stderr


def test_the_first_command_again_names_both_ways_on(tmp_path, monkeypatch):
    """The README's first command a second time: one line with --replace and a free name."""
    root = tmp_path / "root"
    write_stored_run(root, "local-tiny", RunShape())
    write_stored_run(root, "local-tiny-2", RunShape())
    r = xrun_here("submit", "-f", str(REPO / "examples" / "local-tiny.yaml"), storage=root)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"xrun: error: name: run 'local-tiny' already exists under {root} (Succeeded); "
                                "to run it again: --replace (removes the old run's data) or --name local-tiny-3")
    assert sorted(p.name for p in (root / "runs").iterdir()) == ["local-tiny", "local-tiny-2"]


def test_the_readmes_nightly_block_makes_its_repository_first():
    """The README's nightly block shows the command that makes the example's repository
    before the nightly that needs it (tests/test_nightly_git.py runs both as written)."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Nightly comparisons", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [shlex.split(ln, comments=True) for ln in block.strip().splitlines()]
    make = lines.index(["bash", "examples/make-nightly-repo.sh", "nightly-repo"])
    assert make < lines.index(["xrun", "nightly", "-f", "examples/nightly-local.yaml"])
    spec = (REPO / "examples" / "nightly-local.yaml").read_text()
    assert re.search(r"^repo: \./nightly-repo\b", spec, re.M)


def test_a_missing_repo_says_where_it_was_looked_for_and_how_to_make_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    r = xrun_here("nightly", "-f", "examples/nightly-local.yaml", storage=tmp_path / "s")
    assert r.returncode == 2
    assert r.stderr.strip() == (f"xrun: error: repo: {tmp_path}/nightly-repo does not exist (a relative repo: is "
                                f"from the current folder, {tmp_path}; examples/nightly-local.yaml's is made by "
                                "'bash examples/make-nightly-repo.sh nightly-repo')")
    assert not (tmp_path / "xrun-nightly").exists()



def test_one_pair_cannot_show_a_large_slowdown_is_noise_and_a_narrower_spread_is_no_gain(tmp_path):
    """A candidate 53% slower whose steps the test cannot tell from the base's (noisy) ones,
    with a much narrower spread: INCONCLUSIVE (one run a side cannot show significance),
    never "OK (1 improved)"; the spread row says narrower, on every output."""
    root = tmp_path / "root"
    write_stored_run(root, "base", RunShape(steps=14, seconds=0.150, jitter=0.06, seed=0))
    write_stored_run(root, "cand", RunShape(steps=14, seconds=0.198, jitter=0.004, seed=100))
    r = xrun_here("compare", "base", "cand", "--threshold", "10%", storage=root)
    assert r.returncode == 0, r.stderr
    want = ("INCONCLUSIVE: Steady-state s/step (median) +53.4% (within noise, p=0.115, n=11/11 steps): one run a "
            "side cannot show this is significant; repeat the runs (with 4 or more a side, a nightly's repeats: 4, "
            "the test is on per-run values)")
    lines = r.stdout.splitlines()
    assert lines[0] == f"**Verdict:** {want}" and lines[-1] == f"Verdict: {want}"
    spread = next(ln for ln in lines if ln.startswith("| Step time spread (IQR) |"))
    assert "narrower (not a speed change) (p=0.002" in spread and "improved" not in spread, spread
    doc = json.loads(xrun_here("compare", "base", "cand", "--threshold", "10%", "--format", "json",
                               storage=root).stdout)
    assert doc["verdict"] == want and "improved" not in {r["verdict"] for r in doc["rows"]}
    assert {r["metric"]: r["verdict"] for r in doc["rows"]}["Step time spread (IQR)"] == "narrower"
