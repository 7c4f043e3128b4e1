"""scripts/check_skips.py: a test skipped in every CI step's report fails CI (issue 20).

Real pytest runs of a small test file write the junit reports the script reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "check_skips.py"

TESTS = '''
import os, pytest
def test_runs(): pass
@pytest.mark.skipif(os.environ.get("STEP") != "b", reason="only in step b")
def test_only_b(): pass
@pytest.mark.skip(reason="never")
def test_never(): pass
@pytest.mark.skip(reason="not run: two machines")
def test_doc_on_two_machines(): pass
@pytest.mark.xfail(strict=True)
def test_known_bug(): assert 0
'''


def _report(tmp_path: Path, step: str) -> Path:
    (tmp_path / "test_sample.py").write_text(TESTS)
    out = tmp_path / f"{step}.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_sample.py", f"--junitxml={out}"], cwd=tmp_path,
                          capture_output=True, text=True, env={"STEP": step, "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _check(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True)


def test_a_test_skipped_in_every_step_fails_ci(tmp_path):
    a, b = _report(tmp_path, "a"), _report(tmp_path, "b")
    proc = _check(a, b)
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        "check_skips: 5 tests in 2 report(s); 2 skipped in every one",
        "  never run: test_sample::test_doc_on_two_machines",
        "  never run: test_sample::test_never"]


def test_a_test_run_in_one_step_passes_and_allow_names_the_rest(tmp_path):
    a, b = _report(tmp_path, "a"), _report(tmp_path, "b")
    assert _check(a).stdout.splitlines()[1:] == ["  never run: test_sample::test_doc_on_two_machines",
                                                 "  never run: test_sample::test_never",
                                                 "  never run: test_sample::test_only_b"]
    proc = _check(a, b, "--allow", "test_sample::test_never", "--allow-reason", "not run: ")
    assert proc.returncode == 0 and proc.stdout.endswith("; 0 skipped in every one\n")


def test_allow_reason_needs_the_reason_in_every_report(tmp_path):
    """--allow-reason PREFIX: skipped everywhere with a reason starting with PREFIX is allowed
    (the docs' "not run: WHY" commands); a test skipped for another reason is still named."""
    a, b = _report(tmp_path, "a"), _report(tmp_path, "b")
    proc = _check(a, b, "--allow-reason", "not run: ")
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[1:] == ["  never run: test_sample::test_never"]
    assert _check(a, b, "--allow-reason", "not run: three").stdout.splitlines()[1:] == [
        "  never run: test_sample::test_doc_on_two_machines", "  never run: test_sample::test_never"]


def test_only_reason_admits_one_skip_reason(tmp_path):
    """--only-reason TEXT=PREFIX (issue 33): test_only_b skips in step a with "only in step
    b"; admitted when that is the rule's reason, a failure naming the test and its reason
    when the rule admits another."""
    a, b = _report(tmp_path, "a"), _report(tmp_path, "b")
    allow = ["--allow", "test_sample::test_never", "--allow-reason", "not run: "]
    ok = _check(a, b, *allow, "--only-reason", "test_only_b=only in step")
    assert ok.returncode == 0, ok.stdout
    bad = _check(a, b, *allow, "--only-reason", "test_only_b=zentorch does not import here")
    assert bad.returncode == 1
    assert bad.stdout.splitlines() == [
        "check_skips: 5 tests in 2 report(s); 0 skipped in every one; 1 skipped for a reason not admitted",
        "  skipped for another reason: test_sample::test_only_b: only in step b"]
    assert _check(a, "--only-reason", "no-equals-sign").returncode == 2
