"""Every pod's log at once: one thread per pod log, one pod watch, a queue to the caller.

Dropped watches resume from their resourceVersion (410 Gone lists again); dropped log
streams resume from the last line's timestamp without repeating a line; new pods of a
JobSet restart are picked up from the watch.
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from orchestrator.backends.kube.state import (
    CONTAINER,
    ApiUnavailable,
    container_done,
    container_started,
    jobset_state,
    one_line,
    parse_time,
    pod_host,
    restart_count,
    run_attempt,
    shut_down,
)
from xrun_contract import DELETED, FAILED, SUCCEEDED
from xrun_contract.errors import EXIT_FAILED, XrunError
from xrun_contract.k8s import Labels

if TYPE_CHECKING:
    from orchestrator.backends.kube.backend import KubeBackend

# Re-fetch a log from this many seconds before its last line when a stream is resumed;
# the overlap (clock skew between us and the node) is dropped by timestamp.
LOG_RESUME_SLACK_SECONDS = 10
# A followed log silent this long is reopened (from its last line): cheap, and it notices a
# connection that died without a FIN.
FOLLOW_READ_TIMEOUT = 300.0
# A pod log request the apiserver could not proxy to the node's kubelet (5xx: the node is
# rebooting, being repaired, or its kubelet is overloaded) is retried, from the last line,
# for this long while the pod exists; then the run is reported unreachable.
KUBELET_RETRY_SECONDS = 300.0
# The API server unreachable or answering 5xx (restarted, or upgraded: a zonal GKE cluster's
# API is down for minutes) is waited out this long from the first failure of a run of them;
# the pod watch and every log stream then resume where they were.
API_RETRY_SECONDS = 300.0
# Once every pod's container is done, the pod watch is reopened with this server timeout
# until the JobSet is finished: its Completed/Failed condition comes with no pod event, and
# the watch's usual timeout (watch_timeout_seconds, 10 s) kept `logs -f` that long past the end.
SETTLE_WATCH_SECONDS = 1


_DONE = object()


class _LogSession:
    def __init__(self, backend: KubeBackend, name: str, follow: bool, since_seconds: int | None,
                 tail_lines: int | None, hosts: set[str] | None):
        self.b, self.name, self.follow = backend, name, follow
        self.since_seconds, self.tail_lines, self.hosts = since_seconds, tail_lines, hosts
        self.q: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.started: set[str] = set()  # pod uids with a pump
        self.pumps: list[threading.Thread] = []
        self.watcher: threading.Thread | None = None
        self.stop = threading.Event()
        self.responses: set[Any] = set()
        # Pods whose container has ended (or the run has): their followed streams are ended
        # by us, not left to the server, then read once more from their last line.
        self.ended: set[str] = set()
        self.streams: dict[str, Any] = {}  # pod uid -> its open followed log response
        # pod uid -> the workload container's restartCount as last seen (watch or pump): a
        # restarted container's last lines may be only in its previous log.
        self.restarts: dict[str, int] = {}

    # Lifecycle
    def run(self) -> Iterator[tuple[str, int, str]]:
        pods, rv = self.b.list_pods(self.name)
        if not pods and self.follow and self.b.get_jobset(self.name) is None:
            return
        for pod in pods:
            self.consider(pod)
        if self.follow:
            self.watcher = threading.Thread(target=self._guard, args=(self._watch, rv), daemon=True,
                                            name=f"xrun-watch-{self.name}")
            self.watcher.start()
        try:
            while True:
                try:
                    item = self.q.get(timeout=0.1)
                except queue.Empty:
                    if self._finished():
                        while not self.q.empty():
                            yield from self._emit(self.q.get_nowait())
                        return
                    continue
                yield from self._emit(item)
        finally:
            self.close()

    def _emit(self, item: Any) -> Iterator[tuple[str, int, str]]:
        if isinstance(item, XrunError):
            raise item
        yield item

    def _finished(self) -> bool:
        with self.lock:
            pumps_done = all(not t.is_alive() for t in self.pumps)
        return pumps_done and (self.watcher is None or not self.watcher.is_alive())

    def close(self) -> None:
        self.stop.set()
        with self.lock:
            open_responses = list(self.responses)
        shut_down(open_responses)

    def _guard(self, fn: Callable, *args: Any) -> None:
        """Run a worker; its XrunError reaches the caller through the queue."""
        try:
            fn(*args)
        except XrunError as e:
            if not self.stop.is_set():
                self.q.put(e)
        except Exception as e:  # noqa: BLE001 - a bug must surface, not end the stream quietly
            if not self.stop.is_set():
                self.q.put(XrunError(f"log streaming failed: {type(e).__name__}: {one_line(str(e), 200)}", EXIT_FAILED))

    def _open(self, fn: Callable, *args: Any, **kwargs: Any):
        resp = self.b._raw(fn, *args, **kwargs)
        with self.lock:
            self.responses.add(resp)
        return resp

    def _release(self, resp: Any) -> None:
        with self.lock:
            self.responses.discard(resp)
        with contextlib.suppress(Exception):
            resp.release_conn()

    # Pods
    def consider(self, pod: dict[str, Any]) -> None:
        """Start a log pump for a pod whose container has started, once per pod."""
        meta = pod.get("metadata") or {}
        uid = meta.get("uid") or meta.get("name", "")
        host, _ = pod_host(pod)
        if self.hosts and host not in self.hosts:
            return
        if not container_started(pod):
            return
        if container_done(pod):
            self._end(uid)
        self._note_restarts(uid, restart_count(pod))
        with self.lock:
            if uid in self.started or self.stop.is_set():
                return
            self.started.add(uid)
            t = threading.Thread(target=self._guard, args=(self._pump, pod), daemon=True,
                                 name=f"xrun-log-{meta.get('name')}")
            self.pumps.append(t)
        t.start()

    def _note_restarts(self, uid: str, count: int) -> None:
        """The workload container of pod ``uid`` has restarted ``count`` times: a pump
        reading an older container is cut, so it reads the previous log's rest first."""
        with self.lock:
            if count <= self.restarts.get(uid, 0):
                return
            self.restarts[uid] = count
            resp = self.streams.get(uid)
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()

    def _end(self, uid: str | None = None) -> None:
        """The container of pod ``uid`` (every pod's, when None) has ended: close its followed
        log stream. A kubelet ends it by itself, once the container is not running, but not
        when it cannot tell (its runtime not answering: crilogs assumes running, and KWOK
        always does) nor when the connection died without a FIN; the pump then reads the
        log once more, unfollowed, from its last line, so nothing is lost."""
        with self.lock:
            uids = [uid] if uid is not None else list(self.started)
            self.ended.update(uids)
            open_streams = [self.streams[u] for u in uids if u in self.streams]
        for resp in open_streams:
            with contextlib.suppress(Exception):
                resp.shutdown()

    def _terminal(self) -> bool:
        jobset = self.b.get_jobset(self.name)
        if jobset is None:
            return True
        return jobset_state(jobset, [])[0] in (SUCCEEDED, FAILED, DELETED)

    def _watch(self, rv: str) -> None:
        try:
            self._watch_pods(rv)
        finally:
            if not self.stop.is_set():
                self._end()  # the run is over (or the watch failed): no stream follows on

    def _watch_pods(self, rv: str) -> None:
        """Follow the pod list from ``rv`` until the JobSet is finished or gone.

        A dropped connection resumes from the last resourceVersion seen (no event twice);
        a 410 Gone lists again. The JobSet is checked whenever a pod ends or goes, and
        whenever the server closes the watch (``timeoutSeconds``).
        """
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines
        from urllib3.exceptions import HTTPError

        _, core = self.b._apis()
        outage = _Outage(self.stop)
        relist = False
        # pod uid -> its container is done. Once every pod's is, the JobSet's verdict comes
        # later, with no pod event of its own: the watch is then closed by the server after
        # SETTLE_WATCH_SECONDS, not watch_timeout_seconds, so the follow ends soon after the run.
        done: dict[str, bool] = {}
        while not self.stop.is_set():
            try:
                if relist:
                    rv, relist = self._relist(), False
                settling = bool(done) and all(done.values())
                timeout_s = SETTLE_WATCH_SECONDS if settling else self.b.watch_timeout_seconds
                resp = self._open(
                    core.list_namespaced_pod, self.b.namespace,
                    label_selector=f"{Labels.JOBSET_NAME}={self.name}", watch=True, resource_version=rv,
                    allow_watch_bookmarks=True, timeout_seconds=timeout_s,
                    timeout=(self.b.request_timeout[0], timeout_s + 30),
                )
                outage.ok()
                try:
                    for line in iter_resp_lines(resp):
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        etype = event.get("type")
                        if etype == "ERROR":
                            if obj.get("code") == 410:
                                raise _Expired
                            raise XrunError(f"watching pods of {self.name}: {one_line(obj.get('message', ''))}",
                                            EXIT_FAILED)
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        if etype in ("ADDED", "MODIFIED"):
                            self.consider(obj)
                        meta = obj.get("metadata") or {}
                        uid = meta.get("uid") or meta.get("name", "")
                        ended = etype == "DELETED" or (etype == "MODIFIED" and container_done(obj))
                        if etype == "DELETED":
                            done.pop(uid, None)
                        elif etype in ("ADDED", "MODIFIED"):
                            done[uid] = container_done(obj)
                        if ended and self._terminal():
                            return
                        if ended and done and all(done.values()):
                            break  # watch again, briefly, until the JobSet says it is over
                finally:
                    self._release(resp)
                if self.stop.is_set() or self._terminal():
                    return
            except _Expired:
                relist = True
            except ApiException as e:
                if e.status == 410:
                    relist = True
                    continue
                error = self.b.api_error(e, "watch", "pods")
                if not isinstance(error, ApiUnavailable):
                    raise error from None
                outage.wait(error)
            except ApiUnavailable as e:
                outage.wait(e)
            except (HTTPError, OSError, ValueError) as e:
                if self.stop.is_set():
                    return
                # a dropped connection: resume from the last resourceVersion
                outage.wait(self.b.unreachable(e))

    def _relist(self) -> str:
        pods, rv = self.b.list_pods(self.name)
        for pod in pods:
            self.consider(pod)
        return rv

    def _pump(self, pod: dict[str, Any]) -> None:
        """Stream one pod's log; resume after a drop without repeating a line."""
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines
        from urllib3.exceptions import HTTPError

        _, core = self.b._apis()
        meta = pod["metadata"]
        pod_name, uid = meta["name"], meta.get("uid") or meta["name"]
        host, attempt = pod_host(pod)[0], run_attempt(pod)  # as its stored chunks are filed
        last: tuple[int, int] | None = None  # timestamp of the last line passed on
        at_last = 0  # lines passed on with exactly that timestamp
        first, follow = True, self.follow
        # The container's restartCount whose log we read; when the pod reports more, the
        # previous container's log is read (from the last line on) before the current one's.
        reading, previous = restart_count(pod), False
        outage = _Outage(self.stop)
        failing_since: float | None = None  # first of a run of 5xx answers
        kubelet_failures = 0
        while not self.stop.is_set():
            with self.lock:
                if uid in self.ended:
                    follow = False
                seen = self.restarts.get(uid, 0)
            if seen > reading:
                # Only the last restart's predecessor has a previous log (the kubelet keeps
                # one): with more restarts since, the ones between are gone.
                previous, reading = True, seen
            streaming = follow and not previous
            kwargs: dict[str, Any] = {"container": CONTAINER, "follow": streaming, "timestamps": True}
            if previous:
                kwargs["previous"] = True
            if first:
                if self.since_seconds is not None:
                    kwargs["since_seconds"] = self.since_seconds
                if self.tail_lines is not None:
                    kwargs["tail_lines"] = self.tail_lines
            elif last is not None:
                kwargs["since_seconds"] = max(1, math.ceil(time.time() - last[0]) + LOG_RESUME_SLACK_SECONDS)
            elif self.since_seconds is not None:
                kwargs["since_seconds"] = self.since_seconds
            clean = False
            try:
                resp = self._open(core.read_namespaced_pod_log, pod_name, self.b.namespace,
                                  timeout=(self.b.request_timeout[0], FOLLOW_READ_TIMEOUT if streaming
                                           else self.b.request_timeout[1]), **kwargs)
                skip, failing_since, kubelet_failures = at_last, None, 0
                outage.ok()
                if streaming:
                    with self.lock:
                        self.streams[uid] = resp
                        ended = uid in self.ended or self.restarts.get(uid, 0) > reading
                    if ended:  # ended while it opened: read what it has, then once more
                        with contextlib.suppress(Exception):
                            resp.shutdown()
                try:
                    for raw in iter_resp_lines(resp):
                        stamp, _, text = raw.partition(" ")
                        ts = parse_time(stamp)
                        if ts is None:
                            text = raw
                        elif last is not None and (ts < last or (ts == last and skip > 0)):
                            if ts == last:
                                skip -= 1
                            continue  # already passed on before the reconnect
                        self.q.put((host, attempt, text))
                        if ts is not None:
                            at_last = at_last + 1 if ts == last else 1
                            last = ts
                            skip = 0
                finally:
                    with self.lock:
                        self.streams.pop(uid, None)
                    self._release(resp)
                clean = True
            except ApiException as e:
                if e.status == 404:
                    return  # pod gone
                if e.status == 400 and previous:
                    previous = False  # no previous container's log (kubelet: not found)
                    continue
                if e.status == 400 and first:
                    with self.lock:  # container not started after all: a later event retries
                        self.started.discard(uid)
                    return
                if e.status < 500 and e.status != 429:
                    raise self.b.api_error(e, "get", "pods/log", pod_name) from None
                # The kubelet is unreachable: retry from the last line passed on while the pod
                # lives (the next read resumes by timestamp, so nothing repeats or is lost).
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > KUBELET_RETRY_SECONDS:
                    raise self.b.api_error(e, "get", "pods/log", pod_name) from None
                kubelet_failures += 1
                current = self._get_pod(core, pod_name, outage)
                if current is None:
                    return
                self.stop.wait(min(0.05 * 2 ** min(kubelet_failures, 6), 2.0))
                continue
            except (HTTPError, OSError) as e:
                if self.stop.is_set():
                    return
                with self.lock:
                    ended = uid in self.ended or self.restarts.get(uid, 0) > reading
                if not (ended and streaming):  # not our own cut: the API server is down
                    outage.wait(self.b.unreachable(e))
            first = False
            if previous:
                previous = not clean  # read; else read it again
                continue
            if clean and not follow:
                return
            if not follow:
                continue  # the final read was cut: read it again
            with self.lock:
                ended = uid in self.ended
            if ended:
                follow = False  # we cut it: read once more, unfollowed, from the last line
                continue
            current = self._get_pod(core, pod_name, outage)
            if current is None:
                return
            self._note_restarts(uid, restart_count(current))
            if container_done(current):
                follow = False  # one last read (from the last line on) catches a cut tail
            elif clean:
                time.sleep(0.1)

    def _get_pod(self, core: Any, pod_name: str, outage: _Outage) -> dict[str, Any] | None:
        """The pod now (None once gone or when stopping), waiting out an API outage."""
        while not self.stop.is_set():
            try:
                current = self.b.call("get", "pods", core.read_namespaced_pod, pod_name, self.b.namespace,
                                      name=pod_name, missing_ok=True)
            except ApiUnavailable as e:
                outage.wait(e)
                continue
            outage.ok()
            return current
        return None


class _Outage:
    """A run of failures to reach the API server: waited out (backing off) for
    ``API_RETRY_SECONDS`` from the first, then the last error is raised."""

    def __init__(self, stop: threading.Event):
        self.stop, self.count = stop, 0
        self.since: float | None = None

    def ok(self) -> None:
        self.since, self.count = None, 0

    def wait(self, error: XrunError) -> None:
        now = time.monotonic()
        self.since = self.since if self.since is not None else now
        if now - self.since > API_RETRY_SECONDS:
            raise error
        self.count += 1
        self.stop.wait(min(0.2 * self.count, 2.0))


class _Expired(Exception):
    """The watch's resourceVersion is too old (410): list again."""
