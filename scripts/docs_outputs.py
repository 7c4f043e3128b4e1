"""Record the output the docs show under their ``$`` commands again, from real runs.

    python scripts/docs_outputs.py            # every block marked <!-- commands: output -->
    python scripts/docs_outputs.py docs/guide/shell-scripts.md   # only these files
    python scripts/docs_outputs.py --check    # list the blocks whose output differs

tests/test_docs_commands.py runs every command the docs show and, in blocks marked
``<!-- commands: output -->``, holds stdout to the lines shown under each ``$`` command.
When cpulaunch's output changes on purpose, this script runs those commands the way the
test does (in a copy of the checkout, with a user's environment, ``DUMP`` unpacked) and
writes what they print under each command. Read the diff before committing it: the docs
must show what a user sees, nothing of this machine that a user's would not print.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def user_environment(copy: Path) -> dict:
    """The environment the docs test gives the commands (its ``user`` fixture)."""
    import test_docs_commands as t

    bindir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "LD_PRELOAD", "MALLOC_CONF", "PYTHONPATH")
           and not k.startswith(("CPULAUNCH_", "OMP_", "KMP_", "GOMP_"))}
    env["PATH"] = os.pathsep.join([str(bindir), os.environ.get("PATH", "")])
    env["DUMP"] = t.DUMP
    subprocess.run(["bash", "-c", t.UNPACK], cwd=copy, env=env, check=True, timeout=120)
    return env


def main(argv=None) -> int:
    import test_docs_commands as t

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md and docs/)")
    ap.add_argument("--check", action="store_true", help="only list the blocks that differ")
    args = ap.parse_args(argv)
    wanted = {p.resolve() for p in args.files} or None
    with tempfile.TemporaryDirectory() as tmp:
        copy = t._copy_checkout(Path(tmp) / "checkout")
        env = user_environment(copy)
        changed = 0
        for path in t.DOCS:
            if wanted and path.resolve() not in wanted:
                continue
            lines = path.read_text().splitlines()
            edits = []
            for block in t.read_blocks(path):
                if "output" not in block.marker or t._item(block, "not run") is not None:
                    continue
                for cmd in t.commands_of(block):
                    if not cmd.shown and not cmd.script.strip():
                        continue
                    code, out, err = t._run(cmd, copy, env, None)
                    got = out.rstrip("\n").splitlines()
                    if t.shown_matches(cmd.shown, got, t.varies(block)):
                        continue
                    print(f"{cmd.where}: output differs (exit {code})", flush=True)
                    edits.append((block, cmd, got))
            if edits and not args.check:
                for block, cmd, got in reversed(edits):
                    first = block.line + int(cmd.where.rsplit("+", 1)[1]) - 1  # the $ line, 0-based in lines
                    text = cmd.script.rstrip("\n").split("\n")
                    start = first + len(text)
                    lines[start:start + len(cmd.shown)] = got
                path.write_text("\n".join(lines) + "\n")
                changed += len(edits)
        print(f"{changed} block output(s) rewritten" if not args.check else "checked", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
