"""Benchmark (not a test): N DDP ranks x 1 core against 1 process x N threads, on CPU.

Both variants train examples/train_ddp.py on the same global batches (same model, global
batch and steps); the figure is aggregate samples/s (global batch x timed steps / compute
seconds, synthetic data generation excluded; for the ranks, the slowest rank's figure).
N is the number of CPUs this process may use (2 here).

How the variants run:

- with ``cpulaunch --ddp`` available (``cpulaunch --help`` lists ``--ddp``):
  A = ``cpulaunch --ninstances 1 python train_ddp.py ...`` (one process, N threads) and
  B = ``cpulaunch --ddp --nproc-per-node N python train_ddp.py ...`` (N ranks, 1 core each).
  Both go through cpulaunch so they get the same treatment (binding, allocator, OpenMP
  settings); only the split differs. OMP_NUM_THREADS is removed from the children's
  environment so cpulaunch's per-instance value applies (yours would win otherwise).
- otherwise: A = plain ``python`` with OMP_NUM_THREADS=N; B = torchrun's engine
  (``python -m torch.distributed.run --standalone``) with OMP_NUM_THREADS=1, each rank
  pinned to its own CPU with ``sched_setaffinity`` (what ``taskset -c`` does) before it
  execs Python. The script says which way it ran.

Rounds are interleaved (A B A B ...) so that drifting background load hits both. Before
each round the machine is sampled for one second; if other processes (and the VM's steal
time) used more than ``--busy-threshold`` percent of it, a warning names the load and the
busiest processes (benchkit.py). On a shared machine one foreign busy thread can slow
OpenMP barriers many times over: quote figures only from rounds without warnings.

    python scripts/bench_ddp.py            # cnn (ResNet-50-like) full size, 5 rounds
    python scripts/bench_ddp.py --quick    # small cnn, 2 rounds, a few steps: a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import benchkit

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_ddp.py"

#: Set by a launcher for a rank; removed from the children's environment.
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
             "OMP_NUM_THREADS")

#: Runs as the rank program under torchrun in the fallback: pin to one CPU, then exec.
#: argv: cpus (comma-separated logical CPU ids), then the real program.
PIN_AND_EXEC = (
    "import os, sys\n"
    "cpus = [int(c) for c in sys.argv[1].split(',')]\n"
    "os.sched_setaffinity(0, {cpus[int(os.environ['LOCAL_RANK']) % len(cpus)]})\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = benchkit.parser(__doc__, "small cnn, 2 rounds, 4 steps, global batch 16: checks the script")
    benchkit.add_model_size(p)
    p.add_argument("--global-batch-size", type=int, default=None,
                   help="default 16; a multiple of the number of ranks")
    p.add_argument("--steps", type=int, default=None,
                   help="steps per run, the first one untimed (default 10; 4 with --quick)")
    p.add_argument("--rounds", type=int, default=None,
                   help="A B pairs (default 5; 2 with --quick)")
    p.add_argument("--nproc", type=int, default=None,
                   help="ranks / threads (default: the CPUs this process may use)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast in both variants")
    p.add_argument("--busy-threshold", type=float, default=10.0,
                   help="warn when the CPUs were busier than this percent before a round")
    p.add_argument("--launcher", choices=("auto", "cpulaunch", "torchrun"), default="auto",
                   help="auto: cpulaunch when it has --ddp, else torchrun")
    p.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = p.parse_args(argv)
    args.size = args.size or ("small" if args.quick else "full")
    args.global_batch_size = args.global_batch_size or 16
    args.steps = args.steps or (4 if args.quick else 10)
    args.rounds = args.rounds or (2 if args.quick else 5)
    cpus = sorted(os.sched_getaffinity(0))
    args.cpus = cpus
    args.nproc = args.nproc or len(cpus)
    if args.nproc < 2:
        p.error(f"needs at least 2 CPUs for 2 ranks, but this process may use {cpus}")
    if args.global_batch_size % args.nproc:
        p.error(f"--global-batch-size {args.global_batch_size} is not a multiple of "
                f"{args.nproc} ranks")
    if args.steps < 2:
        p.error("--steps must be at least 2 (the first step is not timed)")
    return args


def cpulaunch_has_ddp() -> str | None:
    """Path of a ``cpulaunch`` whose --help lists --ddp, else None."""
    exe = shutil.which("cpulaunch")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return exe if out.returncode == 0 and "--ddp" in out.stdout else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def commands(args, cpulaunch: str | None) -> dict[str, tuple[list[str], dict[str, str]]]:
    """{"A": (argv, env), "B": (argv, env)} for one round (B gets a fresh port)."""
    prog = [sys.executable, str(SCRIPT), "--model", args.model, "--size", args.size,
            "--steps", str(args.steps), "--global-batch-size", str(args.global_batch_size),
            "--json", *(["--bf16"] if args.bf16 else [])]
    n = args.nproc
    if cpulaunch:
        return {
            "A": ([cpulaunch, "--ninstances", "1", *prog], child_env()),
            "B": ([cpulaunch, "--ddp", "--nproc-per-node", str(n), "--backend", "gloo",
                   "--master-port", str(free_port()), *prog], child_env()),
        }
    cpus = ",".join(str(c) for c in args.cpus[:n])
    return {
        "A": (prog, child_env(OMP_NUM_THREADS=str(n))),
        "B": ([sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(n), "--no-python",
               sys.executable, "-c", PIN_AND_EXEC, cpus, *prog],
              child_env(OMP_NUM_THREADS="1")),
    }


def run_variant(argv: list[str], env: dict[str, str], expect_ranks: int,
                want_threads: int) -> float:
    """Run one variant; return aggregate samples/s (the slowest rank's global figure)."""
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:6]}... exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if len(rows) != expect_ranks:
        raise RuntimeError(f"expected {expect_ranks} JSON line(s), got {len(rows)}:\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    threads = [r["threads"] for r in rows]
    if threads != [want_threads] * expect_ranks:
        print(f"  warning: ran with {threads} thread(s) per process, not {want_threads}",
              file=sys.stderr)
    return min(r["global_samples_per_s"] for r in rows)


def summarize(xs: list[float]) -> str:
    """One line: median, min, max and spread of samples/s ``xs``."""
    return (f"median {benchkit.median(xs):8.2f}  min {min(xs):8.2f}  max {max(xs):8.2f}  "
            f"spread {benchkit.spread(xs) * 100:5.1f}%")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cpulaunch = None if args.launcher == "torchrun" else cpulaunch_has_ddp()
    if args.launcher == "cpulaunch" and not cpulaunch:
        print("error: --launcher cpulaunch, but no cpulaunch with --ddp on PATH",
              file=sys.stderr)
        return 2
    n = args.nproc
    how = (f"through {cpulaunch} (A: --ninstances 1, B: --ddp --nproc-per-node {n})"
           if cpulaunch else
           f"{'--launcher torchrun' if args.launcher == 'torchrun' else 'cpulaunch --ddp not available'}: A plain python with OMP_NUM_THREADS={n}, "
           f"B torchrun --standalone, OMP_NUM_THREADS=1, each rank pinned to one of cpus "
           f"{args.cpus[:n]}")
    print(f"bench_ddp: {args.model}/{args.size}, global batch {args.global_batch_size}, "
          f"{args.steps} steps (1 untimed), {args.rounds} rounds, bf16 {args.bf16}")
    print(f"  A = 1 process x {n} threads; B = {n} ranks x 1 core; {how}")
    if args.quick:
        print("  --quick: a smoke run; the figures mean little")

    results: dict[str, list[float]] = {"A": [], "B": []}
    warnings = 0
    for rnd in range(1, args.rounds + 1):
        for variant in ("A", "B"):
            load = benchkit.sample(1.0, top=5)
            if benchkit.busy([load], args.busy_threshold):
                warnings += 1
                print(benchkit.busy_warning(
                    f"before round {rnd}{variant}",
                    f"others used {load.others_pct:.0f}%, steal {load.steal_pct:.0f}%",
                    load.busiest), file=sys.stderr, flush=True)
            argv, env = commands(args, cpulaunch)[variant]
            rate = (run_variant(argv, env, 1, n) if variant == "A"
                    else run_variant(argv, env, n, 1))
            results[variant].append(rate)
            print(f"  round {rnd} {variant}: {rate:8.2f} samples/s", flush=True)

    ratios = [b / a for a, b in zip(results["A"], results["B"])]
    print(f"A 1x{n} threads  : {summarize(results['A'])}")
    print(f"B {n}x1 ranks    : {summarize(results['B'])}")
    ratio = benchkit.median(results["B"]) / benchkit.median(results["A"])
    print(f"ratio B/A (medians): {ratio:.3f}; per-round ratios: "
          + " ".join(f"{r:.3f}" for r in ratios))
    if warnings:
        print(f"{warnings} of {2 * args.rounds} runs started on a busy machine: do not "
              "quote these figures", file=sys.stderr)
    if args.json:
        print(json.dumps({"model": args.model, "size": args.size, "bf16": args.bf16,
                          "global_batch_size": args.global_batch_size, "steps": args.steps,
                          "nproc": n, "launcher": "cpulaunch" if cpulaunch else "torchrun",
                          "A_samples_per_s": results["A"], "B_samples_per_s": results["B"],
                          "ratio_of_medians": ratio, "busy_warnings": warnings}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
