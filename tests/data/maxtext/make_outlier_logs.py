"""Regenerates outliers-base.log.gz and outliers-faults.log.gz: two real MaxText runs on CPU,
the second with real faults injected from outside the process while it trains.

Both runs: stock MaxText (``maxtext.trainers.pre_train.train``) with the benchmark shape of
make_logs.sh (xrun's bench-21m), synthetic data, ``steps=STEPS``, async checkpoints every
``PERIOD`` steps (and at step 0 and the end), one CPU device. Each log is the unedited
stdout+stderr of the process, gzipped; nothing is post-processed.

Faults in the second run (nothing in MaxText is changed; the timing comes from the machine):

- **A slow save that the next save waits for.** The process runs in its own cgroup-v1 blkio
  group. From the step line ``THROTTLE_FROM`` on (after save 0 has committed) its writes to
  the checkpoint disk are throttled to ``SLOW_BPS`` until the save of step ``SLOW_SAVE``
  commits ("Finished save ... @ .../checkpoints/SLOW_SAVE"). Orbax/TensorStore fsync every
  file, so the background write of that save takes longer than the ``PERIOD`` steps to the
  next save, and Orbax prints "Waiting for previous save to complete took N seconds" at the
  save of step SLOW_SAVE + PERIOD (the step after it absorbs the wait; LINES.md).
- **A host-side pause.** When the line ``completed step: PAUSE_AFTER`` appears, the process
  is stopped with SIGSTOP for ``PAUSE_S`` seconds, then continued (SIGCONT): no log line
  names it.

Needs root and /sys/fs/cgroup/blkio (cgroup v1) for the throttle; refuses to run without.
Standard library only; run with any Python 3:

    sudo python3 tests/data/maxtext/make_outlier_logs.py --maxtext-python /work/mtvenv/bin/python

It prints what it did and when (wall clock, UTC); README.md has the figures of the committed
logs.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CG = Path("/sys/fs/cgroup/blkio/maxtext-outlier-logs")

MODEL = ["hardware=cpu", "skip_jax_distributed_system=true", "dataset_type=synthetic",
         "per_device_batch_size=1", "base_emb_dim=256", "base_num_decoder_layers=4",
         "base_num_query_heads=4", "base_num_kv_heads=4", "head_dim=64", "base_mlp_dim=1024",
         "vocab_size=32000", "max_target_length=256"]


def say(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} {msg}", flush=True)


def device_of(path: Path) -> str:
    """MAJ:MIN of the block device that holds ``path`` (what blkio throttles)."""
    st = os.stat(path)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


def throttle(dev: str, bps: int) -> None:
    """Set (bps > 0) or remove (0) the write limit of the cgroup on ``dev``."""
    (CG / "blkio.throttle.write_bps_device").write_text(f"{dev} {bps}\n")


def run(py: str, out: Path, name: str, steps: int, period: int, log: Path,
        on_line=None) -> int:
    """One MaxText process in the blkio group; ``on_line(line, pid)`` sees every line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    env.pop("PYTHONPATH", None)
    env.update(JAX_PLATFORMS="cpu", DECOUPLE_GCLOUD="TRUE", PYTHONUNBUFFERED="1")
    cmd = [py, "-m", "maxtext.trainers.pre_train.train", f"run_name={name}",
           f"base_output_directory={out}", *MODEL, f"steps={steps}", "enable_checkpointing=true",
           "async_checkpointing=true", f"checkpoint_period={period}"]
    say(f"start {name}: {' '.join(cmd)}")

    def join_group() -> None:
        (CG / "cgroup.procs").write_text(str(os.getpid()))

    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, cwd=out, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, preexec_fn=join_group)
        assert proc.stdout is not None
        for raw in proc.stdout:
            f.write(raw)
            f.flush()
            if on_line is not None:
                on_line(raw.decode(errors="replace"), proc.pid)
        rc = proc.wait()
    say(f"end {name}: exit {rc}, {sum(1 for _ in log.open(errors='replace'))} lines")
    return rc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--maxtext-python", required=True)
    p.add_argument("--out", default="", help="checkpoint folder (default: a temporary one)")
    p.add_argument("--dest", default=str(HERE), help="where the .log.gz files go")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--period", type=int, default=10)
    p.add_argument("--slow-save", type=int, default=10, help="the save written slowly")
    p.add_argument("--throttle-from", type=int, default=6, help="step line that starts the throttle")
    p.add_argument("--slow-bps", type=int, default=2 * 1024 * 1024, help="write limit, bytes/s")
    p.add_argument("--pause-after", type=int, default=33, help="step line after which to SIGSTOP")
    p.add_argument("--pause-s", type=float, default=15.0)
    p.add_argument("--only", choices=("base", "faults"), default="")
    args = p.parse_args()
    if os.geteuid() != 0 or not CG.parent.is_dir():
        print("make_outlier_logs.py: needs root and cgroup v1 blkio (/sys/fs/cgroup/blkio)", file=sys.stderr)
        return 2
    CG.mkdir(exist_ok=True)
    out = Path(args.out or tempfile.mkdtemp(prefix="maxtext-outliers-"))
    out.mkdir(parents=True, exist_ok=True)
    dev = device_of(out)
    dest = Path(args.dest)
    say(f"checkpoints under {out} (device {dev}); logs to {dest}")
    rcs = []
    try:
        throttle(dev, 0)
        if args.only in ("", "base"):
            log = out / "outliers-base.log"
            rcs.append(run(args.maxtext_python, out, "base", args.steps, args.period, log))
            _gzip(log, dest / "outliers-base.log.gz")

        if args.only in ("", "faults"):
            step_re = re.compile(r"completed step: (\d+), seconds")
            done_re = re.compile(r"Finished save \(blocking \+ background\) in [\d.]+ seconds @ \S+/(\d+)$")
            state = {"throttled": False, "lifted": False, "paused": False, "save0": False}

            def pause(pid: int) -> None:
                os.kill(pid, signal.SIGSTOP)
                say(f"SIGSTOP {pid} for {args.pause_s:g} s")
                time.sleep(args.pause_s)
                os.kill(pid, signal.SIGCONT)
                say(f"SIGCONT {pid}")

            def on_line(line: str, pid: int) -> None:
                m = step_re.search(line)
                d = done_re.search(line.rstrip())
                if d and int(d[1]) == 0:
                    state["save0"] = True
                if (m and int(m[1]) >= args.throttle_from or d and int(d[1]) == 0) \
                        and state["save0"] and not state["throttled"]:
                    throttle(dev, args.slow_bps)
                    state["throttled"] = True
                    say(f"throttle writes to {args.slow_bps} B/s (after: {line.strip()[-90:]})")
                if d and int(d[1]) == args.slow_save and state["throttled"] and not state["lifted"]:
                    throttle(dev, 0)
                    state["lifted"] = True
                    say(f"throttle lifted: save {args.slow_save} committed")
                if m and int(m[1]) == args.pause_after and not state["paused"]:
                    state["paused"] = True
                    # Off the reading thread: the pipe keeps draining what was written before.
                    threading.Thread(target=pause, args=(pid,), daemon=True).start()

            log = out / "outliers-faults.log"
            rcs.append(run(args.maxtext_python, out, "faults", args.steps, args.period, log, on_line))
            _gzip(log, dest / "outliers-faults.log.gz")
            say(f"faults: throttled {state['throttled']}, lifted {state['lifted']}, paused {state['paused']}")
    finally:
        throttle(dev, 0)
        with contextlib.suppress(OSError):
            CG.rmdir()
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    return max(rcs, default=0)


def _gzip(src: Path, dst: Path) -> None:
    """gzip with no name or time in the header, so a regenerated file differs only by content."""
    with src.open("rb") as f, dst.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as g:
        shutil.copyfileobj(f, g)
    say(f"wrote {dst} ({dst.stat().st_size} bytes)")


if __name__ == "__main__":
    sys.exit(main())
