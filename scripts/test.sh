#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh Debian machine, then run it.
# Usage: bash scripts/test.sh [pytest args...]
# As root it installs the Debian packages (numactl, allocators, MPICH, Slurm, munge) so
# that the host-dependent tests run instead of skipping; Python packages come from pip.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(numactl libjemalloc2 libtcmalloc-minimal4 mpich slurm-wlm munge util-linux python3-venv)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=()
  for p in "${DEBS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing Debian packages: ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
fi

PY=${PYTHON:-python3}
# A Python whose packages the OS manages (PEP 668: stock Debian 12, Ubuntu 24.04) refuses
# pip; use a virtual environment in .venv there (created once, reused).
if [ -z "${PYTHON:-}" ] && "$PY" -c 'import sys, sysconfig, os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) and sys.prefix == sys.base_prefix else 1)'; then
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  PY=.venv/bin/python
fi
# torch==2.13.0 is pinned in the [torch] extra: an unpinned torch would pull CUDA wheels.
# [users]: Lightning and accelerate, which tests/test_ranks_users.py runs under cpulaunch.
"$PY" -m pip install -q --disable-pip-version-check -e '.[torch,test,tune,users]' intel-openmp
exec "$PY" -m pytest -q -p no:cacheprovider "$@"
