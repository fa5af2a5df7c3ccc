"""The embedded default: a rendered JobSet's pods as processes on this machine.

``submit`` starts a detached supervisor (``orchestrator.backends.local.supervisor``) that
plays the Job and JobSet controllers and writes every transition to ``state.json``; status
and delete work from that file and the process table, so they outlive this process.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.backends.base import BackendStatus, HostStatus, LogItem
from orchestrator.backends.local.supervisor import base_env
from xrun_contract import FAILED, PENDING, TERMINAL_STATES, Env, Layout
from xrun_contract.errors import EXIT_FAILED, XrunError
from xrun_contract.storage import STORAGE_TIMEOUT_ENV, open_storage


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _same_root(value: str, root: str) -> bool:
    if value.startswith("gs://") or root.startswith("gs://"):
        return value.rstrip("/") == root.rstrip("/")
    return os.path.abspath(os.path.expanduser(value)) == os.path.abspath(os.path.expanduser(root))


def _remove_pod_folders(name: str, state: dict[str, Any]) -> int:
    """The emptyDir folders of the pods state.json names, as a supervisor killed with -9 left
    them (it removes each when its pod ends): only a folder named for its pod (the pod's
    name, a suffix) is removed. How many were."""
    removed = 0
    for v in (state.get("hosts") or {}).values():
        folder, pod = (v.get("folder"), v.get("pod")) if isinstance(v, dict) else (None, None)
        if not (isinstance(folder, str) and isinstance(pod, str) and pod.startswith(f"{name}-")
                and os.path.isabs(folder) and re.fullmatch(rf"{re.escape(pod)}-[a-z0-9]+",
                                                           os.path.basename(folder))):
            continue
        if os.path.isdir(folder) and not os.path.islink(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed += not os.path.lexists(folder)
    return removed


def run_processes(storage_root: str, name: str) -> list[int]:
    """Every live process of run ``name`` under ``storage_root``, from the OS alone: its
    supervisor (argv ``... orchestrator.backends.local supervise ROOT NAME``) and every pod
    process (wrapper, shell, workload: their environ has XRUN_RUN_NAME and XRUN_STORAGE).

    This is what ``delete`` and ``submit --replace`` trust, not state.json: a supervisor
    killed with -9 leaves a state.json that names no live process."""
    me = os.getpid()
    found: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
            if "supervise" in argv:
                i = argv.index("supervise")
                if (i >= 1 and argv[i - 1] == "orchestrator.backends.local" and len(argv) > i + 2
                        and argv[i + 2] == name and _same_root(argv[i + 1], storage_root)):
                    found.append(pid)
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(item.partition(b"=")[::2] for item in f.read().split(b"\0") if item)
        except OSError:  # gone, or another user's process
            continue
        if (env.get(Env.RUN_NAME.encode()) == name.encode()
                and _same_root(env.get(Env.STORAGE.encode(), b"").decode("utf-8", "replace"), storage_root)
                and _pid_alive(pid)):
            found.append(pid)
    return sorted(found)


def stop_processes(pids: list[int], grace: float) -> None:
    """SIGTERM each process's group (never our own), SIGKILL whatever outlives ``grace``."""
    own = os.getpgrp()
    groups = set()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            pgid = os.getpgid(pid)
            if pgid != own:
                groups.add(pgid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        for pid in pids:  # a process that left its group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5)
        while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
            time.sleep(0.05)


class LocalBackend:
    """Backend protocol over the supervisor: state lives in storage (state.json)."""

    name = "local"
    found = ""  # what the last delete found, in words
    serves_logs = False  # every host's output is in storage within LOCAL_LOG_FLUSH_SECONDS

    def __init__(self, storage_root: str):
        self.storage_root = storage_root
        self.storage = open_storage(storage_root)

    def submit(self, manifest: dict[str, Any], *, replace: bool = False) -> None:
        name = manifest["metadata"]["name"]
        # The supervisor's own output lives with the run (a local root), never under $HOME;
        # on a gs:// root the supervisor writes its failure there itself.
        log_path = (None if self.storage.root.startswith("gs://")
                    else Path(self.storage.url(Layout.supervisor_log(name))))
        if log_path:
            log_path.parent.mkdir(parents=True, exist_ok=True)
        with (open(log_path, "ab") if log_path else open(os.devnull, "wb")) as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.backends.local", "supervise", self.storage_root, name],
                # --storage-timeout (XRUN_STORAGE_TIMEOUT) bounds the supervisor's calls too.
                env=base_env() | {k: v for k, v in os.environ.items()
                                  if k.startswith("XRUN_LOCAL") or k == STORAGE_TIMEOUT_ENV},
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )
        self.supervisor = proc  # callers that follow may wait on it
        # The supervisor writes state.json at once; wait for its own (a resumed run's file
        # is there already, the earlier attempt's end), so status and a follow never see
        # nothing, or the attempt before.
        deadline = time.monotonic() + 30
        while (self.storage.read_json(Layout.state(name)) or {}).get("supervisor_pid") != proc.pid:
            if proc.poll() is not None:
                raise XrunError(f"local supervisor exited with code {proc.returncode}; see "
                               f"{self.storage.url(Layout.supervisor_log(name))}", EXIT_FAILED)
            if time.monotonic() > deadline:
                raise XrunError("local supervisor did not start within 30 s", EXIT_FAILED)
            time.sleep(0.05)

    def status(self, name: str) -> BackendStatus | None:
        state = self.storage.read_json(Layout.state(name))
        if state is None:
            return None
        current = state.get("state", PENDING)
        if current not in TERMINAL_STATES and not _pid_alive(state.get("supervisor_pid")):
            # The supervisor records its terminal state and then exits, so it may have done
            # both between the read above and the liveness check: read again before calling
            # it lost. A read made after it is seen dead is its last word.
            state = self.storage.read_json(Layout.state(name)) or state
            current = state.get("state", PENDING)
            if current not in TERMINAL_STATES:
                current, state["message"] = FAILED, "local supervisor is gone (machine restarted or killed)"
        # Hosts recorded as not ended by a supervisor that is gone (also once `status`
        # recorded the run Failed for it) are watched by nobody: Unknown, with why.
        lost = any(v.get("state", PENDING) not in TERMINAL_STATES for v in state.get("hosts", {}).values()) \
            and not _pid_alive(state.get("supervisor_pid"))
        hosts = [self._host(h, v, lost) for h, v in sorted(state.get("hosts", {}).items())]
        return BackendStatus(state=current, restarts=state.get("restarts", 0), hosts=hosts,
                             message=state.get("message", ""))

    @staticmethod
    def _host(host: str, v: dict[str, Any], lost: bool) -> HostStatus:
        """A host as state.json recorded it; with the supervisor gone, a host recorded as
        not yet ended is Unknown (nobody watches it), saying whether its process lives."""
        state, reason = v.get("state", PENDING), ""
        if lost and state not in TERMINAL_STATES:
            pid = v.get("pid")
            state = "Unknown"
            reason = (f"local supervisor is gone; last recorded {v.get('state', PENDING)}, "
                      + (f"process {pid} still alive (xrun delete stops it)" if _pid_alive(pid)
                         else f"process {pid} is gone" if pid else "never started"))
        return HostStatus(host=host, state=state, attempt=v.get("attempt", 0),
                          exit_code=v.get("exit_code"), reason=reason, pod=str(v.get("pid") or ""))

    def live_processes(self, name: str) -> list[int]:
        """Every process of the run the OS knows (``run_processes``)."""
        return run_processes(self.storage_root, name)

    def delete(self, name: str, *, wait: bool = True) -> bool:
        """Stop the run: its supervisor first (it stops the pods and records Deleted), then
        every process of the run the OS still shows (orphans of a killed supervisor).
        ``found`` then says, in words, what there was."""
        state = self.storage.read_json(Layout.state(name)) or {}
        grace = float(state.get("grace_seconds", 180))
        stopped = False
        live = self.live_processes(name)
        pid = state.get("supervisor_pid")
        recorded = state.get("state", "nothing")
        if pid in live:  # the recorded pid is this run's supervisor, not a reused pid
            others = len(live) - 1
            self.found = f"its supervisor (pid {pid}) and {others} pod process{'es' * (others != 1)}"
        elif live:
            self.found = (f"{len(live)} process{'es' * (len(live) != 1)} of the run ({', '.join(map(str, live))}) "
                          f"without their supervisor" + (f" (pid {pid}, gone)" if pid else ""))
        elif recorded in TERMINAL_STATES:
            why = state.get("message") or ""
            self.found = f"no live process: it ended {recorded}" + (f" ({why})" if why else "")
        else:
            self.found = (f"no live process: state.json says {recorded}, but its supervisor"
                          + (f" (pid {pid})" if pid else "") + " is gone and no process of the run is left")
        if pid in live:
            os.kill(pid, signal.SIGTERM)
            stopped = True
            if not wait:
                return True
            deadline = time.monotonic() + grace + 10
            while _pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            live = self.live_processes(name)
        lost = pid not in live  # no supervisor to remove its pods' folders
        if live:
            stopped = True
            if wait:
                stop_processes(live, min(grace, 30.0))
            else:
                for p in live:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(p, signal.SIGTERM)
        if lost and (wait or not live):
            removed = _remove_pod_folders(name, state)
            if removed:
                self.found += f"; removed the {removed} pod folder{'s' * (removed != 1)} it left"
        return stopped

    def list(self) -> list[dict[str, Any]]:
        return []  # local runs are exactly what storage holds; the readers list them

    def live_attempts(self, name: str) -> set[int]:
        return set()

    def stream_logs(self, name: str, follow: bool = False, since_seconds: int | None = None,
                    tail_lines: int | None = None,
                    hosts: set[str] | None = None) -> Iterator[LogItem]:
        return iter(())


