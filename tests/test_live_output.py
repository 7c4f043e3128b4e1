"""Issue 34 part 4: live output for every program. Real launches (``cpulaunch --ninstances 2
--bind none``, the console a pipe the test reads as it comes): what an instance prints
without a newline (a prompt, a ``\\r`` progress bar) reaches the console while the program
still waits for it to be seen, prefixed once per line start; a line another instance's
output cut is continued with a marked prefix (``[0]+ ``), an over-long one too; the log
files keep exactly the bytes each program wrote. The programs wait, on FIFOs, for the
test to have seen each step: nothing sleeps to win a race. The latency figures are
scripts/bench_live_output.py's.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, default_signals
from cpulaunch.launch.group import _LineState

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two instances need two CPUs")

#: Each instance writes its steps (argv: STEP...; "\\n", "\\r" and "<70000x>" spelled so),
#: and before each step after the first waits for a line on its FIFO (FIFO<index>).
STEPS = r"""
import os, sys
fifo = sys.argv[1] + os.environ["CPULAUNCH_INSTANCE_INDEX"]
gate = None
for i, step in enumerate(sys.argv[2:]):
    if i:
        if gate is None:
            gate = open(fifo)
        gate.readline()
    step = step.replace("\\n", "\n").replace("\\r", "\r").replace("<70000x>", "x" * 70000)
    if step != "-":
        sys.stdout.write(step)
        sys.stdout.flush()
"""


class Console:
    """The launcher's stdout, read as it comes."""

    def __init__(self, tmp: Path, steps: dict, *args: str):
        self.fifos = {i: tmp / f"gate{i}" for i in steps}
        for path in self.fifos.values():
            os.mkfifo(path)
        (tmp / "steps.py").write_text(STEPS)
        self.logs = tmp / "logs"
        # both instances get the same argv; each picks its own steps by index
        argv = [sys.executable, "-m", "cpulaunch", "--ninstances", "2", "--bind", "none", "--allocator", "default",
                "--log-dir", str(self.logs), *args, sys.executable, "-c",
                "import os, sys, runpy; i = int(os.environ['CPULAUNCH_INSTANCE_INDEX']); "
                "sys.argv = [sys.argv[0], sys.argv[1]] + sys.argv[2 + i].split('|'); "
                f"runpy.run_path({str(tmp / 'steps.py')!r}, run_name='__main__')",
                str(tmp / "gate"), *("|".join(steps[i]) for i in sorted(steps))]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     preexec_fn=default_signals)
        self.seen = b""
        self.writers: dict = {}

    def until(self, data: bytes, timeout: float = 60.0) -> None:
        """Read until ``data`` has been seen on the console (a deadline, never a sleep)."""
        deadline = time.monotonic() + timeout
        while data not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"not seen in {timeout} s: {data!r}; seen {self.seen[-400:]!r}"
            if select.select([self.proc.stdout], [], [], left)[0]:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                assert chunk, f"the launcher ended before {data!r} was seen: {self.seen[-400:]!r}"
                self.seen += chunk

    def next_step(self, i: int) -> None:
        if i not in self.writers:
            self.writers[i] = os.open(self.fifos[i], os.O_WRONLY)
        os.write(self.writers[i], b"go\n")

    def end(self) -> bytes:
        for fd in self.writers.values():
            os.close(fd)
        out, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err
        return self.seen + out

    def log(self, i: int) -> bytes:
        (run,) = [d for d in self.logs.iterdir() if d.is_dir()]
        return (run / str(i) / "stdout.log").read_bytes()


def test_a_prompt_without_newline_is_seen_while_the_program_waits(tmp_path):
    c = Console(tmp_path, {0: ["ask? ", "yes\\n"], 1: ["other? ", "no\\n"]})
    c.until(b"[0] ask? ")
    c.until(b"[1] other? ")
    c.next_step(0)
    c.next_step(1)
    out = c.end()
    # each answer ends its prompt's line, or (another prompt came between) a marked continuation of it
    assert b"[0] ask? yes\n" in out or (b"[0] ask? \n" in out and b"[0]+ yes\n" in out), out
    assert b"[1] other? no\n" in out or (b"[1] other? \n" in out and b"[1]+ no\n" in out), out
    assert out.count(b"ask?") == out.count(b"other?") == 1
    assert c.log(0) == b"ask? yes\n" and c.log(1) == b"other? no\n"


def test_a_carriage_return_progress_bar_under_two_instances(tmp_path):
    """Each instance draws a bar with \\r: every state reaches the console while its program
    waits, with the instance's prefix after each \\r; the logs hold the bars' bytes exactly."""
    bars = {i: ["\\r  0%", "\\r 50%", "\\r100%", "\\n"] for i in (0, 1)}
    c = Console(tmp_path, bars)
    for pct in (b"  0%", b" 50%", b"100%"):
        for i in (0, 1):
            c.until(b"\r[%d] " % i + pct)
            c.next_step(i)
    out = c.end()
    assert c.log(0) == c.log(1) == b"\r  0%\r 50%\r100%\n"
    assert b"\r[0] 100%" in out and b"\r[1] 100%" in out


@pytest.mark.parametrize("long", [False, True])
def test_a_line_cut_by_another_instance_is_continued_with_a_mark(tmp_path, long):
    """Instance 0 writes the start of a line (70,000 characters in the long case: more than
    the relay's 64 KiB pieces), instance 1 writes a whole line meanwhile, then instance 0
    ends its line: its second piece is marked as a continuation, never taken for 1's."""
    first = "<70000x>" if long else "part1"
    c = Console(tmp_path, {0: [first, "-", "part2\\n"], 1: ["-", "other\\n"]})
    head = b"[0] " + (b"x" * 70000 if long else b"part1")
    c.until(head)
    c.next_step(0)  # instance 0 waits again: its line stays open
    c.next_step(1)
    c.until(b"[1] other\n")
    c.next_step(0)
    out = c.end()
    assert head + b"\n[1] other\n[0]+ part2\n" in out, out[-300:]
    assert c.log(0) == (b"x" * 70000 if long else b"part1") + b"part2\n" and c.log(1) == b"other\n"


@pytest.mark.parametrize("pieces, expected", [
    ([b"a\nb"], b"[0] a\n[0] b"),
    ([b"a", b"b\n"], b"[0] ab\n"),
    ([b"\r 10%", b"\r 20%"], b"\r[0]  10%\r[0]  20%"),
    ([b"done\r\n", b"\n"], b"[0] done\r\n[0] \n"),
    ([b"\n"], b"[0] \n"),
])
def test_line_state_tags_each_line_start_once(pieces, expected):
    state = _LineState(b"[0] ")
    assert b"".join(state.tag(p) for p in pieces) == expected


def test_line_state_continues_a_cut_line_with_a_mark():
    state = _LineState(b"[3] ")
    assert state.tag(b"abc") == b"[3] abc"
    state.interrupted()
    assert state.tag(b"def\nghi") == b"[3]+ def\n[3] ghi"
    assert _LineState(b"").tag(b"x\ry") == b"x\ry"
