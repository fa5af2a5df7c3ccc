"""Run the real `xrun` CLI as a subprocess, the way a user or a scheduler does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED_CACHE = "XRUN_LOCAL_COMPILATION_CACHE"


def xrun_env(storage: str | Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    # The session's shared JAX compilation cache for local runs (conftest.py), kept.
    if SHARED_CACHE in os.environ:
        env[SHARED_CACHE] = os.environ[SHARED_CACHE]
    env["XRUN_STORAGE"] = str(storage)
    env["PYTHONPATH"] = str(REPO)
    env["XDG_STATE_HOME"] = str(Path(str(storage)).parent / "state") if not str(storage).startswith("gs://") else "/tmp/xrun-test-state"
    # The test cluster's default namespace has two LocalQueues, where a cluster submit that
    # names no queue is refused: tests that want one name it (or pass XRUN_QUEUE="").
    env["XRUN_QUEUE"] = "none"
    env.update(extra)
    return env


def xrun(*args: str, storage: str | Path, timeout: float = 300, cwd: str | Path | None = None,
         **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
        timeout=timeout, env=xrun_env(storage, **extra), cwd=cwd,
    )


def xrun_popen(*args: str, storage: str | Path, **extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", *args], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=xrun_env(storage, **extra),
    )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class InProcess:
    """What :func:`xrun_here` saw: the exit code and both streams, as a subprocess's."""

    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def xrun_here(*args: str, storage: str | Path | None = None, **extra: str) -> InProcess:
    """The CLI's ``main`` in this process (fast: no interpreter start, and monkeypatched
    services stay patched), with the environment :func:`xrun_env` gives a subprocess."""
    from click.testing import CliRunner

    from orchestrator.cli import main

    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("XRUN_")}
    if SHARED_CACHE in os.environ:
        env[SHARED_CACHE] = os.environ[SHARED_CACHE]
    if storage is not None:
        env["XRUN_STORAGE"] = str(storage)
    env["XRUN_QUEUE"] = "none"
    env.update(extra)
    with CliRunner().isolation(env=env) as streams:
        code = main(list(args))
        out, err = streams[0].getvalue(), streams[1].getvalue()
    return InProcess(code, out.decode(errors="replace"), err.decode(errors="replace"))
