#!/usr/bin/env bash
# Stop the test control plane that tests/cluster/up.sh started in DIR (by recorded PID).
#   bash tests/cluster/down.sh DIR
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: bash tests/cluster/down.sh DIR" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
py=${XRUN_PYTHON:-$here/../../.venv/bin/python}
[ -x "$py" ] || py=python3
exec "$py" "$here/controlplane.py" down "$1"
