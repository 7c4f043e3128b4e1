"""Run tests as if this machine had another CPU: a fixture dump's ``/proc/cpuinfo`` is bound
over the real one in a private mount namespace, for the tests and everything they start.

    python scripts/suite_as_cpu.py hw-32intel64-2p8co2t+8ve -- tests/test_platform.py -q
    python scripts/suite_as_cpu.py --list

The suite must pass on every vendor the project runs on (Intel, AMD, Arm): tests that
depend on the vendor or the ISA read ``/proc/cpuinfo`` and assert what is right for it.
This shows it on one machine: the fixture's first CPU entry (vendor, family, model, flags)
is written once per logical CPU this machine has (so the processor count stays this
machine's), bound over ``/proc/cpuinfo`` with ``unshare -m`` and ``mount --bind`` (root
only), and ``python -m pytest ARGS`` runs inside with this interpreter. What the real CPU
executes is unchanged: a test that runs bf16 kernels because the fake flags claim them
would still run them on this CPU; cpulaunch's own decisions (recipe, ``--amp``, doctor's
ISA line) follow the fake flags, which is what such a run checks.

Exit code: pytest's; 2 for a wrong fixture name or when not root.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"


def fixture_cpuinfo(name: str) -> str:
    """The ``proc/cpuinfo`` text inside fixture ``name``'s tarball ("" when it has none)."""
    for tarball in sorted((FIXTURES / name).glob("*.tar.bz2")):
        with tarfile.open(tarball) as tar:
            for member in tar.getmembers():
                if member.name.endswith("/proc/cpuinfo") and member.isfile():
                    return tar.extractfile(member).read().decode(errors="replace")
    return ""


def as_this_machine(text: str, cpus) -> str:
    """The fixture's first CPU entry written once per logical CPU id in ``cpus`` (this
    machine's online CPUs), each with its own ``processor`` line; any lines after the
    entries (Arm's ``Hardware``, ``Revision``) kept once at the end."""
    blocks = [b for b in text.split("\n\n") if b.strip()]
    entries = [b for b in blocks if re.match(r"processor\s*:", b)]
    rest = [b for b in blocks if not re.match(r"processor\s*:", b)]
    first = entries[0] if entries else ""
    out = [re.sub(r"^processor\s*:.*$", f"processor\t: {cpu}", first, count=1, flags=re.M) for cpu in cpus]
    return "\n\n".join(out + rest) + "\n\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fixture", nargs="?", help="a folder name under tests/fixtures")
    parser.add_argument("--list", action="store_true", help="list the fixtures with a /proc/cpuinfo and their CPU")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments")
    args = parser.parse_args(argv)
    if args.list:
        for folder in sorted(p for p in FIXTURES.iterdir() if p.is_dir()):
            text = fixture_cpuinfo(folder.name)
            model = re.search(r"^(model name|CPU implementer)\s*:\s*(.*)$", text, re.M)
            if model:
                print(f"{folder.name}: {model.group(2)}")
        return 0
    text = fixture_cpuinfo(args.fixture or "")
    if not text:
        print(f"suite_as_cpu: no /proc/cpuinfo in tests/fixtures/{args.fixture}: see --list", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("suite_as_cpu: needs root (a private mount namespace and a bind mount)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="suite-as-cpu-") as tmp:
        fake = Path(tmp) / "cpuinfo"
        fake.write_text(as_this_machine(text, sorted(os.sched_getaffinity(0) | _online())))
        script = 'mount --bind "$0" /proc/cpuinfo && exec "$@"'
        cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(fake),
               sys.executable, "-m", "pytest", *args.pytest_args]
        return subprocess.run(cmd, cwd=REPO).returncode


def _online() -> set:
    """This machine's online logical CPU ids (sysfs' ``online`` list)."""
    sys.path.insert(0, str(REPO))
    from cpulaunch import cpulist

    return set(cpulist.parse(Path("/sys/devices/system/cpu/online").read_text().strip()))


if __name__ == "__main__":
    sys.exit(main())
