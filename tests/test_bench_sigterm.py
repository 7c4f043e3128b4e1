"""A benchmark stopped with SIGTERM (``kill``, or test_docs_commands.py ending a long one)
ends as on Ctrl-C and removes the scratch folders it made (benchkit.exit_on_sigterm): killed
outright, every bench_startup.py run left an 8192-CPU tree of 83,000 inodes in /dev/shm."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

from conftest import REPO, default_signals

PREFIX = "cpulaunch-bench-startup-"


def scratch_folders() -> set:
    """bench_startup.py's scratch folders now present (bigtree.scratch_dir: /dev/shm when
    writable, else the temporary folder)."""
    return {p for base in ("/dev/shm", tempfile.gettempdir()) for p in glob.glob(os.path.join(base, PREFIX + "*"))}


def test_bench_startup_removes_its_trees_on_sigterm():
    before = scratch_folders()
    proc = subprocess.Popen([sys.executable, "scripts/bench_startup.py", "--quick", "--no-run-cpu"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    try:
        deadline = time.monotonic() + 60
        while not scratch_folders() - before and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # polls for the folder to appear, an observable state
        made = scratch_folders() - before
        assert made, ("the benchmark made no scratch folder", proc.poll())
        assert proc.poll() is None, "the benchmark ended before it was stopped"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert not [p for p in made if os.path.exists(p)]
