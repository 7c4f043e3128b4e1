"""The PyTorch training article's DDP program, with only the edits a CPU needs.

The article starts it with ``python -m torch.distributed.launch --nproc_per_node=4 main.py``
on a machine with 4 GPUs. Here it runs on CPU cores::

    cpulaunch --ddp --nproc-per-node 2 --pass-local-rank python examples/article_ddp.py
    cpulaunch --ddp --nproc-per-node 2 --pass-local-rank python examples/article_ddp.py --amp

Every line that differs from the GPU program carries a ``# CPU:`` comment saying what it was
and why it changed; docs/guide/training.md ("From the article's GPU program to CPU") walks through
them. Everything else is the article's: ``--local_rank`` from the command line used as the
rank, ``convert_sync_batchnorm``, DDP, a ``DistributedSampler`` with ``set_epoch``, and an
AMP step. The program, like the article's, is for one machine: it takes its rank from
``--local_rank``, which is the global rank only when all ranks share one machine (on several
machines use ``RANK``, which every launcher sets).

Data: a fixed synthetic image set (the same on every rank, seeded), split between ranks by
the sampler. At the end each rank prints one JSON line (not in the article; the test reads
it): its rank as the process group sees it, ``--local_rank``, the world size, a sha256 of
its parameters and its losses.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

# cpulaunch from this checkout when it is not installed (an installed one comes first).
sys.path.append(str(Path(__file__).resolve().parents[1]))
from cpulaunch.distributed import convert_sync_batchnorm  # noqa: E402  CPU: torch's needs GPU modules
from cpulaunch.errors import CpulaunchError  # noqa: E402
from cpulaunch.runtime.amp import cpu_autocast  # noqa: E402  CPU: autocast's CPU form

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=8, help="samples per rank per step")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--amp", action="store_true", help="mixed precision (CPU: bf16 autocast)")
parser.add_argument("--bf16", action="store_true", help="CPU: force bf16 autocast where --amp refuses")


class Net(nn.Module):
    """A small CNN with BatchNorm, the kind the article trains."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


def dataset(n: int = 64, side: int = 16, num_classes: int = 10) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(n, 3, side, side, generator=gen)
    labels = torch.randint(0, num_classes, (n,), generator=gen)
    return TensorDataset(images, labels)


def main() -> int:
    args = parser.parse_args()
    try:  # CPU: the article's autocast() is CUDA's; bf16 autocast, refused where it is emulated
        autocast = cpu_autocast(args.amp) if not args.bf16 else torch.autocast("cpu", dtype=torch.bfloat16)
    except CpulaunchError as exc:
        print(f"article_ddp.py: {exc}", file=sys.stderr)
        return 2
    # CPU: no torch.cuda.set_device(args.local_rank); backend 'nccl' -> 'gloo'
    dist.init_process_group(backend="gloo", init_method="env://", rank=args.local_rank)
    torch.manual_seed(0)
    device = torch.device("cpu")  # CPU: was torch.device("cuda", args.local_rank)
    model = Net().to(device)
    model = convert_sync_batchnorm(model)  # CPU: was nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DDP(model)  # CPU: no device_ids=[args.local_rank], output_device=args.local_rank
    data = dataset()
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)  # CPU: no pin_memory=True
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # CPU: no GradScaler: bf16 keeps fp32's exponent range, so gradients need no loss scaling
    losses = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            with autocast:
                loss = criterion(model(images), labels)
            loss.backward()  # CPU: was scaler.scale(loss).backward()
            optimizer.step()  # CPU: was scaler.step(optimizer); scaler.update()
            losses.append(round(loss.item(), 6))
    digest = hashlib.sha256()
    for name, tensor in sorted(model.module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    print(json.dumps({"rank": dist.get_rank(), "local_rank": args.local_rank, "world_size": dist.get_world_size(),
                      "autocast": "bfloat16" if isinstance(autocast, torch.autocast) else None,
                      "params_sha256": digest.hexdigest(), "losses": losses}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
