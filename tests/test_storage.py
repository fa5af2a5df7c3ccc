"""Storage roots behave the same on a local folder and on GCS (emulator, real client)."""

from __future__ import annotations

import pytest

from xrun_contract import Layout
from xrun_contract.storage import ChunkWriter, open_storage, read_chunks


@pytest.fixture(params=["local", "gcs"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    return request.getfixturevalue("gcs_bucket") + "/some/prefix"


def test_write_read_list_delete(root):
    st = open_storage(root)
    assert st.read_bytes("runs/a/run.json") is None
    st.write_json("runs/a/run.json", {"x": 1})
    st.write_text("runs/a/logs/0-0/attempt-000/00000000.log", "hello\n")
    st.write_text("runs/b/state.json", "{}")
    assert st.read_json("runs/a/run.json") == {"x": 1}
    objects, prefixes = st.list("runs")
    assert objects == [] and prefixes == ["runs/a", "runs/b"]
    objects, prefixes = st.list("runs/a")
    assert [o.key for o in objects] == ["runs/a/run.json"] and prefixes == ["runs/a/logs"]
    assert objects[0].size == len(b'{\n  "x": 1\n}\n')
    everything, _ = st.list("runs/a", delimiter=None)
    assert [o.key for o in everything] == [
        "runs/a/logs/0-0/attempt-000/00000000.log", "runs/a/run.json",
    ]
    assert st.delete_prefix("runs/a") == 2
    assert st.list("runs")[1] == ["runs/b"]


def test_chunk_writer_appends_new_objects(root):
    st = open_storage(root)
    w = ChunkWriter(st, lambda seq: Layout.log_chunk("r", "0-1", 0, seq), interval=3600)
    w.write("line 1\n")
    w.flush()
    w.write("line 2\n")
    w.write("line 3\n")
    w.close()
    chunks = list(read_chunks(st, Layout.host_logs("r", "0-1", 0)))
    assert [k.rsplit("/", 1)[1] for k, _ in chunks] == ["00000000.log", "00000001.log"]
    assert b"".join(d for _, d in chunks) == b"line 1\nline 2\nline 3\n"


def test_unknown_scheme_is_rejected():
    with pytest.raises(ValueError, match="unsupported scheme"):
        open_storage("s3://bucket/x")
