"""examples/infer.py as a real subprocess: it must report the environment it really got
(affinity, threads, instance index, mapped preloads) and a throughput. Small model, 1 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cpulaunch import cpulist
from cpulaunch.machine.libfinder import find
from cpulaunch.machine.libraries import REGISTRY

pytest.importorskip("torch")

INFER = Path(__file__).resolve().parents[1] / "examples" / "infer.py"
METRIC = "CPULAUNCH_METRIC "
CLEARED = ("OMP_NUM_THREADS", "CPULAUNCH_INSTANCE_INDEX", "CPULAUNCH_PLANNED_INFERENCE_PATH",
           "LD_PRELOAD", "MKL_NUM_THREADS")


def run_infer(*args, env_extra=None, cpus=None, json_output=True):
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(env_extra or {})
    preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    fmt = ["--json"] if json_output else []
    proc = subprocess.run(
        [sys.executable, str(INFER), "--size", "small", "--seconds", "1", *fmt, *args],
        env=env, capture_output=True, text=True, timeout=120, preexec_fn=preexec)
    return proc


def result_of(proc):
    """The JSON result; also checks the run ends with its one metric line, whose value is
    the JSON's samples_per_s."""
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, proc.stdout
    result = json.loads(lines[0])
    assert metric_lines(proc.stdout) == [("samples_per_s", result["samples_per_s"])]
    assert proc.stdout.endswith("\n") and proc.stdout.splitlines()[-1].startswith(METRIC)
    return result


def metric_lines(stdout):
    """(name, float value) of each `CPULAUNCH_METRIC name=value` line, in order."""
    found = []
    for line in stdout.splitlines():
        if line.startswith(METRIC):
            name, sep, value = line[len(METRIC):].partition("=")
            assert sep and " " not in name, line
            found.append((name, float(value)))
    return found


def test_default_run_reports_inherited_environment():
    res = result_of(run_infer())
    assert res["samples_per_s"] > 0 and res["iterations"] >= 1
    assert res["path"] == "eager" and res["requested_path"] == "eager"
    assert res["affinity"] == cpulist.format(os.sched_getaffinity(0))
    assert res["threads"] >= 1
    assert res["omp_num_threads"] is None and res["instance_index"] is None
    assert res["preloaded"] == {}


def test_pinned_instance_with_env_path():
    cpu = min(os.sched_getaffinity(0))
    proc = run_infer("--model", "bert", "--batch-size", "2", cpus={cpu}, env_extra={
        "OMP_NUM_THREADS": "1", "CPULAUNCH_INSTANCE_INDEX": "3",
        "CPULAUNCH_PLANNED_INFERENCE_PATH": "onednn-graph"})
    res = result_of(proc)
    assert res["affinity"] == str(cpu)
    assert res["threads"] == 1 and res["omp_num_threads"] == "1"
    assert res["instance_index"] == 3
    assert res["path"] == "onednn-graph" and res["fusion_groups"] > 0
    assert res["samples_per_s"] > 0 and res["batch_size"] == 2


def test_preloads_really_mapped_and_bad_env_rejected():
    lib = next((p for p in (find(REGISTRY[n]) for n in ("tcmalloc", "jemalloc")) if p), None)
    if lib is None:
        pytest.skip("neither tcmalloc nor jemalloc installed (apt-get install libtcmalloc-minimal4)")
    missing = "/nonexistent/libnothing.so"
    res = result_of(run_infer("--iterations", "2",
                              env_extra={"LD_PRELOAD": f"{lib} {missing}"}))
    assert res["iterations"] == 2
    assert res["preloaded"][str(lib)] is not None
    assert os.path.realpath(res["preloaded"][str(lib)]) == os.path.realpath(lib)
    assert res["preloaded"][missing] is None

    bad = run_infer(env_extra={"CPULAUNCH_PLANNED_INFERENCE_PATH": "tensorrt"})
    assert bad.returncode == 2
    assert "CPULAUNCH_PLANNED_INFERENCE_PATH is 'tensorrt'" in bad.stderr


def test_text_run_ends_with_the_metric_line():
    proc = run_infer("--iterations", "3", json_output=False)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert not any(line.startswith("{") for line in text.splitlines())
    (metric,) = metric_lines(text)
    assert metric[0] == "samples_per_s" and metric[1] > 0
    assert text.splitlines()[-1] == f"CPULAUNCH_METRIC samples_per_s={metric[1]!r}"
    assert "cnn (small) batch 1 fp32 on eager" in text.splitlines()[0]


def test_metric_line_format():
    sys.path.insert(0, str(INFER.parent))
    import infer

    assert infer.metric_line("samples_per_s", 12.5) == "CPULAUNCH_METRIC samples_per_s=12.5\n"
    assert infer.metric_line("samples_per_s", 3) == "CPULAUNCH_METRIC samples_per_s=3.0\n"
    value = 1234.567890123
    assert float(infer.metric_line("x", value).split("=")[1]) == value
