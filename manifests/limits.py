"""Sizes Kubernetes and the kernel refuse, checked on the rendered manifest (pure).

A run whose pods could never start must not be written or started: an env string over
Linux's per-string limit makes every container's execve fail with E2BIG ("Argument list
too long"), which only the pod's log shows and which restarts until maxRestarts; an
object over etcd's request limit is refused by the API server. Errors are exit 2, one
line naming the field and the limit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from xrun_contract.errors import XrunError

# etcd's default --max-request-bytes (1.5 MiB): the API server cannot store a larger object.
MAX_OBJECT_BYTES = 1_572_864
# Linux (include/uapi/linux/binfmts.h): one argv or environment string, its NUL included,
# is at most 32 pages; all of argv and envp together (strings and pointers) at most a
# quarter of the stack limit (8 MiB by default): ARG_MAX 2 MiB.
MAX_ARG_STRLEN = 131_072
ARG_MAX = 2_097_152
POINTER_BYTES = 8


def _pod_specs(manifest: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for rj in (manifest.get("spec") or {}).get("replicatedJobs") or []:
        pod = (((rj.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")
        if isinstance(pod, dict):
            yield pod


def _unescape(text: str) -> str:
    """What the container sees of a manifest string: Kubernetes reduces $$ to $."""
    return text.replace("$$", "$")


def _size(text: str) -> int:
    return len(text.encode("utf-8", errors="surrogateescape")) + 1  # with its NUL


def check_exec_limits(manifest: dict[str, Any], user_env: set[str]) -> None:
    """Each container's command, args and env against execve's limits (E2BIG)."""
    for pod in _pod_specs(manifest):
        for c in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
            name = c.get("name", "?")
            argv = [_unescape(str(a)) for a in [*(c.get("command") or []), *(c.get("args") or [])]]
            env = {str(e.get("name")): _unescape(str(e["value"])) for e in c.get("env") or [] if "value" in e}
            total = 0
            for a in argv:
                n = _size(a)
                total += n + POINTER_BYTES
                if n > MAX_ARG_STRLEN:
                    raise XrunError(f"command: one argument of container {name} is {n} bytes; Linux's limit for "
                                    f"one argument (MAX_ARG_STRLEN) is {MAX_ARG_STRLEN} bytes (execve fails "
                                    "with E2BIG)")
            for key, value in env.items():
                n = _size(f"{key}={value}")
                total += n + POINTER_BYTES
                if n > MAX_ARG_STRLEN:
                    where = f"env: {key}" if key in user_env else f"container {name} env {key}"
                    raise XrunError(f"{where}: {key}=value is {n} bytes; Linux's limit for one environment "
                                    f"string (MAX_ARG_STRLEN) is {MAX_ARG_STRLEN} bytes (execve fails with "
                                    "E2BIG: 'Argument list too long'); pass large data as a file")
            if total > ARG_MAX:
                raise XrunError(f"env: container {name}'s command and environment total {total} bytes; Linux's "
                                f"limit for arguments and environment together (ARG_MAX) is {ARG_MAX} bytes "
                                "(execve fails with E2BIG)")


def check_object_size(manifest: dict[str, Any]) -> None:
    """The object as the API server receives it (JSON) against etcd's request limit."""
    size = len(json.dumps(manifest, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogateescape"))
    if size > MAX_OBJECT_BYTES:
        raise XrunError(f"manifest: the JobSet is {size} bytes as JSON; Kubernetes accepts objects of at most "
                        f"{MAX_OBJECT_BYTES} bytes (etcd --max-request-bytes): shrink env, annotations or labels")


def check(manifest: dict[str, Any], user_env: set[str]) -> None:
    check_exec_limits(manifest, user_env)
    check_object_size(manifest)
