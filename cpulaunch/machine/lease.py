"""Host-wide leases on cores for ``--share-host`` (issue 22): independent cpulaunch runs on
one machine claim the cores they plan, so that a second job plans on the rest, waits for
them, or fails naming the job that holds them. No daemon: one lock file per logical CPU,
locked with flock(2).

The rules (docs/placement.md, "Jobs that share a host"):

- *The folder.* ``--lease-dir DIR`` if given; else ``/run/cpulaunch`` (:data:`SHARED`),
  which root makes (mode 0755) and which every user's jobs see: only root creates lock
  files there (mode 0644, one per online CPU, at root's first ``--share-host`` run), and
  any user may lock them, since flock needs only a descriptor open for reading. Where it
  does not exist, a user's jobs use a folder of their own: ``$XDG_RUNTIME_DIR/cpulaunch``,
  else ``/tmp/cpulaunch-<uid>`` (mode 0700, refused when another user owns it or others
  may enter it); they then see their own jobs only, and a note says so.
- *A lock is a process.* A job holds ``LOCK_EX`` on the files of every CPU of the cores it
  binds (SMT siblings included) for its whole life: the launcher holds the descriptors,
  and an exec'd single instance inherits them (no ``O_CLOEXEC`` then), so the program
  holds them until it exits. flock locks belong to the open file: the kernel drops them
  when the last descriptor closes, so a job killed by ``kill -9`` frees its cores at once,
  and nobody can hold a core beyond the life of their own processes. (A program that
  closes every descriptor it did not open, or a child that outlives the job with the
  descriptor, ends the lease early or keeps it.)
- *Never through a link.* Every open is relative to the folder's descriptor, with
  ``O_NOFOLLOW``; a file is created with ``O_EXCL``; nothing is ever written into a lock
  file. A lock file that is a link, not a regular file, or not readable by us (another
  user's file of mode 0600 in a shared folder) coordinates nothing: the CPU counts as
  free, with a note, so no planted file can keep a core from anybody.
- *Who holds it.* ``/proc/locks`` names the process holding each lock (its pid, by the
  file's device and inode); ``/proc/PID/cmdline`` its command.

A read (:func:`read`) happens before planning; :func:`claim` after it takes every lock
without blocking, and a job that loses a race (another took one of its CPUs between the
read and the claim) reads again and plans again.
"""

import errno
import os
import stat
from typing import Mapping, NamedTuple, Optional

from cpulaunch import cpulist
from cpulaunch.errors import CpulaunchError, printable

__all__ = ["SHARED", "Folder", "Holder", "Leases", "Lease", "folder", "read", "claim", "wait",
           "parse_proc_locks", "without_held", "held_text", "notes"]

#: The folder every user's jobs share (made by root).
SHARED = "/run/cpulaunch"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class Folder(NamedTuple):
    """Where the leases live.

    Attributes:
        path: the folder.
        shared: every user's jobs use it (``/run/cpulaunch``, or ``--lease-dir``).
        exists: it exists now (a dry run does not make it).
    """

    path: str
    shared: bool
    exists: bool


class Holder(NamedTuple):
    """The process holding a lease: its pid (None: not visible from here) and command."""

    pid: Optional[int]
    command: str

    def __str__(self) -> str:
        if self.pid is None:
            return "another process (not visible from here)"
        return f"pid {self.pid} ({self.command})" if self.command else f"pid {self.pid}"


class Leases(NamedTuple):
    """What :func:`read` found.

    Attributes:
        folder: the :class:`Folder` read.
        held: logical CPU id -> its :class:`Holder`, for the CPUs another job holds.
        unusable: CPUs whose lock file is a link, not a regular file or not readable, or
            missing in a folder this job may not make files in (they coordinate nothing
            and count as free).
    """

    folder: Folder
    held: Mapping[int, Holder]
    unusable: frozenset[int] = frozenset()


def _lease_error(path: str, why: str, fix: str) -> CpulaunchError:
    return CpulaunchError(f"--share-host: {printable(path)} {why}; {fix}")


def _check_folder(fd: int, path: str, private: bool) -> None:
    """Refuse a folder others could plant files in: a private one must be ours and closed
    to others; a shared one owned by root or us and writable only by its owner, or
    sticky (each user can then only replace files of their own)."""
    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if private and (st.st_uid != os.geteuid() or mode & 0o077):
        raise _lease_error(path, f"is not yours alone (owner uid {st.st_uid}, mode {mode:04o})",
                    "remove it, or pass --lease-dir with a folder of your own")
    if not private and st.st_uid not in (0, os.geteuid()):
        raise _lease_error(path, f"belongs to uid {st.st_uid}, neither root nor you",
                    "remove it, or pass --lease-dir")
    if not private and mode & 0o022 and not mode & stat.S_ISVTX:
        raise _lease_error(path, f"is writable by others without the sticky bit (mode {mode:04o})",
                    "chmod +t it (or 0755), or pass another --lease-dir")


def _open_dir(path: str, private: bool, create: bool, mode: int) -> Optional[int]:
    """A descriptor of the folder ``path`` (made with ``mode`` when ``create``), None when
    it does not exist. Never follows a link at ``path``."""
    made = False
    if create:
        try:
            os.mkdir(path, mode)
            made = True
        except FileExistsError:
            pass
        except OSError as exc:
            raise _lease_error(path, f"cannot be made ({exc.strerror})", "pass --lease-dir DIR") from None
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        why = f"cannot be opened ({exc.strerror})"
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # O_DIRECTORY | O_NOFOLLOW on a link: ENOTDIR
            why = "is a link" if os.path.islink(path) else "is not a folder"
        raise _lease_error(path, why, "remove it, or pass --lease-dir DIR") from None
    try:
        if made:
            os.fchmod(fd, mode)  # whatever the umask
        _check_folder(fd, path, private)
    except BaseException:
        os.close(fd)
        raise
    return fd


def folder(lease_dir: Optional[str], environ: Mapping[str, str], create: bool) -> Folder:
    """The lease folder (rules in the module docstring); made where missing when
    ``create`` (a run; a dry run makes nothing).

    Raises:
        CpulaunchError: the folder is a link, another user's, open to others without the
            sticky bit, or cannot be made (one line naming it and how to fix it).
    """
    if lease_dir:
        fd = _open_dir(lease_dir, False, create, 0o700)
        return Folder(lease_dir, True, _closed(fd))
    root = os.geteuid() == 0
    fd = _open_dir(SHARED, False, create and root, 0o755)
    if fd is not None or root:
        return Folder(SHARED, True, _closed(fd))
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/") and _is_own_private_dir(runtime):
        path = os.path.join(runtime, "cpulaunch")
    else:
        path = f"/tmp/cpulaunch-{os.geteuid()}"
    return Folder(path, False, _closed(_open_dir(path, True, create, 0o700)))


def _closed(fd: Optional[int]) -> bool:
    if fd is None:
        return False
    os.close(fd)
    return True


def _is_own_private_dir(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def _lock_file(dfd: int, cpu: int, create: bool) -> tuple:
    """(descriptor or None, why it is unusable or ""): ``cpuN.lock`` in the folder, opened
    for reading without following a link; made (mode 0644, ``O_EXCL``) when ``create``."""
    name = f"cpu{cpu}.lock"
    fd = None
    if create:
        try:
            fd = os.open(name, _FILE_FLAGS | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dfd)
            os.fchmod(fd, 0o644)
        except FileExistsError:
            fd = None
        except OSError as exc:
            return None, exc.strerror or str(exc)
    if fd is None:
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
        except FileNotFoundError:
            return None, ""
        except OSError as exc:
            return None, "a link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None, "not a regular file"
    return fd, ""


def _may_create(dfd: int) -> bool:
    """Whether this job makes missing lock files in the folder: its own folder, or a
    sticky one open to others (each user's files are then safe from the others)."""
    st = os.fstat(dfd)
    return st.st_uid == os.geteuid() or bool(st.st_mode & 0o022 and st.st_mode & stat.S_ISVTX)


def _held(fd: int) -> bool:
    """Whether another open file holds ``LOCK_EX`` on this file (tested without blocking,
    with a shared lock dropped at once)."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def read(where: Folder, cpus) -> Leases:
    """Which of ``cpus`` (logical CPU ids) other jobs hold now, and who (before planning).

    Raises:
        CpulaunchError: the folder turned unusable since :func:`folder` (one line).
    """
    if not where.exists:
        return Leases(where, {})
    dfd = _open_dir(where.path, not where.shared, False, 0)
    if dfd is None:
        return Leases(where, {})
    held: dict = {}
    unusable = set()
    try:
        create = _may_create(dfd)
        for cpu in sorted(cpus):
            fd, why = _lock_file(dfd, cpu, False)
            if fd is None:
                if why or not create:  # a file we could not use, or could not make
                    unusable.add(cpu)
                continue
            try:
                if _held(fd):
                    st = os.fstat(fd)
                    held[cpu] = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
            finally:
                os.close(fd)
    finally:
        os.close(dfd)
    return Leases(where, _holders(held), frozenset(unusable))


def parse_proc_locks(text: str) -> dict[tuple[int, int, int], int]:
    """``/proc/locks`` -> {(major, minor, inode): pid} of the granted flock locks (waiters,
    the ``->`` lines, left out): ``"1: FLOCK  ADVISORY  WRITE 4242 00:2a:1234 0 EOF"`` ->
    ``{(0, 42, 1234): 4242}`` (fs/locks.c, lock_get_status: device numbers in hex)."""
    out: dict = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) < 6 or f[1] != "FLOCK":
            continue
        dev = f[5].split(":")
        if len(dev) != 3:
            continue
        try:
            key = (int(dev[0], 16), int(dev[1], 16), int(dev[2]))
            out.setdefault(key, int(f[4]))
        except ValueError:
            continue
    return out


def _holders(held: Mapping[int, tuple]) -> dict:
    """{cpu: Holder} from {cpu: (major, minor, inode)}: the pid from /proc/locks, the
    command from /proc/PID/cmdline (both through the probe's bounded reader)."""
    if not held:
        return {}
    from cpulaunch.machine.files import FileReader

    fs = FileReader("/")
    pids = parse_proc_locks(fs.read("proc/locks", strict=False, truncate=True) or "")
    commands: dict = {}
    out = {}
    for cpu, key in held.items():
        pid = pids.get(key)
        if pid is not None and pid > 0 and pid not in commands:
            raw = fs.read(f"proc/{pid}/cmdline", strict=False, cap=4096, truncate=True) or ""
            words = " ".join(w for w in raw.split("\x00") if w)
            commands[pid] = printable(words if len(words) <= 80 else words[:77] + "...")
        out[cpu] = Holder(pid if pid and pid > 0 else None, commands.get(pid, ""))
    return out


class Lease:
    """The locks a job holds (open descriptors, ``O_CLOEXEC`` until
    :meth:`keep_across_exec`). Closing them (:meth:`release`, or the process's end) frees
    the CPUs."""

    def __init__(self, where: Folder, fds: Mapping[int, int]):
        self.folder = where
        self.fds = dict(fds)

    @property
    def cpus(self) -> frozenset[int]:
        """The logical CPUs held."""
        return frozenset(self.fds)

    def keep_across_exec(self) -> None:
        """Let the descriptors survive exec(2), so that an exec'd single instance holds the
        lease for as long as it runs."""
        for fd in self.fds.values():
            os.set_inheritable(fd, True)

    def release(self) -> None:
        """Close every descriptor: the CPUs are free again."""
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def claim(where: Folder, cpus, every_cpu=()) -> tuple[Optional[Lease], Optional[int]]:
    """Lock the files of ``cpus`` without blocking: ``(Lease, None)``, or ``(None, cpu)``
    naming a CPU another job took since :func:`read` (nothing is then held). Root's claim
    in the shared folder also makes the missing lock files of ``every_cpu`` (the online
    CPUs), so that other users' jobs find them. CPUs whose file is unusable are skipped.
    """
    import fcntl

    dfd = _open_dir(where.path, not where.shared, True, 0o755 if where.path == SHARED else 0o700)
    if dfd is None:
        raise _lease_error(where.path, "vanished", "run again")
    fds: dict = {}
    try:
        create = _may_create(dfd)
        if create and where.path == SHARED:
            for cpu in sorted(set(every_cpu) - set(cpus)):
                fd, _ = _lock_file(dfd, cpu, True)
                if fd is not None:
                    os.close(fd)
        for cpu in sorted(cpus):
            fd, _ = _lock_file(dfd, cpu, create)
            if fd is None:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                Lease(where, fds).release()
                return None, cpu
            fds[cpu] = fd
    finally:
        os.close(dfd)
    return Lease(where, fds), None


def wait(where: Folder, cpu: int) -> None:
    """Block until nobody holds ``cpu``'s lease (flock's own wait, no polling), then
    return without holding it. Ctrl-C interrupts it."""
    import fcntl

    dfd = _open_dir(where.path, not where.shared, False, 0)
    if dfd is None:
        return
    try:
        fd, _ = _lock_file(dfd, cpu, False)
    finally:
        os.close(dfd)
    if fd is None:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def without_held(topo, leases: Leases):
    """``topo`` with every core another job holds a CPU of left out of the allowed CPUs
    (pure): planning then works on the free cores, and its messages say why."""
    if not leases.held:
        return topo
    taken = {c for cpu in leases.held if cpu in topo.online for c in topo.core_of(cpu).cpus}
    return topo._replace(allowed=topo.allowed - frozenset(taken),
                         allowed_source=f"{topo.allowed_source}, less CPUs {cpulist.format(taken)} "
                                        "held by other cpulaunch jobs (--share-host)")


def held_text(leases: Leases) -> str:
    """``"CPUs 0-3 held by pid 12 (python a.py), CPUs 4 by pid 13 (b)"`` (first holder first)."""
    by_holder: dict = {}
    for cpu in sorted(leases.held):
        by_holder.setdefault(leases.held[cpu], []).append(cpu)
    parts = [f"CPUs {cpulist.format(cpus)} {'held ' if not i else ''}by {holder}"
             for i, (holder, cpus) in enumerate(by_holder.items())]
    return ", ".join(parts)


def notes(leases: Leases, claimed: bool) -> tuple[str, ...]:
    """The notes a plan on shared cores carries: where the leases are, who holds what."""
    where = leases.folder
    out = [f"--share-host: leases in {where.path}"
           + ("" if where.shared else " (your own jobs only; root's first --share-host run "
                                      f"makes {SHARED}, which every user's jobs share)")]
    if leases.held:
        out.append(f"--share-host: {held_text(leases)}; planned on the other cores")
    if leases.unusable:
        out.append(f"--share-host: the lease files of CPUs {cpulist.format(leases.unusable)} are "
                   "links, not regular files, not readable or missing where only their owner "
                   "may make them: those CPUs are not coordinated")
    if not claimed:
        out.append("--share-host: nothing claimed (only a run claims its cores)")
    return tuple(out)
