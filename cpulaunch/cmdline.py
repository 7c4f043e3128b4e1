"""The command line without click: where the program starts, which subcommand runs, the
exit code of a failure and how the process ends.

:mod:`cpulaunch.cli` (click) builds on it. Nothing here imports click: a plain run needs
none of it (issue 40).
"""

from __future__ import annotations

import os
import sys
from typing import NamedTuple

from cpulaunch import option_table as table


class Subcommand(NamedTuple):
    """One subcommand: its word, the module whose ``main(words) -> int`` runs it (imported
    only when it is asked for), and its one-line summary for ``cpulaunch --help``."""

    name: str
    module: str
    summary: str


#: The subcommands (pip's command registry), dispatched on the first word (after global
#: options such as ``-v``) to their module's ``main`` (a program of that name: ``cpulaunch
#: -- doctor``).
REGISTRY: dict[str, Subcommand] = {c.name: c for c in (
    Subcommand("doctor", "cpulaunch.tools.doctor", "Check this machine before trusting a run: libraries, binding, "
               "limits, with a fix for each finding."),
    Subcommand("verify", "cpulaunch.tools.verify", "Show what running processes really got: CPUs, memory, threads, "
               "libraries."),
    Subcommand("tune", "cpulaunch.tools.tune", "Find the best options for one program on this machine, by "
               "measurement; saves best.toml for --config."),
    Subcommand("completion", "cpulaunch.tools.completion", "Print the shell completion script for bash, zsh or fish."),
)}
SUBCOMMANDS = tuple(REGISTRY)
#: Options every subcommand also takes, before or after its name.
GLOBAL_OPTIONS = ("-v", "-vv", "-vvv", "--verbose", "-q", "--quiet")
#: Options with a value that may come before a subcommand's name and are handed to it
#: (``cpulaunch -v --sysroot DUMP doctor`` = ``cpulaunch doctor -v --sysroot DUMP``).
BEFORE_SUBCOMMAND = ("--sysroot",)


def split_argv(args: list[str], value_opts: set[str]) -> tuple[list[str], list[str], dict]:
    """Split the words after ``cpulaunch`` into (cpulaunch's words, the program's words,
    what the user typed).

    ``["--ninstances", "2", "python", "x.py", "--ninstances"]`` -> ``(["--ninstances",
    "2"], ["python", "x.py", "--ninstances"], {"ninstances": ("--ninstances", "2")})``. A
    bare option whose value is optional becomes ``--opt=VALUE`` (its ``bare`` value);
    the third item maps each option's python name to (its spelling as typed, its value
    as typed or None), for messages. Unknown options stay on our side so click names them
    (with a hint).
    """
    ours, typed, i = [], {}, 0
    while i < len(args):
        tok = args[i]
        if tok == "--":
            return ours, args[i + 1:], typed
        name = tok.split("=", 1)[0]
        if name in table.PROGRAM_WORDS or (tok[:2] in ("-m", "-c") and not tok.startswith("--")):
            return ours, args[i:], typed
        if not tok.startswith("-") or tok == "-":
            return ours, args[i:], typed
        dest = table.BY_SPELLING.get(name)
        option = table.BY_DEST.get(dest)
        if option is not None and option.bare is not None and "=" not in tok:
            nxt = args[i + 1] if i + 1 < len(args) else ""
            takes = nxt.isdigit() if option.words == ("digits",) else nxt in option.words
            if takes:
                ours += [tok, nxt]
                typed[dest] = (tok, nxt)
                i += 2
            else:
                ours.append(f"{name}={option.bare}")
                typed[dest] = (tok, None)
                i += 1
            continue
        ours.append(tok)
        if dest is not None:
            typed[dest] = (name, tok.split("=", 1)[1] if "=" in tok else None)
        if name in value_opts and "=" not in tok and i + 1 < len(args):
            ours.append(args[i + 1])
            if dest is not None:
                typed[dest] = (name, args[i + 1])
            i += 1
        i += 1
    return ours, [], typed


def _verify_run(*args) -> None:
    """``--verify``'s check (:func:`cpulaunch.tools.verify.check_run`), the tool imported only
    when a run asks for it."""
    from cpulaunch.tools import verify

    verify.check_run(*args)


def _configure_logging(verbose: int, now: bool = False, quiet: bool = False) -> None:
    """The command line's logging: ``cpulaunch: MESSAGE`` on stderr at WARNING (INFO with
    -v, DEBUG with -vv, ERROR with -q); logging itself is imported at the first message
    (cpulaunch.log)."""
    from cpulaunch import log

    log.configure(verbose, _basic_config, now=now, quiet=quiet)


def _basic_config(level: int) -> None:
    import logging

    logging.basicConfig(level=level, format="cpulaunch: %(message)s", stream=sys.stderr)


def _one_line(text: str) -> str:
    from cpulaunch.forms import one_line

    return one_line(" ".join(str(text).split("\n")).strip())


def _fail(message: str, code: int) -> int:
    try:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return code


def _verbosity(args: list[str]) -> int:
    """The ``-v`` count among cpulaunch's own words (before the program or ``--``)."""
    count = 0
    for a in args[: (args.index("--") if "--" in args else len(args))]:
        if a == "--verbose":
            count += 1
        elif a.startswith("-v") and set(a[1:]) == {"v"}:
            count += len(a) - 1
    return count


def _quiet(args: list[str]) -> bool:
    """``-q``/``--quiet`` among cpulaunch's own words (before the program or ``--``)."""
    return any(a in ("-q", "--quiet") for a in args[: (args.index("--") if "--" in args else len(args))])


def _subcommand(args: list[str]) -> tuple[str, list[str], int] | None:
    """(tool, its words, -v count) when ``args`` name a subcommand after global options
    (``-v doctor``, ``doctor -v``), else None. tune takes ``-v`` itself (its program's
    words follow its own), so the global ones are handed to it."""
    i, handed = 0, []
    while i < len(args):
        if args[i] in GLOBAL_OPTIONS:
            i += 1
        elif args[i] in BEFORE_SUBCOMMAND and i + 1 < len(args):
            handed += args[i:i + 2]
            i += 2
        elif args[i].split("=", 1)[0] in BEFORE_SUBCOMMAND:
            handed.append(args[i])
            i += 1
        else:
            break
    if i == len(args) or args[i] not in SUBCOMMANDS:
        return None
    tool, rest, before = args[i], args[i + 1:], _verbosity(args[:i])
    if tool == "tune":
        return tool, (["-" + "v" * before] if before else []) + handed + rest, before + _verbosity(rest)
    end = rest.index("--") if "--" in rest else len(rest)
    mine = [a for a in rest[:end] if a in GLOBAL_OPTIONS]
    return tool, handed + [a for a in rest[:end] if a not in GLOBAL_OPTIONS] + rest[end:], \
        before + _verbosity(mine)


def _evaluated_print_env(args: list[str]) -> bool:
    """``--print-env`` was asked for in a form a shell evaluates (shell, dotenv, vllm,
    sglang): then a failure prints text whose evaluation fails too (``eval "$(cpulaunch
    --print-env ...)"`` must not return 0 and run the program unbound)."""
    ours, _, typed = split_argv(list(args), table.VALUE_SPELLINGS)
    asked = "print_env" in typed or os.environ.get(table.BY_DEST["print_env"].variable, "").strip().lower() \
        in table.TRUE_WORDS
    fmt = ((typed.get("fmt") or (None, None))[1] or os.environ.get(table.BY_DEST["fmt"].variable)
           or table.DEFAULT_FORMAT[table.Output.PRINT_ENV].value)
    return asked and fmt.strip().lower() not in ("json", "omp-bind")


def _eval_fails() -> str:
    from cpulaunch.forms import EVAL_FAILS

    return EVAL_FAILS


def _write_stdout(text: str) -> None:
    try:
        sys.stdout.write(text)
    except (OSError, ValueError):
        pass


def _quiet_exit(code: int) -> None:
    """Flush stdout, ignoring a reader that went away (no "Exception ignored" message)."""
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
