"""``python -m cpulaunch`` and the ``cpulaunch`` console script.

Ctrl-C while the interpreter is still importing the CLI exits with 130 and no traceback,
like a Ctrl-C anywhere else in cpulaunch.
"""

import sys


def main() -> None:
    """Entry point: import the CLI, run it, exit with its code."""
    try:
        from cpulaunch.cli import main as cli_main
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(cli_main())


if __name__ == "__main__":
    main()
