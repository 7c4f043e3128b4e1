"""The machine's foreign load, measured by the package itself (``scripts/benchkit.py``
imports it too): machine busy time minus this process's own and its reaped children's,
as a share of one CPU, from psutil or ``/proc/stat``.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from typing import Callable, Iterable

__all__ = [
    "BUSIEST_MIN_PCT",
    "Load",
    "parse_proc_stat",
    "LoadWindow",
    "sample_load",
    "LoadReading",
    "Meter",
    "load_meter",
]


# --------------------------------------------------------------------------- the load meter
#
# The foreign-load meter of tune and of scripts/benchkit.py (which imports it from here):
#
#     foreign = machine busy time (user+nice+system+irq+softirq, all CPUs)
#               - our own CPU time (this process, all its threads, and the children it has
#                 waited for: getrusage counts a child once it is reaped)
#               + steal (time the hypervisor gave our virtual CPUs to other guests)
#
# divided by the wall time of the window, in percent of the whole machine (os.cpu_count()
# CPUs, not only the ones this process may use: a foreign thread on any CPU can stall a
# run that spans them).

#: A process must use at least this percent of one CPU to be named among the busiest.
BUSIEST_MIN_PCT = 5.0
#: /proc/stat fields (proc(5)) that count as busy time.
_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")


@dataclass(frozen=True)
class Load:
    """The CPU time others took from the machine during one window.

    Attributes:
        others: CPUs' worth (CPU seconds / wall seconds; 1.0 = one CPU kept busy
            throughout) of the whole machine's busy time minus ours; steal not included.
        steal: CPUs' worth of steal time.
        seconds: wall-clock length of the window.
        ncpu: logical CPUs of the machine (``os.cpu_count()``), the whole the percentages
            are of.
        busiest: ``(percent of one CPU, pid, name)`` of the busiest other processes,
            busiest first, as top shows them; empty unless asked for (``sample(..., top=N)``).
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
        """Foreign load, percent of the machine (what a busy threshold is compared with)."""
        return 100 * self.foreign / self.ncpu

    @property
    def others_pct(self) -> float:
        """Other processes' CPU time, percent of the machine (steal not included)."""
        return 100 * self.others / self.ncpu

    @property
    def steal_pct(self) -> float:
        """Steal time, percent of the machine."""
        return 100 * self.steal / self.ncpu


def parse_proc_stat(text: str, ticks_per_s: float) -> tuple[float, float]:
    """The aggregate ``cpu`` line of /proc/stat (proc(5)) -> ``(busy, steal)`` CPU seconds
    since boot, all CPUs summed; busy = user + nice + system + irq + softirq.

    ``"cpu  100 0 50 900 0 5 5 20 0 0"`` at 100 ticks/s -> ``(1.6, 0.2)``.

    Raises:
        ValueError: no aggregate ``cpu`` line, or a field that is not a number.
    """
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            v = [int(x) for x in parts[1:]] + [0] * 8
            busy = v[0] + v[1] + v[2] + v[5] + v[6]
            return busy / ticks_per_s, v[7] / ticks_per_s
    raise ValueError("no aggregate cpu line in /proc/stat")


def _psutil():
    try:
        import psutil
    except ImportError:
        return None
    return psutil


def _machine_times() -> tuple:
    """``(busy, steal)`` CPU seconds of the whole machine since boot, summed over all CPUs:
    psutil's ``cpu_times()`` (the ``tune`` extra; on Linux it reads /proc/stat), else
    /proc/stat through the probe's bounded reader. A field the platform lacks counts 0."""
    psutil = _psutil()
    if psutil is not None:
        t = psutil.cpu_times()
        return sum(getattr(t, f, 0.0) for f in _BUSY_FIELDS), getattr(t, "steal", 0.0)
    from cpulaunch.machine import files

    return parse_proc_stat(files.FileReader("/").read("proc/stat") or "", float(os.sysconf("SC_CLK_TCK")))


def _own_cpu() -> float:
    """CPU seconds of this process (every thread) and of its waited-for descendants
    (trials, numactl, a launcher's instances: counted once they are reaped)."""
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


def _busiest(psutil, procs: list, top: int) -> list:
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


def sample_load(seconds: float, top: int = 0) -> Load:
    """The foreign load over the next ``seconds`` while this process only waits (a check
    before a run); with ``top`` > 0 also the ``top`` busiest other processes (psutil only:
    none without it)."""
    window = LoadWindow()
    psutil = _psutil() if top else None
    procs = []
    if psutil is not None:
        for p in psutil.process_iter(["pid", "name"]):
            try:
                p.cpu_percent(None)  # primes the per-process counter
                procs.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    time.sleep(seconds)
    return window.load(_busiest(psutil, procs, top) if psutil is not None else ())


@dataclass(frozen=True)
class LoadReading:
    """What a meter reports to :class:`Tuner`: the foreign CPU load over a window in
    percent of the whole machine (``os.cpu_count()`` CPUs); ``busiest``: ``(percent of one
    CPU, pid, name)`` of the busiest other processes when known."""

    foreign_pct: float
    busiest: tuple[tuple[float, int, str], ...] = ()


class Meter:
    """tune's foreign-load meter (:class:`LoadWindow`, :func:`sample_load`).

    The meter protocol, which :class:`Tuner`'s ``meter`` parameter takes (tests inject
    readings through it): ``name`` (recorded as each trial's ``load.meter``),
    ``sample(seconds) -> LoadReading`` (the load while tune waits, before a trial) and
    ``window() -> callable`` (opens a window; the callable returns the
    :class:`LoadReading` since then).
    """

    def __init__(self) -> None:
        #: "psutil", or "proc-stat" when psutil is not installed (no busiest processes then).
        self.name = "psutil" if _psutil() is not None else "proc-stat"

    def sample(self, seconds: float) -> LoadReading:
        load = sample_load(seconds, top=3)
        return LoadReading(load.foreign_pct, tuple(load.busiest))

    def window(self) -> Callable[[], LoadReading]:
        w = LoadWindow()
        return lambda: LoadReading(w.load().foreign_pct)


def load_meter() -> Meter:
    """The foreign-load meter tune uses by default (:class:`Meter`): code of this
    package, with psutil when installed (the ``tune`` extra)."""
    return Meter()
