"""The base of cpulaunch's records: ``class Kind(Record)`` with annotated fields and
defaults behaves as the class ``class Kind(typing.NamedTuple)`` makes (a
:func:`collections.namedtuple`: a tuple with named fields, the class's docstring, methods
and properties), without importing :mod:`typing` and without compiling code per class.

Why: the run path builds about 45 such classes. ``typing.NamedTuple`` turns every
annotation into a ``ForwardRef`` (compiling its text) and imports ``typing`` itself; with
the run path's ``typing`` imports moved under ``TYPE_CHECKING`` that was about 10 ms of
every run. :func:`collections.namedtuple` then compiles a ``__new__`` from source for each
class (``eval``) and makes its five methods again for each: about 110 us a class here, 5 ms
of every run (issue 40; ``scripts/bench_startup.py``, docs/dev/measurements.md). Here
``_make``, ``_replace``, ``_asdict``, ``__repr__`` and ``__getnewargs__`` are written once,
on :class:`Record`, and each class's ``__new__`` is namedtuple's own code for its number of
fields, compiled once per number and given the class's field names
(:meth:`types.CodeType.replace`): it takes the same positional and keyword arguments at the
same speed. The fields, their order and defaults, ``_fields``, ``_field_defaults``,
``__match_args__``, ``__slots__ = ()``, equality, hashing, repr and pickling are
namedtuple's (``tests/test_records.py`` holds them to ``typing.NamedTuple``'s); a record's
class derives from :class:`Record`, then :class:`tuple`.

``TYPE_CHECKING`` is False at run time, as :data:`typing.TYPE_CHECKING` is: a run-path
module imports its annotations' names under ``if TYPE_CHECKING:`` from :mod:`typing`, so
that type checkers and the docs' reader see them and a run never imports ``typing``.
"""

from types import FunctionType

__all__ = ["Record", "TYPE_CHECKING"]

TYPE_CHECKING = False

try:  # the C property namedtuple's fields use (CPython); a property of itemgetter elsewhere
    from _collections import _tuplegetter
except ImportError:  # pragma: no cover - other interpreters
    from operator import itemgetter

    def _tuplegetter(index, doc):
        return property(itemgetter(index), doc=doc)

#: Names a record class may not define (namedtuple's own, as typing.NamedTuple forbids them).
_PROHIBITED = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields", "_field_defaults",
                         "_make", "_replace", "_asdict", "_source"})
_tuple_new = tuple.__new__
#: The globals of every record's ``__new__`` (namedtuple's, shared).
_NEW_GLOBALS = {"_tuple_new": _tuple_new, "__builtins__": {}, "__name__": __name__}
#: {number of fields: the code of namedtuple's ``__new__`` for that many, with placeholder names}.
_NEW_CODE = {}
#: namedtuple's ``__new__`` for 0 to 24 fields (:func:`_new_source`), compiled with this module,
#: so that their code comes from its cached bytecode: compiling one at run time took 25-190 us
#: here, and a run builds records of 16 sizes (issue 40). More fields are compiled when met.
#: ``tests/test_records.py`` holds each to :func:`_new_source`.
_NEW_TEMPLATES = (
    lambda _cls: _tuple_new(_cls, ()),
    lambda _cls, _0,: _tuple_new(_cls, (_0,)),
    lambda _cls, _0, _1: _tuple_new(_cls, (_0, _1)),
    lambda _cls, _0, _1, _2: _tuple_new(_cls, (_0, _1, _2)),
    lambda _cls, _0, _1, _2, _3: _tuple_new(_cls, (_0, _1, _2, _3)),
    lambda _cls, _0, _1, _2, _3, _4: _tuple_new(_cls, (_0, _1, _2, _3, _4)),
    lambda _cls, _0, _1, _2, _3, _4, _5: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, _21: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, _21)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, _21, _22: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, _21, _22)),
    lambda _cls, _0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, _21, _22, _23: _tuple_new(_cls, (_0, _1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, _21, _22, _23)),
)


def _new_source(size: int) -> str:
    """The source of namedtuple's ``__new__`` for ``size`` fields, placeholder names:
    ``lambda _cls, _0, _1: _tuple_new(_cls, (_0, _1))``."""
    args = ", ".join(f"_{i}" for i in range(size)) + ("," if size == 1 else "")
    return f"lambda _cls{', ' if size else ''}{args}: _tuple_new(_cls, ({args}))"


def _new(name: str, qualname: str, fields: tuple, defaults: tuple):
    """The ``__new__`` :func:`collections.namedtuple` compiles for ``fields`` (``lambda _cls,
    a, b: _tuple_new(_cls, (a, b))``), from :data:`_NEW_TEMPLATES` (or the code compiled for
    the first class with as many fields), renamed."""
    code = _NEW_CODE.get(len(fields))
    if code is None:
        if len(fields) < len(_NEW_TEMPLATES):
            code = _NEW_TEMPLATES[len(fields)].__code__
        else:
            code = eval(_new_source(len(fields)), _NEW_GLOBALS).__code__
        _NEW_CODE[len(fields)] = code
    names = {"co_varnames": ("_cls", *fields), "co_name": "__new__"}
    if hasattr(code, "co_qualname"):  # Python 3.11 and later
        names["co_qualname"] = f"{qualname}.__new__"
    code = code.replace(**names)
    new = FunctionType(code, _NEW_GLOBALS, "__new__", defaults or None)
    new.__doc__ = f"Create new instance of {name}({', '.join(fields)})"
    return new


class _RecordMeta(type):
    """Makes each ``class X(Record)`` a tuple with named fields, the way
    ``typing.NamedTupleMeta`` and :func:`collections.namedtuple` do (Python 3.11), minus the
    type checks and the per-class compiling. A class deriving from a record class
    (``class Topology(_TopologyFields)``) is an ordinary subclass, as of a namedtuple."""

    def __new__(mcls, name, bases, ns):
        if bases == (tuple,) or Record not in bases:  # Record itself, or a subclass of a record class
            return super().__new__(mcls, name, bases, ns)
        if bases != (Record,):
            raise TypeError(f"{name}: a record derives from Record only (as from typing.NamedTuple)")
        annotations = ns.get("__annotations__", {})
        fields = tuple(annotations)
        defaults = []
        for field in fields:
            if field.startswith("_"):
                raise ValueError(f"{name}: field names cannot start with an underscore: {field!r}")
            if field in ns:
                defaults.append(ns[field])
            elif defaults:
                raise TypeError(f"{name}: field {field} without a default follows a field with one")
        for key in ns:
            if key in _PROHIBITED:
                raise AttributeError(f"{name}: cannot overwrite namedtuple attribute {key}")
        body = dict(ns)
        body["__slots__"] = ()
        body["__doc__"] = ns.get("__doc__") or f"{name}({', '.join(fields)})"
        body["_fields"] = body["__match_args__"] = fields
        body["_field_defaults"] = dict(zip(fields[len(fields) - len(defaults):], defaults))
        body["__new__"] = _new(name, ns.get("__qualname__", name), fields, tuple(defaults))
        for index, field in enumerate(fields):
            body[field] = _tuplegetter(index, f"Alias for field number {index}")
        return super().__new__(mcls, name, bases, body)


class Record(tuple, metaclass=_RecordMeta):
    """Derive a record from this class as from ``typing.NamedTuple``: fields are the
    annotated names in order, a value after a name is its default. Its methods are
    namedtuple's."""

    __slots__ = ()
    _fields: tuple = ()
    _field_defaults: dict = {}

    @classmethod
    def _make(cls, iterable):
        """Make a new record from a sequence or iterable."""
        result = tuple.__new__(cls, iterable)
        if len(result) != len(cls._fields):
            raise TypeError(f"Expected {len(cls._fields)} arguments, got {len(result)}")
        return result

    def _replace(self, /, **kwds):
        """Return a new record replacing the fields named with new values."""
        result = self._make(map(kwds.pop, self._fields, self))
        if kwds:
            raise ValueError(f"Got unexpected field names: {list(kwds)!r}")
        return result

    def __repr__(self):
        """Return a nicely formatted representation string."""
        return f"{self.__class__.__name__}({', '.join(f'{n}={v!r}' for n, v in zip(self._fields, self))})"

    def _asdict(self):
        """Return a new dict which maps field names to their values."""
        return dict(zip(self._fields, self))

    def __getnewargs__(self):
        """Return self as a plain tuple. Used by copy and pickle."""
        return tuple(self)
