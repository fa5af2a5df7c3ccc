"""Causal grouped-query attention, one function per kernel (#17).

All take ``q [B, S, N, H]``, ``k, v [B, S, K, H]`` (N a multiple of K, rotary applied) and
return ``[B, S, N, H]`` in q's dtype; softmax in float32, scale ``H ** -0.5``.

* ``einsum``: plain XLA einsums with a materialised [S, S] mask; runs everywhere, the
  reference the others are tested against. On CPU ``attend`` runs it as ``einsum_cpu``: the
  same products with its own VJP, the scores kept in float32.
* ``xla`` / ``cudnn``: ``jax.nn.dot_product_attention`` (``jax/_src/nn/functions.py``), with
  ``implementation="xla"`` (any platform) or ``"cudnn"`` (cuDNN flash attention: NVIDIA GPU,
  fp16/bf16, head_dim a multiple of 8 up to 128; ``jax._src.cudnn.fused_attention_stablehlo``).
* ``splash``: the Pallas TPU splash-attention kernel (``jax.experimental.pallas.ops.tpu.
  splash_attention``), as MaxText's ``tpu_flash_attention`` uses it: one kernel per
  [heads, seq, head_dim] example, vmapped over the batch, causal mask, GQA native. Under a
  multi-device mesh it runs inside ``shard_map`` over the batch axes (a Pallas call cannot
  be auto-partitioned). ``interpret=True`` runs the kernel in the Pallas interpreter (CPU).

``resolve`` turns ``auto`` into the kernel for a platform: splash on TPU (xla when seq_len
is not a multiple of 128), cudnn on GPU when the compute dtype is half precision (cuDNN
has no fp32 flash path; xla otherwise), einsum on CPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from workload import sums
from workload.loss import matmul_f32, operand, written_t

# Splash's kv compute block must be a multiple of 128 (its own check: "bkv_compute=64 must be
# a multiple of 128"), and the block cannot exceed the sequence: seq_len % 128 == 0.
SPLASH_BLOCK_MULTIPLE = 128


def resolve(choice: str, platform: str, compute_dtype: str, seq_len: int) -> str:
    """The kernel ``attention=<choice>`` means on ``platform`` (jax.default_backend())."""
    if choice != "auto":
        return choice
    if platform == "tpu":
        return "splash" if seq_len % SPLASH_BLOCK_MULTIPLE == 0 else "xla"
    if platform in ("gpu", "cuda", "rocm") and compute_dtype in ("bfloat16", "float16"):
        return "cudnn"
    return "einsum" if platform == "cpu" else "xla"


def einsum(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    b, s, n, h = q.shape
    kv = k.shape[2]
    positions = jnp.arange(s)
    qg = q.reshape(b, s, kv, n // kv, h)
    scores = jnp.einsum("bskgh,btkh->bkgst", qg, k).astype(jnp.float32) * h**-0.5
    causal = positions[:, None] >= positions[None, :]
    scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
    probs = softmax(scores).astype(q.dtype)
    return jnp.einsum("bkgst,btkh->bskgh", probs, v).reshape(b, s, n, h)


def einsum_cpu(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """``einsum`` as XLA:CPU runs it faster: heads first (``[B, K, G*S, H]``, each KV head's
    query group stacked along the sequence), the causal mask an added constant, and its own
    VJP (``_causal_core``), whose two products with a transposed left operand read it
    written out. The same products; the scores stay in float32 where ``einsum`` rounds them
    to q's dtype first; every other rounding as ``einsum`` and its autodiff do
    (probabilities, output; ``dp``, the scaled score gradient and the three input
    gradients). In-process A/B of the bench-21m batch-1 step: 0.982-0.987x."""
    b, s, n, h = q.shape
    kv = k.shape[2]
    qt = jnp.transpose(q.reshape(b, s, kv, n // kv, h), (0, 2, 3, 1, 4)).reshape(b, kv, -1, h)
    out = _causal_core(qt, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2))
    return jnp.transpose(out.reshape(b, kv, n // kv, s, h), (0, 3, 1, 2, 4)).reshape(b, s, n, h)


def _causal_bias(groups: int, s: int) -> jax.Array:
    """``[G*S, S]``: 0 where a query may see a key, the float32 minimum where not (``einsum``'s
    masked score; a score added to it stays far below any row's maximum)."""
    p = np.arange(s)
    mask = np.where(p[:, None] >= p[None, :], 0.0, np.finfo(np.float32).min).astype(np.float32)
    return jnp.asarray(np.tile(mask, (groups, 1)))


@jax.custom_vjp
def _causal_core(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """``softmax(q k^T * H^-0.5 + mask) v`` for ``q [B, K, G*S, H]``, ``k, v [B, K, S, H]``."""
    return _causal_core_fwd(q, k, v)[0]


def _causal_core_fwd(q: jax.Array, k: jax.Array, v: jax.Array):
    dt, h = q.dtype, q.shape[-1]
    scores = matmul_f32(operand(q, dt), jnp.matrix_transpose(operand(k, dt)))
    scores = scores * h**-0.5 + _causal_bias(q.shape[-2] // k.shape[-2], k.shape[-2])
    p = jax.nn.softmax(scores, axis=-1)
    return matmul_f32(operand(p.astype(dt), dt), operand(v, dt)).astype(dt), (q, k, v, p)


def _causal_core_bwd(residuals, do: jax.Array):
    q, k, v, p = residuals
    dt, h = q.dtype, q.shape[-1]
    g = operand(do, dt)
    dv = matmul_f32(written_t(operand(p.astype(dt), dt)), g)
    dp = matmul_f32(g, jnp.matrix_transpose(operand(v, dt))).astype(dt).astype(jnp.float32)
    ds = operand((p * (dp - sums.sum_last(p * dp)[..., None]) * h**-0.5).astype(dt), dt)
    dq = matmul_f32(ds, operand(k, dt))
    dk = matmul_f32(written_t(ds), operand(q, dt))
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


_causal_core.defvjp(_causal_core_fwd, _causal_core_bwd)


@jax.custom_vjp
def softmax(x: jax.Array) -> jax.Array:
    """``jax.nn.softmax(x, axis=-1)`` with the backward's row sum as ``workload.sums.sum_last``
    (``dx = p (dp - sum(p dp))``): autodiff's was a reduction of a product, which XLA:CPU
    ran ~4x slower on the bench-21m attention's [4, 256, 256] probabilities."""
    return jax.nn.softmax(x, axis=-1)


def _softmax_fwd(x: jax.Array):
    p = jax.nn.softmax(x, axis=-1)
    return p, p


def _softmax_bwd(p: jax.Array, dp: jax.Array):
    return (p * (dp - sums.sum_last(p * dp)[..., None]),)


softmax.defvjp(_softmax_fwd, _softmax_bwd)


def dot_product(q: jax.Array, k: jax.Array, v: jax.Array, implementation: str) -> jax.Array:
    """``jax.nn.dot_product_attention`` (layout BTNH, GQA when N % K == 0)."""
    return jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                        implementation=implementation)  # type: ignore[call-overload]


@functools.cache
def _splash_kernel(heads: int, seq: int, interpret: bool, block: int = 512):
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as sk,
    )
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as sm,
    )

    block = min(block, seq)
    sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                          block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                          block_q_dq=block, block_kv_dq=block)
    mask = sm.MultiHeadMask([sm.CausalMask((seq, seq)) for _ in range(heads)])
    # The kernel keeps its mask tables as arrays: make them concrete even when first asked
    # for inside a jit trace, so the cached kernel holds no tracer.
    with jax.ensure_compile_time_eval():
        return sk.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                  interpret=interpret)


def splash(q: jax.Array, k: jax.Array, v: jax.Array, interpret: bool = False,
           mesh: jax.sharding.Mesh | None = None, batch_axes=None,
           block: int = 512) -> jax.Array:
    """Splash attention; ``mesh``/``batch_axes`` put it in a shard_map over the batch."""
    b, s, n, h = q.shape
    kernel = _splash_kernel(n, s, interpret, block)

    def local(q, k, v):
        # [B, S, N, H] -> [B, N, S, H]; splash does not scale q (MaxText scales first).
        qt = jnp.swapaxes(q * jnp.asarray(h**-0.5, q.dtype), 1, 2)
        out = jax.vmap(kernel)(qt, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2))
        return jnp.swapaxes(out, 1, 2).astype(q.dtype)

    if mesh is None or mesh.size == 1:
        return local(q, k, v)
    from jax.sharding import PartitionSpec as P

    spec = P(batch_axes, None, None, None)
    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec,
                         check_vma=False)(q, k, v)


def attend(kind: str, q: jax.Array, k: jax.Array, v: jax.Array,
           mesh: jax.sharding.Mesh | None = None, batch_axes=None,
           splash_block: int = 512) -> jax.Array:
    """Dispatch on a resolved kernel name (never ``auto``)."""
    if kind == "einsum":
        return einsum_cpu(q, k, v) if jax.default_backend() == "cpu" else einsum(q, k, v)
    if kind in ("xla", "cudnn"):
        return dot_product(q, k, v, kind)
    if kind == "splash":  # off TPU (a test, a laptop): the same kernel, interpreted
        return splash(q, k, v, interpret=jax.default_backend() != "tpu", mesh=mesh,
                      batch_axes=batch_axes, block=splash_block)
    raise ValueError(f"unknown attention kernel {kind!r}")
