"""scripts/bench_ccl.py where oneccl_bindings_for_pytorch cannot run: the one-line skip (a
binding that aborts the interpreter at import must not take the script with it), and the
pure parts (variant grammar, the variables each variant gets, the launcher's libfabric
lookup). The benchmark itself needs the binding and oneCCL's runtime (docs/guide/ddp.md)."""

from __future__ import annotations

import importlib.util
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
