"""A DDP job in which one rank fails while the others wait in a collective (issue 38).

``python fail_ranks.py HOW RANK CODE``: every rank joins the process group (cpulaunch's
``init_process_group``: gloo, or the backend cpulaunch chose); rank RANK then fails as HOW says
while the others call ``dist.barrier()``, which only a lost peer ends. HOW:

* ``exit``: ``sys.exit(CODE)``; ``raise``: an uncaught ``RuntimeError`` (exit 1);
* ``os_exit``: ``os._exit(CODE)`` (no Python exit path: nothing recorded);
* ``sigkill``: SIGKILL to itself; ``segv``: a read of address 0 (SIGSEGV);
* ``none``: nobody fails (every rank passes the barrier and exits 0).

Each rank prints ``ready <rank> <pid>`` on stdout once in the group.
"""

import os
import signal
import sys

import torch.distributed as dist

from cpulaunch import init_process_group

how, bad, code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
init_process_group()
rank = dist.get_rank()
print(f"ready {rank} {os.getpid()}", flush=True)
if rank == bad and how != "none":
    if how == "exit":
        sys.exit(code)
    if how == "raise":
        raise RuntimeError(f"rank {rank} gave up")
    if how == "os_exit":
        os._exit(code)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "segv":
        import ctypes

        ctypes.string_at(0)
dist.barrier()
