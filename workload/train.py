"""Train the decoder on every host of the job: ``python -m workload.train``.

Usage::

    python -m workload.train [--config FILE.yaml] [--preset NAME] [--storage ROOT]
                             [--run-name NAME] [key=value ...]

The contract env (``xrun_contract.Env``) says who this process is; ``--storage`` and
``--run-name`` override ``XRUN_STORAGE`` / ``XRUN_RUN_NAME`` (standalone runs, benchmarks).
Without a storage root nothing is written (no metrics, no checkpoints).

Step numbering: steps are 1..``steps``. "completed step: N" means N optimizer updates have
been applied; the checkpoint of step N holds the state after those N updates and the data
position of step N + 1, so a run that restores step 4 logs step 5 next.

Written under ``<storage>/runs/<run>/``: ``metrics/attempt-AAA-SSSSSSSS.jsonl`` (process 0),
``run.json`` (its ``workload`` section, process 0), ``checkpoints/<step>/`` (Orbax, all).

Exit codes: 0 done; ``XRUN_RESTARTABLE_EXIT_CODE`` (default 42) after a SIGTERM save
committed, and after an infrastructure failure (a peer or the coordinator died, storage
kept failing: ``workload.failures``); ``PLATFORM_MISMATCH_EXIT_CODE`` (4) when the manifest
asked for TPU/GPU and JAX found only CPU; the code of ``XRUN_TEST_FAIL_AT_STEP``; 1 on an
exception in user code (traceback on stderr).

Startup is recorded as phases (``xrun_contract.PHASES``: a "phase" record and an
"xrun phase: ..." line each); the train step compiles in a thread while the checkpoint
manager opens and the latest step restores.
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import gc
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any

from workload.config import Config, arg_parser, describe, load_config, step_flops
from workload.distributed import (
    Cluster,
    PlatformMismatch,
    check_platform,
    compilation_cache_dir,
    configure_platform,
    initialize,
    make_mesh,
)
from workload.executables import Executables, compile_recording, program_key
from workload.metrics import Metrics, process_start_time, say, update_run_json
from xrun_contract import (
    FAILURE_LINE,
    PHASE_ACTIVITY,
    PHASE_LINE,
    PHASE_TOOK,
    PLATFORM_MISMATCH_EXIT_CODE,
    USER_ERROR_EXIT_CODE,
    XRUN_VERSION,
    Env,
    Layout,
    significant,
)
from xrun_contract.checkpoints import latest_committed_step
from xrun_contract.storage import Storage, open_storage

# ---------------------------------------------------------------------------------------
# The pure JAX part: optimizer, loss, state init and one train step.


def make_optimizer(cfg: Config):
    """AdamW (no decay on norm scales), linear warmup then cosine, global-norm clipping."""
    import optax

    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.learning_rate, warmup_steps=cfg.warmup_steps,
        decay_steps=max(cfg.steps, cfg.warmup_steps + 1),
        end_value=cfg.learning_rate * cfg.min_lr_ratio)

    tx = optax.chain(
        clip_by_global_norm(cfg.grad_clip) if cfg.grad_clip > 0 else optax.identity(),
        make_adamw(cfg, schedule),
    )
    return tx, schedule


ADAM_EPS = 1e-8  # AdamW's epsilon (optax's default), also in optimizer_step's table update


def make_adamw(cfg: Config, schedule):
    """The AdamW of ``make_optimizer``'s chain (the chain's state is ``(clip, adamw)``):
    weight decay on everything but the norms' scales."""
    import jax
    import optax

    def decay_mask(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, _: getattr(path[-1], "key", None) != "scale", params)

    return optax.adamw(schedule, b1=cfg.adam_b1, b2=cfg.adam_b2, eps=ADAM_EPS,
                       weight_decay=cfg.weight_decay, mask=decay_mask)


def embedding_gradient(ids, d_rows, vocab_size: int):
    """The embedding table's gradient, sparse: ``(rows, grads)``, the distinct ids of ``ids``
    and the sum of their rows of ``d_rows`` (``[*ids.shape, d]``: the gradient of each
    looked-up row). Static size ``ids.size``: unused slots have the id ``vocab_size`` (out of
    range: the scatters that use them drop it) and zero gradients."""
    import jax
    import jax.numpy as jnp

    n = ids.size
    rows, inverse = jnp.unique(ids.reshape(n), size=n, fill_value=vocab_size,
                               return_inverse=True)
    grads = jax.ops.segment_sum(d_rows.reshape(n, -1), inverse.reshape(n), num_segments=n)
    return rows, grads


def embedding_route(cfg: Config) -> str:
    """``cfg.embedding_update`` resolved. ``auto``: ``dense`` on TPU, where the row-wise
    update's two scatters and weight pass took 4.6 ms of the 618M config's 246 ms step and
    the dense gradient + optax's fused AdamW is 2.9 ms faster a step (bench_tpu.py on a v5e
    chip: 0.2460 -> 0.2431 s, MFU 59.4% -> 60.1% of spec); ``sparse`` elsewhere
    (``optimizer_step``, written for XLA:CPU, where the dense gradient's passes cost most;
    GPUs are unmeasured)."""
    if cfg.embedding_update != "auto":
        return cfg.embedding_update
    import jax

    return "dense" if jax.default_backend() == "tpu" else "sparse"


def optimizer_step(cfg: Config, adamw, schedule, params: dict, opt_state, grads: dict,
                   rows, row_grads):
    """``make_optimizer``'s update (global-norm clipping, then ``adamw``) with the embedding
    table's gradient sparse: ``grads`` has no ``embed`` entry, ``(rows, row_grads)`` (from
    ``embedding_gradient``) stands for it. Returns ``(params, opt_state, gradient norm)``.

    Why: autodiff's table gradient was a zero-filled ``[vocab, d]`` buffer with a few rows
    added (bench-21m: at most 256 of 32,000), written every step and then read by the norm
    and by each of AdamW's moments. A row with a zero gradient still moves (its moments
    decay, its weight decays), so the table's update still reads and writes the table and
    both moments in full; only the gradient's passes go.

    Everything but the table goes through ``adamw`` itself. The table's update is AdamW
    written out: optax's ``scale_by_adam`` (eps ``ADAM_EPS``, eps_root 0),
    ``add_decayed_weights`` (the table is no norm scale: decayed), ``scale_by_learning_rate``
    and ``apply_updates``, in their order. The moments are decayed over the whole table and
    the touched rows' gradient terms added in place, then one pass writes the weights: XLA
    writes each decayed moment once, in place, and the weights' loop reads them (a form
    that gathered the old rows made it copy both moments to keep them).
    """
    import jax
    import jax.numpy as jnp
    import optax

    norm = jnp.sqrt(optax.tree.norm(grads, squared=True) + jnp.sum(row_grads * row_grads))
    factor = clip_factor(norm, cfg.grad_clip) if cfg.grad_clip > 0 else jnp.ones((), norm.dtype)
    clip_state, adam_state = opt_state
    moments = adam_state[0]  # optax.adamw's chain: scale_by_adam, add_decayed_weights, lr
    if not isinstance(moments, optax.ScaleByAdamState):
        raise TypeError(f"unexpected AdamW state {type(moments).__name__}")
    table, mu, nu = params["embed"], moments.mu["embed"], moments.nu["embed"]

    # Everything else: the table's gradient zero (its results are not used).
    scaled = {**jax.tree.map(lambda t: t * factor.astype(t.dtype), grads),
              "embed": jnp.zeros_like(table)}
    updates, adam_state = adamw.update(scaled, adam_state, params)
    new_params = optax.apply_updates(params, updates)

    count = optax.safe_increment(moments.count)
    bc1, bc2 = 1 - cfg.adam_b1 ** count, 1 - cfg.adam_b2 ** count
    step_size = -schedule(moments.count)
    # The moments: decayed everywhere, the touched rows' gradient terms added in place (for
    # those rows, optax's (1 - b1) g + b1 m with the two terms swapped: the same sum).
    g = row_grads * factor.astype(row_grads.dtype)
    mu = (cfg.adam_b1 * mu).at[rows].add((1 - cfg.adam_b1) * g, mode="drop")
    nu = (cfg.adam_b2 * nu).at[rows].add((1 - cfg.adam_b2) * (g * g), mode="drop")
    # The weights: one pass over the table from the new moments, touched rows included.
    u = (mu / bc1.astype(mu.dtype)) / (jnp.sqrt(nu / bc2.astype(nu.dtype) + 0.0) + ADAM_EPS)
    new_params["embed"] = table + jnp.asarray(step_size, table.dtype) * (
        u + cfg.weight_decay * table)
    moments = adam_state[0]
    adam_state = (moments._replace(mu={**moments.mu, "embed": mu},
                                   nu={**moments.nu, "embed": nu}), *adam_state[1:])
    return new_params, (clip_state, adam_state), norm


def clip_by_global_norm(max_norm: float):
    """``optax.clip_by_global_norm`` (optax/transforms/_clipping.py, ``update_fn``) with the
    clipping as one scalar factor: ``t * where(norm < max, 1, max / norm)`` instead of
    ``select(norm < max, t, t / norm * max)``. Same result (to a rounding); but a multiply
    by a scalar is cheap enough for XLA to fuse into each Adam moment's loop, where the
    element-wise divide made XLA:CPU write the whole clipped gradient out once more (a
    pass over the vocabulary-sized embedding and output gradients per step)."""
    import jax
    import optax

    def update(updates, state, params=None):
        del params
        factor = clip_factor(optax.tree.norm(updates), max_norm)
        return jax.tree.map(lambda t: t * factor.astype(t.dtype), updates), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def clip_factor(norm, max_norm: float):
    """The scalar global-norm clipping multiplies every gradient by (``clip_by_global_norm``
    and the train step's ``optimizer_step``)."""
    import jax.numpy as jnp

    return jnp.where(norm < max_norm, 1.0, max_norm / norm)


def cross_entropy(logits, targets, z_loss: float):
    """Mean token cross-entropy (+ z_loss x mean(logsumexp^2)); logits are float32."""
    import jax
    import jax.numpy as jnp

    lse = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    nll = jnp.mean(lse - target_logit)
    loss = nll + z_loss * jnp.mean(lse**2) if z_loss else nll
    return loss, {"nll": nll}


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
    init's argument, the same on every process (replicated)."""
    import jax
    import numpy as np

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
        if executables is not None:
            # Side by side: loading onto a TPU chip is the runtime's work. The 618M config's
            # two loaded side by side within 1.6 s on a v5e chip (bench/probe_tpu_startup.py),
            # where a warm start's profile had them at 3.3 s one after the other.
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(2, thread_name_prefix="xrun-load") as pool:
                init_exe, step_exe = pool.map(executables.load, ("init", "train_step"))
            if init_exe is not None and step_exe is not None:
                self._use_loaded(init_exe, step_exe)
                return
        self._build(cfg, mesh, global_batch)
        if compile_now:
            self.compile()

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

        def train_step(state, tokens):
            inputs, targets = tokens[:, :-1], tokens[:, 1:]

            # Differentiated by the looked-up rows, not by the table: optimizer_step takes
            # the table's gradient sparse.
            def loss_fn(params, embedded):
                m = nnx.merge(graphdef, {**params, "embed": table})
                nll, zsq = output_cross_entropy(m.hidden(inputs, embedded), m.out[...],
                                                targets, cfg.compute_dtype)
                return loss_and_aux(nll, zsq, cfg.z_loss)

            table = state["params"]["embed"]
            others = {k: v for k, v in state["params"].items() if k != "embed"}
            (loss, aux), (grads, d_embedded) = jax.value_and_grad(
                loss_fn, argnums=(0, 1), has_aux=True)(others, jnp.take(table, inputs, axis=0))
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
            self.train_step = self._compile("train_step", lambda: self._lower_step().compile())
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

    def _compile(self, function: str, compile_fn: Any) -> Any:
        if self.executables is None:
            return compile_fn()
        compiled, recorded = compile_recording(compile_fn)
        if self.executables.save(function, compiled, recorded):
            self.source = "compiled, written"
        return compiled


# ---------------------------------------------------------------------------------------
# The process: arguments, env, header, the loop, checkpoints, signals, exit.


PROCESS_START = process_start_time()  # the startup timeline's zero


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, as ``workload.config.arg_parser`` defines it (the orchestrator checks
    the same arguments before submitting)."""
    return arg_parser(exit_on_error=True).parse_args(argv)


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


# Steps dispatched ahead of the one whose results the loop reads: host stalls shorter than
# this many steps cost no device time. 2: on a v5e chip a save's writer held the loop
# 0.4-0.9 s at a time (0.24 s steps), and one step ahead left the steps while a save was
# written 1.12x steady (bench_tpu.py --part startup, SAVES_STEPS=120).
STEPS_AHEAD = 2


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
        ready = "1" if self.optimized.done() else "0"
        if all(v == "1" for v in self.peers.gather(ready)):
            began, ended = self.optimized.result()
            self.quick = False
            say(f"xrun: optimized train step from step {step} (compiled in {ended - began:.1f} s "
                "after the quick one)")

    def step(self, state: Any, batch: Any) -> Any:
        exe = self.program.quick_step if self.quick else self.program.train_step
        return exe(state, batch)


class InFlight:
    """A dispatched train step: its outputs, read once (``results``), when the device could
    begin it, when its results were back, and the seconds a save of it blocked training."""

    def __init__(self, step: int, began: float, quick: bool = False):
        self.step, self.quick = step, quick
        self.out: Any = None
        self.began, self.done, self.blocked = began, 0.0, 0.0
        self._results: Any = None

    def results(self) -> Any:
        if self._results is None:
            self._results = step_results(self.out)
            self.done = time.perf_counter()
        return self._results


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
        return program.compile()

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
    # it (the previous step done, or its dispatch if later) to its results.
    flights: deque[InFlight] = deque([InFlight(start + 1, time.perf_counter(), switch.quick)])
    state, flights[0].out = switch.step(state, batch)
    last_done = 0.0

    def read_all() -> None:
        for f in flights:
            f.results()

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
            following = InFlight(step + 1, 0.0, switch.quick)
            state, following.out = switch.step(state, batch)  # dispatched; runs while we go on
            following.began = time.perf_counter()
            flights.append(following)
        keep = STEPS_AHEAD if flights[-1].step > step else 0  # at the end: read them all
        while len(flights) > keep:
            f = flights.popleft()
            out = f.results()
            if delay:  # after the step finished, so it counts in the step's seconds
                time.sleep(delay)
                f.done = time.perf_counter()
            seconds = f.done - max(f.began, last_done)
            last_done = f.done
            metrics.step(f.step, seconds, flops["tflops_per_device"] / seconds,
                         tokens_per_step / seconds / devices, tokens_per_step,
                         float(out["loss"]), f.blocked, grad_norm=float(out["grad_norm"]),
                         learning_rate=float(out["learning_rate"]),
                         tokens_per_s=tokens_per_step / seconds, quick=f.quick)
            if f.step == start + 1:
                report_memory(metrics)
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


def main(argv: list[str] | None = None) -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: stacks to stderr
    args = parse_args(argv)
    preemption = Preemption()
    cluster = Cluster.from_env()
    yaml_text = Path(args.config).read_text() if args.config else None
    cfg = load_config(args.preset, args.overrides, yaml_text)
    root = args.storage or os.environ.get(Env.STORAGE) or None
    run = args.run_name or os.environ.get(Env.RUN_NAME) or ("standalone" if root else None)
    storage = open_storage(root) if root else None

    # Until jax.distributed runs, the env's process id says who speaks (process 0).
    early: list[tuple[str, float]] = [("process_start", PROCESS_START)]
    configure_platform(cluster)  # imports jax
    early.append(("imports", time.time()))
    if cluster.process_id == 0:
        took = early[-1][1] - PROCESS_START
        say(PHASE_LINE.format(activity=PHASE_ACTIVITY["imports"], seconds=took)
            + PHASE_TOOK.format(activity=PHASE_ACTIVITY["process_start"], seconds=significant(took, 3)))
    preload(storage, run, cfg)  # while jax.distributed.initialize waits for the peers
    try:
        if initialize(cluster):
            preemption.handed_to_jax()
    except Exception as e:  # noqa: BLE001 - e.g. the coordinator never answered
        from workload.failures import classify

        traceback.print_exc()
        verdict = classify(e)
        code = cluster.restartable_exit_code if verdict.restartable else USER_ERROR_EXIT_CODE
        say(FAILURE_LINE.format(kind=verdict.kind, why=verdict.why, code=code))
        os._exit(code)  # no peers to wait for; nothing written yet
    import jax

    jax.devices()  # the devices open here (seconds on a TPU chip): part of this phase
    early.append(("distributed", time.time()))

    primary = jax.process_index() == 0
    metrics = Metrics(storage, run, cluster.attempt, primary, process_start=PROCESS_START)
    for phase, at in early:
        metrics.phase(phase, at=at, quiet=phase != "distributed")
    run_info: dict[str, Any] = {"attempt": cluster.attempt, "start_time": time.time(),
                                "end_time": None, "exit_code": None}
    failure: dict[str, str] = {}
    try:
        check_platform(cluster)
        code, reason, clean = train(cfg, cluster, preemption, metrics, storage, run, run_info)
    except KeyboardInterrupt:
        code, reason, clean = 130, "interrupted (SIGINT)", False
    except PlatformMismatch as e:
        print(f"xrun: {e}", file=sys.stderr, flush=True)
        code, reason, clean = PLATFORM_MISMATCH_EXIT_CODE, f"platform: {e}", False
        failure = {"failure": "platform"}
    except Exception as e:  # noqa: BLE001 - classified, reported, then exit
        from workload.failures import classify

        traceback.print_exc()
        sys.stderr.flush()
        verdict = classify(e)
        code = cluster.restartable_exit_code if verdict.restartable else USER_ERROR_EXIT_CODE
        say(FAILURE_LINE.format(kind=verdict.kind, why=verdict.why, code=code))
        reason, clean = f"exception: {type(e).__name__}: {e}", False
        failure = {"failure": verdict.kind}
    run_info.update(failure)
    metrics.end(code, reason, data_bytes_read=run_info.get("data_bytes_read"),
                failure=failure.get("failure"))
    try:
        metrics.close()
    except Exception as e:  # noqa: BLE001 - storage down at exit: the exit code matters more
        print(f"xrun: last metrics records not written: {e}", file=sys.stderr, flush=True)
    if storage is not None and run and primary:
        run_info.update(end_time=time.time(), exit_code=code, reason=reason)
        try:
            update_run_json(storage, run, **run_info)
        except Exception:  # noqa: BLE001 - the exit code matters more than run.json
            traceback.print_exc()
    sys.stdout.flush()
    if not clean:
        os._exit(code)  # the peers go on without us: skip jax.distributed's shutdown barrier
    if jax.distributed.is_initialized():
        jax.distributed.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
