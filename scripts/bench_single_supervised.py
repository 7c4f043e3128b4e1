"""Benchmark (not a test): what supervising a single instance would cost at start-up (issue 38
item 6), the figure behind keeping it exec'd.

A single instance is exec'd in cpulaunch's place: the program is then the process (its signals,
exit code and daemons are its own, as without cpulaunch) and cpulaunch adds nothing after the
exec. Supervising it (staying as its parent, a child subreaper that stops its daemons at the
end, its failure record read) is what ``--log-dir`` does today. This script times, interleaved
round-robin so that drifting load hits all alike:

- ``python -c pass``: the interpreter's own start-up, the floor;
- ``cpulaunch --no-python python -c pass``: the exec path;
- ``cpulaunch --log-dir DIR --no-python python -c pass``: the same instance supervised (relays,
  watchdog, subreaper, failure pipe, result.json);
- ``cpulaunch --ninstances 2 --no-python python -c pass``: two supervised instances, for scale.

Output: median, min and max of each over ``--repeats`` runs and the differences of medians to
the exec path, with the machine's foreign load before each round (benchkit.py); a busy round is
flagged, its figures are not to be quoted.

    python scripts/bench_single_supervised.py             # 20 repeats
    python scripts/bench_single_supervised.py --quick     # 5 repeats, a smoke run
"""

from __future__ import annotations

import sys
import tempfile

import benchkit


def main(argv=None) -> int:
    p = benchkit.parser(__doc__, "5 repeats: checks the script")
    p.add_argument("--repeats", type=int, default=None, help="runs of each command (default 20)")
    p.add_argument("--busy-threshold", type=float, default=10.0,
                   help="flag rounds whose foreign load exceeded this percent of the machine (default 10)")
    args = p.parse_args(argv)
    repeats = args.repeats or (5 if args.quick else 20)
    env = benchkit.child_env()
    py = sys.executable
    with tempfile.TemporaryDirectory() as logs:
        cmds = {
            "python -c pass": [py, "-c", "pass"],
            "exec'd (default)": [py, "-m", "cpulaunch", "--allocator", "default", "--no-python", py, "-c", "pass"],
            "supervised (--log-dir)": [py, "-m", "cpulaunch", "--allocator", "default", "--log-dir", logs,
                                       "--no-python", py, "-c", "pass"],
            "2 instances supervised": [py, "-m", "cpulaunch", "--allocator", "default", "--ninstances", "2",
                                       "--no-python", py, "-c", "pass"],
        }
        times = {k: [] for k in cmds}
        busy_rounds = 0
        for r in range(repeats):
            load = benchkit.wait_quiet(args.busy_threshold, 0)
            if benchkit.busy([load], args.busy_threshold):
                busy_rounds += 1
                print(benchkit.busy_warning(f"before round {r + 1}", f"others used {load.foreign_pct:.0f}%"))
            names = list(cmds)
            names = names[r % len(names):] + names[:r % len(names)]
            for name in names:
                times[name].append(benchkit.time_once(cmds[name], env))
    base = benchkit.median(times["exec'd (default)"])
    print(f"{'command':28} {'median ms':>10} {'min':>8} {'max':>8} {'vs exec':>9}")
    for name, xs in times.items():
        med = benchkit.median(xs)
        print(f"{name:28} {med * 1000:10.1f} {min(xs) * 1000:8.1f} {max(xs) * 1000:8.1f} {(med - base) * 1000:+9.1f}")
    if busy_rounds:
        print(f"{busy_rounds} of {repeats} rounds began on a busy machine: do not quote these figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
