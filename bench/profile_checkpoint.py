"""Profile: Orbax/TensorStore write and restore throughput per setting, against a plain
write (+ fsync) and a plain read of the same bytes in the same folder, in one run.

A pytree of random float32 arrays (incompressible, like trained weights and Adam moments)
is saved by ``CheckpointManager`` with each variant of the handler settings xrun can choose:
zstd compression on/off, OCDBT on/off, the OCDBT target data file size, the concurrent-GB
limits, the OCDBT data file size (more, smaller files: more parallel writers). Each variant
is saved ``--repeat`` times; the best time counts.

    python bench/profile_checkpoint.py [--mb 170] [--dir DIR] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_checkpoint import plain_read_seconds, plain_write_seconds  # noqa: E402


def make_state(mb: int):
    import jax
    import numpy as np

    rng = np.random.default_rng(0)
    n_arrays = 12
    per = mb * (1 << 20) // 4 // n_arrays
    cols = 256
    return {f"a{i}": jax.device_put(rng.standard_normal((per // cols, cols), dtype=np.float32))
            for i in range(n_arrays)}


def nbytes(state) -> int:
    return sum(x.nbytes for x in state.values())


def orbax_variant(folder: Path, state, handler_kwargs: dict, repeat: int) -> tuple[float, float, float]:
    """(best save seconds: call -> committed, best blocked seconds, best restore seconds)."""
    import jax
    import orbax.checkpoint as ocp

    handler_kwargs = dict(handler_kwargs)
    target = handler_kwargs.pop("ocdbt_target_data_file_size", None)
    saves, blocks, restores = [], [], []
    for r in range(repeat):
        d = folder / f"ck-{r}"
        mgr = ocp.CheckpointManager(d, options=ocp.CheckpointManagerOptions(create=True),
                                    item_handlers={"state": ocp.PyTreeCheckpointHandler(
                                        **handler_kwargs)})
        t = time.perf_counter()
        mgr.save(1, args=ocp.args.Composite(state=ocp.args.PyTreeSave(
            state, ocdbt_target_data_file_size=target)))
        blocks.append(time.perf_counter() - t)
        mgr.wait_until_finished()
        saves.append(time.perf_counter() - t)
        mgr.close()
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                                state)
        h = ocp.PyTreeCheckpointHandler(**{k: v for k, v in handler_kwargs.items()
                                           if k in ("use_ocdbt", "use_zarr3")})
        t = time.perf_counter()
        out = h.restore(d / "1" / "state", args=ocp.args.PyTreeRestore(
            item=abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract)))
        jax.block_until_ready(out)
        restores.append(time.perf_counter() - t)
        h.close()
        import shutil

        shutil.rmtree(d)
    return min(saves), min(blocks), min(restores)


VARIANTS = {
    "default (zstd, ocdbt)": dict(use_ocdbt=True, use_zarr3=True),
    "no compression": dict(use_ocdbt=True, use_zarr3=True, use_compression=False),
    "no compression, save_concurrent_gb=1": dict(use_ocdbt=True, use_zarr3=True,
                                                  use_compression=False, save_concurrent_gb=1),
    "no compression, no ocdbt": dict(use_ocdbt=False, use_zarr3=True, use_compression=False),
    "no compression, ocdbt files 16 MiB": dict(use_ocdbt=True, use_zarr3=True,
                                               use_compression=False,
                                               ocdbt_target_data_file_size=16 << 20),
    "no compression, ocdbt files 64 MiB": dict(use_ocdbt=True, use_zarr3=True,
                                               use_compression=False,
                                               ocdbt_target_data_file_size=64 << 20),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=170)
    p.add_argument("--dir", help="folder on the disk under test (default: a temporary folder)")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--only", help="comma-separated variant names")
    p.add_argument("--json")
    args = p.parse_args()
    state = make_state(args.mb)
    n = nbytes(state)
    results = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        w = min(plain_write_seconds(folder, n) for _ in range(args.repeat))
        rd = plain_read_seconds(folder, n)
        print(f"{n / 1e6:.0f} MB: plain write+fsync {n / w / 1e6:.0f} MB/s, plain read "
              f"{n / rd / 1e6:.0f} MB/s")
        print(f"{'variant':<40} {'save MB/s':>9} {'ratio':>6} {'blocked s':>9} "
              f"{'restore MB/s':>12} {'ratio':>6}")
        names = args.only.split(",") if args.only else list(VARIANTS)
        for name in names:
            save_s, blocked_s, restore_s = orbax_variant(folder, state, VARIANTS[name], args.repeat)
            results[name] = dict(save_mb_s=n / save_s / 1e6, write_ratio=w / save_s,
                                 blocked_s=blocked_s, restore_mb_s=n / restore_s / 1e6,
                                 restore_ratio=rd / restore_s)
            r = results[name]
            print(f"{name:<40} {r['save_mb_s']:>9.0f} {r['write_ratio']:>6.2f} "
                  f"{blocked_s:>9.3f} {r['restore_mb_s']:>12.0f} {r['restore_ratio']:>6.2f}",
                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"bytes": n, "plain_write_mb_s": n / w / 1e6,
                                               "plain_read_mb_s": n / rd / 1e6,
                                               "variants": results}, indent=2))


if __name__ == "__main__":
    main()
