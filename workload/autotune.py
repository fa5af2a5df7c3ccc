"""``remat=auto``: the fastest rematerialisation policy that fits the device's memory, from the
compiler's own memory analysis of each candidate, and micro-batches where none fits.

Why: the remat policy that is fastest depends on the shape. On a v5e chip the 618M config
(batch 4) ran 60.1% of spec with ``dots_no_batch`` against 49.6% with the preset's ``full``;
a d_model 1024 x 24 layer model at batch 8 needs 20.3 GiB of temporaries with
``dots_no_batch`` on a 15.75 GiB chip (issue 50). MaxText leaves ``remat_policy`` to its
users; here the workload compiles the candidates in the order of their expected speed
(least recomputation first, whole batch before micro-batches) and takes the first whose
compiled program (arguments + outputs - aliased + temporaries + code, XLA's
``memory_analysis()``) leaves ``HEADROOM`` of the device's ``bytes_limit`` free. The winner's
executable is the one the run uses: only the rejected candidates cost a compile. Where no
policy fits the whole batch, the batch is split into micro-batches (gradient accumulation,
``micro_batches``). The choice is cached per program (config, chip, JAX version, the
workload's sources: ``workload.executables.program_key``) under the compilation cache, so
a later run of the same config does not search.

Without a device memory figure (CPU: ``memory_stats()`` is None) nothing is compiled: auto
is ``none`` at the whole batch (host memory, where recomputation only costs time).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from typing import Any

from workload.config import Config

# Fraction of the device's memory limit left free by the chosen program: room for the
# runtime's own buffers and fragmentation, and for a save's staging copy of part of the state
# (workload.checkpointing). The bench's best 618M variant needs 90.4% of a v5e chip.
HEADROOM = 0.05
# Candidates, fastest expected first: (remat policy, micro-batches). Less recomputation is
# faster; a micro-batch split keeps the FLOPs but runs smaller matmuls and the optimizer
# once, so a split with little recomputation comes before whole-batch full recomputation
# (a third more forward work).
# ("dots" is left out: with attention a kernel, no matmul of the model has batch dimensions,
# and it saves what dots_no_batch saves at one more compile.)
POLICY_ORDER = ("none", "dots_no_batch")
SPLITS = (1, 2, 4, 8, 16)
CACHE_PREFIX = "xrun-autotune"  # <cache>/xrun-autotune/<program key>.json


@dataclasses.dataclass
class Choice:
    """What auto resolved to, and why (``tried``: each candidate compiled, its GiB and verdict)."""

    remat: str
    micro_batches: int
    reason: str
    tried: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    limit_gib: float | None = None
    search_s: float = 0.0
    cached: bool = False

    def apply(self, cfg: Config) -> Config:
        return dataclasses.replace(cfg, remat=self.remat, micro_batches=self.micro_batches)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def line(self) -> str:
        return (f"xrun: remat=auto chose remat={self.remat} micro_batches={self.micro_batches}"
                f"{' (cached)' if self.cached else ''}: {self.reason}")


def candidates(global_batch: int, devices: int) -> list[tuple[str, int]]:
    """The (policy, micro-batches) pairs auto tries, in order; a split must leave every
    device whole rows in each micro-batch."""
    per_device = max(1, global_batch // max(1, devices))
    splits = [k for k in SPLITS if per_device % k == 0]
    out = [(p, 1) for p in POLICY_ORDER]
    for k in splits[1:]:
        out += [(p, k) for p in POLICY_ORDER]
    out += [("full", k) for k in splits]
    return out


def device_limit() -> int | None:
    """The smallest memory limit of this process's devices in bytes; None where the backend
    reports none (CPU)."""
    import jax

    limits = [(d.memory_stats() or {}).get("bytes_limit") for d in jax.local_devices()]
    if not limits or not all(isinstance(x, int) and x > 0 for x in limits):
        return None
    return min(limits)  # type: ignore[type-var]


def needed_bytes(compiled: Any) -> int:
    """Device memory the compiled program needs: its arguments, outputs not aliased to them,
    temporaries and code (XLA's memory analysis)."""
    return sum(memory_parts(compiled))


def memory_parts(compiled: Any) -> tuple[int, int, int]:
    """(arguments and outputs not aliased to them: the state and the batch, the same for
    every candidate; code; temporaries)."""
    m = compiled.memory_analysis()
    return (int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes),
            int(m.generated_code_size_in_bytes), int(m.temp_size_in_bytes))


def static_choice(cfg: Config) -> Choice:
    return Choice("none", max(1, cfg.micro_batches), "no device memory figure (CPU): no "
                  "recomputation, host memory")


def search(cfg: Config, limit: int, global_batch: int, devices: int,
           compile_candidate: Any) -> tuple[Choice, Any]:
    """The first candidate whose program fits ``limit`` less HEADROOM; ``compile_candidate(
    cfg)`` compiles one and returns what the caller keeps of it (its ``compiled`` first).
    Returns the choice and the winner's compile result. A candidate whose need, its temporaries
    scaled from a compiled split of the same policy, is over 1.3x the budget is skipped; so is
    every candidate once the arguments and outputs alone (no policy or split changes them) are
    over the budget. Raises MemoryError when nothing fits."""
    budget = limit * (1 - HEADROOM)
    gib = 2**30
    tried: list[dict[str, Any]] = []
    known: dict[str, tuple[int, int, int]] = {}  # policy -> (micro-batches, fixed, temp) seen
    state = 0  # arguments and outputs of a compiled candidate: every candidate's
    t0 = time.perf_counter()
    for policy, k in candidates(global_batch, devices):
        if state > budget:
            tried.append({"remat": policy, "micro_batches": k, "skipped":
                          f"arguments and outputs alone {state / gib:.2f} GiB"})
            continue
        if policy in known:
            k0, fixed0, temp0 = known[policy]
            guess = fixed0 + temp0 * k0 / k  # temporaries scale about with the micro-batch
            if guess > 1.3 * budget:
                tried.append({"remat": policy, "micro_batches": k, "skipped":
                              f"~{guess / gib:.1f} GiB scaled from {k0} micro-batches"})
                continue
        t = time.perf_counter()
        try:
            result = compile_candidate(dataclasses.replace(cfg, remat=policy, micro_batches=k))
            state, code, temp = memory_parts(result[0])
            fixed = state + code
            need = fixed + temp
        except Exception as e:  # noqa: BLE001 - a candidate the compiler refuses (memory)
            tried.append({"remat": policy, "micro_batches": k, "error": f"{e!r:.200}",
                          "compile_s": round(time.perf_counter() - t, 1)})
            continue
        fits = need <= budget
        tried.append({"remat": policy, "micro_batches": k, "gib": round(need / gib, 2),
                      "fits": fits, "compile_s": round(time.perf_counter() - t, 1)})
        if fits:
            over = [f"{c['remat']}/{c['micro_batches']}: {c['gib']} GiB" for c in tried
                    if c.get("fits") is False]
            reason = (f"{need / gib:.2f} of {limit / gib:.2f} GiB (headroom {HEADROOM:.0%}), "
                      "the fastest expected that fits"
                      + (f"; over: {', '.join(over)}" if over else ""))
            return Choice(policy, k, reason, tried, round(limit / gib, 2),
                          round(time.perf_counter() - t0, 1)), result
        known[policy] = (k, fixed, temp)
    raise MemoryError(f"remat=auto: no policy fits {limit / gib:.2f} GiB less {HEADROOM:.0%} "
                      f"at any micro-batch split of {global_batch}: {json.dumps(tried)}")


def cache_key(cfg: Config, mesh: Any, global_batch: int) -> str:
    from workload.executables import program_key

    return program_key({**cfg.to_dict(), "remat": "auto", "micro_batches": 0}, mesh, global_batch)


def load_cached(storage: Any, key: str) -> Choice | None:
    try:
        data = storage.read_bytes(f"{CACHE_PREFIX}/{key}.json")
        if data is None:
            return None
        doc = json.loads(data)
        return Choice(**{**doc, "cached": True})
    except Exception as e:  # noqa: BLE001 - an unreadable entry is a miss
        print(f"xrun: remat=auto cache entry unusable ({e!r:.200}); searching", file=sys.stderr,
              flush=True)
        return None


def save_cached(storage: Any, key: str, choice: Choice) -> None:
    try:
        storage.write_bytes(f"{CACHE_PREFIX}/{key}.json",
                            json.dumps({**choice.to_dict(), "cached": False}).encode())
    except Exception as e:  # noqa: BLE001 - the cache is an optimisation
        print(f"xrun: remat=auto: choice not cached ({e!r:.200})", file=sys.stderr, flush=True)


def known_choice(cfg: Config, mesh: Any, global_batch: int, cache: Any = None) -> Choice | None:
    """``cfg.remat == "auto"`` resolved without compiling: CPU's static choice, or the one
    cached for this program; None when it takes a search (``search_and_cache``). ``cache``:
    a Storage (the compilation cache's) the choice is kept in."""
    if device_limit() is None:
        return static_choice(cfg)
    if cache is None:
        return None
    return load_cached(cache, cache_key(cfg, mesh, global_batch))


def search_and_cache(cfg: Config, mesh: Any, global_batch: int, compile_candidate: Any,
                     cache: Any = None) -> tuple[Choice, Any]:
    """``search`` on this process's devices; the choice written to ``cache``."""
    devices = math.prod(mesh.devices.shape)
    choice, result = search(cfg, device_limit() or 0, global_batch, devices, compile_candidate)
    if cache is not None:
        save_cached(cache, cache_key(cfg, mesh, global_batch), choice)
    return choice, result
