"""cpulaunch: a CPU launcher and environment configurator for PyTorch on Linux.

Data flows one way: probe (read the host) -> Topology -> Plan -> render (env/argv) -> launch.
Nothing runs at import: no logging configuration, no environment changes, no torch.
The Python API (:func:`plan_instances`, :func:`bind_current_process`) is loaded on first use.
"""

__version__ = "0.2.0"

__all__ = ["plan_instances", "bind_current_process", "__version__"]


def __getattr__(name):
    if name in ("plan_instances", "bind_current_process"):
        from cpulaunch import api

        return getattr(api, name)
    raise AttributeError(f"module 'cpulaunch' has no attribute {name!r}")
