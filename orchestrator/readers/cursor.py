"""Where a follow's next listing of a run's chunks starts, so that a poll lists what is new.

A poll that listed every chunk of a run grew with the run (a 20,000-step run: tens of
thousands of names every 2 s, a transient list the allocator keeps as its peak, and requests
and CPU in proportion). Chunk names sort by restart attempt, then sequence number
(``xrun_contract.Layout``: ``attempt-NNN-SSSSSSSS-<tag>.jsonl`` in the metrics folder,
``attempt-NNN/SSSSSSSS-<tag>.log`` in a host's log folder; both zero-padded), so a listing
that starts at the last chunk read (GCS ``startOffset``, a folder walk that skips the names
before it) holds only the chunks written since, and new attempts, which sort after.

Why the bound is the highest *sequence number* read, inclusive, and not the last *name*: the
writer tag follows the number, and a restarted log shipper (a new tag) resumes at the number
its predecessor last wrote (``workload.sidecar.Shipper``: the chunk is written before the
offset is recorded), so its first chunk may share that number and sort before the name read
last. A rerun metrics writer starts past the attempt's last number (``next_chunk_seq``).

Why an earlier attempt can be left: a new attempt of a host starts only once that host's
previous pod has ended, its log shipper's last chunk written (JobSet deletes the old Jobs
with foreground propagation and creates a Job again only once none of its name is left:
kubernetes-sigs/jobset ``pkg/controllers/jobset_controller.go``, ``deleteJobs`` and
``shouldCreateJob``; the local supervisor stops and joins every pod first). So once a poll
that began after a chunk of attempt N+1 was seen has listed from attempt N's last chunk, no
chunk of attempt N is left unlisted, and later polls start at attempt N+1.
"""

from __future__ import annotations


class AttemptCursor:
    """The chunks read under one prefix whose names sort by (attempt, sequence number)."""

    def __init__(self) -> None:
        self.top: dict[int, int] = {}  # attempt -> highest sequence number read
        self.floor = 0  # the lowest attempt still listed
        self._known: int | None = None  # the newest attempt read before this poll began

    def begin(self) -> None:
        """A poll starts: the attempts read so far are those it may close."""
        self._known = max(self.top, default=None)

    def read(self, attempt: int, seq: int) -> None:
        if attempt >= self.floor and self.top.get(attempt, -1) < seq:
            self.top[attempt] = seq

    def end(self) -> None:
        """The poll listed from the floor and read all it listed: an attempt older than the
        newest one known when it began has no chunk left to list."""
        if self._known is not None and self._known > self.floor:
            self.floor = self._known
            self.top = {a: s for a, s in self.top.items() if a >= self.floor}

    def start(self, head: str, sep: str) -> str:
        """The key to list from: ``head`` + the floor attempt + ``sep`` + its highest number
        read (zero-padded as ``Layout`` writes them). Never after a longer attempt number:
        ``attempt-1000`` sorts before ``attempt-101``, so from attempt 101 on the bound is
        the first name of the next width (a run resumed past 100 attempts lists a little more).
        Before any chunk is read: from the start (a name of another form, read as before)."""
        if not self.top and not self.floor:
            return ""
        key = f"{head}{self.floor:03d}{sep}{self.top.get(self.floor, 0):08d}"
        wider = f"{head}1{'0' * max(3, len(str(self.floor)))}"
        return min(key, wider)
