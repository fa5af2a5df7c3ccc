"""``profile=START:STEPS``: a jax.profiler trace of those steps under the run's folder, named
by run.json and ``xrun status`` (issue 50, item 5). One tiny real run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_helpers import REPO, xrun
from workload_helpers import compilation_cache

from workload.config import load_config
from xrun_contract import Env


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
                                      "JAX_PLATFORMS": "cpu", Env.COMPILATION_CACHE: compilation_cache()})
    assert r.returncode == 0, r.stderr[-3000:]
    folder = root / "runs" / "prof" / "profile"
    traces = list(folder.glob("plugins/profile/*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0, list(folder.rglob("*"))
    assert "xrun: profile of steps 2-3 written to" in r.stdout
    info = json.loads((root / "runs" / "prof" / "run.json").read_text())["workload"]["profile"]
    assert info["steps"] == [2, 3] and info["path"].endswith("runs/prof/profile")
    view = json.loads(xrun("status", "prof", "-o", "json", storage=root).stdout)
    assert view["profile"]["steps"] == [2, 3]
    screen = xrun("status", "prof", storage=root).stdout
    assert "Profile" in screen

    # The top ops by device time: the workload's summary in run.json, as jax's own reader of
    # the trace counts them (XLA:CPU's ops on its tf_XLA threads, less the runtime's events).
    summary = info["top_ops"]
    assert summary["where"] == "/host:CPU" and 0 < summary["total_s"] < 5
    ops = summary["ops"]
    assert 5 <= len(ops) <= 10 and all(o["count"] >= 1 and "::" not in o["name"] for o in ops)
    assert [o["seconds"] for o in ops] == sorted((o["seconds"] for o in ops), reverse=True)
    assert 0 < sum(o["share"] for o in ops) <= 1.0 + 1e-9
    from jax.profiler import ProfileData

    names = {e.name for p in ProfileData.from_file(str(traces[0])).planes for line in p.lines
             if line.name.startswith("tf_XLA") for e in line.events}
    assert {o["name"] for o in ops} <= names
    assert "xrun: profile's top ops by device time: " + ops[0]["name"] in r.stdout
    assert view["profile"]["top_ops"] == summary
    assert "Top ops" in screen and ops[0]["name"] in screen

    # A record without the summary (written before it, or not read then): status and report
    # read the stored trace itself, and find the same ops.
    run_json = root / "runs" / "prof" / "run.json"
    doc = json.loads(run_json.read_text())
    del doc["workload"]["profile"]["top_ops"]
    run_json.write_text(json.dumps(doc))
    view = json.loads(xrun("status", "prof", "-o", "json", storage=root).stdout)
    assert view["profile"]["top_ops"] == summary
    page = tmp_path / "report.html"
    xrun("report", "prof", "-o", str(page), storage=root)
    html = page.read_text()
    assert "Top ops by device time" in html and f"<td>{ops[0]['name']}</td>" in html

    # A trace it cannot read: said in the status, which still answers.
    traces[0].write_bytes(b"\x0a\x05abc")
    view = json.loads(xrun("status", "prof", "-o", "json", storage=root).stdout)
    assert "top_ops" not in view["profile"] and "not an xplane trace" in view["profile"]["top_ops_error"]
    assert "not read:" in xrun("status", "prof", storage=root).stdout
