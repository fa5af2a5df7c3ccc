#!/usr/bin/env bash
# Install everything the tests need into .venv (fresh machine safe) and run them.
set -euo pipefail
cd "$(dirname "$0")/.."
# The real control plane the cluster tests run against (kube-apiserver, etcd, JobSet, Kueue,
# KWOK, fake-gcs-server), built from upstream Go modules into ~/.cache/xrun-cluster; a warm
# cache answers at once. Without Go this fails here with one line saying what to install.
bash tests/cluster/build.sh >/dev/null
if [ -x .ci/install-chromium.sh ] || [ -f .ci/install-chromium.sh ]; then bash .ci/install-chromium.sh; fi
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[workload,test]"
ruff check .
mypy  # packages and settings: [tool.mypy] in pyproject.toml
python -m pytest -q "$@"
