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
- *Reading costs what this machine has* (issue 39): a lock's range is cut to the online
  CPUs before any set is made (:func:`decode`), ``F_GETLK`` asks only about the CPU, pending,
  waiting and first ticket bytes (:func:`_write_locks`), and at most :data:`MAX_FILES` files
  (:data:`MAX_NAMES` names) per folder and :data:`PROC_LOCKS_BYTES` of /proc/locks are read;
  what was cut is named in a note (:attr:`Leases.capped`) and by ``cpulaunch doctor``.
- *Claiming* (:meth:`Claimant.claim`) is optimistic: the job publishes a pending claim
  (its CPUs, its ticket), reads again, and commits (releases the pending byte) only when
  no other job's pending or held claim overlaps it. Two overlapping claims can never both
  commit: each reads after its own publication, so the second to publish sees the first.
  Younger pending claims are waited for (they saw this one, and withdraw, or did not, and
  commit: bounded by :data:`PATIENCE`); a held claim or an older pending one is waited for
  too, with this claim kept published, up to :data:`SETTLE` (lock flicker by a user who
  holds nothing is waited out), then this claim withdraws and the job plans again. Lost
  races are bounded by time (:data:`RACE_TIME`, ``fail`` only), never by count, and a
  ``fail`` job fails only when the CPUs it needs are still held after :data:`SETTLE`.
- *Waiting* (:meth:`Claimant.blocked`): a waiting job publishes its ticket and a waiting
  byte, and sleeps in poll(2) on a pidfd of every process holding a CPU it may use: it
  wakes as soon as any of them ends. Then it reads, after a delay of 10 ms per older
  waiter (the oldest first; the others find the CPU taken and sleep again), and plans
  again only when more of its CPUs are free than when its plan last failed. Waiting is
  never a lost race.
- *The folders* (:func:`space`): ``--lease-dir DIR``; else the host's: ``/run/cpulaunch-leases``
  (:data:`SHARED`: root makes it, mode 1777 like ``/tmp``) and ``/tmp/cpulaunch-leases``
  (:data:`FALLBACK`, made 1777 by the first user when ``/run/cpulaunch-leases`` is not there).
  Every job reads both whatever its environment (``XDG_RUNTIME_DIR``, ``HOME``, sudo play
  no part); it makes its file in the first one it can write, else in a fresh private
  folder under ``/tmp`` (another user's planted ``/tmp/cpulaunch-leases``), where others still see
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

Limits: a holder in another PID namespace whose lease file was also removed (or lies beyond
the files read) is seen by no one; holders on other machines are not seen (the leases are
this host's). What a user who holds no CPU can still do is in docs/guide/placement.md.
"""

import errno
import os
import secrets
import stat
import struct
import time
import zlib
from typing import Callable, Iterable, Mapping, Optional, Sequence

from cpulaunch import cpulist
from cpulaunch import log as _log
from cpulaunch.errors import CpulaunchError, printable
from cpulaunch.notes import explain
from cpulaunch.records import Record

__all__ = ["SHARED", "FALLBACK", "OLD_FOLDERS", "HOST_KEY", "PATIENCE", "SETTLE", "RACE_TIME", "MAX_FILES",
           "MAX_NAMES", "PROC_LOCKS_BYTES", "PRIVATE_PREFIX", "Survey", "survey", "tidy_private", "Space", "Job", "Holder", "Leases", "Lease", "Claimant",
           "space", "parse_proc_locks", "decode", "without_held", "held_text", "notes"]

#: The host's lease folder (made by root, mode 1777).
SHARED = "/run/cpulaunch-leases"
#: The host's second folder, for users' jobs before root made :data:`SHARED`. Not named
#: ``cpulaunch``: a ``/tmp/cpulaunch`` folder made ``python -m cpulaunch`` started in /tmp
#: import it as a namespace package (issue 39).
FALLBACK = "/tmp/cpulaunch-leases"
#: The folders of cpulaunch before issue 39: read (a job of an older version may hold CPUs
#: there), never made nor written.
OLD_FOLDERS = ("/run/cpulaunch", "/tmp/cpulaunch")
#: The lock window of the host's default space (``HOST_KEY << 44``); a ``--lease-dir``'s
#: key is a hash of its identity (device, inode) (1 .. 2**18 - 1, never this one).
HOST_KEY = 0x2C9A1
#: Seconds a claim waits for younger pending claims that overlap it before withdrawing.
PATIENCE = 2.0
#: Seconds a claim keeps its pending claim published while another job's held claim (or an
#: older pending one) overlaps it, waiting for it to go (lock flicker is waited out); also
#: how long a holder must be seen holding before a ``fail`` job fails naming it.
SETTLE = 0.25
#: Seconds of races lost in a row (each to claims that stayed :data:`SETTLE`) after which a
#: ``fail`` job fails naming who beat it; ``wait`` never gives up for lost races.
RACE_TIME = 10.0
#: Lease files read per folder at most (open, F_GETLK); names looked at per folder at most.
MAX_FILES = 512
MAX_NAMES = 4096
#: Bytes of /proc/locks read at most (about 12,000 locks; a host flooded with locks).
PROC_LOCKS_BYTES = 1 << 20

#: The prefix of a job's private lease folder under /tmp (when neither host folder takes
#: its file); removed by the job that made it, or by the next job (or doctor) once empty.
PRIVATE_PREFIX = "cpulaunch-lease-"

_WINDOW = 1 << 44
_CPU_LIMIT = 1 << 20
_PENDING = 1 << 20
_WAITING = (1 << 20) + 1
_TICKET = 1 << 21
_QUEUE_STEP = 0.010  # seconds of delay per older waiter after a wake-up
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_NEW_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
#: ``struct flock`` of 64-bit Linux: l_type, l_whence (short), l_start, l_len (off_t), l_pid.
_FLOCK = struct.Struct("hhqqi4x")

FileId = tuple  # (major, minor, inode) of a lease file

log = _log.get(__name__)


class Space(Record):
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
        """The folders, as notes name them: ``"/run/cpulaunch-leases and /tmp/cpulaunch-leases"``."""
        return " and ".join(self.folders)


class Job(Record):
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


class Holder(Record):
    """The process holding a lease: its pid (None: not visible from here), its command, and
    (pid None) why it is not named."""

    pid: Optional[int]
    command: str
    why: str = "not visible from here"

    def __str__(self) -> str:
        if self.pid is None:
            return f"another process ({self.why})"
        return f"pid {self.pid} ({self.command})" if self.command else f"pid {self.pid}"


class Leases(Record):
    """What :meth:`Claimant.read` found.

    Attributes:
        space: the :class:`Space` read.
        held: logical CPU id -> its :class:`Holder`, for the CPUs other jobs hold or claim.
        pending: the CPUs of ``held`` whose claim is not decided yet.
        jobs: every other job seen (holding, claiming or waiting).
        capped: the folders (and ``/proc/locks``) read only in part: they held more
            than :data:`MAX_FILES` lease files (:data:`PROC_LOCKS_BYTES` bytes).
    """

    space: Space
    held: Mapping[int, Holder]
    pending: frozenset = frozenset()
    jobs: tuple = ()
    capped: tuple = ()


def _fix(errors: list, otherwise: str) -> str:
    """What to do about the filesystem errors of ``errors`` (their strerror texts)."""
    text = " ".join(errors)
    if os.strerror(errno.ENOSPC) in text or os.strerror(errno.EDQUOT) in text:
        return f"free some space there (or ask who filled it), or {otherwise}"
    if os.strerror(errno.EROFS) in text:
        return f"the file system is read-only: {otherwise}"
    return otherwise


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
    """A ``--lease-dir``'s window: crc32 of the folder's identity (its device and inode, so
    that two spellings of one folder, a bind mount's included, are one space; issue 39),
    in 1 .. 2**18 - 1, never HOST_KEY. A folder that does not exist yet (a dry run's)
    holds no lease: its real path stands in."""
    try:
        st = os.stat(path)
        ident = f"{st.st_dev}:{st.st_ino}".encode()
    except OSError:
        ident = os.fsencode(os.path.realpath(path))
    key = zlib.crc32(ident) % ((1 << 18) - 1) + 1
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
    old = tuple(f for f in OLD_FOLDERS if _is_folder(f))
    devices = {d for d in map(_dev, ("/run", "/tmp", SHARED, FALLBACK, *old)) if d}
    return Space((SHARED, FALLBACK, *old), HOST_KEY, frozenset(devices))


def _is_folder(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _make_shared() -> None:
    """Root: make /run/cpulaunch-leases (1777, root's) when missing; open up a root-owned 0755
    one (an older cpulaunch's) so that users' jobs can make their files there."""
    try:
        os.mkdir(SHARED, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return  # no /run here: users and root share /tmp/cpulaunch-leases then
    fd = _open_dir(SHARED)
    if fd is None:
        return
    try:
        st = os.fstat(fd)
        if st.st_uid == 0 and stat.S_IMODE(st.st_mode) != 0o1777:
            os.fchmod(fd, 0o1777)
    except OSError:
        pass  # read-only /run: users' jobs use /tmp/cpulaunch-leases
    finally:
        os.close(fd)


def _make_fallback() -> tuple[Optional[int], str]:
    """(a descriptor of :data:`FALLBACK`, made 1777 when missing, ""), or (None, why not)."""
    try:
        os.mkdir(FALLBACK, 0o700)
        made = True
    except FileExistsError:
        made = False
    except OSError as exc:
        return None, exc.strerror
    fd = _open_dir(FALLBACK)
    if fd is None:
        return None, "not a folder"
    if made and os.fstat(fd).st_uid == os.geteuid():
        try:
            os.fchmod(fd, 0o1777)  # whatever the umask: every user's jobs make their files here
        except OSError:
            pass
    return fd, ""


# --------------------------------------------------------------------------- reading locks


def parse_proc_locks(text: str) -> list[tuple[int, FileId, int, Optional[int]]]:
    """``/proc/locks`` -> ``[(pid, (major, minor, inode), start, end)]`` of the granted
    POSIX and OFD write locks (an OFD lock's pid is -1; waiters, the ``->`` lines, and every other kind left out); ``end``
    None for a lock to the end of the file. ``"1: POSIX  ADVISORY  WRITE 4242 00:2a:1234 5 7"``
    -> ``[(4242, (0, 42, 1234), 5, 7)]`` (fs/locks.c, lock_get_status: device numbers in
    hex, offsets in decimal)."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 8 or f[1] not in ("POSIX", "OFDLCK") or f[3] != "WRITE":
            continue
        dev = f[5].split(":")
        try:
            fid = (int(dev[0], 16), int(dev[1], 16), int(dev[2]))
            out.append((int(f[4]), fid, int(f[6]), None if f[7] == "EOF" else int(f[7])))
        except (ValueError, IndexError):
            continue
    return out


def decode(locks: Iterable[tuple[int, int, Optional[int]]], key: int, within: Sequence[int]) -> Optional[dict]:
    """What the write locks ``(start, end, pid)`` of one file say in the window of ``key``
    (pure): ``{"cpus", "pending", "waiting", "ticket", "pid"}``, or None when no lock lies in
    the window. ``within``: the logical CPU ids that can be meant, sorted (the machine's
    online CPUs): a lock's range is cut to them before any set is made, so that a lock
    over 65,534 bytes where no CPU exists costs nothing (issue 39). A lock reaching outside
    the window (a whole-file lock, say) is not a lease and is skipped.
    ``[(base + 2, base + 3, 9), (base + 2**20, base + 2**20, 9)]`` with ``within`` 0-7 ->
    cpus {2, 3}, pending, pid 9 (base = key << 44)."""
    import bisect

    base = key << 44
    top = within[-1] if within else -1
    found = {"cpus": set(), "pending": False, "waiting": False, "ticket": 0, "pid": None}
    any_lock = False
    for start, end, pid in locks:
        if end is None or start < base or end >= base + _WINDOW:
            continue
        a, b = start - base, end - base
        any_lock = True
        found["pid"] = pid
        if a <= top:
            found["cpus"].update(within[bisect.bisect_left(within, a):bisect.bisect_right(within, b)])
        found["pending"] |= a <= _PENDING <= b
        found["waiting"] |= a <= _WAITING <= b
        if a >= _TICKET and not found["ticket"]:
            found["ticket"] = a - _TICKET
    if not any_lock:
        return None
    found["cpus"] = frozenset(found["cpus"])
    return found


def _proc_locks(space: Space, within: Sequence[int]) -> tuple[dict, set, bool]:
    """({file: decoded} of the space's locks in /proc/locks, {files whose locks this
    process holds}, whether /proc/locks was longer than :data:`PROC_LOCKS_BYTES`). Only
    locks on the bytes that mean something (the CPUs of ``within``, the pending and
    waiting bytes, tickets) are kept."""
    from cpulaunch.machine.files import UnusableFileError, read_regular

    try:
        raw = read_regular("/proc/locks", cap=PROC_LOCKS_BYTES + 1, truncate=True)
    except (OSError, UnusableFileError):
        return {}, set(), False
    cut = len(raw) > PROC_LOCKS_BYTES
    text = raw[:PROC_LOCKS_BYTES].decode("ascii", "replace")
    if cut:
        text = text[:text.rfind("\n") + 1]
    base = space.key << 44
    top = base + (within[-1] if within else -1)
    me = os.getpid()
    by_file: dict = {}
    mine = set()
    for pid, fid, start, end in parse_proc_locks(text):
        if pid == me:
            mine.add(fid)
        if (fid[:2] in space.devices and end is not None and base <= start and end < base + _WINDOW
                and (start <= top or end >= base + _PENDING)):
            by_file.setdefault(fid, []).append((start, end, pid if pid > 0 else None))
    return {fid: d for fid, locks in by_file.items() if (d := decode(locks, space.key, within)) is not None}, mine, cut


def _write_locks(fd: int, base: int, top: int) -> list:
    """The write locks another process holds on the bytes of the file ``fd`` that mean
    something in the window at ``base``: CPUs 0 .. ``top``, the pending and waiting bytes,
    and the first ticket, as ``(start, end or None, pid or None)`` (``F_GETLK`` with a read
    lock: read locks do not conflict with it and are not seen). F_GETLK names one
    conflicting lock; the rest of a range on both sides is asked again. At most ``top`` + 6
    calls, whatever the file holds (issue 39: 4,096 locks per file made every read slow)."""
    import fcntl

    out: list = []
    for lo, hi, most in ((base, base + top, top + 2), (base + _PENDING, base + _WAITING, 3),
                         (base + _TICKET, base + _WINDOW - 1, 1)):
        todo = [(lo, hi)]
        asked = 0
        while todo and asked < most:
            a, b = todo.pop()
            if a > b:
                continue
            asked += 1
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
        try:  # for people who `cat` it; the locks are the lease, so a full disk costs only the text
            os.write(fd, f"pid {os.getpid()} uid {os.geteuid()} {what}\n".encode())
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
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
        online: the machine's online logical CPUs (what is read; any other CPU id in
            someone's locks is ignored).
        allowed: the CPUs this job may run on (what it may wait for).
        tries: kept for callers of older versions; lost races are bounded by time
            (:data:`RACE_TIME`, ``fail`` only), not by count.
        wait: the job waits (``--share-host wait``): lost races never end it.

    Use as a context manager: on leaving, its waiting file is removed (a :class:`Lease` it
    handed out lives on).
    """

    def __init__(self, where: Space, online, allowed, tries: int = 100, wait: bool = False):
        self.space = where
        self.online, self.allowed = frozenset(online), frozenset(allowed)
        self._ids = sorted(self.online)
        self.tries = tries
        self.waits = wait
        self.ticket = _boot_ms()
        self.lost = 0
        self.capped: set = set()  # folders (or /proc/locks) read only in part
        self._racing: Optional[float] = None  # when the current run of lost races began
        self._waiting: Optional[_File] = None
        self._kept: list = []  # descriptors of our own inodes, opened by a race: never closed before the end
        self._said: Optional[str] = None
        self._names: dict = {"scans": 0}  # pid -> command, ("ofd", file) -> (pid, why): looked up once
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
        lock semaphore for writing). At most :data:`MAX_FILES` files per folder and
        :data:`PROC_LOCKS_BYTES` of /proc/locks are read; what was cut is in :attr:`capped`."""
        own = set(own) | self._own()
        jobs: dict = {}
        if full:
            from_proc, self._mine, cut = _proc_locks(self.space, self._ids)
            if cut:
                self.capped.add("/proc/locks")
            jobs = {fid: _job(fid, d, False) for fid, d in from_proc.items() if fid not in own | self._mine}
        skip = own | self._mine
        for folder in self.space.folders:
            dfd = _open_dir(folder)
            if dfd is None:
                continue
            try:
                if self._read_folder(dfd, jobs, skip):
                    self.capped.add(folder)
            finally:
                os.close(dfd)
        return jobs

    def _read_folder(self, dfd: int, jobs: dict, skip: set) -> bool:
        """Read the lease files of one folder into ``jobs``; True when the folder held more
        than :data:`MAX_NAMES` names or :data:`MAX_FILES` lease files (the rest unread)."""
        base = self.space.key << 44
        top = self._ids[-1] if self._ids else -1
        me = os.geteuid()
        opened = 0
        with os.scandir(dfd) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_NAMES or opened >= MAX_FILES:
                    return True
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
                opened += 1
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
                    d = decode(_write_locks(fd, base, top), self.space.key, self._ids)
                finally:
                    if fd is not None:
                        os.close(fd)
                if d is None:
                    jobs.pop(got, None)  # ended since /proc/locks was read
                    if fst.st_uid == me or me == 0:
                        self._clean(dfd, name, got, fst.st_uid)
                    continue
                jobs[got] = _job(got, d, True)
        return False

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
        commands = self._names
        for job in sorted(jobs.values(), key=lambda j: j.order):
            for cpu in job.cpus & self.online:
                if cpu not in held:
                    held[cpu] = _holder(job.pid, commands, job.id)
                    if job.pending:
                        pending.add(cpu)
        return Leases(self.space, held, frozenset(pending), tuple(jobs.values()), tuple(sorted(self.capped)))

    # ----- claiming

    def claim(self, cpus) -> Optional[Lease]:
        """Claim ``cpus`` (logical CPU ids): the :class:`Lease`, or None when another job's
        claim overlaps it and stays (a lost race: read and plan again).

        The claim is published pending, then read against until no other claim overlaps
        it (then it is held). Younger pending claims are waited for (they decide within a
        read; :data:`PATIENCE` at most). A held claim or an older pending one is waited for
        too, up to :data:`SETTLE`, with this claim kept published (issue 39: a user who
        locks the planned CPUs for a moment whenever a lease file appears costs a claim that
        moment, not the claim); one that stays that long wins, and this claim withdraws.

        Raises:
            CpulaunchError: no lease file can be made anywhere; or (``fail`` only) races lost
                in a row for :data:`RACE_TIME`, each to claims that stayed :data:`SETTLE`
                (naming them).
        """
        cpus = frozenset(cpus)
        mine = self._make(cpus, _PENDING)
        started = time.monotonic()
        blocked_since = None
        while True:
            others = [j for j in self.jobs(own={mine.id}).values() if j.cpus & cpus]
            beaten = [j for j in others if not j.pending or j.order < (self.ticket, mine.id)]
            now = time.monotonic()
            if not others:
                import atexit

                mine.unlock((self.space.key << 44) + _PENDING)  # decided: held
                lease = Lease(mine, cpus, self._kept)
                self._kept = []
                self._racing = None
                atexit.register(lease.release)  # a supervising launcher's end; an exec'd program keeps it
                return lease
            if beaten:
                blocked_since = now if blocked_since is None else blocked_since
            else:
                blocked_since = None
            if (blocked_since is not None and now - blocked_since >= SETTLE) or now - started > PATIENCE:
                mine.drop()
                self.lost += 1
                text = held_text(self._leases({j.id: j for j in beaten or others}))
                log.info("--share-host: lost a race for CPUs %s (%s); reading and planning again",
                         cpulist.format(cpus), text)
                if self._racing is None:
                    self._racing = started
                if not self.waits and now - self._racing > RACE_TIME:
                    raise CpulaunchError(f"--share-host: {text} at each claim of this job for {RACE_TIME:g} s "
                                         f"({self.lost} claims, each kept {SETTLE * 1000:g} ms); "
                                         "wait for them with --share-host wait")
                return None
            time.sleep(0.002)  # younger claims decide within one read; a flicker ends

    def _make(self, cpus, marker: int) -> _File:
        """Publish a lease file in the first folder this job can make one in: the space's
        folders in order (``/tmp/cpulaunch-leases`` made when missing), else a fresh private folder
        under /tmp (then others see it through /proc/locks only)."""
        errors = []
        for folder in self.space.folders:
            if self.space.lease_dir is None and folder in OLD_FOLDERS:
                continue  # read only: an older cpulaunch's
            if self.space.lease_dir is None and folder == FALLBACK:
                dfd, why = _make_fallback()
            else:
                dfd, why = _open_dir(folder), "not a folder"
            if dfd is None:
                errors.append(f"{folder}: {why}")
                continue
            try:
                return _publish(dfd, folder, self.space.key, self.ticket, cpus, marker)
            except OSError as exc:
                errors.append(f"{folder}: {exc.strerror}")
            finally:
                os.close(dfd)
        if self.space.lease_dir is not None:
            raise _lease_error(self.space.lease_dir, f"takes no lease file ({'; '.join(errors)})",
                               _fix(errors, "pass a --lease-dir you can write to"))
        import tempfile

        private = None
        try:
            private = tempfile.mkdtemp(prefix=PRIVATE_PREFIX, dir="/tmp")
            dfd = os.open(private, _DIR_FLAGS)
            try:
                made = _publish(dfd, private, self.space.key, self.ticket, cpus, marker, private=True)
            finally:
                os.close(dfd)
        except OSError as exc:
            if private is not None:
                try:
                    os.rmdir(private)  # nothing left behind
                except OSError:
                    pass
            errors.append(f"/tmp: {exc.strerror}")
            raise _lease_error(self.space.shown, f"has no folder this job can make its lease file in "
                               f"({'; '.join(errors)})", _fix(errors, "pass --lease-dir DIR")) from None
        log.warning("note: --share-host: this job's lease file is in %s (%s); other jobs see its locks "
                    "through /proc/locks", private, "; ".join(errors))
        tidy_private(skip=private)  # earlier jobs' folders, left by their exec'd programs
        return made

    # ----- waiting

    def blocked(self, leases: Leases, why: str, wait: bool, say: Callable[[str], None]) -> Leases:
        """The plan does not fit on the CPUs other jobs left free (``leases``). Returns the
        leases to plan on again: once the CPUs that are only claimed (pending) are decided
        (milliseconds), or once a holder seen is gone after :data:`SETTLE` (lock flicker),
        else in ``wait`` mode once more of this job's allowed CPUs are free than now
        (:meth:`wait`).

        Raises:
            CpulaunchError: ``fail`` mode, when the same jobs still hold the CPUs after
                :data:`SETTLE` (naming them); or every CPU this job may use that is held
                belongs to a process that started this one (it would wait for itself).
        """
        blocking = {c: h for c, h in leases.held.items() if c in self.allowed}
        if set(blocking) & leases.pending and self._settle(set(blocking) & leases.pending):
            return self.read()
        mine = _ancestors()
        if blocking and all(h.pid in mine for h in blocking.values()):
            raise CpulaunchError(f"--share-host: {held_text(leases._replace(held=blocking))}, which started "
                                 f"this cpulaunch: {why}; drop --share-host from the inner cpulaunch")
        if not wait:
            time.sleep(SETTLE)  # a holder must stay to fail this job (issue 39: lock flicker)
            again = self.read()
            if not set(blocking) <= set(again.held):
                return again  # some were freed (or only flickered): plan again
            raise CpulaunchError(f"--share-host: {held_text(again)}: {why}; wait for them with --share-host wait")
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


#: File descriptors looked at, at most, to find who holds an OFD lock (:func:`_ofd_holder`).
_MAX_FDS_SCANNED = 16384


def _ofd_holder(fid: FileId) -> tuple[Optional[int], str]:
    """(pid, "") of a process holding a lock on the file ``fid`` through one of its
    descriptors, from ``/proc/PID/fdinfo/FD``'s ``lock:`` lines; else (None, why not). An
    OFD lock (``F_OFD_SETLK``) belongs to an open file, not a process: the kernel's lock
    list shows its pid as -1 (kernel 6.18), so the processes that hold the file open are
    looked at, those this user may see (its own; root: all of its PID namespace)."""
    hidden = 0
    seen = 0
    try:
        pids = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return None, "/proc not readable"
    me = str(os.getpid())
    for pid in pids:
        if pid == me:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except PermissionError:
            hidden += 1
            continue
        except OSError:
            continue
        for fd in fds:
            seen += 1
            if seen > _MAX_FDS_SCANNED:
                return None, f"more than {_MAX_FDS_SCANNED} open files on this host to look through"
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) != fid:
                continue
            try:
                with open(f"/proc/{pid}/fdinfo/{fd}", "rb") as f:
                    info = f.read(65536)
            except OSError:
                continue
            if any(line.startswith(b"lock:") and b"WRITE" in line for line in info.splitlines()):
                return int(pid), ""
    if hidden:
        return None, (f"an OFD lock or another PID namespace; {hidden} processes of other users are not "
                      "visible to this user: root's view names it")
    return None, "in another PID namespace: not visible from here"


def _holder(pid: Optional[int], commands: dict, fid: Optional[FileId] = None) -> Holder:
    """The :class:`Holder` of ``pid``, its command from /proc/PID/cmdline (cut at 80
    characters), read once per pid. ``pid`` None with the lease file ``fid``: the process
    is looked for among those holding the file open (:func:`_ofd_holder`), once per file."""
    if pid is None:
        if fid is None:
            return Holder(None, "")
        if ("ofd", fid) not in commands:
            commands["scans"] = commands.get("scans", 0) + 1
            commands[("ofd", fid)] = _ofd_holder(fid) if commands["scans"] <= 2 else \
                (None, "not looked for: more than 2 files locked without a pid")
        pid, why = commands[("ofd", fid)]
        if pid is None:
            return Holder(None, "", why)
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


# --------------------------------------------------------------------------- litter and surveys (doctor)


def _held_at(dfd: int, name: str) -> Optional[bool]:
    """Whether the lease file ``name`` in ``dfd`` holds any write lock in any lease window
    (None: it cannot be opened, or is not a regular file). The file is opened read-only;
    a reader never holds a lock on it, so closing it releases nothing."""
    import fcntl

    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        got = fcntl.fcntl(fd, fcntl.F_GETLK, _FLOCK.pack(fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0))
        return _FLOCK.unpack(got)[0] != fcntl.F_UNLCK
    except OSError:
        return None
    finally:
        os.close(fd)


def tidy_private(tmp: str = "/tmp", skip: str = "") -> list[str]:
    """Remove the private lease folders (``/tmp/cpulaunch-lease-*``, :data:`PRIVATE_PREFIX`)
    whose lease files nobody holds any more: this user's (root: anyone's), never through a
    link, at most :data:`MAX_NAMES` names of ``tmp`` looked at. Returns the folders removed.
    Called by a job that makes such a folder (issue 39: an exec'd job's folder stayed) and
    by ``cpulaunch doctor``."""
    removed: list = []
    top = _open_dir(tmp)
    if top is None:
        return removed
    me = os.geteuid()
    try:
        with os.scandir(top) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_NAMES:
                    break
                name = entry.name
                if not name.startswith(PRIVATE_PREFIX) or os.path.join(tmp, name) == skip:
                    continue
                try:
                    st = os.stat(name, dir_fd=top, follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISDIR(st.st_mode) or (st.st_uid != me and me != 0):
                    continue
                try:
                    dfd = os.open(name, _DIR_FLAGS, dir_fd=top)
                except OSError:
                    continue
                try:
                    names = os.listdir(dfd)
                    if len(names) > 16 or not all(x.startswith(("lease-", ".lease-")) for x in names):
                        continue  # not what a job leaves: someone else's, left alone
                    if any(_held_at(dfd, x) is not False for x in names):
                        continue
                    for x in names:
                        os.unlink(x, dir_fd=dfd)
                finally:
                    os.close(dfd)
                try:
                    os.rmdir(name, dir_fd=top)
                    removed.append(os.path.join(tmp, name))
                except OSError:
                    pass
    except OSError:
        pass
    finally:
        os.close(top)
    return removed


class Survey(Record):
    """One lease folder as ``cpulaunch doctor`` sees it (:func:`survey`).

    Attributes:
        folder: its path.
        files: the lease files counted (at most :data:`MAX_NAMES` names looked at;
            ``more`` when there were more).
        owners: {uid: lease files} of the files counted.
        removed: the files nobody held that this user removed (its own; root: anyone's).
        more: the folder holds more names than were looked at.
    """

    folder: str
    files: int
    owners: Mapping[int, int]
    removed: int
    more: bool


def survey(folder: str, clean: bool = True) -> Optional[Survey]:
    """Count the lease files of ``folder`` by owner and (``clean``) remove those nobody
    holds that this user may remove; None when it is not a folder."""
    dfd = _open_dir(folder)
    if dfd is None:
        return None
    me = os.geteuid()
    owners: dict = {}
    files = removed = 0
    more = False
    try:
        with os.scandir(dfd) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_NAMES * 4:
                    more = True
                    break
                if not entry.name.startswith("lease-"):
                    continue
                try:
                    st = os.stat(entry.name, dir_fd=dfd, follow_symlinks=False)
                except OSError:
                    continue
                files += 1
                owners[st.st_uid] = owners.get(st.st_uid, 0) + 1
                if clean and (st.st_uid == me or me == 0) and _held_at(dfd, entry.name) is False:
                    try:
                        os.unlink(entry.name, dir_fd=dfd)
                        removed += 1
                    except OSError:
                        pass
    finally:
        os.close(dfd)
    return Survey(folder, files, owners, removed, more)


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
    """The notes a plan on shared cores carries: where the leases are (an explanation: a
    run prints it with -v only, issue 40), who holds what (shown: the plan leaves those
    cores out), lease folders read only in part."""
    out = [explain(f"--share-host: leases in {leases.space.shown}")]
    if leases.held:
        out.append(f"--share-host: {held_text(leases)}; planned on the other cores")
    for folder in leases.capped:
        what = "more locks than" if folder == "/proc/locks" else "more lease files than"
        out.append(f"--share-host: {folder} holds {what} a job reads; the rest was not read "
                   "(cpulaunch doctor names the folder's owners)")
    if not claimed:
        out.append("--share-host: nothing claimed (only a run claims its cores)")
    return tuple(out)
