"""`xrun logs -f` on the real control plane (tests/cluster/up.sh): pod logs served by KWOK
from files through the API server's pods/log endpoint, followed through an API-server
restart, an etcd compaction (the pod watch answered 410 Gone) and a container restart,
without losing or repeating a line.

Where a kube run's lines come from: `xrun logs` (services/logs.py) streams every attempt
that has live pods from the cluster (backend.stream_logs: a pod watch plus one followed
pods/log stream per pod) and only older attempts from storage; `xrun submit --follow`
(services/follow.py) reads storage only (the chunks each pod's log shipper writes), so it
never touches pods/log. These tests therefore follow with `xrun logs -f`; KWOK pods ship
nothing to storage, so every line printed came through the API server.

A feeder thread plays the workload: it watches the JobSet's pods, creates the KWOK Logs
object of each new pod before it runs, and appends numbered lines over time.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import xrun_popen
from cluster_helpers import Cluster, timing, unique
from test_cluster_lifecycle import cli, run_file

CONTAINER = "workload"
LINE = re.compile(r"^\[(?P<prefix>[^\]]+)\] (?P<host>\d+-\d+) n=(?P<n>\d+)(?P<tag>\S*)$")


@pytest.fixture
def storage(gcs_bucket) -> str:
    return f"{gcs_bucket}/xrun"


class Feeder(threading.Thread):
    """Serves each new pod's log from a file and appends ``lines`` numbered lines to it,
    one every ``every`` seconds. ``pause`` (an Event) holds the writing; ``on_line(pod,
    n)`` runs before line n of a pod is written (the test's disruption hook)."""

    def __init__(self, cluster: Cluster, jobset: str, lines: int = 40, every: float = 0.2,
                 on_line=None):
        super().__init__(daemon=True)
        self.c, self.js, self.lines, self.every = cluster, jobset, lines, every
        self.on_line = on_line or (lambda pod, host, n: None)
        self.stop = threading.Event()
        self.served: dict[str, str] = {}  # pod name -> host
        self.written: dict[str, list[str]] = {}  # host -> lines, in order
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._writers: list[threading.Thread] = []

    def run(self) -> None:
        from orchestrator.backends.kube.state import pod_host

        try:
            while not self.stop.is_set():
                try:
                    pods = self.c.pods(self.js)
                except Exception:  # noqa: BLE001 - the API server may be restarting
                    time.sleep(0.2)
                    continue
                for pod in pods:
                    name = pod["metadata"]["name"]
                    if name in self.served:
                        continue
                    host, _ = pod_host(pod)
                    self.c.serve_logs(name, [CONTAINER])
                    self.served[name] = host
                    t = threading.Thread(target=self._write, args=(name, host), daemon=True)
                    self._writers.append(t)
                    t.start()
                if self._writers and all(not t.is_alive() for t in self._writers):
                    self.done.set()
                time.sleep(0.05)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e
            self.done.set()

    def _write(self, pod: str, host: str) -> None:
        try:
            for n in range(self.lines):
                if self.stop.is_set():
                    return
                self.on_line(pod, host, n)
                text = f"{host} n={n:03d}"
                self.c.write_log(pod, CONTAINER, [text])
                self.written.setdefault(host, []).append(text)
                time.sleep(self.every)
        except BaseException as e:  # noqa: BLE001
            self.error = e


def printed(out: str) -> dict[str, list[str]]:
    """host -> the numbered lines `xrun logs` printed for it, in order; every line's
    prefix must be its own host's."""
    got: dict[str, list[str]] = {}
    for line in out.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        assert m["prefix"] == m["host"], line  # "[0-1]": attempt 0 has no "#N"
        got.setdefault(m["host"], []).append(f"{m['host']} n={m['n']}{m['tag']}")
    return got


def follow_logs(cluster: Cluster, storage: str, tmp_path: Path, name: str, feeder: Feeder,
                run_s: float, disrupt=None, timeout: float = 150) -> tuple[str, str]:
    """Submit detached, start `xrun logs -f`, feed lines, disrupt; the CLI's output."""
    r = cli(cluster, storage, "submit", "-d", "-f",
            run_file(tmp_path, name, pod_annotations=timing(run_s=run_s, start_s=4.0)))
    assert r.returncode == 0, r.stderr
    feeder.start()
    cluster.wait("the pods' logs served", lambda: len(feeder.served) == 2, 60)
    follow = xrun_popen("logs", name, "-f", storage=storage, KUBECONFIG=cluster.kubeconfig)
    try:
        if disrupt is not None:
            disrupt()
        out, err = follow.communicate(timeout=timeout)
    except BaseException:
        follow.kill()
        out, err = follow.communicate()
        print(out, err)
        raise
    finally:
        feeder.stop.set()
    assert feeder.error is None, feeder.error
    assert follow.returncode == 0, err
    return out, err


def assert_exact(feeder: Feeder, out: str, err: str) -> None:
    got = printed(out)
    assert sorted(feeder.written) == ["0-0", "0-1"]
    for host, lines in feeder.written.items():
        assert got.get(host) == lines, (host, err[-2000:])
    assert sorted(got) == sorted(feeder.written)


def wait_line(feeder: Feeder, n: int, timeout: float = 60) -> None:
    Cluster.wait(None, f"line {n} written on every host",  # type: ignore[arg-type]
                 lambda: all(len(v) > n for v in feeder.written.values()) and len(feeder.written) == 2,
                 timeout, 0.05)


def test_logs_follow_survives_an_apiserver_restart(cluster, storage, tmp_path):
    name = unique("lga")
    feeder = Feeder(cluster, name, lines=50, every=0.2)

    def disrupt() -> None:
        wait_line(feeder, 15)
        cluster.restart_apiserver()

    out, err = follow_logs(cluster, storage, tmp_path, name, feeder, run_s=22, disrupt=disrupt)
    assert_exact(feeder, out, err)


def test_logs_follow_ends_when_the_run_ends(cluster, storage, tmp_path):
    """KWOK, like a kubelet whose runtime does not answer, never ends a followed log: the
    follower must end it itself once the container is done (it waited 300 s before), and
    soon after the JobSet is: its Completed condition comes with no pod event, and the pod
    watch's 10 s server timeout used to be what ended the follow."""
    name = unique("lge")
    feeder = Feeder(cluster, name, lines=20, every=0.1)
    started = time.monotonic()
    out, err = follow_logs(cluster, storage, tmp_path, name, feeder, run_s=8, timeout=90)
    ended = dt.datetime.now(dt.UTC)
    assert_exact(feeder, out, err)
    assert time.monotonic() - started < 60
    completed = next(c for c in cluster.jobset(name)["status"]["conditions"]
                     if c["type"] == "Completed" and c["status"] == "True")
    at = dt.datetime.fromisoformat(completed["lastTransitionTime"].replace("Z", "+00:00"))
    # The condition's time is whole seconds (floored): up to 1 s of this is its rounding.
    assert (ended - at).total_seconds() < 5, (completed, ended.isoformat())


def watches_after(cluster: Cluster, name: str, since: str) -> list[int]:
    """The resourceVersions xrun's pod watches of run ``name`` resumed from, in order, for
    the watches the API server received after ``since`` (RFC3339, from the audit log)."""
    out = []
    for e in cluster.audit_lines():
        uri = e.get("requestURI", "")
        if (e.get("verb") == "watch" and e.get("stage") == "ResponseStarted"
                and f"jobset-name%3D{name}" in uri and e["requestReceivedTimestamp"] > since):
            m = re.search(r"resourceVersion=(\d+)", uri)
            if m:
                out.append(int(m[1]))
    return out


def test_logs_follow_survives_a_compaction_410(cluster, storage, tmp_path):
    """A compaction alone does not expire a watch: the API server's watch cache still
    serves the old resourceVersion (checked on kube-apiserver 1.36.3). The restarted API
    server's cache begins at etcd's current revision, so the follower's next watch, from
    its last resourceVersion (now compacted away), is answered 410 Gone (an ERROR event);
    it lists the pods again and watches from the list."""
    name = unique("lgc")
    feeder = Feeder(cluster, name, lines=50, every=0.2)
    marks: dict[str, Any] = {}

    def disrupt() -> None:
        wait_line(feeder, 15)
        marks["compacted"] = cluster.compact_etcd()
        marks["killed_at"] = cluster.etcd_revision()
        old = cluster.kill_apiserver()
        marks["since"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        cluster.wait_apiserver(old)

    out, err = follow_logs(cluster, storage, tmp_path, name, feeder, run_s=22, disrupt=disrupt)
    assert_exact(feeder, out, err)
    rvs = watches_after(cluster, name, marks["since"])
    # The new API server's first watch of the follower resumed from before the kill, older
    # than the new watch cache (the 410), a later one from the list it made then.
    assert len(rvs) >= 2 and rvs[0] <= marks["killed_at"] < rvs[-1], (marks, rvs)


def test_logs_follow_reads_a_restarted_containers_previous_log(cluster, storage, tmp_path):
    """Host 0-0's container restarts while the follower's stream is down (the API server
    restarting): the old container's last lines are only in its previous log. They are
    read (``previous=true``, from the last line passed on), then the new container's."""
    name = unique("lgr")
    state: dict[str, Any] = {}

    def on_line(pod: str, host: str, n: int) -> None:
        if host != "0-0" or n != 20:
            return
        old = cluster.kill_apiserver()
        tail = [f"{host} n=019.tail{k}" for k in range(5)]  # the old container's last lines
        cluster.write_log(pod, CONTAINER, tail)
        feeder.written[host].extend(tail)
        cluster.restart_container_log(pod, CONTAINER)
        cluster.wait_apiserver(old)
        state["restarts"] = cluster.mark_container_restarted(pod, CONTAINER)
        time.sleep(1)  # the new container's first line comes after its status

    feeder = Feeder(cluster, name, lines=40, every=0.2, on_line=on_line)
    out, err = follow_logs(cluster, storage, tmp_path, name, feeder, run_s=22)
    assert state.get("restarts") == 1, (feeder.written, out[-3000:], err[-2000:])
    assert_exact(feeder, out, err)


def test_submit_follow_survives_an_apiserver_restart(cluster, storage, tmp_path):
    """`xrun submit --follow` reads the hosts' lines from storage (the pods' log shippers),
    never pods/log, and the cluster only for the run's state: an API-server restart
    mid-run is a warning, and the run is followed to its end."""
    name = unique("lgs")
    follow = xrun_popen("submit", "--follow", "-f",
                        run_file(tmp_path, name, pod_annotations=timing(run_s=12, start_s=2.0)),
                        storage=storage, KUBECONFIG=cluster.kubeconfig)
    try:
        cluster.wait("pods Running", lambda: len([p for p in cluster.pods(name)
                                                  if p["status"].get("phase") == "Running"]) == 2, 60)
        cluster.restart_apiserver()
        out, err = follow.communicate(timeout=120)
    finally:
        follow.kill()
    assert follow.returncode == 0, err
    assert f"run {name}: Succeeded" in err
