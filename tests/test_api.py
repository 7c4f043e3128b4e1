"""The Python API, in-process (no subprocess): plan_instances and bind_current_process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import cpulaunch
from cpulaunch.errors import CpulaunchError

XEON = "hw-32intel64-2p8co2t+8ve"


def test_plan_instances_on_a_dump_matches_the_cli(sysroots):
    r = cpulaunch.plan_instances(program=("python", "serve.py"), sysroot=str(sysroots[XEON]),
                                 instances_per_socket=2, allocator="default")
    assert [i.cpus for i in r.instances] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    assert [i.mem_nodes for i in r.instances] == [(0,), (0,), (1,), (1,)]
    assert r.instances[2].env["OMP_NUM_THREADS"] == "4"
    assert r.instances[2].argv[-2:] == ("python", "serve.py")


@pytest.mark.parametrize("bad", [dict(ninstance=2), dict(ninstances="x"), dict(dry_run=True)])
def test_plan_instances_refuses_unknown_or_mistyped_options(bad):
    with pytest.raises(CpulaunchError):
        cpulaunch.plan_instances(**bad)


def test_bind_current_process_in_a_child_interpreter():
    """bind_current_process narrows this process: run it in a fresh interpreter so the
    test process keeps its own affinity; no cpulaunch subprocess is involved."""
    code = (
        "import os, json, cpulaunch\n"
        "r = cpulaunch.plan_instances(ninstances=len(os.sched_getaffinity(0)), allocator='default')\n"
        "inst = r.instances[-1]\n"
        "b = cpulaunch.bind_current_process(inst)\n"
        "print(json.dumps({'aff': sorted(os.sched_getaffinity(0)), 'cpus': list(inst.bound_cpus),"
        " 'omp': os.environ['OMP_NUM_THREADS'], 'policy': b.mem_policy, 'notes': list(b.notes)}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    import json

    rec = json.loads(out.stdout)
    assert rec["aff"] == rec["cpus"] and len(rec["aff"]) == 1 and rec["omp"] == "1"
    assert rec["policy"] == "bind" and rec["notes"] == []  # set_mempolicy permitted here (root, numactl works)


# --------------------------------------------------------------------------- values under faults (issue 19)

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text, text
    return text


def test_zero_instances_is_an_error_like_the_cli(sysroots):
    """Before: 0 was dropped as falsy before parsing, and one instance was planned."""
    with pytest.raises(CpulaunchError) as info:
        cpulaunch.plan_instances(ninstances=0, sysroot=str(sysroots[XEON]))
    assert one_line(info.value) == "ninstances=0: must be 1 or more"


def test_false_and_zero_are_values_not_absent(sysroots):
    r = cpulaunch.plan_instances(sysroot=str(sysroots[XEON]), allocator="default", reserve_cores=0,
                                 use_logical_cores=False, ninstances=2)
    assert [len(i.cpus) for i in r.instances] == [8, 8]


@pytest.mark.parametrize("value", ["no", "False", 1, 0, 2.0, [True]])
def test_a_flag_takes_a_bool_only(value, sysroots):
    """Before: "no" (any truthy value) meant yes."""
    with pytest.raises(CpulaunchError) as info:
        cpulaunch.plan_instances(use_logical_cores=value, sysroot=str(sysroots[XEON]))
    assert "use_logical_cores" in one_line(info.value) and "true or false" in str(info.value)


@pytest.mark.parametrize("name, value, expected", [
    ("ninstances", 2.5, "an integer"),
    ("ninstances", True, "an integer"),
    ("ninstances", "2", "an integer"),
    ("grace_period", "3", "a number"),
    ("allocator", "nope", "one of"),
    ("core_list", [0, 1], "a string"),
])
def test_a_value_of_the_wrong_type_is_named(name, value, expected, sysroots):
    with pytest.raises(CpulaunchError) as info:
        cpulaunch.plan_instances(sysroot=str(sysroots[XEON]), **{name: value})
    line = one_line(info.value)
    assert line.startswith(f"plan_instances: {name} = ") and expected in line, line


def test_a_program_string_is_split_like_a_shell(sysroots):
    """Before: "python x.py" became one argv entry per character."""
    r = cpulaunch.plan_instances(program="python x.py --tag 'a b'", sysroot=str(sysroots[XEON]), allocator="default")
    assert r.instances[0].argv[-4:] == ("python", "x.py", "--tag", "a b")
    r = cpulaunch.plan_instances(program=["python", Path("x.py")], sysroot=str(sysroots[XEON]), allocator="default")
    assert r.instances[0].argv[-2:] == ("python", "x.py")


@pytest.mark.parametrize("program, needle", [("python 'x.py", "quotation"), (5, "program = 5"),
                                             ((b"python",), "program"), ({"a": 1}, "program")])
def test_a_program_that_is_not_words_is_an_error(program, needle, sysroots):
    with pytest.raises(CpulaunchError) as info:
        cpulaunch.plan_instances(program=program, sysroot=str(sysroots[XEON]))
    assert needle in one_line(info.value)


@pytest.mark.parametrize("kw, name", [
    (dict(sysroot="/tmp/a\x00b"), "sysroot"),
    (dict(core_list="0\x00"), "core_list"),
    (dict(log_dir="l\x00g"), "log_dir"),
    (dict(program=("python", "x\x00.py")), "program"),
    (dict(program="python x\x00.py"), "program"),
])
def test_a_nul_byte_is_an_error_naming_the_argument(kw, name):
    """Before: ValueError ("embedded null byte") from deep inside, naming nothing."""
    with pytest.raises(CpulaunchError) as info:
        cpulaunch.plan_instances(**kw)
    line = one_line(info.value)
    assert name in line and "NUL" in line, line


def test_option_variables_of_the_environment_are_not_read(sysroots, monkeypatch):
    """The keywords are the options: a CPULAUNCH_NINSTANCES (or CPULAUNCH_CONFIG) the
    launcher that started this process was given does not leak into an in-process plan."""
    monkeypatch.setenv("CPULAUNCH_NINSTANCES", "2")
    monkeypatch.setenv("CPULAUNCH_CONFIG", "/nonexistent.toml")
    r = cpulaunch.plan_instances(sysroot=str(sysroots[XEON]), allocator="default")
    assert len(r.instances) == 1


def test_environ_must_map_strings_to_strings(sysroots):
    with pytest.raises(TypeError) as info:
        cpulaunch.plan_instances(sysroot=str(sysroots[XEON]), environ={"A": 1})
    assert "environ" in one_line(info.value)


def _api_names() -> list:
    from cpulaunch import option_table as table

    return sorted(table.api_keywords()) + ["dry_run", "print_env", "show_topology", "program", "environ"]


_anything = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=10),
    st.binary(max_size=5), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                                max_size=2),
    st.tuples(st.text(max_size=3)), st.sampled_from([object(), Path("/"), Path("x\x00"), 1j, float("inf"), ...]),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(_api_names()), value=_anything)
def test_any_value_at_any_keyword_works_or_is_one_line(name, value, sysroots):
    """Every keyword of plan_instances, any value: a plan, or CpulaunchError/TypeError
    with one line, never anything else (ValueError, AttributeError, OverflowError...)."""
    kw = {"sysroot": str(sysroots[XEON]), "allocator": "default", name: value}
    try:
        cpulaunch.plan_instances(**kw)
    except (CpulaunchError, TypeError) as exc:
        one_line(exc)


@settings(max_examples=100, deadline=None)
@given(instance=_anything, set_env=_anything)
def test_bind_current_process_refuses_what_is_not_an_instance(instance, set_env):
    """Nothing is changed (affinity, os.environ) before the arguments are checked."""
    before = (os.sched_getaffinity(0), dict(os.environ))
    with pytest.raises(TypeError) as info:
        cpulaunch.bind_current_process(instance, set_env=set_env)
    one_line(info.value)
    assert (os.sched_getaffinity(0), dict(os.environ)) == before


def test_bind_current_process_refuses_a_non_bool_set_env(sysroots):
    inst = cpulaunch.plan_instances(allocator="default").instances[0]
    with pytest.raises(TypeError) as info:
        cpulaunch.bind_current_process(inst, set_env="no")
    assert "set_env" in one_line(info.value)


# --------------------------------------------------------------------------- one public API (issue 32)


def test_the_public_api_is_the_package_and_each_name_lives_once():
    names = [n for n in cpulaunch.__all__ if n != "__version__"]
    assert set(names) == set(cpulaunch._LAZY) and set(names) <= set(dir(cpulaunch))
    for name in names:
        obj = getattr(cpulaunch, name)
        assert obj.__module__ == cpulaunch._LAZY[name], name
        assert (obj.__doc__ or "").strip(), f"{name} has no docstring"
    from cpulaunch import ddp_wrap, distributed

    assert distributed.wrap_ddp is cpulaunch.wrap_ddp is ddp_wrap.wrap_ddp  # the old paths are the same object


def test_run_returns_the_programs_exit_code_and_this_process_stays(tmp_path):
    """In-process launch: never exec'd over the caller, even for one instance."""
    marker = tmp_path / "ran"
    code = cpulaunch.run([sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x'); raise SystemExit(3)"],
                         allocator="default", environ={"PATH": os.environ["PATH"]})
    assert code == 3 and marker.read_text() == "x"


def test_run_supervises_several_instances(capfd):
    code = cpulaunch.run("python -c 'import os; print(os.environ[\"CPULAUNCH_INSTANCE_INDEX\"])'", ninstances=2,
                         allocator="default", environ={"PATH": os.environ["PATH"]})
    out = capfd.readouterr().out
    assert code == 0 and sorted(out.splitlines()) == ["[0] 0", "[1] 1"], out


def test_run_refuses_verify_in_one_line():
    with pytest.raises(CpulaunchError) as info:
        cpulaunch.run("true", verify=True)
    assert one_line(info.value) == "run: verify is the command line's (cpulaunch --verify); drop it"


def test_run_names_itself_and_the_nearest_keyword():
    """``cpulaunch.run(ninstance=2)`` says what to fix in run's own words (issue 41)."""
    with pytest.raises(CpulaunchError) as info:
        cpulaunch.run("true", ninstance=2)
    assert str(info.value) == "run: unknown option 'ninstance' (did you mean ninstances=?)"


def test_the_api_page_lists_exactly_the_exports_and_every_entry_imports():
    """docs/reference/api.md's table is exactly ``cpulaunch.__all__`` (issue 41), and every
    ``::: module.NAME`` entry imports from the module it names."""
    import importlib
    import re

    from conftest import REPO

    text = (REPO / "docs" / "reference" / "api.md").read_text()
    table = text[text.index("| you want | name | section |"):].split("\n\n", 1)[0]
    listed = {n for row in table.splitlines()[2:] for n in re.findall(r"`(\w+)`", row.split(" | ")[1])}
    assert listed == set(cpulaunch.__all__) - {"__version__"}
    entries = re.findall(r"^::: ([\w.]+)$", text, re.M)
    assert entries
    for entry in entries:
        module, name = entry.rsplit(".", 1)
        assert hasattr(importlib.import_module(module), name), entry
    code = "\n".join(re.findall(r"```python\n(.*?)```", text, re.S))
    for name in re.findall(r"from cpulaunch import ([\w, ]+)", code):
        for n in name.split(","):
            assert n.strip() in cpulaunch.__all__, n
