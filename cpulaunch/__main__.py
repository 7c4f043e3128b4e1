"""``python -m cpulaunch`` and the ``cpulaunch`` console script.

Ctrl-C while the interpreter is still importing the CLI exits with 130 and no traceback,
like a Ctrl-C anywhere else in cpulaunch.
"""

import gc
import sys


def main() -> None:
    """Entry point: import the command line, run it, exit with its code (a plain run
    reads its words without click: :func:`cpulaunch.cmdline.main`).

    Before exiting, every object still alive is moved to the garbage collector's permanent
    generation (:func:`gc.freeze`), so the interpreter's last full collection at exit does
    not walk click's, typing's and the topology's objects only to find nothing to free.
    Measured here: 8-9 ms of every ``--dry-run``/``--print-env`` run (issue 12,
    docs/dev/measurements.md). Objects are still freed by reference counting as modules are
    cleared, atexit handlers run and the standard streams are flushed as usual; an exec'd
    launch never gets here (the program replaced this process).
    """
    try:
        from cpulaunch.cmdline import main as cli_main
    except KeyboardInterrupt:
        sys.exit(130)
    code = cli_main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    main()
