"""Which engine started this process, and this rank's place in its job: read from the
environment (the host reader's part of distributed training; planning the ranks is
:mod:`cpulaunch.distributed`).

Engines and the variables they document:

- torchrun / torch.distributed.run (torchelastic): RANK, WORLD_SIZE, LOCAL_RANK,
  LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_NAME, ROLE_WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT,
  TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_USE_AGENT_STORE (the agent's worker env,
  torch/distributed/elastic/agent/server/local_elastic_agent.py).
- MPICH and Intel MPI (Hydra): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS.
- Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
  OMPI_COMM_WORLD_LOCAL_SIZE (PMIX_RANK alongside).
- Slurm srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
  SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE ("2(x3),1"), SLURM_JOB_NODELIST
  ("node[01-04,07]"), SLURM_JOB_ID.

The order of detection is torchrun, MPI, Slurm: ``mpirun`` inside a Slurm allocation
still sets SLURM_* for the job, but its own variables describe the ranks.

Pure functions of the environment (a mapping); imports only the standard library (and
python-hostlist under Slurm), so the launch path can check :data:`ENGINE_VARIABLES` cheaply.
"""

from __future__ import annotations

import re
from typing import Mapping, NamedTuple, Optional

from cpulaunch.errors import DistributedError

__all__ = ["ENGINE_VARIABLES", "RankContext", "detect_engine", "expand_hostlist", "first_host", "tasks_on_node",
           "block_node"]

#: Variables by which :func:`detect_engine` recognises an engine (one of them is set in
#: every process torchrun, Open MPI, MPICH, Slurm or PMIx starts); tests/test_distributed.py
#: holds this list to the detector's.
ENGINE_VARIABLES = ("LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "PMIX_RANK")


class RankContext(NamedTuple):
    """This process's place in a job, as the engine that started it tells.

    Attributes:
        engine: "torchrun", "mpich", "openmpi", "pmix" or "slurm".
        rank: global rank (0 .. world_size-1).
        world_size: number of ranks in the job.
        local_rank: rank among the ranks on this machine.
        local_world_size: ranks on this machine.
        master_addr: host of rank 0, if the engine tells (None: unknown).
        master_port: rendezvous port, if the engine tells.
        notes: how values were derived.
        node_rank: index of this machine among the job's machines (torchrun's GROUP_RANK,
            Slurm's SLURM_NODEID), None when the engine does not tell.
        nnodes: number of machines in the job, None when the engine does not tell.
    """

    engine: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    notes: tuple[str, ...] = ()
    node_rank: Optional[int] = None
    nnodes: Optional[int] = None


def _get_int(env: Mapping[str, str], *names: str) -> Optional[int]:
    for n in names:
        v = env.get(n)
        if v is not None and v.strip().lstrip("-").isdigit():
            return int(v)
    return None


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm hostlist with python-hostlist (Slurm's own rules; no hand parser):
    ``"node[01-03,07],gpu1"`` -> ``["node01", "node02", "node03", "node07", "gpu1"]``
    (zero padding kept, as ``scontrol show hostnames`` does); ``"rack[1-2]-n[1-2]"`` ->
    ``rack1-n1, rack1-n2, rack2-n1, rack2-n2``.

    Raises:
        DistributedError: the text is not a hostlist, or python-hostlist is missing.
    """
    try:
        import hostlist  # python-hostlist, imported only under Slurm
    except ImportError:
        raise DistributedError("reading SLURM_JOB_NODELIST needs python-hostlist: "
                               "pip install python-hostlist, or export MASTER_ADDR") from None
    try:
        return list(hostlist.expand_hostlist(text))
    except Exception as exc:  # hostlist.BadHostlist
        raise DistributedError(f"cannot read the Slurm node list {text!r}: {exc}") from None


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist (rank 0 runs there with the default block
    distribution)."""
    hosts = expand_hostlist(nodelist)
    if not hosts:
        raise DistributedError(f"SLURM_JOB_NODELIST {nodelist!r} names no host")
    return hosts[0]


def tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """Tasks on node ``node_id`` from Slurm's ``"2(x3),1"`` form (3 nodes of 2, then 1)."""
    counts: list = []
    for item in tasks_per_node.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not m:
            raise DistributedError(f"cannot read SLURM_TASKS_PER_NODE {tasks_per_node!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if not 0 <= node_id < len(counts):
        raise DistributedError(f"SLURM_NODEID {node_id} outside SLURM_TASKS_PER_NODE {tasks_per_node!r}")
    return counts[node_id]


def detect_engine(env: Mapping[str, str]) -> Optional[RankContext]:
    """Which engine started this process, and this rank's place (pure).

    Returns None when no engine variables are present (cpulaunch then starts torchrun).

    Raises:
        DistributedError: an engine is recognised but a variable it must set is missing.
    """
    if env.get("LOCAL_RANK") is not None and env.get("RANK") is not None and env.get("WORLD_SIZE"):
        rank, world = _get_int(env, "RANK"), _get_int(env, "WORLD_SIZE")
        local, local_size = _get_int(env, "LOCAL_RANK"), _get_int(env, "LOCAL_WORLD_SIZE")
        if None in (rank, world, local):
            raise DistributedError("RANK, WORLD_SIZE and LOCAL_RANK must be integers")
        return RankContext(
            engine="torchrun",
            rank=rank,
            world_size=world,
            local_rank=local,
            local_world_size=local_size if local_size is not None else 1,
            master_addr=env.get("MASTER_ADDR"),
            master_port=_get_int(env, "MASTER_PORT"),
            node_rank=_get_int(env, "GROUP_RANK"),
            nnodes=_get_int(env, "GROUP_WORLD_SIZE"),
        )
    if env.get("OMPI_COMM_WORLD_RANK") is not None:
        return _mpi(env, "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
    if env.get("PMI_RANK") is not None:
        return _mpi(env, "mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    if env.get("SLURM_PROCID") is not None and env.get("SLURM_STEP_ID") is not None:
        return _slurm(env)
    if env.get("PMIX_RANK") is not None:
        return _mpi(env, "pmix", "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE")
    return None


def _mpi(env, engine, rank_v, size_v, local_v, local_size_v) -> RankContext:
    rank, world = _get_int(env, rank_v), _get_int(env, size_v)
    if rank is None or world is None:
        raise DistributedError(f"{engine}: {rank_v} and {size_v} must be set to integers")
    local = _get_int(env, local_v)
    local_size = _get_int(env, local_size_v)
    notes = []
    if local is None or local_size is None:
        # Without local variables, assume one machine (the only safe reading).
        local, local_size = rank, world
        notes.append(f"{engine}: {local_v}/{local_size_v} not set; assuming all ranks on this machine")
    node, nnodes = block_node(rank, world, local, local_size)
    if node is None:
        notes.append(f"{engine}: rank {rank} (local {local} of {local_size}) is not placed in blocks of "
                     f"{local_size} ranks per machine, so this machine's index is unknown: NODE_RANK and "
                     "GROUP_RANK not set (map ranks by slot, mpirun's default)")
    return RankContext(engine, rank, world, local, local_size, env.get("MASTER_ADDR"),
                       _get_int(env, "MASTER_PORT"), tuple(notes), node, nnodes)


def block_node(rank: int, world_size: int, local_rank: int, local_world_size: int) -> tuple[Optional[int], Optional[int]]:
    """This machine's index and the number of machines when ranks are placed in blocks of
    ``local_world_size`` per machine -> ``(node_rank, nnodes)``, else ``(None, None)``.

    MPI launchers tell a rank its place on its machine but not which machine it is on
    (MPICH/Hydra: MPI_LOCALRANKID; Open MPI's OMPI_COMM_WORLD_NODE_RANK is a rank among
    the processes of one node, not a node index). With block placement (mpirun's default
    mapping by slot: node 0 runs ranks 0..L-1, node 1 runs L..2L-1, ...) rank = node x L +
    local rank, so the node is (rank - local rank) / L; that is also how torchrun numbers
    ranks, and how Lightning derives a global rank from NODE_RANK. Any other placement
    (``--map-by node``, uneven hosts) gives no node index. Examples: ``(5, 8, 1, 2)`` ->
    ``(2, 4)``; ``(3, 8, 0, 2)`` (round robin) -> ``(None, None)``; all ranks on one machine
    ``(1, 2, 1, 2)`` -> ``(0, 1)``.
    """
    if local_world_size < 1 or world_size % local_world_size or not 0 <= local_rank < local_world_size:
        return None, None
    first = rank - local_rank
    if first < 0 or first % local_world_size:
        return None, None
    return first // local_world_size, world_size // local_world_size


def _slurm(env) -> RankContext:
    rank, world = _get_int(env, "SLURM_PROCID"), _get_int(env, "SLURM_NTASKS", "SLURM_NPROCS")
    local = _get_int(env, "SLURM_LOCALID")
    if None in (rank, world, local):
        raise DistributedError("slurm: SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID must be set")
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    node_id = _get_int(env, "SLURM_NODEID") or 0
    local_size = tasks_on_node(per_node, node_id) if per_node else world
    addr = env.get("MASTER_ADDR")
    notes = []
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not addr and nodelist:
        addr = first_host(nodelist)
        notes.append(f"MASTER_ADDR={addr}: the first host of the Slurm node list")
    port = _get_int(env, "MASTER_PORT")
    job = _get_int(env, "SLURM_JOB_ID")
    if port is None and job is not None:
        # Every rank computes the same port from the job id, so concurrent jobs on
        # shared nodes do not collide (range 20000-29999).
        port = 20000 + job % 10000
        notes.append(f"MASTER_PORT={port}: derived from SLURM_JOB_ID {job}")
    # SLURM_NODEID: this node's index in the step (srun(1), "OUTPUT ENVIRONMENT VARIABLES").
    nnodes = _get_int(env, "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    return RankContext("slurm", rank, world, local, local_size, addr, port, tuple(notes),
                       _get_int(env, "SLURM_NODEID"), nnodes)
