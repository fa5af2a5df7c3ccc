"""fake-gcs-server (github.com/fsouza/fake-gcs-server) on 127.0.0.1: the GCS emulator the
storage tests run against.

It speaks GCS's JSON API (simple, multipart and resumable uploads; listing with prefix,
delimiter and pages; ``ifGenerationMatch``/``ifGenerationNotMatch`` preconditions) and its
XML API, and sends ``x-goog-generation`` with every object, as GCS does, so the
google-cloud-storage client, gcsfs and TensorStore all use it unchanged. The binary comes
from its Go module, built with the control plane by ``tests/cluster/build.sh`` (a warm cache
answers at once). Faults no emulator makes (5xx, dropped connections, slow links) come from
the proxy in front of it, tests/gcs_proxy.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "tests/cluster/build.sh"


class FakeGCSUnavailable(RuntimeError):
    """The binary could not be built (Go missing, ...); the message is one line saying why."""


def binary() -> Path:
    """The fake-gcs-server binary, built by tests/cluster/build.sh if the cache lacks it."""
    proc = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    lines = proc.stderr.strip().splitlines()
    if proc.returncode:
        raise FakeGCSUnavailable(lines[-1] if lines else f"{BUILD} exited {proc.returncode}")
    path = Path(proc.stdout.strip().splitlines()[-1]) / "fake-gcs-server"
    if not os.access(path, os.X_OK):
        raise FakeGCSUnavailable(f"{BUILD} printed no fake-gcs-server binary ({path})")
    return path


def _pdeathsig() -> None:
    """Run in the child before exec: die with the test session, even if it is SIGKILLed
    (as tests/cluster/controlplane.py does for the control plane)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _answers(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/storage/v1/b?project=xrun-local")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@contextlib.contextmanager
def fake_gcs_server(exe: Path | None = None, port: int | None = None,
                    timeout: float = 30.0) -> Iterator[str]:
    """Run fake-gcs-server (``exe``, default: built by ``binary()``) in memory on 127.0.0.1
    and yield its base URL; it is stopped by PID when the block ends (also on errors) and
    dies with this process if that is killed."""
    from orchestrator.backends.local import free_port

    exe = exe or binary()
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="xrun-fake-gcs-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(
        [str(exe), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
         "-backend", "memory", "-public-host", f"127.0.0.1:{port}", "-external-url", url,
         "-log-level", "warn"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_pdeathsig)
    log.close()
    try:
        deadline = time.monotonic() + timeout
        while not _answers(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = Path(log.name).read_text(errors="replace")[-2000:]
                why = f"exited {proc.returncode}" if proc.poll() is not None else f"no answer in {timeout:g}s"
                raise RuntimeError(f"fake-gcs-server on port {port} {why}:\n{tail}")
            time.sleep(0.02)
        yield url
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        Path(log.name).unlink(missing_ok=True)
