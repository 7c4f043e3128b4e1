"""A real CPU quota under cpulaunch (issue 35, part 4): a cgroup v1 ``cpu`` child of this
machine with ``cpu.cfs_quota_us`` = ``cpu.cfs_period_us`` (1 CPU) on its 2 cores.

``--ddp --nproc-per-node auto`` and ``--ddp``'s default plan no more ranks than the quota
runs at once, with a note naming it; an explicit count (``--nproc-per-node 2``,
``--ninstances 2``) plans as asked, with a note. Skipped (one line) without root or
without a v1 ``cpu`` hierarchy; CI runs as root on the same machine type.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import cgroups
from conftest import REPO

PY = sys.executable

pytestmark = pytest.mark.skipif(cgroups.unavailable("cpu") is not None, reason=str(cgroups.unavailable("cpu")))


def plan_in(cgroup, *args: str, env: dict | None = None) -> dict:
    """``cpulaunch ARGS --dry-run --format json python x.py`` started inside ``cgroup``."""
    proc = subprocess.run([PY, "-m", "cpulaunch", *args, "--dry-run", "--format", "json", "--allocator", "default",
                           "python", "x.py"], preexec_fn=cgroups.enter(cgroup), capture_output=True, text=True,
                          timeout=60, cwd=REPO, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def one_cpu_quota():
    with cgroups.v1_child("cpu", {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}) as path:
        yield path


@pytest.mark.skipif(len(os.sched_getaffinity(0)) != 2, reason="written for this machine's 2 cores")
def test_auto_and_default_plan_one_rank_under_a_quota_of_one_cpu(one_cpu_quota):
    where = f"cgroup {one_cpu_quota}"
    doc = plan_in(one_cpu_quota, "--ddp", "--nproc-per-node", "auto")
    assert doc["topology"]["quota_cpus"] == 1.0
    assert [(i["cpulist"], i["env"]["WORLD_SIZE"], i["env"]["OMP_NUM_THREADS"]) for i in doc["instances"]] == \
        [("0-1", "1", "1")]
    assert (f"--nproc-per-node auto: 1 rank(s), as many as a CPU quota of 1 CPU ({where}) runs at once (2 by the "
            "cores: one per usable core (2 cores, CPUs 0-1 allowed by the affinity mask of this process))") \
        in doc["notes"]
    # without the quota, auto plans one rank per core here
    outside = subprocess.run([PY, "-m", "cpulaunch", "--ddp", "--nproc-per-node", "auto", "--dry-run", "--format",
                              "json", "python", "x.py"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert [i["cpulist"] for i in json.loads(outside.stdout)["instances"]] == ["0", "1"]
    # Kubeflow's way of saying the same (PET_NPROC_PER_NODE=auto), named in its words
    doc = plan_in(one_cpu_quota, "--ddp", env={"PET_NPROC_PER_NODE": "auto"})
    assert len(doc["instances"]) == 1 and any(n.startswith("PET_NPROC_PER_NODE=auto: 1 rank(s), as many as a CPU "
                                                            "quota of 1 CPU") for n in doc["notes"])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) != 2, reason="written for this machine's 2 cores")
@pytest.mark.parametrize("args, said", [
    (("--ddp", "--nproc-per-node", "2"), "--nproc-per-node 2"),
    (("--ninstances", "2"), "--ninstances 2"),
])
def test_explicit_counts_above_the_quota_plan_as_asked_with_a_note(one_cpu_quota, args, said):
    doc = plan_in(one_cpu_quota, *args)
    assert [(i["cpulist"], i["env"]["OMP_NUM_THREADS"]) for i in doc["instances"]] == [("0", "1"), ("1", "1")]
    assert (f"{said}: 2 instances under a CPU quota of 1 CPU (cgroup {one_cpu_quota}), which runs 1 at a time: "
            "they take turns on its CPU time; planned as asked (fewer instances fit the quota)") in doc["notes"]


def test_a_quota_of_one_and_a_half_runs_one_rank_by_default(tmp_path):
    with cgroups.v1_child("cpu", {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "150000"}) as path:
        doc = plan_in(path, "--ddp", "--nproc-per-node", "auto")
        assert len(doc["instances"]) == 1 and doc["topology"]["quota_cpus"] == 1.5
