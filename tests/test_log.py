"""cpulaunch.log: the command line's messages are written without importing logging, in the
bytes logging's handler would write (issue 40: ``import logging`` cost a run 20-25 ms on a
2-vCPU EPYC, more than the rest of its start-up, on every machine that lacks numactl).

Each case runs a real child interpreter, once as the command line runs (logging never
imported) and once with logging imported first (pytest's case, a subcommand's), and wants
the same stderr from both.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import sys
if sys.argv[1] == "logging":
    import logging
from cpulaunch import cmdline, log
cmdline._configure_logging(int(sys.argv[2]), quiet=sys.argv[3] == "q")
lg = log.get("cpulaunch.test")
lg.warning("note: %s", "plain")
lg.info("%s: %s (exec'd)", "instance 0", "numactl -C 0-1 -m 0 true")
lg.warning("a dict alone: %(x)s %(y)s", {"x": 1, "y": "two"})
lg.warning("100%% sure, %d%s", 3, "%s")
lg.warning("no arguments, so %s stays")
lg.warning(ValueError("not a str"))
lg.error("an error: %r", ["x"])
print("enabled", lg.isEnabledFor(20), lg.isEnabledFor(30), lg.isEnabledFor(40), file=sys.stderr)
print("logging" in sys.modules)
lg.warning("bad %d", "x")
"""


def _child(mode: str, verbose: int, quiet: bool, env=None) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-c", CHILD, mode, str(verbose), "q" if quiet else "-"],
                          capture_output=True, text=True, timeout=120, env=full, cwd=REPO)


@pytest.mark.parametrize("verbose,quiet", [(0, False), (1, False), (2, False), (1, True)])
def test_the_command_lines_messages_are_logging_s_bytes_without_logging(verbose, quiet):
    direct, logged = _child("direct", verbose, quiet), _child("logging", verbose, quiet)
    assert direct.returncode == 0 and logged.returncode == 0, direct.stderr + logged.stderr
    assert direct.stdout == "False\n" and logged.stdout == "True\n"
    cut = "--- Logging error ---"
    mine, theirs = direct.stderr.split(cut)[0], logged.stderr.split(cut)[0]
    assert mine == theirs
    warnings = ["cpulaunch: note: plain", "cpulaunch: a dict alone: 1 two", "cpulaunch: 100% sure, 3%s",
                "cpulaunch: no arguments, so %s stays", "cpulaunch: not a str"]
    expected = {
        (0, False): warnings + ["cpulaunch: an error: ['x']", "enabled False True True"],
        (1, False): [warnings[0], "cpulaunch: instance 0: numactl -C 0-1 -m 0 true (exec'd)", *warnings[1:],
                     "cpulaunch: an error: ['x']", "enabled True True True"],
        (1, True): ["cpulaunch: an error: ['x']", "enabled False False True"],
    }
    expected[(2, False)] = expected[(1, False)]
    assert mine.splitlines() == expected[(verbose, quiet)]
    # a message that cannot be formatted is handed to logging, which reports it as it would
    if not quiet:
        assert cut in direct.stderr and cut in logged.stderr, direct.stderr
        assert "bad %d" in direct.stderr.split(cut)[1]


def test_threads_write_whole_lines():
    """The supervisor's threads may report at once: each message is one whole line."""
    code = ("import threading\nfrom cpulaunch import cmdline, log\ncmdline._configure_logging(0)\n"
            "lg = log.get('cpulaunch.t')\n"
            "def say(k):\n    for i in range(300): lg.warning('thread %d message %d ' + 'x' * 200, k, i)\n"
            "ts = [threading.Thread(target=say, args=(k,)) for k in range(4)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 0 and len(lines) == 1200, proc.stderr[-2000:]
    assert sorted(lines) == sorted(f"cpulaunch: thread {k} message {i} " + "x" * 200
                                   for k in range(4) for i in range(300))


def test_a_closed_stderr_loses_the_line_not_the_run():
    code = ("import os, sys\nfrom cpulaunch import cmdline, log\ncmdline._configure_logging(0)\n"
            "sys.stderr.close()\nlog.get('cpulaunch.t').warning('gone')\nprint('ran on')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ran on\n", "")


@pytest.mark.parametrize("verbose", [[], ["-v"]])
def test_a_run_without_numactl_says_its_note_without_logging(tmp_path, verbose):
    """A machine without numactl: the run's one note (every line with -v) is printed, and
    the run imports no logging (``python -X importtime`` lists what it imports)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    true = next(p for p in ("/usr/bin/true", "/bin/true") if os.path.exists(p))
    (bin_dir / "true").symlink_to(true)
    env = dict(os.environ, PYTHONPATH=str(REPO), PATH=str(bin_dir))
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "cpulaunch", *verbose, "--allocator", "default",
                           "true"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = {ln.rsplit("|", 1)[1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    said = [ln for ln in proc.stderr.splitlines() if not ln.startswith("import time:")]
    assert "cpulaunch.log" in imported and "logging" not in imported, sorted(imported)
    assert all(ln.startswith("cpulaunch: ") for ln in said), said
    if verbose:
        assert any("(exec'd)" in ln for ln in said) and any("numactl" in ln for ln in said), said
    else:
        assert said == ["cpulaunch: note: numactl not found here: memory not bound (`cpulaunch doctor` says how "
                        "to install it; -v for details)"]
