"""The workload on a TPU chip against itself on CPU (marker ``tpu``: run by hand there), and
the staged save's resume on CPU (CI).

On the TPU machine (see README, "Testing on a TPU"):

    python3 -m pytest -m tpu tests/test_tpu.py --noconftest -p no:cacheprovider -q -s

Each check is a process of its own (tests/tpu_checks.py): one program holds a chip at a
time, and the CPU reference runs beside it with ``JAX_PLATFORMS=cpu``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from workload_helpers import jax_cache_env

REPO = Path(__file__).resolve().parent.parent
CHECKS = str(REPO / "tests" / "tpu_checks.py")

# Losses of the same steps on a TPU and on CPU: XLA's TPU and CPU kernels sum in other orders
# and the TPU's matmuls take bf16 passes where CPU's are exact in f32; a few steps of the same
# data and seed agree to this relative tolerance (measured on a v5e: within 4.1e-5).
LOSS_RTOL = 2e-3
# Splash attention (a Pallas kernel, blocked online softmax) against XLA's plain attention.
ATTENTION_RTOL = 2e-2


def start(args: list[str], platform: str | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if platform:
        env["JAX_PLATFORMS"] = platform
    if platform == "cpu":  # the chip's programs compile afresh: what a TPU run measures
        env.update(jax_cache_env())
    return subprocess.Popen([sys.executable, CHECKS, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)


def result(proc: subprocess.Popen, timeout: float = 600) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def check(args: list[str], platform: str | None = None) -> dict:
    return result(start(args, platform))


def test_staged_save_restores_the_identical_next_loss_on_cpu():
    """A save whose arrays are partly copied in device memory (staged) and partly copied to
    the host from 4 threads, then the donating step, then a restore: the restored state's
    step gives the very loss the saved one gave. Also with staging off and Orbax's own copy."""
    r = check(["resume", "--preset", "tiny", "--variant", "1:4", "--variant", "0:0"], "cpu")
    staged, plain = r["variants"]
    assert staged["restored_step"] == 2 and staged["data"] == {"position": 2}
    assert staged["staged_bytes"] > 0, staged  # the path under test really staged arrays
    assert staged["loss_after_restore"] == staged["loss_after_save"], staged
    assert plain["staged_bytes"] == 0
    assert plain["loss_after_restore"] == plain["loss_after_save"] == staged["loss_after_save"]


@pytest.mark.tpu
@pytest.mark.parametrize("preset,overrides,quick", [
    ("tiny", [], False),
    # The 618M config of bench/bench_tpu.py, shorter sequences and one sequence a step so
    # that its CPU reference takes seconds, not minutes.
    ("1b", ["n_layers=8", "global_batch=1", "seq_len=1024"], False),
    # The same, run by the quick executable that runs a cold start's first steps on TPU.
    ("1b", ["n_layers=8", "global_batch=1", "seq_len=1024"], True),
], ids=["tiny", "618m", "618m-quick"])
def test_losses_on_tpu_match_cpu(preset, overrides, quick):
    args = ["losses", "--preset", preset, "--steps", "3", *overrides]
    cpu = start(args + ["attention=xla"], "cpu")
    tpu = result(start(args + (["--quick"] if quick else [])))
    ref = result(cpu)
    assert tpu["platform"] == "tpu", tpu
    print(f"\n{preset}: tpu {tpu['losses']} cpu {ref['losses']}")
    assert tpu["losses"] == pytest.approx(ref["losses"], rel=LOSS_RTOL)


@pytest.mark.tpu
def test_quick_and_optimized_executables_agree_on_tpu():
    """The bench's 618M config (batch 4, seq 2048, splash), 20 steps from the same state by
    each: the first three as close as TPU and CPU are; the rest drift apart only as far as
    two compiles' rounding carries over a run's first steps."""
    r = check(["quick", "--preset", "1b", "--steps", "20", "n_layers=8", "global_batch=4",
               "remat=dots_no_batch", "scan_unroll=0"])
    assert r["platform"] == "tpu", r
    quick, optimized = r["quick"], r["optimized"]
    drift = max(abs(q - o) / abs(o) for q, o in zip(quick, optimized, strict=True))
    print(f"\nquick {quick}\noptimized {optimized}\nlargest relative difference {drift:.2e}")
    assert quick[:3] == pytest.approx(optimized[:3], rel=LOSS_RTOL)
    assert drift < 5e-2


@pytest.mark.tpu
def test_splash_and_xla_attention_agree_on_tpu():
    base = ["losses", "--preset", "tiny", "--steps", "3", "seq_len=512"]
    splash = check(base + ["attention=splash"])
    xla = check(base + ["attention=xla"])
    assert splash["platform"] == "tpu"
    print(f"\nsplash {splash['losses']} xla {xla['losses']}")
    assert splash["losses"] == pytest.approx(xla["losses"], rel=ATTENTION_RTOL)


@pytest.mark.tpu
def test_staged_save_restore_resume_gives_the_identical_next_loss_on_tpu():
    r = check(["resume", "--preset", "1b", "n_layers=8", "global_batch=4"])
    assert r["platform"] == "tpu"
    print(f"\n618m resume: {json.dumps(r)}")
    (v,) = r["variants"]
    assert v["staged_bytes"] > 0, r  # auto staging found room in HBM
    assert v["loss_after_restore"] == v["loss_after_save"], r


@pytest.mark.tpu
def test_auto_pick_fits_and_runs_on_tpu():
    """The 618M preset with no overrides: remat=auto's pick leaves its headroom free of the
    chip's memory and trains."""
    r = check(["auto", "--preset", "1b", "--steps", "3", "n_layers=8", "global_batch=4"])
    assert r["platform"] == "tpu", r
    print(f"\nauto: {json.dumps(r)}")
    assert r["choice"] and r["choice"]["remat"] in ("none", "dots_no_batch", "full"), r
    assert r["needed"] <= r["limit"] * (1 - r["headroom"]), r
    assert all(x == x and x < 20 for x in r["losses"]), r  # finite


# One batch against micro-batches on the chip: bf16 matmuls over other row groupings;
# within the TPU-vs-CPU tolerance.
@pytest.mark.tpu
def test_accumulated_loss_matches_one_batch_on_tpu():
    r = check(["accumulate", "--preset", "1b", "--steps", "3", "--micro", "2", "n_layers=8",
               "global_batch=4", "seq_len=1024", "remat=dots_no_batch"])
    assert r["platform"] == "tpu", r
    print(f"\none batch {r['1']}\n2 micro-batches {r['2']}")
    assert r["2"] == pytest.approx(r["1"], rel=LOSS_RTOL)


@pytest.mark.tpu
def test_profile_written_on_tpu(tmp_path):
    """profile=2:2 on the chip: the trace (device ops included) in the run's profile folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XRUN_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    r = subprocess.run([sys.executable, "-m", "workload.train", "--preset", "tiny", "steps=4",
                        "checkpoint_every=0", "profile=2:2", "--storage", str(tmp_path),
                        "--run-name", "prof"], capture_output=True, text=True, timeout=300,
                       cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    traces = list((tmp_path / "runs/prof/profile").glob("plugins/profile/*/*.xplane.pb"))
    print(f"\n{[(t.name, t.stat().st_size) for t in traces]}")
    assert len(traces) == 1 and traces[0].stat().st_size > 0
    assert "TPU" in traces[0].read_bytes().decode("latin-1")  # the chip's planes are in it
    # Its top ops (xrun_contract/xplane.py), as run.json keeps them: not yet seen on a chip,
    # so printed for the bench's log; expected on "/device:TPU:0".
    info = json.loads((tmp_path / "runs/prof/run.json").read_text())["workload"]["profile"]
    print(f"top ops: {info.get('top_ops') or info.get('top_ops_error')}")
    assert "top_ops" in info or "top_ops_error" in info
