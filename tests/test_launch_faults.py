"""Faults around launching, with real processes, signals, pipes and file systems (issue 8).

Where the CLI exposes a behaviour (``yes | head -1``, stdin, a full disk under --log-dir,
kill -9 of the launcher, Ctrl-Z) the real ``python -m cpulaunch`` runs; the rest calls
``launch.run_group`` in this process or in a small driver script (``DRIVER``), so these
tests do not depend on the command line's shape.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from conftest import REPO, default_signals
from cpulaunch.launch.group import FORWARDED_SIGNALS, ProcessGroup, RELAY_TIMEOUT
from cpulaunch.launch.spawn import LaunchError, ProcessSpec, exec_spec
from cpulaunch.launch.supervise import describe_failure, run_group

PY = sys.executable
REPO = Path(__file__).resolve().parent.parent
NCPUS = len(os.sched_getaffinity(0))
need2 = pytest.mark.skipif(NCPUS < 2, reason="needs 2 allowed CPUs for 2 instances")


def cpulaunch(*args) -> list:
    return [PY, "-m", "cpulaunch", *args]


def write(tmp_path: Path, name: str, body: str) -> str:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return str(p)


def state(pid: int):
    """The process's state letter (R, S, T, Z, D...), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    return state(pid) not in (None, "Z")


def wait_until(pred, timeout=5.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError(f"{what} not reached within {timeout}s")


def with_marker(marker: str) -> list:
    """Pids of live processes whose environment holds CPULAUNCH_TEST_MARKER=marker."""
    needle = f"CPULAUNCH_TEST_MARKER={marker}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0") and alive(int(d.name)):
            found.append(int(d.name))
    return found


def children_of_me() -> set:
    kids = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            kids.update(int(x) for x in (task / "children").read_text().split())
        except OSError:
            pass
    return {k for k in kids if alive(k)}


DRIVER = r'''
import json, os, signal, sys
from pathlib import Path
from cpulaunch.launch.group import ProcessGroup
from cpulaunch.launch.spawn import LaunchError, ProcessSpec
from cpulaunch.launch.supervise import describe_failure, run_group

cfg = json.loads(sys.argv[1])
for name in cfg.get("ignore", []):
    signal.signal(getattr(signal, name), signal.SIG_IGN)
for name in cfg.get("default", []):
    signal.signal(getattr(signal, name), signal.SIG_DFL)
if cfg.get("block"):
    signal.pthread_sigmask(signal.SIG_BLOCK, [getattr(signal, n) for n in cfg["block"]])
if cfg.get("signal_after_spawn"):  # a signal that arrives while instances are being started
    spawn, sig = ProcessGroup._spawn, getattr(signal, cfg["signal_after_spawn"])
    def spawn_then_signal(self, spec, setup):
        fds = spawn(self, spec, setup)
        if spec.index == 0:
            os.kill(os.getpid(), sig)
        return fds
    ProcessGroup._spawn = spawn_then_signal
specs = [ProcessSpec(index=i, label=f"instance {i}", argv=tuple(a), env=cfg.get("env", {}))
         for i, a in enumerate(cfg["argv"])]
kw = cfg.get("kw", {})
try:
    out = run_group(specs, os.environ, **kw)
except LaunchError as exc:
    print(f"LaunchError: {exc}", file=sys.stderr)
    sys.exit(2)
Path(cfg["result"]).write_text(json.dumps({
    "exit_code": out.exit_code, "root_cause": out.root_cause, "signalled": out.signalled,
    "describe": describe_failure(out, specs), "results": [r.to_dict() for r in out.results]}))
sys.exit(out.exit_code)
'''


def drive(tmp_path: Path, argv: list, timeout=20, **cfg):
    """Run DRIVER (launch.run_group in a fresh Python) with these instances; returns
    (CompletedProcess, the outcome as a dict)."""
    result = tmp_path / "result.json"
    cfg.update(argv=argv, result=str(result))
    # -c: sys.path[0] is the cwd, this checkout (a script's folder would not be, and the
    # cpulaunch imported would be whichever is installed)
    popen = {"preexec_fn": default_signals, **cfg.pop("popen", {})}  # then cfg's ignore/block
    proc = subprocess.run([PY, "-c", DRIVER, json.dumps(cfg)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, **popen)
    return proc, (json.loads(result.read_text()) if result.exists() else None)


# --------------------------------------------------------------------------- child set-up


SIG_LINES = ["grep", "-E", "^Sig(Ign|Blk):", "/proc/self/status"]
CLEAN = ["SigBlk:\t0000000000000000", "SigIgn:\t0000000000000000"]


def sig_lines(text: str, prefix: str = "") -> list:
    return sorted(line[len(prefix):] for line in text.splitlines() if line.startswith(prefix))


@need2
def test_children_start_with_default_dispositions_and_empty_mask(tmp_path):
    """The launcher ignores SIGPIPE/SIGXFSZ (Python), SIGINT and SIGQUIT (as a background
    job in a script would) and blocks SIGUSR1/SIGTERM; every instance starts clean."""
    proc, out = drive(tmp_path, [SIG_LINES, SIG_LINES], ignore=["SIGINT", "SIGQUIT"],
                      block=["SIGUSR1", "SIGTERM"])
    assert proc.returncode == 0, proc.stderr
    for i in (0, 1):
        assert sig_lines(proc.stdout, f"[{i}] ") == CLEAN


def test_nohup_keeps_sighup_ignored(tmp_path):
    """Under nohup (SIGHUP ignored on entry) the children keep ignoring SIGHUP, as
    ``nohup PROGRAM`` would, and nothing else."""
    proc, out = drive(tmp_path, [SIG_LINES], ignore=["SIGHUP"], kw={"prefix_output": False})
    assert proc.returncode == 0, proc.stderr
    hup = 1 << (signal.SIGHUP - 1)
    assert sig_lines(proc.stdout) == ["SigBlk:\t0000000000000000", f"SigIgn:\t{hup:016x}"]


def test_exec_single_instance_starts_clean(tmp_path):
    """The single-instance exec path through the real CLI."""
    def messy():
        default_signals()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2, signal.SIGCHLD])

    proc = subprocess.run(cpulaunch("--bind", "none", *SIG_LINES), capture_output=True, text=True,
                          timeout=30, cwd=REPO, preexec_fn=messy)
    assert proc.returncode == 0, proc.stderr
    assert sig_lines(proc.stdout) == CLEAN


def test_exec_spec_failure_is_launch_error_and_restores_launcher(tmp_path):
    not_exec = tmp_path / "data.txt"
    not_exec.write_text("x")
    before = {s: signal.getsignal(s) for s in (signal.SIGPIPE, signal.SIGINT, signal.SIGTERM)}
    for argv, cause in ((["no-such-program-xyz"], "No such file or directory"),
                        ([str(not_exec)], "Permission denied")):
        spec = ProcessSpec(index=0, label="instance 0", argv=tuple(argv))
        with pytest.raises(LaunchError) as exc:
            exec_spec(spec, os.environ)
        assert str(exc.value) == f"cannot run {argv[0]!r}: {cause}"
    assert {s: signal.getsignal(s) for s in before} == before
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == set()


@pytest.mark.parametrize("layout", ["denied then found", "denied only", "missing only", "dir then found",
                                    "slash", "empty PATH entry", "no PATH"])
def test_exec_searches_path_as_os_execvpe_does(tmp_path, layout):
    """spawn._execvpe (the exec path's PATH search, without os.execvpe's import of warnings)
    against os.execvpe on the same folders, each in a child process: the same program runs,
    or the same error is raised (EACCES from a non-executable file wins over a later
    ENOENT; a file found after it runs)."""
    denied, found, missing = tmp_path / "denied", tmp_path / "found", tmp_path / "missing"
    denied.mkdir()
    found.mkdir()
    (denied / "prog").write_text("#!/bin/sh\necho denied\n")
    (found / "prog").write_text("#!/bin/sh\necho found $0\n")
    (found / "prog").chmod(0o755)
    (tmp_path / "file").write_text("")
    paths = {"denied then found": f"{denied}:{tmp_path / 'file'}:{found}", "denied only": f"{missing}:{denied}",
             "missing only": str(missing), "dir then found": f"{tmp_path}:{found}", "slash": str(missing),
             "empty PATH entry": f":{found}", "no PATH": None}
    prog = str(found / "prog") if layout == "slash" else "prog"
    env = {"LC_ALL": "C"} if paths[layout] is None else {"PATH": paths[layout]}
    code = ("import os, sys\nfrom cpulaunch.launch import spawn\n"
            "run = os.execvpe if sys.argv[1] == 'os' else spawn._execvpe\n"
            "try:\n    run(sys.argv[2], [sys.argv[2]], eval(sys.argv[3]))\n"
            "except OSError as exc:\n    print(type(exc).__name__, exc.errno, exc.filename)\n")
    runs = [subprocess.run([PY, "-c", code, way, prog, repr(env)], capture_output=True, text=True, cwd=found,
                           env=dict(os.environ, PYTHONPATH=str(REPO))) for way in ("os", "ours")]
    assert [(r.returncode, r.stdout, r.stderr) for r in runs][0] == [(r.returncode, r.stdout, r.stderr)
                                                                      for r in runs][1]
    expected = {"denied then found": "found", "denied only": "PermissionError 13", "missing only":
                "FileNotFoundError 2", "dir then found": "found", "slash": "found",
                "empty PATH entry": "found", "no PATH": "FileNotFoundError 2"}[layout]
    assert runs[1].stdout.startswith(expected), runs[1].stdout


def test_non_utf8_env_value_reaches_child_byte_for_byte(tmp_path):
    value = os.fsdecode(b"/x/\xff\xfe.so")  # surrogate escapes, as os.environ holds them
    spec = ProcessSpec(index=0, label="instance 0", env={"CPULAUNCH_T": value},
                              argv=(PY, "-c", "import os, sys; sys.stdout.buffer.write(os.environb[b'CPULAUNCH_T'])"))
    out = tmp_path / "out"
    with open(out, "wb") as f:
        outcome = run_group([spec], os.environ, stdout=f, prefix_output=False)
    assert outcome.exit_code == 0
    assert out.read_bytes() == b"/x/\xff\xfe.so\n"


# --------------------------------------------------------------------------- signals


@need2
def test_sigterm_during_start_up_reaches_every_instance(tmp_path):
    """SIGTERM arrives right after instance 0 is spawned, before instance 1 exists: it is
    held, then delivered to both; each dies of SIGTERM (143), not SIGKILL after the grace
    period (30 s here)."""
    t0 = time.monotonic()
    proc, out = drive(tmp_path, [["sleep", "30"], ["sleep", "30"]], signal_after_spawn="SIGTERM",
                      kw={"grace_period": 30})
    assert time.monotonic() - t0 < 10
    assert proc.returncode == 143, proc.stderr
    assert out["signalled"] == signal.SIGTERM and out["root_cause"] is None
    assert [(r["exit_code"], r["signal"]) for r in out["results"]] == [(143, "SIGTERM")] * 2
    assert out["describe"] == "stopped by SIGTERM"


@need2
def test_sigterm_ignored_by_instance_then_sigkill_exit_code_is_143(tmp_path):
    stubborn = [PY, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "open(__import__('sys').argv[1], 'w').close(); time.sleep(60)"]
    ready = [tmp_path / "r0", tmp_path / "r1"]
    driver = subprocess.Popen([PY, "-c", DRIVER, json.dumps({
        "argv": [stubborn + [str(ready[0])], stubborn + [str(ready[1])]],
        "kw": {"grace_period": 0.5}, "result": str(tmp_path / "res.json")})],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(lambda: all(p.exists() for p in ready), what="instances ready")
    driver.send_signal(signal.SIGTERM)
    driver.communicate(timeout=15)
    assert driver.returncode == 143
    out = json.loads((tmp_path / "res.json").read_text())
    assert [r["signal"] for r in out["results"]] == ["SIGKILL", "SIGKILL"]
    assert out["describe"] == "stopped by SIGTERM"


@need2
def test_ctrl_z_stops_instances_and_launcher_sigcont_continues(tmp_path):
    """SIGTSTP to the launcher: both instances are stopped (state T), then the launcher;
    SIGCONT continues them all; the run then ends normally on SIGINT (130)."""
    child = write(tmp_path, "child.py", """
        import os, sys, time
        open(sys.argv[1] + "/pid" + os.environ["CPULAUNCH_INSTANCE_INDEX"], "w").write(str(os.getpid()))
        time.sleep(60)
    """)
    # A process group of its own whose parent is in the same session: not orphaned, so
    # the kernel lets SIGTSTP stop it (as under an interactive shell).
    proc = subprocess.Popen(cpulaunch("--ninstances", "2", "--bind", "none", child, str(tmp_path)),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, process_group=0)
    wait_until(lambda: all((tmp_path / f"pid{i}").exists() and (tmp_path / f"pid{i}").read_text() for i in (0, 1)),
               timeout=20, what="instances started")
    pids = [int((tmp_path / f"pid{i}").read_text()) for i in (0, 1)]
    proc.send_signal(signal.SIGTSTP)
    wait_until(lambda: [state(p) for p in pids + [proc.pid]] == ["T", "T", "T"], what="all stopped")
    proc.send_signal(signal.SIGCONT)
    wait_until(lambda: all(state(p) == "S" for p in pids + [proc.pid]), what="all continued")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert not any(alive(p) for p in pids)


@need2
def test_launcher_sigkill_leaves_nothing_behind(tmp_path):
    """kill -9 of the launcher: its instances (PR_SET_PDEATHSIG) and their children in
    their process groups (the watchdog) go too."""
    marker = uuid.uuid4().hex
    child = write(tmp_path, "forker.py", """
        import os, subprocess, sys, time
        subprocess.Popen(["sleep", "61"])  # a grandchild in the instance's group
        open(sys.argv[1] + "/ready" + os.environ["CPULAUNCH_INSTANCE_INDEX"], "w").close()
        time.sleep(61)
    """)
    env = dict(os.environ, CPULAUNCH_TEST_MARKER=marker)
    proc = subprocess.Popen(cpulaunch("--ninstances", "2", "--bind", "none", child, str(tmp_path)),
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: all((tmp_path / f"ready{i}").exists() for i in (0, 1)), timeout=20, what="ready")
    wait_until(lambda: len(with_marker(marker)) >= 6, what="launcher, watchdog, 2 instances, 2 sleeps")
    proc.kill()
    proc.wait(timeout=10)
    wait_until(lambda: with_marker(marker) == [], timeout=5, what="every marked process gone")


STALL_DRIVER = r"""
import os, signal, sys, time
from pathlib import Path
from cpulaunch.launch import group
from cpulaunch.launch.spawn import ProcessSpec
from cpulaunch.launch.supervise import run_group

moment, tmp = sys.argv[1], Path(sys.argv[2])
launcher = os.getpid()

def stall(name):
    # Say who is held, then wait: the launcher for the test's SIGKILL (its handled
    # signals are blocked while it starts instances); a child until its launcher is gone
    # (then it carries on, unless its parent-death signal killed it).
    (tmp / name).write_text(str(os.getpid()))
    if os.getpid() == launcher:
        signal.pause()
    while os.getppid() == launcher:
        time.sleep(0.005)

if moment == "before-prctl":  # child forked (and setsid), PR_SET_PDEATHSIG not yet set
    real = group._load_prctl()
    group._load_prctl = lambda: (lambda *a: (stall("stalled"), real(*a))[1])
elif moment == "before-exec":  # PDEATHSIG set, registered with the watchdog, not exec'd
    setaffinity = os.sched_setaffinity
    os.sched_setaffinity = lambda pid, cpus: (stall("stalled"), setaffinity(pid, cpus))
elif moment == "after-exec":  # the program runs and has forked; Popen has just returned
    init = group._Proc.__init__
    def stalled_init(self, spec, popen, start, *rest):
        init(self, spec, popen, start, *rest)
        if spec.index == 0:
            while not (tmp / "grandchild").exists() or not (tmp / "grandchild").read_text():
                time.sleep(0.005)
            stall("stalled")
    group._Proc.__init__ = stalled_init
cpus = tuple(sorted(os.sched_getaffinity(0)))[:1]
argv = ("sh", "-c", f"sleep 61 & echo $! > {tmp}/grandchild; wait")
specs = [ProcessSpec(index=i, label=f"instance {i}", argv=argv if i == 0 else ("sleep", "62"),
                     affinity=cpus) for i in (0, 1)]
run_group(specs, os.environ)
"""


@pytest.mark.parametrize("moment", ["before-prctl", "before-exec", "after-exec"])
def test_launcher_sigkill_in_the_spawn_window_leaves_nothing_behind(tmp_path, moment):
    """kill -9 of the launcher while it starts instance 0, held at each moment of the
    child's start (issue 19): forked but PR_SET_PDEATHSIG not set yet (the child sees
    its launcher gone and kills itself before exec); set and registered with the
    watchdog but not exec'd (PDEATHSIG); exec'd and forked a grandchild but Popen only
    just returned in the launcher (the watchdog knew the group before exec, so it
    kills the grandchild). Nothing carrying the run's marker is left."""
    marker = uuid.uuid4().hex
    proc = subprocess.Popen([PY, "-c", STALL_DRIVER, moment, str(tmp_path)], cwd=REPO,
                            env=dict(os.environ, CPULAUNCH_TEST_MARKER=marker),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        stalled = tmp_path / "stalled"
        wait_until(lambda: stalled.exists() and stalled.read_text(), timeout=20, what=f"launcher held at {moment}")
        held = int(stalled.read_text())
        proc.kill()
        proc.wait(timeout=10)
        wait_until(lambda: with_marker(marker) == [], timeout=5, what="every marked process gone")
    finally:
        for pid in with_marker(marker):
            os.kill(pid, signal.SIGKILL)
    assert not alive(held)  # a zombie until its new parent reaps it
    assert (tmp_path / "grandchild").exists() == (moment == "after-exec")  # the program ran


@pytest.mark.slow
def test_stress_spawn_kill_mode_leaves_nothing(tmp_path):
    """scripts/stress_signals.py --mode spawn-kill, a few trials: the launcher SIGKILLed
    the moment it has its first, second or third child (watchdog, instance 0, 1)."""
    for at in ("1", "2", "3"):
        proc = subprocess.run([PY, str(REPO / "scripts" / "stress_signals.py"), "--mode", "spawn-kill",
                               "--trials", "3", "--at-child", at], capture_output=True, text=True,
                              timeout=120, cwd=REPO)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "trials that left processes behind: 0 (0 processes)" in proc.stdout


def test_run_group_restores_handlers_and_mask_and_reaps_watchdog():
    handled = FORWARDED_SIGNALS + (signal.SIGTSTP, signal.SIGCONT)
    before = {s: signal.getsignal(s) for s in handled}
    kids = children_of_me()
    spec = ProcessSpec(index=0, label="instance 0", argv=("true",))
    with open(os.devnull, "wb") as null:
        outcome = run_group([spec], os.environ, stdout=null, stderr=null)
    assert outcome.exit_code == 0
    assert {s: signal.getsignal(s) for s in handled} == before
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == set()
    assert children_of_me() == kids  # instance and watchdog reaped


@need2
def test_grandchildren_killed_at_end_of_normal_run(tmp_path):
    pidfile = tmp_path / "gc"
    spec = ProcessSpec(index=0, label="instance 0", argv=(
        "sh", "-c", f"sleep 61 & echo $! > {pidfile}; exit 0"))
    with open(os.devnull, "wb") as null:
        outcome = run_group([spec, ProcessSpec(index=1, label="instance 1", argv=("true",))],
                                   os.environ, stdout=null, stderr=null)
    assert outcome.exit_code == 0
    wait_until(lambda: not alive(int(pidfile.read_text())), timeout=2, what="grandchild gone")


# --------------------------------------------------------------------------- failures, waits


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, "abc"])
def test_grace_period_must_be_finite_and_not_negative(value):
    spec = ProcessSpec(index=0, label="instance 0", argv=("true",))
    with pytest.raises(LaunchError, match="grace period"):
        run_group([spec], os.environ, grace_period=value)


def test_program_not_found_stops_those_already_started(tmp_path):
    marker = uuid.uuid4().hex
    specs = [ProcessSpec(index=0, label="instance 0", argv=("sleep", "30"),
                                env={"CPULAUNCH_TEST_MARKER": marker}),
             ProcessSpec(index=1, label="instance 1", argv=("no-such-program-xyz",))]
    with pytest.raises(LaunchError) as exc:
        run_group(specs, os.environ)
    assert str(exc.value) == "cannot run 'no-such-program-xyz': No such file or directory"
    assert with_marker(marker) == []


@need2
def test_describe_failure_names_signal_and_stopped_others(tmp_path):
    specs = [ProcessSpec(index=0, label="instance 0", argv=("sleep", "30")),
             ProcessSpec(index=1, label="rank 1", argv=(PY, "-c", "import os; os.kill(os.getpid(), 9)"))]
    with open(os.devnull, "wb") as null:
        outcome = run_group(specs, os.environ, stdout=null, stderr=null)
    assert outcome.exit_code == 137 and outcome.root_cause == 1
    assert describe_failure(outcome, specs) == "rank 1 failed first: killed by SIGKILL; instance 0 stopped"
    assert outcome.result(0).describe() == "killed by SIGTERM"
    specs = [ProcessSpec(index=0, label="instance 0", argv=("sh", "-c", "exit 3"))]
    with open(os.devnull, "wb") as null:
        outcome = run_group(specs, os.environ, stdout=null, stderr=null)
    assert (outcome.exit_code, describe_failure(outcome, specs)) == (3, "instance 0 exited with code 3")


FREEZER = Path("/sys/fs/cgroup/freezer")


@need2
@pytest.mark.skipif(not (FREEZER / "tasks").exists(), reason="needs the cgroup v1 freezer (a process SIGKILL cannot end)")
def test_process_stuck_after_sigkill_is_reported_not_waited_for(tmp_path):
    """A frozen process (as in D state) outlives SIGKILL: the run still ends, within the
    grace period plus kill_timeout, and says which instance did not exit."""
    cg = FREEZER / f"cpulaunch-test-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    ready, go = tmp_path / "ready", tmp_path / "go"
    specs = [
        ProcessSpec(index=0, label="instance 0", argv=(
            "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done; exit 3")),
        ProcessSpec(index=1, label="instance 1", argv=("sh", "-c", f"echo $$ > {ready}; exec sleep 60")),
    ]
    frozen = []

    def freeze():
        wait_until(lambda: ready.exists() and ready.read_text().strip(), what="instance 1 ready")
        frozen.append(int(ready.read_text()))
        (cg / "tasks").write_text(str(frozen[0]))
        (cg / "freezer.state").write_text("FROZEN")
        wait_until(lambda: (cg / "freezer.state").read_text().strip() == "FROZEN", what="frozen")
        go.touch()

    helper = threading.Thread(target=freeze)
    helper.start()
    t0 = time.monotonic()
    try:
        with open(os.devnull, "wb") as null:
            outcome = run_group(specs, os.environ, grace_period=0.2, kill_timeout=0.5,
                                       stdout=null, stderr=null)
        took = time.monotonic() - t0
    finally:
        helper.join()
        (cg / "freezer.state").write_text("THAWED")
        if frozen:
            wait_until(lambda: not alive(frozen[0]), what="thawed process gone")
        wait_until(lambda: not (cg / "tasks").read_text().strip(), what="cgroup empty")
        cg.rmdir()
    assert outcome.exit_code == 3 and outcome.root_cause == 0
    stuck = outcome.result(1)
    assert stuck.stuck and stuck.returncode is None and stuck.pid == frozen[0]
    assert took < 4
    assert describe_failure(outcome, specs) == (
        f"instance 0 failed first: exit 3; instance 1 stopped; "
        f"instance 1 did not exit after SIGKILL (pid {frozen[0]})")


# --------------------------------------------------------------------------- output relay


@need2
def test_relay_lines_never_interleave(tmp_path):
    body = "import sys\nc = sys.argv[1] * 3000\nfor _ in range(300): sys.stdout.write(c + '\\n')\nsys.stdout.write('tail')"
    specs = [ProcessSpec(index=i, label=f"instance {i}", argv=(PY, "-c", body, ch))
             for i, ch in ((0, "a"), (1, "b"))]
    out = tmp_path / "out"
    with open(out, "wb") as f:
        assert run_group(specs, os.environ, stdout=f).exit_code == 0
    lines = out.read_bytes().split(b"\n")
    assert lines[-1] == b""  # the unterminated last line got its newline
    counts = {b"[0] " + b"a" * 3000: 0, b"[1] " + b"b" * 3000: 0, b"[0] tail": 0, b"[1] tail": 0}
    for line in lines[:-1]:
        counts[line] += 1  # KeyError on any mixed line
    assert counts == {b"[0] " + b"a" * 3000: 300, b"[1] " + b"b" * 3000: 300, b"[0] tail": 1, b"[1] tail": 1}


def test_relay_endless_line_is_bounded_and_whole(tmp_path):
    body = "import sys; sys.stdout.write('x' * 1000000 + '\\nend\\n')"
    spec = ProcessSpec(index=3, label="instance 3", argv=(PY, "-c", body))
    out = tmp_path / "out"
    with open(out, "wb") as f:
        assert run_group([spec], os.environ, stdout=f).exit_code == 0
    assert out.read_bytes() == b"[3] " + b"x" * 1000000 + b"\n[3] end\n"


def test_slow_console_reader_gets_all_output(tmp_path):
    """A console that takes nothing for longer than RELAY_TIMEOUT (a paused ``| less``)
    still gets every line: the launcher waits for a relay that is writing."""
    body = "import sys\nfor i in range(1200): print(f'{i:04d} ' + 'q' * 95)  # fits in the pipes: it exits"
    proc = subprocess.Popen([PY, "-c", DRIVER, json.dumps({
        "argv": [[PY, "-c", body]], "kw": {"prefix_output": False}, "result": str(tmp_path / "r.json")})],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(RELAY_TIMEOUT + 0.5)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert out.decode().splitlines() == [f"{i:04d} " + "q" * 95 for i in range(1200)]


@pytest.mark.parametrize("n", [1, 2])
def test_yes_into_head_through_cli(n):
    """``cpulaunch yes | head -1``: no traceback, no "Broken pipe", no hang; the exit
    status is SIGPIPE's (141), as pipefail reports a shell pipeline's."""
    if n > NCPUS:
        pytest.skip("needs 2 allowed CPUs")
    cmd = " ".join(cpulaunch("--ninstances", str(n), "--bind", "none", "yes"))
    proc = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd} | head -1"], capture_output=True,
                          text=True, timeout=20, cwd=REPO)
    assert proc.returncode == 141, proc.stderr
    assert proc.stdout in (("y\n",) if n == 1 else ("[0] y\n", "[1] y\n"))
    assert "Traceback" not in proc.stderr and "Broken pipe" not in proc.stderr
    assert "BrokenPipeError" not in proc.stderr and "Exception ignored" not in proc.stderr
    if n == 1:
        assert proc.stderr == ""


@need2
def test_console_epipe_with_sigpipe_default_in_launcher(tmp_path):
    """Even a caller that set SIGPIPE to SIG_DFL gets EPIPE handling (the launcher
    ignores SIGPIPE while supervising): the run ends with 141 and result.json is written."""
    cfg = {"argv": [["yes"], ["yes"]], "default": ["SIGPIPE"], "result": str(tmp_path / "r.json")}
    (tmp_path / "d.py").write_text(DRIVER)
    cmd = f"{PY} {tmp_path / 'd.py'} '{json.dumps(cfg)}' | head -1; echo ${{PIPESTATUS[0]}} >&2"
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=20, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))  # this checkout's cpulaunch
    assert proc.stderr.splitlines()[-1] == "141", proc.stderr
    out = json.loads((tmp_path / "r.json").read_text())
    assert out["exit_code"] == 141 and out["results"][out["root_cause"]]["signal"] == "SIGPIPE"


def test_process_group_start_poll_stop_close(tmp_path):
    """The group on its own: start, poll (exits seen, not reaped), stop(deadline) with a
    stubborn member (SIGTERM, then SIGKILL at the deadline), close, results."""
    stubborn = (PY, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('up', flush=True); time.sleep(60)")
    specs = [ProcessSpec(index=0, label="instance 0", argv=("sh", "-c", "exit 4")),
             ProcessSpec(index=1, label="instance 1", argv=("sleep", "60")),
             ProcessSpec(index=2, label="instance 2", argv=stubborn)]
    out = tmp_path / "out"
    with open(out, "wb") as f:
        group = ProcessGroup(specs, os.environ, stdout=f, kill_timeout=2)
        group.start()
        try:
            wait_until(lambda: [r.index for r in group.poll()] == [0], what="instance 0 exit seen")
            assert state(group.procs[0].pid) == "Z"  # seen, not reaped: its group id stays ours
            assert group.running() == [1, 2]
            wait_until(lambda: out.read_bytes() == b"[2] up\n", what="instance 2 up")
            t0 = time.monotonic()
            group.stop(time.monotonic() + 0.5)
            assert 0.5 <= time.monotonic() - t0 < 2.5
            assert group.running() == []
        finally:
            group.close()
    assert [(r.index, r.describe()) for r in group.results()] == [
        (0, "exited with code 4"), (1, "killed by SIGTERM"), (2, "killed by SIGKILL")]
    assert all(state(r.pid) is None for r in group.results())  # reaped


def test_after_hook_sees_running_instances_and_cannot_break_the_run(caplog):
    """``after=(seconds, fn)`` (used by --verify): called once with {index: pid} of the
    running instances and the run folder (None: no log_dir); an exception in it is
    logged, the run goes on."""
    seen = []

    def check(pids, run):
        seen.append(({i: state(p) for i, p in pids.items()}, run))
        raise RuntimeError("boom")

    specs = [ProcessSpec(index=i, label=f"instance {i}", argv=("sleep", "0.6")) for i in (0, 1)]
    with open(os.devnull, "wb") as null:
        outcome = run_group(specs, os.environ, stdout=null, stderr=null, after=(0.2, check))
    assert outcome.exit_code == 0
    assert seen == [({0: "S", 1: "S"}, None)]
    assert "after-start check failed: boom" in caplog.text


def test_stdin_goes_to_single_instance_through_cli(tmp_path):
    logs = tmp_path / "logs"
    for extra in ([], ["--log-dir", str(logs)]):
        proc = subprocess.run(cpulaunch("--bind", "none", *extra, "cat"), input="hi\n", capture_output=True,
                              text=True, timeout=20, cwd=REPO)
        assert (proc.returncode, proc.stdout) == (0, "hi\n"), proc.stderr
    (run_dir,) = logs.iterdir()
    assert (run_dir / "0" / "stdout.log").read_text() == "hi\n"


@need2
def test_several_instances_read_dev_null_unless_told(tmp_path):
    cat = ["sh", "-c", "cat; echo end"]
    proc, out = drive(tmp_path, [cat, cat], popen={"input": "hi\n"})
    assert proc.returncode == 0 and sorted(proc.stdout.splitlines()) == ["[0] end", "[1] end"]
    proc, out = drive(tmp_path, [cat, cat], kw={"stdin_for": 1}, popen={"input": "hi\n"})
    assert proc.returncode == 0 and sorted(proc.stdout.splitlines()) == ["[0] end", "[1] end", "[1] hi"]


# --------------------------------------------------------------------------- disks


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs (skipped when mounting is not permitted), unmounted afterwards."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_under_log_dir_keeps_exit_code_and_says_so_once(tiny_tmpfs, tmp_path):
    child = write(tmp_path, "loud.py", """
        import sys
        for i in range(20000):
            print(f"line {i:05d} " + "z" * 40)
        sys.exit(7)
    """)
    t0 = time.monotonic()
    proc = subprocess.run(cpulaunch("--bind", "none", "--log-dir", str(tiny_tmpfs / "logs"), child),
                          capture_output=True, text=True, timeout=30, cwd=REPO)
    assert time.monotonic() - t0 < 10
    assert proc.returncode == 7
    assert len(proc.stdout.splitlines()) == 20000  # the console kept everything
    (run_dir,) = (tiny_tmpfs / "logs").iterdir()
    said = [line for line in proc.stderr.splitlines() if "logging to" in line]
    assert said == [f"cpulaunch: logging to {run_dir}/0/stdout.log stopped: No space left on device"]
    assert "Traceback" not in proc.stderr


def test_full_disk_on_console_stdout_keeps_exit_code(tiny_tmpfs, tmp_path):
    """stdout redirected to a file on a full disk: said once, logs and exit code kept."""
    specs = [ProcessSpec(index=0, label="instance 0", argv=(
        PY, "-c", "import sys\nfor i in range(5000): print('w' * 60)\nsys.exit(5)"))]
    err = tmp_path / "err"
    with open(tiny_tmpfs / "out", "wb") as out, open(err, "wb") as errf:
        outcome = run_group(specs, os.environ, stdout=out, stderr=errf, log_dir=tmp_path / "logs")
    assert outcome.exit_code == 5
    assert err.read_text() == "cpulaunch: relaying output to stdout stopped: No space left on device\n"
    (run_dir,) = (tmp_path / "logs").iterdir()
    assert len((run_dir / "0" / "stdout.log").read_text().splitlines()) == 5000


def log_dir_error(log_dir, tmp_path) -> str:
    touched = tmp_path / "touched"
    spec = ProcessSpec(index=0, label="instance 0", argv=("touch", str(touched)))
    with pytest.raises(LaunchError) as exc:
        run_group([spec], os.environ, log_dir=log_dir, run_info="{}")
    assert not touched.exists()  # nothing started
    return str(exc.value)


def test_log_folder_errors_name_the_folder_and_cause(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert log_dir_error(a_file, tmp_path) == (
        f"cannot use log folder {str(a_file)!r}: it exists and is not a folder; pass a writable folder to --log-dir")
    assert log_dir_error(a_file / "sub", tmp_path) == (
        f"cannot use log folder {str(a_file / 'sub')!r}: Not a directory; pass a writable folder to --log-dir")
    long = tmp_path / ("x" * 300)
    assert log_dir_error(long, tmp_path) == (
        f"cannot use log folder {str(long)!r}: File name too long; pass a writable folder to --log-dir")


def test_log_folder_read_only_or_full(tiny_tmpfs, tmp_path):
    with open(tiny_tmpfs / "filler", "wb", buffering=0) as f:
        with pytest.raises(OSError, match="No space left"):
            while True:
                f.write(b"\0" * 4096)
    msg = log_dir_error(tiny_tmpfs / "logs", tmp_path)
    assert msg.startswith(f"cannot use log folder {str(tiny_tmpfs / 'logs')!r}")
    assert msg.endswith(": No space left on device; pass a writable folder to --log-dir")
    assert sorted(p.name for p in tiny_tmpfs.iterdir()) == ["filler", "logs"]
    assert list((tiny_tmpfs / "logs").iterdir()) == []  # the half-made run folder was removed
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_tmpfs)], check=True)
    assert log_dir_error(tiny_tmpfs / "other", tmp_path) == (
        f"cannot use log folder {str(tiny_tmpfs / 'other')!r}: Read-only file system; "
        "pass a writable folder to --log-dir")


# --------------------------------------------------------------------------- planted links (issue 19)


NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def as_nobody(*argv: str) -> None:
    subprocess.run(NOBODY + list(argv), check=True, timeout=20)


@pytest.fixture
def shared():
    """A world-writable sticky folder in /tmp (a pytest tmp_path is private: another
    user could not reach it), where another user (nobody, via setpriv) plants links;
    removed afterwards."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("plants links as another user: needs root and setpriv")
    d = Path(tempfile.mkdtemp(prefix="cpulaunch-shared-", dir="/tmp"))
    d.chmod(0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def precious_file(tmp_path: Path) -> Path:
    p = tmp_path / "precious"
    p.write_text("keep")
    return p


def owned_runs(shared: Path) -> list:
    """The run folders a launcher made: real folders of ours (not links, not nobody's)."""
    return [d for d in shared.iterdir() if not d.is_symlink() and d.is_dir() and d.stat().st_uid == os.geteuid()]


RUN_ID = r"\d{8}-\d{6}(-\d+)?"

PLANT_DRIVER = r"""
import os, re, subprocess, sys
from pathlib import Path

# Another user wins the race: right after the launcher's mkdir of AT (its run folder,
# or <run>/0), nobody plants a link named WHAT in it, pointing at TARGET.
shared, at, what, target = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
real_mkdir, made = os.mkdir, []

def mkdir(path, mode=0o777, *, dir_fd=None):
    real_mkdir(path, mode, dir_fd=dir_fd)
    name = os.path.basename(os.fspath(path))
    if not made and re.fullmatch(RUN_ID, name):
        made.append(shared / name)
        folder, this = made[0], "run"
    elif made and name == "0":
        folder, this = made[0] / "0", "0"
    else:
        return
    if this == at:
        os.chmod(folder, 0o777)  # as under umask 0: others may write in it
        subprocess.run(NOBODY + ["ln", "-s", target, str(folder / what)], check=True)

os.mkdir = mkdir
from cpulaunch.cli import main
sys.exit(main(sys.argv[5:]))
"""


@pytest.mark.parametrize("at, what", [("run", "plan.json"), ("run", "0"), ("0", "stdout.log")])
def test_names_planted_while_the_run_folder_is_made_are_never_followed(shared, tmp_path, at, what):
    """Another user plants a link in the new run folder (writable by others under umask
    0) between its mkdir and the launcher's next step: plan.json is renamed over the
    link (the run goes on); a link at <index>/ or <index>/stdout.log stops the run
    before anything starts with one line, exit 2. Never entered, never written through."""
    precious = precious_file(tmp_path)
    elsewhere = shared / "elsewhere"
    as_nobody("mkdir", "-m", "777", str(elsewhere))
    target = elsewhere if what == "0" else precious
    driver = PLANT_DRIVER.replace("RUN_ID", repr(RUN_ID)).replace("NOBODY", repr(NOBODY))
    ran = tmp_path / "ran"
    proc = subprocess.run([PY, "-c", driver, str(shared), at, what, str(target), "--bind", "none",
                           "--log-dir", str(shared), "touch", str(ran)],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert precious.read_text() == "keep" and list(elsewhere.iterdir()) == []
    (run,) = owned_runs(shared)
    planted = run / what if at == "run" else run / "0" / what
    if what == "plan.json":
        assert proc.returncode == 0, proc.stderr
        assert not planted.is_symlink() and json.loads(planted.read_text())["instances"]
        assert ran.exists()
        return
    assert os.readlink(planted) == str(target)  # the link is still there, untouched
    assert proc.returncode == 2 and not ran.exists()
    assert proc.stderr.splitlines() == [
        f"cpulaunch: error: cannot use log folder {str(shared)!r} ({planted}): it exists already "
        "(put there by someone else); pass a folder only you can write to --log-dir"]


PLANTING_CHILD = r"""
import os, subprocess, sys, time
from pathlib import Path

shared, precious = Path(sys.argv[1]), Path(sys.argv[2])
(run,) = [d for d in shared.iterdir() if not d.is_symlink() and d.is_dir() and d.stat().st_uid == os.getuid()]
if os.environ["CPULAUNCH_INSTANCE_INDEX"] == "0":  # written at the end: a link waits for it
    subprocess.run(NOBODY + ["ln", "-s", str(precious), str(run / "result.json")], check=True)
verify = run / "verify.json"
deadline = time.monotonic() + 30
while time.monotonic() < deadline and precious.read_text() == "keep" and not (
        verify.exists() and not verify.is_symlink()):
    time.sleep(0.02)  # until --verify has written, here or through a link
"""


@need2
def test_run_files_never_written_through_links_in_a_shared_log_folder(shared, tmp_path):
    """--log-dir a world-writable sticky folder where another user planted, before the
    run: every predictable run id for two minutes (a link to their folder) and, in that
    folder, links at plan.json, result.json and verify.json with the newest mtime; during
    the run (umask 0: the run folder is writable by others) a link at result.json. The
    run picks a free name, writes its own plan.json, result.json and verify.json as
    files of its own, and the links' target is untouched."""
    precious = precious_file(tmp_path)
    trap = shared / "trap"
    as_nobody("mkdir", "-m", "777", str(trap))
    for name in ("plan.json", "result.json", "verify.json"):
        as_nobody("ln", "-s", str(precious), str(trap / name))
    now = int(time.time())
    stamps = [time.strftime("%Y%m%d-%H%M%S", time.localtime(t)) for t in range(now - 1, now + 120)]
    as_nobody("sh", "-c", 'cd "$0" && for s in "$@"; do ln -s trap "$s"; done', str(shared), *stamps)
    as_nobody("touch", "-d", f"@{now + 3600}", str(trap))  # the newest folder holding a plan.json
    child = write(tmp_path, "child.py", PLANTING_CHILD.replace("NOBODY", repr(NOBODY)))
    proc = subprocess.run(cpulaunch("--ninstances", "2", "--bind", "none", "--allocator", "default", "--verify",
                                    "--verify-after", "0.3", "--log-dir", str(shared), child, str(shared),
                                    str(precious)),
                          capture_output=True, text=True, timeout=90, cwd=REPO, preexec_fn=lambda: os.umask(0))
    assert proc.returncode == 0, proc.stderr
    assert precious.read_text() == "keep"
    (run,) = owned_runs(shared)
    assert re.fullmatch(RUN_ID, run.name) and run.name not in stamps  # a planted name is skipped
    for name in ("plan.json", "result.json", "verify.json"):
        assert not (run / name).is_symlink() and os.readlink(trap / name) == str(precious)
    result = json.loads((run / "result.json").read_text())
    verified = json.loads((run / "verify.json").read_text())
    assert sorted(i["pid"] for i in verified["instances"]) == sorted(i["pid"] for i in result["instances"])
