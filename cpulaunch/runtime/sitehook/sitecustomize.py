"""cpulaunch's start-up hook for the ranks it starts (issue 24 item 8; issue 34).

``cpulaunch --ddp`` puts this folder first on every rank's PYTHONPATH (``--dry-run`` shows
it, with a note naming ``--no-exit-hook``), and Python's ``site`` module imports the first
``sitecustomize`` on ``sys.path`` at start-up, before the program. This one:

1. loads ``exithook.py`` from the folder above its own *real* path (a link to this folder
   still finds it), under a private name, once per interpreter, and installs its exit
   handler: the default process group is ended before the interpreter finalizes when the
   program left it alive (the exit-time SIGABRT of gloo ranks);
2. loads ``failrec.py`` the same way and starts recording this rank's first failure for the
   launcher (issue 38), when the launcher handed it a pipe (``CPULAUNCH_FAILURE_FD``);
3. runs the ``sitecustomize`` Python would have run without any cpulaunch (the first one on
   ``sys.path`` that is not a cpulaunch hook: the distribution's, a venv's, the user's
   own), as ``sitecustomize``, so none is lost; its errors reach ``site`` as they would have.

Hook folders are told by identity, not by spelling: a folder holding the marker file
``_cpulaunch_site_hook.py`` is a cpulaunch hook, whatever its name, link or install. So two
hook folders on PYTHONPATH (another install's, an outer cpulaunch's in a nested launch, a
linked spelling) neither recurse nor install twice; and the module marks itself run
(``sys.modules["_cpulaunch_sitehook"]``), so a hook imported again under another name does
nothing.

``CPULAUNCH_SITE_HOOKS`` (written by the plan only when it differs from the default) lists
the parts to install, comma-separated: ``exit`` and/or ``record``; absent, both (the recorder
acts only with its pipe). ``--no-exit-hook`` leaves ``record``; ``--no-failure-record``
leaves ``exit``.

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
_FAILREC = "_cpulaunch_failrec"
_PARTS = "CPULAUNCH_SITE_HOOKS"


def _is_hook(folder: str) -> bool:
    """Whether ``folder`` (a sys.path entry) is a cpulaunch hook folder: it holds the marker."""
    return os.path.isfile(os.path.join(folder or os.curdir, _MARK))


def _install(name: str, file: str, what: str) -> None:
    if name in sys.modules:  # another hook loaded it already: one handler per interpreter
        return
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), file)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[spec.name] = module
        module.install()
    except Exception as exc:  # noqa: BLE001 (never stop the program: it runs as it would without us)
        sys.stderr.write(f"cpulaunch: {what} not installed ({path}: {exc})\n")


def _install_hooks() -> None:
    parts = os.environ.get(_PARTS)
    parts = {"exit", "record"} if parts is None else {p.strip() for p in parts.split(",")}
    if "exit" in parts:
        _install(_EXITHOOK, "exithook.py", "exit hook")
    if "record" in parts and os.environ.get("CPULAUNCH_FAILURE_FD"):
        _install(_FAILREC, "failrec.py", "failure record")


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
    _install_hooks()
    _run_next_sitecustomize()
