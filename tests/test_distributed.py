"""--ddp: engine variables, rank plans on the fixture machines, the oneCCL path, and real
multi-rank / two-node runs over gloo on this machine."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from conftest import REPO, json_records, make_stand_in, plant_fabric, run_cli
from pathlib import Path

from cpulaunch import cpulist, distributed
from cpulaunch.machine import host
from cpulaunch.distributed import (
    DistributedError,
    RankContext,
    detect_engine,
    expand_hostlist,
    first_host,
    tasks_on_node,
    torchrun_argv,
)

PY = sys.executable
ALLREDUCE = str(REPO / "tests" / "ddp_allreduce.py")
XEON = "hw-32intel64-2p8co2t+8ve"
SNC = "hw-memorysidecaches"


# --------------------------------------------------------------------------- engine variables
# Variable sets as each launcher documents them (they cannot all run here).


def test_torchrun_variables():
    ctx = detect_engine({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                         "MASTER_ADDR": "h0", "MASTER_PORT": "1234", "TORCHELASTIC_RUN_ID": "x"})
    assert ctx == RankContext("torchrun", 3, 4, 1, 2, "h0", 1234)


def test_mpich_and_intel_mpi_hydra_variables():
    # MPICH and Intel MPI's Hydra: PMI_RANK/PMI_SIZE, MPI_LOCALRANKID/MPI_LOCALNRANKS.
    ctx = detect_engine({"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert (ctx.engine, ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size) == ("mpich", 5, 8, 1, 2)


def test_openmpi_variables_win_over_slurm_allocation():
    env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_RANK": "2",
           # mpirun inside an sbatch allocation still sees the job's Slurm variables
           "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "n[1-2]"}
    ctx = detect_engine(env)
    assert (ctx.engine, ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size) == ("openmpi", 2, 4, 0, 2)


def test_slurm_srun_variables_master_from_nodelist_and_port_from_job():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
           "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_NODELIST": "cn[007-008]",
           "SLURM_JOB_ID": "123456"}
    ctx = detect_engine(env)
    assert ctx == RankContext("slurm", 3, 4, 1, 2, "cn007", 20000 + 123456 % 10000, ctx.notes, node_rank=1)
    assert any("first host of the Slurm node list" in n for n in ctx.notes)


def test_sbatch_batch_shell_is_not_a_rank():
    # The batch script itself has SLURM_PROCID=0 but no step: cpulaunch must not take it for rank 0 of N.
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "n1"}
    assert detect_engine(env) is None


def test_no_engine():
    assert detect_engine({"HOME": "/root"}) is None


def test_broken_engine_variables_are_errors():
    with pytest.raises(DistributedError):
        detect_engine({"PMI_RANK": "x", "PMI_SIZE": "2"})


# HPE PALS (mpiexec on Cray EX) with Cray PMI: what each rank of `mpiexec -n 4 --ppn 2` gets
# (PALS_RANKID, PALS_LOCAL_RANKID, PALS_NODEID, PALS_LOCAL_SIZE; Cray PMI's PMI_RANK and
# PMI_SIZE beside them, so PALS must win over MPICH's Hydra, which also reads PMI_RANK).
PALS = {"PALS_RANKID": "3", "PALS_LOCAL_RANKID": "1", "PALS_NODEID": "1", "PALS_LOCAL_SIZE": "2",
        "PALS_APID": "4f1c0a2e", "PALS_DEPTH": "1", "PMI_RANK": "3", "PMI_SIZE": "4", "PMI_LOCAL_RANK": "1",
        "PMI_LOCAL_SIZE": "2"}


def test_pals_ranks_and_node():
    ctx = detect_engine(PALS)
    assert ctx == RankContext("pals", 3, 4, 1, 2, None, None, (), node_rank=1, nnodes=2)
    # PALS_NODEID names the node even where the ranks are not placed in blocks (round-robin
    # placement: rank 1 is local rank 0 of node 1), where MPICH's variables would name none.
    ctx = detect_engine({**PALS, "PALS_RANKID": "1", "PALS_LOCAL_RANKID": "0", "PALS_NODEID": "1"})
    assert (ctx.rank, ctx.local_rank, ctx.node_rank, ctx.nnodes) == (1, 0, 1, 2) and ctx.notes == ()
    # MPICH's Hydra alone is still MPICH (no PALS variable)
    assert detect_engine({"PMI_RANK": "1", "PMI_SIZE": "2"}).engine == "mpich"


def _without_engines(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PALS_", "SLURM_", "OMPI_", "PMIX_", "PET_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(extra)
    return env


def test_pals_rank_plan_on_a_fixture(sysroots):
    proc = run_cli("--sysroot", str(sysroots[XEON]), "--ddp", "--dry-run", "python", "x.py", check_rc=2,
                   env=_without_engines(PALS))
    assert "pals: cannot tell rank 0's host; pass --master-addr HOST or export MASTER_ADDR=HOST" in proc.stderr
    doc = ddp_json(sysroots[XEON], "--master-addr", "nid001", env=_without_engines(PALS))
    assert doc["ddp"]["engine"] == "pals" and doc["ddp"]["rank"] == 3
    (inst,) = doc["instances"]
    assert inst["cpulist"] == "8-15" and inst["env"]["RANK"] == "3" and inst["env"]["LOCAL_RANK"] == "1"
    assert (inst["env"]["GROUP_RANK"], inst["env"]["NODE_RANK"], inst["env"]["GROUP_WORLD_SIZE"]) == ("1", "1", "2")


@pytest.mark.parametrize("env, message", [
    ({"PALS_RANKID": "-1", "PMI_SIZE": "2"}, "PALS_RANKID=-1: expected a whole number 0 or more; fix or unset it"),
    ({"PALS_RANKID": "0", "PMI_SIZE": "0"}, "PMI_SIZE=0: expected a whole number 1 or more; fix or unset it"),
    ({**PALS, "PALS_NODEID": "one"}, "PALS_NODEID=one: expected a whole number 0 or more"),
    ({**PALS, "PALS_RANKID": "4"}, "pals: PALS_RANKID=4 is not below PMI_SIZE=4"),
    ({**PALS, "PALS_LOCAL_RANKID": "2"}, "pals: PALS_LOCAL_RANKID=2 is not below PALS_LOCAL_SIZE=2"),
    ({"RANK": "0", "WORLD_SIZE": "four", "LOCAL_RANK": "0"}, "WORLD_SIZE=four: expected a whole number 1 or more"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_PORT": "http"},
     "MASTER_PORT=http: expected a port number 1-65535"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_PORT": "70000"},
     "MASTER_PORT=70000: expected a port number 1-65535"),
    ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "torchrun: RANK=2 is not below WORLD_SIZE=2"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "x"},
     "SLURM_NODEID=x: expected a whole number 0 or more"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "zero",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, "OMPI_COMM_WORLD_LOCAL_RANK=zero: expected a whole number 0 or more"),
])
def test_every_malformed_engine_variable_is_named(env, message):
    with pytest.raises(DistributedError) as err:
        detect_engine(env)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_empty_engine_variables_count_as_unset():
    # `export MASTER_PORT=` in a job script: unset, as for cpulaunch's own variables
    ctx = detect_engine({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_PORT": " ", "GROUP_RANK": ""})
    assert ctx.master_port is None and ctx.node_rank is None


def test_malformed_engine_variable_is_a_one_line_cli_error():
    proc = run_cli("--ddp", "--dry-run", "python", "x.py", env=_without_engines({"PALS_RANKID": "-1", "PMI_SIZE": "2"}),
                   check_rc=2)
    assert proc.stderr == "cpulaunch: error: PALS_RANKID=-1: expected a whole number 0 or more; fix or unset it\n"


def test_hostlists():
    assert expand_hostlist("node[01-03,07],gpu1") == ["node01", "node02", "node03", "node07", "gpu1"]
    assert expand_hostlist("a[9-10]-ib") == ["a9-ib", "a10-ib"]
    assert first_host("rack1-n[100-101]") == "rack1-n100"
    assert tasks_on_node("2(x3),1", 2) == 2 and tasks_on_node("2(x3),1", 3) == 1


def test_torchrun_argv_static_and_elastic():
    entry = ["cl", "--rank-entry"]
    assert torchrun_argv("py", 2, "2", 1, "h", 29500, None, None, entry) == [
        "py", "-m", "torch.distributed.run", "--nproc-per-node", "2", "--nnodes", "2",
        "--node-rank", "1", "--master-addr", "h", "--master-port", "29500", "--no-python", *entry]
    assert torchrun_argv("py", 2, "1:4", 0, None, None, "h:1", "job", entry)[6:13] == [
        "1:4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "--rdzv-id", "job"]


@pytest.mark.parametrize("nnodes,environ,env", [
    ("1:2", {}, {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}),  # a machine may join: torch's shared store off
    ("2:4", {"PATH": "/bin"}, {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}),
    ("1:2", {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}, {}),  # the user's own value is kept
    ("2:2", {}, {}), ("2", {}, {}),  # nobody joins a running job
])
def test_an_elastic_agent_that_may_see_a_machine_join_does_not_share_its_store(nnodes, environ, env):
    from cpulaunch.distributed import elastic_agent_env

    assert elastic_agent_env(nnodes, environ) == env


def test_dry_run_shows_the_agents_environment(monkeypatch):
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    out = run_cli("--dry-run", "--ddp", "--nnodes", "1:2", "--rdzv-endpoint", "127.0.0.1:29999",
                  "--nproc-per-node", "1", "python", "x.py").stdout
    assert out.splitlines()[-1].startswith("env TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "), out


# --------------------------------------------------------------------------- backend choice


# The backend choice, oneCCL's variables and the worker cores (issue 21: the version string
# decides nothing, a child process's import does) are tested in tests/test_ccl.py.


# --------------------------------------------------------------------------- plans on fixtures


def ddp_json(sysroot, *args, env=None):
    proc = run_cli("--sysroot", str(sysroot), "--ddp", "--dry-run", "--format", "json",
                   "--allocator", "default", *args, "python", "train.py", env=env)
    return json.loads(proc.stdout)


def test_ranks_per_socket_on_xeon(sysroots):
    doc = ddp_json(sysroots[XEON])
    assert [i["cpulist"] for i in doc["instances"]] == ["0-7", "8-15"]
    assert [i["mem_nodes"] for i in doc["instances"]] == [[0], [1]]
    for r, inst in enumerate(doc["instances"]):
        env = inst["env"]
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(r), "2", str(r), "2")
        assert env["OMP_NUM_THREADS"] == "8" and env["CPULAUNCH_DIST_BACKEND"] == "gloo"
        assert inst["argv"][:5] == ["numactl", "-C", inst["cpulist"], "-m", str(r)] or \
            inst["argv"][1:5] == ["-C", inst["cpulist"], "-m", str(r)]
    assert doc["ddp"]["nproc_per_node"] == 2
    assert any("not installed" in n for n in doc["notes"])


def test_two_nodes_static_rank_numbers(sysroots):
    doc = ddp_json(sysroots[SNC], "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                   "--master-port", "29999", "--nproc-per-node", "node")
    assert [i["env"]["RANK"] for i in doc["instances"]] == ["4", "5", "6", "7"]
    assert {i["env"]["WORLD_SIZE"] for i in doc["instances"]} == {"8"}
    assert {i["env"]["MASTER_ADDR"] for i in doc["instances"]} == {"10.0.0.1"}
    assert {i["env"]["MASTER_PORT"] for i in doc["instances"]} == {"29999"}
    assert doc["ddp"]["node_rank"] == 1 and doc["ddp"]["engine"] == "cpulaunch"  # ranks started by cpulaunch


def test_rank_under_slurm_env_gets_its_socket(sysroots):
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
           "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "xeon1",
           "SLURM_JOB_ID": "42"}
    doc = ddp_json(sysroots[XEON], env=env)
    (inst,) = doc["instances"]
    assert inst["cpulist"] == "8-15" and inst["mem_nodes"] == [1]
    assert inst["env"]["MASTER_ADDR"] == "xeon1" and inst["env"]["MASTER_PORT"] == "20042"
    assert inst["env"]["RANK"] == "1" and inst["env"]["LOCAL_WORLD_SIZE"] == "2"


def test_rank_count_mismatch_is_a_user_error(sysroots):
    env = {"PMI_RANK": "0", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "3"}
    proc = run_cli("--sysroot", str(sysroots[XEON]), "--ddp", "--nproc-per-node", "socket",
                   "--dry-run", "true", env=env, check_rc=2)
    assert "started 3 rank(s)" in proc.stderr and "Traceback" not in proc.stderr


def test_iface_sets_all_three(sysroots):
    doc = ddp_json(sysroots[XEON], "--iface", "ib0")
    env = doc["instances"][0]["env"]
    assert (env["GLOO_SOCKET_IFNAME"], env["CCL_KVS_IFACE"], env["FI_TCP_IFACE"]) == ("ib0", "ib0", "ib0")


@pytest.fixture
def fake_ccl(tmp_path):
    """A stand-in ``oneccl_bindings_for_pytorch`` that imports (real files on PYTHONPATH)
    and a stand-in libfabric where impi-rt puts it, so ``--backend auto`` picks ccl and its
    environment can be exercised; its verdict is cached in the test's own folder."""
    make_stand_in(tmp_path / "site", "", "2.8.0+xpu")
    plant_fabric(tmp_path / "impi")
    return {"PYTHONPATH": str(tmp_path / "site"), "I_MPI_ROOT": str(tmp_path / "impi"),
            "XDG_CACHE_HOME": str(tmp_path / "cache")}


def _has(name):
    from importlib import util

    return util.find_spec(name) is not None


@pytest.mark.skipif(not _has("torch"), reason="the bindings' import check imports torch")
def test_ccl_workers_on_own_node_not_in_compute(sysroots, fake_ccl):
    doc = ddp_json(sysroots[SNC], "--nproc-per-node", "node", "--ccl-worker-count", "2", env=fake_ccl)
    assert any(n.startswith("backend ccl") for n in doc["notes"])
    affinities = set()
    topo_nodes = {n["id"]: set(cpulist.parse(n["cpus"])) for n in doc["topology"]["nodes"]}
    for inst in doc["instances"]:
        env = inst["env"]
        reserved = sorted(set(inst["bound_cpus"]) - set(inst["cpus"]))
        assert len(reserved) == 2 and env["CCL_WORKER_COUNT"] == "2"
        (node,) = inst["mem_nodes"]
        assert set(reserved) <= topo_nodes[node]  # workers on the rank's own node
        assert not set(reserved) & set(inst["cpus"])
        assert env["OMP_NUM_THREADS"] == str(len(inst["cpus"])) == "8"
        affinities.add(env["CCL_WORKER_AFFINITY"])
        slice_ = env["CCL_WORKER_AFFINITY"].split(",")[int(env["LOCAL_RANK"]) * 2:][:2]
        assert [int(c) for c in slice_] == reserved
        assert env["CPULAUNCH_DIST_BACKEND"] == "ccl" and env["CCL_PROCESS_LAUNCHER"] == "none"
    assert len(affinities) == 1  # the same list on every local rank


# --------------------------------------------------------------------------- real runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def allreduce_records(stdout: str) -> list:
    return [r for r in json_records(stdout) if r.get("tag") == "ddp_allreduce"]


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_two_ranks_gloo_each_on_its_core():
    proc = run_cli("--ddp", "--nproc-per-node", "2", "python", ALLREDUCE, timeout=180)
    recs = sorted(allreduce_records(proc.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in recs] == [0, 1]
    assert all(r["world_size"] == 2 and r["allreduce"] == 3.0 and r["backend"] == "gloo" for r in recs)
    assert [r["affinity"] for r in recs] == [[0], [1]] or recs[0]["affinity"] != recs[1]["affinity"]
    assert all(len(r["affinity"]) == 1 and r["torch_threads"] == 1 for r in recs)


@pytest.mark.slow
def test_failing_rank_exit_code_comes_through():
    proc = run_cli("--ddp", "--nproc-per-node", "2", "python", ALLREDUCE, "--exit-code", "3",
                   "--exit-rank", "1", timeout=180, check_rc=3)
    assert "rank 1 failed first: exit 3" in proc.stderr


@pytest.mark.slow
def test_two_node_static_rendezvous_on_loopback():
    """Two `cpulaunch --ddp --nnodes 2 --node-rank 0|1` processes meet through c10d on 127.0.0.1."""
    port = str(free_port())
    cmd = lambda r: [PY, "-m", "cpulaunch", "--ddp", "--nnodes", "2", "--node-rank", str(r),  # noqa: E731
                     "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port,
                     "python", ALLREDUCE]
    procs = [subprocess.Popen(cmd(r), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
             for r in (0, 1)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    recs = sorted((r for out, _ in outs for r in allreduce_records(out)), key=lambda r: r["rank"])
    assert [r["rank"] for r in recs] == [0, 1]
    assert all(r["world_size"] == 2 and r["allreduce"] == 3.0 for r in recs)
    assert {r["master_port"] for r in recs} == {port}


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
@pytest.mark.torch_release
def test_under_users_own_torchrun_each_rank_bound():
    """`torchrun --nproc-per-node 2 --no-python cpulaunch --ddp python train.py`: cpulaunch
    sees torchrun's LOCAL_RANK/RANK, binds its rank to its share and execs it, with
    OMP_NUM_THREADS = the rank's core count (1 each here)."""
    proc = subprocess.run(
        [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--no-python",
         PY, "-m", "cpulaunch", "--ddp", "python", ALLREDUCE],
        capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = sorted(allreduce_records(proc.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in recs] == [0, 1]
    assert all(r["world_size"] == 2 and r["allreduce"] == 3.0 for r in recs)
    assert all(len(r["affinity"]) == 1 for r in recs)
    assert recs[0]["affinity"] != recs[1]["affinity"]
    assert all(r["omp_num_threads"] == "1" and r["torch_threads"] == 1 for r in recs)


def test_torchruns_default_omp_threads_replaced_by_rank_cores(sysroots):
    """torchrun exports OMP_NUM_THREADS=1 to its workers when unset; under torchrun that
    value is taken as torchrun's, not the user's, and the rank gets its socket's 8 cores."""
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555", "OMP_NUM_THREADS": "1"}
    doc = ddp_json(sysroots[XEON], env=env)
    (inst,) = doc["instances"]
    assert inst["cpulist"] == "8-15" and inst["env"]["OMP_NUM_THREADS"] == "8"
    assert inst["env"]["MASTER_PORT"] == "29555" and inst["env"]["RANK"] == "1"
    assert any("torchrun's default" in n for n in doc["notes"])
    env["CPULAUNCH_USER_OMP_NUM_THREADS"] = "1"  # cpulaunch's own torchrun: the user set it
    doc = ddp_json(sysroots[XEON], env=env)
    assert "OMP_NUM_THREADS" not in doc["instances"][0]["env"]



def test_host_checks_every_engine_variable_before_reading_the_engine():
    """host.gather reads the engine only when one of engines.ENGINE_VARIABLES is set.
    Every other variable machine/engines.py reads, all set at once, must not make
    detect_engine see an engine; and each of ENGINE_VARIABLES, with its engine's
    companions, must."""
    from cpulaunch.machine import engines

    source = Path(engines.__file__).read_text()
    reads = set(re.findall(r'env(?:\.get)?\(\s*"([A-Z][A-Z0-9_]+)"', source))
    reads |= set(re.findall(r'_get_int\(env, "([A-Z][A-Z0-9_]+)"', source))
    reads |= {v for group in re.findall(r'_mpi\(env, "\w+", ((?:"[A-Z0-9_]+",?\s*)+)\)', source)
              for v in re.findall(r'"([A-Z0-9_]+)"', group)}
    assert {"RANK", "WORLD_SIZE", "SLURM_STEP_ID"} <= reads
    others = {v: "1" for v in reads - set(engines.ENGINE_VARIABLES)}
    others["SLURM_JOB_NODELIST"] = others["SLURM_STEP_NODELIST"] = "n1"
    assert detect_engine(others) is None
    companions = {
        "LOCAL_RANK": {"RANK": "0", "WORLD_SIZE": "1"},
        "OMPI_COMM_WORLD_RANK": {"OMPI_COMM_WORLD_SIZE": "1"},
        "PMI_RANK": {"PMI_SIZE": "1"},
        "SLURM_PROCID": {"SLURM_STEP_ID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
                         "SLURM_NODEID": "0", "SLURM_STEP_NODELIST": "n1",
                         "SLURM_STEP_TASKS_PER_NODE": "1"},
        "PMIX_RANK": {"PMIX_SIZE": "1"},
        "PALS_RANKID": {"PMI_SIZE": "1"},
    }
    assert set(companions) == set(engines.ENGINE_VARIABLES)
    for var, extra in companions.items():
        assert detect_engine({var: "0", **extra}) is not None, var


# --------------------------------------------------------------------------- --pass-local-rank (issue 25)

PY3 = "/usr/bin/python3"


@pytest.mark.parametrize("argv,expected", [
    ([PY3, "-u", "train.py", "--lr", "1"], [PY3, "-u", "train.py", "--local_rank=1", "--lr", "1"]),
    ([PY3, "train.py"], [PY3, "train.py", "--local_rank=1"]),
    ([PY3, "-m", "pkg.train", "x"], [PY3, "-m", "pkg.train", "--local_rank=1", "x"]),
    ([PY3, "-mpkg.train", "x"], [PY3, "-mpkg.train", "--local_rank=1", "x"]),
    ([PY3, "-c", "import sys", "x"], [PY3, "-c", "import sys", "--local_rank=1", "x"]),
    ([PY3, "-W", "ignore", "-X", "dev", "-O", "t.py", "a"], [PY3, "-W", "ignore", "-X", "dev", "-O", "t.py",
                                                              "--local_rank=1", "a"]),
    (["python3.11", "-", "a"], ["python3.11", "-", "--local_rank=1", "a"]),
    (["/opt/py/bin/python", "t.py", "--local_rank=7"], ["/opt/py/bin/python", "t.py", "--local_rank=1", "--local_rank=7"]),
    ([PY3, "-u"], [PY3, "-u", "--local_rank=1"]),
    (["./train.sh", "x", "y"], ["./train.sh", "--local_rank=1", "x", "y"]),
    (["lightning", "fit"], ["lightning", "--local_rank=1", "fit"]),
])
def test_local_rank_goes_where_torch_distributed_launch_put_it(argv, expected):
    """Right after the script (module, code), before the script's own arguments, as
    torch.distributed.run's config_from_args builds ``python -u SCRIPT --local-rank=N ARGS``."""
    assert distributed.with_local_rank(argv, PY3, 1) == tuple(expected)


def test_pass_local_rank_on_every_rank_of_a_plan(sysroots):
    doc = ddp_json(sysroots[XEON], "--pass-local-rank")
    assert [i["argv"][-3:] for i in doc["instances"]] == [["python", "train.py", "--local_rank=0"],
                                                          ["python", "train.py", "--local_rank=1"]]
    assert [i["env"]["LOCAL_RANK"] for i in doc["instances"]] == ["0", "1"]
    assert any(n.startswith("--pass-local-rank: each rank's program also gets --local_rank=") for n in doc["notes"])
    two = ddp_json(sysroots[SNC], "--pass-local-rank", "--nnodes", "2", "--node-rank", "1", "--master-addr",
                   "10.0.0.1", "--master-port", "29999", "--nproc-per-node", "node")
    assert [(i["env"]["RANK"], i["argv"][-1]) for i in two["instances"]] == [
        ("4", "--local_rank=0"), ("5", "--local_rank=1"), ("6", "--local_rank=2"), ("7", "--local_rank=3")]


def test_pass_local_rank_under_an_engine_and_elastic(sysroots):
    slurm = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
             "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "xeon1",
             "SLURM_JOB_ID": "42"}
    (inst,) = ddp_json(sysroots[XEON], "--pass-local-rank", env=slurm)["instances"]
    assert inst["argv"][-3:] == ["python", "train.py", "--local_rank=1"] and inst["cpulist"] == "8-15"
    elastic = ddp_json(sysroots[XEON], "--pass-local-rank", "--rdzv-endpoint", "h:1", "--nnodes", "1:2")
    assert [i["argv"][-1] for i in elastic["instances"]] == ["--local_rank=0", "--local_rank=1"]


def test_use_env_is_the_default_and_contradicts_pass_local_rank(sysroots):
    """torch.distributed.launch's --use-env / --use_env (pass LOCAL_RANK only) is what --ddp
    does anyway: the same argv as without it; with --pass-local-rank it is a user error."""
    plain = ddp_json(sysroots[XEON], "--master-port", "29999")
    for spelling in ("--use-env", "--use_env"):
        doc = ddp_json(sysroots[XEON], "--master-port", "29999", spelling)
        assert [i["argv"] for i in doc["instances"]] == [i["argv"] for i in plain["instances"]]
        assert not any("--local_rank" in w for i in doc["instances"] for w in i["argv"])
    proc = run_cli("--sysroot", str(sysroots[XEON]), "--ddp", "--pass-local-rank", "--use-env", "--dry-run",
                   "python", "train.py", check_rc=2)
    assert proc.stderr.strip().splitlines() == [
        "cpulaunch: error: --use-env (torch.distributed.launch: pass no --local_rank argument) contradicts "
        "--pass-local-rank; drop one of them"]
    proc = run_cli("--pass-local-rank", "--dry-run", "python", "train.py", check_rc=2)
    assert proc.stderr.strip() == "cpulaunch: error: --pass-local-rank applies to --ddp only; add --ddp or drop it"


# --------------------------------------------------------------------------- rank counts and the CPU quota (issue 35)


def test_ddp_default_and_auto_stay_within_the_quota(sysroots):
    """The default (one rank per socket) and ``auto`` (one per usable core) plan no more
    ranks than the quota runs at once, naming it; ``socket`` asked for plans as asked, with
    the planner's note. Real quotas: tests/test_cgroups.py."""
    from cpulaunch.machine import probe
    from cpulaunch.plan import Request, plan

    topo = probe.probe(str(sysroots[XEON]))._replace(quota_cpus=1.0, quota_source="/sys/fs/cgroup/cpu/pod")
    notes: list = []
    req = distributed.rank_request(Request(), None, topo, notes=notes)
    assert req.ninstances == 1 and notes == [
        "--ddp: 1 rank(s), as many as a CPU quota of 1 CPU (cgroup /sys/fs/cgroup/cpu/pod) runs at once, not one "
        "per socket (2); pass --nproc-per-node socket for one per socket anyway"]
    notes = []
    p = plan(topo, distributed.rank_request(Request(), "socket", topo, notes=notes))
    assert notes == [] and len(p.instances) == 2
    assert ("--nproc-per-node socket: 2 instances under a CPU quota of 1 CPU (cgroup /sys/fs/cgroup/cpu/pod), which "
            "runs 1 at a time: they take turns on its CPU time; planned as asked (fewer instances fit the quota)") \
        in p.notes
    topo = topo._replace(quota_cpus=3.5)
    notes = []
    assert distributed.rank_request(Request(), "auto", topo, notes=notes).ninstances == 3
    assert notes[0].startswith("--nproc-per-node auto: 3 rank(s), as many as a CPU quota of 3.5 CPUs")
    notes = []
    assert distributed.rank_request(Request(), "auto", topo._replace(quota_cpus=None), notes=notes).ninstances == 16
    assert notes == ["--nproc-per-node auto: 16 rank(s), one per usable core (16 cores, CPUs 0-31 allowed by cgroup "
                     "cpuset /sys/fs/cgroup/cpuset/cpuset.effective_cpus)"]
    # under an engine, auto means the ranks it started
    notes = []
    assert distributed.rank_request(Request(), "auto", topo, local_size=2, notes=notes).instances_per_socket == 1
