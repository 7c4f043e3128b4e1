"""No test is skipped in every configuration CI runs (issue 20; threadpoolctl's CI does the same).

Each CI step runs pytest with ``--junitxml=FILE``; this script reads those files and fails
(exit 1) when a test that appears in at least one of them was skipped in every one where it
appears: a test that never runs anywhere is a test that cannot fail. An xfail counts as run
(it ran and failed as expected). A test no step selects (``-m``/``-k``) appears in no file
and is not judged here: that choice is written in .ci/run.

    python scripts/check_skips.py reports/*.xml
    python scripts/check_skips.py reports/*.xml --allow 'tests.test_ccl::test_real_'

``--allow TEXT`` (repeatable) names tests that cannot run on a CI machine, each with its
reason beside it in .ci/run (for example a binding that may not be built there).
``--allow-reason PREFIX`` (repeatable) allows the tests whose skip reason starts with PREFIX
in every report: the docs' commands marked ``<!-- commands: not run: WHY -->`` skip with
"not run: WHY" on every machine by design, and each says why in the docs themselves.

``--only-reason TEXT=PREFIX`` (repeatable) admits one skip reason for the tests whose id
contains TEXT: where such a test skips (in any report) its reason must start with PREFIX, or
the check fails. tests/test_zentorch.py's real-zentorch tests skip on every torch but
zentorch's (.ci/run's zentorch step runs them) with "zentorch does not import here", and
with nothing else.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from typing import Optional


def outcomes(paths: list[str]) -> dict[str, list[Optional[str]]]:
    """{test id: [None if it ran, else its skip reason] per report holding it}; test id is
    ``file::name`` built from the junit ``classname`` (dotted module path, then class) and
    ``name``. An xfail counts as run."""
    seen: dict[str, list[Optional[str]]] = defaultdict(list)
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
            skipped = case.find("skipped")
            ran = skipped is None or skipped.get("type") == "pytest.xfail"
            seen[test_id].append(None if ran else skipped.get("message", ""))
    return seen


def never_run(seen: dict[str, list[Optional[str]]], allow: list[str], allow_reason: list[str] = ()) -> list[str]:
    """Test ids skipped in every report that holds them, minus those containing one of the
    ``allow`` strings (ids look like ``tests.test_ccl::test_real_run[2]``) and those whose
    skip reason starts with one of ``allow_reason`` in every report."""
    return sorted(t for t, reasons in seen.items()
                  if all(r is not None for r in reasons) and not any(a in t for a in allow)
                  and not all(any(r.startswith(p) for p in allow_reason) for r in reasons))


def wrong_reasons(seen: dict[str, list[Optional[str]]], only: list[str]) -> list[str]:
    """``"test id: reason"`` for each skip of a test named by an ``only`` rule
    (``"TEXT=PREFIX"``) whose reason does not start with PREFIX."""
    rules = [rule.split("=", 1) for rule in only]
    out = []
    for test_id, reasons in sorted(seen.items()):
        for text, prefix in rules:
            if text in test_id:
                out += [f"{test_id}: {r}" for r in reasons if r is not None and not r.startswith(prefix)]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("reports", nargs="+", help="junit XML files, one per CI step")
    p.add_argument("--allow", action="append", default=[], metavar="TEXT",
                   help="tests allowed to be skipped everywhere (say why in .ci/run)")
    p.add_argument("--allow-reason", action="append", default=[], metavar="PREFIX",
                   help="tests allowed to be skipped everywhere with a reason starting with PREFIX")
    p.add_argument("--only-reason", action="append", default=[], metavar="TEXT=PREFIX",
                   help="tests whose id contains TEXT may skip only with a reason starting with PREFIX")
    a = p.parse_args(argv)
    bad_rules = [r for r in a.only_reason if "=" not in r]
    if bad_rules:
        p.error(f"--only-reason {bad_rules[0]!r}: give TEXT=PREFIX")
    seen = outcomes(a.reports)
    bad = never_run(seen, a.allow, a.allow_reason)
    wrong = wrong_reasons(seen, a.only_reason)
    print(f"check_skips: {len(seen)} tests in {len(a.reports)} report(s); "
          f"{len(bad)} skipped in every one" + (f"; {len(wrong)} skipped for a reason not admitted" if wrong else ""))
    for test_id in bad:
        print(f"  never run: {test_id}")
    for line in wrong:
        print(f"  skipped for another reason: {line}")
    return 1 if bad or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
