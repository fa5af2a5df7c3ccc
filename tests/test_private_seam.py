"""The private JAX/Orbax seam (workload/private_seam.py): the only module that imports a
private internal, and every patch of it installs, and works, on the pinned versions. An
upgrade that moves one fails here instead of quietly making starts and saves slower."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("xrun_contract", "manifests", "orchestrator", "workload")

# Run in a process of its own: the patches change JAX's modules for good.
CHECK = r'''
import importlib.metadata, json, math, sys, tempfile
results = {}
from workload import private_seam as seam
results["versions"] = {p: importlib.metadata.version(p) for p in ("jax", "jaxlib", "orbax-checkpoint")}
import jax, jax.numpy as jnp
import orbax.checkpoint as ocp

# jax._src.compiler._cache_write: every process writes the cache.
results["cache_write"] = seam.cache_writes_on_every_process() and seam.cache_writes_on_every_process()
results["cache_write_installed"] = getattr(seam.jax_compiler._cache_write, "xrun_every_process", False)

# jax._src.compiler._cache_read: a cache hit hands over the executable and its bytes.
hits = []
results["cache_read"] = seam.wrap_cache_read(lambda exe, read: hits.append((exe, read())))
jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp())
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
f = lambda x: jnp.sin(x) * 3 + x.sum()
x = jnp.ones(8)
jax.jit(f).lower(x).compile()
assert not hits
jax.clear_caches()
jax.jit(f).lower(x).compile()
results["cache_read_hit"] = len(hits) == 1 and isinstance(hits[0][1], bytes) and len(hits[0][1]) > 100

# jax._src.distributed.global_state: the coordination client peers.py agrees through.
state = seam.distributed_state()
results["distributed_state"] = hasattr(state, "client") and state.process_id == 0

# jax._src.config: the per-thread minimum compile time (train.unwritten_to_jax_cache).
from workload.program import unwritten_to_jax_cache
setting = seam.jax_config.persistent_cache_min_compile_time_secs
with unwritten_to_jax_cache():
    inside = setting.value
results["jax_config"] = inside == math.inf and setting.value == 0

# orbax.checkpoint._src: jax.Array's handler with a per-array transfer priority.
defaults = seam.type_handler_registry._DEFAULT_TYPE_HANDLERS
priority = seam.serialization_types.TransferPriority
handler = ocp.type_handlers.ArrayHandler(array_metadata_store=seam.array_metadata_store.Store(),
                                         callback=None)
registry = ocp.type_handlers.create_type_handler_registry(
    *[(t, h) for t, h in defaults if t is not jax.Array], (jax.Array, handler))
results["orbax"] = (any(t is jax.Array for t, _ in defaults)
                    and {"SYNCHRONOUS", "ASYNCHRONOUS_DEPRIORITIZED"} <= set(priority.__members__)
                    and registry.get(jax.Array) is handler)
print(json.dumps(results))
'''


def pins() -> dict[str, str]:
    text = (ROOT / "pyproject.toml").read_text()
    return dict(re.findall(r'"(jax|jaxlib|orbax-checkpoint)==([^"]+)"', text))


def test_each_private_patch_installs_and_works_on_the_pinned_versions():
    r = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, cwd=ROOT,
                       timeout=300, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(r.stdout.strip().splitlines()[-1])
    assert results.pop("versions") == pins(), "test the versions pyproject pins"
    missing = [name for name, ok in results.items() if ok is not True]
    assert not missing, f"private JAX/Orbax internals moved: {missing} (workload/private_seam.py)"
    assert len(results) == 7


def test_only_the_seam_imports_a_private_internal():
    offenders = []
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            if path == ROOT / "workload" / "private_seam.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if isinstance(node, ast.ImportFrom) and node.module in ("jax", "orbax.checkpoint"):
                    names += [f"{node.module}.{a.name}" for a in node.names]
                offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if "._src" in n]
    assert not offenders, offenders
