"""cpulaunch's start-up hook for the ranks it starts (issue 24 item 8; issue 34).

``cpulaunch --ddp`` puts this folder first on every rank's PYTHONPATH (``--dry-run`` shows
it, with a note naming ``--no-exit-hook``), and Python's ``site`` module imports the first
``sitecustomize`` on ``sys.path`` at start-up, before the program. This one:

1. loads ``exithook.py`` from the folder above its own *real* path (a link to this folder
   still finds it), under a private name, once per interpreter, and installs its exit
   handler: the default process group is ended before the interpreter finalizes when the
   program left it alive (the exit-time SIGABRT of gloo ranks);
2. runs the ``sitecustomize`` Python would have run without any cpulaunch (the first one on
   ``sys.path`` that is not a cpulaunch hook: the distribution's, a venv's, the user's
   own), as ``sitecustomize``, so none is lost; its errors reach ``site`` as they would have.

Hook folders are told by identity, not by spelling: a folder holding the marker file
``_cpulaunch_site_hook.py`` is a cpulaunch hook, whatever its name, link or install. So two
hook folders on PYTHONPATH (another install's, an outer cpulaunch's in a nested launch, a
linked spelling) neither recurse nor install twice; and the module marks itself run
(``sys.modules["_cpulaunch_sitehook"]``), so a hook imported again under another name does
nothing.

A site hook acts when imported: that is its purpose. It imports the standard library only,
never cpulaunch (a rank's interpreter need not have cpulaunch installed). ``python -S``,
``-I`` and ``-E`` skip it, as they skip any ``sitecustomize``.
"""

import importlib.machinery
import importlib.util
import os
import sys

_MARK = "_cpulaunch_site_hook.py"
_RAN = "_cpulaunch_sitehook"
_EXITHOOK = "_cpulaunch_exithook"


def _is_hook(folder: str) -> bool:
    """Whether ``folder`` (a sys.path entry) is a cpulaunch hook folder: it holds the marker."""
    return os.path.isfile(os.path.join(folder or os.curdir, _MARK))


def _install_exit_hook() -> None:
    if _EXITHOOK in sys.modules:  # another hook loaded it already: one handler per interpreter
        return
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "exithook.py")
    try:
        spec = importlib.util.spec_from_file_location(_EXITHOOK, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[spec.name] = module
        module.install()
    except Exception as exc:  # noqa: BLE001 (never stop the program: it runs as it would without us)
        sys.stderr.write(f"cpulaunch: exit hook not installed ({path}: {exc})\n")


def _run_next_sitecustomize() -> None:
    rest = [p for p in sys.path if not _is_hook(p)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module  # what `import sitecustomize` returns from now on
    spec.loader.exec_module(module)


if _RAN not in sys.modules:
    sys.modules[_RAN] = sys.modules.get(__name__)
    _install_exit_hook()
    _run_next_sitecustomize()
