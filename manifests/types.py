"""The Kubernetes objects xrun renders, as typed Python data: a mirror of the Go API types.

Shaped after kubernetes-sigs/jobset ``api/jobset/v1alpha2/jobset_types.go`` and the core
and batch types of kubernetes ``staging/src/k8s.io/api`` (``core/v1/types.go``,
``batch/v1/types.go``), restricted to the fields xrun renders or reads back. Field names
are snake_case here and camelCase on the wire (``json`` metadata where Go's JSON tag is
not plain camelCase, e.g. ``enableDNSHostnames``).

Every optional field defaults to ``None`` (or an empty collection) and is *omitted* when
serialised, never written as null or "": :func:`to_dict` is the only way out, and
:func:`from_dict` the only way back in, strict about unknown keys and types, so a
manifest read from storage or sent to the fake API server is checked against these types
and not just passed around as a dict.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints


class TypeError_(ValueError):
    """A dict that does not fit the types: the message names the field path."""


def _json(name: str) -> dict[str, str]:
    return {"json": name}


# ---------------------------------------------------------------------------------------
# meta/v1 and core/v1


@dataclass(kw_only=True)
class ObjectMeta:
    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class ObjectFieldSelector:
    field_path: str
    api_version: str | None = None


@dataclass(kw_only=True)
class EnvVarSource:
    field_ref: ObjectFieldSelector | None = None


@dataclass(kw_only=True)
class EnvVar:
    name: str
    value: str | None = None  # omitted: the container sees ""
    value_from: EnvVarSource | None = None


@dataclass(kw_only=True)
class ContainerPort:
    name: str | None = None
    container_port: int
    host_port: int | None = None
    protocol: str | None = None


@dataclass(kw_only=True)
class VolumeMount:
    name: str
    mount_path: str
    read_only: bool | None = None
    sub_path: str | None = None


@dataclass(kw_only=True)
class EmptyDirVolumeSource:
    medium: str | None = None
    size_limit: str | None = None


@dataclass(kw_only=True)
class HostPathVolumeSource:
    path: str
    type: str | None = None


@dataclass(kw_only=True)
class CSIVolumeSource:
    driver: str
    read_only: bool | None = None
    volume_attributes: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class PersistentVolumeClaimVolumeSource:
    claim_name: str
    read_only: bool | None = None


@dataclass(kw_only=True)
class Volume:
    name: str
    empty_dir: EmptyDirVolumeSource | None = None
    host_path: HostPathVolumeSource | None = None
    csi: CSIVolumeSource | None = None
    persistent_volume_claim: PersistentVolumeClaimVolumeSource | None = None


@dataclass(kw_only=True)
class ResourceRequirements:
    requests: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class SecurityContext:
    privileged: bool | None = None
    capabilities: dict[str, list[str]] = field(default_factory=dict)


@dataclass(kw_only=True)
class Container:
    name: str
    image: str
    image_pull_policy: str | None = None
    command: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    working_dir: str | None = None
    env: list[EnvVar] = field(default_factory=list)
    ports: list[ContainerPort] = field(default_factory=list)
    volume_mounts: list[VolumeMount] = field(default_factory=list)
    resources: ResourceRequirements | None = None
    security_context: SecurityContext | None = None
    # "Always" on an init container makes it a native sidecar (Kubernetes >= 1.29).
    restart_policy: str | None = None


@dataclass(kw_only=True)
class Toleration:
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


@dataclass(kw_only=True)
class PodSchedulingGate:
    name: str


@dataclass(kw_only=True)
class LocalObjectReference:
    name: str


@dataclass(kw_only=True)
class PodSpec:
    restart_policy: str | None = None
    termination_grace_period_seconds: int | None = None
    init_containers: list[Container] = field(default_factory=list)
    containers: list[Container]
    volumes: list[Volume] = field(default_factory=list)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[Toleration] = field(default_factory=list)
    affinity: dict[str, Any] = field(default_factory=dict)  # rendered as plain data
    host_network: bool | None = None
    dns_policy: str | None = None
    service_account_name: str | None = None
    priority_class_name: str | None = None
    scheduler_name: str | None = None
    scheduling_gates: list[PodSchedulingGate] = field(default_factory=list)
    image_pull_secrets: list[LocalObjectReference] = field(default_factory=list)
    subdomain: str | None = None
    hostname: str | None = None


@dataclass(kw_only=True)
class PodTemplateSpec:
    metadata: ObjectMeta = field(default_factory=ObjectMeta)
    spec: PodSpec


# ---------------------------------------------------------------------------------------
# batch/v1


@dataclass(kw_only=True)
class PodFailurePolicyOnExitCodesRequirement:
    operator: str  # In | NotIn
    values: list[int]
    container_name: str | None = None


@dataclass(kw_only=True)
class PodFailurePolicyRule:
    action: str  # FailJob | FailIndex | Ignore | Count
    on_exit_codes: PodFailurePolicyOnExitCodesRequirement | None = None
    on_pod_conditions: list[dict[str, str]] = field(default_factory=list)


@dataclass(kw_only=True)
class PodFailurePolicy:
    rules: list[PodFailurePolicyRule]


@dataclass(kw_only=True)
class JobSpec:
    parallelism: int | None = None
    completions: int | None = None
    completion_mode: str | None = None  # NonIndexed | Indexed
    backoff_limit: int | None = None
    active_deadline_seconds: int | None = None
    pod_failure_policy: PodFailurePolicy | None = None
    template: PodTemplateSpec


@dataclass(kw_only=True)
class JobTemplateSpec:
    metadata: ObjectMeta = field(default_factory=ObjectMeta)
    spec: JobSpec


# ---------------------------------------------------------------------------------------
# jobset.x-k8s.io/v1alpha2


@dataclass(kw_only=True)
class DependsOn:
    name: str
    status: str  # Ready | Complete


@dataclass(kw_only=True)
class ReplicatedJob:
    name: str
    group_name: str | None = None
    replicas: int | None = None
    depends_on: list[DependsOn] = field(default_factory=list)
    template: JobTemplateSpec


@dataclass(kw_only=True)
class Network:
    enable_dns_hostnames: bool | None = field(default=None, metadata=_json("enableDNSHostnames"))
    subdomain: str | None = None
    publish_not_ready_addresses: bool | None = None


@dataclass(kw_only=True)
class SuccessPolicy:
    operator: str  # All | Any
    target_replicated_jobs: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class FailurePolicyRule:
    name: str
    action: str  # FailJobSet | RestartJobSet | RestartJobSetAndIgnoreMaxRestarts
    on_job_failure_reasons: list[str] = field(default_factory=list)
    on_job_failure_messages_patterns: list[str] = field(default_factory=list)
    target_replicated_jobs: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class FailurePolicy:
    max_restarts: int | None = None
    restart_strategy: str | None = None  # Recreate | BlockingRecreate
    rules: list[FailurePolicyRule] = field(default_factory=list)


@dataclass(kw_only=True)
class StartupPolicy:
    startup_policy_order: str  # AnyOrder | InOrder


@dataclass(kw_only=True)
class Coordinator:
    replicated_job: str
    job_index: int | None = None
    pod_index: int | None = None


@dataclass(kw_only=True)
class JobSetSpec:
    failure_policy: FailurePolicy | None = None
    success_policy: SuccessPolicy | None = None
    startup_policy: StartupPolicy | None = None
    network: Network | None = None
    coordinator: Coordinator | None = None
    suspend: bool | None = None
    managed_by: str | None = None
    ttl_seconds_after_finished: int | None = None
    replicated_jobs: list[ReplicatedJob]


@dataclass(kw_only=True)
class JobSet:
    api_version: str = "jobset.x-k8s.io/v1alpha2"
    kind: str = "JobSet"
    metadata: ObjectMeta
    spec: JobSetSpec
    status: dict[str, Any] = field(default_factory=dict)  # written by the controller only


# ---------------------------------------------------------------------------------------
# (De)serialisation


def json_name(f: dataclasses.Field) -> str:
    explicit = f.metadata.get("json")
    if explicit:
        return str(explicit)
    head, *rest = f.name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, list | dict) and not value)


def to_dict(obj: Any) -> Any:
    """The wire form: camelCase keys, optional and empty fields left out, in field order."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if _empty(value):
                continue
            out[json_name(f)] = to_dict(value)
        return out
    if isinstance(obj, list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


T = TypeVar("T")


@typing.no_type_check
def _check(value: Any, hint: Any, path: str) -> Any:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(hint) if a is not type(None)]
        if value is None:
            return None
        (only,) = options
        return _check(value, only, path)
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, path)
    if origin is list:
        if not isinstance(value, list):
            raise TypeError_(f"{path}: expected a list, got {type(value).__name__}")
        (item,) = get_args(hint)
        return [_check(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError_(f"{path}: expected a mapping, got {type(value).__name__}")
        _k, item = get_args(hint)
        return {str(k): _check(v, item, f"{path}.{k}") for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            raise TypeError_(f"{path}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError_(f"{path}: expected an integer, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise TypeError_(f"{path}: expected a string, got {value!r}")
        return value
    raise AssertionError(f"unhandled type {hint!r} at {path}")


def from_dict(cls: type[T], data: Any, path: str = "") -> T:
    """Build ``cls`` from its wire form; unknown keys and wrong types raise, naming the path."""
    where = path or cls.__name__
    if not isinstance(data, dict):
        raise TypeError_(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    fields = {json_name(f): f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise TypeError_(f"{where}.{unknown[0]}: unknown field (known: {', '.join(fields)})")
    kwargs: dict[str, Any] = {}
    for key, f in fields.items():
        sub = f"{path}.{key}" if path else key
        if key not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TypeError_(f"{sub}: required")
            continue
        value = _check(data[key], hints[f.name], sub)
        if value is not None:
            kwargs[f.name] = value
    return cls(**kwargs)


