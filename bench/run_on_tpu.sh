#!/usr/bin/env bash
# One whole experiment on the TPU machine (../shared/notes/tpu.md): install what its own
# index lacks from .whl-tpu/, then the chip part of bench_tpu.py, the startup part (cold and
# warm processes) and the tpu-marked tests, every result under OUT.
# Usage: OUT=DIR bash bench/run_on_tpu.sh [CHIP_SECONDS STARTUP_SECONDS TEST_SECONDS [TESTS]]
# (a part given 0 seconds is not run; TESTS: pytest -k expression, default every tpu test).
# COMPILE_S=N: first the compile part (each program's compile time in a fresh process);
# SAVES_STEPS=N: the startup runs train N steps, the cold one with a save every SAVES_EVERY (50).
# PROBE_S=N: first the compile probe (compiler effort, attention kernel). STARTUP_ENV="A=1 B=2":
# the startup part also runs a bare process and the run with saves with those set.
# STARTUP_PROBE_S=N: first bench/probe_tpu_startup.py, each experiment given N seconds.
# PROFILE_WARM=1: after the startup part, a warm run under cProfile (warm-prof.txt).
# The chip part's grid: the preset with no overrides (remat=auto), the bench's best variant,
# the preset's old remat=full. SHAPE2_S=N: then a second shape (SHAPE2_BASE, default d_model
# 1024 x 24 layers, batch 8), auto against a small grid. CKPT=1: the checkpoint comparison
# too. STARTUP_OVERRIDES: the startup runs' overrides (default none: the preset as users run it).
set -u
OUT=${OUT:?set OUT}; CHIP_S=${1:-200}; STARTUP_S=${2:-130}; TEST_S=${3:-200}; TESTS=${4:-}
COMPILE_S=${COMPILE_S:-0}; SAVES_STEPS=${SAVES_STEPS:-0}; SAVES_EVERY=${SAVES_EVERY:-50}
PROBE_S=${PROBE_S:-0}; STARTUP_PROBE_S=${STARTUP_PROBE_S:-0}; STARTUP_ENV=${STARTUP_ENV:-}; PROFILE_WARM=${PROFILE_WARM:-0}
CACHE=/tmp/xrun-cc-$$
export PYTHONUNBUFFERED=1 PIP_CONFIG_FILE=/dev/null
t0=$(date +%s)
python3 -m pip install --isolated -q --only-binary=:all: --index-url file:///opt/pypi/simple \
  --target /tmp/site flax==0.12.8 optax==0.2.8 google-crc32c pyyaml psutil humanize simplejson \
  aiofiles etils msgpack protobuf pytest > "$OUT/pip.txt" 2>&1
python3 -m pip install --isolated -q --no-index --no-deps --no-compile --target /tmp/site0 \
  .whl-tpu/*.whl >> "$OUT/pip.txt" 2>&1
export PYTHONPATH=${PYTHONPATH:-}:/tmp/site0:/tmp/site:$PWD
echo "install: $(( $(date +%s) - t0 )) s" | tee "$OUT/timeline.txt"
BEST="remat=dots_no_batch scan_unroll=0"
SHAPE2_S=${SHAPE2_S:-0}; CKPT=${CKPT:-0}; STARTUP_OVERRIDES=${STARTUP_OVERRIDES:-}
SHAPE2_BASE=${SHAPE2_BASE:---preset 1b d_model=1024 n_layers=24 n_heads=8 n_kv_heads=8 mlp_dim=4096 global_batch=8}
# The reference for startup: a bare process's import of JAX and its first look at the chip.
python3 -c "import time; t=time.time(); import jax; i=time.time(); jax.devices(); d=time.time()
print(f'bare: import jax {i-t:.2f} s, jax.devices() {d-i:.2f} s')" > "$OUT/bare.txt" 2>&1
cat "$OUT/bare.txt"
{ uname -r; nproc; ldd --version | head -1; echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
  echo "THP defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag)"; grep -E 'MemTotal|MemFree|Cached|Huge' /proc/meminfo
  df -h /tmp | tail -1; } > "$OUT/facts.txt" 2>&1
if [ "$STARTUP_PROBE_S" != 0 ]; then
  python3 bench/probe_tpu_startup.py --out "$OUT/bench" --timeout "$STARTUP_PROBE_S" \
    > "$OUT/startup-probe.txt" 2>&1
  echo "startup probe rc=$?: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/timeline.txt"
fi
if [ "$PROBE_S" != 0 ]; then
  timeout "$PROBE_S" python3 bench/bench_tpu.py --out "$OUT/bench" --part compile-probe \
    --startup "$BEST" > "$OUT/probe.txt" 2>&1
  echo "probe rc=$?: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/timeline.txt"
fi
if [ "$COMPILE_S" != 0 ]; then
  timeout "$COMPILE_S" python3 bench/bench_tpu.py --out "$OUT/bench" --part compile \
    --startup "$BEST" > "$OUT/compile.txt" 2>&1
  echo "compile rc=$?: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/timeline.txt"
fi
if [ "$CHIP_S" != 0 ]; then
  timeout "$CHIP_S" python3 bench/bench_tpu.py --out "$OUT/bench" --part chip --spec-tflops 197 \
    --grid "" --grid "$BEST" --grid "remat=full" --ckpt "$([ "$CKPT" != 0 ] && echo "$BEST" || echo none)" \
    --profile none --ckpt-rounds 1 --steps 8 --warmup 2 --ckpt-dir /tmp/xrun-ckpt > "$OUT/bench.txt" 2>&1
  echo "chip rc=$?: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/timeline.txt"
fi
if [ "$SHAPE2_S" != 0 ]; then
  timeout "$SHAPE2_S" python3 bench/bench_tpu.py --out "$OUT/bench" --part chip --spec-tflops 197 \
    --base="$SHAPE2_BASE" --grid "" --grid "remat=full" --grid "remat=dots_no_batch micro_batches=2" \
    --ckpt none --profile none --steps 8 --warmup 2 > "$OUT/shape2.txt" 2>&1
  echo "shape2 rc=$?: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/timeline.txt"
fi
if [ "$STARTUP_S" != 0 ]; then
  timeout "$STARTUP_S" python3 bench/bench_tpu.py --out "$OUT/bench" --part startup \
    --startup "$STARTUP_OVERRIDES" --startup-timeout "$STARTUP_S" --saves-steps "$SAVES_STEPS" \
    --saves-every "$SAVES_EVERY" --cache "$CACHE" ${STARTUP_ENV:+$(printf -- '--env %s ' $STARTUP_ENV)} \
    > "$OUT/startup.txt" 2>&1
  echo "startup rc=$?: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/timeline.txt"
  if [ "$PROFILE_WARM" != 0 ]; then
    XRUN_COMPILATION_CACHE=$CACHE timeout 90 python3 -m cProfile -o "$OUT/warm.prof" -m workload.train \
      --preset 1b n_layers=8 global_batch=4 $BEST steps=$([ "$SAVES_STEPS" != 0 ] && echo "$SAVES_STEPS" || echo 3) checkpoint_every=0 \
      --storage /tmp/xrun-prof-$$ --run-name prof > "$OUT/warm-run.txt" 2>&1
    echo "warm profile rc=$?: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/timeline.txt"
    python3 -c "import pstats, sys; s = pstats.Stats(sys.argv[1]); s.sort_stats('cumulative').print_stats(70)
s.sort_stats('tottime').print_stats(40)" "$OUT/warm.prof" > "$OUT/warm-prof.txt" 2>&1
  fi
fi
if [ "$TEST_S" != 0 ]; then
  timeout "$TEST_S" python3 -m pytest -m tpu tests/test_tpu.py --noconftest -p no:cacheprovider \
    -q -s -rA ${TESTS:+-k "$TESTS"} > "$OUT/tpu-tests.txt" 2>&1
  echo "tests rc=$?: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/timeline.txt"
fi
python3 bench/bench_tpu.py --out "$OUT/bench" --part report > /dev/null 2>&1
cat "$OUT/bench/table.md" 2>/dev/null | head -40
tail -8 "$OUT/tpu-tests.txt" 2>/dev/null
