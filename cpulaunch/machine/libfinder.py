"""Finding the registry's libraries on this host (touches the file system; the registry itself,
:mod:`cpulaunch.machine.libraries`, is pure data).

Search order (first hit wins): ``sys.prefix/lib`` (where ``pip install intel-openmp``
puts ``libiomp5.so``), ``$CONDA_PREFIX/lib``, ``$VIRTUAL_ENV/lib``, ``$LD_LIBRARY_PATH``,
the folders of ``/etc/ld.so.conf`` and the multiarch folders, then ``ldconfig -p``. A hit
must be a loadable ELF shared object for this machine (class and ``e_machine`` checked),
so a 32-bit or foreign-arch file is passed over.

oneCCL's libfabric is looked for apart (:func:`find_libfabric`): only where Intel's wheels
and oneAPI put it, and only with its provider folder beside it (issue 21, docs/guide/ddp.md).
"""

from __future__ import annotations

import os
import sys

from cpulaunch.machine.exec import which
from cpulaunch.machine.libraries import REGISTRY, Library
from cpulaunch.records import TYPE_CHECKING, Record

if TYPE_CHECKING:
    from pathlib import Path
    from typing import Mapping, Optional, Sequence

__all__ = ["find", "is_loadable_elf", "search_dirs", "multiarch_dirs", "ld_so_conf_dirs", "glob_files",
           "parse_ldconfig", "Fabric", "fabric_dirs", "find_libfabric"]

#: Largest ``ldconfig -p`` output read (a few thousand libraries make a few hundred KiB).
LDCONFIG_BYTES = 8 << 20

# e_machine values (System V ABI / elf.h) for the machines we may run on.
_E_MACHINE = {"x86_64": 62, "aarch64": 183, "ppc64le": 21, "ppc64": 21, "s390x": 22, "riscv64": 243, "i686": 3}


def is_loadable_elf(path: os.PathLike, machine: Optional[str] = None) -> bool:
    """True if ``path`` is an ELF shared object (ET_DYN) for this machine's class and arch.

    Args:
        path: file to check.
        machine: ``os.uname().machine`` value to check against (default: this host; what
            ``platform.machine()`` returns, without importing platform on every run).
    """
    machine = machine or os.uname().machine
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
    order = "little" if data == 1 else "big"  # EI_DATA: ELFDATA2LSB, else ELFDATA2MSB
    e_type, e_machine = int.from_bytes(head[16:18], order), int.from_bytes(head[18:20], order)
    if e_type != 3:  # ET_DYN
        return False
    want = _E_MACHINE.get(machine)
    return want is None or e_machine == want


def search_dirs(environ: Mapping[str, str], prefix: str = sys.prefix) -> list[str]:
    """Folders searched before ``ldconfig -p``, in order (pure). Paths are ``str`` here, as
    in the rest of the run path: pathlib's import (with urllib.parse and ipaddress) cost each
    run about 4 ms (issue 40)."""
    dirs = [os.path.join(prefix, "lib")]
    for var in ("CONDA_PREFIX", "VIRTUAL_ENV"):
        if environ.get(var):
            dirs.append(os.path.join(environ[var], "lib"))
    dirs += [p for p in environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    return dirs


def multiarch_dirs(machine: Optional[str] = None) -> list[str]:
    """The system library folders of Debian-style multiarch and the classic ones."""
    machine = machine or os.uname().machine
    return [f"/usr/lib/{machine}-linux-gnu", f"/lib/{machine}-linux-gnu", "/usr/lib64", "/usr/lib",
            "/usr/local/lib", "/lib64", "/lib"]


def parse_ldconfig(text: str) -> dict[str, str]:
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
    """``ldconfig -p`` parsed (a fallback only, when no folder held the library)."""
    from cpulaunch.machine.exec import run_quietly

    exe = which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if not exe:
        return {}
    try:
        code, out = run_quietly([exe, "-p"], timeout=10, stderr=False, max_output=LDCONFIG_BYTES)
    except (OSError, TimeoutError):
        return {}
    return parse_ldconfig(out) if code == 0 else {}


def ld_so_conf_dirs(path: str = "/etc/ld.so.conf", _depth: int = 0) -> list[str]:
    """Folders named by ``/etc/ld.so.conf`` and its ``include`` globs (ldconfig(8)), in order.

    Reading them is what ``ldconfig -p`` would tell, without starting a process on every
    launch. Unreadable files give no folders.
    """
    out: list = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("include") and _depth < 4:
            pattern = line.split(None, 1)[1] if " " in line or "\t" in line else ""
            if pattern and not os.path.isabs(pattern):
                pattern = os.path.join(os.path.dirname(path), pattern)
            for inc in sorted(glob_files(pattern)):
                out += ld_so_conf_dirs(inc, _depth + 1)
        elif line.startswith("/"):
            out.append(line)
    return out


def glob_files(pattern: str) -> list[str]:
    """The paths ``glob.glob(pattern)`` gives (unsorted), for ld.so.conf's ``include`` lines
    (``/etc/ld.so.conf.d/*.conf``): when only the last component holds wildcards, its
    folder's entries that :func:`fnmatch.fnmatch` the pattern, hidden ones only for a
    pattern that starts with a dot, as glob's own loop does (a name with one ``*`` and no
    other wildcard, ``*.conf``, by its head and tail, without fnmatch, which imports re).
    Otherwise :func:`glob.glob` itself. Ours for that common case because importing glob
    (and the contextlib it imports) costs every run about 2 ms (issue 40);
    ``tests/test_exec.py`` holds the two equal.

    Args:
        pattern: a path with shell wildcards (``*``, ``?``, ``[...]``).
    """
    folder, name = os.path.split(pattern)
    if any(c in folder for c in "*?["):
        import glob

        return glob.glob(pattern)
    if not any(c in name for c in "*?["):  # no wildcard at all: the path, if it is there
        there = os.path.lexists(pattern) if name else os.path.isdir(folder)
        return [pattern] if there else []
    try:
        names = os.listdir(folder or os.curdir)
    except OSError:
        return []
    if name[0] != ".":
        names = [n for n in names if n[0] != "."]
    head, star, tail = name.partition("*")
    if star and not any(c in head + tail for c in "*?["):  # "*.conf": one star, no other wildcard
        least = len(head) + len(tail)
        return [os.path.join(folder, n) for n in names if len(n) >= least and n.startswith(head) and n.endswith(tail)]
    import fnmatch  # which imports re (issue 40)

    return [os.path.join(folder, n) for n in fnmatch.filter(names, name)]


def _first_in(dirs, names) -> Optional[str]:
    for name in names:
        for d in dirs:
            p = os.path.join(d, name)
            if os.path.isfile(p) and is_loadable_elf(p):
                return p
    return None


def find(
    lib: Library,
    environ: Optional[Mapping[str, str]] = None,
    prefix: str = sys.prefix,
    extra_dirs: Sequence[os.PathLike] = (),
    use_ldconfig: bool = True,
) -> Optional[str]:
    """Locate ``lib`` on this host (touches the file system; see module doc for the order).

    The environment's folders first, then the folders of ``/etc/ld.so.conf`` and the
    multiarch folders (no subprocess); ``ldconfig -p`` is asked only when none of those
    holds the library (a cache in an unusual place).

    Returns the path of the first loadable match, or None (always None for a library
    with no file names, such as torch's bundled libgomp).
    """
    if not lib.filenames:
        return None
    environ = os.environ if environ is None else environ
    dirs = [os.fspath(d) for d in extra_dirs] + search_dirs(environ, prefix)
    hit = _first_in(dirs, lib.filenames) or _first_in(multiarch_dirs() + ld_so_conf_dirs(), lib.filenames)
    if hit is not None or not use_ldconfig:
        return hit
    cache = _ldconfig()
    for name in lib.filenames:
        p = cache.get(name)
        if p and is_loadable_elf(p):
            return p
    return None


# --------------------------------------------------------------------------- oneCCL's libfabric


class Fabric(Record):
    """libfabric as oneCCL needs it (:func:`find_libfabric`).

    Attributes:
        library: ``libfabric.so.1``, a loadable ELF shared object for this machine; None
            when no searched folder holds one.
        providers: the provider folder beside it (``prov``, holding at least one loadable
            ``lib*-fi.so``); None when the library found has none. impi-rt's libfabric has
            no provider built in: without ``FI_PROVIDER_PATH`` at this folder oneCCL's first
            collective fails with "can't find suitable provider" (docs/guide/ddp.md).
        searched: the folders looked in, in order (for messages).
    """

    library: Optional[Path]
    providers: Optional[Path]
    searched: tuple[Path, ...] = ()

    @property
    def usable(self) -> bool:
        """Both the library and its providers were found."""
        return self.library is not None and self.providers is not None


def fabric_dirs(environ: Mapping[str, str], prefix: str = sys.prefix) -> list[Path]:
    """Folders that may hold oneCCL's libfabric, in order, each once (pure).

    ``<root>/lib/libfabric`` for the Python prefix, ``$CONDA_PREFIX``, ``$VIRTUAL_ENV``,
    ``$I_MPI_ROOT`` and ``$CCL_ROOT`` (where the impi-rt wheel puts it, measured here with
    impi-rt 2021.14.2; conda's activation scripts set the last two), then every
    ``$LD_LIBRARY_PATH`` folder as it is (oneAPI's ``setvars.sh`` puts its libfabric
    folder there). ``{"VIRTUAL_ENV": "/v"}``, prefix ``/p`` -> ``[/p/lib/libfabric,
    /v/lib/libfabric]``.
    """
    from pathlib import Path  # --ddp's oneCCL only: kept off the run path

    roots = [prefix] + [environ[v] for v in ("CONDA_PREFIX", "VIRTUAL_ENV", "I_MPI_ROOT", "CCL_ROOT")
                        if environ.get(v)]
    dirs = [Path(r) / "lib" / "libfabric" for r in roots]
    dirs += [Path(p) for p in environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    return list(dict.fromkeys(dirs))


def _has_provider(folder: Path) -> bool:
    """``folder`` holds a loadable libfabric provider (``lib<name>-fi.so``)."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return False
    return any(n.startswith("lib") and n.endswith("-fi.so") and os.path.isfile(folder / n)
               and is_loadable_elf(folder / n) for n in names)


def find_libfabric(environ: Optional[Mapping[str, str]] = None, prefix: str = sys.prefix) -> Fabric:
    """Find libfabric and its providers for oneCCL (touches the file system; no subprocess).

    Looks in :func:`fabric_dirs` for ``libfabric.so.1`` (ELF-checked, as every library of
    the registry) with a ``prov`` folder beside it holding a loadable ``lib*-fi.so``; the
    first folder that has both wins. A system libfabric elsewhere is not taken: the one
    that ran with oneCCL here is impi-rt's (docs/guide/ddp.md).

    Returns:
        a :class:`Fabric`; when no folder has both, the first library found (or None) and
        ``providers`` None.
    """
    from pathlib import Path  # --ddp's oneCCL only: kept off the run path

    environ = os.environ if environ is None else environ
    dirs = fabric_dirs(environ, prefix)
    names = REGISTRY["libfabric"].filenames
    first = None
    for d in dirs:
        hit = _first_in([d], names)
        if hit is None:
            continue
        if _has_provider(d / "prov"):
            return Fabric(Path(hit), d / "prov", tuple(dirs))
        first = first or Path(hit)
    return Fabric(first, None, tuple(dirs))
