"""What every admission layer shares: the violation record in the API server's own words,
the constants naming layers, causes and upstream sources, and walkers over a JobSet."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

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
