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
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

from cpulaunch import cpulist
from cpulaunch.errors import CpulaunchError

__all__ = [
    "BUSY_CPU_SECONDS",
    "MIN_BOUND_SHARE",
    "VerifyError",
    "Expected",
    "ThreadView",
    "NumaUsage",
    "ProcessView",
    "InstanceResult",
    "VerifyReport",
    "parse_status",
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


class VerifyError(CpulaunchError):
    """A process to verify does not exist (or vanished) or its /proc cannot be read."""


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


def parse_stat_cpu_ticks(text: str) -> tuple:
    """``/proc/PID/task/TID/stat`` -> (state letter, utime + stime in clock ticks).

    The name (field 2) may hold spaces and parentheses, so fields are counted after the
    last ``)`` (proc(5)): state is field 3, utime 14, stime 15.
    """
    rest = text[text.rindex(")") + 2:].split()
    return rest[0], int(rest[11]) + int(rest[12])


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


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text(errors="replace")
    except (OSError, ValueError):
        return None


def _threads(proc: Path, ticks: int) -> tuple:
    out = []
    try:
        tids = sorted(int(t) for t in os.listdir(proc / "task") if t.isdigit())
    except OSError:
        return ()
    for tid in tids:
        status = _read(proc / "task" / str(tid) / "status")
        stat = _read(proc / "task" / str(tid) / "stat")
        if status is None:
            continue  # the thread ended while we read
        st = parse_status(status)
        try:
            cpus = cpulist.parse(st.get("Cpus_allowed_list", ""))
        except CpulaunchError:
            cpus = frozenset()
        try:
            state, used = parse_stat_cpu_ticks(stat) if stat else (st.get("State", "?")[:1], 0)
        except (ValueError, IndexError):
            state, used = st.get("State", "?")[:1], 0
        out.append(ThreadView(tid, st.get("Name", ""), state, cpus, used / ticks))
    main = int(proc.name) if proc.name.isdigit() else None
    out.sort(key=lambda t: (t.tid != main, t.tid))
    return tuple(out)


def _children_of(root: Path, pid: int) -> list:
    """Child pids: ``/proc/PID/task/*/children`` where the kernel has it
    (CONFIG_PROC_CHILDREN), else a scan of every ``/proc/N/stat`` for its parent id."""
    proc = root / "proc" / str(pid)
    kids: set = set()
    have_file = False
    try:
        for tid in os.listdir(proc / "task"):
            text = _read(proc / "task" / tid / "children")
            if text is not None:
                have_file = True
                kids.update(int(p) for p in text.split() if p.isdigit())
    except OSError:
        pass
    if have_file:
        return sorted(kids)
    try:
        entries = [e for e in os.listdir(root / "proc") if e.isdigit()]
    except OSError:
        return []
    for e in entries:
        stat = _read(root / "proc" / e / "stat")
        if not stat or ")" not in stat:
            continue
        try:
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (ValueError, IndexError):
            continue
        if ppid == pid:
            kids.add(int(e))
    return sorted(kids)


def _environ(proc: Path) -> Optional[dict]:
    try:
        raw = (proc / "environ").read_bytes()
    except OSError:
        return None
    out = {}
    for item in raw.split(b"\x00"):
        k, sep, v = item.decode("utf-8", "replace").partition("=")
        if sep and ENV_KEPT.match(k):
            out[k] = v
    return out


def inspect(pid: int, root: str | os.PathLike = "/", *, children: bool = True) -> ProcessView:
    """Read process ``pid`` (and, with ``children``, its descendants) from ``root/proc``.

    Args:
        pid: process id (as seen in ``root``'s /proc).
        root: ``/`` or a tree holding a ``proc`` folder.
        children: include descendants (DataLoader workers and the like), at most
            :data:`MAX_DEPTH` generations deep.

    Raises:
        VerifyError: no such process, or its status cannot be read.
    """
    return _inspect(int(pid), Path(root), MAX_DEPTH if children else 0)


def _inspect(pid: int, rootp: Path, depth: int) -> ProcessView:
    proc = rootp / "proc" / str(pid)
    status = _read(proc / "status")
    if status is None:
        raise VerifyError(f"no process {pid} to verify (it exited, or {proc} is unreadable)")
    st = parse_status(status)
    try:
        cpus = cpulist.parse(st.get("Cpus_allowed_list", ""))
    except CpulaunchError:
        cpus = frozenset()
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    numa_text = _read(proc / "numa_maps")
    cmd = (_read(proc / "cmdline") or "").split("\x00")
    kids = []
    if depth > 0:
        for child in _children_of(rootp, pid):
            try:
                kids.append(_inspect(child, rootp, depth - 1))
            except VerifyError:
                continue  # it ended while we read
    return ProcessView(
        pid=pid,
        ppid=int(st.get("PPid", "0") or 0),
        name=st.get("Name", ""),
        cmdline=tuple(c for c in cmd if c) if cmd else (),
        cpus=cpus,
        threads=_threads(proc, ticks),
        libraries=parse_maps(_read(proc / "maps") or ""),
        numa=parse_numa_maps(numa_text) if numa_text is not None else None,
        environ=_environ(proc),
        children=tuple(kids),
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

    Returns:
        warnings, each starting "instance N:" (or "pid P:" when the index is unknown) and
        naming the process, thread and values concerned. Rules: module docstring.
    """
    fmt = cpulist.format
    who = exp.name(view.pid)
    out = []
    procs = list(view.walk())
    bound = frozenset(exp.bound_cpus) if exp.bound_cpus is not None else None

    # --- affinity
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

    # --- oversubscription
    cpus = bound if bound is not None else view.cpus
    busy = sum(1 for p in procs for t in p.threads if p.counts(t))
    if cpus and busy > len(cpus):
        total = sum(len(p.threads) for p in procs)
        out.append(
            f"{who}: {busy} busy threads (of {total} threads in {len(procs)} process(es)) on "
            f"{len(cpus)} CPU(s) {fmt(cpus)}: oversubscribed (set OMP_NUM_THREADS / "
            "torch.set_num_threads and DataLoader num_workers to fit)"
        )

    # --- allocator
    allocs = view.allocators
    if exp.allocator and exp.allocator not in allocs:
        out.append(f"{who}: {exp.allocator} planned but not mapped in pid {view.pid} "
                   f"(mapped: {', '.join(allocs) or 'the C library malloc only'}; LD_PRELOAD lost?)")
    if len(allocs) > 1:
        out.append(f"{who}: two allocators mapped in pid {view.pid}: {', '.join(sorted(allocs))}")

    # --- OpenMP runtimes
    for p in procs[:1]:
        rts = p.openmp
        if exp.omp_runtime == "intel":
            if "intel" not in rts:
                out.append(f"{who}: Intel OpenMP planned but libiomp5 is not mapped in pid {p.pid}"
                           + (f" (mapped: {', '.join(sorted(rts))})" if rts else ""))
            extra = sorted(set(rts) - {"intel", "gnu"})
            if extra and "intel" in rts:
                out.append(f"{who}: two OpenMP runtimes mapped in pid {p.pid}: intel and "
                           + ", ".join(f"{r} ({rts[r]})" for r in extra))
        elif len(rts) > 1:
            out.append(f"{who}: two OpenMP runtimes mapped in pid {p.pid}: "
                       + ", ".join(f"{r} ({path})" for r, path in sorted(rts.items())))
        elif exp.omp_runtime == "gnu" and "gnu" not in rts and rts:
            out.append(f"{who}: GNU OpenMP planned but pid {p.pid} maps {', '.join(sorted(rts))}")

    # --- memory
    want = _expected_policy(exp)
    if want:
        for p in procs:
            got = p.numa.policy if p.numa else None
            if got is not None and got != want:
                out.append(f"{who}: pid {p.pid} runs with memory policy {got}, planned {want} "
                           "(the memory binding did not apply)")
    if exp.mem_policy == "bind" and exp.mem_nodes:
        total: dict = {}
        for p in procs:
            for n, kb in (p.numa.anon_kb_per_node.items() if p.numa else ()):
                total[n] = total.get(n, 0) + kb
        share = NumaUsage(anon_kb_per_node=total).share_on(exp.mem_nodes)
        if share is not None and share < MIN_BOUND_SHARE:
            where = ", ".join(f"node {n}: {kb} kB" for n, kb in sorted(total.items()))
            out.append(f"{who}: only {share:.0%} of its anonymous memory is on bound node(s) "
                       f"{fmt(exp.mem_nodes)} ({where})")
    return out


# --------------------------------------------------------------------------- the whole check


@dataclass(frozen=True)
class InstanceResult:
    """One verified instance: what was expected, what was seen, what differs.

    Attributes:
        pid: the process verified.
        expected: the plan's :class:`Expected` (None: unknown; only plan-free checks ran).
        view: what /proc showed (None when the process could not be read).
        warnings: from :func:`compare`.
        error: why the process could not be read ("" if it was).
    """

    pid: int
    expected: Optional[Expected]
    view: Optional[ProcessView]
    warnings: tuple
    error: str = ""


@dataclass(frozen=True)
class VerifyReport:
    """Every instance verified, in the order given."""

    instances: tuple

    @property
    def warnings(self) -> tuple:
        """All warnings (and read errors), instance by instance."""
        return tuple(w for r in self.instances for w in (r.warnings + ((r.error,) if r.error else ())))

    @property
    def ok(self) -> bool:
        """True when nothing differs from the plan and every process was read."""
        return not self.warnings


def verify(targets: Sequence, root: str | os.PathLike = "/") -> VerifyReport:
    """Inspect each process and compare it with its instance's plan.

    Args:
        targets: ``(pid, Expected or None)`` pairs, one per instance. With None the
            expectation is rebuilt from the process's CPULAUNCH_* variables
            (:meth:`Expected.from_environ`); without them only plan-free checks run
            (oversubscription against the process's own CPUs, two allocators, two
            OpenMP runtimes).
        root: ``/`` or a tree holding ``proc``.

    Returns:
        :class:`VerifyReport`; never raises for a vanished process (its result has ``error``).
    """
    results = []
    for pid, exp in targets:
        try:
            view = inspect(int(pid), root)
        except VerifyError as exc:
            who = exp.name(int(pid)) if exp is not None else f"pid {pid}"
            results.append(InstanceResult(int(pid), exp, None, (), f"{who}: {exc}"))
            continue
        if exp is None:
            exp = Expected.from_environ(view.environ or {})
        results.append(InstanceResult(int(pid), exp, view, tuple(compare(exp or Expected(), view))))
    return VerifyReport(tuple(results))


def _process_json(p: ProcessView) -> dict:
    numa = p.numa
    return {
        "pid": p.pid,
        "ppid": p.ppid,
        "name": p.name,
        "cmdline": list(p.cmdline),
        "cpus": cpulist.format(p.cpus),
        "thread_count": len(p.threads),
        "busy_threads": sum(1 for t in p.threads if p.counts(t)),
        "threads": [
            {"tid": t.tid, "name": t.name, "state": t.state, "cpus": cpulist.format(t.cpus),
             "cpu_seconds": round(t.cpu_seconds, 3), "busy": p.counts(t)}
            for t in p.threads
        ],
        "allocators": list(p.allocators),
        "openmp": dict(p.openmp),
        "memory": None if numa is None else {
            "policy": numa.policy,
            "kb_per_node": {str(n): kb for n, kb in numa.kb_per_node.items()},
            "anon_kb_per_node": {str(n): kb for n, kb in numa.anon_kb_per_node.items()},
        },
        "environ": None if p.environ is None else dict(sorted(p.environ.items())),
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
    """The report as JSON-ready data (what ``verify.json`` holds; docs/doctor.md)."""
    out = []
    for r in report.instances:
        share = None
        if r.view is not None and r.expected is not None and r.expected.mem_nodes:
            total: dict = {}
            for p in r.view.walk():
                for n, kb in (p.numa.anon_kb_per_node.items() if p.numa else ()):
                    total[n] = total.get(n, 0) + kb
            share = NumaUsage(anon_kb_per_node=total).share_on(r.expected.mem_nodes)
        out.append({
            "pid": r.pid,
            "index": r.expected.index if r.expected is not None else None,
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


def render_text(report: VerifyReport) -> str:
    """One block per instance: threads and their CPUs, libraries, memory; then warnings."""
    fmt = cpulist.format
    lines = []
    for r in report.instances:
        who = r.expected.name(r.pid) if r.expected is not None else f"pid {r.pid}"
        if r.view is None:
            lines.append(f"verify {who}: {r.error}")
            continue
        e = r.expected
        lines.append(f"verify {who} (pid {r.pid})"
                     + (f": planned CPUs {fmt(e.bound_cpus)}" if e and e.bound_cpus is not None else "")
                     + (f", memory {e.mem_policy} {fmt(e.mem_nodes)}" if e and e.mem_nodes else ""))
        for p in r.view.walk():
            by_cpus: dict = {}
            for t in p.threads:
                by_cpus.setdefault(fmt(t.cpus), []).append(t)
            threads = "; ".join(f"{len(ts)} on CPUs {c or '?'} ({sum(1 for t in ts if p.counts(t))} busy)"
                                for c, ts in by_cpus.items())
            numa = p.numa
            mem = ""
            if numa is not None and numa.anon_kb_per_node:
                mem = f"; memory {numa.policy}: " + ", ".join(
                    f"node {n} {kb // 1024} MiB" for n, kb in numa.anon_kb_per_node.items())
            lines.append(f"  pid {p.pid} {p.name}: {len(p.threads)} thread(s): {threads}; allocator "
                         f"{', '.join(p.allocators) or 'libc'}; OpenMP {', '.join(sorted(p.openmp)) or 'none'}{mem}")
        if not r.warnings:
            lines.append("  ok: matches the plan" if e is not None else "  ok: no plan-free check failed")
        lines += [f"  warning: {w}" for w in r.warnings]
    return "\n".join(lines) + "\n"
