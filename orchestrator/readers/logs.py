"""A run's logs as stored: every host's append-only chunks, read each chunk once.

The pod's log-shipping sidecar ships each host's output to ``runs/<name>/logs/<slice>-<host>/attempt-NNN/``
as numbered chunk objects; reading them back works from a folder or gs:// after the pods
are gone. Listing is one delimiter listing per host and attempt folder.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from xrun_contract import ATTEMPT_RE, Layout
from xrun_contract.storage import Storage


@dataclass(frozen=True)
class LogChunk:
    host: str
    attempt: int
    key: str
    updated: float


def list_log_chunks(storage: Storage, name: str, hosts: set[str] | None = None) -> list[LogChunk]:
    """All log chunk objects of a run: one listing per host and attempt folder."""
    chunks: list[LogChunk] = []
    _, host_prefixes = storage.list(Layout.logs(name))
    for hp in host_prefixes:
        host = hp.rsplit("/", 1)[-1]
        if hosts and host not in hosts:
            continue
        _, attempt_prefixes = storage.list(hp)
        for ap in attempt_prefixes:
            m = ATTEMPT_RE.search(ap.rsplit("/", 1)[-1])
            if not m:
                continue
            objects, _ = storage.list(ap)
            chunks += [LogChunk(host, int(m[1]), o.key, o.updated) for o in objects]
    # Merge order: attempt, then write time, then host and sequence.
    chunks.sort(key=lambda c: (c.attempt, c.updated, c.host, c.key))
    return chunks


class LogFollower:
    """Yields (host, attempt, line) for chunks not yet seen; call ``poll`` repeatedly."""

    def __init__(self, storage: Storage, name: str, hosts: set[str] | None = None,
                 since: float | None = None):
        self.storage, self.name, self.hosts, self.since = storage, name, hosts, since
        self.seen: set[str] = set()

    def poll(self) -> Iterator[tuple[str, int, str]]:
        for c in list_log_chunks(self.storage, self.name, self.hosts):
            if c.key in self.seen:
                continue
            if self.since is not None and c.updated < self.since:
                self.seen.add(c.key)
                continue
            data = self.storage.read_bytes(c.key)
            if data is None:
                continue
            self.seen.add(c.key)
            for line in data.decode("utf-8", errors="replace").splitlines():
                yield c.host, c.attempt, line


def parse_duration(text: str) -> float:
    """'90s', '10m', '2h', '1d' -> seconds."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if not m:
        raise ValueError(f"--since: {text!r} is not a duration like 30s, 10m, 2h or 1d")
    return float(m[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]


