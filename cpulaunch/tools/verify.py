"""``--verify`` / ``cpulaunch verify PID...``: what the running processes really got.

Reading and judging are apart:

- :func:`cpulaunch.machine.proc.inspect` reads ``/proc`` (under ``root``) for one process,
  its threads and its descendants into a frozen :class:`~cpulaunch.machine.proc.ProcessView`
  (with the pure parsers of each file beside it);
- :func:`compare` is pure: an :class:`Expected` (what the plan asked for one instance)
  against a :class:`ProcessView` -> warnings naming the instance and what differs;
- :func:`verify` does both for a list of (pid, Expected) and returns a
  :class:`VerifyReport`; :func:`render_text` and :func:`report_json` (the ``verify.json``
  written into a run's log folder, docs/guide/doctor.md) are pure.

Rules of :func:`compare` (each a warning):

- *affinity*: a thread allowed on a CPU outside the instance's bound CPUs (the program
  widened its own affinity, or the binding was lost). A thread pinned to a subset is fine
  (KMP_AFFINITY / OMP_PLACES pin one thread per CPU), except when two or more busy
  threads are pinned to the same single CPU (they take turns on one core).
- *oversubscription*: more busy threads, summed over the instance's processes (DataLoader
  workers included), than bound CPUs. A thread is *busy* when it has used at least
  :data:`cpulaunch.machine.proc.BUSY_CPU_SECONDS` of CPU time since it started (``utime+stime`` of
  ``/proc/PID/task/TID/stat``); each process's main thread always counts. Threads that
  only wait (Python's helper threads, an idle inter-op pool, allocator background threads)
  do not count; an OpenMP worker counts once it has done real work, and keeps counting,
  since it competes again at the next parallel region. 200 ms, not less: a pool created at
  import and never used spins briefly at start (numpy's OpenBLAS server thread: 40-50 ms
  here); a pool that is used, numpy's included, does compete and is counted.
- *oneCCL workers* (``--ddp`` with ccl): the threads of the rank's main process pinned to
  exactly one of the CPUs the plan gave its oneCCL workers (``CPULAUNCH_CCL_WORKER_CPUS``)
  are reported as its workers (oneCCL pins each worker to one CPU of CCL_WORKER_AFFINITY
  and starts them at the first collective, so none may be there yet). A worker
  outside the rank's CPUs (oneCCL's own default: the machine's last CPUs) is an
  *affinity* warning.
- *threads the plan accounts for* (:func:`planned_threads`, the one rule the stacking and
  oversubscription checks share): a worker sharing the rank's compute CPU by plan, and in a
  ccl rank the backend's own threads of :data:`CCL_HELPERS` the plan accounts for, are not
  counted as threads stacked on one CPU nor as oversubscription. Those threads carry the
  program's name and run on the rank's CPUs: a yielding one is allowed by number, an idle
  poller is told apart by its small share of a CPU since it started (:data:`IDLE_SHARE`).
- *allocator*: the planned allocator's library is not mapped in the main process; two
  allocators mapped.
- *OpenMP*: two OpenMP runtimes mapped. With Intel OpenMP planned, torch's own libgomp
  stays mapped next to the preloaded libiomp5 (it is linked, but its symbols are bound to
  libiomp5, as LD_DEBUG=bindings shows), so "intel + gnu" is expected then; libiomp5 missing is a warning.
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

Reads go through probe's bounded reader (:mod:`cpulaunch.machine.proc` says how), so a
FIFO or an endless file under a test's ``root`` costs that fact, never a hang.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import click

from cpulaunch import cpulist, envvars
from cpulaunch.enums import Enum
from cpulaunch.errors import CpulaunchError, printable
from cpulaunch.machine.libraries import openmp_runtime_of, preload_entries
from cpulaunch.machine.proc import (
    BUSY_CPU_SECONDS,
    NoSuchProcess,
    NumaUsage,
    ProcessGone,
    ProcessView,
    inspect,
)
from cpulaunch.tools import CLICK_CONTEXT, shared_option

__all__ = [
    "MIN_BOUND_SHARE",
    "EXIT_CODES",
    "Verdict",
    "Expected",
    "InstanceCheck",
    "VerifyReport",
    "compare",
    "CCL_HELPERS",
    "IDLE_SHARE",
    "Planned",
    "planned_threads",
    "ccl_worker_threads",
    "verify",
    "render_text",
    "report_json",
    "check_run",
    "followed",
    "main",
]

#: Below this share of anonymous memory on the bound nodes, "bind" did not hold.
MIN_BOUND_SHARE = 0.90


class Verdict(str, Enum):
    """What verify concluded about one instance (``InstanceCheck.status``; "status" in
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
        ccl_workers: logical CPUs planned for its oneCCL workers (``--ddp`` with ccl;
            empty: none planned, or the user's CCL_WORKER_AFFINITY decides).
        backend: the rank's torch.distributed backend, "gloo" or "ccl"
            (``CPULAUNCH_DIST_BACKEND``); None: not a rank, or unknown.
    """

    index: Optional[int] = None
    bound_cpus: Optional[tuple[int, ...]] = None
    cpus: Optional[tuple[int, ...]] = None
    mem_nodes: tuple[int, ...] = ()
    mem_policy: Optional[str] = None
    allocator: Optional[str] = None
    omp_runtime: Optional[str] = None
    label: str = ""
    ccl_workers: tuple[int, ...] = ()
    backend: Optional[str] = None

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
            ccl_workers=_ccl_workers_of(getattr(inst, "env", {}) or {}),
            backend=(getattr(inst, "env", {}) or {}).get(envvars.DIST_BACKEND),
        )

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> Optional["Expected"]:
        """From the ``CPULAUNCH_*`` variables a cpulaunch instance carries (for
        ``cpulaunch verify PID`` without a plan at hand); None if it has none.

        CPULAUNCH_INSTANCE_INDEX -> index; CPULAUNCH_BOUND_CPUS, else the union of
        CPULAUNCH_CPUS, CPULAUNCH_RESERVED_CPUS and CPULAUNCH_DATALOADER_CPUS -> bound
        CPUs; CPULAUNCH_CPUS -> compute CPUs; CPULAUNCH_PLANNED_MEM_POLICY and
        CPULAUNCH_MEM_NODES when present (render writes the three for every instance:
        :mod:`cpulaunch.envvars`); LD_PRELOAD -> allocator and, with libiomp5 in it,
        omp_runtime "intel" (else unknown); CPULAUNCH_CCL_WORKER_CPUS -> ccl_workers;
        CPULAUNCH_DIST_BACKEND -> backend.
        """
        if envvars.CPUS not in env:
            return None
        from cpulaunch.machine.libraries import REGISTRY, identify

        try:
            cpus = tuple(sorted(cpulist.parse(env[envvars.CPUS])))
            if envvars.BOUND_CPUS in env:
                bound_set = cpulist.parse(env[envvars.BOUND_CPUS])
            else:
                bound_set = frozenset(cpus).union(*(cpulist.parse(env.get(k, "")) for k in (
                    envvars.RESERVED_CPUS, envvars.DATALOADER_CPUS)))
            bound = tuple(sorted(bound_set))
            nodes = tuple(sorted(cpulist.parse(env.get(envvars.MEM_NODES, ""))))
            index = int(env[envvars.INSTANCE_INDEX]) if envvars.INSTANCE_INDEX in env else None
        except (CpulaunchError, ValueError):
            return None
        entries = preload_entries(env.get("LD_PRELOAD", ""))
        names = [identify(e) for e in entries]
        allocs = [n for n in names if n and REGISTRY[n].kind == "allocator"]
        intel = any(openmp_runtime_of(e) == "intel" for e in entries)
        return cls(
            index=index, bound_cpus=bound, cpus=cpus, mem_nodes=nodes,
            mem_policy=env.get(envvars.MEM_POLICY),
            allocator=allocs[0] if allocs else None,
            omp_runtime="intel" if intel else None,
            ccl_workers=_ccl_workers_of(env),
            backend=env.get(envvars.DIST_BACKEND),
        )


def followed(exp: Optional[Expected], env: Mapping[str, str], root="/") -> Optional[Expected]:
    """``exp`` with the CPUs ``--follow-cpuset`` re-pinned the instance to, when its
    environment names the launcher's binding file (CPULAUNCH_BINDING_FILE) and the file
    (read under ``root``, a regular file of at most 1 MiB) names its index; else ``exp``
    as it is (the run has ended and the file is gone, or it is unreadable)."""
    import json

    from cpulaunch.machine.files import UnusableFileError, read_regular

    path = env.get(envvars.BINDING_FILE)
    if exp is None or exp.index is None or not path:
        return exp
    try:
        doc = json.loads(read_regular(os.path.join(os.fspath(root), path.lstrip("/")), 1 << 20))
        now = doc["instances"][str(exp.index)]
        cpus, bound = cpulist.parse(now["cpus"]), cpulist.parse(now["bound_cpus"])
    except (OSError, UnusableFileError, ValueError, KeyError, TypeError, CpulaunchError):
        return exp
    from dataclasses import replace

    return replace(exp, cpus=tuple(sorted(cpus)), bound_cpus=tuple(sorted(bound)))


def _ccl_workers_of(env: Mapping[str, str]) -> tuple:
    """The oneCCL worker CPUs an instance's environment names (CPULAUNCH_CCL_WORKER_CPUS),
    sorted; () when absent or unreadable."""
    try:
        return tuple(sorted(cpulist.parse(env.get(envvars.CCL_WORKER_CPUS, ""))))
    except CpulaunchError:
        return ()


def ccl_worker_threads(exp: Expected, view: ProcessView) -> Optional[tuple[int, ...]]:
    """The threads of ``view``'s main process pinned to exactly one of ``exp``'s oneCCL
    worker CPUs (pure), as thread ids; None when no worker is planned, or when the
    process itself may run only on one such CPU (then every thread is pinned there and
    the workers cannot be told apart)."""
    workers = frozenset(exp.ccl_workers)
    if not workers or view.uncheckable or (len(view.cpus) == 1 and view.cpus <= workers):
        return None
    return tuple(t.tid for t in view.threads if len(t.cpus) == 1 and t.cpus <= workers)


#: Threads the ccl backend starts in each rank's process besides oneCCL's workers that the
#: plan accounts for, and how: ``(what, kind)``. Measured in real 2-rank runs (oneCCL
#: 2021.14.1 with impi-rt 2021.14.2's libfabric, the bindings 2.8.0+xpu; docs/dev/oneccl.md,
#: "Threads of a ccl rank"). None has a name of its own (each shows the program's,
#: "python") and each may run wherever the rank's main thread may, so verify cannot tell
#: them from the program's threads by name.
#:
#: - the bindings' completion thread (one per process, started at import) waits inside
#:   oneCCL for each collective: 10-20% of the rank's CPU in an all_reduce loop. "yield":
#:   planned only where the plan makes oneCCL's waits yield (``CCL_YIELD=sched_yield``,
#:   which :func:`cpulaunch.distributed.ccl_env` sets when a worker shares a compute CPU),
#:   and then one more busy thread is allowed, whichever it is; with oneCCL's default
#:   (``pause``, workers on cores of their own) it spins on the rank's compute CPU through
#:   every collective, as busy as the main thread, and is reported.
#: - libfabric's provider progress thread (psm3's, polling every 110 ms; the tcp provider
#:   starts none): 0.2-0.3 ms of CPU a second, so busy after 12-16 minutes. "idle":
#:   planned in every ccl rank; told apart by its share of a CPU since it started, below
#:   :data:`IDLE_SHARE` (0.02-0.03% measured), and then not counted.
#:
#: oneCCL's key-value-store server thread stays idle (0.1 ms of CPU in a run) and is not
#: here: it never becomes busy.
CCL_HELPERS = (("the bindings' completion thread", "yield"), ("libfabric's progress thread", "idle"))

#: A busy thread of a ccl rank's process that used less than this share of a CPU since it
#: started is taken for one of the backend's "idle" helpers (:data:`CCL_HELPERS`), as many
#: as are planned. The rank's threads that compete used 10% and more in the runs measured.
IDLE_SHARE = 0.01


@dataclass(frozen=True)
class Planned:
    """Threads the plan itself puts in an instance beside one thread per bound CPU
    (:func:`planned_threads`).

    Attributes:
        workers: logical CPUs of its planned oneCCL workers (one worker pinned to each).
        shared: those of ``workers`` that are compute CPUs (the worker shares the CPU and
            yields); the others were set aside for the workers and are bound CPUs.
        yielding: the "yield" helpers of :data:`CCL_HELPERS` planned here (each allows one
            more busy thread).
        idle: the "idle" helpers planned here (each lets one busy thread under
            :data:`IDLE_SHARE` go uncounted: :meth:`idle_threads`).
    """

    workers: tuple[int, ...] = ()
    shared: tuple[int, ...] = ()
    yielding: tuple[str, ...] = ()
    idle: tuple[str, ...] = ()

    @property
    def helpers(self) -> tuple[str, ...]:
        """Every helper planned here, "yield" ones first."""
        return self.yielding + self.idle

    @property
    def extra(self) -> int:
        """Busy threads allowed beyond one per bound CPU: a worker per shared CPU and each
        yielding helper."""
        return len(self.shared) + len(self.yielding)

    def phrase(self) -> str:
        """``" and the oneCCL worker sharing CPU 0 and the bindings' completion thread"``
        (what :attr:`extra` allows); "" when nothing."""
        parts = ([f"the oneCCL worker sharing CPU {cpulist.format(self.shared)}"] if self.shared else []) \
            + list(self.yielding)
        return " and " + _and(parts) if parts else ""

    def idle_threads(self, view: ProcessView) -> frozenset[int]:
        """Thread ids of ``view``'s own process taken for its idle helpers: busy threads
        other than the main one whose :attr:`~cpulaunch.machine.proc.ThreadView.cpu_share`
        is known and below :data:`IDLE_SHARE`, the least busy first, at most one per idle
        helper planned (pure)."""
        quiet = sorted((t.cpu_share, t.tid) for t in view.threads
                       if t.busy and t.tid != view.pid and t.cpu_share is not None and t.cpu_share < IDLE_SHARE)
        return frozenset(tid for _, tid in quiet[:len(self.idle)])


def _and(parts: Sequence[str]) -> str:
    """``["a", "b", "c"]`` -> ``"a, b and c"``."""
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else "".join(parts)


def planned_threads(exp: Expected) -> Planned:
    """Which threads the plan accounts for in ``exp``'s instance beside one per bound CPU
    (pure): its oneCCL workers, those sharing a compute CPU, and in a ccl rank
    (``exp.backend == "ccl"``) the :data:`CCL_HELPERS` that apply ("yield" ones only when a
    worker shares a compute CPU, so that the plan set ``CCL_YIELD=sched_yield``). The one
    rule verify's stacking and oversubscription checks use."""
    shared = tuple(c for c in exp.ccl_workers if exp.cpus is not None and c in exp.cpus)
    ccl = exp.backend == "ccl"
    return Planned(workers=tuple(exp.ccl_workers), shared=shared,
                   yielding=tuple(w for w, kind in CCL_HELPERS if ccl and kind == "yield" and shared),
                   idle=tuple(w for w, kind in CCL_HELPERS if ccl and kind == "idle"))


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


def compare(exp: Expected, view: ProcessView) -> list[str]:
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
    planned = planned_threads(exp)
    idle = planned.idle_threads(view)
    return (_affinity_warnings(who, procs, bound, planned, idle)
            + _oversubscription_warnings(who, procs, bound or view.cpus, planned, idle)
            + _library_warnings(who, exp, view) + _memory_warnings(who, exp, procs))


def _counted(p: ProcessView, t, idle: frozenset) -> bool:
    """``t`` of ``p`` counts as a compute thread (busy or the main thread) and is not one
    of the idle helpers in ``idle`` (tids of the instance's main process)."""
    return p.counts(t) and t.tid not in idle


def _affinity_warnings(who: str, procs: list, bound: Optional[frozenset], planned: Planned = Planned(),
                       idle: frozenset = frozenset()) -> list:
    """Threads allowed outside ``bound``; busy threads stacked on one CPU (one thread per
    planned oneCCL worker CPU is the worker, there by plan; each of ``planned.yielding``
    may be pinned where the main thread was when it started, so as many more are there by
    plan on whichever CPUs hold several, the latest started first; ``idle`` threads do not
    count)."""
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
            if len(t.cpus) == 1 and _counted(p, t, idle if p is procs[0] else frozenset()):
                stacked.setdefault(next(iter(t.cpus)), []).append(t.tid)
    for cpu in planned.workers:
        if stacked.get(cpu):
            stacked[cpu].pop()
    helpers = len(planned.yielding)
    for cpu, tids in sorted(stacked.items()):
        while helpers and len(tids) > 1:
            tids.pop()
            helpers -= 1
    for cpu, tids in sorted(stacked.items()):
        if len(tids) > 1 and (bound is None or len(bound) > 1):
            out.append(f"{who}: {len(tids)} busy threads pinned to CPU {cpu} alone "
                       f"(threads {', '.join(map(str, tids))}): they take turns on one CPU")
    return out


def _oversubscription_warnings(who: str, procs: list, cpus: frozenset, planned: Planned = Planned(),
                               idle: frozenset = frozenset()) -> list:
    """More busy threads over the instance's processes (``idle`` helpers of its main
    process left out) than ``cpus`` plus the threads the plan accounts for beside them
    (``planned.extra``: workers sharing compute CPUs, yielding helpers)."""
    busy = sum(1 for p in procs for t in p.threads if _counted(p, t, idle if p is procs[0] else frozenset()))
    if not cpus or busy <= len(cpus) + planned.extra:
        return []
    total = sum(len(p.threads) for p in procs)
    return [(f"{who}: {busy} busy threads (of {total} threads in {len(procs)} process(es)) on "
            f"{len(cpus)} CPU(s) {cpulist.format(cpus)}{planned.phrase()}: oversubscribed (set OMP_NUM_THREADS / "
            "torch.set_num_threads and DataLoader num_workers to fit)")]


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
                           f"(the memory binding did not apply); {_where(p.numa.anon_kb_per_node)}")
    if exp.mem_policy == "bind" and exp.mem_nodes:
        total = _anon_kb(procs)
        share = NumaUsage(anon_kb_per_node=total).share_on(exp.mem_nodes)
        if share is not None and share < MIN_BOUND_SHARE:
            out.append(f"{who}: only {share:.0%} of its anonymous memory is on bound node(s) "
                       f"{cpulist.format(exp.mem_nodes)} ({_where(total)})")
    return out


def _where(anon_kb: Mapping[int, int]) -> str:
    """``"node 0: 1024 kB, node 1: 8 kB"`` (anonymous kB per node), or "no anonymous memory"."""
    return ", ".join(f"node {n}: {kb} kB" for n, kb in sorted(anon_kb.items())) or "no anonymous memory"


def _anon_kb(procs) -> dict:
    """Node id -> anonymous kB summed over ``procs`` (those whose numa_maps was read)."""
    total: dict = {}
    for p in procs:
        for n, kb in (p.numa.anon_kb_per_node.items() if p.numa else ()):
            total[n] = total.get(n, 0) + kb
    return total


# --------------------------------------------------------------------------- the whole check


@dataclass(frozen=True)
class InstanceCheck:
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
    warnings: tuple[str, ...]
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

    instances: tuple[InstanceCheck, ...]

    @property
    def warnings(self) -> tuple[str, ...]:
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


def _check(pid: int, exp: Optional[Expected], root) -> InstanceCheck:
    """One instance: inspect, rebuild the expectation when unknown, compare, judge."""
    who = exp.name(pid) if exp is not None else f"pid {pid}"
    try:
        view = inspect(pid, root)
    except NoSuchProcess:
        return InstanceCheck(pid, exp, None, (), f"{who}: gone: no process {pid} (it does not exist or "
                              "has exited)", missing=True)
    except ProcessGone:
        return InstanceCheck(pid, exp, None, (), f"{who}: gone: it exited while verify read it")
    if exp is None and view.environ is not None:
        exp = followed(Expected.from_environ(view.environ), view.environ, root)
        who = exp.name(pid) if exp is not None else who
    why = _cannot_check(view)
    return InstanceCheck(pid, exp, view, tuple(compare(exp or Expected(), view)),
                          f"{who}: cannot check: {why}" if why else "")


def verify(targets: Sequence[tuple[int, Optional[Expected]]], root: str | os.PathLike = "/") -> VerifyReport:
    """Inspect each process and compare it with its instance's plan.

    Args:
        targets: ``(pid, Expected or None)`` pairs, one per instance. With None the
            expectation is rebuilt from the process's CPULAUNCH_* variables
            (:meth:`Expected.from_environ`); without them only plan-free checks run
            (oversubscription against the process's own CPUs, two allocators, two
            OpenMP runtimes). An unreadable environ is a fact not read (cannot-check).
        root: ``/`` or a tree holding ``proc``.

    Returns:
        :class:`VerifyReport`, one :class:`InstanceCheck` per target with its
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
        "backend": e.backend,
    }


def report_json(report: VerifyReport) -> dict[str, Any]:
    """The report as JSON-ready data (what ``verify.json`` holds; docs/guide/doctor.md). Strings
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
            **_ccl_json(r),
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


def _ccl_json(r: InstanceCheck) -> dict:
    """``{"ccl_workers": {"planned": "7", "threads": [tid, ...] or null}}`` for a rank with
    oneCCL workers planned (``threads`` null: they cannot be told apart), and
    ``{"ccl_helpers": {"planned": [what, ...], "idle_threads": [tid, ...]}}`` for a rank
    with :data:`CCL_HELPERS` planned (the busy threads taken for its idle ones); {} otherwise."""
    e = r.expected
    if e is None:
        return {}
    out: dict = {}
    if e.ccl_workers:
        tids = ccl_worker_threads(e, r.view) if r.view is not None else None
        out["ccl_workers"] = {"planned": cpulist.format(e.ccl_workers), "threads": None if tids is None else list(tids)}
    planned = planned_threads(e)
    if planned.helpers:
        idle = planned.idle_threads(r.view) if r.view is not None and not r.view.uncheckable else frozenset()
        out["ccl_helpers"] = {"planned": list(planned.helpers), "idle_threads": sorted(idle)}
    return out


def _ccl_lines(r: InstanceCheck) -> list:
    """``  oneCCL workers planned on CPU(s) 7: thread(s) 123 pinned there`` (or why not), and
    ``  planned beside them: the bindings' completion thread and ... (counted, not named)``."""
    e = r.expected
    if e is None or r.view is None or r.view.uncheckable:
        return []
    out = []
    if e.ccl_workers:
        head = f"  oneCCL workers planned on CPU(s) {cpulist.format(e.ccl_workers)}: "
        tids = ccl_worker_threads(e, r.view)
        if tids is None:
            out.append(head + "every thread of the rank runs there (its only CPU), so they cannot be told apart")
        elif not tids:
            out.append(head + "no thread pinned there yet (oneCCL starts its workers at the first collective)")
        else:
            out.append(head + f"thread(s) {', '.join(map(str, tids))} pinned there")
    planned = planned_threads(e)
    parts = [f"{w} (one busy thread more allowed)" for w in planned.yielding]
    if planned.idle:
        idle = sorted(planned.idle_threads(r.view))
        taken = f"thread(s) {', '.join(map(str, idle))}" if idle else "no busy thread"
        parts += [f"{_and(planned.idle)} ({taken} under {IDLE_SHARE:.0%} of a CPU since it started, not counted)"]
    if parts:
        out.append(f"  also planned in a ccl rank: {_and(parts)}")
    return out


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
        lines += _ccl_lines(r)
        if r.status is Verdict.OK:
            lines.append("  ok: matches the plan" if e is not None else "  ok: no plan-free check failed")
        lines += [f"  warning: {w}" for w in r.warnings]
        lines += [f"  {r.error}"] if r.error else []
    return "".join(printable(line) + "\n" for line in lines)


# --------------------------------------------------------------------------- --verify during a run


def check_run(rendered, settings, pids: Mapping[int, int], run=None) -> None:
    """``cpulaunch --verify``: what each running instance really got (its threads' CPUs,
    libraries, memory), compared with the plan; printed once on stderr and kept as
    verify.json in this run's own folder ``run`` (a :class:`cpulaunch.launch.rundir.RunDir`,
    None without --log-dir; never a folder found by its time stamp: two runs share a log
    folder), written without following a link planted at the name.

    Args:
        rendered: the run's :class:`cpulaunch.render.Rendered` plan.
        settings: its :class:`cpulaunch.render.Settings` (the allocator and OpenMP runtime).
        pids: {instance index: pid} of the instances running.
    """
    from cpulaunch import log as _log
    from cpulaunch.forms import json_text

    log = _log.get(__name__)
    by_index = {i.index: i for i in rendered.instances}
    targets = [(pid, Expected.from_rendered(by_index[idx], allocator=settings.allocator,
                                            omp_runtime=settings.omp_runtime))
               for idx, pid in sorted(pids.items()) if idx in by_index]
    report = verify(targets)
    sys.stderr.write(render_text(report))
    for w in report.warnings:
        log.warning("verify: %s", w)
    if run is not None:
        try:
            run.write("verify.json", json_text(report_json(report)) + "\n")
        except OSError as exc:
            log.warning("cannot write %s: %s", exc.filename, exc.strerror or exc)


# --------------------------------------------------------------------------- the command


@click.command("verify", context_settings=CLICK_CONTEXT)
@shared_option("fmt", help=None, choices=("text", "json"))
@click.argument("pids", nargs=-1, type=int, required=True)
def command(fmt, pids):
    """What running processes really got: every thread's CPUs, thread count, allocator and
    OpenMP runtimes mapped, memory per NUMA node; compared with the CPULAUNCH_* variables
    cpulaunch gave them.

    Exit status: 0 every process matches; 1 a process differs from its plan; 3 none
    differs but one could not be checked (another user's process without root, a zombie,
    a kernel thread) or exited while being read; 2 a usage error (no process with a PID)."""
    from cpulaunch import core
    from cpulaunch.forms import json_text

    report = verify([(pid, None) for pid in pids])
    missing = [str(r.pid) for r in report.instances if r.missing]
    if missing:
        raise CpulaunchError(f"no process with PID {', '.join(missing)} (it does not exist or has already "
                             "exited); give the PID of a running process (ps -e lists them)")
    core.write_out(json_text(report_json(report)) + "\n" if fmt == "json" else render_text(report))
    return report.exit_code


def main(args: Sequence[str]) -> int:
    """``cpulaunch verify ARGS``: returns the exit status (raises CpulaunchError and click's
    usage errors for :func:`cpulaunch.cli.main` to map)."""
    return command.main(args=list(args), prog_name="cpulaunch verify", standalone_mode=False)
