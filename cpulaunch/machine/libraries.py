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

oneCCL's run time (issue 21) is in the registry too, never offered as a choice:
``libfabric`` (the transport oneCCL dlopens) and ``oneccl`` (``libccl``, recognised where it
is mapped). :func:`find_libfabric` finds libfabric where Intel's wheels put it, with the
provider folder beside it, which libfabric needs (docs/cluster.md).
"""

import os
import platform
import re
import shutil
import struct
import sys
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, NamedTuple, Optional, Sequence

__all__ = ["Library", "REGISTRY", "ALLOCATORS", "OPENMP", "ALLOCATOR_CHOICES", "OPENMP_CHOICES", "by_choice",
           "search_dirs", "find", "is_loadable_elf", "preload_entries", "identify", "openmp_runtime_of",
           "AUTO_ALLOCATOR", "AUTO_OPENMP", "Fabric", "find_libfabric", "fabric_dirs"]


class Library(NamedTuple):
    """A runtime library cpulaunch can choose (threadpoolctl's controller registry is the
    model: one entry per library; CLI choices, help text and render's rules come from here).

    Attributes:
        name: registry key ("jemalloc", "tcmalloc", "iomp5", "gomp").
        kind: "allocator", "openmp" or "ccl-runtime" (oneCCL's libraries, never preloaded).
        choice: the value users type (``--allocator tcmalloc``, ``--omp-runtime intel``).
        filenames: file names to look for, preferred first; empty when nothing is
            preloaded (torch's bundled libgomp is already linked).
        install: how to get it on Debian/Ubuntu and from PyPI.
        markers: file-name prefixes identifying it in LD_PRELOAD and /proc/PID/maps
            (torch's bundled ``libgomp-<hash>.so.1`` is libgomp too).
        env: variables it wants whenever it is used (e.g. jemalloc's MALLOC_CONF).
        idle_env: OpenMP only: variables that make idle threads yield (KMP_BLOCKTIME).
        pin_style: OpenMP only: how threads are pinned to an instance's CPUs when bound:
            "kmp" (KMP_AFFINITY, Intel/LLVM runtimes) or "omp" (OMP_PLACES/OMP_PROC_BIND).
        help: one line for --help.
        selectable: users can choose it (``--allocator``/``--omp-runtime``); False for
            a runtime cpulaunch only recognises where it is mapped (LLVM's libomp).

    A NamedTuple (immutable), not a frozen dataclass: a tenth of the class-creation cost,
    paid by every launch (issue 12).
    """

    name: str
    kind: str
    choice: str
    filenames: tuple
    install: str
    markers: tuple
    env: Mapping[str, str] = MappingProxyType({})
    idle_env: Mapping[str, str] = MappingProxyType({})
    pin_style: str = ""
    help: str = ""
    selectable: bool = True


REGISTRY: dict = {
    lib.name: lib
    for lib in (
        Library(
            name="tcmalloc",
            kind="allocator",
            choice="tcmalloc",
            filenames=(
                "libtcmalloc.so.4",
                "libtcmalloc_minimal.so.4",
                "libtcmalloc.so",
                "libtcmalloc_minimal.so",
            ),
            install="apt-get install libtcmalloc-minimal4 (or libgoogle-perftools4)",
            markers=("libtcmalloc",),
            help="gperftools' tcmalloc (measured 1.0-1.4x here: docs/performance.md)",
        ),
        Library(
            name="jemalloc",
            kind="allocator",
            choice="jemalloc",
            filenames=("libjemalloc.so.2", "libjemalloc.so"),
            install="apt-get install libjemalloc2",
            markers=("libjemalloc",),
            # The PyTorch CPU performance tuning guide's setting.
            env={
                "MALLOC_CONF": "oversize_threshold:1,background_thread:true,metadata_thp:auto,"
                "dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000"
            },
            help="jemalloc with the tuning guide's MALLOC_CONF",
        ),
        Library(
            name="iomp5",
            kind="openmp",
            choice="intel",
            filenames=("libiomp5.so",),
            install="pip install intel-openmp (puts libiomp5.so in sys.prefix/lib)",
            markers=("libiomp5",),
            # Intel's OpenMP documentation and the tuning guide: idle threads stop
            # spinning after 1 ms; threads pinned one per CPU when the instance is bound.
            idle_env={"KMP_BLOCKTIME": "1"},
            pin_style="kmp",
            help="Intel OpenMP, preloaded over torch's libgomp",
        ),
        Library(
            name="gomp",
            kind="openmp",
            choice="gnu",
            filenames=(),
            install="bundled with torch",
            markers=("libgomp.", "libgomp-"),
            pin_style="omp",
            help="GNU OpenMP, the runtime torch links (nothing preloaded)",
        ),
        Library(
            name="llvm-omp",
            kind="openmp",
            choice="llvm",
            filenames=("libomp.so.5", "libomp.so"),
            install="apt-get install libomp5",
            markers=("libomp.", "libomp-"),
            pin_style="kmp",
            help="LLVM OpenMP (recognised where mapped; not offered as a choice)",
            selectable=False,
        ),
        Library(
            name="libfabric",
            kind="ccl-runtime",
            choice="libfabric",
            filenames=("libfabric.so.1",),
            # The versions that ran together here: docs/cluster.md (newer oneccl-cpu wheels
            # do not load; 2022.2 needs a libfabric that is not on PyPI).
            install="pip install impi-rt==2021.14.2 (puts lib/libfabric/libfabric.so.1 and "
                    "lib/libfabric/prov/ under the Python prefix)",
            markers=("libfabric.",),
            help="libfabric, the transport oneCCL loads (impi-rt's build and its providers)",
            selectable=False,
        ),
        Library(
            name="oneccl",
            kind="ccl-runtime",
            choice="oneccl",
            filenames=("libccl.so.1",),
            install="pip install oneccl-cpu==2021.14.1",
            markers=("libccl.",),
            help="oneCCL (recognised where mapped; loaded by oneccl_bindings_for_pytorch)",
            selectable=False,
        ),
    )
}

#: What ``auto`` means, as data (choices; PLATFORM.md, docs/performance.md): ``--allocator
#: auto`` preloads tcmalloc when it is found (1.0-1.4x measured here; jemalloc 0.68-0.91x),
#: else the C library's malloc; ``--omp-runtime auto`` keeps the runtime torch links
#: (libiomp5 measured within noise of it).
AUTO_ALLOCATOR = "tcmalloc"
AUTO_OPENMP = "gnu"

#: --allocator values: "auto" (tcmalloc when found), "default" (the C library's malloc)
#: and every allocator of the registry.
ALLOCATOR_CHOICES = ("auto", "default") + tuple(
    lib.choice for lib in REGISTRY.values() if lib.kind == "allocator" and lib.selectable)
#: --omp-runtime values: "auto" (torch's own runtime) and every OpenMP runtime of the registry.
OPENMP_CHOICES = ("auto",) + tuple(
    lib.choice for lib in REGISTRY.values() if lib.kind == "openmp" and lib.selectable)


def by_choice(kind: str, choice: str) -> Library:
    """The registry entry users select as ``choice`` ("intel" -> iomp5). Raises KeyError."""
    for lib in REGISTRY.values():
        if lib.kind == kind and lib.choice == choice:
            return lib
    raise KeyError(choice)


ALLOCATORS = tuple(n for n, lib in REGISTRY.items() if lib.kind == "allocator" and lib.selectable)
OPENMP = tuple(n for n, lib in REGISTRY.items() if lib.kind == "openmp" and lib.selectable)

#: Largest ``ldconfig -p`` output read (a few thousand libraries make a few hundred KiB).
LDCONFIG_BYTES = 8 << 20

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
    """``ldconfig -p`` parsed (a fallback only, when no folder held the library)."""
    from cpulaunch.machine.exec import run_quietly

    exe = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if not exe:
        return {}
    try:
        code, out = run_quietly([exe, "-p"], timeout=10, stderr=False, max_output=LDCONFIG_BYTES)
    except (OSError, TimeoutError):
        return {}
    return parse_ldconfig(out) if code == 0 else {}


def ld_so_conf_dirs(path: str = "/etc/ld.so.conf", _depth: int = 0) -> list:
    """Folders named by ``/etc/ld.so.conf`` and its ``include`` globs (ldconfig(8)), in order.

    Reading them is what ``ldconfig -p`` would tell, without starting a process on every
    launch. Unreadable files give no folders.
    """
    import glob

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
            for inc in sorted(glob.glob(pattern)):
                out += ld_so_conf_dirs(inc, _depth + 1)
        elif line.startswith("/"):
            out.append(Path(line))
    return out


def _first_in(dirs, names) -> Optional[Path]:
    for name in names:
        for d in dirs:
            p = os.path.join(d, name)
            if os.path.isfile(p) and is_loadable_elf(p):
                return Path(p)
    return None


def find(
    lib: Library,
    environ: Optional[Mapping[str, str]] = None,
    prefix: str = sys.prefix,
    extra_dirs: Sequence[os.PathLike] = (),
    use_ldconfig: bool = True,
) -> Optional[Path]:
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
    dirs = [Path(d) for d in extra_dirs] + search_dirs(environ, prefix)
    hit = _first_in(dirs, lib.filenames) or _first_in(multiarch_dirs() + ld_so_conf_dirs(), lib.filenames)
    if hit is not None or not use_ldconfig:
        return hit
    cache = _ldconfig()
    for name in lib.filenames:
        p = cache.get(name)
        if p and is_loadable_elf(p):
            return Path(p)
    return None


def preload_entries(value: str) -> list:
    """Split an LD_PRELOAD value into entries as glibc does: on spaces and colons only
    (ld.so(8); ``elf/rtld.c`` splits on " :"), so an entry holding a tab or a newline
    stays one entry, byte for byte. ``"/a.so:/b.so c.so"`` -> ``["/a.so", "/b.so", "c.so"]``."""
    return [e for e in re.split("[ :]", value) if e]


def identify(entry: str) -> Optional[str]:
    """The registry name of a library file (a path or bare name, from LD_PRELOAD, an ELF
    DT_NEEDED list or /proc/PID/maps), by its base name's prefix: ``"/x/libjemalloc.so.2"``
    -> "jemalloc", ``"libgomp-a34b3233.so.1"`` -> "gomp", ``"libomp.so.5"`` -> "llvm-omp";
    None for anything else."""
    base = os.path.basename(entry)
    for name, lib in REGISTRY.items():
        if base.startswith(lib.markers):
            return name
    return None


def openmp_runtime_of(entry: str) -> Optional[str]:
    """The OpenMP runtime a library file is, as users name it: "gnu" (libgomp), "intel"
    (libiomp5), "llvm" (libomp); None for a file that is no OpenMP runtime (``identify``)."""
    name = identify(entry)
    return REGISTRY[name].choice if name is not None and REGISTRY[name].kind == "openmp" else None


# --------------------------------------------------------------------------- oneCCL's libfabric


class Fabric(NamedTuple):
    """libfabric as oneCCL needs it (:func:`find_libfabric`).

    Attributes:
        library: ``libfabric.so.1``, a loadable ELF shared object for this machine; None
            when no searched folder holds one.
        providers: the provider folder beside it (``prov``, holding at least one loadable
            ``lib*-fi.so``); None when the library found has none. impi-rt's libfabric has
            no provider built in: without ``FI_PROVIDER_PATH`` at this folder oneCCL's first
            collective fails with "can't find suitable provider" (docs/cluster.md).
        searched: the folders looked in, in order (for messages).
    """

    library: Optional[Path]
    providers: Optional[Path]
    searched: tuple = ()

    @property
    def usable(self) -> bool:
        """Both the library and its providers were found."""
        return self.library is not None and self.providers is not None


def fabric_dirs(environ: Mapping[str, str], prefix: str = sys.prefix) -> list:
    """Folders that may hold oneCCL's libfabric, in order, each once (pure).

    ``<root>/lib/libfabric`` for the Python prefix, ``$CONDA_PREFIX``, ``$VIRTUAL_ENV``,
    ``$I_MPI_ROOT`` and ``$CCL_ROOT`` (where the impi-rt wheel puts it, measured here with
    impi-rt 2021.14.2; conda's activation scripts set the last two), then every
    ``$LD_LIBRARY_PATH`` folder as it is (oneAPI's ``setvars.sh`` puts its libfabric
    folder there). ``{"VIRTUAL_ENV": "/v"}``, prefix ``/p`` -> ``[/p/lib/libfabric,
    /v/lib/libfabric]``.
    """
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
    that ran with oneCCL here is impi-rt's (docs/cluster.md).

    Returns:
        a :class:`Fabric`; when no folder has both, the first library found (or None) and
        ``providers`` None.
    """
    environ = os.environ if environ is None else environ
    dirs = fabric_dirs(environ, prefix)
    names = REGISTRY["libfabric"].filenames
    first = None
    for d in dirs:
        hit = _first_in([d], names)
        if hit is None:
            continue
        if _has_provider(d / "prov"):
            return Fabric(hit, d / "prov", tuple(dirs))
        first = first or hit
    return Fabric(first, None, tuple(dirs))
