"""Issues 22 and 34: --share-host, jobs that share a host never stack. Real processes
throughout: jobs started at once get disjoint CPUs; a job killed by SIGKILL frees its
cores; a second job fails naming the holder (a live process), or waits for it and wakes
as soon as any CPU it can use frees; --dry-run says who holds what; lease files are never
followed through links; another user can neither stall a job by locking its lease files
(any lock mode) nor be handed a CPU whose lease file or folder was removed while held;
three users (root and two made by the tests) share one lease space whatever their
environment, in a private mount namespace with fresh /run and /tmp.

No sleep wins a race here: each step waits, with a deadline, for a state it can see (a
file written by the program, a line on stderr, a process gone).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hostusers
from waiting import wait_for
from conftest import REPO
from test_launch_faults import NOBODY
from test_launch_faults import shared as sticky  # noqa: F401 - a fixture: a sticky /tmp folder, root and setpriv
from cpulaunch.machine import lease

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
ONE_CORE = ("--ninstances", "1", "--ncores-per-instance", "1")


class Job:
    """One ``cpulaunch --share-host`` run of HOLD (``n`` instances), with a FIFO per
    instance held open for writing by the test: closing it lets the instance end.
    ``user``: run as that user (through setpriv, with an interpreter it may run)."""

    def __init__(self, tmp: Path, name: str, leases: Path, *args: str, n: int = 1, mode: str = "fail",
                 user: str | None = None, program: tuple = ()):
        self.out = str(tmp / f"{name}-out")
        fifo = str(tmp / f"{name}-fifo")
        self.writers = []
        for i in range(n):
            os.mkfifo(fifo + str(i))
            os.chmod(fifo + str(i), 0o666)
            self.writers.append(os.open(fifo + str(i), os.O_RDWR | os.O_CLOEXEC))
        script = tmp / "hold.py"
        script.write_text(HOLD)
        python, extra = (sys.executable, {}) if user is None else hostusers.user_python(user)
        argv = [python, "-m", "cpulaunch", f"--share-host={mode}", "--lease-dir", str(leases),
                "--allocator", "default", "--bind", "affinity", *args,
                *(program or (python, str(script), self.out, fifo))]
        self.proc = subprocess.Popen(hostusers.as_user(user, argv), cwd=REPO, env={**os.environ, **extra},
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
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


@pytest.fixture(scope="module")
def users():
    why = hostusers.missing()
    if why:
        pytest.skip(why)
    made = hostusers.ensure_users()
    for user in made:
        if not hostusers.user_python(user)[0]:
            pytest.skip(f"no Python that {user} may run with cpulaunch importable")
    return made


def start(jobs, *a, **k) -> Job:
    job = Job(*a, **k)
    jobs.append(job)
    return job


def dry_run(leases: Path, *args: str, check: int = 0, user: str | None = None) -> subprocess.CompletedProcess:
    python, extra = (sys.executable, {}) if user is None else hostusers.user_python(user)
    proc = subprocess.run(hostusers.as_user(user, [python, "-m", "cpulaunch", "--share-host", "--lease-dir",
                                                   str(leases), "--dry-run", "--allocator", "default", *args, "true"]),
                          cwd=REPO, capture_output=True, text=True, timeout=60, env={**os.environ, **extra})
    assert proc.returncode == check, proc.stderr
    return proc


def lease_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith("lease-"))


def test_two_jobs_started_at_once_get_disjoint_cpus(tmp_path, leases, jobs):
    """Two single-core jobs, started back to back: each plans, claims, and on losing the
    race plans again; they end up on CPUs 0 and 1, and each program holds its lease
    (exec'd: /proc/locks names the program's own pid as the holder of its CPU's byte)."""
    a = start(jobs, tmp_path, "a", leases, *ONE_CORE)
    b = start(jobs, tmp_path, "b", leases, *ONE_CORE)
    ra, rb = a.report(), b.report()
    assert sorted(ra["cpus"] + rb["cpus"]) == [0, 1], (ra, rb)
    assert (ra["pid"], rb["pid"]) == (a.proc.pid, b.proc.pid)  # exec'd: no supervisor
    base = lease._key_of(str(leases)) << 44
    locks = lease.parse_proc_locks(Path("/proc/locks").read_text())
    for report in (ra, rb):
        cpu = report["cpus"][0]
        assert [pid for pid, _, start_, end in locks if start_ <= base + cpu <= (end or -1)] == [report["pid"]]
    assert len(lease_files(leases)) == 2
    # a third job finds nothing free and names both holders, in one line
    proc = dry_run(leases, *ONE_CORE, check=2)
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("cpulaunch: error: --share-host: CPUs ")
    for report in (ra, rb):
        assert f"pid {report['pid']} ({sys.executable} " in proc.stderr  # its command, cut at 80 characters
    assert proc.stderr.rstrip().endswith("wait for them with --share-host wait")
    a.release()
    b.release()


@pytest.mark.parametrize("verbose", [False, True])
def test_a_run_says_where_the_leases_are_with_v_only(leases, verbose):
    """Issue 40 (silent when all is well): where the leases are is cpulaunch's own choice,
    explained under -v; a plain --share-host run on a free machine prints nothing. The dry
    run keeps the note (test above)."""
    proc = subprocess.run([sys.executable, "-m", "cpulaunch", *(["-v"] if verbose else []), "--share-host",
                           "--lease-dir", str(leases), "--allocator", "default", "--bind", "affinity",
                           "--mem-policy", "none", "true"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "--share-host" in line]
    assert said == ([f"cpulaunch: note: --share-host: leases in {leases}"] if verbose else []), proc.stderr
    if not verbose:
        assert proc.stderr == ""


def test_dry_run_shows_who_holds_what_and_plans_on_the_rest(tmp_path, leases, jobs):
    a = start(jobs, tmp_path, "a", leases, *ONE_CORE)
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


def test_wait_wakes_for_any_cpu_it_can_use(tmp_path, leases, jobs):
    """Holders on CPU 0 and CPU 1, a waiter for one core: the holder of CPU 1 (not the
    lowest held CPU) ends, and the waiter runs on CPU 1 while CPU 0 is still held."""
    a = start(jobs, tmp_path, "a", leases, *ONE_CORE)
    b = start(jobs, tmp_path, "b", leases, *ONE_CORE)
    ra, rb = a.report(), b.report()
    low, high = (a, b) if ra["cpus"] == [0] else (b, a)
    w = start(jobs, tmp_path, "w", leases, *ONE_CORE, mode="wait")
    ready, _, _ = select.select([w.proc.stderr], [], [], 30)
    assert ready and "waiting for CPUs 0 held by" in w.proc.stderr.readline()
    high.release()
    assert w.report()["cpus"] == [1]
    assert low.proc.poll() is None  # CPU 0's holder still runs
    low.release()
    w.release()


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
    command = proc.stdout.split("\n# ")[0].replace(" \\\n  ", " ")  # the dry run's first command, one line
    assert command.endswith(" true") and "--share-host" in proc.stdout  # wait: its word
    proc = subprocess.run([sys.executable, "-m", "cpulaunch", "--dry-run", "--share-host", "maybe", "x"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    command = proc.stdout.split("\n# ")[0].replace(" \\\n  ", " ")
    assert command.endswith(" maybe x")  # any other word starts the program
    proc = subprocess.run([sys.executable, "-m", "cpulaunch", "--dry-run", "--share-host=never", "true"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr == (
        "cpulaunch: error: --share-host never: use fail (the default: say who holds the cores) or wait\n")
    assert not leases.exists()  # a dry run makes nothing


def test_bind_none_is_refused(leases):
    proc = dry_run(leases, "--bind", "none", check=2)
    assert proc.stderr == ("cpulaunch: error: --share-host claims the CPUs a job is bound to, and --bind none binds "
                           "it to none (it would run on every CPU); drop one of them\n")


def test_a_request_that_cannot_fit_its_own_cpus_fails_at_once(tmp_path, leases, jobs):
    """A job allowed CPU 0 only asks for 2 cores while another job holds CPU 1: in wait
    mode it fails at once (it could never fit), without waiting for or blaming the holder."""
    a = start(jobs, tmp_path, "a", leases, *ONE_CORE, "--core-list", "1")
    assert a.report()["cpus"] == [1]
    started = time.monotonic()
    proc = subprocess.run(["taskset", "-c", "0", sys.executable, "-m", "cpulaunch", "--share-host", "wait",
                           "--lease-dir", str(leases), "--allocator", "default", "--ncores-per-instance", "2",
                           "true"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--ncores-per-instance 2 needs 2 physical cores, but only 1 are usable" in proc.stderr and "held by" not in proc.stderr
    assert time.monotonic() - started < 30 and a.proc.poll() is None
    a.release()


def test_a_background_child_of_the_program_keeps_nothing(tmp_path, leases, jobs):
    """The exec'd program starts a child that outlives it (with the lease's descriptor,
    inherited): once the program has exited, the CPU is free and no dead pid is named
    (a POSIX lock belongs to the process that took it and is not inherited by fork)."""
    marker = tmp_path / "child"
    program = (sys.executable, "-c", "import os, subprocess, sys; "
               f"c = subprocess.Popen(['sleep', '600'], close_fds=False); open({str(marker)!r}, 'w').write(str(c.pid))")
    a = start(jobs, tmp_path, "a", leases, "--ninstances", "1", program=program)
    assert a.proc.wait(timeout=60) == 0
    child = int(wait_for(lambda: marker.exists() and marker.read_text(), "the child's pid"))
    try:
        assert Path(f"/proc/{child}").exists()
        proc = dry_run(leases, "--ninstances", "1")
        assert proc.stdout.startswith("# instance 0: cpus 0-1") and "held by" not in proc.stdout
    finally:
        os.kill(child, 9)


# --------------------------------------------------------------------------- links, locks and other users


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
    """nobody plants lease-* names as a link to a precious file and as a FIFO: a real run
    never opens the link's target, never blocks on the FIFO, and takes both CPUs."""
    precious = tmp_path / "precious"
    precious.write_text("keep")
    subprocess.run(NOBODY + ["ln", "-s", str(precious), str(sticky / "lease-1-aaaa")], check=True, timeout=20)
    subprocess.run(NOBODY + ["mkfifo", str(sticky / "lease-2-bbbb")], check=True, timeout=20)
    before = precious.stat()
    assert "held by" not in dry_run(sticky).stdout
    proc = subprocess.run([sys.executable, "-m", "cpulaunch", "--share-host", "--lease-dir", str(sticky),
                           "--ninstances", "1", "true"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    after = precious.stat()
    assert precious.read_text() == "keep" and (after.st_mtime_ns, after.st_atime_ns) == (before.st_mtime_ns,
                                                                                        before.st_atime_ns)
    assert (sticky / "lease-1-aaaa").is_symlink() and stat.S_ISFIFO((sticky / "lease-2-bbbb").lstat().st_mode)


LOCKER = """
import fcntl, os, struct, sys
path, mode, base = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    os.open(path, os.O_WRONLY)
    print("opened for writing", flush=True)
except PermissionError:
    pass
fd = os.open(path, os.O_RDONLY)
if mode == "flock-sh":
    fcntl.flock(fd, fcntl.LOCK_SH)
elif mode == "flock-ex":
    fcntl.flock(fd, fcntl.LOCK_EX)
else:  # read locks on every byte the job does not hold (before its window, CPU 1, the pending and waiting bytes)
    for start, length in ((0, base), (base + 1, 1), (base + 2**20, 2)):
        fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, start, length, 0))
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("mode", ["flock-sh", "flock-ex", "fcntl-read"])
def test_another_user_locking_a_lease_file_stalls_nobody(sticky, tmp_path, jobs, users, mode):
    """A job of root's holds CPU 0; user 1 opens its lease file (it cannot open it for
    writing) and locks it (flock shared or exclusive, or read locks on every byte the job
    does not hold) and keeps it. User 2's dry run still sees exactly CPU 0 held and plans on CPU 1; once the
    job ends, user 2's job gets both CPUs at once, the locks still held."""
    u1, u2 = users
    a = start(jobs, sticky, "a", sticky, *ONE_CORE, "--core-list", "0")
    assert a.report()["cpus"] == [0]
    (path,) = lease_files(sticky)
    python, extra = hostusers.user_python(u1)
    base = str(lease._key_of(str(sticky)) << 44)
    locker = subprocess.Popen(hostusers.as_user(u1, [python, "-c", LOCKER, str(path), mode, base]), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, **extra})
    try:
        assert locker.stdout.readline() == "locked\n"
        proc = dry_run(sticky, *ONE_CORE, user=u2)
        assert proc.stdout.startswith("# instance 0: cpus 1,") and f"CPUs 0 held by pid {a.proc.pid} " in proc.stdout
        a.release()
        b = start(jobs, sticky, "b", sticky, "--ninstances", "1", user=u2)
        assert b.report()["cpus"] == [0, 1]
        b.release()
    finally:
        locker.communicate("", timeout=30)


def test_three_users_start_at_once_and_never_share_a_cpu(sticky, users):
    """24 one-core jobs in wait mode, 8 each from root and the two users, started at once
    on a sticky lease folder: every job runs, and no two run on one CPU at the same time
    (each program writes the interval it ran in; the figures of 200 such starts are
    scripts/stress_share_host.py's)."""
    program = sticky / "interval.py"
    program.write_text("import json, os, sys, time\nt = time.time()\nend = t + 0.1\nwhile time.time() < end:\n"
                       "    pass\nwith open(sys.argv[1], 'w') as f:\n"
                       "    json.dump([sorted(os.sched_getaffinity(0)), t, time.time()], f)\n")
    procs = []
    for i in range(24):
        user = (None, *users)[i % 3]
        python, extra = (sys.executable, {}) if user is None else hostusers.user_python(user)
        argv = [python, "-m", "cpulaunch", "--share-host", "wait", "--lease-dir", str(sticky), "--allocator",
                "default", "--bind", "affinity", *ONE_CORE, python, str(program), str(sticky / f"run{i}.json")]
        procs.append(subprocess.Popen(hostusers.as_user(user, argv), cwd=REPO, env={**os.environ, **extra},
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    runs = [json.loads((sticky / f"run{i}.json").read_text()) for i in range(24)]
    for cpu in (0, 1):
        spans = sorted((t0, t1) for cpus, t0, t1 in runs if cpus == [cpu])
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
    assert sorted(len(cpus) for cpus, _, _ in runs) == [1] * 24


def test_a_removed_lease_file_still_holds_its_cpu(tmp_path, leases, jobs):
    """The lease file of a running job is removed (and a file planted at its name): the
    next job is not handed that CPU (the locks live on the inode; /proc/locks names them)."""
    a = start(jobs, tmp_path, "a", leases, *ONE_CORE, "--core-list", "0")
    assert a.report()["cpus"] == [0]
    (path,) = lease_files(leases)
    path.unlink()
    path.write_text("planted")
    proc = dry_run(leases, *ONE_CORE, "--core-list", "0", check=2)
    assert f"CPUs 0 held by pid {a.proc.pid} " in proc.stderr
    a.release()
    assert "held by" not in dry_run(leases, *ONE_CORE, "--core-list", "0").stdout


def _scenario(name: str, users) -> dict:
    proc = subprocess.run(hostusers.fresh([sys.executable, str(Path(__file__).parent / "share_scenario.py"),
                                           name, *users]), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_one_lease_space_for_every_user_and_environment(users):
    """In a fresh /run and /tmp (a private mount namespace: whatever the host's past):
    user 1's first job, before root ever ran, makes /tmp/cpulaunch-leases (1777) and takes
    CPU 0 with XDG_RUNTIME_DIR and HOME set; root's job makes /run/cpulaunch-leases (1777),
    sees CPU 0 held and takes CPU 1; user 2 sees both holders, with or without
    XDG_RUNTIME_DIR, with root's HOME as under sudo."""
    got = _scenario("folders_and_environments", users)
    u1 = hostusers.uid_of(users[0])
    assert got["u1"]["cpus"] == [0] and got["root"]["cpus"] == [1]
    assert got["after_u1"]["run"] is None and got["after_u1"]["tmp"] == ["0o1777", u1]
    assert got["after_u1"]["files"] == [f"lease-{got['u1']['pid']}-" + got["after_u1"]["files"][0].split("-")[2]]
    assert got["after_root"]["run"] == ["0o1777", 0] and len(got["after_root"]["files"]) == 1
    for name, view in got["views"].items():
        assert view["code"] == 2, (name, view)
        assert f"CPUs 0 held by pid {got['u1']['pid']} (" in view["stderr"], (name, view)
        assert f"CPUs 1 by pid {got['root']['pid']} (" in view["stderr"], (name, view)
    assert [e["code"] for e in got["ends"]] == [0, 0]


def test_a_planted_fallback_folder_traps_nobody(users):
    """User 2 makes /tmp/cpulaunch-leases first (0755, its own): user 1's job still runs,
    its lease file in a private folder (a note says where), and root and user 2 see it held
    through /proc/locks. The exec'd program leaves its folder; user 1's next job removes
    it (and leaves its own), and user 1's doctor removes that one (issue 39)."""
    got = _scenario("planted_fallback", users)
    assert got["u1"]["cpus"] == [0] and got["end"]["code"] == 0
    assert "this job's lease file is in /tmp/cpulaunch-lease-" in got["end"]["stderr"]
    for view in (got["root_view"], got["u2_view"]):
        assert view["code"] == 0 and f"CPUs 0 held by pid {got['u1']['pid']} (" in view["stdout"], view
    assert len(got["private"]) == 1
    assert got["end_again"]["code"] == 0 and len(got["private_again"]) == 1
    assert got["private_again"] != got["private"]
    assert got["private_after_doctor"] == [], got["doctor"]
    assert any("removed 1 private lease folder" in f["summary"] for f in got["doctor"]), got["doctor"]


def test_folders_removed_while_held_hand_out_nothing(users):
    """Root removes /run/cpulaunch-leases and /tmp/cpulaunch-leases while two users' jobs
    hold both CPUs, then user 2 plants a new /tmp/cpulaunch-leases: every view still names
    both holders; once they end, the CPUs are free."""
    got = _scenario("removed_while_held", users)
    assert sorted(got["a"]["cpus"] + got["b"]["cpus"]) == [0, 1]
    for view in (got["before"], got["gone"], got["planted"]):
        assert view["code"] == 2, view
        assert f"held by pid {got['a']['pid']} (" in view["stderr"] and f"by pid {got['b']['pid']} (" in view["stderr"]
    assert [e["code"] for e in got["ends"]] == [0, 0]
    assert got["after"]["code"] == 0 and "held by" not in got["after"]["stdout"]


def test_old_folders_are_read_and_no_folder_shadows_the_package(users):
    """A job of an older cpulaunch holding CPU 0 through /tmp/cpulaunch is seen; the folders
    a job makes now are not named ``cpulaunch``, so ``python -m cpulaunch`` started in /tmp
    imports the package (issue 39: a /tmp/cpulaunch folder was imported as a namespace)."""
    got = _scenario("old_folder_and_module", users)
    assert got["view"]["code"] == 0 and f"CPUs 0 held by pid {got['old_pid']} (" in got["view"]["stdout"], got["view"]
    assert got["made"] == ["cpulaunch-leases"] and got["end"]["code"] == 0
    assert got["version"]["code"] == 0, got["version"]


def test_full_file_systems_give_one_line_and_leave_nothing(users):
    """User 2 fills /run/cpulaunch-leases and /tmp (small tmpfs mounts, space and inodes):
    user 1's job fails with exit 2 and one line naming the folders and what to do, and
    leaves no folder behind (before: exit 70 and an empty cpulaunch-lease-* folder); with a
    few inodes free again but no space, the job runs (a lease file needs no bytes)."""
    got = _scenario("full_filesystems", users)
    full = got["full"]
    assert full["code"] == 2, got
    lines = full["stderr"].splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpulaunch: error: --share-host: "), full
    assert "/run/cpulaunch-leases: No space left on device" in lines[0] and "free some space" in lines[0], full
    assert full["litter"] == [], full
    assert got["space_only"]["cpus"] in ([0], [1]) and got["end"]["code"] == 0, got


def test_parse_proc_locks():
    text = ("1: POSIX  ADVISORY  WRITE 4242 00:2a:1234 5 7\n"
            "1: -> POSIX  ADVISORY  WRITE 4243 00:2a:1234 5 7\n"
            "2: FLOCK  ADVISORY  WRITE 77 fd:01:99 0 EOF\n"
            "3: POSIX  ADVISORY  READ 5 fd:01:9 0 EOF\n"
            "4: POSIX  ADVISORY  WRITE 6 fd:01:10 0 EOF\n"
            "5: OFDLCK ADVISORY  WRITE -1 fd:01:11 0 EOF\n")
    assert lease.parse_proc_locks(text) == [(4242, (0, 42, 1234), 5, 7), (6, (253, 1, 10), 0, None),
                                            (-1, (253, 1, 11), 0, None)]


def test_decode():
    base = 5 << 44
    cpus = list(range(8))
    assert lease.decode([(base + 2, base + 3, 9), (base + 2**20, base + 2**20, 9), (base + 2**21 + 77,) * 2 + (9,)],
                        5, cpus) == {"cpus": frozenset({2, 3}), "pending": True, "waiting": False, "ticket": 77,
                                     "pid": 9}
    assert lease.decode([(0, None, 9), (base - 1, base + 1, 9)], 5, cpus) is None  # not leases: whole-file, outside


def test_decode_cuts_ranges_to_the_machines_cpus():
    """A lock over 65,534 CPU bytes where no CPU exists (issue 39) decodes to the CPUs
    the machine has, at the cost of the machine's CPUs, not of the range."""
    base = 5 << 44
    got = lease.decode([(base + 2, base + 65535, 9)], 5, [0, 1, 2, 3, 8, 9])
    assert got["cpus"] == frozenset({2, 3, 8, 9})
    assert lease.decode([(base + 2, base + 65535, 9)], 5, [0, 1])["cpus"] == frozenset()
    t = time.perf_counter()
    for _ in range(2000):
        lease.decode([(base + 2, base + (1 << 20) - 1, 9)], 5, [0, 1])
    assert time.perf_counter() - t < 2.0  # 2,000 files of a 2**20-byte range: no set of that size is made


# --------------------------------------------------------------------------- issue 39: attacks by users who hold no CPU

ATTACKS = Path(__file__).parent / "share_attacks.py"
#: Peak memory of a victim's job start (MB, ru_maxrss of the child: cpulaunch, then its
#: program); the targets (2x of a quiet start, 100 MB) are scripts/attack_share_host.py's.
MEMORY_MB = 100


class Attacker:
    """``share_attacks.py KIND`` run as ``user`` on ``folder`` until :meth:`stop`."""

    def __init__(self, user: str, kind: str, folder: Path, *sizes: int):
        python, extra = hostusers.user_python(user)
        base = lease._key_of(str(folder)) << 44
        argv = [python, str(ATTACKS), kind, str(folder), str(base), *map(str, sizes)]
        self.proc = subprocess.Popen(hostusers.as_user(user, argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env={**os.environ, **extra})
        line = self.proc.stdout.readline()
        if line != "ready\n":
            self.proc.kill()
            raise AssertionError(f"the attacker did not start: {self.proc.communicate(timeout=60)}")

    def stop(self) -> str:
        out, err = self.proc.communicate("", timeout=60)
        assert self.proc.returncode == 0, err
        return out


#: Starts argv[1:] (stdout to /dev/null) with posix_spawn from this small interpreter and
#: prints its exit code, seconds and peak memory (MB, wait4's ru_maxrss) as JSON. A child
#: forked straight from pytest would report pytest's own size as its peak: Linux keeps the
#: forked copy's high-water mark across exec (a suite that imported torch: about 960 MB);
#: posix_spawn shares this small parent's memory until exec, so the figure is the job's.
MEASURE = """
import json, os, sys, time
t = time.monotonic()
pid = os.posix_spawnp(sys.argv[1], sys.argv[1:], os.environ,
                      file_actions=[(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)])
_, status, usage = os.wait4(pid, 0)
print(json.dumps({"code": os.waitstatus_to_exitcode(status), "seconds": time.monotonic() - t,
                  "mb": usage.ru_maxrss / 1024}))
"""


def victim(folder: Path, user: str | None, mode: str = "fail", *args: str) -> dict:
    """One ``--share-host`` job start of ``python -c pass`` on one core: its exit code,
    seconds, peak memory (MB, from wait4's rusage of the job, started by :data:`MEASURE`)
    and stderr."""
    import tempfile

    python, extra = (sys.executable, {}) if user is None else hostusers.user_python(user)
    argv = [python, "-m", "cpulaunch", f"--share-host={mode}", "--lease-dir", str(folder), "--allocator", "default",
            "--bind", "affinity", *ONE_CORE, *args, python, "-c", "pass"]
    with tempfile.TemporaryFile() as err:
        proc = subprocess.run([sys.executable, "-c", MEASURE, *hostusers.as_user(user, argv)], cwd=REPO,
                              env={**os.environ, **extra}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=err, text=True, timeout=600)
        err.seek(0)
        text = err.read().decode(errors="replace")
    assert proc.returncode == 0, (proc.stdout, text)
    return {**json.loads(proc.stdout), "stderr": text}


def quiet_start(folder: Path, user: str) -> float:
    """The better of two job starts with nobody else in ``folder`` (seconds)."""
    runs = [victim(folder, user) for _ in range(2)]
    assert [r["code"] for r in runs] == [0, 0], runs
    return min(r["seconds"] for r in runs)


def assert_unharmed(run: dict, quiet: float) -> None:
    """The victim ran, within its budget: twice its quiet time plus 3 s of headroom for a
    loaded 2-core machine (the 2x target itself is the script's), and 100 MB."""
    assert run["code"] == 0, run
    assert "Traceback" not in run["stderr"] and "internal error" not in run["stderr"], run
    assert run["mb"] < MEMORY_MB, run
    assert run["seconds"] < 2 * quiet + 3.0, (run, quiet)


@pytest.mark.parametrize("unlinked", [0, 1], ids=["files", "removed-files"])
def test_locks_beyond_every_cpu_cost_nothing(sticky, users, unlinked):
    """40 files of user 1's, each write-locked over the CPU bytes 2 .. 65535 where no CPU
    exists (before: 0.7 s and 503 MB per job start), kept or removed once locked (the
    locks outlive them): user 2's and root's jobs start in their usual time and memory,
    and plan on CPU 0, which nobody holds."""
    u1, u2 = users
    quiet = quiet_start(sticky, u2)
    attack = Attacker(u1, "ranges", sticky, 40, unlinked)
    try:
        for user in (u2, None):
            run = victim(sticky, user, "fail", "--core-list", "0")
            assert_unharmed(run, quiet)
        dry = dry_run(sticky, *ONE_CORE, user=u2)
        assert dry.stdout.startswith("# instance 0: cpus 0,") and "held by" not in dry.stdout, dry.stdout
    finally:
        attack.stop()


def test_thousands_of_locks_and_files_cost_little(sticky, users):
    """8 files of 4,096 locks each in the lease window (before: 4.1 s per job start) and
    2,000 lease files nobody holds: a job starts in its usual time and memory, and says
    that the folder held more files than a job reads."""
    u1, u2 = users
    quiet = quiet_start(sticky, u2)
    locks = Attacker(u1, "many", sticky, 8, 4096)
    files = Attacker(u1, "dead", sticky, 2000)
    try:
        run = victim(sticky, u2)
        assert_unharmed(run, quiet)
        dry = dry_run(sticky, *ONE_CORE, user=u2)
        assert f"--share-host: {sticky} holds more lease files than a job reads" in dry.stdout, dry.stdout
        assert "held by" not in dry.stdout
    finally:
        locks.stop()
        files.stop()


@pytest.mark.slow
def test_lock_flicker_fails_no_job(sticky, users):
    """Issue 39's attack: user 1 watches the folder with inotify and, whenever a lease
    file appears, write-locks CPUs 0-1023, the pending byte and the oldest ticket in a
    file of its own for 30 ms, with 1,500 more locks to slow every read (before: 5 of 5
    victims failed with "other jobs took the planned cores 100 times"). Three ``fail`` and
    two ``wait`` jobs of user 2's all run, each in its budget, while the attacker flicked."""
    u1, u2 = users
    quiet = quiet_start(sticky, u2)
    attack = Attacker(u1, "flicker", sticky, 1, 1500)
    try:
        runs = [victim(sticky, u2, mode) for mode in ("fail", "fail", "fail", "wait", "wait")]
    finally:
        flicks = attack.stop()
    for run in runs:
        assert_unharmed(run, quiet)
    assert int(flicks.split()[-1]) >= 5, flicks  # it did flick at every job


def test_two_spellings_of_one_folder_are_one_space(tmp_path, leases, jobs):
    """A bind mount makes a second spelling of the lease folder: a job through either
    sees the other's CPUs held (the space's key is the folder's device and inode)."""
    if os.geteuid() != 0:
        pytest.skip("bind-mounts a folder: needs root")
    a = start(jobs, tmp_path, "a", leases, *ONE_CORE, "--core-list", "0")
    assert a.report()["cpus"] == [0]
    alias = tmp_path / "alias"
    alias.mkdir(mode=0o700)
    subprocess.run(["mount", "--bind", str(leases), str(alias)], check=True)
    try:
        proc = dry_run(alias, *ONE_CORE, "--core-list", "0", check=2)
        assert f"CPUs 0 held by pid {a.proc.pid} " in proc.stderr
    finally:
        subprocess.run(["umount", str(alias)], check=True)
    a.release()


OFD_LOCKER = """
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, int(sys.argv[2]), 1, 0))
print("locked", flush=True)
sys.stdin.read()
"""


def test_an_ofd_lock_holder_is_named(sticky, users):
    """A process holding CPU 0 of the space with an OFD lock (whose pid the kernel's lock
    list shows as -1) is named by root, through /proc/PID/fdinfo; another user, who may not
    look at root's files, is told why it is not named."""
    base = lease._key_of(str(sticky)) << 44
    holder = subprocess.Popen([sys.executable, "-c", OFD_LOCKER, str(sticky / "lease-ofd"), str(base)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        proc = dry_run(sticky, *ONE_CORE, "--core-list", "0", check=2)
        assert f"CPUs 0 held by pid {holder.pid} ({sys.executable} -c " in proc.stderr, proc.stderr
        proc = dry_run(sticky, *ONE_CORE, "--core-list", "0", check=2, user=users[1])
        assert "CPUs 0 held by another process (an OFD lock or another PID namespace; " in proc.stderr, proc.stderr
        assert "root's view names it" in proc.stderr
    finally:
        holder.communicate("", timeout=30)


def test_root_with_a_users_home_writes_nothing_there(users):
    """Issue 39: root under ``sudo -E`` (a user's HOME) made ~USER/.cache root's and wrote
    through a link the user planted. Now root keeps its verdicts in its own cache (a note
    says so), leaves no file of its own in the user's home, writes nothing through the link;
    the user's own runs keep theirs at home (never through a link of theirs either) and the
    user's ``mkdir ~/.cache/pip`` works; root's ``doctor --clear-cache`` clears root's."""
    got = _scenario("sudo_home", users)
    home = f"/home/{users[0]}"
    assert got["root"]["folder"] == "/root/.cache/cpulaunch" and got["root"]["own"] is True, got["root"]
    assert got["root"]["wanted"] is False and f"the cache {home}/.cache/cpulaunch is not this user's" in \
        got["root"]["note"], got["root"]
    assert got["root_owned"] == [], got["root_owned"]
    assert got["root_link"]["wanted"] is False and got["through_link"] == [], got
    assert got["user"] == {"folder": f"{home}/.cache/cpulaunch", "note": "", "own": True, "wanted": True}, got["user"]
    assert got["pip"] == 0
    assert got["user_link"]["wanted"] is False and got["user_link"]["folder"] is None, got["user_link"]
    assert got["user_through_link"] == []
    assert got["clear"]["code"] == 0, got["clear"]
    cleared = json.loads(got["clear"]["stdout"])
    assert cleared["cache"] == "/root/.cache/cpulaunch" and len(cleared["removed"]) == 1, cleared
    assert got["root_cache_after"] == []


def test_doctor_names_a_flooded_lease_folder(users):
    """600 lease files of user 2's that nobody holds in /tmp/cpulaunch-leases (more than
    the 512 a job reads): user 1's doctor warns, naming the folder and user 2's uid and
    count; root's doctor removes them (issue 39)."""
    got = _scenario("flooded_folder", users)
    u2 = hostusers.uid_of(users[1])
    (warn,) = [f for f in got["u1"] if f["severity"] == "warn"]
    assert warn["summary"].startswith("/tmp/cpulaunch-leases holds 600 lease files, more than a --share-host job "
                                      f"reads (512): uid {u2}: 600"), warn
    assert any("removed 600 that nobody held" in f["summary"] for f in got["root"]), got["root"]
    assert got["left"] == 0


@pytest.mark.parametrize("how", ["read-only", "not-writable"])
def test_an_unwritable_lease_dir_is_one_line(sticky, users, how):
    """A --lease-dir on a read-only file system (a tmpfs mounted ro in a private mount
    namespace), or root's 0755 folder for a user: exit 2, one line naming the folder, why
    and what to do; no traceback, nothing made."""
    folder = sticky / "ro"
    folder.mkdir(mode=0o755)
    user = None if how == "read-only" else users[0]
    python, extra = (sys.executable, {}) if user is None else hostusers.user_python(user)
    argv = [python, "-m", "cpulaunch", "--share-host", "--lease-dir", str(folder), "--allocator", "default",
            *ONE_CORE, python, "-c", "pass"]
    if how == "read-only":
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                f'mount -t tmpfs -o ro,mode=0755 tmpfs "{folder}" && exec "$@"', "sh", *argv]
    proc = subprocess.run(hostusers.as_user(user, argv), cwd=REPO, env={**os.environ, **extra}, capture_output=True,
                          text=True, timeout=120)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    why = "Read-only file system); the file system is read-only: pass" if how == "read-only" else \
        "Permission denied); pass a --lease-dir you can write to"
    assert lines[0].startswith(f"cpulaunch: error: --share-host: {folder} takes no lease file ({folder}: ") \
        and why in lines[0], lines
    assert list(folder.iterdir()) == []
