"""Readers that read only what they need (bench/bench_cluster_scale.py at 1,024 hosts):
a tail reads chunks from the newest back, and a long run's metrics are read through the
writer's rollups, with the very same result as reading every chunk."""

from __future__ import annotations

import json
import random

import pytest

from orchestrator.readers.loaders import StoredRun
from orchestrator.readers.logs import LogFollower, tail_lines
from xrun_contract import METRICS_ROLLUP_EVERY, Layout, records, stamp_line
from xrun_contract.storage import ChunkWriter, LocalStorage


class Counting(LocalStorage):
    """A real local storage root that counts reads and listings (what a GCS bill counts)."""

    def __init__(self, root: str):
        super().__init__(root)
        self.reads: list[str] = []
        self.lists = 0

    def read_bytes(self, key: str):
        self.reads.append(key)
        return super().read_bytes(key)

    def list(self, prefix: str, delimiter: str | None = "/"):
        self.lists += 1
        return super().list(prefix, delimiter)


def write_logs(st: LocalStorage, name: str, hosts: int, chunks: int, lines: int) -> None:
    rnd = random.Random(7)
    t = 1_700_000_000.0
    for attempt in (0, 1):
        for seq in range(chunks):
            for h in range(hosts):
                t += rnd.random()
                text = "".join(stamp_line(t + i * 1e-3, f"h{h} a{attempt} c{seq} l{i}\n") for i in range(lines))
                st.write_bytes(Layout.log_chunk(name, f"0-{h}", attempt, seq, "ab"), text.encode())


@pytest.mark.parametrize("tail,per_host", [(100, None), (7, None), (0, None), (None, 3), (5, 2), (10_000, None)])
def test_tail_reads_from_the_newest_back_and_equals_a_full_read(tmp_path, tail, per_host):
    st = Counting(str(tmp_path))
    write_logs(st, "r", hosts=6, chunks=5, lines=30)
    everything = list(LogFollower(st, "r").poll_stamped())
    want = everything
    if per_host is not None:
        by: dict[str, list[int]] = {}
        for i, x in enumerate(want):
            by.setdefault(x[0], []).append(i)
        keep = {i for idx in by.values() for i in idx[-per_host:]}
        want = [x for i, x in enumerate(want) if i in keep]
    if tail is not None:
        want = want[len(want) - tail:] if tail else []
    st.reads.clear()
    got = tail_lines(st, "r", tail=tail, tail_per_host=per_host)
    assert got == want
    if tail == 100 and per_host is None:
        assert len(st.reads) == 4  # 30 lines a chunk: the newest four, of 60
    if per_host is not None:
        assert len(st.reads) == 6  # one chunk of each host


def test_a_long_runs_metrics_are_read_through_its_rollups(tmp_path):
    st = Counting(str(tmp_path))
    chunks = METRICS_ROLLUP_EVERY * 3 + 7
    for attempt in (0, 1):
        w = ChunkWriter(st, lambda seq, a=attempt: Layout.metrics_chunk("r", a, seq, "cafe"), interval=3600,
                        rollup_key_for=lambda seq, a=attempt: Layout.metrics_rollup("r", a, seq, "cafe"),
                        rollup_every=METRICS_ROLLUP_EVERY)
        for i in range(chunks):
            w.write(records.to_json(records.Step(step=attempt * 1000 + i, seconds=0.5, loss=1.0 / (i + 1),
                                                 time=float(i), attempt=attempt)) + "\n")
            w.flush()
        w.close()
    st.write_json(Layout.run_json("r"), {"name": "r"})

    whole = Counting(str(tmp_path))
    # every chunk read one by one: what the reader did before rollups
    expected = []
    for o in sorted(whole.list(Layout.metrics("r"))[0], key=lambda o: o.key):
        expected += [records.parse(json.loads(line)) for line in whole.read_bytes(o.key).decode().splitlines()]
    st.reads.clear()
    reader = StoredRun(st, "r")
    rec = reader.poll()
    assert list(rec.steps.step) == [r.step for r in expected]
    assert list(rec.steps.attempt) == [r.attempt for r in expected]
    metrics_reads = [k for k in st.reads if "/metrics" in k]
    assert len(metrics_reads) == 2 * (1 + 7), metrics_reads  # a rollup and the chunks after it, per attempt
    # later polls read only new chunks, never a rollup again
    w = ChunkWriter(st, lambda seq: Layout.metrics_chunk("r", 1, seq, "beef"), interval=3600, start_seq=chunks)
    w.write(records.to_json(records.Step(step=5000, attempt=1, time=1.0)) + "\n")
    w.close()
    st.reads.clear()
    assert reader.poll().steps.step[-1] == 5000
    assert [k for k in st.reads if "/metrics" in k] == [Layout.metrics_chunk("r", 1, chunks, "beef")]


def _pod(host: int, attempt: int, phase: str, workload_state: dict, **extra) -> dict:
    """A JobSet pod as the API server serves it (managedFields, volumes and all)."""
    meta = {"name": f"r-slice-0-{host}-x{attempt}", "namespace": "default", "uid": f"u{host}-{attempt}",
            "creationTimestamp": f"2026-12-06T10:0{attempt}:00Z", "resourceVersion": "77",
            "labels": {"jobset.sigs.k8s.io/job-global-index": "0", "jobset.sigs.k8s.io/restart-attempt": str(attempt),
                       "batch.kubernetes.io/job-completion-index": str(host)},
            "annotations": {"batch.kubernetes.io/job-completion-index": str(host)},
            "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:status": {"f:conditions": {".": {}}}}}] * 20,
            **extra.pop("metadata", {})}
    spec = {"volumes": [{"name": "xrun", "emptyDir": {}}], "nodeName": "n1",
            "containers": [{"name": "workload", "image": "img", "env": [
                {"name": "XRUN_ATTEMPT_BASE", "value": "2"},
                {"name": "P", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}],
            **extra.pop("spec", {})}
    status = {"phase": phase, "hostIP": "10.0.0.1", "qosClass": "BestEffort",
              "conditions": [{"type": "PodScheduled", "status": "False" if phase == "Pending" else "True",
                              "reason": "Unschedulable", "message": "0/4 nodes are available", "lastProbeTime": None}],
              "initContainerStatuses": [{"name": "xrun-init", "image": "i", "imageID": "", "ready": False,
                                         "restartCount": 0,
                                         "state": {"waiting": {"reason": "ErrImagePull", "message": "pull denied"}},
                                         "lastState": {}}] if host == 3 else [],
              "containerStatuses": [{"name": "workload", "image": "img", "imageID": "", "ready": True,
                                     "restartCount": 1,
                                     "state": workload_state, "lastState": {"terminated": {"exitCode": 1}}}],
              **extra.pop("status", {})}
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec, "status": status}


def test_status_reads_the_same_of_a_lean_pod_list():
    """`xrun status` decodes a LIST of pods keeping only the fields it reads (state.loads_pods):
    what it makes of each pod (host, state, attempt, exit code, reason, whether the attempt is
    ending) is what the whole objects say, and the rest (managedFields) is not kept."""
    from orchestrator.backends.kube.state import (
        attempt_ending,
        container_started,
        latest_hosts,
        loads,
        loads_pods,
        restart_count,
        run_attempt,
    )

    pods = [
        _pod(0, 0, "Running", {"running": {"startedAt": "2026-12-06T10:00:05Z"}}),
        _pod(0, 1, "Failed", {"terminated": {"exitCode": 42, "reason": "Error", "message": "m"}}),
        _pod(1, 1, "Running", {"running": {}}, metadata={"deletionTimestamp": "2026-12-06T10:05:00Z"}),
        _pod(2, 1, "Pending", {}, spec={"schedulingGates": [{"name": "g"}]}, status={"conditions": []}),
        _pod(3, 1, "Pending", {"waiting": {"reason": "PodInitializing"}}),
        _pod(4, 1, "Pending", {}, status={"containerStatuses": []}),
        _pod(5, 1, "Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}, status={"reason": "Evicted"}),
    ]
    data = json.dumps({"kind": "PodList", "metadata": {"resourceVersion": "99"}, "items": pods}).encode()
    full, lean = loads(data), loads_pods(data)
    assert lean["metadata"]["resourceVersion"] == "99"
    assert all("managedFields" not in p["metadata"] and "volumes" not in p["spec"] for p in lean["items"])
    assert latest_hosts(lean["items"]) == latest_hosts(full["items"])
    assert [h.reason for h in latest_hosts(lean["items"])][2:] == [
        "SchedulingGated", "ErrImagePull: init container xrun-init: pull denied",
        "Unschedulable: 0/4 nodes are available", "OOMKilled"]
    for fn in (run_attempt, container_started, restart_count):
        assert [fn(p) for p in lean["items"]] == [fn(p) for p in full["items"]]
    for restarts in (0, 1):
        jobset = {"status": {"restarts": restarts}}
        assert attempt_ending(lean["items"], jobset) == attempt_ending(full["items"], jobset)
    # an answer that does not fit the types is read whole, as before
    odd = json.dumps({"items": [{"metadata": {"name": 7}}]}).encode()
    assert loads_pods(odd) == {"items": [{"metadata": {"name": 7}}]}


def test_a_followed_run_reads_the_same_of_lean_watch_events():
    """`submit --follow` decodes its pod WATCH lines keeping only the fields xrun reads
    (state.loads_pod_event): the pods it keeps make the same hosts as the whole objects, a
    bookmark keeps its resourceVersion, and an ERROR's Status is read whole."""
    from orchestrator.backends.kube.state import latest_hosts, loads_pod_event, project_pod

    pods = [
        _pod(0, 0, "Running", {"running": {"startedAt": "2026-12-06T10:00:05Z"}}),
        _pod(1, 1, "Running", {"running": {}}, metadata={"deletionTimestamp": "2026-12-06T10:05:00Z"}),
        _pod(3, 1, "Pending", {"waiting": {"reason": "PodInitializing"}}),
        _pod(5, 1, "Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}, status={"reason": "Evicted"}),
    ]
    lines = [json.dumps({"type": "MODIFIED", "object": p}) for p in pods]
    lean = [loads_pod_event(line) for line in lines]
    assert all(e["type"] == "MODIFIED" and "managedFields" not in e["object"]["metadata"] for e in lean)
    assert [e["object"]["metadata"]["resourceVersion"] for e in lean] == ["77"] * 4
    assert (latest_hosts([e["object"] for e in lean])
            == latest_hosts([json.loads(line)["object"] for line in lines])
            == latest_hosts([project_pod(json.loads(line)["object"]) for line in lines]))
    bookmark = loads_pod_event('{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1",'
                               '"metadata":{"resourceVersion":"12345","annotations":'
                               '{"k8s.io/initial-events-end":"true"}}}}')
    assert bookmark["object"]["metadata"]["resourceVersion"] == "12345"
    error = ('{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},'
             '"status":"Failure","message":"too old resource version: 1 (99)","reason":"Expired","code":410}}')
    assert loads_pod_event(error)["object"]["code"] == 410


def test_a_followed_runs_state_change_does_not_wait_for_its_events(monkeypatch):
    """A followed run's Restarting is answered from the watch at once; its events (LISTs
    that take seconds at a 1,024-pod restart) are asked in a thread and shown a view later."""
    import threading
    import time

    from orchestrator.backends.kube.backend import KubeBackend

    asked = threading.Event()

    def slow_events(self, jobset, pods):
        asked.set()
        time.sleep(2.0)
        return [{"involvedObject": {"kind": "JobSet", "name": "r"}, "reason": "Restarting",
                 "message": "jobset r is restarting", "type": "Normal", "count": 1}]

    monkeypatch.setattr(KubeBackend, "run_events", slow_events)
    jobset = {"metadata": {"name": "r", "uid": "u"},
              "spec": {"replicatedJobs": [{"name": "slice", "replicas": 1,
                                           "template": {"spec": {"parallelism": 2, "completions": 2}}}],
                       "failurePolicy": {"maxRestarts": 3}},
              "status": {"restarts": 1}}

    class Watch:
        def snapshot(self):
            return jobset, []

    backend = KubeBackend("ctx", "default")
    backend._watches["r"] = Watch()
    t = time.monotonic()
    first = backend.status("r")
    assert time.monotonic() - t < 1.0
    assert first.state == "Restarting" and first.events == []
    assert asked.wait(2.0)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not backend.status("r").events:
        time.sleep(0.1)
    assert any("restarting" in e for e in backend.status("r").events)


def test_status_lists_the_pods_beside_the_jobsets_get(monkeypatch):
    """`xrun status` asks for the JobSet and its pods' LIST together (the LIST, 37 MB at 1,024
    pods, is most of its wait): here the GET is answered only once the LIST has been asked,
    which a status asking one after the other never does. A gone JobSet's LIST is dropped."""
    import threading

    from orchestrator.backends.kube.backend import JOBSET_CRD, KubeBackend

    listed = threading.Event()
    jobset = {"metadata": {"name": "r", "uid": "u"},
              "spec": {"replicatedJobs": [{"name": "slice", "replicas": 1,
                                           "template": {"spec": {"parallelism": 2, "completions": 2}}}],
                       "failurePolicy": {"maxRestarts": 3}},
              "status": {"restarts": 0}}
    pods = [_pod(h, 0, "Running", {"running": {"startedAt": "2026-12-06T10:00:05Z"}}) for h in (0, 1)]
    for p in pods:
        p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] = "0"
    asked: list[str] = []
    gone = False

    def call(self, verb, resource, fn, *args, decode=None, missing_ok=False, **kwargs):
        asked.append(f"{verb} {resource}")
        if resource == "pods":
            listed.set()
            data = json.dumps({"metadata": {"resourceVersion": "9"}, "items": pods}).encode()
            return decode(data)
        assert listed.wait(5.0), "the JobSet's GET came first and alone"
        return None if gone else jobset

    monkeypatch.setattr(KubeBackend, "call", call)
    monkeypatch.setattr(KubeBackend, "ended_from_events", lambda self, name: None)
    backend = KubeBackend("ctx", "default")
    backend._client = object()  # no kubeconfig read: `call` answers
    status = backend.status("r")
    assert status.state == "Running" and [h.state for h in status.hosts] == ["Running", "Running"]
    assert sorted(asked) == [f"get {JOBSET_CRD}", "list pods"]
    gone, asked[:] = True, []
    listed.clear()
    assert backend.status("r") is None
