"""``cpulaunch.ddp_wrap``: the documented import path of :mod:`cpulaunch.runtime.ddp`.

This module is that one (an alias in ``sys.modules``), so names, monkeypatching and
identity are the same under both paths.
"""

import sys

from cpulaunch.runtime import ddp

sys.modules[__name__] = ddp
