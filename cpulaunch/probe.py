"""Every read of the host: sysfs and procfs under a root directory, cgroups, affinity, lscpu.

``root`` has the meaning of ``lscpu --sysroot`` / hwloc's ``HWLOC_FSROOT``: every path is
read below it. With the default root ``/`` the process's own affinity mask
(``os.sched_getaffinity``) is the allowed set, since that is what a container's cpuset, a
Slurm task binding or ``taskset`` hands us; under another root the dump's cgroup cpuset
stands in for it.

Files are read with plain ``os`` calls, regular files only (``O_NONBLOCK``, then
``fstat``: a FIFO or device in place of a sysfs file never blocks) and at most
:data:`MAX_FILE_BYTES` each. What a malformed file leads to (an error naming it, or a
note) is listed in ``topology``'s module docstring.

Cost (issue 12): a fact shared by several CPUs is read once. The probe walks the online
CPUs upwards and reads ``thread_siblings_list`` and ``core_id`` only for a CPU that no
list read so far names (one per core), ``physical_package_id`` and ``package_cpus_list``
only for a CPU no package list read so far names (one per package), and ``cpu_capacity``
/ ``cpuinfo_max_freq`` once per core and only when the first core has them. The kernel
builds these masks symmetrically (x86 ``set_cpu_sibling_map`` and arm64
``update_siblings_masks`` link both CPUs), so a CPU named in a sibling's list has that
same list; in a corrupt tree whose lists disagree, the cores are still a partition of the
online CPUs into whole sibling sets of the lists read. 1,024 CPUs with SMT2 in 8 packages
take about 1,060 small reads (a sibling list and a core_id per core, an id and a list per
package, the node and cgroup files): twice the CPUs, twice the reads, nothing per CPU that
scans all CPUs.

The parsing of what is read is pure (``parse_*`` functions here, :func:`topology.build`).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from typing import Optional

from cpulaunch import cpulist
from cpulaunch import log as _log
from cpulaunch.cpulist import CpulistError, excerpt
from cpulaunch.topology import (
    RawCpu,
    RawHost,
    RawNode,
    Topology,
    build,
    corrupt,
    cpu_limit,
    online_from_folders,
    printable,
)

__all__ = [
    "probe",
    "read_raw",
    "parse_proc_cgroup",
    "parse_mounts",
    "parse_cpu_max",
    "cpu_flags",
    "run_lscpu",
    "check_numactl",
    "MAX_FILE_BYTES",
]

log = _log.get(__name__)

CPU_DIR = "sys/devices/system/cpu"
NODE_DIR = "sys/devices/system/node"

#: Largest file the probe reads (sysfs attributes are at most a page; a cpulist of 8,192
#: CPUs is under 40 KiB). A bigger file is an error where it matters, else a note.
MAX_FILE_BYTES = 1 << 20
#: Of /proc/cpuinfo only the first processor is used: 1,024 CPUs make it 1.5 MB.
CPUINFO_BYTES = 64 << 10

_FIRST_READ = 65536
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a link"}


class _Fs:
    """Reads text below ``root`` with plain ``os`` calls.

    ``read`` returns None for an absent file (ENOENT, ENOTDIR) and for one this user may
    not read (a note). A file that is present but unusable (not a regular file, over
    ``cap`` bytes, an I/O error) raises a TopologyError naming it when ``strict``, else
    reads as None with a note. Bytes that are not UTF-8 become U+FFFD.
    """

    def __init__(self, root: str | os.PathLike = "/"):
        self.root = os.fspath(root)
        self.prefix = self.root.rstrip("/")
        self.notes: list[str] = []
        self.unusable = False  # some file was not a regular file, too big or failed to read

    def path(self, rel: str) -> str:
        """``rel`` (relative, no leading slash) below the root."""
        return self.prefix + "/" + rel

    def _bad(self, rel: str, what: str, strict: bool) -> None:
        self.unusable = True
        if strict:
            raise corrupt(self.root, "/" + rel, what)
        self.notes.append(f"/{printable(rel)}: {what}: ignored")

    def read(self, rel: str, strict: bool = True, cap: int = MAX_FILE_BYTES,
             truncate: bool = False) -> Optional[str]:
        """The text of ``root/rel``, or None (see the class). ``truncate``: keep the first
        ``cap`` bytes of a longer file instead of refusing it."""
        try:
            fd = os.open(self.prefix + "/" + rel, _OPEN_FLAGS)
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return None  # ValueError: a NUL byte in a path taken from a dump
        except PermissionError:
            self.notes.append(f"/{printable(rel)}: permission denied: ignored")
            return None
        except OSError as exc:
            self._bad(rel, f"cannot open ({exc.strerror})", strict)
            return None
        try:
            st = os.fstat(fd)
            if st.st_mode & 0o170000 != stat.S_IFREG:
                kind = _KINDS.get(stat.S_IFMT(st.st_mode), "special")
                self._bad(rel, f"not a regular file ({kind})", strict)
                return None
            data = os.read(fd, _FIRST_READ if cap >= _FIRST_READ else cap + 1)
            # A file on disk is whole when its size is read; sysfs (4096) and procfs (0)
            # sizes say nothing, so read on to the end there.
            if data and len(data) != st.st_size:
                chunks = [data]
                size = len(data)
                while size <= cap:
                    chunk = os.read(fd, min(_FIRST_READ, cap + 1 - size))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
                data = b"".join(chunks)
            if len(data) > cap:
                if not truncate:
                    self._bad(rel, f"larger than {cap} bytes", strict)
                    return None
                data = data[:cap]
        except OSError as exc:
            self._bad(rel, f"cannot read ({exc.strerror})", strict)
            return None
        finally:
            os.close(fd)
        return data.decode("utf-8", "replace")

    def listdir(self, rel: str) -> list[str]:
        try:
            return os.listdir(self.path(rel))
        except (OSError, ValueError):
            return []

    def isdir(self, rel: str) -> bool:
        try:
            return stat.S_ISDIR(os.stat(self.path(rel)).st_mode)
        except (OSError, ValueError):
            return False


_NUMBERED: dict[str, re.Pattern] = {}


def _numbered(names: list[str], prefix: str) -> list[int]:
    """Ids of entries named PREFIX<N> (N in ASCII digits, no leading zero), ascending:
    ``["cpu0", "cpu12", "cpufreq", "cpu01"]`` -> ``[0, 12]``. One regex scan over the names
    joined by NUL, which no file name holds (a third of a per-name match on 1,024 CPUs)."""
    pat = _NUMBERED.get(prefix)
    if pat is None:
        pat = _NUMBERED[prefix] = re.compile(
            r"(?:^|\x00)" + re.escape(prefix) + r"(0|[1-9][0-9]{0,9})(?=\x00|$)")
    return sorted(map(int, pat.findall("\x00".join(names))))


def _clean(text: Optional[str]) -> str:
    return "" if text is None else text.replace("\x00", "").strip(" \t\n")


def _parse(fs: _Fs, text: str, rel: str, limit: int, mask: bool = False) -> frozenset:
    """``text`` of ``rel`` as a cpulist (or mask) bounded by ``limit``; errors name the file."""
    try:
        return (cpulist.parse_mask if mask else cpulist.parse)(text, limit)
    except CpulistError as exc:
        raise corrupt(fs.root, "/" + rel, str(exc)) from None


# --------------------------------------------------------------------------- cgroups (pure)


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/self/cgroup`` -> {controller: path}; the v2 unified entry is under key "".

    ``"0::/user.slice\\n4:cpuset:/job"`` -> ``{"": "/user.slice", "cpuset": "/job"}``
    (format: Documentation/admin-guide/cgroup-v2.rst, "Processes").
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            out[""] = path
        for c in controllers.split(","):
            if c:
                out[c] = path
    return out


def parse_mounts(text: str) -> list[tuple[str, str, set]]:
    """``/proc/mounts`` -> [(mount point, fs type, options)] for cgroup/cgroup2 mounts."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 4 and f[2] in ("cgroup", "cgroup2"):
            out.append((f[1], f[2], set(f[3].split(","))))
    return out


def _count(text: str) -> Optional[int]:
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def parse_cpu_max(text: str) -> Optional[float]:
    """cgroup v2 ``cpu.max`` ``"$MAX $PERIOD"`` in CPUs: ``"200000 100000"`` -> 2.0;
    ``"max 100000"`` -> None; ``"300000"`` -> 3.0 (period 100000); ``""`` -> None
    (Documentation/admin-guide/cgroup-v2.rst, "CPU Interface Files").

    Raises:
        ValueError: anything else (``"abc"``, ``"-1 100000"``, ``"100 0"``, three fields).
    """
    f = text.replace("\x00", "").split()
    if not f:
        return None
    period = _count(f[1]) if len(f) > 1 else 100000
    if len(f) > 2 or not period or (f[0] != "max" and not _count(f[0])):
        raise ValueError(f"expected '$MAX $PERIOD' (max or a positive number of "
                         f"microseconds, then a positive period), found {excerpt(text.strip())}")
    if f[0] == "max":
        return None
    return _count(f[0]) / period


def _cgroup_dirs(fs: _Fs, controller: str) -> list[str]:
    """Candidate folders (relative to root) of this process's cgroup for ``controller``,
    deepest first, walking up to the mount point. Tries cgroup v2, then v1. A path with
    a ``..`` component (a corrupt dump) is not followed."""
    mounts = parse_mounts(fs.read("proc/self/mounts", strict=False, truncate=True)
                          or fs.read("proc/mounts", strict=False, truncate=True) or "")
    own_text = fs.read("proc/self/cgroup", strict=False)
    own = parse_proc_cgroup(own_text) if own_text else {}
    if not own:
        # Old dumps keep only /proc/self/cpuset (the cpuset cgroup path).
        cs = _clean(fs.read("proc/self/cpuset", strict=False))
        if cs:
            own = {"": cs, "cpuset": cs}
    dirs: list[str] = []
    for point, fstype, opts in mounts:
        if fstype == "cgroup2" and "" in own:
            rel = own[""]
        elif fstype == "cgroup" and controller in opts and controller in own:
            rel = own[controller]
        else:
            continue
        parts = [p for p in rel.split("/") if p]
        if ".." in parts or "\x00" in rel:
            continue
        for depth in range(len(parts), -1, -1):
            dirs.append("/".join([point.rstrip("/")] + parts[:depth]))
    return dirs


def _read_cgroup_list(fs: _Fs, names: tuple, limit: int) -> tuple[Optional[frozenset], str]:
    """The first non-empty file of ``names`` in the deepest cgroup folder that has one."""
    for d in _cgroup_dirs(fs, "cpuset"):
        for name in names:
            rel = f"{d}/{name}".lstrip("/")
            text = fs.read(rel)
            if text is not None and _clean(text):
                return _parse(fs, text, rel, limit), f"cgroup cpuset /{rel}"
    return None, ""


def read_cgroup_cpuset(fs: _Fs, limit: int = cpulist.MAX_IDS) -> tuple[Optional[frozenset], str]:
    """The cgroup cpuset of the process: ``cpuset.cpus.effective`` (v2) or
    ``cpuset.effective_cpus`` / ``cpuset.cpus`` (v1) of the deepest cgroup that has one.
    Returns (logical CPU ids, "cgroup cpuset /PATH") or (None, "").

    Raises:
        TopologyError: the file is malformed or names a CPU id >= ``limit``.
    """
    return _read_cgroup_list(
        fs, ("cpuset.cpus.effective", "cpuset.effective_cpus", "cpuset.cpus"), limit)


def read_cgroup_mems(fs: _Fs) -> tuple[Optional[frozenset], str]:
    """The NUMA nodes the process's cgroup lets it allocate on: ``cpuset.mems.effective``
    (v2) or ``cpuset.effective_mems`` / ``cpuset.mems`` (v1) of the deepest cgroup that has
    one (Documentation/admin-guide/cgroup-v2.rst, "Cpuset Interface Files"). Returns
    (node ids, "cgroup cpuset /PATH") or (None, "").

    Raises:
        TopologyError: the file is malformed or names a node id >= ``cpulist.MAX_NODE_IDS``.
    """
    return _read_cgroup_list(
        fs, ("cpuset.mems.effective", "cpuset.effective_mems", "cpuset.mems"), cpulist.MAX_NODE_IDS)


def read_cpu_quota(fs: _Fs) -> tuple[Optional[float], str]:
    """CPU bandwidth limit in CPUs: the smallest ``cpu.max`` (v2) or
    ``cpu.cfs_quota_us / cpu.cfs_period_us`` (v1, quota -1: none) on the way up from the
    process's cgroup (Documentation/admin-guide/cgroup-v2.rst, "CPU Interface Files").

    Raises:
        TopologyError: one of those files is malformed (named in the message).
    """
    best: Optional[float] = None
    where = ""
    for d in _cgroup_dirs(fs, "cpu"):
        q = None
        rel = f"{d}/cpu.max".lstrip("/")
        text = fs.read(rel)
        if text is not None and _clean(text):
            try:
                q = parse_cpu_max(text)
            except ValueError as exc:
                raise corrupt(fs.root, "/" + rel, str(exc)) from None
        else:
            q = _read_cfs_quota(fs, d)
        if q is not None and (best is None or q < best):
            best, where = q, d
    return best, where


def _read_cfs_quota(fs: _Fs, d: str) -> Optional[float]:
    """cgroup v1 ``cpu.cfs_quota_us / cpu.cfs_period_us`` in CPUs; None: no quota."""
    qrel, prel = f"{d}/cpu.cfs_quota_us".lstrip("/"), f"{d}/cpu.cfs_period_us".lstrip("/")
    quota, period = _clean(fs.read(qrel)), _clean(fs.read(prel))
    if not quota or quota == "-1":
        return None
    if _count(quota) is None or not _count(quota):
        raise corrupt(fs.root, "/" + qrel,
                      f"expected -1 or a positive number of microseconds, found {excerpt(quota)}")
    if not period:
        return None
    if not _count(period):
        raise corrupt(fs.root, "/" + prel,
                      f"expected a positive number of microseconds, found {excerpt(period)}")
    return _count(quota) / _count(period)


def _status_list(fs: _Fs, status: Optional[str], key: str, limit: int) -> Optional[frozenset]:
    """``key`` (e.g. Cpus_allowed_list) of proc/self/status text, parsed; None if absent."""
    m = re.search(rf"^{key}:[ \t]*([^\n]*)$", status or "", re.M)
    if m is None:
        return None
    try:
        return cpulist.parse(m.group(1), limit)
    except CpulistError as exc:
        raise corrupt(fs.root, "/proc/self/status", f"{key}: {exc}") from None


# --------------------------------------------------------------------------- the probe


def _read_limits(fs: "_Fs", live: bool, limit: int) -> dict:
    """The process's limits as RawHost fields: allowed CPUs and where that comes from, the
    cgroup cpuset, allowed memory nodes and the CPU quota (rules in :func:`read_raw`)."""
    cpuset, cpuset_source = read_cgroup_cpuset(fs, limit)
    status = fs.read("proc/self/status", strict=False)
    if live:
        allowed: Optional[frozenset] = frozenset(os.sched_getaffinity(0))
        allowed_source = "the affinity mask of this process"
    else:
        allowed, allowed_source = cpuset, cpuset_source
        if allowed is None:
            allowed = _status_list(fs, status, "Cpus_allowed_list", limit)
            allowed_source = ("Cpus_allowed_list of proc/self/status" if allowed is not None
                              else "all online CPUs (no cpuset in the dump)")
    mems, mems_source = read_cgroup_mems(fs)
    if mems is None:
        mems = _status_list(fs, status, "Mems_allowed_list", cpulist.MAX_NODE_IDS)
        mems_source = "Mems_allowed_list of proc/self/status" if mems is not None else ""
    quota, quota_where = read_cpu_quota(fs)
    return {"allowed": allowed, "allowed_source": allowed_source, "cpuset": cpuset,
            "quota_cpus": quota, "quota_source": quota_where, "allowed_mems": mems,
            "allowed_mems_source": mems_source}


def read_raw(root: str | os.PathLike = "/", *, core_ids: bool = True) -> RawHost:
    """Read the raw topology text of the machine at ``root`` (a real ``/`` or a dump).

    Allowed CPUs: with root ``/``, ``os.sched_getaffinity(0)``; otherwise the dump's cgroup
    cpuset, else ``Cpus_allowed_list`` of ``proc/self/status``, else every online CPU.
    Allowed memory nodes (``RawHost.allowed_mems``), under any root: the cgroup's cpuset
    mems, else ``Mems_allowed_list`` of ``proc/self/status``, else None (all).
    ``lscpu -p`` is run only when sysfs holds no ``cpuN/topology`` folder. Every CPU list
    is bounded by the kernel's limit (``topology.cpu_limit``).

    ``core_ids=False`` skips each core's ``core_id`` file where its sibling list already
    groups the core: the kernel's core_id is display only (``Core.core_id`` is then None)
    and reading it is half of the per-core reads (issue 12). A launch passes False.

    Raises:
        TopologyError: a file is malformed, bigger than MAX_FILE_BYTES or not a regular
            file where one is needed (the message names it), or a cpuN/nodeN folder's id is
            beyond the limit.
    """
    fs = _Fs(root)
    live = os.path.realpath(fs.root) == "/"
    kernel_max = fs.read(f"{CPU_DIR}/kernel_max", strict=False)
    possible = fs.read(f"{CPU_DIR}/possible", strict=False)
    limit = cpu_limit(kernel_max, possible)
    online_text = fs.read(f"{CPU_DIR}/online")
    folders = _numbered(fs.listdir(CPU_DIR), "cpu")
    if folders and folders[-1] >= limit:
        raise corrupt(fs.root, f"/{CPU_DIR}/cpu{folders[-1]}",
                      f"CPU id beyond the kernel's limit (ids must be below {limit})")
    nodes = _read_nodes(fs)
    need_links = any(rn.cpulist is None and rn.cpumap is None for rn in nodes.values())
    hybrid_core = fs.read("sys/devices/cpu_core/cpus")
    hybrid_atom = fs.read("sys/devices/cpu_atom/cpus")

    if _clean(online_text):
        online = _parse(fs, online_text, f"{CPU_DIR}/online", limit)
        cpus = {n: _NO_CPU for n in folders}
    else:  # no cpu/online: every folder's online file and topology/ decide
        cpus = {n: RawCpu(online=fs.read(f"{CPU_DIR}/cpu{n}/online"),
                          has_topology=fs.isdir(f"{CPU_DIR}/cpu{n}/topology")) for n in folders}
        online = online_from_folders(RawHost(cpus=cpus, root=fs.root, cpu_kernel_max=kernel_max,
                                             cpu_possible=possible))
    _read_cpus(fs, cpus, online, limit, need_links,
               want_speed=hybrid_atom is None or hybrid_core is None, core_ids=core_ids)

    limits = _read_limits(fs, live, limit)
    lscpu_text = None
    if not any(c.has_topology for c in cpus.values()):
        if fs.unusable and not live:
            # lscpu reads with blocking calls: a FIFO in the dump would hold it to its timeout.
            fs.notes.append("lscpu not run: the dump holds files that are not regular files")
        else:
            lscpu_text = run_lscpu(None if live else fs.root)

    return RawHost(
        cpu_online=online_text,
        cpu_present=fs.read(f"{CPU_DIR}/present"),
        cpus=cpus,
        nodes=nodes,
        node_has_memory=fs.read(f"{NODE_DIR}/has_memory"),
        hybrid_core_cpus=hybrid_core,
        hybrid_atom_cpus=hybrid_atom,
        cpuinfo=fs.read("proc/cpuinfo", strict=False, cap=CPUINFO_BYTES, truncate=True),
        lscpu=lscpu_text,
        cpu_possible=possible,
        cpu_kernel_max=kernel_max,
        root=fs.root,
        **limits,
        notes=tuple(fs.notes),
    )


_NO_CPU = RawCpu()
_COVERED = RawCpu(has_topology=True)  # a CPU whose facts other CPUs' lists gave


def _read_nodes(fs: _Fs) -> dict[int, RawNode]:
    """Each ``nodeN`` folder's cpulist (else cpumap) and meminfo."""
    nodes: dict[int, RawNode] = {}
    ids = _numbered(fs.listdir(NODE_DIR), "node")
    if ids and ids[-1] >= cpulist.MAX_NODE_IDS:
        raise corrupt(fs.root, f"/{NODE_DIR}/node{ids[-1]}",
                      f"node id beyond {cpulist.MAX_NODE_IDS - 1}")
    for n in ids:
        base = f"{NODE_DIR}/node{n}"
        text = fs.read(f"{base}/cpulist")
        nodes[n] = RawNode(
            cpulist=text,
            cpumap=fs.read(f"{base}/cpumap") if text is None else None,
            meminfo=fs.read(f"{base}/meminfo", strict=False),
        )
    return nodes


def _read_cpus(fs: _Fs, cpus: dict, online: frozenset, limit: int, need_links: bool,
               want_speed: bool, core_ids: bool = True) -> None:
    """Fill ``cpus`` (id -> RawCpu) for the online CPUs that have a folder, reading each
    shared fact once (see the module docstring)."""
    core_done: set[int] = set()  # named by a sibling list read so far
    pkg_done: set[int] = set()  # named by a package_cpus_list read so far
    speed = ["cpu_capacity", "cpufreq/cpuinfo_max_freq"] if want_speed else []
    first_core = True
    for cpu in sorted(online):
        old = cpus.get(cpu)
        if old is None:
            continue  # online but no cpuN folder: nothing to read
        if cpu in core_done and cpu in pkg_done and not need_links:
            cpus[cpu] = _COVERED if old is _NO_CPU else old._replace(has_topology=True)
            continue
        base = f"{CPU_DIR}/cpu{cpu}"
        topo = base + "/topology"
        fields: dict = {}
        if cpu not in core_done:
            fields = _read_core(fs, topo, limit, core_done, core_ids)
            for attr in list(speed) if speed else ():  # one value per core: SMT siblings share it
                text = fs.read(f"{base}/{attr}", strict=False)
                if text is None and first_core:
                    speed.remove(attr)  # build needs every core's value or none
                elif text is not None:
                    fields["cpu_capacity" if attr == "cpu_capacity" else "max_freq_khz"] = text
                    if first_core and attr == "cpu_capacity":
                        speed = [attr]  # capacity wins; the frequency is not needed
                        break
            first_core = False
        if cpu not in pkg_done:
            if "package_id" not in fields:
                fields["package_id"] = fs.read(topo + "/physical_package_id")
            if fields["package_id"] is not None:
                pcl = fs.read(topo + "/package_cpus_list")
                if _clean(pcl):
                    pkg_done.update(_parse(fs, pcl, topo + "/package_cpus_list", limit))
                    fields["package_cpus_list"] = pcl
        if need_links:
            fields["node_links"] = tuple(_numbered(fs.listdir(base), "node"))
        has_topology = old.has_topology or cpu in core_done or any(
            fields.get(k) is not None for k in (
                "thread_siblings_list", "thread_siblings", "core_id", "package_id"))
        if not has_topology:
            has_topology = fs.isdir(topo)
        cpus[cpu] = RawCpu(online=old.online, has_topology=has_topology, **fields)


def _read_core(fs: _Fs, topo: str, limit: int, core_done: set, core_ids: bool = True) -> dict:
    """RawCpu fields of the first CPU of a core: its sibling list (added to ``core_done``)
    and core_id; without a list, also die_id and physical_package_id (the fallback key)."""
    fields: dict = {}
    sibs = None
    rel = topo + "/thread_siblings_list"
    tsl = fs.read(rel)
    if _clean(tsl):
        sibs = _parse(fs, tsl, rel, limit)
        fields["thread_siblings_list"] = tsl
    else:
        ts = fs.read(topo + "/thread_siblings")
        if _clean(ts):
            sibs = _parse(fs, ts, topo + "/thread_siblings", limit, mask=True)
        fields["thread_siblings_list"], fields["thread_siblings"] = tsl, ts
    if core_ids or sibs is None:
        fields["core_id"] = fs.read(topo + "/core_id")
    if sibs is None:  # grouped by (package, die, core_id): needs all three
        fields["die_id"] = fs.read(topo + "/die_id")
        fields["package_id"] = fs.read(topo + "/physical_package_id")
    else:
        core_done.update(sibs)
    return fields


def run_lscpu(sysroot: Optional[str] = None) -> Optional[str]:
    """``LC_ALL=C lscpu -p=CPU,CORE,SOCKET,NODE [--sysroot DIR]`` output, or None."""
    exe = shutil.which("lscpu")
    if not exe:
        return None
    argv = [exe, "-p=CPU,CORE,SOCKET,NODE"] + (["--sysroot", sysroot] if sysroot else [])
    import subprocess  # a fallback only: off the launch path (issue 12)

    try:
        res = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=3,
            env={**os.environ, "LC_ALL": "C"}, stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


def probe(root: str | os.PathLike = "/", *, core_ids: bool = True) -> Topology:
    """The :class:`Topology` of the machine at ``root`` (see :func:`read_raw`, which also
    says what ``core_ids=False`` leaves out).

    Raises:
        topology.TopologyError: nothing usable was found under ``root``.
    """
    return build(read_raw(root, core_ids=core_ids))


def cpu_flags(root: str | os.PathLike = "/") -> frozenset:
    """CPU feature flags from ``proc/cpuinfo`` under ``root`` (fast: no py-cpuinfo)."""
    from cpulaunch.topology import parse_cpuinfo

    return parse_cpuinfo(_Fs(root).read("proc/cpuinfo", strict=False, cap=CPUINFO_BYTES,
                                        truncate=True))[0]


def run_quietly(argv: list, timeout: float = 10.0) -> tuple:
    """Run ``argv`` (looked up on PATH) with stdin from /dev/null; ``(exit code, output)``.

    ``output`` is its stdout and stderr together (at most 64 KiB, decoded with errors
    replaced); the exit code is shell-style (128+N for signal N). Uses os.posix_spawnp and a
    pipe, not :mod:`subprocess`, whose import costs about 4 ms of start-up (issue 12) for
    the one short exec a launch makes.

    Raises:
        OSError: the program cannot be started (ENOENT, EACCES...).
        TimeoutError: it ran longer than ``timeout`` seconds (it is then SIGKILLed and reaped).
    """
    import select
    import signal  # only live runs check numactl: a --sysroot dry-run does not need it
    import time

    r, w = os.pipe()  # both O_CLOEXEC; dup2 makes the child's 1 and 2 inheritable
    try:
        pid = os.posix_spawnp(argv[0], list(argv), os.environ, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, w, 1),
            (os.POSIX_SPAWN_DUP2, w, 2),
        ], setsigdef=(signal.SIGPIPE, signal.SIGINT, signal.SIGXFSZ))
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    chunks, size = [], 0
    deadline = time.monotonic() + timeout
    try:
        poller = select.poll()
        poller.register(r, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise TimeoutError(f"timed out after {timeout:g} s")
            data = os.read(r, 65536)
            if not data:
                break
            if size < 65536:
                chunks.append(data)
                size += len(data)
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    return _exit_code(status), b"".join(chunks)[:65536].decode(errors="replace")


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def check_numactl(numactl: str, prefixes: list, timeout: float = 10.0) -> Optional[str]:
    """Run each planned ``numactl ... true`` once; None if all work, else numactl's reason.

    Checks the CPUs and nodes actually planned (not CPU 0 and node 0): a container without
    CAP_SYS_NICE gets ``set_mempolicy: Operation not permitted`` only for some policies,
    and a cpuset may refuse some CPUs. One short exec per distinct prefix, through
    :func:`run_quietly` (no subprocess import).
    """
    seen = set()
    for prefix in prefixes:
        key = tuple(prefix)
        if key in seen:
            continue
        seen.add(key)
        try:
            code, output = run_quietly(list(prefix) + ["true"], timeout)
        except (OSError, TimeoutError) as exc:
            return f"{' '.join(prefix)} could not run ({exc})"
        if code != 0:
            msg = output.strip().splitlines()
            return f"`{' '.join(prefix)}` failed: {msg[-1] if msg else 'exit %d' % code}"
    return None
