"""The inference path: run a model through oneDNN Graph (TorchScript), inductor or eager.

``optimize(model, example_inputs)`` returns an :class:`OptimizedModel`, a callable wrapper
that says which path it took (``.path``) and what it measured (``.report``).

Paths (``PATHS``):

- ``"onednn-graph"``: ``torch.jit.enable_onednn_fusion(True)``, ``torch.jit.trace``,
  ``torch.jit.freeze``, then warm-up runs with the example shapes (the fusion is compiled on
  the first runs; PyTorch performance tuning guide, "Use oneDNN Graph with TorchScript for
  inference"). bf16 is traced under ``torch.autocast("cpu", torch.bfloat16)`` with the JIT
  autocast pass off (``torch._C._jit_set_autocast_mode(False)``), as the same guide shows;
  the casts are then part of the traced graph. TorchScript is deprecated in torch 2.13:
  this path still works there, its DeprecationWarnings are silenced inside this module and
  the report says so once in ``notes``.
- ``"inductor"``: ``torch.compile(model, options={"freezing": True})`` (inductor freezing
  folds the weights into the compiled graph as constants; without it inductor was slower
  than eager at batch 1 here) called in inference mode.
- ``"eager"``: ``model.eval()`` under ``torch.inference_mode()``.
- ``"auto"``: build each candidate path, check its outputs against eager, time them
  interleaved, keep the fastest one whose outputs match.

For every path the model is first copied (the caller's model is never changed), put in eval
mode, Conv+BatchNorm pairs are folded with ``torch.fx.experimental.optimization.fuse``
(skipped quietly, with a note, when fx cannot trace the model), and, for models with
``Conv2d`` and 4-D inputs, the model and its 4-D inputs are made ``channels_last`` (the
tuning guide's advice for CNNs on CPU). bf16 runs under CPU autocast.

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
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

#: Environment variable naming the path ``optimize(path=None)`` takes; ``cpulaunch
#: --inference-path`` sets it for the program it launches.
INFERENCE_PATH_ENV = "CPULAUNCH_INFERENCE_PATH"

#: Every value ``optimize(path=...)`` and ``$CPULAUNCH_INFERENCE_PATH`` accept.
PATHS = ("onednn-graph", "inductor", "eager", "auto")

#: The concrete paths, in the order ``auto`` tries them.
CONCRETE_PATHS = ("eager", "onednn-graph", "inductor")

#: Path taken by ``optimize(path=None)`` when ``$CPULAUNCH_INFERENCE_PATH`` is unset or empty.
DEFAULT_PATH = "auto"

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
    "DeprecationWarnings are silenced inside cpulaunch.inference"
)

_FUSION_GROUP_KINDS = ("prim::oneDNNFusionGroup", "prim::LlgaFusionGroup")


def resolve_path(path: Optional[str]) -> str:
    """Return the path to take: ``path`` itself, or for ``None`` ``$CPULAUNCH_INFERENCE_PATH``,
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
    """A model prepared by :func:`optimize`. Call it like the model: ``out = opt(*inputs)``.

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

    def __call__(self, *inputs: Any) -> Any:
        return self._runner(*_prepare_inputs(inputs, self.channels_last))

    def __repr__(self) -> str:
        return f"OptimizedModel(path={self.path!r}, dtype={self.report.get('dtype')!r})"


def optimize(model: Any, example_inputs: Any, *, dtype: Any = None, path: Optional[str] = "auto",
             warmup: int = 3, channels_last: Optional[bool] = None,
             candidates: Optional[Sequence[str]] = None,
             trial_seconds: float = 0.6) -> OptimizedModel:
    """Prepare ``model`` for CPU inference on one of the paths and return a callable wrapper.

    Args:
        model: a ``torch.nn.Module``; it is copied, never modified.
        example_inputs: a tensor or a tuple/list of tensors, the positional arguments of
            ``model`` at the shapes you will run (TorchScript and inductor specialise on them;
            other shapes still work but are optimised again on first use).
        dtype: None or "fp32"/torch.float32 (default), or "bf16"/torch.bfloat16 (CPU autocast).
        path: one of :data:`PATHS`; ``None`` reads ``$CPULAUNCH_INFERENCE_PATH``, else "auto".
        warmup: calls made with the example inputs after building (>= 1). oneDNN Graph compiles
            its fused kernels during the first calls (the profiling executor needs 2), so the
            onednn-graph path makes at least 2.
        channels_last: convert the model and 4-D floating inputs to channels_last; ``None``
            decides: yes when the model has a ``Conv2d`` and an input is 4-D.
        candidates: paths "auto" tries (default :data:`CONCRETE_PATHS`); ignored otherwise.
        trial_seconds: wall-clock seconds "auto" spends timing each candidate (spread over 3
            interleaved rounds, at least 3 calls each).

    Returns:
        :class:`OptimizedModel`. Its ``report`` holds: ``path``, ``requested_path``, ``dtype``,
        ``channels_last``, ``conv_bn_folded``, ``tolerance`` (rule, reference, ``tol``; for
        bf16 also ``eager_bf16_rel_diff``; see :data:`TOLERANCES`), and per path tried:
        ``build_s`` (trace/compile plus warm-up, seconds), ``max_abs_diff`` and ``rel_diff``
        against eager fp32 on the unmodified model, ``matches_eager``, ``errors`` (path -> message for paths
        that failed to build); for onednn-graph ``fusion_groups`` (count of
        ``prim::oneDNNFusionGroup`` nodes after warm-up); for "auto" also ``ms_per_call``
        (median) and ``speedup_vs_eager`` (eager ms / path ms); ``notes`` (list of str).

    Raises:
        ValueError: unknown path, dtype or candidate, bad ``warmup``/``trial_seconds``, or
            ``example_inputs`` not tensors.
        RuntimeError (or whatever torch raises): building an explicitly requested path
            failed ("auto" records such failures in ``report["errors"]`` and moves on).
    """
    requested = resolve_path(path)
    dtype_name = resolve_dtype(dtype)
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 1:
        raise ValueError(f"warmup must be an integer >= 1, got {warmup!r}")
    if not trial_seconds > 0:
        raise ValueError(f"trial_seconds must be > 0, got {trial_seconds!r}")
    if candidates is None:
        candidates = CONCRETE_PATHS
    candidates = tuple(candidates)
    bad = [c for c in candidates if c not in CONCRETE_PATHS]
    if bad or not candidates:
        raise ValueError(f"candidates {list(candidates)!r} must be a non-empty subset of "
                         f"{', '.join(CONCRETE_PATHS)}")

    import torch

    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    inputs = _as_input_tuple(example_inputs)

    notes: List[str] = []
    base = copy.deepcopy(model).eval()
    base.requires_grad_(False)
    reference = _eager_reference(base, inputs, "fp32")
    tolerance: Dict[str, Any] = {
        "rule": "max|out-ref| <= tol * max(max|ref|, 1e-6)",
        "reference": "eager fp32, unmodified model",
        "tol": TOLERANCES[dtype_name],
    }
    if dtype_name == "bf16":
        eager_bf16_rel = _compare(_eager_reference(base, inputs, "bf16"), reference)[1]
        tolerance["eager_bf16_rel_diff"] = eager_bf16_rel
        tolerance["tol"] = max(TOLERANCES["bf16"], BF16_ERROR_FACTOR * eager_bf16_rel)
    tol = tolerance["tol"]

    if channels_last is None:
        channels_last = (any(isinstance(m, torch.nn.Conv2d) for m in base.modules())
                         and any(_is_4d_float(t) for t in inputs))
    prepared, folded = _fold_conv_bn(base, notes)
    if channels_last:
        prepared = prepared.to(memory_format=torch.channels_last)
    run_inputs = _prepare_inputs(inputs, channels_last)

    report: Dict[str, Any] = {
        "path": None,
        "requested_path": requested,
        "dtype": dtype_name,
        "channels_last": bool(channels_last),
        "conv_bn_folded": folded,
        "tolerance": tolerance,
        "build_s": {},
        "max_abs_diff": {},
        "rel_diff": {},
        "matches_eager": {},
        "errors": {},
        "notes": notes,
    }
    to_try = candidates if requested == "auto" else (requested,)
    built: Dict[str, Tuple[Callable[..., Any], Any, Optional[str]]] = {}
    for name in to_try:
        try:
            start = time.perf_counter()
            runner, module, graph, extra = _BUILDERS[name](prepared, run_inputs, dtype_name,
                                                          warmup)
            out = runner(*run_inputs)
            report["build_s"][name] = time.perf_counter() - start
        except Exception as exc:  # auto: a path that fails is skipped, not fatal
            if requested != "auto":
                raise
            report["errors"][name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            continue
        if name == "onednn-graph" and TORCHSCRIPT_NOTE not in notes:
            notes.append(TORCHSCRIPT_NOTE)
        report.update(extra)
        abs_diff, rel_diff = _compare(out, reference)
        report["max_abs_diff"][name] = abs_diff
        report["rel_diff"][name] = rel_diff
        report["matches_eager"][name] = rel_diff <= tol
        if not report["matches_eager"][name]:
            notes.append(f"{name}: outputs differ from eager by {rel_diff:.3g} of their "
                         f"largest magnitude (tolerance {tol:.3g})")
        built[name] = (runner, module, graph)

    if requested != "auto":
        chosen = requested
    else:
        chosen = _choose(built, run_inputs, report, trial_seconds)
    runner, module, graph = built[chosen]
    report["path"] = chosen
    return OptimizedModel(chosen, runner, module, report, graph, bool(channels_last))


# --------------------------------------------------------------------------- helpers


def _as_input_tuple(example_inputs: Any) -> Tuple[Any, ...]:
    import torch

    inputs = (example_inputs if isinstance(example_inputs, (tuple, list))
              else (example_inputs,))
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise ValueError("example_inputs must be a tensor or a non-empty tuple/list of "
                         "tensors (the model's positional arguments)")
    return tuple(inputs)


def _is_4d_float(t: Any) -> bool:
    return getattr(t, "dim", None) is not None and t.dim() == 4 and t.is_floating_point()


def _prepare_inputs(inputs: Tuple[Any, ...], channels_last: bool) -> Tuple[Any, ...]:
    if not channels_last:
        return tuple(inputs)
    import torch

    return tuple(t.contiguous(memory_format=torch.channels_last) if _is_4d_float(t) else t
                 for t in inputs)


def _autocast(dtype_name: str):
    import torch

    if dtype_name == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()


def _eager_reference(model: Any, inputs: Tuple[Any, ...], dtype_name: str) -> Any:
    import torch

    with torch.inference_mode(), _autocast(dtype_name):
        return model(*inputs)


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
    """Silence TorchScript's 2.13 DeprecationWarnings ("`torch.jit.trace` is deprecated",
    also raised by torch.compile's internals) and nothing else."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated",
                                category=DeprecationWarning)
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


def _count_fusion_groups(graph: Any) -> int:
    count = 0
    stack = [graph]
    while stack:
        block = stack.pop()
        for node in block.nodes():
            if node.kind() in _FUSION_GROUP_KINDS:
                count += 1
            stack.extend(node.blocks())
    return count


Built = Tuple[Callable[..., Any], Any, Optional[str], Dict[str, Any]]


def _build_eager(model: Any, inputs: Tuple[Any, ...], dtype_name: str, warmup: int) -> Built:
    import torch

    def run(*args: Any) -> Any:
        with torch.inference_mode(), _autocast(dtype_name):
            return model(*args)

    for _ in range(warmup):
        run(*inputs)
    return run, model, None, {}


def _build_onednn(model: Any, inputs: Tuple[Any, ...], dtype_name: str, warmup: int) -> Built:
    import torch

    bf16 = dtype_name == "bf16"
    with _quiet_torchscript(), _onednn_flags(bf16), torch.no_grad():
        with _autocast(dtype_name):
            # check_trace=False: re-running the trace check under autocast fails with
            # "Cannot insert a Tensor that requires grad as a constant" (see PLATFORM.md).
            traced = torch.jit.trace(model, inputs, check_trace=False)
        frozen = torch.jit.freeze(traced)
        for _ in range(max(warmup, 2)):
            frozen(*inputs)
        graph = torch.jit.last_executed_optimized_graph()
        groups = _count_fusion_groups(graph)
        graph_text = str(graph)

    def run(*args: Any) -> Any:
        # The bf16 casts are in the traced graph: no autocast context is needed here.
        with _onednn_flags(bf16), torch.no_grad():
            return frozen(*args)

    return run, frozen, graph_text, {"fusion_groups": groups}


def _build_inductor(model: Any, inputs: Tuple[Any, ...], dtype_name: str, warmup: int) -> Built:
    import torch

    # options= are inductor config patches applied to every compile of this module (the
    # first call and any recompile), i.e. torch._inductor.config.patch(freezing=True)
    # scoped to this model. Freezing needs grad mode off; inference_mode provides that.
    compiled = torch.compile(model, options={"freezing": True})

    def run(*args: Any) -> Any:
        with _quiet_torchscript(), torch.inference_mode(), _autocast(dtype_name):
            return compiled(*args)

    for _ in range(warmup):
        run(*inputs)
    return run, compiled, None, {}


_BUILDERS: Dict[str, Callable[..., Built]] = {
    "eager": _build_eager,
    "onednn-graph": _build_onednn,
    "inductor": _build_inductor,
}


def _choose(built: Dict[str, Tuple[Callable[..., Any], Any, Optional[str]]],
            inputs: Tuple[Any, ...], report: Dict[str, Any], trial_seconds: float) -> str:
    """Time the built paths in 3 interleaved rounds (so a burst of foreign load hits them
    all) and return the fastest one that matches eager; record times and ratios."""
    matching = [n for n in built if report["matches_eager"][n]]
    if not matching:
        raise RuntimeError("no inference path could be built and matched eager; errors: "
                           f"{report['errors']}")
    times: Dict[str, List[float]] = {n: [] for n in built}
    rounds = 3
    for _ in range(rounds):
        for name, (runner, _, _) in built.items():
            budget_end = time.perf_counter() + trial_seconds / rounds
            calls = 0
            while calls < 1 or (time.perf_counter() < budget_end and calls < 1000):
                start = time.perf_counter()
                runner(*inputs)
                times[name].append(time.perf_counter() - start)
                calls += 1
    import statistics  # here, not at import: the launcher imports this module for PATHS

    ms = {n: statistics.median(t) * 1e3 for n, t in times.items()}
    report["ms_per_call"] = ms
    if "eager" in ms:
        report["speedup_vs_eager"] = {n: ms["eager"] / v for n, v in ms.items()}
    chosen = min(matching, key=lambda n: ms[n])
    others = sorted((n for n in ms if n != chosen), key=lambda n: ms[n])
    detail = ", ".join(
        f"{n} {ms[n] / ms[chosen]:.2f}x its time"
        + ("" if report["matches_eager"][n] else " but did not match eager")
        for n in others)
    report["notes"].append(f"auto chose {chosen} ({ms[chosen]:.3g} ms/call"
                           + (f"; {detail}" if detail else "") + ")")
    return chosen
