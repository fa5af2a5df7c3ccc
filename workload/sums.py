"""Sums that the backward passes need, as matmuls with a vector of ones on CPU.

XLA:CPU hands a reduction whose input is an element-wise product (``sum(a * b)``, the shape
every norm's and softmax's backward takes) to YNNPACK's reduction, which ran the bench-21m
step's ``[256, 256]`` sums in 0.45-0.65 ms and the attention's ``[4, 256, 256]`` row sums
in ~1.1 ms; the same product written out by XLA's element-wise loop and summed by a
``[n, d] x [d]`` matmul took a quarter of that (bench/RESULTS.md, "fifth pass"). The same
float32 sums, in another order. Elsewhere (TPU, GPU) a plain ``jnp.sum`` is kept: a float32
matmul there runs at the platform's default (reduced) matmul precision.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _as_matmul() -> bool:
    return jax.default_backend() == "cpu"


def sum_last(x: jax.Array) -> jax.Array:
    """``x.sum(-1)``."""
    if not _as_matmul():
        return jnp.sum(x, axis=-1)
    return jnp.einsum("...d,d->...", x, jnp.ones(x.shape[-1], x.dtype))


def sum_leading(x: jax.Array) -> jax.Array:
    """``x`` summed over every axis but the last: ``[..., d] -> [d]``."""
    if not _as_matmul():
        return jnp.sum(x, axis=tuple(range(x.ndim - 1)))
    return jnp.einsum("...d,...->d", x, jnp.ones(x.shape[:-1], x.dtype))
