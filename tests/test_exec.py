"""cpulaunch.machine.exec.which: the launcher's own program lookup answers as
shutil.which does on POSIX, on real files (kept off the run path: importing shutil cost
each run about 4 ms, issue 40); and cpulaunch.machine.libfinder.glob_files, ld.so.conf's
include lines, answers as glob.glob does (glob and contextlib: about 2 ms)."""

import glob
import os
import shutil
import time

import pytest

from cpulaunch.machine.exec import which
from cpulaunch.machine.libfinder import glob_files


@pytest.fixture
def tree(tmp_path):
    """Two PATH folders: a/ holds an executable, a non-executable file, a folder with a
    program's name and a symlink to the executable; b/ holds a second executable of the
    same name and one of its own."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    for path, mode in [(a / "prog", 0o755), (a / "plain", 0o644), (b / "prog", 0o755),
                       (b / "plain", 0o755), (b / "only_b", 0o755)]:
        path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(mode)
    (a / "folder").mkdir()
    (a / "link").symlink_to(a / "prog")
    (a / "dangling").symlink_to(a / "missing")
    return tmp_path


NAMES = ["prog", "plain", "only_b", "folder", "link", "dangling", "missing", "sh"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("order", ["a:b", "b:a", "a:a:b", ":a", "a::b", "", ":", "/nonexistent:a"])
def test_which_equals_shutil_on_a_path(tree, monkeypatch, name, order):
    monkeypatch.chdir(tree / "a")
    path = ":".join(str(tree / part) if part and not part.startswith("/") else part for part in order.split(":"))
    assert which(name, path=path) == shutil.which(name, path=path)


@pytest.mark.parametrize("name", ["./prog", "./plain", "./folder", "./missing", "a/prog", "a/plain", "a/link"])
def test_which_checks_a_name_with_a_slash_as_it_is(tree, monkeypatch, name):
    monkeypatch.chdir(tree / ("a" if name.startswith("./") else "."))
    assert which(name, path="/nonexistent") == shutil.which(name, path="/nonexistent")
    assert which(name, path="/nonexistent") in (None, name)


def test_which_reads_the_environment_like_shutil(tree, monkeypatch):
    monkeypatch.setenv("PATH", f"{tree / 'b'}:{tree / 'a'}")
    assert which("prog") == shutil.which("prog") == str(tree / "b" / "prog")
    monkeypatch.setenv("PATH", "")
    assert which("sh") is None and shutil.which("sh") is None
    monkeypatch.delenv("PATH")
    assert which("sh") == shutil.which("sh")
    assert which("sh") is not None  # confstr(CS_PATH) holds /bin
    assert os.access(which("sh"), os.X_OK)


@pytest.fixture
def conf_tree(tmp_path):
    """ld.so.conf.d-like folders: plain, hidden and bracketed names, a folder, a dangling
    link, an empty folder."""
    d = tmp_path / "ld.so.conf.d"
    d.mkdir()
    for name in ["a.conf", "b.conf", "x86_64-linux-gnu.conf", ".hidden.conf", "c.conf.bak", "[x].conf", "z"]:
        (d / name).write_text("/usr/lib\n")
    (d / "sub.conf").mkdir()
    (d / "gone.conf").symlink_to(d / "missing")
    (tmp_path / "empty").mkdir()
    return tmp_path


PATTERNS = ["ld.so.conf.d/*.conf", "ld.so.conf.d/*", "ld.so.conf.d/.*", "ld.so.conf.d/?.conf", "ld.so.conf.d/[ab].conf",
            "ld.so.conf.d/[!a]*.conf", "ld.so.conf.d/[[]x].conf", "ld.so.conf.d/a.conf", "ld.so.conf.d/none.conf",
            "ld.so.conf.d/gone.conf", "ld.so.conf.d/", "missing/", "missing/*.conf", "empty/*", "ld.so.conf.d/**",
            "ld.*/*.conf", "*/a.conf", "*.conf", "ld.so.conf.d", "ld.so.conf.d/sub.conf/",
            # one star and no other wildcard (matched by head and tail), and their neighbours
            "ld.so.conf.d/x86*", "ld.so.conf.d/a*.conf", "ld.so.conf.d/*.conf.bak", "ld.so.conf.d/.*.conf",
            "ld.so.conf.d/*]", "ld.so.conf.d/*x].conf", "ld.so.conf.d/*conf*", "ld.so.conf.d/b.conf*",
            "ld.so.conf.d/*b.conf", "ld.so.conf.d/a.conf*a.conf"]


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("absolute", [True, False])
def test_glob_files_equals_glob(conf_tree, monkeypatch, pattern, absolute):
    monkeypatch.chdir(conf_tree)
    if absolute:
        pattern = os.path.join(str(conf_tree), pattern)
    assert sorted(glob_files(pattern)) == sorted(glob.glob(pattern))


def test_a_started_child_runs_on_while_the_caller_works(tmp_path):
    """start_quietly returns with the child running: it writes a file the caller then sees
    (before asking for the result); the result is run_quietly's."""
    from cpulaunch.machine.exec import run_quietly, start_quietly

    flag = tmp_path / "ran"
    started = start_quietly(["sh", "-c", f"echo out; echo err >&2; : > '{flag}'; exit 3"])
    deadline = time.monotonic() + 30
    while not flag.exists():  # an observable state, no fixed sleep
        assert time.monotonic() < deadline, "the child did not run"
        time.sleep(0.005)
    assert started.result() == (3, "out\nerr\n")
    assert run_quietly(["sh", "-c", "echo out; echo err >&2; exit 3"]) == (3, "out\nerr\n")
    with pytest.raises(ChildProcessError):
        os.waitpid(started.pid, os.WNOHANG)  # reaped


def test_gather_reaps_numactls_check_when_another_fact_fails(tmp_path, monkeypatch):
    """The numactl check runs while gather reads the other facts; when one of them fails
    (a malformed engine variable), the check's child is still reaped before the error
    goes up."""
    from cpulaunch.errors import DistributedError
    from cpulaunch.machine import host, probe
    from cpulaunch.machine.numactl import MemPolicy

    fake = tmp_path / "numactl"
    fake.write_text(f"#!/bin/sh\necho $$ > '{tmp_path / 'checked'}'\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    topo = probe.probe("/")
    query = host.HostQuery(sysroot="/", numactl=True, numactl_policy=MemPolicy.BIND)
    got = host.gather(query, topo, {"PATH": os.environ["PATH"]})
    assert got.numactl == str(fake) and got.numactl_usable is True and (tmp_path / "checked").exists()
    (tmp_path / "checked").unlink()
    with pytest.raises(DistributedError, match="PALS_RANKID=-1"):
        host.gather(query, topo, {"PATH": os.environ["PATH"], "PALS_RANKID": "-1"})
    pid = int((tmp_path / "checked").read_text())  # the check ran, and was waited for:
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_start_gather_returns_while_numactls_check_runs(tmp_path, monkeypatch):
    """start_gather returns with numactl's check still running (the run path imports its
    last modules meanwhile); Gathering.host() waits for its verdict. The fake numactl
    blocks on a FIFO until the test writes to it (and gives up, failing, after 20 s)."""
    from cpulaunch.machine import host, probe
    from cpulaunch.machine.numactl import MemPolicy

    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    fake = tmp_path / "numactl"
    fake.write_text(f"#!/bin/sh\nexec timeout 20 sh -c 'read x < \"{fifo}\"'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    query = host.HostQuery(sysroot="/", numactl=True, numactl_policy=MemPolicy.BIND)
    started = time.monotonic()
    gathering = host.start_gather(query, probe.probe("/"), {"PATH": os.environ["PATH"]})
    assert time.monotonic() - started < 10  # it did not wait for the check
    with open(fifo, "w") as go:  # opens once the check reads; releases it
        go.write("go\n")
    got = gathering.host()
    assert (got.numactl, got.numactl_usable, got.numactl_reason) == (str(fake), True, "")
    assert gathering.host() is got  # waited once
