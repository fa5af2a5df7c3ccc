"""What `xrun submit --follow` asks of the API server does not grow with pods: a 256-pod
run (4 x v6e-256) on the real control plane, its requests counted in the API server's
audit log (user agent ``xrun/``).

The design (orchestrator/backends/kube/watch.py): one LIST per kind (pods, the JobSet),
then one watch per kind with bookmarks, reopened every WATCH_SECONDS; events by field
selector at most every WATCHED_EVENTS_SECONDS while the run waits; nothing per pod or per
Job. The bounds below follow from that and from the follow's duration, never from the pod
count: a GET or a LIST per pod per tick (what a poll does) exceeds them many times over.
bench/bench_cluster_scale.py measures the same at 64 / 256 / 1,024 pods.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import importlib.util
import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from cli_helpers import xrun, xrun_env
from cluster_helpers import timing, unique

REPO = Path(__file__).resolve().parent.parent
PODS = 256
SLICES = PODS // 64


def _controlplane():
    spec = importlib.util.spec_from_file_location("controlplane", REPO / "tests/cluster/controlplane.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def v6e_256_pools(cluster):
    """SLICES v6e-256 node pools (a KWOK node per TPU VM, labelled as GKE's), added to the
    session's cluster for this test and removed after it."""
    cp = _controlplane()
    nodes = [n for n in cp.gke_nodes(cp.extra_pools([f"v6e-256:{SLICES}"]))
             if n["metadata"]["labels"].get("cloud.google.com/gke-tpu-topology") == "16x16"]
    core = cluster.core
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(core.create_node, nodes))
    try:
        yield [n["metadata"]["name"] for n in nodes]
    finally:  # in the background: the session's next tests need not wait for it
        threading.Thread(target=_delete_nodes, args=(core,), daemon=True).start()


def _delete_nodes(core) -> None:
    with contextlib.suppress(Exception):  # best effort: the session's cluster goes away anyway
        core.delete_collection_node(label_selector="cloud.google.com/gke-tpu-topology=16x16")


def xrun_requests(cluster, since: float, until: float) -> list[dict]:
    out: dict[str, dict] = {}
    for path in sorted((cluster.root / "logs").glob("audit*.log")):
        with path.open() as f:
            for line in f:
                if '"userAgent":"xrun/' not in line:
                    continue
                ev = json.loads(line)
                t = dt.datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
                if since <= t <= until:
                    out.setdefault(ev["auditID"], ev)
    return list(out.values())


def by_verb(reqs: list[dict]) -> collections.Counter:
    c: collections.Counter = collections.Counter()
    for r in reqs:
        o = r.get("objectRef")
        res = (o.get("resource", "?") + (f"/{o['subresource']}" if o.get("subresource") else "")
               if o else r["requestURI"].split("?")[0].rstrip("/"))  # a non-resource URL: /version
        c[(r["verb"], res)] += 1
    return c


def test_follow_of_256_pods_makes_a_constant_number_of_requests(cluster, v6e_256_pools, gcs_bucket, tmp_path):
    import subprocess
    import sys

    name = unique("scale")
    run_file = tmp_path / f"{name}.yaml"
    run_file.write_text(yaml.safe_dump({
        "name": name, "accelerator": "v6e-256", "num_slices": SLICES, "image": "example.com/train:1",
        "xrun_image": "example.com/xrun-workload:1", "command": "python3 train.py",
        "context": "xrun-test", "termination_grace_seconds": 1, "ttl_seconds_after_finished": 0,
        "pod_annotations": timing(run_s=4.0, start_s=0.4)}))
    storage = f"{gcs_bucket}/xrun"
    started = time.time()
    # --force: the pools' capacity check (#38, tested in test_cluster_gke_first_run.py) is not
    # what this test counts, and a pool an earlier test left a node short would refuse it.
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "submit", "--follow", "--force", "-f",
                           str(run_file)],
                          env=xrun_env(storage, KUBECONFIG=cluster.kubeconfig), capture_output=True, text=True,
                          timeout=240)
    ended = time.time()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"run {name}: Succeeded" in proc.stderr

    reqs = by_verb(xrun_requests(cluster, started, ended))
    took = ended - started
    # The first watch, one per server timeout (WATCH_SECONDS), and a few resumed from their
    # resourceVersion (no LIST) after the API server closed them: it closes a watch whose
    # client falls behind a burst of events (the watch cache's per-watcher buffer).
    rewatch = 6 + math.ceil(took / 300)
    event_rounds = math.ceil(took / 5) + 2
    bounds = {
        ("create", "jobsets"): 1,
        ("get", "/version"): 1,  # submit's native-sidecar check
        ("list", "pods"): 2,  # the reflector's first LIST (+ one after a 410)
        ("watch", "pods"): rewatch,
        ("list", "jobsets"): 2,
        ("watch", "jobsets"): rewatch,
        ("get", "jobsets"): 2,
        ("list", "events"): 6 * event_rounds,  # JobSet, Jobs, 3 Pending pods, Workload
    }
    unexpected = {k: v for k, v in reqs.items() if k not in bounds}
    over = {k: (reqs[k], b) for k, b in bounds.items() if reqs.get(k, 0) > b}
    assert not unexpected and not over, (
        f"xrun's requests during a {took:.0f}s follow of {PODS} pods: {dict(reqs)}; "
        f"unexpected {unexpected}; over the bound (count, bound) {over}")
    assert reqs[("get", "pods")] == 0 and reqs[("get", "pods/log")] == 0
    assert sum(reqs.values()) <= 10 + 2 * took, dict(reqs)  # a steady rate well under 2/s
    # nothing of it grows with pods: every count is far below one request per pod (the events'
    # LISTs grow with the follow's time, bounded above per round, not with its pods)
    assert max(v for k, v in reqs.items() if k != ("list", "events")) < PODS / 8, dict(reqs)
    # the run really had its 256 pods, all Running at once, and xrun said so
    assert f"xrun: {name} Running" in proc.stderr


def _pool_free(cluster, pool: str) -> None:
    """No live pod on ``pool``'s nodes: an earlier test's JobSet deleted in the background may
    still hold its slice while its pods end. Pods that ended (Succeeded, Failed) hold nothing
    (the scheduler does not count them) and stay until their JobSet goes: they do not count."""
    import re

    node = re.compile(rf"{re.escape(pool)}-\d+-\d+$")
    holding: list[str] = []

    def free():
        pods = json.loads(cluster.core.list_pod_for_all_namespaces(_preload_content=False).data)["items"]
        holding[:] = [f"{p['metadata']['namespace']}/{p['metadata']['name']} ({p['status'].get('phase')})"
                      for p in pods if node.match(p["spec"].get("nodeName") or "")
                      and p["status"].get("phase") not in ("Succeeded", "Failed")]
        return not holding or None
    try:
        cluster.wait(f"the {pool} pool free of earlier tests' pods", free, 120, every=0.5)
    except AssertionError as e:
        raise AssertionError(f"{e}; still there: {holding[:8]}") from None


def test_status_of_a_running_run_asks_the_same_whatever_its_pods(cluster, gcs_bucket, tmp_path):
    """`xrun status` of a running cluster run: one GET of the JobSet and one LIST of its pods,
    with 2 pods (v6e-8) as with 8 (v6e-32), nothing per pod (#40: 2.13 s at 1,024 pods; the
    time is bench/bench_cluster_scale.py's, this is what it asks the API server)."""
    storage = f"{gcs_bucket}/xrun"
    env = {"KUBECONFIG": cluster.kubeconfig, "COLUMNS": "200"}
    runs = {2: ("v6e-8", "v6e-2x4"), 8: ("v6e-32", "v6e-4x8")}
    names = {pods: unique(f"st{pods}") for pods in runs}
    try:
        for pods, (accelerator, pool) in runs.items():
            _pool_free(cluster, pool)
            run_file = tmp_path / f"{names[pods]}.yaml"
            run_file.write_text(yaml.safe_dump({
                "name": names[pods], "accelerator": accelerator, "image": "example.com/train:1",
                "xrun_image": "example.com/xrun-workload:1", "command": "python3 train.py",
                "context": "xrun-test", "termination_grace_seconds": 1,
                "pod_annotations": timing(run_s=300.0, start_s=0.4)}))
            proc = xrun("submit", "--detach", "--force", "-f", str(run_file), storage=storage, timeout=120, **env)
            assert proc.returncode == 0, proc.stderr[-3000:]
        for pods, name in names.items():
            cluster.wait(f"{name}'s {pods} pods Running", lambda n=name, k=pods: (
                len([p for p in cluster.pods(n) if p["status"].get("phase") == "Running"]) == k or None), 90)
        counts = {}
        for pods, name in names.items():
            started = time.time() - 0.01
            proc = xrun("status", name, storage=storage, timeout=120, **env)
            ended = time.time() + 0.01
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert "Running" in proc.stdout.split("\n")[1], proc.stdout  # the State line
            hosts = [line.split()[0] for line in proc.stdout.splitlines() if line.strip().startswith(("0-", "1-"))]
            assert len(hosts) == pods, proc.stdout  # every host listed, from the one LIST
            # status's last request is its LIST of pods: once the audit log has it, it has all
            cluster.wait("status's requests in the audit log", lambda s=started, e=ended: (
                ("list", "pods") in by_verb(xrun_requests(cluster, s, e)) or None), 30)
            counts[pods] = dict(by_verb(xrun_requests(cluster, started, ended)))
        assert counts[2] == counts[8] == {("get", "jobsets"): 1, ("list", "pods"): 1}, counts
    finally:
        for name in names.values():
            with contextlib.suppress(Exception):
                cluster.delete_jobset(name)
