"""What a running process really has, read from ``/proc`` below a root: every thread's CPUs and
CPU time, the libraries mapped, memory per NUMA node (``numa_maps``), the memory policy, the
environment, and its children. Pure parsers of each file's text, and :func:`inspect`, which
reads them through the probe's bounded reader (:class:`cpulaunch.machine.files.FileReader`:
regular files only, opened without blocking, at most :data:`PROC_FILE_BYTES` each) and says
why a fact could not be read rather than guessing it (``cpulaunch verify`` compares these
views with a plan: :mod:`cpulaunch.tools.verify`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional

from cpulaunch import cpulist
from cpulaunch.errors import CpulaunchError
from cpulaunch.machine.libraries import openmp_runtime_of
from cpulaunch.machine.files import MAX_FILE_BYTES, FileReader
from cpulaunch.records import Record

__all__ = [
    "BUSY_CPU_SECONDS",
    "PROC_FILE_BYTES",
    "ProcessError",
    "NoSuchProcess",
    "ProcessGone",
    "ThreadView",
    "NumaUsage",
    "ProcessView",
    "ProcStat",
    "parse_status",
    "parse_stat",
    "parse_maps",
    "parse_stat_cpu_ticks",
    "parse_uptime",
    "parse_numa_maps",
    "inspect",
]

#: CPU time (seconds) after which a thread counts as a compute thread (see module doc).
BUSY_CPU_SECONDS = 0.2
#: Generations of descendants :func:`inspect` follows (workers of workers are rare).
MAX_DEPTH = 8
#: Environment variables of a process kept in its view (nothing else is copied).
ENV_KEPT = re.compile(r"^(CPULAUNCH_\w+|OMP_\w+|KMP_\w+|GOMP_\w+|LD_PRELOAD|MALLOC_CONF)$")
#: Largest ``maps``, ``numa_maps``, ``environ`` or ``cmdline`` verify reads (300,000
#: mappings make a 30 MiB maps); a larger one is unreadable ("larger than ... bytes").
PROC_FILE_BYTES = 64 << 20
#: Task flags in ``/proc/PID/stat`` field 9 (include/linux/sched.h).
PF_EXITING = 0x00000004
PF_KTHREAD = 0x00200000
#: Why a file was not read when it does not exist.
ABSENT = "absent"


class ProcessError(CpulaunchError):
    """A process cannot be read: it does not exist, or it exited while it was read."""


class NoSuchProcess(ProcessError):
    """No ``/proc/PID`` when verify first looked: no such process, or it had exited."""


class ProcessGone(ProcessError):
    """The process exited (or its PID was reused) while verify read it."""


# --------------------------------------------------------------------------- views


@dataclass(frozen=True)
class ThreadView:
    """One thread (task) of a process.

    Attributes:
        tid: thread id. name: its ``comm``. state: one letter (R, S, D, ...).
        cpus: logical CPUs it may run on (``Cpus_allowed_list``).
        cpu_seconds: CPU time used since it started (utime + stime).
        age_seconds: seconds since it started (``/proc/uptime`` minus its starttime,
            field 22 of its stat); None when either could not be read.
    """

    tid: int
    name: str
    state: str
    cpus: frozenset[int]
    cpu_seconds: float
    age_seconds: Optional[float] = None

    @property
    def busy(self) -> bool:
        """Used at least :data:`BUSY_CPU_SECONDS` of CPU (see the module doc)."""
        return self.cpu_seconds >= BUSY_CPU_SECONDS

    @property
    def cpu_share(self) -> Optional[float]:
        """CPU time over its age: 0.5 = half a CPU on average since it started; None when
        its age is unknown (or 0)."""
        return self.cpu_seconds / self.age_seconds if self.age_seconds else None


@dataclass(frozen=True)
class NumaUsage:
    """Where a process's memory lives, from ``/proc/PID/numa_maps``.

    Attributes:
        kb_per_node: node id -> kB of resident pages (all mappings).
        anon_kb_per_node: node id -> kB of anonymous pages (heap, stack, anon mappings).
        policies: memory policy text (``default``, ``bind:0``, ``prefer:1``,
            ``interleave:0-1``, ``local``) -> number of mappings with it.
    """

    kb_per_node: Mapping[int, int] = field(default_factory=dict)
    anon_kb_per_node: Mapping[int, int] = field(default_factory=dict)
    policies: Mapping[str, int] = field(default_factory=dict)

    @property
    def policy(self) -> Optional[str]:
        """The policy of most mappings (the process's own policy: a mapping without a
        policy of its own shows the task's), None if nothing was read."""
        return max(self.policies.items(), key=lambda kv: kv[1])[0] if self.policies else None

    def share_on(self, nodes) -> Optional[float]:
        """Share (0..1) of anonymous kB on ``nodes``; None when there is none at all."""
        total = sum(self.anon_kb_per_node.values())
        if total == 0:
            return None
        return sum(kb for n, kb in self.anon_kb_per_node.items() if n in set(nodes)) / total


@dataclass(frozen=True)
class ProcessView:
    """One process as /proc shows it, with its descendants.

    Attributes:
        pid, ppid: ids. name: ``comm``. cmdline: argv.
        cpus: the process's (main thread's) allowed CPUs.
        threads: every thread, main thread first.
        libraries: paths of mapped shared objects, in address order (first mapping of each).
        numa: memory placement (None when numa_maps is unreadable, e.g. no NUMA kernel).
        environ: the process's variables matching ENV_KEPT (CPULAUNCH_*, OMP_*, KMP_*,
            GOMP_*, LD_PRELOAD, MALLOC_CONF); None when /proc/PID/environ is unreadable.
        children: descendant processes (DataLoader workers, helpers), each a view.
        state: the state letter of ``status`` (R, S, D, Z, ...); "" when unknown.
        uncheckable: why the process as a whole cannot be checked, "" when it can:
            "a zombie (...)", "a kernel thread (...)"; nothing else is read then.
        unreadable: file below ``/proc/PID`` ("maps", "environ", "task/12/status") -> why
            it could not be read ("permission denied", "absent", "larger than N bytes",
            "not a regular file (a FIFO)"). A missing ``numa_maps`` is not listed (a
            kernel without NUMA has none): ``numa`` is then None.
    """

    pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...]
    cpus: frozenset[int]
    threads: tuple[ThreadView, ...]
    libraries: tuple[str, ...]
    numa: Optional[NumaUsage]
    environ: Optional[Mapping[str, str]] = None
    children: tuple[ProcessView, ...] = ()
    state: str = ""
    uncheckable: str = ""
    unreadable: Mapping[str, str] = field(default_factory=dict)

    @property
    def allocators(self) -> tuple[str, ...]:
        """Registry names of allocators mapped ("tcmalloc", "jemalloc"), in address order."""
        from cpulaunch.machine.libraries import REGISTRY, identify

        out = []
        for path in self.libraries:
            name = identify(path)
            if name and REGISTRY[name].kind == "allocator" and name not in out:
                out.append(name)
        return tuple(out)

    @property
    def openmp(self) -> Mapping[str, str]:
        """OpenMP runtimes mapped: runtime ("gnu", "intel", "llvm") -> first path."""
        out: dict = {}
        for path in self.libraries:
            rt = openmp_runtime_of(path)
            if rt:
                out.setdefault(rt, path)
        return out

    @property
    def libraries_read(self) -> bool:
        """Whether ``libraries`` is what /proc/PID/maps says (False: unread or uncheckable)."""
        return not self.uncheckable and "maps" not in self.unreadable

    def counts(self, thread: ThreadView) -> bool:
        """Whether ``thread`` counts as a compute thread: busy, or this process's main thread."""
        return thread.busy or thread.tid == self.pid

    def walk(self):
        """This process and every descendant, depth first."""
        yield self
        for child in self.children:
            yield from child.walk()


# --------------------------------------------------------------------------- parsers (pure)


def parse_status(text: str) -> dict[str, str]:
    """``/proc/PID/status`` -> {key: value}: ``"Cpus_allowed_list:\\t0-3"`` -> {"Cpus_allowed_list": "0-3"}."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


class ProcStat(Record):
    """The fields of ``/proc/PID/stat`` verify uses (proc(5)).

    Attributes:
        state: one letter (R, S, D, Z zombie, X dead, ...). ppid: parent's pid.
        flags: the task's PF_* flags (:data:`PF_EXITING`, :data:`PF_KTHREAD`).
        cpu_ticks: utime + stime, clock ticks. start_ticks: start time, clock ticks after
            boot (with the pid, which process this is: a reused pid has another).
    """

    state: str
    ppid: int
    flags: int
    cpu_ticks: int
    start_ticks: int


def parse_stat(text: str) -> ProcStat:
    """``/proc/PID/stat`` -> :class:`ProcStat`.

    The name (field 2) may hold spaces and parentheses, so fields are counted after the
    last ``)`` (proc(5)): state is field 3, ppid 4, flags 9, utime 14, stime 15, starttime
    22. ``"7 (a) b) S 1 7 7 0 -1 4194560 0 0 0 0 25 5 0 0 20 0 1 0 900"`` ->
    ``ProcStat("S", 1, 4194560, 30, 900)``. Raises ValueError or IndexError when malformed.
    """
    rest = text[text.rindex(")") + 2:].split()
    return ProcStat(rest[0], int(rest[1]), int(rest[6]), int(rest[11]) + int(rest[12]), int(rest[19]))


def parse_stat_cpu_ticks(text: str) -> tuple[str, int]:
    """``/proc/PID/task/TID/stat`` -> (state letter, utime + stime in clock ticks); see
    :func:`parse_stat`."""
    st = parse_stat(text)
    return st.state, st.cpu_ticks


def parse_maps(text: str) -> tuple[str, ...]:
    """``/proc/PID/maps`` -> paths of mapped shared objects, each once, in address order.

    ``"7f..-7f.. r-xp 00000000 08:01 123 /usr/lib/libjemalloc.so.2"`` -> ``("/usr/lib/libjemalloc.so.2",)``;
    a `` (deleted)`` suffix is dropped; anonymous and special mappings ([heap]) are skipped.
    """
    seen: dict = {}
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        if path.startswith("/") and re.search(r"\.so(\.|$|-)", os.path.basename(path)):
            seen.setdefault(path, None)
    return tuple(seen)


def parse_numa_maps(text: str) -> NumaUsage:
    """``/proc/PID/numa_maps`` -> :class:`NumaUsage` (proc(5), "numa_maps").

    Each line: address, policy, then ``key=value`` fields; ``N<node>=<pages>`` counts
    resident pages per node, ``kernelpagesize_kB`` their size; ``anon=`` marks anonymous
    pages, as does the absence of ``file=`` in a ``heap``/``stack`` line.
    Example: ``"7f00 bind:0 anon=3 dirty=3 N0=2 N1=1 kernelpagesize_kB=4"`` ->
    kb_per_node {0: 8, 1: 4}, anon_kb_per_node {0: 8, 1: 4}, policies {"bind:0": 1}.
    """
    kb: dict = {}
    anon_kb: dict = {}
    policies: dict = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        policies[fields[1]] = policies.get(fields[1], 0) + 1
        kv = {}
        flags = set()
        for f in fields[2:]:
            k, sep, v = f.partition("=")
            if sep:
                kv[k] = v
            else:
                flags.add(k)
        try:
            page_kb = int(kv.get("kernelpagesize_kB", "4"))
        except ValueError:
            continue
        anon = "anon" in kv or ("file" not in kv and bool({"heap", "stack"} & flags))
        for k, v in kv.items():
            if k.startswith("N") and k[1:].isdigit() and v.isdigit():
                node, size = int(k[1:]), int(v) * page_kb
                kb[node] = kb.get(node, 0) + size
                if anon:
                    anon_kb[node] = anon_kb.get(node, 0) + size
    return NumaUsage(dict(sorted(kb.items())), dict(sorted(anon_kb.items())), policies)


# --------------------------------------------------------------------------- reading /proc


class _ProcFs:
    """One tree's ``proc`` read through probe's bounded reader (``files.FileReader``),
    keeping why a file could not be read."""

    def __init__(self, root: str | os.PathLike):
        self.fs = FileReader(root)

    def read(self, rel: str, cap: int = MAX_FILE_BYTES) -> tuple:
        """(text, "") of ``root/rel``, or (None, why): why is :data:`ABSENT` or what the
        reader says of a file it skipped ("permission denied", "not a regular file (a
        FIFO)", "larger than N bytes", "cannot read (...)")."""
        before = len(self.fs.skipped)
        text = self.fs.read(rel, strict=False, cap=cap)
        if text is not None:
            return text, ""
        if len(self.fs.skipped) == before:
            return None, ABSENT
        return None, self.fs.skipped[-1][1]

    def text(self, rel: str, cap: int = MAX_FILE_BYTES) -> Optional[str]:
        """The text of ``root/rel``, None when it could not be read."""
        return self.read(rel, cap)[0]

    def stat(self, pid: int) -> Optional[ProcStat]:
        """``/proc/PID/stat`` parsed, None when unreadable or malformed."""
        text = self.text(f"proc/{pid}/stat")
        try:
            return parse_stat(text) if text else None
        except (ValueError, IndexError):
            return None


def _cpus_of(st: Mapping[str, str]) -> frozenset:
    try:
        return cpulist.parse(st.get("Cpus_allowed_list", ""))
    except CpulaunchError:
        return frozenset()


def parse_uptime(text: str) -> float:
    """``/proc/uptime`` -> seconds since boot: ``"5234.17 9876.50"`` -> 5234.17. Raises
    ValueError or IndexError when malformed."""
    return float(text.split()[0])


def _uptime(fs: _ProcFs) -> Optional[float]:
    """Seconds since boot from ``proc/uptime`` under the root, None when unreadable."""
    text = fs.text("proc/uptime")
    try:
        return parse_uptime(text) if text else None
    except (ValueError, IndexError):
        return None


def _read_threads(fs: _ProcFs, pid: int, ticks: int) -> tuple:
    """(every thread's view, main thread first; {file: why} of what could not be read)."""
    out, unreadable = [], {}
    tids = sorted(int(t) for t in fs.fs.listdir(f"proc/{pid}/task") if t.isdigit())
    if not tids:
        unreadable["task"] = "no thread listed"
    for tid in tids:
        status, why = fs.read(f"proc/{pid}/task/{tid}/status")
        if status is None:
            if why != ABSENT:
                unreadable[f"task/{tid}/status"] = why
            continue  # absent: the thread ended while we read
        st = parse_status(status)
        stat = fs.text(f"proc/{pid}/task/{tid}/stat")
        try:
            ps = parse_stat(stat) if stat else None
        except (ValueError, IndexError):
            ps = None
        state, used = (ps.state, ps.cpu_ticks) if ps else (st.get("State", "?")[:1], 0)
        out.append((ThreadView(tid, st.get("Name", ""), state, _cpus_of(st), used / ticks),
                    ps.start_ticks / ticks if ps else None))
    uptime = _uptime(fs)  # after every thread's stat: no thread started after it
    views = [v if uptime is None or start is None else replace(v, age_seconds=max(0.0, uptime - start))
             for v, start in out]
    views.sort(key=lambda t: (t.tid != pid, t.tid))
    return tuple(views), unreadable


def _children_of(fs: _ProcFs, pid: int) -> list:
    """Child pids: ``/proc/PID/task/*/children`` where the kernel has it
    (CONFIG_PROC_CHILDREN), else a scan of every ``/proc/N/stat`` for its parent id."""
    kids: set = set()
    have_file = False
    for tid in fs.fs.listdir(f"proc/{pid}/task"):
        text = fs.text(f"proc/{pid}/task/{tid}/children")
        if text is not None:
            have_file = True
            kids.update(int(p) for p in text.split() if p.isdigit())
    if have_file:
        return sorted(kids)
    for e in fs.fs.listdir("proc"):
        st = fs.stat(int(e)) if e.isdigit() else None
        if st is not None and st.ppid == pid:
            kids.add(int(e))
    return sorted(kids)


def _parse_environ(raw: Optional[str]) -> Optional[dict]:
    """``/proc/PID/environ`` text -> the variables matching ENV_KEPT; None when unread."""
    if raw is None:
        return None
    out = {}
    for item in raw.split("\x00"):
        k, sep, v = item.partition("=")
        if sep and ENV_KEPT.match(k):
            out[k] = v
    return out


def inspect(pid: int, root: str | os.PathLike = "/", *, children: bool = True) -> ProcessView:
    """Read process ``pid`` (and, with ``children``, its descendants) from ``root/proc``.

    Args:
        pid: process id (as seen in ``root``'s /proc).
        root: ``/`` or a tree holding a ``proc`` folder.
        children: include descendants (DataLoader workers and the like), at most
            :data:`MAX_DEPTH` generations deep; a descendant that exits (or is a zombie)
            while they are read is left out.

    Returns:
        the view; a zombie or a kernel thread is a view with ``uncheckable`` set, and
        files that could not be read are in ``unreadable`` of the process concerned.

    Raises:
        NoSuchProcess: no ``root/proc/PID/status`` (no such process, or it had exited).
        ProcessGone: it exited, started exiting or its pid was reused while being read.
    """
    return _inspect(int(pid), _ProcFs(root), MAX_DEPTH if children else 0, top=True)


def _files(fs: _ProcFs, pid: int) -> tuple:
    """({name: text or None} of maps, numa_maps, environ, cmdline; {name: why} of those
    that could not be read). cmdline is only shown, and a kernel without NUMA has no
    numa_maps: neither is listed as unreadable for that."""
    texts, unreadable = {}, {}
    for rel in ("maps", "numa_maps", "environ", "cmdline"):
        texts[rel], why = fs.read(f"proc/{pid}/{rel}", PROC_FILE_BYTES)
        if texts[rel] is None and rel != "cmdline" and not (rel == "numa_maps" and why == ABSENT):
            unreadable[rel] = why
    return texts, unreadable


def _exiting(st: Optional[ProcStat]) -> bool:
    """The task is a zombie, dead, or has begun to exit (PF_EXITING)."""
    return st is not None and (st.state in ("Z", "X") or bool(st.flags & PF_EXITING))


def _inspect(pid: int, fs: _ProcFs, depth: int, top: bool) -> ProcessView:
    first = fs.stat(pid)
    status, why = fs.read(f"proc/{pid}/status")
    if status is None:
        if why == ABSENT:
            raise NoSuchProcess(f"no process {pid}")
        return ProcessView(pid=pid, ppid=0, name="", cmdline=(), cpus=frozenset(), threads=(), libraries=(),
                           numa=None, unreadable={"status": why})
    st = parse_status(status)
    head = dict(pid=pid, ppid=int(st.get("PPid", "0") or 0), name=st.get("Name", ""), cpus=_cpus_of(st),
                state=(st.get("State") or (first.state if first else ""))[:1])
    if top and head["state"] == "Z":
        return ProcessView(**head, cmdline=(), threads=(), libraries=(), numa=None, uncheckable=(
            f"a zombie: it exited and its parent (pid {head['ppid']}) has not reaped it; its threads, "
            "memory and libraries are gone"))
    if head["state"] in ("Z", "X") or _exiting(first):
        raise ProcessGone(f"process {pid} is exiting")
    if st.get("Kthread") == "1" or (first is not None and first.flags & PF_KTHREAD):
        return ProcessView(**head, cmdline=(), threads=(), libraries=(), numa=None, uncheckable=(
            f"a kernel thread ({head['name']}): it has no program, libraries or memory of its own"))
    texts, unreadable = _files(fs, pid)
    threads, more = _read_threads(fs, pid, os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
    unreadable.update(more)
    # A process that exits while we read loses its memory (maps empty) before it turns
    # zombie, but after it is flagged exiting: read again, after everything else.
    now = fs.stat(pid)
    if _exiting(now) or (first and now and now.start_ticks != first.start_ticks) or fs.text(
            f"proc/{pid}/status") is None:
        raise ProcessGone(f"process {pid} exited while verify read it")
    kids = []
    for child in _children_of(fs, pid) if depth > 0 else ():
        try:
            kids.append(_inspect(child, fs, depth - 1, top=False))
        except ProcessError:
            continue  # it ended while we read
    numa_text = texts["numa_maps"]
    return ProcessView(
        **head,
        cmdline=tuple(c for c in (texts["cmdline"] or "").split("\x00") if c),
        threads=threads,
        libraries=parse_maps(texts["maps"] or ""),
        numa=parse_numa_maps(numa_text) if numa_text is not None else None,
        environ=_parse_environ(texts["environ"]),
        children=tuple(kids),
        unreadable=unreadable,
    )
