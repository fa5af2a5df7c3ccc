"""What a cluster submit reads from the cluster before it creates anything: the Kueue
LocalQueue when none is named, and whether any node pool can hold the shape.

Both run after the spec is valid and before anything is written or created, so a refusal
(exit 2) leaves the name free. A cluster that forbids the read (RBAC) is not a refusal: the
submit goes on with a warning saying what could not be checked.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from manifests.jobset import pod_spec
from manifests.spec import QUEUE_NONE, RunSpec, validate
from orchestrator import settings
from orchestrator.backends.kube.backend import KUEUE_GROUP, KubeBackend
from xrun_contract.errors import EXIT_FAILED, EXIT_USAGE, XrunError
from xrun_contract.k8s import Labels

# How GKE labels the nodes of a node pool: each TPU VM with its slice's accelerator and
# topology, each GPU node with its accelerator, all with the pool's name
# (cloud.google.com/kubernetes-engine/docs/concepts/tpus, .../how-to/gpus).
POOL_LABEL = Labels.NODEPOOL


@dataclass
class Resolved:
    """The spec as it will be submitted, and what the user should read about it."""

    spec: RunSpec
    notes: list[str] = field(default_factory=list)  # info lines (the queue found)
    warnings: list[str] = field(default_factory=list)


def kueue_version(backend: KubeBackend) -> str:
    """Kueue's preferred API version on this cluster, "" when Kueue is not installed."""
    group = backend.api_group(KUEUE_GROUP)
    if group is None:
        return ""
    return (group.get("preferredVersion") or {}).get("version") or group["versions"][0]["version"]


def local_queue_names(backend: KubeBackend, version: str) -> list[str]:
    return sorted((q.get("metadata") or {}).get("name", "") for q in backend.local_queues(version))


def find_queue(backend: KubeBackend) -> tuple[str, str, str]:
    """(queue, kind, detail) for a run that names no queue in the backend's namespace:
    kind "one" (use it), "several" (detail names them), "none" (Kueue installed, no
    LocalQueue here), "no-kueue" or "forbidden" (detail says why)."""
    try:
        version = kueue_version(backend)
        if not version:
            return "", "no-kueue", ""
        names = local_queue_names(backend, version)
    except XrunError as e:
        if e.exit_code == EXIT_FAILED:  # RBAC: cannot tell
            return "", "forbidden", str(e)
        raise
    if len(names) == 1:
        return names[0], "one", ""
    if names:
        return "", "several", ", ".join(names)
    return "", "none", ""


def resolve_queue(spec: RunSpec, backend: KubeBackend) -> Resolved:
    """A cluster run that names no queue goes to ``$XRUN_QUEUE`` or else the namespace's
    only LocalQueue: on a cluster whose Kueue does not manage unlabelled jobs (xpk's:
    no ``manageJobsWithoutQueueName``) a JobSet without the label bypasses every
    ClusterQueue's quota. Several LocalQueues is bad input naming them; none, with Kueue
    installed, a warning. ``queue: none`` submits without Kueue on purpose."""
    out = Resolved(spec)
    if spec.queue == QUEUE_NONE:
        return out
    if spec.queue:
        out.warnings += check_named_queue(spec.queue, backend, "queue")
        return out
    default = settings.default_queue()
    if default:
        out.spec = _with_queue(spec, default, f"${settings.QUEUE_ENV}")
        if default != QUEUE_NONE:
            out.warnings += check_named_queue(default, backend, f"queue (from ${settings.QUEUE_ENV})")
        return out
    queue, kind, detail = find_queue(backend)
    ns = backend.namespace
    if kind == "one":
        out.spec = _with_queue(spec, queue, "the namespace's LocalQueue")
        out.notes.append(f"queue: LocalQueue {ns}/{queue}, the only one in namespace {ns} "
                         "(--queue NAME to choose, --queue none for no Kueue)")
    elif kind == "several":
        raise XrunError(f"queue: namespace {ns!r} has several Kueue LocalQueues ({detail}): name one with "
                        f"--queue (or --queue {QUEUE_NONE} to bypass Kueue)", EXIT_USAGE)
    elif kind == "none":
        out.warnings.append(f"Kueue is installed but namespace {ns!r} has no LocalQueue: the run is not "
                            "queued, so it is held by no ClusterQueue's quota (--queue NAME, or --queue "
                            f"{QUEUE_NONE} to say so)")
    elif kind == "forbidden":
        out.warnings.append(f"cannot list Kueue LocalQueues in namespace {ns!r}, so the run is not queued: {detail}")
    return out


def check_named_queue(queue: str, backend: KubeBackend, field: str) -> list[str]:
    """A named LocalQueue must exist in the namespace: a JobSet labelled for a missing one is
    held suspended for ever (Kueue makes its Workload, which no ClusterQueue admits), which
    only ``status`` told. Bad input naming the queues there; RBAC that forbids the read: a
    warning."""
    ns = backend.namespace
    try:
        version = kueue_version(backend)
        if not version:
            raise XrunError(f"{field}: {queue!r} is a Kueue LocalQueue, and this cluster serves no {KUEUE_GROUP} "
                            f"(Kueue is not installed); --queue {QUEUE_NONE} submits without Kueue", EXIT_USAGE)
        if backend.local_queue(queue, version) is not None:
            return []
        names = local_queue_names(backend, version)
    except XrunError as e:
        if e.exit_code == EXIT_FAILED:
            return [f"cannot read Kueue LocalQueue {ns}/{queue}, so whether it exists is unchecked: {e}"]
        raise
    there = f"LocalQueues there: {', '.join(names)}" if names else "it has no LocalQueue"
    raise XrunError(f"{field}: no Kueue LocalQueue {queue!r} in namespace {ns!r} ({there}); the run would wait "
                    f"suspended for ever", EXIT_USAGE)


def _with_queue(spec: RunSpec, queue: str, where: str) -> RunSpec:
    new = dataclasses.replace(spec, queue=queue)
    try:
        validate(new)
    except XrunError as e:
        raise XrunError(f"{e} (from {where})", EXIT_USAGE) from None
    return new


# ---------------------------------------------------------------------------------------
# Capacity


@dataclass
class Pool:
    name: str
    labels: dict[str, str]  # labels all its nodes share
    taints: list[dict[str, Any]]
    nodes: int = 0

    def describe(self) -> str:
        get = self.labels.get
        if get(Labels.TPU_ACCELERATOR):
            what = f"{get(Labels.TPU_ACCELERATOR)} {get(Labels.TPU_TOPOLOGY, '?')} {get(Labels.INSTANCE_TYPE, '?')}"
        else:
            what = f"{get(Labels.GPU_ACCELERATOR, '?')} {get(Labels.INSTANCE_TYPE, '?')}"
        return f"{self.name} ({what} x{self.nodes})"


def node_pools(nodes: list[dict[str, Any]]) -> list[Pool]:
    """Nodes grouped by node pool (nodes without the label each their own), with the labels
    and NoSchedule/NoExecute taints every node of the pool has."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for n in nodes:
        meta = n.get("metadata") or {}
        labels = meta.get("labels") or {}
        groups[labels.get(POOL_LABEL) or meta.get("name", "?")].append(n)
    pools = []
    for name, members in sorted(groups.items()):
        label_sets = [(m.get("metadata") or {}).get("labels") or {} for m in members]
        common = {k: v for k, v in label_sets[0].items() if all(ls.get(k) == v for ls in label_sets)}
        taints = [t for t in ((members[0].get("spec") or {}).get("taints") or [])
                  if t.get("effect") in ("NoSchedule", "NoExecute")]
        pools.append(Pool(name, common, taints, len(members)))
    return pools


def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    """core/v1 Toleration.ToleratesTaint."""
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if not tol.get("key"):
            if tol.get("operator") == "Exists":
                return True
            continue
        if tol["key"] != taint.get("key"):
            continue
        if tol.get("operator") == "Exists" or (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def fitting_pools(spec: RunSpec, pools: list[Pool]) -> list[Pool]:
    """The pools whose nodes the run's pods select (nodeSelector) and may run on (taints)."""
    from manifests.types import to_dict

    pod = to_dict(pod_spec(spec))
    selector, tolerations = pod.get("nodeSelector") or {}, pod.get("tolerations") or []
    return [p for p in pools if all(p.labels.get(k) == v for k, v in selector.items())
            and all(_tolerates(tolerations, t) for t in p.taints)]


def capacity_problem(spec: RunSpec, pools: list[Pool]) -> str:
    """Why no node pool can hold the run ("" when one can). TPU: each slice needs a pool of
    its own (JobSet's exclusive placement, one Job per node pool) with a node per VM; GPU:
    ``nodes`` nodes among the fitting pools."""
    shape = spec.shape
    fit = fitting_pools(spec, pools)
    if shape.kind == "tpu":
        whole = [p for p in fit if p.nodes >= shape.vms]
        if len(whole) >= spec.slices:
            return ""
        want = (f"{spec.slices} node pool(s) of {shape.vms} x {shape.machine_type} with "
                f"{shape.gke_accelerator} topology {shape.topology}")
        got = len(whole)
    else:
        if sum(p.nodes for p in fit) >= spec.nodes:
            return ""
        want = f"{spec.nodes} x {shape.gke_accelerator} node(s)"
        got = sum(p.nodes for p in fit)
    extra = {k: v for k, v in (to_selector(spec)).items()
             if k not in (Labels.TPU_ACCELERATOR, Labels.TPU_TOPOLOGY, Labels.INSTANCE_TYPE, Labels.GPU_ACCELERATOR)}
    also = f" (also labelled {', '.join(f'{k}={v}' for k, v in extra.items())})" if extra else ""
    kind = "TPU" if shape.kind == "tpu" else "GPU"
    seen = [p.describe() for p in pools if p.labels.get(Labels.TPU_ACCELERATOR if shape.kind == "tpu"
                                                        else Labels.GPU_ACCELERATOR)]
    return (f"accelerator: no node pool can hold {spec.accelerator}"
            f"{f' x{spec.slices} slices' if spec.slices > 1 else ''}: it needs {want}{also}, "
            f"{got} fit; {kind} node pools seen: {', '.join(seen) or 'none'}. "
            "Add --force to submit anyway (node auto-provisioning, or a pool scaled to zero)")


def to_selector(spec: RunSpec) -> dict[str, str]:
    return dict(pod_spec(spec).node_selector)


def check_capacity(spec: RunSpec, backend: KubeBackend) -> str:
    """Refuse (exit 2) a shape no node pool holds; a warning line ("" when fine) when the
    nodes cannot be listed. flex-start nodes are made for the run (by the autoscaler, or
    for Kueue's ProvisioningRequest), so none need exist yet."""
    if spec.shape.kind == "cpu" or spec.capacity == "flex-start":
        return ""
    label = Labels.TPU_ACCELERATOR if spec.shape.kind == "tpu" else Labels.GPU_ACCELERATOR
    try:
        nodes = backend.nodes(label)
    except XrunError as e:
        if e.exit_code == EXIT_FAILED:
            return f"cannot list nodes, so whether a node pool holds {spec.accelerator} is unchecked: {e}"
        raise
    problem = capacity_problem(spec, node_pools(nodes))
    if problem:
        raise XrunError(problem, EXIT_USAGE)
    return ""


# ---------------------------------------------------------------------------------------
# GPU networks


# GKE multi-networking (cloud.google.com/kubernetes-engine/docs/how-to/setup-multinetwork-support-for-pods):
# a pod's networking.gke.io/interfaces annotation names Network objects, each of which
# points at a GKENetworkParamSet (the VPC and subnet). xpk names its interfaces after the
# cluster's GKENetworkParamSets (AI-Hypercomputer/xpk@367c8382 src/xpk/core/network.py
# get_cluster_subnetworks: kubectl get GKENetworkParamSet).
NETWORKING_GROUP, NETWORKING_VERSION = "networking.gke.io", "v1"


def _natural(name: str) -> tuple[Any, ...]:
    import re

    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def order_networks(names: list[str]) -> list[str]:
    """eth1.. in the order GKE's clusters number them: A3 Ultra / A4 put the gVNIC network
    (``<cluster>-sub-1``) before the RDMA ones (``<cluster>-rdma-sub-<i>``); within each,
    by number (``<cluster>-gpunet-<i>-subnet``)."""
    return sorted(names, key=lambda n: ("rdma" in n, _natural(n)))


def device_networks(backend: KubeBackend) -> list[str] | None:
    """The Network objects that attach a NIC (a parametersRef to an existing
    GKENetworkParamSet), None when the cluster serves no networking.gke.io API."""
    if backend.api_group(NETWORKING_GROUP) is None:
        return None
    params = {(o.get("metadata") or {}).get("name") for o in
              backend.cluster_objects(NETWORKING_GROUP, NETWORKING_VERSION, "gkenetworkparamsets")}
    out = []
    for net in backend.cluster_objects(NETWORKING_GROUP, NETWORKING_VERSION, "networks"):
        ref = (net.get("spec") or {}).get("parametersRef") or {}
        if ref.get("kind") == "GKENetworkParamSet" and ref.get("name") in params:
            out.append((net.get("metadata") or {}).get("name", ""))
    return order_networks([n for n in out if n])


def pick_networks(accelerator: str, stack: Any, named: list[str], have: list[str] | None) -> tuple[list[str], str]:
    """(the networks to render, "" for the run file's or xrun's defaults; a note when read
    from the cluster). Missing, or not as many as the stack attaches: bad input naming what
    the cluster has (the pods would start without their GPU NICs)."""
    need = len(stack.networks)
    if have is None:
        raise XrunError(f"networks: {accelerator} attaches {need} NICs through GKE multi-networking, and this "
                        "cluster serves no networking.gke.io Network objects (create it with "
                        "--enable-multi-networking and the node pools' --additional-node-network)", EXIT_USAGE)
    seen = ", ".join(have) or "none"
    if named:
        missing = [n for n in named if n not in have]
        if missing:
            raise XrunError(f"networks: {', '.join(missing)} not in the cluster's Network objects ({seen})", EXIT_USAGE)
        return [], ""
    if all(n in have for n in stack.networks):
        return [], ""
    if len(have) == need:
        return have, f"networks: eth1..eth{need} on the cluster's Networks {', '.join(have)}"
    raise XrunError(f"networks: {accelerator} ({stack.name}) attaches {need} NICs; the cluster's Network "
                    f"objects are {seen}, not xrun's defaults ({', '.join(stack.networks)}): name the {need} to use "
                    "in networks: [...]", EXIT_USAGE)


def resolve_networks(spec: RunSpec, backend: KubeBackend) -> Resolved:
    """A GPU stack's NICs named after the cluster's Network objects: the run file's
    ``networks`` when all exist; else xrun's defaults (accelerators.yaml) when all exist;
    else the cluster's, when it has exactly as many as the stack attaches."""
    out = Resolved(spec)
    stack = spec.shape.networking if spec.shape.kind == "gpu" else None
    if stack is None or not stack.networks:
        return out
    try:
        have = device_networks(backend)
    except XrunError as e:
        if e.exit_code == EXIT_FAILED:
            out.warnings.append(f"cannot read the cluster's networking.gke.io Networks, so the NICs' networks are "
                                f"unchecked: {e}")
            return out
        raise
    networks, note = pick_networks(spec.accelerator, stack, spec.networks, have)
    if networks:
        out.spec = dataclasses.replace(spec, networks=networks)
        out.notes.append(note)
    return out
