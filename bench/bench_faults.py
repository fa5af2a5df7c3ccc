"""Faults as counts (issue #41 item 4): run tests/test_fault_rounds.py with N rounds of each
fault and print, per fault, how many rounds were tried, survived (Succeeded, the reference's
final loss, no process left) and lost, with why each loss happened.

    python bench/bench_faults.py --rounds 10             # both faults, 10 rounds each
    python bench/bench_faults.py --rounds 3 -k coordinator

The faults (see the test module): storage answering 503 for 60 s from the first write of a
checkpoint step (a save in flight); the coordinator host 0-0 of a 2-host run killed with -9
(its whole container) while a save is being written. Exit 0 when nothing was lost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10, help="rounds of each fault (default 10)")
    ap.add_argument("-k", dest="select", default="", help="pytest -k expression: only these faults")
    ap.add_argument("--raw", type=Path, default=None,
                    help="also keep the raw output here: one JSON line per round, then pytest's output")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds: at least 1")
    with tempfile.TemporaryDirectory(prefix="xrun-bench-faults-") as tmp:
        results = Path(tmp, "rounds.jsonl")
        env = {**os.environ, "XRUN_FAULT_ROUNDS": str(args.rounds), "XRUN_FAULT_RESULTS": str(results),
               "XRUN_FAULT_OUTAGE_S": os.environ.get("XRUN_FAULT_OUTAGE_S", "60"),
               "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
        cmd = [sys.executable, "-m", "pytest", str(REPO / "tests/test_fault_rounds.py"), "-q", "-p", "no:cacheprovider"]
        if args.select:
            cmd += ["-k", args.select]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        raw = results.read_text() if results.exists() else ""
        rounds = [json.loads(line) for line in raw.splitlines()]
        if args.raw:
            args.raw.write_text(raw + "\n--- pytest stdout\n" + proc.stdout + "\n--- pytest stderr\n" + proc.stderr)
    counts: dict[str, dict[str, int]] = defaultdict(lambda: {"tried": 0, "survived": 0, "lost": 0})
    whys: list[str] = []
    for r in rounds:
        c = counts[r["fault"]]
        c["tried"] += 1
        c[r["outcome"]] += 1
        if r["outcome"] == "lost":
            whys.append(f"  {r['fault']}, round {r['round']}: {r['why']}")
    print(f"{'fault':<48} {'tried':>5} {'survived':>8} {'lost':>4}  seconds/round (median)")
    for fault, c in counts.items():
        secs = sorted(r["seconds"] for r in rounds if r["fault"] == fault)
        print(f"{fault:<48} {c['tried']:>5} {c['survived']:>8} {c['lost']:>4}  {secs[len(secs) // 2]:.0f}")
    if whys:
        print("lost:\n" + "\n".join(whys))
    if proc.returncode != 0 and not whys:
        # A round that could not even be judged (no save seen, a run that never ended).
        print(proc.stdout[-4000:], proc.stderr[-2000:], sep="\n")
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
