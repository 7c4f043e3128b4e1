"""Synchronized BatchNorm for CPU process groups (gloo, ccl): torch's ``nn.SyncBatchNorm``
computed the same way, without its GPU-only restriction.

What it computes (torch's ``nn.SyncBatchNorm`` docs, torch 2.13): "The mean and
standard-deviation are calculated per-dimension over all mini-batches of the same process
groups": in training, every rank normalises with the statistics of the *global* mini-batch
(the concatenation of every rank's batch along dim 0), and the running statistics are
updated with them, so N ranks compute exactly what one process running plain BatchNorm on
the concatenated batch would, forward and backward. torch's own class refuses CPU tensors
("SyncBatchNorm expected input tensor to be on GPU or XPU ...", and DDP refuses a CPU model
that contains one: "SyncBatchNorm layers only work with GPU modules"), because its
reductions are ATen ops with GPU kernels only (``batch_norm_stats``, ``batch_norm_elemt``,
... have no CPU kernel in torch 2.13).

How (the same algorithm as torch's ``torch/nn/modules/_functions.py`` ``SyncBatchNorm``
forward/backward, with the reductions its ATen ops perform written in torch operators that
run on CPU; own code, not a copy):

Forward, one collective per layer:

1. each rank computes, per channel c, its element count n_r (N x spatial size, the same for
   every channel), mean m_r and centred sum of squares M2_r = sum (x - m_r)^2
   (``torch.var_mean``, numerically stable), in float32 (float64 for float64 input) even
   for bfloat16 / float16 input: ``batch_norm_stats``;
2. ONE ``all_gather`` of the fixed-size vector [n_r, m_r (C), M2_r (C)] (2C + 1 float64
   values: counts stay exact beyond 2**24 elements), so ranks with different batch sizes,
   and a rank with an empty batch (n_r = 0), take part alike;
3. the parallel combination of Chan, Golub and LeVeque (1979): n = sum n_r,
   mean = sum n_r m_r / n, M2 = sum M2_r + sum n_r (m_r - mean)^2: what
   ``batch_norm_gather_stats_with_counts`` computes from the gathered means and invstds;
4. running_mean <- (1 - f) running_mean + f mean and running_var <- (1 - f) running_var +
   f M2 / (n - 1) (the unbiased variance, as plain BatchNorm), with f the momentum, or
   1 / num_batches_tracked for ``momentum=None`` (``_BatchNorm.forward``'s rule);
5. y = (x - mean) / sqrt(M2 / n + eps) * weight + bias (the biased variance, as plain
   BatchNorm): ``batch_norm_elemt``.

Backward, one collective per layer (``batch_norm_backward_reduce`` then
``batch_norm_backward_elemt``): each rank sums sum_dy = sum dy and sum_dy_xmu =
sum dy (x - mean) over its rows; ONE ``all_reduce`` (SUM) of [sum_dy (C), sum_dy_xmu (C)];
then grad_input = (dy - sum_dy / n - (x - mean) invstd^2 sum_dy_xmu / n) invstd weight with
the global sums and count. grad_weight = invstd sum_dy_xmu and grad_bias = sum_dy are the
rank's *local* sums: DDP all-reduces parameter gradients (averaging them over ranks), as for
torch's class.

Cost per layer and training step: 2 collectives (an all_gather of (2C + 1) float64 values
per rank, an all_reduce of 2C float32 values) that block the forward and the backward pass
(they cannot overlap compute as DDP's gradient buckets do), plus the elementwise work of
plain BatchNorm in float32. ``eval()`` with running statistics, world size 1 and no
initialised process group use plain ``F.batch_norm`` and communicate nothing; like torch's
class, statistics are synchronized only in training mode (``eval()`` with
``track_running_stats=False`` normalises each rank by its own batch, so ranks that evaluate
different numbers of batches never wait on each other).

torch is imported at module import: this module runs inside the training program only;
``cpulaunch.distributed.convert_sync_batchnorm`` loads it on first use.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["SyncBatchNorm", "convert_sync_batchnorm"]


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype statistics are computed in: float64 for float64 input, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _channel_shape(x: torch.Tensor) -> list[int]:
    """Shape that broadcasts a (C,) vector against ``x`` (N, C, *): [1, C, 1, ...]."""
    return [1, x.shape[1]] + [1] * (x.dim() - 2)


def _reduce_dims(x: torch.Tensor) -> list[int]:
    """Every dim but the channel dim 1."""
    return [0] + list(range(2, x.dim()))


class _SyncBatchNormFunction(torch.autograd.Function):
    """Training-mode BatchNorm over a process group's global batch (see the module docs)."""

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps: float,
                factor: float, group) -> torch.Tensor:
        channels = input.shape[1]
        acc = _acc_dtype(input.dtype)
        x = input.to(acc)
        local_n = input.numel() // channels
        if local_n > 0:
            var, mean = torch.var_mean(x, dim=_reduce_dims(x), correction=0)
            m2 = var * local_n
        else:
            mean = m2 = torch.zeros(channels, dtype=acc)
        mine = torch.cat([torch.tensor([float(local_n)], dtype=torch.float64),
                          mean.to(torch.float64), m2.to(torch.float64)])
        parts = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, mine, group=group)
        table = torch.stack(parts)
        counts, means, m2s = table[:, :1], table[:, 1:channels + 1], table[:, channels + 1:]
        n = int(counts.sum().item())
        if n == 1:
            # BatchNorm's own check (F.batch_norm's _verify_batch_size), on the global batch.
            raise ValueError(
                "Expected more than 1 value per channel when training, got 1 over the "
                f"process group's global batch (this rank's input size {input.size()})")
        ctx.n = n
        ctx.group = group
        if n == 0:
            # Every rank's batch is empty: plain BatchNorm returns an empty output and
            # leaves the running statistics alone.
            ctx.save_for_backward(input, weight, mean, mean)
            return torch.empty_like(input)
        g_mean = (counts * means).sum(0) / n
        g_m2 = m2s.sum(0) + (counts * (means - g_mean) ** 2).sum(0)
        if running_mean is not None:
            running_mean.copy_((1 - factor) * running_mean.to(torch.float64) + factor * g_mean)
            running_var.copy_((1 - factor) * running_var.to(torch.float64)
                              + factor * g_m2 / (n - 1))
        mean, var = g_mean.to(acc), (g_m2 / n).to(acc)
        invstd = torch.rsqrt(var + eps)
        ctx.save_for_backward(input, weight, mean, invstd)
        if input.dtype == acc and all(t is None or t.dtype == acc for t in (weight, bias)):
            # The global statistics through CPU's native kernel (eval mode: no update).
            return F.batch_norm(input, mean, var, weight, bias, False, 0.0, eps)
        scale = invstd if weight is None else invstd * weight.to(acc)
        shift = -mean * scale
        if bias is not None:
            shift = shift + bias.to(acc)
        shape = _channel_shape(x)
        return torch.addcmul(shift.view(shape), x, scale.view(shape)).to(input.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        input, weight, mean, invstd = ctx.saved_tensors
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        channels = input.shape[1]
        acc = _acc_dtype(input.dtype)
        shape = _channel_shape(input)
        if input.numel() > 0:
            dy = grad_output.to(acc)
            xmu = input.to(acc) - mean.view(shape)
            dims = _reduce_dims(input)
            sum_dy = dy.sum(dims)
            sum_dy_xmu = (dy * xmu).sum(dims)
        else:
            sum_dy = sum_dy_xmu = torch.zeros(channels, dtype=acc)
        grad_weight = (sum_dy_xmu * invstd).to(weight.dtype) if need_weight else None
        grad_bias = sum_dy.to(weight.dtype) if need_bias else None
        grad_input = None
        if need_input:
            both = torch.cat([sum_dy, sum_dy_xmu])
            dist.all_reduce(both, op=dist.ReduceOp.SUM, group=ctx.group)
            if input.numel() == 0:
                grad_input = torch.zeros_like(input)
            else:
                mean_dy = (both[:channels] / ctx.n).view(shape)
                mean_dy_xmu = (both[channels:] / ctx.n).view(shape)
                scale = invstd if weight is None else invstd * weight.to(acc)
                grad_input = ((dy - mean_dy - xmu * (invstd * invstd).view(shape) * mean_dy_xmu)
                              * scale.view(shape)).to(input.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """BatchNorm whose training statistics span every rank of a process group; runs on CPU.

    A drop-in for ``torch.nn.SyncBatchNorm`` (same arguments, same buffers and parameters,
    so state dicts load both ways) whose synchronized path runs on CPU tensors over any
    backend that has ``all_gather`` and ``all_reduce`` (gloo, ccl). It subclasses
    ``_BatchNorm`` and *not* ``torch.nn.SyncBatchNorm``: DDP refuses any CPU model
    containing the latter.

    Args:
        num_features: C of an input (N, C, *) (any input with at least 2 dims).
        eps: added to the variance before the square root (default 1e-5).
        momentum: running-statistics factor (default 0.1); None: cumulative average over
            the batches seen (1 / num_batches_tracked).
        affine: learnable weight and bias (default True).
        track_running_stats: keep running_mean / running_var (default True); False: batch
            statistics in eval mode too (each rank's own: eval never communicates).
        process_group: the group whose ranks share statistics; None: the default group.
        device, dtype: of the parameters and buffers.
        bias: with ``affine``, whether there is a bias (torch 2.13's ``bias`` argument).

    Forward: in training mode, with ``torch.distributed`` initialised and the group's world
    size > 1, the global-batch statistics (module docs: one all_gather forward, one
    all_reduce backward); otherwise exactly ``torch.nn.BatchNorm*d``'s computation.

    Raises:
        ValueError: an input with fewer than 2 dims or 0 channels; in training, a global
            batch of 1 value per channel (BatchNorm's "Expected more than 1 value per
            channel when training", raised on every rank alike).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_group: Any = None, device=None, dtype=None, *, bias: bool = True
                 ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        if affine and not bias:
            self.register_parameter("bias", None)
        self.process_group = process_group

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")
        if input.size(1) == 0:
            raise ValueError("SyncBatchNorm number of input channels should be non-zero")

    def _sync_group(self):
        """The group to synchronize over in this training forward, or None for none."""
        if not (dist.is_available() and dist.is_initialized()):
            return None
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        return group if dist.get_world_size(group) > 1 else None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalise ``input`` (N, C, *); see the class docs for when ranks communicate."""
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        use_batch_stats = self.training or (self.running_mean is None
                                            and self.running_var is None)
        tracked = not self.training or self.track_running_stats
        running_mean = self.running_mean if tracked else None
        running_var = self.running_var if tracked else None
        group = self._sync_group() if self.training else None
        if group is None:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                                use_batch_stats, factor, self.eps)
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, running_mean,
                                            running_var, self.eps, factor, group)


def convert_sync_batchnorm(module: torch.nn.Module, process_group: Any = None
                           ) -> torch.nn.Module:
    """Replace every BatchNorm layer in ``module`` with :class:`SyncBatchNorm`, recursively.

    The rule of ``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` (torch 2.13), for CPU:
    every ``torch.nn.modules.batchnorm._BatchNorm`` (BatchNorm1d/2d/3d, torch's own
    SyncBatchNorm, and this module's) becomes a :class:`SyncBatchNorm` with the same
    num_features, eps, momentum, affine, bias and track_running_stats, that takes over the
    layer's very weight and bias ``Parameter`` objects (so their values, ``requires_grad``
    and an optimizer already holding them carry over) and its running_mean, running_var and
    num_batches_tracked buffers, its training flag and its ``qconfig`` if it has one. Call
    it before wrapping the model in DDP (``wrap_ddp(model, sync_batchnorm=True)`` does).

    Args:
        module: a model (modified in place) or a single BatchNorm layer.
        process_group: the group the layers synchronize over; None: the default group at
            forward time.

    Returns:
        ``module`` itself, with its BatchNorm children replaced; when ``module`` is itself a
        BatchNorm layer, the new :class:`SyncBatchNorm` instead.

    Raises:
        ValueError: a lazy BatchNorm whose size is not known yet (run one forward first).
    """
    out = module
    if isinstance(module, _BatchNorm):
        if getattr(module, "has_uninitialized_params", lambda: False)():
            raise ValueError(
                f"{type(module).__name__} has not inferred num_features yet; run one forward "
                "pass before convert_sync_batchnorm")
        out = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_group,
                            bias=module.bias is not None)
        if module.affine:
            out.weight = module.weight
            out.bias = module.bias
        out.running_mean = module.running_mean
        out.running_var = module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.training = module.training
        if hasattr(module, "qconfig"):
            out.qconfig = module.qconfig
    for name, child in module.named_children():
        out.add_module(name, convert_sync_batchnorm(child, process_group))
    return out
