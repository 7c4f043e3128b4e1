"""Write the options reference (docs/reference/options.md, between its options-table
markers) from the option table in the code (cpulaunch.option_table.reference_markdown).

    python scripts/options_doc.py          # rewrite the block
    python scripts/options_doc.py --check  # exit 1 when the docs differ from the code
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "reference" / "options.md"
BEGIN = "<!-- options-table:begin (generated from the option table in the code: do not edit by hand) -->"
END = "<!-- options-table:end -->"


def block(text: str) -> tuple[int, int]:
    """Where the generated block's body starts and ends in ``text``."""
    return text.index(BEGIN) + len(BEGIN), text.index(END)


def main(argv=None) -> int:
    sys.path.insert(0, str(REPO))
    from cpulaunch.option_table import reference_markdown

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare")
    args = ap.parse_args(argv)
    text = DOC.read_text()
    start, end = block(text)
    new = text[:start] + "\n" + reference_markdown() + "\n" + text[end:]
    if args.check:
        return 0 if new == text else 1
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
