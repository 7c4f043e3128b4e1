"""``--follow-cpuset`` on a live guest with cgroup v2 and 8 CPUs (issue 35, part 5).

Boots the 2s4c-snc2 guest (2 sockets x 4 cores, a NUMA node per 2 cores: tests/liveguest.py)
once and runs tests/live_follow.py in it: two ``cpulaunch --ninstances 2`` jobs, each in a
cgroup v2 cpuset of CPUs 0-7 (instances on 0-3 and 4-7, 4 threads each), one with
``--follow-cpuset``; both cpusets are written 0-3 at once. The followed job's instances end
on two halves (0-1 and 2-3), every thread; the other job's are left where the kernel put
them (both on 0-3: one pile); ``cpulaunch verify`` agrees with the followed job's new
binding, and its stderr and result.json say the change. Marked ``live`` (a boot under
emulation takes minutes; docs/dev/live-machines.md).
"""

from __future__ import annotations

import json

import liveguest as lg
import pytest

pytestmark = [pytest.mark.live, pytest.mark.skipif(lg.missing() is not None, reason=str(lg.missing()))]


@pytest.fixture(scope="module")
def followed(tmp_path_factory, request):
    expr = request.config.getoption("markexpr") or ""
    if "live" not in expr or "not live" in expr:  # as tests/test_live_machines.py: never in a plain run
        pytest.skip("live guests boot only under pytest -m live (minutes each: docs/dev/live-machines.md)")
    work = tmp_path_factory.mktemp("live-follow")
    out = work / "follow.json"
    step = {"id": "follow", "argv": [lg.PYTHON, "-S", str(lg.REPO / "tests" / "live_follow.py"), str(out)],
            "timeout": 1800}
    try:
        run = lg.boot(lg.MACHINES["2s4c-snc2"], lg.truth_steps() + [step], work, timeout=2400)
    finally:
        left = lg.kill_leftovers()
    assert not left, f"qemu processes left running and killed: {left}"
    record = run.step("follow")
    assert record["rc"] == 0, (record["stderr"][-3000:], run.console[-2000:])
    return run, json.loads(out.read_text())


def test_the_followed_job_takes_two_halves(followed):
    run, got = followed
    assert got["follow_before"] == got["nofollow_before"] == {"0": ["0-3"], "1": ["4-7"]}
    assert got["follow_after"] == {"0": ["0-1"], "1": ["2-3"]}
    assert got["repinned_after_s"] is not None and got["repinned_after_s"] < 1.0, got["repinned_after_s"]


def test_without_follow_the_kernel_piles_them_up(followed):
    run, got = followed
    after = got["nofollow_after"]
    assert after["1"] != ["4-7"] and set(after["0"]) & set(after["1"]), after


def test_verify_agrees_and_the_change_is_said(followed):
    run, got = followed
    assert got["verify_rc"] == 0, got["verify"]
    assert [i["status"] for i in got["verify"]["instances"]] == ["ok", "ok"]
    said = got["follow_stderr"]
    assert "--follow-cpuset: the CPUs this job may use changed from 0-7 to 0-3" in said
    assert "instance 0: CPUs 0-3 -> 0-1, instance 1: CPUs 4-7 -> 2-3" in said
    assert "instance 1: 4 OpenMP threads on 2 CPU(s) now (2-3)" in said
    (change,) = got["follow_result"]["follow_cpuset"]["changes"]
    assert (change["previous"], change["allowed"], change["how"]) == ("0-7", "0-3", "replanned")
    assert {i: v["bound_cpus"] for i, v in change["instances"].items()} == {"0": "0-1", "1": "2-3"}
    assert got["follow_rc"] == got["nofollow_rc"] == 0
