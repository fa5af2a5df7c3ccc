"""Soak (issue #53): a tiny run restarted every N steps, followed end to end by
``xrun submit --follow`` on the local backend, against the same run uninterrupted.

    python bench/bench_soak.py                          # 20,000 steps, a restart every 1,000
    python bench/bench_soak.py --steps 2000 --every 200 --root /tmp/soak
    python bench/bench_soak.py --trainer fake           # the same soak, bench/soak_trainer.py: minutes

Each forced restart is the workload's own (``XRUN_TEST_RESTART_EVERY``: at every multiple
of N it saves that step, as after a SIGTERM, and exits with the restartable code; the local
supervisor restarts the pods, which restore it). Reported, and checked (exit 1 when one
fails):

- the follow's RSS: its peak after the first restart within 10% of its value then;
- every log line storage holds printed exactly once by the follow (the follow's host lines
  against ``xrun logs NAME``'s, as multisets);
- the objects the run keeps: checkpoint steps within the retention (``max_to_keep``), and
  the metrics, rollup and log objects, counted;
- the final loss equal to the uninterrupted run's (bit for bit);
- what a poll of the follow lists (reported): a follower in this process, the follow's own
  readers (``StoredRun``, ``LogFollower``) polling the soak every 2 s beside it, counts the
  objects each poll's listings return, at the start of the run and at its end (each poll
  lists the chunks written since the last one read: a few, not the run's every chunk).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from xrun_contract import Env, Layout  # noqa: E402

MAX_TO_KEEP = 3
RSS_TOLERANCE = 0.10


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_") or k == "XRUN_LOCAL_COMPILATION_CACHE"}
    env.update(XRUN_STORAGE=str(root), PYTHONPATH=str(REPO), XRUN_QUEUE="none")
    return env


def _spec(name: str, steps: int, every: int, trainer: str = "jax", step_seconds: float = 0.02,
          devices_per_host: int = 2) -> list[str]:
    command = (f"python3 -m workload.train --preset tiny steps={steps} checkpoint_every={every} "
               f"max_to_keep={MAX_TO_KEEP}")
    if trainer == "fake":  # bench/soak_trainer.py: the workload's lines and records, no JAX
        command = (f"python3 {REPO / 'bench' / 'soak_trainer.py'} steps={steps} checkpoint_every={every} "
                   f"max_to_keep={MAX_TO_KEEP} step_seconds={step_seconds}")
    return ["--name", name, "--accelerator", "cpu-2", "--cpu-devices-per-host", str(devices_per_host),
            "--image", "img", "--command", command, "--max-restarts", "100", "--termination-grace-seconds", "60"]


def _xrun(root: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=_env(root), cwd=REPO)


def _rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _final_loss(root: Path, name: str, steps: int) -> float | None:
    """The loss of the last step, whichever attempt trained it (a rollup or a chunk)."""
    loss = None
    for folder in (root / Layout.metrics(name), root / Layout.metrics_rollups(name)):
        for path in sorted(folder.glob("*.jsonl")):
            for line in path.read_text().splitlines():
                rec = json.loads(line) if line.strip() else {}
                if rec.get("kind") == "step" and rec.get("step") == steps:
                    loss = rec["loss"]
    return loss


def _objects(root: Path, name: str) -> dict[str, int]:
    run = root / Layout.run(name)
    ckpt = run / "checkpoints"
    steps = [p for p in ckpt.iterdir() if p.is_dir() and p.name.isdigit()] if ckpt.is_dir() else []
    count = (lambda p: sum(1 for f in p.rglob("*") if f.is_file()) if p.is_dir() else 0)  # noqa: E731
    return {"checkpoint_steps": len(steps), "metrics_chunks": count(run / "metrics"),
            "metrics_rollups": count(run / "metrics-rollup"), "log_chunks": count(run / "logs"),
            "all_objects": count(run)}


def _state(root: Path, name: str) -> dict[str, Any]:
    try:
        return json.loads((root / Layout.state(name)).read_text())
    except (OSError, ValueError):
        return {}


def _observe(root: Path, name: str, stop: threading.Event, listed: list[tuple[int, int]]) -> None:
    """Poll run ``name`` every 2 s as the follow does, in this process, until ``stop``:
    (metrics objects, log objects) each poll listed."""
    from orchestrator.readers.loaders import StoredRun
    from orchestrator.readers.logs import LogFollower
    from xrun_contract.storage import open_storage

    storage = open_storage(str(root))
    reader, follower = StoredRun(storage, name), LogFollower(storage, name)
    while not stop.wait(2.0):
        try:
            reader.poll()
            for _ in follower.poll():
                pass
        except Exception:  # noqa: BLE001 - a poll before the run's first objects: the next one
            continue
        listed.append((reader.listed, follower.listed))


def _per_poll(listed: list[tuple[int, int]], polls: int = 5) -> dict[str, Any]:
    """Objects listed per poll (metrics + logs): the median of the first polls after the
    first (which reads what is there) and of the last ones."""
    import statistics

    totals = [m + g for m, g in listed]
    first, last = totals[1:1 + polls], totals[-polls:]
    return {"polls": len(totals),
            "objects_listed_per_poll_start": statistics.median(first) if first else None,
            "objects_listed_per_poll_end": statistics.median(last) if last else None,
            "objects_listed_per_poll_max_after_first": max(totals[1:], default=None)}


def soak(root: Path, steps: int, every: int, timeout_s: float = 7200.0, trainer: str = "jax",
         step_seconds: float = 0.02, devices_per_host: int = 2) -> dict[str, Any]:
    """Run the reference and the soak under ``root``; the figures, and the checks' verdicts."""
    t0 = time.monotonic()
    ref = _xrun(root, "submit", *_spec("ref", steps, every, trainer, step_seconds, devices_per_host), "--detach",
                timeout=300)
    if ref.returncode != 0:
        raise RuntimeError(f"reference submit: {ref.stderr}")
    env = {**_env(root)}
    cmd = [sys.executable, "-m", "orchestrator.cli", "submit",
           *_spec("soak", steps, every, trainer, step_seconds, devices_per_host), "--follow",
           "--env", f"{Env.TEST_RESTART_EVERY}={every}", "--progress-interval", "30"]
    follow = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    out: list[str] = []
    err: list[str] = []
    readers = [threading.Thread(target=lambda: out.extend(follow.stdout), daemon=True),  # type: ignore[arg-type]
               threading.Thread(target=lambda: err.extend(follow.stderr), daemon=True)]  # type: ignore[arg-type]
    for t in readers:
        t.start()
    samples: list[tuple[float, int, int]] = []  # (seconds, restarts, RSS KiB)
    listed: list[tuple[int, int]] = []
    stop_observing = threading.Event()
    observer = threading.Thread(target=_observe, args=(root, "soak", stop_observing, listed), daemon=True)
    observer.start()
    deadline = time.monotonic() + timeout_s
    while follow.poll() is None:
        if time.monotonic() > deadline:
            follow.kill()
            raise RuntimeError(f"the soak did not end within {timeout_s:.0f}s")
        rss = _rss_kib(follow.pid)
        if rss is not None:
            samples.append((time.monotonic() - t0, int(_state(root, "soak").get("restarts") or 0), rss))
        time.sleep(0.5)
    stop_observing.set()
    observer.join(60)
    for t in readers:
        t.join(30)
    wait = _xrun(root, "wait", "ref", "--timeout", str(timeout_s), timeout=timeout_s + 60)
    logs = _xrun(root, "logs", "soak", timeout=600)
    followed = Counter(line.rstrip("\n") for line in out if line.startswith("["))
    step_lines = Counter(m[1] for line in logs.stdout.splitlines() if (m := re.search(r"completed step: (\d+),", line)))
    stored = Counter(line for line in logs.stdout.splitlines() if line.startswith("["))
    after = [s for s in samples if s[1] >= 1]
    base = after[0][2] if after else None
    peak = max((s[2] for s in after), default=None)
    state = _state(root, "soak")
    objects = _objects(root, "soak")
    final, reference = _final_loss(root, "soak", steps), _final_loss(root, "ref", steps)
    figures: dict[str, Any] = {
        "trainer": trainer, "devices_per_host": devices_per_host, "steps": steps, "restart_every": every,
        "restarts": state.get("restarts"),
        "soak_state": state.get("state"), "follow_exit": follow.returncode, "reference_wait_exit": wait.returncode,
        "wall_seconds": round(time.monotonic() - t0, 1),
        "follow_rss_after_first_restart_kib": base, "follow_rss_peak_after_kib": peak,
        "follow_rss_growth": None if not base or peak is None else round(peak / base - 1, 4),
        # the RSS the follow had when each attempt began (its last sample before the next
        # restart), and its peak over the run's last attempt and the summary after it
        "follow_rss_by_restart_kib": {r: rss for _, r, rss in samples},
        "stored_log_lines": sum(stored.values()), "followed_log_lines": sum(followed.values()),
        "lines_missing": sum((stored - followed).values()), "lines_extra": sum((followed - stored).values()),
        # steps a restart ran again (a forced restart saves its step first: none)
        "steps_logged": len(step_lines), "steps_redone": sum(step_lines.values()) - len(step_lines),
        "objects": objects, "final_loss": final, "reference_final_loss": reference,
        # what each poll listed before #53's cursors: every chunk of the run, at its end this many
        "follow_listing": {**_per_poll(listed), "objects_a_whole_listing_holds_at_end":
                           objects["metrics_chunks"] + objects["log_chunks"]},
    }
    figures["checks"] = {
        "succeeded": follow.returncode == 0 and state.get("state") == "Succeeded" and wait.returncode == 0,
        "restarted": int(state.get("restarts") or 0) >= max(1, (steps - 1) // every),
        "rss_within_10pct": figures["follow_rss_growth"] is not None and figures["follow_rss_growth"] <= RSS_TOLERANCE,
        "every_line_once": bool(stored) and followed == stored,
        "checkpoints_retained": objects["checkpoint_steps"] <= MAX_TO_KEEP + 1,
        "same_final_loss": final is not None and final == reference,
    }
    figures["stderr_tail"] = "".join(err[-5:])
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--every", type=int, default=1000, help="a forced restart every this many steps")
    ap.add_argument("--root", type=Path, default=None, help="storage root (default: a temporary folder)")
    ap.add_argument("--timeout", type=float, default=7200.0)
    ap.add_argument("--trainer", choices=("jax", "fake"), default="jax",
                    help="fake: bench/soak_trainer.py, the workload's lines, records and restarts "
                         "without JAX (20,000 steps in minutes, not 100; its loss is a function of the step)")
    ap.add_argument("--step-seconds", type=float, default=0.02, help="the fake trainer's step time")
    ap.add_argument("--devices-per-host", type=int, default=2,
                    help="CPU devices of each of the 2 hosts (1: gloo has 2 ranks, not 4, and a "
                         "step costs about half the CPU; the follow and its checks are the same)")
    args = ap.parse_args()
    if args.steps < 2 or not 1 <= args.every < args.steps:
        ap.error("--every: between 1 and --steps - 1")
    with tempfile.TemporaryDirectory(prefix="xrun-soak-") as tmp:
        root = args.root or Path(tmp)
        figures = soak(root, args.steps, args.every, args.timeout, args.trainer, args.step_seconds,
                       args.devices_per_host)
    print(json.dumps(figures, indent=2))
    return 0 if all(figures["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
