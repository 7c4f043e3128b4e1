"""Two readers of the command line, one answer (issue 40 item 1).

A plain run reads its words without click (:func:`cpulaunch.cmdline.parse`, so that its
start-up stays near the interpreter's); click's command reads everything else and any word
the fast reader is not sure of (:func:`cpulaunch.cli.parsed`). Both are made from the option
table. Here every row of the table, with valid and invalid values, bare and ``=`` forms,
aliases, repeats, ``CPULAUNCH_*`` variables, ``--`` and program words, ``-m``/``-c``, goes
through both: where the fast reader answers, click answers the same (the same values, the
same names given, the same spellings for messages, so the same typed options or the same
error); where it does not, click reads the words as always. A plain run imports no click.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys

import click
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO
from cpulaunch import cli, cmdline, option_table as table, options
from cpulaunch.errors import CpulaunchError

import tempfile
from pathlib import Path

NOT_THERE = "/nonexistent-cpulaunch-dir"
#: --config files: used, an alias, a pyproject.toml, an unknown key, a wrong type, a folder named.
CONFIGS = Path(tempfile.mkdtemp(prefix="cpulaunch-parsers-"))
atexit.register(shutil.rmtree, CONFIGS, True)
for _name, _text in (("good.toml", 'ninstances = 2\nallocator = "TCMalloc"\nlog-dir = "/nonexistent-x"\n'
                                   "use_logical_cores = true\ngrace_period = 3\n[measured]\nx = 1\n"),
                     ("alias.toml", "enable_tcmalloc = true\nnode-id = 0\n"),
                     ("pyproject.toml", "[tool.cpulaunch]\nbind = \"none\"\n"),
                     ("typo.toml", "ninstance = 2\n"), ("type.toml", 'ninstances = "x"\n'),
                     ("file-dir.toml", 'log_dir = "%s"\n' % (Path(__file__).resolve().parent.parent / "pyproject.toml"))):
    (CONFIGS / _name).write_text(_text)
GOOD_CONFIGS = [str(CONFIGS / n) for n in ("good.toml", "alias.toml", "pyproject.toml")]
BAD_CONFIGS = [str(CONFIGS / n) for n in ("typo.toml", "type.toml", "file-dir.toml")]
A_FILE = str(REPO / "pyproject.toml")
A_DIR = str(REPO / "tests")


def _valid_texts(kind, config=False) -> list[str]:
    """Values click's type takes (the options' own checks may still refuse them)."""
    return {
        "integer": ["1", "2", "4", "0", "16"],
        "number": ["0", "2.5", "10", "1e1"],
        "string": ["4", "43,43,42", "fail", "0-3", "eth0"],
        "path": [NOT_THERE, A_DIR, "/"] if not config else GOOD_CONFIGS,
        "choice": [c for c in kind.choices] + [c.upper() for c in kind.choices[:2]],
    }.get(kind.name, [])


def _invalid_texts(kind, config=False) -> list[str]:
    """Values click's type refuses, or words the fast reader leaves to click."""
    return {
        "integer": ["x", "1.5", "-1", "", "+3", " 4"],
        "number": ["x", "-2", "", "nan"],
        "string": ["-x", ""],
        "path": [A_FILE, "-"] if not config else BAD_CONFIGS + [A_DIR, NOT_THERE],
        "choice": ["nope", "", "-"],
    }.get(kind.name, [])


def _rows():
    """(spellings, Kind, bare value or None, words taken after a bare option) of every row
    and alias."""
    for o in table.OPTIONS:
        yield table.spellings(o.name) + ((o.short,) if o.short else ()), o.kind, o.bare, o.words
    for a in table.ALIASES:
        yield table.spellings(a.name), a.kind, None, ()


ROWS = list(_rows())


def _forms(spellings, kind, bare, words, valid: bool) -> list[list[str]]:
    """Every way to write one row: each spelling, each value, as two words and with ``=``."""
    out = []
    for s in spellings:
        if kind.name in ("flag", "count"):
            out.append([s] if valid else [f"{s}=yes"] if s.startswith("--") else [s + "x"])
            continue
        config = s == "--config"
        texts = _valid_texts(kind, config) if valid else _invalid_texts(kind, config)
        if bare is not None:
            out.append([s])
            texts = (["1", "3"] if words == ("digits",) else list(words)) if valid else ["x", "0"]
        for text in texts:
            out.append([s, text])
            if s.startswith("--"):
                out.append([f"{s}={text}"])
    return out


VALID = [form for row in ROWS for form in _forms(*row, valid=True)]
INVALID = [form for row in ROWS for form in _forms(*row, valid=False)]
ODD = [["--ninstance", "2"], ["-x"], ["--rank", "1"], ["-vq"], ["-qv"], ["-h"], ["--help"], ["--version"],
       ["--ninstances"], ["-"],
       ["-vvv"], ["--verbose", "--verbose"], ["--dry-run", "--dry-run"]]
PROGRAMS = [[], ["true"], ["--", "true", "--ninstances", "x"], ["-m", "json.tool", "--help"], ["-c", "pass"],
            ["-mjson.tool"], ["--module", "json.tool"], ["python", "x.py", "--ninstances", "3"], ["--"],
            ["./prog", "-v"], ["doctor"], ["help"], ["1", "1"]]
#: Variables and values: valid, invalid, empty (unset), the ones never read.
VARIABLES = [("CPULAUNCH_NINSTANCES", "2"), ("CPULAUNCH_NINSTANCES", "x"), ("CPULAUNCH_NINSTANCES", ""),
             ("CPULAUNCH_DRY_RUN", "yes"), ("CPULAUNCH_DRY_RUN", " On "), ("CPULAUNCH_DRY_RUN", "0"),
             ("CPULAUNCH_DRY_RUN", "maybe"), ("CPULAUNCH_VERBOSE", "2"), ("CPULAUNCH_VERBOSE", "-1"),
             ("CPULAUNCH_ALLOCATOR", "TCMalloc"), ("CPULAUNCH_ALLOCATOR", "nope"), ("CPULAUNCH_BIND", "none"),
             ("CPULAUNCH_LOG_DIR", NOT_THERE), ("CPULAUNCH_LOG_DIR", A_FILE), ("CPULAUNCH_ENABLE_TCMALLOC", "1"),
             ("CPULAUNCH_NODE_ID", "0"), ("CPULAUNCH_GRACE_PERIOD", "2.5"), ("CPULAUNCH_SHARE_HOST", "wait"),
             ("CPULAUNCH_FMT", "json"), ("CPULAUNCH_VERSION", "1"), ("CPULAUNCH_CONFIG", NOT_THERE),
             ("CPULAUNCH_CONFIG", GOOD_CONFIGS[0]), ("CPULAUNCH_CONFIG", BAD_CONFIGS[0]),
             ("CPULAUNCH_INSTANCES_PER_SOCKET", "2"), ("CPULAUNCH_FORMAT", "json"), ("CPULAUNCH_QUIET", "true")]


@contextlib.contextmanager
def environment(pairs):
    """os.environ without any CPULAUNCH_* variable but ``pairs`` (both readers read it)."""
    saved = dict(os.environ)
    for k in [k for k in os.environ if k.startswith("CPULAUNCH_") or k == "_CPULAUNCH_COMPLETE"]:
        del os.environ[k]
    os.environ.update(dict(pairs))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def click_reading(args):
    """click's answer: ("ok", Parsed) or ("error", its message) or ("exit", code)."""
    try:
        return "ok", cli.parsed(args)
    except click.exceptions.Exit as exc:
        return "exit", exc.exit_code
    except click.ClickException as exc:
        return "error", exc.format_message()
    except CpulaunchError as exc:
        return "error", str(exc)


def typed(parsed: cmdline.Parsed):
    """The typed options value of a reading, or the error line."""
    try:
        return options.from_values(parsed.values, parsed.given, options.Words(parsed.spelled), environ=os.environ)
    except CpulaunchError as exc:
        return f"error: {exc}"


def check(args, pairs=()):
    """Both readers on ``args`` under ``pairs``; returns the fast reader's answer (None:
    left to click)."""
    with environment(pairs), contextlib.redirect_stdout(open(os.devnull, "w")):
        fast = cmdline.parse(list(args), os.environ)
        slow = click_reading(list(args))
        if fast is not None:
            assert slow == ("ok", fast), (args, pairs)
            assert typed(fast) == typed(slow[1]), (args, pairs)
    return fast


# --------------------------------------------------------------------------- every row, deterministic


@pytest.mark.parametrize("form", VALID, ids=lambda f: " ".join(f).replace(str(CONFIGS), "CONFIGS"))
def test_every_rows_valid_forms_read_alike_and_fast(form):
    """Each spelling of each row with each value click takes: the fast reader reads it
    (never leaves it to click), and reads it as click does."""
    for program in (["true"], ["--", "x", "--ninstances"], ["-m", "mod"]):
        assert check(form + program) is not None, form + program


@pytest.mark.parametrize("form", INVALID + ODD, ids=lambda f: " ".join(f).replace(str(CONFIGS), "CONFIGS"))
def test_invalid_and_odd_forms_read_alike(form):
    for program in (["true"], []):
        check(form + program)


@pytest.mark.parametrize("pair", VARIABLES, ids=lambda p: "=".join(p).replace(str(CONFIGS), "CONFIGS"))
def test_every_kind_of_variable_reads_alike(pair):
    check(["--dry-run", "true"], [pair])
    check(["true"], [pair])


def test_the_fast_reader_leaves_to_click_what_click_refuses():
    """A word click refuses never gets a reading of the fast one (click names it)."""
    for form in INVALID + ODD:
        with environment(()):
            fast = cmdline.parse(form + ["true"], os.environ)
            kind, _ = click_reading(form + ["true"])
        if kind != "ok":
            assert fast is None, form


# --------------------------------------------------------------------------- combinations (hypothesis)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(words=st.lists(st.sampled_from(VALID + INVALID + ODD), max_size=6), program=st.sampled_from(PROGRAMS),
       pairs=st.lists(st.sampled_from(VARIABLES), max_size=3))
def test_combinations_read_alike(words, program, pairs):
    check([w for form in words for w in form] + program, pairs)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(words=st.lists(st.sampled_from(VALID), min_size=1, max_size=6), program=st.sampled_from(PROGRAMS[:9]))
def test_valid_combinations_are_read_fast(words, program):
    """Repeats and mixes of valid forms: read by the fast reader (repeats: the last wins,
    as in click) unless they name a subcommand."""
    args = [w for form in words for w in form] + program
    assert check(args) is not None, args


# --------------------------------------------------------------------------- the process


def _child(*args, env=None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("CPULAUNCH_")}
    full.update(env or {})
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, env=full, timeout=120)


def test_a_plain_run_imports_no_click_and_help_and_subcommands_still_work():
    probe = ("import sys; from cpulaunch import cmdline; code = cmdline.main(sys.argv[1:]); "
             "print('CLICK' if 'click' in sys.modules else 'NOCLICK', file=sys.stderr); sys.exit(code)")
    plain = _child("-c", probe, "--dry-run", "--ninstances", "1", "true")
    assert plain.returncode == 0 and plain.stderr.strip().endswith("NOCLICK"), plain.stderr
    assert plain.stdout.startswith("# instance 0: cpus ")
    for args, out in ((["--help"], "Usage: cpulaunch [OPTIONS]"), (["doctor", "--help"], "Usage: cpulaunch doctor"),
                      (["--version"], "version")):
        proc = _child("-c", probe, *args)
        assert proc.returncode == 0 and out in proc.stdout and proc.stderr.strip().endswith("CLICK"), (args, proc)
    bad = _child("-c", probe, "--ninstances", "x", "true")
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr.splitlines() == ["cpulaunch: error: --ninstances x: 'x' is not a valid integer", "CLICK"]


def test_a_failed_fast_run_ends_as_under_click():
    """An error found after reading (a rule between options) gives click's line and code."""
    proc = _child("-m", "cpulaunch", "--ninstances", "2", "--throughput-mode", "true")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("cpulaunch: error: ") and "--ninstances" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1


#: The run path's import budget (issue 40): modules a plain ``--dry-run`` may import beyond
#: the interpreter's own, counted (not timed, so a loaded machine cannot fail it). Measured
#: when it was set: 29 cpulaunch modules and 21 others; click alone brings 36 modules, torch
#: hundreds. Raise a bound only with the start-up figures of scripts/bench_startup.py.
RUN_PATH_BUDGET = {"cpulaunch": 36, "other": 30}
#: Never imported by a plain run, on any machine: click (--help, completion and subcommands
#: only), the tools, torch, the pictures, and heavy standard modules nothing there needs
#: (logging may come with a note, cpulaunch.log); typing (the records are
#: cpulaunch.records.Record's) and shutil (machine.exec.which): 10 and 4 ms of each run;
#: signal (the launcher and the numactl check use CPython's _signal, without signal's enums);
#: glob with contextlib, and struct (libfinder.glob_files, int.from_bytes): 2 and 0.5 ms.
NEVER_ON_THE_RUN_PATH = ("click", "torch", "numpy", "psutil", "cpulaunch.cli", "cpulaunch.tools", "cpulaunch.runtime",
                         "cpulaunch.svg", "cpulaunch.view", "inspect", "dataclasses", "asyncio", "platform",
                         "typing", "shutil", "signal", "glob", "struct", "contextlib")


@pytest.mark.parametrize("where", ["this machine", "a dump"])
def test_the_run_path_keeps_its_import_budget(where, sysroots):
    """A plain run (real process) imports no click, no tool, nothing heavy, and at most
    :data:`RUN_PATH_BUDGET` modules: the CI guard of start-up (the figures themselves are
    scripts/bench_startup.py's, from a wheel on a quiet machine)."""
    probe = ("import os, sys; base = set(sys.modules); from cpulaunch import cmdline; code = cmdline.main(sys.argv[1:]); "
             "new = sorted(set(sys.modules) - base); print(' '.join(new), file=sys.stderr); sys.exit(code)")
    args = ["--dry-run", "true"] if where == "this machine" else \
        ["--sysroot", str(sysroots["hw-32intel64-2p8co2t+8ve"]), "--dry-run", "--instances-per-socket", "true"]
    proc = _child("-c", probe, *args)
    assert proc.returncode == 0, proc.stderr
    new = proc.stderr.splitlines()[-1].split()
    ours = [m for m in new if m == "cpulaunch" or m.startswith("cpulaunch.")]
    others = [m for m in new if m not in ours]
    heavy = [m for m in new if m.split(".")[0] in NEVER_ON_THE_RUN_PATH or m in NEVER_ON_THE_RUN_PATH
             or any(m.startswith(p + ".") for p in NEVER_ON_THE_RUN_PATH)]
    assert heavy == [], heavy
    assert len(ours) <= RUN_PATH_BUDGET["cpulaunch"], ours
    assert len(others) <= RUN_PATH_BUDGET["other"], others
