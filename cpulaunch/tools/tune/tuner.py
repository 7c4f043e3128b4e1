"""The tuner: one ``cpulaunch tune`` run from its settings to its records, stage by stage
(warm-up, grid or coarse and fine), resumable from ``trials.jsonl``, interruptible.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from cpulaunch import log as _log
from cpulaunch.errors import CpulaunchError, printable
from cpulaunch.machine.files import write_file
from cpulaunch.tools.tune.load import LoadReading, load_meter
from cpulaunch.tools.tune.search import (
    Stage,
    _cost,
    _dropped,
    _num,
    _slot_done,
    _slot_records,
    grid_configs,
    next_stage,
    score,
)
from cpulaunch.tools.tune.space import (
    AXES,
    Space,
    TuneError,
    config_flags,
    config_key,
    format_duration,
)
from cpulaunch.tools.tune.trials import (
    TRIAL_GRACE,
    WALL_METRIC,
    RunResult,
    _failure_text,
    _now_iso,
    append_record,
    attribute_metrics,
    combine_metric,
    parse_metrics,
    parse_records,
    read_tune_file,
    run_command,
)

__all__ = [
    "TuneSettings",
    "Tuner",
    "DEFAULT_OUT",
    "default_out",
    "tune_identity",
]


log = _log.get(__name__)


# --------------------------------------------------------------------------- the tuner


@dataclass(frozen=True)
class TuneSettings:
    """What ``cpulaunch tune`` was asked (typed, checked).

    Attributes:
        program: the program's argv, as for cpulaunch.
        out: the results folder (without ``--out``: :func:`default_out`).
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
        out_chosen: ``out`` is tune's own choice (:func:`default_out`), not the user's
            ``--out``: the tune says where it writes before it starts.
    """

    program: tuple[str, ...]
    out: Path
    budget_s: float
    axes: tuple[str, ...] = AXES
    lower_is_better: bool = False
    rounds: int = 3
    metric: Optional[str] = None
    trial_timeout: Optional[float] = None
    busy_threshold: float = 10.0
    load_sample: float = 0.3
    seed: int = 0
    sysroot: str = "/"
    dry_run: bool = False
    out_chosen: bool = False


#: TuneSettings a resumed tune must share with the recorded one (tune.json).
_IDENTITY = ("program", "axes", "lower_is_better", "rounds", "metric", "seed")

#: The folder below which a tune without ``--out`` keeps its results, one folder per tune.
DEFAULT_OUT = Path("cpulaunch-tune")


def tune_identity(settings: TuneSettings) -> dict[str, Any]:
    """What makes two tunes the same tune (the :data:`_IDENTITY` fields, as tune.json
    records them): a rerun that matches resumes, one that differs is another tune. The
    budget, timeouts and load settings are not part of it (a rerun may change them)."""
    return {"program": list(settings.program), "axes": list(settings.axes),
            "lower_is_better": settings.lower_is_better, "rounds": settings.rounds,
            "metric": settings.metric, "seed": settings.seed}


def default_out(settings: TuneSettings) -> Path:
    """The results folder of a tune run without ``--out``: ``cpulaunch-tune/NAME-HASH``
    (relative to the current folder), one per tune, so that an earlier tune of another
    program (kept after it stopped, to be resumed) never blocks this one, and the same
    command again finds its own folder and resumes. Pure.

    NAME: the program's script or module (``python examples/infer.py --batch-size 32`` ->
    ``infer``; ``python -m pkg.serve`` -> ``pkg.serve``; ``./bench`` -> ``bench``), in
    letters, digits, ``.``, ``_``, ``-``. HASH: the first 8 hex digits of the SHA-256 of
    :func:`tune_identity` as canonical JSON (different arguments or options: another HASH).
    """
    text = json.dumps(tune_identity(settings), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return DEFAULT_OUT / f"{_program_name(settings.program)}-{digest}"


def _program_name(program: tuple[str, ...]) -> str:
    """The word that names the program: the first ``*.py`` word, else the word after
    ``-m``, else the first word; its base name without ``.py``, cut to 40 safe characters
    (``"program"`` when nothing is left)."""
    words = list(program)
    word = next((w for w in words if w.endswith(".py")), None)
    if word is None and "-m" in words[:-1]:
        word = words[words.index("-m") + 1]
    if word is None:
        word = words[0] if words else ""
    name = os.path.basename(word.rstrip("/"))
    name = name[:-3] if name.endswith(".py") else name
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")[:40].strip(".-")
    return name or "program"


class _Interrupted(KeyboardInterrupt):
    """SIGTERM/SIGHUP during a tune, handled like Ctrl-C."""


class Tuner:
    """Runs a tune: warm-up, stages, records, progress; then the report.

    The host is injected: ``runner(argv, timeout) -> RunResult`` starts a trial (default
    :func:`run_command`), ``meter`` measures the foreign load (default
    :func:`load_meter`), ``clock`` is ``time.monotonic``. Tests pass fakes.
    """

    def __init__(self, settings: TuneSettings, space: Space, *, runner=None, meter=None,
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
        return tune_identity(self.s)

    def open(self) -> None:
        """Create DIR, or check that its tune.json describes the same tune, and load the
        records of an earlier run (resume).

        Raises:
            TuneError: DIR is not usable (cannot be created or written: read-only, no
                space left), holds a different tune, or its tune.json/trials.jsonl is not
                a regular file of a bounded size (:func:`read_tune_file`).
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
        text = read_tune_file(meta_path, cap=1 << 20)
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
        text = read_tune_file(self.trials) or ""
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

    def argv(self, config: Mapping[str, object]) -> list[str]:
        """The trial's command: ``python -m cpulaunch FLAGS --grace-period 2 -- PROGRAM``."""
        return [self.python, "-m", "cpulaunch", *config_flags(self.space, config),
                "--grace-period", f"{TRIAL_GRACE:g}", "--", *self.s.program]

    def run_trial(self, config: Mapping[str, object], stage: str, rnd: int, attempt: int,
                  deadline: float) -> dict[str, Any]:
        """Run one trial and append its record (see docs/guide/tune.md for the fields)."""
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
        if self.s.out_chosen:
            self._announce(f"results go to {self.s.out} (one folder per program and options; the same "
                           "command again resumes from it; --out DIR picks another)")
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
                    self.notes.append(f"budget reached: {left} planned trial(s) not run; run the same command "
                                      "with a larger --budget to continue")
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
