"""The command line without click: a plain run's words read from the option table
(:func:`parse`, held equal to click's reading by ``tests/test_parsers.py``), where the
program starts, which subcommand runs, the one exception-to-exit-code map
(:func:`failure`), logging's set-up and how the process ends.

:func:`main` is the entry point; :mod:`cpulaunch.cli` (click) builds on this module for
``--help``, completion, the subcommands and any word :func:`parse` is not sure of. Nothing
here imports click at module level: a plain run needs none of it (issue 40; the start-up
figures are ``scripts/bench_startup.py``'s).
"""

from __future__ import annotations

import os
import sys

from cpulaunch import option_table as table
from cpulaunch.records import TYPE_CHECKING, Record


class Subcommand(Record):
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

    from cpulaunch import log

    logging.basicConfig(level=level, format=log.PREFIX + "%(message)s", stream=sys.stderr)


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


def failure(exc: BaseException, verbose: int) -> int:
    """The exit code of an exception that ended a command, its line written on stderr: the
    one exception-to-exit-code map. A :class:`~cpulaunch.errors.CpulaunchError` -> one line
    ``cpulaunch: error: ...``, 2; Ctrl-C -> 130; our stdout's reader gone -> 141; anything
    else is ours -> ``cpulaunch: internal error: ...``, 70 (the traceback with ``-v``)."""
    from cpulaunch.errors import INTERNAL_EXIT, USAGE_EXIT, CpulaunchError

    if isinstance(exc, CpulaunchError):
        return _fail(f"cpulaunch: error: {_one_line(exc)}", USAGE_EXIT)
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, BrokenPipeError):
        return 141  # our stdout's reader went away (e.g. `cpulaunch --dry-run | head -1`)
    if verbose:
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__)
    return _fail(f"cpulaunch: internal error: {type(exc).__name__}: {_one_line(exc)} (a bug in "
                 "cpulaunch; run with -v for the traceback and report it)", INTERNAL_EXIT)


def finish(args: list[str], code, sub) -> int:
    """The exit code (None: 0), after what a failed evaluated ``--print-env`` prints and
    stdout's last flush."""
    code = 0 if code is None else int(code)
    if code and sub is None and _evaluated_print_env(args):
        _write_stdout(_eval_fails())
    _quiet_exit(code)
    return code


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


# --------------------------------------------------------------------------- the run, without click


class Parsed(Record):
    """The command line of a run, read: what :func:`cpulaunch.options.from_values` takes.

    Attributes:
        values: every parameter's value by python name, as click's command would hand them
            (defaults included; ``program``: the program's words, a tuple).
        given: the python names set by the user (command line, ``CPULAUNCH_*``, config
            file): the names whose value is not a default.
        spelled: {python name: :class:`cpulaunch.spelling.Spelling`}: how each given one
            was said, for messages.
    """

    values: dict
    given: frozenset
    spelled: dict


class _Unsure(Exception):
    """The words are not ones :func:`parse` reads with certainty: click's parser reads them."""


def _flag_word(raw: str) -> bool:
    """A variable's yes or no (click's words for a bool, any case, spaces around)."""
    word = raw.strip().lower()
    if word in table.TRUE_WORDS:
        return True
    if word in table.FALSE_WORDS:
        return False
    raise _Unsure


def _convert(kind, dest: str, text: str):
    """A value's text as click's parameter type makes it (int(), float(), a choice in its
    canonical case, a path as given); anything click could refuse raises :class:`_Unsure`."""
    name = kind.name
    try:
        if name in ("integer", "count"):
            value = int(text)
            if name == "count" and value < 0:
                raise _Unsure
            return value
        if name == "number":
            value = float(text)
            if value != value or value in (float("inf"), float("-inf")):  # click's reading of nan/inf
                raise _Unsure
            return value
    except ValueError:
        raise _Unsure from None
    if name == "choice":
        by_fold = {c.casefold(): c for c in kind.choices}
        if text.casefold() not in by_fold:
            raise _Unsure
        return by_fold[text.casefold()]
    if name == "path":
        import stat

        try:
            st = os.stat(text)
        except (OSError, ValueError):
            return text  # need not exist
        if stat.S_ISREG(st.st_mode) or not os.access(text, os.R_OK):  # folders only (--config: _config)
            raise _Unsure
        return text
    return text


def _parameters() -> dict:
    """{python name: (Kind, variable or None, default)} of every row and alias but
    ``--config`` (a source of the others' values, :func:`_config`): click's parameters,
    made from the same table (:func:`cpulaunch.cli._param`): a row's default as the table has it, an alias's
    False for a flag, else None."""
    out = {o.dest: (o.kind, o.variable if "env" in o.sources else None, o.default)
           for o in table.OPTIONS if o.dest != "config"}
    for a in table.ALIASES:
        out[a.dest] = (a.kind, table.option_variable(a.name), False if a.kind.name == "flag" else None)
    return out


def _config(path, environ) -> dict:
    """``--config FILE`` (or its variable)'s settings, {python name: (value, Spelling)}, as
    click's command reads them (:func:`cpulaunch.cli._load_config`); {} for none. A file
    click would refuse or fail to read raises :class:`_Unsure` (click then says why)."""
    variable = table.BY_DEST["config"].variable
    label = "--config"
    if path is None:
        path, label = environ.get(variable) or None, variable
    if not path:
        return {}
    import stat

    from cpulaunch.machine.files import read_regular
    from cpulaunch.options import CONFIG_MAX_BYTES, config_settings

    try:
        if stat.S_ISDIR(os.stat(path).st_mode) or not os.access(path, os.R_OK):
            raise _Unsure
        return config_settings(read_regular(path, CONFIG_MAX_BYTES), path, label)
    except Exception:  # noqa: BLE001 - whatever it is, click's command says it
        raise _Unsure from None


def _read_words(ours: list[str], params: dict) -> dict:
    """cpulaunch's own words (before the program) -> {python name: value as click's type
    makes it}; ``-v`` counts, flags True, ``--config`` its path. Raises :class:`_Unsure`
    for anything click must read."""
    line: dict = {}
    i = 0
    while i < len(ours):
        tok = ours[i]
        if tok.startswith("-") and len(tok) > 1 and set(tok[1:]) == {"v"}:
            line["verbose"] = line.get("verbose", 0) + len(tok) - 1
            i += 1
            continue
        name, eq, text = tok.partition("=")
        dest = table.BY_SPELLING.get(name)
        if dest is None or (eq and not name.startswith("--")):
            raise _Unsure
        kind = params[dest][0] if dest != "config" else table.PATH
        if kind.name in ("flag", "count"):
            if eq:
                raise _Unsure
            line[dest] = True if kind.name == "flag" else line.get(dest, 0) + 1
            i += 1
            continue
        if not eq:
            if i + 1 >= len(ours) or ours[i + 1].startswith("-"):
                raise _Unsure
            text, i = ours[i + 1], i + 1
        line[dest] = text if dest == "config" else _convert(kind, dest, text)
        i += 1
    return line


def parse(args: list[str], environ) -> Parsed | None:
    """The run's command line read without click, or None when click must read it.

    Reads only what it reads with certainty: the table's spellings (``--opt VALUE``,
    ``--opt=VALUE``, bare optional values, ``-v``/``-vv``, aliases, repeats: the last
    wins), the program after them, ``--``, ``-m``/``-c``, ``CPULAUNCH_*`` variables and a
    ``--config`` file (below both, above the defaults).
    Anything else goes to click's parser, which then says the same as always: a
    subcommand, ``--help``, ``--version``, completion, an unknown option, a value click's
    type would refuse, a value that starts with ``-``, a missing value, a variable that is
    not read, a ``--config`` file it cannot use. ``tests/test_parsers.py`` holds the two parsers equal.

    Args:
        args: the words after ``cpulaunch``.
        environ: the environment (``os.environ``).
    """
    if any(environ.get(var) for var in table.NOT_VARIABLES) or "_CPULAUNCH_COMPLETE" in environ \
            or _subcommand(args) is not None:
        return None
    ours, program, typed = split_argv(list(args), table.VALUE_SPELLINGS)
    params = _parameters()
    try:
        line = _read_words(ours, params)
        config_given = line.pop("config", None)
        config = _config(config_given, environ)
        values, given, spelled_env = {}, set(line), {}
        config_variable = table.BY_DEST["config"].variable
        if config_given is None and environ.get(config_variable):
            spelled_env["config"] = (config_variable, environ[config_variable])
        for dest, (kind, variable, default) in params.items():
            if dest in line:
                values[dest] = line[dest]
                continue
            raw = environ.get(variable) if variable else None
            if raw:
                values[dest] = _flag_word(raw) if kind.name == "flag" else _convert(kind, dest, raw)
                given.add(dest)
                spelled_env[dest] = (variable, raw)
            elif dest in config:
                value = config[dest][0]
                values[dest] = _convert(kind, dest, value) if kind.name == "path" else value
                given.add(dest)
            else:
                values[dest] = default
    except _Unsure:
        return None
    values["program"] = tuple(program)
    if program:
        given.add("program")
    from cpulaunch import options

    spelled = options.command_line_words(typed)
    spelled.update({dest: options.env_spelling(var, raw) for dest, (var, raw) in spelled_env.items()})
    spelled.update({dest: config[dest][1] for dest in config if dest in given and dest not in line
                    and dest not in spelled_env})
    return Parsed(values, frozenset(given), spelled)


def run(parsed: Parsed) -> int:
    """A run from its read command line: one typed options value, then the core (click's
    command calls this too)."""
    from cpulaunch import core, options

    values = parsed.values
    _configure_logging(values.get("verbose") or 0, quiet=bool(values.get("quiet")))
    opts = options.from_values(values, parsed.given, options.Words(parsed.spelled), environ=os.environ)
    return core.run(opts, verifier=_verify_run if opts.launch.verify_after is not None else None)


def main(argv=None) -> int:
    """Console-script entry point: a run whose words :func:`parse` reads runs without
    importing click; everything else (subcommands, ``--help``, completion, any word it is
    not sure of) goes to :func:`cpulaunch.cli.main`. Returns the exit code.

    A run fails as under click's command: Ctrl-C or an EOFError write a new line on
    stderr and exit 130; a broken pipe inside the run exits 1 (click's own handling).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    parsed = parse(args, os.environ)
    if parsed is None:
        from cpulaunch.cli import main as click_main

        return click_main(args)
    try:
        code = run(parsed)
    except (EOFError, KeyboardInterrupt):
        code = _fail("", 130)
    except BrokenPipeError:
        code = 1
    except Exception as exc:  # noqa: BLE001 - the one map says ours from the user's
        code = failure(exc, _verbosity(args))
    return finish(args, code, None)
