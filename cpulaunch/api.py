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
import sys
from dataclasses import dataclass, field
from typing import Mapping, Optional

from cpulaunch import cpulist

__all__ = ["plan_instances", "bind_current_process", "Binding"]

#: set_mempolicy(2) system call numbers (asm/unistd.h) and policy values (linux/mempolicy.h).
_SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 261, "s390x": 237, "riscv64": 237}
_MPOL = {"preferred": 1, "bind": 2, "interleave": 3, "local": 4}


def plan_instances(program: tuple = ("true",), environ: Optional[Mapping[str, str]] = None, **options):
    """Plan instances as the CLI would, in-process (no subprocess, no launch).

    Args:
        program: the program's argv (used for the instances' argv; default ``("true",)``).
        environ: the environment to plan against (default: os.environ; never modified).
        **options: cpulaunch's options by their python names, e.g. ``ninstances=2``,
            ``core_list="0-7"``, ``sysroot="/path/to/dump"``, ``allocator="default"``.

    Returns:
        :class:`cpulaunch.render.Rendered`: ``instances`` (each with ``index``, ``cpus`` =
        logical CPU ids, ``bound_cpus``, ``mem_nodes``, ``mem_policy``, ``env``, ``argv``,
        ``affinity``) and ``notes``.

    Raises:
        cpulaunch.errors.CpulaunchError: an option or combination the machine cannot meet.
    """
    from cpulaunch import core, options as opts_mod

    values, given = _parse(options)
    values.update(dry_run=True, program=tuple(program))
    opts = opts_mod.from_values(values, given)
    return core.prepare(opts, dict(os.environ if environ is None else environ)).rendered


def _parse(options: Mapping) -> tuple:
    """The keyword options through the CLI's own parser (same names, types and checks):
    ``{"ninstances": 2, "use_logical_cores": True}`` -> ``--ninstances 2 --use-logical-cores``.

    Raises:
        cpulaunch.options.OptionsError: an unknown option or a value of the wrong type.
    """
    import click

    from cpulaunch.cli import command
    from cpulaunch.options import OptionsError

    known = {p.name for p in command.params if isinstance(p, click.Option)}
    args = []
    for name, value in options.items():
        if name not in known or name in ("dry_run", "print_env", "show_topology", "program"):
            raise OptionsError(f"plan_instances: unknown option {name!r} (use the CLI's option names, e.g. ninstances=2)")
        flag = "--" + name.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value not in (None, False):
            args += [flag, str(value)]
    try:
        ctx = command.make_context("cpulaunch", args, resilient_parsing=False)
    except click.UsageError as exc:
        raise OptionsError(f"plan_instances: {exc.format_message()}") from None
    given = frozenset(options)
    return dict(ctx.params), given


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
        OSError: sched_setaffinity refused the CPUs (outside this process's cpuset).
    """
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
