"""A Python API for other launchers and serving code: plan without a subprocess, bind in-process.

``plan_instances(...)`` takes the CLI's options as keyword arguments (python names:
``ninstances=2``, ``instances_per_socket=1``, ``allocator="tcmalloc"``, ``sysroot=...``)
and returns the rendered plan, exactly what ``cpulaunch --dry-run`` prints.
``bind_current_process(instance)`` applies one instance to the running process (the shape
of optimum-intel's in-process binding): CPU affinity, the planned OpenMP variables for
thread pools started later, torch's thread count when torch is already imported, and the
memory policy where the kernel permits it.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shlex
import sys
from dataclasses import dataclass, field
from typing import Mapping, Optional

from cpulaunch import cpulist

__all__ = ["plan_instances", "bind_current_process", "Binding"]

#: set_mempolicy(2) system call numbers (asm/unistd.h) and policy values (linux/mempolicy.h).
_SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 261, "s390x": 237, "riscv64": 237}
_MPOL = {"preferred": 1, "bind": 2, "interleave": 3, "local": 4}


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

    env = _environ(environ)
    values, given = _parse(options)
    values.update(dry_run=True, program=_program(program))
    opts = opts_mod.from_values(values, given)
    return core.prepare(opts, env).rendered


#: Options plan_instances does not take: it is a dry-run of its ``program`` by nature.
_NOT_KEYWORDS = ("dry_run", "print_env", "show_topology", "program")


def _parse(options: Mapping) -> tuple:
    """The keyword options as click's parse would leave them, every value checked against
    its option's type (``cli.option_kinds``) and then through the option's own click type
    (a --sysroot that is a file is refused as on the command line); options not given
    take their defaults: ``{"ninstances": 2}`` -> ``({"ninstances": 2, "bind": "numactl",
    ...}, frozenset({"ninstances"}))``. CPULAUNCH_* variables are not read.

    Raises:
        cpulaunch.options.OptionsError: an unknown option or a value of the wrong type.
    """
    import click

    from cpulaunch.cli import command, option_kinds
    from cpulaunch.options import OptionsError, typed_value

    kinds = option_kinds()
    for name in options:
        if name not in kinds or name in _NOT_KEYWORDS:
            raise OptionsError(f"plan_instances: unknown option {name!r} (use the CLI's option names, "
                               "e.g. ninstances=2)")
    ctx = click.Context(command, info_name="cpulaunch")
    values = {}
    for p in command.get_params(ctx):
        if p.name not in kinds or p.name in _NOT_KEYWORDS:
            continue
        value = options.get(p.name)
        if value is None:
            values[p.name] = p.type_cast_value(ctx, p.get_default(ctx))
            continue
        value = typed_value(kinds[p.name], value, f"plan_instances: {p.name}")
        try:
            values[p.name] = p.type_cast_value(ctx, value)
        except click.BadParameter as exc:
            raise OptionsError(f"plan_instances: {p.name}: {exc.format_message()}") from None
    return values, frozenset(n for n, v in options.items() if v is not None)


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


def _environ(environ) -> dict:
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


@dataclass(frozen=True)
class Binding:
    """What :func:`bind_current_process` did.

    Attributes:
        cpus: logical CPUs the process is now bound to.
        env: variables set in os.environ (for thread pools started later).
        torch_threads: value passed to torch.set_num_threads, or None (torch not imported).
        mem_policy: the memory policy applied, or "none".
        notes: what could not be done and why (e.g. set_mempolicy refused: EPERM).
    """

    cpus: tuple
    env: Mapping[str, str]
    torch_threads: Optional[int]
    mem_policy: str
    notes: tuple = field(default_factory=tuple)


def _set_mempolicy(policy: str, nodes: tuple) -> Optional[str]:
    """set_mempolicy(2) for this thread's future allocations; None or the reason it failed."""
    number = _SYS_SET_MEMPOLICY.get(platform.machine())
    if number is None:
        return f"set_mempolicy: unknown system call number on {platform.machine()}"
    maxnode = max(nodes) + 2 if nodes else 1
    words = (maxnode + 63) // 64
    mask = (ctypes.c_ulong * words)()
    for n in nodes:
        mask[n // 64] |= 1 << (n % 64)
    libc = ctypes.CDLL(None, use_errno=True)
    mode = _MPOL[policy]
    ptr = None if policy == "local" else mask
    if libc.syscall(number, mode, ptr, ctypes.c_ulong(0 if policy == "local" else maxnode)) != 0:
        err = ctypes.get_errno()
        return f"set_mempolicy({policy}, {cpulist.format(nodes)}): {os.strerror(err)}"
    return None


def bind_current_process(instance, *, set_env: bool = True) -> Binding:
    """Apply a planned instance to this process (in-process binding).

    Args:
        instance: a :class:`cpulaunch.render.RenderedInstance` from :func:`plan_instances`.
        set_env: write the instance's variables into os.environ so OpenMP pools started
            later read them (this function's purpose; the launcher itself never does it).

    Does, in order: sched_setaffinity(2) to ``instance.bound_cpus``; the instance's env
    (OMP_NUM_THREADS, KMP_*, OMP_PLACES, CPULAUNCH_*) into os.environ, except LD_PRELOAD
    (only effective at exec); ``torch.set_num_threads(OMP_NUM_THREADS)`` if torch is
    already imported (its pool is started); set_mempolicy(2) with the planned policy and
    nodes (the calling thread's future allocations; refused without CAP_SYS_NICE in some
    containers, which becomes a note).

    Raises:
        TypeError: ``instance`` is not a RenderedInstance or ``set_env`` not a bool (one
            line; checked before anything is changed).
        OSError: sched_setaffinity refused the CPUs (outside this process's cpuset).
    """
    from cpulaunch.options import shown
    from cpulaunch.render import RenderedInstance

    if not isinstance(instance, RenderedInstance):
        raise TypeError(f"bind_current_process: instance = {shown(instance)}: give one of "
                        "plan_instances(...).instances (a cpulaunch.render.RenderedInstance)")
    if not isinstance(set_env, bool):
        raise TypeError(f"bind_current_process: set_env = {shown(set_env)}: give True or False")
    cpus = tuple(instance.bound_cpus or instance.cpus)
    os.sched_setaffinity(0, cpus)
    notes = []
    env = {k: v for k, v in instance.env.items() if k != "LD_PRELOAD"}
    if "LD_PRELOAD" in instance.env:
        notes.append("LD_PRELOAD not applied: libraries are preloaded at exec only (use the CLI)")
    if set_env:
        os.environ.update(env)
    threads = None
    torch = sys.modules.get("torch")
    if torch is not None and "OMP_NUM_THREADS" in env:
        threads = int(env["OMP_NUM_THREADS"])
        torch.set_num_threads(threads)
    policy = instance.mem_policy if instance.mem_nodes or instance.mem_policy == "local" else "none"
    if policy in _MPOL:
        reason = _set_mempolicy(policy, tuple(instance.mem_nodes))
        if reason:
            notes.append(reason)
            policy = "none"
    return Binding(cpus=cpus, env=env, torch_threads=threads, mem_policy=policy, notes=tuple(notes))
