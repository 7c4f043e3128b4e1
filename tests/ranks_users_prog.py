"""The training programs users bring, as small as they come: Lightning and accelerate ranks.

Run by tests/test_ranks_users.py and scripts/exit_abort_rate.py under ``cpulaunch --ddp``
(never collected by pytest: the name does not start with ``test_``). Each rank prints one
JSON line (tag "ranks_users") with the framework's view of its place in the job and the
variables the launcher gave it, after an all-reduce over every rank has gone through.

``lightning``: ``Trainer(num_nodes=N, devices=D, strategy=..., accelerator="cpu")`` fits a
linear model for ``--steps`` steps on random data. Lightning's DDP strategy never calls
``destroy_process_group()``, so the process ends with gloo's process group alive (the
exit-time abort of issue 24 item 8). ``--strategy post-local-sgd`` is Lightning's
post-local SGD recipe (``DDPStrategy(ddp_comm_state=PostLocalSGDState(...),
ddp_comm_hook=post_localSGD_hook, model_averaging_period=...)``): on CPU Lightning does not
register the hook, but it still averages the model periodically.

``accelerate``: ``PartialState(cpu=True)`` (accelerate's MULTI_CPU from the environment),
then an all-reduce of (process index + 1) through torch.distributed.

``gloo``: the cheapest program that leaves the process group alive at exit: init, a few
all-reduces, no destroy_process_group().

``ending --end normal|raise|destroyed|exit3|fork``: one all-reduce, then the program ends
that way; every ``destroy_process_group`` call is reported (tag "destroy_process_group").

``exit-race --signal-dir DIR``: the exit-time abort of issue 24 item 8, made certain
instead of rare. It comes from a gloo worker thread that drops its last reference to a
finished collective after the main thread has begun to finalize the interpreter: the work's
tensor has a Python object, the release takes the GIL, a finalizing interpreter ends the
thread by unwinding it through a noexcept destructor, and std::terminate() aborts the rank
("terminate called without an active exception", SIGABRT). Normally the release follows the
collective by microseconds, so the abort is rare. Here rank 0's last exit handler leaves an
all-reduce to the worker and tells rank 1 (a file in DIR) to join it; from then on rank 0's
main thread keeps the GIL (bytecode only, an hour's switch interval) until rank 1 says it
is done (a byte of a file both map: no system call) and a moment more, then returns into
finalization, where the waiting worker is ended. Without anything ending the group before
finalization rank 0 aborts every time; when something destroys it in an exit handler that
runs later (cpulaunch's, registered before the program's), ``~ProcessGroupGloo`` lets go of
the GIL, the worker finishes while the interpreter is alive, and both ranks exit 0. The
second byte of DIR/flags says whether rank 0 did hold the GIL into finalization (1) or gave
up waiting for rank 1 after 60 s (2: a machine too busy for rank 1 to join; 5 s was not
enough on a loaded 2-CPU machine): only 1 is a test of the race. ``--init cpulaunch``
initialises with cpulaunch.distributed.init_process_group instead of torch's.
``--destroyed``: rank 0 calls destroy_process_group() after that last all-reduce while a
reference cycle still holds the group (issue 25: a DDP model does); the group and its
worker then outlive the call, and the abort comes all the same unless something collects
the cycle before finalization (cpulaunch's exit handler runs gc.collect()).
"""

import argparse
import json
import os
import sys
import time
import warnings

#: The launcher's variables, read at start (Lightning's teardown deletes WORLD_SIZE).
ENV_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
             "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RUN_ID")


def _allreduce_ranks(rank: int) -> float:
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(rank + 1)])
    # The work is kept for good, so that a gloo worker never ends it. A worker drops its
    # reference to a finished work after the wait has returned, while holding its work
    # queue's lock; ending the work there releases the tensor's Python object, which takes
    # the GIL. During exit-race's staging rank 0's main thread holds the GIL: that worker
    # would wait for it, the other worker for the lock, the last all-reduce never start, and
    # rank 0 give up after 60 s (flags [1, 2], about 1 run in 30; gdb: a pt_gloo_runloop
    # thread in take_gil from ~AsyncAllreduceWork in ProcessGroupGloo::runLoop, the other
    # waiting for the lock).
    work = dist.all_reduce(value, async_op=True)
    work.wait()
    _KEEP.append(work)
    return float(value.item())


_ENV_AT_START = {n: os.environ.get(n) for n in ENV_NAMES}


def _report(framework: str, **view) -> None:
    record = {"tag": "ranks_users", "framework": framework, "pid": os.getpid(), **view, "env": _ENV_AT_START}
    print(json.dumps(record), flush=True)


#: What the Lightning program saw during training (the registered DDP comm hook).
SEEN: dict = {}


def run_lightning(args) -> None:
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def on_train_end(self):  # the DDP module, before Lightning's teardown unwraps it
            SEEN["comm_hook"] = self.trainer.strategy.model._get_ddp_logging_data().get("comm_hook")

    strategy = args.strategy
    if strategy == "post-local-sgd":
        from lightning.pytorch.strategies import DDPStrategy
        from torch.distributed.algorithms.ddp_comm_hooks import (
            post_localSGD_hook as post_local,
        )

        strategy = DDPStrategy(ddp_comm_state=post_local.PostLocalSGDState(
            process_group=None, subgroup=None, start_localSGD_iter=2),
            ddp_comm_hook=post_local.post_localSGD_hook, model_averaging_period=2)
    elif strategy == "fp16-hook":  # Lightning's own way: on CPU it never registers the hook
        from lightning.pytorch.strategies import DDPStrategy
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        strategy = DDPStrategy(ddp_comm_hook=default_hooks.fp16_compress_hook)
    elif strategy == "wrap-ddp-fp16":  # docs/guide/training.md's recipe: the strategy wraps with wrap_ddp
        strategy = _wrap_ddp_strategy(comm_hook="fp16")
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 8, generator=generator), torch.randn(64, 1, generator=generator))
    trainer = pl.Trainer(num_nodes=args.nnodes, devices=args.devices, accelerator="cpu", strategy=strategy,
                         max_steps=args.steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), DataLoader(data, batch_size=4))
    import torch.distributed as dist

    _report("lightning", global_rank=trainer.global_rank, node_rank=trainer.node_rank,
            local_rank=trainer.local_rank, world_size=trainer.world_size, dist_rank=dist.get_rank(),
            allreduce=_allreduce_ranks(dist.get_rank()),
            comm_hook=SEEN.get("comm_hook"))


def _wrap_ddp_strategy(**wrap_options):
    """docs/guide/training.md's Lightning recipe: a DDPStrategy whose model is wrapped by
    cpulaunch's wrap_ddp (whose hooks run on CPU), with post-local SGD's averaging after
    each optimizer step."""
    from lightning.pytorch.strategies import DDPStrategy

    from cpulaunch.ddp_wrap import wrap_ddp

    class CpuDDPStrategy(DDPStrategy):
        def _setup_model(self, model):
            return wrap_ddp(model, **wrap_options)

        def optimizer_step(self, optimizer, closure, model=None, **kwargs):
            out = super().optimizer_step(optimizer, closure, model, **kwargs)
            self.model.after_step()
            return out

    return CpuDDPStrategy()


def run_accelerate(_args) -> None:
    from accelerate import PartialState

    state = PartialState(cpu=True)
    _report("accelerate", distributed_type=str(state.distributed_type), global_rank=state.process_index,
            local_rank=state.local_process_index, world_size=state.num_processes,
            allreduce=_allreduce_ranks(state.process_index))


def run_gloo(args) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = 0.0
    for _ in range(args.steps):
        total = _allreduce_ranks(dist.get_rank())
    _report("gloo", global_rank=dist.get_rank(), world_size=dist.get_world_size(), allreduce=total)


def _spin(seconds: float) -> None:
    """Run bytecode for ``seconds`` without releasing the GIL (no system call, no sleep)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


def _wait_for(path: str, what: str, timeout: float = 120.0) -> None:
    """Wait for ``path`` to exist (polled every 10 ms, up to ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"ranks_users_prog: {what} did not come within {timeout:g} s")
        time.sleep(0.01)


def _flags(path: str):
    """Two bytes shared by the ranks through a mapped file: [0] rank 1 has finished the
    last all-reduce; [1] rank 0 then held the GIL into finalization (1) or gave up waiting
    (2). Reading and writing them are memory accesses, with no system call: the reader
    keeps the GIL."""
    import mmap

    with open(path, "a+b") as f:
        f.truncate(2)
        return mmap.mmap(f.fileno(), 2)


_KEEP = []


def _last_collective_rank0(signal_dir: str, hold: float, destroyed: bool = False) -> None:
    import torch
    import torch.distributed as dist

    flags = _flags(os.path.join(signal_dir, "flags"))
    _KEEP.append(flags)  # unmapping releases the GIL: not before finalization
    dist.all_reduce(torch.ones(1), async_op=True)  # the gloo worker holds the only reference
    if destroyed:
        # The program ends the group itself, but a reference cycle still holds it (as a
        # DistributedDataParallel model does, whose hooks refer back to it): the group and
        # its worker live on until the collector runs (issue 25).
        cycle = [dist.group.WORLD]
        cycle.append(cycle)
        dist.destroy_process_group()
        del cycle
    with open(os.path.join(signal_dir, "rank0-in-flight"), "w"):
        pass  # rank 1 may join the all-reduce now
    # From here this thread keeps the GIL (a switch interval of an hour, bytecode only, no
    # system call) until it returns into the interpreter's finalization. The worker finishes
    # the all-reduce once rank 1 has joined, then drops the work, and with it the tensor,
    # which takes the GIL: it waits, and gets it only when the interpreter is finalizing,
    # unless something hands it over first (destroy_process_group does).
    sys.setswitchinterval(3600)
    deadline = time.monotonic() + 60  # a bound, not a race: it ends as soon as rank 1 is done
    while flags[0] == 0 and time.monotonic() < deadline:
        pass
    flags[1] = 1 if flags[0] else 2
    _spin(hold)  # the worker needs microseconds to reach the GIL after the all-reduce


def run_exit_race(args) -> None:
    import atexit

    import torch
    import torch.distributed as dist

    if args.init == "cpulaunch":
        from cpulaunch.distributed import init_process_group

        init_process_group("gloo")
    else:
        dist.init_process_group("gloo")  # torch's own, as most programs do
    rank = dist.get_rank()
    _report("exit-race", global_rank=rank, world_size=dist.get_world_size(), allreduce=_allreduce_ranks(rank))
    if rank == 0:
        atexit.register(_last_collective_rank0, args.signal_dir, args.hold, args.destroyed)
    else:
        flags = _flags(os.path.join(args.signal_dir, "flags"))
        _wait_for(os.path.join(args.signal_dir, "rank0-in-flight"), "rank 0's last all-reduce")
        dist.all_reduce(torch.ones(1))
        flags[0] = 1


def run_ending(args) -> None:
    """Ends as ``--end`` says, with ``destroy_process_group`` reporting each call (and the
    process that made it) on stdout, so a test sees whether anything ended the group."""
    import torch.distributed as dist

    destroy = dist.destroy_process_group

    def reported(*a, **kw):
        print(json.dumps({"tag": "destroy_process_group", "pid": os.getpid()}), flush=True)
        return destroy(*a, **kw)

    dist.destroy_process_group = reported
    if args.init == "cpulaunch":
        from cpulaunch.distributed import init_process_group

        init_process_group("gloo")
    else:
        dist.init_process_group("gloo")
    _report("ending", global_rank=dist.get_rank(), allreduce=_allreduce_ranks(dist.get_rank()))
    if args.end == "raise":
        raise RuntimeError("the program failed")
    if args.end == "destroyed":
        dist.destroy_process_group()
    elif args.end == "exit3":
        sys.exit(3)
    elif args.end == "fork":
        import atexit

        child = os.fork()
        if child == 0:
            # The child's exit handlers see a copy of the parent's group, without its gloo
            # threads. They run; the interpreter's own teardown is skipped (it would destroy
            # that copy and wait for threads the child does not have, hook or no hook).
            atexit._run_exitfuncs()
            os._exit(0)
        os.waitpid(child, 0)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=("lightning", "accelerate", "gloo", "exit-race", "ending"))
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--strategy", default="ddp", choices=("ddp", "post-local-sgd", "fp16-hook", "wrap-ddp-fp16"))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--hold", type=float, default=0.05,
                        help="exit-race: seconds rank 0 keeps the GIL before it ends")
    parser.add_argument("--signal-dir", help="exit-race: where rank 0 tells rank 1 to join")
    parser.add_argument("--destroyed", action="store_true",
                        help="exit-race: rank 0 destroys the group after its last all-reduce, "
                             "with a reference cycle still holding it")
    parser.add_argument("--init", choices=("torch", "cpulaunch"), default="torch",
                        help="exit-race, ending: torch.distributed's init_process_group or cpulaunch's")
    parser.add_argument("--end", choices=("normal", "raise", "destroyed", "exit3", "fork"), default="normal",
                        help="ending: how the program ends")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # Lightning's advice on num_workers etc.: not what is tested
    {"lightning": run_lightning, "accelerate": run_accelerate, "gloo": run_gloo,
     "exit-race": run_exit_race, "ending": run_ending}[args.framework](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
