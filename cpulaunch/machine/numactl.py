"""numactl(8): the NUMA memory policies, the one builder of a ``numactl`` command line, and
the command that checks numactl really binds here.

The launcher's prefix (render), the host check before a launch
(:func:`cpulaunch.machine.host.check_numactl` runs :func:`check_argv`) and ``cpulaunch
doctor`` all build their command with :func:`argv`, so a check that passes is a check of
the very command the launcher runs. Pure.
"""

from __future__ import annotations

from cpulaunch import cpulist
from cpulaunch.enums import Enum
from cpulaunch.records import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Sequence

__all__ = ["MemPolicy", "argv", "check_argv"]


class MemPolicy(str, Enum):
    """NUMA memory policy of an instance (numactl(8) option in brackets; set_mempolicy(2))."""

    BIND = "bind"  #: allocate only on the instance's nodes (--membind)
    PREFERRED = "preferred"  #: prefer the instance's first node, fall back elsewhere (--preferred)
    INTERLEAVE = "interleave"  #: round-robin pages over the instance's nodes (--interleave)
    LOCAL = "local"  #: allocate on the node of the CPU that faults the page (--localalloc)
    NONE = "none"  #: no memory flag: the kernel default (local allocation)


def argv(numactl: str, cpus: Sequence[int], policy: MemPolicy, mem_nodes: Sequence[int]) -> tuple[str, ...]:
    """``numactl -C <cpus>`` plus the memory flag of ``policy`` (numactl(8)): bind ``-m
    <nodes>``, preferred ``-p <first node>`` (numactl 2.0.16 takes one node there and
    refuses a list: "<0,1> is invalid"), interleave ``-i <nodes>``, local ``-l``, none nothing; no node flag
    when ``mem_nodes`` is empty.

    Args:
        numactl: numactl's path (or "numactl" when describing another machine).
        cpus: logical CPU ids (as in /sys/devices/system/cpu/cpuN).
        policy: the memory policy.
        mem_nodes: NUMA node ids, the first being the preferred one.

    ``("numactl", [0, 1, 2], MemPolicy.BIND, [0])`` -> ``("numactl", "-C", "0-2", "-m", "0")``.
    """
    out = [numactl, "-C", cpulist.format(cpus)]
    policy = MemPolicy(policy)
    nodes = cpulist.format(mem_nodes)
    if policy is MemPolicy.BIND and nodes:
        out += ["-m", nodes]
    elif policy is MemPolicy.PREFERRED and nodes:
        out += ["-p", str(list(mem_nodes)[0])]
    elif policy is MemPolicy.INTERLEAVE and nodes:
        out += ["-i", nodes]
    elif policy is MemPolicy.LOCAL:
        out += ["-l"]
    return tuple(out)


def check_argv(numactl: str, topo, policy: MemPolicy) -> list[str]:
    """The one ``numactl ... true`` that tells whether binding works here: every CPU this
    process may use and every memory node it may allocate on (those with CPUs it may use
    first, else all), with ``policy``'s flag (:func:`argv`). A container without
    CAP_SYS_NICE refuses ``set_mempolicy`` with EPERM; a cpuset refuses CPUs or nodes
    outside it.

    Args:
        topo: the machine (:class:`cpulaunch.machine.topology.Topology`).
    """
    allowed_mems = topo.allowed_mems
    nodes = sorted(n for n in topo.memory_nodes if allowed_mems is None or n in allowed_mems)
    nodes = [n for n in nodes if topo.nodes[n].cpus & topo.allowed] or nodes
    return list(argv(numactl, sorted(topo.allowed), policy, nodes)) + ["true"]
