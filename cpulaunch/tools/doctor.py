"""``cpulaunch doctor``: what a user needs to know about a machine before trusting a run.

:func:`diagnose` reads the machine at ``root`` (``/`` or a ``--sysroot`` dump) and the
current Python environment, and returns a frozen :class:`Report`: findings (each with a
severity and a fix) plus sections of facts. :func:`render_text` and :func:`to_json` are
pure; the JSON keys are documented in docs/guide/doctor.md.

What comes from where:

- under ``root`` (works on a dump): topology, allowed CPUs and their limit (cgroup cpuset,
  affinity mask, CPU quota), ISA (``proc/cpuinfo``), ``proc/sys/kernel/numa_balancing``,
  cpufreq governors, transparent hugepages, SMT state, offline CPUs;
- from this Python environment and this machine, whatever ``root`` is (they are what a
  launch from here would use): libraries found, torch and its OpenMP runtime, oneCCL
  bindings, environment variables;
- oneCCL (``--ddp --backend ccl``), when oneccl_bindings_for_pytorch is installed: whether
  it loads with this torch (the launcher's cached child-process verdict,
  :func:`cpulaunch.machine.host.ccl_binding`), its run time (libfabric and its providers,
  :func:`cpulaunch.machine.libfinder.find_libfabric`), and whether a ccl collective can
  start (a one-rank ``init_process_group("ccl")`` and all_reduce in a child with the
  launcher's oneCCL variables: :func:`cpulaunch.machine.host.ccl_collective_check`);
- zentorch (``--inference-path zentorch``), when installed: whether it imports with this
  torch (the launcher's cached child-process verdict,
  :func:`cpulaunch.machine.host.zentorch_binding`); not installed: an info finding on AMD
  Zen CPUs only;
- numactl is run only when ``live``, with the launcher's own check
  (:func:`cpulaunch.machine.numactl.check_argv`: ``numactl -C <allowed CPUs> -m
  <their memory nodes> true`` for ``--mem-policy bind``); on a dump it is "not checked:
  another machine".

Every file is read through the probe's bounded reader
(:class:`cpulaunch.machine.files.FileReader`: regular files only, never blocking, at most
1 MiB of a sysfs or procfs file): a FIFO, a device or an oversized file in place of one
becomes a ``file-not-read:<path>`` finding naming it, never a hang.

Cost: no torch import, no py-cpuinfo (about 1.1 s per call here: docs/dev/measurements.md), at most one
``numactl`` run and the library search; well under 2 s. With zentorch installed, its
import check once (5-16 s here; cached). With oneCCL's bindings installed,
two children more: the import check (1.4-10 s here, once per build: cached) and the
one-rank collective (a few seconds). torch's ``libtorch_cpu.so``
(~430 MB) is memory-mapped, so only the pages holding its ELF headers and dynamic
section are read.

Nothing here raises for a missing or garbled file: a check that fails becomes a finding
with id ``check-failed:<check>``. :func:`exit_code` turns a report into the command's exit
status (1 when a finding is an error).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import click

from cpulaunch import cpulist
from cpulaunch.errors import CpulaunchError, printable
from cpulaunch.machine.elf import ElfError, read_elf_needed
from cpulaunch.machine.exec import which
from cpulaunch.machine.files import FileReader
from cpulaunch.machine.host import dist_version
from cpulaunch.machine.libraries import openmp_runtime_of
from cpulaunch.machine.numactl import MemPolicy
from cpulaunch.machine.probe import CPUINFO_BYTES
from cpulaunch.machine.platform import Platform
from cpulaunch.machine.recipes import RECIPES, recipe_for
from cpulaunch.view import ISA_FLAGS, platform_line
from cpulaunch.tools import CLICK_CONTEXT, shared_option

__all__ = [
    "SEVERITIES",
    "Finding",
    "TopologySummary",
    "NumactlStatus",
    "LibraryStatus",
    "TorchStatus",
    "IsaStatus",
    "SystemSettings",
    "EnvironmentStatus",
    "CclStatus",
    "Report",
    "isa_status",
    "diagnose",
    "exit_code",
    "render_text",
    "to_json",
    "main",
    "SCHEMA_VERSION",
]


#: Severities, least to most serious. "ok": checked and fine; "info": a fact worth knowing;
#: "warn": it will cost performance or correctness of binding; "error": a run will not do
#: what was asked (e.g. numactl unusable, two allocators preloaded).
SEVERITIES = ("ok", "info", "warn", "error")

#: Bumped when a key of :func:`to_json` changes meaning or disappears.
SCHEMA_VERSION = 1

#: Environment variables that fight a per-instance plan when set globally.
FIGHTING_VARS = ("KMP_AFFINITY", "OMP_NUM_THREADS", "GOMP_CPU_AFFINITY", "OMP_PROC_BIND", "OMP_PLACES")

#: Variables shown in the environment section when set (those above plus context).
SHOWN_VARS = FIGHTING_VARS + ("LD_PRELOAD", "KMP_BLOCKTIME", "MKL_NUM_THREADS", "MALLOC_CONF")

#: Largest dpkg file read (``var/lib/dpkg/status`` is 0.8 MB here and grows with the
#: packages installed; a package's ``.list`` can be a few MB).
DPKG_FILE_BYTES = 64 << 20


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class Finding:
    """One thing the doctor found.

    Attributes:
        id: stable identifier (docs/guide/doctor.md lists them), e.g. "numa-balancing".
        severity: one of :data:`SEVERITIES`.
        summary: one line.
        detail: why it matters (may be empty).
        fix: what to do about it (empty when nothing is needed).
    """

    id: str
    severity: str
    summary: str
    detail: str = ""
    fix: str = ""


@dataclass(frozen=True)
class TopologySummary:
    """The machine at ``root``. CPU sets hold logical CPU ids.

    Attributes:
        model: CPU model name from cpuinfo ("" if unknown).
        platform: vendor and family (:class:`cpulaunch.machine.platform.Platform`).
        recipe: the environment recipe ``--recipe auto`` applies on it
            (:mod:`cpulaunch.machine.recipes`).
        sockets: number of sockets (packages).
        nodes: NUMA node ids that have CPUs.
        memory_nodes: NUMA node ids that have memory.
        cores: number of physical cores (SMT sibling sets) online.
        threads_per_core: largest SMT sibling set (1 = no SMT in use).
        online, offline: logical CPUs online / known but offline.
        allowed: CPUs this process may use; ``allowed_source`` says where that came from.
        cpuset: the cgroup cpuset's CPUs, None if no cgroup cpuset was found.
        quota_cpus: cgroup CPU bandwidth quota in CPUs, None if unlimited;
            ``quota_source`` the cgroup folder it came from.
        limits: what narrows the CPUs: "cgroup cpuset", "affinity mask", "cpu quota".
        hybrid: E-cores detected.
        notes: the probe's notes.
    """

    model: str
    platform: Platform
    recipe: str
    sockets: int
    nodes: tuple[int, ...]
    memory_nodes: tuple[int, ...]
    cores: int
    threads_per_core: int
    online: frozenset[int]
    offline: frozenset[int]
    allowed: frozenset[int]
    allowed_source: str
    cpuset: Optional[frozenset[int]]
    quota_cpus: Optional[float]
    quota_source: str
    limits: tuple[str, ...]
    hybrid: bool
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class NumactlStatus:
    """numactl on this machine.

    Attributes:
        path: where it is installed (searched in ``PATH`` of the given environment), or None.
        checked: True when it was run.
        usable: True/False after the run; None when not checked.
        reason: numactl's refusal, or why it was not checked ("" when usable).
        argv: the command that was (or would be) run.
    """

    path: Optional[str]
    checked: bool
    usable: Optional[bool]
    reason: str
    argv: tuple[str, ...] = ()


@dataclass(frozen=True)
class LibraryStatus:
    """One library of the registry (cpulaunch.machine.libraries.REGISTRY).

    Attributes:
        name: registry name ("tcmalloc", "jemalloc", "iomp5").
        kind: "allocator" or "openmp".
        path: the path found (the one a launch would preload), None if missing.
        realpath: ``path`` with symlinks resolved.
        version: from the resolved file name (``libtcmalloc_minimal.so.4.5.10`` -> "4.5.10"),
            else the soname's number; None if unknown.
        package: the package that installed it ("libtcmalloc-minimal4 2.10-1 (dpkg)",
            "intel-openmp 2026.2.0 (pip)"), None if not found among the hinted packages.
        install: how to install it (the registry's hint).
    """

    name: str
    kind: str
    path: Optional[str]
    realpath: Optional[str]
    version: Optional[str]
    package: Optional[str]
    install: str


@dataclass(frozen=True)
class TorchStatus:
    """torch as installed in this Python environment (found, not imported).

    Attributes:
        version: ``importlib.metadata.version("torch")``, None if not installed.
        libtorch_cpu: path of ``torch/lib/libtorch_cpu.so``, None if absent.
        needed: its ELF DT_NEEDED entries, in file order.
        openmp: the OpenMP runtime it links: "gnu", "intel", "llvm" or None.
        openmp_library: the DT_NEEDED entry that decided ``openmp``.
        oneccl_version: oneccl_bind_pt's version, None if not installed.
        ipex_version: intel_extension_for_pytorch's version, None if not installed.
        error: why libtorch_cpu.so could not be read ("" if it was).
    """

    version: Optional[str]
    libtorch_cpu: Optional[str]
    needed: tuple[str, ...]
    openmp: Optional[str]
    openmp_library: Optional[str]
    oneccl_version: Optional[str]
    ipex_version: Optional[str]
    error: str = ""


@dataclass(frozen=True)
class IsaStatus:
    """The instruction sets PyTorch's CPU kernels choose between.

    Attributes:
        arch: "x86_64", "aarch64", "ppc64", or "unknown".
        present: the flags of :data:`cpulaunch.render.ISA_FLAGS` (the table
            ``--show-topology`` shows) that cpuinfo lists, in that order.
        bf16_fast: True when bf16 has hardware dot products (x86: avx512_bf16 or amx_bf16;
            arm64: bf16), False when not, None when not assessed (other arch, no cpuinfo).
        int8_fast: True with int8 dot products (VNNI, AMX-INT8; arm64 i8mm/asimddp).
        meaning: one line on what this means for inference.
    """

    arch: str
    present: tuple[str, ...]
    bf16_fast: Optional[bool]
    int8_fast: Optional[bool]
    meaning: str


@dataclass(frozen=True)
class SystemSettings:
    """Kernel settings read under ``root`` (None: file absent or unreadable).

    Attributes:
        numa_balancing: ``proc/sys/kernel/numa_balancing`` (0 off, 1 on, 2 tiering mode).
        cpufreq: a cpufreq driver exposes governors.
        governors: governor -> number of allowed CPUs using it ({} without cpufreq).
        thp_enabled, thp_defrag: the selected mode of
            ``sys/kernel/mm/transparent_hugepage/{enabled,defrag}`` ("always", "madvise", ...).
        smt_active: ``sys/devices/system/cpu/smt/active`` as a bool.
        smt_control: ``smt/control`` ("on", "off", "forceoff", "notsupported", "notimplemented").
    """

    numa_balancing: Optional[int]
    cpufreq: bool
    governors: Mapping[str, int]
    thp_enabled: Optional[str]
    thp_defrag: Optional[str]
    smt_active: Optional[bool]
    smt_control: Optional[str]


@dataclass(frozen=True)
class EnvironmentStatus:
    """The user's environment variables that matter to a plan.

    Attributes:
        vars: the variables of :data:`SHOWN_VARS` that are set, with their values.
        preload: LD_PRELOAD entries, split as glibc's ld.so does (spaces and colons only:
            :func:`cpulaunch.machine.libraries.preload_entries`).
        preload_allocators: registry names of allocators among them.
        preload_openmp: OpenMP runtimes among them ("gnu", "intel", "llvm").
    """

    vars: Mapping[str, str]
    preload: tuple[str, ...]
    preload_allocators: tuple[str, ...]
    preload_openmp: tuple[str, ...]


@dataclass(frozen=True)
class CclStatus:
    """oneCCL, for ``cpulaunch --ddp --backend ccl`` (issue 21; docs/guide/ddp.md).

    Attributes:
        binding: the folder of oneccl_bindings_for_pytorch, None when not installed.
        version: its package metadata's version (shown only: it decides nothing).
        loads: whether ``import torch, oneccl_bindings_for_pytorch`` succeeds in a child
            (the launcher's verdict, cached per build and torch); None when not installed.
        why: how the import failed ("" when it loads).
        libfabric, providers: oneCCL's libfabric and its provider folder, None when missing.
        collective: whether a one-rank ccl ``init_process_group`` and ``all_reduce`` ran in
            a child with the launcher's oneCCL variables; None when not tried (the bindings
            missing or not loading, or libfabric missing).
        collective_error: why it failed ("" otherwise).
        env: the oneCCL variables the check ran with (the launcher's, the user's kept).
    """

    binding: Optional[str]
    version: Optional[str]
    loads: Optional[bool]
    why: str
    libfabric: Optional[str]
    providers: Optional[str]
    collective: Optional[bool] = None
    collective_error: str = ""
    env: Mapping[str, str] = None


@dataclass(frozen=True)
class Report:
    """Everything :func:`diagnose` found. Sections are None when their check failed
    (a ``check-failed:<name>`` finding says why).

    Attributes:
        root: the root read (``/`` or the ``--sysroot`` folder).
        live: the root is this running machine (numactl may be run).
        findings: in check order; see docs/guide/doctor.md for the ids.
    """

    root: str
    live: bool
    findings: tuple[Finding, ...]
    topology: Optional[TopologySummary] = None
    numactl: Optional[NumactlStatus] = None
    libraries: tuple[LibraryStatus, ...] = ()
    torch: Optional[TorchStatus] = None
    isa: Optional[IsaStatus] = None
    settings: Optional[SystemSettings] = None
    environment: Optional[EnvironmentStatus] = None
    ccl: Optional[CclStatus] = None

    @property
    def worst(self) -> str:
        """The most serious severity among the findings ("ok" when there are none)."""
        ranks = [SEVERITIES.index(f.severity) for f in self.findings]
        return SEVERITIES[max(ranks)] if ranks else "ok"


# --------------------------------------------------------------------------- small readers


def _text(files: FileReader, rel: str) -> Optional[str]:
    """Text of ``rel`` below ``files.root`` (no leading slash); None when absent or not
    read (a FIFO, a device, an oversized file: ``files.skipped`` then names it). Never
    raises, never blocks."""
    return files.read(rel, strict=False)


def _bracketed(text: Optional[str]) -> Optional[str]:
    """The selected word of a sysfs choice file: ``"always [madvise] never"`` -> "madvise"."""
    if not text:
        return None
    m = re.search(r"\[([^\]]+)\]", text)
    return m.group(1) if m else (text.strip() or None)




# --------------------------------------------------------------------------- checks


def _topology(files: FileReader, findings: list) -> tuple:
    """(TopologySummary, Topology) of the machine below ``files.root``."""
    from cpulaunch.machine import probe as probe_mod
    from cpulaunch.machine.topology import build

    raw = probe_mod.read_facts(files.root, files=files)
    topo = build(raw)
    limits = []
    if topo.cpuset is not None and topo.cpuset != topo.online:
        limits.append("cgroup cpuset")
    if topo.allowed != (topo.cpuset if topo.cpuset is not None else topo.online):
        limits.append("affinity mask" if "affinity" in topo.allowed_source else topo.allowed_source)
    if topo.quota_cpus is not None and topo.quota_cpus < len(topo.allowed):
        limits.append("cpu quota")
    summary = TopologySummary(
        model=topo.model or _arm_model(files.read("proc/cpuinfo", strict=False, cap=CPUINFO_BYTES,
                                                  truncate=True)),
        platform=topo.platform,
        recipe=recipe_for(topo.platform.kind).name,
        sockets=len(topo.sockets),
        nodes=tuple(sorted(n.id for n in topo.nodes.values() if n.cpus)),
        memory_nodes=tuple(sorted(topo.memory_nodes)),
        cores=len(topo.cores),
        threads_per_core=max((len(c.cpus) for c in topo.cores), default=1),
        online=topo.online,
        offline=topo.offline,
        allowed=topo.allowed,
        allowed_source=topo.allowed_source,
        cpuset=topo.cpuset,
        quota_cpus=topo.quota_cpus,
        quota_source=raw.quota_source,
        limits=tuple(limits),
        hybrid=topo.hybrid,
        notes=tuple(topo.notes),
    )
    findings += _topology_findings(summary, topo, raw.quota_source)
    return summary, topo


def _topology_findings(summary: TopologySummary, topo, quota_source: str) -> list:
    """Findings about the CPUs: summary, E-cores, narrowed CPUs, offline CPUs, quota."""
    fmt = cpulist.format
    limits = summary.limits
    findings = []
    findings.append(Finding(
        "topology", "ok",
        f"{summary.sockets} socket(s), {len(summary.nodes)} NUMA node(s) with CPUs, {summary.cores} cores, "
        f"{summary.threads_per_core} thread(s) per core, {len(topo.online)} CPUs online"
        + (f" ({summary.model})" if summary.model else ""),
    ))
    recipe = RECIPES[summary.recipe]
    findings.append(Finding(
        "platform", "ok", f"{summary.platform.text}; environment recipe {recipe.name}",
        f"{recipe.title}. Each launch shows the recipe it applied (CPULAUNCH_PLANNED_RECIPE, --dry-run).",
    ))
    if topo.hybrid:
        ecores = frozenset(c for core in topo.cores if core.efficiency for c in core.cpus)
        findings.append(Finding(
            "hybrid", "info", f"hybrid CPU: E-cores {fmt(ecores)}",
            "E-cores are slower: an OpenMP team spread over P- and E-cores waits for the slowest "
            "thread at every barrier. cpulaunch leaves E-cores out unless --use-e-cores.",
        ))
    if len(topo.allowed) < len(topo.online):
        findings.append(Finding(
            "allowed-cpus", "info",
            f"this process may use CPUs {fmt(topo.allowed)} of {fmt(topo.online)} "
            f"(limited by {', '.join(limits) or topo.allowed_source})",
            f"source: {topo.allowed_source}. cpulaunch plans only these CPUs.",
            "to use more, widen the container's --cpuset-cpus, the Slurm allocation or the taskset mask",
        ))
    if topo.offline:
        findings.append(Finding(
            "offline-cpus", "warn", f"CPUs {fmt(topo.offline)} are offline",
            "offline CPUs are not planned; a machine brought up with CPUs off runs slower than it could.",
            "bring them online as root: echo 1 > /sys/devices/system/cpu/cpuN/online "
            "(or check the kernel's maxcpus=/nr_cpus= and the hypervisor's vCPU count)",
        ))
    if topo.quota_cpus is not None and topo.quota_cpus < len(topo.allowed):
        findings.append(Finding(
            "cpu-quota", "warn",
            f"a CPU quota of {topo.quota_cpus:g} CPUs is smaller than the {len(topo.allowed)} allowed CPUs",
            f"from {quota_source or 'the cgroup'}: threads beyond the quota are throttled every "
            "period, which stalls OpenMP barriers; cpulaunch lowers OMP_NUM_THREADS to the quota.",
            "give the container a cpuset instead of (or matching) the quota: "
            "docker run --cpuset-cpus 0-N --cpus N+1, or Kubernetes' static CPU manager with integer CPUs",
        ))
    return findings


def _arm_model(cpuinfo: Optional[str]) -> str:
    """arm64 cpuinfo names no model: "arm64 implementer 0x48 part 0xd01" from its ids."""
    ids = dict(re.findall(r"^CPU (implementer|part)\s*:\s*(\S+)", cpuinfo or "", re.M))
    if "implementer" in ids:
        return f"arm64 implementer {ids['implementer']} part {ids.get('part', '?')}"
    return ""


def _numactl(topo, environ: Mapping[str, str], live: bool, policy: MemPolicy,
             findings: list) -> NumactlStatus:
    """numactl installed? usable here (live only)? Checked with the launcher's own command
    (:func:`cpulaunch.machine.numactl.check_argv`, run by
    :func:`cpulaunch.machine.host.check_numactl`, as ``cpulaunch --bind numactl
    --mem-policy POLICY`` does before a launch), so the verdict is about the command a
    launch runs."""
    from cpulaunch.machine import numactl as numactl_mod
    from cpulaunch.machine.host import check_numactl

    path = which("numactl", path=environ.get("PATH", os.defpath))
    if not live:
        findings.append(Finding("numactl", "info", "numactl not checked: another machine (--sysroot)"))
        return NumactlStatus(path=path, checked=False, usable=None, reason="not checked: another machine")
    if path is None:
        findings.append(Finding(
            "numactl", "warn", "numactl is not installed",
            "without it cpulaunch binds CPUs with sched_setaffinity and cannot bind memory to NUMA nodes.",
            "apt-get install numactl (dnf install numactl)",
        ))
        return NumactlStatus(path=None, checked=False, usable=False, reason="not installed")
    argv = tuple(numactl_mod.check_argv(path, topo, MemPolicy(policy)))
    reason = check_numactl([list(argv[:-1])])
    if reason is None:
        findings.append(Finding("numactl", "ok", f"numactl works here: `{' '.join(argv)}` "
                                f"(the launcher's check for --mem-policy {MemPolicy(policy).value})"))
        return NumactlStatus(path=path, checked=True, usable=True, reason="", argv=argv)
    eperm = "not permitted" in reason.lower()
    findings.append(Finding(
        "numactl", "error", f"numactl cannot bind here: {reason}",
        ("in a container, set_mempolicy/sched_setaffinity need CAP_SYS_NICE (Docker's default "
         "seccomp profile refuses them without it). " if eperm else "")
        + "cpulaunch then falls back to sched_setaffinity and drops memory binding.",
        "docker run --cap-add SYS_NICE ... (or pass --bind affinity: CPU binding only)" if eperm
        else "check the cgroup's cpuset.cpus/cpuset.mems, or pass --bind affinity",
    ))
    return NumactlStatus(path=path, checked=True, usable=False, reason=reason, argv=argv)


_INSTALL_RE = re.compile(r"\b(apt-get|apt|dnf|yum|pip|conda) install ([\w.+-]+)(?: \(or ([\w.+-]+)\))?")


def _version_from_name(real: str) -> Optional[str]:
    m = re.search(r"\.so\.(\d+(?:\.\d+)*)$", os.path.basename(real))
    return m.group(1) if m else None


def _dpkg_status_versions(host: FileReader, names: set) -> dict:
    """{package: version} of the installed packages among ``names``, from dpkg's status."""
    text = host.read("var/lib/dpkg/status", strict=False, cap=DPKG_FILE_BYTES)
    out = {}
    if not text:
        return out
    for para in text.split("\n\n"):
        m = re.search(r"^Package: (\S+)$", para, re.M)
        status = re.search(r"^Status: .* installed$", para, re.M)
        if m and m.group(1) in names and status:
            v = re.search(r"^Version: (\S+)$", para, re.M)
            out.setdefault(m.group(1), v.group(1) if v else "?")
    return out


def _package_of(host: FileReader, real: str, install: str) -> Optional[str]:
    """The package, among those the install hint names, that installed the file ``real``
    (symlinks resolved). Cheap: reads only those packages' dpkg file lists (through
    ``host``, the reader of this machine's ``/``), or the pip distribution's RECORD;
    compares resolved paths (so /lib vs /usr/lib does not matter)."""
    for mgr, first, second in _INSTALL_RE.findall(install):
        for name in (n for n in (first, second) if n):
            if mgr in ("apt-get", "apt"):
                arch = platform.machine().replace("x86_64", "amd64").replace("aarch64", "arm64")
                for lst in (f"{name}:{arch}.list", f"{name}.list"):
                    text = host.read(f"var/lib/dpkg/info/{lst}", strict=False, cap=DPKG_FILE_BYTES)
                    if text and any(os.path.realpath(line) == real
                                    for line in text.splitlines() if ".so" in line):
                        ver = _dpkg_status_versions(host, {name}).get(name, "?")
                        return f"{name} {ver} (dpkg)"
            elif mgr == "pip":
                try:
                    dist = importlib.metadata.distribution(name)
                except importlib.metadata.PackageNotFoundError:
                    continue
                for f in dist.files or ():
                    if os.path.basename(str(f)) == os.path.basename(real) and \
                            os.path.realpath(str(f.locate())) == real:
                        return f"{name} {dist.version} (pip)"
    return None


def _libraries(host: FileReader, environ: Mapping[str, str], findings: list) -> tuple:
    from cpulaunch.machine import libfinder, libraries

    out = []
    for lib in libraries.REGISTRY.values():
        if not lib.filenames or not lib.selectable:  # nothing to preload (torch's own runtime)
            continue
        found = libfinder.find(lib, environ)
        if found is None:
            out.append(LibraryStatus(lib.name, lib.kind, None, None, None, None, lib.install))
            findings.append(Finding(f"lib-{lib.name}", "info", f"{lib.name} not found",
                                    f"searched for {', '.join(lib.filenames)}", lib.install))
            continue
        real = os.path.realpath(found)
        version = _version_from_name(real)
        package = _package_of(host, real, lib.install)
        out.append(LibraryStatus(lib.name, lib.kind, str(found), real, version, package, lib.install))
        findings.append(Finding(f"lib-{lib.name}", "ok", f"{lib.name}: {found}"
                                + (f" (version {version})" if version else "")
                                + (f", package {package}" if package else "")))
    return tuple(out)


def _torch(findings: list) -> TorchStatus:
    """torch's version and the OpenMP runtime libtorch_cpu.so links, without importing torch."""
    version = dist_version("torch")
    ccl = dist_version("oneccl_bind_pt", "oneccl-bind-pt")
    ipex = dist_version("intel_extension_for_pytorch")
    spec = importlib.util.find_spec("torch")
    locations = list(spec.submodule_search_locations or []) if spec else []
    lib = next((Path(d) / "lib" / "libtorch_cpu.so" for d in locations
                if (Path(d) / "lib" / "libtorch_cpu.so").is_file()), None)
    if spec is None:
        findings.append(Finding("torch", "info", "torch is not installed in this Python environment",
                                fix="pip install torch --index-url https://download.pytorch.org/whl/cpu"))
        return TorchStatus(version, None, (), None, None, ccl, ipex, "torch not installed")
    if lib is None:
        findings.append(Finding("torch", "info", f"torch {version or '?'}: no lib/libtorch_cpu.so found",
                                f"looked in {', '.join(locations) or 'no location'}"))
        return TorchStatus(version, None, (), None, None, ccl, ipex, "libtorch_cpu.so not found")
    try:
        needed = read_elf_needed(lib)
    except ElfError as exc:
        findings.append(Finding("torch", "warn", f"cannot read {lib}: {exc}"))
        return TorchStatus(version, str(lib), (), None, None, ccl, ipex, str(exc))
    omp_lib = next((n for n in needed if openmp_runtime_of(n)), None)
    omp = openmp_runtime_of(omp_lib) if omp_lib else None
    names = {"gnu": "GNU OpenMP", "intel": "Intel OpenMP", "llvm": "LLVM OpenMP"}
    findings.append(Finding(
        "torch", "ok",
        f"torch {version or '?'} links {names.get(omp, 'no OpenMP runtime')}"
        + (f" ({omp_lib})" if omp_lib else "")
        + (f"; oneCCL bindings {ccl}" if ccl else "; no oneCCL bindings")
        + (f"; IPEX {ipex}" if ipex else ""),
        "--omp-runtime intel preloads libiomp5 over it (torch's libgomp stays mapped, unused)"
        if omp == "gnu" else "",
    ))
    return TorchStatus(version, str(lib), needed, omp, omp_lib, ccl, ipex)


def _arch(live: bool, flags: frozenset, model: str) -> str:
    if live:
        m = platform.machine()
        return {"amd64": "x86_64", "arm64": "aarch64"}.get(m.lower(), m)
    if {"sse2", "lm"} & flags:
        return "x86_64"
    if {"asimd", "fp"} & flags:
        return "aarch64"
    if model.upper().startswith("POWER"):
        return "ppc64"
    return "unknown"


def isa_status(arch: str, flags: frozenset[str]) -> IsaStatus:
    """What the CPU flags mean for PyTorch inference (pure).

    Rules (oneDNN's CPU ISA dispatch; Intel's PyTorch CPU optimization guide): bf16 is fast
    only with hardware bf16 dot products (x86 AVX512_BF16 or AMX-BF16, arm64 BF16);
    without them oneDNN converts bf16 to fp32 and gains nothing. int8 is fast with VNNI /
    AMX-INT8 (x86) or I8MM / dot product (arm64).

    Args:
        arch: "x86_64", "aarch64" or anything else (not assessed).
        flags: cpuinfo flags (x86 ``flags``, arm64 ``Features``).
    """
    present = tuple(f for f in ISA_FLAGS if f in flags)
    if arch == "x86_64":
        bf16 = bool({"avx512_bf16", "amx_bf16"} & flags)
        int8 = bool({"avx512_vnni", "avx_vnni", "amx_int8"} & flags)
        kernels = ("AMX" if "amx_tile" in flags else "AVX-512" if "avx512f" in flags
                   else "AVX2" if "avx2" in flags else "baseline SSE")
    elif arch == "aarch64":
        bf16 = "bf16" in flags
        int8 = bool({"i8mm", "asimddp"} & flags)
        kernels = "SVE" if "sve" in flags else "ASIMD (NEON)" if "asimd" in flags else "baseline"
    else:
        return IsaStatus(arch, present, None, None,
                         f"not assessed: PyTorch's CPU kernels are tuned for x86-64 and arm64 ({arch})")
    if not flags:
        return IsaStatus(arch, present, None, None, "no CPU flags in cpuinfo: ISA unknown")
    meaning = f"{kernels} kernels; " + (
        "bf16 inference can be faster than fp32 (hardware bf16 dot products)" if bf16
        else "bf16 brings no oneDNN speed-up on this CPU")
    if int8:
        meaning += "; int8 fast (" + ("VNNI/AMX" if arch == "x86_64" else "I8MM/dot product") + ")"
    return IsaStatus(arch, present, bf16, int8, meaning)


def _isa(live: bool, topo, findings: list) -> IsaStatus:
    status = isa_status(_arch(live, topo.flags, topo.model), topo.flags)
    sev = "info"
    fix = ""
    if status.arch == "x86_64" and topo.flags and "avx2" not in topo.flags:
        sev, fix = "warn", "run on a CPU with AVX2 or newer (x86-64-v3) for usable PyTorch CPU performance"
    elif status.bf16_fast is False:
        fix = "keep fp32 (or int8) for inference on this CPU; bf16 pays off on CPUs with AVX512_BF16/AMX (or arm64 BF16)"
    findings.append(Finding("isa", sev, f"ISA: {' '.join(status.present) or 'none of the tracked flags'}: "
                            f"{status.meaning}", fix=fix))
    return status


def _governors(files: FileReader, allowed: frozenset) -> tuple:
    """(cpufreq present, {governor: CPU count}) over the allowed CPUs; per-CPU files first
    (``cpuN/cpufreq/scaling_governor``), then policies with their ``related_cpus``."""
    base = "sys/devices/system/cpu"
    per_cpu = {}
    for cpu in sorted(allowed):
        g = _text(files, f"{base}/cpu{cpu}/cpufreq/scaling_governor")
        if g and g.strip():
            per_cpu[cpu] = g.strip()
    policies = sorted(p for p in files.listdir(f"{base}/cpufreq") if p.startswith("policy"))
    for pol in policies:
        g = _text(files, f"{base}/cpufreq/{pol}/scaling_governor")
        rel = (_text(files, f"{base}/cpufreq/{pol}/related_cpus")
               or _text(files, f"{base}/cpufreq/{pol}/affected_cpus"))
        if not g or not g.strip():
            continue
        try:
            cpus = cpulist.parse(rel.strip().replace(" ", ",")) if rel else frozenset()
        except CpulaunchError:
            cpus = frozenset()
        for cpu in cpus & allowed:
            per_cpu.setdefault(cpu, g.strip())
    counts: dict = {}
    for g in per_cpu.values():
        counts[g] = counts.get(g, 0) + 1
    return bool(per_cpu or policies), dict(sorted(counts.items()))


def _settings(files: FileReader, topo, live: bool, findings: list) -> SystemSettings:
    nb_text = _text(files, "proc/sys/kernel/numa_balancing")
    try:
        nb = int(nb_text.strip()) if nb_text else None
    except ValueError:
        nb = None
    cpufreq, governors = _governors(files, topo.allowed)
    thp = _bracketed(_text(files, "sys/kernel/mm/transparent_hugepage/enabled"))
    defrag = _bracketed(_text(files, "sys/kernel/mm/transparent_hugepage/defrag"))
    smt_text = (_text(files, "sys/devices/system/cpu/smt/active") or "").strip()
    smt_active = {"1": True, "0": False}.get(smt_text)
    smt_control = (_text(files, "sys/devices/system/cpu/smt/control") or "").strip() or None
    multi_node = len([n for n in topo.nodes.values() if n.cpus]) > 1

    if nb is not None and nb != 0:
        findings.append(Finding(
            "numa-balancing", "warn" if multi_node else "info",
            f"automatic NUMA balancing is on (kernel.numa_balancing={nb})"
            + ("" if multi_node else "; harmless with one NUMA node"),
            "it unmaps pages to sample accesses and migrates pages and tasks between nodes, "
            "fighting the NUMA placement of pinned instances and adding page faults.",
            "sysctl -w kernel.numa_balancing=0 (as root; add to /etc/sysctl.d to keep it)",
        ))
    elif nb == 0:
        findings.append(Finding("numa-balancing", "ok", "automatic NUMA balancing is off"))
    slow = {g: n for g, n in governors.items() if g != "performance"}
    if slow:
        findings.append(Finding(
            "cpufreq-governor", "warn",
            "CPU frequency governor is not performance: "
            + ", ".join(f"{g} on {n} CPU(s)" for g, n in slow.items()),
            "power-saving governors ramp the clock up after load appears; short OpenMP regions and "
            "latency runs pay for it, and run-to-run noise grows.",
            "cpupower frequency-set -g performance (as root), or the host/BIOS power profile",
        ))
    elif governors:
        findings.append(Finding("cpufreq-governor", "ok", "CPU frequency governor is performance"))
    elif not cpufreq:
        findings.append(Finding("cpufreq-governor", "info",
                                "no cpufreq governor exposed (a VM, or the hardware manages frequency)"
                                if live else "no cpufreq governor in the dump"))
    if thp is not None:
        findings.append(Finding(
            "thp", "info", f"transparent hugepages: {thp}" + (f" (defrag {defrag})" if defrag else ""),
            {"always": "every large anonymous mapping may get 2 MB pages (fewer TLB misses for big "
                       "tensors; occasional compaction stalls).",
             "madvise": "only memory the program asks for (madvise) gets 2 MB pages; jemalloc with "
                        "metadata_thp:auto and PyTorch's large allocations may use them.",
             "never": "no 2 MB pages: large models pay more TLB misses."}.get(thp, ""),
            "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (as root) if latency spikes "
            "from compaction show up with 'always'" if thp == "always" else "",
        ))
    if smt_active is not None or smt_control:
        state = "on" if smt_active else "off" if smt_active is False else "unknown"
        findings.append(Finding(
            "smt", "info", f"SMT (hyper-threading) is {state}" + (f" (control: {smt_control})" if smt_control else ""),
            "cpulaunch uses one logical CPU per core by default; --use-logical-cores adds the siblings."
            if smt_active else "",
        ))
    return SystemSettings(nb, cpufreq, governors, thp, defrag, smt_active, smt_control)


def _environment(environ: Mapping[str, str], findings: list) -> EnvironmentStatus:
    from cpulaunch.machine.libraries import REGISTRY, identify, preload_entries

    shown = {k: environ[k] for k in SHOWN_VARS if k in environ}
    entries = tuple(preload_entries(environ.get("LD_PRELOAD", "")))
    allocs = tuple(n for n in (identify(e) for e in entries) if n and REGISTRY[n].kind == "allocator")
    omps = tuple(r for r in (openmp_runtime_of(e) for e in entries) if r)
    fixes = {
        "KMP_AFFINITY": ("warn", "KMP_AFFINITY is set globally",
                         "every process that loads Intel OpenMP, DataLoader workers included, pins its threads "
                         "by this one rule, so instances and workers pile onto the same cores "
                         "(huggingface/accelerate#3911).",
                         "unset KMP_AFFINITY; cpulaunch sets it per instance with --omp-runtime intel"),
        "OMP_NUM_THREADS": ("warn", "OMP_NUM_THREADS is set",
                            "cpulaunch keeps your value for every instance instead of each instance's CPU count, "
                            "so instances of different sizes get the same thread count.",
                            "unset OMP_NUM_THREADS, or pass --override-env"),
        "GOMP_CPU_AFFINITY": ("warn", "GOMP_CPU_AFFINITY is set",
                              "it pins GNU OpenMP threads of every process to the same CPU list; with torch's "
                              "bundled libgomp it can also drop torch to one thread (pytorch#149422).",
                              "unset GOMP_CPU_AFFINITY; cpulaunch binds each instance's CPUs itself"),
        "OMP_PROC_BIND": ("warn", "OMP_PROC_BIND is set globally",
                          "one binding rule for every instance and worker process; with OMP_PLACES naming "
                          "CPUs it pins all of them to the same places.",
                          "unset it; cpulaunch sets OMP_PROC_BIND/OMP_PLACES per instance when asked"),
        "OMP_PLACES": ("warn", "OMP_PLACES is set globally",
                       "the same places for every instance: threads of different instances land on the "
                       "same CPUs, or outside an instance's binding.",
                       "unset it; cpulaunch sets OMP_PLACES per instance when asked"),
    }
    for var in FIGHTING_VARS:
        if var in environ:
            sev, summary, detail, fix = fixes[var]
            findings.append(Finding(f"env-{var}", sev, f"{summary}: {var}={environ[var]}", detail, fix))
    if len(allocs) > 1:
        alloc_entries = [e for e in entries if identify(e) in allocs]
        findings.append(Finding(
            "env-LD_PRELOAD", "error", f"LD_PRELOAD holds two allocators: {' '.join(alloc_entries)}",
            "the first one wins for malloc, but memory freed through the other crashes or leaks.",
            "keep one allocator in LD_PRELOAD (or none, and let cpulaunch --allocator choose)",
        ))
    elif len(set(omps)) > 1:
        omp_entries = [e for e in entries if openmp_runtime_of(e)]
        findings.append(Finding(
            "env-LD_PRELOAD", "warn", f"LD_PRELOAD holds two OpenMP runtimes: {' '.join(omp_entries)}",
            "two thread pools compete for the same cores; which one serves torch depends on load order.",
            "keep one OpenMP runtime in LD_PRELOAD (or none, and use cpulaunch --omp-runtime)",
        ))
    elif entries:
        findings.append(Finding(
            "env-LD_PRELOAD", "info", f"LD_PRELOAD is set: {' '.join(entries)}",
            "cpulaunch keeps these entries and puts its own in front; it preloads no second allocator.",
        ))
    return EnvironmentStatus(shown, entries, allocs, omps)


# --------------------------------------------------------------------------- oneCCL


def _ccl_check_env(environ: Mapping[str, str], fabric) -> dict:
    """The environment of the one-rank collective: the user's, plus the launcher's oneCCL
    variables for one rank whose worker shares this process's first allowed CPU (the
    user's own CCL_*/FI_* values kept, as a launch keeps them)."""
    from cpulaunch import distributed

    ctx = distributed.RankContext("cpulaunch", 0, 1, 0, 1)
    planned = distributed.ccl_env(ctx, [(min(os.sched_getaffinity(0)),)], dedicated=False,
                                  runtime=distributed.ccl_runtime_env(fabric))
    ours, _ = distributed.ccl_precedence(planned, environ, False)
    return ours


def _ccl(environ: Mapping[str, str], findings: list) -> CclStatus:
    """oneCCL's bindings, run time and a one-rank collective (module doc), as findings."""
    import sys

    from cpulaunch.machine import host, libfinder, libraries

    b = host.ccl_binding(sys.executable, environ, host.own_cache_dir(environ)[0])
    if b.path is None:
        findings.append(Finding("ccl-binding", "info", "oneccl_bindings_for_pytorch is not installed: "
                                "--ddp uses gloo", fix="to use oneCCL: install oneccl_bindings_for_pytorch built "
                                "for this torch, and impi-rt for oneCCL's libfabric"))
        return CclStatus(None, None, None, "", None, None)
    fabric = libfinder.find_libfabric(environ)
    lib, prov = (str(p) if p else None for p in (fabric.library, fabric.providers))
    status = CclStatus(b.path, b.version, b.loads, b.why, lib, prov)
    what = f"oneccl_bindings_for_pytorch {b.version or '?'} ({b.path})"
    if not b.loads:
        cached = f" (cached verdict: {b.cache_file})" if b.cached else ""
        findings.append(Finding("ccl-binding", "warn", f"{what} does not load with torch {b.torch_version}: {b.why}{cached}",
                                "--backend auto uses gloo; --backend ccl is refused",
                                "rebuild it against the installed torch"
                                + ("; once fixed, cpulaunch doctor --clear-cache forgets the old verdict" if cached else "")))
        return status
    findings.append(Finding("ccl-binding", "ok", f"{what} loads with torch {b.torch_version}"))
    if not fabric.usable and not (environ.get("CCL_OFI_LIBRARY_PATH") and environ.get("FI_PROVIDER_PATH")):
        findings.append(Finding("ccl-libfabric", "warn", f"oneCCL's libfabric not usable: library {lib or 'missing'}, "
                                f"providers {prov or 'missing'}", "--backend auto uses gloo",
                                libraries.REGISTRY["libfabric"].install))
        return status
    findings.append(Finding("ccl-libfabric", "ok", f"libfabric {lib}, providers {prov}"))
    env = _ccl_check_env(environ, fabric)
    ok, why = host.ccl_collective_check(sys.executable, {**environ, **env})
    findings.append(Finding("ccl-collective", "ok", "a one-rank ccl all_reduce ran") if ok else Finding(
        "ccl-collective", "error", f"a one-rank ccl all_reduce failed: {why}",
        "--backend auto would choose ccl and the ranks would fail at their first collective",
        "check the CCL_* and FI_* variables in your environment (unset them to test cpulaunch's own), or "
        "use --backend gloo"))
    return CclStatus(b.path, b.version, True, "", lib, prov, ok, why, env)


# --------------------------------------------------------------------------- diagnose


def _zentorch(environ: Mapping[str, str], topo, findings: list) -> None:
    """zentorch (AMD's torch.compile backend, ``--inference-path zentorch``): whether it
    imports with this torch, by the launcher's own cached child-process check
    (:func:`cpulaunch.machine.host.zentorch_binding`). Not installed: said on AMD Zen CPUs
    only, where it is worth installing."""
    import sys

    from cpulaunch.machine.host import own_cache_dir, zentorch_binding

    # the user's cache folder, else this process's (a report made with an empty environment)
    b = zentorch_binding(sys.executable, environ, own_cache_dir(environ)[0] or own_cache_dir(os.environ)[0])
    torch_v = b.torch_version or dist_version("torch") or "not installed"
    if b.path is None:
        if topo is not None and topo.platform.kind == "amd-zen":
            findings.append(Finding(
                "zentorch", "info", "zentorch (AMD's torch.compile backend for EPYC) is not installed",
                "it is one of the inference paths (--inference-path zentorch; auto tries it where it imports)",
                fix=f"pip install zentorch, the release built for torch {torch_v}"))
        return
    if b.loads:
        findings.append(Finding("zentorch", "ok", f"zentorch {b.version or '?'} imports with torch {torch_v}: "
                                              "--inference-path zentorch can be used"))
    else:
        findings.append(Finding(
            "zentorch", "warn", f"zentorch {b.version or '?'} does not import with torch {torch_v}: {b.why}",
            "a zentorch wheel imports only with the torch minor release it was built for (zentorch 2.14.0.1: "
            "torch 2.14.x); cpulaunch's auto path leaves it out with a note",
            fix="install the zentorch release built for this torch, or the torch it was built for"))


def _failed(name: str, exc: Exception) -> Finding:
    return Finding(f"check-failed:{name}", "warn", f"the {name} check failed: {exc}",
                   f"{type(exc).__name__}: {exc}",
                   "please report this with the output of `cpulaunch doctor --format json`")


def _lease_folders(live: bool, findings: list) -> None:
    """The host's --share-host lease folders (issue 39): a folder holding more lease files
    than a job reads (someone flooding it, or litter) is a warning naming the owners; lease
    files nobody holds, and private lease folders under /tmp that nobody holds, are removed
    when they are this user's (root: anyone's)."""
    if not live:
        return
    from cpulaunch.machine import lease

    for folder in (lease.SHARED, lease.FALLBACK, *lease.OLD_FOLDERS):
        got = lease.survey(folder)
        if got is None:
            continue
        owners = ", ".join(f"uid {uid}: {n}" for uid, n in sorted(got.owners.items(), key=lambda x: -x[1])[:3])
        removed = f"; removed {got.removed} that nobody held" if got.removed else ""
        if got.more or got.files > lease.MAX_FILES:
            findings.append(Finding(
                "lease-folder", "warn",
                f"{folder} holds {got.files}{' or more' if got.more else ''} lease files, more than a "
                f"--share-host job reads ({lease.MAX_FILES}){removed}: {owners}",
                detail="a job reads the first files only (and every lock through /proc/locks): a holder whose "
                       "file is not read and whose locks are hidden (another PID namespace) is not seen",
                fix="remove the files nobody holds (cpulaunch doctor as root does), or ask their owners"))
        else:
            findings.append(Finding("lease-folder", "ok", f"{folder}: {got.files} lease files{removed}"
                                    + (f" ({owners})" if owners else "")))
    gone = lease.tidy_private()
    if gone:
        findings.append(Finding("lease-folder", "info", f"removed {len(gone)} private lease folder(s) nobody "
                                                        f"held: {', '.join(gone[:3])}"))


def _guarded(name: str, findings: list, fn: Callable, *args):
    """Run one check; any exception becomes a ``check-failed:<name>`` finding."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - a doctor must never die on a strange machine
        findings.append(_failed(name, exc))
        return None


def _files_not_read(readers: tuple) -> list:
    """One ``file-not-read:<path>`` warning per file that was present but not read (a FIFO,
    a device, a folder, an oversized file, permission denied), in read order."""
    findings, seen = [], set()
    for files in readers:
        for rel, why in files.skipped:
            path = printable(files.prefix + rel)
            if path in seen:
                continue
            seen.add(path)
            denied = why == "permission denied"
            findings.append(Finding(
                f"file-not-read:{path}", "warn", f"{path} was not read: {why}",
                "what it holds is reported as unknown (null). cpulaunch reads regular files only, "
                "at most 1 MiB of a sysfs or procfs file, and never waits on a FIFO or a device.",
                "run as a user who may read it" if denied else
                "replace it with a copy of the file from the machine the dump comes from (a regular "
                "file, not a FIFO or a link to a device), or remove it",
            ))
    return findings


def diagnose(root: str | os.PathLike = "/", environ: Optional[Mapping[str, str]] = None, *, live: bool,
             mem_policy: MemPolicy = MemPolicy.BIND) -> Report:
    """Examine the machine at ``root`` and this Python environment.

    Args:
        root: ``/`` or a ``--sysroot`` dump; every system file is read below it, through
            the probe's bounded reader (:class:`cpulaunch.machine.files.FileReader`).
        environ: the user's environment (default ``os.environ``); never modified.
        live: True when ``root`` is this running machine: numactl is then run once, with
            the launcher's own check for ``mem_policy`` (``numactl -C <allowed CPUs> -m
            <their memory nodes> true`` for bind); with False it is reported "not checked:
            another machine".
        mem_policy: the ``--mem-policy`` of the launch to check numactl for (default bind,
            the launcher's default).

    Returns:
        a :class:`Report`. Never raises for what it reads: a missing or garbled file is a
        finding (a FIFO, device or oversized file: ``file-not-read:<path>``), and a check
        that fails outright is a ``check-failed:<name>`` finding.
    """
    environ = os.environ if environ is None else environ
    files, host = FileReader(root), FileReader("/")
    findings: list = []
    try:
        topo_pair = _topology(files, findings)
    except CpulaunchError as exc:  # e.g. TopologyError: no CPU under root
        findings.append(Finding("topology", "error", f"cannot read the machine under {root}: {exc}",
                                fix="point --sysroot at the root of a Linux machine or dump (holding "
                                    "sys/devices/system/cpu), or repair the file named"))
        topo_pair = None
    except Exception as exc:  # noqa: BLE001 - never a traceback
        findings.append(_failed("topology", exc))
        topo_pair = None
    summary, topo = topo_pair if topo_pair else (None, None)
    numactl = isa = settings = None
    if topo is not None:
        numactl = _guarded("numactl", findings, _numactl, topo, environ, live, mem_policy, findings)
        isa = _guarded("isa", findings, _isa, live, topo, findings)
        settings = _guarded("settings", findings, _settings, files, topo, live, findings)
    libs = _guarded("libraries", findings, _libraries, host, environ, findings) or ()
    torch = _guarded("torch", findings, _torch, findings)
    env = _guarded("environment", findings, _environment, environ, findings)
    ccl = _guarded("ccl", findings, _ccl, environ, findings)
    _guarded("zentorch", findings, _zentorch, environ, topo, findings)
    _guarded("lease-folders", findings, _lease_folders, live, findings)
    findings += _files_not_read((files, host))
    return Report(
        root=str(root), live=live, findings=tuple(findings), topology=summary, numactl=numactl,
        libraries=libs, torch=torch, isa=isa, settings=settings, environment=env, ccl=ccl,
    )


def exit_code(report: Report, *, strict: bool = False) -> int:
    """The exit status of ``cpulaunch doctor`` for ``report``: 1 when a finding is an error
    (with ``strict``, also a warning), else 0; like ``cpulaunch verify``'s 1 = "differs",
    so a CI job can gate on it. (2, a usage error, is the CLI's.)"""
    worst = SEVERITIES.index(report.worst)
    return 1 if worst >= SEVERITIES.index("warn" if strict else "error") else 0


# --------------------------------------------------------------------------- output


def to_json(report: Report) -> dict[str, Any]:
    """The report as JSON-ready data; keys documented in docs/guide/doctor.md (pure).
    CPU and node sets are kernel list strings ("0-3,8"); absent facts are null."""
    fmt = cpulist.format
    t, n, i, s, e, tr = (report.topology, report.numactl, report.isa, report.settings,
                         report.environment, report.torch)
    return {
        "schema_version": SCHEMA_VERSION,
        "root": report.root,
        "live": report.live,
        "worst": report.worst,
        "findings": [
            {"id": f.id, "severity": f.severity, "summary": f.summary, "detail": f.detail, "fix": f.fix}
            for f in report.findings
        ],
        "topology": None if t is None else {
            "model": t.model, "platform": t.platform.text, "vendor": t.platform.vendor or None,
            "family": t.platform.family or None, "recipe": t.recipe, "sockets": t.sockets, "nodes": list(t.nodes),
            "memory_nodes": list(t.memory_nodes), "cores": t.cores,
            "threads_per_core": t.threads_per_core, "online": fmt(t.online), "offline": fmt(t.offline),
            "allowed": fmt(t.allowed), "allowed_source": t.allowed_source,
            "cpuset": None if t.cpuset is None else fmt(t.cpuset),
            "quota_cpus": t.quota_cpus, "quota_source": t.quota_source or None,
            "limits": list(t.limits), "hybrid": t.hybrid, "notes": list(t.notes),
        },
        "numactl": None if n is None else {
            "path": n.path, "checked": n.checked, "usable": n.usable, "reason": n.reason or None,
            "argv": list(n.argv) or None,
        },
        "libraries": [
            {"name": lib.name, "kind": lib.kind, "found": lib.path is not None, "path": lib.path,
             "realpath": lib.realpath, "version": lib.version, "package": lib.package,
             "install": lib.install}
            for lib in report.libraries
        ],
        "torch": None if tr is None else {
            "version": tr.version, "libtorch_cpu": tr.libtorch_cpu, "needed": list(tr.needed),
            "openmp": tr.openmp, "openmp_library": tr.openmp_library,
            "oneccl_bindings_version": tr.oneccl_version, "ipex_version": tr.ipex_version,
            "error": tr.error or None,
        },
        "isa": None if i is None else {
            "arch": i.arch, "present": list(i.present), "bf16_fast": i.bf16_fast,
            "int8_fast": i.int8_fast, "meaning": i.meaning,
        },
        "settings": None if s is None else {
            "numa_balancing": s.numa_balancing, "cpufreq": s.cpufreq, "governors": dict(s.governors),
            "thp_enabled": s.thp_enabled, "thp_defrag": s.thp_defrag,
            "smt_active": s.smt_active, "smt_control": s.smt_control,
        },
        "ccl": None if report.ccl is None else {
            "binding": report.ccl.binding, "version": report.ccl.version, "loads": report.ccl.loads,
            "why": report.ccl.why or None, "libfabric": report.ccl.libfabric, "providers": report.ccl.providers,
            "collective": report.ccl.collective, "collective_error": report.ccl.collective_error or None,
            "env": dict(report.ccl.env) if report.ccl.env else None,
        },
        "environment": None if e is None else {
            "vars": dict(e.vars), "preload": list(e.preload),
            "preload_allocators": list(e.preload_allocators), "preload_openmp": list(e.preload_openmp),
        },
    }


_MARK = {"ok": "ok   ", "info": "info ", "warn": "WARN ", "error": "ERROR"}


def render_text(report: Report) -> str:
    """A person's view: facts first, then findings most serious first, each with its fix."""
    fmt = cpulist.format
    lines = [f"cpulaunch doctor: {'this machine' if report.live else 'sysroot ' + report.root}"]
    t = report.topology
    if t is not None:
        lines.append(f"  CPU: {t.model or '?'}; {t.sockets} socket(s), NUMA nodes {fmt(t.nodes) or '-'} "
                     f"(memory on {fmt(t.memory_nodes) or '-'}), {t.cores} cores x {t.threads_per_core} "
                     f"thread(s), online {fmt(t.online)}" + (f", offline {fmt(t.offline)}" if t.offline else ""))
        lines.append(f"  {platform_line(t.platform)}")
        lines.append(f"  allowed CPUs: {fmt(t.allowed)} ({t.allowed_source})"
                     + (f"; cgroup cpuset {fmt(t.cpuset)}" if t.cpuset is not None else "")
                     + (f"; CPU quota {t.quota_cpus:g}" if t.quota_cpus is not None else ""))
    if report.isa is not None:
        # the flags only: what they mean is the isa finding's sentence, said once below
        lines.append(f"  ISA ({report.isa.arch}): {' '.join(report.isa.present) or '-'}")
    n = report.numactl
    if n is not None:
        state = ("usable" if n.usable else f"unusable: {n.reason}") if n.checked else n.reason
        lines.append(f"  numactl: {n.path or 'not installed'} ({state})")
    for lib in report.libraries:
        lines.append(f"  {lib.name}: " + (f"{lib.path}" + (f" {lib.version}" if lib.version else "")
                                          + (f" [{lib.package}]" if lib.package else "")
                                          if lib.path else f"missing ({lib.install})"))
    tr = report.torch
    if tr is not None:
        lines.append(f"  torch: {tr.version or 'not installed'}"
                     + (f", OpenMP {tr.openmp} ({tr.openmp_library})" if tr.openmp else "")
                     + f", oneCCL bindings {tr.oneccl_version or 'not installed'}")
    c = report.ccl
    if c is not None and c.binding is not None:
        lines.append(f"  oneCCL: bindings {c.version or '?'} ({'loads' if c.loads else 'does not load'}), "
                     f"libfabric {c.libfabric or 'missing'}, providers {c.providers or 'missing'}, collective "
                     + {True: "ran", False: "failed", None: "not tried"}[c.collective])
    if report.environment is not None and report.environment.vars:
        lines.append("  environment: " + " ".join(f"{k}={v}" for k, v in report.environment.vars.items()))
    lines.append("")
    order = sorted(report.findings, key=lambda f: -SEVERITIES.index(f.severity))
    for f in order:
        lines.append(f"{_MARK.get(f.severity, f.severity)} {f.id}: {f.summary}")
        if f.detail and f.severity in ("warn", "error"):
            lines.append(f"        {f.detail}")
        if f.fix and f.severity != "ok":
            lines.append(f"        fix: {f.fix}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the command


@click.command("doctor", context_settings=CLICK_CONTEXT)
@shared_option("sysroot", help="Examine a dump of another machine (numactl is then not run).")
@shared_option("fmt", help=None, choices=("text", "json"))
@click.option("--mem-policy", type=click.Choice([p.value for p in MemPolicy]),
              default="bind", show_default=True,
              help="The --mem-policy of the launch to check numactl for (the launcher's own check).")
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too, not only on errors.")
@click.option("--clear-cache", is_flag=True,
              help="Remove the launcher's cached oneCCL verdicts ($XDG_CACHE_HOME/cpulaunch, else "
                   "~/.cache/cpulaunch) and exit; the next --ddp run checks the bindings again.")
def command(sysroot, fmt, mem_policy, strict, clear_cache):
    """What to know before trusting a pinned run on this machine, each finding with its fix.

    Exit status: 0 when no finding is an error (with --strict: no error and no warning),
    1 when one is (the report is printed either way), 2 on a usage error."""
    from cpulaunch import core
    from cpulaunch.machine import probe
    from cpulaunch.forms import json_text

    if clear_cache:
        from cpulaunch.machine.host import clear_cache as clear
        from cpulaunch.machine.host import own_cache_dir

        folder, note = own_cache_dir(os.environ)  # the folder this user's runs wrote (issue 39)
        if note:
            click.echo(note, err=True)
        removed = clear(folder)
        core.write_out(json_text({"cache": None if folder is None else str(folder), "removed": removed}) + "\n"
                       if fmt == "json" else
                       f"removed {len(removed)} cached oneCCL verdict(s) from {folder or 'no cache folder (no HOME)'}\n")
        return 0

    probe.check_sysroot(sysroot)
    report = diagnose(sysroot, os.environ, live=probe.is_live(sysroot), mem_policy=MemPolicy(mem_policy))
    core.write_out(json_text(to_json(report)) + "\n" if fmt == "json" else render_text(report))
    return exit_code(report, strict=strict)


def main(args: Sequence[str]) -> int:
    """``cpulaunch doctor ARGS``: returns the exit status (raises CpulaunchError and click's
    usage errors for :func:`cpulaunch.cli.main` to map)."""
    return command.main(args=list(args), prog_name="cpulaunch doctor", standalone_mode=False)
