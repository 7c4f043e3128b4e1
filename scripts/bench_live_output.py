#!/usr/bin/env python3
"""How long what an instance prints without a newline takes to reach the console: a
``\\r`` progress bar under two instances, and a prompt, relayed by ``cpulaunch
--ninstances 2 --bind none`` (with and without ``--log-dir``), the console a pipe this
script reads as it comes.

Each program writes ``--updates`` (40) states, ``\\r<time printed> <n>%`` for the bar or
``<time printed> ready? `` followed by a pause of ``--pause`` s (0.1) for the prompt; the
script notes when each state arrived, and prints the latency (arrival - time printed)
median, 95th percentile and maximum per case, in milliseconds, with the foreign load.

    python scripts/bench_live_output.py
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time

import benchkit

PROGRAM = r"""
import sys, time
kind, n, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
for i in range(n):
    if kind == "bar":
        sys.stdout.write(f"\r{time.time():.6f} {100 * i // n:3d}%")
    else:
        sys.stdout.write(f"{time.time():.6f} ready? ")
    sys.stdout.flush()
    time.sleep(pause)
    if kind == "prompt":
        sys.stdout.write("y\n")
sys.stdout.write("\n")
"""
STAMP = re.compile(rb"\[(\d)\]\+? (\d+\.\d{6}) ")


def one_case(kind: str, log_dir: bool, args) -> list:
    argv = [sys.executable, "-m", "cpulaunch", "--ninstances", "2", "--bind", "none", "--allocator", "default"]
    with tempfile.TemporaryDirectory() as tmp:
        if log_dir:
            argv += ["--log-dir", tmp]
        argv += [sys.executable, "-c", PROGRAM, kind, str(args.updates), str(args.pause)]
        env = {k: v for k, v in benchkit.child_env().items() if k != "PYTHONUNBUFFERED"}
        proc = subprocess.Popen(argv, cwd=benchkit.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        latencies, buf = [], b""
        while True:
            select.select([proc.stdout], [], [])
            chunk = os.read(proc.stdout.fileno(), 65536)
            now = time.time()
            if not chunk:
                break
            buf += chunk
            for m in STAMP.finditer(buf):
                latencies.append(now - float(m.group(2)))
            buf = buf[buf.rfind(b" ") + 1:] if STAMP.search(buf) else buf[-64:]
        proc.wait()
    return latencies


def summary(xs: list) -> dict:
    xs = sorted(1000 * x for x in xs)
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "median_ms": round(benchkit.median(xs), 1), "p95_ms": round(xs[int(0.95 * (len(xs) - 1))], 1),
            "max_ms": round(xs[-1], 1)}


def main() -> int:
    benchkit.exit_on_sigterm()
    p = benchkit.parser(__doc__, "10 updates per case")
    p.add_argument("--updates", type=int, default=40)
    p.add_argument("--pause", type=float, default=0.1)
    args = p.parse_args()
    if args.quick:
        args.updates = 10
    window = benchkit.LoadWindow()
    out = {}
    for kind in ("bar", "prompt"):
        for log_dir in (False, True):
            out[f"{kind}{' --log-dir' if log_dir else ''}"] = summary(one_case(kind, log_dir, args))
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(json.dumps({"cases": out, "cpu_model": model, "foreign_load_pct": round(window.load().foreign_pct, 1)},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
