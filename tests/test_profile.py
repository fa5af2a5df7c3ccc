"""``profile=START:STEPS``: a jax.profiler trace of those steps under the run's folder, named
by run.json and ``xrun status`` (issue 50, item 5). One tiny real run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_helpers import REPO, xrun

from workload.config import load_config


def test_profile_spec_is_checked():
    assert load_config("tiny", ["profile=5:3"]).profile == "5:3"
    for bad in ("5", "0:3", "5:0", "a:b"):
        with pytest.raises(ValueError, match="workload config profile: expected START:STEPS"):
            load_config("tiny", [f"profile={bad}"])


def test_profile_of_two_steps_is_written_under_the_run(tmp_path):
    root = tmp_path / "store"
    r = subprocess.run([sys.executable, "-m", "workload.train", "--preset", "tiny", "steps=4",
                        "checkpoint_every=0", "profile=2:2", "--storage", str(root),
                        "--run-name", "prof"], capture_output=True, text=True, timeout=600,
                       cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
                                      "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    folder = root / "runs" / "prof" / "profile"
    traces = list(folder.glob("plugins/profile/*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0, list(folder.rglob("*"))
    assert "xrun: profile of steps 2-3 written to" in r.stdout
    info = json.loads((root / "runs" / "prof" / "run.json").read_text())["workload"]["profile"]
    assert info["steps"] == [2, 3] and info["path"].endswith("runs/prof/profile")
    view = json.loads(xrun("status", "prof", "-o", "json", storage=root).stdout)
    assert view["profile"]["steps"] == [2, 3]
    assert "Profile" in xrun("status", "prof", storage=root).stdout
