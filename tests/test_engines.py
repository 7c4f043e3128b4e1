"""Real engines on this machine: a one-node Slurm cluster and MPICH's mpirun.

Two groups of tests:
  * the engines themselves, with ``probe_rank.py`` (no cpulaunch): what each task sees
    (rank variables, CPU affinity) and how each engine reports a failing task's exit code;
  * ``cpulaunch --ddp`` under each engine, with ``ddp_allreduce.py`` (a real gloo
    all_reduce). These skip with "cpulaunch --ddp not available yet" until
    ``cpulaunch --help`` lists ``--ddp``; the check runs at test time, so they start running
    the day the option lands.

The fixtures start the engines once per session (about 1.5 s for Slurm) and skip with the
engine's reason when it cannot start; CI installs ``mpich slurm-wlm munge`` so that they do
not skip there. The exit-code facts asserted here were measured on Slurm 22.05.8 and
MPICH 4.0.2 (see tests/engines.py).

``CPULAUNCH_ENGINE_TEST_LAUNCHER`` (a command prefix, split like a shell would) replaces
``python -m cpulaunch`` in the DDP tests; it exists to test this harness itself against a
stand-in launcher and is not set in CI.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from engines import (EngineUnavailable, Mpich, SlurmCluster, free_ports, mpich as find_mpich,
                     run_together, slurm_cluster)

pytestmark = pytest.mark.cluster

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
PROBE = TESTS / "probe_rank.py"
DDP = TESTS / "ddp_allreduce.py"
PY = sys.executable

NOT_YET = "cpulaunch --ddp not available yet"


# ------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="session")
def slurm() -> SlurmCluster:
    """A one-node Slurm cluster for the whole session (skips with the engine's reason)."""
    stack = contextlib.ExitStack()
    try:
        cluster = stack.enter_context(slurm_cluster())
    except EngineUnavailable as exc:
        pytest.skip(str(exc))
    with stack:
        if cluster.node.cpus // cluster.node.threads_per_core < 2:
            pytest.skip(f"slurm: srun -n 2 needs 2 cores; node {cluster.node} has fewer")
        yield cluster


@pytest.fixture(scope="session")
def mpich() -> Mpich:
    """MPICH's mpirun (skips with the reason when it is not installed)."""
    try:
        return find_mpich()
    except EngineUnavailable as exc:
        pytest.skip(str(exc))


def launcher() -> list[str]:
    """The cpulaunch command prefix: this interpreter's ``-m cpulaunch`` (the checkout)."""
    override = os.environ.get("CPULAUNCH_ENGINE_TEST_LAUNCHER")
    return shlex.split(override) if override else [PY, "-m", "cpulaunch"]


@functools.lru_cache(maxsize=None)
def _ddp_help() -> str:
    try:
        proc = subprocess.run([*launcher(), "--help"], cwd=REPO, capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"({exc})"
    return proc.stdout


@pytest.fixture
def cpulaunch_ddp() -> list[str]:
    """The argv prefix ``cpulaunch --ddp``; skips until ``cpulaunch --help`` lists --ddp."""
    if "--ddp" not in _ddp_help():
        pytest.skip(NOT_YET)
    return [*launcher(), "--ddp"]


# ------------------------------------------------------------------------------- helpers

def records(stdout: str, tag: str) -> list[dict]:
    """The JSON objects with ``"tag": tag`` in ``stdout``, in the order printed.

    Found wherever they start, not per line: Hydra forwards the ranks' output in chunks, and
    two ranks' lines were seen glued together (``{...}{...}`` then an empty line).
    """
    decoder = json.JSONDecoder()
    out = []
    for start in (m.start() for m in re.finditer(r'\{"tag": ', stdout)):
        with contextlib.suppress(ValueError):
            rec, _ = decoder.raw_decode(stdout, start)
            if rec.get("tag") == tag:
                out.append(rec)
    return out


def by_key(recs: list[dict], key) -> dict:
    """Records keyed by ``key(rec)``; fails on duplicate keys."""
    out = {}
    for rec in recs:
        k = key(rec)
        assert k not in out, f"two records for {k!r}: {recs}"
        out[k] = rec
    return out


def show(proc: subprocess.CompletedProcess, cluster: SlurmCluster | None = None) -> str:
    text = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    if cluster is not None:
        text += f"\ndaemon logs:\n{cluster.logs()}"
    return text


def first_host(cluster: SlurmCluster, nodelist: str) -> str:
    """The first host of a Slurm nodelist, as Slurm itself expands it."""
    scontrol = shutil.which("scontrol") or "scontrol"
    proc = subprocess.run([scontrol, "show", "hostnames", nodelist], env=cluster.env,
                          capture_output=True, text=True, timeout=10, check=True)
    return proc.stdout.split()[0]


def addresses(host: str) -> set[str]:
    """``host`` itself and the addresses it resolves to."""
    with contextlib.suppress(OSError):
        return {host} | {ai[4][0] for ai in socket.getaddrinfo(host, None)}
    return {host}


def assert_disjoint_inside(ranks: dict[int, list[int]], allowed: dict[int, list[int]]):
    """Every rank's CPUs are non-empty, inside what the engine gave it, and disjoint."""
    for rank, cpus in ranks.items():
        assert cpus, f"rank {rank} has no CPUs"
        assert set(cpus) <= set(allowed[rank]), (
            f"rank {rank} bound to {cpus}, outside the engine's {allowed[rank]}")
    seen: dict[int, int] = {}
    for rank, cpus in sorted(ranks.items()):
        for cpu in cpus:
            assert cpu not in seen, f"cpu {cpu} given to ranks {seen[cpu]} and {rank}"
            seen[cpu] = rank


# ----------------------------------------------------------------------- Slurm, no cpulaunch

def test_srun_gives_two_ranks_bound_to_one_core_each(slurm):
    proc = slurm.srun(["-n", "2", PY, PROBE], timeout=30, cwd=REPO)
    assert proc.returncode == 0, show(proc, slurm)
    tasks = by_key(records(proc.stdout, "probe_rank"), lambda r: int(r["env"]["SLURM_PROCID"]))
    assert sorted(tasks) == [0, 1], show(proc)
    for procid, task in tasks.items():
        env = task["env"]
        assert env["SLURM_LOCALID"] == str(procid)  # one node: local id = global id
        assert env["SLURM_NTASKS"] == "2"
        assert env["SLURM_JOB_NODELIST"] == slurm.node.name
        # task/affinity with CR_Core: each task gets one whole core.
        assert len(task["affinity"]) == slurm.node.threads_per_core, task
    assert not set(tasks[0]["affinity"]) & set(tasks[1]["affinity"]), tasks


@pytest.mark.parametrize("codes, expected", [
    (["1=3"], 3),        # one failing task: its code
    (["0=3", "1=4"], 4),  # srun reports the largest code, not the first or an OR
    (["1=-9"], 137),     # killed by SIGKILL: 128 + 9
], ids=["one-task-3", "tasks-3-and-4", "task-sigkill"])
def test_srun_propagates_failing_task_exit_code(slurm, codes, expected):
    proc = slurm.srun(["-n", "2", PY, PROBE, *codes], timeout=30, cwd=REPO)
    assert proc.returncode == expected, show(proc, slurm)


def test_sbatch_runs_script_and_reports_its_exit_code(slurm):
    script = (
        "#!/bin/bash\n"
        "#SBATCH --ntasks=2\n"
        "#SBATCH --job-name=cpulaunch-probe\n"
        f"srun {shlex.quote(PY)} {shlex.quote(str(PROBE))}\n"
        "echo \"srun exit $?\"\n"
        "exit 5\n"
    )
    code, output = slurm.sbatch_wait(script, timeout=60, cwd=REPO)
    assert code == 5, output + slurm.logs()
    assert "srun exit 0" in output, output
    tasks = by_key(records(output, "probe_rank"), lambda r: int(r["env"]["SLURM_PROCID"]))
    assert sorted(tasks) == [0, 1], output
    assert {t["env"]["SLURM_JOB_NODELIST"] for t in tasks.values()} == {slurm.node.name}


# ----------------------------------------------------------------------- MPICH, no cpulaunch

def test_mpirun_gives_pmi_rank_size_and_local_rank(mpich):
    proc = mpich.run(2, [PY, PROBE], timeout=30, cwd=REPO)
    assert proc.returncode == 0, show(proc)
    ranks = by_key(records(proc.stdout, "probe_rank"), lambda r: int(r["env"]["PMI_RANK"]))
    assert sorted(ranks) == [0, 1], show(proc)
    for rank, rec in ranks.items():
        assert rec["env"]["PMI_SIZE"] == "2"
        assert rec["env"]["MPI_LOCALRANKID"] == str(rank)
        assert rec["env"]["MPI_LOCALNRANKS"] == "2"
        # Hydra does not bind by default: each rank may use every CPU we may use.
        assert rec["affinity"] == sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize("codes, expected", [
    (["1=3"], 3),        # one failing rank: its code
    (["0=3", "1=4"], 7),  # Hydra ORs the ranks' exit codes: 3 | 4 = 7
    (["1=-9"], 9),       # killed by SIGKILL: the signal number, not 128 + 9
], ids=["one-rank-3", "ranks-3-and-4", "rank-sigkill"])
def test_mpirun_propagates_failing_rank_exit_code(mpich, codes, expected):
    proc = mpich.run(2, [PY, PROBE, *codes], timeout=30, cwd=REPO)
    assert proc.returncode == expected, show(proc)


# --------------------------------------------------------------------- cpulaunch --ddp

def check_ddp_ranks(recs: list[dict], allowed: dict[int, list[int]], context: str) -> dict:
    """Assert two ranks that met and summed 1 + 2; return them keyed by rank."""
    ranks = by_key(recs, lambda r: r["rank"])
    assert sorted(ranks) == [0, 1], context
    for rank, rec in ranks.items():
        assert rec["world_size"] == 2 and rec["env_world_size"] == "2", rec
        assert rec["env_rank"] == str(rank), rec
        assert rec["local_rank"] == str(rank), rec  # one node: local rank = rank
        assert rec["local_world_size"] == "2", rec
        assert rec["allreduce"] == 3.0, rec
    assert len({(r["master_addr"], r["master_port"]) for r in ranks.values()}) == 1, ranks
    assert_disjoint_inside({r: rec["affinity"] for r, rec in ranks.items()}, allowed)
    return ranks


def srun_baseline(slurm) -> dict[int, list[int]]:
    """CPUs Slurm gives task 0 and 1 of an ``srun -n 2`` step, by SLURM_PROCID."""
    proc = slurm.srun(["-n", "2", PY, PROBE], timeout=30, cwd=REPO)
    assert proc.returncode == 0, show(proc, slurm)
    tasks = by_key(records(proc.stdout, "probe_rank"), lambda r: int(r["env"]["SLURM_PROCID"]))
    return {rank: rec["affinity"] for rank, rec in tasks.items()}


@pytest.mark.slow
def test_srun_cpulaunch_ddp_allreduce(slurm, cpulaunch_ddp):
    allowed = srun_baseline(slurm)
    proc = slurm.srun(["-n", "2", *cpulaunch_ddp, PY, DDP], timeout=120, cwd=REPO)
    assert proc.returncode == 0, show(proc, slurm)
    ranks = check_ddp_ranks(records(proc.stdout, "ddp_allreduce"), allowed, show(proc))
    master = ranks[0]["master_addr"]
    assert master in addresses(first_host(slurm, slurm.node.name)), (
        f"MASTER_ADDR {master!r} is not the first host of SLURM_JOB_NODELIST")
    assert ranks[0]["backend"] == "gloo"


@pytest.mark.slow
def test_srun_cpulaunch_ddp_propagates_failing_rank(slurm, cpulaunch_ddp):
    proc = slurm.srun(["-n", "2", *cpulaunch_ddp, PY, DDP, "--exit-code", "3",
                       "--exit-rank", "1"], timeout=120, cwd=REPO)
    assert proc.returncode == 3, show(proc, slurm)
    # Both ranks finished the collective: the failure is the exit code, not a hang.
    assert len(records(proc.stdout, "ddp_allreduce")) == 2, show(proc)


@pytest.mark.slow
@pytest.mark.parametrize("exit_code", [0, 3], ids=["ok", "rank1-exits-3"])
def test_sbatch_cpulaunch_ddp_end_to_end(slurm, cpulaunch_ddp, exit_code):
    allowed = srun_baseline(slurm)
    cmd = " ".join(shlex.quote(str(a)) for a in
                   [*cpulaunch_ddp, PY, DDP, "--exit-code", exit_code, "--exit-rank", 1])
    # docs/guide/ddp.md's batch script, on one node instead of two.
    script = (
        "#!/bin/bash\n"
        "#SBATCH --job-name=cpulaunch-ddp\n"
        "#SBATCH --nodes=1\n"
        "#SBATCH --ntasks-per-node=2\n"
        f"srun {cmd}\n"
    )
    code, output = slurm.sbatch_wait(script, timeout=120, cwd=REPO)
    assert code == exit_code, output + slurm.logs()
    ranks = check_ddp_ranks(records(output, "ddp_allreduce"), allowed, output)
    assert ranks[0]["master_addr"] in addresses(first_host(slurm, slurm.node.name))


def mpirun_baseline(mpich) -> dict[int, list[int]]:
    """CPUs each rank of ``mpirun -n 2`` may use without cpulaunch, by PMI_RANK."""
    proc = mpich.run(2, [PY, PROBE], timeout=30, cwd=REPO)
    assert proc.returncode == 0, show(proc)
    ranks = by_key(records(proc.stdout, "probe_rank"), lambda r: int(r["env"]["PMI_RANK"]))
    return {rank: rec["affinity"] for rank, rec in ranks.items()}


@pytest.mark.slow
@pytest.mark.parametrize("hosts", ["default", "hosts", "hostfile"])
def test_mpirun_cpulaunch_ddp_allreduce(mpich, cpulaunch_ddp, hosts, tmp_path):
    """``mpirun -n 2``, and docs/guide/ddp.md's ``-hosts``/``-f hostfile -ppn 2`` forms with
    this one host in place of two."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two disjoint ranks need 2 usable CPUs")
    host = socket.gethostname()
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"{host}:2\n")
    hydra_args = {"default": [], "hosts": ["-hosts", host, "-ppn", "2"],
                  "hostfile": ["-f", hostfile, "-ppn", "2"]}[hosts]
    allowed = mpirun_baseline(mpich)
    # A free port, not the default 29500: other runs may share this host.
    (port,) = free_ports(1)
    proc = mpich.run(2, [*cpulaunch_ddp, "--master-port", port, PY, DDP], timeout=120,
                     cwd=REPO, hydra_args=hydra_args)
    assert proc.returncode == 0, show(proc)
    ranks = check_ddp_ranks(records(proc.stdout, "ddp_allreduce"), allowed, show(proc))
    # One host: whatever cpulaunch picks as MASTER_ADDR must be this host.
    local = addresses(socket.gethostname()) | {"127.0.0.1", "localhost", "::1"}
    assert ranks[0]["master_addr"] in local, ranks[0]
    assert ranks[0]["master_port"] == str(port), ranks[0]


@pytest.mark.slow
def test_mpirun_cpulaunch_ddp_propagates_failing_rank(mpich, cpulaunch_ddp):
    (port,) = free_ports(1)
    proc = mpich.run(2, [*cpulaunch_ddp, "--master-port", port, PY, DDP, "--exit-code", "3",
                         "--exit-rank", "1"], timeout=120, cwd=REPO)
    assert proc.returncode == 3, show(proc)
    assert len(records(proc.stdout, "ddp_allreduce")) == 2, show(proc)


# ---------------------------------------- cpulaunch --ddp as its own engine (torchrun inside)

def two_machines_on_this_host(argv_for_node, timeout=180.0) -> dict:
    """Run the two "machines" of a 2-node job as two processes here; return ranks by rank."""
    procs = run_together([argv_for_node(0), argv_for_node(1)], timeout=timeout, cwd=REPO)
    context = "\n".join(show(p) for p in procs)
    assert [p.returncode for p in procs] == [0, 0], context
    recs = [r for p in procs for r in records(p.stdout, "ddp_allreduce")]
    ranks = by_key(recs, lambda r: r["rank"])
    assert sorted(ranks) == [0, 1], context
    for rec in ranks.values():
        assert rec["world_size"] == 2 and rec["env_world_size"] == "2", rec
        assert rec["local_rank"] == "0" and rec["local_world_size"] == "1", rec
        assert rec["allreduce"] == 3.0, rec
    return ranks


@pytest.mark.slow
def test_static_rendezvous_two_nodes_on_one_host(cpulaunch_ddp):
    """docs/guide/ddp.md's static recipe (--nnodes 2 --node-rank N --master-addr/--master-port),
    both "machines" on this host, with --iface lo."""
    (port,) = free_ports(1)

    def argv(node_rank):
        return [*cpulaunch_ddp, "--nnodes", "2", "--node-rank", node_rank,
                "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port,
                "--iface", "lo", PY, DDP]

    ranks = two_machines_on_this_host(argv)
    for rec in ranks.values():
        assert rec["master_addr"] == "127.0.0.1" and rec["master_port"] == str(port), rec
        assert rec["iface"] == {"GLOO_SOCKET_IFNAME": "lo", "CCL_KVS_IFACE": "lo",
                                "FI_TCP_IFACE": "lo"}, rec


@pytest.mark.slow
@pytest.mark.torch_release
def test_elastic_rendezvous_two_nodes_on_one_host(cpulaunch_ddp):
    """docs/guide/ddp.md's elastic recipe (--rdzv-endpoint HOST:PORT), both on this host."""
    (port,) = free_ports(1)

    def argv(node_rank):
        return [*cpulaunch_ddp, "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"cpulaunch-test-{port}",
                PY, DDP]

    two_machines_on_this_host(argv)


# ------------------------------------------------- engines without --ddp (issue 11)

def test_srun_cpulaunch_without_ddp_runs_one_distinct_instance_per_task(slurm):
    """`srun -n 2 cpulaunch --ninstances 2 probe_rank.py`: each task runs the instance of
    its local task id, inside what Slurm gave it (task/affinity binds each task to a core,
    so each task's instance is exactly that core)."""
    allowed = srun_baseline(slurm)
    proc = slurm.srun(["-n", "2", *launcher(), "--ninstances", "2", "--allocator", "default",
                       PY, PROBE], timeout=60, cwd=REPO)
    assert proc.returncode == 0, show(proc, slurm)
    tasks = by_key(records(proc.stdout, "probe_rank"), lambda r: int(r["env"]["SLURM_PROCID"]))
    assert sorted(tasks) == [0, 1], show(proc)
    assert_disjoint_inside({r: t["affinity"] for r, t in tasks.items()}, allowed)
    assert tasks[0]["affinity"] == allowed[0] and tasks[1]["affinity"] == allowed[1]


def test_mpirun_cpulaunch_without_ddp_runs_one_distinct_instance_per_rank(mpich):
    """Under mpirun (no binding by Hydra here) each rank plans the machine and runs the
    instance of its local rank: the two instances are disjoint and cover the planned CPUs."""
    plan = json.loads(subprocess.run([*launcher(), "--dry-run", "--format", "json", "--ninstances", "2",
                                      "--allocator", "default", "true"], capture_output=True, text=True,
                                     cwd=REPO, timeout=60, check=True).stdout)
    proc = mpich.run(2, [*launcher(), "--ninstances", "2", "--allocator", "default", PY, PROBE],
                     timeout=60, cwd=REPO)
    assert proc.returncode == 0, show(proc)
    ranks = by_key(records(proc.stdout, "probe_rank"), lambda r: int(r["env"]["PMI_RANK"]))
    assert sorted(ranks) == [0, 1], show(proc)
    for rank, rec in ranks.items():
        assert rec["affinity"] == plan["instances"][rank]["bound_cpus"], show(proc)
