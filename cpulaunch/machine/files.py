"""Every file cpulaunch opens on the host, through one bounded reader and one safe writer.

Reading (:func:`read_regular`, :class:`FileReader`): regular files only, opened with
``O_NONBLOCK`` and checked with ``fstat`` before any read, at most a bound of bytes, so a
FIFO, a device (``/dev/zero`` linked in place of a file) or an endless file costs that one
fact, never a hang or the memory; below a root (``lscpu --sysroot``'s meaning) for dumps.

Writing (:func:`write_file`, :func:`replace_at`, :func:`append_whole`): a file is written
whole or not at all and never through a link someone else planted at its name: a new
``O_EXCL|O_NOFOLLOW`` file beside it, renamed over the name (rename(2) replaces a link, it
never follows one), or ``O_APPEND|O_NOFOLLOW`` for a record appended in one write.
"""

from __future__ import annotations

import errno
import os
import stat

from cpulaunch.errors import printable
from cpulaunch.machine.topology import TopologyError
from cpulaunch.records import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Optional, Union

__all__ = ["MAX_FILE_BYTES", "UnusableFileError", "read_regular", "corrupt", "FileReader",
           "NEW_FILE_FLAGS", "write_fd", "replace_at", "write_file", "append_whole"]

#: Largest file the probe reads (sysfs attributes are at most a page; a cpulist of 8,192
#: CPUs is under 40 KiB). A bigger file is an error where it matters, else a note.
MAX_FILE_BYTES = 1 << 20

_FIRST_READ = 65536
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a link"}


class UnusableFileError(Exception):
    """A file that opened but cannot be used: ``str(exc)`` says why, without the path
    (``"not a regular file (a FIFO)"``, ``"larger than 1048576 bytes"``, ``"cannot read
    (Input/output error)"``); the caller names the file."""


def read_regular(path: str, cap: int = MAX_FILE_BYTES, truncate: bool = False) -> bytes:
    """The bytes of the regular file ``path``, at most ``cap`` of them; never blocks.

    Opened with ``O_NONBLOCK`` and checked with ``fstat`` before any read, so a FIFO, a
    device (``/dev/zero``), a socket or a folder is refused at once instead of hanging or
    growing without bound. ``truncate``: keep the first ``cap`` bytes of a longer file
    instead of refusing it. The one bounded reader of the project: the probe's sysfs and
    procfs reads and ``cpulaunch --config`` both use it.

    Raises:
        OSError: the file cannot be opened (FileNotFoundError, PermissionError, ...).
        ValueError: ``path`` holds a NUL byte.
        UnusableFileError: not a regular file, over ``cap`` bytes, or a read failed.
    """
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o170000 != stat.S_IFREG:
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "special")
            raise UnusableFileError(f"not a regular file ({kind})")
        data = os.read(fd, _FIRST_READ if cap >= _FIRST_READ else cap + 1)
        # A file on disk is whole when its size is read; sysfs (4096) and procfs (0)
        # sizes say nothing, so read on to the end there.
        if data and len(data) != st.st_size:
            chunks = [data]
            size = len(data)
            while size <= cap:
                chunk = os.read(fd, min(_FIRST_READ, cap + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
    except OSError as exc:
        raise UnusableFileError(f"cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > cap:
        if not truncate:
            raise UnusableFileError(f"larger than {cap} bytes")
        data = data[:cap]
    return data


class FileReader:
    """Reads text files below ``root`` with plain ``os`` calls: the one bounded reader of
    host files (the probe and ``cpulaunch doctor`` read through it).

    ``read`` returns None for an absent file (ENOENT, ENOTDIR) and for one this user may
    not read (a note). A file that is present but unusable (not a regular file, over
    ``cap`` bytes, an I/O error) raises a TopologyError naming it when ``strict``, else
    reads as None with a note. Bytes that are not UTF-8 become U+FFFD. It never blocks:
    the file is opened with ``O_NONBLOCK`` and checked with ``fstat`` before any read, so a
    FIFO or a device (``/dev/zero`` linked in place of a file) is refused unread.

    Attributes:
        root: the root given (``/`` or a ``--sysroot`` dump).
        notes: one line per file not read, for messages ("/proc/cpuinfo: not a regular
            file (a FIFO): ignored"), and the probe's other notes.
        skipped: the files not read as data, in read order: ``(path below root with a
            leading "/", why it was not read)``, e.g. ``("/proc/cpuinfo", "not a regular
            file (a FIFO)")``. Files refused with ``strict`` are not listed: the error
            raised names them.
        unusable: some file was not a regular file, too big or failed to read.
    """

    def __init__(self, root: Union[str, os.PathLike] = "/"):
        self.root = os.fspath(root)
        self.prefix = self.root.rstrip("/")
        self.notes: list[str] = []
        self.skipped: list[tuple[str, str]] = []
        self.unusable = False

    def path(self, rel: str) -> str:
        """``rel`` (relative, no leading slash) below the root."""
        return self.prefix + "/" + rel

    def _bad(self, rel: str, what: str, strict: bool) -> None:
        self.unusable = True
        if strict:
            raise corrupt(self.root, "/" + rel, what)
        self._skip(rel, what)

    def _skip(self, rel: str, what: str) -> None:
        self.notes.append(f"/{printable(rel)}: {what}: ignored")
        self.skipped.append(("/" + rel, what))

    def read(self, rel: str, strict: bool = True, cap: int = MAX_FILE_BYTES,
             truncate: bool = False) -> Optional[str]:
        """The text of ``root/rel``, or None (see the class). ``truncate``: keep the first
        ``cap`` bytes of a longer file instead of refusing it."""
        try:
            data = read_regular(self.prefix + "/" + rel, cap, truncate)
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return None  # ValueError: a NUL byte in a path taken from a dump
        except PermissionError:
            self._skip(rel, "permission denied")
            return None
        except OSError as exc:
            self._bad(rel, f"cannot open ({exc.strerror})", strict)
            return None
        except UnusableFileError as exc:
            self._bad(rel, str(exc), strict)
            return None
        return data.decode("utf-8", "replace")

    def listdir(self, rel: str) -> list[str]:
        """Names in the folder ``root/rel``; [] when it is absent or not a folder."""
        try:
            return os.listdir(self.path(rel))
        except (OSError, ValueError):
            return []

    def isdir(self, rel: str) -> bool:
        """``root/rel`` is a folder (links followed)."""
        try:
            return stat.S_ISDIR(os.stat(self.path(rel)).st_mode)
        except (OSError, ValueError):
            return False


def corrupt(root: str, path: str, what: str) -> TopologyError:
    """The error for a malformed file: ``"<path>: <what>; <which tree is corrupt>"``.

    Args:
        root: the root the probe read below ("/" for this host, else the --sysroot folder).
        path: the file as read below the root, e.g. "/sys/devices/system/cpu/online".
        what: what was wrong, one line (quote file contents with ``cpulist.excerpt``).
    """
    if root in ("/", ""):
        where = "this host's /sys or /proc is corrupt"
    else:
        where = f"the tree under --sysroot {printable(root)} is corrupt or not a Linux dump"
    return TopologyError(f"{printable(path)}: {what}; {where}")


#: os.open flags of a file that must be new: never through a link, never an existing file.
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_fd(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (a short write is continued).

    Raises:
        OSError: the write failed (ENOSPC, EIO...).
    """
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _encoded(data: Union[str, bytes]) -> bytes:
    return data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data


def replace_at(dir_fd: int, name: str, data: Union[str, bytes], shown: str, mode: int = 0o666) -> None:
    """Write ``data`` as ``name`` in the folder ``dir_fd``: to a new temporary file there
    (O_EXCL, a random name, ``mode`` less the umask), then rename()d over ``name``.
    rename(2) replaces a link planted at the name, never follows it; a folder planted there
    fails (EISDIR). A str is written as UTF-8, surrogate escapes as the bytes they stand for.

    Raises:
        OSError: the write or the rename failed (the temporary file is removed);
            its ``filename`` is ``shown``.
    """
    for _ in range(100):
        tmp = f".{name}.{os.urandom(6).hex()}.tmp"
        try:
            fd = os.open(tmp, NEW_FILE_FLAGS, mode, dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
    else:
        raise OSError(errno.EEXIST, "no free temporary name", shown)
    try:
        try:
            write_fd(fd, _encoded(data))
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


def write_file(path: Union[str, os.PathLike], data: Union[str, bytes]) -> None:
    """Write ``data`` to ``path`` whole or not at all, never through a link planted at its
    name (:func:`replace_at` in ``path``'s folder).

    Raises:
        OSError: the folder cannot be opened, or the write or rename failed (its
            ``filename`` is ``path``).
    """
    path = os.fspath(path)
    folder, name = os.path.split(path)
    fd = os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        replace_at(fd, name, data, path)
    finally:
        os.close(fd)


def append_whole(path: Union[str, os.PathLike], data: Union[str, bytes], mode: int = 0o644) -> None:
    """Append ``data`` to ``path`` (made if missing, never through a link) in one write, so
    an interruption leaves either all of it or none; a failed write (no space left) is cut
    off again, so the file keeps only what was whole before.

    Raises:
        OSError: the file cannot be opened or written.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        size = os.fstat(fd).st_size
        try:
            write_fd(fd, _encoded(data))
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)
