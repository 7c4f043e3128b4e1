"""cpulaunch.records.Record makes the class typing.NamedTuple makes, without typing (issue 40:
the run path's start-up)."""

import pickle
import typing

import pytest

from cpulaunch.records import TYPE_CHECKING, Record


class Ours(Record):
    """A record."""

    name: str
    size: int = 2
    tags: tuple = ()

    @property
    def double(self) -> int:
        return 2 * self.size

    def label(self) -> str:
        return f"{self.name}:{self.size}"


class Theirs(typing.NamedTuple):
    """A record."""

    name: str
    size: int = 2
    tags: tuple = ()

    @property
    def double(self) -> int:
        return 2 * self.size

    def label(self) -> str:
        return f"{self.name}:{self.size}"


def test_a_record_is_the_namedtuple_typing_makes():
    a, b = Ours("x"), Theirs("x")
    assert Ours._fields == Theirs._fields == ("name", "size", "tags")
    assert Ours._field_defaults == Theirs._field_defaults == {"size": 2, "tags": ()}
    assert tuple(a) == tuple(b) == ("x", 2, ())
    assert a == ("x", 2, ()) and hash(a) == hash(b)
    assert a._replace(size=5) == Ours("x", 5) and a._replace(size=5).double == 10
    assert a._asdict() == b._asdict() == {"name": "x", "size": 2, "tags": ()}
    assert Ours._make(["y", 3, (1,)]).label() == Theirs._make(["y", 3, (1,)]).label() == "y:3"
    assert repr(a) == "Ours(name='x', size=2, tags=())" and repr(b) == "Theirs(name='x', size=2, tags=())"
    assert Ours.__doc__ == Theirs.__doc__ == "A record."
    assert Ours.__module__ == __name__ and Ours.__qualname__ == "Ours"
    assert isinstance(a, tuple) and type(a).__mro__[1:] == type(b).__mro__[1:] == (tuple, object)
    assert pickle.loads(pickle.dumps(a)) == a
    assert Ours.__annotations__ == Theirs.__annotations__ == {"name": str, "size": int, "tags": tuple}
    with pytest.raises(AttributeError):
        a.name = "y"
    with pytest.raises(TypeError):
        Ours()


def test_a_record_refuses_what_typing_refuses():
    with pytest.raises(TypeError, match="without a default follows"):
        class Bad(Record):
            a: int = 1
            b: int
    with pytest.raises(AttributeError, match="_replace"):
        class Worse(Record):
            a: int

            def _replace(self):
                return self


def test_type_checking_is_false_at_run_time_as_typing_says():
    assert TYPE_CHECKING is typing.TYPE_CHECKING is False
