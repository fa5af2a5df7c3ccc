"""`xrun report`: one self-contained HTML file (plotly.js inlined), checked in headless
Chromium (Debian's `chromium`, installed by .ci/install-chromium.sh): it renders, the tables
and charts have real size and data, checkpoint saves are marked on each run's series, nothing
is fetched from the network, hovering a point shows its value, the smoothing control and the
log switch work, and a screenshot shows them (pixels, not blank)."""

from __future__ import annotations

import html
import json
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

import pytest
from cli_helpers import xrun
from synthetic_runs import RunShape, write_log, write_stored_run

from orchestrator.analysis.compare import compare
from orchestrator.analysis.report import COLORS, GOODPUT_COLORS, Section, render_report
from orchestrator.readers.loaders import load_run

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--virtual-time-budget=10000"]

PROBE = """<script>
window.addEventListener('load', function () { setTimeout(function () {
  const q = s => Array.from(document.querySelectorAll(s));
  const box = e => { const b = e.getBoundingClientRect(); return [Math.round(b.width), Math.round(b.height)]; };
  const tables = q('table.cmp:not(.runs):not(.runset)');
  const plots = q('.plot').map(d => ({id: d.id, box: box(d), svg: d.querySelectorAll('.main-svg').length,
    traces: (d.data || []).map(t => ({name: t.name, type: t.type, n: (t.y || []).length, \
kind: (t.meta || {}).kind || '',
                                     raw: (t.meta || {}).raw === undefined ? -1 : t.meta.raw,
                                     legend: t.showlegend !== false})),
    buttons: d.querySelectorAll('.updatemenu-button').length, legendItems: d.querySelectorAll('.legend .traces').length,
    legendRight: (() => { const l = d.querySelector('.legend'), p = d.querySelector('.nsewdrag');
                          return l && p ? l.getBoundingClientRect().left >= \
p.getBoundingClientRect().right : false; })()}));
  // Hover: plotly's own hover on the first point of the first step-time series.
  const st = q('.plot').find(d => d.id.startsWith('steptime'));
  const loss0 = () => q('.plot').find(d => d.id.startsWith('loss'));
  Plotly.Fx.hover(st, [{curveNumber: 0, pointNumber: 5}]);
  const hover = st.querySelector('.hoverlayer').textContent;
  const hovered = st.data[0].y[5];
  // Hover by step (x unified): every run's value at that step, as TensorBoard lists them.
  Plotly.Fx.hover(loss0(), {xval: 30});
  const hoverAll = loss0().querySelector('.hoverlayer').textContent;
  // The log switch's ticks: 1-2-5 per decade, labelled in full.
  const logButton = (loss0().layout.updatemenus[0].buttons[1].args[0]);
  // Smoothing 0 makes the smoothed line the raw points; log switch changes the axis type.
  const loss = q('.plot').find(d => d.id.startsWith('loss'));
  xrunApplySmoothing(0);
  const sm = loss.data.find(t => t.meta && t.meta.raw !== undefined);
  const unsmoothed = JSON.stringify(sm.y) === JSON.stringify(loss.data[sm.meta.raw].y);
  Plotly.relayout(loss, logButton);  // what the "log" button does
  document.body.setAttribute('data-probe', JSON.stringify({
    tables: tables.map(t => ({box: box(t), \
rows: Array.from(t.rows).map(r => Array.from(r.cells).map(c => c.textContent))})),
    plots: plots, hover: hover, hovered: hovered, hoverAll: hoverAll, logTicks: logButton['yaxis.ticktext'],
    tickLabels: Array.from(loss.querySelectorAll('.ytick text')).map(t => t.textContent), unsmoothed: unsmoothed, \
logType: loss.layout.yaxis.type,
    requests: performance.getEntriesByType('resource').map(e => e.name),
    warnings: q('ul.warnings li').map(li => [li.textContent, box(li)[1]]),
    verdicts: q('.verdict').map(v => v.textContent),
  }));
}, 200); });
</script>"""


def chromium(*args: str, tmp: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium")
    assert exe, "chromium is not installed: run .ci/install-chromium.sh"
    return subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'chromium-profile'}", *args],
                          capture_output=True, text=True, timeout=timeout)


def decode_png(data: bytes) -> tuple[int, int, list[bytes], int]:
    """Width, height, unfiltered rows, bytes per pixel (8-bit RGB/RGBA PNGs)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, []
    w = h = ctype = 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    bpp = {2: 3, 6: 4}[ctype]
    raw = zlib.decompress(b"".join(idat))
    stride, prev, rows, i = w * bpp, bytearray(w * bpp), [], 0
    for _ in range(h):
        f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride) if f else ():
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], (prev[x - bpp] if x >= bpp else 0)
            if f == 1:
                pred = a
            elif f == 2:
                pred = b
            elif f == 3:
                pred = (a + b) // 2
            else:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            line[x] = (line[x] + pred) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, rows, bpp


@pytest.fixture(scope="module")
def report_file(tmp_path_factory) -> tuple[Path, object]:
    tmp = tmp_path_factory.mktemp("report")
    base = write_log(tmp / "main.log", RunShape(commit="abc1234aaaa", ckpt_every=20, stall_s=3.0, seed=1))
    slow = write_log(tmp / "slow.log", RunShape(commit="def5678bbbb", ckpt_every=20, stall_s=3.0, seed=2,
                                                seconds=0.18, jax="0.9.2"), absl=True)
    same = write_log(tmp / "same.log", RunShape(commit="0badcafe00", ckpt_every=20, stall_s=3.0, seed=3))
    out = tmp / "report.html"
    r = xrun("report", str(base), str(slow), str(same), "-o", str(out), storage=tmp / "root")
    assert r.returncode == 1, r.stderr  # the slow candidate regressed
    return out, r


def _page_without_library(text: str) -> str:
    """The page with plotly.js's own (inlined) source cut out: what we generate."""
    start = text.index("<script>") + len("<script>")
    return text[:start] + text[text.index("</script>", start):]


def test_the_report_is_one_self_contained_file(report_file):
    out, _ = report_file
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>")
    assert "plotly.js v" in text[:20000]  # the library is in the file, not fetched
    ours = _page_without_library(text)
    assert not re.search(r"<(link|img|iframe)\b", ours, re.I)
    assert not re.search(r"\b(src|href)\s*=", ours, re.I)  # no script src, no stylesheet: nothing to fetch
    assert not re.findall(r"https?://[^\s\"'<>]+", ours)
    assert re.findall(r'<div class="plot" id="([a-z]+)-0"', ours) == ["loss", "steptime", "tokens", "goodput"]


def test_the_report_renders_in_chromium_with_tables_charts_and_warnings(report_file, tmp_path):
    out, _ = report_file
    probe = tmp_path / "probe.html"
    probe.write_text(out.read_text().replace("</body>", PROBE + "</body>"))
    r = chromium("--dump-dom", "--window-size=1280,2000", probe.as_uri(), tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r'data-probe="([^"]*)"', r.stdout)
    assert m, "the page did not run to the end"
    got = json.loads(html.unescape(m[1]))
    assert got["requests"] == []  # no network request of any kind
    assert len(got["tables"]) == 2  # one per candidate
    for t in got["tables"]:
        assert t["box"][0] > 400 and t["box"][1] > 200
        assert [row[0] for row in t["rows"]][:8] == ["Metric", "Parameters", "Final loss", "TFLOP/s", "Tok/s",
                                                     "Avg s/step", "Memory %", "JAX"]
    head = got["tables"][0]["rows"][0]
    assert head == ["Metric", "main abc1234aaaa", "slow def5678bbbb", "Diff (slow def5678bbbb − main abc1234aaaa)"]
    steady = next(row for row in got["tables"][0]["rows"] if row[0].startswith("Steady"))
    assert "regressed" in steady[3]
    plots = {p["id"].split("-")[0]: p for p in got["plots"]}
    assert set(plots) == {"loss", "steptime", "tokens", "goodput"}
    for p in got["plots"]:
        assert p["svg"] >= 1 and p["box"][0] >= 900 and p["box"][1] >= 200, p
        assert p["legendRight"], p  # the legend sits outside (right of) the plot area
    loss = plots["loss"]["traces"]
    smoothed = [t for t in loss if t["raw"] >= 0]
    assert [t["name"] for t in smoothed] == ["main abc1234aaaa", "slow def5678bbbb", "same 0badcafe00"]
    assert all(loss[t["raw"]]["n"] == t["n"] > 50 for t in smoothed)  # smoothed over every raw point
    assert got["unsmoothed"] and got["logType"] == "log"
    assert plots["loss"]["buttons"] == 2 and plots["steptime"]["buttons"] == 2  # linear / log
    st = plots["steptime"]["traces"]
    assert [t["type"] for t in st].count("box") == 3  # one distribution per run next to the series
    ckpt = [t for t in st if t["kind"] == "checkpoint"]
    assert len(ckpt) == 3 and all(t["n"] == 3 * 2 for t in ckpt)  # 3 saves x (started, blocked) per run
    assert plots["steptime"]["legendItems"] == 3  # a run's series, marks and box toggle together
    assert f"{got['hovered']:.4g}" in got["hover"] and "main abc1234aaaa" in got["hover"]
    # Hovering step 30 of the loss chart lists every run there (smoothed, and raw).
    for name in ("main abc1234aaaa", "slow def5678bbbb", "same 0badcafe00"):
        assert f"{name} smoothed" in got["hoverAll"], got["hoverAll"]
    # The log axis reads 1-2-5 per decade in full, not plotly's bare "5, 2".
    assert got["logTicks"] and all(t[0] in "125" for t in got["logTicks"]), got["logTicks"]
    assert set(got["tickLabels"]) <= set(got["logTicks"]), got["tickLabels"]
    warnings = [w for w, height in got["warnings"] if height > 0]
    assert any("different JAX: main abc1234aaaa ran 0.10.2, slow def5678bbbb ran 0.9.2" in w for w in warnings)
    assert any("dominated by checkpoint stalls" in w for w in warnings)
    assert got["verdicts"][0] == "1 comparison(s) regressed"


def test_a_screenshot_of_the_report_is_not_blank(report_file, tmp_path):
    out, _ = report_file
    png = tmp_path / "shot.png"
    r = chromium(f"--screenshot={png}", "--window-size=1200,3800", "--force-device-scale-factor=0.5",
                 out.as_uri(), tmp=tmp_path)
    assert r.returncode == 0 and png.exists(), r.stderr[-2000:]
    w, h, rows, bpp = decode_png(png.read_bytes())
    assert (w, h) == (600, 1900)
    colors = Counter(row[x:x + 3] for row in rows for x in range(0, len(row), bpp))
    white = colors[b"\xff\xff\xff"]
    assert white < 0.9 * w * h, "the page is (nearly) blank"
    assert len(colors) > 200  # text, lines and bars, not a flat fill
    # The goodput bars and the warning box are solid fills of known colours.
    assert colors[bytes.fromhex(GOODPUT_COLORS["productive"][1:])] > 200
    assert colors[bytes.fromhex("fff4e5")] > 5000
    # The chart lines are thin and anti-aliased: look for pixels near each run's colour.
    for color in COLORS[:3]:
        target = bytes.fromhex(color[1:])
        near = sum(n for c, n in colors.items() if sum(abs(a - b) for a, b in zip(c, target, strict=True)) < 60)
        assert near > 20, color


def test_strings_from_runs_are_escaped(tmp_path):
    root = tmp_path / "root"
    write_stored_run(root, "evil", RunShape(commit="abc1234aaaa"), branch="<img src=x onerror=alert(1)>")
    write_stored_run(root, "good", RunShape(commit="def5678bbbb", seed=3), branch="main")
    base, cand = load_run("good", str(root)), load_run("evil", str(root))
    page = _page_without_library(render_report([Section("runs & <things>", [base, cand], [compare(base, cand)])]))
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "onerror=alert" not in re.sub(r"&lt;img src=x onerror=alert\(1\)&gt;", "", page.replace(
        "\\u0026lt;img src=x onerror=alert(1)\\u0026gt;", ""))  # in chart JSON: escaped, then \\u-coded
    assert "runs &amp; &lt;things&gt;" in page


def test_compare_html_and_report_cli_bad_input(tmp_path):
    base = write_log(tmp_path / "main.log", RunShape(seed=1))
    out = tmp_path / "r.html"
    r = xrun("report", str(base), str(tmp_path / "missing.log"), "-o", str(out), storage=tmp_path / "root")
    assert r.returncode == 2 and "CANDIDATE: no such file" in r.stderr and not out.exists()
    r = xrun("report", str(base), "-o", str(out), storage=tmp_path / "root")  # a single-run report
    assert r.returncode == 0 and "single run: no comparison" in out.read_text()
    assert re.findall(r'<div class="plot" id="([a-z]+)-0"', out.read_text()) == [
        "loss", "steptime", "tokens", "goodput"]
    out.unlink()
    r = xrun("report", str(base), str(base), "-o", str(out), storage=tmp_path / "root")
    assert r.returncode == 0 and "the same run on both sides" in out.read_text()
