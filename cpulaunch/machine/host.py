"""Host facts beyond the topology, gathered once, before planning.

The second half of the probe: which libraries are installed, whether numactl is there
and usable, which engine (torchrun, MPI, Slurm) started us, a free port. One typed value,
:class:`Host`, is passed into planning and rendering, which stay pure; nothing after
planning reads the host again, so ``--dry-run`` shows what a run does.

Costs (issue 12): no subprocess except one ``numactl ... true`` when binding with numactl
on this machine (none under ``--sysroot``, where the plan describes the dumped machine and
numactl is assumed there), and, for ``--ddp`` with ``--backend auto|ccl`` when
oneccl_bindings_for_pytorch is installed, one ``python -c "import torch,
oneccl_bindings_for_pytorch"`` whose verdict is cached (:func:`ccl_binding`), and the same
check of zentorch for ``--inference-path zentorch`` (:func:`zentorch_binding`); libraries
are found by looking in folders, not ``ldconfig -p``.
"""

from __future__ import annotations

import os
import sys
from types import MappingProxyType

from cpulaunch.machine import libraries
from cpulaunch.machine.exec import which
from cpulaunch.machine.numactl import MemPolicy
from cpulaunch.machine.engines import ENGINE_VARIABLES, LOCAL_MASTER_ADDR, RankContext, detect_engine
from cpulaunch.machine.topology import Topology
from cpulaunch.names import is_python_name
from cpulaunch.records import TYPE_CHECKING, Record

if TYPE_CHECKING:
    from pathlib import Path
    from typing import Mapping, Optional, Sequence
    from cpulaunch.machine.libfinder import Fabric

__all__ = ["Host", "HostQuery", "gather", "start_gather", "Gathering", "free_port", "dist_version", "check_numactl",
           "CclBinding", "ccl_binding",
           "cache_dir", "own_cache_dir", "clear_cache", "network_interfaces", "verdict_key", "verdict_name", "rank_python",
           "ccl_collective_check", "CCL_MODULE",
           "CCL_CHECK_SECONDS", "Extension", "CCL", "ZENTORCH", "extension_binding", "zentorch_binding"]


class Host(Record):
    """What this machine offers the run (typed; gathered by :func:`gather`).

    Attributes:
        live: the topology is this machine's (no ``--sysroot``).
        environ: the user's environment, as it was (never modified).
        python: the interpreter for ``.py`` programs (sys.executable).
        libraries: registry name -> path found on this machine (only those looked up;
            None = looked up and missing).
        numactl: numactl's path on this machine, None if not installed.
        numactl_usable: True/False after the check on this machine; None when not
            checked (``--sysroot``, or binding other than numactl).
        numactl_reason: numactl's own words when it refused, else "".
        taskset: taskset's path, for ``--print-env``'s CPULAUNCH_PREFIX under affinity.
        engine: the engine that started this process (torchrun, MPI, Slurm), if any.
        free_port: a TCP port free on LOCAL_MASTER_ADDR now (one-machine DDP), or None.
        ccl: oneccl_bindings_for_pytorch and whether it loads with this torch
            (:func:`ccl_binding`); None when not looked up (no --ddp, or --backend gloo).
        fabric: oneCCL's libfabric and its providers
            (:func:`cpulaunch.machine.libfinder.find_libfabric`); None when not looked up
            (as ``ccl``, or the bindings are not installed).
        zentorch: zentorch and whether it imports with this torch (:func:`zentorch_binding`);
            None when not looked up (no ``--inference-path zentorch``).
        interfaces: the network interfaces this machine has (/sys/class/net), for
            ``--iface``; None when not looked up (no --iface, ``--sysroot``) or unreadable.
    """

    live: bool
    environ: Mapping[str, str]
    python: str = sys.executable
    libraries: Mapping[str, Optional[str]] = MappingProxyType({})
    numactl: Optional[str] = None
    numactl_usable: Optional[bool] = None
    numactl_reason: str = ""
    taskset: Optional[str] = None
    engine: Optional[RankContext] = None
    free_port: Optional[int] = None
    ccl: Optional["CclBinding"] = None
    fabric: Optional["Fabric"] = None
    zentorch: Optional["CclBinding"] = None
    interfaces: Optional[tuple[str, ...]] = None


class HostQuery(Record):
    """What one invocation asks of the host (the core makes it from the options), so the
    host reader depends on nothing above it.

    Attributes:
        sysroot: the root the topology was read from ("/": this machine).
        libraries: registry names of the libraries to look for (``"tcmalloc"``).
        numactl: find numactl (binding with numactl).
        numactl_policy: check ``numactl ... true`` on this machine's planned CPUs with this
            memory policy; None: no check (another machine, no binding, no plan).
        free_port: find a TCP port free on LOCAL_MASTER_ADDR (a one-machine --ddp run).
        ccl_program: the program whose Python is checked for oneCCL's bindings
            (``--ddp`` with ``--backend auto|ccl``); None: not looked up.
        zentorch_program: the program whose Python is checked for zentorch
            (``--inference-path zentorch``); None: not looked up.
        interfaces: list this machine's network interfaces (``--iface`` given).
    """

    sysroot: str = "/"
    libraries: tuple[str, ...] = ()
    numactl: bool = False
    numactl_policy: Optional[MemPolicy] = None
    free_port: bool = False
    ccl_program: Optional[tuple[str, ...]] = None
    zentorch_program: Optional[tuple[str, ...]] = None
    interfaces: bool = False


def network_interfaces(root: str = "/") -> Optional[tuple[str, ...]]:
    """The network interfaces' names under ``root``/sys/class/net (``("eth0", "lo")``),
    sorted; None when the folder cannot be listed (no sysfs in this container)."""
    try:
        return tuple(sorted(os.listdir(os.path.join(root, "sys/class/net"))))
    except OSError:
        return None


def check_numactl(prefixes: Sequence[Sequence[str]], timeout: float = 10.0) -> Optional[str]:
    """Run each planned ``numactl ... true`` once; None if all work, else numactl's reason.

    Checks the CPUs and nodes actually planned (not CPU 0 and node 0): a container without
    CAP_SYS_NICE gets ``set_mempolicy: Operation not permitted`` only for some policies,
    and a cpuset may refuse some CPUs. One short exec per distinct prefix, through
    :func:`cpulaunch.machine.exec.start_quietly` (no subprocess import).

    Args:
        prefixes: numactl command lines without the program (each
            :func:`cpulaunch.machine.numactl.argv`).
    """
    seen = set()
    for prefix in prefixes:
        key = tuple(prefix)
        if key in seen:
            continue
        seen.add(key)
        reason = _check_result(prefix, _start_check(prefix), timeout)
        if reason:
            return reason
    return None


def _start_check(prefix: Sequence[str]):
    """``prefix`` + ``true`` started (a :class:`cpulaunch.machine.exec.Quiet`), or why it
    could not start (a str)."""
    from cpulaunch.machine.exec import start_quietly

    try:
        return start_quietly(list(prefix) + ["true"])
    except OSError as exc:
        return f"{' '.join(prefix)} could not run ({exc})"


def _check_result(prefix: Sequence[str], started, timeout: float = 10.0) -> Optional[str]:
    """None when the check :func:`_start_check` started exits 0, else numactl's reason
    (its last line), the start's failure or the timeout."""
    if isinstance(started, str):
        return started
    try:
        code, output = started.result(timeout)
    except TimeoutError as exc:
        return f"{' '.join(prefix)} could not run ({exc})"
    if code != 0:
        msg = output.strip().splitlines()
        return f"`{' '.join(prefix)}` failed: {msg[-1] if msg else 'exit %d' % code}"
    return None


def dist_version(*names: str) -> Optional[str]:
    """The installed version of the first of the distributions ``names`` that is installed
    (package metadata, nothing imported): ``dist_version("torch")`` -> "2.13.0+cpu"; None
    when none is."""
    from importlib import metadata

    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def free_port(host: str = LOCAL_MASTER_ADDR) -> Optional[int]:
    """A TCP port free on ``host`` right now (bind to port 0), or None."""
    import socket  # only --ddp needs it: kept off the launch path

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    except OSError:
        return None


def gather(query: HostQuery, topo: Topology, environ: Mapping[str, str]) -> Host:
    """Read every host fact the run needs, once (the only host reads besides the probe):
    :func:`start_gather`, waited for.

    Raises:
        cpulaunch.errors.DistributedError: an engine's variables are present but unusable.
    """
    return start_gather(query, topo, environ).host()


class Gathering:
    """The host facts :func:`start_gather` read, numactl's check perhaps still running:
    :meth:`host` waits for it (once) and gives the :class:`Host`. Whoever starts one calls
    :meth:`host`, also when failing meanwhile (it reaps the check's child)."""

    def __init__(self, host: Host, check=None, prefix: Sequence[str] = ()) -> None:
        self._host, self._check, self._prefix = host, check, prefix

    def host(self) -> Host:
        """The facts, numactl's verdict included (:func:`check_numactl`'s reason)."""
        if self._check is not None:
            check, self._check = self._check, None
            reason = _check_result(self._prefix, check) or ""
            self._host = self._host._replace(numactl_usable=not reason, numactl_reason=reason)
        return self._host


def start_gather(query: HostQuery, topo: Topology, environ: Mapping[str, str]) -> Gathering:
    """Start numactl's check (a few ms: :func:`check_numactl` on the CPUs and nodes this
    process may use, with the query's policy) and read the other host facts meanwhile; the
    caller may do more work before :meth:`Gathering.host` waits for the check (issue 40:
    the run path imports its last modules then).

    Raises:
        cpulaunch.errors.DistributedError: an engine's variables are present but unusable
            (the check's child reaped first).
    """
    from cpulaunch.machine import numactl as numactl_mod
    from cpulaunch.machine.libfinder import find, find_libfabric
    from cpulaunch.machine.probe import is_live

    live = is_live(query.sysroot)
    numactl = which("numactl") if query.numactl else None
    check, prefix = None, ()
    if live and numactl and query.numactl_policy is not None:
        prefix = numactl_mod.check_argv(numactl, topo, query.numactl_policy)[:-1]
        check = _start_check(prefix)
    try:
        found = {name: find(libraries.REGISTRY[name], environ) for name in query.libraries}
        engine = detect_engine(environ) if any(v in environ for v in ENGINE_VARIABLES) else None
        port = free_port() if query.free_port and engine is None else None
        ccl = fabric = None
        if query.ccl_program is not None:
            ccl = ccl_binding(rank_python(query.ccl_program, environ), environ, _usable_cache(environ))
            fabric = find_libfabric(environ) if ccl.path is not None else None
        zentorch = None
        if query.zentorch_program is not None:
            zentorch = zentorch_binding(rank_python(query.zentorch_program, environ), environ,
                                        _usable_cache(environ))
        host = Host(
            live=live,
            environ=dict(environ),
            python=sys.executable,
            libraries=found,
            numactl=numactl,
            numactl_usable=None,
            numactl_reason="",
            taskset=which("taskset"),
            engine=engine,
            free_port=port,
            ccl=ccl,
            fabric=fabric,
            zentorch=zentorch,
            interfaces=network_interfaces(query.sysroot) if live and query.interfaces else None,
        )
    except BaseException:
        if check is not None:
            _check_result(prefix, check)  # reap the check's child before the error goes up
        raise
    return Gathering(host, check, prefix)


# --------------------------------------------------------------------------- oneCCL's bindings

#: The module torch-ccl's bindings install (importing it registers the "ccl" backend), and
#: the names their package metadata goes by.
CCL_MODULE = "oneccl_bindings_for_pytorch"
CCL_DISTRIBUTIONS = ("oneccl_bind_pt", "oneccl-bind-pt")
#: Seconds the import check of the bindings may take: the import of torch and the bindings
#: took 1.4-10 s here, depending on the load; a check that runs out is not cached.
CCL_CHECK_SECONDS = 120.0
#: Largest cache file read back (a verdict is a few hundred bytes).
_VERDICT_BYTES = 64 << 10


class Extension(Record):
    """A compiled PyTorch extension whose import is checked in a child process
    (:func:`extension_binding`): built against one torch, it may refuse another or abort
    the interpreter at import.

    Attributes:
        module: the module imported ("oneccl_bindings_for_pytorch", "zentorch").
        distributions: the names its package metadata goes by.
        cache_name: the start of its verdict's cache file name.
    """

    module: str
    distributions: tuple[str, ...]
    cache_name: str


#: oneCCL's bindings (issue 21).
CCL = Extension(CCL_MODULE, CCL_DISTRIBUTIONS, "ccl-binding")
#: AMD's zentorch (issue 33): its wheel imports only with the torch minor release it was
#: built for (zentorch 2.14.0.1: torch 2.14.x; it raises ImportError on 2.13 and 2.15).
ZENTORCH = Extension("zentorch", ("zentorch", "zentorch-weekly"), "zentorch")


class CclBinding(Record):
    """An extension (:class:`Extension`: oneccl_bindings_for_pytorch, zentorch) in the
    Python environment the program runs (:func:`extension_binding`).

    Attributes:
        python: the interpreter checked (the one the ranks run: :func:`rank_python`).
        path: the package's folder; None when it is not installed (no module spec).
        version: its package metadata's version, shown only: it decides nothing (the build
            that works with torch 2.13 here calls itself 2.8.0+xpu, and the stale tag
            v2.7.0+cpu aborts the interpreter under torch >= 2.8: docs/guide/ddp.md).
        torch_version: torch's metadata version, None when torch is not installed.
        loads: True when ``import torch, oneccl_bindings_for_pytorch`` succeeded in a
            child process of this Python; False when it did not (``why``); None when not
            checked (not installed).
        why: how the import failed: ``"aborts the interpreter at import (SIGABRT)"``, the
            error's last line, or that it ran out of time; "" when it loads.
        cached: the verdict was read from the cache, not checked now.
        cache_file: the file the verdict was read from or kept in; None when not kept.
    """

    python: str
    path: Optional[str]
    version: Optional[str] = None
    torch_version: Optional[str] = None
    loads: Optional[bool] = None
    why: str = ""
    cached: bool = False
    cache_file: Optional[str] = None


def _usable_cache(environ: Mapping[str, str]) -> Optional[Path]:
    """:func:`own_cache_dir`, its note said once (stderr)."""
    folder, note = own_cache_dir(environ)
    if note:
        from cpulaunch import log as _log

        _log.get(__name__).warning("%s", note)
    return folder


def cache_dir(environ: Mapping[str, str]) -> Optional[Path]:
    """cpulaunch's cache folder: ``$XDG_CACHE_HOME/cpulaunch``, else
    ``$HOME/.cache/cpulaunch`` (XDG Base Directory specification: a relative
    XDG_CACHE_HOME is ignored); None when neither gives an absolute path (pure)."""
    from pathlib import Path  # not on the run path (issue 40: 4 ms)

    xdg = environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "cpulaunch"
    home = environ.get("HOME", "")
    return Path(home) / ".cache" / "cpulaunch" if os.path.isabs(home) else None


def _binding_files(folder: Path) -> list:
    """[[path, mtime_ns, size]] of the bindings' own files: ``__init__.py`` and the shared
    objects in the package folder and its ``lib`` (a rebuild changes at least one)."""
    out = []
    for d in (folder, folder / "lib"):
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            if name == "__init__.py" or name.endswith(".so") or ".so." in name:
                try:
                    st = os.stat(d / name)
                except OSError:
                    continue
                out.append([str(d / name), st.st_mtime_ns, st.st_size])
    return out


#: Variables whose values decide whether the bindings import in the ranks' environment: the
#: dynamic linker's (LD_LIBRARY_PATH, LD_PRELOAD...), Python's (PYTHONPATH, PYTHONHOME...),
#: oneCCL's, libfabric's and Intel MPI's. Every one of them is in a verdict's key.
VERDICT_VARIABLES = ("LD_", "PYTHON", "CCL_", "FI_", "I_MPI_")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def verdict_key(python: str, torch_version: Optional[str], folder: Path, environ: Mapping[str, str]) -> dict:
    """What decides the import check, as the cache's key: the interpreter, torch's
    version, the bindings' files (path, mtime, size) and every variable of
    :data:`VERDICT_VARIABLES` in ``environ`` (a fixed LD_LIBRARY_PATH is another key, so a
    failure it caused is not served again)."""
    env = {k: v for k, v in sorted(environ.items()) if k.startswith(VERDICT_VARIABLES)}
    return {"python": python, "torch": torch_version, "files": _binding_files(folder), "env": env}


def verdict_name(key: dict, prefix: str = "ccl-binding") -> str:
    """The cache file's name for ``key``: ``PREFIX-<32 hex digits of its sha256>.json``
    (the extension's :attr:`Extension.cache_name`: ``ccl-binding``, ``zentorch``)."""
    import hashlib
    import json  # not on the launch path (issue 12)

    return prefix + "-" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32] + ".json"


def _own_and_private(fd: int) -> bool:
    """Whether the open folder or file ``fd`` is this user's and writable by nobody else."""
    st = os.fstat(fd)
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _trusted(fd: int) -> bool:
    """Whether the open folder ``fd`` may lie on the cache's path (issue 39): this user's
    and not writable by others, or root's and writable by root alone, or root's and sticky
    (``/tmp``: others may add names there but never replace or remove ours, and the next
    folder on the path is checked in its turn)."""
    import stat

    st = os.fstat(fd)
    if st.st_uid == 0 and st.st_mode & stat.S_ISVTX:
        return True
    if st.st_uid == os.geteuid():
        return not st.st_mode & 0o002
    return st.st_uid == 0 and not st.st_mode & 0o022


def _walk_cache(folder: Path, create: bool) -> tuple[Optional[int], str]:
    """(A descriptor of the cache folder, "") when every folder on its path, from ``/``
    down, is a real folder (never a link: each is opened ``O_NOFOLLOW`` relative to the
    one above) that :func:`_trusted` accepts, and the cache folder itself is this user's
    alone; ``create``: missing folders are made (0700) on the way, only under trusted
    ones. Else (None, why): the first folder that is not, and why (issue 39: root under
    ``sudo -E`` made ``~USER/.cache`` root's, and wrote through a planted link)."""
    from pathlib import Path  # not on the run path (issue 40: 4 ms)

    if not folder.is_absolute() or ".." in folder.parts:
        return None, f"{folder} is not an absolute, plain path"
    fd = os.open("/", _DIR_FLAGS)
    here = Path("/")
    try:
        for name in folder.parts[1:]:
            if not _trusted(fd):
                st = os.fstat(fd)
                return None, f"{here} belongs to uid {st.st_uid} (mode {st.st_mode & 0o7777:04o})"
            here = here / name
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    return None, f"{here} does not exist"
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                    nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    return None, f"{here} cannot be made ({exc.strerror})"
            except OSError as exc:
                return None, f"{here} is a link or not a folder ({exc.strerror})"
            os.close(fd)
            fd = nfd
        if not _own_and_private(fd):
            st = os.fstat(fd)
            return None, f"{here} is not this user's alone (uid {st.st_uid}, mode {st.st_mode & 0o7777:04o})"
        out, fd = fd, None
        return out, ""
    finally:
        if fd is not None:
            os.close(fd)


def _open_cache(folder: Path, create: bool = False) -> Optional[int]:
    """A descriptor of the cache folder (:func:`_walk_cache`), or None."""
    return _walk_cache(folder, create)[0]


def own_cache_dir(environ: Mapping[str, str]) -> tuple[Optional[Path], str]:
    """The cache folder this process may use, and a note when it is not
    :func:`cache_dir`'s: that one when every existing folder on its path is trusted
    (:func:`_walk_cache`); else, when HOME is not this user's home in the password
    database (root under ``sudo -E``), the cache in that home; else None (no cache).
    Never makes anything."""
    from pathlib import Path  # not on the run path (issue 40: 4 ms)


    wanted = cache_dir(environ)
    if wanted is None:
        return None, ""
    why = _path_doubt(wanted)
    if not why:
        return wanted, ""
    try:
        import pwd

        home = pwd.getpwuid(os.geteuid()).pw_dir
    except (KeyError, ImportError):
        home = ""
    own = Path(home) / ".cache" / "cpulaunch" if os.path.isabs(home) else None
    elsewhere = not os.path.isabs(environ.get("XDG_CACHE_HOME", "")) and environ.get("HOME") != home
    if elsewhere and own is not None and not _path_doubt(own):  # another's HOME, as under sudo -E
        return own, f"note: the cache {wanted} is not this user's ({why}); verdicts are kept in {own}"
    return None, f"note: the cache {wanted} is not this user's ({why}); no verdict is kept"


def _path_doubt(folder: Path) -> str:
    """Why ``folder`` may not be used as this user's cache ("" when it may): the first
    existing folder on its path that is a link or not :func:`_trusted`."""
    fd, why = _walk_cache(folder, create=False)
    if fd is not None:
        os.close(fd)
        return ""
    return "" if why.endswith("does not exist") else why


def _read_verdict(folder: Path, name: str, key: dict) -> Optional[tuple]:
    """(loads, why) cached as ``name`` in ``folder`` for exactly ``key``, else None. Read
    only from a folder and a regular file that are this user's and writable by nobody else,
    never through a link."""
    import json  # not on the launch path (issue 12)
    import stat

    dfd = _open_cache(folder)
    if dfd is None:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    finally:
        os.close(dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or not _own_and_private(fd):
            return None
        data = json.loads(os.read(fd, _VERDICT_BYTES + 1)[:_VERDICT_BYTES])
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("loads"), bool):
        return None
    return data["loads"], str(data.get("why", ""))


def _write_verdict(folder: Path, name: str, key: dict, loads: bool, why: str) -> bool:
    """Keep a verdict (whole or not at all, mode 0600) in ``folder`` (made 0700 when
    missing), never through a link planted at the folder's or the file's name, never in
    a folder that is not this user's alone; a cache that cannot be written costs the next
    run the check again, nothing more. Returns True when it was kept."""
    import json  # not on the launch path (issue 12)
    from cpulaunch.machine.files import replace_at

    dfd = _open_cache(folder, create=True)
    if dfd is None:
        return False
    try:
        replace_at(dfd, name, json.dumps({"key": key, "loads": loads, "why": why}, sort_keys=True),
                   str(folder / name), mode=0o600)
        return True
    except OSError:
        return False
    finally:
        os.close(dfd)


def clear_cache(folder: Optional[Path]) -> list[str]:
    """Remove every cached import verdict (``ccl-binding-*.json``, ``zentorch-*.json``) of this user's from
    ``folder`` (:func:`cache_dir`; ``cpulaunch doctor --clear-cache``); returns the files
    removed. Only in a folder that is this user's alone; links and other users' files are
    left (a name is unlinked, never followed).

    Raises:
        OSError: the folder exists but cannot be read.
    """
    import stat

    if folder is None:
        return []
    dfd = _open_cache(folder)
    if dfd is None:
        return []
    removed = []
    try:
        for entry in os.listdir(dfd):
            if not (entry.startswith(tuple(e.cache_name + "-" for e in (CCL, ZENTORCH))) and entry.endswith(".json")):
                continue
            st = os.stat(entry, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                os.unlink(entry, dir_fd=dfd)
                removed.append(str(folder / entry))
    finally:
        os.close(dfd)
    return removed


def _import_check(python: str, environ: Mapping[str, str], module: str = CCL_MODULE) -> tuple:
    """(loads, why, worth caching) of ``python -c "import torch, MODULE"`` run in a child
    with ``environ``: an import that aborts (a binding built for another torch can) ends
    only the child."""
    from cpulaunch.errors import printable
    from cpulaunch.machine.exec import run_quietly, signal_name

    try:
        code, out = run_quietly([python, "-c", f"import torch, {module}"], timeout=CCL_CHECK_SECONDS,
                                env=environ)
    except TimeoutError:
        return False, f"did not finish importing in {CCL_CHECK_SECONDS:g} s", False
    except OSError as exc:
        return False, f"{python} cannot be started ({exc.strerror})", False
    if code == 0:
        return True, "", True
    if code > 128:
        return False, f"aborts the interpreter at import ({signal_name(code - 128)})", True
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return False, printable(lines[-1][:300]) if lines else f"import failed with exit code {code}", True


def _locate_script(ext: Extension) -> str:
    """Where an extension is, asked in a child when the program runs another interpreter
    than the launcher: one JSON line (no torch import: about as fast as the interpreter
    starts)."""
    return f"""\
import importlib.metadata as m, importlib.util as u, json
def v(*names):
    for n in names:
        try:
            return m.version(n)
        except m.PackageNotFoundError:
            pass
s = u.find_spec({ext.module!r})
print(json.dumps({{"origin": s and s.origin, "locations": list(s and s.submodule_search_locations or []),
                  "version": v(*{ext.distributions!r}), "torch": v("torch")}}))
"""


def rank_python(program: Sequence[str], environ: Mapping[str, str]) -> str:
    """The interpreter the ranks run: the program itself when it is a Python interpreter
    (``python3 train.py``, looked up on the user's PATH as the launch will), else this
    one (``sys.executable``: cpulaunch runs ``train.py``, ``-m pkg`` and ``-c`` with it, and
    it is the best guess for anything else). ``["python", "x.py"]`` with ``/venv/bin``
    first on PATH -> ``"/venv/bin/python"``."""
    first = program[0] if program else ""
    if is_python_name(first):
        found = which(first, path=environ.get("PATH", os.defpath))
        if found:
            return os.path.abspath(found)
    return sys.executable


def _locate(python: str, environ: Mapping[str, str], ext: Extension = CCL) -> tuple:
    """(package folder or None, extension's version, torch's version) as ``python`` sees
    them: in this process when it is this interpreter, else from a child
    (:func:`_locate_script`)."""
    from pathlib import Path  # not on the run path (issue 40: 4 ms)

    import json  # not on the launch path (issue 12)
    import importlib.util

    if python == sys.executable:
        try:
            spec = importlib.util.find_spec(ext.module)
        except (ImportError, ValueError):
            spec = None
        origin, locations = (spec.origin, list(spec.submodule_search_locations or [])) if spec else (None, [])
        found = spec is not None
        version, torch_version = (dist_version(*ext.distributions), dist_version("torch")) if found else (None, None)
    else:
        from cpulaunch.machine.exec import run_quietly

        try:
            code, out = run_quietly([python, "-c", _locate_script(ext)], timeout=30, env=environ, stderr=False)
            data = json.loads(out.strip().splitlines()[-1]) if code == 0 and out.strip() else {}
        except (OSError, TimeoutError, ValueError):
            data = {}
        origin, locations = data.get("origin"), list(data.get("locations") or [])
        found = bool(origin or locations)
        version, torch_version = data.get("version"), data.get("torch")
    if not found:
        return None, None, None
    return (Path(origin).parent if origin else Path(locations[0] if locations else ".")), version, torch_version


def ccl_binding(python: str, environ: Mapping[str, str], cache: Optional[Path]) -> CclBinding:
    """Is oneccl_bindings_for_pytorch installed for ``python`` (the ranks' interpreter), and
    does it load with its torch? :func:`extension_binding` of :data:`CCL`."""
    return extension_binding(CCL, python, environ, cache)


def zentorch_binding(python: str, environ: Mapping[str, str], cache: Optional[Path]) -> CclBinding:
    """Is zentorch installed for ``python`` (the program's interpreter), and does it import
    with its torch? :func:`extension_binding` of :data:`ZENTORCH` (the child's import of
    torch and zentorch took 5-16 s here; its verdict is cached)."""
    return extension_binding(ZENTORCH, python, environ, cache)


def extension_binding(ext: Extension, python: str, environ: Mapping[str, str], cache: Optional[Path]) -> CclBinding:
    """Is the extension ``ext`` installed for ``python``, and does it import with its torch?

    Found with ``importlib.util.find_spec`` (not imported; in a child when ``python`` is not
    this interpreter); then ``import torch, MODULE`` runs in a child process of ``python``
    with ``environ`` (the program's environment), because an extension built for another
    torch can abort the interpreter at import while its metadata looks right (oneCCL's
    bindings) or refuse the import (zentorch checks torch's minor release). The verdict is
    kept in ``cache`` (a folder, :func:`cache_dir`; None: not kept) under a key of
    everything that decides it (:func:`verdict_key`: ``python``, torch's version, each
    package file's path, mtime and size, and the LD_*, PYTHON*, CCL_*, FI_* and I_MPI_*
    variables), so a run pays the check once per build and environment; it is read back
    only from a folder and file of this user's that nobody else may write
    (:func:`_read_verdict`), and ``cpulaunch doctor --clear-cache`` removes it
    (:func:`clear_cache`). A check that ran out of time is not kept.

    Returns:
        :class:`CclBinding` (``path`` None when not installed; then no import is tried).
    """
    folder, version, torch_version = _locate(python, environ, ext)
    if folder is None:
        return CclBinding(python, None)
    key = verdict_key(python, torch_version, folder, environ)
    name = verdict_name(key, ext.cache_name)
    hit = _read_verdict(cache, name, key) if cache is not None else None
    if hit is not None:
        return CclBinding(python, str(folder), version, torch_version, hit[0], hit[1], cached=True,
                          cache_file=str(cache / name))
    loads, why, keep = _import_check(python, environ, ext.module)
    kept = keep and cache is not None and _write_verdict(cache, name, key, loads, why)
    return CclBinding(python, str(folder), version, torch_version, loads, why,
                      cache_file=str(cache / name) if kept else None)


#: A one-rank ccl world on a HashStore and one all_reduce (cpulaunch doctor's check).
_CCL_COLLECTIVE = """\
import torch, torch.distributed as dist, oneccl_bindings_for_pytorch
dist.init_process_group("ccl", store=dist.HashStore(), rank=0, world_size=1)
t = torch.ones(4)
dist.all_reduce(t)
ok = t.tolist() == [1.0] * 4
dist.destroy_process_group()
print("cpulaunch-ccl-collective " + ("ok" if ok else "wrong sum"), flush=True)
"""


def ccl_collective_check(python: str, env: Mapping[str, str]) -> tuple[bool, str]:
    """Can a oneCCL collective start here? A one-rank ``init_process_group("ccl")`` on a
    HashStore and one all_reduce run in a child of ``python`` with ``env`` (the user's
    environment plus the launcher's oneCCL variables). oneCCL opens libfabric and its
    provider at the first collective, so this is where a missing or wrong run time shows.

    Returns:
        ``(True, "")``, or ``(False, why)``: the most telling line of the child's output
        (oneCCL's ``CCL_ERROR`` line when there is one), its signal, or that it ran out of
        :data:`CCL_CHECK_SECONDS`.
    """
    from cpulaunch.errors import printable
    from cpulaunch.machine.exec import run_quietly, signal_name

    try:
        code, out = run_quietly([python, "-c", _CCL_COLLECTIVE], timeout=CCL_CHECK_SECONDS, env=env)
    except TimeoutError:
        return False, f"no answer in {CCL_CHECK_SECONDS:g} s"
    except OSError as exc:
        return False, f"{python} cannot be started ({exc.strerror})"
    if code == 0 and "cpulaunch-ccl-collective ok" in out:
        return True, ""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    told = [ln for ln in lines if "CCL_ERROR" in ln or "Error" in ln] or lines
    why = printable(told[-1][:300]) if told else "no output"
    if code > 128:
        why = f"{why} ({signal_name(code - 128)})"
    elif code == 0:
        why = "the all_reduce gave a wrong sum"
    return False, why
