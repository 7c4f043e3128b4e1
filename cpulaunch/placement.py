"""Placement policy around the planner (pure): what the options and the engine that started
us ask of this machine, whether the plan needs the cache domains, and how
torch.backends.xeon.run_cpu would have placed the same request.

The planner (:mod:`cpulaunch.plan`) cuts a machine into instances for one request; this
module decides the request on this machine (an engine's local task runs one instance) and
the notes around it. ``--ddp`` ranks are :mod:`cpulaunch.distributed`'s.
"""

from __future__ import annotations

from cpulaunch import cpulist
from cpulaunch.errors import CpulaunchError
from cpulaunch.machine.engines import ENGINE_VARIABLES
from cpulaunch.machine.topology import Topology
from cpulaunch.names import Format, Output
from cpulaunch.plan import Plan, Request, plan
from cpulaunch.records import TYPE_CHECKING

if TYPE_CHECKING:  # the type only: the planner does not import the option surface
    from typing import Mapping, Optional
    from cpulaunch.options import Options

__all__ = ["cache_need", "engine_request", "plan_here", "run_cpu_placement", "run_cpu_note"]


def cache_need(opts: Options, environ: Mapping[str, str]) -> bool:
    """Whether this invocation needs the machine's cache domains (issue 22), decided from
    the options before anything is read, so that planning stays pure and a plan that
    cannot divide a socket or node pays no read for them: ``--show-topology``;
    ``--ninstances`` above 1; ``--instances-per-socket`` or ``--instances-per-node`` above
    1; ``--instances-per-l3``; ``--ncores-per-instance``; ``--latency-mode``; ``--ddp``
    with a number of ranks above 1; and a launch under an engine (torchrun, MPI, Slurm),
    whose local tasks may divide a node; ``--format svg`` (the picture draws them). One
    instance per socket or node, the default single instance and ``--throughput-mode`` do not."""
    if opts.output is Output.SHOW_TOPOLOGY or opts.fmt is Format.SVG:
        return True
    req = opts.request
    if any(count is not None and count > 1 for count in
           (req.ninstances, req.instances_per_socket, req.instances_per_node)):
        return True
    if req.instances_per_l3 or req.ncores_per_instance or req.latency_mode:
        return True
    ranks = opts.ddp.nproc_per_node if opts.ddp is not None else None
    if ranks is not None and (ranks.isdigit() and int(ranks) > 1 or ranks.lower() in ("auto", "cpu")):
        return True
    return any(v in environ for v in ENGINE_VARIABLES)


def engine_request(topo: Topology, req: Request, engine, notes: list) -> Request:
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
    if req.instance_idx is not None:
        raise CpulaunchError(f"{req.said('instance_idx')} does not apply under {engine.engine}: each task runs the "
                             "instance of its local task id")
    if not req.modes() and not req.ncores_per_instance:
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


def run_cpu_note(topo: Topology, req: Request, result: Plan, aliases: tuple[str, ...]) -> Optional[str]:
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


def plan_here(opts: Options, topo: Topology, engine) -> Plan:
    """The plan of a run without --ddp on ``topo``: the request, narrowed to this task's
    instance under an engine that started several (:func:`engine_request`), planned, with
    run_cpu's note where its spellings plan differently (:func:`run_cpu_note`).

    Raises:
        cpulaunch.plan.PlanError, CpulaunchError: the plan cannot be met (one line).
    """

    notes: list = []
    req = engine_request(topo, opts.request, engine, notes)
    result = plan(topo, req)
    note = run_cpu_note(topo, req, result, opts.aliases)
    if note:
        notes.append(note)
    if engine is not None and engine.local_world_size > 1 and req.instance_idx is not None:
        if result.num_instances != engine.local_world_size:
            raise CpulaunchError(
                f"{engine.engine} started {engine.local_world_size} tasks on this machine but "
                f"the options plan {result.num_instances} instance(s); make them agree"
            )
    return result._replace(notes=tuple(notes) + result.notes)
