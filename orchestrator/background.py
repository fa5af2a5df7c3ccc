"""Calls run beside the caller's own work: one in a thread of its own (:class:`Background`,
for one-shot commands that wait on the network), or many over one process-wide pool
(:func:`io_map`, for the readers' concurrent storage requests)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

IO_THREADS = 8  # below the storage client's connection pool (10)
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_in_pool = threading.local()


def _mark_worker() -> None:
    _in_pool.yes = True


def io_map(fn: Callable[[T], R], items: Iterable[T], *, inline_below: int = 3) -> Iterator[R]:
    """``fn`` over ``items``, results in order, IO_THREADS at a time on one pool the process
    keeps: a follow polls storage every 2 s for days, and a pool made per poll made and
    ended threads each time (and with them allocator arenas and stacks). Fewer than
    ``inline_below`` items, or a call from one of the pool's own threads (which would wait
    on itself), run here, one after the other."""
    items = list(items)
    if len(items) < inline_below or getattr(_in_pool, "yes", False):
        return map(fn, items)
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="xrun-io", initializer=_mark_worker)
    return _pool.map(fn, items)


class Background:
    """A call run in a daemon thread: ``result`` waits for it and returns or raises what it
    did. Daemon, so that an interrupted command exits at once rather than waiting out the
    call's request timeout (concurrent.futures joins its threads at exit)."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any):
        self._out: list[tuple[bool, Any]] = []
        self._thread = threading.Thread(target=self._run, args=(fn, args, kwargs), daemon=True,
                                        name=f"xrun-{getattr(fn, '__name__', 'call')}")
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            self._out.append((True, fn(*args, **kwargs)))
        except BaseException as e:  # noqa: BLE001 - handed to the caller of result()
            self._out.append((False, e))

    def result(self) -> Any:
        self._thread.join()
        ok, value = self._out[0]
        if not ok:
            raise value
        return value
