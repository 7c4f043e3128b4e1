"""``cpulaunch.torch_utils``: the documented import path of :mod:`cpulaunch.runtime.dataloader`.

This module is that one (an alias in ``sys.modules``), so names, monkeypatching and
identity are the same under both paths.
"""

import sys

from cpulaunch.runtime import dataloader

sys.modules[__name__] = dataloader
