"""Automatic mixed precision on CPU: the GPU recipe's ``autocast()`` + ``GradScaler`` in its
CPU form, used where it pays and refused in one line where it does not.

The PyTorch training article's AMP step is ``with torch.cuda.amp.autocast(): ...`` with a
``torch.cuda.amp.GradScaler`` around backward and step. On CPU:

- the autocast is ``torch.autocast("cpu", dtype=torch.bfloat16)`` (torch's "Automatic Mixed
  Precision" docs: CPU autocast supports bfloat16; float16 on CPU is slower still);
- no GradScaler: loss scaling exists because float16's 5-bit exponent lets small gradients
  underflow; bfloat16 keeps float32's 8-bit exponent, so there is nothing to scale (the AMP
  examples use the scaler with float16 only);
- it is fast only where the CPU computes in bf16: ``avx512_bf16`` or ``amx_bf16`` on x86,
  ``bf16`` on aarch64 (:class:`cpulaunch.runtime.inference.Bf16Support`). Elsewhere oneDNN
  emulates bf16 with conversions: this project's DDP benchmark measured bf16 autocast at
  :data:`EMULATED_SPEED` of fp32's samples/s (cnn, 2 gloo ranks, on an AVX2-only AMD EPYC,
  docs/guide/training.md), so :func:`cpu_autocast` refuses it there instead of running 11x
  slower.

torch is imported inside the function, never at module import.
"""

from __future__ import annotations

from typing import Optional

from cpulaunch.errors import CpulaunchError

__all__ = ["AmpError", "EMULATED_SPEED", "amp_refusal", "cpu_autocast"]

#: bf16 autocast's samples/s as a fraction of fp32's where bf16 is emulated: 0.089, measured
#: by ``scripts/bench_ddp.py --options`` (variant bf16-autocast) on 2026-11-22 on a 2-vCPU
#: AMD EPYC without avx512_bf16 or AMX (docs/guide/training.md, "DDP options measured").
EMULATED_SPEED = 0.089


class AmpError(CpulaunchError, ValueError):
    """bf16 autocast was asked for (``--amp``) on a CPU where it would be emulated; the
    message is one line saying so and what to do."""


def amp_refusal(support) -> Optional[str]:
    """The one-line reason ``--amp`` is refused for a CPU with bf16 support ``support``
    (:class:`cpulaunch.runtime.inference.Bf16Support`), or None when it computes in bf16
    (NATIVE). Pure."""
    from cpulaunch.runtime.inference import Bf16Support

    if support is Bf16Support.NATIVE:
        return None
    if support is Bf16Support.UNKNOWN:
        why = "cannot tell from /proc/cpuinfo whether this CPU computes in bf16"
    else:
        why = "this CPU has no bf16 instructions (neither avx512_bf16 nor amx_bf16 in /proc/cpuinfo)"
    return (f"--amp: {why}, so bf16 autocast would be emulated: it trained at {EMULATED_SPEED:.2f}x "
            "fp32's speed on an AVX2-only CPU; drop --amp to train in fp32, or "
            "pass --bf16 to force bf16 autocast")


def cpu_autocast(enabled: bool = True, *, cpuinfo_path: str = "/proc/cpuinfo"):
    """The CPU form of ``torch.cuda.amp.autocast()``: a context manager for the forward pass
    and the loss.

    Args:
        enabled: False gives a context that does nothing (fp32), so a training loop can
            keep one ``with`` whatever ``--amp`` says.
        cpuinfo_path: where the CPU's flags are read (:func:`cpulaunch.runtime.inference.host_bf16_support`).

    Returns:
        ``torch.autocast("cpu", dtype=torch.bfloat16)`` when enabled on a CPU that computes
        in bf16; ``contextlib.nullcontext()`` when not enabled. No GradScaler is needed
        with it (module doc).

    Raises:
        AmpError: enabled on a CPU without native bf16 (:func:`amp_refusal`).
    """
    from contextlib import nullcontext

    if not enabled:
        return nullcontext()
    from cpulaunch.runtime.inference import host_bf16_support

    refusal = amp_refusal(host_bf16_support(cpuinfo_path))
    if refusal:
        raise AmpError(refusal)
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16)
