"""cgroup v1 children for tests that need a real CPU quota or cpuset (not collected by pytest).

Measured on this project's machine (Debian 12, Linux 6.1): cgroups are v1 there, with the
``cpu`` and ``cpuset`` controllers mounted at ``/sys/fs/cgroup/cpu`` and
``/sys/fs/cgroup/cpuset``; root can make a child folder, write its ``cpu.cfs_quota_us``
or ``cpuset.cpus``/``cpuset.mems``, and move a process in by writing its PID to the
child's ``cgroup.procs``. A cpuset changed under a running process changes that
process's affinity at once (docs/guide/placement.md, "CPU sets that change under a job").

:func:`v1_child` makes such a child with a unique name and removes it afterwards (its
processes moved back to the parent first, so that a test that failed midway never leaves
a folder behind); :func:`unavailable` says why it cannot (the skip reason).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Iterator, Mapping, Optional

V1 = Path("/sys/fs/cgroup")


def unavailable(controller: str) -> Optional[str]:
    """None when a v1 child of ``controller`` can be made here, else why not."""
    if os.geteuid() != 0:
        return f"making a cgroup needs root (uid {os.geteuid()})"
    base = V1 / controller
    if not (base / "cgroup.procs").exists() or not (base / "tasks").exists():
        return f"no cgroup v1 {controller} hierarchy at {base}"
    return None


@contextlib.contextmanager
def v1_child(controller: str, settings: Mapping[str, str]) -> Iterator[Path]:
    """A new child of the v1 ``controller`` hierarchy's root, its files written in order
    (``{"cpuset.cpus": "0-1", "cpuset.mems": "0"}``); removed on exit, after moving any
    process still in it back to the root."""
    path = V1 / controller / f"cpulaunch-test-{os.getpid()}-{time.monotonic_ns()}"
    path.mkdir()
    try:
        for name, value in settings.items():
            (path / name).write_text(value)
        yield path
    finally:
        for _ in range(50):
            pids = (path / "cgroup.procs").read_text().split()
            for pid in pids:
                with contextlib.suppress(OSError):
                    (V1 / controller / "cgroup.procs").write_text(pid)
            try:
                path.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def enter(path: Path):
    """A ``preexec_fn`` that moves the child into the cgroup at ``path`` before it execs."""
    procs = str(path / "cgroup.procs")

    def move() -> None:
        fd = os.open(procs, os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)

    return move
