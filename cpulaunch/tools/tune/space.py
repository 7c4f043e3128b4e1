"""The search space of ``cpulaunch tune``: its axes, the configurations on them, and how a
configuration becomes cpulaunch flags and best.toml keys (docs/guide/tune.md, "Space").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence, Union

from cpulaunch.errors import CpulaunchError

__all__ = [
    "AXES",
    "TuneError",
    "parse_duration",
    "InstanceChoice",
    "Space",
    "instance_choices",
    "build_space",
    "config_key",
    "config_flags",
    "config_toml",
    "AXIS_HELP",
    "format_duration",
    "parse_axes",
    "available_libraries",
]


# --------------------------------------------------------------------------- constants

#: Axes of the search space, in the order configurations are keyed, printed and flagged.
AXES = ("instances", "allocator", "omp-runtime", "kmp-blocktime", "omp-places", "smt", "recipe",
        "omp-wait-policy", "zendnn-matmul-algo")
#: Axes searched only on the platforms whose recipe lists them (``Recipe.tune``,
#: cpulaunch.machine.recipes: AMD Zen's).
PLATFORM_AXES = ("recipe", "omp-wait-policy", "zendnn-matmul-algo")
#: What each axis is, for --help and docs/guide/tune.md.
AXIS_HELP = {
    "instances": "how many instances (and so cores per instance): 1, per socket, per NUMA node, "
                 "powers of two up to the cores, latency mode (4 cores each)",
    "allocator": "default (the C library's malloc) and the allocators found here (tcmalloc, jemalloc)",
    "omp-runtime": "gnu (torch's libgomp) and intel (libiomp5) when found here",
    "kmp-blocktime": "KMP_BLOCKTIME 0, 1, 5, 200 ms (intel only; alone it fixes --omp-runtime intel)",
    "omp-places": "OMP_PLACES/OMP_PROC_BIND off/on (gnu only)",
    "smt": "--use-logical-cores off/on (only on a machine with SMT)",
    "recipe": "the platform's environment recipe against generic (AMD Zen only: ZenDNN's OMP_DYNAMIC, "
              "KMP_* barriers, AMD's jemalloc MALLOC_CONF)",
    "omp-wait-policy": "OMP_WAIT_POLICY unset (auto), ACTIVE, PASSIVE (AMD Zen only; ZenDNN's guide: ACTIVE)",
    "zendnn-matmul-algo": "ZENDNNL_MATMUL_ALGO 1 (zentorch's default: latency) and 5 (NLP throughput) "
                          "(AMD Zen only; read by zentorch)",
}
#: ZENDNNL_MATMUL_ALGO values tried; the first is what zentorch reads when it is unset.
MATMUL_ALGOS = (1, 5)
#: KMP_BLOCKTIME values tried, in ms; the first is cpulaunch's default (the registry's 1 ms).
KMP_BLOCKTIMES = (1, 0, 5, 200)
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([smh])")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


class TuneError(CpulaunchError):
    """A tune that cannot go on for a reason the user can fix (a bad option, a program
    that fails with the default configuration, a budget too small, an --out folder that
    holds another program's tune). One line; exit code 2."""


# --------------------------------------------------------------------------- budget


def parse_duration(text: str) -> float:
    """A duration in seconds from ``NUMBER UNIT`` parts, units s, m, h (combinable).

    ``"10m"`` -> 600.0, ``"90s"`` -> 90.0, ``"1h30m"`` -> 5400.0, ``"1.5h"`` -> 5400.0.

    Raises:
        TuneError: no unit (``"10"`` is ambiguous), an unknown unit, or not > 0.
    """
    s = str(text).strip().lower().replace(" ", "")
    pos, total = 0, 0.0
    for m in _DURATION.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not s or pos != len(s):
        raise TuneError(f"--budget {text!r}: give a duration with a unit, e.g. 90s, 10m, 1h or 1h30m")
    if total <= 0:
        raise TuneError(f"--budget {text!r}: must be more than 0 seconds")
    return total


def format_duration(seconds: float) -> str:
    """``75.2`` -> ``"1m15s"``; ``3720`` -> ``"1h02m"``; ``9.4`` -> ``"9.4s"``."""
    if seconds < 60:
        return f"{max(0.0, seconds):.1f}s"
    s = int(round(seconds))
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


# --------------------------------------------------------------------------- the space


@dataclass(frozen=True)
class InstanceChoice:
    """One value of the ``instances`` axis.

    Attributes:
        label: its value in configuration keys ("1", "per-socket", "per-node", "2", "latency").
        flags: cpulaunch's flags for it (``("--ninstances", "2")``).
        toml: ``(option name, value)`` for best.toml (``("ninstances", 2)``).
        cpulists: the plan it gives: each instance's compute CPUs (logical CPU ids, kernel
            list format), for messages and deduplication.
    """

    label: str
    flags: tuple[str, ...]
    toml: tuple[str, Union[int, bool]]
    cpulists: tuple[str, ...]


@dataclass(frozen=True)
class Space:
    """The configurations tune may try.

    Attributes:
        axes: the searched axes (at least two values each), in :data:`AXES` order.
        values: axis -> its values, the default first. Instances are labels of
            ``instances``; allocator/omp-runtime are cpulaunch's choices ("tcmalloc",
            "intel"); kmp-blocktime is in ms; omp-places and smt are booleans; recipe and
            omp-wait-policy are ``--recipe``/``--omp-wait-policy`` values; zendnn-matmul-algo
            an int.
        default: the configuration cpulaunch uses without flags, restricted to the
            searched axes (plus ``fixed``).
        fixed: values every configuration carries without searching them (``omp-runtime
            = "intel"`` when kmp-blocktime is searched without omp-runtime).
        instances: the instance choices by label (flags, best.toml key, plan).
        notes: axes dropped and why (one line each).
    """

    axes: tuple[str, ...]
    values: Mapping[str, tuple[object, ...]]
    default: Mapping[str, object]
    fixed: Mapping[str, object] = field(default_factory=dict)
    instances: Mapping[str, InstanceChoice] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def parse_axes(text: Optional[str]) -> tuple[str, ...]:
    """``--space`` text -> axes in :data:`AXES` order. ``None``/``"all"`` -> every axis;
    ``"allocator,omp_runtime"`` -> ``("allocator", "omp-runtime")``.

    Raises:
        TuneError: an unknown axis, or none given.
    """
    if text is None or text.strip().lower() == "all":
        return AXES
    names = [t.strip().lower().replace("_", "-") for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in AXES]
    if bad or not names:
        raise TuneError(f"--space {text!r}: {'unknown axis ' + bad[0] if bad else 'no axis'}; "
                        f"choose from {', '.join(AXES)} (comma-separated) or all")
    return tuple(a for a in AXES if a in names)


def instance_choices(topo) -> list[InstanceChoice]:
    """The ``instances`` axis on ``topo``: 1 instance, one per socket, one per NUMA node,
    powers of two up to the usable physical cores, and latency mode (4 cores each) when
    at least 4 cores are usable; a choice giving the same plan as an earlier one is
    dropped (on one socket with one node, per-socket and per-node equal 1), as is one the
    planner refuses.

    Args:
        topo: a :class:`cpulaunch.machine.topology.Topology` (from ``probe.probe(root)``).

    Returns:
        :class:`InstanceChoice` list, "1" first.
    """
    from cpulaunch import cpulist
    from cpulaunch.plan import LATENCY_CORES, PlanError, Request, plan

    base = plan(topo, Request())
    ncores = sum(len(inst.cores) for inst in base.instances)
    usable = topo.online & topo.allowed
    node_count = sum(1 for n in topo.nodes.values() if n.cpus & usable)
    cands = [("1", Request(ninstances=1), ("--ninstances", "1"), ("ninstances", 1))]
    if len(topo.sockets) > 1:
        cands.append(("per-socket", Request(instances_per_socket=1), ("--instances-per-socket", "1"),
                      ("instances-per-socket", 1)))
    if node_count > 1:
        cands.append(("per-node", Request(instances_per_node=1), ("--instances-per-node", "1"),
                      ("instances-per-node", 1)))
    k = 2
    while k <= ncores:
        cands.append((str(k), Request(ninstances=k), ("--ninstances", str(k)), ("ninstances", k)))
        k *= 2
    if ncores >= LATENCY_CORES:
        cands.append(("latency", Request(latency_mode=True), ("--latency-mode",), ("latency-mode", True)))
    out, seen = [], set()
    for label, req, flags, toml in cands:
        try:
            p = plan(topo, req)
        except PlanError:
            continue
        sig = frozenset((inst.cpus, inst.threads) for inst in p.instances)  # instance order aside
        if sig in seen:
            continue
        seen.add(sig)
        out.append(InstanceChoice(label, flags, toml, tuple(cpulist.format(i.cpus) for i in p.instances)))
    return out


def available_libraries(environ: Optional[Mapping[str, str]] = None) -> frozenset[str]:
    """Registry names of the preloadable libraries installed here ("tcmalloc", "jemalloc",
    "iomp5"), found as cpulaunch finds them (:func:`cpulaunch.machine.libfinder.find`)."""
    from cpulaunch.machine import libfinder, libraries

    return frozenset(name for name, lib in libraries.REGISTRY.items()
                     if lib.filenames and lib.selectable and libfinder.find(lib, environ) is not None)


def _axis_candidates(topo, axes: Sequence[str], available: frozenset, recipe: str,
                     instance_labels: tuple[str, ...]) -> dict:
    """{axis: (its values here, why it has a single one)} for ``axes``, in their order
    (pure; :func:`build_space` drops the axes with fewer than two values). ``recipe``: the
    name of the platform's recipe (compared with generic); ``instance_labels``: the
    instance choices' labels (:func:`instance_choices`)."""
    from cpulaunch.machine import libraries
    from cpulaunch.machine.recipes import WAIT_POLICIES

    allocs = tuple(lib.choice for name, lib in libraries.REGISTRY.items()
                   if lib.kind == "allocator" and name in available)
    auto = libraries.by_choice("allocator", libraries.AUTO_ALLOCATOR)
    default_alloc = auto.choice if auto.name in available else "default"
    intel = "iomp5" in available
    usable = topo.online & topo.allowed
    smt = any(len(set(c.cpus) & usable) > 1 for c in topo.cores)
    out = {}
    for axis in axes:
        if axis == "recipe":
            out[axis] = ((recipe, "generic"), "")
        elif axis == "omp-wait-policy":
            out[axis] = (WAIT_POLICIES, "")
        elif axis == "zendnn-matmul-algo":
            out[axis] = (MATMUL_ALGOS, "")
        elif axis == "instances":
            out[axis] = (instance_labels, "one usable core gives a single choice")
        elif axis == "allocator":
            out[axis] = ((default_alloc,) + tuple(a for a in ("default",) + allocs if a != default_alloc),
                         "no tcmalloc or jemalloc found here")
        elif axis == "omp-runtime":
            out[axis] = (("gnu", "intel") if intel else ("gnu",), "libiomp5 not found here (pip install intel-openmp)")
        elif axis == "kmp-blocktime":
            out[axis] = (KMP_BLOCKTIMES if intel else (KMP_BLOCKTIMES[0],),
                         "it applies to Intel OpenMP, and libiomp5 is not found here (pip install intel-openmp)")
        elif axis == "omp-places":
            out[axis] = ((False, True), "")
        else:
            out[axis] = ((False, True) if smt else (False,), "this machine has no SMT siblings among its usable CPUs")
    return out


def build_space(topo, axes: Sequence[str], available: Iterable[str]) -> Space:
    """The search space for ``axes`` on ``topo`` with the libraries ``available`` (pure).

    Args:
        topo: the machine (:class:`cpulaunch.machine.topology.Topology`).
        axes: axes asked for (:func:`parse_axes`).
        available: registry names of the libraries installed ("tcmalloc", "jemalloc", "iomp5").

    Returns:
        a :class:`Space`; an axis with a single possible value here (no SMT, no libiomp5,
        one instance choice) is dropped with a note, and so are the platform axes
        (:data:`PLATFORM_AXES`) on a CPU whose recipe does not list them (one note; on AMD
        Zen: recipe amd-zen vs generic, OMP_WAIT_POLICY auto/active/passive,
        ZENDNNL_MATMUL_ALGO 1/5).

    Raises:
        TuneError: no axis is left with two values (nothing to compare).
    """
    from cpulaunch.machine.recipes import recipe_for

    wanted = [a for a in AXES if a in axes]
    values: dict = {}
    notes: list = []
    fixed: dict = {}
    platform = topo.platform
    recipe = recipe_for(platform.kind)
    foreign = [a for a in wanted if a in PLATFORM_AXES and a not in recipe.tune]
    if foreign:
        notes.append(f"axes {', '.join(foreign)} dropped: they are searched on AMD Zen CPUs only (this one: "
                     f"{platform.text}, recipe {recipe.name})")
    inst = {c.label: c for c in instance_choices(topo)} if "instances" in wanted else {}
    candidates = _axis_candidates(topo, [a for a in wanted if a not in foreign], frozenset(available), recipe.name,
                                  tuple(inst))
    for axis, (vals, why) in candidates.items():
        if len(vals) < 2:
            notes.append(f"axis {axis} dropped: {why}")
            continue
        values[axis] = vals
    if "kmp-blocktime" in values and "omp-runtime" not in values:
        fixed["omp-runtime"] = "intel"
        notes.append("kmp-blocktime searched without omp-runtime: every configuration uses --omp-runtime intel")
    if "omp-places" in values and fixed.get("omp-runtime") == "intel":
        del values["omp-places"]
        notes.append("axis omp-places dropped: it applies to GNU OpenMP and intel is fixed")
    if not values:
        raise TuneError("nothing to compare: " + "; ".join(notes or ["no axis chosen"])
                        + "; choose other axes with --space")
    axes_kept = tuple(a for a in AXES if a in values)
    default = _normalize(values, fixed, {a: values[a][0] for a in axes_kept})
    return Space(axes=axes_kept, values=values, default=default, fixed=fixed,
                 instances={k: v for k, v in inst.items() if k in values.get("instances", ())},
                 notes=tuple(notes))


def _normalize(values: Mapping, fixed: Mapping, config: Mapping) -> dict:
    """Apply ``fixed`` and the runtime rules: kmp-blocktime only with intel (its default
    added when missing), omp-places only with gnu (off when missing)."""
    c = {**config, **fixed}
    runtime = c.get("omp-runtime", "gnu")
    if runtime == "intel":
        c.pop("omp-places", None)
        if "kmp-blocktime" in values:
            c.setdefault("kmp-blocktime", values["kmp-blocktime"][0])
    else:
        c.pop("kmp-blocktime", None)
        if "omp-places" in values:
            c.setdefault("omp-places", False)
    return {a: c[a] for a in AXES if a in c}


def _fmt_value(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


def config_key(config: Mapping[str, object]) -> str:
    """The identity of a configuration: ``"instances=2,allocator=tcmalloc,omp-places=on"``
    (axes in :data:`AXES` order, booleans as on/off). Records are matched on it."""
    return ",".join(f"{a}={_fmt_value(config[a])}" for a in AXES if a in config)


def config_flags(space: Space, config: Mapping[str, object]) -> list[str]:
    """cpulaunch's flags for ``config``: ``{"instances": "2", "allocator": "jemalloc",
    "omp-places": True}`` -> ``["--ninstances", "2", "--allocator", "jemalloc",
    "--omp-places"]``. Axes absent from ``config`` add nothing (cpulaunch's defaults)."""
    flags: list = []
    for axis in AXES:
        if axis not in config:
            continue
        v = config[axis]
        if axis == "instances":
            flags += list(space.instances[v].flags)
        elif axis in ("allocator", "omp-runtime", "kmp-blocktime", "recipe", "omp-wait-policy",
                      "zendnn-matmul-algo"):
            flags += [f"--{axis}", str(v)]
        elif axis == "omp-places" and v:
            flags.append("--omp-places")
        elif axis == "smt" and v:
            flags.append("--use-logical-cores")
    return flags


def config_toml(space: Space, config: Mapping[str, object]) -> dict[str, object]:
    """The ``[cpulaunch]`` table of best.toml for ``config`` (option name -> value), every
    axis written explicitly: ``{"ninstances": 2, "allocator": "tcmalloc",
    "omp-places": False}``."""
    out: dict = {}
    for axis in AXES:
        if axis not in config:
            continue
        v = config[axis]
        if axis == "instances":
            key, value = space.instances[v].toml
            out[key] = value
        elif axis == "smt":
            out["use-logical-cores"] = bool(v)
        else:
            out[axis] = v
    return out
