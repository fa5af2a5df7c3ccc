"""Benchmark: this checkout's figures against another revision's, side by side in one run.

Issue 54 item 7: a refactor must leave what users see as fast as it was. The other revision
is checked out into a temporary git worktree; each bench runs in both trees in turn
(alternating which goes first each round, so that a drift of the machine's load falls on
both), and the table prints each figure's median per tree and their ratio. Figures per CPU
second where the bench has them: they hold on a loaded machine, where wall times do not.

    python bench/bench_side_by_side.py --base ddb2391                 # logparse, CPU step, 1,024 pods
    python bench/bench_side_by_side.py --base ddb2391 --only logparse workload --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _logparse(tree: Path, out: Path, args: argparse.Namespace) -> dict[str, float]:
    _run(tree, ["bench/bench_logparse.py", "--gb", str(args.gb), "--json", str(out)])
    res = json.loads(out.read_text())
    return {f"log parsing, {form}: MB per CPU second (higher is better)": r["parse_mb_per_cpu_s"]
            for form, r in res.items()}


def _workload(tree: Path, out: Path, args: argparse.Namespace) -> dict[str, float]:
    _run(tree, ["bench/bench_workload.py", "--batch-per-device", "1", "--steps", str(args.steps),
                "--rounds", "0", "--json", str(out)])
    (r,) = json.loads(out.read_text())["results"]
    return {"CPU step, bench-21m batch 1: share of the matmul peak measured beside it (higher)": r["fraction_of_peak"],
            "CPU step, bench-21m batch 1: seconds (lower)": r["step_seconds"]}


def _cluster(tree: Path, out: Path, args: argparse.Namespace) -> dict[str, float]:
    _run(tree, ["bench/bench_cluster_scale.py", "--pods", str(args.pods), "--json", str(out)])
    raw = json.loads(out.read_text())
    (r,) = raw if isinstance(raw, list) else raw.get("results", [raw])
    if "broke" in r:  # its pods were not all Running within --start-limit: no status, no list
        print(f"{tree}: {args.pods} pods not all Running at once (the machine broke): {r['broke']}", flush=True)
        return {}
    figs = {f"status of {args.pods} Running pods: CPU seconds (lower)": r["status_running_cpu_s"],
            f"status of {args.pods} Running pods: wall seconds (lower)": r["status_running_s"]}
    for label, cmd in (r.get("commands") or {}).items():
        if label.startswith("list ("):
            figs["list: storage requests per 1,000 runs (lower)"] = (
                cmd["storage"].get("total", 0) * 1000 / r["listed_runs"])
            figs["list: wall seconds (lower)"] = cmd["s"]
    return figs


BENCHES: dict[str, Callable[[Path, Path, argparse.Namespace], dict[str, float]]] = {
    "logparse": _logparse, "workload": _workload, "cluster": _cluster}


def _run(tree: Path, argv: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree)}  # the tree's own packages, not this checkout's
    proc = subprocess.run([sys.executable, *argv], cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{argv[0]} in {tree} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the revision to compare against (e.g. ddb2391)")
    ap.add_argument("--only", nargs="+", choices=list(BENCHES), default=list(BENCHES))
    ap.add_argument("--rounds", type=int, default=2, help="runs of each bench in each tree")
    ap.add_argument("--gb", type=float, default=0.3, help="log parsing: size of each generated log")
    ap.add_argument("--steps", type=int, default=20, help="CPU step: steps per run")
    ap.add_argument("--pods", type=int, default=1024, help="cluster: pods of the one size run")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    base_rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", args.base], check=True,
                              capture_output=True, text=True).stdout.strip()
    head_rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
    samples: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="xrun-side-") as tmp:
        base_tree = Path(tmp) / f"base-{base_rev}"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(base_tree), base_rev],
                       check=True)
        try:
            trees = {base_rev: base_tree, f"{head_rev} (this checkout)": REPO}
            for k in range(args.rounds):
                order = list(trees.items()) if k % 2 == 0 else list(trees.items())[::-1]
                for bench in args.only:
                    for label, tree in order:
                        figs = BENCHES[bench](tree, Path(tmp) / f"{bench}-{k}.json", args)
                        for name, value in figs.items():
                            samples.setdefault(name, {}).setdefault(label, []).append(value)
                        print(f"round {k + 1}: {bench} in {label}: "
                              + "; ".join(f"{v:.4g}" for v in figs.values()), flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)], check=False)
    labels = list(trees)
    print(f"\n| figure | {labels[0]} | {labels[1]} | ratio (this / base) |\n|---|---|---|---|")
    table: list[dict[str, Any]] = []
    for name, by in samples.items():
        b, h = (statistics.median(by.get(lbl, [float("nan")])) for lbl in labels)
        ratio = h / b if b else float("nan")
        table.append({"figure": name, "base": b, "head": h, "ratio": ratio})
        print(f"| {name} | {b:.4g} | {h:.4g} | {ratio:.2f} |")
    print(f"(median of {args.rounds} round(s) each, alternating which tree runs first; "
          f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    if args.json:
        args.json.write_text(json.dumps({"base": base_rev, "head": head_rev, "rows": table}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
