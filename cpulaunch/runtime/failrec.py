"""Record a rank's first failure as it happens, for the launcher (issue 38 item 1).

Why: the launcher used to take the first *process exit* it saw as the root cause. A rank that
calls ``sys.exit(3)`` still runs its exit handlers (and ends its process group) after the call,
and a peer waiting in a collective is told "Connection closed by peer" and may exit first: on
a loaded machine the launcher then blamed the peer. Each Python rank now writes, at the moment
it fails, one line for the launcher with a clock every process of the machine shares
(``CLOCK_MONOTONIC``, the launcher's ``time.monotonic()``), so the launcher can order failures
as they happened, not as the scheduler let them end.

Where: an inherited pipe only this run's launcher reads. The launcher opens one per instance
and names its write end in ``CPULAUNCH_FAILURE_FD`` as ``FD:DEV:INODE``; the hook writes only
when descriptor ``FD`` is that very pipe (``fstat``), so a process that did not inherit it (a
``subprocess`` child: Python closes descriptors by default) or that has another file under
that number writes nothing. No file is opened by name, so no link can redirect it. Forked
children (DataLoader workers) do not record: their parent is the rank.

What is recorded (one JSON line each, under PIPE_BUF bytes, so the write is atomic and never
blocks: the pipe is non-blocking and a full pipe drops the line):

* ``fail``: an uncaught exception in the main thread (``sys.excepthook``; exit code 1, 130 for
  KeyboardInterrupt, which Python turns into SIGINT), at the time the hook runs;
* ``exit``: ``sys.exit(N)`` (also ``exit(N)``/``quit(N)``) with a non-zero code, at the call;
  it is a failure once the interpreter starts its shutdown with it (a program may catch
  ``SystemExit`` and go on);
* ``thread``: an uncaught exception in another thread (``threading.excepthook``): it does not
  end the process, so it only dates a failure that follows;
* a fatal signal (SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL): :mod:`faulthandler`'s report goes
  to the pipe (not to stderr) when the program had not turned faulthandler on itself; the
  launcher dates it when it reads it (its first line, ``Fatal Python error: Segmentation
  fault``), and the process dies of its signal as it would have;
* ``shutdown``: the interpreter starts to exit (``threading``'s exit callbacks, which run before
  every ``atexit`` handler and before non-daemon threads are joined), with the pending
  ``sys.exit`` code if any. A ``raise SystemExit(3)`` not through ``sys.exit`` is dated by it.

Each record holds ``t`` (CLOCK_MONOTONIC seconds), ``pid``, ``code``, ``type`` (the
exception's class name), ``line`` (the last line of its message) and ``frames`` (the last
frames, ``file:line in function``). Nothing is written to the program's streams, and the
program's exit code and hooks stay as they were (the previous ``sys.excepthook`` and
``threading.excepthook`` are called). Nothing is recorded when nothing fails but the one
``shutdown`` line (a few dozen bytes).

Only the standard library is imported; this file is loaded by path by cpulaunch's
``sitecustomize`` (cpulaunch need not be installed in the rank's interpreter).
"""

import os
import stat
import sys
import time

__all__ = ["ENV", "install", "record"]

#: The variable naming the pipe: ``FD:DEV:INODE`` (given by the launcher at spawn).
ENV = "CPULAUNCH_FAILURE_FD"
_MAX = 3800  # < PIPE_BUF (4096): one atomic write
_FRAMES = 4

#: This process's state: the pipe's descriptor (None: not recording), the pending sys.exit.
_STATE = {"fd": None, "pending": None, "failed": False}


def _pipe_from(value: str):
    """The descriptor named by ``value`` (``FD:DEV:INODE``) if it is that pipe, else None."""
    try:
        fd, dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(fd)
    except (ValueError, OSError):
        return None
    if not stat.S_ISFIFO(st.st_mode) or st.st_dev != dev or st.st_ino != ino:
        return None
    return fd


def _frames_of(tb=None, frame=None) -> list:
    out = []
    if tb is not None:
        while tb is not None:
            f = tb.tb_frame
            out.append(f"{f.f_code.co_filename}:{tb.tb_lineno} in {f.f_code.co_name}")
            tb = tb.tb_next
        return out[-_FRAMES:]
    while frame is not None and len(out) < _FRAMES:
        out.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return out[::-1]


def _last_line(value) -> str:
    try:
        text = str(value)
    except Exception:  # noqa: BLE001 - a __str__ that fails is the program's, not ours
        return ""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:400] if lines else ""


def record(event: str, code, type_name: str = "", line: str = "", frames=(), t=None) -> None:
    """Write one record (see the module doc) if this process records; never raises."""
    fd = _STATE["fd"]
    if fd is None:
        return
    doc = {"ev": event, "t": time.clock_gettime(time.CLOCK_MONOTONIC) if t is None else t,
           "pid": os.getpid(), "code": code, "type": type_name, "line": line, "frames": list(frames)}
    try:
        import json  # on the failure path only: start-up stays as cheap as it was

        data = (json.dumps(doc) + "\n").encode("utf-8", "replace")
        while len(data) > _MAX and doc["frames"]:
            doc["frames"] = doc["frames"][1:]
            data = (json.dumps(doc) + "\n").encode("utf-8", "replace")
        if len(data) > _MAX:
            doc["line"] = doc["line"][:200]
            data = (json.dumps(doc) + "\n").encode("utf-8", "replace")
        os.write(fd, data)
    except (OSError, ValueError, TypeError):
        pass


def _exit_code(code) -> int:
    """The process exit status ``sys.exit(code)`` gives (CPython's handle_system_exit)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1


def _on_exception(exc_type, value, tb) -> None:
    if _STATE["failed"]:
        return
    _STATE["failed"] = True
    code = 130 if exc_type is not None and issubclass(exc_type, KeyboardInterrupt) else 1
    record("fail", code, getattr(exc_type, "__name__", ""), _last_line(value), _frames_of(tb=tb))


def _on_exit_call(code) -> None:
    status = _exit_code(code)
    if status and _STATE["pending"] is None:
        line = _last_line(code)  # "3", or the message sys.exit("...") prints
        t = time.clock_gettime(time.CLOCK_MONOTONIC)
        _STATE["pending"] = (t, status)
        record("exit", status, "SystemExit", line, _frames_of(frame=sys._getframe(2)), t=t)


def _on_shutdown() -> None:
    pending = _STATE["pending"]
    record("shutdown", pending[1] if pending else None, "", "", (), t=None)
    _STATE["fd"] = None  # nothing more from this process


def _forked_child() -> None:
    if _STATE["fd"] is not None:
        import faulthandler

        faulthandler.disable()  # the parent's pipe is not the child's to write to
    _STATE["fd"] = None


def install(environ=None) -> bool:
    """Start recording in this process when ``CPULAUNCH_FAILURE_FD`` names an inherited
    pipe (see the module doc); returns True when it does. Wraps ``sys.excepthook``,
    ``threading.excepthook``, ``sys.exit`` and ``exit``/``quit``, each calling what was
    there before."""
    environ = os.environ if environ is None else environ
    fd = _pipe_from(environ.get(ENV, ""))
    if fd is None or _STATE["fd"] is not None:
        return False
    import threading

    _STATE["fd"] = fd
    prev_hook = sys.excepthook

    def excepthook(exc_type, value, tb):
        _on_exception(exc_type, value, tb)
        return prev_hook(exc_type, value, tb)

    sys.excepthook = excepthook
    prev_thread_hook = threading.excepthook

    def thread_hook(args):
        if args.exc_type is not SystemExit:
            record("thread", None, getattr(args.exc_type, "__name__", ""), _last_line(args.exc_value),
                   _frames_of(tb=args.exc_traceback))
        return prev_thread_hook(args)

    threading.excepthook = thread_hook
    real_exit = sys.exit

    def exit(status=None):  # noqa: A001 - sys.exit's own name and signature
        _on_exit_call(status)
        real_exit(status)

    exit.__doc__ = real_exit.__doc__
    sys.exit = exit
    quitter = type(getattr(__import__("builtins"), "exit", None))
    if quitter.__name__ == "Quitter" and "__call__" in quitter.__dict__:
        real_call = quitter.__call__

        def call(self, code=None):
            _on_exit_call(code)
            return real_call(self, code)

        quitter.__call__ = call
    import faulthandler

    if not faulthandler.is_enabled():  # the program's own choice (PYTHONFAULTHANDLER, -X) stands
        try:
            faulthandler.enable(file=fd, all_threads=False)
        except (OSError, ValueError, RuntimeError):
            pass
    try:
        threading._register_atexit(_on_shutdown)
    except (AttributeError, RuntimeError):
        import atexit

        atexit.register(_on_shutdown)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forked_child)
    return True
