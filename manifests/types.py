"""The Kubernetes objects xrun renders, as typed Python data: a mirror of the Go API types.

Shaped after kubernetes-sigs/jobset ``api/jobset/v1alpha2/jobset_types.go`` and the core
and batch types of kubernetes ``staging/src/k8s.io/api`` (``core/v1/types.go``,
``batch/v1/types.go``), restricted to the fields xrun renders or reads back. Field names
are snake_case here and camelCase on the wire (``msgspec.field(name=...)`` where Go's JSON
tag is not plain camelCase, e.g. ``enableDNSHostnames``).

Each type is a ``msgspec.Struct``: every optional field defaults to ``None`` (or an empty
collection) and is *omitted* when serialised, never written as null or "" (``omit_defaults``);
:func:`to_dict` is the way out and :func:`from_dict` the way back in, strict about unknown
keys and types (msgspec's own validation, its errors naming the field's path), so a
manifest read from storage or sent to the API server is checked against these types and
not just passed around as a dict.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec
from msgspec import field


class TypeError_(ValueError):
    """A dict that does not fit the types: the message names the field path."""


class _Object(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True, forbid_unknown_fields=True):
    """One Kubernetes API type: camelCase on the wire, defaults left out, unknown keys refused."""


# ---------------------------------------------------------------------------------------
# meta/v1 and core/v1


class ObjectMeta(_Object, kw_only=True):
    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


class ObjectFieldSelector(_Object, kw_only=True):
    field_path: str
    api_version: str | None = None


class EnvVarSource(_Object, kw_only=True):
    field_ref: ObjectFieldSelector | None = None


class EnvVar(_Object, kw_only=True):
    name: str
    value: str | None = None  # omitted: the container sees ""
    value_from: EnvVarSource | None = None


class ContainerPort(_Object, kw_only=True):
    name: str | None = None
    container_port: int
    host_port: int | None = None
    protocol: str | None = None


class VolumeMount(_Object, kw_only=True):
    name: str
    mount_path: str
    read_only: bool | None = None
    sub_path: str | None = None


class EmptyDirVolumeSource(_Object, kw_only=True):
    medium: str | None = None
    size_limit: str | None = None


class HostPathVolumeSource(_Object, kw_only=True):
    path: str
    type: str | None = None


class CSIVolumeSource(_Object, kw_only=True):
    driver: str
    read_only: bool | None = None
    volume_attributes: dict[str, str] = field(default_factory=dict)


class PersistentVolumeClaimVolumeSource(_Object, kw_only=True):
    claim_name: str
    read_only: bool | None = None


class Volume(_Object, kw_only=True):
    name: str
    empty_dir: EmptyDirVolumeSource | None = None
    host_path: HostPathVolumeSource | None = None
    csi: CSIVolumeSource | None = None
    persistent_volume_claim: PersistentVolumeClaimVolumeSource | None = None


class ResourceRequirements(_Object, kw_only=True):
    requests: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)


class SecurityContext(_Object, kw_only=True):
    privileged: bool | None = None
    capabilities: dict[str, list[str]] = field(default_factory=dict)


class Container(_Object, kw_only=True):
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


class Toleration(_Object, kw_only=True):
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


class PodSchedulingGate(_Object, kw_only=True):
    name: str


class LocalObjectReference(_Object, kw_only=True):
    name: str


class PodSpec(_Object, kw_only=True):
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


class PodTemplateSpec(_Object, kw_only=True):
    metadata: ObjectMeta = field(default_factory=ObjectMeta)
    spec: PodSpec


# ---------------------------------------------------------------------------------------
# batch/v1


class PodFailurePolicyOnExitCodesRequirement(_Object, kw_only=True):
    operator: str  # In | NotIn
    values: list[int]
    container_name: str | None = None


class PodFailurePolicyRule(_Object, kw_only=True):
    action: str  # FailJob | FailIndex | Ignore | Count
    on_exit_codes: PodFailurePolicyOnExitCodesRequirement | None = None
    on_pod_conditions: list[dict[str, str]] = field(default_factory=list)


class PodFailurePolicy(_Object, kw_only=True):
    rules: list[PodFailurePolicyRule]


class JobSpec(_Object, kw_only=True):
    parallelism: int | None = None
    completions: int | None = None
    completion_mode: str | None = None  # NonIndexed | Indexed
    backoff_limit: int | None = None
    active_deadline_seconds: int | None = None
    pod_failure_policy: PodFailurePolicy | None = None
    template: PodTemplateSpec


class JobTemplateSpec(_Object, kw_only=True):
    metadata: ObjectMeta = field(default_factory=ObjectMeta)
    spec: JobSpec


# ---------------------------------------------------------------------------------------
# jobset.x-k8s.io/v1alpha2


class DependsOn(_Object, kw_only=True):
    name: str
    status: str  # Ready | Complete


class ReplicatedJob(_Object, kw_only=True):
    name: str
    group_name: str | None = None
    replicas: int | None = None
    depends_on: list[DependsOn] = field(default_factory=list)
    template: JobTemplateSpec


class Network(_Object, kw_only=True):
    enable_dns_hostnames: bool | None = field(default=None, name="enableDNSHostnames")
    subdomain: str | None = None
    publish_not_ready_addresses: bool | None = None


class SuccessPolicy(_Object, kw_only=True):
    operator: str  # All | Any
    target_replicated_jobs: list[str] = field(default_factory=list)


class FailurePolicyRule(_Object, kw_only=True):
    name: str
    action: str  # FailJobSet | RestartJobSet | RestartJobSetAndIgnoreMaxRestarts
    on_job_failure_reasons: list[str] = field(default_factory=list)
    on_job_failure_messages_patterns: list[str] = field(default_factory=list)
    target_replicated_jobs: list[str] = field(default_factory=list)


class FailurePolicy(_Object, kw_only=True):
    max_restarts: int | None = None
    restart_strategy: str | None = None  # Recreate | BlockingRecreate
    rules: list[FailurePolicyRule] = field(default_factory=list)


class StartupPolicy(_Object, kw_only=True):
    startup_policy_order: str  # AnyOrder | InOrder


class Coordinator(_Object, kw_only=True):
    replicated_job: str
    job_index: int | None = None
    pod_index: int | None = None


class JobSetSpec(_Object, kw_only=True):
    failure_policy: FailurePolicy | None = None
    success_policy: SuccessPolicy | None = None
    startup_policy: StartupPolicy | None = None
    network: Network | None = None
    coordinator: Coordinator | None = None
    suspend: bool | None = None
    managed_by: str | None = None
    ttl_seconds_after_finished: int | None = None
    replicated_jobs: list[ReplicatedJob]


class JobSet(_Object, kw_only=True):
    # No defaults: omit_defaults would leave a default out of the wire form.
    api_version: str
    kind: str
    metadata: ObjectMeta
    spec: JobSetSpec
    status: dict[str, Any] = field(default_factory=dict)  # written by the controller only


# ---------------------------------------------------------------------------------------
# (De)serialisation

def to_dict(obj: Any) -> Any:
    """The wire form: camelCase keys, optional and empty fields left out, in field order."""
    return msgspec.to_builtins(obj)


T = TypeVar("T")


def from_dict(cls: type[T], data: Any, path: str = "") -> T:
    """Build ``cls`` from its wire form; unknown keys and wrong types raise, naming the path."""
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as e:
        # "Expected `str`, got `int` - at `$.spec.replicatedJobs[0].name`": the path first.
        what, _, at = str(e).partition(" - at `$")
        where = (path or cls.__name__) + at.rstrip("`")
        named = re.fullmatch(r"Object (contains unknown|missing required) field `(\w+)`", what)
        if named:  # the field itself is the path: "...containers[0].image: required"
            where, what = f"{where}.{named[2]}", "unknown field" if named[1] == "contains unknown" else "required"
        raise TypeError_(f"{where}: {what[:1].lower()}{what[1:]}") from None
