"""The core of one invocation: Options -> probe -> host facts -> plan -> render -> print or launch.

Data flows one way. The host is read twice, both before planning: the topology
(:mod:`cpulaunch.machine.probe`) and the other facts (:mod:`cpulaunch.machine.host`: libraries, numactl,
engine, a free port). Planning and rendering are pure and happen once; ``--dry-run`` and
``--print-env`` print the very :class:`Prepared` value a run launches.
"""

import os
import shutil
import sys
from typing import Callable, Mapping, NamedTuple, Optional

from cpulaunch import cpulist, envvars
from cpulaunch import log as _log
from cpulaunch.errors import CpulaunchError
from cpulaunch.machine.topology import Topology
from cpulaunch.options import BindMode, Format, Options, Output
from cpulaunch.plan import Plan, Request
from cpulaunch.render import Rendered, Settings

__all__ = ["Prepared", "probe_topology", "cache_need", "resolve_settings", "prepare", "execute", "output_text"]

log = _log.get("cpulaunch")

#: ``--verify``'s check, called once with (the rendered plan, the settings, {instance index:
#: pid}, the run's folder or None) while the instances run.
Verifier = Callable[[Rendered, Settings, Mapping[int, int], object], None]
#: Planned for every instance whose output cpulaunch relays (:func:`supervised`): a Python
#: program writing to a pipe block-buffers its stdout (8 KiB), so a training loop's progress
#: would show only when the buffer fills or the program exits; ``PYTHONUNBUFFERED=1`` (as
#: ``python -u``, which run_cpu passes) writes each print at once. A tunable: a value in the
#: user's environment wins, with a note. Programs that are not Python are not affected.
LIVE_OUTPUT_ENV = {"PYTHONUNBUFFERED": "1"}


class Prepared(NamedTuple):
    """Everything a run needs, computed once (what --dry-run prints is this value).

    Attributes:
        opts: the options.
        topo: the machine.
        host: host facts (None for --show-topology).
        plan: the plan (ranks for --ddp).
        settings: library/binding choices resolved against the host.
        rendered: each instance's env and argv, and every note.
        program: the program's argv (empty when none was given to --dry-run/--print-env).
        ddp_info: the ``ddp`` member of the JSON plan, or None.
        elastic_argv: the torchrun command for an elastic --ddp run, else None.
        lease: the cores this run claimed with ``--share-host``
            (:class:`cpulaunch.machine.lease.Lease`), held until the run ends; else None.
    """

    opts: Options
    topo: Topology
    host: object = None
    plan: Optional[Plan] = None
    settings: Optional[Settings] = None
    rendered: Optional[Rendered] = None
    program: tuple[str, ...] = ()
    ddp_info: Optional[Mapping[str, object]] = None
    elastic_argv: Optional[tuple[str, ...]] = None
    lease: object = None


# --------------------------------------------------------------------------- steps


def probe_topology(opts: Options, caches: bool = False) -> Topology:
    """Read the machine at ``opts.sysroot``. Raises CpulaunchError for a missing folder
    or an unusable tree (one line naming the file). Each core's core_id (display only) is
    not read: half the per-core reads on a big machine (issue 12). ``caches``: read the
    cache domains too (:func:`cache_need`)."""
    from cpulaunch.machine import probe

    probe.check_sysroot(opts.sysroot)
    return probe.probe(opts.sysroot, core_ids=False, caches=caches)


def cache_need(opts: Options, environ: Mapping[str, str]) -> bool:
    """Whether this invocation needs the machine's cache domains (issue 22), decided from
    the options before anything is read, so that planning stays pure and a plan that
    cannot divide a socket or node pays no read for them: ``--show-topology``;
    ``--ninstances`` above 1; ``--instances-per-socket`` or ``--instances-per-node`` above
    1; ``--instances-per-l3``; ``--ncores-per-instance``; ``--latency-mode``; ``--ddp``
    with a number of ranks above 1; and a launch under an engine (torchrun, MPI, Slurm),
    whose local tasks may divide a node; ``--format svg`` (the picture draws them). One
    instance per socket or node, the default single instance and ``--throughput-mode`` do not."""
    from cpulaunch.machine.engines import ENGINE_VARIABLES

    if opts.output is Output.SHOW_TOPOLOGY or opts.fmt is Format.SVG:
        return True
    req = opts.request
    if any(count is not None and count > 1 for count in
           (req.ninstances, req.instances_per_socket, req.instances_per_node)):
        return True
    if req.instances_per_l3 or req.ncores_per_instance or req.latency_mode:
        return True
    ranks = opts.ddp.nproc_per_node if opts.ddp is not None else None
    if ranks is not None and ranks.isdigit() and int(ranks) > 1:
        return True
    return any(v in environ for v in ENGINE_VARIABLES)


def host_query(opts: Options):
    """What the host reader must find for ``opts`` (:class:`cpulaunch.machine.host.HostQuery`):
    the libraries the options name (``auto`` read once, :func:`libraries.resolve_choice`),
    numactl and its check when binding with it, a free port for a one-machine --ddp run
    without --master-port, oneCCL's bindings for --ddp unless --backend gloo, zentorch's
    import for --inference-path zentorch (a one-line note where it is refused)."""
    from cpulaunch.machine import libraries
    from cpulaunch.machine.host import HostQuery

    names = []
    if opts.allocator != "default":
        names.append(libraries.by_choice("allocator", libraries.resolve_choice("allocator", opts.allocator)).name)
    if opts.omp_runtime != "auto":
        names.append(libraries.by_choice("openmp", opts.omp_runtime).name)
    numactl = opts.bind is BindMode.NUMACTL
    ddp = opts.ddp
    return HostQuery(
        sysroot=opts.sysroot, libraries=tuple(names), numactl=numactl,
        numactl_policy=opts.request.mem_policy if numactl else None,
        free_port=ddp is not None and ddp.master_port is None and ddp.nnodes == "1" and not ddp.master_addr
        and not ddp.elastic,
        ccl_program=opts.program if ddp is not None and ddp.backend != "gloo" else None,
        zentorch_program=opts.program if opts.inference_path == "zentorch" else None)


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


def supervised(opts: Options, n_instances: int, elastic: bool = False) -> bool:
    """True when cpulaunch starts the instances itself and relays their output through pipes
    (several instances, ``--log-dir``, ``--verify``, or an elastic --ddp run's torchrun:
    ``elastic``); False when the one instance is exec'd with cpulaunch's own stdin, stdout
    and stderr. The one rule for :func:`execute` and for the env :func:`prepare` plans
    (:data:`LIVE_OUTPUT_ENV`), so --dry-run shows what a run gets."""
    lopts = opts.launch
    return n_instances != 1 or elastic or lopts.log_dir is not None or lopts.verify_after is not None


def resolve_settings(opts: Options, host, environ: Mapping[str, str], label: str = "instance",
                     instance_env: Optional[Mapping[int, Mapping[str, str]]] = None,
                     relayed: bool = False,
                     instance_program: Optional[Mapping[int, tuple[str, ...]]] = None) -> tuple[Settings, list[str]]:
    """Options + host facts -> (:class:`Settings`, notes). Pure.

    ``instance_env``/``instance_program``: per instance index, its identity variables and,
    where it differs from the shared one, its program (DDP ranks: :class:`cpulaunch.distributed.RankPlan`).

    ``relayed``: cpulaunch relays the instances' output (:func:`supervised`), so they get
    :data:`LIVE_OUTPUT_ENV`.

    Rules: ``--omp-runtime auto`` keeps torch's GNU OpenMP (libiomp5 measured within noise
    of it here, docs/performance.md); ``--allocator auto`` preloads tcmalloc when found
    (1.0-1.4x measured here; jemalloc 0.68-0.91x). Binding with numactl falls back to
    sched_setaffinity, with a note, when numactl is missing or refuses on this machine;
    under --sysroot the plan describes the dumped machine, so numactl is assumed.

    Raises:
        CpulaunchError: a library asked for by name is not installed.
    """
    from cpulaunch.machine import host as host_mod, libraries

    notes = []
    omp = libraries.AUTO_OPENMP if opts.omp_runtime == "auto" else opts.omp_runtime
    omp_lib = libraries.by_choice("openmp", omp)
    openmp_path = None
    if omp_lib.filenames:
        openmp_path = _library_path(host, omp_lib.name, f"--omp-runtime {omp}", "--omp-runtime gnu")
    alloc, alloc_path = None, None
    if opts.allocator == "auto":
        auto = libraries.by_choice("allocator", libraries.AUTO_ALLOCATOR)
        alloc_path = host.libraries.get(auto.name)
        if alloc_path is None:
            notes.append(f"{auto.name} not found: using the C library's malloc ({auto.install} to get it)")
        else:
            alloc = auto.name
    elif opts.allocator != "default":
        alloc = libraries.by_choice("allocator", opts.allocator).name
        alloc_path = _library_path(host, alloc, f"--allocator {opts.allocator}", "--allocator default")
    bind, numactl = opts.bind.value, host.numactl or "numactl"
    if opts.bind is BindMode.NUMACTL:
        bind, note = _numactl_fallback(opts, host)
        if note:
            notes.append(note)
    extra = {envvars.INFERENCE_PATH: opts.inference_path} if opts.inference_path else {}
    notes += [n for n in [host_mod.zentorch_note(getattr(host, "zentorch", None))] if n]  # issue 33
    if relayed:
        extra.update(LIVE_OUTPUT_ENV)
    settings = Settings(
        omp_runtime=omp, openmp_path=openmp_path, allocator=alloc, allocator_path=alloc_path,
        bind=bind, numactl=numactl, override_env=opts.override_env, environ=dict(environ),
        extra_env=extra, instance_env=dict(instance_env or {}), omp_places=opts.omp_places, label=label,
        kmp_blocktime=opts.kmp_blocktime, dataloader_workers=opts.request.dataloader_workers,
        instance_program=dict(instance_program or {}),
    )
    return settings, notes


def _numactl_fallback(opts: Options, host) -> tuple:
    if not host.live:
        here = f"installed here at {host.numactl}" if host.numactl else "not installed on this machine"
        return "numactl", f"numactl not checked: --sysroot describes another machine (numactl is {here})"
    if host.numactl is None:
        return "affinity", ("numactl not found: CPUs bound with sched_setaffinity instead and memory "
                            "binding dropped (apt-get install numactl)")
    if host.numactl_usable is False:
        return "affinity", (f"{host.numactl_reason}: CPUs bound with sched_setaffinity instead; "
                            "memory binding dropped")
    return "numactl", ""


def _resolve_program(opts: Options, python: str) -> tuple:
    from cpulaunch.render import ProgramError, resolve_program

    try:
        return resolve_program(opts.program, no_python=opts.no_python, python=python)
    except ProgramError:
        if opts.output in (Output.DRY_RUN, Output.PRINT_ENV) and not opts.program:
            return ()
        raise


def _engine_request(topo: Topology, req: Request, engine, notes: list) -> Request:
    """Without --ddp under an engine that started several tasks on this machine (``srun
    -n 4 cpulaunch ...``), each task runs the instance whose index is its local task id,
    inside what the engine gave it (issue 11)."""
    if engine is None or engine.local_world_size <= 1:
        return req
    if topo.cpuset is not None and topo.allowed < topo.cpuset and engine.engine != "torchrun":
        notes.append(f"{engine.engine} task {engine.local_rank} bound to CPUs {cpulist.format(topo.allowed)}: "
                     "one instance on exactly those")
        return req._replace(ninstances=None, instances_per_socket=None, instances_per_node=None,
                            instances_per_l3=None, throughput_mode=False, latency_mode=False,
                            ncores_per_instance=None, instance_idx=None)
    modes = (req.ninstances, req.instances_per_socket, req.instances_per_node, req.latency_mode,
             req.throughput_mode, req.ncores_per_instance, req.instances_per_l3)
    if req.instance_idx is not None:
        raise CpulaunchError(f"--instance-idx does not apply under {engine.engine}: each task runs the "
                             "instance of its local task id")
    if not any(modes):
        req = req._replace(ninstances=engine.local_world_size)
    notes.append(f"{engine.engine} started {engine.local_world_size} tasks here: this one "
                 f"(local id {engine.local_rank}) runs instance {engine.local_rank}")
    return req._replace(instance_idx=(engine.local_rank,))


def run_cpu_placement(topo: Topology, req: Request) -> Optional[list[tuple[int, ...]]]:
    """The CPUs torch.backends.xeon.run_cpu would give each instance for ``--ninstances``
    / ``--ncores-per-instance`` [``--use-logical-core``] (run_cpu.py, torch 2.13): its core
    ids (taken as CPU ids: the lowest logical CPU of each core here) or, with
    ``use_logical_cores``, every logical CPU (SMT siblings apart), sorted by number and cut
    into runs of ``ncores_per_instance`` from the first (``cores = sorted(cores)``, instance i
    takes ``cores[i*n:(i+1)*n]``). Within this process's allowed CPUs. None where run_cpu
    has no comparable plan (other modes, core or node lists, budgets, E-cores,
    ``ncores_per_instance`` not given or given as one size per instance, which run_cpu's
    --ncores-per-instance does not take). Pure."""
    if (not isinstance(req.ncores_per_instance, int) or req.core_list or req.node_list or topo.hybrid
            or req.instances_per_socket or req.instances_per_node or req.latency_mode
            or req.throughput_mode or req.dataloader_workers or req.reserve_cores or req.ccl_workers):
        return None
    cores = [sorted(topo.allowed.intersection(c.cpus)) for c in topo.cores]
    units = sorted(cpu for cpus in cores for cpu in (cpus if req.use_logical_cores else cpus[:1]))
    n = req.ncores_per_instance
    count = req.ninstances or len(units) // n
    if count * n > len(units):
        return None
    return [tuple(units[i * n:(i + 1) * n]) for i in range(count)]


def _run_cpu_note(topo: Topology, req: Request, result: Plan, aliases: tuple[str, ...]) -> Optional[str]:
    """A note when run_cpu's spellings (``--ncores-per-instance``, ``--use-logical-core``)
    plan differently here than under run_cpu (issue 24), else None."""
    theirs = run_cpu_placement(topo, req)
    ours = {i.index: tuple(i.cpus) for i in result.instances}
    if theirs is None or (len(theirs) == result.num_instances
                          and all(theirs[i] == cpus for i, cpus in ours.items())):
        return None
    words = (f"{req.said('ninstances')} " if req.ninstances else "") + req.said("ncores_per_instance") + \
        (" --use-logical-core" if "--use-logical-core" in aliases else "")

    def show(plans) -> str:
        shown = ", ".join(f"instance {i}: CPUs {cpulist.format(c)}" for i, c in list(plans)[:3])
        return shown + (", ..." if len(plans) > 3 else "")

    how = ("counts logical CPUs, packed from CPU 0 with SMT siblings apart" if req.use_logical_cores else
           "packs the instances from the first core")
    ours_how = ("gives whole cores with their SMT siblings" if req.use_logical_cores else
                "spreads them over sockets and NUMA nodes")
    note = (f"run_cpu plans {words} differently: it {how} ({show(list(enumerate(theirs)))}); "
            f"cpulaunch {ours_how} ({show(sorted(ours.items()))})")
    if not req.use_logical_cores:
        note += f"; --core-list {cpulist.format(c for cpus in theirs for c in cpus)} keeps them on those cores"
    return note


def _plan_plain(opts: Options, topo: Topology, host) -> Plan:
    from cpulaunch.plan import plan

    notes: list = []
    req = _engine_request(topo, opts.request, host.engine, notes)
    result = plan(topo, req)
    note = _run_cpu_note(topo, req, result, opts.aliases)
    if note:
        notes.append(note)
    if host.engine is not None and host.engine.local_world_size > 1 and req.instance_idx is not None:
        if result.num_instances != host.engine.local_world_size:
            raise CpulaunchError(
                f"{host.engine.engine} started {host.engine.local_world_size} tasks on this machine but "
                f"the options plan {result.num_instances} instance(s); make them agree"
            )
    return result._replace(notes=tuple(notes) + result.notes)


def _backend(opts: Options, host, environ: Mapping[str, str]) -> tuple:
    from cpulaunch import distributed

    return distributed.select_backend(opts.ddp.backend, host.ccl, host.fabric, environ)


def prepare(opts: Options, environ: Mapping[str, str]) -> Prepared:
    """Probe, gather host facts, plan and render: everything but the launch (and, with
    ``--share-host``, claim the planned cores before a run: :func:`_prepare_shared`).

    Raises:
        CpulaunchError: anything the user can fix (one line).
    """
    from cpulaunch.machine import host as host_mod

    topo = probe_topology(opts, caches=cache_need(opts, environ))
    if opts.output is Output.SHOW_TOPOLOGY:
        return Prepared(opts=opts, topo=topo)
    host = host_mod.gather(host_query(opts), topo, environ)
    if opts.share_host is not None:
        return _prepare_shared(opts, topo, host, environ)
    return _prepare_plan(opts, topo, host, environ)


def _prepare_plan(opts: Options, topo: Topology, host, environ: Mapping[str, str]) -> Prepared:
    """Plan and render on ``topo`` (:func:`prepare` without the probe)."""
    from cpulaunch.render import render, with_recipe

    program = _resolve_program(opts, host.python)
    ddp_info, label, instance_env, run_environ, programs = None, "instance", {}, environ, {}
    if opts.ddp is not None:
        from cpulaunch import distributed

        backend, note = _backend(opts, host, environ)
        ranks = distributed.plan_ranks(topo, opts.request, opts.ddp, environ, engine=host.engine,
                                       backend=backend, backend_note=note, free_port=host.free_port,
                                       fabric=host.fabric, override_env=opts.override_env,
                                       program=program, python=host.python)
        the_plan = ranks.plan._replace(notes=ranks.notes)
        ddp_info, label, instance_env, run_environ = dict(ranks.info), "rank", ranks.instance_env, ranks.environ
        programs = ranks.instance_program
    else:
        the_plan = _plan_plain(opts, topo, host)
    elastic = opts.ddp is not None and opts.ddp.elastic and host.engine is None
    relayed = opts.output is not Output.PRINT_ENV and supervised(opts, len(the_plan.instances), elastic)
    settings, notes = resolve_settings(opts, host, run_environ, label, instance_env, relayed, programs)
    settings = with_recipe(settings, topo, opts.recipe, opts.omp_wait_policy, opts.zendnn_matmul_algo)  # issue 33
    rendered = render(the_plan, program, settings)
    rendered = rendered._replace(notes=opts.notes + rendered.notes + tuple(notes))
    prepared = Prepared(opts=opts, topo=topo, host=host, plan=the_plan, settings=settings,
                        rendered=rendered, program=program, ddp_info=ddp_info)
    if elastic:
        from cpulaunch import distributed

        argv = distributed.torchrun_argv(host.python, len(rendered.instances), opts.ddp.nnodes, 0, None, None,
                                         opts.ddp.rdzv_endpoint, opts.ddp.rdzv_id,
                                         [host.python, "-m", "cpulaunch.rank_entry"],
                                         max_restarts=opts.ddp.max_restarts)
        prepared = prepared._replace(elastic_argv=tuple(argv),
                                     ddp_info={**ddp_info, "launcher_argv": list(argv)})
    return prepared


#: How often a --share-host run reads, plans and claims again after another job took one
#: of its cores between its read and its claim.
_CLAIM_TRIES = 100


def _prepare_shared(opts: Options, topo: Topology, host, environ: Mapping[str, str]) -> Prepared:
    """``--share-host``: read the leases, plan on the cores no other job holds, and (a
    run only) claim every CPU of the planned cores; a lost race reads and plans again.
    Where the request does not fit on the free cores: wait for the job holding the
    lowest held CPU to end (``wait``), or fail naming the holders (``fail``).

    Raises:
        CpulaunchError: --sysroot given, several local tasks under an engine, the lease
            folder unusable, or the free cores too few (naming who holds the others).
    """
    from cpulaunch.machine import lease
    from cpulaunch.plan import PlanError

    if not host.live:
        raise CpulaunchError("--share-host coordinates the jobs of this machine; drop --sysroot")
    if host.engine is not None and host.engine.local_world_size > 1:
        raise CpulaunchError(f"--share-host does not apply under {host.engine.engine} with several tasks "
                             "on this machine (each would plan alone); start one cpulaunch per machine")
    run = opts.output is Output.RUN
    where = lease.folder(opts.lease_dir, environ, create=run)
    for _ in range(_CLAIM_TRIES):
        leases = lease.read(where, topo.online)
        try:
            p = _prepare_plan(opts, lease.without_held(topo, leases), host, environ)
        except PlanError as exc:
            if not leases.held:
                raise
            if opts.share_host != "wait":
                raise CpulaunchError(f"--share-host: {lease.held_text(leases)}: {exc}; "
                                     "wait for them with --share-host wait") from None
            first = min(leases.held)
            log.warning("waiting for %s (--share-host wait)", lease.held_text(leases._replace(
                held={c: h for c, h in leases.held.items() if h == leases.held[first]})))
            lease.wait(where, first)
            continue
        p = p._replace(rendered=p.rendered._replace(notes=p.rendered.notes + lease.notes(leases, run)))
        if not run:
            return p
        cores = {c for i in p.rendered.instances for cpu in i.bound_cpus for c in topo.core_of(cpu).cpus}
        got, _ = lease.claim(where, cores, topo.online)
        if got is not None:
            return p._replace(lease=got)
    raise CpulaunchError(f"--share-host: other jobs took the planned cores {_CLAIM_TRIES} times "
                         "between reading and claiming them; run again")


# --------------------------------------------------------------------------- output


def output_text(p: Prepared) -> str:
    """The text --dry-run, --print-env or --show-topology prints (pure over ``p``)."""
    from cpulaunch import render as r

    fmt = p.opts.fmt
    if p.opts.output is Output.SHOW_TOPOLOGY:
        if fmt is Format.JSON:
            return _json_text(p.topo.to_dict())
        if fmt is Format.SVG:
            from cpulaunch.svg import plan_svg

            return plan_svg(p.topo)
        return r.topology_text(p.topo)
    rendered = p.rendered
    if p.opts.output is Output.DRY_RUN:
        if fmt is Format.SVG:
            from cpulaunch.svg import plan_svg

            return plan_svg(p.topo, rendered.instances)
        if fmt is Format.JSON:
            return r.plan_json(rendered, p.topo.to_dict(), {"ddp": p.ddp_info} if p.ddp_info else None) + "\n"
        text = r.dry_run_text(rendered)
        if p.elastic_argv:
            text += "# then torchrun starts each rank's command above:\n" + r.command_text({}, p.elastic_argv) + "\n"
        return text
    if not rendered.instances:
        raise CpulaunchError("--print-env: no instance planned")
    if fmt in (Format.OMP_BIND, Format.VLLM, Format.SGLANG):
        if fmt is Format.OMP_BIND:
            return r.omp_bind_string(rendered) + "\n"
        return r.bind_lines(rendered, fmt.value)
    inst = rendered.instances[0]
    taskset = p.host.taskset or "taskset"
    if fmt is Format.DOTENV:
        return r.dotenv_lines(inst, taskset)
    if fmt is Format.JSON:
        doc = r.instance_dict(inst)
        doc["prefix"] = list(r.binding_prefix(inst, taskset))
        doc["notes"] = list(rendered.notes)
        return _json_text(doc)
    return r.shell_exports(inst, taskset)


def _json_text(doc) -> str:
    from cpulaunch.render import json_text

    return json_text(doc) + "\n"


# --------------------------------------------------------------------------- launch


def _require_program(program: tuple) -> None:
    if not program:
        from cpulaunch.render import ProgramError

        raise ProgramError("no program given; put it after cpulaunch's options, e.g. "
                           "`cpulaunch --instances-per-socket python infer.py`")
    if shutil.which(program[0]) is None:
        raise CpulaunchError(f"program {program[0]!r} not found (not a file, not on PATH)")


def _specs(rendered: Rendered) -> list:
    from cpulaunch.launch.spawn import ProcessSpec

    return [ProcessSpec(index=i.index, label=i.label or f"instance {i.index}", argv=tuple(i.argv),
                        env=dict(i.env), affinity=i.affinity, cpus=tuple(i.cpus))
            for i in rendered.instances]


def _run_info(p: Prepared) -> str:
    from cpulaunch import render as r

    return r.plan_json(p.rendered, p.topo.to_dict(), {"ddp": p.ddp_info} if p.ddp_info else None)


def execute(p: Prepared, environ: Mapping[str, str], verifier: Optional[Verifier] = None) -> int:
    """Launch a prepared run; returns the exit code (the root cause's, 128+N for signal N).

    One instance without a log folder is exec'd (its signals and exit code are its own);
    several are supervised (launch.supervise.run_group); an elastic --ddp run starts torchrun with
    cpulaunch's rank entry. ``verifier``: what ``--verify`` calls once the instances run
    (``cli`` hands in ``cpulaunch.tools.verify.check_run``; the core imports no tool).

    Raises:
        CpulaunchError: the program cannot be started, the log folder cannot be made.
    """
    _require_program(p.program)
    for note in p.rendered.notes:
        log.warning("note: %s", note)
    lopts = p.opts.launch
    if p.elastic_argv:
        return _execute_elastic(p, environ)
    specs = _specs(p.rendered)
    if lopts.stdin_instance is not None and lopts.stdin_instance not in {s.index for s in specs}:
        raise CpulaunchError(f"--stdin-instance {lopts.stdin_instance}: no such instance runs "
                             f"(instances {cpulist.format(s.index for s in specs)})")
    if not supervised(p.opts, len(specs)):
        from cpulaunch.launch.spawn import exec_spec  # no supervisor needed (issue 12)

        if p.lease is not None:  # the program holds the --share-host lease while it runs
            p.lease.keep_across_exec()
        if log.isEnabledFor(_log.INFO):  # -v: the command, as the supervised path says it
            import shlex

            log.info("%s: %s (exec'd)", specs[0].label, shlex.join(specs[0].argv))
        exec_spec(specs[0], environ)
    from cpulaunch.launch.supervise import describe_failure, run_group

    stdin_for = lopts.stdin_instance
    if stdin_for is None and len(specs) == 1:
        stdin_for = specs[0].index
    verified: list = []

    def check(pids: Mapping[int, int], run) -> None:
        verified.append(pids)
        verifier(p.rendered, p.settings, pids, run)

    after = (lopts.verify_after, check) if lopts.verify_after is not None and verifier else None
    outcome = run_group(
        specs, environ, log_dir=lopts.log_dir, run_info=_run_info(p), keep_going=lopts.keep_going,
        grace_period=lopts.grace_period, prefix_output=lopts.prefix_output and len(specs) > 1,
        stdin_for=stdin_for, after=after,
    )
    if after is not None and not verified:  # the check never ran: say why, in one line
        starts = [r.start for r in outcome.results if r.start is not None]
        ends = [r.end for r in outcome.results]
        done = bool(starts) and None not in ends and max(ends) - min(starts) < lopts.verify_after
        log.warning("verify: nothing to check: %s %g s (--verify-after)", "every instance had exited "
                    "before" if done else "the run was being stopped at", lopts.verify_after)
    if outcome.exit_code != 0 or outcome.signalled:
        log.warning("%s", describe_failure(outcome, specs, keep_going=lopts.keep_going))
    return outcome.exit_code


def _execute_elastic(p: Prepared, environ: Mapping[str, str]) -> int:
    """Elastic --ddp: torchrun's c10d agent starts each rank as ``python -m
    cpulaunch.rank_entry``, which runs that local rank's rendered command
    (:mod:`cpulaunch.launch.elastic`)."""
    from cpulaunch.launch.elastic import run_elastic

    return run_elastic(p.elastic_argv, _specs(p.rendered), environ, log_dir=p.opts.launch.log_dir,
                       run_info=_run_info(p), grace_period=p.opts.launch.grace_period)


def run(opts: Options, environ: Optional[Mapping[str, str]] = None, out=None, *,
        verifier: Optional[Verifier] = None) -> int:
    """Carry out one invocation: prepare, then print (--dry-run, --print-env,
    --show-topology) or launch (``verifier``: see :func:`execute`). Returns the exit code."""
    environ = dict(os.environ if environ is None else environ)
    p = prepare(opts, environ)
    text = output_text(p) if opts.output is not Output.RUN else None
    if text is not None:
        write_out(text, out)
        if p.rendered is not None:
            # --print-env's shell, dotenv and bind-string forms have no room for notes (a
            # comment in an eval'd text is never seen), so they go to stderr, where a
            # `eval "$(cpulaunch --print-env)"` shows them; the other outputs hold them.
            said = log.warning if opts.output is Output.PRINT_ENV and opts.fmt is not Format.JSON else log.info
            for note in p.rendered.notes:
                said("note: %s", note)
        return 0
    return execute(p, environ, verifier)


def write_out(text: str, out=None) -> None:
    """Write ``text`` to stdout as bytes, so values holding non-UTF-8 bytes (carried as
    surrogate escapes, as os.environ does) come out exactly as they came in."""
    stream = out or sys.stdout.buffer
    stream.write(text.encode("utf-8", "surrogateescape"))
    stream.flush()
