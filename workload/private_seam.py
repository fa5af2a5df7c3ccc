"""Every private JAX and Orbax internal xrun uses, behind this one module.

xrun reaches past the public APIs in four places, each for speed or for something the API
does not offer:

* ``jax._src.compiler._cache_write`` (wrapped by ``cache_writes_on_every_process``): every
  process writes the persistent compilation cache, not only process 0 (CPU keys differ per
  process): ~8-12 s of a warm local start.
* ``jax._src.compiler._cache_read`` and ``jax._src.compilation_cache``'s readers (wrapped by
  ``wrap_cache_read``): the bytes of an executable JAX loaded from its cache, which
  ``workload.executables`` keeps in its own cache.
* ``jax._src.distributed.global_state`` (``distributed_state``): the coordination service's
  client that ``workload.peers`` agrees through, and the process id the cache write checks.
* ``jax._src.config`` (``jax_config``): the per-thread minimum compile time JAX caches,
  which keeps the quick train step out of the persistent cache.
* ``orbax.checkpoint._src``: the default type handlers, the array metadata store and
  ``TransferPriority`` (``type_handler_registry``, ``array_metadata_store``,
  ``serialization_types``), to give ``jax.Array``'s handler a per-array transfer priority.

At run time a moved internal costs speed, never the run: each caller degrades as before.
``tests/test_private_seam.py`` installs every patch and resolves every name on the pinned
versions (pyproject's ``workload`` extra), so an upgrade that moves one fails there, loudly,
instead of quietly getting slower. Imports are lazy: importing this module imports no JAX.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

# The private modules, by the name this module gives them (PEP 562 ``__getattr__`` below).
PRIVATE_MODULES = {
    "jax_compiler": "jax._src.compiler",
    "jax_compilation_cache": "jax._src.compilation_cache",
    "jax_config": "jax._src.config",
    "jax_distributed": "jax._src.distributed",
    "type_handler_registry": "orbax.checkpoint._src.serialization.type_handler_registry",
    "serialization_types": "orbax.checkpoint._src.serialization.types",
    "array_metadata_store": "orbax.checkpoint._src.metadata.array_metadata_store",
}
# The signatures the wrappers pass through unchanged (jax 0.10.2 jax/_src/compiler.py).
CACHE_WRITE_PARAMETERS = ["cache_key", "compile_time_secs", "module_name", "backend",
                          "executable", "host_callbacks"]
CACHE_READ_PARAMETERS = ["module_name", "cache_key", "compile_options", "backend",
                         "executable_devices"]


def __getattr__(name: str) -> Any:
    if name in PRIVATE_MODULES:
        return importlib.import_module(PRIVATE_MODULES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _private(*names: str) -> list[Any] | None:
    """The private modules ``names``, or None when this version has one of them no more."""
    try:
        return [importlib.import_module(PRIVATE_MODULES[n]) for n in names]
    except ImportError:
        return None


def distributed_state() -> Any:
    """``jax._src.distributed.global_state``: ``.client`` (None in a single process) and
    ``.process_id``."""
    return importlib.import_module(PRIVATE_MODULES["jax_distributed"]).global_state


def cache_writes_on_every_process() -> bool:
    """Let every process, not only process 0, write JAX's persistent compilation cache (CPU).

    JAX writes cache entries from process 0 only (``jax/_src/compiler.py`` ``_cache_write``:
    "Not writing persistent cache entry since process_id != 0"), on the premise that every
    process computes the same key. On CPU they do not: the key hashes the topology
    fingerprint of the executable's devices (``jax/_src/cache_key.py``
    ``_hash_accelerator_config``), which a CPU client computes differently in each process.
    So every process but 0 missed the cache on every warm start and compiled everything
    again, and the first step (the first collective) waited for it: ~8-12 s of a warm local
    start (bench/bench_submit.py). Keys differ per process, so no two processes write the
    same entry. Returns False (and changes nothing) when JAX's internals are not as expected.
    """
    modules = _private("jax_compilation_cache", "jax_compiler", "jax_config", "jax_distributed")
    if modules is None:
        return False
    compilation_cache, compiler, config, distributed = modules
    original = getattr(compiler, "_cache_write", None)
    if original is None or getattr(original, "xrun_every_process", False):
        return original is not None
    if list(inspect.signature(original).parameters) != CACHE_WRITE_PARAMETERS or not hasattr(
            compilation_cache, "put_executable_and_time"):
        return False

    def _cache_write(cache_key: str, compile_time_secs: float, module_name: str, backend: Any,
                     executable: Any, host_callbacks: Any) -> None:
        if (distributed.global_state.process_id == 0 or host_callbacks
                or compile_time_secs < config.persistent_cache_min_compile_time_secs.value):
            original(cache_key, compile_time_secs, module_name, backend, executable,
                     host_callbacks)
            return
        try:  # as upstream: a cache that cannot be written is a warning, never an error
            compilation_cache.put_executable_and_time(
                cache_key, module_name, executable, backend, int(compile_time_secs))
        except Exception as e:  # noqa: BLE001
            import warnings

            warnings.warn(f"Error writing persistent compilation cache entry for "
                          f"{module_name!r}: {type(e).__name__}: {e}", stacklevel=2)

    _cache_write.xrun_every_process = True  # type: ignore[attr-defined]
    compiler._cache_write = _cache_write
    return True


def wrap_cache_read(on_hit: Callable[[Any, Callable[[], bytes | None]], None]) -> bool:
    """Wrap ``compiler._cache_read`` so that each executable JAX loads from its persistent
    cache is handed to ``on_hit(executable, read_bytes)``; ``read_bytes()`` reads the
    entry's serialized executable as ``compilation_cache.get_executable_and_time`` does
    (None when it cannot). False (nothing wrapped) when JAX's internals are not the ones
    known. Call once."""
    modules = _private("jax_compilation_cache", "jax_compiler")
    if modules is None:
        return False
    compilation_cache, compiler = modules
    original = getattr(compiler, "_cache_read", None)
    if (original is None or list(inspect.signature(original).parameters) != CACHE_READ_PARAMETERS
            or not all(hasattr(compilation_cache, n) for n in (
                "_get_cache", "decompress_executable", "extract_executable_and_time"))):
        return False

    def _cache_read(module_name: str, cache_key: str, compile_options: Any, backend: Any,
                    executable_devices: Any) -> Any:
        executable, compile_time = original(module_name, cache_key, compile_options,
                                            backend, executable_devices)

        def read_bytes() -> bytes | None:
            try:  # as compilation_cache.get_executable_and_time reads them
                stored = compilation_cache._get_cache(backend).get(cache_key)
                return compilation_cache.extract_executable_and_time(
                    compilation_cache.decompress_executable(stored))[0]
            except Exception:  # noqa: BLE001 - then this entry is not written
                return None

        if executable is not None:
            on_hit(executable, read_bytes)
        return executable, compile_time

    compiler._cache_read = _cache_read
    return True
