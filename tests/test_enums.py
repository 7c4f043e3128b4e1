"""cpulaunch.enums makes the classes the enum module makes of the same bodies (Python 3.11's
behaviour), without importing enum (issue 40: the run path's start-up)."""

import copy
import enum
import json
import pickle

import pytest

from cpulaunch import enums
from cpulaunch.machine.numactl import MemPolicy
from cpulaunch.machine.recipes import When
from cpulaunch.names import BindMode, Format, Output
from cpulaunch.notes import Level
from cpulaunch.option_table import Section


def _body(base_str, base_int, prefix):
    """An enum of each kind, as this module's and as enum's classes, from one body; named
    ``prefix + "Mode"`` and ``prefix + "Rank"`` in this module, so that pickle finds them."""

    class Mode(str, base_str):
        """How."""

        __qualname__ = prefix + "Mode"
        FAST = "fast"  #: a member with a comment
        SLOW = "slow-path"
        QUICK = "fast"  # an alias of FAST

        def shout(self) -> str:
            return self.value.upper()

    class Rank(base_int):
        __qualname__ = prefix + "Rank"
        LOW = 20
        MID = 25
        HIGH = 30

    return Mode, Rank


OURS = OursMode, OursRank = _body(enums.Enum, enums.IntEnum, "Ours")
THEIRS = TheirsMode, TheirsRank = _body(enum.Enum, enum.IntEnum, "Theirs")


def _facts(cls):
    """What a user of the class can see, as plain data."""
    members = list(cls)
    first = members[0]
    out = {
        "names": [m.name for m in members],
        "values": [m.value for m in members],
        "value types": [type(m.value).__name__ for m in members],
        "__members__": {k: v.name for k, v in cls.__members__.items()},
        "len": len(cls),
        "reversed": [m.name for m in reversed(cls)],
        "repr": [repr(m) for m in members],
        "str": [str(m) for m in members],
        "format": [format(m) for m in members] + [f"{first:>30}", "%s" % first],
        "json": json.dumps({"k": members}),
        "by value": [cls(m.value) is m for m in members] + [cls(m) is m for m in members],
        "by name": [cls[m.name] is m for m in members],
        "eq value": [m == m.value and hash(m) == hash(m.value) for m in members],
        "isinstance": [isinstance(m, cls) and isinstance(m, type(m.value)) for m in members],
        "copies": [copy.copy(m) is m and copy.deepcopy(m) is m for m in members],
        "pickle": [pickle.loads(pickle.dumps(m, p)) is m for m in members for p in range(2, 6)],
        "sorted": [m.name for m in sorted(members, reverse=True)],
        "contains": [m in cls for m in members],
        "doc": cls.__doc__,
    }
    return out


@pytest.mark.parametrize("index", [0, 1], ids=["str", "int"])
def test_an_enum_is_the_enum_modules(index):
    assert _facts(OURS[index]) == _facts(THEIRS[index])


def test_aliases_and_methods_as_the_enum_module():
    (ours, _), (theirs, _) = OURS, THEIRS
    for cls in (ours, theirs):
        assert cls.QUICK is cls.FAST and cls("fast") is cls.FAST and cls["QUICK"] is cls.FAST
        assert cls.SLOW.shout() == "SLOW-PATH"
    assert list(ours.__members__) == list(theirs.__members__) == ["FAST", "SLOW", "QUICK"]


def test_only_public_names_of_the_mixed_in_type_are_members():
    """Ours is narrower than enum, which also makes ``_name`` a member and turns a ``str``
    enum's ``3`` into ``"3"``: no enum of cpulaunch's has either (the docstring says so)."""

    class Mode(str, enums.Enum):
        ONE = "one"
        _private = "not a member"
        lower = 3

    assert list(Mode) == [Mode.ONE] and Mode._private == "not a member" and Mode.lower == 3


def test_a_value_is_in_its_enum_as_python_3_12_answers():
    """3.11's enum raises TypeError for ``"fast" in Mode``; 3.12's and ours answer."""
    assert "fast" in OursMode and "nope" not in OursMode and ["x"] not in OursMode
    assert 25 in OursRank and 99 not in OursRank


@pytest.mark.parametrize("pair", [OURS, THEIRS], ids=["ours", "enum"])
def test_errors_as_the_enum_module(pair):
    mode, rank = pair
    with pytest.raises(ValueError, match=r"^'nope' is not a valid .*Mode$"):
        mode("nope")
    with pytest.raises(ValueError, match=r"^99 is not a valid .*Rank$"):
        rank(99)
    with pytest.raises(ValueError):
        mode(["unhashable"])
    with pytest.raises(KeyError):
        mode["NOPE"]
    with pytest.raises(AttributeError):
        mode.FAST = "other"
    with pytest.raises(AttributeError):
        del mode.FAST
    with pytest.raises(TypeError):
        class More(mode):
            EXTRA = "extra"


def test_int_members_order_and_compare_as_ints():
    _, ours = OURS
    assert ours.LOW < ours.MID < 26 < ours.HIGH and ours(25) is ours.MID
    assert max([ours.LOW, ours.HIGH]) is ours.HIGH and ours.MID + 1 == 26


@pytest.mark.parametrize("cls", [BindMode, Output, Format, MemPolicy, When, Section, Level])
def test_the_run_paths_enums_are_ours(cls):
    """The seven enums a run builds derive from cpulaunch.enums, so that a run does not import
    enum (tests/test_wheel.py checks the import itself)."""
    assert isinstance(cls, enums.EnumType) and not isinstance(cls, enum.EnumMeta)
    assert [cls(m.value) for m in cls] == list(cls) and len(cls) >= 3
