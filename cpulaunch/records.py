"""The base of cpulaunch's records: ``class Kind(Record)`` with annotated fields and
defaults makes the same class ``class Kind(typing.NamedTuple)`` makes (a
:func:`collections.namedtuple` with the class's docstring, methods and properties), without
importing :mod:`typing` or checking each annotation.

Why: the run path builds about 45 such classes, and ``typing.NamedTuple`` turns every
annotation into a ``ForwardRef`` (compiling its text) and imports ``typing`` itself; with
the run path's ``typing`` imports moved under ``TYPE_CHECKING`` that was about 10 ms of
every run (issue 40; ``scripts/bench_startup.py``, docs/dev/measurements.md). The fields,
their order and defaults, ``_fields``, ``_field_defaults``, ``_replace``, ``_asdict``,
equality, hashing and pickling are namedtuple's, as with ``typing.NamedTuple``
(``tests/test_records.py`` holds the two alike).

``TYPE_CHECKING`` is False at run time, as :data:`typing.TYPE_CHECKING` is: a run-path
module imports its annotations' names under ``if TYPE_CHECKING:`` from :mod:`typing`, so
that type checkers and the docs' reader see them and a run never imports ``typing``.
"""

import collections

__all__ = ["Record", "TYPE_CHECKING"]

TYPE_CHECKING = False

#: Names a record class may not define (namedtuple's own, as typing.NamedTuple forbids them).
_PROHIBITED = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields", "_field_defaults",
                         "_make", "_replace", "_asdict", "_source"})
#: Names of the class body that are not copied onto the namedtuple (it has its own).
_OWN = frozenset({"__module__", "__annotations__", "__doc__", "_is_record_base"})


class _RecordMeta(type):
    """Makes each ``class X(Record)`` a namedtuple subclass of tuple, the way
    ``typing.NamedTupleMeta`` does (Python 3.11's ``typing.py``), minus the type checks."""

    def __new__(mcls, name, bases, ns):
        if ns.get("_is_record_base"):
            return super().__new__(mcls, name, bases, ns)
        if bases != (Record,):
            raise TypeError(f"{name}: a record derives from Record only (as from typing.NamedTuple)")
        fields = list(ns.get("__annotations__", {}))
        defaults = []
        for field in fields:
            if field in ns:
                defaults.append(ns[field])
            elif defaults:
                raise TypeError(f"{name}: field {field} without a default follows a field with one")
        record = collections.namedtuple(name, fields, defaults=defaults, module=ns["__module__"])
        record.__annotations__ = dict(ns.get("__annotations__", {}))
        if ns.get("__doc__"):
            record.__doc__ = ns["__doc__"]
        for key, value in ns.items():
            if key in _PROHIBITED:
                raise AttributeError(f"{name}: cannot overwrite namedtuple attribute {key}")
            if key not in _OWN and key not in fields:
                setattr(record, key, value)
        return record


class Record(metaclass=_RecordMeta):
    """Derive a record from this class as from ``typing.NamedTuple``: fields are the
    annotated names in order, a value after a name is its default."""

    _is_record_base = True
