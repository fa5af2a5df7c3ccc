"""Async Orbax checkpoints (OCDBT + Zarr3) of the train state and the data position.

A step folder holds two items: ``state`` (params, optimizer state, step; written by every
process for its own shards) and ``data`` (JSON: the data position and what it indexes).
Orbax commits a step atomically (rename on a file system, ``commit_success.txt`` on GCS), and
``latest_step`` only ever sees committed steps, so a half-written step is never restored.

Every save reports, through :class:`workload.metrics.Metrics`: when it started, how long
training waited for the previous save, how long it was blocked by this one (the device to
host copy), and when it committed. Commits are noticed at step boundaries (``poll``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import jax
import orbax.checkpoint as ocp

from workload.config import Config
from workload.metrics import Metrics


class Checkpoints:
    def __init__(self, directory: str, cfg: Config, metrics: Metrics):
        self.metrics = metrics
        if os.environ.get("STORAGE_EMULATOR_HOST"):
            # gcsfs warns on every call that the emulator gave it no credentials.
            logging.getLogger("gcsfs").setLevel(logging.ERROR)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=cfg.max_to_keep,
            enable_async_checkpointing=cfg.async_checkpoint,
            create=True,
            cleanup_tmp_directories=True,  # leftovers of a killed save are removed, not read
        )
        self.manager = ocp.CheckpointManager(
            directory,
            options=options,
            item_handlers={
                "state": ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True),
                "data": ocp.JsonCheckpointHandler(),
            },
        )
        self.pending: tuple[int, float] | None = None  # (step, save start) not yet committed
        self.saved_steps: list[int] = []

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """State with the shardings of ``abstract_state`` (ShapeDtypeStructs), and the data item."""
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(
                item=abstract_state,
                restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_state),
            ),
            data=ocp.args.JsonRestore(),
        ))
        self.metrics.checkpoint("restored", step)
        return restored["state"], dict(restored["data"])

    def save(self, step: int, state: Any, data: dict[str, Any]) -> float:
        """Start saving ``step``; returns the seconds the training loop was held up."""
        waited = 0.0
        if self.pending:  # the previous save has not committed yet
            t = time.perf_counter()
            self.manager.wait_until_finished()
            waited = time.perf_counter() - t
            self.poll()
            self.metrics.checkpoint("waited", step, waited)
        self.metrics.checkpoint("started", step)
        start_wall, t = time.time(), time.perf_counter()
        self.manager.save(step, force=True, args=ocp.args.Composite(
            state=ocp.args.PyTreeSave(state), data=ocp.args.JsonSave(data)))
        blocked = time.perf_counter() - t
        self.metrics.checkpoint("blocked", step, blocked)
        self.pending = (step, start_wall)
        self.saved_steps.append(step)
        self.poll()
        return waited + blocked

    def poll(self) -> None:
        """Report a commit that happened since the last call (raises a failed async save)."""
        if self.pending and not self.manager.is_saving_in_progress():
            self.manager.check_for_errors()
            step, start = self.pending
            self.pending = None
            self.metrics.checkpoint("committed", step, time.time() - start)

    def wait(self) -> None:
        """Block until the last save has committed (end of training, SIGTERM)."""
        self.manager.wait_until_finished()
        self.poll()

    def close(self) -> None:
        self.manager.close()


def abstract_with_shardings(abstract: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)
