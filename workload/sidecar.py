"""xrun's own containers in every pod: the launcher installer and the log shipper.

They run ``xrun_image`` when one is set, else a public python image with this code fetched
from the run's storage (``manifests.podcode``): so this module, and all it imports, uses the
standard library only (gs:// through ``xrun_contract.gcs_http`` there).

Every pod of a run has three containers (``manifests.jobset.pod_spec``):

* ``xrun-init`` (init container, xrun's image): ``python3 -m workload.sidecar install DIR``
  copies the POSIX-sh launcher (``workload/launcher.sh``) into the pod's shared emptyDir.
* ``xrun-logs`` (native sidecar: an init container with ``restartPolicy: Always``, xrun's
  image): ``python3 -m workload.sidecar ship`` ships ``DIR/output.log`` to storage as
  numbered chunks (``Layout.log_chunk``), every ``XRUN_LOG_FLUSH_SECONDS``.
* ``workload`` (the user's image, anything with /bin/sh): the launcher runs the user's command
  with its output appended to ``DIR/output.log`` and exits with its exit code.

Why the shipper loses no line: the output file in the emptyDir is the buffer, not this
process's memory. Only whole lines are shipped while the workload runs; a chunk is written
first and then ``DIR/shipped.json`` records (offset, next chunk number), so a shipper that
crashed and was restarted by the kubelet rewrites the same chunk from the same offset
instead of skipping or repeating lines, and a storage outage only delays shipping. The
kubelet sends this container SIGTERM only after the workload container has ended (KEP-753:
kubernetes ``pkg/kubelet/kuberuntime/kuberuntime_termination_order.go`` waitForTurn makes
sidecars wait for the main containers; ``kuberuntime_container.go`` killContainer then
gives them at least ``minimumGracePeriodInSeconds`` = 2 s even when the main container used
the whole grace period and was SIGKILLed), so on SIGTERM the file is complete and the
shipper drains it to the end, partial last line included, then exits 0. SIGTERM is blocked
from this module's first statement (``manifests.podcode``'s bootstrap: its first) and taken
by a thread of the shipper's; the launcher's end waits for ``DIR/shipper.ready``, written
once it is (``say_ready``), so a short workload cannot kill a shipper still starting.

Imports neither jax nor kubernetes: it must start in a fraction of a second.
"""

from __future__ import annotations

import signal
import sys

if __name__ == "__main__" and sys.argv[1:] == ["ship"]:
    # Before any other import (seconds on a loaded machine): a SIGTERM from now on waits,
    # pending, for stop_on_signals' thread instead of killing a shipper that shipped nothing.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})

import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import BinaryIO  # noqa: E402

from xrun_contract import (  # noqa: E402
    Env,
    Layout,
    PodFiles,
    host_id,
    restart_attempt,
    stamp_line,
    writer_id,
)
from xrun_contract.gcs_rest import Backoff  # noqa: E402
from xrun_contract.storage import classify_storage_error  # noqa: E402

MAX_CHUNK_BYTES = 8 << 20  # read at once at most (after an outage the backlog is split)
# How often the file is read for new lines, which are stamped as read: each line's stamp is
# within this of when it was written (kubelet's CRI stamps each line as the runtime reads the
# pipe), so lines written apart carry their own times, not a shared one per read (at 0.2 s,
# a fast loop's 7 lines shared each stamp). A read finding nothing costs one read(2).
READ_SECONDS = 0.02
LAUNCHER_SOURCE = Path(__file__).with_name("launcher.sh")


def install(pod_dir: Path) -> Path:
    """Copy the launcher into the shared folder (the init container's whole job)."""
    target = pod_dir / PodFiles.LAUNCHER
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(LAUNCHER_SOURCE, target)
    target.chmod(0o755)
    return target


class Shipper:
    """Ships ``output.log`` from its last recorded offset, one chunk object per call.

    Lines are stored stamped with the time this shipper read them
    (``xrun_contract.stamp_line``; it reads every READ_SECONDS, so a stamp is at most that
    late), which ``xrun logs --since`` and the readers use.
    """

    def __init__(self, pod_dir: Path, write: Callable[[int, bytes], None]):
        self.out = pod_dir / PodFiles.OUTPUT
        self.state_path = pod_dir / PodFiles.SHIPPED
        self.write = write
        state = {"offset": 0, "seq": 0}
        if self.state_path.exists():
            state.update(json.loads(self.state_path.read_text()))
        self.offset, self.seq = int(state["offset"]), int(state["seq"])
        self.read_to = self.offset  # bytes read and stamped into ``pending``
        self.pending: list[str] = []
        self._file: BinaryIO | None = None  # kept open: a read every READ_SECONDS

    def read(self, final: bool = False) -> int:
        """Stamp what is new in the file (while running, whole lines only)."""
        try:
            if self._file is None:
                self._file = open(self.out, "rb")  # noqa: SIM115 - open for the shipper's life
            self._file.seek(self.read_to)
            data = self._file.read(MAX_CHUNK_BYTES)
        except FileNotFoundError:
            return 0
        if not final:
            data = data[: data.rfind(b"\n") + 1]
        if not data:
            return 0
        now = time.time()
        text = data.decode("utf-8", errors="replace")
        self.pending += [stamp_line(now, ln if ln.endswith("\n") else ln + "\n")
                         for ln in text.splitlines(keepends=True)]
        self.read_to += len(data)
        return len(data)

    def ship_once(self, final: bool) -> int:
        """Ship what is read and not yet shipped. Returns the file bytes it covered."""
        self.read(final)
        if not self.pending:
            return 0
        self.write(self.seq, "".join(self.pending).encode())  # may raise: retried as is
        covered = self.read_to - self.offset
        self.pending, self.offset, self.seq = [], self.read_to, self.seq + 1
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"offset": self.offset, "seq": self.seq}))
        os.replace(tmp, self.state_path)
        return covered

    def drain(self) -> None:
        """Everything to the end of the file (after the workload container ended)."""
        while self.ship_once(final=True):
            pass


def run(pod_dir: Path, write: Callable[[int, bytes], None], interval: float,
        stop: threading.Event, drain_s: float = 30.0) -> bool:
    """Read every READ_SECONDS and ship every ``interval`` seconds until ``stop``; then drain.
    The drain retries transient errors (5xx, 429, resets, timeouts) until ``drain_s`` (below
    the pod's grace period) and gives up at once on a permanent one (a full disk, a path
    through a file, no permission, no such bucket: ``classify_storage_error``), with one line.
    Returns whether everything was shipped."""
    shipper = Shipper(pod_dir, write)
    due = time.monotonic() + interval
    said = ""
    while not stop.wait(min(READ_SECONDS, interval)):
        shipper.read()
        if time.monotonic() < due:
            continue
        due = time.monotonic() + interval
        try:
            while shipper.ship_once(final=False):
                pass
        except Exception as e:  # noqa: BLE001 - a storage hiccup: the file keeps the lines
            line = f"xrun-logs: shipping failed ({_kind(e)}), retrying: {e}"
            if line != said:  # once per distinct error, not every interval
                print(line, file=sys.stderr, flush=True)
                said = line
    backoff = Backoff(0.25, 4.0, seconds=drain_s)
    while True:
        try:
            shipper.drain()
            return True
        except Exception as e:  # noqa: BLE001
            if classify_storage_error(e).permanent:
                print(f"xrun-logs: final shipping failed, not retried (permanent: {e})",
                      file=sys.stderr, flush=True)
                return False
            if not backoff.can_retry():
                print(f"xrun-logs: final shipping failed for {drain_s:.0f}s, giving up: {e}",
                      file=sys.stderr, flush=True)
                return False
            print(f"xrun-logs: final shipping failed (transient), retrying: {e}", file=sys.stderr, flush=True)
            backoff.sleep()


def _kind(e: BaseException) -> str:
    return "permanent" if classify_storage_error(e).permanent else "transient"


def storage_writer() -> Callable[[int, bytes], None] | None:
    """Chunk writes to this host's log under the storage root, or None when not configured."""
    root, name = os.environ.get(Env.STORAGE), os.environ.get(Env.RUN_NAME)
    if not root or not name:
        return None
    from xrun_contract.storage import open_storage

    # One call never outlasts the final drain's deadline (a failed call is retried anyway).
    drain_s = float(os.environ.get(Env.DRAIN_SECONDS) or 30)
    storage = open_storage(root, timeout=max(1.0, min(drain_s, 30.0)) if root.startswith("gs://") else None)
    host = host_id(int(os.environ.get(Env.SLICE_INDEX) or 0), int(os.environ.get(Env.HOST_INDEX) or 0))
    attempt = restart_attempt()

    tag = writer_id()  # a second shipper of this host and attempt never overwrites our chunks

    def write(seq: int, data: bytes) -> None:
        storage.write_bytes(Layout.log_chunk(name, host, attempt, seq, tag), data)

    return write


STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set ``stop`` from a thread of their own (blocked here, taken with
    ``sigwait``), never from a Python signal handler. A handler runs in the main thread between
    two bytecodes, which may be inside ``stop.wait``'s ``with self._cond`` while the
    Condition's non-reentrant lock is held: ``stop.set()`` then waits on that lock for ever
    (CPython gh-126434 describes the same for ``multiprocessing.Event``). What CI met fits
    it: a run whose stored log lacked the wrapper's last lines (``end``, ``EXIT_CODE``: the
    final drain's), about a grace period (120 s, then SIGKILL) slower than usual. Call
    before starting any other thread: threads inherit the signal mask, and a thread
    without it would take the signal (default: exit)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

    def wait() -> None:
        signal.sigwait(STOP_SIGNALS)
        stop.set()

    threading.Thread(target=wait, name="xrun-logs-signals", daemon=True).start()


def say_ready(pod_dir: Path) -> None:
    """Tell the launcher this shipper now takes SIGTERM (``PodFiles.SHIPPER_READY``).

    The kubelet starts the workload container once this container's process runs, not once
    it can take a signal (a native sidecar without a startupProbe is started "almost in
    parallel" with the main container: kubernetes.io/blog/2025/06/03/start-sidecar-first),
    and sends it SIGTERM as soon as the workload ended. A startupProbe would hold every
    workload's start for a probe period (whole seconds) and, while the pod code is fetched
    in an outage, for the outage; waiting at the workload's end costs nothing once the
    shipper is up, which it nearly always is by then. A workload shorter than this
    interpreter's start (an ``echo``: the launcher's ~1 s against 2-4 s of python start
    measured at a load of 23 on 2 cores) killed the shipper by SIGTERM's default action
    before it had shipped a line, and the host's whole log was lost. The launcher waits
    for this file before its container ends (``workload/launcher.sh``). A shipper the
    kubelet restarted finds its predecessor's file: only its interpreter's start, before the
    block at this module's top, is then uncovered."""
    try:
        (pod_dir / PodFiles.SHIPPER_READY).write_text(f"{os.getpid()}\n")
    except OSError as e:  # the folder is the pod's emptyDir: only a broken pod lacks it
        print(f"xrun-logs: cannot write {pod_dir / PodFiles.SHIPPER_READY}: {e}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "install":
        install(Path(argv[1]))
        from workload.code import CodeError, fetch  # workdir (issue #30)

        try:
            fetch(Path(argv[1]))
        except CodeError as e:
            print(f"xrun-init: workdir: {e}", file=sys.stderr, flush=True)
            return 1
        return 0
    if argv == ["probe"]:  # doctor's probe pod without xrun_image (manifests.podcode)
        from workload.probe import main as probe

        return probe()
    if argv != ["ship"]:
        print("usage: python -m workload.sidecar install DIR | ship | probe", file=sys.stderr)
        return 2
    stop = threading.Event()
    stop_on_signals(stop)
    pod_dir = Path(os.environ.get(Env.POD_DIR) or PodFiles.MOUNT_PATH)
    say_ready(pod_dir)
    write = storage_writer()
    if write is None:
        print("xrun-logs: no XRUN_STORAGE/XRUN_RUN_NAME; nothing to ship", file=sys.stderr, flush=True)
        stop.wait()
        return 0
    run(pod_dir, write, float(os.environ.get(Env.LOG_FLUSH_SECONDS) or 2), stop,
        float(os.environ.get(Env.DRAIN_SECONDS) or 30))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
