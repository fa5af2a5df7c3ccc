"""Benchmark: time from `xrun submit` to the first completed step and to the run's end,
cold versus with JAX's persistent compilation cache (kept under the storage root).

Runs examples/local-tiny.yaml (2 hosts x 2 CPU devices) three times against one fresh
storage root: cache off (cold), cache on but empty (fills it), cache on and warm. Times come
from the run's own records: run.json's submitted_at, the first step record's time, and the
end of the xrun process. Prints a table and the warm/cold ratios measured in this one run.

    python bench/bench_submit.py [--steps 20] [--run-file examples/local-tiny.yaml]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.readers import MetricsReader  # noqa: E402
from xrun_contract import Layout  # noqa: E402
from xrun_contract.storage import open_storage  # noqa: E402


def one_run(storage: str, name: str, run_file: str, steps: int, cache: bool) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    env["XRUN_LOCAL_COMPILATION_CACHE"] = "1" if cache else "0"
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "orchestrator.cli", "submit", "-f", run_file, "--name", name,
           "--storage", storage,
           "--command", f"python3 -m workload.train --preset tiny steps={steps} checkpoint_every={steps}"]
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    t_end = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"run {name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    st = open_storage(storage)
    run = st.read_json(Layout.run_json(name)) or {}
    reader = MetricsReader(st, name)
    reader.poll()
    steps_rec = [r for r in reader.records if r.get("kind") == "step"]
    submitted = run.get("submitted_at", t0)
    # Process 0's startup timeline (workload "phase" records): seconds since its process
    # started at each milestone; absent from workloads that predate the records.
    phases = {r["phase"]: round(r["seconds"], 3) for r in reader.records
              if r.get("kind") == "phase" and r.get("attempt", 0) == 0}
    return {
        "first_step_s": steps_rec[0]["time"] - submitted,
        "end_s": t_end - t0,
        "median_step_s": sorted(r["seconds"] for r in steps_rec)[len(steps_rec) // 2],
        "phases": phases,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--run-file", default=str(REPO / "examples" / "local-tiny.yaml"))
    ap.add_argument("--json", help="Also write the results here.")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        storage = str(Path(tmp) / "store")
        results = {
            "cold (cache off)": one_run(storage, "bench-cold", args.run_file, args.steps, cache=False),
            "cache on, empty": one_run(storage, "bench-fill", args.run_file, args.steps, cache=True),
            "cache on, warm": one_run(storage, "bench-warm", args.run_file, args.steps, cache=True),
        }
    print(f"{'variant':<18} {'submit->step 1 (s)':>19} {'submit->end (s)':>16} {'median s/step':>14}")
    for k, r in results.items():
        print(f"{k:<18} {r['first_step_s']:>19.2f} {r['end_s']:>16.2f} {r['median_step_s']:>14.4f}")
    if any(r["phases"] for r in results.values()):
        names = list(next(r["phases"] for r in results.values() if r["phases"]))
        print("\nprocess 0 startup, seconds since its process started, at the end of each phase:")
        print(f"{'variant':<18} " + " ".join(f"{n:>18}" for n in names))
        for k, r in results.items():
            print(f"{k:<18} " + " ".join(f"{r['phases'].get(n, float('nan')):>18.2f}" for n in names))
    cold, warm = results["cold (cache off)"], results["cache on, warm"]
    ratios = {
        "first_step_warm_over_cold": warm["first_step_s"] / cold["first_step_s"],
        "end_warm_over_cold": warm["end_s"] / cold["end_s"],
    }
    print(f"ratio warm/cold: first step {ratios['first_step_warm_over_cold']:.2f}, "
          f"run end {ratios['end_warm_over_cold']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
