"""``--follow-cpuset``: while the instances run, follow the CPUs the job may use.

The CPUs a job may use can change under it: Kubernetes' in-place pod resize with the
static CPU manager, Slurm shrinking a job, an administrator's ``cgset``. Measured on this
project's machine (cgroup v1, docs/guide/placement.md): on a shrink the kernel moves every
thread whose CPUs left onto what remains, so instances planned apart end up on the same
CPUs; on a grow it gives each thread back the mask it had asked for, so CPUs beyond the
first plan stay unused, and a thread whose mask was set while it was shrunk keeps that.
The plan no longer fits either way.

The supervisor calls :meth:`Follower.tick` on every turn of its loop (at least every
0.1 s). The CPUs the job may use are this launcher's affinity mask within the cgroup's
``cpuset.cpus.effective`` (v2; ``cpuset.effective_cpus`` on v1), both read at each tick;
the launcher never changes its own mask, so the kernel keeps it equal to the cpuset (or
to the narrower mask the launcher was started with, ``taskset -c``). On a change:

1. :func:`decide` (pure) plans again on the new CPUs: with the same options, if they give
   the instances that run; else with as many instances as were planned (the options may
   plan another count on other CPUs: ``--nproc-per-node auto``, one per socket); else,
   when even that does not fit (two instances on one core), every instance shares all
   the CPUs until more come back, and says so.
2. every thread of each instance's process group (``/proc/PID/task`` of every process in
   it: :func:`cpulaunch.machine.affinity.pin_group`) gets its instance's new CPUs;
3. the change is said on stderr, kept for ``result.json`` (``--log-dir``), and written to
   the binding file the instances' ``CPULAUNCH_BINDING_FILE`` names, which
   ``cpulaunch verify`` reads, so that it compares a process with its binding now.

What it cannot change: a running OpenMP pool keeps its thread count (a warning names each
instance with more OpenMP threads than CPUs now, and each with CPUs its pool cannot use);
memory already placed stays on its nodes, and the memory policy is the one the instance
started with (set_mempolicy acts on the calling thread only). Ranks of ``--ddp`` keep
their world: a re-plan never changes how many run.
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
import time
from typing import Callable, Mapping, Optional, Sequence

from cpulaunch import cpulist, envvars
from cpulaunch import log as _log
from cpulaunch.errors import CpulaunchError
from cpulaunch.records import Record

__all__ = ["Repin", "Decision", "decide", "Follower", "BINDING_FILE_NAME"]

log = _log.get(__name__)

#: The binding file's name in the follower's own folder.
BINDING_FILE_NAME = "binding.json"


class Repin(Record):
    """One instance's binding after a change.

    Attributes:
        index: the instance's index (its local rank under --ddp).
        label: how messages name it ("instance 1", "rank 1").
        before: the CPUs it was bound to (logical CPU ids).
        cpus: its compute CPUs now; ``bound_cpus``: every CPU it is bound to now.
        threads: the OpenMP threads it started with (OMP_NUM_THREADS), None when unknown.
    """

    index: int
    label: str
    before: tuple[int, ...]
    cpus: tuple[int, ...]
    bound_cpus: tuple[int, ...]
    threads: Optional[int]


class Decision(Record):
    """What :func:`decide` makes of a change.

    Attributes:
        previous, allowed: the CPUs the job could use before and may use now.
        how: "replanned" (same options), "kept-count" (as many instances as planned, the
            options planning another count here) or "shared" (no plan fits: every
            instance on every CPU).
        repins: one per running instance, in index order.
        messages: what the user should know (warnings), one line each.
        rendered: the new plan's instances (None when shared).
    """

    previous: frozenset
    allowed: frozenset
    how: str
    repins: tuple[Repin, ...]
    messages: tuple[str, ...]
    rendered: object = None


def _threads(inst) -> Optional[int]:
    value = (inst.env or {}).get("OMP_NUM_THREADS", "")
    return int(value) if value.isascii() and value.isdigit() else None


def _fmt(cpus) -> str:
    return cpulist.format(cpus) or "none"


def decide(previous: frozenset, allowed: frozenset, running: Sequence, planned: int,
           replan: Callable[[Optional[int]], object]) -> Decision:
    """The new binding of each running instance when the job's CPUs go from ``previous``
    to ``allowed`` (pure when ``replan`` is).

    Args:
        previous, allowed: logical CPU ids.
        running: the running instances as rendered (:class:`cpulaunch.render.RenderedInstance`:
            ``index``, ``label``, ``bound_cpus``, ``env``), the binding they have now.
        planned: how many instances the first plan had in all (``--instance-idx`` may run
            fewer).
        replan: ``replan(None)`` plans the same options on ``allowed``; ``replan(n)``
            plans ``n`` instances there (as ``--ninstances n``, ``--nproc-per-node n``);
            each returns a :class:`cpulaunch.render.Rendered` or raises CpulaunchError.

    Rules: module docstring, steps 1 and the warnings.
    """
    indices = [i.index for i in running]
    how, rendered, why = "replanned", None, ""
    try:
        rendered = replan(None)
        got = {i.index for i in rendered.instances}
        if rendered.num_instances != planned or not set(indices) <= got:
            why = (f"the options plan {rendered.num_instances} instance(s) on CPUs {_fmt(allowed)}, "
                   f"{planned} were planned at start")
            rendered = None
    except CpulaunchError as exc:
        why = str(exc)
    if rendered is None:
        how = "kept-count"
        try:
            rendered = replan(planned)
            if not set(indices) <= {i.index for i in rendered.instances}:
                rendered = None
        except CpulaunchError as exc:
            if str(exc) not in why:
                why += f"; {planned} instance(s): {exc}"
    messages: list = []
    if rendered is None:
        how = "shared"
        everything = tuple(sorted(allowed))
        new = {i.index: (everything, everything) for i in running}
        messages.append(f"cannot plan {planned} instance(s) on CPUs {_fmt(allowed)} ({why}): every instance "
                        "runs on all of them until more CPUs come back")
    else:
        by_index = {i.index: i for i in rendered.instances}
        new = {i.index: (tuple(by_index[i.index].cpus), tuple(by_index[i.index].bound_cpus)) for i in running}
        if how == "kept-count":
            messages.append(f"{why}: planned {planned} instance(s) there instead, so that each keeps its place")
    repins = tuple(Repin(i.index, i.label or f"instance {i.index}", tuple(i.bound_cpus), *new[i.index], _threads(i))
                   for i in sorted(running, key=lambda i: i.index))
    messages += _thread_warnings(repins, how, allowed)
    return Decision(frozenset(previous), frozenset(allowed), how, repins, tuple(messages), rendered)


def _thread_warnings(repins: Sequence[Repin], how: str, allowed: frozenset) -> list:
    """Instances whose running OpenMP pool no longer fits their CPUs (a pool cannot
    shrink: its threads take turns), or cannot use the CPUs they gained."""
    out = []
    if how == "shared":
        total = sum(r.threads or 1 for r in repins)
        if total > len(allowed):
            out.append(f"{', '.join(r.label for r in repins)} share CPUs {_fmt(allowed)} ({len(allowed)}) with "
                       f"{total} OpenMP threads in all: they take turns on them")
        return out
    for r in repins:
        if r.threads is None:
            continue
        if r.threads > len(r.cpus):
            out.append(f"{r.label}: {r.threads} OpenMP threads on {len(r.cpus)} CPU(s) now ({_fmt(r.cpus)}): a "
                       "running OpenMP pool cannot shrink, so they take turns; restart it to plan its threads anew")
        elif r.threads < len(r.cpus):
            out.append(f"{r.label}: {len(r.cpus)} CPUs now ({_fmt(r.cpus)}), but its OpenMP pool keeps the "
                       f"{r.threads} thread(s) it started with; restart it to use them all")
    return out


def _binding_json(allowed: frozenset, instances, changed: Optional[str]) -> str:
    import json

    doc = {"allowed": _fmt(allowed), "changed": changed,
           "instances": {str(i.index): {"label": i.label, "cpus": cpulist.format(i.cpus),
                                        "bound_cpus": cpulist.format(i.bound_cpus)} for i in instances}}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="milliseconds")


class Follower:
    """Watches the job's CPUs and re-pins the instances (side effects; rules in the
    module docstring). Made before the instances start (their environment names its
    binding file: :meth:`env`); :meth:`tick` on every turn of the supervisor's loop;
    :meth:`record` for result.json; :meth:`close` at the end.

    Args:
        topo: the topology the run was planned on (its ``allowed`` is the start).
        rendered: the run's rendered plan (:class:`cpulaunch.render.Rendered`).
        planned: instances planned in all.
        replan: ``replan(topo, count)`` -> Rendered: the run's planning on another
            topology (count None: the same options; else that many instances).
        root: where /proc and the cgroup files are read ("/").
    """

    def __init__(self, topo, rendered, planned: int, replan: Callable, root: str = "/") -> None:
        # What a change needs is imported now, before the instances start, so that a change
        # costs no import: the first one took 15 ms more than the next here, and 0.57 s in a
        # guest under emulation (docs/guide/placement.md), most of it imports. Its messages
        # need none: the command line's are written without logging (cpulaunch.log).
        from cpulaunch.machine import affinity  # noqa: F401
        from cpulaunch.machine.files import FileReader, write_file
        from cpulaunch.machine.probe import cpuset_file

        self.topo, self.rendered, self.planned, self.replan, self.root = topo, rendered, planned, replan, root
        self.allowed = frozenset(topo.allowed)
        self.changes: list = []
        self._fs = FileReader(root)
        self._cpuset_rel = cpuset_file(self._fs)
        self.folder = tempfile.mkdtemp(prefix="cpulaunch-follow-")
        self.binding_file = os.path.join(self.folder, BINDING_FILE_NAME)
        write_file(self.binding_file, _binding_json(self.allowed, rendered.instances, None))
        self._write_file = write_file

    def env(self) -> dict[str, str]:
        """What each instance's environment gets: the binding file's path."""
        return {envvars.BINDING_FILE: self.binding_file}

    def where(self) -> str:
        """Where the CPUs are read, for messages."""
        cpuset = f"cgroup cpuset /{self._cpuset_rel} and " if self._cpuset_rel else ""
        return cpuset + "the launcher's affinity mask"

    def read_allowed(self) -> tuple[frozenset, Optional[frozenset]]:
        """(the CPUs the job may use now, the cgroup's cpuset or None): the launcher's
        affinity mask within the cgroup's cpuset (when one is found), within the online
        CPUs of the first plan."""
        from cpulaunch.machine.probe import parse_cpuset

        now = frozenset(os.sched_getaffinity(0)) & self.topo.online
        cpuset = parse_cpuset(self._fs, self._cpuset_rel) if self._cpuset_rel is not None else None
        if cpuset:
            cpuset &= self.topo.online
            now &= cpuset
        return now, cpuset or None

    def tick(self, pids: Mapping[int, int]) -> None:
        """Check the CPUs once; on a change, re-plan and re-pin every running instance
        (``pids``: {instance index: pid of its process group's leader})."""
        allowed, cpuset = self.read_allowed()
        if allowed == self.allowed or not allowed:
            return
        seen = time.monotonic()
        running = [i for i in self.rendered.instances if i.index in pids]
        topo = self.topo._replace(allowed=allowed, cpuset=cpuset if self.topo.cpuset is not None else None)
        decision = decide(self.allowed, allowed, running, self.planned, lambda count: self.replan(topo, count))
        self._apply(decision, pids, seen)

    def _apply(self, decision: Decision, pids: Mapping[int, int], seen: float) -> None:
        from cpulaunch.machine.affinity import pin_group

        threads, problems = 0, []
        for r in decision.repins:
            done = pin_group(pids[r.index], r.bound_cpus, self.root)
            threads += len(done.threads)
            problems += [f"{r.label}: {p}" for p in done.problems]
        took = time.monotonic() - seen
        self.allowed = decision.allowed
        by_index = {r.index: r for r in decision.repins}
        self.rendered = self.rendered._replace(instances=tuple(
            i._replace(cpus=by_index[i.index].cpus, bound_cpus=by_index[i.index].bound_cpus,
                       affinity=by_index[i.index].bound_cpus if i.affinity is not None else None)
            if i.index in by_index else i for i in self.rendered.instances))
        now = _iso(time.time())
        try:
            self._write_file(self.binding_file, _binding_json(self.allowed, self.rendered.instances, now))
        except OSError as exc:
            problems.append(f"cannot write {exc.filename}: {exc.strerror or exc}")
        moves = ", ".join(f"{r.label}: CPUs {_fmt(r.before)} -> {_fmt(r.bound_cpus)}" for r in decision.repins)
        log.warning("--follow-cpuset: the CPUs this job may use changed from %s to %s (%s): %s; %s; %d thread(s) "
                    "re-pinned in %.1f ms", _fmt(decision.previous), _fmt(decision.allowed), self.where(),
                    {"replanned": "planned again with the same options", "kept-count": "planned again",
                     "shared": "no plan fits"}[decision.how], moves, threads, took * 1000)
        for line in decision.messages + tuple(problems):
            log.warning("--follow-cpuset: %s", line)
        self.changes.append({
            "time": now, "previous": _fmt(decision.previous), "allowed": _fmt(decision.allowed), "how": decision.how,
            "instances": {str(r.index): {"before": cpulist.format(r.before), "cpus": cpulist.format(r.cpus),
                                         "bound_cpus": cpulist.format(r.bound_cpus), "threads": r.threads}
                          for r in decision.repins},
            "threads_repinned": threads, "seconds": round(took, 4),
            "messages": list(decision.messages), "problems": problems,
        })

    def record(self) -> dict:
        """The ``follow_cpuset`` member of result.json: where the CPUs were read and each
        change (time, CPUs before and after, how it was planned, each instance's CPUs,
        threads re-pinned, seconds from seeing the change to the last thread moved)."""
        return {"follow_cpuset": {"watched": self.where(), "changes": list(self.changes)}}

    def close(self) -> None:
        """Remove the binding file and its folder (the instances have ended)."""
        shutil.rmtree(self.folder, ignore_errors=True)
