"""Bind a Ray Train worker in one call at the top of its training function.

Ray starts Ray Train's workers itself (actors of a worker group), not through a launcher,
so nothing binds them: Ray sets ``OMP_NUM_THREADS`` to the CPUs it counts for the worker
and pins nothing, and two workers on one node share every core. ::

    def train_func(config):
        plan = cpulaunch.bind_ray_train_worker()   # first thing
        ...                                        # then the model, the data, the loop

    TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2,
                 resources_per_worker={"CPU": 1})).fit()

:func:`bind_ray_train_worker` reads Ray's train context (world rank, local rank, local
world size, node rank) and the CPUs Ray assigned the worker, plans this node's workers as
``cpulaunch --ddp --nproc-per-node <local world size>`` would (:func:`plan_node`, the
launcher's own planning through :func:`cpulaunch.plan_instances`, on this node's
topology), takes the plan of its local rank and applies it to the whole worker process:
every thread of it (Ray's own threads and the thread running the training function
included: :func:`cpulaunch.machine.affinity.pin_process`), ``torch.set_num_threads`` with
the planned OpenMP threads, the OpenMP variables for pools started later, and the planned
memory policy for the calling thread, the one that runs the training function
(:func:`cpulaunch.bind_current_process`; set_mempolicy(2) acts on its caller only). It returns what it
did (:class:`RayTrainBinding`). Each worker plans alone, and every worker of a node gets the
same plan (same machine, same options), so they come out disjoint without talking.

For Ray Serve replicas or Ray Data actors, which have no train context,
:func:`bind_local_worker` does the same from a local rank and local world size the
program knows. Ray and torch are imported only when called.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Mapping, Optional

from cpulaunch import envvars

__all__ = ["RayTrainBinding", "bind_ray_train_worker", "bind_local_worker", "plan_node", "KEPT_VARIABLES"]

#: The planned variables written into the worker's os.environ (for pools started later):
#: threads and binding only. The rendezvous variables stay Ray's (it made the process
#: group), and LD_PRELOAD / PYTHONPATH act only when a process starts.
KEPT_VARIABLES = ("OMP_", "KMP_", "GOMP_", envvars.CPUS, envvars.BOUND_CPUS, envvars.INSTANCE_INDEX,
                  envvars.NUM_INSTANCES, envvars.MEM_NODES, envvars.MEM_POLICY, envvars.DATALOADER_CPUS,
                  envvars.DATALOADER_WORKERS, envvars.RESERVED_CPUS)


@dataclass(frozen=True)
class RayTrainBinding:
    """What :func:`bind_ray_train_worker` did for one worker.

    Attributes:
        world_rank, world_size: the worker's rank in the job and the job's size (Ray's).
        local_rank, local_world_size: its rank among the workers on this node, and how many.
        node_rank: this node's rank (Ray's).
        ray_cpus: the CPUs Ray assigned the worker (its ``CPU`` resource, a count), None
            when Ray gave none.
        cpus: logical CPU ids the worker's threads are bound to now.
        threads: OpenMP threads planned (``torch.set_num_threads``'s value).
        torch_threads: ``torch.get_num_threads()`` afterwards (None: torch not imported).
        threads_pinned: thread ids of the worker moved to ``cpus``.
        plan: the worker's planned instance (:class:`cpulaunch.render.RenderedInstance`).
        node_cpus: every worker's CPUs on this node, by local rank (the node's plan).
        notes: the plan's notes and what could not be done.
    """

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    ray_cpus: Optional[float]
    cpus: tuple[int, ...]
    threads: int
    torch_threads: Optional[int]
    threads_pinned: tuple[int, ...]
    plan: object
    node_cpus: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def plan_node(local_world_size: int, *, environ: Optional[Mapping[str, str]] = None, **options):
    """This node's workers planned as ``cpulaunch --ddp --nproc-per-node N`` would: the
    :class:`cpulaunch.render.Rendered` of :func:`cpulaunch.plan_instances` with ``ddp=True``,
    ``nproc_per_node=N``, gloo, no exit hook and the C library's allocator (nothing can be
    preloaded into a running process); ``options`` add or
    override the launcher's options (``use_logical_cores=True``, ``dataloader_workers=1``,
    ``sysroot=...``). The environment's engine variables are left out (Ray sets LOCAL_RANK
    and RANK in its workers; the plan is the node's, not one rank's).

    Raises:
        cpulaunch.errors.CpulaunchError: the node cannot hold N workers (one line).
    """
    from cpulaunch.api import plan_instances
    from cpulaunch.machine.engines import DEFAULT_MASTER_PORT, ENGINE_VARIABLES

    env = dict(os.environ if environ is None else environ)
    for name in (*ENGINE_VARIABLES, "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK"):
        env.pop(name, None)
    env = {k: v for k, v in env.items() if not k.startswith("PET_")}
    settings = {"ddp": True, "nproc_per_node": str(local_world_size), "backend": "gloo", "no_exit_hook": True,
                "no_failure_record": True, "allocator": "default", "master_port": DEFAULT_MASTER_PORT, **options}
    return plan_instances(("python",), environ=env, **settings)


def bind_local_worker(local_rank: int, local_world_size: int, *, ray_cpus: Optional[float] = None,
                      world_rank: Optional[int] = None, world_size: Optional[int] = None, node_rank: int = 0,
                      **options) -> RayTrainBinding:
    """Bind this process as worker ``local_rank`` of ``local_world_size`` on this node
    (:func:`plan_node`, then every thread pinned, torch's threads set, the OpenMP
    variables written into os.environ for pools started later).

    Args:
        local_rank, local_world_size: this worker's index among the node's workers, and
            how many there are (0 <= local_rank < local_world_size).
        ray_cpus: the CPUs Ray counts for the worker, for a note when the plan gives it
            more or fewer cores.
        world_rank, world_size, node_rank: for the record (default: the local ones, node 0).
        options: :func:`plan_node`'s.

    Raises:
        ValueError: ranks out of range.
        cpulaunch.errors.CpulaunchError: the node cannot hold the workers.
        OSError: the planned CPUs are outside this process's cpuset.
    """
    from cpulaunch.machine.affinity import pin_process
    from cpulaunch.runtime.bind import bind_current_process

    if not (isinstance(local_world_size, int) and local_world_size >= 1 and isinstance(local_rank, int)
            and 0 <= local_rank < local_world_size):
        raise ValueError(f"local_rank={local_rank!r}, local_world_size={local_world_size!r}: need "
                         "0 <= local_rank < local_world_size")
    rendered = plan_node(local_world_size, **options)
    mine = next(i for i in rendered.instances if i.index == local_rank)
    cpus = tuple(mine.bound_cpus or mine.cpus)
    threads = int(mine.env.get("OMP_NUM_THREADS", len(mine.cpus)))
    notes = list(rendered.notes)
    kept = {k: v for k, v in mine.env.items() if k.startswith(KEPT_VARIABLES)}
    binding = bind_current_process(mine._replace(env=kept))
    notes += binding.notes
    pinned = pin_process(0, cpus)
    notes += pinned.problems
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    if ray_cpus is not None and int(ray_cpus) != len(mine.cpus):
        notes.append(f"Ray counts {ray_cpus:g} CPU(s) for this worker; the plan gives it {len(mine.cpus)} core(s) "
                     f"({_fmt(mine.cpus)}), its share of the node as --ddp --nproc-per-node {local_world_size} "
                     "plans it")
    return RayTrainBinding(
        world_rank=local_rank if world_rank is None else world_rank,
        world_size=local_world_size if world_size is None else world_size,
        local_rank=local_rank, local_world_size=local_world_size, node_rank=node_rank, ray_cpus=ray_cpus,
        cpus=tuple(sorted(os.sched_getaffinity(0))), threads=threads,
        torch_threads=torch.get_num_threads() if torch is not None else None, threads_pinned=pinned.threads,
        plan=mine, node_cpus={i.index: tuple(i.bound_cpus or i.cpus) for i in rendered.instances},
        notes=tuple(notes))


def bind_ray_train_worker(**options) -> RayTrainBinding:
    """Bind this Ray Train worker; call it first in the training function.

    Reads ``ray.train.get_context()`` (world rank and size, local rank and local world
    size, node rank) and ``ray.get_runtime_context().get_assigned_resources()["CPU"]``,
    then does :func:`bind_local_worker`. Imports torch (the worker trains with it) so that
    its thread count is set.

    Args:
        options: the launcher's options for the node's plan (:func:`plan_node`).

    Raises:
        RuntimeError: not inside a Ray Train worker (Ray's own error), or ray missing.
        cpulaunch.errors.CpulaunchError: the node cannot hold its workers (one line).
    """
    try:
        import ray
        import ray.train
    except ImportError as exc:
        raise RuntimeError(f"bind_ray_train_worker needs ray: pip install 'ray[train]' ({exc})") from None
    import torch  # noqa: F401 - its thread count is set by bind_local_worker

    ctx = ray.train.get_context()
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    return bind_local_worker(ctx.get_local_rank(), ctx.get_local_world_size(), ray_cpus=cpus,
                             world_rank=ctx.get_world_rank(), world_size=ctx.get_world_size(),
                             node_rank=ctx.get_node_rank(), **options)


def _fmt(cpus) -> str:
    from cpulaunch import cpulist

    return cpulist.format(cpus)
