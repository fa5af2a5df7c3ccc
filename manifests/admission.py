"""Offline admission: what a real cluster would refuse in a rendered JobSet, before it is sent.

Pure (dict in, violations out; no I/O, clients or env). Four layers, as a cluster applies them:

* ``apiserver``: kube-apiserver on the JobSet itself: object metadata
  (apimachinery ``pkg/api/validation/objectmeta.go``) and the JobSet CRD's OpenAPI schema
  (enums, minimums, list-map keys, CEL rules from ``api/jobset/v1alpha2/jobset_types.go``).
  A real server answers 422 Invalid.
* ``mutating``: JobSet's mutating webhook ``mjobset.kb.io`` failing to decode the JobSet into
  its Go types (an int32 field out of range, a value that is no resource quantity). It runs
  first and answers 400 with the bare error text, prefixed ``admission webhook
  "mjobset.kb.io" denied the request:``; nothing else is checked.
* ``webhook``: JobSet's validating webhook ``vjobset.kb.io`` (kubernetes-sigs/jobset v0.12
  ``pkg/webhooks/jobset_webhook.go`` ``ValidateCreate``); v0.12 answers 422 Invalid too, the
  message prefixed ``admission webhook "vjobset.kb.io" denied the request:``.
* ``job``: kube-apiserver on the Jobs the JobSet controller creates from each template
  (kubernetes ``pkg/apis/batch/validation/validation.go`` and
  ``pkg/apis/core/validation/validation.go``). A real cluster accepts the JobSet and the
  controller then fails to create the Jobs (a ``JobCreationFailed`` event, no pods), so
  these must be caught here.
* ``kueue``: a queued JobSet (label ``kueue.x-k8s.io/queue-name``) that Kueue v0.17 would
  never admit on a ClusterQueue built as xpk builds it: accepted, suspended for ever, a
  ``Pending`` event on its Workload.

``default(obj)`` applies what the cluster adds before validating and storing: the CRD's
structural defaults and JobSet's defaulting webhook ``mjobset.kb.io`` (``Default``).
Every rule is a small function whose docstring names the upstream file and function.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from manifests.k8s_names import (
    is_dns1035_label,
    is_dns1123_label,
    is_dns1123_subdomain,
    is_qualified_name,
    is_valid_label_value,
    is_valid_port_name,
    is_valid_port_num,
    parse_quantity,
)

APISERVER, WEBHOOK, JOB, KUEUE = "apiserver", "webhook", "job", "kueue"
# JobSet's mutating webhook (mjobset.kb.io) failing to decode the object into its Go types
# (encoding/json, resource.Quantity): controller-runtime answers admission.Errored (400) with
# the bare error text, before the schema or any validating webhook sees the object.
MUTATING = "mutating"
# JobSet's webhook registrations (kubernetes-sigs/jobset config/components/webhook/manifests.yaml),
# the names kube-apiserver quotes in "admission webhook %q denied the request".
MUTATING_WEBHOOK = "mjobset.kb.io"
VALIDATING_WEBHOOK = "vjobset.kb.io"
# metav1.CauseType values (apimachinery pkg/util/validation/field/errors.go: ErrorType).
INVALID, REQUIRED, DUPLICATE = "FieldValueInvalid", "FieldValueRequired", "FieldValueDuplicate"
NOT_SUPPORTED, NOT_FOUND, FORBIDDEN = "FieldValueNotSupported", "FieldValueNotFound", "FieldValueForbidden"
TOO_LONG, TOO_MANY, INTERNAL = "FieldValueTooLong", "FieldValueTooMany", "InternalError"
_TYPE_TEXT = {INVALID: "Invalid value", REQUIRED: "Required value", DUPLICATE: "Duplicate value",
              NOT_SUPPORTED: "Unsupported value", NOT_FOUND: "Not found", FORBIDDEN: "Forbidden",
              TOO_LONG: "Too long", TOO_MANY: "Too many", INTERNAL: "Internal error"}

JS_WEBHOOK = "kubernetes-sigs/jobset pkg/webhooks/jobset_webhook.go"
JS_TYPES = "kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go"
K8S_CORE = "kubernetes pkg/apis/core/validation/validation.go"
K8S_BATCH = "kubernetes pkg/apis/batch/validation/validation.go"
K8S_META = "kubernetes/apimachinery pkg/api/validation/objectmeta.go"
K8S_LABELS = "kubernetes/apimachinery pkg/apis/meta/v1/validation/validation.go"

RULE_NAME_FMT = "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
VALID_JOB_FAILURE_REASONS = ("BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes",
                             "MaxFailedIndexesExceeded", "PodFailurePolicy")
_NOVALUE = object()


@dataclass(frozen=True)
class Violation:
    """One refused field. ``path`` is the JobSet field; ``rule`` a short stable id; ``message``
    the human one-liner; ``source`` the upstream ``file:function`` it mirrors. ``layer``,
    ``cause``, ``value`` and ``detail`` let a fake API server answer in the apiserver's own
    words; ``field`` is the field upstream reports when it differs from ``path``."""

    path: str
    rule: str
    message: str
    source: str
    layer: str = WEBHOOK
    cause: str = INVALID
    value: Any = _NOVALUE
    detail: str = ""
    field: str | None = None

    def line(self) -> str:
        """The one-line error: field path, what is wrong, whose rule it is."""
        file, _, func = self.source.rpartition(":")
        return f"{self.path}: {self.message} ({file.rsplit('/', 1)[-1]}:{func})"

    @property
    def upstream_field(self) -> str:
        return self.path if self.field is None else self.field

    def error_body(self) -> str:
        """field.Error.ErrorBody: the cause message without the field name."""
        text = _TYPE_TEXT.get(self.cause, self.cause)
        if self.cause not in (REQUIRED, FORBIDDEN, TOO_LONG, INTERNAL) and self.value is not _NOVALUE:
            text += f": {_go_value(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def upstream_error(self) -> str:
        """field.Error.Error: ``<field>: <body>``; a decode failure of the mutating webhook is
        no field error, only its text (``detail``)."""
        if self.layer == MUTATING:
            return self.detail
        return f"{self.upstream_field}: {self.error_body()}"


class GoLiteral(str):
    """A bad value already spelled as Go's %#v spells it (e.g. a map)."""


def _go_value(value: Any) -> str:
    """How field.Error prints a bad value (%q for strings, %v for numbers)."""
    if isinstance(value, GoLiteral):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, sort_keys=True)


class AdmissionError(ValueError):
    """A manifest a cluster would refuse: one line, the first violation (and how many more)."""

    def __init__(self, violations: list[Violation]):
        self.violations = violations
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        super().__init__(violations[0].line() + more)


# --------------------------------------------------------------------------------------
# Defaulting


def default(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` with what the cluster sets before storing it. Idempotent.

    CRD structural defaults (apiextensions-apiserver applies the schema's ``default:``
    values; jobset_types.go ``+kubebuilder:default`` markers): failurePolicy.restartStrategy
    Recreate, replicatedJobs[].groupName "default" and replicas 1, container ports' protocol
    TCP, empty names of env key refs; a volume without a source becomes an emptyDir (core/v1
    defaults.go SetDefaults_Volume, applied when the Job is decoded). Then the JobSet
    mutating webhook (jobset_webhook.go: Default): successPolicy {operator: All}, startupPolicy {startupPolicyOrder: AnyOrder},
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
        fp.setdefault("restartStrategy", "Recreate")
    for rj in _list(spec.get("replicatedJobs")):
        if not isinstance(rj, dict):
            continue
        rj.setdefault("groupName", "default")
        rj.setdefault("replicas", 1)
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


# --------------------------------------------------------------------------------------
# Entry points


def violations(obj: dict[str, Any]) -> list[Violation]:
    """Every violation of ``obj`` as a cluster would find them after defaulting it."""
    obj = default(obj)
    found: list[Violation] = []
    for rule in RULES:
        found.extend(rule(obj))
    return found


def check(obj: dict[str, Any]) -> None:
    """Raise :class:`AdmissionError` (one line) if a cluster would refuse ``obj``."""
    found = violations(obj)
    if found:
        raise AdmissionError(found)


# --------------------------------------------------------------------------------------
# Walking the object


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _pod_spec(rj: dict[str, Any]) -> dict[str, Any]:
    return _dict(_dict(_dict(_dict(rj.get("template")).get("spec")).get("template")).get("spec"))


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in _list(pod.get("containers")) + _list(pod.get("initContainers")) if isinstance(c, dict)]


def _rjobs(obj: dict[str, Any]) -> Iterator[tuple[int, dict[str, Any], str]]:
    """(index, replicatedJob, its path) for each replicatedJob."""
    for i, rj in enumerate(_list(_dict(obj.get("spec")).get("replicatedJobs"))):
        if isinstance(rj, dict):
            yield i, rj, f"spec.replicatedJobs[{i}]"


def _job_specs(obj: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str]]:
    for _, rj, base in _rjobs(obj):
        yield _dict(_dict(rj.get("template")).get("spec")), f"{base}.template.spec"


def _pod_specs(obj: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str]]:
    for job, base in _job_specs(obj):
        yield _dict(_dict(job.get("template")).get("spec")), f"{base}.template.spec"


def _all_containers(obj: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str, dict[str, Any]]]:
    """(container, its path, its pod spec) for regular and init containers of every template."""
    for pod, base in _pod_specs(obj):
        for kind in ("containers", "initContainers"):
            for i, ctr in enumerate(_list(pod.get(kind))):
                if isinstance(ctr, dict):
                    yield ctr, f"{base}.{kind}[{i}]", pod


def _metas(obj: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str, str]]:
    """(metadata, path, layer) of the JobSet, each Job template and each pod template."""
    yield _dict(obj.get("metadata")), "metadata", APISERVER
    for _, rj, base in _rjobs(obj):
        tmpl = _dict(rj.get("template"))
        yield _dict(tmpl.get("metadata")), f"{base}.template.metadata", JOB
        yield (_dict(_dict(_dict(tmpl.get("spec")).get("template")).get("metadata")),
               f"{base}.template.spec.template.metadata", JOB)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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
    error with Errored(400)) decodes the JobSet into jobset_types.go: a number outside an int32 field's range fails the decode, and the
    webhook answers that error alone (``json: cannot unmarshal number N into Go struct field
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


# --------------------------------------------------------------------------------------
# kube-apiserver on the Jobs and pods the controller creates


def _job_rule(path: str, rule: str, message: str, func: str, cause: str = INVALID, value: Any = _NOVALUE,
              detail: str = "", src: str = K8S_CORE, field: str | None = None) -> Violation:
    return Violation(path, rule, message, f"{src}:{func}", JOB, cause, value, detail, field)


def job_spec(obj: dict[str, Any]) -> list[Violation]:
    """batch validation.go: validateJobSpec: non-negative counts, completionMode values,
    Indexed needs completions once parallelism is set (both unset default to 1; parallelism <= 100000), restartPolicy OnFailure or Never
    (Never when podFailurePolicy is set), podReplacementPolicy Failed with podFailurePolicy."""
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
                                 "validateJobSpec", REQUIRED, detail='valid values: "OnFailure", "Never"', src=K8S_BATCH))
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
                                     REQUIRED, detail='valid values: ["Count" "FailIndex" "FailJob" "Ignore"]', src=src))
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
            out.append(_job_rule(f"{vpath}[{j}]", "pfp-values", f"duplicate exit code {v}", func, DUPLICATE, v, "", src))
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
            out.append(_job_rule(f"{base}.restartPolicyRules", "container-restart-rules", f"{len(rules)} rules; at most 20",
                                 func, TOO_MANY, len(rules), "must have at most 20 items"))
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
                    m = "a valid environment variable name must consist only of printable ASCII characters other than '='"
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
                    out.append(_job_rule(f"{path}.name", "port-name", f"{json.dumps(name)} {m}", func, INVALID, name, m))
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
                out.append(_job_rule(f"{path}.protocol", "port-protocol", f"{json.dumps(proto)} is not TCP, UDP or SCTP",
                                     func, NOT_SUPPORTED, proto, 'supported values: "SCTP", "TCP", "UDP"'))
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
                                     "validateVolumeSource", FORBIDDEN, detail="may not specify more than 1 volume type"))
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
                             "validateResourceName", INVALID, name, "must be a standard resource type or fully qualified"))
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
            key, op, value, effect = tol.get("key", ""), tol.get("operator", ""), tol.get("value", ""), tol.get("effect", "")
            for m in is_qualified_name(str(key)) if key else []:
                out.append(_job_rule(f"{path}.key", "toleration-key", f"{json.dumps(key)} {m}", func, INVALID, key, m))
            if not key and op != "Exists":
                out.append(_job_rule(f"{path}.operator", "toleration-operator", "must be Exists when key is empty", func,
                                     INVALID, op, "operator must be Exists when `key` is empty, which means \"match all "
                                     "values and all keys\""))
            if "tolerationSeconds" in tol and effect != "NoExecute":
                out.append(_job_rule(f"{path}.effect", "toleration-effect", "must be NoExecute with tolerationSeconds",
                                     func, INVALID, effect, "effect must be 'NoExecute' when `tolerationSeconds` is set"))
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
                out.append(_job_rule(f"{path}.operator", "toleration-operator", f"{json.dumps(op)} is not Equal or Exists",
                                     func, NOT_SUPPORTED, op, 'supported values: "Equal", "Exists"'))
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
            out.append(_job_rule(f"{base}.dnsPolicy", "dns-policy", f"{json.dumps(dns)} is not one of {', '.join(allowed)}",
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


RULES: tuple[Callable[[dict[str, Any]], list[Violation]], ...] = (
    # apiserver on the JobSet
    jobset_name, labels, annotation_keys, schema_enums, replicated_job_names_unique, schema_minimums,
    startup_policy_excludes_depends_on, resource_quantity_format, int32_fields,
    # JobSet validating webhook
    feature_gates, kueue_queue_name, managed_by, network_subdomain, group_names, job_names, pod_names, replicas_times_parallelism, depends_on,
    success_policy_targets, failure_policy_rule_names, failure_policy_targets, failure_policy_reasons,
    coordinator, coordinator_label,
    # kube-apiserver on the child Jobs and pods
    job_spec, pod_failure_policy, containers, container_restart_policy, env_vars, container_ports, host_network_ports, volumes,
    volume_mounts, resources, tolerations, node_selector, pod_spec_fields, scheduling_gates,
    # Kueue on a queued JobSet's Workload
    kueue_requests,
)
