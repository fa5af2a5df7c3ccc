"""Benchmark: training throughput of the workload on this CPU, against this CPU's XLA peak.

For each preset (default: tiny and bench-21m) it runs ``python -m workload.train`` on one
CPU device with checkpoints off, reads the run's own step records, drops the first steps
(compilation, warm-up) and reports the median steady-state step: tokens/s and achieved
TFLOP/s (the workload's MaxText FLOP accounting), and that as a fraction of the XLA matmul
peak measured in this same run for the preset's compute dtype.

    python bench/bench_workload.py [--presets tiny bench-21m] [--steps 30] [--warmup 5]
                                   [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def matmul_peak_tflops(dtype: str, n: int = 2048, repeats: int = 10) -> float:
    """Best-of-N TFLOP/s of one n x n x n XLA matmul on the default (CPU) device."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e12


def run_workload(storage: str, run: str, preset: str, overrides: list[str],
                 env: dict[str, str] | None = None, timeout: float = 3600) -> list[dict]:
    """Run the workload standalone (one process) and return its metrics records."""
    from xrun_contract import Layout
    from xrun_contract.storage import open_storage

    base = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    base["PYTHONPATH"] = str(REPO)
    base.update(env or {})
    cmd = [sys.executable, "-m", "workload.train", "--preset", preset, "--storage", storage,
           "--run-name", run, *overrides]
    proc = subprocess.run(cmd, cwd=REPO, env=base, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n"
                           f"{(proc.stdout + proc.stderr)[-4000:]}")
    st = open_storage(storage)
    objects, _ = st.list(Layout.metrics(run))
    records = []
    for o in objects:
        records += [json.loads(line) for line in (st.read_text(o.key) or "").splitlines() if line]
    return records


def steady_steps(records: list[dict], warmup: int) -> list[dict]:
    steps = [r for r in records if r["kind"] == "step"]
    return steps[warmup:] if len(steps) > warmup else steps[-1:]


def bench_preset(preset: str, steps: int, warmup: int, peaks: dict[str, float]) -> dict:
    from workload.config import load_config

    cfg = load_config(preset)
    with tempfile.TemporaryDirectory() as tmp:
        records = run_workload(tmp, "bench", preset, [f"steps={steps}", "checkpoint_every=0"],
                               env={"XRUN_PLATFORM": "cpu", "XRUN_DEVICES_PER_HOST": "1"})
    steady = steady_steps(records, warmup)
    step_s = statistics.median(r["seconds"] for r in steady)
    tflops = statistics.median(r["tflops_per_device"] for r in steady)
    tokens = statistics.median(r["tokens_per_s_per_device"] for r in steady)
    peak = peaks[cfg.compute_dtype]
    return {
        "preset": preset, "params": cfg.params_count, "compute_dtype": cfg.compute_dtype,
        "global_batch": cfg.batch_size(1), "seq_len": cfg.seq_len,
        "steady_steps": len(steady), "step_seconds": step_s, "tokens_per_s": tokens,
        "tflops_per_s": tflops, "matmul_peak_tflops": peak, "fraction_of_peak": tflops / peak,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--presets", nargs="+", default=["tiny", "bench-21m"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="first steps left out (compile, warm-up)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    peaks = {d: matmul_peak_tflops(d) for d in ("float32", "bfloat16")}
    results = [bench_preset(name, args.steps, args.warmup, peaks) for name in args.presets]
    print(f"XLA matmul peak on this CPU (2048^3, best of 10): float32 {peaks['float32']:.3f} "
          f"TFLOP/s, bfloat16 {peaks['bfloat16']:.3f} TFLOP/s; {os.cpu_count()} CPU cores")
    print(f"{'preset':<10} {'params':>10} {'dtype':>9} {'step s':>8} {'tokens/s':>10} "
          f"{'TFLOP/s':>8} {'of peak':>8}")
    for r in results:
        print(f"{r['preset']:<10} {r['params']:>10,} {r['compute_dtype']:>9} {r['step_seconds']:>8.4f} "
              f"{r['tokens_per_s']:>10.1f} {r['tflops_per_s']:>8.4f} {100 * r['fraction_of_peak']:>7.1f}%")
    if args.json:
        Path(args.json).write_text(json.dumps({"peaks": peaks, "results": results}, indent=2))


if __name__ == "__main__":
    main()
