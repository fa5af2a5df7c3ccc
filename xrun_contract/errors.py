"""One error type for every layer, carrying the exit code the CLI (and a scheduler) sees.

Exit codes of every ``xrun`` command: 0 ok; 1 the run (or a comparison) failed or
regressed; 2 bad input (one line naming the field and what is allowed; nothing submitted
or written); 3 a cluster or storage root cannot be reached; 130 interrupted. Lower layers
(manifests, backends, readers, services) raise :class:`XrunError`; only the CLI prints it.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # the run failed, or a comparison found a significant regression
EXIT_USAGE = 2  # bad input: nothing was submitted or written
EXIT_UNREACHABLE = 3  # cluster or storage root unreachable (or refusing our credentials)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT): the run goes on

# `xrun wait` (xpk's convention for scripts): 0 succeeded, 124 timed out, 125 failed.
EXIT_WAIT_TIMEOUT = 124
EXIT_WAIT_FAILED = 125


class XrunError(Exception):
    """A one-line, user-facing failure and the exit code it maps to (2 unless said)."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(" ".join(str(message).split()))
        self.exit_code = exit_code

    @property
    def message(self) -> str:
        return str(self)


def exit_code_for_signal(signum: int) -> int:
    """What a process killed by ``signum`` exits with, as shells and Kubernetes report it."""
    return 128 + int(signum)


def exit_code_of_returncode(returncode: int) -> int:
    """``subprocess`` gives -N for death by signal N; Kubernetes reports 128 + N."""
    return returncode if returncode >= 0 else exit_code_for_signal(-returncode)
