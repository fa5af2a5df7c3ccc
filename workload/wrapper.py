"""The pod wrapper: runs the user's command, ships its output to storage, keeps its exit code.

Every pod's container command is ``python3 -u -m workload.wrapper -- /bin/sh -c CMD``. The
wrapper prints a start line, runs the child in its own process group (forwarding SIGTERM
and SIGINT to the whole group, so a shell pipeline's python gets it too), tees the merged
stdout/stderr to its own stdout and to append-only log chunks under the storage root, then
prints an end line and ``EXIT_CODE=<n>`` and exits with the child's code (128+N for a
signal). It imports neither jax nor kubernetes: it must start in milliseconds.

One exit code is corrected: a child that exits 1 right after JAX's "Terminating process
because the JAX distributed service detected fatal errors" (absl ``LOG(QFATAL)`` in
``xla/pjrt/distributed/client.h``, which exits 1 from native code when a peer or the
coordinator died) exits with ``XRUN_RESTARTABLE_EXIT_CODE`` instead: an infrastructure
failure, not the user's bug (``workload.failures.classify_output``).

Shipping logs never changes the exit code: the pod's code is what JobSet's podFailurePolicy
reads, so a storage outage turning a restartable 42 into 1 would make a preemption a
permanent FailJobSet. The final flush is bounded (``CLOSE_DEADLINE_S``, well inside the
pod's termination grace period) and a failure is one line on stderr.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

from xrun_contract import (
    CHUNK_SEQ_RE,
    COMMAND_NOT_FOUND_EXIT_CODE,
    EXIT_CODE_LINE,
    FAILURE_LINE,
    RESTARTABLE_EXIT_CODE,
    SHELL_NOT_FOUND_CODES,
    WRAPPER_END_LINE,
    WRAPPER_START_LINE,
    Env,
    Layout,
    host_id,
    stamp_line,
    writer_id,
)

PR_SET_PDEATHSIG = 1
# The local supervisor starts each wrapper with this as its parent-death signal: when the
# supervisor dies (even by SIGKILL) the wrapper kills its child's whole process group, so a
# pipeline's grandchildren die too, ships the rest of the log and exits.
PARENT_DEATH_SIGNAL = signal.SIGHUP
SHELLS = ("/bin/sh", "sh", "/bin/bash", "bash")
# At most this long for the last log chunk after the child ended (the kubelet's default
# grace period is 30 s; xrun's pods get termination_grace_seconds, 120 by default).
CLOSE_DEADLINE_S = 15.0


def _die_with_parent() -> None:
    """Linux: the child gets SIGKILL if the wrapper dies, so no orphan ever outlives a pod."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _log_writer():
    """A ChunkWriter for this host's log under the storage root, or None when not configured."""
    root, run = os.environ.get(Env.STORAGE), os.environ.get(Env.RUN_NAME)
    if not root or not run:
        return None
    from xrun_contract.storage import ChunkWriter, open_storage

    host = host_id(int(os.environ.get(Env.SLICE_INDEX, "0")), int(os.environ.get(Env.HOST_INDEX, "0")))
    attempt = int(os.environ.get(Env.RESTART_ATTEMPT, "0") or 0)
    interval = float(os.environ.get(Env.LOG_FLUSH_SECONDS, "2"))
    storage = open_storage(root)
    # Continue after any chunk an earlier incarnation of this host and attempt wrote (a
    # replacement pod), and tag ours: no chunk name is ever written twice.
    objects, _ = storage.list(Layout.host_logs(run, host, attempt))
    seqs = [int(m[1]) for o in objects if (m := CHUNK_SEQ_RE.search(o.key))]
    tag = writer_id()
    return ChunkWriter(storage, lambda seq: Layout.log_chunk(run, host, attempt, seq, tag),
                       interval, start_seq=max(seqs) + 1 if seqs else 0)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("usage: python -m workload.wrapper -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    host = host_id(int(os.environ.get(Env.SLICE_INDEX, "0")), int(os.environ.get(Env.HOST_INDEX, "0")))
    attempt = os.environ.get(Env.RESTART_ATTEMPT, "0")
    out = sys.stdout.buffer
    try:
        writer = _log_writer()
    except Exception as e:  # noqa: BLE001 - a storage problem must not hide the job's output
        print(f"xrun-wrapper: log shipping disabled: {e}", file=sys.stderr, flush=True)
        writer = None

    as_json = os.environ.get(Env.LOG_FORMAT, "").strip().lower() == "json"

    def emit(line: str, severity: str = "INFO") -> None:
        shown = json.dumps({"severity": severity, "message": line, "host": host,
                            "attempt": int(attempt or 0)}) if as_json else line
        out.write((shown + "\n").encode())
        out.flush()
        if writer:
            writer.write(stamp_line(time.time(), line + "\n"))

    emit(WRAPPER_START_LINE.format(host=host, attempt=attempt, argv=json.dumps(argv)))
    start = time.monotonic()
    try:
        child = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=_die_with_parent,
        )
    except OSError as e:
        emit(f"xrun-wrapper: cannot start {argv[0]}: {e.strerror}", "ERROR")
        code = COMMAND_NOT_FOUND_EXIT_CODE
    else:
        def forward(signum, _frame):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signum)

        def parent_gone(_signum, _frame):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        signal.signal(PARENT_DEATH_SIGNAL, parent_gone)
        assert child.stdout is not None
        tail: collections.deque[bytes] = collections.deque(maxlen=50)
        for raw in iter(child.stdout.readline, b""):
            tail.append(raw)
            out.write(raw)
            out.flush()
            if writer:
                writer.write(stamp_line(time.time(), raw.decode("utf-8", errors="replace")))
        rc = child.wait()
        code = rc if rc >= 0 else 128 - rc
        if code in SHELL_NOT_FOUND_CODES and argv[0] in SHELLS:
            # The shell could not find or execute the program: a typo, not preemption; 127
            # is in the default restartable set, so say it with a code outside it.
            emit(f"xrun-wrapper: the command's program was not found or is not executable "
                 f"(shell exit {code}); exiting {COMMAND_NOT_FOUND_EXIT_CODE} (not restartable)", "ERROR")
            code = COMMAND_NOT_FOUND_EXIT_CODE
        if code == 1:
            from workload.failures import classify_output

            verdict = classify_output(b"".join(tail).decode("utf-8", errors="replace"))
            if verdict:
                code = int(os.environ.get(Env.RESTARTABLE_EXIT_CODE) or RESTARTABLE_EXIT_CODE)
                emit(FAILURE_LINE.format(kind=verdict.kind, why=verdict.why, code=code), "ERROR")
    severity = "INFO" if code == 0 else "ERROR"
    emit(WRAPPER_END_LINE.format(host=host, code=code, seconds=time.monotonic() - start), severity)
    emit(EXIT_CODE_LINE.format(code=code), severity)
    if writer:
        _close_bounded(writer, CLOSE_DEADLINE_S)
    return code


def _close_bounded(writer, deadline_s: float) -> None:
    """Flush the last chunk within ``deadline_s``; failing or late, say so on stderr (the
    lines are in the container log either way) and keep the child's exit code."""
    import threading

    failure: list[BaseException] = []

    def close() -> None:
        try:
            writer.close()
        except BaseException as e:  # noqa: BLE001 - reported below, never raised
            failure.append(e)

    thread = threading.Thread(target=close, daemon=True, name="xrun-log-close")
    thread.start()
    thread.join(deadline_s)
    if thread.is_alive():
        why = f"still writing after {deadline_s:g} s"
    elif failure:
        why = f"{type(failure[0]).__name__}: {' '.join(str(failure[0]).split())[:200]}"
    else:
        return
    print(f"xrun-wrapper: log shipping to storage failed ({why}); the full log is in the "
          "container's stdout", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
