"""remat=auto (workload.autotune) and gradient accumulation (micro_batches), on CPU.

On CPU there is no device memory figure: auto resolves to no recomputation without
compiling anything. The search itself is exercised with a memory limit given to it: the
tiny model's candidates compile for real and XLA's memory analysis decides.
"""

from __future__ import annotations

import numpy as np
import pytest
from workload_helpers import cheap_compiles

from workload.config import PRESETS, load_config


@pytest.fixture(autouse=True)
def _cheap_compiles():
    """What the programs compute is tested here, not how fast: XLA at its lowest effort."""
    with cheap_compiles():
        yield


def test_auto_is_every_presets_default_and_resolves_on_cpu_without_compiling():
    """Counted by JAX's own compile event (every XLA compile records it), not by a clock."""
    import jax

    from workload import autotune
    from workload.distributed import make_mesh
    from workload.program import Program

    for name in PRESETS:
        assert load_config(name).remat == "auto", name
    mesh = make_mesh(None)
    compiles: list[str] = []

    def listen(event: str, *_: object, **__: object) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    program = Program(load_config("tiny"), mesh, 8, compile_now=False)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        jax.jit(lambda x: x + 1)(np.float32(1))  # the listener hears a compile
        assert len(compiles) == 1
        choice = autotune.known_choice(load_config("1b"), mesh, 8)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert len(compiles) == 1  # auto's choice for the 1b preset compiled nothing
    assert program.choice is not None and program.choice.tried == []  # no candidate compiled
    assert (program.cfg.remat, program.cfg.micro_batches) == ("none", 1)
    assert program.train_step is None
    assert autotune.device_limit() is None
    assert choice is not None and (choice.remat, choice.micro_batches) == ("none", 1)


def test_auto_search_takes_the_fastest_candidate_that_fits(monkeypatch, tmp_path):
    """With a limit between the candidates' needs: the first candidate in speed order that
    fits, its executable kept (no second compile), the choice cached and read back. The
    limit is made from one candidate compiled here (none at two micro-batches); what the
    others need is what the search's own compiles measured (memory_parts, observed)."""
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
    split = Program(load_config("tiny", ["remat=none", "micro_batches=2", *shape]), mesh, 8,
                    compile_now=False)
    split_need = autotune.needed_bytes(split._lower_step().compile())
    # Room for none at two micro-batches, so (as measured below) not for none at the whole batch.
    limit = int(split_need / (1 - autotune.HEADROOM)) + 1
    budget = limit * (1 - autotune.HEADROOM)
    measured: list[int] = []
    real_parts = autotune.memory_parts

    def observed(compiled):
        parts = real_parts(compiled)
        measured.append(sum(parts))
        return parts

    monkeypatch.setattr(autotune, "memory_parts", observed)
    monkeypatch.setattr(autotune, "device_limit", lambda: limit)
    monkeypatch.setenv("XRUN_COMPILATION_CACHE", str(tmp_path))
    program = Program(cfg, mesh, 8, compile_now=False)
    assert program.choice is None and program.cfg.remat == "full"  # searched at compile()
    program.compile()
    choice = program.choice
    needs = dict(zip(order[:len(measured)], measured, strict=True))
    print(f"\nneeds {needs}; limit {limit}; {choice.line()}; tried {choice.tried}")
    assert needs["none", 1] > split_need  # a micro-batch needs fewer temporaries
    if ("none", 2) in needs:
        assert needs["none", 2] == split_need  # the same program, the same analysis
    expected = next(c for c in order if needs.get(c, split_need) <= budget)
    assert expected != ("none", 1)
    assert (choice.remat, choice.micro_batches) == expected, choice
    assert [(c["remat"], c["micro_batches"]) for c in choice.tried] == order[
        :order.index(expected) + 1]
    assert len(measured) == len(choice.tried)  # each candidate compiled once
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
    """One compile: the state and batch alone are over the limit, so no policy or split
    can fit, and the rest are skipped, each named."""
    import json

    from workload import autotune
    from workload.distributed import make_mesh
    from workload.program import Program

    monkeypatch.setattr(autotune, "device_limit", lambda: 1024)
    monkeypatch.delenv("XRUN_COMPILATION_CACHE", raising=False)
    with pytest.raises(MemoryError, match="no policy fits") as e:
        Program(load_config("tiny", ["global_batch=2"]), make_mesh(None), 2)
    tried = json.loads(str(e.value).split(": ", 2)[2])
    assert [(c["remat"], c["micro_batches"]) for c in tried] == autotune.candidates(2, 1)
    assert tried[0]["fits"] is False and tried[0]["gib"] >= 0
    assert all(c["skipped"].startswith("arguments and outputs alone") for c in tried[1:])


# Accumulated over micro-batches vs one batch: the same mean loss and gradient, summed in
# another order (float32): measured on the tiny model within 2e-6 relative over 4 steps.
ACCUMULATION_RTOL = 1e-5


@pytest.mark.parametrize("route", ["sparse", "dense"])
def test_micro_batches_train_as_one_batch(route):
    import jax
    import jax.numpy as jnp

    from workload.distributed import make_mesh
    from workload.program import Program

    mesh = make_mesh(None)
    runs = {}
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 256, (8, 65)).astype(np.int32) for _ in range(4)]
    initial = None
    for k in (1, 4):
        cfg = load_config("tiny", [f"micro_batches={k}", "remat=none", "global_batch=8",
                                   f"embedding_update={route}"])
        program = Program(cfg, mesh, 8)
        if initial is None:  # init does not depend on the split: compiled once
            initial = program.init()
        state = jax.tree.map(jnp.copy, initial)  # the step donates its state
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
