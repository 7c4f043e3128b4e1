"""What the benchmark scripts share: is the machine quiet, median and spread, parser set-up.

The benchmarks time real runs on a shared machine (2 CPUs here), where one foreign busy
thread can make an OpenMP run many times slower. So each script measures the *foreign* CPU
load around its runs, the CPU time that went to anyone but us:

    foreign = machine busy time (user+nice+system+irq+softirq, all CPUs)
              - our own CPU time (this process, all its threads, and the children it has
                waited for: getrusage counts a child once it is reaped)
              + steal (time the hypervisor gave our virtual CPUs to other guests)

divided by the wall time of the window. A window is busy when that is above a threshold,
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

Nothing here runs at import, prints or configures logging.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterable, Sequence

import psutil

#: A process must use at least this percent of one CPU to be named among the busiest.
BUSIEST_MIN_PCT = 5.0


@dataclass(frozen=True)
class Load:
    """The CPU time others took from the machine during one window.

    others: CPUs' worth (CPU seconds / wall seconds; 1.0 = one CPU kept busy throughout)
        of the whole machine's busy time minus ours; steal not included.
    steal: CPUs' worth of steal time.
    seconds: wall-clock length of the window.
    ncpu: logical CPUs of the machine (``os.cpu_count()``), the whole the percentages are of.
    busiest: ``(percent of one CPU, pid, name)`` of the busiest other processes, busiest
        first, as top shows them; empty unless asked for (``sample(..., top=N)``).
    """

    others: float
    steal: float
    seconds: float
    ncpu: int
    busiest: tuple[tuple[float, int, str], ...] = ()

    @property
    def foreign(self) -> float:
        """CPUs' worth of foreign load: others plus steal."""
        return self.others + self.steal

    @property
    def foreign_pct(self) -> float:
        """Foreign load, percent of the machine (what ``busy`` compares)."""
        return 100 * self.foreign / self.ncpu

    @property
    def others_pct(self) -> float:
        """Other processes' CPU time, percent of the machine (steal not included)."""
        return 100 * self.others / self.ncpu

    @property
    def steal_pct(self) -> float:
        """Steal time, percent of the machine."""
        return 100 * self.steal / self.ncpu


def _machine_times() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since boot, summed over all CPUs
    (psutil reads /proc/stat on Linux; a field the platform lacks counts 0)."""
    t = psutil.cpu_times()
    busy = sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq"))
    return busy, getattr(t, "steal", 0.0)


def _own_cpu() -> float:
    """CPU seconds of this process (every thread) and of its waited-for descendants
    (numactl, python, a launcher's instances: counted once they are reaped)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class LoadWindow:
    """A window that opens when made; ``load()`` is the foreign load since then.

    Wrap the timed run in it: children the run started and waited for count as ours, so
    only other processes' time (and steal) is left. ``load()`` may be read more than once.
    """

    def __init__(self) -> None:
        self._wall = time.monotonic()
        self._busy, self._steal = _machine_times()
        self._own = _own_cpu()

    def load(self, busiest: Iterable[tuple[float, int, str]] = ()) -> Load:
        """The foreign load since the window opened; ``busiest`` is passed through."""
        wall = max(1e-6, time.monotonic() - self._wall)
        busy, steal = _machine_times()
        others = max(0.0, (busy - self._busy) - (_own_cpu() - self._own))
        return Load(others=others / wall, steal=max(0.0, steal - self._steal) / wall,
                    seconds=wall, ncpu=os.cpu_count() or 1, busiest=tuple(busiest))


def _busiest(procs: list, top: int) -> list[tuple[float, int, str]]:
    """The ``top`` busiest of ``procs`` (psutil.Process, primed by cpu_percent(None)) since
    they were primed, other than this process and under BUSIEST_MIN_PCT left out."""
    found = []
    for p in procs:
        try:
            pct = p.cpu_percent(None)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if pct >= BUSIEST_MIN_PCT and p.pid != os.getpid():
            found.append((pct, p.pid, p.info["name"]))
    return sorted(found, reverse=True)[:top]


def sample(seconds: float, top: int = 0) -> Load:
    """The foreign load over the next ``seconds`` while this process only waits (a check
    before a run); with ``top`` > 0 also the ``top`` busiest other processes."""
    window = LoadWindow()
    procs = []
    if top:
        for p in psutil.process_iter(["pid", "name"]):
            try:
                p.cpu_percent(None)  # primes the per-process counter
                procs.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    time.sleep(seconds)
    return window.load(_busiest(procs, top) if top else ())


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


def add_model_size(p: argparse.ArgumentParser) -> None:
    """``--model`` cnn|bert (default cnn) and ``--size`` full|small of examples/models.py;
    ``--size`` stays None when not given: the script picks (full; small with --quick)."""
    p.add_argument("--model", choices=("cnn", "bert"), default="cnn")
    p.add_argument("--size", choices=("full", "small"), default=None,
                   help="default full (small with --quick)")


#: Variables a benchmark's children must not inherit from the shell that ran it.
CLEAN_VARS = ("OMP_NUM_THREADS", "LD_PRELOAD", "KMP_AFFINITY", "KMP_BLOCKTIME", "MALLOC_CONF",
              "OMP_PROC_BIND", "OMP_PLACES")
REPO = Path(__file__).resolve().parents[1]


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
