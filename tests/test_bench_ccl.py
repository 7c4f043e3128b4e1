"""scripts/bench_ccl.py where oneccl_bindings_for_pytorch cannot run: the one-line skip (a
binding that aborts the interpreter at import must not take the script with it), and the
pure parts (variant grammar, the variables each variant gets, the launcher's libfabric
lookup, the protocol's defaults and how its figures are taken). The benchmark itself needs
the binding and oneCCL's runtime (docs/guide/ddp.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_stand_in, plant_fabric

from cpulaunch.machine.host import dist_version

pytest.importorskip("torch")
pytest.importorskip("psutil")  # benchkit's load meter

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_ccl.py"
TORCH = dist_version("torch")


def _load():
    sys.path.insert(0, str(SCRIPT.parent))  # the script imports benchkit from scripts/
    try:
        spec = importlib.util.spec_from_file_location("bench_ccl", SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(SCRIPT.parent))


bench = _load()


def _run_with_binding(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    """Run the script with a stand-in ``oneccl_bindings_for_pytorch`` whose import runs
    ``body``, first on the path (its verdict cached in the test's own folder)."""
    make_stand_in(tmp_path / "site", body, "2.8.0+xpu")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(ROOT)]),
               XDG_CACHE_HOME=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, str(SCRIPT), "--quick"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("body, why", [
    ("import os\nos.abort()\n", "aborts the interpreter at import (SIGABRT)"),
    ("raise ImportError('undefined symbol: _ZN3c104Type')\n", "ImportError: undefined symbol: _ZN3c104Type"),
], ids=["aborts", "import-error"])
def test_a_binding_that_does_not_load_is_a_one_line_skip(tmp_path, body, why):
    """The launcher's own rule and line (``--backend ccl`` would refuse to run)."""
    proc = _run_with_binding(tmp_path, body)
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    pkg = tmp_path / "site" / "oneccl_bindings_for_pytorch"
    head = (f"bench_ccl: skipped: --backend ccl: oneccl_bindings_for_pytorch 2.8.0+xpu ({pkg}) does not "
            f"load with torch {TORCH}: {why} (checked in a child process; verdict kept in ")
    assert line.startswith(head) and line.endswith("); rebuild it against the installed torch, or use --backend gloo")


def test_variant_tokens():
    assert bench.tokens("gloo") == []
    assert bench.tokens("ccl") == []
    assert bench.tokens("ccl:cpulaunch") == ["cpulaunch"]
    assert bench.tokens("ccl:launcher+shm") == ["own", "yield", "shm"]
    assert bench.tokens("ccl:nooffload+tcp") == ["nooffload", "tcp"]
    for bad in ("nccl", "gloo:shm", "ccl:spin", "ccl:shm+fast"):
        with pytest.raises(ValueError):
            bench.tokens(bad)


def test_variant_vars_are_exactly_the_listed_ones():
    runtime = {"CCL_OFI_LIBRARY_PATH": "/p/lib/libfabric/libfabric.so.1",
               "FI_PROVIDER_PATH": "/p/lib/libfabric/prov"}
    cpus = [[0, 2], [1, 3]]
    assert bench.variant_vars("gloo", runtime, cpus) == {}
    assert bench.variant_vars("ccl:cpulaunch", runtime, cpus) == {}
    assert bench.variant_vars("ccl", runtime, cpus) == {"CPULAUNCH_DIST_BACKEND": "ccl", **runtime}
    # One worker per rank on the rank's own first CPU: the list of every local rank's worker.
    assert bench.variant_vars("ccl:launcher+shm", runtime, cpus) == {
        "CPULAUNCH_DIST_BACKEND": "ccl", **runtime, "CCL_WORKER_AFFINITY": "0,1",
        "CCL_YIELD": "sched_yield", "CCL_ATL_SHM": "1"}


def test_the_launcher_variant_runs_with_the_launchers_own_settings():
    argv = bench.job_argv("ccl:cpulaunch", 2, ["p.py"], {"CCL_OFI_LIBRARY_PATH": "/x"}, [[0], [1]])
    assert argv[argv.index("--backend") + 1] == "ccl" and "env" not in argv
    argv = bench.job_argv("ccl", 2, ["p.py"], {"CCL_OFI_LIBRARY_PATH": "/x"}, [[0], [1]])
    assert argv[argv.index("--backend") + 1] == "gloo"
    assert argv[argv.index("env") + 1:argv.index("env") + 3] == ["CCL_OFI_LIBRARY_PATH=/x",
                                                                 "CPULAUNCH_DIST_BACKEND=ccl"]


def test_runtime_env_is_the_launchers(tmp_path):
    """libfabric found as the launcher finds it (impi-rt's layout under I_MPI_ROOT here);
    the caller's own value wins."""
    from cpulaunch.machine.libfinder import find_libfabric

    if find_libfabric({}).library is not None:
        pytest.skip(f"a libfabric lies under sys.prefix ({sys.prefix}): it is found first")
    lib = plant_fabric(tmp_path / "impi")
    environ = {"I_MPI_ROOT": str(tmp_path / "impi")}
    assert bench.runtime_env(environ) == {"CCL_OFI_LIBRARY_PATH": str(lib / "libfabric.so.1"),
                                          "FI_PROVIDER_PATH": str(lib / "prov")}
    assert bench.runtime_env({**environ, "FI_PROVIDER_PATH": "/mine"})["FI_PROVIDER_PATH"] == "/mine"


# --------------------------------------------------------------------------- the protocol


def test_help_gives_the_defaults_a_run_uses(capsys):
    """--help states each protocol option's default (and --quick's) as parse_args applies them."""
    with pytest.raises(SystemExit):
        bench.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    full, quick = bench.parse_args(["--rank"]), bench.parse_args(["--rank", "--quick"])
    assert (full.rounds, full.steps, full.warmup_steps, full.budget, full.size) == (5, 200, 10, 1.0, "small")
    assert full.sizes == [4096, 65536, 1048576, 16777216, 67108864]
    for key in ("rounds", "steps", "warmup_steps", "budget"):
        assert f"default {getattr(full, key)}; {getattr(quick, key)} with --quick" in help_text, key
    assert (f"default {','.join(map(str, full.sizes))} (4 KB, 64 KB, 1 MB, 16 MB, 64 MB); "
            f"{','.join(map(str, quick.sizes))} (4 KB, 1 MB) with --quick") in help_text
    assert "--size {full,small} default small " in help_text  # no "(... with --quick)": the same
    assert "None" not in help_text


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "4KB"], "--sizes takes byte counts separated by commas"),
    (["--rounds", "0"], "--rounds must be at least 1, got 0"),
])
def test_bad_protocol_options_are_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--rank", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def _train_run(step_s_per_rank, batch=16, shas=("a", "a")):
    lines = [json.dumps({"rank": rank, "timed_step_s": steps, "global_batch_size": batch,
                         "param_sha256": sha})
             for rank, (steps, sha) in enumerate(zip(step_s_per_rank, shas))]
    return {"out": "\n".join(["step 10/10 loss 1.0", *lines]) + "\n"}


def test_a_train_step_is_its_slowest_ranks_and_the_figure_their_median():
    fig = bench.train_figures(_train_run([[0.010, 0.030, 0.020, 0.100, 0.020],
                                          [0.012, 0.020, 0.021, 0.020, 0.040]]))
    # per step, the slower rank: 0.012, 0.030, 0.021, 0.100, 0.040
    assert fig["steps"] == 5
    assert fig["step_s"] == pytest.approx(0.030)
    assert (fig["step_q1_s"], fig["step_q3_s"]) == (pytest.approx(0.021), pytest.approx(0.040))
    assert fig["samples_per_s"] == pytest.approx(16 / 0.030)
    assert fig["param_sha256"] == "a"
    assert bench.train_figures(_train_run([[0.01], [0.01]], shas=("a", "b")))["param_sha256"] is None
    assert bench.train_figures({"out": "no json\n"}) is None


def _round_runs(figures, busy):
    return [{"figures": f, "busy": b} for f, b in zip(figures, busy)]


def test_ratios_are_per_round_and_busy_rounds_are_left_out_when_any_is_quiet():
    runs = {"gloo": _round_runs([{"step_s": 0.04}, {"step_s": 0.05}, None], [False, True, False]),
            "ccl": _round_runs([{"step_s": 0.02}, {"step_s": 0.01}, {"step_s": 0.02}], [False, False, False])}
    good, quiet = bench.quoted(runs)
    assert quiet and good["gloo"][1] is None and good["gloo"][2] is None  # busy; no figures
    step = {v: [r["figures"]["step_s"] if r else None for r in rs] for v, rs in good.items()}
    assert bench.ratios(step["gloo"], step["ccl"]) == [pytest.approx(2.0)]  # round 1 only
    assert bench.xcell([2.0, 1.5, 3.0]) == "2.00x [1.50-3.00]"
    assert bench.cell([0.0101, None, 0.0123, 0.0111], 1e3, ".1f") == "11.1 [10.1-12.3]"
    assert bench.cell([None], 1e3, ".1f") == "-"
    all_busy = {"gloo": _round_runs([{"step_s": 0.04}], [True])}
    good, quiet = bench.quoted(all_busy)
    assert not quiet and good["gloo"][0] is not None
    assert bench.which_runs(all_busy) == "1 of 1 runs, NONE QUIET: not to be quoted"
    assert bench.which_runs(runs) == "4 of 6 runs: the quiet ones"  # gloo: 1, ccl: 3
