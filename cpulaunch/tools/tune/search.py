"""How ``cpulaunch tune`` searches and decides: the grid, the coarse and fine stages fitted
into the budget, the statistics of a configuration's trials and the noise rule by which
one beats another (docs/guide/tune.md, "Search" and "Measurement"). Pure: records in, stages
and outcomes out.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

from cpulaunch.tools.tune.space import (
    AXES,
    Space,
    TuneError,
    _normalize,
    config_key,
    format_duration,
)

__all__ = [
    "grid_configs",
    "coarse_configs",
    "fine_configs",
    "Summary",
    "summarize",
    "compare_summaries",
    "score",
    "Stage",
    "next_stage",
    "Decision",
    "decide",
]


#: Margin on estimated trial times when fitting a stage into the budget.
SAFETY = 1.15
#: A configuration with this many failed or timed-out trials gets no more trials.
MAX_FAILURES = 2


# --------------------------------------------------------------------------- the planner


def grid_configs(space: Space) -> list[dict[str, object]]:
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


def coarse_configs(space: Space) -> list[dict[str, object]]:
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
                 limit: int = 2) -> tuple[dict[str, object], list[dict[str, object]]]:
    """The fine stage's new configurations, from the coarse stage's results (pure).

    For each axis, its values are ranked by the median of the coarse configuration that
    varies only that axis (the default for the default value); the best value is kept,
    with the next ones (up to ``limit`` in all) when the best does not beat them beyond
    the spread (:func:`compare_summaries`): those are the axis's undecided values. The fine stage is
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
                                 if compare_summaries(top[1], s, lower_is_better) != "better"][: limit - 1]
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


def compare_summaries(a: Summary, b: Summary, lower_is_better: bool) -> str:
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


def score(records: Iterable[Mapping[str, Any]], stages: Optional[Iterable[str]] = None) -> dict[str, Summary]:
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
    configs: tuple[Mapping[str, object], ...]
    rounds: Mapping[str, tuple[int, ...]]
    notes: tuple[str, ...] = ()

    def order(self, seed: int) -> list[tuple[Mapping[str, object], int]]:
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


def next_stage(space: Space, records: Sequence[Mapping[str, Any]], budget_s: float, rounds: int,
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
            "(the same command with a larger --budget keeps the trials done)")
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
class Decision:
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

    rows: tuple[tuple[str, Mapping[str, object], Summary], ...]
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


def decide(space: Space, records: Sequence[Mapping[str, Any]], rounds: int,
           lower_is_better: bool) -> Decision:
    """Rank the configurations and pick the recommendation (pure).

    Among configurations with at least ``rounds`` scored trials, the best median is
    recommended when it is better than cpulaunch's default beyond the spread
    (:func:`compare_summaries`); otherwise the default is (a difference within noise is no reason to
    change). When the default has no complete result, the best median is. The busy
    trials behind the verdict are counted (:attr:`Decision.busy`).
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
    return Decision(rows, pick, verdict, dkey, busy=sum(summaries[k].busy for k in behind),
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
    verdict = compare_summaries(summaries[top], d, lower_is_better)
    ratio = _ratio(summaries[top].median, d.median, lower_is_better)
    if verdict == "better":
        return top, f"better than cpulaunch's default ({dkey}) beyond the measured spread: {ratio}", (top, dkey)
    return dkey, (f"the best median ({top}, {ratio}) is within noise of cpulaunch's default, so the default "
                  "is kept"), (top, dkey)


def _ratio(a: float, b: float, lower_is_better: bool) -> str:
    """Speed-up of ``a`` over ``b`` as ``"1.12x"`` (b/a for lower-is-better)."""
    try:
        r = (b / a) if lower_is_better else (a / b)
    except ZeroDivisionError:
        return "-"
    return f"{r:.2f}x"
