"""``cpulaunch.bind_current_process(instance)``: apply one planned instance to the running
process (the shape of optimum-intel's in-process binding): CPU affinity, the planned OpenMP
variables for thread pools started later, torch's thread count when torch is already
imported, and the memory policy where the kernel permits it. Plan it first with
:func:`cpulaunch.plan_instances`.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from dataclasses import dataclass, field
from typing import Mapping, Optional

from cpulaunch import cpulist

__all__ = ["bind_current_process", "Binding"]

#: set_mempolicy(2) system call numbers (asm/unistd.h) and policy values (linux/mempolicy.h).
_SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 261, "s390x": 237, "riscv64": 237}
_MPOL = {"preferred": 1, "bind": 2, "interleave": 3, "local": 4}


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

    cpus: tuple[int, ...]
    env: Mapping[str, str]
    torch_threads: Optional[int]
    mem_policy: str
    notes: tuple[str, ...] = field(default_factory=tuple)


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
