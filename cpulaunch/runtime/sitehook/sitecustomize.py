"""cpulaunch's start-up hook for the ranks it starts (issue 24 item 8).

``cpulaunch --ddp`` puts this folder first on every rank's PYTHONPATH (``--dry-run`` shows
it), and Python's ``site`` module imports the first ``sitecustomize`` on ``sys.path`` at
start-up, before the program. This one:

1. loads ``cpulaunch/runtime/exithook.py`` by its file path, under a private name, and
   installs its exit handler: the default process group is ended before the interpreter
   finalizes when the program left it alive (the exit-time SIGABRT of gloo ranks);
2. runs the ``sitecustomize`` Python would have run without this folder (the next one on
   ``sys.path``: the distribution's, a venv's, the user's own), as ``sitecustomize``, so
   none is lost; its errors reach ``site`` as they would have.

A site hook acts when imported: that is its purpose. It imports the standard library only,
never cpulaunch (a rank's interpreter need not have cpulaunch installed). ``python -S``,
``-I`` and ``-E`` skip it, as they skip any ``sitecustomize``.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _install_exit_hook() -> None:
    path = os.path.join(os.path.dirname(_HERE), "exithook.py")
    try:
        spec = importlib.util.spec_from_file_location("_cpulaunch_exithook", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[spec.name] = module
        module.install()
    except Exception as exc:  # noqa: BLE001 (never stop the program: it runs as it would without us)
        sys.stderr.write(f"cpulaunch: exit hook not installed ({path}: {exc})\n")


def _run_next_sitecustomize() -> None:
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module  # what `import sitecustomize` returns from now on
    spec.loader.exec_module(module)


_install_exit_hook()
_run_next_sitecustomize()
