"""Plan -> per-instance environment and argv, and their text forms. Pure.

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
- The platform's environment recipe (:mod:`cpulaunch.machine.recipes`, chosen by
  :func:`with_recipe`): its variables are tunables like the ones above; they replace the
  registry's (AMD's MALLOC_CONF for jemalloc) and give way to cpulaunch's options and
  pinning (``--kmp-blocktime``, ``--omp-places`` and helper CPUs' OMP_PLACES/OMP_PROC_BIND).
  Every instance gets ``CPULAUNCH_PLANNED_RECIPE`` naming it.
"""

import sys
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, NamedTuple, Optional, Sequence

from cpulaunch import cpulist, envvars
from cpulaunch.errors import CpulaunchError
from cpulaunch.machine import numactl
from cpulaunch.machine.libraries import REGISTRY, by_choice, identify, preload_entries
from cpulaunch.machine.recipes import Applied
from cpulaunch.notes import retext
from cpulaunch.plan import Instance, Plan

__all__ = [
    "Settings",
    "with_recipe",
    "Rendered",
    "RenderedInstance",
    "ProgramError",
    "resolve_program",
    "json_text",
    "render",
    "shell_exports",
    "dotenv_lines",
    "plan_json",
    "dry_run_text",
    "instance_dict",
    "binding_prefix",
    "omp_bind_string",
    "bind_lines",
    "one_line",
    "command_text",
    "topology_text",
    "platform_line",
    "topology_boxes",
    "SocketBox",
    "NodeBox",
    "CacheBox",
    "cache_size_text",
    "gib_text",
]

class ProgramError(CpulaunchError, ValueError):
    """No program, or an unusable program form."""


class Settings(NamedTuple):
    """Choices resolved against the host before rendering (all typed, no strings to parse).

    Attributes:
        omp_runtime: an OpenMP choice of the library registry ("gnu", "intel"), resolved
            from "auto"; its registry entry gives the env rules (pinning style, blocktime).
        openmp_path: file to preload for that runtime (None: nothing to preload).
        allocator: registry name of the allocator to preload, or None (the C library's).
        allocator_path: its file.
        bind: "numactl", "affinity" or "none".
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
            (:class:`cpulaunch.machine.recipes.Applied`, :func:`with_recipe`); None: none.
        bind_fallback: numactl was asked for but is missing or refuses here, so ``bind`` is
            "affinity" (the fallback's own note says memory is not bound; no second note).
    """

    omp_runtime: str = "gnu"
    openmp_path: Optional[Path] = None
    allocator: Optional[str] = None
    allocator_path: Optional[Path] = None
    bind: str = "numactl"
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


def with_recipe(settings: Settings, topo, choice: str = "auto", wait_policy: str = "auto",
                matmul_algo: Optional[int] = None) -> Settings:
    """``settings`` with the environment recipe of ``--recipe choice`` on the machine
    ``topo`` (pure): ``auto`` takes the platform's (``topo.platform``,
    :func:`cpulaunch.machine.recipes.recipe_for`); its variables are those that take effect
    with the OpenMP runtime and allocator of ``settings`` and the CPU's flags, then
    ``--omp-wait-policy`` and ``--zendnn-matmul-algo``
    (:func:`cpulaunch.machine.recipes.recipe_env`).

    Raises:
        KeyError: ``choice`` names no recipe (the option table's choices prevent it).
    """
    from cpulaunch.machine import recipes

    platform = topo.platform
    recipe = recipes.resolve_recipe(choice, platform.kind)
    env = recipes.recipe_env(recipe, openmp_pin_style=by_choice("openmp", settings.omp_runtime).pin_style,
                             allocator=settings.allocator, flags=topo.flags, wait_policy=wait_policy,
                             matmul_algo=matmul_algo)
    applied = Applied(recipe, platform.text, "auto" if choice in (None, "auto") else "--recipe", env)
    return settings._replace(recipe=applied)


class RenderedInstance(NamedTuple):
    """What one instance runs.

    Attributes:
        index: instance index (as in the plan).
        cpus: compute logical CPUs; ``bound_cpus``: every CPU it is bound to.
        env: the variables cpulaunch sets (final values), sorted by name.
        argv: the full command, binding prefix included.
        prefix: the binding prefix alone (``numactl ...``), empty if none.
        affinity: CPUs to set with sched_setaffinity before exec (bind="affinity").
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


class Rendered(NamedTuple):
    """The rendered plan: instances and every note (plan notes first), and the
    environment recipe applied (None: none)."""

    instances: tuple[RenderedInstance, ...]
    num_instances: int
    notes: tuple[str, ...]
    recipe: Optional[Applied] = None


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
    bound = settings.bind != "none"
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
    if settings.bind == "numactl":
        return inst.mem_policy.value, tuple(inst.mem_nodes)
    return "none", ()


def _memory_not_bound_note(plan: Plan, settings: Settings) -> Optional[str]:
    """Under --bind affinity (asked for, or numactl's fallback) no memory policy is set:
    the note saying the planned one is not applied and where pages go instead (the kernel's
    default policy: first touch, mm/mempolicy.c); None when numactl binds or nothing
    planned a memory policy."""
    planned = sorted({i.mem_policy.value for i in plan.instances if i.mem_policy.value != "none"})
    if settings.bind != "affinity" or not planned or settings.bind_fallback:
        return None
    fix = ("use --bind numactl to bind memory" if settings.numactl  # "": not installed here (settings)
           else "numactl, which would bind memory, is not installed here")  # never suggest what cannot run
    return ("memory is not bound: CPUs are bound with sched_setaffinity (--bind affinity), which sets "
            f"no memory policy, so --mem-policy {', '.join(planned)} is not applied and pages follow the "
            f"first touch (each lands on the node of the CPU that first writes it); {fix}")


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
        if settings.bind == "numactl":
            prefix = numactl.argv(settings.numactl, inst.bound_cpus, inst.mem_policy, inst.mem_nodes)
            affinity = None
        elif settings.bind == "affinity":
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


# --------------------------------------------------------------------------- text forms


def binding_prefix(inst: RenderedInstance, taskset: Optional[str] = "taskset") -> tuple[str, ...]:
    """The command to put in front of the program for a shell script: the numactl prefix,
    or with ``bind="affinity"`` ``taskset -c <cpus>`` (taskset(1)); empty when unbound."""
    if inst.prefix:
        return tuple(inst.prefix)
    if inst.affinity is not None and taskset:
        return (taskset, "-c", cpulist.format(inst.affinity))
    return ()


def _print_prefix(inst: RenderedInstance, taskset: Optional[str]) -> str:
    import shlex  # only text outputs quote (issue 12: not on the exec or JSON path)

    return shlex.join(binding_prefix(inst, taskset))


#: The shell function --print-env defines: the program runs under the instance's binding,
#: with no word splitting of $CPULAUNCH_PREFIX (zsh does none): ``cpulaunch_run python x.py``.
RUN_FUNCTION = "cpulaunch_run"
#: What --print-env prints instead of an environment when cpulaunch fails: evaluated, it
#: fails (exit status 1), so ``set -e`` stops and ``eval "$(...)" || exit`` exits, in bash,
#: zsh and dash alike, rather than running the program unbound.
EVAL_FAILS = "false\n"


def shell_exports(inst: RenderedInstance, taskset: Optional[str] = "taskset") -> str:
    """POSIX ``export NAME='value'`` lines, safe to ``eval`` whatever the values hold
    (values that need it quoted by shlex.quote), every planned variable included: one the
    user exported and cpulaunch keeps is exported with the kept value after a ``:`` line
    saying so (``:`` is the comment every shell parses, zsh's interactive eval included).
    Then ``CPULAUNCH_PREFIX``, the binding command, and the function :data:`RUN_FUNCTION`
    that runs its arguments under it (``cpulaunch_run python x.py``; no word splitting)."""
    import shlex  # only text outputs quote (issue 12: not on the exec or JSON path)

    lines = []
    for k, v in _with_kept(inst).items():
        if k in inst.kept:
            lines.append(": " + shlex.quote(_kept_text(k, inst.kept[k])))
        lines.append(f"export {k}={shlex.quote(v)}")
    prefix = binding_prefix(inst, taskset)
    lines.append(f"export CPULAUNCH_PREFIX={shlex.quote(shlex.join(prefix))}")
    lines.append(f"{RUN_FUNCTION}() {{ {shlex.join(prefix) + ' ' if prefix else ''}\"$@\"; }}")
    return "\n".join(lines) + "\n"


def dotenv_lines(inst: RenderedInstance, taskset: Optional[str] = "taskset") -> str:
    """``NAME='value'`` lines for POSIX sh's ``set -a; . ./FILE; set +a`` (the target this
    format is written for: values that need it single-quoted by shlex.quote, so ``$``,
    backticks, backslashes and newlines come back exactly as they are), every planned
    variable included (a kept one with its kept value, after a ``#`` comment line)."""
    import shlex  # only text outputs quote (issue 12: not on the exec or JSON path)

    out = []
    for k, v in {**_with_kept(inst), envvars.PREFIX: _print_prefix(inst, taskset)}.items():
        if k in inst.kept:
            out.append("# " + one_line(_kept_text(k, inst.kept[k])) + "\n")
        out.append(f"{k}={shlex.quote(v)}\n")
    return "".join(out)


def _with_kept(inst: RenderedInstance) -> dict:
    """The instance's variables with the kept ones at their kept values, sorted."""
    return dict(sorted({**inst.env, **{k: user for k, (user, _) in inst.kept.items()}}.items()))


def _kept_text(name: str, values: tuple) -> str:
    user, planned = values
    return f"{name}: your value kept (cpulaunch planned {planned}; --override-env uses it)"


def omp_bind_string(rendered: "Rendered") -> str:
    """The instances' compute cpulists joined by ``|`` (``0-31|32-63``): the format of
    vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` and SGLang's ``SGLANG_CPU_OMP_THREADS_BIND``
    (one entry per tensor-parallel rank, in rank order)."""
    return "|".join(cpulist.format(i.cpus) for i in rendered.instances)


def bind_lines(rendered: "Rendered", stack: str) -> str:
    """Assignment lines for another serving stack (``--print-env --format vllm|sglang``).

    vLLM (CPU backend; vllm/envs.py): ``VLLM_CPU_OMP_THREADS_BIND`` (its
    ``VLLM_CPU_NUM_OF_RESERVED_CPU`` applies only to ``auto`` binding, so it is not
    printed with explicit lists). SGLang (CPU backend): ``SGLANG_CPU_OMP_THREADS_BIND``.
    Values are shell-quoted; docs/guide/integrations.md has the versions checked.
    """
    import shlex  # only text outputs quote (issue 12: not on the exec or JSON path)

    bind = omp_bind_string(rendered)
    if stack == "vllm":
        lines = [f"VLLM_CPU_OMP_THREADS_BIND={shlex.quote(bind)}"]
    elif stack == "sglang":
        lines = [f"SGLANG_CPU_OMP_THREADS_BIND={shlex.quote(bind)}"]
    else:
        raise ValueError(stack)
    return "\n".join(lines) + "\n"


def instance_dict(inst: RenderedInstance) -> dict[str, Any]:
    """One instance in the JSON schema of docs/reference/plan-json.md."""
    return {
        "index": inst.index,
        "cpus": list(inst.cpus),
        "cpulist": cpulist.format(inst.cpus),
        "bound_cpus": list(inst.bound_cpus),
        "mem_nodes": list(inst.mem_nodes),
        "mem_policy": inst.mem_policy,
        "env": dict(inst.env),
        "argv": list(inst.argv),
        **({"kept": {k: {"yours": u, "planned": p} for k, (u, p) in inst.kept.items()}} if inst.kept else {}),
    }


def plan_json(rendered: Rendered, topology: dict[str, Any], extra: Optional[dict[str, Any]] = None) -> str:
    """``--dry-run --format json``: ``{"instances": [...], "notes": [...], "topology": {...}}``,
    laid out by :func:`json_text`."""
    doc = {
        "instances": [instance_dict(i) for i in rendered.instances],
        "num_instances": rendered.num_instances,
        "notes": list(rendered.notes),
        "topology": topology,
    }
    if rendered.recipe is not None:
        doc["recipe"] = rendered.recipe.to_dict()
    if extra:
        doc.update(extra)
    return json_text(doc)


def json_text(doc) -> str:
    """``doc`` (JSON-ready dicts, lists and scalars) as JSON laid out for reading, no final
    newline: every member of an object and every record of a list of records on its own
    line, indented by two spaces; a value that holds no object or list of them (a number, a
    string, a list of CPU ids, a flat record such as one core) on one line. A list whose
    first item is such a flat record is taken to be a list of records, one a line::

        {
          "instances": [
            {
              "index": 0,
              "cpus": [0, 1, 2, 3],
              "env": {"OMP_NUM_THREADS": "4"}
            }
          ],
          "topology": {
            "cores": [
              {"id": 0, "cpus": [0, 4], "socket": 0, "node": 0, "efficiency": false},

    Each one-line value is written by the json module's C encoder (``indent=2`` uses its
    pure-Python one): 100 KB of plan on 1,024 CPUs take a fifth of the time and half the
    bytes (issue 12). Any JSON parser reads the same document as ``json.dumps(doc)``.
    """
    import json  # only the JSON outputs need it (issue 12: 2 ms of start-up)

    return _laid_out(doc, "", json.JSONEncoder().encode)


_NESTED = (dict, list)


def _laid_out(value, pad: str, encode) -> str:
    if type(value) is dict:
        if _holds_nested(value):
            inner = pad + "  "
            return "{\n" + ",\n".join(f"{inner}{encode(k)}: {_laid_out(v, inner, encode)}"
                                      for k, v in value.items()) + f"\n{pad}}}"
    elif type(value) is list and value and type(value[0]) in _NESTED:
        inner = pad + "  "
        if type(value[0]) is dict and not _holds_nested(value[0]):  # records: one a line
            return "[\n" + inner + f",\n{inner}".join(map(encode, value)) + f"\n{pad}]"
        return "[\n" + ",\n".join(inner + _laid_out(v, inner, encode) for v in value) + f"\n{pad}]"
    return encode(value)


def _holds_nested(record: dict) -> bool:
    return any(type(v) is dict or (type(v) is list and v and type(v[0]) in _NESTED)
               for v in record.values())


def one_line(text: str) -> str:
    """``text`` with every control character (newline, carriage return, escape, ...)
    written as a backslash escape, so a value the user set can never start a new line in
    a ``# note:`` comment, a log line or a terminal: ``"1\\ntouch x"`` -> ``"1\\\\ntouch x"``."""
    out = []
    for ch in text:
        o = ord(ch)
        if o < 32 or o == 127 or 0x80 <= o < 0xA0 or ch in "\u2028\u2029":
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


#: Columns of a dry run's command lines: longer commands continue on the next line after a
#: backslash, as a person writes them (a word is never cut).
TEXT_WIDTH = 100


def command_text(env: Mapping[str, str], argv: Sequence[str], width: Optional[int] = None) -> str:
    """One shell command that runs ``argv`` with ``env`` added: ``env NAME=VALUE ... prog
    args``, every word quoted (shlex.quote). A program whose name holds ``=`` would be read
    by env(1) as one more assignment, so it is run through ``sh -c 'exec "$0" "$@"'``.

    ``width``: continue the command on new lines (a backslash, then two spaces) so that each
    line holds at most ``width`` columns where its words allow; the program starts a line
    of its own. None: one line."""
    import shlex  # only text outputs quote (issue 12: not on the exec or JSON path)

    words = ["env"] + [f"{k}={v}" for k, v in env.items()]
    argv = list(argv)
    if argv and "=" in argv[0]:
        words += ["sh", "-c", 'exec "$0" "$@"']
    if width is None:
        return " ".join(shlex.quote(w) for w in words + argv)
    return " \\\n".join(_fill([shlex.quote(w) for w in words], width)
                         + _fill([shlex.quote(w) for w in argv], width, "  "))


def _fill(words: list, width: int, first: str = "") -> list:
    """``words`` in lines of at most ``width`` columns (a longer word alone), the first line
    starting with ``first``, the others with two spaces."""
    lines, line = [], first
    for w in words:
        if line.strip() and len(line) + 1 + len(w) + 2 > width:
            lines.append(line)
            line = "  "
        line += ("" if not line.strip() else " ") + w
    if line.strip():
        lines.append(line)
    return lines


def dry_run_text(rendered: Rendered) -> str:
    """Human-readable dry run: each instance's command and the env it changes, then notes.

    Safe to paste or pipe to ``sh`` whatever the values hold: comments hold only
    :func:`one_line` text, and commands only shell-quoted words.
    """
    lines = []
    for inst in rendered.instances:
        extra = set(inst.bound_cpus) - set(inst.cpus)
        head = (f"# {inst.label or 'instance %d' % inst.index}: cpus {cpulist.format(inst.cpus)}"
                + (f" (+ helpers {cpulist.format(extra)})" if extra else "")
                + (f", memory {inst.mem_policy} {cpulist.format(inst.mem_nodes)}" if inst.mem_nodes else "")
                + (f", affinity {cpulist.format(inst.affinity)}" if inst.affinity else ""))
        lines.append(one_line(head))
        lines.append(command_text(inst.env, inst.argv, TEXT_WIDTH))
    if rendered.recipe is not None and rendered.recipe.env:  # a recipe that sets nothing: JSON says it
        lines.append(f"# {one_line(rendered.recipe.line)}")
    for note in rendered.notes:
        lines.append(f"# note: {one_line(note)}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- topology view

#: /proc/cpuinfo flags that decide oneDNN's kernels: AVX2/AVX-512 for fp32, VNNI for int8,
#: AVX512_BF16 and AMX for bf16 (Intel's optimization guide for PyTorch on CPU).
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
             "amx_bf16", "amx_int8", "asimd", "sve")


class CacheBox(NamedTuple):
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


class NodeBox(NamedTuple):
    """A NUMA node's part of one socket in the topology view.

    Attributes:
        node_id: the NUMA node id; None for the socket's cores that belong to no node.
        node: its :class:`cpulaunch.machine.topology.Node` (None with ``node_id`` None).
        items: its cores in core order, grouped in :class:`CacheBox` es where caches were read.
    """

    node_id: Optional[int]
    node: Any
    items: tuple


class SocketBox(NamedTuple):
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
