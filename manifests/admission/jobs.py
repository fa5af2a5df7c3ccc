"""kube-apiserver on the Jobs and pods the JobSet controller creates from each template
(kubernetes pkg/apis/batch/validation and pkg/apis/core/validation)."""

from __future__ import annotations

import json
import re
from typing import Any

from manifests.admission.base import (
    _NOVALUE,
    DUPLICATE,
    FORBIDDEN,
    INVALID,
    JOB,
    K8S_BATCH,
    K8S_CORE,
    NOT_FOUND,
    NOT_SUPPORTED,
    REQUIRED,
    TOO_MANY,
    Violation,
    _all_containers,
    _containers,
    _dict,
    _int,
    _job_specs,
    _list,
    _pod_specs,
)
from manifests.k8s_names import (
    is_dns1123_label,
    is_dns1123_subdomain,
    is_qualified_name,
    is_valid_label_value,
    is_valid_port_name,
    is_valid_port_num,
    parse_quantity,
)

# --------------------------------------------------------------------------------------
# kube-apiserver on the Jobs and pods the controller creates


def _job_rule(path: str, rule: str, message: str, func: str, cause: str = INVALID, value: Any = _NOVALUE,
              detail: str = "", src: str = K8S_CORE, field: str | None = None) -> Violation:
    return Violation(path, rule, message, f"{src}:{func}", JOB, cause, value, detail, field)


def job_spec(obj: dict[str, Any]) -> list[Violation]:
    """batch validation.go: validateJobSpec: non-negative counts, completionMode values,
    Indexed needs completions once parallelism is set (both unset default to 1; parallelism <= 100000),
    restartPolicy OnFailure or Never (Never when podFailurePolicy is set), podReplacementPolicy Failed with
    podFailurePolicy."""
    out = []
    for job, base in _job_specs(obj):
        for key in ("parallelism", "completions", "activeDeadlineSeconds", "backoffLimit", "ttlSecondsAfterFinished",
                    "backoffLimitPerIndex", "maxFailedIndexes"):
            n = _int(job.get(key))
            if n is not None and n < 0:
                out.append(_job_rule(f"{base}.{key}", "job-nonnegative", f"{n} must be >= 0", "validateJobSpec",
                                     INVALID, n, "must be greater than or equal to 0", K8S_BATCH))
        mode = job.get("completionMode")
        if mode is not None and mode not in ("NonIndexed", "Indexed"):
            out.append(_job_rule(f"{base}.completionMode", "job-completion-mode",
                                 f"{json.dumps(mode)} is not one of \"NonIndexed\", \"Indexed\"", "validateJobSpec",
                                 NOT_SUPPORTED, mode, 'supported values: "NonIndexed", "Indexed"', K8S_BATCH))
        if mode == "Indexed":
            # SetDefaults_Job sets completions = parallelism = 1 when both are unset, before
            # validation: only parallelism without completions is refused.
            if job.get("completions") is None and job.get("parallelism") is not None:
                out.append(_job_rule(f"{base}.completions", "job-indexed-completions",
                                     "required when completionMode is Indexed", "validateJobSpec", REQUIRED,
                                     detail="when completion mode is Indexed", src=K8S_BATCH))
            par = _int(job.get("parallelism"))
            if par is not None and par > 100000:
                out.append(_job_rule(f"{base}.parallelism", "job-indexed-parallelism",
                                     f"{par} must be <= 100000 for an Indexed Job", "validateJobSpec", INVALID, par,
                                     "must be less than or equal to 100000 when completion mode is Indexed", K8S_BATCH))
        restart = _dict(_dict(job.get("template")).get("spec")).get("restartPolicy")
        rpath = f"{base}.template.spec.restartPolicy"
        if restart in ("Always", "", None):
            out.append(_job_rule(rpath, "job-restart-policy", "a Job's pods need restartPolicy OnFailure or Never",
                                 "validateJobSpec", REQUIRED, detail='valid values: "OnFailure", "Never"',
                                 src=K8S_BATCH))
        elif restart not in ("OnFailure", "Never"):
            out.append(_job_rule(rpath, "job-restart-policy", f"{json.dumps(restart)} is not OnFailure or Never",
                                 "validateJobSpec", NOT_SUPPORTED, restart,
                                 'supported values: "OnFailure", "Never"', K8S_BATCH))
        elif "podFailurePolicy" in job and restart != "Never":
            out.append(_job_rule(rpath, "job-restart-policy", "must be Never when podFailurePolicy is set",
                                 "validateJobSpec", INVALID, restart,
                                 'only "Never" is supported when podFailurePolicy is specified', K8S_BATCH))
        replacement = job.get("podReplacementPolicy")
        if "podFailurePolicy" in job and replacement not in (None, "Failed"):
            out.append(_job_rule(f"{base}.podReplacementPolicy", "job-pod-replacement",
                                 "must be Failed when podFailurePolicy is set", "validatePodReplacementPolicy",
                                 NOT_SUPPORTED, replacement, 'supported values: "Failed"', K8S_BATCH))
    return out


def pod_failure_policy(obj: dict[str, Any]) -> list[Violation]:
    """batch validation.go: validatePodFailurePolicy / validatePodFailurePolicyRule /
    validatePodFailurePolicyRuleOnExitCodes: at most 20 rules; action Count, FailIndex,
    FailJob or Ignore; exactly one of onExitCodes and onPodConditions; operator In or NotIn;
    containerName a container of the pod; 1..255 values, sorted, unique, no 0 with In."""
    out = []
    src = K8S_BATCH
    for job, base in _job_specs(obj):
        if "podFailurePolicy" not in job:
            continue
        pod = _dict(_dict(job.get("template")).get("spec"))
        names = {c.get("name") for c in _containers(pod)}
        rules = _list(_dict(job.get("podFailurePolicy")).get("rules"))
        rpath = f"{base}.podFailurePolicy.rules"
        if len(rules) > 20:
            out.append(_job_rule(rpath, "pfp-rules", f"{len(rules)} rules; at most 20", "validatePodFailurePolicy",
                                 TOO_MANY, len(rules), "must have at most 20 items", src))
        for i, rule in enumerate(rules):
            rule = _dict(rule)
            path = f"{rpath}[{i}]"
            action = rule.get("action")
            if not action:
                out.append(_job_rule(f"{path}.action", "pfp-action", "required", "validatePodFailurePolicyRule",
                                     REQUIRED, detail='valid values: ["Count" "FailIndex" "FailJob" "Ignore"]',
                                     src=src))
            elif action == "FailIndex" and job.get("backoffLimitPerIndex") is None:
                out.append(_job_rule(f"{path}.action", "pfp-action", "FailIndex needs backoffLimitPerIndex",
                                     "validatePodFailurePolicyRule", INVALID, action,
                                     "requires the backoffLimitPerIndex to be set", src))
            elif action not in ("Count", "FailIndex", "FailJob", "Ignore"):
                out.append(_job_rule(f"{path}.action", "pfp-action", f"{json.dumps(action)} is not a valid action",
                                     "validatePodFailurePolicyRule", NOT_SUPPORTED, action,
                                     'supported values: "Count", "FailIndex", "FailJob", "Ignore"', src))
            on_codes, on_conds = rule.get("onExitCodes"), _list(rule.get("onPodConditions"))
            if (on_codes is None) == (not on_conds):
                both = on_codes is not None
                detail = ("specifying both OnExitCodes and OnPodConditions is not supported" if both
                          else "specifying one of OnExitCodes and OnPodConditions is required")
                out.append(_job_rule(path, "pfp-requirement", detail, "validatePodFailurePolicyRule", INVALID,
                                     detail=detail, src=src))
            if isinstance(on_codes, dict):
                out += _on_exit_codes(on_codes, f"{path}.onExitCodes", names)
    return out


def _on_exit_codes(req: dict[str, Any], path: str, container_names: set[Any]) -> list[Violation]:
    func, src, out = "validatePodFailurePolicyRuleOnExitCodes", K8S_BATCH, []
    op = req.get("operator")
    if not op:
        out.append(_job_rule(f"{path}.operator", "pfp-operator", "required", func, REQUIRED,
                             detail='valid values: ["In" "NotIn"]', src=src))
    elif op not in ("In", "NotIn"):
        out.append(_job_rule(f"{path}.operator", "pfp-operator", f"{json.dumps(op)} is not In or NotIn", func,
                             NOT_SUPPORTED, op, 'supported values: "In", "NotIn"', src))
    name = req.get("containerName")
    if name is not None and name not in container_names:
        out.append(_job_rule(f"{path}.containerName", "pfp-container", f"{json.dumps(name)} is not a container of "
                             "the pod", func, INVALID, name,
                             "must be one of the container or initContainer names in the pod template", src))
    values = [v for v in _list(req.get("values"))]
    vpath = f"{path}.values"
    if not values:
        out.append(_job_rule(vpath, "pfp-values", "at least one value is required", func, INVALID, values,
                             "at least one value is required", src))
    elif len(values) > 255:
        out.append(_job_rule(vpath, "pfp-values", f"{len(values)} values; at most 255", func, TOO_MANY, len(values),
                             "must have at most 255 items", src))
    seen: set[Any] = set()
    for j, v in enumerate(values):
        if op == "In" and v == 0:
            out.append(_job_rule(f"{vpath}[{j}]", "pfp-values", "0 is not allowed with operator In", func, INVALID, v,
                                 "must not be 0 for the In operator", src))
        if v in seen:
            out.append(_job_rule(f"{vpath}[{j}]", "pfp-values", f"duplicate exit code {v}", func, DUPLICATE, v, "",
                                 src))
        seen.add(v)
    if any(a > b for a, b in zip(values, values[1:], strict=False) if _int(a) is not None and _int(b) is not None):
        out.append(_job_rule(vpath, "pfp-values", "exit codes must be sorted ascending", func, INVALID, values,
                             "must be ordered", src))
    return out


def containers(obj: dict[str, Any]) -> list[Violation]:
    """core validation.go: validateContainers / validateInitContainers /
    validateContainerCommon: at least one container; names DNS-1123 labels unique across
    containers and initContainers; image required; imagePullPolicy Always, IfNotPresent or
    Never (defaulted when empty)."""
    out = []
    for pod, base in _pod_specs(obj):
        if not _list(pod.get("containers")):
            out.append(_job_rule(f"{base}.containers", "containers", "at least one container is required",
                                 "validateContainers", REQUIRED))
        seen: set[Any] = set()
        for kind in ("containers", "initContainers"):
            for i, ctr in enumerate(_list(pod.get(kind))):
                ctr, path = _dict(ctr), f"{base}.{kind}[{i}]"
                name = ctr.get("name")
                if not name:
                    out.append(_job_rule(f"{path}.name", "container-name", "required", "validateContainerCommon",
                                         REQUIRED))
                else:
                    for m in is_dns1123_label(str(name)):
                        out.append(_job_rule(f"{path}.name", "container-name", f"{json.dumps(name)} {m}",
                                             "validateContainerCommon", INVALID, name, m))
                    if name in seen:
                        out.append(_job_rule(f"{path}.name", "container-name-unique",
                                             f"duplicate container name {json.dumps(name)}", "validateContainers",
                                             DUPLICATE, name))
                    seen.add(name)
                if not ctr.get("image"):
                    out.append(_job_rule(f"{path}.image", "container-image", "required", "validateContainerCommon",
                                         REQUIRED))
                policy = ctr.get("imagePullPolicy")
                if policy and policy not in ("Always", "IfNotPresent", "Never"):
                    out.append(_job_rule(f"{path}.imagePullPolicy", "image-pull-policy",
                                         f"{json.dumps(policy)} is not Always, IfNotPresent or Never",
                                         "validatePullPolicy", NOT_SUPPORTED, policy,
                                         'supported values: "Always", "IfNotPresent", "Never"'))
    return out


def container_restart_policy(obj: dict[str, Any]) -> list[Violation]:
    """core validation.go: validateContainerRestartPolicy, as Kubernetes 1.36 applies it to
    every container (validateContainers, and validateInitContainerRestartPolicy for init
    containers) with ContainerRestartRules (beta, on since 1.35) and
    RestartAllContainersOnContainerExits (beta, on since 1.36) default-on
    (pkg/features/kube_features.go): restartPolicy, when set, Always, Never or OnFailure;
    restartPolicyRules need a restartPolicy, at most 20, each with action Restart or
    RestartAllContainers and exitCodes (operator In or NotIn, at most 255 values)."""
    out, func = [], "validateContainerRestartPolicy"
    policies = ("Always", "Never", "OnFailure")
    for ctr, base, _ in _all_containers(obj):
        policy, rules = ctr.get("restartPolicy"), _list(ctr.get("restartPolicyRules"))
        if policy is None:
            if rules:
                out.append(_job_rule(f"{base}.restartPolicy", "container-restart-policy",
                                     "required with restartPolicyRules", func, REQUIRED,
                                     detail="must specify restartPolicy when restart rules are used"))
        elif policy not in policies:
            out.append(_job_rule(f"{base}.restartPolicy", "container-restart-policy",
                                 f"{json.dumps(policy)} is not Always, Never or OnFailure", func, NOT_SUPPORTED,
                                 policy, 'supported values: "Always", "Never", "OnFailure"'))
        if len(rules) > 20:
            out.append(_job_rule(f"{base}.restartPolicyRules", "container-restart-rules",
                                 f"{len(rules)} rules; at most 20", func, TOO_MANY, len(rules),
                                 "must have at most 20 items"))
        for i, rule in enumerate(rules):
            rule, rpath = _dict(rule), f"{base}.restartPolicyRules[{i}]"
            action = rule.get("action", "")
            if action not in ("Restart", "RestartAllContainers"):
                out.append(_job_rule(f"{rpath}.action", "container-restart-rules",
                                     f"{json.dumps(action)} is not Restart or RestartAllContainers", func,
                                     NOT_SUPPORTED, action, 'supported values: "Restart", "RestartAllContainers"'))
            codes = rule.get("exitCodes")
            if not isinstance(codes, dict):
                out.append(_job_rule(f"{rpath}.exitCodes", "container-restart-rules", "required", func, REQUIRED,
                                     detail="must be specified"))
                continue
            op = codes.get("operator", "")
            if op not in ("In", "NotIn"):
                out.append(_job_rule(f"{rpath}.exitCodes.operator", "container-restart-rules",
                                     f"{json.dumps(op)} is not In or NotIn", func, NOT_SUPPORTED, op,
                                     'supported values: "In", "NotIn"'))
            if len(_list(codes.get("values"))) > 255:
                n = len(codes["values"])
                out.append(_job_rule(f"{rpath}.exitCodes.values", "container-restart-rules", f"{n} values; at most 255",
                                     func, TOO_MANY, n, "must have at most 255 items"))
    return out


def env_vars(obj: dict[str, Any]) -> list[Violation]:
    """core validation.go: ValidateEnv: names required and, with
    RelaxedEnvironmentVariableValidation (GA and locked on since 1.34), printable ASCII
    without '=' (apimachinery validation.go IsRelaxedEnvVarName); validateEnvVarValueFrom: value
    and valueFrom exclusive, exactly one source, fieldRef paths the Downward API supports
    (validateObjectFieldSelector: metadata.labels/annotations subscripts must be qualified names)."""
    out = []
    for ctr, base, _ in _all_containers(obj):
        for j, env in enumerate(_list(ctr.get("env"))):
            env, path = _dict(env), f"{base}.env[{j}]"
            name = env.get("name")
            if not name:
                out.append(_job_rule(f"{path}.name", "env-name", "required", "ValidateEnv", REQUIRED))
            else:
                if any(not " " <= ch <= "~" or ch == "=" for ch in str(name)):
                    m = ("a valid environment variable name must consist only of printable ASCII characters "
                         "other than '='")
                    out.append(_job_rule(f"{path}.name", "env-name", f"{json.dumps(name)} {m}", "ValidateEnv",
                                         INVALID, name, m))
            vf = env.get("valueFrom")
            if vf is None:
                continue
            vf = _dict(vf)
            sources = [k for k in ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef") if k in vf]
            vpath = f"{path}.valueFrom"
            if not sources:
                out.append(_job_rule(vpath, "env-value-from", "must specify one of fieldRef, resourceFieldRef, "
                                     "configMapKeyRef or secretKeyRef", "validateEnvVarValueFrom", INVALID, "",
                                     "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or "
                                     "`secretKeyRef`"))
            elif env.get("value"):
                out.append(_job_rule(vpath, "env-value-from", "valueFrom may not be set with a non-empty value",
                                     "validateEnvVarValueFrom", INVALID, "", "may not be specified when `value` is "
                                     "not empty"))
            elif len(sources) > 1:
                out.append(_job_rule(vpath, "env-value-from", "only one source may be set", "validateEnvVarValueFrom",
                                     INVALID, "", "may not have more than one field specified at a time"))
            if "fieldRef" in vf:
                out += _field_ref(_dict(vf["fieldRef"]), f"{vpath}.fieldRef")
    return out


_DOWNWARD_FIELDS = ("metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
                    "spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs")


def _field_ref(ref: dict[str, Any], path: str) -> list[Violation]:
    """validation.go: validateObjectFieldSelector (apiVersion is defaulted to v1)."""
    fp = str(ref.get("fieldPath", ""))
    func = "validateObjectFieldSelector"
    if not fp:
        return [_job_rule(f"{path}.fieldPath", "env-field-ref", "required", func, REQUIRED)]
    m = re.fullmatch(r"(metadata\.(?:labels|annotations))\['(.*)'\]", fp)
    if m:
        key = m[2].lower() if m[1].endswith("annotations") else m[2]
        return [_job_rule(path, "env-field-ref", f"{json.dumps(fp)}: key {msg}", func, INVALID, key, msg)
                for msg in is_qualified_name(key)]
    if fp not in _DOWNWARD_FIELDS:
        supported = ", ".join(json.dumps(f) for f in sorted(_DOWNWARD_FIELDS))
        return [_job_rule(f"{path}.fieldPath", "env-field-ref", f"{json.dumps(fp)} is not a Downward API field",
                          func, NOT_SUPPORTED, fp, f"supported values: {supported}")]
    return []


def container_ports(obj: dict[str, Any]) -> list[Violation]:
    """core validation.go: validateContainerPorts: names IANA_SVC_NAME (IsValidPortName) and
    unique per container; containerPort required, 1..65535; hostPort 1..65535 when set;
    protocol TCP, UDP or SCTP (defaulted TCP by the CRD schema)."""
    out, func = [], "validateContainerPorts"
    for ctr, base, _ in _all_containers(obj):
        names: set[str] = set()
        for j, port in enumerate(_list(ctr.get("ports"))):
            port, path = _dict(port), f"{base}.ports[{j}]"
            name = port.get("name")
            if name:
                msgs = is_valid_port_name(str(name))
                for m in msgs:
                    out.append(_job_rule(f"{path}.name", "port-name", f"{json.dumps(name)} {m}", func, INVALID,
                                         name, m))
                if not msgs and name in names:
                    out.append(_job_rule(f"{path}.name", "port-name-unique", f"duplicate port name {json.dumps(name)}",
                                         func, DUPLICATE, name))
                names.add(str(name))
            cp = port.get("containerPort")
            if not cp:
                out.append(_job_rule(f"{path}.containerPort", "port-number", "required", func, REQUIRED))
            else:
                for m in is_valid_port_num(cp):
                    out.append(_job_rule(f"{path}.containerPort", "port-number", f"{cp} {m}", func, INVALID, cp, m))
            hp = port.get("hostPort")
            if hp:
                for m in is_valid_port_num(hp):
                    out.append(_job_rule(f"{path}.hostPort", "port-number", f"{hp} {m}", func, INVALID, hp, m))
            proto = port.get("protocol", "TCP")
            if proto not in ("TCP", "UDP", "SCTP"):
                out.append(_job_rule(f"{path}.protocol", "port-protocol",
                                     f"{json.dumps(proto)} is not TCP, UDP or SCTP", func, NOT_SUPPORTED, proto,
                                     'supported values: "SCTP", "TCP", "UDP"'))
    return out


def host_network_ports(obj: dict[str, Any]) -> list[Violation]:
    """core validation.go: validatePodHostNetworkDeps: with hostNetwork, a template's hostPort
    must be unset or equal containerPort. (core/v1 defaults.go SetDefaults_Pod then sets
    hostPort = containerPort on the pods, so both end up equal.)"""
    out = []
    for pod, base in _pod_specs(obj):
        if not pod.get("hostNetwork"):
            continue
        for i, ctr in enumerate(_list(pod.get("containers"))):
            for j, port in enumerate(_list(_dict(ctr).get("ports"))):
                hp, cp = _dict(port).get("hostPort"), _dict(port).get("containerPort")
                if hp and hp != cp:
                    out.append(_job_rule(f"{base}.containers[{i}].ports[{j}].hostPort", "host-network-port",
                                         f"{hp} must equal containerPort {cp} with hostNetwork",
                                         "validatePodHostNetworkDeps", INVALID, hp,
                                         "must match `containerPort` when `hostNetwork` is true"))
    return out


def volumes(obj: dict[str, Any]) -> list[Violation]:
    """core validation.go: ValidateVolumes: names required, DNS-1123 labels, unique;
    validateVolumeSource: at most one volume type (none is defaulted to an emptyDir by
    core/v1 defaults.go SetDefaults_Volume: see ``default``)."""
    out = []
    for pod, base in _pod_specs(obj):
        seen: set[Any] = set()
        for i, vol in enumerate(_list(pod.get("volumes"))):
            vol, path = _dict(vol), f"{base}.volumes[{i}]"
            name = vol.get("name")
            if not name:
                out.append(_job_rule(f"{path}.name", "volume-name", "required", "ValidateVolumes", REQUIRED))
            else:
                for m in is_dns1123_label(str(name)):
                    out.append(_job_rule(f"{path}.name", "volume-name", f"{json.dumps(name)} {m}", "ValidateVolumes",
                                         INVALID, name, m))
                if name in seen:
                    out.append(_job_rule(f"{path}.name", "volume-name-unique", f"duplicate volume {json.dumps(name)}",
                                         "ValidateVolumes", DUPLICATE, name))
                seen.add(name)
            sources = [k for k, v in vol.items() if k != "name" and v is not None]
            if len(sources) > 1:
                out.append(_job_rule(f"{path}.{sources[1]}", "volume-source", "may not specify more than 1 volume type",
                                     "validateVolumeSource", FORBIDDEN,
                                     detail="may not specify more than 1 volume type"))
    return out


def volume_mounts(obj: dict[str, Any]) -> list[Violation]:
    """core validation.go: ValidateVolumeMounts: name required and a volume of the pod
    (NotFound otherwise); mountPath required and unique within the container."""
    out, func = [], "ValidateVolumeMounts"
    for ctr, base, pod in _all_containers(obj):
        vols = {_dict(v).get("name") for v in _list(pod.get("volumes"))}
        paths: set[Any] = set()
        for j, mnt in enumerate(_list(ctr.get("volumeMounts"))):
            mnt, path = _dict(mnt), f"{base}.volumeMounts[{j}]"
            name, mount = mnt.get("name"), mnt.get("mountPath")
            if not name:
                out.append(_job_rule(f"{path}.name", "volume-mount", "required", func, REQUIRED))
            if name not in vols:
                out.append(_job_rule(f"{path}.name", "volume-mount", f"no volume named {json.dumps(name)} in the pod",
                                     func, NOT_FOUND, name))
            if not mount:
                out.append(_job_rule(f"{path}.mountPath", "volume-mount-path", "required", func, REQUIRED))
            elif mount in paths:
                out.append(_job_rule(f"{path}.mountPath", "volume-mount-path", f"{json.dumps(mount)} is mounted twice",
                                     func, INVALID, mount, "must be unique"))
            paths.add(mount)
    return out


_STANDARD_CONTAINER_RESOURCES = ("cpu", "memory", "ephemeral-storage")
# core helper helpers.go: standardResources (IsStandardResourceName, hugepages-* aside).
_STANDARD_RESOURCES = _STANDARD_CONTAINER_RESOURCES + tuple(
    f"{p}.{r}" for p in ("requests", "limits") for r in _STANDARD_CONTAINER_RESOURCES) + (
    "pods", "services", "replicationcontrollers", "resourcequotas", "secrets", "persistentvolumeclaims",
    "requests.storage", "configmaps", "services.nodeports", "services.loadbalancers")


def _is_native(name: str) -> bool:
    """core helper helpers.go: IsNativeResource (no domain, or a kubernetes.io domain)."""
    return "/" not in name or "kubernetes.io/" in name


def _resource_name(name: str, path: str) -> list[Violation]:
    """validation.go: validateResourceName (a qualified name; unprefixed ones standard) then
    validateContainerResourceName (unprefixed: cpu, memory, ephemeral-storage, hugepages-*;
    prefixed non-native: an extended resource name, helpers.go IsExtendedResourceName)."""
    out = [_job_rule(path, "resource-name", f"{json.dumps(name)} {m}", "validateResourceName", INVALID, name, m)
           for m in is_qualified_name(name)]
    hugepages = name.startswith("hugepages-")
    if not out and "/" not in name and name not in _STANDARD_RESOURCES and not hugepages:
        out.append(_job_rule(path, "resource-name", f"{json.dumps(name)} is not a standard resource",
                             "validateResourceName", INVALID, name,
                             "must be a standard resource type or fully qualified"))
    if "/" not in name:
        if name not in _STANDARD_CONTAINER_RESOURCES and not hugepages:
            out.append(_job_rule(path, "container-resource-name", f"{json.dumps(name)} is not a resource containers "
                                 "request", "validateContainerResourceName", INVALID, name,
                                 "must be a standard resource for containers"))
    elif not _is_native(name) and (name.startswith("requests.") or is_qualified_name("requests." + name)):
        out.append(_job_rule(path, "container-resource-name", f"{json.dumps(name)} is not an extended resource name",
                             "validateContainerResourceName", INVALID, name,
                             "doesn't follow extended resource name standard"))
    return out


def resources(obj: dict[str, Any]) -> list[Violation]:
    """core validation.go: ValidateResourceRequirements / validateContainerResourceName /
    ValidateResourceQuantityValue: names standard (cpu, memory, ephemeral-storage,
    hugepages-*) or extended (domain-qualified); quantities non-negative; extended resources
    (google.com/tpu, nvidia.com/gpu) whole numbers with requests == limits (not
    overcommitable, helpers.go IsOvercommitAllowed); other requests <= limits."""
    out, func = [], "ValidateResourceRequirements"
    for ctr, base, _ in _all_containers(obj):
        res = _dict(ctr.get("resources"))
        limits, requests = _dict(res.get("limits")), _dict(res.get("requests"))
        for kind, table in (("limits", limits), ("requests", requests)):
            for name, value in table.items():
                path = f"{base}.resources.{kind}[{name}]"
                out += _resource_name(str(name), path)
                q = parse_quantity(value)
                if q is None:
                    continue  # resource_quantity_format reports it
                if q < 0:
                    out.append(_job_rule(path, "resource-quantity", f"{value} must not be negative",
                                         "ValidateResourceQuantityValue", INVALID, str(value),
                                         "must be greater than or equal to 0"))
                if not _is_native(name) and q != q.to_integral_value():
                    out.append(_job_rule(path, "resource-integer", f"{json.dumps(value)}: extended resources are whole "
                                         "numbers", "ValidateResourceQuantityValue", INVALID, str(value),
                                         "must be an integer"))
        for name, value in requests.items():
            q = parse_quantity(value)
            if q is None:
                continue
            req_path = f"{base}.resources.requests"
            overcommit = _is_native(str(name)) and not str(name).startswith("hugepages-")
            if name in limits:
                limit = parse_quantity(limits[name])
                if limit is None:
                    continue
                if q != limit and not overcommit:
                    out.append(_job_rule(f"{req_path}[{name}]", "resource-request-equals-limit",
                                         f"{value} must equal the {name} limit {limits[name]}", func, INVALID,
                                         str(value), f"must be equal to {name} limit of {limits[name]}",
                                         field=req_path))
                elif q > limit:
                    out.append(_job_rule(f"{req_path}[{name}]", "resource-request-above-limit",
                                         f"{value} must be <= the {name} limit {limits[name]}", func, INVALID,
                                         str(value), f"must be less than or equal to {name} limit of {limits[name]}",
                                         field=req_path))
            elif not overcommit:
                out.append(_job_rule(f"{base}.resources.limits[{name}]", "resource-request-equals-limit",
                                     f"a limit must be set for {name} (not overcommitable)", func, REQUIRED,
                                     detail="Limit must be set for non overcommitable resources",
                                     field=f"{base}.resources.limits"))
    return out


def tolerations(obj: dict[str, Any]) -> list[Violation]:
    """core validation.go: ValidateTolerations: key a qualified name; empty key needs operator
    Exists; operator Equal (or empty) needs a label value, Exists no value; effect NoSchedule,
    PreferNoSchedule or NoExecute; tolerationSeconds only with NoExecute."""
    out, func = [], "ValidateTolerations"
    for pod, base in _pod_specs(obj):
        for i, tol in enumerate(_list(pod.get("tolerations"))):
            tol, path = _dict(tol), f"{base}.tolerations[{i}]"
            key, op = tol.get("key", ""), tol.get("operator", "")
            value, effect = tol.get("value", ""), tol.get("effect", "")
            for m in is_qualified_name(str(key)) if key else []:
                out.append(_job_rule(f"{path}.key", "toleration-key", f"{json.dumps(key)} {m}", func, INVALID, key, m))
            if not key and op != "Exists":
                out.append(_job_rule(f"{path}.operator", "toleration-operator", "must be Exists when key is empty",
                                     func, INVALID, op,
                                     "operator must be Exists when `key` is empty, which means \"match all "
                                     "values and all keys\""))
            if "tolerationSeconds" in tol and effect != "NoExecute":
                out.append(_job_rule(f"{path}.effect", "toleration-effect", "must be NoExecute with tolerationSeconds",
                                     func, INVALID, effect,
                                     "effect must be 'NoExecute' when `tolerationSeconds` is set"))
            if op in ("Equal", ""):
                for m in is_valid_label_value(str(value)):
                    out.append(_job_rule(f"{path}.operator", "toleration-value", f"value {json.dumps(value)} {m}", func,
                                         INVALID, value, m))
            elif op == "Exists":
                if value:
                    out.append(_job_rule(f"{path}.operator", "toleration-value",
                                         f"value {json.dumps(value)} must be empty with operator Exists", func, INVALID,
                                         tol, "value must be empty when `operator` is 'Exists'"))
            else:
                out.append(_job_rule(f"{path}.operator", "toleration-operator",
                                     f"{json.dumps(op)} is not Equal or Exists", func, NOT_SUPPORTED, op,
                                     'supported values: "Equal", "Exists"'))
            if effect and effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
                out.append(_job_rule(f"{path}.effect", "toleration-effect",
                                     f"{json.dumps(effect)} is not NoSchedule, PreferNoSchedule or NoExecute",
                                     "validateTaintEffect", NOT_SUPPORTED, effect,
                                     'supported values: "NoSchedule", "PreferNoSchedule", "NoExecute"'))
    return out


def node_selector(obj: dict[str, Any]) -> list[Violation]:
    """core validation.go: ValidatePodSpec validates nodeSelector with ValidateLabels
    (meta/v1/validation/validation.go): keys qualified names, values label values."""
    out = []
    for pod, base in _pod_specs(obj):
        path = f"{base}.nodeSelector"
        for key, value in _dict(pod.get("nodeSelector")).items():
            for m in is_qualified_name(str(key)):
                out.append(_job_rule(f"{path}[{key}]", "node-selector", f"key {json.dumps(key)} {m}", "ValidatePodSpec",
                                     INVALID, key, m, field=path))
            for m in is_valid_label_value(str(value)):
                out.append(_job_rule(f"{path}[{key}]", "node-selector", f"{json.dumps(value)} {m}", "ValidatePodSpec",
                                     INVALID, value, m, field=path))
    return out


def pod_spec_fields(obj: dict[str, Any]) -> list[Violation]:
    """core validation.go: ValidatePodSpec: serviceAccountName (ValidateServiceAccountName)
    and priorityClassName (ValidatePriorityClassName) are DNS-1123 subdomains; dnsPolicy
    one of ClusterFirstWithHostNet, ClusterFirst, Default, None (validateDNSPolicy; empty is
    defaulted); restartPolicy Always, OnFailure or Never (validateRestartPolicy)."""
    out = []
    for pod, base in _pod_specs(obj):
        for key, rule, func in (("serviceAccountName", "service-account-name", "ValidateServiceAccountName"),
                                ("priorityClassName", "priority-class-name", "ValidatePriorityClassName")):
            value = pod.get(key)
            for m in is_dns1123_subdomain(str(value)) if value else []:
                out.append(_job_rule(f"{base}.{key}", rule, f"{json.dumps(value)} {m}", func, INVALID, value, m))
        dns = pod.get("dnsPolicy")
        allowed = ("ClusterFirstWithHostNet", "ClusterFirst", "Default", "None")
        if dns and dns not in allowed:
            out.append(_job_rule(f"{base}.dnsPolicy", "dns-policy",
                                 f"{json.dumps(dns)} is not one of {', '.join(allowed)}",
                                 "validateDNSPolicy", NOT_SUPPORTED, dns,
                                 "supported values: " + ", ".join(json.dumps(a) for a in allowed)))
    return out


def scheduling_gates(obj: dict[str, Any]) -> list[Violation]:
    """core validation.go: ValidatePodSpec -> validateSchedulingGates: each gate's name a
    qualified name (ValidateQualifiedName: at most 63 characters after an optional DNS
    subdomain prefix and '/'), no name twice. Checked on the Job's pod template, so a JobSet
    with a bad gate is admitted and every Job creation then fails (JobCreationFailed)."""
    out, func = [], "validateSchedulingGates"
    for pod, base in _pod_specs(obj):
        seen: set[str] = set()
        for i, gate in enumerate(_list(pod.get("schedulingGates"))):
            name, path = str(_dict(gate).get("name", "")), f"{base}.schedulingGates[{i}]"
            for m in is_qualified_name(name):
                out.append(_job_rule(path, "scheduling-gate-name", f"{json.dumps(name)} {m}", func, INVALID, name, m))
            if name in seen:
                out.append(_job_rule(path, "scheduling-gate-name", f"{json.dumps(name)} is given twice", func,
                                     DUPLICATE, name))
            seen.add(name)
    return out
