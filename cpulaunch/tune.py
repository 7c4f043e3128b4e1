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
  before and during every trial by the package's own meter (:class:`LoadWindow`,
  :func:`sample_load`; ``scripts/benchkit.py`` imports it) (a busy trial is repeated once,
  then flagged; a recommendation that stands on flagged trials says so in every output
  and tune exits :data:`BUSY_EXIT`); failed and timed-out trials are recorded, never
  scored; one configuration is better than another only when the difference of medians
  exceeds the larger of their spreads (max - min).
* **Trials** (:func:`run_command`) run through the launcher's
  :class:`cpulaunch.launch.ProcessGroup`: own session, parent-death signal, a watchdog
  if tune is SIGKILLed, and the whole group SIGKILLed and reaped when the trial ends, so
  nothing a trial started in its group outlives it.
* **Files**: ``DIR/trials.jsonl`` (one JSON object per trial, appended as it ends; read
  back through the probe's bounded reader, a line that is not a trial record skipped with
  a note), ``DIR/tune.json`` (what was tuned, checked on resume), ``DIR/report.txt``,
  ``DIR/report.png`` (matplotlib), ``DIR/best.toml``; each written whole or not at all.

This module is never imported on the launch path; tqdm, matplotlib and psutil are imported
lazily (``pip install 'cpulaunch[tune]'``), with plain progress lines, no chart and a
/proc/stat reading without them.
"""

from __future__ import annotations

import collections
import io
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
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence

import click

from cpulaunch import log as _log
from cpulaunch.errors import CpulaunchError, printable

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
    "attribute_metrics",
    "combine_metric",
    "Summary",
    "summarize",
    "compare",
    "Stage",
    "next_stage",
    "read_text",
    "record_problem",
    "parse_records",
    "read_records",
    "append_record",
    "write_file",
    "score",
    "Load",
    "LoadWindow",
    "sample_load",
    "BUSIEST_MIN_PCT",
    "LoadReading",
    "Meter",
    "load_meter",
    "parse_proc_stat",
    "RunResult",
    "run_command",
    "Settings",
    "Tuner",
    "Outcome",
    "decide",
    "busy_warning",
    "BUSY_EXIT",
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
#: Largest trials.jsonl or tune.json tune reads (a trial's record is 1-4 KB: tens of
#: thousands of trials); a bigger file is refused, as is one that is not a regular file.
TRIALS_BYTES = 64 << 20
#: Largest |value| a record may hold: sums and medians of such values stay finite.
MAX_VALUE = 1e300
#: Bytes of a trial's metric lines kept (the latest); the rest of its stdout is not kept.
METRIC_BYTES = 1 << 20

_METRIC_LINE = re.compile(r"^(?:\[(\d+)\] )?" + METRIC_PREFIX + r"((?:\s+[A-Za-z_][\w.\-]*=\S+)+)\s*$")
_PREFIX_BYTES = METRIC_PREFIX.encode()
_PAIR = re.compile(r"([A-Za-z_][\w.\-]*)=(\S+)")
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([smh])")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


log = _log.get(__name__)


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


def attribute_metrics(per_instance: Mapping, ninstances: int) -> dict:
    """The metrics of :func:`parse_metrics` that belong to the instances tune started
    (pure): with one instance, only the unprefixed lines (cpulaunch prefixes nothing then,
    so a line reading ``[1] CPULAUNCH_METRIC ...`` is the program's own text, not an
    instance's); with several, only ``[0]`` .. ``[n-1]`` (cpulaunch prefixes every line
    then, so an unprefixed line or a higher index is not an instance's).

    ``({None: {"s": 7.0}, 1: {"s": 9.0}}, 1)`` -> ``{None: {"s": 7.0}}``.
    """
    if ninstances <= 1:
        return {None: dict(per_instance[None])} if None in per_instance else {}
    return {i: dict(v) for i, v in per_instance.items() if i is not None and i < ninstances}


def combine_metric(per_instance: Mapping, name: str, ninstances: int, lower_is_better: bool) -> tuple:
    """One trial's figure from its instances' metrics (pure).

    Instances run concurrently, so a throughput (higher is better) is summed over them;
    a latency (``--lower-is-better``) is not additive and is averaged. Every instance must
    report ``name``: with one instance its lines are unprefixed (key None); with several,
    ``[0]`` .. ``[n-1]`` (:func:`attribute_metrics` keeps only those).

    Returns:
        ``(value, [per-instance values], None)``, or ``(None, [], error message)``.
    """
    if ninstances <= 1:
        vals = [(per_instance.get(None) or {}).get(name)]
    else:
        vals = [(per_instance.get(i) or {}).get(name) for i in range(ninstances)]
    missing = [i for i, v in enumerate(vals) if v is None]
    if missing:
        who = "the program" if ninstances <= 1 else "instance " + ",".join(map(str, missing))
        return None, [], f"{who} printed no '{METRIC_PREFIX} {name}=...' line"
    value = sum(vals) / len(vals) if lower_is_better else sum(vals)
    if not all(math.isfinite(v) and abs(v) <= MAX_VALUE for v in vals + [value]):
        return None, [], f"'{METRIC_PREFIX} {name}=...' is not a finite number (at most {MAX_VALUE:g} in size)"
    return value, vals, None


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


_STATUSES = ("ok", "failed", "timeout")
_STAGES = ("warmup", "grid", "coarse", "fine")


def read_text(path: Path, cap: int = TRIALS_BYTES) -> Optional[str]:
    """The text of one of tune's own files (trials.jsonl, tune.json) through the probe's
    bounded reader (:class:`cpulaunch.machine.probe.FileReader`: opened without blocking,
    regular files only, at most ``cap`` bytes; bytes that are not UTF-8 read as U+FFFD);
    None when the file does not exist.

    Raises:
        TuneError: it is a link, not a regular file (a FIFO, /dev/zero), larger than
            ``cap`` bytes, or unreadable; the message names it and says what to do.
    """
    from cpulaunch.machine import probe

    if os.path.islink(path):
        raise TuneError(f"{path} is a symbolic link; tune reads and writes only its own files in --out: "
                        "remove it or use another --out")
    reader = probe.FileReader(str(path.parent))
    text = reader.read(path.name, strict=False, cap=cap)
    if text is None and reader.skipped:
        what = reader.skipped[-1][1]
        raise TuneError(f"{path}: {what}; tune writes a regular file there: remove it or use another --out")
    return text


def _number(v, low: float = -MAX_VALUE) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and low <= v <= MAX_VALUE


def _count(v, low: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and low <= v < 1 << 31


def record_problem(rec) -> Optional[str]:
    """Why ``rec`` (one parsed line of trials.jsonl) is not a trial record tune can use,
    or None. The fields the search and the report rely on must have their types
    (docs/tune.md): ``key`` a string; ``status`` ok/failed/timeout; ``stage``
    warmup/grid/coarse/fine; ``round`` an integer >= 0 and ``attempt`` >= 1 (when given);
    ``config`` an object; ``cost_s`` and ``wall_s`` finite numbers >= 0; ``busy`` and
    ``repeat`` booleans (when given); an ``ok`` record's ``metric`` a string and ``value``
    a finite number (|value| <= :data:`MAX_VALUE`).

    ``{"key": "allocator=default", "status": "ok", "round": "1", ...}`` -> ``"'round' is
    not an integer >= 0"``.
    """
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    checks = (
        ("key", isinstance(rec.get("key"), str), "a string"),
        ("status", rec.get("status") in _STATUSES, "one of " + "/".join(_STATUSES)),
        ("stage", rec.get("stage") in _STAGES, "one of " + "/".join(_STAGES)),
        ("round", _count(rec.get("round"), 0), "an integer >= 0"),
        ("attempt", _count(rec.get("attempt", 1), 1), "an integer >= 1"),
        ("config", isinstance(rec.get("config"), dict), "an object"),
        ("cost_s", _number(rec.get("cost_s"), 0.0), "a number >= 0"),
        ("wall_s", _number(rec.get("wall_s"), 0.0), "a number >= 0"),
        ("busy", isinstance(rec.get("busy", False), bool), "true or false"),
        ("repeat", isinstance(rec.get("repeat", False), bool), "true or false"),
    )
    if rec.get("status") == "ok":
        checks += (("metric", isinstance(rec.get("metric"), str), "a string"),
                   ("value", _number(rec.get("value")), f"a finite number (at most {MAX_VALUE:g} in size)"))
    for name, ok, what in checks:
        if not ok:
            return f"{name!r} is not {what}"
    return None


def parse_records(text: str, reasons: Optional[list] = None) -> tuple:
    """The trial records of trials.jsonl's text: ``(records, skipped line count)``. A line
    that is not JSON (a write cut short, an edit), nested too deep to parse, or not a
    trial record (:func:`record_problem`) is skipped and counted; blank lines are not.

    Args:
        text: the file's text (:func:`read_text`).
        reasons: when a list, ``(line number, why)`` of each skipped line is appended.
    """
    records, skipped = [], 0
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError) as exc:
            rec, why = None, ("nested too deep" if isinstance(exc, RecursionError) else "not JSON")
        else:
            why = record_problem(rec)
        if why is None:
            records.append(rec)
            continue
        skipped += 1
        if reasons is not None:
            reasons.append((number, why))
    return records, skipped


def read_records(path: Path, reasons: Optional[list] = None) -> tuple:
    """The trials of ``DIR/trials.jsonl``: ``(records, skipped line count)``
    (:func:`read_text`, :func:`parse_records`); ``([], 0)`` when there is no file.

    Raises:
        TuneError: the file is refused by :func:`read_text`.
    """
    return parse_records(read_text(path) or "", reasons)


def append_record(path: Path, record: Mapping, newline_first: bool = False) -> None:
    """Append one record as one line in one write (O_APPEND; never through a link), so an
    interruption leaves either the whole line or none of it; a failed write (no space
    left) is cut off again, so the file keeps only whole records. ``newline_first``
    ends a last line left without its newline first.

    Raises:
        OSError: the file cannot be opened or written (the caller names it).
    """
    data = (("\n" if newline_first else "") + json.dumps(record, sort_keys=False) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        size = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view):]
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def write_file(path: Path, data) -> None:
    """Write ``data`` (str or bytes) to ``path`` whole or not at all: into a new file
    beside it (``tempfile.mkstemp``: O_EXCL, never through a link), renamed over
    ``path`` once complete (a link planted at ``path`` is replaced, not followed). On
    failure the new file is removed and the OSError propagates with ``path`` as its
    filename."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            os.fchmod(fd, 0o644)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        os.unlink(tmp)
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    except BaseException:
        os.unlink(tmp)
        raise


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
#
# The foreign-load meter of tune and of scripts/benchkit.py (which imports it from here):
#
#     foreign = machine busy time (user+nice+system+irq+softirq, all CPUs)
#               - our own CPU time (this process, all its threads, and the children it has
#                 waited for: getrusage counts a child once it is reaped)
#               + steal (time the hypervisor gave our virtual CPUs to other guests)
#
# divided by the wall time of the window, in percent of the whole machine (os.cpu_count()
# CPUs, not only the ones this process may use: a foreign thread on any CPU can stall a
# run that spans them).

#: A process must use at least this percent of one CPU to be named among the busiest.
BUSIEST_MIN_PCT = 5.0
#: /proc/stat fields (proc(5)) that count as busy time.
_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")


@dataclass(frozen=True)
class Load:
    """The CPU time others took from the machine during one window.

    Attributes:
        others: CPUs' worth (CPU seconds / wall seconds; 1.0 = one CPU kept busy
            throughout) of the whole machine's busy time minus ours; steal not included.
        steal: CPUs' worth of steal time.
        seconds: wall-clock length of the window.
        ncpu: logical CPUs of the machine (``os.cpu_count()``), the whole the percentages
            are of.
        busiest: ``(percent of one CPU, pid, name)`` of the busiest other processes,
            busiest first, as top shows them; empty unless asked for (``sample(..., top=N)``).
    """

    others: float
    steal: float
    seconds: float
    ncpu: int
    busiest: tuple = ()

    @property
    def foreign(self) -> float:
        """CPUs' worth of foreign load: others plus steal."""
        return self.others + self.steal

    @property
    def foreign_pct(self) -> float:
        """Foreign load, percent of the machine (what a busy threshold is compared with)."""
        return 100 * self.foreign / self.ncpu

    @property
    def others_pct(self) -> float:
        """Other processes' CPU time, percent of the machine (steal not included)."""
        return 100 * self.others / self.ncpu

    @property
    def steal_pct(self) -> float:
        """Steal time, percent of the machine."""
        return 100 * self.steal / self.ncpu


def parse_proc_stat(text: str, ticks_per_s: float) -> tuple:
    """The aggregate ``cpu`` line of /proc/stat (proc(5)) -> ``(busy, steal)`` CPU seconds
    since boot, all CPUs summed; busy = user + nice + system + irq + softirq.

    ``"cpu  100 0 50 900 0 5 5 20 0 0"`` at 100 ticks/s -> ``(1.6, 0.2)``.

    Raises:
        ValueError: no aggregate ``cpu`` line, or a field that is not a number.
    """
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            v = [int(x) for x in parts[1:]] + [0] * 8
            busy = v[0] + v[1] + v[2] + v[5] + v[6]
            return busy / ticks_per_s, v[7] / ticks_per_s
    raise ValueError("no aggregate cpu line in /proc/stat")


def _psutil():
    try:
        import psutil
    except ImportError:
        return None
    return psutil


def _machine_times() -> tuple:
    """``(busy, steal)`` CPU seconds of the whole machine since boot, summed over all CPUs:
    psutil's ``cpu_times()`` (the ``tune`` extra; on Linux it reads /proc/stat), else
    /proc/stat through the probe's bounded reader. A field the platform lacks counts 0."""
    psutil = _psutil()
    if psutil is not None:
        t = psutil.cpu_times()
        return sum(getattr(t, f, 0.0) for f in _BUSY_FIELDS), getattr(t, "steal", 0.0)
    from cpulaunch.machine import probe

    return parse_proc_stat(probe.FileReader("/").read("proc/stat") or "", float(os.sysconf("SC_CLK_TCK")))


def _own_cpu() -> float:
    """CPU seconds of this process (every thread) and of its waited-for descendants
    (trials, numactl, a launcher's instances: counted once they are reaped)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class LoadWindow:
    """A window that opens when made; ``load()`` is the foreign load since then.

    Wrap the timed run in it: children the run started and waited for count as ours, so
    only other processes' time (and steal) is left. ``load()`` may be read more than once.
    """

    def __init__(self) -> None:
        self._wall = time.monotonic()
        self._busy, self._steal = _machine_times()
        self._own = _own_cpu()

    def load(self, busiest: Iterable = ()) -> Load:
        """The foreign load since the window opened; ``busiest`` is passed through."""
        wall = max(1e-6, time.monotonic() - self._wall)
        busy, steal = _machine_times()
        others = max(0.0, (busy - self._busy) - (_own_cpu() - self._own))
        return Load(others=others / wall, steal=max(0.0, steal - self._steal) / wall,
                    seconds=wall, ncpu=os.cpu_count() or 1, busiest=tuple(busiest))


def _busiest(psutil, procs: list, top: int) -> list:
    """The ``top`` busiest of ``procs`` (psutil.Process, primed by cpu_percent(None)) since
    they were primed, other than this process and under BUSIEST_MIN_PCT left out."""
    found = []
    for p in procs:
        try:
            pct = p.cpu_percent(None)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if pct >= BUSIEST_MIN_PCT and p.pid != os.getpid():
            found.append((pct, p.pid, p.info["name"]))
    return sorted(found, reverse=True)[:top]


def sample_load(seconds: float, top: int = 0) -> Load:
    """The foreign load over the next ``seconds`` while this process only waits (a check
    before a run); with ``top`` > 0 also the ``top`` busiest other processes (psutil only:
    none without it)."""
    window = LoadWindow()
    psutil = _psutil() if top else None
    procs = []
    if psutil is not None:
        for p in psutil.process_iter(["pid", "name"]):
            try:
                p.cpu_percent(None)  # primes the per-process counter
                procs.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    time.sleep(seconds)
    return window.load(_busiest(psutil, procs, top) if psutil is not None else ())


@dataclass(frozen=True)
class LoadReading:
    """What a meter reports to :class:`Tuner`: the foreign CPU load over a window in
    percent of the whole machine (``os.cpu_count()`` CPUs); ``busiest``: ``(percent of one
    CPU, pid, name)`` of the busiest other processes when known."""

    foreign_pct: float
    busiest: tuple = ()


class Meter:
    """tune's foreign-load meter (:class:`LoadWindow`, :func:`sample_load`).

    The meter protocol, which :class:`Tuner`'s ``meter`` parameter takes (tests inject
    readings through it): ``name`` (recorded as each trial's ``load.meter``),
    ``sample(seconds) -> LoadReading`` (the load while tune waits, before a trial) and
    ``window() -> callable`` (opens a window; the callable returns the
    :class:`LoadReading` since then).
    """

    def __init__(self) -> None:
        #: "psutil", or "proc-stat" when psutil is not installed (no busiest processes then).
        self.name = "psutil" if _psutil() is not None else "proc-stat"

    def sample(self, seconds: float) -> LoadReading:
        load = sample_load(seconds, top=3)
        return LoadReading(load.foreign_pct, tuple(load.busiest))

    def window(self) -> Callable[[], LoadReading]:
        w = LoadWindow()
        return lambda: LoadReading(w.load().foreign_pct)


def load_meter() -> Meter:
    """The foreign-load meter tune uses by default (:class:`Meter`): code of this
    package, with psutil when installed (the ``tune`` extra)."""
    return Meter()


# --------------------------------------------------------------------------- running a trial


@dataclass(frozen=True)
class RunResult:
    """How one command ended.

    Attributes:
        status: "ok" (exit 0), "failed" (other exit code or signal) or "timeout".
        returncode: Popen style (negative: killed by that signal); None if it never started.
        wall_s: seconds from start to exit.
        stdout: the lines of its standard output that hold :data:`METRIC_PREFIX` (decoded,
            errors replaced; at most :data:`METRIC_BYTES`): nothing else is kept.
        stderr_tail: the last :data:`TAIL_CHARS` characters of its standard error.
    """

    status: str
    returncode: Optional[int]
    wall_s: float
    stdout: str
    stderr_tail: str


class _MetricLines:
    """Where a trial's standard output goes (the launcher's relay writes whole lines to
    it): only the lines that hold :data:`METRIC_PREFIX` are kept, at most
    :data:`METRIC_BYTES` of them (the latest), so a program that prints without end costs
    no memory and no disk."""

    def __init__(self) -> None:
        self.lines: collections.deque = collections.deque()
        self.size = 0

    def write(self, data: bytes) -> int:
        if _PREFIX_BYTES in data:
            for line in data.split(b"\n"):
                if _PREFIX_BYTES in line and len(line) <= METRIC_BYTES:
                    self.lines.append(line)
                    self.size += len(line) + 1
            while self.size > METRIC_BYTES:
                self.size -= len(self.lines.popleft()) + 1
        return len(data)

    def flush(self) -> None:
        pass

    def text(self) -> str:
        return "".join(line.decode(errors="replace") + "\n" for line in self.lines)


class _Tail:
    """Where a trial's standard error goes: its last ``size`` bytes are kept."""

    def __init__(self, size: int) -> None:
        self.buf, self.size = bytearray(), size

    def write(self, data: bytes) -> int:
        self.buf += data
        del self.buf[:-self.size]
        return len(data)

    def flush(self) -> None:
        pass


def _wait_trial(group, deadline: float) -> str:
    """Wait for the trial's process to exit: "ok"; at the monotonic ``deadline``
    SIGTERM to its group, SIGKILL :data:`STOP_WAIT` seconds later: "timeout"."""
    while True:
        group.poll()
        if not group.running():
            return "ok"
        left = deadline - time.monotonic()
        if left <= 0:
            group.stop(time.monotonic() + STOP_WAIT, signal.SIGTERM)
            return "timeout"
        group.wait(min(left, 1.0))


def run_command(argv: Sequence[str], timeout: float, environ: Optional[Mapping[str, str]] = None) -> RunResult:
    """Run ``argv`` as cpulaunch's launcher runs an instance (:class:`cpulaunch.launch.
    ProcessGroup`): in a session of its own (its own process group), stdin from /dev/null,
    the parent-death signal set and a watchdog that SIGKILLs the group if tune itself is
    SIGKILLed. Its output is read as it comes (:class:`_MetricLines`, :class:`_Tail`).

    It leaves nothing behind: once the command has exited, been stopped at ``timeout``
    seconds (SIGTERM to its group, SIGKILL :data:`STOP_WAIT` seconds later) or
    interrupted (KeyboardInterrupt: Ctrl-C, or SIGTERM/SIGHUP turned into it by
    :class:`Tuner`; SIGINT to its group, SIGKILL :data:`STOP_WAIT` seconds later, then
    the interrupt propagates), every process of its group is SIGKILLed and reaped: a
    program's background children and daemons that stay in its group (``sh -c 'sleep 300
    &'``) go with it. A process that leaves the group (setsid) is beyond reach, as for
    the launcher.

    Raises:
        TuneError: the command cannot be started.
    """
    from cpulaunch.launch import LaunchError, ProcessGroup, ProcessSpec

    out, err = _MetricLines(), _Tail(4 * TAIL_CHARS)
    group = ProcessGroup([ProcessSpec(0, "the trial", tuple(argv))], os.environ if environ is None else environ,
                         prefix_output=False, stdout=out, stderr=err, kill_timeout=STOP_WAIT)
    start = time.monotonic()
    try:
        try:
            group.start()
        except LaunchError as exc:
            raise TuneError(f"cannot start the trial: {exc}") from None
        status = _wait_trial(group, start + max(0.01, timeout))
        wall = time.monotonic() - start
    except BaseException:
        group.stop(time.monotonic() + STOP_WAIT, signal.SIGINT)
        raise
    finally:
        group.close()
    rc = group.results()[0].returncode
    if status == "ok" and rc != 0:
        status = "failed"
    return RunResult(status, rc, wall, out.text(), err.buf.decode(errors="replace")[-TAIL_CHARS:])


def _failure_text(res: RunResult) -> str:
    from cpulaunch.spawn import signal_name

    if res.status == "timeout":
        return f"timed out after {res.wall_s:.1f}s"
    rc = res.returncode
    how = f"killed by {signal_name(-rc)}" if rc is not None and rc < 0 else f"exit code {rc}"
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
        self._newline_first = False  # trials.jsonl ends in a line that could not be cut
        self._default_instances: Optional[int] = None

    # ---------------------------------------------------------------- files

    def _identity(self) -> dict:
        return {"program": list(self.s.program), "axes": list(self.s.axes),
                "lower_is_better": self.s.lower_is_better, "rounds": self.s.rounds,
                "metric": self.s.metric, "seed": self.s.seed}

    def open(self) -> None:
        """Create DIR, or check that its tune.json describes the same tune, and load the
        records of an earlier run (resume).

        Raises:
            TuneError: DIR is not usable (cannot be created or written: read-only, no
                space left), holds a different tune, or its tune.json/trials.jsonl is not
                a regular file of a bounded size (:func:`read_text`).
        """
        out = self.s.out
        created = not out.exists()
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TuneError(f"--out {out}: cannot create the folder: {exc.strerror or exc}") from None
        try:
            self._check_meta()
            self._load_trials()
        except TuneError:
            if created:  # leave nothing behind: the folder is ours and holds no trial
                _remove_quietly(out / "tune.json")
                _remove_quietly(out)
            raise

    def _check_meta(self) -> None:
        """tune.json: the same tune as this one, or written now."""
        from cpulaunch import __version__

        out, meta_path, mine = self.s.out, self.s.out / "tune.json", self._identity()
        text = read_text(meta_path, cap=1 << 20)
        if text is None:
            self._write("tune.json", json.dumps({**mine, "cpulaunch": __version__, "started": _now_iso()},
                                                indent=2) + "\n")
            return
        try:
            meta = json.loads(text)
        except (ValueError, RecursionError):
            meta = None
        if not isinstance(meta, dict):
            raise TuneError(f"{meta_path} is not what tune writes (a JSON object); use another --out or delete it")
        for k in _IDENTITY:
            if meta.get(k) != mine[k]:
                raise TuneError(
                    f"--out {out} holds a tune with another {k.replace('_', '-')} ({meta.get(k)!r}, now "
                    f"{mine[k]!r}); use another --out, or delete {out} to start over")

    def _load_trials(self) -> None:
        """The records of trials.jsonl (resume): a last line without its newline (a write
        cut short) is cut off; lines that are not trial records, and records of
        configurations not in this space, are left out with a note; each record's
        config is the space's own for its key."""
        text = read_text(self.trials) or ""
        body, _, tail = text.rpartition("\n")
        if tail:
            self._cut_partial(tail)
            text = body + "\n" if body else ""
            self.notes.append(f"1 unreadable line(s) of {self.trials} skipped (an interrupted write)")
        reasons: list = []
        self.records, skipped = parse_records(text, reasons)
        if skipped:
            why = "; ".join(f"line {n}: {w}" for n, w in reasons[:3]) + ("; ..." if skipped > 3 else "")
            self.notes.append(f"{skipped} line(s) of {self.trials} skipped: not trial records ({why})")
        by_key = {config_key(c): c for c in grid_configs(self.space)}
        stray = {r["key"] for r in self.records} - set(by_key)
        if stray:
            self.notes.append(f"{len(stray)} recorded configuration(s) are not in this space (libraries or "
                              "CPUs changed?) and are left out: " + ", ".join(sorted(stray)[:3]))
        self.records = [{**r, "config": dict(by_key[r["key"]])} for r in self.records if r["key"] in by_key]

    def _cut_partial(self, tail: str) -> None:
        """Cut ``tail`` (the last line, without its newline) off trials.jsonl; when its
        bytes are not known exactly (it was not UTF-8), the next record starts with a
        newline instead."""
        if "\ufffd" in tail:
            self._newline_first = True
            return
        try:
            os.truncate(self.trials, os.stat(self.trials).st_size - len(tail.encode()))
        except OSError as exc:
            raise self._write_error("trials.jsonl", exc) from None

    def _write(self, name: str, data) -> None:
        """:func:`write_file` of ``DIR/name``; OSError -> :meth:`_write_error`."""
        try:
            write_file(self.s.out / name, data)
        except OSError as exc:
            raise self._write_error(name, exc) from None

    def _write_error(self, name: str, exc: OSError) -> TuneError:
        """One line for a file of --out that cannot be written (read-only, no space left),
        saying what is kept."""
        n = len(self.records)
        kept = (f"the {n} trial(s) recorded before are kept in {self.trials}: free some space or make the "
                "folder writable, then run the same command again to resume") if n else \
            "give --out a writable folder with free space"
        return TuneError(f"--out {self.s.out}: cannot write {name}: {exc.strerror or exc}; {kept}")

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
        log.info("trial %d (%s, round %d): %s (timeout %.0fs)", len(self.records) + 1, stage, rnd,
                 printable(shlex.join(argv)), timeout)
        res = self.runner(argv, timeout)
        during = done()
        cost = self.clock() - t0
        log.info("trial %d: %s after %.1fs; foreign load %.0f%% before, %.0f%% during", len(self.records) + 1,
                 res.status, res.wall_s, before.foreign_pct, during.foreign_pct)
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
        try:
            append_record(self.trials, rec, self._newline_first)
        except OSError as exc:
            raise self._write_error("trials.jsonl", exc) from None
        self._newline_first = False
        self.records.append(rec)
        return rec

    def _score_output(self, rec: dict, res: RunResult, config: Mapping) -> None:
        n = self._instances(config)
        metrics = attribute_metrics(parse_metrics(res.stdout), n)
        if rec["stage"] == "warmup":
            names = [name for inst in metrics.values() for name in inst]
            if self.s.metric is not None:
                self.metric = self.s.metric
            else:
                self.metric = names[0] if names else WALL_METRIC
            rec["metric"] = self.metric
        if self.metric == WALL_METRIC:
            rec.update(metric=WALL_METRIC, value=round(res.wall_s, 4), per_instance=None)
            return
        value, per, error = combine_metric(metrics, self.metric, n, self.s.lower_is_better)
        rec["metric"] = self.metric
        if error:
            rec.update(status="failed", error=error)
        else:
            rec.update(value=value, per_instance=per)

    def _instances(self, config: Mapping) -> int:
        """Instances the trial starts: as planned for its ``instances`` value; when that
        axis is not searched, as cpulaunch plans without an instance flag in this
        environment (1 unless CPULAUNCH_NINSTANCES or the like say otherwise)."""
        if "instances" in config:
            return len(self.space.instances[config["instances"]].cpulists)
        if self._default_instances is None:
            from cpulaunch.api import plan_instances

            try:
                self._default_instances = len(plan_instances(program=("true",)).instances)
            except CpulaunchError as exc:  # the trial will say it again, as its failure
                log.info("cannot plan the default configuration here (%s); counting 1 instance", exc)
                self._default_instances = 1
        return self._default_instances

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
            self._announce(f"warm-up: one untimed run of cpulaunch's default configuration "
                           f"({config_key(self.space.default) or 'no flags'}) to learn the trial time and the "
                           "metric; the search starts after it")
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
                    self._announce(n)
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
                tqdm.monitor_interval = 0  # no monitor thread: trials are forked from this process
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

    def _announce(self, text: str) -> None:
        """A line of progress on stderr (above the bar when there is one)."""
        if self._progress:
            self._say(text)

    def _close_progress(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _say(self, text: str) -> None:
        try:
            if self._bar is not None:
                self._bar.write(f"cpulaunch tune: {text}", file=self.err)
                return
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


def _remove_quietly(path: Path) -> None:
    """Remove a file or an empty folder of ours; nothing when it is absent or not empty."""
    try:
        path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
    except OSError:
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
        busy: scored trials behind the verdict (the recommended configuration's, and the
            default's when it was compared with it) that were flagged busy.
        behind: scored trials behind the verdict.
    """

    rows: tuple
    recommended: Optional[str]
    verdict: str
    default_key: str
    busy: int = 0
    behind: int = 0

    @property
    def from_busy(self) -> bool:
        """A recommendation stands on trials measured while the machine was busy: every
        output carries the flag, and tune exits with :data:`BUSY_EXIT`."""
        return self.recommended is not None and self.busy > 0


#: tune's exit code when its recommendation stands on busy trials (docs/tune.md).
BUSY_EXIT = 3


def decide(space: Space, records: Sequence[Mapping], rounds: int, lower_is_better: bool) -> Outcome:
    """Rank the configurations and pick the recommendation (pure).

    Among configurations with at least ``rounds`` scored trials, the best median is
    recommended when it is better than cpulaunch's default beyond the spread
    (:func:`compare`); otherwise the default is (a difference within noise is no reason to
    change). When the default has no complete result, the best median is. The busy
    trials behind the verdict are counted (:attr:`Outcome.busy`).
    """
    summaries = score(records)
    configs = {r["key"]: r["config"] for r in records if r.get("stage") != "warmup"}
    scored = [k for k, s in summaries.items() if s.n]
    scored.sort(key=lambda k: summaries[k].median, reverse=not lower_is_better)
    rows = tuple((k, configs[k], summaries[k]) for k in scored) + tuple(
        (k, configs[k], summaries[k]) for k in sorted(summaries) if not summaries[k].n)
    dkey = config_key(space.default)
    complete = [k for k in scored if summaries[k].n >= rounds]
    pick, verdict, behind = _pick(summaries, complete, dkey, rounds, lower_is_better)
    return Outcome(rows, pick, verdict, dkey, busy=sum(summaries[k].busy for k in behind),
                   behind=sum(summaries[k].n for k in behind))


def _pick(summaries: Mapping, complete: Sequence[str], dkey: str, rounds: int, lower_is_better: bool) -> tuple:
    """``(recommended key or None, verdict, keys of the configurations behind it)``."""
    if not complete:
        return None, f"no configuration has {rounds} successful trials", ()
    top = complete[0]
    d = summaries.get(dkey)
    if d is None or d.n < rounds:
        return top, f"the best median; cpulaunch's default ({dkey}) has no complete result", (top,)
    if top == dkey:
        return dkey, "cpulaunch's default has the best median", (dkey,)
    verdict = compare(summaries[top], d, lower_is_better)
    ratio = _ratio(summaries[top].median, d.median, lower_is_better)
    if verdict == "better":
        return top, f"better than cpulaunch's default ({dkey}) beyond the measured spread: {ratio}", (top, dkey)
    return dkey, (f"the best median ({top}, {ratio}) is within noise of cpulaunch's default, so the default "
                  "is kept"), (top, dkey)


def busy_warning(outcome: Outcome, threshold: float) -> str:
    """The flag a recommendation from busy trials carries in every output (report, chart
    title, best.toml), one line."""
    return (f"{outcome.busy} of the {outcome.behind} trials behind this recommendation ran while the machine was "
            f"busy (foreign CPU load above {threshold:g}%): its figures are not to be quoted; run tune again "
            "with another --out on a quiet machine")


def _ratio(a: float, b: float, lower_is_better: bool) -> str:
    """Speed-up of ``a`` over ``b`` as ``"1.12x"`` (b/a for lower-is-better)."""
    try:
        r = (b / a) if lower_is_better else (a / b)
    except ZeroDivisionError:
        return "-"
    return f"{r:.2f}x"


def report_text(tuner: Tuner, outcome: Outcome) -> str:
    """The report: what was tuned, the table (best first), notes, the recommendation (with
    :func:`busy_warning` when it stands on busy trials)."""
    s = tuner.s
    lower = tuner._lower
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
    lines += _table(tuner, outcome)
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
        if outcome.from_busy:
            lines.append("  BUSY: " + busy_warning(outcome, s.busy_threshold))
        cfg = next(c for k, c, _ in outcome.rows if k == outcome.recommended)
        lines.append("  " + winner_command(tuner, cfg))
        lines.append(f"  cpulaunch --config {shlex.quote(str(s.out / 'best.toml'))} -- {shlex.join(s.program)}")
    return "\n".join(lines) + "\n"


def _table(tuner: Tuner, outcome: Outcome) -> list:
    """The report's table: one line per configuration, best first."""
    lower, rounds = tuner._lower, tuner.s.rounds
    summaries = {k: sm for k, _, sm in outcome.rows}
    d = summaries.get(outcome.default_key)
    width = max([len(k) for k in summaries] + [len("configuration")])
    head = f"{'rank':>4}  {'configuration':<{width}}  {'median':>9}  {'min':>9}  {'max':>9}  {'spread':>6}  " \
           f"{'trials':>6}  vs default"
    lines = [head, "-" * len(head)]
    rank = 0
    for key, _, sm in outcome.rows:
        mark = ("*" if key == outcome.recommended else " ")
        if not sm.n:
            errs = [r.get("error") for r in tuner.records if r["key"] == key and r["status"] != "ok"]
            lines.append(f"{'-':>4}  {key:<{width}}  {'failed':>9}  {len(errs)} trial(s): {errs[-1] if errs else ''}")
            continue
        rank += 1
        if key == outcome.default_key:
            vs = "(the default)"
        elif d is not None and d.n:
            vs = f"{_ratio(sm.median, d.median, lower)} {compare(sm, d, lower)}"
        else:
            vs = "-"
        extra = [f"only {sm.n} of {rounds} trials"] if sm.n < rounds else []
        extra += [f"{sm.failed} failed"] if sm.failed else []
        extra += [f"{sm.busy} busy"] if sm.busy else []
        spread = f"{sm.spread_pct:.0f}%" if not math.isnan(sm.spread_pct) else "-"
        lines.append(f"{rank:>3}{mark}  {key:<{width}}  {_num(sm.median):>9}  {_num(sm.low):>9}  "
                     f"{_num(sm.high):>9}  {spread:>6}  {sm.n:>6}  {vs}"
                     + (f" ({'; '.join(extra)})" if extra else ""))
    return lines


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
    explicit), ``[measured]`` what backs it (cpulaunch's --config ignores that table),
    ``busy_trials`` and ``busy`` included; a recommendation from busy trials also says so
    in a comment at the top."""
    key = outcome.recommended
    cfg, sm = next((c, s) for k, c, s in outcome.rows if k == key)
    d = dict((k, s) for k, _, s in outcome.rows).get(outcome.default_key)
    program = printable(shlex.join(tuner.s.program))
    lines = [f"# cpulaunch tune's recommendation for: {program}",
             f"# use: cpulaunch --config best.toml -- {program}"]
    if outcome.from_busy:
        lines.append("# BUSY: " + busy_warning(outcome, tuner.s.busy_threshold))
    lines += ["", "[cpulaunch]"] + [f"{k} = {_toml_value(v)}" for k, v in config_toml(tuner.space, cfg).items()]
    measured = {
        "configuration": key, "verdict": outcome.verdict, "metric": tuner.metric,
        "lower_is_better": tuner._lower, "median": sm.median, "min": sm.low, "max": sm.high, "trials": sm.n,
        "default_configuration": outcome.default_key,
    }
    if d is not None and d.n:
        measured.update(default_median=d.median, default_min=d.low, default_max=d.high)
    measured.update(busy_trials=outcome.busy, busy=outcome.from_busy, busy_threshold_pct=tuner.s.busy_threshold,
                    program=list(tuner.s.program), date=_now_iso())
    lines += ["", "[measured]"] + [f"{k} = {_toml_value(v)}" for k, v in measured.items()
                                   if not (isinstance(v, float) and not math.isfinite(v))]
    return "\n".join(lines) + "\n"


def report_png(tuner: Tuner, outcome: Outcome, path: Path) -> Optional[str]:
    """The chart: each scored configuration's median with its min-max range, best at the
    top, the default and the recommendation marked; configurations with busy trials
    hatched and labelled, and the title flagged when the recommendation stands on busy
    trials. Written with :func:`write_file`. Returns a note instead when matplotlib is
    missing.

    Raises:
        OSError: the file cannot be written.
    """
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
    bars = ax.barh(ys, med, color=colors, alpha=0.6)
    for bar, (_, s) in zip(bars, rows):
        if s.busy:
            bar.set_hatch("//")
    ax.errorbar(med, ys, xerr=err, fmt="none", ecolor="black", capsize=3)
    ax.set_yticks(ys)
    ax.set_yticklabels([k + (" (default)" if k == outcome.default_key else "")
                        + (f" ({s.busy} busy)" if s.busy else "") for k, s in rows], fontsize=8)
    ax.set_xlabel(f"{tuner.metric} ({'lower' if tuner._lower else 'higher'} is better); median, min-max"
                  + ("; hatched: trials on a busy machine" if any(s.busy for _, s in rows) else ""))
    title = "cpulaunch tune: " + printable(shlex.join(tuner.s.program))[:80]
    if outcome.from_busy:
        title += f"\nBUSY: {outcome.busy} of {outcome.behind} trials behind the recommendation: not to be quoted"
    ax.set_title(title, fontsize=9, color="tab:red" if outcome.from_busy else "black")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_file(path, buf.getvalue())
    return None


def finish(tuner: Tuner, out=None) -> Outcome:
    """Write report.png, best.toml (when there is a recommendation) and report.txt, and
    print the report; returns the outcome.

    Raises:
        TuneError: a file cannot be written (read-only, no space left): the report is
            printed all the same, and the message says the trials are kept.
    """
    outcome = decide(tuner.space, tuner.records, tuner.s.rounds, tuner._lower)
    out_dir, failure = tuner.s.out, None
    try:
        note = report_png(tuner, outcome, out_dir / "report.png")
        if note:
            tuner.notes.append(note)
        if outcome.recommended is not None:
            write_file(out_dir / "best.toml", best_toml(tuner, outcome))
        text = report_text(tuner, outcome)
        write_file(out_dir / "report.txt", text)
    except OSError as exc:
        failure = tuner._write_error(Path(exc.filename or "").name or "the report", exc)
        text = report_text(tuner, outcome)
    stream = out or sys.stdout
    stream.write(text)
    stream.flush()
    if failure is not None:
        raise failure
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
@click.option("-v", "--verbose", count=True,
              help="More diagnostics on stderr (each trial's command and load readings); a traceback "
                   "with an internal error. As for cpulaunch's other commands.")
@click.argument("program", nargs=-1, type=click.UNPROCESSED)
def tune_command(budget, out, space, lower_is_better, trials_per_config, metric, trial_timeout,
                 busy_threshold, load_sample, seed, sysroot, dry_run, verbose, program):
    """Find the fastest cpulaunch configuration for PROGRAM on this machine, by measurement.

    \b
    Examples:
      cpulaunch tune --budget 15m -- python examples/infer.py --batch-size 32
      cpulaunch tune --space allocator,omp-runtime --out tune1 -- python serve.py
      cpulaunch tune --dry-run -- python x.py
    The program reports its figure with a line `CPULAUNCH_METRIC name=value` (higher is
    better unless --lower-is-better); without one, tune times the whole run.
    Exit codes: 0 recommended; 1 no configuration completed; 2 a mistake to fix; 3
    recommended from trials on a busy machine (flagged in every output); 130 interrupted.
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
    if outcome.recommended is None:
        return 1
    return BUSY_EXIT if outcome.from_busy else 0


def main(args: Sequence[str]) -> int:
    """``cpulaunch tune ARGS...``: parse tune's options, run, return the exit code.

    0: done (a recommendation written); 1: no configuration completed its trials; 3
    (:data:`BUSY_EXIT`): a recommendation written, but it stands on trials measured while
    the machine was busy (every output says so); 130: interrupted (the trials so far are
    kept: rerun to resume).

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

