"""The names both the option surface (:mod:`cpulaunch.option_table`, :mod:`cpulaunch.options`)
and the planner (plan, placement, settings, render) speak: the placement modes, the
inference paths, how an instance is bound, what an invocation produces and in which text
form. On the ground floor, so that the surface imports the planner and never the other way
round (``tests/test_layers.py``). Constants, enums and one test of a name: importing this module
does nothing.
"""

import os

from cpulaunch.enums import Enum

__all__ = ["PLACEMENT_MODES", "INFERENCE_PATHS", "BindMode", "Output", "Format", "is_python_name"]

#: The placement modes, at most one of which a request gives (``--ninstances``,
#: ``--instances-per-socket``, ...): fields of :class:`cpulaunch.plan.Request` and the
#: python names of their options.
PLACEMENT_MODES = ("ninstances", "instances_per_socket", "instances_per_node", "instances_per_l3",
                   "latency_mode", "throughput_mode")

#: --inference-path values: cpulaunch.inference.PATHS (kept here as data: the launcher does not
#: import the runtime; tests/test_inference.py holds the two equal).
INFERENCE_PATHS = ("auto", "eager", "onednn-graph", "inductor", "zentorch")


class BindMode(str, Enum):
    """How an instance is bound to its CPUs and memory."""

    NUMACTL = "numactl"  #: ``numactl -C CPUS -m NODES program`` (numactl(8)): CPUs and memory
    AFFINITY = "affinity"  #: sched_setaffinity(2) before exec: CPUs only, memory unbound
    NONE = "none"  #: no binding (OMP_NUM_THREADS and libraries still set)


class Output(str, Enum):
    """What the invocation produces."""

    RUN = "run"  #: start the program (exec one instance, supervise several)
    DRY_RUN = "dry-run"  #: print each instance's env and command; run nothing
    PRINT_ENV = "print-env"  #: print one instance's environment for a shell script
    SHOW_TOPOLOGY = "show-topology"  #: draw the machine


class Format(str, Enum):
    """Text forms of --dry-run, --print-env and --show-topology
    (:data:`cpulaunch.option_table.FORMATS_FOR` says which output takes which)."""

    TEXT = "text"  #: person-readable (--dry-run, --show-topology)
    SHELL = "shell"  #: ``export NAME='value'`` lines, safe to eval (--print-env)
    DOTENV = "dotenv"  #: ``NAME='value'`` lines for POSIX ``set -a; . FILE`` (--print-env)
    JSON = "json"  #: the plan JSON (all three)
    OMP_BIND = "omp-bind"  #: instances' cpulists joined by ``|`` (vLLM/SGLang bind string)
    VLLM = "vllm"  #: ``VLLM_CPU_OMP_THREADS_BIND=...`` assignment lines
    SGLANG = "sglang"  #: ``SGLANG_CPU_OMP_THREADS_BIND=...`` assignment lines
    SVG = "svg"  #: a picture of the machine and the instances on it (cpulaunch.svg; --dry-run, --show-topology)


def is_python_name(path: str) -> bool:
    """True when ``path``'s last component names a Python interpreter: ``python`` followed
    by nothing but digits and dots (``python3``, ``/usr/bin/python3.11``); ``python-config``,
    ``ipython`` and ``pythonw`` are not. The one test of a program's first word for "is
    this Python" (render's :func:`cpulaunch.render.runs_python`, the ranks' interpreter)."""
    name = os.path.basename(path)
    return name.startswith("python") and not name[6:].strip("0123456789.")
