#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh Debian machine, then run it.
# Usage: bash scripts/test.sh [pytest args...]
# As root it installs the Debian packages (numactl, allocators, MPICH, Slurm, munge) so
# that the host-dependent tests run instead of skipping; Python packages come from pip.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(numactl libjemalloc2 libtcmalloc-minimal4 mpich slurm-wlm munge util-linux python3-venv
      qemu-system-x86 linux-image-amd64 busybox-static)  # the last three: live machines
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
# virtme-ng: vng, which boots the live machines (docs/live-machines.md).
"$PY" -m pip install -q --disable-pip-version-check -e '.[torch,test,tune]' intel-openmp virtme-ng
PATH="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
export PATH
status=0
"$PY" -m pytest -q -p no:cacheprovider "$@" || status=$?

# The live machines CI runs (the 2-socket, SMT and memory-only guests under QEMU, one at a
# time, and the timeout test; minutes each: docs/live-machines.md), as a step of its own
# and timed, after the suite: only when no pytest arguments were given (a run of chosen
# tests boots no guest); CPULAUNCH_LIVE_MACHINES=none skips it, a list of names widens it.
if [ $# -eq 0 ] && [ "${CPULAUNCH_LIVE_MACHINES:-ci}" != none ]; then
  start=$(date +%s)
  live=0
  CPULAUNCH_LIVE_MACHINES=${CPULAUNCH_LIVE_MACHINES:-ci} "$PY" -m pytest -q -p no:cacheprovider \
    -m "live and not slow" tests/test_live_machines.py || live=$?
  echo "live machines (${CPULAUNCH_LIVE_MACHINES:-ci}): $(( $(date +%s) - start )) s, exit $live"
  [ "$live" = 0 ] || status=$live
fi
exit "$status"
