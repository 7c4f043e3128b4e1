"""Attackers of --share-host (issue 39), each a process of a user who holds no CPU:
``python share_attacks.py KIND FOLDER BASE [N [L]]``. Each sets its attack up, prints
``ready`` and keeps it (its locks live as long as it does) until its stdin closes; then it
removes the files it made.

BASE is the lock window of the space attacked (``key << 44``). The kinds:

* ``ranges N [U]``: N files of its own in FOLDER, each with one write lock over the window's
  CPU bytes ``BASE+2 .. BASE+65535``, where no CPU exists (every reader used to make a
  65,534-element set per file: 12 MB each); U=1: the files are removed once locked (the
  locks outlive them, seen through /proc/locks).
* ``many N L``: N files, each with L one-byte write locks in the window, spread over the
  bytes between the CPUs and the pending byte and over the tickets (every reader used to
  walk them all with F_GETLK).
* ``dead N``: N lease files that nobody holds (every reader opens them).
* ``flicker N L``: ``many N L`` to slow the reads, and whenever a lease file appears in
  FOLDER (inotify, through ctypes), write-locks CPUs 0-1023, the pending byte and ticket 1
  in a file of its own for 30 ms, then lets go (each time a new file, as a fresh job would
  look). Prints ``flicks K`` on stdout at the end.
"""

import ctypes
import fcntl
import os
import select
import struct
import sys
import threading
import time

FLOCK = struct.Struct("hhqqi4x")
PENDING, TICKET = 1 << 20, 1 << 21


def lock(fd, start, length=1):
    fcntl.fcntl(fd, fcntl.F_SETLK, FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, start, length, 0))


def unlock_all(fd):
    fcntl.fcntl(fd, fcntl.F_SETLK, FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, 0, 0, 0))


MADE = []  # the files this attacker made, removed at its end


def new_file(folder, name):
    path = os.path.join(folder, f"{name}-{os.getpid()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    os.fchmod(fd, 0o644)
    MADE.append(path)
    return fd


def ranges(folder, base, n, unlinked=0):
    fds = [lock(fd, base + 2, 65534) or fd for fd in (new_file(folder, f"lease-ranges-{i}") for i in range(n))]
    if unlinked:  # the locks outlive the names: /proc/locks still lists them
        for path in MADE:
            os.unlink(path)
        MADE.clear()
    return fds


def many(folder, base, n, per):
    fds = []
    for i in range(n):
        fd = new_file(folder, f"lease-many-{i}")
        for k in range(per):  # every other byte: neighbours would merge into one lock
            lock(fd, base + 4096 + 2 * k if k % 2 else base + TICKET + 2 * k)
        fds.append(fd)
    return fds


def dead(folder, n):
    for i in range(n):
        os.close(new_file(folder, f"lease-dead-{i}"))
    return []


def flicker(folder, base, n, per, stop):
    fds = many(folder, base, n, per)
    libc = ctypes.CDLL(None, use_errno=True)
    ino = libc.inotify_init1(os.O_CLOEXEC)
    if ino < 0 or libc.inotify_add_watch(ino, os.fsencode(folder), 0x00000080 | 0x00000100) < 0:  # MOVED_TO|CREATE
        raise SystemExit("no inotify")
    count = [0]

    def run():
        serial = 0
        while not stop.is_set():
            if not select.select([ino], [], [], 0.2)[0]:
                continue
            data = os.read(ino, 65536)
            seen = False
            off = 0
            while off < len(data):
                _, _, _, size = struct.unpack_from("iIII", data, off)
                name = data[off + 16:off + 16 + size].split(b"\0")[0]
                off += 16 + size
                seen |= name.startswith(b"lease-") and not name.startswith((b"lease-flick", b"lease-many"))
            if not seen:
                continue
            serial += 1
            fd = new_file(folder, f"lease-flick-{serial}")
            lock(fd, base, 1024)
            lock(fd, base + PENDING)
            lock(fd, base + TICKET + 1)
            time.sleep(0.03)
            unlock_all(fd)
            os.unlink(MADE.pop())
            os.close(fd)
            count[0] += 1

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return fds, thread, count


def main():
    kind, folder, base = sys.argv[1], sys.argv[2], int(sys.argv[3])
    args = [int(a) for a in sys.argv[4:]]
    stop = threading.Event()
    thread = count = None
    if kind == "ranges":
        keep = ranges(folder, base, *args)
    elif kind == "many":
        keep = many(folder, base, *args)
    elif kind == "dead":
        keep = dead(folder, *args)
    elif kind == "flicker":
        keep, thread, count = flicker(folder, base, *args, stop)
    else:
        raise SystemExit(f"unknown attack {kind}")
    print("ready", flush=True)
    sys.stdin.read()
    stop.set()
    if thread is not None:
        thread.join(5)
        print(f"flicks {count[0]}", flush=True)
    for path in MADE:
        try:
            os.unlink(path)
        except FileNotFoundError:  # removed by root's job: its locks mean nothing to a reader
            pass
    del keep


if __name__ == "__main__":
    main()
