"""Benchmark (not a test): Ray Train workers bound by cpulaunch against Ray's default.

Both variants run examples/ray_train.py (a local Ray head, a TorchTrainer with N CPU
workers of 1 CPU each on gloo, an MLP trained on the same seeds) and time the workers'
training loop (after warm-up steps; Ray's start and the process group's set-up are not
timed). The figure is the job's samples/s: N x batch x timed steps over the slowest
worker's loop seconds.

- bound: each worker calls ``cpulaunch.bind_ray_train_worker()`` first (its own core, every
  thread pinned, torch's threads = its cores);
- default: Ray's default: OMP_NUM_THREADS = the worker's CPUs (1), nothing pinned.

Rounds are interleaved (bound, default, default, bound, ...: the order alternates) so that
drifting background load hits both. Before each run the machine is sampled for a second
and measured during the run (scripts/benchkit.py: the foreign load, CPU time that went to
anyone but us; the Ray workers' own CPU time, which each reports, is not foreign); a run
on a busy machine is flagged and left out of the ratio when quiet rounds exist. On a
shared machine one foreign busy thread can slow a run many times over: quote figures only
from rounds without warnings.

    python scripts/bench_ray.py             # 5 rounds of 2 workers x 1500 steps
    python scripts/bench_ray.py --quick     # 1 round, few steps: a smoke run
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

import benchkit

REPO = benchkit.REPO


def run_once(args, bind: bool) -> dict:
    """One examples/ray_train.py run -> {"samples_per_s", "workers", "busy", "load"}."""
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        out = Path(tmp, "workers.json")
        argv = [sys.executable, str(REPO / "examples" / "ray_train.py"), "--workers", str(args.workers),
                "--steps", str(args.steps), "--warmup", "20", "--batch", str(args.batch), "--width",
                str(args.width), "--json", str(out)] + ([] if bind else ["--no-bind"])
        pre = benchkit.sample(1.0, top=4)
        window = benchkit.LoadWindow()
        code, stdout, stderr, stopped = benchkit.run_bounded(argv, {**benchkit.child_env(), "RAY_AUTH_MODE": "disabled"},
                                                             timeout=args.timeout)
        during = window.load()
        if code != 0 or stopped:
            raise RuntimeError(f"{' '.join(argv)} exited {code}:\n{stderr[-2000:]}")
        workers = json.loads(out.read_text())
    # Ray's workers are not children this script waits for (the raylet starts them, and they
    # may end as orphans), so the window counts their CPU time as foreign: take it back out.
    # Ray's own GCS and raylet stay counted (a few percent of one CPU).
    ours = sum(w.get("process_cpu_seconds", 0.0) for w in workers)
    during = dataclasses.replace(during, others=max(0.0, during.others - ours / during.seconds))
    slowest = max(w["seconds"] for w in workers)
    busy = benchkit.busy((pre, during), args.busy_threshold)
    return {"samples_per_s": args.workers * args.batch * args.steps / slowest, "workers": workers, "busy": busy,
            "others_pct_before": pre.foreign_pct, "others_pct_during": during.foreign_pct,
            "busiest": pre.busiest}


def main(argv=None) -> int:
    benchkit.exit_on_sigterm()
    p = benchkit.parser(__doc__, "1 round of 200 steps: a smoke run; the figures mean little")
    p.add_argument("--rounds", type=int, default=None, help="default 5 (1 with --quick)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per worker (default 1500; 200 --quick)")
    p.add_argument("--workers", type=int, default=None, help="default: the CPUs this process may use")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--busy-threshold", type=float, default=10.0,
                   help="percent of the machine others may use before a run counts as busy")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", help="write every run's figures to this file")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 5)
    args.steps = args.steps or (200 if args.quick else 1500)
    args.workers = args.workers or len(os.sched_getaffinity(0))
    try:
        import ray  # noqa: F401
    except ImportError:
        print("error: ray is not installed: pip install 'ray[train]'", file=sys.stderr)
        return 2
    print(f"bench_ray: {args.workers} Ray Train workers x 1 CPU, MLP width {args.width}, batch {args.batch}, "
          f"{args.steps} timed steps, {args.rounds} round(s); CPUs {sorted(os.sched_getaffinity(0))}")
    if args.quick:
        print("  --quick: a smoke run; the figures mean little")
    runs = {"bound": [], "default": []}
    for rnd in range(1, args.rounds + 1):
        order = ("bound", "default") if rnd % 2 else ("default", "bound")
        for name in order:
            row = run_once(args, name == "bound")
            runs[name].append(row)
            cpus = " ".join(",".join(w["thread_cpus"]) for w in row["workers"])
            print(f"  round {rnd} {name:8s} {row['samples_per_s']:9.1f} samples/s  threads' CPUs {cpus}  "
                  f"others {row['others_pct_before']:.0f}%/{row['others_pct_during']:.0f}%"
                  f"{'  (busy)' if row['busy'] else ''}", flush=True)
            if row["busy"]:
                print(benchkit.busy_warning(f"in round {rnd} ({name})",
                                            f"others used {row['others_pct_during']:.0f}% during the run",
                                            row["busiest"]), flush=True)
    pairs = list(zip(runs["bound"], runs["default"]))
    calm = [(b, d) for b, d in pairs if not (b["busy"] or d["busy"])]
    ratios = [b["samples_per_s"] / d["samples_per_s"] for b, d in (calm or pairs)]
    med = {name: benchkit.median([r["samples_per_s"] for r in rows if not r["busy"]]
                                 or [r["samples_per_s"] for r in rows]) for name, rows in runs.items()}
    print(f"bound    {med['bound']:9.1f} samples/s (median)\ndefault  {med['default']:9.1f} samples/s (median)")
    print(f"ratio bound/default: median {benchkit.median(ratios):.3f} over {len(ratios)} "
          f"{'quiet ' if calm else ''}round(s), each {', '.join(f'{r:.3f}' for r in ratios)}")
    busy = sum(r["busy"] for rows in runs.values() for r in rows)
    if busy:
        print(f"{busy} of {2 * args.rounds} runs were on a busy machine: do not quote them", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs, "ratios": ratios,
                                               "median": med}, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
