"""The chunk objects a follower has read, in memory that does not grow with the run.

A follow of a long run reads every metrics and log chunk once; a set of their names grows
by a name per chunk (a 20,000-step soak: tens of thousands of names, megabytes). Chunk names
end in a zero-padded sequence number per writer (``xrun_contract.Layout.log_chunk``,
``metrics_chunk``), which each writer counts up one by one, so the names seen are kept per
writer as runs of consecutive numbers: one run per writer while nothing is skipped.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable

# <head ending in / or -><8-digit seq><-writer tag?><.ext>: a name of another form is kept whole.
_CHUNK_RE = re.compile(r"^(.*?[/-])(\d{8})((?:-[0-9a-z]+)?\.[a-z]+)$")


class SeenKeys:
    """A set of object names (``in``, ``add``, ``update``), chunk names kept as ranges."""

    def __init__(self, keys: Iterable[str] = ()):
        # (head, tail) -> sorted, disjoint [start, end) runs of sequence numbers.
        self._runs: dict[tuple[str, str], list[list[int]]] = {}
        self._other: set[str] = set()
        self.update(keys)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        m = _CHUNK_RE.match(key)
        if not m:
            return key in self._other
        runs = self._runs.get((m[1], m[3]))
        if not runs:
            return False
        seq = int(m[2])
        i = bisect.bisect_right(runs, [seq, 1 << 62]) - 1
        return i >= 0 and runs[i][0] <= seq < runs[i][1]

    def add(self, key: str) -> None:
        m = _CHUNK_RE.match(key)
        if not m:
            self._other.add(key)
            return
        runs = self._runs.setdefault((m[1], m[3]), [])
        seq = int(m[2])
        if runs and runs[-1][1] == seq:  # the usual case: the writer's next chunk
            runs[-1][1] += 1
            return
        i = bisect.bisect_right(runs, [seq, 1 << 62])  # runs[i-1] starts at or before seq
        if i and runs[i - 1][1] > seq:
            return  # already in
        joins_left = bool(i) and runs[i - 1][1] == seq
        joins_right = i < len(runs) and runs[i][0] == seq + 1
        if joins_left and joins_right:
            runs[i - 1][1] = runs[i][1]
            del runs[i]
        elif joins_left:
            runs[i - 1][1] = seq + 1
        elif joins_right:
            runs[i][0] = seq
        else:
            runs.insert(i, [seq, seq + 1])

    def update(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.add(key)

    def __bool__(self) -> bool:
        return bool(self._runs) or bool(self._other)

    def held(self) -> int:
        """How many ranges and whole names are kept (what the memory grows with)."""
        return sum(len(r) for r in self._runs.values()) + len(self._other)
