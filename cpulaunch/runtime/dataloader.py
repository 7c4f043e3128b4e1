"""DataLoader workers on the CPUs cpulaunch set aside for them.

``cpulaunch --dataloader-workers K`` reserves cores of each instance (or DDP rank) for data
loading, keeps them out of OMP_NUM_THREADS and the OpenMP CPUs, and tells the program
which ones through two environment variables:

- ``CPULAUNCH_DATALOADER_CPUS``: the reserved logical CPU ids, as a cpulist (``"6-7"``);
- ``CPULAUNCH_DATALOADER_NUM_WORKERS``: how many DataLoader workers to start.

A script gains it in one line::

    from cpulaunch.torch_utils import dataloader_kwargs
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, **dataloader_kwargs())

Each worker then runs on its own reserved CPU with one torch thread, instead of competing
with the OpenMP threads for the compute cores (one foreign busy thread made a 2-thread
OpenMP run 20-35x slower on the development machine).

This module imports torch: programs import it, the launcher never does.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, Mapping, Optional

import torch

from cpulaunch import cpulist, envvars
from cpulaunch.errors import CpulaunchError

__all__ = ["DATALOADER_CPUS_ENV", "DATALOADER_WORKERS_ENV", "DataloaderEnvError",
           "dataloader_kwargs", "reserved_cpus", "worker_cpu", "worker_init_fn"]

#: cpulist of the logical CPUs reserved for this instance's DataLoader workers.
DATALOADER_CPUS_ENV = envvars.DATALOADER_CPUS
#: Number of DataLoader workers cpulaunch planned for this instance.
DATALOADER_WORKERS_ENV = envvars.DATALOADER_WORKERS


class DataloaderEnvError(CpulaunchError, ValueError):
    """A DataLoader variable cpulaunch sets holds something unusable, or names a CPU this
    process may not use."""


def worker_cpu(worker_id: int, cpus: Iterable[int]) -> int:
    """The reserved CPU of DataLoader worker ``worker_id``: the rule of this module.

    Worker i gets the i-th lowest reserved CPU, wrapping around (``i mod len(cpus)``):
    with as many CPUs as workers (what ``--dataloader-workers`` plans) each worker has a
    CPU of its own; with fewer CPUs, workers share them in turn; with more, the highest
    CPUs stay unused. Examples: ``worker_cpu(1, {6, 7})`` -> 7; ``worker_cpu(2, {6, 7})``
    -> 6.

    Args:
        worker_id: the DataLoader worker index, 0 .. num_workers - 1 (what torch passes to
            ``worker_init_fn``).
        cpus: logical CPU ids as in /sys/devices/system/cpu/cpuN (not core ids).

    Raises:
        DataloaderEnvError: ``cpus`` is empty or ``worker_id`` is negative.
    """
    ordered = sorted(cpus)
    if not ordered:
        raise DataloaderEnvError(f"no CPU reserved for DataLoader worker {worker_id} "
                                 f"({DATALOADER_CPUS_ENV} is empty)")
    if worker_id < 0:
        raise DataloaderEnvError(f"DataLoader worker id must be >= 0, got {worker_id}")
    return ordered[worker_id % len(ordered)]


def reserved_cpus(environ: Optional[Mapping[str, str]] = None) -> frozenset[int]:
    """The CPUs in ``$CPULAUNCH_DATALOADER_CPUS`` (empty when unset or blank).

    Args:
        environ: the environment to read (default ``os.environ``).

    Returns:
        frozenset of logical CPU ids, e.g. ``"6-7"`` -> ``{6, 7}``.

    Raises:
        DataloaderEnvError: the value is not a cpulist (parsed by :func:`cpulaunch.cpulist.parse`).
    """
    text = (os.environ if environ is None else environ).get(DATALOADER_CPUS_ENV, "")
    try:
        return cpulist.parse(text)
    except cpulist.CpulistError as exc:
        raise DataloaderEnvError(f"{DATALOADER_CPUS_ENV} is {text!r}, not a cpulist such as "
                                 f"'6-7' ({exc})") from None


def worker_init_fn(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: pin this worker to its reserved CPU, one torch thread.

    Runs inside each worker process when it starts (torch.utils.data.DataLoader calls
    ``worker_init_fn(worker_id)`` there). It sets the worker's affinity with
    ``os.sched_setaffinity(0, {cpu})``, ``cpu`` from :func:`worker_cpu` over
    ``$CPULAUNCH_DATALOADER_CPUS``, and ``torch.set_num_threads(1)`` (DataLoader's worker
    loop already does this in torch 2.13, torch/utils/data/_utils/worker.py; repeated so
    the rule does not depend on it): a worker's ops then run on its CPU and do not start an
    OpenMP team on the compute cores. With the variable unset or empty the affinity is
    left as inherited and only the thread count is set.

    Raises:
        DataloaderEnvError: the variable is not a cpulist, or the worker's CPU is not one
            this process may use (a cgroup or the parent's binding excludes it).
    """
    cpus = reserved_cpus()
    if cpus:
        cpu = worker_cpu(worker_id, cpus)
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError as exc:
            raise DataloaderEnvError(
                f"DataLoader worker {worker_id} cannot run on CPU {cpu} "
                f"({DATALOADER_CPUS_ENV}={cpulist.format(cpus)}): {exc.strerror}; this "
                f"process may use CPUs {cpulist.format(os.sched_getaffinity(0))}") from None
    torch.set_num_threads(1)


def dataloader_kwargs(environ: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """DataLoader keyword arguments for the workers cpulaunch planned.

    The PyTorch performance tuning guide's first advice for data loading is
    ``num_workers > 0`` (load asynchronously, beside the model); ``--dataloader-workers``
    plans the workers and their CPUs, and this returns:

    - ``num_workers``: ``int($CPULAUNCH_DATALOADER_NUM_WORKERS)``, 0 when unset or blank;
    - ``worker_init_fn``: :func:`worker_init_fn`, only when ``num_workers > 0``;
    - ``persistent_workers``: ``num_workers > 0`` (workers, and so their pinning, live for
      the whole run instead of being started again every epoch; DataLoader refuses True
      with 0 workers).

    Args:
        environ: the environment to read (default ``os.environ``).

    Returns:
        e.g. ``{"num_workers": 2, "worker_init_fn": worker_init_fn,
        "persistent_workers": True}``, or ``{"num_workers": 0, "persistent_workers": False}``.

    Raises:
        DataloaderEnvError: the variable is not a whole number >= 0.
    """
    text = (os.environ if environ is None else environ).get(DATALOADER_WORKERS_ENV, "").strip()
    if not text:
        workers = 0
    elif text.isascii() and text.isdigit():
        workers = int(text)
    else:
        raise DataloaderEnvError(f"{DATALOADER_WORKERS_ENV} is {text!r}; expected a whole "
                                 f"number >= 0 (cpulaunch --dataloader-workers sets it)")
    kwargs: Dict[str, Any] = {"num_workers": workers, "persistent_workers": workers > 0}
    if workers:
        kwargs["worker_init_fn"] = worker_init_fn
    return kwargs
