"""The JobSet for one run: spec in, typed objects (``manifests.types``) out. No I/O.

One replicatedJob ``slice`` with ``replicas`` = slices, each an Indexed Job with one pod per
host. Every value comes from the RunSpec (where all defaults live), the accelerator
catalogue, or a constant below; optional fields are left out (``types.to_dict`` omits
them), never set to None or "".
"""

from __future__ import annotations

import copy
import json
from typing import Any

from manifests import types as t
from manifests.catalogue import Networking, Shape
from manifests.podcode import boot_argv
from manifests.spec import DEFAULT_XRUN_IMAGE, TOPOLOGY_AWARE_SCHEDULER, RunSpec, topology_gate
from xrun_contract import GKE_NVIDIA_LIB64, JAX_PLATFORMS_FOR, Env, Layout, PodFiles, drain_seconds
from xrun_contract.errors import XrunError
from xrun_contract.k8s import (
    JOBSET_API_VERSION,
    JOBSET_KIND,
    Annotations,
    FieldPaths,
    JobFailureReasons,
    Labels,
    Taints,
)

REPLICATED_JOB = "slice"
CONTAINER = "workload"  # the user's container (the podFailurePolicy reads its exit code)
INIT_CONTAINER = "xrun-init"  # copies the launcher into the shared folder (xrun_image_of)
LOGS_CONTAINER = "xrun-logs"  # native sidecar shipping the output to storage (xrun_image_of)
POD_VOLUME = "xrun"  # the emptyDir shared by the three, mounted at PodFiles.MOUNT_PATH
# No container of xrun's requests cpu or memory (only the workload requests its accelerator),
# queued or not. Kueue sums a native sidecar's requests into the pod's (kueue
# pkg/workload/workload.go totalRequestsFromPodSets -> component-helpers PodRequests), and
# xpk's ClusterQueue covers only google.com/tpu or nvidia.com/gpu unless created with
# --cpu-limit/--memory-limit (xpk core/kueue_manager.py), so a cpu request on the log
# shipper kept every queued run from being admitted ("resource cpu unavailable in
# ClusterQueue"). No limits either: the apiserver and Kueue copy a limit into a missing
# request. The pods are therefore BestEffort for cpu and memory (QoS ignores extended
# resources), exactly as xpk's own workload pods, whose only resource is the accelerator
# limit (xpk core/docker_resources.py get_main_container_resources).
MANAGED_BY = "xrun"
TPU_RESOURCE = "google.com/tpu"
GPU_RESOURCE = "nvidia.com/gpu"
# A bug (an exit code outside the restartable set) fails the JobSet for good. The name must
# match jobset_webhook.go validateFailurePolicy's ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$.
FAIL_ON_USER_ERROR_RULE = "FailOnUserError"
SHM_VOLUME = "dshm"
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
# The GCS FUSE sidecar GKE injects unthrottled: "0" lifts each limit, as xpk sets them
# (AI-Hypercomputer/xpk@367c8382 src/xpk/core/storage.py GCS_FUSE_ANNOTATIONS).
GCSFUSE_SIDECAR_LIMITS = ("gke-gcsfuse/cpu-limit", "gke-gcsfuse/memory-limit",
                          "gke-gcsfuse/ephemeral-storage-limit")
# A hostNetwork pod (TPU) reaches the bucket with its own Kubernetes service account only with
# this volume attribute (GoogleCloudPlatform/gcs-fuse-csi-driver@5fcdc04a docs/authentication.md,
# pkg/csi_driver/controller.go VolumeContextKeyHostNetworkPodKSA; driver >= v1.17.2, GKE >= 1.29).
GCSFUSE_HOST_NETWORK_KSA = "hostNetworkPodKSA"


def coordinator_host(spec: RunSpec) -> str:
    """DNS name of slice 0, host 0 (JobSet's headless service; subdomain = JobSet name)."""
    return f"{spec.name}-{REPLICATED_JOB}-0-0.{spec.name}"


def default_pull_policy(image: str) -> str:
    """imagePullPolicy as the API server defaults it (core/v1 defaults.go
    SetDefaults_Container): Always when the tag is ``latest``, which
    parsers.ParseImageName also assumes for a reference with neither tag nor digest;
    IfNotPresent otherwise (any other tag, or a digest alone)."""
    name, _, digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]  # a registry's ":port" is never in the last component
    tag = last.rsplit(":", 1)[1] if ":" in last else ""
    if not tag and not digest:
        tag = "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


def launcher_argv(command: str) -> list[str]:
    """The user's container command: xrun's POSIX-sh launcher (``workload/launcher.sh``,
    copied into the shared folder by the init container) running ``/bin/sh -c COMMAND``.

    Nothing of xrun has to be in the user's image but /bin/sh. The command string travels
    as one argv element, so quotes, ``$``, ``;`` and newlines reach the shell exactly as
    written; ``$(XRUN_POD_DIR)`` is expanded by Kubernetes from the container's env.
    """
    return ["/bin/sh", f"$({Env.POD_DIR})/{PodFiles.LAUNCHER}", k8s_escape(command)]


def install_argv() -> list[str]:
    """The init container's command (xrun's image): copy the launcher into the shared folder
    and, with a ``workdir``, download the tree's archive, check its sha256 and unpack it."""
    return ["python3", "-m", "workload.sidecar", "install", f"$({Env.POD_DIR})"]


def code_dir() -> str:
    """Where the init container unpacks the shipped working tree (in the pod's shared folder)."""
    return f"{PodFiles.MOUNT_PATH}/{PodFiles.CODE}"


def install_env(spec: RunSpec) -> list[t.EnvVar]:
    """The init container's env: the folder, and with a ``workdir`` the archive to fetch."""
    env = [t.EnvVar(name=Env.POD_DIR, value=PodFiles.MOUNT_PATH)]
    if spec.code_sha256:
        env += [t.EnvVar(name=Env.STORAGE, value=k8s_escape(spec.storage)),
                t.EnvVar(name=Env.CODE_SHA256, value=spec.code_sha256)]
    return env


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
    if spec.code_sha256:  # the launcher runs the command in the unpacked tree
        static[Env.WORKDIR] = code_dir()
        static[Env.CODE_SHA256] = spec.code_sha256
    if shape.kind == "gpu":  # MaxText's GPU initialisation reads these (XPK's names)
        static[Env.JAX_COORDINATOR_IP] = coordinator_host(spec)
        static[Env.JAX_COORDINATOR_PORT] = str(spec.coordinator_port)
        static[Env.NNODES] = str(spec.hosts_per_slice)
    multislice = shape.kind == "tpu" and spec.slices > 1
    if multislice:
        # GKE's TPU webhook also provides MEGASCALE_* to multislice JobSet pods, which is why
        # GKE's guide (cloud.google.com/kubernetes-engine/docs/how-to/tpu-multislice) and xpk's
        # TPU workload template (AI-Hypercomputer/xpk@367c8382) set none. xrun names each
        # once, with the values GKE derives (slice 0 host 0, the JobSet's replicas, the
        # job-global-index, port 8080), so whichever source the container reads they agree, and
        # the user's env may not name them (reserved): never two entries of one name.
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
    # Platform env (driver path, JAX platform, the networking stack's NCCL settings): the
    # user's env of the same name replaces it rather than appearing twice.
    env += [t.EnvVar(name=k, value=k8s_escape(v)) for k, v in platform_env(shape).items()
            if k not in spec.env]
    env += [t.EnvVar(name=k, value=k8s_escape(v)) for k, v in nccl_profile_env(shape, spec.env).items()]
    # An empty value is expressed by leaving "value" out (Kubernetes reads it as "").
    env += [t.EnvVar(name=k, value=k8s_escape(v) if v else None) for k, v in spec.env.items()]
    names = [e.name for e in env]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # the last would silently win in the kubelet: a rendering bug, never shipped
        raise XrunError(f"env: {', '.join(twice)} would be set twice in the workload container")
    return env


def nccl_profile_env(shape: Shape, user_env: dict[str, str]) -> dict[str, str]:
    """What the launcher needs to give a GPU stack the env of the NCCL plugin on the node:
    the plugin's env file (sourced when present), the fallback values (exported when it is
    absent; the user's names left out) and the user's names (kept over both)."""
    stack = shape.networking if shape.kind == "gpu" else None
    if stack is None or not stack.env_profile:
        return {}
    out = {Env.NCCL_ENV_PROFILE: stack.env_profile}
    fallback = "\n".join(f"{k}={v}" for k, v in stack.env_fallback.items() if k not in user_env)
    if fallback:
        out[Env.NCCL_ENV_FALLBACK] = fallback
    if user_env:
        out[Env.USER_ENV] = " ".join(user_env)
    return out


def platform_env(shape: Shape) -> dict[str, str]:
    """What a GPU container needs to find its driver and NCCL plugin and to refuse CPU:
    ``LD_LIBRARY_PATH`` with GKE's driver mount, ``JAX_PLATFORMS`` pinned, and the
    networking stack's env (accelerators.yaml)."""
    if shape.kind != "gpu":
        return {}
    out = {"LD_LIBRARY_PATH": GKE_NVIDIA_LIB64, "JAX_PLATFORMS": JAX_PLATFORMS_FOR["gpu"]}
    if shape.networking:
        out.update(shape.networking.env)
    return out


def interfaces_annotation(networks: list[str] | tuple[str, ...]) -> str:
    """GKE multi-networking: eth0 on the pod network, eth1.. on the named Network objects."""
    nics = [{"interfaceName": "eth0", "network": "default"}]
    nics += [{"interfaceName": f"eth{i}", "network": n} for i, n in enumerate(networks, 1)]
    return json.dumps(nics, separators=(",", ":"))


def pod_annotations(spec: RunSpec) -> dict[str, str]:
    """Pod-template annotations: the GPU networking stack's (interfaces, device access),
    the GCS FUSE driver's, Kueue's topology request, then the run file's."""
    stack = spec.shape.networking
    out: dict[str, str] = {}
    if stack is not None:
        out.update(stack.annotations)
        if stack.networks:
            out[Annotations.DEFAULT_INTERFACE] = "eth0"
            out[Annotations.NETWORK_INTERFACES] = interfaces_annotation(spec.networks or stack.networks)
    if any("bucket" in m for m in spec.mounts):
        out[Annotations.GCSFUSE_VOLUMES] = "true"
        out.update(dict.fromkeys(GCSFUSE_SIDECAR_LIMITS, "0"))
    out.update(kueue_topology_annotations(spec))
    return merge_keys("pod_annotations", out, spec.pod_annotations,
                      "from accelerator, mounts and kueue_topology")


def kueue_topology_annotations(spec: RunSpec) -> dict[str, str]:
    """Kueue's topology request for the run's one PodSet (the replicatedJob: every pod of
    every slice). ``required`` with one slice: the whole PodSet in one domain. With several
    slices that can never be admitted (each slice is a node pool of its own), so each slice
    (``hosts_per_slice`` pods) is required in a domain of its own: Kueue's two-level request,
    ``podset-slice-required-topology`` + ``podset-slice-size`` (kueue v0.17
    apis/kueue/v1beta2/topology_types.go, pkg/controller/jobframework/tas_validation.go: a
    slice-only request is valid; the size is required and at most the PodSet's count)."""
    if not spec.kueue_topology:
        return {}
    mode, _, level = spec.kueue_topology.partition(":")
    if mode != "required":
        return {Annotations.KUEUE_PREFERRED_TOPOLOGY: level}
    if spec.slices > 1:
        return {Annotations.KUEUE_SLICE_REQUIRED_TOPOLOGY: level,
                Annotations.KUEUE_SLICE_SIZE: str(spec.hosts_per_slice)}
    return {Annotations.KUEUE_REQUIRED_TOPOLOGY: level}


def decorate_gpu(pod: t.PodSpec, container: t.Container, stack: Networking) -> None:
    """Add a networking stack's volumes, native sidecars, mounts and tolerations (copies:
    the catalogue's objects are shared)."""
    pod.volumes += copy.deepcopy(list(stack.volumes))
    for sidecar in copy.deepcopy(list(stack.sidecars)):
        sidecar.restart_policy = "Always"  # a native sidecar: the Job ends with the workload
        pod.init_containers.append(sidecar)
    container.volume_mounts += copy.deepcopy(list(stack.mounts))
    pod.tolerations += copy.deepcopy(list(stack.tolerations))


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
        t.EnvVar(name=Env.DRAIN_SECONDS, value=str(drain_seconds(spec.termination_grace_seconds))),
    ]


def uses_pod_code(spec: RunSpec) -> bool:
    """Whether xrun's containers run ``xrun_python_image`` with xrun's pod code from storage
    (``manifests.podcode``): no ``xrun_image``, and the orchestrator named the code."""
    return bool(spec.pod_code_sha256) and not spec.xrun_image


def xrun_image_of(spec: RunSpec) -> str:
    """The image xrun's own containers run: ``xrun_image``, the public python image
    (``uses_pod_code``), or, for a local run (which runs this checkout), xrun's image name."""
    if uses_pod_code(spec):
        return spec.xrun_python_image
    return spec.xrun_image or DEFAULT_XRUN_IMAGE


def pod_code_env(spec: RunSpec) -> list[t.EnvVar]:
    """What the bootstrap needs to fetch xrun's pod code (none with ``xrun_image``)."""
    if not uses_pod_code(spec):
        return []
    return [t.EnvVar(name=Env.POD_CODE_SHA256, value=spec.pod_code_sha256)]


def xrun_containers(spec: RunSpec) -> list[t.Container]:
    """xrun's part of the pod (``xrun_image_of``): the launcher installer (a plain init
    container: done before anything else starts) and the log shipper (a native sidecar,
    restartPolicy Always, Kubernetes >= 1.29: started before the workload, restarted if it
    dies, stopped only after the workload container ended)."""
    mount = [t.VolumeMount(name=POD_VOLUME, mount_path=PodFiles.MOUNT_PATH)]
    image = xrun_image_of(spec)
    install, ship = install_argv(), ship_argv()
    init_env, ship_env = install_env(spec), logs_env(spec)
    if uses_pod_code(spec):
        install, ship = boot_argv("install", f"$({Env.POD_DIR})"), boot_argv("ship")
        if not any(e.name == Env.STORAGE for e in init_env):
            init_env.append(t.EnvVar(name=Env.STORAGE, value=k8s_escape(spec.storage)))
        init_env += pod_code_env(spec)
        ship_env += pod_code_env(spec)
    return [
        t.Container(name=INIT_CONTAINER, image=image, image_pull_policy=default_pull_policy(image),
                    command=install, env=init_env, volume_mounts=list(mount)),
        t.Container(name=LOGS_CONTAINER, image=image, image_pull_policy=default_pull_policy(image),
                    command=ship, env=ship_env, volume_mounts=list(mount),
                    restart_policy="Always"),
    ]


def pod_spec(spec: RunSpec) -> t.PodSpec:
    shape = spec.shape
    container = t.Container(
        name=CONTAINER,
        image=spec.image,
        image_pull_policy=default_pull_policy(spec.image),
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
        if shape.networking:
            decorate_gpu(pod, container, shape.networking)
    # A GPU stack attaches its NICs through networking.gke.io annotations: no hostNetwork.
    if shape.kind == "tpu" or (shape.kind == "gpu" and not (shape.networking and shape.networking.networks)):
        pod.host_network = True
        pod.dns_policy = "ClusterFirstWithHostNet"
    if spec.service_account:
        pod.service_account_name = spec.service_account
    pod.image_pull_secrets = [t.LocalObjectReference(name=n) for n in spec.image_pull_secrets]
    if spec.priority_class_name:
        pod.priority_class_name = spec.priority_class_name
    if spec.privileged:
        container.security_context = t.SecurityContext(privileged=True)
    apply_capacity(spec, pod)
    apply_placement(spec, pod)
    apply_mounts(spec, pod, container)
    if spec.scheduler == TOPOLOGY_AWARE_SCHEDULER and shape.kind == "gpu":
        # GKE's topology-aware scheduler releases pods gated so; xpk adds the gate to GPU
        # workloads only (src/xpk/core/scheduling.py get_gpu_scheduler, called from
        # commands/workload.py for AcceleratorType.GPU). spec.validate refuses it elsewhere
        # and refuses a name that would make the gate longer than a qualified name allows.
        pod.scheduling_gates = [t.PodSchedulingGate(name=topology_gate(spec.name))]
    elif spec.scheduler:
        pod.scheduler_name = spec.scheduler
    return pod


def _toleration(key: str) -> t.Toleration:
    return t.Toleration(key=key, operator="Equal", value="true", effect="NoSchedule")


def reservation_parts(capacity: str) -> tuple[str, str]:
    """(project, name) of ``reservation:NAME`` or ``reservation:projects/P/reservations/NAME``
    (a shared reservation, the path Compute Engine's reservationAffinity values take; project
    "" for the cluster's own)."""
    path = capacity.removeprefix("reservation:")
    parts = path.split("/")
    if len(parts) == 4 and parts[0] == "projects" and parts[2] == "reservations":
        return parts[1], parts[3]
    return "", path


def capacity_placement(capacity: str) -> tuple[dict[str, str], list[t.Toleration]]:
    """The node selector and tolerations a ``capacity`` value needs.

    spot: GKE labels and taints Spot nodes ``cloud.google.com/gke-spot=true`` (GKE "Spot
    VMs"; xpk capacity.py get_capacity_node_selectors_from_capacity_type).

    reservation: ``cloud.google.com/reservation-name`` alone, as xpk selects it: the nodes of
    a Standard node pool made with ``--reservation-affinity=specific --reservation=NAME``
    carry that label, not ``reservation-affinity``, which only GKE's own examples for
    Autopilot and node auto-provisioning put in the selector (GKE "Consuming reserved zonal
    resources"). A shared reservation (``projects/P/reservations/NAME``) adds
    ``cloud.google.com/reservation-project: P``: a label value cannot hold the path's
    slashes (xpk's to_reservation_path puts it there; the API server refuses it).

    flex-start: every flex-start node is labelled ``cloud.google.com/gke-flex-start=true``,
    and the nodes of a queued-provisioning pool are also tainted
    ``cloud.google.com/gke-queued`` (NoSchedule), which GKE's examples tolerate; nothing
    labels them gke-queued (GKE "Run a small batch workload with flex-start" and "Run a
    large-scale workload with flex-start with queued provisioning"). One selector serves both
    kinds; with a queue, Kueue admits the run (its ProvisioningRequest admission check asks
    for the queued nodes), without one the cluster autoscaler adds flex-start nodes.
    """
    if capacity == "spot":
        return {Labels.SPOT: "true"}, [_toleration(Labels.SPOT)]
    if capacity.startswith("reservation:"):
        project, name = reservation_parts(capacity)
        selector = {Labels.RESERVATION_NAME: name}
        if project:
            selector[Labels.RESERVATION_PROJECT] = project
        return selector, []
    if capacity == "flex-start":
        return {Labels.FLEX_START: "true"}, [t.Toleration(key=Taints.QUEUED, operator="Exists",
                                                           effect="NoSchedule")]
    return {}, []


def apply_capacity(spec: RunSpec, pod: t.PodSpec) -> None:
    selector, tolerations = capacity_placement(spec.capacity)
    pod.node_selector.update(selector)
    pod.tolerations += tolerations


def merge_keys(field: str, ours: dict[str, str], theirs: dict[str, str], why: str) -> dict[str, str]:
    """``theirs`` (the run file's) over ``ours`` (xrun's): equal values merge, a different
    value for one of xrun's keys is bad input naming both."""
    for key, value in theirs.items():
        if key in ours and ours[key] != value:
            raise XrunError(f"{field}: {key}={value!r} conflicts with xrun's {key}={ours[key]!r} ({why})")
    return {**ours, **theirs}


def apply_placement(spec: RunSpec, pod: t.PodSpec) -> None:
    """The run file's node_selector and tolerations on top of what xrun renders."""
    pod.node_selector = merge_keys("node_selector", pod.node_selector, spec.node_selector,
                                   f"from accelerator: {spec.accelerator}, capacity: {spec.capacity}")
    for tol in spec.tolerations:
        typed = t.Toleration(key=tol.get("key") or None, operator=tol.get("operator", "Equal"),
                             value=tol.get("value") or None, effect=tol.get("effect") or None,
                             toleration_seconds=tol.get("toleration_seconds"))
        if typed not in pod.tolerations:
            pod.tolerations.append(typed)


def apply_mounts(spec: RunSpec, pod: t.PodSpec, container: t.Container) -> None:
    """GCS buckets through the GCS FUSE CSI driver (an ephemeral CSI volume; the pod
    annotation makes GKE inject the driver's sidecar) and existing PVCs."""
    taken = {m.mount_path.rstrip("/"): m.name for m in container.volume_mounts}
    for i, mount in enumerate(spec.mounts):
        path = mount["path"].rstrip("/") or "/"
        if path in taken:
            raise XrunError(f"mounts[{i}].path: {path} is where xrun mounts its volume {taken[path]!r}")
        name = f"mount-{i}"
        read_only = bool(mount.get("read_only", False))
        if "bucket" in mount:
            attributes = {"bucketName": mount["bucket"]}
            if mount.get("options"):
                attributes["mountOptions"] = mount["options"]
            if pod.host_network:
                attributes[GCSFUSE_HOST_NETWORK_KSA] = "true"
            pod.volumes.append(t.Volume(name=name, csi=t.CSIVolumeSource(
                driver=GCSFUSE_DRIVER, read_only=read_only or None, volume_attributes=attributes)))
        else:
            pod.volumes.append(t.Volume(name=name, persistent_volume_claim=t.PersistentVolumeClaimVolumeSource(
                claim_name=mount["pvc"], read_only=read_only or None)))
        container.volume_mounts.append(t.VolumeMount(name=name, mount_path=mount["path"], read_only=read_only or None))


def labels(spec: RunSpec) -> dict[str, str]:
    out = {Labels.RUN: spec.name, Labels.MANAGED_BY: MANAGED_BY}
    if spec.queue_name:
        out[Labels.QUEUE_NAME] = spec.queue_name
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
    pod_labels = merge_keys("pod_labels", run_label, spec.pod_labels, "xrun's run label")
    job = t.JobTemplateSpec(
        metadata=t.ObjectMeta(labels=dict(run_label)),
        spec=t.JobSpec(
            parallelism=hosts,
            completions=hosts,
            completion_mode="Indexed",
            backoff_limit=0,
            pod_failure_policy=pod_failure_policy(spec),
            template=t.PodTemplateSpec(metadata=t.ObjectMeta(labels=pod_labels,
                                                             annotations=pod_annotations(spec)),
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
            # flex-start through Kueue: created suspended; Kueue unsuspends it once its
            # ProvisioningRequest admission check has the nodes (Kueue's jobframework suspends
            # Kueue jobs the same way). Without a queue the autoscaler adds the nodes.
            suspend=True if spec.capacity == "flex-start" and spec.queue_name else None,
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
