"""Rendering (pure): env dicts, precedence, LD_PRELOAD merging, argv, text forms."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cpulaunch.machine.libfinder import is_loadable_elf, parse_ldconfig
from cpulaunch.machine.libraries import REGISTRY, identify, preload_entries
from cpulaunch.machine.numactl import MemPolicy
from cpulaunch.machine.numactl import argv as numactl_prefix
from cpulaunch.names import BindMode
from cpulaunch.plan import Instance, Plan
from cpulaunch.forms import dotenv_lines, plan_json, shell_exports
from cpulaunch.render import ProgramError, Settings, render, resolve_program

PY = "/py"


def two_instances(policy=MemPolicy.BIND, reserved=((), ())):
    """Two instances; ``reserved``: each one's oneCCL worker CPUs."""
    return Plan(
        instances=(
            Instance(index=0, cpus=(0, 1), cores=(0, 1), nodes=(0,), mem_nodes=(0,), mem_policy=policy,
                     threads=2, ccl_cpus=reserved[0], socket=0),
            Instance(index=1, cpus=(8, 9), cores=(8, 9), nodes=(1,), mem_nodes=(1,), mem_policy=policy,
                     threads=2, ccl_cpus=reserved[1], socket=1),
        ),
        num_instances=2,
        notes=("plan note",),
    )


def test_resolve_program_forms():
    assert resolve_program(["x.py", "-a"], python=PY) == (PY, "x.py", "-a")
    assert resolve_program(["-m", "pkg.mod", "--flag"], python=PY) == (PY, "-m", "pkg.mod", "--flag")
    assert resolve_program(["python", "x.py"], python=PY) == ("python", "x.py")
    assert resolve_program(["true"], python=PY) == ("true",)
    assert resolve_program(["x.py"], no_python=True, python=PY) == ("x.py",)
    with pytest.raises(ProgramError):
        resolve_program([], python=PY)
    with pytest.raises(ProgramError):
        resolve_program(["-m"], python=PY)


@pytest.mark.parametrize(
    "policy, flags",
    [
        (MemPolicy.BIND, ["-m", "0-1"]),
        (MemPolicy.PREFERRED, ["-p", "0"]),  # one node: numactl refuses "-p 0-1"
        (MemPolicy.INTERLEAVE, ["-i", "0-1"]),
        (MemPolicy.LOCAL, ["-l"]),
        (MemPolicy.NONE, []),
    ],
)
def test_numactl_prefix(policy, flags):
    assert list(numactl_prefix("numactl", [3, 1, 2, 8], policy, [0, 1])) == ["numactl", "-C", "1-3,8", *flags]


@pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl not installed")
def test_preferred_prefix_names_one_node_which_numactl_accepts():
    """Issue 20: render's preferred prefix was ``-p <node list>`` while the host check used
    ``-p <first node>``. numactl(8) takes a single node after ``-p`` (numactl.c: ``if
    (nnodes != 1) usage();``; a list is "-P/--preferred-many"), so the launcher planned a
    command that numactl refuses on any instance spanning two nodes. The one builder gives
    the first node, and numactl runs that command here."""
    prefix = numactl_prefix(shutil.which("numactl"), sorted(os.sched_getaffinity(0)), MemPolicy.PREFERRED, [0, 2])
    assert prefix[-2:] == ("-p", "0")
    assert subprocess.run([*prefix, "true"]).returncode == 0


def test_env_per_instance_gnu_tcmalloc():
    s = Settings(omp_runtime="gnu", allocator="tcmalloc", allocator_path=Path("/lib/libtcmalloc.so.4"),
                 numactl="/usr/bin/numactl")
    r = render(two_instances(), ("python", "x.py"), s)
    assert [i.env for i in r.instances] == [
        {"CPULAUNCH_BOUND_CPUS": "0-1", "CPULAUNCH_CPUS": "0-1", "CPULAUNCH_INSTANCE_INDEX": "0",
         "CPULAUNCH_MEM_NODES": "0", "CPULAUNCH_NUM_INSTANCES": "2", "CPULAUNCH_PLANNED_MEM_POLICY": "bind",
         "LD_PRELOAD": "/lib/libtcmalloc.so.4", "OMP_NUM_THREADS": "2"},
        {"CPULAUNCH_BOUND_CPUS": "8-9", "CPULAUNCH_CPUS": "8-9", "CPULAUNCH_INSTANCE_INDEX": "1",
         "CPULAUNCH_MEM_NODES": "1", "CPULAUNCH_NUM_INSTANCES": "2", "CPULAUNCH_PLANNED_MEM_POLICY": "bind",
         "LD_PRELOAD": "/lib/libtcmalloc.so.4", "OMP_NUM_THREADS": "2"},
    ]
    assert [list(i.argv) for i in r.instances] == [
        ["/usr/bin/numactl", "-C", "0-1", "-m", "0", "python", "x.py"],
        ["/usr/bin/numactl", "-C", "8-9", "-m", "1", "python", "x.py"],
    ]
    assert r.notes == ("plan note",)


def test_env_intel_openmp_and_jemalloc():
    s = Settings(omp_runtime="intel", openmp_path=Path("/p/lib/libiomp5.so"), allocator="jemalloc",
                 allocator_path=Path("/l/libjemalloc.so.2"))
    env = render(two_instances(), ("true",), s).instances[0].env
    assert env["LD_PRELOAD"] == "/p/lib/libiomp5.so /l/libjemalloc.so.2"
    assert env["KMP_AFFINITY"] == "granularity=fine,compact,1,0"
    assert env["KMP_BLOCKTIME"] == "1"
    assert env["MALLOC_CONF"] == REGISTRY["jemalloc"].env["MALLOC_CONF"]
    assert "GOMP_CPU_AFFINITY" not in env


def test_kmp_affinity_only_when_bound():
    s = Settings(omp_runtime="intel", openmp_path=Path("/p/libiomp5.so"), bind=BindMode.NONE)
    inst = render(two_instances(), ("true",), s).instances[0]
    assert "KMP_AFFINITY" not in inst.env and inst.env["KMP_BLOCKTIME"] == "1"
    assert inst.prefix == () and inst.affinity is None


def test_affinity_binding_has_no_prefix_but_cpus():
    s = Settings(bind=BindMode.AFFINITY)
    inst = render(two_instances(), ("true",), s).instances[1]
    assert inst.argv == ("true",) and inst.affinity == (8, 9)
    text = shell_exports(inst, taskset="/usr/bin/taskset")
    assert "export CPULAUNCH_PREFIX='/usr/bin/taskset -c 8-9'" in text


def test_user_value_wins_with_note_unless_override():
    environ = {"OMP_NUM_THREADS": "7", "KMP_BLOCKTIME": "1"}
    s = Settings(omp_runtime="intel", openmp_path=Path("/i.so"), environ=environ)
    r = render(two_instances(), ("true",), s)
    assert "OMP_NUM_THREADS" not in r.instances[0].env
    assert r.instances[0].env["KMP_BLOCKTIME"] == "1"  # same value: no conflict
    assert r.notes[-1] == ("OMP_NUM_THREADS=7 from your environment kept (cpulaunch planned 2); "
                           "pass --override-env to use cpulaunch's value")
    assert sum("OMP_NUM_THREADS=7" in n for n in r.notes) == 1  # once, not per instance
    s2 = Settings(omp_runtime="intel", openmp_path=Path("/i.so"), environ=environ, override_env=True)
    assert render(two_instances(), ("true",), s2).instances[0].env["OMP_NUM_THREADS"] == "2"


def test_ld_preload_keeps_user_entries_and_never_two_allocators():
    s = Settings(allocator="tcmalloc", allocator_path=Path("/t/libtcmalloc.so.4"),
                 environ={"LD_PRELOAD": "libfoo.so:/x/libbar.so"})
    assert render(two_instances(), ("true",), s).instances[0].env["LD_PRELOAD"] == \
        "/t/libtcmalloc.so.4 libfoo.so:/x/libbar.so"  # the user's value kept byte for byte
    s = Settings(allocator="tcmalloc", allocator_path=Path("/t/libtcmalloc.so.4"),
                 environ={"LD_PRELOAD": "libjemalloc.so.2"})
    r = render(two_instances(), ("true",), s)
    assert "LD_PRELOAD" not in r.instances[0].env  # the user's own preload stays as it is
    assert any("never two allocators" in n for n in r.notes)


def test_reserved_cpus_bound_but_not_used_by_openmp():
    p = two_instances(reserved=((2,), (10,)))
    gnu = render(p, ("true",), Settings()).instances[0]
    assert gnu.argv[:3] == ("numactl", "-C", "0-2")
    assert gnu.env["OMP_NUM_THREADS"] == "2"
    assert gnu.env["OMP_PLACES"] == "{0},{1}" and gnu.env["OMP_PROC_BIND"] == "close"
    intel = render(p, ("true",), Settings(omp_runtime="intel", openmp_path=Path("/i.so"))).instances[1]
    assert intel.env["KMP_AFFINITY"] == "granularity=fine,proclist=[8,9],explicit"


def test_identity_vars_always_ours():
    s = Settings(environ={"RANK": "5", "CPULAUNCH_INSTANCE_INDEX": "9"}, instance_env={1: {"RANK": "1"}})
    r = render(two_instances(), ("true",), s)
    assert r.instances[1].env["RANK"] == "1" and r.instances[1].env["CPULAUNCH_INSTANCE_INDEX"] == "1"


NASTY = "a'b\"c $HOME `id` \\ ; newline\nend"


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")
def test_shell_exports_eval_safely_whatever_the_values():
    s = Settings(extra_env={"CPULAUNCH_PLANNED_INFERENCE_PATH": NASTY})
    inst = render(two_instances(), ("true",), s).instances[0]
    text = shell_exports(inst)
    out = subprocess.run(["sh", "-c", text + 'printf %s "$CPULAUNCH_PLANNED_INFERENCE_PATH"'],
                         capture_output=True, text=True, check=True).stdout
    assert out == NASTY
    out = subprocess.run(["sh", "-c", text + 'printf %s "$CPULAUNCH_PREFIX"'],
                         capture_output=True, text=True, check=True).stdout
    assert out == "numactl -C 0-1 -m 0"


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")
def test_dotenv_lines_read_back_exactly_by_posix_set_a_dot(tmp_path):
    """The documented target of --format dotenv: POSIX `set -a; . FILE`."""
    s = Settings(extra_env={"CPULAUNCH_PLANNED_INFERENCE_PATH": NASTY})
    inst = render(two_instances(), ("true",), s).instances[0]
    f = tmp_path / "env"
    f.write_text(dotenv_lines(inst))
    out = subprocess.run(["sh", "-c", 'set -a; . "$1"; set +a; printf %s "$CPULAUNCH_PLANNED_INFERENCE_PATH"', "sh", str(f)],
                         capture_output=True, text=True, check=True).stdout
    assert out == NASTY


def test_plan_json_schema():
    r = render(two_instances(), ("true",), Settings())
    doc = json.loads(plan_json(r, {"online": "0-15"}))
    assert set(doc) == {"instances", "num_instances", "notes", "topology"}
    i0 = doc["instances"][0]
    assert set(i0) >= {"index", "cpus", "cpulist", "mem_nodes", "env", "argv"}
    assert i0["cpus"] == [0, 1] and i0["cpulist"] == "0-1" and i0["mem_nodes"] == [0]
    assert i0["argv"] == ["numactl", "-C", "0-1", "-m", "0", "true"]


# --------------------------------------------------------------------------- libraries


def test_parse_ldconfig_and_preload_helpers():
    text = ("2 libs found in cache `/etc/ld.so.cache'\n"
            "\tlibjemalloc.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n"
            "\tlibjemalloc.so.2 (libc6) => /usr/lib/i386-linux-gnu/libjemalloc.so.2\n")
    assert parse_ldconfig(text) == {"libjemalloc.so.2": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}
    assert preload_entries(" a.so:b.so  c.so ") == ["a.so", "b.so", "c.so"]
    # glibc splits on spaces and colons only: a tab or newline stays inside the entry
    assert preload_entries("/x/a\tb.so:/y/c\nd.so") == ["/x/a\tb.so", "/y/c\nd.so"]
    assert identify("/x/libtcmalloc_minimal.so.4") == "tcmalloc"
    assert identify("libiomp5.so") == "iomp5" and identify("libfoo.so") is None


def test_is_loadable_elf(tmp_path):
    import sys

    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    if libc.exists():
        assert is_loadable_elf(libc)
        assert not is_loadable_elf(libc, machine="aarch64")
    assert not is_loadable_elf(Path(sys.executable).with_name("nonexistent"))
    junk = tmp_path / "libjunk.so"
    junk.write_bytes(b"not an elf at all, just text")
    assert not is_loadable_elf(junk)
    # e_type and e_machine in the byte order EI_DATA names (1: little-endian, 2: big-endian)
    elf_class = 2 if sys.maxsize > 2**32 else 1
    for data, order in ((1, "little"), (2, "big")):
        for e_type, e_machine, machine, loadable in ((3, 62, "x86_64", True), (3, 183, "aarch64", True),
                                                     (3, 22, "s390x", True), (2, 62, "x86_64", False),
                                                     (3, 62, "aarch64", False), (3, 183, "x86_64", False)):
            lib = tmp_path / f"lib{data}{e_type}{e_machine}.so"
            lib.write_bytes(b"\x7fELF" + bytes([elf_class, data]) + bytes(10)
                            + e_type.to_bytes(2, order) + e_machine.to_bytes(2, order) + bytes(44))
            assert is_loadable_elf(lib, machine=machine) is loadable, (order, e_type, e_machine, machine)


def test_json_text_layout_is_exact_and_reads_back_as_the_document():
    """Issue 12: JSON outputs put each member and each record on its own line, and any value
    holding no object or list of them on one line (the json module's C encoder)."""
    from cpulaunch.forms import json_text

    doc = {"instances": [{"index": 0, "cpus": [0, 1], "env": {"A": "1", "Ü": "x\n"}, "argv": []}],
           "notes": [], "empty": {}, "topology": {"cores": [{"id": 0, "cpus": [0, 4]}], "hybrid": False},
           "grid": [[1, 2], [3]], "none": None}
    assert json_text(doc) == (
        '{\n'
        '  "instances": [\n'
        '    {\n'
        '      "index": 0,\n'
        '      "cpus": [0, 1],\n'
        '      "env": {"A": "1", "\\u00dc": "x\\n"},\n'
        '      "argv": []\n'
        '    }\n'
        '  ],\n'
        '  "notes": [],\n'
        '  "empty": {},\n'
        '  "topology": {\n'
        '    "cores": [\n'
        '      {"id": 0, "cpus": [0, 4]}\n'
        '    ],\n'
        '    "hybrid": false\n'
        '  },\n'
        '  "grid": [\n'
        '    [1, 2],\n'
        '    [3]\n'
        '  ],\n'
        '  "none": null\n'
        '}'
    )
    assert json.loads(json_text(doc)) == doc


def test_dry_run_json_of_every_fixture_reads_back_as_json_dumps_would(sysroots):
    """The laid-out plan of every fixture machine parses to the very document json.dumps
    writes (only the layout differs), one core record per line."""
    from cpulaunch import core
    from cpulaunch.options import Options, Output, Format

    for name, root in sorted(sysroots.items()):
        opts = Options(sysroot=str(root), output=Output.SHOW_TOPOLOGY, fmt=Format.JSON)
        p = core.prepare(opts, {})
        text = core.output_text(p)
        doc = p.topo.to_dict()
        assert json.loads(text) == json.loads(json.dumps(doc)), name
        core_lines = [line for line in text.splitlines()
                      if line.startswith('    {"id": ') and '"socket": ' in line]
        assert len(core_lines) == len(p.topo.cores), name
