"""The package's shape, held by reading its code (ast), never by running it (issue 20).

Roles and who may import whom (docs/dev/design.md draws them):

- ``cpulaunch/`` flat: the launcher's pipeline (cli, options, core, plan, distributed, render,
  svg, cpulist, errors, envvars, log, api) and the documented aliases;
- ``cpulaunch/machine/``: every read of the host, and the one helper that runs a short child;
- ``cpulaunch/launch/``: processes (spawn, group, supervise, the run folder, elastic);
- ``cpulaunch/tools/``: doctor, verify, tune, imported only by cli and only inside a function;
- ``cpulaunch/runtime/``: what runs inside the user's program; nothing else imports it but the
  documented aliases.

The rules are :data:`RULES` (each a test; :func:`violations` is the checker, and it is shown
to fail on planted violations below); docs/dev/design.md's list of them is made from
:func:`rules_markdown` (``python tests/test_layers.py`` writes it, a test holds it).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Iterator, NamedTuple, Optional

import pytest

from conftest import REPO

PKG = REPO / "cpulaunch"

#: Planning and rendering: pure functions of their arguments (rule 3).
PURE = ("cpulaunch/plan.py", "cpulaunch/render.py", "cpulaunch/forms.py", "cpulaunch/view.py", "cpulaunch/svg.py", "cpulaunch/distributed.py", "cpulaunch/options.py",
        "cpulaunch/option_table.py", "cpulaunch/placement.py", "cpulaunch/settings.py",
        "cpulaunch/cpulist.py", "cpulaunch/errors.py", "cpulaunch/envvars.py", "cpulaunch/names.py", "cpulaunch/notes.py",
        "cpulaunch/slips.py", "cpulaunch/spelling.py", "cpulaunch/records.py", "cpulaunch/enums.py",
        "cpulaunch/machine/topology.py", "cpulaunch/machine/numactl.py", "cpulaunch/machine/libraries.py",
        "cpulaunch/machine/engines.py", "cpulaunch/machine/platform.py", "cpulaunch/machine/recipes.py")
#: What pure modules may import besides each other: pure modules of the standard library
#: (``os`` and ``sys`` for names and values only: calls are checked apart), and
#: python-hostlist (Slurm's node-list syntax) and the TOML parsers (config text -> values);
#: _collections is collections' C half (cpulaunch.records takes namedtuple's field property).
PURE_STDLIB = {"__future__", "enum", "re", "typing", "types", "dataclasses", "math", "itertools",
               "collections", "_collections", "functools", "shlex", "json", "string", "textwrap", "operator",
               "fnmatch", "pathlib", "bisect", "reprlib", "os", "sys", "hostlist", "tomllib", "tomli", "difflib"}
#: ``os`` calls a pure module may make: they compute, they do not ask the host.
PURE_OS_CALLS = {"fspath", "fsencode", "fsdecode", "join", "basename", "dirname", "splitext", "normpath",
                 "isabs", "split"}
#: Modules whose import means touching the host or starting a process (rules 3 and 4).
HOST_MODULES = {"subprocess", "socket", "mmap", "ctypes", "psutil", "resource", "select", "fcntl",
                "threading", "multiprocessing", "tempfile", "shutil", "glob", "importlib", "platform"}
#: Where a child process may be started (rule 4).
SPAWNERS = ("cpulaunch/machine/exec.py", "cpulaunch/launch/", "cpulaunch/tools/tune/trials.py")
#: Calls that start a process (attribute or name).
SPAWN_CALLS = {"Popen", "run", "call", "check_call", "check_output", "posix_spawn", "posix_spawnp",
               "fork", "forkpty", "execv", "execve", "execvp", "execvpe", "system", "popen"}
SPAWN_OWNERS = {"subprocess", "os"}
#: The layers, lowest first (rule 6): each may import its own and the ones below.
LAYERS = (
    ("base", ("cpulaunch/errors.py", "cpulaunch/cpulist.py", "cpulaunch/log.py", "cpulaunch/envvars.py",
              "cpulaunch/names.py", "cpulaunch/notes.py", "cpulaunch/slips.py", "cpulaunch/spelling.py",
              "cpulaunch/records.py", "cpulaunch/enums.py")),
    ("machine", ("cpulaunch/machine/",)),
    ("planning", ("cpulaunch/plan.py", "cpulaunch/option_table.py", "cpulaunch/options.py", "cpulaunch/distributed.py",
                  "cpulaunch/placement.py", "cpulaunch/settings.py", "cpulaunch/render.py", "cpulaunch/forms.py",
                  "cpulaunch/view.py", "cpulaunch/svg.py")),
    ("launch", ("cpulaunch/launch/",)),
    ("invocation", ("cpulaunch/core.py", "cpulaunch/api.py")),
    ("cli", ("cpulaunch/cli.py", "cpulaunch/cmdline.py", "cpulaunch/__main__.py")),
)
#: Inside the planning layer, the option surface and the planner: the surface builds the
#: planner's requests and imports it; the planner imports no surface module (rule 8), the
#: names both speak are on the ground floor (``names.py``).
SURFACE = ("cpulaunch/option_table.py", "cpulaunch/options.py")
PLANNER = ("cpulaunch/plan.py", "cpulaunch/placement.py", "cpulaunch/settings.py", "cpulaunch/distributed.py",
           "cpulaunch/render.py", "cpulaunch/forms.py", "cpulaunch/view.py", "cpulaunch/svg.py")
#: Beside the layers: above every layer but cli, which none of them may import.
BESIDE = ("cpulaunch/tools/", "cpulaunch/runtime/", "cpulaunch/inference.py", "cpulaunch/torch_utils.py",
          "cpulaunch/ddp_wrap.py", "cpulaunch/rank_entry.py")
#: Where host files may be opened (rule 5).
OPENERS = ("cpulaunch/machine/", "cpulaunch/launch/")
FILE_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes"}
#: The documented aliases of runtime modules (rule 1): each holds nothing but the alias.
ALIASES = ("cpulaunch/inference.py", "cpulaunch/torch_utils.py", "cpulaunch/ddp_wrap.py")
#: Modules whose module-level ``__getattr__`` may load runtime names lazily (rule 1).
LAZY_RUNTIME = ("cpulaunch/__init__.py", "cpulaunch/distributed.py")


#: The rules the checker holds, as docs/dev/design.md lists them (markdown; PURE and LAYERS
#: are filled in from the lists above).
RULES = (
    "Nothing outside `runtime/` imports it, but the documented aliases (`inference.py`, `torch_utils.py`, "
    "`ddp_wrap.py`, each nothing but the alias) and the lazy module `__getattr__` of `cpulaunch/__init__.py` and "
    "`cpulaunch/distributed.py`.",
    "`tools/` is imported by `cli.py` and `cmdline.py` only, inside a function: a plain launch never loads a tool, "
    "and every error a tool raises goes through cli's one exception map. (`--verify` needs verify's check during a "
    "run: the command line hands `tools.verify.check_run` to `core.run`.)",
    "Planning and rendering are pure ({pure}): they import, at any depth of a function, only each other and pure "
    "standard-library modules, and call nothing that asks the host or starts a process.",
    "A child process is started (subprocess, posix_spawn, fork, exec) only in `machine/exec.py`, `launch/` and "
    "tune's trial runner.",
    "Host files are opened (`open`, `os.open`, `mmap`, `Path.read_*`/`write_*`) only in `machine/` and `launch/` "
    "(the run folder's own files).",
    "Layers only look down: {layers}; a module imports cpulaunch modules of its own layer or below, never above "
    "(`tools/`, `runtime/` and the alias modules stand beside: below cli, above the rest).",
    "A pure module reads no environment (`os.environ`, `os.getenv`): the environment is handed in as a mapping, "
    "as the host is.",
    "Inside planning, the option surface ({surface}) imports the planner ({planner}), never the other way round: "
    "the names both speak (placement modes, inference paths, bind modes, outputs, formats) and how the user said "
    "an option are on the ground floor (`names.py`, `spelling.py`); a planner module may name the surface's types for annotations only (`if TYPE_CHECKING:`).",
)


def _short(path: str) -> str:
    return "`" + path.removeprefix("cpulaunch/") + "`"


def rules_markdown() -> str:
    """The numbered list of :data:`RULES` for docs/dev/design.md."""
    pure = ", ".join(_short(p) for p in PURE)
    surface, planner = ", ".join(_short(p) for p in SURFACE), ", ".join(_short(p) for p in PLANNER)
    layers = " < ".join(f"{name} ({', '.join(_short(p) for p in places)})" for name, places in LAYERS)
    return "\n".join(f"{i}. " + rule.format(pure=pure, layers=layers, surface=surface, planner=planner) for i, rule in enumerate(RULES, 1)) + "\n"


DESIGN = REPO / "docs" / "dev" / "design.md"
RULES_BEGIN = "<!-- layer-rules:begin (generated from tests/test_layers.py RULES: do not edit by hand) -->"
RULES_END = "<!-- layer-rules:end -->"


def design_with_rules(text: str) -> str:
    """docs/dev/design.md's text with its rules block made from :func:`rules_markdown`."""
    start, end = text.index(RULES_BEGIN) + len(RULES_BEGIN), text.index(RULES_END)
    return text[:start] + "\n" + rules_markdown() + text[end:]


class Import(NamedTuple):
    """One import: the module imported (dotted), the line, and whether it sits inside a
    function (``lazy``), and the name of that function."""

    module: str
    line: int
    lazy: bool
    function: Optional[str]


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def module_name(path: str) -> str:
    """``cpulaunch/machine/probe.py`` -> ``cpulaunch.machine.probe``."""
    parts = path[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=None)
def _parsed(root: Path) -> tuple:
    return tuple((rel(p), ast.parse(p.read_text(), str(p))) for p in sorted(root.rglob("*.py")))


def sources(root: Path = PKG) -> dict:
    """{path relative to the repository: parsed module} of every module of the package
    (parsed once per test session; the checker never changes a tree)."""
    return dict(_parsed(root))


def _walk(node: ast.AST, function: Optional[str] = None) -> Iterator[tuple]:
    """(node, enclosing function name or None) for every node below ``node``."""
    for child in ast.iter_child_nodes(node):
        inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
        yield child, function
        yield from _walk(child, inner)


def imports(path: str, tree: ast.Module) -> list:
    """Every cpulaunch or standard-library module ``tree`` imports, resolved: ``from
    cpulaunch.machine import probe`` is ``cpulaunch.machine.probe``; a relative import is
    resolved against ``path``; ``importlib.import_module("cpulaunch.x")`` with a constant
    (or f-string) first argument counts as an import of what it names."""
    out = []
    package = module_name(path).rsplit(".", 1)[0] if not path.endswith("__init__.py") else module_name(path)
    for node, function in _walk(tree):
        lazy = function is not None
        if isinstance(node, ast.Import):
            out += [Import(a.name, node.lineno, lazy, function) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            out.append(Import(base, node.lineno, lazy, function))
            out += [Import(f"{base}.{a.name}", node.lineno, lazy, function) for a in node.names
                    if base.startswith("cpulaunch") and (PKG.parent / f"{base}.{a.name}".replace(".", "/")).with_suffix(".py").exists()
                    or (PKG.parent / f"{base}.{a.name}".replace(".", "/")).is_dir()]
        elif isinstance(node, ast.Call) and _called(node) == "import_module" and node.args:
            arg = node.args[0]
            text = arg.value if isinstance(arg, ast.Constant) else (
                "".join(v.value for v in arg.values if isinstance(v, ast.Constant)) if isinstance(arg, ast.JoinedStr) else "")
            if isinstance(text, str) and text.startswith("cpulaunch"):
                out.append(Import(text.rstrip("."), node.lineno, lazy, function))
    return out


def _called(call: ast.Call) -> Optional[str]:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def _owner(call: ast.Call) -> Optional[str]:
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        return f.value.id
    return None


def _in(path: str, places) -> bool:
    return any(path == p or (p.endswith("/") and path.startswith(p)) for p in places)


def violations(trees: dict) -> list:
    """Every break of rules 1-5 in ``trees`` ({path: module}), as one line each."""
    out = []
    for path, tree in trees.items():
        imps = imports(path, tree)
        out += _runtime_rule(path, tree, imps) + _tools_rule(path, imps) + _pure_rule(path, tree, imps)
        out += _spawn_rule(path, tree) + _open_rule(path, tree) + _layer_rule(path, imps)
        out += _surface_rule(path, tree, imps)
    return out


def _typing_only_lines(tree: ast.Module) -> set:
    """Lines of the imports under ``if TYPE_CHECKING:`` (annotations only; never run)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            out |= {n.lineno for b in node.body for n in ast.walk(b) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return out


def _surface_rule(path: str, tree: ast.Module, imps: list) -> list:
    """Rule 8: a planner module imports no module of the option surface."""
    if path not in PLANNER:
        return []
    surface = {module_name(p) for p in SURFACE}
    typing_only = _typing_only_lines(tree)
    return [f"{path}:{imp.line}: the planner imports {imp.module} of the option surface (the names both need "
            "belong in names.py)" for imp in imps if imp.module in surface and imp.line not in typing_only]


def layer_of(path: str) -> Optional[int]:
    """The index in :data:`LAYERS` of the module at ``path`` (len(LAYERS) - 1 for what
    stands beside them: below cli only); None for the package's own ``__init__``."""
    for i, (_, places) in enumerate(LAYERS):
        if _in(path, places):
            return i
    if _in(path, BESIDE):
        return len(LAYERS) - 1.5
    return None


def _module_path(module: str) -> Optional[str]:
    base = PKG.parent / module.replace(".", "/")
    if base.with_suffix(".py").exists():
        return str(base.with_suffix(".py").relative_to(PKG.parent))
    return None


def _layer_rule(path: str, imps: list) -> list:
    mine = layer_of(path)
    if mine is None:
        return []
    out = []
    for imp in imps:
        target = _module_path(imp.module) if imp.module.startswith("cpulaunch.") else None
        theirs = layer_of(target) if target else None
        if theirs is None or theirs <= mine or target.startswith(("cpulaunch/runtime/", "cpulaunch/tools/")):
            continue  # runtime and tools have their own rules (1, 2)
        name = LAYERS[int(theirs)][0] if theirs == int(theirs) else "tools/runtime"
        here = LAYERS[int(mine)][0] if mine == int(mine) else "tools/runtime"
        out.append(f"{path}:{imp.line}: layer {here} imports {imp.module} of layer {name} above it")
    return out


def _runtime_rule(path: str, tree: ast.Module, imps: list) -> list:
    if path.startswith("cpulaunch/runtime/"):
        return []
    out = []
    for imp in imps:
        if not imp.module.startswith("cpulaunch.runtime"):
            continue
        if path in ALIASES or (path in LAZY_RUNTIME and imp.function == "__getattr__"):
            continue
        out.append(f"{path}:{imp.line}: imports {imp.module} (only runtime/ and the documented aliases may)")
    if path in ALIASES:
        extra = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom, ast.Assign, ast.Expr))]
        if extra:
            out.append(f"{path}: an alias holds only its docstring, imports and the sys.modules line")
    return out


#: The modules that may import a tool, inside a function (rule 2).
TOOL_IMPORTERS = ("cpulaunch/cli.py", "cpulaunch/cmdline.py")


def _tools_rule(path: str, imps: list) -> list:
    if path.startswith("cpulaunch/tools/"):
        return []
    out = []
    for imp in imps:
        if imp.module.startswith("cpulaunch.tools") and not (path in TOOL_IMPORTERS and imp.lazy):
            out.append(f"{path}:{imp.line}: imports {imp.module} (tools only from cli.py, inside a function)")
    return out


def _pure_rule(path: str, tree: ast.Module, imps: list) -> list:
    if path not in PURE:
        return []
    pure_modules = {module_name(p) for p in PURE}
    out = []
    for imp in imps:
        top = imp.module.split(".")[0]
        if top == "cpulaunch":
            package_face = (PKG.parent / imp.module.replace(".", "/") / "__init__.py").exists()
            if imp.module not in pure_modules and not package_face and not (
                    path == "cpulaunch/distributed.py" and imp.function == "__getattr__"):
                out.append(f"{path}:{imp.line}: pure module imports {imp.module}")
        elif top in HOST_MODULES or top not in PURE_STDLIB:
            out.append(f"{path}:{imp.line}: pure module imports {imp.module}")
    for node, _ in _walk(tree):
        if isinstance(node, ast.Call) and (_os_call(node) or _called(node) == "open"):
            out.append(f"{path}:{node.lineno}: pure module calls {ast.unparse(node.func)}")
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "environb") and ast.unparse(node.value) == "os":
            out.append(f"{path}:{node.lineno}: pure module reads os.environ (take the environment as an argument)")
    return out


def _os_call(call: ast.Call) -> bool:
    """A call of ``os.X`` or ``os.path.X`` that asks the host (not in :data:`PURE_OS_CALLS`)."""
    f = call.func
    if not isinstance(f, ast.Attribute):
        return False
    base = ast.unparse(f.value)
    return base in ("os", "os.path", "shutil", "sys") and f.attr not in PURE_OS_CALLS


def _spawn_rule(path: str, tree: ast.Module) -> list:
    if _in(path, SPAWNERS):
        return []
    out = []
    for node, _ in _walk(tree):
        if isinstance(node, ast.Call) and _called(node) in SPAWN_CALLS and _owner(node) in SPAWN_OWNERS:
            out.append(f"{path}:{node.lineno}: starts a process ({ast.unparse(node.func)}) outside "
                       "machine/exec.py, launch/ and tune's trials")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n.split(".")[0] == "subprocess" for n in names):
                out.append(f"{path}:{node.lineno}: imports subprocess")
    return out


def _open_rule(path: str, tree: ast.Module) -> list:
    if _in(path, OPENERS):
        return []
    out = []
    for node, _ in _walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name, owner = _called(node), _owner(node)
        devnull = bool(node.args) and ast.unparse(node.args[0]) == "os.devnull"
        if (name == "open" and owner in (None, "os", "io", "builtins") and not devnull) \
                or (name == "mmap" and owner == "mmap") or name in FILE_METHODS:
            out.append(f"{path}:{node.lineno}: opens a file ({ast.unparse(node.func)}) outside machine/ and launch/")
    return out


# --------------------------------------------------------------------------- the rules hold


def test_the_package_keeps_its_roles():
    assert violations(sources()) == []


def test_the_layout_is_what_the_docs_draw():
    """The roles' folders exist with the modules docs/dev/design.md names, and no module sits
    outside them but the flat pipeline's."""
    flat = {p.name for p in PKG.glob("*.py")}
    assert flat == {"__init__.py", "__main__.py", "cli.py", "cmdline.py", "options.py", "core.py", "plan.py", "render.py", "forms.py",
                    "view.py", "svg.py", "distributed.py", "cpulist.py", "errors.py", "envvars.py", "names.py", "log.py", "api.py",
                    "inference.py", "torch_utils.py", "ddp_wrap.py", "rank_entry.py", "option_table.py", "placement.py", "settings.py",
                    "notes.py", "slips.py", "spelling.py", "records.py", "enums.py"}
    assert {p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        "machine", "launch", "tools", "runtime"}
    design = (REPO / "docs" / "dev" / "design.md").read_text()
    for p in sorted(PKG.rglob("*")):
        name = p.name + "/" if p.is_dir() else p.name
        if p.suffix == ".py" and p.name != "__init__.py" or p.is_dir() and p.name != "__pycache__":
            assert name in design, f"docs/dev/design.md does not name {rel(p)}"


def test_the_design_page_lists_the_rules_this_test_holds():
    text = DESIGN.read_text()
    assert design_with_rules(text) == text, "docs/dev/design.md's rules differ: run python tests/test_layers.py"
    assert text.count(RULES_BEGIN) == 1 and len(RULES) == 8


# --------------------------------------------------------------------------- the checker sees breaks


PLANTED = {
    "runtime imported by the core": ("cpulaunch/core.py", "from cpulaunch.runtime import ddp\n", "only runtime/"),
    "runtime imported lazily elsewhere": ("cpulaunch/plan.py", "def f():\n    import cpulaunch.runtime.bind\n",
                                          "only runtime/"),
    "a tool imported at module level by cli": ("cpulaunch/cli.py", "from cpulaunch.tools import doctor\n",
                                               "tools only from cli.py"),
    "a tool imported by core": ("cpulaunch/core.py", "def f():\n    from cpulaunch.tools import verify\n",
                                "tools only from cli.py"),
    "a tool loaded by name": ("cpulaunch/core.py",
                              "import importlib\ndef f(w):\n    importlib.import_module(f'cpulaunch.tools.{w}')\n",
                              "tools only from cli.py"),
    "planning reads the host": ("cpulaunch/plan.py", "from cpulaunch.machine import probe\n", "pure module imports"),
    "rendering opens a file": ("cpulaunch/render.py", "def f():\n    return open('/proc/cpuinfo').read()\n",
                               "pure module calls open"),
    "rendering asks the OS": ("cpulaunch/render.py", "import os\ndef f():\n    return os.sched_getaffinity(0)\n",
                              "pure module calls os.sched_getaffinity"),
    "a process from the probe": ("cpulaunch/machine/probe.py", "import subprocess\n", "imports subprocess"),
    "a fork in verify": ("cpulaunch/tools/verify.py", "import os\ndef f():\n    os.fork()\n", "starts a process"),
    "doctor opens a file": ("cpulaunch/tools/doctor.py", "def f(p):\n    return p.read_text()\n", "opens a file"),
    "an alias that grew code": ("cpulaunch/inference.py", "def helper():\n    pass\n", "an alias holds only"),
    "the host reader climbs to planning": ("cpulaunch/machine/host.py", "from cpulaunch.options import Options\n",
                                           "layer machine imports cpulaunch.options of layer planning"),
    "planning climbs to launch": ("cpulaunch/plan.py", "def f():\n    from cpulaunch.launch import spawn\n",
                                  "layer planning imports cpulaunch.launch.spawn of layer launch"),
    "launch climbs to the invocation": ("cpulaunch/launch/group.py", "from cpulaunch import core\n",
                                        "layer launch imports cpulaunch.core of layer invocation"),
    "a tool climbs to cli": ("cpulaunch/tools/doctor.py", "from cpulaunch.cli import main\n",
                             "layer tools/runtime imports cpulaunch.cli of layer cli"),
    "rendering reads the environment": ("cpulaunch/render.py", "import os\nHOME = os.environ.get('HOME')\n",
                                        "pure module reads os.environ"),
    "the planner imports the option table": ("cpulaunch/plan.py", "from cpulaunch.option_table import OPTIONS\n",
                                             "the planner imports cpulaunch.option_table of the option surface"),
    "settings imports the options lazily": ("cpulaunch/settings.py", "def f():\n    from cpulaunch import options\n",
                                            "the planner imports cpulaunch.options of the option surface"),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_a_planted_violation_is_found(case):
    path, code, words = PLANTED[case]
    trees = sources()
    planted = ast.parse((REPO / path).read_text() + "\n" + code)
    found = violations({**trees, path: planted})
    assert any(path in v and words in v for v in found), found


def union_annotations_evaluated(trees: dict) -> list:
    """``X | Y`` annotations Python evaluates at import (a module without ``from __future__
    import annotations``): a TypeError on Python 3.9, which pyproject's requires-python
    promises (PEP 604 came in 3.10). Returns "path:line: annotation" strings."""
    found = []
    for path, tree in trees.items():
        if any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
               and any(a.name == "annotations" for a in n.names) for n in tree.body):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                anns = [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
                        if x is not None] + [node.returns]
            elif isinstance(node, ast.AnnAssign):
                anns = [node.annotation]
            else:
                continue
            found += [f"{path}:{ann.lineno}: {ast.unparse(ann)}" for ann in anns if ann is not None
                      and any(isinstance(m, ast.BinOp) and isinstance(m.op, ast.BitOr) for m in ast.walk(ann))]
    return found


def test_no_union_annotation_breaks_python_3_9():
    """files.FileReader's ``str | os.PathLike`` once made the whole package fail to import
    on Python 3.9; the check finds such an annotation when one is planted."""
    assert union_annotations_evaluated(sources()) == []
    planted = {"cpulaunch/x.py": ast.parse("import os\ndef f(root: str | os.PathLike): pass\n"),
               "cpulaunch/y.py": ast.parse("from __future__ import annotations\ndef f(a: int | None): pass\n")}
    assert union_annotations_evaluated(planted) == ["cpulaunch/x.py:2: str | os.PathLike"]


if __name__ == "__main__":  # python tests/test_layers.py: write docs/dev/design.md's rules
    DESIGN.write_text(design_with_rules(DESIGN.read_text()))
