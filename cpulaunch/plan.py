"""Placement planning: (Topology, Request) -> Plan. Pure and deterministic.

The rules, in the order they are applied:

1. *Usable CPUs* are online, allowed (affinity mask / cgroup cpuset) and inside
   ``--core-list`` / ``--node-list``. A list naming a CPU or node that is not usable is an
   error, never silently narrowed: the user asked for something the machine will not do.
2. *Cores*: each physical core contributes its lowest usable logical CPU, or all its
   usable SMT siblings with ``use_logical_cores`` (the PyTorch CPU tuning guide: one
   OpenMP thread per physical core; SMT siblings share the core's FMA units).
   E-cores of hybrid CPUs are left out unless ``use_e_cores``.
3. *Domains*: the cores are split per socket (``instances_per_socket``), per NUMA node
   (``instances_per_node``, ``throughput_mode``) or taken as one pool (``ninstances``,
   ``ncores_per_instance``, ``latency_mode``, default: one instance on everything).
4. *Instances* inside a domain own whole cores, their sizes differ by at most one core,
   and no instance straddles a NUMA node unless it is larger than a node. Where those
   three cannot all hold with every core used, cores are left idle (with a note) rather
   than straddling.
5. *Memory*: each instance's memory policy applies to the nodes of its CPUs that have
   memory (``numactl --membind`` by default).
6. The plan is validated before it is returned: instance CPU sets disjoint, inside the
   allowed set, whole cores; memory nodes exist and have memory.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace
from typing import Optional

from cpulaunch import cpulist
from cpulaunch.errors import CpulaunchError, InternalError
from cpulaunch.topology import Topology

__all__ = ["MemPolicy", "Request", "Instance", "Plan", "PlanError", "plan", "LATENCY_CORES"]

#: Cores per instance in latency mode (as torch.backends.xeon.run_cpu and ipexrun do).
LATENCY_CORES = 4


class PlanError(CpulaunchError, ValueError):
    """A request this machine cannot satisfy; the message says what and how to fix it."""


class MemPolicy(str, enum.Enum):
    """NUMA memory policy of an instance (numactl(8) option in brackets)."""

    BIND = "bind"  #: allocate only on the instance's nodes (--membind)
    PREFERRED = "preferred"  #: prefer the instance's first node, fall back elsewhere (--preferred)
    INTERLEAVE = "interleave"  #: round-robin pages over the instance's nodes (--interleave)
    LOCAL = "local"  #: allocate on the node of the CPU that faults the page (--localalloc)
    NONE = "none"  #: no memory flag: the kernel default (local allocation)


@dataclass(frozen=True)
class Request:
    """What the user asked for. ``None`` means "not given" (never -1).

    Attributes:
        ninstances: total number of instances.
        instances_per_socket: instances per socket (package).
        instances_per_node: instances per NUMA node with CPUs.
        ncores_per_instance: physical cores per instance.
        latency_mode: LATENCY_CORES cores per instance, as many instances as fit.
        throughput_mode: one instance per NUMA node.
        use_logical_cores: give instances all SMT siblings of their cores.
        use_e_cores: include E-cores of hybrid CPUs.
        core_list: logical CPU ids to restrict to (``--core-list``).
        node_list: NUMA node ids to restrict to (``--node-list``).
        instance_idx: indices of the instances to run (others are planned, not run).
        mem_policy: memory policy for every instance.
        reserve_cores: cores per instance to set aside (oneCCL workers), taken from the
            instance's own NUMA node, never used by its OpenMP threads.
    """

    ninstances: Optional[int] = None
    instances_per_socket: Optional[int] = None
    instances_per_node: Optional[int] = None
    ncores_per_instance: Optional[int] = None
    latency_mode: bool = False
    throughput_mode: bool = False
    use_logical_cores: bool = False
    use_e_cores: bool = False
    core_list: Optional[frozenset] = None
    node_list: Optional[frozenset] = None
    instance_idx: Optional[tuple] = None
    mem_policy: MemPolicy = MemPolicy.BIND
    reserve_cores: int = 0


@dataclass(frozen=True)
class Instance:
    """One planned process.

    Attributes:
        index: 0-based position among all planned instances (kept under --instance-idx).
        cpus: logical CPU ids it runs on (its compute CPUs), ascending.
        cores: ids (lowest logical CPU) of its physical cores.
        nodes: NUMA nodes its CPUs belong to.
        mem_nodes: nodes its memory policy applies to (nodes with memory).
        mem_policy: the policy actually applied (NONE when no node has memory).
        threads: OpenMP threads (= len(cpus), lowered by a CPU quota).
        reserved_cpus: CPUs set aside for helper threads (oneCCL workers); also bound.
        socket: index of its socket, or None if it spans several.
    """

    index: int
    cpus: tuple
    cores: tuple
    nodes: tuple
    mem_nodes: tuple
    mem_policy: MemPolicy
    threads: int
    reserved_cpus: tuple = ()
    socket: Optional[int] = None

    @property
    def cpulist(self) -> str:
        """Compute CPUs in kernel list format."""
        return cpulist.format(self.cpus)

    @property
    def bound_cpus(self) -> tuple:
        """Every CPU the process is bound to: compute plus reserved CPUs."""
        return tuple(sorted(set(self.cpus) | set(self.reserved_cpus)))


@dataclass(frozen=True)
class Plan:
    """The result of planning.

    Attributes:
        instances: the instances to run (after ``instance_idx``).
        num_instances: how many were planned in all.
        notes: things the user should know (fallbacks, idle cores, quota).
    """

    instances: tuple
    num_instances: int
    notes: tuple = field(default_factory=tuple)


# --------------------------------------------------------------------------- helpers


def _usable_cpus(topo: Topology, req: Request) -> frozenset:
    usable = topo.online & topo.allowed
    if req.core_list is not None:
        offline = req.core_list - topo.online
        if offline:
            known = "offline" if offline & topo.offline else "not present"
            raise PlanError(
                f"--core-list names CPUs {cpulist.format(offline)} that are {known} "
                f"(online CPUs: {cpulist.format(topo.online)}); fix the list"
            )
        outside = req.core_list - topo.allowed
        if outside:
            raise PlanError(
                f"--core-list names CPUs {cpulist.format(outside)} that this process may not "
                f"use (allowed: {cpulist.format(topo.allowed)}, from {topo.allowed_source}); "
                "pick CPUs inside the allowed set"
            )
        usable &= req.core_list
    if req.node_list is not None:
        unknown = req.node_list - set(topo.nodes)
        if unknown:
            raise PlanError(
                f"--node-list names NUMA nodes {cpulist.format(unknown)} that do not exist "
                f"(nodes: {cpulist.format(topo.nodes)}); fix the list"
            )
        cpuless = {n for n in req.node_list if not topo.nodes[n].cpus}
        if cpuless:
            raise PlanError(
                f"--node-list names NUMA nodes {cpulist.format(cpuless)} that have no CPUs "
                "(memory-only nodes); list nodes with CPUs"
            )
        node_cpus = frozenset().union(*(topo.nodes[n].cpus for n in req.node_list))
        if not node_cpus & topo.allowed:
            raise PlanError(
                f"--node-list {cpulist.format(req.node_list)}: none of its CPUs "
                f"({cpulist.format(node_cpus)}) may be used by this process (allowed: "
                f"{cpulist.format(topo.allowed)}, from {topo.allowed_source})"
            )
        usable &= node_cpus
    return usable


def _select_cores(topo: Topology, req: Request, usable: frozenset, notes: list) -> list:
    """Usable cores with the CPUs each contributes, ordered by (socket, node, core id)."""
    picked = []
    skipped_e = []
    for core in topo.cores:
        cpus = tuple(c for c in core.cpus if c in usable)
        if not cpus:
            continue
        if core.efficiency and not req.use_e_cores:
            skipped_e.append(core.id)
            continue
        if not req.use_logical_cores:
            cpus = cpus[:1]
        picked.append((core, cpus))
    if skipped_e:
        e_cpus = [c for core in topo.cores if core.id in skipped_e for c in core.cpus]
        if picked:
            notes.append(
                f"hybrid CPU: E-cores (CPUs {cpulist.format(e_cpus)}) left out; "
                "pass --use-e-cores to use them"
            )
        else:  # only E-cores are usable: use them rather than nothing
            notes.append("only E-cores are usable here: using them")
            return _select_cores(topo, replace(req, use_e_cores=True), usable, [])
    node_rank = {nid: i for i, nid in enumerate(sorted(topo.nodes))}
    picked.sort(
        key=lambda p: (p[0].socket, node_rank.get(p[0].node, len(node_rank)), p[0].id)
    )
    return picked


def _balanced_sizes(total: int, n: int) -> list:
    """Split ``total`` into ``n`` sizes differing by at most one, larger first."""
    q, r = divmod(total, n)
    return [q + 1] * r + [q] * (n - r)


def _split_domain(cores: list, n: int, fixed: Optional[int]) -> tuple:
    """Split the ordered ``cores`` of one domain into ``n`` instances.

    Returns (list of core groups, number of cores left idle).

    With at least as many instances as NUMA nodes, instances stay inside nodes: the
    largest instance size ``s`` such that every instance gets ``s`` or ``s + 1`` cores
    of a single node is used, and cores that do not fit are left idle. With fewer
    instances than nodes each instance is larger than a node, so the ordered cores are
    cut in contiguous balanced runs (whole nodes where the counts divide).
    ``fixed``: exactly that many cores per instance, inside nodes whenever ``n`` of them
    fit there, whatever the number of nodes.
    """
    by_node: dict = {}
    for item in cores:
        by_node.setdefault(item[0].node, []).append(item)
    node_items = list(by_node.values())
    node_sizes = [len(v) for v in node_items]
    total = len(cores)
    if n >= len(node_items) or fixed:
        for s in [fixed] if fixed else range(total // n, 0, -1):
            if sum(c // s for c in node_sizes) < n:
                continue
            counts = [0] * len(node_sizes)
            width = s if fixed else s + 1

            def gain(j):  # cores the next instance on node j adds (concave in counts[j])
                return min(node_sizes[j], (counts[j] + 1) * width) - min(node_sizes[j], counts[j] * width)

            # Greedy on marginal gain is optimal for concave gains: it maximises the cores
            # used; ties go to the node with the most spare cores, then the lower node.
            for _ in range(n):
                i = max(
                    (j for j in range(len(node_sizes)) if (counts[j] + 1) * s <= node_sizes[j]),
                    key=lambda j: (gain(j), node_sizes[j] - counts[j] * s, -j),
                )
                counts[i] += 1
            groups = []
            for items, k, size in zip(node_items, counts, node_sizes):
                extra = 0 if fixed else min(k, size - k * s)
                pos = 0
                for j in range(k):
                    width = s + 1 if j < extra else s
                    groups.append(items[pos : pos + width])
                    pos += width
            return groups, total - sum(len(g) for g in groups)
    # Fewer instances than nodes (each is larger than a node), or fixed-size instances
    # that cannot fit inside nodes: contiguous balanced runs in (socket, node, core) order.
    sizes = [fixed] * n if fixed else _balanced_sizes(total, n)
    groups, pos = [], 0
    for size in sizes:
        groups.append(cores[pos : pos + size])
        pos += size
    return groups, total - pos


def _instances_and_domains(topo: Topology, req: Request, cores: list, notes: list) -> list:
    """Return the list of (domain cores, instances in it, fixed size or None)."""
    total = len(cores)
    given = [
        name
        for name, val in (
            ("--ninstances", req.ninstances),
            ("--instances-per-socket", req.instances_per_socket),
            ("--instances-per-node", req.instances_per_node),
            ("--latency-mode", req.latency_mode or None),
            ("--throughput-mode", req.throughput_mode or None),
        )
        if val
    ]
    if len(given) > 1:
        raise PlanError(f"{' and '.join(given)} cannot be combined; choose one")
    for name, val in (
        ("--ninstances", req.ninstances),
        ("--instances-per-socket", req.instances_per_socket),
        ("--instances-per-node", req.instances_per_node),
        ("--ncores-per-instance", req.ncores_per_instance),
    ):
        if val is not None and val < 1:
            raise PlanError(f"{name} {val}: must be a positive number")
    fixed = req.ncores_per_instance
    if fixed and given and given[0] not in ("--ninstances",):
        raise PlanError(f"--ncores-per-instance cannot be combined with {given[0]}")

    if req.instances_per_socket or req.instances_per_node or req.throughput_mode:
        per = req.instances_per_socket or req.instances_per_node or 1
        if req.instances_per_socket:
            key = lambda item: item[0].socket  # noqa: E731
            what = "socket"
        else:
            key = lambda item: item[0].node  # noqa: E731
            what = "NUMA node"
        domains: dict = {}
        for item in cores:
            domains.setdefault(key(item), []).append(item)
        out = []
        for dkey, dcores in sorted(domains.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            if len(dcores) < per:
                raise PlanError(
                    f"{per} instances per {what} need {per} physical cores in each, but "
                    f"{what} {dkey} has only {len(dcores)} usable "
                    f"(CPUs {cpulist.format(c for _, cc in dcores for c in cc)}); "
                    "lower the count"
                )
            out.append((dcores, per, None))
        return out

    if req.latency_mode:
        fixed = LATENCY_CORES
        n = max(1, _fit_count(cores, LATENCY_CORES))
        if total < LATENCY_CORES:
            fixed = total
            notes.append(
                f"latency mode wants {LATENCY_CORES} cores per instance; only {total} "
                "usable, so one instance gets them all"
            )
        return [(cores, n, fixed)]
    if fixed:
        n = req.ninstances or _fit_count(cores, fixed)
        if n < 1 or n * fixed > total:
            raise PlanError(
                f"{req.ninstances or 1} instance(s) x {fixed} cores need {max(n, 1) * fixed} "
                f"physical cores, but only {total} are usable ({_usable_desc(topo, cores)}); "
                "lower --ncores-per-instance or --ninstances"
            )
        return [(cores, n, fixed)]
    n = req.ninstances or 1
    if n > total:
        raise PlanError(
            f"--ninstances {n} needs {n} physical cores, but only {total} are usable "
            f"({_usable_desc(topo, cores)}); lower --ninstances"
        )
    return [(cores, n, None)]


def _fit_count(cores: list, size: int) -> int:
    """How many ``size``-core instances to plan when the user gave no count: as many as
    fit inside NUMA nodes (rule 4: idle cores rather than straddling), or, where no node
    holds ``size`` usable cores, as many as fit in all (each is larger than a node)."""
    per_node: dict = {}
    for core, _ in cores:
        per_node[core.node] = per_node.get(core.node, 0) + 1
    return sum(c // size for c in per_node.values()) or len(cores) // size


def _usable_desc(topo: Topology, cores: list) -> str:
    cpus = cpulist.format(c for _, cc in cores for c in cc)
    return f"CPUs {cpus}; allowed {cpulist.format(topo.allowed)} by {topo.allowed_source}"


def _reserve(groups: list, k: int, topo: Topology, notes: list) -> list:
    """Take ``k`` cores from the end of each group (its own NUMA node) for helpers."""
    out = []
    for g in groups:
        if len(g) <= k:
            raise PlanError(
                f"reserving {k} core(s) per instance for oneCCL workers leaves an instance "
                f"with {len(g) - k} compute cores (it has {len(g)}); lower "
                "--ccl-worker-count or run fewer ranks"
            )
        out.append((g[:-k], g[-k:]))
    return out


# --------------------------------------------------------------------------- the planner


def plan(topo: Topology, req: Request) -> Plan:
    """Plan instances for ``req`` on ``topo`` (pure, deterministic).

    Args:
        topo: the machine (see :mod:`cpulaunch.topology` for id conventions).
        req: the request.

    Returns:
        a validated :class:`Plan`.

    Raises:
        PlanError: the request cannot be met (too many instances for the usable cores,
            unknown node, CPUs outside the allowed set, empty result, ...). The message is
            one line saying what was wrong and how to fix it.
    """
    notes: list = []
    usable = _usable_cpus(topo, req)
    if not usable:
        raise PlanError(
            f"no usable CPU: online {cpulist.format(topo.online)}, allowed "
            f"{cpulist.format(topo.allowed)} (from {topo.allowed_source}); widen --core-list/--node-list"
        )
    cores = _select_cores(topo, req, usable, notes)
    if not cores:
        raise PlanError("no usable physical core after applying the restrictions")
    domains = _instances_and_domains(topo, req, cores, notes)

    groups: list = []
    idle = 0
    for dcores, n, fixed in domains:
        g, left = _split_domain(dcores, n, fixed)
        groups.extend(g)
        idle += left
    if idle:
        used = {c for g in groups for _, cc in g for c in cc}
        left_cpus = [c for _, cc in cores for c in cc if c not in used]
        notes.append(f"{idle} usable core(s) left idle (CPUs {cpulist.format(left_cpus)})")
    # Node sizes in usable physical cores, the unit of len(g) (not logical CPUs: an
    # instance of 16 cores on two 8-core nodes of 16 CPUs each is larger than a node).
    node_cores: dict = {}
    for core, _ in cores:
        node_cores[core.node] = node_cores.get(core.node, 0) + 1
    for g in groups:
        gnodes = {core.node for core, _ in g}
        smallest = min((node_cores[n] for n in gnodes if n is not None), default=len(g))
        if len(gnodes) > 1 and len(g) <= smallest:
            notes.append(
                f"{len(g)}-core instances cannot all fit inside NUMA nodes here: some span "
                "nodes; choose a size that divides the node's cores to avoid that"
            )
            break
    reserved = [()] * len(groups)
    if req.reserve_cores:
        pairs = _reserve(groups, req.reserve_cores, topo, notes)
        groups = [p[0] for p in pairs]
        reserved = [tuple(sorted(c for _, cc in p[1] for c in cc)) for p in pairs]

    total_cpus = sum(len(cc) for g in groups for _, cc in g)
    instances = []
    for i, g in enumerate(groups):
        cpus = tuple(sorted(c for _, cc in g for c in cc))
        core_ids = tuple(core.id for core, _ in g)
        nodes = tuple(sorted({core.node for core, _ in g if core.node is not None}))
        mem_nodes = tuple(n for n in nodes if topo.nodes[n].has_memory)
        policy = MemPolicy(req.mem_policy)
        if policy not in (MemPolicy.NONE, MemPolicy.LOCAL) and not mem_nodes:
            notes.append(
                f"instance {i}: its NUMA nodes ({cpulist.format(nodes) or 'none'}) have no "
                "memory; memory is not bound (kernel default placement)"
            )
            policy = MemPolicy.NONE
        if policy is MemPolicy.PREFERRED and len(mem_nodes) > 1:
            notes.append(
                f"instance {i}: --mem-policy preferred takes one node; preferring node "
                f"{mem_nodes[0]} of {cpulist.format(mem_nodes)}"
            )
            mem_nodes = mem_nodes[:1]
        threads = len(cpus)
        if topo.quota_cpus is not None:
            share = topo.quota_cpus * len(cpus) / total_cpus
            capped = max(1, math.floor(share))
            if capped < threads:
                threads = capped
        sockets = {core.socket for core, _ in g}
        instances.append(
            Instance(
                index=i,
                cpus=cpus,
                cores=core_ids,
                nodes=nodes,
                mem_nodes=mem_nodes if policy not in (MemPolicy.NONE, MemPolicy.LOCAL) else (),
                mem_policy=policy,
                threads=threads,
                reserved_cpus=reserved[i],
                socket=sockets.pop() if len(sockets) == 1 else None,
            )
        )
    if topo.quota_cpus is not None and any(inst.threads < len(inst.cpus) for inst in instances):
        notes.append(
            f"a CPU quota of {topo.quota_cpus:g} CPUs applies (cgroup cpu.max): OpenMP "
            "threads lowered to fit it"
        )

    result = Plan(instances=tuple(instances), num_instances=len(instances), notes=tuple(notes))
    validate(result, topo)
    if req.instance_idx is not None:
        bad = [i for i in req.instance_idx if not 0 <= i < len(instances)]
        if bad:
            raise PlanError(
                f"--instance-idx {','.join(map(str, bad))}: only {len(instances)} instance(s) "
                f"are planned (indices 0-{len(instances) - 1})"
            )
        chosen = tuple(instances[i] for i in sorted(set(req.instance_idx)))
        result = replace(result, instances=chosen)
    return result


def validate(p: Plan, topo: Topology) -> None:
    """Check a plan's invariants; raises PlanError (a bug, not user input) if one fails.

    Invariants: instance CPU sets (compute and reserved) are disjoint and non-empty,
    inside ``topo.allowed``, never mix two physical cores' halves (each CPU's core belongs
    to one instance only); memory nodes exist and have memory.
    """
    seen: dict = {}
    core_owner: dict = {}
    for inst in p.instances:
        if not inst.cpus:
            raise PlanError(f"internal: instance {inst.index} has no CPU")
        for c in inst.bound_cpus:
            if c in seen:
                raise PlanError(f"internal: CPU {c} in instances {seen[c]} and {inst.index}")
            seen[c] = inst.index
            if c not in topo.allowed:
                raise PlanError(f"internal: CPU {c} of instance {inst.index} is not allowed")
            owner = core_owner.setdefault(topo.core_of(c).id, inst.index)
            if owner != inst.index:
                raise PlanError(f"internal: core of CPU {c} split between instances")
        for n in inst.mem_nodes:
            if n not in topo.nodes or not topo.nodes[n].has_memory:
                raise PlanError(f"internal: memory node {n} of instance {inst.index} unusable")


def parse_index_list(text: str) -> tuple:
    """``"0,2-3"`` -> ``(0, 2, 3)`` (``--instance-idx``), via the one cpulist parser."""
    return tuple(sorted(cpulist.parse(text)))
