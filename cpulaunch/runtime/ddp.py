"""The DDP optimizations users read about, one call away, with what works on CPU said plainly.

:func:`wrap_ddp` wraps a model in ``torch.nn.parallel.DistributedDataParallel`` with the
options that the PyTorch DDP documentation, the DDP communication hooks page
(https://docs.pytorch.org/docs/2.13/ddp_comm_hooks.html), Lightning's "DDP Optimizations"
page (https://lightning.ai/docs/pytorch/stable/advanced/ddp_optimizations.html) and the
PyTorch performance tuning guide
(https://docs.pytorch.org/tutorials/recipes/recipes/tuning_guide.html) recommend, using
torch's own hooks (``torch.distributed.algorithms.ddp_comm_hooks``). Those pages are written
for GPUs and NCCL; what happens on CPU with gloo in torch 2.13 was found by running every
option on 2 gloo ranks on this machine (tests/test_ddp_wrap.py does it again):

- ``none``: DDP's built-in all-reduce. Runs; exact.
- ``fp16``: ``default_hooks.fp16_compress_hook``. Runs.
- ``bf16``: ``default_hooks.bf16_compress_hook``. Runs, through a renamed delegate (below).
- ``powersgd``: ``powerSGD_hook.powerSGD_hook``. Runs once buckets are kept in order
  (below); ranks stay bit-identical; the warm-up steps equal plain DDP bit for bit.
- ``powersgd+fp16``: ``default_hooks.fp16_compress_wrapper(powerSGD_hook)``. Same.
- ``powersgd-batched``: ``powerSGD_hook.batched_powerSGD_hook``. Broken in torch 2.13 on
  every backend: refused at wrap time.
- ``post-local-sgd``: ``post_localSGD_hook`` + ``averagers.PeriodicModelAverager``. Runs,
  with subgroups made at wrap time (torch's default subgroup needs CUDA).

Found here, and turned into one-line errors at wrap time instead of crashes mid-training:

- DDP's ``register_comm_hook`` refuses ``bf16_compress_hook`` *by its function name* unless
  CUDA with NCCL >= 2.10 or XPU with XCCL is present ("BF16 all reduce communication hook
  required CUDA 11+ and NCCL 2.10+ ..."), although gloo all-reduces bfloat16 correctly in
  torch 2.13. :func:`wrap_ddp` checks that the process group really all-reduces bfloat16
  (:func:`check_allreduce_dtype`, one element) and then registers a delegate under another
  name that calls torch's ``bf16_compress_hook`` unchanged.
- ``batched_powerSGD_hook`` hands 2-D matrices to ``_orthogonalize``, which asserts 3-D
  since the batched rewrite (pytorch PR #75157): the first compressed step raises
  ``AssertionError`` inside backward. Refused when that assertion is still there.
- ``post_localSGD_hook`` with ``subgroup=None`` (the docs' and Lightning's example) calls
  ``dist.new_subgroups()`` at the first local step, which raises "Default group size only
  takes effect when CUDA is available" on CPU. :func:`wrap_ddp` creates the subgroups at wrap
  time from ``local_group_size``.
- ``powerSGD_hook`` issues its second and third all-reduce (P, then Q) from future
  callbacks, which under gloo run on the backend's threads in an order that differs between
  ranks when a step has more than one bucket: the ranks then hang, or abort with gloo's
  "Received data size doesn't match expected size ... collective mismatch" (seen here with
  6 buckets; one bucket is fine, and DDP's default 25 MB buckets give real models several).
  :func:`wrap_ddp` registers it behind :func:`_in_bucket_order`, which lets a bucket's
  compressed exchange start only after the previous bucket's has finished. Correct on every
  backend; the price is less overlap of communication with the backward pass.
- ``static_graph=True`` with ``no_sync()`` (gradient accumulation) hits
  ``expect_autograd_hooks_ INTERNAL ASSERT FAILED`` (pytorch/pytorch#143580; the fix under
  review, #187732, notes that past the assert it also stopped all-reducing). The wrapper's
  ``no_sync()`` raises a one-line error instead.

Nothing here imports torch at module import (the launcher never imports this module); torch
is imported inside the functions, in the training program.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Optional

from cpulaunch.errors import CpulaunchError

__all__ = [
    "COMM_HOOKS",
    "CommHook",
    "DDPOptionError",
    "DDPOptions",
    "check_allreduce_dtype",
    "gradient_payload_bytes",
    "init_process_group",
    "powersgd_payload_elements",
    "resolve_options",
    "wrap_ddp",
]


class DDPOptionError(CpulaunchError, ValueError):
    """A DDP option that is unknown, out of range, or that this backend / torch cannot run.

    ``str(exc)`` is one line: what was asked, why it cannot work, what to do instead.
    Raised at wrap time (or when ``no_sync()`` is entered), never mid-step.
    """


@dataclass(frozen=True)
class CommHook:
    """One ``comm_hook`` choice of :func:`wrap_ddp`, as data.

    Attributes:
        name: the value of ``comm_hook``.
        torch_hook: the torch object it registers (dotted name under
            ``torch.distributed.algorithms``), "" for DDP's built-in all-reduce.
        source: where users read about it.
        payload: what one synced step all-reduces per rank.
        memory: what it costs in memory beyond plain DDP.
        lossless: True when parameters equal plain DDP's bit for bit (2 ranks, gloo).
        cpu_gloo: what happens on CPU with gloo in torch 2.13 (measured here).
    """

    name: str
    torch_hook: str
    source: str
    payload: str
    memory: str
    lossless: bool
    cpu_gloo: str


_HOOKS_DOC = "PyTorch DDP communication hooks docs (docs.pytorch.org/docs/2.13/ddp_comm_hooks.html)"
_LIGHTNING = "Lightning 'DDP Optimizations' page"

#: Every ``comm_hook`` value :func:`wrap_ddp` accepts, in the order help text lists them.
COMM_HOOKS: dict[str, CommHook] = {h.name: h for h in (
    CommHook(
        name="none", torch_hook="",
        source="DistributedDataParallel's default",
        payload="every gradient element in its own dtype (4 bytes for fp32)",
        memory="the gradient buckets (about one gradient-sized buffer; with "
               "gradient_as_bucket_view=True the gradients live in them, no second copy)",
        lossless=True, cpu_gloo="runs; exact"),
    CommHook(
        name="fp16", torch_hook="ddp_comm_hooks.default_hooks.fp16_compress_hook",
        source=f"{_HOOKS_DOC}; {_LIGHTNING} (communication hooks)",
        payload="every gradient element as float16 (2 bytes): half of 'none'",
        memory="a transient float16 copy of one bucket at a time (half a bucket, "
               "bucket_cap_mb=25 by default)",
        lossless=False,
        cpu_gloo="runs; each gradient rounded to float16 (about 3 significant digits, "
                 "range +-65504: large gradients overflow to inf)"),
    CommHook(
        name="bf16", torch_hook="ddp_comm_hooks.default_hooks.bf16_compress_hook",
        source=f"{_HOOKS_DOC}; {_LIGHTNING}",
        payload="every gradient element as bfloat16 (2 bytes): half of 'none'",
        memory="a transient bfloat16 copy of one bucket at a time",
        lossless=False,
        cpu_gloo="runs (gloo all-reduces bfloat16) through a renamed delegate: DDP refuses "
                 "torch's hook by name without CUDA+NCCL>=2.10 or XPU+XCCL; about 2 "
                 "significant digits, fp32's range"),
    CommHook(
        name="powersgd", torch_hook="ddp_comm_hooks.powerSGD_hook.powerSGD_hook",
        source=f"{_HOOKS_DOC} (PowerSGD, arXiv:1905.13727); {_LIGHTNING}",
        payload="before start_powersgd_iter: as 'none'; then, per gradient viewed as an "
                "n x m matrix, (n + m) x rank elements if that is less than half of n x m, "
                "else n x m (biases and small tensors go uncompressed)",
        memory="error-feedback state the size of all the gradients (one fp32 tensor per "
               "bucket, kept for the whole run: +102 MB for a ResNet-50, +438 MB for "
               "BERT-base), a transient copy of each bucket during the hook, and the "
               "warm-start P and Q matrices ((n + m) x rank per compressed gradient)",
        lossless=False,
        cpu_gloo="runs with buckets kept in order (torch's hook alone hangs or aborts under "
                 "gloo with more than one bucket); ranks stay bit-identical; the warm-up "
                 "steps equal plain DDP"),
    CommHook(
        name="powersgd+fp16",
        torch_hook="ddp_comm_hooks.default_hooks.fp16_compress_wrapper(powerSGD_hook)",
        source=f"{_HOOKS_DOC} (fp16_compress_wrapper example); {_LIGHTNING} "
               "(ddp_comm_wrapper)",
        payload="as 'powersgd' in float16 (2 bytes per element), the warm-up steps too",
        memory="as 'powersgd', but the error feedback and the copies are float16 (half "
               "the size), plus the float16 copy of each bucket the wrapper makes",
        lossless=False,
        cpu_gloo="runs with buckets kept in order, as 'powersgd'; the warm-up steps are "
                 "fp16-compressed, not exact"),
    CommHook(
        name="powersgd-batched",
        torch_hook="ddp_comm_hooks.powerSGD_hook.batched_powerSGD_hook",
        source=_HOOKS_DOC,
        payload="the whole bucket padded to a square matrix, 2 x side x rank elements",
        memory="error feedback the size of the padded bucket, P and Q per bucket",
        lossless=False,
        cpu_gloo="refused: torch 2.13's batched_powerSGD_hook fails its own 3-D assertion "
                 "in _orthogonalize on its first compressed step, on any backend"),
    CommHook(
        name="post-local-sgd",
        torch_hook="ddp_comm_hooks.post_localSGD_hook.post_localSGD_hook + "
                   "model_averaging.averagers.PeriodicModelAverager",
        source=f"{_HOOKS_DOC} (post-local SGD, arXiv:1808.07217); {_LIGHTNING} "
               "(model_averaging_period)",
        payload="before warmup_steps: as 'none'; then gradients are all-reduced only "
                "within groups of local_group_size ranks (nothing with 1), and every "
                "local_sgd_period steps all parameters are averaged over all ranks",
        memory="a transient flat copy of all parameters at each averaging step",
        lossless=False,
        cpu_gloo="runs with subgroups made at wrap time (torch's default subgroup=None "
                 "needs CUDA); ranks drift apart between averaging steps"),
)}

#: Hooks whose payload is cast to 16-bit floats, and the dtype the backend must all-reduce.
_HALF_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "powersgd+fp16": "float16"}

#: torch's PowerSGDState default: compress only when it saves at least this factor.
_POWERSGD_MIN_COMPRESSION_RATE = 2

_PER_HOOK_OPTIONS = {
    "powersgd_rank": ("powersgd", "powersgd+fp16", "powersgd-batched"),
    "start_powersgd_iter": ("powersgd", "powersgd+fp16", "powersgd-batched"),
    "local_sgd_period": ("post-local-sgd",),
    "warmup_steps": ("post-local-sgd",),
    "local_group_size": ("post-local-sgd",),
}


@dataclass(frozen=True)
class DDPOptions:
    """The resolved options of one :func:`wrap_ddp` call (defaults filled in, checked).

    Attributes:
        comm_hook: a key of :data:`COMM_HOOKS`.
        static_graph: passed to DDP (None -> False, DDP's default).
        gradient_as_bucket_view: passed to DDP.
        powersgd_rank: PowerSGD ``matrix_approximation_rank`` (PowerSGD hooks only).
        start_powersgd_iter: PowerSGD ``start_powerSGD_iter``: synced steps of plain
            all-reduce before compression starts (>= 2, torch's rule with error feedback).
        local_sgd_period: post-local SGD: steps between parameter averagings (>= 1).
        warmup_steps: post-local SGD: steps of global gradient all-reduce before local
            SGD starts (``start_localSGD_iter`` and the averager's ``warmup_steps``).
        local_group_size: post-local SGD: ranks per gradient all-reduce group after the
            warm-up (1: each rank alone, no gradient communication at all).
    """

    comm_hook: str = "none"
    static_graph: bool = False
    gradient_as_bucket_view: bool = True
    powersgd_rank: Optional[int] = None
    start_powersgd_iter: Optional[int] = None
    local_sgd_period: Optional[int] = None
    warmup_steps: Optional[int] = None
    local_group_size: Optional[int] = None


#: Defaults of the per-hook options (torch's PowerSGDState defaults; Lightning's example
#: period of 4; the same 1000-step warm-up for post-local SGD as for PowerSGD).
_DEFAULTS = {"powersgd_rank": 1, "start_powersgd_iter": 1000, "local_sgd_period": 4,
             "warmup_steps": 1000, "local_group_size": 1}


def resolve_options(comm_hook: str = "none", *, static_graph: Optional[bool] = None,
                    gradient_as_bucket_view: bool = True, powersgd_rank: Optional[int] = None,
                    start_powersgd_iter: Optional[int] = None,
                    local_sgd_period: Optional[int] = None, warmup_steps: Optional[int] = None,
                    local_group_size: Optional[int] = None) -> DDPOptions:
    """Check :func:`wrap_ddp`'s options and fill in the defaults; pure, no torch.

    Per-hook options left None get their default (powersgd_rank 1, start_powersgd_iter
    1000, local_sgd_period 4, warmup_steps 1000, local_group_size 1) when the hook uses
    them, and stay None otherwise.

    Raises:
        DDPOptionError: unknown ``comm_hook``; a per-hook option given for a hook that does
            not use it (a typo would otherwise be ignored silently); a value out of range
            (``start_powersgd_iter`` < 2, ``powersgd_rank`` < 1, ``local_sgd_period`` < 1,
            ``warmup_steps`` < 0, ``local_group_size`` < 1).

    Example: ``resolve_options("powersgd", start_powersgd_iter=10)`` ->
    ``DDPOptions(comm_hook="powersgd", powersgd_rank=1, start_powersgd_iter=10, ...)``.
    """
    if comm_hook not in COMM_HOOKS:
        raise DDPOptionError(
            f"comm_hook {comm_hook!r} is not one of: {', '.join(COMM_HOOKS)}")
    given = {"powersgd_rank": powersgd_rank, "start_powersgd_iter": start_powersgd_iter,
             "local_sgd_period": local_sgd_period, "warmup_steps": warmup_steps,
             "local_group_size": local_group_size}
    values: dict[str, Optional[int]] = {}
    for name, value in given.items():
        users = _PER_HOOK_OPTIONS[name]
        if comm_hook not in users:
            if value is not None:
                raise DDPOptionError(
                    f"{name}={value} applies only to comm_hook "
                    f"{' / '.join(repr(u) for u in users)}, not {comm_hook!r}; drop it or "
                    f"choose one of those hooks")
            values[name] = None
            continue
        value = _DEFAULTS[name] if value is None else value
        if isinstance(value, bool) or not isinstance(value, int):
            raise DDPOptionError(f"{name} must be an integer, got {value!r}")
        values[name] = value
    _check_ranges(values)
    return DDPOptions(comm_hook=comm_hook, static_graph=bool(static_graph),
                      gradient_as_bucket_view=bool(gradient_as_bucket_view), **values)


def _check_ranges(v: dict[str, Optional[int]]) -> None:
    """Range checks of the per-hook options that are set (see :func:`resolve_options`)."""
    if v["start_powersgd_iter"] is not None and v["start_powersgd_iter"] < 2:
        # torch's PowerSGDState rule: error feedback and warm start need two plain steps,
        # because DDP rebuilds its buckets after the first one.
        raise DDPOptionError(
            f"start_powersgd_iter={v['start_powersgd_iter']}: PowerSGD needs at least 2 "
            "plain all-reduce steps first (DDP rebuilds its buckets after step 1); use 2 or "
            "more (PyTorch suggests about 10% of the training steps)")
    for name, low in (("powersgd_rank", 1), ("local_sgd_period", 1), ("warmup_steps", 0),
                      ("local_group_size", 1)):
        if v[name] is not None and v[name] < low:
            raise DDPOptionError(f"{name} must be at least {low}, got {v[name]}")


def powersgd_payload_elements(shape: tuple[int, ...], rank: int,
                              min_compression_rate: int = _POWERSGD_MIN_COMPRESSION_RATE) -> int:
    """Elements PowerSGD all-reduces for one gradient of ``shape`` once compression is on.

    torch's rule (``powerSGD_hook._should_compress``, documented on ``PowerSGDState``): the
    gradient is viewed as an ``n x m`` matrix (``n = shape[0]``, ``m`` = the rest; a 1-D
    tensor is ``n x 1``), the rank is clamped to ``r = min(n, m, rank)``, and it is
    compressed into P (``n x r``) and Q (``m x r``) when ``(n + m) * r *
    min_compression_rate < n * m``; otherwise it is all-reduced whole.

    Examples: ``(64, 32), rank 1 -> 96``; ``(64,) -> 64`` (a bias is never compressed);
    ``(4, 4), rank 1 -> 16`` (8 x 2 is not below 16).
    """
    n = shape[0] if shape else 1
    m = 1
    for d in shape[1:]:
        m *= d
    r = min(n, m, rank)
    if (n + m) * r * min_compression_rate < n * m:
        return (n + m) * r
    return n * m


def gradient_payload_bytes(options: DDPOptions, param_shapes: list[tuple[tuple[int, ...], int]],
                           step: int) -> int:
    """Bytes this rank hands to all-reduce in synced step ``step`` (0-based), by the rules of
    the hook: computed analytically from the parameters' shapes, not measured.

    Args:
        options: resolved options (:func:`resolve_options`).
        param_shapes: ``(shape, element size in bytes)`` of every parameter DDP reduces
            (``requires_grad`` ones), e.g. ``[((64, 32), 4), ((64,), 4)]``.
        step: index of the synced backward pass (optimizer step with one all-reduce).

    What is counted: the gradient payload of the hook (for PowerSGD the uncompressed
    tensors plus P plus Q, which is also what ``PowerSGDState.compression_stats()`` counts)
    and, for post-local SGD, the parameters averaged on an averaging step. Not counted: the
    one-time broadcast of parameters at wrap time, DDP's per-step buffer broadcast
    (``broadcast_buffers=True``, e.g. BatchNorm statistics), and the backend's own traffic.
    A ring all-reduce sends about ``2 (N - 1) / N`` times the payload per rank over the wire
    (``N`` ranks); gloo picks its algorithm by size.

    Example: a Linear(32, 64) in fp32, ``comm_hook="fp16"``: ``(2048 + 64) x 2 = 4224``.
    """
    numel = [_numel(s) for s, _ in param_shapes]
    full = sum(n * es for n, (_, es) in zip(numel, param_shapes))
    hook = options.comm_hook
    if hook == "none":
        return full
    if hook in ("fp16", "bf16"):
        return 2 * sum(numel)
    if hook in ("powersgd", "powersgd+fp16"):
        half = hook == "powersgd+fp16"
        if step < options.start_powersgd_iter:
            return 2 * sum(numel) if half else full
        elems = [powersgd_payload_elements(s, options.powersgd_rank) for s, _ in param_shapes]
        return sum(e * (2 if half else es) for e, (_, es) in zip(elems, param_shapes))
    if hook == "post-local-sgd":
        if step < options.warmup_steps:
            return full
        grads = 0 if options.local_group_size == 1 else full
        averaging = (step - options.warmup_steps) % options.local_sgd_period == 0
        return grads + (full if averaging else 0)
    raise DDPOptionError(f"no payload rule for comm_hook {hook!r}")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def check_allreduce_dtype(dtype, process_group=None) -> None:
    """Check that the backend all-reduces ``dtype`` by doing it: a one-element all-reduce.

    Collective: every rank of ``process_group`` (default: the world) must call it. gloo in
    torch 2.13 all-reduces float16 and bfloat16 (measured here) but not e.g. float8; a
    backend that cannot fails on every rank alike, before any training step.

    Args:
        dtype: a ``torch.dtype``.
        process_group: the group the hook will use; None for the default group.

    Raises:
        DDPOptionError: the all-reduce raised (the backend's message is quoted).
    """
    import torch
    import torch.distributed as dist

    t = torch.ones(1, dtype=dtype)
    try:
        dist.all_reduce(t, group=process_group)
    except (RuntimeError, TypeError, ValueError) as exc:
        backend = dist.get_backend(process_group)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DDPOptionError(
            f"backend {backend!r} cannot all-reduce {dtype} ({first}); use a hook that "
            "communicates in float32 (comm_hook 'none' or 'powersgd')") from None
    size = dist.get_world_size(process_group)
    if t.float().item() != float(size):
        raise DDPOptionError(
            f"backend {dist.get_backend(process_group)!r} all-reduced {dtype} wrongly "
            f"(1 summed over {size} ranks gave {t.float().item()}); use comm_hook 'none'")


def _batched_powersgd_broken() -> Optional[str]:
    """Why torch's ``batched_powerSGD_hook`` cannot run here, or None if it can.

    The hook orthogonalises a 2-D ``side x rank`` matrix with ``_orthogonalize``, which
    asserts a 3-D batch since pytorch PR #75157. Probed on a 2x1 matrix (local, no
    communication); a torch without the private function is given the benefit of the doubt.
    """
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    ortho = getattr(powerSGD_hook, "_orthogonalize", None)
    if ortho is None:
        return None
    try:
        ortho(torch.ones(2, 1))
    except AssertionError:
        return (f"torch {torch.__version__}'s batched_powerSGD_hook passes 2-D matrices to "
                "_orthogonalize, which asserts 3-D, so it fails on its first compressed step")
    return None


def _bf16_compress_delegate(state, bucket):
    """torch's ``bf16_compress_hook``, called unchanged under a name that DDP's
    registration check (written for NCCL) does not refuse; used only after
    :func:`check_allreduce_dtype` showed that the backend all-reduces bfloat16."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.bf16_compress_hook(state, bucket)


def _in_bucket_order(hook):
    """``hook`` (a PowerSGD hook) made safe with several buckets per step on gloo.

    torch's ``powerSGD_hook`` all-reduces the uncompressed tensors, then P inside a callback
    of that future, then Q inside a callback of the next: under gloo those callbacks run on
    the backend's threads, so with several buckets in flight the ranks can issue the P and Q
    all-reduces of different buckets in different orders (a hang, or gloo's "collective
    mismatch" abort). The returned hook waits, before compressing a bucket, until the
    previous bucket's compressed exchange has completed, so every rank issues the same
    collectives in the same order. Plain all-reduce steps (before ``start_powerSGD_iter``)
    are issued from the backward pass in bucket order already and are not held back.
    """
    pending = []

    def powerSGD_hook_in_bucket_order(state, bucket):
        if pending:
            pending.pop().wait()
        compressing = state.iter >= state.start_powerSGD_iter
        fut = hook(state, bucket)
        if compressing:
            pending.append(fut)
        return fut

    return powerSGD_hook_in_bucket_order


_WRAPPED_CLASS = None


class _WrappedMixin:
    """What :func:`wrap_ddp` adds to ``DistributedDataParallel`` (the class it returns is
    ``WrappedDDP(_WrappedMixin, DistributedDataParallel)``, made at first use so that
    importing this module imports no torch).

    Attributes (besides DDP's own):
        ddp_options: the resolved :class:`DDPOptions`.
        comm_hook_state: the hook's state (``PowerSGDState``, ``PostLocalSGDState``) or
            None; PowerSGD's ``compression_stats()`` lives there.
        averager: the ``PeriodicModelAverager`` of post-local SGD, else None.
    """

    def no_sync(self):
        """DDP's ``no_sync()`` (skip the all-reduce of this backward: gradient
        accumulation, as the tuning guide advises), refused under ``static_graph=True``.

        Raises:
            DDPOptionError: static_graph is on (pytorch/pytorch#143580: the first
                backward inside ``no_sync()`` hits ``expect_autograd_hooks_ INTERNAL
                ASSERT FAILED``, and past it gradients stop being all-reduced).
        """
        if self.static_graph:
            raise DDPOptionError(
                "no_sync() with static_graph=True fails in torch 2.13 (internal assert, "
                "then gradients no longer all-reduced: pytorch/pytorch#143580); wrap "
                "with static_graph=False to accumulate gradients")
        return super().no_sync()

    def after_step(self) -> bool:
        """Call once per optimizer step, after ``optimizer.step()`` and before
        ``optimizer.zero_grad(set_to_none=True)``: the model-averaging step of post-local
        SGD (``PeriodicModelAverager.average_parameters``); a no-op for other hooks.

        Returns True when parameters were averaged over all ranks in this call (then
        every rank holds the same parameters).

        Raises:
            DDPOptionError: an averaging step found no gradients (torch averages only
                parameters whose ``.grad`` is set, so after ``zero_grad(set_to_none=
                True)`` it would silently average nothing and ranks would drift apart).
        """
        avg = self.averager
        if avg is None:
            return False
        due = avg.step >= avg.warmup_steps and (avg.step - avg.warmup_steps) % avg.period == 0
        if due and all(p.grad is None for p in self.module.parameters() if p.requires_grad):
            raise DDPOptionError(
                "after_step() found no gradients to average: call it after "
                "optimizer.step() and before optimizer.zero_grad(set_to_none=True)")
        avg.average_parameters(self.module.parameters())
        return due

    def comm_bytes(self, step: int) -> int:
        """Bytes this rank hands to all-reduce in synced step ``step`` (0-based):
        :func:`gradient_payload_bytes` for this model's parameters (analytic)."""
        shapes = [(tuple(p.shape), p.element_size())
                  for p in self.module.parameters() if p.requires_grad]
        return gradient_payload_bytes(self.ddp_options, shapes, step)


def _wrapped_class():
    """The DistributedDataParallel subclass :func:`wrap_ddp` returns (made on first use so
    that importing this module does not import torch)."""
    global _WRAPPED_CLASS
    if _WRAPPED_CLASS is None:
        from torch.nn.parallel import DistributedDataParallel

        _WRAPPED_CLASS = type("WrappedDDP", (_WrappedMixin, DistributedDataParallel),
                              {"__doc__": _WrappedMixin.__doc__, "__module__": __name__})
    return _WRAPPED_CLASS


def wrap_ddp(model, *, static_graph: Optional[bool] = None, gradient_as_bucket_view: bool = True,
             comm_hook: str = "none", powersgd_rank: Optional[int] = None,
             start_powersgd_iter: Optional[int] = None, local_sgd_period: Optional[int] = None,
             warmup_steps: Optional[int] = None, local_group_size: Optional[int] = None,
             process_group=None, sync_batchnorm: bool = False, **ddp_kwargs: Any):
    """Wrap ``model`` in DistributedDataParallel with the options below and torch's own hook.

    Collective, like DDP's constructor: every rank calls it with the same arguments, after
    ``torch.distributed.init_process_group``. Option checks that need no communication run
    first, so a bad option fails on every rank before any collective.

    Args:
        model: the ``torch.nn.Module`` (on CPU).
        static_graph: DDP's ``static_graph`` (None: DDP's default, False). True tells DDP that
            the set of used parameters and the graph never change between steps (PyTorch
            1.11 release notes; Lightning's "DDP Static Graph"); it costs no memory, but
            ``no_sync()`` then raises :class:`DDPOptionError` (pytorch/pytorch#143580).
        gradient_as_bucket_view: DDP's option, default True here (DDP's default is False):
            gradients become views into the all-reduce buckets, which saves one
            gradient-sized copy and a copy per step (DDP docs; Lightning's "Gradient as
            Bucket View"). Lossless. Do not ``detach_()`` gradients under it.
        comm_hook: one of :data:`COMM_HOOKS` ("none", "fp16", "bf16", "powersgd",
            "powersgd+fp16", "powersgd-batched", "post-local-sgd"); each entry says where it
            comes from, what it sends and what it costs in memory. Compression saves
            bandwidth between machines; on one machine the ranks talk through shared memory
            and loopback, so it mostly adds casting work.
        powersgd_rank: PowerSGD ``matrix_approximation_rank`` (default 1; PyTorch suggests
            1, 2, 4, ... until accuracy is good enough).
        start_powersgd_iter: PowerSGD ``start_powerSGD_iter`` (default 1000, torch's; PyTorch
            suggests about 10% of the training steps; at least 2). Steps before it are plain
            all-reduces, bit-identical to comm_hook "none" ("powersgd" only: the fp16 wrapper
            casts those steps too).
        local_sgd_period: post-local SGD: average parameters over all ranks every this many
            steps after the warm-up (default 4, Lightning's example).
        warmup_steps: post-local SGD: steps of plain global all-reduce first (default 1000).
        local_group_size: post-local SGD: after the warm-up, gradients are all-reduced within
            groups of this many consecutive ranks (default 1: no gradient communication, pure
            local SGD). torch's default (``subgroup=None``, one group per machine) needs CUDA
            and on one machine would all-reduce everything anyway. Must divide world size.
        process_group: the group DDP and the hooks use (None: the default group).
        sync_batchnorm: first replace every BatchNorm layer of ``model`` with
            :class:`cpulaunch.runtime.syncbn.SyncBatchNorm`
            (:func:`cpulaunch.runtime.syncbn.convert_sync_batchnorm`, over
            ``process_group``): training-mode statistics over the global batch of all
            ranks, on CPU, at 2 collectives per BatchNorm layer per step (docs/guide/training.md).
            Default False: each rank normalises by its own shard, as plain DDP does.
            ``torch.nn.SyncBatchNorm`` itself cannot be used: DDP refuses it on CPU.
        **ddp_kwargs: passed to DDP unchanged (``bucket_cap_mb``, ``find_unused_parameters``,
            ``broadcast_buffers``, ...).

    Returns:
        A ``torch.nn.parallel.DistributedDataParallel`` subclass instance with, in addition:
        ``no_sync()`` that refuses static_graph, ``after_step()`` (call after every
        ``optimizer.step()``; averages parameters for post-local SGD), ``comm_bytes(step)``
        (bytes all-reduced in that step, analytic), ``ddp_options``, ``comm_hook_state``
        (e.g. PowerSGD's ``compression_stats()``), ``averager``.

    Raises:
        DDPOptionError: see :func:`resolve_options`; "powersgd-batched" on a torch whose
            batched hook is broken (2.13); numpy missing for PowerSGD; ``local_group_size``
            not dividing the world size; a backend that cannot all-reduce the 16-bit dtype
            of "fp16" / "bf16" / "powersgd+fp16" (:func:`check_allreduce_dtype`).
    """
    options = resolve_options(
        comm_hook, static_graph=static_graph, gradient_as_bucket_view=gradient_as_bucket_view,
        powersgd_rank=powersgd_rank, start_powersgd_iter=start_powersgd_iter,
        local_sgd_period=local_sgd_period, warmup_steps=warmup_steps,
        local_group_size=local_group_size)
    _check_locally(options, process_group)

    if sync_batchnorm:
        from cpulaunch.runtime.syncbn import convert_sync_batchnorm

        model = convert_sync_batchnorm(model, process_group)
    cls = _wrapped_class()
    ddp = cls(model, static_graph=options.static_graph,
              gradient_as_bucket_view=options.gradient_as_bucket_view,
              process_group=process_group, **ddp_kwargs)
    ddp.ddp_options = options
    ddp.comm_hook_state = None
    ddp.averager = None
    if options.comm_hook in _HALF_DTYPES:
        import torch
        check_allreduce_dtype(getattr(torch, _HALF_DTYPES[options.comm_hook]), process_group)
    _register(ddp, options, process_group)
    return ddp


def _check_locally(options: DDPOptions, process_group) -> None:
    """Checks that need torch but no communication, so every rank fails alike up front."""
    hook = options.comm_hook
    if hook == "powersgd-batched":
        why = _batched_powersgd_broken()
        if why:
            raise DDPOptionError(f"comm_hook 'powersgd-batched': {why}; use 'powersgd'")
    if hook.startswith("powersgd"):
        try:
            import numpy  # noqa: F401  (PowerSGDState seeds its generator with numpy)
        except ImportError:
            raise DDPOptionError(
                f"comm_hook {hook!r} needs numpy (torch's PowerSGDState uses "
                "numpy.random); pip install numpy") from None
    if hook == "post-local-sgd":
        import torch.distributed as dist

        size = dist.get_world_size(process_group)
        if size % options.local_group_size:
            raise DDPOptionError(
                f"local_group_size={options.local_group_size} does not divide the world size "
                f"{size}; use a divisor of {size} (1: pure local SGD)")


def _register(ddp, options: DDPOptions, process_group) -> None:
    """Register torch's hook for ``options.comm_hook`` on ``ddp`` and keep its state."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    hook = options.comm_hook
    if hook == "none":
        return
    if hook == "fp16":
        ddp.register_comm_hook(process_group, default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        ddp.register_comm_hook(process_group, _bf16_compress_delegate)
    elif hook.startswith("powersgd"):
        state = powerSGD_hook.PowerSGDState(
            process_group=process_group, matrix_approximation_rank=options.powersgd_rank,
            start_powerSGD_iter=options.start_powersgd_iter)
        fn = {"powersgd": powerSGD_hook.powerSGD_hook,
              "powersgd+fp16": default_hooks.fp16_compress_wrapper(powerSGD_hook.powerSGD_hook),
              "powersgd-batched": powerSGD_hook.batched_powerSGD_hook}[hook]
        ddp.register_comm_hook(state, _in_bucket_order(fn))
        ddp.comm_hook_state = state
    elif hook == "post-local-sgd":
        _register_post_local_sgd(ddp, options, process_group)


def _register_post_local_sgd(ddp, options: DDPOptions, process_group) -> None:
    """post_localSGD_hook with an explicit subgroup (or none), plus its averager."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook
    from torch.distributed.algorithms.model_averaging import averagers

    subgroup = None
    if options.local_group_size > 1:
        # Collective: every rank creates every subgroup (new_subgroups' contract).
        subgroup, _ = dist.new_subgroups(group_size=options.local_group_size,
                                         group=process_group)
    state = post_localSGD_hook.PostLocalSGDState(
        process_group=process_group, subgroup=subgroup,
        start_localSGD_iter=options.warmup_steps,
        # With groups of 1 there is nothing to all-reduce locally: skip it (the hook then
        # returns the local gradient as is).
        post_local_gradient_allreduce=options.local_group_size > 1)
    ddp.register_comm_hook(state, post_localSGD_hook.post_localSGD_hook)
    ddp.comm_hook_state = state
    with warnings.catch_warnings():
        # torch warns for period 1 (averaging every step costs as much as DDP); allowed.
        warnings.simplefilter("ignore", UserWarning)
        ddp.averager = averagers.PeriodicModelAverager(
            period=options.local_sgd_period, warmup_steps=options.warmup_steps,
            process_group=process_group)


def init_process_group(backend: str | None = None, **kwargs):
    """Initialise ``torch.distributed`` for a rank started by cpulaunch (or torchrun, mpirun, srun).

    Args:
        backend: "gloo" or "ccl"; default: ``$CPULAUNCH_DIST_BACKEND``, else "gloo".
        **kwargs: passed on to ``torch.distributed.init_process_group`` (e.g. ``timeout``).

    The rendezvous is ``env://``: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT must be set
    (cpulaunch --ddp sets them for every engine it supports). With "ccl" the
    ``oneccl_bindings_for_pytorch`` module is imported first, which registers the backend.

    It also registers an exit handler (:func:`cpulaunch.runtime.exithook.install`) that
    destroys the default process group before the interpreter finalizes when the program
    has not (and did not end with an uncaught exception): without it a gloo rank sometimes
    aborts at exit with "terminate called without an active exception"
    (pytorch#190489). Registered after the group exists, it runs before the exit handlers
    registered earlier; calling ``destroy_process_group()`` yourself stays right.

    Returns the backend name used.

    Raises:
        RuntimeError: backend "ccl" asked for but ``oneccl_bindings_for_pytorch`` cannot be
            imported (Intel's index has builds up to torch 2.8 only: build it against this
            torch, docs/guide/ddp.md "oneCCL", or use gloo).
    """
    import torch.distributed as dist

    from cpulaunch import envvars

    backend = backend or os.environ.get(envvars.DIST_BACKEND) or "gloo"
    if backend == "ccl":
        try:
            import oneccl_bindings_for_pytorch  # noqa: F401  (registers the "ccl" backend)
        except ImportError as exc:  # pragma: no cover - not installable here
            raise RuntimeError(
                "backend 'ccl' needs oneccl_bindings_for_pytorch, which failed to import "
                f"({exc}); install it built for this torch or run with --backend gloo"
            ) from exc
    kwargs.setdefault("init_method", "env://")
    dist.init_process_group(backend=backend, **kwargs)
    from cpulaunch.runtime import exithook

    exithook.install()
    return backend
