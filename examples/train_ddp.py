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

The loop follows PyTorch's advice for DDP on CPU; the model is wrapped by
``cpulaunch.ddp_wrap.wrap_ddp`` (docs/training.md says where each option comes from and what
it does on CPU with gloo):

- ``gradient_as_bucket_view=True`` (``--no-bucket-view`` turns it off): gradients are views
  into DDP's all-reduce buckets (no copy between them, less memory);
- ``static_graph=True`` when valid (``--static-graph`` / ``--no-static-graph`` force it): every
  step uses the same parameters in the same order, which holds for both models, *but* only
  without gradient accumulation: DDP's static-graph mode with ``no_sync()`` hits
  ``expect_autograd_hooks_ INTERNAL ASSERT FAILED`` in torch 2.13 (pytorch/pytorch#143580;
  the fix under review, #187732, notes that once past the assert it also silently stopped
  all-reducing). So ``--accum-steps K > 1`` turns it off, and refuses ``--static-graph``;
- ``no_sync()`` on the first K-1 micro-batches of an accumulated step, so gradients are
  all-reduced once per optimizer step;
- ``--comm-hook`` fp16 / bf16 / powersgd / powersgd+fp16 / post-local-sgd: torch's DDP
  communication hooks (``--powersgd-rank``, ``--start-powersgd-iter``; ``--local-sgd-period``,
  ``--local-sgd-warmup``, ``--local-group-size``); post-local SGD averages the parameters
  after ``optimizer.step()`` every ``--local-sgd-period`` steps;
- ``optimizer.zero_grad(set_to_none=True)``;
- optional bf16 autocast (``--bf16``: ``torch.autocast("cpu", dtype=torch.bfloat16)``) around
  the forward pass and the loss. No GradScaler: bfloat16 has float32's exponent range, so
  gradients do not underflow the way float16's do (loss scaling exists for float16).

Output: rank 0 prints the loss every ``--log-every`` steps; every rank prints a summary line
with its samples/s (local samples, data generation excluded), or with ``--json`` one JSON
line per rank on stdout (progress then goes to stderr). At the end rank 0 prints one line
``CPULAUNCH_METRIC samples_per_s=<float>`` on stdout: the job's samples per second (global
batch x timed steps / the slowest rank's compute seconds; for one process, its own).

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

# cpulaunch from this checkout when it is not installed (an installed one comes first).
sys.path.append(str(Path(__file__).resolve().parents[1]))
from cpulaunch.ddp_wrap import COMM_HOOKS, DDPOptionError, resolve_options  # noqa: E402


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
    p.add_argument("--static-graph", action=argparse.BooleanOptionalAction, default=None,
                   help="DDP static_graph (default: on unless --accum-steps > 1, where it "
                        "cannot be used with no_sync(), pytorch#143580)")
    p.add_argument("--bucket-view", action=argparse.BooleanOptionalAction, default=True,
                   help="DDP gradient_as_bucket_view (default on)")
    p.add_argument("--comm-hook", choices=list(COMM_HOOKS), default="none",
                   help="DDP communication hook (cpulaunch.ddp_wrap; default none: DDP's own "
                        "all-reduce)")
    p.add_argument("--powersgd-rank", type=int, default=None,
                   help="PowerSGD matrix_approximation_rank (default 1)")
    p.add_argument("--start-powersgd-iter", type=int, default=None,
                   help="PowerSGD start_powerSGD_iter: plain all-reduce steps first (default "
                        "1000, at least 2)")
    p.add_argument("--local-sgd-period", type=int, default=None,
                   help="post-local SGD: average parameters every N steps (default 4)")
    p.add_argument("--local-sgd-warmup", type=int, default=None,
                   help="post-local SGD: global all-reduce steps before local SGD (default 1000)")
    p.add_argument("--local-group-size", type=int, default=None,
                   help="post-local SGD: ranks per gradient all-reduce group after the "
                        "warm-up (default 1: none)")
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
    if args.static_graph and args.accum_steps > 1:
        p.error("--static-graph cannot be combined with --accum-steps > 1: DDP's static graph "
                "breaks under no_sync() in torch 2.13 (pytorch#143580); drop --static-graph")
    try:
        args.ddp_options = resolve_options(
            args.comm_hook, static_graph=args.static_graph,
            gradient_as_bucket_view=args.bucket_view, powersgd_rank=args.powersgd_rank,
            start_powersgd_iter=args.start_powersgd_iter,
            local_sgd_period=args.local_sgd_period, warmup_steps=args.local_sgd_warmup,
            local_group_size=args.local_group_size)
    except DDPOptionError as exc:
        msg = str(exc)
        for name, flag in (("powersgd_rank", "--powersgd-rank"),
                           ("start_powersgd_iter", "--start-powersgd-iter"),
                           ("local_sgd_period", "--local-sgd-period"),
                           ("warmup_steps", "--local-sgd-warmup"),
                           ("local_group_size", "--local-group-size"),
                           ("comm_hook", "--comm-hook")):
            msg = msg.replace(name, flag)
        p.error(msg)
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


def job_throughput(samples: int, compute_s: float, world_size: int) -> float:
    """Samples per second of the whole job: ``samples`` (global batch x timed steps) over
    the slowest rank's compute seconds (an all-reduce MAX, so every rank must call it);
    NaN when nothing was timed."""
    slowest = torch.tensor([compute_s], dtype=torch.float64)
    if world_size > 1:
        import torch.distributed as dist
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return samples / slowest.item() if slowest.item() > 0 else float("nan")


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

    static_graph = (world_size > 1 and args.accum_steps == 1
                    and args.static_graph is not False)
    opts = args.ddp_options
    if world_size > 1:
        from cpulaunch.ddp_wrap import wrap_ddp
        ddp = wrap_ddp(model, static_graph=static_graph,
                       gradient_as_bucket_view=opts.gradient_as_bucket_view,
                       comm_hook=opts.comm_hook, powersgd_rank=opts.powersgd_rank,
                       start_powersgd_iter=opts.start_powersgd_iter,
                       local_sgd_period=opts.local_sgd_period, warmup_steps=opts.warmup_steps,
                       local_group_size=opts.local_group_size)
        train_model: nn.Module = ddp
    else:
        ddp = None
        train_model = model
        if opts.comm_hook != "none":
            say(f"--comm-hook {opts.comm_hook} ignored: world size 1, nothing to communicate")
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()  # reduction="mean" over the rows it is given
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else nullcontext())

    if rank == 0:
        say(f"model {args.model}/{args.size}, {sum(p.numel() for p in model.parameters())} "
            f"parameters, global batch {args.global_batch_size} = {world_size} rank(s) x "
            f"{args.accum_steps} micro-batch(es) x {local_micro}, threads "
            f"{torch.get_num_threads()}, backend {backend or 'none (single process)'}, "
            f"static_graph {static_graph}, bucket view {opts.gradient_as_bucket_view}, "
            f"comm hook {opts.comm_hook}, bf16 {args.bf16}")

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
        if ddp is not None:
            ddp.after_step()  # post-local SGD's model averaging; before zero_grad (needs grads)
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
    job_samples_per_s = job_throughput(timed * args.global_batch_size, compute_s, world_size)
    comm_bytes = [ddp.comm_bytes(step) for step in range(args.steps)] if ddp is not None else []
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
        "bucket_view": opts.gradient_as_bucket_view if ddp is not None else None,
        "comm_hook": opts.comm_hook if ddp is not None else None,
        "powersgd_rank": opts.powersgd_rank, "start_powersgd_iter": opts.start_powersgd_iter,
        "local_sgd_period": opts.local_sgd_period, "local_sgd_warmup": opts.warmup_steps,
        "local_group_size": opts.local_group_size,
        # Bytes this rank handed to all-reduce, mean over all steps and in the last step
        # (analytic, cpulaunch.ddp_wrap.gradient_payload_bytes); null for one process.
        "comm_bytes_per_step": sum(comm_bytes) / len(comm_bytes) if comm_bytes else None,
        "comm_bytes_last_step": comm_bytes[-1] if comm_bytes else None,
        "samples_per_s": samples_per_s,  # this rank's samples / its compute seconds
        "global_samples_per_s": global_samples_per_s,  # global batch / this rank's seconds
        "job_samples_per_s": job_samples_per_s,  # global batch / the slowest rank's seconds
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

    if rank == 0:
        # One write, one line: ranks share stdout.
        sys.stdout.write(f"CPULAUNCH_METRIC samples_per_s={job_samples_per_s}\n")
        sys.stdout.flush()

    if world_size > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
