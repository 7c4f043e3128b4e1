#!/usr/bin/env python3
"""Measure --share-host job starts under the attacks of issue 39, at the issue's sizes:
each victim's exit code, wall time and peak memory (ru_maxrss of the child, from wait4),
against the same start with nobody else in the folder; prints JSON. The targets: every
victim exits 0, within 2x of the quiet start's time, under 100 MB.

Root only: the attackers run as ``cpulaunch-u1`` and the victims as ``cpulaunch-u2`` (the
users tests/hostusers.py makes), in a fresh sticky folder under /tmp used as
``--lease-dir`` (the host's own folders read the same way). The attacks
(tests/share_attacks.py):

* ``ranges-10``, ``ranges-40``, ``ranges-160``: that many files of the attacker's, each
  write-locked over the CPU bytes 2 .. 65535 (before: 147 MB, 503 MB, 2.0 GB per start);
* ``many``: 8 files of 4,096 locks each in the lease window (before: 4.1 s per start);
* ``dead``: 20,000 lease files nobody holds (before: 0.7 s);
* ``flicker``: inotify flicker (the planned CPUs, the pending byte and ticket 1, 30 ms,
  whenever a lease file appears) with 1,500 slowing locks, against 3 ``fail`` and 2
  ``wait`` victims (before: 5 of 5 failed after 6-7 s).

    python scripts/attack_share_host.py                 # every attack, 3 victims each
    python scripts/attack_share_host.py --only flicker --rounds 5

Run it on a quiet machine (``uptime`` load under 0.5): the figures are wall times.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchkit

sys.path.insert(0, str(benchkit.REPO / "tests"))
import hostusers  # noqa: E402  (the tests' users)

ATTACKS = benchkit.REPO / "tests" / "share_attacks.py"
SIZES = {"ranges-10": ("ranges", 10), "ranges-40": ("ranges", 40), "ranges-160": ("ranges", 160),
         "many": ("many", 8, 4096), "dead": ("dead", 20000), "flicker": ("flicker", 1, 1500)}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def victim(folder: Path, user: str, mode: str) -> dict:
    python, extra = hostusers.user_python(user)
    argv = [python, "-m", "cpulaunch", f"--share-host={mode}", "--lease-dir", str(folder), "--allocator", "default",
            "--bind", "affinity", "--ninstances", "1", "--ncores-per-instance", "1", python, "-c", "pass"]
    env = {**benchkit.child_env(), **extra}
    with tempfile.TemporaryFile() as err:
        t = time.monotonic()
        proc = subprocess.Popen(hostusers.as_user(user, argv), cwd=benchkit.REPO, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().decode(errors="replace")
    return {"code": proc.returncode, "seconds": round(seconds, 3), "mb": round(usage.ru_maxrss / 1024, 1),
            "stderr": text.strip().splitlines()[-1:] if proc.returncode else []}


def attack(user: str, kind: tuple, folder: Path, key_base: int) -> subprocess.Popen:
    python, extra = hostusers.user_python(user)
    argv = [python, str(ATTACKS), kind[0], str(folder), str(key_base), *map(str, kind[1:])]
    proc = subprocess.Popen(hostusers.as_user(user, argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **extra})
    line = proc.stdout.readline()
    if line != "ready\n":
        proc.kill()
        raise SystemExit(f"attacker {kind} did not start: {proc.communicate()}")
    return proc


def main() -> int:
    benchkit.exit_on_sigterm()
    p = benchkit.parser(__doc__, "1 victim per attack, smaller sizes")
    p.add_argument("--rounds", type=int, default=3, help="victims per attack (flicker: 5, 3 fail and 2 wait)")
    p.add_argument("--only", default="", help="comma-separated attacks (default: all)")
    args = p.parse_args()
    if hostusers.missing():
        print(f"needs: {hostusers.missing()}", file=sys.stderr)
        return 2
    attacker, target = hostusers.ensure_users()
    from cpulaunch.machine import lease

    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))  # the attacker's 160 files, inherited
    names = [n for n in SIZES if not args.only or n in args.only.split(",")]
    load = benchkit.LoadWindow()
    load_before = os.getloadavg()[0]
    folder = Path(tempfile.mkdtemp(prefix="cpulaunch-attack-", dir="/tmp"))
    folder.chmod(0o1777)
    base = lease._key_of(str(folder)) << 44
    results: dict = {}
    try:
        quiet = [victim(folder, target, "fail") for _ in range(max(args.rounds, 3))]
        q = benchkit.median([r["seconds"] for r in quiet])
        results["quiet"] = {"seconds": q, "mb": max(r["mb"] for r in quiet), "codes": [r["code"] for r in quiet]}
        for name in names:
            kind = SIZES[name]
            if args.quick and kind[0] != "flicker":
                kind = (kind[0], *(max(1, s // 4) for s in kind[1:]))
            proc = attack(attacker, kind, folder, base)
            try:
                modes = ["fail", "fail", "fail", "wait", "wait"] if kind[0] == "flicker" else ["fail"] * args.rounds
                runs = [victim(folder, target, m) for m in (modes[:1] if args.quick else modes)]
            finally:
                out, _ = proc.communicate("", timeout=120)
            secs = [r["seconds"] for r in runs]
            results[name] = {"attack": list(kind), "codes": [r["code"] for r in runs], "seconds": secs,
                             "median_vs_quiet": round(benchkit.median(secs) / q, 2),
                             "max_vs_quiet": round(max(secs) / q, 2), "mb_max": max(r["mb"] for r in runs),
                             "errors": [r["stderr"] for r in runs if r["code"]], "attacker": out.strip()}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ok = all(r["codes"] == [0] * len(r["codes"]) and r["max_vs_quiet"] <= 2 and r["mb_max"] < 100
             for n, r in results.items() if n != "quiet")
    print(json.dumps({"cpu_model": cpu_model(), "cpus": len(os.sched_getaffinity(0)), "load_before": load_before,
                      "foreign_load_pct": round(load.load().foreign_pct, 1), "targets_met": ok,
                      "results": results}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
