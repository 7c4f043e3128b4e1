"""The tools' shared options (issue 41): doctor, verify and tune take --sysroot, --format and
-v from the command line's rows of the option table (pip's general options), not from
declarations of their own."""

from __future__ import annotations

import pytest

from cpulaunch import option_table as table
from cpulaunch.tools import SHARED, shared_option
from cpulaunch.tools import doctor, verify
from cpulaunch.tools import tune

USES = [(doctor.command, "sysroot"), (doctor.command, "fmt"), (verify.command, "fmt"),
        (tune.tune_command, "sysroot"), (tune.tune_command, "verbose")]


@pytest.mark.parametrize("command, dest", USES, ids=[f"{c.name}-{d}" for c, d in USES])
def test_a_tool_takes_the_rows_spellings_and_default(command, dest):
    param = next(p for p in command.params if p.name == dest)
    row = table.BY_DEST[dest]
    assert row.name in param.opts and (row.short is None or row.short in param.opts)
    assert param.default == (row.default if row.default is not None else "text")
    assert param.envvar is None  # the CPULAUNCH_* variables are the launcher's inputs


def test_doctor_and_verify_write_text_or_json_of_the_rows_formats():
    for command in (doctor.command, verify.command):
        param = next(p for p in command.params if p.name == "fmt")
        assert list(param.type.choices) == ["text", "json"]
        assert set(param.type.choices) <= set(table.BY_DEST["fmt"].kind.choices)


def test_only_the_shared_rows_and_their_values_are_taken():
    assert SHARED == ("sysroot", "fmt", "verbose")
    with pytest.raises(ValueError, match="not an option the tools share"):
        shared_option("ninstances", help=None)
    with pytest.raises(ValueError, match="--format takes"):
        shared_option("fmt", help=None, choices=("text", "yaml"))
