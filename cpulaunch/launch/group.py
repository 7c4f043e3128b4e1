"""Several processes started together, each in its own session and process group, their output
relayed line by line (``[i]`` prefixed) to the console and to log files, watched by a
watchdog process that SIGKILLs every group should the launcher die (issue 19), and reaped
with bounded waits (torchelastic's ``PContext``: start / poll / stop(deadline) / close).
"""

from __future__ import annotations

import collections
import datetime
import fcntl
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

from cpulaunch import cpulist, envvars
from cpulaunch import log as _log
from cpulaunch.launch.spawn import (
    LaunchError,
    ProcessSpec,
    _cannot_run,
    _child_setup,
    _child_environ,
    _load_prctl,
    _signals_to_reset,
)
from cpulaunch.machine.exec import exit_code_of, signal_name

__all__ = ["FORWARDED_SIGNALS", "STOPPING_SIGNALS", "KILL_TIMEOUT", "RELAY_TIMEOUT", "FLUSH_AFTER", "InstanceResult",
           "ProcessGroup"]

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
_TAIL_LINES = 20  # stderr lines kept per instance, for the failure's cause
_TAIL_BYTES = 1000
_CHUNK = 65536  # relay read size; also the longest line relayed in one piece
#: Seconds the rest of a line waits for its end before it is shown anyway (a prompt or a
#: progress bar printed without a newline reaches the console within this, plus the write).
FLUSH_AFTER = 0.05


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


# --------------------------------------------------------------------------- subreaper

_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
_PR_GET_CHILD_SUBREAPER = 37


def _children(pid: int) -> List[int]:
    """Process ids whose parent is ``pid`` (a scan of /proc/*/stat; a process that ends
    meanwhile is skipped)."""
    out = []
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return out
    for name in entries:
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.append(int(name))
    return out


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2:][:1] in (b"Z", b"X")


class _Subreaper:
    """The launcher as a child subreaper (prctl(2) PR_SET_CHILD_SUBREAPER, issue 38 item 6): a
    process the instances leave behind (a daemon that double-forked and called setsid, a
    ``setsid sleep 61 &``) is re-parented to the launcher instead of to init when its parent
    ends, so that the launcher can stop it at the end. The processes that were the launcher's
    children before (an in-process caller's own) are never touched; the previous setting is
    restored by :meth:`close`."""

    def __init__(self, prctl) -> None:
        import ctypes

        self.prctl = prctl
        self.before = set(_children(os.getpid()))
        flag = ctypes.c_int(0)
        self.previous = flag.value if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 else None
        self.active = prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0

    def stop_orphans(self, known: set, deadline: float) -> int:
        """SIGKILL and reap every child of the launcher that is neither ``known`` nor was a
        child before, again and again as their own descendants come back, until none is left
        or the monotonic ``deadline``; returns how many were alive when found."""
        if not self.active:
            return 0
        me, stopped, seen = os.getpid(), 0, set()
        while time.monotonic() < deadline:
            found = [p for p in _children(me) if p not in known and p not in self.before]
            if not found:
                break
            for pid in found:
                if pid not in seen:
                    seen.add(pid)
                    if not _is_zombie(pid):
                        stopped += 1
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except OSError:
                            pass
            for pid in found:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == 0:
                        time.sleep(0.005)  # SIGKILLed: its exit is a matter of moments
                except ChildProcessError:
                    pass
        return stopped

    def close(self) -> None:
        if self.active and not self.previous:
            self.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        self.active = False


# --------------------------------------------------------------------------- output relay


class _Console:
    """One of the launcher's streams, shared by every relay. Each write is one relay's
    piece, tagged under the lock (:meth:`_LineState.tag`), so pieces of different
    instances never interleave within a line: when a relay writes while another left the
    console's current line open (its last byte was not a newline: a progress bar, a prompt),
    a newline ends that line first and the other relay's next piece starts again with its
    tag, marked as a continuation (``[0]+ ``).

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
        self._open: Optional[object] = None  # who left the current line open (None: at a line's start)

    @property
    def usable(self) -> bool:
        return not (self.closed or self.failed)

    def write(self, data: bytes, state: Optional["_LineState"] = None) -> None:
        """Write ``data``: a relay's raw bytes, tagged here with its ``state``; or (state
        None) whole lines of the launcher's own."""
        with self.lock:
            if not self.usable:
                return
            owner = state if state is not None else self
            head = b""
            if self._open is not None and self._open is not owner:
                head = b"\n"  # end the line another left open
                if isinstance(self._open, _LineState):
                    self._open.interrupted()
            out = head + (state.tag(data) if state is not None else data)
            if not out:
                return
            self._open = None if out.endswith(b"\n") else owner
            cause = self._put(out)
        if cause:
            self.report(f"cpulaunch: relaying output to {self.name} stopped: {cause}\n")

    def _put(self, data: bytes) -> str:
        """Write and flush; returns why it failed ("" when it did not, or on EPIPE)."""
        try:
            self.stream.write(data)
            self.stream.flush()
            return ""
        except BrokenPipeError:
            self.closed = True
            _point_at_devnull(self.stream)
            return ""
        except (OSError, ValueError) as exc:
            self.failed = True
            _point_at_devnull(self.stream)  # what stays buffered must not fail again at exit
            return getattr(exc, "strerror", None) or str(exc)


class _LineState:
    """Where one relay's output stands on the console: at a line's start or within a line
    (after a carriage return the line starts again: a progress bar rewrites it), and
    whether its line was ended by another writer (then its next piece is a continuation).

    :meth:`tag` puts ``tag`` before the first character of every line (after ``\r`` too,
    so a bar redrawn with ``\r`` keeps its prefix; an empty line gets it, as before; the
    ``\n`` of ``\r\n`` does not), and the continuation tag (``[0]+ ``) when the line was
    ended by another writer meanwhile. Example with tag ``b"[0] "``:
    ``b"a\nb"`` -> ``b"[0] a\n[0] b"``; then ``b"c\r 10%"`` -> ``b"c\r[0]  10%"``.
    """

    _SPLIT = re.compile(rb"(\r|\n)")

    def __init__(self, tag: bytes) -> None:
        self.prefix = tag
        self.continued_prefix = tag.rstrip() + b"+ " if tag else b""
        self.at_start = True
        self.after_cr = False
        self.continued = False

    def interrupted(self) -> None:
        """Another writer ended the console's line while this one's was open."""
        if not self.at_start:
            self.at_start, self.continued = True, True
        self.after_cr = False

    def tag(self, data: bytes) -> bytes:
        if not self.prefix:
            if data:
                self.at_start = data.endswith((b"\n", b"\r"))
            return data
        out = []
        for piece in self._SPLIT.split(data):
            if not piece:
                continue
            if piece == b"\r":  # the line is drawn again from its start: a fresh line, not a continuation
                self.at_start, self.after_cr, self.continued = True, True, False
            elif piece == b"\n":
                if self.at_start and not self.after_cr:
                    out.append(self.prefix)
                self.at_start, self.after_cr, self.continued = True, False, False
            else:
                if self.at_start:
                    out.append(self.continued_prefix if self.continued else self.prefix)
                self.at_start, self.after_cr, self.continued = False, False, False
            out.append(piece)
        return b"".join(out)

    @property
    def open(self) -> bool:
        """Its line holds text not yet ended by a newline."""
        return not self.at_start


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


class _Relay(threading.Thread):
    """Copies a child's pipe to the console (tagged) and its log (raw bytes, exactly as
    read) until end of file, or until the console's reader has gone (then it closes the
    pipe: the child gets SIGPIPE). Closes ``fd`` and the log when done.

    What goes to the console: everything up to the last ``\\n`` of what was read at once,
    and all of it when a ``\\r`` follows that (a progress bar redrawn: its state is whole);
    the rest of a line as soon as :data:`FLUSH_AFTER` seconds pass without more of it (a
    prompt), or when it reaches :data:`_CHUNK` bytes (an endless line, relayed in pieces).
    At end of file a line left open gets its newline.

    ``writing`` tells :meth:`ProcessGroup.close` whether it is blocked on the console (a
    slow reader such as a paused ``| less``: worth waiting for, as a shell would) or
    on the pipe (all processes gone, so some process outside the group holds it).
    """

    def __init__(self, fd: int, tag: bytes, console: _Console, logfile: Optional[_LogFile], name: str,
                 fold: Optional[Callable[[bytes], bool]] = None, show: bool = True) -> None:
        super().__init__(name=name, daemon=True)
        self.fd, self.console, self.logfile, self.fold = fd, console, logfile, fold
        self.show = show  # False: to its log only (--redirects, --local-ranks-filter)
        self.state = _LineState(tag)
        self.writing = False
        #: the last lines read (raw bytes, at most _TAIL_LINES): what a failure's cause is read from
        self.tail: Deque[bytes] = collections.deque(maxlen=_TAIL_LINES)
        self._partial = b""

    def _keep_tail(self, chunk: bytes) -> None:
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        self.tail.extend(line[:_TAIL_BYTES] for line in lines)
        self._partial = self._partial[-_TAIL_BYTES:]

    def last_lines(self) -> List[str]:
        """The last lines read (the unfinished one too), decoded leniently."""
        lines = list(self.tail) + ([self._partial] if self._partial else [])
        return [ln.decode(errors="replace").rstrip("\r") for ln in lines[-_TAIL_LINES:]]

    def _emit(self, data: bytes) -> None:
        if not self.show:
            return
        if self.fold is not None and b"\n" in data:  # whole lines the plan's notes stand for
            *lines, tail = data.split(b"\n")
            data = b"".join(line + b"\n" for line in lines if not self.fold(line)) + tail
            if not data:
                return
        self.writing = True
        try:
            self.console.write(data, self.state)
        finally:
            self.writing = False

    def run(self) -> None:
        pending, since = b"", 0.0
        poller = select.poll()
        poller.register(self.fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        try:
            while True:
                if pending:
                    left = since + FLUSH_AFTER - time.monotonic()
                    if left <= 0 or not poller.poll(max(int(left * 1000), 1)):
                        self._emit(pending)  # the rest of a line, shown without waiting for its end
                        pending = b""
                        continue
                try:
                    chunk = os.read(self.fd, _CHUNK)
                except OSError:
                    break
                if not chunk:
                    break
                self._keep_tail(chunk)
                if self.logfile is not None:
                    self.logfile.write(chunk)
                if self.console.closed:
                    return
                if not pending:
                    since = time.monotonic()
                data = pending + chunk
                cut = data.rfind(b"\n") + 1
                if b"\r" in data[cut:]:  # a bar redrawn after \r: what follows it is whole, shown now
                    cut = len(data)
                if cut:
                    self._emit(data[:cut])
                    pending, since = data[cut:], time.monotonic()
                else:
                    pending = data
                if len(pending) >= _CHUNK:  # bound memory: relay an endless line in pieces
                    self._emit(pending)
                    pending = b""
            if pending:
                self._emit(pending)
            if self.state.open:
                self._emit(b"\n")
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

    def to_dict(self) -> Dict[str, Any]:
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


# --------------------------------------------------------------------------- the group


class _Proc:
    """A started child: its Popen, pidfd, times and exit status (seen, not yet reaped:
    an unreaped zombie keeps its pid, so its process group id cannot be reused)."""

    def __init__(self, spec: ProcessSpec, popen: subprocess.Popen, start: float,
                 record_fd: Optional[int] = None) -> None:
        self.spec, self.popen, self.start = spec, popen, start
        self.pid = popen.pid
        self.returncode: Optional[int] = None
        self.core_dumped = False
        self.end: Optional[float] = None
        #: CLOCK_MONOTONIC time its exit was seen (the clock of the failure records)
        self.end_mono: Optional[float] = None
        #: CLOCK_MONOTONIC time the launcher first signalled its group to stop it
        self.stopped_at: Optional[float] = None
        #: the read end of its failure-record pipe (None: no records, or end of file)
        self.record_fd = record_fd
        self.records: List[Dict[str, Any]] = []
        self._record_buf = b""
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
        self.end, self.end_mono = time.time(), time.monotonic()
        return True

    def read_records(self) -> bool:
        """Read what its failure-record pipe holds (non-blocking; see
        :mod:`cpulaunch.runtime.failrec`); True when a record arrived. Lines that are not
        JSON objects are dropped; end of file closes the pipe."""
        if self.record_fd is None:
            return False
        got = False
        while True:
            try:
                data = os.read(self.record_fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self.close_records()
                break
            *lines, self._record_buf = (self._record_buf + data).split(b"\n")
            self._record_buf = self._record_buf[-65536:]
            for line in lines:
                if line.startswith(b"Fatal Python error: "):  # faulthandler's report of a fatal signal
                    what = line[len(b"Fatal Python error: "):].decode(errors="replace").strip()
                    self.records.append({"ev": "fatal", "t": time.monotonic(), "code": None, "type": "", "line": what,
                                         "frames": [], "received": time.monotonic()})
                    got = True
                    continue
                if line.startswith(b'  File "') and self.records and self.records[-1].get("ev") == "fatal":
                    frames = self.records[-1]["frames"]  # faulthandler: most recent call first
                    if len(frames) < 4:
                        frames.insert(0, line.strip().decode(errors="replace"))
                    continue
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if isinstance(doc, dict) and isinstance(doc.get("t"), (int, float)):
                    doc["received"] = time.monotonic()
                    self.records.append(doc)
                    got = True
        return got

    def close_records(self) -> None:
        if self.record_fd is not None:
            fd, self.record_fd = self.record_fd, None
            os.close(fd)

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
                 kill_timeout: float = KILL_TIMEOUT, records: bool = False, reap_orphans: bool = False,
                 console_streams: Optional[Mapping[int, int]] = None,
                 log_streams: Optional[Mapping[int, int]] = None) -> None:
        self.specs = tuple(specs)
        #: {index: streams shown on the console / written to its log}: 1 stdout, 2 stderr (default 3)
        self.console_streams = dict(console_streams or {})
        self.log_streams = dict(log_streams or {})
        self.records = records
        self.reap_orphans = reap_orphans
        #: how many processes the instances left behind were stopped at the end (reap_orphans)
        self.orphans_stopped = 0
        self._subreaper: Optional[_Subreaper] = None
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
        if self.reap_orphans and prctl is not None:
            self._subreaper = _Subreaper(prctl)
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
        env = _child_environ(self.base_environ, spec)
        rec_r = rec_w = None
        if self.records:  # its failure records (cpulaunch.runtime.failrec): one pipe per instance
            rec_r, rec_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)  # never blocks the writer either
            st = os.fstat(rec_w)
            env[envvars.FAILURE_FD] = f"{rec_w}:{st.st_dev}:{st.st_ino}"
        start = time.time()
        try:
            popen = subprocess.Popen(
                list(spec.argv), env=env,
                stdin=None if spec.index == self.stdin_for else subprocess.DEVNULL,
                stdout=out_w, stderr=err_w, start_new_session=True, preexec_fn=setup,
                pass_fds=(rec_w,) if rec_w is not None else (),
            )
        except (OSError, ValueError) as exc:
            os.close(out_r), os.close(err_r)
            if rec_r is not None:
                os.close(rec_r)
            raise _cannot_run(spec, exc) from None
        except subprocess.SubprocessError:
            os.close(out_r), os.close(err_r)
            if rec_r is not None:
                os.close(rec_r)
            what = f"binding it to CPUs {cpulist.format(spec.affinity)}" if spec.affinity else "its set-up"
            raise LaunchError(f"cannot start {spec.label} ({spec.argv[0]!r}): {what} failed "
                              "between fork and exec") from None
        finally:
            os.close(out_w), os.close(err_w)
            if rec_w is not None:
                os.close(rec_w)
        self.procs[spec.index] = _Proc(spec, popen, start, rec_r)  # registered itself with the watchdog
        return out_r, err_r

    def _start_relays(self, spec: ProcessSpec, out_r: int, err_r: int) -> None:
        tag = f"[{spec.index}] ".encode() if self.prefix_output else b""
        logs = self._open_logs(spec.index)
        fold = None
        if spec.env.get(envvars.DIST_BACKEND) == "ccl":  # oneCCL's warnings about the planned values: one note
            from cpulaunch.distributed import ccl_expected_warning

            fold = ccl_expected_warning(spec.env)
        shown = self.console_streams.get(spec.index, 3)
        for bit, (fd, console, logfile) in ((1, (out_r, self.out, logs[0])), (2, (err_r, self.err, logs[1]))):
            relay = _Relay(fd, tag, console, logfile, name=f"{spec.label} {console.name}", fold=fold,
                           show=bool(shown & bit))
            relay.start()
            self._relays.append((spec.index, relay))

    def _open_logs(self, index: int) -> Tuple[Optional[_LogFile], Optional[_LogFile]]:
        """The instance's log files (already open: never reopened by name), or Nones."""
        if index not in self._log_files:
            return None, None
        out, err = self._log_files.pop(index)
        logged = self.log_streams.get(index, 3)
        files = []
        for bit, (path, fd) in ((1, out), (2, err)):
            if logged & bit:
                files.append(_LogFile(path, fd, self._say))
            else:  # --tee/--redirects leave this stream out of the log (the file stays, empty)
                os.close(fd)
                files.append(None)
        return files[0], files[1]

    def _say(self, message: str) -> None:
        """A line of the launcher's own on stderr, whole, between relayed lines (a line an
        instance left open is ended first)."""
        self.err.write(message.encode(errors="surrogateescape"))

    # ----- poll / signal / wait

    def running(self) -> List[int]:
        """Indices of the processes whose exit has not been seen."""
        return [i for i, p in self.procs.items() if p.running]

    def poll(self) -> List[InstanceResult]:
        """The processes that exited since the last call (not reaped yet). Their failure
        records are read first, so a record written before the exit is there with it."""
        self.read_records()
        return [p.result() for p in self.procs.values() if p.check()]

    def read_records(self) -> List[int]:
        """Read every instance's failure-record pipe; the indices that got a record."""
        return [i for i, p in self.procs.items() if p.read_records()]

    def stderr_done(self, index: int) -> bool:
        """Whether instance ``index``'s stderr has been read to its end."""
        return not any(i == index and relay.console is self.err and relay.is_alive() for i, relay in self._relays)

    def stderr_tail(self, index: int) -> List[str]:
        """The last lines (at most 20) instance ``index`` wrote to stderr so far."""
        for i, relay in self._relays:
            if i == index and relay.console is self.err:
                return relay.last_lines()
        return []

    def send(self, sig: int, indices: Optional[Sequence[int]] = None) -> None:
        """killpg(sig) to the groups of ``indices`` (default: every process still running).
        A terminating signal is followed by SIGCONT while the groups are paused."""
        chosen = self.running() if indices is None else indices
        if sig == signal.SIGKILL and chosen and self.kill_sent_at is None:
            self.kill_sent_at = time.monotonic()
        for i in chosen:
            if sig in STOPPING_SIGNALS + (signal.SIGKILL,) and self.procs[i].stopped_at is None:
                self.procs[i].stopped_at = time.monotonic()
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
            fds += [p.record_fd for p in self.procs.values() if p.running and p.record_fd is not None]
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
        if self._subreaper is not None:
            known = {p.pid for p in self.procs.values()}
            if self._watchdog is not None and self._watchdog.pid is not None:
                known.add(self._watchdog.pid)
            self.orphans_stopped = self._subreaper.stop_orphans(known, time.monotonic() + self.kill_timeout)
            self._subreaper.close()
        self._drain_relays()
        if self._watchdog is not None:
            self._watchdog.close()
        for p in self.procs.values():
            p.read_records()
            p.close_records()
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
