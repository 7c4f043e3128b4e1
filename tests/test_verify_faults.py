"""``cpulaunch verify`` under faults, with real processes: another user's process read
without root, a zombie, a kernel thread, processes that exit while verify reads them, a
process that names itself with terminal escapes, and special or huge files under a root.

A fact verify could not read must never count as a match: the verdict is "cannot-check"
(exit 3), "gone" (exit 3) or, for a PID with no process, a one-line usage error (exit 2).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cpulaunch.tools import verify
from cpulaunch.machine import libfinder, libraries
from cpulaunch.machine import proc as procfs
from cpulaunch.tools.verify import Expected, Verdict
from tests.conftest import REPO, run_cli
from tests.test_verify import ALLOWED, C, TWO_CPUS, _fake_proc, child

ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: to start a process as another user")
NO_PROCESS = "cpulaunch: error: no process with PID {} (it does not exist or has already exited); " \
             "give the PID of a running process (ps -e lists them)\n"
PERMISSION = "permission denied (another user's process: run verify as that user or as root)"
PF_KTHREAD = 0x00200000


def _zombie_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]


@contextlib.contextmanager
def zombie():
    """A child that has exited and is not reaped yet (yields its pid); reaped after."""
    proc = subprocess.Popen(["true"])
    try:
        # waitid with WNOWAIT returns once the child has exited and leaves it a zombie.
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        assert _zombie_state(proc.pid) == "Z"
        yield proc.pid
    finally:
        proc.wait(timeout=10)


def _as_nobody(*args: str) -> subprocess.CompletedProcess:
    """``python -m cpulaunch ARGS`` as user nobody, group nogroup, no supplementary groups.

    The interpreter lives under /root (mode 700), so the process keeps one capability,
    CAP_DAC_READ_SEARCH, to reach it; that capability lets it read files, not trace
    another user's process (/proc/PID/maps, numa_maps, environ need PTRACE_MODE_READ).
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("needs setpriv (util-linux)")
    argv = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups",
            "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search",
            sys.executable, "-m", "cpulaunch", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)


def _kernel_thread() -> tuple:
    """(pid, name) of a kernel thread this /proc shows (kthreadd, pid 2, on a host)."""
    for entry in sorted((e for e in os.listdir("/proc") if e.isdigit()), key=int):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = Path(f"/proc/{entry}/stat").read_text()
            if int(text.rsplit(") ", 1)[1].split()[6]) & PF_KTHREAD:
                return int(entry), text[text.index("(") + 1:text.rindex(")")]
    pytest.skip("no kernel thread visible in this /proc (a PID namespace)")


# --------------------------------------------------------------------------- another user's process


@ROOT
def test_another_users_process_cannot_be_checked():
    """verify as nobody against root's process: maps, numa_maps and environ are permission
    denied, so the verdict is cannot-check, exit 3, naming each file and why."""
    with child("ready()") as (pid, _):
        text = _as_nobody("verify", str(pid))
        doc = _as_nobody("verify", "--format", "json", str(pid))
    assert (text.returncode, text.stderr) == (3, ""), text
    assert text.stdout.splitlines()[0] == f"verify pid {pid} (pid {pid})"
    assert "allocator and OpenMP unknown (maps unread)" in text.stdout.splitlines()[1]
    assert text.stdout.splitlines()[2:] == [
        f"  pid {pid}: cannot check: cannot read /proc/{pid}/maps, /proc/{pid}/numa_maps, "
        f"/proc/{pid}/environ: {PERMISSION}"]
    assert "ok" not in text.stdout.split()
    assert doc.returncode == 3, doc
    report = json.loads(doc.stdout)
    (inst,) = report["instances"]
    assert (report["ok"], inst["status"]) == (False, "cannot-check")
    assert inst["process"]["unreadable"] == {"maps": "permission denied", "numa_maps": "permission denied",
                                             "environ": "permission denied"}
    assert (inst["process"]["allocators"], inst["process"]["openmp"], inst["process"]["environ"]) == (None,) * 3
    assert report["warnings"] == [inst["error"]] == [text.stdout.splitlines()[2].strip()]


@ROOT
def test_another_users_descendants_are_named():
    """Each process of the instance whose files cannot be read is named, descendants too."""
    script = """
import subprocess
kid = subprocess.Popen(["sleep", "60"])
while open(f"/proc/{kid.pid}/comm").read() != "sleep\\n":   # exec'd
    time.sleep(0.01)
ready(kid=kid.pid)
"""
    with child(script) as (pid, info):
        cli = _as_nobody("verify", str(pid))
    kid = info["kid"]
    assert (cli.returncode, cli.stderr) == (3, ""), cli
    files = lambda p: f"/proc/{p}/maps, /proc/{p}/numa_maps, /proc/{p}/environ"  # noqa: E731
    assert cli.stdout.splitlines()[-1] == (
        f"  pid {pid}: cannot check: cannot read {files(pid)}: {PERMISSION}; cannot read {files(kid)}: {PERMISSION}")


# --------------------------------------------------------------------------- zombie, kernel thread, no process


def test_zombie_cannot_be_checked():
    with zombie() as pid:
        report = verify.verify([(pid, None), (pid, Expected(index=0, bound_cpus=(C,), allocator="tcmalloc"))])
        cli = run_cli("verify", str(pid), check_rc=None)
        cli_json = run_cli("verify", "--format", "json", str(pid), check_rc=None)
    why = (f"cannot check: it is a zombie: it exited and its parent (pid {os.getpid()}) has not reaped it; "
           "its threads, memory and libraries are gone")
    assert (cli.returncode, cli.stderr) == (3, "")
    assert cli.stdout == f"verify pid {pid} (pid {pid})\n  pid {pid}: {why}\n"
    (inst,) = json.loads(cli_json.stdout)["instances"]
    assert (cli_json.returncode, inst["status"], inst["process"]["state"]) == (3, "cannot-check", "Z")
    assert inst["process"]["uncheckable"] == why[len("cannot check: it is "):]
    # With a plan that asks for an allocator, the empty maps of a zombie is not "differs".
    assert [(r.status, r.warnings, r.error) for r in report.instances] == [
        (Verdict.CANNOT_CHECK, (), f"pid {pid}: {why}"),
        (Verdict.CANNOT_CHECK, (), f"instance 0: {why}"),
    ]
    assert report.instances[0].view.state == "Z" and report.exit_code == 3 and not report.ok


def test_kernel_thread_cannot_be_checked():
    pid, name = _kernel_thread()
    cli = run_cli("verify", str(pid), check_rc=None)
    assert (cli.returncode, cli.stderr) == (3, "")
    assert cli.stdout == (f"verify pid {pid} (pid {pid})\n  pid {pid}: cannot check: it is a kernel thread "
                          f"({name}): it has no program, libraries or memory of its own\n")
    view = procfs.inspect(pid)
    assert view.children == () and view.threads == () and view.uncheckable


def test_pid_without_a_process_is_a_usage_error():
    done = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    gone = int(done.stdout)  # exited and reaped
    with child("ready()") as (pid, _):
        alone = run_cli("verify", str(gone), check_rc=None)
        mixed = run_cli("verify", str(pid), str(gone), "0", check_rc=None)
    assert (alone.returncode, alone.stdout, alone.stderr) == (2, "", NO_PROCESS.format(gone))
    assert (mixed.returncode, mixed.stdout, mixed.stderr) == (2, "", NO_PROCESS.format(f"{gone}, 0"))


def test_exit_code_is_the_worst_verdict():
    """differs (1) outranks cannot-check / gone (3), which outrank ok (0)."""
    view = procfs.ProcessView(pid=1, ppid=0, name="x", cmdline=(), cpus=frozenset({0}), threads=(),
                              libraries=(), numa=None)
    ok = verify.InstanceCheck(1, None, view, ())
    differs = verify.InstanceCheck(1, None, view, ("pid 1: two allocators mapped",))
    cannot = verify.InstanceCheck(1, None, view, (), "pid 1: cannot check: ...")
    gone = verify.InstanceCheck(1, None, None, (), "pid 1: gone: ...")
    assert [r.status for r in (ok, differs, cannot, gone)] == [
        Verdict.OK, Verdict.DIFFERS, Verdict.CANNOT_CHECK, Verdict.GONE]
    code = lambda *rs: verify.VerifyReport(rs).exit_code  # noqa: E731
    assert (code(ok), code(ok, cannot), code(ok, gone), code(cannot, differs), code(differs, gone)) == (0, 3, 3, 1, 1)
    assert verify.VerifyReport((ok, ok)).ok and not verify.VerifyReport((ok, cannot)).ok


# --------------------------------------------------------------------------- processes that exit while read

EXITING = """
import os, sys, time
print("ready", flush=True)
end = time.perf_counter_ns() + int(sys.argv[1])
while time.perf_counter_ns() < end:
    pass
os._exit(0)
"""


def _tcmalloc() -> Path:
    path = libfinder.find(libraries.REGISTRY["tcmalloc"], os.environ)
    if path is None:
        pytest.skip(f"tcmalloc not installed ({libraries.REGISTRY['tcmalloc'].install})")
    return path


def _exiting_child(lifetime_ns: int) -> subprocess.Popen:
    """A python child with tcmalloc preloaded and CPULAUNCH_CPUS = every allowed CPU (so it
    matches its plan while it runs), past its start-up once this returns; it exits
    ``lifetime_ns`` later and stays a zombie until waited for."""
    env = {"PATH": os.environ["PATH"], "LD_PRELOAD": str(_tcmalloc()),
           "CPULAUNCH_CPUS": ",".join(map(str, ALLOWED))}
    proc = subprocess.Popen([sys.executable, "-S", "-c", EXITING, str(lifetime_ns)], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_processes_exiting_while_read():
    """Each child matches its plan while it lives, so the only honest verdicts are ok (read
    before it exited), cannot-check (a zombie when verify looked) or gone (it exited during
    the read); a partial read (maps already empty while environ still said tcmalloc) must
    never come out as differs, and verify never raises."""
    rng = random.Random(19)
    seen = {}
    for _ in range(60):
        proc = _exiting_child(rng.randrange(0, 3_000_000))
        try:
            exited_before = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
            (r,) = verify.verify([(proc.pid, None)]).instances
        finally:
            proc.wait(timeout=10)
            proc.stdout.close()
        assert r.status in (Verdict.OK, Verdict.CANNOT_CHECK, Verdict.GONE), (r.status, r.warnings, r.error)
        if exited_before:
            assert r.status is Verdict.CANNOT_CHECK and "is a zombie" in r.error
        if r.status is Verdict.GONE:
            assert r.error == f"pid {proc.pid}: gone: it exited while verify read it" and r.view is None
        if r.status is Verdict.OK:
            assert r.expected.allocator == "tcmalloc" and r.view.allocators == ("tcmalloc",)
        seen[r.status] = seen.get(r.status, 0) + 1
    print("verdicts:", {k.value: v for k, v in seen.items()})


def test_cli_on_processes_exiting_while_read():
    """The command on the same children: exit 0 (ok) or 3 (cannot check, gone), one of the
    three outcomes on stdout, nothing on stderr; never 1 (a false differs) nor 70."""
    rng = random.Random(1919)
    for _ in range(12):
        proc = _exiting_child(rng.randrange(0, 400_000_000))  # about a CLI start-up, either side
        try:
            cli = run_cli("verify", str(proc.pid), check_rc=None)
        finally:
            proc.wait(timeout=10)
            proc.stdout.close()
        assert cli.stderr == "" and cli.returncode in (0, 3), cli
        last = cli.stdout.splitlines()[-1]
        assert last in ("  ok: matches the plan", f"  pid {proc.pid}: gone: it exited while verify read it") \
            or last.startswith(f"  pid {proc.pid}: cannot check: it is a zombie: "), cli.stdout
        assert (cli.returncode == 0) == (last == "  ok: matches the plan")


# --------------------------------------------------------------------------- names with terminal escapes

RENAMED = """
import threading
open("/proc/self/comm", "w").write("ev\\x1b[31mil")
def named():
    open(f"/proc/self/task/{threading.get_native_id()}/comm", "w").write("t\\x1b]0;pwn\\x07")
    threading.Event().wait()
t = threading.Thread(target=named, daemon=True)
t.start()
while open(f"/proc/self/task/{t.native_id}/comm").read() != "t\\x1b]0;pwn\\x07\\n":
    time.sleep(0.01)
ready()
"""


@TWO_CPUS
def test_escapes_in_process_and_thread_names_are_not_printed():
    """A program that names itself and a thread with terminal escapes: text output shows
    them escaped (the thread's name is in an affinity warning), JSON keeps the real names."""
    # Planned on CPU C alone but left on every allowed CPU: each thread is reported, by name.
    with child(RENAMED, env={"CPULAUNCH_CPUS": str(C)}) as (pid, _):
        text = run_cli("verify", str(pid), check_rc=None)
        doc = run_cli("verify", "--format", "json", str(pid), check_rc=None)
    assert text.returncode == 1 and doc.returncode == 1
    assert "\x1b" not in text.stdout and "\x07" not in text.stdout and text.stderr == ""
    assert f"  pid {pid} ev\\x1b[31mil: 2 thread(s)" in text.stdout
    assert "(t\\x1b]0;pwn\\x07) of pid" in text.stdout
    proc = json.loads(doc.stdout)["instances"][0]["process"]
    assert proc["name"] == "ev\x1b[31mil"
    assert [t["name"] for t in proc["threads"]] == ["ev\x1b[31mil", "t\x1b]0;pwn\x07"]
    assert any("(t\x1b]0;pwn\x07) of pid" in w for w in json.loads(doc.stdout)["warnings"])


# --------------------------------------------------------------------------- bounded reads under a root

BOUNDED = """
import json, sys
from cpulaunch.tools import verify
r = verify.verify([(100, None)], sys.argv[1]).instances[0]
print(json.dumps([r.status.value, r.error, dict(r.view.unreadable)]))
"""


def _under_root(root: Path) -> list:
    """verify pid 100 under ``root`` in a child process, which must finish within 30 s."""
    proc = subprocess.run([sys.executable, "-c", BOUNDED, str(root)], capture_output=True, text=True,
                          timeout=30, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("rel", ["maps", "environ", "numa_maps", "task/101/status"])
def test_fifo_under_a_root_is_a_file_not_read(tmp_path, rel):
    _fake_proc(tmp_path, 100, 1, "0-3", {100: ("main", "0-3", 0), 101: ("omp", "0-3", 0)},
               maps="7f-80 r-xp 0 0:0 1 /usr/lib/libjemalloc.so.2\n")
    path = tmp_path / "proc/100" / rel
    path.unlink()
    os.mkfifo(path)  # nobody writes it: a plain open and read would wait forever
    status, error, unreadable = _under_root(tmp_path)
    assert (status, unreadable) == ("cannot-check", {rel: "not a regular file (a FIFO)"})
    assert error == f"pid 100: cannot check: cannot read /proc/100/{rel}: not a regular file (a FIFO)"


def test_endless_and_huge_files_under_a_root(tmp_path):
    _fake_proc(tmp_path, 100, 1, "0-3", {100: ("main", "0-3", 0)})
    (tmp_path / "proc/100/environ").unlink()
    (tmp_path / "proc/100/environ").symlink_to("/dev/zero")
    with open(tmp_path / "proc/100/maps", "wb") as f:
        f.truncate(procfs.PROC_FILE_BYTES + 1)  # sparse: no disk used
    status, _, unreadable = _under_root(tmp_path)
    assert (status, unreadable) == ("cannot-check", {
        "maps": f"larger than {procfs.PROC_FILE_BYTES} bytes",
        "environ": "not a regular file (a character device)",
    })
