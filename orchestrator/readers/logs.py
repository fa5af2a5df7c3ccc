"""A run's logs as stored: every host's append-only chunks, read each chunk once.

The pod's log-shipping sidecar ships each host's output to ``runs/<name>/logs/<slice>-<host>/attempt-NNN/``
as numbered chunk objects; reading them back works from a folder or gs:// after the pods
are gone. Listing is one (paged) listing of the run's logs folder, or one per host asked
for; a tail reads chunks from the newest back, only as many as it needs; a follow lists each
host's chunks from the last one it read (``LogFollower``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from orchestrator.background import io_map
from orchestrator.readers.cursor import AttemptCursor
from orchestrator.readers.seen import SeenKeys
from xrun_contract import ATTEMPT_RE, CHUNK_SEQ_RE, Layout, split_stamp
from xrun_contract.storage import ObjectInfo, Storage

StampedLine = tuple[str, int, float, str]  # (host, attempt, epoch seconds, text)


@dataclass(frozen=True)
class LogChunk:
    host: str
    attempt: int
    key: str
    updated: float


def list_log_chunks(storage: Storage, name: str, hosts: set[str] | None = None) -> list[LogChunk]:
    """All log chunk objects of a run: one listing of the whole logs folder (paged by the
    store: a request per 1,000 chunks, whatever the number of hosts and attempts), or one
    per host asked for."""
    base = Layout.logs(name)
    chunks: list[LogChunk] = []
    for prefix in ([f"{base}/{h}" for h in sorted(hosts)] if hosts else [base]):
        objects, _ = storage.list(prefix, delimiter=None)
        chunks += log_chunks(base, objects, hosts)
    return merge_order(chunks)


def log_chunks(base: str, objects: Iterable[ObjectInfo], hosts: set[str] | None = None) -> list[LogChunk]:
    """The objects that are log chunks (``<base>/<host>/attempt-NNN/<chunk>``)."""
    chunks = []
    for o in objects:
        parts = o.key[len(base) + 1:].split("/")
        if len(parts) != 3 or (hosts and parts[0] not in hosts):
            continue
        m = ATTEMPT_RE.fullmatch(parts[1])
        if m:
            chunks.append(LogChunk(parts[0], int(m[1]), o.key, o.updated))
    return chunks


def merge_order(chunks: list[LogChunk]) -> list[LogChunk]:
    """Merge order: attempt, then write time, then host and sequence."""
    chunks.sort(key=lambda c: (c.attempt, c.updated, c.host, c.key))
    return chunks


def read_chunk_lines(storage: Storage, c: LogChunk, since: float | None = None) -> list[StampedLine] | None:
    """One chunk's lines (None when it vanished); ``since`` filters per line."""
    data = storage.read_bytes(c.key)
    if data is None:
        return None
    out = []
    for raw in data.decode("utf-8", errors="replace").splitlines():
        t, line = split_stamp(raw)
        t = c.updated if t is None else t
        if since is None or t >= since:
            out.append((c.host, c.attempt, t, line))
    return out


def tail_lines(storage: Storage, name: str, *, hosts: set[str] | None = None,
               since: float | None = None, tail: int | None = None, tail_per_host: int | None = None,
               keep: Callable[[StampedLine], bool] = lambda _x: True,
               attempts: Callable[[int], bool] = lambda _a: True,
               chunks: list[LogChunk] | None = None) -> list[StampedLine]:
    """The last ``tail`` lines of the merged stream (after the last ``tail_per_host`` of
    each host) that ``keep`` keeps, exactly as reading every chunk and cutting would give,
    but reading chunks from the newest back only until enough lines are found: a tail of
    100 lines reads a chunk or two, not every host's whole log. ``chunks``: a listing
    already made."""
    chunks = [c for c in (list_log_chunks(storage, name, hosts) if chunks is None else chunks)
              if attempts(c.attempt) and (since is None or c.updated >= since)]
    Keyed = tuple[int, int, StampedLine]  # (chunk's place in merge order, line in chunk, line)

    def last(order: list[int], n: int | None) -> list[Keyed]:
        got: list[Keyed] = []
        for i in reversed(order):
            if n is not None and len(got) >= n:
                break
            lines = [x for x in read_chunk_lines(storage, chunks[i], since) or [] if keep(x)]
            got = [(i, j, x) for j, x in enumerate(lines)] + got
        return got[len(got) - n:] if n else ([] if n == 0 else got)

    if tail_per_host is not None:
        by_host: dict[str, list[int]] = {}
        for i, c in enumerate(chunks):
            by_host.setdefault(c.host, []).append(i)
        keyed = sorted(k for got in io_map(lambda o: last(o, tail_per_host), by_host.values())
                       for k in got)
        lines = [x for _i, _j, x in keyed]
        return (lines[len(lines) - tail:] if tail else []) if tail is not None else lines
    return [x for _i, _j, x in last(list(range(len(chunks))), tail)]


FOLLOW_BATCH = 64  # chunks read ahead of the lines yielded (a 256 KiB chunk: 16 MiB at most)


class LogFollower:
    """Yields (host, attempt, line) for chunks not yet seen; call ``poll`` repeatedly.

    ``since`` filters per line: a chunk written before it is skipped unread (its lines are
    older still), and inside a newer chunk each line's wrapper stamp decides (an unstamped
    line, from before stamping, is dated by its chunk)."""

    def __init__(self, storage: Storage, name: str, hosts: set[str] | None = None,
                 since: float | None = None):
        self.storage, self.name, self.hosts, self.since = storage, name, hosts, since
        self.seen = SeenKeys()  # bounded: a range per writer, not a name per chunk
        # Per host, where its next listing starts (``AttemptCursor``): a poll lists the
        # chunks each host wrote since the last one read, not every chunk of the run.
        self.cursors: dict[str, AttemptCursor] = {}
        self.chunks_read = 0
        self.listed = 0  # objects the last poll listed (what its listings cost)

    def _list(self) -> list[LogChunk]:
        """This poll's listing. One listing of the whole logs folder costs a request per
        1,000 chunks of the run; one per host from its cursor costs a request per host and
        lists only what is new. Per host once the run holds more chunks than its hosts'
        requests cost (at once on a folder; on GCS past ~100 chunks a host), and always for
        the hosts asked for. A host not seen yet is found by a delimiter listing of the
        logs folder (its host folders: one entry a host, whatever the chunks)."""
        base = Layout.logs(self.name)
        hosts = sorted(self.hosts) if self.hosts else None
        if hosts is None:
            cost = self.storage.listing_cost * max(1, len(self.cursors))
            if cost > self.chunks_read:
                for cursor in self.cursors.values():  # floors move on here too
                    cursor.begin()
                chunks = list_log_chunks(self.storage, self.name)
                self.listed = len(chunks)
                for c in chunks:
                    self.cursors.setdefault(c.host, AttemptCursor())
                return chunks
            _, prefixes = self.storage.list(base)
            hosts = [p.rsplit("/", 1)[-1] for p in prefixes]
        for h in hosts:
            self.cursors.setdefault(h, AttemptCursor()).begin()

        def one(h: str) -> list[ObjectInfo]:
            return self.storage.list_from(f"{base}/{h}", self.cursors[h].start(f"{base}/{h}/attempt-", "/"))

        listed = list(io_map(one, hosts))
        self.listed = sum(len(x) for x in listed)
        return merge_order([c for objects in listed for c in log_chunks(base, objects, self.hosts)])

    def skip(self, chunks: Iterable[LogChunk]) -> None:
        """Take ``chunks`` as read (a tail printed them): the follow goes on after them."""
        for c in chunks:
            self._read(c)

    def _read(self, c: LogChunk) -> None:
        self.seen.add(c.key)
        self.chunks_read += 1
        m = CHUNK_SEQ_RE.search(c.key)
        if m:
            self.cursors.setdefault(c.host, AttemptCursor()).read(c.attempt, int(m[1]))

    def poll_stamped(self) -> Iterator[StampedLine]:
        new = []
        for c in self._list():
            if c.key in self.seen:
                continue
            if self.since is not None and c.updated < self.since:
                self._read(c)
                continue
            new.append(c)
        # A poll of a thousand hosts finds a new chunk for each: read IO_THREADS at once
        # (one after the other they took tens of seconds), a batch at a time so memory
        # stays bounded, lines in listing order.
        for i in range(0, len(new), FOLLOW_BATCH):
            batch = new[i:i + FOLLOW_BATCH]
            read = io_map(lambda c: read_chunk_lines(self.storage, c, self.since), batch)
            for c, lines in zip(batch, read, strict=True):
                if lines is None:
                    continue
                self._read(c)
                yield from lines
        for cursor in self.cursors.values():  # every chunk listed is read: on from there
            cursor.end()

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
