"""tune's foreign-load meter (``scripts/benchkit.py`` imports it too): the meter itself
(:class:`Load`, :class:`LoadWindow`: machine busy time minus this process's own and its
reaped children's) is :mod:`cpulaunch.machine.load`'s, shared with
``cpulaunch.inference``'s ``auto``, and re-exported here; this module adds the sample
before a trial, the busiest processes and tune's :class:`Meter`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

from cpulaunch.machine.load import (  # noqa: F401 - re-exported (tune, scripts/benchkit.py, tests)
    _BUSY_FIELDS,
    BUSY_THRESHOLD_PCT,
    Load,
    LoadWindow,
    _machine_times,
    _own_cpu,
    _psutil,
    parse_proc_stat,
)

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


# --------------------------------------------------------------------------- the busiest processes

#: A process must use at least this percent of one CPU to be named among the busiest.
BUSIEST_MIN_PCT = 5.0


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
