"""A run's settings (pure): the OpenMP runtime, allocator, binding, output relay and the
platform's environment recipe resolved against the host's facts, in one pass, for render
(:class:`cpulaunch.render.Settings`).

Options + host facts in, settings and notes out; nothing here reads the host.
"""

from __future__ import annotations

from cpulaunch import envvars
from cpulaunch.errors import CpulaunchError
from cpulaunch.notes import advice, explain
from cpulaunch.names import BindMode
from cpulaunch.render import Settings
from cpulaunch.records import TYPE_CHECKING

if TYPE_CHECKING:  # the type only: the planner does not import the option surface
    from typing import Mapping, Optional
    from cpulaunch.options import Options

__all__ = ["LIVE_OUTPUT_ENV", "supervised", "resolve_settings", "zentorch_note"]

#: Planned for every instance whose output cpulaunch relays (:func:`supervised`): a Python
#: program writing to a pipe block-buffers its stdout (8 KiB), so a training loop's progress
#: would show only when the buffer fills or the program exits; ``PYTHONUNBUFFERED=1`` (as
#: ``python -u``, which run_cpu passes) writes each print at once. A tunable: a value in the
#: user's environment wins, with a note. Programs that are not Python are not affected.
LIVE_OUTPUT_ENV = {"PYTHONUNBUFFERED": "1"}


def supervised(opts: Options, n_instances: int, elastic: bool = False) -> bool:
    """True when cpulaunch starts the instances itself and relays their output through pipes
    (several instances, ``--log-dir``, ``--verify``, ``--follow-cpuset``, an elastic --ddp run's torchrun:
    ``elastic``, or an in-process :func:`cpulaunch.run`); False when the one instance is exec'd with cpulaunch's own stdin, stdout
    and stderr. The one rule for :func:`execute` and for the env :func:`prepare` plans
    (:data:`LIVE_OUTPUT_ENV`), so --dry-run shows what a run gets."""
    lopts = opts.launch
    return (not lopts.exec_single or n_instances != 1 or elastic or lopts.log_dir is not None
            or lopts.verify_after is not None or lopts.follow_cpuset)


def resolve_settings(opts: Options, topo, host, environ: Mapping[str, str], label: str = "instance",
                     instance_env: Optional[Mapping[int, Mapping[str, str]]] = None,
                     relayed: bool = False,
                     instance_program: Optional[Mapping[int, tuple[str, ...]]] = None) -> tuple[Settings, list[str]]:
    """Options + the machine (``topo``, a :class:`cpulaunch.machine.topology.Topology`) + host
    facts -> (:class:`Settings`, notes). Pure.

    ``instance_env``/``instance_program``: per instance index, its identity variables and,
    where it differs from the shared one, its program (DDP ranks: :class:`cpulaunch.distributed.RankPlan`).

    ``relayed``: cpulaunch relays the instances' output (:func:`supervised`), so they get
    :data:`LIVE_OUTPUT_ENV`.

    Rules: ``auto`` for the OpenMP runtime and the allocator is read in one place,
    :func:`cpulaunch.machine.libraries.resolve_choice`: torch's GNU OpenMP (libiomp5 measured
    within noise of it here), tcmalloc when found (1.0-1.4x measured here; jemalloc
    0.68-0.91x), else the C library's malloc. Binding with numactl falls back to
    sched_setaffinity, with a note, when numactl is missing or refuses on this machine;
    under --sysroot the plan describes the dumped machine, so numactl is assumed. The
    environment recipe: :func:`_applied_recipe`.

    Raises:
        CpulaunchError: a library asked for by name is not installed.
    """
    from cpulaunch.machine import libraries

    notes = []
    omp = libraries.resolve_choice("openmp", opts.omp_runtime)
    omp_lib = libraries.by_choice("openmp", omp)
    openmp_path = None
    if omp_lib.filenames:
        openmp_path = _library_path(host, omp_lib.name, f"--omp-runtime {omp}", "--omp-runtime gnu")
    alloc, alloc_path = None, None
    if opts.allocator == "auto":
        auto = libraries.by_choice("allocator", libraries.resolve_choice("allocator", "auto"))
        alloc_path = host.libraries.get(auto.name)
        if alloc_path is None:
            notes.append(advice(f"{auto.name} not found: using the C library's malloc ({auto.install} to get it)",
                                auto.name, "the C library's malloc"))
        else:
            alloc = auto.name
    elif opts.allocator != "default":
        alloc = libraries.by_choice("allocator", opts.allocator).name
        alloc_path = _library_path(host, alloc, f"--allocator {opts.allocator}", "--allocator default")
    bind, numactl = opts.bind, host.numactl or "numactl"
    if opts.bind is BindMode.AFFINITY and getattr(host, "live", False) and host.numactl is None:
        numactl = ""  # looked for and missing here: render's notes then never suggest --bind numactl
    if opts.bind is BindMode.NUMACTL:
        bind, note = _numactl_fallback(host)
        if note:
            notes.append(note)
    extra = {envvars.INFERENCE_PATH: opts.inference_path} if opts.inference_path else {}
    notes += [n for n in [zentorch_note(getattr(host, "zentorch", None))] if n]
    if relayed:
        extra.update(LIVE_OUTPUT_ENV)
    settings = Settings(
        omp_runtime=omp, openmp_path=openmp_path, allocator=alloc, allocator_path=alloc_path,
        bind=bind, numactl=numactl, override_env=opts.override_env, environ=dict(environ),
        extra_env=extra, instance_env=dict(instance_env or {}), omp_places=opts.omp_places, label=label,
        kmp_blocktime=opts.kmp_blocktime, dataloader_workers=opts.request.dataloader_workers,
        instance_program=dict(instance_program or {}),
        bind_fallback=opts.bind is BindMode.NUMACTL and bind is BindMode.AFFINITY,
        one_memory_node=len(topo.usable_memory_nodes) == 1,
        recipe=_applied_recipe(topo, opts.recipe, omp, alloc, opts.omp_wait_policy, opts.zendnn_matmul_algo),
    )
    return settings, notes


def _applied_recipe(topo, choice: str, omp_runtime: str, allocator: Optional[str], wait_policy: str,
                    matmul_algo: Optional[int]):
    """The environment recipe of ``--recipe choice`` on the machine ``topo`` (pure; issue 33):
    ``auto`` takes the platform's (``topo.platform``, :func:`cpulaunch.machine.recipes.recipe_for`);
    its variables are those that take effect with the OpenMP runtime ``omp_runtime`` (a choice of
    the library registry) and the allocator ``allocator`` (a registry name, None: the C
    library's) and the CPU's flags, then ``--omp-wait-policy`` and ``--zendnn-matmul-algo``
    (:func:`cpulaunch.machine.recipes.recipe_env`). Returns a
    :class:`cpulaunch.machine.recipes.Applied`.

    Raises:
        KeyError: ``choice`` names no recipe (the option table's choices prevent it).
    """
    from cpulaunch.machine import libraries, recipes

    platform = topo.platform
    recipe = recipes.resolve_recipe(choice, platform.kind)
    env = recipes.recipe_env(recipe, openmp_pin_style=libraries.by_choice("openmp", omp_runtime).pin_style,
                             allocator=allocator, flags=topo.flags, wait_policy=wait_policy,
                             matmul_algo=matmul_algo)
    return recipes.Applied(recipe, platform.text, "auto" if choice in (None, "auto") else "--recipe", env)


def _numactl_fallback(host) -> tuple:
    """(how to bind: a :class:`BindMode`, a note or "") when --bind numactl was asked (numactl(8)): numactl when it
    is installed and its check on the planned CPUs passed, else sched_setaffinity."""
    if not host.live:
        here = f"installed here at {host.numactl}" if host.numactl else "not installed on this machine"
        return BindMode.NUMACTL, explain(f"numactl not checked: --sysroot describes another machine (numactl is {here})")
    if host.numactl is None:
        return BindMode.AFFINITY, advice("numactl not found: CPUs bound with sched_setaffinity instead and memory "
                                  "binding dropped (apt-get install numactl)", "numactl", "memory not bound")
    if host.numactl_usable is False:
        return BindMode.AFFINITY, (f"{host.numactl_reason}: CPUs bound with sched_setaffinity instead; "
                            "memory binding dropped")
    return BindMode.NUMACTL, ""


def _library_path(host, name: str, option: str, fallback: str) -> object:
    from cpulaunch.machine import libraries

    path = host.libraries.get(name)
    if path is None:
        lib = libraries.REGISTRY[name]
        raise CpulaunchError(
            f"{option}: {'/'.join(lib.filenames[:2])} not found (searched sys.prefix/lib, "
            f"$CONDA_PREFIX/lib, $VIRTUAL_ENV/lib, $LD_LIBRARY_PATH, the system folders); "
            f"{lib.install}, or use {fallback}"
        )
    return path


def zentorch_note(binding) -> Optional[str]:
    """The one-line note for ``--inference-path zentorch`` where zentorch cannot be used
    (pure): not installed, or its import refused by this torch; None where it imports."""
    if binding is None or binding.loads:
        return None
    if binding.path is None:
        return (f"--inference-path zentorch: zentorch is not installed for {binding.python}; the program's "
                "optimize() will refuse path zentorch (pip install zentorch, built for this torch's minor "
                "release), or use --inference-path auto")
    return (f"--inference-path zentorch: zentorch {binding.version or '?'} does not import with torch "
            f"{binding.torch_version or '?'} ({binding.why}); the program's optimize() will refuse path "
            "zentorch: install the zentorch built for this torch, or use --inference-path auto (the other "
            "paths)")
