"""cpulaunch: a CPU launcher and environment configurator for PyTorch on Linux.

Data flows one way: probe (read the host) -> Topology -> Plan -> render (env/argv) -> launch.
Nothing runs at import: no logging configuration, no environment changes, no torch.
"""

__version__ = "0.1.0"
