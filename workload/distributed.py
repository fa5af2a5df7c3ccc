"""Who am I in the job, and how to start JAX's multi-process runtime for it.

``Cluster.from_env`` reads the contract env (jax-free, so it runs before any backend starts);
``configure_platform`` sets the CPU device count / platform before the first device use;
``initialize`` calls ``jax.distributed.initialize`` with xrun's values, or JAX's own cluster
detection when xrun's env is absent on a TPU VM, or nothing for a standalone single process.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass

from workload.private_seam import cache_writes_on_every_process
from xrun_contract import RESTARTABLE_EXIT_CODE, Env, global_process_id, restart_attempt


def _int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {value!r}") from None


@dataclass(frozen=True)
class Cluster:
    """This process's place in the job, as the manifest (or the local backend) describes it."""

    from_xrun: bool  # XRUN_COORDINATOR_ADDRESS was set
    coordinator: str | None
    num_slices: int
    hosts_per_slice: int
    slice_index: int
    host_index: int
    platform: str  # tpu | gpu | cpu | "" (let JAX choose)
    devices_per_host: int
    attempt: int
    restartable_exit_code: int

    @property
    def num_processes(self) -> int:
        return self.num_slices * self.hosts_per_slice

    @property
    def process_id(self) -> int:
        return global_process_id(self.slice_index, self.host_index, self.hosts_per_slice)

    @classmethod
    def from_env(cls) -> Cluster:
        coordinator = os.environ.get(Env.COORDINATOR_ADDRESS, "").strip() or None
        return cls(
            from_xrun=coordinator is not None,
            coordinator=coordinator,
            num_slices=_int(Env.NUM_SLICES, 1),
            hosts_per_slice=_int(Env.HOSTS_PER_SLICE, 1),
            slice_index=_int(Env.SLICE_INDEX, 0),
            host_index=_int(Env.HOST_INDEX, 0),
            platform=os.environ.get(Env.PLATFORM, "").strip().lower(),
            devices_per_host=_int(Env.DEVICES_PER_HOST, 0),
            attempt=restart_attempt(),
            restartable_exit_code=_int(Env.RESTARTABLE_EXIT_CODE, RESTARTABLE_EXIT_CODE),
        )


# What reuse_host_memory sets: glibc's environment name for each setting (malloc/arena.c
# tunables), its mallopt parameter (malloc/malloc.h) and the value.
HOST_MALLOC_SETTINGS = (("MALLOC_ARENA_MAX", -8, 1), ("MALLOC_MMAP_MAX_", -4, 0),
                        ("MALLOC_TRIM_THRESHOLD_", -1, 2**31 - 1),
                        ("MALLOC_TOP_PAD_", -2, 64 << 20))


def reuse_host_memory() -> bool:
    """Make glibc malloc keep freed memory for reuse instead of handing it back to the kernel.

    On CPU the devices' buffers are host memory: XLA:CPU mallocs each step's buffers (the
    logits, the gradients, its temporary arena) and frees them when the step ends. glibc
    serves big blocks with fresh mmaps, unmaps them on free and trims its heaps, so every
    step faulted all of that memory in again: 51k minor page faults and ~90 ms of kernel
    time in a ~220 ms bench-21m step. With one arena, no mmap and no trimming, a step's
    buffers come from pages the previous step already touched. The price: memory freed
    after a peak stays with the process (a training process returns to its peak every
    step anyway). Call before the backend starts its threads. False (nothing changed)
    where the C library is not glibc.
    """
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for _, param, value in HOST_MALLOC_SETTINGS)


def compilation_cache_dir() -> str:
    """JAX's persistent compilation cache folder from the contract env ("" when off)."""
    return os.environ.get(Env.COMPILATION_CACHE, "").strip()


def use_compilation_cache(path: str) -> None:
    """Keep every program this process compiles in JAX's persistent cache at ``path``, and
    read them back from there: JAX's defaults keep only programs that took over a second to
    compile, and a small program's many quick compiles add up at every start."""
    import jax

    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def configure_platform(cluster: Cluster) -> None:
    """Before the first device use: CPU device count, platform, collectives, compile cache,
    and (CPU) the host allocator."""
    import jax

    if cluster.platform == "cpu":
        reuse_host_memory()
        if cluster.devices_per_host > 0:
            flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "",
                           os.environ.get("XLA_FLAGS", ""))
            os.environ["XLA_FLAGS"] = (
                f"{flags} --xla_force_host_platform_device_count={cluster.devices_per_host}".strip()
            )
        os.environ["JAX_PLATFORMS"] = "cpu"
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    cache = compilation_cache_dir()
    if cache:
        use_compilation_cache(cache)
        if (cluster.platform == "cpu" and cluster.num_processes > 1
                and not cache_writes_on_every_process()):
            print("xrun: this JAX's compilation cache internals are not the ones known: only "
                  "process 0 writes the cache, the others compile at every start",
                  file=sys.stderr, flush=True)


# How long a process waits for the coordinator's port before it lets jax.distributed try
# (and back off) on its own; beyond it nothing is lost but the backoff this wait avoids.
COORDINATOR_WAIT_SECONDS = 120.0


def wait_for_coordinator(address: str, timeout: float = COORDINATOR_WAIT_SECONDS,
                         interval: float = 0.01, max_interval: float = 0.25) -> bool:
    """Return once ``host:port`` accepts a TCP connection (True), or after ``timeout`` (False).

    Why: ``jax.distributed.initialize`` connects to the coordinator over gRPC, and a gRPC
    channel whose first connection is refused waits out gRPC's connection backoff before it
    tries again (grpc/doc/connection-backoff.md: INITIAL_BACKOFF 1 s, then x1.6, jitter
    0.2). A host that comes up before process 0 has started the coordination service (pods
    start in any order; locally, by a hair) so lost ~1 s, more after longer waits: the
    bimodal 1.3 s / 2.3 s of a bare two-process ``initialize`` in bench/bench_submit.py.
    Probing the port first costs a few milliseconds; the gRPC connection then succeeds at
    its first attempt. A name that does not resolve yet (pod 0's DNS record) counts as not
    listening.

    Polling: every ``interval`` for an IP address or localhost (a refused connect costs
    nothing); for a name, from ``interval`` growing x1.5 to ``max_interval``, because each
    attempt is a DNS query too (cluster DNS, while a slice's pods wait minutes for pod 0's
    image) -- still well inside gRPC's own first backoff.
    """
    import ipaddress
    import socket

    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        return False  # not host:port; jax.distributed reports the address itself
    try:
        ipaddress.ip_address(host)
        local = True
    except ValueError:
        local = host == "localhost"
    delay = interval
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=min(1.0, timeout)):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            if not local:
                delay = min(delay * 1.5, max(interval, max_interval))


def initialize(cluster: Cluster) -> bool:
    """Start jax.distributed; True when it was started (and so preemption sync exists).

    One process needs no distributed service: nothing is started (on a TPU VM, JAX's own
    cluster detection would ask the metadata server, which a single-host VM outside GCE, or
    one with ``TPU_SKIP_MDS_QUERY``, does not answer). Several processes started by xrun
    use xrun's env alone (``cluster_detection_method="deactivate"``: no metadata server, no
    SLURM or MPI env can override it). Outside xrun, a multi-host TPU VM (more than one name
    in ``TPU_WORKER_HOSTNAMES``) still gets JAX's detection, as ``python -m workload.train``
    on each worker expects.
    """
    import jax

    if cluster.from_xrun:
        if cluster.num_processes == 1:
            return False
        if cluster.process_id != 0 and cluster.coordinator:
            wait_for_coordinator(cluster.coordinator)
        jax.distributed.initialize(
            coordinator_address=cluster.coordinator,
            num_processes=cluster.num_processes,
            process_id=cluster.process_id,
            cluster_detection_method="deactivate",
        )
        return True
    if len(tpu_worker_hostnames()) > 1:
        jax.distributed.initialize()  # JAX's own detection (TPU metadata server)
        return True
    return False


def tpu_worker_hostnames() -> list[str]:
    """The TPU VM's workers as the TPU runtime's env lists them (empty off a TPU VM)."""
    return [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]


def make_mesh(num_slices: int | None = None):
    """Mesh ('data', 'fsdp'): slices on 'data' (DCN), every device of a slice on 'fsdp' (ICI).

    ``num_slices`` None: count the devices' slice indices (TPU multislice), else 1.
    """
    import jax
    import numpy as np
    from jax.experimental import mesh_utils
    from jax.sharding import AxisType, Mesh

    devices = jax.devices()
    if num_slices is None:
        num_slices = len({getattr(d, "slice_index", 0) for d in devices})
    if len(devices) % num_slices:
        raise ValueError(f"{len(devices)} devices do not split into {num_slices} slices")
    per_slice = len(devices) // num_slices
    slices_seen = len({getattr(d, "slice_index", 0) for d in devices})
    if num_slices > 1 and slices_seen == num_slices:  # real multislice: DCN between slices
        grid = mesh_utils.create_hybrid_device_mesh((1, per_slice), (num_slices, 1), devices)
    elif num_slices == 1 and devices[0].platform == "tpu":
        grid = mesh_utils.create_device_mesh((1, per_slice), devices)
    else:  # CPU (a local multislice stand-in), GPU: processes in order, slice-major
        grid = np.array(sorted(devices, key=lambda d: (d.process_index, d.id))).reshape(
            num_slices, per_slice)
    return Mesh(grid, ("data", "fsdp"), axis_types=(AxisType.Auto, AxisType.Auto))


class PlatformMismatch(RuntimeError):
    """The manifest asked for an accelerator that JAX did not find (not restartable)."""


def check_platform(cluster: Cluster) -> None:
    """Refuse to train on CPU when the manifest asked for TPU or GPU.

    Without this, a node without its driver, a CPU-only jaxlib or a stray JAX_PLATFORMS=cpu
    gives a "successful" run on the host's CPU: hours of wasted accelerator reservation and
    numbers that look like a regression. JAX falls back to CPU silently when no other
    backend initialises (``jax._src.xla_bridge.backends``: a failed optional platform is
    only logged), so the check must be ours. Raises :class:`PlatformMismatch`.
    """
    import jax

    wanted = cluster.platform
    if wanted not in ("tpu", "gpu"):
        return
    devices = jax.devices()
    found = {d.platform for d in devices}
    # GPU devices report platform "gpu" (CUDA and ROCm alike); TPU devices "tpu".
    if wanted in found:
        return
    kinds = sorted({f"{d.platform}:{d.device_kind}" for d in devices})
    hint = os.environ.get("JAX_PLATFORMS", "")
    raise PlatformMismatch(
        f"asked for {wanted} ({Env.ACCELERATOR}={os.environ.get(Env.ACCELERATOR, '')}) but JAX "
        f"found only {', '.join(sorted(found))} devices: {len(devices)} x {', '.join(kinds)}"
        f"{f' (JAX_PLATFORMS={hint})' if hint else ''}; jax {jax.__version__}, "
        f"backend {jax.default_backend()}")
