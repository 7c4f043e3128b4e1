"""A run's ``--log-dir`` folder, ``DIR/<run-id>/<i>/{stdout,stderr}.log`` with ``plan.json``,
``result.json`` and ``verify.json``: made and written relative to open folder descriptors,
new names created with ``O_EXCL|O_NOFOLLOW`` and JSON files renamed into place, so nothing
is ever written through a link someone else planted in a shared or world-writable folder
(issue 19).
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from cpulaunch.launch.spawn import (
    LaunchError,
    ProcessSpec,
)
from cpulaunch.machine.files import NEW_FILE_FLAGS, replace_at

__all__ = ["RunDir"]

# --------------------------------------------------------------------------- the run folder


class _Planted(OSError):
    """A name the launcher was making in its run folder was taken meanwhile: someone
    else can write there."""


_TAKEN = "it exists already (put there by someone else)"
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
        return os.open(name, NEW_FILE_FLAGS | flags, 0o666, dir_fd=dir_fd)
    except FileExistsError:
        raise _Planted(errno.EEXIST, _TAKEN, shown) from None
    except OSError as exc:
        exc.filename = shown
        raise


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
      and renamed over the name (:func:`cpulaunch.machine.files.replace_at`).

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
        replace_at(self.fd, name, text, str(self.path / name))

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
