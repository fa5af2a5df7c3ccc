"""What every backend offers: take a rendered manifest, report state, stop, and (where
the backend can) stream logs from live pods.

Backends never rebuild the manifest. ``local`` runs the manifest's pods as host processes
(JobSet semantics, its supervisor writes ``state.json``); ``kube`` sends it to a cluster
with the kubernetes client. Both report a :class:`BackendStatus`, which the services
record into ``state.json`` the same way (``services.runs.observe``) and merge with what
the run left in storage. Failures are :class:`~xrun_contract.errors.XrunError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class HostStatus:
    host: str  # "<slice>-<host>"
    state: str  # Pending | Running | Succeeded | Failed | Terminating
    attempt: int = 0
    exit_code: int | None = None
    reason: str = ""  # why Pending / Failed (e.g. Unschedulable, ImagePullBackOff)
    pod: str = ""  # pod name (kube) or pid (local)

    def as_dict(self) -> dict[str, Any]:
        # every field is a str, int or None: no deep copy (dataclasses.asdict's recursion
        # was a tenth of a second of ``xrun status`` at 1,024 hosts)
        return {f.name: getattr(self, f.name) for f in _HOST_FIELDS}


_HOST_FIELDS = dataclasses.fields(HostStatus)


@dataclass
class BackendStatus:
    state: str  # contract states: Pending, Running, Restarting, Succeeded, Failed, Deleted
    restarts: int = 0
    hosts: list[HostStatus] = field(default_factory=list)
    message: str = ""  # e.g. the JobSet condition message, or "host 0-1 exited 3"
    conditions: list[dict[str, Any]] = field(default_factory=list)  # JobSet status.conditions
    events: list[str] = field(default_factory=list)  # recent warnings: why pods are Pending


LogItem = tuple[str, int, str]  # (host "<slice>-<host>", restart attempt, line)


class Backend(Protocol):
    name: str
    # True when live pods can be asked for their logs (kube); False when every line is
    # read from storage (local: the log-shipping sidecar ships each host's output there within 0.5 s).
    serves_logs: bool

    def submit(self, manifest: dict[str, Any], *, replace: bool = False) -> None: ...

    def status(self, name: str) -> BackendStatus | None:
        """None when the backend has no such run (never submitted, or already gone)."""
        ...

    def delete(self, name: str, *, wait: bool = True) -> bool:
        """Stop the run; True if something was deleted."""
        ...

    def list(self) -> list[dict[str, Any]]:
        """Runs the backend knows: [{"name", "state", "created"}]."""
        ...

    def live_attempts(self, name: str) -> set[int]:
        """Restart attempts that have live pods with a log now."""
        ...

    def stream_logs(self, name: str, follow: bool = False, since_seconds: int | None = None,
                    tail_lines: int | None = None,
                    hosts: set[str] | None = None) -> Iterator[LogItem]:
        """Every live pod's log lines (only backends with ``serves_logs``)."""
        ...
