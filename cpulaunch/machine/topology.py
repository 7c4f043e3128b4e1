"""The CPU topology as frozen data, and the pure builder from what the probe read.

Identity conventions used everywhere in cpulaunch:

- a *logical CPU* is an id as in ``/sys/devices/system/cpu/cpuN`` (what ``taskset``,
  ``numactl -C`` and ``os.sched_getaffinity`` speak);
- a *core* is a set of SMT siblings (``topology/thread_siblings_list``), identified by its
  lowest logical CPU id. The kernel's ``core_id`` is kept for display only: it is not
  unique inside a package on real machines (AMD Magny-Cours repeats it), so it is never a key;
- a *socket* is a package (``physical_package_id``); where the kernel gives no package id
  (``-1``, e.g. POWER LPARs) CPUs are grouped by NUMA node instead, with a note;
- a *NUMA node* keeps the kernel's id, which may be sparse (0,1,4,5,...) and large (250).

Nothing here reads the host or parses text: ``probe.py`` reads and parses every file
into :class:`HostFacts` (where each file's path is known, so its errors name it; the rules
for malformed files are in probe's module docstring) and :func:`build` turns the facts into
a :class:`Topology` by set algebra.
"""

from __future__ import annotations

from types import MappingProxyType

from cpulaunch import cpulist
from cpulaunch.errors import CpulaunchError
from cpulaunch.machine.platform import CpuId, Platform, platform_of
from cpulaunch.records import TYPE_CHECKING, Record

if TYPE_CHECKING:
    from typing import Any, Mapping, Optional

__all__ = [
    "CpuFacts",
    "NodeFacts",
    "CacheFacts",
    "HostFacts",
    "CacheDomain",
    "Caches",
    "Core",
    "Node",
    "Socket",
    "Topology",
    "TopologyError",
    "build",
    "online_from_folders",
    "EFFICIENCY_RATIO",
]

#: A CPU whose capacity or max frequency is below this fraction of the machine's highest is
#: an efficiency (E) core. Intel i7-1370P: P-cores 5.0-5.2 GHz, E-cores 3.9 GHz (0.75);
#: favoured P-cores differ by ~4% only, so they stay P-cores.
EFFICIENCY_RATIO = 0.85

#: How E-cores were told by the kernel's hybrid PMU list, as notes name it.
ATOM_PATH = "/sys/devices/cpu_atom/cpus"


class TopologyError(CpulaunchError):
    """The host's description is unusable: no CPUs found in sysfs nor lscpu, or a file
    the probe read is malformed (the message names the file and what was wrong)."""


# --------------------------------------------------------------------------- facts
#
# The records below are namedtuples (cpulaunch.records.Record), not frozen dataclasses:
# immutable all the same, but a class costs under 0.1 ms to create instead of about 1 ms
# (dataclasses exec the source of six methods per class), which is start-up every launch
# pays (issues 12, 40), and an instance is faster to make (the probe makes one per core).
# Change one with ._replace().
# Topology too: it builds its CPU -> core / node maps at their first use instead of in a
# dataclass __post_init__, which also keeps the dataclasses module off the launch path.

_EMPTY: Mapping = MappingProxyType({})


class CpuFacts(Record):
    """What the probe read for one ``/sys/devices/system/cpu/cpuN`` folder, parsed (None:
    the file is absent, empty or was not read; the probe reads a fact shared by several
    CPUs once, see ``probe.read_facts``). Every CPU set holds logical CPU ids."""

    online: Optional[int] = None  # cpuN/online: 0 or 1; cpu0 often has none
    has_topology: bool = False  # cpuN/topology/ exists
    package_id: Optional[int] = None  # topology/physical_package_id (-1: unknown)
    die_id: Optional[int] = None  # topology/die_id
    core_id: Optional[int] = None  # topology/core_id (display only; not unique)
    #: topology/thread_siblings_list, else the thread_siblings hex mask; None where both are
    #: absent or empty
    siblings: Optional[frozenset[int]] = None
    node_links: tuple[int, ...] = ()  # cpuN/nodeM entries
    capacity: Optional[int] = None  # cpu_capacity (arm64), a plain number
    max_freq_khz: Optional[int] = None  # cpufreq/cpuinfo_max_freq, kHz
    #: topology/package_cpus_list: every CPU of this CPU's package (kernel >= 5.4); they
    #: take this CPU's package_id where they have none of their own.
    package_cpus: Optional[frozenset[int]] = None


class NodeFacts(Record):
    """What the probe read for one ``/sys/devices/system/node/nodeN`` folder, parsed.

    Attributes:
        cpus: logical CPUs of ``nodeN/cpulist`` (else ``nodeN/cpumap``); empty for a
            memory-only node; None where neither file exists (then ``cpuN/nodeM`` links).
        mem_total_kb: ``MemTotal`` of ``nodeN/meminfo`` in KiB, None where unknown.
        meminfo_read: ``nodeN/meminfo`` was read (a note says so when it had no MemTotal).
    """

    cpus: Optional[frozenset[int]] = None
    mem_total_kb: Optional[int] = None
    meminfo_read: bool = False


class CacheFacts(Record):
    """What the probe read of cache sharing (``probe.read_facts(caches=True)``), parsed: one
    entry per list read, ``(logical CPUs sharing it, size in KiB or None)``, in read order
    (ascending lowest CPU). Each list was read for the lowest CPU it names; a level whose
    files were malformed, unusable or present for some CPUs only is empty, with a note.

    Attributes:
        l3: ``cpuN/cache/indexK/shared_cpu_list`` (else ``shared_cpu_map``) of the level-3
            cache, and its ``size``.
        l2: ``cpuN/topology/cluster_cpus_list`` where the first CPU has one (x86: the CPUs
            sharing an L2, kernel ``cpu_clustergroup_mask``; arm64: the firmware's
            clusters), else the level-2 cache's list and size.
        l2_kind: "cluster" or "L2" (which of the two ``l2`` holds), "" when neither exists.
    """

    l3: tuple[tuple[frozenset[int], Optional[int]], ...] = ()
    l2: tuple[tuple[frozenset[int], Optional[int]], ...] = ()
    l2_kind: str = ""


class HostFacts(Record):
    """Everything the probe read, parsed where it was read (``probe.read_facts``): the one
    input of :func:`build`. CPU sets hold logical CPU ids, node sets NUMA node ids."""

    online: Optional[frozenset[int]] = None  # cpu/online; None: absent or empty
    present: Optional[frozenset[int]] = None  # cpu/present
    cpus: Mapping[int, CpuFacts] = _EMPTY
    nodes: Mapping[int, NodeFacts] = _EMPTY
    has_memory: Optional[frozenset[int]] = None  # node/has_memory
    #: /sys/devices/cpu_atom/cpus where /sys/devices/cpu_core/cpus exists too (Intel's
    #: hybrid PMUs name the E-cores); None otherwise
    hybrid_atom: Optional[frozenset[int]] = None
    flags: frozenset[str] = frozenset()  # CPU feature flags of /proc/cpuinfo's first processor
    model: str = ""  # its model name
    #: its identifiers (vendor, family and model; arm64 implementer and part), None: not read
    cpu: Optional[CpuId] = None
    allowed: Optional[frozenset[int]] = None  # logical CPUs this process may use; None: all online
    allowed_source: str = "all online CPUs"
    cpuset: Optional[frozenset[int]] = None  # cgroup cpuset of the process (None: unknown)
    quota_cpus: Optional[float] = None  # cgroup CPU quota in CPUs (cpu.max), None: no quota
    quota_source: str = ""
    #: ``lscpu -p=CPU,CORE,SOCKET,NODE`` rows (:func:`parse_lscpu`), the fallback only
    lscpu: Optional[tuple[tuple[int, Optional[int], Optional[int], Optional[int]], ...]] = None
    source: str = "sysfs"
    cpu_limit: int = cpulist.MAX_IDS  # exclusive bound on CPU ids (:func:`cpu_limit`)
    #: NUMA node ids this process may allocate on (cgroup cpuset.mems, Mems_allowed_list);
    #: None: unknown (all).
    allowed_mems: Optional[frozenset[int]] = None
    allowed_mems_source: str = ""
    root: str = "/"  # the root the files were read below (for messages)
    notes: tuple[str, ...] = ()  # the probe's own notes (files skipped, unreadable)
    #: cache sharing, None where it was not read (the plan did not need it)
    caches: Optional[CacheFacts] = None


# --------------------------------------------------------------------------- the model


class Core(Record):
    """One physical core: a set of SMT siblings.

    Attributes:
        id: the lowest logical CPU id among its online siblings (our core key).
        cpus: online logical CPU ids of its SMT siblings, ascending.
        socket: index of its socket in ``Topology.sockets``.
        node: NUMA node id of its first CPU, or None when the kernel names none.
        core_id: the kernel's ``core_id`` (display only; not unique).
        efficiency: True for an E-core of a hybrid CPU.
    """

    id: int
    cpus: tuple[int, ...]
    socket: int
    node: Optional[int]
    core_id: Optional[int] = None
    efficiency: bool = False


class CacheDomain(Record):
    """The logical CPUs that share one cache (or one cluster).

    Attributes:
        kind: "L3", "L2" or "cluster" (``topology/cluster_cpus_list``: on x86 the CPUs
            sharing an L2, on arm64 the firmware's clusters).
        cpus: its online logical CPUs.
        size_kb: the cache's size in KiB (``size``), None for a cluster or where unknown.
    """

    kind: str
    cpus: frozenset[int]
    size_kb: Optional[int] = None

    @property
    def id(self) -> int:
        """Its lowest logical CPU (how messages and the JSON name a domain)."""
        return min(self.cpus)


class Caches(Record):
    """Cache domains of the online CPUs, each tuple ordered by lowest CPU; a tuple is empty
    where the machine shows no such level (or its files were unusable: see the notes).

    Attributes:
        l3: the L3 domains (an AMD CCX/CCD, an Intel socket or sub-NUMA cluster).
        l2: the L2 or cluster domains (``kind`` says which): Intel E-core modules,
            Kunpeng or Grace clusters; one per core where the L2 is private.
    """

    l3: tuple[CacheDomain, ...] = ()
    l2: tuple[CacheDomain, ...] = ()


class Node(Record):
    """A NUMA node. ``cpus``: its online logical CPUs (empty for memory-only nodes)."""

    id: int
    cpus: frozenset[int]
    has_memory: bool
    mem_total_kb: Optional[int] = None


class Socket(Record):
    """A socket (package). ``index`` orders sockets by lowest CPU; ``package_id`` is the
    kernel's value (36 and 8442 on Kunpeng 920), None where CPUs were grouped by node."""

    index: int
    package_id: Optional[int]
    cpus: frozenset[int]
    nodes: tuple[int, ...]


class _TopologyFields(Record):
    """The fields of :class:`Topology` (documented there)."""

    online: frozenset[int]
    offline: frozenset[int]
    allowed: frozenset[int]
    allowed_source: str
    quota_cpus: Optional[float]
    cores: tuple[Core, ...]
    nodes: Mapping[int, Node]
    sockets: tuple[Socket, ...]
    cpuset: Optional[frozenset[int]] = None
    flags: frozenset[str] = frozenset()
    model: str = ""
    hybrid: bool = False
    source: str = "sysfs"
    notes: tuple[str, ...] = ()
    allowed_mems: Optional[frozenset[int]] = None
    allowed_mems_source: str = ""
    cpu_limit: int = cpulist.MAX_IDS
    caches: Optional[Caches] = None
    quota_source: str = ""
    cpu: Optional[CpuId] = None


class Topology(_TopologyFields):
    """The machine as cpulaunch sees it. All CPU sets hold logical CPU ids.

    Attributes:
        online: online logical CPUs.
        offline: CPUs the kernel knows (present/possible dirs) that are not online.
        allowed: online CPUs this process may use (affinity mask / cgroup cpuset).
        allowed_source: where ``allowed`` came from, for messages.
        quota_cpus: CPU bandwidth quota in CPUs (cgroup ``cpu.max``), None if unlimited.
        cores: physical cores, ordered by id.
        nodes: NUMA nodes by id (memory-only nodes included).
        sockets: sockets ordered by index.
        cpuset: the cgroup cpuset's online CPUs, None if unknown. ``allowed`` narrower
            than ``cpuset`` means something (taskset, Slurm's task/affinity) bound us.
        flags: CPU feature flags from /proc/cpuinfo (e.g. "avx512_bf16", "amx_tile").
        model: CPU model name.
        hybrid: True when E-cores were detected.
        notes: facts a user should know (fallbacks taken, oddities found).
        allowed_mems: NUMA node ids this process may allocate memory on, as the cgroup's
            ``cpuset.mems.effective`` (v2) / ``cpuset.effective_mems`` / ``cpuset.mems``
            (v1) or ``Mems_allowed_list`` name them (not intersected with ``nodes``);
            None: unknown, i.e. every node.
        allowed_mems_source: where ``allowed_mems`` came from, for messages.
        cpu_limit: exclusive bound on this machine's logical CPU ids (``kernel_max`` + 1,
            see :func:`cpu_limit`); bound user CPU lists with
            ``cpulist.parse(text, limit=topo.cpu_limit)``.
        caches: the L3 and L2/cluster domains (:class:`Caches`); None where they were
            not read (the probe reads them only for a plan that divides a socket or node,
            and for ``--show-topology``: docs/guide/placement.md).
        quota_source: the cgroup folder whose quota ``quota_cpus`` is (below the root),
            for messages; "" when there is none or it is unknown.
        cpu: the first processor's identifiers (:class:`cpulaunch.machine.platform.CpuId`),
            None where the probe read none; :attr:`platform` names them.

    A record like the others (a namedtuple: immutable; change one with ``._replace()``;
    equal when the fields are). ``core_of`` and ``node_of`` are O(1): each builds its map
    at its first call and keeps it on the instance (not compared, not shown).
    """

    def core_of(self, cpu: int) -> Core:
        """The core holding logical CPU ``cpu``. Raises KeyError if it is not online."""
        index = self.__dict__.get("core_by_cpu")
        if index is None:
            index = self.__dict__["core_by_cpu"] = {c: core for core in self.cores for c in core.cpus}
        return index[cpu]

    def node_of(self, cpu: int) -> Optional[int]:
        """NUMA node id of logical CPU ``cpu`` (the lowest, should two name it), or None."""
        index = self.__dict__.get("node_by_cpu")
        if index is None:
            index = {}
            for nid in sorted(self.nodes):
                for c in self.nodes[nid].cpus:
                    index.setdefault(c, nid)
            self.__dict__["node_by_cpu"] = index
        return index.get(cpu)

    def cache_of(self, cpu: int, level: str) -> Optional[int]:
        """Index in ``caches.l3`` (``level`` "l3") or ``caches.l2`` ("l2") of the domain
        holding logical CPU ``cpu``; None where caches were not read or none holds it."""
        key = "cache_by_cpu_" + level
        index = self.__dict__.get(key)
        if index is None:
            domains = getattr(self.caches, level, ()) if self.caches is not None else ()
            index = self.__dict__[key] = {c: i for i, d in enumerate(domains) for c in d.cpus}
        return index.get(cpu)

    @property
    def platform(self) -> Platform:
        """The CPU's vendor and family (:func:`cpulaunch.machine.platform.platform_of`)."""
        return platform_of(self.cpu)

    @property
    def memory_nodes(self) -> frozenset[int]:
        """Ids of nodes that have memory."""
        return frozenset(n.id for n in self.nodes.values() if n.has_memory)

    @property
    def usable_memory_nodes(self) -> frozenset[int]:
        """Ids of the nodes this process may allocate memory on: those with memory, less
        the ones its cgroup's cpuset.mems leaves out (cpuset(7): allocations stay inside
        cpuset.mems whatever the memory policy); all with memory when that is unknown."""
        nodes = self.memory_nodes
        return nodes if self.allowed_mems is None else nodes & self.allowed_mems

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (the ``topology`` member of ``--dry-run --format json``)."""
        return {
            "source": self.source,
            "model": self.model,
            "platform": self.platform.to_dict(),
            "online": cpulist.format(self.online),
            "offline": cpulist.format(self.offline),
            "allowed": cpulist.format(self.allowed),
            "allowed_source": self.allowed_source,
            "allowed_mems": (None if self.allowed_mems is None
                             else cpulist.format(self.allowed_mems)),
            "allowed_mems_source": self.allowed_mems_source,
            "quota_cpus": self.quota_cpus,
            "hybrid": self.hybrid,
            "sockets": [
                {
                    "index": s.index,
                    "package_id": s.package_id,
                    "cpus": cpulist.format(s.cpus),
                    "nodes": list(s.nodes),
                }
                for s in self.sockets
            ],
            "nodes": [
                {
                    "id": n.id,
                    "cpus": cpulist.format(n.cpus),
                    "has_memory": n.has_memory,
                    "mem_total_kb": n.mem_total_kb,
                }
                for n in sorted(self.nodes.values(), key=lambda n: n.id)
            ],
            "cores": [
                {
                    "id": c.id,
                    "cpus": list(c.cpus),
                    "socket": c.socket,
                    "node": c.node,
                    "efficiency": c.efficiency,
                }
                for c in self.cores
            ],
            "caches": self._caches_dict(),
        }

    def _caches_dict(self) -> Optional[dict]:
        """The ``caches`` member: None where caches were not read; L2/cluster domains only
        where one groups several cores (a private L2 per core is the rest)."""
        if self.caches is None:
            return None
        shared = [d for d in self.caches.l2 if len({self.core_of(c).id for c in d.cpus}) > 1]
        return {
            "l3": [{"cpus": cpulist.format(d.cpus), "size_kb": d.size_kb} for d in self.caches.l3],
            "l2": [{"kind": d.kind, "cpus": cpulist.format(d.cpus), "size_kb": d.size_kb} for d in shared],
        }


# --------------------------------------------------------------------------- build steps


def online_from_folders(facts: HostFacts) -> frozenset[int]:
    """Online CPUs from per-CPU folders, where ``cpu/online`` is missing or empty: a CPU
    whose ``cpuN/online`` says 1, or that has none but a ``topology/`` folder (the kernel
    omits cpu0/online when CPU 0 cannot be hot-unplugged)."""
    return frozenset(cpu for cpu, cf in facts.cpus.items()
                     if cf.online == 1 or (cf.online is None and cf.has_topology))


def _online_cpus(facts: HostFacts, notes: list) -> frozenset:
    """Online CPUs: ``cpu/online``, else :func:`online_from_folders`."""
    if facts.online:
        return facts.online
    notes.append("no /sys/devices/system/cpu/online: online CPUs taken from per-CPU folders")
    return online_from_folders(facts)


def _node_cpus(facts: HostFacts, online: frozenset, notes: list) -> dict[int, frozenset]:
    """{node id: its online CPUs}: ``nodeN/cpulist`` (or cpumap), else ``cpuN/nodeM`` links;
    no node folders at all: one node 0 holding every online CPU."""
    if not facts.nodes:
        notes.append("no NUMA node folders in sysfs: treating the machine as one node 0")
        return {0: online}
    links: Optional[dict[int, set[int]]] = None
    node_cpus: dict[int, frozenset] = {}
    for nid, nf in facts.nodes.items():
        cpus = nf.cpus
        if cpus is None:
            if links is None:  # cpuN/nodeM links, gathered once for every such node
                links = {}
                for c, cf in facts.cpus.items():
                    for n in cf.node_links:
                        links.setdefault(n, set()).add(c)
            cpus = frozenset(links.get(nid, ()))
        node_cpus[nid] = cpus & online
    return node_cpus


def _build_nodes(facts: HostFacts, online: frozenset,
                 notes: list) -> tuple[dict[int, "Node"], dict[int, int]]:
    """NUMA nodes ({id: Node}) and the node of each online CPU ({cpu: lowest node id}).
    A node has memory if ``node/has_memory`` lists it, else if its meminfo shows a non-zero
    MemTotal, else (nothing says otherwise) it has."""
    nodes: dict[int, Node] = {}
    for nid, cpus in sorted(_node_cpus(facts, online, notes).items()):
        total = facts.nodes[nid].mem_total_kb if nid in facts.nodes else None
        if facts.has_memory is not None:
            has_mem = nid in facts.has_memory
        else:
            has_mem = total > 0 if total is not None else True
        nodes[nid] = Node(id=nid, cpus=cpus, has_memory=has_mem, mem_total_kb=total)
    cpu_node: dict[int, int] = {}
    for nid, node in nodes.items():  # ascending ids: the lowest node wins a shared CPU
        for c in node.cpus:
            cpu_node.setdefault(c, nid)
    if facts.nodes and len(cpu_node) < len(online):
        without_node = online - set(cpu_node)
        notes.append(f"CPUs {cpulist.format(without_node)} belong to no NUMA node in sysfs")
    return nodes, cpu_node


def _merge(sets: list[frozenset], online: frozenset) -> list[list[int]]:
    """Union-find over CPUs: sets that share a CPU become one (linear in their sizes)."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        root = parent.setdefault(x, x)
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    for members in sets:
        it = iter(members)
        first = find(next(it))
        for m in it:
            r = find(m)
            if r != first:
                if r < first:
                    first, r = r, first
                parent[r] = first
    by_root: dict[int, list[int]] = {}
    for c in sorted(parent):
        by_root.setdefault(find(c), []).append(c)
    return list(by_root.values())


def _sibling_sets(facts: HostFacts, online: frozenset) -> tuple[list[frozenset], dict[int, int], bool]:
    """The distinct SMT sibling sets that online CPUs name (each restricted to online CPUs
    plus the CPU itself), the index of the set owning each CPU, and whether two overlap."""
    sets: list[frozenset] = []
    owner: dict[int, int] = {}  # cpu -> index in sets
    overlap = False
    online_part: dict[int, frozenset] = {}  # id(sibling set) -> its online CPUs (shared)
    for cpu, cf in facts.cpus.items():
        sibs = cf.siblings
        if not sibs or cpu not in online:
            continue  # absent or empty lists: as if absent
        # One set object named by several CPUs: its online part is computed once, and the
        # set named again is recognised at once (no O(size) compare).
        part = online_part.get(id(sibs))
        if part is None:
            part = online_part[id(sibs)] = sibs if sibs <= online else sibs & online
        members = part if cpu in part else part | {cpu}
        i = owner.get(cpu)
        if i is not None and (sets[i] is members or sets[i] == members):
            continue  # the same set named by another of its CPUs: once is enough
        idx = len(sets)
        sets.append(members)
        for m in members:
            if m in owner:
                overlap = True
            owner[m] = idx
    return sets, owner, overlap


def _core_sets(facts: HostFacts, online: frozenset, notes: list) -> list[list[int]]:
    """SMT sibling sets among online CPUs, merged where they overlap (inconsistent dumps),
    as sorted member lists ordered by their lowest CPU. Linear: each distinct set is taken
    once, and overlapping sets are merged by union-find.

    A CPU's set is its sibling list (or mask) plus itself. An online CPU that no list
    names is grouped with the CPUs sharing its ``(physical_package_id, die_id, core_id)``,
    or alone where it has no ``core_id``.
    """
    sets, owner, overlap = _sibling_sets(facts, online)
    lone = sorted(c for c in online if c not in owner) if len(owner) < len(online) else []
    singles: list[list[int]] = []
    if lone:
        groups: dict[tuple, list[int]] = {}
        for cpu in lone:
            cf = facts.cpus.get(cpu)
            if cf is None or cf.core_id is None:
                singles.append([cpu])  # nothing to group it by: a core of its own
            else:
                groups.setdefault((cf.package_id, cf.die_id, cf.core_id), []).append(cpu)
        sets.extend(frozenset(g) for g in groups.values())
        notes.append("no thread_siblings_list for some CPUs: cores grouped by core_id")
    merged = _merge(sets, online) if overlap else [sorted(s) for s in sets]
    merged.extend(singles)
    merged.sort(key=lambda m: m[0])
    return merged


def _packages(facts: HostFacts, online: frozenset) -> tuple[dict[int, int], bool]:
    """{online CPU: package id} from each CPU's ``physical_package_id``, else that of a CPU
    whose ``package_cpus_list`` names it; and whether some CPU says -1 (unknown)."""
    pkg_of: dict[int, int] = {}
    leaders = []
    unknown = False
    for cpu, cf in facts.cpus.items():
        if cf.package_id is None or cpu not in online:
            continue
        if cf.package_id < 0:
            unknown = True
            continue
        pkg_of[cpu] = cf.package_id
        if cf.package_cpus is not None:
            leaders.append(cpu)
    for cpu in sorted(leaders):
        pid = pkg_of[cpu]
        for m in facts.cpus[cpu].package_cpus:
            if m in online and m not in pkg_of:
                pkg_of[m] = pid
    return pkg_of, unknown


def _build_sockets(facts: HostFacts, ordered: list[int], cpu_node: dict[int, int],
                   notes: list) -> tuple[list["Socket"], dict[int, int]]:
    """Sockets ordered by lowest CPU, and the socket index of each online CPU (``ordered``:
    the online CPUs, ascending). Where any online CPU has no package id (or -1), sockets
    are the NUMA nodes instead (with a note)."""
    pkg_of, unknown = _packages(facts, frozenset(ordered))
    groups_by_key: dict[tuple, list[int]] = {}
    if unknown or len(pkg_of) < len(ordered):
        # POWER LPARs report -1: the NUMA node is the best stand-in for a socket.
        notes.append("the kernel gives no physical_package_id (-1): sockets are taken to be NUMA nodes")
        for cpu in ordered:
            groups_by_key.setdefault(("node", cpu_node.get(cpu, -1)), []).append(cpu)
    else:
        for cpu in ordered:
            groups_by_key.setdefault(("pkg", pkg_of[cpu]), []).append(cpu)
    sockets = []
    socket_index_of_cpu: dict[int, int] = {}
    for idx, (key, members) in enumerate(sorted(groups_by_key.items(), key=lambda kv: kv[1][0])):
        snodes = tuple(sorted({cpu_node[c] for c in members if c in cpu_node}))
        sockets.append(Socket(index=idx, package_id=key[1] if key[0] == "pkg" else None,
                              cpus=frozenset(members), nodes=snodes))
        socket_index_of_cpu.update(dict.fromkeys(members, idx))
    return sockets, socket_index_of_cpu


def _classify_efficiency(facts: HostFacts, online: frozenset,
                         core_sets: list[list[int]]) -> tuple[frozenset, str]:
    """E-cores of a hybrid CPU: ``/sys/devices/cpu_atom/cpus`` (Intel, kernel perf PMUs),
    else ``cpu_capacity`` (arm64 big.LITTLE, Documentation/scheduler/sched-capacity.rst),
    else ``cpufreq/cpuinfo_max_freq``. A core's value is the lowest its CPUs report (SMT
    siblings share one, so the probe reads it for one CPU per core); a core below
    EFFICIENCY_RATIO x the highest core is an E-core. Every core needs a value, else the
    attribute is not used. Returns (E-core CPUs, how it was decided)."""
    if facts.hybrid_atom is not None:
        return facts.hybrid_atom & online, ATOM_PATH
    for attr, label in (("capacity", "cpu_capacity"), ("max_freq_khz", "cpuinfo_max_freq")):
        per_core: list[tuple[list[int], int]] = []
        for members in core_sets:
            values = [getattr(facts.cpus[c], attr) for c in members if c in facts.cpus]
            values = [v for v in values if v is not None]
            if not values:
                break
            per_core.append((members, min(values)))
        else:
            if per_core:
                top = max(v for _, v in per_core)
                slow = frozenset(c for m, v in per_core if v < EFFICIENCY_RATIO * top for c in m)
                return slow, label
    return frozenset(), ""


def _cores(facts: HostFacts, core_sets: list[list[int]], socket_index_of_cpu: dict[int, int],
           cpu_node: dict[int, int], ecpus: frozenset) -> tuple["Core", ...]:
    """The :class:`Core` records, one per sibling set; a core's ``core_id`` is the first of
    its CPUs' that was read (the probe reads one per core)."""
    cores = []
    for members in core_sets:
        first = members[0]
        core_id = next((facts.cpus[c].core_id for c in members
                        if c in facts.cpus and facts.cpus[c].core_id is not None), None)
        cores.append(Core(id=first, cpus=tuple(members), socket=socket_index_of_cpu[first],
                          node=cpu_node.get(first), core_id=core_id,
                          efficiency=bool(ecpus) and any(c in ecpus for c in members)))
    return tuple(cores)


def _cache_level(found: tuple, kind: str, online: frozenset, notes: list) -> tuple:
    """:class:`CacheDomain` records of one level from the probe's ``(cpus, size)`` lists:
    restricted to online CPUs; () with a note where they do not cover every online CPU
    (a domain for part of the machine would mislead the planner)."""
    domains = []
    covered: set = set()
    for cpus, size in found:
        mine = cpus & online
        if mine:
            domains.append(CacheDomain(kind=kind, cpus=mine, size_kb=size))
            covered.update(mine)
    if domains and len(covered) < len(online):
        notes.append(f"{kind} domains found for CPUs {cpulist.format(covered)} only (not "
                     f"{cpulist.format(online - covered)}): {kind} domains not used")
        return ()
    domains.sort(key=lambda d: d.id)
    return tuple(domains)


def _caches(facts: HostFacts, online: frozenset, notes: list) -> Optional[Caches]:
    """The :class:`Caches` of the online CPUs, None where the probe did not read them."""
    found = facts.caches
    if found is None:
        return None
    return Caches(l3=_cache_level(found.l3, "L3", online, notes),
                  l2=_cache_level(found.l2, found.l2_kind or "L2", online, notes))


def build(facts: HostFacts) -> Topology:
    """Interpret what the probe read as a :class:`Topology` (pure set algebra; linear in the
    CPUs; every file was parsed, and every malformed one refused, where it was read).

    Rules (kernel Documentation/ABI/stable/sysfs-devices-system-cpu and
    Documentation/ABI/stable/sysfs-devices-node):

    - online CPUs: ``cpu/online``, else :func:`online_from_folders`; node cpulists naming
      offline CPUs are intersected with the online set;
    - cores are SMT sibling sets (``thread_siblings_list``, else ``thread_siblings``,
      else ``(package, die, core_id)``), restricted to online CPUs (:func:`_core_sets`);
    - NUMA nodes from ``nodeN/cpulist``, else ``nodeN/cpumap``, else ``cpuN/nodeM``
      links; no node folders at all means one node 0 holding every CPU;
    - a node has memory if ``node/has_memory`` lists it, else if its ``meminfo`` shows
      a non-zero MemTotal;
    - sockets from ``physical_package_id`` (shared through ``package_cpus_list``); where
      that is -1 or missing, from NUMA nodes;
    - cache domains (where read) from the CPUs sharing each L3 and each L2 or cluster
      (Documentation/ABI/testing/sysfs-devices-system-cpu, "cache/index*";
      Documentation/admin-guide/cputopology.rst, "cluster_cpus"), restricted to online
      CPUs; a level that does not cover every online CPU is dropped with a note.

    Raises:
        TopologyError: no online CPU could be found.
    """
    if facts.lscpu is not None and not any(cf.has_topology for cf in facts.cpus.values()):
        return _build_from_lscpu(facts)
    notes: list[str] = list(facts.notes)
    online = _online_cpus(facts, notes)
    if not online:
        raise TopologyError("no online CPU found in sysfs (is --sysroot pointing at a root?)")
    # "offline" = present (or with a cpuN folder) but not online; possible-but-absent CPUs
    # (cpu/possible far above present on many servers) are not offline, they do not exist.
    offline = frozenset((set(facts.cpus) | online | (facts.present or frozenset())) - online)
    nodes, cpu_node = _build_nodes(facts, online, notes)
    core_sets = _core_sets(facts, online, notes)
    sockets, socket_index_of_cpu = _build_sockets(facts, sorted(online), cpu_node, notes)
    ecpus, how = _classify_efficiency(facts, online, core_sets)
    hybrid = bool(ecpus) and ecpus != online
    if hybrid:
        notes.append(f"hybrid CPU: E-cores {cpulist.format(ecpus)} (from {how})")
    allowed = online if facts.allowed is None else frozenset(facts.allowed) & online
    caches = _caches(facts, online, notes)
    return Topology(
        online=online, offline=offline, allowed=allowed, allowed_source=facts.allowed_source,
        quota_cpus=facts.quota_cpus,
        cpuset=None if facts.cpuset is None else frozenset(facts.cpuset) & online,
        cores=_cores(facts, core_sets, socket_index_of_cpu, cpu_node, ecpus if hybrid else frozenset()),
        nodes=nodes, sockets=tuple(sockets), flags=facts.flags, model=facts.model, hybrid=hybrid,
        source=facts.source, notes=tuple(notes), allowed_mems=facts.allowed_mems,
        allowed_mems_source=facts.allowed_mems_source, cpu_limit=facts.cpu_limit,
        caches=caches, quota_source=facts.quota_source if facts.quota_cpus is not None else "", cpu=facts.cpu,
    )


def _build_from_lscpu(facts: HostFacts) -> Topology:
    """Topology from lscpu's parseable output (``facts.lscpu``: (logical CPU, core, socket,
    node) rows), used where sysfs has no topology folders."""
    if not facts.lscpu:
        raise TopologyError("no CPU topology in sysfs and lscpu printed no CPUs")
    cpus: dict[int, CpuFacts] = {}
    nodes: dict[int, set[int]] = {}
    for cpu, core, sock, node in facts.lscpu:
        if cpu >= facts.cpu_limit or node is not None and not 0 <= node < cpulist.MAX_NODE_IDS:
            raise TopologyError(f"lscpu -p names CPU {cpu} on node {node}: ids must be below "
                                f"{facts.cpu_limit} (CPUs) and {cpulist.MAX_NODE_IDS} (nodes)")
        cpus[cpu] = CpuFacts(online=1, has_topology=True, package_id=sock, core_id=core)
        if node is not None:
            nodes.setdefault(node, set()).add(cpu)
    derived = facts._replace(
        online=frozenset(cpus), present=None, cpus=cpus,
        nodes={n: NodeFacts(cpus=frozenset(c)) for n, c in nodes.items()},
        has_memory=None, hybrid_atom=None, lscpu=None, source="lscpu")
    topo = build(derived)
    return topo._replace(notes=topo.notes + ("sysfs has no CPU topology: read from lscpu -p",))
