"""Scheduling and Kueue admission for the scripted API server (tests/kube_api.py), as
controller phases: what decides *where* a JobSet's pods land and *whether* they exist.

- ``schedule`` plays the JobSet/Job controllers and kube-scheduler's filters for every pod
  of a stored JobSet: no pods while ``spec.suspend`` (JobSet creates its Jobs suspended);
  a gated pod stays Pending (``SchedulingGated``); otherwise each pod binds to the first
  node passing NodeAffinity (pkg/scheduler/framework/plugins/nodeaffinity: every
  ``nodeSelector`` entry equals a node label) and TaintToleration
  (plugins/tainttoleration: ``v1helper.FindMatchingUntoleratedTaint`` over NoSchedule and
  NoExecute taints, tolerations matched as ``core/v1 toleration.go ToleratesTaint``), and
  each node takes one pod (one pod per host). A pod with no node is Pending/Unschedulable
  with kube-scheduler's FailedScheduling message.
- ``kueue_admit`` plays Kueue admitting the workload (all admission checks Ready, e.g. a
  ProvisioningRequest that got its nodes): it unsuspends the JobSet.
"""

from __future__ import annotations

from typing import Any

from kube_api import KubeAPI, make_pod


def node(name: str, labels: dict[str, str], taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints or []},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def tolerates(tol: dict[str, Any], taint: dict[str, Any]) -> bool:
    """core/v1 toleration.go ToleratesTaint."""
    if tol.get("effect") and tol["effect"] != taint.get("effect"):
        return False
    if tol.get("key") and tol["key"] != taint.get("key"):
        return False
    op = tol.get("operator") or "Equal"
    if op == "Exists":
        return True
    return op == "Equal" and (tol.get("value") or "") == (taint.get("value") or "")


def why_not(pod_spec: dict[str, Any], n: dict[str, Any]) -> str:
    """'' when the pod fits the node, else kube-scheduler's reason for the node."""
    labels = n["metadata"].get("labels", {})
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return "didn't match Pod's node affinity/selector"
    for taint in n["spec"].get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(
                tolerates(t, taint) for t in pod_spec.get("tolerations") or []):
            return f"had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
    return ""


def _accelerator(pod_spec: dict[str, Any]) -> str:
    limits = (pod_spec["containers"][0].get("resources") or {}).get("limits") or {}
    return next((k for k in limits if "/" in k), "cpu")


def schedule(api: KubeAPI, name: str, namespace: str = "default") -> None:
    with api.cond:
        js = api.jobsets[(namespace, name)]
        if js["spec"].get("suspend"):
            api.set_jobset_status(name, namespace, conditions=[
                {"type": "Suspended", "status": "True", "reason": "SuspendedJobs", "message": "jobset is suspended"}])
            return
        taken = {p["spec"].get("nodeName") for p in api.pods.values() if p["spec"].get("nodeName")}
        for rj in js["spec"]["replicatedJobs"]:
            template = rj["template"]["spec"]["template"]
            for slice_index in range(rj.get("replicas", 1)):
                for host in range(rj["template"]["spec"].get("parallelism", 1)):
                    pod_spec = template["spec"]
                    reasons: dict[str, int] = {}
                    chosen = None
                    for n in api.nodes:
                        # One pod per node: each asks for all of a node's chips (NodeResourcesFit).
                        reason = f"Insufficient {_accelerator(pod_spec)}" if n["metadata"]["name"] in taken else ""
                        reason = reason or why_not(pod_spec, n)
                        if not reason:
                            chosen = n["metadata"]["name"]
                            break
                        reasons[reason] = reasons.get(reason, 0) + 1
                    gated = bool(pod_spec.get("schedulingGates"))
                    message = f"0/{len(api.nodes)} nodes are available: " + ", ".join(
                        f"{c} {r}" if r.startswith("Insufficient") else f"{c} node(s) {r}" for r, c in sorted(reasons.items())) + "."
                    pod = make_pod(name, slice_index, host, 0, "Running" if chosen and not gated else "Pending",
                                   namespace=namespace, unschedulable=None if chosen or gated else message)
                    pod["spec"].update({k: v for k, v in pod_spec.items() if k in ("nodeSelector", "tolerations")})
                    if gated:
                        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                                        "reason": "SchedulingGated"}]
                    elif chosen:
                        pod["spec"]["nodeName"] = chosen
                        taken.add(chosen)
                    else:
                        api.add_event("Pod", pod["metadata"]["name"], "FailedScheduling", message, namespace=namespace)
                    api.put_pod(pod)


def kueue_admit(api: KubeAPI, name: str, namespace: str = "default") -> None:
    """Kueue's jobframework on admission: spec.suspend false (the JobSet controller then
    resumes its Jobs)."""
    with api.cond:
        js = api.jobsets[(namespace, name)]
        js["spec"]["suspend"] = False
        api.set_jobset_status(name, namespace, conditions=[
            {"type": "Suspended", "status": "False", "reason": "ResumeJobs", "message": "jobset is resumed"}])
