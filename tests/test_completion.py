"""Shell completion in real shells (issue 40): ``cpulaunch completion bash|zsh|fish`` prints
the script, and each shell, with the script loaded, completes an option's name, an
option's choice and a subcommand.

bash: the script's completion function called as bash calls it (COMP_WORDS, COMP_CWORD),
COMPREPLY read back; zsh: an interactive zsh on a pseudo-terminal (zsh/zpty) with
compinit, TAB pressed, the edited line read back; fish: ``complete -C`` (fish's own way to
ask its completions for a command line). scripts/test.sh installs zsh and fish; a shell
that is missing skips its tests with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cpulaunch import option_table as table

from conftest import REPO


@pytest.fixture()
def bindir(tmp_path: Path) -> Path:
    """A folder with a ``cpulaunch`` that runs this checkout's (first on PATH)."""
    d = tmp_path / "bin"
    d.mkdir()
    exe = d / "cpulaunch"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m cpulaunch "$@"\n')
    exe.chmod(0o755)
    return d


def shell_env(bindir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPULAUNCH_", "_CPULAUNCH"))}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    return env


def needs(shell: str):
    return pytest.mark.skipif(shutil.which(shell) is None, reason=f"{shell} not installed (scripts/test.sh installs it)")


def test_the_command_prints_each_shells_script(bindir):
    env = shell_env(bindir)
    for shell, marker in (("bash", "complete -o nosort -F _cpulaunch_completion cpulaunch"),
                          ("zsh", "compdef _cpulaunch_completion cpulaunch"),
                          ("fish", 'complete --no-files --command cpulaunch --arguments "(_cpulaunch_completion)"')):
        proc = subprocess.run(["cpulaunch", "completion", shell], capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0 and marker in proc.stdout and proc.stderr == "", (shell, proc.stderr)
    proc = subprocess.run(["cpulaunch", "completion", "tcsh"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "'tcsh' is not one of" in proc.stderr
    proc = subprocess.run(["cpulaunch", "completion"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("cpulaunch: error: name the shell: cpulaunch completion bash")


BASH = r'''
eval "$(cpulaunch completion bash)"
comp() { COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMPREPLY=(); _cpulaunch_completion cpulaunch
         echo "${COMPREPLY[*]}"; }
comp cpulaunch --bi
comp cpulaunch --bind ''
comp cpulaunch doc
comp cpulaunch -v --sysroot /x doc
comp cpulaunch doctor --st
comp cpulaunch doctor --format ''
comp cpulaunch completion ''
'''


@needs("bash")
def test_bash_completes_options_choices_and_subcommands(bindir):
    proc = subprocess.run(["bash", "-c", BASH], capture_output=True, text=True, env=shell_env(bindir), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["--bind", "numactl affinity none", "doctor", "doctor", "--strict", "text json",
                                        "bash zsh fish"], proc.stdout


FISH = '''
cpulaunch completion fish | source
complete -C "cpulaunch --bi"; echo ---
complete -C "cpulaunch --bind "; echo ---
complete -C "cpulaunch doc"; echo ---
complete -C "cpulaunch doctor --st"
'''


@needs("fish")
def test_fish_completes_options_choices_and_subcommands(bindir, tmp_path):
    env = shell_env(bindir)
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_DATA_HOME=str(tmp_path / "data"))
    proc = subprocess.run(["fish", "--no-config", "-c", FISH], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.split("---\n") == [
        f"--bind\t{table.BY_DEST['bind'].help_line}\n", "affinity\nnone\nnumactl\n", "doctor\n",
        "--strict\tExit 1 on warnings too, not only on errors.\n"], proc.stdout


#: An interactive zsh on a pseudo-terminal: compinit and the script, then the line typed
#: with TAB; the line as completed is then run as ``print -r -- BUF:<line>:END`` (the
#: quotes keep the terminal's echo of the typing from matching), so the test reads the
#: very buffer zsh completed. Each read waits for its pattern (zpty -r), the whole bounded
#: by the test's timeout.
ZSH = r"""
zmodload zsh/zpty
zpty -b z 'zsh -f -i'
zpty -w z 'bindkey -e; PS1="> "; autoload -U compinit; compinit -u -D; eval "$(cpulaunch completion zsh)"; echo RE""ADY'
zpty -r z out '*READY*'
zpty -w -n z "$1"$'\t'$'\C-a''print -r -- B""UF:'$'\C-e'':E""ND'$'\n'
zpty -r z out '*BUF:*:END*'
print -r -- "${out//$'\e'/}"
zpty -d z
"""


@needs("zsh")
@pytest.mark.parametrize("typed, buffer, listed", [
    ("cpulaunch --bi", "cpulaunch --bind", ()),                           # an option's name
    ("cpulaunch --bind ", "cpulaunch --bind", ("numactl", "affinity", "none")),  # its choices, listed
    ("cpulaunch doc", "cpulaunch doctor", ()),                            # a subcommand
])
def test_zsh_completes_options_choices_and_subcommands(bindir, tmp_path, typed, buffer, listed):
    env = shell_env(bindir)
    env.update(HOME=str(tmp_path), ZDOTDIR=str(tmp_path))
    proc = subprocess.run(["zsh", "-f", "-c", ZSH, "zsh", typed], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.replace("\r", "\n").splitlines() if "BUF:" in ln and "B\"\"UF" not in ln)
    got = line[line.index("BUF:") + 4:line.index(":END")]
    assert got.strip() == buffer, proc.stdout
    for word in listed:
        assert word in proc.stdout, proc.stdout
