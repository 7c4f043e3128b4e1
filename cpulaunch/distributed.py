"""Distributed (DDP) support: each rank's plan and variables, the backend choice.

Pure functions of the environment (a mapping), the engine that started us (read by
:mod:`cpulaunch.machine.engines`: torchrun, MPI, Slurm) and the plan; the CLI does the side
effects. Nothing here imports torch at module import; :func:`init_process_group` imports it
when called, in the training program.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Callable, Mapping, Optional, Sequence

from cpulaunch import envvars
from cpulaunch.errors import DistributedError
from cpulaunch.notes import explain
from cpulaunch.render import runs_python  # noqa: F401 (also this module's: the program rules live in render)
from cpulaunch.spelling import Spelling
from cpulaunch.machine.engines import (DEFAULT_MASTER_PORT, LOCAL_MASTER_ADDR, RankContext, block_node, detect_engine,
                                       expand_hostlist, first_host, tasks_on_node)

__all__ = [
    "RankContext",
    "DistributedError",
    "detect_engine",
    "first_host",
    "expand_hostlist",
    "tasks_on_node",
    "select_backend",
    "rank_env",
    "elastic_rank_env",
    "exit_hook_env",
    "is_hook_folder",
    "with_local_rank",
    "runs_python",
    "site_hook_dir",
    "block_node",
    "DEFAULT_ROLE",
    "rank_request",
    "ccl_env",
    "ccl_runtime_env",
    "ccl_precedence",
    "CCL_DEFAULTS",
    "ccl_changed",
    "ccl_expected_warning",
    "iface_env",
    "torchrun_argv",
    "init_process_group",
    "DEFAULT_MASTER_PORT",
    "RankPlan",
    "plan_ranks",
    "mpi_env_hint",
    "wrap_ddp",
]



def mpi_env_hint(engine: str, name: str, value: str) -> str:
    """How to pass one variable to every rank with this engine's own launcher."""
    if engine == "openmpi":
        return f"mpirun -x {name}={value}"
    if engine == "slurm":
        return f"srun --export=ALL,{name}={value}"
    if engine == "mpich":
        return f"mpirun -genv {name} {value}"
    return f"export {name}={value}"


def _ccl_problem(binding, fabric, environ: Mapping[str, str]) -> Optional[tuple]:
    """Why the ccl backend cannot work here -> (cause, fix), or None when it can (pure).
    The user's own CCL_OFI_LIBRARY_PATH / FI_PROVIDER_PATH stand for a library / provider
    folder not found."""
    gloo = "or use --backend gloo"
    if binding is None or binding.path is None:
        where = f"for {binding.python}" if binding is not None else "in this Python environment"
        return (f"oneccl_bindings_for_pytorch is not installed {where}",
                ("install oneccl_bindings_for_pytorch built for this torch (Intel's own wheels stop at torch "
                 f"2.8: build intel/torch-ccl against the installed torch), {gloo}"))
    if binding.loads is False:
        what = f"oneccl_bindings_for_pytorch {binding.version or ''} ({binding.path})".replace("  ", " ")
        return (f"{what} does not load with torch {binding.torch_version or '?'}: {binding.why} "
                f"({_verdict_source(binding)})", f"rebuild it against the installed torch, {gloo}")
    from cpulaunch.machine.libraries import REGISTRY

    install = REGISTRY["libfabric"].install.split(" (")[0]
    lib = fabric.library if fabric is not None else None
    if lib is None and not environ.get("CCL_OFI_LIBRARY_PATH"):
        where = ", ".join(str(d) for d in fabric.searched) if fabric is not None else "nowhere"
        return (f"oneCCL's libfabric (libfabric.so.1 with its prov/ folder) was not found (searched {where})",
                f"{install}, or set CCL_OFI_LIBRARY_PATH and FI_PROVIDER_PATH; {gloo}")
    if (fabric is None or fabric.providers is None) and not environ.get("FI_PROVIDER_PATH"):
        return ((f"libfabric {lib} has no provider folder beside it (prov/lib*-fi.so), so oneCCL "
                "finds no provider"), f"set FI_PROVIDER_PATH to its providers' folder or {install}; {gloo}")
    return None


def _verdict_source(binding) -> str:
    """Where the bindings' verdict came from, for notes and errors (pure): ``"cached
    verdict: FILE; cpulaunch doctor --clear-cache removes it"`` or ``"checked in a child
    process; verdict kept in FILE"``."""
    if binding.cached:
        return f"cached verdict: {binding.cache_file}; cpulaunch doctor --clear-cache removes it"
    kept = getattr(binding, "cache_file", None)
    return "checked in a child process" + (f"; verdict kept in {kept}" if kept else "")


def select_backend(requested: str, binding, fabric, environ: Mapping[str, str]) -> tuple[str, str]:
    """Choose the process-group backend -> (backend, note) (pure).

    Args:
        requested: ``--backend``: "auto", "gloo" or "ccl".
        binding: the bindings as the host reader found them
            (:class:`cpulaunch.machine.host.CclBinding`: installed, and whether they load
            with this torch, checked in a child process); None when not looked up.
        fabric: oneCCL's libfabric (:class:`cpulaunch.machine.libfinder.Fabric`); None
            when not looked up.
        environ: the user's environment (their own CCL_OFI_LIBRARY_PATH and
            FI_PROVIDER_PATH count as found).

    Rules (issue 21, docs/guide/ddp.md): ccl needs the bindings installed, loading with this
    torch (the child's verdict; the version string proves nothing either way: the working
    build calls itself 2.8.0+xpu under torch 2.13, a stale one with matching metadata
    aborts at import), and libfabric with its provider folder. ``auto`` picks ccl when all
    hold, else gloo with a note naming what did not.

    Raises:
        DistributedError: ``ccl`` asked for and one of those does not hold: one line, the
            cause and the fix.
    """
    if requested == "gloo":
        return "gloo", explain("backend gloo (asked for)")
    problem = _ccl_problem(binding, fabric, environ)
    if problem is not None:
        cause, fix = problem
        if requested == "ccl":
            raise DistributedError(f"--backend ccl: {cause}; {fix}")
        return "gloo", explain(f"backend gloo: {cause}, so oneCCL is not used")
    how = _verdict_source(binding)
    loads = f"oneccl_bindings_for_pytorch {binding.version or ''} loads with torch {binding.torch_version or '?'}"
    asked = " (asked for)" if requested == "ccl" else ""
    return "ccl", explain(f"backend ccl{asked}: {loads.replace('  ', ' ')} ({how})")


def rank_request(req, spec: Optional[str], topo, local_size: Optional[int] = None, said: str = "",
                 notes: Optional[list] = None):
    """The planner request for this machine's ranks (pure).

    Args:
        req: the user's :class:`cpulaunch.plan.Request` (placement modes must be unset).
        spec: ``--nproc-per-node``: "socket" (default), "node", "auto" (or "cpu", its
            synonym in torchrun and Kubeflow) or a number, or None.
        topo: the machine.
        local_size: ranks the engine started on this machine; with ``spec`` None or
            ``auto`` it decides: as many as sockets -> per socket, as many as NUMA nodes ->
            per node, else that many instances.
        said: how the user gave ``spec`` (``--nproc_per_node 4``, ``PET_NPROC_PER_NODE=auto``),
            so that the planner's messages name it; default: ``--nproc-per-node SPEC``, or
            how the engine set it.
        notes: where the notes on the count go (the limits below), if given.

    Rules (issue 35): ``auto`` is torchrun's count on a CPU machine (one process per CPU
    this process may use, ``torch._utils.cpu_count()``) in cpulaunch's unit, one rank per
    usable physical core (:func:`cpulaunch.plan.usable_cores`; each rank with its budget
    cores: ``--dataloader-workers`` and the like), and at most the ranks the cgroup CPU
    quota runs at once (:func:`cpulaunch.plan.quota_limit`). The default, one rank per
    socket, is lowered to that quota limit too. Both say so in a note naming the limit.
    An explicit count (or ``socket``/``node``) above it plans as asked, with the
    planner's note (:mod:`cpulaunch.plan`, rule 6).

    Raises:
        DistributedError: a placement mode was given with --ddp, or ``spec`` is invalid.
    """
    from cpulaunch.plan import quota_limit, quota_text, usable_cores

    said_notes = [] if notes is None else notes
    notes = _Notes(said_notes)
    if req.modes() or req.ncores_per_instance:
        given = req.said((req.modes() or ("ncores_per_instance",))[0])
        raise DistributedError(f"{given} cannot be combined with --ddp: --ddp places one rank per socket "
                               "(use --nproc-per-node socket|node|auto|N)")
    spec = (spec or "").strip().lower() or None
    limit = quota_limit(topo)
    if spec is not None:
        said = said or f"--nproc-per-node {spec}"
    if spec in ("auto", "cpu") and local_size is not None:
        notes.append(explain(f"{said}: {local_size} rank(s), as many as the engine started on this machine"))
        spec = None
    if spec in ("auto", "cpu"):
        per_rank = 1 + req.dataloader_workers + req.reserve_cores + req.ccl_workers
        cores = usable_cores(topo, req)
        count = max(1, cores // per_rank)
        why = f"one per usable core ({cores} {'core' if cores == 1 else 'cores'}, CPUs " \
              f"{_fmt(topo.allowed)} allowed by {topo.allowed_source})" if per_rank == 1 else \
              f"one per {per_rank} usable cores (each rank's cores and its set-aside ones; {cores} usable)"
        if limit is not None and limit < count:
            notes.append(f"{said}: {limit} rank(s), as many as {quota_text(topo)} runs at once "
                         f"({count} by the cores: {why})")
            count = limit
        else:
            notes.append(explain(f"{said}: {count} rank(s), {why}"))
        name = said.split(" ")[0].split("=")[0] if said.startswith("-") else said
        return req._replace(ninstances=count, words=req.words.given_as("ninstances", Spelling("derived", name, said)))
    if spec is None and local_size is not None:
        sockets = {c.socket for c in topo.cores if set(c.cpus) & topo.allowed}
        nodes = {c.node for c in topo.cores if set(c.cpus) & topo.allowed}
        spec = "socket" if local_size == len(sockets) else "node" if local_size == len(nodes) else str(local_size)
        said = f"{local_size} ranks started on this machine"
    elif spec is None:
        spec, said = "socket", "--ddp (one rank per socket)"
        sockets = {c.socket for c in topo.cores if set(c.cpus) & topo.allowed}
        if limit is not None and limit < len(sockets):
            notes.append(f"--ddp: {limit} rank(s), as many as {quota_text(topo)} runs at once, not one per "
                         f"socket ({len(sockets)}); pass --nproc-per-node socket for one per socket anyway")
            spec, said = str(limit), f"--ddp ({limit} rank(s) under the CPU quota)"
    name = said.split(" ")[0] if said.startswith("-") else said
    field = {"socket": "instances_per_socket", "node": "instances_per_node"}.get(spec, "ninstances")
    if field == "ninstances" and (not spec.isdigit() or int(spec) < 1):
        raise DistributedError(f"{said}: use a positive number, 'auto', 'socket' or 'node'")
    return req._replace(**{field: 1 if field != "ninstances" else int(spec)},
                        words=req.words.given_as(field, Spelling("derived", name, said)))


class _Notes:
    """A notes list that takes each note once (a request may be made twice for one plan)."""

    def __init__(self, notes: list) -> None:
        self.notes = notes

    def append(self, note: str) -> None:
        _note(self.notes, note)


def iface_env(iface: Optional[str]) -> dict[str, str]:
    """One network interface for every library: gloo, oneCCL's key-value store, libfabric."""
    if not iface:
        return {}
    return {"GLOO_SOCKET_IFNAME": iface, "CCL_KVS_IFACE": iface, "FI_TCP_IFACE": iface}


#: torchrun's name for the one role of a job (``torchrun --role``'s default).
DEFAULT_ROLE = "default"


def rank_env(ctx: RankContext, master_addr: str, master_port: int, backend: str) -> dict[str, str]:
    """The variables torch.distributed's env:// rendezvous and DDP programs read: what
    torchrun gives its workers, as far as a run without torchrun's agent can say it, plus
    NODE_RANK (Lightning reads NODE_RANK, else GROUP_RANK, else takes node 0).

    torchrun's worker variables (torch/distributed/run.py, "Environment Variables"; the agent's
    ``_start_workers``): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT; GROUP_RANK and GROUP_WORLD_SIZE (this machine's index and the number of
    machines, one worker group per machine); ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME (one role,
    so the global rank, the world size and torchrun's default name). Given only when the
    engine tells them: GROUP_RANK/NODE_RANK from ``ctx.node_rank``, GROUP_WORLD_SIZE from
    ``ctx.nnodes``. Never the TORCHELASTIC_* variables: they describe torchelastic's agent (its
    rendezvous id, its restarts of the worker group, its store), and there is none;
    TORCHELASTIC_RUN_ID would also make ``torch.distributed.is_torchelastic_launched()``
    true. Under the user's own torchrun (``ctx.engine == "torchrun"``) the agent's values
    are left as it set them (a ``--role`` of its own included) and only NODE_RANK is added.
    """
    env = {
        "RANK": str(ctx.rank),
        "WORLD_SIZE": str(ctx.world_size),
        "LOCAL_RANK": str(ctx.local_rank),
        "LOCAL_WORLD_SIZE": str(ctx.local_world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        envvars.DIST_BACKEND: backend,
    }
    if ctx.node_rank is not None:
        env["NODE_RANK"] = str(ctx.node_rank)
    if ctx.engine == "torchrun":
        return env
    env.update({"ROLE_RANK": str(ctx.rank), "ROLE_WORLD_SIZE": str(ctx.world_size), "ROLE_NAME": DEFAULT_ROLE})
    if ctx.node_rank is not None:
        env["GROUP_RANK"] = str(ctx.node_rank)
    if ctx.nnodes is not None:
        env["GROUP_WORLD_SIZE"] = str(ctx.nnodes)
    return env


def site_hook_dir() -> str:
    """The folder cpulaunch puts first on every rank's PYTHONPATH: it holds only a
    ``sitecustomize`` that ends the default process group before the interpreter
    finalizes, when the program left it alive (:mod:`cpulaunch.runtime.exithook`; issue 24
    item 8). Computed from this file's path (no file is read)."""
    return os.path.join(os.path.dirname(__file__), "runtime", "sitehook")


#: How a cpulaunch hook folder ends, whatever install it belongs to.
_HOOK_TAIL = os.path.join("cpulaunch", "runtime", "sitehook")


def is_hook_folder(entry: str) -> bool:
    """Whether the PYTHONPATH entry ``entry`` is a cpulaunch hook folder, this install's or
    another's (pure, by its spelling: ``/venv/lib/python3.11/site-packages/cpulaunch/runtime/sitehook``
    -> True, ``/src`` -> False). A link named otherwise is told apart by the hook itself at
    start-up, by the marker file it holds (cpulaunch/runtime/sitehook/_cpulaunch_site_hook.py)."""
    if not entry:
        return False
    norm = os.path.normpath(entry)
    return norm == site_hook_dir() or norm.endswith(os.sep + _HOOK_TAIL)


#: Python's own options that take the next word as their value (``python --help``): the
#: script is the first word after the interpreter's options, skipping these values.
_PYTHON_OPTIONS_WITH_VALUE = frozenset({"-W", "-X", "--check-hash-based-pycs"})


def with_local_rank(argv: Sequence[str], python: str, local_rank: int) -> tuple[str, ...]:
    """``argv`` with ``--local_rank=N`` where ``torch.distributed.launch`` put its local-rank
    argument: right after the script, before the script's own arguments (torch's
    ``torch/distributed/run.py`` ``config_from_args``: ``python -u SCRIPT --local-rank=N
    ARGS``; with ``-m`` after the module; with ``--no-python`` after the program). The
    underscore spelling is the one programs written for torch < 2.0 parse (the PyTorch
    training article's ``parser.add_argument('--local_rank', ...)``); torch >= 2.0 passes
    ``--local-rank``, which those programs refuse (torch's launch.py docstring).

    Pure. The script of a Python command (:func:`runs_python`) is the first word after the
    interpreter's options (``-u``, ``-O``, ``-W arg``, ``-X opt``, ...); ``-m MOD`` and
    ``-c CODE`` (or ``-mMOD``) end the options too. A command that is not Python gets it
    after its first word. Examples (python = ``/usr/bin/python3``)::

        ["/usr/bin/python3", "-u", "train.py", "--lr", "1"], 1
            -> ["/usr/bin/python3", "-u", "train.py", "--local_rank=1", "--lr", "1"]
        ["/usr/bin/python3", "-m", "pkg.train", "x"], 0 -> [..., "pkg.train", "--local_rank=0", "x"]
        ["./train.sh", "x"], 1 -> ["./train.sh", "--local_rank=1", "x"]

    Args:
        argv: the resolved program (:func:`cpulaunch.render.resolve_program`).
        python: the interpreter cpulaunch runs under.
        local_rank: the rank's index on its machine (LOCAL_RANK).
    """
    words = list(argv)
    arg = f"--local_rank={local_rank}"
    if not words:
        return (arg,)
    at = 1
    if runs_python(words, python):
        while at < len(words):
            word = words[at]
            if word in ("-m", "-c"):
                at += 2
                break
            if word == "-" or not word.startswith("-") or word.startswith(("-m", "-c")) and not word.startswith("--"):
                at += 1
                break
            at += 2 if word in _PYTHON_OPTIONS_WITH_VALUE else 1
        at = min(at, len(words))
    return tuple(words[:at] + [arg] + words[at:])


def exit_hook_env(environ: Mapping[str, str]) -> dict[str, str]:
    """PYTHONPATH for a rank: :func:`site_hook_dir` first, then the user's own entries
    unchanged but for every cpulaunch hook folder (:func:`is_hook_folder`: an outer
    cpulaunch's in a nested launch, another install's), which goes (none added when the
    user had none: an empty entry would mean the current folder). Examples:
    ``{"PYTHONPATH": "/src"}`` -> ``{"PYTHONPATH": "<hook>:/src"}``;
    ``{"PYTHONPATH": "/src:/old/cpulaunch/runtime/sitehook"}`` -> ``{"PYTHONPATH": "<hook>:/src"}``.

    Why a ``sitecustomize`` and not a wrapper (``python -m cpulaunch.runtime.rank x.py``):
    it reaches every Python a rank starts, whatever the program is (a shell script, a
    console script such as ``lightning``), needs no cpulaunch in the rank's interpreter,
    and leaves the program's argv, ``__main__`` and tracebacks as they are; the
    ``sitecustomize`` Python would have run (the distribution's, a venv's, the user's) is
    run after it (docs/guide/training.md, "Ranks that abort at exit").
    """
    hook, user = site_hook_dir(), environ.get("PYTHONPATH", "")
    kept = [e for e in user.split(os.pathsep) if not is_hook_folder(e)] if user else []
    return {"PYTHONPATH": os.pathsep.join([hook, *kept])}


def record_hook_env(program: Sequence[str], python: str, environ: Mapping[str, str]) -> dict[str, str]:
    """What a supervised instance that is not a DDP rank needs to record its first failure
    (issue 38): :func:`exit_hook_env`'s PYTHONPATH and ``CPULAUNCH_SITE_HOOKS=record`` (the
    exit hook is a DDP rank's only) for a Python program (:func:`runs_python`), else {}.
    The launcher adds it when it starts the instances, with the pipe the recorder writes to
    (plumbing, as ``CPULAUNCH_BINDING_FILE`` is): ``--dry-run`` of a multi-instance run does
    not show it; a DDP rank's plan does (the exit hook shares the folder)."""
    if not runs_python(program, python):
        return {}
    return {**exit_hook_env(environ), envvars.SITE_HOOKS: "record"}


def elastic_rank_env(agent_env: Mapping[str, str]) -> dict[str, str]:
    """What the elastic rank entry adds to the variables torchrun's agent gave a worker:
    NODE_RANK = GROUP_RANK (the agent assigns machines their index at the rendezvous, so
    the parent cannot render it). Empty when the agent gave no GROUP_RANK."""
    group = agent_env.get("GROUP_RANK")
    return {"NODE_RANK": group} if group is not None and group.strip().isdigit() else {}


#: oneCCL variables that must agree with each other: a user's value for one keeps cpulaunch's
#: value of both out (oneCCL refuses an affinity list of another length than the count).
_CCL_LINKED = ("CCL_WORKER_COUNT", "CCL_WORKER_AFFINITY")
#: Identity variables, always cpulaunch's: one value exported for the whole job cannot be
#: right for every rank.
_CCL_IDENTITY = ("CCL_LOCAL_RANK", "CCL_LOCAL_SIZE", envvars.CCL_WORKER_CPUS)


def ccl_runtime_env(fabric) -> dict[str, str]:
    """The two variables oneCCL cannot start a collective without, from the libfabric found
    (:class:`cpulaunch.machine.libfinder.Fabric`, or None): ``CCL_OFI_LIBRARY_PATH`` (the
    library file; without it oneCCL dlopens "libfabric.so" and fails: "could not open the
    library") and ``FI_PROVIDER_PATH`` (its providers; without it "can't find suitable
    provider"). docs/guide/ddp.md, measured with impi-rt 2021.14.2."""
    env = {}
    if fabric is not None and fabric.library is not None:
        env["CCL_OFI_LIBRARY_PATH"] = str(fabric.library)
    if fabric is not None and fabric.providers is not None:
        env["FI_PROVIDER_PATH"] = str(fabric.providers)
    return env


def ccl_env(ctx: RankContext, workers: Sequence[Sequence[int]], *, dedicated: bool,
            runtime: Mapping[str, str] = MappingProxyType({})) -> dict[str, str]:
    """oneCCL's variables for one rank (pure). Rules measured with oneCCL 2021.14 on this
    project's machine (docs/guide/ddp.md, "oneCCL on this machine").

    Args:
        ctx: the rank (its local rank and the ranks on its machine).
        workers: for each local rank in order, the logical CPUs of its oneCCL workers:
            the cores set aside for them when ``dedicated``, else the one CPU the worker
            shares (the rank's first CPU). Under an engine that bound each rank, this
            rank's own worker CPUs once per local rank (each rank takes its own slice).
        dedicated: the workers have cores of their own (``--ccl-worker-count K``).
        runtime: :func:`ccl_runtime_env`'s variables.

    Rules:

    - ``CCL_WORKER_COUNT`` = worker CPUs per rank (never 0: oneCCL rejects it) and
      ``CCL_WORKER_AFFINITY`` = every local rank's worker CPUs in local-rank order, the
      same list on each rank (oneCCL gives local rank i entries i x count .. i x count +
      count - 1 and refuses a list of another length). Unset or ``auto``, oneCCL pins its
      workers to the machine's last CPUs, outside the ranks' binding.
    - Without dedicated cores ``CCL_YIELD=sched_yield``: the worker shares the rank's CPU,
      and oneCCL's spinning wait (``pause``) keeps that CPU from it (8-50 ms a collective
      here). Worker on the rank's own CPU + sched_yield: 64 MB all_reduce 3.6-3.8x faster
      than gloo; either change alone did not beat it (``CCL_WORKER_OFFLOAD=0`` did for
      all_reduce but lost in training, so it is not set).
    - ``CCL_ATL_SHM=1`` with several ranks on the machine: shared memory between them
      (``FI_PROVIDER=shm`` is refused by oneCCL).
    - ``CCL_LOCAL_RANK``/``CCL_LOCAL_SIZE`` (the bindings derive the same from LOCAL_RANK
      and LOCAL_WORLD_SIZE); launcher and transport: under MPICH (Hydra) ``hydra`` and
      ``ofi`` (oneCCL's default transport there, ``mpi``, needs Intel MPI); Open MPI and
      PMIx ``pmix``/``ofi`` (not run here); otherwise ``none``/``ofi``.
    - ``CPULAUNCH_CCL_WORKER_CPUS``: this rank's worker CPUs, for ``cpulaunch verify``.
    """
    count = min(len(c) for c in workers)
    if count < 1:
        raise DistributedError(f"internal: a rank without a CPU for oneCCL's worker ({list(workers)})")
    slices = [sorted(cpus)[:count] for cpus in workers]
    env = {
        "CCL_WORKER_COUNT": str(count),
        "CCL_WORKER_AFFINITY": ",".join(str(c) for cpus in slices for c in cpus),
        "CCL_LOCAL_RANK": str(ctx.local_rank),
        "CCL_LOCAL_SIZE": str(ctx.local_world_size),
        envvars.CCL_WORKER_CPUS: ",".join(str(c) for c in slices[ctx.local_rank]),
        **runtime,
    }
    if not dedicated:
        env["CCL_YIELD"] = "sched_yield"
    if ctx.local_world_size > 1:
        env["CCL_ATL_SHM"] = "1"
    launcher = {"mpich": "hydra", "pmix": "pmix", "openmpi": "pmix"}.get(ctx.engine, "none")
    env.update({"CCL_PROCESS_LAUNCHER": launcher, "CCL_ATL_TRANSPORT": "ofi"})
    return env


#: oneCCL 2021.14's own defaults for the variables cpulaunch or the bindings set that it
#: warns about (the PyPI library is built with MPI, so CCL_ATL_TRANSPORT's default is mpi).
#: For each one set to another value, oneCCL's rank 0 logs ``|CCL_WARN| value of NAME
#: changed to be VALUE (default:DEFAULT)`` on its stdout. Measured on real runs
#: (docs/dev/oneccl.md, "Threads of a ccl rank"): CCL_OFI_LIBRARY_PATH (default empty) is
#: one of them; CCL_WORKER_AFFINITY is parsed apart and never logged, whatever its value.
CCL_DEFAULTS = MappingProxyType({"CCL_WORKER_COUNT": "1", "CCL_YIELD": "pause", "CCL_ATL_SHM": "0",
                                 "CCL_ATL_TRANSPORT": "mpi", "CCL_PROCESS_LAUNCHER": "hydra", "CCL_LOCAL_RANK": "-1",
                                 "CCL_LOCAL_SIZE": "-1", "CCL_OFI_LIBRARY_PATH": ""})
_CCL_CHANGED = re.compile(rb"\|CCL_WARN\| value of (CCL_\w+) changed to be (.*) \(default:[^)]*\)\s*$")


def ccl_changed(env: Mapping[str, str]) -> list[str]:
    """The variables of :data:`CCL_DEFAULTS` that ``env`` sets to another value than
    oneCCL's default, sorted (pure): each costs a ``value of ... changed`` warning on rank 0."""
    return sorted(k for k, default in CCL_DEFAULTS.items() if k in env and env[k] != default)


def ccl_expected_warning(env: Mapping[str, str]) -> Callable[[bytes], bool]:
    """A predicate on a line of a rank's output (bytes, no newline): True for oneCCL's
    ``|CCL_WARN| value of NAME changed to be VALUE (default:...)`` when ``env`` (the rank's
    planned variables) sets NAME to exactly VALUE: a warning about a value the plan chose,
    which the launcher's relay folds into the plan's one note (:func:`_ccl_for`). Any other
    line, another value included, is False (pure)."""
    def expected(line: bytes) -> bool:
        m = _CCL_CHANGED.search(line)
        return m is not None and env.get(m.group(1).decode()) == m.group(2).decode(errors="replace")
    return expected


def ccl_precedence(planned: Mapping[str, str], environ: Mapping[str, str], override_env: bool) -> tuple[dict[str, str], list[str]]:
    """The user's own CCL_*/FI_* values win over ``planned`` ones, as for OMP_* (render's
    rule), unless ``override_env`` -> (the variables cpulaunch sets, notes) (pure).

    A user's ``CCL_WORKER_COUNT`` or ``CCL_WORKER_AFFINITY`` keeps cpulaunch's value of
    both out (they must agree); ``CPULAUNCH_CCL_WORKER_CPUS`` then goes too (the workers
    are no longer where the plan put them). ``CCL_LOCAL_RANK``/``CCL_LOCAL_SIZE`` are
    identity variables, always cpulaunch's.
    """
    if override_env:
        return dict(planned), []
    env, notes = dict(planned), []
    users = {k for k, v in planned.items() if k not in _CCL_IDENTITY and k in environ and environ[k] != v}
    if users & set(_CCL_LINKED):
        users |= set(_CCL_LINKED) & set(planned)
    for name in sorted(users):
        value = env.pop(name)
        if name in environ:
            notes.append(f"{name}={environ[name]} from your environment kept (cpulaunch planned {value}); "
                         "pass --override-env to use cpulaunch's value")
        else:
            other = next(k for k in _CCL_LINKED if k in environ)
            notes.append(f"{name} not set (cpulaunch planned {value}): it must agree with your {other}")
    if users & set(_CCL_LINKED):
        env.pop(envvars.CCL_WORKER_CPUS, None)
    return env, notes


def torchrun_argv(
    python: str,
    nproc_per_node: int,
    nnodes: str,
    node_rank: int,
    master_addr: Optional[str],
    master_port: Optional[int],
    rdzv_endpoint: Optional[str],
    rdzv_id: Optional[str],
    entry: Sequence[str],
    *,
    max_restarts: Optional[int] = None,
    streams: Sequence[str] = (),
) -> list[str]:
    """The ``python -m torch.distributed.run`` command that starts this node's ranks.

    Static rendezvous: ``--nnodes N --node-rank R --master-addr H --master-port P``;
    elastic: ``--rdzv-backend c10d --rdzv-endpoint H:P --rdzv-id ID`` and, when given,
    ``--max-restarts N`` (torchrun's agent restarts every local rank up to N times after a
    failure; None leaves torchrun's default, 0). ``streams``: torchrun's ``--tee``,
    ``--redirects``, ``--log-dir`` and ``--local-ranks-filter`` words
    (:meth:`cpulaunch.options.Streams.torchrun_args`). ``entry`` runs once per rank with
    ``--no-python`` (cpulaunch's own per-rank entry).
    """
    argv = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc_per_node),
            "--nnodes", str(nnodes)]
    if rdzv_endpoint:
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint,
                 "--rdzv-id", rdzv_id or "cpulaunch"]
        if max_restarts is not None:
            argv += ["--max-restarts", str(max_restarts)]
    else:
        argv += ["--node-rank", str(node_rank), "--master-addr", master_addr or LOCAL_MASTER_ADDR,
                 "--master-port", str(master_port or DEFAULT_MASTER_PORT)]
    return argv + [*streams, "--no-python", *entry]


#: torch's switch that stops torchrun's agent from sharing its rendezvous store's TCP server
#: with the ranks. Shared (torch 2.13.0 to 2.15.0's default), the machine that stays rank 0
#: from one rendezvous round to the next keeps its first round's MASTER_ADDR and never
#: publishes it for the next, so a machine joining a running job waits for that key until the
#: store's timeout (measured on emulated hosts with torch 2.14.1: both agents fail after 60 s
#: with "DistStoreError: wait timeout ... /torch.rendezvous.ID.1/MASTER_ADDR"; docs/guide/ddp.md).
NO_SHARED_RDZV_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def elastic_agent_env(nnodes: str, environ: Mapping[str, str]) -> dict[str, str]:
    """What an elastic run's torchrun gets in its environment beyond ``environ``:
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` when machines may join a running job
    (``nnodes`` ``MIN:MAX`` with MIN < MAX) and the user did not set it (their value is kept,
    ``0`` included); else {}. See :data:`NO_SHARED_RDZV_STORE`."""
    low, _, high = str(nnodes).partition(":")
    if not high or low.strip() == high.strip() or NO_SHARED_RDZV_STORE in environ:
        return {}
    return {NO_SHARED_RDZV_STORE: "1"}


# --------------------------------------------------------------------------- rank plans


@dataclass(frozen=True)
class RankPlan:
    """This machine's ranks, planned once (pure; the parent renders and runs them).

    Attributes:
        plan: the ranks as planner instances (``index`` = local rank).
        instance_env: identity variables per local rank (RANK, WORLD_SIZE, MASTER_*,
            the backend, CCL_*); what each rank's process really receives.
        environ: the user's environment as the ranks see it (torchrun's default
            OMP_NUM_THREADS=1 removed under the user's own torchrun).
        notes: how values were chosen.
        engine: the engine that started us, or None when cpulaunch starts the ranks.
        backend: "gloo" or "ccl".
        elastic: cpulaunch starts torchrun (elastic c10d rendezvous) with the rank entry.
        info: the ``ddp`` object of ``--dry-run --format json``.
        instance_program: each local rank's program where it differs from the shared one
            (``--pass-local-rank``: :func:`with_local_rank`); empty otherwise.
    """

    plan: object
    instance_env: Mapping[int, Mapping[str, str]]
    environ: Mapping[str, str]
    notes: tuple[str, ...]
    engine: Optional[RankContext]
    backend: str
    elastic: bool
    info: Mapping[str, object]
    instance_program: Mapping[int, tuple[str, ...]] = field(default_factory=dict)


def _engine_bound(ctx: RankContext, topo) -> bool:
    """The engine bound this rank itself (Slurm task/affinity, mpirun -bind-to, taskset):
    our allowed set is narrower than the cgroup cpuset."""
    return ctx.engine != "torchrun" and topo.cpuset is not None and topo.allowed < topo.cpuset


def _plan_under_engine(topo, req, ddp, ctx: RankContext, notes: list):

    from cpulaunch.plan import Plan, plan

    if _engine_bound(ctx, topo):
        one = plan(topo, req._replace(instance_idx=None))
        if len(one.instances) != 1:
            raise DistributedError("internal: engine-bound rank planned as several instances")
        notes.append(f"{ctx.engine} bound this rank to CPUs {_fmt(topo.allowed)}: cpulaunch uses "
                     "exactly those (never wider)")
        inst = one.instances[0]._replace(index=ctx.local_rank)
        return Plan(instances=(inst,), num_instances=ctx.local_world_size, notes=one.notes), None
    node_plan = plan(topo, rank_request(req, ddp.nproc_per_node, topo, ctx.local_world_size,
                                           ddp.said("nproc_per_node") if ddp.nproc_per_node else "", notes))
    if len(node_plan.instances) != ctx.local_world_size:
        raise DistributedError(
            f"{ctx.engine} started {ctx.local_world_size} rank(s) on this machine, but "
            f"--nproc-per-node {ddp.nproc_per_node or 'socket'} plans {len(node_plan.instances)}; "
            "make them agree"
        )
    if not 0 <= ctx.local_rank < ctx.local_world_size:
        raise DistributedError(f"{ctx.engine}: local rank {ctx.local_rank} outside 0-{ctx.local_world_size - 1}")
    mine = node_plan.instances[ctx.local_rank]
    return node_plan._replace(instances=(mine,)), node_plan


def _fmt(ids) -> str:
    from cpulaunch import cpulist

    return cpulist.format(ids)


def _master_port(ddp, free_port: Optional[int], nnodes: int, notes: list[str]) -> int:
    """The rendezvous port of a static run: ``--master-port``; else, on one machine without
    ``--master-addr``, a port free here now (torchrun's --standalone does the same); else
    DEFAULT_MASTER_PORT. Appends a note saying which, unless the user gave it."""
    port = ddp.master_port or (free_port if nnodes == 1 and not ddp.master_addr else None)
    if port is None:
        port = DEFAULT_MASTER_PORT
        notes.append(explain(f"MASTER_PORT={port} (default): jobs sharing a machine need their own --master-port"))
    elif ddp.master_port is None:
        notes.append(explain(f"MASTER_PORT={port}: a port free on this machine when planned (pass --master-port "
                             "to fix it)"))
    return port


def plan_ranks(topo, req, ddp, environ: Mapping[str, str], *, engine: Optional[RankContext],
               backend: str, backend_note: str, free_port: Optional[int], fabric=None,
               override_env: bool = False, program: Sequence[str] = (), python: str = "") -> RankPlan:
    """Plan this machine's DDP ranks and each one's identity variables (pure).

    Args:
        topo: the machine (:class:`cpulaunch.machine.topology.Topology`).
        req: the user's :class:`cpulaunch.plan.Request` (placement modes must be unset).
        ddp: :class:`cpulaunch.options.DdpOptions`.
        environ: the user's environment.
        engine: the engine that started this process (then this process is one rank), or
            None (cpulaunch starts every local rank itself, or torchrun for elastic runs).
        backend, backend_note: the process-group backend chosen on the host, and why.
        free_port: a port free on this machine now, used for one-machine runs without
            ``--master-port`` (torchrun's --standalone does the same).
        fabric: oneCCL's libfabric found on the host (ccl only; :func:`ccl_runtime_env`).
        override_env: ``--override-env``: cpulaunch's CCL_*/FI_* values win over the user's.
        program, python: the resolved program and the interpreter cpulaunch runs under: a
            Python program (:func:`runs_python`) gets the exit hook (:func:`exit_hook_env`)
            unless ``ddp.exit_hook`` is False (``--no-exit-hook``).

    With ccl, oneCCL's workers get cores set aside on each rank's own node when they fit
    (:func:`_with_ccl_workers`) and each rank its oneCCL variables (:func:`ccl_env`).

    Raises:
        DistributedError, cpulaunch.plan.PlanError: with a one-line message.
    """

    notes = [backend_note]
    environ = dict(environ)
    ccl = partial(_ccl_for, fabric=fabric, environ=environ, override_env=override_env, notes=notes)
    if engine is not None:
        return _engine_rank(topo, req, ddp, environ, engine, backend, ccl, program, python, notes)
    node_plan = _node_plan(topo, req, ddp, backend, notes)
    nproc = len(node_plan.instances)
    if ddp.elastic:
        instance_env = _elastic_rank_envs(node_plan, ddp, backend, ccl, notes)
    else:
        instance_env = _static_rank_envs(node_plan, ddp, backend, ccl, free_port, notes)
    hook = _exit_hook(ddp, program, python, environ, notes)
    for env in instance_env.values():
        env.update(hook)
    info = {"engine": "torchrun" if ddp.elastic else "cpulaunch", "backend": backend,
            "nproc_per_node": nproc, "nnodes": ddp.nnodes, "node_rank": ddp.node_rank}
    programs = _rank_programs(ddp, program, python, sorted(instance_env), notes)
    return RankPlan(node_plan, instance_env, environ, tuple(notes), None, backend, ddp.elastic, info, programs)


def _engine_rank(topo, req, ddp, environ: dict, engine: RankContext, backend: str, ccl, program, python,
                 notes: list) -> RankPlan:
    """:func:`plan_ranks` when an engine started this process: this one rank's plan and
    variables (``environ`` may lose torchrun's default ``OMP_NUM_THREADS=1``)."""
    notes.extend(engine.notes)
    if engine.engine == "torchrun" and environ.get("OMP_NUM_THREADS") == "1" and not environ.get(envvars.USER_OMP_NUM_THREADS):
        environ.pop("OMP_NUM_THREADS")
        notes.append(explain("OMP_NUM_THREADS=1 taken as torchrun's default and replaced by this rank's core count"))
    rank_plan, node_plan = _with_ccl_workers(lambda r: _plan_under_engine(topo, r, ddp, engine, notes),
                                             req, ddp, backend, notes)
    if node_plan is not None:
        notes.extend(node_plan.notes)
    env = _engine_rank_env(engine, ddp, backend, notes)
    if backend == "ccl":
        env.update(ccl(engine, (node_plan or rank_plan).instances, bound=node_plan is None))
    env.update(_exit_hook(ddp, program, python, environ, notes))
    info = {"engine": engine.engine, "backend": backend, "rank": engine.rank, "world_size": engine.world_size}
    inst = rank_plan.instances[0]
    programs = _rank_programs(ddp, program, python, [inst.index], notes)
    return RankPlan(rank_plan, {inst.index: env}, environ, tuple(notes), engine, backend, False, info, programs)


def _node_plan(topo, req, ddp, backend: str, notes: list):
    """This machine's ranks, planned as ``--nproc-per-node`` asks (with oneCCL's worker
    cores where they fit); the notes of the request planned last are kept."""
    from cpulaunch.plan import plan

    count_notes: list = []

    def node_request(r):
        count_notes[:] = []  # the notes of the request planned last (_with_ccl_workers may try two)
        return rank_request(r, ddp.nproc_per_node, topo, said=(
            ddp.said("nproc_per_node") if ddp.nproc_per_node else ""), notes=count_notes)

    node_plan = _with_ccl_workers(lambda r: plan(topo, node_request(r)), req, ddp, backend, notes)
    notes.extend(count_notes)
    notes.extend(node_plan.notes)
    return node_plan


def _elastic_rank_envs(node_plan, ddp, backend: str, ccl, notes: list) -> dict:
    """Each local rank's variables under an elastic rendezvous (torchrun's agent adds the
    rest after it)."""
    nproc, out = len(node_plan.instances), {}
    for inst in node_plan.instances:
        ctx = RankContext("torchrun", -1, -1, inst.index, nproc)
        env = {"LOCAL_RANK": str(inst.index), "LOCAL_WORLD_SIZE": str(nproc), envvars.DIST_BACKEND: backend}
        env.update(iface_env(ddp.iface))
        if backend == "ccl":
            env.update(ccl(ctx, node_plan.instances))
        out[inst.index] = env
    notes.append(explain("elastic rendezvous: torchrun's agent assigns RANK, WORLD_SIZE, GROUP_RANK, ROLE_*, "
                         "TORCHELASTIC_* and MASTER_* after it; the rank entry adds NODE_RANK=GROUP_RANK"))
    return out


def _static_rank_envs(node_plan, ddp, backend: str, ccl, free_port: Optional[int], notes: list) -> dict:
    """Each local rank's variables under a static rendezvous (cpulaunch numbers the ranks:
    node rank x ranks per node + local rank)."""
    nproc, nnodes, out = len(node_plan.instances), int(ddp.nnodes), {}
    addr = ddp.master_addr or LOCAL_MASTER_ADDR
    port = _master_port(ddp, free_port, nnodes, notes)
    for inst in node_plan.instances:
        ctx = RankContext("cpulaunch", ddp.node_rank * nproc + inst.index, nnodes * nproc, inst.index, nproc,
                          node_rank=ddp.node_rank, nnodes=nnodes)
        env = rank_env(ctx, addr, port, backend)
        env.update(iface_env(ddp.iface))
        if backend == "ccl":
            env.update(ccl(ctx, node_plan.instances))
        out[inst.index] = env
    return out


def _rank_programs(ddp, program: Sequence[str], python: str, local_ranks: Sequence[int],
                   notes: list) -> dict[int, tuple[str, ...]]:
    """{local rank: its program} under ``--pass-local-rank`` (:func:`with_local_rank`), with a
    note saying so; {} without it (every rank runs the shared program)."""
    if not ddp.pass_local_rank:
        return {}
    notes.append(explain("--pass-local-rank: each rank's program also gets --local_rank=<its local rank> after "
                         "its script, as torch.distributed.launch passed it (LOCAL_RANK is set as well)"))
    return {r: with_local_rank(program, python, r) for r in local_ranks}


def _exit_hook(ddp, program: Sequence[str], python: str, environ: Mapping[str, str], notes: list) -> dict:
    """The rank's PYTHONPATH with the exit hook, or {} (turned off, or not a Python program:
    then a note says so, since its ranks may abort at exit)."""
    if not ddp.exit_hook and not ddp.failure_record:
        return {}
    if not runs_python(program, python):
        if program and ddp.exit_hook:
            notes.append(f"no exit hook for {program[0]!r} (not a Python interpreter): if its ranks never call "
                         "destroy_process_group(), they may abort at exit; end each rank's program with "
                         "torch.distributed.destroy_process_group()")
        return {}
    dropped = [e for e in environ.get("PYTHONPATH", "").split(os.pathsep) if is_hook_folder(e)]
    others = [e for e in dropped if os.path.normpath(e) != site_hook_dir()]
    dropped_note = f"; other cpulaunch hook folders dropped from it: {', '.join(others)}" if others else ""
    if ddp.exit_hook:
        notes.append(explain(f"exit hook installed: each rank's Python ends its default process group at exit "
                             f"(sitecustomize in {site_hook_dir()}, first on PYTHONPATH" + dropped_note
                             + "); --no-exit-hook turns it off"))
    env = exit_hook_env(environ)
    if not (ddp.exit_hook and ddp.failure_record):
        env[envvars.SITE_HOOKS] = "exit" if ddp.exit_hook else "record"
    return env


def _engine_rank_env(ctx: RankContext, ddp, backend: str, notes: list) -> dict:
    addr = ddp.master_addr or ctx.master_addr
    if not addr:
        if ctx.local_world_size == ctx.world_size:
            addr = LOCAL_MASTER_ADDR
        else:
            raise DistributedError(
                f"{ctx.engine}: cannot tell rank 0's host; pass --master-addr HOST or "
                f"{mpi_env_hint(ctx.engine, 'MASTER_ADDR', 'HOST')}"
            )
    port = ddp.master_port or ctx.master_port
    if port is None:
        port = DEFAULT_MASTER_PORT
        notes.append(explain(f"MASTER_PORT={port} (default): jobs sharing a machine need their own "
                             "--master-port or MASTER_PORT"))
    env = rank_env(ctx, addr, port, backend)
    env.update(iface_env(ddp.iface))
    return env


def _worker_cpus(inst) -> tuple:
    """The logical CPUs of a planned rank's oneCCL workers: the cores set aside for them,
    else the rank's first CPU (its worker shares it)."""
    return tuple(inst.ccl_cpus) or tuple(sorted(inst.cpus))[:1]


def _ccl_for(ctx: RankContext, instances, *, bound: bool = False, fabric, environ: Mapping[str, str],
             override_env: bool, notes: list) -> dict:
    """The oneCCL variables rank ``ctx`` gets (:func:`ccl_env`, then the user's values win:
    :func:`ccl_precedence`).

    Args:
        instances: this machine's planned ranks in local-rank order; with ``bound`` (the
            engine bound each rank itself, so a rank cannot know its neighbours' CPUs) this
            rank's own instance alone, whose worker CPUs are then listed once per local
            rank: each rank reads its own slice (measured: docs/guide/ddp.md), never ``auto``.
    """
    if bound:
        workers = [_worker_cpus(instances[0])] * ctx.local_world_size
        _note(notes, explain(f"CCL_WORKER_AFFINITY: {ctx.engine} bound each rank itself, so each rank lists its "
                             "own worker CPU(s) once per local rank (oneCCL takes its local rank's slice)"))
    else:
        workers = [_worker_cpus(i) for i in instances]
    dedicated = all(i.ccl_cpus for i in instances)
    planned = ccl_env(ctx, workers, dedicated=dedicated, runtime=ccl_runtime_env(fabric))
    env, kept = ccl_precedence(planned, environ, override_env)
    for note in kept:
        _note(notes, note)
    changed = ccl_changed(env)
    if changed:
        _note(notes, explain(f"oneCCL's rank 0 logs '|CCL_WARN| value of ... changed to be ...' once for each of "
                             f"{', '.join(changed)} (set away from oneCCL's defaults by this plan or by the bindings): "
                             "expected; a relayed console leaves out those naming the planned value (the ranks' logs "
                             "keep them)"))
    return env


def _note(notes: list, note: str) -> None:
    if note not in notes:
        notes.append(note)


def _with_ccl_workers(make, req, ddp, backend: str, notes: list):
    """``make(request)`` (a plan) with cores set aside for oneCCL's workers, issue 21's rule:

    - gloo: none;
    - ``--ccl-worker-count K`` (K >= 1): K cores of each rank, the last of its own node;
      when they do not fit (a rank would keep no core for its OpenMP threads), an error
      under ``--backend ccl``, and none under ``--backend auto`` (with a note: reserving
      must never make a run fail that gloo would run);
    - not given: 1 core per rank when it fits, else none (with a note);
    - ``--ccl-worker-count 0``: none.

    With none, each rank's worker shares the rank's first CPU and yields (:func:`ccl_env`).

    Raises:
        cpulaunch.plan.PlanError: the plan fails without workers too, or K was asked for
            under ``--backend ccl`` and does not fit.
    """
    from cpulaunch.plan import PlanError

    if backend != "ccl":
        return make(req._replace(ccl_workers=0))
    asked = ddp.ccl_worker_count
    shared = "each rank's oneCCL worker runs on the rank's first CPU and yields (CCL_YIELD=sched_yield)"
    if asked == 0:
        notes.append(explain(f"{ddp.said('ccl_worker_count')}: no core set aside; {shared}"))
        return make(req._replace(ccl_workers=0))
    said = ddp.said("ccl_worker_count")
    words = req.words.given_as("ccl_workers", Spelling("derived", said.split(" ")[0] if said.startswith("-") else said, said)
                               if asked else Spelling("derived", "--ccl-worker-count",
                                                      "a core for oneCCL's worker (the default)"))
    try:
        return make(req._replace(ccl_workers=asked or 1, words=words))
    except PlanError:
        if asked is not None and ddp.backend == "ccl":
            raise
    result = make(req._replace(ccl_workers=0))
    what = f"{ddp.said('ccl_worker_count')} (--backend auto)" if asked else "a core for oneCCL's worker (the default)"
    note = f"{what} would leave a rank no core for its OpenMP threads, so no core is set aside; {shared}"
    notes.append(note if asked else explain(note))
    return result


def __getattr__(name: str):
    """The documented runtime names (``cpulaunch.distributed.init_process_group``,
    ``wrap_ddp``) live in :mod:`cpulaunch.runtime.ddp`, ``convert_sync_batchnorm`` and
    ``SyncBatchNorm`` in :mod:`cpulaunch.runtime.syncbn`; loaded on first use, so the
    launcher, which imports this module, never imports the runtime (nor torch)."""
    if name in ("init_process_group", "wrap_ddp"):
        from cpulaunch.runtime import ddp

        return getattr(ddp, name)
    if name in ("convert_sync_batchnorm", "SyncBatchNorm"):
        from cpulaunch.runtime import syncbn

        return getattr(syncbn, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
