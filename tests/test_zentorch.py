"""zentorch as an inference path (issue 33): ``optimize(path="zentorch")``, ``auto`` with
zentorch among its candidates, its process-global inductor setting contained, and
``cpulaunch --inference-path zentorch``; a zentorch that refuses this torch is one note.

Two kinds of test. The refused-version tests run everywhere torch is: a stand-in zentorch
package on PYTHONPATH refuses the import exactly as zentorch 2.14.0.1's wheel does on torch
2.13 and 2.15 (``ImportError: Incompatible PyTorch version ...``), and the real child-process
check, cache and notes handle it. The real-zentorch tests need zentorch importing with the
installed torch (zentorch 2.14.0.1 wants torch 2.14.x): elsewhere they skip with the one
reason :data:`SKIP_PREFIX` (.ci/run's zentorch step runs them on torch 2.14.x, and
scripts/check_skips.py admits no other reason for them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from conftest import REPO

torch = pytest.importorskip("torch")

from cpulaunch.inference import (UnsupportedModelError, ZENTORCH_NO_AVX512_NOTE, optimize, zentorch_optimizes,  # noqa: E402
                                 zentorch_usable)
from cpulaunch import settings  # noqa: E402
from cpulaunch.machine import host  # noqa: E402

#: The start of the one skip reason of the real-zentorch tests (.ci/run's check_skips).
SKIP_PREFIX = "zentorch does not import here"
USABLE, WHY = zentorch_usable()
needs_zentorch = pytest.mark.skipif(not USABLE, reason=f"{SKIP_PREFIX} ({WHY}); .ci/run's zentorch step runs "
                                                       "this on torch 2.14.x")

REFUSAL = ("Incompatible PyTorch version {v} detected. The installed zentorch binary is only compatible "
           "with PyTorch versions 2.14.x")


@pytest.fixture
def refusing_zentorch(tmp_path):
    """An environment whose zentorch 2.14.0.1 refuses this torch as the real wheel does
    (its __init__ compares torch's minor release with its build's and raises ImportError),
    with cpulaunch's verdict cache in a fresh folder."""
    site = tmp_path / "site"
    pkg = site / "zentorch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(f"""\
        import torch
        raise ImportError({REFUSAL!r}.format(v=torch.__version__))
        """))
    dist = site / "zentorch-2.14.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: zentorch\nVersion: 2.14.0.1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CPULAUNCH_")}
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), XDG_CACHE_HOME=str(tmp_path / "cache"))
    return env


def run_py(code: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=timeout)


def test_a_refused_version_is_one_note_and_the_other_paths_run(refusing_zentorch):
    code = textwrap.dedent("""\
        import json, torch
        from cpulaunch.inference import optimize, UnsupportedModelError
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        opt = optimize(m, torch.randn(2, 16), path="auto", candidates=("eager", "zentorch"), progress=False,
                       trial_seconds=0.1)
        try:
            optimize(m, torch.randn(2, 16), path="zentorch")
            explicit = "no error"
        except UnsupportedModelError as exc:
            explicit = str(exc)
        print(json.dumps({"path": opt.path, "notes": opt.report["notes"], "built": sorted(opt.report["build_s"]),
                          "explicit": explicit}))
        """)
    r = run_py(code, refusing_zentorch)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout.splitlines()[-1])
    v, dist = torch.__version__, metadata.version("torch")  # "2.14.1+cu130", "2.14.1"
    why = f"zentorch 2.14.0.1 does not import with torch {dist}: ImportError: {REFUSAL.format(v=v)}"
    assert doc["path"] == "eager" and doc["built"] == ["eager"]
    assert [n for n in doc["notes"] if "zentorch" in n] == [f"zentorch not tried: {why}"]
    assert doc["explicit"] == (f"path='zentorch' cannot be used here: {why}; use path='inductor' or "
                               "path='auto'")
    # the verdict was checked in a child once and kept: a second process reads it
    cached = list((Path(refusing_zentorch["XDG_CACHE_HOME"]) / "cpulaunch").glob("zentorch-*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["loads"] is False


def test_the_launcher_notes_a_refused_zentorch(refusing_zentorch):
    r = subprocess.run([sys.executable, "-m", "cpulaunch", "--inference-path", "zentorch", "--dry-run",
                        "--format", "json", "true"], capture_output=True, text=True, env=refusing_zentorch,
                       cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    v, dist = torch.__version__, metadata.version("torch")
    assert doc["instances"][0]["env"]["CPULAUNCH_PLANNED_INFERENCE_PATH"] == "zentorch"
    assert [n for n in doc["notes"] if "zentorch" in n] == [
        f"--inference-path zentorch: zentorch 2.14.0.1 does not import with torch {dist} (ImportError: "
        f"{REFUSAL.format(v=v)}); the program's optimize() will refuse path zentorch: install the zentorch built "
        "for this torch, or use --inference-path auto (the other paths)"]


def test_note_when_not_installed():
    missing = host.CclBinding("/venv/bin/python", None)
    assert settings.zentorch_note(missing).startswith("--inference-path zentorch: zentorch is not installed for "
                                                  "/venv/bin/python;")
    assert settings.zentorch_note(host.CclBinding("/py", "/site/zentorch", "2.14.0.1", "2.14.1", True)) is None
    assert settings.zentorch_note(None) is None


# --------------------------------------------------------------------------- real zentorch


def mlp():
    g = torch.Generator().manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return m, torch.randn(4, 64, generator=g)


@needs_zentorch
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_zentorch_path_matches_eager(dtype):
    m, x = mlp()
    opt = optimize(m, x, path="zentorch", dtype=dtype, warmup=2)
    assert opt.path == "zentorch" and opt.report["matches_eager"] == {"zentorch": True}
    out = opt(x)
    assert out.shape == (4, 8)
    with torch.no_grad():
        ref = m(x)
    tol = 1e-4 if dtype == "fp32" else 5e-2
    assert float((out.float() - ref).abs().max()) <= tol * float(ref.abs().max())


@needs_zentorch
def test_zentorch_runs_its_kernels_on_frozen_weights():
    """Each call runs zentorch's linear kernels on weights prepacked once, at the compile
    (inductor freezing), not on every call: with the settings restored as soon as the
    backend returned, inductor (which compiles lazily, at the first call) ran zentorch's
    pass unfrozen and prepacked the weights in every call, 8-13x slower."""
    from torch.profiler import ProfilerActivity, profile

    m, x = mlp()
    opt = optimize(m, x, path="zentorch", warmup=2)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        opt(x)
    ops = {e.key for e in prof.key_averages()}
    if zentorch_optimizes(Path("/proc/cpuinfo").read_text()):  # AVX-512: zentorch's kernels
        assert any(k.startswith("zentorch::zentorch_linear") for k in ops), sorted(ops)
        assert ZENTORCH_NO_AVX512_NOTE not in opt.report["notes"]
    else:  # zentorch's pass leaves the graph alone (AVX2-only Zen 3: mkl::_mkl_linear), and says so
        assert not any(k.startswith("zentorch::") for k in ops), sorted(ops)
        assert ZENTORCH_NO_AVX512_NOTE in opt.report["notes"], opt.report["notes"]
    assert not any("weight_prepack" in k for k in ops), sorted(ops)


@pytest.mark.parametrize("text,acts", [
    ("flags : fpu sse2 avx2 fma", False),  # AMD EPYC Zen 3
    ("flags : fpu sse2 avx2 avx512f avx512bw avx512_bf16", True),  # Zen 4
    ("Features : fp asimd", True), ("", True), (None, True),  # nothing claimed off x86
])
def test_zentorch_acts_only_with_avx512(text, acts):
    assert zentorch_optimizes(text) is acts


@needs_zentorch
def test_zentorch_puts_inductors_global_pass_back():
    """zentorch's backend sets torch._inductor.config.joint_custom_post_pass to its own pass
    and never resets it; every later inductor compile of the process would run it. Built
    through cpulaunch, the setting is back to what it was after the first compile and after
    a recompile (another shape), and freezing is off again."""
    from torch._inductor import config

    import zentorch  # what zentorch does on its own, for contrast

    sentinel = object.__new__(type("Sentinel", (), {}))
    before_freezing = config.freezing
    m, x = mlp()
    config.joint_custom_post_pass = sentinel
    try:
        opt = optimize(m, x, path="zentorch", warmup=1)
        assert config.joint_custom_post_pass is sentinel
        opt(torch.randn(7, 64))  # a new shape: dynamo recompiles through the backend again
        assert config.joint_custom_post_pass is sentinel
        assert config.freezing == before_freezing
        # zentorch's own backend, unwrapped, leaves its pass behind (what cpulaunch contains)
        raw = torch.compile(mlp()[0], backend="zentorch", dynamic=False)
        with torch.no_grad():
            raw(x)
        assert config.joint_custom_post_pass is zentorch._compile_backend.optimize_pass
    finally:
        config.joint_custom_post_pass = None
        torch._dynamo.reset()


@needs_zentorch
def test_auto_weighs_zentorch_last():
    m, x = mlp()
    opt = optimize(m, x, path="auto", candidates=("zentorch", "eager", "inductor"), progress=False,
                   trial_seconds=0.3)
    assert list(opt.report["build_s"]) == ["eager", "inductor", "zentorch"]
    assert set(opt.report["ms_per_call"]) == {"eager", "inductor", "zentorch"}
    assert opt.path in ("eager", "inductor", "zentorch")
    assert not any("zentorch not tried" in n for n in opt.report["notes"])


@needs_zentorch
@pytest.mark.slow
def test_cpulaunch_runs_infer_on_zentorch(tmp_path):
    """The issue's command, small: cpulaunch --inference-path zentorch python
    examples/infer.py --model mlp reports its speed on the zentorch path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CPULAUNCH_")}
    r = subprocess.run([sys.executable, "-m", "cpulaunch", "--inference-path", "zentorch", sys.executable,
                        "examples/infer.py", "--model", "mlp", "--size", "small", "--iterations", "20", "--json"],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=900)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.splitlines()[-2])
    assert (result["path"], result["requested_path"], result["model"]) == ("zentorch", "zentorch", "mlp")
    assert result["samples_per_s"] > 0
    assert r.stdout.splitlines()[-1].startswith("CPULAUNCH_METRIC samples_per_s=")


def test_doctor_reports_a_refused_zentorch(refusing_zentorch):
    r = subprocess.run([sys.executable, "-m", "cpulaunch", "doctor", "--format", "json"], capture_output=True,
                       text=True, env=refusing_zentorch, cwd=REPO, timeout=600)
    doc = json.loads(r.stdout)
    found = [f for f in doc["findings"] if f["id"] == "zentorch"]
    v, dist = torch.__version__, metadata.version("torch")
    assert [(f["severity"], f["summary"]) for f in found] == [
        ("warn", f"zentorch 2.14.0.1 does not import with torch {dist}: ImportError: {REFUSAL.format(v=v)}")]
    assert found[0]["fix"] == "install the zentorch release built for this torch, or the torch it was built for"
