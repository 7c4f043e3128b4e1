"""The CPU topology as frozen data, and pure builders from raw sysfs / lscpu text.

Identity conventions used everywhere in cpulaunch:

- a *logical CPU* is an id as in ``/sys/devices/system/cpu/cpuN`` (what ``taskset``,
  ``numactl -C`` and ``os.sched_getaffinity`` speak);
- a *core* is a set of SMT siblings (``topology/thread_siblings_list``), identified by its
  lowest logical CPU id. The kernel's ``core_id`` is kept for display only: it is not
  unique inside a package on real machines (AMD Magny-Cours repeats it), so it is never a key;
- a *socket* is a package (``physical_package_id``); where the kernel gives no package id
  (``-1``, e.g. POWER LPARs) CPUs are grouped by NUMA node instead, with a note;
- a *NUMA node* keeps the kernel's id, which may be sparse (0,1,4,5,...) and large (250).

Nothing here reads the host: ``probe.py`` gathers the raw text into :class:`RawHost` and
:func:`build` turns it into a :class:`Topology`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional

from cpulaunch import cpulist
from cpulaunch.errors import CpulaunchError

__all__ = [
    "RawCpu",
    "RawNode",
    "RawHost",
    "Core",
    "Node",
    "Socket",
    "Topology",
    "TopologyError",
    "build",
    "parse_lscpu",
    "EFFICIENCY_RATIO",
]

#: A CPU whose capacity or max frequency is below this fraction of the machine's highest is
#: an efficiency (E) core. Intel i7-1370P: P-cores 5.0-5.2 GHz, E-cores 3.9 GHz (0.75);
#: favoured P-cores differ by ~4% only, so they stay P-cores.
EFFICIENCY_RATIO = 0.85


class TopologyError(CpulaunchError):
    """The host's description is unusable (no CPUs found in sysfs nor lscpu)."""


# --------------------------------------------------------------------------- raw input


@dataclass(frozen=True)
class RawCpu:
    """Text read for one ``/sys/devices/system/cpu/cpuN`` folder (None: file absent)."""

    online: Optional[str] = None  # cpuN/online ("0"/"1"); cpu0 often has none
    has_topology: bool = False  # cpuN/topology/ exists
    package_id: Optional[str] = None
    die_id: Optional[str] = None
    core_id: Optional[str] = None
    thread_siblings_list: Optional[str] = None
    thread_siblings: Optional[str] = None  # hex mask, older kernels
    node_links: tuple[int, ...] = ()  # cpuN/nodeM entries
    cpu_capacity: Optional[str] = None
    max_freq_khz: Optional[str] = None  # cpufreq/cpuinfo_max_freq


@dataclass(frozen=True)
class RawNode:
    """Text read for one ``/sys/devices/system/node/nodeN`` folder."""

    cpulist: Optional[str] = None
    cpumap: Optional[str] = None
    meminfo: Optional[str] = None


@dataclass(frozen=True)
class RawHost:
    """Everything the probe read, as text, before interpretation."""

    cpu_online: Optional[str] = None  # /sys/devices/system/cpu/online
    cpu_present: Optional[str] = None  # /sys/devices/system/cpu/present
    cpus: Mapping[int, RawCpu] = field(default_factory=dict)
    nodes: Mapping[int, RawNode] = field(default_factory=dict)
    node_has_memory: Optional[str] = None  # /sys/devices/system/node/has_memory
    hybrid_core_cpus: Optional[str] = None  # /sys/devices/cpu_core/cpus
    hybrid_atom_cpus: Optional[str] = None  # /sys/devices/cpu_atom/cpus
    cpuinfo: Optional[str] = None  # /proc/cpuinfo
    allowed: Optional[frozenset] = None  # logical CPUs this process may use; None: all online
    allowed_source: str = "all online CPUs"
    cpuset: Optional[frozenset] = None  # cgroup cpuset of the process (None: unknown)
    quota_cpus: Optional[float] = None  # cgroup CPU quota in CPUs (cpu.max), None: no quota
    quota_source: str = ""
    lscpu: Optional[str] = None  # `lscpu -p=CPU,CORE,SOCKET,NODE` output, fallback only
    source: str = "sysfs"


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Core:
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


@dataclass(frozen=True)
class Node:
    """A NUMA node. ``cpus``: its online logical CPUs (empty for memory-only nodes)."""

    id: int
    cpus: frozenset
    has_memory: bool
    mem_total_kb: Optional[int] = None


@dataclass(frozen=True)
class Socket:
    """A socket (package). ``index`` orders sockets by lowest CPU; ``package_id`` is the
    kernel's value (36 and 8442 on Kunpeng 920), None where CPUs were grouped by node."""

    index: int
    package_id: Optional[int]
    cpus: frozenset
    nodes: tuple[int, ...]


@dataclass(frozen=True)
class Topology:
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
    """

    online: frozenset
    offline: frozenset
    allowed: frozenset
    allowed_source: str
    quota_cpus: Optional[float]
    cores: tuple[Core, ...]
    nodes: Mapping[int, Node]
    sockets: tuple[Socket, ...]
    cpuset: Optional[frozenset] = None
    flags: frozenset = frozenset()
    model: str = ""
    hybrid: bool = False
    source: str = "sysfs"
    notes: tuple[str, ...] = ()

    def core_of(self, cpu: int) -> Core:
        """The core holding logical CPU ``cpu``. Raises KeyError if it is not online."""
        for core in self.cores:
            if cpu in core.cpus:
                return core
        raise KeyError(cpu)

    def node_of(self, cpu: int) -> Optional[int]:
        """NUMA node id of logical CPU ``cpu``, or None."""
        for node in self.nodes.values():
            if cpu in node.cpus:
                return node.id
        return None

    @property
    def memory_nodes(self) -> frozenset:
        """Ids of nodes that have memory."""
        return frozenset(n.id for n in self.nodes.values() if n.has_memory)

    def to_dict(self) -> dict:
        """A JSON-ready description (the ``topology`` member of ``--dry-run --format json``)."""
        return {
            "source": self.source,
            "model": self.model,
            "online": cpulist.format(self.online),
            "offline": cpulist.format(self.offline),
            "allowed": cpulist.format(self.allowed),
            "allowed_source": self.allowed_source,
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
        }


# --------------------------------------------------------------------------- helpers


def _int(text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    text = text.replace("\x00", "").strip()
    try:
        return int(text)
    except ValueError:
        return None


def _meminfo_total_kb(text: Optional[str]) -> Optional[int]:
    # "Node 0 MemTotal:       16775084 kB"
    if not text:
        return None
    m = re.search(r"MemTotal:\s+(\d+)\s*kB", text)
    return int(m.group(1)) if m else None


def parse_cpuinfo(text: Optional[str]) -> tuple[frozenset, str]:
    """Feature flags and model name of the first processor in /proc/cpuinfo text.

    x86 calls them ``flags`` / ``model name``; arm64 ``Features`` / ``CPU part``; POWER ``cpu``.
    """
    if not text:
        return frozenset(), ""
    flags: frozenset = frozenset()
    model = ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key in ("flags", "features") and not flags:
            flags = frozenset(value.split())
        elif key in ("model name", "cpu") and not model:
            model = value.strip()
    return flags, model


def _online_cpus(raw: RawHost, notes: list) -> frozenset:
    """Online CPUs: ``cpu/online``, else per-CPU ``online`` files where a missing file
    means online if the CPU has a topology folder (the kernel omits cpu0/online when CPU 0
    cannot be hot-unplugged), else every CPU with a ``topology/`` folder."""
    if raw.cpu_online is not None and raw.cpu_online.replace("\x00", "").strip():
        return cpulist.parse(raw.cpu_online)
    online = set()
    for cpu, rc in raw.cpus.items():
        state = _int(rc.online)
        if state == 1 or (state is None and rc.has_topology):
            online.add(cpu)
    notes.append("no /sys/devices/system/cpu/online: online CPUs taken from per-CPU folders")
    return frozenset(online)


def _classify_efficiency(raw: RawHost, online: frozenset) -> tuple[frozenset, str]:
    """E-cores of a hybrid CPU: ``/sys/devices/cpu_atom/cpus`` (Intel, kernel perf PMUs),
    else ``cpu_capacity`` (arm64 big.LITTLE, Documentation/scheduler/sched-capacity.rst),
    else ``cpufreq/cpuinfo_max_freq``; a CPU below EFFICIENCY_RATIO x the highest value
    is an E-core. Returns (E-core CPUs, how it was decided)."""
    if raw.hybrid_atom_cpus is not None and raw.hybrid_core_cpus is not None:
        return cpulist.parse(raw.hybrid_atom_cpus) & online, "/sys/devices/cpu_atom/cpus"
    for attr, label in (("cpu_capacity", "cpu_capacity"), ("max_freq_khz", "cpuinfo_max_freq")):
        values = {}
        for cpu in online:
            rc = raw.cpus.get(cpu)
            v = _int(getattr(rc, attr)) if rc else None
            if v is not None:
                values[cpu] = v
        if len(values) == len(online) and values:
            top = max(values.values())
            slow = frozenset(c for c, v in values.items() if v < EFFICIENCY_RATIO * top)
            return slow, label
    return frozenset(), ""


# --------------------------------------------------------------------------- builders


def build(raw: RawHost) -> Topology:
    """Interpret raw host text as a :class:`Topology` (pure).

    Rules (kernel Documentation/ABI/stable/sysfs-devices-system-cpu and
    Documentation/ABI/stable/sysfs-devices-node):

    - online CPUs as in :func:`_online_cpus`; node cpulists naming offline CPUs are
      intersected with the online set;
    - cores are SMT sibling sets (``thread_siblings_list``, else ``thread_siblings``,
      else ``(package, die, core_id)``), restricted to online CPUs;
    - NUMA nodes from ``nodeN/cpulist``, else ``nodeN/cpumap``, else ``cpuN/nodeM``
      links; no node folders at all means one node 0 holding every CPU;
    - a node has memory if ``node/has_memory`` lists it, else if its ``meminfo`` shows
      a non-zero MemTotal;
    - sockets from ``physical_package_id``; where that is -1 or missing, from NUMA nodes.

    Raises:
        TopologyError: no online CPU could be found.
    """
    if raw.lscpu is not None and not any(rc.has_topology for rc in raw.cpus.values()):
        return _build_from_lscpu(raw)
    notes: list[str] = []
    online = _online_cpus(raw, notes)
    if not online:
        raise TopologyError("no online CPU found in sysfs (is --sysroot pointing at a root?)")
    # "offline" = present (or with a cpuN folder) but not online; possible-but-absent CPUs
    # (cpu/possible far above present on many servers) are not offline, they do not exist.
    known = set(raw.cpus) | set(online)
    if raw.cpu_present is not None:
        known |= cpulist.parse(raw.cpu_present)
    offline = frozenset(known - online)

    # --- NUMA nodes
    node_cpus: dict[int, frozenset] = {}
    for nid, rn in raw.nodes.items():
        if rn.cpulist is not None:
            cpus = cpulist.parse(rn.cpulist)
        elif rn.cpumap is not None:
            cpus = cpulist.parse_mask(rn.cpumap)
        else:
            cpus = frozenset(c for c, rc in raw.cpus.items() if nid in rc.node_links)
        node_cpus[nid] = cpus & online
    if not raw.nodes:
        node_cpus = {0: online}
        notes.append("no NUMA node folders in sysfs: treating the machine as one node 0")
    has_memory_ids = (
        cpulist.parse(raw.node_has_memory) if raw.node_has_memory is not None else None
    )
    nodes: dict[int, Node] = {}
    for nid, cpus in sorted(node_cpus.items()):
        rn = raw.nodes.get(nid, RawNode())
        total = _meminfo_total_kb(rn.meminfo)
        if has_memory_ids is not None:
            has_mem = nid in has_memory_ids
        elif total is not None:
            has_mem = total > 0
        else:
            has_mem = True  # nothing says otherwise (no node folders)
        nodes[nid] = Node(id=nid, cpus=cpus, has_memory=has_mem, mem_total_kb=total)
    cpu_node: dict[int, int] = {}
    for nid, node in nodes.items():
        for c in node.cpus:
            cpu_node.setdefault(c, nid)
    without_node = online - set(cpu_node)
    if without_node and raw.nodes:
        notes.append(f"CPUs {cpulist.format(without_node)} belong to no NUMA node in sysfs")

    # --- cores (SMT sibling sets)
    sibling_sets: dict[int, frozenset] = {}
    fallback_keys: dict[int, tuple] = {}
    for cpu in sorted(online):
        rc = raw.cpus.get(cpu, RawCpu())
        sibs = None
        if rc.thread_siblings_list is not None and rc.thread_siblings_list.strip("\x00\n "):
            sibs = cpulist.parse(rc.thread_siblings_list)
        elif rc.thread_siblings is not None and rc.thread_siblings.strip("\x00\n "):
            sibs = cpulist.parse_mask(rc.thread_siblings)
        if sibs is None:
            fallback_keys[cpu] = (_int(rc.package_id), _int(rc.die_id), _int(rc.core_id))
        else:
            sibling_sets[cpu] = (sibs | {cpu}) & online
    if fallback_keys:
        groups: dict[tuple, set] = {}
        for cpu, key in fallback_keys.items():
            groups.setdefault(key if key[2] is not None else ("cpu", cpu), set()).add(cpu)
        for members in groups.values():
            for cpu in members:
                sibling_sets[cpu] = frozenset(members)
        notes.append("no thread_siblings_list for some CPUs: cores grouped by core_id")
    core_sets = sorted({s for s in sibling_sets.values()}, key=min)
    # Overlapping sets (inconsistent dumps) would break disjointness: merge them.
    merged: list[set] = []
    for s in core_sets:
        s = set(s)
        for m in [m for m in merged if m & s]:  # every set it touches, not just the first
            s |= m
            merged.remove(m)
        merged.append(s)

    # --- sockets
    pkg_of: dict[int, Optional[int]] = {}
    for cpu in online:
        pid = _int(raw.cpus.get(cpu, RawCpu()).package_id)
        pkg_of[cpu] = pid if pid is not None and pid >= 0 else None
    if any(v is None for v in pkg_of.values()):
        # POWER LPARs report -1: the NUMA node is the best stand-in for a socket.
        socket_key = {cpu: ("node", cpu_node.get(cpu, -1)) for cpu in online}
        notes.append(
            "the kernel gives no physical_package_id (-1): sockets are taken to be NUMA nodes"
        )
    else:
        socket_key = {cpu: ("pkg", pkg_of[cpu]) for cpu in online}
    groups_by_key: dict[tuple, set] = {}
    for cpu, key in socket_key.items():
        groups_by_key.setdefault(key, set()).add(cpu)
    ordered_keys = sorted(groups_by_key, key=lambda k: min(groups_by_key[k]))
    sockets = []
    socket_index_of_cpu: dict[int, int] = {}
    for idx, key in enumerate(ordered_keys):
        cpus = frozenset(groups_by_key[key])
        snodes = tuple(sorted({cpu_node[c] for c in cpus if c in cpu_node}))
        sockets.append(
            Socket(index=idx, package_id=key[1] if key[0] == "pkg" else None, cpus=cpus, nodes=snodes)
        )
        for c in cpus:
            socket_index_of_cpu[c] = idx

    # --- hybrid
    ecpus, how = _classify_efficiency(raw, online)
    hybrid = bool(ecpus) and ecpus != online
    if hybrid:
        notes.append(f"hybrid CPU: E-cores {cpulist.format(ecpus)} (from {how})")

    cores = []
    for s in sorted(merged, key=min):
        first = min(s)
        cores.append(
            Core(
                id=first,
                cpus=tuple(sorted(s)),
                socket=socket_index_of_cpu[first],
                node=cpu_node.get(first),
                core_id=_int(raw.cpus.get(first, RawCpu()).core_id),
                efficiency=hybrid and bool(s & ecpus),
            )
        )

    allowed = online if raw.allowed is None else frozenset(raw.allowed) & online
    flags, model = parse_cpuinfo(raw.cpuinfo)
    return Topology(
        online=online,
        offline=offline,
        allowed=allowed,
        allowed_source=raw.allowed_source,
        quota_cpus=raw.quota_cpus,
        cpuset=None if raw.cpuset is None else frozenset(raw.cpuset) & online,
        cores=tuple(cores),
        nodes=nodes,
        sockets=tuple(sockets),
        flags=flags,
        model=model,
        hybrid=hybrid,
        source=raw.source,
        notes=tuple(notes),
    )


def parse_lscpu(text: str) -> list[tuple[int, Optional[int], Optional[int], Optional[int]]]:
    """Parse ``LC_ALL=C lscpu -p=CPU,CORE,SOCKET,NODE`` output.

    Example line ``"3,1,0,0"`` -> ``(3, 1, 0, 0)``: (logical CPU, core, socket, node);
    empty fields (no NUMA) become None. Comment lines start with ``#``.
    """
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = (line.split(",") + ["", "", "", ""])[:4]
        vals = [int(f) if f.strip().lstrip("-").isdigit() else None for f in fields]
        if vals[0] is None:
            continue
        rows.append((vals[0], vals[1], vals[2], vals[3]))
    return rows


def _build_from_lscpu(raw: RawHost) -> Topology:
    """Topology from lscpu's parseable output, used where sysfs has no topology folders."""
    rows = parse_lscpu(raw.lscpu or "")
    if not rows:
        raise TopologyError("no CPU topology in sysfs and lscpu printed no CPUs")
    cpus = {}
    nodes_raw = {}
    for cpu, core, sock, node in rows:
        cpus[cpu] = RawCpu(
            online="1",
            has_topology=True,
            package_id=str(sock) if sock is not None else None,
            core_id=str(core) if core is not None else None,
        )
        if node is not None:
            nodes_raw.setdefault(node, set()).add(cpu)
    derived = RawHost(
        cpu_online=cpulist.format(cpus),
        cpus=cpus,
        nodes={n: RawNode(cpulist=cpulist.format(c)) for n, c in nodes_raw.items()},
        cpuinfo=raw.cpuinfo,
        allowed=raw.allowed,
        allowed_source=raw.allowed_source,
        cpuset=raw.cpuset,
        quota_cpus=raw.quota_cpus,
        quota_source=raw.quota_source,
        source="lscpu",
    )
    topo = build(derived)
    return replace(topo, notes=topo.notes + ("sysfs has no CPU topology: read from lscpu -p",))
