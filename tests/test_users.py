"""Issue 24: what users meet first: the package's names, the command line's spellings and
hints, live output of several instances, --print-env's notes, -v."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def test_dir_lists_the_lazy_api_without_importing_it():
    """dir(cpulaunch) names plan_instances and bind_current_process (PEP 562 __dir__),
    and listing them does not import cpulaunch.api (nothing heavy at import)."""
    code = ("import sys, cpulaunch; d = dir(cpulaunch); "
            "print('plan_instances' in d, 'bind_current_process' in d, '__version__' in d, "
            "'cpulaunch.api' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         timeout=30, check=True).stdout
    assert out.split() == ["True", "True", "True", "False"]
