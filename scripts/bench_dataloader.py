"""Benchmark (not a test): where DataLoader workers should run on a CPU-only machine (issue 11).

examples/train_ddp.py trains on its CPU-heavy input pipeline (``--data pipeline``: zlib
"decode", random-resized crop + resize, flip, colour jitter, normalisation per sample; about
1.2 ms per sample at ``--size small`` and 3.3 ms at full on one core of the development
machine) three ways. All three go through cpulaunch, so they get the same binding, allocator
and OpenMP settings; only the data loading differs:

- (a) no workers: ``python -m cpulaunch python train_ddp.py --data pipeline --num-workers 0``;
  the main process decodes between steps, OpenMP computes on every core.
- (b) K workers sharing the compute cores: ``python -m cpulaunch python train_ddp.py
  --data pipeline --num-workers K``; OpenMP threads on every core and K workers on the
  same cores (oversubscribed: one foreign busy thread made a 2-thread OpenMP run 20-35x
  slower on the development machine).
- (c) K reserved cores: ``python -m cpulaunch --dataloader-workers K python train_ddp.py
  --data pipeline``; K cores of the instance are taken out of OMP_NUM_THREADS and the
  OpenMP CPUs, and the K workers are pinned there (train_ddp.py reads
  CPULAUNCH_DATALOADER_NUM_WORKERS / _CPUS through cpulaunch.torch_utils.dataloader_kwargs()).

The figure is the job's samples/s **end to end** (train_ddp.py's ``job_samples_per_s``, its
CPULAUNCH_METRIC line: global batch x timed steps / (compute + data-wait seconds)). The
first 1 + 2K steps are untimed in every variant (``--warmup-steps``): the workers' start-up,
and the 2K batches they prefetch meanwhile (DataLoader's prefetch_factor, 2 per worker),
which would otherwise be counted as free in the timed steps. Rounds are interleaved: every round
runs each variant once, in an order rotated by one each round, so drifting background load
hits all three. Before each run the machine is sampled (``benchkit.wait_quiet``) and during
it measured (``benchkit.LoadWindow``, the foreign CPU load: others' CPU time plus steal);
busy runs are flagged and left out of the medians when quiet ones exist. Per variant:
median samples/s, min, max, spread, the ratio to (a) (median of the per-round ratios), the
median share of the timed seconds spent waiting for data, and where the processes really
ran (each worker reports its own affinity).

Too small a machine: (c) takes K whole cores away from compute. When that is more than a
quarter of (a)'s compute cores (on the 2-CPU development machine, K = 1 leaves 1 core of
2), (c) mostly measures the lost compute, not the workers' placement; the script then says
so plainly, still runs the comparison, and also prints the plans cpulaunch would make with
``--dataloader-workers`` on multi-socket fixture dumps (tests/fixtures, unpacked in a
temporary folder), so the reserved cores can be seen where they would matter.

The default model is the small cnn: on 2 cores its compute (about 2.3 ms per sample) and
its pipeline (1.2 ms) are of the same order, as full ResNet-50 training and full-size
decoding are on a many-core socket; the full cnn on 2 cores (about 250 ms per sample of
compute) leaves the data loading under 2% of the time, whatever the variant.

    python scripts/bench_dataloader.py                         # cnn small, 5 rounds, 10 timed steps
    python scripts/bench_dataloader.py --quick                 # a smoke run: figures mean nothing
    python scripts/bench_dataloader.py --workers 2 --size full --rounds 3 --json
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import benchkit

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_ddp.py"
FIXTURES = ROOT / "tests" / "fixtures"
#: Multi-socket dumps whose plans are shown when this machine is too small.
DEFAULT_FIXTURES = "hw-32intel64-2p8co2t+8ve,hw-128arm-2pa2n8cluster4co"
#: Set by a launcher for a rank; removed from the children's environment.
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
#: (c) is a fair comparison when it keeps at least this share of (a)'s compute cores.
MIN_COMPUTE_SHARE = 0.75
VARIANTS = ("a", "b", "c")


def parse_args(argv: list[str] | None = None):
    p = benchkit.parser(__doc__, "a smoke run: 1 round, 2 steps, global batch 8, cnn small, "
                                 "the first fixture only; checks the script, not the machine")
    p.add_argument("--model", choices=("cnn", "bert"), default="cnn",
                   help="examples/models.py model (default cnn)")
    p.add_argument("--size", choices=("full", "small"), default="small",
                   help="default small (why: see above)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds, each running (a), (b), (c) once (default 5; 1 with --quick)")
    p.add_argument("--steps", type=int, default=None,
                   help="steps per run (default: the warm-up steps + 10; 2 with --quick)")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="untimed first steps of every run (default 1 + 2K: start-up and the "
                        "workers' prefetched batches; 1 with --quick)")
    p.add_argument("--global-batch-size", type=int, default=None,
                   help="samples per step (default 32; 8 with --quick)")
    p.add_argument("--workers", type=int, default=None,
                   help="K: DataLoader workers in (b), reserved cores in (c) (default 1 on "
                        "machines of up to 4 usable CPUs, else 2)")
    p.add_argument("--plans", choices=("auto", "always", "never"), default="auto",
                   help="print the fixture dumps' plans: auto = when this machine is too small")
    p.add_argument("--fixtures", default=None,
                   help=f"comma-separated folders of tests/fixtures for the plans (default "
                        f"{DEFAULT_FIXTURES}; the first only with --quick)")
    p.add_argument("--plan-workers", type=int, default=2,
                   help="--dataloader-workers of the fixture plans (default 2)")
    p.add_argument("--busy-threshold", type=float, default=10.0,
                   help="flag runs whose foreign load exceeded this percent of the machine")
    p.add_argument("--max-wait", type=float, default=None,
                   help="seconds to wait for a quiet machine before each run (default 30; "
                        "0 with --quick)")
    p.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 5)
    args.global_batch_size = args.global_batch_size or (8 if args.quick else 32)
    args.max_wait = (0.0 if args.quick else 30.0) if args.max_wait is None else args.max_wait
    if args.workers is None:
        args.workers = 1 if len(os.sched_getaffinity(0)) <= 4 else 2
    if args.warmup_steps is None:
        args.warmup_steps = 1 if args.quick else 1 + 2 * args.workers
    args.steps = args.steps or (2 if args.quick else args.warmup_steps + 10)
    fixtures = args.fixtures or (DEFAULT_FIXTURES.split(",")[0] if args.quick
                                 else DEFAULT_FIXTURES)
    args.fixtures = [f.strip() for f in fixtures.split(",") if f.strip()]
    for name, low in (("rounds", 1), ("global_batch_size", 1), ("workers", 1),
                      ("plan_workers", 1), ("warmup_steps", 0)):
        if getattr(args, name) < low:
            p.error(f"--{name.replace('_', '-')} must be at least {low}")
    if args.steps <= args.warmup_steps:
        p.error(f"--steps {args.steps} leaves no timed step after --warmup-steps "
                f"{args.warmup_steps}; give more steps")
    unknown = [f for f in args.fixtures if not (FIXTURES / f).is_dir()]
    if unknown:
        p.error(f"--fixtures: no folder {', '.join(unknown)} in {FIXTURES}")
    return args


def child_env() -> dict[str, str]:
    """benchkit's clean environment (no OMP_NUM_THREADS, LD_PRELOAD, CPULAUNCH_*; this
    checkout on PYTHONPATH) without a launcher's rank variables."""
    return {k: v for k, v in benchkit.child_env().items() if k not in RANK_VARS}


def cpulaunch(*args: str) -> list[str]:
    return [sys.executable, "-m", "cpulaunch", *args]


def plan(cpulaunch_args: list[str], env: dict[str, str]) -> dict:
    """cpulaunch's dry-run plan (docs/reference/plan-json.md) for ``cpulaunch_args`` + ``true``."""
    proc = subprocess.run(cpulaunch(*cpulaunch_args, "--dry-run", "--format", "json", "true"),
                          env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"error: cpulaunch {' '.join(cpulaunch_args)} cannot plan: "
                         f"{proc.stderr.strip()}")
    return json.loads(proc.stdout)


def commands(args) -> dict[str, tuple[str, list[str]]]:
    """{variant: (label, argv)}."""
    k = args.workers
    prog = [sys.executable, str(SCRIPT), "--model", args.model, "--size", args.size,
            "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps),
            "--global-batch-size", str(args.global_batch_size), "--data", "pipeline", "--json"]
    return {
        "a": ("(a) no workers", cpulaunch(*prog, "--num-workers", "0")),
        "b": (f"(b) {k} worker(s), shared cores", cpulaunch(*prog, "--num-workers", str(k))),
        "c": (f"(c) {k} reserved core(s)", cpulaunch("--dataloader-workers", str(k), *prog)),
    }


def summary_of(stdout: str) -> dict:
    """train_ddp.py's JSON summary in a run's stdout (a line may carry a "[i] " prefix)."""
    for line in stdout.splitlines():
        start = line.find("{")
        if start >= 0:
            try:
                return json.loads(line[start:])
            except ValueError:
                continue
    raise RuntimeError(f"no JSON summary in the output:\n{stdout[-2000:]}")


def run_once(args, variant: str, argv: list[str], env: dict[str, str], where: str) -> dict:
    """One run: train_ddp's summary plus the foreign load around it and a ``busy`` flag."""
    pre = benchkit.wait_quiet(args.busy_threshold, args.max_wait, top=5)
    window = benchkit.LoadWindow()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600)
    during = window.load()
    if proc.returncode != 0:
        raise RuntimeError(f"{where} ({variant}): {' '.join(argv)} exited {proc.returncode}:\n"
                           f"{proc.stderr[-4000:]}")
    row = summary_of(proc.stdout)
    row["foreign_pct"] = during.foreign_pct
    row["busy"] = benchkit.busy([pre, during], args.busy_threshold)
    if row["busy"]:
        print(benchkit.busy_warning(
            f"{where} ({variant})", f"others used {pre.foreign_pct:.0f}% before and "
            f"{during.foreign_pct:.0f}% during it (steal {during.steal_pct:.0f}%)",
            pre.busiest), file=sys.stderr, flush=True)
    return row


def placement(row: dict) -> str:
    """Where a run's processes ran, as they reported it."""
    workers = row["loader_workers"]
    seen = ("main process" if not workers else "; ".join(
        f"worker {w['worker']} on cpus {w['cpus']}" for w in workers))
    return (f"compute on cpus {row['cpus']} x {row['threads']} thread(s); data: {seen}"
            + (f" (pinned to {row['dataloader_cpus']})" if row["dataloader_cpus"] else ""))


def describe_plan(doc: dict) -> list[str]:
    """One line per planned instance: compute CPUs, threads, DataLoader CPUs, memory."""
    lines = []
    for inst in doc["instances"]:
        env = inst["env"]
        loader = env.get("CPULAUNCH_DATALOADER_CPUS")
        threads = env.get("OMP_NUM_THREADS", str(len(inst["cpus"])))
        lines.append(f"    instance {inst['index']}: compute cpus {inst['cpulist']} "
                     f"(OMP_NUM_THREADS={threads})"
                     + (f", DataLoader cpus {loader} ({env['CPULAUNCH_DATALOADER_NUM_WORKERS']} "
                        f"workers)" if loader else "")
                     + f", memory nodes {inst['mem_nodes'] or 'not bound'}")
    return lines


def fixture_plans(args, env: dict[str, str]) -> list[dict]:
    """Print and return the fixture dumps' plans with and without --dataloader-workers."""
    out = []
    k = str(args.plan_workers)
    with tempfile.TemporaryDirectory(prefix="bench-dataloader-") as tmp:
        for name in args.fixtures:
            (tarball,) = (FIXTURES / name).glob("*.tar.bz2")
            dest = Path(tmp) / name
            dest.mkdir()
            subprocess.run([shutil.which("tar") or "tar", "-xjf", str(tarball), "-C", str(dest),
                            "--no-same-owner"], check=True)
            (root,) = list(dest.iterdir())
            shown = f"<{name} unpacked>"
            base = ["--sysroot", str(root), "--instances-per-socket"]
            without = plan(base, env)
            with_k = plan(base + ["--dataloader-workers", k], env)
            print(f"  {name}:")
            print(f"   python -m cpulaunch --sysroot {shown} --instances-per-socket --dry-run true")
            print("\n".join(describe_plan(without)))
            print(f"   python -m cpulaunch --sysroot {shown} --dataloader-workers {k} "
                  f"--instances-per-socket --dry-run true")
            print("\n".join(describe_plan(with_k)))
            out.append({"fixture": name, "dataloader_workers": args.plan_workers,
                        "without": [_instance(i) for i in without["instances"]],
                        "with": [_instance(i) for i in with_k["instances"]]})
    return out


def _instance(inst: dict) -> dict:
    env = inst["env"]
    return {"index": inst["index"], "cpus": inst["cpulist"],
            "omp_num_threads": env.get("OMP_NUM_THREADS"),
            "dataloader_cpus": env.get("CPULAUNCH_DATALOADER_CPUS"),
            "mem_nodes": inst["mem_nodes"]}


def main(argv: list[str] | None = None) -> int:
    benchkit.exit_on_sigterm()  # scratch folders are removed on SIGTERM too
    args = parse_args(argv)
    env = child_env()
    k = args.workers
    # The local plans: what (a)/(b) and (c) compute on.
    shared = plan([], env)["instances"][0]
    reserved = plan(["--dataloader-workers", str(k)], env)["instances"][0]
    n_shared, n_reserved = len(shared["cpus"]), len(reserved["cpus"])
    too_small = n_reserved < MIN_COMPUTE_SHARE * n_shared
    print(f"bench_dataloader: {args.model}/{args.size}, --data pipeline, global batch "
          f"{args.global_batch_size}, {args.steps} steps ({args.warmup_steps} untimed), "
          f"{args.rounds} round(s), K = {k}; samples/s end to end (data waits included)")
    print(f"  (a), (b) compute on cpus {shared['cpulist']} ({n_shared} threads); (c) computes "
          f"on cpus {reserved['cpulist']} ({n_reserved}) and loads on cpus "
          f"{reserved['env'].get('CPULAUNCH_DATALOADER_CPUS')}")
    if args.quick:
        print("  --quick: a smoke run; the figures mean nothing")
    if too_small:
        print(f"  this machine is too small for a meaningful comparison: reserving {k} core(s) "
              f"leaves (c) {n_reserved} of {n_shared} compute cores, so (c) mostly measures "
              f"the lost compute, not where the workers run; the figures below are this "
              f"machine's, not the answer for a many-core socket")

    cmds = commands(args)
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for rnd in range(args.rounds):
        order = VARIANTS[rnd % 3:] + VARIANTS[:rnd % 3]
        for v in order:
            label, argv = cmds[v]
            row = run_once(args, v, argv, env, f"in round {rnd + 1}")
            runs[v].append(row)
            print(f"  round {rnd + 1} {label:32s} {row['job_samples_per_s']:9.2f} samples/s  "
                  f"data wait {row['data_wait_s']:6.3f} s{'  (busy)' if row['busy'] else ''}",
                  flush=True)

    def quiet(rows: list[dict]) -> list[dict]:
        return [r for r in rows if not r["busy"]] or rows

    def ratios(v: str) -> list[float]:
        pairs = list(zip(runs[v], runs["a"]))
        calm = [(r, a) for r, a in pairs if not (r["busy"] or a["busy"])]
        return [r["job_samples_per_s"] / a["job_samples_per_s"] for r, a in (calm or pairs)]

    table = []
    for v in VARIANTS:
        rows = quiet(runs[v])
        rates = [r["job_samples_per_s"] for r in rows]
        waits = [r["data_wait_s"] / (r["data_wait_s"] + r["compute_s"]) for r in rows
                 if r["data_wait_s"] + r["compute_s"] > 0]
        table.append({
            "variant": v, "label": cmds[v][0], "argv": cmds[v][1],
            "samples_per_s_median": benchkit.median(rates), "min": min(rates),
            "max": max(rates), "spread": benchkit.spread(rates),
            "ratio_vs_a_median": benchkit.median(ratios(v)),
            "data_wait_share_median": benchkit.median(waits),
            "runs": len(runs[v]), "busy_runs": sum(r["busy"] for r in runs[v]),
            "samples_per_s": [r["job_samples_per_s"] for r in runs[v]],
            "foreign_pct": [r["foreign_pct"] for r in runs[v]],
            "placement": placement(runs[v][-1]),
            # as the last run's processes reported themselves
            "compute_cpus_seen": runs[v][-1]["cpus"], "threads": runs[v][-1]["threads"],
            "loader_workers": runs[v][-1]["loader_workers"],
        })
    print()
    print(f"{'variant':32s} {'samples/s':>10s} {'min':>9s} {'max':>9s} {'spread':>7s} "
          f"{'vs (a)':>7s} {'data wait':>10s}")
    for t in table:
        print(f"{t['label']:32s} {t['samples_per_s_median']:10.2f} {t['min']:9.2f} "
              f"{t['max']:9.2f} {t['spread'] * 100:6.1f}% {t['ratio_vs_a_median']:7.3f} "
              f"{t['data_wait_share_median'] * 100:9.1f}%")
    print("(median of quiet runs; vs (a): median of per-round ratios; data wait: share of the "
          "timed seconds spent waiting for batches)")
    for t in table:
        print(f"  {t['label']}: {t['placement']}")
    foreign = [f for t in table for f in t["foreign_pct"]]
    busy = sum(t["busy_runs"] for t in table)
    print(f"foreign CPU load during the runs: median {benchkit.median(foreign):.1f}%, worst "
          f"{max(foreign):.1f}% of {os.cpu_count()} CPUs; busy runs: {busy} of {len(foreign)}"
          + (" (do not quote them)" if busy else ""))

    plans = []
    if args.plans == "always" or (args.plans == "auto" and too_small):
        print()
        print(f"Plans cpulaunch would use on larger machines (fixture dumps, --dataloader-workers "
              f"{args.plan_workers}, one instance per socket):")
        plans = fixture_plans(args, env)

    if args.json:
        print(json.dumps({
            "model": args.model, "size": args.size, "steps": args.steps,
            "warmup_steps": args.warmup_steps,
            "global_batch_size": args.global_batch_size, "rounds": args.rounds, "workers": k,
            "compute_cpus": {"shared": shared["cpulist"], "reserved": reserved["cpulist"]},
            "dataloader_cpus": reserved["env"].get("CPULAUNCH_DATALOADER_CPUS"),
            "too_small": too_small, "variants": table, "busy_runs": busy,
            "fixture_plans": plans,
        }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
