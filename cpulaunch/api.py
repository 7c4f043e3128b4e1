"""A Python API for other launchers and serving code: plan without a subprocess.

``plan_instances(...)`` takes the CLI's options as keyword arguments (python names:
``ninstances=2``, ``instances_per_socket=1``, ``allocator="tcmalloc"``, ``sysroot=...``)
and returns the rendered plan, exactly what ``cpulaunch --dry-run`` prints.
``bind_current_process(instance)`` (:mod:`cpulaunch.runtime.bind`, what runs inside the
user's program) applies one instance to the running process.
"""

from __future__ import annotations

import os
import shlex
from typing import Mapping, Optional


__all__ = ["plan_instances", "run"]

def plan_instances(program=("true",), environ: Optional[Mapping[str, str]] = None, **options):
    """Plan instances as the CLI would, in-process (no subprocess, no launch).

    Args:
        program: the program's argv, a list or tuple of str (os.PathLike items too), used
            for the instances' argv (default ``("true",)``); or one str, split into words as
            a POSIX shell would (:func:`shlex.split`: ``"python x.py --tag 'a b'"`` ->
            ``("python", "x.py", "--tag", "a b")``; no shell runs, nothing is expanded).
        environ: the environment to plan against, str -> str (default: os.environ; never
            modified). Its CPULAUNCH_* option variables are not read as options: the
            keywords are the options (so a variable meant for the launcher that started
            this process does not leak into its plans), and no config file is read.
        **options: cpulaunch's options by their python names, e.g. ``ninstances=2``,
            ``core_list="0-7"``, ``sysroot="/path/to/dump"``, ``allocator="default"``.
            Each value must have the option's type exactly (the rule of ``--config``
            files, :func:`cpulaunch.options.typed_value`): a flag takes True or False, a
            count an int (not a bool, a float or a str), seconds an int or a float, a
            choice one of its strings, a list option (``core_list``) a str or an int, a
            path a str or os.PathLike. ``None`` means not given; 0 and False are values.

    Returns:
        :class:`cpulaunch.render.Rendered`: ``instances`` (each with ``index``, ``cpus`` =
        logical CPU ids, ``bound_cpus``, ``mem_nodes``, ``mem_policy``, ``env``, ``argv``,
        ``affinity``) and ``notes``.

    Raises:
        cpulaunch.errors.CpulaunchError: one line for anything about the options or the
            program: an unknown option, a value of the wrong type or out of range
            (``ninstances=0``), a NUL byte in a path or a word (naming the argument), a
            combination or plan the machine cannot meet.
        TypeError: ``environ`` is not a mapping of str to str.
    """
    from cpulaunch import core, options as opts_mod

    env = _check_environ(environ)
    values, words = _parse_options(options, "plan_instances")
    values.update(dry_run=True, program=_program(program))
    opts = opts_mod.from_values(values, frozenset(n for n in options if options[n] is not None), words)
    return core.prepare(opts, env).rendered


def run(program, environ: Optional[Mapping[str, str]] = None, **options) -> int:
    """Run ``program``'s instances as ``cpulaunch [options] program`` would, from Python, and
    return their exit code; this process stays: it starts, binds and watches the
    instances (never exec), relays their output, and stops them on SIGINT/SIGTERM/SIGHUP.
    Call it from the main thread (it handles those signals while they run). (Not named
    ``launch``: that is the package of the process machinery, ``cpulaunch.launch``.)

    Args:
        program: the program's argv (see :func:`plan_instances`); ``.py`` first words run
            with this interpreter.
        environ: the instances' base environment, str -> str (default: os.environ; never
            modified). CPULAUNCH_* option variables in it are not read as options.
        **options: cpulaunch's options by their python names, typed as for
            :func:`plan_instances` (``ninstances=2``, ``log_dir="logs"``).

    Returns:
        int: the exit code, as the command line's: 0, the first failing instance's code, or
        128+N when signal N ended it.

    Raises:
        cpulaunch.errors.CpulaunchError: the options, the program or the plan (one line).
        TypeError: ``environ`` is not a mapping of str to str.
    """
    from cpulaunch import core, options as opts_mod

    env = _check_environ(environ)
    values, words = _parse_options(options, "run")
    values["program"] = _program(program)
    opts = opts_mod.from_values(values, frozenset(n for n in options if options[n] is not None), words)
    if opts.launch.verify_after is not None:
        raise opts_mod.OptionsError("run: verify is the command line's (cpulaunch --verify); drop it")
    opts = opts._replace(launch=opts.launch._replace(exec_single=False))
    return core.run(opts, env)


def _parse_options(options: Mapping, caller: str) -> tuple:
    """The keyword options as the command line would leave them, every value checked
    against its option's type in the option table (:func:`cpulaunch.options.typed_value`);
    options not given take their defaults: ``{"ninstances": 2}`` -> ``({"ninstances": 2,
    "bind": "numactl", ...}, Words)``. CPULAUNCH_* variables are not read. ``caller`` names
    the function in messages (``run: unknown option 'ninstance' (did you mean ninstances=?)``).

    Raises:
        cpulaunch.options.OptionsError: an unknown option or a value of the wrong type.
    """
    import difflib

    from cpulaunch import option_table as table
    from cpulaunch.options import OptionsError, Words, api_spelling, typed_value

    keywords = table.api_keywords()
    for name in options:
        if name not in keywords:
            near = difflib.get_close_matches(str(name), keywords, n=1)
            hint = f"did you mean {near[0]}=?" if near else "use the CLI's option names, e.g. ninstances=2"
            raise OptionsError(f"{caller}: unknown option {name!r} ({hint})")
    values: dict = {o.dest: o.default for o in table.OPTIONS if o.dest in keywords}
    values.update({o.dest: False for o in table.OPTIONS if o.kind.name == "flag"})
    values.update({a.dest: False if a.kind.name == "flag" else None for a in table.ALIASES})
    spelled = {}
    for name, value in options.items():
        if value is None:
            continue
        values[name] = typed_value(table.kind_of(name), value, f"{caller}: {name}")
        spelled[name] = api_spelling(name, value)
    return values, Words(spelled)


def _program(program) -> tuple:
    """``program`` as argv words (see :func:`plan_instances`).

    Raises:
        cpulaunch.options.OptionsError: not a str, list or tuple of str; unbalanced quotes;
            a NUL byte.
    """
    from cpulaunch.options import OptionsError, shown

    if isinstance(program, str):
        try:
            words = shlex.split(program)
        except ValueError as exc:  # "No closing quotation"
            raise OptionsError(f"plan_instances: program = {shown(program)}: {exc}; "
                               "give a list of words to pass them as they are") from None
    elif isinstance(program, (list, tuple)):
        words = [os.fspath(w) if isinstance(w, os.PathLike) else w for w in program]
    else:
        words = None
    if words is None or not all(isinstance(w, str) for w in words):
        raise OptionsError(f"plan_instances: program = {shown(program)}: give a list or tuple of str "
                           "(('python', 'x.py')) or one str to split like a shell ('python x.py')")
    if any("\x00" in w for w in words):
        raise OptionsError(f"plan_instances: program = {shown(program)} holds a NUL byte")
    return tuple(words)


def _check_environ(environ) -> dict:
    """A copy of ``environ`` (os.environ when None), checked: str -> str.

    Raises:
        TypeError: not a mapping of str to str.
    """
    env = os.environ if environ is None else environ
    if not isinstance(env, Mapping):
        raise TypeError(f"plan_instances: environ must be a mapping of str to str, not {type(env).__name__}")
    out = dict(env)
    bad = next((k for k, v in out.items() if not (isinstance(k, str) and isinstance(v, str))), None)
    if bad is not None:
        from cpulaunch.options import shown

        raise TypeError(f"plan_instances: environ[{shown(bad)}] = {shown(out[bad])}: "
                        "environ must map str to str")
    return out
