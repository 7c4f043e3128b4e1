"""Scenarios of --share-host on the host's own folders, run by tests/test_share_host.py as
root inside a private mount namespace with fresh /run and /tmp (tests/hostusers.fresh),
so that they do not depend on the host's past: ``python share_scenario.py NAME USER1
USER2``. Each prints one JSON object on its last line.

Every job runs HOLD (its pid and CPUs into a file, then it reads a FIFO until the scenario
closes it), as root or as USER1/USER2 through setpriv; nothing waits by sleeping: each
step waits for a file or an exit.
"""

import functools
import json
import os
import subprocess
import sys

import waiting
from hostusers import REPO, as_user, user_python

WORK = "/tmp/scenario"  # in the fresh /tmp: every user may enter
HOLD = """
import json, os, sys
out, fifo = sys.argv[1], sys.argv[2]
with open(out + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "cpus": sorted(os.sched_getaffinity(0))}, f)
os.rename(out + ".tmp", out)
with open(fifo) as f:
    f.read()
"""


@functools.lru_cache(maxsize=None)
def python_of(user):
    """(interpreter, its variables) for ``user`` (None: root, this interpreter)."""
    return (sys.executable, {}) if user is None else user_python(user)


def wait_for(predicate, what, timeout=60.0):
    return waiting.wait_for(predicate, what, timeout, error=SystemExit)


class Job:
    """``cpulaunch --share-host`` running HOLD on one core as ``user`` (None: root)."""

    count = 0

    def __init__(self, user, *args, env=None):
        python, extra = python_of(user)
        Job.count += 1
        name = f"{WORK}/job{Job.count}"
        self.out, fifo = name + ".json", name + ".fifo"
        os.mkfifo(fifo)
        os.chmod(fifo, 0o666)
        self.writer = os.open(fifo, os.O_RDWR | os.O_CLOEXEC)
        argv = [python, "-m", "cpulaunch", "--share-host", "--allocator", "default", "--bind", "affinity",
                "--ninstances", "1", "--ncores-per-instance", "1", *args, python, f"{WORK}/hold.py", self.out, fifo]
        self.proc = subprocess.Popen(as_user(user, argv), cwd=REPO, env={**(env or os.environ), **extra},
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)

    def report(self):
        wait_for(lambda: os.path.exists(self.out) or self.proc.poll() is not None, self.out)
        if not os.path.exists(self.out):
            raise SystemExit(f"job failed: {self.proc.communicate()}")
        with open(self.out) as f:
            return json.load(f)

    def end(self):
        os.close(self.writer)
        out, err = self.proc.communicate(timeout=60)
        return {"code": self.proc.returncode, "stderr": err}


def dry_run(user, env=None):
    python, extra = python_of(user)
    proc = subprocess.run(as_user(user, [python, "-m", "cpulaunch", "--share-host", "--allocator", "default",
                                         "--ninstances", "1", "--ncores-per-instance", "1", "--dry-run", "true"]),
                          cwd=REPO, env={**(env or os.environ), **extra}, capture_output=True, text=True, timeout=60)
    return {"code": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


def mode_owner(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return [oct(st.st_mode & 0o7777), st.st_uid]


def folders_and_environments(u1, u2):
    """u1 runs first (no /run/cpulaunch): its lease goes to /tmp/cpulaunch; root's run
    makes /run/cpulaunch and sees u1's CPU; u2 sees both whatever its environment."""
    first = Job(u1, env={**os.environ, "XDG_RUNTIME_DIR": WORK, "HOME": WORK})
    r1 = first.report()
    after_u1 = {"run": mode_owner("/run/cpulaunch"), "tmp": mode_owner("/tmp/cpulaunch"),
                "files": sorted(os.listdir("/tmp/cpulaunch"))}
    second = Job(None)
    r2 = second.report()
    after_root = {"run": mode_owner("/run/cpulaunch"), "files": sorted(os.listdir("/run/cpulaunch"))}
    views = {name: dry_run(u2, env=env) for name, env in (
        ("plain", {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "HOME")}),
        ("xdg", {**os.environ, "XDG_RUNTIME_DIR": WORK, "HOME": "/nonexistent"}),
        ("sudo", {**os.environ, "HOME": "/root", "SUDO_USER": u2, "SUDO_UID": "0"}))}
    return {"u1": r1, "root": r2, "after_u1": after_u1, "after_root": after_root, "views": views,
            "ends": [first.end(), second.end()]}


def planted_fallback(u1, u2):
    """u2 plants /tmp/cpulaunch (0755, its own) before u1's first run: u1's job still runs
    (its lease file in a private folder) and root and u2 still see it."""
    subprocess.run(as_user(u2, ["mkdir", "-m", "0755", "/tmp/cpulaunch"]), check=True)
    first = Job(u1)
    r1 = first.report()
    return {"u1": r1, "root_view": dry_run(None), "u2_view": dry_run(u2), "end": first.end(),
            "private": [n for n in os.listdir("/tmp") if n.startswith("cpulaunch-lease-")]}


def removed_while_held(u1, u2):
    """Root removes the lease folders while u1's and u2's jobs hold CPUs 0 and 1 (as logind
    or tmpfiles would): nobody is handed those CPUs; then a folder of u2's planted in its
    place changes nothing either."""
    a = Job(u1)
    ra = a.report()
    b = Job(u2)
    rb = b.report()
    before = dry_run(None)
    subprocess.run(["rm", "-rf", "/tmp/cpulaunch", "/run/cpulaunch"], check=True)
    gone = dry_run(None)
    subprocess.run(as_user(u2, ["mkdir", "-m", "1777", "/tmp/cpulaunch"]), check=True)
    planted = dry_run(u1)
    ends = [a.end(), b.end()]
    return {"a": ra, "b": rb, "before": before, "gone": gone, "planted": planted, "ends": ends,
            "after": dry_run(u1)}


if __name__ == "__main__":
    os.makedirs(WORK, exist_ok=True)
    os.chmod(WORK, 0o1777)
    with open(f"{WORK}/hold.py", "w") as f:
        f.write(HOLD)
    result = globals()[sys.argv[1]](sys.argv[2], sys.argv[3])
    print(json.dumps(result))
