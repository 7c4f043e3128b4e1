"""The options' sources under faults: CPULAUNCH_* variables, ``--config`` files and what
a user or an adversary can put in them (issue 19).

The rule held here: an error the user can cause is one line on stderr, exit code 2, no
traceback, whatever the input; never exit 0 having run nothing, never a silently changed
value, never a hang, never exit 70. A few cases go through the real ``python -m
cpulaunch``; the many (hypothesis) call :func:`cpulaunch.cli.main` in-process.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conftest import REPO, run_cli
from cpulaunch import option_table
from cpulaunch import cli, options

try:
    import tomllib
except ImportError:  # Python < 3.11: cpulaunch's tomli dependency
    import tomli as tomllib

XEON = "hw-32intel64-2p8co2t+8ve"
# A FIFO or device must be refused at once; this bound only keeps a regression from
# hanging the suite (the child is killed when it is reached).
HANG_BOUND = 30


def one_line_error(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpulaunch: error: "), proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def main_in_process(args: list, env: dict | None = None) -> tuple:
    """``cli.main(args)`` in this process: (exit code, stdout text, stderr text). ``env``
    is applied to os.environ for the call only."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="surrogateescape")
    err = io.StringIO()
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(list(args))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    out.flush()
    return code, out.buffer.getvalue().decode("utf-8", "replace"), err.getvalue()


def assert_ok_or_one_line(code, out, err):
    """The rule: success (a dry-run's output), or exit 2 and one ``cpulaunch: error:`` line."""
    assert "Traceback" not in err, err
    if code == 0:
        assert out, err
        return
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("cpulaunch: error: "), (code, err)


# --------------------------------------------------------------------------- --version / --help


@pytest.mark.parametrize("var, opt", [("CPULAUNCH_VERSION", "--version"), ("CPULAUNCH_HELP", "--help")])
def test_version_and_help_variables_are_errors_not_a_silent_exit_0(var, opt, tmp_path):
    """Before: click read them as --version/--help, printed that and exited 0, running
    nothing. The program must not have run either way."""
    marker = tmp_path / "ran"
    proc = run_cli("--no-python", "sh", "-c", f"touch {marker}", env={var: "1"}, check_rc=None)
    line = one_line_error(proc, var, "unset", opt)
    assert not marker.exists() and proc.stdout == "", line


def test_an_empty_version_variable_is_unset_like_every_other():
    code, out, err = main_in_process(["--dry-run", "--format", "json", "true"], env={"CPULAUNCH_VERSION": ""})
    assert code == 0 and json.loads(out)["instances"], err


def test_the_old_fmt_variable_is_an_error_naming_the_new_one():
    code, out, err = main_in_process(["--dry-run", "true"], env={"CPULAUNCH_FMT": "json"})
    assert code == 2 and err.count("\n") == 1 and "CPULAUNCH_FMT" in err and "CPULAUNCH_FORMAT" in err, err


def test_version_and_help_still_work_from_the_command_line():
    assert run_cli("--version").stdout.strip().endswith(cli.__version__)
    assert "CPULAUNCH_" in run_cli("--help").stdout


@pytest.mark.parametrize("key", ["version", "help", "config", "h", "dry-run", "format", "verbose", "program"])
def test_config_key_that_is_not_a_setting_names_key_and_file(key, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"{key} = true\n")
    code, out, err = main_in_process(["--config", str(cfg), "--dry-run", "true"])
    assert code == 2 and out == "" and err.count("\n") == 1, (code, out, err)
    assert repr(key) in err and str(cfg) in err and "Traceback" not in err, err


def test_version_in_a_config_runs_nothing_and_says_so(tmp_path):
    """Through the real command: before, this printed the version and exited 0."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("version = true\n")
    marker = tmp_path / "ran"
    one_line_error(run_cli("--config", str(cfg), "--no-python", "sh", "-c", f"touch {marker}", check_rc=None),
                   "'version'", str(cfg))
    assert not marker.exists()


# --------------------------------------------------------------------------- --config: size and type


def test_config_over_1_mib_is_refused_not_truncated(tmp_path):
    """Before: the first MiB was read and the rest dropped, so this file (valid within
    its first MiB) planned 2 instances and exited 0."""
    cfg = tmp_path / "big.toml"
    cfg.write_text("ninstances = 2\n#" + "x" * (1 << 20) + "\nninstances_per_nothing = 1\n")
    one_line_error(run_cli("--config", str(cfg), "--dry-run", "true", check_rc=None), str(cfg), "1048576 bytes")


def test_config_of_exactly_the_limit_is_read(tmp_path, sysroots):
    body = "ninstances = 2\n#"
    cfg = tmp_path / "edge.toml"
    cfg.write_text(body + "x" * ((1 << 20) - len(body) - 1) + "\n")
    assert cfg.stat().st_size == 1 << 20
    code, out, err = main_in_process(["--sysroot", str(sysroots[XEON]), "--config", str(cfg),
                                      "--dry-run", "--format", "json", "true"])
    assert code == 0 and len(json.loads(out)["instances"]) == 2, err


@pytest.mark.parametrize("line, key, shown, expected", [
    ("ninstances = 2.5", "ninstances", "2.5", "an integer"),
    ("ninstances = true", "ninstances", "True", "an integer"),
    ("ninstances = '2'", "ninstances", "'2'", "an integer"),
    ("grace-period = true", "grace-period", "True", "a number"),
    ("use-logical-cores = 1", "use-logical-cores", "1", "true or false"),
    ("use_logical_cores = 'no'", "use_logical_cores", "'no'", "true or false"),
    ("allocator = 5", "allocator", "5", "one of"),
    ("allocator = 'nope'", "allocator", "'nope'", "one of"),
    ("core-list = [0, 1]", "core-list", "[0, 1]", "a string"),
    ('log-dir = "a\\u0000b"', "log-dir", "'a\\x00b'", "NUL"),
    ("node-list = 1.0", "node-list", "1.0", "a string"),
    ("kmp-blocktime = 1979-05-27", "kmp-blocktime", "1979", "an integer"),
    ("[ninstances]\nx = 1", "ninstances", "{'x': 1}", "an integer"),
])
def test_config_value_of_the_wrong_type_names_key_file_value_and_type(line, key, shown, expected, tmp_path):
    """Before: 2.5 became 2, true became 1, 1 and 'no' meant yes (click converted them),
    a table named like an option was skipped."""
    cfg = tmp_path / "t.toml"
    cfg.write_text(line + "\n")
    code, out, err = main_in_process(["--config", str(cfg), "--dry-run", "true"])
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, (code, out, err)
    for needle in (str(cfg), key, shown, expected):
        assert needle in err, (needle, err)


def test_config_value_type_error_through_the_real_command(tmp_path):
    cfg = tmp_path / "t.toml"
    cfg.write_text("[cpulaunch]\nninstances = 2.5\n")
    one_line_error(run_cli("--config", str(cfg), "--dry-run", "true", check_rc=None),
                   str(cfg), "ninstances = 2.5", "an integer")


@pytest.mark.parametrize("text, ninstances, extra", [
    ("ninstances = 4", 4, {}),
    ("grace-period = 3", 1, {}),  # an integer for a number of seconds
    ("allocator = 'JEMALLOC'\nninstances = 2", 2, {}),  # choices ignore case, as on the command line
    ("node-list = 1", 1, {"cpus": list(range(8, 16))}),  # a number for a list
    ("use-logical-cores = false\nninstances = 2", 2, {}),
])
def test_config_values_of_the_right_type_work(text, ninstances, extra, tmp_path, sysroots):
    cfg = tmp_path / "ok.toml"
    cfg.write_text(text + "\n")
    code, out, err = main_in_process(["--sysroot", str(sysroots[XEON]), "--config", str(cfg),
                                      "--dry-run", "--format", "json", "true"])
    assert code == 0, err
    doc = json.loads(out)
    assert len(doc["instances"]) == ninstances
    if "cpus" in extra:
        assert sorted(doc["instances"][0]["cpus"]) == extra["cpus"]


@pytest.mark.parametrize("name, text", [
    ("pyproject.toml", "[tool]\ncpulaunch = 3\n"),
    ("pyproject.toml", "tool = 'x'\n"),
    ("c.toml", "a = " + "[" * 3000 + "]" * 3000 + "\n"),
    ("c.toml", "a = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n"),
    ("c.toml", "\ufeffninstances = 1\n"),
    ("c.toml", "ninstances = 1\nninstances = 2\n"),
], ids=["tool-not-a-table", "tool-a-string", "deep-arrays", "deep-tables", "bom", "duplicate-key"])
def test_malformed_config_shapes_are_one_line(name, text, tmp_path):
    """Before: exit 70 (AttributeError on a non-table [tool.cpulaunch], RecursionError in
    the TOML parser on deep nesting)."""
    cfg = tmp_path / name
    cfg.write_text(text)
    code, out, err = main_in_process(["--config", str(cfg), "--dry-run", "true"])
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err and str(cfg) in err, (code, err)


def test_a_file_named_like_pyproject_is_not_one(tmp_path, sysroots):
    cfg = tmp_path / "mypyproject.toml"
    cfg.write_text("ninstances = 2\n")
    code, out, err = main_in_process(["--sysroot", str(sysroots[XEON]), "--config", str(cfg),
                                      "--dry-run", "--format", "json", "true"])
    assert code == 0 and len(json.loads(out)["instances"]) == 2, err


# --------------------------------------------------------------------------- --config: not a file


@pytest.mark.parametrize("how", ["option", "variable"])
def test_config_fifo_is_refused_at_once(how, tmp_path):
    """Before: open() of a FIFO with no writer blocked for ever (the run timed out here)."""
    fifo = tmp_path / "cfg.toml"
    os.mkfifo(fifo)
    args, env = (["--config", str(fifo)], None) if how == "option" else ([], {"CPULAUNCH_CONFIG": str(fifo)})
    proc = run_cli(*args, "--dry-run", "true", env=env, timeout=HANG_BOUND, check_rc=None)
    one_line_error(proc, str(fifo), "not a regular file (a FIFO)",
                   "--config" if how == "option" else "CPULAUNCH_CONFIG")


@pytest.mark.parametrize("path, what", [("/dev/zero", "a character device"), ("/dev/null", "a character device")])
def test_config_device_is_refused(path, what):
    code, out, err = main_in_process(["--dry-run", "true"], env={"CPULAUNCH_CONFIG": path})
    assert code == 2 and err.count("\n") == 1 and path in err and what in err, (code, err)


def test_config_folder_and_missing_file(tmp_path):
    code, _, err = main_in_process(["--config", str(tmp_path / "nope.toml"), "--dry-run", "true"])
    assert code == 2 and err.count("\n") == 1 and "No such file" in err, err
    code, _, err = main_in_process(["--dry-run", "true"], env={"CPULAUNCH_CONFIG": str(tmp_path)})
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err


# --------------------------------------------------------------------------- CPULAUNCH_<OPTION>


def test_cpulaunch_format_changes_dry_run_output():
    """Before: CPULAUNCH_FORMAT was ignored (click read CPULAUNCH_FMT) and the text form came out."""
    proc = run_cli("--dry-run", "--allocator", "default", "true", env={"CPULAUNCH_FORMAT": "json"})
    assert json.loads(proc.stdout)["instances"][0]["argv"][-1] == "true"


@pytest.mark.parametrize("var, value, cpus", [
    ("CPULAUNCH_NODE_LIST", "1", [list(range(8, 16))]),
    ("CPULAUNCH_NINSTANCES", "2", [list(range(0, 8)), list(range(8, 16))]),
    ("CPULAUNCH_USE_LOGICAL_CORES", "1", [list(range(32))]),
    ("CPULAUNCH_NCORES_PER_INSTANCE", "8", [list(range(0, 8)), list(range(8, 16))]),
])
def test_option_variables_reach_the_plan(var, value, cpus, sysroots):
    code, out, err = main_in_process(["--sysroot", str(sysroots[XEON]), "--dry-run", "--format", "json",
                                      "--allocator", "default", "true"], env={var: value})
    assert code == 0, err
    assert [sorted(i["cpus"]) for i in json.loads(out)["instances"]] == cpus


# --------------------------------------------------------------------------- packaging


def test_tomli_is_a_base_dependency_before_python_3_11():
    """--config reads TOML; Python 3.9/3.10 have no tomllib, so tomli must come with the
    package itself, not only with the test/tune extras."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "tomli>=1.1; python_version < '3.11'" in deps, deps


# --------------------------------------------------------------------------- adversarial configs

_KEYS = sorted({p.name for p in cli.command.params if isinstance(p, click.Option)}
               | {"version", "help", "config", "cpulaunch", "tool", "measured", "", "ninstances ", "NINSTANCES"})
_key = st.one_of(st.sampled_from(_KEYS), st.sampled_from(_KEYS).map(lambda k: k.replace("_", "-")),
                 st.text(max_size=12))
_scalar = st.one_of(
    st.booleans(), st.integers(), st.integers(min_value=-3, max_value=70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
    st.sampled_from(["0", "0-3", "1,3", "bind", "gnu", "default", "jemalloc", "json", "2", "socket",
                     "1:2", "auto", "none", "affinity", "a\x00b", "../x", "/dev/null"]),
)
_value = st.recursive(_scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(_key, inner, max_size=3)), max_leaves=6)


def _toml_key(k: str) -> str:
    return json.dumps(k, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(v), repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(map(_toml_value, v)) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return _toml_key(v)


def _toml_doc(table: dict, header: str) -> str:
    body = "\n".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items())
    return (f"[{header}]\n" if header else "") + body + "\n"


_KINDS = {name: option_table.kind_of(name) for name in option_table.config_keys()}
_BY_KIND = {
    "flag": st.booleans(),
    "count": st.integers(min_value=0, max_value=3),
    "integer": st.one_of(st.integers(min_value=-2, max_value=40), st.integers()),
    "number": st.floats(allow_nan=True, allow_infinity=True),
    "string": st.one_of(st.sampled_from(["0", "0-3", "1,3", "2", "socket", "node", "1:2", "127.0.0.1",
                                         "localhost:29500", "lo", "x", "", "0-100000"]), st.text(max_size=8),
                        st.integers(min_value=0, max_value=40)),
    "path": st.sampled_from(["", ".", "/dev/null", "/nonexistent/x", "logs"]),
}


def _typed_entry(name: str):
    kind = _KINDS[name]
    values = st.sampled_from(kind.choices) if kind.name == "choice" else _BY_KIND[kind.name]
    return st.tuples(st.sampled_from([name, name.replace("_", "-")]), values)


# Right-typed values of real settings, to reach the combinations and the planner.
_typed_tables = st.lists(st.sampled_from(sorted(_KINDS))
                         .flatmap(_typed_entry), max_size=5).map(dict)
_docs = st.builds(_toml_doc, st.one_of(st.dictionaries(_key, _value, max_size=5), _typed_tables),
                  st.sampled_from(["", "cpulaunch", "tool.cpulaunch", "measured", "tool"]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=st.one_of(_docs, st.binary(max_size=200).map(lambda b: b.decode("latin-1"))),
       name=st.sampled_from(["c.toml", "pyproject.toml", "best.toml"]))
def test_any_config_document_is_a_dry_run_or_one_line(doc, name, sysroots, tmp_path_factory):
    folder = tmp_path_factory.mktemp("cfg")
    cfg = folder / name
    cfg.write_text(doc, encoding="utf-8", errors="surrogateescape")
    code, out, err = main_in_process(["--sysroot", str(sysroots[XEON]), "--config", str(cfg),
                                      "--dry-run", "--format", "json", "true"])
    event(f"exit {code}" + (": " + err.replace(str(cfg), "FILE")[18:60] if code else ""))
    assert_ok_or_one_line(code, out, err)


@pytest.mark.parametrize("text", [
    "ninstances = 9223372036854775807\n",
    "grace-period = nan\n",
    "verify-after = -inf\n",
    "stdin-instance = -1\n",
    "master-port = 0\nddp = true\n",
    "[cpulaunch]\nlog-dir = '/dev/null'\n[measured]\nx = [1, {a = 2}]\n",
    "ninstances = 2\n[tool.cpulaunch]\nninstances = '\\u0000'\n",
])
def test_adversarial_configs_through_the_real_command(text, tmp_path, sysroots):
    cfg = tmp_path / "a.toml"
    cfg.write_text(text)
    proc = run_cli("--sysroot", str(sysroots[XEON]), "--config", str(cfg), "--dry-run", "true", check_rc=None)
    assert_ok_or_one_line(proc.returncode, proc.stdout, proc.stderr)
