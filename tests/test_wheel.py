"""Issue 20: the installed package stands on its own.

A wheel built with ``python -m build`` from a copy of the checkout is installed, with its
declared dependencies from the package index, into a fresh virtual environment; every
command then runs from a folder outside the checkout, so nothing can come from the
repository (tune once imported ``scripts/benchkit.py`` by file path, and a wheel's tune could
not find its load meter). Checked: the package imported is the venv's, ``cpulaunch --help``,
``doctor`` (its JSON), ``tune --dry-run``, and the README's main job (``examples/infer.py``,
short) with torch reached from the test's own environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _run(argv, cwd, timeout=600, env=None):
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    full.update(env or {})
    return subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=full)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv bin folder, a working folder outside the checkout): the wheel built from a
    copy of the tracked files, installed into a fresh venv."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    dist = base / "dist"
    built = _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist,
                  src], cwd=base)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = dist.glob("cpulaunch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "cpulaunch/tools/tune/load.py" in names and not any(n.startswith(("scripts/", "tests/"))
                                                                for n in names)
    # the command is scripts/cpulaunch (no entry point, whose wrapper pip writes with `import re`)
    assert [n for n in names if "/scripts/" in n] == [f"cpulaunch-{wheel.name.split('-')[1]}.data/scripts/cpulaunch"]
    venv = base / "venv"
    made = _run([sys.executable, "-m", "venv", venv], cwd=base)
    assert made.returncode == 0, made.stderr
    pip = _run([venv / "bin" / "python", "-m", "pip", "install", "-q", wheel], cwd=base)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    work = base / "work"
    work.mkdir()
    return venv / "bin", work


def _cpulist(cpus) -> str:
    from cpulaunch import cpulist

    return cpulist.format(cpus)


def test_the_venv_imports_its_own_copy(installed):
    bin_dir, work = installed
    proc = _run([bin_dir / "python", "-c", "import cpulaunch, sys; print(cpulaunch.__file__)"],
                cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith(str(bin_dir.parent)), proc.stdout
    first = (bin_dir / "cpulaunch").read_text().splitlines()[0]  # pip rewrote scripts/cpulaunch's "#!python"
    assert first.startswith(f"#!{bin_dir / 'python'}") and os.access(bin_dir / "cpulaunch", os.X_OK), first


def test_help_doctor_and_tune_dry_run(installed):
    bin_dir, work = installed
    cli = bin_dir / "cpulaunch"
    helped = _run([cli, "--help"], cwd=work)
    assert helped.returncode == 0 and helped.stdout.startswith("Usage: cpulaunch"), helped.stderr
    doctor = _run([cli, "doctor", "--format", "json"], cwd=work)
    assert doctor.returncode in (0, 1), doctor.stderr  # 1: findings on this host, still a report
    report = json.loads(doctor.stdout)
    assert report["live"] is True and report["root"] == "/"
    assert report["topology"]["allowed"] == _cpulist(os.sched_getaffinity(0)), report["topology"]
    tune = _run([cli, "tune", "--dry-run", "--", "true"], cwd=work)
    assert tune.returncode == 0, tune.stdout + tune.stderr
    lines = tune.stdout.splitlines()
    assert lines[0].startswith("axes: instances ") and "instances=1: --ninstances 1 -> CPUs " in lines[1]
    assert any(line.startswith("grid: ") and " configurations x " in line for line in lines), tune.stdout


def test_main_job_runs_from_the_wheel(installed, tmp_path):
    """README's main job (short) under the venv's cpulaunch; torch comes from the test's
    environment through a .pth file placed after the venv's own packages, so the venv's
    cpulaunch is still the one imported (checked)."""
    pytest.importorskip("torch")
    bin_dir, work = installed
    purelib = sysconfig.get_paths()["purelib"]
    torch_dir = str(Path(__import__("torch").__file__).resolve().parents[1])
    (site,) = (bin_dir.parent / "lib").glob("python*/site-packages")
    (site / "zz-outer-torch.pth").write_text(f"{torch_dir}\n" if torch_dir != purelib else f"{purelib}\n")
    seen = _run([bin_dir / "python", "-c", "import torch, cpulaunch; print(cpulaunch.__file__)"],
                cwd=work)
    assert seen.returncode == 0 and seen.stdout.startswith(str(bin_dir.parent)), seen
    infer = REPO / "examples" / "infer.py"
    proc = _run([bin_dir / "cpulaunch", bin_dir / "python", infer, "--size", "small",
                 "--seconds", "1", "--json"], cwd=work, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = [json.loads(line.split("] ", 1)[-1]) for line in proc.stdout.splitlines() if "{" in line]
    assert recs and all(r["samples_per_s"] > 0 for r in recs), proc.stdout


def test_a_rank_gets_the_exit_hook_from_the_wheel(installed):
    """Issue 24 item 8: the site hook ships in the wheel, and a Python rank started by the
    installed cpulaunch loads it from the venv (not from a checkout)."""
    bin_dir, work = installed
    code = ("import os, sys; print(os.environ['PYTHONPATH']); "
            "print(sys.modules['_cpulaunch_exithook'].__file__, sys.modules['sitecustomize'].__file__)")
    proc = _run([bin_dir / "cpulaunch", "--ddp", "--nproc-per-node", "1", "--allocator", "default",
                 bin_dir / "python", "-c", code], cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (site,) = (bin_dir.parent / "lib").glob("python*/site-packages")
    hook = site / "cpulaunch" / "runtime" / "sitehook"
    path, files = proc.stdout.splitlines()
    assert path == str(hook)
    assert files.split() == [str(hook.parent / "exithook.py"), str(hook / "sitecustomize.py")]


#: Modules a run from the wheel never imports (issue 40: each cost every run milliseconds:
#: docs/dev/measurements.md); the checkout's own guard (tests/test_parsers.py) runs in an
#: editable install, whose import hook has already loaded re, enum and more.
NOT_ON_A_RUN = ("typing", "shutil", "signal", "glob", "struct", "contextlib", "pathlib", "subprocess", "json",
                "logging", "click", "importlib", "urllib", "ipaddress", "threading", "tempfile", "platform",
                "inspect", "dataclasses", "re", "enum", "functools", "collections", "operator", "shlex", "fnmatch",
                "warnings", "runpy")
#: The runs: the dry run, the exec path quiet and with -v (its lines and notes are written
#: without logging, cpulaunch.log), and a run on a PATH without numactl, which prints a note
#: ("numactl not found here"; tests/test_log.py).
RUNS = (["--dry-run", "true"], ["-q", "true"], ["-v", "true"], ["no numactl", "true"])
#: Standard modules a plain run from the wheel may import beyond `python -c pass`'s: 6 here
#: (__future__, _collections, errno, gc, select, types); math and bisect come where a cgroup
#: quota or a split plan needs them.
WHEEL_RUN_BUDGET = {"cpulaunch": 35, "other": 9}


def _imported(argv, cwd, env=None) -> set:
    """The modules ``python -X importtime`` reports for ``argv`` (a list starting with the
    interpreter), as names; ``env``: variables to set besides."""
    proc = _run(argv, cwd, env={"PYTHONDONTWRITEBYTECODE": "", **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("import time:") and "self [us]" not in ln]
    return {ln.rsplit("|", 1)[1].strip() for ln in lines}


@pytest.mark.parametrize("args", RUNS)
def test_a_run_from_the_wheel_keeps_its_import_budget(installed, args):
    """The `cpulaunch` command as pip installed it (scripts/cpulaunch, its first line
    rewritten), run from the wheel's venv: the modules it imports beyond the interpreter's
    own start, by name and by count."""
    bin_dir, work = installed
    python = str(bin_dir / "python")
    base = _imported([python, "-X", "importtime", "-c", "pass"], work)
    env = {}
    if args[0] == "no numactl":
        args, path = args[1:], work / "no-numactl"
        path.mkdir(exist_ok=True)
        if not (path / "true").exists():
            (path / "true").symlink_to(shutil.which("true"))
        env = {"PATH": str(path)}
    new = _imported([python, "-X", "importtime", str(bin_dir / "cpulaunch"), *args], work, env) - base
    ours = sorted(m for m in new if m == "cpulaunch" or m.startswith("cpulaunch."))
    others = sorted(new - set(ours))
    assert "cpulaunch.option_table" in ours and "gc" in others, (ours, others)  # the report was read
    assert [m for m in others if m.split(".")[0] in NOT_ON_A_RUN] == [], others
    assert [m for m in ours if m.startswith(("cpulaunch.cli", "cpulaunch.tools", "cpulaunch.svg"))] == [], ours
    assert len(ours) <= WHEEL_RUN_BUDGET["cpulaunch"], ours
    assert len(others) <= WHEEL_RUN_BUDGET["other"], others


def test_a_plain_run_from_the_command_collects_no_garbage(installed):
    """The command's entry (cpulaunch.__main__) lets the young generation grow to 10,000
    objects: a plain dry run from the wheel, which allocates some 5,000 objects that live
    until exit, makes no cyclic collection (at Python's 700 it made 7: 1.8 ms here). The
    same run through cmdline.main alone, at the default threshold, does collect (so the
    count is read)."""
    bin_dir, work = installed
    count = ("import gc, sys, atexit; n = []; gc.callbacks.append(lambda phase, info: n.append(1) if phase == 'stop'"
             " else None); atexit.register(lambda: print(len(n), file=sys.stderr)); ")
    env = {"PYTHONDONTWRITEBYTECODE": ""}  # bytecode as pip compiled it, as a user runs it
    entry = _run([bin_dir / "python", "-c", count + "sys.argv[0] = 'cpulaunch'; from cpulaunch.__main__ import main; "
                  "main()", "--dry-run", "true"], cwd=work, env=env)
    assert entry.returncode == 0 and entry.stderr.splitlines()[-1] == "0", entry.stderr
    plain = _run([bin_dir / "python", "-c", count + "from cpulaunch import cmdline; sys.exit(cmdline.main(sys.argv[1:]))",
                  "--dry-run", "true"], cwd=work, env=env)
    assert plain.returncode == 0 and int(plain.stderr.splitlines()[-1]) > 0, plain.stderr
