"""Notes with a level: what a run says by default, what only ``-v`` shows, and what is
``doctor``'s advice (issue 40: silent when all is well).

Pure code makes notes (the planner, render, the DDP planner, the settings); each note is
a :class:`Note`, a ``str`` (the dry run, ``--format json`` and tests read it as text)
that carries its :class:`Level` as data. A plain ``str`` note is :attr:`Level.DIFFERS`:
shown, so a note nobody classified is never hidden. The dry run and JSON keep every note
(they are the plan's record); a run prints them through :func:`say`, the one place that
filters them by level:

- ``DIFFERS`` (what differs from what the user asked, or what the user must act on):
  printed, ``note: ...`` on stderr;
- ``EXPLAIN`` (a choice cpulaunch made on its own: the port, the backend when none was
  asked, the exit hook, the recipe): under ``-v`` only;
- ``ADVICE`` (the machine lacks a component ``cpulaunch doctor`` would install: numactl,
  tcmalloc): one line for all of them in a run, each in full under ``-v``.

``-q`` sets the command line's level above warnings, so a run then prints none.
"""

from __future__ import annotations

from cpulaunch.enums import IntEnum
from cpulaunch.records import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Iterable

__all__ = ["Level", "Note", "explain", "advice", "level_of", "retext", "advice_line", "say"]


class Level(IntEnum):
    """How much a note matters to a run (ordered: a higher one is shown more readily)."""

    EXPLAIN = 20  #: a choice cpulaunch made on its own, explained (shown with -v)
    ADVICE = 25  #: the machine lacks something doctor would install (one line per run)
    DIFFERS = 30  #: differs from what the user asked, or the user must act (always shown)


class Note(str):
    """A note's text with its level (and, for advice, what is missing and what it costs).

    ``Note("MASTER_PORT=29500: ...", Level.EXPLAIN) == "MASTER_PORT=29500: ..."``: it
    compares, hashes, prints and serialises as its text.

    Attributes:
        level: its :class:`Level`.
        topic: for ``ADVICE``: the missing component, e.g. "numactl".
        effect: for ``ADVICE``: what the run does without it, a few words ("memory not
            bound").
    """

    level: Level
    topic: str
    effect: str

    def __new__(cls, text: str, level: Level = Level.DIFFERS, topic: str = "", effect: str = "") -> "Note":
        self = super().__new__(cls, text)
        self.level, self.topic, self.effect = Level(level), topic, effect
        return self

    def __reduce__(self):
        return (Note, (str(self), self.level, self.topic, self.effect))


def explain(text: str) -> Note:
    """A note explaining a choice cpulaunch made on its own (shown with ``-v``)."""
    return Note(text, Level.EXPLAIN)


def advice(text: str, topic: str, effect: str) -> Note:
    """Environment advice: ``topic`` (e.g. "tcmalloc") is missing here, so the run does
    ``effect`` ("the C library's malloc"); ``text`` is the full note (``-v``, dry run)."""
    return Note(text, Level.ADVICE, topic, effect)


def level_of(note: str) -> Level:
    """A note's level; a plain ``str`` is :attr:`Level.DIFFERS`."""
    return getattr(note, "level", Level.DIFFERS)


def retext(note: str, text: str) -> str:
    """``text`` with ``note``'s level (a note rewritten, e.g. onto one line, keeps it)."""
    if isinstance(note, Note):
        return Note(text, note.level, note.topic, note.effect)
    return text


def advice_line(notes: Iterable[str]) -> str | None:
    """The one line that stands for every ``ADVICE`` note of a run, or None:
    ``"numactl, tcmalloc not found here: memory not bound, the C library's malloc
    (`cpulaunch doctor` says how to install them; -v for details)"``."""
    topics: list[str] = []
    effects: list[str] = []
    for n in notes:
        if level_of(n) is Level.ADVICE:
            if n.topic not in topics:
                topics.append(n.topic)
            if n.effect and n.effect not in effects:
                effects.append(n.effect)
    if not topics:
        return None
    them = "it" if len(topics) == 1 else "them"
    return (f"{', '.join(topics)} not found here: {', '.join(effects)} "
            f"(`cpulaunch doctor` says how to install {them}; -v for details)")


def say(notes: Iterable[str], log) -> None:
    """Print a run's notes through ``log`` (a :mod:`cpulaunch.log` logger), the one place
    that filters them: ``DIFFERS`` at WARNING, ``EXPLAIN`` at INFO (``-v``), and the
    ``ADVICE`` notes as one WARNING line (:func:`advice_line`) unless ``-v`` shows each in
    full. ``-q`` (level ERROR) lets none through.
    """
    notes = list(notes)
    verbose = log.isEnabledFor(20)
    for n in notes:
        level = level_of(n)
        if level is Level.DIFFERS:
            log.warning("note: %s", n)
        elif level is Level.EXPLAIN or verbose:
            log.info("note: %s", n)
    line = None if verbose else advice_line(notes)
    if line:
        log.warning("note: %s", line)
