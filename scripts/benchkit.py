"""What the benchmark scripts share: is the machine quiet, median and spread, parser set-up.

The benchmarks time real runs on a shared machine (2 CPUs here), where one foreign busy
thread can make an OpenMP run many times slower. So each script measures the *foreign* CPU
load around its runs, the CPU time that went to anyone but us:

    foreign = machine busy time (user+nice+system+irq+softirq, all CPUs)
              - our own CPU time (this process, all its threads, and the children it has
                waited for: getrusage counts a child once it is reaped)
              + steal (time the hypervisor gave our virtual CPUs to other guests)

divided by the wall time of the window. The meter (``Load``, ``LoadWindow``, ``sample``) is
``cpulaunch.tools.tune.load``'s, re-exported here, so the benchmarks and ``cpulaunch tune`` measure
with one formula. A window is busy when that is above a threshold,
in percent of the whole machine (``os.cpu_count()`` CPUs, not only the ones this process
may use: a foreign thread on any CPU can stall a run that spans them).

Use (the scripts run as ``python scripts/X.py``, so scripts/ is ``sys.path[0]``)::

    import benchkit

    pre = benchkit.sample(0.5, top=4)        # 0.5 s idle, and the 4 busiest other processes
    window = benchkit.LoadWindow()
    run_the_workload()
    during = window.load()
    if benchkit.busy((pre, during), 10.0):
        print(benchkit.busy_warning("in round 1 (a)",
                                    f"others used {during.others_pct:.0f}%", pre.busiest))

Importing it puts this checkout first on ``sys.path`` (unless it is there), so the meter
and the cpulaunch the scripts import are this checkout's; nothing else runs at import,
prints or configures logging.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Iterable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cpulaunch.tools.tune.load import BUSIEST_MIN_PCT, Load, LoadWindow  # noqa: E402,F401
from cpulaunch.tools.tune.load import sample_load as sample  # noqa: E402,F401


def busy(loads: Iterable[Load], threshold: float) -> bool:
    """True when the foreign load (others + steal) of any of ``loads`` was above
    ``threshold`` percent of the machine: the figures measured then are not to be quoted."""
    return any(load.foreign_pct > threshold for load in loads)


def wait_quiet(threshold: float, max_wait: float, seconds: float = 0.5, top: int = 0) -> Load:
    """Sample ``seconds`` at a time until a sample is not busy (``threshold``: percent of the
    machine) or ``max_wait`` seconds have passed; returns the last sample, quiet or not.
    ``max_wait`` 0 takes exactly one sample."""
    deadline = time.monotonic() + max_wait
    load = sample(seconds, top)
    while busy([load], threshold) and time.monotonic() < deadline:
        load = sample(seconds, top)
    return load


def busy_warning(where: str, detail: str,
                 busiest: Iterable[tuple[float, int, str]] = ()) -> str:
    """The warning line for a busy window, the same shape in every script::

        "  warning: machine not quiet in round 2 (d): others used 48% before ...; "
        "load average 1.02; busiest: python3[812] 97%, git[90] 12%"

    where: which run ("in round 2 (d)", "before round 1A"); detail: the measured load in
    the script's terms; the load average is the 1-minute one.
    """
    who = ", ".join(f"{name}[{pid}] {pct:.0f}%" for pct, pid, name in busiest)
    return (f"  warning: machine not quiet {where}: {detail}; load average "
            f"{os.getloadavg()[0]:.2f}" + (f"; busiest: {who}" if who else ""))


def median(xs: Sequence[float]) -> float:
    """The median of ``xs``; NaN when there are none."""
    return statistics.median(xs) if xs else float("nan")


def spread(xs: Sequence[float]) -> float:
    """(max - min) / median of ``xs`` as a fraction (0.12 = 12%); NaN when there are none
    or the median is 0. ``[90, 100, 105] -> 0.15``."""
    med = median(xs)
    return (max(xs) - min(xs)) / med if xs and med else float("nan")


def parser(doc: str, quick_help: str) -> argparse.ArgumentParser:
    """The script's parser: described by the first paragraph of ``doc`` (its docstring),
    with ``--quick`` (a smoke run whose figures mean little) explained by ``quick_help``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=quick_help)
    return p


def add_model_size(p: argparse.ArgumentParser, default: str = "full", quick: str = "small") -> None:
    """``--model`` cnn|bert (default cnn) and ``--size`` full|small of examples/models.py;
    ``--size`` stays None when not given: the script picks ``default``, or ``quick`` with
    --quick, and the help says which (pass the script's own two)."""
    p.add_argument("--model", choices=("cnn", "bert"), default="cnn", help="default cnn")
    p.add_argument("--size", choices=("full", "small"), default=None,
                   help=f"default {default}" + (f" ({quick} with --quick)" if quick != default else ""))


#: Variables a benchmark's children must not inherit from the shell that ran it.
CLEAN_VARS = ("OMP_NUM_THREADS", "LD_PRELOAD", "KMP_AFFINITY", "KMP_BLOCKTIME", "MALLOC_CONF",
              "OMP_PROC_BIND", "OMP_PLACES")


def child_env() -> dict:
    """This environment without CLEAN_VARS and CPULAUNCH_* variables, with the checkout
    first on PYTHONPATH (so the children time this checkout's cpulaunch)."""
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_VARS and not k.startswith("CPULAUNCH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def time_once(argv: list, env: dict) -> float:
    """Wall seconds of one run; raises if it fails (a benchmark of a failure means nothing)."""
    t = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n"
                           f"{proc.stderr.decode(errors='replace')[-2000:]}")
    return dt


def run_bounded(argv: list, env: dict, timeout: float, grace: float = 30.0, cwd=None) -> tuple:
    """Run ``argv`` to its end or to ``timeout`` seconds -> (return code, stdout, stderr,
    stopped: True when the deadline stopped it). A late run gets SIGTERM (cpulaunch forwards it to its
    instances and kills them after its grace period), then SIGKILL after ``grace`` seconds; so
    does the run when this script is interrupted (SIGTERM, Ctrl-C), and the interruption is then
    raised again: no run outlives the script."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        return proc.returncode, out, err + f"\n(stopped after {timeout:.0f} s)", True
    except BaseException:  # SIGTERM (exit_on_sigterm) or Ctrl-C here: the run ends with us, not after
        proc.terminate()
        try:
            proc.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise


def exit_on_sigterm() -> None:
    """Make SIGTERM (``kill PID``, or tests/test_docs_commands.py stopping a long benchmark)
    end the script the way Ctrl-C does: SystemExit(143) is raised in the main thread, so the
    script's ``finally`` blocks and exit handlers run, and the scratch folders and guests it
    made are removed (killed outright, each bench_startup.py run left its 8192-CPU tree in
    /dev/shm: 83,000 inodes, and this machine's /dev/shm ran out of inodes after 37 such
    runs). Call it first thing in ``main()``; never at import."""
    def _exit(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
