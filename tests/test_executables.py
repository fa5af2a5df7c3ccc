"""The executable cache (workload/executables.py): a warm start loads the compiled ``init``
and train step instead of tracing, lowering and looking them up in JAX's cache, and trains
exactly as a compiled program does; entries made from JAX's own cache entries run; bad
entries are misses; anything that changes the program changes the key.

Each run is a fresh Python process (JAX's cache settings are process-wide), one host with 2
CPU devices. JAX's cache keys hold the cache folder's path (the XLA autotune cache folder
under it, ``jax_persistent_cache_enable_xla_caches``, is one of the compile options), so a
test that needs JAX's cache warm runs in the folder the cold run wrote, never in a copy of
it. That two hosts train identically from loaded executables (and restore into their
shardings) is checked in test_workload_hosts.py (kill and resume).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from workload_helpers import TEST_XLA_FLAGS

REPO = Path(__file__).resolve().parent.parent

# Both scripts' start: the checkout first, 2 CPU devices, JAX's cache in argv[2] for all, and
# XLA's backend at the tests' optimisation level (workload_helpers.TEST_XLA_FLAGS): every run
# here compiles from scratch on purpose, a third of the CPU at that level; each test compares
# runs made with the same flags, and the flags are part of both caches' keys.
PRELUDE = rf"""
import hashlib, json, os, sys
sys.path.insert(0, sys.argv[1])
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2 {TEST_XLA_FLAGS}"
import jax
jax.config.update("jax_platforms", "cpu")
from workload.distributed import use_compilation_cache
use_compilation_cache(sys.argv[2])
"""

SCRIPT = PRELUDE + r"""
import numpy as np
from workload import data
from workload.config import load_config
from workload.distributed import make_mesh
from workload.executables import Executables, program_key
from workload.train import Program
from xrun_contract.storage import open_storage

quick = "--quick-first" in sys.argv  # compile the quick step before the optimized one
cfg = load_config("tiny", [a for a in sys.argv[3:] if a != "--quick-first"])
mesh = make_mesh(None)
batch = cfg.batch_size(jax.device_count())
key = program_key(cfg.to_dict(), mesh, batch)
program = Program(cfg, mesh, batch, executables=Executables(open_storage(sys.argv[2]), key),
                  compile_now=not quick)
if quick:
    program.compile_quick()
    program.compile()
state = program.init()
source = data.make_source(cfg.data, cfg.data_dtype, cfg.seed, cfg.seq_len, cfg.vocab_size)
losses = []
for step in range(3):
    tokens = data.make_batch(source, step * batch, batch, cfg.seq_len, program.batch_sharding)
    state, out = program.train_step(state, tokens)
    losses.append(float(out["loss"]))
params = hashlib.sha256(b"".join(np.asarray(x).tobytes()
                                 for x in jax.tree.leaves(state["params"]))).hexdigest()
print(json.dumps({"source": program.source, "key": key, "losses": losses, "params": params,
                  "num_params": program.num_params,
                  "abstract": str(jax.tree.map(lambda a: (a.shape, str(a.dtype), str(a.sharding.spec)),
                                               program.abstract_state))}))
"""


def run(cache: Path | str, *overrides: str) -> tuple[dict, str]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO), str(cache), *overrides],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def entries(cache: Path) -> list[str]:
    folder = cache / "xrun-executables"
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.pkl"))


def jax_entries(cache: Path) -> list[str]:
    """JAX's own cache entries (``jit_<function>-<key>-cache``)."""
    return sorted(p.name for p in cache.iterdir() if p.name.startswith("jit_"))


class Cold:
    """The module's one cold run: the folder it wrote its caches in, a copy of them as the
    run left them, and what it printed."""

    def __init__(self, cache: Path, pristine: Path, first: dict):
        self.cache, self.pristine, self.first = cache, pristine, first

    def restore(self) -> tuple[Path, dict]:
        """The cache folder as the cold run left it, at the path it ran in (see the module's
        docstring); the tests run one after another in one process (a module fixture)."""
        shutil.rmtree(self.cache, ignore_errors=True)
        shutil.copytree(self.pristine, self.cache)
        return self.cache, self.first


@pytest.fixture(scope="module")
def cold(tmp_path_factory) -> Cold:
    """One cold run (JAX's cache and ours empty) for the module, compiling the quick train
    step before the optimized one as a cold start does. Each test starts from its folder as
    it left it (Cold.restore)."""
    folder = tmp_path_factory.mktemp("cold")
    cache = folder / "cache"
    first, _ = run(cache, "--quick-first")
    assert first["source"] == "compiled, written"
    shutil.copytree(cache, folder / "pristine")
    return Cold(cache, folder / "pristine", first)


def test_a_warm_start_loads_both_executables_and_trains_exactly_alike(cold):
    cache, first = cold.restore()
    assert entries(cache) == [f"{first['key']}/init.pkl", f"{first['key']}/train_step.pkl"]
    warm, _ = run(cache)
    assert warm["source"] == "loaded" and warm["key"] == first["key"]
    # The same numbers, bit for bit, and the same state signature (restore targets it).
    assert warm["losses"] == first["losses"] and warm["params"] == first["params"]
    assert warm["abstract"] == first["abstract"] and warm["num_params"] == first["num_params"]
    assert first["losses"][2] < first["losses"][0]  # it trains

    other, _ = run(cache, "learning_rate=0.003")  # another program: another key, compiled
    assert other["key"] != first["key"] and other["source"] == "compiled, written"
    assert other["losses"][0] == first["losses"][0] and other["losses"][1:] != first["losses"][1:]
    assert len(entries(cache)) == 4


def test_an_entry_made_from_jaxs_own_cache_entry_runs(cold):
    """JAX's cache is warm, ours is empty (the workload's source changed, the lowered program
    did not): JAX loads the executables from its cache, and re-serialising such an executable
    gives one that fails when run (XLA:CPU, NOT_FOUND). The entry is written from the bytes
    JAX's cache holds instead, and the next start loads and runs it."""
    cache, first = cold.restore()
    shutil.rmtree(cache / "xrun-executables")
    jax_before = jax_entries(cache)
    refill, _ = run(cache)
    assert refill["source"] == "compiled, written" and refill["losses"] == first["losses"]
    assert len(entries(cache)) == 2
    assert jax_entries(cache) == jax_before  # JAX loaded both from its cache: nothing new
    warm, _ = run(cache)
    assert warm["source"] == "loaded"
    assert warm["losses"] == first["losses"] and warm["params"] == first["params"]


def test_the_cache_under_a_gs_root_loads_what_it_wrote(gcs_bucket):
    """As on GKE: JAX's cache and the executables under ``gs://.../cache/jax-compilation``
    (the GCS emulator, through the workload's GCS storage)."""
    from xrun_contract.storage import open_storage

    cache = f"{gcs_bucket}/xrun/cache/jax-compilation"
    first, _ = run(cache)
    assert first["source"] == "compiled, written"
    objects, _ = open_storage(cache).list("xrun-executables", delimiter=None)
    assert sorted(o.key for o in objects) == [f"xrun-executables/{first['key']}/init.pkl",
                                              f"xrun-executables/{first['key']}/train_step.pkl"]
    assert all(o.size > 100_000 for o in objects)
    warm, _ = run(cache)
    assert warm["source"] == "loaded" and warm["losses"] == first["losses"]
    assert warm["params"] == first["params"]


def test_writing_a_program_deletes_programs_not_written_for_two_weeks(tmp_path):
    """Reads do not touch entries, so a program's age is its newest entry's; the one being
    written is never deleted, whatever its age."""
    import os
    import time

    from workload.executables import KEEP_SECONDS, Executables
    from xrun_contract.storage import open_storage

    folder = tmp_path / "xrun-executables"
    now = time.time()
    ages = {"a" * 32: KEEP_SECONDS + 60, "b" * 32: KEEP_SECONDS - 3600, "c" * 32: 0.0,
            "d" * 32: KEEP_SECONDS + 60}
    for key, age in ages.items():
        for function in ("init", "train_step"):
            path = folder / key / f"{function}.pkl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")
            os.utime(path, (now - age, now - age))
    # "d": one entry old, one recent: the program was written recently.
    os.utime(folder / ("d" * 32) / "init.pkl", (now, now))
    mine = Executables(open_storage(str(tmp_path)), "a" * 32)  # old, but being written
    other = Executables(open_storage(str(tmp_path)), "c" * 32)
    assert mine.prune() == []  # the only program past the age is the one being written
    assert sorted(p.name for p in folder.iterdir()) == sorted(ages)
    assert other.prune() == ["a" * 32]
    assert sorted(p.name for p in folder.iterdir()) == ["b" * 32, "c" * 32, "d" * 32]


def test_an_unreadable_entry_is_a_miss_and_is_written_again(cold):
    cache, first = cold.restore()
    step = cache / "xrun-executables" / first["key"] / "train_step.pkl"
    step.write_bytes(step.read_bytes()[:1000])  # cut short, as a full disk leaves it
    again, err = run(cache)
    assert f"executable cache entry xrun-executables/{first['key']}/train_step.pkl unusable" in err
    assert again["source"] == "compiled, written" and again["losses"] == first["losses"]
    warm, _ = run(cache)
    assert warm["source"] == "loaded" and warm["losses"] == first["losses"]


KEY_SCRIPT = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax
jax.config.update("jax_platforms", "cpu")
import workload.executables as ex
from workload.config import load_config
from workload.distributed import make_mesh

cfg = load_config("tiny").to_dict()
mesh = make_mesh(None)
keys = {"base": ex.program_key(cfg, mesh, 4), "again": ex.program_key(cfg, mesh, 4),
        "batch": ex.program_key(cfg, mesh, 8),
        "config": ex.program_key({**cfg, "z_loss": 0.5}, mesh, 4),
        "steps": ex.program_key({**cfg, "steps": cfg["steps"] + 1}, mesh, 4),  # the schedule
        "seed": ex.program_key({**cfg, "seed": 1}, mesh, 4),  # init's constant
        # Never in the program: checkpoint cadence and retention, the token file's path.
        "checkpoints": ex.program_key({**cfg, "checkpoint_every": 7, "max_to_keep": 9,
                                       "async_checkpoint": False}, mesh, 4),
        "data": ex.program_key({**cfg, "data": "/elsewhere/tokens.bin"}, mesh, 4)}
os.environ["XLA_FLAGS"] += " --xla_cpu_enable_fast_math=true"
keys["xla_flags"] = ex.program_key(cfg, mesh, 4)
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
jax.config.update("jax_default_matmul_precision", "highest")
keys["setting"] = ex.program_key(cfg, mesh, 4)
jax.config.update("jax_default_matmul_precision", None)
jax.config.update("jax_compilation_cache_dir", "/nonexistent/elsewhere")
keys["cache_folder"] = ex.program_key(cfg, mesh, 4)  # not part of the program
sources = ex._sources()
ex._sources = lambda: {**sources, "model.py": "0" * 64}  # an edited model
keys["source"] = ex.program_key(cfg, mesh, 4)
ex._sources = lambda: sources
keys["one_device"] = ex.program_key(cfg, make_mesh(None).__class__(
    mesh.devices[:, :1], mesh.axis_names), 4)
print(json.dumps({"keys": keys, "files": sorted(sources)}))
"""


def test_whatever_decides_the_program_is_in_the_key():
    out = subprocess.run([sys.executable, "-c", KEY_SCRIPT, str(REPO)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    keys = result["keys"]
    assert keys["again"] == keys["base"] and keys["cache_folder"] == keys["base"]
    assert keys["checkpoints"] == keys["base"] and keys["data"] == keys["base"]
    changed = {k for k, v in keys.items() if v != keys["base"]}
    assert changed == {"batch", "config", "steps", "seed", "xla_flags", "setting", "source",
                       "one_device"}
    # Every module of the workload package is hashed, the program's own among them.
    assert {"model.py", "train.py", "loss.py", "attention.py", "config.py"} <= set(result["files"])


def test_the_quick_step_is_not_written_to_jaxs_cache_the_optimized_one_is(cold):
    """The quick train step serves one cold start: JAX's cache write (serialise, compress) would
    sit on the first step's path for an entry nothing reads. The optimized step's entry is
    written as before. (The module's cold run compiled both, the quick one first.)"""
    steps = [name for name in jax_entries(cold.pristine) if name.startswith("jit_train_step-")]
    assert len(steps) == 1, steps
