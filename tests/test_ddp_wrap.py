"""cpulaunch.ddp_wrap: every comm hook run for real on 2 gloo ranks, plus the refusals.

One torchrun launch (``--standalone --nproc-per-node 2``, gloo, OMP_NUM_THREADS=1) runs this
very file as the rank program (:func:`rank_main`): each rank trains the same tiny MLP from the
same initial weights under every configuration in turn, on its own shard of the same global
batches, and saves the flat parameter vector after every step, the bytes each step
all-reduces by :meth:`comm_bytes`, PowerSGD's own counters, and the one-line messages of the
error cases. The tests below only read those files, so one launch (about 10 s here) serves
them all.

What the tolerances rest on (measured here, 2 ranks, SGD lr 0.05, 6 steps, updates of
about 3e-2):

- Lossless options (bucket view on or off, static_graph, no_sync accumulation vs the same
  gradient, post-local SGD with groups spanning the world, every warm-up step): bit-identical
  to plain DDP. With 2 ranks the order of DDP's divide-by-world-size does not matter (a
  division by 2 is exact), so equality is exact, not approximate.
- Ranks hold bit-identical parameters under every gradient hook: gloo hands every rank the
  same reduced bytes, and PowerSGD decompresses from the all-reduced P and Q only.
- fp16 / bf16 compression round each gradient element (after the division by world size)
  to nearest with 11 / 8 significant bits: a relative error of at most u = 2**-11 / 2**-8
  (half an ulp is 2**-12 / 2**-9; u leaves a factor 2). A parameter's update in a step is
  lr x its gradient, so its error in that step is at most u x that step's update, and over
  the run at most u x (sum over steps of plain DDP's largest per-element update). The
  tolerance is twice that bound, the second factor 2 for the slightly different trajectory
  that compressed gradients lead to. Measured here: fp16 5.1e-6 and bf16 8.4e-5, against
  tolerances of 6e-5 and 4.8e-4.
- PowerSGD rank 1 is a lossy low-rank approximation whose effect is of the order of the
  update itself (not a small perturbation), so its check is that it moves parameters by
  less than plain DDP's whole update of the compressed phase (measured 3.2e-3 vs 9.8e-3),
  that the warm-up steps are exact, and that ranks stay identical.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = 6
LR = 0.05
SEED = 7
#: The tiny model: Linear(32, 64) - ReLU - Linear(64, 64) - ReLU - Linear(64, 4).
PARAM_SHAPES = [(64, 32), (64,), (64, 64), (64,), (4, 64), (4,)]
NUMEL = sum(math.prod(s) for s in PARAM_SHAPES)  # 6532
POWERSGD_START = 3
LOCAL_SGD_WARMUP = 2
LOCAL_SGD_PERIOD = 2
#: Unit roundoff of the compressed dtypes, with a factor 2 of margin (see the docstring).
ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}

#: name -> keyword arguments of wrap_ddp (None: plain torch DDP, the reference).
CONFIGS = {
    "reference": None,
    "none": {},
    "no-bucket-view": {"gradient_as_bucket_view": False},
    "static-graph": {"static_graph": True},
    "fp16": {"comm_hook": "fp16"},
    "bf16": {"comm_hook": "bf16"},
    "powersgd": {"comm_hook": "powersgd", "start_powersgd_iter": POWERSGD_START},
    "powersgd+fp16": {"comm_hook": "powersgd+fp16", "start_powersgd_iter": POWERSGD_START},
    "post-local-sgd": {"comm_hook": "post-local-sgd", "warmup_steps": LOCAL_SGD_WARMUP,
                       "local_sgd_period": LOCAL_SGD_PERIOD},
    "post-local-sgd-group2": {"comm_hook": "post-local-sgd", "warmup_steps": LOCAL_SGD_WARMUP,
                              "local_sgd_period": LOCAL_SGD_PERIOD, "local_group_size": 2},
}
LOSSLESS = ("none", "no-bucket-view", "static-graph", "post-local-sgd-group2")


# --------------------------------------------------------------------------- rank program

def _model():
    import torch
    from torch import nn

    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 4))


def _batch(step: int, micro: int, rank: int):
    """This rank's shard of global batch ``step`` (micro-batch ``micro``): 8 rows."""
    import torch

    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    return torch.randn(8, 32, generator=g), torch.randint(0, 4, (8,), generator=g)


def _flat(model):
    import torch

    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def _train(name: str, kwargs, rank: int) -> dict:
    """Train one configuration for STEPS steps; return what the tests read."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from cpulaunch.ddp_wrap import wrap_ddp

    model = _model()
    if kwargs is None:
        ddp = DistributedDataParallel(model)
    else:
        ddp = wrap_ddp(model, bucket_cap_mb=0.01, **kwargs)  # small buckets: several
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    out = {"params": [_flat(model)], "bytes": [], "averaged": []}
    for step in range(STEPS):
        x, y = _batch(step, 0, rank)
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        if kwargs is not None:
            out["averaged"].append(ddp.after_step())
            out["bytes"].append(ddp.comm_bytes(step))
        opt.zero_grad(set_to_none=True)
        out["params"].append(_flat(model))
    if kwargs is not None:
        out["bucket_bytes_cap"] = ddp.bucket_bytes_cap
        state = ddp.comm_hook_state
        if state is not None and hasattr(state, "compression_stats"):
            out["powersgd_numel_after"] = state.compression_stats()[2]
    return out


def _accumulate(rank: int, with_no_sync: bool) -> dict:
    """Two micro-batches per step, the first under no_sync(); loss halved per micro-batch."""
    import torch
    from torch import nn

    from cpulaunch.ddp_wrap import wrap_ddp

    model = _model()
    ddp = wrap_ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(3):
        for micro in range(2):
            x, y = _batch(step, micro, rank)
            ctx = ddp.no_sync() if (micro == 0 and with_no_sync) else _null()
            with ctx:
                (nn.functional.cross_entropy(ddp(x), y) / 2).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"params": [_flat(model)]}


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def _error(fn) -> str:
    """Call ``fn``; return ``"<ExceptionType>: <message>"`` or "no error"."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the type is recorded and asserted
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _errors(rank: int) -> dict:
    """The refusals, raised in a live 2-rank gloo group; the group stays usable after."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from cpulaunch.ddp_wrap import DDPOptionError, check_allreduce_dtype, wrap_ddp

    out = {}
    static = wrap_ddp(_model(), static_graph=True)
    out["static_no_sync"] = _error(lambda: static.no_sync())
    out["float8"] = _error(lambda: check_allreduce_dtype(torch.float8_e4m3fn))
    out["batched"] = _error(lambda: wrap_ddp(_model(), comm_hook="powersgd-batched",
                                             start_powersgd_iter=2))
    out["group3"] = _error(lambda: wrap_ddp(_model(), comm_hook="post-local-sgd",
                                            local_group_size=3))
    out["unknown"] = _error(lambda: wrap_ddp(_model(), comm_hook="fp8"))

    def averaging_after_zero_grad():
        model = _model()
        ddp = wrap_ddp(model, comm_hook="post-local-sgd", warmup_steps=0)
        x, y = _batch(0, 0, rank)
        nn.functional.cross_entropy(ddp(x), y).backward()
        model.zero_grad(set_to_none=True)
        ddp.after_step()
    out["after_zero_grad"] = _error(averaging_after_zero_grad)
    out["is_option_error"] = issubclass(DDPOptionError, ValueError)
    t = torch.ones(1)
    dist.all_reduce(t)
    out["group_alive"] = t.item()
    return out


def rank_main(out_dir: str) -> int:
    """The rank program: every configuration, then the error cases; one file per rank."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = {name: _train(name, kwargs, rank) for name, kwargs in CONFIGS.items()}
    results["accum-no-sync"] = _accumulate(rank, with_no_sync=True)
    results["accum-sync"] = _accumulate(rank, with_no_sync=False)
    results["errors"] = _errors(rank)
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":  # run by torchrun in the fixture below
    sys.path.insert(0, str(ROOT))
    sys.exit(rank_main(sys.argv[1]))


# --------------------------------------------------------------------------- tests

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """The two ranks' results of one torchrun launch of :func:`rank_main`."""
    out = tmp_path_factory.mktemp("ddp_wrap")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", str(Path(__file__).resolve()), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stderr[-6000:]}"
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


def maxdiff(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


def test_training_moves_the_parameters(ranks):
    """The power of the comparisons below: plain DDP's 6 steps move parameters by far more
    than any tolerance used."""
    ref = ranks[0]["reference"]["params"]
    assert maxdiff(ref[-1], ref[0]) > 1e-2
    assert maxdiff(ref[1], ref[0]) > 1e-3


@pytest.mark.parametrize("name", [n for n in CONFIGS if n != "post-local-sgd"])
def test_ranks_stay_identical(ranks, name):
    """Every gradient hook keeps the replicas bit-identical after every step (post-local SGD
    with groups of 1 lets them drift on purpose: test_post_local_sgd_...)."""
    for step, (a, b) in enumerate(zip(ranks[0][name]["params"], ranks[1][name]["params"])):
        assert torch.equal(a, b), f"{name}: ranks differ after step {step}"


@pytest.mark.parametrize("name", LOSSLESS)
def test_lossless_options_equal_plain_ddp(ranks, name):
    ref = ranks[0]["reference"]["params"]
    for step, p in enumerate(ranks[0][name]["params"]):
        assert torch.equal(p, ref[step]), f"{name} differs from plain DDP after step {step}"


def compression_tolerance(ref: list, roundoff: float) -> float:
    """2 x roundoff x the sum over steps of plain DDP's largest per-element update."""
    return 2 * roundoff * sum(maxdiff(ref[t + 1], ref[t]) for t in range(len(ref) - 1))


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_compressed_within_tolerance(ranks, name):
    ref = ranks[0]["reference"]["params"]
    got = ranks[0][name]["params"]
    atol = compression_tolerance(ref, ROUNDOFF[name])
    diff = maxdiff(got[-1], ref[-1])
    print(f"{name}: max |diff| vs plain DDP after {STEPS} steps {diff:.3g} (atol {atol:.3g})")
    assert 0 < diff <= atol  # 0 would mean the hook did not compress at all


def test_bf16_coarser_than_fp16(ranks):
    """bf16 keeps 8 significant bits, fp16 11: on gradients of this size bf16's rounding is
    the larger one (shows that each hook really communicates in its own dtype)."""
    ref = ranks[0]["reference"]["params"][-1]
    assert maxdiff(ranks[0]["bf16"]["params"][-1], ref) > \
        maxdiff(ranks[0]["fp16"]["params"][-1], ref)


def test_powersgd_warmup_exact_then_compressed(ranks):
    ref = ranks[0]["reference"]["params"]
    got = ranks[0]["powersgd"]["params"]
    for step in range(POWERSGD_START + 1):  # initial state + the plain all-reduce steps
        assert torch.equal(got[step], ref[step]), f"warm-up step {step} not exact"
    diff = maxdiff(got[-1], ref[-1])
    update = maxdiff(ref[-1], ref[POWERSGD_START])
    print(f"powersgd: max |diff| vs plain DDP {diff:.3g}; plain DDP's compressed-phase "
          f"update {update:.3g}")
    assert 0 < diff < update


def test_powersgd_fp16_warmup_is_compressed(ranks):
    """The fp16 wrapper casts every step, the warm-up too: not exact from step 1 on."""
    ref = ranks[0]["reference"]["params"]
    got = ranks[0]["powersgd+fp16"]["params"]
    assert torch.equal(got[0], ref[0])
    assert 0 < maxdiff(got[1], ref[1]) <= compression_tolerance(ref[:2], ROUNDOFF["fp16"])


def test_post_local_sgd_ranks_equal_after_averaging(ranks):
    """Warm-up steps 0-1: global all-reduce, equal to plain DDP. Then each rank trains on
    its own, and every 2nd step (2, 4) after_step averages: ranks equal right after it and
    apart after a local step."""
    a, b = ranks[0]["post-local-sgd"], ranks[1]["post-local-sgd"]
    ref = ranks[0]["reference"]["params"]
    assert a["averaged"] == [False, False, True, False, True, False]
    assert a["averaged"] == b["averaged"]
    for step in range(STEPS):
        p, q = a["params"][step + 1], b["params"][step + 1]
        if step < LOCAL_SGD_WARMUP:
            assert torch.equal(p, ref[step + 1]) and torch.equal(q, p), step
        elif a["averaged"][step]:
            assert torch.equal(p, q), f"ranks differ right after averaging step {step}"
        else:
            assert maxdiff(p, q) > 1e-4, f"step {step} was local, yet ranks are equal"


def test_accumulation_with_no_sync_equals_synced(ranks):
    """no_sync() on the first micro-batch (static_graph off) gives the same parameters as
    all-reducing both micro-batches, up to summation order (1e-7), and ranks stay equal."""
    ns, s = ranks[0]["accum-no-sync"]["params"][-1], ranks[0]["accum-sync"]["params"][-1]
    assert maxdiff(ns, s) <= 1e-6
    assert torch.equal(ns, ranks[1]["accum-no-sync"]["params"][-1])


def test_comm_bytes_per_step(ranks):
    """Analytic payloads, checked against hand-computed values for this model and against
    PowerSGD's own counters (compression_stats)."""
    full = NUMEL * 4
    r = ranks[0]
    assert NUMEL == 6532
    assert r["none"]["bytes"] == [full] * STEPS
    assert r["static-graph"]["bytes"] == [full] * STEPS
    assert r["fp16"]["bytes"] == r["bf16"]["bytes"] == [NUMEL * 2] * STEPS
    # Rank 1 PowerSGD: W1 64x32 -> 64+32; W2 64x64 -> 128; W3 4x64 -> 68; biases 64+64+4.
    compressed = 96 + 128 + 68 + 64 + 64 + 4
    assert r["powersgd"]["bytes"] == [full] * POWERSGD_START + \
        [compressed * 4] * (STEPS - POWERSGD_START)
    assert r["powersgd+fp16"]["bytes"] == [NUMEL * 2] * POWERSGD_START + \
        [compressed * 2] * (STEPS - POWERSGD_START)
    assert r["powersgd"]["powersgd_numel_after"] == compressed * (STEPS - POWERSGD_START)
    # post-local SGD, groups of 1: warm-up full, then nothing but the averaging steps.
    assert r["post-local-sgd"]["bytes"] == [full, full, full, 0, full, 0]
    assert r["post-local-sgd-group2"]["bytes"] == [full, full, 2 * full, full, 2 * full, full]


def test_ddp_kwargs_pass_through(ranks):
    assert ranks[0]["none"]["bucket_bytes_cap"] == int(0.01 * 1024 * 1024)


def test_errors_in_a_live_group(ranks):
    for r in ranks:
        e = r["errors"]
        assert e["static_no_sync"].startswith("DDPOptionError: no_sync() with static_graph=True")
        assert "pytorch/pytorch#143580" in e["static_no_sync"]
        assert e["float8"].startswith("DDPOptionError: backend 'gloo' cannot all-reduce "
                                      "torch.float8_e4m3fn")
        assert e["batched"].startswith("DDPOptionError: comm_hook 'powersgd-batched': torch ")
        assert e["batched"].endswith("; use 'powersgd'")
        assert e["group3"] == ("DDPOptionError: local_group_size=3 does not divide the world "
                               "size 2; use a divisor of 2 (1: pure local SGD)")
        assert e["unknown"] == ("DDPOptionError: comm_hook 'fp8' is not one of: none, fp16, "
                                "bf16, powersgd, powersgd+fp16, powersgd-batched, "
                                "post-local-sgd")
        assert e["after_zero_grad"].startswith("DDPOptionError: after_step() found no gradients")
        assert e["is_option_error"] is True
        assert e["group_alive"] == 2.0
        assert all("\n" not in v for v in e.values() if isinstance(v, str))


# ------------------------------------------------------------ pure checks (no process group)

def test_import_does_not_import_torch():
    code = "import sys, cpulaunch.ddp_wrap; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("kwargs, message", [
    ({"comm_hook": "powersgd", "start_powersgd_iter": 1},
     "start_powersgd_iter=1: PowerSGD needs at least 2 plain all-reduce steps first"),
    ({"comm_hook": "fp16", "local_sgd_period": 8},
     "local_sgd_period=8 applies only to comm_hook 'post-local-sgd', not 'fp16'"),
    ({"comm_hook": "none", "powersgd_rank": 2},
     "powersgd_rank=2 applies only to comm_hook 'powersgd' / 'powersgd+fp16' / "
     "'powersgd-batched', not 'none'"),
    ({"comm_hook": "post-local-sgd", "warmup_steps": -1}, "warmup_steps must be at least 0, got -1"),
    ({"comm_hook": "powersgd", "powersgd_rank": 0}, "powersgd_rank must be at least 1, got 0"),
    ({"comm_hook": "powersgd", "powersgd_rank": 1.5}, "powersgd_rank must be an integer, got 1.5"),
])
def test_option_errors_before_any_collective(kwargs, message):
    """Option errors need no process group: they are raised before DDP is built."""
    from cpulaunch.ddp_wrap import DDPOptionError, wrap_ddp
    from cpulaunch.errors import CpulaunchError

    with pytest.raises(DDPOptionError) as info:
        wrap_ddp(torch.nn.Linear(2, 2), **kwargs)
    assert str(info.value).startswith(message)
    assert isinstance(info.value, CpulaunchError) and "\n" not in str(info.value)


def test_resolve_options_defaults():
    from cpulaunch.ddp_wrap import DDPOptions, resolve_options

    assert resolve_options("powersgd") == DDPOptions(
        comm_hook="powersgd", powersgd_rank=1, start_powersgd_iter=1000)
    assert resolve_options("post-local-sgd", static_graph=True) == DDPOptions(
        comm_hook="post-local-sgd", static_graph=True, local_sgd_period=4,
        warmup_steps=1000, local_group_size=1)
    assert resolve_options() == DDPOptions()


@pytest.mark.parametrize("shape, rank, elements", [
    ((64, 32), 1, 96), ((64,), 1, 64), ((4, 4), 1, 16), ((64, 64), 4, 512),
    ((16, 3, 3, 3), 1, 43),  # a conv weight is 16 x 27: (16 + 27) x 2 = 86 < 432
])
def test_powersgd_payload_elements(shape, rank, elements):
    from cpulaunch.ddp_wrap import powersgd_payload_elements

    assert powersgd_payload_elements(shape, rank) == elements


def test_registry_documents_every_hook():
    from cpulaunch.ddp_wrap import COMM_HOOKS

    assert list(COMM_HOOKS) == ["none", "fp16", "bf16", "powersgd", "powersgd+fp16",
                                "powersgd-batched", "post-local-sgd"]
    for h in COMM_HOOKS.values():
        assert h.source and h.payload and h.memory and h.cpu_gloo
    assert [h.name for h in COMM_HOOKS.values() if h.lossless] == ["none"]
    assert "error-feedback" in COMM_HOOKS["powersgd"].memory
