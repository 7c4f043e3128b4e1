"""Other users and private mounts for tests that need them (issue 34): the tests make two
unprivileged users of their own (``useradd -m``) and run commands as them with setpriv;
a test that needs a host without ``/run/cpulaunch-leases`` runs in a private mount namespace with
fresh ``/run`` and ``/tmp`` (tmpfs), whatever the host's past. Root only; a test skips,
naming what is missing, elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

#: The two users the tests make (and keep: making them again costs nothing).
USERS = ("cpulaunch-u1", "cpulaunch-u2")

#: The shell script :func:`fresh` runs as root: a fresh ``/run`` and ``/tmp`` (tmpfs), with
#: the folders named before ``--`` (those of the old /tmp that the command needs) bound back
#: at their own paths through a short-lived view of the old /tmp, then the command after ``--``.
FRESH_SCRIPT = """set -e
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir /run/host-tmp
mount --bind /tmp /run/host-tmp
mount -t tmpfs -o mode=1777 tmpfs /tmp
while [ "$1" != -- ]; do mkdir -p "$1"; mount --bind "/run/host-tmp${1#/tmp}" "$1"; shift; done
shift
umount /run/host-tmp
rmdir /run/host-tmp
exec "$@"
"""


def kept_under_tmp() -> list:
    """The folders under /tmp that a command run here needs and a fresh /tmp would hide:
    the checkout and this interpreter's environment (a clone with its .venv under /tmp)."""
    import sysconfig

    folders = {REPO, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)),
               sysconfig.get_paths()["purelib"]}
    real = {os.path.realpath(f) for f in folders}
    under = sorted(f for f in real if f == "/tmp" or f.startswith("/tmp/"))
    return [f for f in under if not any(f.startswith(o + "/") for o in under)]


def missing() -> str:
    """Why these tests cannot run here ("" when they can)."""
    if os.geteuid() != 0:
        return "needs root (makes users, mounts in a private namespace)"
    for tool in ("setpriv", "useradd", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    return ""


def ensure_users() -> tuple[str, ...]:
    """Make :data:`USERS` where missing; returns them."""
    for name in USERS:
        if subprocess.run(["id", "-u", name], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "-m", name], check=True, capture_output=True, timeout=60)
    return USERS


def as_user(name: str | None, argv) -> list:
    """``argv`` run as ``name`` (None: as root) through setpriv, with its own groups."""
    if name is None:
        return list(argv)
    return ["setpriv", f"--reuid={name}", f"--regid={name}", "--init-groups", *argv]


def uid_of(name: str) -> int:
    return int(subprocess.run(["id", "-u", name], capture_output=True, text=True, check=True).stdout)


def mount_tmpfs_keeping(options: str, where: str) -> None:
    """Mount a tmpfs (``mount -o OPTIONS``) over ``where`` in this process's private mount
    namespace, then bind the folders of :func:`kept_under_tmp` that lay under it back at
    their own paths (through descriptors opened before the mount), so that a scenario's
    small or full ``/tmp`` does not hide the checkout and interpreter it runs."""
    prefix = where.rstrip("/") + "/"
    kept = [k for k in kept_under_tmp() if k.startswith(prefix)]
    fds = [os.open(k, os.O_PATH | os.O_DIRECTORY) for k in kept]
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", where], check=True)
        for k, fd in zip(kept, fds):
            os.makedirs(k, exist_ok=True)
            subprocess.run(["mount", "--no-canonicalize", "--bind", f"/proc/self/fd/{fd}", k], check=True, pass_fds=(fd,))
    finally:
        for fd in fds:
            os.close(fd)


def fresh(argv) -> list:
    """``argv`` run in a private mount namespace with fresh /run and /tmp, where the
    checkout and this interpreter stay reachable (:func:`kept_under_tmp`): a tmpfs over
    /tmp must not hide the program that runs inside it."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", FRESH_SCRIPT, "sh",
            *kept_under_tmp(), "--", *argv]


def user_python(user: str) -> tuple[str, dict]:
    """An interpreter ``user`` can run with cpulaunch and its dependencies importable, and
    the variables it needs: this one when ``user`` may execute it, else the system's
    ``python3.X`` of the same version with this environment's site-packages and the
    checkout on PYTHONPATH (a venv made from a Python under /root, as pyenv's, is not
    executable by other users). ``("", {})`` when there is none."""
    import sysconfig

    def runs(python: str, env: dict) -> bool:  # exec'd by a process of the user's (setpriv may exec more)
        argv = ["env", *(f"{k}={v}" for k, v in env.items()), "sh", "-c", 'exec "$0" -c "import cpulaunch, click"',
                python]
        return subprocess.run(as_user(user, argv), capture_output=True, cwd=REPO).returncode == 0

    if runs(sys.executable, {}):
        return sys.executable, {}
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for folder in ("/usr/bin", "/usr/local/bin"):
        candidate = os.path.join(folder, version)
        env = {"PYTHONPATH": os.pathsep.join([str(REPO), sysconfig.get_paths()["purelib"]])}
        if os.access(candidate, os.X_OK) and runs(candidate, env):
            return candidate, env
    return "", {}


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
