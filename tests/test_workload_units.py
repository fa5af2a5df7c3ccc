"""Workload pieces in-process: config parsing (jax-free), the 1b preset's size and FLOPs
without allocating it, the model's shape and causality, data addressing, token files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from workload_helpers import cheap_compiles, jax_cache_env

from workload.config import PRESETS, Config, load_config, parse_overrides, step_flops
from xrun_contract import FLOPS_LINE, PARAMS_LINE

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _cheap_compiles():
    """What the programs compute is tested here, not how fast: XLA at its lowest effort."""
    with cheap_compiles():
        yield


def test_config_module_is_importable_without_jax():
    code = ("import sys; from workload.config import PRESETS, parse_overrides, load_config; "
            "load_config('1b', ['steps=3']); assert 'jax' not in sys.modules, 'jax imported'")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_overrides_are_typed_and_errors_name_the_field():
    assert parse_overrides(["steps=7", "learning_rate=1e-4", "async_checkpoint=false",
                            "remat=full", "data=gs://b/tokens.bin"]) == {
        "steps": 7, "learning_rate": 1e-4, "async_checkpoint": False, "remat": "full",
        "data": "gs://b/tokens.bin"}
    with pytest.raises(ValueError, match=r"unknown key 'stpes' \(did you mean 'steps'\?\); allowed: .*steps"):
        parse_overrides(["stpes=3"])
    with pytest.raises(ValueError, match=r"steps: expected an integer, got 'many'"):
        parse_overrides(["steps=many"])
    with pytest.raises(ValueError, match=r"remat: unknown 'some'; allowed: auto, none, full, dots"):
        parse_overrides(["remat=some"])
    with pytest.raises(ValueError, match="expected key=value"):
        parse_overrides(["steps"])
    with pytest.raises(ValueError, match=r"preset: unknown 'huge'; allowed: tiny, bench-21m, 1b"):
        load_config("huge")
    with pytest.raises(ValueError, match="n_kv_heads: must divide n_heads=4"):
        load_config("tiny", ["n_kv_heads=3"])


def test_preset_yaml_and_overrides_precedence():
    yaml_text = "preset: bench-21m\nsteps: 30\nlearning_rate: 0.002\n"
    cfg = load_config(None, ["steps=40"], yaml_text)
    assert (cfg.preset, cfg.d_model, cfg.steps, cfg.learning_rate) == ("bench-21m", 256, 40, 0.002)
    assert load_config("tiny", [], yaml_text).preset == "tiny"  # the flag wins
    assert load_config().preset == "tiny" and Config().compute_dtype == "float32"
    with pytest.raises(ValueError, match="unknown key 'colour'"):
        load_config(None, [], "colour: red\n")
    assert set(PRESETS) == {"tiny", "bench-21m", "1b"}


def test_1b_size_and_flops_without_allocating():
    import jax

    from workload import model

    cfg = load_config("1b")
    abstract = model.abstract_model(cfg)  # ShapeDtypeStructs only
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(abstract))
    assert model.count_params(abstract) == cfg.params_count == 1_104_218_112
    assert (PARAMS_LINE.format(value=f"{cfg.params_count / 1e9:.3f}", unit=" billion")
            == "number parameters: 1.104 billion")
    f = step_flops(cfg, global_batch=32, devices=32)
    line = FLOPS_LINE.format(total=f["tflops_per_device"], learnable_pct=f["learnable_pct"],
                             attention_pct=f["attention_pct"])
    assert line == ("Per train step: Total TFLOPs: 13.59 split as 93.93% learnable weight flops "
                    "and 6.07% attention flops")
    assert cfg.batch_size(32) == 32
    # FSDP over 32 devices: every big weight split on its model dimension.
    from flax import nnx
    from jax.sharding import AbstractMesh, AxisType

    mesh = AbstractMesh((1, 32), ("data", "fsdp"), axis_types=(AxisType.Auto,) * 2)
    specs = {"/".join(k): tuple(v.spec) for k, v in
             nnx.to_flat_state(model.param_shardings(abstract, mesh))}
    assert specs["embed"] == (None, "fsdp") and specs["out"] == ("fsdp", None)
    assert specs["blocks/mlp/gate"] == (None, "fsdp", None)
    assert specs["blocks/attn/wo"] == (None, None, None, "fsdp")
    assert specs["final_norm/scale"] == (None,)


def test_logical_axes_replicate_what_the_mesh_does_not_divide():
    from jax.sharding import AbstractMesh, AxisType, PartitionSpec

    from workload.model import logical_to_mesh

    mesh = AbstractMesh((2, 3), ("data", "fsdp"), axis_types=(AxisType.Auto,) * 2)
    assert logical_to_mesh(("vocab", "embed"), (10, 9), mesh) == PartitionSpec(None, "fsdp")
    assert logical_to_mesh(("vocab", "embed"), (10, 8), mesh) == PartitionSpec(None, None)
    assert logical_to_mesh(("batch",), (12,), mesh) == PartitionSpec(("data", "fsdp"))


def test_tiny_model_is_causal_and_the_loss_is_cross_entropy():
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from workload.model import Transformer
    from workload.train import cross_entropy

    graphdef, params = nnx.split(Transformer(load_config("tiny"), nnx.Rngs(0)))
    forward = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 16)), jnp.int32)
    logits = forward(params, tokens)
    assert logits.shape == (2, 16, 256) and logits.dtype == jnp.float32
    changed = forward(params, tokens.at[:, 10].set((tokens[:, 10] + 1) % 256))
    np.testing.assert_allclose(logits[:, :10], changed[:, :10], atol=1e-5)  # no peeking ahead
    assert not np.allclose(logits[:, 10:], changed[:, 10:])
    loss, aux = cross_entropy(logits[:, :-1], tokens[:, 1:], 0.0)
    manual = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]),
                                           tokens[:, 1:, None], -1))
    assert float(loss) == pytest.approx(float(manual), rel=1e-6) and float(aux["nll"]) == float(loss)
    z, _ = cross_entropy(logits, tokens, 1e-4)
    assert float(z) > float(cross_entropy(logits, tokens, 0.0)[0])


def test_synthetic_rows_depend_only_on_the_sequence_index():
    from workload.data import synthetic_source

    rows = synthetic_source(seed=0, seq_len=8, vocab=256)
    whole = rows(10, 6)
    assert whole.shape == (6, 9) and whole.dtype == np.int32
    np.testing.assert_array_equal(np.concatenate([rows(10, 2), rows(12, 4)]), whole)
    steps = np.diff(whole, axis=1) % 256
    assert np.all(steps == steps[:, :1]) and set(steps[:, 0]) <= {1, 2, 3, 4}
    assert not np.array_equal(synthetic_source(1, 8, 256)(10, 6), whole)


def test_token_file_reads_only_the_requested_rows(tmp_path):
    from workload.data import TokenFile

    tokens = np.arange(1000, dtype=np.uint32) % 500
    path = tmp_path / "tokens.bin"
    path.write_bytes(tokens.tobytes())
    f = TokenFile(str(path), "uint32", seq_len=10, vocab=500)
    assert f.windows == 99
    rows = f(5, 3)  # windows 5..7, one contiguous read of 3 x 10 + 1 tokens
    np.testing.assert_array_equal(rows[0], tokens[50:61])
    np.testing.assert_array_equal(rows[2], tokens[70:81])
    assert f.bytes_read == 31 * 4
    wrapped = f(98, 2)  # window 98, then back to window 0
    np.testing.assert_array_equal(wrapped[1], tokens[0:11])
    assert f.bytes_read == 31 * 4 + 2 * 11 * 4
    with pytest.raises(ValueError, match="token 499 >= vocab_size 100"):
        TokenFile(str(path), "uint32", seq_len=10, vocab=100)(49, 1)
    with pytest.raises(ValueError, match="fewer than seq_len"):
        TokenFile(str(path), "uint32", seq_len=1000, vocab=500)


def test_gpu_bench_runs_on_cpu_with_tiny(tmp_path):
    out = tmp_path / "gpu.json"
    r = subprocess.run(
        [sys.executable, "bench/gpu_bench.py", "--preset", "tiny", "--steps", "6", "--warmup", "2",
         "--checkpoint-every", "3", "--peak-tflops", "2.0", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("XRUN_")},
             "JAX_DISABLE_MOST_OPTIMIZATIONS": "1", **jax_cache_env()})  # as cheap_compiles()
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res) >= {"preset", "backend", "device_kind", "n_layers", "global_batch", "reduced",
                        "step_seconds", "tokens_per_s", "tflops_per_s_per_device",
                        "peak_tflops_per_device", "mfu", "checkpoint_blocked_s",
                        "checkpoint_save_s", "checkpoint_blocking_ratio"}
    assert (res["preset"], res["backend"], res["reduced"], res["steady_steps"]) == ("tiny", "cpu", "", 4)
    assert res["step_seconds"] > 0 and res["tokens_per_s"] == pytest.approx(
        res["global_batch"] * 64 / res["step_seconds"], rel=0.5)
    assert res["mfu"] == pytest.approx(res["tflops_per_s_per_device"] / 2.0)
    assert res["checkpoint_saves"] == 2 and 0 < res["checkpoint_blocking_ratio"] <= 1.5


def test_remat_changes_the_program_not_the_gradients():
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from workload.model import Transformer
    from workload.train import cross_entropy

    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 256, (2, 17)), jnp.int32)

    def grads_and_jaxpr(remat: str):
        graphdef, params = nnx.split(Transformer(load_config("tiny", [f"remat={remat}"]), nnx.Rngs(0)))

        def loss(p):
            return cross_entropy(nnx.merge(graphdef, p)(tokens[:, :-1]), tokens[:, 1:], 0.0)[0]

        return jax.jit(jax.grad(loss))(params), str(jax.make_jaxpr(jax.grad(loss))(params))

    plain, plain_jaxpr = grads_and_jaxpr("none")
    full, full_jaxpr = grads_and_jaxpr("full")
    assert "remat" in full_jaxpr and "remat" not in plain_jaxpr  # jax.checkpoint's primitive
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(full), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_fused_output_cross_entropy_matches_autodiff_of_the_reference(compute_dtype):
    """The training loss (workload.loss: projection + cross-entropy with its own VJP) gives
    the reference's loss, nll and gradients for every parameter, z-loss included, and a
    few AdamW steps on it lower the loss."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from workload.loss import loss_and_aux, output_cross_entropy
    from workload.model import Transformer
    from workload.train import cross_entropy, make_optimizer

    cfg = load_config("tiny", [f"compute_dtype={compute_dtype}"])
    graphdef, params = nnx.split(Transformer(cfg, nnx.Rngs(0)))
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 256, (2, 17)), jnp.int32)
    z = 1e-3

    def reference(p):
        m = nnx.merge(graphdef, p)
        # Logits rounded to the compute dtype only by the einsum's output; fp32 from there.
        x = m.hidden(tokens[:, :-1])
        logits = jnp.einsum("bsd,dv->bsv", x, m.out[...].astype(x.dtype),
                            preferred_element_type=jnp.float32)
        return cross_entropy(logits, tokens[:, 1:], z)

    def fused(p):
        m = nnx.merge(graphdef, p)
        return loss_and_aux(*output_cross_entropy(m.hidden(tokens[:, :-1]), m.out[...],
                                                  tokens[:, 1:], compute_dtype), z)

    step = jax.jit(jax.value_and_grad(fused, has_aux=True))  # compiled once: here and below
    (ref_loss, ref_aux), ref_grads = jax.jit(jax.value_and_grad(reference, has_aux=True))(params)
    (loss, aux), grads = step(params)
    tol = 1e-5 if compute_dtype == "float32" else 2e-2  # bf16 rounds dlogits before the dots
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)
    assert float(aux["nll"]) == pytest.approx(float(ref_aux["nll"]), rel=1e-6)
    assert float(loss) > float(aux["nll"])  # the z-loss term is in
    flat, ref_flat = nnx.to_flat_state(grads), dict(nnx.to_flat_state(ref_grads))
    assert len(flat) == len(ref_flat)
    for path, g in flat:
        r = np.asarray(ref_flat[path][...], np.float32)
        g = np.asarray(g[...], np.float32)
        assert g.dtype == r.dtype and g.shape == r.shape, path
        scale = float(np.abs(r).max()) or 1.0
        np.testing.assert_allclose(g, r, atol=tol * scale, rtol=tol, err_msg=str(path))

    tx, _ = make_optimizer(load_config("tiny", ["learning_rate=3e-3", "steps=6"]))

    @jax.jit  # one program, not one eager dispatch (and compile) per optax op and leaf
    def update(g, state, params):
        updates, state = tx.update(g, state, params)
        return optax.apply_updates(params, updates), state

    state, losses = jax.jit(tx.init)(params), []
    for _ in range(6):
        (value, _), g = step(params)
        params, state = update(g, state, params)
        losses.append(float(value))
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_dlogits_target_entries_set_in_place_equal_the_one_hot_compare(compute_dtype):
    """The CPU form of d logits (softmax pass, then the b*s target entries set in place) is
    the accelerator form (one-hot compare in the same pass), entry for entry; a repeated
    target in a row and the z-loss scale included."""
    import jax
    import jax.numpy as jnp

    from workload.loss import _dlogits

    rng = np.random.default_rng(5)
    logits = jnp.asarray(rng.standard_normal((2, 7, 50)) * 3, jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    targets = jnp.asarray(rng.integers(0, 50, (2, 7)), jnp.int32).at[1, 3].set(0).at[1, 4].set(0)
    scale = (1.0 + 2.0 * 1e-3 * lse[..., None]) / 14
    args = (logits, lse, targets, scale, jnp.float32(1 / 14), compute_dtype)
    in_place = np.asarray(_dlogits(*args, targets_in_place=True))
    compare = np.asarray(_dlogits(*args, targets_in_place=False))
    np.testing.assert_array_equal(in_place, compare)
    rows = np.arange(2)[:, None], np.arange(7)[None, :], np.asarray(targets)
    assert np.all(in_place[rows] < 0)  # the target term is in: p - 1 < 0


@pytest.mark.parametrize("overrides", [["grad_clip=1.0"], ["grad_clip=0"],
                                       ["grad_clip=0.01", "compute_dtype=bfloat16"],
                                       ["grad_clip=0.01", "embedding_update=dense"]])
def test_train_step_with_the_sparse_embedding_gradient_is_the_dense_optax_update(overrides):
    """The train step takes the embedding table's gradient sparse and writes the table's
    AdamW out (``optimizer_step``); each of five steps on batches with repeated tokens gives
    what autodiff's dense gradient through ``make_optimizer``'s optax chain gives from the
    same state: every parameter and moment, the norm, and rows no token touched (they still
    decay)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from workload.distributed import make_mesh
    from workload.loss import loss_and_aux, output_cross_entropy
    from workload.train import Program

    cfg = load_config("tiny", ["global_batch=4", "learning_rate=3e-2", *overrides])
    program = Program(cfg, make_mesh(None), 4)
    state = program.init()
    initial_table = np.asarray(state["params"]["embed"])

    @jax.jit
    def dense_step(state, tokens):
        def loss_fn(params):
            m = nnx.merge(program.graphdef, params)
            return loss_and_aux(*output_cross_entropy(
                m.hidden(tokens[:, :-1]), m.out[...], tokens[:, 1:], cfg.compute_dtype),
                cfg.z_loss)

        (_, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        updates, opt_state = program.tx.update(grads, state["opt_state"], state["params"])
        return ({"params": optax.apply_updates(state["params"], updates),
                 "opt_state": opt_state, "step": state["step"] + 1}, optax.tree.norm(grads))

    rng = np.random.default_rng(0)
    for _ in range(5):
        tokens = jnp.asarray(rng.integers(0, 40, (4, cfg.seq_len + 1)), jnp.int32)  # repeats
        # Each step from the same state: the two programs sum a repeated token's row
        # gradients in another order (an f32 rounding apart), which a later bf16 step can
        # turn into a whole bf16 rounding; compared step by step, that cannot compound.
        dense, norm = dense_step(jax.tree.map(jnp.copy, state), tokens)
        state, out = program.train_step(state, tokens)
        assert float(out["grad_norm"]) == pytest.approx(float(norm), rel=1e-6)
        for (path, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(state),
                                     jax.tree_util.tree_leaves_with_path(dense), strict=True):
            np.testing.assert_allclose(np.float32(a), np.float32(b), rtol=1e-5, atol=2e-6,
                                       err_msg=jax.tree_util.keystr(path))
    untouched = np.asarray(state["params"]["embed"])[40:]
    assert not np.array_equal(untouched, initial_table[40:])  # weight decay moved them


def test_step_results_raise_a_failed_device_while_another_still_waits(monkeypatch):
    """With several processes on CPU, a shard whose device's step failed raises at once,
    although another shard of the same output never becomes ready (jax.device_get would
    wait on it for ever)."""
    import jax

    from workload import train

    class Buffer:
        def __init__(self, device, error=None):
            self.device, self.error = device, error

        def devices(self):
            return {self.device}

        def is_ready(self):
            return self.error is not None  # the healthy device stays in its collective

        def block_until_ready(self):
            raise self.error

    class Shard:
        def __init__(self, data):
            self.data = data

    class Output:
        addressable_shards = [Shard(Buffer("cpu:0")),
                              Shard(Buffer("cpu:1", RuntimeError("Gloo error: reset by peer")))]

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(RuntimeError, match="Gloo error"):
        train.step_results({"loss": Output()})


def test_clip_by_global_norm_is_optax_rule():
    import jax.numpy as jnp
    import optax

    from workload.train import clip_by_global_norm

    grads = {"a": jnp.asarray([3.0, 4.0]), "b": jnp.asarray([[12.0]])}  # global norm 13
    for max_norm in (1.0, 13.5):
        ours, _ = clip_by_global_norm(max_norm).update(grads, None)
        theirs, _ = optax.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
        for k in grads:
            np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-6)


def test_bench_model_shape_peak_uses_the_learnable_matmuls_maxtext_counts():
    """bench_workload's peak at the model's matmul shapes times exactly the matmuls behind
    the learnable-weight share of the FLOP count (MaxText's formula, forward = 1/3)."""
    sys.path.insert(0, str(REPO / "bench"))
    from bench_workload import model_matmuls

    for batch in (1, 4):
        cfg = load_config("bench-21m", ["global_batch=0", f"batch_per_device={batch}"])
        f = step_flops(cfg, cfg.batch_size(1), 1)
        forward = sum(2 * m * k * n * count for m, k, n, count in model_matmuls(cfg, batch))
        learnable = f["tflops_per_step"] * 1e12 * f["learnable_pct"] / 100 / 3
        assert forward == pytest.approx(learnable, rel=1e-9)
