"""One projection of a pod: listed (a LIST answer), watched (a WATCH event) or read whole,
xrun keeps the same fields of it (``state._Pod``), so status reads a followed run's pods as
it reads listed ones."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

from orchestrator.backends.kube.state import (
    loads_pod_event,
    loads_pods,
    project_pod,
    run_attempt,
)
from orchestrator.backends.kube.watch import RunWatch
from xrun_contract import Env
from xrun_contract.k8s import Labels


def _pod(uid: str = "u-1") -> dict:
    """A JobSet pod as the API server serves it (the parts that matter, and some that don't)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "r-slice-0-1-abcde", "namespace": "team", "uid": uid, "resourceVersion": "42",
            "creationTimestamp": "2026-12-06T10:00:00Z",
            "labels": {Labels.JOBSET_NAME: "r", Labels.RESTART_ATTEMPT: "1",
                       Labels.JOB_GLOBAL_INDEX: "0"},
            "annotations": {"batch.kubernetes.io/job-completion-index": "1"},
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
            "ownerReferences": [{"kind": "Job", "name": "r-slice-0"}],
        },
        "spec": {
            "nodeName": "node-7",
            "schedulingGates": [{"name": "gate"}],
            "volumes": [{"name": "xrun", "emptyDir": {}}],
            "containers": [{"name": "workload", "image": "python:3.12-slim",
                            "env": [{"name": Env.ATTEMPT_BASE, "value": "2"},
                                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}],
                            "resources": {"limits": {"cpu": "1"}}}],
        },
        "status": {
            "phase": "Running", "podIP": "10.0.0.7", "qosClass": "Burstable",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "workload", "restartCount": 0, "image": "x",
                                   "state": {"running": {"startedAt": "2026-12-06T10:00:01Z"}}}],
        },
    }


class _Resp:
    def __init__(self, data: bytes):
        self.data = data

    def release_conn(self) -> None:
        pass


def _watch(pods: list[dict]) -> RunWatch:
    """A RunWatch whose backend answers one LIST of ``pods``."""
    answer = json.dumps({"metadata": {"resourceVersion": "42"}, "items": pods}).encode()
    core = SimpleNamespace(list_namespaced_pod=None)
    backend = SimpleNamespace(namespace="team", _apis=lambda: (None, core),
                              _raw=lambda *a, **k: _Resp(answer))
    return RunWatch(backend, "r")  # type: ignore[arg-type]


def test_a_watched_and_a_listed_pod_project_the_same():
    pod = _pod()
    listed = loads_pods(json.dumps({"items": [pod]}))["items"][0]
    w = _watch([pod])
    w._list("pods")
    (from_list,) = w.pods.values()
    w2 = _watch([])
    w2._list("pods")
    event = loads_pod_event(json.dumps({"type": "ADDED", "object": pod}))
    w2._apply("pods", event["type"], event["object"])
    (watched,) = w2.pods.values()
    assert listed == from_list == watched == project_pod(pod)
    assert "managedFields" not in watched["metadata"] and "volumes" not in watched["spec"]
    # What the readers take from either: a resumed run's attempt (the JobSet's 1 + base 2).
    assert run_attempt(watched) == run_attempt(listed) == 3
    assert watched["spec"]["nodeName"] == "node-7" and watched["metadata"]["namespace"] == "team"


def test_a_pod_that_does_not_fit_the_types_is_projected_the_same():
    """An answer msgspec cannot decode into the types is read whole, then projected."""
    odd = _pod()
    odd["metadata"]["labels"]["count"] = 3  # not a string: msgspec's decode refuses it
    odd["status"]["containerStatuses"][0]["restartCount"] = "0"
    listed = loads_pods(json.dumps({"items": [odd]}))["items"][0]
    watched = loads_pod_event(json.dumps({"type": "MODIFIED", "object": odd}))["object"]
    assert listed == watched == project_pod(odd)
    assert "managedFields" not in listed["metadata"] and "podIP" not in listed["status"]
    fit = project_pod(_pod())
    assert {k: v for k, v in listed["metadata"].items() if k != "labels"} == {
        k: v for k, v in fit["metadata"].items() if k != "labels"}


def test_projection_leaves_the_pod_it_read_alone():
    pod = _pod()
    before = copy.deepcopy(pod)
    project_pod(pod)
    assert pod == before
