"""scripts/bench_ccl.py where oneccl_bindings_for_pytorch cannot run: the one-line skip (a
binding that aborts the interpreter at import must not take the script with it), and the
pure parts (variant grammar, the variables each variant gets, where impi-rt's libfabric is
found). The benchmark itself needs the binding and oneCCL's runtime (docs/cluster.md)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("psutil")  # benchkit's load meter

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_ccl.py"


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
    ``body``, first on the path."""
    pkg = tmp_path / "oneccl_bindings_for_pytorch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    return subprocess.run([sys.executable, str(SCRIPT), "--quick"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("body, why", [
    ("import os\nos.abort()\n", "killed the interpreter with SIGABRT"),
    ("raise ImportError('undefined symbol: _ZN3c104Type')\n",
     "failed: ImportError: undefined symbol: _ZN3c104Type"),
], ids=["aborts", "import-error"])
def test_a_binding_that_does_not_load_is_a_one_line_skip(tmp_path, body, why):
    proc = _run_with_binding(tmp_path, body)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"bench_ccl: skipped: importing oneccl_bindings_for_pytorch with this torch {why}"]


def test_variant_tokens():
    assert bench.tokens("gloo") == []
    assert bench.tokens("ccl") == []
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


def _plant(prefix: Path, provider_bytes: bytes = b"\x7fELF\x02\x01\x01") -> Path:
    lib = prefix / "lib" / "libfabric"
    (lib / "prov").mkdir(parents=True)
    (lib / "libfabric.so.1").write_bytes(b"\x7fELF\x02\x01\x01")
    (lib / "prov" / "libtcp-fi.so").write_bytes(provider_bytes)
    return lib


def test_runtime_env_finds_impi_rt_libfabric(tmp_path):
    empty, venv = tmp_path / "empty", tmp_path / "venv"
    empty.mkdir()
    lib = _plant(venv)
    assert bench.runtime_env({}, [empty, venv]) == (
        {"CCL_OFI_LIBRARY_PATH": str(lib / "libfabric.so.1"),
         "FI_PROVIDER_PATH": str(lib / "prov")}, None)
    # The caller's own value wins over the one found.
    env, why = bench.runtime_env({"FI_PROVIDER_PATH": "/mine"}, [venv])
    assert env["FI_PROVIDER_PATH"] == "/mine" and why is None


def test_runtime_env_wants_elf_files(tmp_path):
    _plant(tmp_path, provider_bytes=b"not a library")
    env, why = bench.runtime_env({}, [tmp_path])
    assert env == {}
    assert why == (f"libfabric not found in {tmp_path}/lib/libfabric (impi-rt installs it there); "
                   "set CCL_OFI_LIBRARY_PATH and FI_PROVIDER_PATH")
