"""The exception hierarchy: one base for mistakes a user can fix, one for our own faults.

``cli.py`` is the only place that maps them to exit codes (pip's ``base_command.py`` /
``status_codes.py`` shape): :class:`CpulaunchError` -> one line on stderr, exit code 2;
:class:`InternalError` (and any other exception) -> "internal error" with exit code
:data:`INTERNAL_EXIT`, the traceback shown with ``-v``. This module imports nothing.
"""

from __future__ import annotations

__all__ = ["CpulaunchError", "DistributedError", "InternalError", "USAGE_EXIT", "INTERNAL_EXIT", "printable"]

#: Exit code for a mistake the user can fix (bad option, bad sysfs file, missing program).
USAGE_EXIT = 2
#: Exit code for a fault of cpulaunch's own (sysexits.h EX_SOFTWARE).
INTERNAL_EXIT = 70


class CpulaunchError(Exception):
    """A mistake the user can fix. ``str(exc)`` is one line: what was wrong, what was
    given, and how to fix it. Printed as ``cpulaunch: error: <message>``, exit code 2."""


class DistributedError(CpulaunchError, ValueError):
    """An engine's variables are incomplete or inconsistent, or a distributed option
    cannot be met; the message says how to fix it."""


class InternalError(Exception):
    """A fault of cpulaunch's own (e.g. a plan that fails its own validation); reported
    as ours, never as the user's, with exit code :data:`INTERNAL_EXIT`."""


def printable(text: str) -> str:
    """``text`` unchanged if printable, else with control/non-UTF-8 characters escaped
    (``'/x/\\udcff\\n'`` -> ``'/x/\\\\udcff\\\\n'``): messages stay one safe line, and text
    taken from a file or a process never reaches a terminal as control bytes."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")
