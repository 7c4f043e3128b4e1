"""The inference path: run a model through oneDNN Graph (TorchScript), inductor, zentorch or eager.

``optimize(model, example_inputs)`` returns an :class:`OptimizedModel`, a callable wrapper
that says which path it took (``.path``) and what it measured (``.report``).

Paths (``PATHS``):

- ``"onednn-graph"``: ``torch.jit.enable_onednn_fusion(True)``, ``torch.jit.trace``,
  ``torch.jit.freeze``, then warm-up runs with the example shapes (the fusion is compiled on
  the first runs; PyTorch performance tuning guide, "Use oneDNN Graph with TorchScript for
  inference"). bf16 is traced under ``torch.autocast("cpu", torch.bfloat16)`` with the JIT
  autocast pass off (``torch._C._jit_set_autocast_mode(False)``), as the same guide shows;
  the casts are then part of the traced graph. TorchScript is deprecated from torch 2.13:
  this path still works (2.13-2.15), its deprecation warnings (DeprecationWarning in 2.13,
  FutureWarning from 2.14) are silenced inside this module and the report says so once in
  ``notes``. The model is traced through a thin wrapper that
  takes the flattened tensor inputs (positional and keyword) and returns the flattened
  tensor outputs (``torch.utils._pytree``), so keyword inputs and outputs that are dicts,
  tuples, lists or namedtuples of tensors (``None`` allowed) work and come back in their
  own structure.
- ``"inductor"``: ``torch.compile(model, options={"freezing": True})`` (inductor freezing
  folds the weights into the compiled graph as constants; without it inductor was slower
  than eager at batch 1 here) called in inference mode.
- ``"zentorch"``: ``torch.compile(model, backend=<zentorch's backend>, dynamic=False)``
  called under ``torch.no_grad()``: AMD's extension for EPYC (``pip install zentorch``)
  replaces Linear layers, attention and their fused epilogues with ZenDNN kernels and
  prepacks the weights. ZenDNN's guide asks for inductor freezing
  (``TORCHINDUCTOR_FREEZING=1``); here it is set for zentorch's own calls only
  (:func:`zentorch_settings`), as the inductor path does with ``options=``. zentorch's
  backend also sets inductor's process-global ``joint_custom_post_pass`` to its own graph
  pass, which would then run inside every later inductor compile of the process: this
  module sets both around each call of the zentorch model (inductor compiles the graph
  lazily, at the first call and at each recompile) and restores the previous values after
  it, so the inductor path and the user's own ``torch.compile`` calls stay untouched;
  ``auto`` builds zentorch last besides. Importing
  zentorch cannot be undone (it registers its ops and its backend), and costs 2.5-6 s
  here. zentorch 2.14.0.1 imports only with torch 2.14.x (its wheel checks the minor
  release): whether it imports is checked once in a child process
  (:func:`cpulaunch.machine.host.zentorch_binding`, the verdict cached), so a refused
  version is one note in ``auto`` (the other paths run) and one line from an explicit
  ``path="zentorch"`` (:class:`UnsupportedModelError`), never an import in this process.
- ``"eager"``: ``model.eval()`` under ``torch.inference_mode()``.
- ``"auto"``: build each candidate path, check its outputs against eager, time them
  interleaved, keep the fastest one whose outputs match. Progress goes to stderr, one line
  per candidate (``progress=False`` silences it). zentorch is a candidate where it imports
  (checked as above); where it is installed but refused, a note says why.

For every path the model is first copied (the caller's model is never changed), put in eval
mode, Conv+BatchNorm pairs are folded with ``torch.fx.experimental.optimization.fuse``
(skipped quietly, with a note, when fx cannot trace the model), and, for models with
``Conv2d`` and 4-D inputs, the model and its 4-D inputs are made ``channels_last`` (the
tuning guide's advice for CNNs on CPU). bf16 runs under CPU autocast.

bf16 and the CPU: oneDNN runs bf16 only where the ISA has it (see :class:`Bf16Support`,
read from /proc/cpuinfo by :func:`bf16_support`); on an AVX2-only x86 CPU oneDNN Graph
fuses no bf16 op, and the report says so in ``notes``.

Global state: torch's oneDNN fusion flag and JIT autocast mode are process-global. This
module sets them only for the duration of its own calls (building, warm-up, and each call
of an onednn-graph :class:`OptimizedModel`) and restores the previous values afterwards,
so nothing is left changed. (Not thread-safe: two threads calling at once may see each
other's flag; the flag is only read when TorchScript optimises a graph.)

torch is imported inside functions only: ``import cpulaunch.inference`` stays cheap, so
the launcher can use ``PATHS`` and ``INFERENCE_PATH_ENV`` (e.g. as click choices).
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import time
import warnings
from typing import (
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

from cpulaunch import envvars
from cpulaunch.enums import Enum
from cpulaunch.errors import CpulaunchError
from cpulaunch.machine.probe import parse_cpuinfo

#: Environment variable naming the path ``optimize(path=None)`` takes; ``cpulaunch
#: --inference-path`` sets it for the program it launches.
INFERENCE_PATH_ENV = envvars.INFERENCE_PATH

#: Every value ``optimize(path=...)`` and ``$CPULAUNCH_PLANNED_INFERENCE_PATH`` accept
#: (``cpulaunch --inference-path`` takes the same: :data:`cpulaunch.option_table.INFERENCE_PATHS`).
PATHS = ("onednn-graph", "inductor", "zentorch", "eager", "auto")

#: The concrete paths, in the order ``auto`` tries them (zentorch last: see the module doc).
CONCRETE_PATHS = ("eager", "onednn-graph", "inductor", "zentorch")

#: Path taken by ``optimize(path=None)`` when ``$CPULAUNCH_PLANNED_INFERENCE_PATH`` is unset or empty.
DEFAULT_PATH = "auto"

#: Categories of TorchScript's "`torch.jit.X` is deprecated" warnings: DeprecationWarning
#: in torch 2.13, FutureWarning from 2.14 (shown by Python's default filters); silenced
#: inside cpulaunch's own calls only (:func:`_quiet_torchscript`).
TORCHSCRIPT_WARNINGS = (DeprecationWarning, FutureWarning)

#: Data types accepted (also as torch.float32 / torch.bfloat16, "float32", "bfloat16").
DTYPES = ("fp32", "bf16")

#: Output agreement with eager: a path matches when, over every output tensor,
#: ``max|out - ref| <= tol * max(max|ref|, 1e-6)``, ``ref`` being the fp32 eager output of
#: the unmodified model (for bf16 too: the answer the model is meant to give).
#: fp32: ``tol = TOLERANCES["fp32"] = 1e-3`` (kernel choice, Conv+BN folding and fused
#: epilogues reorder float sums; seen here: up to 2e-5 on the full ResNet-50-like model).
#: bf16: ``tol = max(TOLERANCES["bf16"], BF16_ERROR_FACTOR * e)`` where ``e`` is the same
#: relative error of eager under CPU autocast bf16: a bf16 path must be about as accurate
#: as eager bf16 is, which depends on the model (seen here: e = 0.5% on the BERT-like
#: model, 11% on the random-weight ResNet-50-like one, where the bf16 paths differ from each
#: other by as much). The check catches wrong results, not rounding.
TOLERANCES = {"fp32": 1e-3, "bf16": 5e-2}
#: See :data:`TOLERANCES`.
BF16_ERROR_FACTOR = 2.0

TORCHSCRIPT_NOTE = (
    "onednn-graph is built on TorchScript (torch.jit.trace/freeze), which torch 2.13 "
    "deprecates in favour of torch.compile/torch.export; it still works, and its "
    "deprecation warnings are silenced inside cpulaunch.inference"
)

#: The start of the note a bf16 report carries on a CPU without bf16 support in oneDNN
#: (x86 wording; aarch64 names its ``bf16`` feature instead).
BF16_NO_FUSION_NOTE = "bf16 brings no oneDNN fusion on this CPU (no AVX512_BF16/AMX)"

#: Prefix of the progress lines ``auto`` writes to stderr.
PROGRESS_PREFIX = "cpulaunch.inference: "

_FUSION_GROUP_KINDS = ("prim::oneDNNFusionGroup", "prim::LlgaFusionGroup")

# oneDNN's "avx512_core" ISA level (the x86 minimum for its bf16 kernels): these four.
_AVX512_CORE = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})


class UnsupportedModelError(CpulaunchError, ValueError):
    """The model cannot take the requested path (e.g. TorchScript tracing cannot return a
    string output). The one-line message names what is unsupported and the path to use
    instead."""


class Bf16Support(str, Enum):
    """What the CPU offers oneDNN for bf16, from its /proc/cpuinfo feature flags.

    The rule is oneDNN's own (``platform::has_data_type_support(bf16)`` in
    src/cpu/platform.cpp, and ``has_cpu_data_type_support`` in the Graph API): on x86 its
    bf16 kernels need the ``avx512_core`` level (AVX512F+BW+VL+DQ) or ``avx2_vnni_2``; on
    aarch64 the ``bf16`` extension (``aarch64::mayiuse_bf16()``).
    """

    NATIVE = "native"
    """Instructions that compute in bf16: x86 ``avx512_bf16`` or ``amx_bf16`` (Cooper
    Lake, Sapphire Rapids and later, AMD Zen 4 and later); aarch64 ``bf16`` (Neoverse V1/N2,
    Graviton 3). oneDNN Graph fuses bf16 ops. Example flags: ``avx512f avx512_bf16``."""

    EMULATED = "emulated"
    """x86 with AVX512F+BW+VL+DQ but neither AVX512_BF16 nor AMX (Skylake-SP, Cascade Lake,
    Ice Lake): oneDNN runs bf16 by converting to fp32 on AVX-512; it fuses bf16 ops, with
    less gain than on NATIVE. Example flags: ``avx512f avx512bw avx512vl avx512dq``."""

    NONE = "none"
    """No bf16 kernels in oneDNN: x86 without AVX-512 (core level) and without AVX-VNNI
    (e.g. AMD Zen 3, AVX2 only), aarch64 without ``bf16`` (Neoverse N1, Graviton 2).
    oneDNN Graph fuses no bf16 op (torch 2.13 on a Zen 3: 0 fusion groups for a bf16
    conv+bn+relu); bf16 ops run on other kernels. Example flags: ``avx2 fma``."""

    UNKNOWN = "unknown"
    """/proc/cpuinfo cannot tell: x86 with AVX-VNNI but no AVX-512 (oneDNN also accepts
    ``avx2_vnni_2``, whose AVX-NE-CONVERT and AVX-VNNI-INT8 Linux does not list in
    /proc/cpuinfo), other architectures, or no /proc/cpuinfo at all."""


def bf16_support(cpuinfo_text: Optional[str]) -> Bf16Support:
    """Classify the CPU's bf16 support for oneDNN from the text of /proc/cpuinfo (pure).

    Flags are read with :func:`cpulaunch.machine.probe.parse_cpuinfo` (x86 ``flags``, aarch64
    ``Features``, first processor). x86 is recognised by ``sse2``, aarch64 by ``asimd``.

    Examples: ``"flags : sse2 avx2 fma"`` -> ``NONE``; ``"flags : sse2 avx512f avx512bw
    avx512vl avx512dq avx512_bf16"`` -> ``NATIVE``; ``"Features : fp asimd bf16 sve"`` ->
    ``NATIVE``; ``"Features : fp asimd"`` -> ``NONE``; ``""`` -> ``UNKNOWN``.

    Args:
        cpuinfo_text: the contents of /proc/cpuinfo, or None when it could not be read.

    Returns:
        :class:`Bf16Support` (the rule and where it comes from are documented there).
    """
    flags, _ = parse_cpuinfo(cpuinfo_text)
    if "sse2" in flags:
        if flags & {"avx512_bf16", "amx_bf16"}:
            return Bf16Support.NATIVE
        if _AVX512_CORE <= flags:
            return Bf16Support.EMULATED
        return Bf16Support.UNKNOWN if "avx_vnni" in flags else Bf16Support.NONE
    if "asimd" in flags:
        return Bf16Support.NATIVE if "bf16" in flags else Bf16Support.NONE
    return Bf16Support.UNKNOWN


def host_bf16_support(cpuinfo_path: str = "/proc/cpuinfo") -> Bf16Support:
    """:func:`bf16_support` of this machine (reads the first 64 KiB of ``cpuinfo_path``
    through the bounded reader, :func:`cpulaunch.machine.files.read_regular`; UNKNOWN if
    unreadable)."""
    text = _cpuinfo_text(cpuinfo_path)
    return Bf16Support.UNKNOWN if text is None else bf16_support(text)


def _cpuinfo_text(path: str = "/proc/cpuinfo") -> Optional[str]:
    """The first 64 KiB of ``path`` through the bounded reader
    (:func:`cpulaunch.machine.files.read_regular`), or None when it cannot be read."""
    from cpulaunch.machine.files import UnusableFileError, read_regular
    from cpulaunch.machine.probe import CPUINFO_BYTES

    try:
        return read_regular(path, CPUINFO_BYTES, truncate=True).decode("utf-8", "replace")
    except (OSError, ValueError, UnusableFileError):
        return None


def zentorch_usable() -> Tuple[bool, str]:
    """Whether zentorch can be used in this process: ``(True, "")``, or ``(False, why)`` in
    one line. Checked once per process (and cached across processes) by importing torch
    and zentorch in a child of this interpreter with this environment
    (:func:`cpulaunch.machine.host.zentorch_binding`), so a refused or broken zentorch never
    imports here. Not installed: ``(False, "zentorch is not installed ...")``."""
    global _ZENTORCH_VERDICT
    if _ZENTORCH_VERDICT is None:
        from cpulaunch.machine.host import cache_dir, zentorch_binding

        b = zentorch_binding(sys.executable, dict(os.environ), cache_dir(os.environ))
        if b.path is None:
            _ZENTORCH_VERDICT = (False, "zentorch is not installed (pip install zentorch, the release built "
                                        "for this torch)")
        elif b.loads:
            _ZENTORCH_VERDICT = (True, "")
        else:
            _ZENTORCH_VERDICT = (False, f"zentorch {b.version or '?'} does not import with torch "
                                        f"{b.torch_version or '?'}: {b.why}")
    return _ZENTORCH_VERDICT


_ZENTORCH_VERDICT: Optional[Tuple[bool, str]] = None

#: The report's note where zentorch runs but changes nothing: zentorch 2.14.0.1's graph pass
#: (``zentorch/_optimize.py``, ``optimize``) returns the graph unchanged, with a warning, when
#: ``zentorch._C.is_avx512_supported()`` is false; inductor then compiles it as path
#: "inductor" would (on an AVX2-only AMD EPYC Zen 3: ``mkl::_mkl_linear`` on the frozen
#: weights, no ``zentorch::`` op).
ZENTORCH_NO_AVX512_NOTE = ("zentorch changes nothing on this CPU: it optimizes only with AVX-512 (zentorch's own "
                           "check; no avx512f in /proc/cpuinfo), so its path runs inductor's code")


def zentorch_optimizes(cpuinfo_text: Optional[str]) -> bool:
    """Whether zentorch's graph pass acts on this CPU (pure): ``avx512f`` among the x86 flags
    of ``cpuinfo_text`` (/proc/cpuinfo's text; see :data:`ZENTORCH_NO_AVX512_NOTE`). An
    unreadable or non-x86 /proc/cpuinfo: True (nothing is claimed)."""
    flags, _ = parse_cpuinfo(cpuinfo_text)
    return "sse2" not in flags or "avx512f" in flags


def bf16_notes(support: Bf16Support, aarch64: bool = False) -> List[str]:
    """The sentences a bf16 report carries for a CPU with this support (empty for NATIVE
    and UNKNOWN). ``aarch64`` words the missing feature as aarch64 names it."""
    if support is Bf16Support.NONE:
        head = (BF16_NO_FUSION_NOTE if not aarch64 else
                "bf16 brings no oneDNN fusion on this CPU (no bf16 in /proc/cpuinfo Features)")
        return [f"{head}: oneDNN has no bf16 kernels here, so bf16 ops run unfused on "
                f"slower kernels (on an AVX2-only AMD EPYC, bf16 eager took 1.1-20x the time "
                f"of fp32 on cpulaunch's example models); compare with dtype='fp32'"]
    if support is Bf16Support.EMULATED:
        return ["this CPU has no native bf16 (no AVX512_BF16/AMX): oneDNN runs bf16 by "
                "converting to fp32 on AVX-512, so bf16 may be no faster than fp32; compare "
                "with dtype='fp32'"]
    return []


def resolve_path(path: Optional[str]) -> str:
    """Return the path to take: ``path`` itself, or for ``None`` ``$CPULAUNCH_PLANNED_INFERENCE_PATH``,
    or :data:`DEFAULT_PATH` (``"auto"``) when that is unset or empty.

    Raises:
        ValueError: ``path`` (or the environment variable) is not one of :data:`PATHS`.
    """
    source = "path"
    if path is None:
        path = os.environ.get(INFERENCE_PATH_ENV, "").strip() or DEFAULT_PATH
        source = f"${INFERENCE_PATH_ENV}"
    if path not in PATHS:
        raise ValueError(f"{source} is {path!r}; choose one of {', '.join(PATHS)}")
    return path


def resolve_dtype(dtype: Any) -> str:
    """Normalise a dtype to "fp32" or "bf16".

    Accepts ``None`` (fp32), "fp32", "float32", "bf16", "bfloat16", ``torch.float32`` and
    ``torch.bfloat16``.

    Raises:
        ValueError: any other value.
    """
    if dtype is None:
        return "fp32"
    name = str(dtype).replace("torch.", "")
    aliases = {"fp32": "fp32", "float32": "fp32", "float": "fp32",
               "bf16": "bf16", "bfloat16": "bf16"}
    if name not in aliases:
        raise ValueError(f"dtype {dtype!r} is not supported; use fp32 or bf16")
    return aliases[name]


class OptimizedModel:
    """A model prepared by :func:`optimize`. Call it like the model:
    ``out = opt(*inputs, **keyword_inputs)``; the output has the model's own structure
    (tensor, dict, tuple, list or namedtuple).

    Attributes:
        path: the path taken: "onednn-graph", "inductor" or "eager".
        report: what was measured (see :func:`optimize`).
        module: the underlying callable (traced+frozen ScriptModule, compiled module, or the
            prepared eager module).
        channels_last: whether 4-D floating inputs are converted to channels_last per call.
    """

    def __init__(self, path: str, runner: Callable[..., Any], module: Any, report: Dict[str, Any],
                 graph: Optional[str], channels_last: bool):
        self.path = path
        self.report = report
        self.module = module
        self.channels_last = channels_last
        self._runner = runner
        self._graph = graph

    @property
    def graph(self) -> Optional[str]:
        """The optimised TorchScript graph, as text, captured after warm-up (onednn-graph
        path; ``None`` for the other paths). Fused regions appear as
        ``prim::oneDNNFusionGroup_N`` nodes."""
        return self._graph

    def __call__(self, *inputs: Any, **keyword_inputs: Any) -> Any:
        args, kwargs = _prepare_inputs(inputs, keyword_inputs, self.channels_last)
        return self._runner(*args, **kwargs)

    def __repr__(self) -> str:
        return f"OptimizedModel(path={self.path!r}, dtype={self.report.get('dtype')!r})"


def optimize(model: Any, example_inputs: Any = (), *,
             example_kwargs: Optional[Mapping[str, Any]] = None, dtype: Any = None,
             path: Optional[str] = None, warmup: int = 3,
             channels_last: Optional[bool] = None, candidates: Optional[Sequence[str]] = None,
             trial_seconds: float = 0.6, progress: bool = True) -> OptimizedModel:
    """Prepare ``model`` for CPU inference on one of the paths and return a callable wrapper.

    Args:
        model: a ``torch.nn.Module``; it is copied, never modified.
        example_inputs: a tensor or a tuple/list of tensors, the positional arguments of
            ``model`` at the shapes you will run (TorchScript and inductor specialise on them;
            other shapes still work but are optimised again on first use). May be empty when
            ``example_kwargs`` holds every input.
        example_kwargs: keyword arguments of ``model`` (name -> tensor), if it takes any.
            The onednn-graph result must then be called with the same keywords.
        dtype: None or "fp32"/torch.float32 (default), or "bf16"/torch.bfloat16 (CPU autocast).
        path: one of :data:`PATHS`. Not given (``None``): ``$CPULAUNCH_PLANNED_INFERENCE_PATH``
            (which ``cpulaunch --inference-path`` sets), else "auto". An explicit value wins
            over the environment.
        warmup: calls made with the example inputs after building (>= 1). oneDNN Graph compiles
            its fused kernels during the first calls (the profiling executor needs 2), so the
            onednn-graph path makes at least 2.
        channels_last: convert the model and 4-D floating inputs to channels_last; ``None``
            decides: yes when the model has a ``Conv2d`` and an input is 4-D.
        candidates: paths "auto" tries (default :data:`CONCRETE_PATHS`; zentorch only where
            it imports, and always last); ignored otherwise.
        trial_seconds: wall-clock seconds "auto" spends timing each candidate (spread over 3
            interleaved rounds, at least 3 calls each).
        progress: "auto" writes one line per candidate to stderr
            (``cpulaunch.inference: trying inductor ... 6.1 s``) and one for the timing;
            False writes nothing.

    Returns:
        :class:`OptimizedModel`. Its ``report`` holds: ``path``, ``requested_path``, ``dtype``,
        ``channels_last``, ``conv_bn_folded``, ``bf16_support`` (a :class:`Bf16Support`
        value for this CPU), ``tolerance`` (rule, reference, ``tol``; for bf16 also
        ``eager_bf16_rel_diff``; see :data:`TOLERANCES`), and per path tried: ``build_s``
        (trace/compile plus warm-up, seconds), ``max_abs_diff`` and ``rel_diff`` against
        eager fp32 on the unmodified model, ``matches_eager``, ``errors`` (path -> message
        for paths that failed to build); for onednn-graph ``fusion_groups`` (count of
        ``prim::oneDNNFusionGroup`` nodes after warm-up) and ``bf16_fusion_groups`` (those
        computing on bf16 tensors); for "auto" also ``ms_per_call`` (median) and
        ``speedup_vs_eager`` (eager ms / path ms); ``notes`` (list of str; for bf16 on a
        CPU without bf16 support in oneDNN it starts with :data:`BF16_NO_FUSION_NOTE`).

    Raises:
        ValueError: unknown path, dtype or candidate, bad ``warmup``/``trial_seconds``, or
            inputs not tensors.
        UnsupportedModelError (a ValueError): the requested path cannot take this model
            (one line naming what and the path to use instead).
        UnsupportedModelError: ``path="zentorch"`` where zentorch is not installed or does
            not import with this torch (:func:`zentorch_usable`).
        RuntimeError (or whatever torch raises): building an explicitly requested inductor
            or zentorch path failed ("auto" records such failures in ``report["errors"]`` and moves on).
    """
    requested, dtype_name, candidates = _check_arguments(path, dtype, warmup, trial_seconds,
                                                         candidates)
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    args, kwargs = _as_inputs(example_inputs, example_kwargs)
    base = copy.deepcopy(model).eval()
    base.requires_grad_(False)
    reference, tolerance = _reference_and_tolerance(base, args, kwargs, dtype_name)
    notes: List[str] = []
    prepared, folded, channels_last = _prepare_model(base, args, kwargs, channels_last, notes)
    args, kwargs = _prepare_inputs(args, kwargs, channels_last)
    report: Dict[str, Any] = {
        "path": None, "requested_path": requested, "dtype": dtype_name,
        "channels_last": channels_last, "conv_bn_folded": folded,
        "bf16_support": host_bf16_support().value, "tolerance": tolerance,
        "build_s": {}, "max_abs_diff": {}, "rel_diff": {}, "matches_eager": {}, "errors": {},
        "notes": notes,
    }
    auto = requested == "auto"
    say = _progress_writer(progress and auto)
    names = _usable_paths(candidates if auto else (requested,), report, explicit=not auto,
                          default_candidates=candidates == CONCRETE_PATHS)
    built = _build_paths(names, prepared, args, kwargs, warmup, reference, report, say, keep_going=auto)
    chosen = _choose(built, args, kwargs, report, trial_seconds, say) if auto else requested
    _note_bf16(report)
    runner, module, graph = built[chosen]
    report["path"] = chosen
    return OptimizedModel(chosen, runner, module, report, graph, channels_last)


# --------------------------------------------------------------------------- optimize's steps


def _check_arguments(path: Optional[str], dtype: Any, warmup: Any, trial_seconds: Any,
                     candidates: Optional[Sequence[str]]) -> Tuple[str, str, Tuple[str, ...]]:
    """Validate optimize()'s settings: (requested path, dtype name, candidates); ValueError."""
    requested = resolve_path(path)
    dtype_name = resolve_dtype(dtype)
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 1:
        raise ValueError(f"warmup must be an integer >= 1, got {warmup!r}")
    if not trial_seconds > 0:
        raise ValueError(f"trial_seconds must be > 0, got {trial_seconds!r}")
    chosen = tuple(CONCRETE_PATHS if candidates is None else candidates)
    bad = [c for c in chosen if c not in CONCRETE_PATHS]
    # zentorch last whatever the order given: its compile is the one with process-wide effects
    chosen = tuple(c for c in chosen if c != "zentorch") + tuple(c for c in chosen if c == "zentorch")
    if bad or not chosen:
        raise ValueError(f"candidates {list(chosen)!r} must be a non-empty subset of "
                         f"{', '.join(CONCRETE_PATHS)}")
    return requested, dtype_name, chosen


def _reference_and_tolerance(base: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any],
                             dtype_name: str) -> Tuple[Any, Dict[str, Any]]:
    """The fp32 eager output of the unmodified model, and the tolerance rule for this dtype
    (see :data:`TOLERANCES`)."""
    reference = _eager_reference(base, args, kwargs, "fp32")
    tolerance: Dict[str, Any] = {
        "rule": "max|out-ref| <= tol * max(max|ref|, 1e-6)",
        "reference": "eager fp32, unmodified model",
        "tol": TOLERANCES[dtype_name],
    }
    if dtype_name == "bf16":
        eager_bf16_rel = _compare(_eager_reference(base, args, kwargs, "bf16"), reference)[1]
        tolerance["eager_bf16_rel_diff"] = eager_bf16_rel
        tolerance["tol"] = max(TOLERANCES["bf16"], BF16_ERROR_FACTOR * eager_bf16_rel)
    return reference, tolerance


def _prepare_model(base: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any],
                   channels_last: Optional[bool], notes: List[str]) -> Tuple[Any, bool, bool]:
    """Fold Conv+BN and decide/apply channels_last: (model, folded, channels_last)."""
    import torch

    if channels_last is None:
        channels_last = (any(isinstance(m, torch.nn.Conv2d) for m in base.modules())
                         and any(_is_4d_float(t) for t in (*args, *kwargs.values())))
    prepared, folded = _fold_conv_bn(base, notes)
    if channels_last:
        prepared = prepared.to(memory_format=torch.channels_last)
    return prepared, folded, bool(channels_last)


Runner = Tuple[Callable[..., Any], Any, Optional[str]]


def _usable_paths(names: Sequence[str], report: Dict[str, Any], explicit: bool,
                  default_candidates: bool) -> Tuple[str, ...]:
    """``names`` without zentorch where it cannot be used here (:func:`zentorch_usable`):
    an explicit ``path="zentorch"`` raises one line; ``auto`` notes why, except when
    zentorch is simply not installed and the caller did not name it."""
    if "zentorch" not in names:
        return tuple(names)
    ok, why = zentorch_usable()
    if ok:
        if not zentorch_optimizes(_cpuinfo_text()):
            report["notes"].append(ZENTORCH_NO_AVX512_NOTE)
        return tuple(names)
    if explicit:
        raise UnsupportedModelError(f"path='zentorch' cannot be used here: {why}; use path='inductor' "
                                    f"or path='auto'")
    if not (default_candidates and why.startswith("zentorch is not installed")):
        report["notes"].append(f"zentorch not tried: {why}")
    return tuple(n for n in names if n != "zentorch")


def _build_paths(names: Sequence[str], model: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any],
                 warmup: int, reference: Any, report: Dict[str, Any],
                 say: Callable[[str], None], keep_going: bool) -> Dict[str, Runner]:
    """Build each path, record its build time and agreement with eager in ``report``.
    A path that fails raises, or with ``keep_going`` is recorded in ``report["errors"]``."""
    built: Dict[str, Runner] = {}
    for name in names:
        start = time.perf_counter()
        try:
            runner, module, graph, extra = _BUILDERS[name](model, args, kwargs,
                                                          report["dtype"], warmup)
            out = runner(*args, **kwargs)
        except Exception as exc:  # auto: a path that fails is skipped, not fatal
            say(f"{name}: failed to build after {time.perf_counter() - start:.1f} s ({type(exc).__name__})")
            if not keep_going:
                raise
            report["errors"][name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            continue
        report["build_s"][name] = time.perf_counter() - start
        report.update(extra)
        if name == "onednn-graph" and TORCHSCRIPT_NOTE not in report["notes"]:
            report["notes"].append(TORCHSCRIPT_NOTE)
        matches = _record_agreement(name, out, reference, report)
        say(f"{name}: built in {report['build_s'][name]:.1f} s" + ("" if matches else ", outputs differ from eager"))
        built[name] = (runner, module, graph)
    return built


def _record_agreement(name: str, out: Any, reference: Any, report: Dict[str, Any]) -> bool:
    """Compare a path's output with the reference; record it (and a note if it differs)."""
    tol = report["tolerance"]["tol"]
    abs_diff, rel_diff = _compare(out, reference)
    report["max_abs_diff"][name] = abs_diff
    report["rel_diff"][name] = rel_diff
    report["matches_eager"][name] = rel_diff <= tol
    if rel_diff > tol:
        report["notes"].append(f"{name}: outputs differ from eager by {rel_diff:.3g} of their "
                               f"largest magnitude (tolerance {tol:.3g})")
    return rel_diff <= tol


def _choose(built: Dict[str, Runner], args: Tuple[Any, ...], kwargs: Dict[str, Any],
            report: Dict[str, Any], trial_seconds: float,
            say: Callable[[str], None]) -> str:
    """Time the built paths (see :func:`_time_paths`) and return the fastest one that
    matches eager; record times, ratios, each path's foreign load and a note. Says one
    line per path (its time, busy or quiet: :data:`cpulaunch.machine.load.BUSY_THRESHOLD_PCT`,
    tune's threshold), then the choice."""
    from cpulaunch.machine.load import BUSY_THRESHOLD_PCT

    matching = [n for n in built if report["matches_eager"][n]]
    if not matching:
        raise RuntimeError("no inference path could be built and matched eager; errors: "
                           f"{report['errors']}")
    say(f"timing {', '.join(built)} for {trial_seconds * len(built):.1f} s")
    ms, foreign = _time_paths(built, args, kwargs, trial_seconds)
    report["ms_per_call"] = ms
    report["foreign_load_pct"] = foreign
    busy = {n: pct > BUSY_THRESHOLD_PCT for n, pct in foreign.items()}
    report["busy"] = busy
    if "eager" in ms:
        report["speedup_vs_eager"] = {n: ms["eager"] / v for n, v in ms.items()}
    chosen = min(matching, key=lambda n: ms[n])
    for n in sorted(ms, key=lambda n: ms[n]):
        say(f"{n}: {ms[n]:.3g} ms/call ({ms[n] / ms[chosen]:.2f}x {chosen})"
            + ("" if report["matches_eager"][n] else ", outputs differ from eager")
            + f", {'BUSY' if busy[n] else 'quiet'} (foreign load {foreign[n]:.0f}%)")
    flagged = [n for n in ms if busy[n]]
    said_busy = (f"; timed while the machine was busy (foreign load above {BUSY_THRESHOLD_PCT:g}% for "
                 f"{', '.join(flagged)}): the choice may differ on a quiet machine") if flagged else ""
    say(f"chose {chosen}{said_busy}")
    if flagged:
        report["notes"].append(f"auto timed {', '.join(flagged)} while the machine was busy (foreign load above "
                               f"{BUSY_THRESHOLD_PCT:g}% of it): the choice may differ on a quiet machine")
    others = sorted((n for n in ms if n != chosen), key=lambda n: ms[n])
    detail = ", ".join(
        f"{n} {ms[n] / ms[chosen]:.2f}x its time"
        + ("" if report["matches_eager"][n] else " but did not match eager")
        for n in others)
    report["notes"].append(f"auto chose {chosen} ({ms[chosen]:.3g} ms/call"
                           + (f"; {detail}" if detail else "") + ")")
    return chosen


def _time_paths(built: Dict[str, Runner], args: Tuple[Any, ...], kwargs: Dict[str, Any],
                trial_seconds: float, window: Optional[Callable[[], Any]] = None
                ) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Median ms per call of each path, over 3 interleaved rounds (so a burst of foreign
    load hits them all) of ``trial_seconds / 3`` each (at least 1 call, at most 1000), and
    the foreign load while each path ran, percent of the machine (tune's meter,
    :class:`cpulaunch.machine.load.LoadWindow`: this process's own threads are not foreign).

    ``window``: opens a load window (returns an object whose ``load()`` is a
    :class:`cpulaunch.machine.load.Load`); the meter's by default (tests inject one).
    """
    import statistics  # here, not at import: the launcher imports this module for PATHS

    if window is None:
        from cpulaunch.machine.load import LoadWindow as window
    times: Dict[str, List[float]] = {n: [] for n in built}
    foreign_cpu_s = {n: 0.0 for n in built}
    wall_cpu_s = {n: 0.0 for n in built}
    rounds = 3
    for _ in range(rounds):
        for name, (runner, _, _) in built.items():
            meter = window()
            budget_end = time.perf_counter() + trial_seconds / rounds
            calls = 0
            while calls < 1 or (time.perf_counter() < budget_end and calls < 1000):
                start = time.perf_counter()
                runner(*args, **kwargs)
                times[name].append(time.perf_counter() - start)
                calls += 1
            load = meter.load()
            foreign_cpu_s[name] += load.foreign * load.seconds
            wall_cpu_s[name] += load.seconds * load.ncpu
    ms = {n: statistics.median(t) * 1e3 for n, t in times.items()}
    return ms, {n: 100 * foreign_cpu_s[n] / max(wall_cpu_s[n], 1e-9) for n in built}


def _note_bf16(report: Dict[str, Any]) -> None:
    """For bf16, say what this CPU's bf16 support means (see :func:`bf16_notes`), and when
    onednn-graph was built on a CPU with support but fused no bf16 op, say that."""
    if report["dtype"] != "bf16":
        return
    import platform

    support = Bf16Support(report["bf16_support"])
    report["notes"][:0] = bf16_notes(support, aarch64=platform.machine() in ("aarch64", "arm64"))
    if report.get("bf16_fusion_groups") == 0 and support is not Bf16Support.NONE:
        report["notes"].append("onednn-graph fused no bf16 op for this model "
                               "(bf16_fusion_groups 0)")


def _progress_writer(enabled: bool) -> Callable[[str], None]:
    """say(text): one whole line of progress on stderr, prefixed with PROGRESS_PREFIX; a
    no-op when not enabled. Whole lines only, written at once after flushing what the
    program and its libraries wrote before: torch's or a library's own messages ("No CUDA
    runtime is found", inductor's warnings) then stand on lines of their own, never inside
    one of ours."""
    def say(text: str) -> None:
        if not enabled:
            return
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        sys.stderr.write(PROGRESS_PREFIX + text + "\n")
        sys.stderr.flush()

    return say


# --------------------------------------------------------------------------- helpers


def _as_inputs(example_inputs: Any, example_kwargs: Optional[Mapping[str, Any]]
               ) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    import torch

    args = (tuple(example_inputs) if isinstance(example_inputs, (tuple, list))
            else (example_inputs,))
    kwargs = dict(example_kwargs or {})
    if not all(isinstance(t, torch.Tensor) for t in args) or not (args or kwargs):
        raise ValueError("example_inputs must be a tensor or a non-empty tuple/list of "
                         "tensors (the model's positional arguments)")
    bad = [k for k, v in kwargs.items()
           if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise ValueError(f"example_kwargs must map argument names to tensors; {bad[0]!r} "
                         f"does not (fix other settings in the model, e.g. functools.partial)")
    return args, kwargs


def _is_4d_float(t: Any) -> bool:
    return getattr(t, "dim", None) is not None and t.dim() == 4 and t.is_floating_point()


def _prepare_inputs(args: Tuple[Any, ...], kwargs: Dict[str, Any], channels_last: bool
                    ) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    if not channels_last:
        return tuple(args), dict(kwargs)
    import torch

    def convert(t: Any) -> Any:
        return t.contiguous(memory_format=torch.channels_last) if _is_4d_float(t) else t

    return tuple(convert(t) for t in args), {k: convert(v) for k, v in kwargs.items()}


def _autocast(dtype_name: str):
    import torch

    if dtype_name == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()


def _eager_reference(model: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any],
                     dtype_name: str) -> Any:
    import torch

    with torch.inference_mode(), _autocast(dtype_name):
        return model(*args, **kwargs)


def _fold_conv_bn(model: Any, notes: List[str]) -> Tuple[Any, bool]:
    """Fold Conv+BatchNorm pairs with torch.fx (returns a copy); the model unchanged and a
    note when it has no BatchNorm after a Conv or fx cannot trace it."""
    import torch

    convs = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    bns = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)
    mods = list(model.modules())
    if not (any(isinstance(m, convs) for m in mods) and any(isinstance(m, bns) for m in mods)):
        return model, False
    try:
        with _quiet_torchscript():  # importing it defines torch.jit.script_method modules
            from torch.fx.experimental.optimization import fuse

            return fuse(model, inplace=False), True
    except Exception as exc:  # fx symbolic tracing fails on data-dependent control flow
        notes.append(f"Conv+BatchNorm not folded in eager: torch.fx could not trace the "
                     f"model ({type(exc).__name__}); TorchScript freeze and inductor "
                     f"freezing still fold it")
        return model, False


def _flatten(out: Any) -> List[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in _flatten(out[k])]
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in _flatten(item)]
    return []


def _compare(out: Any, ref: Any) -> Tuple[float, float]:
    """(max abs diff, max abs diff / max(max|ref|, 1e-6)) over every output tensor."""
    outs, refs = _flatten(out), _flatten(ref)
    if len(outs) != len(refs):
        return float("inf"), float("inf")
    abs_diff, scale = 0.0, 1e-6
    for o, r in zip(outs, refs):
        if o.shape != r.shape:
            return float("inf"), float("inf")
        o, r = o.detach().float(), r.detach().float()
        if r.numel():
            abs_diff = max(abs_diff, float((o - r).abs().max()))
            scale = max(scale, float(r.abs().max()))
    return abs_diff, abs_diff / scale


@contextlib.contextmanager
def _quiet_torchscript() -> Iterator[None]:
    """Silence TorchScript's deprecation warnings ("`torch.jit.trace` is deprecated", also
    raised by torch.compile's internals) and nothing else: a DeprecationWarning in torch
    2.13 (hidden by Python's default filters), a FutureWarning from 2.14 (shown by them:
    three lines on the user's stderr per onednn-graph build otherwise)."""
    with warnings.catch_warnings():
        for category in TORCHSCRIPT_WARNINGS:
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated",
                                    category=category)
        yield


@contextlib.contextmanager
def _onednn_flags(bf16: bool) -> Iterator[None]:
    """Turn oneDNN fusion on (and, for bf16, the JIT autocast pass off) and restore both."""
    import torch

    was_enabled = torch.jit.onednn_fusion_enabled()
    torch.jit.enable_onednn_fusion(True)
    prev_autocast = torch._C._jit_set_autocast_mode(False) if bf16 else None
    try:
        yield
    finally:
        if prev_autocast is not None:
            torch._C._jit_set_autocast_mode(prev_autocast)
        torch.jit.enable_onednn_fusion(was_enabled)


def _count_fusion_groups(graph: Any) -> Tuple[int, int]:
    """(oneDNN fusion groups, those of them computing on bf16 tensors) in a TorchScript
    graph, nested blocks included. Under autocast some ops stay fp32 (layer_norm, softmax):
    their groups count in the first number only."""
    count = bf16 = 0
    stack = [graph]
    while stack:
        block = stack.pop()
        for node in block.nodes():
            if node.kind() in _FUSION_GROUP_KINDS:
                count += 1
                bf16 += _is_bf16_group(node)
            stack.extend(node.blocks())
    return count, bf16


def _is_bf16_group(node: Any) -> bool:
    import torch

    sub = node.g("Subgraph")
    values = [*sub.inputs(), *(o for n in sub.nodes() for o in n.outputs())]
    return any(isinstance(v.type(), torch._C.TensorType) and v.type().scalarType() == "BFloat16"
               for v in values)


# --------------------------------------------------------------------------- the paths

Built = Tuple[Callable[..., Any], Any, Optional[str], Dict[str, Any]]


def _build_eager(model: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], dtype_name: str,
                 warmup: int) -> Built:
    import torch

    def run(*a: Any, **k: Any) -> Any:
        with torch.inference_mode(), _autocast(dtype_name):
            return model(*a, **k)

    for _ in range(warmup):
        run(*args, **kwargs)
    return run, model, None, {}


def _build_onednn(model: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], dtype_name: str,
                  warmup: int) -> Built:
    import torch

    io = _flat_io(model, len(args), tuple(kwargs))
    flat = (*args, *kwargs.values())
    bf16 = dtype_name == "bf16"
    with _quiet_torchscript(), _onednn_flags(bf16), torch.no_grad():
        with _autocast(dtype_name):
            traced = _trace(io, flat)
        frozen = torch.jit.freeze(traced)
        for _ in range(max(warmup, 2)):
            frozen(*flat)
        graph = torch.jit.last_executed_optimized_graph()
        groups, bf16_groups = _count_fusion_groups(graph)
        graph_text = str(graph)

    def run(*a: Any, **k: Any) -> Any:
        # The bf16 casts are in the traced graph: no autocast context is needed here.
        flat_inputs = io.flat_inputs(a, k)
        with _onednn_flags(bf16), torch.no_grad():
            return io.rebuild_output(frozen(*flat_inputs))

    return run, frozen, graph_text, {"fusion_groups": groups, "bf16_fusion_groups": bf16_groups}


def _build_inductor(model: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], dtype_name: str,
                    warmup: int) -> Built:
    import torch

    # options= are inductor config patches applied to every compile of this module (the
    # first call and any recompile), i.e. torch._inductor.config.patch(freezing=True)
    # scoped to this model. Freezing needs grad mode off; inference_mode provides that.
    compiled = torch.compile(model, options={"freezing": True})

    def run(*a: Any, **k: Any) -> Any:
        with _quiet_torchscript(), torch.inference_mode(), _autocast(dtype_name):
            return compiled(*a, **k)

    for _ in range(warmup):
        run(*args, **kwargs)
    return run, compiled, None, {}


def _build_zentorch(model: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], dtype_name: str,
                    warmup: int) -> Built:
    import torch

    import zentorch  # registers its ops and the "zentorch" dynamo backend

    compiled = torch.compile(model, backend=zentorch.zentorch_compile, dynamic=False)

    def run(*a: Any, **k: Any) -> Any:
        # zentorch's guide: torch.no_grad() (freezing needs grad mode off)
        with zentorch_settings(), _quiet_torchscript(), torch.no_grad(), _autocast(dtype_name):
            return compiled(*a, **k)

    for _ in range(warmup):
        run(*args, **kwargs)
    return run, compiled, None, {}


@contextlib.contextmanager
def zentorch_settings() -> Iterator[None]:
    """The inductor settings a zentorch-compiled model needs, for the duration of one call,
    and the previous values back afterwards: ``freezing=True`` (ZenDNN's
    ``TORCHINDUCTOR_FREEZING=1``: weights prepacked and folded as constants) and
    ``joint_custom_post_pass`` = zentorch's graph pass, which zentorch's backend sets
    process-wide and never resets. Both are read when inductor compiles, and it compiles
    the graph zentorch's backend returns lazily, at the first call (measured here: with the
    settings restored as soon as the backend returned, the MLP ran at 11-18 samples/s
    instead of 150, its weights prepacked on every call), so they are set around every call
    of the compiled model (the first, and any that recompiles at a new shape). Imports
    zentorch."""
    import zentorch
    from torch._inductor import config

    saved = config.joint_custom_post_pass, config.freezing
    config.joint_custom_post_pass, config.freezing = zentorch._compile_backend.optimize_pass, True
    try:
        yield
    finally:
        config.joint_custom_post_pass, config.freezing = saved


_BUILDERS: Dict[str, Callable[..., Built]] = {
    "eager": _build_eager,
    "onednn-graph": _build_onednn,
    "inductor": _build_inductor,
    "zentorch": _build_zentorch,
}


def _trace(io: Any, flat: Tuple[Any, ...]) -> Any:
    """torch.jit.trace of the flat wrapper; torch's own tracer errors become one line.

    check_trace=False: re-running the trace check under autocast fails with "Cannot insert
    a Tensor that requires grad as a constant" (torch 2.13; docs/guide/inference.md)."""
    import torch

    try:
        return torch.jit.trace(io, flat, check_trace=False)
    except UnsupportedModelError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise UnsupportedModelError(
            f"onednn-graph could not trace this model with torch.jit.trace "
            f"({type(exc).__name__}: {first}); use path='inductor' or path='eager'") from exc


def _flat_io(model: Any, n_args: int, keys: Tuple[str, ...]) -> Any:
    """A module TorchScript can trace around ``model``: it takes the n_args positional and
    then the keyword tensors (in ``keys`` order) as positional tensors, and returns the
    tensors of the model's output as a flat tuple. It records the output's structure
    (``torch.utils._pytree``) while traced, and rebuilds it with ``rebuild_output``."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    class FlatIO(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.out_spec: Any = None
            self.n_leaves = 0
            self.slots: List[int] = []

        def forward(self, *flat: Any) -> Tuple[Any, ...]:
            out = self.model(*flat[:n_args], **dict(zip(keys, flat[n_args:])))
            leaves, self.out_spec = tree_flatten(out)
            self.n_leaves = len(leaves)
            self.slots = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
            bad = [type(v).__name__ for v in leaves
                   if v is not None and not isinstance(v, torch.Tensor)]
            if bad or not self.slots:
                what = f"a {bad[0]}" if bad else "no tensor"
                raise UnsupportedModelError(
                    f"onednn-graph cannot take this model: its output holds {what}, and "
                    f"TorchScript tracing returns only tensors (alone or in tuples, lists, "
                    f"dicts, namedtuples; None allowed); use path='inductor' or path='eager'")
            return tuple(leaves[i] for i in self.slots)

        def flat_inputs(self, a: Tuple[Any, ...], k: Dict[str, Any]) -> Tuple[Any, ...]:
            if len(a) != n_args or len(k) != len(keys) or any(n not in k for n in keys):
                raise UnsupportedModelError(
                    f"this onednn-graph model was traced with {_describe_inputs(n_args, keys)} "
                    f"but called with {_describe_inputs(len(a), tuple(k))}: call it as the "
                    f"example was given, or use path='inductor' or path='eager'")
            return (*a, *(k[n] for n in keys))

        def rebuild_output(self, outs: Tuple[Any, ...]) -> Any:
            if self.out_spec.is_leaf():
                return outs[0]
            leaves: List[Any] = [None] * self.n_leaves
            for slot, value in zip(self.slots, outs):
                leaves[slot] = value
            return tree_unflatten(leaves, self.out_spec)

    return FlatIO().eval()


def _describe_inputs(n_args: int, keys: Sequence[str]) -> str:
    text = f"{n_args} positional input{'s' if n_args != 1 else ''}"
    return text + (f" and keywords {', '.join(keys)}" if keys else " and no keywords")
