"""A real Kubernetes control plane on 127.0.0.1 for xrun's tests: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, the JobSet controller, Kueue and KWOK, built from
their upstream Go modules by ``build.sh``.

    python controlplane.py up DIR [--owner PID] [--tpu-pool v6e-256:16 ...]   # DIR/kubeconfig
    python controlplane.py down DIR               # stops every process ``up`` started

``up`` starts a supervisor (a process of its own session) that starts each component with
``PR_SET_PDEATHSIG``, so that nothing outlives it even when it is SIGKILLed; it stops them
all on SIGTERM, and by itself when ``--owner`` (a test session's PID) is gone. PIDs are
recorded in ``DIR/state.json``. Ports are picked free, so clusters can run side by side.

Everything upstream ships is read from the built modules' own files (CRDs, webhook
configurations and their kustomize patches, KWOK's stages): nothing here copies them. What
this file adds is what a GKE cluster would have: node pools shaped like GKE's (labels,
capacity, taints), xpk's Kueue queues and priority classes, and the wiring envtest does for
webhooks outside a cluster (``url`` + our own CA's ``caBundle``).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "jobset",
              "kueue", "kwok")
NAMESPACE = "default"
READY_TIMEOUT = 180.0


# --- versions and files of the built modules ------------------------------------------------
def versions() -> dict[str, str]:
    out = {}
    for line in (HERE / "versions.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def module_dir(module: str, version: str) -> Path:
    """The module's files in the Go module cache (downloaded by the build)."""
    out = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"],
                         cwd=HERE / "tools" / "kube", capture_output=True, text=True, check=True,
                         env={**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"})
    return Path(json.loads(out.stdout)["Dir"])


# libyaml's safe loader where PyYAML has it: the JobSet and Kueue manifests are ~3 MB of YAML,
# 5 s of the supervisor's CPU with the pure-Python scanner at every start (0.5 s with this).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: Path) -> Any:
    return yaml.load(path.read_text(), Loader=_LOADER)  # noqa: S506 - a safe loader


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(path.read_text(), Loader=_LOADER) if d]  # noqa: S506 - a safe loader


# --- small helpers --------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pdeathsig() -> None:
    """Run in the child before exec: die with the supervisor, even if it is SIGKILLed."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
            return False
    return True


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(pki: Path) -> None:
    """A CA, a serving certificate for 127.0.0.1 (every server here), an admin client
    certificate (system:masters) and the service-account signing key. EC P-256: fast to make."""
    pki.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"),
            "-days", "3650", "-subj", "/CN=xrun-test-ca",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-addext", "subjectKeyIdentifier=hash")
    leaves = {
        "server": ("/CN=127.0.0.1", "serverAuth,clientAuth", "IP:127.0.0.1,DNS:localhost"),
        "admin": ("/O=system:masters/CN=xrun-admin", "clientAuth", ""),
    }
    for name, (subj, eku, san) in leaves.items():
        openssl("req", *ec, "-keyout", str(pki / f"{name}.key"), "-out", str(pki / f"{name}.csr"),
                "-subj", subj)
        ext = pki / f"{name}.ext"
        ext.write_text(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage={eku}\nsubjectKeyIdentifier=hash\n"
            "authorityKeyIdentifier=keyid,issuer\n" + (f"subjectAltName={san}\n" if san else ""))
        openssl("x509", "-req", "-in", str(pki / f"{name}.csr"), "-CA", str(pki / "ca.crt"),
                "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "3650",
                "-extfile", str(ext), "-out", str(pki / f"{name}.crt"))
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(pki / "sa.key"))
    openssl("ec", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    # controller-runtime webhook servers read <certDir>/tls.crt and tls.key
    certs = pki / "serving"
    certs.mkdir(exist_ok=True)
    shutil.copy(pki / "server.crt", certs / "tls.crt")
    shutil.copy(pki / "server.key", certs / "tls.key")


def write_kubeconfig(path: Path, port: int, pki: Path) -> None:
    b64 = lambda p: base64.b64encode(p.read_bytes()).decode()  # noqa: E731
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "xrun-test",
        "clusters": [{"name": "xrun-test", "cluster": {
            "server": f"https://127.0.0.1:{port}",
            "certificate-authority-data": b64(pki / "ca.crt")}}],
        "users": [{"name": "xrun-admin", "user": {
            "client-certificate-data": b64(pki / "admin.crt"),
            "client-key-data": b64(pki / "admin.key")}}],
        "contexts": [{"name": "xrun-test", "context": {
            "cluster": "xrun-test", "user": "xrun-admin", "namespace": NAMESPACE}}],
    }
    path.write_text(yaml.safe_dump(cfg))


class Api:
    """Just enough of a REST client to bootstrap the cluster (stdlib only)."""

    def __init__(self, port: int, pki: Path):
        self.port = port
        self.ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    def request(self, method: str, path: str, body: Any = None,
                timeout: float = 10.0) -> tuple[int, Any]:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx,
                                           timeout=timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(raw) if raw else None
        except ValueError:
            return resp.status, raw.decode(errors="replace")

    def create(self, obj: dict[str, Any], *, dry_run: bool = False) -> tuple[int, Any]:
        path = collection_path(obj)
        return self.request("POST", path + ("?dryRun=All" if dry_run else ""), obj)

    def apply_all(self, objs: list[dict[str, Any]]) -> None:
        for obj in objs:
            code, body = self.create(obj)
            if code not in (200, 201, 409):
                raise RuntimeError(f"create {obj['kind']}/{obj['metadata']['name']}: {code} {body}")

    def established(self, crds: list[dict[str, Any]]) -> bool:
        """Every CRD is served (condition Established): controllers that start before
        that fail to set up their informers."""
        for crd in crds:
            code, body = self.request(
                "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}")
            conds = (body or {}).get("status", {}).get("conditions") or [] if code == 200 else []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                return False
        return True

    def apply_crds(self, sup: Supervisor, objs: list[dict[str, Any]]) -> None:
        crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
        self.apply_all(crds)
        sup.wait_for("CRDs established", lambda: self.established(crds), 60)


# Kinds this file creates, and where the API serves them (plural, namespaced).
RESOURCES = {
    "CustomResourceDefinition": ("customresourcedefinitions", False),
    "MutatingWebhookConfiguration": ("mutatingwebhookconfigurations", False),
    "ValidatingWebhookConfiguration": ("validatingwebhookconfigurations", False),
    "Namespace": ("namespaces", False),
    "Node": ("nodes", False),
    "PriorityClass": ("priorityclasses", False),
    "ResourceFlavor": ("resourceflavors", False),
    "ClusterQueue": ("clusterqueues", False),
    "LocalQueue": ("localqueues", True),
    "JobSet": ("jobsets", True),
    "Service": ("services", True),
    "APIService": ("apiservices", False),
}


def collection_path(obj: dict[str, Any]) -> str:
    plural, namespaced = RESOURCES[obj["kind"]]
    api = obj["apiVersion"]
    base = f"/api/{api}" if "/" not in api else f"/apis/{api}"
    if namespaced:
        base += f"/namespaces/{obj['metadata'].get('namespace', NAMESPACE)}"
    return f"{base}/{plural}"


# --- what upstream ships, wired for out-of-cluster webhooks ---------------------------------
def url_client(client: dict[str, Any], port: int, ca_b64: str) -> dict[str, Any]:
    """A ``service`` clientConfig as a ``url`` to the local webhook server, with our CA
    (controller-runtime pkg/envtest/webhook.go does the same)."""
    path = (client.get("service") or {}).get("path", "/")
    return {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_b64}


def jobset_objects(mod: Path, port: int, ca_b64: str) -> list[dict[str, Any]]:
    crds = [d for f in sorted((mod / "config/components/crd/bases").glob("*.yaml"))
            for d in load_yaml_docs(f)]
    hooks = load_yaml_docs(mod / "config/components/webhook/manifests.yaml")
    # The kustomize patches (pod webhooks only for JobSet pods), applied as kustomize does:
    # each is a JSON6902 list of ops on the configuration of its target.
    kust = load_yaml(mod / "config/components/webhook/kustomization.yaml")
    for patch in kust.get("patches") or []:
        target = next(h for h in hooks if h["kind"] == patch["target"]["kind"])
        for op in load_yaml(mod / "config/components/webhook" / patch["path"]):
            assert op["op"] == "replace", op
            index = int(op["path"].rsplit("/", 1)[1])
            target["webhooks"][index] = op["value"]
    for h in hooks:
        h["metadata"]["name"] = "jobset-" + h["metadata"]["name"]  # config/default namePrefix
        for w in h["webhooks"]:
            w["clientConfig"] = url_client(w["clientConfig"], port, ca_b64)
    return crds + hooks


KUEUE_GROUPS = {"kueue.x-k8s.io", "batch", "jobset.x-k8s.io"}  # the integrations enabled here


def kueue_objects(mod: Path, port: int, ca_b64: str) -> list[dict[str, Any]]:
    crd_dir = mod / "config/components/crd"
    kust = load_yaml(crd_dir / "kustomization.yaml")
    crds = {d["metadata"]["name"]: d for f in kust["resources"] for d in load_yaml_docs(crd_dir / f)}
    for p in kust.get("patches") or []:  # conversion webhooks (patches/webhook_in_*.yaml)
        patch = load_yaml(crd_dir / p["path"])
        conv = patch["spec"]["conversion"]
        conv["webhook"]["clientConfig"] = url_client(conv["webhook"]["clientConfig"], port, ca_b64)
        crds[patch["metadata"]["name"]]["spec"]["conversion"] = conv
    hooks = load_yaml_docs(mod / "config/components/webhook/manifests.yaml")
    for h in hooks:
        h["metadata"]["name"] = "kueue-" + h["metadata"]["name"]  # config/default namePrefix
        h["webhooks"] = [w for w in h["webhooks"]
                         if all(set(r["apiGroups"]) <= KUEUE_GROUPS for r in w["rules"])]
        for w in h["webhooks"]:
            w["clientConfig"] = url_client(w["clientConfig"], port, ca_b64)
    return list(crds.values()) + hooks


KUEUE_NAMESPACE = "kueue-system"  # config/default's namespace


def kueue_visibility_objects(mod: Path, port: int) -> list[dict[str, Any]]:
    """Kueue's visibility API (pending workloads and their positions) as its release installs
    it (config/components/visibility: the APIServices, insecureSkipTLSVerify as shipped), served
    by the kueue process on 127.0.0.1: the Service is an ExternalName ``localhost``, which the
    API server's aggregator resolves to ``localhost:<APIService port>`` (k8s.io/apiserver
    pkg/util/proxy ResolveCluster), so no kube-proxy or routable ClusterIP is needed."""
    vis = mod / "config/components/visibility"
    services = [d for f in sorted(vis.glob("apiservice_*.yaml")) for d in load_yaml_docs(f)]
    for svc in services:
        svc["spec"]["service"]["port"] = port
    service = load_yaml_docs(vis / "service.yaml")[0]
    service["metadata"]["namespace"] = KUEUE_NAMESPACE
    service["spec"] = {"type": "ExternalName", "externalName": "localhost"}
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}},
            service, *services]


def _visibility_served(api: Api) -> Any:
    """True once the API server proxies Kueue's visibility API (v1beta1, the version xrun reads)."""
    code, body = api.request("GET", "/apis/visibility.kueue.x-k8s.io/v1beta1")
    return True if code == 200 else (code, body)


def kwok_stages(mod: Path) -> list[dict[str, Any]]:
    """KWOK's own stages: nodes initialize and keep a lease; pods go through the general
    (timed) lifecycle, and a pod labelled for it fails with the exit code its annotations
    name (``chaos/pod-container-running-failed``). Timing comes from each pod's annotations
    (``pod-ready.stage.kwok.x-k8s.io/delay``, ``pod-complete.stage.kwok.x-k8s.io/delay``...)."""
    stage = mod / "kustomize/stage"
    files = [stage / "node/fast/node-initialize.yaml",
             stage / "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
             *sorted((stage / "pod/general").glob("pod-*.yaml")),
             stage / "pod/chaos/pod-container-running-failed.yaml"]
    return [d for f in files for d in load_yaml_docs(f)]


# --- what a GKE cluster made by xpk has -----------------------------------------------------
def tpu_node(name: str, pool: str, accelerator: str, topology: str, machine: str, chips: int,
             extra_labels: dict[str, str]) -> dict[str, Any]:
    labels = {
        "type": "kwok",
        "kubernetes.io/hostname": name,
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": machine,
        "cloud.google.com/gke-tpu-accelerator": accelerator,
        "cloud.google.com/gke-tpu-topology": topology,
        "cloud.google.com/gke-nodepool": pool,
        **extra_labels,
    }
    taints = [{"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}]
    if extra_labels.get("cloud.google.com/gke-spot") == "true":  # GKE taints Spot nodes so
        taints.append({"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"})
    return node(name, labels, {"google.com/tpu": str(chips)}, taints)


def gpu_node(name: str, machine: str, accelerator: str, pool: str) -> dict[str, Any]:
    labels = {"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
              "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": machine,
              "cloud.google.com/gke-accelerator": accelerator,
              "cloud.google.com/gke-nodepool": pool}
    return node(name, labels, {"nvidia.com/gpu": "8"},
                [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])


def node(name: str, labels: dict[str, str], extra: dict[str, str],
         taints: list[dict[str, str]]) -> dict[str, Any]:
    capacity = {"cpu": "180", "memory": "720Gi", "pods": "110", "ephemeral-storage": "100Gi",
                **extra}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {"taints": taints},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


# (pool, accelerator, topology, machine type, chips per VM, VMs per slice, slices, labels)
TPU_POOLS = [
    ("v6e-2x4", "tpu-v6e-slice", "2x4", "ct6e-standard-4t", 4, 2, 2, {}),
    ("v6e-4x8", "tpu-v6e-slice", "4x8", "ct6e-standard-4t", 4, 8, 1, {}),
    ("v5p-2x2x2", "tpu-v5p-slice", "2x2x2", "ct5p-hightpu-4t", 4, 2, 1, {}),
    ("v6e-2x4-spot", "tpu-v6e-slice", "2x4", "ct6e-standard-4t", 4, 2, 1,
     {"cloud.google.com/gke-spot": "true"}),
    ("v6e-2x4-resv", "tpu-v6e-slice", "2x4", "ct6e-standard-4t", 4, 2, 1,
     {"cloud.google.com/reservation-name": "xrun-resv"}),
    # A queued-provisioning flex-start pool (one v6e 2x2 VM, the single-host shape GKE's
    # flex-start docs show for TPUs): GKE labels flex-start nodes gke-flex-start=true and
    # taints queued-provisioning ones gke-queued (POOL_TAINTS); no other pool is 2x2.
    ("v6e-2x2-flex", "tpu-v6e-slice", "2x2", "ct6e-standard-4t", 4, 1, 1,
     {"cloud.google.com/gke-flex-start": "true"}),
]
# Taints a pool's nodes carry besides google.com/tpu (and Spot's, from its label).
POOL_TAINTS = {"v6e-2x2-flex": [{"key": "cloud.google.com/gke-queued", "value": "true", "effect": "NoSchedule"}]}
GPU_POOLS = [("a3mega", "a3-megagpu-8g", "nvidia-h100-mega-80gb", 2),
             ("a3ultra", "a3-ultragpu-8g", "nvidia-h200-141gb", 2)]


# Extra TPU pools ``up --tpu-pool TOPOLOGY-NAME:SLICES`` adds (the scale benchmark's
# 16 x v6e-256): accelerator label, topology, machine type, chips per VM, VMs per slice.
EXTRA_POOL_SHAPES = {
    "v6e-256": ("tpu-v6e-slice", "16x16", "ct6e-standard-4t", 4, 64),
    "v6e-64": ("tpu-v6e-slice", "8x8", "ct6e-standard-4t", 4, 16),
    "v5p-128": ("tpu-v5p-slice", "4x4x4", "ct5p-hightpu-4t", 4, 16),
}


def extra_pools(specs: list[str]) -> list[tuple]:
    """``["v6e-256:16"]`` -> TPU_POOLS rows: one node pool per slice, as GKE makes a
    multi-host TPU slice one node pool."""
    out = []
    for spec in specs:
        shape, _, count = spec.partition(":")
        if shape not in EXTRA_POOL_SHAPES or not count.isdigit() or int(count) < 1:
            raise SystemExit(f"--tpu-pool: {spec!r} is not SHAPE:SLICES with SHAPE one of "
                             f"{', '.join(EXTRA_POOL_SHAPES)}")
        acc, topo, machine, chips, vms = EXTRA_POOL_SHAPES[shape]
        out.append((shape, acc, topo, machine, chips, vms, int(count), {}))
    return out


def gke_nodes(extra: list[tuple] | None = None) -> list[dict[str, Any]]:
    nodes = [node("system-0", {"type": "kwok", "kubernetes.io/hostname": "system-0",
                               "kubernetes.io/os": "linux", "cloud.google.com/gke-nodepool": "system",
                               "node.kubernetes.io/instance-type": "e2-standard-16"}, {}, [])]
    for pool, acc, topo, machine, chips, vms, slices, labels in TPU_POOLS + (extra or []):
        for s in range(slices):
            for v in range(vms):
                nodes.append(tpu_node(f"{pool}-{s}-{v}", f"{pool}-{s}", acc, topo, machine,
                                      chips, labels))
                nodes[-1]["spec"]["taints"] += POOL_TAINTS.get(pool, [])
    for pool, machine, acc, count in GPU_POOLS:
        nodes += [gpu_node(f"{pool}-{i}", machine, acc, pool) for i in range(count)]
    return nodes


def priority_classes() -> list[dict[str, Any]]:
    """xpk's ladder (xpk src/xpk/core/kueue_manager.py, the priority classes it creates)."""
    ladder = {"very-low": 100, "low": 250, "medium": 500, "high": 750, "very-high": 1000}
    return [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
             "metadata": {"name": name}, "value": value, "globalDefault": False,
             "description": f"xpk's {name} priority"} for name, value in ladder.items()]


def kueue_queues() -> list[dict[str, Any]]:
    """Two ClusterQueues: ``xpk-cluster-queue`` exactly as xpk makes it (the accelerator's
    quota only), and ``cpu-memory-queue`` that also has CPU and memory quota; a LocalQueue for
    each in ``default`` (xpk names its LocalQueue ``multislice-queue``)."""
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
              "metadata": {"name": "v6e-2x4"},
              "spec": {"nodeLabels": {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                                      "cloud.google.com/gke-tpu-topology": "2x4"}}}

    def cq(name: str, resources: dict[str, str]) -> dict[str, Any]:
        return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                "metadata": {"name": name},
                "spec": {"namespaceSelector": {},
                         "preemption": {"reclaimWithinCohort": "Never",
                                        "withinClusterQueue": "LowerPriority"},
                         "queueingStrategy": "BestEffortFIFO",
                         "resourceGroups": [{
                             "coveredResources": list(resources),
                             "flavors": [{"name": "v6e-2x4", "resources": [
                                 {"name": k, "nominalQuota": v} for k, v in resources.items()]}]}]}}

    def lq(name: str, cluster_queue: str) -> dict[str, Any]:
        return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"clusterQueue": cluster_queue}}

    return [flavor,
            cq("xpk-cluster-queue", {"google.com/tpu": "16"}),
            cq("cpu-memory-queue", {"google.com/tpu": "16", "cpu": "64", "memory": "256Gi"}),
            lq("multislice-queue", "xpk-cluster-queue"),
            lq("cpu-memory-queue", "cpu-memory-queue")]


# --- the supervisor -------------------------------------------------------------------------
class Supervisor:
    def __init__(self, root: Path, bindir: Path, owner: int | None, pools: list[str] | None = None):
        self.root, self.bin, self.owner = root, bindir, owner
        self.extra_pools = extra_pools(pools or [])
        self.pki, self.logs = root / "pki", root / "logs"
        self.procs: dict[str, subprocess.Popen] = {}
        self.args: dict[str, list[str]] = {}
        self.envs: dict[str, dict[str, str] | None] = {}
        self.ports: dict[str, int] = {}
        self.stopping = False

    def save_state(self) -> None:
        state = {"supervisor": os.getpid(), "owner": self.owner, "bin": str(self.bin),
                 "ports": self.ports, "pids": {k: p.pid for k, p in self.procs.items()}}
        tmp = self.root / "state.json.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.root / "state.json")

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.args[name], self.envs[name] = args, env
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        binary = self.bin / ("kwok" if name == "kwok" else name)
        self.procs[name] = subprocess.Popen(
            [str(binary), *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=self.root, preexec_fn=_pdeathsig, env={**os.environ, **(env or {})})
        log.close()
        self.save_state()

    def wait_for(self, what: str, check, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode} while waiting for {what}"
                                       f" (see {self.logs / (name + '.log')})")
            try:
                last = check()
                if last is True:
                    return
            except (OSError, ssl.SSLError, http.client.HTTPException) as exc:
                last = exc
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r:.300})")
            time.sleep(0.2)

    def run(self) -> None:
        v = versions()
        self.logs.mkdir(parents=True, exist_ok=True)
        make_pki(self.pki)
        for k in ("etcd", "etcd-peer", "apiserver", "jobset-webhook", "kueue-webhook", "kwok",
                  "kueue-visibility"):
            self.ports[k] = free_port()
        pki, p = self.pki, self.ports
        ca_b64 = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
        tls = {"cert": str(pki / "server.crt"), "key": str(pki / "server.key"), "ca": str(pki / "ca.crt")}

        self.start("etcd", [
            "--name=xrun", f"--data-dir={self.root / 'etcd'}",
            f"--listen-client-urls=https://127.0.0.1:{p['etcd']}",
            f"--advertise-client-urls=https://127.0.0.1:{p['etcd']}",
            f"--listen-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
            f"--initial-cluster=xrun=http://127.0.0.1:{p['etcd-peer']}",
            f"--cert-file={tls['cert']}", f"--key-file={tls['key']}",
            f"--trusted-ca-file={tls['ca']}", "--client-cert-auth",
            "--unsafe-no-fsync", "--log-level=warn", "--quota-backend-bytes=4294967296"])
        etcd_ctx = ssl.create_default_context(cafile=tls["ca"])
        etcd_ctx.load_cert_chain(str(pki / "server.crt"), str(pki / "server.key"))

        def etcd_ok() -> bool:
            c = http.client.HTTPSConnection("127.0.0.1", p["etcd"], context=etcd_ctx, timeout=2)
            c.request("GET", "/health")
            return c.getresponse().status == 200

        self.wait_for("etcd", etcd_ok)

        audit_policy = self.root / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
            "omitStages": ["RequestReceived"], "rules": [
                # What clients send to change a JobSet (the body of a create, a delete's
                # options): tests assert on the request as it reached the server.
                {"level": "Request", "verbs": ["create", "update", "patch", "delete"],
                 "resources": [{"group": "jobset.x-k8s.io", "resources": ["jobsets"]}]},
                {"level": "Metadata"}]}))
        self.start("kube-apiserver", [
            f"--etcd-servers=https://127.0.0.1:{p['etcd']}", f"--etcd-cafile={tls['ca']}",
            f"--etcd-certfile={tls['cert']}", f"--etcd-keyfile={tls['key']}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={p['apiserver']}",
            f"--tls-cert-file={tls['cert']}", f"--tls-private-key-file={tls['key']}",
            f"--client-ca-file={tls['ca']}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--authorization-mode=Node,RBAC",
            # GKE's admission plugins that exist upstream, beside the default ones.
            "--enable-admission-plugins=NodeRestriction,PodNodeSelector,PodTolerationRestriction,"
            "ExtendedResourceToleration",
            "--service-cluster-ip-range=10.96.0.0/16", "--endpoint-reconciler-type=none",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--proxy-client-cert-file={tls['cert']}", f"--proxy-client-key-file={tls['key']}",
            # The aggregation layer (Kueue's visibility API): the identity the API server
            # forwards is trusted from a client certificate of our CA (kube-apiserver
            # --requestheader-*, read by the extension server from extension-apiserver-authentication).
            f"--requestheader-client-ca-file={tls['ca']}", "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group", "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--requestheader-allowed-names=127.0.0.1",  # the proxy client certificate's CN (server.crt)
            "--allow-privileged=true", "--profiling=false",
            f"--audit-policy-file={audit_policy}", f"--audit-log-path={self.logs / 'audit.log'}",
            "--audit-log-maxsize=200", "--audit-log-maxbackup=1"])
        api = Api(p["apiserver"], pki)
        self.wait_for("kube-apiserver /readyz",
                      lambda: api.request("GET", "/readyz", timeout=3)[0] == 200 or "not ready", 90)
        kubeconfig = self.root / "kubeconfig"
        write_kubeconfig(kubeconfig, p["apiserver"], pki)
        kenv = {"KUBECONFIG": str(kubeconfig)}

        self.start("kube-controller-manager", [
            f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--root-ca-file={tls['ca']}", f"--service-account-private-key-file={pki / 'sa.key'}",
            "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
            "--node-monitor-period=25s", "--node-monitor-grace-period=3m20s",
            "--kube-api-qps=500", "--kube-api-burst=1000"])
        self.start("kube-scheduler", [
            f"--kubeconfig={kubeconfig}", "--leader-elect=false", "--bind-address=127.0.0.1",
            "--secure-port=0", "--kube-api-qps=500", "--kube-api-burst=1000"])

        jobset_mod = module_dir("sigs.k8s.io/jobset", v["JOBSET_VERSION"])
        kueue_mod = module_dir("sigs.k8s.io/kueue", v["KUEUE_VERSION"])
        kwok_mod = module_dir("sigs.k8s.io/kwok", v["KWOK_VERSION"])
        certdir = str(pki / "serving")

        jobset_cfg = manager_config(self.root / "jobset-config.yaml", "config.jobset.x-k8s.io/v1alpha1",
                                    p["jobset-webhook"], certdir)
        jobset = jobset_objects(jobset_mod, p["jobset-webhook"], ca_b64)
        api.apply_crds(self, jobset)
        self.start("jobset", [f"--config={jobset_cfg}", "--zap-log-level=info"], kenv)
        self.wait_for("JobSet's webhook server", lambda: _tls_up(p["jobset-webhook"]))
        api.apply_all([o for o in jobset if o["kind"] != "CustomResourceDefinition"])

        # Kueue reads its metrics serving cert from a fixed path when its own cert management
        # is off (cmd/kueue/main.go: /etc/kueue/metrics/certs); the metrics server is off here,
        # but the watcher is created anyway, so the path must hold a pair.
        metrics_certs = Path("/etc/kueue/metrics/certs")
        if not (metrics_certs / "tls.crt").exists():
            metrics_certs.mkdir(parents=True, exist_ok=True)
            shutil.copy(pki / "server.crt", metrics_certs / "tls.crt")
            shutil.copy(pki / "server.key", metrics_certs / "tls.key")
        # Its visibility server reads its serving pair from a fixed folder too when cert
        # management is off (pkg/visibility/server.go certDir "/visibility"). The APIService
        # skips verifying it (as Kueue ships it), so any pair serves; the newest cluster's is written.
        visibility_certs = Path("/visibility")
        visibility_certs.mkdir(parents=True, exist_ok=True)
        for name in ("crt", "key"):
            tmp = visibility_certs / f".tls.{name}.{os.getpid()}"
            shutil.copy(pki / f"server.{name}", tmp)
            tmp.replace(visibility_certs / f"tls.{name}")
        kueue_cfg = manager_config(self.root / "kueue-config.yaml", "config.kueue.x-k8s.io/v1beta2",
                                   p["kueue-webhook"], certdir,
                                   integrations={"frameworks": ["batch/job", "jobset.x-k8s.io/jobset"]})
        kueue = kueue_objects(kueue_mod, p["kueue-webhook"], ca_b64)
        api.apply_crds(self, kueue)
        # --kubeconfig too (not only $KUBECONFIG): the visibility server delegates
        # authentication and authorization to the API server named by that flag's value.
        self.start("kueue", [f"--config={kueue_cfg}", f"--kubeconfig={kubeconfig}",
                             f"--visibility-server-port={p['kueue-visibility']}"], kenv)
        self.wait_for("Kueue's webhook server", lambda: _tls_up(p["kueue-webhook"]), 90)
        api.apply_all([o for o in kueue if o["kind"] != "CustomResourceDefinition"])
        api.apply_all(kueue_visibility_objects(kueue_mod, p["kueue-visibility"]))
        self.wait_for("Kueue's visibility API", lambda: _visibility_served(api), 90)

        kwok_cfg = self.root / "kwok.yaml"
        kwok_cfg.write_text(yaml.safe_dump_all(kwok_stages(kwok_mod)))
        api.apply_crds(self, [d for name in ("kwok.x-k8s.io_logs.yaml", "kwok.x-k8s.io_clusterlogs.yaml")
                              for d in load_yaml_docs(kwok_mod / "kustomize/crd/bases" / name)])
        self.start("kwok", [
            f"--kubeconfig={kubeconfig}", f"--config={kwok_cfg}",
            "--manage-nodes-with-label-selector=type=kwok",
            f"--tls-cert-file={tls['cert']}", f"--tls-private-key-file={tls['key']}",
            "--node-ip=127.0.0.1", "--node-name=localhost", f"--node-port={p['kwok']}",
            f"--server-address=127.0.0.1:{p['kwok']}", "--node-lease-duration-seconds=200",
            "--enable-crds=Logs,ClusterLogs"])

        nodes = gke_nodes(self.extra_pools)
        api.apply_all(priority_classes() + nodes)
        self.wait_for("KWOK nodes Ready", lambda: _nodes_ready(api), 60 + len(nodes) // 10)
        # The webhooks answer through the API server (a dry-run create goes through both
        # JobSet's and Kueue's), and the queues exist.
        self.wait_for("Kueue's webhooks", lambda: _admitted(api, kueue_queues()[0]), 90)
        api.apply_all(kueue_queues())
        self.wait_for("JobSet's webhooks", lambda: _admitted(api, _probe_jobset()), 90)
        self.wait_for("the default service account",
                      lambda: api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")[0] == 200,
                      60)

    def stop(self) -> None:
        """SIGTERM to every component, SIGKILL to one still there 10 s later; etcd only once
        the others have ended. A kube-apiserver stopping removes itself from the
        ``kubernetes`` Service's endpoints (pkg/controlplane/controller/kubernetesservice
        Controller.Stop) and waits up to twice pkg/controlplane's
        DefaultEndpointReconcilerInterval (2 x 10 s) for etcd to answer: with etcd stopped
        beside it, every stop hung until the SIGKILL (10 s)."""
        self.stopping = True
        order = list(self.procs)[::-1]  # the controllers first, etcd last
        for group in ([n for n in order if n != "etcd"], [n for n in order if n == "etcd"]):
            for name in group:
                with contextlib.suppress(ProcessLookupError):
                    self.procs[name].terminate()
            deadline = time.monotonic() + 10
            for name in group:
                try:
                    self.procs[name].wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.procs[name].kill()
                    self.procs[name].wait()

    def watch(self) -> None:
        """Until told to stop, or the owner is gone. A component that exits is started again
        with the same arguments, as a node's systemd or kubelet would: tests restart the API
        server by killing its PID (``state.json``) and wait for it to come back."""
        while not self.stopping:
            if self.owner and not alive(self.owner):
                print(f"owner {self.owner} is gone: stopping", flush=True)
                return
            for name, p in list(self.procs.items()):
                if p.poll() is not None and not self.stopping:
                    print(f"{name} exited with {p.returncode}: starting it again", flush=True)
                    self.start(name, self.args[name], self.envs[name])
            time.sleep(0.2)


def manager_config(path: Path, api_version: str, port: int, certdir: str, **extra: Any) -> Path:
    """A controller-runtime manager's Configuration (JobSet's, Kueue's) as envtest runs one:
    no leader election, no internal cert management (our CA signs the webhook server's
    certificate), the webhook server on 127.0.0.1, metrics and health probes off."""
    path.write_text(yaml.safe_dump({
        "apiVersion": api_version, "kind": "Configuration",
        "leaderElection": {"leaderElect": False}, "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": port, "certDir": certdir},
        "metrics": {"bindAddress": "0"}, "health": {"healthProbeBindAddress": "0"}, **extra}))
    return path


def _tls_up(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


def _nodes_ready(api: Api) -> bool:
    code, body = api.request("GET", "/api/v1/nodes?labelSelector=type%3Dkwok")
    if code != 200 or not body["items"]:
        return False
    return all(any(c["type"] == "Ready" and c["status"] == "True"
                   for c in (n.get("status") or {}).get("conditions") or [])
               for n in body["items"])


def _admitted(api: Api, obj: dict[str, Any]) -> Any:
    """True once a dry-run create passes every webhook, else what the server said."""
    code, body = api.create(obj, dry_run=True)
    return True if code in (200, 201) else (code, body)


def _probe_jobset() -> dict[str, Any]:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "xrun-probe", "namespace": NAMESPACE},
            "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {
                "template": {"spec": {"restartPolicy": "Never", "containers": [
                    {"name": "c", "image": "busybox"}]}}}}}]}}


def serve(root: Path, bindir: Path, owner: int | None, pools: list[str] | None = None) -> int:
    sup = Supervisor(root, bindir, owner, pools)

    def on_term(*_: Any) -> None:
        sup.stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        sup.run()
    except Exception as exc:  # noqa: BLE001 - reported to `up` through the failed file
        (root / "failed").write_text(f"{exc}\n")
        print(f"control plane failed: {exc}", flush=True)
        sup.stop()
        return 1
    (root / "ready").write_text("ok\n")
    print("control plane ready", flush=True)
    sup.watch()
    sup.stop()
    (root / "stopped").write_text("ok\n")
    return 0


def up(root: Path, owner: int | None, timeout: float = READY_TIMEOUT,
       pools: list[str] | None = None) -> int:
    root = root.resolve()
    if (root / "state.json").exists() and _supervisor_alive(root):
        print(f"a control plane is already running in {root}", file=sys.stderr)
        return 1
    root.mkdir(parents=True, exist_ok=True)
    for stale in ("ready", "failed", "stopped", "state.json"):
        (root / stale).unlink(missing_ok=True)
    for stale_dir in ("etcd", "pki", "podlogs"):  # a fresh cluster every time: new ports, new CA
        shutil.rmtree(root / stale_dir, ignore_errors=True)
    build = subprocess.run(["bash", str(HERE / "build.sh")], stdout=subprocess.PIPE, text=True)
    if build.returncode:
        return build.returncode
    bindir = Path(build.stdout.strip().splitlines()[-1])
    (root / "logs").mkdir(exist_ok=True)
    log = open(root / "logs" / "supervisor.log", "ab")  # noqa: SIM115
    cmd = [sys.executable, str(Path(__file__).resolve()), "serve", str(root), "--bin", str(bindir)]
    if owner:
        cmd += ["--owner", str(owner)]
    for pool in pools or []:
        cmd += ["--tpu-pool", pool]
    extra_pools(pools or [])  # bad input: exit 2 here, before anything starts
    timeout += 120 * len(pools or [])  # a thousand nodes to create and see Ready
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, cwd=root)
    log.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (root / "ready").exists():
            print(root / "kubeconfig")
            return 0
        if (root / "failed").exists() or proc.poll() is not None:
            break
        time.sleep(0.2)
    why = (root / "failed").read_text().strip() if (root / "failed").exists() else "timed out"
    print(f"xrun cluster: control plane did not start: {why}", file=sys.stderr)
    down(root)
    return 1


def _supervisor_alive(root: Path) -> bool:
    try:
        state = json.loads((root / "state.json").read_text())
    except (OSError, ValueError):
        return False
    return alive(int(state["supervisor"]))


def down(root: Path, timeout: float = 30.0) -> int:
    """Stop the supervisor (which stops its components), then make sure by PID that none of
    the components it recorded is left."""
    root = root.resolve()
    try:
        state = json.loads((root / "state.json").read_text())
    except (OSError, ValueError):
        return 0
    sup = int(state["supervisor"])
    with contextlib.suppress(ProcessLookupError):
        os.kill(sup, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(sup) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(sup):
        with contextlib.suppress(ProcessLookupError):
            os.kill(sup, signal.SIGKILL)
    for _name, pid in state.get("pids", {}).items():
        if alive(pid) and _is_ours(pid, state["bin"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while alive(pid) and _is_ours(pid, state["bin"]) and time.monotonic() < deadline:
            time.sleep(0.05)
    return 0


def _is_ours(pid: int, bindir: str) -> bool:
    """A recorded PID is still one of our binaries (not a reused PID)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return exe.startswith(bindir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="controlplane.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up")
    u.add_argument("dir", type=Path)
    u.add_argument("--owner", type=int, default=None,
                   help="stop the cluster when this process is gone (a test session)")
    u.add_argument("--tpu-pool", action="append", default=[], metavar="SHAPE:SLICES",
                   help=f"extra TPU node pools, e.g. v6e-256:16 (shapes: {', '.join(EXTRA_POOL_SHAPES)})")
    d = sub.add_parser("down")
    d.add_argument("dir", type=Path)
    s = sub.add_parser("serve")
    s.add_argument("dir", type=Path)
    s.add_argument("--bin", type=Path, required=True)
    s.add_argument("--owner", type=int, default=None)
    s.add_argument("--tpu-pool", action="append", default=[])
    a = ap.parse_args(argv)
    if a.cmd == "up":
        return up(a.dir, a.owner, pools=a.tpu_pool)
    if a.cmd == "down":
        return down(a.dir)
    return serve(a.dir.resolve(), a.bin, a.owner, a.tpu_pool)


if __name__ == "__main__":
    sys.exit(main())
