"""One trial of ``cpulaunch tune``: running it (through the launcher's process group, so
nothing it started outlives it), reading its metric lines, and its record in
``trials.jsonl``, written whole and read back through the probe's bounded reader.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from cpulaunch.tools.tune.space import TuneError

__all__ = [
    "METRIC_PREFIX",
    "parse_metrics",
    "attribute_metrics",
    "combine_metric",
    "read_tune_file",
    "record_problem",
    "parse_records",
    "read_records",
    "append_record",
    "RunResult",
    "run_command",
]


#: The line a program prints to report its metric (docs/guide/tune.md).
METRIC_PREFIX = "CPULAUNCH_METRIC"
#: Name of the metric when the program prints none: the wall time of the whole run.
WALL_METRIC = "wall_s"
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


# --------------------------------------------------------------------------- metrics


def parse_metrics(text: str) -> dict[Optional[int], dict[str, float]]:
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


def attribute_metrics(per_instance: Mapping[Optional[int], Mapping[str, float]],
                      ninstances: int) -> dict[Optional[int], dict[str, float]]:
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


def combine_metric(per_instance: Mapping[Optional[int], Mapping[str, float]], name: str, ninstances: int,
                   lower_is_better: bool) -> tuple[Optional[float], list[float], Optional[str]]:
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


# --------------------------------------------------------------------------- records


_STATUSES = ("ok", "failed", "timeout")
_STAGES = ("warmup", "grid", "coarse", "fine")


def read_tune_file(path: Path, cap: int = TRIALS_BYTES) -> Optional[str]:
    """The text of one of tune's own files (trials.jsonl, tune.json) through the probe's
    bounded reader (:class:`cpulaunch.machine.files.FileReader`: opened without blocking,
    regular files only, at most ``cap`` bytes; bytes that are not UTF-8 read as U+FFFD);
    None when the file does not exist.

    Raises:
        TuneError: it is a link, not a regular file (a FIFO, /dev/zero), larger than
            ``cap`` bytes, or unreadable; the message names it and says what to do.
    """
    from cpulaunch.machine import files

    if os.path.islink(path):
        raise TuneError(f"{path} is a symbolic link; tune reads and writes only its own files in --out: "
                        "remove it or use another --out")
    reader = files.FileReader(str(path.parent))
    text = reader.read(path.name, strict=False, cap=cap)
    if text is None and reader.skipped:
        what = reader.skipped[-1][1]
        raise TuneError(f"{path}: {what}; tune writes a regular file there: remove it or use another --out")
    return text


def _is_number(v, low: float = -MAX_VALUE) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and low <= v <= MAX_VALUE


def _is_count(v, low: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and low <= v < 1 << 31


def record_problem(rec) -> Optional[str]:
    """Why ``rec`` (one parsed line of trials.jsonl) is not a trial record tune can use,
    or None. The fields the search and the report rely on must have their types
    (docs/guide/tune.md): ``key`` a string; ``status`` ok/failed/timeout; ``stage``
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
        ("round", _is_count(rec.get("round"), 0), "an integer >= 0"),
        ("attempt", _is_count(rec.get("attempt", 1), 1), "an integer >= 1"),
        ("config", isinstance(rec.get("config"), dict), "an object"),
        ("cost_s", _is_number(rec.get("cost_s"), 0.0), "a number >= 0"),
        ("wall_s", _is_number(rec.get("wall_s"), 0.0), "a number >= 0"),
        ("busy", isinstance(rec.get("busy", False), bool), "true or false"),
        ("repeat", isinstance(rec.get("repeat", False), bool), "true or false"),
    )
    if rec.get("status") == "ok":
        checks += (("metric", isinstance(rec.get("metric"), str), "a string"),
                   ("value", _is_number(rec.get("value")), f"a finite number (at most {MAX_VALUE:g} in size)"))
    for name, ok, what in checks:
        if not ok:
            return f"{name!r} is not {what}"
    return None


def parse_records(text: str, reasons: Optional[list[tuple[int, str]]] = None,
                  ) -> tuple[list[dict[str, Any]], int]:
    """The trial records of trials.jsonl's text: ``(records, skipped line count)``. A line
    that is not JSON (a write cut short, an edit), nested too deep to parse, or not a
    trial record (:func:`record_problem`) is skipped and counted; blank lines are not.

    Args:
        text: the file's text (:func:`read_tune_file`).
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


def read_records(path: Path, reasons: Optional[list[tuple[int, str]]] = None,
                 ) -> tuple[list[dict[str, Any]], int]:
    """The trials of ``DIR/trials.jsonl``: ``(records, skipped line count)``
    (:func:`read_tune_file`, :func:`parse_records`); ``([], 0)`` when there is no file.

    Raises:
        TuneError: the file is refused by :func:`read_tune_file`.
    """
    return parse_records(read_tune_file(path) or "", reasons)


def append_record(path: Path, record: Mapping[str, Any], newline_first: bool = False) -> None:
    """Append one record as one line in one write, never through a link, so an
    interruption leaves either the whole line or none of it and a failed write (no space
    left) is cut off again (:func:`cpulaunch.machine.files.append_whole`).
    ``newline_first`` ends a last line left without its newline first.

    Raises:
        OSError: the file cannot be opened or written (the caller names it).
    """
    from cpulaunch.machine.files import append_whole

    append_whole(path, ("\n" if newline_first else "") + json.dumps(record, sort_keys=False) + "\n")


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
    the launcher... except that tune is a child subreaper while the trial runs (issue 38): a
    daemon the trial starts comes back to it when its parent ends, and is stopped with the
    rest; one line on stderr says how many.

    Raises:
        TuneError: the command cannot be started.
    """
    from cpulaunch.launch.group import ProcessGroup
    from cpulaunch.launch.spawn import LaunchError, ProcessSpec

    out, err = _MetricLines(), _Tail(4 * TAIL_CHARS)
    group = ProcessGroup([ProcessSpec(0, "the trial", tuple(argv))], os.environ if environ is None else environ,
                         prefix_output=False, stdout=out, stderr=err, kill_timeout=STOP_WAIT, reap_orphans=True)
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
        if group.orphans_stopped:  # daemons the trial left (setsid): tune is their subreaper (issue 38)
            sys.stderr.write(f"cpulaunch tune: stopped {group.orphans_stopped} process"
                             f"{'es' if group.orphans_stopped > 1 else ''} the trial left behind\n")
    rc = group.results()[0].returncode
    if status == "ok" and rc != 0:
        status = "failed"
    return RunResult(status, rc, wall, out.text(), err.buf.decode(errors="replace")[-TAIL_CHARS:])


def _failure_text(res: RunResult) -> str:
    from cpulaunch.machine.exec import signal_name

    if res.status == "timeout":
        return f"timed out after {res.wall_s:.1f}s"
    rc = res.returncode
    how = f"killed by {signal_name(-rc)}" if rc is not None and rc < 0 else f"exit code {rc}"
    last = [ln for ln in res.stderr_tail.splitlines() if ln.strip()]
    return how + (f": {last[-1].strip()[:200]}" if last else "")


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
