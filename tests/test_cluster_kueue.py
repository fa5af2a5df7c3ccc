"""Queued runs under the real Kueue v0.17 (tests/cluster/up.sh): admitted, not admitted for
quota, preempted; and the issue-28 defects that only a real Kueue and JobSet show.

Queues as xpk makes them: ``multislice-queue`` → ClusterQueue ``xpk-cluster-queue`` with
quota for ``google.com/tpu`` only (16 chips of v6e 2x4), preemption of lower priorities
within the queue; ``cpu-memory-queue`` also has cpu and memory quota.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time

import pytest
from cli_helpers import xrun_popen
from cluster_helpers import NAMESPACE, timing, unique
from test_cluster_lifecycle import cli, run_file

from manifests.jobset import jobset
from manifests.spec import build_spec
from orchestrator.backends.kube.backend import KubeBackend


@pytest.fixture
def storage(gcs_bucket) -> str:
    return f"{gcs_bucket}/xrun"


def suspended(cluster, name: str) -> bool:
    return bool(cluster.jobset(name)["spec"].get("suspend"))


def test_a_queued_run_waits_suspended_then_runs_once_kueue_admits_it(cluster, storage, tmp_path):
    """Defect 1: with xrun's sidecar requesting cpu and memory, xpk's accelerator-only
    ClusterQueue never admitted a queued run. Now it is admitted and runs to the end."""
    name = unique("q")
    r = cli(cluster, storage, "submit", "-f", run_file(tmp_path, name, queue="multislice-queue"))
    assert r.returncode == 0, r.stderr
    assert f"run {name}: Succeeded" in r.stderr
    # Kueue's JobSet webhook created it suspended; its Workload was admitted on our flavor.
    wl = next(w for w in cluster.custom.list_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", NAMESPACE, "workloads")["items"]
        if w["metadata"]["ownerReferences"][0]["name"] == name)
    conds = {c["type"]: c["status"] for c in wl["status"]["conditions"]}
    assert conds.get("Admitted") == "True", wl["status"]
    assert wl["status"]["admission"]["clusterQueue"] == "xpk-cluster-queue"


def test_a_sidecar_cpu_request_is_never_admitted_by_xpks_queue(cluster, storage):
    """What defect 1 was, on the real Kueue: the same JobSet with the old sidecar requests
    stays suspended, and Kueue says why (the message xrun status shows)."""
    name = unique("cpu")
    body = jobset(build_spec({
        "name": name, "accelerator": "v6e-8", "image": "example.com/xrun:1", "backend": "kube",
        "storage": f"{storage}", "command": "true", "queue": "multislice-queue",
        "xrun_image": "example.com/xrun-workload:1"}, {}))
    pod = body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    sidecar = next(c for c in pod["initContainers"] if c.get("restartPolicy") == "Always")
    sidecar["resources"] = {"requests": {"cpu": "100m", "memory": "128Mi"}}
    cluster.custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NAMESPACE,
                                                   "jobsets", body)
    backend = KubeBackend("xrun-test", NAMESPACE, cluster.kubeconfig)
    def verdict():
        # Kueue's verdict is its Workload's QuotaReserved=False message ("Kueue: …"). Not
        # "ClusterQueue" alone: the queue position line ("Kueue queue: 0 ahead in LocalQueue
        # …, 0 ahead in its ClusterQueue", the visibility API) lists the Workload as soon as
        # it is queued, a moment before Kueue's scheduler has tried it and written why not.
        st = backend.status(name)
        return st if "Kueue: " in st.message else None

    st = cluster.wait("Kueue's verdict", verdict, 60)
    assert st.state == "Pending", st
    assert re.search(r"Kueue: couldn.t assign flavors .* resource (cpu|memory) unavailable in ClusterQueue",
                     st.message), st
    assert suspended(cluster, name)
    cluster.custom.delete_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NAMESPACE,
                                                   "jobsets", name)


def status_once_written(cluster, storage: str, name: str) -> dict | None:
    r = cli(cluster, storage, "status", name, "-o", "json")
    return json.loads(r.stdout) if r.returncode in (0, 1) else None


def test_a_run_over_the_queues_quota_is_not_admitted_and_status_says_why(cluster, storage, tmp_path):
    name = unique("big")
    follow = xrun_popen("submit", "-f", run_file(tmp_path, name, queue="multislice-queue",
                                                 num_slices=3),
                        storage=storage, KUBECONFIG=cluster.kubeconfig)
    try:
        view = cluster.wait("Kueue's message in status", lambda: (
            v if "insufficient quota" in json.dumps(v := status_once_written(cluster, storage, name))
            else None), 60, every=1)
        assert view["state"] == "Pending", view
        assert "Kueue: couldn't assign flavors" in view["message"] and "insufficient quota" in view["message"], view
        assert suspended(cluster, name)
    finally:
        follow.kill()
        follow.communicate()
        cli(cluster, storage, "delete", name)


# A higher-priority run preempting a lower one: tests/test_cluster_drills.py's preemption drill
# (suspended, status says why, readmitted, Succeeded).


def test_rules_beat_failure_order_when_jobs_fail_in_one_reconcile(cluster, storage):
    """Defect 3, on the real JobSet controller: slice 1 fails first with a restartable code
    (rule 0 does not match it), slice 0 a moment later with exit 1 (a PodFailurePolicy
    failure, rule 0's FailJobSet). Both Jobs are Failed before JobSet reconciles (its
    controller is paused meanwhile), and the rule wins: the JobSet fails, no restart
    (jobset pkg/controllers/failure_policy.go findFirstFailedPolicyRuleAndJob)."""
    name = unique("order")
    body = jobset(build_spec({
        "name": name, "accelerator": "v6e-8", "num_slices": 2, "image": "example.com/xrun:1",
        "backend": "kube", "storage": storage, "command": "true", "termination_grace_seconds": 2,
        "xrun_image": "example.com/xrun-workload:1", "pod_annotations": timing(run_s=300)}, {}))
    cluster.custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NAMESPACE,
                                                   "jobsets", body)
    from orchestrator.backends.kube.state import pod_host

    def running() -> list | None:
        pods = cluster.pods(name)
        return pods if len([p for p in pods if p["status"].get("phase") == "Running"]) == 4 else None

    pods = cluster.wait("4 pods Running", running, 90)
    by_host = {pod_host(p)[0]: p["metadata"]["name"] for p in pods}
    jobset_pid = cluster.state["pids"]["jobset"]
    os.kill(jobset_pid, signal.SIGSTOP)
    try:
        cluster.fail_pod(by_host["1-0"], 42)
        time.sleep(0.5)
        cluster.fail_pod(by_host["0-0"], 1)
        from kubernetes import client

        batch = client.BatchV1Api(cluster.api_client)

        def both_failed() -> bool:
            jobs = batch.list_namespaced_job(NAMESPACE, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}").items
            return len([j for j in jobs if any(c.type == "Failed" and c.status == "True"
                                               for c in j.status.conditions or [])]) == 2
        cluster.wait("both Jobs Failed", both_failed, 60)
    finally:
        os.kill(jobset_pid, signal.SIGCONT)
    # A change of the JobSet's own queues a reconcile at once: the Jobs' updates that arrived
    # while the controller was stopped are otherwise its only trigger, and on the loaded CI
    # machine the JobSet once stayed unreconciled for the whole minute (1 of 2 full runs).
    cluster.custom.patch_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", NAMESPACE, "jobsets", name,
        {"metadata": {"annotations": {"xrun.test/nudge": str(time.time())}}})
    js = cluster.wait_condition(name, "Failed", 90)
    failed = next(c for c in js["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "FailJobSetFailurePolicyAction", failed
    assert js["status"].get("restarts", 0) == 0


def test_restarts_are_counted_from_the_events_jobset_really_records(cluster, storage, tmp_path):
    """Defect 4: after a restart, the JobSet's own events name the restart with the reasons
    JobSet emits (never "Restarting"), and xrun counts restarts from them once the JobSet
    object is gone."""
    from test_cluster_lifecycle import PodFailer

    name = unique("ev")
    failer = PodFailer(cluster, name, "0-1", 42)
    failer.start()
    r = cli(cluster, storage, "submit", "-f", run_file(tmp_path, name))
    failer.stop.set()
    assert r.returncode == 0, r.stderr
    events = cluster.core.list_namespaced_event(
        NAMESPACE, field_selector=f"involvedObject.name={name},involvedObject.kind=JobSet").items
    reasons = {e.reason for e in events}
    assert "Restarting" not in reasons
    assert reasons & {"RestartJobSetFailurePolicyAction", "RestartingJobSet"}, reasons
    cluster.custom.delete_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NAMESPACE,
                                                   "jobsets", name)
    cluster.wait("JobSet gone", lambda: name not in [
        j["metadata"]["name"] for j in cluster.custom.list_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", NAMESPACE, "jobsets")["items"]], 30)
    ended = KubeBackend("xrun-test", NAMESPACE, cluster.kubeconfig).ended_from_events(name)
    assert ended is not None and ended.restarts == 1, ended


def test_multislice_required_topology_is_admitted_per_slice_by_kueue_tas(cluster):
    """Kueue's topology-aware scheduling over GKE-shaped node pools (a Topology of
    gke-nodepool > hostname, a flavor of the v6e 2x4 pools). A 2-slice v6e-8 run is one
    PodSet of 4 pods; required at gke-nodepool for all of them never fits (no pool has 4
    nodes): Kueue says so and never admits it. xrun's per-slice request (podset-slice-
    required-topology + podset-slice-size 2) is admitted, each slice in one pool."""
    import copy

    group, version = "kueue.x-k8s.io", "v1beta2"
    custom = cluster.custom
    ns = cluster.namespace("tas")
    topo, flavor, cq = unique("topo"), unique("tasflavor"), unique("tascq")
    per_slice, whole = unique("slices"), unique("whole")
    created: list[tuple[str, str]] = []

    def make(plural: str, obj: dict) -> None:
        custom.create_cluster_custom_object(group, version, plural, {"apiVersion": f"{group}/{version}", **obj})
        created.append((plural, obj["metadata"]["name"]))

    backend = KubeBackend(None, ns, cluster.kubeconfig)
    try:
        make("topologies", {"kind": "Topology", "metadata": {"name": topo}, "spec": {"levels": [
            {"nodeLabel": "cloud.google.com/gke-nodepool"}, {"nodeLabel": "kubernetes.io/hostname"}]}})
        make("resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": flavor}, "spec": {
            "nodeLabels": {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                           "cloud.google.com/gke-tpu-topology": "2x4"}, "topologyName": topo}})
        make("clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": cq}, "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "resourceGroups": [{"coveredResources": ["google.com/tpu"], "flavors": [
                {"name": flavor, "resources": [{"name": "google.com/tpu", "nominalQuota": "64"}]}]}]}})
        custom.create_namespaced_custom_object(group, version, ns, "localqueues", {
            "apiVersion": f"{group}/{version}", "kind": "LocalQueue", "metadata": {"name": "tas-q", "namespace": ns},
            "spec": {"clusterQueue": cq}})
        values = {"accelerator": "v6e-8", "num_slices": 2, "image": "example.com/xrun:1", "backend": "kube",
                  "xrun_image": "example.com/xrun-workload:1", "storage": "gs://xrun-bucket/runs", "namespace": ns,
                  "queue": "tas-q", "kueue_topology": "required:cloud.google.com/gke-nodepool",
                  "pod_annotations": timing(run_s=60), "termination_grace_seconds": 2}
        obj = jobset(build_spec({**values, "name": per_slice}, {}))
        tmpl = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["annotations"]
        assert tmpl["kueue.x-k8s.io/podset-slice-required-topology"] == "cloud.google.com/gke-nodepool"
        assert tmpl["kueue.x-k8s.io/podset-slice-size"] == "2"
        # What xrun rendered before: the whole PodSet in one domain.
        old = copy.deepcopy(jobset(build_spec({**values, "name": whole}, {})))
        old_meta = old["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]
        old_meta["annotations"] = {k: v for k, v in old_meta["annotations"].items() if "podset-slice" not in k}
        old_meta["annotations"]["kueue.x-k8s.io/podset-required-topology"] = "cloud.google.com/gke-nodepool"
        backend.submit(obj)
        backend.submit(old)

        def workload(name: str) -> dict | None:
            return next((w for w in custom.list_namespaced_custom_object(group, version, ns, "workloads")["items"]
                         if any(o["name"] == name for o in w["metadata"].get("ownerReferences") or [])), None)

        def admitted(name: str) -> dict | None:
            w = workload(name) or {}
            conds = {c["type"]: c for c in (w.get("status") or {}).get("conditions") or []}
            return w if conds.get("Admitted", {}).get("status") == "True" else None

        w = cluster.wait("the per-slice request admitted", lambda: admitted(per_slice), 60, every=0.5)
        # Kueue's compact form: hostnames as a prefix and roots, one pod each; two per pool.
        (slices,) = w["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]["slices"]
        values = slices["valuesPerLevel"][0]["individual"]
        hosts = [values["prefix"] + root for root in values["roots"]]
        pools = sorted(h.rsplit("-", 1)[0] for h in hosts)
        assert len(hosts) == 4 and len(set(pools)) == 2 and all(pools.count(p) == 2 for p in pools), slices

        def refused() -> str | None:
            w = workload(whole) or {}
            conds = {c["type"]: c for c in (w.get("status") or {}).get("conditions") or []}
            reserved = conds.get("QuotaReserved") or {}
            return reserved.get("message") if reserved.get("status") == "False" and reserved.get("message") else None

        message = cluster.wait("Kueue's word on the whole-PodSet request", refused, 60, every=0.5)
        assert "topology" in message and admitted(whole) is None, message
    finally:
        for name in (per_slice, whole):
            cluster.delete_jobset(name, ns)
        with contextlib.suppress(Exception):
            custom.delete_namespaced_custom_object(group, version, ns, "localqueues", "tas-q")
        for plural, name in reversed(created):
            with contextlib.suppress(Exception):
                custom.delete_cluster_custom_object(group, version, plural, name)
        cluster.drop_namespace(ns)
