"""The contract between the orchestrator/manifests side and the workload side.

Both sides import this package and nothing of each other. It names every env var the
manifest sets and the workload reads, the storage layout, the log line formats and the
metrics record schema. Change a name here or nowhere. It depends on neither jax nor
kubernetes (the storage helpers in ``xrun_contract.storage`` need only the GCS client).
"""

from __future__ import annotations

import os
import re
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

# Run names: a DNS-1035 label (the JobSet name), so never a path. Everything of a run lives
# under ``runs/<name>/``; a name is checked wherever one is read (status, logs, checkpoints,
# delete, compare) before any key is built from it.
RUN_NAME_RE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
RUN_NAME_MAX = 63


def check_run_name(name: str, what: str = "name") -> str:
    """``name`` if it is a DNS-1035 label of at most 63 characters; else bad input (exit 2)."""
    from xrun_contract.errors import XrunError

    if not isinstance(name, str) or len(name) > RUN_NAME_MAX or not RUN_NAME_RE.fullmatch(name):
        shown = name if isinstance(name, str) and len(name) <= 80 else f"{str(name)[:80]}..."
        raise XrunError(f"{what}: {shown!r} is not a run name (a DNS-1035 label: lowercase "
                        f"letters, digits and '-', starting with a letter, at most {RUN_NAME_MAX})")
    return name


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
    TEST_STEP_DELAY = "XRUN_TEST_STEP_DELAY"  # seconds added to every step (tests of kills, screens)
    # seconds the optimized train step's compile waits (tests of quick_compile's switch)
    TEST_OPTIMIZED_DELAY = "XRUN_TEST_OPTIMIZED_DELAY"

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


# ---------------------------------------------------------------------------------------
# Storage layout under the storage root.


class Layout:
    """Keys (relative to the storage root) of everything a run leaves behind."""

    RUNS = "runs"
    REPORTS = "reports"
    CODE = "code"
    SUMMARIES = "summaries"
    CODE_LEASES = "code-leases"

    @staticmethod
    def summaries(name: str) -> str:
        """A run's summary parts (``xrun_contract.summary``): outside ``runs/`` so that one
        listing of ``summaries/`` reads every run's, and nothing else."""
        return f"summaries/{name}"

    @staticmethod
    def summary(name: str, part: str) -> str:
        return f"summaries/{name}/{part}.json"

    @staticmethod
    def code_lease(sha256: str, holder: str) -> str:
        """A marker on a shared archive (``orchestrator.services.code``): ``lease-<id>``, a
        submit reusing or uploading it until its run.json names it (gc and purge leave a
        leased archive); ``gc-<id>``, a gc or purge deciding whether to delete it."""
        return f"code-leases/{sha256}/{holder}"

    @staticmethod
    def pod_code(sha256: str) -> str:
        """xrun's pod-side code (init step, log shipper, doctor's probe; standard library
        only) as a deterministic zip named by its sha256, for pods that run a public python
        image instead of ``xrun_image``. Not under ``code/``: gc never removes it (a few
        hundred KB per xrun version)."""
        return f"xrun-pod/{sha256}.zip"

    @staticmethod
    def code(sha256: str) -> str:
        """A shipped working tree: a deterministic tar.gz named by its own sha256, shared by
        every run that ships the same tree (written once with an exclusive create)."""
        return f"code/{sha256}.tar.gz"

    @staticmethod
    def run(name: str) -> str:
        return f"runs/{name}"

    @staticmethod
    def run_json(name: str) -> str:
        return f"runs/{name}/run.json"

    @staticmethod
    def manifest(name: str) -> str:
        return f"runs/{name}/manifest.yaml"

    @staticmethod
    def state(name: str) -> str:
        return f"runs/{name}/state.json"

    @staticmethod
    def supervisor_log(name: str) -> str:
        """The local supervisor's own output (never under $HOME: the run's folder)."""
        return f"runs/{name}/supervisor.log"

    @staticmethod
    def logs(name: str) -> str:
        return f"runs/{name}/logs"

    @staticmethod
    def host_logs(name: str, host: str, attempt: int) -> str:
        """Prefix of one host's log chunks for one restart attempt."""
        return f"runs/{name}/logs/{host}/attempt-{attempt:03d}"

    @staticmethod
    def log_chunk(name: str, host: str, attempt: int, seq: int, writer: str = "") -> str:
        """``writer`` (see :func:`writer_id`) keeps two incarnations of one host's writer in
        the same attempt (a replacement pod, a stray process) from overwriting each other."""
        tag = f"-{writer}" if writer else ""
        return f"{Layout.host_logs(name, host, attempt)}/{seq:08d}{tag}.log"

    @staticmethod
    def metrics(name: str) -> str:
        return f"runs/{name}/metrics"

    @staticmethod
    def metrics_chunk(name: str, attempt: int, seq: int, writer: str = "") -> str:
        tag = f"-{writer}" if writer else ""
        return f"runs/{name}/metrics/attempt-{attempt:03d}-{seq:08d}{tag}.jsonl"

    @staticmethod
    def metrics_rollups(name: str) -> str:
        return f"runs/{name}/metrics-rollup"

    @staticmethod
    def metrics_rollup(name: str, attempt: int, upto: int, writer: str) -> str:
        """Every record writer ``writer`` wrote in ``attempt`` up to and including its chunk
        ``upto``, in one object (rewritten every METRICS_ROLLUP_EVERY chunks): a reader of the
        whole run reads it and the chunks after it, not every chunk of a long run."""
        return f"runs/{name}/metrics-rollup/attempt-{attempt:03d}-{upto:08d}-{writer}.jsonl"

    @staticmethod
    def checkpoints(name: str) -> str:
        return f"runs/{name}/checkpoints"

    @staticmethod
    def profile(name: str) -> str:
        """``jax.profiler`` traces the workload's ``profile=START:STEPS`` wrote (TensorBoard's
        profile plugin reads ``plugins/profile/<run>/`` under it)."""
        return f"runs/{name}/profile"

    @staticmethod
    def tensorboard(name: str) -> str:
        """TensorBoard event files (process 0), in the run's own folder: ``tensorboard
        --logdir <root>/runs`` names each run by its name (a subfolder would show as
        ``<name>/tensorboard``)."""
        return f"runs/{name}"

    @staticmethod
    def compilation_cache() -> str:
        return "cache/jax-compilation"

    @staticmethod
    def report(stamp: str) -> str:
        """One folder per nightly, ``<YYYY-mm-dd>-<HHMMSS>`` (a suffix if two share a second):
        a second nightly on the same day never overwrites the first's report."""
        return f"reports/{stamp}"

    HISTORY = "history"

    @staticmethod
    def history(stamp: str) -> str:
        """One JSONL object per nightly (a record per run): GCS has no append, and one object
        per writer needs no lock or generation check; readers list the prefix."""
        return f"history/{stamp}.jsonl"


ATTEMPT_RE = re.compile(r"attempt-(\d+)")
# The sequence number of a chunk object's name (log ``00000003-1a2b3c4d.log``, metrics
# ``attempt-000-00000003-1a2b3c4d.jsonl``; the writer tag is absent in older runs).
CHUNK_SEQ_RE = re.compile(r"(\d{8})(?:-[0-9a-f]+)?\.(?:log|jsonl)$")


# A metrics chunk's and a rollup's attempt, sequence number and writer tag.
METRICS_CHUNK_RE = re.compile(r"attempt-(\d+)-(\d{8})(?:-([0-9a-f]+))?\.jsonl$")
METRICS_ROLLUP_EVERY = 30  # chunks (a minute of a writer flushing every 2 s)


def writer_id() -> str:
    """A fresh tag per chunk-writer incarnation: chunk names are never reused."""
    import secrets

    return secrets.token_hex(4)


# ---------------------------------------------------------------------------------------
# Log lines (MaxText-compatible where MaxText has a line for it).

# Numbers in the step line are written by ``format_step_line`` with significant digits in
# plain notation (0.00123, not 0.001 or 1.23e-03), so small CPU rates stay readable; the
# format itself takes any rendering of a number, and STEP_RE reads both.
STEP_LINE = (
    "completed step: {step}, seconds: {seconds}, TFLOP/s/device: {tflops}, "
    "Tokens/s/device: {tokens}, total_weights: {total_weights}, loss: {loss}"
)
STEP_RE = re.compile(
    r"completed step: (?P<step>\d+), seconds: (?P<seconds>[\d.eE+-]+), "
    r"TFLOP/s/device: (?P<tflops>[\d.eE+-]+|nan|inf), "
    r"Tokens/s/device: (?P<tokens>[\d.eE+-]+|nan|inf), total_weights: (?P<total_weights>\d+), "
    r"loss: (?P<loss>[\d.eE+-]+|nan|inf)"
)


def significant(x: float, digits: int = 4) -> str:
    """``x`` in plain (never scientific) notation with at least ``digits`` significant digits:
    0.0012345 -> "0.001234", 12.3456 -> "12.35", 123456.7 -> "123457"; nan/inf as "nan"/"inf"."""
    import math

    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


def format_step_line(step: int, seconds: float, tflops: float, tokens: float,
                     total_weights: int, loss: float) -> str:
    """MaxText's step line with significant digits (loss with 5, the rest with 4)."""
    return STEP_LINE.format(step=step, seconds=significant(seconds), tflops=significant(tflops),
                            tokens=significant(tokens), total_weights=total_weights,
                            loss=significant(loss, 5))


def fixed_or_significant(x: float, decimals: int, digits: int = 3) -> str:
    """``x`` with MaxText's fixed ``decimals`` unless that would hide it (0.000): then with
    ``digits`` significant digits, so a small model reads 0.000123, not 0.000."""
    fixed = f"{x:.{decimals}f}"
    return significant(x, digits) if x and float(fixed) == 0 else fixed


PARAMS_LINE = "number parameters: {billions:.3f} billion"
# MaxText's billions, or (xrun's line for small models) millions or a plain count.
PARAMS_RE = re.compile(r"number parameters: (?P<value>\d[\d,]*(?:\.\d+)?)(?: (?P<unit>billion|million))?")
PARAMS_UNITS = {"billion": 1e9, "million": 1e6, None: 1.0}
FLOPS_LINE = (
    "Per train step: Total TFLOPs: {total:.2f} split as {learnable_pct:.2f}% learnable "
    "weight flops and {attention_pct:.2f}% attention flops"
)


def format_params_line(count: float) -> str:
    """PARAMS_LINE (MaxText's billions) from 0.1 billion up; a smaller model in millions
    ('0.107 million') or as a plain count ('42,816'), never '0.000107 billion'. PARAMS_RE
    reads all three."""
    if count >= 1e8:
        return PARAMS_LINE.format(billions=count / 1e9)
    if count >= 1e5:
        return f"number parameters: {count / 1e6:.3f} million"
    return f"number parameters: {count:,.0f}"


def format_flops_line(total: float, learnable_pct: float, attention_pct: float) -> str:
    """FLOPS_LINE, never 'Total TFLOPs: 0.00' (FLOPS_RE reads both)."""
    return FLOPS_LINE.replace("{total:.2f}", fixed_or_significant(total, 2)).format(
        learnable_pct=learnable_pct, attention_pct=attention_pct)


FLOPS_RE = re.compile(
    r"Per train step: Total TFLOPs: (?P<total>[\d.]+) split as (?P<learnable_pct>[\d.]+)% "
    r"learnable weight flops and (?P<attention_pct>[\d.]+)% attention flops"
)
MEMORY_LINE = "Using (GB) {used:.2f} / {total:.2f} ({pct:.6f}%) on {device}"
MEMORY_RE = re.compile(
    r"Using \(GB\) (?P<used>[\d.]+) / (?P<total>[\d.]+) \((?P<pct>[\d.]+)%\) on (?P<device>\S+)"
)
# Header lines "xrun header <key>: <value>". The workload prints two, on process 0 only:
#   xrun header versions: xrun=0.1.0 jax=0.10.2 jaxlib=0.10.2 backend=cpu ... mesh={"data":1,"fsdp":4}
#   xrun header config: preset=tiny steps=10 checkpoint_every=4   (only keys that differ
#                                                                 from the preset)
# The full config is in the metrics "header" record and run.json. ``header_fields`` turns a
# versions line back into the HEADER_KEYS dict; any other key is one field (older logs and
# other tools print one line per key: "xrun header jax: 0.10.2").
HEADER_LINE = "xrun header {key}: {value}"
HEADER_RE = re.compile(r"xrun header (?P<key>[a-z_]+): (?P<value>.*?)\s*$")
HEADER_KEYS = (
    "xrun", "jax", "jaxlib", "backend", "process_id", "process_count", "local_devices",
    "global_devices", "device_kind", "mesh", "accelerator", "image", "commit", "config",
)
HEADER_VERSIONS_KEY = "versions"
HEADER_FIELD_RE = re.compile(r"(?P<key>[a-z_]+)=(?P<value>\S*)")


def format_header_fields(fields: dict[str, str]) -> str:
    """``{"jax": "0.10.2", "mesh": '{"data":1}'}`` -> 'jax=0.10.2 mesh={"data":1}';
    whitespace inside a value becomes "_" (device kinds such as "TPU v6 lite")."""
    return " ".join(f"{k}={'_'.join(str(v).split())}" for k, v in fields.items() if v != "")


def header_fields(key: str, value: str) -> dict[str, str]:
    """The header keys one "xrun header <key>: <value>" line carries."""
    if key == HEADER_VERSIONS_KEY:
        return {m["key"]: m["value"] for m in HEADER_FIELD_RE.finditer(value)}
    return {key: value}
# Checkpoint events.
CKPT_START_LINE = "checkpoint save started: step {step}"
CKPT_START_RE = re.compile(r"checkpoint save started: step (?P<step>\d+)")
CKPT_BLOCKED_LINE = "checkpoint save blocked training: step {step}, seconds: {seconds:.3f}"
CKPT_BLOCKED_RE = re.compile(
    r"checkpoint save blocked training: step (?P<step>\d+), seconds: (?P<seconds>[\d.]+)"
)
CKPT_WAIT_PREVIOUS_LINE = "checkpoint waiting for previous save: step {step}, seconds: {seconds:.3f}"
CKPT_WAIT_PREVIOUS_RE = re.compile(
    r"checkpoint waiting for previous save: step (?P<step>\d+), seconds: (?P<seconds>[\d.]+)"
)
CKPT_COMMIT_LINE = "checkpoint committed: step {step}, seconds: {seconds:.3f}"
CKPT_COMMIT_RE = re.compile(
    r"checkpoint committed: step (?P<step>\d+), seconds: (?P<seconds>[\d.]+)"
)
CKPT_RESTORED_LINE = "checkpoint restored: step {step}"
CKPT_RESTORED_RE = re.compile(r"checkpoint restored: step (?P<step>\d+)")
# A save came due while the previous one was still being written: it is not waited for,
# the save happens at the first step after the previous one committed (workload/checkpointing.py).
CKPT_DEFERRED_LINE = (
    "checkpoint save deferred: step {step}, previous save of step {previous} still writing"
)
CKPT_DEFERRED_RE = re.compile(
    r"checkpoint save deferred: step (?P<step>\d+), previous save of step (?P<previous>\d+) "
    r"still writing"
)
# A save came due while storage did not answer (an outage): deferred the same way, to the
# first step boundary at which every process reaches storage again; training goes on.
CKPT_DEFERRED_STORAGE_LINE = "checkpoint save deferred: step {step}, storage unavailable: {error}"
CKPT_DEFERRED_STORAGE_RE = re.compile(
    r"checkpoint save deferred: step (?P<step>\d+), storage unavailable: (?P<error>.*)"
)
# The last step's and a SIGTERM save must commit before the process exits: that wait.
CKPT_EXIT_WAIT_LINE = "checkpoint waiting to commit before exit: step {step}, seconds: {seconds:.3f}"
CKPT_EXIT_WAIT_RE = re.compile(
    r"checkpoint waiting to commit before exit: step (?P<step>\d+), seconds: (?P<seconds>[\d.]+)"
)
# A committed step that does not restore (corrupt or missing data): the run falls back to
# the previous committed step. One line per failed step, with the error's first line.
CKPT_RESTORE_FAILED_LINE = "checkpoint restore failed: step {step}, error: {error}"
CKPT_RESTORE_FAILED_RE = re.compile(
    r"checkpoint restore failed: step (?P<step>\d+), error: (?P<error>.*?)\s*$"
)
# A checkpoint write failed on some process: every process exits with the restartable code.
CKPT_WRITE_FAILED_LINE = "checkpoint write failed: step {step}, process {process}, error: {error}"
CKPT_WRITE_FAILED_RE = re.compile(
    r"checkpoint write failed: step (?P<step>\d+), process (?P<process>\d+), "
    r"error: (?P<error>.*?)\s*$"
)

# Startup phases (#15, #16). Process 0 prints one line when a phase ends, naming what the
# process does from then on, and writes a "phase" record (below) with the same fields:
#   xrun phase: initializing distributed, seconds: 1.234      (seconds since process start)
#   xrun phase: restoring step 40, seconds: 5.100
#   xrun phase: training, seconds: 9.870
#   xrun phase: first step done, seconds: 10.120
# PHASES are the milestones in order (the record's "phase"); "restored" and "initialized"
# are alternatives. PHASE_ACTIVITY is what follows each milestone.
PHASES = ("process_start", "imports", "distributed", "checkpoint_manager", "restored",
          "initialized", "compiled", "first_step")
PHASE_ACTIVITY = {
    "process_start": "importing",
    "imports": "initializing distributed",
    "distributed": "opening checkpoints",
    "checkpoint_manager": "restoring step {step}",  # or "initializing state" (no checkpoint)
    "restored": "compiling",
    "initialized": "compiling",
    "compiled": "training",
    "first_step": "first step done",
}
PHASE_LINE = "xrun phase: {activity}, seconds: {seconds:.3f}"
# Appended to a phase line: "seconds" is the offset from the process start; this says how
# long the activity that just ended took (its own span when a thread ran it alongside).
PHASE_TOOK = " since start; {activity} took {seconds} s"  # seconds: significant(x, 3)
PHASE_RE = re.compile(
    r"xrun phase: (?P<activity>[a-z ]+?)(?: step (?P<step>\d+))?, seconds: (?P<seconds>[\d.]+)"
)

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
    CODE = "code"  # the shipped working tree, unpacked by the init container
    LIB = "lib"  # xrun's pod code (Layout.pod_code), unpacked by the init container's bootstrap


# Lines of the pod launcher that runs the user's command (names kept from the former
# Python wrapper, so runs of either kind read back the same).
WRAPPER_START_LINE = "xrun-wrapper: start host={host} attempt={attempt} argv={argv}"  # argv as JSON: one line
WRAPPER_END_LINE = "xrun-wrapper: end host={host} exit_code={code} seconds={seconds:.3f}"
WRAPPER_START_RE = re.compile(r"xrun-wrapper: start host=(?P<host>\S+) attempt=(?P<attempt>\d+)")
WRAPPER_END_RE = re.compile(
    r"xrun-wrapper: end host=(?P<host>\S+) exit_code=(?P<code>-?\d+) seconds=(?P<seconds>[\d.]+)"
)
EXIT_CODE_LINE = "EXIT_CODE={code}"
# ``xrun doctor``'s storage probe (workload/probe.py): one line, a JSON object with root, key,
# ok, error, account and scopes (the identity GCS saw from the pod's node).
PROBE_LINE = "xrun probe: {json}"
PROBE_RE = re.compile(r"^xrun probe: (\{.*\})\s*$")
EXIT_CODE_RE = re.compile(r"^EXIT_CODE=(?P<code>-?\d+)\s*$")


# ---------------------------------------------------------------------------------------
# Metrics records: JSON lines under runs/<name>/metrics/, written by process 0. One typed
# record per kind, shared by the writer and the readers: see xrun_contract.records.

from xrun_contract import records as records  # noqa: E402  (the typed records, re-exported)

METRIC_KINDS = tuple(records.KINDS)

# Stored log lines carry the time the wrapper read them, as kubelet's CRI log files do
# (``kuberuntime_logs.go``: RFC3339Nano then one space): "2026-12-03T10:39:13.123456Z text".
# Only the storage copy is stamped (stdout stays as the program wrote it); readers take
# unstamped lines (chunks written before stamping) as they are and date them by the chunk.
LOG_STAMP_RE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?Z) (?P<text>.*)$", re.S
)


def stamp_line(t: float, text: str) -> str:
    """``text`` (one line, its newline kept) stamped with epoch time ``t`` in UTC."""
    import datetime

    ts = datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"{ts} {text}"


def split_stamp(line: str) -> tuple[float | None, str]:
    """(epoch seconds, text) of a stored line; (None, line) for an unstamped one."""
    import datetime

    m = LOG_STAMP_RE.match(line)
    if not m:
        return None, line
    ts = m["ts"][:-1]
    whole, _, frac = ts.partition(".")
    t = datetime.datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.UTC)
    return t.timestamp() + (float(f"0.{frac}") if frac else 0.0), m["text"]


# How `xrun logs` prefixes a host's line: "[0-1] ..." (attempt 0) or "[0-1 #2] ...".
HOST_PREFIX_RE = re.compile(r"\[(?P<host>\d+-\d+)(?: #(?P<attempt>\d+))?\] ")

# TensorBoard scalars the workload writes per step: step-record key -> tag (MaxText's tag
# names where it has one: learning/loss, perf/step_time_seconds, ...).
TENSORBOARD_SCALARS = {
    "loss": "learning/loss",
    "grad_norm": "learning/grad_norm",
    "learning_rate": "learning/current_learning_rate",
    "seconds": "perf/step_time_seconds",
    "tokens_per_s": "perf/tokens_per_sec",  # total over all devices
    "tflops_per_device": "perf/per_device_tflops_per_sec",
    "checkpoint_blocked_s": "checkpoint/blocked_seconds",
}

# How the workload classified the exception that ended a run (the "end" record's
# "failure" and the run.json workload "failure"): "infrastructure" exits restartable
# (XRUN_RESTARTABLE_EXIT_CODE), "user" exits USER_ERROR_EXIT_CODE, "platform" exits
# PLATFORM_MISMATCH_EXIT_CODE.
FAILURE_KINDS = ("infrastructure", "user", "platform")
FAILURE_LINE = "xrun failure: {kind}: {why}; exit code {code}"
FAILURE_RE = re.compile(r"xrun failure: (?P<kind>[a-z]+): (?P<why>.*); exit code (?P<code>\d+)")


def host_prefix(host: str, attempt: int) -> str:
    return f"[{host}]" if attempt == 0 else f"[{host} #{attempt}]"


# Checkpoint events, in the order a save goes through them. "waited" (training waited for
# the previous save) is no longer written by xrun's workload, which defers instead; readers
# keep it for older runs. "exit_wait": the last step's / SIGTERM save committing before exit.
CHECKPOINT_EVENTS = (
    "started", "blocked", "waited", "deferred", "committed", "exit_wait", "restored",
    "restore_failed", "write_failed",
)


# ---------------------------------------------------------------------------------------
# Run states (state.json "state"), shared by the backends and the readers.

PENDING, RUNNING, RESTARTING, SUCCEEDED, FAILED, DELETED = (
    "Pending", "Running", "Restarting", "Succeeded", "Failed", "Deleted",
)
# What a reader shows when a stored record (run.json, state.json) is corrupt: nothing it
# says can be trusted, so no state is guessed from the rest.
UNKNOWN = "Unknown"
TERMINAL_STATES = (SUCCEEDED, FAILED, DELETED)
RUN_STATES = (PENDING, RUNNING, RESTARTING, SUCCEEDED, FAILED, DELETED, UNKNOWN)


def is_terminal(state: str) -> bool:
    return state in TERMINAL_STATES


def drain_seconds(grace_seconds: float) -> int:
    """The log shipper's final-drain deadline for a pod with this termination grace period:
    below it (2 s less, the kubelet's minimum for a sidecar), at most 30 s, at least 1 s."""
    return int(max(1, min(grace_seconds - 2, 30)))
