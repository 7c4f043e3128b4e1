"""Host facts beyond the topology, gathered once, before planning.

The second half of the probe: which libraries are installed, whether numactl is there
and usable, which engine (torchrun, MPI, Slurm) started us, a free port. One typed value,
:class:`Host`, is passed into planning and rendering, which stay pure; nothing after
planning reads the host again, so ``--dry-run`` shows what a run does.

Costs (issue 12): no subprocess except one ``numactl ... true`` when binding with numactl
on this machine (none under ``--sysroot``, where the plan describes the dumped machine and
numactl is assumed there); libraries are found by looking in folders, not ``ldconfig -p``.
"""

import shutil
import sys
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping, NamedTuple, Optional, Sequence

from cpulaunch.machine import libraries
from cpulaunch.machine.topology import Topology
from cpulaunch.options import BindMode, Options

if TYPE_CHECKING:
    from cpulaunch.distributed import RankContext

#: Variables by which distributed.detect_engine recognises an engine (one of them is set in
#: every process torchrun, Open MPI, MPICH, Slurm or PMIx starts). Checked here first so a
#: plain run does not import cpulaunch.distributed (issue 12); tests/test_distributed.py
#: holds the two lists equal.
ENGINE_VARIABLES = ("LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "PMIX_RANK")

__all__ = ["Host", "gather", "free_port", "dist_version", "check_numactl"]


class Host(NamedTuple):
    """What this machine offers the run (typed; gathered by :func:`gather`).

    Attributes:
        live: the topology is this machine's (no ``--sysroot``).
        environ: the user's environment, as it was (never modified).
        python: the interpreter for ``.py`` programs (sys.executable).
        libraries: registry name -> path found on this machine (only those looked up;
            None = looked up and missing).
        numactl: numactl's path on this machine, None if not installed.
        numactl_usable: True/False after the check on this machine; None when not
            checked (``--sysroot``, or binding other than numactl).
        numactl_reason: numactl's own words when it refused, else "".
        taskset: taskset's path, for ``--print-env``'s CPULAUNCH_PREFIX under affinity.
        engine: the engine that started this process (torchrun, MPI, Slurm), if any.
        free_port: a TCP port free on 127.0.0.1 now (one-machine DDP), or None.
        ccl_found: oneccl_bindings_for_pytorch is importable (checked without import).
        dist_versions: installed versions of "torch" and "oneccl_bind_pt" (package
            metadata; None when not installed), gathered for --ddp's backend choice.
    """

    live: bool
    environ: Mapping[str, str]
    python: str = sys.executable
    libraries: Mapping[str, Optional[Path]] = MappingProxyType({})
    numactl: Optional[str] = None
    numactl_usable: Optional[bool] = None
    numactl_reason: str = ""
    taskset: Optional[str] = None
    engine: Optional["RankContext"] = None
    free_port: Optional[int] = None
    ccl_found: bool = False
    dist_versions: Mapping[str, Optional[str]] = MappingProxyType({})


def _wanted_libraries(opts: Options) -> list:
    names = []
    if opts.allocator == "auto":
        names.append(libraries.by_choice("allocator", libraries.AUTO_ALLOCATOR).name)
    elif opts.allocator != "default":
        names.append(libraries.by_choice("allocator", opts.allocator).name)
    if opts.omp_runtime not in ("auto",):
        names.append(libraries.by_choice("openmp", opts.omp_runtime).name)
    return names


def check_numactl(prefixes: Sequence[Sequence[str]], timeout: float = 10.0) -> Optional[str]:
    """Run each planned ``numactl ... true`` once; None if all work, else numactl's reason.

    Checks the CPUs and nodes actually planned (not CPU 0 and node 0): a container without
    CAP_SYS_NICE gets ``set_mempolicy: Operation not permitted`` only for some policies,
    and a cpuset may refuse some CPUs. One short exec per distinct prefix, through
    :func:`cpulaunch.machine.exec.run_quietly` (no subprocess import).

    Args:
        prefixes: numactl command lines without the program (each
            :func:`cpulaunch.machine.numactl.argv`).
    """
    from cpulaunch.machine.exec import run_quietly

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


def dist_version(*names: str) -> Optional[str]:
    """The installed version of the first of the distributions ``names`` that is installed
    (package metadata, nothing imported): ``dist_version("torch")`` -> "2.13.0+cpu"; None
    when none is."""
    from importlib import metadata

    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def free_port(host: str = "127.0.0.1") -> Optional[int]:
    """A TCP port free on ``host`` right now (bind to port 0), or None."""
    import socket  # only --ddp needs it: kept off the launch path

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    except OSError:
        return None


def gather(opts: Options, topo: Topology, environ: Mapping[str, str]) -> Host:
    """Read every host fact the run needs, once (the only host reads besides the probe).

    Raises:
        distributed.DistributedError: an engine's variables are present but unusable.
    """
    import importlib.util

    from cpulaunch.machine import numactl as numactl_mod
    from cpulaunch.machine.probe import is_live

    live = is_live(opts.sysroot)
    from cpulaunch.machine.libfinder import find

    found = {name: find(libraries.REGISTRY[name], environ) for name in _wanted_libraries(opts)}
    numactl = shutil.which("numactl") if opts.bind is BindMode.NUMACTL else None
    usable, reason = None, ""
    if opts.bind is BindMode.NUMACTL and live and numactl and opts.output is not opts.output.SHOW_TOPOLOGY:
        argv = numactl_mod.check_argv(numactl, topo, opts.request.mem_policy)
        reason = check_numactl([argv[:-1]]) or ""
        usable = not reason
    engine = None
    if any(v in environ for v in ENGINE_VARIABLES):
        from cpulaunch.distributed import detect_engine

        engine = detect_engine(environ)
    port = None
    if opts.ddp is not None and engine is None and opts.ddp.master_port is None and opts.ddp.nnodes == "1" \
            and not opts.ddp.master_addr and not opts.ddp.elastic:
        port = free_port()
    ccl, versions = False, {}
    if opts.ddp is not None and opts.ddp.backend != "gloo":
        ccl = importlib.util.find_spec("oneccl_bindings_for_pytorch") is not None
        versions = {name: dist_version(name) for name in ("torch", "oneccl_bind_pt")}
    return Host(
        live=live,
        environ=dict(environ),
        python=sys.executable,
        libraries=found,
        numactl=numactl,
        numactl_usable=usable,
        numactl_reason=reason,
        taskset=shutil.which("taskset"),
        engine=engine,
        free_port=port,
        ccl_found=ccl,
        dist_versions=versions,
    )
