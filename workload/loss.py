"""The training loss: output projection and token cross-entropy as one differentiable op.

Why not ``cross_entropy(model(tokens))`` through autodiff: the vocabulary-sized tensors are
most of the memory traffic of a small model's step (bench-21m: logits 256 x 32000 per
sequence, the 256 x 32000 output weight). Autodiff of ``einsum("bsd,dv->bsv")`` +
``logsumexp`` + ``take_along_axis`` writes the logits in the compute dtype and again in
float32, runs the softmax backward as separate passes (exp, a scatter of the one-hot
gradient, a reduce), and transposes the weight gradient: JAX's dot transpose rule computes
``dW`` as ``[vocab, d]`` and transposes it afterwards, which XLA:CPU runs as an
unvectorised copy of the whole weight. Here the forward writes the logits once (float32
accumulation of compute-dtype inputs, kept in float32; MaxText rounds them to the compute
dtype and then casts to float32, ``cast_logits_to_fp32``), and the
backward forms ``d logits = (g_nll + 2 g_z lse) softmax - g_nll onehot`` in one pass (on
CPU the one-hot entries then set in place, ``_dlogits``), then
two dots whose outputs are already in the layouts wanted (``dx [b, s, d]``, ``dW [d, v]``).
The FLOPs are the three ``2 b s d V`` dots MaxText's accounting counts, nothing recomputed.

Same function as the reference ``workload.train.cross_entropy(model(tokens))``: mean token
negative log-likelihood and ``mean(logsumexp^2)`` (the z-loss term); only the rounding
differs (the logits are not rounded to the compute dtype before the softmax).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def output_cross_entropy(x: jax.Array, w: jax.Array, targets: jax.Array,
                         compute_dtype: str) -> tuple[jax.Array, jax.Array]:
    """``(mean nll, mean lse^2)`` of ``logits = x @ w.astype(compute_dtype)``.

    ``x [b, s, d]`` in the compute dtype, ``w [d, vocab]`` (the parameter, any dtype),
    ``targets [b, s]`` int. Differentiable in ``x`` and ``w``.
    """
    (nll, zsq), _ = _forward(x, w, targets, compute_dtype)
    return nll, zsq


def operand(a: jax.Array, compute_dtype: jax.typing.DTypeLike) -> jax.Array:
    """``a`` rounded to the compute dtype, as a dot operand with float32 accumulation.

    On CPU the rounded values are handed over as float32: XLA:CPU's dot kernels (YNNPACK)
    have no native bf16 arithmetic on CPUs without AVX512-BF16/AMX and run a bf16 x bf16 ->
    f32 dot 3-4x slower than the same values in float32; XLA does the same for a dot with
    bf16 output. Same products, same float32 sums: only the speed differs.
    """
    a = a.astype(compute_dtype)
    if jax.default_backend() == "cpu" and a.dtype != jnp.float32:
        a = a.astype(jnp.float32)
    return a


def matmul_f32(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a @ b`` (batched over leading axes) with float32 accumulation and output."""
    return jnp.matmul(a, b, preferred_element_type=jnp.float32)


def written_t(a: jax.Array) -> jax.Array:
    """``a`` with its last two axes swapped, written out: an ``optimization_barrier`` keeps
    XLA from folding the transpose back into the product that reads it. XLA:CPU runs a
    product whose left operand it reads transposed (a contraction over the major axis of
    both, as in a weight gradient ``x^T dy``) at about half the rate, or as a plain Eigen
    dot (bench/RESULTS.md, "sixth pass")."""
    return jax.lax.optimization_barrier(jnp.matrix_transpose(a))


def _forward(x: jax.Array, w: jax.Array, targets: jax.Array, compute_dtype: str):
    wc = operand(w, compute_dtype)
    logits = jnp.einsum("bsd,dv->bsv", operand(x, compute_dtype), wc,
                        preferred_element_type=jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    nll = jnp.mean(lse - target_logit)
    return (nll, jnp.mean(lse * lse)), (x, w, wc, logits, lse, targets)


def _fwd(x, w, targets, compute_dtype):
    return _forward(x, w, targets, compute_dtype)


def _bwd(compute_dtype, residuals, cotangents):
    x, w, wc, logits, lse, targets = residuals
    g_nll, g_z = cotangents
    count = lse.size
    # d nll / d logits = (softmax - onehot) / n;  d mean(lse^2) / d logits = 2 lse softmax / n.
    scale = (g_nll + 2.0 * g_z * lse[..., None]) / count
    dlogits = _dlogits(logits, lse, targets, scale, g_nll / count, compute_dtype,
                       targets_in_place=jax.default_backend() == "cpu")
    dx = jnp.einsum("bsv,dv->bsd", dlogits, wc, preferred_element_type=jnp.float32)
    dw = jnp.einsum("bsd,bsv->dv", operand(x, compute_dtype), dlogits,
                    preferred_element_type=jnp.float32)
    return dx.astype(x.dtype), dw.astype(w.dtype), None


def _dlogits(logits: jax.Array, lse: jax.Array, targets: jax.Array, scale: jax.Array,
             target_term: jax.Array, compute_dtype: str, targets_in_place: bool) -> jax.Array:
    """``scale * softmax(logits) - target_term * onehot(targets)``, rounded to the compute
    dtype.

    ``targets_in_place`` (CPU): the one-hot term touches one logit per token, so those
    ``b*s`` entries are set afterwards, in place, instead of comparing every logit's index
    with its token's target: that compare made the pass 2x slower on CPU (the bench-21m
    batch-1 step 1-3% faster, alternating A/B). The same arithmetic. Elsewhere the compare
    fuses for free and a scatter would cost more than it saves.
    """
    probs = jnp.exp(logits - lse[..., None])
    if not targets_in_place:
        onehot = targets[..., None] == jnp.arange(logits.shape[-1], dtype=targets.dtype)
        return operand(scale * probs - jnp.where(onehot, target_term, 0.0), compute_dtype)
    dlogits = operand(scale * probs, compute_dtype)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)
    at_target = scale * jnp.exp(target_logit - lse[..., None]) - target_term
    return _put_along_last(dlogits, targets, operand(at_target, compute_dtype))


def _put_along_last(a: jax.Array, index: jax.Array, values: jax.Array) -> jax.Array:
    """``a`` with ``a[..., index[...]] = values[..., 0]``: one entry per row of the last axis.

    Mapped over the rows (a scatter with a batching dimension), so that a batch-sharded
    ``a`` stays sharded with no collective: a scatter at flat ``(row, index)`` coordinates
    made the SPMD partitioner all-gather the indices and values every step.
    """
    def put(row: jax.Array, i: jax.Array, v: jax.Array) -> jax.Array:
        return row.at[i].set(v, unique_indices=True)

    rows = jax.vmap(put)(a.reshape(-1, a.shape[-1]), index.reshape(-1), values.reshape(-1))
    return rows.reshape(a.shape)


output_cross_entropy.defvjp(_fwd, _bwd)


def loss_and_aux(nll: jax.Array, zsq: jax.Array, z_loss: float) -> tuple[jax.Array, dict]:
    """The training loss from the two terms, as ``workload.train.cross_entropy`` forms it."""
    loss = nll + z_loss * zsq if z_loss else nll
    return loss, {"nll": nll}
