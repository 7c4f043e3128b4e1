"""Ray Train on CPUs with each worker bound by cpulaunch (docs/guide/integrations.md, "Ray Train").

Starts a local Ray head on this machine, runs a TorchTrainer with ``--workers`` CPU workers
(1 CPU each, gloo) that train a small MLP for ``--steps`` steps on the same seed, and
prints one line per worker, from the driver, in rank order::

    worker RANK affinity CPULIST threads N params SHA256

RANK is the worker's world rank, CPULIST the CPUs its threads may use (every thread of the
worker process, from /proc/self/task; one list, or the lists joined by "|" where threads
differ), N ``torch.get_num_threads()`` in the training function, SHA256 the hash of the
trained parameters (equal on every worker: DDP keeps them in step). The first thing the
training function does is ``cpulaunch.bind_ray_train_worker()``; ``--no-bind`` leaves
Ray's default (OMP_NUM_THREADS = the worker's CPUs, nothing pinned) for comparison.

    python examples/ray_train.py
    python examples/ray_train.py --no-bind --steps 200 --json out.json   # what bench_ray.py runs

Needs ``pip install 'ray[train]'`` (Ray 2.60 ran here). Ray's session files go to a
temporary folder removed at the end; ``ray.shutdown()`` stops the processes this script
started, and any of them still there 5 s after ray.shutdown() is killed (found as this script's
descendants, orphans included: it is their subreaper, or by a variable they inherit), also when SIGTERM or Ctrl-C
cut ``ray.init()`` short (never run ``ray stop`` on a shared machine: it stops every Ray
process there).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path


def _thread_cpus() -> list:
    """The distinct Cpus_allowed_list of this process's threads."""
    seen = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            text = Path(f"/proc/self/task/{tid}/status").read_text()
        except OSError:
            continue
        seen.update(line.split(":", 1)[1].strip() for line in text.splitlines()
                    if line.startswith("Cpus_allowed_list:"))
    return sorted(seen)


def train_func(config: dict) -> None:
    """One Ray Train worker: bind (unless --no-bind), train, all_reduce, write a record."""
    import hashlib

    import ray.train
    import torch
    import torch.distributed as dist
    from ray.train.torch import prepare_model

    plan = None
    if config["bind"]:
        import cpulaunch

        plan = cpulaunch.bind_ray_train_worker()
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    torch.manual_seed(0)
    width = config["width"]
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.ReLU(),
                                              torch.nn.Linear(4 * width, width), torch.nn.ReLU(),
                                              torch.nn.Linear(width, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(1000 + rank)
    batches = [(torch.randn(config["batch"], width, generator=data),
                torch.randint(0, 10, (config["batch"],), generator=data)) for _ in range(4)]

    def train(steps: int):
        """``steps`` SGD steps on the worker's batches; the last loss."""
        loss = None
        for step in range(steps):
            x, y = batches[step % 4]
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return loss

    train(config["warmup"])
    start = time.perf_counter()
    loss = train(config["steps"])
    seconds = time.perf_counter() - start
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    params = b"".join(p.detach().contiguous().numpy().tobytes() for p in model.parameters())
    record = {
        "rank": rank, "local_rank": ctx.get_local_rank(), "world_size": ctx.get_world_size(),
        "affinity": sorted(os.sched_getaffinity(0)), "thread_cpus": _thread_cpus(),
        "threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "params": hashlib.sha256(params).hexdigest(), "allreduce": total.item(), "loss": loss.item(),
        "seconds": seconds, "samples_per_s": config["steps"] * config["batch"] / seconds,
        "process_cpu_seconds": time.process_time(),  # the worker process's CPU time so far, every thread
        "plan_cpus": list(plan.cpus) if plan else None, "node_cpus": {str(k): list(v) for k, v in
                                                                       plan.node_cpus.items()} if plan else None,
        "threads_pinned": len(plan.threads_pinned) if plan else 0, "notes": list(plan.notes) if plan else [],
    }
    Path(config["out"], f"worker-{rank}.json").write_text(json.dumps(record))
    ray.train.report({"rank": rank})


#: Set to the run's folder in the environment every process Ray starts here inherits.
RUN_MARK = "EXAMPLE_RAY_TRAIN_RUN"


def _adopt_orphans() -> None:
    """Make this script a child subreaper (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): a process
    Ray started whose parent ends first (a worker the raylet forked as it was being killed)
    becomes this script's child instead of init's, so :func:`_shutdown` still finds it."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER = 36
    except (OSError, AttributeError):
        pass  # not Linux: the variable below still finds them


def _shutdown(ray, folder: str) -> None:
    """ray.shutdown(), then kill what Ray started here and is still running 5 s later (again until none is left): the
    script's descendants and every process that inherited :data:`RUN_MARK` = ``folder``
    (this run's folder) in its environment. Ray's head processes and workers run in sessions
    of their own, so a signal to this script's process group does not reach them; a worker
    the raylet started while it was stopping is nobody's child any more, and its command
    line may be renamed (``ray::IDLE``); a signal that cut ray.init() short leaves processes
    that ray.shutdown() knows nothing of."""
    import psutil

    def ours() -> list:
        found = {p.pid: p for p in psutil.Process().children(recursive=True)}
        for p in psutil.process_iter():
            try:
                if p.pid != os.getpid() and p.environ().get(RUN_MARK) == folder:
                    found[p.pid] = p
            except (psutil.Error, OSError):  # gone, or another user's
                pass
        return list(found.values())

    try:
        ray.shutdown()
    finally:
        deadline = time.monotonic() + 5
        left = ours()
        while left and time.monotonic() < deadline:
            time.sleep(0.2)  # Ray's processes end on their own after ray.shutdown(), most within 1 s
            left = ours()
        # Kill what is left until nothing is: a raylet not yet killed may start one more worker
        # between a scan and the kills (CI found two such workers left, their parent init); as
        # the raylet dies, such a worker becomes this script's child (_adopt_orphans).
        deadline = time.monotonic() + 10
        while left and time.monotonic() < deadline:
            for proc in left:
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(left, timeout=2)
            left = ours()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--no-bind", action="store_true", help="Ray's default: nothing pinned")
    p.add_argument("--json", help="also write every worker's record to this file")
    args = p.parse_args(argv)

    def stop(signum, _frame):  # SIGTERM ends the run as Ctrl-C does: ray.shutdown() below still runs
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second SIGTERM must not cut the clean-up short
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    _adopt_orphans()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no network calls home
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local head: no token file in ~/.ray
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    with tempfile.TemporaryDirectory(prefix="ray-train-") as out:
        os.environ[RUN_MARK] = out
        try:
            # Ray's session files (logs, sockets) in this run's own folder, removed with it (by
            # default each run leaves a session folder under /tmp/ray)
            ray.init(num_cpus=args.workers, include_dashboard=False, object_store_memory=128 << 20,
                     log_to_driver=False, runtime_env={"env_vars": {"RAY_DEDUP_LOGS": "0"}},
                     _temp_dir=str(Path(out, "ray")))
            signal.signal(signal.SIGTERM, stop)  # again: ray.init() installs its own, which aborts
            trainer = TorchTrainer(
                train_func,
                train_loop_config={"bind": not args.no_bind, "steps": args.steps, "warmup": args.warmup,
                                   "batch": args.batch, "width": args.width, "out": out},
                torch_config=TorchConfig(backend="gloo"),
                scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False,
                                             resources_per_worker={"CPU": 1}),
                run_config=RunConfig(storage_path=str(Path(out, "runs")), name="cpulaunch-ray-train"),
            )
            trainer.fit()
        finally:
            _shutdown(ray, out)
        records = sorted((json.loads(f.read_text()) for f in Path(out).glob("worker-*.json")),
                         key=lambda r: r["rank"])
    for r in records:
        print(f"worker {r['rank']} affinity {'|'.join(r['thread_cpus'])} threads {r['threads']} "
              f"params {r['params']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    return 0 if len(records) == args.workers else 1


if __name__ == "__main__":
    sys.exit(main())
