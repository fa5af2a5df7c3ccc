"""The JobSet CRD's own rules (v1alpha2 openAPIV3Schema), as data. Generated: do not edit.

Source: kubernetes-sigs/jobset config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml
(API jobset.x-k8s.io/v1alpha2, controller-gen v0.17.2), by
``python -m manifests.admission.gen_crd_rules``. Paths are schema paths from the JobSet's
root, ``[]`` standing for each item of a list. Left out: the Kubernetes core types the
JobSet embeds (spec.replicatedJobs[].template, spec.volumeClaimPolicies[].templates),
whose rules are kube-apiserver's (hand-written in manifests.admission.jobs).

Hand-written elsewhere, being no part of this CRD: object metadata (apiserver.py,
apimachinery objectmeta.go), the Job and pod templates' batch and core validation
(jobs.py), the mutating webhook's Go decoding of int32 fields and quantities
(apiserver.py), JobSet's validating webhook (webhook.py) and Kueue (kueue.py). The
CEL rules here are evaluated by apiserver.CEL_CHECKS, one Python check per rule.
"""

from __future__ import annotations

from typing import Any

SOURCE = 'kubernetes-sigs/jobset config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml'
VERSION = 'v1alpha2'

# allowed values of a string field
ENUMS: dict[str, tuple[str, ...]] = {
    'spec.failurePolicy.restartStrategy': ('Recreate', 'BlockingRecreate', 'InPlaceRestart'),
    'spec.failurePolicy.rules[].action': ('FailJobSet',
                                          'RestartJobSet',
                                          'RestartJobSetAndIgnoreMaxRestarts',
                                          'RestartJob',
                                          'RestartJobAndIgnoreMaxRestarts'),
    'spec.replicatedJobs[].dependsOn[].status': ('Ready', 'Complete'),
    'spec.startupPolicy.startupPolicyOrder': ('AnyOrder', 'InOrder'),
    'spec.successPolicy.operator': ('All', 'Any'),
    'spec.volumeClaimPolicies[].retentionPolicy.whenDeleted': ('Delete', 'Retain'),
}

# an integer field's minimum
MINIMUMS: dict[str, int] = {
    'spec.replicatedJobs[].replicas': 0,
    'spec.ttlSecondsAfterFinished': 0,
}

# an integer field's maximum
MAXIMUMS: dict[str, int] = {}

# a string field's maximum length
MAX_LENGTHS: dict[str, int] = {}

# a string field's minimum length
MIN_LENGTHS: dict[str, int] = {}

# a string field's regular expression
PATTERNS: dict[str, str] = {}

# a list's maximum length
MAX_ITEMS: dict[str, int] = {
    'spec.replicatedJobs[].dependsOn': 5,
    'spec.volumeClaimPolicies': 50,
}

# a list's minimum length
MIN_ITEMS: dict[str, int] = {}

# what the apiserver sets when a field is absent (structural defaulting)
DEFAULTS: dict[str, Any] = {
    'spec.failurePolicy.restartStrategy': 'Recreate',
    'spec.replicatedJobs[].groupName': 'default',
    'spec.replicatedJobs[].replicas': 1,
    'spec.volumeClaimPolicies[].retentionPolicy.whenDeleted': 'Delete',
}

# an object's required fields
REQUIRED: dict[str, tuple[str, ...]] = {
    'spec.coordinator': ('replicatedJob',),
    'spec.failurePolicy.rules[]': ('action', 'name'),
    'spec.replicatedJobs[]': ('name', 'template'),
    'spec.replicatedJobs[].dependsOn[]': ('name', 'status'),
    'spec.startupPolicy': ('startupPolicyOrder',),
    'spec.successPolicy': ('operator',),
}

# a list of objects unique by these keys (x-kubernetes-list-type: map)
LIST_MAP_KEYS: dict[str, tuple[str, ...]] = {
    'spec.replicatedJobs': ('name',),
    'spec.replicatedJobs[].dependsOn': ('name',),
}

# integer fields of format int32
INT32: tuple[str, ...] = (
    'spec.failurePolicy.maxRestarts',
    'spec.replicatedJobs[].replicas',
    'spec.ttlSecondsAfterFinished',
)

# x-kubernetes-validations on create: (rule, message); rules on oldSelf (updates only) are left out
CEL: dict[str, tuple[tuple[str, str], ...]] = {
    'spec': (("!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && "
              'self.replicatedJobs.exists(x, has(x.dependsOn)))',
              'StartupPolicy and DependsOn APIs are mutually exclusive'),),
    'spec.volumeClaimPolicies[]': (('self.templates.all(t, !has(t.metadata.namespace) || '
                                    'size(t.metadata.namespace) == 0)',
                                    'namespace cannot be set for VolumeClaimPolicies templates'),),
}
