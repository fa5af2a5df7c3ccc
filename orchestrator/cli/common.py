"""What every command shares: output formats, kubectl-style tables, common options."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.table import Table

from orchestrator import settings
from orchestrator.services.runcore import dump_yaml
from xrun_contract.errors import XrunError
from xrun_contract.storage import Storage

F = TypeVar("F", bound=Callable[..., Any])


# Keys whose epoch-seconds values are written as RFC3339 times in JSON and YAML output.
TIME_KEYS = frozenset({"submitted_at", "written_at", "time", "start_time", "end_time", "updated",
                       "created", "started_at", "ended_at", "committed_at", "phase_since"})


def rfc3339(t: float) -> str:
    """Epoch seconds -> '2026-12-03T10:39:13.123Z' (UTC, milliseconds), kubectl's style."""
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def with_times(obj: Any) -> Any:
    """``obj`` with every epoch value under a TIME_KEYS key as an RFC3339 string."""
    if isinstance(obj, dict):
        return {k: (rfc3339(v) if k in TIME_KEYS and isinstance(v, int | float)
                    and not isinstance(v, bool) and v > 0 else with_times(v)) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [with_times(x) for x in obj]
    return obj


def dump(obj: Any, fmt: str) -> str:
    obj = with_times(obj)
    if fmt == "json":
        return json.dumps(obj, indent=2, default=str) + "\n"
    return dump_yaml(obj)


def plain_table(*columns: str) -> Table:
    """kubectl-style table: no borders, bold headers."""
    table = Table(box=None, header_style="bold", show_edge=False)
    for col in columns:
        table.add_column(col)
    return table


def print_table(table: Any) -> None:
    """Print a table whole: on a terminal at its width, piped never cut (kubectl's way)."""
    from rich.console import Console

    console = Console(soft_wrap=True)
    if not console.is_terminal:
        console = Console(soft_wrap=True, width=4000)
    console.print(table)


def warn(message: str) -> None:
    click.echo(f"xrun: warning: {message}", err=True)


def info(message: str) -> None:
    click.echo(f"xrun: {message}", err=True)


def _set_timeout(_ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    settings.set_storage_timeout(value)


def storage_timeout_option(fn: F) -> F:
    """``--storage-timeout``: the deadline of each storage call, retries included (exit 3 past it)."""
    return click.option("--storage-timeout", metavar="SECONDS", expose_value=False,
                        callback=_set_timeout, is_eager=True,
                        help="Give up on unreachable storage after this long (exit 3). "
                        "Default: $XRUN_STORAGE_TIMEOUT or 30.")(fn)


def storage_option(fn: F) -> F:
    fn = storage_timeout_option(fn)
    return click.option("--storage", help="Storage root (folder or gs://bucket/prefix). "
                        "Default: $XRUN_STORAGE or ~/.local/share/xrun.")(fn)


def open_storage(root: str | None) -> Storage:
    return settings.open_root(root)


OUTPUT = click.option("-o", "--output", "fmt", type=click.Choice(["table", "json", "yaml"]),
                      default="table", show_default=True)


def with_ticks(items: Any, every: float) -> Any:
    """The items of a blocking iterator, with ``None`` at least every ``every`` seconds
    (the progress line is refreshed through the silence of compilation)."""
    import queue
    import threading

    q: queue.Queue[Any] = queue.Queue(maxsize=10_000)
    end = object()

    def pump() -> None:
        try:
            for x in items:
                q.put(x)
        except BaseException as e:  # noqa: BLE001 - re-raised in the reading thread
            q.put(e)
        q.put(end)

    threading.Thread(target=pump, daemon=True, name="xrun-logs").start()
    yield None
    last = time.monotonic()
    while True:
        try:
            x = q.get(timeout=every)
        except queue.Empty:
            last = time.monotonic()
            yield None
            continue
        if x is end:
            return
        if isinstance(x, BaseException):
            raise x
        yield x
        if time.monotonic() - last >= every:
            last = time.monotonic()
            yield None


def wait_timeout(text: str | None) -> float | None:
    """``--timeout``: plain seconds (3600, 2.5) or a duration as --since takes it (1h30m)."""
    from orchestrator.readers.logs import parse_duration

    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parse_duration(text, "--timeout")
        except ValueError:
            raise XrunError(f"--timeout: {text!r} is not a duration; use seconds (3600) or 90s, 30m, 1h30m") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise XrunError(f"--timeout: {text!r} must be a finite duration >= 0")
    return seconds


VERBOSE = click.option("-v", "--verbose", is_flag=True,
                       help="Show every line: Gloo/absl chatter, wrapper lines, every header.")
PROGRESS_INTERVAL = click.option(
    "--progress-interval", type=click.FloatRange(0.5, 3600), default=10.0, show_default=True,
    help="Seconds between plain progress lines when not on a terminal.")


def warn_corrupt(storage: Any, name: str) -> None:
    """One warning line per corrupt stored record of the run (status, logs, checkpoints and
    list all say it, and all show the state as Unknown)."""
    from orchestrator.readers.loaders import corrupt_line, record_problems

    for problem in record_problems(storage, name):
        warn(corrupt_line(name, problem))
