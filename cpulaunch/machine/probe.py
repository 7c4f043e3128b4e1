"""Every read of the host: sysfs and procfs under a root directory, cgroups, affinity, lscpu.

``root`` has the meaning of ``lscpu --sysroot`` / hwloc's ``HWLOC_FSROOT``: every path is
read below it. With the default root ``/`` the process's own affinity mask
(``os.sched_getaffinity``) is the allowed set, since that is what a container's cpuset, a
Slurm task binding or ``taskset`` hands us; under another root the dump's cgroup cpuset
stands in for it.

Files are read with plain ``os`` calls, regular files only (``O_NONBLOCK``, then
``fstat``: a FIFO or device in place of a sysfs file never blocks) and at most
:data:`MAX_FILE_BYTES` each, and each is parsed where it is read, into
:class:`topology.HostFacts`; :func:`topology.build` is then set algebra over those facts.

Corrupt input (what each file may hold, and what happens otherwise). Every malformed
file gives a :class:`topology.TopologyError` whose one-line message names the file as read
under the root (``/sys/devices/system/cpu/online: bad item '' in cpulist '1,,2'; ...``):

- fatal when malformed: every CPU or node list (``cpu/online``, ``cpu/present``,
  ``nodeN/cpulist``, ``nodeN/cpumap``, ``node/has_memory``, ``thread_siblings_list``,
  ``thread_siblings``, ``package_cpus_list``, ``cpu_atom/cpus``, the cgroup's cpuset
  files, ``Cpus_allowed_list``/``Mems_allowed_list``), the numeric ids
  (``physical_package_id``, ``die_id``, ``core_id``, ``cpuN/online``) where they are read,
  ``cpu.max`` and the cfs quota files, any id at or above the bound (CPU ids below
  :func:`cpu_limit`, node ids below ``cpulist.MAX_NODE_IDS``), and a non-regular file
  (FIFO, device, folder) or a file over 1 MiB where one of those is read;
- tolerated as the kernel writes them: a trailing newline and NUL bytes; an empty
  ``cpu/online`` (online CPUs then come from per-CPU folders), an empty node cpulist
  (a memory-only node), an empty sibling list (cores then grouped by ``core_id``), an
  empty numeric id file (as if absent);
- ignored with a note, in the order the files are read (they refine, they do not decide):
  ``cpu/kernel_max`` and ``cpu/possible`` that do not parse (the bound falls back to
  ``cpulist.MAX_IDS``), ``nodeN/meminfo`` without a ``MemTotal`` line, ``cpu_capacity``
  and ``cpuinfo_max_freq`` that are not numbers (no E-core detection from them),
  ``proc/cpuinfo`` (free text; only its first 64 KiB are read; its first processor's
  identifiers name the platform: :mod:`cpulaunch.machine.platform`), arm64's
  ``cpu0/regs/identification/midr_el1`` (read only when cpuinfo names no implementer), and these files or
  ``proc/self/{status,cgroup,mounts}`` when unreadable (permission denied, not a regular
  file, over the size bound): then they count as absent;
- ignored silently: lines of ``proc/self/cgroup`` / ``proc/mounts`` that are not in the
  kernel's format, and a cgroup path with a ``..`` component (never followed out of the
  root).

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

The parsers of whole files are pure functions of text (``parse_*`` here).
"""

from __future__ import annotations

import os

from cpulaunch import cpulist
from cpulaunch import log as _log
from cpulaunch.cpulist import DIGITS, CpulistError, excerpt, is_digits
from cpulaunch.errors import CpulaunchError, printable
from cpulaunch.machine import platform
from cpulaunch.machine.files import FileReader, corrupt
from cpulaunch.machine.topology import (
    CacheFacts,
    CpuFacts,
    HostFacts,
    NodeFacts,
    Topology,
    build,
    online_from_folders,
)
from cpulaunch.records import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Mapping, Optional

__all__ = [
    "probe",
    "read_facts",
    "check_sysroot",
    "is_live",
    "cpu_limit",
    "parse_proc_cgroup",
    "cpuset_file",
    "parse_cpuset",
    "CPUSET_FILES",
    "parse_mounts",
    "parse_cpu_max",
    "parse_cpuinfo",
    "parse_lscpu",
    "run_lscpu",
]

log = _log.get(__name__)

CPU_DIR = "sys/devices/system/cpu"
NODE_DIR = "sys/devices/system/node"
#: Where the files live, as shown in messages (below the root).
CPU_PATH = "/" + CPU_DIR
NODE_PATH = "/" + NODE_DIR
#: Largest lscpu -p output read (8,192 CPUs make about 110 KiB).
LSCPU_BYTES = 4 << 20
#: Of /proc/cpuinfo only the first processor is used: 1,024 CPUs make it 1.5 MB.
CPUINFO_BYTES = 64 << 10


def _numbered(names: list[str], prefix: str) -> list[int]:
    """Ids of entries named PREFIX<N> (N in at most 10 ASCII digits, no leading zero),
    ascending: ``["cpu0", "cpu12", "cpufreq", "cpu01"]`` -> ``[0, 12]``."""
    size = len(prefix)
    tails = [name[size:] for name in names if name.startswith(prefix)]
    ids = [int(t) for t in tails if t and not t.strip(DIGITS) and len(t) <= 10 and (t[0] != "0" or t == "0")]
    ids.sort()
    return ids


def _strip_value(text: Optional[str]) -> str:
    return "" if text is None else text.replace("\x00", "").strip(" \t\n")


def _parse(fs: FileReader, text: str, rel: str, limit: int, mask: bool = False) -> frozenset:
    """``text`` of ``rel`` as a cpulist (or mask) bounded by ``limit``; errors name the file."""
    try:
        return (cpulist.parse_mask if mask else cpulist.parse)(text, limit)
    except CpulistError as exc:
        raise corrupt(fs.root, "/" + rel, str(exc)) from None


def check_sysroot(root: str | os.PathLike) -> None:
    """Refuse a ``--sysroot`` that is not a folder.

    Raises:
        CpulaunchError: ``--sysroot ROOT: no such folder``.
    """
    if not os.path.isdir(root):
        raise CpulaunchError(f"--sysroot {printable(os.fspath(root))}: no such folder")


def is_live(root: str | os.PathLike) -> bool:
    """True when ``root`` is this running machine's ``/`` (links resolved), so that what is
    read below it may be acted on (numactl run, the process's own affinity taken)."""
    return os.path.realpath(root) == "/"


# --------------------------------------------------------------------------- parsing where read

def _is_int(text: str) -> bool:
    """``text`` is an optional minus and 1-10 ASCII digits (a sysfs id or count)."""
    digits = text[1:] if text[:1] == "-" else text
    return 0 < len(digits) <= 10 and not digits.strip(DIGITS)


def cpu_limit(kernel_max: Optional[str], possible: Optional[str],
              notes: Optional[list[str]] = None) -> int:
    """Exclusive bound on logical CPU ids: ``cpu/kernel_max`` + 1 (the kernel's NR_CPUS),
    else the highest id of ``cpu/possible`` + 1, else ``cpulist.MAX_IDS``; never above
    ``cpulist.MAX_IDS``. ``("8191\\n", None)`` -> 8192; ``(None, "0-111")`` -> 112.

    A file that does not parse is skipped with a note appended to ``notes`` (Documentation/
    ABI/testing/sysfs-devices-system-cpu: kernel_max is "the maximum CPU index allowed by
    the kernel configuration", possible the CPUs that could ever be brought online).
    """
    notes = notes if notes is not None else []
    if kernel_max is not None and _strip_value(kernel_max):
        text = _strip_value(kernel_max)
        if _is_int(text) and int(text) >= 0:
            if int(text) < cpulist.MAX_IDS:
                return int(text) + 1
            notes.append(f"{CPU_PATH}/kernel_max says {text}: CPU ids bounded at "
                         f"{cpulist.MAX_IDS} instead")
            return cpulist.MAX_IDS
        notes.append(f"{CPU_PATH}/kernel_max is not a CPU index ({excerpt(text)}): ignored")
    if possible is not None and _strip_value(possible):
        try:
            ids = cpulist.parse(possible, cpulist.MAX_IDS)
        except CpulistError as exc:
            notes.append(f"{CPU_PATH}/possible ignored: {exc}")
        else:
            if ids:
                return max(ids) + 1
    return cpulist.MAX_IDS


def _number(fs: "FileReader", text: Optional[str], rel: str) -> Optional[int]:
    """``text`` of the numeric id file ``rel`` (``physical_package_id``: ``"36\\n"`` -> 36,
    ``"-1"`` -> -1); None when absent or empty.

    Raises:
        TopologyError: anything but an integer (the message names the file).
    """
    body = _strip_value(text)
    if not body:
        return None
    if not _is_int(body):
        raise corrupt(fs.root, "/" + rel, f"expected an integer, found {excerpt(body)}")
    return int(body)


def _measure(fs: "FileReader", text: Optional[str], rel: str) -> Optional[int]:
    """``text`` of an optional non-negative number file (cpu_capacity, cpuinfo_max_freq);
    None when absent; anything else is None plus a note (these refine, they do not decide)."""
    if text is None:
        return None
    body = _strip_value(text)
    if body.isdigit() and body.isascii() and len(body) <= 18:
        return int(body)
    fs.notes.append(f"/{printable(rel)}: not a number ({excerpt(body)}): ignored")
    return None


def _meminfo_total_kb(text: Optional[str]) -> Optional[int]:
    """``MemTotal`` of a node's meminfo in KiB (``"Node 0 MemTotal:  16775084 kB"``)."""
    if not text:
        return None
    at = text.find("MemTotal:")
    while at >= 0:  # "MemTotal:", blanks, 1-18 digits, blanks, "kB"
        rest = text[at + 9:]
        value = rest.lstrip(" \t")
        digits = value[:len(value) - len(value.lstrip(DIGITS))]
        if len(value) < len(rest) and is_digits(digits, 18) and value[len(digits):].lstrip(" \t")[:2] == "kB":
            return int(digits)
        at = text.find("MemTotal:", at + 1)
    return None


def parse_cpuinfo(text: Optional[str]) -> tuple[frozenset[str], str]:
    """Feature flags and model name of the first processor in /proc/cpuinfo text.

    x86 calls them ``flags`` / ``model name``; arm64 ``Features`` / ``CPU part``; POWER ``cpu``.
    """
    if not text:
        return frozenset(), ""
    flags: frozenset[str] = frozenset()
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


def parse_lscpu(text: str) -> tuple[tuple[int, Optional[int], Optional[int], Optional[int]], ...]:
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
        vals = [int(f.strip()) if _is_int(f.strip()) else None for f in fields]
        if vals[0] is None or vals[0] < 0:
            continue
        rows.append((vals[0], vals[1], vals[2], vals[3]))
    return tuple(rows)


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


def parse_mounts(text: str) -> list[tuple[str, str, set[str]]]:
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


def _cgroup_dirs(fs: FileReader, controller: str) -> list[str]:
    """Candidate folders (relative to root) of this process's cgroup for ``controller``,
    deepest first, walking up to the mount point. Tries cgroup v2, then v1. A path with
    a ``..`` component (a corrupt dump) is not followed."""
    mounts = parse_mounts(fs.read("proc/self/mounts", strict=False, truncate=True)
                          or fs.read("proc/mounts", strict=False, truncate=True) or "")
    own_text = fs.read("proc/self/cgroup", strict=False)
    own = parse_proc_cgroup(own_text) if own_text else {}
    if not own:
        # Old dumps keep only /proc/self/cpuset (the cpuset cgroup path).
        cs = _strip_value(fs.read("proc/self/cpuset", strict=False))
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


def _read_cgroup_list(fs: FileReader, names: tuple, limit: int) -> tuple[Optional[frozenset], str]:
    """The first non-empty file of ``names`` in the deepest cgroup folder that has one."""
    for d in _cgroup_dirs(fs, "cpuset"):
        for name in names:
            rel = f"{d}/{name}".lstrip("/")
            text = fs.read(rel)
            if text is not None and _strip_value(text):
                return _parse(fs, text, rel, limit), f"cgroup cpuset /{rel}"
    return None, ""


#: The files holding a cgroup's CPUs, most telling first: v2, then v1's two names.
CPUSET_FILES = ("cpuset.cpus.effective", "cpuset.effective_cpus", "cpuset.cpus")


def cpuset_file(fs: FileReader) -> Optional[str]:
    """The file (relative to the root) :func:`read_cgroup_cpuset` reads, for a watcher
    that reads it again and again (``--follow-cpuset``); None when there is none."""
    for d in _cgroup_dirs(fs, "cpuset"):
        for name in CPUSET_FILES:
            rel = f"{d}/{name}".lstrip("/")
            text = fs.read(rel, strict=False)
            if text is not None and _strip_value(text):
                return rel
    return None


def parse_cpuset(fs: FileReader, rel: str, limit: int = cpulist.MAX_IDS) -> Optional[frozenset[int]]:
    """The CPUs in the cgroup file ``rel`` (:func:`cpuset_file`); None when it is gone or
    empty.

    Raises:
        TopologyError: the file is malformed.
    """
    text = fs.read(rel, strict=False)
    if text is None or not _strip_value(text):
        return None
    return _parse(fs, text, rel, limit)


def read_cgroup_cpuset(fs: FileReader, limit: int = cpulist.MAX_IDS) -> tuple[Optional[frozenset[int]], str]:
    """The cgroup cpuset of the process: ``cpuset.cpus.effective`` (v2) or
    ``cpuset.effective_cpus`` / ``cpuset.cpus`` (v1) of the deepest cgroup that has one.
    Returns (logical CPU ids, "cgroup cpuset /PATH") or (None, "").

    Raises:
        TopologyError: the file is malformed or names a CPU id >= ``limit``.
    """
    return _read_cgroup_list(fs, CPUSET_FILES, limit)


def read_cgroup_mems(fs: FileReader) -> tuple[Optional[frozenset[int]], str]:
    """The NUMA nodes the process's cgroup lets it allocate on: ``cpuset.mems.effective``
    (v2) or ``cpuset.effective_mems`` / ``cpuset.mems`` (v1) of the deepest cgroup that has
    one (Documentation/admin-guide/cgroup-v2.rst, "Cpuset Interface Files"). Returns
    (node ids, "cgroup cpuset /PATH") or (None, "").

    Raises:
        TopologyError: the file is malformed or names a node id >= ``cpulist.MAX_NODE_IDS``.
    """
    return _read_cgroup_list(
        fs, ("cpuset.mems.effective", "cpuset.effective_mems", "cpuset.mems"), cpulist.MAX_NODE_IDS)


def read_cpu_quota(fs: FileReader) -> tuple[Optional[float], str]:
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
        if text is not None and _strip_value(text):
            try:
                q = parse_cpu_max(text)
            except ValueError as exc:
                raise corrupt(fs.root, "/" + rel, str(exc)) from None
        else:
            q = _read_cfs_quota(fs, d)
        if q is not None and (best is None or q < best):
            best, where = q, d
    return best, where


def _read_cfs_quota(fs: FileReader, d: str) -> Optional[float]:
    """cgroup v1 ``cpu.cfs_quota_us / cpu.cfs_period_us`` in CPUs; None: no quota."""
    qrel, prel = f"{d}/cpu.cfs_quota_us".lstrip("/"), f"{d}/cpu.cfs_period_us".lstrip("/")
    quota, period = _strip_value(fs.read(qrel)), _strip_value(fs.read(prel))
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


def _status_list(fs: FileReader, status: Optional[str], key: str, limit: int) -> Optional[frozenset]:
    """``key`` (e.g. Cpus_allowed_list) of proc/self/status text, parsed; None if absent."""
    head = key + ":"
    line = next((ln for ln in (status or "").split("\n") if ln.startswith(head)), None)
    if line is None:
        return None
    try:
        return cpulist.parse(line[len(head):].lstrip(" \t"), limit)
    except CpulistError as exc:
        raise corrupt(fs.root, "/proc/self/status", f"{key}: {exc}") from None


# --------------------------------------------------------------------------- the probe


def _read_limits(fs: "FileReader", live: bool, limit: int) -> dict:
    """The process's limits as HostFacts fields: allowed CPUs and where that comes from, the
    cgroup cpuset, allowed memory nodes and the CPU quota (rules in :func:`read_facts`)."""
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


def _read_online(fs: "FileReader", text: Optional[str], folders: list[int],
                 limit: int) -> tuple[Optional[frozenset], dict[int, CpuFacts], frozenset]:
    """(``cpu/online`` parsed from ``text``, or None; {folder id: CpuFacts so far}; the
    online CPUs): without ``cpu/online``, each folder's ``online`` file and ``topology/``
    decide (:func:`topology.online_from_folders`).

    Raises:
        TopologyError: ``cpu/online`` malformed, or a ``cpuN/online`` holding anything but 0/1.
    """
    if _strip_value(text):
        online = _parse(fs, text, f"{CPU_DIR}/online", limit)
        return online, dict.fromkeys(folders, _NO_CPU), online
    cpus = {}
    for n in folders:
        rel = f"{CPU_DIR}/cpu{n}/online"
        state = _number(fs, fs.read(rel), rel)
        if state not in (None, 0, 1):
            raise corrupt(fs.root, "/" + rel, f"expected 0 or 1, found {state}")
        cpus[n] = CpuFacts(online=state, has_topology=fs.isdir(f"{CPU_DIR}/cpu{n}/topology"))
    return None, cpus, online_from_folders(HostFacts(cpus=cpus))


def _read_hybrid(fs: "FileReader", limit: int) -> tuple[Optional[frozenset], bool]:
    """(E-core CPUs of ``cpu_atom/cpus`` where ``cpu_core/cpus`` exists too, else None;
    whether either file is absent, so that E-cores may come from capacity or frequency)."""
    core = fs.read("sys/devices/cpu_core/cpus")
    atom = fs.read("sys/devices/cpu_atom/cpus")
    if core is None or atom is None:
        return None, True
    return _parse(fs, atom, "sys/devices/cpu_atom/cpus", limit), False


def read_facts(root: str | os.PathLike = "/", *, core_ids: bool = True,
               files: Optional[FileReader] = None, caches: bool = False) -> HostFacts:
    """Read and parse what the topology needs of the machine at ``root`` (a real ``/`` or a
    dump): each file is parsed where it is read, so an error names it.

    Allowed CPUs: with root ``/``, ``os.sched_getaffinity(0)``; otherwise the dump's cgroup
    cpuset, else ``Cpus_allowed_list`` of ``proc/self/status``, else every online CPU.
    Allowed memory nodes (``HostFacts.allowed_mems``), under any root: the cgroup's cpuset
    mems, else ``Mems_allowed_list`` of ``proc/self/status``, else None (all).
    ``lscpu -p`` is run only when sysfs holds no ``cpuN/topology`` folder. Every CPU list
    is bounded by the kernel's limit (:func:`cpu_limit`).

    ``core_ids=False`` skips each core's ``core_id`` file where its sibling list already
    groups the core: the kernel's core_id is display only (``Core.core_id`` is then None)
    and reading it is half of the per-core reads (issue 12). A launch passes False.

    ``files``: the reader to read through (default a new ``FileReader(root)``; ``root`` is
    then ignored). A caller that passes its own sees afterwards, in ``files.skipped``, every
    file that was present but not read (``cpulaunch doctor`` reports them).

    ``caches=True`` also reads which CPUs share each L3 and each L2 or cluster
    (:func:`read_caches`); otherwise ``HostFacts.caches`` is None (not read). A launch
    asks for them only where its plan divides a socket or node (``cpulaunch.placement.cache_need``).

    Raises:
        TopologyError: a file is malformed, bigger than MAX_FILE_BYTES or not a regular
            file where one is needed (the message names it), or a cpuN/nodeN folder's id is
            beyond the limit.
    """
    fs = FileReader(root) if files is None else files
    live = is_live(fs.root)
    limit = cpu_limit(fs.read(f"{CPU_DIR}/kernel_max", strict=False),
                      fs.read(f"{CPU_DIR}/possible", strict=False), fs.notes)
    online_text = fs.read(f"{CPU_DIR}/online")
    folders = _numbered(fs.listdir(CPU_DIR), "cpu")
    if folders and folders[-1] >= limit:
        raise corrupt(fs.root, f"/{CPU_DIR}/cpu{folders[-1]}",
                      f"CPU id beyond the kernel's limit (ids must be below {limit})")
    nodes = _read_nodes(fs, limit)
    online_file, cpus, online = _read_online(fs, online_text, folders, limit)
    hybrid_atom, want_speed = _read_hybrid(fs, limit)
    _read_cpus(fs, cpus, online, limit, need_links=any(nf.cpus is None for nf in nodes.values()),
               want_speed=want_speed, core_ids=core_ids)
    limits = _read_limits(fs, live, limit)
    lscpu = None
    if not any(c.has_topology for c in cpus.values()):
        if fs.unusable and not live:
            # lscpu reads with blocking calls: a FIFO in the dump would hold it to its timeout.
            fs.notes.append("lscpu not run: the dump holds files that are not regular files")
        else:
            text = run_lscpu(None if live else fs.root)
            lscpu = parse_lscpu(text) if text is not None else None
    present = fs.read(f"{CPU_DIR}/present")
    has_memory = fs.read(f"{NODE_DIR}/has_memory")
    cpuinfo = fs.read("proc/cpuinfo", strict=False, cap=CPUINFO_BYTES, truncate=True)
    flags, model = parse_cpuinfo(cpuinfo)
    cpu_id = platform.parse_cpuid(cpuinfo)
    if cpu_id.arch == "arm64" and cpu_id.implementer is None:  # no ids in cpuinfo: arm64's MIDR
        cpu_id = platform.parse_cpuid(cpuinfo, fs.read(platform.MIDR_FILE, strict=False))
    cache_facts = read_caches(fs, online, cpus, limit) if caches else None
    return HostFacts(
        online=online_file, cpus=cpus, nodes=nodes, hybrid_atom=hybrid_atom, lscpu=lscpu,
        present=None if present is None else _parse(fs, present, f"{CPU_DIR}/present", limit),
        has_memory=(None if has_memory is None
                    else _parse(fs, has_memory, f"{NODE_DIR}/has_memory", cpulist.MAX_NODE_IDS)),
        flags=flags, model=model, cpu=cpu_id, cpu_limit=limit, root=fs.root, **limits, notes=tuple(fs.notes),
        caches=cache_facts,
    )


_NO_CPU = CpuFacts()
_COVERED = CpuFacts(has_topology=True)  # a CPU whose facts other CPUs' lists gave


def _read_nodes(fs: "FileReader", limit: int) -> dict[int, NodeFacts]:
    """Each ``nodeN`` folder's CPUs (cpulist, else cpumap) and MemTotal (meminfo)."""
    nodes: dict[int, NodeFacts] = {}
    ids = _numbered(fs.listdir(NODE_DIR), "node")
    if ids and ids[-1] >= cpulist.MAX_NODE_IDS:
        raise corrupt(fs.root, f"/{NODE_DIR}/node{ids[-1]}",
                      f"node id beyond {cpulist.MAX_NODE_IDS - 1}")
    for n in ids:
        base = f"{NODE_DIR}/node{n}"
        cpus, text = None, fs.read(f"{base}/cpulist")
        if text is not None:
            cpus = _parse(fs, text, f"{base}/cpulist", limit)
        else:
            text = fs.read(f"{base}/cpumap")
            if text is not None:
                cpus = _parse(fs, text, f"{base}/cpumap", limit, mask=True)
        meminfo = fs.read(f"{base}/meminfo", strict=False)
        total = _meminfo_total_kb(meminfo)
        if meminfo is not None and total is None:
            fs.notes.append(f"{NODE_PATH}/node{n}/meminfo: no 'MemTotal: N kB' line; "
                            f"memory size of node {n} unknown")
        nodes[n] = NodeFacts(cpus=cpus, mem_total_kb=total, meminfo_read=meminfo is not None)
    return nodes


def _read_speed(fs: "FileReader", base: str, speed: list[str], first_core: bool) -> dict:
    """CpuFacts fields ``capacity``/``max_freq_khz`` of one core's first CPU; ``speed``
    (the attributes still worth reading) shrinks on the first core: an attribute it lacks
    is never read again (build needs every core's value or none), and cpu_capacity, when
    there, is the only one read."""
    fields: dict = {}
    for attr in list(speed):
        text = fs.read(f"{base}/{attr}", strict=False)
        if text is None and first_core:
            speed.remove(attr)
        elif text is not None:
            fields["capacity" if attr == "cpu_capacity" else "max_freq_khz"] = _measure(
                fs, text, f"{base}/{attr}")
            if first_core and attr == "cpu_capacity":
                speed[:] = [attr]  # capacity wins; the frequency is not needed
                break
    return fields


def _read_cpus(fs: "FileReader", cpus: dict, online: frozenset, limit: int, need_links: bool,
               want_speed: bool, core_ids: bool = True) -> None:
    """Fill ``cpus`` (id -> CpuFacts) for the online CPUs that have a folder, reading each
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
        found: set[str] = set()  # topology files that exist
        if cpu not in core_done:
            fields, found = _read_core(fs, topo, limit, core_done, core_ids)
            if speed:  # one value per core: SMT siblings share it
                fields.update(_read_speed(fs, base, speed, first_core))
            first_core = False
        if cpu not in pkg_done:
            _read_package(fs, topo, limit, fields, found, pkg_done)
        if need_links:
            fields["node_links"] = tuple(_numbered(fs.listdir(base), "node"))
        has_topology = old.has_topology or cpu in core_done or bool(found) or fs.isdir(topo)
        cpus[cpu] = CpuFacts(online=old.online, has_topology=has_topology, **fields)


def _read_package(fs: "FileReader", topo: str, limit: int, fields: dict, found: set[str],
                  pkg_done: set[int]) -> None:
    """Add ``package_id`` (unless read already) and, where the id file exists,
    ``package_cpus`` to ``fields``, its CPUs to ``pkg_done``, the files found to ``found``."""
    rel = topo + "/physical_package_id"
    if "package_id" not in fields:
        text = fs.read(rel)
        if text is not None:
            found.add("physical_package_id")
        fields["package_id"] = _number(fs, text, rel)
    if "physical_package_id" in found:
        pcl = fs.read(topo + "/package_cpus_list")
        if _strip_value(pcl):
            fields["package_cpus"] = _parse(fs, pcl, topo + "/package_cpus_list", limit)
            pkg_done.update(fields["package_cpus"])


def _read_core(fs: "FileReader", topo: str, limit: int, core_done: set[int],
               core_ids: bool = True) -> tuple[dict, set[str]]:
    """(CpuFacts fields of the first CPU of a core, the topology files that exist): its
    sibling list (added to ``core_done``) and core_id; without a list, also die_id and
    physical_package_id (the fallback key)."""
    fields: dict = {}
    found: set[str] = set()
    sibs = None
    for name, mask in (("thread_siblings_list", False), ("thread_siblings", True)):
        text = fs.read(f"{topo}/{name}")
        if text is not None:
            found.add(name)
        if _strip_value(text):
            sibs = _parse(fs, text, f"{topo}/{name}", limit, mask=mask)
            break
    fields["siblings"] = sibs or None
    names = (["core_id"] if core_ids or sibs is None else []) + (
        ["die_id", "physical_package_id"] if sibs is None else [])
    for name in names:  # grouped by (package, die, core_id) only without a sibling list
        text = fs.read(f"{topo}/{name}")
        if text is not None and name != "die_id":
            found.add(name)
        fields["package_id" if name == "physical_package_id" else name] = _number(fs, text, f"{topo}/{name}")
    if sibs is not None:
        core_done.update(sibs)
    return fields, found


# --------------------------------------------------------------------------- caches

#: Cache types that hold data: an L2 or L3 is "Unified" (never "Instruction").
_DATA_CACHES = ("Unified", "Data")
_SIZE_SHIFT = {"K": 0, "M": 10, "G": 20}


def parse_cache_size(text: str) -> Optional[int]:
    """A cache ``size`` file in KiB: ``"32768K"`` -> 32768, ``"1M"`` -> 1024 (the kernel
    writes ``%uK``, Documentation/ABI/testing/sysfs-devices-system-cpu); None when it is
    anything else."""
    body = _strip_value(text)
    unit = body[-1:] if body[-1:] in _SIZE_SHIFT else ""
    digits = body[:len(body) - len(unit)]
    if not is_digits(digits, 12):
        return None
    return int(digits) << _SIZE_SHIFT.get(unit, 0)


class _CacheIndexes:
    """Which ``cpuN/cache/indexK`` holds a cache level. The first CPU's folder is scanned
    (``level`` of each index, ``type`` of those at the level sought); for the next domains
    one ``level`` read confirms that the same K holds it (else that CPU is scanned too)."""

    def __init__(self, fs: FileReader) -> None:
        self.fs = fs
        self.known: dict[int, int] = {}  # level -> index number
        self.scanned: dict[int, dict[int, Optional[int]]] = {}  # cpu -> {index number: level}

    def _level(self, rel: str) -> Optional[int]:
        return _measure(self.fs, self.fs.read(rel + "/level", strict=False), rel + "/level")

    def find(self, cpu: int, level: int) -> Optional[str]:
        """``cpuN/cache/indexK`` (below the root) holding ``cpu``'s cache of ``level``, or None."""
        base = f"{CPU_DIR}/cpu{cpu}/cache"
        k = self.known.get(level)
        if k is not None and cpu not in self.scanned and self._level(f"{base}/index{k}") == level:
            return f"{base}/index{k}"
        levels = self.scanned.get(cpu)
        if levels is None:
            levels = self.scanned[cpu] = {k: self._level(f"{base}/index{k}")
                                          for k in _numbered(self.fs.listdir(base), "index")}
        for k, found in levels.items():
            rel = f"{base}/index{k}"
            if found == level and _strip_value(self.fs.read(rel + "/type", strict=False)) in _DATA_CACHES:
                self.known[level] = k
                return rel
        return None


def _shared_cpus(fs: FileReader, rel: str, limit: int) -> Optional[frozenset]:
    """The CPUs of the cache folder ``rel``'s ``shared_cpu_list`` (else its
    ``shared_cpu_map``; POWER kernels leave the list empty), or of the file ``rel`` itself
    when it is not a cache folder. None when absent or empty; ``frozenset()`` when
    malformed (with a note)."""
    names = [("shared_cpu_list", False), ("shared_cpu_map", True)] if "/cache/" in rel else [("", False)]
    for name, mask in names:
        path = f"{rel}/{name}" if name else rel
        text = fs.read(path, strict=False)
        if not _strip_value(text):
            continue
        try:
            return (cpulist.parse_mask if mask else cpulist.parse)(text, limit)
        except CpulistError as exc:
            fs.notes.append(f"/{printable(path)}: {exc}: ignored")
            return frozenset()
    return None


def _walk_domains(fs: FileReader, order: list, limit: int, label: str, locate, sized) -> tuple:
    """``(cpus, size in KiB)`` of each domain of one level, read once per domain: the
    online CPUs are walked upwards and a CPU that a list read so far names is skipped.
    ``locate(cpu)``: the file or cache folder to read for ``cpu``, None where it has none;
    ``sized(cpu, members)``: whether to read its ``size``. () when the first CPU has no
    such domain, and () with a note where a list is missing for a later CPU, malformed,
    does not name its own CPU or overlaps an earlier one (they only refine placement)."""
    covered: set = set()
    out = []
    for cpu in order:
        if cpu in covered:
            continue
        rel = locate(cpu)
        members = None if rel is None else _shared_cpus(fs, rel, limit)
        if not members:
            if out and members is None:
                fs.notes.append(f"{CPU_PATH}/cpu{cpu}: no {label} list, unlike CPU {order[0]}: "
                                f"{label} domains not used")
            elif members is not None:
                fs.notes.append(f"{label} domains not used (a malformed list)")
            return ()
        if cpu not in members or not members.isdisjoint(covered):
            fs.notes.append(f"/{printable(rel)}: CPUs {cpulist.format(members)} do not form a domain "
                            f"with the lists read before: {label} domains not used")
            return ()
        covered.update(members)
        size = None
        if "/cache/" in rel and sized(cpu, members):
            text = fs.read(rel + "/size", strict=False)
            size = None if text is None else parse_cache_size(text)
            if text is not None and size is None:
                fs.notes.append(f"/{printable(rel)}/size: not a size ({excerpt(_strip_value(text))}): ignored")
        out.append((members, size))
    return tuple(out)


def read_caches(fs: FileReader, online: frozenset[int], cpus: Mapping[int, CpuFacts],
                limit: int) -> CacheFacts:
    """Which online CPUs share each L3, and each L2 or cluster: one list per domain (see
    :func:`_walk_domains`), the first CPU's cache folder scanned once (:class:`_CacheIndexes`).

    Reads: the first CPU's ``cache/index*/level`` (and ``type`` at level 3), then per L3
    domain its ``level`` (the first domain's was read by the scan), ``shared_cpu_list`` and
    ``size``; per cluster its ``topology/cluster_cpus_list``. Without cluster files (the
    first CPU has none, or they are unusable), per L2 its ``level``, ``shared_cpu_list``,
    and ``size`` where it groups several cores.
    Malformed or unusable files are notes: caches refine placement, they never decide it.

    Args:
        fs: the reader (notes go to ``fs.notes``).
        online: online logical CPUs; cpus: the CpuFacts read so far (only CPUs with a
            cpuN folder are visited; ``siblings`` tells a private L2 from a shared one).
        limit: exclusive bound on CPU ids.
    """
    order = [c for c in sorted(online) if c in cpus]
    if not order:
        return CacheFacts()
    indexes = _CacheIndexes(fs)
    l3 = _walk_domains(fs, order, limit, "L3", lambda cpu: indexes.find(cpu, 3), lambda cpu, m: True)
    l2 = _walk_domains(fs, order, limit, "cluster",
                       lambda cpu: f"{CPU_DIR}/cpu{cpu}/topology/cluster_cpus_list", lambda cpu, m: False)
    if l2:
        return CacheFacts(l3=l3, l2=l2, l2_kind="cluster")

    def several_cores(cpu: int, members: frozenset) -> bool:
        return not members <= (cpus[cpu].siblings or frozenset({cpu}))

    l2 = _walk_domains(fs, order, limit, "L2", lambda cpu: indexes.find(cpu, 2), several_cores)
    return CacheFacts(l3=l3, l2=l2, l2_kind="L2" if l2 else "")


def run_lscpu(sysroot: Optional[str] = None) -> Optional[str]:
    """``LC_ALL=C lscpu -p=CPU,CORE,SOCKET,NODE [--sysroot DIR]`` output, or None (lscpu
    missing, failing or slower than 3 s)."""
    from cpulaunch.machine.exec import run_quietly  # a fallback only: off the launch path

    argv = ["lscpu", "-p=CPU,CORE,SOCKET,NODE"] + (["--sysroot", sysroot] if sysroot else [])
    try:
        code, out = run_quietly(argv, timeout=3, env={**os.environ, "LC_ALL": "C"}, stderr=False,
                                max_output=LSCPU_BYTES)
    except (OSError, TimeoutError):
        return None
    return out if code == 0 else None


def probe(root: str | os.PathLike = "/", *, core_ids: bool = True, caches: bool = False) -> Topology:
    """The :class:`Topology` of the machine at ``root`` (see :func:`read_facts`, which also
    says what ``core_ids=False`` leaves out and what ``caches=True`` adds).

    Raises:
        topology.TopologyError: nothing usable was found under ``root``, or a file is malformed.
    """
    return build(read_facts(root, core_ids=core_ids, caches=caches))
