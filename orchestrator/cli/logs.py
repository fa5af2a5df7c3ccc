"""``xrun logs``: every host's log from storage, merged and prefixed, and ``-f`` to follow
a run to its end (kubectl logs' and stern's flags)."""

from __future__ import annotations

import re
import time
from typing import Any

import click
from rich.console import Console

from orchestrator.cli.common import (
    PROGRESS_INTERVAL,
    VERBOSE,
    info,
    open_storage,
    storage_option,
    warn,
    warn_corrupt,
    with_ticks,
)
from orchestrator.readers.loaders import StoredRun
from orchestrator.services import logs as logs_service
from orchestrator.services import runs
from xrun_contract import is_terminal
from xrun_contract.errors import EXIT_INTERRUPTED, EXIT_OK, XrunError


@click.command()
@click.argument("name")
@storage_option
@click.option("-f", "--follow", is_flag=True,
              help="Keep streaming new lines (and new restart attempts) under a progress line.")
@click.option("--host", "hosts", multiple=True, metavar="S-H", help="Only this host, e.g. 0-1 (repeatable).")
@click.option("--since", help="Only lines newer than a duration (30s, 10m, 1h30m, 2d) or an RFC3339 time.")
@click.option("--since-time", help="Only lines at or after this RFC3339 time (2026-01-02T15:04:05Z).")
@click.option("--tail", type=int, help="Only the last N lines in total (of the merged stream, before following); "
              "-1: all (kubectl's).")
@click.option("--tail-per-host", type=int, metavar="N",
              help="Only the last N lines of each host (stern's --tail); -1: all.")
@click.option("--grep", "pattern", metavar="REGEX", help="Only lines matching this regular expression (Python syntax).")
@click.option("--exclude", "exclude_pattern", metavar="REGEX",
              help="Drop lines matching this regular expression (stern's --exclude).")
@click.option("--attempt", type=int, metavar="N", help="Only restart attempt N's lines (0 is the first run).")
@click.option("-p", "--previous", is_flag=True, help="Only the attempt before the newest (kubectl logs --previous).")
@click.option("--timestamps", is_flag=True, help="Start each line with its RFC3339 time (when the wrapper read it).")
@click.option("--prefix/--no-prefix", default=True, show_default=True, help="Prefix lines with [slice-host].")
@click.option("--color", "colour", type=click.Choice(["auto", "always", "never"]), default="auto",
              show_default=True, help="Per-host colours (auto: on a terminal).")
@VERBOSE
@PROGRESS_INTERVAL
def logs(name: str, storage: str | None, follow: bool, hosts: tuple[str, ...],
         since: str | None, since_time: str | None, tail: int | None, tail_per_host: int | None,
         pattern: str | None, exclude_pattern: str | None, attempt: int | None, previous: bool,
         timestamps: bool, prefix: bool, colour: str, verbose: bool, progress_interval: float) -> int:
    """Print every host's log from storage, merged, each line prefixed by its host.

    On a terminal Gloo/absl chatter and wrapper lines are hidden (-v shows them); piped,
    every line is printed. With -f a progress line follows the run.

    \b
    Examples:
      xrun logs mt-07 -f
      xrun logs mt-07 --host 0-1 --tail 50
      xrun logs mt-07 --since 1h30m --grep 'loss' --timestamps
      xrun logs mt-07 --since-time 2026-01-02T15:04:05Z --tail-per-host 5
      xrun logs mt-07 --previous --exclude 'gloo|absl'
    """
    import datetime

    from orchestrator.cli.progress import LineFilter, ProgressScreen
    from orchestrator.readers.logs import parse_since, parse_time

    for h in hosts:
        if not re.fullmatch(r"\d+-\d+", h):
            raise XrunError(f"--host: {h!r} is not <slice>-<host>, e.g. 0-1")
    tail, tail_per_host = (None if v == -1 else v for v in (tail, tail_per_host))  # kubectl's: -1 is all
    for flag, value in (("--tail", tail), ("--tail-per-host", tail_per_host)):
        if value is not None and value < 0:
            raise XrunError(f"{flag}: must be >= 0, or -1 for all lines")
    if since and since_time:
        raise XrunError("--since, --since-time: give only one")
    try:
        since_ts = parse_since(since, time.time()) if since else (parse_time(since_time) if since_time else None)
        grep = re.compile(pattern) if pattern is not None else None
    except ValueError as e:
        raise XrunError(str(e)) from None
    except re.error as e:
        raise XrunError(f"--grep: {pattern!r} is not a regular expression: {e}") from None
    try:
        exclude = re.compile(exclude_pattern) if exclude_pattern is not None else None
    except re.error as e:
        raise XrunError(f"--exclude: {exclude_pattern!r} is not a regular expression: {e}") from None
    st = open_storage(storage)
    runs.run_info(st, name)
    warn_corrupt(st, name)
    logs_service.check_hosts(st, name, set(hosts) or None)
    only_attempt = logs_service.resolve_attempt(st, name, attempt, previous)
    backend = runs.backend_of(st, name)
    tty = Console().is_terminal
    use_colour = colour == "always" or (colour == "auto" and tty)
    out = Console(force_terminal=True if colour == "always" else None, no_color=colour == "never")
    screen = ProgressScreen(out, interval=progress_interval, verbose=verbose or not tty,
                            prefix=prefix, colour=use_colour, tty=tty)

    def stamp_of(t: float) -> str:
        if not timestamps:
            return ""
        return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    items = logs_service.stamped_log_lines(
        st, name, backend, follow=follow, hosts=set(hosts) or None, since=since_ts,
        tail=tail, tail_per_host=tail_per_host, grep=grep, warn=warn,
        shown=None if screen.filter.verbose else LineFilter().keep, exclude=exclude, attempt=only_attempt)
    printed = 0
    reader = StoredRun(st, name, charts=False)
    try:
        if not follow:
            for host, attempt, t, line in items:
                screen.line(host, attempt, line, stamp_of(t))
                printed += 1
            if not printed:  # silence would read as a hang or a broken command
                _no_lines(name, runs.live_view(reader, backend, warn, goodput=False),
                          bool(hosts or since_ts or grep or exclude or tail == 0 or tail_per_host == 0
                               or only_attempt is not None))
            return EXIT_OK
        with screen:
            for item in with_ticks(items, 1.0):
                if item is not None:
                    host, attempt, t, line = item
                    screen.line(host, attempt, line, stamp_of(t))
                    printed += 1
                else:
                    screen.update(runs.live_view(reader, backend, warn, goodput=False))
    except KeyboardInterrupt:
        info(f"stopped following {name}; the run itself is not stopped ('xrun delete {name}' stops it)")
        return EXIT_INTERRUPTED
    view = runs.live_view(reader, backend, warn, goodput=False)  # the follow ends when the run does: say how
    msg = f" ({view['message']})" if view.get("message") else ""
    info(f"run {name} ended: {view['state']}{msg}" + ("" if printed else "; it wrote no log lines"))
    return EXIT_OK


def _no_lines(name: str, view: dict[str, Any], filtered: bool) -> None:
    """Why ``xrun logs`` printed nothing: no line matched, or the run has none (yet)."""
    state = view.get("state") or "Unknown"
    if filtered:
        info(f"run {name} ({state}): no log lines match the filters")
    elif is_terminal(state):
        info(f"run {name} ({state}) wrote no log lines")
    else:
        info(f"run {name} ({state}) has no log lines yet ('xrun logs -f {name}' waits for them)")
