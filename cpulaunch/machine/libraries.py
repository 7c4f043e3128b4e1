"""The preloadable libraries as data: the registry, and the rules read from it (which
library a file is, how glibc splits LD_PRELOAD). Pure; finding them on this host is
:mod:`cpulaunch.machine.libfinder`.

Each :class:`Library` lists its file names (versioned ones first: Debian ships
``libjemalloc.so.2`` and ``libtcmalloc.so.4`` without the unversioned link unless the -dev
package is installed), the environment it wants and how to install it. Help text and
click choices are generated from :data:`REGISTRY`.

oneCCL's run time (issue 21) is in the registry too, never offered as a choice:
``libfabric``, the transport oneCCL dlopens. :func:`cpulaunch.machine.libfinder.find_libfabric`
finds it where Intel's wheels put it, with the provider folder beside it, which libfabric
needs (docs/guide/ddp.md).
"""

from __future__ import annotations

import os
from types import MappingProxyType
from cpulaunch.records import TYPE_CHECKING, Record

if TYPE_CHECKING:
    from typing import Mapping, Optional

__all__ = ["Library", "REGISTRY", "ALLOCATOR_CHOICES", "OPENMP_CHOICES", "by_choice",
           "preload_entries", "identify", "openmp_runtime_of", "AUTO_ALLOCATOR", "AUTO_OPENMP", "resolve_choice"]


class Library(Record):
    """A runtime library cpulaunch can choose (threadpoolctl's controller registry is the
    model: one entry per library; CLI choices, help text and render's rules come from here).

    Attributes:
        name: registry key ("jemalloc", "tcmalloc", "iomp5", "gomp").
        kind: "allocator", "openmp" or "ccl-runtime" (oneCCL's libfabric, never preloaded).
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
        help: one line for doctor and the docs.
        summary: a few words for --help (``"Intel OpenMP, preloaded"``).
        selectable: users can choose it (``--allocator``/``--omp-runtime``); False for
            a runtime cpulaunch only recognises where it is mapped (LLVM's libomp).

    A record (a namedtuple: immutable), not a frozen dataclass: a tenth of the class-creation cost,
    paid by every launch (issue 12).
    """

    name: str
    kind: str
    choice: str
    filenames: tuple[str, ...]
    install: str
    markers: tuple[str, ...]
    env: Mapping[str, str] = MappingProxyType({})
    idle_env: Mapping[str, str] = MappingProxyType({})
    pin_style: str = ""
    help: str = ""
    selectable: bool = True
    summary: str = ""


REGISTRY: dict[str, Library] = {
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
            help="gperftools' tcmalloc (1.0-1.4x measured on this project's CNN)",
            summary="gperftools'",
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
            summary="with the tuning guide's MALLOC_CONF",
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
            summary="Intel's, preloaded",
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
            summary="GNU's, torch's own",
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
            # The versions that ran together here: docs/guide/ddp.md (newer oneccl-cpu wheels
            # do not load; 2022.2 needs a libfabric that is not on PyPI).
            install="pip install impi-rt==2021.14.2 (puts lib/libfabric/libfabric.so.1 and "
                    "lib/libfabric/prov/ under the Python prefix)",
            markers=("libfabric.",),
            help="libfabric, the transport oneCCL loads (impi-rt's build and its providers)",
            selectable=False,
        ),
    )
}

#: What ``auto`` means, as data (choices; measured: docs/dev/measurements.md): ``--allocator
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


def resolve_choice(kind: str, choice: str) -> str:
    """What a choice means, ``auto`` resolved: the one place ``auto`` is read
    (:data:`AUTO_OPENMP`, :data:`AUTO_ALLOCATOR`): ``("openmp", "auto")`` -> "gnu",
    ``("allocator", "auto")`` -> "tcmalloc" (used when found; else the C library's malloc,
    decided where the host is read); any other choice is itself."""
    if choice != "auto":
        return choice
    return {"openmp": AUTO_OPENMP, "allocator": AUTO_ALLOCATOR}[kind]


def by_choice(kind: str, choice: str) -> Library:
    """The registry entry users select as ``choice`` ("intel" -> iomp5). Raises KeyError."""
    for lib in REGISTRY.values():
        if lib.kind == kind and lib.choice == choice:
            return lib
    raise KeyError(choice)




def preload_entries(value: str) -> list[str]:
    """Split an LD_PRELOAD value into entries as glibc does: on spaces and colons only
    (ld.so(8); ``elf/rtld.c`` splits on " :"), so an entry holding a tab or a newline
    stays one entry, byte for byte. ``"/a.so:/b.so c.so"`` -> ``["/a.so", "/b.so", "c.so"]``."""
    return [e for e in value.replace(":", " ").split(" ") if e]


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
