"""Benchmark: log parsing throughput on MaxText-form text, 1 GB measured, and its memory.

The text is made from the real MaxText 0.2.5 log in ``tests/data/maxtext/save-stall.log``
(made by ``tests/data/maxtext/make_logs.sh``; a save every 5 steps, Orbax's lines included):
its header once (config dump, first steps), then its 5-step cycle (steps 4-8 with the save
at step 5 and every Orbax line around it) repeated with step numbers, checkpoint paths and
absl timestamps advanced, until the file holds ``--gb`` GB. A second text is the same log as
``xrun logs`` prints two hosts (``[0-0] ``/``[0-1] `` prefixes, cycles interleaved), and a
third holds only step lines (a log with checkpoints off; the parser's per-line worst case).

Each file is parsed by the path ``xrun compare LOG`` takes (``read_log_file``) in a child
process, which reports its time and peak RSS; the reference measured in the same run is a
child that only reads the same file in the same pieces and counts its lines. Wall time is
what a user waits; the parse's CPU time (MB per CPU-second) is printed too, since on a shared
machine the wall time also measures the neighbours. The result is checked:
every generated step and save must be in the record.

    python bench/bench_logparse.py [--gb 1.0] [--dir /tmp] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SOURCE = REPO / "tests" / "data" / "maxtext" / "save-stall.log"
CYCLE_FIRST = "Waiting for step 5 to finish"  # the cycle: steps 4-8 and the save at step 5
CYCLE_LAST = "completed step: 8,"
CYCLE_STEPS = 5
ABSL = re.compile(r"^([IWEF])(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) ")
STEP_NUMBER = re.compile(r"(completed step: |step |step=|'step': |checkpoints/)(\d+)")
YEAR = 2026


def _template() -> tuple[list[str], list[tuple[float | None, str]], float]:
    """(header lines, cycle lines as (absl time, text after the time), cycle duration)."""
    lines = SOURCE.read_text().split("\n")
    if lines and not lines[-1]:
        lines.pop()
    first = next(i for i, ln in enumerate(lines) if CYCLE_FIRST in ln)
    last = next(i for i, ln in enumerate(lines) if CYCLE_LAST in ln)
    cycle: list[tuple[float | None, str]] = []
    for ln in lines[first:last + 1]:
        m = ABSL.match(ln)
        if m:
            t = calendar.timegm((YEAR, int(m[2]), int(m[3]), int(m[4]), int(m[5]), int(m[6])))
            cycle.append((t + int(m[7]) / 1e6, m[1] + "\0" + ln[m.end():]))
        else:
            cycle.append((None, ln))
    times = [t for t, _ in cycle if t is not None]
    # The cycle repeats every (last time - first time) plus the gap from step 3 to the
    # cycle's first line, so the times keep rising like a real run's.
    return lines[:first], cycle, (times[-1] - times[0]) + 2.0


def _absl_time(level: str, t: float) -> str:
    g = time.gmtime(int(t))
    return (f"{level}{g.tm_mon:02d}{g.tm_mday:02d} {g.tm_hour:02d}:{g.tm_min:02d}:"
            f"{g.tm_sec:02d}.{int((t % 1) * 1e6):06d} ")


def make_log(path: Path, size: int, form: str) -> dict[str, int]:
    """Write ``size`` bytes of MaxText-form text; returns what it holds (steps, saves)."""
    header, cycle, duration = _template()
    steps_only = form == "steps"
    if steps_only:
        cycle = [(t, s) for t, s in cycle if "completed step: " in s]
    hosts = ["0-0", "0-1"] if form == "hosts" else [""]
    written, cycles = 0, 0
    with path.open("w", encoding="utf-8") as f:
        for host in hosts:
            prefix = f"[{host}] " if host else ""
            text = "".join(prefix + ln + "\n" for ln in header)
            f.write(text)
            written += len(text.encode())
        while written < size:
            offset = cycles * CYCLE_STEPS
            shift = cycles * duration
            out = []
            for host in hosts:
                prefix = f"[{host}] " if host else ""
                for t, rest in cycle:
                    if offset:
                        rest = STEP_NUMBER.sub(lambda m, k=offset: m[1] + str(int(m[2]) + k), rest)
                    if t is not None:
                        level, _, rest = rest.partition("\0")
                        rest = _absl_time(level, t + shift) + rest
                    out.append(prefix + rest + "\n")
            text = "".join(out)
            f.write(text)
            written += len(text.encode())
            cycles += 1
    header_steps = sum("completed step: " in ln for ln in header)
    header_saves = sum("Saving checkpoint at step" in ln for ln in header)
    per_cycle_saves = 0 if steps_only else sum("Saving checkpoint at step" in s for _, s in cycle)
    return {"bytes": written, "steps": header_steps + cycles * CYCLE_STEPS,
            "saves": header_saves + cycles * per_cycle_saves, "hosts": len(hosts)}


def _child(mode: str, path: str) -> None:
    """Run in a child process: parse (or only read) the file, print JSON with time and RSS."""
    from orchestrator.readers.loaders import read_log_file
    from orchestrator.readers.logparse import READ_CHARS

    t0 = time.perf_counter()
    c0 = time.process_time()
    out: dict[str, float | int] = {}
    if mode == "read":
        lines = 0
        with open(path, "rb") as f:
            while piece := f.read(READ_CHARS):
                lines += piece.count(b"\n")
        out["lines"] = lines
    else:
        rec = read_log_file(path)
        out["steps"] = rec.steps.count
        out["saves"] = int(rec.checkpoint_totals["saves"])  # exact; events are kept up to a cap
        out["events_kept"] = len(rec.checkpoints)
        out["kept_steps"] = len(rec.steps.step)
    out["seconds"] = time.perf_counter() - t0
    out["cpu_seconds"] = time.process_time() - c0
    out["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def _measure(mode: str, path: Path) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", mode, str(path)],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=1.0, help="size of each generated log (GB, 1e9 bytes)")
    ap.add_argument("--forms", nargs="+", default=["maxtext", "hosts", "steps"],
                    choices=["maxtext", "hosts", "steps"])
    ap.add_argument("--dir", help="where the logs are written (default: a temporary folder)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    size = int(args.gb * 1e9)
    results = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for form in args.forms:
            path = Path(tmp) / f"{form}.log"
            made = make_log(path, size, form)
            read = _measure("read", path)
            parse = _measure("parse", path)
            os.unlink(path)
            mb = made["bytes"] / 1e6
            # One host's record (the parser reads the host that logged steps).
            ok = parse["steps"] == made["steps"] and parse["saves"] == made["saves"]
            results[form] = {
                "made": made, "read": read, "parse": parse,
                "read_mb_s": mb / read["seconds"], "parse_mb_s": mb / parse["seconds"],
                "parse_mb_per_cpu_s": mb / parse["cpu_seconds"],
                "parse_over_read": read["seconds"] / parse["seconds"], "record_complete": ok,
            }
    print(f"{'text':<8} {'MB':>7} {'steps':>9} {'saves':>7} {'read MB/s':>10} {'parse MB/s':>11} "
          f"{'MB/CPU-s':>9} {'parse/read':>10} {'parse RSS MB':>13} {'read RSS MB':>12} {'record':>8}")
    for form, r in results.items():
        print(f"{form:<8} {r['made']['bytes'] / 1e6:>7.0f} {r['made']['steps']:>9} "
              f"{r['made']['saves']:>7} {r['read_mb_s']:>10.0f} {r['parse_mb_s']:>11.0f} "
              f"{r['parse_mb_per_cpu_s']:>9.0f} "
              f"{r['parse_over_read']:>10.2f} {r['parse']['max_rss_mb']:>13.0f} "
              f"{r['read']['max_rss_mb']:>12.0f} {'complete' if r['record_complete'] else 'WRONG':>8}")
    print(f"load average during the run: {os.getloadavg()[0]:.2f} (1 min); {os.cpu_count()} cores")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if not all(r["record_complete"] for r in results.values()):
        raise SystemExit("the parsed record misses generated steps or saves")


if __name__ == "__main__":
    main()
