"""kube-apiserver on the JobSet itself: object metadata and the JobSet CRD's OpenAPI schema
(enums, minimums, list-map keys, CEL rules), and the mutating webhook's decode failures."""

from __future__ import annotations

import json
import re
from typing import Any

from manifests.admission.base import (
    APISERVER,
    DUPLICATE,
    INTERNAL,
    INVALID,
    JS_TYPES,
    K8S_LABELS,
    K8S_META,
    MUTATING,
    NOT_SUPPORTED,
    REQUIRED,
    TOO_LONG,
    GoLiteral,
    Violation,
    _all_containers,
    _dict,
    _int,
    _list,
    _metas,
    _rjobs,
)
from manifests.k8s_names import (
    is_dns1123_subdomain,
    is_qualified_name,
    is_valid_label_value,
    parse_quantity,
)

# --------------------------------------------------------------------------------------
# apiserver on the JobSet: metadata and the CRD schema


def jobset_name(obj: dict[str, Any]) -> list[Violation]:
    """objectmeta.go: ValidateObjectMetaAccessor with NameIsDNSSubdomain, which
    apiextensions-apiserver uses for every custom resource's metadata.name."""
    name = _dict(obj.get("metadata")).get("name")
    src = f"{K8S_META}:ValidateObjectMetaAccessor"
    if not name:
        return [Violation("metadata.name", "object-name", "required (name or generateName)", src,
                          APISERVER, REQUIRED, detail="name or generateName is required")]
    return [Violation("metadata.name", "object-name", f"{json.dumps(name)} {m}", src, APISERVER, INVALID, name, m)
            for m in is_dns1123_subdomain(str(name))]


def labels(obj: dict[str, Any]) -> list[Violation]:
    """meta/v1/validation/validation.go: ValidateLabels (keys are qualified names, values
    label values of at most 63 characters), on the JobSet and on both templates' metadata."""
    out = []
    src = f"{K8S_LABELS}:ValidateLabels"
    for meta, base, layer in _metas(obj):
        for key, value in _dict(meta.get("labels")).items():
            path = f"{base}.labels[{key}]"
            for m in is_qualified_name(str(key)):
                out.append(Violation(path, "label-key", f"key {json.dumps(key)} {m}", src, layer, INVALID,
                                     key, m, f"{base}.labels"))
            if not isinstance(value, str):
                out.append(Violation(path, "label-value", "must be a string", src, layer, INVALID, value,
                                     "must be a string", f"{base}.labels"))
                continue
            for m in is_valid_label_value(value):
                out.append(Violation(path, "label-value", f"{json.dumps(value)} {m}", src, layer, INVALID,
                                     value, m, f"{base}.labels"))
    return out


def annotation_keys(obj: dict[str, Any]) -> list[Violation]:
    """objectmeta.go: ValidateAnnotations (keys are qualified names, case-insensitively;
    keys and values together at most 256 KiB)."""
    out = []
    src = f"{K8S_META}:ValidateAnnotations"
    for meta, base, layer in _metas(obj):
        notes = _dict(meta.get("annotations"))
        for key in notes:
            for m in is_qualified_name(str(key).lower()):
                out.append(Violation(f"{base}.annotations[{key}]", "annotation-key", f"key {json.dumps(key)} {m}",
                                     src, layer, INVALID, key, m, f"{base}.annotations"))
        size = sum(len(str(k)) + len(str(v)) for k, v in notes.items())
        if size > 256 * 1024:
            out.append(Violation(f"{base}.annotations", "annotation-size",
                                 f"{size} bytes; at most 262144 in all", src, layer, TOO_LONG,
                                 detail="may not be more than 262144 bytes"))
    return out


def _enum(value: Any, allowed: tuple[str, ...], path: str, rule: str, src: str) -> list[Violation]:
    if value is None or value in allowed:
        return []
    supported = ", ".join(json.dumps(a) for a in allowed)
    return [Violation(path, rule, f"{json.dumps(value)} is not one of {supported}", src, APISERVER,
                      NOT_SUPPORTED, value, f"supported values: {supported}")]


def schema_enums(obj: dict[str, Any]) -> list[Violation]:
    """jobset_types.go ``+kubebuilder:validation:Enum`` markers, enforced by the CRD schema:
    successPolicy.operator, startupPolicy.startupPolicyOrder, failurePolicy.restartStrategy,
    failure rule actions, dependsOn status. The four without a default are Go fields without
    ``omitempty`` (``json:"operator"``, ``json:"startupPolicyOrder"``, ``json:"action"``,
    ``json:"status"``; the CRD's ``required:`` lists them): the mutating webhook decodes the
    JobSet and patches it back, so an absent one reaches the schema as "" and the enum
    refuses it."""
    spec = _dict(obj.get("spec"))
    out = []
    if isinstance(spec.get("successPolicy"), dict):
        out += _enum(spec["successPolicy"].get("operator", ""), ("All", "Any"),
                     "spec.successPolicy.operator", "success-policy-operator", f"{JS_TYPES}:SuccessPolicy")
    if isinstance(spec.get("startupPolicy"), dict):
        out += _enum(spec["startupPolicy"].get("startupPolicyOrder", ""), ("AnyOrder", "InOrder"),
                     "spec.startupPolicy.startupPolicyOrder", "startup-policy-order", f"{JS_TYPES}:StartupPolicy")
    fp = _dict(spec.get("failurePolicy"))
    out += _enum(fp.get("restartStrategy"), ("Recreate", "BlockingRecreate", "InPlaceRestart"),
                 "spec.failurePolicy.restartStrategy", "restart-strategy", f"{JS_TYPES}:JobSetRestartStrategy")
    actions = ("FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts", "RestartJob",
               "RestartJobAndIgnoreMaxRestarts")
    for i, rule in enumerate(_list(fp.get("rules"))):
        out += _enum(_dict(rule).get("action", ""), actions, f"spec.failurePolicy.rules[{i}].action",
                     "failure-rule-action", f"{JS_TYPES}:FailurePolicyRule")
    for _, rj, base in _rjobs(obj):
        for j, dep in enumerate(_list(rj.get("dependsOn"))):
            out += _enum(_dict(dep).get("status", ""), ("Ready", "Complete"), f"{base}.dependsOn[{j}].status",
                         "depends-on-status", f"{JS_TYPES}:DependsOn")
    return out


def replicated_job_names_unique(obj: dict[str, Any]) -> list[Violation]:
    """jobset_types.go: ReplicatedJobs is ``+listType=map +listMapKey=name``; the apiserver
    refuses a second entry with the same name (structural list-map validation)."""
    seen: set[Any] = set()
    out = []
    for _, rj, base in _rjobs(obj):
        name = rj.get("name")
        if not name:
            out.append(Violation(f"{base}.name", "replicated-job-name", "required", f"{JS_TYPES}:ReplicatedJob",
                                 APISERVER, REQUIRED))
        elif name in seen:
            out.append(Violation(base, "replicated-job-unique", f"duplicate replicatedJob name {json.dumps(name)}",
                                 f"{JS_TYPES}:JobSetSpec", APISERVER, DUPLICATE,
                                 GoLiteral(f'map[string]interface {{}}{{"name":{json.dumps(name)}}}')))
        seen.add(name)
    return out


def schema_minimums(obj: dict[str, Any]) -> list[Violation]:
    """jobset_types.go ``+kubebuilder:validation:Minimum=0`` on ttlSecondsAfterFinished."""
    ttl = _int(_dict(obj.get("spec")).get("ttlSecondsAfterFinished"))
    if ttl is not None and ttl < 0:
        return [Violation("spec.ttlSecondsAfterFinished", "ttl-minimum", f"{ttl} must be >= 0",
                          f"{JS_TYPES}:JobSetSpec", APISERVER, INVALID, ttl,
                          "spec.ttlSecondsAfterFinished in body should be greater than or equal to 0")]
    return []


def startup_policy_excludes_depends_on(obj: dict[str, Any]) -> list[Violation]:
    """jobset_types.go JobSetSpec ``XValidation``: startupPolicy InOrder and dependsOn are
    mutually exclusive (a CEL rule the apiserver evaluates)."""
    spec = _dict(obj.get("spec"))
    in_order = _dict(spec.get("startupPolicy")).get("startupPolicyOrder") == "InOrder"
    if in_order and any("dependsOn" in rj for _, rj, _ in _rjobs(obj)):
        msg = "StartupPolicy and DependsOn APIs are mutually exclusive"
        # apiextensions reports a failed CEL rule as Invalid with the schema type as the value.
        return [Violation("spec", "startup-policy-depends-on", msg, f"{JS_TYPES}:JobSetSpec", APISERVER,
                          INVALID, "object", msg)]
    return []


# apimachinery pkg/api/resource/quantity.go: splitREString, and the errors ParseQuantity returns.
_QUANTITY_SPLIT = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
_QUANTITY_SUFFIX = r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][-+]?[0-9]+)?"


def _quantity_error(value: Any) -> str:
    """The error resource.Quantity's UnmarshalJSON returns for a value ParseQuantity refuses:
    ErrFormatWrong when it is not number-then-suffix, ErrSuffix for an unknown suffix,
    ErrNumeric otherwise."""
    m = re.fullmatch(_QUANTITY_SPLIT, str(value))
    if not m:
        return f"quantities must match the regular expression '{_QUANTITY_SPLIT}'"
    if not re.fullmatch(_QUANTITY_SUFFIX, m[2]):
        return "unable to parse quantity's suffix"
    return "unable to parse numeric part of quantity"


def resource_quantity_format(obj: dict[str, Any]) -> list[Violation]:
    """apimachinery quantity.go: ParseQuantity, through Quantity.UnmarshalJSON when JobSet's
    mutating webhook (mjobset.kb.io) decodes the JobSet: a requests/limits value that is no
    quantity fails the decode, and the webhook's answer is that error alone (no field), before
    the CRD schema's Quantity pattern is reached."""
    out = []
    for ctr, base, _ in _all_containers(obj):
        res = _dict(ctr.get("resources"))
        for kind in ("requests", "limits"):
            for name, value in _dict(res.get(kind)).items():
                if parse_quantity(value) is None:
                    path = f"{base}.resources.{kind}[{name}]"
                    out.append(Violation(path, "quantity-format", f"{json.dumps(value)} is not a resource quantity",
                                         "kubernetes/apimachinery pkg/api/resource/quantity.go:ParseQuantity",
                                         MUTATING, INTERNAL, value, _quantity_error(value), "<nil>"))
    return out


# The int32 fields of the JobSet and of the Job and pod templates it embeds, by JSON path
# without list indices, with the Go struct that holds each (jobset_types.go; k8s.io/api
# batch/v1 and core/v1 types.go). Paths relative to a Job spec / pod spec / container are
# joined below.
_JOBSET_INT32 = {"spec.ttlSecondsAfterFinished": "JobSetSpec", "spec.failurePolicy.maxRestarts": "FailurePolicy",
                 "spec.replicatedJobs.replicas": "ReplicatedJob"}
_JOB_INT32 = {"parallelism": "JobSpec", "completions": "JobSpec", "backoffLimit": "JobSpec",
              "backoffLimitPerIndex": "JobSpec", "maxFailedIndexes": "JobSpec", "ttlSecondsAfterFinished": "JobSpec",
              "podFailurePolicy.rules.onExitCodes.values": "PodFailurePolicyOnExitCodesRequirement",
              "successPolicy.rules.succeededCount": "SuccessPolicyRule"}
_POD_INT32 = {"priority": "PodSpec",
              "topologySpreadConstraints.maxSkew": "TopologySpreadConstraint",
              "topologySpreadConstraints.minDomains": "TopologySpreadConstraint",
              "volumes.secret.defaultMode": "SecretVolumeSource", "volumes.secret.items.mode": "KeyToPath",
              "volumes.configMap.defaultMode": "ConfigMapVolumeSource", "volumes.configMap.items.mode": "KeyToPath",
              "volumes.projected.defaultMode": "ProjectedVolumeSource",
              "volumes.downwardAPI.defaultMode": "DownwardAPIVolumeSource",
              "volumes.downwardAPI.items.mode": "DownwardAPIVolumeFile"}
_CONTAINER_INT32 = {"ports.containerPort": "ContainerPort", "ports.hostPort": "ContainerPort",
                    "restartPolicyRules.exitCodes.values": "ContainerRestartRuleOnExitCodes",
                    **{f"{probe}.{key}": "Probe" for probe in ("livenessProbe", "readinessProbe", "startupProbe")
                       for key in ("initialDelaySeconds", "timeoutSeconds", "periodSeconds", "successThreshold",
                                   "failureThreshold")}}
_POD_PATH = "spec.replicatedJobs.template.spec.template.spec"
_INT32_FIELDS = {**_JOBSET_INT32, **{f"spec.replicatedJobs.template.spec.{k}": v for k, v in _JOB_INT32.items()},
                 **{f"{_POD_PATH}.{k}": v for k, v in _POD_INT32.items()},
                 **{f"{_POD_PATH}.{kind}.{k}": v for kind in ("containers", "initContainers")
                    for k, v in _CONTAINER_INT32.items()}}


_CR_DEFAULTER = "kubernetes-sigs/controller-runtime pkg/webhook/admission/defaulter_custom.go:Handle"


def int32_fields(obj: dict[str, Any]) -> list[Violation]:
    """encoding/json (Go's decode.go: UnmarshalTypeError) when JobSet's mutating webhook
    (mjobset.kb.io; controller-runtime defaulter_custom.go Handle, which answers a decode
    error with Errored(400)) decodes the JobSet into jobset_types.go: a number outside an int32
    field's range fails the decode, and the webhook answers that error alone (``json: cannot
    unmarshal number N into Go struct field
    <Struct>.<json path> of type int32``), before any schema or validating rule."""
    out = []

    def walk(value: Any, dotted: str, path: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{dotted}.{k}" if dotted else str(k), f"{path}.{k}" if path else str(k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, dotted, f"{path}[{i}]")
        elif dotted in _INT32_FIELDS and _int(value) is not None and not -2**31 <= value < 2**31:
            text = (f"json: cannot unmarshal number {value} into Go struct field "
                    f"{_INT32_FIELDS[dotted]}.{dotted} of type int32")
            out.append(Violation(path, "int32-range", f"{value} does not fit an int32", _CR_DEFAULTER,
                                 MUTATING, INTERNAL, value, text, "<nil>"))

    walk(obj, "", "")
    return out
