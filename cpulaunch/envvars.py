"""Every ``CPULAUNCH_*`` variable the launcher writes into an instance's environment, and that
the program (``cpulaunch.runtime``), ``cpulaunch verify`` and ``cpulaunch tune`` read: the one
place their names are spelled, as data (:data:`VARIABLES`: each name with when it is written,
its value and who reads it), from which the environment reference of the docs is made
(:func:`reference_markdown`; ``python scripts/options_doc.py`` writes it,
``tests/test_docs_site.py`` holds the docs to it). (The option variables,
``CPULAUNCH_<OPTION>``, are the option table's: :mod:`cpulaunch.option_table`.) Constants
only: importing this module does nothing but build them.
"""

from __future__ import annotations
from cpulaunch.records import TYPE_CHECKING, Record


__all__ = [
    "CPUS", "INSTANCE_INDEX", "NUM_INSTANCES", "DATALOADER_CPUS", "DATALOADER_WORKERS",
    "RESERVED_CPUS", "BOUND_CPUS", "MEM_POLICY", "MEM_NODES", "INFERENCE_PATH", "DIST_BACKEND",
    "USER_OMP_NUM_THREADS", "RECIPE", "RANK_SPECS", "DDP_STATUS_DIR", "PREFIX", "CCL_WORKER_CPUS", "BINDING_FILE",
    "Variable", "VARIABLES", "GROUPS", "reference_markdown",
    "FAILURE_FD", "SITE_HOOKS",
]


class Variable(Record):
    """One variable of the instances' protocol.

    Attributes:
        name: its name, ``CPULAUNCH_CPUS``.
        group: when it is written, a key of :data:`GROUPS` ("every": into every instance;
            "option": with an option; "read": read, never written; "plumbing": between
            cpulaunch's own processes, never the program's).
        value: what it holds (markdown, for the reference).
        read_by: who reads it (markdown).
        when: the option or case that writes it ("option" and "plumbing" groups).
    """

    name: str
    group: str
    value: str
    read_by: str = ""
    when: str = ""


#: The reference's sections: group -> its heading.
GROUPS = {"every": "Written into every instance", "option": "Written with an option",
          "read": "Read, never written", "plumbing": "Plumbing: never reaches your program"}

_VARIABLES: list = []


def _variable(name: str, group: str, value: str, read_by: str = "", when: str = "") -> str:
    _VARIABLES.append(Variable(name, group, value, read_by, when))
    return name


#: The instance's index (or the rank's local index) and the number of instances.
INSTANCE_INDEX = _variable(
    "CPULAUNCH_INSTANCE_INDEX", "every",
    "the instance's index among all planned instances (a DDP rank's local rank)",
    "your program (to choose a port, a log file, a shard)")
NUM_INSTANCES = _variable(
    "CPULAUNCH_NUM_INSTANCES", "every",
    "how many instances were planned (also those `--instance-idx` leaves out)", "your program")
#: The instance's logical CPUs, a cpulist ("0-3,8"); written by render for every instance.
CPUS = _variable(
    "CPULAUNCH_CPUS", "every",
    "the logical CPUs its OpenMP threads compute on, a cpulist (`0-7,16-23`)", "your program; `cpulaunch verify`")
#: What ``cpulaunch verify PID`` compares a running process with when no plan is at hand,
#: written by render for every instance: the logical CPUs it is bound to (a cpulist), the
#: memory policy the launch applied ("bind", "interleave", "preferred", "local", "none")
#: and its NUMA nodes (a cpulist of node ids; absent when the policy is "none"). The
#: policy's name is not CPULAUNCH_MEM_POLICY: that is --mem-policy's option variable, and
#: a cpulaunch started inside an instance would take it as its own --mem-policy.
BOUND_CPUS = _variable(
    "CPULAUNCH_BOUND_CPUS", "every",
    "every CPU the instance is bound to: `CPULAUNCH_CPUS` plus the CPUs set aside for helpers", "`cpulaunch verify`")
MEM_POLICY = _variable(
    "CPULAUNCH_PLANNED_MEM_POLICY", "every",
    "the memory policy the launch applies: `bind`, `preferred`, `interleave`, `local` or `none`", "`cpulaunch verify`")
MEM_NODES = _variable(
    "CPULAUNCH_MEM_NODES", "every",
    "the NUMA node ids of that policy, a cpulist; absent when the policy is `none`", "`cpulaunch verify`")
#: The environment recipe applied (``amd-zen``, ``arm-neoverse``, ``generic``:
#: :mod:`cpulaunch.machine.recipes`), written by render for every instance; not
#: CPULAUNCH_RECIPE, which is --recipe's option variable.
RECIPE = _variable(
    "CPULAUNCH_PLANNED_RECIPE", "every",
    "the environment recipe applied (`amd-zen`, `arm-neoverse`, `generic`; `--recipe` chooses)",
    "you (what `--dry-run` and a run applied); nothing in cpulaunch")
#: --dataloader-workers: the CPUs set aside for DataLoader workers and how many workers;
#: read by ``cpulaunch.torch_utils.dataloader_kwargs``.
DATALOADER_WORKERS = _variable(
    "CPULAUNCH_DATALOADER_NUM_WORKERS", "option", "K, the number of DataLoader workers to start",
    "`cpulaunch.dataloader_kwargs()`", "`--dataloader-workers K`")
DATALOADER_CPUS = _variable(
    "CPULAUNCH_DATALOADER_CPUS", "option",
    "the CPUs set aside for them (K cores, with their SMT siblings under `--use-logical-cores`)",
    "`dataloader_kwargs()`'s `worker_init_fn`", "`--dataloader-workers K`")
#: --reserve-cores: the CPUs set aside for the program's own helper threads.
RESERVED_CPUS = _variable(
    "CPULAUNCH_RESERVED_CPUS", "option", "the CPUs set aside for your program's own non-OpenMP threads",
    "your program", "`--reserve-cores K`")
#: --inference-path, read by ``cpulaunch.inference.optimize``.
INFERENCE_PATH = _variable(
    "CPULAUNCH_PLANNED_INFERENCE_PATH", "option", "the path `--inference-path` gave (its choices: [the options](options.md))", "`cpulaunch.optimize(path=None)`", "`--inference-path P`")
#: --ddp: the process-group backend cpulaunch chose, read by
#: ``cpulaunch.distributed.init_process_group``.
DIST_BACKEND = _variable(
    "CPULAUNCH_DIST_BACKEND", "option", "`gloo` or `ccl`, the backend cpulaunch chose",
    "`cpulaunch.init_process_group()`", "`--ddp`")
#: --ddp with ccl: the logical CPUs this rank's oneCCL workers are pinned to (a cpulist, in
#: CCL_WORKER_AFFINITY's order), read by ``cpulaunch verify``; absent when the user's own
#: CCL_WORKER_AFFINITY/CCL_WORKER_COUNT decide.
CCL_WORKER_CPUS = _variable(
    "CPULAUNCH_CCL_WORKER_CPUS", "option", "the CPUs of this rank's oneCCL workers", "`cpulaunch verify`",
    "`--ddp` on the ccl backend, unless your own `CCL_WORKER_AFFINITY`/`CCL_WORKER_COUNT` decide")
#: --print-env: the binding command to put in front of the program in a shell script.
PREFIX = _variable(
    "CPULAUNCH_PREFIX", "option",
    "the binding command to put in front of the program (`/usr/bin/numactl -C 1 -m 0`, or `/usr/bin/taskset -c 1` "
    "with `--bind affinity`; empty with `--bind none`); the shell form also defines the function `cpulaunch_run`, "
    "the same without word splitting", "your shell script ([shell scripts](../guide/shell-scripts.md))",
    "`--print-env` only")
#: --follow-cpuset: the file where the launcher keeps every instance's binding now (JSON:
#: ``{"allowed", "changed", "instances": {index: {"label", "cpus", "bound_cpus"}}}``),
#: rewritten whole at each re-pin; read by ``cpulaunch verify``. Given to each instance
#: when the run starts (a private folder made then, removed at the end), so --dry-run
#: does not show it.
BINDING_FILE = _variable(
    "CPULAUNCH_BINDING_FILE", "option",
    "the file (JSON) where the launcher keeps every instance's binding now, rewritten at each re-pin; given when the "
    "run starts, so `--dry-run` does not show it", "`cpulaunch verify`", "`--follow-cpuset`")
#: --ddp: the user's own OMP_NUM_THREADS, kept when cpulaunch sets the rank's.
USER_OMP_NUM_THREADS = _variable(
    "CPULAUNCH_USER_OMP_NUM_THREADS", "read",
    "Under your own torchrun, `OMP_NUM_THREADS=1` is torchrun's default, and `cpulaunch --ddp` replaces it by the "
    "rank's core count (a note says so). Set this variable (to any non-empty value) when the 1 is your own choice, "
    "and cpulaunch keeps it.")
#: Elastic --ddp plumbing (never reaches the program): every local rank's command as JSON,
#: and the folder where each rank entry records its exit code.
RANK_SPECS = _variable(
    "CPULAUNCH_RANK_SPECS", "plumbing", "every local rank's command, as JSON",
    "the rank entry (`python -m cpulaunch.rank_entry`), which removes it before it starts the rank",
    "an elastic `--ddp` run")
DDP_STATUS_DIR = _variable(
    "CPULAUNCH_DDP_STATUS_DIR", "plumbing", "the folder where each rank records its exit code",
    "the rank entry, which removes it before it starts the rank", "an elastic `--ddp` run")

#: The pipe a supervised instance's Python writes its first failure to (``FD:DEV:INODE``;
#: :mod:`cpulaunch.runtime.failrec`), given by the launcher at spawn (one pipe per instance).
FAILURE_FD = _variable(
    "CPULAUNCH_FAILURE_FD", "plumbing",
    "the pipe (`FD:DEV:INODE`) the instance's Python writes its first failure to, one per instance; given when "
    "the instance starts, so `--dry-run` does not show it",
    "the site hook's failure recorder (`cpulaunch.runtime.failrec`), which writes only to that very pipe",
    "a supervised run (several instances, `--ddp`, `--log-dir`)")
#: Which parts of the site hook a rank's Python installs: ``exit`` and/or ``record``,
#: comma-separated; written by the plan only when one is turned off (absent: both).
SITE_HOOKS = _variable(
    "CPULAUNCH_SITE_HOOKS", "option",
    "which parts of cpulaunch's site hook the instance's Python installs: `exit` (end the process group at exit) "
    "or `record` (record the first failure); absent: both",
    "the site hook (`sitecustomize` in cpulaunch's hook folder)", "`--no-exit-hook` or `--no-failure-record`")

#: Every variable of the instances' protocol, in the reference's order within each group.
VARIABLES: tuple = tuple(_VARIABLES)
del _VARIABLES


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def reference_markdown() -> str:
    """The environment reference's tables (docs/reference/environment.md, between its
    markers), one section per group of :data:`GROUPS`, made from :data:`VARIABLES`."""
    out = []
    for group, heading in GROUPS.items():
        rows = [v for v in VARIABLES if v.group == group]
        out.append(f"## {heading}\n")
        if group == "every":
            out.append("| variable | value | read by |\n|---|---|---|")
            out += [f"| `{v.name}` | {_cell(v.value)} | {_cell(v.read_by)} |" for v in rows]
        elif group == "read":
            out.append("| variable | meaning |\n|---|---|")
            out += [f"| `{v.name}` | {_cell(v.value)} |" for v in rows]
        else:
            out.append("| variable | when | value | read by |\n|---|---|---|---|")
            out += [f"| `{v.name}` | {_cell(v.when)} | {_cell(v.value)} | {_cell(v.read_by)} |" for v in rows]
        out.append("")
    return "\n".join(out)
