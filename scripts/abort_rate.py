"""How often Lightning DDP ranks abort at exit under cpulaunch, with its exit hook and without.

Issue 24 item 8: a rank whose program never calls ``destroy_process_group()`` (Lightning's
DDP strategy does not) sometimes dies after its last step with "terminate called without an
active exception" (SIGABRT, exit 134; pytorch#190489). cpulaunch's exit hook (a
``sitecustomize`` first on each Python rank's PYTHONPATH, docs/guide/training.md) ends the group
before the interpreter finalizes. This script runs ``cpulaunch --ddp --nproc-per-node 2``
on ``tests/ranks_users_prog.py lightning`` (a tiny Trainer(strategy=...) that never destroys
the group) in rounds; each round runs every variant with the hook on and off (``--no-exit-hook``),
the order alternating between rounds, so the machine's load falls on both alike. It counts
exits 134 (and "terminate called" on stderr), other failures, each run's wall time and the
machine's foreign load during it (cpulaunch.tools.tune.load's meter), then times the hook's
start-up cost: ``python -c pass`` with and without the hook folder on PYTHONPATH,
interleaved.

Usage: python scripts/abort_rate.py [--runs 50] [--minutes 40] [--variants ddp,post-local-sgd]
[--json out.json]. --runs is per variant and hook state; --minutes stops after the round that
passes the deadline (the runs reached are printed). Uses this checkout's cpulaunch.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import benchkit

from cpulaunch.distributed import site_hook_dir

REPO = benchkit.REPO
PROG = str(REPO / "tests" / "ranks_users_prog.py")
VARIANTS = ("ddp", "post-local-sgd")


def run_once(variant: str, hook: bool, steps: int, timeout: float) -> dict:
    """One ``cpulaunch --ddp --nproc-per-node 2`` Lightning run -> its record: exit code,
    aborted (exit 134 or "terminate called" on stderr), wall seconds, foreign load (%); the
    code is None for a run stopped at ``timeout`` (a hang)."""
    argv = [sys.executable, "-m", "cpulaunch", "--ddp", "--nproc-per-node", "2", "--allocator", "default",
            *([] if hook else ["--no-exit-hook"]),
            "python", PROG, "lightning", "--devices", "2", "--strategy", variant, "--steps", str(steps)]
    window = benchkit.LoadWindow()
    t = time.perf_counter()
    code, _, err, hung = benchkit.run_bounded(argv, benchkit.child_env(), timeout, grace=60, cwd=REPO)
    wall = time.perf_counter() - t
    load = window.load()
    aborted = code == 134 or "terminate called" in err
    return {"variant": variant, "hook": hook, "code": None if hung else code, "aborted": aborted,
            "wall_s": round(wall, 3), "foreign_pct": round(load.foreign_pct, 1),
            "stderr_tail": err[-600:] if code else ""}


def startup_cost(repeats: int) -> tuple:
    """Median wall ms of ``python -c pass`` without and with the hook folder on PYTHONPATH
    (``repeats`` of each, interleaved; PYTHONDONTWRITEBYTECODE unset, as users run)."""
    base = {k: v for k, v in benchkit.child_env().items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    envs = (base, dict(base, PYTHONPATH=site_hook_dir()))
    times: tuple = ([], [])
    for _ in range(repeats):
        for which, env in enumerate(envs):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
            times[which].append(1000 * (time.perf_counter() - t))
    return statistics.median(times[0]), statistics.median(times[1])


def summarize(records: list, variants) -> list:
    """One line per (variant, hook): runs, aborts, other failures, median wall, load."""
    lines = []
    for variant in variants:
        for hook in (False, True):
            rs = [r for r in records if r["variant"] == variant and r["hook"] == hook]
            if not rs:
                continue
            aborts = sum(r["aborted"] for r in rs)
            other = sum(1 for r in rs if r["code"] != 0 and not r["aborted"])
            loads = [r["foreign_pct"] for r in rs]
            lines.append(f"{variant:<15} hook {'on ' if hook else 'off'}  runs {len(rs):3d}  "
                         f"aborts(134) {aborts:3d}  other failures {other:2d}  "
                         f"median wall {statistics.median(r['wall_s'] for r in rs):5.2f} s  "
                         f"foreign load median {statistics.median(loads):5.1f}% max {max(loads):5.1f}%")
    return lines


def main() -> int:
    p = benchkit.parser(__doc__, "2 runs per variant and hook state")
    p.add_argument("--runs", type=int, default=50, help="runs per variant and hook state (default 50)")
    p.add_argument("--minutes", type=float, default=None, help="stop after the round that passes this")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--steps", type=int, default=8, help="training steps per run (default 8)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a run counts as hung")
    p.add_argument("--json", type=Path, default=None, help="write every run's record here (after each round)")
    args = p.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if not set(variants) <= set(VARIANTS):
        p.error(f"--variants: choose from {', '.join(VARIANTS)}")
    runs = 2 if args.quick else args.runs
    deadline = time.monotonic() + 60 * args.minutes if args.minutes else None
    records: list = []
    for i in range(runs):
        order = [(v, h) for v in variants for h in ((True, False) if i % 2 else (False, True))]
        for variant, hook in order:
            rec = run_once(variant, hook, args.steps, args.timeout)
            records.append(rec)
            print(json.dumps({k: v for k, v in rec.items() if k != "stderr_tail"}), flush=True)
        if args.json:
            args.json.write_text(json.dumps(records, indent=1))
        if deadline is not None and time.monotonic() > deadline:
            print(f"deadline: stopped after {i + 1} round(s) of {runs}", flush=True)
            break
    off_ms, on_ms = startup_cost(5 if args.quick else 30)
    print("\n".join(summarize(records, variants)))
    print(f"hook start-up cost: python -c pass {off_ms:.1f} ms without, {on_ms:.1f} ms with "
          f"(+{on_ms - off_ms:.1f} ms, medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
