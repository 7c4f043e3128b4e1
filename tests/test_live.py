"""On this machine, for real: what the child process gets matches the plan.

The child's affinity (os.sched_getaffinity), its thread count (torch.get_num_threads), the
libraries really mapped (/proc/self/maps), the NUMA policy (numactl --show) are compared
with `cpulaunch --dry-run --format json` for the same options. numactl, libjemalloc2,
libtcmalloc-minimal4 and intel-openmp are installed by scripts/test.sh; a test skips with
the reason when one is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, json_records, run_cli
from cpulaunch import cpulist
from cpulaunch.machine import libfinder, libraries

PY = sys.executable
NCORES = len(os.sched_getaffinity(0))
HAS_NUMACTL = shutil.which("numactl") is not None

PROBE = r"""
import json, os, sys
maps = open("/proc/self/maps").read()
rec = {
    "affinity": sorted(os.sched_getaffinity(0)),
    "env": {k: v for k, v in os.environ.items()
            if k.startswith(("OMP_", "KMP_", "CPULAUNCH_", "MALLOC_CONF", "LD_PRELOAD"))},
    "mapped": sorted({l.split()[-1] for l in maps.splitlines()
                      if any(m in l for m in ("libiomp5", "libjemalloc", "libtcmalloc"))}),
}
if "--torch" in sys.argv:
    import torch
    rec["threads"] = torch.get_num_threads()
    torch.ones(64, 64) @ torch.ones(64, 64)  # runs the OpenMP runtime
print(json.dumps(rec), flush=True)
"""


@pytest.fixture
def probe_py(tmp_path):
    p = tmp_path / "probe_child.py"
    p.write_text(PROBE)
    return str(p)


def records(stdout: str) -> list:
    return json_records(stdout)


def dry(*args) -> dict:
    return json.loads(run_cli("--dry-run", "--format", "json", *args).stdout)


def find(name):
    path = libfinder.find(libraries.REGISTRY[name])
    if path is None:
        pytest.skip(f"{name} not installed here ({libraries.REGISTRY[name].install})")
    return path


@pytest.mark.skipif(not HAS_NUMACTL, reason="numactl not installed (apt-get install numactl)")
def test_default_run_matches_plan_with_torch_threads(probe_py):
    plan = dry("--allocator", "default", PY, probe_py)
    (inst,) = plan["instances"]
    (rec,) = records(run_cli("--allocator", "default", PY, probe_py, "--torch").stdout)
    assert rec["affinity"] == inst["cpus"]
    assert rec["threads"] == len(inst["cpus"]) == int(rec["env"]["OMP_NUM_THREADS"])
    for k, v in inst["env"].items():
        assert rec["env"][k] == v


@pytest.mark.skipif(NCORES < 2 or not HAS_NUMACTL, reason="needs 2 CPUs and numactl")
def test_two_instances_each_on_its_core(probe_py):
    plan = dry("--ninstances", "2", "--allocator", "default", PY, probe_py)
    recs = records(run_cli("--ninstances", "2", "--allocator", "default", PY, probe_py, "--torch").stdout)
    by_idx = {int(r["env"]["CPULAUNCH_INSTANCE_INDEX"]): r for r in recs}
    assert sorted(by_idx) == [0, 1]
    for inst in plan["instances"]:
        rec = by_idx[inst["index"]]
        assert rec["affinity"] == inst["cpus"] and len(inst["cpus"]) == 1
        assert rec["threads"] == 1
    assert set(by_idx[0]["affinity"]).isdisjoint(by_idx[1]["affinity"])


@pytest.mark.skipif(NCORES < 2 or not HAS_NUMACTL, reason="needs 2 CPUs and numactl")
def test_numactl_policy_really_applied():
    out = run_cli("--ninstances", "2", "--allocator", "default", "numactl", "--show").stdout
    shows = {}
    for line in out.splitlines():
        idx, rest = line.split("] ", 1)
        shows.setdefault(idx.strip("["), []).append(rest)
    for idx, lines in shows.items():
        text = "\n".join(lines)
        assert "policy: bind" in text
        assert f"physcpubind: {idx} " in text + " "
        assert "membind: 0" in text
    interleave = run_cli("--mem-policy", "interleave", "--allocator", "default", "numactl", "--show").stdout
    assert "policy: interleave" in interleave


@pytest.mark.parametrize("allocator", ["tcmalloc", "jemalloc"])
def test_allocator_really_preloaded(probe_py, allocator):
    path = find(allocator)
    (rec,) = records(run_cli("--allocator", allocator, PY, probe_py).stdout)
    assert os.path.realpath(path) in rec["mapped"]
    assert rec["env"]["LD_PRELOAD"].split()[0] == str(path)
    if allocator == "jemalloc":
        assert rec["env"]["MALLOC_CONF"].startswith("oversize_threshold:1")


def test_intel_openmp_really_used(probe_py):
    """libiomp5 preloaded is mapped, and KMP_VERSION=true makes it print its banner
    (libgomp stays mapped too, so its presence proves nothing)."""
    path = find("iomp5")
    proc = run_cli("--omp-runtime", "intel", "--allocator", "default", PY, probe_py, "--torch",
                   env={"KMP_VERSION": "true"})
    (rec,) = records(proc.stdout)
    assert os.path.realpath(path) in rec["mapped"]
    assert "Intel(R) OMP" in proc.stderr or "LLVM OMP" in proc.stderr
    assert rec["env"]["KMP_BLOCKTIME"] == "1"
    assert rec["env"]["KMP_AFFINITY"] == "granularity=fine,compact,1,0"
    assert rec["threads"] == len(rec["affinity"])


def test_affinity_binding_without_numactl(probe_py):
    plan = dry("--bind", "affinity", "--instance-idx", "0", "--ninstances", str(NCORES), PY, probe_py)
    (inst,) = plan["instances"]
    assert inst["argv"][0] == PY  # no numactl prefix
    (rec,) = records(run_cli("--bind", "affinity", "--instance-idx", "0", "--ninstances", str(NCORES),
                             PY, probe_py).stdout)
    assert rec["affinity"] == inst["cpus"]


def test_missing_numactl_falls_back_to_affinity_with_note(probe_py, tmp_path):
    """PATH without numactl: CPUs still bound (sched_setaffinity), memory binding dropped, said."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(PY)
    env = {"PATH": str(bindir)}
    plan = json.loads(run_cli("--dry-run", "--format", "json", "--instance-idx", "0",
                              "--ninstances", str(NCORES), "python", probe_py, env=env).stdout)
    assert any("numactl not found" in n and "memory binding dropped" in n for n in plan["notes"])
    proc = run_cli("--instance-idx", "0", "--ninstances", str(NCORES), "python", probe_py, env=env)
    (rec,) = records(proc.stdout)
    assert rec["affinity"] == plan["instances"][0]["cpus"]
    assert "numactl not found" in proc.stderr


@pytest.mark.skipif(not HAS_NUMACTL, reason="numactl not installed")
def test_print_env_eval_then_prefix_runs_bound(tmp_path, probe_py):
    shell = shutil.which("bash") or shutil.which("sh")
    script = (f'eval "$({PY} -m cpulaunch --print-env --instance-idx {NCORES - 1} --ninstances {NCORES})"\n'
              f'$CPULAUNCH_PREFIX {PY} {probe_py}\n')
    proc = subprocess.run([shell, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60)
    (rec,) = records(proc.stdout)
    assert rec["affinity"] == [sorted(os.sched_getaffinity(0))[-1]]
    assert rec["env"]["CPULAUNCH_INSTANCE_INDEX"] == str(NCORES - 1)
    assert rec["env"]["OMP_NUM_THREADS"] == "1"


def test_print_env_json_and_dotenv():
    doc = json.loads(run_cli("--print-env", "--format", "json", "--allocator", "default").stdout)
    assert doc["cpulist"] == cpulist.format(doc["cpus"])
    assert doc["env"]["OMP_NUM_THREADS"] == str(len(doc["cpus"]))
    text = run_cli("--print-env", "--format", "dotenv", "--allocator", "default").stdout
    assert f'OMP_NUM_THREADS={len(doc["cpus"])}' in text.splitlines()  # POSIX sh form (set -a; .)


def test_user_env_wins_and_is_said():
    proc = run_cli("--dry-run", "--format", "json", "true", env={"OMP_NUM_THREADS": "13"})
    doc = json.loads(proc.stdout)
    assert "OMP_NUM_THREADS" not in doc["instances"][0]["env"]
    assert any(n.startswith("OMP_NUM_THREADS=13 from your environment kept") for n in doc["notes"])
    doc = json.loads(run_cli("--dry-run", "--format", "json", "--override-env", "true",
                             env={"OMP_NUM_THREADS": "13"}).stdout)
    assert doc["instances"][0]["env"]["OMP_NUM_THREADS"] == str(len(doc["instances"][0]["cpus"]))


def test_launch_path_does_not_import_torch_or_cpuinfo():
    code = ("import sys, runpy; sys.argv=['cpulaunch','--dry-run','true'];\n"
            "try:\n runpy.run_module('cpulaunch', run_name='__main__')\nexcept SystemExit: pass\n"
            "bad=[m for m in sys.modules if m.split('.')[0] in ('torch','cpuinfo')]; print(bad)")
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=REPO).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_plain_launch_path_imports_only_what_it_needs():
    """Issue 12: a one-instance run logs nothing, prints text and execs one process, so it
    imports no logging (cpulaunch.log imports it at the first message), json, subprocess
    (numactl's check is a posix_spawn), supervisor (cpulaunch.launch.supervise, .group) or
    distributed code
    (no engine variable set)."""
    code = ("import sys, runpy; sys.argv=['cpulaunch','--dry-run','true'];\n"
            "try:\n runpy.run_module('cpulaunch', run_name='__main__')\nexcept SystemExit: pass\n"
            "print(sorted(m for m in sys.modules if m in ('logging', 'json', 'subprocess', "
            "'cpulaunch.launch.supervise', 'cpulaunch.launch.group', 'cpulaunch.distributed')))")
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "PMIX_RANK")}
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=REPO, env=env)
    assert proc.stderr == ""
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_the_exec_path_imports_no_signal_module():
    """Issue 40: a one-instance run that execs its program (numactl's check child, then
    exec_spec) resets the signals with CPython's _signal, not the signal module, whose
    enums cost each run about 1.3 ms; nor does it import typing, subprocess or json, nor
    logging where a note is printed (numactl not installed, for one: cpulaunch.log writes it).
    The probe replaces os.execve, to print what was imported at the exec. (That no run
    imports warnings, which os.execvpe's PATH search would, test_wheel.py checks from a
    wheel: this checkout's editable install has imported it before any run.)"""
    code = ("import os, sys\n"
            "def at_exec(prog, argv, env):\n"
            "    print(prog, sorted(m for m in sys.modules if m in ('signal', 'typing', 'subprocess', 'json',\n"
            "                                                        'logging')))\n"
            "    os._exit(0)\n"
            "os.execve = at_exec\n"
            "from cpulaunch import cmdline\n"
            "cmdline.main(['--allocator', 'default', 'true'])\n")
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert all(line.startswith("cpulaunch: note: ") for line in proc.stderr.splitlines()), proc.stderr
    prog, imported = proc.stdout.strip().split(" ", 1)
    assert os.path.basename(prog) in ("numactl", "true") and imported == "[]", proc.stdout


def test_launch_path_records_are_built_without_typing():
    """Issue 12, then 40: typing.NamedTuple compiled a ForwardRef for every string
    annotation and importing typing cost each run several ms, so the launch path's records
    derive from :class:`cpulaunch.records.Record` (tuples with named fields, their
    annotations plain text) and its modules import typing's names for type checkers only. A fresh
    interpreter imports them all without typing, and each record is a namedtuple."""
    code = ("import sys, importlib\n"
            "names = ('machine.topology', 'options', 'plan', 'render', 'core', 'machine.host',\n"
            "         'machine.libraries', 'launch.spawn')\n"
            "records = []\n"
            "for name in names:\n"
            "    mod = importlib.import_module('cpulaunch.' + name)\n"
            "    records += [o for o in vars(mod).values() if isinstance(o, type) and issubclass(o, tuple)\n"
            "                and o.__module__ == mod.__name__ and hasattr(o, '_fields')]\n"
            "print(len(records), 'typing' in sys.modules)\n")
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    count, typing_imported = proc.stdout.split()
    assert int(count) >= 20 and typing_imported == "False", proc.stdout


def test_objects_frozen_before_the_last_collection_at_exit():
    """Issue 12/20: the entry point moves every live object to the permanent generation
    before the interpreter's last collection at exit (measured: about 6% of a 1,024-CPU
    ``--dry-run``'s instructions, docs/dev/measurements.md); the collector itself is left alone
    while the plan is prepared (it runs as Python's defaults say). Seen from a real run: an
    atexit hook reads the freeze count and whether the collector is enabled."""
    code = ("import sys, gc, atexit, runpy\n"
            "atexit.register(lambda: print(gc.isenabled(), gc.get_freeze_count() > 0))\n"
            "sys.argv = ['cpulaunch', '--dry-run', '--format', 'json', 'true']\n"
            "runpy.run_module('cpulaunch', run_name='__main__')\n")
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "True True"


@pytest.mark.slow
@pytest.mark.skipif(not HAS_NUMACTL, reason="numactl not installed")
def test_main_job_instances_per_socket_runs_infer(tmp_path):
    """README's main job, short: the exact `--instances-per-socket python ...` form."""
    plan = dry("--instances-per-socket", "python", "examples/infer.py")
    proc = run_cli("--instances-per-socket", "python", "examples/infer.py", "--size", "small",
                   "--seconds", "1", "--json", timeout=300)
    recs = [json.loads(l.split("] ", 1)[-1]) for l in proc.stdout.splitlines() if "{" in l]
    assert len(recs) == len(plan["instances"])
    for inst, rec in zip(plan["instances"], recs):
        assert rec["affinity"] == inst["cpulist"]
        assert rec["threads"] == len(inst["cpus"])
        assert rec["samples_per_s"] > 0


def test_numactl_refused_falls_back_to_affinity_with_reason(probe_py, tmp_path):
    """A numactl that is refused (as in a container whose seccomp profile blocks
    set_mempolicy) is detected on the planned CPUs/nodes before launch: CPUs are bound with
    sched_setaffinity instead, and the note says memory binding was dropped and why."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "numactl"
    fake.write_text("#!/bin/sh\necho 'set_mempolicy: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}"}
    args = ["--instance-idx", "0", "--ninstances", str(NCORES), PY, probe_py]
    plan = json.loads(run_cli("--dry-run", "--format", "json", *args, env=env).stdout)
    (note,) = [n for n in plan["notes"] if "set_mempolicy" in n]
    assert "Operation not permitted" in note and "memory binding dropped" in note
    assert plan["instances"][0]["argv"][0] == PY
    proc = run_cli(*args, env=env)
    (rec,) = records(proc.stdout)
    assert rec["affinity"] == plan["instances"][0]["cpus"]
