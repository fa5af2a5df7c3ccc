"""Which failures are the infrastructure's and which are the user's (#11 §3).

JobSet restarts a job only on a restartable exit code (``restartable_exit_codes``, default
42 and 127-255); anything else fails it for good. So the exit code must say whose fault a
failure is: a peer that died, a coordinator that went away or storage that kept failing
after retries is not a bug, and a restart (from the last checkpoint) is the right answer;
a Python exception in the user's code is a bug, and a restart would only fail again.

``classify`` walks an exception, its ``__cause__`` / ``__context__`` chain and exception
groups, and matches *types* where a library has one and the *status texts* where the
runtime only has a message. The texts are the upstream ones:

* XLA / PjRt errors reach Python as ``jax.errors.JaxRuntimeError`` whose message starts
  with the absl status code name (``xla/python/status_casters.h``: ``ThrowIfError`` →
  ``XlaRuntimeError(status.ToString())``, e.g. ``"UNAVAILABLE: ..."``). JAX's own tests
  match the same prefix (``jax/_src/test_multiprocess.py``: ``msg.startswith(
  "DEADLINE_EXCEEDED")`` on a ``wait_at_barrier`` whose peer failed).
* The coordination service (``xla/tsl/distributed_runtime/coordination/
  coordination_service.cc``) reports a dead peer as ``UNAVAILABLE: The following tasks are
  unhealthy (stopped sending heartbeats): /job:jax_worker/replica:0/task:N``, propagates it
  to every task ("Polled an error from coordination service", ``coordination_service_agent
  .cc``) and a restarted peer as ``ABORTED: ... unexpectedly tried to connect with a
  different incarnation``. The client's missed-heartbeat callback (``xla/pjrt/distributed/
  client.h``) then ends the process with ``LOG(QFATAL) << "Terminating process because the
  JAX distributed service detected fatal errors. ..."`` — a native exit that Python never
  sees, so :func:`classify_output` reads that line from the process's output (the pod
  launcher, workload/launcher.sh, looks for it).
* Gloo (CPU collectives) fails a collective whose peer vanished with ``Connection closed by
  peer`` / ``Connection reset by peer`` / ``Gloo error``; NCCL with ``NCCL error``/
  ``unhandled system error`` / ``remote process exited``.
* Storage after retries: ``google.api_core.exceptions`` ``ServerError`` (5xx) and
  ``TooManyRequests`` (429) from google-cloud-storage; gcsfs's ``HttpError`` with ``code``
  ≥ 500 or 429 (``gcsfs/retry.py`` retries exactly those, then raises); TensorStore's GCS
  driver (``tensorstore/kvstore/gcs_http``) raises ``ValueError("ABORTED: All N retry
  attempts failed: ... [http_response_code='503']")`` after its retries, and
  ``PERMISSION_DENIED: ... [http_response_code='403']`` for a 403 (the user's); ``ConnectionError``
  and ``TimeoutError`` from any client.

Native deaths never reach ``classify``: a process killed by a signal exits 128 + N
(``xrun_contract.exit_code_for_signal``), and SIGABRT (134) and SIGSEGV (139) stay in the
default restartable set on purpose. In a JAX job they are the runtime's far more often than
the user's: XLA's and the coordination service's fatal paths end in ``LOG(FATAL)`` →
``abort()``, and a lost accelerator or driver fault kills with SIGSEGV/SIGBUS, while a
user's Python bug raises an exception (exit 1). A deterministic native crash costs at most
``max_restarts`` restarts, each from the last checkpoint; failing for good on a transient
runtime abort would lose the run.

Anything else is the user's: a ``ValueError`` in config, a shape error in the model, a
missing data file (``FileNotFoundError`` is an ``OSError`` but not a connection problem).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from xrun_contract.storage import StorageError

# absl status codes (absl/status/status.h) that mean "the other side is gone or slow",
# at the start of a message or after "absl::Status: ".
_STATUS_RE = re.compile(r"(?:^|absl::Status: |\n|: )(?P<code>UNAVAILABLE|DEADLINE_EXCEEDED|ABORTED)"
                        r"(?::|;| )")
# Coordination service / distributed runtime texts (upstream files in the module docstring).
_DISTRIBUTED_TEXTS = (
    "The following tasks are unhealthy (stopped sending heartbeats)",
    "Polled an error from coordination service",
    "Terminating process because the JAX distributed service detected fatal errors",
    "unexpectedly tried to connect with a different incarnation",
    "/job:jax_worker/",
    "coordination service",
    "Coordination service",
    "heartbeat",
)
_COLLECTIVE_TEXTS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Gloo error",
    "Gloo AllGather failed",  # observed: "UNKNOWN: Gloo AllGather failed: [.../pair.cc:538]
    "Gloo AllReduce failed",  # Read error [127.0.0.1]:8860: Connection reset by peer"
    "gloo::IoException",
    "NCCL error",
    "remote process exited",
    "unhandled system error",
)
# "HTTP response code: 503" (generic) and TensorStore's "[http_response_code='503']", as its
# GCS driver raises after its retries, measured here against a local server answering 503:
# "ABORTED: All 1 retry attempts failed: backend error [http_response_code='503'] ...".
_HTTP_CODE_RE = re.compile(
    r"(?:HTTP (?:response )?(?:code|status)[: ]+|http_response_code=')(?P<code>\d{3})", re.I)
# Transient by HTTP semantics: request timeout, too many requests, any server error.
_TRANSIENT_HTTP = re.compile(r"408|429|5\d\d")


@dataclass(frozen=True)
class Failure:
    """``kind`` is ``"infrastructure"`` (restart it) or ``"user"`` (a bug: do not)."""

    kind: str
    why: str

    @property
    def restartable(self) -> bool:
        return self.kind == "infrastructure"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, what caused it, what it happened during, and group members."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [x for x in (e.__cause__, e.__context__) if x is not None]
        todo += list(getattr(e, "exceptions", ()) or ())  # ExceptionGroup


def _http_status(e: BaseException) -> int | None:
    """The HTTP status of a storage client error, where the client records one."""
    for attr in ("code", "status", "status_code"):
        value = getattr(e, attr, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    return None


def _storage_type(e: BaseException) -> str | None:
    """google-api-core / gcsfs exception types for 429 and 5xx (after their own retries)."""
    names = {c.__module__ + "." + c.__qualname__ for c in type(e).__mro__}
    if names & {"google.api_core.exceptions.ServerError",
                "google.api_core.exceptions.TooManyRequests"}:
        return f"storage {type(e).__name__} ({_http_status(e)})"
    if "gcsfs.retry.HttpError" in names or "google.auth.exceptions.TransportError" in names:
        status = _http_status(e)
        if status is None or status == 429 or status >= 500:
            return f"storage {type(e).__name__} ({status})"
    return None


def classify_text(text: str) -> str | None:
    """Why ``text`` (an error message or a process's output) is an infrastructure failure,
    or None."""
    for needle in _DISTRIBUTED_TEXTS:
        if needle in text:
            return f"distributed runtime: {needle!r}"
    for needle in _COLLECTIVE_TEXTS:
        if needle in text:
            return f"collective: {needle!r}"
    m = _HTTP_CODE_RE.search(text)
    if m:  # the storage answered: its code decides (403 wrong permissions is the user's)
        return f"storage: HTTP {m['code']}" if _TRANSIENT_HTTP.fullmatch(m["code"]) else None
    m = _STATUS_RE.search(text)
    if m:
        return f"runtime status {m['code']}"
    return None


def classify(exc: BaseException) -> Failure:
    """Infrastructure (restartable) or user (not) for an exception that ended training."""
    for e in _chain(exc):
        if isinstance(e, StorageError):  # sorted where it was raised (classify_storage_error)
            return Failure("user" if e.permanent else "infrastructure", f"storage: {e.why}")
        if isinstance(e, ConnectionError | TimeoutError):
            return Failure("infrastructure", f"{type(e).__name__}: {e}")
        why = _storage_type(e)
        if why:
            return Failure("infrastructure", why)
        why = classify_text(str(e))
        if why:
            return Failure("infrastructure", why)
    return Failure("user", f"{type(exc).__name__}: {exc}")


# The line the pod launcher (workload/launcher.sh, which must spell it the same) looks for
# in a child's output when the child exited 1 without a Python traceback: absl's QFATAL exit
# after a missed heartbeat (see above).
NATIVE_FATAL_TEXT = "Terminating process because the JAX distributed service detected fatal errors"


def classify_output(tail: str) -> Failure | None:
    """For a process that died in native code (no Python exception to inspect): the
    infrastructure failure its last output shows, or None."""
    if NATIVE_FATAL_TEXT in tail:
        return Failure("infrastructure", "JAX distributed service detected fatal errors "
                                         "(a peer or the coordinator died)")
    return None
