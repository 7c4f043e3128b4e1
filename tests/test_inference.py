"""Tests for cpulaunch.inference: real torch runs on small models (a few seconds each,
except the inductor tests, which compile and are marked slow).

What oneDNN does with bf16 depends on the CPU: the bf16 fusion test reads this machine's
/proc/cpuinfo (:func:`bf16_support`) and asserts what is right for its ISA."""

from __future__ import annotations

import collections
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cpulaunch import inference
from cpulaunch.inference import (BF16_NO_FUSION_NOTE, CONCRETE_PATHS, INFERENCE_PATH_ENV, PATHS,
                                 PROGRESS_PREFIX, TOLERANCES, Bf16Support,
                                 UnsupportedModelError, bf16_support, optimize, resolve_dtype,
                                 resolve_path)

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import models  # noqa: E402  (examples/models.py)

FIXTURES = Path(__file__).parent / "fixtures"
CPUINFO = Path("/proc/cpuinfo")
HOST_BF16 = bf16_support(CPUINFO.read_text() if CPUINFO.exists() else None)


@pytest.fixture(autouse=True)
def no_path_env(monkeypatch):
    """The tests choose the path themselves: an inherited $CPULAUNCH_PLANNED_INFERENCE_PATH would
    change what optimize() does by default."""
    monkeypatch.delenv(INFERENCE_PATH_ENV, raising=False)


def conv_bn_relu() -> torch.nn.Module:
    """A small conv+bn+relu CNN with non-trivial BatchNorm statistics, input (N, 3, 16, 16)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 4),
    )
    for mod in m:
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.2, 0.2)
    return m.eval()


def cnn_inputs(batch: int = 2, seed: int = 1):
    return (torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(seed)),)


def eager_out(model, inputs, dtype="fp32"):
    ctx = (torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16"
           else torch.autocast("cpu", enabled=False))
    with torch.inference_mode(), ctx:
        return model(*inputs).float()


def assert_close(out, ref, tol):
    """The module's own rule: max|out-ref| <= tol * max|ref|, ref from eager fp32."""
    diff = float((out.float() - ref).abs().max())
    assert diff <= tol * float(ref.abs().max()), (diff, float(ref.abs().max()))


def global_flags():
    prev = torch._C._jit_set_autocast_mode(True)
    torch._C._jit_set_autocast_mode(prev)
    return torch.jit.onednn_fusion_enabled(), prev


# ------------------------------------------------------------------ no torch at import


def test_import_does_not_import_torch():
    code = ("import cpulaunch.inference as i, sys; "
            "assert 'torch' not in sys.modules, 'torch imported'; print(i.PATHS)")
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "onednn-graph" in proc.stdout


def test_constants():
    assert INFERENCE_PATH_ENV == "CPULAUNCH_PLANNED_INFERENCE_PATH"
    assert PATHS == ("onednn-graph", "inductor", "zentorch", "eager", "auto")
    assert set(CONCRETE_PATHS) == set(PATHS) - {"auto"}
    assert CONCRETE_PATHS[-1] == "zentorch"  # built last: its compile touches process-global settings
    from cpulaunch.option_table import INFERENCE_PATHS  # the launcher's choices, kept apart from torch

    assert set(INFERENCE_PATHS) == set(PATHS)


# ------------------------------------------------------------------ argument handling


def test_resolve_path_reads_env(monkeypatch):
    monkeypatch.delenv(INFERENCE_PATH_ENV, raising=False)
    assert resolve_path(None) == "auto"
    monkeypatch.setenv(INFERENCE_PATH_ENV, "")
    assert resolve_path(None) == "auto"
    monkeypatch.setenv(INFERENCE_PATH_ENV, "inductor")
    assert resolve_path(None) == "inductor"
    assert resolve_path("eager") == "eager"  # an explicit path wins over the env
    monkeypatch.setenv(INFERENCE_PATH_ENV, "fast")
    with pytest.raises(ValueError, match=r"\$CPULAUNCH_PLANNED_INFERENCE_PATH is 'fast'"):
        resolve_path(None)
    with pytest.raises(ValueError, match="choose one of onednn-graph, inductor, zentorch, eager, auto"):
        resolve_path("jit")


@pytest.mark.parametrize("given, expected", [
    (None, "fp32"), ("fp32", "fp32"), ("float32", "fp32"), ("bf16", "bf16"),
    ("bfloat16", "bf16")])
def test_resolve_dtype(given, expected):
    assert resolve_dtype(given) == expected


def test_resolve_dtype_torch_dtypes():
    assert resolve_dtype(torch.float32) == "fp32"
    assert resolve_dtype(torch.bfloat16) == "bf16"
    with pytest.raises(ValueError, match="use fp32 or bf16"):
        resolve_dtype(torch.float16)


@pytest.mark.parametrize("kwargs, message", [
    ({"dtype": "fp16"}, "use fp32 or bf16"),
    ({"warmup": 0}, "warmup must be an integer >= 1"),
    ({"path": "fast"}, "path is 'fast'"),
    ({"candidates": ("eager", "auto")}, "must be a non-empty subset"),
    ({"trial_seconds": 0}, "trial_seconds must be > 0"),
])
def test_user_errors_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        optimize(conv_bn_relu(), cnn_inputs(), **kwargs)


def test_inputs_must_be_tensors():
    with pytest.raises(ValueError, match="example_inputs must be a tensor"):
        optimize(conv_bn_relu(), [[1.0, 2.0]], path="eager")
    with pytest.raises(ValueError, match="model must be a torch.nn.Module"):
        optimize(lambda x: x, cnn_inputs(), path="eager")


# ------------------------------------------------------------------ onednn-graph


def test_onednn_graph_conv_bn_relu_fuses_and_matches_eager():
    model = conv_bn_relu()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = global_flags()
    opt = optimize(model, cnn_inputs(), path="onednn-graph")

    assert opt.path == "onednn-graph"
    assert opt.report["fusion_groups"] > 0
    assert "prim::oneDNNFusionGroup" in opt.graph
    assert opt.report["channels_last"] and opt.report["conv_bn_folded"]
    assert opt.report["matches_eager"] == {"onednn-graph": True}
    assert sum("deprecates" in n for n in opt.report["notes"]) == 1  # said once
    # other values than the example, same shape
    new = cnn_inputs(seed=7)
    assert_close(opt(*new), eager_out(model, new), TOLERANCES["fp32"])
    # the caller's model and the process-global flags are left as they were
    assert isinstance(model[1], torch.nn.BatchNorm2d)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model[0].weight.is_contiguous()
    assert global_flags() == flags


def test_onednn_graph_transformer_fuses_and_matches_eager():
    model, make_inputs = models.make_model("bert", "small")
    inputs = make_inputs(2)
    opt = optimize(model, inputs, path="onednn-graph")
    assert opt.report["fusion_groups"] > 0
    assert not opt.report["channels_last"] and not opt.report["conv_bn_folded"]
    assert_close(opt(*inputs), eager_out(model, inputs), TOLERANCES["fp32"])


def test_onednn_graph_other_batch_size_still_correct():
    model = conv_bn_relu()
    opt = optimize(model, cnn_inputs(batch=2), path="onednn-graph")
    other = cnn_inputs(batch=5, seed=3)
    assert_close(opt(*other), eager_out(model, other), TOLERANCES["fp32"])


def bf16_model(which):
    if which == "cnn":
        return conv_bn_relu(), cnn_inputs()
    model, make_inputs = models.make_model("bert", "small")
    return model, make_inputs(2)


@pytest.mark.parametrize("which", ["cnn", "bert"])
def test_onednn_graph_bf16_matches_eager(which):
    model, inputs = bf16_model(which)
    flags = global_flags()
    opt = optimize(model, inputs, dtype=torch.bfloat16, path="onednn-graph")
    out = opt(*inputs)
    assert out.dtype == torch.bfloat16
    assert opt.report["dtype"] == "bf16"
    assert opt.report["bf16_support"] == HOST_BF16.value
    assert "BFloat16" in opt.graph  # the autocast casts are in the traced graph
    tol = opt.report["tolerance"]
    eager_bf16 = eager_out(model, inputs, "bf16")
    ref = eager_out(model, inputs)
    eager_err = float((eager_bf16 - ref).abs().max() / ref.abs().max())
    assert tol["eager_bf16_rel_diff"] == pytest.approx(eager_err, rel=1e-3, abs=1e-9)
    assert tol["tol"] == max(TOLERANCES["bf16"], inference.BF16_ERROR_FACTOR * eager_err)
    assert opt.report["matches_eager"] == {"onednn-graph": True}
    assert_close(out, ref, tol["tol"])
    assert global_flags() == flags


@pytest.mark.parametrize("which", ["cnn", "bert"])
def test_onednn_graph_bf16_fusion_follows_the_isa(which):
    """oneDNN has bf16 kernels on x86 with AVX-512 (core) or AVX512_BF16/AMX, and on
    aarch64 with bf16 (Bf16Support); without them it fuses no bf16 op. Measured with torch
    2.13 on an AVX2-only AMD EPYC: cnn 0 groups, bert 6 groups, all of them fp32
    (layer_norm and softmax stay fp32 under autocast), 0 bf16 groups."""
    if HOST_BF16 is Bf16Support.UNKNOWN:
        pytest.skip("/proc/cpuinfo does not tell whether oneDNN has bf16 kernels here "
                    "(x86 with AVX-VNNI but no AVX-512, or not x86/aarch64)")
    model, inputs = bf16_model(which)
    report = optimize(model, inputs, dtype="bf16", path="onednn-graph").report
    head = "bf16 brings no oneDNN fusion on this CPU (no "
    if HOST_BF16 in (Bf16Support.NATIVE, Bf16Support.EMULATED):
        assert report["bf16_fusion_groups"] > 0
        assert report["fusion_groups"] >= report["bf16_fusion_groups"]
        assert not any(n.startswith(head) for n in report["notes"])
        emulated = [n for n in report["notes"] if n.startswith("this CPU has no native bf16")]
        assert len(emulated) == (HOST_BF16 is Bf16Support.EMULATED)
    else:
        assert report["bf16_fusion_groups"] == 0
        if which == "cnn":
            assert report["fusion_groups"] == 0
        x86 = platform.machine() in ("x86_64", "AMD64", "i686")
        assert report["notes"][0].startswith(BF16_NO_FUSION_NOTE if x86 else head)


def test_no_deprecation_warning_escapes(recwarn):
    """TorchScript's "`torch.jit.X` is deprecated" is a DeprecationWarning in torch 2.13 and
    a FutureWarning from 2.14 (issue 24): neither may leave optimize()."""
    optimize(conv_bn_relu(), cnn_inputs(), path="onednn-graph")
    leaked = [f"{w.category.__name__}: {w.message}" for w in recwarn.list
              if issubclass(w.category, (DeprecationWarning, FutureWarning))
              and "torch.jit" in str(w.message)]
    assert not leaked


def test_onednn_graph_prints_nothing_on_the_users_stderr(tmp_path):
    """As a user runs it: a script under Python's default warning filters (which show
    FutureWarning, torch >= 2.14's TorchScript deprecation category) prints no warning."""
    script = tmp_path / "user.py"
    script.write_text(
        "import torch\n"
        "from cpulaunch.inference import optimize\n"
        "m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).eval()\n"
        "opt = optimize(m, (torch.randn(2, 3, 16, 16),), path='onednn-graph')\n"
        "print(opt.path)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "onednn-graph\n"
    assert done.stderr == ""


# ------------------------------------------------------------------ eager, inductor


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_eager_path_matches(dtype):
    model = conv_bn_relu()
    opt = optimize(model, cnn_inputs(), path="eager", dtype=dtype)
    assert opt.path == "eager" and opt.graph is None
    assert "fusion_groups" not in opt.report
    new = cnn_inputs(seed=5)
    assert_close(opt(*new), eager_out(model, new), opt.report["tolerance"]["tol"])
    assert opt.report["matches_eager"] == {"eager": True}


def test_channels_last_can_be_forced_off():
    opt = optimize(conv_bn_relu(), cnn_inputs(), path="eager", channels_last=False)
    assert opt.report["channels_last"] is False and not opt.channels_last


@pytest.mark.slow
@pytest.mark.torch_release
def test_inductor_matches_eager():
    model = conv_bn_relu()
    opt = optimize(model, cnn_inputs(), path="inductor", warmup=1)
    assert opt.path == "inductor"
    assert opt.report["matches_eager"] == {"inductor": True}
    new = cnn_inputs(seed=9)
    assert_close(opt(*new), eager_out(model, new), TOLERANCES["fp32"])


# ------------------------------------------------------------------ auto


def test_auto_picks_fastest_matching_path():
    opt = optimize(conv_bn_relu(), cnn_inputs(), path="auto",
                   candidates=("eager", "onednn-graph"), trial_seconds=0.3)
    report = opt.report
    assert set(report["ms_per_call"]) == {"eager", "onednn-graph"}
    assert all(report["matches_eager"].values())
    assert opt.path == min(report["ms_per_call"], key=report["ms_per_call"].get)
    assert report["speedup_vs_eager"]["eager"] == 1.0
    assert report["requested_path"] == "auto" and report["path"] == opt.path
    assert any(n.startswith(f"auto chose {opt.path}") for n in report["notes"])


def test_auto_skips_paths_that_do_not_match_or_fail(monkeypatch):
    real_eager = inference._BUILDERS["eager"]

    def wrong_but_fast(model, args, kwargs, dtype_name, warmup):
        out = torch.zeros(args[0].shape[0], 4)
        return (lambda *a, **k: out), model, None, {}

    def broken(model, args, kwargs, dtype_name, warmup):
        raise RuntimeError("no compiler\nsecond line")

    monkeypatch.setitem(inference._BUILDERS, "onednn-graph", wrong_but_fast)
    monkeypatch.setitem(inference._BUILDERS, "inductor", broken)
    opt = optimize(conv_bn_relu(), cnn_inputs(), path="auto", trial_seconds=0.2,
                   candidates=("eager", "onednn-graph", "inductor"))  # zentorch too where installed
    assert opt.path == "eager"
    assert opt.report["matches_eager"] == {"eager": True, "onednn-graph": False}
    assert opt.report["ms_per_call"]["onednn-graph"] < opt.report["ms_per_call"]["eager"]
    assert opt.report["errors"] == {"inductor": "RuntimeError: no compiler"}
    assert inference._BUILDERS["eager"] is real_eager


# ------------------------------------------------------------------ path=None and the env


@pytest.mark.parametrize("value", ["eager", "onednn-graph"])
def test_path_none_honours_env(monkeypatch, value):
    monkeypatch.setenv(INFERENCE_PATH_ENV, value)
    opt = optimize(conv_bn_relu(), cnn_inputs(), path=None)
    assert opt.path == value
    assert opt.report["requested_path"] == value


def test_path_not_given_means_env_else_auto(monkeypatch, capsys):
    """`cpulaunch --inference-path eager python m.py` with m.py calling optimize(m, x)."""
    monkeypatch.setenv(INFERENCE_PATH_ENV, "eager")
    opt = optimize(conv_bn_relu(), cnn_inputs())
    assert (opt.path, opt.report["requested_path"]) == ("eager", "eager")
    assert "ms_per_call" not in opt.report  # nothing was timed: auto did not run
    # an explicit path still wins over the environment
    assert optimize(conv_bn_relu(), cnn_inputs(), path="onednn-graph").path == "onednn-graph"
    monkeypatch.delenv(INFERENCE_PATH_ENV)
    opt = optimize(conv_bn_relu(), cnn_inputs(), candidates=("eager",), trial_seconds=0.05,
                   progress=False)
    assert opt.report["requested_path"] == "auto" and "ms_per_call" in opt.report
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------ progress of auto


def test_auto_shows_progress_on_stderr(capsys):
    """Whole lines only: each path's build, then one line per path with its time and
    whether the machine was busy while it ran (tune's meter and threshold), then the
    choice."""
    opt = optimize(conv_bn_relu(), cnn_inputs(), path="auto", candidates=("eager", "onednn-graph"),
                   trial_seconds=0.1)
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 6, captured.err
    assert all(line.startswith(PROGRESS_PREFIX) for line in lines)
    said = [line.removeprefix(PROGRESS_PREFIX) for line in lines]
    for line, name in zip(said, ("eager", "onednn-graph")):
        assert re.fullmatch(rf"{name}: built in [0-9.]+ s", line), line
    assert said[2] == "timing eager, onednn-graph for 0.2 s"
    ms, busy = opt.report["ms_per_call"], opt.report["busy"]
    chosen = opt.path
    for line, name in zip(said[3:5], sorted(ms, key=ms.get)):
        assert re.fullmatch(rf"{name}: [0-9.e+-]+ ms/call \([0-9.]+x {chosen}\), (BUSY|quiet) "
                            r"\(foreign load [0-9]+%\)", line), line
        assert ("BUSY" in line) is busy[name]
    assert said[5].startswith(f"chose {chosen}")
    assert set(opt.report["foreign_load_pct"]) == {"eager", "onednn-graph"}


class FakeLoad:
    """A load window that reports ``pct`` percent of the machine foreign."""

    def __init__(self, pct: float) -> None:
        self.pct = pct

    def __call__(self):
        return self

    def load(self):
        from cpulaunch.machine.load import Load

        return Load(others=self.pct / 100 * 4, steal=0.0, seconds=0.5, ncpu=4)


@pytest.mark.parametrize("pct, busy", [(35.0, True), (2.0, False)])
def test_auto_flags_a_timing_taken_on_a_busy_machine(pct, busy, capsys, monkeypatch):
    real = inference._time_paths
    monkeypatch.setattr(inference, "_time_paths", lambda *a: real(*a, window=FakeLoad(pct)))
    opt = optimize(conv_bn_relu(), cnn_inputs(), path="auto", candidates=("eager",), trial_seconds=0.05)
    lines = capsys.readouterr().err.splitlines()
    assert opt.report["foreign_load_pct"] == {"eager": pytest.approx(pct)} and opt.report["busy"] == {"eager": busy}
    assert lines[-2].endswith(f", {'BUSY' if busy else 'quiet'} (foreign load {pct:.0f}%)")
    flagged = "timed while the machine was busy (foreign load above 10% for eager)"
    assert (flagged in lines[-1]) is busy and lines[-1].startswith(f"{PROGRESS_PREFIX}chose eager")
    assert any("while the machine was busy" in n for n in opt.report["notes"]) is busy


def test_a_librarys_chatter_never_splits_autos_lines(capsys, monkeypatch):
    """torch's "No CUDA runtime is found" (printed while inductor builds: it used to land
    inside auto's "trying inductor ... 3.1 s" line) stands on a line of its own."""
    real_eager = inference._BUILDERS["eager"]
    chatter = "No CUDA runtime is found, using CUDA_HOME='/usr'"

    def chatty(model, args, kwargs, dtype_name, warmup):
        print(chatter, file=sys.stderr)  # as torch.utils.cpp_extension prints it
        return real_eager(model, args, kwargs, dtype_name, warmup)

    monkeypatch.setitem(inference._BUILDERS, "inductor", chatty)
    optimize(conv_bn_relu(), cnn_inputs(), path="auto", candidates=("eager", "inductor"), trial_seconds=0.05)
    lines = capsys.readouterr().err.splitlines()
    assert lines.count(chatter) == 1 and lines.index(chatter) == 1, lines  # after eager's line, before inductor's
    ours = [line for line in lines if line != chatter]
    assert len(ours) == 6 and all(line.startswith(PROGRESS_PREFIX) and line.count(PROGRESS_PREFIX) == 1
                                  for line in ours), lines
    assert ours[1].startswith(f"{PROGRESS_PREFIX}inductor: built in ")


def test_auto_progress_can_be_silenced_and_names_failures(capsys, monkeypatch):
    def broken(model, args, kwargs, dtype_name, warmup):
        raise RuntimeError("no compiler")

    monkeypatch.setitem(inference._BUILDERS, "inductor", broken)
    optimize(conv_bn_relu(), cnn_inputs(), path="auto", trial_seconds=0.05, progress=False,
             candidates=("eager", "inductor"))
    assert capsys.readouterr().err == ""
    optimize(conv_bn_relu(), cnn_inputs(), path="auto", trial_seconds=0.05,
             candidates=("eager", "inductor"))
    lines = capsys.readouterr().err.splitlines()
    assert lines[1].startswith(f"{PROGRESS_PREFIX}inductor: failed to build after ")
    assert lines[1].endswith(" s (RuntimeError)")
    # a named path is what the caller asked for: no progress
    optimize(conv_bn_relu(), cnn_inputs(), path="eager")
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------ structured inputs/outputs

Pair = collections.namedtuple("Pair", "logits features")


class DictModel(torch.nn.Module):
    """Keyword input ``mask``; returns a dict holding a tensor, a namedtuple and None."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x, mask=None):
        y = self.lin(x)
        if mask is not None:
            y = y * mask
        return {"logits": y, "pair": Pair(torch.relu(y), x * 2), "extra": None}


class ListModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = self.lin(x)
        return [y, (y.sum(1), y.mean())]


def structured_inputs():
    g = torch.Generator().manual_seed(3)
    return torch.randn(2, 8, generator=g), torch.rand(2, 4, generator=g)


def assert_same_structure_and_values(out, ref):
    if isinstance(ref, torch.Tensor):
        assert isinstance(out, torch.Tensor)
        assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6)
    elif ref is None:
        assert out is None
    elif isinstance(ref, dict):
        assert type(out) is dict and list(out) == list(ref)
        for k in ref:
            assert_same_structure_and_values(out[k], ref[k])
    else:
        assert type(out) is type(ref) and len(out) == len(ref)
        for o, r in zip(out, ref):
            assert_same_structure_and_values(o, r)


@pytest.mark.parametrize("path", ["eager", "onednn-graph"])
def test_dict_namedtuple_output_and_keyword_input(path):
    model = DictModel().eval()
    x, mask = structured_inputs()
    opt = optimize(model, x, example_kwargs={"mask": mask}, path=path)
    assert opt.report["matches_eager"] == {path: True}
    x2, mask2 = structured_inputs()[0] + 1, structured_inputs()[1] / 2
    out = opt(x2, mask=mask2)
    with torch.no_grad():
        ref = model(x2, mask=mask2)
    assert isinstance(out["pair"], Pair)
    assert_same_structure_and_values(out, ref)


@pytest.mark.parametrize("path", ["eager", "onednn-graph"])
def test_list_and_nested_tuple_output(path):
    model = ListModel().eval()
    x, _ = structured_inputs()
    out = optimize(model, (x,), path=path)(x)
    with torch.no_grad():
        assert_same_structure_and_values(out, model(x))


def test_keyword_only_inputs():
    model = DictModel().eval()
    x, mask = structured_inputs()
    opt = optimize(model, (), example_kwargs={"x": x, "mask": mask}, path="onednn-graph")
    with torch.no_grad():
        assert_same_structure_and_values(opt(x=x, mask=mask), model(x=x, mask=mask))


def test_onednn_graph_called_unlike_the_example_is_one_clear_line():
    x, mask = structured_inputs()
    opt = optimize(DictModel(), x, example_kwargs={"mask": mask}, path="onednn-graph")
    with pytest.raises(UnsupportedModelError) as info:
        opt(x)
    assert str(info.value) == (
        "this onednn-graph model was traced with 1 positional input and keywords mask but "
        "called with 1 positional input and no keywords: call it as the example was given, "
        "or use path='inductor' or path='eager'")


class LabelModel(torch.nn.Module):
    def forward(self, x):
        return {"score": x * 2, "label": "cat"}


def test_output_tracing_cannot_return_is_one_clear_line_and_auto_moves_on():
    x, _ = structured_inputs()
    with pytest.raises(UnsupportedModelError) as info:
        optimize(LabelModel(), x, path="onednn-graph")
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, ValueError)
    assert message == ("onednn-graph cannot take this model: its output holds a str, and "
                       "TorchScript tracing returns only tensors (alone or in tuples, lists, "
                       "dicts, namedtuples; None allowed); use path='inductor' or path='eager'")
    opt = optimize(LabelModel(), x, path="auto", candidates=("eager", "onednn-graph"),
                   trial_seconds=0.05, progress=False)
    assert opt.path == "eager" and opt(x)["label"] == "cat"
    assert opt.report["errors"] == {"onednn-graph": f"UnsupportedModelError: {message}"}


def test_tracer_failure_is_one_clear_line():
    class Broken(torch.nn.Module):
        """Fine in eager, fails inside torch.jit.trace with a two-line error."""

        def forward(self, x):
            if torch.jit.is_tracing():
                raise RuntimeError("cannot trace this\nsecond line")
            return x + 1

    with pytest.raises(UnsupportedModelError) as info:
        optimize(Broken(), torch.ones(2), path="onednn-graph")
    assert str(info.value) == ("onednn-graph could not trace this model with torch.jit.trace "
                               "(RuntimeError: cannot trace this); use path='inductor' or "
                               "path='eager'")
    assert isinstance(info.value.__cause__, RuntimeError)


def test_keyword_inputs_must_be_tensors():
    x, _ = structured_inputs()
    with pytest.raises(ValueError, match="example_kwargs must map argument names to tensors; "
                                         "'mask' does not"):
        optimize(DictModel(), x, example_kwargs={"mask": 0.5}, path="eager")


@pytest.mark.slow
def test_inductor_dict_output_and_keyword_input():
    model = DictModel().eval()
    x, mask = structured_inputs()
    opt = optimize(model, x, example_kwargs={"mask": mask}, path="inductor", warmup=1)
    assert opt.report["matches_eager"] == {"inductor": True}
    out = opt(x, mask=mask)
    with torch.no_grad():
        ref = model(x, mask=mask)
    assert isinstance(out["pair"], Pair)
    assert_same_structure_and_values(out, ref)


# ------------------------------------------------------------------ the ISA rule (pure)


def fixture_cpuinfo(machine: str) -> str:
    """/proc/cpuinfo of a fixture machine, read from its tarball with tar(1)."""
    (tarball,) = (FIXTURES / machine).glob("*.tar.bz2")
    proc = subprocess.run([shutil.which("tar") or "tar", "-xjOf", str(tarball), "--wildcards",
                           "*/proc/cpuinfo"], capture_output=True, text=True, check=True)
    return proc.stdout


@pytest.mark.parametrize("machine, expected", [
    ("hw-32intel64-2p8co2t+8ve", Bf16Support.EMULATED),      # Xeon Silver 4108, Skylake-SP
    ("hw-memorysidecaches", Bf16Support.EMULATED),           # Xeon Gold 6230, Cascade Lake
    ("hw-20em64t-hybrid-1p6c2t+2ca4co1t", Bf16Support.UNKNOWN),  # i7-1370P: AVX-VNNI, no AVX-512
    ("hw-32amd64-4s2n4c-cgroup2", Bf16Support.NONE),         # Opteron 6134
    ("hw-128arm-2pa2n8cluster4co", Bf16Support.NONE),        # arm64, Features without bf16
    ("hw-256ppc-8n8s4t", Bf16Support.UNKNOWN),               # POWER7
])
def test_bf16_support_of_fixture_machines(machine, expected):
    assert bf16_support(fixture_cpuinfo(machine)) is expected


@pytest.mark.parametrize("text, expected", [
    # AMD EPYC Zen 3 (this project's AVX2-only machine), abridged
    ("processor\t: 0\nflags\t\t: fpu sse2 avx fma avx2 bmi2 sha_ni vaes\n", Bf16Support.NONE),
    # AMD EPYC Zen 4: AVX-512 with avx512_bf16, no AMX
    ("flags : sse2 avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16\n",
     Bf16Support.NATIVE),
    # Sapphire Rapids: AMX
    ("flags : sse2 avx512f avx512dq avx512bw avx512vl avx512_bf16 amx_bf16 amx_tile\n",
     Bf16Support.NATIVE),
    ("flags : sse2 avx2 amx_bf16\n", Bf16Support.NATIVE),
    # AVX512F alone is not oneDNN's avx512_core (Knights Landing has F+CD+ER+PF)
    ("flags : sse2 avx2 avx512f avx512cd avx512er avx512pf\n", Bf16Support.NONE),
    # Graviton 3 (Neoverse V1) and Graviton 2 (Neoverse N1)
    ("Features\t: fp asimd evtstrm sha512 sve asimdfhm bf16 i8mm\n", Bf16Support.NATIVE),
    ("Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics asimdrdm\n", Bf16Support.NONE),
    # only the first processor counts; nothing readable -> unknown
    ("flags : sse2 avx2\n\nflags : sse2 avx512_bf16\n", Bf16Support.NONE),
    ("", Bf16Support.UNKNOWN),
    (None, Bf16Support.UNKNOWN),
])
def test_bf16_support_rule(text, expected):
    assert bf16_support(text) is expected


def test_bf16_notes_wording():
    (none_note,) = inference.bf16_notes(Bf16Support.NONE)
    assert none_note.startswith(BF16_NO_FUSION_NOTE + ": ")
    (arm_note,) = inference.bf16_notes(Bf16Support.NONE, aarch64=True)
    assert arm_note.startswith("bf16 brings no oneDNN fusion on this CPU (no bf16 in "
                               "/proc/cpuinfo Features): ")
    (emulated,) = inference.bf16_notes(Bf16Support.EMULATED)
    assert emulated.startswith("this CPU has no native bf16 (no AVX512_BF16/AMX)")
    assert inference.bf16_notes(Bf16Support.NATIVE) == []
    assert inference.bf16_notes(Bf16Support.UNKNOWN) == []


def test_fp32_report_carries_no_bf16_note():
    report = optimize(conv_bn_relu(), cnn_inputs(), path="eager").report
    assert report["bf16_support"] == HOST_BF16.value
    assert not any("bf16" in n for n in report["notes"])


def test_path_none_bad_env_is_value_error(monkeypatch):
    monkeypatch.setenv(INFERENCE_PATH_ENV, "tensorrt")
    with pytest.raises(ValueError, match="CPULAUNCH_PLANNED_INFERENCE_PATH"):
        optimize(conv_bn_relu(), cnn_inputs(), path=None)
