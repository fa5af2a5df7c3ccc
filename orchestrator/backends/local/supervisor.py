"""The embedded default's supervisor: run a rendered JobSet as host processes.

A detached supervisor process (``python -m orchestrator.backends.local supervise ROOT NAME``)
reads ``manifest.yaml`` from the storage root and, for each slice x host, starts the
container's command with its env resolved the way Kubernetes and JobSet would resolve it
for that pod: Downward-API fields (completion index, job-global-index, restart attempt, pod
name), ``$(VAR)`` expansion, the coordinator's DNS name mapped to 127.0.0.1 and a free
port, the accelerator replaced by as many CPU devices per host as the shape has chips.

A pod runs as Kubernetes runs it (kubelet ``kuberuntime_manager.go`` computePodActions and
``kuberuntime_termination_order.go``): its plain init containers one after the other, each
to completion; then its native sidecars (init containers with ``restartPolicy: Always``),
restarted if they die; then the main container. The pod ends when the main container has
ended and the sidecars, which get SIGTERM only then, have exited (at least 2 s of grace,
``minimumGracePeriodInSeconds``). Each emptyDir volume is a fresh folder per pod; an env
value that names a path under the volume's mountPath is rewritten to that folder, and
``$(VAR)`` in a command then expands to it. A pod's exit code is its main container's
(or a failed init container's).

JobSet semantics, taken from the manifest itself: success when every pod exits 0; a pod
whose exit code matches the Job's podFailurePolicy ``FailJob`` rule fails the Job with
reason PodFailurePolicy, other failures with BackoffLimitExceeded; the JobSet's
failurePolicy rules are then tried in order against every Job failed in that sync, and
the first rule any of them matches decides (FailJobSet for xrun's rule; no rule matched:
RestartJobSet, SIGTERM to every pod, SIGKILL after the grace period, while ``restarts <
maxRestarts``). Every transition is written to ``state.json``.

The pods as processes are planned in ``pods`` and the failure policies decided in
``policy`` (both re-exported here); this module runs them and records what happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.backends.local.pods import (  # noqa: F401 - re-exported for callers
    JOB_COMPLETION_INDEX_ENV,
    LOCAL_LOG_FLUSH_SECONDS,
    Container,
    Pod,
    free_port,
    plan_pods,
)
from orchestrator.backends.local.policy import (  # noqa: F401 - re-exported for callers
    SYNC_JOB_BATCH_SECONDS,
    FailedJob,
    FailureDecision,
    _ended,
    failed_jobs,
    failure_decision,
    first_failed_policy_rule_and_job,
)
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
    summary,
)
from xrun_contract.errors import EXIT_FAILED, XrunError, exit_code_of_returncode
from xrun_contract.k8s import JobFailureReasons
from xrun_contract.storage import (
    LocalStorage,
    Storage,
    StorageFault,
    classify_storage_error,
    open_storage,
)

POLL_SECONDS = 0.2
# kubelet kuberuntime_container.go: minimumGracePeriodInSeconds, the least a sidecar gets.
MIN_GRACE_SECONDS = 2.0
# The supervisor's own storage writes (state.json) never end the run: a write it cannot do
# is kept (the newest state only) and retried with this backoff until it lands.
WRITE_RETRY_SECONDS = (0.5, 5.0)
# At the end, how long the supervisor keeps trying to record the final state before it
# exits anyway (a full disk: "recorded when space allows"); XRUN_LOCAL_FINAL_WRITE_SECONDS.
FINAL_WRITE_SECONDS = 600.0
# How long an ending supervisor waits for its writer to finish a write under way: a local
# write takes milliseconds (cut, it left its temporary file); a cut gs:// upload leaves nothing.
WRITER_CLOSE_SECONDS = 5.0


def say(line: str) -> None:
    """A line in supervisor.log; never an error (the log may sit on the full disk itself)."""
    with contextlib.suppress(OSError, ValueError):
        print(line, flush=True)


def attempt_base(manifest: dict[str, Any]) -> int:
    """The ``XRUN_ATTEMPT_BASE`` a resumed run's manifest gives its main container (0: none)."""
    with contextlib.suppress(KeyError, IndexError, TypeError, ValueError):
        pod = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        for item in pod["containers"][0].get("env") or []:
            if item.get("name") == Env.ATTEMPT_BASE:
                return max(0, int(item.get("value") or 0))
    return 0


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
        self._save_lock = threading.Lock()
        # state.json is written by a thread of its own: the newest state is kept in
        # ``_unwritten`` until a write lands, so a storage outage only delays it.
        self._write_cond = threading.Condition()
        self._unwritten: bytes | None = None
        self._version = self._written_version = 0
        self._closed = False  # close(): the writer takes no new write
        self.storage_failure: StorageFault | None = None  # a permanent error of our own write
        self._writer = threading.Thread(target=self._write_loop, name="xrun-state-writer", daemon=True)
        self._writer.start()
        self.attempt_base = attempt_base(self.manifest)
        self.state = {
            "backend": "local", "state": PENDING, "restarts": 0, "attempt": self.attempt_base,
            "supervisor_pid": os.getpid(), "hosts": {}, "transitions": [], "message": "",
            "grace_seconds": self.grace_seconds,  # how long `xrun delete` waits for the stop
        }
        if self.attempt_base:
            self._continue_history()

    def _continue_history(self) -> None:
        """A resumed run (``xrun submit --resume``) keeps what state.json recorded: its
        transitions and restart count go on; maxRestarts counts afresh, as for the JobSet
        a resume re-creates on a cluster."""
        try:
            old = self.storage.read_json(Layout.state(self.name)) or {}
        except Exception:  # noqa: BLE001 - an unreadable record starts a fresh history
            old = {}
        transitions = old.get("transitions")
        if isinstance(transitions, list):
            self.state["transitions"] = list(transitions)
        restarts = old.get("restarts")
        if isinstance(restarts, int) and not isinstance(restarts, bool):
            self.state["restarts"] = restarts
        self.state["restarts_towards_max"] = 0
        self.state["resumed"] = [*(old.get("resumed") or []), {"time": time.time(),
                                                                 "attempt": self.attempt_base}]
        self.state["message"] = f"resumed (xrun submit --resume): attempt {self.attempt_base}"
        self.state["transitions"].append({"time": time.time(), "state": PENDING,
                                          "reason": self.state["message"]})

    # -- state ------------------------------------------------------------------------
    def transition(self, state: str, reason: str = "") -> None:
        self.state["state"] = state
        self.state["message"] = reason
        self.state["transitions"].append({"time": time.time(), "state": state, "reason": reason})
        self.save()

    def save(self) -> None:
        with self._save_lock:  # pod runners save too (a main container started)
            self._save()

    def _save(self) -> None:
        self.state["updated"] = time.time()
        self.state["hosts"] = self._hosts()
        data = (json.dumps(self.state, indent=2, sort_keys=True, default=str) + "\n").encode()
        with self._write_cond:
            self._unwritten, self._version = data, self._version + 1
            self._write_cond.notify_all()

    def _write_loop(self) -> None:
        """Write the newest unwritten state; on failure keep it and retry with backoff (a
        newer state replaces it). A permanent failure (a full disk, no permission, no such
        bucket: ``classify_storage_error``) is noted for the main loop, which ends the run."""
        delay = WRITE_RETRY_SECONDS[0]
        while True:
            with self._write_cond:
                while self._unwritten is None and not self._closed:
                    self._write_cond.wait()
                data, version = self._unwritten, self._version
                if self._closed or data is None:
                    return
            try:
                self.storage.write_bytes(Layout.state(self.name), data)
                summary.write_state(self.storage, self.name, json.loads(data))  # what list reads
            except Exception as e:  # noqa: BLE001 - nothing here may end the run's supervision
                fault = classify_storage_error(e)
                # A refused connection or a failed DNS lookup may heal: retried, as an outage.
                if fault.permanent and not fault.unreachable and self.storage_failure is None:
                    self.storage_failure = fault
                say(f"xrun-supervisor: state.json not written ({'permanent' if fault.permanent else 'transient'}:"
                    f" {e}); retrying in {delay:.1f}s")
                with self._write_cond:
                    self._write_cond.wait(delay)
                delay = min(delay * 2, WRITE_RETRY_SECONDS[1])
                continue
            delay = WRITE_RETRY_SECONDS[0]
            with self._write_cond:
                if self._version == version:
                    self._unwritten = None
                self._written_version = max(self._written_version, version)
                self._write_cond.notify_all()

    def close(self, timeout: float) -> None:
        """Stop the writer between two writes before this process exits: a daemon thread cut
        by the interpreter's exit inside a write (a retry on a full disk after the final
        state went in place) left its temporary file behind."""
        with self._write_cond:
            self._closed = True
            self._write_cond.notify_all()
        self._writer.join(timeout)

    def flush(self, timeout: float) -> bool:
        """Wait until the newest state is written (True) or ``timeout`` passed. On a local
        root with a permanent failure, the state is written into state.json's own blocks
        (``LocalStorage.overwrite_in_place``: a full disk has no room for a new file)."""
        deadline = time.monotonic() + timeout
        tried_in_place = False
        with self._write_cond:
            while self._written_version < self._version:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if (self.storage_failure is not None and not tried_in_place
                        and isinstance(self.storage, LocalStorage) and self._unwritten is not None):
                    tried_in_place = True
                    compact = (json.dumps(self.state, sort_keys=True, default=str) + "\n").encode()
                    if self.storage.overwrite_in_place(Layout.state(self.name), compact):
                        say("xrun-supervisor: final state written in place (storage full)")
                        return True
                self._write_cond.wait(min(left, 1.0))
        return True

    def _hosts(self) -> dict[str, Any]:
        return {
            p.host: {
                "state": "Running" if p.exit_code is None and p.proc else
                ("Succeeded" if p.exit_code == 0 else ("Failed" if p.exit_code is not None else "Pending")),
                "pid": p.proc.pid if p.proc else None,
                "pod": p.name,
                "folder": p.folder,  # its emptyDirs (xrun delete removes them if the supervisor is lost)
                "exit_code": p.exit_code,
                "attempt": self.state["attempt"],
            }
            for p in self.pods
        }

    # -- pods -------------------------------------------------------------------------
    @property
    def grace_seconds(self) -> float:
        rj = self.manifest["spec"]["replicatedJobs"][0]
        return float(rj["template"]["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30))

    def start_pods(self) -> None:
        port = free_port()
        base = base_env()
        cache = _compilation_cache(self.storage)
        # The JobSet's restart attempt (from 0 again after a resume); the pods add the base.
        self.pods = plan_pods(self.manifest, self.state["attempt"] - self.attempt_base, port)
        self._pod_threads = []
        for pod in self.pods:
            extra = {Env.COMPILATION_CACHE: cache} if cache else {}
            # A runner per pod stamps the moment it ends: when one host's failure brings
            # the others down within milliseconds, the first to fail is the one to blame.
            t = threading.Thread(target=self._run_pod, args=(pod, base, extra), daemon=True)
            t.start()
            self._pod_threads.append(t)
        self.save()

    def _popen(self, argv: list[str], env: dict[str, str], sidecar: bool = False) -> subprocess.Popen:
        # Every container gets SIGTERM from the kernel if this supervisor dies, however it
        # dies (even kill -9): the launcher forwards it to its whole process group and a
        # sidecar ships what is left, so nothing outlives a run (PR_SET_PDEATHSIG).
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_die_with(os.getpid(), signal.SIGTERM))

    def _run_pod(self, pod: Pod, base: dict[str, str], extra: dict[str, str]) -> None:
        """Init containers in order, sidecars, the main container; then stop the sidecars."""
        sidecars: list[Container] = []
        code, who = None, ""
        made = False
        try:
            try:  # the pod's emptyDirs, fresh (0700 like mkdtemp's); removed in finally
                os.mkdir(pod.folder, 0o700)
                made = True
                for path in pod.volumes:
                    os.makedirs(path)
            except OSError as e:
                print(f"pod {pod.name}: cannot make its emptyDir folders: {e}", flush=True)
                code, who = 127, pod.container
                pod.failed_at = time.monotonic()
            for c in pod.init if code is None else []:
                if pod.stopping:
                    break
                try:
                    c.proc = self._popen(c.argv, {**base, **c.env}, sidecar=c.sidecar)
                except OSError as e:
                    # A node daemon of a GPU networking stack (its binary is in its image)
                    # has nothing to do here: skipped. An init container must run.
                    print(f"pod {pod.name}: container {c.name} cannot run locally: {e}", flush=True)
                    if c.sidecar:
                        continue
                    code, who = 127, c.name
                    break
                if c.sidecar:
                    sidecars.append(c)
                    continue
                rc = exit_code_of_returncode(c.proc.wait())
                _end_group(c.proc, None)
                if rc != 0:
                    code, who = rc, c.name
                    pod.failed_at = time.monotonic()
                    break
            if code is None and not pod.stopping:
                pod.proc = self._popen(pod.argv, main_env(base, extra, pod.env))
                self.save()
                while True:
                    try:  # woken by the exit itself: the blame below is by its moment
                        pod.proc.wait(timeout=POLL_SECONDS)
                        break
                    except subprocess.TimeoutExpired:
                        self._keep_sidecars(pod, sidecars, base)
                code, who = exit_code_of_returncode(pod.proc.returncode), pod.container
                pod.failed_at = time.monotonic()  # before the sidecars' drain: blame is by this
                # The container is its whole process group: what its first process left
                # behind (a child that caught SIGTERM) ends with it, or at the grace period.
                _end_group(pod.proc, pod.deadline if pod.stopping else None)
            self._stop_sidecars(pod, sidecars)
        finally:
            pod.failed_container = who if code else ""
            pod.exit_code = code if code is not None else exit_code_of_returncode(-signal.SIGTERM)
            pod.exited_at = time.monotonic()
            if made:
                shutil.rmtree(pod.folder, ignore_errors=True)  # the emptyDirs go with the pod

    def _keep_sidecars(self, pod: Pod, sidecars: list[Container], base: dict[str, str]) -> None:
        """restartPolicy Always: a sidecar that died while the pod runs is started again."""
        for c in sidecars:
            if c.proc is not None and c.proc.poll() is not None and not pod.stopping:
                c.proc = self._popen(c.argv, {**base, **c.env}, sidecar=True)

    def _stop_sidecars(self, pod: Pod, sidecars: list[Container]) -> None:
        """After the main container: SIGTERM in reverse order, SIGKILL after the remaining grace
        (at least MIN_GRACE_SECONDS), as kubelet killContainer does for sidecars."""
        for c in reversed(sidecars):
            if c.proc is None or c.proc.poll() is not None:
                continue
            left = (pod.deadline - time.monotonic()) if pod.deadline else self.grace_seconds
            with contextlib.suppress(ProcessLookupError):
                c.proc.send_signal(signal.SIGTERM)
            try:
                c.proc.wait(timeout=max(left, MIN_GRACE_SECONDS))
            except subprocess.TimeoutExpired:
                _signal_group(c.proc, signal.SIGKILL)
                c.proc.wait()
            _end_group(c.proc, None)

    def stop_pods(self) -> None:
        """As the kubelet stops a pod: SIGTERM to each main container's process (its first
        process, like PID 1 of a container), SIGKILL to its whole process group after the
        grace period, whatever its processes do with SIGTERM and whether or not the first
        one is still there (a child that caught SIGTERM, as JAX's preemption notifier does,
        is killed with the group); the pod's runner then stops its sidecars."""
        deadline = time.monotonic() + self.grace_seconds
        for p in self.pods:
            p.stopping, p.deadline = True, deadline
            if p.proc and p.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.proc.send_signal(signal.SIGTERM)
        while time.monotonic() < deadline and any(
                p.proc and (p.proc.poll() is None or _group_members(p.proc.pid)) for p in self.pods):
            time.sleep(POLL_SECONDS)
        for p in self.pods:
            if p.proc and (p.proc.poll() is None or _group_members(p.proc.pid)):
                _signal_group(p.proc, signal.SIGKILL)
        for t in getattr(self, "_pod_threads", []):
            t.join(timeout=self.grace_seconds + MIN_GRACE_SECONDS + 5)

    def join_pods(self, timeout: float) -> None:
        """Wait for the pods' runners: a pod counts as ended before its runner has removed
        its folder, and the runners are daemon threads, which an exiting supervisor cuts
        off mid-rmtree (its xrun/ then stayed in /tmp, emptied or not)."""
        deadline = time.monotonic() + timeout
        for t in getattr(self, "_pod_threads", []):
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    # -- main loop --------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        spec = self.manifest["spec"]
        max_restarts = int(spec.get("failurePolicy", {}).get("maxRestarts", 0))
        self.save()
        while True:
            self.start_pods()
            plural = "" if len(self.pods) == 1 else "s"
            self.transition(RUNNING, f"attempt {self.state['attempt']}: {len(self.pods)} pod{plural} started")
            failed = self.wait_pods()
            if self.storage_failure is not None:
                # Our own records cannot be written (a full disk, no permission, no bucket):
                # the run cannot be followed or resumed; stop it and say why, once there is room.
                self.stop_pods()
                self.transition(FAILED, f"{self.storage_failure.why}: the local supervisor cannot "
                                        f"write {self.storage.url(Layout.state(self.name))}")
                return 1
            if self.stop_requested:
                self.stop_pods()
                self.transition(DELETED, "stopped by xrun delete")
                return 1
            if not failed:
                self.transition(SUCCEEDED, "all pods succeeded")
                return 0
            decision = failure_decision(self.manifest, failed)
            pod, code = decision.job.pod, decision.job.pod.exit_code
            self.stop_pods()
            if decision.action == "FailJobSet":
                why = ("not restartable: podFailurePolicy FailJob"
                       if decision.job.reason == JobFailureReasons.POD_FAILURE_POLICY
                       else f"failurePolicy rule {decision.rule}: FailJobSet")
                self.transition(FAILED, f"host {pod.host} exited with code {code} ({why})")
                return 1
            if decision.action == "FailedJobs":
                self.transition(FAILED, f"host {pod.host} exited with code {code} (no failurePolicy)")
                return 1
            # RestartJobSet (and the default), RestartJobSetAndIgnoreMaxRestarts (not counted
            # towards maxRestarts: restartJobSetAndIgnoreMaxRestartsActionApplier). The
            # feature-gated RestartJob actions restart the whole set here.
            counted = decision.action != "RestartJobSetAndIgnoreMaxRestarts"
            towards = int(self.state.get("restarts_towards_max", self.state["restarts"]))
            if counted and towards >= max_restarts:
                self.transition(FAILED, f"host {pod.host} exited with code {code}; maxRestarts {max_restarts} reached")
                return 1
            self.state["restarts"] += 1
            self.state["restarts_towards_max"] = towards + counted
            self.transition(RESTARTING, f"host {pod.host} exited with code {code}; "
                                        f"restart {self.state['restarts']}/{max_restarts}")
            self.state["attempt"] += 1

    def wait_pods(self) -> list[Pod]:
        """Until every pod succeeded (an empty list), some failed (the failed pods once the
        Job controller would have judged the failures batched with the first, and the JobSet
        controller then sees every Job failed by then: ``failure_decision``), or a stop was
        asked. A pod counts once it has ended (sidecars included)."""
        reported: set[str] = set()
        while not self.stop_requested and self.storage_failure is None:
            exited = [p for p in self.pods if p.exited_at is not None and p.name not in reported]
            reported.update(p.name for p in exited)
            if exited:
                self.save()
            done = [p for p in self.pods if p.exited_at is not None]
            failed = [p for p in done if p.exit_code != 0]
            if len(done) == len(self.pods):
                return failed
            if failed:
                window_end = min(_ended(p) for p in failed) + SYNC_JOB_BATCH_SECONDS
                # A pod whose container ended inside the window but whose sidecars still drain
                # has no exit code yet: it is in the same sync.
                draining = [p for p in self.pods if p.exited_at is None
                            and p.failed_at is not None and p.failed_at <= window_end]
                if time.monotonic() >= window_end and not draining:
                    return failed
            time.sleep(POLL_SECONDS)
        return []

    def _on_stop(self, _signum, _frame) -> None:
        self.stop_requested = True


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with(parent: int, sig: int) -> Callable[[], None]:
    """preexec_fn: the child gets ``sig`` when the thread that started it (a pod runner of
    this supervisor) ends, which a dying supervisor always does (prctl(2) PR_SET_PDEATHSIG).
    If the supervisor died between fork and prctl, the container never starts."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:
            os._exit(EXIT_FAILED)

    return preexec


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, from /proc; without /proc,
    [pgid] while the kernel knows the group."""
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
            found.append(int(entry.name))
    return found


def _end_group(proc: subprocess.Popen, deadline: float | None) -> None:
    """A container is its process group (started with setsid): once its first process has
    ended, the rest of the group goes too: at once for a container that ended by itself
    (the kubelet: a container's processes die with its PID 1), at ``deadline`` (the grace
    period's end) for one being stopped, by SIGKILL whatever it does with SIGTERM."""
    while deadline is not None and time.monotonic() < deadline and _group_members(proc.pid):
        time.sleep(POLL_SECONDS)
    if not _group_members(proc.pid):
        return
    _signal_group(proc, signal.SIGKILL)
    end = time.monotonic() + 5
    while _group_members(proc.pid) and time.monotonic() < end:
        time.sleep(0.05)


def _shared_compilation_cache() -> bool:
    """XRUN_LOCAL_COMPILATION_CACHE names a folder (shared by every root)."""
    return os.path.isabs(os.environ.get("XRUN_LOCAL_COMPILATION_CACHE", "").strip())


def main_env(base: dict[str, str], cache: dict[str, str], pod: dict[str, str]) -> dict[str, str]:
    """The main container's env: the pod's (the manifest's) over ``base`` and the default
    cache (``cache``: ``_compilation_cache``'s folder as the env, or {}), except that a
    folder XRUN_LOCAL_COMPILATION_CACHE names wins over the pod's own too: a gs:// root's
    manifest names a cache in the bucket, and the folder is "whatever the root"."""
    return {**base, **cache, **pod, **(cache if _shared_compilation_cache() else {})}


def _compilation_cache(storage: Storage) -> str | None:
    """JAX's persistent compilation cache of the pods: under a local storage root by default;
    XRUN_LOCAL_COMPILATION_CACHE=0 turns it off, =/ABS/DIR puts it in that folder whatever
    the root (gs:// ones too), so runs under several roots compile each program once."""
    value = os.environ.get("XRUN_LOCAL_COMPILATION_CACHE", "1").strip()
    if value == "0":
        return None
    if os.path.isabs(value):
        return value
    if storage.root.startswith("gs://"):
        return None
    return storage.url(Layout.compilation_cache())


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "supervise":
        print("usage: python -m orchestrator.backends.local supervise STORAGE_ROOT NAME", file=sys.stderr)
        return 2
    storage = open_storage(argv[1])
    sup = Supervisor(storage, argv[2])
    final_s = float(os.environ.get("XRUN_LOCAL_FINAL_WRITE_SECONDS") or FINAL_WRITE_SECONDS)
    try:
        code = sup.run()
        sup.join_pods(60.0)
    except BaseException as e:
        sup.stop_pods()
        if sup.state["state"] not in TERMINAL_STATES:
            sup.transition(FAILED, f"local supervisor error: {e!r}")
        sup.flush(final_s)
        sup.close(WRITER_CLOSE_SECONDS)
        if storage.root.startswith("gs://"):  # a local root has the file already (stderr)
            import traceback

            with contextlib.suppress(Exception):
                storage.write_text(Layout.supervisor_log(argv[2]), traceback.format_exc())
        raise
    # The end state is recorded before the supervisor goes: through an outage, or on a full
    # disk once there is room (or in state.json's own blocks).
    if not sup.flush(final_s):
        say(f"xrun-supervisor: the final state ({sup.state['state']}) could not be written in {final_s:.0f}s")
    sup.close(WRITER_CLOSE_SECONDS)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
