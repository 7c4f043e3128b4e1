"""``--print-env`` in shell scripts (issue 32): a failing cpulaunch makes ``eval`` fail, every
planned variable is printed (a kept one with its kept value), and the binding comes as a
function that needs no word splitting; in bash, zsh and dash, each a real shell."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

SHELLS = ["bash", "zsh", "dash"]
#: The console script of the interpreter running the tests: one word, as a user's PATH has it.
CPULAUNCH = [os.path.join(os.path.dirname(sys.executable), "cpulaunch")]


def shell(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (scripts/test.sh installs it as root)")
    return path


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPULAUNCH_", "OMP_", "KMP_"))
           and k not in ("LD_PRELOAD", "MALLOC_CONF")}
    env["CPULAUNCH"] = " ".join(CPULAUNCH)
    env.update(extra)
    return env


def run(sh: str, script: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([shell(sh), "-c", script], capture_output=True, text=True, env=clean_env(**env),
                          timeout=120)


@pytest.mark.parametrize("sh", SHELLS)
def test_eval_of_a_failing_print_env_fails(sh):
    """Before: eval of an empty text returned 0 and the next line ran the program unbound."""
    proc = run(sh, 'eval "$($CPULAUNCH --print-env --ninstances 9 python x.py)"; echo "eval=$?"')
    assert proc.stdout == "eval=1\n", proc
    assert proc.stderr.startswith("cpulaunch: error: --ninstances 9 needs 9 physical cores")
    stopped = run(sh, 'set -e; eval "$($CPULAUNCH --print-env --bogus)"; echo ran')
    assert stopped.returncode == 1 and stopped.stdout == "", stopped
    exits = run(sh, 'eval "$($CPULAUNCH --print-env --format dotenv --ninstances 0)" || exit 3; echo ran')
    assert exits.returncode == 3 and exits.stdout == "", exits


@pytest.mark.parametrize("sh", SHELLS)
def test_the_function_runs_the_program_bound(sh):
    want = ",".join(map(str, sorted(os.sched_getaffinity(0))[:1]))
    proc = run(sh, 'eval "$($CPULAUNCH --print-env --ncores-per-instance 1 --instance-idx 0)" && '
                   'cpulaunch_run python -c "import os; print(sorted(os.sched_getaffinity(0)), '
                   'os.environ[\'OMP_NUM_THREADS\'])"')
    assert proc.returncode == 0, proc
    assert proc.stdout == f"[{want}] 1\n"


@pytest.mark.parametrize("sh", SHELLS)
def test_a_kept_variable_is_in_the_printed_environment(sh, tmp_path):
    """Before: a variable the user already exported was left out, so a dotenv file written
    in one shell lacked it in another."""
    env_file = tmp_path / "run.env"
    with open(env_file, "w") as f:
        subprocess.run([*CPULAUNCH, "--print-env", "--format", "dotenv"], stdout=f, check=True,
                       env=clean_env(OMP_NUM_THREADS="7"))
    assert "# OMP_NUM_THREADS: your value kept (cpulaunch planned" in env_file.read_text()
    proc = run(sh, f'set -a; . "{env_file}"; set +a; echo "$OMP_NUM_THREADS"')
    assert proc.stdout == "7\n", proc
    shell_text = subprocess.run([*CPULAUNCH, "--print-env"], capture_output=True, text=True, check=True,
                                env=clean_env(OMP_NUM_THREADS="7")).stdout
    proc = run(sh, f'eval {shlex_quote(shell_text)}; echo "$OMP_NUM_THREADS"')
    assert proc.stdout == "7\n" and proc.stderr == "", proc


def shlex_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def test_json_and_bind_string_failures_print_nothing():
    """Machine-read forms stay empty on failure (an empty string is no JSON, and the exit
    code of $(...) says it)."""
    for fmt in ("json", "omp-bind"):
        proc = subprocess.run([*CPULAUNCH, "--print-env", "--format", fmt, "--ninstances", "9"], capture_output=True,
                              text=True, env=clean_env())
        assert (proc.returncode, proc.stdout) == (2, ""), (fmt, proc)
