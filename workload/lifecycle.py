"""The process around the loop: signals (preemption), test faults, the header's versions,
memory, imports ahead of need, and the checkpoint manager's opening."""

from __future__ import annotations

import functools
import json
import os
import signal
import time
from typing import Any

from workload.config import Config, describe
from workload.distributed import Cluster, compilation_cache_dir
from workload.metrics import Metrics
from workload.program import Program
from xrun_contract import XRUN_VERSION, Env, Layout
from xrun_contract.checkpoints import latest_committed_step
from xrun_contract.storage import Storage


def fail_at_step(cluster: Cluster) -> tuple[int, int] | None:
    """(step, exit code) when XRUN_TEST_FAIL_AT_STEP targets this process in attempt 0."""
    spec = os.environ.get(Env.TEST_FAIL_AT_STEP, "").strip()
    if not spec or cluster.attempt != 0:
        return None
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"{Env.TEST_FAIL_AT_STEP}: expected <step>:<exit code>[:<process id>], "
                         f"got {spec!r}")
    if len(parts) == 3 and int(parts[2]) != cluster.process_id:
        return None
    return int(parts[0]), int(parts[1])


class Preemption:
    """SIGTERM -> save and exit. With jax.distributed running, JAX's preemption service owns
    SIGTERM and picks one step at which every process stops; otherwise a local flag does."""

    def __init__(self):
        self.received: list[float] = []
        self.distributed = False
        signal.signal(signal.SIGTERM, lambda *_: self.received.append(time.time()))

    def handed_to_jax(self) -> None:
        """jax.distributed.initialize has installed its own handler; replay an early notice."""
        self.distributed = True
        if self.received:
            os.kill(os.getpid(), signal.SIGTERM)

    def reached(self, step: int) -> bool:
        if self.distributed:
            from jax.experimental import multihost_utils

            return multihost_utils.reached_preemption_sync_point(step)
        return bool(self.received)


def versions(cfg: Config, mesh) -> dict[str, str]:
    import jax
    import jaxlib

    devices = jax.devices()
    out = {
        "xrun": XRUN_VERSION,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "backend": jax.default_backend(),
        "process_id": str(jax.process_index()),
        "process_count": str(jax.process_count()),
        "local_devices": str(jax.local_device_count()),
        "global_devices": str(len(devices)),
        "device_kind": devices[0].device_kind,
        "mesh": json.dumps(dict(mesh.shape), separators=(",", ":")),
        "accelerator": os.environ.get(Env.ACCELERATOR, ""),
        "image": os.environ.get(Env.IMAGE, ""),
        "commit": os.environ.get(Env.COMMIT, ""),
        "config": describe(cfg),
    }
    return {k: v for k, v in out.items() if v}


def report_memory(metrics: Metrics) -> None:
    """MaxText's memory line for this process's first device, where the backend reports it."""
    import jax

    device = jax.local_devices()[0]
    stats = device.memory_stats() or {}
    if "bytes_in_use" not in stats:
        return
    total = stats.get("bytes_limit") or 0
    if not total and os.environ.get(Env.HBM_GIB_PER_DEVICE):
        total = float(os.environ[Env.HBM_GIB_PER_DEVICE]) * 2**30
    if total:
        metrics.memory(stats["bytes_in_use"] / 1e9, total / 1e9, str(device).replace(" ", ""))


def preload(storage: Storage | None, run: str | None, cfg: Config) -> None:
    """Import what the first step needs in a thread while ``jax.distributed.initialize``
    waits for the other processes (it releases the GIL), and Orbax too when a committed
    checkpoint is there to restore. None of them touches a backend at import, which must not
    exist before ``initialize``. A failed import is left to the main thread's own import.

    The model's libraries (flax, optax: about half a second of CPU) only without a
    compilation cache: with one, the executable cache (workload/executables.py) normally
    hits and nothing needs them, and importing them anyway held the GIL and a core while
    the executables loaded (+0.2-0.4 s to a warm start on 2 cores shared by 2 hosts)."""
    import importlib
    import threading

    names = ["workload.data"]
    if not compilation_cache_dir():
        names[:0] = ["flax.nnx", "optax", "workload.model"]

    def load() -> None:
        try:
            for name in names:
                importlib.import_module(name)
            if (storage is not None and run and cfg.checkpoint_every > 0
                    and latest_committed_step(storage, Layout.checkpoints(run)) is not None):
                importlib.import_module("workload.checkpointing")
        except Exception:  # noqa: BLE001, S110 - the main thread's import raises it again
            pass

    threading.Thread(target=load, name="xrun-preload", daemon=True).start()


def agreed_latest_step(storage: Storage, key: str) -> int | None:
    """The newest committed checkpoint step as process 0 lists it, the same on every process
    (a Peers round): whether Orbax is needed before the first step must not differ."""
    from workload.peers import Peers

    mine = latest_committed_step(storage, key)
    value = Peers(prefix="xrun/startup/latest").gather("" if mine is None else str(mine))[0]
    return int(value) if value else None


def open_checkpoints(storage: Storage, run: str, cfg: Config, metrics: Metrics,
                     cluster: Cluster, program: Program) -> Any:
    """Orbax's side (imports Orbax: about a second)."""
    from workload.checkpointing import Checkpoints

    return Checkpoints(storage, Layout.checkpoints(run), cfg, metrics,
                       exit_code=cluster.restartable_exit_code,
                       staging_budget=functools.partial(staging_budget, cfg, program))


def staging_budget(cfg: Config, program: Program) -> int:
    """Bytes per device a save may copy the state into (``checkpoint_stage_gib``; auto: what
    the fullest local device has free now, at a step boundary, less the train step's
    temporaries and a margin). 0 where the backend reports no device memory (CPU)."""
    import jax

    from workload.checkpointing import STAGING_MARGIN_BYTES

    if cfg.checkpoint_stage_gib >= 0:
        return int(cfg.checkpoint_stage_gib * 2**30)
    stats = [d.memory_stats() or {} for d in jax.local_devices()]
    if not stats or not all("bytes_limit" in s and "bytes_in_use" in s for s in stats):
        return 0
    try:
        temp = int(program.train_step.memory_analysis().temp_size_in_bytes)
    except Exception:  # noqa: BLE001 - no analysis: stage nothing rather than risk the step
        return 0
    free = min(s["bytes_limit"] - s["bytes_in_use"] for s in stats)
    return max(0, free - temp - STAGING_MARGIN_BYTES)


def checkpoint_write_failed() -> type[BaseException]:
    """``workload.checkpointing.CheckpointWriteFailed`` (importing it imports Orbax)."""
    from workload.checkpointing import CheckpointWriteFailed

    return CheckpointWriteFailed


class DeferredCheckpoints:
    """Nothing to restore: Orbax is imported and the checkpoint manager opened at the first
    step boundary, not before the first step. Not in a thread beside the first step: the
    imports hold the GIL and a core that a host with few cores needs for the step (measured
    no gain on 2 cores), and opening runs Orbax barriers, device collectives (orbax
    ``multihost.sync_global_processes``) that must not interleave with a step's."""

    def __init__(self, storage: Storage, run: str, cfg: Config, metrics: Metrics,
                 cluster: Cluster, program: Program):
        self.args = (storage, run, cfg, metrics, cluster)
        self.program = program
        self.abstract_state = program.abstract_state

    def open(self) -> Any:
        ckpt = open_checkpoints(*self.args, self.program)
        if ckpt.restore_latest(self.abstract_state) is not None:  # agreed: none committed
            raise RuntimeError("a checkpoint was committed by another writer during startup")
        return ckpt
