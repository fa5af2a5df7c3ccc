"""Benchmark: the seed's checkpoint stall, reproduced. A save is due every few steps while
storage writes at ~30 MiB/s (the fault proxy, tests/gcs_proxy.py, throttling the GCS
emulator), as the nightly's hosts did at 26-43 MiB/s.

Reports, from the run's own metrics and log: training time blocked per save (the
device-to-host copy), deferred saves, "waiting for previous save" lines (must be 0), the
exit wait, and blocked / total training time (target <= 5%).

    python bench/bench_ckpt_stall.py [--preset bench-21m] [--steps 60] [--every 5]
                                     [--mib-per-s 30] [--json out.json]

Outage mode (#32): ``--outage-s 20 [--outage-at-step 8]`` answers every storage request 503
for 20 s from the moment the run logs that step (just before a save comes due), and reports
the training time blocked while storage was out: the wall time between consecutive step
records beyond each step's own time and the run's usual overhead (median), summed over the
steps whose span meets the outage or the 10 s after it (target <= 5% of the outage).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="bench-21m")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--mib-per-s", type=float, default=30.0)
    p.add_argument("--json")
    p.add_argument("--outage-s", type=float, default=0.0,
                   help="storage answers 503 for this long (0: no outage)")
    p.add_argument("--outage-at-step", type=int, default=8,
                   help="the outage starts when this step is logged")
    args = p.parse_args()

    from fake_gcs import fake_gcs_server

    with fake_gcs_server() as url:  # the tests' emulator (tests/fake_gcs.py), in memory
        run_bench(args, url)


def run_bench(args: argparse.Namespace, url: str) -> None:
    from gcs_proxy import GCSProxy

    from xrun_contract import CKPT_WAIT_PREVIOUS_RE, Layout
    from xrun_contract.checkpoints import committed_steps
    from xrun_contract.storage import gcs_client, open_storage

    proxy = GCSProxy(url, lifetime_s=3600).start()
    if args.mib_per_s > 0:
        proxy.throttle(args.mib_per_s * (1 << 20))
    os.environ["STORAGE_EMULATOR_HOST"] = url  # this process reads results directly
    bucket = "xrun-bench"
    gcs_client().create_bucket(bucket)
    root, run = f"gs://{bucket}/root", "stall"
    env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    env.update(PYTHONPATH=str(REPO), XRUN_PLATFORM="cpu", XRUN_DEVICES_PER_HOST="1",
               **proxy.env())
    cmd = [sys.executable, "-m", "workload.train", "--preset", args.preset, "--storage", root,
           "--run-name", run, f"steps={args.steps}", f"checkpoint_every={args.every}",
           "max_to_keep=3"]
    t = time.monotonic()
    outage: list[float] = []  # unix start and end of the outage
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if (args.outage_s and not outage
                and re.search(rf"completed step: {args.outage_at_step}\b", line)):
            proxy.outage(args.outage_s, "503")
            outage[:] = [time.time(), time.time() + args.outage_s]
    proc.wait(timeout=3600)
    wall = time.monotonic() - t
    out = "".join(lines)
    if proc.returncode != 0:
        raise SystemExit(f"workload exited {proc.returncode}:\n{out[-4000:]}")
    st = open_storage(root)
    objects, _ = st.list(Layout.metrics(run))
    records = [json.loads(line) for o in objects
               for line in (st.read_text(o.key) or "").splitlines() if line]
    steps = [r for r in records if r["kind"] == "step"]
    ck = [r for r in records if r["kind"] == "checkpoint"]

    def ev(name: str) -> list[dict]:
        return [r for r in ck if r["event"] == name]

    blocked = ev("blocked")
    step_time = sum(r["seconds"] for r in steps)
    copies = sum(r["checkpoint_blocked_s"] for r in steps)  # the saves' device-to-host copies
    sync = sum(r.get("sync_s") or 0.0 for r in ck if r["event"] == "committed")  # agreement
    held = copies + sync
    waits_logged = sum(1 for line in out.splitlines() if CKPT_WAIT_PREVIOUS_RE.search(line))
    committed = {r["step"]: r["seconds"] for r in ev("committed")}
    save_bytes = proxy.stats.bytes_up / max(1, len(blocked))
    result = {
        "preset": args.preset, "steps": args.steps, "every": args.every,
        "throttle_mib_s": args.mib_per_s, "wall_s": wall,
        "saves": [r["step"] for r in ev("started")],
        "deferred": [r["step"] for r in ev("deferred")],
        "blocked_per_save_s": [round(r["seconds"], 4) for r in blocked],
        "write_s_per_save": {s: round(v, 2) for s, v in committed.items()},
        "waiting_for_previous_save_lines": waits_logged,
        "waited_events": len(ev("waited")),
        "exit_wait_s": sum(r["seconds"] or 0 for r in ev("exit_wait")),
        "training_s": step_time + held, "held_s": held, "copy_s": copies, "sync_s": sync,
        "held_fraction": held / (step_time + held),
        "uploaded_mib_per_save": save_bytes / (1 << 20),
        "committed_steps": committed_steps(st, Layout.checkpoints(run)),
    }
    if outage:
        result.update(outage_blocked(steps, ck, outage, args.outage_s))
    proxy.stop()
    print(f"preset {args.preset}, {args.steps} steps, save every {args.every}, storage "
          f"throttled to {args.mib_per_s:.0f} MiB/s ({result['uploaded_mib_per_save']:.0f} MiB "
          f"uploaded per save)")
    print(f"saves at steps {result['saves']}; deferred at {result['deferred']}")
    print(f"blocked per save (s): {result['blocked_per_save_s']}")
    print(f"write time per save (s): {result['write_s_per_save']}")
    print(f"'waiting for previous save' lines: {waits_logged} (waited events: "
          f"{result['waited_events']})")
    print(f"training held {held:.2f} s (copies {copies:.2f} s, agreement {sync:.2f} s) of "
          f"{step_time + held:.2f} s ({result['held_fraction']:.1%}); exit wait {result['exit_wait_s']:.2f} s; "
          f"committed {result['committed_steps']}")
    if outage:
        print(f"outage {args.outage_s:.0f} s (503) from step {args.outage_at_step}: saves during it "
              f"{result['outage_saves']}, deferred {result['outage_deferred']}; training blocked "
              f"{result['outage_blocked_s']:.2f} s = {result['outage_blocked_fraction']:.1%} of the "
              f"outage (longest single hold {result['outage_longest_hold_s']:.2f} s); goodput's "
              f"checkpoint events: {result['outage_events']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if waits_logged or result["waited_events"]:
        raise SystemExit("a save waited for the previous one")


def outage_blocked(steps: list[dict], ck: list[dict], outage: list[float], outage_s: float) -> dict:
    """Training time lost while storage was out: for each step record, the wall time since
    the previous one beyond its own step time, less the run's median such overhead (logging,
    the next batch), summed over the steps whose span meets the outage or the 10 s after it."""
    import statistics

    ordered = sorted(steps, key=lambda r: r["time"])
    extra = [(a["time"], b["time"], (b["time"] - a["time"]) - b["seconds"])
             for a, b in zip(ordered, ordered[1:], strict=False)]
    usual = statistics.median(e for _, _, e in extra) if extra else 0.0
    start, end = outage
    # Every step whose span meets the outage or the 10 s after it (a hold that began in it).
    held = [max(0.0, e - usual) for a, b, e in extra if a <= end + 10 and b >= start]
    during = [r for r in ck if start <= (r.get("time") or 0) <= end + 10]
    return {
        "outage_s": outage_s,
        "outage_blocked_s": sum(held),
        "outage_blocked_fraction": sum(held) / outage_s,
        "outage_longest_hold_s": max(held, default=0.0),
        "outage_saves": [r["step"] for r in during if r["event"] == "started"],
        "outage_deferred": [r["step"] for r in during if r["event"] == "deferred"],
        "outage_events": sorted({r["event"] for r in during}),
    }


if __name__ == "__main__":
    main()
