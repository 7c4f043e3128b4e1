"""Supervision with real processes: exit codes, fail-fast, signals, orphans, logs.

Every test runs the real ``cpulaunch`` (``python -m cpulaunch``) on this machine's CPUs
with small Python children. Two instances need two physical cores: the machine has 2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO, default_signals

PY = sys.executable
NCORES = len(os.sched_getaffinity(0))
need2 = pytest.mark.skipif(NCORES < 2, reason="needs 2 allowed CPUs for 2 instances")


def cpulaunch(*args, **kw):
    return [PY, "-m", "cpulaunch", *args]


def run(args, timeout=60, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=REPO, **kw)


def script(tmp_path: Path, body: str) -> str:
    p = tmp_path / "child.py"
    p.write_text(textwrap.dedent(body))
    return str(p)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); look at its state.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(path: Path, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} not written within {timeout}s")


# --------------------------------------------------------------------------- one instance


def test_single_instance_is_exec_and_keeps_exit_code(tmp_path):
    child = script(tmp_path, """
        import os, sys
        print(os.getpid(), flush=True)
        sys.exit(5)
    """)
    proc = subprocess.Popen(cpulaunch(child), stdout=subprocess.PIPE, text=True, cwd=REPO)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 5
    # exec: the program ran in the launcher's own process
    assert int(out.split()[0]) == proc.pid


def test_single_instance_signal_death_is_its_own(tmp_path):
    child = script(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = run(cpulaunch(child))
    assert proc.returncode == -signal.SIGKILL


def test_program_not_found_is_one_line_exit_2():
    proc = run(cpulaunch("no-such-program-xyz"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "cpulaunch: error: program 'no-such-program-xyz' not found (not a file, not on PATH)"
    ]


def test_no_program_is_one_line_exit_2():
    proc = run(cpulaunch())
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "no program given" in proc.stderr
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- several instances


@need2
def test_output_prefixed_and_all_succeed(tmp_path):
    child = script(tmp_path, """
        import os, sys
        print("out", os.environ["CPULAUNCH_INSTANCE_INDEX"], sorted(os.sched_getaffinity(0)))
        print("err", os.environ["CPULAUNCH_INSTANCE_INDEX"], file=sys.stderr)
    """)
    proc = run(cpulaunch("--ninstances", "2", child))
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0] out 0 [0]", "[1] out 1 [1]"]
    assert "[0] err 0" in proc.stderr.splitlines() and "[1] err 1" in proc.stderr.splitlines()


@need2
def test_first_failure_stops_others_and_sets_exit_code(tmp_path):
    child = script(tmp_path, """
        import os, sys, time
        idx = int(os.environ["CPULAUNCH_INSTANCE_INDEX"])
        if idx == 1:  # fails once instance 0 runs (its pid file, written whole, is there)
            while not os.path.exists(sys.argv[1] + "/pid0"):
                time.sleep(0.01)
            sys.exit(3)
        with open(sys.argv[1] + "/pid0.tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(sys.argv[1] + "/pid0.tmp", sys.argv[1] + "/pid0")
        time.sleep(120)
    """)
    t0 = time.monotonic()
    proc = run(cpulaunch("--ninstances", "2", child, str(tmp_path)))
    assert proc.returncode == 3
    assert time.monotonic() - t0 < 30  # instance 0 was stopped, not waited for
    assert "instance 1 failed first: exit 3 (SystemExit); instance 0 stopped" in proc.stderr
    assert not alive(int((tmp_path / "pid0").read_text()))


@need2
def test_signal_death_reported_as_128_plus_n(tmp_path):
    child = script(tmp_path, """
        import os, signal, time
        if os.environ["CPULAUNCH_INSTANCE_INDEX"] == "1":
            os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(120)
    """)
    proc = run(cpulaunch("--ninstances", "2", child))
    assert proc.returncode == 128 + signal.SIGSEGV


@need2
def test_keep_going_lets_others_finish(tmp_path):
    """Instance 1 fails; instance 0 goes on once instance 1 has ended (a zombie: the
    launcher's pidfd saw it, the moment fail-fast would stop the others), proves the
    negative by waiting up to 2 s for a SIGTERM that must not come, and finishes."""
    child = script(tmp_path, """
        import os, signal, sys, time
        pidfile = sys.argv[1] + "/pid1"
        if os.environ["CPULAUNCH_INSTANCE_INDEX"] == "1":
            open(pidfile + ".tmp", "w").write(str(os.getpid()))
            os.rename(pidfile + ".tmp", pidfile)
            sys.exit(4)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        def ended():
            try:
                with open("/proc/%s/stat" % open(pidfile).read()) as f:
                    return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
            except FileNotFoundError:
                return True
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (os.path.exists(pidfile) and ended()):
            time.sleep(0.01)
        if signal.sigtimedwait({signal.SIGTERM}, 2.0):
            open(sys.argv[1] + "/stopped", "w").close()
            sys.exit(143)
        open(sys.argv[1] + "/finished", "w").write("yes")
    """)
    proc = run(cpulaunch("--ninstances", "2", "--keep-going", child, str(tmp_path)))
    assert proc.returncode == 4
    assert (tmp_path / "finished").read_text() == "yes" and not (tmp_path / "stopped").exists()
    assert "instance 1 failed first: exit 4 (SystemExit)" in proc.stderr and "stopped" not in proc.stderr


@need2
def test_sigterm_then_sigkill_after_grace_period(tmp_path):
    child = script(tmp_path, """
        import os, signal, sys, time
        idx = os.environ["CPULAUNCH_INSTANCE_INDEX"]
        if idx == "1":  # fails once instance 0 ignores SIGTERM (then it writes its pid file whole)
            while not os.path.exists(sys.argv[1] + "/pid0"):
                time.sleep(0.01)
            sys.exit(9)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stubborn instance
        with open(sys.argv[1] + "/pid0.tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(sys.argv[1] + "/pid0.tmp", sys.argv[1] + "/pid0")
        time.sleep(120)
    """)
    t0 = time.monotonic()
    proc = run(cpulaunch("--ninstances", "2", "--grace-period", "1", child, str(tmp_path)))
    took = time.monotonic() - t0
    assert proc.returncode == 9
    assert 1.0 <= took < 20
    assert not alive(int((tmp_path / "pid0").read_text()))


STOPPING = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT]


@need2
@pytest.mark.parametrize("sig", STOPPING + [signal.SIGUSR1, signal.SIGUSR2], ids=lambda s: s.name)
def test_signals_forwarded_and_no_orphans(tmp_path, sig):
    """The launcher forwards SIGINT/TERM/HUP/QUIT/USR1/USR2 to every instance. A stopping
    signal ends the run with 128+N ("stopped by SIG..."), even though the instances
    caught it and exited on their own; SIGUSR1/2 are only passed on (here the instances
    exit 0 after catching it, so the run succeeds). Each instance's own child (a
    grandchild of the launcher) is gone once the launcher has exited."""
    child = script(tmp_path, """
        import os, signal, subprocess, sys, time
        idx = os.environ["CPULAUNCH_INSTANCE_INDEX"]
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        def handler(signum, frame):
            open(sys.argv[1] + f"/got{idx}", "w").write(str(signum))
            sys.exit(0 if signum in (signal.SIGUSR1, signal.SIGUSR2) else 10 + int(idx))
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(s, handler)
        open(sys.argv[1] + f"/pids{idx}", "w").write(f"{os.getpid()} {grandchild.pid}")
        time.sleep(300)
    """)
    proc = subprocess.Popen(cpulaunch("--ninstances", "2", "--bind", "none", child, str(tmp_path)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, preexec_fn=default_signals)
    pids = [wait_for(tmp_path / f"pids{i}").split() for i in (0, 1)]
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    for i in (0, 1):
        assert (tmp_path / f"got{i}").read_text() == str(int(sig))
    if sig in STOPPING:
        assert proc.returncode == 128 + sig
        assert f"stopped by {sig.name}" in err.decode()
    else:
        assert proc.returncode == 0, err
    for child_pid, grandchild_pid in pids:
        assert not alive(int(child_pid))
        assert not alive(int(grandchild_pid))


@need2
def test_log_dir_layout_and_runs_kept(tmp_path):
    """torchrun's layout: DIR/<run-id>/<index>/stdout.log and stderr.log, plan.json
    (written before the start) and result.json; a second run gets its own run id."""
    child = script(tmp_path, """
        import os, sys
        idx = os.environ["CPULAUNCH_INSTANCE_INDEX"]
        print("hello from", idx)
        print("err from", idx, file=sys.stderr)
    """)
    logs = tmp_path / "logs"
    for _ in range(2):
        proc = run(cpulaunch("--ninstances", "2", "--bind", "none", "--log-dir", str(logs), child))
        assert proc.returncode == 0, proc.stderr
        assert sorted(proc.stdout.splitlines()) == ["[0] hello from 0", "[1] hello from 1"]
    runs = sorted(logs.iterdir())
    assert len(runs) == 2  # the second run did not overwrite the first
    for run_dir in runs:
        assert sorted(p.name for p in run_dir.iterdir()) == ["0", "1", "plan.json", "result.json"]
        json.loads((run_dir / "plan.json").read_text())
        result = json.loads((run_dir / "result.json").read_text())
        assert result["exit_code"] == 0 and result["root_cause"] is None
        assert [r["exit_code"] for r in result["instances"]] == [0, 0]
        for i in (0, 1):
            assert (run_dir / str(i) / "stdout.log").read_text() == f"hello from {i}\n"
            assert (run_dir / str(i) / "stderr.log").read_text() == f"err from {i}\n"


@need2
def test_log_dir_result_json_names_root_cause_and_signal(tmp_path):
    child = script(tmp_path, """
        import os, signal, sys, time
        if os.environ["CPULAUNCH_INSTANCE_INDEX"] == "1":  # dies once instance 0 runs
            while not os.path.exists(sys.argv[1] + "/ready0"):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGABRT)
        open(sys.argv[1] + "/ready0", "w").close()
        time.sleep(60)
    """)
    logs = tmp_path / "logs"
    proc = run(cpulaunch("--ninstances", "2", "--bind", "none", "--log-dir", str(logs), child, str(tmp_path)))
    assert proc.returncode == 128 + signal.SIGABRT
    (run_dir,) = logs.iterdir()
    result = json.loads((run_dir / "result.json").read_text())
    assert result["exit_code"] == 134
    assert result["root_cause"] == 1
    assert result["description"] == "instance 1 failed first: killed by SIGABRT; instance 0 stopped"
    one = result["instances"][1]
    assert (one["exit_code"], one["signal"]) == (134, "SIGABRT")
    zero = result["instances"][0]
    assert (zero["exit_code"], zero["signal"]) == (143, "SIGTERM")  # stopped by us
    for r in result["instances"]:
        assert r["start"] <= r["end"]


def test_single_instance_with_log_dir_keeps_exit_code(tmp_path):
    child = script(tmp_path, "import sys; print('x'); sys.exit(6)\n")
    proc = run(cpulaunch("--bind", "none", "--log-dir", str(tmp_path / "l"), child))
    assert proc.returncode == 6
    assert proc.stdout == "x\n"  # one instance: no prefix
    (run_dir,) = (tmp_path / "l").iterdir()
    assert (run_dir / "0" / "stdout.log").read_text() == "x\n"
    assert json.loads((run_dir / "result.json").read_text())["exit_code"] == 6


# --------------------------------------------------------------------------- --verify (issue 19)


VERIFIED_CHILD = """
import json, os, sys, time
from pathlib import Path

logs, me = Path(sys.argv[1]), os.getpid()

def verified():
    for f in logs.glob("*/verify.json"):
        try:
            if me in [i["pid"] for i in json.loads(f.read_text())["instances"]]:
                return True
        except (OSError, ValueError):
            pass
    return False

deadline = time.monotonic() + 30
while not verified() and time.monotonic() < deadline:  # until --verify has looked at us
    time.sleep(0.02)
"""


def verify_run(logs: Path, child: str):
    proc = run(cpulaunch("--bind", "none", "--allocator", "default", "--verify", "--verify-after", "0.2",
                         "--log-dir", str(logs), child, str(logs)))
    assert proc.returncode == 0, proc.stderr
    return proc


def test_two_verify_runs_in_one_log_folder_each_keep_their_own_verify_json(tmp_path):
    """Each --verify run writes verify.json in its own run folder, whatever else the log
    folder holds: here run B's folder has the newest mtime while run A checks (as when B
    is still running and writing), which used to make A write B's verify.json."""
    logs = tmp_path / "logs"
    child = script(tmp_path, VERIFIED_CHILD)
    verify_run(logs, child)
    (b,) = logs.iterdir()
    future = time.time() + 3600
    os.utime(b, (future, future))
    verify_run(logs, child)
    (a,) = [d for d in logs.iterdir() if d != b]
    for run_dir in (a, b):
        pids = [r["pid"] for r in json.loads((run_dir / "result.json").read_text())["instances"]]
        assert [i["pid"] for i in json.loads((run_dir / "verify.json").read_text())["instances"]] == pids


def test_verify_after_says_when_every_instance_had_exited(tmp_path):
    """--verify-after later than the program's end: one line says nothing was checked."""
    proc = run(cpulaunch("--bind", "none", "--allocator", "default", "--verify", "--verify-after", "30",
                         PY, "-c", "pass"))
    assert proc.returncode == 0
    assert proc.stderr.splitlines() == [
        "cpulaunch: verify: nothing to check: every instance had exited before 30 s (--verify-after)"]
