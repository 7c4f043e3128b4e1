"""The topology view (pure): the nesting ``--show-topology`` draws (:func:`topology_boxes`),
as text (:func:`topology_text`) here and as SVG in :mod:`cpulaunch.svg` beside it, and the
sizes and lines both views write.
"""

from typing import Any, Optional

from cpulaunch import cpulist
from cpulaunch.forms import one_line
from cpulaunch.records import Record

__all__ = [
    "ISA_FLAGS",
    "topology_text",
    "platform_line",
    "topology_boxes",
    "SocketBox",
    "NodeBox",
    "CacheBox",
    "cache_size_text",
    "gib_text",
]

#: /proc/cpuinfo flags that decide oneDNN's kernels: AVX2/AVX-512 for fp32, VNNI for int8,
#: AVX512_BF16 and AMX for bf16 (Intel's optimization guide for PyTorch on CPU).
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
             "amx_bf16", "amx_int8", "asimd", "sve")


class CacheBox(Record):
    """One cache domain of the topology view (:func:`topology_boxes`) and what it holds.

    Attributes:
        domain: the L3, L2 or cluster domain (:class:`cpulaunch.machine.topology.CacheDomain`).
        items: what is drawn inside it, in core order: :class:`Core` records, and (in an
            L3) L2/cluster boxes that group several cores.
        shared_with: ids of the other NUMA nodes whose CPUs share this domain (an L3
            that spans sub-NUMA clusters), ascending; the same L3 is shown in each node.
    """

    domain: Any
    items: tuple
    shared_with: tuple[int, ...] = ()


class NodeBox(Record):
    """A NUMA node's part of one socket in the topology view.

    Attributes:
        node_id: the NUMA node id; None for the socket's cores that belong to no node.
        node: its :class:`cpulaunch.machine.topology.Node` (None with ``node_id`` None).
        items: its cores in core order, grouped in :class:`CacheBox` es where caches were read.
    """

    node_id: Optional[int]
    node: Any
    items: tuple


class SocketBox(Record):
    """A socket of the topology view: its :class:`cpulaunch.machine.topology.Socket` and
    its NUMA nodes' parts (:class:`NodeBox`), the socket's own nodes first, in its order."""

    socket: Any
    nodes: tuple[NodeBox, ...]


def topology_boxes(topo) -> tuple[SocketBox, ...]:
    """The nesting that ``--show-topology`` draws, as text (:func:`topology_text`) and as SVG
    (``cpulaunch.svg``): sockets -> NUMA nodes -> L3 domains -> L2/cluster domains that
    group several cores -> cores. Pure; the one place this grouping rule lives.

    Every core appears once, under its socket and its node (``Core.node``; cores whose
    CPUs belong to no node under a ``NodeBox`` with ``node_id`` None, after the others).
    Inside a node, consecutive cores that share an L3 form one L3 box, and inside it
    consecutive cores that share an L2 or cluster form one box where it holds several
    cores and is not the L3 itself; where caches were not read (``topo.caches`` None or
    empty) the cores stand alone. A node that spans sockets appears in each.
    """
    by_place: dict = {}
    for core in topo.cores:
        by_place.setdefault((core.socket, core.node), []).append(core)
    out = []
    for sock in topo.sockets:
        node_ids = list(sock.nodes) + sorted({n for (s, n) in by_place if s == sock.index and n not in sock.nodes},
                                             key=lambda n: (n is None, n or 0))
        nodes = []
        for nid in node_ids:
            node = topo.nodes.get(nid) if nid is not None else None
            nodes.append(NodeBox(nid, node, _cache_items(topo, by_place.get((sock.index, nid), []), nid)))
        out.append(SocketBox(sock, tuple(nodes)))
    return tuple(out)


def _cache_items(topo, cores, node) -> tuple:
    """A node's cores grouped by L3 domain, and by L2/cluster where one groups several
    cores (issue 22); the cores alone where caches were not read."""
    caches = topo.caches
    if caches is None or not (caches.l3 or caches.l2):
        return tuple(cores)
    items: list = []
    for l3, members in _runs(cores, lambda c: topo.cache_of(c.id, "l3")):
        inner: list = []
        for l2, group in _runs(members, lambda c: topo.cache_of(c.id, "l2")):
            if l2 is not None and len(group) > 1 and (l3 is None or caches.l2[l2].cpus != caches.l3[l3].cpus):
                inner.append(CacheBox(caches.l2[l2], tuple(group)))
            else:
                inner += group
        if l3 is None:
            items += inner
            continue
        d = caches.l3[l3]
        others = sorted(n for n in {topo.node_of(c) for c in d.cpus} - {node} if n is not None)
        items.append(CacheBox(d, tuple(inner), tuple(others)))
    return tuple(items)


def _runs(cores, key) -> list:
    """Consecutive cores with equal ``key``: [(key, [cores])]."""
    out: list = []
    for core in cores:
        k = key(core)
        if out and out[-1][0] == k:
            out[-1][1].append(core)
        else:
            out.append((k, [core]))
    return out


def cache_size_text(kb) -> str:
    """A cache's size as the views show it: ``11264`` -> ``" 11 MiB"``, ``5118`` ->
    ``" 5118 KiB"``, None or 0 -> ``""`` (unknown)."""
    if not kb:
        return ""
    return f" {kb // 1024} MiB" if kb % 1024 == 0 else f" {kb} KiB"


def gib_text(kb) -> str:
    """A node's memory (KiB) in GiB as the views show it: ``47906816`` -> ``"45.7 GiB"``,
    None or 0 -> ``"? GiB"``."""
    return f"{kb / 2**20:.1f} GiB" if kb else "? GiB"


def _item_lines(topo, item, pad: str) -> list:
    if not isinstance(item, CacheBox):
        cpus = " ".join(f"{c}{'' if c in topo.allowed else '!'}" for c in item.cpus)
        return [f"{pad}core {item.id}{' E' if item.efficiency else ''}: {cpus}"]
    d = item.domain
    span = f" (shared with node {cpulist.format(item.shared_with)})" if item.shared_with else ""
    lines = [f"{pad}{d.kind}{cache_size_text(d.size_kb)}: CPUs {cpulist.format(d.cpus)}{span}"]
    for inner in item.items:
        lines += _item_lines(topo, inner, pad + "  ")
    return lines


def platform_line(platform) -> str:
    """The platform and the recipe ``--recipe auto`` applies there, one line
    (``--show-topology``, ``cpulaunch doctor``): ``"platform: AMD Zen 4 (family 0x19
    model 0x11); recipe amd-zen"``."""
    from cpulaunch.machine.recipes import recipe_for

    return f"platform: {platform.text}; recipe {recipe_for(platform.kind).name}"


def topology_text(topo) -> str:
    """A person's view (``--show-topology``): sockets -> NUMA nodes -> cores with their
    SMT siblings (logical CPU ids), inside a node grouped by L3 domain and by L2 or
    cluster where one holds several cores (with their sizes). Pure. Every core appears
    once: cores whose CPUs belong to no NUMA node are listed under ``(no NUMA node)`` of
    their socket. Marks: ``E`` an E-core, ``!`` a CPU this process may not use;
    memory-only nodes and offline CPUs last.
    """
    lines = [
        f"{topo.model or 'CPU'} ({topo.source}): {len(topo.sockets)} socket(s), "
        f"{len([n for n in topo.nodes.values() if n.cpus])} NUMA node(s) with CPUs, "
        f"{len(topo.cores)} cores, {len(topo.online)} logical CPUs online",
        f"allowed CPUs: {cpulist.format(topo.allowed)} ({topo.allowed_source})"
        + (f"; CPU quota {topo.quota_cpus:g}" if topo.quota_cpus else ""),
    ]
    if topo.flags:
        have = [f for f in ISA_FLAGS if f in topo.flags]
        lines.append("ISA for PyTorch: " + (" ".join(have) if have else "none of " + " ".join(ISA_FLAGS)))
    lines.append(platform_line(topo.platform))
    for box in topology_boxes(topo):
        sock = box.socket
        pkg = f"package {sock.package_id}" if sock.package_id is not None else "no package id"
        lines.append(f"socket {sock.index} ({pkg}): CPUs {cpulist.format(sock.cpus)}")
        for part in box.nodes:
            if part.node is not None:
                mem = gib_text(part.node.mem_total_kb) if part.node.has_memory else "no memory"
                lines.append(f"  node {part.node_id} ({mem})")
            else:
                lines.append("  (no NUMA node)")
            for item in part.items:
                lines += _item_lines(topo, item, "    ")
    mem_only = sorted((n for n in topo.nodes.values() if not n.cpus), key=lambda n: n.id)
    if mem_only:
        lines.append("memory-only nodes: " + ", ".join(f"{n.id} ({gib_text(n.mem_total_kb)})" for n in mem_only))
    if topo.offline:
        lines.append(f"offline CPUs: {cpulist.format(topo.offline)}")
    if any(c not in topo.allowed for c in topo.online):
        lines.append("! = not allowed for this process (affinity mask / cgroup cpuset)")
    for note in topo.notes:
        lines.append(f"note: {one_line(note)}")
    return "\n".join(lines) + "\n"
