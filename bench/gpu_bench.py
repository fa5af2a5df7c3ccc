"""Benchmark the ``1b`` preset on one GPU: steady-state step time, tokens/s, TFLOP/s per
device, MFU against the catalogue peak, and the checkpoint blocking ratio; written as JSON.

Runs ``python -m workload.train`` standalone on the first visible device (one GPU; without
a GPU, JAX's CPU). If the model does not fit, it halves the layers (then the batch) until
it does, and says so in ``reduced``. Peak: ``--peak-tflops``, else
``XRUN_PEAK_TFLOPS_PER_DEVICE``, else 989 for H100/H200, 2250 for B200 (dense bf16), else MFU is null.

    python bench/gpu_bench.py [--preset 1b] [--steps 30] [--warmup 5] [--checkpoint-every 10]
                              [--peak-tflops 989] [--out result.json] [key=value ...]

On CPU for testing: ``python bench/gpu_bench.py --preset tiny --steps 6 --out r.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_checkpoint import checkpoint_costs  # noqa: E402
from bench_workload import REPO, run_workload, steady_steps  # noqa: E402

sys.path.insert(0, str(REPO))

KNOWN_PEAKS = {"H100": 989.0, "H200": 989.0, "B200": 2250.0}  # dense bf16 TFLOP/s per GPU
OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")


def peak_for(device_kind: str, flag: float | None) -> float | None:
    if flag:
        return flag
    if os.environ.get("XRUN_PEAK_TFLOPS_PER_DEVICE"):
        return float(os.environ["XRUN_PEAK_TFLOPS_PER_DEVICE"])
    return next((v for k, v in KNOWN_PEAKS.items() if k in device_kind), None)


def run_fitting(preset: str, overrides: list[str],
                storage: str) -> tuple[list[dict], list[str], str, str]:
    """Run; on out-of-memory halve n_layers (down to 1), then the batch. Returns the records,
    the overrides that ran, a note of what was reduced ("" when nothing) and the run name."""
    from workload.config import load_config

    cfg = load_config(preset, overrides)
    layers, batch = cfg.n_layers, cfg.batch_per_device
    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95"}
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = "0"  # one GPU
    attempt = 0
    while True:
        ran = [*overrides, f"n_layers={layers}", f"batch_per_device={batch}"]
        name = f"gpu-bench-{attempt}"
        try:
            records = run_workload(storage, name, preset, ran, env=env)
        except RuntimeError as e:
            if not any(m in str(e) for m in OOM_MARKERS) or (layers == 1 and batch == 1):
                raise
            if layers > 1:
                layers //= 2
            else:
                batch //= 2
            attempt += 1
            continue
        notes = []
        if layers != cfg.n_layers:
            notes.append(f"n_layers {cfg.n_layers} -> {layers} (did not fit)")
        if batch != cfg.batch_per_device:
            notes.append(f"batch_per_device {cfg.batch_per_device} -> {batch} (did not fit)")
        return records, ran, "; ".join(notes), name


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="1b")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="first steps left out")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--peak-tflops", type=float, help="peak dense bf16 TFLOP/s per device")
    p.add_argument("--out", help="write the result JSON here")
    p.add_argument("--storage", help="folder for the run (default: a temporary folder)")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args()

    from workload.config import load_config

    overrides = [f"steps={args.steps}", f"checkpoint_every={args.checkpoint_every}",
                 "max_to_keep=100", *args.overrides]
    with tempfile.TemporaryDirectory(dir=args.storage) as tmp:
        records, ran, reduced, name = run_fitting(args.preset, overrides, tmp)
        saves = checkpoint_costs(records, tmp, name)
    header = next(r for r in records if r["kind"] == "header")["versions"]
    cfg = load_config(args.preset, ran)
    steady = steady_steps(records, args.warmup)
    # Rates at the median step, not medians of per-step rates: the loop dispatches ahead of
    # the step it reads, so one step's seconds can hold part of the next one's and per-step
    # rates scatter both ways (under load, their median was 5x the rate at the median step).
    step_s = statistics.median(r["seconds"] for r in steady)
    tflops = steady[0]["tflops_per_device"] * steady[0]["seconds"] / step_s
    tokens_per_s = steady[0]["tokens_per_s_per_device"] * steady[0]["seconds"] / step_s
    peak = peak_for(header.get("device_kind", ""), args.peak_tflops)
    blocked = sum(s["blocked_s"] for s in saves)
    save_s = sum(s["save_s"] for s in saves)
    result = {
        "preset": args.preset,
        "backend": header.get("backend"),
        "device_kind": header.get("device_kind"),
        "devices": int(header.get("global_devices", 1)),
        "params": cfg.params_count,
        "n_layers": cfg.n_layers,
        "global_batch": cfg.batch_size(int(header.get("global_devices", 1))),
        "seq_len": cfg.seq_len,
        "reduced": reduced,
        "steady_steps": len(steady),
        "step_seconds": step_s,
        "tokens_per_s": tokens_per_s,
        "tflops_per_s_per_device": tflops,
        "peak_tflops_per_device": peak,
        "mfu": tflops / peak if peak else None,
        "checkpoint_saves": len(saves),
        "checkpoint_blocked_s": blocked,
        "checkpoint_save_s": save_s,
        "checkpoint_blocking_ratio": blocked / save_s if save_s else None,
    }
    for k, v in result.items():
        print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
