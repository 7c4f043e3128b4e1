"""Inference benchmark of one model on the path cpulaunch chose, reporting the environment
the process really got.

Runs a model from examples/models.py (seeded random weights, nothing downloaded) through
``cpulaunch.inference.optimize`` and then calls it for ``--seconds`` (or ``--iterations``).
It prints its throughput and what it was given: CPU affinity, torch's thread count,
OMP_NUM_THREADS, ``CPULAUNCH_INSTANCE_INDEX``, and which LD_PRELOAD entries are really
mapped into the process (read from /proc/self/maps: a preload that failed to load is
silently skipped by ld.so, so being in LD_PRELOAD proves nothing).

Its last line is the throughput in cpulaunch's metric format (what ``cpulaunch tune``
reads; one ``CPULAUNCH_METRIC name=value`` per line, value a float, higher is better),
after the JSON line or the text report::

    CPULAUNCH_METRIC samples_per_s=123.45

Path: ``--path`` if given; else, when ``$CPULAUNCH_PLANNED_INFERENCE_PATH`` is set (``cpulaunch
--inference-path ...`` sets it), ``optimize(path=None)`` reads it; else eager.

Examples::

    python examples/infer.py                      # ResNet-50-like, batch 1, 10 s, eager
    python examples/infer.py --model bert --dtype bf16 --path onednn-graph
    python examples/infer.py --model mlp --path zentorch    # AMD's zentorch (pip install zentorch)
    cpulaunch --ninstances 2 --inference-path auto examples/infer.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/models.py
from models import INFER_MODEL_NAMES, SIZES, make_model  # noqa: E402

from cpulaunch import cpulist  # noqa: E402
from cpulaunch.inference import INFERENCE_PATH_ENV, PATHS, optimize, resolve_path  # noqa: E402
from cpulaunch.machine.libraries import preload_entries  # noqa: E402


def mapped_files(maps_text: str) -> set:
    """Paths of files mapped into a process, from the text of /proc/PID/maps (6th field)."""
    files = set()
    for line in maps_text.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/"):
            files.add(fields[5].strip())
    return files


def preload_status(ld_preload: str, maps_text: str) -> dict:
    """For each LD_PRELOAD entry, the mapped file it resolved to, or None if not mapped.

    A path entry matches the mapped file with the same real path; a bare name (ld.so
    searches for it) matches a mapped file with that base name.
    """
    files = mapped_files(maps_text)
    real = {os.path.realpath(f): f for f in files}
    status = {}
    for entry in preload_entries(ld_preload):
        if "/" in entry:
            status[entry] = real.get(os.path.realpath(entry))
        else:
            status[entry] = next((f for f in sorted(files) if os.path.basename(f) == entry), None)
    return status


def metric_line(name: str, value: float) -> str:
    """One metric in cpulaunch's format, newline included: ``CPULAUNCH_METRIC name=value``.

    ``value`` is written as Python's ``repr`` of the float (``float(text)`` reads it back
    exactly), e.g. ``metric_line("samples_per_s", 12.5)`` ->
    ``"CPULAUNCH_METRIC samples_per_s=12.5\\n"``.
    """
    return f"CPULAUNCH_METRIC {name}={float(value)!r}\n"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=INFER_MODEL_NAMES, default="cnn",
                   help="cnn: ResNet-50-like; bert: BERT-base-like; mlp: 3 Linear layers, 1024-4096-4096-1000; "
                        "block: one BERT-base encoder layer; timm-vit: timm's ViT-S/16 (needs timm); hf-bert: "
                        "transformers' BERT-base (needs transformers) (default: cnn)")
    p.add_argument("--size", choices=SIZES, default="full",
                   help="full (the real shape) or small (tests) (default: full)")
    p.add_argument("--batch-size", type=int, default=1, help="samples per call (default: 1)")
    p.add_argument("--seconds", type=float, default=10.0,
                   help="timed seconds after warm-up (default: 10)")
    p.add_argument("--iterations", type=int, default=None,
                   help="timed calls instead of --seconds")
    p.add_argument("--warmup", type=int, default=3,
                   help="calls after building, not timed (default: 3)")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--path", choices=PATHS, default=None,
                   help=f"inference path (default: ${INFERENCE_PATH_ENV} if set, else eager)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON line with the results instead of text")
    args = p.parse_args(argv)
    for name in ("batch_size", "warmup"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.iterations is not None and args.iterations < 1:
        p.error("--iterations must be >= 1")
    if args.seconds <= 0:
        p.error("--seconds must be > 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.path is not None:
        path = args.path
    elif os.environ.get(INFERENCE_PATH_ENV, "").strip():
        path = None  # optimize() reads the variable
        try:
            resolve_path(None)  # reject a bad value now, before a minute of model building
        except ValueError as exc:
            print(f"infer.py: {exc}", file=sys.stderr)
            return 2
    else:
        path = "eager"
    import torch

    model, make_inputs = make_model(args.model, args.size)
    inputs = make_inputs(args.batch_size)
    start = time.perf_counter()
    try:
        opt = optimize(model, inputs, dtype=args.dtype, path=path, warmup=args.warmup)
    except ValueError as exc:
        print(f"infer.py: {exc}", file=sys.stderr)
        return 2
    build_s = time.perf_counter() - start

    times = []
    t0 = time.perf_counter()
    while True:
        t = time.perf_counter()
        opt(*inputs)
        times.append(time.perf_counter() - t)
        if args.iterations is not None:
            if len(times) >= args.iterations:
                break
        elif time.perf_counter() - t0 >= args.seconds:
            break
    elapsed = time.perf_counter() - t0

    with open("/proc/self/maps") as f:
        preloads = preload_status(os.environ.get("LD_PRELOAD", ""), f.read())
    index = os.environ.get("CPULAUNCH_INSTANCE_INDEX")
    result = {
        "model": args.model,
        "size": args.size,
        "batch_size": args.batch_size,
        "dtype": args.dtype,
        "path": opt.path,
        "requested_path": opt.report["requested_path"],
        "iterations": len(times),
        "seconds": round(elapsed, 4),
        "samples_per_s": len(times) * args.batch_size / elapsed,
        "ms_per_iter_median": statistics.median(times) * 1e3,
        "build_s": round(build_s, 3),
        "fusion_groups": opt.report.get("fusion_groups"),
        "bf16_fusion_groups": opt.report.get("bf16_fusion_groups"),
        "bf16_support": opt.report["bf16_support"],
        "pid": os.getpid(),
        "affinity": cpulist.format(os.sched_getaffinity(0)),
        "threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "instance_index": int(index) if index and index.isdigit() else index,
        "preloaded": preloads,
        "notes": opt.report["notes"],
    }
    metric = metric_line("samples_per_s", result["samples_per_s"])
    if args.json:
        # one write: instances share stdout, and two writes could interleave with theirs
        sys.stdout.write(json.dumps(result) + "\n" + metric)
    else:
        print_text_report(args, opt, result, preloads, elapsed, build_s, len(times))
        sys.stdout.write(metric)
    sys.stdout.flush()
    return 0


def print_text_report(args, opt, result, preloads, elapsed, build_s, calls) -> None:
    # cpulaunch puts "[i] " before each line of instance i when several run; a tag of our own
    # would say it twice ("[1] [instance 1] ..."), so there is none.
    tag = ""
    print(f"{tag}{args.model} ({args.size}) batch {args.batch_size} {args.dtype} on {opt.path}"
          f" (requested {opt.report['requested_path']}): "
          f"{result['samples_per_s']:.2f} samples/s, median {result['ms_per_iter_median']:.2f} "
          f"ms per call over {calls} calls in {elapsed:.1f} s (build+warm-up {build_s:.1f} s)")
    if result["fusion_groups"] is not None:
        print(f"{tag}oneDNN fusion groups: {result['fusion_groups']} "
              f"({result['bf16_fusion_groups']} of them bf16)")
    print(f"{tag}pid {result['pid']}, affinity {result['affinity']}, torch threads "
          f"{result['threads']}, OMP_NUM_THREADS={result['omp_num_threads']}")
    if preloads:
        for entry, mapped in preloads.items():
            print(f"{tag}LD_PRELOAD {entry}: " + (f"mapped ({mapped})" if mapped else "NOT mapped"))
    else:
        print(f"{tag}LD_PRELOAD: none")
    for note in opt.report["notes"]:
        print(f"{tag}note: {note}")


if __name__ == "__main__":
    sys.exit(main())
