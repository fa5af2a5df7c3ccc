"""Compiled executables kept beside JAX's compilation cache, keyed by what the program is
made of, so that a warm start skips tracing and lowering.

Why: JAX's persistent compilation cache is keyed by the lowered module, so to find an entry
JAX must first trace and lower the function: for the tiny model on CPU ~1 s of a warm start
(``init`` and the train step; building the abstract model and optimizer state besides),
about as long as the whole of a bare ``jax.distributed.initialize`` (bench/bench_submit.py).
This cache is keyed instead by the program's inputs: the workload's source files, the
library versions, the config, the mesh and devices, this process's index, the XLA flags and
JAX's settings. An entry is ``jax.experimental.serialize_executable``'s output for one
function; a hit gives a ``jax.stages.Compiled`` without importing flax or optax.

An executable that JAX itself loaded from its cache cannot be serialised again on XLA:CPU
(jaxlib 0.10.2: the copy serialises, but running it after loading fails with "NOT_FOUND:
Function wrapped_broadcast.7 not found"). For those the entry is made of the bytes JAX's
cache holds (the executable as it was serialised right after its compilation), read back
when JAX read them: ``jax/_src/compiler.py`` ``_cache_read`` is wrapped for that, and the
pickler that ``jax.experimental.serialize_executable.serialize`` uses is given those bytes.
So an edit that leaves the lowered module as it was (a log line) gets its entry in the
first run after it. Where those internals are not the ones known, only executables compiled
from scratch are written (JAX records ``/jax/compilation_cache/cache_hits`` for the others).

Entries are pickles of executables: as trusted as JAX's own cache in the same folder (which
loads executables from there too). Anything unreadable is a miss, never an error.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import io
import json
import os
import pickle
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workload import private_seam
from xrun_contract.storage import Storage

FORMAT = 1  # bump when an entry's layout changes: older entries then miss
PREFIX = "xrun-executables"  # <cache>/xrun-executables/<key>/<function>.pkl
# A program whose newest entry is older than this is deleted when another is written (a
# program still in use then misses once and is written again; reads do not touch entries).
KEEP_SECONDS = 14 * 24 * 3600.0
# JAX settings that do not change what is compiled (caching, logging, timeouts). Every other
# setting is part of the key: a setting that should not be only costs a miss.
_SETTINGS_NOT_KEYED = ("compilation_cache", "persistent_cache", "log", "explain_cache_misses",
                       "timeout", "raise_persistent_cache_errors")
# Config keys that never reach the compiled program (checkpoint cadence and retention, the
# token file's path: a batch is int32 [batch, seq_len + 1] whatever its source; the quick
# first executable, which is never written here). Every other
# key is part of the key.
_CONFIG_NOT_KEYED = ("checkpoint_every", "max_to_keep", "async_checkpoint", "data",
                     "checkpoint_stage_gib", "checkpoint_copy_threads", "quick_compile",
                     "profile")
_PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "ml_dtypes")
_ENV_KEYED = ("XLA_FLAGS", "LIBTPU_INIT_ARGS", "JAX_PLATFORMS")

_local = threading.local()  # per thread, during compile_recording()
_install_lock = threading.Lock()
_installed: bool | None = None  # None: not tried yet
_pickler_lock = threading.Lock()


class Recorded:
    """What one compilation took from JAX's cache: the executables and their stored bytes
    (None where they could not be read), and how many cache hits JAX reported."""

    def __init__(self) -> None:
        self.loaded: list[tuple[Any, bytes | None]] = []
        self.hits = 0


def _on_event(event: str, **_: Any) -> None:
    recorded = getattr(_local, "recorded", None)
    if recorded is not None and event == "/jax/compilation_cache/cache_hits":
        recorded.hits += 1


def _on_cache_hit(executable: Any, read_bytes: Callable[[], bytes | None]) -> None:
    recorded = getattr(_local, "recorded", None)
    if recorded is not None:
        recorded.loaded.append((executable, read_bytes()))


def _install() -> bool:
    """Listen for JAX's cache hits; wrap ``compiler._cache_read`` to keep the bytes it
    read (``private_seam.wrap_cache_read``). False when JAX's internals are not the ones
    known (then cache-loaded executables are not written)."""
    global _installed
    with _install_lock:
        if _installed is not None:
            return _installed
        import jax.monitoring

        jax.monitoring.register_event_listener(_on_event)
        _installed = private_seam.wrap_cache_read(_on_cache_hit)
        return _installed


def compile_recording(compile_fn: Any) -> tuple[Any, Recorded]:
    """``compile_fn()`` and what it took from JAX's cache (see Recorded)."""
    _install()
    _local.recorded = recorded = Recorded()
    try:
        return compile_fn(), recorded
    finally:
        _local.recorded = None


@functools.cache
def _sources() -> dict[str, str]:
    """SHA-256 of every module the program is built from (the workload package). Once per
    process, as the versions: a warm start keys two programs (the executables, remat=auto's
    choice), and each reading of the package metadata took ~0.1 s on the loaded 2-core
    machine."""
    here = Path(__file__).resolve().parent
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(here.glob("*.py"))}


@functools.cache
def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


def program_key(config: dict[str, Any], mesh: Any, global_batch: int) -> str:
    """The key of one process's program: equal only when everything that decides the
    executables is equal (see the module's docstring)."""
    import jax

    devices = list(mesh.devices.flat)
    parts = {
        "format": FORMAT,
        "python": sys.version,
        "sources": dict(_sources()),
        "packages": {p: _version(p) for p in _PACKAGES},
        "jax": jax.__version__,
        "config": {k: v for k, v in config.items() if k not in _CONFIG_NOT_KEYED},
        "global_batch": global_batch,
        "mesh": {"axes": list(mesh.axis_names), "shape": list(mesh.devices.shape),
                 "devices": [(d.id, d.process_index, d.device_kind) for d in devices]},
        "process": [jax.process_index(), jax.process_count()],
        "backend": [jax.default_backend(), devices[0].client.platform_version],
        "env": {k: os.environ.get(k, "") for k in _ENV_KEYED},
        "settings": {k: repr(v) for k, v in sorted(jax.config.values.items())
                     if not any(s in k for s in _SETTINGS_NOT_KEYED)},
    }
    text = json.dumps(parts, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Executables:
    """One process's entries for one program key, in a storage root (JAX's cache folder)."""

    def __init__(self, storage: Storage, key: str):
        self.storage, self.key = storage, key
        self._pruned = False  # once per process: init and the train step both save

    def _name(self, function: str) -> str:
        return f"{PREFIX}/{self.key}/{function}.pkl"

    def load(self, function: str) -> Any | None:
        """The compiled ``function``, or None (absent or unreadable: a miss)."""
        from jax.experimental import serialize_executable

        try:
            data = self.storage.read_bytes(self._name(function))
            if data is None:
                return None
            payload, in_tree, out_tree = pickle.loads(data)  # noqa: S301 - see docstring
            return serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
        except Exception as e:  # noqa: BLE001 - a bad entry is a miss, said once
            print(f"xrun: executable cache entry {self._name(function)} unusable ({e!r:.200}); "
                  "compiling", file=sys.stderr, flush=True)
            return None

    def save(self, function: str, compiled: Any, recorded: Recorded) -> bool:
        """Write ``compiled``; False (and a warning where unexpected) when it cannot be:
        loaded from JAX's cache without its bytes, or not serialisable."""
        from jax.experimental import serialize_executable as se

        stored = {id(exe): data for exe, data in recorded.loaded if data is not None}
        if recorded.hits > len(stored):
            return False  # a cache-loaded executable without its bytes: it would not run
        try:
            with _pickler_lock:
                if stored:  # serialize() pickles with this module-level class
                    original = se._JaxPjrtPickler

                    class Pickler(original):  # type: ignore[misc,valid-type]
                        def persistent_id(self, obj: Any) -> Any:
                            if id(obj) in stored:
                                return ("exec", stored[id(obj)])
                            return super().persistent_id(obj)

                    se._JaxPjrtPickler = Pickler  # type: ignore[misc]
                try:
                    payload, in_tree, out_tree = se.serialize(compiled)
                finally:
                    if stored:
                        se._JaxPjrtPickler = original  # type: ignore[misc]
            with io.BytesIO() as buf:
                pickle.dump((payload, in_tree, out_tree), buf, protocol=pickle.HIGHEST_PROTOCOL)
                self.storage.write_bytes(self._name(function), buf.getvalue())
        except Exception as e:  # noqa: BLE001 - the cache is an optimisation
            print(f"xrun: executable cache: not writing {self._name(function)} ({e!r:.200})",
                  file=sys.stderr, flush=True)
            return False
        if not self._pruned:
            self._pruned = True
            self.prune()
        return True

    def prune(self, keep_seconds: float = KEEP_SECONDS) -> list[str]:
        """Delete the programs (other than this one) whose newest entry is older than
        ``keep_seconds``; their keys. Best effort: another process may be doing the same."""
        import time

        try:
            objects, _ = self.storage.list(PREFIX, delimiter=None)
            newest: dict[str, float] = {}
            for o in objects:
                parts = o.key.split("/")
                if len(parts) >= 3 and parts[-3] == PREFIX:
                    newest[parts[-2]] = max(newest.get(parts[-2], 0.0), o.updated)
            old = sorted(k for k, t in newest.items()
                         if k != self.key and t < time.time() - keep_seconds)
            for key in old:
                self.storage.delete_prefix(f"{PREFIX}/{key}")
            return old
        except Exception as e:  # noqa: BLE001 - the cache is an optimisation
            print(f"xrun: executable cache: not pruning {PREFIX} ({e!r:.200})",
                  file=sys.stderr, flush=True)
            return []
