"""Fuzz the probe with corrupted copies of the fixture dumps (issue 8, "Corrupt or extreme
sysfs"): whatever a file holds, or whatever stands in its place, ``probe`` + ``plan``
either give a plan or raise a CpulaunchError whose message is one line, in bounded time;
through the real command that is exit code 2 and one line on stderr, no traceback.

Each machine is copied once per module (to tmpfs where there is one); an example changes
one to three files of a copy and puts them back afterwards, so examples stay cheap.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import bigtree
from conftest import run_cli
from cpulaunch import plan as plan_mod
from cpulaunch.machine import probe
from cpulaunch.machine.files import MAX_FILE_BYTES
from cpulaunch.errors import CpulaunchError

#: The dumps fuzzed: SMT + cgroup v1 (Xeon), cgroup v2 Slurm job with cpuset mems (AMD),
#: sparse and memory-only nodes (POWER9), no cpu/online and package -1 (POWER7).
FUZZED = ["hw-32intel64-2p8co2t+8ve", "hw-32amd64-4s2n4c-cgroup2", "hw-nvidiagpunumanodes",
          "hw-256ppc-8n8s4t"]

#: Files every machine is likely to have that decide the most (relative to the root).
KEY_FILES = [
    "sys/devices/system/cpu/online",
    "sys/devices/system/cpu/present",
    "sys/devices/system/cpu/possible",
    "sys/devices/system/cpu/kernel_max",
    "sys/devices/system/node/has_memory",
    "sys/devices/system/node/node0/cpulist",
    "sys/devices/system/node/node0/cpumap",
    "sys/devices/system/node/node0/meminfo",
    "sys/devices/system/cpu/cpu0/topology/thread_siblings_list",
    "sys/devices/system/cpu/cpu0/topology/thread_siblings",
    "sys/devices/system/cpu/cpu0/topology/physical_package_id",
    "sys/devices/system/cpu/cpu0/topology/core_id",
    "sys/devices/system/cpu/cpu1/topology/thread_siblings_list",
    "sys/devices/system/cpu/cpu1/online",
    "sys/devices/system/cpu/cpu2/topology/physical_package_id",
    "proc/self/cgroup",
    "proc/self/mounts",
    "proc/mounts",
    "proc/self/status",
    "proc/cpuinfo",
]

#: CPUs whose topology files may be corrupted (a few leaders and siblings of each dump).
FUZZED_CPUS = {"cpu0", "cpu1", "cpu2", "cpu3", "cpu16", "cpu88"}
NODE_FILES = {"cpulist", "cpumap", "meminfo"}

#: Names of cgroup files worth corrupting wherever they are in a dump.
CGROUP_NAMES = {"cpuset.cpus.effective", "cpuset.effective_cpus", "cpuset.cpus",
                "cpuset.mems.effective", "cpuset.effective_mems", "cpuset.mems", "cpu.max",
                "cpu.cfs_quota_us", "cpu.cfs_period_us"}

CONTENTS = st.one_of(
    st.sampled_from([
        b"", b"\n", b"\x00", b"\x00\x00\x00\n", b"1,,2\n", b"+1\n", b" 1\n", b"7-3\n",
        b"0-4294967295\n", b"0-99999999\n", b"70000\n", b"0-9000\n", b"-1\n", b"-5\n",
        b"\xff\xfe0-3\n", b"0-3\xff\n", b"\xd9\xa3\n",  # non-UTF-8 bytes, an Arabic-Indic 3
        b"ffffffff,ffffffff\n", b"zz\n", b"0x3\n", b"1e5\n", b"max\n", b"max 0\n",
        b"100000 100000\n", b"-1 100000\n", b"99999999999999999999999999\n",
        b"0-3:1/0\n", b"0-31:2/4\n", b"1_0\n", b"0,\n", b",\n", b"-\n", b"0-\n",
        b"MemTotal: 12 kB\n", b"Node 0 MemTotal: x kB\n",
        b"Cpus_allowed_list:\t0--3\nMems_allowed_list:\t9999\n",
        b"0::/../../..\n", b"0::/\x00x\n", b"cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n",
        ",".join(["ffffffff"] * 3000).encode() + b"\n",
        ("0," * 5000).encode() + b"0\n",
    ]),
    st.binary(max_size=48),
    st.integers(-(2 ** 70), 2 ** 70).map(lambda i: b"%d\n" % i),
    st.tuples(st.integers(0, 20000), st.integers(0, 20000)).map(lambda r: b"%d-%d\n" % r),
)

KINDS = ["content"] * 6 + ["missing", "fifo", "folder", "device", "huge"]


@pytest.fixture(scope="module")
def fuzz_roots(sysroots):
    """{machine: (root copy, [candidate relative file paths])}, copied once per module."""
    base = Path(bigtree.scratch_dir("cpulaunch-fuzz-"))
    try:
        out = {}
        for machine in FUZZED:
            dest = base / machine
            shutil.copytree(sysroots[machine], dest, symlinks=True)
            candidates = {k for k in KEY_FILES if (dest / k).is_file()}
            for dirpath, _dirs, files in os.walk(dest):
                rel_dir = os.path.relpath(dirpath, dest)
                for name in files:
                    rel = os.path.join(rel_dir, name)
                    parts = rel.split("/")
                    if name in CGROUP_NAMES:
                        candidates.add(rel)
                    elif "topology" in parts and parts[4] in FUZZED_CPUS:
                        candidates.add(rel)  # a few CPUs' topology files (cpuN/topology/*)
                    elif rel.startswith("sys/devices/system/node/node") and name in NODE_FILES:
                        candidates.add(rel)
            out[machine] = (dest, sorted(candidates))
        yield out
    finally:
        shutil.rmtree(base, ignore_errors=True)


class _Saved:
    """What stood at a path before an example changed it, to put it back."""

    def __init__(self, path: Path):
        self.path = path
        self.link = os.readlink(path) if path.is_symlink() else None
        self.data = path.read_bytes() if self.link is None and path.is_file() else None
        self.mode = path.stat().st_mode if self.data is not None else None

    def clear(self) -> None:
        p = self.path
        if p.is_symlink() or (p.exists() and not p.is_dir()):
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)

    def restore(self) -> None:
        self.clear()
        if self.link is not None:
            os.symlink(self.link, self.path)
        elif self.data is not None:
            self.path.write_bytes(self.data)
            os.chmod(self.path, stat.S_IMODE(self.mode))


def corrupt(path: Path, kind: str, data: bytes) -> None:
    """Put ``kind`` at ``path`` (a changed file, nothing, a FIFO, a folder, a device, or a
    file over the probe's size bound)."""
    _Saved(path).clear()
    if kind == "content":
        path.write_bytes(data)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
        (path / "x").write_bytes(b"1\n")
    elif kind == "device":
        os.symlink("/dev/zero", path)  # a character device, endless if read
    elif kind == "huge":
        path.write_bytes(b"0," * (MAX_FILE_BYTES // 2 + 1) + b"0\n")


class _Alarm(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Alarm()


def check_probe_and_plan(root: Path) -> str:
    """Probe and plan ``root``; returns "plan" or the error's class name. Fails the test
    on any other exception, a message that is not one line, or a run over the bound."""
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(30)  # a blocking read must fail the example, not hang the suite
    start = time.monotonic()
    try:
        topo = probe.probe(root)
        plan_mod.plan(topo, plan_mod.Request())
        outcome = "plan"
    except CpulaunchError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg and "\r" not in msg, repr(msg)
        assert len(msg) < 2000, len(msg)
        assert "Traceback" not in msg
        outcome = type(exc).__name__
    except _Alarm:
        pytest.fail(f"probe/plan of {root} blocked for 30 s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    elapsed = time.monotonic() - start
    assert elapsed < 5.0, f"probe/plan took {elapsed:.1f} s"
    return outcome


@settings(max_examples=int(os.environ.get("CPULAUNCH_FUZZ_EXAMPLES", "200")), deadline=None,
          derandomize="CPULAUNCH_FUZZ_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_corrupted_dumps_give_a_plan_or_one_line_error(fuzz_roots, data):
    machine = data.draw(st.sampled_from(FUZZED), label="machine")
    root, candidates = fuzz_roots[machine]
    picks = data.draw(st.lists(st.one_of(st.sampled_from([k for k in KEY_FILES if k in candidates]),
                                         st.sampled_from(candidates)),
                               min_size=1, max_size=3), label="files")
    picks = list(dict.fromkeys(picks))
    saved = []
    try:
        for rel in picks:
            kind = data.draw(st.sampled_from(KINDS), label=f"kind of {rel}")
            content = data.draw(CONTENTS, label=f"content of {rel}") if kind == "content" else b""
            saved.append(_Saved(root / rel))
            corrupt(root / rel, kind, content)
        event(check_probe_and_plan(root))
    finally:
        for s in reversed(saved):
            s.restore()


def test_the_untouched_copies_still_plan(fuzz_roots):
    """The fixture restored after each example: every copy still gives a plan."""
    for machine, (root, _) in fuzz_roots.items():
        assert check_probe_and_plan(root) == "plan", machine


# --------------------------------------------------------------------------- the real command


CLI_CASES = {
    "online-empty-item": ("sys/devices/system/cpu/online", "content", b"1,,2\n"),
    "online-fifo": ("sys/devices/system/cpu/online", "fifo", b""),
    "node-huge-range": ("sys/devices/system/node/node0/cpulist", "content", b"0-4294967295\n"),
    "siblings-folder": ("sys/devices/system/cpu/cpu0/topology/thread_siblings_list", "folder", b""),
    "cpuset-not-utf8": ("sys/fs/cgroup/cpuset/cpuset.effective_cpus", "content", b"\xff\xfe\n"),
    "package-device": ("sys/devices/system/cpu/cpu0/topology/physical_package_id", "device", b""),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_cli_on_a_corrupt_dump_exits_2_with_one_line(fuzz_roots, case):
    rel, kind, data = CLI_CASES[case]
    root, _ = fuzz_roots["hw-32intel64-2p8co2t+8ve"]
    saved = _Saved(root / rel)
    try:
        corrupt(root / rel, kind, data)
        proc = run_cli("--sysroot", str(root), "--dry-run", "true", check_rc=None, timeout=30)
    finally:
        saved.restore()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"cpulaunch: error: /{rel}: "), lines[0]
    assert lines[0].endswith(f"; the tree under --sysroot {root} is corrupt or not a Linux dump")
