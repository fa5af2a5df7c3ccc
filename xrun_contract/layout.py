"""Where everything of a run lives under the storage root, the names that key it, and
the states its state.json names. Standard library only."""

from __future__ import annotations

import re

from xrun_contract.errors import XrunError

# Run names: a DNS-1035 label (the JobSet name), so never a path. Everything of a run lives
# under ``runs/<name>/``; a name is checked wherever one is read (status, logs, checkpoints,
# delete, compare) before any key is built from it.
RUN_NAME_RE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
RUN_NAME_MAX = 63


def check_run_name(name: str, what: str = "name") -> str:
    """``name`` if it is a DNS-1035 label of at most 63 characters; else bad input (exit 2)."""
    if not isinstance(name, str) or len(name) > RUN_NAME_MAX or not RUN_NAME_RE.fullmatch(name):
        shown = name if isinstance(name, str) and len(name) <= 80 else f"{str(name)[:80]}..."
        raise XrunError(f"{what}: {shown!r} is not a run name (a DNS-1035 label: lowercase "
                        f"letters, digits and '-', starting with a letter, at most {RUN_NAME_MAX})")
    return name



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
    def resume_lock(name: str) -> str:
        """Held (an exclusive create) while one ``submit --resume`` of the run starts it."""
        return f"runs/{name}/resume.lock"

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

__all__ = [
    "RUN_NAME_RE",
    "RUN_NAME_MAX",
    "check_run_name",
    "Layout",
    "ATTEMPT_RE",
    "CHUNK_SEQ_RE",
    "METRICS_CHUNK_RE",
    "METRICS_ROLLUP_EVERY",
    "writer_id",
    "PENDING",
    "RUNNING",
    "RESTARTING",
    "SUCCEEDED",
    "FAILED",
    "DELETED",
    "UNKNOWN",
    "TERMINAL_STATES",
    "RUN_STATES",
    "is_terminal",
]
