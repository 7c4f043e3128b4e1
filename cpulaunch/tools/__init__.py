"""The offline tools: ``cpulaunch doctor`` (:mod:`.doctor`), ``cpulaunch verify``
(:mod:`.verify`) and ``cpulaunch tune`` (:mod:`.tune`). Slower, may import more; each
module has a ``main(args) -> int`` that :mod:`cpulaunch.cli` imports only when its word is
given, so the launch path never pays for them and every error they raise goes through the
CLI's one exception-to-exit-code map.
"""

from typing import Optional, Sequence

from cpulaunch.option_table import HELP_CONTEXT

#: click settings every tool's command shares: the command line's
#: (:data:`cpulaunch.option_table.HELP_CONTEXT`).
CLICK_CONTEXT = HELP_CONTEXT

#: The options every tool that takes them reads as the launcher does (pip's general options):
#: python names of rows of :data:`cpulaunch.option_table.OPTIONS`.
SHARED = ("sysroot", "fmt", "verbose")


def shared_option(dest: str, *, help: Optional[str], choices: Optional[Sequence[str]] = None):
    """click's option decorator for a tool's ``--sysroot``, ``--format`` or ``-v``
    (:data:`SHARED`), made from the command line's row of the option table: its spellings,
    kind and default (``--format``'s: the first of ``choices``).

    ``help``: what the option does for this tool (None: no help line); ``choices``: the
    values this tool takes, a subset of the row's (doctor and verify write text or JSON).
    The tools read their options from the command line only: the row's ``CPULAUNCH_*``
    variable is the launcher's input, so a variable exported for launches (``CPULAUNCH_SYSROOT``)
    never changes which machine ``cpulaunch doctor`` examines.

    Raises:
        ValueError: ``dest`` is not a shared option, or ``choices`` are not the row's.
    """
    import click

    from cpulaunch import option_table as table

    if dest not in SHARED:
        raise ValueError(f"{dest} is not an option the tools share: {', '.join(SHARED)}")
    row = table.BY_DEST[dest]
    decls = ([row.short] if row.short else []) + [row.name] + ([dest] if row.name.lstrip("-") != dest else [])
    kw: dict = {"help": help}
    kind = row.kind
    if kind.name == "count":
        kw.update(count=True, default=row.default)
    elif kind.name == "path":
        kw.update(type=click.Path(file_okay=False), default=row.default, show_default=True)
    elif kind.name == "choice":
        values = tuple(choices or kind.choices)
        if set(values) - set(kind.choices):
            raise ValueError(f"{row.name} takes {', '.join(kind.choices)}, not {', '.join(values)}")
        kw.update(type=click.Choice(list(values)), default=row.default if row.default is not None else values[0],
                  show_default=True)
    else:
        raise ValueError(f"{row.name}: a {kind.name} option is not shared")
    return click.option(*decls, **kw)
