#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh Debian machine, then run it.
# Usage: bash scripts/test.sh [pytest args...]
#
# One environment: the tests run in the virtual environment README's first command made,
# .venv (created here if it is missing; never the global interpreter), after installing
# into it what the tests, `cpulaunch tune` and the bench scripts need: the extras test,
# tune and bench (torch and numpy come with the torch extra; intel-openmp for the
# --omp-runtime intel tests), users and docs. Every command README.md and docs/ show then runs in
# it (tests/test_docs_commands.py runs them), and the docs site builds (tests/test_docs_site.py).
#
# As root it installs the Debian packages (numactl, allocators, MPICH, Slurm, munge, binutils
# for doctor's readelf check, Chromium and a font for the test that renders --format svg) so
# that the host-dependent tests run instead of skipping.
#
# Variables:
#   VENV=DIR     another virtual environment (CI tests the newest torch in .venv-newest)
#   PYTHON=EXE   the Python that creates the virtual environment (default python3)
#   PIP_CONSTRAINT=FILE  pip's own: e.g. a file holding torch==2.13.0 picks the torch
#                release (.ci/run tests the lowest and the newest of pyproject's range)
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(numactl libjemalloc2 libtcmalloc-minimal4 mpich slurm-wlm munge util-linux binutils python3-venv zsh dash fish
      chromium fonts-dejavu-core  # tests/test_svg.py renders the picture in headless Chromium
      qemu-system-x86 linux-image-amd64 busybox-static)  # the last three: the live machines
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=()
  for p in "${DEBS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing Debian packages: ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
fi

VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating the virtual environment $VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
fi
# virtme-ng: vng, which boots the live machines (docs/dev/live-machines.md; .ci/run's live step);
# [users]: Lightning and accelerate, which tests/test_ranks_users.py runs under cpulaunch;
# [docs]: mkdocs-material and mkdocstrings, with which tests/test_docs_site.py builds the site;
# [ray]: Ray Train, which tests/test_ray_train.py and examples/ray_train.py run.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[torch,test,tune,bench,users,docs,ray]' intel-openmp virtme-ng
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
