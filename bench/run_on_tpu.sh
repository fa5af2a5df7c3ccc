#!/usr/bin/env bash
# One whole experiment on the TPU machine (../shared/notes/tpu.md): install what its own
# index lacks from .whl-tpu/, then the chip part of bench_tpu.py and the tpu-marked tests,
# every result under OUT. Usage: OUT=DIR bash bench/run_on_tpu.sh [BENCH_SECONDS TEST_SECONDS]
set -u
OUT=${OUT:?set OUT}; BENCH_S=${1:-210}; TEST_S=${2:-150}
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
timeout "$BENCH_S" python3 bench/bench_tpu.py --out "$OUT/bench" --part chip --spec-tflops 197 \
  --grid "$BEST" --grid "$BEST global_batch=6" --ckpt "$BEST" --profile "$BEST" \
  --ckpt-rounds 2 --steps 8 --warmup 2 --ckpt-dir /tmp/xrun-ckpt > "$OUT/bench.txt" 2>&1
echo "bench rc=$?: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/timeline.txt"
timeout "$TEST_S" python3 -m pytest -m tpu tests/test_tpu.py --noconftest -p no:cacheprovider \
  -q -s -k "tiny or splash or resume" > "$OUT/tpu-tests.txt" 2>&1
echo "tests rc=$?: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/timeline.txt"
python3 bench/bench_tpu.py --out "$OUT/bench" --part report > /dev/null 2>&1
tail -5 "$OUT/tpu-tests.txt"
