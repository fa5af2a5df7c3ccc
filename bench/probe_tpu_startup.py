"""Where a cold TPU start's time goes, and what can run while the chip opens (#37).

Each experiment is a fresh process (the chip opens once per process), run one after another:

    python bench/probe_tpu_startup.py --out DIR [--exp attached overlap baseline cpu_init]

- attached: how long `make_pjrt_tpu_topology` (a compile-only TPU topology, no chip) and then
  `jax.devices()` take; whether a compile-only topology's fingerprint and platform version
  match the attached chip's; a tiny function compiled for the topology, serialized, loaded
  onto the chip and run.
- overlap: the chip opens in a thread while the main thread builds the 618M program for a
  compile-only topology and compiles its quick train step and init there; then both load
  onto the chip, init runs and the first step: the timeline, and the first loss.
- baseline: the same program the way the workload starts today (chip first, then compile).
- cpu_init: the initial state computed by the host's CPU backend and put onto the chip.

One JSON line per experiment in DIR/probe-startup.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

T0 = time.time()
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# PROBE_PRESET / PROBE_CONFIG (a smoke test on CPU: tiny, "global_batch=4").
PRESET = os.environ.get("PROBE_PRESET", "1b")
CONFIG = os.environ.get("PROBE_CONFIG",
                        "n_layers=8 global_batch=4 remat=dots_no_batch scan_unroll=0").split()
TOPOLOGIES = [("v5e:1x1", (1, 1, 1)), ("v5e:2x2", (2, 2, 1))]


def at() -> float:
    return round(time.time() - T0, 3)


def topology(name: str, bounds: tuple[int, int, int]):
    from jax._src import xla_bridge as xb

    return xb.make_pjrt_tpu_topology(name, chip_config_name="default",
                                     chips_per_host_bounds=bounds,
                                     wrap=(False, False, False))._make_compile_only_devices()


def program_for(devices, record: dict):
    import numpy as np
    from jax.sharding import AxisType, Mesh

    from workload.config import load_config
    from workload.train import Program

    cfg = load_config(PRESET, CONFIG)
    mesh = Mesh(np.array(devices).reshape(1, len(devices)), ("data", "fsdp"),
                axis_types=(AxisType.Auto, AxisType.Auto))
    t = time.time()
    program = Program(cfg, mesh, cfg.batch_size(len(devices)), compile_now=False)
    record["build_s"] = round(time.time() - t, 3)
    return cfg, program


def exp_attached(record: dict) -> None:
    import jax
    import jax.numpy as jnp
    from jax._src.lib import xla_client as xc
    from jax.experimental import serialize_executable as se
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    record["import_jax"] = at()
    record["env"] = {k: v for k, v in os.environ.items() if k.startswith(("TPU_", "JAX_"))}
    topos = {}
    for name, bounds in TOPOLOGIES:
        t = time.time()
        try:
            topos[name] = topology(name, bounds)
            record[f"topology {name} s"] = round(time.time() - t, 3)
        except Exception as e:  # noqa: BLE001
            record[f"topology {name} error"] = repr(e)[:300]
    record["topologies_done"] = at()
    t = time.time()
    devices = jax.devices()
    record["devices_s"] = round(time.time() - t, 3)
    record["devices"] = [str(d) for d in devices]
    record["device_kind"] = devices[0].device_kind
    record["coords"] = [list(getattr(d, "coords", [])) for d in devices]
    ref = xc.get_topology_for_devices(devices)
    record["attached_platform_version"] = ref.platform_version
    record["attached_fingerprint"] = str(ref.fingerprint())
    for name, tdev in topos.items():
        try:
            topo = xc.get_topology_for_devices(tdev)
            record[f"{name} fingerprint"] = str(topo.fingerprint())
            record[f"{name} matches"] = topo.fingerprint() == ref.fingerprint()
            record[f"{name} platform_version"] = topo.platform_version
        except Exception as e:  # noqa: BLE001
            record[f"{name} fingerprint error"] = repr(e)[:300]
    for name, tdev in topos.items():
        try:
            mesh = jax.sharding.Mesh(tdev[:1], ("x",))
            x = jax.ShapeDtypeStruct((16, 16), jnp.float32,
                                     sharding=NamedSharding(mesh, P("x", None)))
            t = time.time()
            compiled = jax.jit(lambda a: a * a + 1.0).lower(x).compile()
            payload, it, ot = se.serialize(compiled)
            loaded = se.deserialize_and_load(payload, it, ot, execution_devices=devices[:1])
            real = jax.device_put(jnp.arange(256, dtype=jnp.float32).reshape(16, 16),
                                  NamedSharding(jax.sharding.Mesh(devices[:1], ("x",)),
                                                P("x", None)))
            out = loaded(real)
            record[f"{name} tiny aot"] = {
                "s": round(time.time() - t, 3),
                "ok": bool(jnp.all(out == real * real + 1.0))}
        except Exception as e:  # noqa: BLE001
            record[f"{name} tiny aot error"] = repr(e)[:500]


def run_first_step(program, record: dict, init_exe, step_exe, label: str) -> None:
    import jax
    import numpy as np

    from workload.train import init_key

    t = time.time()
    state = init_exe(init_key(program.cfg.seed))
    jax.block_until_ready(state)
    record[f"{label}init_run_s"] = round(time.time() - t, 3)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, program.cfg.vocab_size, (program.global_batch,
                                                       program.cfg.seq_len + 1), dtype=np.int32)
    batch = jax.device_put(tokens, program.batch_sharding)
    t = time.time()
    state, out = step_exe(state, batch)
    record[f"{label}first_loss"] = float(out["loss"])
    record[f"{label}first_step_s"] = round(time.time() - t, 3)
    record[f"{label}first_step_at"] = at()


def start_compiles(program, lowered, key) -> tuple[dict, list[threading.Thread]]:
    """The quick train step and init compiled side by side, as the workload does, each in a
    thread (started here, joined by the caller): results["step"], ["init"] and their times."""
    from workload.train import INIT_COMPILER_OPTIONS, QUICK_COMPILER_OPTIONS

    results: dict = {}

    def compile_quick() -> None:
        t = time.time()
        results["step"] = lowered.compile(compiler_options=QUICK_COMPILER_OPTIONS)
        results["step_s"] = round(time.time() - t, 3)
        results["step_at"] = at()

    def compile_init() -> None:
        t = time.time()
        results["init"] = program._jitted_init.lower(key).compile(
            compiler_options=INIT_COMPILER_OPTIONS)
        results["init_s"] = round(time.time() - t, 3)
        results["init_at"] = at()

    threads = [threading.Thread(target=compile_quick), threading.Thread(target=compile_init)]
    for th in threads:
        th.start()
    return results, threads


def exp_overlap(record: dict) -> None:
    import jax
    import numpy as np
    from jax.experimental import serialize_executable as se

    record["import_jax"] = at()
    import flax  # noqa: F401 - imports while nothing else runs, for the timeline
    import optax  # noqa: F401

    record["imports"] = at()
    name, bounds = TOPOLOGIES[0]
    tdev = topology(name, bounds)[:1]
    record["topology"] = at()
    opened: dict = {}

    def open_chip() -> None:
        t = time.time()
        opened["devices"] = jax.devices()
        opened["s"] = round(time.time() - t, 3)
        opened["at"] = at()

    thread = threading.Thread(target=open_chip)
    thread.start()
    cfg, program = program_for(tdev, record)
    record["built"] = at()
    lowered = program._lower_step()
    record["lowered"] = at()
    # The key's shape, not its value: jax.random.key() would wait for the chip.
    results, threads = start_compiles(program, lowered, jax.ShapeDtypeStruct((2,), np.uint32))
    thread.join()
    record["chip_open_s"], record["chip_open_at"] = opened["s"], opened["at"]
    for th in threads:
        th.join()
    record.update({k: v for k, v in results.items() if k.endswith(("_s", "_at"))})
    devices = opened["devices"][:1]
    loaded: dict = {}

    def load(key: str) -> None:
        t = time.time()
        payload, it, ot = se.serialize(results[key])
        loaded[key] = se.deserialize_and_load(payload, it, ot, execution_devices=devices)
        loaded[key + "_load_s"] = round(time.time() - t, 3)

    loaders = [threading.Thread(target=load, args=(k,)) for k in ("init", "step")]
    for th in loaders:
        th.start()
    for th in loaders:
        th.join()
    record["init_load_s"], record["step_load_s"] = loaded["init_load_s"], loaded["step_load_s"]
    record["loaded_at"] = at()
    # The real program (the chip's mesh) for the batch sharding; its functions are not used.
    _, real = program_for(devices, {})
    run_first_step(real, record, loaded["init"], loaded["step"], "")


def exp_baseline(record: dict) -> None:
    import jax

    from workload.train import init_key

    record["import_jax"] = at()
    import flax  # noqa: F401
    import optax  # noqa: F401

    record["imports"] = at()
    devices = jax.devices()[:1]
    record["chip_open_at"] = at()
    cfg, program = program_for(devices, record)
    record["built"] = at()
    lowered = program._lower_step()
    record["lowered"] = at()
    results, threads = start_compiles(program, lowered, init_key(cfg.seed))
    for th in threads:
        th.join()
    record.update({k: v for k, v in results.items() if k.endswith(("_s", "_at"))})
    run_first_step(program, record, results["init"], results["step"], "")


def exp_cpu_init(record: dict) -> None:
    import jax
    import numpy as np

    from workload.train import INIT_COMPILER_OPTIONS, init_key

    devices = jax.devices()[:1]
    record["chip_open_at"] = at()
    cfg, cpu_program = program_for(jax.devices("cpu")[:1], record)
    t = time.time()
    exe = cpu_program._jitted_init.lower(init_key(cfg.seed)).compile(
        compiler_options=INIT_COMPILER_OPTIONS)
    record["cpu_init_compile_s"] = round(time.time() - t, 3)
    t = time.time()
    state = exe(init_key(cfg.seed))
    jax.block_until_ready(state)
    record["cpu_init_run_s"] = round(time.time() - t, 3)
    _, tpu_program = program_for(devices, {})
    t = time.time()
    on_chip = jax.device_put(state, tpu_program.state_shardings)
    jax.block_until_ready(on_chip)
    record["device_put_s"] = round(time.time() - t, 3)
    t = time.time()
    tpu_exe = tpu_program._jitted_init.lower(init_key(cfg.seed)).compile(
        compiler_options=INIT_COMPILER_OPTIONS)
    record["tpu_init_compile_s"] = round(time.time() - t, 3)
    tpu_state = tpu_exe(init_key(cfg.seed))
    same = [bool(np.array_equal(np.asarray(a), np.asarray(b)))
            for a, b in zip(jax.tree.leaves(state["params"]),
                            jax.tree.leaves(tpu_state["params"]), strict=True)]
    record["params_bitwise_equal"] = f"{sum(same)}/{len(same)}"


EXPERIMENTS = {"attached": exp_attached, "overlap": exp_overlap, "baseline": exp_baseline,
               "cpu_init": exp_cpu_init}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--exp", nargs="+", default=list(EXPERIMENTS))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=150)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        record: dict = {"exp": args.one}
        try:
            EXPERIMENTS[args.one](record)
        except Exception as e:  # noqa: BLE001
            record["error"] = repr(e)[:800]
            record["traceback"] = traceback.format_exc()[-2000:]
        record["wall_s"] = at()
        print(json.dumps(record), flush=True)
        with open(args.out / "probe-startup.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        os._exit(0)
    for exp in args.exp:
        try:
            subprocess.run([sys.executable, __file__, "--out", str(args.out), "--one", exp],
                           timeout=args.timeout, check=False)
        except subprocess.TimeoutExpired:
            with open(args.out / "probe-startup.jsonl", "a") as f:
                f.write(json.dumps({"exp": exp, "error": "timeout"}) + "\n")


if __name__ == "__main__":
    main()
