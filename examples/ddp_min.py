"""The smallest CPU DDP program: cpulaunch --ddp --nproc-per-node 2 python examples/ddp_min.py"""
import os

import torch
from cpulaunch import init_process_group, wrap_ddp

init_process_group()                                  # env:// rendezvous on the backend cpulaunch chose
rank = torch.distributed.get_rank()
torch.manual_seed(rank)                               # each rank its own data
model = wrap_ddp(torch.nn.Linear(16, 1))              # DistributedDataParallel with CPU defaults
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(50):
    x = torch.randn(32, 16)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()      # backward() averages the gradients over the ranks
print(f"rank {rank}: CPUs {sorted(os.sched_getaffinity(0))}, {torch.get_num_threads()} thread(s), loss {loss.item():.4f}")
torch.distributed.destroy_process_group()
