"""``cpulaunch completion bash|zsh|fish``: print the shell's completion script.

The script is click's (:mod:`click.shell_completion`): on each TAB the shell runs
``cpulaunch`` with ``_CPULAUNCH_COMPLETE=<shell>_complete`` and the words typed so far,
and :mod:`cpulaunch.cli` answers from the option table: option names with their help,
an option's choices (``--bind <TAB>``: numactl, affinity, none), folders and files for
paths, the subcommands (and their own options) or a file for the program's first word.

Install it once (docs/guide/quick-start.md)::

    cpulaunch completion bash > ~/.local/share/bash-completion/completions/cpulaunch
    cpulaunch completion zsh > "${fpath[1]}/_cpulaunch"       # a folder on $fpath
    cpulaunch completion fish > ~/.config/fish/completions/cpulaunch.fish

or, for the current shell only: ``eval "$(cpulaunch completion bash)"`` (zsh: the same
after ``autoload -U compinit && compinit``; fish: ``cpulaunch completion fish | source``).
"""

from __future__ import annotations

from typing import Sequence

import click

#: The shells click's completion supports, in --help's order.
SHELLS = ("bash", "zsh", "fish")
#: The variable that makes ``cpulaunch`` answer a completion request (click's
#: ``_<PROG>_COMPLETE``).
COMPLETE_VAR = "_CPULAUNCH_COMPLETE"


#: fish's script: the line typed so far in COMP_WORDS/COMP_CWORD, one answer a line
#: (type, value, help: tab-separated), as :class:`FishComplete` writes them.
_FISH_SOURCE = """\
function %(complete_func)s
    set -l response (env %(complete_var)s=fish_complete COMP_WORDS=(commandline -cp) \\
COMP_CWORD=(commandline -t) %(prog_name)s)
    for line in $response
        set -l item (string split -m 2 \\t -- $line)
        switch $item[1]
            case dir
                __fish_complete_directories (commandline -t)
            case file
                __fish_complete_path (commandline -t)
            case plain
                if test "$item[3]" = ""
                    echo $item[2]
                else
                    echo $item[2]\\t$item[3]
                end
        end
    end
end

complete --no-files --command %(prog_name)s --arguments "(%(complete_func)s)"
"""


def register_fish() -> None:
    """Make click answer fish with :class:`FishComplete` (called by cpulaunch.cli when a
    fish completion is asked for, and before printing fish's script): the fish script
    of some click releases splits each answer on a literal newline and runs the words
    it completes as commands (seen with click 8.4.0)."""
    from click.shell_completion import ShellComplete, add_completion_class, split_arg_string

    class FishComplete(ShellComplete):
        """fish completion with one answer a line: ``type<TAB>value<TAB>help``."""

        name = "fish"
        source_template = _FISH_SOURCE

        def get_completion_args(self):
            import os

            words = split_arg_string(os.environ.get("COMP_WORDS", ""))
            incomplete = os.environ.get("COMP_CWORD", "")
            args = words[1:]
            if incomplete and args and args[-1] == incomplete:
                args.pop()
            return args, incomplete

        def format_completion(self, item) -> str:
            def flat(text):
                return " ".join(str(text or "").replace("\t", " ").split())

            return f"{item.type}\t{flat(item.value)}\t{flat(item.help)}"

    add_completion_class(FishComplete)


def script(shell: str) -> str:
    """The completion script of ``shell`` ("bash", "zsh" or "fish"), as text ending in a
    newline. bash needs 4.4 or newer (click checks the bash on PATH).

    Raises:
        click.UsageError: an old bash (click's RuntimeError, reworded).
    """
    from click.shell_completion import get_completion_class

    if shell == "fish":
        register_fish()
    cls = get_completion_class(shell)
    try:
        text = cls(None, {}, "cpulaunch", COMPLETE_VAR).source()
    except RuntimeError as exc:  # click: "Shell completion is not supported for Bash versions older than 4.4."
        raise click.UsageError(str(exc)) from None
    return text if text.endswith("\n") else text + "\n"


@click.command("completion", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("shell", type=click.Choice(SHELLS), required=False)
def command(shell):
    """Print the completion script of SHELL (bash, zsh or fish) for cpulaunch.

    \b
    bash:  eval "$(cpulaunch completion bash)"       (or save it in
           ~/.local/share/bash-completion/completions/cpulaunch)
    zsh:   eval "$(cpulaunch completion zsh)"        (after compinit; or save it as
           _cpulaunch in a folder on $fpath)
    fish:  cpulaunch completion fish | source        (or save it in
           ~/.config/fish/completions/cpulaunch.fish)
    """
    from cpulaunch import core

    if shell is None:
        raise click.UsageError("name the shell: cpulaunch completion bash, zsh or fish")
    core.write_out(script(shell))
    return 0


def main(args: Sequence[str]) -> int:
    """``cpulaunch completion SHELL``: returns the exit status (click's usage errors are
    raised for :func:`cpulaunch.cli.main` to map)."""
    return command.main(args=list(args), prog_name="cpulaunch completion", standalone_mode=False)
