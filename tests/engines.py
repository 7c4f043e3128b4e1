"""Real distributed engines for the test suite: a one-node Slurm cluster and MPICH's mpirun.

Not collected by pytest (the file name does not start with ``test_``); the fixtures that use
it live in ``tests/test_engines.py``.

Slurm: :func:`slurm_cluster` starts, in a fresh temporary folder, a private ``munged`` (its
own key and socket, so an existing munge set-up on the host is neither needed nor touched),
``slurmctld`` and ``slurmd`` in the foreground as our own children, with a ``slurm.conf``
whose node line comes from ``slurmd -C`` (this machine's real CPUs, sockets, cores and
threads) and whose ports are free ports. Slurm's clients and daemons reach that munged
through ``AuthInfo=socket=...``. Every step is bounded by a timeout; on any failure to come
up it raises :class:`EngineUnavailable` with a reason naming the step and the tail of the
daemon's log, and the daemons are always stopped on the way out (jobs cancelled first).

MPICH: :func:`find_mpich` finds a Hydra ``mpirun`` (MPICH's, not Open MPI's) and
:class:`Mpich` runs ``mpirun -n N ...``.

Both clean their child environment of a surrounding engine's variables (``SLURM_*``,
``PMI_*``, ``HYDRA_*``...): when the suite itself runs inside a Slurm job, Hydra would
otherwise launch through that job's srun and our srun would try to join that job.

Exit-code facts measured here (Slurm 22.05.8, MPICH/Hydra 4.0.2); tests assert them:
  * srun returns the largest exit code of its tasks (tasks exiting 3 and 4 -> 4), and
    128+N for a task killed by signal N (SIGKILL -> 137);
  * ``sbatch --wait`` returns the batch script's exit code (so does ``scontrol show job``'s
    ExitCode, which :meth:`SlurmCluster.sbatch_wait` polls because it is faster);
  * Hydra's mpirun returns the bitwise OR of the ranks' exit codes (3 and 4 -> 7; one rank
    exiting 3 -> 3), and N for a rank killed by signal N (SIGKILL -> 9).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Mapping, Sequence

#: Seconds allowed for the whole Slurm start-up (munged, slurmctld, slurmd, node idle).
SLURM_START_TIMEOUT = 30.0
#: Seconds allowed for a daemon to exit after SIGTERM before it gets SIGKILL.
STOP_TIMEOUT = 10.0

#: Prefixes of environment variables set by a surrounding engine, removed from our children.
_FOREIGN_ENV_PREFIXES = ("SLURM_", "SLURMD_", "SBATCH_", "SALLOC_", "SRUN_", "PMI_", "PMIX_",
                         "HYDRA_", "MPIR_", "MPI_LOCAL", "OMPI_", "I_MPI_")


class EngineUnavailable(Exception):
    """The engine cannot run on this machine; ``str(exc)`` is the skip reason."""


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``os.environ`` without a surrounding engine's variables, plus ``extra``.

    Also drops the rendezvous variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT) so that only what the engine and cpulaunch set is seen.
    """
    drop = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT", "SLURM_CONF"}
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_FOREIGN_ENV_PREFIXES) and k not in drop}
    env.update(extra or {})
    return env


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that were free on 127.0.0.1 a moment ago."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path.name}: not written)"
    return f"{path.name}: " + " | ".join(text.strip().splitlines()[-lines:])


def _missing(binaries: Sequence[str]) -> list[str]:
    # The daemons live in /usr/sbin, which is not on every PATH.
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [b for b in binaries if shutil.which(b, path=path) is None]


def _which(binary: str) -> str:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    found = shutil.which(binary, path=path)
    assert found is not None, binary
    return found


# --------------------------------------------------------------------------------- Slurm

SLURM_BINARIES = ("munged", "mungekey", "munge", "unmunge", "slurmctld", "slurmd",
                  "srun", "sbatch", "sinfo", "squeue", "scancel", "scontrol")


@dataclasses.dataclass(frozen=True)
class NodeShape:
    """This machine as ``slurmd -C`` sees it. cpus: logical CPUs; the rest per Slurm's names."""

    name: str
    cpus: int
    boards: int
    sockets_per_board: int
    cores_per_socket: int
    threads_per_core: int

    @classmethod
    def parse(cls, text: str) -> "NodeShape":
        """From ``slurmd -C``'s first line, e.g. ``NodeName=vm CPUs=2 Boards=1
        SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105``."""
        fields = dict(item.split("=", 1) for item in text.split() if "=" in item)
        return cls(name=fields["NodeName"], cpus=int(fields["CPUs"]),
                   boards=int(fields.get("Boards", 1)),
                   sockets_per_board=int(fields["SocketsPerBoard"]),
                   cores_per_socket=int(fields["CoresPerSocket"]),
                   threads_per_core=int(fields["ThreadsPerCore"]))

    def conf_line(self) -> str:
        # RealMemory is left at Slurm's default (1 MB): tests do not ask for memory, and
        # a VM's NUMA node memory need not be its MemTotal (numactl -H showed 8.7 of 24.7 GB on one here).
        return (f"NodeName={self.name} NodeAddr=127.0.0.1 CPUs={self.cpus} "
                f"Boards={self.boards} SocketsPerBoard={self.sockets_per_board} "
                f"CoresPerSocket={self.cores_per_socket} ThreadsPerCore={self.threads_per_core} "
                "State=UNKNOWN")


SLURM_CONF_TEMPLATE = """\
# Written by tests/engines.py for a throw-away one-node cluster.
ClusterName=cpulaunchtest
# Random, so that clusters started at the same time on one host (parallel test sessions)
# do not number their jobs alike: cpulaunch --ddp derives MASTER_PORT from SLURM_JOB_ID.
FirstJobId={first_job_id}
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
{node_line}
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


#: JobState values of a job that has finished (COMPLETING is not one: output may still come).
_FINISHED_JOB_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                        "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


@dataclasses.dataclass
class SlurmCluster:
    """A running one-node cluster. ``env``: environment for Slurm clients (has SLURM_CONF)."""

    root: Path
    conf: Path
    node: NodeShape
    env: dict[str, str]
    daemons: dict[str, subprocess.Popen] = dataclasses.field(default_factory=dict)

    def srun(self, args: Sequence[str], env: Mapping[str, str] | None = None,
             timeout: float = 60.0, cwd: str | os.PathLike | None = None,
             ) -> subprocess.CompletedProcess:
        """Run ``srun ARGS`` (text output captured). ``env``: extra variables for the tasks.

        On timeout the cluster's jobs are cancelled and ``TimeoutExpired`` is raised.
        """
        argv = [_which("srun"), *map(str, args)]
        try:
            return subprocess.run(argv, env={**self.env, **(env or {})}, cwd=cwd,
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cancel_all()
            raise

    def sbatch_wait(self, script_text: str, env: Mapping[str, str] | None = None,
                    timeout: float = 60.0, cwd: str | os.PathLike | None = None,
                    ) -> tuple[int, str]:
        """Submit ``script_text`` with sbatch, wait for the job; return (exit code, output).

        The output is the job's stdout and stderr (one file). The exit code is the one
        ``scontrol show job`` reports for the batch script (ExitCode=CODE:SIGNAL), as
        128+SIGNAL when a signal ended it. It is polled every 0.2 s: ``sbatch --wait``
        reports the same code (5 for a script ending in ``exit 5``, measured) but polls with
        a growing interval, which made an 8 s job take 42 s here.

        On timeout the cluster's jobs are cancelled and ``TimeoutExpired`` is raised.
        """
        jobdir = Path(tempfile.mkdtemp(prefix="job.", dir=self.root))
        script = jobdir / "job.sh"
        script.write_text(script_text)
        out = jobdir / "out.txt"
        argv = [_which("sbatch"), "--parsable", f"--output={out}", f"--chdir={cwd or jobdir}",
                str(script)]
        run = dict(env={**self.env, **(env or {})}, stdin=subprocess.DEVNULL,
                   capture_output=True, text=True)
        deadline = time.monotonic() + timeout
        submitted = subprocess.run(argv, timeout=timeout, **run)
        if submitted.returncode != 0:
            return submitted.returncode, f"(sbatch failed: {submitted.stdout}{submitted.stderr})"
        job_id = submitted.stdout.strip().split(";")[0]
        while True:
            shown = subprocess.run([_which("scontrol"), "show", "job", "-o", job_id],
                                   timeout=10, **run)
            fields = dict(f.split("=", 1) for f in shown.stdout.split() if "=" in f)
            if fields.get("JobState") in _FINISHED_JOB_STATES:
                code, _, sig = fields.get("ExitCode", "0:0").partition(":")
                output = out.read_text(errors="replace") if out.exists() else "(no output)"
                return (128 + int(sig) if int(sig or 0) else int(code)), output
            if time.monotonic() > deadline:
                self.cancel_all()
                raise subprocess.TimeoutExpired(argv, timeout)
            time.sleep(0.2)

    def cancel_all(self, timeout: float = 10.0) -> None:
        """Cancel every job of this cluster and wait (bounded) until the queue is empty."""
        run = dict(env=self.env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            jobs = subprocess.run([_which("squeue"), "-h", "-o", "%A"], timeout=5, **run)
            ids = jobs.stdout.split()
            if not ids:
                return
            subprocess.run([_which("scancel"), *ids], timeout=5, **run)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                left = subprocess.run([_which("squeue"), "-h", "-o", "%A"], timeout=5, **run)
                if not left.stdout.split():
                    return
                time.sleep(0.2)

    def logs(self) -> str:
        """Tails of the daemon logs, for assertion messages."""
        return "\n".join(_tail(p) for p in sorted((self.root / "log").glob("*.log")))


def _read_node_shape(env: Mapping[str, str]) -> NodeShape:
    try:
        proc = subprocess.run([_which("slurmd"), "-C"], env=dict(env), capture_output=True,
                              text=True, timeout=15, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise EngineUnavailable("slurm: `slurmd -C` did not answer within 15 s") from exc
    first = proc.stdout.strip().splitlines()[:1]
    if proc.returncode != 0 or not first or not first[0].startswith("NodeName="):
        raise EngineUnavailable(f"slurm: `slurmd -C` failed (exit {proc.returncode}): "
                                f"{proc.stdout.strip()} {proc.stderr.strip()}")
    return NodeShape.parse(first[0])


def _start(argv: Sequence[str], log: Path, env: Mapping[str, str]) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(procs: Mapping[str, subprocess.Popen], root: Path) -> None:
    """SIGTERM then (after STOP_TIMEOUT) SIGKILL our daemons, newest first, and reap them.

    Also stops a process named in one of our pid files that is not one of our children
    (a daemon that forked after all), if its command line names our temporary folder.
    """
    for name, proc in reversed(list(procs.items())):
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)
    ours = {p.pid for p in procs.values()}
    for pidfile in (root / "run").glob("*.pid"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(pidfile.read_text().split()[0])
            if pid in ours:
                continue
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if str(root).encode() not in cmdline:
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT
            while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
                time.sleep(0.1)
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)


def _wait_for(what: str, check, deadline: float, procs: Mapping[str, subprocess.Popen],
              root: Path, start_timeout: float) -> None:
    """Poll ``check()`` until true; raise EngineUnavailable when a daemon dies or time is up."""
    while True:
        try:
            if check():
                return
        except subprocess.TimeoutExpired:  # a client blocked on a daemon: poll again
            pass
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise EngineUnavailable(
                    f"slurm: {name} exited with code {proc.returncode} while waiting for "
                    f"{what}; {_tail(root / 'log' / f'{name}.log')}")
        if time.monotonic() > deadline:
            logs = "; ".join(_tail(p, 5) for p in sorted((root / "log").glob("*.log")))
            raise EngineUnavailable(f"slurm: {what} not within {start_timeout:g} s; "
                                    f"{logs}")
        time.sleep(0.1)


@contextlib.contextmanager
def slurm_cluster(start_timeout: float = SLURM_START_TIMEOUT,
                  keep_dir: bool = False) -> Iterator[SlurmCluster]:
    """Start a one-node Slurm cluster in a temporary folder; stop it on exit (even on error).

    Raises:
        EngineUnavailable: binaries missing, munged refusing to start or to sign, or the
            node not idle within ``start_timeout`` seconds. The message is the skip reason.
    """
    missing = _missing(SLURM_BINARIES)
    if missing:
        raise EngineUnavailable(f"slurm: not installed ({', '.join(missing)} missing; "
                                "apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        raise EngineUnavailable("slurm: the test cluster runs its daemons as root "
                                f"(SlurmUser=root); running as uid {os.geteuid()}")
    deadline = time.monotonic() + start_timeout
    root = Path(tempfile.mkdtemp(prefix="cpulaunch-slurm."))
    # munged insists that every directory above its socket is world-executable, and that
    # its key and log are private.
    root.chmod(0o755)
    for sub, mode in (("run", 0o755), ("munge", 0o700), ("state", 0o700), ("spool", 0o755),
                      ("log", 0o755)):
        (root / sub).mkdir(mode=mode)
    procs: dict[str, subprocess.Popen] = {}
    base_env = clean_env()
    try:
        key = root / "munge" / "munge.key"
        made = subprocess.run([_which("mungekey"), "--create", f"--keyfile={key}"],
                              capture_output=True, text=True, timeout=10)
        if made.returncode != 0:
            raise EngineUnavailable(f"slurm: mungekey --create failed: {made.stderr.strip()}")
        sock = root / "run" / "munge.socket"
        procs["munged"] = _start(
            [_which("munged"), "--foreground", f"--socket={sock}", f"--key-file={key}",
             f"--pid-file={root / 'run' / 'munged.pid'}", f"--seed-file={root / 'munge' / 'seed'}",
             f"--log-file={root / 'log' / 'munged.log'}"],
            root / "log" / "munged.out", base_env)

        def munge_works() -> bool:
            if not sock.exists():
                return False
            cred = subprocess.run([_which("munge"), "-n", "-S", str(sock)],
                                  capture_output=True, timeout=5)
            back = subprocess.run([_which("unmunge"), "-S", str(sock)], input=cred.stdout,
                                  capture_output=True, timeout=5)
            return cred.returncode == 0 and back.returncode == 0

        _wait_for("munged signing credentials", munge_works, deadline, procs, root,
                  start_timeout)

        node = _read_node_shape(base_env)
        ctld_port, slurmd_port = free_ports(2)
        conf = root / "slurm.conf"
        conf.write_text(SLURM_CONF_TEMPLATE.format(
            first_job_id=random.randrange(1, 60_000_000), node=node.name,
            ctld_port=ctld_port, slurmd_port=slurmd_port, munge_socket=sock,
            root=root, node_line=node.conf_line()))
        env = {**base_env, "SLURM_CONF": str(conf)}
        procs["slurmctld"] = _start([_which("slurmctld"), "-D", "-f", str(conf)],
                                    root / "log" / "slurmctld.out", env)
        procs["slurmd"] = _start([_which("slurmd"), "-D", "-f", str(conf)],
                                 root / "log" / "slurmd.out", env)
        cluster = SlurmCluster(root=root, conf=conf, node=node, env=env, daemons=procs)
        last: list[str] = []

        def node_idle() -> bool:
            proc = subprocess.run([_which("sinfo"), "-h", "-N", "-o", "%T"], env=env,
                                  capture_output=True, text=True, timeout=5,
                                  stdin=subprocess.DEVNULL)
            last[:] = [proc.stdout.strip() or proc.stderr.strip()]
            return proc.returncode == 0 and proc.stdout.split() == ["idle"]

        try:
            _wait_for("node idle in sinfo", node_idle, deadline, procs, root, start_timeout)
        except EngineUnavailable as exc:
            raise EngineUnavailable(f"{exc}; last sinfo: {last[:1]}") from None
        try:
            yield cluster
        finally:
            cluster.cancel_all()
    finally:
        _stop(procs, root)
        if not keep_dir:
            shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------------- MPICH

def find_mpich() -> str:
    """The path of MPICH's Hydra ``mpirun``.

    Debian's alternatives may point ``mpirun`` at Open MPI, whose ranks see other variables
    (OMPI_COMM_WORLD_RANK), so MPICH's own names are tried first and ``mpirun`` is accepted
    only if ``--version`` says HYDRA.

    Raises:
        EngineUnavailable: no MPICH mpirun found.
    """
    seen = []
    for name in ("mpirun.mpich", "mpiexec.mpich", "mpiexec.hydra", "mpirun", "mpiexec"):
        path = shutil.which(name)
        if path is None:
            continue
        try:
            version = subprocess.run([path, "--version"], capture_output=True, text=True,
                                     timeout=10, stdin=subprocess.DEVNULL).stdout
        except (subprocess.SubprocessError, OSError):
            continue
        if "HYDRA" in version:
            return path
        seen.append(f"{path} (not MPICH's Hydra)")
    raise EngineUnavailable("mpich: no MPICH mpirun found"
                            + (f" ({', '.join(seen)})" if seen else "")
                            + "; apt-get install mpich")


@dataclasses.dataclass(frozen=True)
class Mpich:
    """MPICH's Hydra process manager. ``mpirun``: absolute path of its mpirun."""

    mpirun: str

    def run(self, n: int, args: Sequence[str], env: Mapping[str, str] | None = None,
            timeout: float = 60.0, cwd: str | os.PathLike | None = None,
            hydra_args: Sequence[str] = ()) -> subprocess.CompletedProcess:
        """Run ``mpirun HYDRA_ARGS -n N ARGS`` (text output captured).

        ``hydra_args``: Hydra's global options, e.g. ``["-f", hostfile, "-ppn", "2"]``
        (they must come before ``-n``). ``env``: extra variables for the ranks. On timeout
        the whole mpirun process group (Hydra's proxy and the ranks) is killed and
        ``TimeoutExpired`` is raised.
        """
        argv = [self.mpirun, *map(str, hydra_args), "-n", str(n), *map(str, args)]
        return run_together([argv], env=env, timeout=timeout, cwd=cwd)[0]


def run_together(argvs: Sequence[Sequence[str]], env: Mapping[str, str] | None = None,
                 timeout: float = 60.0, cwd: str | os.PathLike | None = None,
                 ) -> list[subprocess.CompletedProcess]:
    """Start every argv at once (each in its own session, environment ``clean_env(env)``),
    wait for all of them to a common deadline, and return their results in order.

    For launchers that must meet each other (two ``cpulaunch --ddp --nnodes 2`` "machines"
    on one host). On timeout every process group is killed and ``TimeoutExpired`` raised.
    """
    procs = [subprocess.Popen([str(a) for a in argv], env=clean_env(env), cwd=cwd,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
             for argv in argvs]
    deadline = time.monotonic() + timeout
    results = []
    try:
        for argv, proc in zip(argvs, procs):
            out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
            results.append(subprocess.CompletedProcess(list(argv), proc.returncode, out, err))
    except subprocess.TimeoutExpired:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        raise
    return results


def mpich() -> Mpich:
    """An :class:`Mpich` for this host. Raises EngineUnavailable (the skip reason) if absent."""
    return Mpich(find_mpich())


if __name__ == "__main__":  # manual check: python tests/engines.py
    with slurm_cluster() as c:
        print(c.node, c.srun(["-n", "2", sys.executable, "-c", "import os; "
                              "print(os.environ['SLURM_PROCID'], os.sched_getaffinity(0))"]))
    print(mpich().run(2, [sys.executable, "-c", "import os; print(os.environ['PMI_RANK'])"]))
