"""Everyday use (issue 40): silent when all is well, -q, and the usual slips answered in one
line with their fix and exit code 2.

Real child processes (``python -m cpulaunch``) for what a person sees; the note levels and
the one filter (:func:`cpulaunch.notes.say`) also in-process, with a recording logger.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from conftest import REPO, run_cli
from cpulaunch import notes, slips
from cpulaunch.machine import libraries
from cpulaunch.machine.libfinder import find

XEON = "hw-32intel64-2p8co2t+8ve"
HYBRID = "hw-20em64t-hybrid-1p6c2t+2ca4co1t"  # one package, one NUMA node
PY = sys.executable
HAS_NUMACTL = shutil.which("numactl") is not None
HAS_TCMALLOC = find(libraries.REGISTRY["tcmalloc"], os.environ) is not None


def own_lines(stderr: str) -> list[str]:
    """cpulaunch's own lines on stderr (each starts with ``cpulaunch:``)."""
    return [line for line in stderr.splitlines() if line.startswith("cpulaunch")]


def quiet_env(**more) -> dict:
    """The user's shell: no PYTHONUNBUFFERED (this machine sets it; a user's shell does not,
    and a kept PYTHONUNBUFFERED is a note of its own), no CPULAUNCH_* or OMP_* of ours."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CPULAUNCH_", "OMP_", "KMP_")) and k not in ("PYTHONUNBUFFERED", "LD_PRELOAD")}
    env.update(more)
    return env


def run(*args: str, env: dict | None = None, check_rc: int | None = 0, timeout: float = 120):
    """``python -m cpulaunch ARGS`` with exactly ``env`` (run_cli adds to os.environ)."""
    import subprocess

    proc = subprocess.run([PY, "-m", "cpulaunch", *args], capture_output=True, text=True, timeout=timeout,
                          env=env if env is not None else quiet_env(), cwd=REPO)
    if check_rc is not None:
        assert proc.returncode == check_rc, (proc.returncode, proc.stdout, proc.stderr)
    return proc


# --------------------------------------------------------------------------- levels, one filter


class Recorder:
    """A logger with cpulaunch.log's methods that records (level, text); ``level`` is the
    command line's (30 default, 20 with -v, 40 with -q)."""

    def __init__(self, level: int) -> None:
        self.level, self.lines = level, []

    def isEnabledFor(self, level: int) -> bool:
        return level >= self.level

    def _emit(self, level, msg, *args):
        if level >= self.level:
            self.lines.append((level, msg % args))

    def info(self, msg, *args):
        self._emit(20, msg, *args)

    def warning(self, msg, *args):
        self._emit(30, msg, *args)


SAMPLE = (
    "OMP_NUM_THREADS=3 from your environment kept (cpulaunch planned 4); pass --override-env to use cpulaunch's value",
    notes.explain("MASTER_PORT=41234: a port free on this machine when planned (pass --master-port to fix it)"),
    notes.advice("numactl not found: CPUs bound with sched_setaffinity instead and memory binding dropped "
                 "(apt-get install numactl)", "numactl", "memory not bound"),
    notes.advice("tcmalloc not found: using the C library's malloc (apt-get install libtcmalloc-minimal4 to get it)",
                 "tcmalloc", "the C library's malloc"),
)


def test_by_default_what_differs_is_said_and_the_advice_is_one_line():
    log = Recorder(30)
    notes.say(SAMPLE, log)
    assert log.lines == [
        (30, f"note: {SAMPLE[0]}"),
        (30, "note: numactl, tcmalloc not found here: memory not bound, the C library's malloc "
             "(`cpulaunch doctor` says how to install them; -v for details)"),
    ]


def test_verbose_says_every_note_in_full_and_quiet_none():
    log = Recorder(20)
    notes.say(SAMPLE, log)
    assert log.lines == [(30, f"note: {SAMPLE[0]}")] + [(20, f"note: {n}") for n in SAMPLE[1:]]
    log = Recorder(40)
    notes.say(SAMPLE, log)
    assert log.lines == []


def test_a_note_is_its_text_and_keeps_its_level_when_rewritten():
    n = notes.explain("exit hook installed")
    assert n == "exit hook installed" and json.dumps([n]) == '["exit hook installed"]'
    assert notes.level_of(notes.retext(n, "exit hook installed.")) is notes.Level.EXPLAIN
    assert notes.level_of("a plain str") is notes.Level.DIFFERS  # unclassified: shown, never hidden
    import pickle

    assert notes.level_of(pickle.loads(pickle.dumps(n))) is notes.Level.EXPLAIN


def test_the_plan_notes_carry_their_level(sysroots):
    """The planner's and the DDP planner's notes are made with their level (data, not
    words matched later): the free port, the backend and the hook explain; a kept
    variable differs."""
    import cpulaunch

    env = {"OMP_NUM_THREADS": "3"}
    rendered = cpulaunch.plan_instances(("python", "x.py"), environ=env, sysroot=str(sysroots[XEON]), ddp=True,
                                        backend="gloo", allocator="default")
    levels = {n.split(":")[0].split(" ")[0]: notes.level_of(n) for n in rendered.notes}
    assert levels["OMP_NUM_THREADS=3"] is notes.Level.DIFFERS
    assert levels["backend"] is notes.Level.EXPLAIN
    assert levels["exit"] is notes.Level.EXPLAIN
    assert any(k.startswith("MASTER_PORT") and v is notes.Level.EXPLAIN for k, v in levels.items())


@pytest.mark.parametrize("machine, level", [(HYBRID, notes.Level.EXPLAIN), (XEON, notes.Level.DIFFERS)])
def test_bind_affinity_warns_of_unbound_memory_only_where_a_policy_would_matter(sysroots, machine, level):
    """--bind affinity's "memory is not bound" note: where the job has one memory node, a
    memory policy and the first touch put every page there alike, so the note explains (a
    run prints it with -v); with two nodes it differs from what was asked (shown). The dry
    run keeps it either way."""
    import cpulaunch

    rendered = cpulaunch.plan_instances(("true",), environ={}, sysroot=str(sysroots[machine]), bind="affinity",
                                        allocator="default")
    (note,) = [n for n in rendered.notes if n.startswith("memory is not bound")]
    assert notes.level_of(note) is level


def test_one_memory_node_counts_the_nodes_the_cpuset_allows(sysroots):
    """The cgroup's cpuset.mems narrows the nodes a job allocates on (cpuset(7)): two nodes
    with memory, one allowed, is one memory node."""
    from cpulaunch.machine.probe import probe

    topo = probe(sysroots[XEON])
    assert topo.usable_memory_nodes == {0, 1}
    assert topo._replace(allowed_mems=frozenset({1})).usable_memory_nodes == {1}
    assert topo._replace(allowed_mems=frozenset({0, 1, 2})).usable_memory_nodes == {0, 1}


# --------------------------------------------------------------------------- real runs


def test_a_run_on_a_machine_with_nothing_to_fix_says_nothing():
    if not (HAS_NUMACTL and HAS_TCMALLOC):
        pytest.skip("numactl or tcmalloc missing here: doctor has something to fix (scripts/test.sh installs both)")
    proc = run(PY, "-c", "print('hello')")
    assert proc.stdout == "hello\n" and own_lines(proc.stderr) == [], proc.stderr


def test_the_inference_example_says_nothing_of_cpulaunchs_own():
    pytest.importorskip("torch")
    if not (HAS_NUMACTL and HAS_TCMALLOC):
        pytest.skip("numactl or tcmalloc missing here (scripts/test.sh installs both)")
    proc = run(PY, "examples/infer.py", "--model", "mlp", "--seconds", "0.2", timeout=300)
    assert "CPULAUNCH_METRIC samples_per_s=" in proc.stdout and own_lines(proc.stderr) == [], proc.stderr


def test_a_ddp_run_says_nothing_of_its_own_choices():
    """The port it picked, the backend (none asked), the exit hook: -v's, not the run's."""
    pytest.importorskip("torch")
    if not (HAS_NUMACTL and HAS_TCMALLOC):
        pytest.skip("numactl or tcmalloc missing here (scripts/test.sh installs both)")
    proc = run("--ddp", "--nproc-per-node", "2", PY, "examples/ddp_min.py", timeout=300)
    assert own_lines(proc.stderr) == [], proc.stderr
    assert proc.stdout.count("loss") == 2, proc.stdout
    verbose = run("-v", "--ddp", "--nproc-per-node", "2", "--dry-run", PY, "examples/ddp_min.py")
    assert "# note: exit hook installed" in verbose.stdout and "# note: MASTER_PORT=" in verbose.stdout


def test_without_numactl_a_run_says_one_line_that_suggests_nothing_impossible(tmp_path):
    """PATH without numactl (as tests/test_live.py hides it): one line, pointing at doctor,
    never "use --bind numactl"; -v says the whole note; -q says nothing."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(PY)
    env = quiet_env(PATH=str(bindir))
    proc = run("python", "-c", "pass", env=env)
    lines = own_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert "numactl" in lines[0] and "cpulaunch doctor" in lines[0] and "--bind numactl" not in lines[0]
    verbose = run("-v", "python", "-c", "pass", env=env)
    assert "numactl not found: CPUs bound with sched_setaffinity" in verbose.stderr
    assert "--bind numactl" not in verbose.stderr
    assert run("-q", "python", "-c", "pass", env=env).stderr == ""
    plan = json.loads(run("--dry-run", "--format", "json", "python", "-c", "pass", env=env).stdout)
    assert any(n.startswith("numactl not found") for n in plan["notes"])  # the plan's record keeps it


def test_bind_affinity_without_numactl_does_not_suggest_it(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(PY)
    plan = json.loads(run("--dry-run", "--format", "json", "--bind", "affinity", "--mem-policy", "bind", "python",
                          "-c", "pass", env=quiet_env(PATH=str(bindir))).stdout)
    (memory,) = [n for n in plan["notes"] if n.startswith("memory is not bound")]
    assert memory.endswith("; numactl, which would bind memory, is not installed here"), memory
    assert not any("--bind numactl" in n for n in plan["notes"]), plan["notes"]


def _memory_nodes_here() -> set:
    """This machine's NUMA nodes with memory that this process may allocate on, read
    straight from sysfs and /proc/self/status (not through cpulaunch)."""
    from cpulaunch import cpulist

    try:
        with open("/sys/devices/system/node/has_memory") as f:
            nodes = set(cpulist.parse(f.read().strip()))
    except FileNotFoundError:
        nodes = {0}  # a kernel without NUMA: one node
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Mems_allowed_list:"):
                nodes &= set(cpulist.parse(line.split(":", 1)[1].strip()))
    return nodes


def test_bind_affinity_run_says_memory_is_unbound_where_it_matters():
    """A real --bind affinity run: on one memory node (these 2-vCPU machines) it prints
    nothing of its own and the note only with -v; with more nodes, the note."""
    args = ("--bind", "affinity", "--allocator", "default", "true")
    memory = [ln for ln in own_lines(run(*args).stderr) if "memory is not bound" in ln]
    verbose = [ln for ln in own_lines(run("-v", *args).stderr) if "memory is not bound" in ln]
    assert len(verbose) == 1, verbose
    assert memory == ([] if len(_memory_nodes_here()) == 1 else verbose)


def test_quiet_prints_errors_only():
    assert run("-q", "--ddp", "--nproc-per-node", "2", "true").stderr == ""
    proc = run("-q", "--ninstances", "999", "true", check_rc=2)
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("cpulaunch: error: --ninstances 999")
    proc = run("--quiet", "--ninstances", "2", PY, "-c", "raise SystemExit(3)", check_rc=3)
    assert len(own_lines(proc.stderr)) == 1, proc.stderr  # the failure is an error: said under -q


def test_the_dry_run_keeps_every_note():
    text = run("--ddp", "--nproc-per-node", "2", "--dry-run", PY, "examples/ddp_min.py").stdout
    assert "# note: exit hook installed" in text and "# note: MASTER_PORT=" in text and "# note: backend " in text


# --------------------------------------------------------------------------- slips


@pytest.fixture()
def xeon(sysroots):
    return str(sysroots[XEON])


def slip(*args: str) -> str:
    """The one line a slip gets (exit 2, nothing on stdout)."""
    proc = run(*args, check_rc=2)
    lines = proc.stderr.splitlines()
    assert proc.stdout == "" and len(lines) == 1 and lines[0].startswith("cpulaunch: error: "), proc.stderr
    return lines[0]


def test_a_real_run_with_sysroot_is_refused(xeon):
    line = slip("--sysroot", xeon, "--instances-per-socket", PY, "-c", "pass")
    assert line == "cpulaunch: error: --sysroot describes another machine: add --dry-run, --print-env or --show-topology"
    assert slip("--sysroot", xeon, "--bind", "affinity", "true") == line
    run("--sysroot", xeon, "--dry-run", "--instances-per-socket", "true")  # the way it is meant


@pytest.mark.parametrize("word, fix", [
    ("docter", "did you mean `cpulaunch doctor`?"),
    ("verfy", "did you mean `cpulaunch verify`?"),
    ("tun", "did you mean `cpulaunch tune`?"),
    ("help", "did you mean `cpulaunch --help`?"),
])
def test_a_word_near_a_subcommand_gets_did_you_mean(word, fix):
    assert slip(word).endswith(fix)


def test_a_subcommand_after_global_options(xeon):
    proc = run("-v", "--sysroot", xeon, "doctor", check_rc=None)
    assert proc.returncode in (0, 1) and proc.stdout.startswith(f"cpulaunch doctor: sysroot {xeon}"), proc.stderr
    assert proc.stdout == run("doctor", "--sysroot", xeon, check_rc=None).stdout


def test_doctor_says_the_isa_sentence_once(xeon):
    text = run("doctor", "--sysroot", xeon, check_rc=None).stdout
    isa = next(line for line in text.splitlines() if line.startswith("info  isa: ") or line.startswith("WARN  isa: "))
    meaning = isa.split(": ", 3)[-1]
    assert text.count(meaning) == 1, text


def test_run_cpus_space_separated_sizes_get_the_comma_form():
    line = slip("--ncores-per-instance", "1", "1", "python", "x.py")
    assert line.endswith("--ncores-per-instance takes its sizes joined by commas (--ncores-per-instance 1,1)")


def test_a_file_that_is_not_executable_gets_its_fix(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("echo hi\n")
    line = slip(str(script))
    assert "is a file but not an executable one" in line and f"chmod +x {script}" in line
    assert f"cpulaunch sh {script}" in line
    assert "chmod +x README.md" in slip("README.md")


def test_an_interface_this_machine_lacks_is_refused():
    here = sorted(os.listdir("/sys/class/net"))
    line = slip("--ddp", "--iface", "nosuch9", "true")
    assert line.startswith("cpulaunch: error: --iface nosuch9: no such network interface on this machine")
    assert ", ".join(here) in line
    run("--ddp", "--iface", here[0], "--dry-run", "true")  # one it has plans


def test_a_port_glued_to_master_addr_is_given_to_master_port():
    line = slip("--ddp", "--nnodes", "2", "--node-rank", "1", "--master-addr", "node0:29500", "--dry-run", "true")
    assert line.endswith("--master-addr node0:29500: a host name or address only; give the port to --master-port "
                         "(--master-addr node0 --master-port 29500)")


def test_a_config_key_typo_gets_did_you_mean(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("ninstance = 2\n")
    assert slip("--config", str(cfg), "--dry-run", "true").endswith("'ninstance' is not a cpulaunch setting; "
                                                                    "did you mean ninstances?")
    cfg.write_text("omp-runtim = 'gnu'\n")
    assert slip("--config", str(cfg), "--dry-run", "true").endswith("did you mean omp-runtime?")


def test_nproc_per_node_without_ddp_says_to_add_it():
    assert slip("--nproc-per-node", "2", "true") == ("cpulaunch: error: --nproc-per-node 2 applies to --ddp only; "
                                                     "add --ddp or drop it")


def test_slips_are_pure_text():
    assert slips.did_you_mean("docter", slips.SUBCOMMANDS) == "doctor"
    assert slips.did_you_mean("python", slips.SUBCOMMANDS) is None
    assert slips.master_addr_problem("10.0.0.1", "--master-addr 10.0.0.1") is None
    assert slips.master_addr_problem("fe80::1", "--master-addr fe80::1") is None
    assert slips.master_addr_problem("http://node0", "x") == "x: a host name or address, not a URL (e.g. --master-addr node0)"
    assert slips.iface_problem("eth0", None, "--iface eth0") is None  # another machine's plan: not checked


def test_the_subcommands_are_one_list():
    from cpulaunch import cli

    assert slips.SUBCOMMANDS == cli.SUBCOMMANDS
