"""The contract between the orchestrator/manifests side and the workload side.

Both sides import this package and nothing of each other. It names every env var the
manifest sets and the workload reads, the storage layout, the log line formats and the
metrics record schema. Change a name here or nowhere. It depends on neither jax nor
kubernetes (the storage helpers in ``xrun_contract.storage`` need only the GCS client).
"""

from __future__ import annotations

import re

XRUN_VERSION = "0.1.0"

# The exit code a pod uses to say "restart me" (preemption-like); matches xpk's default.
RESTARTABLE_EXIT_CODE = 42


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
    # JAX persistent compilation cache folder (local backend puts it under the storage root).
    COMPILATION_CACHE = "XRUN_COMPILATION_CACHE"
    # Test-only switches, read by the workload; never set by a real manifest unless asked.
    TEST_FAIL_AT_STEP = "XRUN_TEST_FAIL_AT_STEP"  # "<step>:<exit code>[:<process id>]"
    TEST_STEP_DELAY = "XRUN_TEST_STEP_DELAY"  # seconds added to every step (a "slow branch")

    # Multislice (TPU) variables read by libtpu's megascale runtime.
    MEGASCALE_COORDINATOR_ADDRESS = "MEGASCALE_COORDINATOR_ADDRESS"
    MEGASCALE_NUM_SLICES = "MEGASCALE_NUM_SLICES"
    MEGASCALE_SLICE_ID = "MEGASCALE_SLICE_ID"
    MEGASCALE_PORT = "MEGASCALE_PORT"

    @classmethod
    def all_names(cls) -> set[str]:
        return {v for k, v in vars(cls).items() if k.isupper() and isinstance(v, str)}


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
    def logs(name: str) -> str:
        return f"runs/{name}/logs"

    @staticmethod
    def host_logs(name: str, host: str, attempt: int) -> str:
        """Prefix of one host's log chunks for one restart attempt."""
        return f"runs/{name}/logs/{host}/attempt-{attempt:03d}"

    @staticmethod
    def log_chunk(name: str, host: str, attempt: int, seq: int) -> str:
        return f"{Layout.host_logs(name, host, attempt)}/{seq:08d}.log"

    @staticmethod
    def metrics(name: str) -> str:
        return f"runs/{name}/metrics"

    @staticmethod
    def metrics_chunk(name: str, attempt: int, seq: int) -> str:
        return f"runs/{name}/metrics/attempt-{attempt:03d}-{seq:08d}.jsonl"

    @staticmethod
    def checkpoints(name: str) -> str:
        return f"runs/{name}/checkpoints"

    @staticmethod
    def compilation_cache() -> str:
        return "cache/jax-compilation"

    @staticmethod
    def report(date: str) -> str:
        return f"reports/{date}"


ATTEMPT_RE = re.compile(r"attempt-(\d+)")


# ---------------------------------------------------------------------------------------
# Log lines (MaxText-compatible where MaxText has a line for it).

STEP_LINE = (
    "completed step: {step}, seconds: {seconds:.3f}, TFLOP/s/device: {tflops:.3f}, "
    "Tokens/s/device: {tokens:.3f}, total_weights: {total_weights}, loss: {loss:.4f}"
)
STEP_RE = re.compile(
    r"completed step: (?P<step>\d+), seconds: (?P<seconds>[\d.eE+-]+), "
    r"TFLOP/s/device: (?P<tflops>[\d.eE+-]+|nan|inf), "
    r"Tokens/s/device: (?P<tokens>[\d.eE+-]+|nan|inf), total_weights: (?P<total_weights>\d+), "
    r"loss: (?P<loss>[\d.eE+-]+|nan|inf)"
)
PARAMS_LINE = "number parameters: {billions:.3f} billion"
PARAMS_RE = re.compile(r"number parameters: (?P<billions>[\d.]+) billion")
FLOPS_LINE = (
    "Per train step: Total TFLOPs: {total:.2f} split as {learnable_pct:.2f}% learnable "
    "weight flops and {attention_pct:.2f}% attention flops"
)
FLOPS_RE = re.compile(
    r"Per train step: Total TFLOPs: (?P<total>[\d.]+) split as (?P<learnable_pct>[\d.]+)% "
    r"learnable weight flops and (?P<attention_pct>[\d.]+)% attention flops"
)
MEMORY_LINE = "Using (GB) {used:.2f} / {total:.2f} ({pct:.6f}%) on {device}"
MEMORY_RE = re.compile(
    r"Using \(GB\) (?P<used>[\d.]+) / (?P<total>[\d.]+) \((?P<pct>[\d.]+)%\) on (?P<device>\S+)"
)
# One header line per key, printed by every host at start: "xrun header jax: 0.10.2".
HEADER_LINE = "xrun header {key}: {value}"
HEADER_RE = re.compile(r"xrun header (?P<key>[a-z_]+): (?P<value>.*?)\s*$")
HEADER_KEYS = (
    "xrun", "jax", "jaxlib", "backend", "process_id", "process_count", "local_devices",
    "global_devices", "device_kind", "mesh", "accelerator", "image", "commit", "config",
)
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

# Lines of the pod wrapper that runs the user's command.
WRAPPER_START_LINE = "xrun-wrapper: start host={host} attempt={attempt} argv={argv}"  # argv as JSON: one line
WRAPPER_END_LINE = "xrun-wrapper: end host={host} exit_code={code} seconds={seconds:.3f}"
WRAPPER_START_RE = re.compile(r"xrun-wrapper: start host=(?P<host>\S+) attempt=(?P<attempt>\d+)")
WRAPPER_END_RE = re.compile(
    r"xrun-wrapper: end host=(?P<host>\S+) exit_code=(?P<code>-?\d+) seconds=(?P<seconds>[\d.]+)"
)
EXIT_CODE_LINE = "EXIT_CODE={code}"
EXIT_CODE_RE = re.compile(r"^EXIT_CODE=(?P<code>-?\d+)\s*$")


# ---------------------------------------------------------------------------------------
# Metrics records: JSON lines under runs/<name>/metrics/, written by process 0. One typed
# record per kind, shared by the writer and the readers: see xrun_contract.records.

from xrun_contract import records as records  # noqa: E402  (the typed records, re-exported)

METRIC_KINDS = tuple(records.KINDS)

# How `xrun logs` prefixes a host's line: "[0-1] ..." (attempt 0) or "[0-1 #2] ...".
HOST_PREFIX_RE = re.compile(r"\[(?P<host>\d+-\d+)(?: #(?P<attempt>\d+))?\] ")


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
TERMINAL_STATES = (SUCCEEDED, FAILED, DELETED)
RUN_STATES = (PENDING, RUNNING, RESTARTING, SUCCEEDED, FAILED, DELETED)


def is_terminal(state: str) -> bool:
    return state in TERMINAL_STATES
