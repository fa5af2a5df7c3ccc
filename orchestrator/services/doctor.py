"""``xrun doctor``: can this cluster and storage root run xrun's JobSets? One line per check.

Checks, in order: the API answers (and which Kubernetes it is); the JobSet CRD is installed
and serves ``v1alpha2`` (falling back to API discovery when RBAC hides CRDs); the Kueue
LocalQueue exists when a queue is named; nodes carry the accelerator (and TPU topology)
labels the manifest's nodeSelector asks for, or a cluster autoscaler could add them; the
storage root takes a write. Everything goes through :class:`KubeBackend` (the official
client) and the storage interface; nothing shells out.

Exit code: 3 when the API or the storage root cannot be reached (nothing else can be
trusted), 1 when any other check fails, 0 otherwise (warnings included).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from manifests.catalogue import Shape
from orchestrator.backends.kube.backend import (
    INSTALL_HINT,
    JOBSET_CRD,
    KUEUE_GROUP,
    VERSION,
    KubeBackend,
)
from xrun_contract.errors import XrunError
from xrun_contract.k8s import Labels

OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"
AUTOSCALER_STATUS = ("kube-system", "cluster-autoscaler-status")


@dataclass
class Check:
    name: str
    result: str  # ok | warn | FAIL | skip
    detail: str
    exit_code: int = 0  # what a FAIL means for the command's exit code

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_api(backend: KubeBackend) -> Check:
    try:
        version = backend.server_version()
    except XrunError as e:
        return Check("api", FAIL, str(e), e.exit_code)
    return Check("api", OK, f"API reachable at {backend.host} (context {backend.context_name or '?'}, "
                            f"Kubernetes {version}), namespace {backend.namespace}")


def check_jobset(backend: KubeBackend) -> Check:
    try:
        crd = backend.jobset_crd()
    except XrunError as e:
        if e.exit_code != 1 or "forbidden" not in str(e):
            return Check("jobset", FAIL, str(e), e.exit_code)
        return _jobset_by_discovery(backend)
    if crd is None:
        return Check("jobset", FAIL, f"JobSet CRD {JOBSET_CRD} not installed; {INSTALL_HINT}", 1)
    versions = (crd.get("spec") or {}).get("versions") or []
    served = [v.get("name", "") for v in versions if v.get("served")]
    stored = next((v.get("name") for v in versions if v.get("storage")), "?")
    if VERSION not in served:
        return Check("jobset", FAIL, f"JobSet CRD serves {', '.join(served) or 'nothing'}, xrun needs {VERSION}: "
                                     f"upgrade JobSet ({INSTALL_HINT})", 1)
    return Check("jobset", OK, f"JobSet CRD {JOBSET_CRD} installed: served {', '.join(served)} "
                               f"(storage {stored}); xrun uses {VERSION}")


def _jobset_by_discovery(backend: KubeBackend) -> Check:
    group = JOBSET_CRD.split(".", 1)[1]
    try:
        entry = backend.api_group(group)
    except XrunError as e:
        return Check("jobset", FAIL, str(e), e.exit_code)
    served = [v.get("version", "") for v in (entry or {}).get("versions") or []]
    if VERSION not in served:
        what = f"serves {', '.join(served)}" if served else "is not served"
        return Check("jobset", FAIL, f"{group} {what}; xrun needs {VERSION} ({INSTALL_HINT})", 1)
    return Check("jobset", OK, f"JobSet API {group}/{VERSION} served (served {', '.join(served)}; "
                               "the CRD itself is not readable with your RBAC)")


def check_queue(backend: KubeBackend, queue: str) -> Check:
    try:
        group = backend.api_group(KUEUE_GROUP)
        if group is None:
            return Check("kueue", FAIL, f"queue {queue!r} is named but Kueue is not installed "
                                        f"(the API serves no {KUEUE_GROUP})", 1)
        version = (group.get("preferredVersion") or {}).get("version") or group["versions"][0]["version"]
        lq = backend.local_queue(queue, version)
    except XrunError as e:
        return Check("kueue", FAIL, str(e), e.exit_code)
    if lq is None:
        return Check("kueue", FAIL, f"LocalQueue {queue!r} not found in namespace {backend.namespace!r} "
                                    f"({KUEUE_GROUP}/{version})", 1)
    cq = (lq.get("spec") or {}).get("clusterQueue", "?")
    return Check("kueue", OK, f"LocalQueue {backend.namespace}/{queue} exists (ClusterQueue {cq}, {KUEUE_GROUP}/{version})")


def node_selector(shape: Shape) -> str:
    """The label selector matching the nodeSelector the manifest gives this shape's pods."""
    if shape.kind == "tpu":
        return f"{Labels.TPU_ACCELERATOR}={shape.gke_accelerator},{Labels.TPU_TOPOLOGY}={shape.topology}"
    return f"{Labels.GPU_ACCELERATOR}={shape.gke_accelerator}"


def check_nodes(backend: KubeBackend, shape: Shape, needed: int) -> Check:
    if shape.kind == "cpu":
        return Check("nodes", SKIP, f"{shape.name} needs no accelerator nodes")
    selector = node_selector(shape)
    try:
        nodes = backend.nodes(selector)
    except XrunError as e:
        if e.exit_code == 1:
            return Check("nodes", WARN, f"cannot list nodes to look for {selector}: {e}")
        return Check("nodes", FAIL, str(e), e.exit_code)
    ready = sum(
        1 for n in list(nodes)
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in (n.get("status") or {}).get("conditions") or [])
    )
    have = f"{len(nodes)} node(s) labelled {selector} ({ready} Ready); {shape.name} needs {needed}"
    if len(nodes) >= needed:
        return Check("nodes", OK, have)
    try:
        autoscaler = backend.config_map(*AUTOSCALER_STATUS)
    except XrunError:
        autoscaler = None
    if autoscaler is not None:
        return Check("nodes", WARN, f"{have}; the cluster autoscaler is on ({'/'.join(AUTOSCALER_STATUS)}), so an "
                                    "autoscaling node pool with these labels can add them (node pools are not "
                                    "visible through the Kubernetes API: check yours has this accelerator and topology)")
    what = f"topology {shape.topology}" if shape.topology else "accelerator"
    return Check("nodes", FAIL, f"{have}, and no cluster autoscaler: create a node pool with "
                                f"{shape.gke_accelerator} {what} and {needed} nodes", 1)


def check_storage(root: str, for_cluster: bool = True) -> Check:
    from xrun_contract.storage import open_storage

    if for_cluster and not root.startswith("gs://"):
        return Check("storage", FAIL, f"storage root {root} is a local folder: cluster runs need gs://bucket/prefix "
                                      "(--storage or XRUN_STORAGE)", 1)
    folder = f".xrun-doctor/{uuid.uuid4().hex}"
    key = f"{folder}/probe"
    try:
        storage = open_storage(root)
        payload = f"xrun doctor {time.time()}".encode()
        storage.write_bytes(key, payload)
        back = storage.read_bytes(key)
        storage.delete_prefix(folder)
    except Exception as e:  # noqa: BLE001 - any client error means the root is unusable
        return Check("storage", FAIL, f"storage root {root} not writable: {type(e).__name__}: {' '.join(str(e).split())[:200]}", 3)
    if back != payload:
        return Check("storage", FAIL, f"storage root {root}: wrote a probe object but read back something else", 3)
    return Check("storage", OK, f"storage root {storage.url()} writable")


def run_checks(backend: KubeBackend, *, shape: Shape | None, needed_nodes: int, queue: str,
               storage_root: str) -> list[Check]:
    checks = [check_api(backend)]
    if checks[0].result == FAIL:
        checks.append(Check("cluster", SKIP, "JobSet, Kueue and node checks skipped: the API is not reachable"))
    else:
        checks.append(check_jobset(backend))
        if queue:
            checks.append(check_queue(backend, queue))
        if shape is not None:
            checks.append(check_nodes(backend, shape, needed_nodes))
    checks.append(check_storage(storage_root))
    return checks


def exit_code(checks: list[Check]) -> int:
    codes = {c.exit_code or 1 for c in checks if c.result == FAIL}
    return 3 if 3 in codes else (max(codes) if codes else 0)


@dataclass
class DoctorInputs:
    """The few run fields doctor needs: file values, flags over them, defaults under both."""

    context: str = ""
    namespace: str = "default"
    accelerator: str = ""
    num_slices: int = 1
    nodes: int = 1
    cpu_devices_per_host: int = 2
    queue: str = ""
    storage: str = ""


def inputs(run_file: str | None, flags: dict[str, Any]) -> DoctorInputs:
    from orchestrator import settings
    from orchestrator.runfile import read_run_file

    values: dict[str, Any] = {}
    if run_file:
        data = read_run_file(run_file)
        values = {k: data[k] for k in ("accelerator", "num_slices", "nodes", "cpu_devices_per_host",
                                       "queue", "namespace", "context", "storage") if data.get(k) is not None}
    values.update({k: v for k, v in flags.items() if v is not None})
    for key in ("num_slices", "nodes"):
        value = values.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise XrunError(f"{key}: must be an integer >= 1, got {value!r}")
    values["storage"] = settings.storage_root(values.get("storage"))
    return DoctorInputs(**{k: v for k, v in values.items() if k in DoctorInputs.__dataclass_fields__})


def doctor(v: DoctorInputs) -> tuple[list[Check], int]:
    """Every check for the inputs' cluster, shape and storage, and the exit code."""
    from manifests import catalogue

    shape, needed = None, 0
    if v.accelerator:
        try:
            shape = catalogue.lookup(str(v.accelerator), int(v.cpu_devices_per_host))
        except catalogue.UnknownAccelerator as e:
            raise XrunError(f"accelerator: {e}") from None
        needed = shape.vms * v.num_slices if shape.kind == "tpu" else v.nodes
    backend = KubeBackend(v.context or None, v.namespace or "default")
    results = run_checks(backend, shape=shape, needed_nodes=needed, queue=v.queue,
                         storage_root=v.storage)
    return results, exit_code(results)
