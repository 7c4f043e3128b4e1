"""How the user said each option (ground floor): :class:`Spelling`, one option as given, and
:class:`Spellings`, every option given, by python name or request field. The option surface
(:mod:`cpulaunch.cli`, :mod:`cpulaunch.options`, :mod:`cpulaunch.api`) records them while it
reads the command line, the ``CPULAUNCH_*`` variables, a config file or the API's keywords;
the requests (:class:`cpulaunch.plan.Request`, :class:`cpulaunch.options.DdpOptions`) carry
them, so that the planner's messages name an option as the user gave it without knowing the
option table. Data only: importing this module does nothing.
"""

from __future__ import annotations

from types import MappingProxyType
from cpulaunch.records import TYPE_CHECKING, Record

if TYPE_CHECKING:
    from typing import Any, Iterable, Mapping, Optional

__all__ = ["Spelling", "Spellings"]


class Spelling(Record):
    """How the user gave one option, for messages.

    Attributes:
        source: "flag", "env", "config" or "api" (:data:`cpulaunch.option_table.SOURCES`);
            "derived" for a value the launcher worked out from another option (a DDP rank
            count from ``--nproc-per-node``).
        name: the option as a message names it: the spelling typed (``--nproc_per_node``),
            the variable (``CPULAUNCH_NINSTANCES``), the key and file (``ninstances in
            --config best.toml``) or the keyword (``ninstances``).
        said: the option with its value as given: ``--nproc_per_node 4``,
            ``CPULAUNCH_NINSTANCES=x``, ``ninstances = "x" in --config best.toml``,
            ``ninstances=5``; a flag without a value as typed (``--ddp``).
    """

    source: str
    name: str
    said: str


class Spellings:
    """How the user gave each option: python name (or request field) -> :class:`Spelling`;
    frozen. An option not in it was not given: it is named by its long name (:meth:`long_name`,
    ``ninstances`` -> ``--ninstances``), as a default would be.

    ``Spellings({"ninstances": Spelling("flag", "--nproc-per-node", "--nproc-per-node 4")})``
    says a request's ``ninstances`` came from ``--nproc-per-node 4``.
    """

    __slots__ = ("_spelled",)

    def __init__(self, spelled: Optional[Mapping[str, Spelling]] = None) -> None:
        self._spelled = MappingProxyType(dict(spelled or {}))

    def __contains__(self, dest: str) -> bool:
        return dest in self._spelled

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and dict(self._spelled) == dict(other._spelled)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._spelled.items())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self._spelled)!r})"

    def get(self, dest: str) -> Optional[Spelling]:
        """The spelling of ``dest``, None: not given."""
        return self._spelled.get(dest)

    def source(self, dest: str) -> Optional[str]:
        """Where the option came from ("flag", "env", "config", "api"), None: not given."""
        s = self._spelled.get(dest)
        return s.source if s else None

    def long_name(self, dest: str) -> str:
        """The long name of an option not given: ``"ninstances"`` -> ``"--ninstances"`` (the
        option surface's :class:`cpulaunch.options.Words` takes the table's)."""
        return "--" + dest.replace("_", "-")

    def name(self, dest: str) -> str:
        """The option as the user named it (``--nproc_per_node``, ``CPULAUNCH_X``), else its
        long name."""
        s = self._spelled.get(dest)
        return s.name if s else self.long_name(dest)

    def said(self, dest: str, value: Any = None) -> str:
        """The option with its value as the user gave it; ``value`` (text) is shown for an
        option the user did not give (a default, or a value derived from another): its long
        name alone for None or True."""
        s = self._spelled.get(dest)
        if s is not None:
            return s.said
        if value is None or value is True:
            return self.long_name(dest)
        return f"{self.long_name(dest)} {value}"

    def given_as(self, dest: str, spelling: Spelling) -> "Spellings":
        """These spellings with ``dest`` given as ``spelling``."""
        return type(self)({**self._spelled, dest: spelling})

    def only(self, dests: Iterable[str]) -> "Spellings":
        """The spellings of the given options among ``dests``, as plain :class:`Spellings`
        (what a request carries)."""
        wanted = set(dests)
        return Spellings({d: s for d, s in self._spelled.items() if d in wanted})
