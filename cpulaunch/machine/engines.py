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
- HPE PALS (``mpiexec`` on Cray EX, with Cray PMI): PALS_RANKID, PALS_LOCAL_RANKID,
  PALS_NODEID, PALS_LOCAL_SIZE; the world size is Cray PMI's PMI_SIZE (Cray PMI also sets
  PMI_RANK, so PALS is read before MPICH's Hydra).

The order of detection is torchrun, Open MPI, PALS, MPICH, Slurm, PMIx: ``mpirun``
inside a Slurm allocation still sets SLURM_* for the job, but its own variables describe
the ranks.

Every variable read here that is present but malformed (``PALS_RANKID=-1``,
``WORLD_SIZE=four``, ``MASTER_PORT=http``) is an error naming the variable; an empty value
counts as unset (``export X=`` in a job script), as for cpulaunch's own variables.

Besides the engines that start each rank, the environment may hold a launcher's *options*
for the process that starts a machine's ranks (:func:`pod_defaults`): torchrun reads each
of its options from ``PET_<NAME>`` (Kubeflow Trainer and the training operator set
PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT), and a
PyTorchJob pod without them gets MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK without
LOCAL_RANK, counting pods (docs/guide/ddp.md cites the controllers' sources).

Pure functions of the environment (a mapping); imports only the standard library (and
python-hostlist under Slurm), so the launch path can check :data:`ENGINE_VARIABLES` cheaply.
"""

from __future__ import annotations


from cpulaunch.errors import DistributedError
from cpulaunch.notes import explain
from cpulaunch.records import TYPE_CHECKING, Record

if TYPE_CHECKING:
    from typing import Mapping, Optional

__all__ = ["ENGINE_VARIABLES", "RankContext", "detect_engine", "expand_hostlist", "first_host", "tasks_on_node",
           "block_node", "PodDefault", "pod_defaults", "torchrun_variable", "engine_int",
           "LOCAL_MASTER_ADDR", "DEFAULT_MASTER_PORT"]

#: Rank 0's host when a job runs on one machine and nobody names it (``--master-addr``'s
#: default): the loopback address, as torchrun's --standalone uses.
LOCAL_MASTER_ADDR = "127.0.0.1"
#: Rank 0's store port when neither ``--master-port``, the engine nor a free port found
#: here decides: torchrun's default.
DEFAULT_MASTER_PORT = 29500

#: Variables by which :func:`detect_engine` recognises an engine (one of them is set in
#: every process torchrun, Open MPI, MPICH, Slurm or PMIx starts); tests/test_distributed.py
#: holds this list to the detector's.
ENGINE_VARIABLES = ("LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "PMIX_RANK", "PALS_RANKID")


class RankContext(Record):
    """This process's place in a job, as the engine that started it tells.

    Attributes:
        engine: "torchrun", "mpich", "openmpi", "pmix", "pals" or "slurm".
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


#: What each kind of engine variable holds, for :func:`engine_int`'s messages: (smallest
#: value, largest value or None, what it is).
_RANGES = {"index": (0, None, "a whole number 0 or more"), "count": (1, None, "a whole number 1 or more"),
           "port": (1, 65535, "a port number 1-65535")}
#: Variables that hold a count, a port; every other integer variable is an index.
_COUNTS = frozenset({"WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS",
                     "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_SIZE", "PMIX_LOCAL_SIZE",
                     "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES",
                     "SLURM_NNODES", "PALS_LOCAL_SIZE", "PET_NNODES"})
_PORTS = frozenset({"MASTER_PORT", "PET_MASTER_PORT"})


def engine_int(name: str, value: Optional[str]) -> Optional[int]:
    """The integer an engine variable holds, checked (pure): ``("PALS_RANKID", "3")`` ->
    3; ``(name, None)`` and ``(name, "")`` -> None (unset; an empty value counts as unset).

    Ranks, local ranks and node ids are whole numbers 0 or more, sizes 1 or more, ports
    1-65535 (:data:`_COUNTS`, :data:`_PORTS`).

    Raises:
        DistributedError: present but malformed, one line naming the variable:
            ``PALS_RANKID=-1: expected a whole number 0 or more; fix or unset it``.
    """
    if value is None or not value.strip():
        return None
    low, high, what = _RANGES["count" if name in _COUNTS else "port" if name in _PORTS else "index"]
    text = value.strip()
    number = int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None
    if number is None or number < low or (high is not None and number > high):
        from cpulaunch.errors import printable

        raise DistributedError(f"{name}={printable(value)}: expected {what}; fix or unset it")
    return number


def _get_int(env: Mapping[str, str], *names: str) -> Optional[int]:
    """The first of ``names`` set in ``env``, checked by :func:`engine_int` (a malformed
    value is an error, never skipped)."""
    for n in names:
        v = engine_int(n, env.get(n))
        if v is not None:
            return v
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
    import re  # under Slurm only (issue 40: re costs every run milliseconds)

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
        _check_ranks("torchrun", (("RANK", rank), ("WORLD_SIZE", world)),
                     (("LOCAL_RANK", local), ("LOCAL_WORLD_SIZE", local_size)))
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
    if env.get("PALS_RANKID") is not None:
        return _mpi(env, "pals", "PALS_RANKID", "PMI_SIZE", "PALS_LOCAL_RANKID", "PALS_LOCAL_SIZE", "PALS_NODEID")
    if env.get("PMI_RANK") is not None:
        return _mpi(env, "mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    if env.get("SLURM_PROCID") is not None and env.get("SLURM_STEP_ID") is not None:
        return _slurm(env)
    if env.get("PMIX_RANK") is not None:
        return _mpi(env, "pmix", "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE")
    return None


def _check_ranks(engine: str, *pairs) -> None:
    """Each index below its size: ``pairs`` are ``((index variable, value), (size variable,
    value))``, a value None when unset (then not checked).

    Raises:
        DistributedError: ``pals: PALS_RANKID=4 is not below PMI_SIZE=4; ...``.
    """
    for (index_v, index), (size_v, size) in pairs:
        if index is not None and size is not None and index >= size:
            raise DistributedError(f"{engine}: {index_v}={index} is not below {size_v}={size}; "
                                   "the engine's variables disagree")


def _mpi(env, engine, rank_v, size_v, local_v, local_size_v, node_v=None) -> RankContext:
    rank, world = _get_int(env, rank_v), _get_int(env, size_v)
    if rank is None or world is None:
        raise DistributedError(f"{engine}: {rank_v} and {size_v} must be set to integers")
    local = _get_int(env, local_v)
    local_size = _get_int(env, local_size_v)
    _check_ranks(engine, ((rank_v, rank), (size_v, world)), ((local_v, local), (local_size_v, local_size)))
    notes = []
    if local is None or local_size is None:
        # Without local variables, assume one machine (the only safe reading).
        local, local_size = rank, world
        notes.append(f"{engine}: {local_v}/{local_size_v} not set; assuming all ranks on this machine")
    node, nnodes = block_node(rank, world, local, local_size)
    told = _get_int(env, node_v) if node_v else None
    if told is not None:
        # The engine names this machine itself (PALS_NODEID): its index, whatever the placement;
        # the machines are world / local size when every machine runs as many ranks (--ppn).
        even = local_size >= 1 and world % local_size == 0 and told < world // local_size
        node, nnodes = told, world // local_size if even else None
    elif node is None:
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
    _check_ranks("slurm", (("SLURM_PROCID", rank), ("SLURM_NTASKS", world)))
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    node_id = _get_int(env, "SLURM_NODEID") or 0
    local_size = tasks_on_node(per_node, node_id) if per_node else world
    addr = env.get("MASTER_ADDR")
    notes = []
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not addr and nodelist:
        addr = first_host(nodelist)
        notes.append(explain(f"MASTER_ADDR={addr}: the first host of the Slurm node list"))
    port = _get_int(env, "MASTER_PORT")
    job = _get_int(env, "SLURM_JOB_ID")
    if port is None and job is not None:
        # Every rank computes the same port from the job id, so concurrent jobs on
        # shared nodes do not collide (range 20000-29999).
        port = 20000 + job % 10000
        notes.append(explain(f"MASTER_PORT={port}: derived from SLURM_JOB_ID {job}"))
    # SLURM_NODEID: this node's index in the step (srun(1), "OUTPUT ENVIRONMENT VARIABLES").
    nnodes = _get_int(env, "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    return RankContext("slurm", rank, world, local, local_size, addr, port, tuple(notes),
                       _get_int(env, "SLURM_NODEID"), nnodes)


# --------------------------------------------------------------------------- pods: option defaults


class PodDefault(Record):
    """A default for one of cpulaunch's ``--ddp`` options that the environment gives the
    process starting a machine's ranks (a Kubernetes pod's command).

    Attributes:
        dest: the option's python name ("nnodes", "node_rank", "master_addr").
        variable: the variable it comes from ("PET_NNODES", "WORLD_SIZE").
        value: the variable's text as set.
        why: how it was derived, for a note; "" for torchrun's own ``PET_<NAME>`` rule.
    """

    dest: str
    variable: str
    value: str
    why: str = ""


def torchrun_variable(dest: str) -> str:
    """The variable torchrun reads an option from when it is not on its command line:
    ``PET_`` and the option's python name in capitals (``nproc_per_node`` ->
    ``PET_NPROC_PER_NODE``; torch/distributed/argparse_util.py, ``env`` and ``check_env``)."""
    return "PET_" + dest.upper()


#: A PyTorchJob pod's variables (the training operator's pkg/controller.v1/pytorch/envvar.go
#: and master.go) -> the option each stands for when they count pods.
_PYTORCHJOB = (("WORLD_SIZE", "nnodes"), ("RANK", "node_rank"), ("MASTER_ADDR", "master_addr"),
               ("MASTER_PORT", "master_port"))


def pod_defaults(env: Mapping[str, str], torchrun_dests) -> tuple[PodDefault, ...]:
    """Defaults for ``--ddp``'s options from a pod's environment (pure).

    1. torchrun's rule: each option torchrun shares with cpulaunch (``torchrun_dests``, the
       option table's ``torchrun`` rows) from ``PET_<NAME>`` (:func:`torchrun_variable`)
       when set and not empty. Kubeflow Trainer's torch plugin sets PET_NNODES,
       PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT; the training
       operator (v1.7-v1.9) sets PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE and
       PET_MASTER_* beside the variables of 2.
    2. A PyTorchJob pod's own variables, when LOCAL_RANK is not set (then no launcher
       started this process as a rank) and PET_NNODES is not (then they count pods, one
       process each, as the operator's pods were planned): WORLD_SIZE -> ``nnodes``, RANK
       -> ``node_rank``, MASTER_ADDR -> ``master_addr``, MASTER_PORT -> ``master_port``,
       each unless its ``PET_`` variable is set.

    Examples: ``{"PET_NNODES": "2", "PET_NODE_RANK": "1"}`` -> nnodes "2" from PET_NNODES,
    node_rank "1" from PET_NODE_RANK; ``{"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR":
    "job-master-0", "MASTER_PORT": "23456"}`` -> nnodes 2, node_rank 1 and the master.

    Raises:
        DistributedError: a PyTorchJob variable present but malformed (``RANK=x``), or RANK
            not below WORLD_SIZE, naming the variables. (``PET_*`` values are checked with
            the option they set, in the options' words.)
    """
    out = [PodDefault(d, torchrun_variable(d), env[torchrun_variable(d)]) for d in torchrun_dests
           if (env.get(torchrun_variable(d)) or "").strip()]
    if env.get("LOCAL_RANK") is None and (env.get("PET_NNODES") or "").strip() == "" \
            and (env.get("RANK") or "").strip() and (env.get("WORLD_SIZE") or "").strip():
        rank, world = _get_int(env, "RANK"), _get_int(env, "WORLD_SIZE")
        _get_int(env, "MASTER_PORT")
        _check_ranks("a PyTorchJob pod", (("RANK", rank), ("WORLD_SIZE", world)))
        why = (f"RANK={rank} WORLD_SIZE={world} without LOCAL_RANK (a PyTorchJob pod's variables, counting "
               f"pods): this machine is node {rank} of {world}")
        have = {d.dest for d in out}
        out += [PodDefault(dest, var, env[var], why) for var, dest in _PYTORCHJOB
                if dest not in have and (env.get(var) or "").strip()]
    return tuple(out)
