"""Benchmark: time from `xrun submit` to the first completed step, against a bare
`import jax` + `jax.distributed.initialize` of the same hosts measured in the same run.

Runs a run file (default examples/local-tiny.yaml: 2 hosts x 2 CPU devices) against one fresh
storage root: cache off (cold), cache on but empty (fills JAX's persistent compilation cache),
then ``--repeats`` rounds interleaved (below).

* **bare**: one process per host of the run file, all launched at once on this machine, each
  with its pod's env (the same device count per host, gloo CPU collectives as the workload
  configures them), that only does ``import jax`` and ``jax.distributed.initialize`` and
  exits. Its time: launch to the moment the last process returned from ``initialize``.
  Bimodal: a host whose first gRPC connection reaches the coordinator before process 0 has
  started listening waits out gRPC's ~1 s connection backoff (1.3 s or 2.1-2.4 s here).
* **bare, port-probed**: the same, but every host other than 0 first polls the coordinator's
  TCP port, as the workload does (``workload.distributed.wait_for_coordinator``): the bare
  reference without the backoff, its fast mode every time; the stricter reference.
* **warm**: ``xrun submit`` (the CLI as a user runs it, following to the end) with the
  compilation cache warm. Its time: launch of the ``xrun submit`` process to the first step
  record (process 0 writes it once the step, the first collective over all hosts, is done).

Rounds interleave *bare*, *bare, port-probed*, *warm*. Prints the medians, the ratio
warm/bare of the medians (against both references) and of each round, and process 0's
startup timeline (the workload's ``phase`` records: seconds after ``xrun submit`` started).

    python bench/bench_submit.py [--steps 20] [--repeats 3] [--run-file F] [--json OUT]
                                 [--baseline OTHER_CHECKOUT]
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

from orchestrator.backends.local.supervisor import base_env, free_port, plan_pods  # noqa: E402
from orchestrator.runfile import spec_from_inputs  # noqa: E402
from orchestrator.services.runs import render  # noqa: E402
from xrun_contract import Env, Layout  # noqa: E402
from xrun_contract.storage import open_storage  # noqa: E402

# The reference program: what any multi-host JAX job must do before its first step, configured
# as workload/distributed.py configures it (CPU devices per host, gloo collectives).
BARE = r"""
import os, sys, time
import jax
if os.environ.get("XRUN_PLATFORM") == "cpu":
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
import socket
hosts = int(os.environ["XRUN_HOSTS_PER_SLICE"]) * int(os.environ.get("XRUN_NUM_SLICES", "1"))
pid = int(os.environ.get("XRUN_SLICE_INDEX", "0")) * int(os.environ["XRUN_HOSTS_PER_SLICE"]) \
    + int(os.environ["XRUN_HOST_INDEX"])
if pid and os.environ.get("BENCH_PROBE_COORDINATOR") == "1":
    host, _, port = os.environ["XRUN_COORDINATOR_ADDRESS"].rpartition(":")
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
            break
        except OSError:
            time.sleep(0.01)
jax.distributed.initialize(os.environ["XRUN_COORDINATOR_ADDRESS"], hosts, pid,
                           cluster_detection_method="deactivate")
print(f"initialized {time.time():.6f}", flush=True)
"""


def bare_run(run_file: str, name: str, probe: bool = False) -> dict[str, Any]:
    """Launch one bare process per host at once; seconds until the last one initialised.
    ``probe``: hosts other than 0 wait for the coordinator's port first (no gRPC backoff)."""
    spec = spec_from_inputs(run_file, {"name": name})
    with tempfile.TemporaryDirectory() as tmp:
        pods = plan_pods(render(spec), 0, free_port(), root=tmp)
        envs = []
        for pod in pods:
            for folder in pod.volumes:  # as the pod's runner makes them
                os.makedirs(folder)
            env = base_env() | pod.env
            devices = int(env.get(Env.DEVICES_PER_HOST, "0") or 0)
            if devices:
                env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
            env["BENCH_PROBE_COORDINATOR"] = "1" if probe else "0"
            envs.append(env)
        t0 = time.time()
        procs = [subprocess.Popen([sys.executable, "-c", BARE], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for env in envs]
        outs = [p.communicate(timeout=300) for p in procs]
    done = []
    for p, (out, err) in zip(procs, outs, strict=True):
        lines = [ln for ln in out.splitlines() if ln.startswith("initialized ")]
        if p.returncode != 0 or not lines:
            raise SystemExit(f"bare process failed ({p.returncode}):\n{err[-3000:]}")
        done.append(float(lines[-1].split()[1]))
    return {"hosts": len(pods), "initialized_s": max(done) - t0}


def metric_records(st: Any, name: str) -> list[dict[str, Any]]:
    """Every record of the run's metrics JSONL chunks, in time order."""
    objects, _ = st.list(Layout.metrics(name))
    out = []
    for o in objects:
        if o.key.endswith(".jsonl"):
            out += [json.loads(ln) for ln in (st.read_bytes(o.key) or b"").decode().splitlines()
                    if ln.strip()]
    return sorted(out, key=lambda r: r.get("time", 0.0))


def one_run(storage: str, name: str, run_file: str, steps: int, cache: bool,
            repo: Path = REPO) -> dict[str, Any]:
    """``xrun submit`` of ``repo``'s checkout (its CLI, supervisor and workload)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    env["XRUN_LOCAL_COMPILATION_CACHE"] = "1" if cache else "0"
    env["PYTHONPATH"] = str(repo)
    cmd = [sys.executable, "-m", "orchestrator.cli", "submit", "-f", run_file, "--name", name,
           "--storage", storage,
           "--command", f"python3 -m workload.train --preset tiny steps={steps} checkpoint_every={steps}"]
    t0 = time.time()
    # From the checkout itself: `python -m` puts the working folder first on sys.path.
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=repo)
    t_end = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"run {name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    st = open_storage(storage)
    run = st.read_json(Layout.run_json(name)) or {}
    records = metric_records(st, name)
    steps_rec = [r for r in records if r.get("kind") == "step"]
    # Process 0's startup timeline: seconds after `xrun submit` started at each milestone
    # (a phase record's time minus its seconds is the process start).
    phases = {r["phase"]: round(r["time"] - t0, 3) for r in records
              if r.get("kind") == "phase" and r.get("attempt", 0) == 0}
    # Every phase record's time minus its seconds is the process start; the earliest holds
    # for workloads that stamped early phases when writing them.
    starts = [r["time"] - r["seconds"] for r in records
              if r.get("kind") == "phase" and r.get("attempt", 0) == 0]
    # The first step is done when its result is back on process 0 (the "first_step" phase;
    # the step record follows once the checkpoint manager has seen the step boundary).
    first = phases.get("first_step", steps_rec[0]["time"] - t0)
    return {
        "first_step_s": first,
        "submitted_s": run.get("submitted_at", t0) - t0,  # the CLI's own start + render
        "process_start_s": min(starts) - t0 if starts else None,
        "end_s": t_end - t0,
        "median_step_s": sorted(r["seconds"] for r in steps_rec)[len(steps_rec) // 2],
        "phases": phases,
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure, and of each phase, over repeated runs of one variant."""
    out: dict[str, Any] = {k: statistics.median(r[k] for r in runs)
                           for k in ("first_step_s", "submitted_s", "end_s", "median_step_s")}
    out["phases"] = {k: round(statistics.median(r["phases"][k] for r in runs if k in r["phases"]), 3)
                     for k in runs[0]["phases"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3, help="bare/warm pairs, interleaved")
    ap.add_argument("--run-file", default=str(REPO / "examples" / "local-tiny.yaml"))
    ap.add_argument("--json", help="Also write the results here.")
    ap.add_argument("--baseline", type=Path,
                    help="Another checkout (e.g. `git archive main | tar -x -C DIR`): its warm "
                         "submit runs in each pair too, with its own storage root and cache.")
    args = ap.parse_args()
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        storage = str(Path(tmp) / "store")
        results: dict[str, Any] = {
            "cold (cache off)": one_run(storage, "bench-cold", args.run_file, args.steps, cache=False),
            "cache on, empty": one_run(storage, "bench-fill", args.run_file, args.steps, cache=True),
        }
        base_storage = str(Path(tmp) / "baseline")
        if args.baseline:
            one_run(base_storage, "base-fill", args.run_file, args.steps, True, args.baseline)
        bare: list[dict[str, Any]] = []
        probed: list[dict[str, Any]] = []
        warm: list[dict[str, Any]] = []
        base: list[dict[str, Any]] = []
        for i in range(args.repeats):
            load.append(os.getloadavg()[0])
            bare.append(bare_run(args.run_file, f"bench-bare-{i}"))
            probed.append(bare_run(args.run_file, f"bench-probed-{i}", probe=True))
            warm.append(one_run(storage, f"bench-warm-{i}", args.run_file, args.steps, cache=True))
            if args.baseline:
                base.append(one_run(base_storage, f"base-warm-{i}", args.run_file, args.steps,
                                    True, args.baseline))
        load.append(os.getloadavg()[0])
    results["cache on, warm (median)"] = medians(warm)
    if base:
        results["baseline warm (median)"] = medians(base)
    bare_median = statistics.median(b["initialized_s"] for b in bare)
    ratio = results["cache on, warm (median)"]["first_step_s"] / bare_median
    pairs = [w["first_step_s"] / b["initialized_s"] for b, w in zip(bare, warm, strict=True)]
    probed_median = statistics.median(b["initialized_s"] for b in probed)
    ratio_probed = results["cache on, warm (median)"]["first_step_s"] / probed_median
    pairs_probed = [w["first_step_s"] / q["initialized_s"]
                    for q, w in zip(probed, warm, strict=True)]

    print(f"{'variant':<24} {'submit->step 1 (s)':>19} {'submit->end (s)':>16} {'median s/step':>14}")
    for k, r in results.items():
        print(f"{k:<24} {r['first_step_s']:>19.2f} {r['end_s']:>16.2f} {r['median_step_s']:>14.4f}")
    print(f"{'bare init (median)':<24} {bare_median:>19.2f}")
    print(f"{'bare, port-probed (med.)':<24} {probed_median:>19.2f}")
    print("\nrounds (bare init s, port-probed bare s, warm submit->step 1 s, warm/bare, "
          "warm/port-probed): "
          + "; ".join(f"{b['initialized_s']:.2f}, {q['initialized_s']:.2f}, "
                      f"{w['first_step_s']:.2f}, {p:.2f}, {pp:.2f}"
                      for b, q, w, p, pp in zip(bare, probed, warm, pairs, pairs_probed,
                                                strict=True)))
    names = [n for n in ("process_start", "imports", "distributed", "checkpoint_manager",
                         "restored", "initialized", "compiled", "first_step")
             if any(n in r["phases"] for r in results.values())]
    print("\nprocess 0 startup, seconds after `xrun submit` started, at the end of each phase:")
    print(f"{'variant':<24} " + " ".join(f"{n:>12.12}" for n in names))
    for k, r in results.items():
        print(f"{k:<24} " + " ".join(f"{r['phases'].get(n, float('nan')):>12.2f}" for n in names))
    ratios = {
        "first_step_warm_over_bare": ratio,
        "first_step_warm_over_bare_pairs": pairs,
        "first_step_warm_over_probed_bare": ratio_probed,
        "first_step_warm_over_probed_bare_rounds": pairs_probed,
        "first_step_warm_over_cold": results["cache on, warm (median)"]["first_step_s"]
        / results["cold (cache off)"]["first_step_s"],
    }
    if base:
        ratios["baseline_first_step_over_bare"] = (
            results["baseline warm (median)"]["first_step_s"] / bare_median)
    print(f"\nratio warm submit->step 1 / bare init (medians): {ratio:.2f} "
          f"(target <= 2); against the port-probed bare: {ratio_probed:.2f}; "
          f"warm/cold first step {ratios['first_step_warm_over_cold']:.2f}"
          + (f"; baseline warm / bare {ratios['baseline_first_step_over_bare']:.2f}"
             if base else ""))
    print("load average (1 min) at start and before each pair, end: "
          + ", ".join(f"{x:.2f}" for x in load))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"results": results, "bare": bare, "probed_bare": probed, "warm": warm,
             "baseline": base, "ratios": ratios, "load_average_1m": load}, indent=2))


if __name__ == "__main__":
    main()
