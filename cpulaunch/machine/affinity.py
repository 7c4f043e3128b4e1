"""Set the CPU affinity of running processes: every thread, not only the main one.

sched_setaffinity(2) takes a thread id: called with a process id it moves that process's
main thread only, and the threads the process already started (an OpenMP pool, a gloo
worker, Ray's core-worker threads) keep their mask. So each thread listed in
``/proc/PID/task`` is moved. A thread started while the list is walked inherits the mask
of the thread that started it, which may not be moved yet, so the list is walked again
until a walk finds no thread it had not moved (at most :data:`MAX_WALKS` walks).

Used by ``--follow-cpuset`` (:mod:`cpulaunch.launch.follow`: every process of an
instance's process group) and by the Ray Train binding (:mod:`cpulaunch.runtime.ray`:
the worker's own process). Reads go through the probe's bounded reader.
"""

from __future__ import annotations

import os
from typing import Iterable, Union

from cpulaunch.machine.files import FileReader
from cpulaunch.records import Record

__all__ = ["Pinned", "pin_process", "pin_group", "group_members", "MAX_WALKS"]

#: Walks of ``/proc/PID/task`` before giving up on threads that keep appearing.
MAX_WALKS = 5


class Pinned(Record):
    """What a pin did.

    Attributes:
        threads: thread ids moved to the CPUs (each once), ascending.
        problems: why a thread or process could not be moved, one line each
            (``"thread 812: Invalid argument"``: the CPUs are outside its cpuset); a
            thread that exited meanwhile is not a problem.
    """

    threads: tuple[int, ...]
    problems: tuple[str, ...] = ()


def pin_process(pid: int, cpus: Iterable[int], root: Union[str, os.PathLike] = "/") -> Pinned:
    """Move every thread of process ``pid`` to the logical CPUs ``cpus`` (ids as in
    /sys/devices/system/cpu/cpuN). ``pid`` 0 is this process.

    Raises:
        ValueError: ``cpus`` is empty.
    """
    return pin_group_members([os.getpid() if pid == 0 else pid], cpus, root)


def pin_group(pgid: int, cpus: Iterable[int], root: Union[str, os.PathLike] = "/") -> Pinned:
    """Move every thread of every process in process group ``pgid`` (an instance started
    in a session of its own: its DataLoader workers and helpers too) to ``cpus``.

    Raises:
        ValueError: ``cpus`` is empty.
    """
    return pin_group_members(group_members(pgid, root), cpus, root)


def group_members(pgid: int, root: Union[str, os.PathLike] = "/") -> list[int]:
    """Process ids whose process group is ``pgid`` (field 5 of ``/proc/PID/stat``), the
    leader first."""
    fs = FileReader(root)
    members = []
    for entry in fs.listdir("proc"):
        if not entry.isdigit():
            continue
        text = fs.read(f"proc/{entry}/stat", strict=False) or ""
        fields = text[text.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[2] == str(pgid):
            members.append(int(entry))
    return sorted(members, key=lambda p: (p != pgid, p))


def pin_group_members(pids: Iterable[int], cpus: Iterable[int], root: Union[str, os.PathLike] = "/") -> Pinned:
    """Move every thread of each process in ``pids`` to ``cpus`` (see the module's rule
    for threads that appear meanwhile).

    Raises:
        ValueError: ``cpus`` is empty.
    """
    mask = frozenset(int(c) for c in cpus)
    if not mask:
        raise ValueError("no CPU to pin to")
    fs = FileReader(root)
    tried: set = set()
    moved: list = []
    problems: list = []
    for pid in pids:
        for _ in range(MAX_WALKS):
            new = [int(t) for t in fs.listdir(f"proc/{pid}/task") if t.isdigit() and int(t) not in tried]
            if not new:
                break
            for tid in new:
                tried.add(tid)
                try:
                    os.sched_setaffinity(tid, mask)
                except ProcessLookupError:
                    continue  # exited meanwhile
                except OSError as exc:
                    problems.append(f"thread {tid} of pid {pid}: {exc.strerror or exc}")
                    continue
                moved.append(tid)
    return Pinned(tuple(sorted(moved)), tuple(problems))
