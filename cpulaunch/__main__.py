"""``python -m cpulaunch`` and the ``cpulaunch`` console script.

Ctrl-C while the interpreter is still importing the CLI exits with 130 and no traceback,
like a Ctrl-C anywhere else in cpulaunch.
"""

import gc
import sys


def main() -> None:
    """Entry point: import the command line, run it, exit with its code (a plain run
    reads its words without click: :func:`cpulaunch.cmdline.main`).

    The cyclic garbage collector is off while the command line's modules are imported
    (they only add objects that live as long as the process, and the collections their
    allocations set off found nothing to free); those objects then go to the permanent
    generation (:func:`gc.freeze`) and the collector is on again for the run, so a
    supervisor's collections never walk them. Measured here: 3 ms of every run (issue 40,
    ``scripts/bench_startup.py``).

    Before exiting, every object still alive is moved to the garbage collector's permanent
    generation (:func:`gc.freeze`), so the interpreter's last full collection at exit does
    not walk click's, typing's and the topology's objects only to find nothing to free.
    Measured here: 8-9 ms of every ``--dry-run``/``--print-env`` run (issue 12,
    docs/dev/measurements.md). Objects are still freed by reference counting as modules are
    cleared, atexit handlers run and the standard streams are flushed as usual; an exec'd
    launch never gets here (the program replaced this process).
    """
    gc.disable()
    try:
        from cpulaunch.cmdline import main as cli_main
    except KeyboardInterrupt:
        sys.exit(130)
    gc.freeze()
    gc.enable()
    code = cli_main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    main()
