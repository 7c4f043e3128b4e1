"""Benchmark (not a test): one inference workload under plain python, torch's run_cpu and
cpulaunch, each in its default and its best modes; and (--matrix) allocator x OpenMP
runtime x OMP_PROC_BIND/OMP_PLACES for one instance, to back cpulaunch's defaults.

The workload is examples/infer.py (eager fp32; default the ResNet-50-like CNN at batch 32)
for a fixed ``--seconds`` (or ``--iterations``) after warm-up. Configurations (see
``--list``; ``--configs`` picks some):

- ``a``  plain ``python examples/infer.py``: torch's defaults (all CPUs of the affinity
  mask, glibc malloc, torch's libgomp).
- ``b``  ``python -m torch.backends.xeon.run_cpu examples/infer.py``, out of the box.
- ``c1``, ``c2``  run_cpu's throughput mode, ``--ninstances N --ncores-per-instance 1
  --enable-tcmalloc``, with its Intel OpenMP (c1) or ``--disable-iomp`` (c2). run_cpu
  looks for unversioned ``lib<name>.so`` in $CONDA_PREFIX/lib, $VIRTUAL_ENV/lib, ~/.local/lib,
  /usr/local/lib(64), /usr/lib(64) only, so on Debian (multiarch, versioned names) and pip's
  intel-openmp (sys.prefix/lib) it finds none of them. For c1/c2 this script makes them
  findable: CONDA_PREFIX points at a temporary folder of symlinks (libtcmalloc.so,
  libjemalloc.so, libiomp5.so) to the files cpulaunch finds, so the comparison is about
  launching, not library search. ``b`` gets no help: that is what a user gets.
- ``d``  ``python -m cpulaunch python examples/infer.py``: cpulaunch's defaults.
- ``e1``, ``e2``  ``cpulaunch --ninstances N``: N instances x 1 core, tcmalloc (auto), with
  torch's GNU OpenMP (e1) or ``--omp-runtime intel`` (e2).

N is the number of CPUs this process may use. Multi-instance figures are AGGREGATE
throughput: the sum of the instances' samples/s, the instances running concurrently.

Rounds are interleaved (a b c1 c2 d e1 e2, a b ...). Before each run the machine is sampled
for ``--quiet-sample`` seconds from /proc/stat, and during the run the CPU time of every
other process is measured (machine busy time minus our own and our children's CPU time,
from getrusage; benchkit.py): when either, with the VM's steal time added, exceeds
``--busy-threshold`` percent of the machine, a warning names the load and the round is
marked busy. A foreign busy thread can make a 2-thread OpenMP run 20x slower here: medians
are taken over the quiet rounds only, unless no round was quiet (then over all, and the
verdicts say so).

Each configuration's figure: median over rounds, spread = (max - min) / median, ratio of
medians to plain python. Then the checks the issue asks for:

- "cpulaunch's best configuration at least 1.4x plain python on the CNN at batch 32";
- "cpulaunch never below run_cpu on the same mode": configurations are paired by what
  the children really got (instances, allocator and OpenMP library mapped into the process,
  read from infer.py's report), plus the pair of the two launchers' defaults (b, d).

PASS/FAIL by the medians, strictly; a difference smaller than the spreads is called out as
not significant.

    python scripts/bench_launch.py                 # full CNN, batch 32, 10 s runs, 5 rounds (~12 min)
    python scripts/bench_launch.py --quick         # small CNN, 2 rounds, short runs: a smoke run
    python scripts/bench_launch.py --matrix        # 17 single-instance configurations, 3 rounds (~15 min)
    python scripts/bench_launch.py --matrix --quick
    python scripts/bench_launch.py --tuned cpulaunch-tune/best.toml   # a, d and t below

``--tuned FILE`` adds ``t``: ``python -m cpulaunch --config FILE python examples/infer.py``,
the configuration ``cpulaunch tune`` saved (issue 10), with as many instances as FILE plans
(asked of ``cpulaunch --config FILE --dry-run --format json``). Without ``--configs`` the
run is then ``a,d,t``, and two more checks are printed: t at least 1.25x plain python, and t
at least as fast as cpulaunch's default (d), the latter judged like tune judges (a
difference within the measured spreads is not a difference).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import benchkit

ROOT = Path(__file__).resolve().parents[1]
INFER = ROOT / "examples" / "infer.py"

#: Variables that change what the launchers or torch do; removed from every child's env
#: so each configuration gets exactly what its launcher (or this script) sets.
CLEAN_VARS = ("OMP_NUM_THREADS", "LD_PRELOAD", "KMP_AFFINITY", "KMP_BLOCKTIME", "KMP_SETTINGS",
              "MALLOC_CONF", "OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "MKL_NUM_THREADS")

#: The tuning guide's jemalloc setting, as run_cpu and cpulaunch's registry use it.
PLACES_ENV = {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}
TARGET_RATIO = 1.4
TUNED_TARGET = 1.25  # issue 10: tune's best at least 1.25x plain python on this 2-CPU machine


@dataclass(frozen=True)
class Config:
    """One way to run the workload.

    launcher: "python", "run_cpu" or "cpulaunch".
    flags: the launcher's own options (before the program).
    env: variables added to the child's cleaned environment.
    ninstances: instances the launcher should start (to check the output).
    libs_shim: point CONDA_PREFIX at symlinks run_cpu can find (run_cpu configs only).
    """

    key: str
    label: str
    launcher: str
    flags: tuple = ()
    env: dict = field(default_factory=dict, hash=False)
    ninstances: int = 1
    libs_shim: bool = False
    shipped_default: bool = False


def catalog(n: int) -> dict[str, Config]:
    """Every comparison configuration for N usable CPUs, by key."""
    thr = ("--ninstances", str(n), "--ncores-per-instance", "1")
    cfgs = [
        Config("a", "plain python (torch defaults)", "python"),
        Config("b", "run_cpu default (out of the box)", "run_cpu"),
        Config("c1", f"run_cpu {n}x1 --enable-tcmalloc (+its iomp)", "run_cpu",
               thr + ("--enable-tcmalloc",), ninstances=n, libs_shim=True),
        Config("c2", f"run_cpu {n}x1 --enable-tcmalloc --disable-iomp", "run_cpu",
               thr + ("--enable-tcmalloc", "--disable-iomp"), ninstances=n, libs_shim=True),
        Config("c3", f"run_cpu 1x{n} --enable-tcmalloc (+its iomp)", "run_cpu",
               ("--enable-tcmalloc",), libs_shim=True),
        Config("c4", f"run_cpu 1x{n} --enable-tcmalloc --disable-iomp", "run_cpu",
               ("--enable-tcmalloc", "--disable-iomp"), libs_shim=True),
        Config("c5", f"run_cpu {n}x1 --enable-jemalloc --disable-iomp", "run_cpu",
               thr + ("--enable-jemalloc", "--disable-iomp"), ninstances=n, libs_shim=True),
        Config("d", "cpulaunch default", "cpulaunch", shipped_default=True),
        Config("e1", f"cpulaunch --ninstances {n} (tcmalloc, gnu)", "cpulaunch",
               ("--ninstances", str(n)), ninstances=n),
        Config("e2", f"cpulaunch --ninstances {n} --omp-runtime intel", "cpulaunch",
               ("--ninstances", str(n), "--omp-runtime", "intel"), ninstances=n),
        Config("e3", "cpulaunch --omp-runtime intel", "cpulaunch", ("--omp-runtime", "intel")),
        Config("e4", f"cpulaunch --ninstances {n} --allocator jemalloc", "cpulaunch",
               ("--ninstances", str(n), "--allocator", "jemalloc"), ninstances=n),
    ]
    return {c.key: c for c in cfgs}


DEFAULT_CONFIGS = "a,b,c1,c2,d,e1,e2"


def matrix_configs() -> list[Config]:
    """Plain python, then one cpulaunch instance per allocator x OpenMP x places setting."""
    cfgs = [Config("a", "plain python (torch defaults)", "python")]
    allocs = (("default", ("--allocator", "default"), {}),
              ("tcmalloc", ("--allocator", "tcmalloc"), {}),
              ("jemalloc", ("--allocator", "jemalloc"), {"MALLOC_CONF": ""}),
              ("jemalloc+conf", ("--allocator", "jemalloc"), {}))
    for aname, aflags, aenv in allocs:
        for omp in ("gnu", "intel"):
            for places in (False, True):
                env = dict(aenv, **(PLACES_ENV if places else {}))
                key = f"{aname}/{omp}/{'places' if places else 'unset'}"
                cfgs.append(Config(
                    key, key, "cpulaunch", aflags + ("--omp-runtime", omp), env=env,
                    shipped_default=(aname == "tcmalloc" and omp == "gnu" and not places)))
    return cfgs


def parse_args(argv=None) -> argparse.Namespace:
    p = benchkit.parser(
        __doc__, "small model, 2 rounds (1 with --matrix), ~1-2 s runs: checks the script")
    p.add_argument("--matrix", action="store_true",
                   help="allocator x omp runtime x OMP_PROC_BIND/OMP_PLACES, one instance")
    benchkit.add_model_size(p)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seconds", type=float, default=None,
                   help="timed seconds per run after warm-up (default 10; 1 with --quick)")
    p.add_argument("--iterations", type=int, default=None,
                   help="timed calls per run instead of --seconds")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed calls per run (default 3; 1 with --quick)")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved rounds (default 5, matrix 3; quick 2, matrix quick 1)")
    p.add_argument("--configs", default=None,
                   help=f"comma-separated keys (default {DEFAULT_CONFIGS}; see --list)")
    p.add_argument("--list", action="store_true", help="list the configurations and exit")
    p.add_argument("--busy-threshold", type=float, default=10.0,
                   help="percent of the machine used by others that marks a round busy "
                        "(default 10; one busy thread on 2 CPUs is 50)")
    p.add_argument("--quiet-sample", type=float, default=0.5,
                   help="seconds of load sampling before each run (default 0.5)")
    p.add_argument("--tuned", metavar="FILE", default=None,
                   help="also run t = cpulaunch --config FILE (cpulaunch tune's best.toml); "
                        "default configurations then a,d,t")
    p.add_argument("--json", action="store_true", help="also print all results as one JSON line")
    args = p.parse_args(argv)
    args.size = args.size or ("small" if args.quick else "full")
    if args.iterations is None:
        args.seconds = args.seconds or (1.0 if args.quick else 10.0)
    args.warmup = args.warmup or (1 if args.quick else 3)
    args.rounds = args.rounds or ((1 if args.matrix else 2) if args.quick else (3 if args.matrix else 5))
    args.cpus = sorted(os.sched_getaffinity(0))
    args.n = len(args.cpus)
    if args.batch_size < 1 or args.rounds < 1:
        p.error("--batch-size and --rounds must be >= 1")
    cat = catalog(args.n)
    if args.tuned:
        if args.matrix:
            p.error("--tuned does not apply to --matrix")
        cat["t"] = tuned_config(p, Path(args.tuned))
        if not args.configs:
            args.configs = "a,d,t"
        elif "t" not in args.configs.split(","):
            args.configs += ",t"
    args.catalog = cat
    if args.matrix:
        if args.configs:
            p.error("--configs does not apply to --matrix")
        args.cfgs = matrix_configs()
    else:
        keys = [k.strip() for k in (args.configs or DEFAULT_CONFIGS).split(",") if k.strip()]
        bad = [k for k in keys if k not in cat]
        if bad:
            p.error(f"--configs: unknown {', '.join(bad)}; known: {', '.join(cat)}")
        args.cfgs = [cat[k] for k in dict.fromkeys(keys)]
        if any(c.ninstances > 1 for c in args.cfgs) and args.n < 2:
            p.error(f"multi-instance configurations need 2+ CPUs; this process may use {args.cpus}")
    return args


def tuned_config(p: argparse.ArgumentParser, path: Path) -> Config:
    """Config ``t``: cpulaunch with tune's saved configuration, its instance count read
    from cpulaunch's own dry-run of it (so the check counts the right result lines)."""
    if not path.is_file():
        p.error(f"--tuned {path}: no such file (cpulaunch tune writes DIR/best.toml)")
    res = subprocess.run([sys.executable, "-m", "cpulaunch", "--config", str(path), "--dry-run",
                          "--format", "json", "true"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    if res.returncode != 0:
        p.error(f"--tuned {path}: cpulaunch cannot use it: {res.stderr.strip()}")
    k = json.loads(res.stdout)["num_instances"]
    return Config("t", f"cpulaunch --config {path.name} (tune's best, {k} instance(s))",
                  "cpulaunch", ("--config", str(path.resolve())), ninstances=k)


# --------------------------------------------------------------------------- running


def libs_shim_dir() -> tuple[Path, dict[str, str]]:
    """A temporary prefix whose lib/ holds run_cpu's expected names as symlinks to the
    libraries cpulaunch finds: {name: target} of those made."""
    from cpulaunch.machine import libfinder, libraries

    d = Path(tempfile.mkdtemp(prefix="bench-launch-libs-"))
    (d / "lib").mkdir()
    made = {}
    for name in ("tcmalloc", "jemalloc", "iomp5"):
        path = libfinder.find(libraries.REGISTRY[name], os.environ)
        if path is not None:
            (d / "lib" / f"lib{name}.so").symlink_to(path)
            made[name] = str(path)
    return d, made


def child_env(cfg: Config, shim: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in CLEAN_VARS and not k.startswith(("CPULAUNCH_", "KMP_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    if cfg.libs_shim and shim is not None:
        env["CONDA_PREFIX"] = str(shim)
    env.update(cfg.env)
    return env


def workload_args(args) -> list[str]:
    out = ["--model", args.model, "--size", args.size, "--batch-size", str(args.batch_size),
           "--warmup", str(args.warmup), "--path", "eager", "--json"]
    if args.iterations is not None:
        out += ["--iterations", str(args.iterations)]
    else:
        out += ["--seconds", str(args.seconds)]
    return out


def build_argv(cfg: Config, args) -> list[str]:
    py = sys.executable
    work = [str(INFER), *workload_args(args)]
    if cfg.launcher == "python":
        return [py, *work]
    if cfg.launcher == "run_cpu":
        # run_cpu puts `sys.executable -u` in front of a .py program itself.
        return [py, "-m", "torch.backends.xeon.run_cpu", *cfg.flags, *work]
    return [py, "-m", "cpulaunch", *cfg.flags, py, *work]


JSON_LINE = re.compile(r"^(?:\[[\w.-]*\]:?\s*)?(\{.*\})\s*$")


def parse_results(stdout: str) -> list[dict]:
    """infer.py's JSON lines: cpulaunch prefixes each with "[i] "; run_cpu does not, unless
    given --log-path (then "[run0]:", torchelastic's prefix)."""
    rows = []
    for line in stdout.splitlines():
        m = JSON_LINE.match(line.strip())
        if m:
            try:
                row = json.loads(m.group(1))
            except ValueError:
                continue
            if "samples_per_s" in row:
                rows.append(row)
    return rows


def observed(rows: list[dict]) -> dict:
    """What the children really got: instances, CPUs, threads, mapped allocator/OpenMP."""
    mapped = set()
    for r in rows:
        mapped |= {os.path.basename(p) for p in (r.get("preloaded") or {}).values() if p}
    alloc = next((a for a in ("tcmalloc", "jemalloc") if any(a in m for m in mapped)), "default")
    omp = "intel" if any("iomp5" in m for m in mapped) else "gnu"
    return {"instances": len(rows), "alloc": alloc, "omp": omp,
            "affinity": [r.get("affinity") for r in rows],
            "threads": [r.get("threads") for r in rows], "mapped": sorted(mapped)}


def run_one(cfg: Config, args, shim: Path | None) -> tuple[float, dict]:
    """Run a configuration once -> (aggregate samples/s, what the children got)."""
    argv = build_argv(cfg, args)
    limit = 900 + 20 * (args.seconds or 0)
    proc = subprocess.run(argv, env=child_env(cfg, shim), capture_output=True, text=True,
                          timeout=limit)
    if proc.returncode != 0:
        raise RuntimeError(f"[{cfg.key}] {' '.join(argv)} exited {proc.returncode}:\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    rows = parse_results(proc.stdout)
    if len(rows) != cfg.ninstances or len({r.get("pid") for r in rows}) != len(rows):
        raise RuntimeError(f"[{cfg.key}] expected {cfg.ninstances} result line(s) from distinct "
                           f"processes, got {len(rows)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return sum(r["samples_per_s"] for r in rows), observed(rows)


# --------------------------------------------------------------------------- reporting


def stats(xs: list[float]) -> dict:
    """Median, min, max, count and spread in percent of ``xs`` (NaN for none)."""
    if not xs:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"),
                "spread_pct": float("nan"), "n": 0}
    return {"median": benchkit.median(xs), "min": min(xs), "max": max(xs), "n": len(xs),
            "spread_pct": benchkit.spread(xs) * 100}


def describe(obs: dict) -> str:
    return (f"{obs['instances']} instance(s), cpus {'/'.join(map(str, obs['affinity']))}, "
            f"threads {'/'.join(map(str, obs['threads']))}, allocator {obs['alloc']}, "
            f"openmp {obs['omp']}" + (f" (mapped: {', '.join(obs['mapped'])})" if obs['mapped'] else ""))


def significance(a: dict, b: dict) -> str:
    """A note when two medians differ by less than the larger of their spreads."""
    diff = abs(a["median"] / b["median"] - 1) * 100
    if min(a["n"], b["n"]) < 2:
        return f"; difference {diff:.1f}% from one round: no spread to judge it by"
    noise = max(a["spread_pct"], b["spread_pct"])
    if diff < noise:
        return f"; difference {diff:.1f}% < spread {noise:.1f}%: not significant"
    return f"; difference {diff:.1f}%, spreads up to {noise:.1f}%"


def print_table(cfgs, st, base_key, rounds_used, ref_key=None) -> None:
    w = max(len(c.label) for c in cfgs) + 5
    ref = f"  {'x default':>9}" if ref_key else ""
    print(f"\n{'configuration':<{w}}  {'median':>9}  {'min':>9}  {'max':>9}  {'spread':>6}  "
          f"{'x plain':>7}{ref}   (samples/s, aggregate; {rounds_used})")
    base = st[base_key]["median"] if base_key in st else float("nan")
    for c in cfgs:
        s = st[c.key]
        mark = " *" if c.shipped_default and ref_key else ""
        label = f"{c.key:>3} {c.label}" if not ref_key else c.label + mark
        extra = f"  {s['median'] / st[ref_key]['median']:8.2f}x" if ref_key else ""
        print(f"{label:<{w}}  {s['median']:9.2f}  {s['min']:9.2f}  {s['max']:9.2f}  "
              f"{s['spread_pct']:5.1f}%  {s['median'] / base:6.2f}x{extra}")


def run_rounds(args, shim) -> tuple[dict, dict, list[bool], list[str]]:
    """All rounds -> (samples/s per key per round, first observation per key,
    busy flag per round, warning lines)."""
    values: dict[str, list[float]] = {c.key: [] for c in args.cfgs}
    obs: dict[str, dict] = {}
    busy_rounds: list[bool] = []
    warnings: list[str] = []
    for rnd in range(1, args.rounds + 1):
        busy = False
        line = []
        for cfg in args.cfgs:
            pre = benchkit.sample(args.quiet_sample, top=4)
            window = benchkit.LoadWindow()
            rate, ob = run_one(cfg, args, shim)
            during = window.load()
            values[cfg.key].append(rate)
            obs.setdefault(cfg.key, ob)
            if benchkit.busy((pre, during), args.busy_threshold):
                busy = True
                msg = benchkit.busy_warning(
                    f"in round {rnd} ({cfg.key})",
                    f"others used {pre.others_pct:.0f}% before and {during.others_pct:.0f}% "
                    f"during the run, steal {max(pre.steal_pct, during.steal_pct):.0f}%",
                    pre.busiest)
                warnings.append(msg)
                print(msg, flush=True)  # stdout: in order with the round lines
            line.append(f"{cfg.key} {rate:.1f}")
        busy_rounds.append(busy)
        print(f"  round {rnd}{' [BUSY]' if busy else ''}: " + "  ".join(line), flush=True)
    return values, obs, busy_rounds, warnings


def select_rounds(values, busy_rounds):
    """(values restricted to the quiet rounds, or all when none was quiet; description)."""
    quiet = [i for i, b in enumerate(busy_rounds) if not b]
    if quiet:
        used = {k: [v[i] for i in quiet] for k, v in values.items()}
        desc = f"quiet rounds {','.join(str(i + 1) for i in quiet)} of {len(busy_rounds)}"
        return used, desc, False
    return values, f"all {len(busy_rounds)} rounds, NONE quiet", True


def main_compare(args, shim, made) -> int:
    values, obs, busy_rounds, warnings = run_rounds(args, shim)
    used, desc, all_busy = select_rounds(values, busy_rounds)
    st = {k: stats(v) for k, v in used.items()}
    print_table(args.cfgs, st, "a", desc)
    print("\nwhat each configuration's processes really got (first round):")
    for c in args.cfgs:
        print(f"  {c.key:>3}: {describe(obs[c.key])}")
    tag = " [figures from a busy machine: do not quote]" if all_busy else ""
    keys = {c.key for c in args.cfgs}
    verdicts = {}
    print()
    cl = [c for c in args.cfgs if c.launcher == "cpulaunch"]
    if "a" in keys and cl:
        best = max(cl, key=lambda c: st[c.key]["median"])
        ratio = st[best.key]["median"] / st["a"]["median"]
        paired = [x / y for x, y in zip(used[best.key], used["a"])]
        target = args.model == "cnn" and args.size == "full" and args.batch_size == 32
        ok = ratio >= TARGET_RATIO
        verdicts["best_vs_plain"] = ok
        print(f"{'PASS' if ok else 'FAIL'}: cpulaunch's best configuration ({best.key}: {best.label}) "
              f"is {ratio:.2f}x plain python (target >= {TARGET_RATIO}x on the CNN at batch 32; "
              f"median of per-round ratios {benchkit.median(paired):.2f}x)"
              + ("" if target else f" [this run is {args.model}/{args.size} batch "
                 f"{args.batch_size}, not the target workload]") + tag)
    if "t" in keys and "a" in keys:
        ratio = st["t"]["median"] / st["a"]["median"]
        ok = ratio >= TUNED_TARGET
        verdicts["tuned_vs_plain"] = ok
        print(f"{'PASS' if ok else 'FAIL'}: tune's best (t) is {ratio:.2f}x plain python "
              f"(target >= {TUNED_TARGET}x, issue 10){significance(st['t'], st['a'])}" + tag)
    if "t" in keys and "d" in keys:
        ratio = st["t"]["median"] / st["d"]["median"]
        sig = significance(st["t"], st["d"])
        within = (min(st["t"]["n"], st["d"]["n"]) >= 2
                  and abs(ratio - 1) * 100 < max(st["t"]["spread_pct"], st["d"]["spread_pct"]))
        ok = ratio >= 1.0 or within
        verdicts["tuned_vs_default"] = ok
        print(f"{'PASS' if ok else 'FAIL'}: tune's best (t) vs cpulaunch's default (d): "
              f"{ratio:.3f}x{sig}" + ("" if ratio >= 1.0 or not ok else
                                     " (slower by less than the spreads: as fast, as tune judges)") + tag)
    rc = [c for c in args.cfgs if c.launcher == "run_cpu"]
    pairs = []
    if "b" in keys and "d" in keys:
        pairs.append(("b", "d", "the launchers' defaults"))
    for r in rc:
        for c in cl:
            same = all(obs[r.key][f] == obs[c.key][f] for f in ("instances", "alloc", "omp"))
            if same and (r.key, c.key) != ("b", "d"):
                o = obs[c.key]
                pairs.append((r.key, c.key, f"{o['instances']} instance(s), {o['alloc']}, {o['omp']} OpenMP"))
    if not pairs:
        print("no run_cpu/cpulaunch pair ran the same mode: nothing to compare")
    for r, c, what in pairs:
        ratio = st[c]["median"] / st[r]["median"]
        ok = ratio >= 1.0
        verdicts[f"{c}_vs_{r}"] = ok
        print(f"{'PASS' if ok else 'FAIL'}: cpulaunch {c} vs run_cpu {r} ({what}): "
              f"{ratio:.3f}x{significance(st[c], st[r])}" + tag)
    if rc and cl:
        bc = max(cl, key=lambda c: st[c.key]["median"])
        br = max(rc, key=lambda c: st[c.key]["median"])
        print(f"best of each: cpulaunch {bc.key} {st[bc.key]['median']:.2f} vs run_cpu {br.key} "
              f"{st[br.key]['median']:.2f} samples/s ({st[bc.key]['median'] / st[br.key]['median']:.3f}x)")
    if made:
        print(f"(run_cpu best-mode configurations found the libraries through CONDA_PREFIX="
              f"{shim}: {', '.join(f'lib{k}.so -> {v}' for k, v in made.items())})")
    n_busy = sum(busy_rounds)
    if n_busy:
        print(f"{n_busy} of {len(busy_rounds)} rounds were busy and "
              + ("all were used anyway" if all_busy else "were left out of the medians"))
    if args.json:
        print(json.dumps({"mode": "compare", "workload": workload_args(args), "rounds": args.rounds,
                          "busy_rounds": busy_rounds, "values": values, "stats": st,
                          "observed": obs, "verdicts": verdicts,
                          "labels": {c.key: c.label for c in args.cfgs}}))
    return 0 if verdicts and all(verdicts.values()) else 1


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x == x and x > 0]
    return statistics.geometric_mean(xs) if xs else float("nan")


def main_matrix(args, shim) -> int:
    values, obs, busy_rounds, warnings = run_rounds(args, shim)
    used, desc, all_busy = select_rounds(values, busy_rounds)
    st = {k: stats(v) for k, v in used.items()}
    ref = next(c.key for c in args.cfgs if c.shipped_default)
    print_table(args.cfgs, st, "a", desc, ref_key=ref)
    print("* = what cpulaunch ships (--allocator auto = tcmalloc when installed, --omp-runtime "
          "auto = gnu, OMP_PROC_BIND/OMP_PLACES unset); places = OMP_PROC_BIND=close "
          "OMP_PLACES=cores in the environment; jemalloc = MALLOC_CONF empty, jemalloc+conf "
          "= cpulaunch's registry value (the tuning guide's)")
    bad = [f"{c.key}: {describe(obs[c.key])}" for c in args.cfgs if c.launcher == "cpulaunch"
           and (obs[c.key]["alloc"] != c.key.split("/")[0].split("+")[0]
                or obs[c.key]["omp"] != c.key.split("/")[1])]
    for line in bad:
        print(f"warning: did not get what it asked for: {line}", file=sys.stderr)

    def m(a, o, p):
        return st[f"{a}/{o}/{p}"]["median"]

    allocs = ("default", "tcmalloc", "jemalloc", "jemalloc+conf")
    print("\neffect of each choice, others held fixed (geometric mean of ratios of medians "
          "over the other axes' 4 or 8 combinations):")
    for a in allocs[1:]:
        r = geomean([m(a, o, p) / m("default", o, p) for o in ("gnu", "intel") for p in ("unset", "places")])
        print(f"  allocator {a:<14} vs default malloc: {r:.3f}x")
    r = geomean([m(a, "intel", p) / m(a, "gnu", p) for a in allocs for p in ("unset", "places")])
    print(f"  omp intel (libiomp5)     vs gnu (torch's libgomp): {r:.3f}x")
    r = geomean([m(a, o, "places") / m(a, o, "unset") for a in allocs for o in ("gnu", "intel")])
    print(f"  OMP_PROC_BIND/PLACES set vs unset: {r:.3f}x")
    best = max((c for c in args.cfgs if c.launcher == "cpulaunch"), key=lambda c: st[c.key]["median"])
    print(f"best: {best.key} {st[best.key]['median']:.2f} samples/s = "
          f"{st[best.key]['median'] / st[ref]['median']:.3f}x the shipped default"
          f"{significance(st[best.key], st[ref]) if best.key != ref else ''}")
    if all_busy:
        print("no quiet round: these figures come from a busy machine, do not record them")
    if args.json:
        print(json.dumps({"mode": "matrix", "workload": workload_args(args), "rounds": args.rounds,
                          "busy_rounds": busy_rounds, "values": values, "stats": st,
                          "observed": obs, "shipped_default": ref}))
    return 0


def main(argv=None) -> int:
    benchkit.exit_on_sigterm()  # scratch folders are removed on SIGTERM too
    args = parse_args(argv)
    if args.list:
        for c in args.catalog.values():
            print(f"{c.key:>3}  {c.label}: {c.launcher} {' '.join(c.flags)}"
                  + (" [libraries made findable]" if c.libs_shim else "")
                  + (" [default set]" if c.key in DEFAULT_CONFIGS.split(",") else ""))
        return 0
    runs = (f"{args.iterations} timed calls" if args.iterations is not None
            else f"{args.seconds:g} s timed")
    print(f"bench_launch{' --matrix' if args.matrix else ''}: {args.model}/{args.size} batch "
          f"{args.batch_size}, {runs} + {args.warmup} warm-up call(s) per run, {args.rounds} "
          f"interleaved round(s) of {len(args.cfgs)} configurations; {args.n} CPUs "
          f"({','.join(map(str, args.cpus))}); busy threshold {args.busy_threshold:g}% of the machine")
    if args.quick:
        print("  --quick: a smoke run; the figures mean little")
    need_shim = any(c.libs_shim for c in args.cfgs)
    shim, made = (libs_shim_dir() if need_shim else (None, {}))
    try:
        return main_matrix(args, shim) if args.matrix else main_compare(args, shim, made)
    except RuntimeError as exc:
        print(f"bench_launch: {exc}", file=sys.stderr)
        return 2
    finally:
        if shim is not None:
            shutil.rmtree(shim, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
