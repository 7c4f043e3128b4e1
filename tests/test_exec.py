"""cpulaunch.machine.exec.which: the launcher's own program lookup answers as
shutil.which does on POSIX, on real files (kept off the run path: importing shutil cost
each run about 4 ms, issue 40)."""

import os
import shutil

import pytest

from cpulaunch.machine.exec import which


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
