"""Running a short child outside the launcher, and naming how a process ended.

:func:`run_quietly` is the one helper that runs a child to read its answer (numactl's
check, lscpu, ldconfig): posix_spawn and a pipe, bounded in time and output, nothing left
behind. :func:`exit_code_of` and :func:`signal_name` are the one rule for turning a
process's end into a shell-style exit code and a signal's name (the launcher, tune and
verify use them). :data:`signals` is the signal module the run path calls (CPython's
``_signal``, else ``signal``), here and in :mod:`cpulaunch.launch.spawn`.
"""

from __future__ import annotations

import os

from cpulaunch.records import TYPE_CHECKING

try:  # CPython's C module, loaded at the interpreter's start: the same calls and numbers as
    import _signal as signals  # `signal`'s, without the enums it builds (about 1.3 ms; issue 40).
except ImportError:  # pragma: no cover - an interpreter without CPython's _signal
    import signal as signals

if TYPE_CHECKING:
    from typing import Mapping, Optional, Sequence

__all__ = ["exit_code_of", "signal_name", "run_quietly", "start_quietly", "Quiet", "which", "signals", "MAX_OUTPUT"]

#: Default bound on a child's output kept by :func:`run_quietly`.
MAX_OUTPUT = 64 << 10


def which(name: str, path: Optional[str] = None) -> Optional[str]:
    """Where ``name`` runs from, as ``shutil.which(name, path=path)`` answers on POSIX
    (``tests/test_exec.py`` holds the two equal), or None.

    A name holding a ``/`` is checked as it is; otherwise each folder of ``path`` (default:
    ``$PATH``; unset: ``confstr(CS_PATH)``, as shutil) in order, as execvp(3) searches
    them, an empty entry meaning the current folder; the first file that exists, is
    executable (``os.access(X_OK)``) and is not a folder wins. Ours, not shutil's, because
    importing shutil costs every run about 4 ms (it imports bz2, lzma and fnmatch; issue 40,
    docs/dev/measurements.md) and a launcher's program lookup is this loop.

    Args:
        name: a program's name ("numactl") or path ("./run.sh").
        path: folders separated by ``:``; None: the environment's PATH.
    """
    def usable(fn: str) -> bool:
        return os.path.exists(fn) and os.access(fn, os.X_OK) and not os.path.isdir(fn)

    if os.path.dirname(name):
        return name if usable(name) else None
    if path is None:
        path = os.environ.get("PATH")
        if path is None:
            try:
                path = os.confstr("CS_PATH")
            except (AttributeError, ValueError):
                path = os.defpath
    if not path:  # PATH="" finds nothing; PATH=":" is the current folder
        return None
    seen = set()
    for folder in os.fsdecode(path).split(os.pathsep):
        if folder in seen:
            continue
        seen.add(folder)
        candidate = os.path.join(folder, name)
        if usable(candidate):
            return candidate
    return None


def exit_code_of(returncode: int) -> int:
    """Popen return code -> shell-style exit code: -N (killed by signal N) -> 128+N.

    >>> exit_code_of(-9), exit_code_of(3)
    (137, 3)
    """
    return 128 - returncode if returncode < 0 else returncode


def signal_name(n: int) -> str:
    """Signal number -> name as kill -l spells it: 9 -> ``"SIGKILL"``, 36 -> ``"SIGRTMIN+2"``;
    an unknown number -> ``"signal 99"``."""
    import signal

    if signal.SIGRTMIN < n < signal.SIGRTMAX:
        return f"SIGRTMIN+{n - signal.SIGRTMIN}"
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def run_quietly(argv: Sequence[str], timeout: float = 10.0, *, env: Optional[Mapping[str, str]] = None,
                stderr: bool = True, max_output: int = MAX_OUTPUT) -> tuple[int, str]:
    """Run ``argv`` (looked up on PATH) with stdin from /dev/null; ``(exit code, output)``.

    ``output`` is its stdout, and its stderr too unless ``stderr`` is False (then stderr
    goes to /dev/null), at most ``max_output`` bytes, decoded with errors replaced; the exit
    code is shell-style (:func:`exit_code_of`). ``env``: its environment (default this
    process's). Uses os.posix_spawnp and a pipe, not :mod:`subprocess`, whose import costs
    about 4 ms of start-up (issue 12); the one helper cpulaunch runs a short child with
    outside the launcher (numactl's check, lscpu, ldconfig). :func:`start_quietly` and
    :meth:`Quiet.result` are its two halves, for a caller with other work meanwhile.

    Raises:
        OSError: the program cannot be started (ENOENT, EACCES...).
        TimeoutError: it ran longer than ``timeout`` seconds (it is then SIGKILLed and reaped).
    """
    return start_quietly(argv, env=env, stderr=stderr).result(timeout, max_output)


class Quiet:
    """A child :func:`start_quietly` started: its pid and the read end of its output pipe.
    :meth:`result` waits for it, once; until then the child runs on its own."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid, self.fd = pid, fd

    def result(self, timeout: float = 10.0, max_output: int = MAX_OUTPUT) -> tuple[int, str]:
        """``(exit code, output)`` as :func:`run_quietly` gives them; ``timeout`` seconds
        from now at most.

        Raises:
            TimeoutError: the child ran longer (it is then SIGKILLed and reaped).
        """
        import select
        import time

        pid, r = self.pid, self.fd
        chunks, size = [], 0
        deadline = time.monotonic() + timeout
        try:
            poller = select.poll()
            poller.register(r, select.POLLIN)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not poller.poll(left * 1000):
                    os.kill(pid, signals.SIGKILL)
                    os.waitpid(pid, 0)
                    raise TimeoutError(f"timed out after {timeout:g} s")
                data = os.read(r, 65536)
                if not data:
                    break
                if size < max_output:
                    chunks.append(data)
                    size += len(data)
        finally:
            os.close(r)
        _, status = os.waitpid(pid, 0)
        return exit_code_of(os.waitstatus_to_exitcode(status)), b"".join(chunks)[:max_output].decode(errors="replace")


def start_quietly(argv: Sequence[str], *, env: Optional[Mapping[str, str]] = None, stderr: bool = True) -> Quiet:
    """Start ``argv`` as :func:`run_quietly` does and return at once; the caller must call
    the result's :meth:`Quiet.result` (which reaps the child).

    Raises:
        OSError: the program cannot be started (ENOENT, EACCES...).
    """
    r, w = os.pipe()  # both O_CLOEXEC; dup2 makes the child's 1 and 2 inheritable
    try:
        err = (os.POSIX_SPAWN_DUP2, w, 2) if stderr else (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)
        pid = os.posix_spawnp(argv[0], list(argv), os.environ if env is None else env, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, w, 1),
            err,
        ], setsigdef=(signals.SIGPIPE, signals.SIGINT, signals.SIGXFSZ))
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    return Quiet(pid, r)
