"""Every read of the host: sysfs and procfs under a root directory, cgroups, affinity, lscpu.

``root`` has the meaning of ``lscpu --sysroot`` / hwloc's ``HWLOC_FSROOT``: every path is
read below it. With the default root ``/`` the process's own affinity mask
(``os.sched_getaffinity``) is the allowed set, since that is what a container's cpuset, a
Slurm task binding or ``taskset`` hands us; under another root the dump's cgroup cpuset
stands in for it.

The parsing of what is read is pure (``parse_*`` functions here, :func:`topology.build`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Optional

from cpulaunch import cpulist
from cpulaunch.topology import RawCpu, RawHost, RawNode, Topology, build

__all__ = [
    "probe",
    "read_raw",
    "parse_proc_cgroup",
    "parse_mounts",
    "parse_cpu_max",
    "cpu_flags",
]

log = logging.getLogger(__name__)

CPU_DIR = "sys/devices/system/cpu"
NODE_DIR = "sys/devices/system/node"


class _Fs:
    """Reads text below ``root``; absent or unreadable files read as None."""

    def __init__(self, root: str | os.PathLike = "/"):
        self.root = Path(root)

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def read(self, rel: str) -> Optional[str]:
        try:
            return self.path(rel).read_text(errors="replace")
        except (OSError, ValueError):
            return None

    def listdir(self, rel: str) -> list[str]:
        try:
            return os.listdir(self.path(rel))
        except OSError:
            return []

    def isdir(self, rel: str) -> bool:
        return self.path(rel).is_dir()


def _numbered(names: list[str], prefix: str) -> list[int]:
    pat = re.compile(re.escape(prefix) + r"(\d+)$")
    return sorted(int(m.group(1)) for m in map(pat.match, names) if m)


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


def parse_cpu_max(text: str) -> Optional[float]:
    """cgroup v2 ``cpu.max`` (``"200000 100000"`` -> 2.0; ``"max 100000"`` -> None)."""
    f = text.split()
    if len(f) < 1 or f[0] == "max":
        return None
    period = int(f[1]) if len(f) > 1 else 100000
    return int(f[0]) / period if period > 0 else None


def _cgroup_dirs(fs: _Fs, controller: str) -> list[str]:
    """Candidate folders (relative to root) of this process's cgroup for ``controller``,
    deepest first, walking up to the mount point. Tries cgroup v2, then v1."""
    mounts = parse_mounts(fs.read("proc/self/mounts") or fs.read("proc/mounts") or "")
    own_text = fs.read("proc/self/cgroup")
    own = parse_proc_cgroup(own_text) if own_text else {}
    if not own:
        # Old dumps keep only /proc/self/cpuset (the cpuset cgroup path).
        cs = (fs.read("proc/self/cpuset") or "").strip()
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
        for depth in range(len(parts), -1, -1):
            dirs.append("/".join([point.rstrip("/")] + parts[:depth]))
    return dirs


def read_cgroup_cpuset(fs: _Fs) -> tuple[Optional[frozenset], str]:
    """The cgroup cpuset of the process: ``cpuset.cpus.effective`` (v2) or
    ``cpuset.effective_cpus`` / ``cpuset.cpus`` (v1) of the deepest cgroup that has one."""
    for d in _cgroup_dirs(fs, "cpuset"):
        for name in ("cpuset.cpus.effective", "cpuset.effective_cpus", "cpuset.cpus"):
            text = fs.read(f"{d}/{name}")
            if text is not None and text.strip("\x00\n "):
                return cpulist.parse(text), f"cgroup cpuset {d}/{name}"
    return None, ""


def read_cpu_quota(fs: _Fs) -> tuple[Optional[float], str]:
    """CPU bandwidth limit in CPUs: the smallest ``cpu.max`` (v2) or
    ``cpu.cfs_quota_us / cpu.cfs_period_us`` (v1) on the way up from the process's cgroup
    (Documentation/admin-guide/cgroup-v2.rst, "CPU Interface Files")."""
    best: Optional[float] = None
    where = ""
    for d in _cgroup_dirs(fs, "cpu"):
        q = None
        text = fs.read(f"{d}/cpu.max")
        if text:
            try:
                q = parse_cpu_max(text)
            except ValueError:
                q = None
        else:
            quota = fs.read(f"{d}/cpu.cfs_quota_us")
            period = fs.read(f"{d}/cpu.cfs_period_us")
            try:
                if quota and period and int(quota) > 0 and int(period) > 0:
                    q = int(quota) / int(period)
            except ValueError:
                q = None
        if q is not None and (best is None or q < best):
            best, where = q, d
    return best, where


# --------------------------------------------------------------------------- the probe


def read_raw(root: str | os.PathLike = "/") -> RawHost:
    """Read the raw topology text of the machine at ``root`` (a real ``/`` or a dump).

    Allowed CPUs: with root ``/``, ``os.sched_getaffinity(0)``; otherwise the dump's cgroup
    cpuset, else ``Cpus_allowed_list`` of ``proc/self/status``, else every online CPU.
    ``lscpu -p`` is run only when sysfs holds no ``cpuN/topology`` folder.
    """
    fs = _Fs(root)
    live = Path(root).resolve() == Path("/")
    cpus: dict[int, RawCpu] = {}
    for n in _numbered(fs.listdir(CPU_DIR), "cpu"):
        base = f"{CPU_DIR}/cpu{n}"
        entries = fs.listdir(base)
        cpus[n] = RawCpu(
            online=fs.read(f"{base}/online"),
            has_topology="topology" in entries,
            package_id=fs.read(f"{base}/topology/physical_package_id"),
            die_id=fs.read(f"{base}/topology/die_id"),
            core_id=fs.read(f"{base}/topology/core_id"),
            thread_siblings_list=fs.read(f"{base}/topology/thread_siblings_list"),
            thread_siblings=fs.read(f"{base}/topology/thread_siblings"),
            node_links=tuple(_numbered(entries, "node")),
            cpu_capacity=fs.read(f"{base}/cpu_capacity"),
            max_freq_khz=fs.read(f"{base}/cpufreq/cpuinfo_max_freq"),
        )
    nodes: dict[int, RawNode] = {}
    for n in _numbered(fs.listdir(NODE_DIR), "node"):
        base = f"{NODE_DIR}/node{n}"
        nodes[n] = RawNode(
            cpulist=fs.read(f"{base}/cpulist"),
            cpumap=fs.read(f"{base}/cpumap"),
            meminfo=fs.read(f"{base}/meminfo"),
        )

    cpuset, cpuset_source = read_cgroup_cpuset(fs)
    if live:
        allowed: Optional[frozenset] = frozenset(os.sched_getaffinity(0))
        allowed_source = "the affinity mask of this process"
    else:
        allowed, allowed_source = cpuset, cpuset_source
        if allowed is None:
            status = fs.read("proc/self/status") or ""
            m = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M)
            if m:
                allowed, allowed_source = cpulist.parse(m.group(1)), "Cpus_allowed_list of proc/self/status"
            else:
                allowed_source = "all online CPUs (no cpuset in the dump)"
    quota, quota_where = read_cpu_quota(fs)

    lscpu_text = None
    if not any(c.has_topology for c in cpus.values()):
        lscpu_text = run_lscpu(None if live else str(root))

    return RawHost(
        cpu_online=fs.read(f"{CPU_DIR}/online"),
        cpu_present=fs.read(f"{CPU_DIR}/present"),
        cpus=cpus,
        nodes=nodes,
        node_has_memory=fs.read(f"{NODE_DIR}/has_memory"),
        hybrid_core_cpus=fs.read("sys/devices/cpu_core/cpus"),
        hybrid_atom_cpus=fs.read("sys/devices/cpu_atom/cpus"),
        cpuinfo=fs.read("proc/cpuinfo"),
        allowed=allowed,
        allowed_source=allowed_source,
        cpuset=cpuset,
        quota_cpus=quota,
        quota_source=quota_where,
        lscpu=lscpu_text,
    )


def run_lscpu(sysroot: Optional[str] = None) -> Optional[str]:
    """``LC_ALL=C lscpu -p=CPU,CORE,SOCKET,NODE [--sysroot DIR]`` output, or None."""
    exe = shutil.which("lscpu")
    if not exe:
        return None
    argv = [exe, "-p=CPU,CORE,SOCKET,NODE"] + (["--sysroot", sysroot] if sysroot else [])
    try:
        res = subprocess.run(
            argv, capture_output=True, text=True, timeout=10, env={**os.environ, "LC_ALL": "C"}
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


def probe(root: str | os.PathLike = "/") -> Topology:
    """The :class:`Topology` of the machine at ``root`` (see :func:`read_raw`).

    Raises:
        topology.TopologyError: nothing usable was found under ``root``.
    """
    return build(read_raw(root))


def cpu_flags(root: str | os.PathLike = "/") -> frozenset:
    """CPU feature flags from ``proc/cpuinfo`` under ``root`` (fast: no py-cpuinfo)."""
    from cpulaunch.topology import parse_cpuinfo

    return parse_cpuinfo(_Fs(root).read("proc/cpuinfo"))[0]


def check_numactl(numactl: str, prefixes: list, timeout: float = 10.0) -> Optional[str]:
    """Run each planned ``numactl ... true`` once; None if all work, else numactl's reason.

    Checks the CPUs and nodes actually planned (not CPU 0 and node 0): a container without
    CAP_SYS_NICE gets ``set_mempolicy: Operation not permitted`` only for some policies,
    and a cpuset may refuse some CPUs.
    """
    seen = set()
    for prefix in prefixes:
        key = tuple(prefix)
        if key in seen:
            continue
        seen.add(key)
        try:
            res = subprocess.run(
                list(prefix) + ["true"], capture_output=True, text=True, timeout=timeout
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{' '.join(prefix)} could not run ({exc})"
        if res.returncode != 0:
            msg = (res.stderr or res.stdout).strip().splitlines()
            return f"`{' '.join(prefix)}` failed: {msg[-1] if msg else 'exit %d' % res.returncode}"
    return None
