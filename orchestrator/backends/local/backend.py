"""The embedded default: a rendered JobSet's pods as processes on this machine.

``submit`` starts a detached supervisor (``orchestrator.backends.local.supervisor``) that
plays the Job and JobSet controllers and writes every transition to ``state.json``; status
and delete work from that file and the process table, so they outlive this process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.backends.base import BackendStatus, HostStatus, LogItem
from orchestrator.backends.local.supervisor import base_env
from xrun_contract import FAILED, PENDING, TERMINAL_STATES, Layout
from xrun_contract.errors import EXIT_FAILED, XrunError
from xrun_contract.storage import open_storage


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


class LocalBackend:
    """Backend protocol over the supervisor: state lives in storage (state.json)."""

    name = "local"
    serves_logs = False  # every host's output is in storage within LOCAL_LOG_FLUSH_SECONDS

    def __init__(self, storage_root: str):
        self.storage_root = storage_root
        self.storage = open_storage(storage_root)

    def submit(self, manifest: dict[str, Any], *, replace: bool = False) -> None:
        name = manifest["metadata"]["name"]
        log_dir = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "xrun"
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / f"supervisor-{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.backends.local", "supervise", self.storage_root, name],
                env=base_env() | {k: v for k, v in os.environ.items() if k.startswith("XRUN_LOCAL")},
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )
        self.supervisor = proc  # callers that follow may wait on it
        # The supervisor writes state.json at once; wait for it so status never sees nothing.
        deadline = time.monotonic() + 30
        while self.storage.read_json(Layout.state(name)) is None:
            if proc.poll() is not None:
                raise XrunError(f"local supervisor exited with code {proc.returncode}; see {log_dir}/supervisor-{name}.log", EXIT_FAILED)
            if time.monotonic() > deadline:
                raise XrunError("local supervisor did not start within 30 s", EXIT_FAILED)
            time.sleep(0.05)

    def status(self, name: str) -> BackendStatus | None:
        state = self.storage.read_json(Layout.state(name))
        if state is None:
            return None
        current = state.get("state", PENDING)
        if current not in TERMINAL_STATES and not _pid_alive(state.get("supervisor_pid")):
            current, state["message"] = FAILED, "local supervisor is gone (machine restarted or killed)"
        hosts = [
            HostStatus(host=h, state=v.get("state", PENDING), attempt=v.get("attempt", 0),
                       exit_code=v.get("exit_code"), pod=str(v.get("pid") or ""))
            for h, v in sorted(state.get("hosts", {}).items())
        ]
        return BackendStatus(state=current, restarts=state.get("restarts", 0), hosts=hosts,
                             message=state.get("message", ""))

    def delete(self, name: str, *, wait: bool = True) -> bool:
        state = self.storage.read_json(Layout.state(name))
        if not state or state.get("state") in TERMINAL_STATES:
            return False
        pid = state.get("supervisor_pid")
        if not isinstance(pid, int) or not _pid_alive(pid):
            return False
        os.kill(pid, signal.SIGTERM)
        if wait:
            deadline = time.monotonic() + float(state.get("grace_seconds", 180)) + 10
            while _pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            for h in state.get("hosts", {}).values():  # belt and braces: nothing may outlive it
                if h.get("pid") and _pid_alive(h["pid"]):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(h["pid"], signal.SIGKILL)
        return True

    def list(self) -> list[dict[str, Any]]:
        return []  # local runs are exactly what storage holds; the readers list them

    def live_attempts(self, name: str) -> set[int]:
        return set()

    def stream_logs(self, name: str, follow: bool = False, since_seconds: int | None = None,
                    tail_lines: int | None = None,
                    hosts: set[str] | None = None) -> Iterator[LogItem]:
        return iter(())


