"""`cpulaunch doctor --sysroot DUMP` on hostile dumps: a FIFO, /dev/zero, a folder or a huge
file in place of any file doctor reads is a finding naming the file, never a hang, a
MemoryError or a traceback (issue 19); and doctor's exit status gates a CI job.

Every run here is a real `python -m cpulaunch doctor` child with a timeout: a hang fails
the test instead of stopping the suite."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_doctor import make_root

#: Files doctor reads itself (the probe's are found by the audit hook below too).
KNOBS = (
    "/proc/cpuinfo",
    "/proc/sys/kernel/numa_balancing",
    "/sys/kernel/mm/transparent_hugepage/enabled",
    "/sys/kernel/mm/transparent_hugepage/defrag",
    "/sys/devices/system/cpu/smt/active",
    "/sys/devices/system/cpu/smt/control",
    "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor",
    "/sys/devices/system/cpu/cpufreq/policy1/scaling_governor",
    "/sys/devices/system/cpu/cpufreq/policy1/related_cpus",
)

#: A run must answer in far less than this (a run takes about 0.3 s here).
ANSWER_S = 10.0


def _env() -> dict:
    """A user's environment with nothing that makes a finding of its own."""
    keep = {k: os.environ[k] for k in ("PYTHONDONTWRITEBYTECODE",) if k in os.environ}
    return {"PATH": os.environ.get("PATH", os.defpath), "HOME": os.environ.get("HOME", "/root"),
            "LC_ALL": "C.UTF-8", **keep}


def _limit_memory() -> None:
    """In the child: 1 GiB of address space (doctor needs about 0.6, most of it
    libtorch_cpu.so mapped), so an unbounded read is a MemoryError, not 1.8 GiB of this
    shared machine."""
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def _doctor(*args: str, env: dict | None = None) -> tuple:
    """(exit code, parsed JSON or None, stderr, seconds) of `python -m cpulaunch doctor ARGS`."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "cpulaunch", "doctor", *args], capture_output=True,
                          text=True, timeout=3 * ANSWER_S, env=env or _env(), cwd=REPO,
                          preexec_fn=_limit_memory)
    took = time.monotonic() - start
    doc = json.loads(proc.stdout) if "--format" in args and proc.stdout else None
    return proc.returncode, doc, proc.stderr, took


def _read_paths(root: Path) -> list:
    """Every path below ``root`` that doctor opens (or tries to), in order, seen by an audit
    hook on the "open" event in a child running ``doctor.diagnose``."""
    code = (
        "import json, sys\n"
        "root = sys.argv[1]\n"
        "seen = []\n"
        "def hook(event, args):\n"
        "    if event == 'open' and isinstance(args[0], str) and args[0].startswith(root + '/'):\n"
        "        seen.append(args[0][len(root):])\n"
        "sys.addaudithook(hook)\n"
        "from cpulaunch.tools import doctor\n"
        "doctor.diagnose(root, {'PATH': ''}, live=False)\n"
        "print(json.dumps(list(dict.fromkeys(seen))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True,
                         timeout=60, cwd=REPO, check=True)
    return json.loads(out.stdout)


def _plant(root: Path, rel: str, kind: str) -> Path:
    """Put a FIFO, a link to /dev/zero, a folder or a 4 GiB sparse file at ``root/rel``."""
    path = root / rel.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    else:
        with open(path, "wb") as f:
            f.truncate(4 << 30)
    return path


WHY = {"fifo": "not a regular file (a FIFO)", "zero": "not a regular file (a character device)",
       "folder": "not a regular file (a folder)", "huge": "larger than 1048576 bytes"}


def _assert_named(root: Path, rel: str, kind: str, rc: int, doc: dict, stderr: str, took: float) -> None:
    """The run answered in time and named ``rel``: a file-not-read warning (exit 0), or, for
    a file the topology cannot do without, the topology error (exit 1)."""
    assert rc != "hang" and took < ANSWER_S, (rel, kind, rc, took)
    assert "Traceback" not in stderr and "internal error" not in stderr, (rel, kind, stderr)
    assert doc is not None, (rel, kind, rc, stderr)
    ids = {f["id"]: f for f in doc["findings"]}
    path = f"{root}{rel}"
    if rc == 0:
        f = ids.get(f"file-not-read:{path}")
        assert f is not None, (rel, kind, sorted(ids))
        assert (f["severity"], f["summary"]) == ("warn", f"{path} was not read: {WHY[kind]}")
        assert doc["worst"] == "warn"
    else:
        assert rc == 1, (rel, kind, rc, stderr)
        f = ids["topology"]
        assert f["severity"] == "error" and doc["worst"] == "error"
        assert f"{rel}: {WHY[kind]}" in f["summary"], (rel, kind, f["summary"])


#: A child that, for each (path, kind) on its stdin, copies the machine, plants the fault,
#: runs the CLI entry (``cpulaunch.cli.main(["doctor", ...])``: parse, diagnose, print,
#: exit status) with stdout and stderr in files, and prints one JSON line per case. One
#: interpreter for a hundred cases (a fresh ``python -m cpulaunch`` each takes 0.3-1 s
#: on this shared machine). A case still running after ANSWER_S seconds is stopped by
#: SIGALRM and recorded as "hang"; memory is limited as in :func:`_limit_memory`.
DRIVER = """
import json, os, shutil, signal, sys, tempfile, time
sys.path.insert(0, os.getcwd())
from tests.test_doctor_faults import _limit_memory, _plant, ANSWER_S
from cpulaunch import cli
_limit_memory()
class Hang(BaseException):
    pass
def alarm(signum, frame):
    raise Hang()
signal.signal(signal.SIGALRM, alarm)
src, work = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    rel, kind = json.loads(line)
    if os.path.exists(work):
        shutil.rmtree(work)
    shutil.copytree(src, work, symlinks=True)
    _plant(__import__("pathlib").Path(work), rel, kind)
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        start = time.monotonic()
        signal.alarm(int(ANSWER_S))
        try:
            rc = cli.main(["doctor", "--sysroot", work, "--format", "json"])
        except Hang:
            rc = "hang"
        finally:
            signal.alarm(0)
            took = time.monotonic() - start
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
        out.seek(0)
        err.seek(0)
        result = [rel, kind, rc, out.read().decode(), err.read().decode(), took]
    print(json.dumps(result), flush=True)
"""


def test_a_fifo_or_dev_zero_at_any_file_doctor_reads(tmp_path):
    """For each file doctor opens on a generated machine (found, not listed by hand), a FIFO
    there and then a link to /dev/zero: answered at once, the file named, exit 0 or 1."""
    root = make_root(tmp_path / "m")
    paths = _read_paths(root)
    assert set(KNOBS) <= set(paths), sorted(set(KNOBS) - set(paths))
    assert len(paths) > 40  # the probe's files too: cpulists, cgroup files, node files
    cases = [(rel, kind) for rel in paths for kind in ("fifo", "zero")]
    work = tmp_path / "w"
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(root), str(work)], capture_output=True,
                          text=True, input="".join(json.dumps(c) + "\n" for c in cases),
                          timeout=60 + len(cases) * (ANSWER_S + 1), env=_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [tuple(r[:2]) for r in results] == cases
    for rel, kind, rc, out, err, took in results:
        _assert_named(work, rel, kind, rc, json.loads(out) if out else None, err, took)
        if rel in KNOBS:  # doctor's own files never make the machine unreadable
            assert rc == 0, (rel, kind)


@pytest.mark.parametrize("kind", ["fifo", "zero", "folder", "huge"])
def test_a_fault_at_each_of_doctors_own_files_with_the_cli(tmp_path, kind):
    """The same through `python -m cpulaunch doctor` itself, with the fault at every file
    doctor reads for itself at once. Before: a FIFO hung it until killed, /dev/zero grew
    it to 1.8 GiB then MemoryError, a 4 GiB (sparse) file was read whole."""
    root = make_root(tmp_path / "m")
    for rel in KNOBS:
        _plant(root, rel, kind)
    rc, doc, stderr, took = _doctor("--sysroot", str(root), "--format", "json")
    # cpuinfo is read truncated, by design (1,024 CPUs make it 1.5 MB): its first 64 KiB
    # of a huge file are read, and hold no flags.
    for rel in KNOBS if kind != "huge" else set(KNOBS) - {"/proc/cpuinfo"}:
        _assert_named(root, rel, kind, rc, doc, stderr, took)
    assert rc == 0
    assert doc["settings"] == {"numa_balancing": None, "cpufreq": True, "governors": {}, "thp_enabled": None,
                               "thp_defrag": None, "smt_active": None, "smt_control": None}
    assert doc["isa"]["present"] == [] and doc["topology"]["model"] == ""


def test_fifos_in_a_real_machine_dump(sysroots, tmp_path):
    """The hybrid laptop's dump with FIFOs at cpuinfo, every scaling_governor and the kernel
    knobs: text output names each one, with the fix; exit 0 (warnings), 1 with --strict."""
    src = sysroots["hw-20em64t-hybrid-1p6c2t+2ca4co1t"]
    root = tmp_path / "dump"
    shutil.copytree(src, root, symlinks=True)
    govs = sorted(str(p.relative_to(root)) for p in root.glob("sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"))
    assert len(govs) == 20
    planted = ["/" + g for g in govs] + ["/proc/cpuinfo", "/proc/sys/kernel/numa_balancing",
                                         "/sys/kernel/mm/transparent_hugepage/enabled",
                                         "/sys/devices/system/cpu/smt/active"]
    for rel in planted:
        _plant(root, rel, "fifo")
    rc, _, stderr, took = _doctor("--sysroot", str(root))
    assert (rc, stderr) == (0, "") and took < ANSWER_S
    out = subprocess.run([sys.executable, "-m", "cpulaunch", "doctor", "--sysroot", str(root)],
                         capture_output=True, text=True, timeout=3 * ANSWER_S, env=_env(), cwd=REPO).stdout
    for rel in planted:
        assert f"WARN  file-not-read:{root}{rel}: {root}{rel} was not read: not a regular file (a FIFO)\n" in out
    # cpuN/cpufreq links to cpufreq/policyN: each governor is also read, and named, there.
    for n in range(20):
        rel = f"/sys/devices/system/cpu/cpufreq/policy{n}/scaling_governor"
        assert f"WARN  file-not-read:{root}{rel}: {root}{rel} was not read: not a regular file (a FIFO)\n" in out
    assert out.count("fix: replace it with a copy of the file from the machine the dump comes from") == len(planted) + 20
    # The rest of the report is still there: the topology does not need these files.
    assert "ok    topology: 1 socket(s), 1 NUMA node(s) with CPUs, 14 cores" in out
    rc, _, _, _ = _doctor("--sysroot", str(root), "--strict")
    assert rc == 1


# --------------------------------------------------------------------------- exit status


def _clean_root(root: Path) -> Path:
    """A 2-CPU, 1-node machine with nothing to warn about (NUMA balancing off, governor
    performance, THP madvise, no quota)."""
    files = {
        "sys/devices/system/cpu/online": "0-1\n",
        "sys/devices/system/cpu/present": "0-1\n",
        "sys/devices/system/node/node0/cpulist": "0-1\n",
        "sys/devices/system/node/has_memory": "0\n",
        "proc/cpuinfo": "processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu sse2 lm avx2\n",
        "proc/sys/kernel/numa_balancing": "0\n",
        "sys/kernel/mm/transparent_hugepage/enabled": "always [madvise] never\n",
        "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": "performance\n",
        "sys/devices/system/cpu/cpu1/cpufreq/scaling_governor": "performance\n",
    }
    for n in range(2):
        files[f"sys/devices/system/cpu/cpu{n}/topology/thread_siblings_list"] = f"{n}\n"
        files[f"sys/devices/system/cpu/cpu{n}/topology/physical_package_id"] = "0\n"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_exit_status(tmp_path):
    """0: no error; 1: an error finding (or, with --strict, a warning); 2: a usage error.
    The report is printed whatever the status."""
    clean = _clean_root(tmp_path / "clean")
    rc, doc, stderr, _ = _doctor("--sysroot", str(clean), "--format", "json")
    assert doc["worst"] in ("ok", "info"), [f for f in doc["findings"] if f["severity"] not in ("ok", "info")]
    assert (rc, stderr) == (0, "")
    assert _doctor("--sysroot", str(clean), "--strict")[0] == 0

    warned = make_root(tmp_path / "warned")  # offline CPU, CPU quota, NUMA balancing: warnings only
    rc, doc, _, _ = _doctor("--sysroot", str(warned), "--format", "json")
    assert (rc, doc["worst"]) == (0, "warn")
    rc, doc, _, _ = _doctor("--sysroot", str(warned), "--format", "json", "--strict")
    assert (rc, doc["worst"]) == (1, "warn")

    empty = tmp_path / "empty"  # nothing under the root: the topology error
    empty.mkdir()
    rc, doc, stderr, _ = _doctor("--sysroot", str(empty), "--format", "json")
    assert (rc, doc["worst"], stderr) == (1, "error", "")
    assert [f["id"] for f in doc["findings"] if f["severity"] == "error"] == ["topology"]
    proc = subprocess.run([sys.executable, "-m", "cpulaunch", "doctor", "--sysroot", str(empty)],
                          capture_output=True, text=True, timeout=60, env=_env(), cwd=REPO)
    assert proc.returncode == 1 and "ERROR topology: cannot read the machine under" in proc.stdout

    # An error of the environment on a sound machine: two allocators in LD_PRELOAD (names
    # glibc cannot find, so this child itself runs with neither).
    env = dict(_env(), LD_PRELOAD="libjemalloc-absent/libjemalloc.so.2 libtcmalloc-absent/libtcmalloc.so.4")
    rc, doc, _, _ = _doctor("--sysroot", str(clean), "--format", "json", env=env)
    assert rc == 1
    assert [f["id"] for f in doc["findings"] if f["severity"] == "error"] == ["env-LD_PRELOAD"]

    for args in (["--bogus"], ["--sysroot", str(tmp_path / "missing")], ["--mem-policy", "sometimes"]):
        rc, _, stderr, _ = _doctor(*args)
        assert rc == 2 and stderr.startswith("cpulaunch: error: ") and stderr.count("\n") == 1, (args, stderr)


def test_help_states_the_exit_status():
    proc = subprocess.run([sys.executable, "-m", "cpulaunch", "doctor", "--help"], capture_output=True,
                          text=True, timeout=60, env=_env(), cwd=REPO, check=True)
    text = " ".join(proc.stdout.split())
    assert "Exit status: 0 when no finding is an error (with --strict: no error and no warning), " \
           "1 when one is (the report is printed either way), 2 on a usage error." in text
    assert "--strict Exit 1 on warnings too, not only on errors." in text
