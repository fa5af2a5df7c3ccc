"""The comparison report as one self-contained HTML file (inline CSS and SVG, no scripts).

People read it every morning, often offline or from a bucket, so nothing is fetched: the
tables, warnings, loss curves, step-time plots (checkpoint events marked) and goodput bars
are all in the file. Step-time plots clip their y axis above the bulk of the samples so one
checkpoint stall cannot flatten every other step; clipped points are drawn at the top edge
and the caption says how many there were.
"""

from __future__ import annotations

import datetime as _dt
import html
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.analysis.compare import Comparison, Row
from orchestrator.analysis.goodput import CATEGORIES, format_goodput
from orchestrator.readers.record import RunRecord

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
GOODPUT_COLORS = {
    "productive": "#2ca02c", "startup": "#7f7f7f", "compilation": "#bcbd22", "checkpoint": "#ff7f0e",
    "restarts": "#d62728", "redone_steps": "#e377c2", "other": "#c7c7c7",
}
MAX_POINTS = 600  # per series in a chart
MAX_EVENTS = 200  # checkpoint markers per run

CSS = """
body{font-family:-apple-system,"Segoe UI",Roboto,"DejaVu Sans",Arial,sans-serif;margin:24px;color:#1b1b1b;background:#fff;max-width:1200px}
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
figure{margin:12px 0}figcaption{font-size:.85em;color:#444;margin-top:2px}
svg.chart{background:#fff;border:1px solid #e0e0e0}svg text{font-size:11px;fill:#333}
.runs td{font-size:.85em}
"""


@dataclass
class Section:
    """One group of runs (a nightly config): the runs and each candidate's comparison."""

    title: str
    runs: list[RunRecord]
    comparisons: list[Comparison] = field(default_factory=list)


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


# ---------------------------------------------------------------------------------------
# SVG charts


def _nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        hi = lo + 1 if math.isfinite(lo) else 1.0
        lo = lo if math.isfinite(lo) else 0.0
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def _tick_label(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.4g}"


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


@dataclass
class Series:
    label: str
    color: str
    points: list[tuple[float, float]]
    events: list[tuple[float, str]] = field(default_factory=list)  # (x, tooltip)


def line_chart(chart_id: str, series: Sequence[Series], x_label: str, y_label: str,
               width: int = 1000, height: int = 320, clip_quantile: float | None = None) -> tuple[str, str]:
    """An SVG line chart; returns (svg, caption addition). Clipping keeps outliers on the top
    edge (drawn as triangles) instead of letting them set the scale."""
    ml, mr, mt, mb = 64, 16, 26, 40
    pw, ph = width - ml - mr, height - mt - mb
    xs = [p[0] for s in series for p in s.points]
    ys = [p[1] for s in series for p in s.points if math.isfinite(p[1])]
    if not xs or not ys:
        return (f'<svg class="chart" id="{esc(chart_id)}" width="{width}" height="80" role="img">'
                f'<text x="{ml}" y="40">no data</text></svg>', "")
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x1 = x0 + 1
    y0, y1 = min(ys), max(ys)
    caption = ""
    if clip_quantile is not None and len(ys) >= 20:
        srt = sorted(ys)
        q = srt[int(clip_quantile * (len(srt) - 1))]
        limit = q * 1.5 if q > 0 else y1
        if y1 > limit:
            clipped = sum(1 for y in ys if y > limit)
            caption = (f" The y axis is cut at {_tick_label(limit)} s (1.5 x the {int(clip_quantile * 100)}th "
                       f"percentile); {clipped} slower step(s) are drawn as triangles on the top edge.")
            y1 = limit
    pad = (y1 - y0) * 0.05 or abs(y1) * 0.05 or 1.0
    y0, y1 = (max(0.0, y0 - pad) if y0 >= 0 else y0 - pad), y1 + pad

    def sx(x: float) -> float:
        return ml + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return mt + ph - (min(y, y1) - y0) / (y1 - y0) * ph

    out = [f'<svg class="chart" id="{esc(chart_id)}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{esc(y_label)} by {esc(x_label)}">']
    for t in _nice_ticks(y0, y1):
        y = sy(t)
        out.append(f'<line x1="{ml}" y1="{y:.1f}" x2="{ml + pw}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{ml - 6}" y="{y + 4:.1f}" text-anchor="end">{esc(_tick_label(t))}</text>')
    for t in _nice_ticks(x0, x1, 8):
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" y1="{mt + ph}" x2="{x:.1f}" y2="{mt + ph + 4}" stroke="#999"/>'
                   f'<text x="{x:.1f}" y="{mt + ph + 16}" text-anchor="middle">{esc(_tick_label(t))}</text>')
    out.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    out.append(f'<text x="{ml + pw / 2}" y="{height - 6}" text-anchor="middle">{esc(x_label)}</text>')
    out.append(f'<text x="14" y="{mt + ph / 2}" text-anchor="middle" transform="rotate(-90 14 {mt + ph / 2})">'
               f'{esc(y_label)}</text>')
    for s in series:
        for x, tip in s.events[:MAX_EVENTS]:
            px = sx(x)
            out.append(f'<line class="ckpt" x1="{px:.1f}" y1="{mt}" x2="{px:.1f}" y2="{mt + ph}" '
                       f'stroke="{s.color}" stroke-opacity="0.45" stroke-dasharray="4 3">'
                       f'<title>{esc(s.label)}: {esc(tip)}</title></line>')
    for s in series:
        pts = [(x, y) for x, y in _thin(s.points) if math.isfinite(y)]
        if not pts:
            continue
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        out.append(f'<polyline class="series" fill="none" stroke="{s.color}" stroke-width="1.6" '
                   f'points="{coords}"><title>{esc(s.label)}</title></polyline>')
        for x, y in pts:
            if y > y1:
                px, py = sx(x), mt + 1
                out.append(f'<path d="M{px - 4:.1f},{py + 7:.1f} L{px + 4:.1f},{py + 7:.1f} L{px:.1f},{py:.1f} Z" '
                           f'fill="{s.color}"><title>{esc(s.label)} step {x:g}: {y:.3f}</title></path>')
    lx = ml + 8
    for i, s in enumerate(series):
        y = mt + 8 + 18 * i
        out.append(f'<rect class="legend" x="{lx}" y="{y}" width="18" height="12" fill="{s.color}"/>'
                   f'<text x="{lx + 24}" y="{y + 10}">{esc(s.label)}</text>')
    out.append("</svg>")
    return "".join(out), caption


def goodput_chart(chart_id: str, runs: Sequence[tuple[str, dict]], width: int = 1000) -> str:
    """Stacked horizontal bars: each run's wall time split by goodput category."""
    row_h, ml, mr, mt = 26, 220, 16, 10
    height = mt + row_h * len(runs) + 36
    pw = width - ml - mr
    longest = max((gp["wall_s"] for _, gp in runs), default=0) or 1.0
    out = [f'<svg class="chart" id="{esc(chart_id)}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="goodput">']
    for i, (label, gp) in enumerate(runs):
        y = mt + i * row_h
        out.append(f'<text x="{ml - 8}" y="{y + 15}" text-anchor="end">{esc(label[:34])}</text>')
        x = float(ml)
        for cat in CATEGORIES:
            sec = gp["categories"].get(cat, 0.0)
            if sec <= 0:
                continue
            w = sec / longest * pw
            out.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{max(w, 0.5):.1f}" height="{row_h - 8}" '
                       f'fill="{GOODPUT_COLORS[cat]}"><title>{esc(label)}: {cat} {sec:.1f} s</title></rect>')
            x += w
        out.append(f'<text x="{min(x + 4, width - 60):.1f}" y="{y + 15}">{gp["goodput_pct"]:.0f}%</text>')
    ly = mt + row_h * len(runs) + 20
    lx = ml
    for cat in CATEGORIES:
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{GOODPUT_COLORS[cat]}"/>'
                   f'<text x="{lx + 14}" y="{ly}">{cat.replace("_", " ")}</text>')
        lx += 14 + 8 * len(cat) + 16
    out.append("</svg>")
    return "".join(out)


# ---------------------------------------------------------------------------------------
# HTML


def _diff_html(row: Row) -> str:
    text = esc(row.diff)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    cls = "v-" + row.verdict.replace(" ", "-") if row.verdict else ""
    return f'<td class="num {cls}" data-verdict="{esc(row.verdict)}">{text}</td>'


def comparison_html(c: Comparison) -> str:
    parts = []
    verdict = ("bad", f"REGRESSED: {', '.join(r.metric for r in c.regressions) or 'candidate failed'}") \
        if c.regressed else ("good", "no regression beyond the threshold")
    parts.append(f'<h3>{esc(c.cand_label)} vs {esc(c.base_label)}</h3>')
    parts.append(f'<div class="verdict {verdict[0]}">{esc(verdict[1])}</div>')
    if c.warnings:
        parts.append('<ul class="warnings">' + "".join(f"<li>Warning: {esc(w)}</li>" for w in c.warnings) + "</ul>")
    head = (f"<tr><th>Metric</th><th>{esc(c.base_label)}</th><th>{esc(c.cand_label)}</th>"
            f"<th>Diff ({esc(c.cand_label)} − {esc(c.base_label)})</th></tr>")
    body = "".join(
        f"<tr><td>{esc(r.metric)}</td><td class=\"num\">{esc(r.base)}</td><td class=\"num\">{esc(r.cand)}</td>"
        f"{_diff_html(r)}</tr>" for r in c.rows)
    parts.append(f'<table class="cmp"><thead>{head}</thead><tbody>{body}</tbody></table>')
    parts.append('<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in c.notes) + "</ul>")
    return "".join(parts)


def _label_map(section: Section) -> dict[int, str]:
    labels: dict[int, str] = {}
    for c in section.comparisons:
        labels.setdefault(id(c.base), c.base_label)
        labels.setdefault(id(c.cand), c.cand_label)
    for r in section.runs:
        labels.setdefault(id(r), r.label)
    return labels


def charts_html(section: Section, key: str) -> str:
    labels = _label_map(section)
    loss, times = [], []
    for i, rec in enumerate(section.runs):
        color = COLORS[i % len(COLORS)]
        label = labels[id(rec)]
        final = rec.final_mask()
        lp = sorted((float(s), v) for s, v, f in zip(rec.steps.step, rec.steps.loss, final, strict=True)
                    if f and math.isfinite(v))
        loss.append(Series(label, color, lp))
        tp = [(float(s), v) for s, v in zip(rec.steps.step, rec.steps.seconds, strict=True) if math.isfinite(v)]
        events = []
        for ev in rec.checkpoints:
            if ev["event"] in ("blocked", "waited", "started"):
                sec = f" {ev['seconds']:.3f} s" if ev.get("seconds") is not None else ""
                events.append((float(ev["step"]), f"checkpoint {ev['event']} at step {ev['step']}{sec}"))
        times.append(Series(label, color, tp, events))
    loss_svg, _ = line_chart(f"loss-{key}", loss, "step", "loss")
    time_svg, clip_note = line_chart(f"steptime-{key}", times, "step", "seconds per step", clip_quantile=0.95)
    gp = [(labels[id(r)], _gp(section, r)) for r in section.runs]
    return (
        f'<figure><div>{loss_svg}</div><figcaption>Loss by step (the last run of each step after restarts).'
        f'</figcaption></figure>'
        f'<figure><div>{time_svg}</div><figcaption>Seconds per step, every executed step; dashed lines mark '
        f'checkpoint saves (hover for blocking time).{esc(clip_note)}</figcaption></figure>'
        f'<figure><div>{goodput_chart(f"goodput-{key}", gp)}</div><figcaption>Where the wall time went '
        f'(goodput).</figcaption></figure>'
    )


def _gp(section: Section, rec: RunRecord) -> dict:
    for c in section.comparisons:
        if c.base is rec:
            return c.base_fig.goodput
        if c.cand is rec:
            return c.cand_fig.goodput
    from orchestrator.analysis.goodput import goodput

    return goodput(rec)


def runs_table(section: Section) -> str:
    labels = _label_map(section)
    rows = []
    for rec in section.runs:
        v = rec.versions
        rows.append(
            f"<tr><td>{esc(labels[id(rec)])}</td><td>{esc(rec.name)}</td><td>{esc(rec.outcome)}</td>"
            f"<td>{esc(rec.restarts)}</td><td>{esc(rec.steps.count)}</td>"
            f"<td>{esc(v.get('jax', '?'))} / {esc(v.get('jaxlib', '?'))}</td>"
            f"<td>{esc(rec.accelerator or '?')} ({esc(rec.devices or '?')} devices)</td>"
            f"<td>{esc(format_goodput(_gp(section, rec)))}</td><td>{esc(rec.source)}</td></tr>")
    return ('<table class="cmp runs"><thead><tr><th>Run</th><th>Name</th><th>Outcome</th><th>Restarts</th>'
            '<th>Steps</th><th>JAX / jaxlib</th><th>Accelerator</th><th>Goodput</th><th>Source</th></tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


def render_report(sections: Sequence[Section], title: str = "xrun comparison report",
                  subtitle: str = "") -> str:
    """The whole page. Every string from a run is escaped."""
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    regressed = [c for s in sections for c in s.comparisons if c.regressed]
    summary = (f'<div class="verdict bad">{len(regressed)} comparison(s) regressed</div>' if regressed
               else '<div class="verdict good">nothing regressed beyond the threshold</div>')
    body = [f"<h1>{esc(title)}</h1>", f'<p class="meta">{esc(subtitle + " · " if subtitle else "")}generated {now}</p>',
            summary]
    for i, s in enumerate(sections):
        body.append(f'<section id="section-{i}"><h2>{esc(s.title)}</h2>')
        for c in s.comparisons:
            body.append(comparison_html(c))
        body.append(charts_html(s, str(i)))
        body.append(runs_table(s))
        body.append("</section>")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>{''.join(body)}</body></html>\n")


def report_for(base: RunRecord, candidates: Sequence[RunRecord], comparisons: Sequence[Comparison],
               title: str = "xrun comparison report") -> str:
    """``xrun report``: one section with every run and each candidate's comparison."""
    return render_report([Section("Runs", [base, *candidates], list(comparisons))], title,
                         subtitle=f"base {comparisons[0].base_label}" if comparisons else "")
