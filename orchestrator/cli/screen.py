"""The screens: a run's status table (``xrun status``, the live follow) and its summary.

Presentation only: the data is the view dict of ``orchestrator.readers.view``.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from orchestrator.analysis.goodput import format_goodput
from xrun_contract import DELETED, FAILED, PENDING, RESTARTING, RUNNING, SUCCEEDED


def _fmt(value: Any, spec: str = "", missing: str = "-") -> str:
    if value is None:
        return missing
    return format(value, spec) if spec else str(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


STATE_STYLE = {SUCCEEDED: "green", FAILED: "red", RESTARTING: "yellow", RUNNING: "cyan",
               PENDING: "magenta", DELETED: "red"}


def render_table(view: dict[str, Any]) -> Group:
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    state = Text(view["state"], style=STATE_STYLE.get(view["state"], ""))
    head.add_row("Run", f"{view['name']}  ({view['backend'] or '?'} backend, {view['accelerator'] or '?'})")
    head.add_row("State", Text.assemble(state, f"   restarts {view['restarts']}",
                                        f"   {view['message']}" if view["message"] else ""))
    step = _fmt(view["step"])
    if view["total_steps"]:
        step += f" / {view['total_steps']}"
    head.add_row("Step", f"{step}   loss {_fmt(view['loss'], '.4f')}   "
                         f"tok/s {_fmt(view['tokens_per_s'], ',.0f')}   "
                         f"s/step {_fmt(view['step_seconds'], '.3f')}   ETA {_duration(view['eta_seconds'])}")
    ck = view["latest_checkpoint"]
    ck_text = "none committed"
    if ck:
        ck_text = f"step {ck['step']} committed {_duration(ck['age_seconds'])} ago"
        if ck.get("write_seconds") is not None:
            ck_text += f" (write {ck['write_seconds']:.1f}s)"
    if view["checkpoints_in_progress"]:
        ck_text += f"; in progress: {', '.join(map(str, view['checkpoints_in_progress']))}"
    head.add_row("Checkpoint", ck_text)
    gp = view.get("goodput")
    if gp and gp.get("categories"):
        head.add_row("Goodput", format_goodput(gp))
    head.add_row("Storage", view["storage"])
    for ev in view.get("events") or []:
        head.add_row("Event", Text(ev, style="yellow"))
    hosts = Table(show_edge=False, box=None, header_style="bold")
    for col in ("HOST", "STATE", "ATTEMPT", "EXIT", "POD/PID", "REASON"):
        hosts.add_column(col)
    for h in view["hosts"]:
        hosts.add_row(h.get("host", "?"), Text(h.get("state", "?"), style=STATE_STYLE.get(h.get("state", ""), "")),
                      _fmt(h.get("attempt")), _fmt(h.get("exit_code")),
                      _fmt(h.get("pod") or h.get("pid")), h.get("reason", "") or "")
    return Group(head, Text(""), hosts)


def summary_lines(view: dict[str, Any], started: float | None = None) -> list[str]:
    """The closing summary of a followed run."""
    lines = [f"run {view['name']}: {view['state']}" + (f" ({view['message']})" if view["message"] else "")]
    if view["step"] is not None:
        lines.append(
            f"  steps {view['step']}" + (f"/{view['total_steps']}" if view["total_steps"] else "")
            + f", final loss {_fmt(view['loss'], '.4f')}, median s/step {_fmt(view['step_seconds'], '.3f')}, "
            f"tok/s {_fmt(view['tokens_per_s'], ',.0f')}"
        )
    lines.append(f"  restarts {view['restarts']}")
    ck = view["latest_checkpoint"]
    lines.append(f"  latest committed checkpoint: {'step ' + str(ck['step']) if ck else 'none'}")
    if view.get("goodput") and view["goodput"].get("categories"):
        lines.append(f"  {format_goodput(view['goodput'])}")
    if started is not None:
        lines.append(f"  wall time {_duration(time.time() - started)}")
    lines.append(f"  storage {view['storage']}")
    return lines
