#!/usr/bin/env bash
# Regenerates the real MaxText logs in this folder: save-stall.log, resume.log, xpk.log.
#
# Every log is the unedited stdout+stderr of one stock MaxText process (PyPI `maxtext`, see
# VERSIONS.txt) training on CPU with synthetic data. Nothing is post-processed.
#
#   MAXTEXT_PYTHON=/work/maxtext-venv/bin/python OUT=/tmp/maxtext-logs bash make_logs.sh
#
# The venv (Python 3.12) is made with:
#   python3.12 -m venv /work/maxtext-venv
#   /work/maxtext-venv/bin/pip install maxtext==0.2.5
#   # maxtext 0.2.5 declares no install requirements of its own; its wheel ships the
#   # pinned sets. The "decoupled" set is the one meant for non-TPU/GPU-cloud hosts:
#   /work/maxtext-venv/bin/pip install -r /work/maxtext-venv/lib/python3.12/site-packages/dependencies/requirements/generated_requirements/decoupled-requirements.txt
#
# Slow storage for save-stall/resume: Orbax writes each checkpoint with fsync (TensorStore's
# file kvstore), so a cgroup-v1 blkio write throttle on the training process makes the
# background write slow without taking CPU from training: the stand-in for a slow bucket.
# Needs root and /sys/fs/cgroup/blkio; without them the runs still go but the stall is
# smaller (then it comes from CPU contention only). Reads (the restore) are not throttled.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${MAXTEXT_PYTHON:-/work/maxtext-venv/bin/python}"
OUT="${OUT:-/tmp/maxtext-logs}"
DEST="${DEST:-$HERE}"
WRITE_BPS="${WRITE_BPS:-10485760}"   # 10 MiB/s
CG=/sys/fs/cgroup/blkio/maxtext-slow-storage

# Decoupled mode: no Google Cloud clients (goodput, GCP monitoring, Vertex) are installed.
export DECOUPLE_GCLOUD=TRUE JAX_PLATFORMS=cpu PYTHONUNBUFFERED=1

case "$OUT" in ""|/|"$HOME"|"$HERE") echo "make_logs.sh: refusing OUT=$OUT (it is emptied first)" >&2; exit 2;; esac
rm -rf "$OUT"
mkdir -p "$OUT"

# The benchmark model of bench/bench_vs_maxtext.py (xrun's bench-21m shape): vocab 32000,
# d_model 256, 4 layers, 4 heads x 64, MLP 1024, sequence 256, batch 1, one CPU device.
MODEL=(hardware=cpu skip_jax_distributed_system=true dataset_type=synthetic
       per_device_batch_size=1 base_emb_dim=256 base_num_decoder_layers=4
       base_num_query_heads=4 base_num_kv_heads=4 head_dim=64 base_mlp_dim=1024
       vocab_size=32000 max_target_length=256)
TRAIN=(-m maxtext.trainers.pre_train.train)

# Device number of the filesystem that holds $OUT, for the throttle.
DEVNUM="$(lsblk -no MAJ:MIN "$(df --output=source "$OUT" | tail -1)" 2>/dev/null | head -1 | tr -d ' ')"
throttled() {  # run "$@" with writes to $OUT's device throttled to $WRITE_BPS, if possible
  if [[ $(id -u) -eq 0 && -d /sys/fs/cgroup/blkio && -n "$DEVNUM" ]]; then
    mkdir -p "$CG"
    echo "$DEVNUM $WRITE_BPS" > "$CG/blkio.throttle.write_bps_device"
    bash -c 'echo $$ > "$0/cgroup.procs"; shift; exec "$@"' "$CG" _ "$@"
  else
    echo "make_logs.sh: no blkio throttle (needs root + cgroup v1 blkio); storage is not slowed" >&2
    "$@"
  fi
}

# (a) save-stall: 20 steps, async checkpoint every 5 steps (and at step 0 and the last step).
# Each ~235 MiB save takes ~15-25 s on the throttled disk while 5 steps take ~5-8 s, so the
# saves at steps 5, 10, 15 and 19 wait for the previous one ("Waiting for previous save").
throttled "$PY" "${TRAIN[@]}" run_name=stall base_output_directory="$OUT" "${MODEL[@]}" \
  steps=20 enable_checkpointing=true async_checkpointing=true checkpoint_period=5 \
  > "$DEST/save-stall.log" 2>&1

# (b) resume: the same run (same run_name and output directory) continued to 26 steps: it
# restores the step-19 checkpoint and trains steps 20..25 (saves at 20 and at the end).
throttled "$PY" "${TRAIN[@]}" run_name=stall base_output_directory="$OUT" "${MODEL[@]}" \
  steps=26 enable_checkpointing=true async_checkpointing=true checkpoint_period=5 \
  > "$DEST/resume.log" 2>&1

# (c) xpk: a fresh 10-step run (default checkpointing: saves at step 0 and at the end) run
# through the exact shell text of XPK's main-container command: xpk
# src/xpk/core/docker_container.py, get_main_container() (commit ecc30061709213cc82e001d673bbb101b6dee33a),
# YAML literal block rendered for a CPU workload without debug_dump_gcs (so
# {gsutil_test_command}, {xpk_internal_commands}, {tpu_stacktrace_terminate_command} and
# {gpu_workload_terminate_command} are empty lines) and with {command} = the user command.
USER_COMMAND="$PY ${TRAIN[*]} run_name=xpk base_output_directory=$OUT ${MODEL[*]} steps=10"
XPK_SCRIPT="echo XPK Start: \$(date);
_sigterm() (kill -SIGTERM \$! 2>/dev/null;);
trap _sigterm SIGTERM;

($USER_COMMAND) & PID=\$!;
while kill -0 \$PID 2>/dev/null;
    do sleep 5;
done;
wait \$PID;
EXIT_CODE=\$?;

echo XPK End: \$(date);
echo EXIT_CODE=\$EXIT_CODE;


exit \$EXIT_CODE"
bash -c "$XPK_SCRIPT" > "$DEST/xpk.log" 2>&1

if [[ -d "$CG" ]]; then rmdir "$CG" 2>/dev/null || true; fi
for f in save-stall resume xpk; do
  printf '%-12s %8d bytes  %s\n' "$f.log" "$(wc -c < "$DEST/$f.log")" \
    "$(grep -c 'completed step:' "$DEST/$f.log") step lines"
done
