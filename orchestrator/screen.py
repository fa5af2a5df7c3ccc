"""One status view for every backend: backend state merged with what storage says.

``run_view`` gathers a plain dict (what ``-o json`` prints); ``render_table`` turns it into
the rich screen that ``xrun status`` and the live follow of ``xrun submit`` show.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from orchestrator.backends import BackendStatus
from orchestrator.readers import (
    MetricsReader,
    latest_committed,
    list_checkpoints,
    progress,
)
from xrun_contract import FAILED, PENDING, SUCCEEDED, Layout
from xrun_contract.storage import Storage


def _state_from_records(records: list[dict[str, Any]]) -> str | None:
    ends = [r for r in records if r.get("kind") == "end"]
    if not ends:
        return None
    return SUCCEEDED if ends[-1].get("exit_code") == 0 else FAILED


def run_view(
    storage: Storage,
    name: str,
    live: BackendStatus | None = None,
    metrics: MetricsReader | None = None,
) -> dict[str, Any] | None:
    """Everything known about a run; None when storage has no such run."""
    run = storage.read_json(Layout.run_json(name))
    state = storage.read_json(Layout.state(name)) or {}
    if run is None and not state and live is None:
        return None
    run = run or {}
    if metrics is None:
        metrics = MetricsReader(storage, name)
    metrics.poll()
    prog = progress(metrics.records, run)
    checkpoints = list_checkpoints(storage, name)
    latest = latest_committed(checkpoints)
    if live is not None:
        current, restarts, message = live.state, live.restarts, live.message
        hosts = [h.__dict__ for h in live.hosts]
        events = live.events
    else:
        current = state.get("state") or _state_from_records(metrics.records) or PENDING
        restarts, message = state.get("restarts", 0), state.get("message", "")
        hosts = [{"host": h, **v} for h, v in sorted(state.get("hosts", {}).items())]
        events = []
    view: dict[str, Any] = {
        "name": name,
        "state": current,
        "restarts": restarts,
        "message": message,
        "events": events,
        "backend": run.get("backend", state.get("backend", "")),
        "accelerator": (run.get("spec") or {}).get("accelerator", ""),
        "submitted_at": run.get("submitted_at"),
        "storage": storage.url(Layout.run(name)),
        "hosts": hosts,
        "step": prog.step,
        "total_steps": prog.total_steps,
        "loss": prog.loss,
        "tokens_per_s": prog.tokens_per_s,
        "step_seconds": prog.step_seconds,
        "eta_seconds": prog.eta_seconds,
        "attempt": prog.attempt,
        "latest_checkpoint": latest.as_dict() if latest else None,
        "checkpoints_in_progress": [c.step for c in checkpoints if c.state != "committed"],
        "transitions": state.get("transitions", []),
    }
    view["goodput"] = _goodput(metrics.records, run, state)
    return view


def _goodput(records: list[dict[str, Any]], run: dict[str, Any], state: dict[str, Any]):
    """Wall-time breakdown from the records (None while there is nothing to break down)."""
    from orchestrator.goodput import goodput_from_records

    if not any(r.get("kind") == "step" for r in records):
        return None
    try:
        return goodput_from_records(records, run, state)
    except Exception:  # noqa: BLE001 - a partial run must still show its status
        return None


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


STATE_STYLE = {"Succeeded": "green", "Failed": "red", "Restarting": "yellow", "Running": "cyan",
               "Pending": "magenta", "Deleted": "red"}


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
        from orchestrator.goodput import format_goodput

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
        from orchestrator.goodput import format_goodput

        lines.append(f"  {format_goodput(view['goodput'])}")
    if started is not None:
        lines.append(f"  wall time {_duration(time.time() - started)}")
    lines.append(f"  storage {view['storage']}")
    return lines
