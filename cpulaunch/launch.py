"""Side effects only: exec one instance, or start and supervise several.

Supervision follows torchelastic's local agent: every instance runs in its own session
(``start_new_session=True``, so it is its own process group); SIGINT, SIGTERM and SIGHUP
received by the launcher are forwarded to every group; the first instance to fail is the
root cause, the others get SIGTERM and, after a grace period, SIGKILL; the launcher's exit
code is the root cause's (128+N when killed by signal N, as shells report it), 0 only if
every instance succeeded. Every group is killed before the launcher returns, so nothing
is left behind. Signal handlers are restored afterwards.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Mapping, Optional, Sequence

from cpulaunch import cpulist
from cpulaunch.render import RenderedInstance

__all__ = ["exec_instance", "supervise", "exit_code_of", "Outcome"]

log = logging.getLogger(__name__)

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_code_of(returncode: int) -> int:
    """Popen return code -> shell-style exit code: -N (killed by signal N) -> 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def _child_env(environ: Mapping[str, str], inst: RenderedInstance) -> dict:
    env = dict(environ)
    env.update(inst.env)
    return env


def exec_instance(inst: RenderedInstance, environ: Mapping[str, str]) -> None:
    """Replace this process with the instance (its signals and exit code are its own).

    With ``inst.affinity`` the CPU affinity is narrowed first (sched_setaffinity(2)),
    which the new program inherits. Does not return; raises OSError if exec fails.
    """
    if inst.affinity is not None:
        os.sched_setaffinity(0, inst.affinity)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(inst.argv[0], list(inst.argv), _child_env(environ, inst))


@dataclass
class Outcome:
    """What a supervised run ended with.

    Attributes:
        exit_code: the launcher's exit code (the root cause's, or 0).
        root_cause: index of the first failed instance, or None.
        codes: exit code of every instance by index (128+N for signal N).
        signalled: the signal the launcher received and forwarded, if any.
    """

    exit_code: int
    root_cause: Optional[int]
    codes: dict
    signalled: Optional[int] = None


def _pump(src: IO[bytes], dest: IO[bytes], lock: threading.Lock, tag: bytes, logf: Optional[IO[bytes]]) -> None:
    """Copy lines from a child's pipe to ``dest`` prefixed with ``tag``, and to its log."""
    for line in iter(src.readline, b""):
        if logf is not None:
            logf.write(line)
            logf.flush()
        with lock:
            dest.write(tag + line if line.endswith(b"\n") else tag + line + b"\n")
            dest.flush()
    src.close()


def log_path(log_dir: Path, run_id: str, inst: RenderedInstance) -> Path:
    """``<dir>/<run id>_instance<i>_cpus<cpulist>.log``: the run id keeps earlier runs."""
    return log_dir / f"{run_id}_instance{inst.index}_cpus{cpulist.format(inst.cpus)}.log"


def _new_run_id(log_dir: Path) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_id, n = stamp, 1
    while any(p.name.startswith(run_id + "_") for p in log_dir.iterdir()):
        n += 1
        run_id = f"{stamp}.{n}"
    return run_id


def supervise(
    instances: Sequence[RenderedInstance],
    environ: Mapping[str, str],
    *,
    log_dir: Optional[Path] = None,
    keep_going: bool = False,
    grace_period: float = 10.0,
    prefix_output: bool = True,
    stdout: Optional[IO[bytes]] = None,
    stderr: Optional[IO[bytes]] = None,
) -> Outcome:
    """Start every instance, relay its output with an ``[i]`` prefix, and wait.

    Args:
        instances: rendered instances (argv, env changes, affinity).
        environ: the base environment (the user's); each child gets it plus its env.
        log_dir: write each instance's output to its own file there (created if needed).
        keep_going: on a failure let the others finish instead of stopping them.
        grace_period: seconds between SIGTERM and SIGKILL when stopping instances.
        prefix_output: prefix console lines with ``[i] ``.
        stdout, stderr: binary streams to relay to (default: this process's).

    Returns:
        :class:`Outcome`. Never raises for a child's failure; raises OSError if a child
        cannot be started (after stopping those already started).
    """
    out_stream = stdout or sys.stdout.buffer
    err_stream = stderr or sys.stderr.buffer
    out_lock, err_lock = threading.Lock(), threading.Lock()
    logs: dict = {}
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        run_id = _new_run_id(log_dir)
        for inst in instances:
            logs[inst.index] = open(log_path(log_dir, run_id, inst), "xb")

    procs: dict = {}  # index -> Popen
    received: list = []
    stop_deadline: list = []  # [monotonic time] once stopping began

    def forward(signum, _frame):
        received.append(signum)
        for p in procs.values():
            if p.returncode is None:
                _killpg(p.pid, signum)
        if not stop_deadline:
            stop_deadline.append(time.monotonic() + grace_period)

    old_handlers = {s: signal.getsignal(s) for s in FORWARDED_SIGNALS}
    threads = []
    try:
        for s in FORWARDED_SIGNALS:
            signal.signal(s, forward)
        # Start every child before any relay thread exists: preexec_fn (affinity) is
        # only safe while the parent is single-threaded.
        for inst in instances:
            cpus = inst.affinity
            preexec = (lambda cpus=cpus: os.sched_setaffinity(0, cpus)) if cpus is not None else None
            try:
                procs[inst.index] = subprocess.Popen(
                    list(inst.argv),
                    env=_child_env(environ, inst),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=preexec,
                )
            except OSError:
                for p in procs.values():
                    _killpg(p.pid, signal.SIGKILL)
                    p.wait()
                raise
        for inst in instances:
            p = procs[inst.index]
            tag = f"[{inst.index}] ".encode() if prefix_output else b""
            logf = logs.get(inst.index)
            for src, dest, lock in ((p.stdout, out_stream, out_lock), (p.stderr, err_stream, err_lock)):
                t = threading.Thread(target=_pump, args=(src, dest, lock, tag, logf), daemon=True)
                t.start()
                threads.append(t)

        codes: dict = {}
        root: Optional[int] = None
        killed = False
        while len(codes) < len(procs):
            for idx, p in procs.items():
                if idx in codes or p.poll() is None:
                    continue
                codes[idx] = exit_code_of(p.returncode)
                if codes[idx] != 0 and root is None:
                    root = idx
                    log.debug("instance %d failed with exit code %d", idx, codes[idx])
                    if not keep_going and not stop_deadline:
                        stop_deadline.append(time.monotonic() + grace_period)
                        for q in procs.values():
                            if q.returncode is None:
                                _killpg(q.pid, signal.SIGTERM)
            if stop_deadline and not killed and time.monotonic() >= stop_deadline[0]:
                killed = True
                for q in procs.values():
                    if q.returncode is None:
                        _killpg(q.pid, signal.SIGKILL)
            time.sleep(0.02)
    finally:
        for p in procs.values():  # nothing left behind: grandchildren included
            _killpg(p.pid, signal.SIGKILL)
            if p.returncode is None:
                p.wait()
        for s, h in old_handlers.items():
            signal.signal(s, h)
        for t in threads:
            t.join(timeout=5)
        for f in logs.values():
            f.close()
    exit_code = codes[root] if root is not None else 0
    return Outcome(exit_code=exit_code, root_cause=root, codes=codes, signalled=received[0] if received else None)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
