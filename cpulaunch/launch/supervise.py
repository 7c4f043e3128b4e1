"""Side effects only: exec one instance, or start, relay and supervise several.

The shape is torchelastic's (``multiprocessing/api.py``: a spec per process, a group with
start / poll / stop(deadline) / close, failures named with their signal):

* :class:`ProcessSpec` says what one process runs (argv, env changes, CPU affinity).
* :func:`exec_spec` replaces the launcher with a single instance (its signals and exit
  code are then its own).
* :class:`ProcessGroup` starts several, each in its own session (so each is a process
  group the launcher can signal as a whole), relays their output and reports exits.
* :func:`run_group` is the supervisor: signals, the first failure as root cause, the
  grace period, the ``--log-dir`` files and the :class:`Outcome`.
* :class:`RunDir` is a run's ``--log-dir`` folder: nothing in it is written through a
  link someone else planted (issue 19).

Promises (issue 8), each with a real-process test in ``tests/test_launch*.py``:

* Children start with every catchable signal at SIG_DFL and an empty signal mask (Python
  ignores SIGPIPE and SIGXFSZ and handles SIGINT; ignored dispositions survive exec). The
  one exception: SIGHUP ignored by the launcher's own parent (``nohup``) stays ignored,
  in the launcher (not forwarded) and in its children, as ``nohup PROGRAM`` would have it.
* Nothing outlives the launcher, even when it is SIGKILLed at any moment: a watchdog
  process exists before the first child; every child sets PR_SET_PDEATHSIG=SIGKILL
  before exec (and checks its parent is still the launcher, as prctl(2) advises), then
  registers its own process group with the watchdog, still before exec (issue 19: see
  :func:`cpulaunch.spawn._child_setup`); the watchdog killpg()s every registered group
  with SIGKILL when the last write end of its pipe closes. A program that leaves its
  process group (setsid, daemons) is beyond reach; only a cgroup could follow it.
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

import datetime
import errno
import fcntl
import math
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from cpulaunch import cpulist
from cpulaunch import log as _log
from cpulaunch.render import json_text
from cpulaunch.spawn import (  # noqa: F401 - re-exported: launch's public names stay here
    LaunchError, ProcessSpec, _cannot_run, _child_setup, _environ, _load_prctl, _signals_to_reset,
    exec_spec, exit_code_of, signal_name,
)

__all__ = [
    "LaunchError", "ProcessSpec", "InstanceResult", "Outcome", "ProcessGroup",
    "exec_spec", "run_group", "describe_failure", "RunDir", "write_file",
    "exit_code_of", "signal_name", "FORWARDED_SIGNALS", "STOPPING_SIGNALS",
]

log = _log.get(__name__)

#: Signals the launcher forwards to every instance's process group.
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                     signal.SIGUSR1, signal.SIGUSR2)
#: Forwarded signals that end the run: the launcher then exits with 128+N, and after
#: the grace period SIGKILLs whatever is left. SIGUSR1/SIGUSR2 are only passed on (a
#: program may catch them, e.g. Slurm's ``--signal`` checkpoint request).
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_JOB_CONTROL = (signal.SIGTSTP, signal.SIGCONT)
_HANDLED = FORWARDED_SIGNALS + _JOB_CONTROL

#: Seconds to wait for processes to disappear after SIGKILL before reporting them stuck.
KILL_TIMEOUT = 5.0
#: Seconds to wait, once every instance has exited, for the output relays to drain.
RELAY_TIMEOUT = 2.0
_CHUNK = 65536  # relay read size; also the longest line relayed in one piece


# --------------------------------------------------------------------------- watchdog


class _Watchdog:
    """A forked process that outlives a SIGKILLed launcher just long enough to killpg()
    every registered group with SIGKILL.

    It blocks reading a pipe whose write ends are the launcher's and, between fork and
    exec, each child's: a child writes "+PGID" (its own pid: it leads its group) before
    it execs, so its group is known before anything can run in it; the launcher writes
    "-PGID" just before it reaps a group's leader (the id may be reused after that) and
    "q" to end it quietly. End of file (the launcher died, and no child is still between
    fork and exec) kills every registered group; the data written before it is read
    first. It runs in a session of its own with catchable signals ignored, so neither
    Ctrl-C on the terminal nor a kill of the launcher's process group reaches it.
    """

    def __init__(self) -> None:
        r, w = os.pipe()  # both ends close-on-exec: children never hold them
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the forked child
            code = 0
            try:
                _watchdog_main(r, w)
            except BaseException:
                code = 1
            os._exit(code)
        os.close(r)
        self.pid: Optional[int] = pid
        self._fd: Optional[int] = w

    @property
    def fd(self) -> Optional[int]:
        """The pipe's write end (close-on-exec), for children to register with before
        exec; None once closed."""
        return self._fd

    def forget(self, pgid: int) -> None:
        """The group's leader is about to be reaped: its id may be reused afterwards."""
        self._send(b"-%d\n" % pgid)

    def _send(self, data: bytes) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, data)
        except OSError:  # it died: the launcher still cleans up on every normal path
            pass

    def close(self, timeout: float = 1.0) -> None:
        """Tell it to leave (groups are already reaped) and reap it: ``timeout`` seconds,
        then SIGKILL and ``timeout`` more at most."""
        if self._fd is None:
            return
        self._send(b"q\n")
        os.close(self._fd)
        self._fd = None
        for last_try in (False, True):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(self.pid, os.WNOHANG)[0]:
                        return
                except ChildProcessError:
                    return
                time.sleep(0.002)
            if not last_try:
                os.kill(self.pid, signal.SIGKILL)
        log.info("cpulaunch's watchdog (pid %d) did not exit", self.pid)


def _watchdog_main(r: int, w: int) -> None:  # pragma: no cover - runs in the forked child
    os.close(w)
    os.setsid()
    for s in _HANDLED + (signal.SIGPIPE, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    if r <= 2:  # the launcher ran with a standard stream closed
        r = fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, 3)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, r)  # hold nothing of the launcher's open (its stdout pipe, say)
    os.closerange(r + 1, max(os.sysconf("SC_OPEN_MAX"), r + 1))
    groups: set = set()
    buf = b""
    while True:
        data = os.read(r, 4096)
        if not data:
            for pgid in groups:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except OSError:
                    pass
            return
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line == b"q":
                return
            if line.startswith(b"+"):
                groups.add(int(line[1:]))
            elif line.startswith(b"-"):
                groups.discard(int(line[1:]))


# --------------------------------------------------------------------------- output relay


class _Console:
    """One of the launcher's streams, shared by every relay: one write per batch of
    whole lines under a lock, so lines of different instances never interleave.

    EPIPE (the reader went away, ``| head -1``) marks it ``closed``: relays then close
    their pipes so children get SIGPIPE as in a shell pipeline. Any other error (EIO,
    ENOSPC) marks it ``failed``: said once on stderr, relays keep draining children's
    pipes (and writing logs) without it. Either way the stream's file descriptor is
    then pointed at /dev/null, so nothing (Python's flush at exit included) fails again.
    """

    def __init__(self, stream: IO[bytes], name: str) -> None:
        self.stream, self.name = stream, name
        self.lock = threading.Lock()
        self.closed = False  # EPIPE
        self.failed = False  # any other error
        self.report: Callable[[str], None] = lambda msg: None

    @property
    def usable(self) -> bool:
        return not (self.closed or self.failed)

    def write(self, data: bytes) -> None:
        with self.lock:
            if not self.usable:
                return
            try:
                self.stream.write(data)
                self.stream.flush()
                return
            except BrokenPipeError:
                self.closed = True
                _point_at_devnull(self.stream)
                return
            except (OSError, ValueError) as exc:
                self.failed = True
                cause = getattr(exc, "strerror", None) or str(exc)
                _point_at_devnull(self.stream)  # what stays buffered must not fail again at exit
        self.report(f"cpulaunch: relaying output to {self.name} stopped: {cause}\n")


def _point_at_devnull(stream: IO[bytes]) -> None:
    try:
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError, AttributeError):
        return
    os.dup2(null, fd)
    os.close(null)


def _std_buffer(stream) -> IO[bytes]:
    """The binary layer of sys.stdout/sys.stderr; /dev/null when there is none (a
    launcher started with that descriptor closed)."""
    buffer = getattr(stream, "buffer", None)
    return buffer if buffer is not None else open(os.devnull, "wb")


class _LogFile:
    """An instance's stdout.log or stderr.log; on the first write error it closes, says
    once ``cpulaunch: logging to PATH stopped: <cause>`` and takes no more writes."""

    def __init__(self, path: Path, fd: int, report: Callable[[str], None]) -> None:
        self.path, self.fd, self.report = path, fd, report

    def write(self, data: bytes) -> None:
        if self.fd is None:
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError as exc:
            self.close()
            self.report(f"cpulaunch: logging to {self.path} stopped: {exc.strerror or exc}\n")

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            try:
                os.close(fd)
            except OSError:
                pass


def _tagged(data: bytes, tag: bytes, continued: bool) -> bytes:
    """Prefix each line of ``data`` (which ends with a newline) with ``tag``; the first
    line is a continuation of an over-long line when ``continued``."""
    if not tag:
        return data
    lines = data.split(b"\n")[:-1]
    first = lines[0] if continued else tag + lines[0]
    return b"\n".join([first] + [tag + line for line in lines[1:]]) + b"\n"


class _Relay(threading.Thread):
    """Copies a child's pipe to the console (whole lines, tagged) and its log (raw
    bytes) until end of file, or until the console's reader has gone (then it closes
    the pipe: the child gets SIGPIPE). Closes ``fd`` and the log when done.

    ``writing`` tells :meth:`ProcessGroup.close` whether it is blocked on the console (a
    slow reader such as a paused ``| less``: worth waiting for, as a shell would) or
    on the pipe (all processes gone, so some process outside the group holds it).
    """

    def __init__(self, fd: int, tag: bytes, console: _Console, logfile: Optional[_LogFile], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.fd, self.tag, self.console, self.logfile = fd, tag, console, logfile
        self.writing = False

    def _emit(self, data: bytes) -> None:
        self.writing = True
        try:
            self.console.write(data)
        finally:
            self.writing = False

    def run(self) -> None:
        pending, continued, tag = b"", False, self.tag
        try:
            while True:
                try:
                    chunk = os.read(self.fd, _CHUNK)
                except OSError:
                    break
                if not chunk:
                    break
                if self.logfile is not None:
                    self.logfile.write(chunk)
                if self.console.closed:
                    return
                data = pending + chunk
                cut = data.rfind(b"\n") + 1
                if cut:
                    self._emit(_tagged(data[:cut], tag, continued))
                    pending, continued = data[cut:], False
                else:
                    pending = data
                if len(pending) >= _CHUNK:  # bound memory: relay an endless line in pieces
                    self._emit(pending if continued else tag + pending)
                    pending, continued = b"", True
            if pending:
                self._emit(_tagged(pending + b"\n", tag, continued))
        finally:
            os.close(self.fd)
            if self.logfile is not None:
                self.logfile.close()


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class InstanceResult:
    """How one process ended.

    Attributes:
        index, label: as in its :class:`ProcessSpec`.
        pid: its process id (also its process group id), None if never started.
        returncode: Popen style: the exit status, or -N when killed by signal N; None
            if it never started or did not exit (see ``stuck``).
        core_dumped: killed by a signal and dumped core.
        start, end: wall-clock times (seconds since the epoch) of its start and of the
            moment its exit was seen; ``end`` is None if it did not exit.
        stuck: still there KILL_TIMEOUT seconds after SIGKILL (D state); not waited for.
    """

    index: int
    label: str
    pid: Optional[int] = None
    returncode: Optional[int] = None
    core_dumped: bool = False
    start: Optional[float] = None
    end: Optional[float] = None
    stuck: bool = False

    @property
    def exit_code(self) -> Optional[int]:
        """Shell style: the exit status, 128+N for signal N, None if it did not end."""
        return None if self.returncode is None else exit_code_of(self.returncode)

    @property
    def signal(self) -> Optional[int]:
        """The signal number that killed it, or None."""
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    def describe(self) -> str:
        """``"exited with code 3"``, ``"killed by SIGKILL"``, ``"did not exit after SIGKILL
        (pid 12)"`` or ``"was not started"``."""
        if self.pid is None:
            return "was not started"
        if self.returncode is None:
            return f"did not exit after SIGKILL (pid {self.pid})" if self.stuck else f"still running (pid {self.pid})"
        if self.signal is not None:
            return f"killed by {signal_name(self.signal)}" + (" (core dumped)" if self.core_dumped else "")
        return f"exited with code {self.returncode}"

    def to_dict(self) -> dict:
        return {
            "index": self.index, "label": self.label, "pid": self.pid,
            "exit_code": self.exit_code,
            "signal": signal_name(self.signal) if self.signal is not None else None,
            "core_dumped": self.core_dumped, "stuck": self.stuck,
            "start": _iso(self.start), "end": _iso(self.end),
            "seconds": round(self.end - self.start, 6) if self.start is not None and self.end is not None else None,
            "result": self.describe(),
        }


def _iso(t: Optional[float]) -> Optional[str]:
    if t is None:
        return None
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="microseconds")


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
    """

    exit_code: int
    root_cause: Optional[int]
    results: Tuple[InstanceResult, ...]
    signalled: Optional[int] = None
    forwarded: Tuple[int, ...] = ()
    stopped: Tuple[int, ...] = ()
    run_dir: Optional[Path] = None

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
    if outcome.root_cause is not None:
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


# --------------------------------------------------------------------------- the group


class _Proc:
    """A started child: its Popen, pidfd, times and exit status (seen, not yet reaped:
    an unreaped zombie keeps its pid, so its process group id cannot be reused)."""

    def __init__(self, spec: ProcessSpec, popen: subprocess.Popen, start: float) -> None:
        self.spec, self.popen, self.start = spec, popen, start
        self.pid = popen.pid
        self.returncode: Optional[int] = None
        self.core_dumped = False
        self.end: Optional[float] = None
        self.stuck = False
        self.reaped = False
        try:
            self.pidfd: Optional[int] = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self.pidfd = None

    @property
    def running(self) -> bool:
        return self.returncode is None

    def check(self) -> bool:
        """True once (and only the first time) its exit is seen; does not reap."""
        if not self.running:
            return False
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped by someone else: the status may be lost
            self.reaped = True
            self.returncode = self.popen.returncode if self.popen.returncode is not None else 255
        else:
            if info is None:
                return False
            if info.si_code == os.CLD_EXITED:
                self.returncode = info.si_status
            else:
                self.returncode = -info.si_status
                self.core_dumped = info.si_code == os.CLD_DUMPED
        self.end = time.time()
        return True

    def signal_group(self, sig: int) -> None:
        if self.reaped:
            return
        try:
            os.killpg(self.pid, sig)
        except OSError:  # group empty and leader reaped elsewhere
            pass

    def result(self) -> InstanceResult:
        return InstanceResult(index=self.spec.index, label=self.spec.label, pid=self.pid,
                              returncode=self.returncode, core_dumped=self.core_dumped,
                              start=self.start, end=self.end, stuck=self.stuck)


class ProcessGroup:
    """Several processes started together, each in its own session and process group.

    Args:
        specs: what to run; indices must be distinct.
        base_environ: the user's environment; each child gets it plus ``spec.env``.
        stdin_for: index of the spec that inherits the launcher's stdin; every other one
            reads /dev/null. None: all read /dev/null.
        prefix_output: prefix each console line with ``[index] ``.
        stdout, stderr: binary streams to relay to (default: the launcher's).
        log_files: ``{index: ((stdout_path, fd), (stderr_path, fd))}``: each instance's
            log files, open for writing (:meth:`RunDir.take_logs`); the group owns and
            closes the descriptors. The paths are for messages only.
        kill_timeout: seconds to wait for processes to go after SIGKILL.

    The methods run in the thread that created the group (the main thread, for
    signals); child exits are seen without reaping until :meth:`close`, so a group id
    stays valid for killpg() as long as the group object lives.
    """

    def __init__(self, specs: Sequence[ProcessSpec], base_environ: Mapping[str, str], *,
                 stdin_for: Optional[int] = None, prefix_output: bool = True,
                 stdout: Optional[IO[bytes]] = None, stderr: Optional[IO[bytes]] = None,
                 log_files: Optional[Mapping[int, Tuple[Tuple[Path, int], Tuple[Path, int]]]] = None,
                 kill_timeout: float = KILL_TIMEOUT) -> None:
        self.specs = tuple(specs)
        self.base_environ = base_environ
        self.stdin_for = stdin_for
        self.prefix_output = prefix_output
        self._log_files = dict(log_files or {})
        self.kill_timeout = kill_timeout
        self.out = _Console(stdout if stdout is not None else _std_buffer(sys.stdout), "stdout")
        self.err = _Console(stderr if stderr is not None else _std_buffer(sys.stderr), "stderr")
        self.out.report = self.err.report = self._say
        self.procs: Dict[int, _Proc] = {}
        self.paused = False
        #: monotonic time of the first SIGKILL: waits for processes end kill_timeout after it
        self.kill_sent_at: Optional[float] = None
        self._relays: List[Tuple[int, _Relay]] = []
        #: stopping signals received (set by run_group's handler): one during close()
        #: ends the wait for a console that takes no output
        self.interrupts = 0
        self._watchdog: Optional[_Watchdog] = None
        self._closed = False

    # ----- start

    def start(self) -> None:
        """Start every spec, then one relay thread per pipe (children are all forked
        before any thread exists: the child set-up runs between fork and exec).

        Raises:
            LaunchError: a program cannot be run or a log file cannot be created; the
                processes already started are killed and reaped first.
        """
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        signals, prctl, me = _signals_to_reset(), _load_prctl(), os.getpid()
        pipes: Dict[int, Tuple[int, int]] = {}
        try:
            try:
                self._watchdog = _Watchdog()
            except OSError as exc:  # fork refused: PR_SET_PDEATHSIG still covers the children
                log.info("no watchdog for grandchildren: %s", exc.strerror)
            watchdog_fd = self._watchdog.fd if self._watchdog is not None else None
            for spec in self.specs:
                setup = _child_setup(signals, spec.affinity, me, prctl, watchdog_fd)
                pipes[spec.index] = self._spawn(spec, setup)
            for spec in self.specs:
                self._start_relays(spec, *pipes.pop(spec.index))
        except BaseException:
            for fds in pipes.values():
                for fd in fds:
                    os.close(fd)
            self.close()
            raise

    def _spawn(self, spec: ProcessSpec, setup: Callable[[], None]) -> Tuple[int, int]:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        start = time.time()
        try:
            popen = subprocess.Popen(
                list(spec.argv), env=_environ(self.base_environ, spec),
                stdin=None if spec.index == self.stdin_for else subprocess.DEVNULL,
                stdout=out_w, stderr=err_w, start_new_session=True, preexec_fn=setup,
            )
        except (OSError, ValueError) as exc:
            os.close(out_r), os.close(err_r)
            raise _cannot_run(spec, exc) from None
        except subprocess.SubprocessError:
            os.close(out_r), os.close(err_r)
            what = f"binding it to CPUs {cpulist.format(spec.affinity)}" if spec.affinity else "its set-up"
            raise LaunchError(f"cannot start {spec.label} ({spec.argv[0]!r}): {what} failed "
                              "between fork and exec") from None
        finally:
            os.close(out_w), os.close(err_w)
        self.procs[spec.index] = _Proc(spec, popen, start)  # registered itself with the watchdog
        return out_r, err_r

    def _start_relays(self, spec: ProcessSpec, out_r: int, err_r: int) -> None:
        tag = f"[{spec.index}] ".encode() if self.prefix_output else b""
        logs = self._open_logs(spec.index)
        for fd, console, logfile in ((out_r, self.out, logs[0]), (err_r, self.err, logs[1])):
            relay = _Relay(fd, tag, console, logfile, name=f"{spec.label} {console.name}")
            relay.start()
            self._relays.append((spec.index, relay))

    def _open_logs(self, index: int) -> Tuple[Optional[_LogFile], Optional[_LogFile]]:
        """The instance's log files (already open: never reopened by name), or Nones."""
        if index not in self._log_files:
            return None, None
        out, err = self._log_files.pop(index)
        return _LogFile(out[0], out[1], self._say), _LogFile(err[0], err[1], self._say)

    def _say(self, message: str) -> None:
        """A line of the launcher's own on stderr, whole, between relayed lines."""
        with self.err.lock:
            if not self.err.usable:
                return
            try:
                self.err.stream.write(message.encode(errors="surrogateescape"))
                self.err.stream.flush()
            except (OSError, ValueError):
                pass

    # ----- poll / signal / wait

    def running(self) -> List[int]:
        """Indices of the processes whose exit has not been seen."""
        return [i for i, p in self.procs.items() if p.running]

    def poll(self) -> List[InstanceResult]:
        """The processes that exited since the last call (not reaped yet)."""
        return [p.result() for p in self.procs.values() if p.check()]

    def send(self, sig: int, indices: Optional[Sequence[int]] = None) -> None:
        """killpg(sig) to the groups of ``indices`` (default: every process still running).
        A terminating signal is followed by SIGCONT while the groups are paused."""
        chosen = self.running() if indices is None else indices
        if sig == signal.SIGKILL and chosen and self.kill_sent_at is None:
            self.kill_sent_at = time.monotonic()
        for i in chosen:
            self.procs[i].signal_group(sig)
        if self.paused and sig not in (signal.SIGSTOP, signal.SIGTSTP, signal.SIGCONT):
            for i in chosen:
                self.procs[i].signal_group(signal.SIGCONT)

    def pause(self) -> None:
        """Stop every group (SIGSTOP: SIGTSTP is discarded in these orphaned groups)."""
        self.paused = True
        for p in self.procs.values():
            p.signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        """Continue every group (SIGCONT)."""
        self.paused = False
        for p in self.procs.values():
            p.signal_group(signal.SIGCONT)

    def wait(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds or until some process exits (a signal handler
        running meanwhile does not end the wait early)."""
        fds = [p.pidfd for p in self.procs.values() if p.running and p.pidfd is not None]
        if len(fds) == len(self.running()) and fds:
            select.select(fds, [], [], max(timeout, 0))
        else:
            time.sleep(min(max(timeout, 0), 0.02))

    def stop(self, deadline: float, sig: int = signal.SIGTERM) -> None:
        """``sig`` to every running group; wait until they exit or the monotonic
        ``deadline``, then SIGKILL and wait at most ``kill_timeout`` seconds more."""
        self.send(sig)
        self._wait_until(deadline)
        if self.running():
            self.send(signal.SIGKILL)
            self._wait_until(time.monotonic() + self.kill_timeout)

    def _wait_until(self, deadline: float) -> None:
        while self.running():
            self.poll()
            left = deadline - time.monotonic()
            if left <= 0 or not self.running():
                return
            self.wait(min(left, 0.1))

    # ----- close

    def close(self) -> None:
        """Leave nothing behind: SIGKILL every group (grandchildren included), reap every
        process within ``kill_timeout`` (those left are marked ``stuck``), let the relays
        drain within RELAY_TIMEOUT, end the watchdog. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for files in self._log_files.values():  # of instances never started
            for _, fd in files:
                os.close(fd)
        self._log_files = {}
        for p in self.procs.values():
            p.signal_group(signal.SIGKILL)
        if self.paused:
            self.resume()
        if self.kill_sent_at is None:
            self.kill_sent_at = time.monotonic()
        self._reap(self.kill_sent_at + self.kill_timeout)
        self._drain_relays()
        if self._watchdog is not None:
            self._watchdog.close()
        for p in self.procs.values():
            if p.pidfd is not None:
                os.close(p.pidfd)
                p.pidfd = None

    def _drain_relays(self) -> None:
        """Wait for the relays to reach end of file: as long as one is writing to a slow
        console (unless a stopping signal arrives meanwhile), else RELAY_TIMEOUT at most
        (a process outside the groups may hold a pipe). Stuck processes' relays are
        not waited for: they hold their pipes."""
        relays = [r for i, r in self._relays if not self.procs[i].stuck]
        interrupts, deadline = self.interrupts, time.monotonic() + RELAY_TIMEOUT
        while True:
            relays = [r for r in relays if r.is_alive()]
            if not relays or self.interrupts != interrupts:
                break
            if any(r.writing for r in relays):
                deadline = time.monotonic() + RELAY_TIMEOUT
            elif time.monotonic() >= deadline:
                break
            relays[0].join(0.05)
        for r in relays:
            log.info("%s still open after its processes ended (held by a process outside "
                     "their groups); not waiting for it", r.name)

    def _reap(self, deadline: float) -> None:
        for p in self.procs.values():
            if p.reaped:
                continue
            p.check()
            if self._watchdog is not None:  # the group has had its SIGKILL; reaping the
                self._watchdog.forget(p.pid)  # leader below frees the id for reuse
            try:
                p.popen.wait(timeout=max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                p.stuck = True
                log.info("%s (pid %d) did not exit after SIGKILL", p.spec.label, p.pid)
                continue
            p.reaped = True
            if p.returncode is None:
                p.returncode, p.end = p.popen.returncode, time.time()

    def results(self) -> Tuple[InstanceResult, ...]:
        """One result per spec, in the specs' order (never started: pid None)."""
        return tuple(self.procs[s.index].result() if s.index in self.procs
                     else InstanceResult(index=s.index, label=s.label) for s in self.specs)


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


# --------------------------------------------------------------------------- the run folder


class _Planted(OSError):
    """A name the launcher was making in its run folder was taken meanwhile: someone
    else can write there."""


_TAKEN = "it exists already (put there by someone else)"
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _mkdir_at(parent_fd: int, name: str, shown: str) -> int:
    """mkdir ``name`` in the folder ``parent_fd`` and open it; returns its descriptor.
    ``shown``: its path, as errors name it.

    mkdir fails on any existing name, a symlink included (FileExistsError). The new
    folder is then opened with O_NOFOLLOW and must be the caller's: a link or another
    user's folder swapped in between (a log folder others can write to without the
    sticky bit) raises :class:`_Planted`, never entered.
    """
    try:
        os.mkdir(name, 0o777, dir_fd=parent_fd)
    except OSError as exc:
        exc.filename = shown
        raise
    try:
        fd = os.open(name, _O_DIR, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):  # a link, a file, gone
            raise _Planted(exc.errno, "replaced while it was being made", shown) from None
        exc.filename = shown
        raise
    if os.fstat(fd).st_uid != os.geteuid():
        os.close(fd)
        raise _Planted(errno.EPERM, "replaced by another user's folder while it was being made", shown)
    return fd


def _create_at(dir_fd: int, name: str, shown: str, flags: int = 0) -> int:
    """A new file ``name`` in ``dir_fd`` (O_CREAT|O_EXCL|O_NOFOLLOW: nothing existing is
    opened, a link is never followed); :class:`_Planted` when the name is taken.
    ``shown``: its path, as errors name it."""
    try:
        return os.open(name, _O_NEW | flags, 0o666, dir_fd=dir_fd)
    except FileExistsError:
        raise _Planted(errno.EEXIST, _TAKEN, shown) from None
    except OSError as exc:
        exc.filename = shown
        raise


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _replace_at(dir_fd: int, name: str, text: str, shown: str) -> None:
    """Write ``text`` as ``name`` in the folder ``dir_fd``: to a new temporary file there
    (O_EXCL, a random name), then rename()d over ``name``. rename(2) replaces a link
    planted at the name, never follows it; a folder planted there fails (EISDIR).

    Raises:
        OSError: the write or the rename failed (the temporary file is removed);
            its ``filename`` is ``shown``.
    """
    for _ in range(100):
        tmp = f".{name}.{os.urandom(6).hex()}.tmp"
        try:
            fd = os.open(tmp, _O_NEW, 0o666, dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
    else:
        raise OSError(errno.EEXIST, "no free temporary name", shown)
    try:
        try:
            _write_fd(fd, text.encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as exc:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        if isinstance(exc, OSError):
            exc.filename, exc.filename2 = shown, None
        raise


def write_file(folder: Path, name: str, text: str) -> None:
    """Write ``text`` (UTF-8, surrogate escapes as the bytes they stand for) to
    ``folder/name`` without ever writing through a link planted at ``name``: a new
    temporary file in ``folder`` renamed over it (:func:`_replace_at`).

    Raises:
        OSError: ``folder`` cannot be opened, or the write or rename failed.
    """
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _replace_at(fd, name, text, os.path.join(folder, name))
    finally:
        os.close(fd)


class RunDir:
    """``DIR/<run-id>``: the folder of one run with ``--log-dir`` and every file written
    in it, made so that nothing someone else put there is followed, entered or
    overwritten (issue 19; ``DIR`` may be shared or world-writable):

    * the run folder and ``<index>/`` are made with mkdir relative to open folder
      descriptors (mkdir fails on any existing name, a link included), then opened
      O_NOFOLLOW and checked to be ours (:func:`_mkdir_at`); everything after goes
      through those descriptors, so a folder renamed away or a path swapped later
      changes nothing;
    * ``stdout.log`` and ``stderr.log`` are created O_CREAT|O_EXCL|O_NOFOLLOW and kept
      open (never reopened by name);
    * ``plan.json``, ``result.json``, ``verify.json`` are written to a new temporary file
      and renamed over the name (:func:`_replace_at`).

    ``DIR`` itself is the user's own path and is followed if it is a link. The run id
    is the start time, ``YYYYmmdd-HHMMSS``, then ``-2``, ``-3``... for a name taken
    (earlier runs are kept; a name someone else took is skipped).

    Attributes:
        path: the run folder (for messages and :attr:`Outcome.run_dir`).
    """

    def __init__(self, log_dir: Path) -> None:
        """Make a new run folder under ``log_dir`` (an existing folder).

        Raises:
            OSError: it cannot be made (the cause and file name in the exception).
        """
        self._made: List[Tuple[int, str, bool]] = []  # (folder fd, name, is a folder)
        self._logs: Dict[int, Tuple[Tuple[Path, int], Tuple[Path, int]]] = {}
        self._fds = [os.open(log_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for n in range(1, 10000):
            self.path = Path(log_dir) / (stamp if n == 1 else f"{stamp}-{n}")
            try:
                self.fd = self._mkdir(self._fds[0], self.path)
                return
            except FileExistsError:
                continue
            except BaseException:
                self.close()
                raise
        self.close()
        raise OSError(errno.EEXIST, "too many runs in the same second", str(log_dir))

    def _mkdir(self, parent_fd: int, path: Path) -> int:
        fd = _mkdir_at(parent_fd, path.name, str(path))
        self._fds.append(fd)
        self._made.append((parent_fd, path.name, True))
        return fd

    def add_instance(self, index: int) -> None:
        """Make ``<index>/`` with new, empty ``stdout.log`` and ``stderr.log`` open for
        appending (handed to the group by :meth:`take_logs`).

        Raises:
            OSError: as :meth:`__init__`; :class:`_Planted` when a name was taken.
        """
        folder = self.path / str(index)
        try:
            fd = self._mkdir(self.fd, folder)
        except FileExistsError:  # nothing else makes names in a new run folder
            raise _Planted(errno.EEXIST, _TAKEN, str(folder)) from None
        paths, fds = (folder / "stdout.log", folder / "stderr.log"), []
        try:
            for path in paths:
                fds.append(_create_at(fd, path.name, str(path), os.O_APPEND))
                self._made.append((fd, path.name, False))
        except BaseException:
            for log_fd in fds:
                os.close(log_fd)
            raise
        self._logs[index] = ((paths[0], fds[0]), (paths[1], fds[1]))  # closed by close() until taken

    def take_logs(self) -> Dict[int, Tuple[Tuple[Path, int], Tuple[Path, int]]]:
        """``{index: ((stdout.log path, fd), (stderr.log path, fd))}``; the caller now
        owns (and closes) the descriptors."""
        logs, self._logs = self._logs, {}
        return logs

    def write(self, name: str, text: str) -> None:
        """Write ``name`` (``plan.json``...) in the run folder; never through a link.

        Raises:
            OSError: the write or rename failed (disk full, a folder planted at the name).
        """
        _replace_at(self.fd, name, text, str(self.path / name))

    def remove(self) -> None:
        """Undo a half-made run folder (disk full): remove what this object made, by
        name in the folders it made, newest first. Errors are ignored."""
        for dir_fd, name, is_dir in reversed(self._made):
            try:
                os.rmdir(name, dir_fd=dir_fd) if is_dir else os.unlink(name, dir_fd=dir_fd)
            except OSError:
                pass
        self._made = []

    def close(self) -> None:
        """Close every descriptor this object still holds (logs not taken included)."""
        for out, err in self._logs.values():
            self._fds += [out[1], err[1]]
        self._logs = {}
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = []


def _prepare_run_dir(log_dir: Path, specs: Sequence[ProcessSpec], run_info: Optional[str]) -> RunDir:
    """Make ``DIR/<run-id>/<index>/`` with its logs for every spec, and ``plan.json``.

    Raises:
        LaunchError: naming the log folder and the cause (a file in the way, read-only,
            permission denied, name too long, no space left, a name someone else took
            while the folder was being made).
    """
    log_dir, run = Path(log_dir), None
    try:
        if log_dir.exists() and not log_dir.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "it exists and is not a folder", str(log_dir))
        log_dir.mkdir(parents=True, exist_ok=True)
        run = RunDir(log_dir)
        for spec in specs:
            run.add_instance(spec.index)
        if run_info is not None:
            run.write("plan.json", run_info)
    except OSError as exc:
        if run is not None:  # leave no half-made run folder (disk full)
            run.remove()
            run.close()
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(log_dir) else ""
        hint = ("pass a folder only you can write to --log-dir" if isinstance(exc, _Planted)
                else "pass a writable folder to --log-dir")
        raise LaunchError(f"cannot use log folder {str(log_dir)!r}{where}: {exc.strerror or exc}; "
                          f"{hint}") from None
    return run


def _result_json(outcome: Outcome, specs: Sequence[ProcessSpec]) -> str:
    by_index = {s.index: s for s in specs}
    instances = []
    for r in outcome.results:
        d = r.to_dict()
        d["argv"] = list(by_index[r.index].argv)
        d["cpus"] = cpulist.format(by_index[r.index].cpus) if by_index[r.index].cpus else ""
        instances.append(d)
    doc = {
        "exit_code": outcome.exit_code,
        "root_cause": outcome.root_cause,
        "signalled": signal_name(outcome.signalled) if outcome.signalled is not None else None,
        "forwarded": [signal_name(s) for s in outcome.forwarded],
        "stopped": list(outcome.stopped),
        "description": describe_failure(outcome, specs),
        "instances": instances,
    }
    return json_text(doc) + "\n"


def run_group(
    specs: Sequence[ProcessSpec],
    base_environ: Mapping[str, str],
    *,
    log_dir: Optional[Path] = None,
    run_info: Optional[str] = None,
    keep_going: bool = False,
    grace_period: float = 10.0,
    prefix_output: bool = True,
    stdin_for: Optional[int] = None,
    stdout: Optional[IO[bytes]] = None,
    stderr: Optional[IO[bytes]] = None,
    kill_timeout: float = KILL_TIMEOUT,
    after: Optional[Tuple[float, Callable[[Dict[int, int]], None]]] = None,
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

    Raises:
        LaunchError: bad ``grace_period``/specs, unusable log folder (before anything
            starts), or a program that cannot be run (the others are stopped first).
    """
    grace_period = _check_grace_period(grace_period)
    _check_specs(specs, stdin_for)
    run = None if log_dir is None else _prepare_run_dir(log_dir, specs, run_info)
    try:
        log_files = run.take_logs() if run is not None else {}
        for spec in specs:
            log.info("%s: %s", spec.label, shlex.join(spec.argv))
            if spec.index in log_files:
                log.info("%s: output in %s and %s", spec.label, *(f[0] for f in log_files[spec.index]))
        group = ProcessGroup(specs, base_environ, stdin_for=stdin_for, prefix_output=prefix_output,
                             stdout=stdout, stderr=stderr, log_files=log_files, kill_timeout=kill_timeout)
        hook = (after[0], lambda pids: after[1](pids, run)) if after is not None else None
        outcome = _supervise(group, grace_period=grace_period, keep_going=keep_going, after=hook)
        if run is None:
            return outcome
        outcome = replace(outcome, run_dir=run.path)
        try:
            run.write("result.json", _result_json(outcome, specs))
        except OSError as exc:
            group._say(f"cpulaunch: cannot write {exc.filename}: {exc.strerror}\n")
        return outcome
    finally:
        if run is not None:
            run.close()


def _supervise(group: ProcessGroup, *, grace_period: float, keep_going: bool, after=None) -> Outcome:
    """Start ``group`` with signals held, then watch it: the first failure before any
    stopping signal is the root cause and (unless ``keep_going``) the others get SIGTERM;
    a stopping signal was forwarded by the handler; SIGKILL when the grace period is
    over; stop waiting ``kill_timeout`` after SIGKILL."""
    sig = _Signals(group, grace_period)
    root: Optional[int] = None
    stopped: List[int] = []
    try:
        sig.hold()
        try:
            group.start()
        finally:
            sig.release()  # what arrived while starting is delivered now, to every group
        kill_at: Optional[float] = None
        after_at = time.monotonic() + after[0] if after else None
        while group.running():
            if after_at is not None and time.monotonic() >= after_at and sig.stop_at is None:
                after_at = None
                pids = {i: p.pid for i, p in group.procs.items() if p.pid is not None and not p.reaped}
                try:
                    after[1](pids)
                except Exception as exc:  # noqa: BLE001 - a check must never break the run
                    log.warning("after-start check failed: %s", exc)
            for r in group.poll():
                if r.failed and root is None and sig.signalled is None:
                    root = r.index
                    log.info("%s %s", r.label, r.describe())
                    if not keep_going and group.running():
                        stopped = group.running()
                        group.send(signal.SIGTERM, stopped)
                        sig.stop_at = time.monotonic() + grace_period
            now = time.monotonic()
            if kill_at is None and sig.stop_at is not None and now >= sig.stop_at and group.running():
                group.send(signal.SIGKILL)
                kill_at = now + group.kill_timeout
            if kill_at is not None and now >= kill_at:
                break
            deadlines = [t for t in (sig.stop_at, kill_at, after_at) if t is not None and t > now]
            group.wait(min([0.1] + [t - now for t in deadlines]))
    finally:
        try:
            group.close()
        finally:
            sig.restore()
    results = group.results()
    if root is not None:
        code = exit_code_of(next(r for r in results if r.index == root).returncode)
    elif sig.signalled is not None:
        code = 128 + sig.signalled
    else:
        code = next((r.exit_code for r in results if r.failed and r.exit_code is not None), 0)
    return Outcome(exit_code=code, root_cause=root, results=results, signalled=sig.signalled,
                   forwarded=tuple(sig.forwarded), stopped=tuple(stopped))
