"""The machine's foreign load: the meter of ``cpulaunch tune``, of the benchmarks in
``scripts/`` (through ``cpulaunch.tools.tune.load`` and ``scripts/benchkit.py``) and of
``cpulaunch.inference``'s ``auto`` (which flags a timing taken while the machine was busy):
machine busy time minus this process's own and its reaped children's, as a share of one
CPU, from psutil or ``/proc/stat``.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from typing import Iterable

__all__ = ["BUSY_THRESHOLD_PCT", "Load", "parse_proc_stat", "LoadWindow"]

# --------------------------------------------------------------------------- the load meter
#
# The foreign-load meter of tune, of scripts/benchkit.py and of inference's auto:
#
#     foreign = machine busy time (user+nice+system+irq+softirq, all CPUs)
#               - our own CPU time (this process, all its threads, and the children it has
#                 waited for: getrusage counts a child once it is reaped)
#               + steal (time the hypervisor gave our virtual CPUs to other guests)
#
# divided by the wall time of the window, in percent of the whole machine (os.cpu_count()
# CPUs, not only the ones this process may use: a foreign thread on any CPU can stall a
# run that spans them).


#: Foreign load, percent of the whole machine, above which a timing is flagged busy
#: (``cpulaunch tune --busy-threshold``'s default; ``cpulaunch.inference``'s ``auto``).
BUSY_THRESHOLD_PCT = 10.0
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
