"""The compiled program of one (config, mesh): the jitted init and train step, compiled ahead
of time (optimized, and quickly for a cold start's first steps), from the executable cache
where it holds them; and the switch from the quick executable to the optimized one."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading
import time
from typing import Any

from workload import autotune
from workload.config import Config
from workload.distributed import compilation_cache_dir
from workload.executables import Executables, compile_recording, program_key
from workload.metrics import say
from workload.optim import (
    embedding_gradient,
    embedding_route,
    make_adamw,
    make_optimizer,
    optimizer_step,
)
from xrun_contract import Env
from xrun_contract.storage import open_storage

# The init program runs once and takes milliseconds, but its random number generators
# (threefry, erf_inv) are slow to compile: on a v5e chip the 618M config's init took XLA
# 25 s at its default effort (one truncated-normal [8, 2048, 7168] array alone: 10 s) and
# 8.1 s at its lowest execution-time effort (bench_tpu.py --part compile-probe); on CPU the
# lowest effort gives the default's values, bit for bit. Unoptimised it compiles ~3x faster
# on CPU (the tiny model's init: 13.4 -> 4.7 s); its values may differ in the last bit from
# an optimised compile's, the same in every process. (A chip's values differ from CPU's in
# the last bits anyway: 3 of the 618M config's 12 parameter arrays bit-equal, and jax's
# "rbg" keys, fast to compile, give other values altogether.)
INIT_COMPILER_OPTIONS: dict[str, Any] = {  # Any: jax types it str | bool, the effort is a float
    "xla_backend_optimization_level": "0",  # XLA parses the value
    "exec_time_optimization_effort": -1.0}
# The quick train step (config quick_compile): on a v5e chip the 618M config's step compiled
# in 8.1 s instead of 24.2 s and ran 0.61 s instead of 0.24 s.
QUICK_COMPILER_OPTIONS: dict[str, Any] = {"exec_time_optimization_effort": -1.0}


def unwritten_to_jax_cache() -> Any:
    """A context in which this thread's compilations are not written to JAX's persistent
    cache: JAX writes an entry before compile() returns (serialised and compressed: zlib
    where zstandard is absent, as on the TPU machine), so on the first step's path. The
    quick step serves one cold start and is never looked up again. Uses JAX's per-thread
    setting of the minimum compile time it caches; where this JAX has none, a no-op."""
    import contextlib

    from workload.private_seam import jax_config

    setting = getattr(jax_config, "persistent_cache_min_compile_time_secs", None)
    return setting(math.inf) if callable(setting) else contextlib.nullcontext()


def init_key(seed: int) -> Any:
    """The raw data of ``jax.random.key(seed)`` (uint32[2] for threefry) as a host array:
    init's argument, the same on every process (replicated).

    For threefry (JAX's default) computed on the host: ``jax.random.key`` runs a program on
    the default device, and the first one of a process (a compile, or a lookup in the
    persistent cache, and the copy back) took 0.8-0.9 s of a warm start on the loaded 2-core
    machine. jax/_src/random/threefry2x32.py ``threefry_seed``: the seed as a 64-bit integer
    (32-bit without x64, its high word then 0), high word first."""
    import jax
    import numpy as np

    if getattr(jax.config, "jax_default_prng_impl", None) == "threefry2x32":
        x64 = jax.dtypes.canonicalize_dtype(np.int64) == np.dtype(np.int64)
        bits = int(seed) & (0xFFFFFFFFFFFFFFFF if x64 else 0xFFFFFFFF)
        return np.array([bits >> 32, bits & 0xFFFFFFFF], dtype=np.uint32)
    return np.asarray(jax.random.key_data(jax.random.key(seed)))


class Program:
    """The jitted functions and shardings of one (config, mesh): built once, used by train()."""

    def __init__(self, cfg: Config, mesh, global_batch: int, compile_now: bool = True,
                 executables: Executables | None = None):
        self.cfg, self.mesh, self.global_batch = cfg, mesh, global_batch
        self.executables = executables
        self._init_exe: Any = None
        self.train_step: Any = None
        self.quick_step: Any = None  # compile_quick()'s
        self._lowered: Any = None  # the train step lowered once for both compiles
        self._lower_lock = threading.Lock()
        # "loaded": both executables came from the executable cache (no tracing, no model);
        # "compiled, written": compiled from scratch and written there; else "compiled".
        self.source = "compiled"
        # remat=auto's resolution (workload.autotune), None for a fixed policy.
        self.choice: autotune.Choice | None = None
        self._auto: Config | None = None  # remat=auto still to search (in compile())
        if executables is not None:
            # Side by side: loading onto a TPU chip is the runtime's work. The 618M config's
            # two loaded side by side within 1.6 s on a v5e chip (bench/probe_tpu_startup.py),
            # where a warm start's profile had them at 3.3 s one after the other.
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(2, thread_name_prefix="xrun-load") as pool:
                init_exe, step_exe = pool.map(executables.load, ("init", "train_step"))
            if init_exe is not None and step_exe is not None:
                self._use_loaded(init_exe, step_exe)
                if cfg.remat == "auto":  # what the loaded executables were compiled with
                    cache = autotune_cache(executables)
                    self.choice = (autotune.load_cached(cache, autotune.cache_key(
                        cfg, mesh, global_batch)) if cache is not None else None)
                return
        if cfg.remat == "auto":
            self.choice = autotune.known_choice(cfg, mesh, global_batch,
                                                autotune_cache(executables))
            if self.choice is not None:
                cfg = self.choice.apply(cfg)
            else:
                # Until the search (in compile(), the compile thread) has chosen: full
                # recomputation at the whole batch, the least memory at one batch. Init and
                # the state do not depend on the policy; a quick first executable runs it.
                self._auto = cfg
                cfg = dataclasses.replace(cfg, remat="full", micro_batches=1)
            self.cfg = cfg
        self._build(cfg, mesh, global_batch)
        if compile_now:
            self.compile()

    def _search(self) -> None:
        """remat=auto's search (workload.autotune): the winner's jitted step and executable
        are taken over (compiled once); init and the shardings stay as built."""
        assert self._auto is not None
        cfg, mesh, global_batch = self._auto, self.mesh, self.global_batch

        def compile_candidate(candidate: Config) -> tuple[Any, Any, Program]:
            program = Program(candidate, mesh, global_batch, compile_now=False)
            lowered = program._lower_step()
            compiled, recorded = compile_recording(lowered.compile)
            return compiled, recorded, program

        choice, (compiled, recorded, program) = autotune.search_and_cache(
            cfg, mesh, global_batch, compile_candidate, autotune_cache(self.executables))
        with self._lower_lock:
            self.cfg, self._jitted_step, self._lowered = (
                program.cfg, program._jitted_step, program._lowered)
        self.choice, self._auto = choice, None
        self.train_step = self._compile("train_step", lambda: compiled, recorded)

    def _use_loaded(self, init_exe: Any, step_exe: Any) -> None:
        """Shardings and abstract state from the loaded train step's own signature."""
        import jax

        (state_info, _), _ = step_exe.args_info
        (state_sh, batch_sh), _ = step_exe.input_shardings
        self.state_shardings, self.batch_sharding = state_sh, batch_sh
        self.abstract_state = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), state_info, state_sh)
        self.num_params = sum(math.prod(a.shape)
                              for a in jax.tree.leaves(self.abstract_state["params"]))
        self._init_exe, self.train_step, self.source = init_exe, step_exe, "loaded"

    def _build(self, cfg: Config, mesh, global_batch: int) -> None:
        import jax
        import jax.numpy as jnp
        import optax
        from flax import nnx
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        from workload import model
        from workload.loss import loss_and_aux, output_cross_entropy

        replicated = NamedSharding(mesh, P())
        batch_axes = model.logical_to_mesh(("batch",), (global_batch,), mesh)
        self.batch_sharding = NamedSharding(mesh, P(*batch_axes, None))
        act_sharding = NamedSharding(mesh, P(*batch_axes, None, None))
        self.tx, self.schedule = make_optimizer(cfg)

        abstract_model = nnx.eval_shape(lambda: model.Transformer(cfg, nnx.Rngs(0), act_sharding))
        self.graphdef, _ = nnx.split(abstract_model, nnx.Param)
        self.num_params = model.count_params(abstract_model)
        param_sh = nnx.to_pure_dict(model.param_shardings(abstract_model, mesh))

        def init(key_data: jax.Array) -> dict[str, Any]:
            m = model.Transformer(cfg, nnx.Rngs(jax.random.wrap_key_data(key_data)),
                                  act_sharding)
            params = nnx.to_pure_dict(nnx.state(m, nnx.Param))
            return {"params": params, "opt_state": self.tx.init(params),
                    "step": jnp.zeros((), jnp.int32)}

        # The state's shapes from the abstract model already built, not from tracing init
        # (model construction again: a tenth of a second of startup).
        abstract_params = nnx.to_pure_dict(nnx.state(abstract_model, nnx.Param))
        abstract = {"params": abstract_params,
                    "opt_state": jax.eval_shape(self.tx.init, abstract_params),
                    "step": jax.ShapeDtypeStruct((), jnp.int32)}
        opt_sh = optax.tree_map_params(self.tx, lambda _, s: s, abstract["opt_state"], param_sh,
                                       transform_non_params=lambda _: replicated)
        self.state_shardings = {"params": param_sh, "opt_state": opt_sh, "step": replicated}
        self.abstract_state = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            abstract, self.state_shardings)
        # Created already sharded: each device computes only its own shards.
        # The key is an argument, not a constant: with the seed baked in, every value of the
        # state is a constant expression, and its compile on the chip took 31.9 s, not 25.8 s.
        self._jitted_init = jax.jit(init, out_shardings=self.state_shardings)

        graphdef, schedule, tx = self.graphdef, self.schedule, self.tx
        adamw = make_adamw(cfg, schedule)
        route = embedding_route(cfg)

        micro = cfg.micro_batches
        axes = batch_axes[0]
        shards = math.prod(mesh.shape[a] for a in
                           (axes if isinstance(axes, tuple) else (axes,) if axes else ()))
        if global_batch % micro or (global_batch // micro) % shards:
            raise ValueError(f"workload config micro_batches: {micro} does not split the global "
                             f"batch {global_batch} into micro-batches of whole rows for each "
                             f"of {shards} batch shards")

        def train_step(state, tokens):
            table = state["params"]["embed"]
            others = {k: v for k, v in state["params"].items() if k != "embed"}

            def gradients(tokens):
                inputs, targets = tokens[:, :-1], tokens[:, 1:]

                # Differentiated by the looked-up rows, not by the table: optimizer_step
                # takes the table's gradient sparse.
                def loss_fn(params, embedded):
                    m = nnx.merge(graphdef, {**params, "embed": table})
                    nll, zsq = output_cross_entropy(m.hidden(inputs, embedded), m.out[...],
                                                    targets, cfg.compute_dtype)
                    return loss_and_aux(nll, zsq, cfg.z_loss)

                return jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
                    others, jnp.take(table, inputs, axis=0))

            inputs = tokens[:, :-1]
            if micro == 1:
                (loss, aux), (grads, d_embedded) = gradients(tokens)
            else:
                # Gradient accumulation: micro-batch i is rows i, i + micro, ... (a reshape
                # that keeps each device's rows on it), one at a time in a scan so that one
                # micro-batch's activations are live; every micro-batch has as many tokens,
                # so the mean of their mean losses and gradients is the whole batch's.
                b = global_batch // micro
                parts = tokens.reshape(b, micro, -1).swapaxes(0, 1)

                def accumulate(carry, part):
                    (loss, aux), (grads, d_rows) = gradients(part)
                    return jax.tree.map(jnp.add, carry, (loss, aux, grads)), d_rows

                (loss_s, aux_s), (grads_s, _) = jax.eval_shape(gradients, parts[0])
                zero = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype),
                                    (loss_s, aux_s, grads_s))
                (loss, aux, grads), d_parts = jax.lax.scan(accumulate, zero, parts)
                loss, aux, grads = jax.tree.map(lambda a: a / micro, (loss, aux, grads))
                d_embedded = (d_parts / micro).swapaxes(0, 1).reshape(
                    global_batch, *d_parts.shape[2:])
            if route == "dense":
                grads = {**grads, "embed": jnp.zeros_like(table).at[inputs].add(d_embedded)}
                updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
                params = optax.apply_updates(state["params"], updates)
                grad_norm = optax.tree.norm(grads)
            else:
                rows, row_grads = embedding_gradient(inputs, d_embedded, cfg.vocab_size)
                params, opt_state, grad_norm = optimizer_step(
                    cfg, adamw, schedule, state["params"], state["opt_state"], grads, rows,
                    row_grads)
            out = {"loss": loss, "grad_norm": grad_norm,
                   "learning_rate": schedule(state["step"]), **aux}
            return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, out

        self._abstract_batch = jax.ShapeDtypeStruct((global_batch, cfg.seq_len + 1), jnp.int32,
                                                    sharding=self.batch_sharding)
        self._jitted_step = jax.jit(
            train_step, in_shardings=(self.state_shardings, self.batch_sharding),
            out_shardings=(self.state_shardings, replicated), donate_argnums=0,
        )

    def init(self) -> dict[str, Any]:
        """The initial state (seed ``cfg.seed``), created already sharded."""
        key = init_key(self.cfg.seed)
        if self._init_exe is None:
            self._init_exe = self._compile("init", lambda: self._jitted_init.lower(key).compile(
                compiler_options=INIT_COMPILER_OPTIONS))
        return self._init_exe(key)

    def compile(self):
        """Compile the train step ahead of time, so that step 1's time is a step, not a
        compilation. Thread-safe: train() runs it while the checkpoint restores."""
        if self.train_step is None:
            if self._auto is not None:
                self._search()
            else:
                self.train_step = self._compile("train_step",
                                                lambda: self._lower_step().compile())
        return self.train_step

    def compile_quick(self):
        """The train step at XLA's lowest execution-time effort: the same program, compiled
        in a third of the time, run slower (QUICK_COMPILER_OPTIONS); never cached by xrun."""
        lowered = self._lower_step()
        with unwritten_to_jax_cache():
            self.quick_step = lowered.compile(compiler_options=QUICK_COMPILER_OPTIONS)
        return self.quick_step

    def _lower_step(self):
        with self._lower_lock:  # one tracing for both compiles (threads)
            if self._lowered is None:
                self._lowered = self._jitted_step.lower(self.abstract_state, self._abstract_batch)
            return self._lowered

    def _compile(self, function: str, compile_fn: Any, recorded: Any = None) -> Any:
        """``compile_fn()``, written to the executable cache; ``recorded``: what its compile
        took from JAX's cache, when it was compiled before (remat=auto's search)."""
        if self.executables is None:
            return compile_fn()
        if recorded is None:
            compiled, recorded = compile_recording(compile_fn)
        else:
            compiled = compile_fn()
        if self.executables.save(function, compiled, recorded):
            self.source = "compiled, written"
        return compiled


def optimized_delay(process_id: int) -> float:
    """Env.TEST_OPTIMIZED_DELAY, "<seconds>[:<process id>]": how long this process's
    optimized compile waits (tests of the quick executable's switch)."""
    seconds, _, who = os.environ.get(Env.TEST_OPTIMIZED_DELAY, "").partition(":")
    return float(seconds) if seconds and (not who or int(who) == process_id) else 0.0


def timed(fn: Any) -> tuple[float, float]:
    """Run ``fn()``; the unix times it began and returned (the compile thread's phase)."""
    began = time.time()
    fn()
    return began, time.time()


def wants_quick_compile(cfg: Config) -> bool:
    """Whether the first steps may run a quick executable (config quick_compile): "auto" on
    TPU, where the step's compile (21-24 s for the 618M config on a v5e chip) is most of a
    cold start. The same answer on every process (the config, the platform)."""
    if cfg.quick_compile != "auto":
        return cfg.quick_compile == "on"
    import jax

    return jax.default_backend() == "tpu"


class StepSwitch:
    """The train step the loop dispatches. With quick_compile: the quick executable until
    the optimized one is compiled on every process, then the optimized one from the same
    step on every process: each step is one SPMD program, and processes running different
    executables of it would not meet in its collectives. So every decision is a round of
    agreement (one at the start, one per step while the quick one runs; none on a single
    process, which agrees with itself). The two executables compute the same function;
    their floating-point results may differ in the last bits (other fusions)."""

    def __init__(self, program: Program, optimized: Any, quick: Any, on: bool):
        self.program, self.optimized, self.quick_future, self.on = program, optimized, quick, on
        self.quick = False  # the quick executable is the one dispatched now
        self.peers: Any = None
        self.switch_by = int(os.environ.get(Env.TEST_SWITCH_BY, "0") or 0)

    def first_ready(self) -> tuple[float, float]:
        """Wait for the first executable to use; the unix times its compile began and ended.
        The optimized one if every process has it by the time the first of its two compiles
        ended (a process that loaded it from the cache compiles the quick one then if
        another process did not)."""
        if not self.on:
            return self.optimized.result()
        from concurrent.futures import FIRST_COMPLETED, wait

        from workload.peers import Peers

        self.peers = Peers(prefix="xrun/compile/round")
        wait([f for f in (self.optimized, self.quick_future) if f is not None],
             return_when=FIRST_COMPLETED)
        mine = "1" if self.optimized.done() else "0"
        if all(v == "1" for v in self.peers.gather(mine)):
            self.on = False
            return self.optimized.result()
        self.quick = True
        if self.quick_future is None:
            return timed(self.program.compile_quick)
        return self.quick_future.result()

    def poll(self, step: int) -> None:
        """Before dispatching ``step``: from it on the optimized executable if every process
        has it."""
        if not self.quick:
            return
        if self.switch_by and step >= self.switch_by:
            self.optimized.result()  # Env.TEST_SWITCH_BY: a bound that no load can move
        ready = "1" if self.optimized.done() else "0"
        if all(v == "1" for v in self.peers.gather(ready)):
            began, ended = self.optimized.result()
            self.quick = False
            say(f"xrun: optimized train step from step {step} (compiled in {ended - began:.1f} s "
                "after the quick one)")

    def step(self, state: Any, batch: Any) -> Any:
        exe = self.program.quick_step if self.quick else self.program.train_step
        return exe(state, batch)


def executables_for(cfg: Config, mesh, global_batch: int) -> Executables | None:
    """The executable cache beside JAX's compilation cache (workload/executables.py); none
    without one. Never fails a run: an unreadable cache is only slower."""
    cache = compilation_cache_dir()
    if not cache:
        return None
    try:
        return Executables(open_storage(cache), program_key(cfg.to_dict(), mesh, global_batch))
    except Exception as e:  # noqa: BLE001 - an optimisation; JAX's own cache still works
        print(f"xrun: no executable cache ({e!r:.200})", file=sys.stderr, flush=True)
        return None


def autotune_cache(executables: Executables | None) -> Any:
    """Where remat=auto's choice is cached: the executable cache's storage (the compilation
    cache folder), else that folder from the env; None without one."""
    if executables is not None:
        return executables.storage
    cache = compilation_cache_dir()
    if not cache:
        return None
    try:
        return open_storage(cache)
    except Exception:  # noqa: BLE001 - an optimisation: then auto searches each run
        return None
