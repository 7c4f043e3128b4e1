"""cpulaunch: a CPU launcher and environment configurator for PyTorch on Linux.

Data flows one way: probe (read the host) -> Topology -> Plan -> render (env/argv) -> launch.
Nothing runs at import: no logging configuration, no environment changes, no torch.
The Python API (:func:`plan_instances`, :func:`bind_current_process`, :func:`bind_ray_train_worker`)
is loaded on first use.
"""

__version__ = "0.2.0"

__all__ = ["plan_instances", "bind_current_process", "bind_ray_train_worker", "__version__"]


#: The lazy API: name -> the module that defines it, imported at first use.
_LAZY = {"plan_instances": "cpulaunch.api", "bind_current_process": "cpulaunch.runtime.bind",
         "bind_ray_train_worker": "cpulaunch.runtime.ray_train"}


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
