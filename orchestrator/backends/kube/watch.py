"""A followed run's JobSet and pods kept current by watches, as an informer does.

``xrun submit --follow`` asks for the run's state every half second. Asking the API server
each time (GET the JobSet, LIST its pods) costs two requests per tick and a LIST of every
pod: at a 1,024-host multislice run that is megabytes a second and what the API server's
priority-and-fairness throttles. Instead, like client-go's reflector, one LIST per kind
to start, then one watch per kind from its resourceVersion, with bookmarks so a watch
reopened after the server's timeout resumes without listing again (a 410 Gone lists
again). The state is computed from this cache; the API server sees a constant number of
requests however many pods the run has.

Pods are kept as ``state`` projects every pod (``state._Pod``: what ``state.host_status``
and the attempt of a resumed run read), listed or watched alike, so the cache of 1,024
pods stays small.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import TYPE_CHECKING, Any

from orchestrator.backends.kube.state import (
    ApiUnavailable,
    loads,
    loads_pod_event,
    loads_pods,
    one_line,
    shut_down,
)
from xrun_contract.errors import EXIT_FAILED, XrunError
from xrun_contract.k8s import JOBSET_GROUP, JOBSET_PLURAL, JOBSET_VERSION, Labels

if TYPE_CHECKING:
    from orchestrator.backends.kube.backend import KubeBackend

# A watch's server-side timeout (client-go's reflectors pick 5-10 min): the one request
# per watch and this period; bookmarks keep the resourceVersion fresh in between.
WATCH_SECONDS = 300
# How long the first LIST of both kinds may take before status() answers without them.
SYNC_TIMEOUT = 30.0
# The API server unreachable this long (from the first failure of a run of them): status()
# raises ApiUnavailable so the follower says so; the watches keep retrying meanwhile.
STALE_AFTER = 5.0


class _Expired(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class RunWatch:
    """The JobSet ``name`` and its pods, listed once and then watched, in two threads."""

    def __init__(self, backend: KubeBackend, name: str, *, watch_seconds: int = WATCH_SECONDS):
        self.b, self.name, self.watch_seconds = backend, name, watch_seconds
        self.lock = threading.Lock()
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> pod (state's projection)
        self.jobset: dict[str, Any] | None = None
        self.synced = {"pods": threading.Event(), "jobsets": threading.Event()}
        self.failed: XrunError | None = None  # a refusal (RBAC, CRD gone): not retried
        self.unavailable_since: float | None = None
        self.last_error: XrunError | None = None
        self.version = 0  # bumped on every change: callers recompute only then
        self.stop = threading.Event()
        self.responses: set[Any] = set()
        self.threads = [
            threading.Thread(target=self._guard, args=("pods",), daemon=True, name=f"xrun-watch-pods-{name}"),
            threading.Thread(target=self._guard, args=("jobsets",), daemon=True, name=f"xrun-watch-jobset-{name}"),
        ]

    def start(self) -> RunWatch:
        for t in self.threads:
            t.start()
        return self

    def close(self) -> None:
        self.stop.set()
        with self.lock:
            open_responses = list(self.responses)
        shut_down(open_responses)

    def snapshot(self) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """(JobSet or None, pods) as last seen. Raises a refusal, or ApiUnavailable once the
        API server has been unreachable for STALE_AFTER seconds."""
        deadline = time.monotonic() + SYNC_TIMEOUT
        for ev in self.synced.values():
            while not ev.wait(0.05):
                if self.failed is not None:
                    raise self.failed
                if time.monotonic() > deadline:
                    raise self.last_error or ApiUnavailable(
                        f"no answer listing run {self.name} in {SYNC_TIMEOUT:.0f}s", 3)
        if self.failed is not None:
            raise self.failed
        since = self.unavailable_since
        if since is not None and time.monotonic() - since > STALE_AFTER and self.last_error is not None:
            raise self.last_error
        with self.lock:
            return self.jobset, list(self.pods.values())

    # --- the two reflectors -------------------------------------------------------------
    def _guard(self, kind: str) -> None:
        try:
            self._reflect(kind)
        except XrunError as e:
            self.failed = e
        except Exception as e:  # noqa: BLE001 - a bug surfaces through status(), not silently
            self.failed = XrunError(f"watching {kind} of {self.name} failed: {type(e).__name__}: "
                                    f"{one_line(str(e), 200)}", EXIT_FAILED)

    def _request(self, kind: str, **kwargs: Any):
        custom, core = self.b._apis()
        if kind == "pods":
            return self.b._raw(core.list_namespaced_pod, self.b.namespace,
                               label_selector=f"{Labels.JOBSET_NAME}={self.name}", **kwargs)
        return self.b._raw(custom.list_namespaced_custom_object, JOBSET_GROUP, JOBSET_VERSION,
                           self.b.namespace, JOBSET_PLURAL, field_selector=f"metadata.name={self.name}",
                           **kwargs)

    def _list(self, kind: str) -> str:
        resp = self._request(kind)
        try:
            data = (loads_pods if kind == "pods" else loads)(resp.data)
        finally:
            resp.release_conn()
        items = data.get("items") or []
        with self.lock:
            if kind == "pods":
                self.pods = {(p.get("metadata") or {}).get("uid", ""): p for p in items}
            else:
                self.jobset = items[0] if items else None
            self.version += 1
        self.synced[kind].set()
        return (data.get("metadata") or {}).get("resourceVersion", "")

    def _apply(self, kind: str, etype: str, obj: dict[str, Any]) -> None:
        with self.lock:
            if kind == "pods":
                uid = (obj.get("metadata") or {}).get("uid", "")
                if etype == "DELETED":
                    self.pods.pop(uid, None)
                else:
                    self.pods[uid] = obj
            else:
                self.jobset = None if etype == "DELETED" else obj
            self.version += 1

    def _ok(self) -> None:
        self.unavailable_since, self.last_error = None, None

    def _outage(self, error: XrunError, count: int) -> None:
        self.last_error = error
        if self.unavailable_since is None:
            self.unavailable_since = time.monotonic()
        self.stop.wait(min(0.2 * count, 2.0))

    def _reflect(self, kind: str) -> None:
        """LIST, then WATCH from its resourceVersion until stopped: a watch the server ends
        (its timeout) is reopened from the last resourceVersion seen (bookmarks included),
        a dropped connection too; a 410 lists again."""
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines
        from urllib3.exceptions import HTTPError

        resource = "pods" if kind == "pods" else f"{JOBSET_PLURAL}.{JOBSET_GROUP}"
        decode = loads_pod_event if kind == "pods" else json.loads
        rv, failures = "", 0
        while not self.stop.is_set():
            try:
                if not rv:
                    rv = self._list(kind)
                resp = self._request(kind, watch=True, resource_version=rv, allow_watch_bookmarks=True,
                                     timeout_seconds=self.watch_seconds,
                                     timeout=(self.b.request_timeout[0], self.watch_seconds + 30))
                with self.lock:
                    self.responses.add(resp)
                self._ok()
                failures = 0
                try:
                    for line in iter_resp_lines(resp):
                        if not line.strip():
                            continue
                        event = decode(line)
                        obj, etype = event.get("object") or {}, event.get("type")
                        if etype == "ERROR":
                            if obj.get("code") == 410:
                                raise _Expired
                            raise XrunError(f"watching {resource} of {self.name}: "
                                            f"{one_line(obj.get('message', ''))}", EXIT_FAILED)
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        if etype in ("ADDED", "MODIFIED", "DELETED"):
                            self._apply(kind, etype, obj)
                finally:
                    with self.lock:
                        self.responses.discard(resp)
                    with contextlib.suppress(Exception):
                        resp.release_conn()
            except _Expired:
                rv = ""
            except ApiException as e:
                if e.status == 410:
                    rv = ""
                    continue
                error = self.b.api_error(e, "watch", resource)
                if not isinstance(error, ApiUnavailable):
                    raise error from None
                failures += 1
                self._outage(error, failures)
            except ApiUnavailable as e:
                failures += 1
                self._outage(e, failures)
            except (HTTPError, OSError, ValueError) as e:
                if self.stop.is_set():
                    return
                failures += 1
                self._outage(self.b.unreachable(e), failures)
