"""The base of cpulaunch's enums: ``class BindMode(str, Enum)`` and ``class Level(IntEnum)``
behave as the classes :mod:`enum` makes of the same bodies on Python 3.11 (members that are
``str`` or ``int`` instances with a ``name`` and a ``value``, looked up by value and by name,
iterated in order, compared and hashed as their values), without importing :mod:`enum`.

Why: :mod:`enum` costs every run about 3 ms to import here (it brings functools and
collections), and each class it builds another 0.1-0.2 ms; the run path has seven enums and
no other use for the module since it stopped importing :mod:`re` (issue 40;
docs/dev/measurements.md). ``tests/test_enums.py`` holds these classes to :mod:`enum`'s on
the same bodies.

What is kept of :mod:`enum` (Python 3.11's behaviour, whatever the interpreter):

- members are the class body's public names whose value has the mixed-in type (``str`` or
  ``int``); a later name with an earlier member's value is an alias of it;
- ``Cls(value)`` and ``Cls(member)`` give the member, else ``ValueError("'x' is not a valid
  Cls")``; ``Cls["NAME"]`` by name, else ``KeyError``; ``iter``, ``reversed``, ``len``,
  ``Cls.__members__`` (aliases included), ``in`` (a member, or a value, as 3.12 answers);
- ``repr``: ``<BindMode.NUMACTL: 'numactl'>``; ``str`` and ``format``: ``BindMode.NUMACTL``
  for a ``str`` mixin (3.11's rule: format follows str), the number for :class:`IntEnum`;
- copy, deepcopy and pickle give the member itself; members cannot be reassigned, an enum
  with members cannot be subclassed.

Not kept: ``auto()``, ``Flag``, ``_missing_``, ``_generate_next_value_``; members named
``_like_this`` and values of another type (:mod:`enum` makes ``_x = "a"`` a member and a
``str`` enum's ``X = 3`` the member ``"3"``; here both stay plain class attributes). No enum
of cpulaunch's has any of them.
"""

__all__ = ["Enum", "IntEnum", "EnumType"]

#: Methods every enum with members takes from its base here, over its mixed-in type's (as
#: :class:`enum.EnumType` does): without it ``str``'s repr would win in the MRO.
_OWN = ("__repr__", "__str__", "__format__", "__reduce_ex__", "__copy__", "__deepcopy__")


class EnumType(type):
    """Makes the public ``str``/``int`` names of each ``class X(str, Enum)`` body its
    members (instances of ``X``). Raises TypeError for a subclass of an enum with members."""

    def __new__(mcls, name, bases, ns):
        for base in bases:
            if isinstance(base, EnumType) and base._member_map_:
                raise TypeError(f"<enum {name!r}> cannot extend {base!r}")
        cls = super().__new__(mcls, name, bases, ns)
        mixin = next((b for b in cls.__mro__ if b in (str, int)), None)
        members, by_value, order = {}, {}, []
        if mixin is not None:
            for attr in _OWN:
                if attr not in ns:
                    own = "_int" + attr if mixin is int and attr in ("__str__", "__format__") else attr
                    type.__setattr__(cls, attr, getattr(_Base, own))
            for key, value in ns.items():
                if key[:1] == "_" or type(value) is not mixin:
                    continue
                member = by_value.get(value)
                if member is None:
                    member = mixin.__new__(cls, value)
                    member._name_, member._value_ = key, value
                    by_value[value] = member
                    order.append(member)
                members[key] = member
                type.__setattr__(cls, key, member)
        type.__setattr__(cls, "_member_map_", members)
        type.__setattr__(cls, "_value2member_map_", by_value)
        type.__setattr__(cls, "_member_names_", [m._name_ for m in order])
        type.__setattr__(cls, "_members_", tuple(order))
        return cls

    def __call__(cls, value):
        try:
            return cls._value2member_map_[value]
        except (KeyError, TypeError):
            raise ValueError(f"{value!r} is not a valid {cls.__qualname__}") from None

    def __getitem__(cls, name):
        return cls._member_map_[name]

    def __iter__(cls):
        return iter(cls._members_)

    def __reversed__(cls):
        return reversed(cls._members_)

    def __len__(cls):
        return len(cls._members_)

    def __contains__(cls, value):
        if isinstance(value, cls):
            return True
        try:
            return value in cls._value2member_map_
        except TypeError:
            return False

    @property
    def __members__(cls):
        """{name: member}, aliases included, in definition order (read-only)."""
        return type(type.__dict__)(cls._member_map_)

    def __repr__(cls):
        return f"<enum {cls.__name__!r}>"

    def __setattr__(cls, name, value):
        if name in cls.__dict__.get("_member_map_", ()):
            raise AttributeError(f"cannot reassign member {name!r}")
        type.__setattr__(cls, name, value)

    def __delattr__(cls, name):
        if name in cls.__dict__.get("_member_map_", ()):
            raise AttributeError(f"cannot delete member {name!r}")
        type.__delattr__(cls, name)


class _Base:
    """The methods an enum's class takes over its mixed-in type's (see :data:`_OWN`)."""

    def __repr__(self):
        return f"<{type(self).__name__}.{self._name_}: {self._value_!r}>"

    def __str__(self):
        return f"{type(self).__name__}.{self._name_}"

    def __format__(self, spec):
        return format(str(self), spec)

    def _int__str__(self):
        return int.__repr__(self)

    def _int__format__(self, spec):
        return int.__format__(self, spec)

    def __reduce_ex__(self, protocol):
        return type(self), (self._value_,)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


class Enum(metaclass=EnumType):
    """Derive an enum from ``(str, Enum)`` as from ``(str, enum.Enum)``: each public name
    with a ``str`` value is a member."""

    __slots__ = ()

    @property
    def name(self) -> str:
        """The member's name in the class body ("NUMACTL")."""
        return self._name_

    @property
    def value(self):
        """The member's value ("numactl"), a plain ``str`` or ``int``."""
        return self._value_


class IntEnum(int, Enum):
    """Derive an enum from this class as from :class:`enum.IntEnum`: members are ints;
    ``str`` and ``format`` give the number."""

    __slots__ = ()
