"""Tests for cpulaunch.inference: real torch runs on small models (a few seconds each,
except the one inductor test, which compiles and is marked slow)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cpulaunch import inference
from cpulaunch.inference import (CONCRETE_PATHS, INFERENCE_PATH_ENV, PATHS, TOLERANCES,
                                 optimize, resolve_dtype, resolve_path)

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import models  # noqa: E402  (examples/models.py)


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
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "onednn-graph" in proc.stdout


def test_constants():
    assert INFERENCE_PATH_ENV == "CPULAUNCH_INFERENCE_PATH"
    assert PATHS == ("onednn-graph", "inductor", "eager", "auto")
    assert set(CONCRETE_PATHS) == set(PATHS) - {"auto"}


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
    with pytest.raises(ValueError, match=r"\$CPULAUNCH_INFERENCE_PATH is 'fast'"):
        resolve_path(None)
    with pytest.raises(ValueError, match="choose one of onednn-graph, inductor, eager, auto"):
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


@pytest.mark.parametrize("which", ["cnn", "bert"])
def test_onednn_graph_bf16(which):
    if which == "cnn":
        model, inputs = conv_bn_relu(), cnn_inputs()
    else:
        model, make_inputs = models.make_model("bert", "small")
        inputs = make_inputs(2)
    flags = global_flags()
    opt = optimize(model, inputs, dtype=torch.bfloat16, path="onednn-graph")
    out = opt(*inputs)
    assert out.dtype == torch.bfloat16
    assert opt.report["dtype"] == "bf16"
    assert opt.report["fusion_groups"] > 0
    assert "BFloat16" in opt.graph
    tol = opt.report["tolerance"]
    eager_bf16 = eager_out(model, inputs, "bf16")
    ref = eager_out(model, inputs)
    eager_err = float((eager_bf16 - ref).abs().max() / ref.abs().max())
    assert tol["eager_bf16_rel_diff"] == pytest.approx(eager_err, rel=1e-3, abs=1e-9)
    assert tol["tol"] == max(TOLERANCES["bf16"], inference.BF16_ERROR_FACTOR * eager_err)
    assert opt.report["matches_eager"] == {"onednn-graph": True}
    assert_close(out, ref, tol["tol"])
    assert global_flags() == flags


def test_no_deprecation_warning_escapes(recwarn):
    optimize(conv_bn_relu(), cnn_inputs(), path="onednn-graph")
    leaked = [w for w in recwarn.list if issubclass(w.category, DeprecationWarning)
              and "torch.jit" in str(w.message)]
    assert not leaked


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

    def wrong_but_fast(model, inputs, dtype_name, warmup):
        out = torch.zeros(inputs[0].shape[0], 4)
        return (lambda *args: out), model, None, {}

    def broken(model, inputs, dtype_name, warmup):
        raise RuntimeError("no compiler\nsecond line")

    monkeypatch.setitem(inference._BUILDERS, "onednn-graph", wrong_but_fast)
    monkeypatch.setitem(inference._BUILDERS, "inductor", broken)
    opt = optimize(conv_bn_relu(), cnn_inputs(), path="auto", trial_seconds=0.2)
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


def test_path_none_bad_env_is_value_error(monkeypatch):
    monkeypatch.setenv(INFERENCE_PATH_ENV, "tensorrt")
    with pytest.raises(ValueError, match="CPULAUNCH_INFERENCE_PATH"):
        optimize(conv_bn_relu(), cnn_inputs(), path=None)
