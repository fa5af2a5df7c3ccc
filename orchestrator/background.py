"""A call run beside the caller's own work, for one-shot commands that wait on the network."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


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
