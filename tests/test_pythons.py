"""The run path works on every Python pyproject.toml allows (3.9 and later), not only on the
one the suite runs under: the start-up work (cpulaunch.records, cpulaunch.enums) uses the
interpreter's internals, whose names changed between versions (``co_qualname`` is 3.11's).

Each Python 3.9-3.13 found (``python3.N`` on PATH, or pyenv's ``versions/3.N.*``) plans a fixture machine from the checkout, without any package installed (a plain
run imports none), and prints the same plan as this interpreter."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, unpack_dumps

MACHINE = "hw-32amd64-4s2n4c-cgroup2"


def _pythons() -> dict:
    """{(major, minor): interpreter} for the Pythons 3.9-3.13 that start, this one included."""
    found = {sys.version_info[:2]: sys.executable}
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    for minor in range(9, 14):
        candidates = [shutil.which(f"python3.{minor}"), *sorted(pyenv.glob(f"3.{minor}.*/bin/python3.{minor}"))]
        for exe in filter(None, candidates):
            if (3, minor) in found:
                break
            proc = subprocess.run([str(exe), "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                                  text=True, timeout=60)
            if proc.returncode == 0 and proc.stdout.split() == ["3", str(minor)]:
                found[(3, minor)] = str(exe)
    return found


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return unpack_dumps([MACHINE], tmp_path_factory.mktemp("pythons"))[MACHINE]


def _plan(python: str, root, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CPULAUNCH_"))}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([python, "-m", "cpulaunch", "--sysroot", str(root), "--dry-run", "--instances-per-socket",
                           "true"], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def test_every_python_plans_as_this_one(root, tmp_path):
    pythons = _pythons()
    ours = _plan(sys.executable, root, tmp_path)
    assert ours.returncode == 0 and ours.stdout.startswith("# instance 0: cpus 0-5, memory bind 0-1\n"), ours.stderr
    for version, python in sorted(pythons.items()):
        got = _plan(python, root, tmp_path)
        assert (got.returncode, got.stdout, got.stderr) == (0, ours.stdout, ours.stderr), (version, python)
