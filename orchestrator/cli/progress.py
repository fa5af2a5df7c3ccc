"""The terminal while a run is followed: host lines above one pinned progress line.

``submit --follow`` and ``logs -f`` print every host's line; on a terminal a rich ``Live``
keeps one progress line pinned under them (phase, step N/M with a bar, loss, tokens/s over
all devices, ETA, last checkpoint). Without a terminal the same facts are one plain line
every ``interval`` seconds (and at each phase change), so a CI log stays readable.

Quiet by default on a terminal: Gloo/absl chatter, the wrapper's start and ``EXIT_CODE=``
lines and a repeated run header stay in storage but are not shown; ``-v`` shows every line,
and so does any output that is not a terminal (a pipe or a file gets the stream as stored).
"""

from __future__ import annotations

import re
import time
import zlib
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from orchestrator.cli.screen import _duration
from orchestrator.readers.figures import stall_text, window_text
from xrun_contract import HEADER_RE, STEP_RE, host_prefix, significant

# Lines that are noise on a terminal: Gloo's connection chatter (gloo/transport), absl /
# glog-prefixed INFO and WARNING lines from C++ (``I1203 10:39:13.123456 123 file.cc:12]``),
# absl's pre-init notice, and the wrapper's own bookkeeping (its end line stays when a
# host exited non-zero: that is news, not bookkeeping).
NOISE_RE = re.compile(  # also Orbax's absl warning at each save: "Reached preemption sync point"
    # A Gloo line torn where two writers' output met: its head alone ("[Glo"), or its tail
    # ("oo] Rank 0 is connected to 1 peer ranks. ...", or after two ranks' lines were glued
    # at "[Gloo] Rank ", "0 is connected to 1 peer ranks. ...") without the "[Gloo]" that
    # marks it.
    r"^(?:\[G(?:l(?:oo?)?)?$|\S{0,5}\]? ?Rank \d+ is connected to \d+ peer ranks|"
    r"(?:\S{0,4} )?\d+ is connected to \d+ peer ranks\b|"
    r"\[Gloo\]|\s*\[?gloo|[IW]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\]|"
    r"WARNING: All log messages before absl::InitializeLog\(\)|E0000 |"
    r"xrun-wrapper: (?:start |end host=\S+ exit_code=0 )|EXIT_CODE=|.*\] Reached preemption sync point, step=)"
)
# Rich colours for host prefixes (stern's idea: one stable colour per host).
HOST_COLOURS = ("cyan", "green", "magenta", "yellow", "blue", "bright_cyan", "bright_green",
                "bright_magenta", "bright_yellow", "bright_blue", "red", "bright_red")


def host_colour(host: str) -> str:
    return HOST_COLOURS[zlib.crc32(host.encode()) % len(HOST_COLOURS)]


# Gloo's two threads of a host print their "Rank N is connected to M peer ranks. Expected
# number of connected peer ranks is : M" at once, interleaved in one line: what is left of it
# comes next as a line of its own, a bare number ("3") or nothing, which quiet mode showed as
# a stray "[0-1] 3". Such a line right after a Gloo line of the same host is its tail.
GLOO_RE = re.compile(r"\[Gloo\]|peer ranks|^\[G(?:l(?:oo?)?)?$")
TORN_TAIL_RE = re.compile(r"^\s*\d*\s*$")


class LineFilter:
    """Quiet mode: drops noise and every header line already shown (one header per run)."""

    def __init__(self, verbose: bool = False):
        self.verbose = verbose
        self.headers: set[str] = set()
        self.after_gloo: set[str] = set()  # hosts whose last line was Gloo's

    def keep(self, text: str, host: str = "") -> bool:
        if self.verbose:
            return True
        after_gloo = host in self.after_gloo
        if GLOO_RE.search(text):
            self.after_gloo.add(host)
            return False
        self.after_gloo.discard(host)
        if after_gloo and TORN_TAIL_RE.match(text):
            return False
        if NOISE_RE.search(text):
            return False
        m = HEADER_RE.search(text)
        if m:
            if m["key"] in self.headers:
                return False
            self.headers.add(m["key"])
        return True


def _num(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else significant(float(x), digits)


def _tokens(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 100 else significant(x, 3)


def progress_parts(view: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) pairs of the progress line, in order; shared by both renderings."""
    parts: list[tuple[str, str]] = [("", str(view.get("phase") or view["state"].lower()))]
    if view.get("stall"):
        parts.append(("stalled:", stall_text(view["stall"])))
    since = view.get("phase_since")
    if since is not None and view.get("phase") not in ("training", "checkpointing"):
        parts.append(("for", _duration(max(0.0, time.time() - since))))
    if view.get("step") is not None:
        total = view.get("total_steps")
        parts.append(("step", f"{view['step']}/{total}" if total else str(view["step"])))
        parts.append(("loss", _num(view.get("loss"), 5)))
        parts.append((f"tokens/s (total, {window_text(view.get('window_steps'), short=True)})",
                      _tokens(view.get("tokens_per_s"))))
        if view.get("eta_seconds") is not None:
            parts.append(("ETA", _duration(view["eta_seconds"])))
    ck = view.get("latest_checkpoint")
    saving = view.get("checkpoints_in_progress") or []
    parts.append(("checkpoint", (f"step {ck['step']}" if ck else "none")
                  + (f" (saving {max(saving)})" if saving else "")))
    if view.get("restarts"):
        parts.append(("restarts", str(view["restarts"])))
    return parts


def plain_progress(view: dict[str, Any]) -> str:
    """One line for a log file: 'xrun: NAME training | step 4/10 | loss 3.2 | ...'."""
    bits = [f"{k} {v}" if k else v for k, v in progress_parts(view)]
    why = restart_reason(view)
    if why:  # a log file has no pinned line to glance at: say why the run last restarted
        bits = [f"{b} (last: {why})" if b.startswith("restarts ") else b for b in bits]
    return f"xrun: {view['name']} " + " | ".join(bits)


def restart_reason(view: dict[str, Any]) -> str:
    """Why the run last restarted, as its Restarting transition recorded it ('' if never)."""
    if not view.get("restarts"):
        return ""
    reasons = [str(t.get("reason") or "") for t in view.get("transitions") or [] if t.get("state") == "Restarting"]
    return reasons[-1] if reasons else ""


def rich_progress(view: dict[str, Any], width: int = 20, columns: int | None = None) -> Text:
    """The pinned line: the phase in colour, a bar for step N/M, the figures. Within
    ``columns`` (the terminal's width) it never wraps: the bar shrinks, the labels get
    short (tok/s, ckpt), then the bar goes, then the least needed figures (tokens/s, the
    checkpoint, how long the phase lasted); a value is never shown without its label (a
    bare '3,593' or 'step 10' reads as something else). Only then is the line cut with an
    ellipsis (a wrapped pinned line is redrawn as two, and the terminal scrolls a copy of it
    on every refresh)."""
    text = _pinned_text(view, width, False, ())
    if columns is None:
        return text
    for bar, short, drop in ((width, False, ()), (width // 2, True, ()), (6, True, ()), (0, True, ()),
                             (0, True, ("tokens/s",)), (0, True, ("tokens/s", "checkpoint", "for"))):
        text = _pinned_text(view, bar, short, drop)
        if text.cell_len <= columns:
            return text
    text.truncate(max(1, columns), overflow="ellipsis")
    return text


SHORT_LABELS = {"tokens/s": "tok/s", "checkpoint": "ckpt", "restarts": "restarts"}


def _pinned_text(view: dict[str, Any], width: int, short: bool, drop: tuple[str, ...]) -> Text:
    text = Text()
    phase = str(view.get("phase") or view["state"].lower())
    text.append(f"{view['name']} ", style="bold")
    text.append(phase, style="bold cyan")
    total, step = view.get("total_steps"), view.get("step")
    if total and step is not None and width:
        done = max(0, min(width, round(width * step / total)))
        text.append("  ")
        text.append("━" * done, style="green")
        text.append("━" * (width - done), style="grey37")
        text.append(f" {100 * step / total:.0f}%")
    for label, value in progress_parts(view)[1:]:
        key = label.split(" (", 1)[0]  # 'tokens/s (total, 20-step median)' -> 'tokens/s'
        if key in drop:
            continue
        text.append("  ")
        text.append(f"{SHORT_LABELS.get(key, key) if short else label} ", style="dim")
        text.append(value)
    return text


def newest(view: dict[str, Any], step: int, loss: float, attempt: int) -> dict[str, Any]:
    """``view`` with the newest step line read from the hosts' log (step ``step`` of
    ``attempt``) when it is newer than the view's metrics: the step and its loss together,
    the ETA from the same window's step time, the phase as of that step (a save the step
    came after is written under training, not waited for)."""
    if view.get("step") is not None and (attempt, step) <= (view.get("attempt", 0), view["step"]):
        return view
    if attempt < (view.get("restarts") or 0) or view.get("state") not in ("Running", "Restarting", "Pending"):
        return view
    out = {**view, "step": step, "loss": loss, "attempt": attempt}
    total, secs = view.get("total_steps"), view.get("eta_step_seconds") or view.get("step_seconds")
    if total and secs:
        out["eta_seconds"] = max(0, total - step) * secs
    saving = view.get("checkpoints_in_progress") or []
    if ((out.get("phase") == "checkpointing" and (not saving or step > max(saving)))
            or (out.get("phase") not in ("training", "checkpointing") and attempt >= (view.get("restarts") or 0))):
        out["phase"] = "training"
    return out


class ProgressScreen:
    """Host lines above a pinned progress line (TTY) or plain progress lines (no TTY)."""

    def __init__(self, console: Console, *, interval: float = 10.0, verbose: bool = False,
                 prefix: bool = True, colour: bool | None = None, tty: bool | None = None):
        self.console = console
        self.tty = console.is_terminal if tty is None else tty
        self.colour = self.tty if colour is None else colour
        self.filter = LineFilter(verbose)
        self.interval, self.prefix = interval, prefix
        self.live: Live | None = None
        self._last_plain, self._last_phase = 0.0, ""
        self._view: dict[str, Any] | None = None
        self._step: tuple[int, float, int] | None = None  # newest step line: (step, loss, attempt)
        self._drawn = ""  # the pinned line as last drawn
        self.hidden: dict[str, int] = {}  # host -> lines the quiet filter hid
        self.shown: set[str] = set()  # hosts with a line on the screen

    def quiet_summary(self) -> str:
        """What quiet mode hid, for the end of a followed run: a host whose every line was
        noise (a non-primary host prints only its wrapper's, Gloo's and a repeated header)
        looks absent otherwise (#39). '' when nothing was hidden."""
        if not self.hidden:
            return ""
        silent = sorted(h for h in self.hidden if h not in self.shown)
        total = sum(self.hidden.values())
        text = f"quiet: {total} line{'s' if total != 1 else ''} of noise hidden"
        if silent:
            named = ", ".join(f"{h} ({self.hidden[h]})" for h in silent[:4])
            more = f" and {len(silent) - 4} more" if len(silent) > 4 else ""
            text += (f"; every line of host{'s' if len(silent) > 1 else ''} {named}{more} "
                     f"was noise")
        return text + " (-v shows them; xrun logs NAME has them all)"

    def __enter__(self) -> ProgressScreen:
        if self.tty:
            # The pinned line is drawn from the newest view and step line at each draw (also
            # the redraw under a host line just printed), never from a stored rendering.
            # Drawn when it changes (update) and under each host line printed, never on a
            # timer: a redraw 4 times a second of the same line is flicker and bytes over ssh.
            self.live = Live(_Pinned(self), console=self.console, transient=True, auto_refresh=False)
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def line(self, host: str, attempt: int, text: str, stamp: str = "") -> None:
        m = STEP_RE.search(text)
        if m and (self._step is None or (attempt, int(m["step"])) >= (self._step[2], self._step[0])):
            self._step = (int(m["step"]), float(m["loss"]), attempt)
        if not self.filter.keep(text, host):
            self.hidden[host] = self.hidden.get(host, 0) + 1
            return
        self.shown.add(host)
        out = Text()
        if stamp:
            out.append(stamp + " ", style="dim" if self.colour else "")
        if self.prefix:
            out.append(host_prefix(host, attempt), style=host_colour(host) if self.colour else "")
            out.append(" ")
        out.append(text)
        if self.colour:
            self.console.print(out, soft_wrap=True, highlight=False)
        else:
            print(out.plain, flush=True)

    def note(self, message: str, prefix: str = "xrun: ") -> None:
        """An orchestrator line (state change, why a pod waits): above the progress line on
        a terminal, on stderr otherwise."""
        if self.live is not None:
            self.console.print(Text(f"{prefix}{message}", style="yellow"), soft_wrap=True, highlight=False)
        else:
            print(f"{prefix}{message}", file=_stderr(), flush=True)

    def _merged(self, view: dict[str, Any]) -> dict[str, Any]:
        return view if self._step is None else newest(view, *self._step)

    def update(self, view: dict[str, Any], *, force: bool = False) -> None:
        self._view = view
        view = self._merged(view)
        if self.live is not None:
            drawn = rich_progress(view, columns=self.console.width).plain
            if force or drawn != self._drawn:
                self._drawn = drawn
                self.live.refresh()
            return
        if self._step is not None:  # a log's line sums up the lines above it, not ten steps on
            view = as_of_lines(view, *self._step)
        now = time.monotonic()
        phase = str(view.get("phase") or "")
        if force or phase != self._last_phase or now - self._last_plain >= self.interval:
            self._last_plain, self._last_phase = now, phase
            print(plain_progress(view), file=_stderr(), flush=True)


def as_of_lines(view: dict[str, Any], step: int, loss: float, attempt: int) -> dict[str, Any]:
    """``view`` as of the newest step line printed (piped output): the metrics are flushed
    before the hosts' log chunks are shipped, so a view can be steps ahead of the lines it
    follows; the step, its loss and the ETA are then the printed line's."""
    if view.get("step") is None or (attempt, step) >= (view.get("attempt", 0), view["step"]):
        return view
    if attempt != (view.get("restarts") or 0):
        return view  # lines of an earlier attempt: the view's figures are the run's now
    out = {**view, "step": step, "loss": loss}
    total, secs = view.get("total_steps"), view.get("eta_step_seconds") or view.get("step_seconds")
    if total and secs:
        out["eta_seconds"] = max(0, total - step) * secs
    return out


class _Pinned:
    """The live line of a :class:`ProgressScreen`, rendered from its state when drawn."""

    def __init__(self, screen: ProgressScreen):
        self.screen = screen

    def __rich__(self) -> Text:
        view = self.screen._view
        if view is None:
            return Text("")
        return rich_progress(self.screen._merged(view), columns=self.screen.console.width)


def _stderr():
    import sys

    return sys.stderr
