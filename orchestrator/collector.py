"""Python's cyclic garbage collector, held off where it costs more than it frees."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Hold off Python's cyclic garbage collector for a block (nested and from several
    threads alike: it runs again once the last block ends, if it ran before the first).

    For work that allocates a great deal and frees little: every 700 allocations start a
    young collection and a growing heap a few full ones over everything, which find
    nothing to free."""
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()
