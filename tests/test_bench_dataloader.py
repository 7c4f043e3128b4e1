"""scripts/bench_dataloader.py end to end, at its smoke settings (--quick: 1 round of 2 steps
of the small cnn per variant, one fixture dump): the three variants run for real and report
where their processes ran; on a machine too small for the comparison the script says so and
prints the plans of the fixture dump. The figures themselves mean nothing at this size."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("psutil")  # benchkit's load meter

from cpulaunch import cpulist  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_dataloader.py"

pytestmark = pytest.mark.slow  # three real training runs: about 15 s


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                    reason="needs 2 CPUs: (c) reserves one core for the DataLoader worker")
def test_smoke_run():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CPULAUNCH_") and k != "OMP_NUM_THREADS"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--plans", "always",
                           "--json"], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert (result["rounds"], result["steps"], result["warmup_steps"]) == (1, 2, 1)
    assert result["workers"] == 1
    a, b, c = result["variants"]
    assert [v["variant"] for v in (a, b, c)] == ["a", "b", "c"]
    for v in (a, b, c):
        assert v["runs"] == 1 and len(v["samples_per_s"]) == 1
        assert math.isfinite(v["samples_per_s_median"]) and v["samples_per_s_median"] > 0
        assert len(v["foreign_pct"]) == 1
    assert a["ratio_vs_a_median"] == 1.0
    assert b["ratio_vs_a_median"] == pytest.approx(
        b["samples_per_s_median"] / a["samples_per_s_median"])
    # (a) loads in the main process; (b)'s worker shares the rank's CPUs; (c)'s worker runs
    # on the reserved CPU, off the compute CPUs, as it reported from inside.
    shared = sorted(cpulist.parse(result["compute_cpus"]["shared"]))
    reserved = sorted(cpulist.parse(result["dataloader_cpus"]))
    assert a["loader_workers"] == [] and a["compute_cpus_seen"] == shared
    (wb,) = b["loader_workers"]
    assert wb["cpus"] == b["compute_cpus_seen"] == shared
    (wc,) = c["loader_workers"]
    assert wc["cpus"] == reserved and wc["threads"] == 1
    assert c["compute_cpus_seen"] == sorted(cpulist.parse(result["compute_cpus"]["reserved"]))
    assert not set(reserved) & set(c["compute_cpus_seen"])
    assert c["threads"] == len(c["compute_cpus_seen"])
    # Too small when (c) keeps less than 3/4 of the compute cores (1 of 2 here).
    assert result["too_small"] == (len(c["compute_cpus_seen"]) < 0.75 * len(shared))
    if len(shared) == 2:
        assert result["too_small"] is True
        assert "this machine is too small for a meaningful comparison" in proc.stdout
    # The fixture plans: the two-socket Xeon Silver 4108, one instance per socket, 2 cores
    # of each set aside (the last ones of the socket) with --dataloader-workers 2.
    (fixture,) = result["fixture_plans"]
    assert fixture["fixture"] == "hw-32intel64-2p8co2t+8ve"
    assert fixture["without"] == [
        {"index": 0, "cpus": "0-7", "omp_num_threads": "8", "dataloader_cpus": None,
         "mem_nodes": [0]},
        {"index": 1, "cpus": "8-15", "omp_num_threads": "8", "dataloader_cpus": None,
         "mem_nodes": [1]}]
    assert fixture["with"] == [
        {"index": 0, "cpus": "0-5", "omp_num_threads": "6", "dataloader_cpus": "6-7",
         "mem_nodes": [0]},
        {"index": 1, "cpus": "8-13", "omp_num_threads": "6", "dataloader_cpus": "14-15",
         "mem_nodes": [1]}]
    assert ("python -m cpulaunch --sysroot <hw-32intel64-2p8co2t+8ve unpacked> "
            "--dataloader-workers 2 --instances-per-socket --dry-run true") in proc.stdout
