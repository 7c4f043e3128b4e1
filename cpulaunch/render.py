"""Plan -> each instance's environment and argv. Pure.

Their text forms (shell, dotenv, JSON, dry run, bind strings) are in :mod:`cpulaunch.forms`,
the topology view in :mod:`cpulaunch.view` (and :mod:`cpulaunch.svg`); the names they held
here still import from this module (:func:`__getattr__`).

Environment precedence (documented in docs/reference/plan-json.md): cpulaunch computes *planned*
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
  default (measured within noise here: docs/dev/measurements.md).
- jemalloc's ``MALLOC_CONF`` comes from the library registry (tuning guide value).
- The platform's environment recipe (:mod:`cpulaunch.machine.recipes`, chosen with the
  other settings by :func:`cpulaunch.settings.resolve_settings`): its variables are tunables like the ones above; they replace the
  registry's (AMD's MALLOC_CONF for jemalloc) and give way to cpulaunch's options and
  pinning (``--kmp-blocktime``, ``--omp-places`` and helper CPUs' OMP_PLACES/OMP_PROC_BIND).
  Every instance gets ``CPULAUNCH_PLANNED_RECIPE`` naming it.
"""

from __future__ import annotations

import os
import sys
from types import MappingProxyType

from cpulaunch import cpulist, envvars
from cpulaunch.errors import CpulaunchError
from cpulaunch.forms import one_line
from cpulaunch.machine import numactl
from cpulaunch.machine.libraries import REGISTRY, by_choice, identify, preload_entries
from cpulaunch.machine.recipes import Applied
from cpulaunch.names import BindMode, is_python_name
from cpulaunch.notes import explain, retext
from cpulaunch.plan import Instance, Plan
from cpulaunch.records import TYPE_CHECKING, Record

if TYPE_CHECKING:
    from typing import Mapping, Optional, Sequence

__all__ = [
    "Settings",
    "Rendered",
    "RenderedInstance",
    "ProgramError",
    "resolve_program",
    "render",
]

#: Names that lived here before the text forms and the topology view became modules of their
#: own: ``from cpulaunch.render import json_text`` keeps working (:func:`__getattr__`).
_MOVED = {
    **dict.fromkeys(("RUN_FUNCTION", "EVAL_FAILS", "TEXT_WIDTH", "binding_prefix", "shell_exports",
                     "dotenv_lines", "omp_bind_string", "bind_lines", "instance_dict", "plan_json",
                     "json_text", "command_text", "dry_run_text"), "cpulaunch.forms"),
    **dict.fromkeys(("ISA_FLAGS", "topology_text", "platform_line", "topology_boxes", "SocketBox",
                     "NodeBox", "CacheBox", "cache_size_text", "gib_text"), "cpulaunch.view"),
}


def __getattr__(name: str):
    """A name moved to :mod:`cpulaunch.forms` or :mod:`cpulaunch.view`, from there (PEP 562).

    Raises:
        AttributeError: ``name`` is not one of them.
    """
    where = _MOVED.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if where == "cpulaunch.forms":
        from cpulaunch import forms as module
    else:
        from cpulaunch import view as module
    return getattr(module, name)


class ProgramError(CpulaunchError, ValueError):
    """No program, or an unusable program form."""


class Settings(Record):
    """Choices resolved against the host before rendering (all typed, no strings to parse).

    Attributes:
        omp_runtime: an OpenMP choice of the library registry ("gnu", "intel"), resolved
            from "auto"; its registry entry gives the env rules (pinning style, blocktime).
        openmp_path: file to preload for that runtime (None: nothing to preload).
        allocator: registry name of the allocator to preload, or None (the C library's).
        allocator_path: its file.
        bind: how instances are bound (:class:`cpulaunch.names.BindMode`), after numactl's
            fallback (``bind_fallback``).
        numactl: numactl's path (or "numactl" when describing another machine; "" under
            --bind affinity when this machine has none).
        override_env: cpulaunch's values win over the user's.
        environ: the user's environment (never modified).
        extra_env: more tunables for every instance (e.g. CPULAUNCH_PLANNED_INFERENCE_PATH).
        instance_env: identity variables per instance index (e.g. RANK for DDP ranks).
        omp_places: set OMP_PLACES/OMP_PROC_BIND (GNU) to the compute CPUs.
        label: what an instance is called in messages ("instance" or "rank").
        kmp_blocktime: KMP_BLOCKTIME (ms) for runtimes that read it, instead of the
            registry's value (vLLM uses 5; tune searches it).
        dataloader_workers: --dataloader-workers (cores per instance for DataLoader workers).
        instance_program: per instance index, its program where it is not the shared one
            (a DDP rank's ``--local_rank=N`` under ``--pass-local-rank``).
        recipe: the platform's environment recipe for this launch
            (:class:`cpulaunch.machine.recipes.Applied`, chosen by
            :func:`cpulaunch.settings.resolve_settings`); None: none.
        bind_fallback: numactl was asked for but is missing or refuses here, so ``bind`` is
            ``BindMode.AFFINITY`` (the fallback's own note says memory is not bound; no second note).
        one_memory_node: the job may allocate memory on one NUMA node only (the machine's
            one node with memory, or the only one its cpuset's mems allow): a memory policy
            and the first touch put every page there alike, so --bind affinity's note that
            memory is not bound explains and does not warn (a run prints it with -v).
    """

    omp_runtime: str = "gnu"
    openmp_path: Optional[str] = None
    allocator: Optional[str] = None
    allocator_path: Optional[str] = None
    bind: BindMode = BindMode.NUMACTL
    numactl: str = "numactl"
    override_env: bool = False
    environ: Mapping[str, str] = MappingProxyType({})
    extra_env: Mapping[str, str] = MappingProxyType({})
    instance_env: Mapping[int, Mapping[str, str]] = MappingProxyType({})
    omp_places: bool = False
    label: str = "instance"
    kmp_blocktime: Optional[int] = None
    dataloader_workers: int = 0
    instance_program: Mapping[int, tuple[str, ...]] = MappingProxyType({})
    recipe: Optional[Applied] = None
    bind_fallback: bool = False
    one_memory_node: bool = False


class RenderedInstance(Record):
    """What one instance runs.

    Attributes:
        index: instance index (as in the plan).
        cpus: compute logical CPUs; ``bound_cpus``: every CPU it is bound to.
        env: the variables cpulaunch sets (final values), sorted by name.
        argv: the full command, binding prefix included.
        prefix: the binding prefix alone (``numactl ...``), empty if none.
        affinity: CPUs to set with sched_setaffinity before exec (``BindMode.AFFINITY``).
        label: "instance 1" / "rank 1", for messages.
        kept: planned variables whose value in the user's environment was kept (no
            ``--override-env``): name -> (the user's value, cpulaunch's planned value). The
            instance inherits them; ``--print-env`` prints them, so a script written for
            another shell has them too.
    """

    index: int
    cpus: tuple[int, ...]
    bound_cpus: tuple[int, ...]
    mem_nodes: tuple[int, ...]
    mem_policy: str
    env: Mapping[str, str]
    argv: tuple[str, ...]
    prefix: tuple[str, ...]
    affinity: Optional[tuple[int, ...]] = None
    label: str = ""
    kept: Mapping[str, tuple[str, str]] = MappingProxyType({})


class Rendered(Record):
    """The rendered plan: instances and every note (plan notes first), and the
    environment recipe applied (None: none)."""

    instances: tuple[RenderedInstance, ...]
    num_instances: int
    notes: tuple[str, ...]
    recipe: Optional[Applied] = None


def runs_python(argv: Sequence[str], python: str) -> bool:
    """True when ``argv`` (the resolved program, :func:`resolve_program`)
    starts a Python interpreter, as far as its first word tells: ``python``, the
    interpreter cpulaunch runs under (``python``), or a name like ``python3``/``python3.11``
    (any folder). ``["/usr/bin/python3", "x.py"]`` -> True; ``["sh", "run.sh"]`` -> False;
    a console script (``lightning``) -> False (its interpreter is in a file, not read here).
    """
    if not argv:
        return False
    return argv[0] == python or is_python_name(argv[0])



def resolve_program(args: Sequence[str], no_python: bool = False, python: str = sys.executable) -> tuple[str, ...]:
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
    if args[0] in ("-m", "--module", "-c"):
        if len(args) < 2:
            what = "code" if args[0] == "-c" else "a module name"
            raise ProgramError(f"{args[0]} needs {what}, e.g. `cpulaunch -m mypkg.serve`")
        return (python, "-m" if args[0] == "--module" else args[0], *args[1:])
    if args[0].startswith(("-m", "-c")) and not args[0].startswith("--"):
        return (python, *args)  # -mhttp.server, -cCODE: python's own short forms
    if args[0].endswith(".py"):
        return (python, *args)
    return tuple(args)


def _helper_cpus(inst: Instance) -> bool:
    """True when the instance is bound to CPUs its OpenMP threads must stay off
    (oneCCL workers, DataLoader workers, reserved cores)."""
    return set(inst.bound_cpus) != set(inst.cpus)


def _planned_tunables(inst: Instance, settings: Settings) -> dict:
    """OpenMP and allocator variables, by the registry entries' rules (module doc)."""
    omp = by_choice("openmp", settings.omp_runtime)
    env = {"OMP_NUM_THREADS": str(inst.threads)}
    bound = settings.bind is not BindMode.NONE
    helpers = _helper_cpus(inst)
    if bound and omp.pin_style == "kmp":
        if helpers:  # keep OpenMP threads off the helper CPUs
            procs = ",".join(str(c) for c in inst.cpus)
            env["KMP_AFFINITY"] = f"granularity=fine,proclist=[{procs}],explicit"
        else:
            env["KMP_AFFINITY"] = "granularity=fine,compact,1,0"
    elif bound and omp.pin_style == "omp" and (settings.omp_places or helpers):
        env["OMP_PLACES"] = ",".join("{%d}" % c for c in inst.cpus)
        env["OMP_PROC_BIND"] = "close"
    env.update(omp.idle_env)
    if settings.kmp_blocktime is not None and "KMP_BLOCKTIME" in omp.idle_env:
        env["KMP_BLOCKTIME"] = str(settings.kmp_blocktime)
    env.update(omp.env)
    if settings.allocator:
        env.update(REGISTRY[settings.allocator].env)
    if settings.recipe is not None:  # over the registry's values, under cpulaunch's own pinning
        pinned = {"KMP_AFFINITY", "OMP_PLACES", "OMP_PROC_BIND"} & env.keys()
        env.update((k, v) for k, v in settings.recipe.env.items() if k not in pinned
                   and not (k == "KMP_BLOCKTIME" and settings.kmp_blocktime is not None))
    env.update(settings.extra_env)
    return env


def _budget_env(inst: Instance, settings: Settings) -> dict:
    """Identity variables describing the instance's core budgets (issue 11):
    CPULAUNCH_DATALOADER_CPUS (cpulist) and CPULAUNCH_DATALOADER_NUM_WORKERS (the
    --dataloader-workers count: one worker per reserved core), CPULAUNCH_RESERVED_CPUS."""
    env = {}
    dl = tuple(getattr(inst, "dataloader_cpus", ()) or ())
    if dl:
        env[envvars.DATALOADER_CPUS] = cpulist.format(dl)
        env[envvars.DATALOADER_WORKERS] = str(settings.dataloader_workers or len(dl))
    reserved = tuple(getattr(inst, "reserved_cpus", ()) or ())
    if reserved and hasattr(inst, "ccl_cpus"):
        env[envvars.RESERVED_CPUS] = cpulist.format(reserved)
    return env


def _preload(settings: Settings, notes: list) -> Optional[str]:
    """LD_PRELOAD: ours in front of the user's value, which is kept byte for byte."""
    user_value = settings.environ.get("LD_PRELOAD", "")
    user = preload_entries(user_value)
    ours: list = []
    omp = by_choice("openmp", settings.omp_runtime)
    if settings.openmp_path and not any(identify(e) == omp.name for e in user):
        ours.append(str(settings.openmp_path))
    if settings.allocator and settings.allocator_path:
        allocators = {n for n, lib in REGISTRY.items() if lib.kind == "allocator"}
        user_allocs = {identify(e) for e in user} & allocators
        if user_allocs:
            notes.append(
                f"LD_PRELOAD already holds {', '.join(sorted(user_allocs))}: not preloading "
                f"{settings.allocator} too (never two allocators)"
            )
        else:
            ours.append(str(settings.allocator_path))
    if not ours:
        return None
    return " ".join(ours) + (" " + user_value if user_value else "")


def _applied_memory(inst: Instance, settings: Settings) -> tuple:
    """``(policy value, node ids)`` the launch really applies: the plan's under numactl;
    ("none", ()) under --bind affinity or none, which set no memory policy (pages follow
    the first touch)."""
    if settings.bind is BindMode.NUMACTL:
        return inst.mem_policy.value, tuple(inst.mem_nodes)
    return "none", ()


def _memory_not_bound_note(plan: Plan, settings: Settings) -> Optional[str]:
    """Under --bind affinity (asked for, or numactl's fallback) no memory policy is set:
    the note saying the planned one is not applied and where pages go instead (the kernel's
    default policy: first touch, mm/mempolicy.c); None when numactl binds or nothing
    planned a memory policy. Where the job has one memory node (``one_memory_node``) the
    note is an explanation (issue 40): binding would put the pages where they go anyway."""
    planned = sorted({i.mem_policy.value for i in plan.instances if i.mem_policy.value != "none"})
    if settings.bind is not BindMode.AFFINITY or not planned or settings.bind_fallback:
        return None
    fix = ("use --bind numactl to bind memory" if settings.numactl  # "": not installed here (settings)
           else "numactl, which would bind memory, is not installed here")  # never suggest what cannot run
    text = ("memory is not bound: CPUs are bound with sched_setaffinity (--bind affinity), which sets "
            f"no memory policy, so --mem-policy {', '.join(planned)} is not applied and pages follow the "
            f"first touch (each lands on the node of the CPU that first writes it); {fix}")
    return explain(text) if settings.one_memory_node else text


def _expected_env(bound_cpus: Sequence[int], mem_policy: str, mem_nodes: Sequence[int]) -> dict:
    """The identity variables ``cpulaunch verify PID`` compares a process with when no plan
    is at hand (:meth:`cpulaunch.tools.verify.Expected.from_environ`): the logical CPUs it
    is bound to, the memory policy applied ("bind", "interleave", "preferred", "local",
    "none") and its NUMA node ids (absent when none)."""
    env = {envvars.BOUND_CPUS: cpulist.format(bound_cpus), envvars.MEM_POLICY: mem_policy}
    if mem_nodes:
        env[envvars.MEM_NODES] = cpulist.format(mem_nodes)
    return env


def render(plan: Plan, program: Sequence[str], settings: Settings) -> Rendered:
    """Render every instance of ``plan`` running ``program`` under ``settings`` (pure).

    Returns:
        :class:`Rendered` with each instance's env (only what cpulaunch sets) and argv.
    """
    notes: list = list(plan.notes)
    memory_note = _memory_not_bound_note(plan, settings)
    if memory_note:
        notes.append(memory_note)
    preload = _preload(settings, notes)
    kept_note_done: set = set()
    out = []
    for inst in plan.instances:
        planned = _planned_tunables(inst, settings)
        env: dict = {}
        kept: dict = {}
        for name, value in planned.items():
            user = settings.environ.get(name)
            if user is not None and user != value and not settings.override_env:
                kept[name] = (user, value)
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
        env[envvars.INSTANCE_INDEX] = str(inst.index)
        env[envvars.NUM_INSTANCES] = str(plan.num_instances)
        env[envvars.CPUS] = inst.cpulist
        if settings.recipe is not None:
            env[envvars.RECIPE] = settings.recipe.recipe.name
        env.update(_budget_env(inst, settings))
        env.update(settings.instance_env.get(inst.index, {}))
        if settings.bind is BindMode.NUMACTL:
            prefix = numactl.argv(settings.numactl, inst.bound_cpus, inst.mem_policy, inst.mem_nodes)
            affinity = None
        elif settings.bind is BindMode.AFFINITY:
            prefix, affinity = (), inst.bound_cpus
        else:
            prefix, affinity = (), None
        mem_policy, mem_nodes = _applied_memory(inst, settings)
        env.update(_expected_env(inst.bound_cpus, mem_policy, mem_nodes))
        out.append(
            RenderedInstance(
                index=inst.index,
                cpus=inst.cpus,
                bound_cpus=inst.bound_cpus,
                mem_nodes=mem_nodes,
                mem_policy=mem_policy,
                env=dict(sorted(env.items())),
                argv=tuple(prefix) + tuple(settings.instance_program.get(inst.index, program)),
                prefix=tuple(prefix),
                affinity=affinity,
                label=f"{settings.label} {inst.index}",
                kept=dict(sorted(kept.items())),
            )
        )
    return Rendered(instances=tuple(out), num_instances=plan.num_instances,
                    notes=tuple(retext(n, one_line(n)) for n in notes), recipe=settings.recipe)
