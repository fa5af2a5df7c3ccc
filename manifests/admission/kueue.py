"""Kueue on a queued JobSet's Workload: what a ClusterQueue built as xpk builds it never
admits."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from manifests.admission.base import (
    INVALID,
    KUEUE,
    Violation,
    _dict,
    _list,
    _rjobs,
)
from manifests.k8s_names import (
    parse_quantity,
)

# --------------------------------------------------------------------------------------
# Kueue on a queued JobSet's Workload

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_SRC = "kubernetes-sigs/kueue pkg/workload/workload.go"
# What xpk's ClusterQueue covers unless it was created with --cpu-limit / --memory-limit
# (xpk src/xpk/core/kueue_manager.py: covered_resources = [managed_resource], the
# accelerator's resource type; cpu and memory are appended only for those flags).
XPK_COVERED_RESOURCES = ("google.com/tpu", "nvidia.com/gpu")


def _requests_with_limits(ctr: dict[str, Any]) -> dict[str, Decimal]:
    """One container's requests as Kueue reads them: limits fill missing requests (kueue
    pkg/workload/resources.go UseLimitsAsMissingRequestsInPod, run by AdjustResources
    before the totals; the apiserver defaults a pod the same way)."""
    res = _dict(ctr.get("resources"))
    merged = {**_dict(res.get("limits")), **_dict(res.get("requests"))}
    out = {}
    for name, value in merged.items():
        q = parse_quantity(value)
        if q is not None:
            out[str(name)] = q
    return out


def _add(into: dict[str, Decimal], more: dict[str, Decimal]) -> None:
    for name, q in more.items():
        into[name] = into.get(name, Decimal(0)) + q


def kueue_pod_requests(pod_spec: dict[str, Any]) -> dict[str, Decimal]:
    """One pod's requests as Kueue v0.17 sums them into its Workload (kueue
    pkg/workload/workload.go totalRequestsFromPodSets -> k8s.io/component-helpers
    resource/helpers.go PodRequests -> AggregateContainerRequests, KEP-753's formula): the
    containers' requests summed; each native sidecar (an init container with
    ``restartPolicy: Always``) added to that sum and to every later init container's; the
    larger of the sum and each init container's use; plus ``overhead``. A LimitRange's
    defaults (resources.go handlePodLimitRange) come on top on a cluster that has one."""
    reqs: dict[str, Decimal] = {}
    for ctr in _list(pod_spec.get("containers")):
        _add(reqs, _requests_with_limits(_dict(ctr)))
    sidecars: dict[str, Decimal] = {}
    init_max: dict[str, Decimal] = {}
    for ctr in _list(pod_spec.get("initContainers")):
        mine = _requests_with_limits(_dict(ctr))
        if _dict(ctr).get("restartPolicy") == "Always":
            _add(reqs, mine)
            _add(sidecars, mine)
            use = dict(sidecars)
        else:
            use = dict(mine)
            _add(use, sidecars)
        for name, q in use.items():
            init_max[name] = max(init_max.get(name, q), q)
    for name, q in init_max.items():
        reqs[name] = max(reqs.get(name, q), q)
    for name, value in _dict(pod_spec.get("overhead")).items():
        overhead = parse_quantity(value)
        if overhead is not None:
            _add(reqs, {str(name): overhead})
    return reqs


def kueue_uncovered(pod_spec: dict[str, Any], covered: tuple[str, ...] = XPK_COVERED_RESOURCES) -> list[str]:
    """The resources Kueue would look for in the ClusterQueue that it does not cover, sorted.
    Zero requests of a resource the ClusterQueue does not define are skipped (kueue
    pkg/scheduler/flavorassigner/flavorassigner.go assignFlavors, #8079)."""
    return sorted(name for name, q in kueue_pod_requests(pod_spec).items() if q and name not in covered)


def kueue_requests(obj: dict[str, Any]) -> list[Violation]:
    """kueue pkg/workload/workload.go totalRequestsFromPodSets (with
    component-helpers resource/helpers.go PodRequests) and pkg/scheduler/flavorassigner/
    flavorassigner.go findFlavorForPodSets: a queued JobSet's pods may request only what the
    ClusterQueue covers, else the flavor assigner answers "resource cpu unavailable in
    ClusterQueue" and the Workload is never admitted. xpk's ClusterQueue covers only the
    accelerator (kueue_manager.py), so a queued run requests nothing else; reported at each
    container that requests an uncovered resource."""
    if not _dict(_dict(obj.get("metadata")).get("labels")).get(KUEUE_QUEUE_LABEL):
        return []
    out = []
    for _, rj, base in _rjobs(obj):
        pod = _dict(_dict(_dict(_dict(rj.get("template")).get("spec")).get("template")).get("spec"))
        missing = kueue_uncovered(pod)
        pod_path = f"{base}.template.spec.template.spec"
        for kind in ("initContainers", "containers"):
            for i, ctr in enumerate(_list(pod.get(kind))):
                for name in missing:
                    if _requests_with_limits(_dict(ctr)).get(name):
                        out.append(Violation(
                            f"{pod_path}.{kind}[{i}].resources.requests[{name}]", "kueue-uncovered-resource",
                            f"a queued pod may request only {' or '.join(XPK_COVERED_RESOURCES)}: Kueue adds {name} "
                            f"to the Workload and a ClusterQueue as xpk creates it has none (\"resource {name} "
                            "unavailable in ClusterQueue\": never admitted)",
                            f"{KUEUE_SRC}:totalRequestsFromPodSets", KUEUE, INVALID, name))
    return out
