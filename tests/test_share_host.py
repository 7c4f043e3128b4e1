"""Issue 22: --share-host, jobs that share a host never stack. Real processes throughout:
two jobs started at once get disjoint CPUs; a job killed by SIGKILL frees its cores; a
second job fails naming the holder, or waits for it; --dry-run says who holds what; the
lease folder and its files are never followed through links, and another user's file
cannot keep a core from anybody (a forked child that became "nobody").

No sleep wins a race here: each step waits, with a deadline, for a state it can see (a
file written by the program, a line on stderr, a process gone).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO
from test_launch_faults import NOBODY
from test_launch_faults import shared as sticky  # noqa: F401 - a fixture: a sticky /tmp folder, root and setpriv
from cpulaunch.errors import CpulaunchError
from cpulaunch.machine import lease
from cpulaunch.machine import probe  # noqa: F401 - imported before a child drops its privileges

#: The program each job runs: it writes its pid and affinity to OUT<instance>.json, then
#: reads its FIFO until the test closes the write end.
HOLD = """
import json, os, sys
out, fifo = sys.argv[1], sys.argv[2]
idx = os.environ.get("CPULAUNCH_INSTANCE_INDEX", "0")
with open(out + idx + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "cpus": sorted(os.sched_getaffinity(0))}, f)
os.rename(out + idx + ".tmp", out + idx + ".json")
with open(fifo + idx) as f:
    f.read()
"""

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to share")


def wait_for(predicate, what: str, timeout: float = 30.0):
    """``predicate()``'s first true value, checked every 10 ms up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class Job:
    """One ``cpulaunch --share-host`` run of HOLD (``n`` instances), with a FIFO per
    instance held open for writing by the test: closing it lets the instance end."""

    def __init__(self, tmp: Path, name: str, leases: Path, *args: str, n: int = 1, mode: str = "fail"):
        self.out = str(tmp / f"{name}-out")
        fifo = str(tmp / f"{name}-fifo")
        self.writers = []
        for i in range(n):
            os.mkfifo(fifo + str(i))
            self.writers.append(os.open(fifo + str(i), os.O_RDWR | os.O_CLOEXEC))
        script = tmp / "hold.py"
        script.write_text(HOLD)
        argv = [sys.executable, "-m", "cpulaunch", f"--share-host={mode}", "--lease-dir", str(leases),
                "--allocator", "default", "--bind", "affinity", *args, sys.executable, str(script), self.out, fifo]
        self.proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.n = n

    def report(self, i: int = 0) -> dict:
        """What instance ``i`` wrote, once it has (a deadline, never a sleep)."""
        path = Path(f"{self.out}{i}.json")
        wait_for(lambda: path.exists() or self.proc.poll() is not None, f"{path.name}")
        assert path.exists(), (self.proc.returncode, self.proc.stderr.read())
        return json.loads(path.read_text())

    def release(self) -> int:
        for fd in self.writers:
            os.close(fd)
        self.writers = []
        out, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err
        return self.proc.returncode

    def kill(self) -> None:
        for fd in self.writers:
            os.close(fd)
        self.writers = []
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=60)


@pytest.fixture
def leases(tmp_path):
    return tmp_path / "leases"


@pytest.fixture
def jobs():
    started = []
    yield started
    for job in started:
        job.kill()


def start(jobs, *a, **k) -> Job:
    job = Job(*a, **k)
    jobs.append(job)
    return job


def dry_run(leases: Path, *args: str, check: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "cpulaunch", "--share-host", "--lease-dir", str(leases),
                           "--dry-run", "--allocator", "default", *args, "true"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == check, proc.stderr
    return proc


def test_two_jobs_started_at_once_get_disjoint_cpus(tmp_path, leases, jobs):
    """Two single-core jobs, started back to back: each plans, claims, and on losing the
    race plans again; they end up on CPUs 0 and 1, and each program holds its lease
    (exec'd: the lock file's holder in /proc/locks is the program's own pid)."""
    one_core = ("--ninstances", "1", "--ncores-per-instance", "1")
    a = start(jobs, tmp_path, "a", leases, *one_core)
    b = start(jobs, tmp_path, "b", leases, *one_core)
    ra, rb = a.report(), b.report()
    assert sorted(ra["cpus"] + rb["cpus"]) == [0, 1], (ra, rb)
    assert (ra["pid"], rb["pid"]) == (a.proc.pid, b.proc.pid)  # exec'd: no supervisor
    holders = lease.parse_proc_locks(Path("/proc/locks").read_text())
    for report in (ra, rb):
        st = os.stat(leases / f"cpu{report['cpus'][0]}.lock")
        assert holders[(os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)] == report["pid"]
    # a third job finds nothing free and names both holders, in one line
    proc = dry_run(leases, *one_core, check=2)
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("cpulaunch: error: --share-host: CPUs ")
    for report in (ra, rb):
        assert f"pid {report['pid']} ({sys.executable} " in proc.stderr  # its command, cut at 80 characters
    assert proc.stderr.rstrip().endswith("wait for them with --share-host wait")
    a.release()
    b.release()


def test_dry_run_shows_who_holds_what_and_plans_on_the_rest(tmp_path, leases, jobs):
    a = start(jobs, tmp_path, "a", leases, "--ninstances", "1", "--ncores-per-instance", "1")
    cpu = a.report()["cpus"][0]
    proc = dry_run(leases)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"# instance 0: cpus {1 - cpu}")
    notes = [line for line in lines if line.startswith("# note: --share-host")]
    assert notes[0] == f"# note: --share-host: leases in {leases}"
    assert notes[1].startswith(f"# note: --share-host: CPUs {cpu} held by pid {a.proc.pid} ({sys.executable} ")
    assert notes[1].endswith("; planned on the other cores")
    assert notes[2] == "# note: --share-host: nothing claimed (only a run claims its cores)"
    a.release()
    assert "held by" not in dry_run(leases).stdout  # released with the program's end


@pytest.mark.parametrize("instances", [1, 2])
def test_a_killed_holder_frees_its_cores(tmp_path, leases, jobs, instances):
    """SIGKILL of the job (the exec'd program itself; or the launcher supervising two
    instances, which then die with it): its cores are free again at once."""
    a = start(jobs, tmp_path, "a", leases, "--ninstances", str(instances), n=instances)
    pids = [a.report(i)["pid"] for i in range(instances)]
    assert "CPUs 0-1 held by pid" in dry_run(leases, check=2).stderr
    a.proc.kill()
    a.proc.wait(timeout=30)
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), "the instances to end")
    b = start(jobs, tmp_path, "b", leases, "--ninstances", "1")
    assert b.report()["cpus"] == [0, 1]
    b.release()


def test_wait_mode_waits_for_the_holder_then_runs(tmp_path, leases, jobs):
    a = start(jobs, tmp_path, "a", leases, "--ninstances", "1")  # both CPUs
    assert a.report()["cpus"] == [0, 1]
    b = start(jobs, tmp_path, "b", leases, "--ninstances", "1", mode="wait")
    ready, _, _ = select.select([b.proc.stderr], [], [], 30)
    assert ready, "no waiting line"
    line = b.proc.stderr.readline()
    assert line.startswith(f"cpulaunch: waiting for CPUs 0-1 held by pid {a.proc.pid} (") and \
        line.rstrip().endswith("(--share-host wait)"), line
    assert not Path(b.out + "0.json").exists() and b.proc.poll() is None  # still waiting
    a.release()
    assert b.report()["cpus"] == [0, 1]
    b.release()


def test_bare_flag_variable_and_words(tmp_path, leases):
    env = {**os.environ, "CPULAUNCH_SHARE_HOST": "1", "CPULAUNCH_LEASE_DIR": str(leases)}
    proc = subprocess.run([sys.executable, "-m", "cpulaunch", "--dry-run", "true"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert f"# note: --share-host: leases in {leases}" in proc.stdout, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "cpulaunch", "--dry-run", "--share-host", "true"], cwd=REPO,
                          env={**env, "CPULAUNCH_SHARE_HOST": ""}, capture_output=True, text=True, timeout=60)
    assert "--share-host" in proc.stdout and proc.returncode == 0  # bare, then the program
    proc = subprocess.run([sys.executable, "-m", "cpulaunch", "--dry-run", "--share-host", "wait", "true"],
                          cwd=REPO, env={**env, "CPULAUNCH_SHARE_HOST": ""}, capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines()[1].endswith(" true") and "--share-host" in proc.stdout  # wait: its word
    proc = subprocess.run([sys.executable, "-m", "cpulaunch", "--dry-run", "--share-host", "maybe", "x"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines()[1].endswith(" maybe x")  # any other word starts the program
    proc = subprocess.run([sys.executable, "-m", "cpulaunch", "--dry-run", "--share-host=never", "true"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr == (
        "cpulaunch: error: --share-host never: use fail (the default: say who holds the cores) or wait\n")
    assert not leases.exists()  # a dry run makes nothing


# --------------------------------------------------------------------------- links and other users


def test_lease_folder_that_is_a_link_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    proc = subprocess.run([sys.executable, "-m", "cpulaunch", "--share-host", "--lease-dir", str(link), "true"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr == (
        f"cpulaunch: error: --share-host: {link} is a link; remove it, or pass --lease-dir DIR\n")
    assert list(real.iterdir()) == []


def test_planted_links_and_fifos_are_never_followed(sticky, tmp_path):
    """nobody plants cpu0.lock as a link to a precious file and cpu1.lock as a FIFO: a
    real run coordinates neither (a note), never opens the link's target, never blocks."""
    precious = tmp_path / "precious"
    precious.write_text("keep")
    subprocess.run(NOBODY + ["ln", "-s", str(precious), str(sticky / "cpu0.lock")], check=True, timeout=20)
    subprocess.run(NOBODY + ["mkfifo", str(sticky / "cpu1.lock")], check=True, timeout=20)
    before = precious.stat()
    proc = dry_run(sticky)
    assert ("# note: --share-host: the lease files of CPUs 0-1 are links, not regular files, not readable "
            "or missing where only their owner may make them: those CPUs are not coordinated") in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "cpulaunch", "--share-host", "--lease-dir", str(sticky),
                           "--ninstances", "1", "true"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    after = precious.stat()
    assert precious.read_text() == "keep" and (after.st_mtime_ns, after.st_atime_ns) == (before.st_mtime_ns,
                                                                                        before.st_atime_ns)
    assert (sticky / "cpu0.lock").is_symlink() and stat.S_ISFIFO((sticky / "cpu1.lock").lstat().st_mode)


def _as_nobody(work) -> dict:
    """Run ``work()`` in a forked child that became nobody (modules already imported: it
    can no longer read the interpreter's folder); its JSON-ready result, or its error."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                result = {"ok": work()}
            except CpulaunchError as exc:
                result = {"error": str(exc)}
            os.write(w, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def test_another_users_file_cannot_keep_a_core(sticky):
    """In a shared sticky folder, root's cpu1.lock of mode 0600 cannot be opened by
    nobody: nobody's job counts CPU 1 as free (not coordinated, a note), never as held,
    and makes and locks its own cpu0.lock (0644)."""
    fd = os.open(sticky / "cpu1.lock", os.O_CREAT | os.O_WRONLY, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # held by this test's process: a lock nobody cannot see
    where = lease.Folder(str(sticky), True, True)

    def work():
        found = lease.read(where, [0, 1])
        got, lost = lease.claim(where, [0, 1])
        return {"held": sorted(found.held), "unusable": sorted(found.unusable),
                "claimed": sorted(got.cpus), "lost": lost}

    try:
        assert _as_nobody(work) == {"ok": {"held": [], "unusable": [1], "claimed": [0], "lost": None}}
    finally:
        os.close(fd)
    st = (sticky / "cpu0.lock").stat()
    assert st.st_uid == 65534 and stat.S_IMODE(st.st_mode) == 0o644


def test_a_users_own_folder():
    """A user without /run/cpulaunch gets $XDG_RUNTIME_DIR/cpulaunch (mode 0700), else
    /tmp/cpulaunch-<uid>; one planted by another user is refused in one line."""
    if os.geteuid() != 0:
        pytest.skip("becomes nobody: needs root")
    if os.path.exists(lease.SHARED):
        pytest.skip(f"{lease.SHARED} exists: every user's jobs use it")
    parent = Path(tempfile.mkdtemp(prefix="cpulaunch-xdg-", dir="/tmp"))  # pytest's is root's alone
    parent.chmod(0o755)
    xdg = parent / "xdg"
    xdg.mkdir(mode=0o700)
    os.chown(xdg, 65534, 65534)
    mine = Path("/tmp/cpulaunch-65534")
    try:
        got = _as_nobody(lambda: lease.folder(None, {"XDG_RUNTIME_DIR": str(xdg)}, create=True))
        assert got == {"ok": [str(xdg / "cpulaunch"), False, True]}
        assert stat.S_IMODE((xdg / "cpulaunch").stat().st_mode) == 0o700
        got = _as_nobody(lambda: lease.folder(None, {}, create=True))
        assert got == {"ok": [str(mine), False, True]} and mine.stat().st_uid == 65534
        shutil.rmtree(mine)
        mine.mkdir()
        mine.chmod(0o755)  # planted by root: not nobody's
        got = _as_nobody(lambda: lease.folder(None, {}, create=True))
        assert got == {"error": f"--share-host: {mine} is not yours alone (owner uid 0, mode 0755); remove it, "
                                "or pass --lease-dir with a folder of your own"}
        mine.chmod(0o700)
        got = _as_nobody(lambda: lease.folder(None, {}, create=True))
        assert got == {"error": f"--share-host: {mine} cannot be opened (Permission denied); remove it, "
                                "or pass --lease-dir DIR"}
    finally:
        shutil.rmtree(mine, ignore_errors=True)
        shutil.rmtree(parent, ignore_errors=True)


def test_parse_proc_locks():
    text = ("1: FLOCK  ADVISORY  WRITE 4242 00:2a:1234 0 EOF\n"
            "1: -> FLOCK  ADVISORY  WRITE 4243 00:2a:1234 0 EOF\n"
            "2: POSIX  ADVISORY  WRITE 77 fd:01:99 0 EOF\n"
            "3: FLOCK  ADVISORY  READ 5 fd:01:x 0 EOF\n")
    assert lease.parse_proc_locks(text) == {(0, 42, 1234): 4242}
