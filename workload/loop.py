"""The training loop: steps dispatched ahead of the one whose results are read, each step's
seconds as the device ran it, checkpoints at step boundaries."""

from __future__ import annotations

import gc
import math
import os
import queue
import threading
import time
from collections import deque
from typing import Any

from workload.config import Config, step_flops
from workload.distributed import Cluster, make_mesh
from workload.lifecycle import (
    DeferredCheckpoints,
    Preemption,
    agreed_latest_step,
    checkpoint_write_failed,
    fail_at_step,
    open_checkpoints,
    report_memory,
    versions,
)
from workload.metrics import Metrics, say, update_run_json
from workload.profiling import StepProfile
from workload.program import (
    Program,
    StepSwitch,
    executables_for,
    optimized_delay,
    timed,
    wants_quick_compile,
)
from xrun_contract import Env, Layout
from xrun_contract.storage import Storage

# Steps dispatched ahead of the one whose results the loop reads: host stalls shorter than
# this many steps cost no device time. 2: on a v5e chip a save's writer held the loop
# 0.4-0.9 s at a time (0.24 s steps), and one step ahead left the steps while a save was
# written 1.12x steady (bench_tpu.py --part startup, SAVES_STEPS=120).
STEPS_AHEAD = 2
# How long the loop waits for a StepClock's stamp of a step whose results it has read (the
# stamp follows at once; a clock that never stamps leaves the read's time).
READY_TIMEOUT_S = 5.0


class InFlight:
    """A dispatched train step: its outputs, read once (``results``), when the device could
    begin it (its dispatch), when the device finished it (``ready``, set by a StepClock),
    when its results were read, and the seconds a save of it blocked training."""

    def __init__(self, step: int, began: float, quick: bool = False):
        self.step, self.quick = step, quick
        self.out: Any = None
        self.began, self.done, self.blocked = began, 0.0, 0.0
        self.ready_at = math.nan  # perf_counter() when its outputs were ready on the device
        self.ready = threading.Event()
        self._results: Any = None

    def results(self) -> Any:
        if self._results is None:
            self._results = step_results(self.out)
            self.done = time.perf_counter()
        return self._results

    def finished(self, timeout: float, delayed: bool = False) -> float:
        """When the device finished the step (perf_counter), after ``results()``: the clock's
        stamp, never later than the read that saw the results (a stamp taken late because
        the clock's thread waited for the GIL) unless the clock ``delayed`` it on purpose;
        the read's time if the clock gave none."""
        if not self.ready.wait(timeout) or math.isnan(self.ready_at):
            return self.done
        return self.ready_at if delayed else min(self.ready_at, self.done)


class StepClock:
    """Stamps each dispatched step when its outputs become ready on the device, from a thread
    that waits on them in dispatch order (``block_until_ready`` releases the GIL).

    Why: the loop reads a step's results STEPS_AHEAD steps after dispatching it, whenever the
    host gets to it. Timing steps by those reads moved the time of a late read from one step
    to the next: on the README's run (2 hosts x 2 CPU devices) about one step in ten showed
    ~0.005 s against ~0.2 s for its neighbours, and goodput's best rate, a low percentile of
    the steps, followed those. A step's seconds now run from when the device could begin it
    (the previous step finished, or its dispatch if later) to this stamp.

    ``delay`` (seconds, XRUN_TEST_STEP_DELAY): each step is stamped that much later than the
    previous stamp or its own readiness, as if the device took that much longer a step."""

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self._queue: queue.SimpleQueue[InFlight | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="xrun-step-clock", daemon=True)
        self._thread.start()

    def watch(self, flight: InFlight) -> None:
        self._queue.put(flight)

    def close(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        import jax

        while (f := self._queue.get()) is not None:
            try:
                jax.block_until_ready(f.out)
                if self.delay:
                    time.sleep(self.delay)
                f.ready_at = time.perf_counter()
            except Exception:  # noqa: BLE001, S110 - the loop's own read raises the step's error
                pass
            finally:
                f.ready.set()


def step_results(out: Any) -> Any:
    """``jax.device_get(out)``, but a device's failed step raises at once.

    On CPU with several processes and several devices per process (the local backend: one
    gloo rank per device), every device's shard is watched (every 2 ms) and the first one
    that finished with an error raises it, so the process exits restartable as for any lost
    peer (``workload.failures``). ``device_get`` reads one shard first: a fresh clone's test
    run once had the survivor of a killed peer blocked there for 30 s. The likely cause: the
    peer's death failed one local device's collective while the other local device stayed in
    the same collective, waiting for a message from the failed one (gloo's own timeout is 30
    minutes).
    """
    import jax

    if jax.default_backend() != "cpu" or jax.process_count() == 1:  # one process: no peers
        return jax.device_get(out)
    shards = [s.data for leaf in jax.tree.leaves(out) for s in leaf.addressable_shards]
    if len({d for a in shards for d in a.devices()}) > 1:
        while not all(a.is_ready() for a in shards):
            for a in shards:
                if a.is_ready():
                    a.block_until_ready()  # raises the error its device's step ended with
            time.sleep(0.002)
    return jax.device_get(out)


def train(cfg: Config, cluster: Cluster, preemption: Preemption, metrics: Metrics,
          storage: Storage | None, run: str | None,
          run_info: dict[str, Any]) -> tuple[int, str, bool]:
    """The training loop; returns (exit code, reason, whether every process stops with us)."""
    import jax

    from workload import data

    mesh = make_mesh(cluster.num_slices if cluster.from_xrun else None)
    devices = jax.device_count()
    global_batch = cfg.batch_size(devices)
    if global_batch % devices:
        raise ValueError(f"global batch {global_batch} does not split over {devices} devices")
    info = versions(cfg, mesh)
    metrics.header(info, cfg.to_dict())
    run_info.update(versions=info, config=cfg.to_dict(), mesh=dict(mesh.shape),
                    accelerator=os.environ.get(Env.ACCELERATOR) or jax.devices()[0].device_kind,
                    devices=devices, processes=jax.process_count())
    if storage is not None and run and metrics.primary:
        update_run_json(storage, run, **run_info)

    program = Program(cfg, mesh, global_batch, compile_now=False,
                      executables=executables_for(cfg, mesh, global_batch))

    def announce_choice() -> None:
        """remat=auto: what it chose and why, in the log and run.json (once compiled: a
        search runs in the compile thread)."""
        if program.choice is None:
            return
        if metrics.primary:
            say(program.choice.line())
        run_info["autotune"] = program.choice.to_dict()
        if storage is not None and run and metrics.primary:
            update_run_json(storage, run, autotune=run_info["autotune"])
    # Compile in a thread while the checkpoint manager opens and the state restores: XLA
    # compilation releases the GIL, and both take seconds to minutes at scale.
    from concurrent.futures import ThreadPoolExecutor, wait

    # With quick_compile, a quick executable of the step compiles first and runs the first
    # steps until the optimized one is ready on every process (StepSwitch).
    quick = wants_quick_compile(cfg)
    loaded = program.train_step is not None
    compiler = ThreadPoolExecutor(2 if quick else 1, thread_name_prefix="xrun-compile")
    hold = optimized_delay(cluster.process_id) if quick else 0.0
    quick_compiled = (compiler.submit(timed, program.compile_quick) if quick and not loaded
                      else None)

    def optimize() -> Any:
        # After the quick one: compiles beside each other slow each other (on a v5e host the
        # quick one took 14.9 s beside the optimized one and init's, 8.1 s alone), and the
        # first step waits for the quick one. The optimized one is ready about as late
        # either way (it is the longest), and the steps run meanwhile are as many.
        if quick_compiled is not None:
            wait([quick_compiled])
        time.sleep(hold)
        exe = program.compile()
        announce_choice()
        return exe

    compiled = compiler.submit(timed, optimize)
    compiler.shutdown(wait=False)
    flops = step_flops(cfg, global_batch, devices)
    metrics.params(program.num_params)
    metrics.flops(**flops)

    ckpt: Any = None
    deferred: DeferredCheckpoints | None = None
    write_failed: tuple[type[BaseException], ...] = ()  # caught once Orbax is imported
    latest = None
    if storage is not None and run and cfg.checkpoint_every > 0:
        # The newest committed step, as process 0 lists it (every process decides alike).
        latest = agreed_latest_step(storage, Layout.checkpoints(run))
        if latest is None:  # nothing to restore: no Orbax before the first step
            deferred = DeferredCheckpoints(storage, run, cfg, metrics, cluster, program)
        else:
            ckpt = open_checkpoints(storage, run, cfg, metrics, cluster, program)
            write_failed = (checkpoint_write_failed(),)
    source = data.make_source(cfg.data, cfg.data_dtype, cfg.seed, cfg.seq_len, cfg.vocab_size)
    metrics.phase("checkpoint_manager", step=latest)
    # The newest committed step that restores on every process (older ones if it does not).
    restored = ckpt.restore_latest(program.abstract_state) if ckpt else None
    if restored is not None:
        start, state, position = restored[0], restored[1], int(restored[2]["position"])
    else:
        state, start, position = program.init(), 0, 0
    metrics.phase("restored" if restored is not None else "initialized",
                  step=start if restored is not None else None)
    switch = StepSwitch(program, compiled, quick_compiled, quick)
    began, ended = switch.first_ready()  # raises what the compilation raised
    # The thread's own span (it overlaps), and where the executables came from.
    metrics.phase("compiled", at=ended, began=began,
                  source="quick" if switch.quick else program.source)

    fail = fail_at_step(cluster)
    delay = float(os.environ.get(Env.TEST_STEP_DELAY, "0") or 0)
    restart_every = int(os.environ.get(Env.TEST_RESTART_EVERY, "0") or 0)  # the soak's restarts
    tokens_per_step = global_batch * cfg.seq_len

    def make_batch(pos: int):
        batch = data.make_batch(source, pos, global_batch, cfg.seq_len, program.batch_sharding)
        if isinstance(source, data.TokenFile):  # this process's reads: its own rows only
            run_info["data_bytes_read"] = source.bytes_read
        return batch

    def position_data(step: int):
        return lambda: {"position": position, "step": step, "global_batch": global_batch,
                        "source": cfg.data, "seed": cfg.seed}

    batch = make_batch(position)
    # What startup made (modules, traced programs, JAX's caches: ~180k objects for the 618M
    # config) lives as long as the process; frozen, Python's cyclic collector stops walking
    # it. Unfrozen, each full collection held the GIL 0.2-0.8 s, and the Orbax writer's
    # allocations set them off during every save: steps waited that long for the GIL
    # (bench_tpu.py on a v5e chip: steps 1.36x steady while a save was written).
    gc.freeze()
    # The host runs ahead of the device: step s+1 is dispatched before the results of step s
    # and of the STEPS_AHEAD - 1 steps before it are read, so what the host does between steps
    # (results, metrics, the checkpoint agreement, a save's writer threads holding the GIL)
    # overlaps the steps queued on the device instead of adding to them. Step s+1 donates
    # the state after step s: a save of step s takes it (copies it out, or stages it) before
    # step s+1 is dispatched, after waiting for every step in flight (``ready``), so that its
    # blocked time is the save's own. A step's seconds run from when the device could start
    # it (the previous step finished, or its dispatch if later) to when it finished (a
    # StepClock's stamp); the device's idle time before it (``idle_s``: host work, a save) is
    # recorded beside them, so that the steps and their idle times add up to the wall time.
    clock = StepClock(delay)
    profile = StepProfile(cfg.profile, storage, run, metrics.primary)

    def profiled(info: dict[str, Any] | None) -> None:
        if info is not None:  # the trace is written: where, in run.json (xrun status names it)
            run_info["profile"] = info
            if storage is not None and run and metrics.primary:
                update_run_json(storage, run, profile=info)

    profile.before_dispatch(start + 1)
    flights: deque[InFlight] = deque([InFlight(start + 1, time.perf_counter(), switch.quick)])
    state, flights[0].out = switch.step(state, batch)
    clock.watch(flights[0])
    last_done = math.nan

    def read_all() -> None:
        for f in flights:
            f.results()

    try:
        for step in range(start + 1, cfg.steps + 1):
            position += global_batch
            last = step == cfg.steps
            if step == start + 1:  # its result is back: the first step is done
                flights[-1].results()
                metrics.phase("first_step", step=step)
                if deferred is not None:  # Orbax is opened now, at the first step boundary
                    ckpt, deferred = deferred.open(), None
                    write_failed = (checkpoint_write_failed(),)
            # Saves when due and the previous save committed, else defers; never waits for it.
            try:
                flights[-1].blocked = ckpt.after_step(step, state, position_data(step), force=last,
                                                      ready=read_all) if ckpt else 0.0
            except write_failed as e:
                return cluster.restartable_exit_code, str(e), False
            forced = not last and restart_every > 0 and step % restart_every == 0
            stop = not last and (preemption.reached(step) or forced)
            failing = fail is not None and fail[0] == step
            if not (last or stop or failing):
                batch = make_batch(position)
                switch.poll(step + 1)
                # Its dispatch is the earliest the device can begin it.
                profile.before_dispatch(step + 1)
                following = InFlight(step + 1, time.perf_counter(), switch.quick)
                state, following.out = switch.step(state, batch)  # dispatched; runs while we go on
                clock.watch(following)
                flights.append(following)
            keep = STEPS_AHEAD if flights[-1].step > step else 0  # at the end: read them all
            while len(flights) > keep:
                f = flights.popleft()
                out = f.results()
                ended = f.finished(READY_TIMEOUT_S + delay, delayed=bool(delay))
                began = f.began if math.isnan(last_done) else max(f.began, last_done)
                ended = max(ended, began)
                seconds, idle = ended - began, 0.0 if math.isnan(last_done) else began - last_done
                last_done = ended
                metrics.step(f.step, seconds, flops["tflops_per_device"] / seconds,
                             tokens_per_step / seconds / devices, tokens_per_step,
                             float(out["loss"]), f.blocked, grad_norm=float(out["grad_norm"]),
                             learning_rate=float(out["learning_rate"]),
                             tokens_per_s=tokens_per_step / seconds, quick=f.quick, idle_s=idle,
                             at=time.time() - (time.perf_counter() - ended))
                if f.step == start + 1:
                    report_memory(metrics)
                profiled(profile.after_read(f.step))
            if fail is not None and failing:
                return fail[1], f"test failure at step {step} ({Env.TEST_FAIL_AT_STEP})", False
            if stop:
                if ckpt:  # this step's save commits before we exit (an "exit_wait")
                    try:
                        ckpt.finish(step, state, position_data(step))
                    except write_failed as e:
                        return cluster.restartable_exit_code, str(e), False
                    ckpt.close()
                why = f"test restart ({Env.TEST_RESTART_EVERY})" if forced else "preempted (SIGTERM)"
                return cluster.restartable_exit_code, f"{why} at step {step}", True
        if ckpt:  # the last step's save commits before we exit
            try:
                ckpt.finish(cfg.steps, state, position_data(cfg.steps))
            except write_failed as e:
                return cluster.restartable_exit_code, str(e), False
            ckpt.close()
        return 0, "completed", True
    finally:
        clock.close()
        profiled(profile.finish(cfg.steps))  # the run ended inside the traced steps
