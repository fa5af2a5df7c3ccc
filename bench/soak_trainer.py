"""A trainer without JAX for the soak's fast form (``bench_soak.py --trainer fake``).

The soak's questions are about what follows a long run, not about training: whether the
follow's memory stays flat over 20,000 steps and 19 restarts, whether every stored line is
printed once, whether storage stays bounded. With the tiny JAX model a step costs ~0.1 s of
two busy cores and a restart ~30 s, so the issue's 20,000 steps took 100 minutes. This
program writes what ``workload.train`` writes per step, through the workload's own
:class:`workload.metrics.Metrics` (the step line on stdout, which the pod's log shipper
ships; the step record into metrics chunks and rollups; TensorBoard scalars), with phases,
checkpoint events and a checkpoint folder per save (the last ``max_to_keep`` kept), and
restarts as the real one does under ``XRUN_TEST_RESTART_EVERY``: it saves, exits with the
restartable code, and the next attempt resumes after the saved step. Its loss is a function
of the step alone, so an interrupted run ends on the same loss as an uninterrupted one only
if it resumed from the right step.

    python3 bench/soak_trainer.py steps=20000 checkpoint_every=1000 max_to_keep=3 step_seconds=0.02
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workload.distributed import Cluster  # noqa: E402
from workload.metrics import Metrics, say  # noqa: E402
from xrun_contract import Env, Layout  # noqa: E402
from xrun_contract.storage import Storage, open_storage  # noqa: E402

MARKER = "commit_success.txt"


def loss_at(step: int) -> float:
    """Deterministic in the step: the same step gives the same loss in any attempt."""
    return 2.0 / math.sqrt(step) + 0.01 * math.sin(step)


def _wait_for(storage: Storage, key: str, timeout_s: float = 120.0) -> None:
    """Host 0 writes each save; the others wait for it, as the JAX hosts' collectives keep
    them in step (left alone, a host that ran ahead exited first at a restart step and the
    supervisor stopped host 0 before its save)."""
    deadline = time.monotonic() + timeout_s
    while storage.read_bytes(key) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"soak trainer: host 0's save {key} not written within {timeout_s:.0f}s")
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    args = dict(a.split("=", 1) for a in argv)
    steps = int(args.get("steps", "20000"))
    every = int(args.get("checkpoint_every", "1000"))
    keep = int(args.get("max_to_keep", "3"))
    step_s = float(args.get("step_seconds", "0.02"))
    cluster = Cluster.from_env()
    storage = open_storage(os.environ[Env.STORAGE])
    run = os.environ[Env.RUN_NAME]
    primary = cluster.process_id == 0
    metrics = Metrics(storage, run, cluster.attempt, primary)
    metrics.header({"xrun": "soak-trainer", "process_count": str(cluster.num_processes)},
                   {"steps": steps, "checkpoint_every": every})
    folder = f"{Layout.run(run)}/checkpoints"
    _, prefixes = storage.list(folder)
    saved = sorted(int(p.rsplit("/", 1)[-1]) for p in prefixes if p.rsplit("/", 1)[-1].isdigit()
                   and storage.read_bytes(f"{p}/{MARKER}") is not None)
    start = saved[-1] if saved else 0
    if start:
        metrics.checkpoint("restored", start, 0.0)
    metrics.phase("compiled")
    restart_every = int(os.environ.get(Env.TEST_RESTART_EVERY, "0") or 0)
    for step in range(start + 1, steps + 1):
        time.sleep(step_s)
        if step == start + 1:
            metrics.phase("first_step", step=step)
        metrics.step(step, step_s, 1e-4, 1000.0, 512, loss_at(step), 0.0, grad_norm=0.5,
                     learning_rate=1e-3, tokens_per_s=2000.0, idle_s=0.0)
        if step % every == 0 or step == steps:
            if primary:
                metrics.checkpoint("started", step, 0.0)
                storage.write_text(f"{folder}/{step}/{MARKER}", "ok\n")
                for old in saved[:-(keep - 1)] if keep > 1 else saved:
                    storage.delete_prefix(f"{folder}/{old}")
                saved = [*saved[-(keep - 1):], step] if keep > 1 else [step]
                metrics.checkpoint("committed", step, 0.0)
            else:  # as a collective save would: no host goes on (or exits) before it is written
                _wait_for(storage, f"{folder}/{step}/{MARKER}")
            if restart_every and step % restart_every == 0 and step < steps:
                say(f"xrun: test restart ({Env.TEST_RESTART_EVERY}) at step {step}")
                metrics.end(cluster.restartable_exit_code, f"test restart at step {step}")
                metrics.close()
                return cluster.restartable_exit_code
    metrics.end(0, "completed")
    metrics.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
