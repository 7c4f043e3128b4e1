"""Print, as one JSON line, what a rank started by an engine (srun, mpirun) sees.

Used by tests/test_engines.py, with and without ``cpulaunch --ddp`` in front. Standard
library only (no torch), so it starts in milliseconds.

Arguments ``RANK=CODE`` (any number): the rank whose SLURM_PROCID / PMI_RANK / RANK is
RANK exits with CODE after printing; a negative CODE kills it with signal -CODE instead
(``1=3``: rank 1 exits 3; ``0=3 1=4``; ``1=-9``: rank 1 dies of SIGKILL). Other ranks exit 0.

Output keys: ``tag`` ("probe_rank"), ``env`` (the rank variables that are set),
``affinity`` (sorted logical CPU ids of os.sched_getaffinity(0)), ``pid``, ``hostname``.
"""

import json
import os
import socket
import sys

RANK_VARS = (
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_JOB_NODELIST",
    "SLURM_NODELIST", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_CPUS_ON_NODE",
    "SLURM_TASKS_PER_NODE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "OMP_NUM_THREADS",
)


def main(argv):
    env = {k: os.environ[k] for k in RANK_VARS if k in os.environ}
    print(json.dumps({"tag": "probe_rank", "env": env,
                      "affinity": sorted(os.sched_getaffinity(0)),
                      "pid": os.getpid(), "hostname": socket.gethostname()}), flush=True)
    rank = os.environ.get("SLURM_PROCID", os.environ.get("PMI_RANK", os.environ.get("RANK")))
    codes = dict(arg.split("=", 1) for arg in argv[1:])
    code = int(codes.get(rank, 0))
    if code < 0:
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
