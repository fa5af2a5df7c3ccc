"""Start `python -m workload.train` hosts the way the manifest does: one process per host
with the contract env, the coordinator on 127.0.0.1, CPU devices per host. Plain helpers
(not fixtures) so any test module can use them."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from orchestrator.backends.local import free_port
from xrun_contract import Env, Layout
from xrun_contract.storage import open_storage

REPO = Path(__file__).resolve().parent.parent
# XLA's CPU backend at LLVM's lowest optimisation level: the tiny model's programs compile
# in about a third of the CPU time (workload/program.py measured its init 13.4 -> 4.7 s) and
# run as correctly, slower by milliseconds a step. Every host of every test gets the same
# flags, so runs compared with each other still run the same code. (The product's own
# compile settings are tested where they matter: test_workload_speed_paths.py.)
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"
# Every wait below is this many times longer (XRUN_TEST_TIMEOUT_SCALE, default 1): for a
# machine loaded far past the suite's own load (a shared one), where they bound hangs only.
TIMEOUT_SCALE = float(os.environ.get("XRUN_TEST_TIMEOUT_SCALE", "1") or 1)


@dataclass
class Host:
    process_id: int
    proc: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signum)


def host_env(run: str, storage: str | Path, *, process_id: int, hosts: int, devices: int,
             port: int, attempt: int = 0, slices: int = 1, **extra: str) -> dict[str, str]:
    """The contract env of one host (slice-major ids), on top of this process's env minus XRUN_*."""
    per_slice = hosts // slices
    env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    env["XLA_FLAGS"] = TEST_XLA_FLAGS
    env.update({
        "PYTHONPATH": str(REPO),
        Env.RUN_NAME: run,
        Env.STORAGE: str(storage),
        Env.NUM_SLICES: str(slices),
        Env.HOSTS_PER_SLICE: str(per_slice),
        Env.SLICE_INDEX: str(process_id // per_slice),
        Env.HOST_INDEX: str(process_id % per_slice),
        Env.COORDINATOR_ADDRESS: f"127.0.0.1:{port}",
        Env.RESTART_ATTEMPT: str(attempt),
        Env.PLATFORM: "cpu",
        Env.DEVICES_PER_HOST: str(devices),
        Env.ACCELERATOR: f"cpu-{hosts * devices}",
    })
    env.update(extra)
    return env


_CACHE: list[str] = []


# The suite's JAX compilation cache is a build cache, kept between sessions as Go's is
# (~/.cache/xrun-cluster): a program compiles once per machine, not once per session. A cold
# tiny program costs ~37 s of CPU (the README's run: 57 s of CPU cold, 20 s warm), and the
# suite compiles ~40 programs through this folder. What a run computes does not depend on it:
# JAX keys an entry by the program, its compiler and flags, xrun's executable cache by the
# workload's sources and versions (workload/executables.py program_key). Entries unused for
# CACHE_KEEP_DAYS go at a session's start. XRUN_TEST_JAX_CACHE names another folder ("" for
# a fresh one of the session's own, removed at its end: a cold measurement).
TEST_JAX_CACHE = "XRUN_TEST_JAX_CACHE"
SESSION_CACHE = "XRUN_LOCAL_COMPILATION_CACHE"  # the local backend's override (conftest sets it)
CACHE_KEEP_DAYS = 14


def compilation_cache() -> str:
    """The folder of the suite's JAX compilation cache (as the local backend keeps one per
    storage root): later runs of the same program skip compiling."""
    if not _CACHE:
        import tempfile

        session = os.environ.get(SESSION_CACHE, "")
        if os.path.isabs(session):  # an xdist worker: the folder its controller chose
            _CACHE.append(session)
            return session
        path = os.environ.get(TEST_JAX_CACHE)
        if path is None:
            path = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                "xrun-tests", "jax-cache")
        if path:
            os.makedirs(path, exist_ok=True)
            _prune(path, CACHE_KEEP_DAYS * 86400)
        else:
            path = tempfile.mkdtemp(prefix="xrun-test-jax-cache-")
            atexit.register(shutil.rmtree, path, True)
        _CACHE.append(path)
    return _CACHE[0]


def jax_cache_env() -> dict[str, str]:
    """The env that points a JAX program the tests start outside the workload's contract (a
    bench script, tests/tpu_checks.py) at the suite's compilation cache."""
    return {"JAX_COMPILATION_CACHE_DIR": compilation_cache(),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def _prune(path: str, age_s: float) -> None:
    """Removes the files under ``path`` neither written nor read for ``age_s`` seconds."""
    cutoff = time.time() - age_s
    for folder, _, files in os.walk(path):
        for name in files:
            full = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                st = os.stat(full)
                if max(st.st_mtime, st.st_atime) < cutoff:
                    os.unlink(full)


@contextlib.contextmanager
def compilation_cache_at(path: str) -> Iterator[None]:
    """Runs launched inside use the cache folder ``path`` instead of the session's."""
    saved = list(_CACHE)
    _CACHE[:] = [path]
    try:
        yield
    finally:
        _CACHE[:] = saved


# JAX's switch (jax.config, env JAX_DISABLE_MOST_OPTIMIZATIONS) for XLA's backend at its
# lowest optimisation level, without its expensive LLVM passes: the tiny train step compiles
# in ~55% of the CPU time (5.4 -> 3.0 s). For tests that check what a program computes, not
# how fast; both sides of a comparison compile alike.
CHEAP_COMPILES = "jax_disable_most_optimizations"


@contextlib.contextmanager
def cheap_compiles() -> Iterator[None]:
    """This process's compilations inside at XLA's lowest effort (CHEAP_COMPILES)."""
    import jax

    # A flag, not a config attribute: its value before is the env's (a test never sets it).
    old = os.environ.get(CHEAP_COMPILES.upper(), "").lower() in ("1", "true", "yes", "on")
    jax.config.update(CHEAP_COMPILES, True)
    try:
        yield
    finally:
        jax.config.update(CHEAP_COMPILES, old)


def launch(run: str, storage: str | Path, log_dir: Path, *, hosts: int = 2, devices: int = 2,
           args: tuple[str, ...] = ("--preset", "tiny"), attempt: int = 0, slices: int = 1,
           cache: bool = True, **extra: str) -> list[Host]:
    """Start every host of one attempt; stdout+stderr of host i go to log_dir/<run>-a<attempt>-<i>.log."""
    if cache:
        extra.setdefault(Env.COMPILATION_CACHE, compilation_cache())
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for pid in range(hosts):
        log = log_dir / f"{run}-a{attempt}-{pid}.log"
        env = host_env(run, storage, process_id=pid, hosts=hosts, devices=devices, port=port,
                       attempt=attempt, slices=slices, **extra)
        with open(log, "wb") as f:
            proc = subprocess.Popen([sys.executable, "-m", "workload.train", *args], cwd=REPO,
                                    env=env, stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        out.append(Host(pid, proc, log))
    return out


def wait_all(hosts: list[Host], timeout: float = 240) -> list[int]:
    """Exit codes of every host; kills them all (and fails) if one outlives the timeout."""
    timeout *= TIMEOUT_SCALE
    deadline = time.monotonic() + timeout
    codes = []
    try:
        for h in hosts:
            codes.append(h.wait(max(1.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        kill(hosts)
        raise AssertionError("hosts timed out:\n" + "\n".join(h.output()[-3000:] for h in hosts)) from None
    return codes


def kill(hosts: list[Host], signum: int = signal.SIGKILL) -> None:
    for h in hosts:
        h.signal(signum)
    for h in hosts:
        h.proc.wait(timeout=60)


def wait_for_line(host: Host, text: str, timeout: float = 180) -> None:
    """Block until ``text`` appears in the host's log (fails if the host exits first)."""
    timeout *= TIMEOUT_SCALE
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in host.output():
            return
        if host.proc.poll() is not None:
            raise AssertionError(f"host {host.process_id} exited {host.proc.returncode} before "
                                 f"{text!r}:\n{host.output()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} within {timeout}s:\n{host.output()[-3000:]}")


def run_hosts(run: str, storage: str | Path, log_dir: Path, timeout: float = 240,
              **kwargs) -> tuple[list[int], list[Host]]:
    hosts = launch(run, storage, log_dir, **kwargs)
    return wait_all(hosts, timeout), hosts


def metrics(storage: str | Path, run: str) -> list[dict]:
    """Every metrics record of a run, in chunk order (attempt, then sequence)."""
    st = open_storage(str(storage))
    objects, _ = st.list(Layout.metrics(run))
    out = []
    for o in objects:
        out += [json.loads(line) for line in (st.read_text(o.key) or "").splitlines() if line]
    return out


def losses(records: list[dict], attempt: int | None = None) -> dict[int, float]:
    """step -> loss from step records (of one attempt, or the latest value of each step)."""
    return {r["step"]: r["loss"] for r in records
            if r["kind"] == "step" and (attempt is None or r["attempt"] == attempt)}


def events(records: list[dict], event: str, attempt: int | None = None) -> list[int]:
    """Steps of the checkpoint records with this event."""
    return [r["step"] for r in records if r["kind"] == "checkpoint" and r["event"] == event
            and (attempt is None or r["attempt"] == attempt)]


def tensorboard_scalars(logdir: str) -> dict[str, dict[int, float]]:
    """tag -> {step: value} as TensorBoard itself reads a folder (local or gs:// through its
    fsspec filesystem), restarts purged (``purge_orphaned_data``, TensorBoard's default)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def assert_tensorboard_matches(logdir: str, records: list[dict]) -> None:
    """Every TensorBoard scalar equals its step record's value (float32), for every step."""
    import numpy as np

    from xrun_contract import TENSORBOARD_SCALARS

    scalars = tensorboard_scalars(logdir)
    latest = {r["step"]: r for r in records if r["kind"] == "step"}  # a redone step: the last
    assert set(scalars) == set(TENSORBOARD_SCALARS.values()), sorted(scalars)
    for key, tag in TENSORBOARD_SCALARS.items():
        assert sorted(scalars[tag]) == sorted(latest), (tag, sorted(scalars[tag]))
        for step, rec in latest.items():
            assert scalars[tag][step] == np.float32(rec[key]), (tag, step)
