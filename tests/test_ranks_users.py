"""Issue 24 items 1 and 8: what every rank cpulaunch starts is told (torchrun's worker
variables plus NODE_RANK), checked on the rendered plans and with the programs users bring
(Lightning, accelerate) on two "machines" on loopback; and ranks that end their process
group before the interpreter finalizes.

The Lightning and accelerate runs skip when the package is not installed; CI installs
them (``scripts/test.sh`` installs the ``[users]`` extra) so that they do not skip there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, json_records, run_cli
from engines import free_ports, run_together
from hypothesis import given
from hypothesis import strategies as st

from cpulaunch import distributed

PY = sys.executable
PROG = str(Path(__file__).resolve().parent / "ranks_users_prog.py")
XEON = "hw-32intel64-2p8co2t+8ve"  # 2 sockets x 8 cores: two ranks per machine

#: What torchrun's agent gives every worker and a run without the agent can honestly say.
TORCHRUN_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "NODE_RANK",
                  "MASTER_ADDR", "MASTER_PORT")


def missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


needs_lightning = pytest.mark.skipif(missing("lightning"), reason="lightning is not installed "
                                     "(pip install lightning; CI installs it)")
needs_accelerate = pytest.mark.skipif(missing("accelerate"), reason="accelerate is not installed "
                                      "(pip install accelerate; CI installs it)")


def dry_run(sysroot, *args, env=None) -> dict:
    proc = run_cli("--sysroot", str(sysroot), "--ddp", "--dry-run", "--format", "json",
                   "--allocator", "default", *args, "python", "train.py", env=env)
    return json.loads(proc.stdout)


def identity(env: dict) -> dict:
    return {k: v for k, v in env.items() if k in TORCHRUN_NAMES}


def no_elastic_claims(env: dict) -> bool:
    return not [k for k in env if k.startswith("TORCHELASTIC_")]


# --------------------------------------------------------------------------- rendered plans


def test_static_two_nodes_every_rank_gets_torchruns_variables_and_node_rank(sysroots):
    doc = dry_run(sysroots[XEON], "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                  "--master-port", "29999")
    envs = [i["env"] for i in doc["instances"]]
    assert [identity(e) for e in envs] == [
        {"RANK": str(2 + r), "WORLD_SIZE": "4", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
         "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "NODE_RANK": "1", "ROLE_RANK": str(2 + r),
         "ROLE_WORLD_SIZE": "4", "ROLE_NAME": "default", "MASTER_ADDR": "10.0.0.1",
         "MASTER_PORT": "29999"} for r in (0, 1)]
    assert all(no_elastic_claims(e) for e in envs)


def test_one_machine_is_node_zero_of_one(sysroots):
    doc = dry_run(sysroots[XEON], "--master-port", "29998")
    assert [(e["NODE_RANK"], e["GROUP_RANK"], e["GROUP_WORLD_SIZE"], e["ROLE_RANK"])
            for e in (i["env"] for i in doc["instances"])] == [("0", "0", "1", "0"), ("0", "0", "1", "1")]


def test_dry_run_text_shows_them(sysroots):
    proc = run_cli("--sysroot", str(sysroots[XEON]), "--ddp", "--dry-run", "--allocator", "default",
                   "--nnodes", "2", "--node-rank", "1", "--master-addr", "h0", "--master-port", "29999",
                   "python", "t.py")
    text = proc.stdout.replace(" \\\n  ", " ")  # each command on one line: continuations joined
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(lines) == 2
    for r, line in enumerate(lines):
        for word in (f"RANK={2 + r}", "NODE_RANK=1", "GROUP_RANK=1", "GROUP_WORLD_SIZE=2",
                     f"ROLE_RANK={2 + r}", "ROLE_WORLD_SIZE=4", "ROLE_NAME=default"):
            assert f" {word} " in line, (word, line)


def test_under_slurm_node_rank_is_slurm_nodeid(sysroots):
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
           "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_NODEID": "1", "SLURM_STEP_NUM_NODES": "2",
           "SLURM_JOB_NODELIST": "xeon[1-2]", "SLURM_JOB_ID": "42"}
    (inst,) = dry_run(sysroots[XEON], env=env)["instances"]
    assert identity(inst["env"]) == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "1",
        "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4",
        "ROLE_NAME": "default", "MASTER_ADDR": "xeon1", "MASTER_PORT": "20042"}
    assert no_elastic_claims(inst["env"])


def test_under_mpich_block_placement_gives_the_node(sysroots):
    env = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
           "MASTER_ADDR": "h0"}
    (inst,) = dry_run(sysroots[XEON], env=env)["instances"]
    assert (inst["env"]["NODE_RANK"], inst["env"]["GROUP_RANK"], inst["env"]["GROUP_WORLD_SIZE"]) == ("1", "1", "2")


def test_under_mpich_round_robin_no_node_is_invented(sysroots):
    """``mpirun --map-by node``: rank 2 is local rank 1 of node 0; no index can be derived."""
    env = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
           "MASTER_ADDR": "h0"}
    doc = dry_run(sysroots[XEON], env=env)
    (inst,) = doc["instances"]
    assert not {"NODE_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE"} & set(inst["env"])
    assert inst["env"]["RANK"] == "2" and inst["env"]["ROLE_RANK"] == "2"
    assert any("NODE_RANK and GROUP_RANK not set" in n for n in doc["notes"])


def test_under_users_torchrun_its_values_stay_and_node_rank_is_added(sysroots):
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
           "GROUP_WORLD_SIZE": "2", "ROLE_NAME": "trainer", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4",
           "TORCHELASTIC_RUN_ID": "job7", "MASTER_ADDR": "h0", "MASTER_PORT": "29400"}
    (inst,) = dry_run(sysroots[XEON], env=env)["instances"]
    assert inst["env"]["NODE_RANK"] == "1"
    # torchrun's own (its --role included) are not rewritten: they reach the rank unchanged.
    assert not {"ROLE_NAME", "ROLE_RANK", "GROUP_RANK", "TORCHELASTIC_RUN_ID"} & set(inst["env"])


def test_elastic_ranks_get_node_rank_from_the_agent(sysroots):
    doc = dry_run(sysroots[XEON], "--rdzv-endpoint", "h0:29400", "--nnodes", "1:2")
    assert all("NODE_RANK" not in i["env"] and "RANK" not in i["env"] for i in doc["instances"])
    assert any("the rank entry adds NODE_RANK=GROUP_RANK" in n for n in doc["notes"])
    assert distributed.elastic_rank_env({"GROUP_RANK": "3", "RANK": "7"}) == {"NODE_RANK": "3"}
    assert distributed.elastic_rank_env({"RANK": "7"}) == {}


@given(nnodes=st.integers(1, 64), per_node=st.integers(1, 64), data=st.data())
def test_block_node_reads_block_placement(nnodes, per_node, data):
    node = data.draw(st.integers(0, nnodes - 1))
    local = data.draw(st.integers(0, per_node - 1))
    assert distributed.block_node(node * per_node + local, nnodes * per_node, local, per_node) == (node, nnodes)


@given(world=st.integers(1, 256), data=st.data())
def test_block_node_never_names_a_node_the_rank_is_not_on(world, data):
    """Whatever placement a rank reports, a node index given is the one that block
    placement would put that rank on, and its ranks fit in the world."""
    per_node = data.draw(st.integers(1, world))
    rank = data.draw(st.integers(0, world - 1))
    local = data.draw(st.integers(0, per_node - 1))
    node, nnodes = distributed.block_node(rank, world, local, per_node)
    if node is not None:
        assert rank == node * per_node + local and nnodes * per_node == world and node < nnodes


# --------------------------------------------------------------------------- real runs


def two_nodes(program: list, *, elastic: bool = False, timeout: float = 240.0) -> list:
    """Two ``cpulaunch --ddp --nnodes 2`` "machines" on loopback, one rank each, running
    ``ranks_users_prog.py PROGRAM`` -> (every rank's record by global rank, the two processes)."""
    (port,) = free_ports(1)

    def argv(node: int) -> list:
        where = (["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"h24-{port}"] if elastic else
                 ["--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port)])
        return [PY, "-m", "cpulaunch", "--ddp", "--nnodes", "2", "--nproc-per-node", "1", *where,
                "python", PROG, *program]

    procs = run_together([argv(0), argv(1)], timeout=timeout, cwd=REPO)
    context = "\n".join(f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}" for p in procs)
    assert [p.returncode for p in procs] == [0, 0], context
    recs = [r for p in procs for r in json_records(p.stdout) if r.get("tag") == "ranks_users"]
    return sorted(recs, key=lambda r: r["global_rank"]), procs


@pytest.mark.slow
@needs_lightning
def test_lightning_on_two_nodes_each_process_has_its_global_and_node_rank():
    """The issue's run: Trainer(num_nodes=2, strategy="ddp", accelerator="cpu", devices=1) on
    two cpulaunch "machines". Before NODE_RANK was given, both took node 0 and global rank 0
    and the run never started."""
    recs, procs = two_nodes(["lightning", "--nnodes", "2"])
    assert [(r["global_rank"], r["node_rank"], r["local_rank"], r["world_size"], r["dist_rank"])
            for r in recs] == [(0, 0, 0, 2, 0), (1, 1, 0, 2, 1)]
    assert all(r["allreduce"] == 3.0 for r in recs)
    # each "machine" ran its own node's rank
    assert [[r["node_rank"] for r in json_records(p.stdout) if r.get("tag") == "ranks_users"]
            for p in procs] == [[0], [1]]


@pytest.mark.slow
@needs_accelerate
def test_accelerate_on_two_nodes_each_process_has_its_global_and_node_rank():
    recs, procs = two_nodes(["accelerate"])
    assert [(r["distributed_type"], r["global_rank"], r["local_rank"], r["world_size"]) for r in recs] == [
        ("DistributedType.MULTI_CPU", 0, 0, 2), ("DistributedType.MULTI_CPU", 1, 0, 2)]
    assert [(r["env"]["NODE_RANK"], r["env"]["GROUP_RANK"], r["env"]["GROUP_WORLD_SIZE"]) for r in recs] == [
        ("0", "0", "2"), ("1", "1", "2")]
    assert all(r["allreduce"] == 3.0 for r in recs)
    assert [[r["global_rank"] for r in json_records(p.stdout) if r.get("tag") == "ranks_users"]
            for p in procs] == [[0], [1]]


@pytest.mark.slow
@needs_lightning
@pytest.mark.parametrize("strategy, hook", [("fp16-hook", None), ("wrap-ddp-fp16", "fp16_compress_hook")])
def test_lightning_ignores_ddp_comm_hook_on_cpu_and_wrap_ddp_is_the_way(strategy, hook):
    """docs/guide/training.md: DDPStrategy(ddp_comm_hook=...) registers no hook on CPU (Lightning
    does it for CUDA only); a DDPStrategy whose _setup_model calls wrap_ddp does."""
    proc = run_cli("--ddp", "--nproc-per-node", "2", "--allocator", "default", "python", PROG, "lightning",
                   "--devices", "2", "--strategy", strategy, env={"PYTHONPATH": str(REPO)}, timeout=240,
                   check_rc=None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = sorted((r for r in json_records(proc.stdout) if r.get("tag") == "ranks_users"),
                  key=lambda r: r["global_rank"])
    assert [(r["global_rank"], r["comm_hook"], r["allreduce"]) for r in recs] == [(0, hook, 3.0), (1, hook, 3.0)]


@pytest.mark.slow
@pytest.mark.torch_release
def test_elastic_two_nodes_node_rank_is_the_agents_group_rank():
    recs, _ = two_nodes(["gloo", "--steps", "1"], elastic=True)
    assert [r["global_rank"] for r in recs] == [0, 1]
    for r in recs:
        env = r["env"]
        assert env["NODE_RANK"] == env["GROUP_RANK"] and env["TORCHELASTIC_RUN_ID"], env
        assert int(env["RANK"]) == int(env["NODE_RANK"]) * 1 + int(env["LOCAL_RANK"]), env
    assert sorted(r["env"]["NODE_RANK"] for r in recs) == ["0", "1"]


# --------------------------------------------------------------------------- item 8: exit


def hook_dir() -> str:
    return str(REPO / "cpulaunch" / "runtime" / "sitehook")


def test_every_rank_gets_the_site_hook_first_on_pythonpath(sysroots, tmp_path):
    plain = dry_run(sysroots[XEON], "--master-port", "29997")
    assert [i["env"]["PYTHONPATH"] for i in plain["instances"]] == [hook_dir()] * 2
    own = dry_run(sysroots[XEON], "--master-port", "29997", env={"PYTHONPATH": f"/src:{tmp_path}"})
    assert {i["env"]["PYTHONPATH"] for i in own["instances"]} == {f"{hook_dir()}:/src:{tmp_path}"}
    nested = dry_run(sysroots[XEON], "--master-port", "29997", env={"PYTHONPATH": f"/src:{hook_dir()}"})
    assert {i["env"]["PYTHONPATH"] for i in nested["instances"]} == {f"{hook_dir()}:/src"}  # ours first, once
    slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0",
             "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "x1",
             "SLURM_JOB_ID": "7", "PYTHONPATH": "/src"}
    (inst,) = dry_run(sysroots[XEON], env=slurm)["instances"]
    assert inst["env"]["PYTHONPATH"] == f"{hook_dir()}:/src"
    elastic = dry_run(sysroots[XEON], "--rdzv-endpoint", "h0:29400")
    assert {i["env"]["PYTHONPATH"] for i in elastic["instances"]} == {hook_dir()}


def test_the_exit_hook_is_off_on_request_and_for_a_program_that_is_not_python(sysroots):
    # issue 38: --no-exit-hook leaves the hook folder for the failure record alone, which says so
    for off in (["--no-exit-hook"], ["--no_exit_hook"]):
        doc = dry_run(sysroots[XEON], "--master-port", "29997", *off, env={"PYTHONPATH": "/src"})
        assert [(i["env"].get("PYTHONPATH"), i["env"].get("CPULAUNCH_SITE_HOOKS")) for i in doc["instances"]] == [
            (f"{hook_dir()}:/src", "record")] * 2
        doc = dry_run(sysroots[XEON], "--master-port", "29997", *off, "--no-failure-record",
                      env={"PYTHONPATH": "/src"})
        assert [i["env"].get("PYTHONPATH") for i in doc["instances"]] == [None, None]
    doc = dry_run(sysroots[XEON], "--master-port", "29997",
                  env={"CPULAUNCH_NO_EXIT_HOOK": "1", "CPULAUNCH_NO_FAILURE_RECORD": "1"})
    assert [i["env"].get("PYTHONPATH") for i in doc["instances"]] == [None, None]
    doc = dry_run(sysroots[XEON], "--master-port", "29997", "--no-failure-record")
    assert [i["env"].get("CPULAUNCH_SITE_HOOKS") for i in doc["instances"]] == ["exit", "exit"]
    proc = run_cli("--sysroot", str(sysroots[XEON]), "--ddp", "--dry-run", "--format", "json", "--allocator",
                   "default", "--master-port", "29997", "sh", "run.sh")
    doc = json.loads(proc.stdout)
    assert [i["env"].get("PYTHONPATH") for i in doc["instances"]] == [None, None]
    assert [n for n in doc["notes"] if n.startswith("no exit hook")] == [
        ("no exit hook for 'sh' (not a Python interpreter): if its ranks never call destroy_process_group(), "
         "they may abort at exit; end each rank's program with torch.distributed.destroy_process_group()")]
    assert "PYTHONPATH" not in run_cli("--ddp", "--no-exit-hook", "--no-failure-record", "--dry-run", "python",
                                       "x.py").stdout


def test_the_dry_run_shows_the_hook_the_run_uses(sysroots):
    text = run_cli("--ddp", "--nproc-per-node", "2", "--master-port", "29997", "--dry-run", "python", "x.py").stdout
    assert text.count(f"PYTHONPATH={hook_dir()} ") == 2, text


@pytest.mark.parametrize("argv, python, expected", [
    (["python", "x.py"], "/opt/py/bin/python3", True),
    (["/usr/bin/python3.11", "-m", "m"], "/x", True),
    (["/opt/py/bin/python3"], "/opt/py/bin/python3", True),
    (["/opt/venv/bin/py"], "/opt/venv/bin/py", True),
    (["sh", "run.sh"], "/usr/bin/python3", False),
    (["lightning", "run"], "/usr/bin/python3", False),
    (["pythonic"], "/usr/bin/python3", False),
    ([], "/usr/bin/python3", False),
])
def test_runs_python_reads_the_first_word(argv, python, expected):
    assert distributed.runs_python(argv, python) is expected


def run_rank(*code_or_args, env=None, timeout=60):
    """One rank under ``cpulaunch --ddp --nproc-per-node 1`` (a one-rank gloo job)."""
    return run_cli("--ddp", "--nproc-per-node", "1", "--allocator", "default", "python", *code_or_args,
                   env=env, timeout=timeout, check_rc=None)


def test_the_site_hook_runs_the_users_own_sitecustomize_and_imports_neither_torch_nor_cpulaunch(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.stderr.write('users sitecustomize ran\\n')\n")
    code = ("import sys, sitecustomize; print(sitecustomize.__file__); "
            "print(sorted(m for m in sys.modules if m in ('torch', 'cpulaunch', '_cpulaunch_exithook')))")
    proc = run_rank("-c", code, env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str(tmp_path / "sitecustomize.py"), "['_cpulaunch_exithook']"]
    # once in cpulaunch's own interpreter (the user's PYTHONPATH), once in the rank's
    assert proc.stderr.count("users sitecustomize ran") == 2


def destroys(proc) -> list:
    return [r["pid"] for r in json_records(proc.stdout) if r.get("tag") == "destroy_process_group"]


def ending_pid(proc) -> int:
    (rec,) = [r for r in json_records(proc.stdout) if r.get("tag") == "ranks_users"]
    assert rec["allreduce"] == 1.0
    return rec["pid"]


@pytest.mark.slow
@pytest.mark.parametrize("end, code, destroyed", [
    ("normal", 0, 1),      # left alive: the hook ends it
    ("destroyed", 0, 1),   # the program's own call; the hook does nothing more
    ("exit3", 3, 1),       # sys.exit(N) cannot be told from a good end: ended as torch documents
    ("raise", 1, 0),       # an uncaught exception: never wait for peers in the exit
    ("fork", 0, 1),        # the forked child's copy of the group is not the child's to end
])
def test_the_ranks_cpulaunch_starts_end_a_group_left_alive(end, code, destroyed):
    proc = run_rank(PROG, "ending", "--end", end)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert destroys(proc) == [ending_pid(proc)] * destroyed, proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("end, code, destroyed", [("normal", 0, 1), ("raise", 1, 0)])
def test_cpulaunch_init_process_group_ends_its_group_at_exit_without_the_launcher(end, code, destroyed):
    (port,) = free_ports(1)
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), PYTHONPATH=str(REPO))  # this checkout's cpulaunch, no site hook
    proc = subprocess.run([PY, PROG, "ending", "--init", "cpulaunch", "--end", end], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert destroys(proc) == [ending_pid(proc)] * destroyed, proc.stdout


def exit_race_flags(signal_dir: Path) -> list:
    return list((signal_dir / "flags").read_bytes())


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
@pytest.mark.parametrize("off", [[], ["--no-exit-hook"]], ids=["hook", "no-exit-hook"])
@pytest.mark.parametrize("destroyed", [[], ["--destroyed"]], ids=["left-alive", "destroyed-in-a-cycle"])
def test_the_exit_time_abort_reproduced_and_gone_under_cpulaunch(tmp_path, off, destroyed):
    """ranks_users_prog.py's exit-race stages the abort of issue 24 item 8 (a gloo worker
    taking the GIL while the interpreter finalizes): rank 0 is killed by SIGABRT every time
    without the hook (``--no-exit-hook``, and the code before the hook), and ends 0 with it.
    ``--destroyed``: the program destroyed the group itself but a reference cycle holds it
    (issue 25, a DDP model): the same abort without the hook, and with the hook as it was
    before it collected garbage; 0 with it."""
    proc = run_cli("--ddp", "--nproc-per-node", "2", "--allocator", "default", *off, "python", PROG, "exit-race",
                   *destroyed, "--signal-dir", str(tmp_path), timeout=180, check_rc=None)
    assert exit_race_flags(tmp_path) == [1, 1], "the race was not staged (rank 1 did not join within 60 s)"
    if off:
        assert proc.returncode == 134 and "terminate called without an active exception" in proc.stderr, (
            proc.returncode, proc.stderr[-3000:])
    else:
        assert "terminate called" not in proc.stderr and proc.returncode == 0, proc.stderr[-3000:]


def unlaunched_exit_race(signal_dir: Path) -> tuple:
    """Two exit-race ranks started by hand (no cpulaunch, no site hook), initialised with
    cpulaunch.distributed.init_process_group -> (flags, return codes, stderr tails)."""
    signal_dir.mkdir()
    (port,) = free_ports(1)
    env = dict(os.environ, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), PYTHONPATH=str(REPO))
    argv = [PY, PROG, "exit-race", "--init", "cpulaunch", "--signal-dir", str(signal_dir)]
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
             for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    return exit_race_flags(signal_dir), [p.returncode for p in procs], [err[-2000:] for _, err in outs]


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_the_exit_time_abort_gone_with_cpulaunch_init_process_group(tmp_path):
    """The same race in two ranks started without cpulaunch, which use
    cpulaunch.distributed.init_process_group: its exit handler ends the group."""
    flags, codes, errs = unlaunched_exit_race(tmp_path / "signals")
    assert flags == [1, 1], "the race was not staged (rank 1 did not join within 60 s)"
    assert codes == [0, 0], errs
