"""The step-speed changes of #16 keep the maths: stacked projections are the separate ones,
an unrolled layer scan gives the same gradients, ``dense`` is a compute-dtype matmul whose own
backward is autodiff's, the norm's and softmax's own backward passes are autodiff's, and the
CPU allocator setting really stops the per-step page faults it is there for."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from workload.config import load_config

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("kv_heads", [2, 4])  # grouped (q alone, k+v stacked) and q+k+v stacked
def test_block_is_the_separate_projections_reference(kv_heads):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from workload import attention
    from workload.model import Block, rotary

    cfg = load_config("tiny", [f"n_kv_heads={kv_heads}"])
    block = Block(cfg, nnx.Rngs(3))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 16, cfg.d_model)), jnp.float32)
    positions = jnp.arange(16)

    def reference(x):
        a = block.attn
        h = block.attn_norm(x)
        q = rotary(jnp.einsum("bsd,dnh->bsnh", h, a.wq[...]), positions, cfg.rope_theta)
        k = rotary(jnp.einsum("bsd,dkh->bskh", h, a.wk[...]), positions, cfg.rope_theta)
        v = jnp.einsum("bsd,dkh->bskh", h, a.wv[...])
        x = x + jnp.einsum("bsnh,nhd->bsd", attention.einsum(q, k, v), a.wo[...])
        h = block.mlp_norm(x)
        m = block.mlp
        return x + (jax.nn.silu(h @ m.gate[...]) * (h @ m.up[...])) @ m.down[...]

    np.testing.assert_allclose(block(x, positions), reference(x), rtol=1e-5, atol=1e-5)


def test_rotary_tables_are_constants_of_the_program_and_the_same_rotation():
    """The rotation is the in-graph formula's (float32 angles, sin and cos), and the train step
    computes no sine or cosine of a tensor: the tables are constants (the only cosine left is
    the learning-rate schedule's scalar)."""
    import re

    import jax
    import jax.numpy as jnp

    from workload.distributed import make_mesh
    from workload.model import rotary
    from workload.train import Program

    x = jnp.asarray(np.random.default_rng(2).standard_normal((2, 64, 3, 32)), jnp.float32)
    static = rotary(x, np.arange(64, dtype=np.int32), 10000.0)

    @jax.jit
    def in_graph(x, positions):  # the formula as the graph computed it before
        freqs = 10000.0 ** (-jnp.arange(16, dtype=jnp.float32) / 16)
        angles = positions[:, None].astype(jnp.float32) * freqs[None, :]
        sin, cos = jnp.sin(angles)[None, :, None, :], jnp.cos(angles)[None, :, None, :]
        x1, x2 = jnp.split(x, 2, axis=-1)
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    traced = in_graph(x, jnp.arange(64))
    np.testing.assert_allclose(static, traced, rtol=1e-5, atol=1e-5)
    assert not np.allclose(static, x)  # it does rotate

    # The step as traced (HLO before XLA's passes, no compile): a sine or cosine of a tensor
    # computed in the graph shows here even where XLA would fold it into a constant.
    cfg = load_config("tiny", ["global_batch=2", "seq_len=32"])
    program = Program(cfg, make_mesh(None), 2, compile_now=False)
    text = program._lower_step().as_text(dialect="hlo")
    tensor_trig = re.findall(r"= f32\[[^\]]+\]\S* (?:sine|cosine)\(", text)
    assert tensor_trig == [], tensor_trig
    assert re.search(r"= f32\[\] cosine\(", text)  # the schedule's, so the pattern can match


def _reductions(text: str) -> int:
    """Reduce instructions in an optimised HLO text (fused or not)."""
    import re

    return len(re.findall(r"= \S+ reduce\(", text))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_norm_and_softmax_backward_sums_are_matmuls_with_autodiffs_gradients(dtype):
    """``rms_norm`` and the attention's ``softmax`` have their own VJPs, whose sums are
    ``workload.sums`` (matmuls with ones on CPU): the gradients are autodiff's of the plain
    formulas, and the backward programs have no reduction left but the forward's own (the
    autodiff backward had two more for the norm, one more for the softmax)."""
    import jax
    import jax.numpy as jnp

    from workload.attention import softmax
    from workload.model import rms_norm

    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((2, 16, 32)) * 3, dtype)
    scale = jnp.asarray(1 + 0.1 * rng.standard_normal(32), jnp.float32)
    dy = jnp.asarray(rng.standard_normal((2, 16, 32)), dtype)

    def plain_norm(x, scale):  # the formula RMSNorm had, differentiated by JAX
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
        return (y * scale.astype(jnp.float32)).astype(x.dtype)

    def norm_vjp(f):
        return jax.jit(lambda x, s, dy: jax.vjp(f, x, s)[1](dy))

    ours = norm_vjp(lambda x, s: rms_norm(x, s, 1e-6))
    plain = norm_vjp(plain_norm)
    tol = 1e-5 if dtype == "float32" else 1e-2
    for a, b in zip(ours(x, scale, dy), plain(x, scale, dy), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(np.float32(a), np.float32(b), rtol=tol, atol=tol)
    np.testing.assert_array_equal(rms_norm(x, scale, 1e-6), plain_norm(x, scale))
    assert _reductions(ours.lower(x, scale, dy).compile().as_text()) == 1  # the forward's mean
    assert _reductions(plain.lower(x, scale, dy).compile().as_text()) == 3

    scores = jnp.asarray(rng.standard_normal((2, 4, 16, 16)) * 4, jnp.float32)
    dp = jnp.asarray(rng.standard_normal((2, 4, 16, 16)), jnp.float32)
    ours_sm = jax.jit(lambda s, d: jax.vjp(softmax, s)[1](d)[0])
    plain_sm = jax.jit(lambda s, d: jax.vjp(lambda s: jax.nn.softmax(s, axis=-1), s)[1](d)[0])
    np.testing.assert_allclose(ours_sm(scores, dp), plain_sm(scores, dp), rtol=1e-5, atol=1e-6)
    assert _reductions(ours_sm.lower(scores, dp).compile().as_text()) == 2  # max, sum
    assert _reductions(plain_sm.lower(scores, dp).compile().as_text()) == 3


def test_scan_unroll_changes_the_program_not_the_gradients():
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from workload.model import Transformer
    from workload.train import cross_entropy

    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 256, (2, 17)), jnp.int32)

    def grads_and_jaxpr(unroll: int):
        cfg = load_config("tiny", [f"scan_unroll={unroll}"])  # 2 layers
        graphdef, params = nnx.split(Transformer(cfg, nnx.Rngs(0)))

        def loss(p):
            return cross_entropy(nnx.merge(graphdef, p)(tokens[:, :-1]), tokens[:, 1:], 0.0)[0]

        return jax.jit(jax.grad(loss))(params), str(jax.make_jaxpr(jax.grad(loss))(params))

    looped, looped_jaxpr = grads_and_jaxpr(1)
    unrolled, unrolled_jaxpr = grads_and_jaxpr(0)  # 0: every layer in one iteration
    assert "unroll=1" in looped_jaxpr and "unroll=2" in unrolled_jaxpr
    for a, b in zip(jax.tree.leaves(looped), jax.tree.leaves(unrolled), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="scan_unroll: must be >= 0"):
        load_config("tiny", ["scan_unroll=-1"])


def test_dense_is_a_compute_dtype_matmul_with_float32_accumulation():
    import jax.numpy as jnp

    from workload.model import dense

    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((3, 5, 64)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((64, 32)), jnp.float32)
    out = dense("bsd,de->bse", x, w, jnp.bfloat16)
    assert out.dtype == jnp.bfloat16
    # The products of the bf16-rounded values, summed in float64, then rounded once to bf16.
    xr = np.asarray(x.astype(jnp.bfloat16).astype(jnp.float32), np.float64)
    wr = np.asarray(w.astype(jnp.bfloat16).astype(jnp.float32), np.float64)
    exact = np.einsum("bsd,de->bse", xr, wr)
    got = np.asarray(out.astype(jnp.float32), np.float64)
    assert np.all(np.abs(got - exact) <= 2 ** -8 * np.abs(exact) + 1e-4)  # one bf16 rounding
    # float32 compute: exactly the plain einsum.
    np.testing.assert_array_equal(dense("bsd,de->bse", x, w, jnp.float32),
                                  jnp.einsum("bsd,de->bse", x, w))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dense_backward_is_autodiffs_with_the_weight_gradient_from_a_written_out_transpose(dtype):
    """On CPU ``dense`` is a 2-D ``matmul`` with its own VJP (``dW = x^T dy`` from ``x^T``
    written out): its value and both gradients are autodiff's of the einsum it replaces, the
    gradients rounded through the compute dtype as autodiff rounds them, for a one-axis and
    a two-axis contraction."""
    import jax
    import jax.numpy as jnp

    from workload.loss import operand
    from workload.model import _contracted_axes, dense

    def vjp(f):  # the value and both gradients
        return jax.jit(lambda a, b, g: (f(a, b), *jax.vjp(f, a, b)[1](g)))

    rng = np.random.default_rng(6)
    for spec, xs, ws in (("bsd,dtm->bstm", (2, 8, 16), (16, 2, 24)),
                         ("bsnh,nhd->bsd", (2, 8, 4, 8), (4, 8, 16))):
        x = jnp.asarray(rng.standard_normal(xs), dtype)
        w = jnp.asarray(rng.standard_normal(ws), jnp.float32)
        ys = jax.eval_shape(lambda x, w, s=spec: jnp.einsum(s, x, w), x, w).shape
        dy = jnp.asarray(rng.standard_normal(ys), dtype)

        def einsum(x, w, s=spec):  # what dense computed before: autodiff's reference
            return jnp.einsum(s, operand(x, dtype), operand(w, dtype),
                              preferred_element_type=jnp.float32).astype(dtype)

        ours = vjp(lambda x, w, s=spec: dense(s, x, w, dtype))(x, w, dy)
        ref = vjp(einsum)(x, w, dy)
        for a, b in zip(ours, ref, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            # float32: the same sums in another order; bf16: at most one rounding apart
            tol = 1e-5 if dtype == "float32" else 2 ** -7
            np.testing.assert_allclose(np.float32(a), np.float32(b), rtol=tol, atol=tol)
        if dtype == "bfloat16":  # the weight gradient holds bf16 values, as autodiff's does
            dw = np.asarray(ours[2])
            np.testing.assert_array_equal(dw, np.float32(dw.astype(jnp.bfloat16)))
    with pytest.raises(ValueError, match="does not contract"):
        _contracted_axes("bsd,ed->bse")


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_cpu_attention_is_the_einsum_reference_forward_and_backward(kv_heads):
    """``einsum_cpu`` (what ``attend("einsum")`` runs on CPU: heads first, an added mask,
    its own VJP) against ``einsum`` and its autodiff: in float32 to summation order; in
    bf16 the output and the three gradients within one bf16 rounding of the float32 values
    of the same inputs, as ``einsum``'s are. Grouped (2 query heads per KV head) and not.
    And the causal mask holds: later keys change no earlier output."""
    import jax
    import jax.numpy as jnp

    from workload import attention

    def vjp(f):  # the output and the three gradients
        return jax.jit(lambda a, b, c, g: (f(a, b, c), *jax.vjp(f, a, b, c)[1](g)))

    rng = np.random.default_rng(7)
    shapes = ((2, 32, 4, 16), (2, 32, kv_heads, 16), (2, 32, kv_heads, 16), (2, 32, 4, 16))
    q, k, v, do = (jnp.asarray(rng.standard_normal(sh), jnp.float32) for sh in shapes)
    ours, ref = vjp(attention.einsum_cpu)(q, k, v, do), vjp(attention.einsum)(q, k, v, do)
    for a, b in zip(ours, ref, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)

    qb, kb, vb, dob = (x.astype(jnp.bfloat16) for x in (q, k, v, do))
    exact = vjp(attention.einsum)(*(x.astype(jnp.float32) for x in (qb, kb, vb, dob)))
    for fn in (attention.einsum_cpu, attention.einsum):
        for a, t in zip(vjp(fn)(qb, kb, vb, dob), exact, strict=True):
            assert a.dtype == jnp.bfloat16
            assert np.max(np.abs(np.float32(a) - t)) <= 2 ** -7 * np.max(np.abs(t))

    k2 = k.at[:, 20:].set(0)
    np.testing.assert_array_equal(attention.einsum_cpu(q, k2, v)[:, :20],
                                  attention.einsum_cpu(q, k, v)[:, :20])


_FAULTS = textwrap.dedent("""
    import ctypes, resource, sys
    if sys.argv[1] == "tuned":
        from workload.distributed import reuse_host_memory
        assert reuse_host_memory()
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size = 64 << 20  # far above glibc's mmap threshold, like a step's logits or arena
    def cycle():  # malloc, write every page, free: as XLA:CPU does with a step's buffers
        p = libc.malloc(size)
        ctypes.memset(p, 1, size)
        libc.free(p)
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cycle()
    before = faults()
    for _ in range(10):
        cycle()
    print((faults() - before) / 10)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")
def test_reuse_host_memory_stops_faulting_big_buffers_in_every_time():
    """What a CPU train step does to its buffers each step: malloc, write, free. With glibc's
    defaults each cycle faults every page in again; after reuse_host_memory() it reuses them."""
    def faults_per_cycle(mode: str) -> float:
        out = subprocess.run([sys.executable, "-c", _FAULTS, mode], cwd=REPO, check=True,
                             capture_output=True, text=True, timeout=120)
        return float(out.stdout.split()[-1])

    pages = (64 << 20) // 4096
    assert faults_per_cycle("default") > 0.9 * pages
    assert faults_per_cycle("tuned") < 0.1 * pages
