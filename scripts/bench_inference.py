#!/usr/bin/env python3
"""Benchmark the inference paths: eager vs onednn-graph vs inductor vs zentorch, fp32 and bf16.

Models (examples/models.py, random weights, nothing downloaded): the project's CNN
(ResNet-50-like, batch 1 and 32), an MLP (1024-4096-4096-1000, batch 1 and 64), a
transformer block (one BERT-base encoder layer on 128 tokens, batch 1), timm's ViT-S/16
(``timm-vit``, batch 1) and transformers' BERT-base (``hf-bert``, sequence 128, batch 1);
``--models`` also takes ``bert`` (the project's own BERT-base-like encoder). For each model,
batch size and dtype (bf16 only where /proc/cpuinfo shows AVX512_BF16, AMX-BF16 or arm64
BF16, unless ``--dtypes`` names it), every path is built with
``cpulaunch.inference.optimize`` and timed in interleaved rounds (round r times every path
once, so a burst of foreign load hits all paths alike). zentorch is timed where it imports
with this torch (zentorch 2.14.0.1: torch 2.14.x), else its rows say why. Reported per path:

- steady throughput, samples/s: median over ``--repeats`` timed windows of ``--seconds``
  (at least one call each), and the spread (min..max) of those windows;
- ratio to eager (throughput / eager throughput, same model, batch and dtype);
- build cost: trace/compile plus the warm-up calls, seconds;
- max abs diff of the outputs against eager fp32 on the unmodified model (for the bf16
  rows too, so eager bf16 shows its own rounding error), and that diff relative to the
  largest output magnitude; MISMATCH when over the tolerance of docs/guide/inference.md;
- oneDNN fusion groups (onednn-graph).

Then, per model and dtype, what ``optimize(path="auto")`` picks at the first batch size.

The CPU model, its platform (vendor, family) and its bf16 support are printed first, and the
load average (``uptime``) at the start and the end.

Before each round the script measures the CPU time used by other processes (system busy
time minus its own and its children's, /proc/stat via psutil, over 0.5 s, steal time
counted as foreign; benchkit.py) and marks rounds where it exceeded ``--busy-threshold``
CPUs: oversubscribed cores make OpenMP runs many times slower, so such figures are not
comparable.

One command from a fresh checkout: ``python scripts/bench_inference.py``.
Quick check that it works: ``python scripts/bench_inference.py --quick``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import benchkit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))  # models.py
sys.path.insert(0, str(ROOT))  # cpulaunch, when not installed

from cpulaunch import cpulist  # noqa: E402
from cpulaunch.inference import CONCRETE_PATHS, DTYPES, Bf16Support, host_bf16_support, optimize  # noqa: E402

BATCHES = {"cnn": (1, 32), "mlp": (1, 64), "block": (1,), "timm-vit": (1,), "hf-bert": (1,), "bert": (1, 8)}
LABELS = {"cnn": "ResNet-50-like CNN", "mlp": "MLP 1024-4096-4096-1000", "block": "BERT-base encoder layer",
          "timm-vit": "timm vit_small_patch16_224", "hf-bert": "transformers BERT-base", "bert": "BERT-base-like encoder"}
DEFAULT_MODELS = "cnn,mlp,block,timm-vit,hf-bert"


def cpu_line() -> str:
    """The CPU model, platform and bf16 support, as this script's first line says them."""
    from cpulaunch.machine import probe

    topo = probe.probe("/")
    return (f"CPU: {topo.model or '?'}, {topo.platform.text}, {len(topo.allowed)} CPUs allowed; "
            f"bf16: {host_bf16_support().value}")


def check_quiet(threshold: float, wait: float) -> float:
    """Foreign load in CPUs over 0.5 s; with ``wait`` > 0, re-check until it drops under
    ``threshold`` CPUs or ``wait`` seconds have passed. Returns the last measurement."""
    pct = 100 * threshold / (os.cpu_count() or 1)  # benchkit's threshold: % of the machine
    return benchkit.wait_quiet(pct, wait).foreign


def time_window(opt, inputs, seconds: float) -> tuple:
    """Call ``opt`` for ``seconds`` (at least once); return (calls, elapsed seconds)."""
    calls = 0
    start = time.perf_counter()
    while True:
        opt(*inputs)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return calls, elapsed


def bench_config(name, model, inputs, batch, dtype, paths, args, log) -> list:
    """Build every path for one (model, batch, dtype) and time them in interleaved rounds."""
    built, rows = {}, {}
    for path in paths:
        row = {"model": name, "batch": batch, "dtype": dtype, "path": path}
        rows[path] = row
        try:
            opt = optimize(model, inputs, dtype=dtype, path=path, warmup=args.warmup)
        except Exception as exc:  # report the failure, keep benchmarking the others
            row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            log(f"  {path}: build failed: {row['error']}")
            continue
        rep = opt.report
        row.update(build_s=rep["build_s"][path], max_abs_diff=rep["max_abs_diff"][path],
                   rel_diff=rep["rel_diff"][path], matches_eager=rep["matches_eager"][path],
                   fusion_groups=rep.get("fusion_groups"), windows=[], busy=[])
        built[path] = opt
        log(f"  {path}: built in {row['build_s']:.1f} s")
    for _ in range(args.repeats):
        load = check_quiet(args.busy_threshold, args.wait_quiet)
        for path, opt in built.items():
            calls, elapsed = time_window(opt, inputs, args.seconds)
            rows[path]["windows"].append(calls * batch / elapsed)
            rows[path]["busy"].append(load)
    for row in rows.values():
        if row.get("windows"):
            row["samples_per_s"] = benchkit.median(row["windows"])
            row["max_foreign_cpus"] = max(row["busy"])
            row["quiet"] = row["max_foreign_cpus"] <= args.busy_threshold
    eager = rows.get("eager", {}).get("samples_per_s")
    for row in rows.values():
        if eager and row.get("samples_per_s"):
            row["ratio_to_eager"] = row["samples_per_s"] / eager
    return list(rows.values())


def fmt_row(r) -> str:
    head = f"{r['model']:<9}{r['batch']:>6} {r['dtype']:<5} {r['path']:<13}"
    if "error" in r:
        return f"{head}  FAILED: {r['error']}"
    spread = f"{min(r['windows']):.1f}..{max(r['windows']):.1f}"
    ratio = f"{r['ratio_to_eager']:.2f}x" if "ratio_to_eager" in r else "-"
    groups = "-" if r["fusion_groups"] is None else str(r["fusion_groups"])
    quiet = "yes" if r["quiet"] else f"NO ({r['max_foreign_cpus']:.2f} cpus busy)"
    match = "" if r["matches_eager"] else " MISMATCH"
    return (f"{head}{r['samples_per_s']:>10.2f} {spread:>17} {ratio:>7} {r['build_s']:>8.1f}"
            f" {r['max_abs_diff']:>10.2e} {r['rel_diff']:>9.2e}{match} {groups:>6}  {quiet}")


HEADER = (f"{'model':<9}{'batch':>6} {'dtype':<5} {'path':<13}{'samples/s':>10} "
          f"{'windows min..max':>17} {'vs eager':>7} {'build s':>8} {'max|diff|':>10} "
          f"{'rel diff':>9} {'groups':>6}  quiet")


def markdown_table(rows, autos, models, dtypes) -> str:
    """The table docs/guide/inference.md holds: per model, batch and dtype, eager's samples/s and
    every other path's throughput as a ratio to eager (FAILED, or "differs" where its
    outputs did not match eager), what auto chose, and the largest foreign load of the
    rounds (CPUs)."""
    paths = [p for p in CONCRETE_PATHS if p != "eager" and any(r["path"] == p for r in rows)]
    head = ("| model | batch | dtype | eager samples/s | " + " | ".join(paths)
            + " | auto picks | foreign load (CPUs) |\n|" + "---|" * (6 + len(paths)) + "\n")
    picks = {(a["model"], a["batch"], a["dtype"]): a.get("chose") or "FAILED" for a in autos}
    keys = sorted({(r["model"], r["batch"], r["dtype"]) for r in rows},
                  key=lambda k: (models.index(k[0]), dtypes.index(k[2]), k[1]))
    lines = []
    for key in keys:
        same = {r["path"]: r for r in rows if (r["model"], r["batch"], r["dtype"]) == key}
        eager = same.get("eager", {})
        cells = []
        for p in paths:
            r = same.get(p)
            if r is None or "error" in r:
                cells.append("FAILED")
            else:
                cells.append(f"{r['ratio_to_eager']:.2f}x" + ("" if r["matches_eager"] else " (differs)"))
        load = max((r.get("max_foreign_cpus", 0.0) for r in same.values()), default=0.0)
        rate = f"{eager['samples_per_s']:.2f}" if "samples_per_s" in eager else "-"
        lines.append(f"| {LABELS[key[0]]} | {key[1]} | {key[2]} | {rate} | " + " | ".join(cells)
                     + f" | {picks.get(key, '')} | {load:.2f} |")
    return head + "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = benchkit.parser(__doc__, "small models, 2 repeats of 0.3 s, warm-up 2: proves the "
                                 "script works in a minute or two; figures are not meaningful")
    p.add_argument("--models", default=DEFAULT_MODELS,
                   help=f"subset of {','.join(BATCHES)} (default: {DEFAULT_MODELS})")
    p.add_argument("--dtypes", default=None,
                   help="subset of fp32,bf16 (default: both where the CPU has bf16, else fp32)")
    p.add_argument("--paths", default=",".join(CONCRETE_PATHS),
                   help=f"subset of {','.join(CONCRETE_PATHS)} (eager is the ratio base)")
    p.add_argument("--batches", default=None, help="batch sizes for every model, e.g. 1 (default: per model)")
    p.add_argument("--size", choices=("full", "small"), default=None,
                   help="model size (default: full; small with --quick)")
    p.add_argument("--repeats", type=int, default=None, help="timed windows per path (default 5)")
    p.add_argument("--seconds", type=float, default=None,
                   help="length of each timed window (default 3)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 5)")
    p.add_argument("--no-auto", action="store_true", help="skip the optimize(path='auto') runs")
    p.add_argument("--busy-threshold", type=float, default=0.15,
                   help="foreign CPUs above which a round is marked not quiet (default 0.15)")
    p.add_argument("--wait-quiet", type=float, default=0.0,
                   help="before each round, wait up to this many seconds for quiet")
    p.add_argument("--json", metavar="FILE", default=None, help="also write all rows here")
    args = p.parse_args(argv)

    def subset(value, allowed, flag):
        items = [v.strip() for v in value.split(",") if v.strip()]
        bad = [v for v in items if v not in allowed]
        if bad or not items:
            p.error(f"{flag} {value!r}: choose from {', '.join(allowed)}")
        return items

    args.models = subset(args.models, tuple(BATCHES), "--models")
    if args.dtypes is None:
        native = host_bf16_support() is Bf16Support.NATIVE
        args.dtypes = "fp32,bf16" if native else "fp32"
    args.dtypes = subset(args.dtypes, DTYPES, "--dtypes")
    if args.batches is not None:
        try:
            args.batches = tuple(int(b) for b in args.batches.split(","))
        except ValueError:
            p.error(f"--batches {args.batches!r}: comma-separated whole numbers")
    args.paths = subset(args.paths, CONCRETE_PATHS, "--paths")
    quick = {"size": "small", "repeats": 2, "seconds": 0.3, "warmup": 2}
    full = {"size": "full", "repeats": 5, "seconds": 3.0, "warmup": 5}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.repeats < 1 or args.seconds <= 0 or args.warmup < 1:
        p.error("--repeats and --warmup must be >= 1 and --seconds > 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from models import make_model

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    print(cpu_line())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, affinity "
          f"{cpulist.format(os.sched_getaffinity(0))}, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS')}, LD_PRELOAD={os.environ.get('LD_PRELOAD')}")
    print(f"size {args.size}, {args.repeats} windows of {args.seconds} s per path, warm-up "
          f"{args.warmup}; load average at start {os.getloadavg()}")
    rows, autos = [], []
    for name in args.models:
        model, make_inputs = make_model(name, args.size)
        for dtype in args.dtypes:
            for batch in args.batches or BATCHES[name]:
                log(f"{name} batch {batch} {dtype}")
                rows += bench_config(name, model, make_inputs(batch), batch, dtype,
                                     args.paths, args, log)
            if args.no_auto:
                continue
            batch = (args.batches or BATCHES[name])[0]
            log(f"{name} batch {batch} {dtype}: optimize(path='auto')")
            load = check_quiet(args.busy_threshold, args.wait_quiet)
            try:
                opt = optimize(model, make_inputs(batch), dtype=dtype, path="auto",
                               warmup=args.warmup, candidates=args.paths)
                autos.append({"model": name, "batch": batch, "dtype": dtype, "chose": opt.path,
                              "ms_per_call": opt.report["ms_per_call"],
                              "speedup_vs_eager": opt.report.get("speedup_vs_eager", {}),
                              "matches_eager": opt.report["matches_eager"],
                              "errors": opt.report["errors"], "foreign_cpus": load})
            except Exception as exc:
                autos.append({"model": name, "batch": batch, "dtype": dtype, "chose": None,
                              "error": f"{type(exc).__name__}: {exc}".splitlines()[0]})

    print()
    print(HEADER)
    for r in rows:
        print(fmt_row(r))

    print("\nRatios to eager (throughput), per model/batch/dtype:")
    keys = sorted({(r["model"], r["batch"], r["dtype"]) for r in rows},
                  key=lambda k: (args.models.index(k[0]), args.dtypes.index(k[2]), k[1]))
    for key in keys:
        same = [r for r in rows if (r["model"], r["batch"], r["dtype"]) == key
                and "ratio_to_eager" in r]
        ok = [r for r in same if r["matches_eager"]]
        best = max(ok, key=lambda r: r["samples_per_s"])["path"] if ok else "-"
        ratios = ", ".join(f"{r['path']} {r['ratio_to_eager']:.2f}x" for r in same)
        print(f"  {key[0]} b{key[1]} {key[2]}: {ratios}; fastest matching: {best}")

    if autos:
        print("\noptimize(path='auto') picks:")
        for a in autos:
            if a["chose"] is None:
                print(f"  {a['model']} b{a['batch']} {a['dtype']}: FAILED: {a['error']}")
                continue
            ratios = ", ".join(f"{p} {v:.2f}x" for p, v in a["speedup_vs_eager"].items())
            quiet = "" if a["foreign_cpus"] <= args.busy_threshold else (
                f" [not quiet: {a['foreign_cpus']:.2f} cpus busy]")
            errors = f"; failed: {a['errors']}" if a["errors"] else ""
            print(f"  {a['model']} b{a['batch']} {a['dtype']}: {a['chose']} "
                  f"(speed-up vs eager in its trial: {ratios}){errors}{quiet}")

    print("\nAs docs/guide/inference.md holds it:\n")
    print(markdown_table(rows, autos, args.models, args.dtypes))
    print(f"load average at the end {os.getloadavg()}")
    noisy = [r for r in rows if "quiet" in r and not r["quiet"]]
    if noisy:
        print(f"\nWARNING: {len(noisy)} of {len(rows)} rows were timed while other processes "
              f"used more than {args.busy_threshold} CPUs; those figures are not comparable.")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "auto": autos}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
