"""Every shell command README.md and the pages under docs/ (guide, reference, dev) show runs as shown (issue 24).

What counts as a command:

- every ```sh / ```bash block: one script, run with ``bash -e -o pipefail`` (a user pastes
  the block);
- in any other block, every line starting with ``$ `` (with its continuation lines: a
  trailing backslash or an open quote); the lines after it are its shown output. Each
  runs on its own.

A marker comment on the line before a block says how to take it, items separated by ``;``:

- ``<!-- commands: not run: WHY -->``: it cannot run on one machine as shown (several
  machines, a Slurm cluster, software not installed here); WHY is said in the docs;
- ``<!-- commands: exit N -->``: the commands are meant to exit with N;
- ``<!-- commands: long: WHY -->``: a benchmark or a search of many minutes: it runs for
  :data:`LONG_WINDOW` seconds and must not have failed by then (it is then stopped, its
  whole process group); ``CPULAUNCH_DOCS_LONG=0`` skips them;
- ``<!-- commands: output -->``: the ``$`` commands' stdout must be exactly the lines
  shown under them;
- ``<!-- commands: output; varies: TEXT -->`` (with ``output``): TEXT, wherever it stands in
  the shown lines, is what varies from machine to machine (``/usr/lib/x86_64-linux-gnu``,
  where Debian keeps the allocators, is ``/usr/lib/aarch64-linux-gnu`` on Arm): it matches
  any run of non-blank characters there, and the rest must be exact (:func:`shown_matches`).
  Output that depends on this machine's topology or CPU is recorded on a ``--sysroot`` dump
  instead, which every machine prints alike.

They run as a user runs them: in a copy of the checkout (where they write their files),
in the environment the tests run in (scripts/test.sh's .venv: its ``python`` and
``cpulaunch`` first on PATH; when the ``cpulaunch`` there is not this checkout's, a
wrapper running this checkout's), with a user's variables (no PYTHONUNBUFFERED,
PYTHONDONTWRITEBYTECODE, CPULAUNCH_*, OMP_*, KMP_*, LD_PRELOAD), and ``DUMP`` as the docs
define it (``/tmp/d/32intel64-2p8co2t+8ve``, unpacked by the docs' own command: the quick
start's "The two-socket dump", README's collapsed block).
Untagged blocks with no ``$`` line must not hold a command-like line (tag them ``text``):
a command cannot hide from this test.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
MARKER = re.compile(r"^<!--\s*commands:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^\s*```\s*([\w+-]*)\s*$")
SHELLS = ("sh", "bash")
#: A line that looks like a command a user types (second word not ending in ":", which
#: is how cpulaunch's own messages read: "cpulaunch: note", "cpulaunch tune: warm-up").
COMMAND_LIKE = re.compile(r"^(cpulaunch|python3?|torchrun|srun|sbatch|mpirun|bash|export|eval)\s+[^\s:]+(\s|$)")
#: Seconds a long command must run without failing.
LONG_WINDOW = 6.0
#: Seconds any other command may take.
TIMEOUT = 300.0
#: What the docs call DUMP: the two-socket Xeon dump, unpacked by their own command.
DUMP = "/tmp/d/32intel64-2p8co2t+8ve"
UNPACK = "mkdir -p /tmp/d && tar -xjf tests/fixtures/hw-32intel64-2p8co2t+8ve/*.tar.bz2 -C /tmp/d"
#: Commands that need torch (they run the examples, torchrun, the benchmarks or tune).
NEEDS_TORCH = re.compile(r"examples/|torchrun|scripts/bench_|cpulaunch tune|--inference-path")


class Block(NamedTuple):
    """A fenced block: where it starts (1-based line of the fence), its tag, its lines and
    the items of the marker comment before it."""

    path: Path
    line: int
    lang: str
    lines: tuple
    marker: tuple


class Command(NamedTuple):
    """One thing to run: a shell block's whole text, or one ``$`` command; ``shown``: the
    output lines under a ``$`` command."""

    where: str
    script: str
    block: Block
    shown: tuple = ()


def read_blocks(path: Path) -> list:
    """Every fenced block of a Markdown file, with the marker comment just before it."""
    out, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not FENCE.match(lines[j]):
            j += 1
        prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        marker = MARKER.match(prev.strip())
        items = tuple(x.strip() for x in marker.group(1).split(";")) if marker else ()
        out.append(Block(path, i + 1, m.group(1).lower(), tuple(lines[i + 1:j]), items))
        i = j + 1
    return out


def _complete(text: str) -> bool:
    """True when ``text`` is a whole shell command (no trailing backslash, no open quote)."""
    if text.endswith("\\"):
        return False
    try:
        shlex.split(text, comments=True)
    except ValueError:  # "No closing quotation"
        return False
    return True


def commands_of(block: Block) -> list:
    """The commands of one block (see the module docstring)."""
    where = f"{block.path.relative_to(REPO)}:{block.line}"
    if block.lang in SHELLS and _item(block, "long") is None:
        return [Command(where, "\n".join(block.lines) + "\n", block)]
    if block.lang in SHELLS:  # long: each line on its own, so that each gets its window
        out, text = [], ""
        for n, line in enumerate(block.lines):
            text += ("\n" if text else "") + line
            if text.strip() and not text.lstrip().startswith("#") and _complete(text):
                out.append(Command(f"{where}+{n + 1}", text + "\n", block))
            if _complete(text):
                text = ""
        return out
    out, i, lines = [], 0, block.lines
    while i < len(lines):
        if not lines[i].startswith("$ "):
            i += 1
            continue
        text, start = lines[i][2:], i
        while not _complete(text) and i + 1 < len(lines):
            i += 1
            text += "\n" + lines[i]
        i += 1
        shown = []
        while i < len(lines) and not lines[i].startswith("$ "):
            shown.append(lines[i])
            i += 1
        out.append(Command(f"{where}+{start + 1}", text + "\n", block, tuple(shown)))
    return out


def _item(block: Block, name: str) -> str | None:
    """The value of a marker item (``exit 1`` -> "1", ``not run: why`` -> "why"), or None."""
    for item in block.marker:
        if item == name or item.startswith((name + " ", name + ":")):
            return item[len(name):].lstrip(" :")
    return None


def varies(block: Block) -> list:
    """The texts a block's marker says vary between machines (``varies: TEXT`` items)."""
    return [item.split(":", 1)[1].strip() for item in block.marker if item.startswith("varies:")]


def shown_matches(shown, printed, varying) -> bool:
    """Whether the printed lines are the shown ones, where each text of ``varying`` in a
    shown line stands for any run of non-blank characters (the rest compared exactly)."""
    if len(shown) != len(printed):
        return False
    for want, got in zip(shown, printed):
        pattern = re.escape(want)
        for text in varying:
            pattern = pattern.replace(re.escape(text), r"\S+")
        if not re.fullmatch(pattern, got):
            return False
    return True


ALL_BLOCKS = [b for path in DOCS for b in read_blocks(path)]
ALL_COMMANDS = [c for b in ALL_BLOCKS for c in commands_of(b)]


# ------------------------------------------------------------------ the rules themselves


def test_commands_are_found_and_markers_are_well_formed():
    """The test sees the docs' commands (README's main job and its three uses, the pages in
    docs/'s subfolders, ...), every marker belongs to a block and says why a block is not run."""
    scripts = "".join(c.script for c in ALL_COMMANDS)
    for expected in ("cpulaunch python examples/infer.py", "cpulaunch --ddp --nproc-per-node 2 python examples/ddp_min.py",
                     "cpulaunch --print-env --ninstances 2 --instance-idx 1",
                     "cpulaunch doctor --strict", "torchrun --nproc-per-node 2 --no-python cpulaunch --ddp",
                     "cpulaunch --sysroot $DUMP --print-env --format omp-bind --instances-per-node"):
        assert expected in scripts, expected
    assert {p.parent.name for p in DOCS} >= {"guide", "reference", "dev"}, "the pages in docs/'s subfolders are read"
    grammar = re.compile(r"^(not run: .{10,}|long: .{10,}|exit \d+|output|varies: \S+)$")
    for b in ALL_BLOCKS:
        for item in b.marker:
            assert grammar.match(item), f"{b.path.relative_to(REPO)}:{b.line}: marker item {item!r} (say why it is not run)"
    for path in DOCS:
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines):
            if MARKER.match(line.strip()):
                nxt = next((x for x in lines[n + 1:] if x.strip()), "")
                assert FENCE.match(nxt), f"{path.relative_to(REPO)}:{n + 1}: a marker must come right before a block"


def test_a_varying_text_stands_for_one_word_only():
    """``varies: TEXT`` lets the marked text differ (another machine's library folder) and
    nothing else: a changed value elsewhere on the line, or a line more, still differs."""
    shown = ["export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "export OMP_NUM_THREADS=8"]
    arm = ["export LD_PRELOAD=/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4", "export OMP_NUM_THREADS=8"]
    assert shown_matches(shown, arm, ["/usr/lib/x86_64-linux-gnu"])
    assert not shown_matches(shown, arm, [])
    assert not shown_matches(shown, [arm[0], "export OMP_NUM_THREADS=7"], ["/usr/lib/x86_64-linux-gnu"])
    assert not shown_matches(shown, [arm[0].replace("minimal", "full"), arm[1]], ["/usr/lib/x86_64-linux-gnu"])
    assert not shown_matches(shown, [*arm, ""], ["/usr/lib/x86_64-linux-gnu"])
    assert not shown_matches(shown, ["export LD_PRELOAD=/a b/libtcmalloc_minimal.so.4", arm[1]],
                             ["/usr/lib/x86_64-linux-gnu"])


def test_no_command_hides_in_an_untagged_block():
    for b in ALL_BLOCKS:
        if b.lang or any(ln.startswith("$ ") for ln in b.lines):
            continue
        looks = [ln for ln in b.lines if COMMAND_LIKE.match(ln)]
        assert not looks, (f"{b.path.relative_to(REPO)}:{b.line}: {looks[0]!r} looks like a command in an untagged "
                           "block: put it in a ```sh block, prefix it with '$ ', or tag the block text")


# ------------------------------------------------------------------ running them


def _copy_checkout(dest: Path) -> Path:
    skip = shutil.ignore_patterns(".git", ".venv*", "__pycache__", ".pytest_cache", ".hypothesis",
                                  "*.egg-info", "build", "dist", "logs")
    shutil.copytree(REPO, dest, ignore=skip, symlinks=True)
    return dest


def _our_console_script(bindir: Path) -> bool:
    """True when ``bindir/cpulaunch`` runs this checkout's cpulaunch (an editable install
    of it, as scripts/test.sh makes)."""
    script = bindir / "cpulaunch"
    if not script.is_file():
        return False
    first = script.read_text(errors="replace").splitlines()[:1]
    python = first[0][2:].strip() if first and first[0].startswith("#!") else ""
    if not python or not os.access(python, os.X_OK):
        return False
    where = subprocess.run([python, "-c", "import cpulaunch, os; print(os.path.dirname(cpulaunch.__file__))"],
                           check=False, capture_output=True, text=True, cwd="/", timeout=60,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    return where.returncode == 0 and Path(where.stdout.strip()) == REPO / "cpulaunch"


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """(the checkout's copy, a user's environment) for the docs' commands."""
    copy = _copy_checkout(tmp_path_factory.mktemp("docs") / "checkout")
    bindir = Path(sys.executable).parent
    path = [str(bindir)]
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "LD_PRELOAD", "MALLOC_CONF", "PYTHONPATH")
           and not k.startswith(("CPULAUNCH_", "OMP_", "KMP_", "GOMP_"))}
    if not _our_console_script(bindir):  # e.g. the tests run outside scripts/test.sh's .venv
        wrappers = tmp_path_factory.mktemp("bin")
        (wrappers / "cpulaunch").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m cpulaunch \"$@\"\n")
        (wrappers / "cpulaunch").chmod(0o755)
        path.insert(0, str(wrappers))
        env["PYTHONPATH"] = str(REPO)
    env["PATH"] = os.pathsep.join(path + [os.environ.get("PATH", "")])
    env["DUMP"] = DUMP
    subprocess.run(["bash", "-c", UNPACK], cwd=copy, env=env, check=True, timeout=120)
    return copy, env


def _left_in(folder: Path) -> list:
    """PIDs of the processes whose working folder is ``folder`` (the commands' own)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")) == folder:
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


def _cmdline(pid: int) -> str:
    """What process ``pid`` runs and who started it, for a message."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        return f"{argv[:200]} (parent {ppid})"
    except OSError:
        return "(gone)"


def _stop(pgid: int, proc: subprocess.Popen) -> None:
    """SIGTERM to the command's process group (a benchmark or tune then stops what it
    started, as on Ctrl-C), SIGKILL 30 s later if it is still there (examples/ray_train.py's
    clean-up alone may take 20 s on a loaded machine: ray.shutdown(), 5 s, then kills)."""
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 15.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            proc.poll()  # reap the leader: a zombie still counts as a member of the group
            time.sleep(0.05)


def _run(cmd: Command, cwd: Path, env: dict, window: float | None):
    """Run it in its own session; returns (exit code or None if still running at the end
    of ``window``, stdout, stderr). Its process group is stopped afterwards, and nothing
    it started may be left running in its folder."""
    shell = ["bash", "-e", "-o", "pipefail", "-c", cmd.script] if cmd.block.lang in SHELLS else \
        ["bash", "-c", cmd.script]
    proc = subprocess.Popen(shell, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=window or TIMEOUT)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        if window is None:
            raise
        return None, "", ""
    finally:
        _stop(proc.pid, proc)
        proc.communicate()
        deadline = time.monotonic() + 15
        while _left_in(cwd) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = {pid: _cmdline(pid) for pid in _left_in(cwd)}
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, f"{cmd.where} left processes behind: {left}"


@pytest.mark.slow
@pytest.mark.parametrize("cmd", ALL_COMMANDS, ids=[c.where for c in ALL_COMMANDS])
def test_doc_command_runs_as_shown(cmd, user):
    why = _item(cmd.block, "not run")
    if why is not None:
        pytest.skip(f"not run: {why}")
    long = _item(cmd.block, "long")
    if long is not None and os.environ.get("CPULAUNCH_DOCS_LONG") == "0":
        pytest.skip(f"long ({long}) and CPULAUNCH_DOCS_LONG=0")
    if NEEDS_TORCH.search(cmd.script):
        pytest.importorskip("torch")
    if re.search(r"ray_train|bench_ray", cmd.script):
        pytest.importorskip("ray", reason="ray is not installed (scripts/test.sh installs it: pip install 'ray[train]')")
    if re.search(r"^\s*mpirun\b", cmd.script, re.MULTILINE) and shutil.which("mpirun") is None:
        pytest.skip("MPICH's mpirun is not installed (scripts/test.sh installs it as root)")
    copy, env = user
    t0 = time.monotonic()
    code, out, err = _run(cmd, copy, env, LONG_WINDOW if long is not None else None)
    if code is None:  # still running at the end of the window, as a long command should
        assert time.monotonic() - t0 >= LONG_WINDOW
        return
    expected = int(_item(cmd.block, "exit") or 0)
    assert code == expected, f"{cmd.where}: exit {code}, expected {expected}\n{cmd.script}\n{err[-3000:]}"
    assert "Traceback (most recent call last)" not in err, err[-3000:]
    if "output" in cmd.block.marker and cmd.shown:
        printed = out.rstrip("\n").splitlines()
        assert shown_matches(cmd.shown, printed, varies(cmd.block)), (
            f"{cmd.where}: output differs (marked as varying: {varies(cmd.block)})\n" + "\n".join(printed))
