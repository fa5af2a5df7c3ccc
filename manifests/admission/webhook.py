"""JobSet's validating webhook vjobset.kb.io (kubernetes-sigs/jobset v0.12
pkg/webhooks/jobset_webhook.go ValidateCreate)."""

from __future__ import annotations

import json
import re
from typing import Any

from manifests.admission.base import (
    INTERNAL,
    INVALID,
    JS_WEBHOOK,
    REQUIRED,
    RULE_NAME_FMT,
    TOO_LONG,
    VALID_JOB_FAILURE_REASONS,
    WEBHOOK,
    Violation,
    _dict,
    _int,
    _list,
    _rjobs,
)
from manifests.k8s_names import (
    is_dns1035_label,
    is_dns1123_subdomain,
    is_valid_label_value,
)

# --------------------------------------------------------------------------------------
# JobSet validating webhook (v0.12 ValidateCreate)


def _plain(path: str, rule: str, text: str, func: str, message: str | None = None) -> Violation:
    """A webhook error built with fmt.Errorf: upstream reports it as field.InternalError(nil, err),
    so its field reads "<nil>" on the wire (jobset_webhook.go: toFieldErrorList)."""
    return Violation(path, rule, message or text, f"{JS_WEBHOOK}:{func}", WEBHOOK, INTERNAL, detail=text,
                     field="<nil>")


_RESTART_JOB_ACTIONS = ("RestartJob", "RestartJobAndIgnoreMaxRestarts")


def _failure_rules(obj: dict[str, Any]) -> list[Any]:
    return _list(_dict(_dict(obj.get("spec")).get("failurePolicy")).get("rules"))


def _restart_job_gated(obj: dict[str, Any]) -> bool:
    """A RestartJob action with the RestartJob gate off (its v0.12 default): validateFailurePolicy
    reports that alone and returns before checking the rules (pkg/features/features.go)."""
    return any(_dict(r).get("action") in _RESTART_JOB_ACTIONS for r in _failure_rules(obj))


def feature_gates(obj: dict[str, Any]) -> list[Violation]:
    """jobset_webhook.go: ValidateCreate and validateFailurePolicy refuse alpha features whose
    gates are off by default in v0.12 (pkg/features/features.go): restartStrategy
    InPlaceRestart, and the RestartJob / RestartJobAndIgnoreMaxRestarts actions."""
    out = []
    fp = _dict(_dict(obj.get("spec")).get("failurePolicy"))
    if fp.get("restartStrategy") == "InPlaceRestart":
        out.append(_plain("spec.failurePolicy.restartStrategy", "feature-gate", "InPlaceRestart restart strategy "
                          "cannot be set when InPlaceRestart feature gate is disabled", "ValidateCreate"))
    if _restart_job_gated(obj):
        i = next(i for i, r in enumerate(_failure_rules(obj)) if _dict(r).get("action") in _RESTART_JOB_ACTIONS)
        out.append(_plain(f"spec.failurePolicy.rules[{i}].action", "feature-gate", "RestartJob and "
                          "RestartJobAndIgnoreMaxRestarts failure policy actions are not allowed when RestartJob "
                          "feature gate is disabled", "validateFailurePolicy"))
    return out


def kueue_queue_name(obj: dict[str, Any]) -> list[Violation]:
    """kubernetes-sigs/kueue pkg/controller/jobframework/validation.go: ValidateQueueName
    (ValidateLabelAsCRDName), from Kueue's JobSet validating webhook (also named
    vjobset.kb.io; pkg/controller/jobs/jobset/jobset_webhook.go validateCreate): the JobSet's
    ``kueue.x-k8s.io/queue-name`` label, when present, names a LocalQueue, so it must be a
    DNS-1123 subdomain (an empty value is a valid label value but no queue)."""
    key = "kueue.x-k8s.io/queue-name"
    labels = _dict(_dict(obj.get("metadata")).get("labels"))
    if key not in labels:
        return []
    value = labels[key]
    errs = is_dns1123_subdomain(str(value))
    if not errs:
        return []
    path = f"metadata.labels[{key}]"
    return [Violation(path, "kueue-queue-name", f"{json.dumps(value)} names no LocalQueue: {errs[0]}",
                      "kubernetes-sigs/kueue pkg/controller/jobframework/validation.go:ValidateLabelAsCRDName",
                      WEBHOOK, INVALID, value, ",".join(errs))]


def managed_by(obj: dict[str, Any]) -> list[Violation]:
    """jobset_webhook.go: ValidateCreate: spec.managedBy is a domain-prefixed path
    (validation.go IsDomainPrefixedPath) of at most 63 characters."""
    value = _dict(obj.get("spec")).get("managedBy")
    if value is None:
        return []
    value, path, src = str(value), "spec.managedBy", f"{JS_WEBHOOK}:ValidateCreate"
    host, sep, rest = value.partition("/")
    out = []
    if not value:
        out.append(Violation(path, "managed-by", "required", src, WEBHOOK, REQUIRED))
    elif not sep or not host or not rest:
        detail = 'must be a domain-prefixed path (such as "acme.io/foo")'
        out.append(Violation(path, "managed-by", f"{json.dumps(value)} {detail}", src, WEBHOOK, INVALID, value, detail))
    else:
        out += [Violation(path, "managed-by", f"{json.dumps(host)} {m}", src, WEBHOOK, INVALID, host, m)
                for m in is_dns1123_subdomain(host)]
        if not re.fullmatch(r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+", rest):
            detail = "Invalid path (regex used for validation is '[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+')"
            out.append(Violation(path, "managed-by", f"{json.dumps(rest)}: {detail}", src, WEBHOOK, INVALID, rest,
                                 detail))
    if len(value) > 63:
        out.append(Violation(path, "managed-by", f"{len(value)} characters; at most 63", src, WEBHOOK, TOO_LONG,
                             detail="may not be more than 63 bytes"))
    return out


def failure_policy_rule_names(obj: dict[str, Any]) -> list[Violation]:
    """jobset_webhook.go: validateFailurePolicy: each rule name 1..128 characters matching
    ``^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$``, and names unique."""
    if _restart_job_gated(obj):
        return []
    out = []
    rules = _failure_rules(obj)
    by_name: dict[str, list[int]] = {}
    for i, rule in enumerate(rules):
        name = str(_dict(rule).get("name", ""))
        path = f"spec.failurePolicy.rules[{i}].name"
        if not 1 <= len(name) <= 128:
            out.append(_plain(path, "failure-rule-name-length",
                              f"invalid failure policy rule name of length {len(name)}, the rule name must be at "
                              "least 1 characters long and at most 128 characters long", "validateFailurePolicy",
                              f"{json.dumps(name)} must be 1..128 characters"))
        by_name.setdefault(name, []).append(i)
        if not re.fullmatch(RULE_NAME_FMT, name):
            out.append(_plain(path, "failure-rule-name",
                              f"invalid failure policy rule name '{name}', a failure policy rule name must start "
                              "with an alphabetic character, optionally followed by a string of alphanumeric "
                              "characters or '_,:', and must end with an alphanumeric character or '_'",
                              "validateFailurePolicy", f"{json.dumps(name)} must match {RULE_NAME_FMT}"))
    for name, indices in by_name.items():
        if len(indices) > 1:
            out.append(_plain(f"spec.failurePolicy.rules[{indices[-1]}].name", "failure-rule-name-unique",
                              f"rule names are not unique, rules with indices {_go_list(indices)} all have the same "
                              f"name '{name}'", "validateFailurePolicy",
                              f"{json.dumps(name)} is also the name of rules {indices[:-1]}; names must be unique"))
    return out


def _go_list(items: list[Any]) -> str:
    return "[" + " ".join(str(x) for x in items) + "]"


def _rjob_names(obj: dict[str, Any]) -> set[str]:
    return {str(rj.get("name")) for _, rj, _ in _rjobs(obj)}


def failure_policy_targets(obj: dict[str, Any]) -> list[Violation]:
    """jobset_webhook.go: validateFailurePolicy: a rule's targetReplicatedJobs must exist."""
    if _restart_job_gated(obj):
        return []
    names, out = _rjob_names(obj), []
    for i, rule in enumerate(_failure_rules(obj)):
        for j, target in enumerate(_list(_dict(rule).get("targetReplicatedJobs"))):
            if target not in names:
                out.append(_plain(f"spec.failurePolicy.rules[{i}].targetReplicatedJobs[{j}]", "failure-rule-target",
                                  f"invalid replicatedJob name '{target}' in failure policy does not appear in "
                                  ".spec.ReplicatedJobs", "validateFailurePolicy",
                                  f"{json.dumps(target)} is not a replicatedJob of this JobSet"))
    return out


def failure_policy_reasons(obj: dict[str, Any]) -> list[Violation]:
    """jobset_webhook.go: validateFailurePolicy: onJobFailureReasons must be Job failure
    reasons (validOnJobFailureReasons)."""
    if _restart_job_gated(obj):
        return []
    out = []
    for i, rule in enumerate(_failure_rules(obj)):
        for j, reason in enumerate(_list(_dict(rule).get("onJobFailureReasons"))):
            if reason not in VALID_JOB_FAILURE_REASONS:
                out.append(_plain(f"spec.failurePolicy.rules[{i}].onJobFailureReasons[{j}]", "failure-rule-reason",
                                  f"invalid job failure reason '{reason}' in failure policy is not a recognized job "
                                  "failure reason", "validateFailurePolicy",
                                  f"{json.dumps(reason)} is not one of {', '.join(VALID_JOB_FAILURE_REASONS)}"))
    return out


def network_subdomain(obj: dict[str, Any]) -> list[Violation]:
    """jobset_webhook.go: ValidateCreate: network.subdomain must be a DNS-1123 subdomain and,
    being the headless Service's name, a DNS-1035 label."""
    sub = _dict(_dict(obj.get("spec")).get("network")).get("subdomain")
    if not sub:
        return []
    path, src, out = "spec.network.subdomain", f"{JS_WEBHOOK}:ValidateCreate", []
    msgs = is_dns1123_subdomain(sub) + [
        ".spec.network.subdomain is too long, must be less than 63 characters" if "no more than 63" in m else m
        for m in is_dns1035_label(sub)]
    for m in msgs:
        out.append(Violation(path, "network-subdomain", f"{json.dumps(sub)} {m}", src, WEBHOOK, INVALID, sub, m))
    return out


def group_names(obj: dict[str, Any]) -> list[Violation]:
    """jobset_webhook.go: ValidateCreate: replicatedJobs[].groupName (defaulted "default")
    must be a DNS-1035 label."""
    out = []
    for _, rj, base in _rjobs(obj):
        group = str(rj.get("groupName", "default"))
        for m in is_dns1035_label(group):
            m = ".spec.replicatedJob[].groupName is too long, must be less than 63 characters" \
                if "no more than 63" in m else m
            out.append(Violation(f"{base}.groupName", "group-name", f"{json.dumps(group)} {m}",
                                 f"{JS_WEBHOOK}:ValidateCreate", WEBHOOK, INVALID, group, m))
    return out


def job_names(obj: dict[str, Any]) -> list[Violation]:
    """jobset_webhook.go: ValidateCreate with placement.GenJobName: the longest child Job
    name ``<jobset>-<replicatedJob>-<replicas-1>`` must be a DNS-1035 label (63 max)."""
    js = str(_dict(obj.get("metadata")).get("name", ""))
    out = []
    for _, rj, base in _rjobs(obj):
        longest = f"{js}-{rj.get('name', '')}-{(_int(rj.get('replicas')) or 1) - 1}"
        for m in is_dns1035_label(longest):
            m = ("JobSet name is too long, job names generated for this JobSet will exceed 63 characters"
                 if "no more than 63" in m else m)
            out.append(Violation(f"{base}.name", "job-name", f"child Job name {json.dumps(longest)}: {m}",
                                 f"{JS_WEBHOOK}:ValidateCreate", WEBHOOK, INVALID, longest, m))
    return out


def pod_names(obj: dict[str, Any]) -> list[Violation]:
    """jobset_webhook.go: ValidateCreate with placement.GenPodName: for an Indexed Job with
    completions, ``<jobset>-<replicatedJob>-<replicas-1>-<completions-1>-abcde`` (the 5-char
    suffix Kubernetes adds) must be a DNS-1035 label. Upstream reports it on the name field
    with the longest Job name as the value."""
    js = str(_dict(obj.get("metadata")).get("name", ""))
    out = []
    for _, rj, base in _rjobs(obj):
        job = _dict(_dict(rj.get("template")).get("spec"))
        completions = _int(job.get("completions"))
        if job.get("completionMode") != "Indexed" or completions is None:
            continue
        job_idx = (_int(rj.get("replicas")) or 1) - 1
        longest_job = f"{js}-{rj.get('name', '')}-{job_idx}"
        longest_pod = f"{longest_job}-{completions - 1}-abcde"
        for m in is_dns1035_label(longest_pod):
            m = ("JobSet name is too long, pod names generated for this JobSet will exceed 63 characters"
                 if "no more than 63" in m else m)
            out.append(Violation(f"{base}.name", "pod-name",
                                 f"pod name {json.dumps(longest_pod[:-6])}-xxxxx ({len(longest_pod)} characters): {m}",
                                 f"{JS_WEBHOOK}:ValidateCreate", WEBHOOK, INVALID, longest_job, m))
    return out


def replicas_times_parallelism(obj: dict[str, Any]) -> list[Violation]:
    """jobset_webhook.go: ValidateCreate: replicas x parallelism must fit in an int32."""
    out = []
    for _, rj, base in _rjobs(obj):
        par = _int(_dict(_dict(rj.get("template")).get("spec")).get("parallelism"))
        reps = _int(rj.get("replicas")) or 1
        if not all(-2**31 <= n < 2**31 for n in (reps, 1 if par is None else par)):
            continue  # the mutating webhook's decode refuses it first (int32_fields)
        if (1 if par is None else par) * reps > 2**31 - 1:
            out.append(_plain(f"{base}.replicas", "replicas-parallelism",
                              f"the product of replicas and parallelism must not exceed 2147483647 for "
                              f"replicatedJob '{rj.get('name')}'", "ValidateCreate"))
    return out


def depends_on(obj: dict[str, Any]) -> list[Violation]:
    """jobset_webhook.go: ValidateCreate: the first replicatedJob cannot have dependsOn, and
    dependsOn may only name replicatedJobs listed before it."""
    out, seen = [], set()
    for i, rj, base in _rjobs(obj):
        seen.add(rj.get("name"))
        deps = _list(rj.get("dependsOn"))
        if i == 0 and "dependsOn" in rj:
            out.append(_plain(f"{base}.dependsOn", "depends-on-first", "DependsOn can't be set for the first "
                              "ReplicatedJob", "ValidateCreate"))
        for j, dep in enumerate(deps):
            target = _dict(dep).get("name")
            if target not in seen:  # upstream adds this rjob's own name first
                out.append(_plain(f"{base}.dependsOn[{j}].name", "depends-on-order",
                                  f"replicatedJob: {rj.get('name')} cannot depend on replicatedJob: {target}",
                                  "ValidateCreate"))
    return out


def success_policy_targets(obj: dict[str, Any]) -> list[Violation]:
    """jobset_webhook.go: ValidateCreate: successPolicy.targetReplicatedJobs must exist."""
    names, out = _rjob_names(obj), []
    targets = _list(_dict(_dict(obj.get("spec")).get("successPolicy")).get("targetReplicatedJobs"))
    for j, target in enumerate(targets):
        if target not in names:
            out.append(_plain(f"spec.successPolicy.targetReplicatedJobs[{j}]", "success-policy-target",
                              f"invalid replicatedJob name '{target}' does not appear in .spec.ReplicatedJobs",
                              "ValidateCreate", f"{json.dumps(target)} is not a replicatedJob of this JobSet"))
    return out


def coordinator(obj: dict[str, Any]) -> list[Violation]:
    """jobset_webhook.go: validateCoordinator: the replicatedJob exists, jobIndex < replicas,
    its Job is Indexed with completions, podIndex < completions (first failure only)."""
    coord = _dict(obj.get("spec")).get("coordinator")
    if not isinstance(coord, dict):
        return []
    name = coord.get("replicatedJob")
    rj = next((r for _, r, _ in _rjobs(obj) if r.get("name") == name), None)
    job_index, pod_index = _int(coord.get("jobIndex")) or 0, _int(coord.get("podIndex")) or 0
    if rj is None:
        return [_plain("spec.coordinator.replicatedJob", "coordinator",
                       f"coordinator replicatedJob {name} does not exist", "validateCoordinator")]
    if not 0 <= job_index < (_int(rj.get("replicas")) or 1):
        return [_plain("spec.coordinator.jobIndex", "coordinator",
                       f"coordinator job index {job_index} is invalid for replicatedJob {name}", "validateCoordinator")]
    job = _dict(_dict(rj.get("template")).get("spec"))
    completions = _int(job.get("completions"))
    if job.get("completionMode") != "Indexed" or completions is None:
        return [_plain("spec.coordinator.replicatedJob", "coordinator", "job for coordinator pod must be indexed "
                       "completion mode, and completions number must be set", "validateCoordinator")]
    if not 0 <= pod_index < completions:
        return [_plain("spec.coordinator.podIndex", "coordinator",
                       f"coordinator pod index {pod_index} is invalid for replicatedJob {name} job index {job_index}",
                       "validateCoordinator")]
    return []


def coordinator_label(obj: dict[str, Any]) -> list[Violation]:
    """jobset_webhook.go: validateCoordinatorLabelValue with controllers.CoordinatorEndpoint:
    ``<jobset>-<rjob>-<jobIndex>-<podIndex>.<subdomain>`` becomes a label value, so it must
    be one (63 characters at most; the subdomain defaults to the JobSet name)."""
    spec = _dict(obj.get("spec"))
    coord = spec.get("coordinator")
    if not isinstance(coord, dict):
        return []
    js = str(_dict(obj.get("metadata")).get("name", ""))
    sub = _dict(spec.get("network")).get("subdomain") or js
    value = f"{js}-{coord.get('replicatedJob')}-{coord.get('jobIndex', 0)}-{coord.get('podIndex', 0)}.{sub}"
    errs = is_valid_label_value(value)
    if not errs:
        return []
    text = (f"spec will lead to invalid label value {json.dumps(value)} for coordinator label "
            f"\"jobset.sigs.k8s.io/coordinator\" (long JobSet / ReplicatedJob / SubDomain name?): {', '.join(errs)}")
    return [_plain("spec.coordinator", "coordinator-label", text, "validateCoordinatorLabelValue",
                   f"coordinator endpoint {json.dumps(value)} ({len(value)} characters) must be a label value: "
                   f"{errs[0]}")]
