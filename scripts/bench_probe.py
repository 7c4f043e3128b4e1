"""Benchmark (not a test): cpulaunch on machines of thousands of CPUs (issue 12).

Generates 1,024-, 4,096- and 8,192-CPU sysfs trees (8 sockets, SMT2, Linux's enumeration:
tests/bigtree.py) in a temporary folder (tmpfs when there is one) and times, interleaved
round-robin (every round runs each command once, in a rotated order, so drifting
background load hits all of them equally):

- ``python -c pass``: the interpreter's own start-up, the floor;
- ``python -m cpulaunch --sysroot TREE --dry-run --format json --instances-per-socket true``
  for each tree: probe + plan + render of the whole machine, nothing executed.

Prints each command's median, min, max and spread, its overhead over ``python -c pass``
(difference of medians), the ratio of medians, and the linearity figure: the overhead of
8,192 CPUs divided by that of 1,024 CPUs (issue 12's target: under 8, i.e. no worse than
linear). Also the targets "1,024 CPUs within 50 ms over python -c pass" as PASS/FAIL.
The foreign CPU load is measured before (``benchkit.wait_quiet``) and during each round
(``benchkit.LoadWindow``); figures from busy rounds are flagged and the verdicts marked.

    python scripts/bench_probe.py               # 15 rounds
    python scripts/bench_probe.py --rounds 1    # checks the script works (figures mean nothing)
    python scripts/bench_probe.py --sizes 1024,2048 --keep
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import benchkit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import bigtree  # noqa: E402  (tests/bigtree.py: the tree generator the tests use too)

#: Variables that would change what cpulaunch plans; removed from the children's env.
TARGET_1K_MS = 50.0  # issue 12: probe + plan + render of 1,024 CPUs within 50 ms over pass
TARGET_LINEAR = 8.0  # issue 12: 8,192 CPUs under 8x the 1,024 figure


def parse_args(argv=None):
    p = benchkit.parser(__doc__, "3 rounds: a smoke run")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of every command (default 15; 3 with --quick)")
    p.add_argument("--sizes", default="1024,4096,8192",
                   help="logical CPUs of the trees, comma separated, each a multiple of 16 "
                        "(8 sockets x SMT2); default 1024,4096,8192")
    p.add_argument("--busy-threshold", type=float, default=10.0,
                   help="flag rounds whose foreign load exceeded this percent of the machine "
                        "(default 10)")
    p.add_argument("--max-wait", type=float, default=30.0,
                   help="seconds to wait for a quiet machine before each round (default 30)")
    p.add_argument("--keep", action="store_true", help="keep the generated trees (path printed)")
    p.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (3 if args.quick else 15)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    try:
        args.sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    except ValueError:
        p.error(f"--sizes {args.sizes!r}: expected numbers such as 1024,4096")
    if not args.sizes or any(n <= 0 or n % 16 for n in args.sizes):
        p.error("--sizes: each size must be a positive multiple of 16 (8 sockets x SMT2)")
    return args


def make_trees(base: Path, sizes: list[int]) -> dict[int, Path]:
    """{logical CPUs: root} of 8-socket SMT2 trees, one NUMA node per socket."""
    trees = {}
    for n in sizes:
        start = time.perf_counter()
        trees[n] = bigtree.make_tree(base / f"cpus{n}", sockets=8, nodes_per_socket=1,
                                     cores_per_node=n // 16, threads_per_core=2)
        print(f"  generated {n:5d}-CPU tree in {time.perf_counter() - start:.2f} s: {trees[n]}")
    return trees


def tree_verdicts(over: dict, flag: str = "") -> tuple[dict, float | None]:
    """Print issue 12's verdicts on trees: ``over`` maps logical CPUs to ms over ``python -c
    pass`` (difference of medians). Returns ({verdict: passed}, the largest tree's overhead
    over the smallest's, or None with one tree). Shared with bench_startup.py."""
    verdicts = {}
    if 1024 in over:
        ok = over[1024] <= TARGET_1K_MS
        verdicts["1k_within_50ms"] = ok
        print(f"{'PASS' if ok else 'FAIL'}: 1,024 CPUs take {over[1024]:.1f} ms over "
              f"python -c pass (target {TARGET_1K_MS:.0f} ms){flag}")
    lo, hi = min(over), max(over)
    linear = None
    if hi > lo:
        linear = over[hi] / over[lo] if over[lo] > 0 else float("inf")
        ok = linear < TARGET_LINEAR * (hi / lo) / 8
        verdicts["linear"] = ok
        print(f"{'PASS' if ok else 'FAIL'}: {hi:,} CPUs cost {linear:.2f}x the overhead of "
              f"{lo:,} CPUs ({hi // lo}x the CPUs; target under {TARGET_LINEAR * (hi / lo) / 8:g}x)"
              f"{flag}")
        for n in sorted(over):
            print(f"  {n:5d} CPUs: {over[n]:7.1f} ms over pass, "
                  f"{over[n] / n * 1e3:6.1f} us per CPU")
    return verdicts, linear


def main(argv=None) -> int:
    benchkit.exit_on_sigterm()  # scratch folders are removed on SIGTERM too
    args = parse_args(argv)
    env = benchkit.child_env()
    py = sys.executable
    base = Path(bigtree.scratch_dir("cpulaunch-bench-probe-"))
    print(f"bench_probe: {args.rounds} round(s), interleaved (rotated start); python = {py}")
    if args.rounds < 3:
        print("  fewer than 3 rounds: checks the script, the figures mean little")
    try:
        trees = make_trees(base, args.sizes)
        cmds = [("pass", "python -c pass", [py, "-c", "pass"])]
        for n, root in trees.items():
            cmds.append((n, f"cpulaunch {n} CPUs",
                         [py, "-m", "cpulaunch", "--sysroot", str(root), "--dry-run", "--format",
                          "json", "--instances-per-socket", "true"]))
        # Bytecode as an install has it (PYTHONDONTWRITEBYTECODE=1 would recompile each run).
        subprocess.run([py, "-m", "compileall", "-q", str(ROOT / "cpulaunch")],
                       check=False, stdout=subprocess.DEVNULL)
        for _key, _label, cmd in cmds:  # one untimed run each: page cache, .pyc files
            benchkit.time_once(cmd, env)

        times: dict = {key: [] for key, _, _ in cmds}
        loads = []
        busy_rounds = []
        for r in range(args.rounds):
            pre = benchkit.wait_quiet(args.busy_threshold, args.max_wait, top=3)
            window = benchkit.LoadWindow()
            order = cmds[r % len(cmds):] + cmds[:r % len(cmds)]
            for key, _label, cmd in order:
                times[key].append(benchkit.time_once(cmd, env))
            during = window.load()
            loads.append(during)
            if benchkit.busy((pre, during), args.busy_threshold):
                busy_rounds.append(r + 1)
                print(benchkit.busy_warning(
                    f"in round {r + 1}",
                    f"others used {pre.foreign_pct:.0f}% before and {during.foreign_pct:.0f}% "
                    f"during it", pre.busiest))
    finally:
        if args.keep:
            print(f"  trees kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)

    med = {key: benchkit.median(xs) * 1e3 for key, xs in times.items()}
    floor = med["pass"]
    w = max(len(label) for _, label, _ in cmds)
    print()
    print(f"{'command':<{w}}  {'median':>9}  {'min':>9}  {'max':>9}  {'spread':>7}  "
          f"{'over pass':>10}  {'x pass':>7}")
    for key, label, _ in cmds:
        xs = times[key]
        print(f"{label:<{w}}  {med[key]:7.1f}ms  {min(xs) * 1e3:7.1f}ms  {max(xs) * 1e3:7.1f}ms  "
              f"{benchkit.spread(xs) * 100:6.0f}%  {med[key] - floor:+8.1f}ms  "
              f"{med[key] / floor:6.2f}x")
    print("(over pass: difference of medians to `python -c pass`; x pass: ratio of medians)")
    worst = max(loads, key=lambda ld: ld.foreign_pct)
    print(f"foreign CPU load: worst round {worst.foreign_pct:.1f}% of {worst.ncpu} CPUs "
          f"(steal {worst.steal_pct:.1f}%); busy rounds: {busy_rounds or 'none'}")
    busy = bool(busy_rounds)
    flag = " [busy machine: do not quote]" if busy else ""

    print()
    over = {n: med[n] - floor for n in trees}
    verdicts, linear = tree_verdicts(over, flag)
    if args.json:
        print(json.dumps({
            "rounds": args.rounds, "python": py,
            "commands": {str(k): {"label": lab, "argv": cmd, "median_ms": med[k],
                                  "runs_ms": [t * 1e3 for t in times[k]]} for k, lab, cmd in cmds},
            "over_pass_ms": {str(n): v for n, v in over.items()},
            "linearity": linear, "verdicts": verdicts, "busy_rounds": busy_rounds,
            "worst_foreign_load_pct": worst.foreign_pct,
        }))
    return 0 if verdicts and all(verdicts.values()) and not busy else 1


if __name__ == "__main__":
    sys.exit(main())
