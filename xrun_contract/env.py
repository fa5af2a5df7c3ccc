"""What the manifest (or the local backend) hands every host: exit codes, environment
variable names, the pod's shared folder and process numbering. Standard library only."""

from __future__ import annotations

import os
from typing import Any

XRUN_VERSION = "0.1.0"

# The exit code a pod uses to say "restart me" (preemption-like); matches xpk's default.
RESTARTABLE_EXIT_CODE = 42
# The default restartable set of a run (RunSpec restartable_exit_codes): 42 and 127-255.
DEFAULT_RESTARTABLE_EXIT_CODES = (RESTARTABLE_EXIT_CODE, *range(127, 256))
# The workload refuses to train: the manifest asked for an accelerator (XRUN_PLATFORM tpu or
# gpu) but JAX came up without one (no driver, a CPU-only jaxlib, JAX_PLATFORMS=cpu). A
# restart lands on the same image and node type, so this code is outside the default
# restartable set: the Job fails for good (podFailurePolicy FailJob) instead of looping.
PLATFORM_MISMATCH_EXIT_CODE = 4
# What JAX_PLATFORMS a pod of each XRUN_PLATFORM pins (GPU pods only: a CUDA jaxlib that
# cannot load the driver must fail loudly, not fall back to CPU). Local runs map it to cpu.
JAX_PLATFORMS_FOR = {"gpu": "cuda"}
# Where GKE's device plugin mounts the NVIDIA driver libraries in a GPU container.
GKE_NVIDIA_LIB64 = "/usr/local/nvidia/lib64"
# A Python exception in user code (a bug): never restartable.
USER_ERROR_EXIT_CODE = 1
# The pod's program does not exist or cannot be executed. POSIX shells say 127 (not found)
# and 126 (not executable), and 127 sits in the default restartable set (127-255), so a
# typo'd program would crash-loop through every restart. The pod wrapper reports both as
# this code, outside the default set: the Job fails for good (podFailurePolicy FailJob).
COMMAND_NOT_FOUND_EXIT_CODE = 126
# The shell's own codes the wrapper maps to COMMAND_NOT_FOUND_EXIT_CODE.
SHELL_NOT_FOUND_CODES = (126, 127)


def exit_code_for_signal(signum: int) -> int:
    """The container exit code of a process killed by ``signum``: 128 + N, as the kubelet and
    every POSIX shell report it (SIGKILL 137, SIGTERM 143, SIGABRT 134, SIGSEGV 139).

    SIGABRT and SIGSEGV stay in the default restartable set (127-255) on purpose: in a JAX
    job they are almost always the runtime, not the user's Python. XLA's and the
    coordination service's fatal paths end in ``LOG(FATAL)`` / ``abort()`` (a peer's
    heartbeat timeout, "Terminating process because the JAX distributed service detected
    fatal errors", a failed collective), and a lost accelerator or driver fault kills the
    process with SIGSEGV/SIGBUS. A user bug in Python raises an exception instead and exits
    1. A deterministic native crash costs at most ``max_restarts`` restarts, and each
    restart resumes from the last checkpoint; failing for good on a transient runtime abort
    would lose the whole run.
    """
    return 128 + int(signum)


class Env:
    """Environment variable names set by the manifest (or the local backend) for every host."""

    RUN_NAME = "XRUN_RUN_NAME"
    STORAGE = "XRUN_STORAGE"  # storage root: a local folder or gs://bucket/prefix
    # From the Downward API: label jobset.sigs.k8s.io/job-global-index.
    SLICE_INDEX = "XRUN_SLICE_INDEX"
    # From the Downward API: annotation batch.kubernetes.io/job-completion-index.
    HOST_INDEX = "XRUN_HOST_INDEX"
    # From the Downward API: label jobset.sigs.k8s.io/restart-attempt.
    RESTART_ATTEMPT = "XRUN_RESTART_ATTEMPT"
    # Set by ``xrun submit --resume`` (the attempts a resumed run had before): added to the
    # JobSet's restart attempt, which starts at 0 again, so a resumed run's logs, metrics and
    # run.json fence continue its attempt numbering. The launcher exports the sum.
    ATTEMPT_BASE = "XRUN_ATTEMPT_BASE"
    POD_NAME = "XRUN_POD_NAME"  # metadata.name
    NUM_SLICES = "XRUN_NUM_SLICES"
    HOSTS_PER_SLICE = "XRUN_HOSTS_PER_SLICE"
    COORDINATOR_ADDRESS = "XRUN_COORDINATOR_ADDRESS"  # host:port of process 0
    PLATFORM = "XRUN_PLATFORM"  # tpu | gpu | cpu
    ACCELERATOR = "XRUN_ACCELERATOR"  # catalogue shape name, e.g. v6e-32
    DEVICES_PER_HOST = "XRUN_DEVICES_PER_HOST"  # chips (tpu), GPUs (gpu) or forced CPU devices
    PEAK_TFLOPS_PER_DEVICE = "XRUN_PEAK_TFLOPS_PER_DEVICE"  # bf16 dense peak, for MFU
    HBM_GIB_PER_DEVICE = "XRUN_HBM_GIB_PER_DEVICE"  # for memory %
    RESTARTABLE_EXIT_CODE = "XRUN_RESTARTABLE_EXIT_CODE"
    IMAGE = "XRUN_IMAGE"
    COMMIT = "XRUN_COMMIT"
    BRANCH = "XRUN_BRANCH"
    # Log shipping interval of the wrapper, seconds (gs:// chunk cadence).
    LOG_FLUSH_SECONDS = "XRUN_LOG_FLUSH_SECONDS"
    # The log shipper's deadline for its final drain, seconds: below the pod's grace period
    # (``drain_seconds``), so a storage that keeps failing never holds the pod to its SIGKILL.
    DRAIN_SECONDS = "XRUN_DRAIN_SECONDS"
    # "json": the wrapper's own stdout lines are JSON objects with "severity" and "message"
    # (what Cloud Logging's agent parses into a structured entry); anything else: plain text.
    LOG_FORMAT = "XRUN_LOG_FORMAT"
    # JAX persistent compilation cache folder: <root>/cache/jax-compilation, set in the
    # manifest for gs:// roots and by the local backend for folders.
    COMPILATION_CACHE = "XRUN_COMPILATION_CACHE"
    # Test-only switches, read by the workload; never set by a real manifest unless asked.
    TEST_FAIL_AT_STEP = "XRUN_TEST_FAIL_AT_STEP"  # "<step>:<exit code>[:<process id>]"
    TEST_RESTART_EVERY = "XRUN_TEST_RESTART_EVERY"  # N: save and exit restartable every N steps (soak)
    TEST_STEP_DELAY = "XRUN_TEST_STEP_DELAY"  # seconds added to every step (tests of kills, screens)
    # seconds the optimized train step's compile waits (tests of quick_compile's switch)
    TEST_OPTIMIZED_DELAY = "XRUN_TEST_OPTIMIZED_DELAY"
    # step N: from it on, a process still running the quick step waits for its own optimized
    # one, so that every process has switched by step N however slow the machine compiles
    TEST_SWITCH_BY = "XRUN_TEST_SWITCH_BY"

    # The pod's shared folder (an emptyDir mounted in every container of the pod): the
    # launcher lives there and the user's output goes there for the log shipper (PodFiles).
    POD_DIR = "XRUN_POD_DIR"
    # All processes of the run (slices x hosts per slice), static in the manifest.
    NUM_PROCESSES = "XRUN_NUM_PROCESSES"
    # This process's id, slice index x hosts per slice + host index: Kubernetes cannot compute
    # it, so the launcher (PodFiles.LAUNCHER) exports it before the user's command starts.
    PROCESS_ID = "XRUN_PROCESS_ID"
    # Read by jax.distributed.initialize() itself when no address is passed (host:port;
    # jax/_src/distributed.py State.initialize), so a bare initialize() finds process 0.
    JAX_COORDINATOR_ADDRESS = "JAX_COORDINATOR_ADDRESS"
    # GPU shapes only: what MaxText's initialize_jax_for_gpu (MaxText max_utils.py) reads,
    # the names XPK's GPU workloads set (xpk src/xpk/core/docker_resources.py get_env_container).
    JAX_COORDINATOR_IP = "JAX_COORDINATOR_IP"
    JAX_COORDINATOR_PORT = "JAX_COORDINATOR_PORT"
    NNODES = "NNODES"
    NODE_RANK = "NODE_RANK"

    # GPU networking stacks (manifests/accelerators.yaml env_profile, env_fallback): the NCCL
    # plugin's env file on the node, which the launcher sources before the user's command; the
    # NAME=value lines (one per line) it exports instead when that file is absent; and the
    # names of the run file's env, which keep their values over both.
    NCCL_ENV_PROFILE = "XRUN_NCCL_ENV_PROFILE"
    NCCL_ENV_FALLBACK = "XRUN_NCCL_ENV_FALLBACK"
    USER_ENV = "XRUN_USER_ENV"

    # Multislice (TPU) variables read by libtpu's megascale runtime.
    MEGASCALE_COORDINATOR_ADDRESS = "MEGASCALE_COORDINATOR_ADDRESS"
    MEGASCALE_NUM_SLICES = "MEGASCALE_NUM_SLICES"
    MEGASCALE_SLICE_ID = "MEGASCALE_SLICE_ID"
    MEGASCALE_PORT = "MEGASCALE_PORT"

    # The shipped working tree (``workdir``): the archive's sha256 (init container: fetch
    # ``Layout.code(sha)``, check, unpack into ``$XRUN_POD_DIR/code``) and, in the user's
    # container, the unpacked folder the launcher runs the command in (cwd, first on PYTHONPATH).
    CODE_SHA256 = "XRUN_CODE_SHA256"
    WORKDIR = "XRUN_WORKDIR"
    # xrun's own pod code without xrun's image (``xrun_image`` unset on a cluster): the
    # sha256 of ``Layout.pod_code(sha)``, which the init container's bootstrap fetches,
    # checks and unpacks into ``$XRUN_POD_DIR/lib`` for itself and the log shipper.
    POD_CODE_SHA256 = "XRUN_POD_CODE_SHA256"

    @classmethod
    def all_names(cls) -> set[str]:
        return {v for k, v in vars(cls).items() if k.isupper() and isinstance(v, str)}


def restart_attempt(environ: Any = None) -> int:
    """This pod's restart attempt counted over the whole run: the JobSet's (the Downward
    API's label) plus ``XRUN_ATTEMPT_BASE`` (a resumed run's earlier attempts)."""
    env = os.environ if environ is None else environ

    def num(key: str) -> int:
        try:
            return max(0, int(str(env.get(key) or 0).strip()))
        except ValueError:
            return 0

    return num(Env.RESTART_ATTEMPT) + num(Env.ATTEMPT_BASE)


def global_process_id(slice_index: int, host_index: int, hosts_per_slice: int) -> int:
    """Process id across all slices: slice-major, then the host's completion index."""
    return slice_index * hosts_per_slice + host_index


def host_id(slice_index: int, host_index: int) -> str:
    """The short name of one host (pod) used in storage paths and log prefixes: "<slice>-<host>"."""
    return f"{slice_index}-{host_index}"



class PodFiles:
    """Files under the pod's shared folder (``$XRUN_POD_DIR``, an emptyDir).

    The init container copies the launcher there from xrun's image; the launcher (in the
    user's image, /bin/sh only) appends the user's output to OUTPUT; the log-shipping sidecar
    (xrun's image) ships OUTPUT to storage and records how far it got in SHIPPED, so a
    restarted sidecar resumes without repeating or losing a line.
    """

    MOUNT_PATH = "/xrun"  # where the manifest mounts the folder in every container
    LAUNCHER = "bin/xrun-launch"
    OUTPUT = "output.log"
    SHIPPED = "shipped.json"
    # Written by the shipper once it takes SIGTERM (blocked, awaited by a thread of its own);
    # the launcher waits for it before its container ends (the shipper's SIGTERM follows).
    SHIPPER_READY = "shipper.ready"
    CODE = "code"  # the shipped working tree, unpacked by the init container
    LIB = "lib"  # xrun's pod code (Layout.pod_code), unpacked by the init container's bootstrap



def drain_seconds(grace_seconds: float) -> int:
    """The log shipper's final-drain deadline for a pod with this termination grace period:
    below it (2 s less, the kubelet's minimum for a sidecar), at most 30 s, at least 1 s."""
    return int(max(1, min(grace_seconds - 2, 30)))

__all__ = [
    "XRUN_VERSION",
    "RESTARTABLE_EXIT_CODE",
    "DEFAULT_RESTARTABLE_EXIT_CODES",
    "PLATFORM_MISMATCH_EXIT_CODE",
    "JAX_PLATFORMS_FOR",
    "GKE_NVIDIA_LIB64",
    "USER_ERROR_EXIT_CODE",
    "COMMAND_NOT_FOUND_EXIT_CODE",
    "SHELL_NOT_FOUND_CODES",
    "exit_code_for_signal",
    "Env",
    "restart_attempt",
    "global_process_id",
    "host_id",
    "PodFiles",
    "drain_seconds",
]
