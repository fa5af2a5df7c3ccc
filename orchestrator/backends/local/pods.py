"""A rendered JobSet's pods as the processes a local supervisor runs: each pod's
containers (init, native sidecars, main) with their env resolved the way Kubernetes and
JobSet resolve it for that pod (Downward-API fields, ``$(VAR)`` expansion, emptyDir paths,
the coordinator's DNS name mapped to 127.0.0.1 and a free port).
"""

from __future__ import annotations

import os
import random
import socket
import string
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

from orchestrator.backends.local.k8s_env import expand
from xrun_contract import (
    Env,
    host_id,
)
from xrun_contract.errors import EXIT_FAILED, XrunError
from xrun_contract.k8s import Annotations, Labels

# The Job controller adds this env to every container of an Indexed Job's pods
# (kubernetes pkg/controller/job/indexed_job_utils.go addCompletionIndexEnvVariables).
JOB_COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"
LOCAL_LOG_FLUSH_SECONDS = "0.5"  # a local pod's log shipper flushes this often


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Container:
    """One container of a pod, as the process it would run."""

    name: str
    argv: list[str]
    env: dict[str, str]
    sidecar: bool = False  # an init container with restartPolicy Always
    proc: subprocess.Popen | None = None


@dataclass
class Pod:
    """One pod of the JobSet: its init containers and sidecars, then the main container."""

    slice_index: int
    host_index: int
    name: str
    argv: list[str]
    env: dict[str, str]
    init: list[Container] = field(default_factory=list)
    container: str = ""  # the main container's name
    folder: str = ""  # the pod's emptyDir volumes live below (made when the pod starts)
    volumes: list[str] = field(default_factory=list)  # emptyDir folders, below folder
    proc: subprocess.Popen | None = None  # the main container's process
    exit_code: int | None = None
    failed_container: str = ""  # whose exit code exit_code is
    exited_at: float | None = None  # monotonic time the pod ended (sidecars stopped)
    # When its main container (or a failing init container) ended: a host whose failure
    # brings the others down within milliseconds is the one to blame, however long its
    # sidecar then takes to drain the log.
    failed_at: float | None = None
    stopping: bool = False
    deadline: float | None = None  # monotonic SIGKILL time of a stop
    replicated_job: str = ""  # the replicatedJob its Job belongs to
    job: str = ""  # its Job's name, <jobset>-<replicatedJob>-<index>
    namespace: str = "default"

    @property
    def host(self) -> str:
        return host_id(self.slice_index, self.host_index)


def _field_value(path: str, meta: dict[str, Any]) -> str:
    """Resolve a Downward-API fieldPath against the pod's would-be metadata."""
    if path == "metadata.name":
        return meta["name"]
    if path == "metadata.namespace":
        return meta["namespace"]
    for kind in ("labels", "annotations"):
        prefix = f"metadata.{kind}['"
        if path.startswith(prefix) and path.endswith("']"):
            key = path[len(prefix):-2]
            if key not in meta[kind]:
                raise XrunError(f"manifest: fieldRef {path} names a {kind[:-1]} the pod will not have", EXIT_FAILED)
            return meta[kind][key]
    raise XrunError(f"manifest: unsupported fieldRef {path}", EXIT_FAILED)


def _resolve_env(container: dict[str, Any], meta: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "valueFrom" in item:
            ref = item["valueFrom"].get("fieldRef")
            if not ref:
                raise XrunError(f"manifest: env {item['name']}: only fieldRef is supported locally", EXIT_FAILED)
            env[item["name"]] = _field_value(ref["fieldPath"], meta)
        else:
            env[item["name"]] = expand(item.get("value", ""), env)
    return env


def _suffix() -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=5))


def _mounts(container: dict[str, Any], volumes: dict[str, str]) -> dict[str, str]:
    """mountPath -> host folder for the container's emptyDir mounts (not /dev/shm)."""
    return {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts", [])
            if m.get("name") in volumes}


def _container(container: dict[str, Any], meta: dict[str, Any], port: int,
               volumes: dict[str, str], completion_index: int) -> Container:
    env = {JOB_COMPLETION_INDEX_ENV: str(completion_index), **_resolve_env(container, meta)}
    _localise(env, port)
    for mount_path, folder in _mounts(container, volumes).items():
        for key, value in env.items():
            if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                env[key] = folder + value[len(mount_path.rstrip("/")):]
    argv = [expand(a, env) for a in container.get("command", []) + container.get("args", [])]
    if not argv:
        raise XrunError(f"manifest: container {container.get('name')} has no command; local runs need one",
                        EXIT_FAILED)
    if argv[0] in ("python3", "python"):
        argv[0] = sys.executable  # the image's python is this environment's python
    return Container(container["name"], argv, env, sidecar=container.get("restartPolicy") == "Always")


def plan_pods(manifest: dict[str, Any], attempt: int, port: int, root: str | None = None) -> list[Pod]:
    """Every pod of the JobSet with its containers' argv and env as the cluster would give
    them; emptyDir volumes are folders under ``root`` (the temporary folder when None).

    Nothing is written: the pod's runner makes its folders when the pod starts and removes
    them when it ends, so a plan that is never run (a bad manifest, a test) leaves nothing."""
    name = manifest["metadata"]["name"]
    namespace = manifest["metadata"].get("namespace", "default")
    pods: list[Pod] = []
    global_index = 0
    for rj in manifest["spec"]["replicatedJobs"]:
        job = rj["template"]["spec"]
        pod_template = job["template"]
        (container,) = pod_template["spec"]["containers"]
        inits = pod_template["spec"].get("initContainers", [])
        empty_dirs = [v["name"] for v in pod_template["spec"].get("volumes", [])
                      if "emptyDir" in v and v["emptyDir"].get("medium") != "Memory"]
        for job_index in range(rj.get("replicas", 1)):
            for completion_index in range(job.get("parallelism", 1)):
                meta = {
                    "name": f"{name}-{rj['name']}-{job_index}-{completion_index}-{_suffix()}",
                    "namespace": namespace,
                    "labels": {
                        **pod_template.get("metadata", {}).get("labels", {}),
                        Labels.JOBSET_NAME: name,
                        Labels.REPLICATED_JOB_NAME: rj["name"],
                        Labels.JOB_INDEX: str(job_index),
                        Labels.JOB_GLOBAL_INDEX: str(global_index),
                        Labels.RESTART_ATTEMPT: str(attempt),
                        Labels.COMPLETION_INDEX: str(completion_index),
                    },
                    "annotations": {
                        Annotations.COMPLETION_INDEX: str(completion_index),
                        Annotations.JOB_GLOBAL_INDEX: str(global_index),
                    },
                }
                # mkdtemp's name, made when the pod starts (os.mkdir refuses an existing one)
                folder = os.path.join(root or tempfile.gettempdir(), f"{meta['name']}-{_suffix()}{_suffix()}")
                volumes = {v: os.path.join(folder, v) for v in empty_dirs}
                main = _container(container, meta, port, volumes, completion_index)
                env = main.env
                pods.append(Pod(int(env.get(Env.SLICE_INDEX, global_index)),
                                int(env.get(Env.HOST_INDEX, completion_index)),
                                meta["name"], main.argv, env,
                                init=[_container(c, meta, port, volumes, completion_index) for c in inits],
                                container=container["name"], folder=folder,
                                volumes=list(volumes.values()), replicated_job=rj["name"],
                                job=f"{name}-{rj['name']}-{job_index}", namespace=namespace))
            global_index += 1
    return pods


def _localise(env: dict[str, str], port: int) -> None:
    """Cluster DNS and accelerators do not exist here: map them to 127.0.0.1 and CPUs."""
    for name in (Env.COORDINATOR_ADDRESS, Env.JAX_COORDINATOR_ADDRESS):
        if name in env:
            env[name] = f"127.0.0.1:{port}"
    for name in (Env.MEGASCALE_COORDINATOR_ADDRESS, Env.JAX_COORDINATOR_IP):
        if name in env:
            env[name] = "127.0.0.1"
    if Env.JAX_COORDINATOR_PORT in env:
        env[Env.JAX_COORDINATOR_PORT] = str(port)
    env[Env.PLATFORM] = "cpu"
    if "JAX_PLATFORMS" in env:  # a GPU pod pins cuda (xrun_contract.JAX_PLATFORMS_FOR)
        env["JAX_PLATFORMS"] = "cpu"
    env.setdefault(Env.LOG_FLUSH_SECONDS, LOCAL_LOG_FLUSH_SECONDS)
