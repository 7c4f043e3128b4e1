"""One process: what it runs (:class:`ProcessSpec`), its set-up between fork and exec, and
:func:`exec_spec`, which replaces the launcher with a single instance.

Split from :mod:`cpulaunch.launch` (which re-exports every name here) so that the common
case, one instance exec'd in place, imports neither the supervisor nor what it needs
(threads, select, json, datetime): about 3 ms of start-up (issue 12).

The child set-up follows launch.py's promises (issue 8): every catchable signal at SIG_DFL
and an empty signal mask before exec (Python ignores SIGPIPE and SIGXFSZ and handles
SIGINT; ignored dispositions survive exec), SIGHUP kept ignored under ``nohup``, and
PR_SET_PDEATHSIG=SIGKILL for supervised children (prctl(2)).
"""

from __future__ import annotations

import os
import sys
from types import MappingProxyType

from cpulaunch import cpulist
from cpulaunch.errors import CpulaunchError
from cpulaunch.machine.exec import signals as signal  # _signal: no enums on the exec path (issue 40)
from cpulaunch.records import TYPE_CHECKING, Record

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Mapping, NoReturn, Optional, Sequence, Tuple

__all__ = ["LaunchError", "ProcessSpec", "exec_spec"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class LaunchError(CpulaunchError):
    """A run could not start: program not runnable, log folder unusable, bad grace period."""


# --------------------------------------------------------------------------- the spec


class ProcessSpec(Record):
    """What one process runs.

    Attributes:
        index: instance (or local rank) index; names its log folder and ``[i]`` prefix.
        label: how messages name it, e.g. ``"instance 1"`` or ``"rank 1"``.
        argv: the full command (binding prefix included). ``argv[0]`` is looked up on PATH.
        env: variables set on top of the base environment. Values are ``str`` as
            ``os.environ`` holds them: non-UTF-8 bytes as surrogate escapes, which
            exec re-encodes to the original bytes (never decode/encode them strictly).
        affinity: logical CPU ids (as in /sys/devices/system/cpu/cpuN) to set with
            sched_setaffinity(2) before exec; None leaves the affinity as inherited.
        cpus: logical CPU ids of the instance, for display and log names only.
    """

    index: int
    label: str
    argv: Tuple[str, ...]
    env: Mapping[str, str] = MappingProxyType({})
    affinity: Optional[Tuple[int, ...]] = None
    cpus: Tuple[int, ...] = ()

    def to_json(self) -> Dict[str, Any]:
        """The spec as JSON-ready values: ``{"index", "label", "argv", "env", "affinity",
        "cpus"}`` (lists for tuples; ``affinity`` None when inherited). What the elastic
        launcher hands each rank entry (:mod:`cpulaunch.launch.elastic`)."""
        return {"index": self.index, "label": self.label, "argv": list(self.argv), "env": dict(self.env),
                "affinity": list(self.affinity) if self.affinity is not None else None,
                "cpus": list(self.cpus)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "ProcessSpec":
        """The spec :meth:`to_json` gave.

        Raises:
            KeyError, TypeError, ValueError: ``doc`` is not such a value.
        """
        affinity = doc["affinity"]
        return cls(index=int(doc["index"]), label=str(doc["label"]), argv=tuple(doc["argv"]),
                   env=dict(doc["env"]), affinity=tuple(affinity) if affinity is not None else None,
                   cpus=tuple(doc["cpus"]))


def _child_environ(base: Mapping[str, str], spec: ProcessSpec) -> Dict[str, str]:
    env = dict(base)
    env.update(spec.env)
    return env


def _cannot_run(spec: ProcessSpec, exc: BaseException) -> LaunchError:
    if isinstance(exc, OSError):
        cause = exc.strerror or str(exc)
    elif isinstance(exc, ValueError):  # "embedded null byte" in argv or env
        cause = f"{exc} in its command line or environment"
    else:
        cause = str(exc)
    return LaunchError(f"cannot run {spec.argv[0]!r}: {cause}")


# --------------------------------------------------------------------------- child set-up


def _signals_to_reset() -> Tuple[int, ...]:
    """Every catchable signal, less SIGHUP when it is ignored on entry (``nohup``)."""
    keep = {signal.SIGKILL, signal.SIGSTOP}
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        keep.add(signal.SIGHUP)
    return tuple(s for s in sorted(signal.valid_signals()) if s not in keep)


def _reset_signals(signals: Sequence[int]) -> None:
    for s in signals:
        try:
            signal.signal(s, signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _load_prctl() -> Optional[Callable]:
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None


def _child_setup(signals: Tuple[int, ...], affinity, launcher_pid: int, prctl,
                 watchdog_fd: Optional[int] = None) -> Callable[[], None]:
    """The function run in each child between fork and exec (Popen's preexec_fn, after
    its setsid(): the child leads a process group of its own; the launcher has no other
    thread then): parent-death signal, registration with the watchdog, affinity, default
    dispositions, empty mask.

    Why this order (issue 19: nothing may outlive a launcher SIGKILLed at any moment):

    * PR_SET_PDEATHSIG=SIGKILL first, then getppid() checked (prctl(2)): a launcher that
      died before the prctl is caught by the check and the child SIGKILLs itself; one
      that dies after it kills the child. Either way before exec nothing else is in the
      child's group.
    * Then ``"+<pid>\\n"`` is written to the watchdog's pipe (``watchdog_fd``: its write
      end, inherited by the fork, close-on-exec), one write under PIPE_BUF, so atomic.
      The group is thus known to the watchdog before the program can exec and fork
      anything into it; the watchdog reads everything written before it sees end of
      file, and end of file needs every write end closed: the launcher's and those of
      children not yet exec'd. Registering from the parent after Popen returned left a
      window (after exec, before the registration) in which a SIGKILLed launcher left
      the program's children behind. SIGPIPE is ignored around the write: a dead
      watchdog is an error to ignore, not a death (the signals are reset just after).
    """

    def setup() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != launcher_pid:  # the launcher died before prctl: prctl(2)
                os.kill(os.getpid(), signal.SIGKILL)
        if watchdog_fd is not None:
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)
            try:
                os.write(watchdog_fd, b"+%d\n" % os.getpid())
            except OSError:  # the watchdog is gone: the launcher's own clean-up remains
                pass
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
        _reset_signals(signals)  # last: the mask unblocks only once all else is done

    return setup


def _execvpe(file: str, argv: list, env: Mapping[str, str]) -> NoReturn:
    """``os.execvpe(file, argv, env)`` without its one import: the search of ``env``'s PATH
    (``os.defpath`` when it has none) that os.py's ``_execvpe`` makes, step for step: a
    ``file`` with a slash is exec'd as it is; otherwise each folder in turn, going on past a
    missing file or folder (ENOENT, ENOTDIR) and past any other error, and raising the first
    such other error (EACCES for a file that is not executable), else the last one.

    Why not os.execvpe: its ``os.get_exec_path`` imports :mod:`warnings` for every bare
    program name, and a run imports nothing it does not use (issue 40; tests/test_wheel.py).

    Raises:
        OSError: as execve(2) does, per the rule above; ValueError: a NUL byte.
    """
    if "/" in file:
        os.execve(file, argv, env)
    saved = last = None
    name = os.fsencode(file)  # as os.py does: an error's filename is then bytes there too
    for folder in env.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(os.fsencode(folder), name), argv, env)
        except (FileNotFoundError, NotADirectoryError) as exc:
            last = exc
        except OSError as exc:
            last = exc
            saved = saved or exc
    raise saved or last or FileNotFoundError(2, "No such file or directory", file)


def exec_spec(spec: ProcessSpec, base_environ: Mapping[str, str]) -> NoReturn:
    """Replace this process with ``spec`` (a single instance needs no supervisor).

    Before exec: every catchable signal back to SIG_DFL (SIGHUP stays ignored under
    ``nohup``), an empty signal mask, ``spec.affinity`` set with sched_setaffinity(2),
    Python's stdout/stderr flushed. stdin, stdout and stderr are the launcher's.

    Args:
        spec: what to run; ``spec.env`` is applied on top of ``base_environ``.
        base_environ: the user's environment (``os.environ``); not modified.

    Raises:
        LaunchError: ``cannot run 'PROG': <strerror>`` when exec fails (the launcher's
            dispositions and mask are restored first) or the affinity cannot be set.
    """
    env = _child_environ(base_environ, spec)
    if spec.affinity is not None:
        try:
            os.sched_setaffinity(0, spec.affinity)
        except OSError as exc:
            raise LaunchError(f"cannot bind {spec.label} to CPUs {cpulist.format(spec.affinity)}: "
                              f"{exc.strerror}") from None
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    signals = _signals_to_reset()
    saved = {s: signal.getsignal(s) for s in signals}
    saved_mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    _reset_signals(signals)
    try:
        _execvpe(spec.argv[0], list(spec.argv), env)
    except (OSError, ValueError) as exc:
        for s, h in saved.items():
            if h is not None:
                signal.signal(s, h)
        signal.pthread_sigmask(signal.SIG_SETMASK, saved_mask)
        raise _cannot_run(spec, exc) from None
