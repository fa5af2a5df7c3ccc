"""Run the real `xrun` CLI: in this process by default (``orchestrator.cli.main``, the
entry point's own function, with the environment, working folder and output streams a
subprocess would get), or as a subprocess where the process itself is under test
(``process=True``: signals, a supervisor's lifetime, the console script).

A subprocess costs a second or two of imports on a loaded 2-core machine; the suite made
~230 of them where only the command's output and exit code were checked.
"""

from __future__ import annotations

import contextlib
import io
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
    env["XDG_STATE_HOME"] = (str(Path(str(storage)).parent / "state") if not str(storage).startswith("gs://")
                             else "/tmp/xrun-test-state")
    # The test cluster's default namespace has two LocalQueues, where a cluster submit that
    # names no queue is refused: tests that want one name it (or pass XRUN_QUEUE="").
    env["XRUN_QUEUE"] = "none"
    env.update(extra)
    return env


def xrun(*args: str, storage: str | Path, timeout: float = 300, cwd: str | Path | None = None,
         process: bool = False, **extra: str) -> subprocess.CompletedProcess:
    """``xrun ARGS`` with ``XRUN_STORAGE=storage``; ``process=True`` for a real process."""
    env = xrun_env(storage, **extra)
    if process or os.environ.get("XRUN_TEST_CLI_PROCESS") == "1":
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
            timeout=timeout, env=env, cwd=cwd,
        )
    return run_in_process(list(args), env=env, cwd=cwd)


class _Stream(io.TextIOWrapper):
    """A text stream with a binary ``buffer``, as a pipe's: some writers use ``.buffer``."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", errors="replace", write_through=True)

    def text(self) -> str:
        self.flush()
        return self.buffer.getvalue().decode("utf-8", "replace")  # type: ignore[attr-defined]


def run_in_process(argv: list[str], env: dict[str, str], cwd: str | Path | None = None
                   ) -> subprocess.CompletedProcess:
    """``orchestrator.cli.main(argv)`` with ``env`` as the whole environment and ``cwd`` as the
    working folder for its duration, stdout and stderr captured as pipes (not a TTY), stdin
    empty; everything restored after, also when it raises."""
    from orchestrator.cli import main

    out, err = _Stream(), _Stream()
    saved_env, saved_cwd, saved_stdin = dict(os.environ), os.getcwd(), sys.stdin
    os.environ.clear()
    os.environ.update(env)
    try:
        if cwd is not None:
            os.chdir(cwd)
        sys.stdin = io.StringIO("")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.stdin = saved_stdin
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["xrun", *argv], rc, out.text(), err.text())


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
