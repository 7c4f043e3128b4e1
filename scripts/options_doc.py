"""Write the generated references: the options reference (docs/reference/options.md,
between its options-table markers) from the option table in the code
(cpulaunch.option_table.reference_markdown), and the environment reference
(docs/reference/environment.md, between its envvars-table markers) from
cpulaunch/envvars.py (cpulaunch.envvars.reference_markdown).

    python scripts/options_doc.py          # rewrite the blocks
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
ENV_DOC = REPO / "docs" / "reference" / "environment.md"
ENV_BEGIN = "<!-- envvars-table:begin (generated from cpulaunch/envvars.py: do not edit by hand) -->"
ENV_END = "<!-- envvars-table:end -->"


def block(text: str, begin: str = BEGIN, end: str = END) -> tuple[int, int]:
    """Where the generated block's body starts and ends in ``text``."""
    return text.index(begin) + len(begin), text.index(end)


def _rewritten(path: Path, begin: str, end: str, body: str) -> tuple[str, str]:
    """(the file's text, the text with its block made from ``body``)."""
    text = path.read_text()
    start, stop = block(text, begin, end)
    return text, text[:start] + "\n" + body + "\n" + text[stop:]


def main(argv=None) -> int:
    sys.path.insert(0, str(REPO))
    from cpulaunch import envvars, option_table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare")
    args = ap.parse_args(argv)
    differ = 0
    for path, begin, end, body in ((DOC, BEGIN, END, option_table.reference_markdown()),
                                   (ENV_DOC, ENV_BEGIN, ENV_END, envvars.reference_markdown())):
        text, new = _rewritten(path, begin, end, body)
        if new != text:
            differ = 1
            if not args.check:
                path.write_text(new)
    return differ if args.check else 0


if __name__ == "__main__":
    sys.exit(main())
