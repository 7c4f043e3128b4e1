"""cpulaunch.records.Record makes the class typing.NamedTuple makes, without typing (issue 40:
the run path's start-up)."""

import copy
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
    # a record's class derives from Record, which holds namedtuple's methods once (typing's from tuple)
    assert isinstance(a, tuple) and Ours.__mro__ == (Ours, Record, tuple, object) and Theirs.__mro__[1:] == (tuple, object)
    assert Ours.__match_args__ == Theirs.__match_args__ == ("name", "size", "tags")
    assert Ours.__slots__ == Theirs.__slots__ == () and not hasattr(a, "__dict__")
    assert Ours("x", tags=(1,), size=3) == Theirs("x", tags=(1,), size=3) == ("x", 3, (1,))
    assert Ours.__new__.__defaults__ == Theirs.__new__.__defaults__ == (2, ())
    assert Ours.__new__.__doc__ == Theirs.__new__.__doc__.replace("Theirs", "Ours")
    assert Ours.__new__.__code__.co_varnames == Theirs.__new__.__code__.co_varnames == ("_cls", "name", "size", "tags")
    assert Ours.name.__doc__ == Theirs.name.__doc__ == "Alias for field number 0"
    assert copy.copy(a) == copy.deepcopy(a) == a and type(copy.deepcopy(a)) is Ours
    for record in (Ours, Theirs):
        with pytest.raises(TypeError, match="Expected 3 arguments, got 2"):
            record._make(["x", 1])
        with pytest.raises(ValueError, match="unexpected field names: \\['colour'\\]"):
            record("x")._replace(colour=1)
        with pytest.raises(TypeError, match="multiple values for argument 'name'"):
            record("x", name="y")
        with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
            record("x", colour=1)
    assert pickle.loads(pickle.dumps(a)) == a
    assert Ours.__annotations__ == Theirs.__annotations__ == {"name": str, "size": int, "tags": tuple}
    with pytest.raises(AttributeError):
        a.name = "y"
    with pytest.raises(TypeError):
        Ours()


def test_records_of_one_field_and_of_none_are_namedtuples_too():
    class One(Record):
        only: int

    class NoneAtAll(Record):
        """Nothing."""

    class TheirOne(typing.NamedTuple):
        only: int

    assert One(4) == (4,) == TheirOne(4) and repr(One(4)) == "One(only=4)" and One._make([4]) == (4,)
    assert NoneAtAll() == () and repr(NoneAtAll()) == "NoneAtAll()" and NoneAtAll._fields == ()
    # the __new__ code is shared by number of fields; each class keeps its own names
    class Other(Record):
        other: int = 5

    assert Other() == (5,) and Other(other=6) == (6,) and One(only=7) == (7,)
    with pytest.raises(TypeError, match="unexpected keyword argument 'only'"):
        Other(only=1)


def test_a_record_refuses_what_typing_refuses():
    with pytest.raises(TypeError, match="without a default follows"):
        class Bad(Record):
            a: int = 1
            b: int
    with pytest.raises(ValueError, match="underscore"):
        class Hidden(Record):
            _a: int
    with pytest.raises(AttributeError, match="_replace"):
        class Worse(Record):
            a: int

            def _replace(self):
                return self


def test_type_checking_is_false_at_run_time_as_typing_says():
    assert TYPE_CHECKING is typing.TYPE_CHECKING is False


class Base(Record):
    size: int = 1


class Derived(Base):
    """A class deriving from a record class is an ordinary subclass, as of a namedtuple."""

    def twice(self):
        return 2 * self.size


def test_a_subclass_of_a_record_is_an_ordinary_class_as_of_a_namedtuple():
    class TheirBase(typing.NamedTuple):
        size: int = 1

    class TheirDerived(TheirBase):
        def twice(self):
            return 2 * self.size

    assert Derived(3).twice() == TheirDerived(3).twice() == 6 and Derived()._fields == ("size",)
    assert Derived.__mro__ == (Derived, Base, Record, tuple, object)
    assert repr(Derived(2)) == "Derived(size=2)" == repr(TheirDerived(2)).replace("Their", "")
    assert pickle.loads(pickle.dumps(Derived(4))) == Derived(4) and type(Derived(4)._replace(size=1)) is Derived
