"""``cpulaunch.inference``: the documented import path of :mod:`cpulaunch.runtime.inference`.

This module is that one (an alias in ``sys.modules``), so names, monkeypatching and
identity are the same under both paths.
"""

import sys

from cpulaunch.runtime import inference

sys.modules[__name__] = inference
