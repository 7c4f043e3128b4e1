"""The Python API, in-process (no subprocess): plan_instances and bind_current_process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import cpulaunch
from cpulaunch.errors import CpulaunchError

XEON = "hw-32intel64-2p8co2t+8ve"


def test_plan_instances_on_a_dump_matches_the_cli(sysroots):
    r = cpulaunch.plan_instances(program=("python", "serve.py"), sysroot=str(sysroots[XEON]),
                                 instances_per_socket=2, allocator="default")
    assert [i.cpus for i in r.instances] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    assert [i.mem_nodes for i in r.instances] == [(0,), (0,), (1,), (1,)]
    assert r.instances[2].env["OMP_NUM_THREADS"] == "4"
    assert r.instances[2].argv[-2:] == ("python", "serve.py")


@pytest.mark.parametrize("bad", [dict(ninstance=2), dict(ninstances="x"), dict(dry_run=True)])
def test_plan_instances_refuses_unknown_or_mistyped_options(bad):
    with pytest.raises(CpulaunchError):
        cpulaunch.plan_instances(**bad)


def test_bind_current_process_in_a_child_interpreter():
    """bind_current_process narrows this process: run it in a fresh interpreter so the
    test process keeps its own affinity; no cpulaunch subprocess is involved."""
    code = (
        "import os, json, cpulaunch\n"
        "r = cpulaunch.plan_instances(ninstances=len(os.sched_getaffinity(0)), allocator='default')\n"
        "inst = r.instances[-1]\n"
        "b = cpulaunch.bind_current_process(inst)\n"
        "print(json.dumps({'aff': sorted(os.sched_getaffinity(0)), 'cpus': list(inst.bound_cpus),"
        " 'omp': os.environ['OMP_NUM_THREADS'], 'policy': b.mem_policy, 'notes': list(b.notes)}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    import json

    rec = json.loads(out.stdout)
    assert rec["aff"] == rec["cpus"] and len(rec["aff"]) == 1 and rec["omp"] == "1"
    assert rec["policy"] == "bind" and rec["notes"] == []  # set_mempolicy permitted here (root, numactl works)
