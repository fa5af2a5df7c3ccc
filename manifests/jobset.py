"""The JobSet for one run: spec in, typed objects (``manifests.types``) out. No I/O.

One replicatedJob ``slice`` with ``replicas`` = slices, each an Indexed Job with one pod per
host. Every value comes from the RunSpec (where all defaults live), the accelerator
catalogue, or a constant below; optional fields are left out (``types.to_dict`` omits
them), never set to None or "".
"""

from __future__ import annotations

from typing import Any

from manifests import types as t
from manifests.spec import RunSpec
from xrun_contract import Env, Layout, PodFiles
from xrun_contract.k8s import (
    JOBSET_API_VERSION,
    JOBSET_KIND,
    Annotations,
    FieldPaths,
    JobFailureReasons,
    Labels,
)

REPLICATED_JOB = "slice"
CONTAINER = "workload"  # the user's container (the podFailurePolicy reads its exit code)
INIT_CONTAINER = "xrun-init"  # copies the launcher into the shared folder (xrun's image)
LOGS_CONTAINER = "xrun-logs"  # native sidecar shipping the output to storage (xrun's image)
POD_VOLUME = "xrun"  # the emptyDir shared by the three, mounted at PodFiles.MOUNT_PATH
# The log shipper is a small Python process; its requests count towards the pod's.
LOGS_RESOURCES = {"cpu": "100m", "memory": "128Mi"}
MANAGED_BY = "xrun"
TPU_RESOURCE = "google.com/tpu"
GPU_RESOURCE = "nvidia.com/gpu"
# A bug (an exit code outside the restartable set) fails the JobSet for good. The name must
# match jobset_webhook.go validateFailurePolicy's ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$.
FAIL_ON_USER_ERROR_RULE = "FailOnUserError"
SHM_VOLUME = "dshm"


def coordinator_host(spec: RunSpec) -> str:
    """DNS name of slice 0, host 0 (JobSet's headless service; subdomain = JobSet name)."""
    return f"{spec.name}-{REPLICATED_JOB}-0-0.{spec.name}"


def launcher_argv(command: str) -> list[str]:
    """The user's container command: xrun's POSIX-sh launcher (``workload/launcher.sh``,
    copied into the shared folder by the init container) running ``/bin/sh -c COMMAND``.

    Nothing of xrun has to be in the user's image but /bin/sh. The command string travels
    as one argv element, so quotes, ``$``, ``;`` and newlines reach the shell exactly as
    written; ``$(XRUN_POD_DIR)`` is expanded by Kubernetes from the container's env.
    """
    return ["/bin/sh", f"$({Env.POD_DIR})/{PodFiles.LAUNCHER}", k8s_escape(command)]


def install_argv() -> list[str]:
    """The init container's command (xrun's image): copy the launcher into the shared folder."""
    return ["python3", "-m", "workload.sidecar", "install", f"$({Env.POD_DIR})"]


def ship_argv() -> list[str]:
    """The log shipper's command (xrun's image)."""
    return ["python3", "-u", "-m", "workload.sidecar", "ship"]


def k8s_escape(text: str) -> str:
    """Kubernetes expands $(VAR) and reduces $$ to $ in env values, command and args;
    doubling every $ makes the container see exactly ``text``."""
    return text.replace("$", "$$")


def _field_env(name: str, field_path: str) -> t.EnvVar:
    return t.EnvVar(name=name, value_from=t.EnvVarSource(field_ref=t.ObjectFieldSelector(field_path=field_path)))


def container_env(spec: RunSpec) -> list[t.EnvVar]:
    """Every env var a pod gets: contract values (static or Downward API), then the user's."""
    shape = spec.shape
    coordinator = f"{coordinator_host(spec)}:{spec.coordinator_port}"
    static: dict[str, str] = {
        Env.RUN_NAME: spec.name,
        Env.STORAGE: spec.storage,
        Env.POD_DIR: PodFiles.MOUNT_PATH,
        Env.NUM_SLICES: str(spec.slices),
        Env.HOSTS_PER_SLICE: str(spec.hosts_per_slice),
        Env.NUM_PROCESSES: str(spec.slices * spec.hosts_per_slice),
        Env.COORDINATOR_ADDRESS: coordinator,
        Env.JAX_COORDINATOR_ADDRESS: coordinator,
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
    if spec.storage.startswith("gs://"):
        # JAX's persistent compilation cache under the storage root, so a restarted or
        # resubmitted run loads its executables instead of recompiling (jax's LRUCache opens
        # the folder with etils.epath, which serves gs:// through gcsfs).
        static[Env.COMPILATION_CACHE] = f"{spec.storage.rstrip('/')}/{Layout.compilation_cache()}"
    if spec.commit:
        static[Env.COMMIT] = spec.commit
    if spec.branch:
        static[Env.BRANCH] = spec.branch
    if shape.kind == "gpu":  # MaxText's GPU initialisation reads these (XPK's names)
        static[Env.JAX_COORDINATOR_IP] = coordinator_host(spec)
        static[Env.JAX_COORDINATOR_PORT] = str(spec.coordinator_port)
        static[Env.NNODES] = str(spec.hosts_per_slice)
    multislice = shape.kind == "tpu" and spec.slices > 1
    if multislice:
        static[Env.MEGASCALE_COORDINATOR_ADDRESS] = coordinator_host(spec)
        static[Env.MEGASCALE_NUM_SLICES] = str(spec.slices)
        static[Env.MEGASCALE_PORT] = str(spec.megascale_port)
    env = [
        _field_env(Env.HOST_INDEX, FieldPaths.COMPLETION_INDEX),
        _field_env(Env.SLICE_INDEX, FieldPaths.JOB_GLOBAL_INDEX),
        _field_env(Env.RESTART_ATTEMPT, FieldPaths.RESTART_ATTEMPT),
        _field_env(Env.POD_NAME, FieldPaths.POD_NAME),
    ]
    if multislice:
        env.append(_field_env(Env.MEGASCALE_SLICE_ID, FieldPaths.JOB_GLOBAL_INDEX))
    if shape.kind == "gpu":  # one slice: the process id is the completion index
        env.append(_field_env(Env.NODE_RANK, FieldPaths.COMPLETION_INDEX))
    env += [t.EnvVar(name=k, value=k8s_escape(v)) for k, v in static.items()]
    # An empty value is expressed by leaving "value" out (Kubernetes reads it as "").
    env += [t.EnvVar(name=k, value=k8s_escape(v) if v else None) for k, v in spec.env.items()]
    return env


def pod_failure_policy(spec: RunSpec) -> t.PodFailurePolicy:
    """Exit codes outside the restartable set fail the Job for good (reason PodFailurePolicy),
    which the JobSet rule below turns into FailJobSet; restartable codes fail the Job the
    ordinary way (backoffLimit 0) and JobSet restarts the whole set."""
    return t.PodFailurePolicy(rules=[t.PodFailurePolicyRule(
        action="FailJob",
        on_exit_codes=t.PodFailurePolicyOnExitCodesRequirement(
            container_name=CONTAINER, operator="NotIn", values=sorted(spec.restartable_exit_codes)),
    )])


def _accelerator_resources(resource: str, count: int) -> t.ResourceRequirements:
    return t.ResourceRequirements(requests={resource: str(count)}, limits={resource: str(count)})


def logs_env(spec: RunSpec) -> list[t.EnvVar]:
    """What the log shipper needs: where to write (run, storage, host, attempt) and the folder."""
    return [
        _field_env(Env.HOST_INDEX, FieldPaths.COMPLETION_INDEX),
        _field_env(Env.SLICE_INDEX, FieldPaths.JOB_GLOBAL_INDEX),
        _field_env(Env.RESTART_ATTEMPT, FieldPaths.RESTART_ATTEMPT),
        t.EnvVar(name=Env.RUN_NAME, value=spec.name),
        t.EnvVar(name=Env.STORAGE, value=k8s_escape(spec.storage)),
        t.EnvVar(name=Env.POD_DIR, value=PodFiles.MOUNT_PATH),
    ]


def xrun_containers(spec: RunSpec) -> list[t.Container]:
    """xrun's part of the pod, from xrun's image: the launcher installer (a plain init
    container: done before anything else starts) and the log shipper (a native sidecar,
    restartPolicy Always, Kubernetes >= 1.29: started before the workload, restarted if it
    dies, stopped only after the workload container ended)."""
    mount = [t.VolumeMount(name=POD_VOLUME, mount_path=PodFiles.MOUNT_PATH)]
    return [
        t.Container(name=INIT_CONTAINER, image=spec.xrun_image, image_pull_policy="IfNotPresent",
                    command=install_argv(),
                    env=[t.EnvVar(name=Env.POD_DIR, value=PodFiles.MOUNT_PATH)],
                    volume_mounts=list(mount)),
        t.Container(name=LOGS_CONTAINER, image=spec.xrun_image, image_pull_policy="IfNotPresent",
                    command=ship_argv(), env=logs_env(spec), volume_mounts=list(mount),
                    resources=t.ResourceRequirements(requests=dict(LOGS_RESOURCES)),
                    restart_policy="Always"),
    ]


def pod_spec(spec: RunSpec) -> t.PodSpec:
    shape = spec.shape
    container = t.Container(
        name=CONTAINER,
        image=spec.image,
        image_pull_policy="IfNotPresent",
        command=launcher_argv(spec.command),
        env=container_env(spec),
        ports=[t.ContainerPort(name="coordinator", container_port=spec.coordinator_port)],
        volume_mounts=[t.VolumeMount(name=SHM_VOLUME, mount_path="/dev/shm"),
                       t.VolumeMount(name=POD_VOLUME, mount_path=PodFiles.MOUNT_PATH)],
    )
    pod = t.PodSpec(
        init_containers=xrun_containers(spec),
        containers=[container],
        restart_policy="Never",
        termination_grace_period_seconds=spec.termination_grace_seconds,
        volumes=[t.Volume(name=SHM_VOLUME, empty_dir=t.EmptyDirVolumeSource(medium="Memory")),
                 t.Volume(name=POD_VOLUME, empty_dir=t.EmptyDirVolumeSource())],
    )
    if shape.kind == "tpu":
        container.resources = _accelerator_resources(TPU_RESOURCE, shape.devices_per_vm)
        # The machine type too: v6e-8 as 2 x ct6e-standard-4t and as 1 x ct6e-standard-8t share
        # accelerator and topology labels, and a pod sent to the other kind of node pool waits
        # forever on "Insufficient google.com/tpu".
        pod.node_selector = {Labels.TPU_ACCELERATOR: shape.gke_accelerator,
                             Labels.TPU_TOPOLOGY: shape.topology,
                             Labels.INSTANCE_TYPE: shape.machine_type}
        pod.tolerations = [t.Toleration(key=TPU_RESOURCE, operator="Exists", effect="NoSchedule")]
        if spec.slices > 1:
            container.ports.append(t.ContainerPort(name="megascale", container_port=spec.megascale_port))
    elif shape.kind == "gpu":
        container.resources = _accelerator_resources(GPU_RESOURCE, shape.devices_per_vm)
        pod.node_selector = {Labels.GPU_ACCELERATOR: shape.gke_accelerator}
        pod.tolerations = [t.Toleration(key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")]
    if shape.kind in ("tpu", "gpu"):
        pod.host_network = True
        pod.dns_policy = "ClusterFirstWithHostNet"
    if spec.service_account:
        pod.service_account_name = spec.service_account
    if spec.priority_class:
        pod.priority_class_name = spec.priority_class
    if spec.privileged:
        container.security_context = t.SecurityContext(privileged=True)
    return pod


def labels(spec: RunSpec) -> dict[str, str]:
    out = {Labels.RUN: spec.name, Labels.MANAGED_BY: MANAGED_BY}
    if spec.queue:
        out[Labels.QUEUE_NAME] = spec.queue
    if spec.kueue_priority:
        out[Labels.KUEUE_PRIORITY] = spec.kueue_priority
    return out


def build(spec: RunSpec) -> t.JobSet:
    """The typed JobSet for ``spec``."""
    shape = spec.shape
    hosts = spec.hosts_per_slice
    metadata = t.ObjectMeta(name=spec.name, namespace=spec.namespace or None, labels=labels(spec))
    if shape.kind == "tpu":
        metadata.annotations = {Annotations.EXCLUSIVE_TOPOLOGY: Labels.NODEPOOL}
    run_label = {Labels.RUN: spec.name}
    job = t.JobTemplateSpec(
        metadata=t.ObjectMeta(labels=dict(run_label)),
        spec=t.JobSpec(
            parallelism=hosts,
            completions=hosts,
            completion_mode="Indexed",
            backoff_limit=0,
            pod_failure_policy=pod_failure_policy(spec),
            template=t.PodTemplateSpec(metadata=t.ObjectMeta(labels=dict(run_label)),
                                       spec=pod_spec(spec)),
        ),
    )
    # No spec.coordinator: JobSet (>= 0.11, validateCoordinatorLabelValue) puts
    # "<name>-slice-0-0.<subdomain>" in a label value, which caps run names at 26 characters;
    # every pod gets the coordinator's address from the contract env instead.
    return t.JobSet(
        api_version=JOBSET_API_VERSION,
        kind=JOBSET_KIND,
        metadata=metadata,
        spec=t.JobSetSpec(
            failure_policy=t.FailurePolicy(
                max_restarts=spec.max_restarts,
                rules=[t.FailurePolicyRule(
                    name=FAIL_ON_USER_ERROR_RULE, action="FailJobSet",
                    on_job_failure_reasons=[JobFailureReasons.POD_FAILURE_POLICY])],
            ),
            success_policy=t.SuccessPolicy(operator="All", target_replicated_jobs=[REPLICATED_JOB]),
            network=t.Network(enable_dns_hostnames=True, subdomain=spec.name),
            ttl_seconds_after_finished=spec.ttl_seconds_after_finished,
            replicated_jobs=[t.ReplicatedJob(name=REPLICATED_JOB, replicas=spec.slices, template=job)],
        ),
    )


def jobset(spec: RunSpec) -> dict[str, Any]:
    """The whole JobSet object for ``spec``, in its wire form."""
    obj = t.to_dict(build(spec))
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
