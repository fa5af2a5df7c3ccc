"""A run's logs as stored: every host's append-only chunks, read each chunk once.

The pod's log-shipping sidecar ships each host's output to ``runs/<name>/logs/<slice>-<host>/attempt-NNN/``
as numbered chunk objects; reading them back works from a folder or gs:// after the pods
are gone. Listing is one delimiter listing per host and attempt folder.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from xrun_contract import ATTEMPT_RE, Layout, split_stamp
from xrun_contract.storage import Storage

StampedLine = tuple[str, int, float, str]  # (host, attempt, epoch seconds, text)


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
    """Yields (host, attempt, line) for chunks not yet seen; call ``poll`` repeatedly.

    ``since`` filters per line: a chunk written before it is skipped unread (its lines are
    older still), and inside a newer chunk each line's wrapper stamp decides (an unstamped
    line, from before stamping, is dated by its chunk)."""

    def __init__(self, storage: Storage, name: str, hosts: set[str] | None = None,
                 since: float | None = None):
        self.storage, self.name, self.hosts, self.since = storage, name, hosts, since
        self.seen: set[str] = set()

    def poll_stamped(self) -> Iterator[StampedLine]:
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
            for raw in data.decode("utf-8", errors="replace").splitlines():
                t, line = split_stamp(raw)
                t = c.updated if t is None else t
                if self.since is not None and t < self.since:
                    continue
                yield c.host, c.attempt, t, line

    def poll(self) -> Iterator[tuple[str, int, str]]:
        for host, attempt, _t, line in self.poll_stamped():
            yield host, attempt, line


def known_hosts(storage: Storage, name: str) -> list[str]:
    """The hosts that left logs (one delimiter listing), sorted by slice then host."""
    _, prefixes = storage.list(Layout.logs(name))
    hosts = [p.rstrip("/").rsplit("/", 1)[-1] for p in prefixes]
    return sorted(hosts, key=lambda h: tuple(int(x) if x.isdigit() else 0 for x in h.split("-")))


_DURATION_RE = re.compile(r"(?:(\d+(?:\.\d+)?)(ms|h|m|s|d))")


def parse_duration(text: str, what: str = "--since") -> float:
    """Go's ``time.ParseDuration`` forms kubectl takes for ``--since`` ('1h30m', '90s',
    '2h15m30s', '500ms') plus 'd' for days -> seconds."""
    t = text.strip()
    parts = _DURATION_RE.findall(t)
    if not t or not parts or "".join(n + u for n, u in parts) != t:
        raise ValueError(f"{what}: {text!r} is not a duration like 30s, 10m, 1h30m or 1d, "
                         "nor an RFC3339 time like 2026-01-02T15:04:05Z")
    unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(float(n) * unit[u] for n, u in parts)


def parse_time(text: str, what: str = "--since-time") -> float:
    """An RFC3339 time (kubectl's ``--since-time``: '2026-01-02T15:04:05Z', with a fraction
    or a numeric offset) -> epoch seconds. A time without a zone is refused."""
    import datetime

    t = text.strip()
    try:
        if not re.fullmatch(r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:\d\d)", t):
            raise ValueError
        return datetime.datetime.fromisoformat(t.replace("z", "Z").replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not an RFC3339 time like 2026-01-02T15:04:05Z "
                         "or 2026-01-02T16:04:05+01:00") from None


def parse_since(text: str, now: float) -> float:
    """``--since``: a duration back from ``now`` or an RFC3339 time -> epoch seconds."""
    if re.match(r"\d{4}-", text.strip()):
        return parse_time(text, "--since")
    return now - parse_duration(text)
