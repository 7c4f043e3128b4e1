"""Ray Train workers bound by cpulaunch (issue 35, part 1).

- :func:`cpulaunch.runtime.ray_train.bind_local_worker` in a real process (no Ray needed):
  every thread it had is moved, torch's threads set, the node's plan the launcher's.
- examples/ray_train.py for real: a local Ray head, a TorchTrainer with 2 CPU workers on
  gloo; each worker binds itself: disjoint CPUs matching the node's plan, every thread of
  the worker on them, threads equal to the worker's cores, all_reduce right, the trained
  parameters equal on both. Marked slow (about 45 s here: Ray's start takes 10-20 s);
  skipped with one line where ray is not installed (scripts/test.sh installs it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

PY = sys.executable
TWO_CPUS = pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1")

#: A process with 3 threads started before it binds itself as worker 1 of 2.
BIND = """
import json, os, threading, torch
event = threading.Event()
for _ in range(3):
    threading.Thread(target=event.wait, daemon=True).start()
torch.set_num_threads(2)
from cpulaunch.runtime.ray_train import bind_local_worker
b = bind_local_worker(1, 2, ray_cpus=1.0)
cpus = set()
for tid in os.listdir("/proc/self/task"):
    status = open(f"/proc/self/task/{tid}/status").read()
    cpus |= {l.split(":")[1].strip() for l in status.splitlines() if l.startswith("Cpus_allowed_list")}
print(json.dumps({"cpus": list(b.cpus), "threads": b.threads, "torch_threads": torch.get_num_threads(),
                  "pinned": len(b.threads_pinned), "tasks": len(os.listdir("/proc/self/task")),
                  "thread_cpus": sorted(cpus), "node": {str(k): list(v) for k, v in b.node_cpus.items()},
                  "omp": os.environ.get("OMP_NUM_THREADS"), "rank_var": os.environ.get("RANK"), "notes": b.notes}))
event.set()
"""


@TWO_CPUS
def test_bind_local_worker_moves_every_thread():
    proc = subprocess.run([PY, "-c", BIND], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "RANK": "7", "LOCAL_RANK": "1", "WORLD_SIZE": "8"})
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["node"] == {"0": [0], "1": [1]} and got["cpus"] == [1]
    assert got["thread_cpus"] == ["1"] and got["pinned"] >= 4 and got["pinned"] <= got["tasks"]
    assert (got["threads"], got["torch_threads"], got["omp"]) == (1, 1, "1")
    assert got["rank_var"] == "7"  # the rendezvous variables stay the engine's (Ray's)


def test_bind_local_worker_refuses_ranks_out_of_range():
    from cpulaunch.runtime.ray_train import bind_local_worker

    with pytest.raises(ValueError, match="need 0 <= local_rank < local_world_size"):
        bind_local_worker(2, 2)


LINE = re.compile(r"^worker (\d+) affinity (\S+) threads (\d+) params ([0-9a-f]{64})$")


@pytest.mark.slow
@TWO_CPUS
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install 'ray[train]')")
def test_ray_torchtrainer_two_workers_bound(tmp_path):
    out = tmp_path / "workers.json"
    proc = subprocess.run([PY, "examples/ray_train.py", "--workers", "2", "--json", str(out)], capture_output=True,
                          text=True, timeout=600, cwd=REPO, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [LINE.match(line) for line in proc.stdout.splitlines() if line.startswith("worker ")]
    assert len(lines) == 2 and all(lines), proc.stdout
    assert [m.group(1) for m in lines] == ["0", "1"]
    assert {m.group(2) for m in lines} == {"0", "1"}  # disjoint, one CPU list for all of a worker's threads
    assert len({m.group(4) for m in lines}) == 1  # the trained parameters are equal
    records = json.loads(out.read_text())
    for r, m in zip(records, lines):
        assert r["plan_cpus"] == r["node_cpus"][str(r["local_rank"])] == r["affinity"]
        assert m.group(2) == ",".join(map(str, r["plan_cpus"]))
        assert int(m.group(3)) == r["threads"] == len(r["plan_cpus"]) and r["omp_num_threads"] == "1"
        assert r["allreduce"] == 3.0 and r["threads_pinned"] > 1
    assert records[0]["node_cpus"] == records[1]["node_cpus"] == {"0": [0], "1": [1]}
