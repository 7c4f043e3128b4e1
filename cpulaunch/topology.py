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

Corrupt input (what each file may hold, and what happens otherwise). Every malformed
file gives a :class:`TopologyError` whose one-line message names the file as read under
the root (``/sys/devices/system/cpu/online: bad item '' in cpulist '1,,2'; ...``):

- fatal when malformed: every CPU or node list (``cpu/online``, ``cpu/present``,
  ``nodeN/cpulist``, ``nodeN/cpumap``, ``node/has_memory``, ``thread_siblings_list``,
  ``thread_siblings``, ``package_cpus_list``, ``cpu_atom/cpus``, the cgroup's cpuset
  files, ``Cpus_allowed_list``/``Mems_allowed_list``), the numeric ids
  (``physical_package_id``, ``die_id``, ``core_id``, ``cpuN/online``), ``cpu.max`` and
  the cfs quota files, any id at or above the bound (CPU ids below :attr:`Topology.cpu_limit`,
  node ids below ``cpulist.MAX_NODE_IDS``), and a non-regular file (FIFO, device,
  folder) or a file over 1 MiB where one of those is read;
- tolerated as the kernel writes them: a trailing newline and NUL bytes; an empty
  ``cpu/online`` (online CPUs then come from per-CPU folders), an empty node cpulist
  (a memory-only node), an empty sibling list (cores then grouped by ``core_id``), an
  empty numeric id file (as if absent);
- ignored with a note (they refine, they do not decide): ``cpu/kernel_max`` and
  ``cpu/possible`` that do not parse (the bound falls back to ``cpulist.MAX_IDS``),
  ``nodeN/meminfo`` without a ``MemTotal`` line, ``cpu_capacity`` and
  ``cpuinfo_max_freq`` that are not numbers (no E-core detection from them),
  ``proc/cpuinfo`` (free text; only its first 64 KiB are read), and these files or
  ``proc/self/{status,cgroup,mounts}`` when unreadable (permission denied, not a regular
  file, over the size bound): then they count as absent;
- ignored silently: lines of ``proc/self/cgroup`` / ``proc/mounts`` that are not in the
  kernel's format, and a cgroup path with a ``..`` component (never followed out of the
  root).
"""

import re
from types import MappingProxyType
from typing import Mapping, NamedTuple, Optional

from cpulaunch import cpulist
from cpulaunch.cpulist import CpulistError, excerpt
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
    "cpu_limit",
    "corrupt",
    "parse_cpuinfo",
    "parse_lscpu",
    "EFFICIENCY_RATIO",
    "CPU_PATH",
    "NODE_PATH",
]

#: A CPU whose capacity or max frequency is below this fraction of the machine's highest is
#: an efficiency (E) core. Intel i7-1370P: P-cores 5.0-5.2 GHz, E-cores 3.9 GHz (0.75);
#: favoured P-cores differ by ~4% only, so they stay P-cores.
EFFICIENCY_RATIO = 0.85

#: Where the files live, as shown in messages (below the root).
CPU_PATH = "/sys/devices/system/cpu"
NODE_PATH = "/sys/devices/system/node"
ATOM_PATH = "/sys/devices/cpu_atom/cpus"

_INT = re.compile(r"-?[0-9]{1,10}")


class TopologyError(CpulaunchError):
    """The host's description is unusable: no CPUs found in sysfs nor lscpu, or a file
    the probe read is malformed (the message names the file and what was wrong)."""


def printable(text: str) -> str:
    """``text`` unchanged if printable, else with control/non-UTF-8 characters escaped
    (``'/x/\\udcff\\n'`` -> ``'/x/\\\\udcff\\\\n'``): messages stay one safe line."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def corrupt(root: str, path: str, what: str) -> TopologyError:
    """The error for a malformed file: ``"<path>: <what>; <which tree is corrupt>"``.

    Args:
        root: the root the probe read below ("/" for this host, else the --sysroot folder).
        path: the file as read below the root, e.g. "/sys/devices/system/cpu/online".
        what: what was wrong, one line (quote file contents with ``cpulist.excerpt``).
    """
    if root in ("/", ""):
        where = "this host's /sys or /proc is corrupt"
    else:
        where = f"the tree under --sysroot {printable(root)} is corrupt or not a Linux dump"
    return TopologyError(f"{printable(path)}: {what}; {where}")


def cpu_limit(kernel_max: Optional[str], possible: Optional[str],
              notes: Optional[list] = None) -> int:
    """Exclusive bound on logical CPU ids: ``cpu/kernel_max`` + 1 (the kernel's NR_CPUS),
    else the highest id of ``cpu/possible`` + 1, else ``cpulist.MAX_IDS``; never above
    ``cpulist.MAX_IDS``. ``("8191\\n", None)`` -> 8192; ``(None, "0-111")`` -> 112.

    A file that does not parse is skipped with a note appended to ``notes`` (Documentation/
    ABI/testing/sysfs-devices-system-cpu: kernel_max is "the maximum CPU index allowed by
    the kernel configuration", possible the CPUs that could ever be brought online).
    """
    notes = notes if notes is not None else []
    if kernel_max is not None and _clean(kernel_max):
        text = _clean(kernel_max)
        if _INT.fullmatch(text) and int(text) >= 0:
            if int(text) < cpulist.MAX_IDS:
                return int(text) + 1
            notes.append(f"{CPU_PATH}/kernel_max says {text}: CPU ids bounded at "
                         f"{cpulist.MAX_IDS} instead")
            return cpulist.MAX_IDS
        notes.append(f"{CPU_PATH}/kernel_max is not a CPU index ({excerpt(text)}): ignored")
    if possible is not None and _clean(possible):
        try:
            ids = cpulist.parse(possible, cpulist.MAX_IDS)
        except CpulistError as exc:
            notes.append(f"{CPU_PATH}/possible ignored: {exc}")
        else:
            if ids:
                return max(ids) + 1
    return cpulist.MAX_IDS


def _clean(text: str) -> str:
    return text.replace("\x00", "").strip(" \t\n")


# --------------------------------------------------------------------------- raw input
#
# The records below are typing.NamedTuple, not frozen dataclasses: immutable all the same,
# but a class costs about 0.1 ms to create instead of about 1 ms (dataclasses exec the
# source of six methods per class), which is start-up every launch pays (issue 12), and an
# instance is faster to make (the probe makes one per core). Change one with ._replace().
# Topology too: it builds its CPU -> core / node maps at their first use instead of in a
# dataclass __post_init__, which also keeps the dataclasses module off the launch path.

_EMPTY: Mapping = MappingProxyType({})


class RawCpu(NamedTuple):
    """Text read for one ``/sys/devices/system/cpu/cpuN`` folder (None: file absent or
    not read; the probe reads a fact shared by several CPUs once, see ``probe.read_raw``)."""

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
    #: topology/package_cpus_list: every CPU of this CPU's package (kernel >= 5.4); they
    #: take this CPU's package_id where they have none of their own.
    package_cpus_list: Optional[str] = None


class RawNode(NamedTuple):
    """Text read for one ``/sys/devices/system/node/nodeN`` folder."""

    cpulist: Optional[str] = None
    cpumap: Optional[str] = None
    meminfo: Optional[str] = None


class RawHost(NamedTuple):
    """Everything the probe read, as text, before interpretation (parsed sets where the
    probe had to parse them: ``allowed``, ``cpuset``, ``allowed_mems``)."""

    cpu_online: Optional[str] = None  # /sys/devices/system/cpu/online
    cpu_present: Optional[str] = None  # /sys/devices/system/cpu/present
    cpus: Mapping[int, RawCpu] = _EMPTY
    nodes: Mapping[int, RawNode] = _EMPTY
    node_has_memory: Optional[str] = None  # /sys/devices/system/node/has_memory
    hybrid_core_cpus: Optional[str] = None  # /sys/devices/cpu_core/cpus
    hybrid_atom_cpus: Optional[str] = None  # /sys/devices/cpu_atom/cpus
    cpuinfo: Optional[str] = None  # /proc/cpuinfo (its first processor is enough)
    allowed: Optional[frozenset] = None  # logical CPUs this process may use; None: all online
    allowed_source: str = "all online CPUs"
    cpuset: Optional[frozenset] = None  # cgroup cpuset of the process (None: unknown)
    quota_cpus: Optional[float] = None  # cgroup CPU quota in CPUs (cpu.max), None: no quota
    quota_source: str = ""
    lscpu: Optional[str] = None  # `lscpu -p=CPU,CORE,SOCKET,NODE` output, fallback only
    source: str = "sysfs"
    cpu_possible: Optional[str] = None  # /sys/devices/system/cpu/possible
    cpu_kernel_max: Optional[str] = None  # /sys/devices/system/cpu/kernel_max
    #: NUMA node ids this process may allocate on (cgroup cpuset.mems, Mems_allowed_list);
    #: None: unknown (all).
    allowed_mems: Optional[frozenset] = None
    allowed_mems_source: str = ""
    root: str = "/"  # the root the files were read below (for messages)
    notes: tuple[str, ...] = ()  # the probe's own notes (files skipped, unreadable)


# --------------------------------------------------------------------------- the model


class Core(NamedTuple):
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


class Node(NamedTuple):
    """A NUMA node. ``cpus``: its online logical CPUs (empty for memory-only nodes)."""

    id: int
    cpus: frozenset
    has_memory: bool
    mem_total_kb: Optional[int] = None


class Socket(NamedTuple):
    """A socket (package). ``index`` orders sockets by lowest CPU; ``package_id`` is the
    kernel's value (36 and 8442 on Kunpeng 920), None where CPUs were grouped by node."""

    index: int
    package_id: Optional[int]
    cpus: frozenset
    nodes: tuple[int, ...]


class _TopologyFields(NamedTuple):
    """The fields of :class:`Topology` (documented there)."""

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
    allowed_mems: Optional[frozenset] = None
    allowed_mems_source: str = ""
    cpu_limit: int = cpulist.MAX_IDS


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

    A NamedTuple like the other records (immutable; change one with ``._replace()``;
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
        }


# --------------------------------------------------------------------------- parsing helpers


class _Reader:
    """Parses the raw texts of one host, raising :func:`corrupt` errors that name the file.

    Identical texts are parsed once (a corrupt tree where every CPU names the same huge
    sibling list costs one parse, not one per CPU).
    """

    def __init__(self, raw: RawHost, notes: list):
        self.root = raw.root
        self.notes = notes
        self.limit = cpu_limit(raw.cpu_kernel_max, raw.cpu_possible, notes)
        self._lists: dict[str, frozenset] = {}
        self._masks: dict[str, frozenset] = {}
        self._numbers: dict[str, Optional[int]] = {}

    def cpus(self, text: str, path, mask: bool = False) -> frozenset:
        """A CPU list (or hex mask) file's ids, each below ``self.limit``. ``path``: the
        file, or ``(cpu, name)`` for ``/sys/devices/system/cpu/cpuN/topology/name``
        (formatted only for a message)."""
        got = (self._masks if mask else self._lists).get(text)
        if got is None:
            try:
                got = (cpulist.parse_mask if mask else cpulist.parse)(text, self.limit)
            except CpulistError as exc:
                raise corrupt(self.root, _where(path), str(exc)) from None
            (self._masks if mask else self._lists)[text] = got
        return got

    def nodes(self, text: str, path: str) -> frozenset:
        """A NUMA node list file's ids, each below ``cpulist.MAX_NODE_IDS``."""
        try:
            return cpulist.parse(text, cpulist.MAX_NODE_IDS)
        except CpulistError as exc:
            raise corrupt(self.root, path, str(exc)) from None

    def number(self, text: Optional[str], path: str) -> Optional[int]:
        """A numeric id file (``physical_package_id``: ``"36\\n"`` -> 36, ``"-1"`` -> -1);
        None when absent or empty; malformed -> TopologyError."""
        if text is None:
            return None
        value = self._numbers.get(text, _MISSING)
        if value is _MISSING:
            body = _clean(text)
            if body and _INT.fullmatch(body) is None:
                raise corrupt(self.root, _where(path),
                              f"expected an integer, found {excerpt(body)}")
            value = self._numbers[text] = int(body) if body else None
        return value

    def measure(self, text: Optional[str], path: str) -> Optional[int]:
        """An optional non-negative number (cpu_capacity, cpuinfo_max_freq); None when
        absent; malformed -> None plus a note (these refine, they do not decide)."""
        if text is None:
            return None
        body = _clean(text)
        if body.isdigit() and body.isascii() and len(body) <= 18:
            return int(body)
        self.notes.append(f"{printable(path)}: not a number ({excerpt(body)}): ignored")
        return None


_MISSING = object()


def _where(path) -> str:
    """A message's file name: ``path`` itself, or ``(cpu, name)`` for a topology file."""
    if isinstance(path, tuple):
        return f"{CPU_PATH}/cpu{path[0]}/topology/{path[1]}"
    return path


def _meminfo_total_kb(text: Optional[str]) -> Optional[int]:
    # "Node 0 MemTotal:       16775084 kB"
    if not text:
        return None
    m = re.search(r"MemTotal:[ \t]+([0-9]{1,18})[ \t]*kB", text)
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
        if flags and model:
            break
    return flags, model


def online_from_folders(raw: RawHost, rd: Optional[_Reader] = None) -> frozenset:
    """Online CPUs from per-CPU folders, where ``cpu/online`` is missing or empty: a CPU
    whose ``cpuN/online`` says 1, or that has none but a ``topology/`` folder (the kernel
    omits cpu0/online when CPU 0 cannot be hot-unplugged).

    Raises:
        TopologyError: a ``cpuN/online`` holding anything but 0 or 1.
    """
    rd = rd or _Reader(raw, [])
    online = set()
    for cpu, rc in raw.cpus.items():
        state = rd.number(rc.online, f"{CPU_PATH}/cpu{cpu}/online")
        if state not in (None, 0, 1):
            raise corrupt(raw.root, f"{CPU_PATH}/cpu{cpu}/online",
                          f"expected 0 or 1, found {state}")
        if state == 1 or (state is None and rc.has_topology):
            online.add(cpu)
    return frozenset(online)


def _online_cpus(raw: RawHost, rd: _Reader) -> frozenset:
    """Online CPUs: ``cpu/online``, else :func:`online_from_folders`."""
    if raw.cpu_online is not None and _clean(raw.cpu_online):
        return rd.cpus(raw.cpu_online, f"{CPU_PATH}/online")
    rd.notes.append("no /sys/devices/system/cpu/online: online CPUs taken from per-CPU folders")
    return online_from_folders(raw, rd)


# --------------------------------------------------------------------------- build steps


def _build_nodes(raw: RawHost, online: frozenset, rd: _Reader) -> tuple[dict, dict]:
    """NUMA nodes ({id: Node}) and the node of each online CPU ({cpu: lowest node id})."""
    node_cpus: dict[int, frozenset] = {}
    links: Optional[dict] = None
    for nid, rn in raw.nodes.items():
        if not 0 <= nid < cpulist.MAX_NODE_IDS:
            raise corrupt(raw.root, f"{NODE_PATH}/node{nid}",
                          f"node id beyond {cpulist.MAX_NODE_IDS - 1}")
        if rn.cpulist is not None:
            cpus = rd.cpus(rn.cpulist, f"{NODE_PATH}/node{nid}/cpulist")
        elif rn.cpumap is not None:
            cpus = rd.cpus(rn.cpumap, f"{NODE_PATH}/node{nid}/cpumap", mask=True)
        else:
            if links is None:  # cpuN/nodeM links, gathered once for every such node
                links = {}
                for c, rc in raw.cpus.items():
                    for n in rc.node_links:
                        links.setdefault(n, set()).add(c)
            cpus = frozenset(links.get(nid, ()))
        node_cpus[nid] = cpus & online
    if not raw.nodes:
        node_cpus = {0: online}
        rd.notes.append("no NUMA node folders in sysfs: treating the machine as one node 0")
    has_memory_ids = (
        rd.nodes(raw.node_has_memory, f"{NODE_PATH}/has_memory")
        if raw.node_has_memory is not None else None
    )
    nodes: dict[int, Node] = {}
    for nid, cpus in sorted(node_cpus.items()):
        rn = raw.nodes.get(nid, _NO_NODE)
        total = _meminfo_total_kb(rn.meminfo)
        if rn.meminfo is not None and total is None:
            rd.notes.append(f"{NODE_PATH}/node{nid}/meminfo: no 'MemTotal: N kB' line; "
                            f"memory size of node {nid} unknown")
        if has_memory_ids is not None:
            has_mem = nid in has_memory_ids
        elif total is not None:
            has_mem = total > 0
        else:
            has_mem = True  # nothing says otherwise (no node folders)
        nodes[nid] = Node(id=nid, cpus=cpus, has_memory=has_mem, mem_total_kb=total)
    cpu_node: dict[int, int] = {}
    for nid, node in nodes.items():  # ascending ids: the lowest node wins a shared CPU
        for c in node.cpus:
            cpu_node.setdefault(c, nid)
    if raw.nodes and len(cpu_node) < len(online):
        without_node = online - set(cpu_node)
        rd.notes.append(f"CPUs {cpulist.format(without_node)} belong to no NUMA node in sysfs")
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
    by_root: dict[int, list] = {}
    for c in sorted(parent):
        by_root.setdefault(find(c), []).append(c)
    return list(by_root.values())


def _core_sets(raw: RawHost, online: frozenset, rd: _Reader) -> list[list[int]]:
    """SMT sibling sets among online CPUs, merged where they overlap (inconsistent dumps),
    as sorted member lists ordered by their lowest CPU. Linear: each distinct set is taken
    once, and overlapping sets are merged by union-find.

    A CPU's set is its ``thread_siblings_list`` (else ``thread_siblings``) plus itself. An
    online CPU that no read list names is grouped with the CPUs sharing its
    ``(physical_package_id, die_id, core_id)``, or alone where it has no ``core_id``.
    """
    sets: list[frozenset] = []
    owner: dict[int, int] = {}  # cpu -> index in sets
    overlap = False
    online_part: dict[int, frozenset] = {}  # id(parsed set) -> its online CPUs (shared)
    for cpu, rc in raw.cpus.items():
        if rc.thread_siblings_list is None and rc.thread_siblings is None or cpu not in online:
            continue
        sibs = None
        if rc.thread_siblings_list is not None:
            sibs = rd.cpus(rc.thread_siblings_list, (cpu, "thread_siblings_list"))
        if not sibs and rc.thread_siblings is not None:
            sibs = rd.cpus(rc.thread_siblings, (cpu, "thread_siblings"), mask=True)
        if not sibs:
            continue  # empty lists: as if absent
        # Identical texts parse to one object: its online part is computed once, and a set
        # named again by another of its CPUs is recognised at once (no O(size) compare).
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

    lone = sorted(c for c in online if c not in owner) if len(owner) < len(online) else []
    singles: list[list[int]] = []
    if lone:
        groups: dict[tuple, list] = {}
        for cpu in lone:
            rc = raw.cpus.get(cpu)
            if rc is None or rc.core_id is None:
                singles.append([cpu])  # nothing to group it by: a core of its own
                continue
            key = (rd.number(rc.package_id, (cpu, "physical_package_id")),
                   rd.number(rc.die_id, (cpu, "die_id")),
                   rd.number(rc.core_id, (cpu, "core_id")))
            if key[2] is None:
                singles.append([cpu])
            else:
                groups.setdefault(key, []).append(cpu)
        sets.extend(frozenset(g) for g in groups.values())
        rd.notes.append("no thread_siblings_list for some CPUs: cores grouped by core_id")
    merged = _merge(sets, online) if overlap else [sorted(s) for s in sets]
    merged.extend(singles)
    merged.sort(key=lambda m: m[0])
    return merged


def _build_sockets(raw: RawHost, ordered: list, cpu_node: dict,
                   rd: _Reader) -> tuple[list, dict]:
    """Sockets ordered by lowest CPU, and the socket index of each online CPU (``ordered``:
    the online CPUs, ascending).

    A CPU's package is its own ``physical_package_id``, else that of a CPU whose
    ``package_cpus_list`` names it. Where any online CPU has none (or -1), sockets are
    the NUMA nodes instead (with a note).
    """
    online = frozenset(ordered)
    pkg_of: dict[int, int] = {}
    leaders = []
    unknown = False  # some CPU says -1
    for cpu, rc in raw.cpus.items():
        if rc.package_id is None or cpu not in online:
            continue
        pid = rd.number(rc.package_id, (cpu, "physical_package_id"))
        if pid is None:
            continue
        if pid < 0:
            unknown = True
            continue
        pkg_of[cpu] = pid
        if rc.package_cpus_list is not None:
            leaders.append(cpu)
    for cpu in sorted(leaders):
        text = raw.cpus[cpu].package_cpus_list
        pid = pkg_of[cpu]
        for m in rd.cpus(text, (cpu, "package_cpus_list")):
            if m in online and m not in pkg_of:
                pkg_of[m] = pid
    groups_by_key: dict[tuple, list] = {}
    if unknown or len(pkg_of) < len(ordered):
        # POWER LPARs report -1: the NUMA node is the best stand-in for a socket.
        rd.notes.append(
            "the kernel gives no physical_package_id (-1): sockets are taken to be NUMA nodes"
        )
        for cpu in ordered:
            groups_by_key.setdefault(("node", cpu_node.get(cpu, -1)), []).append(cpu)
    else:
        for cpu in ordered:
            groups_by_key.setdefault(("pkg", pkg_of[cpu]), []).append(cpu)
    sockets = []
    socket_index_of_cpu: dict[int, int] = {}
    for idx, (key, members) in enumerate(sorted(groups_by_key.items(), key=lambda kv: kv[1][0])):
        cpus = frozenset(members)
        snodes = tuple(sorted({cpu_node[c] for c in members if c in cpu_node}))
        sockets.append(
            Socket(index=idx, package_id=key[1] if key[0] == "pkg" else None, cpus=cpus,
                   nodes=snodes)
        )
        socket_index_of_cpu.update(dict.fromkeys(members, idx))
    return sockets, socket_index_of_cpu


def _classify_efficiency(raw: RawHost, online: frozenset, core_sets: list,
                         rd: _Reader) -> tuple[frozenset, str]:
    """E-cores of a hybrid CPU: ``/sys/devices/cpu_atom/cpus`` (Intel, kernel perf PMUs),
    else ``cpu_capacity`` (arm64 big.LITTLE, Documentation/scheduler/sched-capacity.rst),
    else ``cpufreq/cpuinfo_max_freq``. A core's value is the lowest its CPUs report (SMT
    siblings share one, so the probe reads it for one CPU per core); a core below
    EFFICIENCY_RATIO x the highest core is an E-core. Every core needs a value, else the
    attribute is not used. Returns (E-core CPUs, how it was decided)."""
    if raw.hybrid_atom_cpus is not None and raw.hybrid_core_cpus is not None:
        return rd.cpus(raw.hybrid_atom_cpus, ATOM_PATH) & online, ATOM_PATH
    for attr, label, rel in (("cpu_capacity", "cpu_capacity", "cpu_capacity"),
                             ("max_freq_khz", "cpuinfo_max_freq", "cpufreq/cpuinfo_max_freq")):
        per_core: list[tuple[list, int]] = []
        for members in core_sets:
            values = []
            for c in members:
                rc = raw.cpus.get(c)
                if rc is not None and getattr(rc, attr) is not None:
                    v = rd.measure(getattr(rc, attr), f"{CPU_PATH}/cpu{c}/{rel}")
                    if v is not None:
                        values.append(v)
            if not values:
                break
            per_core.append((members, min(values)))
        else:
            if per_core:
                top = max(v for _, v in per_core)
                slow = frozenset(c for m, v in per_core if v < EFFICIENCY_RATIO * top for c in m)
                return slow, label
    return frozenset(), ""


_NO_CPU = RawCpu()
_NO_NODE = RawNode()


def build(raw: RawHost) -> Topology:
    """Interpret raw host text as a :class:`Topology` (pure; linear in the CPUs).

    Rules (kernel Documentation/ABI/stable/sysfs-devices-system-cpu and
    Documentation/ABI/stable/sysfs-devices-node):

    - every CPU id is bounded by :func:`cpu_limit` (``kernel_max`` + 1), node ids by
      ``cpulist.MAX_NODE_IDS``;
    - online CPUs as in :func:`_online_cpus`; node cpulists naming offline CPUs are
      intersected with the online set;
    - cores are SMT sibling sets (``thread_siblings_list``, else ``thread_siblings``,
      else ``(package, die, core_id)``), restricted to online CPUs (:func:`_core_sets`);
    - NUMA nodes from ``nodeN/cpulist``, else ``nodeN/cpumap``, else ``cpuN/nodeM``
      links; no node folders at all means one node 0 holding every CPU;
    - a node has memory if ``node/has_memory`` lists it, else if its ``meminfo`` shows
      a non-zero MemTotal;
    - sockets from ``physical_package_id`` (shared through ``package_cpus_list``); where
      that is -1 or missing, from NUMA nodes.

    Raises:
        TopologyError: no online CPU could be found, or a file is malformed (the message
            names it; see the module docstring for what is fatal).
    """
    if raw.lscpu is not None and not any(rc.has_topology for rc in raw.cpus.values()):
        return _build_from_lscpu(raw)
    notes: list[str] = list(raw.notes)
    rd = _Reader(raw, notes)
    for cpu in raw.cpus:
        if not 0 <= cpu < rd.limit:
            raise corrupt(raw.root, f"{CPU_PATH}/cpu{cpu}",
                          f"CPU id beyond the kernel's limit (ids must be below {rd.limit})")
    online = _online_cpus(raw, rd)
    if not online:
        raise TopologyError("no online CPU found in sysfs (is --sysroot pointing at a root?)")
    # "offline" = present (or with a cpuN folder) but not online; possible-but-absent CPUs
    # (cpu/possible far above present on many servers) are not offline, they do not exist.
    known = set(raw.cpus) | online
    if raw.cpu_present is not None:
        known |= rd.cpus(raw.cpu_present, f"{CPU_PATH}/present")
    offline = frozenset(known - online)

    nodes, cpu_node = _build_nodes(raw, online, rd)
    core_sets = _core_sets(raw, online, rd)
    sockets, socket_index_of_cpu = _build_sockets(raw, sorted(online), cpu_node, rd)

    ecpus, how = _classify_efficiency(raw, online, core_sets, rd)
    hybrid = bool(ecpus) and ecpus != online
    if hybrid:
        notes.append(f"hybrid CPU: E-cores {cpulist.format(ecpus)} (from {how})")

    cores = []
    for members in core_sets:
        first = members[0]
        core_id = None
        for c in members:  # the first CPU whose core_id was read (the probe reads one per core)
            rc = raw.cpus.get(c)
            if rc is not None and rc.core_id is not None:
                core_id = rd.number(rc.core_id, (c, "core_id"))
                break
        cores.append(
            Core(
                id=first,
                cpus=tuple(members),
                socket=socket_index_of_cpu[first],
                node=cpu_node.get(first),
                core_id=core_id,
                efficiency=hybrid and any(c in ecpus for c in members),
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
        allowed_mems=raw.allowed_mems,
        allowed_mems_source=raw.allowed_mems_source,
        cpu_limit=rd.limit,
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
        vals = [int(f.strip()) if _INT.fullmatch(f.strip()) else None for f in fields]
        if vals[0] is None or vals[0] < 0:
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
        cpu_possible=raw.cpu_possible,
        cpu_kernel_max=raw.cpu_kernel_max,
        allowed_mems=raw.allowed_mems,
        allowed_mems_source=raw.allowed_mems_source,
        root=raw.root,
        notes=raw.notes,
    )
    topo = build(derived)
    return topo._replace(notes=topo.notes + ("sysfs has no CPU topology: read from lscpu -p",))
