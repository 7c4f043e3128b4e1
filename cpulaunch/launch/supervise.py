"""The supervisor: start several instances as one group, forward signals, report the first
failure as the root cause, honour the grace period, and keep the ``--log-dir`` files.

The shape is torchelastic's (``multiprocessing/api.py``: a spec per process, a group with
start / poll / stop(deadline) / close, failures named with their signal); the launcher's
modules, side effects only:

* :mod:`cpulaunch.launch.spawn`: :class:`ProcessSpec` says what one process runs (argv, env
  changes, CPU affinity); :func:`exec_spec` replaces the launcher with a single instance
  (its signals and exit code are then its own).
* :mod:`cpulaunch.launch.group`: :class:`ProcessGroup` starts several, each in its own
  session (so each is a process group the launcher can signal as a whole), relays their
  output and reports exits.
* this module: :func:`run_group` is the supervisor: signals, the first failure as root
  cause, the grace period, the ``--log-dir`` files and the :class:`Outcome`.
* :mod:`cpulaunch.launch.rundir`: :class:`RunDir` is a run's ``--log-dir`` folder: nothing
  in it is written through a link someone else planted (issue 19).
* :mod:`cpulaunch.launch.elastic`: the elastic ``--ddp`` run under torchrun and its rank entry.

Promises (issue 8), each with a real-process test in ``tests/test_launch*.py``:

* Children start with every catchable signal at SIG_DFL and an empty signal mask (Python
  ignores SIGPIPE and SIGXFSZ and handles SIGINT; ignored dispositions survive exec). The
  one exception: SIGHUP ignored by the launcher's own parent (``nohup``) stays ignored,
  in the launcher (not forwarded) and in its children, as ``nohup PROGRAM`` would have it.
* Nothing outlives the launcher, even when it is SIGKILLed at any moment: a watchdog
  process exists before the first child; every child sets PR_SET_PDEATHSIG=SIGKILL
  before exec (and checks its parent is still the launcher, as prctl(2) advises), then
  registers its own process group with the watchdog, still before exec (issue 19: see
  :func:`cpulaunch.launch.spawn._child_setup`); the watchdog killpg()s every registered group
  with SIGKILL when the last write end of its pipe closes. A program that leaves its
  process group (setsid, daemons) is out of the groups' reach; while the launcher lives it
  is a child subreaper (issue 38), so such a process comes back to it when its parent ends
  and is stopped at the end with the rest (``--keep-orphans`` lets it run on). A SIGKILLed
  launcher cannot do that; only a cgroup could.
* No signal is lost while starting: the forwarded signals are blocked while children are
  spawned and registered, then unblocked and delivered to every group.
* SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded to every group
  (torchrun's ``--signals-to-handle``). SIGTSTP (Ctrl-Z) stops every group, then the
  launcher; SIGCONT continues them. Children sit in sessions of their own, whose groups
  the kernel treats as orphaned and in which it discards SIGTSTP, so groups are stopped
  with SIGSTOP.
* Every wait is bounded, including the one after SIGKILL (a process in D state is
  reported, not waited for).
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from cpulaunch import cpulist, forms
from cpulaunch import log as _log
from cpulaunch.launch.group import (
    _HANDLED,
    KILL_TIMEOUT,
    STOPPING_SIGNALS,
    InstanceResult,
    ProcessGroup,
)
from cpulaunch.launch import rootcause
from cpulaunch.launch.rundir import _prepare_run_dir
from cpulaunch.launch.spawn import (
    LaunchError,
    ProcessSpec,
)
from cpulaunch.machine.exec import signal_name
from cpulaunch.option_table import BY_DEST
from cpulaunch.render import json_text

__all__ = ["Outcome", "describe_failure", "run_group"]

log = _log.get(__name__)



@dataclass(frozen=True)
class Outcome:
    """What a supervised run ended with.

    Attributes:
        exit_code: the launcher's exit code, shell style: the root cause's exit code; else
            128+N when the launcher was stopped by signal N; 0 only if every instance
            exited with code 0. A stopping signal received after a failure keeps the
            failure's code (the run had failed already; the signal only hurried it).
        root_cause: index of the first instance that failed before any stopping signal,
            or None.
        results: one :class:`InstanceResult` per spec, in the specs' order.
        signalled: the first stopping signal (SIGINT/TERM/HUP/QUIT) the launcher
            received and forwarded, or None.
        forwarded: every signal forwarded, in order (SIGUSR1/2 included).
        stopped: indices of instances the launcher stopped (SIGTERM) after the root cause.
        run_dir: ``DIR/<run-id>`` with ``--log-dir``, else None.
        verdict: how the root cause was decided (:class:`cpulaunch.launch.rootcause.Verdict`),
            None when no instance failed before a stopping signal.
        endings: what the verdict was decided from, one per started instance.
    """

    exit_code: int
    root_cause: Optional[int]
    results: Tuple[InstanceResult, ...]
    signalled: Optional[int] = None
    forwarded: Tuple[int, ...] = ()
    stopped: Tuple[int, ...] = ()
    run_dir: Optional[Path] = None
    verdict: Optional[rootcause.Verdict] = None
    endings: Tuple[rootcause.Ending, ...] = ()
    orphans: int = 0

    @property
    def codes(self) -> Dict[int, Optional[int]]:
        """Exit code (shell style) of every instance by index; None if it did not exit."""
        return {r.index: r.exit_code for r in self.results}

    def result(self, index: int) -> InstanceResult:
        return next(r for r in self.results if r.index == index)


def describe_failure(outcome: Outcome, specs: Sequence[ProcessSpec] = (), *,
                     keep_going: Optional[bool] = None) -> str:
    """One line saying how the run ended, for stderr.

    ``"instance 1 killed by SIGKILL"``, ``"instance 0 exited with code 3; the others
    were stopped"``, ``"stopped by SIGTERM"``; with ``keep_going`` the other failures are
    counted (``"; 1 other failed too"``); instances that did not exit after SIGKILL are
    appended (``"; instance 0 did not exit after SIGKILL (pid 12)"``). A run that
    succeeded gives ``"every instance exited with code 0"``.

    Args:
        outcome: what :func:`run_group` returned.
        specs: the specs run, for their labels (default: the results' own labels).
        keep_going: the run let the others go on after a failure (count their failures).
    """
    labels = {r.index: r.label for r in outcome.results}
    labels.update({s.index: s.label for s in specs})
    parts = []
    verdict = outcome.verdict
    if outcome.root_cause is not None and verdict is not None and (len(outcome.results) > 1 or verdict.peer_lost):
        endings = [replace(e, label=labels.get(e.index, e.label)) for e in outcome.endings]
        parts.append(rootcause.line(verdict, endings))
        if outcome.signalled is not None:
            parts.append(f"then stopped by {signal_name(outcome.signalled)}")
    elif outcome.root_cause is not None:
        root = outcome.result(outcome.root_cause)
        parts.append(f"{labels[root.index]} {root.describe()}")
        if outcome.stopped:
            parts.append("the others were stopped")
        others = sum(1 for r in outcome.results if r.index != root.index and r.failed and not r.stuck)
        if keep_going and others:
            parts.append(f"{others} other{'s' if others > 1 else ''} failed too")
        if outcome.signalled is not None:
            parts.append(f"then stopped by {signal_name(outcome.signalled)}")
    elif outcome.signalled is not None:
        parts.append(f"stopped by {signal_name(outcome.signalled)}")
    elif outcome.exit_code == 0:
        parts.append("every instance exited with code 0")
    parts += [f"{labels[r.index]} {r.describe()}" for r in outcome.results if r.stuck]
    return "; ".join(parts)


# --------------------------------------------------------------------------- signals


class _Signals:
    """The launcher's handlers while supervising (main thread only; elsewhere a no-op).

    ``hold()`` blocks the handled signals (they stay pending) and installs the handlers
    (and SIGPIPE ignored, SIGCHLD not ignored, whatever the caller had); ``release()``
    unblocks them, so what arrived meanwhile is delivered then; ``restore()`` puts back
    the previous handlers and mask.
    """

    def __init__(self, group: ProcessGroup, grace_period: float) -> None:
        self.group, self.grace_period = group, grace_period
        self.active = threading.current_thread() is threading.main_thread()
        self.signalled: Optional[int] = None
        self.forwarded: List[int] = []
        self.stop_at: Optional[float] = None  # monotonic time for SIGKILL
        self._old: Dict[int, object] = {}
        self._old_mask: Optional[set] = None

    def hold(self) -> None:
        if not self.active:
            return
        self._old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
        if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:  # would reap our children
            self._old[signal.SIGCHLD] = signal.SIG_IGN
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if signal.getsignal(signal.SIGPIPE) != signal.SIG_IGN:  # EPIPE, not death, on a
            self._old[signal.SIGPIPE] = signal.getsignal(signal.SIGPIPE)  # closed console
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        for s in _HANDLED:
            old = signal.getsignal(s)
            if s == signal.SIGHUP and old == signal.SIG_IGN:
                continue  # nohup: stay immune
            self._old[s] = old
            signal.signal(s, self._handle)

    def release(self) -> None:
        if self.active and self._old_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, set(self._old_mask) - set(_HANDLED))

    def restore(self) -> None:
        if not self.active or self._old_mask is None:
            return
        signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
        for s, h in self._old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old_mask)
        self._old_mask = None

    def _handle(self, signum: int, _frame) -> None:
        if signum == signal.SIGTSTP:
            self._suspend()
        elif signum == signal.SIGCONT:
            self.group.resume()
        else:
            self.forwarded.append(signum)
            self.group.send(signum)
            if signum in STOPPING_SIGNALS:
                self.group.interrupts += 1
                if self.signalled is None:
                    self.signalled = signum
                if self.stop_at is None:
                    self.stop_at = time.monotonic() + self.grace_period

    def _suspend(self) -> None:
        """Ctrl-Z: stop the instances, then the launcher itself (as the shell expects of
        a job); when continued, continue them."""
        self.group.pause()
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        try:
            os.kill(os.getpid(), signal.SIGTSTP)  # stops here (unless our group is orphaned)
        finally:
            signal.signal(signal.SIGTSTP, self._handle)
            self.group.resume()


# --------------------------------------------------------------------------- run_group


def _check_grace_period(grace_period: float) -> float:
    try:
        value = float(grace_period)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise LaunchError(f"grace period {grace_period!r} is not a finite number of seconds >= 0; "
                          "pass e.g. --grace-period 10")
    return value


def _check_specs(specs: Sequence[ProcessSpec], stdin_for: Optional[int]) -> None:
    indices = [s.index for s in specs]
    if not specs:
        raise LaunchError("nothing to run: no process specs")
    if len(set(indices)) != len(indices):
        raise LaunchError(f"process indices must be distinct, got {indices}")
    if any(not s.argv for s in specs):
        raise LaunchError("a process spec has an empty command")
    if stdin_for is not None and stdin_for not in indices:
        raise LaunchError(f"stdin_for={stdin_for} names no process (indices {indices})")


def _result_json(outcome: Outcome, specs: Sequence[ProcessSpec], extra: Optional[Mapping] = None) -> str:
    by_index = {s.index: s for s in specs}
    verdict = outcome.verdict or rootcause.Verdict()
    instances = []
    for r in outcome.results:
        d = r.to_dict()
        d["argv"] = list(by_index[r.index].argv)
        d["cpus"] = cpulist.format(by_index[r.index].cpus) if by_index[r.index].cpus else ""
        rec = verdict.records.get(r.index)
        d["root_cause"] = r.index == outcome.root_cause
        d["failed"] = r.index in verdict.failed
        d["failure_time"] = verdict.failed.get(r.index)  # CLOCK_MONOTONIC seconds (the machine's)
        d["failure_time_from"] = ("record" if r.index in verdict.by_record else "exit") if d["failed"] else None
        d["recorded_exit_code"] = rec.get("code") if rec else None
        d["exception"] = rec.get("type") if rec else None
        d["error"] = _error_line(outcome, r.index, rec)
        d["peer_lost"] = r.index in verdict.lost_peer
        d["stopped"] = r.index in verdict.stopped
        instances.append(d)
    doc = {
        "exit_code": outcome.exit_code,
        "root_cause": outcome.root_cause,
        "root_cause_by": verdict.by if outcome.root_cause is not None else None,
        "root_cause_peer_lost": verdict.peer_lost if outcome.root_cause is not None else None,
        "orphans_stopped": outcome.orphans,
        "signalled": signal_name(outcome.signalled) if outcome.signalled is not None else None,
        "forwarded": [signal_name(s) for s in outcome.forwarded],
        "stopped": list(outcome.stopped),
        "description": describe_failure(outcome, specs),
        "instances": instances,
        **(extra or {}),
    }
    return json_text(doc) + "\n"


#: ``--grace-period``'s default, from its row of the option table.
_DEFAULT_GRACE_PERIOD = BY_DEST["grace_period"].default


def _error_line(outcome: Outcome, index: int, rec) -> Optional[str]:
    """The instance's error line: its record's message (``Type: line``), else its last
    non-empty stderr line when it failed; None when it did not fail."""
    verdict = outcome.verdict or rootcause.Verdict()
    if index not in verdict.failed:
        return None
    if rec is not None and rec.get("ev") == "fatal":
        return f"Fatal Python error: {rec.get('line', '')}"
    if rec is not None:
        return f"{rec.get('type') or 'error'}: {rec.get('line', '')}".rstrip(": ")
    ending = next((e for e in outcome.endings if e.index == index), None)
    tail = [ln for ln in (ending.stderr_tail if ending else ()) if ln.strip()]
    return tail[-1].strip() if tail else None


def error_tail(outcome: Outcome) -> List[str]:
    """The root cause's last error lines for ``-v``: its record's frames and message, else its
    last stderr lines (at most 10). Empty without a root cause."""
    verdict = outcome.verdict
    if verdict is None or verdict.root is None:
        return []
    rec = verdict.records.get(verdict.root)
    if rec is not None and rec.get("ev") == "fatal":
        return [f"  {f}" for f in rec.get("frames", [])] + [f"Fatal Python error: {rec.get('line', '')}"]
    if rec is not None:
        return [f"  {f}" for f in rec.get("frames", [])] + [f"{rec.get('type')}: {rec.get('line', '')}"]
    ending = next((e for e in outcome.endings if e.index == verdict.root), None)
    return [ln for ln in (ending.stderr_tail if ending else ()) if ln.strip()][-10:]


def run_group(
    specs: Sequence[ProcessSpec],
    base_environ: Mapping[str, str],
    *,
    log_dir: Optional[Path] = None,
    run_info: Optional[str] = None,
    keep_going: bool = False,
    grace_period: float = _DEFAULT_GRACE_PERIOD,
    prefix_output: bool = True,
    stdin_for: Optional[int] = None,
    stdout: Optional[IO[bytes]] = None,
    stderr: Optional[IO[bytes]] = None,
    kill_timeout: float = KILL_TIMEOUT,
    after: Optional[Tuple[float, Callable[[Dict[int, int]], None]]] = None,
    watch=None,
    records: bool = True,
    reap_orphans: bool = False,
    streams: Optional[Mapping[int, Tuple[int, int]]] = None,
) -> Outcome:
    """Start every spec, relay its output, forward signals, and wait for the end.

    Args:
        specs: what to run (distinct indices).
        base_environ: the user's environment (``os.environ``); never modified.
        log_dir: torchrun's layout: ``DIR/<run-id>/<index>/stdout.log`` and
            ``stderr.log``, ``DIR/<run-id>/plan.json`` (``run_info``, written before
            anything starts) and ``DIR/<run-id>/result.json`` (written at the end). The
            run id is a timestamp made unique, so earlier runs are kept. Nothing is
            written through a link someone planted (:class:`RunDir`). Output still
            goes to the console too. A write error on a log (disk full) is said once per
            file on stderr; the run and its exit code are unaffected.
        run_info: text for ``plan.json`` (the dry-run JSON); None writes no plan.json.
        keep_going: on a failure let the others run to their end.
        grace_period: seconds between SIGTERM and SIGKILL when stopping instances
            (finite, >= 0).
        prefix_output: prefix console lines with ``[index] ``.
        stdin_for: index of the spec that reads the launcher's stdin (others: /dev/null).
        stdout, stderr: binary streams to relay to (default: the launcher's own).
        kill_timeout: seconds to wait for processes to go after SIGKILL before reporting
            them stuck (D state).

    Returns:
        :class:`Outcome` (never raises for a child's failure or a signal). Every group
        has been SIGKILLed and reaped (or reported stuck), the relays drained, the
        signal handlers and mask restored.

    ``after=(seconds, fn)``: once, ``seconds`` after start while instances still run
    and no stop is under way, ``fn({index: pid}, run)`` is called (``--verify``), ``run``
    being this run's :class:`RunDir` (None without ``log_dir``): write files there with
    ``run.write(name, text)``. Its exceptions are logged, never fatal.

    ``records``: give each instance a pipe for its failure records (the root cause is then
    the earliest failure they record: :mod:`cpulaunch.launch.rootcause`). ``reap_orphans``:
    the launcher is a child subreaper while they run, and what they leave behind (daemons
    that left their process group) is stopped at the end; ``Outcome.orphans`` says how many.
    ``streams``: {index: (console, log)} streams of each instance (bits: 1 stdout, 2 stderr;
    default both to both): ``--tee``, ``--redirects``, ``--local-ranks-filter``.

    ``watch``: an object whose ``tick({index: pid})`` is called on every turn of the loop
    (at least every 0.1 s) while instances run and no stop is under way, and whose
    ``record()`` dict is added to result.json, and whose ``close()`` is called at the end,
    whatever happens (``--follow-cpuset``: :class:`cpulaunch.launch.follow.Follower`). Its
    ticks' exceptions are logged, never fatal.

    Raises:
        LaunchError: bad ``grace_period``/specs, unusable log folder (before anything
            starts), or a program that cannot be run (the others are stopped first).
    """
    try:
        return _run_group(specs, base_environ, log_dir=log_dir, run_info=run_info, keep_going=keep_going,
                          grace_period=grace_period, prefix_output=prefix_output, stdin_for=stdin_for,
                          stdout=stdout, stderr=stderr, kill_timeout=kill_timeout, after=after, watch=watch,
                          records=records, reap_orphans=reap_orphans, streams=streams)
    finally:
        if watch is not None:
            watch.close()


def _run_group(specs, base_environ, *, log_dir, run_info, keep_going, grace_period, prefix_output, stdin_for,
               stdout, stderr, kill_timeout, after, watch, records, reap_orphans, streams) -> Outcome:
    grace_period = _check_grace_period(grace_period)
    _check_specs(specs, stdin_for)
    run = None if log_dir is None else _prepare_run_dir(log_dir, specs, run_info)
    try:
        log_files = run.take_logs() if run is not None else {}
        for spec in specs:
            log.info("%s: %s", spec.label, forms.join(spec.argv))
            if spec.index in log_files:
                log.info("%s: output in %s and %s", spec.label, *(f[0] for f in log_files[spec.index]))
        group = ProcessGroup(specs, base_environ, stdin_for=stdin_for, prefix_output=prefix_output,
                             stdout=stdout, stderr=stderr, log_files=log_files, kill_timeout=kill_timeout,
                             records=records, reap_orphans=reap_orphans,
                             console_streams={i: c for i, (c, _) in (streams or {}).items()},
                             log_streams={i: lg for i, (_, lg) in (streams or {}).items()})
        hook = (after[0], lambda pids: after[1](pids, run)) if after is not None else None
        outcome = _supervise(group, grace_period=grace_period, keep_going=keep_going, after=hook, watch=watch)
        if run is None:
            return outcome
        outcome = replace(outcome, run_dir=run.path)
        try:
            run.write("result.json", _result_json(outcome, specs, watch.record() if watch is not None else None))
        except OSError as exc:
            group._say(f"cpulaunch: cannot write {exc.filename}: {exc.strerror}\n")
        return outcome
    finally:
        if run is not None:
            run.close()


def _watch(watch, group: ProcessGroup) -> None:
    """One ``watch.tick`` with the running instances' pids; its failure is logged."""
    pids = {i: p.pid for i, p in group.procs.items() if p.pid is not None and p.running}
    try:
        watch.tick(pids)
    except Exception as exc:  # noqa: BLE001 - watching must never break the run
        log.warning("watching the instances failed: %s: %s", type(exc).__name__, exc)


#: Seconds the others may take to fail on their own when the first failure seen only shows a
#: lost peer (the rank that failed first may still be finishing: its exit handlers, its process
#: group's end). A failure record that does not show a lost peer starts the stop at once, whether
#: or not its process has exited (a rank stuck in a library's finalizer, such as oneCCL's
#: key-value store waiting for its peers, ends once they are stopped); the failing instance
#: itself is not sent SIGTERM, only SIGKILL after the grace period if it is still there.
SETTLE = 2.0


class _Stopper:
    """When and whom to stop after a failure (issue 38 item 2)."""

    def __init__(self, group: ProcessGroup, sig: "_Signals", grace_period: float, keep_going: bool) -> None:
        self.group, self.sig, self.grace_period, self.keep_going = group, sig, grace_period, keep_going
        self.failure_seen = False  # a failure before any stopping signal
        self.started = False
        self.stopped: List[int] = []
        self.hold_until: Optional[float] = None
        self.exited: Dict[int, float] = {}  # instances that failed by exiting: when seen

    def _failing(self) -> List[int]:
        """Running instances whose records say they are failing."""
        return [i for i in self.group.running() if rootcause.definitive_record(self.group.procs[i].records)]

    def tick(self, exited: Sequence[InstanceResult]) -> None:
        if self.sig.signalled is not None and not self.failure_seen:
            return
        now = time.monotonic()
        failing = self._failing()
        peer_failing = [i for i in failing if self._lost_peer(i)]  # a consequence: judged as a lost peer's exit
        failing = [i for i in failing if i not in peer_failing]
        for r in exited:
            if r.failed and self.group.procs[r.index].stopped_at is None:
                self.exited.setdefault(r.index, now)
        if self.exited or failing or peer_failing:
            self.failure_seen = True
        if self.started or self.keep_going:
            return
        # an exit is judged once its stderr is read to the end (0.5 s at most): its last lines
        # may say that it only lost a peer, which makes it a consequence, not the cause
        judged = {i: t for i, t in self.exited.items() if self.group.stderr_done(i) or now - t >= 0.5}
        cause = any(not self._lost_peer(i) for i in judged)
        if failing or cause:
            self._start(now)
            return
        lost = sorted(set(judged) | set(peer_failing))
        if lost and self.hold_until is None:  # only lost peers so far: the first failure may be finishing
            self.hold_until = now + SETTLE
            log.info("%s lost a peer; waiting up to %g s for the one that failed first",
                     ", ".join(self.group.procs[i].spec.label for i in lost), SETTLE)
        if self.hold_until is not None and now >= self.hold_until:
            self._start(now)

    def _lost_peer(self, index: int) -> bool:
        p = self.group.procs[index]
        lines = self.group.stderr_tail(index) + [r.get("line", "") for r in p.records if r.get("ev") == "fail"]
        return rootcause.shows_lost_peer(lines)

    def next_deadline(self) -> Optional[float]:
        if self.started or self.keep_going:
            return None
        times = [t + 0.5 for t in self.exited.values()]
        if self.hold_until is not None:
            times.append(self.hold_until)
        return min(times) if times else None

    def _start(self, now: float) -> None:
        self.started = True
        failing = set(self._failing())
        others = [i for i in self.group.running() if i not in failing]  # a failing one finishes by itself
        self.stopped = others
        if others:
            log.info("stopping %s: SIGTERM, SIGKILL after %g s", ", ".join(
                self.group.procs[i].spec.label for i in others), self.grace_period)
            self.group.send(signal.SIGTERM, others)
        if self.stopped and self.sig.stop_at is None:
            self.sig.stop_at = now + self.grace_period


def _endings(group: ProcessGroup) -> Tuple[rootcause.Ending, ...]:
    return tuple(rootcause.Ending(index=i, label=p.spec.label, returncode=p.returncode, end=p.end_mono,
                                  stopped_at=p.stopped_at, records=tuple(p.records),
                                  stderr_tail=tuple(group.stderr_tail(i)))
                 for i, p in group.procs.items())


def _supervise(group: ProcessGroup, *, grace_period: float, keep_going: bool, after=None, watch=None) -> Outcome:
    """Start ``group`` with signals held, then watch it: a failure before any stopping
    signal (an exit, or a failure record: :class:`_Stopper`) stops the others (SIGTERM,
    unless ``keep_going``); a stopping signal was forwarded by the handler; SIGKILL when the
    grace period is over; stop waiting ``kill_timeout`` after SIGKILL. The root cause is
    decided at the end from everything seen (:func:`cpulaunch.launch.rootcause.decide`)."""
    sig = _Signals(group, grace_period)
    stopper = _Stopper(group, sig, grace_period, keep_going)
    try:
        sig.hold()
        try:
            group.start()
        finally:
            sig.release()  # what arrived while starting is delivered now, to every group
        kill_at: Optional[float] = None
        after_at = time.monotonic() + after[0] if after else None
        while group.running():
            if watch is not None and sig.stop_at is None:
                _watch(watch, group)
            if after_at is not None and time.monotonic() >= after_at and sig.stop_at is None:
                after_at = None
                pids = {i: p.pid for i, p in group.procs.items() if p.pid is not None and not p.reaped}
                try:
                    after[1](pids)
                except Exception as exc:  # noqa: BLE001 - a check must never break the run
                    log.warning("after-start check failed: %s", exc)
            stopper.tick(group.poll())
            now = time.monotonic()
            if kill_at is None and sig.stop_at is not None and now >= sig.stop_at and group.running():
                group.send(signal.SIGKILL)
                kill_at = now + group.kill_timeout
            if kill_at is not None and now >= kill_at:
                break
            deadlines = [t for t in (sig.stop_at, kill_at, after_at, stopper.next_deadline())
                         if t is not None and t > now]
            group.wait(min([0.1] + [t - now for t in deadlines]))
    finally:
        try:
            group.close()
        finally:
            sig.restore()
    results = group.results()
    verdict = rootcause.decide(_endings(group)) if stopper.failure_seen else None
    endings = _endings(group)
    if verdict is not None and verdict.root is not None:
        root, code = verdict.root, verdict.code
    elif sig.signalled is not None:
        root, code = None, 128 + sig.signalled
    else:
        root = None
        code = next((r.exit_code for r in results if r.failed and r.exit_code is not None), 0)
    return Outcome(exit_code=code, root_cause=root, results=results, signalled=sig.signalled,
                   forwarded=tuple(sig.forwarded), stopped=tuple(stopper.stopped), verdict=verdict,
                   endings=endings, orphans=group.orphans_stopped)
