"""A row of the option table owns its meaning (issue 41): each row names the field of the
typed options its value lands in and its one default; ``options.from_values`` fills the
fields from the rows; choice lists in help are generated; one list of words is read as
"true"; every default and every CPULAUNCH_* name is spelled once.

The checks are shown to fail on planted rows (a row that lands nowhere, in a field that is
not there, or whose value a converter forgets)."""

from __future__ import annotations

import ast
import re

import click
import pytest

from conftest import REPO, run_cli
from cpulaunch import envvars, option_table as table, options
from cpulaunch.option_table import FLAG, Option, Section
from cpulaunch.options import Options, from_values

PKG = REPO / "cpulaunch"


def landing_problems(rows) -> list[str]:
    """Every way ``rows`` break "one row, one field": a row landing in no group or in a
    field its group does not have, several rows in one field without a converter, a field
    of the typed options no row fills (and not said to be filled elsewhere)."""
    out, filled = [], {}
    for o in rows:
        filled.setdefault(o.field, []).append(o.name)
        if o.field in table.NOT_FIELDS:
            continue
        group, _, name = o.field.partition(".")
        if group not in options.GROUPS:
            out.append(f"{o.name} lands in {o.field}: no such group ({', '.join(options.GROUPS)})")
        elif name not in options.GROUPS[group]._fields:
            out.append(f"{o.name} lands in {o.field}, which {options.GROUPS[group].__name__} does not have")
    for field, names in filled.items():
        if len(names) > 1 and field not in options._CONVERT and field not in table.NOT_FIELDS:
            out.append(f"{', '.join(names)} land in {field} and no converter joins them")
    for group, cls in options.GROUPS.items():
        for name in cls._fields:
            field = f"{group}.{name}"
            if field not in filled and field not in options.FILLED_ELSEWHERE and field not in options.FOLLOWS:
                out.append(f"{field}: no row fills it")
    return out


def test_every_row_lands_in_one_field_and_every_field_is_filled():
    assert landing_problems(table.OPTIONS) == []
    assert set(table.LANDINGS) == {o.field for o in table.OPTIONS}


def test_a_planted_row_that_lands_nowhere_fails():
    planted = Option("--pin-harder", "pin_harder", FLAG, Section.PLACEMENT, "Pin the threads harder.")
    assert landing_problems(table.OPTIONS + (planted,)) == [
        "--pin-harder lands in options.pin_harder, which Options does not have"]
    elsewhere = planted._replace(lands="pinning.harder")
    assert landing_problems(table.OPTIONS + (elsewhere,))[0].startswith("--pin-harder lands in pinning.harder: no such group")
    shared = planted._replace(lands="launch.keep_going")
    assert landing_problems(table.OPTIONS + (shared,)) == [
        "--keep-going, --pin-harder land in launch.keep_going and no converter joins them"]
    gone = tuple(o for o in table.OPTIONS if o.dest != "iface")
    assert landing_problems(gone) == ["ddp.iface: no row fills it"]


#: A value of each option that differs from its default, and what it needs beside it to
#: be valid (its "base"); every other row: True for a flag, else by kind below.
SAMPLES = {
    "ncores_per_instance": ({}, "2"), "core_list": ({}, "0-3"), "node_list": ({}, "0"), "instance_idx": ({}, "0"),
    "share_host": ({}, "wait"), "lease_dir": ({"share_host": "fail"}, "/leases"),
    "kmp_blocktime": ({"omp_runtime": "intel"}, 5), "omp_places": ({"omp_runtime": "gnu"}, True),
    "fmt": ({"dry_run": True}, "json"), "nproc_per_node": ({"ddp": True}, "2"),
    "nnodes": ({"ddp": True, "master_addr": "h0"}, "2"),
    "node_rank": ({"ddp": True, "master_addr": "h0", "nnodes": "2"}, 1),
    "rdzv_id": ({"ddp": True, "rdzv_endpoint": "h0:1"}, "job"),
    "max_restarts": ({"ddp": True, "rdzv_endpoint": "h0:1"}, 2),
    "rdzv_endpoint": ({"ddp": True}, "h0:1"), "master_addr": ({"ddp": True}, "h0"), "iface": ({"ddp": True}, "eth0"),
    "verify_after": ({}, 2.5), "grace_period": ({}, 3.0), "stdin_instance": ({}, 1), "sysroot": ({}, "/root"),
    "log_dir": ({}, "/logs"), "verbose": ({}, 2),
    "tee": ({"log_dir": "/logs"}, "1"), "redirects": ({"log_dir": "/logs"}, "0:2"), "local_ranks_filter": ({}, "0"),
}


def _sample(o: Option):
    base, value = SAMPLES.get(o.dest, ({}, None))
    if o.requires_ddp or o.dest == "standalone":
        base = {"ddp": True, **base}
    if value is not None:
        return base, value
    k = o.kind
    if k.name == "flag":
        return base, True
    if k.name == "choice":
        return base, next(c for c in k.choices if c != o.default)
    if k.name in ("integer", "count"):
        return base, int(k.minimum or 0) + 2
    return base, "x"


def _leaves(opts: Options) -> dict:
    """{GROUP.FIELD: value} of every field a row may fill (words and notes left out)."""
    out = {f"options.{n}": getattr(opts, n) for n in Options._fields if n not in ("request", "launch", "ddp")}
    out.update({f"request.{n}": v for n, v in opts.request._asdict().items()})
    out.update({f"launch.{n}": v for n, v in opts.launch._asdict().items()})
    out["options.ddp"] = opts.ddp is not None
    if opts.ddp is not None:
        out.update({f"ddp.{n}": v for n, v in opts.ddp._asdict().items()})
    return {k: v for k, v in out.items() if k not in options.FILLED_ELSEWHERE}


def changed_fields(o: Option) -> set:
    """The fields :func:`from_values` changes when the row ``o`` is given a value that
    is not its default (beside what that value needs)."""
    base, value = _sample(o)
    before = _leaves(from_values(base, frozenset(base)))
    after = _leaves(from_values({**base, o.dest: value}, frozenset(base) | {o.dest}))
    changed = {f for f in before.keys() & after.keys() if before[f] != after[f]}  # a group that comes: its flag
    return changed - {f for f, follows in options.FOLLOWS.items() if follows in changed}


@pytest.mark.parametrize("o", [o for o in table.OPTIONS if o.field not in table.NOT_FIELDS], ids=lambda o: o.name)
def test_each_row_changes_its_own_field_and_nothing_else(o):
    assert changed_fields(o) == {o.field}


def test_a_converter_that_forgets_a_row_fails(monkeypatch):
    planted = Option("--pin-harder", "pin_harder", FLAG, Section.PLACEMENT, "Pin the threads harder.",
                     lands="launch.follow_cpuset")
    monkeypatch.setattr(table, "OPTIONS", table.OPTIONS + (planted,))
    monkeypatch.setitem(table.BY_DEST, "pin_harder", planted)
    monkeypatch.setitem(table.LANDINGS, "launch.follow_cpuset", ("follow_cpuset", "pin_harder"))
    monkeypatch.setitem(options._CONVERT, "launch.follow_cpuset", lambda c: c.plain("follow_cpuset"))
    assert changed_fields(planted) == set()  # lands nowhere in fact: the test above fails for it
    assert changed_fields(table.BY_DEST["follow_cpuset"]) == {"launch.follow_cpuset"}


def test_nothing_given_is_the_typed_defaults():
    """The typed options' own defaults are the rows' (read from them, never restated)."""
    assert from_values({}) == Options()


# --------------------------------------------------------------------------- one default


def _constants(value) -> list[str]:
    """Where a constant is written in the package's code (docstrings and comments aside)."""
    out = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and type(node.value) is type(value) and node.value == value:
                out.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return out


def test_each_default_is_written_once():
    assert _constants("127.0.0.1") == ["cpulaunch/machine/engines.py:" + str(_line("engines.py", "LOCAL_MASTER_ADDR ="))]
    assert _constants(29500) == ["cpulaunch/machine/engines.py:" + str(_line("engines.py", "DEFAULT_MASTER_PORT ="))]
    for dest in ("grace_period", "verify_after"):
        assert table.BY_DEST[dest].default is not None and _named_numbers(dest) == [], dest
    text = (PKG / "options.py").read_text()
    assert not re.search(r"""or ["'](auto|numactl|bind|1|/)["']""", text), "a table default restated in options.py"


def _line(name: str, start: str) -> int:
    path = next(PKG.rglob(name))
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(start))


def _named_numbers(name: str) -> list[str]:
    """Where a number is bound to ``name`` in the package's code: a parameter's default, an
    assignment, a keyword argument (``grace_period=10.0``)."""
    def number(node) -> bool:
        return isinstance(node, ast.Constant) and type(node.value) in (int, float)

    out = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            pairs = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                pairs += list(zip([x.arg for x in a.args][-len(a.defaults):] if a.defaults else [], a.defaults))
                pairs += [(x.arg, d) for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                pairs.append((node.target.id, node.value))
            elif isinstance(node, ast.Assign):
                pairs += [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.keyword):
                pairs.append((node.arg, node.value))
            out += [f"{path.relative_to(REPO)}:{v.lineno}" for n, v in pairs if n == name and number(v)]
    return out


@pytest.mark.parametrize("dest", ["nnodes", "node_rank", "backend", "verify_after", "grace_period", "kmp_blocktime",
                                  "master_addr", "nproc_per_node"])
def test_defaults_said_in_help_and_reference_come_from_the_row(dest):
    o = table.BY_DEST[dest]
    assert o.shown_default, dest
    reference = table.reference_markdown()
    row = next(line for line in reference.splitlines() if line.startswith(f"| `{o.name}` |"))
    assert row.split(" | ")[2] == f"`{o.shown_default}`", row
    if "default" in o.help:  # said in help: from the row, never by hand
        assert "{default}" in o.help and f"default {o.shown_default})" in o.help_line.replace(": ", " "), o.help


def test_kmp_blocktime_default_is_the_registry_one():
    from cpulaunch.machine.libraries import by_choice

    assert table.BY_DEST["kmp_blocktime"].shown_default == by_choice("openmp", "intel").idle_env["KMP_BLOCKTIME"]


# --------------------------------------------------------------------------- generated help


@pytest.mark.parametrize("o", [o for o in table.OPTIONS if o.kind.choices or set(o.words) - {"digits"}],
                         ids=lambda o: o.name)
def test_no_help_lists_choices_by_hand(o):
    choices = o.kind.choices or tuple(w for w in o.words if w != "digits")
    by_hand = [c for c in choices if re.search(rf"(?<![\w-]){re.escape(c)}(?![\w-])", o.help)]
    assert by_hand == [], f"{o.name}'s help lists {by_hand} by hand; write {{choices}} or {{or_choices}}"
    assert all(c in o.help_line for c in choices), o.help_line


# --------------------------------------------------------------------------- one list of "true"


def test_true_and_false_words_are_clicks():
    for word in table.TRUE_WORDS:
        assert click.BOOL.convert(word, None, None) is True and click.BOOL.convert(word.upper(), None, None) is True
    for word in table.FALSE_WORDS:
        assert click.BOOL.convert(word, None, None) is False
    for word in ("2", "yep", "nope", "none"):
        with pytest.raises(click.BadParameter):
            click.BOOL.convert(word, None, None)


@pytest.mark.parametrize("word", table.TRUE_WORDS + tuple(w.upper() for w in table.TRUE_WORDS))
def test_share_host_reads_the_true_words(word):
    assert from_values({"share_host": word}, frozenset({"share_host"})).share_host == "fail"


@pytest.mark.parametrize("word", table.FALSE_WORDS + ("",))
def test_share_host_reads_the_false_words(word):
    assert from_values({"share_host": word}, frozenset({"share_host"})).share_host is None


def test_dry_run_and_share_host_read_y_alike(sysroots):
    env = {"CPULAUNCH_DRY_RUN": "y"}
    proc = run_cli("--sysroot", str(sysroots["hw-32intel64-2p8co2t+8ve"]), "true", env=env)
    assert proc.returncode == 0 and "true" in proc.stdout, proc.stderr
    assert from_values({"share_host": "y"}, frozenset({"share_host"})).share_host == "fail"


# --------------------------------------------------------------------------- names spelled once


def test_every_cpulaunch_variable_is_spelled_in_envvars_or_the_table():
    """A ``"CPULAUNCH_..."`` string anywhere else in the package is a second spelling: the
    variables written into instances are envvars.py's, the option variables the table's
    (:func:`cpulaunch.option_table.option_variable`)."""
    allowed = {"cpulaunch/envvars.py", "cpulaunch/option_table.py"}
    #: Loaded by file path into every rank's Python by the site hook, which cannot import the
    #: cpulaunch package there (the rank's interpreter may not have it): they spell the names
    #: again, and each must be one envvars.py declares.
    hook_files = {"cpulaunch/runtime/sitehook/sitecustomize.py", "cpulaunch/runtime/failrec.py"}
    declared = {v.name for v in envvars.VARIABLES}
    #: Not a variable: the line a tuned program prints (tools/tune/trials.py METRIC_PREFIX).
    not_variables = {"CPULAUNCH_METRIC"}
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.fullmatch(r"CPULAUNCH_[A-Z0-9_]*", node.value) and node.value not in not_variables:
                if rel in hook_files and node.value in declared:
                    continue
                found.append(f"{rel}:{node.lineno}: {node.value}")
    assert found == []



def test_the_environment_reference_is_made_from_envvars():
    """docs/reference/environment.md's tables are envvars.py's (``python scripts/options_doc.py``
    writes them), and envvars.py's constants are exactly its rows."""
    from cpulaunch import envvars

    text = (REPO / "docs" / "reference" / "environment.md").read_text()
    assert "\n" + envvars.reference_markdown() + "\n<!-- envvars-table:end -->" in text, \
        "docs/reference/environment.md differs: run python scripts/options_doc.py"
    constants = {getattr(envvars, n) for n in envvars.__all__ if isinstance(getattr(envvars, n), str)}
    assert constants == {v.name for v in envvars.VARIABLES}
    assert {"CPULAUNCH_PLANNED_RECIPE", "CPULAUNCH_BINDING_FILE"} <= constants
    assert all(f"`{v.name}`" in text for v in envvars.VARIABLES)
