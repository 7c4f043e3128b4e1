"""Emulated machines for tests that need several hosts (issue 38; not collected by pytest).

Each host is, as root on one Linux machine:

- a network namespace of its own (``ip netns add``), its loopback up;
- a veth pair linking the two namespaces, with addresses on a private /24 (10.231.0.0/24
  by default) that exists only inside those namespaces: nothing is routed to or from the
  machine's own network, and the tests send traffic only between the namespaces;
- a hostname of its own (a UTS namespace: ``unshare -u``, then ``hostname NAME``);
- a cgroup v1 cpuset child holding that host's CPUs (one CPU each on a 2-CPU machine);
- an ``/etc/netns/NS/hosts`` that names every host at its veth address: ``ip netns exec``
  binds the files of ``/etc/netns/NS/`` over ``/etc/`` in the mount namespace it makes, so
  the host's own name resolves to its own veth address. Without that file every host
  resolves its name to 127.0.0.1 (the machine's /etc/hosts), and gloo and c10d advertise an
  address the other host cannot reach.

Order matters when a command starts on a host (:meth:`Host.argv`, :meth:`Host.popen`): the
process enters the host's cgroup first (``preexec_fn`` writes its pid to the cpuset's
``cgroup.procs``), because ``ip netns exec`` mounts a sysfs of its own in which the cgroup
folders are absent; the UTS namespace and hostname come next, then ``ip netns exec``.
Every process a host runs stays in its cgroup, so :meth:`Host.kill` stops all of them
(a machine going away), setsid'd descendants included.

:func:`hosts` makes them with names unique to the test run (the pid and random bits), so
two runs at once or a run's leftovers never clash, and removes everything it made,
whatever happened in between: the processes (SIGKILL, until the cgroups are empty), the
namespaces (which takes their veth ends along), the cgroups and the /etc/netns folders.
What a run killed before its clean-up left behind, the next run removes (:func:`sweep`).
:func:`missing` says why hosts cannot be made here (the tests' skip reason).
Measured on this project's machine (Debian 12, cgroup v1, 2 CPUs, torch 2.13).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from waiting import wait_for

CPUSET = Path("/sys/fs/cgroup/cpuset")
NETNS_ETC = Path("/etc/netns")
SUBNET = "10.231.0"  #: the private /24 the hosts' veth ends live on (inside the namespaces only)


def missing(ncpus: int = 2) -> str:
    """Why hosts cannot be emulated here ("" when they can): root, ``ip`` and ``unshare``,
    a cgroup v1 cpuset hierarchy, and ``ncpus`` CPUs this process may use (one per host)."""
    if os.geteuid() != 0:
        return f"needs root to make network namespaces, veths and cgroups (uid {os.geteuid()})"
    for tool in ("ip", "unshare", "hostname"):
        if shutil.which(tool) is None:
            return f"needs the {tool} command"
    if not (CPUSET / "cgroup.procs").exists():
        return f"needs a cgroup v1 cpuset hierarchy at {CPUSET}"
    if len(os.sched_getaffinity(0)) < ncpus:
        return f"needs {ncpus} CPUs to give each host its own (this process may use {len(os.sched_getaffinity(0))})"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"ip netns does not work here: {probe.stderr.strip()}"
    return ""


@dataclass
class Host:
    """One emulated machine. ``name``: its hostname (also what the others call it);
    ``netns``: its network namespace; ``addr``: its veth address (IPv4, on :data:`SUBNET`);
    ``cpus``: the logical CPU ids of its cpuset; ``cgroup``: its cpuset folder."""

    name: str
    netns: str
    addr: str
    cpus: tuple
    cgroup: Path
    procs: list = field(default_factory=list)

    def argv(self, command: Sequence[str]) -> list:
        """``command`` run as this host (its hostname, then its network namespace and
        /etc/hosts); the cgroup is entered by :meth:`enter`, which :meth:`popen` passes."""
        return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && ns=$1 && shift && exec ip netns exec "$ns" "$@"',
                self.name, self.netns, *command]

    def enter(self) -> None:
        """A ``preexec_fn``: the child joins this host's cpuset before anything else runs."""
        fd = os.open(self.cgroup / "cgroup.procs", os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)

    def popen(self, command: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``command`` on this host in a session of its own (its own process group);
        remembered, so that the end of :func:`hosts` stops it whatever happens."""
        proc = subprocess.Popen(self.argv(command), preexec_fn=self.enter, start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def pids(self) -> list:
        """The pids of every process running on this host (its cgroup's ``cgroup.procs``)."""
        try:
            return [int(p) for p in (self.cgroup / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def kill(self, timeout: float = 30.0) -> None:
        """SIGKILL every process of this host, as if the machine went away, and wait (up to
        ``timeout`` seconds) until none is left and the ones this test started are reaped.
        Raises RuntimeError when one is still there after that (not AssertionError: what a
        test asserts is about the job, not about the emulation)."""
        deadline = time.monotonic() + timeout
        while True:
            pids = self.pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for proc in self.procs:  # reap ours: a zombie stays in cgroup.procs until then
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.01 if pids else 0)
            if not pids:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: processes {pids} still there {timeout} s after SIGKILL")
            time.sleep(0.01)


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def _operstate(netns: str, dev: str) -> str:
    out = subprocess.run(["ip", "-n", netns, "-br", "link", "show", "dev", dev], capture_output=True, text=True,
                         timeout=30).stdout.split()
    return out[1] if len(out) > 1 else ""


def _cpu_split(n: int) -> list:
    """``n`` disjoint groups of the CPUs this process may use (one CPU each where there
    are exactly ``n``), in id order."""
    cpus = sorted(os.sched_getaffinity(0))
    per = len(cpus) // n
    return [tuple(cpus[i * per:(i + 1) * per]) for i in range(n)]


@contextlib.contextmanager
def hosts(n: int = 2) -> Iterator[list]:
    """``n`` (2) emulated hosts linked by one veth pair, as :class:`Host` objects; on exit
    every process on them is killed and everything made for them is removed (also after a
    failure or an interrupt: a removal that fails is raised at the end, after the others ran).
    The names hold a token unique to this call, this process's pid and random bits
    (hostnames ``clhPIDxRAND-a``, ``clhPIDxRAND-b``); hosts that a killed test run left
    behind are removed first (:func:`sweep`)."""
    if n != 2:
        raise ValueError("one veth pair links exactly two hosts")
    sweep()
    token = f"{os.getpid()}x{secrets.token_hex(2)}"
    letters = "ab"
    made: list = []
    undo: list = []  # callables, run in reverse order at the end
    try:
        mems = (CPUSET / "cpuset.mems").read_text().strip()
        for letter, cpus in zip(letters, _cpu_split(n)):
            name = f"clh{token}-{letter}"
            netns = name
            _ip("netns", "add", netns)
            undo.append(lambda ns=netns: _ip("netns", "delete", ns))
            cgroup = CPUSET / f"cpulaunch-host-{name}"
            cgroup.mkdir()
            host = Host(name, netns, f"{SUBNET}.{len(made) + 1}", cpus, cgroup)
            undo.append(lambda h=host: _remove_cgroup(h))
            (cgroup / "cpuset.cpus").write_text(",".join(map(str, cpus)))
            (cgroup / "cpuset.mems").write_text(mems)
            etc = NETNS_ETC / netns
            etc.mkdir(parents=True)
            undo.append(lambda d=etc: shutil.rmtree(d))
            made.append(host)
        a, b = made
        # Made in namespace a, its peer in b (neither ever in the machine's own namespace,
        # so the names need not be unique).
        veth_a, veth_b = "veth-a", "veth-b"
        _ip("-n", a.netns, "link", "add", veth_a, "type", "veth", "peer", "name", veth_b, "netns", b.netns)
        for host, veth in ((a, veth_a), (b, veth_b)):
            _ip("-n", host.netns, "addr", "add", f"{host.addr}/24", "dev", veth)
            _ip("-n", host.netns, "link", "set", veth, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
        for host, veth in ((a, veth_a), (b, veth_b)):  # a fresh pair shows NO-CARRIER for a moment
            wait_for(lambda h=host, v=veth: _operstate(h.netns, v) == "UP", f"{veth} up in {host.netns}", 30, RuntimeError)
        table = "127.0.0.1 localhost\n" + "".join(f"{h.addr} {h.name}\n" for h in made)
        for host in made:
            (NETNS_ETC / host.netns / "hosts").write_text(table)
        yield made
    finally:
        errors = []
        for host in made:
            try:
                host.kill()
            except Exception as e:  # noqa: BLE001 - reported below, after the rest is removed
                errors.append(e)
        for step in reversed(undo):
            try:
                step()
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        if errors:
            raise RuntimeError(f"removing the emulated hosts {token}: {errors}")


#: A name :func:`hosts` gives: group 1 is the pid of the process that made it.
NAME = re.compile(r"^clh(\d+)x[0-9a-f]{4}-[a-z]$")


def sweep() -> list:
    """Remove the hosts that a test run killed before its clean-up left behind (pytest
    SIGKILLed, the machine's power cut): every namespace, cpuset and /etc/netns folder
    named by :data:`NAME` whose maker's pid no longer runs, their processes killed first.
    Returns the names removed. Hosts of a run still going are left alone."""
    def gone(name: str) -> bool:
        match = NAME.match(name)
        if not match:
            return False
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    netns = {line.split()[0] for line in listed.splitlines() if line.strip()}
    names = set(netns)
    names |= {p.name for p in NETNS_ETC.glob("clh*")} if NETNS_ETC.is_dir() else set()
    names |= {p.name.removeprefix("cpulaunch-host-") for p in CPUSET.glob("cpulaunch-host-clh*")}
    removed = sorted(n for n in names if gone(n))
    for name in removed:
        cgroup = CPUSET / f"cpulaunch-host-{name}"
        if cgroup.is_dir():
            _remove_cgroup(Host(name, name, "", (), cgroup))
        if name in netns:
            _ip("netns", "delete", name)
        if (NETNS_ETC / name).is_dir():
            shutil.rmtree(NETNS_ETC / name)
    return removed


def _remove_cgroup(host: Host, timeout: float = 30.0) -> None:
    """rmdir the host's cpuset once its processes are gone (the kernel refuses while a
    task, even a zombie being reaped, is still in it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            host.cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            host.kill(timeout=max(0.0, deadline - time.monotonic()))
            time.sleep(0.01)

