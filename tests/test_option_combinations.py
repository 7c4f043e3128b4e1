"""Every combination of options plans or says why (issue 31): a property test over the whole
option table.

Hypothesis draws combinations of options from :mod:`cpulaunch.option_table` (values from
each option's type, edge values included; every spelling: dashes, torchrun's underscores,
the other launchers' aliases; from the command line or from the option's CPULAUNCH_*
variable) on every fixture dump, two generated trees and this machine, as ``--dry-run``
text and JSON, every ``--print-env`` format, and through :func:`cpulaunch.plan_instances`.

Each combination either plans (every instance has CPUs, instances are disjoint, inside the
CPUs this process may use, the JSON equal to the text, the API equal to the command line)
or fails with exit code 2 and one line whose first option named is one the user gave, as
they gave it (the API: cpulaunch's own error type, naming a keyword given); never exit 70,
a traceback, or more than 10 s.

CI runs a bounded, derandomized pass (``CPULAUNCH_COMBINATIONS`` examples, default 250,
about 2 minutes here); ``scripts/check_combinations.py`` runs a larger one for releases.
The planted-bug tests below show the checker fails on each kind of bug it exists for.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, seed, settings
from hypothesis.errors import InvalidArgument
from hypothesis import strategies as st

import bigtree
from conftest import MACHINES
from cpulaunch import cli, cpulist, option_table as table
from cpulaunch.errors import CpulaunchError

EXAMPLES = int(os.environ.get("CPULAUNCH_COMBINATIONS", "250"))
#: Another seed explores other combinations (scripts/check_combinations.py); unset, the
#: pass is derandomized: the same combinations every run.
SEED = os.environ.get("CPULAUNCH_COMBINATIONS_SEED")
#: Seconds one combination may take (the issue's bound).
LIMIT = 10.0

# ----------------------------------------------------------------------------- values

#: Values each string or path option takes in the draw: good ones and the edges users hit.
STRINGS = {
    "ncores_per_instance": ["1", "2", "4", "8", "1,1", "2,1", "43,43,42", "0", "x", "1,,1", "99999"],
    "core_list": ["0", "0-1", "0-3", "1", "2-9", "0-999", "3-1", "x", "0,2"],
    "node_list": ["0", "1", "0,1", "7", "0-3"],
    "instance_idx": ["0", "1", "0,1", "5", "1-2"],
    "nproc_per_node": ["1", "2", "4", "socket", "node", "0", "x"],
    "nnodes": ["1", "2", "1:2", "x"],
    "master_addr": ["127.0.0.1"],
    "rdzv_endpoint": ["127.0.0.1:29400"],
    "rdzv_id": ["job"],
    "iface": ["lo"],
    "share_host": ["fail", "wait", "no", "x"],
    "lease_dir": ["/nonexistent/cpulaunch-leases"],
    "log_dir": ["logs"],
    "log_path": ["logs"],
    "tee": ["0", "3", "0:1,1:2", "4", "x"],
    "redirects": ["1", "2", "1:3", "0:1,0:2"],
    "local_ranks_filter": ["0", "0,1", "x"],
}
INTEGERS = [0, 1, 2, 3, 4, 8, 100]
NUMBERS = ["0", "0.5", "5", "-1", "nan", "inf"]
#: Not drawn: they choose the machine, a file or the log level (each has its own tests).
NOT_DRAWN = {"sysroot", "config", "verbose", "quiet", "dry_run", "print_env", "show_topology", "fmt"}


def _value(dest: str, kind: table.Kind):
    if kind.name == "flag":
        return st.just(True)
    if kind.name == "choice":
        return st.sampled_from(kind.choices)
    if kind.name == "integer":
        return st.sampled_from(INTEGERS + ([65536] if dest == "master_port" else []))
    if kind.name == "number":
        return st.sampled_from(NUMBERS)
    return st.sampled_from(STRINGS[dest])


def _entries():
    """(python name, spelling, kind) of every option and alias that is drawn."""
    out = [(o.dest, s, o.kind) for o in table.OPTIONS if o.dest not in NOT_DRAWN for s in table.spellings(o.name)]
    out += [(a.dest, s, a.kind) for a in table.ALIASES for s in table.spellings(a.name)]
    return out


ENTRIES = _entries()


@st.composite
def combinations(draw):
    """[(python name, spelling, value, source)] with each option at most once."""
    picked = draw(st.lists(st.sampled_from(ENTRIES), max_size=4, unique_by=lambda e: e[0]))
    out = []
    for dest, spelling, kind in picked:
        value = draw(_value(dest, kind))
        source = draw(st.sampled_from(["flag", "flag", "flag", "env"]))
        out.append((dest, spelling, value, source))
    return out


OUTPUTS = [("--dry-run", "json"), ("--dry-run", "text"), ("--dry-run", "svg"),
           *(("--print-env", f.value) for f in table.FORMATS_FOR[table.Output.PRINT_ENV])]


def command_words(combo) -> tuple[list[str], dict[str, str], set[str]]:
    """(argv words, environment, the names the user gave: spellings and variables)."""
    words, env, given = [], {}, set()
    for dest, spelling, value, source in combo:
        if source == "env":
            var = table.option_variable(table.name_of(dest))
            env[var] = "1" if value is True else str(value)
            given.add(var)
        else:
            words += [spelling] if value is True else [spelling, str(value)]
            given.add(spelling)
    return words, env, given


# ----------------------------------------------------------------------------- the checker


def main_in_process(args: list, env: dict) -> tuple[int, str, str, float]:
    """``cli.main(args)`` in this process with ``env`` added to a clean environment:
    (exit code, stdout, stderr, seconds)."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="surrogateescape")
    err = io.StringIO()
    saved = dict(os.environ)
    for k in [k for k in os.environ if k.startswith(("CPULAUNCH_", "OMP_", "KMP_"))]:
        del os.environ[k]
    os.environ.update(env)
    start = time.monotonic()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(list(args))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    out.flush()
    return code, out.buffer.getvalue().decode("utf-8", "replace"), err.getvalue(), time.monotonic() - start


OPTION_TOKEN = re.compile(r"(?<![\w-])(--[a-z][a-z0-9_-]*|CPULAUNCH_[A-Z0-9_]+)")


def blame_problem(message: str, given: set[str]) -> str | None:
    """None when the first option (or variable) ``message`` names is one the user gave;
    else what is wrong. A message naming no option at all blames the machine or the
    program, not an option."""
    first = OPTION_TOKEN.search(message)
    if first is None or first.group(1) in given:
        return None
    return f"names {first.group(1)}, which was not given ({sorted(given)}): {message}"


def _instances_of_text(text: str) -> list:
    """(cpulist, env, argv) of each instance of a --dry-run text."""
    out, header = [], None
    for line in text.replace(" \\\n  ", " ").splitlines():  # a command's continuation lines joined
        m = re.match(r"# (?:instance|rank) (\d+): cpus ([0-9,-]+?)(?:,? |$)", line)
        if m:
            header = m.group(2)
        elif line.startswith("env ") and header is not None:
            words = shlex.split(line)[1:]
            i = next(i for i, w in enumerate(words) if "=" not in w)
            out.append((header, dict(w.split("=", 1) for w in words[:i]), words[i:]))
            header = None
    return out


def check(root: str | None, combo, output: str, fmt: str) -> str | None:
    """None when the combination plans or fails as the rule says; else the problem."""
    words, env, given = command_words(combo)
    given |= {output, "--format", "--sysroot"}
    sysroot = ["--sysroot", root] if root else []
    args = [*sysroot, output, "--format", fmt, *words, "true"]
    code, out, err, took = main_in_process(args, env)
    with contextlib.suppress(InvalidArgument):  # outside hypothesis (the planted-bug tests)
        event(f"exit {code}" + (": " + re.sub(r"[0-9]+", "N", err.split(":")[2].strip()[:40]) if code == 2 and
                                  err.count(":") > 2 else ""))
    if took > LIMIT:
        return f"took {took:.1f} s: {args}"
    if "Traceback" in err or code not in (0, 2):
        return f"exit {code}: {args} {env}: {err.strip()}"
    if code == 2:
        lines = err.strip().splitlines()
        if len(lines) != 1 or not lines[0].startswith("cpulaunch: error: "):
            return f"not one error line: {args} {env}: {err!r}"
        return blame_problem(lines[0][len("cpulaunch: error: "):], given)
    if output == "--dry-run" and fmt == "json":
        doc = json.loads(out)
        problem = plan_problem(doc)
        if problem:
            return f"{problem}: {args} {env}"
        code, text, err, _ = main_in_process([*sysroot, "--dry-run", "--format", "text", *words, "true"], env)
        shown = [(i["cpulist"], i["env"], i["argv"]) for i in doc["instances"]]
        if code != 0 or _masked(_instances_of_text(text)) != _masked(shown):
            return f"the text form differs from the JSON: {args} {env}"
    return None


def _masked(instances: list) -> list:
    """Instances with a port chosen free at planning time (each invocation finds its own)
    shown as "free"."""
    return [(c, {k: "free" if k == "MASTER_PORT" else v for k, v in env.items()}, argv) for c, env, argv in instances]


def plan_problem(doc: dict) -> str | None:
    """The plan's invariants: every instance has CPUs, none shares a CPU with another,
    all inside the allowed CPUs."""
    allowed = cpulist.parse(doc["topology"]["allowed"])
    seen: dict = {}
    for inst in doc["instances"]:
        if not inst["cpus"]:
            return f"instance {inst['index']} has no CPU"
        for cpu in inst["bound_cpus"]:
            if cpu in seen:
                return f"CPU {cpu} in instances {seen[cpu]} and {inst['index']}"
            if cpu not in allowed:
                return f"CPU {cpu} of instance {inst['index']} is not allowed"
            seen[cpu] = inst["index"]
    return None


def api_check(root: str | None, combo) -> str | None:
    """The same combination through plan_instances: the same plan as the command line,
    or a CpulaunchError whose first keyword named is one given."""
    import cpulaunch

    keywords = {}
    for dest, _, value, _ in combo:
        kind = table.kind_of(dest)
        if kind.name == "number":
            value = float(value)
        keywords[dest] = value
    try:
        rendered = cpulaunch.plan_instances(environ={}, **({"sysroot": root} if root else {}), **keywords)
    except CpulaunchError as exc:
        text = str(exc)
        if "\n" in text:
            return f"not one line: {text!r}"
        named = re.findall(r"\b([a-z][a-z0-9_]*)\b", text.split(":")[0].split("=")[0])
        if named and named[0] in table.BY_DEST and named[0] not in keywords and not text.startswith("plan_instances"):
            return f"names {named[0]}, which was not given ({sorted(keywords)}): {text}"
        return None
    except Exception as exc:  # noqa: BLE001 - anything else is the bug this test exists for
        return f"{type(exc).__name__}: {exc} ({keywords})"
    seen: dict = {}
    for inst in rendered.instances:
        if not inst.cpus or any(c in seen for c in inst.bound_cpus):
            return f"empty or overlapping instance {inst.index}: {keywords}"
        seen.update({c: inst.index for c in inst.bound_cpus})
    return None


# ----------------------------------------------------------------------------- the machines

GENERATED = {"gen-2s-snc2-smt2": dict(sockets=2, nodes_per_socket=2, cores_per_node=4, threads_per_core=2),
             "gen-4s-offline": dict(sockets=4, nodes_per_socket=1, cores_per_node=8, threads_per_core=1,
                                    offline=(5, 17))}


@pytest.fixture(scope="module")
def machines(sysroots, tmp_path_factory) -> list:
    """Every fixture dump, the generated trees and this machine (None)."""
    roots = [str(sysroots[m]) for m in MACHINES]
    for name, shape in GENERATED.items():
        roots.append(str(bigtree.make_tree(tmp_path_factory.mktemp(name), **shape)))
    return roots + [None]


@pytest.fixture(autouse=True)
def _in_a_scratch_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # --log-dir logs, relative: nothing is written by a dry run anyway


@settings(max_examples=EXAMPLES, deadline=None, derandomize=SEED is None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@seed(int(SEED or 0))
@given(data=st.data())
def test_every_combination_plans_or_says_why(machines, data):
    root = data.draw(st.sampled_from(machines), label="machine")
    combo = data.draw(combinations(), label="options")
    output, fmt = data.draw(st.sampled_from(OUTPUTS), label="output")
    problem = check(root, combo, output, fmt)
    assert problem is None, problem
    if output == "--dry-run" and fmt == "json":
        drawn_by_api = [c for c in combo if c[0] in table.api_keywords()]
        problem = api_check(root, drawn_by_api)
        assert problem is None, problem


# ----------------------------------------------------------------------------- the checker finds bugs


def _finds(machines, combos) -> list:
    """The problems the checker reports over ``combos`` on every machine."""
    found = []
    for root in machines:
        for combo in combos:
            for output, fmt in (("--dry-run", "json"),):
                problem = check(root, combo, output, fmt) or api_check(root, combo)
                if problem:
                    found.append(problem)
    return found


SAMPLE = [[("ncores_per_instance", "--ncores-per-instance", "1,1", "flag")],
          [("ddp", "--ddp", True, "flag"), ("nproc_per_node", "--nproc-per-node", "4", "flag")],
          [("ninstances", "--ninstances", 2, "env")],
          [("instances_per_socket", "--instances-per-socket", 1, "flag")]]


def test_the_checker_passes_the_sample(machines):
    assert _finds(machines[-3:], SAMPLE) == []


def test_the_checker_finds_a_crash_in_a_note(machines, monkeypatch):
    """run_cpu's comparison note as it was: it divided by the size when the size was a
    list (``--ncores-per-instance 1,1`` ended in exit 70)."""
    from cpulaunch import placement

    def old_run_cpu_placement(topo, req):
        cores = [sorted(topo.allowed.intersection(c.cpus)) for c in topo.cores]
        units = sorted(cpu for cpus in cores for cpu in cpus[:1])
        n = req.ncores_per_instance
        if n is None:
            return None
        count = req.ninstances or len(units) // n
        return [tuple(units[i * n:(i + 1) * n]) for i in range(count)]

    monkeypatch.setattr(placement, "run_cpu_placement", old_run_cpu_placement)
    found = _finds(machines[-1:], SAMPLE[:1])
    assert found and "exit 70" in found[0] and "TypeError" in found[0], found


def test_the_checker_finds_a_message_naming_an_option_not_given(machines, monkeypatch):
    """The ranks' request without the user's words: the planner then blamed --ninstances
    for --nproc-per-node 4."""
    from cpulaunch import distributed

    real = distributed.rank_request
    monkeypatch.setattr(distributed, "rank_request",
                        lambda req, spec, topo, local_size=None, said="", **kw: real(req, spec, topo, local_size,
                                                                                     "--ninstances", **kw))
    found = _finds(machines[-1:], SAMPLE[1:2])
    assert found and "names --ninstances, which was not given" in found[0], found


def test_the_checker_finds_an_overlap(machines, monkeypatch):
    """Two instances on one CPU, with the planner's own validation switched off."""
    from cpulaunch import plan as plan_mod

    real = plan_mod._select

    def overlapping(result, req):
        first, *rest = result.instances
        rest = [i._replace(cpus=tuple(sorted({*i.cpus, *first.cpus}))) for i in rest]
        return real(result._replace(instances=(first, *rest)), req)

    monkeypatch.setattr(plan_mod, "_select", overlapping)
    found = _finds(machines[-1:], SAMPLE[2:3])
    assert found and "CPU 0 in instances 0 and 1" in found[0], found
