"""The preloadable libraries as data, and the search for them on this host.

Each :class:`Library` lists its file names (versioned ones first: Debian ships
``libjemalloc.so.2`` and ``libtcmalloc.so.4`` without the unversioned link unless the -dev
package is installed), the environment it wants and how to install it. Help text and
click choices are generated from :data:`REGISTRY`.

Search order (first hit wins): ``sys.prefix/lib`` (where ``pip install intel-openmp``
puts ``libiomp5.so``), ``$CONDA_PREFIX/lib``, ``$VIRTUAL_ENV/lib``, ``$LD_LIBRARY_PATH``,
``ldconfig -p``, then the multiarch folders. A hit must be a loadable ELF shared object
for this machine (class and ``e_machine`` checked), so a 32-bit or foreign-arch file
is passed over.
"""

from __future__ import annotations

import os
import platform
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

__all__ = ["Library", "REGISTRY", "ALLOCATORS", "OPENMP", "search_dirs", "find", "is_loadable_elf"]


@dataclass(frozen=True)
class Library:
    """A preloadable library.

    Attributes:
        name: registry key and CLI choice ("jemalloc", "tcmalloc", "iomp5").
        kind: "allocator" or "openmp".
        filenames: file names to look for, preferred first.
        env: environment variables it wants when preloaded.
        install: how to get it on Debian/Ubuntu and from PyPI.
        marker: substring identifying the library in a path (LD_PRELOAD, /proc/self/maps).
    """

    name: str
    kind: str
    filenames: tuple
    install: str
    marker: str
    env: Mapping[str, str] = field(default_factory=dict)


REGISTRY: dict = {
    lib.name: lib
    for lib in (
        Library(
            name="tcmalloc",
            kind="allocator",
            filenames=(
                "libtcmalloc.so.4",
                "libtcmalloc_minimal.so.4",
                "libtcmalloc.so",
                "libtcmalloc_minimal.so",
            ),
            install="apt-get install libtcmalloc-minimal4 (or libgoogle-perftools4)",
            marker="libtcmalloc",
        ),
        Library(
            name="jemalloc",
            kind="allocator",
            filenames=("libjemalloc.so.2", "libjemalloc.so"),
            install="apt-get install libjemalloc2",
            marker="libjemalloc",
            # The PyTorch CPU performance tuning guide's setting.
            env={
                "MALLOC_CONF": "oversize_threshold:1,background_thread:true,metadata_thp:auto,"
                "dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000"
            },
        ),
        Library(
            name="iomp5",
            kind="openmp",
            filenames=("libiomp5.so",),
            install="pip install intel-openmp (puts libiomp5.so in sys.prefix/lib)",
            marker="libiomp5",
        ),
    )
}

ALLOCATORS = tuple(n for n, lib in REGISTRY.items() if lib.kind == "allocator")
OPENMP = tuple(n for n, lib in REGISTRY.items() if lib.kind == "openmp")

# e_machine values (System V ABI / elf.h) for the machines we may run on.
_E_MACHINE = {"x86_64": 62, "aarch64": 183, "ppc64le": 21, "ppc64": 21, "s390x": 22, "riscv64": 243, "i686": 3}


def is_loadable_elf(path: os.PathLike, machine: Optional[str] = None) -> bool:
    """True if ``path`` is an ELF shared object (ET_DYN) for this machine's class and arch.

    Args:
        path: file to check.
        machine: ``platform.machine()`` value to check against (default: this host).
    """
    machine = machine or platform.machine()
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return False
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return False
    elf_class, data = head[4], head[5]
    want_class = 2 if sys.maxsize > 2**32 else 1
    if elf_class != want_class:
        return False
    endian = "<" if data == 1 else ">"
    e_type, e_machine = struct.unpack(endian + "HH", head[16:20])
    if e_type != 3:  # ET_DYN
        return False
    want = _E_MACHINE.get(machine)
    return want is None or e_machine == want


def search_dirs(environ: Mapping[str, str], prefix: str = sys.prefix) -> list:
    """Folders searched before ``ldconfig -p``, in order (pure)."""
    dirs = [Path(prefix) / "lib"]
    for var in ("CONDA_PREFIX", "VIRTUAL_ENV"):
        if environ.get(var):
            dirs.append(Path(environ[var]) / "lib")
    dirs += [Path(p) for p in environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    return dirs


def multiarch_dirs(machine: Optional[str] = None) -> list:
    """The system library folders of Debian-style multiarch and the classic ones."""
    machine = machine or platform.machine()
    return [
        Path(f"/usr/lib/{machine}-linux-gnu"),
        Path(f"/lib/{machine}-linux-gnu"),
        Path("/usr/lib64"),
        Path("/usr/lib"),
        Path("/usr/local/lib"),
        Path("/lib64"),
        Path("/lib"),
    ]


def parse_ldconfig(text: str) -> dict:
    """``ldconfig -p`` output -> {file name: path}, first entry for this arch wins.

    ``"\\tlibjemalloc.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libjemalloc.so.2"``
    -> ``{"libjemalloc.so.2": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}``.
    """
    out: dict = {}
    for line in text.splitlines():
        if "=>" not in line:
            continue
        left, right = line.split("=>", 1)
        name = left.strip().split(" ")[0]
        out.setdefault(name, right.strip())
    return out


def _ldconfig() -> dict:
    exe = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if not exe:
        return {}
    try:
        res = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_ldconfig(res.stdout) if res.returncode == 0 else {}


def find(
    lib: Library,
    environ: Optional[Mapping[str, str]] = None,
    prefix: str = sys.prefix,
    extra_dirs: Sequence[os.PathLike] = (),
) -> Optional[Path]:
    """Locate ``lib`` on this host (touches the file system; see module doc for the order).

    Returns the path of the first loadable match, or None.
    """
    environ = os.environ if environ is None else environ
    dirs = [Path(d) for d in extra_dirs] + search_dirs(environ, prefix)
    for name in lib.filenames:
        for d in dirs:
            p = d / name
            if p.is_file() and is_loadable_elf(p):
                return p
    cache = _ldconfig()
    for name in lib.filenames:
        p = cache.get(name)
        if p and is_loadable_elf(p):
            return Path(p)
    for name in lib.filenames:
        for d in multiarch_dirs():
            p = d / name
            if p.is_file() and is_loadable_elf(p):
                return p
    return None


def preload_entries(value: str) -> list:
    """Split an LD_PRELOAD value into entries; ld.so(8) accepts spaces and colons."""
    return [e for e in value.replace(":", " ").split() if e]


def identify(entry: str) -> Optional[str]:
    """The registry name of a preload entry (path or bare name), e.g. "jemalloc"."""
    base = os.path.basename(entry)
    for name, lib in REGISTRY.items():
        if base.startswith(lib.marker):
            return name
    return None
