"""Kubernetes names xrun renders and reads back: label and annotation keys, Downward-API
field paths, JobSet condition types and Job failure reasons.

One place for them, so the manifests, the local backend (which plays JobSet's controller)
and the kube backend (which reads what the real controller wrote) cannot drift apart.
Upstream sources: kubernetes-sigs/jobset ``api/jobset/v1alpha2/jobset_types.go`` (labels,
annotations, conditions) and kubernetes ``staging/src/k8s.io/api/batch/v1/types.go``
(completion index, Job failure reasons).
"""

from __future__ import annotations

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_API_VERSION = f"{JOBSET_GROUP}/{JOBSET_VERSION}"
JOBSET_KIND = "JobSet"
JOBSET_PLURAL = "jobsets"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"  # Kueue v0.15+ serves and stores Workloads at v1beta2


class KueueWorkload:
    """What xrun reads of the Workload Kueue makes for a queued JobSet (kueue
    apis/kueue/v1beta2/workload_types.go; the owner's uid label from
    pkg/controller/constants/constants.go JobUIDLabel)."""

    JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
    QUOTA_RESERVED = "QuotaReserved"  # False while waiting: the flavor assigner's reason
    EVICTED = "Evicted"  # True once preempted or evicted, until admitted again
    PREEMPTED = "Preempted"


class Labels:
    """Label keys on JobSets, Jobs and pods."""

    # xrun's own.
    RUN = "xrun.dev/run"
    MANAGED_BY = "app.kubernetes.io/managed-by"
    COMPONENT = "app.kubernetes.io/component"
    # Set by the JobSet controller on Jobs and pods (jobset_types.go).
    JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
    REPLICATED_JOB_NAME = "jobset.sigs.k8s.io/replicatedjob-name"
    REPLICATED_JOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
    JOB_INDEX = "jobset.sigs.k8s.io/job-index"
    JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"  # JobSet >= 0.6
    RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
    # Set by the Job controller on pods of Indexed Jobs (also an annotation).
    COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
    # Kueue.
    QUEUE_NAME = "kueue.x-k8s.io/queue-name"
    KUEUE_PRIORITY = "kueue.x-k8s.io/priority-class"
    # GKE node labels the pods select on.
    NODEPOOL = "cloud.google.com/gke-nodepool"
    TPU_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
    TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
    GPU_ACCELERATOR = "cloud.google.com/gke-accelerator"
    INSTANCE_TYPE = "node.kubernetes.io/instance-type"
    # GKE capacity (node labels a pod selects; GKE docs "Spot VMs", "Consuming reserved
    # zonal resources", "Run a small batch workload with flex-start", "flex-start with queued
    # provisioning"; xpk capacity.py).
    SPOT = "cloud.google.com/gke-spot"
    RESERVATION_NAME = "cloud.google.com/reservation-name"
    RESERVATION_PROJECT = "cloud.google.com/reservation-project"  # a shared reservation's owner
    RESERVATION_AFFINITY = "cloud.google.com/reservation-affinity"
    FLEX_START = "cloud.google.com/gke-flex-start"  # label on every flex-start node


class Taints:
    """GKE node taint keys a pod must tolerate."""

    # Nodes of a queued-provisioning (flex-start --enable-queued-provisioning) node pool are
    # tainted so; GKE does not label them with it (GKE docs "Run a large-scale workload with
    # flex-start with queued provisioning").
    QUEUED = "cloud.google.com/gke-queued"
    SPOT = "cloud.google.com/gke-spot"


class Annotations:
    COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
    JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
    # One Job (slice) per node pool: JobSet's exclusive placement.
    EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
    # GKE multi-networking (pod annotations): extra NICs without hostNetwork.
    NETWORK_INTERFACES = "networking.gke.io/interfaces"
    DEFAULT_INTERFACE = "networking.gke.io/default-interface"
    # The GCS FUSE CSI driver injects its sidecar into pods annotated so.
    GCSFUSE_VOLUMES = "gke-gcsfuse/volumes"
    # Kueue topology-aware scheduling (pod template annotations, kueue apis/kueue/v1beta1
    # constants.go PodSetRequiredTopologyAnnotation / PodSetPreferredTopologyAnnotation).
    KUEUE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
    KUEUE_PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
    # Two-level TAS for a PodSet of several slices (kueue v0.17 apis/kueue/v1beta2
    # topology_types.go PodSetSliceRequiredTopologyAnnotation / PodSetSliceSizeAnnotation,
    # checked by pkg/controller/jobframework/tas_validation.go): each group of slice-size
    # pods in one domain of the slice level; the size is required with it.
    KUEUE_SLICE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-slice-required-topology"
    KUEUE_SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"


class FieldPaths:
    """Downward-API sources of the contract env (what Kubernetes and JobSet put on pods)."""

    COMPLETION_INDEX = f"metadata.annotations['{Annotations.COMPLETION_INDEX}']"
    JOB_GLOBAL_INDEX = f"metadata.labels['{Labels.JOB_GLOBAL_INDEX}']"
    RESTART_ATTEMPT = f"metadata.labels['{Labels.RESTART_ATTEMPT}']"
    POD_NAME = "metadata.name"
    NAMESPACE = "metadata.namespace"


class Conditions:
    """JobSet status condition types (jobset_types.go ``JobSetConditionType``)."""

    COMPLETED = "Completed"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    STARTUP_POLICY_COMPLETED = "StartupPolicyCompleted"


class JobFailureReasons:
    """Job ``Failed`` condition reasons a JobSet failure-policy rule can match."""

    POD_FAILURE_POLICY = "PodFailurePolicy"
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    MAX_FAILED_INDEXES_EXCEEDED = "MaxFailedIndexesExceeded"
    FAILED_INDEXES = "FailedIndexes"

    ALL = (POD_FAILURE_POLICY, BACKOFF_LIMIT_EXCEEDED, DEADLINE_EXCEEDED,
           MAX_FAILED_INDEXES_EXCEEDED, FAILED_INDEXES)


class PodPhases:
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    STARTED = (RUNNING, SUCCEEDED, FAILED)
    DONE = (SUCCEEDED, FAILED)
