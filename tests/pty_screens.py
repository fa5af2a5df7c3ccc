"""Screens as a terminal of a given size shows them: the CLI under a pseudo-terminal whose
window is COLUMNS x 50 (TIOCSWINSZ), its output with the colour and cursor codes removed."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

from cli_helpers import xrun_env

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def screen(*args: str, columns: int, storage, timeout: float = 60, cwd=None,
           raw: list[str] | None = None, program: list[str] | None = None) -> tuple[int, list[str]]:
    """(exit code, lines) of ``xrun ARGS`` on a terminal ``columns`` wide; ``raw`` gets the
    output as the terminal got it (a live screen's redraws: erase-line codes between them);
    ``program``: what runs in place of ``python -m orchestrator.cli`` (a script that stubs
    something first), given ARGS."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = xrun_env(storage)
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    env["TERM"] = "xterm-256color"
    p = subprocess.Popen([*(program or [sys.executable, "-m", "orchestrator.cli"]), *args], stdin=slave, stdout=slave,
                         stderr=slave, env=env, close_fds=True, cwd=cwd)
    os.close(slave)
    out = b""
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if p.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        rc = p.wait(timeout=max(1.0, deadline - time.time()))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
    if raw is not None:
        raw.append(out.decode(errors="replace"))
    text = ANSI.sub("", out.decode(errors="replace"))
    return rc, [ln.rstrip() for ln in text.split("\n")]


def drawn(raw: str) -> list[str]:
    """Each thing a live screen drew, in order: the raw output cut at newlines, carriage
    returns and erase-line codes, colour and cursor codes removed."""
    return [ANSI.sub("", piece).rstrip() for piece in re.split(r"\n|\r|\x1b\[2K", raw)]
