"""The ``cpulaunch`` command in click: ``--help``, ``--version``, completion, the
subcommands, and every run whose words the fast reader (:func:`cpulaunch.cmdline.parse`)
leaves to click.

Its parameters and its ``--help`` are made from the option table
(:mod:`cpulaunch.option_table`), as the fast reader is. Errors go through the one exception
map (:func:`cpulaunch.cmdline.failure`), click's usage errors too:
:class:`~cpulaunch.errors.CpulaunchError` and click's usage errors -> one line ``cpulaunch:
error: ...``, exit code 2; anything else is ours -> ``cpulaunch: internal error: ...``, exit
code 70, the traceback with ``-v``. It must not import torch.

The command line is strict: before the program, every word must be one of cpulaunch's
options (an unknown one is an error with a "did you mean" hint). The program starts at
the first word that is not an option, after ``--``, or at Python's ``-m MODULE`` /
``-c CODE``; the program's own words are never read.
"""

from __future__ import annotations

import os
import sys

import click

from cpulaunch import __version__
from cpulaunch import option_table as table
from cpulaunch.cmdline import (  # noqa: F401 - cli's names as before
    BEFORE_SUBCOMMAND, GLOBAL_OPTIONS, REGISTRY, SUBCOMMANDS, Subcommand, _configure_logging, _eval_fails,
    _evaluated_print_env, _fail, _one_line, _quiet, _quiet_exit, _subcommand, _verbosity, _verify_run,
    Parsed, _write_stdout, failure, finish, run, split_argv,
)
from cpulaunch.errors import USAGE_EXIT
from cpulaunch.options import OptionsError


class _Heard:
    """How the user said cpulaunch's options while click parses them, kept on the click
    context as its object (``ctx.ensure_object(_Heard)``), read once by :func:`_run`.

    Attributes:
        typed: typed on the command line: {python name: (spelling typed, value text or
            None)} (:func:`split_argv`).
        spelled: {python name: :class:`cpulaunch.spelling.Spelling`} of the values read from
            a ``CPULAUNCH_*`` variable.
        config: {python name: :class:`cpulaunch.spelling.Spelling`} of every key of the
            ``--config`` file (a key counts only where its value was used).
    """

    def __init__(self) -> None:
        self.typed: dict = {}
        self.spelled: dict = {}
        self.config: dict = {}


class _TableOption(click.Option):
    """A parameter made from a row of the option table: it remembers how its value was
    given (a variable), and says a bad value in the user's words (``CPULAUNCH_NINSTANCES=x:
    not an integer``), not click's "Invalid value for '--ninstances'"."""

    def consume_value(self, ctx, opts):
        value, source = super().consume_value(ctx, opts)
        if source is click.core.ParameterSource.ENVIRONMENT and self.envvar:
            from cpulaunch.options import env_spelling

            ctx.ensure_object(_Heard).spelled[self.name] = env_spelling(self.envvar, os.environ.get(self.envvar, ""))
        return value, source

    def shell_complete(self, ctx, incomplete):
        """Its values (choices, paths); after a subcommand's name, the subcommand's own."""
        program = ctx.params.get("program") or ()
        if program:
            return _complete_subcommand(ctx, program, incomplete)
        return super().shell_complete(ctx, incomplete)

    def process_value(self, ctx, value):
        try:
            return super().process_value(ctx, value)
        except click.BadParameter as exc:
            raise OptionsError(f"{_said(ctx, self.name, value)}: {_problem(exc)}") from None


def _said(ctx, dest: str, value) -> str:
    """An option as the user gave it, from what parsing recorded."""
    heard = ctx.ensure_object(_Heard)
    if dest in heard.spelled:
        return heard.spelled[dest].said
    typed = heard.typed.get(dest)
    if typed is not None:
        spelling, text = typed
        return spelling if text is None else f"{spelling} {text}"
    return f"{table.name_of(dest)} {value}"


def _problem(exc: click.BadParameter) -> str:
    """click's complaint without its "Invalid value for ..." preamble."""
    text = exc.format_message()
    if text.startswith("Invalid value for "):
        text = text.split(": ", 1)[-1]
    return text.rstrip(".")


class _Command(click.Command):
    def parse_args(self, ctx, args):
        for var, why in table.NOT_VARIABLES.items():
            if os.environ.get(var):  # empty counts as unset, as for every CPULAUNCH_* variable
                raise OptionsError(f"{var} is set in the environment, but {why}; unset {var}")
        value_opts = set()
        for p in self.get_params(ctx):
            if isinstance(p, click.Option) and not (p.is_flag or p.count):
                value_opts.update(p.opts + p.secondary_opts)
        ours, program, typed = split_argv(list(args), value_opts)
        ctx.ensure_object(_Heard).typed = typed
        try:
            return super().parse_args(ctx, ours + (["--", *program] if program else []))
        except click.NoSuchOption as exc:
            if exc.option_name in table.FOREIGN_OPTIONS:
                exc.possibilities = [table.FOREIGN_OPTIONS[exc.option_name]]
            raise

    def shell_complete(self, ctx, incomplete):
        """Shell completion (``cpulaunch completion SHELL``) of an option's name: every row
        of the table (their parameters are hidden from click's own help), with its help."""
        return _complete_options(ctx, incomplete)

    def format_usage(self, ctx, formatter):
        formatter.write_usage("cpulaunch", "[OPTIONS] [--] PROGRAM [ARGS]...")
        formatter.write_usage("cpulaunch", "[-v] {" + ",".join(SUBCOMMANDS) + "} [ARGS]...  "
                              "(cpulaunch SUBCOMMAND --help)")

    def format_options(self, ctx, formatter):
        for section in table.Section:
            rows = table.help_rows(section)
            if rows:
                with formatter.section(section.value):
                    formatter.write_dl(rows)

    def format_epilog(self, ctx, formatter):
        with formatter.section("Subcommands (cpulaunch SUBCOMMAND --help)"):
            formatter.write_dl([(c.name, c.summary) for c in REGISTRY.values()])
        for text in (table.PROGRAM_RULE, table.SOURCES_RULE):
            formatter.write_paragraph()
            formatter.write(click.formatting.wrap_text(text, formatter.width, "  ", "  ", preserve_paragraphs=True))
            formatter.write("\n")


def _param(o: "table.Option") -> click.Option:
    """click's parameter for a row of the table."""
    decls = [o.dest, *table.spellings(o.name)] + ([o.short] if o.short else [])
    kw: dict = {"envvar": o.variable if "env" in o.sources else None, "default": o.default, "hidden": True}
    k = o.kind
    if k.name == "flag":
        kw["is_flag"] = True
    elif k.name == "count":
        kw["count"] = True
    elif k.name == "choice":
        kw["type"] = click.Choice(list(k.choices), case_sensitive=False)
    elif k.name == "integer":
        kw["type"] = int
    elif k.name == "number":
        kw["type"] = float
    elif k.name == "path":  # folders but --config's file
        kw["type"] = click.Path(dir_okay=False) if o.dest == "config" else click.Path(file_okay=False)
    if o.dest == "config":
        kw.update(expose_value=False, is_eager=True, callback=lambda ctx, param, value: _load_config(ctx, param, value))
    return _TableOption(decls, **kw)


def _alias_param(a: "table.Alias") -> click.Option:
    kw: dict = {"envvar": table.option_variable(a.name), "hidden": True}
    if a.kind.name == "flag":
        kw["is_flag"] = True
    elif a.kind.name == "integer":
        kw["type"] = int
    elif a.kind.name == "path":
        kw["type"] = click.Path(file_okay=False)
    return _TableOption([a.dest, *table.spellings(a.name)], **kw)


def _parsed(ctx, values: dict) -> Parsed:
    """What click read, as :func:`cpulaunch.cmdline.run` takes it."""
    from cpulaunch import options

    source = ctx.get_parameter_source
    given = frozenset(n for n in values if source(n) not in (None, click.core.ParameterSource.DEFAULT))
    heard = ctx.ensure_object(_Heard)
    spelled = options.command_line_words(heard.typed)
    spelled.update(heard.spelled)
    spelled.update({n: s for n, s in heard.config.items() if source(n) is click.core.ParameterSource.DEFAULT_MAP})
    return Parsed(dict(values), given, spelled)


def _run(**values):
    """The command's body: one typed options value, then the core."""
    return run(_parsed(click.get_current_context(), values))


def parsed(args: list[str]) -> Parsed:
    """click's reading of a run's words (without running it): what the fast reader
    (:func:`cpulaunch.cmdline.parse`) must equal (tests/test_parsers.py).

    Raises:
        click.ClickException, click.exceptions.Exit, CpulaunchError: as a run would.
    """
    with command.make_context("cpulaunch", list(args)) as ctx:
        return _parsed(ctx, ctx.params)


CONTEXT = {**table.HELP_CONTEXT, "allow_interspersed_args": False}
command = _Command(
    "cpulaunch", context_settings=CONTEXT, callback=_run,
    help="Run PROGRAM on the right CPUs, memory, threads and libraries.\n\n\b\nExamples:\n"
         "  cpulaunch --instances-per-socket python infer.py\n"
         "  cpulaunch --ddp python train.py\n"
         "  cpulaunch --dry-run --ninstances 4 python infer.py\n"
         "  ( eval \"$(cpulaunch --print-env)\" && exec python infer.py )\n"
         "  cpulaunch doctor",
    params=[*(_param(o) for o in table.OPTIONS), *(_alias_param(a) for a in table.ALIASES),
            click.Argument(["program"], nargs=-1, type=click.UNPROCESSED,
                           shell_complete=lambda ctx, param, incomplete: _complete_program(ctx, incomplete))],
)
click.version_option(__version__, "--version")(command)


def _complete_options(ctx, incomplete: str) -> list:
    """The option names starting with ``incomplete`` (none once the program has started;
    a subcommand's own, from its command, after its name)."""
    from click.shell_completion import CompletionItem

    program = ctx.params.get("program") or ()
    if program:
        return _complete_subcommand(ctx, program, incomplete)
    rows = [(s, o.help_line) for o in table.OPTIONS for s in (o.name,) + ((o.short,) if o.short else ())]
    rows += [(a.name, f"= {a.meaning} ({a.origin})") for a in table.ALIASES]
    rows += [("--version", "Print the version and exit."), ("--help", "Print the help and exit.")]
    return [CompletionItem(name, help=text) for name, text in rows if name.startswith(incomplete)]


def _complete_program(ctx, incomplete: str) -> list:
    """The program's first word: the subcommands it begins (``doc`` -> doctor), else a
    file (the shells' scripts let a file item replace the others); a subcommand's words:
    its own."""
    from click.shell_completion import CompletionItem

    program = ctx.params.get("program") or ()
    if program:
        return _complete_subcommand(ctx, program, incomplete)
    subs = [CompletionItem(s) for s in SUBCOMMANDS if incomplete and s.startswith(incomplete)]
    return subs or [CompletionItem(incomplete, type="file")]


def _complete_subcommand(ctx, program: tuple, incomplete: str) -> list:
    """After a subcommand's name: its options and their values (from its click command);
    after a program: files."""
    from click.shell_completion import CompletionItem

    cmd = None
    if program[0] in SUBCOMMANDS:
        import importlib

        cmd = getattr(importlib.import_module(f"cpulaunch.tools.{program[0]}"), "command", None)
    if isinstance(cmd, click.Command):
        words = list(program[1:])
        sub = cmd.make_context(program[0], list(words), parent=ctx, resilient_parsing=True)
        for p in cmd.get_params(sub):  # the value of the option just typed
            if words and isinstance(p, click.Option) and words[-1] in p.opts and not (p.is_flag or p.count):
                return p.shell_complete(sub, incomplete)
        if incomplete.startswith("-"):
            return cmd.shell_complete(sub, incomplete)
        for p in cmd.get_params(sub):  # its argument's choices (completion's shells)
            if isinstance(p, click.Argument) and isinstance(p.type, click.Choice):
                return p.shell_complete(sub, incomplete)
    return [CompletionItem(incomplete, type="file")]


def _load_config(ctx, param, path) -> None:
    """``--config FILE`` (or CPULAUNCH_CONFIG): its values become click's default_map, which
    click consults after the command line and CPULAUNCH_* variables and before built-in
    defaults. Read with the project's bounded reader (a FIFO or device is refused at once,
    a file over :data:`~cpulaunch.options.CONFIG_MAX_BYTES` is refused, never cut short).

    Raises:
        OptionsError: the file cannot be read or used (one line naming it and how it was given).
    """
    if not path:
        return
    from cpulaunch.errors import printable
    from cpulaunch.machine.files import UnusableFileError, read_regular
    from cpulaunch.options import CONFIG_MAX_BYTES, config_settings

    from_env = ctx.get_parameter_source(param.name) is click.core.ParameterSource.ENVIRONMENT
    label = table.BY_DEST["config"].variable if from_env else "--config"
    try:
        data = read_regular(path, CONFIG_MAX_BYTES)
    except UnusableFileError as exc:
        raise OptionsError(f"{label} {printable(path)}: {exc}; give a regular TOML file") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the name
        raise OptionsError(f"{label} {printable(path)}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    settings = config_settings(data, path, label)
    ctx.default_map = {**(ctx.default_map or {}), **{n: v for n, (v, _) in settings.items()}}
    ctx.ensure_object(_Heard).config = {n: s for n, (_, s) in settings.items()}


def main(argv=None) -> int:
    """click's command line: subcommands, ``--help``, completion, and every run the fast
    reader leaves to click (:func:`cpulaunch.cmdline.main`). Returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get("_CPULAUNCH_COMPLETE", "").startswith("fish"):  # a TAB in fish
        from cpulaunch.tools.completion import register_fish

        register_fish()
    verbose = _verbosity(args)
    sub = _subcommand(args)
    try:
        if sub is not None:
            import importlib

            tool, words, verbose = sub
            _configure_logging(verbose, now=True, quiet=_quiet(args))
            code = importlib.import_module(REGISTRY[tool].module).main(words)
        else:
            code = command.main(args=args, prog_name="cpulaunch", standalone_mode=False)
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.exceptions.Abort:
        code = 130
    except click.UsageError as exc:
        where = f"cpulaunch {sub[0]}" if sub is not None else "cpulaunch"
        code = _fail(f"cpulaunch: error: {_one_line(exc.format_message())} (see {where} --help)", USAGE_EXIT)
    except (KeyboardInterrupt, Exception) as exc:  # noqa: BLE001 - ours, reported as ours
        code = failure(exc, verbose)
    return finish(args, code, sub)
