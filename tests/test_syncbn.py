"""cpulaunch.distributed.convert_sync_batchnorm: synchronized BatchNorm on CPU (issue 25, 2).

The definition (torch's ``nn.SyncBatchNorm`` docs): with W ranks, training-mode BatchNorm
uses the statistics of the global batch, the concatenation of every rank's batch. So each
case below is checked against one process's plain ``nn.BatchNorm*d`` on that concatenated
batch (:func:`syncbn_ranks.reference`): outputs and grad_input (each rank's rows), the sum
over ranks of grad_weight / grad_bias (each rank keeps its local sums; DDP adds them),
running_mean, running_var and num_batches_tracked, after each of 3 training steps and one
eval step. Two torchrun launches (2 and 3 gloo ranks) of tests/syncbn_ranks.py produce every
rank's results; the tests only read them.

Tolerance 1e-5 (absolute, fp32), the issue's: measured here, the largest difference over
all cases is 5e-6 (a grad_weight summing about 60 products of size ~5), the outputs and
running statistics 1e-6; the controls (each rank's own plain BatchNorm) miss by more than
1e-2, so the comparisons can tell them apart. The bf16-input case is compared to plain
BatchNorm on the same bf16 input: both compute in fp32 and round to bf16 once, so the
outputs may differ by one bf16 unit in the last place (2**-7 relative to the largest
value; measured: equal).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import syncbn_ranks as R  # noqa: E402

from cpulaunch.distributed import SyncBatchNorm, convert_sync_batchnorm  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ATOL = 1e-5
#: One bf16 unit in the last place relative to the largest magnitude (see the docstring).
BF16_REL = 2.0 ** -7
TRAIN = {"all_gather": 1, "all_reduce": 1}
NONE = {"all_gather": 0, "all_reduce": 0}

pytestmark = pytest.mark.slow


def _launch(out: Path, world: int) -> list[dict]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(world), str(Path(R.__file__)), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stderr[-6000:]}"
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """world size -> every rank's results; each job launched once, when first needed."""
    cache: dict[int, list[dict]] = {}

    def get(world: int) -> list[dict]:
        if world not in cache:
            cache[world] = _launch(tmp_path_factory.mktemp(f"syncbn{world}"), world)
        return cache[world]
    return get


def maxdiff(a, b) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def _tol(case: R.Case, ref) -> float:
    if case.dtype == "bfloat16":
        return BF16_REL * ref.abs().max().item()
    return ATOL


@pytest.mark.parametrize("name", list(R.CASES))
def test_equals_plain_batchnorm_on_the_global_batch(jobs, name):
    case = R.CASES[name]
    ranks = jobs(case.world)
    ref = R.reference(case)
    for step in range(R.TRAIN_STEPS + 1):
        train = step < R.TRAIN_STEPS
        for rank, res in enumerate(ranks):
            got, sl = res[name], R.rows(case, rank)
            want_y = ref["y"][step][sl]
            if not train and not case.track_running_stats:
                # eval without running statistics: each rank's own batch, as torch's class.
                want_y = res[name + ":plain"]["y"][step]
            assert maxdiff(got["y"][step], want_y) <= _tol(case, want_y), (step, rank)
            assert got["collectives"][step] == (TRAIN if train else NONE), (step, rank)
            if train:
                want_gi = ref["grad_input"][step][sl]
                assert maxdiff(got["grad_input"][step], want_gi) <= _tol(case, want_gi)
            for buf in ("running_mean", "running_var"):
                if case.track_running_stats:
                    assert maxdiff(got[buf][step], ref[buf][step]) <= ATOL, (buf, step, rank)
                else:
                    assert got[buf][step] is None
            if case.track_running_stats:
                assert got["num_batches_tracked"][step].item() == min(step + 1, R.TRAIN_STEPS)
        if train and case.affine:
            for g in ("grad_weight", "grad_bias"):
                total = sum(res[name][g][step] for res in ranks)
                assert maxdiff(total, ref[g][step]) <= ATOL, (g, step)
        elif not case.affine:
            assert all(res[name]["grad_weight"][step] is None for res in ranks)


def test_running_stats_moved(jobs):
    """The power of the running-statistics checks: 3 steps move them well past 1e-5, with
    momentum 0.1 and with the cumulative average of momentum=None."""
    for name in ("bn2d", "bn2d_momentum_none"):
        ref = R.reference(R.CASES[name])
        start = R.make_bn(R.CASES[name])
        assert maxdiff(ref["running_mean"][-1], start.running_mean) > 0.1
        assert maxdiff(ref["running_var"][-1], start.running_var) > 0.1


@pytest.mark.parametrize("name", [n for n, c in R.CASES.items()
                                  if sum(1 for s in c.sizes if s) > 1])
def test_control_per_rank_batchnorm_does_not_match(jobs, name):
    """Without the feature (each rank's plain BatchNorm on its own rows) the outputs differ
    from the global-batch reference by far more than the tolerance, or training fails
    outright for a rank holding 1 row of (N, C) input."""
    case = R.CASES[name]
    ranks = jobs(case.world)
    ref = R.reference(case)
    misses = []
    for rank, res in enumerate(ranks):
        plain = res[name + ":plain"]
        if isinstance(plain, str):
            assert plain.startswith("ValueError: Expected more than 1 value per channel")
            misses.append(float("inf"))
        elif case.sizes[rank]:
            misses.append(maxdiff(plain["y"][0], ref["y"][0][R.rows(case, rank)]))
    assert max(misses) > 1e-2


def test_global_batch_of_one_value_raises_on_every_rank(jobs):
    """1 row over both ranks (1 + 0): BatchNorm's own ValueError, on both ranks alike
    (after the one all_gather, so neither waits for the other), and the group still works."""
    ranks = jobs(2)
    for rank, res in enumerate(ranks):
        shape = "[1, 3]" if rank == 0 else "[0, 3]"
        assert res["global_one_value"] == (
            "ValueError: Expected more than 1 value per channel when training, got 1 over "
            f"the process group's global batch (this rank's input size torch.Size({shape}))")
        assert res["group_alive_after_error"] == 2.0


def _float_items(state: dict) -> dict:
    return {k: v for k, v in state.items() if v.is_floating_point()}


def test_ddp_training_with_sync_bn_equals_single_process(jobs):
    """wrap_ddp(sync_batchnorm=True) on 2 ranks, 4 SGD steps of a conv net with BatchNorm2d
    and BatchNorm1d: parameters and running statistics equal across ranks (bit for bit) and
    equal to one process training on the global batch (DDP averages the ranks' mean-loss
    gradients; with equal shards that is the global mean loss's gradient). Tolerance 1e-5:
    measured 2.4e-7 (summation order); plain per-rank BatchNorm misses by 7e-2."""
    ranks = jobs(2)
    single = R.train_net(R.conv_net(), 0, 1)
    start = _float_items(R.conv_net().state_dict())
    assert ranks[0]["wrap_ddp_bn_types"] == ["cpulaunch.runtime.syncbn.SyncBatchNorm"]
    assert ranks[0]["wrap_ddp_plain_bn_types"] == ["BatchNorm1d", "BatchNorm2d"]
    for step in range(R.DDP_STEPS):
        want = single[step]
        for k in want:
            assert torch.equal(ranks[0]["ddp_sync"][step][k], ranks[1]["ddp_sync"][step][k]), k
            assert maxdiff(ranks[0]["ddp_sync"][step][k], want[k]) <= ATOL, (step, k)
    # power: training moved the weights, and without sync BN the result is another one.
    assert max(maxdiff(single[-1][k], v) for k, v in start.items()) > 0.1
    plain = ranks[0]["ddp_plain"][-1]
    assert max(maxdiff(plain[k], single[-1][k]) for k in start) > 1e-2


# ------------------------------------------------------------------ in one process, no group

def _nested():
    torch.manual_seed(3)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4),
        nn.Sequential(nn.Conv1d(4, 4, 1), nn.BatchNorm1d(4, momentum=None, affine=False),
                      nn.SyncBatchNorm(4, eps=1e-3, track_running_stats=False)),
        nn.ModuleDict({"deep": nn.Sequential(nn.BatchNorm3d(2, momentum=0.3))}),
        nn.InstanceNorm2d(4), nn.LayerNorm(4))
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            if m.affine:
                with torch.no_grad():
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-1, 1)
            if m.track_running_stats:
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 1.5)
                m.num_batches_tracked.fill_(7)
    return model


def test_convert_nested_model_keeps_everything():
    model = _nested()
    before = {n: type(m) for n, m in model.named_modules()}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model[1].weight.requires_grad_(False)
    model[1].qconfig = "a-qconfig"
    model[2][2].eval()
    weight = model[1].weight
    out = convert_sync_batchnorm(model, process_group="pg")
    assert out is model
    for name, m in out.named_modules():
        if issubclass(before[name], nn.modules.batchnorm._BatchNorm):
            assert type(m) is SyncBatchNorm, name
            assert m.process_group == "pg"
        else:
            assert type(m) is before[name], name
    assert out[1].weight is weight and out[1].weight.requires_grad is False
    assert out[2][0].weight.requires_grad is True
    assert out[1].qconfig == "a-qconfig" and not hasattr(out[2][1], "qconfig")
    assert [out[2][2].training, out[1].training] == [False, True]
    assert (out[2][1].momentum, out[2][1].affine, out[2][1].weight) == (None, False, None)
    assert (out[2][2].eps, out[2][2].track_running_stats) == (1e-3, False)
    assert out[2][2].running_mean is None and out[3]["deep"][0].momentum == 0.3
    after = out.state_dict()
    assert after.keys() == state.keys()
    for k, v in state.items():
        assert torch.equal(after[k], v), k


def test_convert_root_batchnorm_returns_the_new_layer():
    bn = nn.BatchNorm1d(3, bias=False)
    out = convert_sync_batchnorm(bn)
    assert type(out) is SyncBatchNorm and out is not bn
    assert out.bias is None and out.weight is bn.weight and out.process_group is None


def test_without_process_group_it_is_plain_batchnorm():
    """No initialised process group (one process): exactly nn.BatchNorm2d, training and eval,
    running statistics included."""
    torch.manual_seed(0)
    plain = nn.BatchNorm2d(3, momentum=None)
    sync = convert_sync_batchnorm(nn.BatchNorm2d(3, momentum=None))
    for train in (True, True, False):
        plain.train(train)
        sync.train(train)
        x = torch.randn(4, 3, 2, 2) * 3 + 1
        assert torch.equal(plain(x), sync(x))
    assert torch.equal(plain.running_var, sync.running_var)
    assert sync.num_batches_tracked.item() == 2


def test_refusals():
    with pytest.raises(ValueError, match=r"expected at least 2D input \(got 1D input\)"):
        SyncBatchNorm(3)(torch.randn(3))
    with pytest.raises(ValueError, match="has not inferred num_features yet"):
        convert_sync_batchnorm(nn.Sequential(nn.LazyBatchNorm1d()))
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        SyncBatchNorm(3)(torch.randn(1, 3))


def test_launch_path_stays_free_of_torch():
    """``cpulaunch.distributed`` gives the names without importing torch until they are asked for."""
    code = ("import sys, cpulaunch.distributed as d; assert 'torch' not in sys.modules; "
            "f = d.convert_sync_batchnorm; assert 'torch' in sys.modules; "
            "print(f.__module__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "cpulaunch.runtime.syncbn"
