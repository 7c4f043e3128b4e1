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


def test_the_precompiled_new_methods_are_their_source():
    """records' table of namedtuple's ``__new__`` per number of fields (compiled with the
    module, so a run compiles none) holds the code its source line compiles to."""
    from cpulaunch import records

    assert len(records._NEW_TEMPLATES) == 25
    for size, template in enumerate(records._NEW_TEMPLATES):
        want = eval(records._new_source(size), {"_tuple_new": tuple.__new__}).__code__
        got = template.__code__
        assert (got.co_code, got.co_varnames, got.co_names, got.co_consts, got.co_argcount) == \
            (want.co_code, want.co_varnames, want.co_names, want.co_consts, want.co_argcount), size


@pytest.mark.parametrize("size", [0, 1, 2, 24, 25, 30])
def test_a_record_of_any_size_is_made_as_namedtuple_makes_it(size):
    """From the table (up to 24 fields) and compiled at run time (more)."""
    fields = [f"f{i}" for i in range(size)]
    ours = _record_class(fields)
    theirs = typing.NamedTuple("Theirs", [(f, int) for f in fields])
    values = list(range(size))
    assert ours(*values) == theirs(*values) and ours._fields == theirs._fields
    assert ours(**dict(zip(fields, values)))._asdict() == theirs(*values)._asdict()
    assert ours.__new__.__code__.co_varnames == theirs.__new__.__code__.co_varnames
    if size:
        with pytest.raises(TypeError):
            ours(*values, 0)


def _record_class(fields):
    """A record class with ``fields`` (all int), made as a class statement would."""
    return type(Record)("Ours", (Record,), {"__annotations__": dict.fromkeys(fields, int), "__qualname__": "Ours"})
