"""Benchmark (not a test): oneCCL (the ``ccl`` backend of oneccl_bindings_for_pytorch) against
gloo, and oneCCL with its own defaults against the settings cpulaunch gives it, in one run.

Two measurements, each interleaved (every round runs every variant once, the order rotated
by one each round, so drifting background load hits all of them):

- all_reduce of one float32 tensor per size (default 4 KB, 64 KB, 1 MB, 16 MB, 64 MB): the
  median time of one call on rank 0 (after two warm-up calls; as many calls as fit in
  ``--budget`` seconds, at most 2,000, the same count on every rank);
- examples/train_ddp.py (cnn, small by default, global batch 8 per rank): the median time of
  one step over ``--steps`` timed steps (default 200) after ``--warmup-steps`` untimed ones
  (default 10), a step counting as long as its slowest rank, with the steps' interquartile
  range; samples/s is the global batch over that median step; and whether the final
  parameters of each ccl variant are bitwise equal to gloo's in the same round
  (``param_sha256``). A step takes 20-40 ms here: ten of them (the old protocol, a mean)
  gave 1.05x-1.55x gloo in four quiet reruns.

Each figure is quoted as the median over the rounds (default 5) with its range over the
rounds in brackets, and each ratio (a variant against gloo, or against oneCCL's defaults) is
taken per round, between two runs that ran one after the other, then quoted the same way:
``2.31x [2.20-2.45]``. A run the load meter flags busy is left out of the tables when any
run was quiet (the tables say how many runs they quote).

Every variant runs under ``cpulaunch --ddp --nproc-per-node N`` (N = the CPUs this process
may use, 1 core per rank), so binding, OpenMP and allocator are the same for all. All but
``ccl:cpulaunch`` are planned as a gloo job and get the backend and their oneCCL variables
through ``env`` after cpulaunch, so each gets exactly the variables listed (none of the
caller's CCL_* or FI_* variables leak in); ``ccl:cpulaunch`` is ``--backend ccl``: the
launcher's own oneCCL settings, whatever they are in this checkout. Variants, ``gloo`` or
``ccl`` with ``:`` and ``+``-joined tokens:

    ccl            oneCCL's defaults: only the run-time paths it cannot work without
                   (CCL_OFI_LIBRARY_PATH and FI_PROVIDER_PATH at impi-rt's libfabric);
                   network provider chosen by libfabric, worker thread pinned by oneCCL to
                   "the last cores of the node", spinning with CCL_YIELD=pause
    ccl:shm        + CCL_ATL_SHM=1: shared memory between the ranks of this host
    ccl:tcp        + FI_PROVIDER=tcp
    ccl:own        + CCL_WORKER_AFFINITY: each rank's worker on its own rank's first CPU
    ccl:yield      + CCL_YIELD=sched_yield (waiting threads give the CPU away)
    ccl:nooffload  + CCL_WORKER_OFFLOAD=0 (the rank's thread runs the collective itself)
    ccl:launcher   own + yield (LAUNCHER below): by hand, what cpulaunch sets for its worker
                   when no core can be set aside (to take its settings apart)
    ccl:cpulaunch  cpulaunch's own oneCCL environment (``--backend ccl``; nothing added):
                   here worker on the rank's own CPU, sched_yield and shm

Default variants: gloo, ccl, ccl:shm, ccl:cpulaunch (all_reduce); gloo, ccl, ccl:cpulaunch
(train_ddp.py). Ratios are printed against gloo and against oneCCL's defaults.

What 2 cores can show: the cost of oneCCL's default worker when it has no core of its own
(it spins beside a rank), what a non-spinning worker on the rank's own CPU gives back, and
shared memory against the network path between 2 ranks of one host. What they cannot show:
the gain of worker cores set aside per rank (CCL_WORKER_COUNT on reserved cores needs
spare cores), more than one worker, more than 2 ranks, NUMA or multi-socket placement, or a
real network (the "network" here is loopback). The machine is shared: the foreign load is
measured before and during every run and busy runs are flagged (benchkit.py).

The script skips with one line (exit 0) when ``cpulaunch --backend ccl`` would refuse to
run: the bindings missing or not importing with this Python's torch (checked in a child
process: a binding built for another torch can abort the interpreter), or libfabric and its
providers not found.

    python scripts/bench_ccl.py                  # 5 rounds, all sizes, 200 timed train steps
    python scripts/bench_ccl.py --quick          # 1 round, 2 sizes, 4 steps: a smoke run
    python scripts/bench_ccl.py --variants gloo,ccl,ccl:yield,ccl:nooffload --no-train
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import benchkit

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "examples" / "train_ddp.py"
#: The line the allreduce rank program prints its figures on (rank 0 only).
MARK = "BENCH_CCL "
#: Tokens of a ccl variant -> the oneCCL/libfabric variables they add ("own" is computed).
TOKENS = {
    "shm": {"CCL_ATL_SHM": "1"},
    "tcp": {"FI_PROVIDER": "tcp"},
    "yield": {"CCL_YIELD": "sched_yield"},
    "nooffload": {"CCL_WORKER_OFFLOAD": "0"},
    "own": {},
    "cpulaunch": {},
}
#: What cpulaunch sets for a rank whose worker cannot have a core of its own.
LAUNCHER = ("own", "yield")
DEFAULT_VARIANTS = "gloo,ccl,ccl:shm,ccl:cpulaunch"
DEFAULT_TRAIN_VARIANTS = "gloo,ccl,ccl:cpulaunch"
SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)
#: The protocol (what a run without options measures) and --quick's smoke run. Train steps
#: of cnn small at global batch 16 take 20-40 ms here: 10 timed steps gave 1.05x-1.55x gloo
#: in four reruns, so the figure is the median of 200 timed steps after 10 untimed ones.
DEFAULTS = {"rounds": 5, "sizes": SIZES, "budget": 1.0, "steps": 200, "warmup_steps": 10,
            "size": "small"}
QUICK = {"rounds": 1, "sizes": (4 << 10, 1 << 20), "budget": 0.2, "steps": 4, "warmup_steps": 1,
         "size": "small"}
#: Seconds a job may take before it is stopped (SIGTERM to cpulaunch, which stops its ranks).
JOB_TIMEOUT = 600.0


def _both(key: str, show=str) -> str:
    """``"default 5; 1 with --quick"`` for one protocol setting."""
    return f"default {show(DEFAULTS[key])}; {show(QUICK[key])} with --quick"


def _sizes(sizes) -> str:
    return ",".join(map(str, sizes)) + f" ({', '.join(map(human, sizes))})"


def parse_args(argv=None):
    p = benchkit.parser(__doc__, f"{QUICK['rounds']} round, sizes {_sizes(QUICK['sizes'])}, "
                                 f"{QUICK['steps']} timed train steps: checks the script")
    p.add_argument("--variants", default=DEFAULT_VARIANTS,
                   help=f"comma-separated all_reduce variants (default {DEFAULT_VARIANTS})")
    p.add_argument("--rounds", type=int, default=None,
                   help=f"interleaved rounds: every variant runs once a round ({_both('rounds')})")
    p.add_argument("--sizes", default=None,
                   help=f"all_reduce sizes in bytes, comma-separated ({_both('sizes', _sizes)})")
    p.add_argument("--budget", type=float, default=None,
                   help=f"seconds of timed all_reduce calls per size and run ({_both('budget')})")
    p.add_argument("--no-train", action="store_true", help="skip the train_ddp.py part")
    p.add_argument("--train-variants", default=DEFAULT_TRAIN_VARIANTS,
                   help=f"variants of the train_ddp.py part (default {DEFAULT_TRAIN_VARIANTS})")
    benchkit.add_model_size(p, DEFAULTS["size"], QUICK["size"])
    p.add_argument("--steps", type=int, default=None,
                   help=f"timed train steps per run, after the untimed ones ({_both('steps')})")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help=f"untimed train steps first ({_both('warmup_steps')})")
    p.add_argument("--busy-threshold", type=float, default=10.0,
                   help="flag runs when others used more than this percent of the machine "
                        "(default 10.0); flagged runs are left out of the tables when any run "
                        "was quiet")
    p.add_argument("--json", action="store_true", help="also print all figures as one JSON line")
    p.add_argument("--rank", action="store_true", help="(internal) run as one all_reduce rank")
    args = p.parse_args(argv)
    protocol = QUICK if args.quick else DEFAULTS
    for key in ("rounds", "budget", "steps", "warmup_steps", "size"):
        if getattr(args, key) is None:
            setattr(args, key, protocol[key])
    try:
        args.sizes = ([int(s) for s in args.sizes.split(",")] if args.sizes
                      else list(protocol["sizes"]))
    except ValueError:
        p.error(f"--sizes takes byte counts separated by commas (like 4096,1048576), "
                f"got {args.sizes!r}")
    for key in ("rounds", "steps"):
        if getattr(args, key) < 1:
            p.error(f"--{key} must be at least 1, got {getattr(args, key)}")
    if args.warmup_steps < 0 or args.budget <= 0:
        p.error("--warmup-steps must be at least 0 and --budget above 0")
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.train_variants = [v.strip() for v in args.train_variants.split(",") if v.strip()]
    for v in args.variants + args.train_variants:
        tokens(v, p.error)
    args.nproc = len(os.sched_getaffinity(0))
    if not args.rank and args.nproc < 2:
        p.error(f"needs at least 2 CPUs for 2 ranks, but this process may use "
                f"{sorted(os.sched_getaffinity(0))}")
    return args


def tokens(variant: str, error=None) -> list:
    """``"ccl:launcher+shm"`` -> ``["own", "yield", "shm"]``; ``"gloo"``/``"ccl"`` -> ``[]``.
    An unknown variant or token: ``error(message)`` (argparse's), else ValueError."""
    def fail(message: str):
        if error:
            error(message)
        raise ValueError(message)

    backend, _, rest = variant.partition(":")
    if backend not in ("gloo", "ccl") or (backend == "gloo" and rest):
        fail(f"unknown variant {variant!r}: use gloo or ccl[:TOKEN+...]")
    out = []
    for tok in filter(None, rest.split("+")):
        if tok == "launcher":
            out.extend(LAUNCHER)
        elif tok in TOKENS:
            out.append(tok)
        else:
            known = ", ".join([*TOKENS, "launcher"])
            fail(f"unknown token {tok!r} in {variant!r}: choose from {known}")
    return out


# --------------------------------------------------------------------------- the run-time


def ccl_problem(environ) -> str | None:
    """Why the ``ccl`` backend cannot run here, as one line, or None: the launcher's own
    rule (:func:`cpulaunch.distributed.select_backend` for ``--backend ccl``: the bindings
    installed, loading with this torch in a child process (an import that aborts ends only
    the child; the verdict is cached per build), libfabric and its providers found)."""
    from cpulaunch.distributed import DistributedError, select_backend
    from cpulaunch.machine import host, libfinder

    binding = host.ccl_binding(sys.executable, environ, host.cache_dir(environ))
    fabric = libfinder.find_libfabric(environ) if binding.path is not None else None
    try:
        select_backend("ccl", binding, fabric, environ)
    except DistributedError as exc:
        return str(exc)
    return None


def runtime_env(environ) -> dict:
    """The two variables oneCCL cannot start a collective without, as the launcher sets them
    (:func:`cpulaunch.distributed.ccl_runtime_env` of the libfabric it finds); the caller's
    own CCL_OFI_LIBRARY_PATH / FI_PROVIDER_PATH win."""
    from cpulaunch.distributed import ccl_runtime_env
    from cpulaunch.machine import libfinder

    found = ccl_runtime_env(libfinder.find_libfabric(environ))
    return {**found, **{k: environ[k] for k in found if environ.get(k)}}


def rank_cpus(nproc: int) -> list:
    """Each rank's logical CPUs as ``cpulaunch --ddp --dry-run`` plans them (local rank order)."""
    argv = [sys.executable, "-m", "cpulaunch", "--ddp", "--nproc-per-node", str(nproc),
            "--backend", "gloo", "--dry-run", "--format", "json", "true"]
    out = subprocess.run(argv, env=base_env(), capture_output=True, text=True, check=True)
    return [inst["cpus"] for inst in json.loads(out.stdout)["instances"]]


def base_env() -> dict:
    """benchkit's child environment without the caller's CCL_*/FI_*/rank variables."""
    drop = ("CCL_", "FI_", "I_MPI_")
    ranks = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    return {k: v for k, v in benchkit.child_env().items()
            if not k.startswith(drop) and k not in ranks}


def variant_vars(variant: str, runtime: dict, cpus: list) -> dict:
    """The variables a rank of ``variant`` gets after cpulaunch (``env`` argv prefix)."""
    toks = tokens(variant)
    if variant == "gloo" or "cpulaunch" in toks:
        return {}
    out = {"CPULAUNCH_DIST_BACKEND": "ccl", **runtime}
    for tok in toks:
        out.update(TOKENS[tok])
    if "own" in toks:  # one worker per rank, on the rank's own first CPU; all local ranks' list
        out["CCL_WORKER_AFFINITY"] = ",".join(str(c[0]) for c in cpus)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_argv(variant: str, nproc: int, program: list, runtime: dict, cpus: list) -> list:
    """``python -m cpulaunch --ddp ... [env VARS] python PROGRAM`` for one variant."""
    backend = "ccl" if "cpulaunch" in tokens(variant) else "gloo"
    argv = [sys.executable, "-m", "cpulaunch", "--ddp", "--nproc-per-node", str(nproc),
            "--backend", backend, "--master-port", str(free_port()), "--no-prefix", "--no-python"]
    extra = variant_vars(variant, runtime, cpus)
    if extra:
        argv += ["env", *(f"{k}={v}" for k, v in sorted(extra.items()))]
    return argv + [sys.executable, *program]


def run_job(argv: list) -> tuple[int, str, str]:
    """Run one job; (exit code, stdout, stderr). Stopped with SIGTERM after JOB_TIMEOUT
    (cpulaunch forwards it to its ranks and kills them after its grace period)."""
    code, out, err, _ = benchkit.run_bounded(argv, base_env(), JOB_TIMEOUT)
    return code, out, err


# --------------------------------------------------------------------------- rank program


def rank_main(sizes: list, budget: float) -> int:
    """One all_reduce rank: for each size, the per-call times on this rank; rank 0 prints
    ``MARK`` + JSON. A final all_reduce checks the sum; exit 1 when it is wrong."""
    import time

    import torch
    import torch.distributed as dist

    from cpulaunch.distributed import init_process_group

    backend = init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    times = {}
    for size in sizes:
        x = torch.zeros(max(1, size // 4))
        t = time.perf_counter()
        for _ in range(2):
            dist.all_reduce(x)
        per = max((time.perf_counter() - t) / 2, 1e-6)
        n = torch.tensor([float(max(3, min(2000, int(budget / per))))])
        dist.all_reduce(n, op=dist.ReduceOp.MAX)  # every rank makes the same number of calls
        times[size] = []
        for _ in range(int(n.item())):
            t = time.perf_counter()
            dist.all_reduce(x)
            times[size].append(time.perf_counter() - t)
    check = torch.full((8,), float(rank + 1))
    dist.all_reduce(check)
    ok = bool((check == world * (world + 1) / 2).all())
    if rank == 0:
        med = {str(s): benchkit.median(v) for s, v in times.items()}
        calls = {str(s): len(v) for s, v in times.items()}
        figures = {"backend": backend, "median_s": med, "calls": calls, "sum_ok": ok}
        print(MARK + json.dumps(figures), flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


# --------------------------------------------------------------------------- the rounds


def measure(argv: list) -> dict:
    """One job with the foreign load before (0.5 s) and during it."""
    pre = benchkit.sample(0.5, top=3)
    window = benchkit.LoadWindow()
    code, out, err = run_job(argv)
    return {"exit": code, "out": out, "err": err, "pre": pre, "during": window.load()}


def allreduce_figures(run: dict) -> dict | None:
    """{size: median seconds} from rank 0's MARK line, or None."""
    for line in run["out"].splitlines():
        if line.startswith(MARK):
            data = json.loads(line[len(MARK):])
            return {int(s): t for s, t in data["median_s"].items()} if data["sum_ok"] else None
    return None


def train_figures(run: dict) -> dict | None:
    """The job's per-step figures from train_ddp.py's per-rank JSON lines, or None: each
    timed step's seconds is the slowest rank's (the ranks meet in every step's all_reduce);
    ``step_s`` is their median, ``step_q1_s``/``step_q3_s`` their quartiles,
    ``samples_per_s`` the global batch over the median step, ``param_sha256`` the final
    parameters' (None when the ranks disagree)."""
    ranks = {}
    for line in run["out"].splitlines():
        if line.startswith("{") and '"rank"' in line:
            rec = json.loads(line)
            ranks[rec["rank"]] = rec
    if 0 not in ranks or any(not r.get("timed_step_s") for r in ranks.values()):
        return None
    steps = [max(per_rank) for per_rank in zip(*(r["timed_step_s"] for r in ranks.values()))]
    q1, med, q3 = quartiles(steps)
    shas = {r["param_sha256"] for r in ranks.values()}
    return {"step_s": med, "step_q1_s": q1, "step_q3_s": q3, "steps": len(steps),
            "samples_per_s": ranks[0]["global_batch_size"] / med,
            "param_sha256": shas.pop() if len(shas) == 1 else None}


def quartiles(xs: list) -> tuple:
    """(first quartile, median, third quartile) of ``xs`` (one value: that value thrice)."""
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def last_error(run: dict) -> str:
    """The most telling stderr line of a failed job."""
    lines = [ln.strip() for ln in run["err"].splitlines() if ln.strip()]
    for key in ("terminate called", "CCL_ERROR", "Error", "error"):
        hits = [ln for ln in lines if key in ln]
        if hits:
            return hits[-1][:200]
    return lines[-1][:200] if lines else f"exit {run['exit']}"


def rounds(args, variants: list, program, parse, runtime: dict, cpus: list) -> dict:
    """{variant: [run, ...]}: every round runs every variant once, order rotated per round.
    ``program(variant)`` is the rank program's argv, ``parse(run)`` its figures or None."""
    runs = {v: [] for v in variants}
    for r in range(args.rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            run = measure(job_argv(v, args.nproc, program(v), runtime, cpus))
            run["figures"] = parse(run)
            run["busy"] = benchkit.busy((run["pre"], run["during"]), args.busy_threshold)
            runs[v].append(run)
            state = "ok" if run["exit"] == 0 else f"exit {run['exit']}"
            if run["figures"] is None:
                state += ": " + last_error(run)
            print(f"  round {r + 1} {v}: {state}; others {run['during'].foreign_pct:.0f}% of the "
                  f"machine during, {run['pre'].foreign_pct:.0f}% before", flush=True)
            if run["busy"]:
                print(benchkit.busy_warning(f"in round {r + 1} ({v})",
                                            f"others used {run['during'].foreign_pct:.0f}%",
                                            run["pre"].busiest), flush=True)
    return runs


def quoted(runs: dict) -> tuple[dict, bool]:
    """({variant: [run, or None, per round]}, quiet): the runs whose figures the tables
    quote. A run without figures is None; when any run was quiet (not flagged busy), a busy
    run is None too, so only quiet rounds are quoted; when none was, every run with figures
    is kept and ``quiet`` is False (the tables then say so)."""
    good = {v: [r if r["figures"] is not None else None for r in rs] for v, rs in runs.items()}
    quiet = any(r is not None and not r["busy"] for rs in good.values() for r in rs)
    if quiet:
        good = {v: [r if r is not None and not r["busy"] else None for r in rs]
                for v, rs in good.items()}
    return good, quiet


# --------------------------------------------------------------------------- the report


def human(size: int) -> str:
    return f"{size >> 20} MB" if size >= 1 << 20 else f"{size >> 10} KB"


def cell(xs: list, scale: float, fmt: str) -> str:
    """``"12.3 [11.9-13.0]"``: the median of the values of ``xs`` that are not None, times
    ``scale``, and their range over the rounds; ``"-"`` for none."""
    xs = [x * scale for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{benchkit.median(xs):{fmt}} [{min(xs):{fmt}}-{max(xs):{fmt}}]"


def print_table(title: str, head: list, rows: list) -> None:
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    print(title)
    for row in [head, *rows]:
        print("  " + "  ".join(str(c).rjust(w) for c, w in zip(row, widths)))


def ratios(num: list, den: list) -> list:
    """Per round, ``num[r] / den[r]`` where both rounds have a figure (the two runs of a
    ratio ran one after the other, under the same background)."""
    return [a / b for a, b in zip(num, den) if a is not None and b is not None and b > 0]


def xcell(xs: list) -> str:
    """``"2.31x [2.20-2.45]"``: a ratio's median over rounds and its range; ``"-"`` for none."""
    return f"{benchkit.median(xs):.2f}x [{min(xs):.2f}-{max(xs):.2f}]" if xs else "-"


def which_runs(runs: dict) -> str:
    """Which runs a table quotes, in words (see :func:`quoted`)."""
    good, quiet = quoted(runs)
    n = sum(len(rs) for rs in runs.values())
    kept = sum(r is not None for rs in good.values() for r in rs)
    if quiet:
        return f"{kept} of {n} runs: the quiet ones"
    return f"{kept} of {n} runs, NONE QUIET: not to be quoted"


def report_allreduce(runs: dict, sizes: list) -> dict:
    """Tables of all_reduce times and per-round ratios. Returns {"time_s": {variant: {size:
    [median seconds per round, or None]}}, "speedup_vs_gloo": {variant: {size: [per round]}}}."""
    good, _ = quoted(runs)
    times = {v: {s: [r["figures"][s] if r is not None else None for r in rs] for s in sizes}
             for v, rs in good.items()}
    variants = list(runs)
    rounds_n = max(len(rs) for rs in runs.values())
    print_table(f"all_reduce: median ms of one call on rank 0, median over {rounds_n} rounds "
                f"[range over rounds] ({which_runs(runs)})",
                ["size", *variants],
                [[human(s), *(cell(times[v][s], 1e3, ".3f") for v in variants)] for s in sizes])
    ccls = [v for v in variants if v != "gloo"]
    speedup = {}
    if "gloo" in runs and ccls:
        speedup = {v: {s: ratios(times["gloo"][s], times[v][s]) for s in sizes} for v in ccls}
        print_table("speed-up over gloo in the same round (gloo's time / the variant's; above "
                    "1: faster than gloo), median [range] over rounds",
                    ["size", *ccls],
                    [[human(s), *(xcell(speedup[v][s]) for v in ccls)] for s in sizes])
    tuned = [v for v in ccls if v not in ("ccl", "ccl:shm")]
    if tuned and "ccl" in runs:
        base = {v: "ccl:shm" if "shm" in tokens(v) and "ccl:shm" in runs else "ccl" for v in tuned}
        print_table("speed-up over oneCCL's defaults (same transport, same round), median [range]",
                    ["size", *(f"{v} vs {base[v]}" for v in tuned)],
                    [[human(s), *(xcell(ratios(times[base[v]][s], times[v][s])) for v in tuned)]
                     for s in sizes])
    return {"time_s": times, "speedup_vs_gloo": speedup}


def report_train(runs: dict, global_batch: int) -> dict:
    """The train_ddp.py table: per run the median step of its timed steps; over rounds their
    median and range, the steps' interquartile range, and speed-ups per round. Returns
    {"step_s", "samples_per_s", "speedup_vs_gloo": {variant: [per round]}}."""
    good, _ = quoted(runs)
    step = {v: [r["figures"]["step_s"] if r is not None else None for r in rs]
            for v, rs in good.items()}
    iqr = {v: [(r["figures"]["step_q1_s"], r["figures"]["step_q3_s"]) for r in rs if r is not None]
           for v, rs in good.items()}
    gloo_sha = {i: r["figures"]["param_sha256"] for i, r in enumerate(runs.get("gloo", []))
                if r["figures"] is not None}
    timed = {r["figures"]["steps"] for rs in runs.values() for r in rs if r["figures"] is not None}
    speedup, rows = {}, []
    for v, rs in runs.items():
        same = [r["figures"]["param_sha256"] == gloo_sha[i] for i, r in enumerate(rs)
                if r["figures"] is not None and i in gloo_sha]
        equal = "-" if v == "gloo" or not same else f"{sum(same)} of {len(same)}"
        q1 = benchkit.median([a for a, _ in iqr[v]]) * 1e3 if iqr[v] else None
        q3 = benchkit.median([b for _, b in iqr[v]]) * 1e3 if iqr[v] else None
        sps = [global_batch / x if x else None for x in step[v]]
        if "gloo" in runs and v != "gloo":
            speedup[v] = ratios(step["gloo"], step[v])
        rows.append([v, cell(step[v], 1e3, ".2f"),
                     f"{q1:.2f}-{q3:.2f}" if q1 is not None else "-", cell(sps, 1.0, ".0f"),
                     xcell(speedup.get(v, [])),
                     xcell(ratios(step["ccl"], step[v])) if "ccl" in runs and v != "ccl" else "-",
                     equal])
    print_table(f"train_ddp.py: ms per step ({'/'.join(map(str, sorted(timed)))} timed steps a run; "
                f"a step: the slowest rank's), median of the runs' median step [range over "
                f"rounds] ({which_runs(runs)})",
                ["variant", "ms/step", "steps' IQR", "samples/s", "vs gloo", "vs oneCCL's defaults",
                 "params bitwise equal to gloo's"], rows)
    print("  (vs: the other's step time / this one's in the same round; above 1x: faster)")
    return {"step_s": step,
            "samples_per_s": {v: [global_batch / x if x else None for x in xs]
                              for v, xs in step.items()},
            "speedup_vs_gloo": speedup}


def report_runs(runs: dict, what: str) -> None:
    """Foreign load per variant, and the jobs that failed or crashed after their figures."""
    for v, rs in runs.items():
        loads = [r["during"].foreign_pct for r in rs]
        busy = sum(r["busy"] for r in rs)
        print(f"  {what} {v}: others used {benchkit.median(loads):.0f}% of the machine "
              f"(median; max {max(loads):.0f}%), {busy} of {len(rs)} runs busy")
        for r in rs:
            if r["exit"] != 0:
                when = "after its figures" if r["figures"] is not None else "without figures"
                print(f"    exit {r['exit']} {when}: {last_error(r)}")


CANNOT = """What {n} cores can and cannot show: each rank has 1 core and oneCCL's worker thread
shares it, so these figures show the cost of oneCCL's default worker without a core of its
own (pinned by oneCCL to the last cores of the node, spinning) and what the launcher's
settings give back; not the gain of worker cores set aside per rank, more than one worker,
more than {n} ranks, NUMA or multi-socket placement, or a real network (loopback only)."""


def versions() -> str:
    """Installed oneCCL/impi-rt wheel versions (their metadata; nothing is imported)."""
    from importlib import metadata

    found = []
    for dist in ("torch", "oneccl-cpu", "impi-rt", "oneccl-bind-pt"):
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            found.append(f"{dist} (no metadata)")
    return ", ".join(found)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rank:
        return rank_main(args.sizes, args.budget)
    problem = ccl_problem(os.environ)
    if problem:
        print(f"bench_ccl: skipped: {problem}")
        return 0
    benchkit.exit_on_sigterm()
    runtime = runtime_env(os.environ)
    cpus = rank_cpus(args.nproc)
    print(f"{versions()}\n{cpu_model()}; {args.nproc} ranks x 1 core (CPUs {cpus}), "
          f"{args.rounds} round(s); runtime "
          f"{' '.join(f'{k}={v}' for k, v in sorted(runtime.items()))}")
    now = benchkit.sample(1.0, top=3)
    print(f"before: others used {now.foreign_pct:.0f}% of the machine; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sizes = ",".join(map(str, args.sizes))
    ar = rounds(args, args.variants,
                lambda v: [__file__, "--rank", "--sizes", sizes, "--budget", str(args.budget)],
                allreduce_figures, runtime, cpus)
    out = {"allreduce": report_allreduce(ar, args.sizes)}
    report_runs(ar, "all_reduce")
    if not args.no_train:
        batch = 8 * args.nproc
        train = [str(TRAIN), "--model", args.model, "--size", args.size,
                 "--steps", str(args.warmup_steps + args.steps),
                 "--warmup-steps", str(args.warmup_steps), "--global-batch-size", str(batch),
                 "--json"]
        tr = rounds(args, args.train_variants, lambda v: train, train_figures, runtime, cpus)
        out["train"] = report_train(tr, batch)
        report_runs(tr, "train_ddp")
    print(CANNOT.format(n=args.nproc))
    print(f"after: load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        print(json.dumps(jsonable(out)))
    return 0


def cpu_model() -> str:
    """The first ``model name`` of /proc/cpuinfo (what the figures were measured on)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU model unknown"


def jsonable(x):
    """``x`` with every dict key a string (the sizes are ints), for json.dumps."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [jsonable(v) for v in x]
    return x

if __name__ == "__main__":
    sys.exit(main())
