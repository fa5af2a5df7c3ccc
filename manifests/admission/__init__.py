"""Offline admission: what a real cluster would refuse in a rendered JobSet, before it is sent.

Pure (dict in, violations out; no I/O, clients or env). Four layers, as a cluster applies them:

* ``apiserver``: kube-apiserver on the JobSet itself: object metadata
  (apimachinery ``pkg/api/validation/objectmeta.go``) and the JobSet CRD's OpenAPI schema
  (enums, minimums, list-map keys, CEL rules from ``api/jobset/v1alpha2/jobset_types.go``),
  read from ``crd_rules``, which ``gen_crd_rules`` generates from the upstream CRD.
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
The rules live by upstream source: ``base`` (the violation record, walkers), ``defaults``,
``apiserver`` (metadata and the CRD schema), ``webhook`` (JobSet's validating webhook),
``jobs`` (the child Jobs and pods), ``kueue``; this module runs them in a cluster's order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from manifests.admission.apiserver import (  # noqa: F401 - re-exported
    annotation_keys,
    int32_fields,
    jobset_name,
    labels,
    resource_quantity_format,
    schema_bounds,
    schema_cel,
    schema_enums,
    schema_list_maps,
)
from manifests.admission.base import *  # noqa: F403 - re-exported: callers name them admission.X
from manifests.admission.base import AdmissionError, Violation
from manifests.admission.defaults import (  # noqa: F401 - re-exported
    default,
    default_pod,
)
from manifests.admission.jobs import (  # noqa: F401 - re-exported
    container_ports,
    container_restart_policy,
    containers,
    env_vars,
    host_network_ports,
    job_spec,
    node_selector,
    pod_failure_policy,
    pod_spec_fields,
    resources,
    scheduling_gates,
    tolerations,
    volume_mounts,
    volumes,
)
from manifests.admission.kueue import (  # noqa: F401 - re-exported
    KUEUE_QUEUE_LABEL,
    KUEUE_SRC,
    XPK_COVERED_RESOURCES,
    kueue_pod_requests,
    kueue_requests,
    kueue_uncovered,
)
from manifests.admission.webhook import (  # noqa: F401 - re-exported
    coordinator,
    coordinator_label,
    depends_on,
    failure_policy_reasons,
    failure_policy_rule_names,
    failure_policy_targets,
    feature_gates,
    group_names,
    job_names,
    kueue_queue_name,
    managed_by,
    network_subdomain,
    pod_names,
    replicas_times_parallelism,
    success_policy_targets,
)


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


RULES: tuple[Callable[[dict[str, Any]], list[Violation]], ...] = (
    # apiserver on the JobSet
    jobset_name, labels, annotation_keys, schema_enums, schema_list_maps, schema_bounds, schema_cel,
    resource_quantity_format, int32_fields,
    # JobSet validating webhook
    feature_gates, kueue_queue_name, managed_by, network_subdomain, group_names, job_names, pod_names,
    replicas_times_parallelism, depends_on,
    success_policy_targets, failure_policy_rule_names, failure_policy_targets, failure_policy_reasons,
    coordinator, coordinator_label,
    # kube-apiserver on the child Jobs and pods
    job_spec, pod_failure_policy, containers, container_restart_policy, env_vars, container_ports, host_network_ports,
    volumes,
    volume_mounts, resources, tolerations, node_selector, pod_spec_fields, scheduling_gates,
    # Kueue on a queued JobSet's Workload
    kueue_requests,
)
