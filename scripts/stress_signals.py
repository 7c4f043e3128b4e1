#!/usr/bin/env python3
"""Seeded trials of real multi-instance cpulaunch runs hit by signals at random moments.

Each trial starts ``python -m cpulaunch --ninstances 2 --bind none --grace-period G
CHILD`` with a unique marker in the environment (every descendant inherits it), waits a
random time (0 to --max-delay seconds: during Python's start-up, planning, spawning or
the run) and then does one of:

* send SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 or SIGUSR2 to the launcher;
* SIGKILL the launcher (the OOM killer's way);
* Ctrl-Z: SIGTSTP, then SIGCONT, then SIGTERM.

The children are chosen at random too: ``sleep`` (default dispositions), a shell that
ignores SIGTERM (the whole group then needs SIGKILL after the grace period), a shell
that forks grandchildren into its group, or a Python program that forks a grandchild
and ignores SIGTERM.

Checked per trial:

* hang: the launcher has not exited --timeout seconds after the (last) signal;
* orphan: a process carrying the trial's marker is still alive 3 s after the launcher
  exited (scanned in /proc/*/environ);
* wrong exit code: SIGKILL -> killed by SIGKILL; a stopping signal N -> 128+N;
  SIGUSR1/2 -> 128+N (the instances die of it and the first is the root cause); Ctrl-Z
  then SIGTERM -> 143. Being killed by the signal itself (-N) is accepted only while no
  process of the launcher's existed yet (its handlers are installed before anything
  is forked), i.e. when the signal hit Python's start-up. A SIGINT that lands in
  Python's own start-up (site, importlib: a KeyboardInterrupt traceback without any
  cpulaunch frame, exit 1) is counted and shown apart: no Python program can catch it.

Prints the counts and exits 1 unless all three are 0. ``--trials 100`` takes about
2 minutes on a quiet 2-CPU machine.

    python scripts/stress_signals.py --trials 30 --seed 7

``--mode spawn-kill`` (issue 19) aims at the spawn window instead: each trial starts
``python -m cpulaunch --ninstances 2 --bind affinity --grace-period 3 sh -c 'sleep 30 &
wait'``, polls ``/proc/PID/task/PID/children`` of the launcher in a tight loop and sends it
SIGKILL the moment it has a child (the watchdog, then the instances, are forked within a
few milliseconds, so the kill lands somewhere in their start: before or after an
instance's fork, prctl, exec, or its shell's fork of ``sleep``). A trial fails when any
process carrying the trial's marker is still alive 3 s after the launcher died. Prints
how many trials left something behind and exits 1 unless none did.

    python scripts/stress_signals.py --mode spawn-kill --trials 100
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARKER_VAR = "CPULAUNCH_STRESS_MARKER"

CHILDREN = {
    "sleep": ["sleep", "30"],
    "ignore-term": ["sh", "-c", "trap '' TERM; sleep 31 & sleep 32 & wait"],
    "forker": ["sh", "-c", "sleep 33 & (sleep 34; :) & wait"],
    "python-forker": [sys.executable, "-c",
                      "import signal, subprocess, time\n"
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      "subprocess.Popen(['sleep', '35'])\n"
                      "time.sleep(36)\n"],
}
ACTIONS = ["SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGKILL", "CTRL-Z"]


def marked(marker: str, exclude: int = 0) -> list:
    """Live (not zombie) processes whose environment holds MARKER_VAR=marker."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == exclude:
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{d}/stat", "rb") as f:
                st = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if st != b"Z" and needle in env.split(b"\0"):
            found.append(int(d))
    return found


def kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def children(pid: int) -> list:
    """Pids (bytes) of ``pid``'s children forked by its main thread (the launcher forks there);
    None once it is gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return f.read().split()
    except OSError:
        return None


def gone_within(marker: str, seconds: float) -> list:
    """Wait up to ``seconds`` for every process carrying ``marker`` to go; returns those
    still alive then (after SIGKILLing them, so a trial leaves nothing to the next)."""
    deadline = time.monotonic() + seconds
    left = marked(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = marked(marker)
    kill_all(left)
    return left


def expected_codes(action: str) -> tuple:
    """(exit codes accepted once the launcher's handlers are in place, the code it would
    have if it died of the signal itself)."""
    if action == "SIGKILL":
        return (-signal.SIGKILL,), -signal.SIGKILL
    if action == "CTRL-Z":
        return (143,), -signal.SIGTERM
    n = getattr(signal, action)
    return (128 + n,), -n


def start(kind: str, args, env_base: dict):
    marker = uuid.uuid4().hex
    env = dict(env_base, **{MARKER_VAR: marker})
    argv = [sys.executable, "-m", "cpulaunch", "--ninstances", "2", "--bind", "none",
            "--grace-period", str(args.grace_period), *CHILDREN[kind]]
    # A process group of its own, as a shell job: Ctrl-Z can then stop it.
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, process_group=0)
    return proc, marker


def calibrate(args, env: dict) -> float:
    """Seconds from the launch until both instances run (watchdog + 2 sleeps), on this
    machine now; the run is then stopped with SIGTERM."""
    t0 = time.monotonic()
    proc, marker = start("sleep", args, env)
    while len(marked(marker, exclude=proc.pid)) < 3 and time.monotonic() - t0 < 30:
        time.sleep(0.005)
    took = time.monotonic() - t0
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=args.timeout)
    kill_all(marked(marker))
    return took


def python_start_up_interrupt(returncode: int, err: str) -> bool:
    """SIGINT landed in Python's own start-up (site, importlib), before any cpulaunch
    module ran: a KeyboardInterrupt traceback with no frame from the cpulaunch package."""
    lines = err.strip().splitlines()
    return (returncode == 1 and bool(lines) and lines[-1] == "KeyboardInterrupt"
            and f"{REPO / 'cpulaunch'}{os.sep}" not in err)


def trial(rng: random.Random, args, env_base: dict) -> dict:
    kind = rng.choice(sorted(CHILDREN))
    action = rng.choice(ACTIONS)
    delay = rng.uniform(0, args.max_delay)
    proc, marker = start(kind, args, env_base)
    time.sleep(delay)
    started = bool(marked(marker, exclude=proc.pid))  # the launcher had forked something
    if action == "CTRL-Z":
        proc.send_signal(signal.SIGTSTP)
        time.sleep(rng.uniform(0.05, 0.3))
        proc.send_signal(signal.SIGCONT)
        time.sleep(rng.uniform(0, 0.2))
        proc.send_signal(signal.SIGTERM)
    else:
        proc.send_signal(getattr(signal, action))
    hang = False
    try:
        _, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        hang = True
        proc.kill()
        _, err = proc.communicate()
    left = gone_within(marker, 3.0)
    ok_codes, own_death = expected_codes(action)
    err = err.decode(errors="replace")
    pystart = action == "SIGINT" and not started and python_start_up_interrupt(proc.returncode, err)
    code_ok = proc.returncode in ok_codes or (proc.returncode == own_death and not started)
    return {"kind": kind, "action": action, "delay": delay, "started": started, "hang": hang,
            "orphans": len(left), "returncode": proc.returncode, "code_ok": code_ok or hang or pystart,
            "python_start_up": pystart, "stderr": err.strip().splitlines()[-3:]}


SPAWN_KILL_CHILD = ["sh", "-c", "sleep 30 & wait"]


def spawn_kill_trial(args, env_base: dict) -> dict:
    """One launcher SIGKILLed as soon as it has ``args.at_child`` children; what it left
    behind."""
    marker = uuid.uuid4().hex
    env = dict(env_base, **{MARKER_VAR: marker})
    argv = [sys.executable, "-m", "cpulaunch", "--ninstances", "2", "--bind", "affinity",
            "--grace-period", "3", *SPAWN_KILL_CHILD]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0)
    deadline = time.monotonic() + args.timeout
    seen = None
    while time.monotonic() < deadline:
        seen = children(proc.pid)
        if seen is None or len(seen) >= args.at_child:  # gone, or has its Nth child: kill now
            break
    proc.kill()
    proc.wait(timeout=args.timeout)
    left = gone_within(marker, 3.0)
    return {"killed_with": len(seen or ()), "returncode": proc.returncode, "left": left}


def spawn_kill(args, env: dict) -> int:
    t0 = time.monotonic()
    results = []
    for i in range(args.trials):
        r = spawn_kill_trial(args, env)
        results.append(r)
        if args.verbose or r["left"] or r["returncode"] != -signal.SIGKILL:
            print(f"trial {i:3d}: SIGKILL with {r['killed_with']} child(ren) -> {r['returncode']}"
                  + (f"  LEFT BEHIND: {len(r['left'])} process(es)" if r["left"] else ""), flush=True)
    took = time.monotonic() - t0
    bad = sum(1 for r in results if r["left"])
    early = sum(1 for r in results if r["returncode"] != -signal.SIGKILL)
    at = collections.Counter(r["killed_with"] for r in results)
    print(f"{len(results)} spawn-window kill -9 trials in {took:.0f} s (killed with N children: "
          + ", ".join(f"N={n}: {at[n]}" for n in sorted(at))
          + (f", {early} launchers had exited before the kill" if early else "") + ")")
    print(f"trials that left processes behind: {bad} "
          f"({sum(len(r['left']) for r in results)} processes)")
    return 1 if bad else 0


def random_signals(rng: random.Random, args, env: dict) -> int:
    """The default mode: --trials trials of :func:`trial`; prints the counts."""
    t0 = time.monotonic()
    results = []
    for i in range(args.trials):
        r = trial(rng, args, env)
        results.append(r)
        bad = r["hang"] or r["orphans"] or not r["code_ok"]
        if args.verbose or bad:
            print(f"trial {i:3d}: {r['action']:8s} at {r['delay']:.2f}s  {r['kind']:13s} "
                  f"started={int(r['started'])} -> {r['returncode']}"
                  + (f"  HANG" if r["hang"] else "")
                  + (f"  ORPHANS={r['orphans']}" if r["orphans"] else "")
                  + ("" if r["code_ok"] else "  WRONG EXIT CODE")
                  + (f"  stderr: {r['stderr']}" if bad else ""), flush=True)
    took = time.monotonic() - t0
    orphans = sum(1 for r in results if r["orphans"])
    hangs = sum(1 for r in results if r["hang"])
    wrong = sum(1 for r in results if not r["code_ok"])
    by_action = collections.Counter(r["action"] for r in results)
    early = sum(1 for r in results if not r["started"])
    print(f"{len(results)} trials (seed {args.seed}) in {took:.0f} s; signals: "
          + ", ".join(f"{a} {by_action[a]}" for a in ACTIONS)
          + f"; {early} hit the launcher before it had started anything")
    pystart = sum(1 for r in results if r["python_start_up"])
    if pystart:
        print(f"{pystart} SIGINT(s) landed in Python's own start-up before any cpulaunch module ran "
              "(KeyboardInterrupt traceback from site/importlib, exit 1): Python's, not counted below")
    print(f"orphans: {orphans}  hangs: {hangs}  wrong exit codes: {wrong}")
    return 1 if orphans or hangs or wrong else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["signals", "spawn-kill"], default="signals",
                    help="signals: random signals at random moments (default); spawn-kill: "
                         "kill -9 of the launcher as soon as it has a child")
    ap.add_argument("--trials", type=int, default=100, help="number of trials (default 100)")
    ap.add_argument("--at-child", type=int, default=1, metavar="N",
                    help="spawn-kill: SIGKILL once the launcher has N children (default 1: the "
                         "first, its watchdog; 2: the moment instance 0 is forked)")
    ap.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    ap.add_argument("--max-delay", type=float, default=None,
                    help="latest moment of the signal after the launch, seconds (default: 1.5 x "
                         "the launcher's start-up measured first, so about a third of the "
                         "signals hit the start-up)")
    ap.add_argument("--grace-period", type=float, default=0.5,
                    help="cpulaunch --grace-period (default 0.5)")
    ap.add_argument("--timeout", type=float, default=20.0,
                    help="seconds after the signal before a run counts as hung (default 20)")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per trial")
    args = ap.parse_args(argv)

    env = dict(os.environ)
    env.pop("CPULAUNCH_INSTANCE_INDEX", None)
    with tempfile.TemporaryDirectory(prefix="cpulaunch-stress-") as tmp:
        env["PYTHONPYCACHEPREFIX"] = env.get("PYTHONPYCACHEPREFIX", os.path.join(tmp, "pycache"))
        if args.mode == "spawn-kill":
            return spawn_kill(args, env)
        rng = random.Random(args.seed)
        if args.max_delay is None:
            startup = calibrate(args, env)
            args.max_delay = max(1.5 * startup, 0.5)
            print(f"launcher start-up here: {startup:.2f} s; signals at 0-{args.max_delay:.2f} s", flush=True)
        return random_signals(rng, args, env)


if __name__ == "__main__":
    sys.exit(main())
