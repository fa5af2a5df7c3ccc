"""remat=auto (workload.autotune) and gradient accumulation (micro_batches), on CPU.

On CPU there is no device memory figure: auto resolves to no recomputation without
compiling anything. The search itself is exercised with a memory limit given to it: the
tiny model's candidates compile for real and XLA's memory analysis decides.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from workload.config import PRESETS, load_config


def test_auto_is_every_presets_default_and_resolves_on_cpu_without_compiling():
    from workload import autotune
    from workload.distributed import make_mesh
    from workload.program import Program

    for name in PRESETS:
        assert load_config(name).remat == "auto", name
    program = Program(load_config("tiny"), make_mesh(None), 8, compile_now=False)
    assert program.choice is not None and program.choice.tried == []  # nothing compiled
    assert (program.cfg.remat, program.cfg.micro_batches) == ("none", 1)
    assert program.train_step is None
    assert autotune.device_limit() is None
    t = time.perf_counter()
    choice = autotune.known_choice(load_config("1b"), make_mesh(None), 8)
    assert choice is not None and (choice.remat, choice.micro_batches) == ("none", 1)
    assert time.perf_counter() - t < 1.0


def test_auto_search_takes_the_fastest_candidate_that_fits(monkeypatch, tmp_path):
    """With a limit between the candidates' needs: the first candidate in speed order that
    fits, its executable kept (no second compile), the choice cached and read back."""
    import jax

    from workload import autotune
    from workload.distributed import make_mesh
    from workload.program import Program
    from xrun_contract.storage import open_storage

    shape = ["global_batch=8", "seq_len=256", "d_model=128", "mlp_dim=512"]
    cfg = load_config("tiny", shape)
    mesh = make_mesh(None)
    order = autotune.candidates(8, 1)[:3]
    assert order == [("none", 1), ("dots_no_batch", 1), ("none", 2)]
    needs = {}
    for policy, k in order:
        p = Program(load_config("tiny", [f"remat={policy}", f"micro_batches={k}", *shape]),
                    mesh, 8, compile_now=False)
        needs[policy, k] = autotune.needed_bytes(p._lower_step().compile())
    assert needs["none", 2] < needs["none", 1]  # a micro-batch needs fewer temporaries
    # Room for the cheapest of the three, not for none at the whole batch.
    budget = min(needs.values())
    limit = int(budget / (1 - autotune.HEADROOM)) + 1
    expected = next(c for c in order if needs[c] <= limit * (1 - autotune.HEADROOM))
    assert expected != ("none", 1)
    monkeypatch.setattr(autotune, "device_limit", lambda: limit)
    monkeypatch.setenv("XRUN_COMPILATION_CACHE", str(tmp_path))
    program = Program(cfg, mesh, 8, compile_now=False)
    assert program.choice is None and program.cfg.remat == "full"  # searched at compile()
    program.compile()
    choice = program.choice
    print(f"\nneeds {needs}; limit {limit}; {choice.line()}; tried {choice.tried}")
    assert (choice.remat, choice.micro_batches) == expected, choice
    assert [(c["remat"], c["micro_batches"]) for c in choice.tried] == order[
        :order.index(expected) + 1]
    assert program.train_step is not None  # the winner's executable, compiled once
    state = program.init()
    state, out = program.train_step(state, np.zeros((8, 257), np.int32))
    assert np.isfinite(float(jax.device_get(out["loss"])))
    # Cached: a second program reads the choice back instead of searching.
    stored = open_storage(str(tmp_path)).list(autotune.CACHE_PREFIX, delimiter=None)[0]
    assert len(stored) == 1
    again = Program(cfg, mesh, 8, compile_now=False)
    assert again.choice.cached and (again.cfg.remat, again.cfg.micro_batches) == expected


def test_nothing_fits_says_what_was_tried(monkeypatch):
    from workload import autotune
    from workload.distributed import make_mesh
    from workload.program import Program

    monkeypatch.setattr(autotune, "device_limit", lambda: 1024)
    monkeypatch.delenv("XRUN_COMPILATION_CACHE", raising=False)
    with pytest.raises(MemoryError, match="no policy fits"):
        Program(load_config("tiny", ["global_batch=2"]), make_mesh(None), 2)


# Accumulated over micro-batches vs one batch: the same mean loss and gradient, summed in
# another order (float32): measured on the tiny model within 2e-6 relative over 4 steps.
ACCUMULATION_RTOL = 1e-5


@pytest.mark.parametrize("route", ["sparse", "dense"])
def test_micro_batches_train_as_one_batch(route):
    import jax

    from workload.distributed import make_mesh
    from workload.program import Program

    mesh = make_mesh(None)
    runs = {}
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 256, (8, 65)).astype(np.int32) for _ in range(4)]
    for k in (1, 4):
        cfg = load_config("tiny", [f"micro_batches={k}", "remat=none", "global_batch=8",
                                   f"embedding_update={route}"])
        program = Program(cfg, mesh, 8)
        state = program.init()
        losses, norms = [], []
        for tokens in batches:
            state, out = program.train_step(state, tokens)
            out = jax.device_get(out)
            losses.append(float(out["loss"]))
            norms.append(float(out["grad_norm"]))
        runs[k] = (losses, norms, jax.device_get(state["params"]))
    print(f"\none batch {runs[1][0]}\n4 micro-batches {runs[4][0]}")
    assert runs[4][0] == pytest.approx(runs[1][0], rel=ACCUMULATION_RTOL)
    assert runs[4][1] == pytest.approx(runs[1][1], rel=ACCUMULATION_RTOL)
    for a, b in zip(jax.tree.leaves(runs[4][2]), jax.tree.leaves(runs[1][2]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_micro_batches_must_split_the_batch():
    from workload.distributed import make_mesh
    from workload.program import Program

    with pytest.raises(ValueError, match="micro_batches"):
        Program(load_config("tiny", ["micro_batches=3", "remat=none", "global_batch=8"]),
                make_mesh(None), 8, compile_now=False)
