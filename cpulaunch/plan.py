"""Placement planning: (Topology, Request) -> Plan. Pure and deterministic.

The rules, in the order they are applied:

1. *Usable CPUs* are online, allowed (affinity mask / cgroup cpuset) and inside
   ``--core-list`` / ``--node-list``. A list naming a CPU or node that is not usable is an
   error, never silently narrowed: the user asked for something the machine will not do.
2. *Cores*: each physical core contributes its lowest usable logical CPU, or all its
   usable SMT siblings with ``use_logical_cores`` (the PyTorch CPU tuning guide: one
   OpenMP thread per physical core; SMT siblings share the core's FMA units). A
   ``--core-list`` that names siblings of cores it already uses gets a note saying they
   were left out. E-cores of hybrid CPUs are left out unless ``use_e_cores``.
3. *Domains*: the cores are split per socket (``instances_per_socket``), per NUMA node
   (``instances_per_node``, ``throughput_mode``) or taken as one pool (``ninstances``,
   ``ncores_per_instance``, ``latency_mode``, default: one instance on everything).
4. *Instances* own whole cores.

   - ``ninstances`` (and the default single instance) use every usable core (issue 8):
     sizes differ by at most one core, and each instance is a run of the cores in
     (socket, node, core) order. Which instances get the larger size is chosen to have
     the fewest instances spanning sockets, then the fewest spanning NUMA nodes (larger
     instances first among equals): instances fill sockets and nodes exactly wherever the
     sizes allow, and only those that cannot fit span nodes. A note names the spanning
     instances that one of their nodes could hold; memory goes to the nodes of their CPUs.
   - Per-socket / per-node modes: inside each domain, sizes differ by at most one core
     and no instance straddles a NUMA node unless it is larger than a node; cores that do
     not fit are left idle (with a note).
   - Fixed sizes (``ncores_per_instance``, ``latency_mode``): the user fixed the size, so
     instances stay inside nodes wherever they fit, and cores are left idle (with a note)
     rather than straddling.
5. *Budgets* (issue 11): whole cores taken from the end of each instance's cores (its
   last NUMA node, its only one unless it spans nodes): the last ``ccl_workers`` cores for
   oneCCL workers, the ``dataloader_workers`` cores before them for DataLoader workers,
   the ``reserve_cores`` cores before those for the program's own non-OpenMP threads.
   The rest are the compute CPUs (the OpenMP CPUs). With ``use_logical_cores`` a budget
   core brings all its usable SMT siblings, else its lowest usable CPU, as compute cores.
6. *Threads*: one OpenMP thread per compute CPU. A cgroup CPU quota (``cpu.max``) is split
   evenly over all planned instances: ``max(1, min(compute CPUs, floor(quota / instances)))``
   (issue 8), with a note when it lowers any instance's threads. More instances than the
   quota runs at once (:func:`quota_limit`) are planned as asked, with a note naming the
   quota (issue 35): they take turns on the quota's CPU time. (``--ddp``'s defaults and
   ``--nproc-per-node auto`` plan no more ranks than that: :func:`cpulaunch.distributed.rank_request`.)
7. *Memory*: an instance's memory policy applies to the nodes of its CPUs that have memory
   and that the cgroup's ``cpuset.mems`` allows (``Topology.allowed_mems``; None: unknown,
   taken as all). When none of its nodes qualifies, the policy drops to ``NONE`` (kernel
   default placement, which the cgroup keeps on its allowed nodes) with a note: binding
   to a remote node would be a guess, and binding to a forbidden one fails.
8. The plan is validated before it is returned: CPU sets (compute and budgets) disjoint,
   inside the allowed set, whole cores; memory nodes exist, have memory and are allowed.
   A failed check is a bug of ours (:class:`~cpulaunch.errors.InternalError`).
"""

from __future__ import annotations

from cpulaunch import cpulist
from cpulaunch.errors import CpulaunchError, InternalError
from cpulaunch.notes import explain
from cpulaunch.machine.numactl import MemPolicy
from cpulaunch.machine.topology import Topology
from cpulaunch.names import PLACEMENT_MODES
from cpulaunch.spelling import Spellings
from cpulaunch.records import TYPE_CHECKING, Record

if TYPE_CHECKING:
    from typing import Optional

__all__ = [
    "Request",
    "Instance",
    "Plan",
    "PlanError",
    "plan",
    "validate",
    "parse_index_list",
    "LATENCY_CORES",
    "usable_cores",
    "quota_limit",
    "quota_text",
]

#: Cores per instance in latency mode (as torch.backends.xeon.run_cpu and ipexrun do).
LATENCY_CORES = 4


class PlanError(CpulaunchError, ValueError):
    """A request this machine cannot satisfy; the message says what and how to fix it."""


class Request(Record):
    """What the user asked for. ``None`` means "not given" (never -1).

    Attributes:
        ninstances: total number of instances; they use every usable core.
        instances_per_socket: instances per socket (package).
        instances_per_node: instances per NUMA node with CPUs.
        instances_per_l3: instances per L3 domain (``--instances-per-l3``; the part of an
            L3 inside one NUMA node where an L3 spans nodes); needs the topology's caches.
        ncores_per_instance: physical cores per instance (compute and budget cores): one
            count for every instance, or a tuple of one count per instance (run_cpu's
            ``--ncores-per-instance 43 43 42``, written ``43,43,42`` here).
        latency_mode: LATENCY_CORES cores per instance, as many instances as fit.
        throughput_mode: one instance per NUMA node.
        use_logical_cores: give instances (and budgets) all SMT siblings of their cores.
        use_e_cores: include E-cores of hybrid CPUs.
        core_list: logical CPU ids to restrict to (``--core-list``), already parsed.
        node_list: NUMA node ids to restrict to (``--node-list``), already parsed.
        instance_idx: indices of the instances to run (others are planned, not run).
        mem_policy: memory policy for every instance.
        dataloader_workers: physical cores per instance set aside for DataLoader workers
            (``--dataloader-workers``), never used by its OpenMP threads.
        reserve_cores: physical cores per instance set aside for the program's own
            non-OpenMP threads, e.g. a serving front-end (``--reserve-cores``).
        ccl_workers: physical cores per instance set aside for oneCCL workers
            (``--ccl-worker-count`` under ``--ddp --backend ccl``).
        equal_sizes: sizes within one core inside each domain (``--equal-sizes``):
            balanced instances that may share an L3, leave cores idle in
            per-socket/per-node modes or span nodes with ``ninstances``, instead of sizes
            that follow the nodes and cache domains.
        words: how the user gave the fields, for messages (:class:`cpulaunch.spelling.Spellings`
            by field), e.g. ``ninstances`` as ``Spelling("derived", "--nproc-per-node",
            "--nproc-per-node 4")`` when ``--ddp --nproc-per-node 4`` asked for 4 ranks
            (:meth:`said`, :meth:`name`). A field not in it is named by its long name
            (``ninstances`` -> ``--ninstances``).
    """

    ninstances: Optional[int] = None
    instances_per_socket: Optional[int] = None
    instances_per_node: Optional[int] = None
    ncores_per_instance: Optional[int] = None
    latency_mode: bool = False
    throughput_mode: bool = False
    use_logical_cores: bool = False
    use_e_cores: bool = False
    core_list: Optional[frozenset[int]] = None
    node_list: Optional[frozenset[int]] = None
    instance_idx: Optional[tuple[int, ...]] = None
    mem_policy: MemPolicy = MemPolicy.BIND
    dataloader_workers: int = 0
    reserve_cores: int = 0
    ccl_workers: int = 0
    instances_per_l3: Optional[int] = None
    equal_sizes: bool = False
    words: Spellings = Spellings()

    def name(self, field: str) -> str:
        """The option behind ``field`` as the user named it (``--nproc-per-node``), else
        its long name (``"ninstances"`` -> ``--ninstances``)."""
        return self.words.name(field)

    def said(self, field: str) -> str:
        """``field`` with its value as the user gave it (``--nproc-per-node 4``), else
        its long name and value (``--ninstances 4``; a flag alone)."""
        spelling = self.words.get(field)
        if spelling is not None:
            return spelling.said
        value = getattr(self, field)
        if field == "ncores_per_instance":
            value = ",".join(map(str, _sizes_of(self) or ()))
        elif isinstance(value, (frozenset, tuple)):
            value = cpulist.format(value)
        return self.name(field) if isinstance(value, bool) else f"{self.name(field)} {value}"

    def modes(self) -> tuple[str, ...]:
        """The placement modes given (field names, in :data:`PLACEMENT_MODES`' order):
        ``Request(ninstances=2).modes()`` -> ``("ninstances",)``. At most one is valid."""
        return tuple(m for m in PLACEMENT_MODES if getattr(self, m))


class Instance(Record):
    """One planned process. Every CPU tuple holds logical CPU ids, ascending.

    Attributes:
        index: 0-based position among all planned instances (kept under --instance-idx).
        cpus: its compute CPUs: the CPUs its OpenMP threads run on.
        cores: ids (lowest logical CPU) of the physical cores of its compute CPUs.
        nodes: NUMA node ids of every CPU it is bound to (compute and budgets).
        mem_nodes: NUMA node ids its memory policy applies to (nodes with memory that
            the cgroup allows); empty for LOCAL and NONE.
        mem_policy: the policy actually applied (NONE when no node qualifies).
        threads: OpenMP threads: one per compute CPU, lowered to the instance's even share
            of a cgroup CPU quota (``floor(quota / instances)``, at least 1).
        reserved_cpus: CPUs set aside for the program's own non-OpenMP threads
            (``Request.reserve_cores``, e.g. a serving front-end); bound, not OpenMP.
        socket: index of its socket, or None if its CPUs span several.
        ccl_cpus: CPUs set aside for oneCCL workers (``Request.ccl_workers``).
        dataloader_cpus: CPUs set aside for DataLoader workers
            (``Request.dataloader_workers``).
    """

    index: int
    cpus: tuple[int, ...]
    cores: tuple[int, ...]
    nodes: tuple[int, ...]
    mem_nodes: tuple[int, ...]
    mem_policy: MemPolicy
    threads: int
    reserved_cpus: tuple[int, ...] = ()
    socket: Optional[int] = None
    ccl_cpus: tuple[int, ...] = ()
    dataloader_cpus: tuple[int, ...] = ()

    @property
    def cpulist(self) -> str:
        """Compute CPUs in kernel list format (``"0-3,8"``)."""
        return cpulist.format(self.cpus)

    @property
    def bound_cpus(self) -> tuple[int, ...]:
        """Every CPU the process is bound to: compute, oneCCL, DataLoader and reserved."""
        return tuple(sorted({*self.cpus, *self.ccl_cpus, *self.dataloader_cpus, *self.reserved_cpus}))


class Plan(Record):
    """The result of planning.

    Attributes:
        instances: the instances to run (after ``instance_idx``).
        num_instances: how many were planned in all.
        notes: things the user should know (fallbacks, idle cores, quota).
    """

    instances: tuple[Instance, ...]
    num_instances: int
    notes: tuple[str, ...] = ()


# --------------------------------------------------------------------------- usable CPUs


def _usable_cpus(topo: Topology, req: Request) -> frozenset:
    """Online & allowed CPUs, narrowed by --core-list / --node-list (rule 1)."""
    usable = topo.online & topo.allowed
    if req.core_list is not None:
        _check_core_list(topo, req)
        usable &= req.core_list
    if req.node_list is not None:
        usable &= _node_list_cpus(topo, req)
    if not usable:
        lists = [req.said(f) for f in ("core_list", "node_list") if getattr(req, f) is not None]
        where = f"online {cpulist.format(topo.online)}, allowed {cpulist.format(topo.allowed)} (from " \
                f"{topo.allowed_source})"
        raise PlanError(f"{' and '.join(lists)} leave no usable CPU ({where}); widen them" if lists else
                        f"no usable CPU: {where}")
    return usable


def _check_core_list(topo: Topology, req: Request) -> None:
    core_list = req.core_list
    offline = core_list - topo.online
    if offline:
        known = "offline" if offline & topo.offline else "not present"
        raise PlanError(
            f"{req.said('core_list')} names CPUs {cpulist.format(offline)} that are {known} "
            f"(online CPUs: {cpulist.format(topo.online)}); fix the list"
        )
    outside = core_list - topo.allowed
    if outside:
        raise PlanError(
            f"{req.said('core_list')} names CPUs {cpulist.format(outside)} that this process may not "
            f"use (allowed: {cpulist.format(topo.allowed)}, from {topo.allowed_source}); "
            "pick CPUs inside the allowed set"
        )


def _node_list_cpus(topo: Topology, req: Request) -> frozenset:
    node_list = req.node_list
    unknown = node_list - set(topo.nodes)
    if unknown:
        raise PlanError(
            f"{req.said('node_list')} names NUMA nodes {cpulist.format(unknown)} that do not exist "
            f"(nodes: {cpulist.format(topo.nodes)}); fix the list"
        )
    cpuless = {n for n in node_list if not topo.nodes[n].cpus}
    if cpuless:
        raise PlanError(
            f"{req.said('node_list')} names NUMA nodes {cpulist.format(cpuless)} that have no CPUs "
            "(memory-only nodes); list nodes with CPUs"
        )
    node_cpus = frozenset().union(*(topo.nodes[n].cpus for n in node_list))
    if not node_cpus & topo.allowed:
        raise PlanError(
            f"{req.said('node_list')}: none of its CPUs "
            f"({cpulist.format(node_cpus)}) may be used by this process (allowed: "
            f"{cpulist.format(topo.allowed)}, from {topo.allowed_source})"
        )
    return node_cpus


# --------------------------------------------------------------------------- cores


def _select_cores(topo: Topology, req: Request, usable: frozenset, notes: list) -> list:
    """Usable cores with the CPUs each contributes, ordered by (socket, node, L3 domain,
    L2/cluster domain, core id); the cache domains where the topology holds them.

    Returns a list of ``(Core, cpus)`` pairs, ``cpus`` being logical CPU ids (rule 2).
    """
    picked, skipped_e, siblings = _pick_cores(topo, usable, req.use_logical_cores, req.use_e_cores)
    if skipped_e:
        e_cpus = [c for core in skipped_e for c in core.cpus]
        if picked:
            notes.append(explain(
                f"hybrid CPU: E-cores (CPUs {cpulist.format(e_cpus)}) left out; "
                "pass --use-e-cores to use them"
            ))
        else:  # only E-cores are usable: use them rather than nothing
            notes.append("only E-cores are usable here: using them")
            picked, _, siblings = _pick_cores(topo, usable, req.use_logical_cores, True)
    if req.core_list is not None and siblings:
        notes.append(
            f"--core-list: CPUs {cpulist.format(siblings)} are SMT siblings of cores already "
            "used and were left out (one OpenMP thread per physical core); pass "
            "--use-logical-cores to use them"
        )
    if not picked:
        raise PlanError("no usable physical core after applying the restrictions")
    node_rank = {nid: i for i, nid in enumerate(sorted(topo.nodes))}

    def cache(core, level: str) -> int:
        index = topo.cache_of(core.id, level)
        return -1 if index is None else index

    picked.sort(key=lambda p: (p[0].socket, node_rank.get(p[0].node, len(node_rank)),
                               cache(p[0], "l3"), cache(p[0], "l2"), p[0].id))
    return picked


def _pick_cores(topo: Topology, usable: frozenset, logical: bool, e_cores: bool) -> tuple:
    """(picked (Core, cpus) pairs, E-cores skipped, usable SMT siblings left out)."""
    picked, skipped_e, siblings = [], [], []
    for core in topo.cores:
        cpus = core.cpus if usable.issuperset(core.cpus) else tuple(c for c in core.cpus if c in usable)
        if not cpus:
            continue
        if core.efficiency and not e_cores:
            skipped_e.append(core)
            continue
        if not logical:
            siblings.extend(cpus[1:])
            cpus = cpus[:1]
        picked.append((core, cpus))
    return picked, skipped_e, siblings


# --------------------------------------------------------------------------- domains


class _Domain(Record):
    """Cores to cut into instances.

    cores: (Core, cpus) pairs in (socket, node, L3, L2, core) order; count: instances to
    cut; size: cores per instance when the user fixed one size, else None; fill: True to
    use every core (instances may span nodes), False to stay inside nodes; sizes: one size
    per instance (``--ncores-per-instance 43,43,42``), else None; equal: sizes within one
    core (``--equal-sizes``).
    """

    cores: list
    count: int
    size: Optional[int]
    fill: bool
    sizes: Optional[tuple] = None
    equal: bool = False


#: The modes that plan per socket, NUMA node or L3 domain.
_PER_DOMAIN = {"instances_per_socket", "instances_per_node", "instances_per_l3", "throughput_mode"}


def _check_modes(req: Request) -> None:
    """One placement mode at most, positive counts (PlanError otherwise; the options
    layer says so first, in the user's words, for requests made from options)."""
    given = req.modes()
    if len(given) > 1:
        raise PlanError(f"{req.said(given[0])} and {req.said(given[1])} cannot be combined; choose one")
    for field in PLACEMENT_MODES[:4]:
        val = getattr(req, field)
        if val is not None and val < 1:
            raise PlanError(f"{req.said(field)}: must be a positive number")
    sizes = _sizes_of(req)
    if sizes is not None and (not sizes or min(sizes) < 1):
        raise PlanError(f"{req.said('ncores_per_instance')}: each count must be a positive number")
    if req.ncores_per_instance and given and given[0] != "ninstances":
        raise PlanError(f"{req.said('ncores_per_instance')} cannot be combined with {req.said(given[0])}")
    if sizes is not None and len(sizes) > 1 and req.ninstances not in (None, len(sizes)):
        raise PlanError(f"{req.said('ninstances')} and {req.said('ncores_per_instance')} ({len(sizes)} sizes) "
                        "disagree; give one size per instance, or one size")


def _sizes_of(req: Request) -> Optional[tuple]:
    """``ncores_per_instance`` as a tuple of sizes (one int -> a 1-tuple), or None."""
    fixed = req.ncores_per_instance
    if fixed is None:
        return None
    return tuple(fixed) if isinstance(fixed, (tuple, list)) else (fixed,)


def _domains(topo: Topology, req: Request, cores: list, notes: list) -> list:
    """The list of :class:`_Domain` to cut (rule 3); PlanError if the counts cannot be met."""
    _check_modes(req)
    eq = req.equal_sizes
    if set(req.modes()) & _PER_DOMAIN:
        return _per_domain(topo, req, cores)
    total = len(cores)
    if req.latency_mode:
        n = max(1, _fit_count(cores, LATENCY_CORES))
        if total < LATENCY_CORES:
            notes.append(
                f"latency mode wants {LATENCY_CORES} cores per instance; only {total} "
                "usable, so one instance gets them all"
            )
            return [_Domain(cores, n, total, False)]
        return [_Domain(cores, n, LATENCY_CORES, False)]
    sizes = _sizes_of(req)
    if sizes is not None and len(sizes) > 1:
        if sum(sizes) > total:
            raise PlanError(
                f"{req.said('ncores_per_instance')} needs {sum(sizes)} physical cores, but only "
                f"{total} are usable ({_usable_desc(topo, cores)}); lower the counts"
            )
        return [_Domain(cores, len(sizes), None, False, sizes=sizes)]
    fixed = sizes[0] if sizes else None
    if fixed:
        n = req.ninstances or _fit_count(cores, fixed)
        if n < 1 or n * fixed > total:
            who = f"{req.said('ninstances')} x " if req.ninstances else ""
            raise PlanError(
                f"{who}{req.said('ncores_per_instance')} needs {max(n, 1) * fixed} "
                f"physical cores, but only {total} are usable ({_usable_desc(topo, cores)}); "
                f"lower {req.name('ncores_per_instance')}" + (f" or {req.name('ninstances')}" if req.ninstances else "")
            )
        return [_Domain(cores, n, fixed, False)]
    n = req.ninstances or 1
    if n > total:
        raise PlanError(
            f"{req.said('ninstances')} needs {n} physical cores, but only {total} are usable "
            f"({_usable_desc(topo, cores)}); lower {req.name('ninstances')}"
        )
    return [_Domain(cores, n, None, True, equal=eq)]


def _per_domain(topo: Topology, req: Request, cores: list) -> list:
    """One domain per socket, NUMA node or L3 domain (its part in one node), each with
    the same instance count."""
    per = req.instances_per_socket or req.instances_per_node or req.instances_per_l3 or 1
    if req.instances_per_socket:
        key, what = (lambda item: item[0].socket), "socket"
    elif req.instances_per_l3:
        if not (topo.caches and topo.caches.l3):
            raise PlanError(f"{req.said('instances_per_l3')}: no L3 cache domains are known on this machine "
                            "(no cpuN/cache/index* of level 3 in sysfs); use --instances-per-node")
        key, what = (lambda item: (item[0].node, topo.cache_of(item[0].id, "l3"))), "L3 domain"
    else:
        key, what = (lambda item: item[0].node), "NUMA node"
    domains = _group_by(cores, key)
    out = []
    def order(kv):  # by socket or node id (None last), then L3 domain
        k = kv[0] if isinstance(kv[0], tuple) else (kv[0], 0)
        return (k[0] is None, k[0] or 0, -1 if k[1] is None else k[1])

    for dkey, dcores in sorted(domains.items(), key=order):
        if len(dcores) < per:
            name = f"{what} {dkey}" if what != "L3 domain" else f"the L3 domain of CPU {dcores[0][1][0]}"
            mode = next(iter(req.modes()), "instances_per_node")
            raise PlanError(
                f"{req.said(mode)} needs {per} physical cores in each {what}, but "
                f"{name} has only {len(dcores)} usable "
                f"(CPUs {cpulist.format(c for _, cc in dcores for c in cc)}); "
                f"lower {req.name(mode)}"
            )
        out.append(_Domain(dcores, per, None, False, equal=req.equal_sizes))
    return out


def _fit_count(cores: list, size: int) -> int:
    """How many ``size``-core instances to plan when the user gave no count: as many as
    fit inside NUMA nodes (idle cores rather than straddling), or, where no node holds
    ``size`` usable cores, as many as fit in all (each is larger than a node)."""
    per_node = _group_by(cores, lambda item: item[0].node)
    return sum(len(v) // size for v in per_node.values()) or len(cores) // size


def _usable_desc(topo: Topology, cores: list) -> str:
    cpus = cpulist.format(c for _, cc in cores for c in cc)
    return f"CPUs {cpus}; allowed {cpulist.format(topo.allowed)} by {topo.allowed_source}"


def _group_by(items: list, key) -> dict:
    """{key: [items]} in first-seen order, each list keeping the items' order."""
    out: dict = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out


# --------------------------------------------------------------------------- cutting


class _Levels(Record):
    """The cache levels instances are cut along (issue 22), coarse to fine.

    cuts: ``(label, key, ident)`` triples, ``key(item)`` naming an item's domain at that
    level nested in its socket and node, ``ident(item)`` the domain itself (an L3 that
    spans nodes is one domain in two pieces): ("L3 domains", ...), then ("clusters" or
    "L2 domains", ...); empty where the topology's caches were not read. l3: the key of the L3 level
    (of the node where no L3 is known), for the tie-breaks of balanced cuts.
    """

    cuts: tuple = ()
    l3: object = None


def _node_key(item) -> tuple:
    return (item[0].socket, item[0].node)


def _levels(topo: Topology) -> _Levels:
    """The :class:`_Levels` of ``topo`` (keys by each core's lowest CPU)."""
    caches = topo.caches
    if caches is None:
        return _Levels((), _node_key)
    l3 = {core.id: topo.cache_of(core.id, "l3") for core in topo.cores}
    l2 = {core.id: topo.cache_of(core.id, "l2") for core in topo.cores}

    def l3_key(item) -> tuple:
        return (item[0].socket, item[0].node, l3.get(item[0].id))

    def l2_key(item) -> tuple:
        return (item[0].socket, item[0].node, l3.get(item[0].id), l2.get(item[0].id))

    cuts = [("L3 domains", l3_key, lambda item: l3.get(item[0].id))] if caches.l3 else []
    if caches.l2:
        cuts.append(("clusters" if caches.l2[0].kind == "cluster" else "L2 domains", l2_key,
                     lambda item: l2.get(item[0].id)))
    return _Levels(tuple(cuts), l3_key if caches.l3 else _node_key)


def _split(domain: _Domain, levels: _Levels = _Levels((), _node_key)) -> tuple:
    """Cut a domain into instances: (list of core groups, number of cores left idle, what
    the sizes follow where they differ by more than one core, else "")."""
    if domain.sizes:
        groups = _place_list(domain.cores, list(domain.sizes), levels)
        return groups, len(domain.cores) - sum(map(len, groups)), ""
    if domain.size or domain.equal:
        if domain.fill:
            return _split_balanced(domain.cores, domain.count, levels.l3), 0, ""
        return (*_split_inside_nodes(domain.cores, domain.count, domain.size, levels), "")
    if domain.fill:
        groups, label = _cut_fill(domain.cores, domain.count, levels)
    else:
        groups, label = _cut_per_domain(domain.cores, domain.count, levels)
    sizes = [len(g) for g in groups]
    return groups, 0, label if max(sizes) - min(sizes) > 1 else ""


def _cut_runs(cores: list, sizes: list) -> list:
    """Consecutive runs of ``cores`` of the given sizes."""
    groups, pos = [], 0
    for size in sizes:
        groups.append(cores[pos : pos + size])
        pos += size
    return groups


def _split_inside_nodes(cores: list, n: int, fixed: Optional[int], levels: _Levels = _Levels()) -> tuple:
    """Split ``cores`` into ``n`` instances that stay inside NUMA nodes where they can.

    Returns (list of core groups, number of cores left idle).

    Balanced (``fixed`` None) with at least as many instances as nodes: the largest size
    ``s`` such that every instance gets ``s`` or ``s + 1`` cores of a single node; cores
    that do not fit stay idle. With fewer instances than nodes each instance is larger
    than a node: contiguous balanced runs. ``fixed``: exactly that many cores per
    instance, inside nodes whenever ``n`` of them fit there (placed in each node on its
    cache domains, :func:`_place_fixed`), else contiguous runs.
    """
    node_items = list(_group_by(cores, lambda item: item[0].node).values())
    node_sizes = [len(v) for v in node_items]
    if n >= len(node_items) or fixed:
        for s in [fixed] if fixed else range(len(cores) // n, 0, -1):
            counts = _node_counts(node_sizes, n, s, s if fixed else s + 1)
            if counts is None:
                continue
            groups = []
            for items, k in zip(node_items, counts):
                if fixed:
                    groups.extend(_place_fixed(items, k, s, levels))
                    continue
                extra = min(k, len(items) - k * s)
                groups.extend(_cut_runs(items, [s + 1] * extra + [s] * (k - extra)))
            return groups, len(cores) - sum(len(g) for g in groups)
    sizes = [fixed] * n if fixed else _balanced_sizes(len(cores), n)
    return _cut_runs(cores, sizes), len(cores) - sum(sizes)


def _node_counts(node_sizes: list, n: int, s: int, width: int) -> Optional[list]:
    """Instances per node when ``n`` instances of ``s`` (up to ``width``) cores stay
    inside nodes, or None if they do not fit. Greedy on the marginal cores gained, which
    is optimal for these concave gains: it maximises the cores used; ties go to the node
    with the most spare cores, then the lower node."""
    if sum(c // s for c in node_sizes) < n:
        return None
    counts = [0] * len(node_sizes)

    def gain(j):  # cores the next instance on node j adds
        return min(node_sizes[j], (counts[j] + 1) * width) - min(node_sizes[j], counts[j] * width)

    for _ in range(n):
        i = max(
            (j for j in range(len(node_sizes)) if (counts[j] + 1) * s <= node_sizes[j]),
            key=lambda j: (gain(j), node_sizes[j] - counts[j] * s, -j),
        )
        counts[i] += 1
    return counts


def _balanced_sizes(total: int, n: int) -> list:
    """Split ``total`` into ``n`` sizes differing by at most one, larger first."""
    q, r = divmod(total, n)
    return [q + 1] * r + [q] * (n - r)


def _run_lengths(items: list, key) -> list:
    """Lengths of the runs of consecutive items with equal ``key``."""
    out: list = []
    last = object()
    for item in items:
        k = key(item)
        if out and k == last:
            out[-1] += 1
        else:
            out.append(1)
            last = k
    return out


#: Largest lattice (instances x (larger instances + 1)) searched exactly by
#: :func:`_order_exact` (under 0.1 s: 40 ms measured for 632 instances on 944 cores);
#: larger requests use :func:`_order_greedy`, so planning stays fast on any machine.
_EXACT_STATES = 200_000


def _split_balanced(cores: list, n: int, l3key=None) -> list:
    """``n`` contiguous runs of ``cores`` (in (socket, node, core) order) using every
    core, ``r`` of ``q + 1`` cores and ``n - r`` of ``q`` (``q, r = divmod(cores, n)``).

    The order of the sizes is the one with the fewest instances spanning sockets, then
    the fewest spanning NUMA nodes, then L3 domains (``l3key``, an item's L3 domain; None:
    its node), larger instances first among equals (:func:`_order_exact`); beyond
    ``_EXACT_STATES`` a greedy fill, socket by socket then node by node, stands in
    (:func:`_order_greedy`).
    """
    q, r = divmod(len(cores), n)
    if n * (r + 1) <= _EXACT_STATES:
        sizes = _order_exact(cores, n, q, r, l3key)
    else:
        sizes = _order_greedy(cores, n, q, r)
    return _cut_runs(cores, sizes)


def _run_ids(items: list, key) -> list:
    """For each item, the index of its run of consecutive items with equal ``key``."""
    out, last, run = [], object(), -1
    for item in items:
        k = key(item)
        if k != last:
            run, last = run + 1, k
        out.append(run)
    return out


def _order_exact(cores: list, n: int, q: int, r: int, l3key=None) -> list:
    """Sizes (``r`` of ``q + 1``, ``n - r`` of ``q``) in the order that minimises
    (instances spanning sockets, instances spanning nodes, instances spanning L3 domains):
    a shortest path over the lattice (instances placed k, larger ones among them b),
    position ``k * q + b``. ``l3key``: an item's L3 domain (None: its node, which adds
    nothing to the node term)."""
    sock = _run_ids(cores, lambda item: item[0].socket)
    node = _run_ids(cores, _node_key)
    l3 = node if l3key is None else _run_ids(cores, l3key)
    weight, inf = n + 1, (n + 1) ** 3
    after = [inf] * (r + 1)  # best cost from (k + 1, b) to the end
    after[r] = 0
    choices = []
    for k in range(n - 1, -1, -1):
        here, pick = [inf] * (r + 1), bytearray(r + 1)
        for b in range(max(0, r - (n - k)), min(k, r) + 1):
            a = k * q + b
            best = inf
            if b < r:  # a larger instance: cores a .. a + q
                best = after[b + 1] + _span_cost(sock, node, l3, a, a + q, weight)
                pick[b] = 1
            if k - b < n - r:  # a smaller one: cores a .. a + q - 1
                cost = after[b] + _span_cost(sock, node, l3, a, a + q - 1, weight)
                if cost < best:
                    best, pick[b] = cost, 0
            here[b] = best
        choices.append(pick)
        after = here
    sizes, b = [], 0
    for pick in reversed(choices):
        sizes.append(q + pick[b])
        b += pick[b]
    return sizes


def _span_cost(sock: list, node: list, l3: list, first: int, last: int, weight: int) -> int:
    """Cost of an instance from item ``first`` to ``last`` (inclusive): spanning sockets
    weighs ``weight ** 2``, nodes ``weight``, L3 domains 1 (``weight`` > instances, so a
    socket outweighs every node and L3 span of a plan)."""
    return ((sock[first] != sock[last]) * weight * weight + (node[first] != node[last]) * weight
            + (l3[first] != l3[last]))


def _order_greedy(cores: list, n: int, q: int, r: int) -> list:
    """Sizes (``r`` of ``q + 1``, ``n - r`` of ``q``) ordered by filling socket by socket
    (:func:`_order_sizes` on the sockets' core counts), then, for the instances wholly
    inside each socket, node by node. Linear in the number of cores; at most a few
    instances more span nodes than with :func:`_order_exact`."""
    import bisect  # only splitting plans need it (issue 40: kept off the common run)

    sockets = _run_lengths(cores, lambda item: item[0].socket)
    nodes = _run_lengths(cores, lambda item: (item[0].socket, item[0].node))
    sizes = _order_sizes(sockets, q, r, n - r)
    node_ends = _prefix_sums(nodes)
    out = list(sizes)
    k, pos, lo = 0, 0, 0
    for length in sockets:
        hi = lo + length
        while k < n and pos < lo:  # an instance coming in from the previous socket
            pos += sizes[k]
            k += 1
        first, start = k, pos
        while k < n and pos + sizes[k] <= hi:
            pos += sizes[k]
            k += 1
        if k > first:
            inner = node_ends[bisect.bisect_right(node_ends, start) : bisect.bisect_left(node_ends, pos)]
            bins = [b - a for a, b in zip([start, *inner], [*inner, pos])]
            big = sizes[first:k].count(q + 1)
            out[first:k] = _order_sizes(bins, q, big, k - first - big)
        lo = hi
    return out


def _prefix_sums(lengths: list) -> list:
    out, acc = [], 0
    for length in lengths:
        acc += length
        out.append(acc)
    return out


def _order_sizes(bins: list, q: int, big: int, small: int) -> list:
    """Order ``big`` sizes of ``q + 1`` and ``small`` sizes of ``q`` laid end to end over
    consecutive ``bins`` (core counts summing to the sizes' sum), filling bin by bin.

    Each bin takes whole instances filling it exactly if the remaining sizes allow
    (:func:`_fill`), else as much as fits, and then the next instance (a large one first)
    starts there and spans into the next bin. Raises InternalError if the sums differ.
    """
    seq: list = []
    carry = 0  # cores the instance spanning from earlier bins still needs
    for c in bins:
        taken = min(carry, c)
        carry -= taken
        c -= taken
        if not c:
            continue
        m, a = _fill(c, q, big, small)
        seq += [q + 1] * a + [q] * (m - a)
        big, small = big - a, small - (m - a)
        c -= m * q + a
        if c:
            if not big and not small:
                raise InternalError(f"internal: {c} core(s) left over when ordering instance sizes")
            size = q + 1 if big else q
            big, small = (big - 1, small) if big else (big, small - 1)
            seq.append(size)
            carry = size - c
    if big or small or carry:
        raise InternalError("internal: instance sizes do not add up to the cores")
    return seq


def _fill(c: int, q: int, big: int, small: int) -> tuple:
    """Whole instances for ``c`` free cores of one bin: ``(m, a)``, ``m`` instances of
    which ``a`` have ``q + 1`` cores (at most ``big``) and ``m - a`` have ``q`` (at most
    ``small``), covering as many of the ``c`` cores as possible; among equal covers, the
    share of large ones nearest the share still to place (keeps later bins fillable)."""
    share = big / (big + small) if big + small else 0.0
    best_used, options = -1, []
    for m in range(min(big + small, c // q) + 1):
        lo, hi = max(0, m - small), min(m, big, c - m * q)
        if lo > hi:
            continue
        options.append((m, lo, hi))
        best_used = max(best_used, m * q + hi)
    candidates = [
        (m, best_used - m * q) for m, lo, hi in options if lo <= best_used - m * q <= hi
    ]
    return min(candidates, key=lambda ma: (abs(ma[1] - ma[0] * share), -ma[1]))


# --------------------------------------------------------------------------- cache domains
#
# Issue 22 (docs/guide/placement.md): instances follow the machine's domains. Balanced sizes
# that cut through an L3 make two instances share it; whole domains keep each instance's
# L3 (AMD's CCX/CCD, the unit AMD's EPYC tuning guides tell to place work on) to itself.

#: Largest group count squared x instances searched exactly by :func:`_dp_runs` (about
#: 0.1 s); beyond it, groups of unequal sizes are cut by their count (:func:`_whole_runs`).
_DP_STEPS = 300_000


def _cut_fill(cores: list, n: int, levels: _Levels) -> tuple:
    """``n`` runs using every core: whole domains of the coarsest cache level that has at
    least ``n`` of them among ``cores`` (and groups several cores in one), so that no two
    instances share one; else balanced sizes (today's rule, cut on L3 boundaries where the sizes allow).
    Returns (groups, the label of the level followed, or "")."""
    for label, key, ident in levels.cuts:
        lengths = _run_lengths(cores, key)
        if len({ident(item) for item in cores}) >= max(n, 2) and max(lengths) > 1:
            l3key = None if label == "L3 domains" else levels.l3
            return _cut_runs(cores, _whole_runs(cores, lengths, n, l3key)), label
    return _split_balanced(cores, n, levels.l3), ""


def _cut_per_domain(cores: list, n: int, levels: _Levels) -> tuple:
    """``n`` instances of a socket, node or L3 domain, using every core. With at least as
    many instances as NUMA nodes, each node gets whole instances, as many as its share of
    the cores gives (:func:`_apportion`: 7 + 5 cores, two instances -> one per node), then
    each node is cut by :func:`_cut_fill`; with fewer, the domain is (instances larger
    than a node). Returns (groups, what the sizes followed, or "")."""
    nodes = _run_lengths(cores, _node_key)
    if n < len(nodes):
        return _cut_fill(cores, n, levels)
    counts = _apportion(nodes, n)
    groups, labels, pos = [], [], 0
    for length, k in zip(nodes, counts):
        g, label = _cut_fill(cores[pos : pos + length], k, levels)
        groups.extend(g)
        if label and label not in labels:
            labels.append(label)
        pos += length
    shares = [(length + k - 1) // k for length, k in zip(nodes, counts)]
    if max(shares) - min(length // k for length, k in zip(nodes, counts)) > 1:
        labels.insert(0, "NUMA nodes")
    return groups, " and ".join(labels)


def _apportion(lengths: list, n: int) -> list:
    """Instances per group (each at least one, ``n`` in all, ``n >= len(lengths)``, ``n``
    at most the cores): the next one goes to the group whose instances are largest now,
    the lower group among equals, which makes the largest instance as small as it can be.
    ``([7, 5], 3)`` -> ``[2, 1]`` (3 + 4 | 5)."""
    counts = [1] * len(lengths)
    for _ in range(n - len(lengths)):
        best = max(range(len(lengths)), key=lambda j: (lengths[j] * 10**6 // counts[j], -j))
        counts[best] += 1
    return counts


def _whole_runs(cores: list, lengths: list, n: int, l3key) -> list:
    """Sizes of ``n`` runs of whole groups (``lengths``: the consecutive groups' core
    counts): the most even (smallest sum of squares), then the fewest runs spanning
    sockets, nodes and (``l3key``) L3 domains. Groups of one size: ``q`` or ``q + 1``
    groups each, ordered by :func:`_order_exact`; else :func:`_dp_runs`."""
    firsts, pos = [], 0
    for length in lengths:
        firsts.append(cores[pos])
        pos += length
    count = len(lengths)
    if len(set(lengths)) == 1 or count * count * n > _DP_STEPS:
        q, r = divmod(count, n)
        if n * (r + 1) <= _EXACT_STATES:
            per = _order_exact(firsts, n, q, r, l3key)
        else:
            per = _order_greedy(firsts, n, q, r)
    else:
        per = _dp_runs(cores, lengths, n, l3key)
    sizes, g = [], 0
    for k in per:
        sizes.append(sum(lengths[g : g + k]))
        g += k
    return sizes


def _dp_runs(cores: list, lengths: list, n: int, l3key) -> list:
    """Groups per run for :func:`_whole_runs` where groups differ in size: a shortest
    path over (runs placed, groups used) with cost size² x W³ + spans (:func:`_span_cost`,
    W = n + 1), so evenness comes first and spans break ties. ``([4, 3, 5], 2)`` -> [2, 1]."""
    ends = _prefix_sums(lengths)
    starts = [0] + ends[:-1]
    sock = _run_ids(cores, lambda item: item[0].socket)
    node = _run_ids(cores, _node_key)
    l3 = node if l3key is None else _run_ids(cores, l3key)
    count, weight = len(lengths), n + 1
    big, inf = weight ** 3, None
    best = [0] + [inf] * count  # best cost of the runs so far, ending after group b
    backs = []
    for j in range(1, n + 1):
        new, back = [inf] * (count + 1), [0] * (count + 1)
        for b in range(j, count - (n - j) + 1):
            for a in range(j - 1, b):
                if best[a] is None:
                    continue
                size = ends[b - 1] - starts[a]
                cost = best[a] + size * size * big + _span_cost(sock, node, l3, starts[a], ends[b - 1] - 1, weight)
                if new[b] is None or cost < new[b]:
                    new[b], back[b] = cost, a
        best = new
        backs.append(back)
    per, b = [], count
    for back in reversed(backs):
        per.append(b - back[b])
        b = back[b]
    return per[::-1]


def _place_fixed(items: list, k: int, s: int, levels: _Levels) -> list:
    """``k`` instances of ``s`` cores inside one node (``items``), each inside one cache
    domain, spread over them first (one per domain, then a second...), where they fit
    (:func:`_spread`), else each on whole domains of its own (:func:`_own_domains`);
    coarsest level first; else consecutive runs (two instances then share a domain)."""
    for _, key, _ in levels.cuts:
        lengths = _run_lengths(items, key)
        if len(lengths) < 2 or max(lengths) < 2:
            continue
        placed = _spread(items, lengths, k, s) or _own_domains(items, lengths, [s] * k)
        if placed:
            return placed
    return _cut_runs(items, [s] * k)


def _spread(items: list, lengths: list, k: int, s: int) -> Optional[list]:
    """``k`` runs of ``s`` items, each inside one group, round-robin over the groups with
    room (as few sharing a group as the count allows); None where they do not fit."""
    caps = [length // s for length in lengths]
    if sum(caps) < k:
        return None
    counts, left, rnd = [0] * len(lengths), k, 1
    while left:
        for g, cap in enumerate(caps):
            if left and cap >= rnd:
                counts[g] += 1
                left -= 1
        rnd += 1
    groups, pos = [], 0
    for length, c in zip(lengths, counts):
        groups.extend(_cut_runs(items[pos : pos + length], [s] * c))
        pos += length
    return groups


def _own_domains(items: list, lengths: list, sizes: list) -> Optional[list]:
    """Runs of ``sizes`` in order, each starting at a group's start and taking whole
    groups until it has its size (the rest of its last group idle): no group shared.
    None where they do not fit."""
    groups, g, pos = [], 0, 0
    for size in sizes:
        start, have = pos, 0
        while have < size and g < len(lengths):
            have += lengths[g]
            pos += lengths[g]
            g += 1
        if have < size:
            return None
        groups.append(items[start : start + size])
    return groups


def _place_list(cores: list, sizes: list, levels: _Levels) -> list:
    """Instances of the given sizes (``--ncores-per-instance 43,43,42``), laid out in
    order, each from where the one before ended: at the start of the next domain no
    instance has touched yet at the coarsest cache level that has one (none shares an L3
    while an unused one is left, then an L2 or cluster), else right there; moved to the
    next NUMA node where it would straddle one it fits in. Where the moves leave too
    little room: consecutive runs."""
    import bisect  # only splitting plans need it (issue 40: kept off the common run)

    node_ends = _prefix_sums(_run_lengths(cores, _node_key))
    biggest = max(b - a for a, b in zip([0] + node_ends[:-1], node_ends))
    tiers = [(_prefix_sums([0] + _run_lengths(cores, key))[:-1], ident) for _, key, ident in levels.cuts]
    used: list = [set() for _ in tiers]
    groups, pos = [], 0
    for size in sizes:
        start = None
        for (starts, ident), seen in zip(tiers, used):
            i = bisect.bisect_left(starts, pos)
            while i < len(starts) and start is None:
                cand = _fit_node(starts[i], size, biggest, node_ends, len(cores))
                if ident(cores[starts[i]]) not in seen and cand == starts[i]:
                    start = cand
                i += 1
            if start is not None:
                break
        if start is None:
            start = _fit_node(pos, size, biggest, node_ends, len(cores))
        if start is None:
            return _cut_runs(cores, sizes)
        groups.append(cores[start : start + size])
        for (_, ident), seen in zip(tiers, used):
            seen.update(ident(item) for item in groups[-1])
        pos = start + size
    return groups


def _fit_node(start: int, size: int, biggest: int, node_ends: list, total: int) -> Optional[int]:
    """Where a run of ``size`` items from ``start`` goes: there, or at the start of the
    next node where it would straddle one (and fits in a node); None past the end."""
    import bisect  # only splitting plans need it (issue 40: kept off the common run)

    while start < total and size <= biggest:
        end = node_ends[bisect.bisect_right(node_ends, start)]
        if start + size <= end:
            break
        start = end
    return start if start + size <= total else None


# --------------------------------------------------------------------------- notes on cuts


def _idle_note(groups: list, cores: list, idle: int) -> Optional[str]:
    if not idle:
        return None
    used = {c for g in groups for _, cc in g for c in cc}
    left = [c for _, cc in cores for c in cc if c not in used]
    return explain(f"{idle} usable core(s) left idle (CPUs {cpulist.format(left)})")


def _straddle_note(groups: list, cores: list, domains: list) -> Optional[str]:
    """A note naming the instances that span NUMA nodes although one of their nodes has
    enough usable cores (counted in physical cores, the unit of a group) to hold them,
    and why (``domains``: the :class:`_Domain` list the groups were cut from)."""
    node_cores: dict = {}
    for core, _ in cores:
        node_cores[core.node] = node_cores.get(core.node, 0) + 1
    spanning = []
    for i, g in enumerate(groups):
        gnodes = {core.node for core, _ in g}
        if len(gnodes) > 1 and len(g) <= max(node_cores[n] for n in gnodes):
            spanning.append(i)
    if not spanning:
        return None
    who = (f"instance {spanning[0]} spans" if len(spanning) == 1
           else f"instances {cpulist.format(spanning)} span")
    if any(d.fill for d in domains):
        return explain(f"{who} NUMA nodes: balanced instances cannot all fit inside nodes here, "
                       "and spanning beats leaving cores idle (memory policy over the nodes of their CPUs)")
    hint = "; choose a size that divides the nodes' cores to avoid it" if any(d.size for d in domains) else ""
    return explain(f"{who} NUMA nodes: {len(groups[spanning[0]])}-core instances cannot all fit inside nodes "
                   f"here{hint}")


def _follow_note(groups: list, labels: list) -> Optional[str]:
    """Where sizes follow nodes or cache domains and differ by more than one core: say so,
    and how to get equal ones."""
    if not labels:
        return None
    counts: dict = {}
    for g in groups:
        counts[len(g)] = counts.get(len(g), 0) + 1
    sizes = ", ".join(f"{c} x {size}" for size, c in sorted(counts.items(), reverse=True))
    why = []
    if "NUMA nodes" in " ".join(labels):
        why.append("no core is left idle")
    caches = [label for label in " and ".join(labels).split(" and ") if label != "NUMA nodes"]
    if caches:
        why.append("no two instances share " + " or ".join(
            {"L3 domains": "an L3", "L2 domains": "an L2", "clusters": "a cluster"}[c] for c in caches))
    return explain(f"instance sizes ({sizes} cores) follow the {' and '.join(labels)}, so that "
                   f"{' and '.join(why)}; --equal-sizes makes them differ by one core at most")


def _share_note(topo: Topology, groups: list) -> Optional[str]:
    """Where caches were read and a socket's planned cores span several L3 domains (an
    AMD CCD, a Kunpeng node; not an Intel socket, which is one L3 that instances sharing
    a socket must share): the instances that share an L3 with another (unavoidable at
    this count or size, or asked for with --equal-sizes)."""
    if topo.caches is None or len(groups) < 2:
        return None
    owners: dict = {}
    per_socket: dict = {}
    for i, g in enumerate(groups):
        for core, _ in g:
            d = topo.cache_of(core.id, "l3")
            if d is not None:
                owners.setdefault(d, set()).add(i)
                per_socket.setdefault(core.socket, set()).add(d)
    sharing = sorted({i for who in owners.values() if len(who) > 1 for i in who})
    if not sharing or max(map(len, per_socket.values())) < 2:
        return None
    return explain(f"{len(groups)} instances on {len(owners)} L3 domains: instances {cpulist.format(sharing)} "
                   "share an L3 with another instance")


# --------------------------------------------------------------------------- budgets

#: (Request field, option name), in the order they are taken from the end of an instance.
_BUDGETS = ("ccl_workers", "dataloader_workers", "reserve_cores")


def _take_budgets(groups: list, req: Request) -> list:
    """Split each group into (compute, ccl, dataloader, reserved) core groups (rule 5)."""
    ks = [getattr(req, attr) for attr in _BUDGETS]
    for attr, k in zip(_BUDGETS, ks):
        if k < 0:
            raise PlanError(f"{req.said(attr)}: must be 0 or more")
    total = sum(ks)
    if total:
        smallest = min(range(len(groups)), key=lambda i: len(groups[i]))
        if len(groups[smallest]) <= total:
            raise PlanError(_budget_error(req, groups, smallest, ks, total))
    out = []
    for g in groups:
        end, parts = len(g), []
        for k in ks:
            parts.append(g[end - k : end])
            end -= k
        out.append((g[:end], *parts))
    return out


def _budget_error(req: Request, groups: list, i: int, ks: list, total: int) -> str:
    given = [attr for attr, k in zip(_BUDGETS, ks) if k]
    what = " and ".join(req.said(attr) for attr in given)
    options = " or ".join(req.name(attr) for attr in given)
    cpus = cpulist.format(c for _, cc in groups[i] for c in cc)
    return (
        f"{what} {'take' if len(given) > 1 else 'takes'} {total} core(s) from each instance, but instance {i} has only "
        f"{len(groups[i])} (CPUs {cpus}), leaving no core for its OpenMP threads; lower "
        f"{options}, or plan fewer instances (ranks)"
    )


# --------------------------------------------------------------------------- instances


def _cpus(items: list) -> tuple:
    return tuple(sorted(c for _, cc in items for c in cc))


def _instance(topo: Topology, req: Request, i: int, parts: tuple, count: int, notes: list) -> Instance:
    """Instance ``i`` of ``count`` from its (compute, ccl, dataloader, reserved) cores."""
    compute, ccl, loader, reserved = parts
    every = [*compute, *ccl, *loader, *reserved]
    nodes = tuple(sorted({core.node for core, _ in every if core.node is not None}))
    policy, mem_nodes = _memory(topo, req.mem_policy, i, nodes, notes)
    sockets = {core.socket for core, _ in every}
    cpus = _cpus(compute)
    return Instance(
        index=i,
        cpus=cpus,
        cores=tuple(core.id for core, _ in compute),
        nodes=nodes,
        mem_nodes=mem_nodes,
        mem_policy=policy,
        threads=_omp_threads(topo, len(cpus), count),
        reserved_cpus=_cpus(reserved),
        socket=sockets.pop() if len(sockets) == 1 else None,
        ccl_cpus=_cpus(ccl),
        dataloader_cpus=_cpus(loader),
    )


def _memory(topo: Topology, policy: MemPolicy, i: int, nodes: tuple, notes: list) -> tuple:
    """(policy applied, memory nodes) for instance ``i`` whose CPUs are on ``nodes`` (rule 7)."""
    policy = MemPolicy(policy)
    if policy in (MemPolicy.NONE, MemPolicy.LOCAL):
        return policy, ()
    with_memory = [n for n in nodes if topo.nodes[n].has_memory]
    allowed = getattr(topo, "allowed_mems", None)
    source = getattr(topo, "allowed_mems_source", "") or "the cgroup cpuset"
    usable = topo.usable_memory_nodes
    mem_nodes = [n for n in with_memory if n in usable]
    if not mem_nodes:
        if with_memory:
            notes.append(
                f"instance {i}: memory may only be placed on NUMA nodes "
                f"{cpulist.format(allowed) or 'none'} (from {source}), none of them its own "
                f"({cpulist.format(with_memory)}); memory is not bound (kernel default placement)"
            )
        else:
            notes.append(
                f"instance {i}: its NUMA nodes ({cpulist.format(nodes) or 'none'}) have no "
                "memory; memory is not bound (kernel default placement)"
            )
        return MemPolicy.NONE, ()
    if len(mem_nodes) < len(with_memory):
        notes.append(
            f"instance {i}: memory limited to NUMA nodes {cpulist.format(mem_nodes)} of its "
            f"{cpulist.format(with_memory)}: {source} does not allow the others"
        )
    if policy is MemPolicy.PREFERRED and len(mem_nodes) > 1:
        notes.append(
            f"instance {i}: --mem-policy preferred takes one node; preferring node "
            f"{mem_nodes[0]} of {cpulist.format(mem_nodes)}"
        )
        mem_nodes = mem_nodes[:1]
    return policy, tuple(mem_nodes)


def usable_cores(topo: Topology, req: Request) -> int:
    """How many physical cores a plan of ``req`` may use (rules 1 and 2: online, allowed,
    inside ``--core-list``/``--node-list``, E-cores left out unless asked for), whatever
    the placement mode. Pure.

    Raises:
        PlanError: the restrictions leave no usable CPU.
    """
    return len(_select_cores(topo, req, _usable_cpus(topo, req), []))


def quota_limit(topo: Topology) -> Optional[int]:
    """How many single-threaded instances the cgroup CPU quota runs at once:
    ``max(1, floor(quota))`` (a quota of 1.5 CPUs runs 1), None without a quota."""
    quota = topo.quota_cpus
    if quota is None:
        return None
    import math  # only a cgroup quota needs it (issue 40: kept off the common run)

    return max(1, math.floor(quota)) if math.isfinite(quota) else None


def quota_text(topo: Topology) -> str:
    """The quota for messages: ``"a CPU quota of 1 CPU (cgroup /sys/fs/cgroup/cpu/job)"``."""
    q = topo.quota_cpus
    where = f"cgroup {topo.quota_source}" if topo.quota_source else "cgroup cpu.max"
    return f"a CPU quota of {q:g} CPU{'' if q == 1 else 's'} ({where})"


def _quota_note(topo: Topology, req: Request, count: int) -> Optional[str]:
    """A note when ``count`` instances are more than the quota runs at once, else None."""
    limit = quota_limit(topo)
    if limit is None or count <= limit:
        return None
    mode = next(iter(req.modes()), None)
    asked = req.said(mode) if mode else f"{count} instances"
    return (f"{asked}: {count} instances under {quota_text(topo)}, which runs {limit} at a time: "
            f"they take turns on its CPU time; planned as asked (fewer instances fit the quota)")


def _omp_threads(topo: Topology, ncpus: int, count: int) -> int:
    """OpenMP threads of an instance with ``ncpus`` compute CPUs among ``count``
    instances: ``ncpus``, or its even share of the cgroup CPU quota (rule 6)."""
    quota = topo.quota_cpus
    if quota is None:
        return ncpus
    import math

    return max(1, min(ncpus, math.floor(quota / count))) if math.isfinite(quota) else ncpus


# --------------------------------------------------------------------------- the planner


def plan(topo: Topology, req: Request) -> Plan:
    """Plan instances for ``req`` on ``topo`` (pure, deterministic); rules in the module
    docstring.

    Args:
        topo: the machine (see :mod:`cpulaunch.machine.topology` for id conventions).
        req: the request.

    Returns:
        a validated :class:`Plan`.

    Raises:
        PlanError: the request cannot be met (too many instances for the usable cores,
            unknown node, CPUs outside the allowed set, budgets leaving no compute core,
            ...). The message is one line saying what was wrong and how to fix it.
        InternalError: the plan failed its own validation (a bug of ours).
    """
    notes: list = []
    cores = _select_cores(topo, req, _usable_cpus(topo, req), notes)
    groups, idle, labels = [], 0, []
    domains = _domains(topo, req, cores, notes)
    levels = _levels(topo)
    for domain in domains:
        g, left, label = _split(domain, levels)
        groups.extend(g)
        idle += left
        if label and label not in labels:
            labels.append(label)
    for note in (_idle_note(groups, cores, idle), _straddle_note(groups, cores, domains),
                 _follow_note(groups, labels), _share_note(topo, groups)):
        if note:
            notes.append(note)
    parts = _take_budgets(groups, req)
    instances = tuple(_instance(topo, req, i, p, len(parts), notes) for i, p in enumerate(parts))
    if any(inst.threads < len(inst.cpus) for inst in instances):
        notes.append(
            f"a CPU quota of {topo.quota_cpus:g} CPUs applies (cgroup cpu.max): OpenMP "
            "threads lowered to fit it"
        )
    note = _quota_note(topo, req, len(instances))
    if note:
        notes.append(note)
    result = Plan(instances=instances, num_instances=len(instances), notes=tuple(notes))
    validate(result, topo)
    return _select(result, req)


def _select(result: Plan, req: Request) -> Plan:
    """Keep the instances ``--instance-idx`` names (all are still counted)."""
    instance_idx = req.instance_idx
    if instance_idx is None:
        return result
    n = len(result.instances)
    bad = [i for i in instance_idx if not 0 <= i < n]
    if bad:
        raise PlanError(
            f"{req.said('instance_idx')}: only {n} instance(s) "
            f"are planned (indices 0-{n - 1})"
        )
    return result._replace(instances=tuple(result.instances[i] for i in sorted(set(instance_idx))))


def validate(p: Plan, topo: Topology) -> None:
    """Check a plan's invariants; a failure is a bug of ours, not the user's.

    Invariants: every instance has compute CPUs and 1 to len(cpus) threads; its CPU sets
    (compute, oneCCL, DataLoader, reserved) are disjoint from each other and from every
    other instance's, online and inside ``topo.allowed``; each physical core belongs to
    one set of one instance only (whole cores); memory nodes exist, have memory and are
    inside ``topo.allowed_mems`` when that is known. Linear in the CPUs of the plan.

    Raises:
        InternalError: an invariant does not hold (message starts with "internal: ").
    """
    core_of = {c: core.id for core in topo.cores for c in core.cpus}
    allowed_mems = getattr(topo, "allowed_mems", None)
    cpu_owner: dict = {}
    core_owner: dict = {}
    for inst in p.instances:
        if not inst.cpus:
            raise InternalError(f"internal: instance {inst.index} has no compute CPU")
        if not 1 <= inst.threads <= len(inst.cpus):
            raise InternalError(f"internal: instance {inst.index} has {inst.threads} threads")
        for role in ("cpus", "ccl_cpus", "dataloader_cpus", "reserved_cpus"):
            owner = (inst.index, role)
            for c in getattr(inst, role):
                if c in cpu_owner:
                    raise InternalError(f"internal: CPU {c} in {cpu_owner[c]} and {owner}")
                cpu_owner[c] = owner
                if c not in topo.allowed or c not in core_of:
                    raise InternalError(f"internal: CPU {c} of instance {inst.index} is not allowed")
                if core_owner.setdefault(core_of[c], owner) != owner:
                    raise InternalError(f"internal: core of CPU {c} split between {core_owner[core_of[c]]} and {owner}")
        for n in inst.mem_nodes:
            if n not in topo.nodes or not topo.nodes[n].has_memory:
                raise InternalError(f"internal: memory node {n} of instance {inst.index} unusable")
            if allowed_mems is not None and n not in allowed_mems:
                raise InternalError(f"internal: memory node {n} of instance {inst.index} not allowed")


def parse_index_list(text: str) -> tuple[int, ...]:
    """``"0,2-3"`` -> ``(0, 2, 3)`` (``--instance-idx``), via the one cpulist parser."""
    return tuple(sorted(cpulist.parse(text)))
