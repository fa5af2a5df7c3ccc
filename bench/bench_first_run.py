"""Benchmark: a first run (cold: fresh storage root, empty compilation cache) of the README's
main command, ``xrun submit -f examples/local-tiny.yaml``, to its first completed step,
against a bare script doing the same work measured in the same run.

* **bare**: one process per host of the run file (2 here), launched at once with the pod's
  env (the same CPU device count per host, gloo collectives), each doing what a multi-host
  JAX job must before its first step: ``import jax``, ``jax.distributed.initialize``, build
  the same model (``workload.train.Program``: the tiny preset, the same mesh and
  shardings), create its state (the jitted init), compile the train step, run one step and
  wait for its result. No JAX compilation cache (cold, as xrun's first run). Its time:
  launch to the moment the last process has its first step's result.
* **xrun, cold**: ``xrun submit`` (the CLI as a user runs it) of the run file into a fresh
  storage root (so JAX's persistent compilation cache and xrun's executable cache are
  empty). Its time: launch of ``xrun submit`` to process 0's "first_step" phase record.

Rounds interleave bare and xrun (``--repeats``); prints each round's ratio xrun/bare, the
ratio of the medians (target <= 2), and xrun's startup timeline (process 0's phase
records, seconds after ``xrun submit`` started), so the time goes somewhere named.

    python bench/bench_first_run.py [--repeats 2] [--run-file F] [--json OUT]
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_submit import one_run  # noqa: E402

from orchestrator.backends.local.supervisor import base_env, free_port, plan_pods  # noqa: E402
from orchestrator.runfile import spec_from_inputs  # noqa: E402
from orchestrator.services.runs import render, workload_train_args  # noqa: E402
from xrun_contract import Env  # noqa: E402

# The reference: the same work as xrun's workload before its first step, nothing else (no
# storage, metrics, checkpoints, supervisor, log shipping), in the plainest order.
BARE = r"""
import os, sys, time
t0 = time.time()
import jax
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_cpu_collectives_implementation", "gloo")
hosts = int(os.environ["XRUN_HOSTS_PER_SLICE"]) * int(os.environ.get("XRUN_NUM_SLICES", "1"))
pid = int(os.environ.get("XRUN_SLICE_INDEX", "0")) * int(os.environ["XRUN_HOSTS_PER_SLICE"]) \
    + int(os.environ["XRUN_HOST_INDEX"])
jax.distributed.initialize(os.environ["XRUN_COORDINATOR_ADDRESS"], hosts, pid,
                           cluster_detection_method="deactivate")
t_init = time.time()
import numpy as np
from workload.config import load_config
from workload.distributed import make_mesh
from workload.train import Program
cfg = load_config("tiny", sys.argv[1:], None)
mesh = make_mesh(None)
batch = cfg.batch_size(jax.device_count())
program = Program(cfg, mesh, batch, compile_now=False, executables=None)
t_model = time.time()
state = program.init()
jax.block_until_ready(state)
t_state = time.time()
step = program.compile()
t_compiled = time.time()
tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, cfg.seq_len + 1), dtype=np.int32)
tokens = jax.make_array_from_callback(tokens.shape, program.batch_sharding, lambda i: tokens[i])
state, out = step(state, tokens)
jax.block_until_ready(out)
t_step = time.time()
print("bare " + " ".join(f"{k}={v:.6f}" for k, v in (("start", t0), ("initialized", t_init),
      ("model", t_model), ("state", t_state), ("compiled", t_compiled), ("first_step", t_step))),
      flush=True)
"""


def bare_run(run_file: str, name: str) -> dict[str, Any]:
    """One bare process per host, launched at once; seconds until the last one has its
    first step's result, and each milestone's median over the hosts."""
    spec = spec_from_inputs(run_file, {"name": name})
    args = workload_train_args(spec.command) or []
    overrides = [a for a in args if "=" in a and not a.startswith("-")]
    with tempfile.TemporaryDirectory() as tmp:
        pods = plan_pods(render(spec), 0, free_port(), root=tmp)
        envs = []
        for pod in pods:
            env = base_env() | pod.env
            devices = int(env.get(Env.DEVICES_PER_HOST, "0") or 0)
            if devices:
                env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
            env["PYTHONPATH"] = str(REPO)
            env.pop("JAX_COMPILATION_CACHE_DIR", None)
            envs.append(env)
        t0 = time.time()
        procs = [subprocess.Popen([sys.executable, "-c", BARE, *overrides], env=env, cwd=tmp,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for env in envs]
        outs = [p.communicate(timeout=600) for p in procs]
    marks: list[dict[str, float]] = []
    for p, (out, err) in zip(procs, outs, strict=True):
        lines = [ln for ln in out.splitlines() if ln.startswith("bare ")]
        if p.returncode != 0 or not lines:
            raise SystemExit(f"bare process failed ({p.returncode}):\n{err[-3000:]}")
        marks.append({k: float(v) - t0 for k, v in (kv.split("=") for kv in lines[-1].split()[1:])})
    return {"hosts": len(pods), "first_step_s": max(m["first_step"] for m in marks),
            "phases": {k: round(statistics.median(m[k] for m in marks), 3) for k in marks[0]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2, help="bare/xrun pairs, interleaved")
    ap.add_argument("--run-file", default=str(REPO / "examples" / "local-tiny.yaml"))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", help="Also write the results here.")
    args = ap.parse_args()
    load = [os.getloadavg()[0]]
    bare: list[dict[str, Any]] = []
    xrun: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            bare.append(bare_run(args.run_file, f"first-bare-{i}"))
            # A fresh storage root each round: JAX's compilation cache and the executable
            # cache live under it, so every xrun run is a first run.
            xrun.append(one_run(str(Path(tmp) / f"store-{i}"), f"first-run-{i}", args.run_file,
                                args.steps, cache=True))
            load.append(os.getloadavg()[0])
    pairs = [x["first_step_s"] / b["first_step_s"] for b, x in zip(bare, xrun, strict=True)]
    ratio = statistics.median(x["first_step_s"] for x in xrun) / statistics.median(
        b["first_step_s"] for b in bare)
    print("round  bare->step 1 (s)  xrun cold->step 1 (s)  xrun/bare")
    for i, (b, x, p) in enumerate(zip(bare, xrun, pairs, strict=True)):
        print(f"{i:>5}  {b['first_step_s']:>16.2f}  {x['first_step_s']:>21.2f}  {p:>9.2f}")
    print("\nbare, median over hosts, seconds after launch: "
          + ", ".join(f"{k} {v:.2f}" for k, v in bare[-1]["phases"].items()))
    print("xrun process 0, seconds after `xrun submit` started: "
          + ", ".join(f"{k} {v:.2f}" for k, v in xrun[-1]["phases"].items()))
    print(f"\nratio xrun cold first step / bare first step (medians): {ratio:.2f} (target <= 2)")
    print("load average (1 min) at start and after each pair: " + ", ".join(f"{x:.2f}" for x in load))
    if args.json:
        Path(args.json).write_text(json.dumps({"bare": bare, "xrun": xrun, "pairs": pairs,
                                               "ratio": ratio, "load_average_1m": load}, indent=2))


if __name__ == "__main__":
    main()
