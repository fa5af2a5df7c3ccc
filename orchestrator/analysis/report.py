"""The comparison report as one self-contained HTML file: tables, and interactive plotly
charts with plotly.js inlined (no CDN, nothing fetched: people read it offline or from a
bucket).

Charts people read: zoom, hover values and series toggles (click a legend entry) come with
plotly; loss is a smoothed line over faint raw points with a smoothing slider (TensorBoard's
debiased exponential moving average) and a linear/log switch; legends sit outside the plot;
each run's checkpoint saves are markers on its own step-time series; next to the step-time
series, each run's distribution as a box. Nightly reports add a trend chart per metric over
past nights, each night's runs as points, change points on the base marked.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.analysis.compare import Comparison, Row, RunSetComparison
from orchestrator.analysis.goodput import CATEGORIES, format_goodput, format_startup
from orchestrator.analysis.outliers import RULE_TEXT as OUTLIER_RULE
from orchestrator.readers.record import RunRecord, short_commit

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
GOODPUT_COLORS = {
    "productive": "#2ca02c", "startup": "#7f7f7f", "compilation": "#bcbd22", "checkpoint": "#ff7f0e",
    "restarts": "#d62728", "redone_steps": "#e377c2", "slow_steps": "#9edae5",
    "between_steps": "#c5b0d5", "teardown": "#8c564b", "other": "#c7c7c7",
}
MAX_POINTS = 2000  # per series in a chart
MAX_EVENTS = 200  # checkpoint markers per run
DEFAULT_SMOOTHING = 0.6

CSS = """
body{font-family:-apple-system,"Segoe UI",Roboto,"DejaVu Sans",Arial,sans-serif;margin:24px;\
color:#1b1b1b;background:#fff;max-width:1200px}
h1{font-size:1.5em;margin:0 0 4px}h2{font-size:1.2em;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:1.05em;margin:18px 0 6px}.meta{color:#555;font-size:.9em;margin:0 0 12px}
table.cmp{border-collapse:collapse;font-size:.9em;margin:8px 0}
table.cmp th,table.cmp td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
table.cmp th{background:#f2f2f2}td.num{font-variant-numeric:tabular-nums;white-space:nowrap}
.v-regressed{color:#b00020;font-weight:bold}.v-improved{color:#1b7f2a;font-weight:bold}
.v-within-noise,.v-identical,.v-same{color:#555}.v-not-tested,.v-missing{color:#8a6d00}.v-differs{color:#b00020}
ul.warnings{background:#fff4e5;border:1px solid #f0b429;padding:8px 8px 8px 28px;margin:8px 0}
ul.warnings li{margin:2px 0}ul.notes{color:#333;font-size:.88em}
.verdict{display:inline-block;padding:2px 8px;border-radius:3px;font-weight:bold;margin:4px 0}
.verdict.bad{background:#fde7ea;color:#b00020}.verdict.good{background:#e8f5e9;color:#1b7f2a}
.verdict.warn{background:#fff4e0;color:#8a5300}
figure{margin:12px 0}figcaption{font-size:.85em;color:#444;margin-top:2px}
svg.chart{background:#fff;border:1px solid #e0e0e0}svg text{font-size:11px;fill:#333}
.runs td{font-size:.85em}\n.plot{width:100%}.controls{font-size:.85em;color:#333;margin:4px 0}\n\
.chartrow{display:flex;gap:8px}.chartrow>.plot{flex:1}
"""

# Smoothing as TensorBoard does it (tensorboard/webapp/widgets/line_chart_v2/lib/
# data_transformer_utils.ts, classicSmoothing): a debiased EMA over the raw points. Each
# smoothed trace names its raw trace in meta.raw; the slider restyles every chart on the page.
SCRIPT = """
function xrunSmooth(ys, w) {
  var last = 0, n = 0, out = [];
  for (var i = 0; i < ys.length; i++) {
    var y = ys[i];
    if (y === null || !isFinite(y)) { out.push(null); continue; }
    last = last * w + (1 - w) * y; n++;
    out.push(w === 1 ? ys[0] : last / (1 - Math.pow(w, n)));
  }
  return out;
}
function xrunApplySmoothing(w) {
  document.querySelectorAll('.plot[data-smooth]').forEach(function (div) {
    if (!div.data) return;
    var idx = [], ys = [];
    div.data.forEach(function (t, i) {
      if (t.meta && t.meta.raw !== undefined) { idx.push(i); ys.push(xrunSmooth(div.data[t.meta.raw].y, w)); }
    });
    if (idx.length) Plotly.restyle(div, {y: ys}, idx);
  });
  document.querySelectorAll('.smoothing-value').forEach(function (e) { e.textContent = w.toFixed(2); });
}
"""


@dataclass
class Section:
    """One group of runs (a nightly config): the runs, each candidate's per-step comparison,
    and (nightly) the run-level comparisons of repeated runs and each run's final state."""

    title: str
    runs: list[RunRecord]
    comparisons: list[Comparison] = field(default_factory=list)
    run_sets: list[RunSetComparison] = field(default_factory=list)
    states: dict[str, tuple[str, str]] = field(default_factory=dict)  # run name -> (state, message)


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def _thin(points: list[tuple[float, float]], limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """At most ``limit`` points, keeping each bucket's min and max so spikes stay visible."""
    if len(points) <= limit:
        return points
    bucket = math.ceil(len(points) / (limit / 2))
    out: list[tuple[float, float]] = []
    for i in range(0, len(points), bucket):
        chunk = points[i:i + bucket]
        lo = min(chunk, key=lambda p: p[1])
        hi = max(chunk, key=lambda p: p[1])
        out.extend(sorted({lo, hi}))
    return out


def smooth(ys: Sequence[float], weight: float) -> list[float]:
    """The same debiased EMA as the page's slider (first draw without waiting for JS)."""
    out, last = [], 0.0
    for n, y in enumerate(ys, 1):
        last = last * weight + (1 - weight) * y
        out.append(last / (1 - weight ** n) if weight < 1 else ys[0])
    return out


def _plot(div_id: str, data: list[dict], layout: dict, smooth_ctl: bool = False, css_class: str = "plot",
          height: int = 380) -> str:
    """A div and the script that draws it; the figure's JSON is escaped for a <script> body."""
    base = {"height": height, "margin": {"l": 64, "r": 16, "t": 36, "b": 48}, "hovermode": "closest",
            "legend": {"x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top"},  # outside the plot
            "template": None, "plot_bgcolor": "#fff", "paper_bgcolor": "#fff"}
    fig = json.dumps({"data": data, "layout": {**base, **layout}}, allow_nan=False, separators=(",", ":"))
    fig = fig.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    attr = ' data-smooth="1"' if smooth_ctl else ""
    return (f'<div class="{css_class}" id="{esc(div_id)}"{attr}></div>'
            f'<script>(function(){{var f={fig};Plotly.newPlot("{esc(div_id)}",f.data,f.layout,'
            '{responsive:true,displaylogo:false});})();</script>')


def log_ticks(values: Sequence[float]) -> tuple[list[float], list[str]]:
    """Ticks at 1, 2 and 5 of every decade the positive ``values`` span, labelled in full
    (0.1, 0.2, 0.5, 1, 2, 5), as TensorBoard's log axis reads, not plotly's bare digits."""
    pos = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not pos:
        return [], []
    lo, hi = math.floor(math.log10(min(pos))), math.ceil(math.log10(max(pos)))
    vals = [m * 10.0 ** e for e in range(lo, hi + 1) for m in (1, 2, 5)
            if min(pos) / 2 <= m * 10.0 ** e <= max(pos) * 2]
    vals = [float(f"{v:.12g}") for v in vals]
    return vals, [f"{v:g}" for v in vals]


def _axis_buttons(axis: str = "yaxis", values: Sequence[float] = ()) -> list[dict]:
    """A linear / log switch for the y axis (plotly's own relayout buttons); the log axis
    gets 1-2-5 ticks per decade of ``values``."""
    vals, text = log_ticks(values)
    log: dict[str, Any] = {f"{axis}.type": "log"}
    if vals:
        log.update({f"{axis}.tickvals": vals, f"{axis}.ticktext": text})
    return [{"type": "buttons", "direction": "right", "x": 0, "xanchor": "left", "y": 1.12, "yanchor": "top",
             "showactive": True, "buttons": [
                 {"label": "linear", "method": "relayout",
                  "args": [{f"{axis}.type": "linear", f"{axis}.tickvals": None, f"{axis}.ticktext": None}]},
                 {"label": "log", "method": "relayout", "args": [log]}]}]


# Line charts: hovering a step shows every run's value there (TensorBoard's and W&B's way).
UNIFIED = {"hovermode": "x unified"}


# ---------------------------------------------------------------------------------------
# Charts of runs


def _label_map(section: Section) -> dict[int, str]:
    labels: dict[int, str] = {}
    for c in section.comparisons:
        labels.setdefault(id(c.base), c.base_label)
        labels.setdefault(id(c.cand), c.cand_label)
    for r in section.runs:
        labels.setdefault(id(r), r.label)
    seen: dict[str, int] = {}
    for r in section.runs:  # repeats of one branch share a label: number them
        seen[labels[id(r)]] = seen.get(labels[id(r)], 0) + 1
    count: dict[str, int] = {}
    for r in section.runs:
        lab = labels[id(r)]
        if seen[lab] > 1:
            count[lab] = count.get(lab, 0) + 1
            labels[id(r)] = f"{lab} #{count[lab]}"
    return labels


def _colors(section: Section) -> dict[int, str]:
    """Repeats of one branch share its colour (nightly); otherwise one colour per run."""
    if section.run_sets:
        branches: dict[str, str] = {}
        for r in section.runs:
            branches.setdefault(r.branch or r.label, COLORS[len(branches) % len(COLORS)])
        return {id(r): branches[r.branch or r.label] for r in section.runs}
    return {id(r): COLORS[i % len(COLORS)] for i, r in enumerate(section.runs)}


def charts_html(section: Section, key: str) -> str:
    labels, colors = _label_map(section), _colors(section)
    loss: list[dict[str, Any]] = []
    times: list[dict[str, Any]] = []
    boxes: list[dict[str, Any]] = []
    bulk: list[float] = []
    medians: list[float] = []
    extra: dict[str, list[dict[str, Any]]] = {}
    for rec in section.runs:
        color, label = colors[id(rec)], esc(labels[id(rec)])
        final = rec.final_mask()
        lp = _thin(sorted((float(s), v) for s, v, f in zip(rec.steps.step, rec.steps.loss, final, strict=True)
                          if f and math.isfinite(v)))
        if lp:
            raw_i = len(loss)
            xs, ys = [p[0] for p in lp], [p[1] for p in lp]
            loss.append({"type": "scatter", "mode": "markers", "x": xs, "y": ys, "name": f"{label} (raw)",
                         "legendgroup": label, "showlegend": False, "opacity": 0.25,
                         "marker": {"color": color, "size": 4},
                         "hovertemplate": f"{label} raw %{{y:.5g}}<extra></extra>"})
            loss.append({"type": "scatter", "mode": "lines", "x": xs, "y": smooth(ys, DEFAULT_SMOOTHING),
                         "name": label, "legendgroup": label, "line": {"color": color, "width": 2},
                         "meta": {"raw": raw_i},
                         "hovertemplate": f"{label} smoothed %{{y:.5g}}<extra></extra>"})
        tp = _thin([(float(s), v) for s, v in zip(rec.steps.step, rec.steps.seconds, strict=True)
                    if math.isfinite(v)])
        if not tp:
            continue
        bulk += [p[1] for p in tp]
        medians.append(statistics.median(p[1] for p in tp))
        times.append({"type": "scatter", "mode": "lines", "x": [p[0] for p in tp], "y": [p[1] for p in tp],
                      "name": label, "legendgroup": label, "line": {"color": color, "width": 1.5},
                      "xaxis": "x", "yaxis": "y",
                      "hovertemplate": f"{label} %{{y:.4g}} s<extra></extra>"})
        for name, series in _extra_series(rec).items():
            extra.setdefault(name, []).append({
                "type": "scatter", "mode": "lines", "x": series[0], "y": series[1], "name": label,
                "legendgroup": label, "line": {"color": color, "width": 1.5},
                "hovertemplate": f"{label} %{{y:.4g}}<extra></extra>"})
        at = dict(tp)
        ev_x, ev_y, ev_t = [], [], []
        for ev in rec.checkpoints[:MAX_EVENTS]:
            if ev["event"] in ("blocked", "waited", "started"):
                sec = f" {ev['seconds']:.3f} s" if ev.get("seconds") is not None else ""
                ev_x.append(float(ev["step"]))
                ev_y.append(at.get(float(ev["step"]), tp[-1][1]))
                ev_t.append(esc(f"checkpoint {ev['event']} at step {ev['step']}{sec}"))
        if ev_x:
            times.append({"type": "scatter", "mode": "markers", "x": ev_x, "y": ev_y, "text": ev_t,
                          "name": f"{label} checkpoints", "legendgroup": label, "showlegend": False,
                          "marker": {"color": color, "symbol": "diamond-open", "size": 10, "line": {"width": 2}},
                          "xaxis": "x", "yaxis": "y", "meta": {"kind": "checkpoint"},
                          "hovertemplate": f"{label}<br>%{{text}}<extra></extra>"})
        boxes.append({"type": "box", "y": [p[1] for p in tp], "name": label, "legendgroup": label, "showlegend": False,
                      "marker": {"color": color}, "boxpoints": "outliers", "xaxis": "x2", "yaxis": "y2",
                      "hovertemplate": f"{label}<br>%{{y:.4g}} s<extra></extra>"})
    parts = []
    if loss:
        parts.append(
            '<figure><div class="controls">Smoothing <input type="range" class="smoothing" min="0" max="0.99" '
            f'step="0.01" value="{DEFAULT_SMOOTHING}" oninput="xrunApplySmoothing(parseFloat(this.value))"> '
            f'<span class="smoothing-value">{DEFAULT_SMOOTHING:.2f}</span></div>'
            + _plot(f"loss-{key}", loss, {"title": {"text": "Loss"}, "xaxis": {"title": {"text": "step"}},
                                           "yaxis": {"title": {"text": "loss"}}, **UNIFIED,
                                           "updatemenus": _axis_buttons(values=[y for t in loss for y in t["y"]])},
                    smooth_ctl=True)
            + f"<figcaption>Loss by step of {len(loss) // 2} run(s) (the last execution of each step after "
              "restarts): smoothed line (slider above) over faint raw points; hovering a step lists every "
              "run's value there; drag to zoom, double-click to reset, click a legend entry to hide a run."
              "</figcaption></figure>")
    if times:
        # Zoomed on the steps, not on compilation and stalls: 3x the slowest run's median.
        top = 3 * max(medians) if medians else None
        above = sum(1 for v in bulk if top is not None and v > top)
        yaxis = {"title": {"text": "seconds per step"}, "domain": [0, 1]}
        if top and above:
            yaxis["range"] = [0, top]
            zoom = (f"The y axis shows 0–{top:.3g} s (3x the slowest run's median step): {above} step(s) "
                    "above it (compilation, checkpoint stalls) are off the chart; double-click to see all.")
        else:
            zoom = "The y axis shows every step."
        parts.append(
            "<figure>" + _plot(f"steptime-{key}", times + boxes, {
                "title": {"text": "Seconds per step"}, "xaxis": {"title": {"text": "step"}, "domain": [0, 0.72]},
                "yaxis": yaxis, "xaxis2": {"domain": [0.78, 1], "anchor": "y2", "showticklabels": False,
                           "title": {"text": "each run (hover)"}},
                "yaxis2": {"anchor": "x2", "title": {"text": "distribution"}, "matches": "y"}, **UNIFIED,
                "updatemenus": _axis_buttons(values=bulk)})
            + f"<figcaption>Seconds of every executed step of {len(medians)} run(s); diamonds mark each run's "
              "checkpoint saves on its own series; hovering a step lists every run's time there. Right: each "
              f"run's step-time distribution. {zoom}</figcaption></figure>")
    for name, (title, axis, what) in EXTRA_CHARTS.items():
        traces = extra.get(name)
        if not traces:
            continue
        yaxis = {"title": {"text": axis}}
        medians_x = [statistics.median(t["y"]) for t in traces if t["y"]]
        top_x = 3 * max(medians_x) if medians_x else None
        off = sum(1 for t in traces for y in t["y"] if top_x is not None and y > top_x)
        zoom_x = ""
        if top_x and off and name == "tokens_per_s":  # a step cut short by async dispatch spikes
            yaxis["range"] = [0, top_x]
            zoom_x = (f" The y axis shows 0–{top_x:.3g} (3x the highest run median): {off} step(s) above "
                      "it are off the chart; double-click to see all.")
        parts.append(
            "<figure>" + _plot(f"{PLOT_IDS[name]}-{key}", traces, {
                "title": {"text": title}, "xaxis": {"title": {"text": "step"}},
                "yaxis": yaxis, **UNIFIED,
                "updatemenus": _axis_buttons(values=[y for t in traces for y in t["y"]])}, height=320)
            + f"<figcaption>{what} by step of {len(traces)} run(s), as the step records say; hovering a step "
              f"lists every run's value there.{zoom_x}</figcaption></figure>")
    gp = [(labels[id(r)], _gp(section, r)) for r in section.runs if r.steps.count]
    if gp:
        data = [{"type": "bar", "orientation": "h", "name": cat.replace("_", " "),
                 "y": [esc(lab) for lab, _ in gp], "x": [round(g["categories"].get(cat, 0.0), 3) for _, g in gp],
                 "marker": {"color": GOODPUT_COLORS[cat]},
                 "hovertemplate": "%{y}<br>" + cat.replace("_", " ") + " %{x:.1f} s<extra></extra>"}
                for cat in CATEGORIES]
        parts.append("<figure>" + _plot(f"goodput-{key}", data, {
            "barmode": "stack", "title": {"text": "Where the wall time went (goodput)"},
            "xaxis": {"title": {"text": "seconds"}}, "yaxis": {"automargin": True}},
            height=max(300, 90 + 28 * len(gp)))
            + "<figcaption>Each bar is one run's wall time, split into what it went to; the parts sum to "
              "the wall time. Productive: the final steps at the run's own best steady rate; slow steps: "
              "their time beyond it.</figcaption></figure>")
    return "".join(parts)


# Charts drawn when the runs' records have the figure: (title, y axis, caption's subject).
EXTRA_CHARTS = {
    "tokens_per_s": ("Tokens/s (all devices)", "tokens/s", "Tokens per second over all devices"),
    "learning_rate": ("Learning rate", "learning rate", "The learning rate"),
    "grad_norm": ("Gradient norm", "grad norm", "The global gradient norm"),
}


PLOT_IDS = {"tokens_per_s": "tokens", "learning_rate": "lr", "grad_norm": "gradnorm"}


def _extra_series(rec: RunRecord) -> dict[str, tuple[list[float], list[float]]]:
    """Per-step figures beyond loss and step time that ``rec`` has, thinned for a chart."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    devices = rec.devices or 1
    final = rec.final_mask()
    tok = _thin([(float(s), t * devices) for s, t, f in zip(rec.steps.step, rec.steps.tokens, final, strict=True)
                 if f and math.isfinite(t)])
    if tok:
        out["tokens_per_s"] = ([p[0] for p in tok], [p[1] for p in tok])
    for name, (steps, values) in rec.extra.items():
        last = dict(zip(steps, values, strict=True))  # a redone step: its last value
        pts = _thin(sorted((float(s), v) for s, v in last.items() if math.isfinite(v)))
        if pts:
            out[name] = ([p[0] for p in pts], [p[1] for p in pts])
    return out


def _gp(section: Section, rec: RunRecord) -> dict:
    for c in section.comparisons:
        if c.base is rec:
            return c.base_fig.goodput
        if c.cand is rec:
            return c.cand_fig.goodput
    from orchestrator.analysis.goodput import goodput

    return goodput(rec)


# ---------------------------------------------------------------------------------------
# Trend over nights


def trend_html(trend: dict[str, Any], key: str, caption: bool = True) -> str:
    """One metric over the last nights: each night's runs as points, the median as a line per
    branch; the base's change points as dashed lines with the bracketing commits."""
    data = []
    for i, (branch, ns) in enumerate(trend["nights"].items()):
        color = COLORS[i % len(COLORS)]
        b = esc(branch)
        px = [n["nightly"] for n in ns for _ in n["values"]]
        py = [v for n in ns for v in n["values"]]
        pt = [esc(f"{r} ({short_commit(n['commit'])})") for n in ns for r in n["runs"]]
        data.append({"type": "scatter", "mode": "markers", "x": px, "y": py, "text": pt, "name": f"{b} runs",
                     "legendgroup": b, "showlegend": False, "opacity": 0.45, "marker": {"color": color, "size": 6},
                     "hovertemplate": f"{b}<br>%{{x}}<br>%{{y:.5g}}<br>%{{text}}<extra></extra>"})
        med = [(n["nightly"], statistics.median(n["values"])) for n in ns if n["values"]]
        data.append({"type": "scatter", "mode": "lines+markers", "x": [m[0] for m in med], "y": [m[1] for m in med],
                     "name": b, "legendgroup": b, "line": {"color": color, "width": 2},
                     "hovertemplate": f"{b} median<br>%{{x}}<br>%{{y:.5g}}<extra></extra>"})
    shapes, notes = [], []
    for cp in trend["change_points"]:
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": cp["nightly"], "x1": cp["nightly"],
                       "y0": 0, "y1": 1, "line": {"dash": "dash", "color": "#b00020", "width": 1.5}})
        span = f"{short_commit(cp['before_commit'])} → {short_commit(cp['after_commit'])}"
        notes.append({"x": cp["nightly"], "y": 1, "yref": "paper", "showarrow": False, "yanchor": "bottom",
                      "text": esc(f"{cp['delta_pct']:+.1f}% ({span})"),
                      "font": {"color": "#b00020"}})
    return ("<figure>" + _plot(f"trend-{key}", data, {
        "title": {"text": esc(f"{trend['label']} over nights ({trend['config']})")},
        "xaxis": {"type": "category", "title": {"text": "nightly"}}, "yaxis": {"title": {"text": esc(trend['label'])}},
        "shapes": shapes, "annotations": notes, "updatemenus": _axis_buttons()}, height=320)
        + ("<figcaption>" + esc(" ".join(cp["text"] + "." for cp in trend["change_points"])
                                or "No step change beyond noise between nights on the base.") + "</figcaption>"
           if caption else "") + "</figure>")


# ---------------------------------------------------------------------------------------
# HTML


def _diff_html(row: Row) -> str:
    text = esc(row.diff)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    cls = "v-" + row.verdict.replace(" ", "-") if row.verdict else ""
    return f'<td class="num {cls}" data-verdict="{esc(row.verdict)}">{text}</td>'


VERDICT_CLASS = {"ok": "good", "regressed": "bad", "failed": "bad", "not comparable": "warn"}


def _verdict_div(kind: str, line: str) -> str:
    return f'<div class="verdict {VERDICT_CLASS.get(kind, "warn")}" data-verdict="{esc(kind)}">{esc(line)}</div>'


def comparison_html(c: Comparison, owner: RunSetComparison | None = None) -> str:
    """One pair's table. As supporting detail of repeated runs (``owner``) its banner is the
    run-level verdict of the same pair, never a second one that could disagree."""
    parts = [f'<h3>{esc(c.cand_label)} vs {esc(c.base_label)}</h3>']
    if owner is not None:
        kind, line = owner.verdict
        parts.append(_verdict_div(kind, f"verdict for this pair (run-level, above): {line}"))
    else:
        parts.append(_verdict_div(*c.verdict))
    if c.warnings:
        parts.append('<ul class="warnings">' + "".join(f"<li>Warning: {esc(w)}</li>" for w in c.warnings) + "</ul>")
    head = (f"<tr><th>Metric</th><th>{esc(c.base_label)}</th><th>{esc(c.cand_label)}</th>"
            f"<th>Diff ({esc(c.cand_label)} − {esc(c.base_label)})</th></tr>")
    body = "".join(
        f"<tr><td>{esc(r.metric)}</td><td class=\"num\">{esc(r.base)}</td><td class=\"num\">{esc(r.cand)}</td>"
        f"{_diff_html(r)}</tr>" for r in c.rows)
    parts.append(f'<table class="cmp"><thead>{head}</thead><tbody>{body}</tbody></table>')
    # Outlier steps: one line that says how many, the steps themselves a click away.
    sides = ((c.base_fig, c.base_label), (c.cand_fig, c.cand_label))
    outlier_notes = {f.outliers.note(lab) + "." for f, lab in sides if f.outliers.outliers}
    if outlier_notes:
        outlier_notes.add(OUTLIER_RULE + ".")
    notes = "".join(f"<li>{esc(n)}</li>" for n in c.notes if n not in outlier_notes)
    if outlier_notes:
        counts = ", ".join(f"{esc(lab)} {len(f.outliers.outliers)}" for f, lab in sides if f.outliers.outliers)
        inner = "".join(f"<li>{esc(n)}</li>" for n in c.notes if n in outlier_notes)
        notes += (f'<li><details class="outliers"><summary>Outlier steps, kept out of steady state: {counts}'
                  f"</summary><ul>{inner}</ul></details></li>")
    parts.append(f'<ul class="notes">{notes}</ul>')
    return "".join(parts)


def run_set_html(rs: RunSetComparison) -> str:
    """The run-level table of repeated runs (what the nightly verdict rests on)."""
    head = (f"<tr><th>Metric (per-run median)</th><th>{esc(rs.base_label)}</th><th>{esc(rs.cand_label)}</th>"
            f"<th>Diff ({esc(rs.cand_label)} − {esc(rs.base_label)})</th></tr>")
    body = "".join(
        f"<tr><td>{esc(r.metric)}</td><td class=\"num\">{esc(r.base)}</td><td class=\"num\">{esc(r.cand)}</td>"
        f"{_diff_html(r)}</tr>" for r in rs.rows)
    return (f'<h3>{esc(rs.cand_label)} vs {esc(rs.base_label)}: {rs.n_base} vs {rs.n_cand} runs</h3>'
            + _verdict_div(*rs.verdict) +
            f'<p class="meta">Basis: {esc(rs.basis)}.</p>'
            f'<table class="cmp runset"><thead>{head}</thead><tbody>{body}</tbody></table>')


def _goodput_cell(gp: dict) -> str:
    """The goodput line, then the first attempt's startup timeline (where "startup" went)."""
    startup = (gp.get("startup_timeline") or [])[:1]
    return esc(format_goodput(gp)) + "".join(f"<br>startup {esc(format_startup(t))}" for t in startup)


def runs_table(section: Section) -> str:
    labels = _label_map(section)
    rows = []
    for rec in section.runs:
        v = rec.versions
        state, msg = section.states.get(rec.name, (rec.outcome, ""))
        outcome = f"{state}: {msg}" if msg and state != "Succeeded" else state
        rows.append(
            f"<tr><td>{esc(labels[id(rec)])}</td><td>{esc(rec.name)}</td><td>{esc(outcome)}</td>"
            f"<td>{esc(rec.restarts)}</td><td>{esc(rec.steps.count)}</td>"
            f"<td>{esc(v.get('jax', '?'))} / {esc(v.get('jaxlib', '?'))}</td>"
            f"<td>{esc(rec.accelerator or '?')} ({esc(rec.devices or '?')} devices)</td>"
            f"<td>{_goodput_cell(_gp(section, rec))}</td><td>{esc(rec.source)}</td></tr>")
    shown = {rec.name for rec in section.runs}
    for name, (state, msg) in section.states.items():  # runs with no record (never started)
        if name not in shown:
            rows.append(f"<tr><td>-</td><td>{esc(name)}</td><td>{esc(f'{state}: {msg}' if msg else state)}</td>"
                        + "<td>-</td>" * 6 + "</tr>")
    return ('<table class="cmp runs"><thead><tr><th>Run</th><th>Name</th><th>Outcome</th><th>Restarts</th>'
            '<th>Steps</th><th>JAX / jaxlib</th><th>Accelerator</th><th>Goodput</th><th>Source</th></tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


def profile_html(section: Section) -> str:
    """Each run's ``profile=START:STEPS`` trace: where, and its top ops by device time."""
    labels = _label_map(section)
    parts = []
    for rec in section.runs:
        pr = rec.profile
        if not pr:
            continue
        steps = pr.get("steps") or ["?", "?"]
        head = (f"<h3>Profile of {esc(labels[id(rec)])}: steps {esc(steps[0])}-{esc(steps[-1])}</h3>"
                f'<p class="meta">{esc(pr.get("path"))} (tensorboard --logdir there, Profile tab)</p>')
        summary = pr.get("top_ops")
        if not summary:
            parts.append(head + f"<p>Top ops not read: {esc(pr.get('top_ops_error', 'no summary'))}</p>")
            continue
        rows = "".join(f"<tr><td>{esc(o['name'])}</td><td class=\"num\">{1e3 * o['seconds']:.4g}</td>"
                       f"<td class=\"num\">{100 * o['share']:.1f}%</td><td class=\"num\">{esc(o['count'])}</td></tr>"
                       for o in summary.get("ops") or [])
        parts.append(head + f'<p class="meta">Top ops by device time (self time) of '
                            f'{1e3 * float(summary.get("total_s") or 0):.4g} ms on {esc(summary.get("where"))}</p>'
                            '<table class="cmp profile"><thead><tr><th>Op</th><th>ms</th><th>Share</th>'
                            f"<th>Count</th></tr></thead><tbody>{rows}</tbody></table>")
    return "".join(parts)


def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().replace("</script", "<\\/script")


def render_report(sections: Sequence[Section], title: str = "xrun comparison report", subtitle: str = "",
                  trends: Sequence[dict[str, Any]] = (), verdict: tuple[str, str] | None = None) -> str:
    """The whole page, plotly.js inlined. Every string from a run is escaped."""
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    if verdict is not None:
        summary = f'<div class="verdict {"good" if verdict[0] == "within noise" else "bad"}">{esc(verdict[1])}</div>'
    else:
        regressed = [c for s in sections for c in (s.run_sets or s.comparisons) if c.regressed]
        apart = [c for s in sections for c in s.comparisons if c.not_comparable and not c.regressed]
        compared = any(s.comparisons for s in sections)
        summary = (f'<div class="verdict bad">{len(regressed)} comparison(s) regressed</div>' if regressed
                   else f'<div class="verdict warn">{len(apart)} comparison(s) not comparable: different '
                        'shapes</div>' if apart
                   else '<div class="verdict good">nothing regressed beyond the threshold</div>' if compared
                   else '<div class="verdict good">single run: no comparison</div>')
    body = [f"<h1>{esc(title)}</h1>", f'<p class="meta">{esc(subtitle + " · " if subtitle else "")}generated {now}</p>',
            summary]
    for i, s in enumerate(sections):
        body.append(f'<section id="section-{i}"><h2>{esc(s.title)}</h2>')
        for rs in s.run_sets:
            body.append(run_set_html(rs))
        if s.run_sets and s.comparisons:
            body.append("<h3>Per-step detail (first run of each side)</h3>")
        owners = {id(rs.per_step): rs for rs in s.run_sets if rs.per_step is not None}
        for c in s.comparisons:
            body.append(comparison_html(c, owners.get(id(c))))
        body.append(charts_html(s, str(i)))
        body.append(runs_table(s))
        body.append(profile_html(s))
        body.append("</section>")
    if trends:
        body.append('<section id="trends"><h2>Trend over nights</h2>')
        nights = max((len(ns) for t in trends for ns in t["nights"].values()), default=0)
        if nights < 2:  # said once, not under each chart
            body.append("<p>One night so far: a step change between nights needs nights on both sides.</p>")
        body += [trend_html(t, str(i), caption=nights >= 2) for i, t in enumerate(trends)
                 if any(n["values"] for ns in t["nights"].values() for n in ns)]
        body.append("</section>")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style>"
            f"<script>{_plotly_js()}</script><script>{SCRIPT}</script></head><body>{''.join(body)}</body></html>\n")


def report_for(base: RunRecord, candidates: Sequence[RunRecord], comparisons: Sequence[Comparison],
               title: str = "xrun comparison report") -> str:
    """``xrun report``: one section with every run and each candidate's comparison; with no
    candidate, a single-run report (charts and the run's table)."""
    if not comparisons and title == "xrun comparison report":
        title = "xrun run report"  # one run: nothing is compared
    return render_report([Section("Runs", [base, *candidates], list(comparisons))], title,
                         subtitle=f"base {comparisons[0].base_label}" if comparisons else base.label)
