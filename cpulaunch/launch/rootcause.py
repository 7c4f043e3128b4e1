"""Which instance failed first, and how everyone else ended (issue 38 items 3 and 4). Pure: a
function of what the supervisor saw (exit statuses, when it saw them, when it stopped whom,
the failure records of :mod:`cpulaunch.runtime.failrec`, the last stderr lines).

The rules:

* An instance **failed on its own** when it recorded a failure (an uncaught exception, or a
  ``sys.exit(N)``, N != 0, with which the interpreter began to exit), or when it exited
  non-zero (or by a signal) before the launcher signalled it to stop, or with a status the
  stop does not give (an exit code, SIGSEGV: not SIGTERM or SIGKILL). An instance the
  launcher stopped that recorded nothing is **stopped**, not failed.
* Its **failure time** is its record's (CLOCK_MONOTONIC, which every process of the machine
  shares with the launcher's ``time.monotonic()``): the exception hook's time, the
  ``sys.exit`` call's, or else the start of its interpreter's shutdown or an earlier uncaught
  exception in one of its threads; without any record, the moment the launcher saw it exit.
* A failure that shows a **lost peer** (its last stderr lines or its record's message hold one
  of :data:`PEER_LOST`) is a consequence when another instance failed on its own.
* The **root cause** is the earliest failure that is not a consequence; when every failure
  shows a lost peer (a rank on another machine died, say), the earliest of those, marked
  ``peer_lost`` so that the launcher does not call it the first failure.
* The **code** is the root cause's recorded code when it recorded one (a rank stuck in a
  library's finalizer and then killed keeps the code it failed with), else its exit status,
  shell style (128+N for signal N).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from cpulaunch.machine.exec import exit_code_of, signal_name

__all__ = ["PEER_LOST", "Ending", "Verdict", "decide", "definitive_record", "shows_lost_peer"]

#: Lines that say a peer went away, as the backends write them (checked case-sensitively,
#: anywhere in a line):
#:
#: * gloo: ``"Connection closed by peer "`` + the peer's address (gloo/transport/tcp/pair.cc
#:   and tcp/tls/pair.cc, a read that returns 0 bytes); a read that fails with ECONNRESET
#:   is reported with ``strerror``: ``"Connection reset by peer"``.
#: * oneCCL's key-value store: ``"read: can not process all data"`` (the ``DO_RW_OP`` macro in
#:   src/atl/util/pm/pmi_resizable_rt/pmi_resizable/def.h: a read of 0 bytes, the peer closed)
#:   and ``"read/write error: "`` + ``strerror``, which for a reset is again
#:   ``"Connection reset by peer"``; ``"Broken pipe"`` (EPIPE, a write to a closed peer).
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "can not process all data",
             "Broken pipe")


def shows_lost_peer(lines: Sequence[str]) -> bool:
    """Whether any of ``lines`` holds one of :data:`PEER_LOST`."""
    return any(p in line for line in lines for p in PEER_LOST)


def definitive_record(records: Sequence[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """The record that says the process is failing, or None: the first ``fail`` (uncaught
    exception), or a ``shutdown`` with a non-zero code (the interpreter exits with a
    ``sys.exit(N)``: then the ``exit`` record's time, type, message and frames)."""
    exits = [r for r in records if r.get("ev") == "exit"]
    for r in records:
        if r.get("ev") == "fail" and isinstance(r.get("code"), int):
            return dict(r)
        if r.get("ev") == "fatal":  # a fatal signal, dated when the launcher read faulthandler's report
            return dict(r)
        if r.get("ev") == "shutdown" and isinstance(r.get("code"), int) and r["code"]:
            call = next((e for e in exits if e.get("code") == r["code"]), None)
            return dict(call if call is not None else {**r, "type": "SystemExit"})
    return None


@dataclass(frozen=True)
class Ending:
    """What the supervisor knows of one instance at the end.

    Attributes:
        index, label: as in its spec.
        returncode: Popen style (-N for signal N); None if it did not exit (stuck).
        end: CLOCK_MONOTONIC seconds when its exit was seen (None: not seen).
        stopped_at: CLOCK_MONOTONIC seconds when the launcher first signalled it to stop.
        records: its failure records (:mod:`cpulaunch.runtime.failrec`), in arrival order.
        stderr_tail: its last stderr lines.
    """

    index: int
    label: str
    returncode: Optional[int] = None
    end: Optional[float] = None
    stopped_at: Optional[float] = None
    records: Tuple[Mapping[str, Any], ...] = ()
    stderr_tail: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Verdict:
    """The decision, per instance and for the run.

    Attributes:
        root: index of the root cause, or None (nothing failed on its own).
        by: how it was decided: ``"records"`` (its failure time came from its record) or
            ``"exit order"``; None without a root.
        peer_lost: the root cause itself shows a lost peer: no instance here failed before
            it (a rank on another machine did, most likely).
        code: the launcher's exit code for the root cause (None without one).
        failed: {index: failure time} of the instances that failed on their own.
        lost_peer: indices whose failure shows a lost peer.
        stopped: indices the launcher stopped that had not failed on their own.
        records: {index: its definitive record} (type, line, frames, code, t).
    """

    root: Optional[int] = None
    by: Optional[str] = None
    peer_lost: bool = False
    code: Optional[int] = None
    failed: Mapping[int, float] = field(default_factory=dict)
    lost_peer: frozenset = frozenset()
    stopped: frozenset = frozenset()
    records: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    by_record: frozenset = frozenset()


#: What the launcher's stop can end a process with (SIGTERM, SIGKILL; SIGINT, SIGHUP and
#: SIGQUIT when it forwards them): any other end is the process's own.
_STOPPED_BY = (-15, -9, -2, -1, -3)


def _own_exit_failure(e: Ending) -> bool:
    """It ended badly by itself: non-zero, and not (after the launcher's stop) by the stop's
    signal. The launcher sees an exit after the fact (a process's sockets close, and its
    peers learn of it, before its exit is reported), so a status no stop gives (an exit code,
    SIGSEGV) is its own even when seen after the stop began."""
    if e.returncode is None or e.returncode == 0:
        return False
    if e.stopped_at is None or (e.end is not None and e.end <= e.stopped_at):
        return True
    return e.returncode not in _STOPPED_BY


def _time_of(e: Ending, rec: Optional[Mapping[str, Any]]) -> Tuple[Optional[float], bool]:
    """(failure time, from a record?) of an instance that failed on its own."""
    if rec is not None:
        return float(rec["t"]), True
    early = [float(r["t"]) for r in e.records if r.get("ev") in ("thread", "shutdown")]
    if early:
        return min(early), True
    return e.end, False


def decide(endings: Sequence[Ending]) -> Verdict:
    """Apply the module's rules to ``endings``."""
    failed: Dict[int, float] = {}
    from_record, lost, stopped, recs = set(), set(), set(), {}
    for e in endings:
        rec = definitive_record(e.records)
        if e.returncode == 0:  # it ended well after all (a program may catch SystemExit)
            rec = None
        if rec is not None:
            recs[e.index] = rec
        if rec is None and not _own_exit_failure(e):
            if e.stopped_at is not None and e.returncode != 0:
                stopped.add(e.index)
            continue
        t, by_rec = _time_of(e, rec)
        failed[e.index] = t if t is not None else float("inf")
        if by_rec:
            from_record.add(e.index)
        if shows_lost_peer(list(e.stderr_tail) + ([rec.get("line", "")] if rec else [])):
            lost.add(e.index)
    if not failed:
        return Verdict(stopped=frozenset(stopped), records=recs)
    causes = [i for i in failed if i not in lost] or list(failed)
    root = min(causes, key=lambda i: (failed[i], i))
    ending = next(e for e in endings if e.index == root)
    if root in recs and isinstance(recs[root].get("code"), int):
        code = int(recs[root]["code"])
    elif ending.returncode is not None:
        code = exit_code_of(ending.returncode)
    else:
        code = 1
    return Verdict(root=root, by="records" if root in from_record else "exit order", peer_lost=root in lost,
                   code=code, failed=failed, lost_peer=frozenset(lost), stopped=frozenset(stopped),
                   records=recs, by_record=frozenset(from_record))


def _how(e: Ending, rec: Optional[Mapping[str, Any]]) -> str:
    """``exit 3 (SystemExit)``, ``exit 1 (RuntimeError)``, ``exited 3``, ``killed by SIGKILL``."""
    if rec is not None and isinstance(rec.get("code"), int):
        kind = f" ({rec['type']})" if rec.get("type") else ""
        return f"exit {rec['code']}{kind}"
    if e.returncode is None:
        return "did not exit"
    if e.returncode < 0:
        return f"killed by {signal_name(-e.returncode)}"
    return f"exit {e.returncode}"


def line(verdict: Verdict, endings: Sequence[Ending]) -> str:
    """The one line (without ``cpulaunch: ``), e.g. ``rank 1 failed first: exit 3
    (SystemExit); rank 0 exited 1 after it (peer closed); rank 2 stopped``; when the root cause
    shows a lost peer: ``rank 0 exited 1 (peer closed: no rank here failed before it; a peer on
    another machine was lost, most likely); rank 1 stopped``. Empty without a root cause."""
    if verdict.root is None:
        return ""
    by = {e.index: e for e in endings}
    root = by[verdict.root]
    rec = verdict.records.get(root.index)
    if verdict.peer_lost:
        parts = [f"{root.label} {_ended(root, rec)} (peer closed: no rank here failed before it; "
                 "a peer on another machine was lost, most likely)"]
    else:
        parts = [f"{root.label} failed first: {_how(root, rec)}"]
    for e in endings:
        if e.index == root.index:
            continue
        if e.index in verdict.failed:
            peer = " (peer closed)" if e.index in verdict.lost_peer else ""
            parts.append(f"{e.label} {_ended(e, verdict.records.get(e.index))} after it{peer}")
        elif e.index in verdict.stopped:
            parts.append(f"{e.label} stopped")
    return "; ".join(parts)


def _ended(e: Ending, rec: Optional[Mapping[str, Any]]) -> str:
    if e.returncode is not None and e.returncode < 0 and rec is None:
        return f"was killed by {signal_name(-e.returncode)}"
    if rec is not None and isinstance(rec.get("code"), int):
        return f"exited {rec['code']}"
    return f"exited {e.returncode}" if e.returncode is not None else "did not exit"
