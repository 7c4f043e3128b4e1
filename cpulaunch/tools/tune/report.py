"""What ``cpulaunch tune`` writes when it ends: report.txt, report.png, best.toml and the
``--dry-run`` plan; every file written whole (``machine.files.write_file``), and a recommendation
that rests on busy trials flagged in each.
"""

from __future__ import annotations

import io
import json
import math
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Optional

from cpulaunch.errors import printable
from cpulaunch.machine.files import write_file
from cpulaunch.tools.tune.search import (
    Decision,
    _cost,
    _num,
    _ratio,
    coarse_configs,
    compare_summaries,
    decide,
    grid_configs,
)
from cpulaunch.tools.tune.space import (
    Space,
    _fmt_value,
    config_flags,
    config_key,
    config_toml,
    format_duration,
)
from cpulaunch.tools.tune.trials import WALL_METRIC, _now_iso

if TYPE_CHECKING:
    from cpulaunch.tools.tune.tuner import TuneSettings, Tuner

__all__ = [
    "BUSY_EXIT",
    "busy_warning",
    "report_text",
    "winner_command",
    "best_toml",
    "report_png",
    "finish",
    "plan_text",
]



#: tune's exit code when its recommendation stands on busy trials (docs/guide/tune.md).
BUSY_EXIT = 3


def busy_warning(outcome: Decision, threshold: float) -> str:
    """The flag a recommendation from busy trials carries in every output (report, chart
    title, best.toml), one line."""
    return (f"{outcome.busy} of the {outcome.behind} trials behind this recommendation ran while the machine was "
            f"busy (foreign CPU load above {threshold:g}%): its figures are not to be quoted; run tune again "
            "with another --out on a quiet machine")


def report_text(tuner: Tuner, outcome: Decision) -> str:
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


def _table(tuner: Tuner, outcome: Decision) -> list:
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
            vs = f"{_ratio(sm.median, d.median, lower)} {compare_summaries(sm, d, lower)}"
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


def winner_command(tuner: Tuner, config: Mapping[str, object]) -> str:
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


def best_toml(tuner: Tuner, outcome: Decision) -> str:
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


def report_png(tuner: Tuner, outcome: Decision, path: Path) -> Optional[str]:
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


def finish(tuner: Tuner, out=None) -> Decision:
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


def plan_text(settings: TuneSettings, space: Space) -> str:
    """What --dry-run prints: the space, its configurations with their flags, the coarse
    stage the adaptive search would start with, and the results folder."""
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
    lines.append(f"results: {settings.out}" + (" (one folder per program and options; --out DIR picks another)"
                                               if settings.out_chosen else ""))
    return "\n".join(lines) + "\n"
