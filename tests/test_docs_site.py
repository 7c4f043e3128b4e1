"""The documentation site builds strictly, and the docs keep their rules.

``mkdocs build --strict`` (mkdocs.yml at the top of the repository) fails on a broken link,
a link to a missing anchor, a page left out of the navigation and an API entry
(mkdocstrings) that does not resolve; the site is built into a temporary folder. Beside it:
the user guide and the reference name no test and no issue (those belong to the
development notes), and no file of the repository names a file outside it.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from conftest import REPO

GUIDE = [REPO / "docs" / "index.md", *sorted((REPO / "docs" / "guide").glob("*.md")),
         *sorted((REPO / "docs" / "reference").glob("*.md"))]


def _missing_builder() -> str | None:
    for module, package in (("mkdocs", "mkdocs"), ("material", "mkdocs-material"),
                            ("mkdocstrings_handlers.python", "mkdocstrings[python]")):
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            found = None
        if found is None:
            return package
    return None


def test_the_site_builds_strictly(tmp_path):
    missing = _missing_builder()
    if missing:
        pytest.skip(f"{missing} is not installed (pip install -e '.[docs]'; scripts/test.sh installs it)")
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    api = (site / "reference" / "api" / "index.html").read_text()
    for name in ("cpulaunch.api.plan_instances", "cpulaunch.runtime.bind.bind_current_process",
                 "cpulaunch.runtime.ddp.wrap_ddp", "cpulaunch.runtime.inference.optimize"):
        assert f'id="{name}"' in api, f"the API page lacks {name}: mkdocstrings rendered nothing"


def test_the_strict_build_fails_on_a_broken_link(tmp_path):
    """The check above can fail: a copy of the docs with one link to a missing page does not build."""
    missing = _missing_builder()
    if missing:
        pytest.skip(f"{missing} is not installed (pip install -e '.[docs]'; scripts/test.sh installs it)")
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copytree(REPO / "cpulaunch", copy / "cpulaunch", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "guide" / "quick-start.md"
    page.write_text(page.read_text() + "\n[gone](no-such-page.md)\n")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=copy, capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)})
    assert proc.returncode != 0 and "no-such-page.md" in proc.stderr, proc.stderr[-3000:]


def test_the_guide_and_reference_name_no_test_and_no_issue():
    """Test names, test files and issue numbers are for developers: docs/dev/ holds them."""
    pattern = re.compile(r"\btest_\w+|\btests/test_|\bissue \d+|\bissue #\d+", re.IGNORECASE)
    found = []
    for path in GUIDE:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


def test_no_file_names_a_file_outside_the_repository():
    """Facts measured elsewhere are restated in the project's own docs, with how they were measured."""
    outside = ("PLATFORM" + ".md", "../" + "shared")
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the repository's files are those git lists")
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    found = []
    for name in filter(None, files):
        path = REPO / name
        if not path.is_file() or path.suffix in (".bz2", ".gz", ".png", ".whl"):
            continue
        text = path.read_bytes().decode("utf-8", "replace")
        found += [f"{name}: {word}" for word in outside if word in text]
    assert not found, found


def test_the_options_page_keeps_its_generated_block():
    """docs/reference/options.md's table is made from the option table in the code, between two markers."""
    text = (REPO / "docs" / "reference" / "options.md").read_text()
    begin, end = text.find("<!-- options-table:begin"), text.find("<!-- options-table:end -->")
    assert 0 <= begin < end, "the markers of the generated block are missing or out of order"
    assert "| `--ninstances` |" in text[begin:end]


def test_readme_links_lead_somewhere():
    """README.md is not part of the site (a repository's front page), so mkdocs does not check
    its links: every relative link must name a file or folder of the repository."""
    text = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    relative = [link.split("#", 1)[0] for link in links if not re.match(r"^[a-z]+:|^#", link)]
    assert "docs/guide/quick-start.md" in relative
    missing = [link for link in relative if not (REPO / link).exists()]
    assert not missing, missing
