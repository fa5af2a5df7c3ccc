"""The local backend: the manifest's pods as host processes (see ``backend`` and ``supervisor``)."""

from orchestrator.backends.local.backend import LocalBackend
from orchestrator.backends.local.supervisor import free_port

__all__ = ["LocalBackend", "free_port"]
