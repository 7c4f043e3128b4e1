"""A two-line DDP program: init the process group, all_reduce (rank + 1), print JSON.

Run by tests/test_engines.py as ``srun|mpirun -n 2 cpulaunch --ddp python ddp_allreduce.py``.
The launcher must have set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT. Prints one JSON line per rank (tag "ddp_allreduce") with those values, the
all_reduce result (sum over ranks of rank + 1: 3 for two ranks), the backend, the CPU
affinity (sorted logical CPU ids), torch's intra-op thread count and the network-interface
variables (GLOO_SOCKET_IFNAME, CCL_KVS_IFACE, FI_TCP_IFACE).

``--exit-code N --exit-rank R``: after the collective, rank R (default: every rank) exits
with N, so tests see how the engine propagates a failing rank without a hung rendezvous.
"""

import argparse
import datetime
import json
import os
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--exit-rank", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds for the rendezvous and the collective")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    from cpulaunch.distributed import init_process_group

    backend = init_process_group(timeout=datetime.timedelta(seconds=args.timeout))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    dist.barrier()
    dist.destroy_process_group()
    env = os.environ
    print(json.dumps({
        "tag": "ddp_allreduce",
        "rank": rank,
        "world_size": world_size,
        "env_rank": env.get("RANK"),
        "env_world_size": env.get("WORLD_SIZE"),
        "local_rank": env.get("LOCAL_RANK"),
        "local_world_size": env.get("LOCAL_WORLD_SIZE"),
        "master_addr": env.get("MASTER_ADDR"),
        "master_port": env.get("MASTER_PORT"),
        "allreduce": value.item(),
        "backend": backend,
        "affinity": sorted(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": env.get("OMP_NUM_THREADS"),
        "iface": {k: env.get(k) for k in ("GLOO_SOCKET_IFNAME", "CCL_KVS_IFACE", "FI_TCP_IFACE")},
    }), flush=True)
    if args.exit_code and (args.exit_rank is None or args.exit_rank == rank):
        return args.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
