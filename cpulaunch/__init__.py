"""cpulaunch: a CPU launcher and environment configurator for PyTorch on Linux.

Data flows one way: probe (read the host) -> Topology -> Plan -> render (env/argv) -> launch.
Nothing runs at import: no logging configuration, no environment changes, no torch.

The public API, loaded on first use (``dir(cpulaunch)`` lists it):

- planning and launching: :func:`plan_instances` (the plan ``cpulaunch --dry-run`` shows),
  :func:`run` (run it from Python and get the exit code);
- inside the program: :func:`bind_current_process` (apply an instance to this process),
  :func:`dataloader_kwargs` (DataLoader workers on the cores set aside for them),
  :func:`optimize` (the inference path), :func:`cpu_autocast` (bf16 where the CPU has it);
- distributed training: :func:`init_process_group`, :func:`wrap_ddp`,
  :func:`convert_sync_batchnorm` / :class:`SyncBatchNorm`;
- Ray Train: :func:`bind_ray_train_worker` (bind a Ray Train worker as ``--ddp`` would);
- :class:`CpulaunchError`, the one error type of every mistake a user can fix.

Everything else is internal: modules' own names may change between releases.
"""

__version__ = "0.2.0"

#: The lazy API: name -> the module that defines it, imported at first use.
_LAZY = {
    "plan_instances": "cpulaunch.api",
    "run": "cpulaunch.api",
    "bind_current_process": "cpulaunch.runtime.bind",
    "dataloader_kwargs": "cpulaunch.runtime.dataloader",
    "optimize": "cpulaunch.runtime.inference",
    "cpu_autocast": "cpulaunch.runtime.amp",
    "init_process_group": "cpulaunch.runtime.ddp",
    "wrap_ddp": "cpulaunch.runtime.ddp",
    "convert_sync_batchnorm": "cpulaunch.runtime.syncbn",
    "SyncBatchNorm": "cpulaunch.runtime.syncbn",
    "bind_ray_train_worker": "cpulaunch.runtime.ray_train",
    "CpulaunchError": "cpulaunch.errors",
}

__all__ = [*_LAZY, "__version__"]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cpulaunch' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__():
    """The module's names plus the lazy API (``dir(cpulaunch)``, completion in a REPL),
    without importing it (PEP 562)."""
    return sorted(set(globals()) | set(_LAZY))
