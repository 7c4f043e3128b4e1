"""cpulaunch.tools.verify: real child processes with known affinity, threads, preloads and memory
policy, read from /proc and compared with a plan; the parsers on literal text; a generated
/proc tree under a root."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cpulaunch import cpulist
from cpulaunch.tools import verify
from cpulaunch.machine import libfinder, libraries
from cpulaunch.machine import proc as procfs
from cpulaunch.tools.verify import Expected

ALLOWED = sorted(os.sched_getaffinity(0))
C = ALLOWED[-1]  # the CPU children are pinned to
TWO_CPUS = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two allowed CPUs")
OVERSUB_HINT = "oversubscribed (set OMP_NUM_THREADS / torch.set_num_threads and DataLoader num_workers to fit)"
fmt = cpulist.format

PRELUDE = """
import json, os, sys, threading, time
def spin(seconds):
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass
def ready(**info):
    print("ready " + json.dumps(info), flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def child(script: str, env: dict | None = None, prefix: tuple = ()):
    """Start ``python -c PRELUDE+script`` (after ``prefix``, e.g. numactl), wait for its
    ``ready {json}`` line, yield (pid of the python process, info); kill its group after."""
    # Nothing the test runner carries (OMP_*, KMP_*, CPULAUNCH_*, LD_PRELOAD) leaks into the child.
    full_env = {k: v for k, v in os.environ.items() if not procfs.ENV_KEPT.match(k)}
    full_env.update(env or {})
    proc = subprocess.Popen([*prefix, sys.executable, "-c", PRELUDE + script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=full_env, start_new_session=True)
    try:
        ok, _, _ = select.select([proc.stdout], [], [], 60)
        assert ok, "child did not get ready within 60 s"
        line = proc.stdout.readline()
        assert line.startswith("ready "), (line, proc.poll())
        yield proc.pid, json.loads(line[len("ready "):])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _comm() -> str:
    return Path(sys.executable).name[:15]


# --------------------------------------------------------------------------- affinity, threads


def test_pinned_child_with_idle_threads_matches_plan():
    script = f"""
os.sched_setaffinity(0, {{{C}}})
ev = threading.Event()
ts = [threading.Thread(target=ev.wait, daemon=True) for _ in range(3)]
[t.start() for t in ts]
ready(tids=[t.native_id for t in ts])
"""
    with child(script) as (pid, info):
        view = procfs.inspect(pid)
    assert view.pid == pid and view.name == _comm() and view.cmdline[:2] == (sys.executable, "-c")
    assert view.cpus == frozenset({C})
    assert [t.tid for t in view.threads] == [pid] + sorted(info["tids"])
    assert all(t.cpus == frozenset({C}) for t in view.threads)
    # Threads that only wait are not compute threads.
    assert [t.busy for t in view.threads[1:]] == [False, False, False]
    assert view.children == ()
    assert verify.compare(Expected(index=0, bound_cpus=(C,), cpus=(C,)), view) == []


def test_busy_threads_oversubscribe_the_instance():
    script = f"""
os.sched_setaffinity(0, {{{C}}})
done = [threading.Event() for _ in range(3)]
def work(ev):
    spin(0.3)
    ev.set()
    threading.Event().wait()
ts = [threading.Thread(target=work, args=(d,), daemon=True) for d in done]
[t.start() for t in ts]
[d.wait() for d in done]
ready(tids=[t.native_id for t in ts])
"""
    with child(script) as (pid, info):
        view = procfs.inspect(pid)
    assert [t.busy for t in view.threads[1:]] == [True, True, True]
    assert all(t.cpu_seconds >= 0.3 - 0.011 for t in view.threads[1:])  # one clock tick of rounding
    assert verify.compare(Expected(index=0, bound_cpus=(C,), cpus=(C,)), view) == [
        f"instance 0: 4 busy threads (of 4 threads in 1 process(es)) on 1 CPU(s) {C}: {OVERSUB_HINT}"
    ]
    if len(ALLOWED) >= 2:
        # Planned on every allowed CPU, but all four busy threads sit on one of them.
        tids = ", ".join(str(t) for t in [pid] + sorted(info["tids"]))
        oversub = (f"instance 0: 4 busy threads (of 4 threads in 1 process(es)) on {len(ALLOWED)} CPU(s) "
                   f"{fmt(ALLOWED)}: {OVERSUB_HINT}")
        assert verify.compare(Expected(index=0, bound_cpus=tuple(ALLOWED)), view) == [
            f"instance 0: 4 busy threads pinned to CPU {C} alone (threads {tids}): they take turns on one CPU",
        ] + ([oversub] if len(ALLOWED) < 4 else [])


@TWO_CPUS
def test_program_that_widens_its_own_affinity_is_reported():
    script = f"""
os.sched_setaffinity(0, {{{C}}})
t = threading.Thread(target=threading.Event().wait, daemon=True)
t.start()
os.sched_setaffinity(0, {set(ALLOWED)!r})   # the main thread only
ready(tid=t.native_id)
"""
    with child(script) as (pid, info):
        view = procfs.inspect(pid)
    assert {t.tid: t.cpus for t in view.threads} == {pid: frozenset(ALLOWED), info["tid"]: frozenset({C})}
    others = fmt(set(ALLOWED) - {C})
    assert verify.compare(Expected(index=1, bound_cpus=(C,), cpus=(C,)), view) == [
        f"instance 1: thread {pid} ({_comm()}) of pid {pid} may run on CPUs {fmt(ALLOWED)}, outside its "
        f"planned CPUs {C} (CPUs {others} too: the program widened its affinity or the binding was lost)"
    ]


@TWO_CPUS
def test_threads_pinned_to_one_cpu_are_reported():
    """The KMP_AFFINITY-everywhere failure: busy threads stacked on one CPU of a wider binding."""
    script = f"""
done = [threading.Event() for _ in range(2)]
def work(ev):
    os.sched_setaffinity(0, {{{C}}})   # this thread only
    spin(0.3)
    ev.set()
    threading.Event().wait()
ts = [threading.Thread(target=work, args=(d,), daemon=True) for d in done]
[t.start() for t in ts]
[d.wait() for d in done]
ready(tids=[t.native_id for t in ts])
"""
    bound = (ALLOWED[0], C)
    with child(script, prefix=("taskset", "-c", fmt(bound))) as (pid, info):
        view = procfs.inspect(pid)
    t1, t2 = sorted(info["tids"])
    warnings = verify.compare(Expected(index=0, bound_cpus=bound), view)
    assert warnings[0] == (f"instance 0: 2 busy threads pinned to CPU {C} alone (threads {t1}, {t2}): "
                           "they take turns on one CPU")
    assert warnings[1:] == [f"instance 0: 3 busy threads (of 3 threads in 1 process(es)) on 2 CPU(s) "
                            f"{fmt(bound)}: {OVERSUB_HINT}"]


def test_child_processes_belong_to_the_instance():
    script = f"""
import subprocess
os.sched_setaffinity(0, {{{C}}})
kid = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
ready(kid=kid.pid)
"""
    with child(script) as (pid, info):
        view = procfs.inspect(pid)
        assert procfs.inspect(pid, children=False).children == ()
    assert [c.pid for c in view.children] == [info["kid"]]
    assert view.children[0].ppid == pid and view.children[0].cpus == frozenset({C})
    assert [p.pid for p in view.walk()] == [pid, info["kid"]]
    assert verify.compare(Expected(index=2, bound_cpus=(C,)), view) == [
        f"instance 2: 2 busy threads (of 2 threads in 2 process(es)) on 1 CPU(s) {C}: {OVERSUB_HINT}"
    ]


# --------------------------------------------------------------------------- libraries mapped


def _lib(name: str) -> Path:
    path = libfinder.find(libraries.REGISTRY[name], os.environ)
    if path is None:
        pytest.skip(f"{name} not installed ({libraries.REGISTRY[name].install})")
    return path


def _torch_gomp() -> Path:
    spec = importlib.util.find_spec("torch")
    path = Path(spec.submodule_search_locations[0]) / "lib" / "libgomp.so.1" if spec else None
    if path is None or not path.exists():
        pytest.skip("torch's bundled libgomp.so.1 not found")
    return path


def test_preloaded_tcmalloc_is_seen():
    tcmalloc = _lib("tcmalloc")
    with child("ready()", env={"LD_PRELOAD": str(tcmalloc)}) as (pid, _):
        view = procfs.inspect(pid)
    assert os.path.realpath(tcmalloc) in view.libraries
    assert view.allocators == ("tcmalloc",)
    base = dict(index=0, bound_cpus=tuple(ALLOWED))
    assert verify.compare(Expected(**base, allocator="tcmalloc"), view) == []
    assert verify.compare(Expected(**base, allocator="jemalloc"), view) == [
        f"instance 0: jemalloc planned but not mapped in pid {pid} (mapped: tcmalloc; LD_PRELOAD lost?)"
    ]
    with child("ready()") as (pid, _):
        plain = procfs.inspect(pid)
    assert plain.allocators == ()
    assert verify.compare(Expected(**base, allocator="tcmalloc"), plain) == [
        f"instance 0: tcmalloc planned but not mapped in pid {pid} (mapped: the C library malloc only; "
        "LD_PRELOAD lost?)"
    ]


def test_two_allocators_mapped():
    tcmalloc, jemalloc = _lib("tcmalloc"), _lib("jemalloc")
    with child("ready()", env={"LD_PRELOAD": f"{tcmalloc} {jemalloc}"}) as (pid, _):
        view = procfs.inspect(pid)
    assert sorted(view.allocators) == ["jemalloc", "tcmalloc"]
    assert verify.compare(Expected(index=0, bound_cpus=tuple(ALLOWED), allocator="tcmalloc"), view) == [
        f"instance 0: two allocators mapped in pid {pid}: jemalloc, tcmalloc"
    ]


def test_openmp_runtimes_mapped():
    iomp5, gomp = _lib("iomp5"), _torch_gomp()
    real_iomp5, real_gomp = os.path.realpath(iomp5), os.path.realpath(gomp)
    base = dict(index=0, bound_cpus=tuple(ALLOWED))
    # --omp-runtime intel: libiomp5 preloaded while torch's libgomp stays mapped (LD_DEBUG=bindings).
    with child("ready()", env={"LD_PRELOAD": f"{iomp5} {gomp}"}) as (pid, _):
        both = procfs.inspect(pid)
    assert dict(both.openmp) == {"intel": real_iomp5, "gnu": real_gomp}
    assert verify.compare(Expected(**base, omp_runtime="intel"), both) == []
    assert verify.compare(Expected(**base, omp_runtime="gnu"), both) == [
        f"instance 0: two OpenMP runtimes mapped in pid {pid}: gnu ({real_gomp}), intel ({real_iomp5})"
    ]
    with child("ready()", env={"LD_PRELOAD": str(gomp)}) as (pid, _):
        gnu_only = procfs.inspect(pid)
    assert verify.compare(Expected(**base, omp_runtime="intel"), gnu_only) == [
        f"instance 0: Intel OpenMP planned but libiomp5 is not mapped in pid {pid} (mapped: gnu)"
    ]
    assert verify.compare(Expected(**base, omp_runtime="gnu"), gnu_only) == []
    with child("ready()", env={"LD_PRELOAD": str(iomp5)}) as (pid, _):
        intel_only = procfs.inspect(pid)
    assert verify.compare(Expected(**base, omp_runtime="gnu"), intel_only) == [
        f"instance 0: GNU OpenMP planned but pid {pid} maps intel"
    ]


# --------------------------------------------------------------------------- memory


def _nodes() -> list:
    return sorted(int(p.name[4:]) for p in Path("/sys/devices/system/node").glob("node[0-9]*"))


ALLOC = "data = b'\\x01' * (32 << 20)   # 32 MiB, every page written\nready()\n"


@pytest.mark.skipif(shutil.which("numactl") is None or 0 not in _nodes(), reason="needs numactl and node 0")
def test_memory_bound_by_numactl():
    with child(ALLOC, prefix=("numactl", "-C", str(C), "-m", "0")) as (pid, _):
        view = procfs.inspect(pid)
    assert view.cpus == frozenset({C})
    assert view.numa.policy == "bind:0"
    assert view.numa.anon_kb_per_node[0] >= 32 << 10
    assert set(view.numa.anon_kb_per_node) == {0}
    assert view.numa.share_on((0,)) == 1.0
    assert verify.compare(Expected(index=0, bound_cpus=(C,), mem_nodes=(0,), mem_policy="bind"), view) == []
    # The same process judged against a plan that bound it to node 1.
    where = ", ".join(f"node {n}: {kb} kB" for n, kb in sorted(view.numa.anon_kb_per_node.items()))
    assert verify.compare(Expected(index=0, bound_cpus=(C,), mem_nodes=(1,), mem_policy="bind"), view) == [
        (f"instance 0: pid {pid} runs with memory policy bind:0, planned bind:1 (the memory binding did "
         f"not apply); {where}"),
        f"instance 0: only 0% of its anonymous memory is on bound node(s) 1 ({where})",
    ]


@pytest.mark.skipif(_nodes() != [0], reason="needs a single NUMA node 0")
def test_memory_binding_lost():
    with child(ALLOC) as (pid, _):
        view = procfs.inspect(pid)
    assert view.numa.policy == "default"
    where = ", ".join(f"node {n}: {kb} kB" for n, kb in sorted(view.numa.anon_kb_per_node.items()))
    assert verify.compare(Expected(index=4, bound_cpus=tuple(ALLOWED), mem_nodes=(0,), mem_policy="bind"), view) == [
        (f"instance 4: pid {pid} runs with memory policy default, planned bind:0 (the memory binding did "
         f"not apply); {where}")
    ]


def test_parse_numa_maps_literal():
    text = (
        "55d0c0000000 default file=/usr/bin/python3.11 mapped=20 N0=12 N1=8 kernelpagesize_kB=4\n"
        "55d0c1000000 bind:0-1 heap anon=300 dirty=300 N0=200 N1=100 kernelpagesize_kB=4\n"
        "7f0000000000 bind:0-1 anon=3 dirty=3 N1=3 kernelpagesize_kB=2048\n"
        "7f1000000000 bind:0-1 file=/lib/libc.so.6 anon=1 dirty=1 N0=1 kernelpagesize_kB=4\n"
        "7ffd00000000 bind:0-1 stack N0=5 kernelpagesize_kB=4\n"
        "7ffe00000000 bind:0-1\n"
        "garbage\n"
    )
    usage = procfs.parse_numa_maps(text)
    assert usage.kb_per_node == {0: 12 * 4 + 200 * 4 + 4 + 5 * 4, 1: 8 * 4 + 100 * 4 + 3 * 2048}
    assert usage.anon_kb_per_node == {0: 200 * 4 + 4 + 5 * 4, 1: 100 * 4 + 3 * 2048}
    assert usage.policies == {"default": 1, "bind:0-1": 5}
    assert usage.policy == "bind:0-1"
    assert usage.share_on((1,)) == (100 * 4 + 3 * 2048) / (200 * 4 + 4 + 5 * 4 + 100 * 4 + 3 * 2048)
    assert procfs.parse_numa_maps("").share_on((0,)) is None and procfs.parse_numa_maps("").policy is None


# --------------------------------------------------------------------------- plan-free and env-based


def test_expectation_from_the_process_environment():
    tcmalloc = _lib("tcmalloc")
    env = {"CPULAUNCH_CPUS": str(C), "CPULAUNCH_INSTANCE_INDEX": "3", "LD_PRELOAD": str(tcmalloc),
           "OMP_NUM_THREADS": "1"}
    script = f"os.sched_setaffinity(0, {{{C}}})\nready()\n"
    with child(script, env=env) as (pid, _):
        report = verify.verify([(pid, None)])
    (result,) = report.instances
    assert result.expected == Expected(index=3, bound_cpus=(C,), cpus=(C,), mem_nodes=(), mem_policy=None,
                                       allocator="tcmalloc", omp_runtime=None)
    assert result.warnings == () and report.ok
    doc = verify.report_json(report)
    assert json.loads(json.dumps(doc)) == doc
    (inst,) = doc["instances"]
    assert (inst["pid"], inst["index"], inst["error"], inst["warnings"]) == (pid, 3, None, [])
    assert inst["expected"] == {"index": 3, "bound_cpus": str(C), "cpus": str(C), "mem_nodes": "",
                                "mem_policy": None, "allocator": "tcmalloc", "omp_runtime": None,
                                "label": "instance 3", "backend": None}
    proc = inst["process"]
    assert (proc["pid"], proc["cpus"], proc["thread_count"], proc["busy_threads"]) == (pid, str(C), 1, 1)
    assert proc["allocators"] == ["tcmalloc"]
    assert proc["environ"] == {**env, "LD_PRELOAD": str(tcmalloc)}  # only the variables verify keeps
    assert doc["ok"] is True and doc["warnings"] == []
    text = verify.render_text(report)
    assert text.startswith(f"verify instance 3 (pid {pid}): planned CPUs {C}\n")
    assert "  ok: matches the plan\n" in text


def test_plan_free_check_and_vanished_process():
    script = f"os.sched_setaffinity(0, {{{C}}})\nready()\n"
    with child(script) as (pid, _):
        report = verify.verify([(pid, None)])
    assert report.instances[0].expected is None and report.ok
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = int(done.stdout)
    report = verify.verify([(gone, None), (gone, Expected(index=5))])
    assert [r.error for r in report.instances] == [
        f"pid {gone}: gone: no process {gone} (it does not exist or has exited)",
        f"instance 5: gone: no process {gone} (it does not exist or has exited)",
    ]
    assert [(r.status, r.missing, r.view) for r in report.instances] == [(verify.Verdict.GONE, True, None)] * 2
    assert not report.ok and report.exit_code == 3
    assert report.warnings == tuple(r.error for r in report.instances)
    with pytest.raises(procfs.NoSuchProcess):
        procfs.inspect(gone)


def test_expected_from_rendered_instance():
    from cpulaunch.render import RenderedInstance

    inst = RenderedInstance(index=1, cpus=(3, 2), bound_cpus=(2, 3, 4), mem_nodes=(0,), mem_policy="bind",
                            env={}, argv=("true",), prefix=())
    exp = Expected.from_rendered(inst, allocator="tcmalloc", omp_runtime="gnu")
    assert exp == Expected(index=1, bound_cpus=(2, 3, 4), cpus=(2, 3), mem_nodes=(0,), mem_policy="bind",
                           allocator="tcmalloc", omp_runtime="gnu")
    assert exp.name(99) == "instance 1"
    assert Expected().name(99) == "pid 99"


def test_expected_from_environ_budgets():
    """DataLoader and reserved CPUs are part of what the instance is bound to."""
    env = {"CPULAUNCH_CPUS": "0-3", "CPULAUNCH_DATALOADER_CPUS": "6-7", "CPULAUNCH_RESERVED_CPUS": "4",
           "CPULAUNCH_INSTANCE_INDEX": "1", "LD_PRELOAD": "/opt/lib/libiomp5.so /usr/lib/libjemalloc.so.2"}
    assert Expected.from_environ(env) == Expected(index=1, bound_cpus=(0, 1, 2, 3, 4, 6, 7), cpus=(0, 1, 2, 3),
                                                  allocator="jemalloc", omp_runtime="intel")
    assert Expected.from_environ({**env, "CPULAUNCH_BOUND_CPUS": "0-7", "CPULAUNCH_PLANNED_MEM_POLICY": "bind",
                                  "CPULAUNCH_MEM_NODES": "1"}) == Expected(
        index=1, bound_cpus=tuple(range(8)), cpus=(0, 1, 2, 3), mem_nodes=(1,), mem_policy="bind",
        allocator="jemalloc", omp_runtime="intel")
    assert Expected.from_environ({"OMP_NUM_THREADS": "4"}) is None
    # LD_PRELOAD split as glibc does (spaces and colons only, ld.so(8)): a tab keeps two names
    # one entry (issue 20: it was split on any whitespace, so libiomp5 counted as preloaded)
    base = {"CPULAUNCH_CPUS": "0-1"}
    both = Expected.from_environ({**base, "LD_PRELOAD": "/x/libjemalloc.so.2:/y/libiomp5.so"})
    assert (both.allocator, both.omp_runtime) == ("jemalloc", "intel")
    assert Expected.from_environ({**base, "LD_PRELOAD": "libtcmalloc.so.4\tlibiomp5.so"}).omp_runtime is None
    assert Expected.from_environ({"CPULAUNCH_CPUS": "3-1"}) is None  # garbage: no expectation, no crash


# --------------------------------------------------------------------------- parsers and a generated /proc


def test_parse_maps_and_stat():
    maps = (
        "55d0-55d1 r--p 00000000 08:01 11 /usr/bin/python3.11\n"
        "7f00-7f01 r--p 00000000 08:01 12 /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10\n"
        "7f01-7f02 r-xp 00001000 08:01 12 /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10\n"
        "7f02-7f03 r-xp 00000000 08:01 13 /opt/torch/lib/libgomp-a34b3233.so.1 (deleted)\n"
        "7f03-7f04 rw-p 00000000 00:00 0 \n"
        "7f04-7f05 rw-p 00000000 00:00 0 [heap]\n"
        "7f05-7f06 r--p 00000000 08:01 14 /usr/lib/locale/C.utf8/LC_CTYPE\n"
        "7f06-7f07 r--p 00000000 08:01 15 /usr/lib/libc.so\n"
    )
    assert procfs.parse_maps(maps) == (
        "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10",
        "/opt/torch/lib/libgomp-a34b3233.so.1",
        "/usr/lib/libc.so",
    )
    stat = "1234 (my (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 3 0 100 0 0"
    assert procfs.parse_stat_cpu_ticks(stat) == ("S", 280)
    assert libraries.openmp_runtime_of("/opt/torch/lib/libgomp-a34b3233.so.1") == "gnu"
    assert [libraries.openmp_runtime_of(n) for n in ("libiomp5.so", "libomp.so.5", "libomptarget.so",
                                                    "libiompstubs5.so")] == ["intel", "llvm", None, None]


def _fake_proc(root: Path, pid: int, ppid: int, cpus: str, tids: dict, maps: str = "", numa: str = "") -> None:
    base = root / "proc" / str(pid)
    (base / "task").mkdir(parents=True)
    (base / "status").write_text(f"Name:\tworker\nPPid:\t{ppid}\nCpus_allowed_list:\t{cpus}\n")
    (base / "stat").write_text(f"{pid} (worker) S {ppid}" + " 0" * 48 + "\n")  # 52 fields, as the kernel writes
    (base / "cmdline").write_text(f"worker\x00--id\x00{pid}\x00")
    (base / "environ").write_text(f"HOME=/root\x00OMP_NUM_THREADS=4\x00")
    (base / "maps").write_text(maps)
    (base / "numa_maps").write_text(numa)
    for tid, (name, tcpus, ticks) in tids.items():
        t = base / "task" / str(tid)
        t.mkdir()
        t.joinpath("status").write_text(f"Name:\t{name}\nState:\tS (sleeping)\nCpus_allowed_list:\t{tcpus}\n")
        t.joinpath("stat").write_text(f"{tid} ({name}) R {ppid} 0 0 0 0 0 0 0 0 0 0 {ticks} 0 0 0 0 0 0 0\n")


def test_inspect_under_a_generated_root(tmp_path):
    """``root`` is honoured everywhere: threads, children (found through every proc/N/stat),
    maps and numa_maps; garbage in one file costs only that fact."""
    ticks = os.sysconf("SC_CLK_TCK")
    _fake_proc(tmp_path, 100, 1, "0-3", {100: ("main", "0-3", ticks), 101: ("omp", "0-7", ticks),
                                          102: ("idle", "0-3", 0)},
               maps="7f-80 r-xp 0 0:0 1 /usr/lib/libjemalloc.so.2\n",
               numa="7f00 bind:1 anon=10 N1=10 kernelpagesize_kB=4\n")
    _fake_proc(tmp_path, 200, 100, "0-3", {200: ("loader", "0-3", 2 * ticks)})
    _fake_proc(tmp_path, 300, 1, "0-3", {300: ("other", "0-3", 0)})
    (tmp_path / "proc/300/stat").write_text("garbage")
    (tmp_path / "proc/100/task/102/stat").write_text("garbage")
    view = procfs.inspect(100, tmp_path)
    assert [(t.tid, t.name, fmt(t.cpus), t.busy) for t in view.threads] == [
        (100, "main", "0-3", True), (101, "omp", "0-7", True), (102, "idle", "0-3", False)]
    assert [c.pid for c in view.children] == [200]
    assert view.cmdline == ("worker", "--id", "100") and view.allocators == ("jemalloc",)
    assert (view.environ, view.unreadable, view.state, view.uncheckable) == ({"OMP_NUM_THREADS": "4"}, {}, "S", "")
    assert view.numa.policy == "bind:1"
    exp = Expected(index=7, bound_cpus=(0, 1, 2, 3), mem_nodes=(1,), mem_policy="bind", allocator="jemalloc",
                   label="rank 7")
    # pid 200 has an empty numa_maps: its policy is unknown, not a mismatch.
    assert verify.compare(exp, view) == [
        "rank 7: thread 101 (omp) of pid 100 may run on CPUs 0-7, outside its planned CPUs 0-3 "
        "(CPUs 4-7 too: the program widened its affinity or the binding was lost)",
    ]


def test_thread_age_from_uptime_and_starttime(tmp_path):
    """A thread's age is ``proc/uptime`` minus its starttime (field 22 of its stat, clock
    ticks since boot) under the root; its share of a CPU is CPU time over that age. No
    readable uptime: no age, no share (nothing is guessed)."""
    ticks = os.sysconf("SC_CLK_TCK")
    _fake_proc(tmp_path, 100, 1, "0", {100: ("main", "0", 3 * ticks), 101: ("poller", "0", ticks // 4)})
    (tmp_path / "proc/100/task/101/stat").write_text(
        f"101 (poller) S 1 0 0 0 0 0 0 0 0 0 {ticks // 4} 0 0 0 0 0 0 0 {40 * ticks} 0 0\n")
    view = procfs.inspect(100, tmp_path)
    assert [(t.tid, t.age_seconds, t.cpu_share) for t in view.threads] == [(100, None, None), (101, None, None)]
    (tmp_path / "proc/uptime").write_text("1040.00 2000.00\n")
    view = procfs.inspect(100, tmp_path)
    assert [(t.tid, t.age_seconds) for t in view.threads] == [(100, 1040.0), (101, 1000.0)]
    assert view.threads[1].cpu_share == pytest.approx((ticks // 4) / ticks / 1000.0)
    (tmp_path / "proc/uptime").write_text("garbage")
    assert [t.age_seconds for t in procfs.inspect(100, tmp_path).threads] == [None, None]
    assert procfs.parse_uptime("5234.17 9876.50\n") == 5234.17


# --------------------------------------------------------------------------- a real torch process

TORCH_CHILD = """
import glob, torch
torch.set_num_threads({threads})
x = torch.randn(2_000_000)
tick = os.sysconf("SC_CLK_TCK")
def cpu_seconds():  # every thread's utime+stime (fields 14 and 15 of task/TID/stat)
    out = []
    for path in glob.glob("/proc/self/task/*/stat"):
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out.append((int(fields[11]) + int(fields[12])) / tick)
    return sorted(out, reverse=True)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:  # intra-op work until the whole team is busy by verify's rule
    for _ in range(10):
        torch.exp(x)
    if min(cpu_seconds()[:{threads}]) >= 0.4:
        break
ready(threads=torch.get_num_threads())
"""


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
@pytest.mark.skipif(shutil.which("numactl") is None or 0 not in _nodes(), reason="needs numactl and node 0")
def test_torch_intra_op_threads_counted():
    """torch's OpenMP team as the plan sets it matches; twice as many threads as CPUs is reported."""
    n = len(ALLOWED)
    prefix = ("numactl", "-C", fmt(ALLOWED), "-m", "0")
    exp = Expected(index=0, bound_cpus=tuple(ALLOWED), cpus=tuple(ALLOWED), mem_nodes=(0,), mem_policy="bind",
                   omp_runtime="gnu")
    with child(TORCH_CHILD.format(threads=n), prefix=prefix) as (pid, info):
        fits = procfs.inspect(pid)
    assert info["threads"] == n
    assert "gnu" in fits.openmp and fits.numa.policy == "bind:0"
    assert sum(t.busy or t.tid == pid for t in fits.threads) == n  # the main thread + n-1 OpenMP workers
    assert verify.compare(exp, fits) == []
    with child(TORCH_CHILD.format(threads=2 * n), prefix=prefix) as (pid, info):
        over = procfs.inspect(pid)
    assert info["threads"] == 2 * n
    assert verify.compare(exp, over) == [
        f"instance 0: {2 * n} busy threads (of {len(over.threads)} threads in 1 process(es)) on {n} CPU(s) "
        f"{fmt(ALLOWED)}: {OVERSUB_HINT}"
    ]


# --------------------------------------------------------------------------- through the launcher

WIDEN = """
import glob, os, sys, threading, time
def spin():
    start = time.thread_time()
    while time.thread_time() - start < 0.3:
        pass
    threading.Event().wait()                 # alive, idle, until the process ends
index = os.environ["CPULAUNCH_INSTANCE_INDEX"]
if index == "0":
    spinners = [threading.Thread(target=spin, daemon=True) for _ in range(2)]
    [t.start() for t in spinners]            # instance 0 starts two extra busy threads
if index == "1":
    os.sched_setaffinity(0, {allowed})     # instance 1 widens its main thread to every allowed CPU
if index == "0":
    start = time.monotonic()                 # wait until both spinners are busy by verify's rule
    def busy():
        n = 0
        for path in glob.glob("/proc/self/task/*/stat"):
            with open(path) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            n += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") >= 0.25
        return n
    while busy() < 2 and time.monotonic() - start < 60:
        time.sleep(0.05)
open(os.path.join({ready!r}, index), "w").close()   # ready: verify may look now
deadline = time.monotonic() + 120                    # then stay until the launcher's check ran
while not glob.glob(os.path.join({logs!r}, "*", "verify.json")) and time.monotonic() < deadline:
    time.sleep(0.05)
"""


@TWO_CPUS
@pytest.mark.skipif(shutil.which("numactl") is None, reason="needs numactl")
def test_two_instance_run_reports_extra_threads_and_widening(tmp_path):
    from tests.conftest import run_cli

    """--verify through the launcher: instance 0 has two extra busy threads, instance 1 widened
    its affinity. Each instance says when it is ready (a file); the check runs at
    --verify-after 10 s, which the test asserts came after both were ready (else the
    check would have judged a program still starting), and the instances stay until
    verify.json exists."""
    ready, logs = tmp_path / "ready", tmp_path / "logs"
    ready.mkdir()
    proc = run_cli("--ninstances", "2", "--verify-after", "10", "--log-dir", str(logs), "--",
                   sys.executable, "-c", WIDEN.format(allowed=set(ALLOWED), ready=str(ready), logs=str(logs)),
                   timeout=240)
    (doc_path,) = logs.glob("*/verify.json")
    assert max(f.stat().st_mtime for f in ready.iterdir()) <= doc_path.stat().st_mtime, \
        "an instance was not ready when the check ran"
    doc = json.loads(doc_path.read_text())
    inst0, inst1 = doc["instances"]
    assert (inst0["index"], inst1["index"]) == (0, 1)
    cpus0 = inst0["expected"]["bound_cpus"]
    n0 = len(cpulist.parse(cpus0))
    assert inst0["error"] is None and inst0["process"]["thread_count"] == 3
    assert inst0["warnings"] == ([
        f"instance 0: 3 busy threads (of 3 threads in 1 process(es)) on {n0} CPU(s) {cpus0}: {OVERSUB_HINT}"
    ] if n0 < 3 else [])
    planned = inst1["expected"]["bound_cpus"]
    widened = fmt(ALLOWED)
    extra = fmt(set(ALLOWED) - cpulist.parse(planned))
    pid = inst1["pid"]
    assert inst1["warnings"] == [
        f"instance 1: thread {pid} ({_comm()}) of pid {pid} may run on CPUs {widened}, outside its planned "
        f"CPUs {planned} (CPUs {extra} too: the program widened its affinity or the binding was lost)"
    ]
    assert doc["ok"] is False and doc["warnings"] == inst0["warnings"] + inst1["warnings"]
    # Every thread of instance 0 has exactly its planned CPUs.
    assert {t["cpus"] for t in inst0["process"]["threads"]} == {inst0["expected"]["bound_cpus"]}
    assert inst1["warnings"][0] in proc.stderr


@pytest.mark.skipif(shutil.which("numactl") is None or 0 not in _nodes(), reason="needs numactl and node 0")
def test_verify_pid_flags_memory_policy_the_launch_did_not_plan():
    """Issue 23: ``cpulaunch verify PID`` without a plan takes the memory policy from the
    variables the launcher gives every instance. A real instance launched by cpulaunch
    (planned: bind to node 0) whose program runs under ``numactl --interleave=0`` fails
    verify (exit 1), naming its memory policy and where its anonymous memory is. Before
    the launcher wrote the variables, verify had no policy to compare and said ok."""
    from tests.conftest import REPO, run_cli

    launch = (sys.executable, "-m", "cpulaunch", "--ninstances", "1", "--allocator", "default",
              "--", "numactl", "--interleave=0")
    with child(ALLOC, env={"PYTHONPATH": str(REPO)}, prefix=launch) as (pid, _):
        proc = run_cli("verify", "--format", "json", str(pid), check_rc=None)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    (inst,) = json.loads(proc.stdout)["instances"]
    assert inst["status"] == "differs"
    assert (inst["expected"]["mem_policy"], inst["expected"]["mem_nodes"]) == ("bind", "0")
    anon = inst["process"]["memory"]["anon_kb_per_node"]
    assert inst["process"]["memory"]["policy"] == "interleave:0" and int(anon["0"]) >= 32 << 10
    where = ", ".join(f"node {n}: {kb} kB" for n, kb in sorted(anon.items()))
    assert inst["warnings"] == [(f"instance 0: pid {pid} runs with memory policy interleave:0, planned "
                                 f"bind:0 (the memory binding did not apply); {where}")]


@pytest.mark.skipif(shutil.which("numactl") is None or 0 not in _nodes(), reason="needs numactl and node 0")
def test_verify_pid_flags_pages_off_the_planned_nodes():
    """A process whose variables say bind to node 1 while its pages are on node 0 (bound
    there by numactl): ``cpulaunch verify PID`` exits 1 naming its policy and the share of
    its anonymous memory on node 1 (none), with where it is."""
    from tests.conftest import run_cli

    env = {"CPULAUNCH_CPUS": str(C), "CPULAUNCH_BOUND_CPUS": str(C), "CPULAUNCH_INSTANCE_INDEX": "3",
           "CPULAUNCH_PLANNED_MEM_POLICY": "bind", "CPULAUNCH_MEM_NODES": "1"}
    with child(ALLOC, env=env, prefix=("numactl", "-C", str(C), "-m", "0")) as (pid, _):
        proc = run_cli("verify", str(pid), check_rc=None)
        view = procfs.inspect(pid)
    where = ", ".join(f"node {n}: {kb} kB" for n, kb in sorted(view.numa.anon_kb_per_node.items()))
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert f"  warning: instance 3: only 0% of its anonymous memory is on bound node(s) 1 ({where})\n" in proc.stdout
    assert (f"  warning: instance 3: pid {pid} runs with memory policy bind:0, planned bind:1 (the memory "
            f"binding did not apply); {where}\n") in proc.stdout
