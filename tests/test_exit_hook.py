"""Issue 34 part 2: cpulaunch's site hook runs once per interpreter whatever PYTHONPATH
holds: two hook folders (this install's and another's), a linked spelling of one, an
outer cpulaunch's in a nested launch. Real interpreters started with those PYTHONPATHs:
the hook installs one exit handler, the real sitecustomize still runs once, nothing
recurses; through a link the hook still finds exithook.py beside its real file; the
launcher puts its own folder first and drops the others, and the plan says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from cpulaunch import distributed

HOOK = REPO / "cpulaunch" / "runtime" / "sitehook"
#: What each interpreter reports: the exit hook's file, how many atexit handlers exist,
#: whether the hook marked itself, and which sitecustomize `import sitecustomize` gives.
REPORT = ("import atexit, json, sys, sitecustomize; "
          "m = sys.modules.get('_cpulaunch_exithook'); "
          "print(json.dumps({'exithook': m and m.__file__, 'handlers': atexit._ncallbacks(), "
          "'marked': '_cpulaunch_sitehook' in sys.modules, 'sitecustomize': sitecustomize.__file__}))")


@pytest.fixture
def folders(tmp_path):
    """Another install's runtime (a copy of this one's hook folder and exithook.py), a link to this hook
    folder, and the user's own sitecustomize, which says each time it runs."""
    other = tmp_path / "other" / "cpulaunch" / "runtime"
    shutil.copytree(HOOK, other / "sitehook", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(HOOK.parent / "exithook.py", other / "exithook.py")
    link = tmp_path / "hooklink"
    link.symlink_to(HOOK)
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import sys\nsys.stderr.write('users sitecustomize ran\\n')\n")
    return {"other": other / "sitehook", "link": link, "user": user}


def report(pythonpath: list) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    proc = subprocess.run([sys.executable, "-c", REPORT], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def baseline_handlers(user: Path) -> int:
    return report([user])[0]["handlers"]


@pytest.mark.parametrize("order", [
    ("hook", "other", "user"), ("other", "hook", "user"), ("link", "hook", "user"), ("hook", "link", "other", "user"),
])
def test_two_hook_folders_and_a_link_run_the_hook_once(folders, order):
    paths = {"hook": HOOK, **folders}
    got, err = report([paths[name] for name in order])
    first = paths[order[0]]
    assert got["exithook"] == str(Path(os.path.realpath(first)).parent / "exithook.py")
    assert got["handlers"] == baseline_handlers(folders["user"]) + 1  # one exit handler, not one per hook
    assert got["marked"] and got["sitecustomize"] == str(folders["user"] / "sitecustomize.py")
    assert err.count("users sitecustomize ran") == 1 and "RecursionError" not in err, err


def test_through_a_link_the_hook_finds_its_exithook_by_its_real_path(folders):
    got, err = report([folders["link"], folders["user"]])
    assert got["exithook"] == str(HOOK.parent / "exithook.py") and "not installed" not in err, err


def test_one_handler_when_the_program_also_installs_cpulaunchs_own_copy(folders):
    """init_process_group installs cpulaunch.runtime.exithook (another module object): with
    the site hook's copy installed already, it adds no second handler."""
    code = ("import atexit, sys; n = atexit._ncallbacks(); from cpulaunch.runtime import exithook; "
            "print(exithook.install(), atexit._ncallbacks() - n)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HOOK), str(REPO)])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["False", "0"], proc.stderr


def test_the_launcher_drops_other_hook_folders_and_says_the_hook_is_on(folders, sysroots):
    user = f"/src{os.pathsep}{folders['other']}{os.pathsep}{HOOK}{os.pathsep}/lib"
    proc = run_cli("--sysroot", str(next(iter(sysroots.values()))), "--ddp", "--nproc-per-node", "2",
                   "--master-port", "29997", "--dry-run", "--format", "json", "--allocator", "default",
                   "python", "x.py", env={"PYTHONPATH": user})
    doc = json.loads(proc.stdout)
    assert {i["env"]["PYTHONPATH"] for i in doc["instances"]} == {os.pathsep.join([str(HOOK), "/src", "/lib"])}
    assert [n for n in doc["notes"] if n.startswith("exit hook")] == [
        f"exit hook installed: each rank's Python ends its default process group at exit (sitecustomize in {HOOK}, "
        f"first on PYTHONPATH; other cpulaunch hook folders dropped from it: {folders['other']}); "
        "--no-exit-hook turns it off"]
    text = run_cli("--ddp", "--nproc-per-node", "1", "--dry-run", "python", "x.py").stdout
    assert f"# note: exit hook installed: " in text and text.rstrip().count("--no-exit-hook turns it off") == 1
    off = run_cli("--ddp", "--nproc-per-node", "1", "--no-exit-hook", "--dry-run", "python", "x.py").stdout
    assert "exit hook" not in off


def test_a_rank_of_a_nested_launch_runs_the_hook_once(folders):
    """A real one-rank run whose launcher inherited an outer launch's hook folder and
    another install's on PYTHONPATH: the rank installs one handler, runs the user's
    sitecustomize once (and cpulaunch's own interpreter once: the user's PYTHONPATH)."""
    user = os.pathsep.join([str(folders["other"]), str(HOOK), str(folders["user"])])
    proc = run_cli("--ddp", "--nproc-per-node", "1", "--backend", "gloo", "--allocator", "default", "python", "-c",
                   REPORT, env={"PYTHONPATH": user}, check_rc=None)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1].split("] ", 1)[-1])
    assert got["exithook"] == str(HOOK.parent / "exithook.py") and got["marked"]
    assert got["handlers"] == baseline_handlers(folders["user"]) + 1
    assert proc.stderr.count("users sitecustomize ran") == 2 and "RecursionError" not in proc.stderr


def test_is_hook_folder():
    tail = os.path.join("cpulaunch", "runtime", "sitehook")
    assert distributed.is_hook_folder(str(HOOK)) and distributed.is_hook_folder(f"/x/site-packages/{tail}/")
    assert not distributed.is_hook_folder("/src") and not distributed.is_hook_folder("")
    assert not distributed.is_hook_folder(f"/x/{tail}-old")
