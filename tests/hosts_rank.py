"""A DDP rank for the emulated-hosts tests (tests/test_hosts.py; not collected by pytest).

``python hosts_rank.py STATE [--loop]``: joins the process group the launcher set up
(cpulaunch.init_process_group, gloo), all-reduces (rank + 1), then writes one record,
``STATE/rank-HOSTNAME-PID.json`` (written whole, then renamed into place): the hostname
this process sees, rank, world size, the all-reduce's result (sum over ranks of rank + 1),
its CPU affinity (sorted logical CPU ids), OMP_NUM_THREADS and torch's thread count,
torchelastic's restart count and the time
(CLOCK_MONOTONIC, shared by every emulated host of one machine).

Without ``--loop`` it then meets the others at a barrier and exits 0. With ``--loop`` it
keeps all-reducing, a few times a second, so that it sees at once when a peer goes away (the
collective raises, the rank exits 1); it ends, exit 0, once the file ``STATE/finish`` holds
its world size: every rank reads it and the ranks agree through an all-reduce (MAX), so
they all leave at the same step. ``--watch PID``: a looping rank exits 4 as soon as PID
(the test run) is gone, so that a test run killed before its clean-up leaves no rank
looping for ever.
"""

import argparse
import datetime
import json
import os
import socket
import sys
import time


def write_record(state: str, record: dict) -> None:
    name = f"rank-{record['hostname']}-{record['pid']}.json"
    tmp = os.path.join(state, f".{name}.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.rename(tmp, os.path.join(state, name))


def finish_asked(state: str, world_size: int) -> bool:
    try:
        with open(os.path.join(state, "finish")) as f:
            return f.read().strip() == str(world_size)
    except FileNotFoundError:
        return False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("state")
    parser.add_argument("--loop", action="store_true")
    parser.add_argument("--watch", type=int, default=None, help="exit 4 once this pid is gone")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for the rendezvous and each collective")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    from cpulaunch.distributed import init_process_group

    init_process_group(timeout=datetime.timedelta(seconds=args.timeout))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    write_record(args.state, {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "rank": rank,
        "world_size": world_size,
        "allreduce": value.item(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "torch_threads": torch.get_num_threads(),
        "restart": os.environ.get("TORCHELASTIC_RESTART_COUNT"),
        "time": time.clock_gettime(time.CLOCK_MONOTONIC),
    })
    if not args.loop:
        dist.barrier()
    while args.loop:
        if args.watch is not None and not alive(args.watch):
            print(f"hosts_rank: the test run (pid {args.watch}) is gone", file=sys.stderr)
            return 4
        stop = torch.tensor([1.0 if finish_asked(args.state, world_size) else 0.0])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
        time.sleep(0.1)  # pacing only: the test waits for the files, never for this
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
