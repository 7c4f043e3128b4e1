"""examples/train_ddp.py for real: 2 gloo ranks on this machine against one process.

Equivalence claim under test: every rank draws the same global batch of each step and keeps
its own equal-size shard, each rank's loss is the mean over its shard, and DDP averages the
gradients over ranks, so N steps of 2-rank DDP give the parameters of N steps of a single
process (WORLD_SIZE unset) on the same global batches, up to floating-point summation order.

Tolerance, fp32: ``atol = 1e-5`` on every parameter and buffer. The two runs differ only in
the order of sums (mean of two 4-row means vs one 8-row mean, gloo's all-reduce, matmul
blocking for 4 vs 8 rows), i.e. a few fp32 ulps (~1e-7 relative) per gradient element per
step. In the stable regime used here (SGD, small learning rate, 6 steps) those stay near 1e-8
to 1e-7 on parameters of magnitude <= ~1; 1e-5 leaves a wide margin. A real bug (loss summed
instead of averaged, a shard dropped or counted twice, no all-reduce, wrong accumulation
scaling) moves parameters by the order of a whole update, and the runs used here move them by
more than ``MIN_UPDATE = 1e-3`` (100x the tolerance, asserted), so the test can tell.

Regime note: with random labels a too-large learning rate makes training chaotic (the cnn
at lr 0.01 diverged within 6 steps here and the 1-ulp differences grew to 1e-2); that is
amplification, not a DDP error, so the runs below stay in a stable regime. The frozen-BN cnn
is the touchy one: at lr 0.001, momentum 0.9 its difference was 1.5e-8 after 1 step, 6e-8
after 3 and 1.5e-6 after 4 (the loss starts climbing), so it runs 3 steps. Measured here
with the settings below: bert 1.5e-8, bert with accumulation 8.4e-9, cnn 6e-8; updates
4e-2 (bert) and 4e-3 (cnn).

The two ranks must hold bit-identical parameters: gloo's all-reduce gives every rank the
same reduced bytes (each element is reduced once and then broadcast), and the optimizer step
that follows is deterministic.

Ranks run with OMP_NUM_THREADS=1 (and the single process too, so that thread count is not
one more difference) so that two ranks do not oversubscribe this machine's 2 cores.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import json_records

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_ddp.py"
sys.path.insert(0, str(ROOT / "examples"))

#: torchrun's engine, 2 ranks on this host, program given as a full argv (--no-python).
TORCHRUN_2 = [sys.executable, "-m", "torch.distributed.run", "--standalone",
              "--nproc-per-node", "2", "--no-python"]

ATOL_FP32 = 1e-5
MIN_UPDATE = 1e-3
#: bert small: LayerNorm, no dropout, no BatchNorm: per-sample, so exactly comparable.
BERT_ARGS = ["--model", "bert", "--size", "small", "--steps", "6", "--global-batch-size", "8",
             "--lr", "0.05", "--seed", "3"]
#: cnn small with BatchNorm frozen (eval mode): per-sample too. Without --freeze-bn each
#: rank normalises over its own 4 rows, which is standard DDP but not equal to one process.
CNN_ARGS = ["--model", "cnn", "--size", "small", "--steps", "3", "--global-batch-size", "8",
            "--lr", "0.001", "--seed", "3", "--freeze-bn"]
RUN_TIMEOUT_S = 180

#: Variables a launcher sets for a rank; removed so the single-process run really is one.
_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")

pytestmark = pytest.mark.slow


def rank_env(**extra: str) -> dict[str, str]:
    """A child environment: no inherited rank variables, 1 OpenMP thread, gloo, and this
    checkout first on PYTHONPATH (for ``cpulaunch.distributed``)."""
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARS}
    env["OMP_NUM_THREADS"] = "1"
    env["CPULAUNCH_DIST_BACKEND"] = "gloo"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def _json_lines(stdout: str) -> list[dict]:
    return json_records(stdout)


def run_two_ranks(argv_prefix: list[str], script_args: list[str], *,
                  env: dict[str, str] | None = None,
                  timeout: float = RUN_TIMEOUT_S) -> list[dict]:
    """Run train_ddp.py as 2 ranks under a launcher; return the ranks' JSON summaries by rank.

    Args:
        argv_prefix: the launcher up to the program, e.g. :data:`TORCHRUN_2`, or
            ``["cpulaunch", "--ddp", "--nproc-per-node", "2"]``; the program
            ``[python, train_ddp.py, *script_args, --json]`` is appended.
        script_args: train_ddp.py options.
        env: the launcher's environment (default :func:`rank_env`).
    """
    cmd = [*argv_prefix, sys.executable, str(SCRIPT), *script_args, "--json"]
    proc = subprocess.run(cmd, env=env or rank_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, (
        f"{cmd} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
        f"stderr:\n{proc.stderr[-6000:]}")
    summaries = sorted(_json_lines(proc.stdout), key=lambda s: s["rank"])
    assert [s["rank"] for s in summaries] == [0, 1], proc.stdout
    return summaries


def run_single(script_args: list[str], *, env: dict[str, str] | None = None,
               timeout: float = RUN_TIMEOUT_S) -> dict:
    """Run train_ddp.py as one process (WORLD_SIZE unset); return its JSON summary."""
    cmd = [sys.executable, str(SCRIPT), *script_args, "--json"]
    proc = subprocess.run(cmd, env=env or rank_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stderr[-6000:]}"
    (summary,) = _json_lines(proc.stdout)
    return summary


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def initial_state(model: str) -> dict:
    from models import make_model
    m, _ = make_model(model, "small", seed=3)
    return {k: v.clone() for k, v in m.state_dict().items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """All real runs, once: (name -> (JSON summaries, {rank: state_dict}))."""
    d = tmp_path_factory.mktemp("train_ddp")
    out = {}
    for name, args, two in [
        ("bert_ddp", BERT_ARGS, True),
        ("bert_single", BERT_ARGS, False),
        ("bert_ddp_accum2", BERT_ARGS + ["--accum-steps", "2"], True),
        ("cnn_ddp", CNN_ARGS, True),
        ("cnn_single", CNN_ARGS, False),
        ("bert_cpulaunch", BERT_ARGS, "cpulaunch"),
    ]:
        save = ["--save-params", str(d / f"{name}.pt")]
        if two == "cpulaunch":
            # cpulaunch --ddp: torchrun's engine, each rank bound to its own core, its own
            # OMP_NUM_THREADS (so none is given here).
            env = rank_env()
            del env["OMP_NUM_THREADS"], env["CPULAUNCH_DIST_BACKEND"]
            summaries = run_two_ranks(CPULAUNCH_DDP_2, args + save, env=env)
        else:
            summaries = run_two_ranks(TORCHRUN_2, args + save) if two else [run_single(args + save)]
        params = {s["rank"]: load(d / f"{name}.rank{s['rank']}.pt") for s in summaries}
        out[name] = (summaries, params)
    return out


#: cpulaunch's own DDP launch of 2 ranks on this machine.
CPULAUNCH_DDP_2 = [sys.executable, "-m", "cpulaunch", "--ddp", "--nproc-per-node", "2",
                   "--backend", "gloo"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs for 2 ranks")
@pytest.mark.torch_release
def test_cpulaunch_ddp_ranks_bound_and_equal_to_single(runs):
    """`cpulaunch --ddp --nproc-per-node 2`: each rank on its own core with 1 thread, and
    after the steps its parameters equal one process's on the same global batches."""
    summaries, params = runs["bert_cpulaunch"]
    assert [len(s["cpus"]) for s in summaries] == [1, 1]
    assert [s["threads"] for s in summaries] == [1, 1]
    assert summaries[0]["cpus"] != summaries[1]["cpus"]
    assert all(s["world_size"] == 2 for s in summaries)
    single = runs["bert_single"][1][0]
    assert max_abs_diff(params[0], single) <= 1e-5
    assert max_abs_diff(params[0], params[1]) == 0.0


@pytest.mark.parametrize("model, ddp, single", [
    ("bert", "bert_ddp", "bert_single"),
    ("bert", "bert_ddp_accum2", "bert_single"),  # no_sync accumulation vs the larger batch
    ("cnn", "cnn_ddp", "cnn_single"),
])
def test_ddp_matches_single_process(runs, model, ddp, single):
    ddp_params = runs[ddp][1][0]
    single_params = runs[single][1][0]
    diff = max_abs_diff(ddp_params, single_params)
    moved = max_abs_diff(single_params, initial_state(model))
    print(f"{ddp} vs {single}: max |diff| {diff:.3g} (atol {ATOL_FP32}); "
          f"max update {moved:.3g}")
    assert moved > MIN_UPDATE, "training barely moved the parameters; the test has no power"
    assert diff <= ATOL_FP32
    # The final losses are global-batch means on both sides.
    assert runs[ddp][0][0]["loss"] == pytest.approx(runs[single][0][0]["loss"], abs=1e-4)


#: cnn small with BatchNorm training (not frozen): CNN_ARGS without --freeze-bn.
CNN_BN_ARGS = [a for a in CNN_ARGS if a != "--freeze-bn"]


def test_cnn_sync_bn_matches_single_process(tmp_path):
    """--sync-bn: the 2-rank cnn run, BatchNorm in training mode, equals one process on the
    global batch (parameters, running statistics, num_batches_tracked, per-step global mean
    loss), where the same run without --sync-bn does not (each rank normalises its 4 rows).

    Tolerance 1e-5, as for the other runs (module docstring): the runs differ in the order of
    sums only, now also in the BatchNorm statistics (two 4-row partial results combined vs
    one 8-row pass). Measured here: parameters 6e-8, running statistics 1e-6 (running_var
    entries up to ~40), losses 2e-7; without --sync-bn parameters miss by 4e-3 and running
    statistics by 0.2."""
    single = run_single(CNN_BN_ARGS + ["--save-params", str(tmp_path / "single.pt")])
    runs = {flag: run_two_ranks(TORCHRUN_2, CNN_BN_ARGS + flags + [
                "--save-params", str(tmp_path / f"{flag}.pt")])
            for flag, flags in (("sync", ["--sync-bn"]), ("plain", []))}
    want = load(tmp_path / "single.rank0.pt")
    got = {flag: [load(tmp_path / f"{flag}.rank{r}.pt") for r in (0, 1)] for flag in runs}
    params = [k for k, v in want.items() if v.is_floating_point() and "running" not in k]
    moved = max_abs_diff({k: want[k] for k in params},
                         {k: initial_state("cnn")[k] for k in params})
    assert moved > MIN_UPDATE
    sync, plain = got["sync"], got["plain"]
    assert [s["sync_bn"] for s in runs["sync"]] == [True, True]
    assert [s["sync_bn"] for s in runs["plain"]] + [single["sync_bn"]] == [False] * 3
    assert max_abs_diff(sync[0], sync[1]) == 0.0  # running statistics too
    assert max_abs_diff(sync[0], want) <= ATOL_FP32
    assert max_abs_diff(plain[0], want) > 1e-2
    assert max_abs_diff({k: plain[0][k] for k in params}, {k: want[k] for k in params}) > 1e-3

    def global_losses(summaries):  # equal shards: the mean of the ranks' local means
        return [sum(s["step_losses"][i] for s in summaries) / 2 for i in range(3)]
    assert global_losses(runs["sync"]) == pytest.approx(single["step_losses"], abs=ATOL_FP32)
    assert max(abs(a - b) for a, b in zip(global_losses(runs["plain"]),
                                          single["step_losses"])) > 1e-2


@pytest.mark.parametrize("name", ["bert_ddp", "bert_ddp_accum2", "cnn_ddp"])
def test_ranks_hold_identical_parameters(runs, name):
    summaries, params = runs[name]
    for k in params[0]:
        assert torch.equal(params[0][k], params[1][k]), k
    assert summaries[0]["param_sha256"] == summaries[1]["param_sha256"]


def test_json_summary(runs):
    summaries, _ = runs["bert_ddp"]
    (single,), _ = runs["bert_single"]
    for s in summaries:
        assert s["world_size"] == 2 and s["local_rank"] == s["rank"]
        assert s["backend"] == "gloo"
        assert s["threads"] == 1
        assert s["global_batch_size"] == 8 and s["local_batch_size"] == 4
        assert s["steps"] == 6 and s["timed_steps"] == 5
        assert s["static_graph"] is True  # valid without accumulation
        assert math.isfinite(s["samples_per_s"]) and s["samples_per_s"] > 0
        assert s["global_samples_per_s"] == pytest.approx(2 * s["samples_per_s"])
        # 2 random labels: cross entropy near ln 2 after a few small steps.
        assert 0.3 < s["loss"] < 1.5 and math.isfinite(s["local_loss"])
        assert len(s["param_sha256"]) == 64
        assert s["cpus"] and all(isinstance(c, int) for c in s["cpus"])
    assert summaries[0]["loss"] == summaries[1]["loss"]  # the all-reduced global mean
    assert summaries[0]["local_loss"] != summaries[1]["local_loss"]  # different shards
    assert single["world_size"] == 1 and single["backend"] is None
    assert single["static_graph"] is False and single["local_batch_size"] == 8
    accum = runs["bert_ddp_accum2"][0]
    assert all(s["accum_steps"] == 2 and s["static_graph"] is False for s in accum)


def test_global_batch_must_divide(tmp_path):
    """A global batch that does not split into equal shards is refused before any rendezvous."""
    env = rank_env(WORLD_SIZE="2", RANK="0")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "bert", "--size", "small",
         "--global-batch-size", "6", "--accum-steps", "2"],
        env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 2
    assert "--global-batch-size 6 is not a multiple of world size 2 x --accum-steps 2" \
        in proc.stderr


def test_params_path_names():
    sys.path.insert(0, str(ROOT / "examples"))
    import train_ddp
    assert train_ddp.params_path("out/p.pt", 1) == Path("out/p.rank1.pt")
    assert train_ddp.params_path("p{rank}.pt", 0) == Path("p0.pt")
    assert train_ddp.params_path("p", 2) == Path("p.rank2")


def test_shards_cover_the_global_batch():
    import train_ddp
    t = torch.arange(12)
    rows = [train_ddp.shard(t, m, 2, r, 3).tolist() for m in range(2) for r in range(3)]
    assert sum(rows, []) == list(range(12))
    assert all(len(r) == 2 for r in rows)


def test_comm_hook_run_reports_hook_bytes_and_one_metric_line():
    """--comm-hook powersgd on 2 ranks: ranks stay identical, the JSON names the options and
    the bytes (full fp32 gradients in the 2 warm-up steps, compressed after), and rank 0
    alone prints the job's samples/s as one CPULAUNCH_METRIC line."""
    cmd = [*TORCHRUN_2, sys.executable, str(SCRIPT), *BERT_ARGS, "--steps", "4",
           "--comm-hook", "powersgd", "--start-powersgd-iter", "2", "--no-bucket-view",
           "--json"]
    proc = subprocess.run(cmd, env=rank_env(), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-6000:]
    summaries = sorted(_json_lines(proc.stdout), key=lambda s: s["rank"])
    metrics = [line for line in proc.stdout.splitlines() if "CPULAUNCH_METRIC" in line]
    assert len(metrics) == 1 and metrics[0].startswith("CPULAUNCH_METRIC samples_per_s=")
    assert float(metrics[0].split("=", 1)[1]) == summaries[0]["job_samples_per_s"]
    # The job figure is the slowest rank's: no higher than either rank's own global figure.
    assert summaries[0]["job_samples_per_s"] <= min(s["global_samples_per_s"] for s in summaries)
    nparams = sum(p.numel() for p in initial_state("bert").values())
    for s in summaries:
        assert (s["comm_hook"], s["bucket_view"], s["static_graph"]) == ("powersgd", False, True)
        assert (s["powersgd_rank"], s["start_powersgd_iter"]) == (1, 2)
        assert 0 < s["comm_bytes_last_step"] < nparams * 4
        assert s["comm_bytes_per_step"] == (2 * nparams * 4 + 2 * s["comm_bytes_last_step"]) / 4
    assert summaries[0]["param_sha256"] == summaries[1]["param_sha256"]


@pytest.mark.parametrize("args, message", [
    (["--static-graph", "--accum-steps", "2"],
     "--static-graph cannot be combined with --accum-steps > 1"),
    (["--comm-hook", "fp16", "--local-sgd-period", "3"],
     "--local-sgd-period=3 applies only to --comm-hook 'post-local-sgd', not 'fp16'"),
    (["--comm-hook", "powersgd", "--start-powersgd-iter", "1"],
     "--start-powersgd-iter=1: PowerSGD needs at least 2 plain all-reduce steps first"),
    (["--num-workers", "2"], "--num-workers applies to --data pipeline"),
    (["--model", "bert", "--sync-bn"], "--sync-bn applies to --model cnn; bert has no BatchNorm"),
    (["--sync-bn", "--freeze-bn"], "--sync-bn and --freeze-bn exclude each other"),
    (["--data", "pipeline", "--num-workers", "-1"], "--num-workers must be at least 0, got -1"),
])
def test_option_errors_exit_2(args, message):
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], env=rank_env(),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 2
    assert message in proc.stderr


# --------------------------------------------------------------------------- --data pipeline

#: cnn small through the input pipeline: 3 steps of 8 samples, the first untimed.
PIPELINE_ARGS = ["--model", "cnn", "--size", "small", "--steps", "3", "--global-batch-size", "8",
                 "--seed", "5", "--data", "pipeline", "--digest"]


def test_pipeline_same_batches_and_losses_with_0_and_2_workers():
    """2 DataLoader workers give the very batches (sha256 of every input and target byte)
    and the very losses and parameters of loading in the main process; the JSON says the
    figure is end to end and which workers made the batches."""
    main, workers = (run_single(PIPELINE_ARGS + ["--num-workers", n]) for n in ("0", "2"))
    assert workers["batch_sha256"] == main["batch_sha256"]
    assert len(main["batch_sha256"]) == 64
    assert workers["step_losses"] == main["step_losses"] and len(main["step_losses"]) == 3
    assert workers["param_sha256"] == main["param_sha256"]
    assert (main["num_workers"], workers["num_workers"]) == (0, 2)
    assert main["num_workers_from"] == workers["num_workers_from"] == "--num-workers"
    assert main["loader_workers"] == []
    assert [w["worker"] for w in workers["loader_workers"]] == [0, 1]
    assert all(w["threads"] == 1 for w in workers["loader_workers"])
    assert len({w["pid"] for w in workers["loader_workers"]}) == 2
    for s in (main, workers):
        assert s["data"] == "pipeline" and s["samples_per_s_includes_data"] is True
        assert s["dataloader_cpus"] is None  # no cpulaunch variables: nothing pinned
        assert s["compute_s"] > 0 and s["data_wait_s"] > 0
        # end to end: 2 timed steps x 8 samples over compute + data waits
        assert s["samples_per_s"] == pytest.approx(16 / (s["compute_s"] + s["data_wait_s"]),
                                                   rel=1e-9)
        # each timed step end to end: they add up to what samples/s divides by
        assert len(s["timed_step_s"]) == 2
        assert sum(s["timed_step_s"]) == pytest.approx(s["compute_s"] + s["data_wait_s"], rel=1e-9)


def test_synthetic_figure_excludes_generation():
    """The default (--data synthetic) keeps today's figure: compute seconds only, with the
    generation time reported beside it."""
    s = run_single(["--model", "cnn", "--size", "small", "--steps", "2",
                    "--global-batch-size", "4", "--json"])
    assert s["data"] == "synthetic" and s["samples_per_s_includes_data"] is False
    assert s["samples_per_s"] == pytest.approx(4 / s["compute_s"], rel=1e-9)
    assert s["data_wait_s"] > 0
    (step,) = s["timed_step_s"]  # 2 steps, the first untimed; compute only, like samples/s
    assert step == pytest.approx(s["compute_s"], rel=1e-9)
    assert (s["num_workers"], s["num_workers_from"], s["loader_workers"]) == (None, None, [])
    assert s["batch_sha256"] is None  # only with --digest


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs: 1 compute, 1 loader")
def test_cpulaunch_dataloader_workers_pin_the_pipeline_worker():
    """`cpulaunch --dataloader-workers 1`: train_ddp.py takes its worker count from
    CPULAUNCH_DATALOADER_NUM_WORKERS (no --num-workers given), and the worker, asked from inside
    (os.sched_getaffinity(0) in the batches it collates), runs on exactly the CPU of
    CPULAUNCH_DATALOADER_CPUS, the one the plan set aside, with one torch thread.
    (tests/test_torch_utils.py covers worker_init_fn's rule itself.)"""
    from cpulaunch import cpulist
    env = rank_env()
    del env["OMP_NUM_THREADS"], env["CPULAUNCH_DIST_BACKEND"]
    prefix = [sys.executable, "-m", "cpulaunch", "--dataloader-workers", "1"]
    plan = subprocess.run([*prefix, "--dry-run", "--format", "json", "true"], env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert plan.returncode == 0, plan.stderr
    (instance,) = json.loads(plan.stdout)["instances"]
    reserved = instance["env"]["CPULAUNCH_DATALOADER_CPUS"]
    cmd = [*prefix, sys.executable, str(SCRIPT), "--model", "cnn", "--size", "small",
           "--steps", "2", "--global-batch-size", "4", "--data", "pipeline", "--json"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (s,) = _json_lines(proc.stdout)
    assert (s["num_workers"], s["num_workers_from"]) == (1, "CPULAUNCH_DATALOADER_NUM_WORKERS")
    assert s["dataloader_cpus"] == reserved
    (worker,) = s["loader_workers"]
    assert worker["cpus"] == sorted(cpulist.parse(reserved)) and len(worker["cpus"]) == 1
    assert worker["threads"] == 1
    assert not set(worker["cpus"]) & set(instance["cpus"])  # off the compute CPUs
    assert s["threads"] == len(instance["cpus"])


def test_unusable_reserved_cpu_is_one_line_exit_2():
    """A reserved CPU this process may not use: the worker's error reaches the user as its
    one line (not DataLoader's folded traceback), exit code 2."""
    from cpulaunch import cpulist
    bad = max(os.sched_getaffinity(0)) + 4096
    env = rank_env(CPULAUNCH_DATALOADER_CPUS=str(bad), CPULAUNCH_DATALOADER_NUM_WORKERS="1")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--size", "small", "--steps", "2",
                           "--global-batch-size", "4", "--data", "pipeline"], env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 2
    allowed = cpulist.format(os.sched_getaffinity(0))
    assert proc.stderr.splitlines()[-1] == (
        f"error: DataLoader worker 0 cannot run on CPU {bad} (CPULAUNCH_DATALOADER_CPUS={bad}): "
        f"Invalid argument; this process may use CPUs {allowed}")
    assert "Traceback" not in proc.stderr


def test_pipeline_samples_do_not_depend_on_thread_count():
    """A sample is a function of (seed, index) alone: the same bytes when torch uses 1 or 2
    threads (the main process with --num-workers 0 vs a worker), and a new epoch of the same
    stored image is augmented differently but keeps its label."""
    import train_ddp
    before = torch.get_num_threads()
    items = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            ds = train_ddp.ImagePipeline(length=1000, side=64, num_classes=10, seed=5)
            items[threads] = [ds[i] for i in (0, 1, 7, 64, 130, 999)]
    finally:
        torch.set_num_threads(before)
    images = {t: [image for (image,), _ in items[t]] for t in items}
    labels = {t: [label for _, label in items[t]] for t in items}
    for a, b in zip(images[1], images[2]):
        assert a.shape == (3, 64, 64) and a.dtype == torch.float32
        assert torch.equal(a, b)
    assert labels[1] == labels[2]
    # indices 0 and 64: stored item 0 in epochs 0 and 1
    assert labels[1][0] == labels[1][3] and not torch.equal(images[1][0], images[1][3])


def test_text_pipeline_sample():
    """bert: [CLS] + word pieces (some masked) + [SEP], padding where the text is short,
    the attention mask 1 exactly on the non-padding ids; deterministic per index."""
    import train_ddp
    ds = train_ddp.TextPipeline(length=200, seq_len=32, vocab_size=1000, num_classes=2, seed=1)
    for i in range(0, 200, 7):
        (ids, mask), label = ds[i]
        n = int(mask.sum())
        assert ids.shape == mask.shape == (32,) and ids.dtype == torch.int64
        assert ids[0] == train_ddp.CLS_ID and ids[n - 1] == train_ddp.SEP_ID
        assert torch.equal(mask, (ids != train_ddp.PAD_ID).long())
        assert bool((ids[1:n - 1] >= train_ddp.MASK_ID).all()) and bool((ids < 1000).all())
        assert label in (0, 1)
        (ids2, _), _ = ds[i]
        assert torch.equal(ids, ids2)
    assert ds.tokenize("Kalo, mistrion.") == ds.tokenize("kalo , mistrion .")
    assert len(ds.tokenize("abcdefghij")) == 2  # "abcdef", "##ghij"


@pytest.mark.parametrize("world_size, accum_steps", [(1, 1), (2, 1), (2, 2), (4, 1)])
def test_rank_micro_batches_are_the_shards_of_the_global_batch(world_size, accum_steps):
    """Each rank's DataLoader batches are the rows shard() keeps of step s's global batch
    (stream samples s*G .. s*G+G-1), so any world size trains on the same global batches."""
    import train_ddp
    steps, g = 3, 8
    per_rank = {r: list(train_ddp.RankMicroBatches(
        steps=steps, global_batch_size=g, accum_steps=accum_steps, rank=r,
        world_size=world_size)) for r in range(world_size)}
    for r, batches in per_rank.items():
        assert len(batches) == steps * accum_steps
        for step in range(steps):
            stream = torch.arange(step * g, (step + 1) * g)
            for micro in range(accum_steps):
                expected = train_ddp.shard(stream, micro, accum_steps, r, world_size).tolist()
                assert batches[step * accum_steps + micro] == expected
    every = sorted(i for batches in per_rank.values() for b in batches for i in b)
    assert every == list(range(steps * g))


def test_worker_count_precedence():
    """--num-workers wins over CPULAUNCH_DATALOADER_NUM_WORKERS; cpulaunch's reserved CPUs still
    pin the workers (worker_init_fn); without cpulaunch's variables nothing is pinned."""
    import train_ddp
    from cpulaunch.torch_utils import DataloaderEnvError, worker_init_fn
    env = {"CPULAUNCH_DATALOADER_NUM_WORKERS": "1", "CPULAUNCH_DATALOADER_CPUS": "1"}
    assert train_ddp.loader_settings(None, {}) == (
        {"num_workers": 0, "persistent_workers": False}, "default")
    assert train_ddp.loader_settings(2, {}) == (
        {"num_workers": 2, "persistent_workers": True}, "--num-workers")
    assert train_ddp.loader_settings(None, env) == (
        {"num_workers": 1, "persistent_workers": True, "worker_init_fn": worker_init_fn},
        "CPULAUNCH_DATALOADER_NUM_WORKERS")
    assert train_ddp.loader_settings(3, env) == (
        {"num_workers": 3, "persistent_workers": True, "worker_init_fn": worker_init_fn},
        "--num-workers")
    assert train_ddp.loader_settings(0, env) == (
        {"num_workers": 0, "persistent_workers": False}, "--num-workers")
    with pytest.raises(DataloaderEnvError, match="CPULAUNCH_DATALOADER_NUM_WORKERS is 'x'"):
        train_ddp.loader_settings(None, {"CPULAUNCH_DATALOADER_NUM_WORKERS": "x"})


def test_amp_is_bf16_autocast_on_a_bf16_cpu_else_a_one_line_refusal():
    """--amp by this machine's /proc/cpuinfo (issue 25): on a CPU with avx512_bf16 or amx_bf16
    the run trains under bf16 autocast (the JSON says bf16 and amp); elsewhere it stops before
    training with exit 2 and one line naming the measured slowdown. --bf16 forces autocast."""
    from cpulaunch.runtime.amp import amp_refusal
    from cpulaunch.runtime.inference import Bf16Support, host_bf16_support

    support = host_bf16_support()
    flags = Path("/proc/cpuinfo").read_text()
    assert (support is Bf16Support.NATIVE) == any(
        line.startswith("flags") and {"avx512_bf16", "amx_bf16"} & set(line.split()) for line in flags.splitlines())
    args = ["--model", "cnn", "--size", "small", "--steps", "2", "--global-batch-size", "4", "--json"]
    proc = subprocess.run([sys.executable, str(SCRIPT), *args, "--amp"], env=rank_env(), capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S)
    if support is Bf16Support.NATIVE:
        assert proc.returncode == 0, proc.stderr[-3000:]
        (summary,) = _json_lines(proc.stdout)
        assert (summary["bf16"], summary["amp"]) == (True, True)
    else:
        assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"error: {amp_refusal(support)}\n")
    forced = subprocess.run([sys.executable, str(SCRIPT), *args, "--amp", "--bf16"], env=rank_env(),
                            capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert forced.returncode == 0, forced.stderr[-3000:]
    (summary,) = _json_lines(forced.stdout)
    assert (summary["bf16"], summary["amp"]) == (True, True)
