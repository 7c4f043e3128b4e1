"""``--follow-cpuset`` (issue 35, part 5): the CPUs a job may use change while it runs.

- :func:`cpulaunch.launch.follow.decide` on the fixture machines: plans again with the same
  options, keeps the count when the options would plan another, shares when nothing fits.
- For real on this machine: a cgroup v1 ``cpuset`` child (root makes one: tests/cgroups.py)
  shrunk from 0-1 to 0 and grown back while a two-instance job runs: each change said on
  stderr and kept in result.json, every thread of each instance (4 each) back on its own
  CPU within 1 s of the grow, ``cpulaunch verify`` agreeing after each change; and a grow
  beyond the first plan (a job started on CPU 0, its cpuset grown to 0-1), whose new CPU
  the kernel leaves unused without ``--follow-cpuset`` (the control, measured here).

Measured on this machine (Linux 6.18, cgroup v1) before writing it: on the shrink the
kernel moves every thread onto CPU 0; on the grow it gives each thread back the mask it
asked for last, so a thread re-pinned to CPU 0 while shrunk stays there, and a job
started on CPU 0 stays on CPU 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cgroups
from conftest import REPO

PY = sys.executable
XEON = "hw-32intel64-2p8co2t+8ve"

#: An instance: 3 threads besides the main one, all waiting, until the stop file appears.
PROGRAM = ("import os, sys, threading, time\n"
           "event = threading.Event()\n"
           "for _ in range(3): threading.Thread(target=event.wait, daemon=True).start()\n"
           "while not os.path.exists(sys.argv[1]): time.sleep(0.05)\n")


# --------------------------------------------------------------------------- the decision (pure)


def _prepared(sysroot, *args):
    from cpulaunch import cli, core, options
    from cpulaunch.options import Words

    ctx = cli.command.make_context("cpulaunch", [*args, "--sysroot", str(sysroot), "--allocator", "default",
                                                 "--dry-run", "true"])
    values = dict(ctx.params)
    given = frozenset(n for n in values if ctx.get_parameter_source(n).name not in ("DEFAULT",))
    opts = options.from_values(values, given, Words())
    return core, core.prepare(opts, {"PATH": os.environ["PATH"]})


def _decide(sysroot, allowed, *args):
    from cpulaunch.launch.follow import decide

    core, p = _prepared(sysroot, *args)
    topo = p.topo._replace(allowed=frozenset(allowed))

    def replan(count):
        opts = p.opts if count is None else core._with_count(p.opts, count)
        return core._prepare_plan(opts, topo, p.host, {"PATH": os.environ["PATH"]}).rendered

    return p, decide(p.topo.allowed, topo.allowed, p.rendered.instances, p.plan.num_instances, replan)


def test_two_instances_shrunk_to_one_socket_take_halves(sysroots):
    # the Xeon dump: 2 sockets of 8 cores (CPUs 0-7 and 8-15, siblings 16-31)
    p, d = _decide(sysroots[XEON], range(0, 8), "--ninstances", "2")
    assert [(r.before, r.bound_cpus) for r in d.repins] == [(tuple(range(8)), (0, 1, 2, 3)),
                                                           (tuple(range(8, 16)), (4, 5, 6, 7))]
    assert d.how == "replanned"
    assert d.messages == ("instance 0: 8 OpenMP threads on 4 CPU(s) now (0-3): a running OpenMP pool cannot "
                          "shrink, so they take turns; restart it to plan its threads anew",
                          "instance 1: 8 OpenMP threads on 4 CPU(s) now (4-7): a running OpenMP pool cannot "
                          "shrink, so they take turns; restart it to plan its threads anew")


def test_count_kept_when_the_options_plan_another(sysroots):
    # one instance per socket, one socket left: the options would plan 1, 2 run
    p, d = _decide(sysroots[XEON], range(8, 16), "--instances-per-socket")
    assert d.how == "kept-count" and [r.bound_cpus for r in d.repins] == [(8, 9, 10, 11), (12, 13, 14, 15)]
    assert d.messages[0] == ("the options plan 1 instance(s) on CPUs 8-15, 2 were planned at start: planned 2 "
                             "instance(s) there instead, so that each keeps its place")


def test_nothing_fits_so_every_instance_shares(sysroots):
    p, d = _decide(sysroots[XEON], {3}, "--ninstances", "2")
    assert d.how == "shared" and [r.bound_cpus for r in d.repins] == [(3,), (3,)]
    assert d.messages[0].startswith("cannot plan 2 instance(s) on CPUs 3 (--ninstances 2 needs 2 physical cores")
    assert d.messages[-1] == "instance 0, instance 1 share CPUs 3 (1) with 16 OpenMP threads in all: they take turns on them"


def test_ddp_ranks_keep_their_count(sysroots):
    p, d = _decide(sysroots[XEON], range(0, 4), "--ddp", "--nproc-per-node", "auto", "--master-port", "29555")
    assert p.plan.num_instances == 16
    assert d.how == "shared"  # 16 ranks cannot be planned on 4 cores; the world stays 16
    p, d = _decide(sysroots[XEON], range(0, 16), "--ddp", "--nproc-per-node", "2", "--master-port", "29555")
    assert d.how == "replanned" and [r.bound_cpus for r in d.repins] == [tuple(range(0, 8)), tuple(range(8, 16))]


# --------------------------------------------------------------------------- for real: a cgroup v1 cpuset

needs_cpuset = pytest.mark.skipif(cgroups.unavailable("cpuset") is not None or len(os.sched_getaffinity(0)) < 2
                                  or not {0, 1} <= os.sched_getaffinity(0),
                                  reason=str(cgroups.unavailable("cpuset") or "needs CPUs 0 and 1"))


def _cpus_of_threads(pid: int) -> dict:
    """{thread id: its allowed CPUs} of process ``pid`` (``Cpus_allowed_list``)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        line = next(v for v in text.splitlines() if v.startswith("Cpus_allowed_list:"))
        out[int(tid)] = line.split(":", 1)[1].strip()
    return out


def _instances(launcher: int, count: int, deadline: float) -> dict:
    """{instance index: pid} of the launcher's instances once each runs its 4 threads."""
    while time.monotonic() < deadline:
        found = {}
        for tid in os.listdir(f"/proc/{launcher}/task"):
            for child in Path(f"/proc/{launcher}/task/{tid}/children").read_text().split():
                try:
                    env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                index = [e.split(b"=", 1)[1] for e in env if e.startswith(b"CPULAUNCH_INSTANCE_INDEX=")]
                if index and len(_cpus_of_threads(int(child))) == 4:
                    found[int(index[0])] = int(child)
        if len(found) == count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"the launcher {launcher} did not run {count} instances of 4 threads")


def _wait_for(check, what: str, seconds: float) -> float:
    """Poll ``check()`` every 10 ms until true; return the seconds it took (fails after
    ``seconds``)."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < seconds, what
        time.sleep(0.01)
    return time.monotonic() - start


def _verify(*pids: int) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "cpulaunch", "verify", "--format", "json", *map(str, pids)],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


def _start(cpuset, tmp_path, *args):
    stop = tmp_path / "stop"
    err = open(tmp_path / "stderr.txt", "w")
    proc = subprocess.Popen([PY, "-m", "cpulaunch", *args, "--log-dir", str(tmp_path / "logs"), "--allocator",
                             "default", "python3", "-c", PROGRAM, str(stop)], preexec_fn=cgroups.enter(cpuset),
                            stdout=subprocess.DEVNULL, stderr=err, cwd=REPO, start_new_session=True)
    err.close()
    return proc, stop, tmp_path / "stderr.txt"


def _stop(proc, stop) -> None:
    stop.touch()
    try:
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


@needs_cpuset
def test_shrink_and_grow_under_a_two_instance_job(tmp_path):
    with cgroups.v1_child("cpuset", {"cpuset.cpus": "0-1", "cpuset.mems": "0"}) as cpuset:
        proc, stop, stderr = _start(cpuset, tmp_path, "--follow-cpuset", "--ninstances", "2")
        try:
            pids = _instances(proc.pid, 2, time.monotonic() + 60)
            assert {i: set(_cpus_of_threads(p).values()) for i, p in pids.items()} == {0: {"0"}, 1: {"1"}}
            assert _verify(*pids.values()).returncode == 0

            (cpuset / "cpuset.cpus").write_text("0")
            _wait_for(lambda: "changed from 0-1 to 0" in stderr.read_text(), "the shrink was not said", 1.0)
            assert {i: set(_cpus_of_threads(p).values()) for i, p in pids.items()} == {0: {"0"}, 1: {"0"}}
            shrunk = _verify(*pids.values())
            assert shrunk.returncode == 0, shrunk.stdout  # verify compares with the binding now

            (cpuset / "cpuset.cpus").write_text("0-1")
            took = _wait_for(lambda: {i: set(_cpus_of_threads(p).values()) for i, p in pids.items()}
                             == {0: {"0"}, 1: {"1"}}, "instances not back on their own CPUs", 1.0)
            assert took < 1.0
            report = json.loads(_verify(*pids.values()).stdout)
            assert [i["status"] for i in report["instances"]] == ["ok", "ok"]
        finally:
            _stop(proc, stop)
    assert proc.returncode == 0
    said = stderr.read_text()
    assert said.count("--follow-cpuset: the CPUs this job may use changed") == 2
    assert ("changed from 0 to 0-1 (cgroup cpuset " in said
            and "planned again with the same options; instance 0: CPUs 0 -> 0, instance 1: CPUs 0 -> 1; "
            "8 thread(s) re-pinned" in said)
    (result,) = (tmp_path / "logs").glob("*/result.json")
    changes = json.loads(result.read_text())["follow_cpuset"]["changes"]
    assert [(c["previous"], c["allowed"], c["how"]) for c in changes] == [("0-1", "0", "shared"),
                                                                       ("0", "0-1", "replanned")]
    assert [{i: v["bound_cpus"] for i, v in c["instances"].items()} for c in changes] == [
        {"0": "0", "1": "0"}, {"0": "0", "1": "1"}]
    assert all(c["threads_repinned"] == 8 and c["seconds"] < 1.0 for c in changes)


@needs_cpuset
@pytest.mark.parametrize("follow", [True, False])
def test_a_grow_beyond_the_first_plan(tmp_path, follow):
    """A one-instance job started on CPU 0: when its cpuset grows to 0-1, the kernel keeps
    the instance on CPU 0 (its own mask); --follow-cpuset plans again and gives it 0-1,
    noting that its OpenMP pool keeps its 1 thread."""
    with cgroups.v1_child("cpuset", {"cpuset.cpus": "0", "cpuset.mems": "0"}) as cpuset:
        proc, stop, stderr = _start(cpuset, tmp_path, *(["--follow-cpuset"] if follow else []), "--ninstances", "1",
                                    "--no-prefix")
        try:
            pids = _instances(proc.pid, 1, time.monotonic() + 60)
            (cpuset / "cpuset.cpus").write_text("0-1")
            if follow:
                _wait_for(lambda: set(_cpus_of_threads(pids[0]).values()) == {"0-1"}, "not grown", 1.0)
            else:
                time.sleep(1.0)  # the control: nothing re-pins it; a second is what follow gets
                assert set(_cpus_of_threads(pids[0]).values()) == {"0"}
        finally:
            _stop(proc, stop)
    assert proc.returncode == 0
    said = stderr.read_text()
    assert ("instance 0: 2 CPUs now (0-1), but its OpenMP pool keeps the 1 thread(s) it started with; restart it "
            "to use them all" in said) == follow


# --------------------------------------------------------------------------- the option's rules


@pytest.mark.parametrize("other, said", [
    (("--share-host",), "--share-host"),
    (("--sysroot", str(REPO)), f"--sysroot {REPO}"),
    (("--ddp", "--rdzv-endpoint", "127.0.0.1:29400"), "--rdzv-endpoint 127.0.0.1:29400"),
])
def test_follow_cpuset_refuses_what_it_cannot_follow(other, said):
    proc = subprocess.run([PY, "-m", "cpulaunch", "--follow-cpuset", *other, "--dry-run", "true"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.startswith(
        f"cpulaunch: error: --follow-cpuset cannot be combined with {said}: --follow-cpuset re-pins"), proc.stderr


def test_follow_cpuset_in_a_dry_run_is_noted_and_keeps_the_launcher():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a user's shell has none

    def dry(*args):
        proc = subprocess.run([PY, "-m", "cpulaunch", *args, "--dry-run", "--format", "json", "true"],
                              capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
        return json.loads(proc.stdout)

    doc = dry("--follow-cpuset")
    assert ("--follow-cpuset acts only when the program runs; --dry-run shows the commands such a run starts"
            in doc["notes"])
    # one instance is supervised (not exec'd) under --follow-cpuset, so its output is relayed
    assert doc["instances"][0]["env"]["PYTHONUNBUFFERED"] == "1"
    assert "PYTHONUNBUFFERED" not in dry()["instances"][0]["env"]  # exec'd: its output is its own
