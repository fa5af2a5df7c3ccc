"""xrun's kube backend under the real JobSet, Job and scheduler controllers, with pods on
KWOK nodes taken through timed stages (tests/cluster/up.sh).

Each test runs the real `xrun` CLI (subprocess, KUBECONFIG at the cluster, gs:// storage on
the emulator) and asserts on its exit code and lines, and on the cluster's objects.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import xrun, xrun_popen
from cluster_helpers import Cluster, timing, unique

CONTEXT = "xrun-test"


def run_file(tmp_path: Path, name: str, **values: Any) -> str:
    spec = {"name": name, "accelerator": "v6e-8", "image": "example.com/xrun:1",
            "xrun_image": "example.com/xrun-workload:1", "command": "python3 -m workload.train",
            "context": CONTEXT, "pod_annotations": timing(run_s=4.0),
            # KWOK deletes a pod at a random time within its grace period (kwok
            # kustomize/stage/pod/general/pod-delete.yaml): a process that ends soon after
            # SIGTERM, as the workload does.
            "termination_grace_seconds": 2}
    spec.update(values)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def cli(cluster: Cluster, storage: str, *args: str, timeout: float = 240):
    return xrun(*args, storage=storage, timeout=timeout, KUBECONFIG=cluster.kubeconfig)


def status_json(cluster: Cluster, storage: str, name: str) -> dict[str, Any]:
    r = cli(cluster, storage, "status", name, "-o", "json")
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


class PodFailer(threading.Thread):
    """Fails the pod of ``host`` (e.g. "0-1") in each listed restart attempt with
    ``exit_code`` once it is Running, as a crashing training process would."""

    def __init__(self, cluster: Cluster, jobset: str, host: str, exit_code: int,
                 attempts: tuple[int, ...] = (0,), timeout: float = 180):
        super().__init__(daemon=True)
        self.c, self.js, self.host, self.code = cluster, jobset, host, exit_code
        self.attempts, self.deadline = set(attempts), time.monotonic() + timeout
        self.failed: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        from orchestrator.backends.kube.state import pod_host

        while self.attempts and not self.stop.is_set() and time.monotonic() < self.deadline:
            for pod in self.c.pods(self.js):
                host, attempt = pod_host(pod)
                if (host == self.host and attempt in self.attempts
                        and pod["status"].get("phase") == "Running"):
                    self.c.fail_pod(pod["metadata"]["name"], self.code)
                    self.failed.append(pod["metadata"]["name"])
                    self.attempts.discard(attempt)
            time.sleep(0.1)


@pytest.fixture
def storage(gcs_bucket) -> str:
    return f"{gcs_bucket}/xrun"


def test_a_run_succeeds(cluster, storage, tmp_path):
    name = unique("ok")
    r = cli(cluster, storage, "submit", "-f", run_file(tmp_path, name))
    assert r.returncode == 0, r.stderr
    assert f"run {name}: Succeeded" in r.stderr
    js = cluster.jobset(name)
    assert any(c["type"] == "Completed" and c["status"] == "True" for c in js["status"]["conditions"])
    view = status_json(cluster, storage, name)
    assert (view["state"], view["restarts"]) == ("Succeeded", 0)
    assert sorted(h["host"] for h in view["hosts"]) == ["0-0", "0-1"]
    assert {h["state"] for h in view["hosts"]} == {"Succeeded"}


def test_exit_42_restarts_the_whole_jobset_and_status_counts_it(cluster, storage, tmp_path):
    name = unique("r42")
    failer = PodFailer(cluster, name, "0-1", 42)
    failer.start()
    r = cli(cluster, storage, "submit", "-f", run_file(tmp_path, name))
    failer.stop.set()
    assert failer.failed, "the pod to fail never ran"
    assert r.returncode == 0, r.stderr
    js = cluster.jobset(name)
    assert js["status"]["restarts"] == 1
    pods = cluster.pods(name)
    assert {p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] for p in pods} >= {"1"}
    assert "Restarting" in r.stderr  # followed through the restart
    view = status_json(cluster, storage, name)
    assert (view["state"], view["restarts"]) == ("Succeeded", 1)
    assert {h["attempt"] for h in view["hosts"]} == {1}


def test_exit_1_fails_the_jobset_for_good_with_the_reason(cluster, storage, tmp_path):
    name = unique("e1")
    failer = PodFailer(cluster, name, "0-0", 1)
    failer.start()
    r = cli(cluster, storage, "submit", "-f", run_file(tmp_path, name, pod_annotations=timing(run_s=30)))
    failer.stop.set()
    assert r.returncode == 1, r.stderr
    js = cluster.jobset(name)
    failed = next(c for c in js["status"]["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and js["status"].get("restarts", 0) == 0
    # JobSet's FailJobSet rule on the Job's PodFailurePolicy reason, as xrun renders it
    assert failed["reason"] == "FailJobSetFailurePolicyAction", failed
    view = status_json(cluster, storage, name)
    assert view["state"] == "Failed"
    assert failed["message"][:60] in json.dumps(view) or "FailOnUserError" in json.dumps(view), view
    host = next(h for h in view["hosts"] if h["host"] == "0-0")
    assert host["exit_code"] == 1


def test_max_restarts_exhausted(cluster, storage, tmp_path):
    name = unique("mr")
    failer = PodFailer(cluster, name, "0-0", 42, attempts=(0, 1))
    failer.start()
    r = cli(cluster, storage, "submit", "-f",
            run_file(tmp_path, name, max_restarts=1, pod_annotations=timing(run_s=30)))
    failer.stop.set()
    assert r.returncode == 1, r.stderr
    js = cluster.jobset(name)
    failed = next(c for c in js["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "ReachedMaxRestarts" and js["status"]["restarts"] == 1
    view = status_json(cluster, storage, name)
    assert (view["state"], view["restarts"]) == ("Failed", 1)


def test_delete_while_running_stops_the_run(cluster, storage, tmp_path):
    name = unique("del")
    follow = xrun_popen("submit", "-f", run_file(tmp_path, name, pod_annotations=timing(run_s=120)),
                        storage=storage, KUBECONFIG=cluster.kubeconfig)
    try:
        cluster.wait("pods Running", lambda: len([p for p in cluster.pods(name)
                                                  if p["status"].get("phase") == "Running"]) == 2, 60)
        r = cli(cluster, storage, "delete", name)
        assert r.returncode == 0, r.stderr
        out, err = follow.communicate(timeout=120)
    finally:
        follow.kill()
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as info:
        cluster.jobset(name)
    assert info.value.status == 404
    cluster.wait("pods gone", lambda: cluster.pods(name) == [], 60)
    assert follow.returncode != 0, err
    view = status_json(cluster, storage, name)
    assert view["state"] == "Deleted", view


# A node deleted mid-run: tests/test_cluster_drills.py's node-loss drill (restart, repair, Running
# again after 1 restart, what the follower prints).
