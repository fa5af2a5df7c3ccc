#!/bin/sh
# Make a small training repository with two branches for examples/nightly-local.yaml:
#   main       train.py (xrun's workload with this repo's input pipeline), pipeline.py
#   feat-slow  the same, but pipeline.py prepares every batch with an extra 0.4 s of work
# The nightly ships each branch's head as the runs' workdir and flags feat-slow.
#   bash examples/make-nightly-repo.sh [DIR]          (default ./nightly-repo)
set -eu
dir=${1:-nightly-repo}
if [ -e "$dir" ]; then
  echo "make-nightly-repo: $dir exists; remove it or name another folder" >&2
  exit 2
fi
mkdir -p "$dir"
cd "$dir"
git init -q -b main
git config user.name "xrun example"
git config user.email "xrun-example@example.com"

cat > train.py <<'PY'
"""Training entry point: xrun's workload (python3 -m workload.train) with this repo's pipeline."""
import sys

import pipeline
from workload import data, train

print(open("BRANCH_NOTE.txt").read().strip(), flush=True)
data.make_batch = pipeline.wrap(data.make_batch)
sys.exit(train.main(sys.argv[1:]))
PY

cat > pipeline.py <<'PY'
"""The input pipeline: every batch goes through prepare() before the step uses it."""
import time

PREPARE_SECONDS = 0.1  # decoding and augmentation of one batch (stands in for real work)


def prepare(batch):
    time.sleep(PREPARE_SECONDS)
    return batch


def wrap(make_batch):
    return lambda *args, **kwargs: prepare(make_batch(*args, **kwargs))
PY
echo "pipeline: main, 0.1 s per batch" > BRANCH_NOTE.txt
printf '__pycache__/\n*.log\n' > .gitignore
git add -A
git commit -q -m "Train with the repo's input pipeline"

git checkout -q -b feat-slow
sed 's/^PREPARE_SECONDS = 0.1 .*/PREPARE_SECONDS = 0.5  # a heavier augmentation: 0.4 s more per batch/' pipeline.py > pipeline.py.new
mv pipeline.py.new pipeline.py
echo "pipeline: feat-slow, 0.5 s per batch" > BRANCH_NOTE.txt
git commit -q -am "Pipeline: heavier augmentation of every batch"
git checkout -q main
echo "made $(pwd): main $(git rev-parse --short main), feat-slow $(git rev-parse --short feat-slow)"
