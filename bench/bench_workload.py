"""Benchmark: training throughput of the workload on this CPU, against this CPU's XLA peak.

For each preset (default bench-21m) and per-device batch (default 1 and 4; the model shape is
the preset's, only the batch changes: ``global_batch=0 batch_per_device=N``) it runs
``python -m workload.train`` on one CPU device with checkpoints off, reads the run's own
step records, drops the first steps (compilation, warm-up) and reports the median
steady-state step: tokens/s and achieved TFLOP/s (the workload's FLOP accounting, MaxText's
``calculate_tflops_training_per_device``), as a fraction of two peaks measured in this same
run, in the preset's compute dtype:

* the 2048^3 XLA matmul peak, measured before and after each workload run; the higher of
  the two counts (the conservative ratio: a peak measured while another engineer's job
  slowed the machine would flatter us);
* the peak at the model's own matmul sizes: every learnable-weight matmul of one forward
  pass at this batch (``[B*S, d] x [d, n*h]`` ... ``[B*S, d] x [d, vocab]``), each shape
  timed alone (4 per call), weighted by its FLOPs: what XLA reaches on these shapes.

Also printed: the ratio to the float32 2048^3 peak. XLA:CPU runs a bf16 dot as a float32 dot
of bf16-rounded values (converts around it) on CPUs without AVX512-BF16/AMX, so float32 is
the fastest matmul this machine does; the ratio to it is the stricter one.

The load average (1 min) is printed before and after each run: the machine is shared. As
the workload process and the peak run at different moments, a load change between them skews
that ratio; so the same ratio is then measured interleaved in this process (``--rounds``):
the workload's own jitted train step and the peak alternating, each round's median step
paired with the peak measured right after it (see ``interleaved``).

    python bench/bench_workload.py [--presets bench-21m] [--batch-per-device 1 4]
                                   [--steps 30] [--warmup 5] [--rounds 5] [--json OUT.json]
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


def _best_seconds(f, *args, repeats: int) -> float:
    import jax

    jax.block_until_ready(f(*args))
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        best = min(best, time.perf_counter() - t)
    return best


def matmul_peak_tflops(dtype: str, n: int = 2048, repeats: int = 10) -> float:
    """Best-of-N TFLOP/s of one n x n x n XLA matmul on the default (CPU) device."""
    return model_shapes_peak_tflops(dtype, [(n, n, n, 1)], repeats, per_call=1)


def model_matmuls(cfg, batch_per_device: int) -> list[tuple[int, int, int, int]]:
    """(M, K, N, count) of every learnable-weight matmul in one forward pass of ``cfg``
    at this batch: the projections MaxText's FLOP formula counts (attention's own S x S
    products are left out, as its 'learnable weight' share)."""
    t, d, hd = batch_per_device * cfg.seq_len, cfg.d_model, cfg.head_dim
    layers = cfg.n_layers
    return [(t, d, cfg.n_heads * hd, layers),  # q
            (t, d, cfg.n_kv_heads * hd, 2 * layers),  # k, v
            (t, cfg.n_heads * hd, d, layers),  # out projection
            (t, d, cfg.mlp_dim, 2 * layers),  # gate, up
            (t, cfg.mlp_dim, d, layers),  # down
            (t, d, cfg.vocab_size, 1)]  # logits


def model_shapes_peak_tflops(dtype: str, shapes: list[tuple[int, int, int, int]],
                             repeats: int = 10, per_call: int = 4) -> float:
    """FLOP-weighted best TFLOP/s of ``[M, K] x [K, N]`` XLA matmuls in ``dtype``: total
    FLOPs over the sum of each shape's best time times its count. Each call runs
    ``per_call`` matmuls of the shape on different left operands in one executable, so the
    dispatch of a call is shared as it is within a train step."""
    import jax
    import jax.numpy as jnp

    f = jax.jit(lambda xs, y: [x @ y for x in xs])
    flops = seconds = 0.0
    for i, (m, k, n, count) in enumerate(shapes):
        keys = jax.random.split(jax.random.key(i), per_call + 1)
        xs = [jax.random.normal(key, (m, k), jnp.float32).astype(dtype) for key in keys[1:]]
        y = jax.random.normal(keys[0], (k, n), jnp.float32).astype(dtype)
        flops += 2 * m * k * n * count
        seconds += _best_seconds(f, xs, y, repeats=repeats) / per_call * count
    return flops / seconds / 1e12


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


def bench_preset(preset: str, batch_per_device: int, steps: int, warmup: int) -> dict:
    from workload.config import load_config

    overrides = [f"steps={steps}", "checkpoint_every=0", "global_batch=0",
                 f"batch_per_device={batch_per_device}"]
    cfg = load_config(preset, overrides)
    dtype = cfg.compute_dtype
    peak_before = matmul_peak_tflops(dtype)
    f32_peak = matmul_peak_tflops("float32")
    shapes_peak = model_shapes_peak_tflops(dtype, model_matmuls(cfg, batch_per_device))
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        records = run_workload(tmp, "bench", preset, overrides,
                               env={"XRUN_PLATFORM": "cpu", "XRUN_DEVICES_PER_HOST": "1"})
    load_after = os.getloadavg()[0]
    peak_after = matmul_peak_tflops(dtype)
    f32_peak = max(f32_peak, matmul_peak_tflops("float32"))
    steady = steady_steps(records, warmup)
    step_s = statistics.median(r["seconds"] for r in steady)
    tflops = statistics.median(r["tflops_per_device"] for r in steady)
    tokens = statistics.median(r["tokens_per_s_per_device"] for r in steady)
    peak = max(peak_before, peak_after)
    return {
        "preset": preset, "params": cfg.params_count, "compute_dtype": dtype,
        "batch_per_device": batch_per_device, "global_batch": cfg.batch_size(1),
        "seq_len": cfg.seq_len, "steady_steps": len(steady), "step_seconds": step_s,
        "tokens_per_s": tokens, "tflops_per_s": tflops,
        "matmul_peak_before": peak_before, "matmul_peak_after": peak_after,
        "matmul_peak_tflops": peak, "fraction_of_peak": tflops / peak,
        "model_shapes_peak_tflops": shapes_peak, "fraction_of_shapes_peak": tflops / shapes_peak,
        "float32_peak_tflops": f32_peak, "fraction_of_float32_peak": tflops / f32_peak,
        "load_before": load_before, "load_after": load_after,
    }


def interleaved(preset: str, batch_per_device: int, rounds: int, steps: int) -> dict:
    """The ratio with both sides measured at the same moments: in this process, the
    workload's own train step (``workload.train.Program``, as ``python -m workload.train``
    builds it, one CPU device) and the 2048^3 matmul peak alternate, ``steps`` steps then
    the peak, ``rounds`` times; each round's ratio pairs a median step with the peak
    measured right after it, so a load change on the shared machine hits both."""
    import jax

    from workload.config import load_config, step_flops
    from workload.distributed import make_mesh
    from workload.train import Program

    cfg = load_config(preset, ["global_batch=0", f"batch_per_device={batch_per_device}"])
    devices = jax.device_count()
    program = Program(cfg, make_mesh(None), cfg.batch_size(devices))
    state = program.init()
    tokens = jax.device_put(jax.random.randint(jax.random.key(0), (cfg.batch_size(devices),
                                               cfg.seq_len + 1), 0, cfg.vocab_size),
                            program.batch_sharding)
    flops = step_flops(cfg, cfg.batch_size(devices), devices)["tflops_per_device"]
    for _ in range(3):  # warm-up
        state, out = program.train_step(state, tokens)
        jax.device_get(out)
    ratios, step_s, peaks, loads = [], [], [], []
    for _ in range(rounds):
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            state, out = program.train_step(state, tokens)
            jax.device_get(out)
            times.append(time.perf_counter() - t)
        peak = matmul_peak_tflops(cfg.compute_dtype, repeats=5)
        step_s.append(statistics.median(times))
        peaks.append(peak)
        ratios.append(flops / step_s[-1] / peak)
        loads.append(os.getloadavg()[0])
    return {"preset": preset, "batch_per_device": batch_per_device, "rounds": rounds,
            "steps_per_round": steps, "step_seconds": step_s, "peaks": peaks,
            "ratios": ratios, "median_ratio": statistics.median(ratios), "loads": loads,
            "tflops_per_step": flops}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--presets", nargs="+", default=["bench-21m"])
    p.add_argument("--batch-per-device", nargs="+", type=int, default=[1, 4],
                   help="per-device batches to run each preset at (the model shape stays)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="first steps left out (compile, warm-up)")
    p.add_argument("--rounds", type=int, default=5,
                   help="in-process rounds of steps then peak (0: skip that part)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from workload.distributed import reuse_host_memory

    # The allocator the workload runs with on CPU (workload.distributed.configure_platform),
    # for this process's peak and interleaved steps too.
    reuse_host_memory()
    print(f"{os.cpu_count()} CPU cores; load average at start {os.getloadavg()[0]:.2f}", flush=True)
    results = []
    for name in args.presets:
        for batch in args.batch_per_device:
            r = bench_preset(name, batch, args.steps, args.warmup)
            results.append(r)
            print(f"{name} batch {batch}: {r['tokens_per_s']:.1f} tokens/s, "
                  f"{r['tflops_per_s']:.4f} TFLOP/s; 2048^3 {r['compute_dtype']} peak "
                  f"{r['matmul_peak_before']:.4f} before / {r['matmul_peak_after']:.4f} after; "
                  f"model-shape peak {r['model_shapes_peak_tflops']:.4f}; float32 2048^3 "
                  f"peak {r['float32_peak_tflops']:.4f} ({100 * r['fraction_of_float32_peak']:.1f}%); "
                  f"load "
                  f"{r['load_before']:.2f} -> {r['load_after']:.2f}", flush=True)
    print(f"{'preset':<10} {'batch':>5} {'dtype':>9} {'step s':>8} {'tokens/s':>10} {'TFLOP/s':>8} "
          f"{'peak':>7} {'of peak':>8} {'shapes':>7} {'of shapes':>9}")
    for r in results:
        print(f"{r['preset']:<10} {r['batch_per_device']:>5} {r['compute_dtype']:>9} "
              f"{r['step_seconds']:>8.4f} {r['tokens_per_s']:>10.1f} {r['tflops_per_s']:>8.4f} "
              f"{r['matmul_peak_tflops']:>7.4f} {100 * r['fraction_of_peak']:>7.1f}% "
              f"{r['model_shapes_peak_tflops']:>7.4f} {100 * r['fraction_of_shapes_peak']:>8.1f}%")
    paired = []
    for name in args.presets if args.rounds else []:
        for batch in args.batch_per_device:
            r = interleaved(name, batch, args.rounds, steps=10)
            paired.append(r)
            print(f"interleaved in-process, {name} batch {batch}: {r['rounds']} rounds of "
                  f"{r['steps_per_round']} steps then the peak; per-round ratio "
                  + ", ".join(f"{100 * x:.1f}%" for x in r["ratios"])
                  + f"; median {100 * r['median_ratio']:.1f}% (median steps "
                  + ", ".join(f"{s:.3f}" for s in r["step_seconds"]) + " s; peaks "
                  + ", ".join(f"{x:.3f}" for x in r["peaks"]) + " TFLOP/s; load "
                  + ", ".join(f"{x:.2f}" for x in r["loads"]) + ")", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "interleaved": paired},
                                              indent=2))


if __name__ == "__main__":
    main()
