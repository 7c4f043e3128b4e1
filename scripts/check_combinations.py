"""The release check of issue 31's property test: many more combinations of options than CI
runs, each seed a different derandomized draw.

    python scripts/check_combinations.py                 # 3 seeds x 2000 combinations
    python scripts/check_combinations.py --seeds 1 --examples 500

Runs ``tests/test_option_combinations.py::test_every_combination_plans_or_says_why`` with
``CPULAUNCH_COMBINATIONS`` and ``CPULAUNCH_COMBINATIONS_SEED`` set, one seed after another,
and prints each seed's result and time; exits 1 when any seed finds a combination that
neither plans nor fails with one line naming what the user gave.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="how many seeds (1, 2, ...)")
    ap.add_argument("--examples", type=int, default=2000, help="combinations per seed")
    args = ap.parse_args(argv)
    failed = 0
    for s in range(1, args.seeds + 1):
        env = dict(os.environ, CPULAUNCH_COMBINATIONS=str(args.examples), CPULAUNCH_COMBINATIONS_SEED=str(s))
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                               "tests/test_option_combinations.py::test_every_combination_plans_or_says_why"],
                              cwd=REPO, env=env, capture_output=True, text=True)
        took = time.monotonic() - start
        verdict = "ok" if proc.returncode == 0 else "FAILED"
        print(f"seed {s}: {args.examples} combinations: {verdict} in {took:.0f} s", flush=True)
        if proc.returncode:
            failed += 1
            print(proc.stdout[-4000:], flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
