"""A first run on a TPU slice with nothing but JAX: linear regression on synthetic data,
data-parallel over every chip of every host, printing its loss.

Google's public JAX image (README "Public images") has all it needs. xrun ships this folder
(``workdir``) through the storage root and runs it there on every host of the slice:
``python3 train.py --steps 200``. With more than one process ``jax.distributed.initialize``
gets the coordinator, process count and this process's id from xrun's env. Runs on a
laptop's CPU too: ``python3 train.py --steps 20``, or 2 local hosts with
``xrun submit --name fr --accelerator cpu-2 --image x --workdir examples/first-run
--command "python3 train.py --steps 20" --follow``.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    processes = int(os.environ.get("XRUN_NUM_PROCESSES", "1"))
    if processes > 1:  # xrun's contract env (README "What every pod gets")
        if os.environ.get("XRUN_PLATFORM") == "cpu":  # a local multi-host run: gloo collectives
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"], processes,
                                   int(os.environ["XRUN_PROCESS_ID"]))
    me = jax.process_index()
    print(f"process {me} of {jax.process_count()}: {jax.local_device_count()} of {jax.device_count()} "
          f"{jax.devices()[0].platform} devices", flush=True)
    rows = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
    w_true = np.arange(1.0, 9.0, dtype=np.float32)

    @jax.jit
    def step(w: jax.Array, i: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = jax.random.normal(jax.random.fold_in(jax.random.key(0), i), (jax.device_count() * 64, 8))
        x = jax.lax.with_sharding_constraint(x, rows)  # each chip holds 64 rows of the batch
        y = x @ w_true
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return w - args.lr * grad, loss

    w = np.zeros(8, np.float32)
    start = time.perf_counter()
    for i in range(1, args.steps + 1):
        w, loss = step(w, i)
        if me == 0 and (i in (1, args.steps) or i % 20 == 0):
            print(f"step {i} loss {float(loss):.6f}", flush=True)
    if me == 0:
        print(f"done: {args.steps} steps in {time.perf_counter() - start:.1f} s, "
              f"w = [{', '.join(f'{v:.3f}' for v in np.asarray(w))}]", flush=True)


if __name__ == "__main__":
    main()
