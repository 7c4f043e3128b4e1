"""DDP training on CPU with synthetic data: the example the ``cpulaunch --ddp`` launcher runs.

Run it as one process (WORLD_SIZE unset: world size 1, no process group) or as one rank of
many, started by ``cpulaunch --ddp``, torchrun, mpirun or srun (whatever set RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT; ``cpulaunch.distributed.init_process_group``
reads them). Examples::

    python examples/train_ddp.py --model bert --size small --steps 5
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 \\
        examples/train_ddp.py --model cnn --size small --global-batch-size 16 --json
    cpulaunch --ddp --nproc-per-node 2 python examples/train_ddp.py --model cnn

Data: every rank generates the *global* batch of each step from a generator seeded with
(--seed, step number), then keeps its own shard. So the same command gives the same global
batches for any world size, and a single-process run is comparable with a DDP run.

The loop follows PyTorch's advice for DDP on CPU:

- ``gradient_as_bucket_view=True``: gradients are views into DDP's all-reduce buckets (no
  copy between them, less memory);
- ``static_graph=True`` when valid: every step uses the same parameters in the same order,
  which holds for both models, *but* only without gradient accumulation: DDP's static-graph
  mode with ``no_sync()`` hits ``expect_autograd_hooks_ INTERNAL ASSERT FAILED`` in torch
  2.13 (pytorch/pytorch#143580; the fix under review, #187732, notes that once past the
  assert it also silently stopped all-reducing). So ``--accum-steps K > 1`` turns it off;
- ``no_sync()`` on the first K-1 micro-batches of an accumulated step, so gradients are
  all-reduced once per optimizer step;
- ``optimizer.zero_grad(set_to_none=True)``;
- optional bf16 autocast (``--bf16``) around the forward pass and the loss.

Output: rank 0 prints the loss every ``--log-every`` steps; every rank prints a summary line
with its samples/s (local samples, data generation excluded), or with ``--json`` one JSON
line per rank on stdout (progress then goes to stderr).

BatchNorm (``--model cnn``): under DDP each rank's BatchNorm normalises over its local shard
only, so a 2-rank cnn run is *not* numerically the same as a single process on the global
batch (statistics over 8 vs 16 samples). ``SyncBatchNorm`` would fix that on GPUs but raises
"SyncBatchNorm expected input tensor to be on GPU" for CPU tensors in torch 2.13, so it is
not an option here. ``--freeze-bn`` puts BatchNorm in eval mode (the models' calibrated
running statistics are used and not updated; the affine weights still train), which makes
the cnn per-sample and therefore comparable too. The bert model (LayerNorm, no dropout) is
per-sample as it is.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/models.py
from models import MODEL_NAMES, SIZES, make_model  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="DDP (or single-process) training on CPU with synthetic data.")
    p.add_argument("--model", choices=MODEL_NAMES, default="cnn",
                   help="cnn: ResNet-50-like; bert: BERT-base-like classifier")
    p.add_argument("--size", choices=SIZES, default="full",
                   help="full: the benchmark shape; small: a fast variant for tests")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="first steps left out of samples/s (default 1, 0 if --steps 1)")
    p.add_argument("--global-batch-size", type=int, default=32,
                   help="samples per optimizer step over all ranks and micro-batches; "
                        "must be a multiple of world size x --accum-steps (default 32)")
    p.add_argument("--accum-steps", type=int, default=1,
                   help="micro-batches per optimizer step (gradient accumulation, default 1)")
    p.add_argument("--lr", type=float, default=0.001,
                   help="SGD learning rate (default 0.001: the labels are random, and the cnn "
                        "diverges within a few steps at 0.01)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the weights and the synthetic data (default 0)")
    p.add_argument("--bf16", action="store_true",
                   help="bf16 autocast for the forward pass and the loss")
    p.add_argument("--freeze-bn", action="store_true",
                   help="BatchNorm in eval mode (running statistics, not updated): makes the "
                        "cnn per-sample, so DDP and single-process runs are comparable")
    p.add_argument("--no-static-graph", action="store_true",
                   help="do not pass static_graph=True to DDP")
    p.add_argument("--log-every", type=int, default=None,
                   help="rank 0 prints the loss every N steps (default: about 10 lines)")
    p.add_argument("--json", action="store_true",
                   help="one JSON line per rank on stdout at the end; progress to stderr")
    p.add_argument("--save-params", metavar="PATH", default=None,
                   help="torch.save the final state_dict; the rank goes into the file name: "
                        "'{rank}' in PATH is replaced by it, else 'p.pt' becomes 'p.rank0.pt'")
    args = p.parse_args(argv)
    for name in ("steps", "global_batch_size", "accum_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.warmup_steps is None:
        args.warmup_steps = 1 if args.steps > 1 else 0
    if not 0 <= args.warmup_steps < args.steps:
        p.error(f"--warmup-steps must be in [0, --steps), got {args.warmup_steps} with "
                f"--steps {args.steps}")
    if args.log_every is None:
        args.log_every = max(1, args.steps // 10)
    return args


def world_from_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from the launcher's environment; (0, 1, 0) if unset."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return rank, world_size, local_rank


def global_batch(model_name: str, model: nn.Module, example_inputs, step: int, seed: int,
                 size: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """The global batch of optimizer step ``step``: (model inputs, integer class targets).

    A pure function of (model, seed, step, size): the generator is seeded with
    ``seed * 2**32 + step``, so every rank of any world size draws the same tensors.
    """
    gen = torch.Generator().manual_seed((seed % 2**31) * 2**32 + step)
    shapes = example_inputs(1)
    if model_name == "cnn":
        image = torch.randn(size, *shapes[0].shape[1:], generator=gen)
        target = torch.randint(0, model.fc.out_features, (size,), generator=gen)
        return (image,), target
    seq_len = shapes[0].shape[1]
    ids = torch.randint(0, model.word_embeddings.num_embeddings, (size, seq_len), generator=gen)
    mask = torch.ones(size, seq_len, dtype=torch.int64)
    target = torch.randint(0, model.classifier.out_features, (size,), generator=gen)
    return (ids, mask), target


def shard(t: torch.Tensor, micro: int, accum_steps: int, rank: int, world_size: int):
    """Rows of micro-batch ``micro`` that belong to ``rank``.

    The global batch is cut into ``accum_steps`` micro-batches of consecutive rows, each
    micro-batch into ``world_size`` equal shards of consecutive rows.
    """
    local = t.shape[0] // (accum_steps * world_size)
    start = (micro * world_size + rank) * local
    return t[start:start + local]


def mean_over_ranks(local_loss: torch.Tensor, world_size: int) -> torch.Tensor:
    """The loss as a mean over the global batch: the mean of the ranks' equal-size shard
    means (an all-reduce), so it is comparable with a single-process run."""
    loss = local_loss.clone()
    if world_size > 1:
        import torch.distributed as dist
        dist.all_reduce(loss)
        loss /= world_size
    return loss


def param_checksum(model: nn.Module) -> tuple[str, float]:
    """(sha256 of the raw bytes of every parameter in named order, float64 sum of them)."""
    h = hashlib.sha256()
    total = 0.0
    for name, p in model.named_parameters():
        t = p.detach().contiguous()
        h.update(name.encode())
        h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
        total += t.double().sum().item()
    return h.hexdigest(), total


def params_path(template: str, rank: int) -> Path:
    """File name for this rank: '{rank}' replaced, else the rank inserted before the suffix.

    ``params_path("out/p.pt", 1) -> out/p.rank1.pt``; ``("p{rank}.pt", 1) -> p1.pt``.
    """
    if "{rank}" in template:
        return Path(template.replace("{rank}", str(rank)))
    p = Path(template)
    return p.with_name(f"{p.stem}.rank{rank}{p.suffix}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world_size, local_rank = world_from_env()
    out = sys.stderr if args.json else sys.stdout

    def say(msg: str) -> None:
        print(f"[rank {rank}/{world_size}] {msg}", file=out, flush=True)

    per_step = world_size * args.accum_steps
    if args.global_batch_size % per_step:
        print(f"error: --global-batch-size {args.global_batch_size} is not a multiple of "
              f"world size {world_size} x --accum-steps {args.accum_steps} = {per_step}; "
              f"use a multiple of {per_step}", file=sys.stderr)
        return 2
    local_micro = args.global_batch_size // per_step

    backend = None
    if world_size > 1:
        from cpulaunch.distributed import init_process_group
        backend = init_process_group()

    # Every rank builds the same weights (the builders seed themselves); DDP also
    # broadcasts rank 0's parameters and buffers when it wraps the model.
    model, example_inputs = make_model(args.model, args.size, seed=args.seed)
    model.train()
    if args.freeze_bn:
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.eval()

    static_graph = world_size > 1 and args.accum_steps == 1 and not args.no_static_graph
    if world_size > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        ddp = DDP(model, gradient_as_bucket_view=True, static_graph=static_graph)
        train_model: nn.Module = ddp
    else:
        ddp = None
        train_model = model
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()  # reduction="mean" over the rows it is given
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else nullcontext())

    if rank == 0:
        say(f"model {args.model}/{args.size}, {sum(p.numel() for p in model.parameters())} "
            f"parameters, global batch {args.global_batch_size} = {world_size} rank(s) x "
            f"{args.accum_steps} micro-batch(es) x {local_micro}, threads "
            f"{torch.get_num_threads()}, backend {backend or 'none (single process)'}, "
            f"static_graph {static_graph}, bf16 {args.bf16}")

    global_loss = torch.zeros(())
    compute_s = 0.0  # time in forward/backward/all-reduce/optimizer, data generation excluded
    step_loss = torch.zeros(())
    for step in range(args.steps):
        inputs, target = global_batch(args.model, model, example_inputs, step, args.seed,
                                      args.global_batch_size)
        t0 = time.perf_counter()
        step_loss = torch.zeros(())
        for micro in range(args.accum_steps):
            x = tuple(shard(t, micro, args.accum_steps, rank, world_size) for t in inputs)
            y = shard(target, micro, args.accum_steps, rank, world_size)
            last = micro == args.accum_steps - 1
            # Only the last micro-batch all-reduces; the others accumulate locally.
            sync = nullcontext() if (ddp is None or last) else ddp.no_sync()
            with sync:
                with autocast:
                    # Loss = mean over the *global* batch. Each rank's loss is the mean over
                    # its local shard, and all shards have the same size; DDP averages the
                    # gradients over ranks (sum / world size), so the result is the gradient
                    # of the mean over all ranks' rows. Dividing by accum_steps makes the sum
                    # over micro-batches a mean too. A single process (world size 1) on the
                    # same global batches therefore computes the same gradient, up to
                    # floating-point summation order.
                    loss = loss_fn(train_model(*x), y.long()) / args.accum_steps
                loss.backward()
            step_loss += loss.detach().float()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= args.warmup_steps:
            compute_s += time.perf_counter() - t0
        if (step + 1) % args.log_every == 0 or step == args.steps - 1:
            # Every rank takes part in the all-reduce; rank 0 prints.
            global_loss = mean_over_ranks(step_loss, world_size)
            if rank == 0:
                say(f"step {step + 1}/{args.steps} loss {global_loss.item():.6f}")
    timed = args.steps - args.warmup_steps
    local_samples = timed * args.global_batch_size // world_size
    samples_per_s = local_samples / compute_s if compute_s > 0 else float("nan")
    global_samples_per_s = (timed * args.global_batch_size / compute_s
                            if compute_s > 0 else float("nan"))
    checksum, param_sum = param_checksum(model)

    if args.save_params:
        path = params_path(args.save_params, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), path)

    summary = {
        "rank": rank, "world_size": world_size, "local_rank": local_rank,
        "model": args.model, "size": args.size, "steps": args.steps,
        "timed_steps": timed, "global_batch_size": args.global_batch_size,
        "local_batch_size": args.global_batch_size // world_size,
        "accum_steps": args.accum_steps, "threads": torch.get_num_threads(),
        "cpus": sorted(os.sched_getaffinity(0)),  # logical CPU ids this rank may run on
        "bf16": args.bf16, "freeze_bn": args.freeze_bn, "backend": backend,
        "static_graph": static_graph,
        "samples_per_s": samples_per_s,  # this rank's samples / its compute seconds
        "global_samples_per_s": global_samples_per_s,  # global batch / this rank's seconds
        "loss": global_loss.item(), "local_loss": step_loss.item(),
        "param_sha256": checksum, "param_sum": param_sum,
    }
    if args.json:
        sys.stdout.write(json.dumps(summary) + "\n")  # one write: ranks share stdout
        sys.stdout.flush()
    else:
        say(f"{samples_per_s:.2f} samples/s on this rank ({global_samples_per_s:.2f} global), "
            f"{timed} timed step(s); final loss {global_loss.item():.6f} (global mean), "
            f"param sum {param_sum:.6f}")

    if world_size > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
