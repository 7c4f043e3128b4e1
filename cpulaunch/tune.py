"""``cpulaunch tune``: find the best configuration for one program on this machine, by measurement.

Every trial is a real run, ``python -m cpulaunch [FLAGS] -- PROGRAM ...``, started as a
subprocess with ``sys.executable``: what tune measures is exactly what a user runs, and
the winner is saved as ``DIR/best.toml`` for ``cpulaunch --config DIR/best.toml ...``.
The whole method (space, budget, metric, noise rules, resume) is in docs/tune.md; the
short form:

* **Space** (:func:`build_space`): axes ``instances`` (the topology's natural splits,
  deduplicated by the plan they give), ``allocator`` (default and the allocators found
  here), ``omp-runtime`` (gnu, intel when libiomp5 is found), ``kmp-blocktime`` (intel
  only), ``omp-places`` (gnu only), ``smt`` (only with SMT). ``--space`` picks axes; the
  others keep cpulaunch's defaults (no flag is passed for them).
* **Search** (:func:`next_stage`): one untimed warm-up run of the default configuration
  gives the trial time; the whole grid when it fits the budget, otherwise the adaptive
  search: a coarse stage (the default, then one axis at a time), then a fine stage (the
  grid of the values the coarse stage could not separate, around the per-axis bests,
  measured again next to the coarse winner and the default).
* **Measurement**: each configuration at least ``--trials-per-config`` (>= 3) times,
  round-robin, shuffled per round with ``--seed``; the machine's foreign load measured
  before and during every trial (a busy trial is repeated once, then flagged); failed and
  timed-out trials are recorded, never scored; one configuration is better than another
  only when the difference of medians exceeds the larger of their spreads (max - min).
* **Files**: ``DIR/trials.jsonl`` (one JSON object per trial, appended as it ends),
  ``DIR/tune.json`` (what was tuned, checked on resume), ``DIR/report.txt``,
  ``DIR/report.png`` (matplotlib), ``DIR/best.toml``.

This module is never imported on the launch path; tqdm and matplotlib are imported lazily
(``pip install tqdm matplotlib``), with plain progress lines and no chart without them.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
import random
import re
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence

import click

from cpulaunch.errors import CpulaunchError

__all__ = [
    "TuneError",
    "AXES",
    "METRIC_PREFIX",
    "parse_duration",
    "Space",
    "InstanceChoice",
    "instance_choices",
    "build_space",
    "config_key",
    "config_flags",
    "config_toml",
    "grid_configs",
    "coarse_configs",
    "fine_configs",
    "parse_metrics",
    "combine_metric",
    "Summary",
    "summarize",
    "compare",
    "Stage",
    "next_stage",
    "read_records",
    "score",
    "LoadReading",
    "load_meter",
    "parse_proc_stat",
    "RunResult",
    "run_command",
    "Settings",
    "Tuner",
    "main",
]

# --------------------------------------------------------------------------- constants

#: Axes of the search space, in the order configurations are keyed, printed and flagged.
AXES = ("instances", "allocator", "omp-runtime", "kmp-blocktime", "omp-places", "smt")
#: What each axis is, for --help and docs/tune.md.
AXIS_HELP = {
    "instances": "how many instances (and so cores per instance): 1, per socket, per NUMA node, "
                 "powers of two up to the cores, latency mode (4 cores each)",
    "allocator": "default (the C library's malloc) and the allocators found here (tcmalloc, jemalloc)",
    "omp-runtime": "gnu (torch's libgomp) and intel (libiomp5) when found here",
    "kmp-blocktime": "KMP_BLOCKTIME 0, 1, 5, 200 ms (intel only; alone it fixes --omp-runtime intel)",
    "omp-places": "OMP_PLACES/OMP_PROC_BIND off/on (gnu only)",
    "smt": "--use-logical-cores off/on (only on a machine with SMT)",
}
#: KMP_BLOCKTIME values tried, in ms; the first is cpulaunch's default (the registry's 1 ms).
KMP_BLOCKTIMES = (1, 0, 5, 200)
#: The line a program prints to report its metric (docs/tune.md).
METRIC_PREFIX = "CPULAUNCH_METRIC"
#: Name of the metric when the program prints none: the wall time of the whole run.
WALL_METRIC = "wall_s"
#: Margin on estimated trial times when fitting a stage into the budget.
SAFETY = 1.15
#: A configuration with this many failed or timed-out trials gets no more trials.
MAX_FAILURES = 2
#: Seconds cpulaunch gives a trial's instances between SIGTERM and SIGKILL (--grace-period).
TRIAL_GRACE = 2.0
#: Seconds we wait for a trial after each signal before the next one (SIGTERM, SIGKILL).
STOP_WAIT = 5.0
#: Characters of a failed trial's stderr kept in its record.
TAIL_CHARS = 1500

_METRIC_LINE = re.compile(r"^(?:\[(\d+)\] )?" + METRIC_PREFIX + r"((?:\s+[A-Za-z_][\w.\-]*=\S+)+)\s*$")
_PAIR = re.compile(r"([A-Za-z_][\w.\-]*)=(\S+)")
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
    flags: tuple
    toml: tuple
    cpulists: tuple


@dataclass(frozen=True)
class Space:
    """The configurations tune may try.

    Attributes:
        axes: the searched axes (at least two values each), in :data:`AXES` order.
        values: axis -> its values, the default first. Instances are labels of
            ``instances``; allocator/omp-runtime are cpulaunch's choices ("tcmalloc",
            "intel"); kmp-blocktime is in ms; omp-places and smt are booleans.
        default: the configuration cpulaunch uses without flags, restricted to the
            searched axes (plus ``fixed``).
        fixed: values every configuration carries without searching them (``omp-runtime
            = "intel"`` when kmp-blocktime is searched without omp-runtime).
        instances: the instance choices by label (flags, best.toml key, plan).
        notes: axes dropped and why (one line each).
    """

    axes: tuple
    values: Mapping[str, tuple]
    default: Mapping[str, object]
    fixed: Mapping[str, object] = field(default_factory=dict)
    instances: Mapping[str, InstanceChoice] = field(default_factory=dict)
    notes: tuple = ()


def parse_axes(text: Optional[str]) -> tuple:
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


def instance_choices(topo) -> list:
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


def available_libraries(environ: Optional[Mapping[str, str]] = None) -> frozenset:
    """Registry names of the preloadable libraries installed here ("tcmalloc", "jemalloc",
    "iomp5"), found as cpulaunch finds them (:func:`cpulaunch.machine.libraries.find`)."""
    from cpulaunch.machine import libraries

    return frozenset(name for name, lib in libraries.REGISTRY.items()
                     if lib.filenames and libraries.find(lib, environ) is not None)


def build_space(topo, axes: Sequence[str], available: Iterable[str]) -> Space:
    """The search space for ``axes`` on ``topo`` with the libraries ``available`` (pure).

    Args:
        topo: the machine (:class:`cpulaunch.machine.topology.Topology`).
        axes: axes asked for (:func:`parse_axes`).
        available: registry names of the libraries installed ("tcmalloc", "jemalloc", "iomp5").

    Returns:
        a :class:`Space`; an axis with a single possible value here (no SMT, no libiomp5,
        one instance choice) is dropped with a note.

    Raises:
        TuneError: no axis is left with two values (nothing to compare).
    """
    from cpulaunch.machine import libraries

    available = frozenset(available)
    wanted = [a for a in AXES if a in axes]
    values: dict = {}
    notes: list = []
    fixed: dict = {}
    inst = {c.label: c for c in instance_choices(topo)} if "instances" in wanted else {}
    allocs = tuple(lib.choice for name, lib in libraries.REGISTRY.items()
                   if lib.kind == "allocator" and name in available)
    default_alloc = "tcmalloc" if "tcmalloc" in available else "default"
    intel = "iomp5" in available
    usable = topo.online & topo.allowed
    smt = any(len(set(c.cpus) & usable) > 1 for c in topo.cores)
    for axis in wanted:
        if axis == "instances":
            vals = tuple(inst)
            why = "one usable core gives a single choice"
        elif axis == "allocator":
            vals = (default_alloc,) + tuple(a for a in ("default",) + allocs if a != default_alloc)
            why = "no tcmalloc or jemalloc found here"
        elif axis == "omp-runtime":
            vals = ("gnu", "intel") if intel else ("gnu",)
            why = "libiomp5 not found here (pip install intel-openmp)"
        elif axis == "kmp-blocktime":
            vals = KMP_BLOCKTIMES if intel else (KMP_BLOCKTIMES[0],)
            why = "it applies to Intel OpenMP, and libiomp5 is not found here (pip install intel-openmp)"
        elif axis == "omp-places":
            vals = (False, True)
            why = ""
        else:
            vals = (False, True) if smt else (False,)
            why = "this machine has no SMT siblings among its usable CPUs"
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


def config_key(config: Mapping) -> str:
    """The identity of a configuration: ``"instances=2,allocator=tcmalloc,omp-places=on"``
    (axes in :data:`AXES` order, booleans as on/off). Records are matched on it."""
    return ",".join(f"{a}={_fmt_value(config[a])}" for a in AXES if a in config)


def config_flags(space: Space, config: Mapping) -> list:
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
        elif axis in ("allocator", "omp-runtime", "kmp-blocktime"):
            flags += [f"--{axis}", str(v)]
        elif axis == "omp-places" and v:
            flags.append("--omp-places")
        elif axis == "smt" and v:
            flags.append("--use-logical-cores")
    return flags


def config_toml(space: Space, config: Mapping) -> dict:
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


# --------------------------------------------------------------------------- the planner


def grid_configs(space: Space) -> list:
    """Every configuration of ``space`` (the product of the axes' values under the
    runtime rules, duplicates dropped), the default first."""
    out, seen = [], set()
    for combo in itertools.product(*(space.values[a] for a in space.axes)):
        c = _normalize(space.values, space.fixed, dict(zip(space.axes, combo)))
        k = config_key(c)
        if k not in seen:
            seen.add(k)
            out.append(c)
    return out


def _axis_variants(space: Space, axis: str) -> list:
    """The default with ``axis`` set to each of its non-default values (kmp-blocktime on
    Intel OpenMP, omp-places on GNU OpenMP)."""
    out = []
    for v in space.values[axis][1:]:
        c = dict(space.default)
        if axis == "kmp-blocktime":
            c["omp-runtime"] = "intel"
        elif axis == "omp-places":
            c["omp-runtime"] = "gnu"
        c[axis] = v
        c = _normalize(space.values, space.fixed, c)
        if "omp-runtime" not in space.values and "omp-runtime" not in space.fixed:
            c.pop("omp-runtime", None)
        out.append(c)
    return out


def coarse_configs(space: Space) -> list:
    """The coarse stage: the default, then one axis at a time from it, breadth first
    (each axis's first alternative, then each axis's second, ...), so a budget that cuts
    the list still varies every axis once. Duplicates dropped."""
    per_axis = [_axis_variants(space, a) for a in space.axes]
    out, seen = [dict(space.default)], {config_key(space.default)}
    for i in range(max((len(v) for v in per_axis), default=0)):
        for variants in per_axis:
            if i < len(variants) and config_key(variants[i]) not in seen:
                seen.add(config_key(variants[i]))
                out.append(variants[i])
    return out


def fine_configs(space: Space, summaries: Mapping[str, "Summary"], lower_is_better: bool,
                 limit: int = 2) -> tuple:
    """The fine stage's new configurations, from the coarse stage's results (pure).

    For each axis, its values are ranked by the median of the coarse configuration that
    varies only that axis (the default for the default value); the best value is kept,
    with the next ones (up to ``limit`` in all) when the best does not beat them beyond
    the spread (:func:`compare`): those are the axis's undecided values. The fine stage is
    the grid of those values around the per-axis bests, nearest the combination of the
    bests first (fewest axes differing), configurations already measured left out.

    Args:
        space: the space.
        summaries: config key -> :class:`Summary` of the coarse stage.
        lower_is_better: the metric's direction.
        limit: values kept per axis.

    Returns:
        ``(combined best configuration, [new configurations, nearest first])``.
    """
    keep: dict = {}
    best: dict = {}
    for axis in space.axes:
        ranked = []
        base = dict(space.default)
        if axis == "kmp-blocktime":  # its default value is measured as the intel runtime's variant
            base = _normalize(space.values, space.fixed, {**base, "omp-runtime": "intel"})
        pairs = [(space.values[axis][0], base)] + list(zip(space.values[axis][1:], _axis_variants(space, axis)))
        for v, c in pairs:
            s = summaries.get(config_key(c))
            if s is not None and s.n:
                ranked.append((v, s))
        if not ranked:
            best[axis] = space.default.get(axis, space.values[axis][0])
            keep[axis] = [best[axis]]
            continue
        ranked.sort(key=lambda vs: vs[1].median, reverse=not lower_is_better)
        top = ranked[0]
        best[axis] = top[0]
        keep[axis] = [top[0]] + [v for v, s in ranked[1:]
                                 if compare(top[1], s, lower_is_better) != "better"][: limit - 1]
    combined = _normalize(space.values, space.fixed, {a: best[a] for a in space.axes})
    cands, seen = [], set(summaries)
    for combo in itertools.product(*(keep[a] for a in space.axes)):
        c = _normalize(space.values, space.fixed, dict(zip(space.axes, combo)))
        k = config_key(c)
        if k in seen:
            continue
        seen.add(k)
        cands.append(c)
    cands.sort(key=lambda c: (sum(c.get(a) != combined.get(a) for a in AXES), config_key(c)))
    return combined, cands


# --------------------------------------------------------------------------- metrics


def parse_metrics(text: str) -> dict:
    """``CPULAUNCH_METRIC name=value`` lines of a run's output -> ``{instance: {name: value}}``.

    A line is the metric line alone (leading/trailing blanks allowed) or with cpulaunch's
    ``"[i] "`` prefix, which names the instance (several instances); an unprefixed line
    belongs to instance ``None`` (one instance). One line may carry several ``name=value``
    pairs; a later value of the same name replaces an earlier one (the program's final
    figure counts). A value that is not a finite number is kept as NaN (the trial fails).

    ``"[1] CPULAUNCH_METRIC samples_per_s=12.5"`` -> ``{1: {"samples_per_s": 12.5}}``.
    """
    out: dict = {}
    for line in text.splitlines():
        m = _METRIC_LINE.match(line.strip("\r"))
        if not m:
            m = _METRIC_LINE.match(line.strip())
            if not m:
                continue
        inst = int(m.group(1)) if m.group(1) is not None else None
        for name, raw in _PAIR.findall(m.group(2)):
            try:
                value = float(raw)
            except ValueError:
                value = float("nan")
            out.setdefault(inst, {})[name] = value if math.isfinite(value) else float("nan")
    return out


def combine_metric(per_instance: Mapping, name: str, ninstances: int, lower_is_better: bool) -> tuple:
    """One trial's figure from its instances' metrics (pure).

    Instances run concurrently, so a throughput (higher is better) is summed over them;
    a latency (``--lower-is-better``) is not additive and is averaged. Every instance must
    report ``name``: with one instance its lines are unprefixed (key None) or ``[0]``;
    with several, ``[0]`` .. ``[n-1]``.

    Returns:
        ``(value, [per-instance values], None)``, or ``(None, [], error message)``.
    """
    if ninstances <= 1:
        src = per_instance.get(None) or per_instance.get(0) or {}
        vals = [src.get(name)]
    else:
        vals = [(per_instance.get(i) or {}).get(name) for i in range(ninstances)]
    missing = [i for i, v in enumerate(vals) if v is None]
    if missing:
        who = "the program" if ninstances <= 1 else "instance " + ",".join(map(str, missing))
        return None, [], f"{who} printed no '{METRIC_PREFIX} {name}=...' line"
    if any(math.isnan(v) for v in vals):
        return None, [], f"'{METRIC_PREFIX} {name}=...' is not a finite number"
    total = sum(vals)
    return (total / len(vals) if lower_is_better else total), vals, None


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Summary:
    """The scored trials of one configuration.

    Attributes:
        n: scored (successful) trials.
        median, low, high: median, minimum and maximum of their values (NaN when n == 0).
        failed: failed or timed-out trials (never scored).
        busy: scored trials flagged busy (the foreign load was above the threshold in
            the repeat too, or while the trial before was busy as well).
    """

    n: int
    median: float
    low: float
    high: float
    failed: int = 0
    busy: int = 0

    @property
    def spread(self) -> float:
        """max - min of the scored values (the noise the "better" rule uses)."""
        return self.high - self.low if self.n else float("nan")

    @property
    def spread_pct(self) -> float:
        """:attr:`spread` in percent of the median."""
        return 100 * self.spread / abs(self.median) if self.n and self.median else float("nan")


def summarize(values: Sequence[float], failed: int = 0, busy: int = 0) -> Summary:
    """``[90, 100, 105]`` -> ``Summary(n=3, median=100, low=90, high=105)`` (spread 15)."""
    if not values:
        nan = float("nan")
        return Summary(0, nan, nan, nan, failed, busy)
    return Summary(len(values), statistics.median(values), min(values), max(values), failed, busy)


def compare(a: Summary, b: Summary, lower_is_better: bool) -> str:
    """Is ``a`` better than ``b``? ``"better"`` or ``"worse"`` only when the difference of
    medians exceeds the larger of the two spreads (max - min of each one's trials), else
    ``"within noise"``; ``"too few trials"`` when either has fewer than 2.

    Example: a = [100, 104, 108] (median 104, spread 8), b = [90, 94, 95] (94, 5):
    the difference 10 > 8, so a is "better" (higher is better).
    """
    if a.n < 2 or b.n < 2:
        return "too few trials"
    diff = (b.median - a.median) if lower_is_better else (a.median - b.median)
    noise = max(a.spread, b.spread)
    if abs(diff) <= noise:
        return "within noise"
    return "better" if diff > 0 else "worse"


# --------------------------------------------------------------------------- records


def read_records(path: Path) -> tuple:
    """The trials of ``DIR/trials.jsonl``: ``(records, skipped line count)``. A line that
    is not a JSON object (a write cut by a crash) is skipped and counted."""
    records, skipped = [], 0
    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return [], 0
    except OSError as exc:
        raise TuneError(f"cannot read {path}: {exc.strerror or exc}") from None
    for raw in lines:
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            skipped += 1
            continue
        if isinstance(rec, dict) and "key" in rec and "status" in rec:
            records.append(rec)
        else:
            skipped += 1
    return records, skipped


def append_record(path: Path, record: Mapping) -> None:
    """Append one record as one line in one write (O_APPEND), so an interruption leaves
    either the whole line or none of it."""
    data = (json.dumps(record, sort_keys=False) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _drop_partial_line(path: Path) -> bool:
    """Cut a last line without its newline (a write cut short) off ``path``, so the next
    record starts on a line of its own. Returns True when something was cut."""
    try:
        with open(path, "rb+") as f:
            data = f.read()
            if not data or data.endswith(b"\n"):
                return False
            f.truncate(data.rfind(b"\n") + 1)
            return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise TuneError(f"cannot repair {path}: {exc.strerror or exc}") from None


def _slot_records(records: Iterable[Mapping]) -> dict:
    """{(key, round): [records in order]} of the timed trials (the warm-up, round 0, out)."""
    out: dict = {}
    for r in records:
        if r.get("stage") != "warmup":
            out.setdefault((r["key"], int(r.get("round", 0))), []).append(r)
    return out


def _slot_done(attempts: Sequence[Mapping]) -> bool:
    """A slot is done after a failure, a success not marked ``repeat`` (quiet, or busy
    while the machine was already busy: flagged), or a second attempt."""
    if not attempts:
        return False
    last = attempts[-1]
    return last["status"] != "ok" or not last.get("repeat") or len(attempts) >= 2


def _scored(attempts: Sequence[Mapping]) -> Optional[Mapping]:
    """The attempt a slot scores: its last successful one, or None."""
    oks = [a for a in attempts if a["status"] == "ok"]
    return oks[-1] if oks else None


def score(records: Iterable[Mapping], stages: Optional[Iterable[str]] = None) -> dict:
    """config key -> :class:`Summary` over the slots (``(key, round)``) of ``records``,
    only those of ``stages`` when given; the warm-up never counts."""
    slots = _slot_records(r for r in records if stages is None or r.get("stage") in stages)
    vals: dict = {}
    failed: dict = {}
    busy: dict = {}
    for (key, _), attempts in slots.items():
        failed[key] = failed.get(key, 0) + sum(a["status"] != "ok" for a in attempts)
        s = _scored(attempts)
        vals.setdefault(key, [])
        if s is not None:
            vals[key].append(float(s["value"]))
            busy[key] = busy.get(key, 0) + bool(s.get("busy"))
    return {k: summarize(v, failed.get(k, 0), busy.get(k, 0)) for k, v in vals.items()}


# --------------------------------------------------------------------------- stages


@dataclass(frozen=True)
class Stage:
    """A set of configurations measured together, round-robin.

    Attributes:
        name: "grid", "coarse" or "fine".
        configs: the configurations, in planning order.
        rounds: config key -> the rounds it runs in this stage (absolute round numbers:
            a configuration measured again in the fine stage runs rounds R+1..2R).
        notes: decisions taken (mode, what the budget cut), one line each.
    """

    name: str
    configs: tuple
    rounds: Mapping[str, tuple]
    notes: tuple = ()

    def order(self, seed: int) -> list:
        """The stage's slots ``(config, round)`` in running order: stage round j runs every
        configuration's j-th round, shuffled with ``Random(f"{seed}/{name}/{j}")``."""
        by_key = {config_key(c): c for c in self.configs}
        depth = max((len(r) for r in self.rounds.values()), default=0)
        out = []
        for j in range(depth):
            keys = sorted(k for k in by_key if j < len(self.rounds[k]))
            random.Random(f"{seed}/{self.name}/{j}").shuffle(keys)
            out += [(by_key[k], self.rounds[k][j]) for k in keys]
        return out


def _cost(records: Iterable[Mapping], stages: Iterable[str]) -> float:
    stages = set(stages)
    return sum(float(r.get("cost_s", 0.0)) for r in records if r.get("stage") in stages)


def _estimate(records: Sequence[Mapping], stages: Iterable[str]) -> Optional[float]:
    """Median cost (seconds, load check included) of the successful trials of ``stages``."""
    stages = set(stages)
    costs = [float(r["cost_s"]) for r in records if r.get("stage") in stages and r["status"] == "ok"]
    return statistics.median(costs) if costs else None


def _fit(n_rounds: int, trial_s: float, left_s: float) -> int:
    """How many configurations of ``n_rounds`` trials of ``trial_s`` fit in ``left_s``."""
    return int(left_s // (n_rounds * trial_s * SAFETY)) if trial_s > 0 else 10**6


def next_stage(space: Space, records: Sequence[Mapping], budget_s: float, rounds: int,
               lower_is_better: bool) -> Optional[Stage]:
    """The stage to run now, from the space, the budget and the recorded trials (pure).

    Every decision depends on recorded trials only (their ``cost_s`` and values), so a
    resumed tune takes the same decisions as an uninterrupted one:

    1. After the warm-up: the grid when ``configs x rounds x warm-up cost x 1.15`` fits
       the budget left; else the coarse stage (:func:`coarse_configs`), cut to what fits
       (at least the default and one other, else :class:`TuneError`).
    2. Adaptive, once every coarse slot is done: the fine stage: the coarse winner and the
       default measured ``rounds`` more times next to the new configurations of
       :func:`fine_configs`, as many as fit in the budget left after the coarse stage (at
       its median trial cost); skipped when none fits or none is new.
    3. Otherwise None: the search is over.

    Raises:
        TuneError: no warm-up recorded, or the budget cannot fit two configurations.
    """
    warm = [r for r in records if r.get("stage") == "warmup" and r["status"] == "ok"]
    if not warm:
        raise TuneError("internal order: the warm-up comes first")
    warm_s = float(warm[0]["cost_s"])
    left = budget_s - _cost(records, ["warmup"])
    grid = grid_configs(space)
    all_rounds = tuple(range(1, rounds + 1))
    slots = _slot_records(records)
    dropped = _dropped(records)
    if len(grid) * rounds * warm_s * SAFETY <= left:
        stage = Stage("grid", tuple(grid), {config_key(c): all_rounds for c in grid},
                      (f"grid search: {len(grid)} configurations x {rounds} trials fit the budget "
                       f"(about {format_duration(warm_s)} per trial)",))
        return None if _stage_done(stage, slots, dropped) else stage
    coarse = coarse_configs(space)
    n = _fit(rounds, warm_s, left)
    if n < 2:
        need = 2 * rounds * warm_s * SAFETY + _cost(records, ["warmup"])
        raise TuneError(
            f"the budget ({format_duration(budget_s)}) cannot fit 2 configurations x {rounds} trials of about "
            f"{format_duration(warm_s)} each after the warm-up; give --budget {math.ceil(need / 60)}m or more "
            "(a rerun with the same --out keeps the trials done)")
    cut = coarse[:n]
    notes = [f"adaptive search: the grid ({len(grid)} configurations x {rounds} trials of about "
             f"{format_duration(warm_s)}) does not fit the budget; coarse stage: the default, then one axis "
             "at a time"]
    if len(cut) < len(coarse):
        notes.append(f"coarse stage cut to {len(cut)} of {len(coarse)} configurations by the budget: "
                     + ", ".join(config_key(c) for c in coarse[len(cut):]) + " not tried")
    stage = Stage("coarse", tuple(cut), {config_key(c): all_rounds for c in cut}, tuple(notes))
    if not _stage_done(stage, slots, dropped):
        return stage
    fine = _fine_stage(space, records, budget_s, rounds, lower_is_better)
    if fine is None or _stage_done(fine, slots, dropped):
        return None
    return fine


def _fine_stage(space: Space, records: Sequence[Mapping], budget_s: float, rounds: int,
                lower_is_better: bool) -> Optional[Stage]:
    coarse_scores = score(records, ["coarse", "grid"])
    trial_s = _estimate(records, ["coarse", "grid"]) or _estimate(records, ["warmup"])
    left = budget_s - _cost(records, ["warmup", "coarse", "grid"])
    complete = {k: s for k, s in coarse_scores.items() if s.n >= rounds}
    if not complete:
        return None
    pick = (min if lower_is_better else max)(complete, key=lambda k: complete[k].median)
    default_key = config_key(space.default)
    refs = [pick] + ([default_key] if default_key != pick and default_key in complete else [])
    combined, new = fine_configs(space, coarse_scores, lower_is_better)
    n = _fit(rounds, trial_s, left) - len(refs)
    if n < 1 or not new:
        return None
    new = new[:n]
    by_key = {config_key(c): c for c in grid_configs(space)}
    by_key.update({config_key(c): c for c in new})
    configs = tuple(by_key[k] for k in refs) + tuple(new)
    second = tuple(range(rounds + 1, 2 * rounds + 1))
    rounds_of = {k: second for k in refs}
    rounds_of.update({config_key(c): tuple(range(1, rounds + 1)) for c in new})
    note = (f"fine stage: {len(new)} new configuration(s) around the per-axis bests "
            f"({config_key(combined)}), next to the coarse winner {pick}"
            + (" and the default" if len(refs) > 1 else ""))
    return Stage("fine", configs, rounds_of, (note,))


def _dropped(records: Iterable[Mapping]) -> set:
    """Keys of configurations with MAX_FAILURES or more failed/timed-out trials."""
    fails: dict = {}
    for r in records:
        if r["status"] != "ok" and r.get("stage") != "warmup":
            fails[r["key"]] = fails.get(r["key"], 0) + 1
    return {k for k, n in fails.items() if n >= MAX_FAILURES}


def _stage_done(stage: Stage, slots: Mapping, dropped: set) -> bool:
    return all(k in dropped or _slot_done(slots.get((k, r), ()))
               for k, rs in stage.rounds.items() for r in rs)


# --------------------------------------------------------------------------- the load meter


@dataclass(frozen=True)
class LoadReading:
    """Foreign CPU load over a window: others' CPU time plus steal, in percent of the
    whole machine (``os.cpu_count()`` CPUs); ``busiest``: ``(percent of one CPU, pid,
    name)`` of the busiest other processes when known."""

    foreign_pct: float
    busiest: tuple = ()


class _BenchkitMeter:
    """scripts/benchkit.py's meter (machine busy time minus ours and our reaped children,
    plus steal), loaded by path from the repository checkout."""

    name = "benchkit"

    def __init__(self, module) -> None:
        self.mod = module

    def sample(self, seconds: float) -> LoadReading:
        load = self.mod.sample(seconds, top=3)
        return LoadReading(load.foreign_pct, tuple(load.busiest))

    def window(self) -> Callable[[], LoadReading]:
        w = self.mod.LoadWindow()
        return lambda: LoadReading(w.load().foreign_pct)


def parse_proc_stat(text: str, ticks_per_s: float) -> tuple:
    """The aggregate ``cpu`` line of /proc/stat (proc(5)) -> ``(busy, steal)`` CPU seconds
    since boot, all CPUs summed; busy = user + nice + system + irq + softirq (as benchkit).

    ``"cpu  100 0 50 900 0 5 5 20 0 0"`` at 100 ticks/s -> ``(1.6, 0.2)``.
    """
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            v = [int(x) for x in parts[1:]] + [0] * 8
            busy = v[0] + v[1] + v[2] + v[5] + v[6]
            return busy / ticks_per_s, v[7] / ticks_per_s
    raise ValueError("no aggregate cpu line in /proc/stat")


class _ProcStatMeter:
    """The same formula as benchkit's, read from /proc/stat directly (an installed
    cpulaunch has no scripts/ folder); no list of busiest processes."""

    name = "proc-stat"

    def __init__(self, stat_path: str = "/proc/stat") -> None:
        self.path = stat_path
        self.hz = float(os.sysconf("SC_CLK_TCK"))

    def _times(self) -> tuple:
        with open(self.path) as f:
            return parse_proc_stat(f.read(), self.hz)

    @staticmethod
    def _own() -> float:
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    def window(self) -> Callable[[], LoadReading]:
        t0, (b0, s0), o0 = time.monotonic(), self._times(), self._own()

        def load() -> LoadReading:
            wall = max(1e-6, time.monotonic() - t0)
            b1, s1 = self._times()
            others = max(0.0, (b1 - b0) - (self._own() - o0))
            return LoadReading(100 * (others + max(0.0, s1 - s0)) / wall / (os.cpu_count() or 1))

        return load

    def sample(self, seconds: float) -> LoadReading:
        done = self.window()
        time.sleep(seconds)
        return done()


def load_meter(repo: Optional[Path] = None):
    """The foreign-load meter: scripts/benchkit.py of the repository holding this package,
    imported by path (nothing copied), when it is there and imports (it needs psutil);
    else a /proc/stat reader with the same formula. The choice is each record's
    ``load.meter``."""
    path = (repo or Path(__file__).resolve().parent.parent) / "scripts" / "benchkit.py"
    name = "_cpulaunch_benchkit"
    if path.is_file():
        mod = sys.modules.get(name)
        if mod is None or Path(getattr(mod, "__file__", "")) != path:
            spec = importlib.util.spec_from_file_location(name, path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod  # dataclasses look their module up there
            try:
                spec.loader.exec_module(mod)
            except Exception:  # noqa: BLE001 - a broken or psutil-less checkout: use our reader
                del sys.modules[name]
                return _ProcStatMeter()
        return _BenchkitMeter(mod)
    return _ProcStatMeter()


# --------------------------------------------------------------------------- running a trial


@dataclass(frozen=True)
class RunResult:
    """How one command ended.

    Attributes:
        status: "ok" (exit 0), "failed" (other exit code or signal) or "timeout".
        returncode: Popen style (negative: killed by that signal); None if it never started.
        wall_s: seconds from start to exit.
        stdout: its whole standard output (decoded, errors replaced).
        stderr_tail: the last :data:`TAIL_CHARS` characters of its standard error.
    """

    status: str
    returncode: Optional[int]
    wall_s: float
    stdout: str
    stderr_tail: str


def _stop(proc: subprocess.Popen, first: int) -> None:
    """Stop a trial's process group: ``first``, then SIGTERM, then SIGKILL, waiting
    :data:`STOP_WAIT` seconds after each; reaps it (bounded)."""
    for sig in dict.fromkeys((first, signal.SIGTERM, signal.SIGKILL)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=STOP_WAIT)
            return
        except subprocess.TimeoutExpired:
            continue


def run_command(argv: Sequence[str], timeout: float, environ: Optional[Mapping[str, str]] = None,
                cwd: Optional[str] = None) -> RunResult:
    """Run ``argv`` in a new session (its own process group), output to temporary files,
    stdin from /dev/null; stop it at ``timeout`` seconds (:func:`_stop`).

    On KeyboardInterrupt (Ctrl-C, or SIGTERM turned into it by :class:`Tuner`) the child
    gets SIGINT, then SIGTERM, then SIGKILL, is reaped, and the interrupt propagates.

    Raises:
        TuneError: the command cannot be started.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    env=None if environ is None else dict(environ), cwd=cwd,
                                    start_new_session=True)
        except OSError as exc:
            raise TuneError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
        status = "ok"
        try:
            proc.wait(timeout=max(0.01, timeout))
        except subprocess.TimeoutExpired:
            status = "timeout"
            _stop(proc, signal.SIGTERM)
        except BaseException:
            _stop(proc, signal.SIGINT)
            raise
        wall = time.monotonic() - start
        if status == "ok" and proc.returncode != 0:
            status = "failed"
        out.seek(0)
        err.seek(0, os.SEEK_END)
        err.seek(max(0, err.tell() - 4 * TAIL_CHARS))
        return RunResult(status, proc.returncode, wall, out.read().decode(errors="replace"),
                         err.read().decode(errors="replace")[-TAIL_CHARS:])


def _failure_text(res: RunResult) -> str:
    if res.status == "timeout":
        return f"timed out after {res.wall_s:.1f}s"
    rc = res.returncode
    if rc is not None and rc < 0:
        try:
            how = f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            how = f"killed by signal {-rc}"
    else:
        how = f"exit code {rc}"
    last = [ln for ln in res.stderr_tail.splitlines() if ln.strip()]
    return how + (f": {last[-1].strip()[:200]}" if last else "")


# --------------------------------------------------------------------------- the tuner


@dataclass(frozen=True)
class Settings:
    """What ``cpulaunch tune`` was asked (typed, checked).

    Attributes:
        program: the program's argv, as for cpulaunch.
        out: the results folder.
        budget_s: seconds for the whole search (recorded trials of earlier runs count).
        axes: the axes asked for (:func:`parse_axes`).
        lower_is_better: the metric's direction (wall time is always lower-is-better).
        rounds: trials per configuration (>= 3).
        metric: the metric name to use when the program prints several (None: the first
            printed by the warm-up).
        trial_timeout: seconds per trial; None: automatic (the budget left for the
            warm-up, then max(30, 3 x the slowest successful trial + 10)).
        busy_threshold: foreign load (percent of the machine) above which a trial is busy;
            100 or more never.
        load_sample: seconds of load measurement before each trial.
        seed: the shuffle seed.
        sysroot: root the topology is read from ("/": this machine; another only with
            dry_run).
        dry_run: print the space and the stages' plan, run nothing.
    """

    program: tuple
    out: Path
    budget_s: float
    axes: tuple = AXES
    lower_is_better: bool = False
    rounds: int = 3
    metric: Optional[str] = None
    trial_timeout: Optional[float] = None
    busy_threshold: float = 10.0
    load_sample: float = 0.3
    seed: int = 0
    sysroot: str = "/"
    dry_run: bool = False


#: Settings a resumed tune must share with the recorded one (tune.json).
_IDENTITY = ("program", "axes", "lower_is_better", "rounds", "metric", "seed")


class _Interrupted(KeyboardInterrupt):
    """SIGTERM/SIGHUP during a tune, handled like Ctrl-C."""


class Tuner:
    """Runs a tune: warm-up, stages, records, progress; then the report.

    The host is injected: ``runner(argv, timeout) -> RunResult`` starts a trial (default
    :func:`run_command`), ``meter`` measures the foreign load (default
    :func:`load_meter`), ``clock`` is ``time.monotonic``. Tests pass fakes.
    """

    def __init__(self, settings: Settings, space: Space, *, runner=None, meter=None,
                 clock: Callable[[], float] = time.monotonic, python: str = sys.executable,
                 progress: bool = True, err=None) -> None:
        self.s = settings
        self.space = space
        self.runner = runner or (lambda argv, timeout: run_command(argv, timeout))
        self.meter = meter or load_meter()
        self.clock = clock
        self.python = python
        self.err = err or sys.stderr
        self.trials = settings.out / "trials.jsonl"
        self.records: list = []
        self.metric: Optional[str] = None
        self.notes: list = list(space.notes)
        self._bar = None
        self._progress = progress
        self._done_count = 0
        self._total = 0

    # ---------------------------------------------------------------- files

    def _identity(self) -> dict:
        return {"program": list(self.s.program), "axes": list(self.s.axes),
                "lower_is_better": self.s.lower_is_better, "rounds": self.s.rounds,
                "metric": self.s.metric, "seed": self.s.seed}

    def open(self) -> None:
        """Create DIR, or check that its tune.json describes the same tune, and load the
        records of an earlier run (resume).

        Raises:
            TuneError: DIR is not usable, or holds a different tune.
        """
        from cpulaunch import __version__

        out = self.s.out
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TuneError(f"--out {out}: cannot create the folder: {exc.strerror or exc}") from None
        meta_path = out / "tune.json"
        mine = self._identity()
        if meta_path.exists():
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError) as exc:
                raise TuneError(f"{meta_path} is unreadable ({exc}); use another --out or delete it") from None
            for k in _IDENTITY:
                if meta.get(k) != mine[k]:
                    raise TuneError(
                        f"--out {out} holds a tune with another {k.replace('_', '-')} ({meta.get(k)!r}, now "
                        f"{mine[k]!r}); use another --out, or delete {out} to start over")
        else:
            meta_path.write_text(json.dumps({**mine, "cpulaunch": __version__,
                                             "started": _now_iso()}, indent=2) + "\n")
        cut = _drop_partial_line(self.trials)
        self.records, skipped = read_records(self.trials)
        skipped += cut
        if skipped:
            self.notes.append(f"{skipped} unreadable line(s) of {self.trials} skipped (an interrupted write)")
        known = {config_key(c) for c in grid_configs(self.space)}
        stray = {r["key"] for r in self.records} - known
        if stray:
            self.notes.append(f"{len(stray)} recorded configuration(s) are not in this space (libraries or "
                              "CPUs changed?) and are left out: " + ", ".join(sorted(stray)[:3]))
            self.records = [r for r in self.records if r["key"] in known]

    # ---------------------------------------------------------------- one trial

    def _timeout(self, left: float) -> float:
        if self.s.trial_timeout is not None:
            return self.s.trial_timeout
        walls = [float(r["wall_s"]) for r in self.records if r["status"] == "ok"]
        if not walls:
            return max(30.0, left)
        return max(30.0, 3 * max(walls) + 10)

    def argv(self, config: Mapping) -> list:
        """The trial's command: ``python -m cpulaunch FLAGS --grace-period 2 -- PROGRAM``."""
        return [self.python, "-m", "cpulaunch", *config_flags(self.space, config),
                "--grace-period", f"{TRIAL_GRACE:g}", "--", *self.s.program]

    def run_trial(self, config: Mapping, stage: str, rnd: int, attempt: int, deadline: float) -> dict:
        """Run one trial and append its record (see docs/tune.md for the fields)."""
        argv = self.argv(config)
        started = _now_iso()
        t0 = self.clock()
        before = self.meter.sample(self.s.load_sample) if self.s.load_sample > 0 else LoadReading(0.0)
        done = self.meter.window()
        timeout = self._timeout(deadline - self.clock())
        res = self.runner(argv, timeout)
        during = done()
        cost = self.clock() - t0
        busy = self.s.busy_threshold < 100 and max(before.foreign_pct, during.foreign_pct) > self.s.busy_threshold
        # Repeat a busy trial once, unless the trial before it was busy too: on a machine
        # busy for long a repeat only doubles the time; the trial is flagged instead.
        prev_busy = bool(self.records) and bool(self.records[-1].get("busy"))
        repeat = busy and attempt == 1 and not prev_busy
        rec = {
            "trial": len(self.records) + 1, "stage": stage, "round": rnd, "attempt": attempt,
            "key": config_key(config), "config": dict(config), "flags": config_flags(self.space, config),
            "argv": argv, "status": res.status, "exit_code": res.returncode,
            "metric": None, "value": None, "per_instance": None,
            "wall_s": round(res.wall_s, 4), "cost_s": round(cost, 4),
            "load": {"meter": getattr(self.meter, "name", "custom"),
                     "before_pct": round(before.foreign_pct, 1), "during_pct": round(during.foreign_pct, 1),
                     "threshold_pct": self.s.busy_threshold,
                     "busiest": [list(b) for b in before.busiest]},
            "busy": busy, "repeat": repeat, "timeout_s": round(timeout, 1), "started": started, "error": None,
        }
        if res.status == "ok":
            self._score_output(rec, res, config)
        else:
            rec["error"] = _failure_text(res)
        if rec["status"] != "ok":
            rec["stderr_tail"] = res.stderr_tail
        append_record(self.trials, rec)
        self.records.append(rec)
        return rec

    def _score_output(self, rec: dict, res: RunResult, config: Mapping) -> None:
        metrics = parse_metrics(res.stdout)
        if rec["stage"] == "warmup":
            names = [n for inst in metrics.values() for n in inst]
            if self.s.metric is not None:
                self.metric = self.s.metric
            else:
                self.metric = names[0] if names else WALL_METRIC
            rec["metric"] = self.metric
        if self.metric == WALL_METRIC:
            rec.update(metric=WALL_METRIC, value=round(res.wall_s, 4), per_instance=None)
            return
        n = self._instances(config, metrics)
        lower = self.s.lower_is_better
        value, per, error = combine_metric(metrics, self.metric, n, lower)
        rec["metric"] = self.metric
        if error:
            rec.update(status="failed", error=error)
        else:
            rec.update(value=value, per_instance=per)

    def _instances(self, config: Mapping, metrics: Mapping) -> int:
        """Instances the trial ran: as planned for its instances value (1, cpulaunch's
        default, when the axis is not searched), or more if prefixed lines name more
        (e.g. CPULAUNCH_NINSTANCES set in the environment)."""
        planned = len(self.space.instances[config["instances"]].cpulists) if "instances" in config else 1
        seen = [i for i in metrics if i is not None]
        return max([planned] + [i + 1 for i in seen])

    # ---------------------------------------------------------------- the loop

    def run(self) -> int:
        """The whole tune; returns the exit code (0; 130 when interrupted).

        Raises:
            TuneError: see :class:`TuneError`.
        """
        self.open()
        handlers = _hold_signals()
        try:
            return self._run()
        except KeyboardInterrupt:
            self._close_progress()
            self._say(f"interrupted: {len(self.records)} trial(s) kept in {self.trials}; "
                      "run the same command again to resume")
            return 130
        finally:
            _restore_signals(handlers)
            self._close_progress()

    def _run(self) -> int:
        used = _cost(self.records, ["warmup", "grid", "coarse", "fine"])
        deadline = self.clock() + self.s.budget_s - used
        if self.records:
            self.notes.append(f"resumed: {len(self.records)} recorded trial(s) ({format_duration(used)} of the "
                              "budget) reused")
        warm = [r for r in self.records if r.get("stage") == "warmup" and r["status"] == "ok"]
        if warm:
            self.metric = warm[0]["metric"]
        else:
            self._open_progress(1)
            rec = self.run_trial(self.space.default, "warmup", 0, 1, deadline)
            self._tick(rec, deadline)
            if rec["status"] == "timeout":
                raise TuneError(f"the warm-up run with cpulaunch's default configuration did not end within "
                                f"{format_duration(rec['timeout_s'])}; a trial must fit the budget several times: "
                                "raise --budget or make the program do less work")
            if rec["status"] != "ok":
                raise TuneError(f"the warm-up run with cpulaunch's default configuration failed ({rec['error']}); "
                                f"fix the program first: {shlex.join(rec['argv'])}")
        if self.metric == WALL_METRIC:
            self.notes.append("the program printed no CPULAUNCH_METRIC line: tune times the whole run (wall "
                              "seconds, lower is better), so the program must do a fixed amount of work")
        while True:
            stage = next_stage(self.space, self.records, self.s.budget_s, self.s.rounds, self._lower)
            if stage is None:
                break
            for n in stage.notes:
                if n not in self.notes:
                    self.notes.append(n)
            if not self._run_stage(stage, deadline):
                break
        return 0

    @property
    def _lower(self) -> bool:
        return self.metric == WALL_METRIC or self.s.lower_is_better

    def _run_stage(self, stage: Stage, deadline: float) -> bool:
        """Run the stage's missing slots; False when the budget stopped it."""
        order = stage.order(self.s.seed)
        slots = _slot_records(self.records)
        todo = [(c, r) for c, r in order if not _slot_done(slots.get((config_key(c), r), ()))]
        self._open_progress(len(todo))
        for config, rnd in todo:
            key = config_key(config)
            if key in _dropped(self.records):
                self._skip()
                continue
            attempts = _slot_records(self.records).get((key, rnd), [])
            while not _slot_done(attempts):
                need = self._trial_estimate(key)
                if self.clock() + need > deadline:
                    left = sum(1 for c, r in todo if not _slot_done(
                        _slot_records(self.records).get((config_key(c), r), ())))
                    self.notes.append(f"budget reached: {left} planned trial(s) not run; rerun with a larger "
                                      "--budget and the same --out to continue")
                    return False
                rec = self.run_trial(config, stage.name, rnd, len(attempts) + 1, deadline)
                attempts = attempts + [rec]
                if not _slot_done(attempts):
                    self._open_progress(1)  # the busy trial's repeat
                self._tick(rec, deadline)
        return True

    def _trial_estimate(self, key: str) -> float:
        own = [float(r["cost_s"]) for r in self.records if r["key"] == key and r["status"] == "ok"]
        every = [float(r["cost_s"]) for r in self.records if r["status"] == "ok"]
        return statistics.median(own or every or [0.0])

    # ---------------------------------------------------------------- progress

    def _open_progress(self, n: int) -> None:
        self._total += n
        if not self._progress:
            return
        if self._bar is None and _stderr_tty(self.err):
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=self._total, unit="trial", file=self.err, dynamic_ncols=True,
                                 desc="tune")
                return
        if self._bar is not None:
            self._bar.total = self._total
            self._bar.refresh()

    def _skip(self) -> None:
        self._total -= 1
        if self._bar is not None:
            self._bar.total = self._total
            self._bar.refresh()

    def _best_text(self) -> str:
        scores = {k: s for k, s in score(self.records).items() if s.n}
        if not scores:
            return "best: none yet"
        pick = (min if self._lower else max)(scores, key=lambda k: scores[k].median)
        return f"best: {pick} {_num(scores[pick].median)} {self.metric}"

    def _tick(self, rec: Mapping, deadline: float) -> None:
        self._done_count += 1
        left = format_duration(max(0.0, deadline - self.clock()))
        if not self._progress:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(f"{self._best_text()}; {left} left", refresh=False)
            self._bar.update(1)
            return
        if rec["status"] == "ok":
            what = f"{_num(rec['value'])} {rec['metric']}"
        else:
            what = rec["status"] + ": " + str(rec["error"])
        flag = f" [busy: foreign load {max(rec['load']['before_pct'], rec['load']['during_pct']):.0f}%]" \
            if rec.get("busy") else ""
        stage = "warm-up" if rec["stage"] == "warmup" else f"{rec['stage']} round {rec['round']}"
        self._say(f"[{self._done_count}/{max(self._total, self._done_count)}] {stage}: {rec['key']}: "
                  f"{what}{flag} ({rec['wall_s']:.1f}s); {self._best_text()}; {left} of budget left")

    def _close_progress(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _say(self, text: str) -> None:
        try:
            self.err.write(f"cpulaunch tune: {text}\n")
            self.err.flush()
        except (OSError, ValueError):
            pass


def _stderr_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _hold_signals() -> dict:
    """SIGTERM and SIGHUP become :class:`_Interrupted` (like Ctrl-C) during a tune."""
    def handler(signum, _frame):
        raise _Interrupted(signum)

    old = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            old[sig] = signal.signal(sig, handler)
        except (ValueError, OSError):  # not the main thread
            pass
    return old


def _restore_signals(old: Mapping) -> None:
    for sig, h in old.items():
        try:
            signal.signal(sig, h)
        except (ValueError, OSError):
            pass


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _num(x: Optional[float]) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    ax = abs(x)
    if ax >= 1000:
        return f"{x:.0f}"
    if ax >= 100:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    return f"{x:.4g}"


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class Outcome:
    """The result of a tune, for the report.

    Attributes:
        rows: ``(key, config, Summary)`` of every configuration tried, best first (those
            without a scored trial last).
        recommended: the key of the recommended configuration, or None.
        verdict: one line on the recommendation vs cpulaunch's default.
        default_key: the default configuration's key.
    """

    rows: tuple
    recommended: Optional[str]
    verdict: str
    default_key: str


def decide(space: Space, records: Sequence[Mapping], rounds: int, lower_is_better: bool) -> Outcome:
    """Rank the configurations and pick the recommendation (pure).

    Among configurations with at least ``rounds`` scored trials, the best median is
    recommended when it is better than cpulaunch's default beyond the spread
    (:func:`compare`); otherwise the default is (a difference within noise is no reason to
    change). When the default has no complete result, the best median is.
    """
    summaries = score(records)
    configs = {r["key"]: r["config"] for r in records if r.get("stage") != "warmup"}
    scored = [k for k, s in summaries.items() if s.n]
    scored.sort(key=lambda k: summaries[k].median, reverse=not lower_is_better)
    rows = tuple((k, configs[k], summaries[k]) for k in scored) + tuple(
        (k, configs[k], summaries[k]) for k in sorted(summaries) if not summaries[k].n)
    dkey = config_key(space.default)
    complete = [k for k in scored if summaries[k].n >= rounds]
    if not complete:
        return Outcome(rows, None, f"no configuration has {rounds} successful trials", dkey)
    top = complete[0]
    d = summaries.get(dkey)
    if d is None or d.n < rounds:
        return Outcome(rows, top, f"the best median; cpulaunch's default ({dkey}) has no complete result", dkey)
    if top == dkey:
        return Outcome(rows, dkey, "cpulaunch's default has the best median", dkey)
    verdict = compare(summaries[top], d, lower_is_better)
    ratio = _ratio(summaries[top].median, d.median, lower_is_better)
    if verdict == "better":
        return Outcome(rows, top, f"better than cpulaunch's default ({dkey}) beyond the measured spread: "
                                  f"{ratio}", dkey)
    return Outcome(rows, dkey, f"the best median ({top}, {ratio}) is within noise of cpulaunch's default, "
                               "so the default is kept", dkey)


def _ratio(a: float, b: float, lower_is_better: bool) -> str:
    """Speed-up of ``a`` over ``b`` as ``"1.12x"`` (b/a for lower-is-better)."""
    try:
        r = (b / a) if lower_is_better else (a / b)
    except ZeroDivisionError:
        return "-"
    return f"{r:.2f}x"


def report_text(tuner: Tuner, outcome: Outcome) -> str:
    """The report: what was tuned, the table (best first), notes, the recommendation."""
    s = tuner.s
    lower = tuner._lower
    summaries = {k: sm for k, _, sm in outcome.rows}
    d = summaries.get(outcome.default_key)
    lines = [
        f"cpulaunch tune: {shlex.join(s.program)}",
        f"metric: {tuner.metric} ({'lower' if lower else 'higher'} is better"
        + ("; summed over concurrent instances" if tuner.metric != WALL_METRIC and not lower else "")
        + ("; averaged over concurrent instances" if tuner.metric != WALL_METRIC and lower else "") + ")",
        f"trials: {len(tuner.records)} recorded in {tuner.trials} "
        f"({format_duration(_cost(tuner.records, ['warmup', 'grid', 'coarse', 'fine']))} of a "
        f"{format_duration(s.budget_s)} budget); {s.rounds} per configuration, round-robin, seed {s.seed}",
        "",
    ]
    width = max([len(k) for k in summaries] + [len("configuration")])
    head = f"{'rank':>4}  {'configuration':<{width}}  {'median':>9}  {'min':>9}  {'max':>9}  {'spread':>6}  " \
           f"{'trials':>6}  vs default"
    lines += [head, "-" * len(head)]
    rank = 0
    for key, _, sm in outcome.rows:
        mark = ("*" if key == outcome.recommended else " ")
        if sm.n:
            rank += 1
            if key == outcome.default_key:
                vs = "(the default)"
            elif d is not None and d.n:
                vs = f"{_ratio(sm.median, d.median, lower)} {compare(sm, d, lower)}"
            else:
                vs = "-"
            extra = []
            if sm.n < s.rounds:
                extra.append(f"only {sm.n} of {s.rounds} trials")
            if sm.failed:
                extra.append(f"{sm.failed} failed")
            if sm.busy:
                extra.append(f"{sm.busy} busy")
            spread = f"{sm.spread_pct:.0f}%" if not math.isnan(sm.spread_pct) else "-"
            lines.append(f"{rank:>3}{mark}  {key:<{width}}  {_num(sm.median):>9}  {_num(sm.low):>9}  "
                         f"{_num(sm.high):>9}  {spread:>6}  {sm.n:>6}  {vs}"
                         + (f" ({'; '.join(extra)})" if extra else ""))
        else:
            errs = [r.get("error") for r in tuner.records if r["key"] == key and r["status"] != "ok"]
            lines.append(f"{'-':>4}  {key:<{width}}  {'failed':>9}  {len(errs)} trial(s): {errs[-1] if errs else ''}")
    lines.append("")
    lines.append("spread = (max - min) / median of a configuration's trials; a configuration is better or worse "
                 "than the default only when the difference of medians exceeds the larger spread, else within noise.")
    if tuner.notes:
        lines.append("")
        lines += [f"note: {n}" for n in tuner.notes]
    lines.append("")
    if outcome.recommended is None:
        lines.append(f"no recommendation: {outcome.verdict}")
    else:
        lines.append(f"recommended: {outcome.recommended}: {outcome.verdict}")
        cfg = next(c for k, c, _ in outcome.rows if k == outcome.recommended)
        lines.append("  " + winner_command(tuner, cfg))
        lines.append(f"  cpulaunch --config {shlex.quote(str(s.out / 'best.toml'))} -- {shlex.join(s.program)}")
    return "\n".join(lines) + "\n"


def winner_command(tuner: Tuner, config: Mapping) -> str:
    """``cpulaunch FLAGS -- PROGRAM`` for ``config``, shell-quoted."""
    return shlex.join(["cpulaunch", *config_flags(tuner.space, config), "--", *tuner.s.program])


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    # A JSON string is a TOML basic string, once DEL (which JSON leaves bare) is escaped.
    return json.dumps(str(v)).replace("\x7f", "\\u007f")


def best_toml(tuner: Tuner, outcome: Outcome) -> str:
    """best.toml: ``[cpulaunch]`` holds the recommended configuration (every searched axis
    explicit), ``[measured]`` what backs it (cpulaunch's --config ignores that table)."""
    key = outcome.recommended
    cfg, sm = next((c, s) for k, c, s in outcome.rows if k == key)
    d = dict((k, s) for k, _, s in outcome.rows).get(outcome.default_key)
    lines = [f"# cpulaunch tune's recommendation for: {shlex.join(tuner.s.program)}",
             f"# use: cpulaunch --config best.toml -- {shlex.join(tuner.s.program)}", "", "[cpulaunch]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in config_toml(tuner.space, cfg).items()]
    measured = {
        "configuration": key, "verdict": outcome.verdict, "metric": tuner.metric,
        "lower_is_better": tuner._lower, "median": sm.median, "min": sm.low, "max": sm.high, "trials": sm.n,
        "default_configuration": outcome.default_key,
    }
    if d is not None and d.n:
        measured.update(default_median=d.median, default_min=d.low, default_max=d.high)
    measured.update(program=list(tuner.s.program), date=_now_iso())
    lines += ["", "[measured]"] + [f"{k} = {_toml_value(v)}" for k, v in measured.items()
                                   if not (isinstance(v, float) and not math.isfinite(v))]
    return "\n".join(lines) + "\n"


def report_png(tuner: Tuner, outcome: Outcome, path: Path) -> Optional[str]:
    """The chart: each scored configuration's median with its min-max range, best at the
    top, the default and the recommendation marked. Returns a note instead when
    matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "report.png skipped: matplotlib is not installed (pip install matplotlib)"
    rows = [(k, s) for k, _, s in outcome.rows if s.n]
    if not rows:
        return "report.png skipped: no configuration has a result"
    rows = rows[::-1]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.35 * len(rows)))
    ys = list(range(len(rows)))
    med = [s.median for _, s in rows]
    err = [[s.median - s.low for _, s in rows], [s.high - s.median for _, s in rows]]
    colors = ["tab:green" if k == outcome.recommended else "tab:orange" if k == outcome.default_key
              else "tab:blue" for k, _ in rows]
    ax.barh(ys, med, color=colors, alpha=0.6)
    ax.errorbar(med, ys, xerr=err, fmt="none", ecolor="black", capsize=3)
    ax.set_yticks(ys)
    ax.set_yticklabels([k + (" (default)" if k == outcome.default_key else "") for k, _ in rows], fontsize=8)
    ax.set_xlabel(f"{tuner.metric} ({'lower' if tuner._lower else 'higher'} is better); median, min-max")
    ax.set_title("cpulaunch tune: " + shlex.join(tuner.s.program)[:80], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def finish(tuner: Tuner, out=None) -> Outcome:
    """Write report.txt, report.png and best.toml, print the report; returns the outcome."""
    outcome = decide(tuner.space, tuner.records, tuner.s.rounds, tuner._lower)
    out_dir = tuner.s.out
    note = report_png(tuner, outcome, out_dir / "report.png")
    if note:
        tuner.notes.append(note)
    if outcome.recommended is not None:
        (out_dir / "best.toml").write_text(best_toml(tuner, outcome))
    text = report_text(tuner, outcome)
    (out_dir / "report.txt").write_text(text)
    stream = out or sys.stdout
    stream.write(text)
    stream.flush()
    return outcome


# --------------------------------------------------------------------------- dry run


def plan_text(settings: Settings, space: Space) -> str:
    """What --dry-run prints: the space, its configurations with their flags, and the
    coarse stage the adaptive search would start with."""
    grid = grid_configs(space)
    coarse = coarse_configs(space)
    lines = ["axes: " + ", ".join(f"{a} ({', '.join(_fmt_value(v) for v in space.values[a])})"
                                  for a in space.axes)]
    if space.fixed:
        lines.append("fixed: " + config_key(space.fixed))
    for label, ch in space.instances.items():
        lines.append(f"instances={label}: {' '.join(ch.flags)} -> CPUs " + " | ".join(ch.cpulists))
    lines += [f"note: {n}" for n in space.notes]
    lines.append(f"grid: {len(grid)} configurations x {settings.rounds} trials; default: {config_key(space.default)}")
    for c in grid:
        lines.append(f"  {config_key(c)}: {shlex.join(config_flags(space, c)) or '(no flags)'}")
    lines.append(f"coarse stage (when the grid does not fit {format_duration(settings.budget_s)}): "
                 f"{len(coarse)} configurations")
    for c in coarse:
        lines.append(f"  {config_key(c)}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the command


def _topology(sysroot: str):
    from cpulaunch.machine import probe

    if not os.path.isdir(sysroot):
        raise TuneError(f"--sysroot {sysroot}: no such folder")
    return probe.probe(sysroot)


def _positive_float(name: str, value: Optional[float], minimum: float = 0.0) -> Optional[float]:
    if value is not None and (not math.isfinite(value) or value < minimum):
        raise TuneError(f"--{name} {value}: give a finite number >= {minimum:g}")
    return value


_CONTEXT = {"allow_interspersed_args": False, "help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.command(context_settings=_CONTEXT, epilog="\b\nAxes for --space:\n" + "\n".join(
    f"  {a:<14} {h}" for a, h in AXIS_HELP.items()) + "\n\nMethod, files and metric line: docs/tune.md")
@click.option("--budget", default="10m", show_default=True,
              help="Time for the whole search: 90s, 10m, 1h30m (trials recorded by an earlier run count).")
@click.option("--out", "out", default="cpulaunch-tune", show_default=True, type=click.Path(file_okay=False),
              help="Folder for trials.jsonl, report.txt, report.png, best.toml; a rerun resumes from it.")
@click.option("--space", default=None, help="Comma-separated axes to search (default: all that apply here).")
@click.option("--lower-is-better", is_flag=True, help="The program's CPULAUNCH_METRIC is a cost (latency).")
@click.option("--trials-per-config", type=int, default=3, show_default=True,
              help="Trials per configuration (at least 3).")
@click.option("--metric", default=None, help="Which CPULAUNCH_METRIC name to use (default: the first printed).")
@click.option("--trial-timeout", type=float, default=None,
              help="Seconds before a trial is stopped (default: 3x the slowest successful trial + 10, >= 30).")
@click.option("--busy-threshold", type=float, default=10.0, show_default=True,
              help="Foreign CPU load, percent of the machine, above which a trial is repeated once, then flagged.")
@click.option("--load-sample", type=float, default=0.3, show_default=True,
              help="Seconds of foreign-load measurement before each trial.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the per-round shuffle.")
@click.option("--sysroot", default="/", show_default=True, type=click.Path(file_okay=False),
              help="Read the machine from this root (with --dry-run only: trials run here).")
@click.option("--dry-run", is_flag=True, help="Print the space and the configurations; run nothing.")
@click.argument("program", nargs=-1, type=click.UNPROCESSED)
def tune_command(budget, out, space, lower_is_better, trials_per_config, metric, trial_timeout,
                 busy_threshold, load_sample, seed, sysroot, dry_run, program):
    """Find the fastest cpulaunch configuration for PROGRAM on this machine, by measurement.

    \b
    Examples:
      cpulaunch tune --budget 15m -- python examples/infer.py --batch-size 32
      cpulaunch tune --space allocator,omp-runtime --out tune1 -- python serve.py
      cpulaunch tune --dry-run -- python x.py
    The program reports its figure with a line `CPULAUNCH_METRIC name=value` (higher is
    better unless --lower-is-better); without one, tune times the whole run.
    """
    return _command(budget, out, space, lower_is_better, trials_per_config, metric, trial_timeout,
                    busy_threshold, load_sample, seed, sysroot, dry_run, program)


def _settings(budget, out, space, lower_is_better, trials_per_config, metric, trial_timeout,
              busy_threshold, load_sample, seed, sysroot, dry_run, program) -> Settings:
    if trials_per_config < 3:
        raise TuneError(f"--trials-per-config {trials_per_config}: at least 3 (a median and a spread need them)")
    if not program and not dry_run:
        raise TuneError("no program given; put it after tune's options, e.g. "
                        "`cpulaunch tune --budget 10m -- python infer.py`")
    if sysroot not in ("/", "") and not dry_run and Path(sysroot).resolve() != Path("/"):
        raise TuneError(f"--sysroot {sysroot} describes another machine; trials run on this one, "
                        "so use it with --dry-run only")
    if metric is not None and not re.fullmatch(r"[A-Za-z_][\w.\-]*", metric):
        raise TuneError(f"--metric {metric!r}: a metric name is letters, digits, _ . - (e.g. samples_per_s)")
    return Settings(
        program=tuple(program), out=Path(out), budget_s=parse_duration(budget), axes=parse_axes(space),
        lower_is_better=lower_is_better, rounds=trials_per_config, metric=metric,
        trial_timeout=_positive_float("trial-timeout", trial_timeout, 0.1),
        busy_threshold=_positive_float("busy-threshold", busy_threshold),
        load_sample=_positive_float("load-sample", load_sample), seed=seed, sysroot=sysroot or "/",
        dry_run=dry_run)


def _command(*values) -> int:
    settings = _settings(*values)
    topo = _topology(settings.sysroot)
    space = build_space(topo, settings.axes, available_libraries())
    if settings.dry_run:
        sys.stdout.write(plan_text(settings, space))
        return 0
    tuner = Tuner(settings, space)
    code = tuner.run()
    if code != 0:
        return code
    outcome = finish(tuner)
    return 0 if outcome.recommended is not None else 1


def main(args: Sequence[str]) -> int:
    """``cpulaunch tune ARGS...``: parse tune's options, run, return the exit code.

    0: done (a recommendation written); 1: no configuration completed its trials; 130:
    interrupted (the trials so far are kept: rerun to resume).

    Raises:
        TuneError (a CpulaunchError) and click.UsageError for the user's mistakes; the
        caller prints one line and exits 2.
    """
    try:
        code = tune_command.main(args=list(args), prog_name="cpulaunch tune", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except (KeyboardInterrupt, click.exceptions.Abort):
        return 130
    return 0 if code is None else int(code)

