"""The embedded default's supervisor: run a rendered JobSet as host processes.

A detached supervisor process (``python -m orchestrator.backends.local supervise ROOT NAME``)
reads ``manifest.yaml`` from the storage root and, for each slice x host, starts the
container's command with its env resolved the way Kubernetes and JobSet would resolve it
for that pod: Downward-API fields (completion index, job-global-index, restart attempt, pod
name), ``$(VAR)`` expansion, the coordinator's DNS name mapped to 127.0.0.1 and a free
port, the accelerator replaced by as many CPU devices per host as the shape has chips.

JobSet semantics, taken from the manifest itself: success when every pod exits 0; a pod
whose exit code matches the Job's podFailurePolicy ``FailJob`` rule fails the Job with
reason PodFailurePolicy, which the JobSet failurePolicy rule turns into FailJobSet; any
other failure restarts the whole set (SIGTERM to every pod, SIGKILL after the grace
period) while ``restarts < maxRestarts``. Every transition is written to ``state.json``.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import string
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.backends.local.k8s_env import expand
from xrun_contract import (
    DELETED,
    FAILED,
    PENDING,
    RESTARTING,
    RUNNING,
    SUCCEEDED,
    TERMINAL_STATES,
    Env,
    Layout,
    host_id,
)
from xrun_contract.errors import EXIT_FAILED, XrunError, exit_code_of_returncode
from xrun_contract.k8s import Annotations, JobFailureReasons, Labels
from xrun_contract.storage import Storage, open_storage

POLL_SECONDS = 0.2
LOCAL_LOG_FLUSH_SECONDS = "0.5"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Pod:
    """One pod of the JobSet, as a local process."""

    slice_index: int
    host_index: int
    name: str
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    exit_code: int | None = None
    exited_at: float | None = None  # monotonic time the process was reaped

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


def plan_pods(manifest: dict[str, Any], attempt: int, port: int) -> list[Pod]:
    """Every pod of the JobSet with its argv and env as the cluster would give them."""
    name = manifest["metadata"]["name"]
    namespace = manifest["metadata"].get("namespace", "default")
    pods: list[Pod] = []
    global_index = 0
    for rj in manifest["spec"]["replicatedJobs"]:
        job = rj["template"]["spec"]
        pod_template = job["template"]
        (container,) = pod_template["spec"]["containers"]
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
                env = _resolve_env(container, meta)
                _localise(env, port)
                argv = [expand(a, env) for a in container.get("command", []) + container.get("args", [])]
                if not argv:
                    raise XrunError("manifest: the container has no command; local runs need one", EXIT_FAILED)
                if argv[0] in ("python3", "python"):
                    argv[0] = sys.executable  # the image's python is this environment's python
                pods.append(Pod(int(env.get(Env.SLICE_INDEX, global_index)),
                                int(env.get(Env.HOST_INDEX, completion_index)),
                                meta["name"], argv, env))
            global_index += 1
    return pods


def _localise(env: dict[str, str], port: int) -> None:
    """Cluster DNS and accelerators do not exist here: map them to 127.0.0.1 and CPUs."""
    if Env.COORDINATOR_ADDRESS in env:
        env[Env.COORDINATOR_ADDRESS] = f"127.0.0.1:{port}"
    if Env.MEGASCALE_COORDINATOR_ADDRESS in env:
        env[Env.MEGASCALE_COORDINATOR_ADDRESS] = "127.0.0.1"
    env[Env.PLATFORM] = "cpu"
    if "JAX_PLATFORMS" in env:  # a GPU pod pins cuda (xrun_contract.JAX_PLATFORMS_FOR)
        env["JAX_PLATFORMS"] = "cpu"
    env.setdefault(Env.LOG_FLUSH_SECONDS, LOCAL_LOG_FLUSH_SECONDS)


def _fails_job_for_good(job_spec: dict[str, Any], code: int) -> bool:
    """Does the Job's podFailurePolicy FailJob rule match this exit code?"""
    for rule in job_spec.get("podFailurePolicy", {}).get("rules", []):
        on = rule.get("onExitCodes")
        if rule.get("action") != "FailJob" or not on or code == 0:
            continue
        values = set(on.get("values", []))
        if (on.get("operator") == "In") == (code in values):
            return True
    return False


def _jobset_fails_on_policy(manifest: dict[str, Any]) -> bool:
    rules = manifest["spec"].get("failurePolicy", {}).get("rules", [])
    return any(
        r.get("action") == "FailJobSet"
        and JobFailureReasons.POD_FAILURE_POLICY in r.get("onJobFailureReasons", [])
        for r in rules
    )


def base_env() -> dict[str, str]:
    """The host environment a local pod inherits: PATH with this python first, no XRUN_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_") and not k.startswith("MEGASCALE_")}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONUNBUFFERED"] = "1"
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    return env


@dataclass
class Supervisor:
    storage: Storage
    name: str
    manifest: dict[str, Any] = field(init=False)
    state: dict[str, Any] = field(init=False)
    pods: list[Pod] = field(default_factory=list)
    stop_requested: bool = False

    def __post_init__(self) -> None:
        text = self.storage.read_text(Layout.manifest(self.name))
        if text is None:
            raise XrunError(f"no manifest for run {self.name} under {self.storage.root}", EXIT_FAILED)
        self.manifest = yaml.safe_load(text)
        self.state = {
            "backend": "local", "state": PENDING, "restarts": 0, "attempt": 0,
            "supervisor_pid": os.getpid(), "hosts": {}, "transitions": [], "message": "",
            "grace_seconds": self.grace_seconds,  # how long `xrun delete` waits for the stop
        }

    # -- state ------------------------------------------------------------------------
    def transition(self, state: str, reason: str = "") -> None:
        self.state["state"] = state
        self.state["message"] = reason
        self.state["transitions"].append({"time": time.time(), "state": state, "reason": reason})
        self.save()

    def save(self) -> None:
        self.state["updated"] = time.time()
        self.state["hosts"] = {
            p.host: {
                "state": "Running" if p.exit_code is None and p.proc else
                ("Succeeded" if p.exit_code == 0 else ("Failed" if p.exit_code is not None else "Pending")),
                "pid": p.proc.pid if p.proc else None,
                "pod": p.name,
                "exit_code": p.exit_code,
                "attempt": self.state["attempt"],
            }
            for p in self.pods
        }
        self.storage.write_json(Layout.state(self.name), self.state)

    # -- pods -------------------------------------------------------------------------
    @property
    def grace_seconds(self) -> float:
        rj = self.manifest["spec"]["replicatedJobs"][0]
        return float(rj["template"]["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30))

    def start_pods(self) -> None:
        port = free_port()
        base = base_env()
        cache = _compilation_cache(self.storage)
        self.pods = plan_pods(self.manifest, self.state["attempt"], port)
        for pod in self.pods:
            env = {**base, **pod.env}
            if cache:
                env.setdefault(Env.COMPILATION_CACHE, cache)
            pod.proc = subprocess.Popen(
                pod.argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=_die_with(os.getpid()),
            )
            # A waiter per pod stamps the moment it exits: when one host's failure brings
            # the others down within milliseconds, the first to fail is the one to blame.
            threading.Thread(target=self._reap, args=(pod,), daemon=True).start()
        self.save()

    def _reap(self, pod: Pod) -> None:
        assert pod.proc is not None
        pod.proc.wait()
        pod.exited_at = time.monotonic()

    def stop_pods(self) -> None:
        """SIGTERM every live pod's process group, SIGKILL whatever outlives the grace period."""
        live = [(p, p.proc) for p in self.pods if p.proc and p.proc.poll() is None]
        for _, proc in live:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_seconds
        while time.monotonic() < deadline and any(proc.poll() is None for _, proc in live):
            time.sleep(POLL_SECONDS)
        for p, proc in live:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
            if p.exited_at is None:
                p.exited_at = time.monotonic()
            if p.exit_code is None:
                p.exit_code = exit_code_of_returncode(proc.returncode)

    # -- main loop --------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        spec = self.manifest["spec"]
        max_restarts = int(spec.get("failurePolicy", {}).get("maxRestarts", 0))
        job_spec = spec["replicatedJobs"][0]["template"]["spec"]
        self.save()
        while True:
            self.start_pods()
            self.transition(RUNNING, f"attempt {self.state['attempt']}: {len(self.pods)} pods started")
            failed = self.wait_pods()
            if self.stop_requested:
                self.stop_pods()
                self.transition(DELETED, "stopped by xrun delete")
                return 1
            if failed is None:
                self.transition(SUCCEEDED, "all pods succeeded")
                return 0
            code = failed.exit_code
            assert code is not None
            self.stop_pods()
            if _fails_job_for_good(job_spec, code) and _jobset_fails_on_policy(self.manifest):
                self.transition(FAILED, f"host {failed.host} exited with code {code} (not restartable: podFailurePolicy FailJob)")
                return 1
            if self.state["restarts"] >= max_restarts:
                self.transition(FAILED, f"host {failed.host} exited with code {code}; maxRestarts {max_restarts} reached")
                return 1
            self.state["restarts"] += 1
            self.transition(RESTARTING, f"host {failed.host} exited with code {code}; restart {self.state['restarts']}/{max_restarts}")
            self.state["attempt"] += 1

    def wait_pods(self) -> Pod | None:
        """Until every pod succeeded (None), one failed (that pod), or a stop was asked."""
        while not self.stop_requested:
            exited = [p for p in self.pods if p.exit_code is None and p.exited_at is not None]
            for p in exited:
                assert p.proc is not None  # exited_at is only set for a started pod
                p.exit_code = exit_code_of_returncode(p.proc.returncode)
            if exited:
                self.save()
            failed = [p for p in self.pods if p.exit_code not in (None, 0)]
            if failed:
                return min(failed, key=lambda p: p.exited_at or 0.0)
            if all(p.exit_code == 0 for p in self.pods):
                return None
            time.sleep(POLL_SECONDS)
        return None

    def _on_stop(self, _signum, _frame) -> None:
        self.stop_requested = True


PR_SET_PDEATHSIG = 1  # linux/prctl.h
PARENT_DEATH_SIGNAL = signal.SIGHUP  # workload.wrapper.PARENT_DEATH_SIGNAL


def _die_with(parent: int) -> Callable[[], None]:
    """preexec_fn: the pod gets PARENT_DEATH_SIGNAL when this supervisor dies, however it dies
    (prctl(2) PR_SET_PDEATHSIG; the wrapper then kills its child's process group). If the
    supervisor died between fork and prctl, the pod never starts."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL))
        if os.getppid() != parent:
            os._exit(EXIT_FAILED)

    return preexec


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _compilation_cache(storage: Storage) -> str | None:
    """JAX's persistent compilation cache under a local storage root (off with XRUN_LOCAL_COMPILATION_CACHE=0)."""
    if os.environ.get("XRUN_LOCAL_COMPILATION_CACHE", "1") == "0":
        return None
    if storage.root.startswith("gs://"):
        return None
    return storage.url(Layout.compilation_cache())




def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "supervise":
        print("usage: python -m orchestrator.backends.local supervise STORAGE_ROOT NAME", file=sys.stderr)
        return 2
    storage = open_storage(argv[1])
    sup = Supervisor(storage, argv[2])
    try:
        return sup.run()
    except BaseException as e:
        sup.stop_pods()
        if sup.state["state"] not in TERMINAL_STATES:
            sup.transition(FAILED, f"local supervisor error: {e!r}")
        if storage.root.startswith("gs://"):  # a local root has the file already (stderr)
            import traceback

            with contextlib.suppress(Exception):
                storage.write_text(Layout.supervisor_log(argv[2]), traceback.format_exc())
        raise


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
