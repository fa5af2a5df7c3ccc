"""The JobSet for one run: spec in, plain dict out. No I/O, no clients.

Shaped after JobSet's Go API (jobset.x-k8s.io/v1alpha2): one replicatedJob ``slice`` with
``replicas`` = slices, each an Indexed Job with one pod per host. Every value comes from the
RunSpec (where all defaults live) or from the accelerator catalogue; optional fields are
left out rather than set to None or "" (``check_no_empty`` enforces it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xrun_contract import Env

if TYPE_CHECKING:
    from orchestrator.spec import RunSpec

API_VERSION = "jobset.x-k8s.io/v1alpha2"
KIND = "JobSet"
REPLICATED_JOB = "slice"
CONTAINER = "workload"
RUN_LABEL = "xrun.dev/run"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
GPU_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
TPU_RESOURCE = "google.com/tpu"
GPU_RESOURCE = "nvidia.com/gpu"
# Downward API sources (what Kubernetes / JobSet put on every pod).
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
JOB_GLOBAL_INDEX = "metadata.labels['jobset.sigs.k8s.io/job-global-index']"
RESTART_ATTEMPT = "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"
POD_NAME = "metadata.name"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
FAIL_ON_USER_ERROR_RULE = "FailOnUserError"


def coordinator_host(spec: RunSpec) -> str:
    """DNS name of slice 0, host 0 (JobSet's headless service; subdomain = JobSet name)."""
    return f"{spec.name}-{REPLICATED_JOB}-0-0.{spec.name}"


def wrapper_argv(command: str) -> list[str]:
    """The container command: the pod wrapper running the user's command through /bin/sh.

    The command string travels as one argv element, so quotes, ``$``, ``;`` and newlines
    reach the shell exactly as written; the wrapper forwards SIGTERM to the whole group.
    """
    return ["python3", "-u", "-m", "workload.wrapper", "--", "/bin/sh", "-c", k8s_escape(command)]


def k8s_escape(text: str) -> str:
    """Kubernetes expands $(VAR) and reduces $$ to $ in env values, command and args;
    doubling every $ makes the container see exactly ``text``."""
    return text.replace("$", "$$")


def _field_env(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def container_env(spec: RunSpec) -> list[dict[str, Any]]:
    """Every env var a pod gets: contract values (static or Downward API), then the user's."""
    shape = spec.shape
    static: dict[str, str] = {
        Env.RUN_NAME: spec.name,
        Env.STORAGE: spec.storage_root,
        Env.NUM_SLICES: str(spec.slices),
        Env.HOSTS_PER_SLICE: str(spec.hosts_per_slice),
        Env.COORDINATOR_ADDRESS: f"{coordinator_host(spec)}:{spec.coordinator_port}",
        Env.PLATFORM: shape.kind,
        Env.ACCELERATOR: shape.name,
        Env.DEVICES_PER_HOST: str(shape.devices_per_vm),
        Env.RESTARTABLE_EXIT_CODE: str(spec.restartable_exit_codes[0]),
        Env.IMAGE: spec.image,
    }
    if shape.peak_bf16_tflops:
        static[Env.PEAK_TFLOPS_PER_DEVICE] = f"{shape.peak_bf16_tflops:g}"
    if shape.hbm_bytes:
        static[Env.HBM_GIB_PER_DEVICE] = f"{shape.hbm_gib:.2f}"
    if spec.commit:
        static[Env.COMMIT] = spec.commit
    if spec.branch:
        static[Env.BRANCH] = spec.branch
    if shape.kind == "tpu" and spec.slices > 1:
        static[Env.MEGASCALE_COORDINATOR_ADDRESS] = coordinator_host(spec)
        static[Env.MEGASCALE_NUM_SLICES] = str(spec.slices)
        static[Env.MEGASCALE_PORT] = str(spec.megascale_port)
    env = [
        _field_env(Env.HOST_INDEX, COMPLETION_INDEX),
        _field_env(Env.SLICE_INDEX, JOB_GLOBAL_INDEX),
        _field_env(Env.RESTART_ATTEMPT, RESTART_ATTEMPT),
        _field_env(Env.POD_NAME, POD_NAME),
    ]
    if shape.kind == "tpu" and spec.slices > 1:
        env.append(_field_env(Env.MEGASCALE_SLICE_ID, JOB_GLOBAL_INDEX))
    env += [{"name": k, "value": k8s_escape(v)} for k, v in static.items()]
    # An empty value is expressed by leaving "value" out (Kubernetes reads it as "").
    env += [{"name": k, "value": k8s_escape(v)} if v else {"name": k} for k, v in spec.env.items()]
    return env


def pod_failure_policy(spec: RunSpec) -> dict[str, Any]:
    """Exit codes outside the restartable set fail the Job for good (reason PodFailurePolicy),
    which the JobSet rule below turns into FailJobSet; restartable codes fail the Job the
    ordinary way (backoffLimit 0) and JobSet restarts the whole set."""
    return {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "NotIn",
                    "values": sorted(spec.restartable_exit_codes),
                },
            }
        ]
    }


def pod_spec(spec: RunSpec) -> dict[str, Any]:
    shape = spec.shape
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": wrapper_argv(spec.command),
        "env": container_env(spec),
        "ports": [{"name": "coordinator", "containerPort": spec.coordinator_port}],
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": spec.termination_grace_seconds,
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    }
    if shape.kind == "tpu":
        chips = str(shape.devices_per_vm)
        container["resources"] = {
            "requests": {TPU_RESOURCE: chips},
            "limits": {TPU_RESOURCE: chips},
        }
        pod["nodeSelector"] = {
            TPU_ACCELERATOR_LABEL: shape.gke_accelerator,
            TPU_TOPOLOGY_LABEL: shape.topology,
        }
        pod["tolerations"] = [
            {"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
        ]
        if spec.slices > 1:
            container["ports"].append({"name": "megascale", "containerPort": spec.megascale_port})
    elif shape.kind == "gpu":
        gpus = str(shape.devices_per_vm)
        container["resources"] = {
            "requests": {GPU_RESOURCE: gpus},
            "limits": {GPU_RESOURCE: gpus},
        }
        pod["nodeSelector"] = {GPU_ACCELERATOR_LABEL: shape.gke_accelerator}
        pod["tolerations"] = [
            {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
        ]
    if shape.kind in ("tpu", "gpu"):
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    if spec.service_account:
        pod["serviceAccountName"] = spec.service_account
    if spec.priority_class:
        pod["priorityClassName"] = spec.priority_class
    if spec.privileged:
        container["securityContext"] = {"privileged": True}
    return pod


def labels(spec: RunSpec) -> dict[str, str]:
    out = {RUN_LABEL: spec.name, MANAGED_BY_LABEL: "xrun"}
    if spec.queue:
        out[QUEUE_LABEL] = spec.queue
    if spec.kueue_priority:
        out[KUEUE_PRIORITY_LABEL] = spec.kueue_priority
    return out


def jobset(spec: RunSpec) -> dict[str, Any]:
    """The whole JobSet object for ``spec``."""
    shape = spec.shape
    hosts = spec.hosts_per_slice
    metadata: dict[str, Any] = {
        "name": spec.name,
        "namespace": spec.namespace,
        "labels": labels(spec),
    }
    if shape.kind == "tpu":
        metadata["annotations"] = {EXCLUSIVE_TOPOLOGY: NODEPOOL_LABEL}
    job_template = {
        "metadata": {"labels": {RUN_LABEL: spec.name}},
        "spec": {
            "parallelism": hosts,
            "completions": hosts,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "podFailurePolicy": pod_failure_policy(spec),
            "template": {
                "metadata": {"labels": {RUN_LABEL: spec.name}},
                "spec": pod_spec(spec),
            },
        },
    }
    obj = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "failurePolicy": {
                "maxRestarts": spec.max_restarts,
                "rules": [
                    {
                        "name": FAIL_ON_USER_ERROR_RULE,
                        "action": "FailJobSet",
                        "onJobFailureReasons": ["PodFailurePolicy"],
                    }
                ],
            },
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [REPLICATED_JOB]},
            "network": {"enableDNSHostnames": True, "subdomain": spec.name},
            "coordinator": {"replicatedJob": REPLICATED_JOB, "jobIndex": 0, "podIndex": 0},
            "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
            "replicatedJobs": [
                {"name": REPLICATED_JOB, "replicas": spec.slices, "template": job_template}
            ],
        },
    }
    check_no_empty(obj)
    return obj


def check_no_empty(obj: Any, path: str = "") -> None:
    """No None, "None" or "" anywhere: an optional field is omitted, never blank."""
    if obj is None or obj == "" or obj == "None":
        raise ValueError(f"manifest field {path or '<root>'} is empty")
    if isinstance(obj, dict):
        for k, v in obj.items():
            check_no_empty(v, f"{path}.{k}" if path else k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            check_no_empty(v, f"{path}[{i}]")
