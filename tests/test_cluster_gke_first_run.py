"""A first run on a GKE-shaped cluster (issue 38), on the real control plane (tests/cluster):
the Kueue LocalQueue found when none is named, the queued run's position from Kueue's
visibility API, and a shape no node pool holds refused before anything is created.

The node pools are KWOK nodes labelled as GKE labels them (controlplane.py TPU_POOLS,
GPU_POOLS): v6e-2x4 x2 on-demand, one spot, one reservation; v6e-4x8; v5p-2x2x2; A3 Mega
and A3 Ultra x2 nodes.
"""

from __future__ import annotations

import json

import pytest
import yaml
from cli_helpers import xrun
from cluster_helpers import NAMESPACE, timing, unique

from manifests.catalogue import lookup
from manifests.spec import build_spec
from orchestrator.backends.kube.backend import KubeBackend
from orchestrator.services import cluster as found
from orchestrator.services import doctor, runs
from xrun_contract import Layout
from xrun_contract.errors import EXIT_USAGE, XrunError
from xrun_contract.storage import open_storage

KUEUE = ("kueue.x-k8s.io", "v1beta2")


@pytest.fixture
def storage(gcs_bucket) -> str:
    return f"{gcs_bucket}/xrun"


def spec(name: str, ns: str, **values) -> object:
    return build_spec({"name": name, "accelerator": "v6e-8", "image": "example.com/xrun:1",
                       "xrun_image": "example.com/xrun-workload:1", "context": "xrun-test",
                       "namespace": ns, "storage": "gs://bkt/xrun", **values}, {})


def run_file(tmp_path, name: str, ns: str, **values) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "accelerator": "v6e-8", "image": "example.com/xrun:1",
        "xrun_image": "example.com/xrun-workload:1", "context": "xrun-test", "namespace": ns,
        "pod_annotations": timing(run_s=600), "termination_grace_seconds": 2, **values}))
    return str(path)


def submit(cluster, storage: str, *args: str, queue_env: str = ""):
    """The CLI with no $XRUN_QUEUE (cli_helpers sets 'none' for the other tests)."""
    return xrun("submit", *args, "--detach", storage=storage, timeout=120, KUBECONFIG=cluster.kubeconfig,
                XRUN_QUEUE=queue_env)


@pytest.fixture
def team_namespace(cluster):
    """A namespace whose only LocalQueue ``team-q`` feeds a ClusterQueue of its own with
    quota for one v6e-8 (8 chips of the v6e-2x4 flavor)."""
    ns = cluster.namespace("gke-first")
    cq = unique("team-cq")
    cluster.custom.create_cluster_custom_object(*KUEUE, "clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                 "queueingStrategy": "BestEffortFIFO",
                 "resourceGroups": [{"coveredResources": ["google.com/tpu"], "flavors": [
                     {"name": "v6e-2x4", "resources": [{"name": "google.com/tpu", "nominalQuota": "8"}]}]}]}})
    try:
        yield ns, cq
    finally:
        for js in cluster.custom.list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets")["items"]:
            cluster.custom.delete_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets",
                                                           js["metadata"]["name"], propagation_policy="Background")
        cluster.drop_namespace(ns)
        cluster.custom.delete_cluster_custom_object(*KUEUE, "clusterqueues", cq)


def add_local_queue(cluster, ns: str, name: str, cq: str) -> None:
    cluster.custom.create_namespaced_custom_object(*KUEUE, ns, "localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": ns}, "spec": {"clusterQueue": cq}})


def workload_of(cluster, ns: str, name: str) -> dict | None:
    return next((w for w in cluster.custom.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"]
                 if any(o["name"] == name for o in w["metadata"].get("ownerReferences") or [])), None)


def admitted(cluster, ns: str, name: str) -> dict | None:
    w = workload_of(cluster, ns, name)
    conds = {c["type"]: c["status"] for c in ((w or {}).get("status") or {}).get("conditions") or []}
    return w if conds.get("Admitted") == "True" else None


def test_the_namespaces_only_local_queue_is_used_and_a_queued_run_shows_its_position(
        cluster, storage, team_namespace, tmp_path, monkeypatch):
    ns, cq = team_namespace
    backend = KubeBackend("xrun-test", ns, cluster.kubeconfig)
    # Kueue installed, no LocalQueue here yet: submitted unqueued, with a warning.
    none = found.resolve_queue(spec("early", ns), backend)
    assert none.spec.queue == "" and none.warnings == [
        f"Kueue is installed but namespace '{ns}' has no LocalQueue: the run is not queued, so it is held by "
        "no ClusterQueue's quota (--queue NAME, or --queue none to say so)"]
    assert doctor.check_found_queue(backend).result == "warn"

    add_local_queue(cluster, ns, "team-q", cq)
    check = doctor.check_found_queue(backend)
    assert (check.result, check.detail) == ("ok", f"no queue named: submit uses LocalQueue {ns}/team-q, the only "
                                                   f"one in namespace {ns}")
    first, second, third = unique("first"), unique("second"), unique("third")
    r = submit(cluster, storage, "-f", run_file(tmp_path, first, ns))
    assert r.returncode == 0, r.stderr
    assert f"xrun: queue: LocalQueue {ns}/team-q, the only one in namespace {ns}" in r.stderr
    js = cluster.custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", first)
    assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-q"
    recorded = json.loads(open_storage(storage).read_bytes(Layout.run_json(first)))
    assert recorded["spec"]["queue"] == "team-q"
    # Admitted against the ClusterQueue's quota (8 chips: all of it).
    wl = cluster.wait("the first run admitted", lambda: admitted(cluster, ns, first), 60)
    assert wl["status"]["admission"]["clusterQueue"] == cq
    usage = wl["status"]["admission"]["podSetAssignments"][0]["resourceUsage"]
    assert usage == {"google.com/tpu": "8"}

    # Two more through the same service the CLI calls (in-process: each CLI start costs seconds).
    monkeypatch.delenv("XRUN_QUEUE", raising=False)
    monkeypatch.setenv("KUBECONFIG", cluster.kubeconfig)
    # Kueue orders pending Workloads by priority, then creation time (1 s resolution, ties in
    # no set order): the priorities make "second ahead of third" certain.
    for name, priority in ((second, "high"), (third, "low")):
        sub = runs.submit(spec(name, ns, storage=storage, pod_annotations=timing(run_s=600), priority=priority))
        assert sub.spec.queue == "team-q" and sub.notes == [
            f"queue: LocalQueue {ns}/team-q, the only one in namespace {ns} (--queue NAME to choose, --queue none "
            "for no Kueue)"]
    cluster.wait("both queued runs pending in Kueue",
                 lambda: all(workload_of(cluster, ns, n) for n in (second, third)), 30)

    def position() -> dict | None:  # what `xrun status -o json` prints
        # Until Kueue's queue manager holds both pending Workloads the third may be alone
        # there; and the position can show before Kueue's scheduler wrote why ("Kueue: …").
        view = runs.status(open_storage(storage), third)
        message = view.get("message", "")
        return view if "Kueue queue: 1 ahead" in message and "Kueue: " in message else None

    try:
        view = cluster.wait("the third run's position in status", position, 60, every=0.5)
    except AssertionError:
        wls = {n: (workload_of(cluster, ns, n) or {}).get("status") for n in (first, second, third)}
        raise AssertionError(f"{runs.status(open_storage(storage), third)['message']}; workloads: {wls}") from None
    assert view["state"] == "Pending", view
    assert (f"Kueue queue: 1 ahead in LocalQueue {ns}/team-q ({second}), 1 ahead in its ClusterQueue"
            in view["message"]), view
    assert "insufficient unused quota" in view["message"], view  # Kueue's own reason stays


def in_process(monkeypatch, cluster, queue: str | None = None) -> None:
    """``runs.submit`` in this process, as the CLI calls it (a CLI start costs seconds)."""
    monkeypatch.setenv("KUBECONFIG", cluster.kubeconfig)
    if queue is None:
        monkeypatch.delenv("XRUN_QUEUE", raising=False)
    else:
        monkeypatch.setenv("XRUN_QUEUE", queue)


def refused_submit(spec_, **kwargs) -> str:
    with pytest.raises(XrunError) as e:
        runs.submit(spec_, **kwargs)
    assert e.value.exit_code == EXIT_USAGE, e.value
    return str(e.value)


def test_several_local_queues_are_refused_naming_them_and_nothing_is_created(cluster, storage, monkeypatch):
    """The test cluster's default namespace has xpk's multislice-queue and cpu-memory-queue."""
    name = unique("several")
    in_process(monkeypatch, cluster)
    assert refused_submit(spec(name, NAMESPACE, storage=storage)) == (
        f"queue: namespace '{NAMESPACE}' has several Kueue LocalQueues (cpu-memory-queue, "
        "multislice-queue): name one with --queue (or --queue none to bypass Kueue)")
    assert not open_storage(storage).exists(Layout.run_json(name))
    backend = KubeBackend("xrun-test", NAMESPACE, cluster.kubeconfig)
    assert backend.get_jobset(name) is None
    check = doctor.check_found_queue(backend)
    # submit refuses it, so doctor fails it: "all checks passed" only when submit passes.
    assert ((check.result, check.exit_code) == ("FAIL", 1)
            and "several LocalQueues (cpu-memory-queue, multislice-queue)" in check.detail)


def test_a_shape_no_node_pool_holds_is_refused_before_anything_exists(cluster, storage, tmp_path, monkeypatch):
    name = unique("nopool")
    path = run_file(tmp_path, name, NAMESPACE, accelerator="v6e-16")  # topology 4x4: no such pool
    r = submit(cluster, storage, "-f", path, queue_env="none")
    assert r.returncode == EXIT_USAGE, r.stderr
    line = r.stderr.strip()
    assert line.startswith("xrun: error: accelerator: no node pool can hold v6e-16: it needs 1 node pool(s) of "
                           "4 x ct6e-standard-4t with tpu-v6e-slice topology 4x4, 0 fit; TPU node pools seen: "), line
    for pool in ("v6e-2x4-0 (tpu-v6e-slice 2x4 ct6e-standard-4t x2)",
                 "v6e-4x8-0 (tpu-v6e-slice 4x8 ct6e-standard-4t x8)",
                 "v5p-2x2x2-0 (tpu-v5p-slice 2x2x2 ct5p-hightpu-4t x2)"):
        assert pool in line, line
    assert line.endswith("Add --force to submit anyway (node auto-provisioning, or a pool scaled to zero)")
    backend = KubeBackend("xrun-test", NAMESPACE, cluster.kubeconfig)
    assert backend.get_jobset(name) is None
    assert not open_storage(storage).exists(Layout.run_json(name))

    # --force: submitted for an autoprovisioner to serve; its pods wait.
    in_process(monkeypatch, cluster, "none")
    runs.submit(spec(name, NAMESPACE, accelerator="v6e-16", storage=storage), force=True)
    assert backend.get_jobset(name) is not None
    backend.delete(name, wait=False)

    # Multislice: each slice needs a node pool of its own. Three v6e-2x4 pools take on-demand
    # pods (two plain, one reservation's; the spot pool's taint keeps them off), so 3 fit, not 4.
    found.check_capacity(spec("three", NAMESPACE, num_slices=3), backend)
    with pytest.raises(XrunError) as e:
        found.check_capacity(spec("four", NAMESPACE, num_slices=4), backend)
    assert (e.value.exit_code == EXIT_USAGE
            and "x4 slices: it needs 4 node pool(s) of 2 x ct6e-standard-4t" in str(e.value))
    assert ", 3 fit;" in str(e.value)
    # Spot capacity: only the spot pool.
    found.check_capacity(spec("spot", NAMESPACE, capacity="spot"), backend)
    with pytest.raises(XrunError):
        found.check_capacity(spec("spot2", NAMESPACE, capacity="spot", num_slices=2), backend)
    # Reservation: the pool labelled with its name holds it (xrun refused its own pool when it
    # also selected reservation-affinity); a shared reservation of another project, none.
    found.check_capacity(spec("resv", NAMESPACE, capacity="reservation:xrun-resv"), backend)
    with pytest.raises(XrunError) as e:
        found.check_capacity(spec("resv2", NAMESPACE,
                                  capacity="reservation:projects/other-proj/reservations/xrun-resv"),
                             backend)
    assert ("(also labelled cloud.google.com/reservation-name=xrun-resv, "
            "cloud.google.com/reservation-project=other-proj)") in str(e.value), e.value
    # GPU: nodes counted across the accelerator's pools (A3 Mega has 2).
    found.check_capacity(spec("gpu", NAMESPACE, accelerator="h100-mega-80gb-8", nodes=2), backend)
    with pytest.raises(XrunError) as e:
        found.check_capacity(spec("gpu3", NAMESPACE, accelerator="h100-mega-80gb-8", nodes=3), backend)
    assert ("it needs 3 x nvidia-h100-mega-80gb node(s)" in str(e.value)
            and "a3mega (nvidia-h100-mega-80gb a3-megagpu-8g x2)" in str(e.value))


# --- GPU networks from the cluster's Network objects ----------------------------------------

def crd(kind: str, plural: str, spec_props: dict) -> dict:
    """A minimal CRD for GKE's multi-networking kinds (networking.gke.io/v1, cluster-scoped),
    with the spec fields GKE's docs show (cloud.google.com/kubernetes-engine/docs/how-to/
    setup-multinetwork-support-for-pods: Network spec.type and spec.parametersRef;
    GKENetworkParamSet spec.vpc, spec.vpcSubnet, spec.deviceMode). Not GKE's own schema,
    which is not published as a file."""
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.networking.gke.io"},
            "spec": {"group": "networking.gke.io", "scope": "Cluster",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "properties": {
                             "spec": {"type": "object", "properties": spec_props},
                             "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}]}}


NETWORK_CRDS = [
    crd("Network", "networks", {"type": {"type": "string", "enum": ["L3", "Device"]},
                                "parametersRef": {"type": "object", "properties": {
                                    "group": {"type": "string"}, "kind": {"type": "string"},
                                    "name": {"type": "string"}}}}),
    crd("GKENetworkParamSet", "gkenetworkparamsets", {
        "vpc": {"type": "string"}, "vpcSubnet": {"type": "string"},
        "deviceMode": {"type": "string", "enum": ["DPDK-VFIO", "NetDevice", "RDMA"]}}),
]


def add_network(cluster, name: str, mode: str = "NetDevice") -> None:
    cluster.custom.create_cluster_custom_object("networking.gke.io", "v1", "gkenetworkparamsets", {
        "apiVersion": "networking.gke.io/v1", "kind": "GKENetworkParamSet", "metadata": {"name": name},
        "spec": {"vpc": f"{name}-vpc", "vpcSubnet": name, "deviceMode": mode}})
    cluster.custom.create_cluster_custom_object("networking.gke.io", "v1", "networks", {
        "apiVersion": "networking.gke.io/v1", "kind": "Network", "metadata": {"name": name},
        "spec": {"type": "Device", "parametersRef": {"group": "networking.gke.io", "kind": "GKENetworkParamSet",
                                                     "name": name}}})


@pytest.fixture
def multi_networking(cluster):
    from kubernetes import client

    ext = client.ApiextensionsV1Api(cluster.api_client)
    for c in NETWORK_CRDS:
        ext.create_custom_resource_definition(c)

    def served() -> bool:
        try:
            cluster.custom.list_cluster_custom_object("networking.gke.io", "v1", "networks")
            cluster.custom.list_cluster_custom_object("networking.gke.io", "v1", "gkenetworkparamsets")
            return True
        except client.exceptions.ApiException:
            return False

    cluster.wait("the networking.gke.io CRDs served", served, 30)
    try:
        yield
    finally:
        for c in NETWORK_CRDS:
            ext.delete_custom_resource_definition(c["metadata"]["name"])


def test_an_xpk_a3_mega_cluster_gives_the_pods_its_network_names(cluster, storage, multi_networking, monkeypatch):
    """xpk's A3 Mega clusters name the GPU networks <cluster>-gpunet-<i>-subnet, not GKE's
    guide's vpc1..vpc8: the pods' interfaces must name the cluster's."""
    nets = [f"xpk-a3m-gpunet-{i}-subnet" for i in range(8)]
    for n in reversed(nets):
        add_network(cluster, n)
    name = unique("a3m")
    gpu = {"accelerator": "h100-mega-80gb-8", "nodes": 2, "pod_annotations": timing(run_s=600), "storage": storage}
    in_process(monkeypatch, cluster, "none")
    sub = runs.submit(spec(name, NAMESPACE, **gpu))
    assert sub.notes == [f"networks: eth1..eth8 on the cluster's Networks {', '.join(nets)}"]
    backend = KubeBackend("xrun-test", NAMESPACE, cluster.kubeconfig)
    mega = lookup("h100-mega-80gb-8")
    check = doctor.check_networks(backend, mega, [])
    assert (check.result, check.detail) == (
        "ok", f"eth1..eth8 attach to Networks {', '.join(nets)} (read from the cluster)")
    try:
        pods = cluster.wait("the run's 2 pods", lambda: (p if len(p := cluster.pods(name)) == 2 else None), 60)
        for pod in pods:
            interfaces = json.loads(pod["metadata"]["annotations"]["networking.gke.io/interfaces"])
            assert interfaces == [{"interfaceName": "eth0", "network": "default"}] + [
                {"interfaceName": f"eth{i}", "network": n} for i, n in enumerate(nets, 1)]
    finally:
        backend.delete(name, wait=False)

    # A network the run file names that the cluster lacks: exit 2, nothing created.
    missing = unique("a3m-miss")
    assert refused_submit(spec(missing, NAMESPACE, **gpu, networks=[*nets[:7], "no-such-net"])) == (
        f"networks: no-such-net not in the cluster's Network objects ({', '.join(nets)})")
    assert backend.get_jobset(missing) is None and not open_storage(storage).exists(Layout.run_json(missing))

    # An A3 Ultra cluster's networks beside them: 17 Networks for 8 NICs is ambiguous.
    ultra = ["xpk-a3u-sub-1", *(f"xpk-a3u-rdma-sub-{i}" for i in range(8))]
    for n in ultra:
        add_network(cluster, n, "RDMA" if "rdma" in n else "NetDevice")
    with pytest.raises(XrunError) as e:
        found.resolve_networks(spec("amb", NAMESPACE, accelerator="h100-mega-80gb-8"), backend)
    assert e.value.exit_code == EXIT_USAGE and str(e.value).startswith(
        "networks: h100-mega-80gb-8 (tcpxo) attaches 8 NICs; the cluster's Network objects are xpk-a3m-gpunet-0-subnet")
    assert doctor.check_networks(backend, mega, []).detail == str(e.value)
    # Named in the run file, A3 Ultra's gVNIC network first, then its RDMA ones (xpk's order).
    assert found.order_networks(list(reversed(ultra))) == ultra
    ok = found.resolve_networks(spec("ultra", NAMESPACE, accelerator="h200-141gb-8", networks=ultra), backend)
    assert ok.spec.networks == ultra


def test_a_named_queue_must_exist_and_dry_run_checks_as_submit_does(cluster, storage, monkeypatch):
    """A JobSet labelled for a LocalQueue that does not exist waits suspended for ever (only
    status said why): submit refuses it, naming the queues there; --dry-run makes the same
    checks (several LocalQueues, a shape no pool holds) and renders the queue it would use."""
    name = unique("nosuch")
    in_process(monkeypatch, cluster)
    assert refused_submit(spec(name, NAMESPACE, storage=storage, queue="nosuch")) == (
        f"queue: no Kueue LocalQueue 'nosuch' in namespace '{NAMESPACE}' (LocalQueues there: cpu-memory-queue, "
        "multislice-queue); the run would wait suspended for ever")
    assert not open_storage(storage).exists(Layout.run_json(name))
    assert KubeBackend("xrun-test", NAMESPACE, cluster.kubeconfig).get_jobset(name) is None
    for values, wanted in (({}, "queue: namespace 'default' has several Kueue LocalQueues"),
                           ({"queue": "multislice-queue", "accelerator": "v6e-256"},
                            "accelerator: no node pool can hold v6e-256")):
        with pytest.raises(XrunError) as e:
            runs.dry_run(spec(name, NAMESPACE, storage=storage, **values))
        assert e.value.exit_code == EXIT_USAGE and str(e.value).startswith(wanted), e.value
    in_process(monkeypatch, cluster, "nosuch")
    with pytest.raises(XrunError) as e:
        runs.dry_run(spec(name, NAMESPACE, storage=storage))
    assert str(e.value).startswith("queue (from $XRUN_QUEUE): no Kueue LocalQueue 'nosuch'")
    in_process(monkeypatch, cluster, "multislice-queue")
    _, manifest, _, warnings = runs.dry_run(spec(name, NAMESPACE, storage=storage))
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "multislice-queue" and warnings == []
    assert not open_storage(storage).exists(Layout.run_json(name))


def test_list_and_delete_filters_ask_the_cluster_for_live_runs(cluster, storage, monkeypatch):
    """Storage said Pending (nobody followed the run) while its pods ran: list's --state
    matches Running, and delete --state Pending leaves it alone."""
    name = unique("livelist")
    in_process(monkeypatch, cluster, "none")
    runs.submit(spec(name, NAMESPACE, storage=storage, pod_annotations=timing(run_s=600)))
    backend = KubeBackend("xrun-test", NAMESPACE, cluster.kubeconfig)
    try:
        cluster.wait("its pods Running", lambda: (s if (s := backend.status(name)) and s.state == "Running" else None),
                     60, every=0.5)
        root = open_storage(storage)
        assert (root.read_json(Layout.state(name)) or {}).get("state") in (None, "Pending")
        mine = runs.parse_selector(f"xrun.dev/run={name}")
        assert runs.list_runs(root, None, runs.RunFilter(mine, ("Pending",))) == []
        (row,) = runs.list_runs(root, None, runs.RunFilter(mine, ("Running",)))
        assert row["name"] == name and row["in_cluster"] is True
        r = xrun("delete", "--state", "Pending", "-l", f"xrun.dev/run={name}", "--yes", storage=storage,
                 timeout=120, KUBECONFIG=cluster.kubeconfig)
        assert r.returncode == 0 and "no runs match" in r.stderr, r.stderr
        assert backend.get_jobset(name) is not None
    finally:
        backend.delete(name, wait=False)
