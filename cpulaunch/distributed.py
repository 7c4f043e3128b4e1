"""Distributed (DDP) support: backend choice and, in the program, process-group set-up.

The rank planner lives here too (added with the --ddp launcher work). Nothing here imports
torch at module import; ``init_process_group`` imports it when called, in the program.
"""

from __future__ import annotations

import os

#: Environment variable through which the launcher tells the program which backend to use.
BACKEND_ENV = "CPULAUNCH_DIST_BACKEND"


def init_process_group(backend: str | None = None, **kwargs):
    """Initialise ``torch.distributed`` for a rank started by cpulaunch (or torchrun, mpirun, srun).

    Args:
        backend: "gloo" or "ccl"; default: ``$CPULAUNCH_DIST_BACKEND``, else "gloo".
        **kwargs: passed on to ``torch.distributed.init_process_group`` (e.g. ``timeout``).

    The rendezvous is ``env://``: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT must be set
    (cpulaunch --ddp sets them for every engine it supports). With "ccl" the
    ``oneccl_bindings_for_pytorch`` module is imported first, which registers the backend.

    Returns the backend name used.

    Raises:
        RuntimeError: backend "ccl" asked for but ``oneccl_bindings_for_pytorch`` cannot be
            imported (install it from Intel's index, or use gloo).
    """
    import torch.distributed as dist

    backend = backend or os.environ.get(BACKEND_ENV) or "gloo"
    if backend == "ccl":
        try:
            import oneccl_bindings_for_pytorch  # noqa: F401  (registers the "ccl" backend)
        except ImportError as exc:  # pragma: no cover - not installable here
            raise RuntimeError(
                "backend 'ccl' needs oneccl_bindings_for_pytorch, which failed to import "
                f"({exc}); install it from Intel's index or run with --backend gloo"
            ) from exc
    kwargs.setdefault("init_method", "env://")
    dist.init_process_group(backend=backend, **kwargs)
    return backend
