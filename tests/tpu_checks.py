"""Checks of the workload on whatever chip this process sees, one JSON object on stdout.

    python tests/tpu_checks.py losses  --preset tiny [KEY=VALUE ...] [--steps N]
    python tests/tpu_checks.py resume  --preset tiny [KEY=VALUE ...] [--variant GIB:THREADS]

Run as a subprocess by tests/test_tpu.py (on the TPU machine, where the CPU reference runs
in a second process with ``JAX_PLATFORMS=cpu``) and by its CPU test in CI: the same code
paths, whatever the platform. One program holds a TPU chip at a time, so each check is one
process that opens the chip once.

* ``losses``: the losses of the first steps of a fresh run (seed, synthetic data), as the
  workload's own ``Program`` computes them.
* ``auto``: remat=auto's choice, its compiled step's memory against the chip's, its losses.
* ``accumulate``: the first losses at one batch and at ``--micro`` micro-batches.
* ``resume``: ``--warm`` steps, a save through xrun's ``Checkpoints`` (staging as given,
  the host copy from threads), one more step; then a restore of that save into a fresh state
  and the same step again. The two losses must be identical: a staged save is the state.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def build(preset: str, overrides: list[str], compile_now: bool = True) -> tuple[Any, Any, Any]:
    """(config, Program, batch function) on every local device, one mesh."""
    import jax

    from workload import data
    from workload.config import load_config
    from workload.distributed import make_mesh
    from workload.train import Program

    cfg = load_config(preset, overrides)
    mesh = make_mesh(1)
    batch_size = cfg.batch_size(jax.device_count())
    program = Program(cfg, mesh, batch_size, compile_now=compile_now)
    source = data.make_source(cfg.data, cfg.data_dtype, cfg.seed, cfg.seq_len, cfg.vocab_size)

    def batch(i: int) -> Any:
        return data.make_batch(source, i * batch_size, batch_size, cfg.seq_len,
                               program.batch_sharding)

    return cfg, program, batch


def losses(preset: str, overrides: list[str], steps: int, quick: bool = False) -> dict[str, Any]:
    """The first steps' losses; ``quick``: run by the quick executable (quick_compile)."""
    import jax

    cfg, program, batch = build(preset, overrides, compile_now=not quick)
    step = program.compile_quick() if quick else program.train_step
    state, out = program.init(), []
    for i in range(steps):
        state, o = step(state, batch(i))
        out.append(float(o["loss"]))
    return {"platform": jax.devices()[0].platform, "device": jax.devices()[0].device_kind,
            "losses": out}


def quick_vs_optimized(preset: str, overrides: list[str], steps: int) -> dict[str, Any]:
    """The same steps from the same state by the quick executable and by the optimized one,
    one after the other in one process."""
    import jax

    _, program, batch = build(preset, overrides, compile_now=False)
    out: dict[str, Any] = {"platform": jax.devices()[0].platform}
    for name, compile_fn in (("quick", program.compile_quick), ("optimized", program.compile)):
        exe, state, losses_ = compile_fn(), None, []
        state = program.init()  # the other's state is gone: two do not fit a v5e chip
        for i in range(steps):
            state, o = exe(state, batch(i))
            losses_.append(float(o["loss"]))
        out[name] = losses_
        del state
    return out


def auto(preset: str, overrides: list[str], steps: int) -> dict[str, Any]:
    """remat=auto's choice on this chip, the memory its compiled step needs against the
    device's limit, and the losses of its first steps."""
    import jax

    from workload import autotune

    t = time.perf_counter()
    _, program, batch = build(preset, overrides)
    build_s = time.perf_counter() - t
    state, out = program.init(), []
    for i in range(steps):
        state, o = program.train_step(state, batch(i))
        out.append(float(o["loss"]))
    return {"platform": jax.devices()[0].platform, "losses": out, "build_s": build_s,
            "choice": program.choice.to_dict() if program.choice else None,
            "needed": autotune.needed_bytes(program.train_step),
            "limit": autotune.device_limit(), "headroom": autotune.HEADROOM}


def accumulate(preset: str, overrides: list[str], steps: int, micro: int) -> dict[str, Any]:
    """The first steps' losses at one batch and at ``micro`` micro-batches, same data."""
    import jax

    out: dict[str, Any] = {"platform": jax.devices()[0].platform}
    for k in (1, micro):
        _, program, batch = build(preset, [*overrides, f"micro_batches={k}"])
        state, losses_ = program.init(), []
        for i in range(steps):
            state, o = program.train_step(state, batch(i))
            losses_.append(float(o["loss"]))
        out[str(k)] = losses_
        del state, program
    return out


def resume(preset: str, overrides: list[str], warm: int,
           variants: list[tuple[float, int]]) -> dict[str, Any]:
    """One result per (staging GiB, copy threads) variant, all on the same program."""
    import jax
    import numpy as np

    base, program, batch = build(preset, overrides)
    results = [_resume_one(base.__class__(**{**base.to_dict(), "checkpoint_stage_gib": gib,
                                             "checkpoint_copy_threads": threads}),
                           program, batch, warm) for gib, threads in variants]
    return {"platform": jax.devices()[0].platform, "variants": results,
            "state_bytes": sum(int(np.prod(a.shape)) * a.dtype.itemsize
                               for a in jax.tree.leaves(program.abstract_state))}


def _resume_one(cfg: Any, program: Any, batch: Any, warm: int) -> dict[str, Any]:
    import jax

    from workload.checkpointing import Checkpoints
    from workload.metrics import Metrics
    from workload.train import staging_budget
    from xrun_contract.storage import open_storage

    state = program.init()
    for i in range(warm):
        state, _ = program.train_step(state, batch(i))
    root = tempfile.mkdtemp(prefix="xrun-tpu-check-")
    metrics = Metrics(None, None, 0, True)

    def checkpoints() -> Checkpoints:
        return Checkpoints(open_storage(root), "ckpt", cfg, metrics,
                           staging_budget=lambda: staging_budget(cfg, program))

    ck = checkpoints()
    ck.restore_latest(program.abstract_state)  # nothing there: opens the manager
    t = time.perf_counter()
    blocked = ck._save(warm, state, {"position": warm})
    staged = ck.staging.staged_bytes if ck.staging is not None else 0
    # The next step donates the state while the save may still be writing it.
    state, o = program.train_step(state, batch(warm))
    after_save = float(o["loss"])
    ck.finish(warm, state, lambda: {"position": warm})  # waits for the commit (warm is saved)
    commit_s = time.perf_counter() - t
    ck.close()
    for a in jax.tree.leaves(state):  # room for the restored copy (HBM holds one state)
        a.delete()
    del state
    ck2 = checkpoints()
    restored = ck2.restore_latest(program.abstract_state)
    assert restored is not None, "the save did not commit"
    step, state2, data = restored
    state2, o2 = program.train_step(state2, batch(warm))
    ck2.close()
    return {"stage_gib": cfg.checkpoint_stage_gib, "threads": cfg.checkpoint_copy_threads,
            "restored_step": step, "data": data, "loss_after_save": after_save,
            "loss_after_restore": float(o2["loss"]), "blocked_s": blocked,
            "commit_s": commit_s, "staged_bytes": staged}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("check", choices=["losses", "quick", "resume", "auto", "accumulate"])
    p.add_argument("--micro", type=int, default=2, help="accumulate: micro-batches")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warm", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="losses: the quick executable's")
    p.add_argument("--variant", action="append", default=None, metavar="GIB:THREADS",
                   help="checkpoint_stage_gib and checkpoint_copy_threads (default -1:4)")
    p.add_argument("overrides", nargs="*")
    a = p.parse_intermixed_args(argv)  # KEY=VALUE overrides after options too
    if a.check == "losses":
        result = losses(a.preset, a.overrides, a.steps, a.quick)
    elif a.check == "auto":
        result = auto(a.preset, a.overrides, a.steps)
    elif a.check == "accumulate":
        result = accumulate(a.preset, a.overrides, a.steps, a.micro)
    elif a.check == "quick":
        result = quick_vs_optimized(a.preset, a.overrides, a.steps)
    else:
        variants = [(float(g), int(t)) for g, t in
                    (v.split(":") for v in a.variant or ["-1:4"])]
        result = resume(a.preset, a.overrides, a.warm, variants)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
