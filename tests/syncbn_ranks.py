"""Rank program of tests/test_syncbn.py, and the cases it shares with that test.

Run as ``python -m torch.distributed.run --standalone --nproc-per-node W syncbn_ranks.py
OUT_DIR`` (gloo, OMP_NUM_THREADS=1): every rank runs every case of :data:`CASES` whose
world size is W, then (W == 2) the DDP trainings and the wrap_ddp check, and saves what it
saw to ``OUT_DIR/rank{r}.pt`` (torch.save of plain dicts of tensors). The test computes the
reference itself, with one process's plain ``nn.BatchNorm*d`` over the concatenated global
batch (:func:`reference`), and compares.

``torch.distributed.all_gather`` and ``all_reduce`` are wrapped here by counters
(:class:`Counter`), so the results record how many collectives every forward and backward
made (SyncBatchNorm calls them through the ``torch.distributed`` module).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
TRAIN_STEPS = 3  # training forward/backward steps per case, then one eval forward


@dataclass(frozen=True)
class Case:
    """One BatchNorm configuration run on every rank.

    sizes: rows (samples) of each rank's batch, rank 0 first; the global batch is their
    concatenation in rank order. feature: the shape of one sample, (C, *spatial).
    """

    name: str
    dims: int  # 1, 2, 3: BatchNorm1d / 2d / 3d
    feature: tuple
    sizes: tuple
    momentum: Optional[float] = 0.1
    affine: bool = True
    track_running_stats: bool = True
    dtype: str = "float32"
    seed: int = 0
    kw: dict = field(default_factory=dict)

    @property
    def world(self) -> int:
        return len(self.sizes)


CASES = {c.name: c for c in (
    Case("bn1d_nc", 1, (5,), (4, 4), seed=1),
    Case("bn1d_ncl", 1, (4, 7), (3, 5), seed=2),
    Case("bn2d", 2, (3, 5, 6), (2, 2), seed=3),
    Case("bn3d", 3, (2, 3, 4, 5), (2, 3), seed=4),
    Case("bn1d_nc_one_row", 1, (6,), (1, 5), seed=5),  # rank 0 alone could not train
    Case("bn2d_uneven", 2, (3, 4, 4), (1, 6), seed=6),
    Case("bn2d_empty_rank", 2, (3, 4, 5), (0, 4), seed=7),
    Case("bn2d_momentum_none", 2, (3, 4, 4), (3, 2), momentum=None, seed=8),
    Case("bn1d_affine_false", 1, (4, 6), (3, 3), affine=False, seed=9),
    Case("bn2d_no_running_stats", 2, (3, 4, 4), (2, 3), track_running_stats=False, seed=10),
    Case("bn2d_bf16_input", 2, (3, 4, 4), (2, 3), dtype="bfloat16", seed=11),
    Case("bn2d_3ranks_empty_middle", 2, (3, 4, 4), (3, 0, 2), seed=12),
    Case("bn1d_3ranks_uneven", 1, (5,), (2, 5, 1), momentum=None, seed=13),
    Case("bn3d_3ranks", 3, (2, 2, 3, 3), (1, 2, 3), seed=14),
)}


def bn_class(dims: int):
    from torch import nn

    return {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[dims]


def make_bn(case: Case):
    """The plain BatchNorm layer of ``case``, with random (seeded) weight and bias and
    non-trivial running statistics, so that every term of the formulas shows."""
    import torch

    bn = bn_class(case.dims)(case.feature[0], momentum=case.momentum, affine=case.affine,
                             track_running_stats=case.track_running_stats)
    g = torch.Generator().manual_seed(1000 + case.seed)
    with torch.no_grad():
        if case.affine:
            bn.weight.copy_(torch.rand(case.feature[0], generator=g) + 0.5)
            bn.bias.copy_(torch.randn(case.feature[0], generator=g))
        if case.track_running_stats:
            bn.running_mean.copy_(torch.randn(case.feature[0], generator=g))
            bn.running_var.copy_(torch.rand(case.feature[0], generator=g) + 0.5)
    return bn


def global_data(case: Case, step: int):
    """(x, g) of step ``step``: the global input (mean 3, std 2, so centring matters) and the
    upstream gradient (the loss is (y * g).sum()), both (sum(sizes), *feature) float32."""
    import torch

    gen = torch.Generator().manual_seed(100 * case.seed + step)
    shape = (sum(case.sizes), *case.feature)
    x = torch.randn(shape, generator=gen) * 2 + 3
    return x, torch.randn(shape, generator=gen)


def rows(case: Case, rank: int) -> slice:
    start = sum(case.sizes[:rank])
    return slice(start, start + case.sizes[rank])


def run_steps(bn, case: Case, data_rows: Optional[slice]) -> dict:
    """TRAIN_STEPS training steps and one eval forward of ``bn`` on the rows ``data_rows`` of
    every step's global batch (None: all of it). Per step: y, grad_input, grad_weight,
    grad_bias, running stats after it, and the collective calls it made."""
    import torch

    dtype = getattr(torch, case.dtype)
    out = {k: [] for k in ("y", "grad_input", "grad_weight", "grad_bias", "running_mean",
                           "running_var", "num_batches_tracked", "collectives")}
    for step in range(TRAIN_STEPS + 1):
        train = step < TRAIN_STEPS
        bn.train(train)
        x, g = global_data(case, step)
        sl = data_rows or slice(None)
        x = x[sl].to(dtype).requires_grad_(True)
        bn.zero_grad(set_to_none=True)
        before = COUNTER.snapshot()
        y = bn(x)
        if train:
            (y.float() * g[sl]).sum().backward()
        out["collectives"].append(COUNTER.since(before))
        out["y"].append(y.detach().float())
        out["grad_input"].append(None if x.grad is None else x.grad.float())
        out["grad_weight"].append(None if bn.weight is None or bn.weight.grad is None
                                  else bn.weight.grad.clone())
        out["grad_bias"].append(None if bn.bias is None or bn.bias.grad is None
                                else bn.bias.grad.clone())
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            t = getattr(bn, name)
            out[name].append(None if t is None else t.clone())
    return out


def reference(case: Case) -> dict:
    """One process's plain BatchNorm over the concatenated global batch (no process group)."""
    return run_steps(make_bn(case), case, None)


class Counter:
    """Counts calls of torch.distributed.all_gather and all_reduce once :meth:`install`."""

    def __init__(self) -> None:
        self.calls = {"all_gather": 0, "all_reduce": 0}

    def install(self) -> None:
        import torch.distributed as dist

        for name in self.calls:
            real = getattr(dist, name)

            def counted(*args, _real=real, _name=name, **kwargs):
                self.calls[_name] += 1
                return _real(*args, **kwargs)
            setattr(dist, name, counted)

    def snapshot(self) -> dict:
        return dict(self.calls)

    def since(self, before: dict) -> dict:
        return {k: self.calls[k] - before[k] for k in self.calls}


COUNTER = Counter()


def _error(fn) -> str:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - recorded and asserted by the test
        return f"{type(exc).__name__}: {exc}"
    return "no error"


# ----------------------------------------------------------------- DDP training of a conv net

DDP_STEPS = 4
DDP_GLOBAL_BATCH = 8
DDP_LR = 0.1


def conv_net():
    """A small conv net with BatchNorm2d after each convolution and a BatchNorm1d head."""
    import torch
    from torch import nn

    torch.manual_seed(21)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
        nn.Sequential(nn.Conv2d(6, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU()),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 8), nn.BatchNorm1d(8),
        nn.ReLU(), nn.Linear(8, 3))


def ddp_batch(step: int):
    """The global batch of DDP step ``step``: 8 images 3x8x8 (mean 1) and 3-class labels."""
    import torch

    gen = torch.Generator().manual_seed(500 + step)
    return (torch.randn(DDP_GLOBAL_BATCH, 3, 8, 8, generator=gen) + 1,
            torch.randint(0, 3, (DDP_GLOBAL_BATCH,), generator=gen))


def train_net(model, rank: int, world: int) -> list:
    """SGD on the mean cross entropy of this rank's equal shard of each global batch. DDP
    averages the ranks' gradients, so with equal shards the update is the gradient of the
    global batch's mean loss: what ``train_net(model, 0, 1)`` computes in one process.
    Returns the state_dict (parameters and BatchNorm buffers) after every step."""
    import torch
    from torch import nn

    params = model.module.parameters() if hasattr(model, "module") else model.parameters()
    opt = torch.optim.SGD(params, lr=DDP_LR)
    states = []
    per = DDP_GLOBAL_BATCH // world
    for step in range(DDP_STEPS):
        x, y = ddp_batch(step)
        x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        inner = model.module if hasattr(model, "module") else model
        states.append({k: v.detach().clone() for k, v in inner.state_dict().items()})
    return states


def _ddp_runs(rank: int, world: int) -> dict:
    from torch import nn

    from cpulaunch.distributed import wrap_ddp

    sync = wrap_ddp(conv_net(), sync_batchnorm=True)
    plain = wrap_ddp(conv_net())
    converted_types = sorted({type(m).__module__ + "." + type(m).__name__
                              for m in sync.module.modules()
                              if isinstance(m, nn.modules.batchnorm._BatchNorm)})
    return {"ddp_sync": train_net(sync, rank, world), "ddp_plain": train_net(plain, rank, world),
            "wrap_ddp_bn_types": converted_types,
            "wrap_ddp_plain_bn_types": sorted({type(m).__name__ for m in plain.module.modules()
                                               if isinstance(m, nn.modules.batchnorm._BatchNorm)})}


# ----------------------------------------------------------------------------- the program

def rank_main(out_dir: str) -> int:
    import torch
    import torch.distributed as dist

    from cpulaunch.distributed import convert_sync_batchnorm, init_process_group

    init_process_group("gloo")
    COUNTER.install()
    rank, world = dist.get_rank(), dist.get_world_size()
    results: dict = {"world": world}
    for case in CASES.values():
        if case.world != world:
            continue
        sync = convert_sync_batchnorm(make_bn(case))
        results[case.name] = run_steps(sync, case, rows(case, rank))
        # The control: each rank's plain BatchNorm on its own rows.
        results[case.name + ":plain"] = (
            _error(lambda: run_steps(make_bn(case), case, rows(case, rank)))
            if case.sizes[rank] == 1 and len(case.feature) == 1
            else run_steps(make_bn(case), case, rows(case, rank)))
    if world == 2:
        one = Case("global_one_value", 1, (3,), (1, 0))
        results["global_one_value"] = _error(
            lambda: run_steps(convert_sync_batchnorm(make_bn(one)), one, rows(one, rank)))
        t = torch.ones(1)
        dist.all_reduce(t)
        results["group_alive_after_error"] = t.item()
        results.update(_ddp_runs(rank, world))
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(rank_main(sys.argv[1]))
