"""kube-apiserver on the JobSet itself: object metadata and the JobSet CRD's OpenAPI schema
(enums, minimums, list-map keys, CEL rules), and the mutating webhook's decode failures.

The CRD's rules are data in ``crd_rules`` (generated from the upstream CRD by
``gen_crd_rules``); the functions here walk the JobSet and word each refusal as the API
server does. Object metadata and the Go decoding stay hand-written: they are no part of the
CRD."""

from __future__ import annotations

import json
import re
from typing import Any

from manifests.admission import crd_rules as crd
from manifests.admission.base import (
    APISERVER,
    DUPLICATE,
    INTERNAL,
    INVALID,
    K8S_LABELS,
    K8S_META,
    MUTATING,
    NOT_SUPPORTED,
    REQUIRED,
    TOO_LONG,
    TOO_MANY,
    GoLiteral,
    Violation,
    _all_containers,
    _dict,
    _int,
    _list,
    _metas,
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


# --------------------------------------------------------------------------------------
# The CRD's own rules, read from manifests.admission.crd_rules (generated from the upstream
# CRD; gen_crd_rules.py). Each refusal is worded as apiextensions-apiserver words it.

CRD_FILE = f"{crd.SOURCE}"
# Stable ids of the CRD rules tests and reports name; any other is "crd-<keyword>".
_RULE_IDS = {
    ("enum", "spec.successPolicy.operator"): "success-policy-operator",
    ("enum", "spec.startupPolicy.startupPolicyOrder"): "startup-policy-order",
    ("enum", "spec.failurePolicy.restartStrategy"): "restart-strategy",
    ("enum", "spec.failurePolicy.rules[].action"): "failure-rule-action",
    ("enum", "spec.replicatedJobs[].dependsOn[].status"): "depends-on-status",
    ("minimum", "spec.ttlSecondsAfterFinished"): "ttl-minimum",
    ("required", "spec.replicatedJobs"): "replicated-job-name",
    ("unique", "spec.replicatedJobs"): "replicated-job-unique",
    ("cel", "StartupPolicy and DependsOn APIs are mutually exclusive"): "startup-policy-depends-on",
}


def _rule_id(keyword: str, path: str) -> str:
    return _RULE_IDS.get((keyword, path), f"crd-{keyword}")


def _src(keyword: str) -> str:
    return f"{CRD_FILE}:{keyword}"


def _at(obj: Any, path: str) -> list[tuple[Any, str]]:
    """(value, its path) of every value at a schema path (``[]``: each item of a list)."""
    found: list[tuple[Any, str]] = [(obj, "")]
    for token in path.split("."):
        name, each = token.removesuffix("[]"), token.endswith("[]")
        step: list[tuple[Any, str]] = []
        for node, where in found:
            value = _dict(node).get(name)
            at = f"{where}.{name}" if where else name
            if each:
                step += [(item, f"{at}[{i}]") for i, item in enumerate(_list(value))]
            elif value is not None:
                step.append((value, at))
        found = step
    return found


def _fields(obj: dict[str, Any], table: dict[str, Any]) -> list[tuple[Any, str, Any, str, str]]:
    """(value, path, the table's entry, the schema path, the field's name) of each field
    ``table`` names that is set; an absent required field of the parent as "" (below)."""
    out = []
    for schema_path, entry in table.items():
        parent_path, _, name = schema_path.rpartition(".")
        for parent, where in _at(obj, parent_path):
            if not isinstance(parent, dict):
                continue
            value = parent.get(name)
            if value is None and name in crd.REQUIRED.get(parent_path, ()):
                # A required Go field without omitempty (``json:"operator"``): the mutating
                # webhook decodes the JobSet into Go types and patches it back, so an absent
                # one reaches the schema as its zero value "", which the enum refuses.
                value = ""
            if value is not None:
                out.append((value, f"{where}.{name}", entry, schema_path, name))
    return out


def schema_enums(obj: dict[str, Any]) -> list[Violation]:
    """The CRD's ``enum``s (jobset_types.go ``+kubebuilder:validation:Enum`` markers):
    successPolicy.operator, startupPolicy.startupPolicyOrder, failurePolicy.restartStrategy,
    failure rule actions, dependsOn status, ... (crd_rules.ENUMS)."""
    out = []
    for value, path, allowed, schema_path, _ in _fields(obj, crd.ENUMS):
        if value not in allowed:
            supported = ", ".join(json.dumps(a) for a in allowed)
            out.append(Violation(path, _rule_id("enum", schema_path), f"{json.dumps(value)} is not one of {supported}",
                                 _src("enum"), APISERVER, NOT_SUPPORTED, value, f"supported values: {supported}"))
    return out


def schema_bounds(obj: dict[str, Any]) -> list[Violation]:
    """The CRD's ``minimum``/``maximum`` (``+kubebuilder:validation:Minimum=0`` on
    ttlSecondsAfterFinished and replicas), ``maxLength``/``pattern`` and ``maxItems`` (dependsOn at
    most 5), in kube-openapi's validate words (errors.go: should be greater than or equal to)."""
    out = []
    for value, path, low, schema_path, _ in _fields(obj, crd.MINIMUMS):
        if _int(value) is not None and value < low:
            out.append(Violation(path, _rule_id("minimum", schema_path), f"{value} must be >= {low}", _src("minimum"),
                                 APISERVER, INVALID, value, f"{path} in body should be greater than or equal to {low}"))
    for value, path, high, schema_path, _ in _fields(obj, crd.MAXIMUMS):
        if _int(value) is not None and value > high:
            out.append(Violation(path, _rule_id("maximum", schema_path), f"{value} must be <= {high}", _src("maximum"),
                                 APISERVER, INVALID, value, f"{path} in body should be less than or equal to {high}"))
    for value, path, most, schema_path, _ in _fields(obj, crd.MAX_LENGTHS):
        if isinstance(value, str) and len(value) > most:
            out.append(Violation(path, _rule_id("max-length", schema_path), f"{len(value)} characters; at most {most}",
                                 _src("maxLength"), APISERVER, TOO_LONG, value, f"may not be more than {most} bytes"))
    for value, path, pattern, schema_path, _ in _fields(obj, crd.PATTERNS):
        if isinstance(value, str) and not re.search(pattern, value):
            out.append(Violation(path, _rule_id("pattern", schema_path), f"{json.dumps(value)} must match {pattern}",
                                 _src("pattern"), APISERVER, INVALID, value, f"should match '{pattern}'"))
    for value, path, most, schema_path, _ in _fields(obj, crd.MAX_ITEMS):
        if isinstance(value, list) and len(value) > most:
            out.append(Violation(path, _rule_id("max-items", schema_path), f"{len(value)} items; at most {most}",
                                 _src("maxItems"), APISERVER, TOO_MANY, len(value), f"must have at most {most} items"))
    return out


def schema_list_maps(obj: dict[str, Any]) -> list[Violation]:
    """The CRD's ``x-kubernetes-list-type: map`` lists (replicatedJobs and dependsOn, keyed by
    name): each item names its keys, and no two items share them (apiextensions-apiserver
    pkg/apiserver/schema/listtype/validation.go: ValidateListSetsAndMaps answers Duplicate
    with the keys as a Go map)."""
    out = []
    for schema_path, keys in crd.LIST_MAP_KEYS.items():
        for items, where in _at(obj, schema_path):
            seen: set[tuple[Any, ...]] = set()
            for i, item in enumerate(_list(items)):
                item = _dict(item)
                missing = [k for k in keys if not item.get(k)]
                for key in missing:
                    out.append(Violation(f"{where}[{i}].{key}", _rule_id("required", schema_path), "required",
                                         _src("x-kubernetes-list-map-keys"), APISERVER, REQUIRED))
                ident = tuple(item.get(k) for k in keys)
                if not missing and ident in seen:
                    shown = ", ".join(f"{json.dumps(k)}:{json.dumps(item[k])}" for k in keys)
                    out.append(Violation(f"{where}[{i}]", _rule_id("unique", schema_path),
                                         f"duplicate {schema_path.rsplit('.', 1)[-1]} entry {{{shown}}}",
                                         _src("x-kubernetes-list-map-keys"), APISERVER, DUPLICATE,
                                         GoLiteral(f"map[string]interface {{}}{{{shown}}}")))
                seen.add(ident)
    return out


def _startup_in_order_without_depends_on(spec: dict[str, Any]) -> bool:
    in_order = _dict(spec.get("startupPolicy")).get("startupPolicyOrder") == "InOrder"
    return not (in_order and any("dependsOn" in _dict(rj) for rj in _list(spec.get("replicatedJobs"))))


def _templates_without_namespace(policy: dict[str, Any]) -> bool:
    return all(not _dict(_dict(t).get("metadata")).get("namespace") for t in _list(policy.get("templates")))


# The CRD's create-time CEL rules (crd_rules.CEL), each as Python: a rule the CRD gains is
# missing here, and tests/test_admission_crd.py says so.
CEL_CHECKS = {
    "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && "
    "self.replicatedJobs.exists(x, has(x.dependsOn)))": _startup_in_order_without_depends_on,
    "self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)":
        _templates_without_namespace,
}


def schema_cel(obj: dict[str, Any]) -> list[Violation]:
    """The CRD's ``x-kubernetes-validations`` (jobset_types.go ``XValidation`` markers) on
    create: startupPolicy InOrder and dependsOn are mutually exclusive; a volumeClaimPolicy's
    templates name no namespace."""
    out = []
    for schema_path, checks in crd.CEL.items():
        for node, where in _at(obj, schema_path):
            for rule, message in checks:
                check = CEL_CHECKS.get(rule)
                if isinstance(node, dict) and check is not None and not check(node):
                    # apiextensions reports a failed CEL rule as Invalid with the schema type as the value.
                    out.append(Violation(where, _rule_id("cel", message), message, _src("x-kubernetes-validations"),
                                         APISERVER, INVALID, "object", message))
    return out


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
