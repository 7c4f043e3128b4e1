"""Shared test fixtures: the real machines' sysfs dumps, unpacked once per session.

The dumps come from hwloc's test suite (BSD-3-Clause, tests/fixtures/LICENSE-hwloc-BSD-3-Clause).
Each tarball holds one top-level folder that acts as ``/`` for ``--sysroot``.
"""

from __future__ import annotations

import _ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent
MACHINES = sorted(p.name for p in FIXTURES.glob("hw-*") if p.is_dir())
FACTS = json.loads((FIXTURES / "FACTS.json").read_text())


def pytest_configure(config):
    """The programs the tests start run ``python``, ``torchrun`` and ``cpulaunch`` by name, as
    a user does inside the suite's environment (README: ``. .venv/bin/activate`` first). So
    the bin folder of the interpreter running the tests goes first on PATH: ``python`` is
    then that interpreter, with torch, not the first python of the machine's PATH (on a
    clean machine one without torch: 19 tests failed that way)."""
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", os.defpath)
    if path.split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = bin_dir + os.pathsep + path


@pytest.fixture(scope="session")
def sysroots(tmp_path_factory) -> dict:
    """{machine folder name: Path of its unpacked root}, for every fixture machine."""
    return unpack_dumps(MACHINES, tmp_path_factory.mktemp("sysroots"))


def unpack_dumps(names, base: Path) -> dict:
    """{fixture folder name: Path of its unpacked root}: each tests/fixtures/NAME/*.tar.bz2
    (one top folder acting as ``/``) unpacked below ``base``."""
    roots = {}
    for name in names:
        (tarball,) = (FIXTURES / name).glob("*.tar.bz2")
        dest = base / name
        dest.mkdir()
        # tar(1) unpacks these in ~4 s; Python's tarfile takes 20-55 s here. Both keep
        # links inside the folder (the dumps are ours, in the repository).
        tar = shutil.which("tar")
        if tar:
            subprocess.run([tar, "-xjf", str(tarball), "-C", str(dest), "--no-same-owner"], check=True)
        else:
            with tarfile.open(tarball) as tf:
                tf.extractall(dest, filter="data")
        (top,) = [p for p in dest.iterdir()]
        roots[name] = top
    return roots


#: Signals whose disposition or mask a test shell can hand down: nohup ignores SIGHUP, a
#: script's background job ignores SIGINT and SIGQUIT (POSIX sh), a caller may block any.
INHERITED = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGCHLD)


def default_signals() -> None:
    """A ``preexec_fn``: the child starts with :data:`INHERITED` at their default dispositions
    and nothing blocked, as from an interactive shell, whatever the test run itself inherited
    (pytest under nohup, or started in the background by a script). Tests about how
    cpulaunch starts its instances or handles a signal start cpulaunch this way."""
    for sig in INHERITED:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def run_cli(*args: str, env: dict | None = None, timeout: float = 60, check_rc: int | None = 0):
    """Run ``python -m cpulaunch ARGS`` as a real subprocess; returns CompletedProcess."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "cpulaunch", *args],
        capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO,
    )
    if check_rc is not None:
        assert proc.returncode == check_rc, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def plan_json(sysroot, *args: str) -> dict:
    """``cpulaunch --sysroot ROOT --dry-run --format json --allocator default
    --omp-runtime gnu ARGS true`` parsed (library choices pinned so env is host-independent)."""
    proc = run_cli("--sysroot", str(sysroot), "--dry-run", "--format", "json",
                   "--allocator", "default", "--omp-runtime", "gnu", *args, "true")
    return json.loads(proc.stdout)


def json_records(text: str) -> list:
    """Every JSON object in a program's output, wherever it starts: instances and ranks
    share one pipe, so a line can hold a "[i] " prefix or two records glued together."""
    dec, out = json.JSONDecoder(), []
    for line in text.splitlines():
        i = line.find("{")
        while i >= 0:
            try:
                obj, end = dec.raw_decode(line, i)
            except ValueError:
                i = line.find("{", i + 1)
                continue
            out.append(obj)
            i = line.find("{", end)
    return out


# --------------------------------------------------------------------------- oneCCL stand-ins (issue 21)

#: A real ELF shared object of this machine, to stand in for libfabric and its provider.
ELF_SO = Path(_ctypes.__file__)


def plant_fabric(root: Path, *, library: bytes | None = None, provider: bytes | None = None) -> Path:
    """impi-rt's layout below ``root``: lib/libfabric/libfabric.so.1 and prov/libtcp-fi.so
    (copies of a real ELF shared object unless other bytes are given); returns the folder."""
    folder = root / "lib" / "libfabric"
    (folder / "prov").mkdir(parents=True)
    for path, data in ((folder / "libfabric.so.1", library), (folder / "prov" / "libtcp-fi.so", provider)):
        path.write_bytes(data) if data is not None else shutil.copy(ELF_SO, path)
    return folder


def make_stand_in(site: Path, body: str, version: str) -> Path:
    """A stand-in ``oneccl_bindings_for_pytorch`` package in ``site`` (for PYTHONPATH): its
    ``__init__.py`` is ``body``, its package metadata says ``version``; returns its folder."""
    pkg = site / "oneccl_bindings_for_pytorch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body)
    meta = site / f"oneccl_bind_pt-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: oneccl_bind_pt\nVersion: {version}\n")
    return pkg
