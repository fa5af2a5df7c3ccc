"""Benchmark: xrun's workload against stock MaxText, same model shape and batch, same CPU.

Runs ``python -m workload.train --preset bench-21m`` (vocab 32000, d_model 256, 4 layers,
4 heads x head_dim 64, MLP 1024, sequence 256, ``--batch-per-device`` sequences per step
(default 1; ``global_batch=0 batch_per_device=N``), float32 params with bfloat16
compute, AdamW, no remat, one CPU device, checkpoints off) and MaxText's
``maxtext.trainers.pre_train.train`` configured to the same shape (``base_emb_dim=256
base_num_decoder_layers=4 base_num_query_heads=4 base_num_kv_heads=4 head_dim=64
base_mlp_dim=1024 vocab_size=32000 max_target_length=256 per_device_batch_size=N
weight_dtype=float32 dtype=bfloat16 remat_policy=minimal_with_context enable_dropout=false``,
synthetic data, checkpointing off), interleaved A B A B ..., each a fresh process, so that both see the same
machine load. Both print MaxText's step line (``completed step: N, seconds: S, ...,
Tokens/s/device: T, ...``); the same regex reads both. Per process: steady-state tokens/s =
tokens of the steps after ``--warmup`` over the sum of their ``seconds`` (see ``steady``);
over rounds: the median of those. The ratio is ours/MaxText, measured in this one run (also
printed: the median of the per-round ratios, which pairs neighbouring processes, and the
same from the median of per-line rates).

The two step clocks differ slightly: ours times dispatch to result of each step (the
per-step log write falls outside it), MaxText times dispatch to dispatch (everything the
host does between steps falls inside it). Both are steady-state wall time per step to
within the cost of one log line.

Remat: MaxText always wraps its scanned decoder layer in ``jax.checkpoint``, and its
``remat_policy`` values ``none`` and ``full`` both give ``policy=None`` there, i.e. full
recomputation (``maxtext/layers/nnx_decoders.py``, ``get_remat_policy()``). The nearest to
our no-remat is ``minimal_with_context``: it saves every projection output and the
attention context, so only elementwise ops are recomputed.

Allocator: on CPU our workload makes glibc malloc keep freed memory
(``workload.distributed.reuse_host_memory``); MaxText runs with glibc's defaults, which
fault a step's buffers in again every step. ``--maxtext-same-allocator`` gives MaxText the
same settings through glibc's ``MALLOC_*`` environment variables, to show the ratio without
that part.

    python bench/bench_vs_maxtext.py --maxtext-python /work/maxtext-venv/bin/python \
        [--batch-per-device N] [--rounds 3] [--steps 30] [--warmup 5]
        [--maxtext-same-allocator] [--json OUT.json]

Not part of the test suite (it needs a MaxText venv; see tests/data/maxtext/make_logs.sh).
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

from workload.distributed import HOST_MALLOC_SETTINGS  # noqa: E402
from xrun_contract import STEP_RE  # noqa: E402  (matches MaxText's step line and ours)

MAXTEXT_MODEL = (
    "hardware=cpu", "skip_jax_distributed_system=true", "dataset_type=synthetic",
    "base_emb_dim=256", "base_num_decoder_layers=4",
    "base_num_query_heads=4", "base_num_kv_heads=4", "head_dim=64", "base_mlp_dim=1024",
    "vocab_size=32000", "max_target_length=256", "weight_dtype=float32", "dtype=bfloat16",
    "remat_policy=minimal_with_context", "enable_dropout=false", "enable_checkpointing=false",
)


def step_rates(output: str) -> list[tuple[int, float, float]]:
    """(step, seconds, tokens/s/device) of every step line, in order."""
    out = []
    for line in output.splitlines():
        m = STEP_RE.search(line)
        if m:
            out.append((int(m["step"]), float(m["seconds"]), float(m["tokens"])))
    return out


def run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> tuple[str, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{text[-4000:]}")
    return text, wall


def run_ours(steps: int, batch: int, tmp: str, i: int, timeout: float) -> tuple[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    env.update(PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", XRUN_PLATFORM="cpu",
               XRUN_DEVICES_PER_HOST="1")
    cmd = [sys.executable, "-m", "workload.train", "--preset", "bench-21m", "--storage", tmp,
           "--run-name", f"ours-{i}", f"steps={steps}", "checkpoint_every=0", "global_batch=0",
           f"batch_per_device={batch}"]
    return run(cmd, env, REPO, timeout)


# What workload.distributed.reuse_host_memory sets with mallopt, as glibc's environment.
SAME_ALLOCATOR_ENV = {name: str(value) for name, _, value in HOST_MALLOC_SETTINGS}


def run_maxtext(python: str, steps: int, batch: int, tmp: str, i: int,
                timeout: float, same_allocator: bool = False) -> tuple[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    env.pop("PYTHONPATH", None)
    env.update(JAX_PLATFORMS="cpu", DECOUPLE_GCLOUD="TRUE")
    if same_allocator:
        env.update(SAME_ALLOCATOR_ENV)
    cmd = [python, "-m", "maxtext.trainers.pre_train.train", f"run_name=maxtext-{i}",
           f"base_output_directory={tmp}", f"steps={steps}", f"per_device_batch_size={batch}",
           *MAXTEXT_MODEL]
    return run(cmd, env, Path(tmp), timeout)


VERSION_CODE = """
import importlib.metadata as m, platform
out = ["python " + platform.python_version()]
for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "maxtext"):
    try:
        out.append(f"{name} {m.version(name)}")
    except m.PackageNotFoundError:
        pass
print(", ".join(out))
"""


def versions(python: str) -> str:
    """Versions in the interpreter ``python`` (informative only)."""
    try:
        return subprocess.run([python, "-c", VERSION_CODE], capture_output=True, text=True,
                              timeout=120).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({e})"


def steady(rates: list[tuple[int, float, float]], warmup: int) -> dict:
    """Steady-state throughput of one process from its step lines after ``warmup``.

    The headline is tokens over summed step seconds: MaxText's ``seconds`` run from one
    dispatch to the next, so single values swing (a step whose predecessor was already
    done shows ~0 s, the next one two steps' worth) while their sum is wall time. The
    median of the per-line rates is kept as a second figure.
    """
    kept = rates[warmup:] if len(rates) > warmup else rates[-1:]
    secs = [s for _, s, _ in kept]
    tokens_per_step = statistics.median(s * t for _, s, t in kept)  # batch x sequence
    return {
        "steps": len(kept),
        "tokens_per_step": round(tokens_per_step),
        "steady_tokens_per_s": round(tokens_per_step) * len(kept) / sum(secs),
        "median_line_tokens_per_s": statistics.median(t for _, _, t in kept),
        "median_step_s": statistics.median(secs),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--maxtext-python", required=True, help="python of a venv with maxtext installed")
    p.add_argument("--batch-per-device", type=int, default=1,
                   help="sequences per step for both (the model shape stays bench-21m's)")
    p.add_argument("--rounds", type=int, default=3, help="A/B pairs, each a fresh process")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="first step lines left out")
    p.add_argument("--timeout", type=float, default=900, help="seconds per process")
    p.add_argument("--maxtext-same-allocator", action="store_true",
                   help="run MaxText with the glibc malloc settings our workload sets for itself "
                        "on CPU (as MALLOC_* environment variables): the ratio without that part")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()

    print(f"ours:    {versions(sys.executable)}", flush=True)
    print(f"maxtext: {versions(args.maxtext_python)}", flush=True)
    print(f"{os.cpu_count()} CPU cores; load average at start {os.getloadavg()[0]:.2f}", flush=True)
    results: dict[str, list[dict]] = {"ours": [], "maxtext": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for name in ("ours", "maxtext"):
                if name == "ours":
                    text, wall = run_ours(args.steps, args.batch_per_device, tmp, i, args.timeout)
                else:
                    text, wall = run_maxtext(args.maxtext_python, args.steps,
                                             args.batch_per_device, tmp, i, args.timeout,
                                             args.maxtext_same_allocator)
                load = os.getloadavg()[0]
                rates = step_rates(text)
                if len(rates) < args.steps:
                    raise RuntimeError(f"{name} round {i}: {len(rates)} step lines, expected "
                                       f"{args.steps}:\n{text[-3000:]}")
                r = steady(rates, args.warmup) | {"round": i, "process_wall_s": wall,
                                                  "load_after": load}
                results[name].append(r)
                print(f"round {i} {name:<8} {r['steady_tokens_per_s']:8.1f} tok/s  "
                      f"(median line {r['median_line_tokens_per_s']:8.1f} tok/s, median step "
                      f"{r['median_step_s']:.4f} s, {r['tokens_per_step']} tokens/step, "
                      f"process {wall:5.1f} s, load {load:.2f})", flush=True)
    ours = statistics.median(r["steady_tokens_per_s"] for r in results["ours"])
    theirs = statistics.median(r["steady_tokens_per_s"] for r in results["maxtext"])
    paired = statistics.median(a["steady_tokens_per_s"] / b["steady_tokens_per_s"]
                               for a, b in zip(results["ours"], results["maxtext"], strict=True))
    ours_line = statistics.median(r["median_line_tokens_per_s"] for r in results["ours"])
    theirs_line = statistics.median(r["median_line_tokens_per_s"] for r in results["maxtext"])
    print(f"batch per device {args.batch_per_device} x sequence 256; "
          f"median over {args.rounds} rounds of steady-state tokens/s "
          f"(steps after the first {args.warmup} of each process):")
    print(f"  ours (workload.train bench-21m): {ours:9.1f}")
    print(f"  MaxText (same shape):            {theirs:9.1f}")
    print(f"  ratio ours/MaxText:              {ours / theirs:9.3f}")
    print(f"  median of the per-round ratios:  {paired:9.3f}")
    print(f"  (from median step-line rates instead: ours {ours_line:.1f}, MaxText "
          f"{theirs_line:.1f}, ratio {ours_line / theirs_line:.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"batch_per_device": args.batch_per_device,
             "maxtext_same_allocator": args.maxtext_same_allocator, "ours": results["ours"],
             "maxtext": results["maxtext"], "median_ours": ours,
             "median_maxtext": theirs, "ratio": ours / theirs, "median_round_ratio": paired},
            indent=2))


if __name__ == "__main__":
    main()
