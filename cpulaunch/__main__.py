"""``python -m cpulaunch`` and the installed ``cpulaunch`` command (scripts/cpulaunch).

Ctrl-C while the interpreter is still importing the CLI exits with 130 and no traceback,
like a Ctrl-C anywhere else in cpulaunch.
"""

import gc
import sys

#: Allocations (less deallocations) of container objects before the garbage collector's
#: young generation is collected, from the command's start (:func:`main`).
YOUNG_OBJECTS = 10_000


def main() -> None:
    """Entry point: import the command line, run it, exit with its code (a plain run
    reads its words without click: :func:`cpulaunch.cmdline.main`).

    First the garbage collector's young generation is let grow to :data:`YOUNG_OBJECTS`
    objects before a collection (Python's default: 700). Start-up allocates some 5,000
    objects that live until exit or die by reference counting (modules, records, the
    plan), which at 700 cost a plain dry run 7 collections, 1.8 ms here, for nothing
    (issue 40, docs/dev/measurements.md); at 10,000 it makes none. Cycles are still
    collected, every 10,000 allocations, in a supervisor or a tool that runs for days.

    Before exiting, every object still alive is moved to the garbage collector's permanent
    generation (:func:`gc.freeze`), so the interpreter's last full collection at exit does
    not walk click's, typing's and the topology's objects only to find nothing to free.
    Measured here: 8-9 ms of every ``--dry-run``/``--print-env`` run (issue 12,
    docs/dev/measurements.md). Objects are still freed by reference counting as modules are
    cleared, atexit handlers run and the standard streams are flushed as usual; an exec'd
    launch never gets here (the program replaced this process).
    """
    gc.set_threshold(YOUNG_OBJECTS, *gc.get_threshold()[1:])
    try:
        from cpulaunch.cmdline import main as cli_main
    except KeyboardInterrupt:
        sys.exit(130)
    code = cli_main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    main()
