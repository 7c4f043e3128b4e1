"""Plan -> per-instance environment and argv, and their text forms. Pure.

Environment precedence (documented in docs/plan-json.md): cpulaunch computes *planned*
values; a *tunable* the user already set in their environment keeps the user's value
(with a note) unless ``override_env``; *identity* variables (instance index, rank
variables) are always cpulaunch's. ``LD_PRELOAD`` is merged: the user's entries are kept,
bare names included, and cpulaunch's are put in front.

Rules and where they come from:

- ``OMP_NUM_THREADS`` = the instance's CPU count: the PyTorch CPU tuning guide; torch
  otherwise uses every CPU of its affinity mask for intra-op threads.
- Intel OpenMP: ``KMP_AFFINITY=granularity=fine,compact,1,0`` (one thread per core,
  pinned) only when the instance is bound, and ``KMP_BLOCKTIME=1`` (idle threads stop
  spinning after 1 ms): the tuning guide and Intel's OpenMP documentation.
- GNU OpenMP: no ``GOMP_CPU_AFFINITY``: with torch's bundled libgomp it can drop torch
  to one thread (pytorch#149422). ``OMP_PROC_BIND``/``OMP_PLACES`` are left unset by
  default (measured within noise here: docs/performance.md).
- jemalloc's ``MALLOC_CONF`` comes from the library registry (tuning guide value).
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

from cpulaunch import cpulist
from cpulaunch.errors import CpulaunchError
from cpulaunch.libraries import REGISTRY, identify, preload_entries
from cpulaunch.plan import Instance, MemPolicy, Plan

__all__ = [
    "Settings",
    "Rendered",
    "RenderedInstance",
    "ProgramError",
    "resolve_program",
    "numactl_prefix",
    "render",
    "shell_exports",
    "dotenv_lines",
    "plan_json",
]

class ProgramError(CpulaunchError, ValueError):
    """No program, or an unusable program form."""


@dataclass(frozen=True)
class Settings:
    """Choices resolved against the host before rendering (all typed, no strings to parse).

    Attributes:
        omp_runtime: "intel" or "gnu" (already resolved from "auto").
        iomp5: path of libiomp5 to preload when omp_runtime is "intel".
        allocator: "jemalloc", "tcmalloc" or None (the C library's malloc).
        allocator_path: path of the allocator's library.
        bind: "numactl", "affinity" or "none".
        numactl: path of numactl when bind is "numactl".
        override_env: cpulaunch's values win over the user's.
        environ: the user's environment (never modified).
        extra_env: more tunables for every instance (e.g. CPULAUNCH_INFERENCE_PATH).
        instance_env: identity variables per instance index (e.g. RANK for DDP ranks).
        omp_places: set OMP_PLACES/OMP_PROC_BIND (GNU) to the compute CPUs.
    """

    omp_runtime: str = "gnu"
    iomp5: Optional[Path] = None
    allocator: Optional[str] = None
    allocator_path: Optional[Path] = None
    bind: str = "numactl"
    numactl: str = "numactl"
    override_env: bool = False
    environ: Mapping[str, str] = field(default_factory=dict)
    extra_env: Mapping[str, str] = field(default_factory=dict)
    instance_env: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    omp_places: bool = False


@dataclass(frozen=True)
class RenderedInstance:
    """What one instance runs.

    Attributes:
        index: instance index (as in the plan).
        cpus: compute logical CPUs; ``bound_cpus``: every CPU it is bound to.
        env: the variables cpulaunch sets (final values), sorted by name.
        argv: the full command, binding prefix included.
        prefix: the binding prefix alone (``numactl ...``), empty if none.
        affinity: CPUs to set with sched_setaffinity before exec (bind="affinity").
    """

    index: int
    cpus: tuple
    bound_cpus: tuple
    mem_nodes: tuple
    mem_policy: str
    env: Mapping[str, str]
    argv: tuple
    prefix: tuple
    affinity: Optional[tuple] = None


@dataclass(frozen=True)
class Rendered:
    """The rendered plan: instances and every note (plan notes first)."""

    instances: tuple
    num_instances: int
    notes: tuple


def resolve_program(args: Sequence[str], no_python: bool = False, python: str = sys.executable) -> tuple:
    """The program's argv from what followed cpulaunch's options.

    ``["x.py", "a"]`` -> ``[python, "x.py", "a"]``; ``["-m", "pkg"]`` -> ``[python, "-m",
    "pkg"]``; anything else as it is (``["python", "x.py"]``, ``["true"]``). With
    ``no_python`` the words are always run as they are.

    Raises:
        ProgramError: ``args`` is empty.
    """
    args = list(args)
    if not args:
        raise ProgramError(
            "no program given; put it after cpulaunch's options, e.g. "
            "`cpulaunch --instances-per-socket python infer.py`"
        )
    if no_python:
        return tuple(args)
    if args[0] == "-m":
        if len(args) < 2:
            raise ProgramError("-m needs a module name, e.g. `cpulaunch -m mypkg.serve`")
        return (python, *args)
    if args[0].endswith(".py"):
        return (python, *args)
    return tuple(args)


def numactl_prefix(numactl: str, cpus: Sequence[int], policy: MemPolicy, mem_nodes: Sequence[int]) -> tuple:
    """``numactl -C <cpulist>`` plus the memory flag (numactl(8)): bind ``-m``, preferred
    ``-p``, interleave ``-i``, local ``-l``, none nothing."""
    argv = [numactl, "-C", cpulist.format(cpus)]
    nodes = cpulist.format(mem_nodes)
    policy = MemPolicy(policy)
    if policy is MemPolicy.BIND and nodes:
        argv += ["-m", nodes]
    elif policy is MemPolicy.PREFERRED and nodes:
        argv += ["-p", nodes]
    elif policy is MemPolicy.INTERLEAVE and nodes:
        argv += ["-i", nodes]
    elif policy is MemPolicy.LOCAL:
        argv += ["-l"]
    return tuple(argv)


def _planned_tunables(inst: Instance, settings: Settings) -> dict:
    env = {"OMP_NUM_THREADS": str(inst.threads)}
    bound = settings.bind != "none"
    if settings.omp_runtime == "intel":
        if bound:
            if inst.reserved_cpus:
                # Keep OpenMP threads off the reserved (oneCCL worker) CPUs.
                procs = ",".join(str(c) for c in inst.cpus)
                env["KMP_AFFINITY"] = f"granularity=fine,proclist=[{procs}],explicit"
            else:
                env["KMP_AFFINITY"] = "granularity=fine,compact,1,0"
        env["KMP_BLOCKTIME"] = "1"
    elif bound and (settings.omp_places or inst.reserved_cpus):
        env["OMP_PLACES"] = ",".join("{%d}" % c for c in inst.cpus)
        env["OMP_PROC_BIND"] = "close"
    if settings.allocator:
        env.update(REGISTRY[settings.allocator].env)
    env.update(settings.extra_env)
    return env


def _preload(settings: Settings, notes: list) -> Optional[str]:
    user = preload_entries(settings.environ.get("LD_PRELOAD", ""))
    ours: list = []
    if settings.omp_runtime == "intel" and settings.iomp5:
        if not any(identify(e) == "iomp5" for e in user):
            ours.append(str(settings.iomp5))
    if settings.allocator and settings.allocator_path:
        user_allocs = {identify(e) for e in user} & {"jemalloc", "tcmalloc"}
        if user_allocs:
            notes.append(
                f"LD_PRELOAD already holds {', '.join(sorted(user_allocs))}: not preloading "
                f"{settings.allocator} too (never two allocators)"
            )
        else:
            ours.append(str(settings.allocator_path))
    if not ours:
        return None
    return " ".join(ours + user)


def render(plan: Plan, program: Sequence[str], settings: Settings) -> Rendered:
    """Render every instance of ``plan`` running ``program`` under ``settings`` (pure).

    Returns:
        :class:`Rendered` with each instance's env (only what cpulaunch sets) and argv.
    """
    notes: list = list(plan.notes)
    preload = _preload(settings, notes)
    kept_note_done: set = set()
    out = []
    for inst in plan.instances:
        planned = _planned_tunables(inst, settings)
        env: dict = {}
        for name, value in planned.items():
            user = settings.environ.get(name)
            if user is not None and user != value and not settings.override_env:
                if name not in kept_note_done:
                    notes.append(
                        f"{name}={user} from your environment kept (cpulaunch planned "
                        f"{value}); pass --override-env to use cpulaunch's value"
                    )
                    kept_note_done.add(name)
                continue
            env[name] = value
        if preload:
            env["LD_PRELOAD"] = preload
        env["CPULAUNCH_INSTANCE_INDEX"] = str(inst.index)
        env["CPULAUNCH_NUM_INSTANCES"] = str(plan.num_instances)
        env["CPULAUNCH_CPUS"] = inst.cpulist
        env.update(settings.instance_env.get(inst.index, {}))
        if settings.bind == "numactl":
            prefix = numactl_prefix(settings.numactl, inst.bound_cpus, inst.mem_policy, inst.mem_nodes)
            affinity = None
        elif settings.bind == "affinity":
            prefix, affinity = (), inst.bound_cpus
        else:
            prefix, affinity = (), None
        out.append(
            RenderedInstance(
                index=inst.index,
                cpus=inst.cpus,
                bound_cpus=inst.bound_cpus,
                mem_nodes=inst.mem_nodes if settings.bind == "numactl" else (),
                mem_policy=inst.mem_policy.value if settings.bind == "numactl" else "none",
                env=dict(sorted(env.items())),
                argv=tuple(prefix) + tuple(program),
                prefix=tuple(prefix),
                affinity=affinity,
            )
        )
    return Rendered(instances=tuple(out), num_instances=plan.num_instances, notes=tuple(notes))


# --------------------------------------------------------------------------- text forms


def binding_prefix(inst: RenderedInstance, taskset: Optional[str] = "taskset") -> tuple:
    """The command to put in front of the program for a shell script: the numactl prefix,
    or with ``bind="affinity"`` ``taskset -c <cpus>`` (taskset(1)); empty when unbound."""
    if inst.prefix:
        return tuple(inst.prefix)
    if inst.affinity is not None and taskset:
        return (taskset, "-c", cpulist.format(inst.affinity))
    return ()


def _print_prefix(inst: RenderedInstance, taskset: Optional[str]) -> str:
    return shlex.join(binding_prefix(inst, taskset))


def shell_exports(inst: RenderedInstance, taskset: Optional[str] = "taskset") -> str:
    """POSIX ``export NAME='value'`` lines, safe to ``eval`` whatever the values hold
    (every value single-quoted by shlex.quote), and ``CPULAUNCH_PREFIX``: the binding
    command to put in front of the program (``$CPULAUNCH_PREFIX python x.py``)."""
    lines = [f"export {k}={shlex.quote(v)}" for k, v in inst.env.items()]
    lines.append(f"export CPULAUNCH_PREFIX={shlex.quote(_print_prefix(inst, taskset))}")
    return "\n".join(lines) + "\n"


def _dotenv_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("$", "\\$") + '"'


def dotenv_lines(inst: RenderedInstance, taskset: Optional[str] = "taskset") -> str:
    """``NAME="value"`` lines (python-dotenv / docker-compose style, backslash escapes)."""
    env = dict(inst.env)
    env["CPULAUNCH_PREFIX"] = _print_prefix(inst, taskset)
    return "".join(f"{k}={_dotenv_quote(v)}\n" for k, v in env.items())


def instance_dict(inst: RenderedInstance) -> dict:
    """One instance in the JSON schema of docs/plan-json.md."""
    return {
        "index": inst.index,
        "cpus": list(inst.cpus),
        "cpulist": cpulist.format(inst.cpus),
        "bound_cpus": list(inst.bound_cpus),
        "mem_nodes": list(inst.mem_nodes),
        "mem_policy": inst.mem_policy,
        "env": dict(inst.env),
        "argv": list(inst.argv),
    }


def plan_json(rendered: Rendered, topology: dict, extra: Optional[dict] = None) -> str:
    """``--dry-run --format json``: ``{"instances": [...], "notes": [...], "topology": {...}}``."""
    doc = {
        "instances": [instance_dict(i) for i in rendered.instances],
        "num_instances": rendered.num_instances,
        "notes": list(rendered.notes),
        "topology": topology,
    }
    if extra:
        doc.update(extra)
    return json.dumps(doc, indent=2)


def dry_run_text(rendered: Rendered) -> str:
    """Human-readable dry run: each instance's command and the env it changes, then notes."""
    lines = []
    for inst in rendered.instances:
        lines.append(f"# instance {inst.index}: cpus {cpulist.format(inst.cpus)}"
                     + (f" (+ reserved {cpulist.format(set(inst.bound_cpus) - set(inst.cpus))})"
                        if set(inst.bound_cpus) != set(inst.cpus) else "")
                     + (f", memory {inst.mem_policy} {cpulist.format(inst.mem_nodes)}" if inst.mem_nodes else "")
                     + (f", affinity {cpulist.format(inst.affinity)}" if inst.affinity else ""))
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in inst.env.items())
        lines.append(f"env {env} {shlex.join(inst.argv)}")
    for note in rendered.notes:
        lines.append(f"# note: {note}")
    return "\n".join(lines) + "\n"
