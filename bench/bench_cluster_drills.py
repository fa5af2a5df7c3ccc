"""Issue 41's cluster fault drills, N rounds each, as counts: tried, survived, lost.

    python bench/bench_cluster_drills.py                 # 1 round of each drill
    python bench/bench_cluster_drills.py --rounds 10     # 10 in a row of each
    python bench/bench_cluster_drills.py --rounds 3 -k preempt

Runs tests/test_cluster_drills.py under pytest with XRUN_CLUSTER_DRILLS=1 and
XRUN_FAULT_ROUNDS=N (one test id per round, all on one real control plane started by the
session, tests/cluster/up.sh; ``XRUN_TEST_CLUSTER=DIR`` uses one already up), reads the
JUnit XML it writes, and prints one row per fault. A round survives when its test passes
(the run came through the fault as the test asserts); it is lost when the test fails or
errors. Each failure's first line is printed under the table.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = "tests/test_cluster_drills.py"
FAULTS = {  # test function -> the fault, as issue 41 names it
    "test_follow_misses_no_state_change_across_an_apiserver_restart":
        "kube-apiserver restarted during --follow",
    "test_a_node_lost_under_a_running_slice_restarts_it_once_repaired":
        "KWOK node deleted under a running slice",
    "test_a_preempted_run_says_so_and_resumes_when_readmitted":
        "Kueue preemption, then readmission",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1, help="rounds of each drill (default 1)")
    ap.add_argument("-k", default="", help="only the drills whose test name matches (pytest -k)")
    ap.add_argument("--raw", type=Path, default=None,
                    help="also keep the raw output here: pytest's output, then its JUnit XML")
    args = ap.parse_args()
    if args.rounds < 1:
        print("bench_cluster_drills: --rounds must be 1 or more", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "drills.xml"
        env = {**os.environ, "XRUN_CLUSTER_DRILLS": "1", "XRUN_FAULT_ROUNDS": str(args.rounds),
               "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, "-m", "pytest", TESTS, "-q", "-p", "no:cacheprovider",
               f"--junitxml={junit}"] + (["-k", args.k] if args.k else [])
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        took = time.monotonic() - started
        if args.raw:
            xml = junit.read_text() if junit.exists() else "(no JUnit XML)"
            args.raw.write_text(f"--- pytest stdout\n{proc.stdout}\n--- pytest stderr\n{proc.stderr}\n"
                                f"--- junit\n{xml}\n")
        if not junit.exists():
            print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", file=sys.stderr)
            print(f"bench_cluster_drills: pytest wrote no results (exit {proc.returncode})",
                  file=sys.stderr)
            return 3
        counts, lost = tally(junit)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    print(f"cluster fault drills, {args.rounds} round(s) each, commit {commit}, {took:.0f} s")
    print(f"{'fault':45} {'tried':>5} {'survived':>8} {'lost':>4}")
    for test, fault in FAULTS.items():
        if test in counts:
            tried, survived = counts[test]
            print(f"{fault:45} {tried:5d} {survived:8d} {tried - survived:4d}")
    for line in lost:
        print(f"lost: {line}")
    return 0 if not lost else 1


def tally(junit: Path) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """test function -> (tried, survived); one line per lost round."""
    counts: dict[str, tuple[int, int]] = {}
    lost: list[str] = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        test = re.sub(r"\[.*\]$", "", case.get("name", ""))
        if case.find("skipped") is not None:
            continue
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        tried, survived = counts.get(test, (0, 0))
        counts[test] = (tried + 1, survived + (bad is None))
        if bad is not None:
            first = (bad.get("message") or "").splitlines()[0][:200] if bad.get("message") else ""
            lost.append(f"{case.get('name')}: {first}")
    return counts, lost


if __name__ == "__main__":
    sys.exit(main())
