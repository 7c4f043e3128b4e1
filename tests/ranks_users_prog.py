"""The training programs users bring, as small as they come: Lightning and accelerate ranks.

Run by tests/test_ranks_users.py and scripts/exit_abort_rate.py under ``cpulaunch --ddp``
(never collected by pytest: the name does not start with ``test_``). Each rank prints one
JSON line (tag "ranks_users") with the framework's view of its place in the job and the
variables the launcher gave it, after an all-reduce over every rank has gone through.

``lightning``: ``Trainer(num_nodes=N, devices=D, strategy=..., accelerator="cpu")`` fits a
linear model for ``--steps`` steps on random data. Lightning's DDP strategy never calls
``destroy_process_group()``, so the process ends with gloo's process group alive (the
exit-time abort of issue 24 item 8). ``--strategy post-local-sgd`` is Lightning's
post-local SGD recipe (``DDPStrategy(ddp_comm_state=PostLocalSGDState(...),
ddp_comm_hook=post_localSGD_hook, model_averaging_period=...)``): on CPU Lightning does not
register the hook, but it still averages the model periodically.

``accelerate``: ``PartialState(cpu=True)`` (accelerate's MULTI_CPU from the environment),
then an all-reduce of (process index + 1) through torch.distributed.

``gloo``: the cheapest program that leaves the process group alive at exit: init, a few
all-reduces, no destroy_process_group().
"""

import argparse
import json
import os
import sys
import warnings

#: The launcher's variables, read at start (Lightning's teardown deletes WORLD_SIZE).
ENV_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
             "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RUN_ID")


def _allreduce_ranks(rank: int) -> float:
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    return float(value.item())


_ENV_AT_START = {n: os.environ.get(n) for n in ENV_NAMES}


def _report(framework: str, **view) -> None:
    record = {"tag": "ranks_users", "framework": framework, "pid": os.getpid(), **view, "env": _ENV_AT_START}
    print(json.dumps(record), flush=True)


def run_lightning(args) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import lightning.pytorch as pl

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    strategy = args.strategy
    if strategy == "post-local-sgd":
        from lightning.pytorch.strategies import DDPStrategy
        from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as post_local

        strategy = DDPStrategy(ddp_comm_state=post_local.PostLocalSGDState(
            process_group=None, subgroup=None, start_localSGD_iter=2),
            ddp_comm_hook=post_local.post_localSGD_hook, model_averaging_period=2)
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 8, generator=generator), torch.randn(64, 1, generator=generator))
    trainer = pl.Trainer(num_nodes=args.nnodes, devices=args.devices, accelerator="cpu", strategy=strategy,
                         max_steps=args.steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), DataLoader(data, batch_size=4))
    import torch.distributed as dist

    _report("lightning", global_rank=trainer.global_rank, node_rank=trainer.node_rank,
            local_rank=trainer.local_rank, world_size=trainer.world_size, dist_rank=dist.get_rank(),
            allreduce=_allreduce_ranks(dist.get_rank()))


def run_accelerate(_args) -> None:
    from accelerate import PartialState

    state = PartialState(cpu=True)
    _report("accelerate", distributed_type=str(state.distributed_type), global_rank=state.process_index,
            local_rank=state.local_process_index, world_size=state.num_processes,
            allreduce=_allreduce_ranks(state.process_index))


def run_gloo(args) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = 0.0
    for _ in range(args.steps):
        total = _allreduce_ranks(dist.get_rank())
    _report("gloo", global_rank=dist.get_rank(), world_size=dist.get_world_size(), allreduce=total)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=("lightning", "accelerate", "gloo"))
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--strategy", default="ddp", choices=("ddp", "post-local-sgd"))
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # Lightning's advice on num_workers etc.: not what is tested
    {"lightning": run_lightning, "accelerate": run_accelerate, "gloo": run_gloo}[args.framework](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
