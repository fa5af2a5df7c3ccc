"""What following a multislice run costs the API server, storage and the laptop, at
64, 256, 1,024 and 4,096 hosts (1, 4, 16 and 64 x v6e-256).

    python bench/bench_cluster_scale.py                    # 64, 256, 1,024 and 4,096 pods
    python bench/bench_cluster_scale.py --pods 256         # one size

The table so far is printed (and ``--json`` written) after each size, so a size the machine
cannot hold still leaves the ones before it.

A real control plane per size (tests/cluster/up.sh, with ``--tpu-pool v6e-256:N``: a KWOK
node per TPU VM, labelled as GKE labels a v6e-256 slice's node pool), and one
fake-gcs-server for all sizes. A size whose pods are not all Running at once within
``--start-limit`` seconds is where this machine breaks: the bench records how many ran, the
phases, each control-plane process's peak RSS and CPU, and goes on to the next size.
For each size, xrun renders its JobSet for ``--tpu v6e-256 --num-slices N`` and
``xrun submit --follow`` follows it; KWOK's stages take the pods Pending -> Running ->
Succeeded (timing by pod annotations), one pod is failed with exit 42 (KWOK's chaos stage)
once all are Running, so JobSet restarts the whole set, and the second attempt runs to
the end. Meanwhile a writer plays every host's log shipper and process 0's metrics
writer (xrun's storage layout: ``logs/<slice>-<host>/attempt-NNN/<seq>-<writer>.log``,
``metrics/attempt-NNN-<seq>-<writer>.jsonl``): a small chunk per Running host every
LIVE_CHUNK_SECONDS during the run, then the bulk of each host's log (BULK_MB per host over
its two attempts) and a run's worth of metrics chunks, before the storage commands run.
1,000 other runs (seeded once) are stored beside it for ``xrun list``. xrun runs from this
checkout, its modules byte-compiled first as an installed xrun's are (``--from-source``:
not, and compiled again by every command where PYTHONDONTWRITEBYTECODE is set).

Measured, all from this one run per size:
- the API requests xrun made (user agent ``xrun/``) per verb and resource, counted in the
  API server's audit log: total, steady rate (from all pods Running to the end) and peak
  (the busiest second);
- the lag from each state change, as a watch of our own sees it arrive from the API
  server, to xrun printing it (all pods Running, the JobSet restarting, Running again,
  Completed);
- the peak RSS of ``xrun submit --follow`` (VmHWM), and each control-plane process's peak
  RSS and mean CPU over the follow;
- the wall time of ``xrun status`` while every pod of the first attempt is Running (the best
  of three, with that run's CPU: the control plane and the simulated hosts share the cores),
  and again after the follow ended with the pods still there (the JobSet's TTL not yet run);
- wall time and storage requests (counted by tests/http_counter.py in front of the
  emulator) of ``xrun status``, ``xrun logs --tail 100``, ``xrun logs --host S-63`` and
  ``xrun list`` (1,001 runs). Wall times are measured straight against the emulator,
  counts through the counting proxy (a second run of the same command).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import yaml  # noqa: E402
from cluster_helpers import FAIL_CONTAINER, FAIL_DELAY, FAIL_EXIT, FAIL_JITTER, FAIL_LABEL, timing  # noqa: E402

from xrun_contract import METRICS_ROLLUP_EVERY, Layout, records, stamp_line, summary  # noqa: E402
from xrun_contract.storage import open_storage  # noqa: E402

HOSTS_PER_SLICE = 64  # v6e-256: 16x16 chips, 4 per VM
LIVE_CHUNK_SECONDS = 10.0  # a Running host's shipper writes a small chunk this often
LIVE_LINES = 20
BULK_MB = 2.5  # each host's log, both attempts together
BULK_CHUNK_KB = 256
# The emulator keeps objects in memory: past 1,024 hosts each host's bulk shrinks so the
# whole stays at 1,024 hosts' 2.5 GiB (the same number of chunks per host, smaller ones).
BULK_MAX_HOSTS = 1024
METRICS_CHUNKS = 300  # process 0's metrics over the run (a chunk per 2 s: 10 minutes)
STEPS_PER_CHUNK = 4
LIST_RUNS = 1000
SAMPLE_SECONDS = 5.0
BUCKET = "xrun-scale"
ROOT = f"gs://{BUCKET}/xrun"
LINE = ("I1204 12:00:00.000000 140000000000000 train.py:412] host {host} step {step} "
        "data loader: shard 17/64 read 8.0 MiB in 0.012 s; prefetch queue 6/8; rss 41.2 GiB")


# --- small helpers -------------------------------------------------------------------------
def compile_xrun() -> None:
    """Byte-compile xrun's packages in the checkout, as ``pip install`` does for an installed
    xrun. Each xrun command here runs from the checkout (PYTHONPATH), and where the
    environment sets PYTHONDONTWRITEBYTECODE=1 (this machine's does) Python never writes the
    bytecode it compiles: every command compiled some 40 modules from source again, 0.1 s of
    each `status` that no installed xrun spends."""
    import compileall

    for package in ("orchestrator", "xrun_contract", "manifests"):
        if not compileall.compile_dir(str(REPO / package), quiet=1):
            raise SystemExit(f"compileall {package} failed")


def now_rfc(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def xrun_env(kubeconfig: str, gcs_url: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "KUBECONFIG": kubeconfig,
            "STORAGE_EMULATOR_HOST": gcs_url, "XRUN_STORAGE": ROOT, "COLUMNS": "200",
            "XRUN_QUEUE": "none"}


def xrun_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli", *args]


def gcs(url: str):
    os.environ["STORAGE_EMULATOR_HOST"] = url
    from xrun_contract.storage import gcs_client

    return gcs_client()


# --- the cluster -----------------------------------------------------------------------------
class ClusterProc:
    def __init__(self, root: Path, slices: int):
        self.root = root
        up = subprocess.run(["bash", str(REPO / "tests/cluster/up.sh"), str(root), "--owner", str(os.getpid()),
                             "--tpu-pool", f"v6e-256:{slices}"], capture_output=True, text=True)
        if up.returncode:
            raise SystemExit(f"up.sh failed: {up.stderr[-2000:]}")
        self.kubeconfig = str(root / "kubeconfig")
        from cluster_helpers import Cluster

        self.c = Cluster(root)
        self.c.api_client.user_agent = "xrun-bench"

    def down(self) -> None:
        subprocess.run(["bash", str(REPO / "tests/cluster/down.sh"), str(self.root)], check=False)


class Watcher(threading.Thread):
    """Our own watch of the run's pods and JobSet: when each state change reached us."""

    def __init__(self, c: Any, name: str, pods: int):
        super().__init__(daemon=True)
        self.c, self.name, self.n = c, name, pods
        self.pods: dict[str, tuple[int, str, str, str]] = {}  # uid -> (attempt, phase, host, pod)
        self.bound: set[str] = set()  # uids of pods the scheduler gave a node
        self.lock = threading.Lock()
        self.t: dict[str, float] = {}
        self.stop = threading.Event()
        self.js_gone = False

    def running(self, attempt: int) -> list[tuple[str, str]]:
        with self.lock:
            return [(h, p) for a, ph, h, p in self.pods.values() if a == attempt and ph == "Running"]

    def run(self) -> None:
        threading.Thread(target=self._jobset, daemon=True).start()
        self._loop("pods")

    def _jobset(self) -> None:
        self._loop("jobsets")

    def _loop(self, kind: str) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        core, custom = self.c.core, self.c.custom
        while not self.stop.is_set():
            try:
                if kind == "pods":
                    resp = core.list_namespaced_pod(
                        "default", label_selector=f"jobset.sigs.k8s.io/jobset-name={self.name}", watch=True,
                        timeout_seconds=600, _preload_content=False, _request_timeout=(10, 700))
                else:
                    resp = custom.list_namespaced_custom_object(
                        "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", watch=True,
                        field_selector=f"metadata.name={self.name}", timeout_seconds=600,
                        _preload_content=False, _request_timeout=(10, 700))
                for line in iter_resp_lines(resp):
                    if self.stop.is_set():
                        return
                    ev = json.loads(line)
                    if ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self._event(kind, ev["type"], ev["object"], time.time())
            except Exception:  # noqa: BLE001 - reconnect (sees ADDED again: harmless here)
                time.sleep(0.5)

    def _event(self, kind: str, etype: str, obj: dict[str, Any], at: float) -> None:
        from orchestrator.backends.kube.state import pod_host

        if kind == "jobsets":
            if etype == "DELETED":
                self.js_gone = True
                return
            st = obj.get("status") or {}
            restarts = int(st.get("restarts") or 0)
            if restarts >= 1:
                self.t.setdefault("restarting", at)
            if any(c["type"] == "Completed" and c["status"] == "True" for c in st.get("conditions") or []):
                self.t.setdefault("completed", at)
            return
        meta = obj["metadata"]
        host, attempt = pod_host(obj)
        with self.lock:
            if etype == "DELETED":
                self.pods.pop(meta["uid"], None)
                self.bound.discard(meta["uid"])
            else:
                self.pods[meta["uid"]] = (attempt, (obj.get("status") or {}).get("phase", ""), host, meta["name"])
                if (obj.get("spec") or {}).get("nodeName"):
                    self.bound.add(meta["uid"])
            for a in (0, 1):
                started = sum(1 for x in self.pods.values() if x[0] == a and x[1] in ("Running", "Succeeded"))
                if started >= self.n:
                    self.t.setdefault(f"running-{a}", at)
                if a == 0 and any(x[0] == 0 and x[1] == "Running" for x in self.pods.values()):
                    self.t.setdefault("first-running-0", at)


class Sampler(threading.Thread):
    """Every SAMPLE_SECONDS while a size runs: each control-plane process's RSS and CPU time
    (/proc, by the PIDs tests/cluster records in state.json), the load average, and how
    many of the run's first-attempt pods are in each phase: where a size breaks."""

    def __init__(self, root: Path, watcher: Watcher):
        super().__init__(daemon=True)
        self.w = watcher
        self.pids: dict[str, int] = json.loads((root / "state.json").read_text()).get("pids", {})
        self.stop = threading.Event()
        self.peak_rss_mb: dict[str, float] = collections.defaultdict(float)
        self.cpu0 = {k: self._cpu(pid) for k, pid in self.pids.items()}
        self.t0 = time.time()
        self.max_running = (0, 0.0)  # first-attempt pods Running at once, and when
        self.phases: dict[str, int] = {}
        self.load: list[float] = []

    @staticmethod
    def _cpu(pid: int) -> float:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return 0.0

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_SECONDS):
            self.sample()

    def sample(self) -> None:
        for k, pid in self.pids.items():
            self.peak_rss_mb[k] = max(self.peak_rss_mb[k], status_kb(pid, "VmRSS") / 1024)
        self.load.append(os.getloadavg()[0])
        with self.w.lock:
            phases = collections.Counter(
                ph if ph != "Pending" else "Pending, bound to a node" if uid in self.w.bound else
                "Pending, not scheduled" for uid, (a, ph, _h, _p) in self.w.pods.items() if a == 0)
        # pods the watch has not seen: not created yet by the Job controller, or the watch behind
        phases["not created"] = max(0, self.w.n - sum(phases.values()))
        self.phases = dict(phases)
        if phases["Running"] > self.max_running[0]:
            self.max_running = (phases["Running"], time.time() - self.t0)

    def figures(self) -> dict[str, Any]:
        """Each process's peak RSS and mean CPU use since the sampler started (cores), and
        the highest load average seen."""
        window = max(1e-9, time.time() - self.t0)
        return {"peak_rss_mb": dict(self.peak_rss_mb),
                "cores": {k: (self._cpu(pid) - self.cpu0[k]) / window for k, pid in self.pids.items()},
                "load_avg_max": max(self.load, default=0.0)}


def gone(c: Any, name: str) -> bool:
    """The JobSet and every pod of it deleted (asked directly, after the follow)."""
    from kubernetes.client.exceptions import ApiException

    try:
        c.jobset(name)
        return False
    except ApiException as e:
        if e.status != 404:
            return False
    return not c.pods(name)


# --- storage: what the pods' shippers and process 0 write -------------------------------------
class Writer(threading.Thread):
    """Every Running host's log shipper (a chunk every LIVE_CHUNK_SECONDS) and process 0's
    metrics chunk writer (every 2 s), straight to the emulator."""

    def __init__(self, client: Any, name: str, watcher: Watcher):
        super().__init__(daemon=True)
        self.bucket = client.bucket(BUCKET)
        self.name, self.w = name, watcher
        self.seq: dict[tuple[str, int], int] = collections.Counter()
        self.tag = "5ca1ab1e"
        self.stop = threading.Event()
        self.step = 0
        self.metrics_seq: collections.Counter = collections.Counter()
        self.metrics_all: dict[int, list[str]] = collections.defaultdict(list)
        # the summary part process 0's metrics writer keeps beside its chunks (what `list` reads)
        self.storage = open_storage(ROOT)
        self.summaries: dict[int, summary.MetricsSummary] = {}
        self.written = 0
        self.pool = ThreadPoolExecutor(8)

    def put(self, key: str, data: bytes) -> None:
        self.bucket.blob(f"xrun/{key}").upload_from_string(data)

    def log_chunk(self, host: str, attempt: int, lines: int) -> None:
        seq = self.seq[(host, attempt)]
        self.seq[(host, attempt)] += 1
        t = time.time()
        text = "".join(stamp_line(t - (lines - i) * 0.01, LINE.format(host=host, step=self.step) + "\n")
                       for i in range(lines))
        self.put(Layout.log_chunk(self.name, host, attempt, seq, self.tag), text.encode())

    def metrics_chunk(self, attempt: int, steps: int, at: float | None = None) -> None:
        """A chunk as process 0's ChunkWriter writes it, the summary part its metrics writer
        keeps after each chunk (workload.metrics), and the rollup every METRICS_ROLLUP_EVERY
        chunks (xrun_contract.storage.ChunkWriter)."""
        t = at or time.time()
        out = []
        if self.step == 0:
            out.append(records.to_json(records.Header(versions={"jax": "0.8.0"}, total_steps=100000,
                                                      time=t, attempt=attempt)))
        for _ in range(steps):
            self.step += 1
            out.append(records.to_json(records.Step(step=self.step, seconds=0.5, loss=3.0 / (1 + self.step / 1000),
                                                    tokens_per_s_per_device=8000.0, tflops_per_device=400.0,
                                                    time=t, attempt=attempt)))
        seq = self.metrics_seq[attempt]
        data = "\n".join(out) + "\n"
        key = Layout.metrics_chunk(self.name, attempt, seq, self.tag)
        self.put(key, data.encode())
        if attempt not in self.summaries:
            self.summaries[attempt] = summary.MetricsSummary(self.storage, self.name, attempt, self.tag)
        self.summaries[attempt].after_write(key, data)
        self.metrics_all[attempt].append(data)
        self.metrics_seq[attempt] += 1
        if self.metrics_seq[attempt] % METRICS_ROLLUP_EVERY == 0:
            self.put(Layout.metrics_rollup(self.name, attempt, seq, self.tag),
                     "".join(self.metrics_all[attempt]).encode())

    def run(self) -> None:
        last_logs = 0.0
        while not self.stop.wait(2.0):
            attempt = 1 if self.w.t.get("restarting") else 0
            running = self.w.running(attempt)
            if not running:
                continue
            with contextlib.suppress(Exception):
                self.metrics_chunk(attempt, STEPS_PER_CHUNK)
            if time.monotonic() - last_logs >= LIVE_CHUNK_SECONDS:
                last_logs = time.monotonic()
                with contextlib.suppress(Exception):  # a shipper retries its chunk later
                    list(self.pool.map(lambda hp, a=attempt: self.log_chunk(hp[0], a, LIVE_LINES), running))
                    self.written += len(running)

    def bulk(self, hosts: list[str]) -> int:
        """Each host's log to BULK_MB over both attempts (less past BULK_MAX_HOSTS hosts),
        and a run's worth of metrics."""
        per_attempt = max(1, int(BULK_MB * 1024 / BULK_CHUNK_KB / 2))
        chunk_kb = BULK_CHUNK_KB * min(1.0, BULK_MAX_HOSTS / len(hosts))
        lines = int(chunk_kb * 1024) // (len(LINE) + 40)
        base = time.time() - 3600
        template = "".join(stamp_line(base + i * 0.05, LINE.format(host="HOST", step=i) + "\n")
                           for i in range(lines)).encode()
        jobs = [(h, a) for h in hosts for a in (0, 1)]

        def one(job: tuple[str, int]) -> int:
            h, a = job
            data = template.replace(b"HOST", h.encode())
            for _ in range(per_attempt):
                seq = self.seq[(h, a)]
                self.seq[(h, a)] += 1
                self.put(Layout.log_chunk(self.name, h, a, seq, self.tag), data)
            return per_attempt * len(data)

        with ThreadPoolExecutor(16) as pool:
            total = sum(pool.map(one, jobs))
        for _ in range(METRICS_CHUNKS):
            self.metrics_chunk(1, STEPS_PER_CHUNK)
        return total


def seed_runs(client: Any, count: int) -> None:
    """``count`` finished runs under the root, as xrun leaves them: run.json, state.json,
    process 0's first and last metrics chunks, and the summary each of their writers keeps
    (``xrun_contract.summary``: what ``xrun list`` reads)."""
    bucket = client.bucket(BUCKET)
    storage = open_storage(ROOT)

    def one(i: int) -> None:
        name = f"old-{i:04d}"
        t = time.time() - 86400 + i
        spec = {"name": name, "accelerator": "v6e-32", "num_slices": 1, "image": "example.com/train:1",
                "command": "python3 train.py", "storage": ROOT, "pod_labels": {"team": "ml"}}
        run = {"name": name, "spec": spec, "submitted_at": t, "backend": "kube", "context": "xrun-test",
               "namespace": "default", "xrun_version": "0.1.0", "storage": ROOT, "submit_id": "0",
               # what process 0 merges in at start (workload.metrics.update_run_json)
               "workload": {"config": {"preset": "1b", "steps": 200}, "versions": {"jax": "0.8.0"},
                            "accelerator": "v6e-32", "start_time": t + 30}}
        state = {"backend": "kube", "state": "Succeeded", "restarts": 0, "updated": t + 600,
                 "transitions": [{"time": t + 60, "state": "Running"}, {"time": t + 600, "state": "Succeeded"}]}
        bucket.blob(f"xrun/{Layout.run_json(name)}").upload_from_string(json.dumps(run, indent=2))
        bucket.blob(f"xrun/{Layout.state(name)}").upload_from_string(json.dumps(state, indent=2))
        # and the summary each writer keeps beside what it wrote (xrun_contract.summary)
        summary.write_run(storage, name, {"name": name, "backend": "kube", "accelerator": "v6e-32",
                                          "submitted_at": t, "labels": {"xrun.dev/run": name, "team": "ml"}})
        summary.write_state(storage, name, state)
        hook = summary.MetricsSummary(storage, name, 0, "ab")
        for seq in (0, 1):
            recs = [records.to_json(records.Step(step=seq * 100 + k, seconds=0.5, loss=2.0, time=t, attempt=0))
                    for k in range(1, 5)]
            text = "\n".join(recs) + "\n"
            bucket.blob(f"xrun/{Layout.metrics_chunk(name, 0, seq, 'ab')}").upload_from_string(text)
            hook.after_write(Layout.metrics_chunk(name, 0, seq, "ab"), text)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(count)))


# --- measuring ---------------------------------------------------------------------------------
def audit_requests(root: Path, since: float, until: float) -> list[dict[str, Any]]:
    """xrun's requests (user agent xrun/) in the audit log(s), one per auditID."""
    seen: dict[str, dict[str, Any]] = {}
    for path in sorted((root / "logs").glob("audit*.log")):
        with path.open() as f:
            for line in f:
                if '"userAgent":"xrun/' not in line:
                    continue
                ev = json.loads(line)
                t = parse_rfc(ev["requestReceivedTimestamp"])
                if since <= t <= until:
                    seen.setdefault(ev["auditID"], {**ev, "_t": t})
    return list(seen.values())


def api_table(reqs: list[dict[str, Any]], steady_from: float, until: float) -> dict[str, Any]:
    by: collections.Counter = collections.Counter()
    secs: collections.Counter = collections.Counter()
    steady = 0
    for r in reqs:
        o = r.get("objectRef") or {}
        sub = f"/{o['subresource']}" if o.get("subresource") else ""
        res = o.get("resource", r.get("requestURI", "?").split("?")[0]) + sub
        by[f"{r['verb']} {res}"] += 1
        secs[int(r["_t"])] += 1
        if r["_t"] >= steady_from:
            steady += 1
    window = max(1e-9, until - steady_from)
    return {"by": dict(sorted(by.items())), "total": len(reqs), "steady_per_s": steady / window,
            "steady_window_s": window, "peak_per_s": max(secs.values()) if secs else 0}


class Follow:
    """``xrun submit --follow`` as a process: its lines, when each came, its peak RSS."""

    def __init__(self, cmd: list[str], env: dict[str, str]):
        self.started = time.time()
        self.p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.err: list[tuple[float, str]] = []
        self.out_lines = 0
        self.hwm_kb = 0
        threading.Thread(target=self._read_err, daemon=True).start()
        threading.Thread(target=self._read_out, daemon=True).start()
        threading.Thread(target=self._rss, daemon=True).start()

    def _read_err(self) -> None:
        assert self.p.stderr
        for line in self.p.stderr:
            self.err.append((time.time(), line.rstrip("\n")))

    def _read_out(self) -> None:
        assert self.p.stdout
        for _ in self.p.stdout:
            self.out_lines += 1

    def _rss(self) -> None:
        while self.p.poll() is None:
            self.hwm_kb = max(self.hwm_kb, tree_hwm_kb(self.p.pid))
            time.sleep(0.25)

    def first(self, pattern: str, after: float = 0.0) -> float | None:
        rx = re.compile(pattern)
        return next((t for t, line in self.err if t >= after and rx.search(line)), None)


def status_kb(pid: int, key: str) -> int:
    """One kB figure of /proc/PID/status (VmRSS, VmHWM); 0 for a process gone."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    return 0


def tree_hwm_kb(pid: int) -> int:
    """VmHWM of a process and its children (kB)."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        total += status_kb(p, "VmHWM")
        with contextlib.suppress(OSError):
            for t in Path(f"/proc/{p}/task").iterdir():
                with contextlib.suppress(OSError):
                    todo += [int(c) for c in (t / "children").read_text().split()]
    return total


def timed(cmd: list[str], env: dict[str, str], repeat: int = 2) -> tuple[float, subprocess.CompletedProcess]:
    best, last = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        last = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        best = min(best, time.perf_counter() - t0)
        if last.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(cmd[3:])}: exit {last.returncode}: {last.stderr[-2000:]}")
    assert last is not None
    return best, last


def timed_cpu(cmd: list[str], env: dict[str, str], repeat: int = 3) -> tuple[float, float]:
    """The best wall time of ``repeat`` runs, and the CPU (user + system) that run took:
    here the control plane, the storage emulator and the simulated hosts share the 2 cores
    with the command, which on a laptop they would not; its CPU says what it costs."""
    import resource

    best = (float("inf"), 0.0)
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(cmd[3:])}: exit {done.returncode}: {done.stderr[-2000:]}")
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        best = min(best, (wall, cpu))
    return best


def counted(proxy: Any, cmd: list[str], env: dict[str, str]) -> dict[str, int]:
    proxy.reset()
    r = subprocess.run(cmd, env={**env, "STORAGE_EMULATOR_HOST": proxy.url}, capture_output=True, text=True,
                       timeout=600)
    if r.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd[3:])} (counted): exit {r.returncode}: {r.stderr[-2000:]}")
    return storage_kinds(proxy.requests)


def storage_kinds(reqs: list[tuple[str, str]]) -> dict[str, int]:
    out: collections.Counter = collections.Counter()
    for method, path in reqs:
        if method == "GET" and re.search(r"/b/[^/]+/o(\?|$)", path):
            out["list"] += 1
        elif method == "GET":
            out["get"] += 1
        else:
            out[method.lower()] += 1
    out["total"] = len(reqs)
    return dict(out)


# --- one size ------------------------------------------------------------------------------------
def bench_size(cl: ClusterProc, pods: int, url: str, work: Path, commands: bool = True,
               start_limit: float = 600.0) -> dict[str, Any]:
    """One size's figures; with "broke" instead where its pods were not all Running at once
    within ``start_limit`` seconds of the submit (what then held the machine)."""
    from http_counter import CountingProxy

    slices = pods // HOSTS_PER_SLICE
    name = f"scale-{pods}"
    # each pod runs this long once Running: longer than KWOK takes to start them all (76 s
    # for 1,024 on the 2-core machine), so the first attempt is all Running at once; past
    # 1,024 longer than the start limit, so a slow start is seen as one, not as pods ending
    run_s = {64: 40.0, 256: 70.0, 1024: 160.0}.get(pods, max(120.0 * pods / 1024, start_limit + 120.0))
    res: dict[str, Any] = {"pods": pods}
    client = gcs(url)
    proxy = CountingProxy(url)
    env = xrun_env(cl.kubeconfig, url)
    run_file = work / f"{name}.yaml"
    run_file.write_text(yaml.safe_dump({
        "name": name, "accelerator": "v6e-256", "num_slices": slices, "image": "example.com/train:1",
        "xrun_image": "example.com/xrun-workload:1", "command": "python3 train.py",
        "context": "xrun-test", "storage": ROOT, "termination_grace_seconds": 2,
        "ttl_seconds_after_finished": 30, "max_restarts": 3,
        "pod_annotations": timing(run_s=run_s, start_s=2.0)}))
    watcher = Watcher(cl.c, name, pods)
    watcher.start()
    sampler = Sampler(cl.root, watcher)
    sampler.start()
    writer = Writer(client, name, watcher)
    writer.start()
    follow = Follow(xrun_cmd("submit", "-f", str(run_file), "--follow"),
                    {**env, "STORAGE_EMULATOR_HOST": proxy.url})
    proxy.reset()
    failed = False
    deadline = time.time() + max(1800.0, 2 * start_limit + run_s + 300)  # two starts and a run
    while follow.p.poll() is None and time.time() < deadline:
        time.sleep(0.2)
        if "running-0" in watcher.t and "status_running_s" not in res:
            # status of the running run, every pod of it Running (before the failure)
            res["status_running_s"], res["status_running_cpu_s"] = timed_cpu(xrun_cmd("status", name), env)
            print(f"[{pods}] status while Running: {res['status_running_s']:.2f}s "
                  f"({res['status_running_cpu_s']:.2f} s of CPU)", flush=True)
        if not failed and "running-0" in watcher.t and time.time() - watcher.t["running-0"] > 8:
            host, pod = sorted(watcher.running(0))[1]
            cl.c.core.patch_namespaced_pod(pod, "default", {"metadata": {
                "labels": {FAIL_LABEL: "true"},
                "annotations": {FAIL_EXIT: "42", FAIL_DELAY: "1ms", FAIL_JITTER: "1ms",
                                FAIL_CONTAINER: "workload"}}})
            res["failed_pod"] = f"{host} ({pod})"
            failed = True
            print(f"[{pods}] failed host {host} with exit 42", flush=True)
        if "running-0" in watcher.t and not res.get("_said_running"):
            res["_said_running"] = True
            print(f"[{pods}] all pods Running after {watcher.t['running-0'] - follow.started:.0f}s", flush=True)
        if "running-0" not in watcher.t and time.time() - follow.started > start_limit:
            follow.p.kill()
            writer.stop.set()
            writer.join()
            watcher.stop.set()
            sampler.stop.set()
            sampler.sample()  # as things stand at the limit
            proxy.close()
            res["broke"] = {
                "start_limit_s": start_limit, "max_running": sampler.max_running[0],
                "max_running_at_s": sampler.max_running[1], "phases_at_limit": sampler.phases,
                **sampler.figures()}
            print(f"[{pods}] not all Running within {start_limit:.0f}s: {broke_line(res)}", flush=True)
            return res
    end = time.time()
    sampler.stop.set()
    res["control_plane"] = sampler.figures()
    if follow.p.poll() is None:
        follow.p.kill()
        raise SystemExit(f"[{pods}] follow did not end in {deadline - follow.started:.0f} s; "
                         f"stderr: {follow.err[-20:]}")
    writer.stop.set()
    writer.join()
    time.sleep(0.5)
    res["follow_rc"] = follow.p.returncode
    res["follow_s"] = end - follow.started
    res["follow_rss_mb"] = follow.hwm_kb / 1024
    res["follow_storage"] = storage_kinds(proxy.requests)
    res["follow_lines"] = follow.out_lines
    res["live_chunks"] = writer.written
    steady_from = watcher.t.get("running-0", follow.started + 10)
    res["api"] = api_table(audit_requests(cl.root, follow.started, end), steady_from, end)
    q = re.escape(name)
    lags = {}
    for label, key, pattern, after in (
            ("all pods Running", "running-0", rf"xrun: {q} Running", 0.0),
            ("JobSet restarting", "restarting", rf"xrun: {q} Restarting", 0.0),
            ("Running again", "running-1", rf"xrun: {q} Running", watcher.t.get("restarting", 0.0)),
            ("Completed", "completed", rf"run {q}: Succeeded", 0.0)):
        seen, printed = watcher.t.get(key), follow.first(pattern, after)
        lags[label] = (printed - seen) if seen and printed else None
    res["lags"] = lags
    res["follow_stderr_tail"] = [line for _t, line in follow.err[-6:]]
    print(f"[{pods}] follow ended rc={follow.p.returncode} in {res['follow_s']:.0f}s", flush=True)

    # status with the pods still there (the JobSet's TTL has not run yet)
    res["status_live_s"], _ = timed(xrun_cmd("status", name), env, repeat=1)
    if not commands:
        watcher.stop.set()
        proxy.close()
        res.pop("_said_running", None)
        return res
    # the TTL deletes the JobSet and its pods; then every command reads storage
    t_gone = time.time() + 300
    while time.time() < t_gone and not gone(cl.c, name):
        time.sleep(2)
    hosts = [f"{s}-{h}" for s in range(slices) for h in range(HOSTS_PER_SLICE)]
    t0 = time.time()
    res["bulk_bytes"] = writer.bulk(hosts)
    print(f"[{pods}] wrote {res['bulk_bytes'] / 2**20:.0f} MiB of logs in {time.time() - t0:.0f}s", flush=True)
    watcher.stop.set()
    cmds = {
        "status": xrun_cmd("status", name),
        "logs --tail 100": xrun_cmd("logs", name, "--tail", "100"),
        f"logs --host {slices - 1}-63": xrun_cmd("logs", name, "--host", f"{slices - 1}-63"),
        f"list ({LIST_RUNS}+ runs)": xrun_cmd("list"),
    }
    res["commands"] = {}
    for label, cmd in cmds.items():
        secs, out = timed(cmd, env)
        res["commands"][label] = {"s": secs, "storage": counted(proxy, cmd, env),
                                  "stdout_lines": len(out.stdout.splitlines())}
        if label.startswith("list ("):
            res["listed_runs"] = len(out.stdout.splitlines()) - 1  # less its header
        print(f"[{pods}] {label}: {secs:.2f}s {res['commands'][label]['storage']}", flush=True)
    proxy.close()
    res.pop("_said_running", None)
    return res


def broke_line(r: dict[str, Any]) -> str:
    b = r["broke"]
    rss = ", ".join(f"{k} {v:.0f}" for k, v in sorted(b["peak_rss_mb"].items(), key=lambda kv: -kv[1]))
    cores = ", ".join(f"{k} {v:.2f}" for k, v in sorted(b["cores"].items(), key=lambda kv: -kv[1]) if v >= 0.01)
    return (f"at most {b['max_running']} of {r['pods']} Running at once ({b['max_running_at_s']:.0f} s in); "
            f"first attempt's pods at the limit {b['phases_at_limit']}; peak RSS (MB): {rss}; "
            f"CPU (cores, mean): {cores}; load average up to {b['load_avg_max']:.1f}")


def report(results: list[dict[str, Any]]) -> str:
    broke = [r for r in results if "broke" in r]
    results = [r for r in results if "broke" not in r]
    out = [f"{r['pods']} pods: not all Running within {r['broke']['start_limit_s']:.0f} s of the submit: "
           f"{broke_line(r)}" for r in broke]
    if not results:
        return "\n".join(out)
    out += [""] if out else []
    cols = [r["pods"] for r in results]

    def row(label: str, values: list[str]) -> None:
        out.append(f"| {label} | " + " | ".join(values) + " |")

    out.append("| pods (v6e-256 slices) | " + " | ".join(f"{p} ({p // 64})" for p in cols) + " |")
    out.append("|---|" + "---:|" * len(cols))
    row("follow: API requests, total", [str(r["api"]["total"]) for r in results])
    row("follow: steady API rate (/s)", [f"{r['api']['steady_per_s']:.2f}" for r in results])
    row("follow: peak API rate (/s, busiest second)", [str(r["api"]["peak_per_s"]) for r in results])
    keys = sorted({k for r in results for k in r["api"]["by"]})
    for k in keys:
        row(f"&nbsp;&nbsp;{k}", [str(r["api"]["by"].get(k, 0)) for r in results])
    for lag in ("all pods Running", "JobSet restarting", "Running again", "Completed"):
        row(f"lag to print: {lag} (s)", [f"{r['lags'][lag]:.2f}" if r["lags"].get(lag) is not None else "-"
                                         for r in results])
    row("follow: peak RSS (MB)", [f"{r['follow_rss_mb']:.0f}" for r in results])
    row("follow: storage requests (list/get)", [
        f"{r['follow_storage'].get('list', 0)}/{r['follow_storage'].get('get', 0)}" for r in results])
    row("follow: wall time (s)", [f"{r['follow_s']:.0f}" for r in results])
    row("status, all pods Running (s)", [f"{r['status_running_s']:.2f}" if "status_running_s" in r else "-"
                                          for r in results])
    row("status, all pods Running: its CPU (s)", [
        f"{r['status_running_cpu_s']:.2f}" if "status_running_cpu_s" in r else "-" for r in results])
    row("status, ended, pods present (s)", [f"{r['status_live_s']:.2f}" for r in results])
    labels = list(results[0].get("commands") or {}) if all("commands" in r for r in results) else []
    for i, label in enumerate(labels):
        name = label if not label.startswith("logs --host") else "logs --host <last slice>-63"
        row(f"{name} (s)", [f"{list(r['commands'].values())[i]['s']:.2f}" for r in results])
        row(f"{name}: storage requests (list/get)", [
            f"{list(r['commands'].values())[i]['storage'].get('list', 0)}/"
            f"{list(r['commands'].values())[i]['storage'].get('get', 0)}" for r in results])
        if name.startswith("list ("):
            row("list: storage requests per 1,000 runs", [
                f"{list(r['commands'].values())[i]['storage'].get('total', 0) * 1000 / r['listed_runs']:.1f}"
                f" ({r['listed_runs']} runs)" for r in results])
    if labels:
        row("stored logs (MiB, all hosts)", [f"{r['bulk_bytes'] / 2**20:.0f}" for r in results])
    parts = sorted({k for r in results for k in r.get("control_plane", {}).get("peak_rss_mb", {})})
    for k in parts:
        row(f"control plane: {k} peak RSS (MB) / CPU (cores)", [
            f"{r['control_plane']['peak_rss_mb'].get(k, 0):.0f} / {r['control_plane']['cores'].get(k, 0):.2f}"
            if "control_plane" in r else "-" for r in results])
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, nargs="+", default=[64, 256, 1024, 4096],
                    help="run sizes (multiples of 64: one v6e-256 slice each)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--follow-only", action="store_true",
                    help="only the follow (API requests, lags, RSS) and status; no stored logs or commands")
    ap.add_argument("--from-source", action="store_true",
                    help="do not byte-compile xrun's modules first (with PYTHONDONTWRITEBYTECODE=1 every "
                         "command compiles them again: how the figures were measured before this flag)")
    ap.add_argument("--start-limit", type=float, default=600.0, metavar="S",
                    help="a size whose pods are not all Running this long after the submit is where "
                         "the machine breaks: recorded (pods Running, each component's memory and CPU), "
                         "and the next size runs (default 600)")
    a = ap.parse_args()
    if not a.from_source:
        compile_xrun()
    if any(p % HOSTS_PER_SLICE for p in a.pods):
        print("--pods: multiples of 64", file=sys.stderr)
        return 2
    from fake_gcs import binary, fake_gcs_server

    exe = binary()
    work = Path(tempfile.mkdtemp(prefix="xrun-scale-"))
    results: list[dict[str, Any]] = []
    # one emulator for every size, the other runs seeded once: each size's run is listed
    # beside them and the runs of the sizes before it
    with fake_gcs_server(exe) as url:
        client = gcs(url)
        client.create_bucket(BUCKET)
        if not a.follow_only:  # only `list` reads them
            t0 = time.time()
            seed_runs(client, LIST_RUNS)
            print(f"seeded {LIST_RUNS} runs in {time.time() - t0:.0f}s", flush=True)
        for p in a.pods:
            # a control plane per size, with a node per host: a smaller run is not measured
            # beside a larger one's idle nodes (4,096 nodes' heartbeats alone take 0.65 cores)
            t0 = time.time()
            cl = ClusterProc(work / f"cluster-{p}", p // HOSTS_PER_SLICE)
            up_s = time.time() - t0
            print(f"control plane with {p} TPU nodes up in {up_s:.0f}s ({work})", flush=True)
            try:
                results.append(bench_size(cl, p, url, work, commands=not a.follow_only,
                                          start_limit=a.start_limit))
            finally:
                cl.down()
            results[-1]["control_plane_up_s"] = up_s
            print()
            print(report(results))  # so far: a size that cannot finish leaves the ones before it
            print()
            r = results[-1]
            if "broke" not in r:
                print(f"{r['pods']} pods: follow exit {r['follow_rc']}, lines printed {r['follow_lines']}, "
                      f"failed {r.get('failed_pod')}; last stderr: {r['follow_stderr_tail'][-3:]}", flush=True)
            if a.json:
                a.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
