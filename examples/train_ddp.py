"""DDP training on CPU, on synthetic data or through a CPU-heavy input pipeline: the example
the ``cpulaunch --ddp`` launcher runs.

Run it as one process (WORLD_SIZE unset: world size 1, no process group) or as one rank of
many, started by ``cpulaunch --ddp``, torchrun, mpirun or srun (whatever set RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT; ``cpulaunch.distributed.init_process_group``
reads them). Examples::

    python examples/train_ddp.py --model bert --size small --steps 5
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 \\
        examples/train_ddp.py --model cnn --size small --global-batch-size 16 --json
    cpulaunch --ddp --nproc-per-node 2 python examples/train_ddp.py --model cnn
    python examples/train_ddp.py --size small --data pipeline --num-workers 2
    cpulaunch --dataloader-workers 2 python examples/train_ddp.py --data pipeline

Data (``--data``): step ``s`` trains on global batch ``s`` of one stream of samples, cut
into micro-batches and rank shards the same way (:func:`shard`), so the same command gives
the same global batches for any world size, and a single-process run is comparable with a
DDP run.

- ``synthetic`` (default): every rank generates the *global* batch of each step from a
  generator seeded with (--seed, step number) in the main process, then keeps its own
  shard. Generation is not timed: samples/s counts compute only.
- ``pipeline``: a ``torch.utils.data.Dataset`` that does real CPU work per sample,
  deterministic in (--seed, sample index): cnn, :class:`ImagePipeline` (zlib "decode" of a
  stored uint8 image, ``torch.frombuffer``, random-resized crop + antialiased resize,
  flip, colour jitter, normalisation; about 1.2 ms per sample at ``--size small`` and
  3.3 ms at full on one core here); bert, :class:`TextPipeline` (decompress a stored text,
  regular-expression split, word pieces hashed to ids, a random window, 15% masking;
  0.1-0.4 ms: BERT's compute dominates). Sample randomness is seeded by (--seed, epoch,
  stored item), never by the worker, so batches are the same bytes for any number of
  workers. Each rank's ``DataLoader`` reads only its own rows (:class:`RankMicroBatches`,
  one batch per micro-batch). Workers (``--num-workers N``; 0 = load in the main process)
  come from, in order: an explicit ``--num-workers``; else ``CPULAUNCH_DATALOADER_NUM_WORKERS``
  set by ``cpulaunch --dataloader-workers K``, through
  ``cpulaunch.torch_utils.dataloader_kwargs()``; else 0. When cpulaunch reserved cores
  (``CPULAUNCH_DATALOADER_CPUS``), the workers are pinned to them (worker i to the
  (i mod count)-th, one torch thread each) also when ``--num-workers`` overrides the count;
  without cpulaunch's variables workers inherit this process's CPUs and share the compute
  cores. samples/s is then **end to end**: compute plus the time spent waiting for batches
  (what workers and their placement change); the first step (worker start-up) is untimed.

The loop follows PyTorch's advice for DDP on CPU; the model is wrapped by
``cpulaunch.ddp_wrap.wrap_ddp`` (docs/guide/training.md says where each option comes from and what
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
  ``--amp`` is the GPU recipe's AMP step in its CPU form
  (:func:`cpulaunch.runtime.amp.cpu_autocast`): bf16 autocast where the CPU computes in bf16
  (``avx512_bf16`` or ``amx_bf16`` in /proc/cpuinfo), and elsewhere a one-line refusal (exit
  2) naming the slowdown measured here (0.09x fp32); ``--bf16`` forces it anyway.

Output: rank 0 prints the loss every ``--log-every`` steps; every rank prints a summary line
with its samples/s (local samples; compute only for synthetic data, end to end for the
pipeline, as the line says), or with ``--json`` one JSON line per rank on stdout (progress
then goes to stderr). The JSON says which: ``samples_per_s_includes_data``, with
``compute_s`` and ``data_wait_s`` (seconds of the timed steps spent computing, and making
or waiting for batches), ``timed_step_s`` (each timed step's seconds, counted as samples/s
counts them: for medians that one slow step does not move), ``num_workers``, ``num_workers_from``, ``dataloader_cpus`` (the
pinning cpulist, or null), ``loader_workers`` (each worker's pid, CPUs and torch threads
as the worker itself saw them) and ``step_losses`` (this rank's loss of every step);
``--digest`` adds ``batch_sha256`` over every batch trained on. At the end rank 0 prints
one line ``CPULAUNCH_METRIC samples_per_s=<float>`` on stdout: the job's samples per second
(global batch x timed steps / the slowest rank's timed seconds, as above; for one process,
its own).

BatchNorm (``--model cnn``): under DDP each rank's BatchNorm normalises over its local shard
only, so a 2-rank cnn run is *not* numerically the same as a single process on the global
batch (statistics over 8 vs 16 samples). torch's ``nn.SyncBatchNorm`` would fix that on GPUs
but raises "SyncBatchNorm expected input tensor to be on GPU" for CPU tensors (and DDP
refuses a CPU model holding one). ``--sync-bn`` uses cpulaunch's CPU synchronized BatchNorm
instead (``wrap_ddp(model, sync_batchnorm=True)``, which calls
``cpulaunch.distributed.convert_sync_batchnorm`` before wrapping): every BatchNorm layer
normalises with the statistics of the global batch (one all_gather in its forward, one
all_reduce in its backward), so the 2-rank run matches the single process on the global
batch, running statistics included (docs/guide/training.md has the cost). ``--freeze-bn`` puts
BatchNorm in eval mode (the models' calibrated running statistics are used and not updated;
the affine weights still train), which makes the cnn per-sample and therefore comparable
too, without communication. The bert model (LayerNorm, no dropout) is per-sample as it is.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import math
import os
import re
import sys
import time
import zlib
from collections.abc import Iterator, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/models.py
from models import MODEL_NAMES, SIZES, make_model  # noqa: E402

# cpulaunch from this checkout when it is not installed (an installed one comes first).
sys.path.append(str(Path(__file__).resolve().parents[1]))
from cpulaunch.ddp_wrap import COMM_HOOKS, DDPOptionError, resolve_options  # noqa: E402
from cpulaunch.errors import CpulaunchError  # noqa: E402
from cpulaunch.torch_utils import (DATALOADER_CPUS_ENV, DATALOADER_WORKERS_ENV,  # noqa: E402
                                   dataloader_kwargs, worker_init_fn)


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
                   help="bf16 autocast for the forward pass and the loss, whatever the CPU")
    p.add_argument("--amp", action="store_true",
                   help="mixed precision as the GPU recipe's autocast, in its CPU form: bf16 autocast "
                        "where the CPU has bf16 instructions, refused (exit 2) where it would be emulated")
    p.add_argument("--freeze-bn", action="store_true",
                   help="BatchNorm in eval mode (running statistics, not updated): makes the "
                        "cnn per-sample, so DDP and single-process runs are comparable")
    p.add_argument("--sync-bn", action="store_true",
                   help="cnn under DDP: synchronized BatchNorm (statistics over the global "
                        "batch of all ranks, cpulaunch.distributed.convert_sync_batchnorm "
                        "through wrap_ddp(sync_batchnorm=True)); 2 collectives per BatchNorm "
                        "layer per step")
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
    p.add_argument("--data", choices=("synthetic", "pipeline"), default="synthetic",
                   help="synthetic: random tensors made in the main process, samples/s counts "
                        "compute only; pipeline: a CPU-heavy input pipeline (decode + "
                        "augmentation) through a DataLoader, samples/s end to end, data waits "
                        "included (default synthetic)")
    p.add_argument("--num-workers", type=int, default=None,
                   help="--data pipeline: DataLoader workers (0: load in the main process). "
                        "Default: CPULAUNCH_DATALOADER_NUM_WORKERS when cpulaunch "
                        "--dataloader-workers set it (workers pinned to its cores), else 0; "
                        "given explicitly it wins over that variable")
    p.add_argument("--digest", action="store_true",
                   help="put a sha256 of every batch this rank trained on (inputs and targets, "
                        "in order) in the JSON as batch_sha256 (to compare runs)")
    p.add_argument("--json", action="store_true",
                   help="one JSON line per rank on stdout at the end; progress to stderr")
    p.add_argument("--save-params", metavar="PATH", default=None,
                   help="torch.save the final state_dict; the rank goes into the file name: "
                        "'{rank}' in PATH is replaced by it, else 'p.pt' becomes 'p.rank0.pt'")
    args = p.parse_args(argv)
    for name in ("steps", "global_batch_size", "accum_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.num_workers is not None:
        if args.data != "pipeline":
            p.error("--num-workers applies to --data pipeline (synthetic batches are made in "
                    "the main process); add --data pipeline")
        if args.num_workers < 0:
            p.error(f"--num-workers must be at least 0, got {args.num_workers}")
    if args.warmup_steps is None:
        args.warmup_steps = 1 if args.steps > 1 else 0
    if not 0 <= args.warmup_steps < args.steps:
        p.error(f"--warmup-steps must be in [0, --steps), got {args.warmup_steps} with "
                f"--steps {args.steps}")
    if args.log_every is None:
        args.log_every = max(1, args.steps // 10)
    if args.sync_bn and args.model != "cnn":
        p.error(f"--sync-bn applies to --model cnn; {args.model} has no BatchNorm")
    if args.sync_bn and args.freeze_bn:
        p.error("--sync-bn and --freeze-bn exclude each other: frozen BatchNorm uses its "
                "running statistics and has nothing to synchronize; drop one")
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


# --------------------------------------------------------------------------- --data pipeline

#: Stored samples of the pipeline datasets: sample i of the stream uses stored item
#: ``i % PIPELINE_POOL`` in epoch ``i // PIPELINE_POOL``.
PIPELINE_POOL = 64
#: Side of the stored (square) images, per model input side (cnn small 64, full 224): the
#: crop is resized down to the model's side, as photos are (ImageNet's are ~400x350 for 224).
SOURCE_SIDE = {64: 224, 224: 320}
#: ImageNet's per-channel mean and standard deviation (torchvision's Normalize values).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: Token ids the text pipeline reserves; words hash onto the ids above them.
PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "qu", "ph", "str", "ion", "ed")
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def sample_seed(seed: int, epoch: int, item: int) -> int:
    """The seed of one sample's randomness: a 63-bit hash of (--seed, epoch, stored item).

    A function of the sample alone, never of the process, worker or thread that loads it,
    so a stream gives the same samples for any --num-workers and any world size.
    """
    digest = hashlib.blake2b(f"{seed}:{epoch}:{item}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _uniform(gen: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * torch.rand((), generator=gen, dtype=torch.float64).item()


def _randint(gen: torch.Generator, lo: int, hi: int) -> int:
    """An int in [lo, hi)."""
    return int(torch.randint(lo, hi, (), generator=gen))


def _stored_image(seed: int, item: int, side: int) -> bytes:
    """Stored image ``item``: zlib-compressed HWC uint8 bytes, ``side`` x ``side`` x 3, of a
    smooth random picture: an 8x8 random colour grid, enlarged and box-blurred with integer
    arithmetic (exact, so the same bytes at any torch thread count; torch's float bilinear
    upsampling is not), plus a little noise."""
    gen = torch.Generator().manual_seed(sample_seed(seed, -1, item))
    cell = -(-side // 8)
    grid = torch.randint(0, 256, (3, 8, 8), generator=gen, dtype=torch.int64)
    img = grid.repeat_interleave(cell, 1).repeat_interleave(cell, 2)[:, :side, :side]
    for dim in (1, 2):  # box blur of width `cell` along rows, then columns (edge-padded)
        pad = [img.narrow(dim, 0, 1)] * (cell // 2) + [img] + [img.narrow(dim, side - 1, 1)] * cell
        sums = torch.cat(pad, dim).cumsum(dim)
        img = (sums.narrow(dim, cell, side) - sums.narrow(dim, 0, side)) // cell
    img = (img + torch.randint(0, 4, img.shape, generator=gen)).clamp_(max=255).to(torch.uint8)
    hwc = img.permute(1, 2, 0).contiguous()
    return zlib.compress(ctypes.string_at(hwc.data_ptr(), hwc.numel()), 1)


def random_resized_crop(gen: torch.Generator, height: int, width: int,
                        scale: tuple[float, float] = (0.08, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """(top, left, h, w) of a crop covering ``scale`` of the area with aspect ratio in
    ``ratio``: torchvision's RandomResizedCrop.get_params rule (10 tries, then the whole
    image), drawn from ``gen``. Pixels, rows from the top."""
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * _uniform(gen, *scale)
        aspect = math.exp(_uniform(gen, log_lo, log_hi))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return _randint(gen, 0, height - h + 1), _randint(gen, 0, width - w + 1), h, w
    return 0, 0, height, width


class ImagePipeline(torch.utils.data.Dataset):
    """Images the way a training input pipeline makes them, on the CPU, one per index.

    ``__getitem__(i)`` returns ``((image,), label)``: ``image`` float32 ``(3, side, side)``,
    ``label`` an int in [0, num_classes). Per sample:

    1. decode: zlib-decompress stored item ``i % PIPELINE_POOL`` (HWC uint8,
       ``source_side`` square), ``torch.frombuffer`` and a CHW copy;
    2. random-resized crop (torchvision's rule, in Python) and a bilinear antialiased resize
       to ``side`` (``F.interpolate``);
    3. horizontal flip with probability 1/2;
    4. colour jitter: brightness, contrast and saturation factors in [0.6, 1.4], applied in
       a random order, clamped to [0, 255] after each; contrast blends with the crop's
       mean, an exact integer mean of the decoded pixels;
    5. normalisation with ImageNet's mean and std.

    Randomness comes from a generator seeded with :func:`sample_seed` (seed, epoch
    ``i // PIPELINE_POOL``, item), and the ops are elementwise, an integer mean and an
    antialiased resize, so a sample is the same bytes in any worker and at any torch thread
    count (tests/test_train_ddp.py compares 1 and 2 threads; the stored images are made with
    integer arithmetic because torch's float bilinear *upsampling* differed in the last bit
    between 1 and 2 threads here). Cost measured on the development machine (one thread,
    AMD EPYC): about 1.2 ms per sample at side 64 (cnn small, source 224) and 3.3 ms at side
    224 (cnn full, source 320), bounded (fixed sizes, at most 10 crop tries); building the
    64 stored images takes about 0.5 s / 1.3 s once, before training.

    Args:
        length: samples in the stream (steps x global batch).
        side: model input side in pixels (64 for cnn small, 224 for full).
        num_classes: labels are drawn in [0, num_classes), one per stored item.
        seed: --seed.
    """

    def __init__(self, *, length: int, side: int, num_classes: int, seed: int):
        self.length, self.side, self.seed = length, side, seed
        self.source_side = SOURCE_SIDE.get(side, side * 3 // 2)
        self.blobs = [_stored_image(seed, k, self.source_side) for k in range(PIPELINE_POOL)]
        gen = torch.Generator().manual_seed(sample_seed(seed, -1, -1))
        self.labels = torch.randint(0, num_classes, (PIPELINE_POOL,), generator=gen).tolist()
        self.scale = (1 / (255 * torch.tensor(IMAGENET_STD))).view(3, 1, 1)
        self.shift = (torch.tensor(IMAGENET_MEAN) / torch.tensor(IMAGENET_STD)).view(3, 1, 1)

    def __len__(self) -> int:
        return self.length

    def decode(self, item: int) -> torch.Tensor:
        """Stored item ``item`` as a CHW uint8 tensor (contiguous)."""
        raw = bytearray(zlib.decompress(self.blobs[item]))  # writable: frombuffer shares it
        s = self.source_side
        return torch.frombuffer(raw, dtype=torch.uint8).view(s, s, 3).permute(2, 0, 1).contiguous()

    def __getitem__(self, index: int):
        item, epoch = index % PIPELINE_POOL, index // PIPELINE_POOL
        gen = torch.Generator().manual_seed(sample_seed(self.seed, epoch, item))
        img = self.decode(item)
        top, left, h, w = random_resized_crop(gen, img.shape[1], img.shape[2])
        crop = img[:, top:top + h, left:left + w]
        mean = crop.sum(dtype=torch.int64).item() / crop.numel()  # exact, thread-independent
        x = F.interpolate(crop.float().unsqueeze(0), size=(self.side, self.side),
                          mode="bilinear", align_corners=False, antialias=True)[0]
        if _uniform(gen, 0.0, 1.0) < 0.5:
            x = x.flip(-1)
        for op in torch.randperm(3, generator=gen).tolist():
            factor = _uniform(gen, 0.6, 1.4)
            if op == 0:    # brightness
                x = x * factor
                mean *= factor
            elif op == 1:  # contrast: blend with the mean
                x = (x - mean) * factor + mean
            else:          # saturation: blend with the pixel's grey (ITU-R 601 luma)
                grey = x[0] * 0.299 + x[1] * 0.587 + x[2] * 0.114
                x = (x - grey) * factor + grey
            x = x.clamp_(0.0, 255.0)
        x = x * self.scale - self.shift  # (x / 255 - mean) / std
        return (x,), self.labels[item]


class TextPipeline(torch.utils.data.Dataset):
    """Token ids the way a text pipeline makes them, in Python, one sample per index.

    ``__getitem__(i)`` returns ``((input_ids, attention_mask), label)``, both ``(seq_len,)``
    int64. Per sample: zlib-decompress stored document ``i % PIPELINE_POOL`` (made-up words
    of 1-4 syllables with punctuation, seq_len/4 to seq_len words), lower-case, split into
    words and punctuation with a regular expression, cut each word into pieces of at most 6
    characters (word-piece style, continuations marked ``##``), hash each piece to an id
    (crc32 onto [4, vocab_size)), take a random window of ``seq_len - 2`` pieces, mask 15%
    of them (MASK_ID, as in BERT's pre-training), add CLS and SEP, pad with PAD_ID. The
    randomness is seeded like :class:`ImagePipeline`'s. Cost: about 0.1 ms (seq_len 32) to
    0.4 ms (128) per sample here: BERT's own compute dominates, so the text pipeline exists
    so that ``--data pipeline`` works for both models, not to load the CPU.
    """

    def __init__(self, *, length: int, seq_len: int, vocab_size: int, num_classes: int,
                 seed: int):
        self.length, self.seq_len, self.vocab_size, self.seed = length, seq_len, vocab_size, seed
        self.blobs = []
        for k in range(PIPELINE_POOL):
            gen = torch.Generator().manual_seed(sample_seed(seed, -1, k))
            words = []
            for _ in range(_randint(gen, max(1, seq_len // 4), seq_len + 1)):
                parts = torch.randint(0, len(_SYLLABLES), (_randint(gen, 1, 5),), generator=gen)
                word = "".join(_SYLLABLES[j] for j in parts.tolist())
                mark = _randint(gen, 0, 12)
                words.append(word.capitalize() + "." if mark == 0 else
                             word + "," if mark == 1 else word)
            self.blobs.append(zlib.compress(" ".join(words).encode()))
        gen = torch.Generator().manual_seed(sample_seed(seed, -1, -1))
        self.labels = torch.randint(0, num_classes, (PIPELINE_POOL,), generator=gen).tolist()

    def __len__(self) -> int:
        return self.length

    def tokenize(self, text: str) -> list[int]:
        """Word-piece-like ids of ``text`` (no special tokens)."""
        ids = []
        span = self.vocab_size - 4
        for word in _TOKEN_RE.findall(text.lower()):
            for start in range(0, len(word), 6):
                piece = word[start:start + 6] if start == 0 else "##" + word[start:start + 6]
                ids.append(4 + zlib.crc32(piece.encode()) % span)
        return ids

    def __getitem__(self, index: int):
        item, epoch = index % PIPELINE_POOL, index // PIPELINE_POOL
        gen = torch.Generator().manual_seed(sample_seed(self.seed, epoch, item))
        pieces = self.tokenize(zlib.decompress(self.blobs[item]).decode())
        room = self.seq_len - 2
        start = _randint(gen, 0, max(0, len(pieces) - room) + 1)
        window = torch.tensor(pieces[start:start + room], dtype=torch.int64)
        window[torch.rand(window.shape, generator=gen) < 0.15] = MASK_ID
        ids = torch.full((self.seq_len,), PAD_ID, dtype=torch.int64)
        ids[0], ids[1:1 + len(window)], ids[1 + len(window)] = CLS_ID, window, SEP_ID
        mask = (ids != PAD_ID).long()
        return (ids, mask), self.labels[item]


def make_pipeline(model_name: str, model: nn.Module, example_inputs, *, length: int,
                  seed: int) -> torch.utils.data.Dataset:
    """The --data pipeline dataset for the model: :class:`ImagePipeline` (cnn, input side
    from the model's example inputs) or :class:`TextPipeline` (bert)."""
    shape = example_inputs(1)[0].shape
    if model_name == "cnn":
        return ImagePipeline(length=length, side=shape[-1], num_classes=model.fc.out_features,
                             seed=seed)
    return TextPipeline(length=length, seq_len=shape[1],
                        vocab_size=model.word_embeddings.num_embeddings,
                        num_classes=model.classifier.out_features, seed=seed)


class RankMicroBatches(torch.utils.data.Sampler):
    """This rank's micro-batches of the stream, in training order: a batch sampler.

    Step ``s``'s global batch is stream samples ``s*G .. s*G + G - 1`` (``G`` = global batch
    size), and this rank's rows of micro-batch ``m`` are those :func:`shard` picks from it:
    ``s*G + (m*world_size + rank)*L + [0, L)``, ``L = G / (accum_steps * world_size)``.
    So every world size trains on the same global batches, and each rank loads only its own
    rows. Yields lists of stream indices, ``steps * accum_steps`` of them.
    """

    def __init__(self, *, steps: int, global_batch_size: int, accum_steps: int, rank: int,
                 world_size: int):
        self.steps, self.global_batch_size = steps, global_batch_size
        self.accum_steps, self.rank, self.world_size = accum_steps, rank, world_size
        self.local = global_batch_size // (accum_steps * world_size)

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.steps):
            for micro in range(self.accum_steps):
                start = step * self.global_batch_size + (
                    micro * self.world_size + self.rank) * self.local
                yield list(range(start, start + self.local))

    def __len__(self) -> int:
        return self.steps * self.accum_steps


def collate_with_origin(samples):
    """DataLoader ``collate_fn``: ``(inputs tuple, targets, origin)``. ``origin`` says which
    process made the batch, as seen from inside it: ``(worker id or None for the main
    process, pid, sorted os.sched_getaffinity(0), torch.get_num_threads())``."""
    inputs = tuple(torch.stack(parts) for parts in zip(*(s[0] for s in samples)))
    target = torch.tensor([s[1] for s in samples], dtype=torch.int64)
    info = torch.utils.data.get_worker_info()
    origin = (info.id if info is not None else None, os.getpid(),
              tuple(sorted(os.sched_getaffinity(0))), torch.get_num_threads())
    return inputs, target, origin


def next_batch(batches: Iterator) -> tuple:
    """The next ``(inputs, targets, origin)`` of the loader. A cpulaunch error raised in a
    worker (its reserved CPU is one this process may not use) ends the run with exit code 2
    and the error's own one-line message (DataLoader re-raises it with the worker's
    traceback folded into the message)."""
    try:
        return next(batches)
    except CpulaunchError as exc:
        last = str(exc).strip().splitlines()[-1]
        prefix = f"{type(exc).__module__}.{type(exc).__qualname__}: "
        print(f"error: {last.removeprefix(prefix)}", file=sys.stderr)
        raise SystemExit(2) from None


def loader_settings(num_workers: int | None,
                    environ: Mapping[str, str]) -> tuple[dict[str, Any], str]:
    """DataLoader keyword arguments for --data pipeline, and where the worker count came from.

    - ``cpulaunch --dataloader-workers K`` set ``CPULAUNCH_DATALOADER_NUM_WORKERS`` /
      ``CPULAUNCH_DATALOADER_CPUS``: ``cpulaunch.torch_utils.dataloader_kwargs()`` (K
      workers, each pinned to its reserved CPU by ``worker_init_fn``, persistent); an
      explicit ``--num-workers N`` wins over K, and its workers are still pinned to the
      reserved CPUs (worker i to the (i mod count)-th; with N = 0 the main process loads).
    - otherwise ``--num-workers N`` (default 0): N unpinned workers, which inherit the
      process's CPUs and so share the compute cores.

    Returns:
        (kwargs with num_workers, persistent_workers and, when pinned, worker_init_fn;
        source: ``"--num-workers"``, ``"CPULAUNCH_DATALOADER_NUM_WORKERS"`` or ``"default"``).

    Raises:
        cpulaunch.torch_utils.DataloaderEnvError: CPULAUNCH_DATALOADER_NUM_WORKERS is not a
            whole number.
    """
    planned = any(environ.get(name, "").strip()
                  for name in (DATALOADER_WORKERS_ENV, DATALOADER_CPUS_ENV))
    if planned and num_workers is None:
        return dataloader_kwargs(environ), DATALOADER_WORKERS_ENV
    workers = num_workers or 0
    kwargs: dict[str, Any] = {"num_workers": workers, "persistent_workers": workers > 0}
    if planned and workers:
        kwargs["worker_init_fn"] = worker_init_fn
    return kwargs, ("--num-workers" if num_workers is not None else "default")


def make_loader(args: argparse.Namespace, model: nn.Module, example_inputs, rank: int,
                world_size: int, loader_kwargs: dict[str, Any]) -> torch.utils.data.DataLoader:
    """This rank's DataLoader for --data pipeline: the model's pipeline dataset over the
    whole stream (steps x global batch), one batch per micro-batch of this rank
    (:class:`RankMicroBatches`), batches tagged with their origin
    (:func:`collate_with_origin`), workers as ``loader_kwargs`` (:func:`loader_settings`)."""
    dataset = make_pipeline(args.model, model, example_inputs,
                            length=args.steps * args.global_batch_size, seed=args.seed)
    sampler = RankMicroBatches(steps=args.steps, global_batch_size=args.global_batch_size,
                               accum_steps=args.accum_steps, rank=rank, world_size=world_size)
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, collate_fn=collate_with_origin,
        generator=torch.Generator(),  # the loader's base seed: not from the global RNG
        **loader_kwargs)


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

    # Started by cpulaunch, each line already comes with "[i] " (its local rank) when several
    # ranks run; started otherwise (torchrun, srun), the rank says who it is.
    tag = "" if os.environ.get("CPULAUNCH_INSTANCE_INDEX") is not None else f"[rank {rank}/{world_size}] "

    def say(msg: str) -> None:
        print(f"{tag}{msg}", file=out, flush=True)

    if args.amp and not args.bf16:
        from cpulaunch.runtime.amp import amp_refusal
        from cpulaunch.runtime.inference import host_bf16_support

        refusal = amp_refusal(host_bf16_support())
        if refusal:
            print(f"error: {refusal}", file=sys.stderr)
            return 2
        args.bf16 = True
    per_step = world_size * args.accum_steps
    if args.global_batch_size % per_step:
        print(f"error: --global-batch-size {args.global_batch_size} is not a multiple of "
              f"world size {world_size} x --accum-steps {args.accum_steps} = {per_step}; "
              f"use a multiple of {per_step}", file=sys.stderr)
        return 2
    local_micro = args.global_batch_size // per_step
    loader_kwargs: dict[str, Any] = {}
    workers_from = None
    if args.data == "pipeline":
        try:
            loader_kwargs, workers_from = loader_settings(args.num_workers, os.environ)
        except CpulaunchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    backend = None
    if world_size > 1:
        from cpulaunch import init_process_group
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
                       local_group_size=opts.local_group_size, sync_batchnorm=args.sync_bn)
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

    batches = None
    num_workers = loader_kwargs.get("num_workers", 0)
    pinned_to = os.environ.get(DATALOADER_CPUS_ENV, "").strip() or None
    if args.data == "pipeline":
        loader = make_loader(args, model, example_inputs, rank, world_size, loader_kwargs)
        batches = iter(loader)  # workers start (and begin prefetching) here, before step 1
        if rank == 0:
            where = ("in the main process" if not num_workers else
                     f"in {num_workers} worker(s)" + (
                         f" pinned to {DATALOADER_CPUS_ENV}={pinned_to}"
                         if "worker_init_fn" in loader_kwargs and pinned_to else
                         " sharing this process's CPUs"))
            say(f"data pipeline ({type(loader.dataset).__name__}), loaded {where} (workers "
                f"from {workers_from}); samples/s counts end to end, data waits included")
    elif rank == 0 and os.environ.get(DATALOADER_WORKERS_ENV, "").strip():
        say(f"{DATALOADER_WORKERS_ENV}={os.environ[DATALOADER_WORKERS_ENV]} not used: --data "
            f"synthetic makes its batches in the main process (use --data pipeline)")

    global_loss = torch.zeros(())
    # Seconds over the timed steps: compute_s in forward/backward/all-reduce/optimizer;
    # data_s making (synthetic) or waiting for (pipeline) this rank's batches.
    compute_s = data_s = 0.0
    step_loss = torch.zeros(())
    step_losses: list[float] = []  # this rank's loss of every step (mean over its rows)
    step_s: list[float] = []  # seconds of each timed step, as samples/s counts them
    origins: set = set()  # (worker, pid, cpus, threads) of the processes that made batches
    digest = hashlib.sha256() if args.digest else None
    for step in range(args.steps):
        step_start = time.perf_counter()
        if batches is None:
            inputs, target = global_batch(args.model, model, example_inputs, step, args.seed,
                                          args.global_batch_size)
        t0 = time.perf_counter()
        wait_s = t0 - step_start
        step_loss = torch.zeros(())
        for micro in range(args.accum_steps):
            if batches is None:
                x = tuple(shard(t, micro, args.accum_steps, rank, world_size) for t in inputs)
                y = shard(target, micro, args.accum_steps, rank, world_size)
            else:
                t_wait = time.perf_counter()
                x, y, origin = next_batch(batches)
                wait_s += time.perf_counter() - t_wait
                origins.add(origin)
            if digest is not None:
                for t in (*x, y):
                    t = t.contiguous()
                    digest.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
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
        step_losses.append(step_loss.item())
        if step >= args.warmup_steps:
            # synthetic: t0 follows the batch's generation; pipeline: waits happen after t0.
            step_compute = time.perf_counter() - t0 - (wait_s - (t0 - step_start))
            data_s += wait_s
            compute_s += step_compute
            step_s.append(step_compute + wait_s if args.data == "pipeline" else step_compute)
        if (step + 1) % args.log_every == 0 or step == args.steps - 1:
            # Every rank takes part in the all-reduce; rank 0 prints.
            global_loss = mean_over_ranks(step_loss, world_size)
            if rank == 0:
                say(f"step {step + 1}/{args.steps} loss {global_loss.item():.6f}")
    if batches is not None:
        del batches, loader  # stops the workers now, not at interpreter exit
    timed = args.steps - args.warmup_steps
    # What samples/s divides by: compute only for synthetic data (its generation is not part
    # of training), end to end for the pipeline (the waits are what the workers change).
    includes_data = args.data == "pipeline"
    timed_s = compute_s + data_s if includes_data else compute_s
    local_samples = timed * args.global_batch_size // world_size
    samples_per_s = local_samples / timed_s if timed_s > 0 else float("nan")
    global_samples_per_s = (timed * args.global_batch_size / timed_s
                            if timed_s > 0 else float("nan"))
    job_samples_per_s = job_throughput(timed * args.global_batch_size, timed_s, world_size)
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
        "bf16": args.bf16, "amp": args.amp, "freeze_bn": args.freeze_bn, "backend": backend,
        # BatchNorm layers synchronized over the ranks (--sync-bn; only with DDP).
        "sync_bn": args.sync_bn and ddp is not None,
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
        # The three samples/s figures divide by compute_s (synthetic) or by compute_s +
        # data_wait_s (pipeline): samples_per_s_includes_data says which.
        "samples_per_s": samples_per_s,  # this rank's samples / its seconds
        "global_samples_per_s": global_samples_per_s,  # global batch / this rank's seconds
        "job_samples_per_s": job_samples_per_s,  # global batch / the slowest rank's seconds
        "samples_per_s_includes_data": includes_data,
        "data": args.data,
        "compute_s": compute_s,  # timed steps: forward, backward, all-reduce, optimizer
        # timed steps: making the synthetic batches, or waiting for the pipeline's
        "data_wait_s": data_s,
        # Each timed step's seconds on this rank, counted as samples/s counts them (their sum
        # is compute_s, or compute_s + data_wait_s for the pipeline): for per-step medians.
        "timed_step_s": step_s,
        "num_workers": num_workers if args.data == "pipeline" else None,
        "num_workers_from": workers_from,  # --num-workers, CPULAUNCH_DATALOADER_NUM_WORKERS, default
        "dataloader_cpus": pinned_to if "worker_init_fn" in loader_kwargs else None,
        # Each worker that made batches, as it saw itself: its own affinity and torch threads.
        "loader_workers": [{"worker": w, "pid": pid, "cpus": list(cpus), "threads": threads}
                           for w, pid, cpus, threads in sorted(
                               o for o in origins if o[0] is not None)],
        "loss": global_loss.item(), "local_loss": step_loss.item(),
        "step_losses": step_losses,  # this rank's (local) loss of every step
        "batch_sha256": digest.hexdigest() if digest is not None else None,
        "param_sha256": checksum, "param_sum": param_sum,
    }
    if args.json:
        sys.stdout.write(json.dumps(summary) + "\n")  # one write: ranks share stdout
        sys.stdout.flush()
    else:
        what = (f"end to end, {data_s:.3f} s of data waits included" if includes_data else
                f"compute only, {data_s:.3f} s of data generation excluded")
        say(f"{samples_per_s:.2f} samples/s on this rank ({global_samples_per_s:.2f} global; "
            f"{what}), {timed} timed step(s); final loss {global_loss.item():.6f} (global "
            f"mean), param sum {param_sum:.6f}")

    if rank == 0:
        # One write, one line: ranks share stdout.
        sys.stdout.write(f"CPULAUNCH_METRIC samples_per_s={job_samples_per_s}\n")
        sys.stdout.flush()

    if world_size > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
