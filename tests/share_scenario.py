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
from hostusers import REPO, as_user, mount_tmpfs_keeping, user_python

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
    """u1 runs first (no /run/cpulaunch-leases): its lease goes to /tmp/cpulaunch-leases; root's run
    makes /run/cpulaunch-leases and sees u1's CPU; u2 sees both whatever its environment."""
    first = Job(u1, env={**os.environ, "XDG_RUNTIME_DIR": WORK, "HOME": WORK})
    r1 = first.report()
    after_u1 = {"run": mode_owner("/run/cpulaunch-leases"), "tmp": mode_owner("/tmp/cpulaunch-leases"),
                "files": sorted(os.listdir("/tmp/cpulaunch-leases"))}
    second = Job(None)
    r2 = second.report()
    after_root = {"run": mode_owner("/run/cpulaunch-leases"), "files": sorted(os.listdir("/run/cpulaunch-leases"))}
    views = {name: dry_run(u2, env=env) for name, env in (
        ("plain", {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "HOME")}),
        ("xdg", {**os.environ, "XDG_RUNTIME_DIR": WORK, "HOME": "/nonexistent"}),
        ("sudo", {**os.environ, "HOME": "/root", "SUDO_USER": u2, "SUDO_UID": "0"}))}
    return {"u1": r1, "root": r2, "after_u1": after_u1, "after_root": after_root, "views": views,
            "ends": [first.end(), second.end()]}


def planted_fallback(u1, u2):
    """u2 plants /tmp/cpulaunch-leases (0755, its own) before u1's first run: u1's job still runs
    (its lease file in a private folder) and root and u2 still see it."""
    subprocess.run(as_user(u2, ["mkdir", "-m", "0755", "/tmp/cpulaunch-leases"]), check=True)
    first = Job(u1)
    r1 = first.report()
    got = {"u1": r1, "root_view": dry_run(None), "u2_view": dry_run(u2), "end": first.end(),
           "private": private()}
    second = Job(u1)  # its own private folder; the first job's (nobody holds it) is removed
    got["u1_again"] = second.report()
    got["private_again"] = private()
    got["end_again"] = second.end()
    python, extra = python_of(u1)
    doctor = subprocess.run(as_user(u1, [python, "-m", "cpulaunch", "doctor", "--format", "json"]), cwd=REPO,
                            env={**os.environ, **extra}, capture_output=True, text=True, timeout=300)
    got["doctor"] = [f for f in json.loads(doctor.stdout)["findings"] if f["id"] == "lease-folder"]
    got["private_after_doctor"] = private()
    return got


def private():
    return sorted(n for n in os.listdir("/tmp") if n.startswith("cpulaunch-lease-"))


def old_folder_and_module(u1, u2):
    """A job of an older cpulaunch holds CPU 0 through /tmp/cpulaunch (the old name): a new
    job sees it held. A new job's folders are not named ``cpulaunch``, so ``python -m
    cpulaunch`` started in /tmp still imports the package."""
    os.mkdir("/tmp/cpulaunch", 0o1777)
    os.chmod("/tmp/cpulaunch", 0o1777)
    python, extra = python_of(u2)
    old = subprocess.Popen(as_user(u2, [python, "-c", OLD_HOLDER, "/tmp/cpulaunch/lease-old", str(0x2C9A1 << 44)]),
                           env={**os.environ, **extra}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert old.stdout.readline() == "locked\n"
    view = dry_run(u1)
    old.communicate("", timeout=60)
    subprocess.run(["rm", "-rf", "/tmp/cpulaunch"], check=True)
    job = Job(u1)
    job.report()
    made = sorted(n for n in os.listdir("/tmp") if "cpulaunch" in n)
    python1, extra1 = python_of(u1)
    version = subprocess.run(as_user(u1, [python1, "-m", "cpulaunch", "--version"]), cwd="/tmp",
                             env={**os.environ, **extra1, "PYTHONPATH": extra1.get("PYTHONPATH", REPO)},
                             capture_output=True, text=True, timeout=60)
    return {"old_pid": old.pid, "view": view, "made": made, "end": job.end(),
            "version": {"code": version.returncode, "stdout": version.stdout, "stderr": version.stderr}}


OLD_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, int(sys.argv[2]), 0)
print("locked", flush=True)
sys.stdin.read()
"""


def full_filesystems(u1, u2):
    """Small /run and /tmp (tmpfs of 256 kB and a few inodes) that user 2 fills: user 1's
    job fails with one line naming the folders (exit 2) and leaves nothing behind; with
    inodes free again but no space, the job runs (a lease file needs no bytes)."""
    global WORK
    for where, mode in (("/run", "0755"), ("/tmp", "1777")):
        mount_tmpfs_keeping(f"size=256k,nr_inodes=64,mode={mode}", where)
    os.mkdir("/run/cpulaunch-leases", 0o1777)
    os.chmod("/run/cpulaunch-leases", 0o1777)
    WORK = "/run/work"  # the jobs' FIFOs and outputs: on a file system of their own, not filled
    os.mkdir(WORK)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", WORK], check=True)
    os.chmod(WORK, 0o1777)
    with open(f"{WORK}/hold.py", "w") as f:
        f.write(HOLD)
    python, extra = python_of(u2)
    fill = ("import os, sys\nn = 0\nfor d in sys.argv[1:]:\n    try:\n        with open(d + '/big', 'wb') as f:\n"
            "            while True: f.write(bytes(65536))\n    except OSError: pass\n"
            "    while True:\n        try: open(f'{d}/f{n}', 'w').close(); n += 1\n"
            "        except OSError: break\nprint(n)\n")
    filled = subprocess.run(as_user(u2, [python, "-c", fill, "/run/cpulaunch-leases", "/tmp"]),
                            env={**os.environ, **extra}, capture_output=True, text=True, timeout=120)
    job = Job(u1)
    end = {**job.end(), "litter": sorted(n for n in os.listdir("/tmp") if n.startswith("cpulaunch"))}
    for d in ("/run/cpulaunch-leases", "/tmp"):  # inodes again, still no space
        for n in range(3):
            try:
                os.unlink(f"{d}/f{n}")
            except FileNotFoundError:
                pass
    second = Job(u1)
    r2 = second.report()
    return {"filled": filled.stdout.strip() or filled.stderr, "full": end, "space_only": r2, "end": second.end()}


def removed_while_held(u1, u2):
    """Root removes the lease folders while u1's and u2's jobs hold CPUs 0 and 1 (as logind
    or tmpfiles would): nobody is handed those CPUs; then a folder of u2's planted in its
    place changes nothing either."""
    a = Job(u1)
    ra = a.report()
    b = Job(u2)
    rb = b.report()
    before = dry_run(None)
    subprocess.run(["rm", "-rf", "/tmp/cpulaunch-leases", "/run/cpulaunch-leases"], check=True)
    gone = dry_run(None)
    subprocess.run(as_user(u2, ["mkdir", "-m", "1777", "/tmp/cpulaunch-leases"]), check=True)
    planted = dry_run(u1)
    ends = [a.end(), b.end()]
    return {"a": ra, "b": rb, "before": before, "gone": gone, "planted": planted, "ends": ends,
            "after": dry_run(u1)}


def flooded_folder(u1, u2):
    """User 2 fills /tmp/cpulaunch-leases with 600 lease files nobody holds: user 1's doctor
    warns, naming the folder and user 2's count; root's doctor removes them."""
    subprocess.run(as_user(u2, ["mkdir", "-m", "1777", "/tmp/cpulaunch-leases"]), check=True)
    subprocess.run(as_user(u2, ["sh", "-c", "cd /tmp/cpulaunch-leases && i=0; while [ $i -lt 600 ]; do "
                                            ": > lease-x-$i; i=$((i+1)); done"]), check=True)

    def doctor(user):
        python, extra = python_of(user)
        proc = subprocess.run(as_user(user, [python, "-m", "cpulaunch", "doctor", "--format", "json"]), cwd=REPO,
                              env={**os.environ, **extra}, capture_output=True, text=True, timeout=300)
        return [f for f in json.loads(proc.stdout)["findings"] if f["id"] == "lease-folder"]

    return {"u1": doctor(u1), "root": doctor(None), "left": len(os.listdir("/tmp/cpulaunch-leases"))}


CACHE_PROBE = """
import json, sys
from pathlib import Path
from cpulaunch.machine import host
wanted = Path(sys.argv[1])
folder, note = host.own_cache_dir({"HOME": sys.argv[2]})
print(json.dumps({"folder": str(folder) if folder else None, "note": note,
                  "own": host._write_verdict(folder, "zentorch-probe.json", {"k": 1}, True, "") if folder else None,
                  "wanted": host._write_verdict(wanted, "zentorch-probe.json", {"k": 1}, True, "")}))
"""


def sudo_home(u1, u2):
    """Root with user 1's HOME (``sudo -E``), in a private namespace with tmpfs homes for
    root and user 1: root keeps its verdicts in its own cache, leaves nothing of its own in
    user 1's home, and writes nothing through a link user 1 planted at ~/.cache (to a
    folder of root's); user 1's own runs keep theirs at home, never through a link; root's
    ``doctor --clear-cache`` clears what root's runs wrote (root's cache is a tmpfs here)."""
    import pwd

    home = pwd.getpwnam(u1).pw_dir
    uid, gid = pwd.getpwnam(u1).pw_uid, pwd.getpwnam(u1).pw_gid
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"mode=0755,uid={uid},gid={gid}", "tmpfs", home], check=True)
    os.makedirs("/root/.cache", 0o700, exist_ok=True)  # root's own cache: a tmpfs of this namespace's
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0700", "tmpfs", "/root/.cache"], check=True)
    os.makedirs("/run/rootdir", 0o755)

    def probe(user, env_home):
        python, extra = python_of(user)
        proc = subprocess.run(as_user(user, [python, "-c", CACHE_PROBE, f"{env_home}/.cache/cpulaunch", env_home]),
                              cwd=REPO, env={**os.environ, **extra, "HOME": env_home}, capture_output=True, text=True,
                              timeout=60)
        return json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr}

    def root_owned():
        return sorted(os.path.join(d, n) for d, ds, fs in os.walk(home) for n in ds + fs
                      if os.lstat(os.path.join(d, n)).st_uid == 0)

    out = {"root": probe(None, home), "root_owned": root_owned()}
    subprocess.run(as_user(u1, ["ln", "-s", "/run/rootdir", f"{home}/.cache"]), check=True)
    out["root_link"] = probe(None, home)
    out["through_link"] = sorted(os.listdir("/run/rootdir"))
    subprocess.run(as_user(u1, ["rm", f"{home}/.cache"]), check=True)
    out["user"] = probe(u1, home)
    out["pip"] = subprocess.run(as_user(u1, ["mkdir", "-p", f"{home}/.cache/pip"]), capture_output=True,
                                text=True).returncode
    subprocess.run(as_user(u1, ["mkdir", "-p", "/tmp/elsewhere"]), check=True)
    subprocess.run(as_user(u1, ["sh", "-c", f"rm -r {home}/.cache && ln -s /tmp/elsewhere {home}/.cache"]), check=True)
    out["user_link"] = probe(u1, home)
    out["user_through_link"] = sorted(os.listdir("/tmp/elsewhere"))
    clear = subprocess.run([sys.executable, "-m", "cpulaunch", "doctor", "--clear-cache", "--format", "json"],
                           cwd=REPO, env={**os.environ, "HOME": home}, capture_output=True, text=True, timeout=60)
    out["clear"] = {"code": clear.returncode, "stdout": clear.stdout, "stderr": clear.stderr}
    out["root_cache_after"] = sorted(os.listdir("/root/.cache/cpulaunch"))
    return out


if __name__ == "__main__":
    os.makedirs(WORK, exist_ok=True)
    os.chmod(WORK, 0o1777)
    with open(f"{WORK}/hold.py", "w") as f:
        f.write(HOLD)
    result = globals()[sys.argv[1]](sys.argv[2], sys.argv[3])
    print(json.dumps(result))
