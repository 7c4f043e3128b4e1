"""A tiny DDP training run for a live guest: ``cpulaunch --ddp --backend gloo python3
live_ddp.py`` (one rank per socket). Each rank prints one JSON line:

- ``rank``, ``world_size``, ``local_rank`` (from torch.distributed and LOCAL_RANK);
- ``allreduce``: all_reduce(rank + 1), which must be the sum over ranks (3.0 for 2);
- ``affinity``, ``mems_allowed``, ``cpu``: where the rank may and did run;
- ``omp``, ``threads``: OMP_NUM_THREADS and torch.get_num_threads();
- ``params_equal``: after 3 SGD steps of nn.Linear(8, 2) on different data per rank, every
  rank's parameters equal rank 0's (all_gather); ``params_moved``: training changed them.

torch is imported here only: about a minute per process under emulation.
"""

import json
import os
import sys


def main():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    torch.manual_seed(0)  # the same initial parameters on every rank
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    start = torch.cat([p.detach().clone().flatten() for p in model.parameters()])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(100 + rank)  # different batches per rank
    for _ in range(3):
        x, y = torch.randn(16, 8, generator=data), torch.randn(16, 2, generator=data)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    every = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)
    dist.destroy_process_group()
    with open("/proc/self/status") as f:
        mems = [line.split(":", 1)[1].strip() for line in f if line.startswith("Mems_allowed_list:")]
    with open("/proc/self/stat") as f:
        cpu = int(f.read().rsplit(")", 1)[1].split()[36])
    print(json.dumps({
        "tag": "live_ddp", "rank": rank, "world_size": world,
        "local_rank": os.environ.get("LOCAL_RANK"), "allreduce": total.item(),
        "affinity": sorted(os.sched_getaffinity(0)), "mems_allowed": mems[0] if mems else None,
        "cpu": cpu, "omp": os.environ.get("OMP_NUM_THREADS"), "threads": torch.get_num_threads(),
        "params_equal": all(torch.equal(every[0], t) for t in every),
        "params_moved": not torch.equal(start, flat),
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
