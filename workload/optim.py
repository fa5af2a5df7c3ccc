"""The pure JAX part of the train step: the optimizer (AdamW, warmup-cosine, clipping), the
embedding table's sparse update, and the reference cross-entropy."""

from __future__ import annotations

from workload.config import Config


def make_optimizer(cfg: Config):
    """AdamW (no decay on norm scales), linear warmup then cosine, global-norm clipping."""
    import optax

    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.learning_rate, warmup_steps=cfg.warmup_steps,
        decay_steps=max(cfg.steps, cfg.warmup_steps + 1),
        end_value=cfg.learning_rate * cfg.min_lr_ratio)

    tx = optax.chain(
        clip_by_global_norm(cfg.grad_clip) if cfg.grad_clip > 0 else optax.identity(),
        make_adamw(cfg, schedule),
    )
    return tx, schedule


ADAM_EPS = 1e-8  # AdamW's epsilon (optax's default), also in optimizer_step's table update


def make_adamw(cfg: Config, schedule):
    """The AdamW of ``make_optimizer``'s chain (the chain's state is ``(clip, adamw)``):
    weight decay on everything but the norms' scales."""
    import jax
    import optax

    def decay_mask(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, _: getattr(path[-1], "key", None) != "scale", params)

    return optax.adamw(schedule, b1=cfg.adam_b1, b2=cfg.adam_b2, eps=ADAM_EPS,
                       weight_decay=cfg.weight_decay, mask=decay_mask)


def embedding_gradient(ids, d_rows, vocab_size: int):
    """The embedding table's gradient, sparse: ``(rows, grads)``, the distinct ids of ``ids``
    and the sum of their rows of ``d_rows`` (``[*ids.shape, d]``: the gradient of each
    looked-up row). Static size ``ids.size``: unused slots have the id ``vocab_size`` (out of
    range: the scatters that use them drop it) and zero gradients."""
    import jax
    import jax.numpy as jnp

    n = ids.size
    rows, inverse = jnp.unique(ids.reshape(n), size=n, fill_value=vocab_size,
                               return_inverse=True)
    grads = jax.ops.segment_sum(d_rows.reshape(n, -1), inverse.reshape(n), num_segments=n)
    return rows, grads


def embedding_route(cfg: Config) -> str:
    """``cfg.embedding_update`` resolved. ``auto``: ``dense`` on TPU, where the row-wise
    update's two scatters and weight pass took 4.6 ms of the 618M config's 246 ms step and
    the dense gradient + optax's fused AdamW is 2.9 ms faster a step (bench_tpu.py on a v5e
    chip: 0.2460 -> 0.2431 s, MFU 59.4% -> 60.1% of spec); ``sparse`` elsewhere
    (``optimizer_step``, written for XLA:CPU, where the dense gradient's passes cost most;
    GPUs are unmeasured)."""
    if cfg.embedding_update != "auto":
        return cfg.embedding_update
    import jax

    return "dense" if jax.default_backend() == "tpu" else "sparse"


def optimizer_step(cfg: Config, adamw, schedule, params: dict, opt_state, grads: dict,
                   rows, row_grads):
    """``make_optimizer``'s update (global-norm clipping, then ``adamw``) with the embedding
    table's gradient sparse: ``grads`` has no ``embed`` entry, ``(rows, row_grads)`` (from
    ``embedding_gradient``) stands for it. Returns ``(params, opt_state, gradient norm)``.

    Why: autodiff's table gradient was a zero-filled ``[vocab, d]`` buffer with a few rows
    added (bench-21m: at most 256 of 32,000), written every step and then read by the norm
    and by each of AdamW's moments. A row with a zero gradient still moves (its moments
    decay, its weight decays), so the table's update still reads and writes the table and
    both moments in full; only the gradient's passes go.

    Everything but the table goes through ``adamw`` itself. The table's update is AdamW
    written out: optax's ``scale_by_adam`` (eps ``ADAM_EPS``, eps_root 0),
    ``add_decayed_weights`` (the table is no norm scale: decayed), ``scale_by_learning_rate``
    and ``apply_updates``, in their order. The moments are decayed over the whole table and
    the touched rows' gradient terms added in place, then one pass writes the weights: XLA
    writes each decayed moment once, in place, and the weights' loop reads them (a form
    that gathered the old rows made it copy both moments to keep them).
    """
    import jax
    import jax.numpy as jnp
    import optax

    norm = jnp.sqrt(optax.tree.norm(grads, squared=True) + jnp.sum(row_grads * row_grads))
    factor = clip_factor(norm, cfg.grad_clip) if cfg.grad_clip > 0 else jnp.ones((), norm.dtype)
    clip_state, adam_state = opt_state
    moments = adam_state[0]  # optax.adamw's chain: scale_by_adam, add_decayed_weights, lr
    if not isinstance(moments, optax.ScaleByAdamState):
        raise TypeError(f"unexpected AdamW state {type(moments).__name__}")
    table, mu, nu = params["embed"], moments.mu["embed"], moments.nu["embed"]

    # Everything else: the table's gradient zero (its results are not used).
    scaled = {**jax.tree.map(lambda t: t * factor.astype(t.dtype), grads),
              "embed": jnp.zeros_like(table)}
    updates, adam_state = adamw.update(scaled, adam_state, params)
    new_params = optax.apply_updates(params, updates)

    count = optax.safe_increment(moments.count)
    bc1, bc2 = 1 - cfg.adam_b1 ** count, 1 - cfg.adam_b2 ** count
    step_size = -schedule(moments.count)
    # The moments: decayed everywhere, the touched rows' gradient terms added in place (for
    # those rows, optax's (1 - b1) g + b1 m with the two terms swapped: the same sum).
    g = row_grads * factor.astype(row_grads.dtype)
    mu = (cfg.adam_b1 * mu).at[rows].add((1 - cfg.adam_b1) * g, mode="drop")
    nu = (cfg.adam_b2 * nu).at[rows].add((1 - cfg.adam_b2) * (g * g), mode="drop")
    # The weights: one pass over the table from the new moments, touched rows included.
    u = (mu / bc1.astype(mu.dtype)) / (jnp.sqrt(nu / bc2.astype(nu.dtype) + 0.0) + ADAM_EPS)
    new_params["embed"] = table + jnp.asarray(step_size, table.dtype) * (
        u + cfg.weight_decay * table)
    moments = adam_state[0]
    adam_state = (moments._replace(mu={**moments.mu, "embed": mu},
                                   nu={**moments.nu, "embed": nu}), *adam_state[1:])
    return new_params, (clip_state, adam_state), norm


def clip_by_global_norm(max_norm: float):
    """``optax.clip_by_global_norm`` (optax/transforms/_clipping.py, ``update_fn``) with the
    clipping as one scalar factor: ``t * where(norm < max, 1, max / norm)`` instead of
    ``select(norm < max, t, t / norm * max)``. Same result (to a rounding); but a multiply
    by a scalar is cheap enough for XLA to fuse into each Adam moment's loop, where the
    element-wise divide made XLA:CPU write the whole clipped gradient out once more (a
    pass over the vocabulary-sized embedding and output gradients per step)."""
    import jax
    import optax

    def update(updates, state, params=None):
        del params
        factor = clip_factor(optax.tree.norm(updates), max_norm)
        return jax.tree.map(lambda t: t * factor.astype(t.dtype), updates), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def clip_factor(norm, max_norm: float):
    """The scalar global-norm clipping multiplies every gradient by (``clip_by_global_norm``
    and the train step's ``optimizer_step``)."""
    import jax.numpy as jnp

    return jnp.where(norm < max_norm, 1.0, max_norm / norm)


def cross_entropy(logits, targets, z_loss: float):
    """Mean token cross-entropy (+ z_loss x mean(logsumexp^2)); logits are float32."""
    import jax
    import jax.numpy as jnp

    lse = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    nll = jnp.mean(lse - target_logit)
    loss = nll + z_loss * jnp.mean(lse**2) if z_loss else nll
    return loss, {"nll": nll}
