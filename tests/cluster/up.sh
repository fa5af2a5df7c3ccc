#!/usr/bin/env bash
# Start the test control plane in DIR and return once it is ready; prints DIR/kubeconfig.
#   bash tests/cluster/up.sh DIR [--owner PID] [--tpu-pool v6e-256:16 ...]
# Builds the binaries first if the cache lacks them (tests/cluster/build.sh). Stop it with
# tests/cluster/down.sh DIR. --owner PID: stop by itself once that process is gone.
# --tpu-pool SHAPE:SLICES: extra KWOK TPU node pools shaped like GKE's (bench/bench_cluster_scale.py).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bash tests/cluster/up.sh DIR [--owner PID]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
py=${XRUN_PYTHON:-$here/../../.venv/bin/python}
[ -x "$py" ] || py=python3
exec "$py" "$here/controlplane.py" up "$@"
