"""Generate big synthetic sysfs trees (a ``--sysroot`` root) quickly, for tests and benchmarks.

The layout follows what Linux shows on a multi-socket x86 server: logical CPUs are
numbered core by core across all sockets first, then the SMT siblings, so the siblings of
core ``k`` are ``k, k + ncores, k + 2 * ncores, ...`` (``thread_siblings_list`` of CPU 0
on a 2 x 28-core Xeon: ``0,56``); cores are numbered socket by socket and NUMA node by
node inside a socket (sub-NUMA clustering). Files written (under ``sys/devices/system``):

- ``cpu/{online,present,possible,kernel_max}``;
- ``cpu/cpuN/online`` (not for cpu0, as on x86) and, for online CPUs only (x86 removes
  ``topology/`` on hot-unplug), ``cpu/cpuN/topology/{physical_package_id,die_id,core_id,
  thread_siblings_list,core_siblings_list,package_cpus_list}`` holding online CPUs only, as
  the kernel's masks do;
- ``node/{online,possible,has_memory}``, ``node/nodeN/{cpulist,cpumap,meminfo}``;
- with ``l3_cores`` / ``l2_cores`` (issue 22), for online CPUs, ``cpu/cpuN/cache/index{0,1,
  2,3}/{level,type,shared_cpu_list,size}`` (L1d, L1i, L2, L3, as x86 and arm64 number
  them) and, with ``cluster_cores``, ``topology/cluster_cpus_list``;
- ``proc/cpuinfo`` (two processors), and ``extra`` files given by the caller.

Writing uses plain ``os`` calls, and files with equal contents are hard links of one file
(a link costs a tenth of a new file on ext4): 8,192 CPUs take a few seconds. So never
write into a file of a generated tree: :func:`replace_file` puts a new file in its place.

    python tests/bigtree.py DIR --sockets 8 --nodes-per-socket 2 --cores-per-node 32 --threads 2
"""

from __future__ import annotations

import argparse
import errno
import os
import tempfile
from pathlib import Path
from typing import Iterable, Mapping, Optional

__all__ = ["make_tree", "replace_file", "scratch_dir", "Layout", "cpulist_text", "mask_text",
           "CACHE_TREES", "make_cache_tree"]


class Layout:
    """Ids of a generated machine (logical CPU ids as in cpuN).

    Attributes:
        ncores: physical cores in all; ncpus: logical CPUs (ncores x threads_per_core).
        siblings[k]: the logical CPUs of core k (k, k + ncores, ...).
        socket_of_core[k], node_of_core[k]: socket index and NUMA node id of core k.
    """

    def __init__(self, sockets: int, nodes_per_socket: int, cores_per_node: int,
                 threads_per_core: int):
        self.sockets = sockets
        self.nodes_per_socket = nodes_per_socket
        self.cores_per_node = cores_per_node
        self.threads_per_core = threads_per_core
        self.nnodes = sockets * nodes_per_socket
        self.ncores = self.nnodes * cores_per_node
        self.ncpus = self.ncores * threads_per_core
        self.siblings = [[k + t * self.ncores for t in range(threads_per_core)]
                         for k in range(self.ncores)]
        self.node_of_core = [k // cores_per_node for k in range(self.ncores)]
        self.socket_of_core = [k // (cores_per_node * nodes_per_socket) for k in range(self.ncores)]

    def node_cpus(self, node: int) -> list[int]:
        """Logical CPUs of NUMA node ``node`` (online or not)."""
        first = node * self.cores_per_node
        cores = range(first, first + self.cores_per_node)
        return sorted(c for k in cores for c in self.siblings[k])

    def socket_cpus(self, socket: int) -> list[int]:
        """Logical CPUs of socket ``socket`` (online or not)."""
        per = self.nodes_per_socket
        return sorted(c for n in range(socket * per, (socket + 1) * per) for c in self.node_cpus(n))


def cpulist_text(ids: Iterable[int]) -> str:
    """Kernel list format of ``ids`` (``[0, 1, 2, 4]`` -> ``"0-2,4"``), written here, not
    by cpulaunch, so the tree does not depend on the code it tests."""
    ordered = sorted(set(ids))
    parts, i = [], 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def mask_text(ids: Iterable[int], nbits: int) -> str:
    """Kernel cpumask format: 32-bit hex words, most significant first, ``nbits`` wide."""
    value = 0
    for i in ids:
        value |= 1 << i
    nwords = max(1, (nbits + 31) // 32)
    return ",".join(f"{(value >> (32 * w)) & 0xFFFFFFFF:08x}" for w in reversed(range(nwords)))


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def replace_file(path, data) -> None:
    """Put a new file holding ``data`` (str or bytes) at ``path``: the tree's files may be
    hard links shared with other paths, so writing into one would change them all."""
    path = os.fspath(path)
    if os.path.lexists(path) and not os.path.isdir(path):
        os.unlink(path)
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


class _Writer:
    """Writes each distinct content once; later files with that content are hard links."""

    def __init__(self) -> None:
        self.first: dict[str, str] = {}

    def __call__(self, path: str, text: str) -> None:
        src = self.first.get(text)
        if src is not None:
            try:
                os.link(src, path)
                return
            except OSError as exc:  # EMLINK: ext4 allows 65,000 links per file
                if exc.errno != errno.EMLINK:
                    raise
        _write(path, text)
        self.first[text] = path


def make_tree(root: Path, *, sockets: int, nodes_per_socket: int, cores_per_node: int,
              threads_per_core: int, offline: Iterable[int] = (), kernel_max: Optional[int] = None,
              node_mem_kb: int = 64 << 20, model: str = "Synthetic Xeon @ 2.00GHz",
              flags: str = "fpu sse2 avx2 avx512f",
              extra: Optional[Mapping[str, str]] = None, l3_cores: Optional[int] = None,
              l2_cores: Optional[int] = None, cluster_cores: Optional[int] = None,
              l3_kb: int = 32768, l2_kb: int = 1024) -> Path:
    """Write a sysfs tree of ``sockets`` x ``nodes_per_socket`` NUMA nodes x
    ``cores_per_node`` cores x ``threads_per_core`` SMT threads under ``root``.

    Args:
        root: folder to create the tree in (made if missing); returned, for ``--sysroot``.
        offline: logical CPU ids to show offline (out of cpu/online, no topology folder,
            ``cpuN/online`` = 0, left out of node and sibling lists).
        kernel_max: value of ``cpu/kernel_max`` (default: 8191, or ncpus - 1 if larger).
        node_mem_kb: MemTotal of each node's meminfo, in kB.
        extra: more files, ``{path relative to root: text}`` (e.g. a cgroup cpuset).
        l3_cores, l2_cores: cores sharing an L3 / an L2, consecutive cores of one node
            (the last group of a node may be smaller); None: no cache folders at all.
        cluster_cores: cores per ``cluster_cpus_list`` (consecutive in a node); None: no
            cluster files.
        l3_kb, l2_kb: the caches' ``size`` in KiB.

    Returns:
        ``root`` as a Path.
    """
    root = Path(root)
    lay = Layout(sockets, nodes_per_socket, cores_per_node, threads_per_core)
    off = set(offline)
    online = [c for c in range(lay.ncpus) if c not in off]
    kmax = kernel_max if kernel_max is not None else max(8191, lay.ncpus - 1)
    nbits = lay.ncpus
    cpu_dir = os.path.join(root, "sys/devices/system/cpu")
    node_dir = os.path.join(root, "sys/devices/system/node")
    os.makedirs(cpu_dir, exist_ok=True)
    os.makedirs(node_dir, exist_ok=True)
    _write(f"{cpu_dir}/online", cpulist_text(online) + "\n")
    _write(f"{cpu_dir}/present", f"0-{lay.ncpus - 1}\n")
    _write(f"{cpu_dir}/possible", f"0-{lay.ncpus - 1}\n")
    _write(f"{cpu_dir}/kernel_max", f"{kmax}\n")
    _write(f"{cpu_dir}/offline", (cpulist_text(off) if off else "") + "\n")

    put = _Writer()
    socket_online = {s: [c for c in lay.socket_cpus(s) if c not in off] for s in range(sockets)}
    socket_text = {s: cpulist_text(v) + "\n" for s, v in socket_online.items()}
    core_in_socket = cores_per_node * nodes_per_socket
    for k, sibs in enumerate(lay.siblings):
        on = [c for c in sibs if c not in off]
        sib_text = cpulist_text(on) + "\n"
        s = lay.socket_of_core[k]
        for c in sibs:
            d = f"{cpu_dir}/cpu{c}"
            os.mkdir(d)
            if c:
                put(f"{d}/online", "0\n" if c in off else "1\n")
            if c in off:
                continue
            t = f"{d}/topology"
            os.mkdir(t)
            put(f"{t}/physical_package_id", f"{s}\n")
            put(f"{t}/die_id", "0\n")
            put(f"{t}/core_id", f"{k % core_in_socket}\n")
            put(f"{t}/thread_siblings_list", sib_text)
            put(f"{t}/core_siblings_list", socket_text[s])
            put(f"{t}/package_cpus_list", socket_text[s])
            _put_caches(put, d, k, lay, off, l3_cores, l2_cores, cluster_cores, l3_kb, l2_kb)

    nodes = list(range(lay.nnodes))
    for n in nodes:
        d = f"{node_dir}/node{n}"
        os.mkdir(d)
        cpus = [c for c in lay.node_cpus(n) if c not in off]
        _write(f"{d}/cpulist", cpulist_text(cpus) + "\n")
        _write(f"{d}/cpumap", mask_text(cpus, nbits) + "\n")
        _write(f"{d}/meminfo", f"Node {n} MemTotal:       {node_mem_kb} kB\n"
                               f"Node {n} MemFree:        {node_mem_kb // 2} kB\n")
    for name in ("online", "possible", "has_memory", "has_cpu"):
        _write(f"{node_dir}/{name}", cpulist_text(nodes) + "\n")

    os.makedirs(os.path.join(root, "proc"), exist_ok=True)
    info = "".join(
        f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: {model}\n"
        f"physical id\t: 0\ncore id\t\t: {i}\nflags\t\t: {flags}\n\n" for i in range(2))
    _write(os.path.join(root, "proc/cpuinfo"), info)
    for rel, text in (extra or {}).items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _write(path, text)
    return root


def _group_text(k: int, size: Optional[int], lay: Layout, off: set) -> Optional[str]:
    """The online CPUs of the group of ``size`` consecutive cores holding core ``k``
    (groups counted from the first core of k's node), as a cpulist line."""
    if not size:
        return None
    first_of_node = lay.node_of_core[k] * lay.cores_per_node
    start = first_of_node + (k - first_of_node) // size * size
    end = min(start + size, first_of_node + lay.cores_per_node)
    return cpulist_text(c for j in range(start, end) for c in lay.siblings[j] if c not in off) + "\n"


def _put_caches(put, cpu_dir: str, k: int, lay: Layout, off: set, l3_cores, l2_cores,
                cluster_cores, l3_kb: int, l2_kb: int) -> None:
    """cache/index0-3 of one online CPU of core ``k`` (and its cluster_cpus_list)."""
    cluster = _group_text(k, cluster_cores, lay, off)
    if cluster is not None:
        put(f"{cpu_dir}/topology/cluster_cpus_list", cluster)
    if l3_cores is None and l2_cores is None:
        return
    core = _group_text(k, 1, lay, off)
    levels = [("1", "Data", core, "48K"), ("1", "Instruction", core, "32K"),
              ("2", "Unified", _group_text(k, l2_cores or 1, lay, off), f"{l2_kb}K")]
    if l3_cores:
        levels.append(("3", "Unified", _group_text(k, l3_cores, lay, off), f"{l3_kb}K"))
    os.mkdir(f"{cpu_dir}/cache")
    for i, (level, kind, shared, size) in enumerate(levels):
        d = f"{cpu_dir}/cache/index{i}"
        os.mkdir(d)
        put(f"{d}/level", level + "\n")
        put(f"{d}/type", kind + "\n")
        put(f"{d}/shared_cpu_list", shared)
        put(f"{d}/size", size + "\n")


#: The generated machines of issue 22 (``make_cache_tree(root, name)``): name -> the
#: make_tree arguments. Genoa: AMD EPYC 9654, 96 cores in 12 CCDs of 8 sharing a 32 MiB
#: L3 (AMD's EPYC 9004 tuning guides), L2 private (1 MiB), SMT2; the x86 kernel's cluster
#: is the L2, so one core. NPS1: one NUMA node per socket; NPS4: four, of 3 CCDs each.
#: Xeon 6 E-core: two 6780E sockets of 144 cores without SMT, in 36 modules of 4 sharing a
#: 4 MiB L2 (the cluster), one 108 MiB L3 per socket, one node per socket. Grace: 72
#: Neoverse V2 cores, 1 MiB L2 each, one 114 MiB L3 (NVIDIA's Grace tuning guide); its
#: clusters of 4 cores are modelled on the Kunpeng 920 dump's (hwloc 128arm-2pa2n8cluster4co),
#: not read from a Grace machine.
CACHE_TREES = {
    "genoa-nps1": dict(sockets=1, nodes_per_socket=1, cores_per_node=96, threads_per_core=2,
                       l3_cores=8, l2_cores=1, cluster_cores=1, l3_kb=32768, l2_kb=1024,
                       model="AMD EPYC 9654 96-Core Processor"),
    "genoa-nps4": dict(sockets=1, nodes_per_socket=4, cores_per_node=24, threads_per_core=2,
                       l3_cores=8, l2_cores=1, cluster_cores=1, l3_kb=32768, l2_kb=1024,
                       model="AMD EPYC 9654 96-Core Processor"),
    "xeon6-e": dict(sockets=2, nodes_per_socket=1, cores_per_node=144, threads_per_core=1,
                    l3_cores=144, l2_cores=4, cluster_cores=4, l3_kb=110592, l2_kb=4096,
                    model="Intel(R) Xeon(R) 6780E"),
    "grace": dict(sockets=1, nodes_per_socket=1, cores_per_node=72, threads_per_core=1,
                  l3_cores=72, l2_cores=1, cluster_cores=4, l3_kb=116736, l2_kb=1024,
                  model="Neoverse-V2", flags="fp asimd sve sve2 bf16"),
}


def make_cache_tree(root: Path, name: str, **more) -> Path:
    """Write the generated machine ``name`` of :data:`CACHE_TREES` under ``root``."""
    return make_tree(root, **{**CACHE_TREES[name], **more})


def scratch_dir(prefix: str = "bigtree-") -> str:
    """A new temporary folder, on tmpfs (/dev/shm) when there is one: a busy ext4 disk
    can take a millisecond per mkdir, tmpfs some microseconds. The caller removes it."""
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root")
    p.add_argument("--sockets", type=int, default=8)
    p.add_argument("--nodes-per-socket", type=int, default=1)
    p.add_argument("--cores-per-node", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    make_tree(Path(a.root), sockets=a.sockets, nodes_per_socket=a.nodes_per_socket,
              cores_per_node=a.cores_per_node, threads_per_core=a.threads)
    print(a.root)


if __name__ == "__main__":
    main()
