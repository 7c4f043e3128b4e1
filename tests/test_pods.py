"""Kubernetes pods whose command is ``cpulaunch --ddp python train.py`` (issue 35, part 2).

A pod gets its place in the job from the controller that made it, as variables; cpulaunch
reads them as the defaults of its ``--ddp`` options (:func:`cpulaunch.machine.engines.pod_defaults`).
The environments below are what each controller sets, read from its sources:

- Kubeflow Trainer v2.3.0 (TrainJob), ``pkg/runtime/framework/plugins/torch/torch.go``
  (``EnforceMLPolicy``) and ``pkg/constants/constants.go``: PET_NNODES = numNodes;
  PET_NPROC_PER_NODE = numProcPerNode, or without a GPU the pod's CPU request (else its
  limit), at least 1; PET_NODE_RANK = the Job's completion index; PET_MASTER_ADDR =
  ``<trainjob>-node-0-0.<trainjob>``; PET_MASTER_PORT = 29500 (``ContainerTrainerPort``).
  The Job controller adds JOB_COMPLETION_INDEX to the pods of an Indexed Job.
- Kubeflow training operator v1.9.0 (PyTorchJob), ``pkg/controller.v1/pytorch/envvar.go``
  (``setPodEnv``) and ``master.go``: PYTHONUNBUFFERED=1; MASTER_PORT and PET_MASTER_PORT =
  the master container's ``pytorchjob-port`` (default 23456); MASTER_ADDR and
  PET_MASTER_ADDR = ``<job>-master-0``; WORLD_SIZE = replicas x nprocPerNode (1 when not a
  number); RANK = the replica index (+1 for workers); PET_NODE_RANK = RANK;
  PET_NPROC_PER_NODE = nprocPerNode (default "auto", ``pytorch_defaults.go``); PET_NNODES =
  replicas.
- the training operator v1.6.0 and before: PYTHONUNBUFFERED=0, MASTER_PORT, MASTER_ADDR,
  WORLD_SIZE = replicas, RANK; no PET_* variable.

The emulated pods are processes on this machine with exactly those variables (on top of
a clean environment), the master address 127.0.0.1 for the Service's DNS name and a port
free here for the controller's fixed one, each pinned to its own CPU as the static CPU
manager gives a pod exclusive CPUs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from conftest import REPO, json_records, run_cli
from engines import clean_env

PY = sys.executable
ALLREDUCE = str(REPO / "tests" / "ddp_allreduce.py")
XEON = "hw-32intel64-2p8co2t+8ve"


def trainjob_env(index: int, *, nodes: int = 2, nproc: str = "1", addr: str = "job-node-0-0.job",
                 port: int = 29500) -> dict:
    """A TrainJob pod's variables (Kubeflow Trainer v2.3.0), ``nproc`` as the torch plugin
    computes it (a CPU-only pod with ``cpu: 1``: "1")."""
    return {"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": nproc, "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": addr, "PET_MASTER_PORT": str(port), "JOB_COMPLETION_INDEX": str(index)}


def pytorchjob_env(rank: int, *, replicas: int = 2, nproc: str = "auto", addr: str = "job-master-0",
                   port: int = 23456) -> dict:
    """A PyTorchJob pod's variables (training operator v1.9.0): rank 0 the Master, the others
    Workers."""
    per_node = int(nproc) if nproc.isdigit() else 1
    return {"PYTHONUNBUFFERED": "1", "MASTER_PORT": str(port), "PET_MASTER_PORT": str(port),
            "MASTER_ADDR": addr, "PET_MASTER_ADDR": addr, "WORLD_SIZE": str(replicas * per_node),
            "RANK": str(rank), "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": nproc,
            "PET_NNODES": str(replicas)}


def old_pytorchjob_env(rank: int, *, replicas: int = 2, addr: str = "job-master-0", port: int = 23456) -> dict:
    """A PyTorchJob pod's variables (training operator v1.6.0 and before)."""
    return {"PYTHONUNBUFFERED": "0", "MASTER_PORT": str(port), "MASTER_ADDR": addr,
            "WORLD_SIZE": str(replicas), "RANK": str(rank)}


def dry_run(sysroot, pod: dict, *args: str) -> dict:
    proc = subprocess.run([PY, "-m", "cpulaunch", "--sysroot", str(sysroot), "--ddp", "--dry-run", "--format",
                           "json", "--allocator", "default", *args, "python", "train.py"],
                          env=clean_env(pod), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def identities(doc: dict) -> list:
    return [(i["cpulist"], i["env"]["RANK"], i["env"]["LOCAL_RANK"], i["env"]["WORLD_SIZE"],
             i["env"]["NODE_RANK"], i["env"]["MASTER_ADDR"], i["env"]["MASTER_PORT"]) for i in doc["instances"]]


# --------------------------------------------------------------------------- plans


def test_trainjob_pod_plans_its_node(sysroots):
    doc = dry_run(sysroots[XEON], trainjob_env(1, nproc="2"))
    assert identities(doc) == [("0-7", "2", "0", "4", "1", "job-node-0-0.job", "29500"),
                               ("8-15", "3", "1", "4", "1", "job-node-0-0.job", "29500")]
    assert (doc["ddp"]["nnodes"], doc["ddp"]["node_rank"], doc["ddp"]["nproc_per_node"]) == ("2", 1, 2)


def test_pytorchjob_pod_plans_its_node_with_auto(sysroots):
    # nprocPerNode "auto" (the operator's default): one rank per usable core, as torchrun's
    # auto on a CPU pod; 16 cores on this dump, so pod 1 holds ranks 16-31 of 32.
    doc = dry_run(sysroots[XEON], pytorchjob_env(1))
    ids = identities(doc)
    assert len(ids) == 16 and ids[0][:5] == ("0", "16", "0", "32", "1") and ids[-1][:5] == ("15", "31", "15", "32", "1")
    assert {i[5:] for i in ids} == {("job-master-0", "23456")}
    assert any(n.startswith("PET_NPROC_PER_NODE=auto: 16 rank(s), one per usable core") for n in doc["notes"])


def test_old_pytorchjob_pod_counts_pods(sysroots):
    """RANK/WORLD_SIZE without LOCAL_RANK and without PET_*: the pod is node RANK of
    WORLD_SIZE; cpulaunch starts its ranks (one per socket by default) and renumbers them."""
    doc = dry_run(sysroots[XEON], old_pytorchjob_env(1))
    assert identities(doc) == [("0-7", "2", "0", "4", "1", "job-master-0", "23456"),
                               ("8-15", "3", "1", "4", "1", "job-master-0", "23456")]
    assert any("RANK=1 WORLD_SIZE=2 without LOCAL_RANK (a PyTorchJob pod's variables" in n for n in doc["notes"])


def test_precedence_flag_then_cpulaunch_variable_then_pet_then_config(sysroots, tmp_path):
    pod = trainjob_env(1, nproc="2", port=29600)
    doc = dry_run(sysroots[XEON], {**pod, "CPULAUNCH_NPROC_PER_NODE": "1"}, "--master-port", "29700")
    assert identities(doc) == [("0-15", "1", "0", "2", "1", "job-node-0-0.job", "29700")]
    config = tmp_path / "c.toml"
    config.write_text('nproc-per-node = "1"\nnnodes = "3"\n')
    doc = dry_run(sysroots[XEON], pod, "--config", str(config))
    assert [i[1:5] for i in identities(doc)] == [("2", "0", "4", "1"), ("3", "1", "4", "1")]  # PET_ beat the file


def test_pet_variables_without_ddp_are_noted_not_read(sysroots):
    proc = subprocess.run([PY, "-m", "cpulaunch", "--sysroot", str(sysroots[XEON]), "--dry-run", "--format", "json",
                           "python", "x.py"], env=clean_env(trainjob_env(1)), capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    doc = json.loads(proc.stdout)
    assert len(doc["instances"]) == 1 and "RANK" not in doc["instances"][0]["env"]
    assert ("PET_NPROC_PER_NODE, PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT (torchrun's options, "
            "as Kubeflow sets them in a pod) are read with --ddp only") in doc["notes"]


@pytest.mark.parametrize("pod, message", [
    ({**trainjob_env(0), "PET_NNODES": "two"},
     "PET_NNODES=two: expected a number of machines (e.g. 2), or MIN:MAX with --rdzv-endpoint HOST:PORT"),
    ({**trainjob_env(0), "PET_NODE_RANK": "-1"}, "PET_NODE_RANK=-1: expected a whole number; fix or unset it"),
    ({**trainjob_env(0), "PET_NODE_RANK": "2"}, "PET_NODE_RANK=2: must be between 0 and PET_NNODES=2 - 1"),
    ({**trainjob_env(0), "PET_MASTER_PORT": "99999"}, "PET_MASTER_PORT=99999: must be 1-65535"),
    ({**trainjob_env(0), "PET_NPROC_PER_NODE": "gpu"}, "PET_NPROC_PER_NODE=gpu: use a positive number, 'auto', "
                                                       "'socket' or 'node'"),
    ({**trainjob_env(0), "PET_STANDALONE": "yes"}, "PET_STANDALONE=yes: expected 0 or 1"),
    (old_pytorchjob_env(0) | {"RANK": "x"}, "RANK=x: expected a whole number 0 or more; fix or unset it"),
    (old_pytorchjob_env(0) | {"RANK": "2"}, "a PyTorchJob pod: RANK=2 is not below WORLD_SIZE=2"),
])
def test_malformed_pod_variable_is_one_line_naming_it(sysroots, pod, message):
    proc = subprocess.run([PY, "-m", "cpulaunch", "--sysroot", str(sysroots[XEON]), "--ddp", "--dry-run",
                           "python", "x.py"], env=clean_env(pod), capture_output=True, text=True, timeout=60,
                          cwd=REPO)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"cpulaunch: error: {message}") and proc.stderr.count("\n") == 1, proc.stderr


# --------------------------------------------------------------------------- two pods on loopback


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pods(pods: list, *, timeout: float = 300) -> list:
    """Start one ``cpulaunch --ddp python ddp_allreduce.py`` per pod environment, pod i
    pinned to CPU i (its exclusive cpuset), all at once; return their ddp_allreduce records."""
    def pin(cpu):
        return lambda: os.sched_setaffinity(0, {cpu})

    procs = [subprocess.Popen([PY, "-m", "cpulaunch", "--ddp", "python", ALLREDUCE], env=clean_env(pod),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                              start_new_session=True, preexec_fn=pin(i))
             for i, pod in enumerate(pods)]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.communicate()
    assert [p.returncode for p in procs] == [0] * len(pods), outs
    return sorted((r for out, _ in outs for r in json_records(out) if r.get("tag") == "ddp_allreduce"),
                  key=lambda r: r["rank"])


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs (one per pod)")
@pytest.mark.parametrize("controller", ["trainjob", "pytorchjob", "old-pytorchjob"])
def test_two_pods_meet_on_loopback(controller):
    port = free_port()
    make = {"trainjob": lambda i: trainjob_env(i, addr="127.0.0.1", port=port),
            "pytorchjob": lambda i: pytorchjob_env(i, addr="127.0.0.1", port=port),
            "old-pytorchjob": lambda i: old_pytorchjob_env(i, addr="127.0.0.1", port=port)}[controller]
    recs = run_pods([make(0), make(1)])
    assert [(r["rank"], r["world_size"], r["local_rank"], r["allreduce"]) for r in recs] == \
        [(0, 2, "0", 3.0), (1, 2, "0", 3.0)]
    assert [r["affinity"] for r in recs] == [[0], [1]]
    assert all(r["torch_threads"] == 1 and r["master_port"] == str(port) for r in recs)
