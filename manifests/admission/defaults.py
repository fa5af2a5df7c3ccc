"""Defaulting: what the CRD schema and JobSet's mutating webhook add before validation, and
what the apiserver completes on each pod the Job controller creates."""

from __future__ import annotations

import copy
from typing import Any

from manifests.admission import crd_rules as crd
from manifests.admission.base import (
    _containers,
    _dict,
    _list,
    _pod_spec,
)

# --------------------------------------------------------------------------------------
# Defaulting


def default(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` with what the cluster sets before storing it. Idempotent.

    CRD structural defaults (apiextensions-apiserver applies the schema's ``default:``
    values, read from crd_rules.DEFAULTS; jobset_types.go ``+kubebuilder:default`` markers):
    failurePolicy.restartStrategy Recreate, replicatedJobs[].groupName "default" and replicas
    1; and core types' defaults: container ports' protocol TCP, empty names of env key refs;
    a volume without a source becomes an emptyDir (core/v1 defaults.go SetDefaults_Volume,
    applied when the Job is decoded). Then the JobSet mutating webhook (jobset_webhook.go:
    Default): successPolicy {operator: All}, startupPolicy {startupPolicyOrder: AnyOrder},
    each Job's completionMode Indexed and pod restartPolicy OnFailure when unset, every
    container's resources {} when absent (its answer is the object re-encoded from Go types),
    network.enableDNSHostnames and publishNotReadyAddresses true, failure policy rule names
    failurePolicyRule<i> when empty, volumeClaimPolicies retentionPolicy Delete. Job fields
    such as parallelism/completions/backoffLimit are defaulted only when the controller
    creates the Jobs (batch/v1 SetDefaults_Job), so they are not stored in the JobSet.
    """
    out = copy.deepcopy(obj)
    spec = out.setdefault("spec", {})
    # CRD schema defaults.
    fp = spec.get("failurePolicy")
    if isinstance(fp, dict):
        fp.setdefault("restartStrategy", crd.DEFAULTS["spec.failurePolicy.restartStrategy"])
    for rj in _list(spec.get("replicatedJobs")):
        if not isinstance(rj, dict):
            continue
        rj.setdefault("groupName", crd.DEFAULTS["spec.replicatedJobs[].groupName"])
        rj.setdefault("replicas", crd.DEFAULTS["spec.replicatedJobs[].replicas"])
        pod = _pod_spec(rj)
        for vol in _list(pod.get("volumes")):
            # core/v1 defaults.go SetDefaults_Volume (applied when the Job is decoded): a
            # volume without a source is an emptyDir.
            if isinstance(vol, dict) and all(v is None for k, v in vol.items() if k != "name"):
                for k in [k for k in vol if k != "name"]:
                    del vol[k]
                vol["emptyDir"] = {}
        for ctr in _containers(pod):
            for port in _list(ctr.get("ports")):
                if isinstance(port, dict):
                    port.setdefault("protocol", "TCP")
            for env in _list(ctr.get("env")):
                value_from = env.get("valueFrom") if isinstance(env, dict) else None
                for ref in ("configMapKeyRef", "secretKeyRef"):
                    if isinstance(value_from, dict) and isinstance(value_from.get(ref), dict):
                        value_from[ref].setdefault("name", "")
    # JobSet webhook Default().
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    for rj in _list(spec.get("replicatedJobs")):
        if not isinstance(rj, dict):
            continue
        job_spec = rj.setdefault("template", {}).setdefault("spec", {})
        job_spec.setdefault("completionMode", "Indexed")
        pod = job_spec.setdefault("template", {}).setdefault("spec", {})
        if not pod.get("restartPolicy"):
            pod["restartPolicy"] = "OnFailure"
        # The webhook answers with the JobSet it decoded into Go types and encoded again: a
        # container's resources (a struct, which omitempty never omits) come back as {}.
        for ctr in _containers(pod):
            if isinstance(ctr, dict) and ctr.get("resources") is None:
                ctr["resources"] = {}
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    if isinstance(fp, dict):
        for i, rule in enumerate(_list(fp.get("rules"))):
            if isinstance(rule, dict) and not rule.get("name"):
                rule["name"] = f"failurePolicyRule{i}"
    for policy in _list(spec.get("volumeClaimPolicies")):
        if isinstance(policy, dict):
            policy.setdefault("retentionPolicy", {"whenDeleted": "Delete"})
    return out


def default_pod(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """A copy of a pod template's spec as the apiserver completes it when the Job controller
    creates each pod (kubernetes pkg/apis/core/v1/defaults.go: SetDefaults_Pod): a container's
    limits copied into missing requests, and under hostNetwork every port's hostPort set to its
    containerPort (defaultHostNetworkPorts). A Pod (unlike a template) must then have
    hostPort == containerPort (validation.go: validatePodHostNetworkDeps, ResourceIsPod)."""
    out = copy.deepcopy(pod_spec)
    for ctr in _list(out.get("containers")):
        res = _dict(_dict(ctr).get("resources"))
        if isinstance(res.get("limits"), dict):
            requests = res.setdefault("requests", {})
            for name, value in res["limits"].items():
                requests.setdefault(name, value)
    if out.get("hostNetwork"):
        for ctr in _containers(out):
            for port in _list(ctr.get("ports")):
                if isinstance(port, dict) and not port.get("hostPort"):
                    port["hostPort"] = port.get("containerPort")
    return out
