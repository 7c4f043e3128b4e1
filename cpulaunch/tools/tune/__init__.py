"""``cpulaunch tune``: find the best configuration for one program on this machine, by measurement.

Every trial is a real run, ``python -m cpulaunch [FLAGS] -- PROGRAM ...``, started as a
subprocess with ``sys.executable``: what tune measures is exactly what a user runs, and
the winner is saved as ``DIR/best.toml`` for ``cpulaunch --config DIR/best.toml ...``.
The whole method (space, budget, metric, noise rules, resume) is in docs/guide/tune.md; the
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
  :class:`cpulaunch.launch.group.ProcessGroup`: own session, parent-death signal, a watchdog
  if tune is SIGKILLed, and the whole group SIGKILLed and reaped when the trial ends, so
  nothing a trial started in its group outlives it.
* **Files** in ``DIR`` (``--out``; without it ``cpulaunch-tune/NAME-HASH``, one folder per
  program and options, :func:`default_out`): ``DIR/trials.jsonl`` (one JSON object per
  trial, appended as it ends; read back through the probe's bounded reader, a line that
  is not a trial record skipped with a note), ``DIR/tune.json`` (what was tuned, checked
  on resume), ``DIR/report.txt``, ``DIR/report.png`` (matplotlib), ``DIR/best.toml``; each
  written whole or not at all.

This module is never imported on the launch path; tqdm, matplotlib and psutil are imported
lazily (``pip install 'cpulaunch[tune]'``), with plain progress lines, no chart and a
/proc/stat reading without them.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from pathlib import Path
from typing import Optional, Sequence

import click

from cpulaunch.machine.load import BUSY_THRESHOLD_PCT
from cpulaunch.tools import CLICK_CONTEXT, shared_option
from cpulaunch.tools.tune.report import BUSY_EXIT, finish, plan_text
from cpulaunch.tools.tune.space import (
    AXIS_HELP,
    TuneError,
    available_libraries,
    build_space,
    parse_axes,
    parse_duration,
)
from cpulaunch.tools.tune.tuner import DEFAULT_OUT, TuneSettings, Tuner, default_out

__all__ = [
    "main",
]


# --------------------------------------------------------------------------- the command


def _probe_topology(sysroot: str):
    from cpulaunch.machine import probe

    probe.check_sysroot(sysroot)
    return probe.probe(sysroot)


def _positive_float(name: str, value: Optional[float], minimum: float = 0.0) -> Optional[float]:
    if value is not None and (not math.isfinite(value) or value < minimum):
        raise TuneError(f"--{name} {value}: give a finite number >= {minimum:g}")
    return value


_CONTEXT = {**CLICK_CONTEXT, "allow_interspersed_args": False}


@click.command(context_settings=_CONTEXT, epilog="\b\nAxes for --space:\n" + "\n".join(
    f"  {a:<14} {h}" for a, h in AXIS_HELP.items()) + "\n\nThe program prints its score as a line CPULAUNCH_METRIC name=value (higher is better unless "
    "--lower-is-better); each configuration runs --trials-per-config times, interleaved, and trials on a busy "
    "machine are run again.")
@click.option("--budget", default="10m", show_default=True,
              help="Time for the whole search: 90s, 10m, 1h30m (trials recorded by an earlier run count).")
@click.option("--out", "out", default=None, type=click.Path(file_okay=False),
              help="Folder for trials.jsonl, report.txt, report.png, best.toml; a rerun resumes from it "
                   "(default: cpulaunch-tune/NAME-HASH, one folder per program and options).")
@click.option("--space", default=None, help="Comma-separated axes to search (default: all that apply here).")
@click.option("--lower-is-better", is_flag=True, help="The program's CPULAUNCH_METRIC is a cost (latency).")
@click.option("--trials-per-config", type=int, default=3, show_default=True,
              help="Trials per configuration (at least 3).")
@click.option("--metric", default=None, help="Which CPULAUNCH_METRIC name to use (default: the first printed).")
@click.option("--trial-timeout", type=float, default=None,
              help="Seconds before a trial is stopped (default: 3x the slowest successful trial + 10, >= 30).")
@click.option("--busy-threshold", type=float, default=BUSY_THRESHOLD_PCT, show_default=True,
              help="Foreign CPU load, percent of the machine, above which a trial is repeated once, then flagged.")
@click.option("--load-sample", type=float, default=0.3, show_default=True,
              help="Seconds of foreign-load measurement before each trial.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the per-round shuffle.")
@shared_option("sysroot", help="Read the machine from this root (with --dry-run only: trials run here).")
@click.option("--dry-run", is_flag=True, help="Print the space and the configurations; run nothing.")
@shared_option("verbose", help="More diagnostics on stderr (each trial's command and load readings); a traceback "
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


def _tune_settings(budget, out, space, lower_is_better, trials_per_config, metric, trial_timeout,
              busy_threshold, load_sample, seed, sysroot, dry_run, program) -> TuneSettings:
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
    settings = TuneSettings(
        program=tuple(program), out=Path(out or DEFAULT_OUT), budget_s=parse_duration(budget),
        axes=parse_axes(space), lower_is_better=lower_is_better, rounds=trials_per_config, metric=metric,
        trial_timeout=_positive_float("trial-timeout", trial_timeout, 0.1),
        busy_threshold=_positive_float("busy-threshold", busy_threshold),
        load_sample=_positive_float("load-sample", load_sample), seed=seed, sysroot=sysroot or "/",
        dry_run=dry_run)
    if out is None:  # one folder per tune: another program's kept folder never blocks this one
        settings = dataclasses.replace(settings, out=default_out(settings), out_chosen=True)
    return settings


def _command(*values) -> int:
    settings = _tune_settings(*values)
    topo = _probe_topology(settings.sysroot)
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
