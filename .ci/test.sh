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
# Every test process, and every process they start (CLI, supervisors, workload hosts), reads
# the project's modules from __pycache__ once compiled: with PYTHONDONTWRITEBYTECODE set (as
# some images do) each of them compiled every module again, and pytest rewrote every test
# module's asserts again in each worker.
unset PYTHONDONTWRITEBYTECODE
python -m compileall -q -j 0 orchestrator manifests workload xrun_contract tests bench >/dev/null
# Workers: most tests wait (on subprocesses, the control plane, the emulator), so more
# workers than cores. Tests that need one process stay together (tests/conftest.py groups).
# A test failed on a loaded 2-core machine is run again, at most twice; "rerun test summary
# info" names each one with the traceback of its failed attempt (issue 54: flaky is failing,
# and a rerun without its cause cannot be fixed: "R" and "N rerun" alone named none).
python -m pytest -q -n "${XRUN_TEST_WORKERS:-4}" --dist loadgroup --reruns 2 --reruns-delay 5 \
  --rerun-show-tracebacks "$@"
