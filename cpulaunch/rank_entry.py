"""``python -m cpulaunch.rank_entry``: the per-rank entry of an elastic ``cpulaunch --ddp``
run under torchrun; the code is :func:`cpulaunch.launch.elastic.main`."""

import sys

from cpulaunch.launch.elastic import main

if __name__ == "__main__":
    sys.exit(main())
