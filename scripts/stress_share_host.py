#!/usr/bin/env python3
"""Stress --share-host with real jobs: many concurrent starts by three users, and a long
wait queue; prints the figures as JSON (docs/guide/placement.md quotes them).

* ``starts``: ``--jobs`` (200) one-core jobs in ``--share-host wait``, all started at once,
  in turn as root and the two users the tests make (``useradd -m cpulaunch-u1`` and
  ``-u2``; only the current user when not root). Each program spins ``--hold`` seconds and
  writes the CPU it ran on and when. Checked: every job ran, and no two programs ran on one
  CPU at the same time (overlaps must be 0). Counted: the races lost between reading and
  claiming (``-v``'s "lost a race" lines), per job at most and in all. In the host's default
  space (``--space default``: in a private mount namespace with fresh /run and /tmp, root
  only) ``--churn`` removes /run/cpulaunch-leases and /tmp/cpulaunch-leases every 0.2 s during the run,
  and a user plants /tmp/cpulaunch-leases again.
* ``queue``: ``--queue`` (40) one-core jobs in wait mode started 20 ms apart on a machine of
  2 CPUs (only the first 2 CPUs are used), each spinning ``--job`` seconds (0.8). Measured:
  the share of the span (first program's start to last program's end) each CPU ran a
  program, and the gaps between one program's end and the next one's start on a CPU.

    python scripts/stress_share_host.py starts --jobs 200 --space default --churn
    python scripts/stress_share_host.py queue --queue 40
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import benchkit

sys.path.insert(0, str(benchkit.REPO / "tests"))
import hostusers  # noqa: E402  (the tests' users and mounts)

PROGRAM = """
import json, os, sys, time
t0 = time.time()
end = t0 + float(sys.argv[2])
while time.time() < end:
    pass
with open(sys.argv[1], "w") as f:
    json.dump({"cpus": sorted(os.sched_getaffinity(0)), "start": t0, "end": time.time()}, f)
"""
INSIDE = "CPULAUNCH_STRESS_INSIDE"


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def job_argv(python: str, work: Path, i: int, hold: float, lease_args: list, cpus: str = "") -> list:
    argv = [python, "-m", "cpulaunch", "-v", "--share-host", "wait", *lease_args, "--allocator", "default",
            "--bind", "affinity", "--ninstances", "1", "--ncores-per-instance", "1"]
    argv += [python, str(work / "program.py"), str(work / f"run{i}.json"), str(hold)]
    return ["taskset", "-c", cpus, *argv] if cpus else argv


def overlaps(runs: list) -> int:
    """How many pairs of consecutive programs on one CPU ran at the same time."""
    count = 0
    by_cpu: dict = {}
    for r in runs:
        for cpu in r["cpus"]:
            by_cpu.setdefault(cpu, []).append((r["start"], r["end"]))
    for spans in by_cpu.values():
        spans.sort()
        count += sum(1 for a, b in zip(spans, spans[1:]) if b[0] < a[1])
    return count


def start_jobs(work: Path, n: int, hold: float, users: list, lease_args: list, gap: float = 0.0,
               cpus: str = "") -> list:
    procs = []
    for i in range(n):
        user = users[i % len(users)]
        python, extra = (sys.executable, {}) if user is None else hostusers.user_python(user)
        env = {**benchkit.child_env(), **extra}
        procs.append(subprocess.Popen(hostusers.as_user(user, job_argv(python, work, i, hold, lease_args, cpus)),
                                      cwd=benchkit.REPO, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
        if gap:
            time.sleep(gap)
    return procs


def collect(work: Path, procs: list) -> dict:
    lost, failed = [], []
    for p in procs:
        _, err = p.communicate(timeout=3600)
        lost.append(len(re.findall(r"lost a race", err)))
        if p.returncode != 0:
            failed.append(err.strip().splitlines()[-1:] or [f"exit {p.returncode}"])
    runs = [json.loads(f.read_text()) for f in sorted(work.glob("run*.json"))]
    return {"jobs": len(procs), "ran": len(runs), "failed": failed[:5], "failures": len(failed),
            "overlaps": overlaps(runs), "lost_races_total": sum(lost), "lost_races_max_per_job": max(lost, default=0),
            "runs": runs}


def churn(stop: threading.Event, user) -> int:
    """Remove the host's lease folders every 0.2 s until ``stop``; plant /tmp/cpulaunch-leases as
    ``user`` every other time. Returns how many times."""
    n = 0
    while not stop.wait(0.2):
        subprocess.run(["rm", "-rf", "/run/cpulaunch-leases", "/tmp/cpulaunch-leases"], check=False)
        if user is not None and n % 2:
            subprocess.run(hostusers.as_user(user, ["mkdir", "-m", "1777", "/tmp/cpulaunch-leases"]), check=False,
                           stderr=subprocess.DEVNULL)
        n += 1
    return n


def starts(args) -> dict:
    users = [None]
    if os.geteuid() == 0 and not hostusers.missing():
        users += list(hostusers.ensure_users())
    work = Path(tempfile.mkdtemp(prefix="stress-share-", dir="/tmp"))
    work.chmod(0o1777)
    try:
        (work / "program.py").write_text(PROGRAM)
        lease_args = [] if args.space == "default" else ["--lease-dir", str(work / "leases")]
        if args.space != "default":
            (work / "leases").mkdir(mode=0o1777)
            (work / "leases").chmod(0o1777)
        stop = threading.Event()
        churner = None
        times: list = []
        if args.churn:
            churner = threading.Thread(target=lambda: times.append(churn(stop, users[-1] if len(users) > 1 else None)))
            churner.start()
        t = time.monotonic()
        procs = start_jobs(work, args.jobs, args.hold, users, lease_args)
        result = collect(work, procs)
        result["seconds"] = round(time.monotonic() - t, 1)
        stop.set()
        if churner is not None:
            churner.join()
            result["folders_removed"] = times[0]
        result["users"] = [u or "root" for u in users]
        result["space"] = args.space
        del result["runs"]
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def queue(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="stress-queue-", dir="/tmp"))
    try:
        (work / "program.py").write_text(PROGRAM)
        lease_args = ["--lease-dir", str(work / "leases")]
        cpus = sorted(os.sched_getaffinity(0))[:2]
        procs = start_jobs(work, args.queue, args.job, [None], lease_args, gap=0.02,
                           cpus=",".join(map(str, cpus)))
        result = collect(work, procs)
        runs = result.pop("runs")
        span0 = min(r["start"] for r in runs)
        span1 = max(r["end"] for r in runs)
        span = span1 - span0
        busy, gaps = {}, []
        for cpu in cpus:
            spans = sorted((r["start"], r["end"]) for r in runs if r["cpus"] == [cpu])
            busy[cpu] = round(sum(b - a for a, b in spans) / span, 3)
            gaps += [b[0] - a[1] for a, b in zip(spans, spans[1:])]
        gaps.sort()
        result.update({"span_s": round(span, 2), "busy_share_per_cpu": busy, "job_s": args.job,
                       "gap_ms_median": round(1000 * gaps[len(gaps) // 2], 1) if gaps else None,
                       "gap_ms_max": round(1000 * gaps[-1], 1) if gaps else None})
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    benchkit.exit_on_sigterm()
    p = benchkit.parser(__doc__, "starts: 30 jobs; queue: 10 jobs")
    p.add_argument("what", choices=("starts", "queue"))
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--hold", type=float, default=0.05, help="seconds each program of `starts` spins")
    p.add_argument("--space", choices=("dir", "default"), default="dir",
                   help="a sticky --lease-dir, or the host's folders in a private mount namespace (root)")
    p.add_argument("--churn", action="store_true", help="remove the host's lease folders during `starts`")
    p.add_argument("--queue", type=int, default=40)
    p.add_argument("--job", type=float, default=0.8, help="seconds each program of `queue` spins")
    args = p.parse_args()
    if args.quick:
        args.jobs, args.queue = min(args.jobs, 30), min(args.queue, 10)
    if args.space == "default" and os.environ.get(INSIDE) is None:
        if hostusers.missing():
            print(f"--space default: {hostusers.missing()}", file=sys.stderr)
            return 2
        return subprocess.run(hostusers.fresh(["env", f"{INSIDE}=1", sys.executable, *sys.argv])).returncode
    if args.churn and args.space != "default":
        print("--churn removes the host's folders: only with --space default", file=sys.stderr)
        return 2
    load = benchkit.LoadWindow()
    result = starts(args) if args.what == "starts" else queue(args)
    result.update({"cpu_model": cpu_model(), "cpus": len(os.sched_getaffinity(0)),
                   "foreign_load_pct": round(load.load().foreign_pct, 1)})
    print(json.dumps(result, indent=1))
    bad = result["overlaps"] or result["failures"] or result["ran"] != result["jobs"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
