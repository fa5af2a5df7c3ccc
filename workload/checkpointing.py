"""Async Orbax checkpoints (OCDBT + Zarr3) that never stall training and never lose a
committed step.

A step folder holds two items: ``state`` (params, optimizer state, step; written by every
process for its own shards) and ``data`` (JSON: the data position and what it indexes).

Rules, each decided identically on every process (:class:`workload.peers.Peers` rounds):

* **No wait for a previous save.** ``CheckpointManager.save`` starts by waiting for the
  previous save (orbax ``checkpoint_manager.py``: ``save`` -> ``wait_until_finished``, the
  "Waiting for previous save to complete" warning). So a save is started only when every
  process reports the previous one finished; otherwise it is *deferred* to the first step
  after the previous one commits (a "deferred" event). Training is held up only by
  ``save``'s own blocking part: the device-to-host copy.
* **Cadence follows the storage.** The write time of each save is measured in steps (save
  start -> the step boundary at which every process saw it committed); the next save is due
  ``max(checkpoint_every, that many)`` steps after the last one. When storage keeps up, saves
  land exactly every ``checkpoint_every`` steps; when it does not, as often as it allows.
* **Exit waits.** The last step's save and a SIGTERM save must commit before the process
  exits; that wait is an "exit_wait" event, never a "waited" one.
* **The blocking part is as short as the device allows** (``Staging``). Orbax's save copies
  every array to the host before it returns, because the next train step donates them.
  The arrays that fit in the device memory the train step leaves free are copied there
  instead (a device-to-device copy, milliseconds) and handed to Orbax as *deprioritized*
  transfers (orbax ``TransferPriority.ASYNCHRONOUS_DEPRIORITIZED``), which its background
  thread copies to the host while training goes on; only the rest is copied before
  ``save`` returns. Same bytes, same files: a staged save restores like any other. That
  rest is copied from several threads (``copy_to_host``) before ``save`` is called: Orbax
  copies one array after another (``replica_slices.transfer_arrays_to_host``: ``np.asarray``
  of each shard in turn), 1.7 GB/s on a v5e chip's link where 4 threads reach 2.85 GB/s,
  and finds each shard's host value cached on the same shard object.
* **Committed means Orbax's rule** (:mod:`xrun_contract.checkpoints`); an empty step folder
  is removed before the manager lists the directory (it would collide with a later save).
* **Restore falls back.** If the newest committed step does not restore on every process,
  each failure is logged (step and error) and the previous committed step is tried.
* **A failed write stops the run.** A write error on any process (a TensorStore write of its
  shards, the primary's finalize, or ``save`` itself) is published to all processes; at the
  next step boundary every process stops with the restartable exit code, and a process stuck
  where no boundary comes (an Orbax barrier the failed peer never joins) exits by itself
  after a grace period. Without this, Orbax's peers wait out a 300 s barrier or 1200 s
  async-save deadline.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from workload.config import Config
from workload.metrics import Metrics, say
from workload.peers import POLL_S, Peers
from workload.private_seam import array_metadata_store, serialization_types, type_handler_registry
from xrun_contract import CKPT_WRITE_FAILED_LINE, RESTARTABLE_EXIT_CODE
from xrun_contract.checkpoints import COMMITTED, EMPTY, step_folders, step_state, uses_commit_file
from xrun_contract.storage import Storage

FAILED, WRITING, IDLE = "failed:", "writing", "idle"
# This process cannot reach storage now (the watcher's last probe failed or is stale): a save
# that comes due is deferred, as behind a slow save, instead of blocking in Orbax's calls.
STORAGE_OUT = "storage-out:"
PROBE_SECONDS = 1.0  # how often the watcher probes storage (one small read)
PROBE_TIMEOUT = 1.0  # the probe's own deadline: an outage is seen within about this
PROBE_STALE = 5.0  # a probe older than this (a probe stuck in its call) counts as failed

# Write settings, from bench/profile_checkpoint.py (bench/RESULTS.md): zstd on the chunks
# (Orbax's default, level 3) made the write CPU-bound at 0.57x a plain write on 2 cores and
# buys ~7% on float weights; off, 1.4x. OCDBT data files of 64 MiB instead of the 2 GB
# default let a restore read several files at once (restore 0.23x -> 0.77x a plain read).
# A restore reads whatever settings a checkpoint was written with.
USE_COMPRESSION = False
OCDBT_TARGET_DATA_FILE_SIZE = 64 << 20


class CheckpointWriteFailed(RuntimeError):
    """A checkpoint write failed on some process; every process stops with the restartable
    exit code, so that the JobSet restart resumes from the last committed step."""


def first_line(error: BaseException | str) -> str:
    """One short line for a log: the root cause of an exception chain (Orbax wraps
    TensorStore's DATA_LOSS / NOT_FOUND in an Exception whose text is a whole spec)."""
    if not isinstance(error, str):
        while error.__cause__ is not None:
            error = error.__cause__
        error = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    return " ".join(error.split())[:300]


class _WatchedFuture:
    """An Orbax commit future that reports its exception before the async thread sees it
    (orbax ``async_checkpointer._AsyncManager._thread_func`` only logs it and keeps it for a
    later ``check_for_errors``, which the manager's finalize thread consumes first)."""

    def __init__(self, inner: Any, on_error: Callable[[BaseException], None]):
        self._inner, self._on_error = inner, on_error

    def result(self, timeout: float | None = None) -> Any:
        try:
            return self._inner.result(timeout=timeout)
        except TimeoutError:
            raise
        except BaseException as e:
            self._on_error(e)
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _ReportsWriteErrors:
    """Mixin for an Orbax CheckpointHandler: its writes (commit futures) and its finalize
    (the primary's OCDBT manifest merge) report failures to ``on_error`` (set per instance)."""

    on_error: Callable[[BaseException], None] = staticmethod(lambda e: None)

    async def async_save(self, *args: Any, **kwargs: Any) -> Any:
        try:
            futures = await super().async_save(*args, **kwargs)  # type: ignore[misc]
        except BaseException as e:
            self.on_error(e)
            raise
        return [_WatchedFuture(f, self.on_error) for f in futures] if futures else futures

    def finalize(self, directory: Any) -> None:
        try:
            super().finalize(directory)  # type: ignore[misc]
        except BaseException as e:
            self.on_error(e)
            raise


class WatchedPyTreeHandler(_ReportsWriteErrors, ocp.PyTreeCheckpointHandler):
    pass


class WatchedJsonHandler(_ReportsWriteErrors, ocp.JsonCheckpointHandler):
    pass


# CompositeCheckpointHandler finds an item's handler by its args' registered class
# (orbax checkpoint_args.py get_registered_args_cls: exact class, save and restore args both
# registered): args of their own for the watched ones.
@ocp.checkpoint_args.register_with_handler(WatchedPyTreeHandler, for_save=True)
class StateSave(ocp.args.PyTreeSave):
    pass


@ocp.checkpoint_args.register_with_handler(WatchedJsonHandler, for_save=True)
class DataSave(ocp.args.JsonSave):
    pass


@ocp.checkpoint_args.register_with_handler(WatchedPyTreeHandler, for_restore=True)
class StateRestore(ocp.args.PyTreeRestore):
    pass


@ocp.checkpoint_args.register_with_handler(WatchedJsonHandler, for_restore=True)
class DataRestore(ocp.args.JsonRestore):
    pass


def _watched_temporary_path(base: type, on_error: Callable[[BaseException], None]) -> type:
    """Orbax's TemporaryPath class for this storage whose ``create`` (the step folder, made
    by the primary in a background thread) and ``finalize`` (commit file or rename, on the
    primary) report failures; ``CheckpointManagerOptions.temporary_path_class``.

    ``create`` failing (storage answering 503 past the client's retries) was silent: Orbax's
    signalling thread only logs it, and every process's writer then waits for the "folder
    made" signal for ``multihost.coordination_timeout()``, 300 s, before failing the save.
    Reported, every process stops at its next step boundary and the restart resumes from the
    last committed step within seconds of storage answering."""

    class Watched(base):
        async def create(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return await super().create(*args, **kwargs)
            except BaseException as e:
                on_error(e)
                raise

        async def finalize(self, *args: Any, **kwargs: Any) -> None:
            try:
                await super().finalize(*args, **kwargs)
            except BaseException as e:
                on_error(e)
                raise

    Watched.__name__ = Watched.__qualname__ = f"Watched{base.__name__}"
    return Watched


# What a staged save leaves free on each device beside the train step's own need (its
# temporaries, from the compiled step's memory analysis): allocator slack and fragmentation.
STAGING_MARGIN_BYTES = 1 << 30


def _keystr(path: Any) -> str:
    return jax.tree_util.keystr(tuple(path))


class _StagedInBackground:
    """Orbax's per-array transfer priority (``SerializationStatusCallback``): the staged
    copies go to the host in Orbax's background thread, every other array before ``save``
    returns (the default, ``SYNCHRONOUS``: the next step donates those)."""

    def __init__(self) -> None:
        self.keys: frozenset[str] = frozenset()
        self.background: list[str] = []  # keys transferred in the background, last save

    def key_priority(self, keypath: Any) -> Any:
        priority = serialization_types.TransferPriority
        if _keystr(keypath) in self.keys:
            self.background.append(_keystr(keypath))
            return priority.ASYNCHRONOUS_DEPRIORITIZED
        return priority.SYNCHRONOUS

    def on_transfer_start(self, keypath: Any) -> None:
        pass

    def on_transfer_end(self, keypath: Any) -> None:
        pass

    def on_write_start(self, keypath: Any) -> None:
        pass

    def on_write_end(self, keypath: Any) -> None:
        pass


def per_device_bytes(a: Any) -> int:
    """Bytes of ``a`` on each device that holds a shard (its largest shard)."""
    return int(np.prod(a.sharding.shard_shape(a.shape))) * a.dtype.itemsize


def choose_staged(state: Any, budget: int) -> frozenset[str]:
    """Keys of the arrays to copy in device memory at a save: the largest first while they
    fit in ``budget`` bytes per device; never the scalars (the step, Adam's count), which
    cost nothing to copy to the host at once. The same on every process (global shapes and
    shardings, an agreed budget)."""
    leaves = sorted(((per_device_bytes(a), _keystr(p)) for p, a in
                     jax.tree_util.tree_flatten_with_path(state)[0] if a.ndim),
                    key=lambda t: (-t[0], t[1]))
    chosen, used = [], 0
    for size, key in leaves:
        if used + size <= budget:
            chosen.append(key)
            used += size
    return frozenset(chosen)


@jax.jit
def _device_copy(arrays: list[Any]) -> list[Any]:
    """New buffers with the same values and shardings (``jnp.copy`` is a real copy: jit
    forwards an input returned as it is)."""
    return [jnp.copy(a) for a in arrays]


def copy_to_host(state: Any, skip: frozenset[str], threads: int) -> int:
    """Copy the arrays of ``state`` not in ``skip`` to the host from ``threads`` threads;
    bytes copied. JAX keeps each shard's host value on the shard's array
    (``ArrayImpl._npy_value``) and ``addressable_shards`` hands out those same arrays, so
    Orbax's own ``np.asarray`` of each shard returns at once. Only arrays with one copy of
    each shard: Orbax slices replicated shards across replicas (replica-parallel), and a
    slice is a new array that no cache serves."""
    shards: list[Any] = []
    for path, a in jax.tree_util.tree_flatten_with_path(state)[0]:
        if _keystr(path) in skip or not isinstance(a, jax.Array) or a.is_deleted():
            continue
        if int(np.prod(a.sharding.shard_shape(a.shape))) * len(a.sharding.device_set) != a.size:
            continue  # replicated: Orbax's replica-parallel path
        shards.extend(s.data for s in a.addressable_shards)
    if not shards:
        return 0
    # No copy_to_host_async() on all of them first, as Orbax does: on a v5e chip (bench_tpu.py,
    # 63c7ce4) that queued the transfers one behind another and the threads only waited:
    # 5.67 s for 6.9 GiB, where each thread starting its own transfer took 1.90 s.
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="xrun-d2h") as pool:
        return sum(int(h.nbytes) for h in pool.map(np.asarray, shards))


class Staging:
    """A save's copy of part of the train state in device memory (see the module's doc).

    ``budget`` is called once, at the first save (after a step ran, so the device's memory in
    use is the steady state's): the bytes per device the copies may take. The processes
    agree on the smallest."""

    def __init__(self, budget: Callable[[], int]):
        self.budget_fn = budget
        self.budget: int | None = None
        self.keys: frozenset[str] = frozenset()
        self.staged_bytes = 0  # per device, last save
        self.copies: list[Any] = []

    def plan(self, state: Any, peers: Peers) -> None:
        if self.budget is None:
            mine = max(0, int(self.budget_fn()))
            self.budget = min(int(v) for v in peers.gather(str(mine)))
            self.keys = choose_staged(state, self.budget)

    def stage(self, state: Any) -> Any:
        """``state`` with the chosen arrays replaced by fresh copies (dispatched, not waited
        for: the next step that donates the originals runs after the copy read them)."""
        flat, treedef = jax.tree_util.tree_flatten_with_path(state)
        index = [i for i, (p, _) in enumerate(flat) if _keystr(p) in self.keys]
        leaves = [a for _, a in flat]
        if index:
            self.copies = _device_copy([leaves[i] for i in index])
            for i, c in zip(index, self.copies, strict=True):
                leaves[i] = c
        self.staged_bytes = sum(per_device_bytes(leaves[i]) for i in index)
        return jax.tree_util.tree_unflatten(treedef, leaves)

    def release(self) -> None:
        """After the save committed: free the copies' device memory now (Orbax may keep a
        reference to what it saved until its next save)."""
        for c in self.copies:
            if not c.is_deleted():
                c.delete()
        self.copies = []


class Checkpoints:
    """Save/restore for the training loop. Every process makes the same calls in the same
    order: ``restore_latest`` once, ``after_step`` at every step boundary, ``finish`` at the
    end (last step or SIGTERM), then ``close``."""

    def __init__(self, storage: Storage, key: str, cfg: Config, metrics: Metrics, *,
                 exit_code: int = RESTARTABLE_EXIT_CODE, peers: Peers | None = None,
                 grace_s: float = 5.0, poll_s: float = 0.05,
                 staging_budget: Callable[[], int] | None = None):
        self.storage, self.key, self.directory = storage, key, storage.url(key)
        self.cfg, self.metrics, self.exit_code = cfg, metrics, exit_code
        self.every = cfg.checkpoint_every
        self.peers = peers or Peers()
        self.primary = self.peers.process_id == 0
        self.grace_s, self.poll_s = grace_s, poll_s
        if os.environ.get("STORAGE_EMULATOR_HOST"):
            # gcsfs warns on every call that the emulator gave it no credentials.
            logging.getLogger("gcsfs").setLevel(logging.ERROR)
        self.manager: ocp.CheckpointManager | None = None
        # None: every array is copied to the host before save returns (Orbax's default).
        self.staging = Staging(staging_budget) if staging_budget is not None else None
        self._priority = _StagedInBackground()
        self.pending: tuple[int, float] | None = None  # (step, save start) not yet committed
        self.deferred_at: int | None = None  # step at which a due save was deferred
        self.next_due = self.every
        self.write_steps = 0  # steps the last save took to commit (0: within one step)
        self.saved_steps: list[int] = []
        self.sync_s = 0.0  # agreement rounds since the last commit
        self.copy_s = 0.0  # the last save's staging and host copy, before Orbax's save()
        self.restored_step: int | None = None
        self.failure: str | None = None  # why the run stops (set before CheckpointWriteFailed)
        self._errors: list[str] = []  # this process's write failures, from any thread
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._remove_empty_steps()
        self._watch = self.peers.watch(self._peer_failed, self._stop)
        # Storage, seen from a thread of its own so that training never waits on it: is it
        # answering (a probe every PROBE_SECONDS), and did the pending save commit.
        self._probe_ok_at: float | None = time.monotonic()
        self._probe_error = ""
        self._check_step: int | None = None  # a save whose commit the watcher is to check
        self._commit_seen: dict[int, str] = {}  # step -> its state, as the watcher read it
        self._wake = threading.Event()
        self._storage_watch = threading.Thread(target=self._watch_storage, daemon=True,
                                               name="xrun-ckpt-storage")
        self._storage_watch.start()

    # -----------------------------------------------------------------------------------
    # Restore

    def _remove_empty_steps(self) -> None:
        """An empty ``<step>/`` is not committed (xrun_contract.checkpoints) but Orbax's
        manager would list it as a step and refuse to save that step again: remove it."""
        if self.primary:
            for folder in step_folders(self.storage, self.key):
                if folder.state == EMPTY:
                    say(f"checkpoint step {folder.step}: empty folder {folder.key} removed "
                        f"(not a committed checkpoint)")
                    self.storage.delete_prefix(folder.key)
                    path = self.storage.url(folder.key)
                    if os.path.isdir(path):
                        os.rmdir(path)
        self.peers.gather("cleaned")  # nobody lists the folder before the primary is done

    def _restore_step(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """Through the item handlers, without ``CheckpointManager.restore``: its trailing
        barrier (orbax ``Checkpointer.restore`` -> ``sync_global_processes``) is a device
        collective that a process whose restore raised never joins."""
        path = epath.Path(self.directory) / str(step)
        state_handler = ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True)
        try:
            state = state_handler.restore(path / "state", args=ocp.args.PyTreeRestore(
                item=abstract_state,
                restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_state)))
            state = jax.block_until_ready(state)
        finally:
            state_handler.close()
        data = ocp.JsonCheckpointHandler().restore(path / "data", args=ocp.args.JsonRestore())
        return state, dict(data)

    def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict[str, Any]] | None:
        """(step, state, data item) of the newest committed step that restores on every
        process, falling back step by step; None when nothing is committed."""
        listing = json.dumps([f.step for f in step_folders(self.storage, self.key)
                              if f.state == COMMITTED]) if self.primary else ""
        candidates: list[int] = json.loads(self.peers.gather(listing)[0])
        failed: list[int] = []
        result = None
        for step in reversed(candidates):
            try:
                state, data = self._restore_step(step, abstract_state)
                mine = "ok"
            except Exception as e:  # noqa: BLE001 - every failure falls back, loudly
                state, data, mine = None, {}, FAILED + first_line(e)
                # One bounded line: an Orbax error's repr can hold a whole TensorStore spec
                # (40,000 characters on one line of the host's log).
                print(f"checkpoint restore of step {step} failed on process "
                      f"{self.peers.process_id}: {first_line(e)}", file=sys.stderr, flush=True)
            everyone = self.peers.gather(mine)
            errors = [(p, v[len(FAILED):]) for p, v in enumerate(everyone) if v != "ok"]
            if not errors:
                self.metrics.checkpoint("restored", step)
                result = (step, state, data)
                self.restored_step = step
                break
            error = "; ".join(f"process {p}: {msg}" for p, msg in errors)
            if self.primary:
                self.metrics.checkpoint("restore_failed", step, error=error)
            elif mine != "ok":
                say(f"checkpoint restore failed: step {step}, error: process "
                    f"{self.peers.process_id}: {mine[len(FAILED):]}")
            failed.append(step)
        if candidates and result is None:
            raise RuntimeError(f"no committed checkpoint restores (tried steps "
                               f"{sorted(failed, reverse=True)} under {self.directory})")
        if failed:
            self._set_aside(failed)
        if result is not None and self.every > 0:  # saves stay on multiples of the interval
            self.next_due = (result[0] // self.every + 1) * self.every
        self._open_manager()
        return result

    def _set_aside(self, steps: list[int]) -> None:
        """Unrestorable steps newer than the restored one would collide with the saves of the
        same steps to come: renamed out of Orbax's sight (local) or deleted (gs://)."""
        if self.primary:
            for step in steps:
                key = f"{self.key}/{step}"
                if uses_commit_file(self.storage):
                    self.storage.delete_prefix(key)
                    say(f"checkpoint step {step}: unrestorable, deleted")
                else:
                    aside = f"{self.storage.url(key)}.xrun-unrestorable-{int(time.time())}"
                    os.rename(self.storage.url(key), aside)
                    say(f"checkpoint step {step}: unrestorable, moved to {aside}")
        self.peers.gather("set-aside")

    def _open_manager(self) -> None:
        options = ocp.CheckpointManagerOptions(
            max_to_keep=self.cfg.max_to_keep,
            enable_async_checkpointing=self.cfg.async_checkpoint,
            create=True,
            cleanup_tmp_directories=True,  # leftovers of a killed save are removed, not read
            # No storage call in save()'s blocking part: the primary's existence check (and
            # rmtree) of the step folder blocked training through a whole outage (34 s for a
            # 20 s outage, bench_ckpt_stall.py --outage-s 20). A step folder is never there:
            # empty and unrestorable ones are removed before the manager opens.
            file_options=ocp.options.FileOptions(skip_sync_file_validations=True),
            temporary_path_class=_watched_temporary_path(
                ocp.path.atomicity.CommitFileTemporaryPath if uses_commit_file(self.storage)
                else ocp.path.atomicity.AtomicRenameTemporaryPath, self._local_error),
        )
        # Orbax's default handlers, but jax.Array's with the staged arrays' priority; the
        # transfer limit (any) is what makes Orbax ask for priorities at all
        # (orbax jax_array_handlers._serialize_arrays).
        registry = ocp.type_handlers.create_type_handler_registry(
            *[(t, h) for t, h in type_handler_registry._DEFAULT_TYPE_HANDLERS if t is not jax.Array],
            (jax.Array, ocp.type_handlers.ArrayHandler(
                array_metadata_store=array_metadata_store.Store(), callback=self._priority)))
        state_handler = WatchedPyTreeHandler(use_ocdbt=True, use_zarr3=True,
                                             use_compression=USE_COMPRESSION,
                                             type_handler_registry=registry,
                                             save_device_host_concurrent_gb=1 << 20)
        data_handler = WatchedJsonHandler()
        state_handler.on_error = data_handler.on_error = self._local_error
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={"state": state_handler, "data": data_handler},
        )

    # -----------------------------------------------------------------------------------
    # Save

    # -----------------------------------------------------------------------------------
    # Storage, from the watcher thread

    def _probe_storage(self) -> Storage:
        """The storage, with a short per-call deadline for the watcher's probes."""
        from xrun_contract.storage import open_storage

        root = self.storage.root
        return open_storage(root, timeout=PROBE_TIMEOUT) if root.startswith("gs://") else self.storage

    def _watch_storage(self) -> None:
        probe, key = self._probe_storage(), f"{self.key}/.xrun-probe"
        while not self._stop.is_set():
            check = self._check_step
            try:
                probe.read_bytes(key)  # absent is an answer: storage is there
                if check is not None and check not in self._commit_seen:
                    self._commit_seen[check] = step_state(probe, f"{self.key}/{check}")
                self._probe_ok_at, self._probe_error = time.monotonic(), ""
            except Exception as e:  # noqa: BLE001 - any failure: storage is out for now
                self._probe_ok_at, self._probe_error = None, first_line(e)
            self._wake.wait(PROBE_SECONDS)
            self._wake.clear()

    def _storage_out(self) -> str:
        """Why storage counts as out for this process now, or ""."""
        at = self._probe_ok_at
        if at is None:
            return self._probe_error or "storage does not answer"
        if time.monotonic() - at > PROBE_STALE:
            return f"no answer from storage for {time.monotonic() - at:.0f}s"
        return ""

    def after_step(self, step: int, state: Any, data: Callable[[], dict[str, Any]],
                   force: bool = False, ready: Callable[[], Any] | None = None) -> float:
        """At a step boundary: notice commits, save when due (``force``: the last step) and
        every process has finished the previous save, else defer. ``ready``: waits for the
        step that made ``state`` (the loop runs a step ahead of its results), called before a
        save starts, so that the blocked time is the save's alone. Returns the seconds the
        save held training (the device-to-host copy; 0 without a save): the step record's
        ``checkpoint_blocked_s``, which readers use to tell stalled steps from steady ones.
        The agreement rounds (about a millisecond, only while a save is in flight or due)
        are summed per save into the "committed" event's ``sync_s``.
        Raises CheckpointWriteFailed."""
        due = force or step >= self.next_due or self.deferred_at is not None
        if self.pending is None and not due and not self._errors:
            return 0.0  # nothing written, nothing due: no round, no RPC
        t = time.perf_counter()
        values = self._gather(step)
        self.sync_s += time.perf_counter() - t
        if self.pending is not None and all(v in (IDLE, STORAGE_OUT) or v.startswith(STORAGE_OUT)
                                            for v in values) and self._all_committed(values):
            self._committed(step)
        out = [v[len(STORAGE_OUT):] for v in values if v.startswith(STORAGE_OUT)]
        if due and self.pending is None and not out:
            if ready is not None:
                ready()
            return self._save(step, state, data())
        if due and self.deferred_at is None:
            self.deferred_at = step
            if self.pending is not None:
                self.metrics.checkpoint("deferred", step, previous=self.pending[0])
            else:  # storage is out somewhere: Orbax's save would block on it
                self.metrics.checkpoint("deferred", step, error=out[0] or "storage unavailable")
        return 0.0

    def _all_committed(self, values: list[str]) -> bool:
        """A pending save is committed when no process still writes it (a process whose
        storage is out has finished its write, or it would say writing)."""
        return not any(v == WRITING for v in values)

    def finish(self, step: int, state: Any, data: Callable[[], dict[str, Any]]) -> float:
        """Last step or SIGTERM: save ``step`` unless saved, and wait until it committed.
        Returns the seconds waited (recorded as an "exit_wait" event)."""
        t = time.perf_counter()
        blocked = 0.0
        # Not saved in this attempt, and not the step it restored (a rerun of a finished run).
        if step not in self.saved_steps and step != self.restored_step:
            self._wait_idle(step)
            blocked = self._save(step, state, data())
        self._wait_idle(step)
        waited = time.perf_counter() - t - blocked
        self.metrics.checkpoint("exit_wait", step, waited)
        return waited

    def _wait_idle(self, step: int) -> None:
        """Until no save is in flight and every process reaches storage (an exit save
        waits out an outage)."""
        while not self._round(step):
            time.sleep(self.poll_s)
        if self.pending is not None:
            self._committed(step)

    def _save(self, step: int, state: Any, data: dict[str, Any]) -> float:
        assert self.manager is not None, "restore_latest() opens the manager"
        self.metrics.checkpoint("started", step)
        if self.staging is not None:
            self.staging.plan(state, self.peers)  # once: an agreement round, no device work
            self._priority.keys, self._priority.background = self.staging.keys, []
        start_wall, t = time.time(), time.perf_counter()
        try:
            if self.staging is not None:
                state = self.staging.stage(state)
            if self.cfg.checkpoint_copy_threads:
                copy_to_host(state, self._priority.keys, self.cfg.checkpoint_copy_threads)
            self.copy_s = time.perf_counter() - t  # the part of ``blocked`` before Orbax's
            self.manager.save(step, force=True, args=ocp.args.Composite(
                state=StateSave(state, ocdbt_target_data_file_size=OCDBT_TARGET_DATA_FILE_SIZE),
                data=DataSave(data)))
        except Exception as e:  # noqa: BLE001 - every process hears of it at the next round
            # No round here: the others returned from save() and hold their next round at
            # the next step boundary; so does this process (it has an error to report).
            self._local_error(e)
            return time.perf_counter() - t
        blocked = time.perf_counter() - t
        self.metrics.checkpoint("blocked", step, blocked, copy_s=round(self.copy_s, 4))
        self.pending, self.deferred_at = (step, start_wall), None
        self.saved_steps.append(step)
        self.next_due = step + max(self.every, self.write_steps)
        return blocked

    def _committed(self, step: int) -> None:
        saved, start = self.pending  # type: ignore[misc]
        self.pending = None
        if self.staging is not None:
            self.staging.release()
        # The save's host copy of the state (6.9 GB for the 618M config) is garbage now, held
        # in reference cycles of the write (asyncio tasks, frames): the cyclic collector frees
        # it when an allocation next sets off a full collection, which was the next save's
        # copy. On a v5e host that free took 0.5-0.8 s inside the next save's blocked time
        # (host memory sampled: 18.3 -> 11.5 GB as it began; the save blocked 2.52 s where
        # one that began with it freed blocked 1.69 s). Collected here instead, at the step
        # boundary that noticed the commit, while the steps in flight run.
        gc.collect()
        self.write_steps = step - saved
        self.metrics.checkpoint("committed", saved, time.time() - start, sync_s=self.sync_s)
        self.sync_s = 0.0

    # -----------------------------------------------------------------------------------
    # Agreement and failures

    def _local_status(self) -> str:
        """Touches no storage: the watcher thread reads it (the commit check, the probe)."""
        with self._lock:
            if self._errors:
                return FAILED + self._errors[0]
        out = self._storage_out()
        if self.manager is None or self.pending is None:
            return STORAGE_OUT + out if out else IDLE
        if self.manager.is_saving_in_progress():
            return WRITING
        try:
            self.manager.check_for_errors()
        except Exception as e:  # noqa: BLE001
            self._local_error(e)
            return FAILED + first_line(e)
        step = self.pending[0]
        seen = self._commit_seen.get(step)
        if seen is None:  # the watcher reads the step's state next (at once)
            if self._check_step != step:
                self._check_step = step
                self._wake.set()
            return WRITING
        if seen != COMMITTED:
            message = f"step {step} finished writing but is not committed"
            self._local_error(message)
            return FAILED + message
        return STORAGE_OUT + out if out else IDLE

    def _gather(self, step: int) -> list[str]:
        """One agreement round: every process's status, the same list on each.
        Raises CheckpointWriteFailed if any process reports a failed write."""
        values = self.peers.gather(self._local_status())
        failed = [(p, v[len(FAILED):]) for p, v in enumerate(values) if v.startswith(FAILED)]
        if failed:
            self._stop_run(step, failed)
        return values

    def _round(self, step: int) -> bool:
        """True when every process is idle (no save in flight) and reaches storage."""
        return all(v == IDLE for v in self._gather(step))

    def _stop_run(self, step: int, failed: list[tuple[int, str]]) -> None:
        at = self.pending[0] if self.pending else step
        for process, error in failed:
            if self.primary:
                self.metrics.checkpoint("write_failed", at, error=error, process=process)
        self.failure = (f"checkpoint write failed (step {at}, process "
                        f"{', '.join(str(p) for p, _ in failed)}): {failed[0][1]}")
        raise CheckpointWriteFailed(self.failure)

    def _local_error(self, error: BaseException | str) -> None:
        """A write of this process failed (any thread): remember it, tell every process."""
        message = first_line(error)
        with self._lock:
            first = not self._errors
            self._errors.append(message)
        if first:
            step = self.pending[0] if self.pending else -1
            if not self.primary:  # the primary logs it with the round's result
                say(CKPT_WRITE_FAILED_LINE.format(step=step, process=self.peers.process_id,
                                                  error=message))
            self.peers.publish_failure(f"process {self.peers.process_id}: {message}")

    def _peer_failed(self, message: str) -> None:
        """Watch thread: some process's write failed. The main thread normally stops at the
        next step boundary; if it is stuck (an Orbax barrier a dead peer never joins), exit
        here after the grace period with the restartable code."""
        if self._stop.wait(self.grace_s):
            return
        reason = f"checkpoint write failed elsewhere, stuck for {self.grace_s:.0f}s: {message}"
        print(f"xrun: {reason}; exiting {self.exit_code}", file=sys.stderr, flush=True)
        self.metrics.end_and_exit(self.exit_code, reason)

    def close(self) -> None:
        """After ``finish``: every save committed, nothing left to wait for."""
        self._stop.set()
        self._wake.set()
        if self.manager is not None:
            self.manager.close()
        if self._watch is not None:
            self._watch.join(timeout=2 * POLL_S)  # out of its long poll (train.main says why)
