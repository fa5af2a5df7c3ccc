"""Benchmark: what checkpointing costs the training loop, and how fast it writes.

Runs the workload (default ``bench-21m``, one CPU device) with async Orbax saves every K
steps into a folder on the disk under test. For every save it reports the training time
blocked (waiting for the previous save + the device-to-host copy, from the run's own
checkpoint records), the total save time (Orbax's init -> commit timestamps in the step's
metadata) and the bytes written. Two references, same bytes, same folder, one run:

* idle: one plain file write (+ fsync) with nothing else running; then Orbax's restore of
  the last save against a plain read of a file of the same size;
* in-run (the same conditions as Orbax's write): the workload runs again with the same
  preset and batch and checkpoints off, and while its steps run this process writes the
  same bytes as a plain file (+ fsync) as many times as there were saves, then restores the
  last save through Orbax and reads the plain file back, interleaved. Every measurement is
  checked to have started after the run's first step and ended before its last.

``--workload-env KEY=VALUE`` (repeatable) goes to both workload runs: e.g.
``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false`` to leave the writer more CPU.

    python bench/bench_checkpoint.py [--preset bench-21m] [--steps 40] [--every 10] [--dir DIR]
                                     [--workload-env KEY=VALUE ...] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_workload import REPO, run_workload  # noqa: E402

sys.path.insert(0, str(REPO))


def checkpoint_costs(records: list[dict], storage: str, run: str) -> list[dict]:
    """Per committed save: step, blocked_s (training held up), save_s (init -> commit), bytes."""
    from xrun_contract import Layout
    from xrun_contract.storage import open_storage

    st = open_storage(storage)
    blocked: dict[int, float] = {}
    committed: dict[int, float] = {}
    for r in records:
        if r["kind"] == "checkpoint" and r["event"] in ("blocked", "waited"):
            blocked[r["step"]] = blocked.get(r["step"], 0.0) + (r["seconds"] or 0.0)
        elif r["kind"] == "checkpoint" and r["event"] == "committed":
            committed[r["step"]] = r["seconds"] or 0.0
    out = []
    for step in sorted(committed):
        base = f"{Layout.checkpoints(run)}/{step}"
        meta = st.read_json(f"{base}/_CHECKPOINT_METADATA") or {}
        init, commit = meta.get("init_timestamp_nsecs"), meta.get("commit_timestamp_nsecs")
        save_s = (commit - init) / 1e9 if init and commit else committed[step]
        objects, _ = st.list(base, delimiter=None)
        out.append({"step": step, "blocked_s": blocked.get(step, 0.0), "save_s": save_s,
                    "bytes": sum(o.size for o in objects)})
    return out


def plain_write_seconds(folder: Path, nbytes: int, chunk: int = 64 << 20) -> float:
    """Seconds to write ``nbytes`` as one file (write + fsync) in ``folder``."""
    data = os.urandom(min(chunk, nbytes))
    path = folder / "plain-write.bin"
    t = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            f.write(data[:left] if left < len(data) else data)
            left -= len(data)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - t
    path.unlink()
    return seconds


def restore_seconds(step_dir: Path) -> float:
    """Seconds to restore the ``state`` item of a step (as host numpy arrays, every byte
    read), the way the workload's restore reads it: through Orbax's PyTree handler."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    handler = ocp.PyTreeCheckpointHandler()
    meta = handler.metadata(step_dir / "state")
    tree = meta.tree if hasattr(meta, "tree") else meta
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    t = time.perf_counter()
    out = handler.restore(step_dir / "state", args=ocp.args.PyTreeRestore(
        restore_args=restore_args))
    assert jax.tree.leaves(out), "nothing restored"
    seconds = time.perf_counter() - t
    handler.close()
    return seconds


def plain_read_seconds(folder: Path, nbytes: int) -> float:
    """Seconds to read back ``nbytes`` written as one file in ``folder`` (page cache as warm
    as the checkpoint's, both just written)."""
    path = folder / "plain-read.bin"
    path.write_bytes(os.urandom(nbytes))
    seconds = read_seconds(path)
    path.unlink()
    return seconds


def plain_file(folder: Path, nbytes: int) -> Path:
    """A file of ``nbytes`` random bytes in ``folder`` (synced), to read back in-run."""
    path = folder / "plain-read.bin"
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            chunk = os.urandom(min(64 << 20, left))
            f.write(chunk)
            left -= len(chunk)
        f.flush()
        os.fsync(f.fileno())
    return path


def read_seconds(path: Path, chunk: int = 64 << 20) -> float:
    """Seconds to read ``path`` into new memory of its size, as a restore must place every
    byte: the buffer is mapped before the clock starts and its pages are first touched by
    the read (a restore's arrays are new memory too).

    Why not ``f.read(64 MiB)`` in a loop, as before: each call allocates a new 64 MiB object,
    and whether glibc serves it with a fresh mapping (page-faulted in by the copy: 1.6-1.9
    GB/s here) or memory freed by the previous call (5.2-6.3 GB/s, nothing faulted) depended
    on the allocator's state: the 16:24 re-run in bench/RESULTS.md read 3x faster than the
    runs before it, and its restore ratios fell to a quarter. Reading into one reused buffer
    would measure the page cache and a copy only, which no restore can do."""
    import mmap

    size = path.stat().st_size
    buf = mmap.mmap(-1, max(size, 1))  # anonymous: pages not yet touched
    view = memoryview(buf)
    try:
        t = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            pos = 0
            while pos < size:
                n = f.readinto(view[pos:pos + chunk])
                if not n:
                    break
                pos += n
        seconds = time.perf_counter() - t
    finally:
        view.release()
        buf.close()
    return seconds


def in_run_references(folder: Path, preset: str, steps: int, env: dict[str, str],
                      nbytes: int, writes: int, step_dir: Path,
                      timeout: float = 1800) -> dict:
    """Plain writes, Orbax restores and plain reads measured while the workload trains.

    The workload runs checkpoint-free for up to ``steps`` steps (many, so it outlasts the
    measurements; it is stopped after them); the measurements start after its second step
    line, and the run must still be stepping when the last ends (else an error)."""
    from bench_workload import REPO

    base = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    base.update(PYTHONPATH=str(REPO), XRUN_PLATFORM="cpu", XRUN_DEVICES_PER_HOST="1", **env)
    cmd = [sys.executable, "-m", "workload.train", "--preset", preset, f"steps={steps}",
           "checkpoint_every=0"]
    with open(folder / "in-run-workload.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=base, stdout=log, stderr=subprocess.STDOUT,
                                text=True)
        try:
            deadline = time.monotonic() + timeout
            while "completed step: 2," not in (folder / "in-run-workload.log").read_text():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("in-run workload never stepped:\n"
                                       + (folder / "in-run-workload.log").read_text()[-3000:])
                time.sleep(0.2)
            load = [os.getloadavg()[0]]
            write_s = [plain_write_seconds(folder, nbytes) for _ in range(writes)]
            load.append(os.getloadavg()[0])
            path = plain_file(folder, nbytes)
            restore_s, read_s = [], []
            for _ in range(2):
                restore_s.append(restore_seconds(step_dir))
                read_s.append(read_seconds(path))
            path.unlink()
            load.append(os.getloadavg()[0])
            overlapped = proc.poll() is None
        finally:
            proc.terminate()  # SIGTERM: the workload stops at its next step
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if not overlapped:
        raise RuntimeError(f"the in-run workload ({steps} steps) ended before the measurements "
                           "did: raise --in-run-steps")
    return {"write_s": write_s, "restore_s": restore_s, "read_s": read_s, "load": load}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="bench-21m")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=10, help="save every K steps (and at the last)")
    p.add_argument("--dir", help="folder on the disk under test (default: a temporary folder)")
    p.add_argument("--in-run-steps", type=int, default=100000,
                   help="steps of the checkpoint-free run the in-run references overlap "
                        "(stopped once they are measured)")
    p.add_argument("--workload-env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment for both workload runs (repeatable)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    wenv = dict(item.split("=", 1) for item in args.workload_env)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        records = run_workload(tmp, "ckpt", args.preset,
                               [f"steps={args.steps}", f"checkpoint_every={args.every}",
                                "max_to_keep=100"],
                               env={"XRUN_PLATFORM": "cpu", "XRUN_DEVICES_PER_HOST": "1",
                                    **wenv})
        load_training = os.getloadavg()[0]
        saves = checkpoint_costs(records, tmp, "ckpt")
        nbytes = max(s["bytes"] for s in saves)
        plain = min(plain_write_seconds(Path(tmp), nbytes) for _ in range(3))
        last = Path(tmp, "runs/ckpt/checkpoints", str(saves[-1]["step"]))
        restore_s = min(restore_seconds(last) for _ in range(2))
        read_s = min(plain_read_seconds(Path(tmp), saves[-1]["bytes"]) for _ in range(2))
        in_run = in_run_references(Path(tmp), args.preset, args.in_run_steps, wenv, nbytes,
                                   len(saves), last)
    steps = [r for r in records if r["kind"] == "step"]
    step_s = sorted(r["seconds"] for r in steps)[len(steps) // 2]
    print(f"preset {args.preset}: {len(saves)} saves of {nbytes / 1e6:.1f} MB, "
          f"median step {step_s:.4f} s")
    print(f"{'step':>6} {'blocked s':>10} {'save s':>8} {'blocked/save':>13} {'MB/s':>8}")
    for s in saves:
        print(f"{s['step']:>6} {s['blocked_s']:>10.3f} {s['save_s']:>8.3f} "
              f"{s['blocked_s'] / s['save_s']:>12.1%} {s['bytes'] / s['save_s'] / 1e6:>8.1f}")
    total_blocked = sum(s["blocked_s"] for s in saves)
    total_save = sum(s["save_s"] for s in saves)
    orbax_mbps = sum(s["bytes"] for s in saves) / total_save / 1e6
    plain_mbps = nbytes / plain / 1e6
    restore_mbps = saves[-1]["bytes"] / restore_s / 1e6
    read_mbps = saves[-1]["bytes"] / read_s / 1e6
    print(f"all saves: blocked {total_blocked:.3f} s of {total_save:.3f} s saving "
          f"({total_blocked / total_save:.1%}), {total_blocked / len(saves):.3f} s per save")
    # In-run: the same number of plain writes as saves, overlapping training steps; the
    # sum of bytes over the sum of seconds, as for Orbax's saves.
    plain_in_run_mbps = nbytes * len(in_run["write_s"]) / sum(in_run["write_s"]) / 1e6
    restore_in_run_mbps = saves[-1]["bytes"] / min(in_run["restore_s"]) / 1e6
    read_in_run_mbps = saves[-1]["bytes"] / min(in_run["read_s"]) / 1e6
    print(f"load average (1 min): end of the checkpointing run {load_training:.2f}; in-run "
          f"references {', '.join(f'{x:.2f}' for x in in_run['load'])}; env {wenv or '-'}")
    print(f"write: Orbax (while training) {orbax_mbps:.1f} MB/s vs plain file write + fsync "
          f"idle {plain_mbps:.1f} MB/s (ratio {orbax_mbps / plain_mbps:.2f}), while training "
          f"{plain_in_run_mbps:.1f} MB/s (ratio {orbax_mbps / plain_in_run_mbps:.2f})")
    print(f"restore: idle: Orbax {restore_mbps:.1f} MB/s vs plain file read {read_mbps:.1f} MB/s "
          f"(ratio {restore_mbps / read_mbps:.2f}); while training: Orbax "
          f"{restore_in_run_mbps:.1f} MB/s vs plain read {read_in_run_mbps:.1f} MB/s "
          f"(ratio {restore_in_run_mbps / read_in_run_mbps:.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "preset": args.preset, "saves": saves, "blocked_s": total_blocked,
            "save_s": total_save, "orbax_mb_per_s": orbax_mbps, "plain_mb_per_s": plain_mbps,
            "write_ratio": orbax_mbps / plain_mbps, "restore_mb_per_s": restore_mbps,
            "plain_read_mb_per_s": read_mbps, "restore_ratio": restore_mbps / read_mbps,
            "blocked_per_save_s": total_blocked / len(saves),
            "plain_in_run_mb_per_s": plain_in_run_mbps,
            "write_ratio_in_run": orbax_mbps / plain_in_run_mbps,
            "restore_in_run_mb_per_s": restore_in_run_mbps,
            "plain_read_in_run_mb_per_s": read_in_run_mbps,
            "restore_ratio_in_run": restore_in_run_mbps / read_in_run_mbps,
            "in_run": in_run, "load_training": load_training, "workload_env": wenv,
        }, indent=2))


if __name__ == "__main__":
    main()
