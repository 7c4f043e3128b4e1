"""Loggers for the launch path that import :mod:`logging` only when a message is emitted.

Importing :mod:`logging` costs about 4 ms (it pulls in traceback, string, textwrap...), a
tenth of what cpulaunch may add to a run's start-up (issue 12), and a plain ``cpulaunch
PROGRAM`` usually logs nothing. :func:`get` returns a stand-in with the three methods the
launch path uses; the first message imports :mod:`logging` and hands every call to the
real ``logging.getLogger(name)``, so handlers, levels and pytest's ``caplog`` see the same
records as with a plain logger.

:func:`configure` is called by :mod:`cpulaunch.cli` only (the one module that sets up
logging): it records the command line's level and cli's set-up function (which installs
cli's handler on the root logger), and that function runs when the first message at or above the
level is emitted. Library use (``cpulaunch.plan_instances``) never
calls it, so cpulaunch then adds no handler: the application's logging configuration
decides, as the logging HOWTO asks of libraries.
"""

from __future__ import annotations

import sys
from cpulaunch.records import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Callable, Optional

__all__ = ["get", "configure", "DEBUG", "INFO", "WARNING", "ERROR"]

# logging's numeric levels (logging/__init__.py), without importing it.
DEBUG, INFO, WARNING, ERROR = 10, 20, 30, 40

#: The level chosen by the command line, or None when cli.py did not configure logging.
_cli_level: Optional[int] = None
#: cli.py's set-up, called once with the level before the first message; None once done.
_pending: Optional[Callable[[int], None]] = None


def configure(verbose: int, setup: Callable[[int], None], *, now: bool = False, quiet: bool = False) -> None:
    """Record the command line's level (WARNING, INFO with ``-v``, DEBUG with ``-vv``,
    ERROR with ``-q``) and the function that sets logging up for it.

    Args:
        verbose: how many ``-v`` were given (0 or more).
        quiet: ``-q``: errors only (it wins over ``-v``).
        setup: called with the level (logging's number) before the first message that
            passes it; cli.py's, which calls ``logging.basicConfig``.
        now: call ``setup`` at once (subcommands, which log through :mod:`logging`); it is
            also called at once when :mod:`logging` is already imported.
    """
    global _cli_level, _pending
    _cli_level = ERROR if quiet else max(DEBUG, WARNING - 10 * max(0, int(verbose)))
    _pending = setup
    if now or "logging" in sys.modules:
        _setup()


def _setup():
    """The logging module, after cli.py's set-up has run (when it asked for one)."""
    global _pending
    import logging

    if _pending is not None and _cli_level is not None:
        setup, _pending = _pending, None
        setup(_cli_level)
    return logging


class LazyLogger:
    """A stand-in for ``logging.getLogger(name)``; see the module docstring."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def _emit(self, level: int, msg, args, kwargs) -> None:
        if _cli_level is not None and level < _cli_level:
            return  # below the command line's level: no need to import logging
        kwargs.setdefault("stacklevel", 3)  # the record names our caller, not this module
        _setup().getLogger(self.name).log(level, msg, *args, **kwargs)

    def isEnabledFor(self, level: int) -> bool:
        """Whether a message at ``level`` would be emitted (the exec path's -v line is
        built only then); imports logging only when the command line's level lets it pass."""
        if _cli_level is not None and level < _cli_level:
            return False
        return _setup().getLogger(self.name).isEnabledFor(level)

    def info(self, msg, *args, **kwargs) -> None:
        self._emit(INFO, msg, args, kwargs)

    def warning(self, msg, *args, **kwargs) -> None:
        self._emit(WARNING, msg, args, kwargs)

    def error(self, msg, *args, **kwargs) -> None:
        self._emit(ERROR, msg, args, kwargs)


def get(name: str) -> LazyLogger:
    """A logger named ``name`` (``"cpulaunch.machine.probe"``...) that imports logging lazily."""
    return LazyLogger(name)
