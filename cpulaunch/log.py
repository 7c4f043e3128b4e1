"""Loggers for the launch path that import :mod:`logging` only when they must.

Importing :mod:`logging` costs every run that does it 4-25 ms (it pulls in re, enum,
traceback, threading, string, textwrap...: 4 ms on one machine, 20-25 ms on a 2-vCPU AMD
EPYC, ``python -c "import logging"`` against ``python -c pass``; issue 40,
docs/dev/measurements.md), as much as the rest of cpulaunch's start-up, and a plain
``cpulaunch PROGRAM`` prints at most one note. :func:`get` returns a stand-in with the
methods the launch path uses.

:func:`configure` is called by the command line only (``cpulaunch.cmdline``, the one module
that sets up logging): it records the level and the set-up function (which calls
``logging.basicConfig`` with ``cpulaunch: %(message)s`` on stderr). While :mod:`logging` is
not imported, a message that passes the level is written by :func:`_write` in that same
form (``cpulaunch: `` + ``msg % args`` + newline on ``sys.stderr``, flushed), which is what
the set-up handler would print: the command line's notes and ``-v`` lines cost no import.
Once anything has imported :mod:`logging` (a subcommand, pytest, a library in the same
process), the set-up runs and every later message goes through ``logging.getLogger(name)``,
so handlers, levels and pytest's ``caplog`` see the records. ``tests/test_log.py`` holds the
two ways to the same bytes.

Library use (``cpulaunch.plan_instances``) never calls :func:`configure`: every message then
goes to :mod:`logging` and cpulaunch adds no handler, so the application's logging
configuration decides, as the logging HOWTO asks of libraries.
"""

from __future__ import annotations

import sys
from _thread import allocate_lock

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
#: What the command line's handler prints before each message (cmdline's format).
PREFIX = "cpulaunch: "
#: One message's line at a time from the supervisor's threads (logging's handler lock).
_lock = allocate_lock()


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


def _direct() -> bool:
    """Whether a message is written by :func:`_write`: the command line configured the
    level and nothing has imported :mod:`logging` yet (its set-up has not run)."""
    return _pending is not None and _cli_level is not None and "logging" not in sys.modules


def _write(msg, args: tuple) -> bool:
    """Write one message as the command line's handler would: ``PREFIX + msg % args`` and a
    newline on ``sys.stderr``, flushed. The message is made as ``LogRecord.getMessage`` makes
    it (``str(msg)``, then ``%`` with the arguments, or with the one dict given alone).

    Returns False, having written nothing, when the message cannot be formatted: the
    caller then hands it to :mod:`logging`, which reports the fault in its own way ("---
    Logging error ---"). A stream that is gone or closed (``OSError``, ``ValueError``) loses
    the line silently: logging's handler would report the failure on that same stream.
    """
    try:
        text = str(msg)
        if args:
            if len(args) == 1 and isinstance(args[0], dict) and args[0]:
                args = args[0]
            text = text % args
    except Exception:
        return False
    stream = sys.stderr
    if stream is None:
        return True
    with _lock:
        try:
            stream.write(PREFIX + text + "\n")
            stream.flush()
        except (OSError, ValueError):
            pass
    return True


class LazyLogger:
    """A stand-in for ``logging.getLogger(name)``; see the module docstring."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def _emit(self, level: int, msg, args, kwargs) -> None:
        if _cli_level is not None and level < _cli_level:
            return  # below the command line's level: no need to import logging
        if not kwargs and _direct() and _write(msg, args):
            return
        kwargs.setdefault("stacklevel", 3)  # the record names our caller, not this module
        _setup().getLogger(self.name).log(level, msg, *args, **kwargs)

    def isEnabledFor(self, level: int) -> bool:
        """Whether a message at ``level`` would be emitted (the exec path's -v line is
        built only then); imports logging only when the command line did not set the level."""
        if _cli_level is not None and level < _cli_level:
            return False
        if _direct():
            return True
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
