"""A llama-style decoder in Flax NNX: embedding, RMSNorm, rotary GQA attention with a causal
mask, SwiGLU MLP, untied output projection; the layers stacked on a leading axis and run
with ``nnx.scan`` (``scan_unroll`` layers per iteration) under a configurable remat policy.
Projections that share an input run as one matmul of their stacked weights (``dense``).

Parameters carry *logical* axis names (``out_sharding`` metadata, eager sharding off); the
training code maps them onto the mesh (``logical_to_mesh``), so the model itself knows
nothing about devices. Parameters are stored in ``param_dtype`` and cast to
``compute_dtype`` where they are used; norms, softmax and the logits stay in float32.
The attention kernel (``attention=`` in the config) is chosen in ``workload.attention``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from workload import attention, sums
from workload.config import Config
from workload.loss import matmul_f32, operand, written_t

# Logical axis -> mesh axis. FSDP: every weight is split over its model dimension.
LOGICAL_RULES: dict[str, str | tuple[str, ...] | None] = {
    "embed": "fsdp",
    "vocab": None,
    "heads": None,
    "kv_heads": None,
    "head_dim": None,
    "mlp": None,
    "norm": None,
    "layers": None,
    "batch": ("data", "fsdp"),
}

REMAT = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def dense(spec: str, x: jax.Array, w: jax.Array, dtype: Any) -> jax.Array:
    """``einsum(spec, x, w)`` in ``dtype`` with float32 accumulation: a compute-dtype matmul.

    ``spec`` contracts x's trailing axes with w's leading ones (``"bsd,dtnh->bstnh"``). The
    operands go through ``workload.loss.operand`` (on CPU, bf16-rounded values as float32,
    which XLA:CPU multiplies 1.4-1.5x faster than the same values as bf16 at this model's
    256-2048 wide shapes); the product is rounded to ``dtype`` as a bf16 dot's is. On CPU it
    runs as one 2-D ``matmul`` (its own VJP); elsewhere as the einsum.
    """
    if jax.default_backend() != "cpu":
        return jnp.einsum(spec, operand(x, dtype), operand(w, dtype),
                          preferred_element_type=jnp.float32).astype(dtype)
    k = _contracted_axes(spec)
    lead, tail = x.shape[:x.ndim - k], w.shape[k:]
    y = matmul(x.reshape(math.prod(lead), -1), w.reshape(math.prod(w.shape[:k]), -1), dtype)
    return y.reshape(*lead, *tail)


@functools.cache
def _contracted_axes(spec: str) -> int:
    """How many trailing axes of ``x`` ``spec`` contracts with as many leading axes of ``w``;
    a ValueError for any other einsum."""
    inputs, out = spec.split("->")
    lhs, rhs = inputs.split(",")
    k = sum(1 for c in lhs if c in rhs and c not in out)
    if not 0 < k <= min(len(lhs), len(rhs)) or lhs[len(lhs) - k:] != rhs[:k] \
            or out != lhs[:len(lhs) - k] + rhs[k:]:
        raise ValueError(f"dense: {spec!r} does not contract x's trailing axes with w's leading")
    return k


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def matmul(x: jax.Array, w: jax.Array, dtype: Any) -> jax.Array:
    """``x [n, k] @ w [k, m]`` in ``dtype`` with float32 accumulation (``dense`` on CPU).

    Its own VJP for the weight gradient's product, ``dW = x^T dy``, which contracts over
    the tokens, the major axis of both operands: autodiff's ``dot_general`` left XLA:CPU to
    read ``x`` transposed inside the dot (or to run it as a plain Eigen dot), at 0.19 TFLOP/s
    for the MLP's ``[256, 256] x [256, 2048]`` against 0.24 with ``x^T`` written out first
    (``workload.loss.written_t``), and that ``dW`` came out as ``[m, k]`` and was transposed
    again to the weight's layout. The same products and float32 sums; both gradients are
    rounded through ``dtype`` as autodiff of ``operand``'s casts rounds them.
    """
    return matmul_f32(operand(x, dtype), operand(w, dtype)).astype(dtype)


def _matmul_fwd(x: jax.Array, w: jax.Array, dtype: Any):
    return matmul(x, w, dtype), (x, w)


def _matmul_bwd(dtype: Any, residuals, dy: jax.Array):
    x, w = residuals
    g = operand(dy, dtype)
    dx = matmul_f32(g, operand(w, dtype).T)
    dw = matmul_f32(written_t(operand(x, dtype)), g)
    return dx.astype(dtype).astype(x.dtype), dw.astype(dtype).astype(w.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def _param(rngs: nnx.Rngs, init, shape: tuple[int, ...], axes: tuple[str, ...],
           dtype: Any) -> nnx.Param:
    return nnx.Param(init(rngs.params(), shape, dtype), out_sharding=axes, eager_sharding=False)


def _dense_init(fan_in_axes: tuple[int, ...]):
    return jax.nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal",
                                                in_axis=fan_in_axes, out_axis=-1)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, cfg: Config, rngs: nnx.Rngs):
        self.eps = cfg.norm_eps
        self.scale = _param(rngs, jax.nn.initializers.ones, (dim,), ("norm",), cfg.param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.scale[...], self.eps)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """``x / rms(x) * scale``, in float32, rounded back to x's dtype.

    Its own VJP so that the backward's two sums (over the feature axis for ``dx``, over
    batch and sequence for ``dscale``) are ``workload.sums``: autodiff's were reductions of
    products, which XLA:CPU ran 2-4x slower (nine norms in the bench-21m step)."""
    return _rms_norm_fwd(x, scale, eps)[0]


def _rms_norm_fwd(x: jax.Array, scale: jax.Array, eps: float):
    x32 = x.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * r * scale.astype(jnp.float32)).astype(x.dtype), (x, scale, r)


def _rms_norm_bwd(eps: float, residuals, dy: jax.Array):
    # y = s x r, r = (mean(x^2) + eps)^-1/2:  dx = r (g - xn mean(g xn)), g = dy s, xn = x r.
    x, scale, r = residuals
    xn = x.astype(jnp.float32) * r
    dy32 = dy.astype(jnp.float32)
    g = dy32 * scale.astype(jnp.float32)
    dx = r * (g - xn * (sums.sum_last(g * xn) / x.shape[-1])[..., None])
    return dx.astype(x.dtype), sums.sum_leading(dy32 * xn).astype(scale.dtype)


rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


def rotary(x: jax.Array, positions: jax.Array | np.ndarray, theta: float) -> jax.Array:
    """Rotate pairs (i, i + d/2) of the last axis by position-dependent angles.

    ``positions`` are concrete (the training model's fixed ``0..S-1``): the sin and cos tables
    are computed here, once, by NumPy in float64 rounded to float32, and enter the program as
    constants. Computed in the graph, XLA:CPU evaluated them with scalar ``sincosf`` for q
    and k of every layer, forward and backward, every step (~1.4% of the bench-21m step's
    CPU time).
    """
    half = x.shape[-1] // 2
    freqs = np.float32(theta) ** (-np.arange(half, dtype=np.float32) / np.float32(half))
    angles = (np.asarray(positions, np.float32)[:, None] * freqs[None, :]).astype(np.float64)
    sin = jnp.asarray(np.sin(angles).astype(np.float32)[None, :, None, :])  # [1, S, 1, half]
    cos = jnp.asarray(np.cos(angles).astype(np.float32)[None, :, None, :])
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class Attention(nnx.Module):
    """Causal self-attention; query heads share KV heads in groups of n_heads // n_kv_heads."""

    def __init__(self, cfg: Config, rngs: nnx.Rngs, act_sharding: NamedSharding | None = None):
        d, n, k, h, dt = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.param_dtype
        self.cfg = cfg
        # The kernel (workload.attention) for this platform; static, part of the graph.
        self.kernel = attention.resolve(cfg.attention, jax.default_backend(), cfg.compute_dtype,
                                        cfg.seq_len)
        self.act_sharding = act_sharding  # splash runs in a shard_map over the batch axes
        self.wq = _param(rngs, _dense_init((0,)), (d, n, h), ("embed", "heads", "head_dim"), dt)
        self.wk = _param(rngs, _dense_init((0,)), (d, k, h), ("embed", "kv_heads", "head_dim"), dt)
        self.wv = _param(rngs, _dense_init((0,)), (d, k, h), ("embed", "kv_heads", "head_dim"), dt)
        self.wo = _param(rngs, _dense_init((0, 1)), (n, h, d), ("heads", "head_dim", "embed"), dt)

    def __call__(self, x: jax.Array, positions: jax.Array | np.ndarray) -> jax.Array:
        cfg, dt = self.cfg, x.dtype
        # The projections that share an input run as one wider matmul (stacked on a new axis,
        # so a sharded heads axis stays as it is): q, k, v together when every query head
        # has its own KV head, else q alone and k, v together.
        if cfg.n_heads == cfg.n_kv_heads:
            qkv = dense("bsd,dtnh->bstnh", x, jnp.stack([self.wq[...], self.wk[...],
                                                         self.wv[...]], axis=1), dt)
            q, k, v = (a[:, :, 0] for a in jnp.split(qkv, 3, axis=2))
        else:
            q = dense("bsd,dnh->bsnh", x, self.wq[...], dt)
            kv = dense("bsd,dtkh->bstkh", x, jnp.stack([self.wk[...], self.wv[...]], axis=1), dt)
            k, v = (a[:, :, 0] for a in jnp.split(kv, 2, axis=2))
        q, k = rotary(q, positions, cfg.rope_theta), rotary(k, positions, cfg.rope_theta)
        sharding = self.act_sharding
        out = attention.attend(self.kernel, q, k, v,
                               mesh=sharding.mesh if sharding is not None else None,  # type: ignore[arg-type]
                               batch_axes=sharding.spec[0] if sharding is not None else None,
                               splash_block=cfg.splash_block)
        return dense("bsnh,nhd->bsd", out, self.wo[...], dt)


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: Config, rngs: nnx.Rngs):
        d, m, dt = cfg.d_model, cfg.mlp_dim, cfg.param_dtype
        self.gate = _param(rngs, _dense_init((0,)), (d, m), ("embed", "mlp"), dt)
        self.up = _param(rngs, _dense_init((0,)), (d, m), ("embed", "mlp"), dt)
        self.down = _param(rngs, _dense_init((0,)), (m, d), ("mlp", "embed"), dt)

    def __call__(self, x: jax.Array) -> jax.Array:
        dt = x.dtype
        # gate and up as one [d, 2 x mlp] matmul (see Attention.__call__).
        gu = dense("bsd,dtm->bstm", x, jnp.stack([self.gate[...], self.up[...]], axis=1), dt)
        g, u = (a[:, :, 0] for a in jnp.split(gu, 2, axis=2))
        return dense("bsm,md->bsd", jax.nn.silu(g) * u, self.down[...], dt)


class Block(nnx.Module):
    def __init__(self, cfg: Config, rngs: nnx.Rngs, act_sharding: NamedSharding | None = None):
        self.attn_norm = RMSNorm(cfg.d_model, cfg, rngs)
        self.attn = Attention(cfg, rngs, act_sharding)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg, rngs)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x: jax.Array, positions: jax.Array | np.ndarray) -> jax.Array:
        x = x + self.attn(self.attn_norm(x), positions)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nnx.Module):
    """tokens [B, S] int32 -> logits [B, S, vocab] float32."""

    def __init__(self, cfg: Config, rngs: nnx.Rngs, act_sharding: NamedSharding | None = None):
        self.cfg = cfg
        self.act_sharding = act_sharding  # batch-sharded residual stream, when on a mesh
        self.embed = _param(rngs, jax.nn.initializers.normal(1.0), (cfg.vocab_size, cfg.d_model),
                            ("vocab", "embed"), cfg.param_dtype)

        @nnx.split_rngs(splits=cfg.n_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
        def make_blocks(rngs: nnx.Rngs) -> Block:
            return Block(cfg, rngs, act_sharding)

        self.blocks = make_blocks(rngs)
        self.final_norm = RMSNorm(cfg.d_model, cfg, rngs)
        self.out = _param(rngs, _dense_init((0,)), (cfg.d_model, cfg.vocab_size),
                          ("embed", "vocab"), cfg.param_dtype)

    def _constrain(self, x: jax.Array) -> jax.Array:
        return x if self.act_sharding is None else jax.lax.with_sharding_constraint(x, self.act_sharding)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.hidden(tokens)
        return jnp.einsum("bsd,dv->bsv", x, self.out[...].astype(x.dtype)).astype(jnp.float32)

    def hidden(self, tokens: jax.Array, embedded: jax.Array | None = None) -> jax.Array:
        """tokens [B, S] -> the final-normed residual stream [B, S, d] in the compute dtype:
        what the output projection takes (the training loss fuses that projection with
        the cross-entropy, ``workload.loss``). ``embedded``: the tokens' rows of the
        embedding table, when the caller looked them up (the train step differentiates by
        them)."""
        cfg = self.cfg
        dt = jnp.dtype(cfg.compute_dtype)
        positions = np.arange(tokens.shape[1], dtype=np.int32)  # static: rotary's tables are constants
        if embedded is None:
            embedded = jnp.take(self.embed[...], tokens, axis=0)
        x = self._constrain(embedded.astype(dt))

        def layer(x: jax.Array, block: Block) -> jax.Array:
            return self._constrain(block(x, positions))

        # "auto" is resolved by the train program (workload.autotune); a model built directly
        # from an unresolved config takes auto's CPU choice, none.
        if cfg.remat not in ("none", "auto"):
            layer = nnx.remat(layer, policy=REMAT[cfg.remat], prevent_cse=False)
        x = nnx.scan(layer, in_axes=(nnx.Carry, 0), out_axes=nnx.Carry,
                     unroll=cfg.scan_unroll or cfg.n_layers)(x, self.blocks)
        return self.final_norm(x)


def abstract_model(cfg: Config) -> Transformer:
    """The model with ShapeDtypeStructs for values: shapes, dtypes, axis names, no memory."""
    return nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(0)))


def count_params(model: nnx.Module) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def logical_to_mesh(axes: tuple[str | None, ...], shape: tuple[int, ...],
                    mesh: jax.sharding.Mesh) -> PartitionSpec:
    """Map logical axis names to mesh axes; a dimension the mesh does not divide is replicated
    (correct, only less sharded) instead of failing to compile."""
    spec: list[Any] = []
    used: set[str] = set()
    for name, dim in zip(axes, shape, strict=True):
        target = LOGICAL_RULES.get(name) if name else None
        names = (target,) if isinstance(target, str) else tuple(target or ())
        names = tuple(n for n in names if n in mesh.shape and n not in used)
        size = 1
        for n in names:
            size *= mesh.shape[n]
        if not names or dim % size:
            spec.append(None)
            continue
        used.update(names)
        spec.append(names[0] if len(names) == 1 else names)
    return PartitionSpec(*spec)


def param_shardings(model: nnx.Module, mesh: jax.sharding.Mesh) -> nnx.State:
    """NamedSharding for every parameter, from its logical axes (``out_sharding`` metadata)."""

    def one(v: nnx.Variable) -> nnx.Variable:
        axes = v.get_metadata().get("out_sharding") or (None,) * v.ndim
        return v.replace(NamedSharding(mesh, logical_to_mesh(tuple(axes), v.shape, mesh)))

    return jax.tree.map(one, nnx.state(model, nnx.Param),
                        is_leaf=lambda x: isinstance(x, nnx.Variable))
