"""Each storage poll of a follow lists only the chunks written since the last one (#53): a
poll after N chunks lists O(new) objects, not O(N), on a folder root and on gs://, and a
writer that appears later (a new host, a new attempt, a restarted log shipper whose tag
sorts before its predecessor's) is still found, every line once."""

from __future__ import annotations

import collections
import json
import urllib.parse
from collections.abc import Callable
from typing import Any

from orchestrator.readers.loaders import StoredRun
from orchestrator.readers.logs import LogFollower
from xrun_contract import Layout
from xrun_contract.storage import GCSStorage, LocalStorage, Storage

TAG, LATER_TAG = "ab12cd34", "0a0a0a0a"  # a restarted shipper's tag may sort first


def counting(cls: type[Storage]) -> type:
    class Counting(cls):  # type: ignore[valid-type, misc]
        """A real storage that counts the objects its listings return."""

        listed = 0

        def list(self, prefix, delimiter="/"):
            objects, prefixes = super().list(prefix, delimiter)
            self.listed += len(objects)
            return objects, prefixes

        def list_from(self, prefix, start):
            objects = super().list_from(prefix, start)
            self.listed += len(objects)
            return objects

    return Counting


def step(name: str, attempt: int, seq: int) -> bytes:
    return (json.dumps({"kind": "step", "time": 1e9 + seq, "attempt": attempt, "step": seq + 1,
                        "seconds": 0.5, "loss": 1.0 / (seq + 1)}) + "\n").encode()


def put_metrics(st: Storage, name: str, attempt: int, seq: int, tag: str = TAG) -> None:
    st.write_bytes(Layout.metrics_chunk(name, attempt, seq, tag), step(name, attempt, seq))


def put_log(st: Storage, name: str, host: str, attempt: int, seq: int, tag: str = TAG) -> str:
    line = f"{host} a{attempt} c{seq} {tag}"
    st.write_bytes(Layout.log_chunk(name, host, attempt, seq, tag), f"{line}\n".encode())
    return line


def poll(reader: StoredRun, follower: LogFollower) -> tuple[int, list[str]]:
    """One poll of each, as a follow makes them: (objects listed, log lines printed)."""
    st: Any = reader.storage
    st.listed = 0
    reader.poll()
    lines = [text for _h, _a, text in follower.poll()]
    return st.listed, lines


def scenario(reading: Any, n: int, writer: Storage | None = None,
             after: Callable[[], None] = lambda: None) -> None:
    """The follow reads through ``reading`` (a counting storage), chunks are written through
    ``writer`` (``reading`` by default); ``after`` is called after the follow's last poll."""
    from concurrent.futures import ThreadPoolExecutor

    name = "long"
    hosts = ["0-0", "0-1"]
    st = w = writer or reading
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda seq: put_metrics(w, name, 0, seq), range(n)))
        written = list(pool.map(lambda hs: put_log(w, name, hs[0], 0, hs[1]),
                                [(h, seq) for seq in range(n) for h in hosts]))
    reader, follower = StoredRun(reading, name), LogFollower(reading, name)
    listed, printed = poll(reader, follower)
    assert listed >= 3 * n and sorted(printed) == sorted(written)

    # One more chunk of each writer: the poll lists the last one read and the new one.
    new = [put_log(st, name, h, 0, n) for h in hosts]
    put_metrics(st, name, 0, n)
    listed, lines = poll(reader, follower)
    assert sorted(lines) == sorted(new) and reader.rec.steps.count == n + 1
    assert listed <= 6, f"a poll after {n} chunks listed {listed} objects"
    printed += lines

    # Writers that appear later: a new host, a new attempt of 0-0 (and of the metrics), a
    # restarted shipper of 0-1 resuming at its predecessor's last number under a tag that
    # sorts first; attempt 0 of 0-0 still writes its last chunk after attempt 1 began.
    later = [put_log(st, name, "0-2", 0, 0), put_log(st, name, "0-0", 1, 0),
             put_log(st, name, "0-1", 0, n, LATER_TAG), put_log(st, name, "0-0", 0, n + 1)]
    put_metrics(st, name, 1, 0)
    listed, lines = poll(reader, follower)
    assert sorted(lines) == sorted(later) and reader.rec.steps.count == n + 2
    printed += lines
    late = put_log(st, name, "0-0", 0, n + 2)  # before the next poll: still listed
    _, lines = poll(reader, follower)
    assert lines == [late]
    printed += lines

    # Attempt 0 is left now: a new chunk of attempt 1 is listed with the few after it.
    more = [put_log(st, name, "0-0", 1, 1)]
    put_metrics(st, name, 1, 1)
    listed, lines = poll(reader, follower)
    assert lines == more and listed <= 8, listed
    printed += lines
    assert reader.rec.steps.count == n + 3
    after()

    # Every line stored printed once: what a fresh follower reads in one poll.
    everything = [text for _h, _a, text in LogFollower(st, name).poll()]
    assert collections.Counter(printed) == collections.Counter(everything)
    assert len(set(printed)) == len(printed)
    assert list(StoredRun(st, name).poll().steps.step) == list(reader.rec.steps.step)


def test_a_poll_of_a_folder_root_lists_what_is_new(tmp_path):
    scenario(counting(LocalStorage)(str(tmp_path)), n=150)


def test_a_poll_of_a_gcs_root_lists_from_the_last_chunk_read(gcs_bucket, gcs_proxy, monkeypatch):
    """Through the fault proxy, which records every request: after the first, each poll's
    listings of chunks carry ``startOffset`` and return a few objects, whatever N."""
    writer = GCSStorage(gcs_bucket)  # straight to the emulator: the writes are not counted
    for k, v in gcs_proxy.env().items():
        monkeypatch.setenv(k, v)
    st = counting(GCSStorage)(gcs_bucket)
    st.listing_cost = 10  # the switch to per-host listings (here past 20 chunks; really ~200)
    requests: list[tuple[str, str]] = []
    scenario(st, n=60, writer=writer, after=lambda: requests.extend(gcs_proxy.requests))
    lists = [urllib.parse.urlsplit(path) for method, path in requests
             if method == "GET" and urllib.parse.urlsplit(path).path.endswith("/o")]
    queries = [urllib.parse.parse_qs(u.query) for u in lists]
    chunk_lists = [q for q in queries if "delimiter" not in q and "/metrics-rollup" not in q["prefix"][0]]
    offsets = [q["startOffset"][0] for q in chunk_lists if "startOffset" in q]
    assert offsets, "no listing asked for a startOffset"
    # The last poll's: the metrics from attempt 1's chunk read last, each host from its own.
    assert offsets[-4:-3] == [Layout.metrics_chunk("long", 1, 0).removesuffix(".jsonl")], offsets[-4:]
    assert sorted(offsets[-3:]) == [f"{Layout.host_logs('long', '0-0', 1)}/00000000",
                                    f"{Layout.host_logs('long', '0-1', 0)}/00000060",
                                    f"{Layout.host_logs('long', '0-2', 0)}/00000000"], offsets[-3:]


def test_a_follow_after_a_tail_lists_from_the_chunks_the_tail_covered(tmp_path):
    """`xrun logs --tail N -f`: the chunks the tail listed are taken as read, and the
    follow's next poll lists from each host's last one, not the run's every chunk."""
    from orchestrator.readers.logs import list_log_chunks

    st = counting(LocalStorage)(str(tmp_path))
    for seq in range(100):
        for h in ("0-0", "0-1"):
            put_log(st, "r", h, 0, seq)
    follower = LogFollower(st, "r")
    follower.skip(list_log_chunks(st, "r"))
    new = put_log(st, "r", "0-1", 0, 100)
    st.listed = 0
    assert [text for _h, _a, text in follower.poll()] == [new]
    assert st.listed <= 3, st.listed


def test_an_attempt_of_more_digits_is_found_though_it_sorts_first(tmp_path):
    """``attempt-1000`` sorts before ``attempt-150`` (a run resumed past 999 attempts): the
    listing never starts after it, so it is still found, as is the metrics'."""
    st = counting(LocalStorage)(str(tmp_path))
    reader, follower = StoredRun(st, "r"), LogFollower(st, "r")
    first = put_log(st, "r", "0-0", 150, 0)
    put_metrics(st, "r", 150, 0)
    assert poll(reader, follower)[1] == [first]
    second = put_log(st, "r", "0-0", 151, 0)
    put_metrics(st, "r", 151, 0)
    assert poll(reader, follower)[1] == [second]
    assert poll(reader, follower)[1] == []  # attempt 150 is left now: the floor is 151
    third = put_log(st, "r", "0-0", 1000, 0)
    put_metrics(st, "r", 1000, 0)
    assert poll(reader, follower)[1] == [third]
    assert list(reader.rec.steps.attempt) == [150, 151, 1000]


KEYS = ["p/a.txt", "p/a-b/x", "p/a/b", "p/a/c/d", "p/a0", "p/b/attempt-000/00000001-ab.log",
        "p/b/attempt-000/00000002-0a.log", "p/b/attempt-000/00000002-ab.log", "p/b/attempt-1000/00000000-ab.log",
        "p/b/attempt-101/00000000-ab.log", "q/outside"]
STARTS = ["", "p", "p/", "p/a", "p/a/", "p/a/b", "p/a/bb", "p/a-", "p/a/c", "p/b/attempt-000/00000002",
          "p/b/attempt-1000", "p/b/attempt-101", "p/c", "z"]


def test_list_from_is_a_whole_listing_filtered_on_every_store(tmp_path, gcs_bucket):
    """``list_from(prefix, start)``: exactly the keys below ``prefix`` at or after ``start``,
    in key order, on a folder, on GCS through google-cloud-storage and through the JSON API."""
    from xrun_contract.gcs_http import GCSHttpStorage

    for st in (LocalStorage(str(tmp_path)), GCSStorage(gcs_bucket), GCSHttpStorage(f"{gcs_bucket}/a/root"),
               GCSStorage(f"{gcs_bucket}/a/root/")):
        for key in KEYS:
            st.write_bytes(key, b"x")
        whole = [o.key for o in st.list("p", delimiter=None)[0]]
        assert whole == sorted(k for k in KEYS if k.startswith("p/")), (st, whole)
        for start in STARTS:
            got = [o.key for o in st.list_from("p", start)]
            assert got == [k for k in whole if k >= start], (type(st).__name__, start, got)
