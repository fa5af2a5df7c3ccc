"""Test-side handle on the real control plane that ``tests/cluster/up.sh`` starts.

The ``cluster`` fixture (tests/conftest.py) starts one per test session through the same
code as ``up.sh``/``down.sh``. This module gives tests the kubeconfig, clients, and the few
things a test does to the cluster itself: pod logs served by KWOK from files (Logs objects,
CRI log format), an API-server restart, an etcd compaction, pods failed with an exit code
(KWOK's chaos stage, by label and annotations).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.client
import json
import os
import signal
import ssl
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
UP, DOWN = REPO / "tests/cluster/up.sh", REPO / "tests/cluster/down.sh"
NAMESPACE = "default"

# KWOK's general pod stages read their timing from pod annotations
# (kustomize/stage/pod/general/pod-*.yaml, see timing()); its chaos stage fails a
# labelled pod with the exit code its annotation names (chaos/pod-container-running-failed).
COMPLETE_DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"
COMPLETE_JITTER = "pod-complete.stage.kwok.x-k8s.io/jitter-delay"
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
FAIL_EXIT = "pod-container-running-failed.stage.kwok.x-k8s.io/exit-code"
FAIL_DELAY = "pod-container-running-failed.stage.kwok.x-k8s.io/delay"
FAIL_JITTER = "pod-container-running-failed.stage.kwok.x-k8s.io/jitter-delay"
FAIL_CONTAINER = "pod-container-running-failed.stage.kwok.x-k8s.io/container-name"


def timing(run_s: float = 3.0, start_s: float = 0.5) -> dict[str, str]:
    """Pod annotations for KWOK's stages: Running after ``start_s``, Succeeded ``run_s`` later.
    KWOK's jitter is the delay's upper bound, not an addition (a jitter below the delay
    replaces it: kwok pkg/utils/lifecycle/lifecycle.go Stage.Delay), so both are equal."""
    step, run = f"{int(start_s * 250)}ms", f"{int(run_s * 1000)}ms"
    out = {COMPLETE_DELAY: run, COMPLETE_JITTER: run}
    # create, init container running, init container completed, ready: a quarter each
    for stage in ("pod-create", "pod-init-container-running", "pod-init-container-completed",
                  "pod-ready"):
        out[f"{stage}.stage.kwok.x-k8s.io/delay"] = step
        out[f"{stage}.stage.kwok.x-k8s.io/jitter-delay"] = step
    return out


class Cluster:
    def __init__(self, root: Path):
        self.root = root
        self.kubeconfig = str(root / "kubeconfig")
        self._api = None

    @property
    def state(self) -> dict[str, Any]:
        return json.loads((self.root / "state.json").read_text())

    # --- clients -------------------------------------------------------------------------
    @property
    def api_client(self):
        if self._api is None:
            from kubernetes import config

            self._api = config.new_client_from_config(self.kubeconfig)
        return self._api

    @property
    def core(self):
        from kubernetes import client

        return client.CoreV1Api(self.api_client)

    @property
    def custom(self):
        from kubernetes import client

        return client.CustomObjectsApi(self.api_client)

    def jobset(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", NAMESPACE, "jobsets", name)

    def pods(self, jobset: str) -> list[dict[str, Any]]:
        out = self.core.list_namespaced_pod(
            NAMESPACE, label_selector=f"jobset.sigs.k8s.io/jobset-name={jobset}",
            _preload_content=False)
        return json.loads(out.data)["items"]

    def wait(self, what: str, check, timeout: float = 60.0, every: float = 0.25):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(every)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")

    def wait_condition(self, name: str, condition: str, timeout: float = 90.0) -> dict[str, Any]:
        def has() -> dict[str, Any] | None:
            js = self.jobset(name)
            conds = (js.get("status") or {}).get("conditions") or []
            return js if any(c["type"] == condition and c["status"] == "True" for c in conds) else None
        return self.wait(f"JobSet {name} {condition}", has, timeout)

    # --- logs served by KWOK ---------------------------------------------------------------
    def log_file(self, pod: str, container: str, previous: bool = False) -> Path:
        d = self.root / "podlogs" / NAMESPACE / pod
        d.mkdir(parents=True, exist_ok=True)
        return d / f"{container}{'.previous' if previous else ''}.log"

    def serve_logs(self, pod: str, containers: list[str]) -> None:
        """Create the Logs object that makes KWOK serve this pod's container logs from
        files (followed), the previous container's from ``*.previous.log``."""
        logs = []
        for c in containers:
            self.log_file(pod, c).touch()
            self.log_file(pod, c, previous=True).touch()
            logs.append({"containers": [c], "logsFile": str(self.log_file(pod, c)),
                         "previousLogsFile": str(self.log_file(pod, c, previous=True)),
                         "follow": True})
        body = {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Logs",
                "metadata": {"name": pod, "namespace": NAMESPACE}, "spec": {"logs": logs}}
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.create_namespaced_custom_object("kwok.x-k8s.io", "v1alpha1", NAMESPACE,
                                                        "logs", body)
        except ApiException as e:
            if e.status != 409:
                raise

    def write_log(self, pod: str, container: str, lines: list[str], *, previous: bool = False,
                  when: dt.datetime | None = None) -> None:
        """Append lines in the CRI log format the kubelet writes (what KWOK reads)."""
        when = when or dt.datetime.now(dt.UTC)
        with self.log_file(pod, container, previous).open("a") as f:
            for i, line in enumerate(lines):
                ts = (when + dt.timedelta(microseconds=i)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                f.write(f"{ts} stdout F {line}\n")

    def complete_pods(self, jobset: str, running: int = 2, timeout: float = 120.0) -> None:
        """Once ``running`` pods of ``jobset`` are Running, make them succeed now: their
        completion delay annotation set to 1 ms (KWOK recomputes a stage's delay when the pod
        changes). A test that needs a run Running until some point gives its pods a long
        ``timing(run_s=...)`` and ends them here, instead of guessing how long that point
        takes to come on a loaded machine."""
        def now_running() -> list[dict[str, Any]] | None:
            pods = [p for p in self.pods(jobset) if p["status"].get("phase") == "Running"
                    and not p["metadata"].get("deletionTimestamp")]
            return pods if len(pods) >= running else None
        for pod in self.wait(f"{running} pods of {jobset} Running", now_running, timeout):
            self.core.patch_namespaced_pod(pod["metadata"]["name"], NAMESPACE, {"metadata": {"annotations": {
                COMPLETE_DELAY: "1ms", COMPLETE_JITTER: "1ms"}}})

    # --- disruptions -----------------------------------------------------------------------
    def fail_pod(self, pod: str, exit_code: int, container: str = "workload") -> None:
        """Make a Running pod's container exit with ``exit_code`` now (KWOK's chaos stage
        ``pod-container-running-failed``, selected by its label, read from annotations)."""
        self.core.patch_namespaced_pod(pod, NAMESPACE, {"metadata": {
            "labels": {FAIL_LABEL: "true"},
            "annotations": {FAIL_EXIT: str(exit_code), FAIL_DELAY: "1ms", FAIL_JITTER: "1ms",
                            FAIL_CONTAINER: container}}})

    def _ready(self) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.root / "pki/ca.crt"))
        ctx.load_cert_chain(str(self.root / "pki/admin.crt"), str(self.root / "pki/admin.key"))
        conn = http.client.HTTPSConnection("127.0.0.1", self.state["ports"]["apiserver"],
                                           context=ctx, timeout=2)
        try:
            conn.request("GET", "/readyz")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def restart_apiserver(self, timeout: float = 90.0) -> None:
        """Kill the API server; the supervisor starts it again. Returns once it is ready."""
        self.wait_apiserver(self.kill_apiserver(), timeout)

    def kill_apiserver(self) -> int:
        """SIGKILL the API server (the supervisor starts another); its pid."""
        old = self.state["pids"]["kube-apiserver"]
        os.kill(old, signal.SIGKILL)
        return old

    def wait_apiserver(self, old: int, timeout: float = 90.0) -> None:
        """Until the API server that replaced ``old`` is ready."""
        self.wait("a new kube-apiserver", lambda: self.state["pids"]["kube-apiserver"] != old, 20)
        self.wait("kube-apiserver ready", self._ready, timeout, every=0.2)

    def restart_container_log(self, pod: str, container: str) -> None:
        """What the kubelet's log files go through when a container restarts: the old
        container's log becomes the previous one (``previous=true``), a new one begins.
        KWOK's followed stream reopens the new file (crilogs follows a recreated file)."""
        self.log_file(pod, container).replace(self.log_file(pod, container, previous=True))
        self.log_file(pod, container).touch()

    def mark_container_restarted(self, pod: str, container: str, exit_code: int = 1) -> int:
        """Patch the pod's status as the kubelet reports a restarted container: restartCount
        one up, the old container in lastState.terminated, the new one running. KWOK has
        no stage that restarts a container in place, and xrun's pods are restartPolicy
        Never, so this is the one way to show a follower a restarted container."""
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        pod_obj = self.core.read_namespaced_pod(pod, NAMESPACE, _preload_content=False)
        status = json.loads(pod_obj.data)["status"]
        statuses = status.get("containerStatuses") or []
        cs = next(c for c in statuses if c["name"] == container)
        cs["restartCount"] = int(cs.get("restartCount") or 0) + 1
        cs["lastState"] = {"terminated": {"exitCode": exit_code, "reason": "Error",
                                          "startedAt": (cs.get("state") or {}).get("running", {}).get("startedAt", now),
                                          "finishedAt": now}}
        cs["state"] = {"running": {"startedAt": now}}
        self.core.patch_namespaced_pod_status(pod, NAMESPACE, {"status": {"containerStatuses": statuses}})
        return cs["restartCount"]

    @contextlib.contextmanager
    def kubelet_unreachable(self, node: str):
        """Within the block, the API server cannot reach ``node``'s kubelet: its status's
        kubelet endpoint (which the API server dials for pods/log) names a port nobody
        listens on, as a kubelet that is down. KWOK serves every node's kubelet on one port
        and never rewrites that field, so this is one node, not all of them."""
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead = s.getsockname()[1]

        def endpoint(port: int) -> None:
            self.core.patch_node_status(node, {"status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}})
        endpoint(dead)
        try:
            yield
        finally:
            endpoint(self.state["ports"]["kwok"])

    def user_kubeconfig(self, tmp_path: Path, user: str, groups: tuple[str, ...] = (),
                        context: str | None = None) -> str:
        """A kubeconfig for a client-certificate user (CN=user, O=groups) signed by the
        cluster's CA: the API server authenticates it, RBAC decides what it may do. Its one
        context is named ``context`` (default: the user's name)."""
        context = context or user
        import base64

        import yaml

        pki, d = self.root / "pki", tmp_path / user
        d.mkdir()
        subj = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
        subprocess.run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                        "-keyout", str(d / "key"), "-out", str(d / "csr"), "-subj", subj], check=True,
                       capture_output=True)
        (d / "ext").write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                               "extendedKeyUsage=clientAuth\n")
        subprocess.run(["openssl", "x509", "-req", "-in", str(d / "csr"), "-CA", str(pki / "ca.crt"), "-CAkey",
                        str(pki / "ca.key"), "-CAcreateserial", "-days", "1", "-extfile", str(d / "ext"),
                        "-out", str(d / "crt")], check=True, capture_output=True)
        cfg = yaml.safe_load(Path(self.kubeconfig).read_text())
        b64 = lambda p: base64.b64encode(p.read_bytes()).decode()  # noqa: E731
        cfg["users"] = [{"name": user, "user": {"client-certificate-data": b64(d / "crt"),
                                                "client-key-data": b64(d / "key")}}]
        cfg["contexts"] = [{"name": context, "context": {"cluster": cfg["clusters"][0]["name"], "user": user,
                                                         "namespace": NAMESPACE}}]
        cfg["current-context"] = context
        path = d / "kubeconfig"
        path.write_text(yaml.safe_dump(cfg))
        return str(path)

    def grant(self, ns: str, name: str, user: str, rules: list[dict[str, Any]], *,
              cluster_wide: bool = False) -> None:
        """A Role (ClusterRole) with ``rules`` bound to ``user`` in ``ns`` (cluster-wide).
        Cluster-wide ones are the caller's to remove (``revoke``)."""
        from kubernetes import client

        rbac = client.RbacAuthorizationV1Api(self.api_client)
        subjects = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
        if cluster_wide:
            rbac.create_cluster_role({"metadata": {"name": name}, "rules": rules})
            rbac.create_cluster_role_binding({"metadata": {"name": name}, "subjects": subjects, "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}})
            return
        rbac.create_namespaced_role(ns, {"metadata": {"name": name}, "rules": rules})
        rbac.create_namespaced_role_binding(ns, {"metadata": {"name": name}, "subjects": subjects, "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}})

    def revoke(self, name: str) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        rbac = client.RbacAuthorizationV1Api(self.api_client)
        for fn in (rbac.delete_cluster_role_binding, rbac.delete_cluster_role):
            try:
                fn(name)
            except ApiException as e:
                if e.status != 404:
                    raise

    def namespace(self, prefix: str, labels: dict[str, str] | None = None) -> str:
        """A fresh namespace (the caller deletes it, ``drop_namespace``)."""
        name = unique(prefix)
        self.core.create_namespace({"metadata": {"name": name, "labels": labels or {}}})
        self.wait(f"namespace {name}'s default ServiceAccount", lambda: any(
            s.metadata.name == "default" for s in self.core.list_namespaced_service_account(name).items), 30)
        return name

    def drop_namespace(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.delete_namespace(name)
        except ApiException as e:
            if e.status != 404:
                raise

    def delete_jobset(self, name: str, namespace: str = NAMESPACE) -> None:
        """Remove a test's JobSet, and its pods at once: a pod deleted while it waits in Init
        would otherwise hold its node (and the slice) for its whole grace period, which KWOK
        waits out, and the next test's JobSet would find the pool taken."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", name,
                                                        body={"propagationPolicy": "Background"})
        except ApiException as e:
            if e.status != 404:
                raise
        self.core.delete_collection_namespaced_pod(
            namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}", grace_period_seconds=0)

    def audit(self, verb: str, uri: str) -> list[dict[str, Any]]:
        """The audit log's ResponseComplete entries for ``verb`` whose requestURI contains
        ``uri`` (the API server writes entries asynchronously: wait for one first)."""
        return [e for e in self.audit_lines() if e.get("stage") == "ResponseComplete" and e["verb"] == verb
                and uri in e["requestURI"]]

    def _etcd(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        ctx = ssl.create_default_context(cafile=str(self.root / "pki/ca.crt"))
        ctx.load_cert_chain(str(self.root / "pki/server.crt"), str(self.root / "pki/server.key"))
        conn = http.client.HTTPSConnection("127.0.0.1", self.state["ports"]["etcd"], context=ctx,
                                           timeout=10)
        try:
            conn.request("POST", path, body=json.dumps(body))
            resp = conn.getresponse()
            data = json.loads(resp.read() or b"{}")
            assert resp.status == 200, (resp.status, data)
            return data
        finally:
            conn.close()

    def etcd_revision(self) -> int:
        return int(self._etcd("/v3/maintenance/status", {})["header"]["revision"])

    def compact_etcd(self) -> int:
        """Compact etcd at its current revision (its gRPC gateway): every watch that resumes
        from an older resourceVersion is then answered 410 Gone by the API server."""
        rev = int(self._etcd("/v3/maintenance/status", {})["header"]["revision"])
        self._etcd("/v3/kv/compaction", {"revision": str(rev), "physical": True})
        return rev

    def audit_lines(self) -> list[dict[str, Any]]:
        path = self.root / "logs/audit.log"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def dead_kubeconfig(cluster: Cluster, path: Path) -> str:
    """The cluster's kubeconfig pointed at a port nobody listens on (picked free, then closed)."""
    import socket

    import yaml

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    cfg["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def start(root: Path, owner: int) -> Cluster:
    """Start a control plane in ``root`` exactly as ``tests/cluster/up.sh`` does."""
    proc = subprocess.run(["bash", str(UP), str(root), "--owner", str(owner)],
                          capture_output=True, text=True)
    if proc.returncode:
        tail = ""
        for log in sorted((root / "logs").glob("*.log")):
            if log.name != "audit.log":
                tail += f"\n--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"tests/cluster/up.sh failed ({proc.returncode}): {proc.stderr.strip()}{tail}")
    return Cluster(root)


def stop(root: Path) -> None:
    subprocess.run(["bash", str(DOWN), str(root)], check=True)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"
