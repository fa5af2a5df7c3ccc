"""One error type for every layer, carrying the exit code the CLI (and a scheduler) sees.

Exit codes of every ``xrun`` command: 0 ok; 1 the run (or a comparison) failed or
regressed; 2 bad input (one line naming the field and what is allowed; nothing submitted
or written); 3 a cluster or storage root cannot be reached; 4 (compare, report) the runs
are not comparable (different shapes); 130 interrupted; ``xrun wait`` alone: 123 stalled,
124 timed out, 125 failed. Lower layers
(manifests, backends, readers, services) raise :class:`XrunError`; only the CLI prints it.
"""

from __future__ import annotations

from collections.abc import Iterable

EXIT_OK = 0
EXIT_FAILED = 1  # the run failed, or a comparison found a significant regression
EXIT_USAGE = 2  # bad input: nothing was submitted or written
EXIT_UNREACHABLE = 3  # cluster or storage root unreachable (or refusing our credentials)
EXIT_NOT_COMPARABLE = 4  # compare/report: the two runs ran on different shapes: no verdict
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT): the run goes on

# `xrun wait` (xpk's convention for scripts): 0 succeeded, 124 timed out, 125 failed; and
# xrun's own 123: the run is still Running but stalled (no progress past its stall limit).
EXIT_WAIT_STALLED = 123
EXIT_WAIT_TIMEOUT = 124
EXIT_WAIT_FAILED = 125


# An error line never grows past this (a value quoted in it is cut by short_repr first).
MAX_MESSAGE = 2000


def did_you_mean(word: object, options: Iterable[object]) -> str:
    """' (did you mean 'command'?)' for a key close to one of ``options``; '' otherwise."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def short_repr(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to about ``limit`` characters, without building the whole repr of
    a huge or deeply shared value (reprlib bounds the walk): error lines quote values."""
    import reprlib

    r = reprlib.Repr()
    r.maxstring = r.maxother = max(limit, 10)
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = r.maxfrozenset = r.maxdeque = r.maxarray = 6
    r.maxlevel = 3
    text = r.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class XrunError(Exception):
    """A one-line, user-facing failure and the exit code it maps to (2 unless said)."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        text = " ".join(str(message).split())
        if len(text) > MAX_MESSAGE:
            text = text[:MAX_MESSAGE - 3] + "..."
        super().__init__(text)
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
