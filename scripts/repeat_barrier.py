"""Stress run (not a test): issue 38's barrier case, many times, under a CPU hog.

A two-rank gloo job in which rank 1 calls ``sys.exit(3)`` while rank 0 waits in
``dist.barrier()``: cpulaunch must name rank 1 and exit 3 every time, with and without the
exit hook, whatever the order in which the two ranks end. A busy process runs on every CPU
this script may use while the runs go (started and stopped here).

    python scripts/repeat_barrier.py                 # 100 runs with the exit hook, 100 without
    python scripts/repeat_barrier.py --runs 20 --no-hog
    python scripts/repeat_barrier.py --cpulaunch "python -m cpulaunch"   # the default

Prints one line per wrong run (its exit code and cpulaunch's last line) and, per variant,
``N of M right``; exits 1 if any run was wrong. The same case runs in the test suite
(tests/test_root_cause.py, 12 runs per variant; CPULAUNCH_TEST_REPEAT changes it).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

BARRIER = """\
import sys, torch.distributed as dist
from cpulaunch import init_process_group
init_process_group()
if dist.get_rank() == 1:
    sys.exit(3)
dist.barrier()
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=100, help="runs per variant (default 100)")
    p.add_argument("--no-hog", action="store_true", help="no busy process on each CPU")
    p.add_argument("--cpulaunch", default=f"{sys.executable} -m cpulaunch", help="the launcher's command")
    p.add_argument("--variants", default="hook,no-hook", help="hook, no-hook (comma-separated)")
    args = p.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    hogs = [] if args.no_hog else [
        subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, [{c}])\nwhile True: pass"])
        for c in cpus]
    bad = 0
    try:
        with tempfile.TemporaryDirectory() as tmp:
            prog = Path(tmp, "fail.py")
            prog.write_text(BARRIER)
            for variant in args.variants.split(","):
                flags = ["--no-exit-hook"] if variant == "no-hook" else []
                right = 0
                for n in range(args.runs):
                    cmd = [*shlex.split(args.cpulaunch), "--ddp", "--nproc-per-node", "2", "--core-list",
                           ",".join(map(str, cpus[:2])), *flags, "python", str(prog)]
                    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                    last = [ln for ln in proc.stderr.splitlines() if ln.startswith("cpulaunch: rank")][-1:]
                    ok = proc.returncode == 3 and bool(last) and last[0].startswith("cpulaunch: rank 1 failed first")
                    right += ok
                    if not ok:
                        print(f"{variant} run {n}: exit {proc.returncode}: {last[0] if last else proc.stderr[-300:]}",
                              flush=True)
                print(f"{variant}: {right} of {args.runs} right", flush=True)
                bad += args.runs - right
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
