"""The workload on one accelerator chip, measured against the chip itself and plain Orbax.

    python bench/bench_tpu.py --out DIR                 # on the TPU machine: every part
    python bench/bench_tpu.py --out DIR --smoke         # on CPU: the same code paths, tiny

Parts, each in a process of its own (one program holds a TPU chip at a time); each appends
JSON lines to DIR/results.jsonl, and ``report`` turns them into DIR/table.md:

* ``peak``: a bf16 matmul (8192^3) in the same process as the grid: the chip's own peak.
* ``grid``: the train step of each variant (remat policy, batch, attention kernel, splash
  block, scan unroll) on the base config (``1b`` with 8 layers: 618M parameters, the
  largest 1b-shaped model whose train state fits one v5e chip): compile time, median step
  time, MFU by MaxText's formula (``workload.config.step_flops``: learnable-weight matmuls
  plus causal attention counted half, x3 for forward and backward) against the spec peak
  (``--spec-tflops``, 197 for v5e) and the measured one, and the device memory the compiled
  step needs (XLA's memory analysis: arguments + outputs - aliased + temporaries).
* ``profile``: the ``--profile`` variant's step traced with ``jax.profiler``; time per XLA
  op on the device, summed over the traced steps, its largest ops and categories.
* ``ckpt``: on the ``--ckpt`` variants' fresh train state (a step between measurements, so
  no array's host copy is cached), how long each save blocks training: the host link alone
  (``jax.device_get`` from 4 threads), plain Orbax (``CheckpointManager`` +
  ``StandardSave``), xrun's ``Checkpoints`` with staging off and on; the commit time and the
  steps run while each is written.
* ``startup``: ``python -m workload.train`` from process start to its first step, cold (an
  empty compilation cache) and warm, with its startup phases.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SPEC_TFLOPS = {"TPU v5 lite": 197.0, "TPU v6 lite": 918.0, "TPU v5": 459.0, "TPU v4": 275.0}
BASE = "--preset 1b n_layers=8 global_batch=4"
GRID = [
    "remat=full",
    "remat=dots_no_batch",
    "remat=dots_no_batch splash_block=1024",
    "remat=dots_no_batch scan_unroll=0",
    "remat=full global_batch=8",
    "remat=none global_batch=2",
    "remat=dots_no_batch attention=xla",
]
SMOKE_BASE = "--preset tiny seq_len=128 global_batch=2 attention=einsum"
SMOKE_GRID = ["remat=full", "remat=dots_no_batch scan_unroll=0"]


def emit(out: Path, part: str, **fields: Any) -> None:
    line = json.dumps({"part": part, **fields}, default=str)
    print(line, flush=True)
    with open(out / "results.jsonl", "a") as f:
        f.write(line + "\n")


def parse_config(base: str, variant: str):
    from workload.config import arg_parser, load_config

    ns = arg_parser().parse_args((base + " " + variant).split())
    return load_config(ns.preset, ns.overrides)


# ---------------------------------------------------------------------------------------
# In one process: peak, grid, profile, ckpt


def measure_peak(smoke: bool) -> float:
    """bf16 matmul TFLOP/s, mean of 10 after a warm-up (random data)."""
    import jax
    import jax.numpy as jnp

    n = 1024 if smoke else 8192
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
    f = jax.jit(lambda a, b: a @ b)
    f(a, b).block_until_ready()
    t = time.perf_counter()
    for _ in range(10):
        c = f(a, b)
    c.block_until_ready()
    return 2 * n**3 * 10 / (time.perf_counter() - t) / 1e12


class Variant:
    """One config's program, state and batch on the devices."""

    def __init__(self, base: str, variant: str, state: Any = None):
        import jax

        from workload import data
        from workload.distributed import make_mesh
        from workload.train import INIT_COMPILER_OPTIONS, Program, init_key

        self.name = variant
        self.cfg = parse_config(base, variant)
        self.mesh = make_mesh(1)
        self.batch_size = self.cfg.batch_size(jax.device_count())
        t = time.perf_counter()
        self.program = Program(self.cfg, self.mesh, self.batch_size, compile_now=False)
        self.build_s = time.perf_counter() - t
        t = time.perf_counter()
        self.program.compile()
        self.compile_s = time.perf_counter() - t
        # Every variant has the same parameters: the first one's state serves the rest. The
        # first one's init is timed in its parts: trace and lower, compile, run.
        self.init_parts: dict[str, float] = {}
        if state is None:
            t = time.perf_counter()
            key = init_key(self.cfg.seed)
            lowered = self.program._jitted_init.lower(key)
            self.init_parts["init_lower_s"] = time.perf_counter() - t
            exe = lowered.compile(compiler_options=INIT_COMPILER_OPTIONS)
            self.init_parts["init_compile_s"] = time.perf_counter() - t - self.init_parts["init_lower_s"]
            self.program._init_exe = exe
            t1 = time.perf_counter()
            self.state = jax.block_until_ready(self.program.init())
            self.init_parts["init_run_s"] = time.perf_counter() - t1
            self.init_s: float | None = time.perf_counter() - t
        else:
            self.state, self.init_s = state, None
        source = data.make_source(self.cfg.data, self.cfg.data_dtype, self.cfg.seed,
                                  self.cfg.seq_len, self.cfg.vocab_size)
        self.batches = [data.make_batch(source, i * self.batch_size, self.batch_size,
                                        self.cfg.seq_len, self.program.batch_sharding)
                        for i in range(2)]
        self.steps_run = 0

    def step(self) -> float:
        """One step as the workload runs it (dispatch, wait for its outputs); seconds."""
        import jax

        t = time.perf_counter()
        self.state, out = self.program.train_step(self.state, self.batches[self.steps_run % 2])
        jax.device_get(out)
        self.steps_run += 1
        self.loss = float(out["loss"])
        return time.perf_counter() - t

    def memory(self) -> dict[str, float]:
        import jax

        m = self.program.train_step.memory_analysis()
        need = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
                + m.temp_size_in_bytes)
        stats = jax.local_devices()[0].memory_stats() or {}
        return {"compiled_gib": need / 2**30, "temp_gib": m.temp_size_in_bytes / 2**30,
                "state_gib": m.argument_size_in_bytes / 2**30,
                "in_use_gib": stats.get("bytes_in_use", 0) / 2**30,
                "process_peak_gib": stats.get("peak_bytes_in_use", 0) / 2**30,
                "limit_gib": stats.get("bytes_limit", 0) / 2**30}

    def close(self) -> Any:
        """Free everything but the state, which is returned (for the next variant)."""
        import jax

        state = self.state
        # Only this variant's own arrays: every live array but the state also takes the
        # constants that jitted kernels keep between programs (splash attention's block
        # masks), and the next variant's step then finds them deleted.
        for a in jax.tree.leaves(self.batches):
            a.delete()
        del self.state, self.batches, self.program
        gc.collect()
        return state


def run_grid(out: Path, args: argparse.Namespace, spec: float, peak: float) -> None:
    from workload.config import step_flops

    state = None
    for name in args.grid:
        try:
            v = Variant(args.base, name, state)
        except Exception as e:  # noqa: BLE001 - one variant's failure (OOM) is a result
            emit(out, "grid", base=args.base, variant=name,
                 error=f"{type(e).__name__}: {str(e)[:400]}")
            continue
        try:
            for _ in range(args.warmup):
                v.step()
            times = [v.step() for _ in range(args.steps)]
            step_s = statistics.median(times)
            flops = step_flops(v.cfg, v.batch_size, 1)["tflops_per_device"]
            choice = v.program.choice
            emit(out, "grid", base=args.base, variant=name, batch=v.batch_size,
                 choice=choice.to_dict() if choice else None, build_s=v.build_s,
                 compile_s=v.compile_s, init_s=v.init_s, step_s=step_s, min_step_s=min(times),
                 tflops=flops / step_s, mfu_spec=flops / step_s / spec,
                 mfu_measured=flops / step_s / peak, loss=v.loss,
                 tokens_per_s=v.batch_size * v.cfg.seq_len / step_s, **v.init_parts,
                 **v.memory())
            if name == args.profile:
                profile(out, v, args)
            if name in args.ckpt:
                checkpoint_compare(out, v, args)
        except Exception as e:  # noqa: BLE001
            emit(out, "grid", variant=name, error=f"{type(e).__name__}: {str(e)[:400]}",
                 trace=traceback.format_exc()[-1500:])
        finally:
            state = v.close()


def profile(out: Path, v: Variant, args: argparse.Namespace) -> None:
    """Trace ``args.profile_steps`` steps; time per device op from the trace's XSpace."""
    import jax
    from jax.profiler import ProfileData

    folder = Path(tempfile.mkdtemp(prefix="xrun-trace-"))
    jax.profiler.start_trace(str(folder))
    for _ in range(args.profile_steps):
        v.step()
    jax.profiler.stop_trace()
    files = sorted(folder.rglob("*.xplane.pb"))
    if not files:
        emit(out, "profile", variant=v.name, error="no .xplane.pb written")
        return
    data = ProfileData.from_file(str(files[-1]))
    planes = [p for p in data.planes if p.name.startswith("/device:")
              and "CPU" not in p.name] or [p for p in data.planes if p.name.startswith("/device:")]
    ops: dict[str, list[float]] = {}
    categories: dict[str, float] = {}
    lines_seen: dict[str, int] = {}
    sample_stats: dict[str, Any] = {}
    for plane in planes[:1]:
        for line in plane.lines:
            events = list(line.events)
            lines_seen[line.name] = len(events)
            if line.name not in ("XLA Ops", "Ops"):
                continue
            for ev in events:
                stats = dict(ev.stats)
                if not sample_stats:
                    sample_stats = {k: str(val)[:80] for k, val in stats.items()}
                ops.setdefault(ev.name, []).append(ev.duration_ns / 1e6)
                cat = str(stats.get("hlo_category") or stats.get("category") or "?")
                categories[cat] = categories.get(cat, 0.0) + ev.duration_ns / 1e6
    total = sum(sum(t) for t in ops.values())
    top = sorted(ops.items(), key=lambda kv: -sum(kv[1]))[:args.profile_top]
    emit(out, "profile", variant=v.name, steps=args.profile_steps,
         planes=[p.name for p in data.planes], lines=lines_seen, sample_stats=sample_stats,
         device_ms_per_step=total / args.profile_steps,
         categories={k: round(ms / args.profile_steps, 3) for k, ms in
                     sorted(categories.items(), key=lambda kv: -kv[1])},
         top=[{"op": k, "ms_per_step": round(sum(t) / args.profile_steps, 3),
               "count_per_step": len(t) / args.profile_steps,
               "pct": round(100 * sum(t) / total, 2) if total else 0.0} for k, t in top])
    if args.keep_trace and files[-1].stat().st_size < 15 << 20:
        (out / "trace.xplane.pb").write_bytes(files[-1].read_bytes())


def device_get_threads(state: Any, threads: int) -> float:
    """Seconds to copy every array of ``state`` to the host from ``threads`` threads."""
    import jax
    import numpy as np

    leaves = jax.tree.leaves(state)
    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(np.asarray, leaves))
    return time.perf_counter() - t


def steps_while(v: Variant, busy, limit: int = 60) -> tuple[list[float], float]:
    """Step times while ``busy()`` (a save being written), at most ``limit`` steps; and the
    longest a Python thread that only sleeps 1 ms at a time went unscheduled meanwhile (a
    step's wait that matches it is the GIL held by the writer, not the device)."""
    times: list[float] = []
    gaps: list[float] = [0.0]
    done = threading.Event()

    def probe() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps[0] = max(gaps[0], now - last - 0.001)
            last = now

    import jax

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    try:
        # As workload.train runs: the next step dispatched before this one's results are read;
        # a step's time runs from the previous one's results to its own.
        last = time.perf_counter()
        v.state, out = v.program.train_step(v.state, v.batches[v.steps_run % 2])
        while True:
            v.steps_run += 1
            more = busy() and len(times) < limit
            if more:
                v.state, following = v.program.train_step(v.state, v.batches[v.steps_run % 2])
            v.loss = float(jax.device_get(out)["loss"])
            now = time.perf_counter()
            times.append(now - last)
            last = now
            if not more:
                break
            out = following
    finally:
        done.set()
        thread.join()
    return times, gaps[0]


def checkpoint_compare(out: Path, v: Variant, args: argparse.Namespace) -> None:
    """Blocking time of a save of the same (fresh) state: the link, plain Orbax, xrun."""
    import jax
    import orbax.checkpoint as ocp

    from workload.checkpointing import Checkpoints
    from workload.metrics import Metrics
    from workload.train import staging_budget
    from xrun_contract.storage import open_storage

    gc.freeze()  # as workload.train does before its loop: the collector skips startup's objects
    steady = statistics.median([v.step() for _ in range(5)])
    state_gib = sum(a.nbytes for a in jax.tree.leaves(v.state)) / 2**30
    root = Path(args.ckpt_dir or tempfile.mkdtemp(prefix="xrun-ckpt-"))
    metrics = Metrics(None, None, 0, True)
    results: dict[str, Any] = {"variant": v.name, "state_gib": state_gib, "steady_step_s": steady}
    for round_ in range(args.ckpt_rounds):
        v.step()  # fresh arrays: nothing cached on the host
        results[f"link_4threads_s_{round_}"] = device_get_threads(v.state, 4)
        v.step()
        # Plain Orbax, as its docs show it.
        mgr = ocp.CheckpointManager(root / f"orbax-{round_}", options=ocp.CheckpointManagerOptions(
            enable_async_checkpointing=True))
        t, t_wall = time.perf_counter(), time.time()
        mgr.save(v.steps_run, args=ocp.args.StandardSave(v.state))
        results[f"orbax_blocked_s_{round_}"] = time.perf_counter() - t
        during, gap = steps_while(v, mgr.is_saving_in_progress)
        mgr.wait_until_finished()
        results[f"orbax_commit_s_{round_}"] = time.time() - t_wall
        results[f"orbax_steps_during_{round_}"] = [round(s, 4) for s in during]
        results[f"orbax_python_gap_s_{round_}"] = round(gap, 4)
        mgr.close()
        shutil.rmtree(root / f"orbax-{round_}", ignore_errors=True)
        # xrun as before (Orbax's own serial copy), the copy from threads, staging and threads.
        for label, stage_gib, threads in (("xrun_threads", 0.0, 4), ("xrun_staged", -1.0, 4)):
            v.step()
            cfg = v.cfg.__class__(**{**v.cfg.to_dict(), "checkpoint_stage_gib": stage_gib,
                                     "checkpoint_copy_threads": threads})
            ck = Checkpoints(open_storage(str(root)), f"{label}-{round_}", cfg, metrics,
                             staging_budget=lambda cfg=cfg: staging_budget(cfg, v.program))
            ck.restore_latest(v.program.abstract_state)
            t_wall = time.time()
            blocked = ck._save(v.steps_run, v.state, {"position": 0})
            results[f"{label}_blocked_s_{round_}"] = blocked
            if ck.staging is not None:
                results[f"{label}_staged_gib_{round_}"] = ck.staging.staged_bytes / 2**30
                results[f"{label}_budget_gib_{round_}"] = (ck.staging.budget or 0) / 2**30
            results[f"{label}_copy_s_{round_}"] = ck.copy_s
            during, gap = steps_while(v, ck.manager.is_saving_in_progress)
            ck.manager.wait_until_finished()
            results[f"{label}_commit_s_{round_}"] = time.time() - t_wall
            results[f"{label}_steps_during_{round_}"] = [round(s, 4) for s in during]
            results[f"{label}_python_gap_s_{round_}"] = round(gap, 4)
            ck.pending = None
            if ck.staging is not None:
                ck.staging.release()
            ck.close()
            shutil.rmtree(root / f"{label}-{round_}", ignore_errors=True)
        emit(out, "ckpt", **results)


def compile_times(out: Path, args: argparse.Namespace) -> None:
    """In one fresh process: what XLA takes to compile each program of the base config, what
    loading them from the executable cache takes, and what init's compile is made of."""
    import jax
    import numpy as np

    from workload.distributed import make_mesh
    from workload.train import INIT_COMPILER_OPTIONS, Program, init_key

    cfg = parse_config(args.base, args.startup)
    mesh = make_mesh(1)
    batch = cfg.batch_size(jax.device_count())
    def timed(name: str, fn: Any) -> Any:
        t = time.perf_counter()
        result = fn()
        emit(out, "compile", step=name, seconds=round(time.perf_counter() - t, 3))
        return result

    timed("trivial", lambda: jax.jit(lambda x: x + 1).lower(np.float32(1)).compile())
    program = timed("build", lambda: Program(cfg, mesh, batch, compile_now=False))
    key = init_key(cfg.seed)
    init = timed("init", lambda: program._jitted_init.lower(key).compile(
        compiler_options=INIT_COMPILER_OPTIONS))
    step = timed("train_step", program.compile)
    # A warm start loads both from the executable cache (workload.executables): their size
    # and the time to load them, one after the other and in two threads.
    from jax.experimental import serialize_executable as se

    stored = {}
    for name, exe in (("init", init), ("train_step", step)):
        stored[name] = timed(f"{name}_serialize", lambda exe=exe: se.serialize(exe))
        emit(out, "compile", step=f"{name}_serialized_mib", seconds=0.0,
             mib=round(len(stored[name][0]) / 2**20, 1))
        timed(f"{name}_load", lambda name=name: se.deserialize_and_load(*stored[name]))
    with ThreadPoolExecutor(2) as pool:
        timed("both_load_in_threads", lambda: [j.result() for j in [
            pool.submit(se.deserialize_and_load, *stored[n]) for n in stored]])
    # What init's compile is made of: one of its random arrays alone, and the whole of it
    # with the hardware generator (jax's "rbg" keys: other values than threefry's).
    shape = (cfg.n_layers, cfg.d_model, cfg.mlp_dim)
    timed("one_truncated_normal", lambda: jax.jit(
        lambda k: jax.random.truncated_normal(jax.random.wrap_key_data(k), -2.0, 2.0, shape)
    ).lower(key).compile())
    jax.config.update("jax_default_prng_impl", "rbg")
    rbg = Program(cfg, mesh, batch, compile_now=False)
    timed("init_rbg", lambda: rbg._jitted_init.lower(init_key(cfg.seed)).compile(
        compiler_options=INIT_COMPILER_OPTIONS))


def compile_probe(out: Path, args: argparse.Namespace) -> None:
    """What the compiler's settings and the attention kernel change: the train step compiled
    at XLA's default and at its lowest execution-time effort (``jax_exec_time_optimization_
    effort=-1``), with splash and with XLA attention, each then run for its step time; and
    init at the lowest effort. The state is zeros (only times are compared)."""
    import jax
    import jax.numpy as jnp

    from workload import data
    from workload.distributed import make_mesh
    from workload.train import INIT_COMPILER_OPTIONS, Program, init_key

    mesh = make_mesh(1)
    state = None
    for label, variant, effort in (("splash", "", 0.0), ("splash", "", -1.0),
                                   ("xla", "attention=xla", -1.0), ("xla", "attention=xla", 0.0)):
        cfg = parse_config(args.base, args.startup + " " + variant)
        batch_size = cfg.batch_size(jax.device_count())
        program = Program(cfg, mesh, batch_size, compile_now=False)
        jax.config.update("jax_exec_time_optimization_effort", effort)
        try:
            t = time.perf_counter()
            step = program.compile()
            compile_s = time.perf_counter() - t
            if state is None:
                state = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype, device=a.sharding),
                                     program.abstract_state)
            source = data.make_source(cfg.data, cfg.data_dtype, cfg.seed, cfg.seq_len,
                                      cfg.vocab_size)
            batch = data.make_batch(source, 0, batch_size, cfg.seq_len, program.batch_sharding)
            times = []
            for _ in range(6):
                t = time.perf_counter()
                state, o = step(state, batch)
                jax.block_until_ready(o)
                times.append(time.perf_counter() - t)
            emit(out, "compile_probe", program="train_step", attention=label, effort=effort,
                 compile_s=round(compile_s, 3), step_s=round(statistics.median(times[2:]), 4))
            if label == "splash" and effort == -1.0:
                t = time.perf_counter()
                program._jitted_init.lower(init_key(cfg.seed)).compile(
                    compiler_options=INIT_COMPILER_OPTIONS)
                emit(out, "compile_probe", program="init", effort=effort,
                     compile_s=round(time.perf_counter() - t, 3))
        finally:
            jax.config.update("jax_exec_time_optimization_effort", 0.0)


def in_process(out: Path, args: argparse.Namespace) -> None:
    import jax

    device = jax.devices()[0]
    spec = args.spec_tflops or SPEC_TFLOPS.get(device.device_kind, 0.0) or 1.0
    peak = measure_peak(args.smoke)
    emit(out, "peak", device=device.device_kind, platform=device.platform, jax=jax.__version__,
         spec_tflops=spec, matmul_tflops=peak, matmul_pct_of_spec=100 * peak / spec)
    run_grid(out, args, spec, peak)


# ---------------------------------------------------------------------------------------
# Startup: separate processes


BARE = ("import time; t = time.time(); import jax; i = time.time(); jax.devices(); "
        "print(i - t, time.time() - i)")


def meminfo() -> dict[str, int]:
    """The host's memory, MiB: free, page cache, dirty and under writeback, anonymous (and of
    it in transparent huge pages)."""
    want = {"MemFree", "Cached", "Dirty", "Writeback", "AnonPages", "AnonHugePages"}
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in want:
            out[name] = int(rest.split()[0]) // 1024
    return out


def sampled(argv: list[str], env: dict[str, str], timeout: float) -> tuple[Any, list[Any]]:
    """Run ``argv`` to its end, sampling ``meminfo()`` every half second meanwhile."""
    samples: list[Any] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            samples.append([round(time.time(), 2), meminfo()])

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout), samples
    finally:
        done.set()
        thread.join()


def startup(out: Path, args: argparse.Namespace) -> None:
    """A cold run (empty caches), then a bare process (``import jax`` and ``jax.devices()``,
    the floor) and a warm run back to back. With ``--saves-steps`` the cold run trains that
    many steps with saves (its figures: ``saves_while_training``; the host's memory sampled
    meanwhile) and the warm one the same program without saves (one program key: the
    checkpoint cadence is not part of it). With ``--env``, a bare process and the run with
    saves again (warm) with those variables set: what the environment changes."""
    cache = Path(args.cache or tempfile.mkdtemp(prefix="xrun-cc-"))
    storage = Path(tempfile.mkdtemp(prefix="xrun-st-"))
    steps = args.saves_steps or 3
    cmd = [sys.executable, "-m", "workload.train", *args.base.split(), *args.startup.split(),
           f"steps={steps}"]
    env = {**os.environ, "XRUN_COMPILATION_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}
    extra = dict(kv.split("=", 1) for kv in args.env)
    kinds = [("cold", {}), ("bare", {}), ("warm", {})]
    if extra:
        kinds += [("bare_env", extra), ("saves_env", extra)]
    for kind, more in kinds:
        saves = kind in ("cold", "saves_env") and args.saves_steps
        every = args.saves_every if saves else 0
        argv = ([sys.executable, "-c", BARE] if kind.startswith("bare") else
                [*cmd, f"checkpoint_every={every}", "--storage", str(storage), "--run-name", kind])
        t = time.time()
        try:
            proc, memory = sampled(argv, {**env, **more}, args.startup_timeout)
        except subprocess.TimeoutExpired:
            emit(out, "startup", kind=kind, error=f"timed out after {args.startup_timeout} s")
            continue
        wall = time.time() - t
        if kind.startswith("bare"):
            parts = proc.stdout.split()
            emit(out, "startup", kind=kind, env=more, rc=proc.returncode, wall_s=wall,
                 first_step_s=None, phases={"import_jax": float(parts[0]),
                                            "devices": float(parts[1])}
                 if len(parts) == 2 else {}, tail=proc.stderr[-500:] if proc.returncode else "")
            continue
        records = metric_records(storage / "runs" / kind / "metrics")
        phases = {}
        for rec in records:
            if "phase" in rec and "seconds" in rec:
                phases[rec["phase"]] = round(rec["seconds"], 3)
                if rec.get("began") is not None:
                    phases[rec["phase"] + "_began"] = round(rec["began"], 3)
                if rec.get("source"):
                    phases[rec["phase"] + "_source"] = rec["source"]
        emit(out, "startup", kind=kind, env=more, rc=proc.returncode, wall_s=wall,
             first_step_s=phases.get("first_step"), phases=phases,
             tail=(proc.stdout + proc.stderr)[-1500:] if proc.returncode else "",
             **run_steps(records), **(saves_while_training(records) if every else {}),
             **({"meminfo": memory} if every else {}))


def metric_records(metrics: Path) -> list[dict[str, Any]]:
    """A run's metrics records, in the order its writer wrote them."""
    return [json.loads(line) for f in sorted(metrics.glob("*.jsonl"))
            for line in f.read_text().splitlines() if line.strip()]


def run_steps(records: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's last three losses, and the steps its quick executable ran (quick_compile) with
    their median time."""
    steps = [r for r in records if r.get("kind") == "step"]
    quick = [r["seconds"] for r in steps if r.get("quick")]
    return {"last_losses": [round(r["loss"], 4) for r in steps[-3:]], "quick_steps": len(quick),
            "quick_step_s": round(statistics.median(quick), 4) if quick else None}


def saves_while_training(records: list[dict[str, Any]]) -> dict[str, Any]:
    """From a run's metrics: the median step with no save being written (steps 3 on) and the
    steps that ended while one was (from its "started" to its "committed": the commit is
    noticed at a step boundary, so that step counts), with each save's blocked time."""
    steps = [r for r in records if r.get("kind") == "step"]
    started = {r["step"]: r["time"] for r in records
               if r.get("kind") == "checkpoint" and r.get("event") == "started"}
    spans = [(started[r["step"]], started[r["step"]] + r["seconds"], r["step"]) for r in records
             if r.get("kind") == "checkpoint" and r.get("event") == "committed"
             and r["step"] in started]
    blocked = {r["step"]: round(r["seconds"], 3) for r in records
               if r.get("kind") == "checkpoint" and r.get("event") == "blocked"}
    copy = {r["step"]: r.get("copy_s") for r in records
            if r.get("kind") == "checkpoint" and r.get("event") == "blocked"}
    during: list[float] = []
    steady: list[float] = []
    for r in steps[2:]:
        if r.get("checkpoint_blocked_s") or r.get("quick"):
            continue  # the saving step: its time is the step's; the save's is "blocked"
        inside = any(a < r["time"] <= b for a, b, _ in spans)
        (during if inside else steady).append(r["seconds"])
    return {"steady_step_s": statistics.median(steady) if steady else None,
            "steps_during": [round(x, 4) for x in during], "blocked_s": blocked,
            "copy_s": copy, "save_times": {r["step"]: r["time"] for r in records
                                           if r.get("kind") == "checkpoint"
                                           and r.get("event") == "started"},
            "commit_s": {s: round(b - a, 2) for a, b, s in spans},
            "losses": [round(r["loss"], 4) for r in steps[-3:]]}


# ---------------------------------------------------------------------------------------
# Report


def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:.0f}"
    return str(x)


def report(out: Path) -> str:
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines() if x.strip()]
    lines = []
    for r in rows:
        if r["part"] == "peak":
            lines += [f"Device {r['device']} ({r['platform']}), jax {r['jax']}: bf16 matmul "
                      f"{r['matmul_tflops']:.1f} TFLOP/s = {r['matmul_pct_of_spec']:.1f}% of the "
                      f"{r['spec_tflops']:.0f} TFLOP/s spec.", ""]
    grid = [r for r in rows if r["part"] == "grid"]
    if grid:
        lines += ["| base | variant | batch | step s | TFLOP/s | MFU (spec) | MFU (measured peak) | "
                  "compiled step GiB | build + compile s | loss |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in grid:
            base = r.get("base") or ""
            name = r["variant"] or "(none: the preset's remat=auto)"
            if r.get("choice"):
                c = r["choice"]
                name += f" -> remat={c['remat']} micro_batches={c['micro_batches']}"
            if "error" in r:
                lines.append(f"| {base} | {name} | | error: {r['error'][:120]} | | | | | | |")
                continue
            lines.append(f"| {base} | {name} | {r['batch']} | {r['step_s']:.4f} | "
                         f"{r['tflops']:.1f} | {100 * r['mfu_spec']:.1f}% | "
                         f"{100 * r['mfu_measured']:.1f}% | {r['compiled_gib']:.2f} | "
                         f"{r['build_s'] + r['compile_s']:.1f} | {r['loss']:.4f} |")
        lines.append("")
        for r in [r for r in grid if r.get("init_s") is not None][:1]:
            lines += [f"Init, {r['variant']}: {r['init_s']:.1f} s (trace and lower "
                      f"{fmt(r.get('init_lower_s'))}, compile {fmt(r.get('init_compile_s'))}, "
                      f"run {fmt(r.get('init_run_s'))} s); step compile {r['compile_s']:.1f} s",
                      ""]
    for r in rows:
        if r["part"] == "ckpt":
            lines += [f"Checkpoint, {r['variant']} (state {r['state_gib']:.2f} GiB, steady step "
                      f"{r['steady_step_s']:.4f} s):", ""]
            lines += ["| route | blocked s | of it, staging + host copy s | commit s | "
                      "steps while written: n, mean, max s | longest Python thread gap s |",
                      "|---|---|---|---|---|---|"]
            rounds = sorted({k.rsplit("_", 1)[1] for k in r if k.startswith("orbax_blocked")})
            for i in rounds:
                lines.append(f"| host link, 4 threads (round {i}) | "
                             f"{fmt(r.get(f'link_4threads_s_{i}'))} | | | | |")
                labels = [k[:-len(f"_blocked_s_{i}")] for k in r if k.endswith(f"_blocked_s_{i}")]
                for label in labels:
                    during = r.get(f"{label}_steps_during_{i}") or []
                    staged = r.get(f"{label}_staged_gib_{i}")
                    mean = statistics.mean(during) if during else None
                    lines.append(f"| {label}{f' ({staged:.2f} GiB staged)' if staged else ''} "
                                 f"(round {i}) | {fmt(r.get(f'{label}_blocked_s_{i}'))} | "
                                 f"{fmt(r.get(f'{label}_copy_s_{i}'))} | "
                                 f"{fmt(r.get(f'{label}_commit_s_{i}'))} | "
                                 f"{len(during)}, {fmt(mean)}, {fmt(max(during) if during else None)} | "
                                 f"{fmt(r.get(f'{label}_python_gap_s_{i}'))} |")
            lines.append("")
    compiles = [r for r in rows if r["part"] == "compile" and "step" in r]
    if compiles:
        lines += ["Compile times in one fresh process: " + ", ".join(
            f"{r['step']} {r['mib']} MiB" if "mib" in r else f"{r['step']} {r['seconds']:.1f} s"
            for r in compiles), ""]
    for r in rows:
        if r["part"] == "startup" and "error" not in r:
            lines.append(f"Startup {r['kind']}: first step at {fmt(r['first_step_s'])} s "
                         f"(rc {r['rc']}); phases {r['phases']}")
            if r.get("last_losses"):
                lines.append(f"  last losses {r['last_losses']}; {r.get('quick_steps', 0)} steps "
                             f"on the quick executable (median {fmt(r.get('quick_step_s'))} s)")
            if r.get("copy_s"):
                lines.append(f"  of the blocked seconds, copying the state out: {r['copy_s']}")
            if r.get("steps_during") is not None:
                during, steady = r["steps_during"], r.get("steady_step_s")
                mean = statistics.mean(during) if during else None
                lines.append(
                    f"  saves in a training run: steady step {fmt(steady)} s; "
                    f"{len(during)} steps while written, mean {fmt(mean)} s "
                    f"({fmt(mean / steady if mean and steady else None)}x steady), max "
                    f"{fmt(max(during) if during else None)} s; blocked {r['blocked_s']}; "
                    f"commit {r['commit_s']}; last losses {r['losses']}")
    for r in rows:
        if r["part"] == "profile" and "top" in r:
            lines += ["", f"Profile of {r['variant']}: {r['device_ms_per_step']:.1f} ms of device "
                      f"ops per step; categories {r['categories']}", "",
                      "| op | ms/step | % |", "|---|---|---|"]
            lines += [f"| {o['op'][:90]} | {o['ms_per_step']} | {o['pct']} |" for o in r["top"]]
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--part", choices=["all", "chip", "compile", "compile-probe", "startup",
                                      "report"],
                   default="all")
    p.add_argument("--smoke", action="store_true", help="CPU: tiny config, same code paths")
    p.add_argument("--base", default=None)
    p.add_argument("--grid", action="append", default=None)
    p.add_argument("--profile", default=None, help="variant to trace (default: the second)")
    p.add_argument("--ckpt", action="append", default=None, help="variants to save (default: "
                   "the first two)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--profile-top", type=int, default=40)
    p.add_argument("--keep-trace", action="store_true")
    p.add_argument("--ckpt-rounds", type=int, default=2)
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--spec-tflops", type=float, default=0.0)
    p.add_argument("--startup", default="remat=full", help="overrides of the startup runs")
    p.add_argument("--startup-timeout", type=float, default=240)
    p.add_argument("--saves-steps", type=int, default=0,
                   help="startup: runs of this many steps, the cold one with saves (0: 3 steps, "
                   "no saves)")
    p.add_argument("--saves-every", type=int, default=50)
    p.add_argument("--cache", default=None, help="startup: the compilation cache (default: a "
                   "new temporary folder)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="startup: a bare process and the run with saves again with these set")
    p.add_argument("--chip-timeout", type=float, default=540)
    args = p.parse_args(argv)
    args.base = args.base or (SMOKE_BASE if args.smoke else BASE)
    args.grid = args.grid or (SMOKE_GRID if args.smoke else GRID)
    args.profile = args.profile or args.grid[min(1, len(args.grid) - 1)]
    args.ckpt = args.ckpt or args.grid[:2]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.part == "chip":
        in_process(args.out, args)
        return 0
    if args.part == "startup":
        startup(args.out, args)
        return 0
    if args.part == "compile":
        compile_times(args.out, args)
        return 0
    if args.part == "compile-probe":
        compile_probe(args.out, args)
        return 0
    if args.part == "all":
        given = list(argv if argv is not None else sys.argv[1:])
        own = [a for i, a in enumerate(given) if a != "--part" and (i == 0 or given[i - 1] != "--part")]
        for part, limit in (("chip", args.chip_timeout),
                            ("startup", 2 * args.startup_timeout + 30)):
            try:
                subprocess.run([sys.executable, __file__, *own, "--part", part], cwd=REPO,
                               timeout=limit, check=False)
            except subprocess.TimeoutExpired:
                emit(args.out, part, error=f"timed out after {limit:.0f} s")
    print(report(args.out))
    return 0


if __name__ == "__main__":
    threading.excepthook = lambda a: traceback.print_exception(a.exc_value)
    sys.exit(main())
