"""Live multi-socket machines: a real Linux kernel booted under QEMU with the CPU and NUMA
layout we choose, running this checkout's cpulaunch (issue 23, docs/dev/live-machines.md).

The guest is started by virtme-ng (``vng``) with software emulation (TCG; ``/dev/kvm``
exists on the development machines but a vCPU never runs there) and shares the host's
root file system read-only over 9p, so the guest runs the host's own python3, numactl
and lscpu with ``PYTHONPATH=<checkout>:<site-packages>``. Boots are the cost (a boot and
one small command take 40-70 s; each Python start 4-12 s under emulation), so a test
boots each machine once and runs one job of many steps in it (tests/live_agent.py),
which writes its results to a folder shared read-write.

- :class:`Node` and :class:`Machine` describe a guest; :data:`MACHINES` is the catalogue
  the tests and ``scripts/live_machine.py`` use.
- :func:`missing` says in one line why no guest can be booted here (or None).
- :func:`boot` runs one job in one guest and returns a :class:`GuestRun`: each step's
  exit code, output and time, and the boot and total times. QEMU's PID is recorded by a
  wrapper script (``vng --qemu``) and the process is killed by that PID when the time
  is up (the whole ``timeout``, or ``boot_timeout`` before the job has begun), in a
  finally, and at interpreter exit (:func:`kill_leftovers`). The guest's serial console,
  the kernel's log included, is kept in the shared folder's console.log. A guest hit by
  an emulator fault (its kernel reports a lost timer interrupt, :data:`LOST_TIMER`, or its
  qemu dies of a signal nobody sent, as a segfault) is killed at once and booted again, up
  to :data:`FAULT_RETRIES` times.
- :func:`cpulaunch_step`, :func:`launch_step`, :func:`dump_step`: job steps.
- :func:`pack_dump` turns a dump folder written by the guest into a tarball laid out like
  the hwloc dumps in tests/fixtures (one top folder acting as ``/``).
"""

from __future__ import annotations

import atexit
import glob
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from cpulaunch import cpulist

REPO = Path(__file__).resolve().parent.parent
AGENT = REPO / "tests" / "live_agent.py"
PROBE = REPO / "tests" / "live_probe.py"
PYTHON = sys.executable
QEMU = "qemu-system-x86_64"
#: A CPU model whose CPUID reports SMT siblings under TCG (the default ``max`` shows each
#: thread as a core of its own).
CPU_MODEL = "-cpu max,vendor=GenuineIntel"
#: Environment variable naming the kernel to boot (default: the newest /boot/vmlinuz-*
#: that has its 9p modules).
KERNEL_ENV = "CPULAUNCH_LIVE_KERNEL"
#: Seconds a whole guest (boot, job, power-off) may take before it is killed: a guard
#: against a hung guest, not a budget (a loaded 2-core host stretches the 3-8 minutes).
DEFAULT_TIMEOUT = 2400.0
#: Seconds a guest may take from vng's start until its job begins (results.json appears):
#: a quiet host boots these machines in 18-36 s, a loaded one in about a minute. A guest
#: that has not begun by then is killed and its console (the kernel's log) kept.
BOOT_TIMEOUT = 420.0
#: The guest kernel's own diagnosis when an idle vCPU never got its timer interrupt: RCU's
#: grace-period thread sleeps on a timer of a halted CPU that never fires ("rcu_preempt
#: kthread timer wakeup didn't happen for N jiffies! ... Possible timer handling issue on
#: cpu=6", the CPU "idling at native_safe_halt"). Seen here under QEMU 7.2's TCG on a 16-
#: and a 12-CPU guest (2 of about 35 boots, quiet host, no load to starve a vCPU); from
#: then on the guest limps (udev times out after 5 min) or hangs. It is the emulator's
#: fault, not the job's: the guest is killed as soon as its console says so.
LOST_TIMER = re.compile(rb"rcu: \S+ kthread timer wakeup didn't happen")
#: Fresh boots after emulator faults: a lost timer interrupt (:data:`LOST_TIMER`) or a qemu
#: that died of a signal nobody sent (QEMU 7.2's TCG segfaulted once here, 1 s into a 2s2c
#: guest's boot, in CI on 2026-11-27; vng then exits 255). Each failed boot's files go to
#: WORKDIR/attempt-N/. A job step that fails, or a guest whose time runs out, is never
#: retried.
FAULT_RETRIES = 2


@dataclass(frozen=True)
class Node:
    """One NUMA node of a guest.

    mem_mb: its memory in MiB. cpus: its logical CPU ids as a kernel cpulist ("0-1,4"),
    in QEMU's numbering (CPU index = (socket * cores + core) * threads + thread, which
    the guest kernel keeps as its logical CPU id); None makes a memory-only node.
    """

    mem_mb: int
    cpus: str | None = None


@dataclass(frozen=True)
class Machine:
    """A guest's layout: ``sockets`` x ``cores`` (per socket) x ``threads`` (per core)
    logical CPUs, NUMA ``nodes`` (ids 0.. in order), ``distances`` as (node, node,
    distance) triples (QEMU needs every pair once when any is given; unset: 10 local,
    20 remote). ``ci``: part of the subset CI runs."""

    name: str
    summary: str
    sockets: int
    cores: int
    threads: int
    nodes: tuple
    distances: tuple = ()
    ci: bool = False
    #: MiB each launched instance touches (a quarter of the smallest node or less).
    touch_mb: int = 96
    #: ``--core-list`` and ``--node-list`` values planned on this machine.
    core_list: str = ""
    node_list: str = ""
    #: Extra scenarios run after the placement checks (names in :data:`SCENARIOS`).
    scenarios: tuple = ()

    @property
    def ncpus(self) -> int:
        return self.sockets * self.cores * self.threads

    @property
    def memory_mb(self) -> int:
        return sum(n.mem_mb for n in self.nodes)

    def socket_cpus(self, socket: int) -> frozenset:
        """Logical CPU ids of ``socket`` in QEMU's numbering."""
        per = self.cores * self.threads
        return frozenset(range(socket * per, (socket + 1) * per))

    def sockets_are_nodes(self) -> bool:
        """Whether every socket's CPUs are exactly one node's."""
        nodes = {cpulist.parse(n.cpus) for n in self.nodes if n.cpus}
        return all(self.socket_cpus(s) in nodes for s in range(self.sockets))

    def vng_args(self) -> list:
        """The ``vng`` options that make this layout."""
        smp = f"{self.ncpus},sockets={self.sockets},cores={self.cores},threads={self.threads}"
        args = ["--cpus", smp, "--memory", f"{self.memory_mb}M"]
        for node in self.nodes:
            spec = f"{node.mem_mb}M"
            for part in (node.cpus.split(",") if node.cpus else []):
                spec += f",cpus={part}"
            args += ["--numa", spec]
        for a, b, d in self.distances:
            args += ["--numa-distance", f"{a},{b}={d}"]
        return args + [f"--qemu-opts={CPU_MODEL}"]


def _socket_nodes(sockets: int, cores: int, per_socket: int, mem_mb: int) -> tuple:
    """``per_socket`` nodes of equal share per socket, CPUs in order."""
    size = cores // per_socket
    return tuple(Node(mem_mb, f"{i * size}-{i * size + size - 1}")
                 for i in range(sockets * per_socket))


def _distances(groups: list) -> tuple:
    """Every node pair once: 11 inside a group (a socket), 21 across."""
    where = {n: g for g, nodes in enumerate(groups) for n in nodes}
    ids = sorted(where)
    return tuple((a, b, 11 if where[a] == where[b] else 21)
                 for i, a in enumerate(ids) for b in ids[i + 1:])


MACHINES = {m.name: m for m in (
    # not in CI's subset: 2s2c-memonly below has its CPUs, nodes and plans, and a memory-only node
    Machine("2s2c", "2 sockets x 2 cores, a node per socket", 2, 2, 1,
            (Node(1024, "0-1"), Node(1024, "2-3")), ((0, 1, 21),),
            core_list="1-2", node_list="1"),
    Machine("2s2c2t", "2 sockets x 2 cores x 2 SMT threads, a node per socket", 2, 2, 2,
            (Node(1024, "0-3"), Node(1024, "4-7")), ((0, 1, 21),), ci=True,
            core_list="2-5", node_list="1"),
    Machine("2s2c-memonly", "2 sockets x 2 cores and a memory-only node (CXL-like)", 2, 2, 1,
            (Node(768, "0-1"), Node(768, "2-3"), Node(512)),
            ((0, 1, 21), (0, 2, 28), (1, 2, 28)), ci=True, touch_mb=64,
            core_list="1-2", node_list="1,2"),
    Machine("2s4c-snc2", "2 sockets x 4 cores, 2 nodes per socket (sub-NUMA)", 2, 4, 1,
            _socket_nodes(2, 4, 2, 512), _distances([[0, 1], [2, 3]]), touch_mb=64,
            core_list="1-4", node_list="1,2", scenarios=("verify", "offline-cgroup")),
    Machine("4s4c", "4 nodes x 4 CPUs (4 sockets x 4 cores)", 4, 4, 1,
            _socket_nodes(4, 4, 1, 512), _distances([[0], [1], [2], [3]]), touch_mb=64,
            core_list="3-12", node_list="0,3"),
    Machine("2s4c-uneven", "2 sockets x 4 cores; nodes of 3 and 5 CPUs, node 1 across "
            "both sockets (as cloud VMs have)", 2, 4, 1,
            (Node(768, "0-2"), Node(1280, "3-7")), ((0, 1, 21),), touch_mb=64,
            core_list="2-4", node_list="1"),
    Machine("1s12c-7+5", "1 socket x 12 cores, nodes of 7 and 5 cores", 1, 12, 1,
            (Node(1024, "0-6"), Node(1024, "7-11")), ((0, 1, 12),), touch_mb=64,
            core_list="5-8", node_list="1"),
)}


# --------------------------------------------------------------------------- host checks


def find_kernel() -> str | None:
    """The kernel to boot: $CPULAUNCH_LIVE_KERNEL, else the newest /boot/vmlinuz-VER
    whose /lib/modules/VER has the 9p modules sharing the root needs (Debian's
    ``-cloud`` kernels do not); None when there is none."""
    if os.environ.get(KERNEL_ENV):
        return os.environ[KERNEL_ENV]
    found = [k for k in glob.glob("/boot/vmlinuz-*")
             if glob.glob(f"/lib/modules/{k.split('vmlinuz-', 1)[1]}/kernel/fs/9p")
             and os.access(k, os.R_OK)]
    return max(found) if found else None


def missing() -> str | None:
    """One line saying what this machine lacks to boot a live guest, or None."""
    if os.uname().machine != "x86_64":
        return f"live guests need an x86_64 host (this is {os.uname().machine})"
    if not shutil.which(QEMU):
        return f"{QEMU} not found (apt-get install qemu-system-x86)"
    if not shutil.which("vng"):
        return "virtme-ng's vng not found (pip install virtme-ng)"
    if not any(shutil.which(b) for b in ("busybox-static", "busybox.static", "busybox")):
        return "a static busybox is needed by virtme-ng's init (apt-get install busybox-static)"
    if not find_kernel():
        return ("no /boot/vmlinuz-* with 9p modules in /lib/modules (apt-get install "
                f"linux-image-amd64, or set {KERNEL_ENV})")
    return None


# --------------------------------------------------------------------------- job steps


def guest_env() -> dict:
    """Environment of every step: this Python's site-packages on PYTHONPATH after the
    checkout, since steps run ``python3 -S`` (site's .pth files cost seconds per start
    under emulation)."""
    paths = dict.fromkeys([str(REPO), sysconfig.get_paths()["purelib"],
                           sysconfig.get_paths()["platlib"]])
    return {"PATH": f"{os.path.dirname(PYTHON)}:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                    "/usr/bin:/sbin:/bin",
            "PYTHONPATH": ":".join(paths), "HOME": "/root", "LC_ALL": "C.UTF-8", "TMPDIR": "/tmp"}


def cpulaunch_step(sid: str, *args: str, group: str | None = "plans", timeout: float = 600,
                   cgroup: str | None = None) -> dict:
    """A step running ``python3 -S -m cpulaunch ARGS``; plans share a group (concurrent)."""
    step = {"id": sid, "argv": [PYTHON, "-S", "-m", "cpulaunch", *args], "timeout": timeout}
    if group:
        step["group"] = group
    if cgroup:
        step["cgroup"] = cgroup
    return step


def plan_args(*args: str) -> list:
    """``--dry-run --format json`` with the library choices pinned (as conftest.plan_json)."""
    return ["--dry-run", "--format", "json", "--allocator", "default", "--omp-runtime", "gnu",
            *args, "true"]


def log_dir(workdir: Path, sid: str) -> Path:
    """The ``--log-dir`` of launch step ``sid`` (its plan.json is below, in the run folder)."""
    return workdir / "logs" / sid.replace("/", "_").replace("@", "_")


def launch_step(sid: str, workdir: Path, mb: int, *args: str, cgroup: str | None = None,
                probe_args: tuple = (), group: str | None = None) -> dict:
    """A real launch: ``cpulaunch ARGS --log-dir DIR python3 -S live_probe.py MB ...``."""
    return cpulaunch_step(sid, "--allocator", "default", "--omp-runtime", "gnu",
                          "--log-dir", str(log_dir(workdir, sid)), *args,
                          PYTHON, "-S", str(PROBE), str(mb), *probe_args,
                          group=group, cgroup=cgroup)


def dump_step(name: str, workdir: Path, cgroup: str | None = None) -> dict:
    """The guest's topology files as WORKDIR/dumps/NAME.json (tests/live_agent.py dump)."""
    step = {"id": f"dump/{name}", "argv": [PYTHON, "-S", str(AGENT), "dump",
                                           str(workdir / "dumps" / f"{name}.json")], "timeout": 300}
    if cgroup:
        step["cgroup"] = cgroup
    return step


def truth_steps(tag: str = "", cgroup: str | None = None) -> list:
    """What the kernel says, by its own tools: ``lscpu -e``, ``numactl -H`` and ``numactl
    --show`` (the CPUs and memory nodes this process may use), in ``cgroup`` if given."""
    steps = [{"id": f"lscpu{tag}", "argv": ["lscpu", "-e=CPU,NODE,SOCKET,CORE,ONLINE"]},
             {"id": f"numactl{tag}", "argv": ["numactl", "-H"]},
             {"id": f"numactl-show{tag}", "argv": ["numactl", "--show"]},
             {"id": f"uname{tag}", "argv": ["uname", "-r"]}]
    for step in steps:
        step["timeout"] = 60
        if cgroup:
            step["cgroup"] = cgroup
    return steps


# --------------------------------------------------------------------------- jobs

#: Requests planned (``--dry-run --format json``) on every machine, besides its own
#: ``--core-list`` and ``--node-list``: name -> options.
PLAN_MODES = {
    "per-socket": ("--instances-per-socket",),
    "per-socket-2": ("--instances-per-socket", "2"),
    "per-node": ("--instances-per-node",),
    "ninstances-3": ("--ninstances", "3"),
    # the sizes before the nodes and cache domains decided them (issue 22's --equal-sizes)
    "per-socket-2-equal": ("--instances-per-socket", "2", "--equal-sizes"),
    "ninstances-3-equal": ("--ninstances", "3", "--equal-sizes"),
    "logical": ("--instances-per-socket", "--use-logical-cores"),
    "budgets": ("--instances-per-node", "--dataloader-workers", "1"),
    "budgets-1": ("--ninstances", "1", "--dataloader-workers", "1", "--reserve-cores", "1"),
}
#: Requests planned inside the offline-CPU and cgroup scenarios.
SCENARIO_MODES = ("per-socket", "per-node", "ninstances-3")
#: Real launches on every machine: name -> options (the program is tests/live_probe.py).
LAUNCH_MODES = {
    "bind": ("--instances-per-node",),
    "preferred": ("--instances-per-node", "--mem-policy", "preferred"),
    "interleave": ("--ninstances", "1", "--mem-policy", "interleave"),
    "affinity": ("--instances-per-node", "--bind", "affinity"),
    "per-socket": ("--instances-per-socket",),  # where sockets are not nodes
}
CGROUP = "/sys/fs/cgroup/cpulaunch-live"


def plan_modes(machine: Machine) -> dict:
    """Every request planned on ``machine``: name -> options."""
    modes = dict(PLAN_MODES)
    modes["core-list"] = ("--core-list", machine.core_list)
    modes["node-list"] = ("--node-list", machine.node_list)
    return modes


def launch_modes(machine: Machine) -> dict:
    """The launches run on ``machine`` (per-socket only where sockets are not nodes)."""
    return {k: v for k, v in LAUNCH_MODES.items()
            if k != "per-socket" or not machine.sockets_are_nodes()}


def plan_steps(modes: dict, tag: str = "", cgroup: str | None = None) -> list:
    """One concurrent group: ``plan/NAME{tag}`` for each mode, and the topology drawn
    (``show/json{tag}``, ``show/text{tag}``)."""
    steps = [cpulaunch_step(f"plan/{k}{tag}", *plan_args(*v), group=f"plans{tag}", cgroup=cgroup)
             for k, v in modes.items()]
    steps.append(cpulaunch_step(f"show/json{tag}", "--show-topology", "--format", "json",
                                group=f"plans{tag}", cgroup=cgroup))
    steps.append(cpulaunch_step(f"show/text{tag}", "--show-topology", group=f"plans{tag}",
                                cgroup=cgroup))
    return steps


def launch_steps(machine: Machine, workdir: Path, modes: dict, tag: str = "",
                 cgroup: str | None = None) -> list:
    """``run/NAME{tag}``: one launch after the other (their instances run together)."""
    return [launch_step(f"run/{k}{tag}", workdir, machine.touch_mb, *v, cgroup=cgroup)
            for k, v in modes.items()]


def verify_steps(machine: Machine, workdir: Path) -> list:
    """``cpulaunch verify`` on two held instances (nodes 0 and 1), instance 1 having bound
    its own memory to node 0 (live_probe.py --plant 1:0): ``verify`` must flag it."""
    hold = "/tmp/cpulaunch-live-hold"
    verify = [PYTHON, "-S", "-m", "cpulaunch", "verify", "--format", "json", "{pids}"]
    return [{"id": "verify/mkdir", "mkdir": hold},
            launch_step("run/planted", workdir, 32, "--instances-per-node", "--node-list", "0,1",
                        probe_args=("--hold", hold, "--plant", "1:0"), group="verify"),
            {"id": "verify", "argv": [PYTHON, "-S", str(AGENT), "when-ready", hold, "2", *verify],
             "timeout": 900, "group": "verify"}]


def offline_cgroup_steps(machine: Machine, workdir: Path) -> list:
    """CPU 3 taken offline; then a cgroup v2 cpuset (CPUs 1-2,4-6, memory nodes 0,2)
    holding the launcher. Plans, launches and a dump in each state (tags @offline, @cgroup)."""
    modes = {k: PLAN_MODES[k] for k in SCENARIO_MODES}
    runs = {"bind": LAUNCH_MODES["bind"]}
    steps = [{"id": "offline", "write": "/sys/devices/system/cpu/cpu3/online", "text": "0"}]
    steps += truth_steps("@offline") + [dump_step("offline", workdir)]
    steps += plan_steps(modes, "@offline") + launch_steps(machine, workdir, runs, "@offline")
    steps += [{"id": "cgroup/mkdir", "mkdir": CGROUP},
              {"id": "cgroup/enable", "write": "/sys/fs/cgroup/cgroup.subtree_control", "text": "+cpuset"},
              {"id": "cgroup/cpus", "write": f"{CGROUP}/cpuset.cpus", "text": "1-2,4-6"},
              {"id": "cgroup/mems", "write": f"{CGROUP}/cpuset.mems", "text": "0,2"},
              dump_step("cgroup", workdir, cgroup=CGROUP)]
    steps += truth_steps("@cgroup", cgroup=CGROUP)
    steps += plan_steps(modes, "@cgroup", cgroup=CGROUP)
    return steps + launch_steps(machine, workdir, runs, "@cgroup", cgroup=CGROUP)


def ddp_steps(machine: Machine, workdir: Path) -> list:
    """``cpulaunch --ddp --backend gloo`` (one rank per socket) of tests/live_ddp.py."""
    return [cpulaunch_step("ddp", "--ddp", "--backend", "gloo", "--allocator", "default",
                           "--omp-runtime", "gnu", "--log-dir", str(log_dir(workdir, "ddp")),
                           PYTHON, "-S", str(REPO / "tests" / "live_ddp.py"),
                           group=None, timeout=3000)]


SCENARIOS = {"verify": verify_steps, "offline-cgroup": offline_cgroup_steps, "ddp": ddp_steps}


def job(machine: Machine, workdir: Path, scenarios: tuple | None = None,
        placement: bool = True) -> list:
    """The job of ``machine``: the kernel's own view (lscpu, numactl -H, a dump), with
    ``placement`` every plan and every launch, then ``scenarios`` (default: the
    machine's own; names of :data:`SCENARIOS`)."""
    steps = truth_steps() + [dump_step("base", workdir)]
    if placement:
        steps += plan_steps(plan_modes(machine))
        steps += launch_steps(machine, workdir, launch_modes(machine))
    for name in machine.scenarios if scenarios is None else scenarios:
        steps += SCENARIOS[name](machine, workdir)
    return steps

# --------------------------------------------------------------------------- booting


@dataclass
class GuestRun:
    """One guest's job: ``steps`` {step id: {"rc", "stdout", "stderr", "seconds",
    "timed_out"}}; ``done`` when the job ran to its end; ``boot_seconds`` (the guest's
    uptime when the job started), ``seconds`` (host wall time from vng's start to its
    exit); ``console``: vng's and the kernel's output (console.log: the guest's serial
    console, kernel messages included); ``workdir``: the shared folder (dumps/, logs/).
    ``timed_out``: the guest was killed because a time ran out; ``boot_timed_out``: that
    happened before its job began (a guest that never finished booting); ``faults``: the
    emulator fault of each boot that had one, in order ("lost timer interrupt", "qemu
    killed by SIGSEGV"); ``attempts``: boots made (one more than the faults unless the last
    boot had one too; the earlier boots' console, results, dumps, logs and qemu exits are in
    WORKDIR/attempt-N/)."""

    machine: Machine
    steps: dict
    done: bool
    boot_seconds: float | None
    seconds: float
    console: str
    workdir: Path
    rc: int | None = None
    timed_out: bool = False
    boot_timed_out: bool = False
    faults: list = field(default_factory=list)
    attempts: int = 1
    #: qemu PIDs killed by their recorded PID (the time ran out, or qemu outlived vng).
    killed: list = field(default_factory=list)

    @property
    def fault(self) -> str:
        """The last boot's emulator fault ("" when it had none)."""
        return self.faults[-1] if len(self.faults) == self.attempts else ""

    def step(self, sid: str) -> dict:
        """The record of step ``sid``; AssertionError with the console's end when absent."""
        if sid not in self.steps:
            raise AssertionError(f"{self.machine.name}: step {sid} did not run (done={self.done}, "
                                 f"timed out={self.timed_out}, boot timed out={self.boot_timed_out}, "
                                 f"emulator faults={self.faults}, boots={self.attempts}); "
                                 f"console ({self.workdir / 'console.log'}) ends:\n{self.console[-3000:]}")
        return self.steps[sid]


#: {qemu PID file: marker} of the guests not yet reaped (see :func:`kill_leftovers`).
LIVE_GUESTS: dict = {}


def recorded_qemus(pidfile: Path, marker: str) -> list:
    """PIDs the wrapper recorded whose process is still a qemu of this guest (its command
    line names the guest's shared folder, ",path=WORKDIR,"): a recycled PID is never touched."""
    try:
        pids = [int(x) for x in pidfile.read_text().split()]
    except (OSError, ValueError):
        return []
    alive = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace")
        except OSError:
            continue
        if marker in cmdline:
            alive.append(pid)
    return alive


def kill_qemus(pidfile: Path, marker: str, wait: float = 30.0) -> list:
    """SIGKILL this guest's recorded qemu processes and wait, up to ``wait`` seconds, until
    none of them is left (a killed qemu takes a moment to give back its guest's memory, and
    until then its command line still reads; it is not our child, so /proc is watched); the
    PIDs killed."""
    killed = []
    for pid in recorded_qemus(pidfile, marker):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait
    while killed and set(recorded_qemus(pidfile, marker)) & set(killed) and time.monotonic() < deadline:
        time.sleep(0.05)  # polls an observable state: the process gone
    return killed


def kill_leftovers() -> list:
    """Kill the qemu of every guest not yet reaped (at exit, or at a test session's end)."""
    killed = []
    for pidfile, marker in list(LIVE_GUESTS.items()):
        killed += kill_qemus(pidfile, marker)
        LIVE_GUESTS.pop(pidfile, None)
    return killed


def _write_wrapper(workdir: Path) -> Path:
    """A qemu wrapper (vng --qemu) that runs qemu as its child with core dumps off, appends
    qemu's PID to WORKDIR/qemu.pids and, when qemu ends, "PID STATUS" to WORKDIR/qemu.exits
    (the shell's status: 128+N when signal N ended it; vng itself only says 255). The
    background qemu keeps the wrapper's stdin (the explicit ``<&0``)."""
    qemu = shutil.which(QEMU)
    q = {name: shlex.quote(str(workdir / name)) for name in ("qemu.pids", "qemu.exits")}
    wrapper = workdir / "qemu-wrapper.sh"
    wrapper.write_text("#!/bin/sh\n"
                       "ulimit -c 0\n"
                       f"{shlex.quote(qemu)} \"$@\" <&0 &\n"
                       "pid=$!\n"
                       f"echo $pid >> {q['qemu.pids']}\n"
                       "wait $pid\n"
                       "status=$?\n"
                       f"echo \"$pid $status\" >> {q['qemu.exits']}\n"
                       "exit $status\n")
    wrapper.chmod(0o755)
    return wrapper


def qemu_fault(workdir: Path) -> str:
    """The emulator fault WORKDIR/qemu.exits records: "qemu killed by SIGSEGV" when a qemu
    of this boot died of a signal (read only after a guest that ended by itself: the
    harness's own kills end the boot otherwise), or ""."""
    try:
        lines = (workdir / "qemu.exits").read_text().split("\n")
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) == 2 and fields[1].isdigit() and 128 < int(fields[1]) < 128 + signal.NSIG:
            return f"qemu killed by {signal.Signals(int(fields[1]) - 128).name}"
    return ""


def precompile() -> None:
    """Write the checkout's bytecode (cpulaunch/__pycache__, as any import does where
    PYTHONDONTWRITEBYTECODE is unset): the guest's root is read-only, and compiling the
    package in every guest process costs seconds under emulation. A read-only checkout
    is left as it is."""
    import compileall

    compileall.compile_dir(str(REPO / "cpulaunch"), quiet=2)


def vng_argv(machine: Machine, workdir: Path, kernel: str) -> list:
    """The vng command that boots ``machine`` and runs WORKDIR/job.json in it."""
    run = [PYTHON, "-S", str(AGENT), "run", str(workdir / "job.json"), str(workdir / "results.json")]
    extra = []
    for path in {str(REPO), sys.prefix}:  # shared already when on the root's file system
        if os.stat(path).st_dev != os.stat("/").st_dev:
            extra.append(f"--rodir={path}")
    # --verbose: the kernel logs to the serial console (vng's stdout, console.log), so a
    # guest that hangs before its job leaves its boot log behind.
    return ["vng", "--run", kernel, "--disable-kvm", "--verbose", *machine.vng_args(),
            "--qemu", str(_write_wrapper(workdir)), f"--rwdir={workdir}", *extra,
            "--exec", shlex.join(run)]


def boot(machine: Machine, steps: list, workdir: Path, timeout: float = DEFAULT_TIMEOUT,
         boot_timeout: float = BOOT_TIMEOUT, fault_retries: int = FAULT_RETRIES) -> GuestRun:
    """Boot ``machine``, run ``steps`` in it (tests/live_agent.py), power it off.

    Args:
        machine: the layout. steps: job steps (see tests/live_agent.py). workdir: an empty
            or new host folder, shared read-write with the guest at the same path.
        timeout: seconds for everything; then the guest's qemu is killed by its recorded PID.
        boot_timeout: seconds until the job must have begun (the agent writes results.json
            first); a guest still booting then is killed the same way (``boot_timed_out``).
        fault_retries: fresh boots at most, each with the whole ``timeout``, after boots hit
            by an emulator fault (see :data:`FAULT_RETRIES`; a lost timer is killed at once).
    Returns: the :class:`GuestRun` of the last boot (partial when the time ran out).
    Raises: RuntimeError when :func:`missing` names something missing.
    """
    reason = missing()
    if reason:
        raise RuntimeError(reason)
    precompile()
    workdir = Path(workdir).resolve()
    (workdir / "job.json").write_text(json.dumps({"env": guest_env(), "cwd": str(REPO),
                                                  "steps": steps}))
    argv = vng_argv(machine, workdir, find_kernel())
    faults = []
    for attempt in range(1, fault_retries + 2):
        if attempt > 1:
            _set_aside(workdir, attempt - 1)
        run, fault = _boot_once(machine, argv, workdir, timeout, boot_timeout)
        if fault:
            faults.append(fault)
        run.attempts, run.faults = attempt, list(faults)
        if not fault:
            break
    return run


def _boot_once(machine: Machine, argv: list, workdir: Path, timeout: float,
               boot_timeout: float) -> tuple:
    """One boot of ``argv`` with ``workdir`` (see :func:`boot`): its :class:`GuestRun` and
    its emulator fault ("" when none)."""
    (workdir / "dumps").mkdir(parents=True, exist_ok=True)
    pidfile, marker = workdir / "qemu.pids", f"path={workdir},"
    if not LIVE_GUESTS:  # registered once a guest is about to start, not at import
        atexit.unregister(kill_leftovers)
        atexit.register(kill_leftovers)
    LIVE_GUESTS[pidfile] = marker
    t0, ended = time.monotonic(), "exited"
    with open(workdir / "console.log", "wb") as log:
        proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            ended = _supervise(proc, workdir, t0 + timeout, t0 + min(boot_timeout, timeout))
        finally:
            killed = _stop(proc, pidfile, marker)
    run = collect(machine, workdir, time.monotonic() - t0, proc.returncode,
                  ended in ("timeout", "boot-timeout"))
    run.killed, run.boot_timed_out = killed, ended == "boot-timeout"
    fault = ("lost timer interrupt" if ended == "lost-timer"
             else qemu_fault(workdir) if ended == "exited" else "")
    return run, fault


def _supervise(proc: subprocess.Popen, workdir: Path, deadline: float, boot_deadline: float) -> str:
    """Watch a running guest once a second until vng exits ("exited"), its kernel reports a
    lost timer interrupt in console.log ("lost-timer"), its job has not begun (no
    results.json) by ``boot_deadline`` ("boot-timeout") or ``deadline`` passes ("timeout");
    both deadlines in time.monotonic() seconds."""
    tail, begun = b"", False
    with open(workdir / "console.log", "rb") as console:
        while True:
            try:
                proc.wait(1.0)
                return "exited"
            except subprocess.TimeoutExpired:
                pass
            tail = tail[-200:] + console.read()
            if LOST_TIMER.search(tail):
                return "lost-timer"
            begun = begun or (workdir / "results.json").exists()
            now = time.monotonic()
            if not begun and now >= boot_deadline:
                return "boot-timeout"
            if now >= deadline:
                return "timeout"


def _set_aside(workdir: Path, attempt: int) -> None:
    """Move what boot ``attempt`` left in ``workdir`` to WORKDIR/attempt-N/."""
    aside = workdir / f"attempt-{attempt}"
    aside.mkdir()
    for name in ("console.log", "results.json", "dumps", "logs", "qemu.exits"):
        if (workdir / name).exists():
            (workdir / name).rename(aside / name)


def _stop(proc: subprocess.Popen, pidfile: Path, marker: str) -> list:
    """Kill the guest's qemu (by recorded PID) and vng's process group if still running;
    the qemu PIDs killed."""
    killed = kill_qemus(pidfile, marker)
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)
    if not recorded_qemus(pidfile, marker):
        LIVE_GUESTS.pop(pidfile, None)
    return killed


def collect(machine: Machine, workdir: Path, seconds: float = 0.0, rc=None,
            timed_out: bool = False) -> GuestRun:
    """The :class:`GuestRun` of what a guest left in ``workdir`` (results.json, console.log)."""
    try:
        results = json.loads((workdir / "results.json").read_text())
    except (OSError, ValueError):
        results = {"steps": {}, "done": False}
    console = (workdir / "console.log").read_bytes().decode("utf-8", "replace")
    return GuestRun(machine, results["steps"], results["done"], results.get("uptime"),
                    round(seconds, 1), console, workdir, rc, timed_out)


# --------------------------------------------------------------------------- dumps


def pack_dump(files: dict, tarball: Path, top: str) -> None:
    """Write ``files`` ({path below /: text}, tests/live_agent.py dump) as the bzip2
    tarball ``tarball`` with every path under the folder ``top``, laid out like the hwloc
    dumps (``top`` acts as ``/`` for ``--sysroot``); owners, modes and times fixed so that
    the same dump gives the same bytes."""
    folders = {top}
    for path in files:
        parts = path.split("/")[:-1]
        folders.update("/".join([top] + parts[:i]) for i in range(1, len(parts) + 1))
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, "w:bz2", format=tarfile.GNU_FORMAT) as tf:
        for name in sorted(folders):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tf.addfile(info)
        for path in sorted(files):
            data = files[path].encode("utf-8")
            info = tarfile.TarInfo(f"{top}/{path}")
            info.size, info.mode = len(data), 0o644
            tf.addfile(info, io.BytesIO(data))
