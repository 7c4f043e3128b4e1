"""``--verify`` / ``cpulaunch verify PID...``: what the running processes really got.

Reading and judging are apart:

- :func:`inspect` reads ``/proc`` (under ``root``) for one process, its threads and its
  descendants into a frozen :class:`ProcessView`; :func:`parse_numa_maps`,
  :func:`parse_status` and :func:`parse_maps` are the pure parsers it uses;
- :func:`compare` is pure: an :class:`Expected` (what the plan asked for one instance)
  against a :class:`ProcessView` -> warnings naming the instance and what differs;
- :func:`verify` does both for a list of (pid, Expected) and returns a
  :class:`VerifyReport`; :func:`render_text` and :func:`report_json` (the ``verify.json``
  written into a run's log folder, docs/doctor.md) are pure.

Rules of :func:`compare` (each a warning):

- *affinity*: a thread allowed on a CPU outside the instance's bound CPUs (the program
  widened its own affinity, or the binding was lost). A thread pinned to a subset is fine
  (KMP_AFFINITY / OMP_PLACES pin one thread per CPU), except when two or more busy
  threads are pinned to the same single CPU (they take turns on one core).
- *oversubscription*: more busy threads, summed over the instance's processes (DataLoader
  workers included), than bound CPUs. A thread is *busy* when it has used at least
  :data:`BUSY_CPU_SECONDS` of CPU time since it started (``utime+stime`` of
  ``/proc/PID/task/TID/stat``); each process's main thread always counts. Threads that
  only wait (Python's helper threads, an idle inter-op pool, allocator background threads)
  do not count; an OpenMP worker counts once it has done real work, and keeps counting,
  since it competes again at the next parallel region. 200 ms, not less: a pool created at
  import and never used spins briefly at start (numpy's OpenBLAS server thread: 40-50 ms
  here); a pool that is used, numpy's included, does compete and is counted.
- *allocator*: the planned allocator's library is not mapped in the main process; two
  allocators mapped.
- *OpenMP*: two OpenMP runtimes mapped. With Intel OpenMP planned, torch's own libgomp
  stays mapped next to the preloaded libiomp5 (it is linked, but its symbols are bound to
  libiomp5: PLATFORM.md), so "intel + gnu" is expected then; libiomp5 missing is a warning.
- *memory*: with ``mem_policy`` "bind", less than :data:`MIN_BOUND_SHARE` of the instance's
  anonymous memory on the bound nodes, or a process whose memory policy (numa_maps) is not
  the planned one. Anonymous pages only: file pages sit in the shared page cache wherever
  they were first read, whatever the process's policy.

Verdicts (:class:`Verdict`, one per instance). A fact that could not be read never counts
as a match: *ok* needs every fact read and nothing different; *differs* when something
read differs (the warnings say what); *cannot-check* when nothing read differs but a fact
could not be read (another user's process: ``maps``, ``numa_maps`` and ``environ`` are
"permission denied" without root; a zombie: its threads, memory and libraries are gone; a
kernel thread: it has none of its own), naming each file and why; *gone* when the process
does not exist or exited while verify read it (its state turned zombie or exiting, or its
PID now names another process: the start time in ``stat`` changed). ``cpulaunch verify``
exits with :data:`EXIT_CODES`.

Reads go through probe's bounded reader (``probe.FileReader``: regular files only, opened
non-blocking, at most :data:`PROC_FILE_BYTES` for ``maps``, ``numa_maps``, ``environ``
and ``cmdline``, ``probe.MAX_FILE_BYTES`` for the rest), so a FIFO or an endless file
under a test's ``root`` costs that fact, never a hang.
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Optional, Sequence

from cpulaunch import cpulist
from cpulaunch.errors import CpulaunchError, printable
from cpulaunch.machine.probe import MAX_FILE_BYTES, FileReader

__all__ = [
    "BUSY_CPU_SECONDS",
    "MIN_BOUND_SHARE",
    "PROC_FILE_BYTES",
    "EXIT_CODES",
    "VerifyError",
    "NoSuchProcess",
    "ProcessGone",
    "Verdict",
    "Expected",
    "ThreadView",
    "NumaUsage",
    "ProcessView",
    "InstanceResult",
    "VerifyReport",
    "ProcStat",
    "parse_status",
    "parse_stat",
    "parse_maps",
    "parse_stat_cpu_ticks",
    "parse_numa_maps",
    "openmp_runtime_of",
    "inspect",
    "compare",
    "verify",
    "render_text",
    "report_json",
]

#: CPU time (seconds) after which a thread counts as a compute thread (see module doc).
BUSY_CPU_SECONDS = 0.2
#: Below this share of anonymous memory on the bound nodes, "bind" did not hold.
MIN_BOUND_SHARE = 0.90
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


class VerifyError(CpulaunchError):
    """A process to verify does not exist or exited while verify read it."""


class NoSuchProcess(VerifyError):
    """No ``/proc/PID`` when verify first looked: no such process, or it had exited."""


class ProcessGone(VerifyError):
    """The process exited (or its PID was reused) while verify read it."""


class Verdict(str, enum.Enum):
    """What verify concluded about one instance (``InstanceResult.status``; "status" in
    verify.json). Rules: module docstring; exit codes: :data:`EXIT_CODES`."""

    #: every fact was read and nothing differs from the plan
    OK = "ok"
    #: something read differs from the plan (the warnings say what)
    DIFFERS = "differs"
    #: nothing read differs, but a fact could not be read (permission denied, a zombie,
    #: a kernel thread): not a match
    CANNOT_CHECK = "cannot-check"
    #: the process does not exist, or exited while verify read it
    GONE = "gone"


#: ``cpulaunch verify``'s exit status by verdict. The command exits 1 when any instance
#: differs, else 3 when any could not be checked or is gone, else 0; 2 is kept for usage
#: errors (a PID with no process is one: a typo, or the process had already exited).
EXIT_CODES = {Verdict.OK: 0, Verdict.DIFFERS: 1, Verdict.CANNOT_CHECK: 3, Verdict.GONE: 3}


def openmp_runtime_of(name: str) -> Optional[str]:
    """The OpenMP runtime a library is, from its base name: "gnu" (libgomp, torch's
    ``libgomp-<hash>.so.1`` too), "intel" (libiomp5), "llvm" (libomp); else None."""
    base = os.path.basename(name)
    if base.startswith(("libgomp.", "libgomp-")):
        return "gnu"
    if base.startswith("libiomp5."):
        return "intel"
    if base.startswith(("libomp.", "libomp-")):
        return "llvm"
    return None


# --------------------------------------------------------------------------- expectations


@dataclass(frozen=True)
class Expected:
    """What the plan asked for one instance. None in a field means "not known": the
    checks that need it are skipped.

    Attributes:
        index: the instance's index (names it in warnings); None: named by pid.
        bound_cpus: every logical CPU the instance is bound to (compute + reserved).
        cpus: its compute logical CPUs.
        mem_nodes: NUMA node ids of its memory policy (empty: memory not bound).
        mem_policy: "bind", "preferred", "interleave", "local" or "none"; None: unknown.
        allocator: registry name ("tcmalloc", "jemalloc") preloaded, None: none planned.
        omp_runtime: "gnu" or "intel"; None: unknown.
        label: how warnings name it ("instance 1", "rank 1"); "" -> "instance <index>",
            or "pid <pid>" when the index is unknown too.
    """

    index: Optional[int] = None
    bound_cpus: Optional[tuple] = None
    cpus: Optional[tuple] = None
    mem_nodes: tuple = ()
    mem_policy: Optional[str] = None
    allocator: Optional[str] = None
    omp_runtime: Optional[str] = None
    label: str = ""

    def name(self, pid: int) -> str:
        """How warnings name this instance (see ``label``)."""
        return self.label or (f"instance {self.index}" if self.index is not None else f"pid {pid}")

    @classmethod
    def from_rendered(cls, inst, *, allocator: Optional[str], omp_runtime: Optional[str]) -> "Expected":
        """From a render.RenderedInstance (or anything with ``index``, ``cpus``,
        ``bound_cpus``, ``mem_nodes``, ``mem_policy``, optionally ``label``) and the resolved settings:
        ``allocator`` = Settings.allocator ("tcmalloc"/"jemalloc"/None) and
        ``omp_runtime`` = Settings.omp_runtime ("gnu"/"intel")."""
        policy = getattr(inst, "mem_policy", None)
        policy = getattr(policy, "value", policy)
        return cls(
            index=inst.index,
            bound_cpus=tuple(sorted(inst.bound_cpus)),
            cpus=tuple(sorted(inst.cpus)),
            mem_nodes=tuple(sorted(inst.mem_nodes)),
            mem_policy=policy,
            allocator=allocator,
            omp_runtime=omp_runtime,
            label=getattr(inst, "label", "") or "",
        )

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> Optional["Expected"]:
        """From the ``CPULAUNCH_*`` variables a cpulaunch instance carries (for
        ``cpulaunch verify PID`` without a plan at hand); None if it has none.

        CPULAUNCH_INSTANCE_INDEX -> index; CPULAUNCH_BOUND_CPUS, else the union of
        CPULAUNCH_CPUS, CPULAUNCH_RESERVED_CPUS and CPULAUNCH_DATALOADER_CPUS -> bound
        CPUs; CPULAUNCH_CPUS -> compute CPUs; CPULAUNCH_MEM_POLICY and
        CPULAUNCH_MEM_NODES when present; LD_PRELOAD -> allocator and, with libiomp5 in
        it, omp_runtime "intel" (else unknown).
        """
        if "CPULAUNCH_CPUS" not in env:
            return None
        from cpulaunch.machine.libraries import REGISTRY, identify

        try:
            cpus = tuple(sorted(cpulist.parse(env["CPULAUNCH_CPUS"])))
            if "CPULAUNCH_BOUND_CPUS" in env:
                bound_set = cpulist.parse(env["CPULAUNCH_BOUND_CPUS"])
            else:
                bound_set = frozenset(cpus).union(*(cpulist.parse(env.get(k, "")) for k in (
                    "CPULAUNCH_RESERVED_CPUS", "CPULAUNCH_DATALOADER_CPUS")))
            bound = tuple(sorted(bound_set))
            nodes = tuple(sorted(cpulist.parse(env.get("CPULAUNCH_MEM_NODES", ""))))
            index = int(env["CPULAUNCH_INSTANCE_INDEX"]) if "CPULAUNCH_INSTANCE_INDEX" in env else None
        except (CpulaunchError, ValueError):
            return None
        entries = env.get("LD_PRELOAD", "").replace(":", " ").split()
        names = [identify(e) for e in entries]
        allocs = [n for n in names if n and REGISTRY[n].kind == "allocator"]
        intel = any(openmp_runtime_of(e) == "intel" for e in entries)
        return cls(
            index=index, bound_cpus=bound, cpus=cpus, mem_nodes=nodes,
            mem_policy=env.get("CPULAUNCH_MEM_POLICY"),
            allocator=allocs[0] if allocs else None,
            omp_runtime="intel" if intel else None,
        )


# --------------------------------------------------------------------------- views


@dataclass(frozen=True)
class ThreadView:
    """One thread (task) of a process.

    Attributes:
        tid: thread id. name: its ``comm``. state: one letter (R, S, D, ...).
        cpus: logical CPUs it may run on (``Cpus_allowed_list``).
        cpu_seconds: CPU time used since it started (utime + stime).
    """

    tid: int
    name: str
    state: str
    cpus: frozenset
    cpu_seconds: float

    @property
    def busy(self) -> bool:
        """Used at least :data:`BUSY_CPU_SECONDS` of CPU (see the module doc)."""
        return self.cpu_seconds >= BUSY_CPU_SECONDS


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
    cmdline: tuple
    cpus: frozenset
    threads: tuple
    libraries: tuple
    numa: Optional[NumaUsage]
    environ: Optional[Mapping[str, str]] = None
    children: tuple = ()
    state: str = ""
    uncheckable: str = ""
    unreadable: Mapping[str, str] = field(default_factory=dict)

    @property
    def allocators(self) -> tuple:
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


def parse_status(text: str) -> dict:
    """``/proc/PID/status`` -> {key: value}: ``"Cpus_allowed_list:\\t0-3"`` -> {"Cpus_allowed_list": "0-3"}."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


class ProcStat(NamedTuple):
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


def parse_stat_cpu_ticks(text: str) -> tuple:
    """``/proc/PID/task/TID/stat`` -> (state letter, utime + stime in clock ticks); see
    :func:`parse_stat`."""
    st = parse_stat(text)
    return st.state, st.cpu_ticks


def parse_maps(text: str) -> tuple:
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
    """One tree's ``proc`` read through probe's bounded reader (``probe.FileReader``),
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


def _threads(fs: _ProcFs, pid: int, ticks: int) -> tuple:
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
            state, used = parse_stat_cpu_ticks(stat) if stat else (st.get("State", "?")[:1], 0)
        except (ValueError, IndexError):
            state, used = st.get("State", "?")[:1], 0
        out.append(ThreadView(tid, st.get("Name", ""), state, _cpus_of(st), used / ticks))
    out.sort(key=lambda t: (t.tid != pid, t.tid))
    return tuple(out), unreadable


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


def _environ(raw: Optional[str]) -> Optional[dict]:
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
    threads, more = _threads(fs, pid, os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
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
        except VerifyError:
            continue  # it ended while we read
    numa_text = texts["numa_maps"]
    return ProcessView(
        **head,
        cmdline=tuple(c for c in (texts["cmdline"] or "").split("\x00") if c),
        threads=threads,
        libraries=parse_maps(texts["maps"] or ""),
        numa=parse_numa_maps(numa_text) if numa_text is not None else None,
        environ=_environ(texts["environ"]),
        children=tuple(kids),
        unreadable=unreadable,
    )


# --------------------------------------------------------------------------- comparing (pure)


def _expected_policy(exp: Expected) -> Optional[str]:
    """The numa_maps policy text the plan leads to (kernel mpol_to_str), or None."""
    nodes = cpulist.format(exp.mem_nodes)
    if exp.mem_policy == "bind" and nodes:
        return f"bind:{nodes}"
    if exp.mem_policy == "interleave" and nodes:
        return f"interleave:{nodes}"
    if exp.mem_policy == "preferred" and exp.mem_nodes:
        return f"prefer:{exp.mem_nodes[0]}"
    if exp.mem_policy == "local":
        return "local"
    return None


def compare(exp: Expected, view: ProcessView) -> list:
    """What in ``view`` (a process and its descendants) differs from ``exp`` (pure).

    Only facts that were read are compared: a process whose ``maps`` is unreadable gets
    no allocator or OpenMP warning, one without ``numa`` no memory warning, and a view
    that is ``uncheckable`` (a zombie, a kernel thread) none at all.

    Returns:
        warnings, each starting "instance N:" (or "pid P:" when the index is unknown) and
        naming the process, thread and values concerned. Rules: module docstring.
    """
    if view.uncheckable:
        return []
    who = exp.name(view.pid)
    procs = list(view.walk())
    bound = frozenset(exp.bound_cpus) if exp.bound_cpus is not None else None
    return (_affinity_warnings(who, procs, bound) + _oversubscription_warnings(who, procs, bound or view.cpus)
            + _library_warnings(who, exp, view) + _memory_warnings(who, exp, procs))


def _affinity_warnings(who: str, procs: list, bound: Optional[frozenset]) -> list:
    """Threads allowed outside ``bound``; busy threads stacked on one CPU."""
    fmt = cpulist.format
    out = []
    if bound is not None:
        for p in procs:
            for t in p.threads:
                extra = t.cpus - bound
                if extra:
                    out.append(
                        f"{who}: thread {t.tid} ({t.name}) of pid {p.pid} may run on CPUs {fmt(t.cpus)}, "
                        f"outside its planned CPUs {fmt(bound)} (CPUs {fmt(extra)} too: the program "
                        "widened its affinity or the binding was lost)"
                    )
    stacked: dict = {}
    for p in procs:
        for t in p.threads:
            if len(t.cpus) == 1 and p.counts(t):
                stacked.setdefault(next(iter(t.cpus)), []).append(t.tid)
    for cpu, tids in sorted(stacked.items()):
        if len(tids) > 1 and (bound is None or len(bound) > 1):
            out.append(f"{who}: {len(tids)} busy threads pinned to CPU {cpu} alone "
                       f"(threads {', '.join(map(str, tids))}): they take turns on one CPU")
    return out


def _oversubscription_warnings(who: str, procs: list, cpus: frozenset) -> list:
    """More busy threads over the instance's processes than ``cpus``."""
    busy = sum(1 for p in procs for t in p.threads if p.counts(t))
    if not cpus or busy <= len(cpus):
        return []
    total = sum(len(p.threads) for p in procs)
    return [f"{who}: {busy} busy threads (of {total} threads in {len(procs)} process(es)) on "
            f"{len(cpus)} CPU(s) {cpulist.format(cpus)}: oversubscribed (set OMP_NUM_THREADS / "
            "torch.set_num_threads and DataLoader num_workers to fit)"]


def _library_warnings(who: str, exp: Expected, view: ProcessView) -> list:
    """Allocator and OpenMP runtimes mapped in the main process (skipped when its maps is unread)."""
    if not view.libraries_read:
        return []
    out = []
    allocs = view.allocators
    if exp.allocator and exp.allocator not in allocs:
        out.append(f"{who}: {exp.allocator} planned but not mapped in pid {view.pid} "
                   f"(mapped: {', '.join(allocs) or 'the C library malloc only'}; LD_PRELOAD lost?)")
    if len(allocs) > 1:
        out.append(f"{who}: two allocators mapped in pid {view.pid}: {', '.join(sorted(allocs))}")
    rts, pid = view.openmp, view.pid
    if exp.omp_runtime == "intel":
        if "intel" not in rts:
            out.append(f"{who}: Intel OpenMP planned but libiomp5 is not mapped in pid {pid}"
                       + (f" (mapped: {', '.join(sorted(rts))})" if rts else ""))
        extra = sorted(set(rts) - {"intel", "gnu"})
        if extra and "intel" in rts:
            out.append(f"{who}: two OpenMP runtimes mapped in pid {pid}: intel and "
                       + ", ".join(f"{r} ({rts[r]})" for r in extra))
    elif len(rts) > 1:
        out.append(f"{who}: two OpenMP runtimes mapped in pid {pid}: "
                   + ", ".join(f"{r} ({path})" for r, path in sorted(rts.items())))
    elif exp.omp_runtime == "gnu" and "gnu" not in rts and rts:
        out.append(f"{who}: GNU OpenMP planned but pid {pid} maps {', '.join(sorted(rts))}")
    return out


def _memory_warnings(who: str, exp: Expected, procs: list) -> list:
    """Memory policy not the planned one; too little anonymous memory on bound nodes."""
    out = []
    want = _expected_policy(exp)
    if want:
        for p in procs:
            got = p.numa.policy if p.numa else None
            if got is not None and got != want:
                out.append(f"{who}: pid {p.pid} runs with memory policy {got}, planned {want} "
                           "(the memory binding did not apply)")
    if exp.mem_policy == "bind" and exp.mem_nodes:
        total = _anon_kb(procs)
        share = NumaUsage(anon_kb_per_node=total).share_on(exp.mem_nodes)
        if share is not None and share < MIN_BOUND_SHARE:
            where = ", ".join(f"node {n}: {kb} kB" for n, kb in sorted(total.items()))
            out.append(f"{who}: only {share:.0%} of its anonymous memory is on bound node(s) "
                       f"{cpulist.format(exp.mem_nodes)} ({where})")
    return out


def _anon_kb(procs) -> dict:
    """Node id -> anonymous kB summed over ``procs`` (those whose numa_maps was read)."""
    total: dict = {}
    for p in procs:
        for n, kb in (p.numa.anon_kb_per_node.items() if p.numa else ()):
            total[n] = total.get(n, 0) + kb
    return total


# --------------------------------------------------------------------------- the whole check


@dataclass(frozen=True)
class InstanceResult:
    """One verified instance: what was expected, what was seen, what differs.

    Attributes:
        pid: the process verified.
        expected: the plan's :class:`Expected` (None: unknown; only plan-free checks ran).
        view: what /proc showed (None when the process is gone).
        warnings: from :func:`compare`: what read differs from the plan.
        error: "" when every fact was read; else one sentence naming the instance and
            what could not be checked and why (each file and its reason), or why it is gone.
        missing: there was no ``/proc/PID`` when verify first looked (``cpulaunch verify``
            takes that PID as a usage error).
    """

    pid: int
    expected: Optional[Expected]
    view: Optional[ProcessView]
    warnings: tuple
    error: str = ""
    missing: bool = False

    @property
    def status(self) -> Verdict:
        """The verdict (rules: module docstring): gone without a view, differs with a
        warning, cannot-check with an error, else ok."""
        if self.view is None:
            return Verdict.GONE
        if self.warnings:
            return Verdict.DIFFERS
        return Verdict.CANNOT_CHECK if self.error else Verdict.OK


@dataclass(frozen=True)
class VerifyReport:
    """Every instance verified, in the order given."""

    instances: tuple

    @property
    def warnings(self) -> tuple:
        """All warnings (and errors: what could not be checked), instance by instance."""
        return tuple(w for r in self.instances for w in (r.warnings + ((r.error,) if r.error else ())))

    @property
    def ok(self) -> bool:
        """True when every instance is ok: every fact read, nothing differs from the plan."""
        return all(r.status is Verdict.OK for r in self.instances)

    @property
    def exit_code(self) -> int:
        """``cpulaunch verify``'s exit status (:data:`EXIT_CODES`): 1 when any instance
        differs, else 3 when any could not be checked or is gone, else 0."""
        codes = {EXIT_CODES[r.status] for r in self.instances}
        return EXIT_CODES[Verdict.DIFFERS] if EXIT_CODES[Verdict.DIFFERS] in codes else max(codes, default=0)


def _cannot_check(view: ProcessView) -> str:
    """What of ``view`` (and its descendants) could not be checked, and why, as one
    clause; "" when everything was read. Each unreadable file is named under /proc."""
    parts = []
    for p in view.walk():
        subject = "it" if p is view else f"its descendant pid {p.pid} ({p.name})"
        if p.uncheckable:
            parts.append(f"{subject} is {p.uncheckable}")
        by_why: dict = {}
        for rel, why in p.unreadable.items():
            by_why.setdefault(why, []).append(f"/proc/{p.pid}/{rel}")
        for why, paths in by_why.items():
            hint = (" (another user's process: run verify as that user or as root)"
                    if why == "permission denied" else "")
            parts.append(f"cannot read {', '.join(paths)}: {why}{hint}")
    return "; ".join(parts)


def _check(pid: int, exp: Optional[Expected], root) -> InstanceResult:
    """One instance: inspect, rebuild the expectation when unknown, compare, judge."""
    who = exp.name(pid) if exp is not None else f"pid {pid}"
    try:
        view = inspect(pid, root)
    except NoSuchProcess:
        return InstanceResult(pid, exp, None, (), f"{who}: gone: no process {pid} (it does not exist or "
                              "has exited)", missing=True)
    except ProcessGone:
        return InstanceResult(pid, exp, None, (), f"{who}: gone: it exited while verify read it")
    if exp is None and view.environ is not None:
        exp = Expected.from_environ(view.environ)
        who = exp.name(pid) if exp is not None else who
    why = _cannot_check(view)
    return InstanceResult(pid, exp, view, tuple(compare(exp or Expected(), view)),
                          f"{who}: cannot check: {why}" if why else "")


def verify(targets: Sequence, root: str | os.PathLike = "/") -> VerifyReport:
    """Inspect each process and compare it with its instance's plan.

    Args:
        targets: ``(pid, Expected or None)`` pairs, one per instance. With None the
            expectation is rebuilt from the process's CPULAUNCH_* variables
            (:meth:`Expected.from_environ`); without them only plan-free checks run
            (oversubscription against the process's own CPUs, two allocators, two
            OpenMP runtimes). An unreadable environ is a fact not read (cannot-check).
        root: ``/`` or a tree holding ``proc``.

    Returns:
        :class:`VerifyReport`, one :class:`InstanceResult` per target with its
        :class:`Verdict`; never raises for a process that is gone or unreadable.
    """
    return VerifyReport(tuple(_check(int(pid), exp, root) for pid, exp in targets))


def _process_json(p: ProcessView) -> dict:
    numa = p.numa
    return {
        "pid": p.pid,
        "ppid": p.ppid,
        "name": p.name,
        "state": p.state or None,
        "cmdline": list(p.cmdline),
        "cpus": cpulist.format(p.cpus),
        "thread_count": len(p.threads),
        "busy_threads": sum(1 for t in p.threads if p.counts(t)),
        "threads": [
            {"tid": t.tid, "name": t.name, "state": t.state, "cpus": cpulist.format(t.cpus),
             "cpu_seconds": round(t.cpu_seconds, 3), "busy": p.counts(t)}
            for t in p.threads
        ],
        "allocators": list(p.allocators) if p.libraries_read else None,
        "openmp": dict(p.openmp) if p.libraries_read else None,
        "memory": None if numa is None else {
            "policy": numa.policy,
            "kb_per_node": {str(n): kb for n, kb in numa.kb_per_node.items()},
            "anon_kb_per_node": {str(n): kb for n, kb in numa.anon_kb_per_node.items()},
        },
        "environ": None if p.environ is None else dict(sorted(p.environ.items())),
        "uncheckable": p.uncheckable or None,
        "unreadable": dict(p.unreadable),
        "children": [_process_json(c) for c in p.children],
    }


def _expected_json(e: Optional[Expected], pid: int) -> Optional[dict]:
    if e is None:
        return None
    return {
        "index": e.index,
        "bound_cpus": None if e.bound_cpus is None else cpulist.format(e.bound_cpus),
        "cpus": None if e.cpus is None else cpulist.format(e.cpus),
        "mem_nodes": cpulist.format(e.mem_nodes),
        "mem_policy": e.mem_policy,
        "allocator": e.allocator,
        "omp_runtime": e.omp_runtime,
        "label": e.name(pid),
    }


def report_json(report: VerifyReport) -> dict:
    """The report as JSON-ready data (what ``verify.json`` holds; docs/doctor.md). Strings
    taken from /proc keep their real value (JSON escapes control characters)."""
    out = []
    for r in report.instances:
        share = None
        if r.view is not None and r.expected is not None and r.expected.mem_nodes:
            share = NumaUsage(anon_kb_per_node=_anon_kb(r.view.walk())).share_on(r.expected.mem_nodes)
        out.append({
            "pid": r.pid,
            "index": r.expected.index if r.expected is not None else None,
            "status": r.status.value,
            "expected": _expected_json(r.expected, r.pid),
            "process": None if r.view is None else _process_json(r.view),
            "share_on_bound_nodes": None if share is None else round(share, 4),
            "warnings": list(r.warnings),
            "error": r.error or None,
        })
    return {
        "schema_version": 1,
        "busy_cpu_seconds": BUSY_CPU_SECONDS,
        "min_bound_share": MIN_BOUND_SHARE,
        "ok": report.ok,
        "instances": out,
        "warnings": list(report.warnings),
    }


def _process_line(p: ProcessView) -> str:
    """``  pid P NAME: threads by CPUs; allocator; OpenMP; memory`` (NAME as read)."""
    fmt = cpulist.format
    by_cpus: dict = {}
    for t in p.threads:
        by_cpus.setdefault(fmt(t.cpus), []).append(t)
    threads = "; ".join(f"{len(ts)} on CPUs {c or '?'} ({sum(1 for t in ts if p.counts(t))} busy)"
                        for c, ts in by_cpus.items())
    if not p.libraries_read:
        libs = "allocator and OpenMP unknown (maps unread)"
    else:
        libs = f"allocator {', '.join(p.allocators) or 'libc'}; OpenMP {', '.join(sorted(p.openmp)) or 'none'}"
    numa = p.numa
    mem = ""
    if numa is not None and numa.anon_kb_per_node:
        mem = f"; memory {numa.policy}: " + ", ".join(
            f"node {n} {kb // 1024} MiB" for n, kb in numa.anon_kb_per_node.items())
    return f"  pid {p.pid} {p.name}: {len(p.threads)} thread(s): {threads}; {libs}{mem}"


def render_text(report: VerifyReport) -> str:
    """One block per instance: threads and their CPUs, libraries, memory; then its
    verdict: "ok: ...", its warnings, and what could not be checked (or why it is gone).
    Every line goes through :func:`cpulaunch.errors.printable`: a process, thread or
    library name taken from /proc never reaches the terminal as control bytes."""
    fmt = cpulist.format
    lines = []
    for r in report.instances:
        e = r.expected
        who = e.name(r.pid) if e is not None else f"pid {r.pid}"
        lines.append(f"verify {who} (pid {r.pid})"
                     + (f": planned CPUs {fmt(e.bound_cpus)}" if e and e.bound_cpus is not None else "")
                     + (f", memory {e.mem_policy} {fmt(e.mem_nodes)}" if e and e.mem_nodes else ""))
        if r.view is not None and not r.view.uncheckable:
            lines += [_process_line(p) for p in r.view.walk()]
        if r.status is Verdict.OK:
            lines.append("  ok: matches the plan" if e is not None else "  ok: no plan-free check failed")
        lines += [f"  warning: {w}" for w in r.warnings]
        lines += [f"  {r.error}"] if r.error else []
    return "".join(printable(line) + "\n" for line in lines)
