"""Every ``CPULAUNCH_*`` variable the launcher writes into an instance's environment, and that
the program (``cpulaunch.runtime``), ``cpulaunch verify`` and ``cpulaunch tune`` read: the one
place their names are spelled. (The option variables, ``CPULAUNCH_<OPTION>``, are the CLI's:
:mod:`cpulaunch.cli`.) Constants only: importing this module does nothing.
"""

__all__ = [
    "CPUS", "INSTANCE_INDEX", "NUM_INSTANCES", "DATALOADER_CPUS", "DATALOADER_WORKERS",
    "RESERVED_CPUS", "BOUND_CPUS", "MEM_POLICY", "MEM_NODES", "INFERENCE_PATH", "DIST_BACKEND",
    "USER_OMP_NUM_THREADS", "RECIPE", "RANK_SPECS", "DDP_STATUS_DIR", "PREFIX", "CCL_WORKER_CPUS", "BINDING_FILE",
    "FAILURE_FD", "SITE_HOOKS",
]

#: The instance's logical CPUs, a cpulist ("0-3,8"); written by render for every instance.
CPUS = "CPULAUNCH_CPUS"
#: The instance's index (or the rank's local index) and the number of instances.
INSTANCE_INDEX = "CPULAUNCH_INSTANCE_INDEX"
NUM_INSTANCES = "CPULAUNCH_NUM_INSTANCES"
#: --dataloader-workers: the CPUs set aside for DataLoader workers and how many workers;
#: read by ``cpulaunch.torch_utils.dataloader_kwargs``.
DATALOADER_CPUS = "CPULAUNCH_DATALOADER_CPUS"
DATALOADER_WORKERS = "CPULAUNCH_DATALOADER_NUM_WORKERS"
#: --reserve-cores: the CPUs set aside for the program's own helper threads.
RESERVED_CPUS = "CPULAUNCH_RESERVED_CPUS"
#: What ``cpulaunch verify PID`` compares a running process with when no plan is at hand,
#: written by render for every instance: the logical CPUs it is bound to (a cpulist), the
#: memory policy the launch applied ("bind", "interleave", "preferred", "local", "none")
#: and its NUMA nodes (a cpulist of node ids; absent when the policy is "none"). The
#: policy's name is not CPULAUNCH_MEM_POLICY: that is --mem-policy's option variable, and
#: a cpulaunch started inside an instance would take it as its own --mem-policy.
BOUND_CPUS = "CPULAUNCH_BOUND_CPUS"
MEM_POLICY = "CPULAUNCH_PLANNED_MEM_POLICY"
MEM_NODES = "CPULAUNCH_MEM_NODES"
#: --inference-path, read by ``cpulaunch.inference.optimize``.
INFERENCE_PATH = "CPULAUNCH_PLANNED_INFERENCE_PATH"
#: The environment recipe applied (``amd-zen``, ``arm-neoverse``, ``generic``:
#: :mod:`cpulaunch.machine.recipes`), written by render for every instance; not
#: CPULAUNCH_RECIPE, which is --recipe's option variable.
RECIPE = "CPULAUNCH_PLANNED_RECIPE"
#: --ddp: the process-group backend cpulaunch chose, read by
#: ``cpulaunch.distributed.init_process_group``.
DIST_BACKEND = "CPULAUNCH_DIST_BACKEND"
#: --ddp with ccl: the logical CPUs this rank's oneCCL workers are pinned to (a cpulist, in
#: CCL_WORKER_AFFINITY's order), read by ``cpulaunch verify``; absent when the user's own
#: CCL_WORKER_AFFINITY/CCL_WORKER_COUNT decide.
CCL_WORKER_CPUS = "CPULAUNCH_CCL_WORKER_CPUS"
#: --ddp: the user's own OMP_NUM_THREADS, kept when cpulaunch sets the rank's.
USER_OMP_NUM_THREADS = "CPULAUNCH_USER_OMP_NUM_THREADS"
#: Elastic --ddp plumbing (never reaches the program): every local rank's command as JSON,
#: and the folder where each rank entry records its exit code.
RANK_SPECS = "CPULAUNCH_RANK_SPECS"
DDP_STATUS_DIR = "CPULAUNCH_DDP_STATUS_DIR"
#: --print-env: the binding command to put in front of the program in a shell script.
PREFIX = "CPULAUNCH_PREFIX"
#: --follow-cpuset: the file where the launcher keeps every instance's binding now (JSON:
#: ``{"allowed", "changed", "instances": {index: {"label", "cpus", "bound_cpus"}}}``),
#: rewritten whole at each re-pin; read by ``cpulaunch verify``. Given to each instance
#: when the run starts (a private folder made then, removed at the end), so --dry-run
#: does not show it.
BINDING_FILE = "CPULAUNCH_BINDING_FILE"
#: The pipe a supervised instance's Python writes its first failure to (``FD:DEV:INODE``;
#: :mod:`cpulaunch.runtime.failrec`), given by the launcher at spawn (one pipe per instance),
#: so --dry-run does not show it. Read by the site hook's recorder only.
FAILURE_FD = "CPULAUNCH_FAILURE_FD"
#: Which parts of the site hook a rank's Python installs: ``exit`` and/or ``record``,
#: comma-separated; written by the plan only when one is turned off (absent: both).
SITE_HOOKS = "CPULAUNCH_SITE_HOOKS"
