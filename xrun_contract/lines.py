"""The log lines the workload and the pod launcher write, and how readers read them back
(MaxText-compatible where MaxText has a line for it). Standard library only."""

from __future__ import annotations

import re
import string

from xrun_contract import records as records

# Each line is defined once, by its format; its reader is derived from it (``line_re``).
INT = r"\d+"
NUMBER = r"[\d.]+"  # what a fixed-point field ("{x:.3f}") prints
FLOAT = r"[\d.eE+-]+"  # any rendering of a number
FLOAT_NAN = FLOAT + "|nan|inf"
_REGEX_SPECIAL = re.compile(r"[\\.^$*+?{}\[\]|()]")  # what a literal must escape (not spaces)
# The pattern of a field by its name, where the line does not say otherwise.
FIELD_PATTERNS = {"step": INT, "previous": INT, "process": INT, "attempt": INT, "host": r"\S+"}


def line_re(fmt: str, *, anchored: bool = False, end: str = "", until: str | None = None,
            **fields: str) -> re.Pattern[str]:
    """The regex that reads back lines written with ``fmt``: its literal text escaped, each
    ``{name}`` / ``{name:spec}`` a named group. A field's pattern is ``fields[name]``, else
    FIELD_PATTERNS[name], else NUMBER for a fixed-point spec; a pattern that holds its own
    ``(?P<name>`` group is taken whole (an optional part). ``until`` names the first field
    not read (the regex ends before the text leading to it); ``end`` is appended, and
    ``anchored`` pins the start."""
    parts = ["^"] if anchored else []
    for literal, name, spec, _ in string.Formatter().parse(fmt):
        if until is not None and name == until:
            break
        parts.append(_REGEX_SPECIAL.sub(r"\\\g<0>", literal))
        if name is None:
            continue
        pattern = fields.get(name) or FIELD_PATTERNS.get(name)
        if pattern is None and spec and spec.endswith("f"):
            pattern = NUMBER
        if pattern is None:
            raise ValueError(f"line_re: no pattern for field {name!r} of {fmt!r}")
        parts.append(pattern if f"(?P<{name}>" in pattern else f"(?P<{name}>{pattern})")
    return re.compile("".join(parts) + end)


# Numbers in the step line are written by ``format_step_line`` with significant digits in
# plain notation (0.00123, not 0.001 or 1.23e-03), so small CPU rates stay readable; the
# format itself takes any rendering of a number, and STEP_RE reads both.
STEP_LINE = (
    "completed step: {step}, seconds: {seconds}, TFLOP/s/device: {tflops}, "
    "Tokens/s/device: {tokens}, total_weights: {total_weights}, loss: {loss}"
)
STEP_RE = line_re(STEP_LINE, seconds=FLOAT, tflops=FLOAT_NAN, tokens=FLOAT_NAN,
                  total_weights=INT, loss=FLOAT_NAN)


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


# MaxText's billions ("number parameters: 1.104 billion"), or (xrun's line for small models)
# millions or a plain count: ``unit`` is " billion", " million" or "".
PARAMS_LINE = "number parameters: {value}{unit}"
PARAMS_RE = line_re(PARAMS_LINE, value=r"\d[\d,]*(?:\.\d+)?",
                    unit=r"(?: (?P<unit>billion|million))?")
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
        return PARAMS_LINE.format(value=f"{count / 1e9:.3f}", unit=" billion")
    if count >= 1e5:
        return PARAMS_LINE.format(value=f"{count / 1e6:.3f}", unit=" million")
    return PARAMS_LINE.format(value=f"{count:,.0f}", unit="")


def format_flops_line(total: float, learnable_pct: float, attention_pct: float) -> str:
    """FLOPS_LINE, never 'Total TFLOPs: 0.00' (the parser's MaxText readers take both)."""
    return FLOPS_LINE.replace("{total:.2f}", fixed_or_significant(total, 2)).format(
        learnable_pct=learnable_pct, attention_pct=attention_pct)


MEMORY_LINE = "Using (GB) {used:.2f} / {total:.2f} ({pct:.6f}%) on {device}"
MEMORY_RE = line_re(MEMORY_LINE, device=r"\S+")
# Header lines "xrun header <key>: <value>". The workload prints two, on process 0 only:
#   xrun header versions: xrun=0.1.0 jax=0.10.2 jaxlib=0.10.2 backend=cpu ... mesh={"data":1,"fsdp":4}
#   xrun header config: preset=tiny steps=10 checkpoint_every=4   (only keys that differ
#                                                                 from the preset)
# The full config is in the metrics "header" record and run.json. ``header_fields`` turns a
# versions line back into the HEADER_KEYS dict; any other key is one field (older logs and
# other tools print one line per key: "xrun header jax: 0.10.2").
HEADER_LINE = "xrun header {key}: {value}"
HEADER_RE = line_re(HEADER_LINE, key=r"[a-z_]+", value=r".*?", end=r"\s*$")
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
CKPT_START_RE = line_re(CKPT_START_LINE)
CKPT_BLOCKED_LINE = "checkpoint save blocked training: step {step}, seconds: {seconds:.3f}"
CKPT_BLOCKED_RE = line_re(CKPT_BLOCKED_LINE)
CKPT_WAIT_PREVIOUS_LINE = "checkpoint waiting for previous save: step {step}, seconds: {seconds:.3f}"
CKPT_WAIT_PREVIOUS_RE = line_re(CKPT_WAIT_PREVIOUS_LINE)
CKPT_COMMIT_LINE = "checkpoint committed: step {step}, seconds: {seconds:.3f}"
CKPT_COMMIT_RE = line_re(CKPT_COMMIT_LINE)
CKPT_RESTORED_LINE = "checkpoint restored: step {step}"
CKPT_RESTORED_RE = line_re(CKPT_RESTORED_LINE)
# A save came due while the previous one was still being written: it is not waited for,
# the save happens at the first step after the previous one committed (workload/checkpointing.py).
CKPT_DEFERRED_LINE = (
    "checkpoint save deferred: step {step}, previous save of step {previous} still writing"
)
CKPT_DEFERRED_RE = line_re(CKPT_DEFERRED_LINE)
# A save came due while storage did not answer (an outage): deferred the same way, to the
# first step boundary at which every process reaches storage again; training goes on.
CKPT_DEFERRED_STORAGE_LINE = "checkpoint save deferred: step {step}, storage unavailable: {error}"
CKPT_DEFERRED_STORAGE_RE = line_re(CKPT_DEFERRED_STORAGE_LINE, error=r".*")
# The last step's and a SIGTERM save must commit before the process exits: that wait.
CKPT_EXIT_WAIT_LINE = "checkpoint waiting to commit before exit: step {step}, seconds: {seconds:.3f}"
CKPT_EXIT_WAIT_RE = line_re(CKPT_EXIT_WAIT_LINE)
# A committed step that does not restore (corrupt or missing data): the run falls back to
# the previous committed step. One line per failed step, with the error's first line.
CKPT_RESTORE_FAILED_LINE = "checkpoint restore failed: step {step}, error: {error}"
CKPT_RESTORE_FAILED_RE = line_re(CKPT_RESTORE_FAILED_LINE, error=r".*?", end=r"\s*$")
# A checkpoint write failed on some process: every process exits with the restartable code.
CKPT_WRITE_FAILED_LINE = "checkpoint write failed: step {step}, process {process}, error: {error}"
CKPT_WRITE_FAILED_RE = line_re(CKPT_WRITE_FAILED_LINE, error=r".*?", end=r"\s*$")

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
PHASE_RE = line_re(PHASE_LINE, activity=r"(?P<activity>[a-z ]+?)(?: step (?P<step>\d+))?")


# Lines of the pod launcher that runs the user's command (names kept from the former
# Python wrapper, so runs of either kind read back the same).
WRAPPER_START_LINE = "xrun-wrapper: start host={host} attempt={attempt} argv={argv}"  # argv as JSON: one line
WRAPPER_END_LINE = "xrun-wrapper: end host={host} exit_code={code} seconds={seconds:.3f}"
WRAPPER_START_RE = line_re(WRAPPER_START_LINE, until="argv")
WRAPPER_END_RE = line_re(WRAPPER_END_LINE, code=r"-?\d+")
EXIT_CODE_LINE = "EXIT_CODE={code}"
# ``xrun doctor``'s storage probe (workload/probe.py): one line, a JSON object with root, key,
# ok, error, account and scopes (the identity GCS saw from the pod's node).
PROBE_LINE = "xrun probe: {json}"
PROBE_RE = line_re(PROBE_LINE, anchored=True, json=r"\{.*\}", end=r"\s*$")
EXIT_CODE_RE = line_re(EXIT_CODE_LINE, anchored=True, code=r"-?\d+", end=r"\s*$")


# ---------------------------------------------------------------------------------------
# Metrics records: JSON lines under runs/<name>/metrics/, written by process 0. One typed
# record per kind, shared by the writer and the readers: see xrun_contract.records.

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
FAILURE_RE = line_re(FAILURE_LINE, kind=r"[a-z]+", why=r".*", code=r"\d+")


def host_prefix(host: str, attempt: int) -> str:
    return f"[{host}]" if attempt == 0 else f"[{host} #{attempt}]"


# Checkpoint events, in the order a save goes through them. "waited" (training waited for
# the previous save) is no longer written by xrun's workload, which defers instead; readers
# keep it for older runs. "exit_wait": the last step's / SIGTERM save committing before exit.
CHECKPOINT_EVENTS = (
    "started", "blocked", "waited", "deferred", "committed", "exit_wait", "restored",
    "restore_failed", "write_failed",
)

__all__ = [
    "FIELD_PATTERNS",
    "FLOAT",
    "FLOAT_NAN",
    "INT",
    "NUMBER",
    "line_re",
    "STEP_LINE",
    "STEP_RE",
    "significant",
    "format_step_line",
    "fixed_or_significant",
    "PARAMS_LINE",
    "PARAMS_RE",
    "PARAMS_UNITS",
    "FLOPS_LINE",
    "format_params_line",
    "format_flops_line",
    "MEMORY_LINE",
    "MEMORY_RE",
    "HEADER_LINE",
    "HEADER_RE",
    "HEADER_KEYS",
    "HEADER_VERSIONS_KEY",
    "HEADER_FIELD_RE",
    "format_header_fields",
    "header_fields",
    "CKPT_START_LINE",
    "CKPT_START_RE",
    "CKPT_BLOCKED_LINE",
    "CKPT_BLOCKED_RE",
    "CKPT_WAIT_PREVIOUS_LINE",
    "CKPT_WAIT_PREVIOUS_RE",
    "CKPT_COMMIT_LINE",
    "CKPT_COMMIT_RE",
    "CKPT_RESTORED_LINE",
    "CKPT_RESTORED_RE",
    "CKPT_DEFERRED_LINE",
    "CKPT_DEFERRED_RE",
    "CKPT_DEFERRED_STORAGE_LINE",
    "CKPT_DEFERRED_STORAGE_RE",
    "CKPT_EXIT_WAIT_LINE",
    "CKPT_EXIT_WAIT_RE",
    "CKPT_RESTORE_FAILED_LINE",
    "CKPT_RESTORE_FAILED_RE",
    "CKPT_WRITE_FAILED_LINE",
    "CKPT_WRITE_FAILED_RE",
    "PHASES",
    "PHASE_ACTIVITY",
    "PHASE_LINE",
    "PHASE_TOOK",
    "PHASE_RE",
    "WRAPPER_START_LINE",
    "WRAPPER_END_LINE",
    "WRAPPER_START_RE",
    "WRAPPER_END_RE",
    "EXIT_CODE_LINE",
    "PROBE_LINE",
    "PROBE_RE",
    "EXIT_CODE_RE",
    "METRIC_KINDS",
    "LOG_STAMP_RE",
    "stamp_line",
    "split_stamp",
    "HOST_PREFIX_RE",
    "TENSORBOARD_SCALARS",
    "FAILURE_KINDS",
    "FAILURE_LINE",
    "FAILURE_RE",
    "host_prefix",
    "CHECKPOINT_EVENTS",
]
