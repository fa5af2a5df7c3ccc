#!/usr/bin/env bash
# Headless Chromium for the report rendering test (tests/test_report.py). Debian package.
# Idempotent: does nothing when chromium is already on PATH.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
