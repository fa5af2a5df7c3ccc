"""The screens: a run's status table (``xrun status``, the live follow) and its summary.

Presentation only: the data is the view dict of ``orchestrator.services.view``.
"""

from __future__ import annotations

import textwrap
import time
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from orchestrator.analysis.goodput import format_goodput, format_startup
from orchestrator.readers.figures import stall_text, window_text
from orchestrator.readers.record import code_text
from xrun_contract import (
    DELETED,
    FAILED,
    PENDING,
    RESTARTING,
    RUNNING,
    SUCCEEDED,
    is_terminal,
    significant,
)
from xrun_contract.xplane import ops_text


def _fmt(value: Any, spec: str = "", missing: str = "-") -> str:
    if value is None:
        return missing
    return format(value, spec) if spec else str(value)


def _sig(value: Any, digits: int = 4) -> str:
    """A figure with significant digits (0.001234, 12.35, 123457), never '0.000'."""
    return "-" if value is None else significant(float(value), digits)


def _rate(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else significant(float(value), 3)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def age(t: float, now: float | None = None) -> str:
    """kubectl's AGE column (``duration.HumanDuration``): 45s, 12m, 3h20m, 5d, 2y."""
    s = max(0, int((time.time() if now is None else now) - t))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    return f"{d}d" if d < 365 * 2 else f"{d // 365}y"


STATE_STYLE = {SUCCEEDED: "green", FAILED: "red", RESTARTING: "yellow", RUNNING: "cyan",
               PENDING: "magenta", DELETED: "red"}


def render_table(view: dict[str, Any], width: int | None = None) -> Group:
    """The status screen; within ``width`` columns (a terminal's) a host's long reason
    wraps under the REASON column."""
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column(overflow="fold")  # a long path folds, never cut with an ellipsis
    state = Text(view["state"], style=STATE_STYLE.get(view["state"], ""))
    head.add_row("Run", f"{view['name']}  ({view['backend'] or '?'} backend, {view['accelerator'] or '?'})")
    head.add_row("State", Text.assemble(state, f"   restarts {view['restarts']}",
                                        f"   {view['message']}" if view["message"] else ""))
    if view.get("phase") and not is_terminal(view["state"]):
        since = view.get("phase_since")
        elapsed = f"  (for {_duration(max(0.0, time.time() - since))})" if isinstance(since, int | float) else ""
        head.add_row("Phase", Text.assemble((str(view["phase"]), "bold cyan"), elapsed))
    if view.get("stall"):
        st = view["stall"]
        head.add_row("Stalled", Text(f"{stall_text(st)}: past its limit of {_duration(st['limit_seconds'])} "
                                     f"({st['limit_from']})", style="bold red"))
    step = _fmt(view["step"])
    if view["total_steps"]:
        step += f" / {view['total_steps']}"
    eta = "" if is_terminal(view["state"]) else f"   ETA {_duration(view['eta_seconds'])}"
    head.add_row("Step", f"{step}   loss {_sig(view['loss'], 5)}   "
                         f"tokens/s (total) {_rate(view['tokens_per_s'])}   "
                         f"s/step {_sig(view['step_seconds'])}{eta}   ({window_text(view.get('window_steps'))})")
    ck = view["latest_checkpoint"]
    ck_text = "none committed"
    if ck:
        ck_text = f"step {ck['step']} committed {_duration(ck['age_seconds'])} ago"
        if ck.get("write_seconds") is not None:
            ck_text += f" (write {_sig(ck['write_seconds'], 3)}s)"
    if view["checkpoints_in_progress"]:
        ck_text += f"; in progress: {', '.join(map(str, view['checkpoints_in_progress']))}"
    head.add_row("Checkpoint", ck_text)
    gp = view.get("goodput")
    if gp and gp.get("categories"):
        head.add_row("Goodput", format_goodput(gp).removeprefix("goodput "))  # the label says it
    for timeline in _startups(gp):
        head.add_row("Startup", format_startup(timeline))
    head.add_row("Storage", view["storage"])
    if view.get("code"):
        head.add_row("Code", code_text(view["code"]))
    if view.get("profile"):
        pr = view["profile"]
        steps = pr.get("steps") or ["?", "?"]
        head.add_row("Profile", f"steps {steps[0]}-{steps[-1]}: {pr.get('path')} "
                                "(tensorboard --logdir there, Profile tab)")
        if pr.get("top_ops"):
            head.add_row("Top ops", ops_text(pr["top_ops"], 5))
        elif pr.get("top_ops_error"):
            head.add_row("Top ops", f"not read: {pr['top_ops_error']}")
    for ev in view.get("events") or []:
        head.add_row("Event", Text(ev, style="yellow"))
    return Group(head, Text(""), _Unwrapped(hosts_table(view["hosts"], width)))


class _Unwrapped:
    """A Text that a console which does not wrap (``Console(soft_wrap=True)``: ``xrun
    status``) renders as rich would, without splitting it into its lines and joining them
    again first (``Text.__rich_console__``: with overflow "ignore" and no tab that is the
    same text): the same segments, 0.01 s less of a 1,024-host status on the 2-core machine.
    Any other console (the live follow screen wraps) renders the Text itself."""

    def __init__(self, text: Text):
        self.text = text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        text = self.text
        if (text.overflow or options.overflow) == "ignore" and "\t" not in text.plain:
            yield from text.render(console, end=text.end)
        else:
            yield text

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.text)


HOST_COLUMNS = ("HOST", "STATE", "ATTEMPT", "EXIT", "POD/PID", "REASON")


def hosts_table(hosts: list[dict[str, Any]], width: int | None = None) -> Text:
    """The hosts, one row each, laid out as rich's borderless Table lays them out (a space
    at each edge, two between columns), but as one Text: a rich Table measures and renders
    every cell as its own renderable, about a second for 1,024 hosts on the 2-core machine,
    where ``xrun status`` of a 1,024-host run must take no more than one in all."""
    rows = [(h.get("host", "?"), h.get("state", "?"), _fmt(h.get("attempt")), _fmt(h.get("exit_code")),
             _fmt(h.get("pod") or h.get("pid")), h.get("reason", "") or "") for h in hosts]
    widths = [max([len(col)] + [len(r[i]) for r in rows]) for i, col in enumerate(HOST_COLUMNS)]
    out = Text(no_wrap=False)
    header = " " + "  ".join(col.ljust(w) for col, w in zip(HOST_COLUMNS, widths, strict=True)) + " "
    out.append(header, style="bold")
    at = 1 + sum(w + 2 for w in widths[:-1])  # where REASON starts
    room = (width - at - 1) if width else 0
    for r in rows:
        out.append("\n " + r[0].ljust(widths[0]) + "  ")
        out.append(r[1].ljust(widths[1]), style=STATE_STYLE.get(r[1], ""))
        reason = r[5]
        if room >= 20 and len(reason) > room:  # wrapped under its column, not at column 0
            reason = ("\n" + " " * at).join(textwrap.wrap(reason, room))
            out.append("  " + "  ".join(c.ljust(w) for c, w in zip(r[2:5], widths[2:5], strict=True)) + "  " + reason)
        else:
            out.append("  " + "  ".join(c.ljust(w) for c, w in zip(r[2:], widths[2:], strict=True)) + " ")
    return out


def _startups(gp: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The startup timelines worth a line: the first attempt's and the latest restart's."""
    timelines = (gp or {}).get("startup_timeline") or []
    return timelines[:1] + timelines[1:][-1:]


def fold(line: str, width: int | None) -> str:
    """``line`` wrapped to ``width`` columns (a terminal's) with its continuation lines
    indented past its own indent, so a wrapped summary line does not read as a new one;
    as it is when ``width`` is None (piped: lines whole) or the line fits."""
    if width is None or len(line) <= width:
        return line
    lead = " " * (len(line) - len(line.lstrip(" ")))
    return "\n".join(textwrap.wrap(line, width, initial_indent="", subsequent_indent=lead + "    ",
                                    break_on_hyphens=False)) or line


def summary_lines(view: dict[str, Any], started: float | None = None) -> list[str]:
    """The closing summary of a followed run."""
    lines = [f"run {view['name']}: {view['state']}" + (f" ({view['message']})" if view["message"] else "")]
    if view["step"] is not None:
        lines.append(
            f"  steps {view['step']}" + (f"/{view['total_steps']}" if view["total_steps"] else "")
            + f", final loss {_sig(view['loss'], 5)}; {window_text(view.get('window_steps'))}: s/step "
            f"{_sig(view['step_seconds'])}, tokens/s (total) {_rate(view['tokens_per_s'])}; "
            f"last step: s/step {_sig(view.get('last_step_seconds'))}, tokens/s (total) "
            f"{_rate(view.get('last_tokens_per_s'))}"
        )
    lines.append(f"  restarts {view['restarts']}")
    ck = view["latest_checkpoint"]
    lines.append(f"  latest committed checkpoint: {'step ' + str(ck['step']) if ck else 'none'}")
    if view.get("goodput") and view["goodput"].get("categories"):
        lines.append(f"  {format_goodput(view['goodput'])}")
    for timeline in _startups(view.get("goodput")):
        lines.append(f"  startup {format_startup(timeline)}")
    if started is not None:
        lines.append(f"  wall time {_duration(time.time() - started)}")
    lines.append(f"  storage {view['storage']}")
    return lines


VERDICT_STYLE = {"improved": "green", "regressed": "red", "within noise": "dim", "narrower": "dim", "wider": "yellow",
                 "differs": "yellow", "missing": "yellow", "not improved": "yellow"}


def _delta(r: Any) -> str:
    from orchestrator.analysis.compare import delta_text

    return delta_text(r)


def _verdict(r: Any, threshold_pct: float) -> str:
    v = r.verdict or ""
    if v == "regressed" and r.gating and not r.beyond_threshold:
        v += f" (under {threshold_pct:g}%)"
    if r.p_value is not None:
        n = f", n={r.n_base}/{r.n_cand}" if r.n_base is not None else ""
        v += f"  p={r.p_value:.3f}{n}" if r.p_value >= 0.001 else f"  p<0.001{n}"
    return v


VERDICT_LINE_STYLE = {"failed": "bold red", "regressed": "bold red", "not comparable": "bold yellow",
                      "inconclusive": "bold yellow",
                      "ok": "bold green"}


def verdict_line(c: Any) -> Text:
    """The one line a reader needs first: regressed or not, and by what (the comparison's
    own verdict, the same line markdown, JSON and HTML show)."""
    kind, line = c.verdict
    return Text(line, style=VERDICT_LINE_STYLE.get(kind, "bold"))


def hanging(prefix: str, text: str, style: str = "") -> Table:
    """``prefix`` then ``text``, whose wrapped lines are indented under its start (a note
    wrapped by the terminal at column 0 reads as a new one)."""
    grid = Table.grid()
    grid.add_column(no_wrap=True, style=style)
    grid.add_column(overflow="fold", style=style)
    grid.add_row(prefix, text)
    return grid


def comparison_screen(c: Any, width: int | None = None) -> Group:
    """benchstat's shape: the verdict first, then one aligned row per metric (base, candidate,
    delta, verdict with p and n), coloured by verdict (improved green, regressed red, within
    noise dim); warnings above, notes below. Within ``width`` columns (a terminal's) no
    label or value is cut: long run labels move to a legend (BASE, CAND), the verdict's p and
    n and long metric names wrap, and wrapped warnings and notes are indented."""
    cells = [(r.metric, r.base, r.cand, _delta(r), _verdict(r, c.threshold_pct)) for r in c.rows]
    heads = ["METRIC", c.base_label, c.cand_label, "DELTA", "VERDICT"]
    full = sum(max(len(h), *(len(x[i]) for x in cells)) for i, h in enumerate(heads)) + 2 * (len(heads) - 1)
    narrow = width is not None and full > width
    parts: list[Any] = [verdict_line(c)]
    parts += [hanging("warning: ", w, "yellow") if width else Text(f"warning: {w}", style="yellow")
              for w in c.warnings]
    if narrow:
        heads[1:3] = ["BASE", "CAND"]
        parts.append(hanging("BASE ", c.base_label, "bold"))
        parts.append(hanging("CAND ", c.cand_label, "bold"))
    table = Table(box=None, header_style="bold", show_edge=False, pad_edge=False)
    table.add_column(heads[0], no_wrap=not narrow, overflow="fold", ratio=None)
    table.add_column(heads[1], justify="right", no_wrap=True)
    table.add_column(heads[2], justify="right", no_wrap=True)
    table.add_column(heads[3], justify="right", no_wrap=True)
    table.add_column(heads[4], no_wrap=not narrow, overflow="fold")
    for r, (metric, base, cand, delta, verdict) in zip(c.rows, cells, strict=True):
        style = VERDICT_STYLE.get(r.verdict, "")
        table.add_row(metric, base, cand, Text(delta, style=style), Text(verdict, style=style))
    parts += [Text(""), table, Text("")]
    parts += [hanging("note: ", n, "dim") if width else Text(f"note: {n}", style="dim") for n in c.notes]
    return Group(*parts)
