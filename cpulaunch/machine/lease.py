"""Host-wide leases on CPUs for ``--share-host`` (issues 22 and 34): independent cpulaunch
runs on one machine claim the cores they plan, so that a second job plans on the rest,
waits for them, or fails naming the job that holds them. No daemon.

The design (docs/guide/placement.md, "Jobs that share a host", gives the figures measured):

- *A lease is a set of POSIX record locks* (fcntl(2) ``F_SETLK``), write locks on bytes of
  a file of the job's own. The bytes say what the locks mean: within a window of 2**44
  bytes at ``key << 44`` (:data:`HOST_KEY` for the host's default space, a hash of the
  folder for ``--lease-dir``), byte ``c`` is logical CPU ``c``, byte 2**20 marks a claim
  not yet decided (*pending*), byte 2**20 + 1 a job waiting in ``--share-host wait``, and
  byte ``2**21 + t`` the job's *ticket* ``t`` (milliseconds since boot when the job first
  read the leases; the older job wins a tie). A POSIX lock belongs to a process: it ends
  when the process ends (``kill -9`` included), is kept across exec(2) (an exec'd single
  instance holds its own lease), and is never inherited by fork(2), so a background child
  that outlives the program holds nothing.
- *No one can lock another's lease.* A write lock needs a descriptor open for writing, and
  a lease file is made mode 0600 (no one else can open it), locked, then made 0644 and
  renamed into view: others can read it and test its locks, never write-lock it. A read
  lock another user holds on it conflicts with nothing the owner still takes (the owner
  takes every lock before the file is visible; deciding a claim *releases* the pending
  byte) and is invisible to readers, who test for write locks only (``F_GETLK`` with
  ``F_RDLCK``). So reading and claiming agree: both see exactly the write locks.
- *Reading* (:meth:`Claimant.read`) takes two views and merges them by file (device and
  inode): ``/proc/locks`` (every POSIX write lock of the host in the window, on the
  devices of the space, with its process id), then ``F_GETLK`` on each lease file listed
  in the space's folders (exact and atomic per file; it also sees holders in another PID
  namespace, whom ``/proc/locks`` hides). A lock lives on the inode, not on the name: a
  lease file removed or replaced while held (logind removing a folder at logout, tmpfiles
  ageing ``/tmp``, ``rm -r`` of the folder) keeps its locks, ``/proc/locks`` keeps naming
  them, and no second job is handed the CPU.
- *Claiming* (:meth:`Claimant.claim`) is optimistic: the job publishes a pending claim
  (its CPUs, its ticket), reads again, and commits (releases the pending byte) only when
  no other job's pending or held claim overlaps it; a held claim or an older pending one
  makes it withdraw and plan again; only younger pending claims are waited for (they saw
  this one, and withdraw, or did not, and commit: bounded by :data:`PATIENCE`). Two
  overlapping claims can never both commit: each reads after its own publication, so the
  second to publish sees the first.
- *Waiting* (:meth:`Claimant.blocked`): a waiting job publishes its ticket and a waiting
  byte, and sleeps in poll(2) on a pidfd of every process holding a CPU it may use: it
  wakes as soon as any of them ends. Then it reads, after a delay of 10 ms per older
  waiter (the oldest first; the others find the CPU taken and sleep again), and plans
  again only when more of its CPUs are free than when its plan last failed. Waiting is
  never a lost race.
- *The folders* (:func:`space`): ``--lease-dir DIR``; else the host's: ``/run/cpulaunch``
  (:data:`SHARED`: root makes it, mode 1777 like ``/tmp``) and ``/tmp/cpulaunch``
  (:data:`FALLBACK`, made 1777 by the first user when ``/run/cpulaunch`` is not there).
  Every job reads both whatever its environment (``XDG_RUNTIME_DIR``, ``HOME``, sudo play
  no part); it makes its file in the first one it can write, else in a fresh private
  folder under ``/tmp`` (another user's planted ``/tmp/cpulaunch``), where others still see
  its locks through ``/proc/locks``. Nothing is ever opened through a link: folders with
  ``O_NOFOLLOW | O_DIRECTORY``, files with ``O_NOFOLLOW | O_NONBLOCK`` relative to the
  folder's descriptor, checked to be regular files.
- *One trap of POSIX locks, closed:* closing *any* descriptor of a file releases the
  process's locks on it, so a reader never opens a file whose inode is one of its own
  (by inode, and by the locks ``/proc/locks`` shows for its own pid); a descriptor that
  turns out to be one anyway (a name swapped between ``stat`` and ``open``) is kept open
  for the lease's life, never closed.

Measured here (an "AMD EPYC" with 2 vCPUs shared with other work; docs/guide/placement.md and
scripts/stress_share_host.py): a read with 40 lease files in view costs 0.65 ms without
/proc/locks and 1.05 ms with it once warm, but the first read of /proc/locks after a pause
costs an RCU grace period (16 ms seen; the kernel takes its file-lock semaphore for
writing), hence the waiters' listed-files-only re-checks; one handoff in a quiet moment,
from a holder's end to the next waiter's program start, took 49 ms (wake 4.5, claim 7.7,
exec and Python's start 31); 200 one-core jobs of three users started at once, with the
host's folders removed 277 times meanwhile, ran without two ever sharing a CPU and lost 6
races in all (at most 2 for a job).

Limits: a holder in another PID namespace whose lease file was also removed is seen by no
one; holders on other machines are not seen (the leases are this host's).
"""

import errno
import os
import secrets
import stat
import struct
import time
import zlib
from typing import Callable, Iterable, Mapping, NamedTuple, Optional

from cpulaunch import cpulist
from cpulaunch import log as _log
from cpulaunch.errors import CpulaunchError, printable

__all__ = ["SHARED", "FALLBACK", "HOST_KEY", "PATIENCE", "Space", "Job", "Holder", "Leases", "Lease", "Claimant",
           "space", "parse_proc_locks", "decode", "without_held", "held_text", "notes"]

#: The host's lease folder (made by root, mode 1777).
SHARED = "/run/cpulaunch"
#: The host's second folder, for users' jobs before root made :data:`SHARED`.
FALLBACK = "/tmp/cpulaunch"
#: The lock window of the host's default space (``HOST_KEY << 44``); a ``--lease-dir``'s
#: key is a hash of its real path (1 .. 2**18 - 1, never this one).
HOST_KEY = 0x2C9A1
#: Seconds a claim waits for younger pending claims that overlap it before withdrawing.
PATIENCE = 2.0

_WINDOW = 1 << 44
_CPU_LIMIT = 1 << 20
_PENDING = 1 << 20
_WAITING = (1 << 20) + 1
_TICKET = 1 << 21
_MAX_CPU = 1 << 16  # CPU ids read from someone else's locks are cut here (Linux: NR_CPUS <= 8192)
_QUEUE_STEP = 0.010  # seconds of delay per older waiter after a wake-up
_MAX_ENTRIES = 100_000  # lease files read per folder at most (a folder flooded by someone)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_NEW_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
#: ``struct flock`` of 64-bit Linux: l_type, l_whence (short), l_start, l_len (off_t), l_pid.
_FLOCK = struct.Struct("hhqqi4x")

FileId = tuple  # (major, minor, inode) of a lease file

log = _log.get(__name__)


class Space(NamedTuple):
    """Where the leases of a set of jobs live (:func:`space`).

    Attributes:
        folders: the folders whose lease files are read (those that exist are read).
        key: the lock window (``key << 44``).
        devices: ``(major, minor)`` of every file system a lease file of the space may be
            on (its folders', their parents'): ``/proc/locks`` is read for those only.
        lease_dir: the folder given with ``--lease-dir``, else None (the host's space).
    """

    folders: tuple[str, ...]
    key: int
    devices: frozenset
    lease_dir: Optional[str] = None

    @property
    def shown(self) -> str:
        """The folders, as notes name them: ``"/run/cpulaunch and /tmp/cpulaunch"``."""
        return " and ".join(self.folders)


class Job(NamedTuple):
    """Another job's lease as read (:meth:`Claimant.read`).

    Attributes:
        id: ``(major, minor, inode)`` of its lease file.
        pid: the process holding the locks (alive: POSIX locks end with it); None when it
            is not visible from here (another PID namespace).
        cpus: logical CPU ids it claims (pending) or holds.
        pending: its claim is not decided yet.
        waiting: it waits (``--share-host wait``) and holds no CPU.
        ticket: milliseconds since boot when it first read the leases (0: none shown).
        listed: its file was found in a folder (else it was seen in /proc/locks only).
    """

    id: FileId
    pid: Optional[int]
    cpus: frozenset = frozenset()
    pending: bool = False
    waiting: bool = False
    ticket: int = 0
    listed: bool = False

    @property
    def order(self) -> tuple:
        """Older first: the ticket, then the file."""
        return (self.ticket, self.id)


class Holder(NamedTuple):
    """The process holding a lease: its pid (None: not visible from here) and command."""

    pid: Optional[int]
    command: str

    def __str__(self) -> str:
        if self.pid is None:
            return "another process (not visible from here)"
        return f"pid {self.pid} ({self.command})" if self.command else f"pid {self.pid}"


class Leases(NamedTuple):
    """What :meth:`Claimant.read` found.

    Attributes:
        space: the :class:`Space` read.
        held: logical CPU id -> its :class:`Holder`, for the CPUs other jobs hold or claim.
        pending: the CPUs of ``held`` whose claim is not decided yet.
        jobs: every other job seen (holding, claiming or waiting).
    """

    space: Space
    held: Mapping[int, Holder]
    pending: frozenset = frozenset()
    jobs: tuple = ()


def _lease_error(path: str, why: str, fix: str) -> CpulaunchError:
    return CpulaunchError(f"--share-host: {printable(path)} {why}; {fix}")


# --------------------------------------------------------------------------- folders


def _open_dir(path: str) -> Optional[int]:
    """A descriptor of the folder ``path``, or None when it is missing, a link or not a folder."""
    try:
        return os.open(path, _DIR_FLAGS)
    except OSError:
        return None


def _dev(path: str) -> Optional[tuple]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.major(st.st_dev), os.minor(st.st_dev))


def _check_lease_dir(fd: int, path: str) -> None:
    """Refuse a ``--lease-dir`` others could plant files in unseen: it must be root's or
    ours, and writable only by its owner unless sticky."""
    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, os.geteuid()):
        raise _lease_error(path, f"belongs to uid {st.st_uid}, neither root nor you", "pass another --lease-dir")
    if mode & 0o022 and not mode & stat.S_ISVTX:
        raise _lease_error(path, f"is writable by others without the sticky bit (mode {mode:04o})",
                           "chmod +t it (or 0755), or pass another --lease-dir")


def _key_of(path: str) -> int:
    """A ``--lease-dir``'s window: crc32 of its real path, in 1 .. 2**18 - 1, never HOST_KEY."""
    key = zlib.crc32(os.fsencode(os.path.realpath(path))) % ((1 << 18) - 1) + 1
    return key if key != HOST_KEY else key + 1


def space(lease_dir: Optional[str], create: bool) -> Space:
    """The lease space of this job (rules in the module docstring); with ``create`` (a
    run; a dry run makes nothing) ``--lease-dir`` is made (mode 0700) when missing, and
    root makes :data:`SHARED` (mode 1777) or opens up one an older cpulaunch made 0755.
    The environment plays no part.

    Raises:
        CpulaunchError: ``--lease-dir`` is a link, not a folder, another user's, open to
            others without the sticky bit, or cannot be made (one line naming it).
    """
    if lease_dir:
        path = os.path.abspath(lease_dir)
        if create:
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
            except OSError as exc:
                raise _lease_error(path, f"cannot be made ({exc.strerror})", "pass another --lease-dir") from None
        try:
            fd = os.open(path, _DIR_FLAGS)
        except FileNotFoundError:
            fd = None
        except OSError as exc:
            why = f"cannot be opened ({exc.strerror})"
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # O_DIRECTORY | O_NOFOLLOW on a link: ENOTDIR
                why = "is a link" if os.path.islink(path) else "is not a folder"
            raise _lease_error(lease_dir, why, "remove it, or pass --lease-dir DIR") from None
        if fd is not None:
            try:
                _check_lease_dir(fd, lease_dir)
            finally:
                os.close(fd)
        devices = {d for d in (_dev(path), _dev(os.path.dirname(path))) if d}
        return Space((lease_dir,), _key_of(path), frozenset(devices), lease_dir)
    if create and os.geteuid() == 0:
        _make_shared()
    devices = {d for d in map(_dev, ("/run", "/tmp", SHARED, FALLBACK)) if d}
    return Space((SHARED, FALLBACK), HOST_KEY, frozenset(devices))


def _make_shared() -> None:
    """Root: make /run/cpulaunch (1777, root's) when missing; open up a root-owned 0755
    one (an older cpulaunch's) so that users' jobs can make their files there."""
    try:
        os.mkdir(SHARED, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return  # no /run here: users and root share /tmp/cpulaunch then
    fd = _open_dir(SHARED)
    if fd is None:
        return
    try:
        st = os.fstat(fd)
        if st.st_uid == 0 and stat.S_IMODE(st.st_mode) != 0o1777:
            os.fchmod(fd, 0o1777)
    finally:
        os.close(fd)


def _make_fallback() -> Optional[int]:
    """A descriptor of /tmp/cpulaunch, made (1777) when missing; None when it cannot be."""
    try:
        os.mkdir(FALLBACK, 0o700)
        made = True
    except FileExistsError:
        made = False
    except OSError:
        return None
    fd = _open_dir(FALLBACK)
    if fd is not None and made and os.fstat(fd).st_uid == os.geteuid():
        os.fchmod(fd, 0o1777)  # whatever the umask: every user's jobs make their files here
    return fd


# --------------------------------------------------------------------------- reading locks


def parse_proc_locks(text: str) -> list[tuple[int, FileId, int, Optional[int]]]:
    """``/proc/locks`` -> ``[(pid, (major, minor, inode), start, end)]`` of the granted
    POSIX write locks (waiters, the ``->`` lines, and every other kind left out); ``end``
    None for a lock to the end of the file. ``"1: POSIX  ADVISORY  WRITE 4242 00:2a:1234 5 7"``
    -> ``[(4242, (0, 42, 1234), 5, 7)]`` (fs/locks.c, lock_get_status: device numbers in
    hex, offsets in decimal)."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 8 or f[1] != "POSIX" or f[3] != "WRITE":
            continue
        dev = f[5].split(":")
        try:
            fid = (int(dev[0], 16), int(dev[1], 16), int(dev[2]))
            out.append((int(f[4]), fid, int(f[6]), None if f[7] == "EOF" else int(f[7])))
        except (ValueError, IndexError):
            continue
    return out


def decode(locks: Iterable[tuple[int, int, Optional[int]]], key: int) -> Optional[dict]:
    """What the write locks ``(start, end, pid)`` of one file say in the window of ``key``
    (pure): ``{"cpus", "pending", "waiting", "ticket", "pid"}``, or None when no lock lies in
    the window. A lock reaching outside the window (a whole-file lock, say) is not a lease
    and is skipped. ``[(base + 2, base + 3, 9), (base + 2**20, base + 2**20, 9)]`` ->
    cpus {2, 3}, pending, pid 9 (base = key << 44)."""
    base = key << 44
    found = {"cpus": set(), "pending": False, "waiting": False, "ticket": 0, "pid": None}
    any_lock = False
    for start, end, pid in locks:
        if end is None or start < base or end >= base + _WINDOW:
            continue
        a, b = start - base, end - base
        any_lock = True
        found["pid"] = pid
        if a < _MAX_CPU:
            found["cpus"].update(range(a, min(b, _MAX_CPU - 1) + 1))
        found["pending"] |= a <= _PENDING <= b
        found["waiting"] |= a <= _WAITING <= b
        if a >= _TICKET:
            found["ticket"] = a - _TICKET
    if not any_lock:
        return None
    found["cpus"] = frozenset(found["cpus"])
    return found


def _proc_locks(space: Space) -> tuple[dict, set]:
    """({file: decoded} of the space's locks in /proc/locks, {files whose locks this
    process holds})."""
    from cpulaunch.machine.files import UnusableFileError, read_regular

    try:
        text = read_regular("/proc/locks", cap=64 << 20, truncate=True).decode("ascii", "replace")
    except (OSError, UnusableFileError):
        return {}, set()
    base = space.key << 44
    me = os.getpid()
    by_file: dict = {}
    mine = set()
    for pid, fid, start, end in parse_proc_locks(text):
        if pid == me:
            mine.add(fid)
        if fid[:2] in space.devices and end is not None and base <= start and end < base + _WINDOW:
            by_file.setdefault(fid, []).append((start, end, pid if pid > 0 else None))
    return {fid: d for fid, locks in by_file.items() if (d := decode(locks, space.key)) is not None}, mine


def _write_locks(fd: int, lo: int, hi: int) -> list:
    """Every write lock another process holds on ``[lo, hi]`` of the file ``fd``, as
    ``(start, end or None, pid or None)`` (``F_GETLK`` with a read lock: read locks do not
    conflict with it and are not seen). F_GETLK names one conflicting lock; the rest of
    the range on both sides is asked again."""
    import fcntl

    out: list = []
    todo = [(lo, hi)]
    while todo and len(out) < 4096:
        a, b = todo.pop()
        if a > b:
            continue
        got = fcntl.fcntl(fd, fcntl.F_GETLK, _FLOCK.pack(fcntl.F_RDLCK, os.SEEK_SET, a, b - a + 1, 0))
        kind, _, start, length, pid = _FLOCK.unpack(got)
        if kind == fcntl.F_UNLCK:
            continue
        end = None if length == 0 else start + length - 1
        out.append((start, end, pid if pid > 0 else None))
        if end is None:
            todo.append((a, start - 1))
        else:
            todo += [(a, start - 1), (end + 1, b)]
    return out


def _job(fid: FileId, d: dict, listed: bool) -> Job:
    return Job(fid, d["pid"], d["cpus"], d["pending"], d["waiting"], d["ticket"], listed)


# --------------------------------------------------------------------------- this job's files


class _File:
    """One lease file of this job: the folder's descriptor, its name, its descriptor
    (open for writing, holding the locks) and its id."""

    def __init__(self, dfd: int, folder: str, name: str, fd: int, private: bool = False):
        self.dfd, self.folder, self.name, self.fd, self.private = dfd, folder, name, fd, private
        st = os.fstat(fd)
        self.id = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)

    def unlock(self, offset: int) -> None:
        import fcntl

        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, offset, os.SEEK_SET)

    def drop(self) -> None:
        """Remove the name (only while it still names this file: in a folder of someone
        else's it may have been replaced) and close: every lock of the file ends."""
        if self.fd is None:
            return
        try:
            st = os.stat(self.name, dir_fd=self.dfd, follow_symlinks=False)
            if (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) == self.id:
                os.unlink(self.name, dir_fd=self.dfd)
        except OSError:
            pass
        if self.private:
            try:
                os.rmdir(self.folder)
            except OSError:
                pass
        os.close(self.fd)
        os.close(self.dfd)
        self.fd = None


def _publish(dfd: int, folder: str, key: int, ticket: int, cpus, marker: int, private: bool = False) -> _File:
    """A new lease file in the folder ``dfd``: made 0600 under a hidden name, locked (the
    ticket, ``marker``, every CPU of ``cpus``), described for people who ``cat`` it, made
    0644 and renamed into view, so it is visible only once every lock is taken.

    Raises:
        OSError: the file cannot be made there (the caller tries the next folder).
    """
    import fcntl

    base = key << 44
    token = secrets.token_hex(6)
    tmp, name = f".lease-{os.getpid()}-{token}", f"lease-{os.getpid()}-{token}"
    fd = os.open(tmp, _NEW_FLAGS, 0o600, dir_fd=dfd)
    try:
        for offset in (base + _TICKET + ticket, base + marker):
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset, os.SEEK_SET)
        for a, b in _runs(cpus):
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, b - a + 1, base + a, os.SEEK_SET)
        what = "waiting" if marker == _WAITING else f"cpus {cpulist.format(cpus)}"
        os.write(fd, f"pid {os.getpid()} uid {os.geteuid()} {what}\n".encode())
        os.fchmod(fd, 0o644)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        os.close(fd)
        raise
    return _File(os.dup(dfd), folder, name, fd, private)


def _runs(cpus) -> list[tuple[int, int]]:
    """{0, 1, 2, 5} -> [(0, 2), (5, 5)]."""
    out: list = []
    for c in sorted(cpus):
        if out and out[-1][1] == c - 1:
            out[-1] = (out[-1][0], c)
        else:
            out.append((c, c))
    return out


def _boot_ms() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1_000_000


class Lease:
    """The CPUs a job holds: its lease file's descriptor (``O_CLOEXEC`` until
    :meth:`keep_across_exec`), holding a write lock per CPU. Releasing it (:meth:`release`,
    or the end of the process that holds the locks) frees the CPUs."""

    def __init__(self, file: _File, cpus, kept: list):
        self._file, self._kept = file, kept
        self.cpus = frozenset(cpus)
        self.folder = file.folder

    @property
    def fds(self) -> dict:
        """{logical CPU: the descriptor holding its lock} (one file holds them all)."""
        return {c: self._file.fd for c in self.cpus} if self._file.fd is not None else {}

    def keep_across_exec(self) -> None:
        """Let the descriptors survive exec(2): POSIX locks are kept across exec as long as
        the descriptor stays open, so the exec'd program holds the lease until it exits (and
        its own children, which inherit no POSIX lock, never do)."""
        for fd in [self._file.fd, *self._kept]:
            if fd is not None:
                os.set_inheritable(fd, True)

    def release(self) -> None:
        """Remove the lease file and close it: the CPUs are free again."""
        self._file.drop()
        for fd in self._kept:
            os.close(fd)
        self._kept.clear()


# --------------------------------------------------------------------------- the protocol


class Claimant:
    """This job's side of the protocol: its ticket, its files, reading, claiming, waiting.

    Args:
        where: the :class:`Space`.
        online: the machine's online logical CPUs (what is read).
        allowed: the CPUs this job may run on (what it may wait for).
        tries: lost races after which :meth:`claim` gives up.

    Use as a context manager: on leaving, its waiting file is removed (a :class:`Lease` it
    handed out lives on).
    """

    def __init__(self, where: Space, online, allowed, tries: int = 100):
        self.space = where
        self.online, self.allowed = frozenset(online), frozenset(allowed)
        self.tries = tries
        self.ticket = _boot_ms()
        self.lost = 0
        self._waiting: Optional[_File] = None
        self._kept: list = []  # descriptors of our own inodes, opened by a race: never closed before the end
        self._said: Optional[str] = None
        self._mine: set = set()  # files this process holds locks on (an exec'd outer job's): never opened

    def __enter__(self) -> "Claimant":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Leave the queue (remove the waiting file)."""
        if self._waiting is not None:
            self._waiting.drop()
            self._waiting = None

    # ----- reading

    def _own(self) -> set:
        return {f.id for f in (self._waiting,) if f is not None}

    def jobs(self, own=(), full: bool = True) -> dict:
        """{file: :class:`Job`} of every other job of the space (module docstring); not
        ``full``: from the listed lease files only, without /proc/locks (whose first read
        after a pause costs an RCU grace period, 10-30 ms here: it takes the kernel's file
        lock semaphore for writing)."""
        own = set(own) | self._own()
        jobs: dict = {}
        if full:
            from_proc, self._mine = _proc_locks(self.space)
            jobs = {fid: _job(fid, d, False) for fid, d in from_proc.items() if fid not in own | self._mine}
        skip = own | self._mine
        for folder in self.space.folders:
            dfd = _open_dir(folder)
            if dfd is None:
                continue
            try:
                self._read_folder(dfd, jobs, skip)
            finally:
                os.close(dfd)
        return jobs

    def _read_folder(self, dfd: int, jobs: dict, skip: set) -> None:
        base = self.space.key << 44
        me = os.geteuid()
        with os.scandir(dfd) as entries:
            for n, entry in enumerate(entries):
                if n >= _MAX_ENTRIES:
                    break
                name = entry.name
                if not name.startswith(("lease-", ".lease-")):
                    continue
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except OSError:
                    continue
                fid = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
                if fid in skip or not stat.S_ISREG(st.st_mode):
                    continue
                if name.startswith("."):  # being made; or left by a crash long ago
                    if time.time() - st.st_mtime > 60 and (st.st_uid == me or me == 0):
                        self._clean(dfd, name, fid, st.st_uid)
                    continue
                try:
                    fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
                except OSError:
                    continue
                try:
                    fst = os.fstat(fd)
                    got = (os.major(fst.st_dev), os.minor(fst.st_dev), fst.st_ino)
                    if got in skip:  # swapped in since the stat: ours, so never closed (module docstring)
                        self._kept.append(fd)
                        fd = None
                        continue
                    if not stat.S_ISREG(fst.st_mode):
                        continue
                    d = decode(_write_locks(fd, base, base + _WINDOW - 1), self.space.key)
                finally:
                    if fd is not None:
                        os.close(fd)
                if d is None:
                    jobs.pop(got, None)  # ended since /proc/locks was read
                    if fst.st_uid == me or me == 0:
                        self._clean(dfd, name, got, fst.st_uid)
                    continue
                jobs[got] = _job(got, d, True)

    def _clean(self, dfd: int, name: str, fid: FileId, uid: int) -> None:
        """Remove a lease file no process holds (one left by an exec'd program or a killed
        job): ours, or anyone's when we are root. A file once dead stays dead: nobody locks
        a lease file after it is in view."""
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) == fid and st.st_uid == uid:
                os.unlink(name, dir_fd=dfd)
        except OSError:
            pass

    def read(self, full: bool = True) -> Leases:
        """Which online CPUs other jobs hold or claim, and who (before planning); ``full``:
        see :meth:`jobs`."""
        return self._leases(self.jobs(full=full))

    def _leases(self, jobs: Mapping) -> Leases:
        held: dict = {}
        pending = set()
        commands: dict = {}
        for job in sorted(jobs.values(), key=lambda j: j.order):
            for cpu in job.cpus & self.online:
                if cpu not in held:
                    held[cpu] = _holder(job.pid, commands)
                    if job.pending:
                        pending.add(cpu)
        return Leases(self.space, held, frozenset(pending), tuple(jobs.values()))

    # ----- claiming

    def claim(self, cpus) -> Optional[Lease]:
        """Claim ``cpus`` (logical CPU ids): the :class:`Lease`, or None when another job's
        claim overlaps it (a lost race: read and plan again).

        Raises:
            CpulaunchError: no lease file can be made anywhere, or :attr:`tries` races lost.
        """
        cpus = frozenset(cpus)
        mine = self._make(cpus, _PENDING)
        deadline = time.monotonic() + PATIENCE
        while True:
            others = [j for j in self.jobs(own={mine.id}).values() if j.cpus & cpus]
            beaten = [j for j in others if not j.pending or j.order < (self.ticket, mine.id)]
            if not others:
                import atexit

                mine.unlock((self.space.key << 44) + _PENDING)  # decided: held
                lease = Lease(mine, cpus, self._kept)
                self._kept = []
                atexit.register(lease.release)  # a supervising launcher's end; an exec'd program keeps it
                return lease
            if beaten or time.monotonic() > deadline:
                mine.drop()
                self.lost += 1
                log.info("--share-host: lost a race for CPUs %s (%s); reading and planning again",
                         cpulist.format(cpus), held_text(self._leases({j.id: j for j in beaten or others})))
                if self.lost >= self.tries:
                    raise CpulaunchError(f"--share-host: other jobs took the planned cores {self.tries} "
                                         "times between reading and claiming them; run again")
                return None
            time.sleep(0.001)  # younger claims decide within one read

    def _make(self, cpus, marker: int) -> _File:
        """Publish a lease file in the first folder this job can make one in: the space's
        folders in order (``/tmp/cpulaunch`` made when missing), else a fresh private folder
        under /tmp (then others see it through /proc/locks only)."""
        errors = []
        for folder in self.space.folders:
            if self.space.lease_dir is None and folder == FALLBACK:
                dfd = _make_fallback()
            else:
                dfd = _open_dir(folder)
            if dfd is None:
                errors.append(f"{folder}: not a folder")
                continue
            try:
                return _publish(dfd, folder, self.space.key, self.ticket, cpus, marker)
            except OSError as exc:
                errors.append(f"{folder}: {exc.strerror}")
            finally:
                os.close(dfd)
        if self.space.lease_dir is not None:
            raise _lease_error(self.space.lease_dir, f"takes no lease file ({'; '.join(errors)})",
                               "pass a --lease-dir you can write to")
        import tempfile

        try:
            private = tempfile.mkdtemp(prefix="cpulaunch-lease-", dir="/tmp")
            dfd = os.open(private, _DIR_FLAGS)
        except OSError as exc:
            raise _lease_error(self.space.shown, f"has no folder this job can make its lease file in "
                               f"({'; '.join(errors)}; /tmp: {exc.strerror})", "pass --lease-dir DIR") from None
        try:
            made = _publish(dfd, private, self.space.key, self.ticket, cpus, marker, private=True)
        finally:
            os.close(dfd)
        log.warning("note: --share-host: this job's lease file is in %s (%s); other jobs see its locks "
                    "through /proc/locks", private, "; ".join(errors))
        return made

    # ----- waiting

    def blocked(self, leases: Leases, why: str, wait: bool, say: Callable[[str], None]) -> Leases:
        """The plan does not fit on the CPUs other jobs left free (``leases``). Returns the
        leases to plan on again: once the CPUs that are only claimed (pending) are decided
        (milliseconds), else in ``wait`` mode once more of this job's allowed CPUs are free
        than now (:meth:`wait`).

        Raises:
            CpulaunchError: ``fail`` mode (naming the holders); or every CPU this job may
                use that is held belongs to a process that started this one (it would wait
                for itself).
        """
        blocking = {c: h for c, h in leases.held.items() if c in self.allowed}
        if set(blocking) & leases.pending and self._settle(set(blocking) & leases.pending):
            return self.read()
        mine = _ancestors()
        if blocking and all(h.pid in mine for h in blocking.values()):
            raise CpulaunchError(f"--share-host: {held_text(leases._replace(held=blocking))}, which started "
                                 f"this cpulaunch: {why}; drop --share-host from the inner cpulaunch")
        if not wait:
            raise CpulaunchError(f"--share-host: {held_text(leases)}: {why}; wait for them with --share-host wait")
        text = held_text(leases._replace(held=blocking))
        if text != self._said:
            say(f"waiting for {text} (--share-host wait)")
            self._said = text
        return self.wait(leases)

    def _settle(self, cpus: set) -> bool:
        """Wait (at most PATIENCE) until the pending claims on ``cpus`` are decided; False
        when one is still pending then (a claimant that never decides holds its CPUs)."""
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            if not cpus & self.read().pending:
                return True
            time.sleep(0.002)
        return False

    def wait(self, leases: Leases) -> Leases:
        """Sleep until more of this job's allowed CPUs are free than in ``leases``, and
        return what was then read: in the queue (a waiting file with its ticket), woken by
        the end of any process holding one of them (a pidfd each; every second anyway),
        after 10 ms per older waiter. Each check reads the listed files only, unless a job
        was seen through /proc/locks alone (its file removed): then all is read."""
        free = self.allowed - set(leases.held)
        if self._waiting is None:
            self._waiting = self._make((), _WAITING)
        while True:
            jobs = list(leases.jobs)
            holders = {j.pid for j in jobs if j.cpus & self.allowed}
            older = sum(1 for j in jobs if j.waiting and j.order < (self.ticket, self._waiting.id))
            _sleep_until_one_ends(holders, timeout=1.0)
            if older:
                time.sleep(min(older, 20) * _QUEUE_STEP)
            leases = self.read(full=not all(j.listed for j in jobs))
            now = self.allowed - set(leases.held)
            if not now <= free:
                return leases
            free = now


def _holder(pid: Optional[int], commands: dict) -> Holder:
    """The :class:`Holder` of ``pid``, its command from /proc/PID/cmdline (cut at 80
    characters), read once per pid."""
    if pid is None:
        return Holder(None, "")
    if pid not in commands:
        from cpulaunch.machine.files import FileReader

        raw = FileReader("/").read(f"proc/{pid}/cmdline", strict=False, cap=4096, truncate=True) or ""
        words = " ".join(w for w in raw.split("\x00") if w)
        commands[pid] = printable(words if len(words) <= 80 else words[:77] + "...")
    return Holder(pid, commands[pid])


def _ancestors() -> set:
    """The pids of this process's parent, its parent, ... (from /proc/PID/stat)."""
    out: set = set()
    pid = os.getppid()
    while pid > 1 and pid not in out and len(out) < 4096:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                text = f.read(4096)
            pid = int(text[text.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def _sleep_until_one_ends(pids: set, timeout: float) -> None:
    """Block until one of ``pids`` ends (poll(2) on their pidfds), or ``timeout`` seconds.
    A pid that cannot be watched (gone already, not visible, no pidfd_open) shortens the
    wait to 0.1 s."""
    import select

    fds = []
    short = False
    try:
        for pid in pids:
            if pid is None:
                short = True
                continue
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                return  # it ended already
            except (AttributeError, OSError):
                short = True
        if not fds:
            time.sleep(0.1)
            return
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        poller.poll(int((0.1 if short else timeout) * 1000))
    finally:
        for fd in fds:
            os.close(fd)


# --------------------------------------------------------------------------- planning and notes (pure)


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
    out = [f"--share-host: leases in {leases.space.shown}"]
    if leases.held:
        out.append(f"--share-host: {held_text(leases)}; planned on the other cores")
    if not claimed:
        out.append("--share-host: nothing claimed (only a run claims its cores)")
    return tuple(out)
