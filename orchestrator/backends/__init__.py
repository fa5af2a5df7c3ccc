"""Backends take a rendered manifest and a storage root; they never rebuild the manifest.

``local`` runs the manifest's pods as host processes (JobSet semantics); ``kube`` sends it
to a cluster with the kubernetes client. Both report a :class:`BackendStatus`, which the
readers merge with what the run left in storage (metrics, checkpoints, logs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class BackendError(Exception):
    """A one-line, user-facing failure of the backend; ``exit_code`` as the CLI's."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class HostStatus:
    host: str  # "<slice>-<host>"
    state: str  # Pending | Running | Succeeded | Failed | Terminating
    attempt: int = 0
    exit_code: int | None = None
    reason: str = ""  # why Pending / Failed (e.g. Unschedulable, ImagePullBackOff)
    pod: str = ""  # pod name (kube) or pid (local)


@dataclass
class BackendStatus:
    state: str  # contract states: Pending, Running, Restarting, Succeeded, Failed, Deleted
    restarts: int = 0
    hosts: list[HostStatus] = field(default_factory=list)
    message: str = ""  # e.g. the JobSet condition message, or "host 0-1 exited 3"
    conditions: list[dict[str, Any]] = field(default_factory=list)  # JobSet status.conditions
    events: list[str] = field(default_factory=list)  # recent warnings: why pods are Pending


class Backend(Protocol):
    name: str

    def submit(self, manifest: dict[str, Any], *, replace: bool = False) -> None: ...

    def status(self, name: str) -> BackendStatus | None:
        """None when the backend has no such run (never submitted, or already gone)."""

    def delete(self, name: str, *, wait: bool = True) -> bool:
        """Stop the run; True if something was deleted."""

    def list(self) -> list[dict[str, Any]]:
        """Runs the backend knows: [{"name", "state", "created"}]."""
