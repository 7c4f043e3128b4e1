"""``python -m cpulaunch``: the same as the ``cpulaunch`` console script."""

from cpulaunch.cli import main

if __name__ == "__main__":
    main()
