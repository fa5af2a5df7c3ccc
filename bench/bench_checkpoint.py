"""Benchmark: what checkpointing costs the training loop, and how fast it writes.

Runs the workload (default ``bench-21m``, one CPU device) with async Orbax saves every K
steps into a folder on the disk under test. For every save it reports the training time
blocked (waiting for the previous save + the device-to-host copy, from the run's own
checkpoint records), the total save time (Orbax's init -> commit timestamps in the step's
metadata) and the bytes written; then it writes the same number of bytes as one plain file
(write + fsync) in the same folder and compares throughputs; then it restores the last save
through Orbax and reads a plain file of the same size, and compares those.

    python bench/bench_checkpoint.py [--preset bench-21m] [--steps 40] [--every 10] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
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
    t = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass
    seconds = time.perf_counter() - t
    path.unlink()
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="bench-21m")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=10, help="save every K steps (and at the last)")
    p.add_argument("--dir", help="folder on the disk under test (default: a temporary folder)")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        records = run_workload(tmp, "ckpt", args.preset,
                               [f"steps={args.steps}", f"checkpoint_every={args.every}",
                                "max_to_keep=100"],
                               env={"XRUN_PLATFORM": "cpu", "XRUN_DEVICES_PER_HOST": "1"})
        saves = checkpoint_costs(records, tmp, "ckpt")
        nbytes = max(s["bytes"] for s in saves)
        plain = min(plain_write_seconds(Path(tmp), nbytes) for _ in range(3))
        last = Path(tmp, "runs/ckpt/checkpoints", str(saves[-1]["step"]))
        restore_s = min(restore_seconds(last) for _ in range(2))
        read_s = min(plain_read_seconds(Path(tmp), saves[-1]["bytes"]) for _ in range(2))
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
    print(f"write: Orbax {orbax_mbps:.1f} MB/s vs plain file write + fsync {plain_mbps:.1f} MB/s "
          f"(ratio {orbax_mbps / plain_mbps:.2f})")
    print(f"restore: Orbax {restore_mbps:.1f} MB/s vs plain file read {read_mbps:.1f} MB/s "
          f"(ratio {restore_mbps / read_mbps:.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "preset": args.preset, "saves": saves, "blocked_s": total_blocked,
            "save_s": total_save, "orbax_mb_per_s": orbax_mbps, "plain_mb_per_s": plain_mbps,
            "write_ratio": orbax_mbps / plain_mbps, "restore_mb_per_s": restore_mbps,
            "plain_read_mb_per_s": read_mbps, "restore_ratio": restore_mbps / read_mbps,
            "blocked_per_save_s": total_blocked / len(saves),
        }, indent=2))


if __name__ == "__main__":
    main()
