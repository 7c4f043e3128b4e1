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

Options mode (``--options``): the DDP optimizations of cpulaunch.ddp_wrap, each measured with
N gloo ranks x 1 core (torchrun's engine, each rank pinned to its own CPU, OMP_NUM_THREADS=1)
against plain DDP (torch's defaults: no bucket view, no static graph, no hook) on the same
seeds and data. Each row changes one thing from plain (see ``OPTIONS``). Rounds are
interleaved: every round runs every option once, the order rotated by one each round. Per
option: the job's samples/s (global batch x timed steps / the slowest rank's compute
seconds), its ratio to plain's in the same round, the final loss and its difference from
plain's, and the bytes each rank hands to all-reduce per step (analytic, from the hook's
rules: cpulaunch.ddp_wrap.gradient_payload_bytes), mean over the run and in the last step.
The machine is sampled before each run and measured during it (benchkit); runs on a busy
machine are flagged and left out of the medians when quiet ones exist.

The ``sync-bn`` row (cnn only; left out with ``--model bert``) is plain DDP with
``--sync-bn``: every BatchNorm layer synchronized over the ranks
(cpulaunch.distributed.convert_sync_batchnorm: one all_gather in its forward, one all_reduce
in its backward, both blocking), against plain's per-rank BatchNorm; its ratio is the cost
per step of synchronizing BatchNorm, and its loss differs from plain's because the
statistics do (it is the single-process loss on the global batch). Its bytes/step counts
the gradients only, not the BatchNorm collectives ((2C + 1) float64 plus 2C float32 values
per layer per step, C its channels).

    python scripts/bench_ddp.py --options                  # cnn full, 3 rounds, 10 steps
    python scripts/bench_ddp.py --options --quick          # small cnn, 1 round, 3 steps
    python scripts/bench_ddp.py --options --only plain,fp16,powersgd --model bert
    python scripts/bench_ddp.py --options --only sync-bn   # sync BN vs per-rank BN
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


#: Options mode: name -> train_ddp.py arguments. Each changes one thing from "plain" (torch's
#: DDP defaults). PowerSGD starts compressing at step 2 and post-local SGD goes local at step 2
#: (both need 2 plain steps first), so short runs measure mostly the compressed/local phase.
PLAIN = ["--no-bucket-view", "--no-static-graph"]
OPTIONS: dict[str, list[str]] = {
    "plain": PLAIN,
    "bucket-view": ["--bucket-view", "--no-static-graph"],
    "static-graph": ["--no-bucket-view", "--static-graph"],
    "fp16": PLAIN + ["--comm-hook", "fp16"],
    "bf16": PLAIN + ["--comm-hook", "bf16"],
    "powersgd": PLAIN + ["--comm-hook", "powersgd", "--start-powersgd-iter", "2"],
    "powersgd+fp16": PLAIN + ["--comm-hook", "powersgd+fp16", "--start-powersgd-iter", "2"],
    "post-local-sgd": PLAIN + ["--comm-hook", "post-local-sgd", "--local-sgd-warmup", "2",
                               "--local-sgd-period", "4"],
    "bf16-autocast": PLAIN + ["--bf16"],
    # cnn only: synchronized BatchNorm vs plain's per-rank BatchNorm (see the docstring).
    "sync-bn": PLAIN + ["--sync-bn"],
}
#: Options that need a model with BatchNorm (--model cnn).
CNN_ONLY = ("sync-bn",)


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
    p.add_argument("--options", action="store_true",
                   help="options mode: each DDP optimization vs plain DDP (see above)")
    p.add_argument("--only", default=None,
                   help="options mode: comma-separated subset of " + ",".join(OPTIONS)
                        + " (plain is always run)")
    args = p.parse_args(argv)
    args.size = args.size or ("small" if args.quick else "full")
    args.global_batch_size = args.global_batch_size or 16
    if args.options:
        args.steps = args.steps or (3 if args.quick else 10)
        args.rounds = args.rounds or (1 if args.quick else 3)
    args.steps = args.steps or (4 if args.quick else 10)
    args.rounds = args.rounds or (2 if args.quick else 5)
    names = list(OPTIONS)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in OPTIONS]
        if unknown:
            p.error(f"--only: unknown option(s) {', '.join(unknown)}; choose from "
                    f"{', '.join(OPTIONS)}")
        names = ["plain"] + [n for n in wanted if n != "plain"]
        if args.model != "cnn" and set(wanted) & set(CNN_ONLY):
            p.error(f"--only {','.join(n for n in wanted if n in CNN_ONLY)}: needs --model "
                    f"cnn ({args.model} has no BatchNorm)")
    elif args.model != "cnn":
        names = [n for n in names if n not in CNN_ONLY]
    args.option_names = names
    if args.options and args.steps < 3:
        p.error("--options needs --steps >= 3 (2 plain steps before PowerSGD / local SGD, "
                "then at least one that uses them)")
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


def pinned_ranks_argv(args, extra: list[str]) -> list[str]:
    """torchrun's engine, N ranks, each pinned to its own CPU, running train_ddp.py."""
    n = args.nproc
    cpus = ",".join(str(c) for c in args.cpus[:n])
    prog = [sys.executable, str(SCRIPT), "--model", args.model, "--size", args.size,
            "--steps", str(args.steps), "--global-batch-size", str(args.global_batch_size),
            "--json", *extra]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(n), "--no-python",
            sys.executable, "-c", PIN_AND_EXEC, cpus, *prog]


def run_option(args, name: str) -> dict:
    """One run of option ``name``: rank 0's JSON summary plus a ``busy`` flag."""
    pre = benchkit.sample(1.0, top=5)
    window = benchkit.LoadWindow()
    env = child_env(OMP_NUM_THREADS="1", CPULAUNCH_DIST_BACKEND="gloo")
    argv = pinned_ranks_argv(args, OPTIONS[name])
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600)
    during = window.load()
    if proc.returncode != 0:
        raise RuntimeError(f"option {name}: {argv[:8]}... exited {proc.returncode}:\n"
                           f"{proc.stderr[-4000:]}")
    rows = sorted((json.loads(line) for line in proc.stdout.splitlines()
                   if line.startswith("{")), key=lambda r: r["rank"])
    if [r["rank"] for r in rows] != list(range(args.nproc)):
        raise RuntimeError(f"option {name}: expected {args.nproc} JSON lines, got "
                           f"{len(rows)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    row = dict(rows[0])
    row["busy"] = benchkit.busy([pre, during], args.busy_threshold)
    if row["busy"]:
        print(benchkit.busy_warning(
            f"around option {name}",
            f"others used {pre.others_pct:.0f}% before, {during.others_pct:.0f}% during; "
            f"steal {during.steal_pct:.0f}%", pre.busiest), file=sys.stderr, flush=True)
    return row


def main_options(args) -> int:
    """Options mode: every option, interleaved rounds, compared with plain DDP."""
    names = args.option_names
    n = args.nproc
    print(f"bench_ddp --options: {args.model}/{args.size}, global batch "
          f"{args.global_batch_size}, {args.steps} steps (1 untimed), {args.rounds} round(s), "
          f"{n} gloo ranks x 1 core (torchrun, pinned to cpus {args.cpus[:n]})")
    if args.quick:
        print("  --quick: a smoke run; the figures mean little")
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for rnd in range(args.rounds):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for name in order:
            row = run_option(args, name)
            runs[name].append(row)
            print(f"  round {rnd + 1} {name:15s} {row['job_samples_per_s']:9.2f} samples/s  "
                  f"loss {row['loss']:.6f}  bytes/step {row['comm_bytes_per_step']:.0f}"
                  f"{'  (busy)' if row['busy'] else ''}", flush=True)

    def quiet(rows: list[dict]) -> list[dict]:
        calm = [r for r in rows if not r["busy"]]
        return calm or rows

    def ratios_vs_plain(name: str) -> list[float]:
        """Per-round samples/s ratios to plain; rounds where either run was busy are left
        out unless that leaves none."""
        pairs = list(zip(runs[name], runs["plain"]))
        calm = [(r, p) for r, p in pairs if not (r["busy"] or p["busy"])]
        return [r["job_samples_per_s"] / p["job_samples_per_s"] for r, p in (calm or pairs)]

    table = []
    for name in names:
        rates = [r["job_samples_per_s"] for r in quiet(runs[name])]
        ratios = ratios_vs_plain(name)
        # Same seeds and data every round: the loss is the same in each (deterministic).
        loss = runs[name][-1]["loss"]
        table.append({
            "option": name, "args": OPTIONS[name],
            "samples_per_s_median": benchkit.median(rates),
            "samples_per_s_spread": benchkit.spread(rates),
            "ratio_vs_plain_median": benchkit.median(ratios),
            "final_loss": loss, "loss_minus_plain": loss - runs["plain"][-1]["loss"],
            "comm_bytes_per_step": runs[name][-1]["comm_bytes_per_step"],
            "comm_bytes_last_step": runs[name][-1]["comm_bytes_last_step"],
            "runs": len(runs[name]), "busy_runs": sum(r["busy"] for r in runs[name]),
        })
    print(f"{'option':15s} {'samples/s':>10s} {'spread':>7s} {'vs plain':>9s} "
          f"{'final loss':>11s} {'- plain':>10s} {'bytes/step':>12s} {'last step':>11s}")
    for t in table:
        print(f"{t['option']:15s} {t['samples_per_s_median']:10.2f} "
              f"{t['samples_per_s_spread'] * 100:6.1f}% {t['ratio_vs_plain_median']:9.3f} "
              f"{t['final_loss']:11.6f} {t['loss_minus_plain']:+10.2e} "
              f"{t['comm_bytes_per_step']:12.0f} {t['comm_bytes_last_step']:11d}")
    busy = sum(t["busy_runs"] for t in table)
    if busy:
        print(f"{busy} of {sum(t['runs'] for t in table)} runs were on a busy machine "
              "(left out of the medians where quiet runs exist): do not quote them",
              file=sys.stderr)
    if args.json:
        print(json.dumps({"mode": "options", "model": args.model, "size": args.size,
                          "global_batch_size": args.global_batch_size, "steps": args.steps,
                          "rounds": args.rounds, "nproc": n, "options": table,
                          "busy_runs": busy}))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.options:
        return main_options(args)
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
