"""cpulaunch.tools.doctor: on this machine, on every fixture dump, on generated trees; the ELF reader
on the real libtorch_cpu.so and on hand-built ELF files."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cpulaunch import cpulist
from cpulaunch.machine import elf
from cpulaunch.tools import doctor
from cpulaunch.machine import libfinder, libraries
from tests.conftest import MACHINES


def _cpuinfo_flags(root: Path) -> frozenset:
    """Flags of the first processor, read here independently of the code under test."""
    for line in (root / "proc/cpuinfo").read_text(errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return frozenset(value.split())
    return frozenset()


def _by_id(report) -> dict:
    return {f.id: f for f in report.findings}


def _failed(report) -> list:
    return [f for f in report.findings if f.id.startswith("check-failed")]


# --------------------------------------------------------------------------- this machine


#: The flags --show-topology and doctor list (view.ISA_FLAGS), written out here.
SHOWN_ISA = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
             "amx_int8", "asimd", "sve")


def _expected_isa(arch: str, flags: frozenset) -> tuple:
    """(present, bf16_fast) derived from the flags alone."""
    if arch == "x86_64":
        return tuple(f for f in SHOWN_ISA if f in flags), bool({"avx512_bf16", "amx_bf16"} & flags)
    if arch == "aarch64":
        return tuple(f for f in SHOWN_ISA if f in flags), "bf16" in flags
    return (), None


def test_this_machine_json():
    start = time.perf_counter()
    report = doctor.diagnose("/", dict(os.environ), live=True)
    doc = doctor.to_json(report)
    text = doctor.render_text(report)
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, elapsed
    assert json.loads(json.dumps(doc)) == doc
    assert _failed(report) == []
    assert doc["schema_version"] == 1 and doc["live"] is True and doc["root"] == "/"

    allowed = frozenset(os.sched_getaffinity(0))
    topo = doc["topology"]
    assert topo["allowed"] == cpulist.format(allowed)
    assert topo["allowed_source"] == "the affinity mask of this process"
    online = cpulist.parse(Path("/sys/devices/system/cpu/online").read_text())
    assert topo["online"] == cpulist.format(online)

    # numactl: installed and usable on every allowed CPU and their memory nodes.
    numactl = shutil.which("numactl")
    if numactl is None:
        pytest.skip("numactl not installed")
    nodes = set()
    for d in Path("/sys/devices/system/node").glob("node[0-9]*"):
        if cpulist.parse((d / "cpulist").read_text()) & allowed:
            nodes.add(int(d.name[4:]))
    nodes &= cpulist.parse(Path("/sys/devices/system/node/has_memory").read_text())
    assert doc["numactl"] == {
        "path": numactl, "checked": True, "usable": True, "reason": None,
        "argv": [numactl, "-C", cpulist.format(allowed), "-m", cpulist.format(nodes), "true"],
    }
    assert _by_id(report)["numactl"].severity == "ok"

    # ISA from /proc/cpuinfo: whatever CPU this session has.
    flags = _cpuinfo_flags(Path("/"))
    import platform
    arch = platform.machine()
    present, bf16 = _expected_isa(arch, flags)
    assert doc["isa"]["arch"] == arch
    assert doc["isa"]["present"] == list(present)
    assert doc["isa"]["bf16_fast"] is bf16
    assert ("bf16 brings no oneDNN speed-up on this CPU" in doc["isa"]["meaning"]) is (bf16 is False)

    # Libraries: the ones a launch from here would preload.
    for entry in doc["libraries"]:
        lib = libraries.REGISTRY[entry["name"]]
        found = libfinder.find(lib, os.environ)
        assert entry["path"] == (str(found) if found else None)
        assert entry["install"] == lib.install
        if found is not None and entry["version"] is not None:
            assert os.path.basename(entry["realpath"]).endswith(".so." + entry["version"])
        if entry["package"] and entry["package"].endswith(" (dpkg)") and shutil.which("dpkg-query"):
            name, version, _ = entry["package"].split(" ")
            owner = subprocess.run(["dpkg-query", "-S", entry["realpath"]], capture_output=True, text=True)
            if owner.returncode != 0:  # dpkg records the unmerged path (/lib vs /usr/lib)
                owner = subprocess.run(["dpkg-query", "-S", os.path.basename(entry["realpath"])],
                                       capture_output=True, text=True)
            assert owner.stdout.split(":")[0] == name
            shown = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", name], capture_output=True, text=True)
            assert shown.stdout == version
        if entry["package"] and entry["package"].endswith(" (pip)"):
            name, version, _ = entry["package"].split(" ")
            assert importlib.metadata.version(name) == version
    # The text names every finding that is not ok, and the fix of each warning.
    for f in report.findings:
        assert f"{f.id}: {f.summary}" in text
        if f.severity in ("warn", "error") and f.fix:
            assert f"fix: {f.fix}" in text


def test_this_machine_torch_without_import():
    """torch's version and OpenMP runtime come from metadata and the ELF file; torch is not imported."""
    spec = importlib.util.find_spec("torch")
    if spec is None:
        pytest.skip("torch not installed")
    code = ("import sys, json; from cpulaunch.tools import doctor; r = doctor.diagnose('/', live=True); "
            "print(json.dumps({'torch': doctor.to_json(r)['torch'], 'imported': 'torch' in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parent.parent, check=True)
    doc = json.loads(out.stdout)
    assert doc["imported"] is False
    torch = doc["torch"]
    lib = Path(spec.submodule_search_locations[0]) / "lib" / "libtorch_cpu.so"
    assert torch["libtorch_cpu"] == str(lib)
    assert torch["version"] == importlib.metadata.version("torch")
    if shutil.which("readelf"):
        assert torch["needed"] == _readelf_needed(lib)
    omp = [n for n in torch["needed"] if re.match(r"lib(gomp|iomp5|omp)[.-]", n)]
    runtime = {"libgomp": "gnu", "libiomp5": "intel", "libomp": "llvm"}
    assert torch["openmp_library"] == (omp[0] if omp else None)
    assert torch["openmp"] == (runtime[re.match(r"(lib\w+?)[.-]", omp[0]).group(1)] if omp else None)
    # torch 2.13 CPU wheels link GNU OpenMP (their bundled torch/lib/libgomp.so.1).
    if importlib.metadata.version("torch").startswith("2.13"):
        assert (torch["openmp"], torch["openmp_library"]) == ("gnu", "libgomp.so.1")


# --------------------------------------------------------------------------- ELF reader


def _readelf_needed(path: Path) -> list:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) not installed")
def test_elf_needed_on_real_libraries():
    spec = importlib.util.find_spec("torch")
    paths = []
    if spec is not None:
        paths.append(Path(spec.submodule_search_locations[0]) / "lib" / "libtorch_cpu.so")
    for name in ("jemalloc", "tcmalloc", "iomp5"):
        found = libfinder.find(libraries.REGISTRY[name], os.environ)
        if found:
            paths.append(found)
    paths.append(Path(sys.executable).resolve())  # an executable: PT_DYNAMIC too
    for path in paths:
        assert list(elf.read_elf_needed(path)) == _readelf_needed(path), path


def _elf(needed, *, cls64=True, little=True, phdrs=True, shdrs=False, strtab_in_load=True) -> bytes:
    """A minimal ELF shared object holding only a dynamic section and its string table."""
    e = "<" if little else ">"
    strtab = b"\x00" + b"".join(n.encode() + b"\x00" for n in needed) + b"libself.so\x00"
    offs, pos = [], 1
    for n in needed:
        offs.append(pos)
        pos += len(n) + 1
    ehsize, phent, shent, dynent = (64, 56, 64, 16) if cls64 else (52, 32, 40, 8)
    nph = 2 if phdrs else 0
    dyn_off = ehsize + nph * phent
    base = 0x400000
    dyn_entries = [(1, o) for o in offs] + [(14, pos), (5, 0), (10, len(strtab)), (0, 0)]
    str_off = dyn_off + len(dyn_entries) * dynent
    dyn_entries[len(offs) + 1] = (5, base + str_off)
    dyn = b"".join(struct.pack(e + ("qQ" if cls64 else "iI"), t, v) for t, v in dyn_entries)
    sh_off = str_off + len(strtab)
    nsh = 3 if shdrs else 0
    total = sh_off + nsh * shent
    load_size = total if strtab_in_load else dyn_off  # a LOAD that misses the string table
    if cls64:
        head = b"\x7fELF" + bytes([2, 1 if little else 2, 1]) + bytes(9)
        head += struct.pack(e + "HHIQQQIHHHHHH", 3, 62, 1, 0, ehsize if phdrs else 0,
                            sh_off if shdrs else 0, 0, ehsize, phent, nph, shent, nsh, 0)
        ph = b""
        if phdrs:
            ph += struct.pack(e + "IIQQQQQQ", 1, 5, 0, base, base, load_size, load_size, 0x1000)
            ph += struct.pack(e + "IIQQQQQQ", 2, 6, dyn_off, base + dyn_off, base + dyn_off, len(dyn), len(dyn), 8)
        sh = b""
        if shdrs:
            sh += bytes(shent)
            sh += struct.pack(e + "IIQQQQIIQQ", 0, 6, 3, base + dyn_off, dyn_off, len(dyn), 2, 0, 8, dynent)
            sh += struct.pack(e + "IIQQQQIIQQ", 0, 3, 2, base + str_off, str_off, len(strtab), 0, 0, 1, 0)
    else:
        head = b"\x7fELF" + bytes([1, 1 if little else 2, 1]) + bytes(9)
        head += struct.pack(e + "HHIIIIIHHHHHH", 3, 3, 1, 0, ehsize if phdrs else 0,
                            sh_off if shdrs else 0, 0, ehsize, phent, nph, shent, nsh, 0)
        ph = b""
        if phdrs:
            ph += struct.pack(e + "IIIIIIII", 1, 0, base, base, load_size, load_size, 5, 0x1000)
            ph += struct.pack(e + "IIIIIIII", 2, dyn_off, base + dyn_off, base + dyn_off, len(dyn), len(dyn), 6, 4)
        sh = b""
        if shdrs:
            sh += bytes(shent)
            sh += struct.pack(e + "IIIIIIIIII", 0, 6, 3, base + dyn_off, dyn_off, len(dyn), 2, 0, 4, dynent)
            sh += struct.pack(e + "IIIIIIIIII", 0, 3, 2, base + str_off, str_off, len(strtab), 0, 0, 1, 0)
    data = head + ph + dyn + strtab + sh
    assert len(head) == ehsize and len(data) == total
    return data


@pytest.mark.parametrize("cls64", [True, False])
@pytest.mark.parametrize("little", [True, False])
def test_elf_needed_hand_built(cls64, little):
    needed = ["libfoo.so.1", "libgomp.so.1", "libc.so.6"]
    assert elf.elf_needed(_elf(needed, cls64=cls64, little=little)) == tuple(needed)
    # Section headers only (no program headers): SHT_DYNAMIC and the DT_STRTAB section.
    assert elf.elf_needed(_elf(needed, cls64=cls64, little=little, phdrs=False, shdrs=True)) == tuple(needed)
    # DT_STRTAB outside every PT_LOAD, but a section says where it is.
    data = _elf(needed, cls64=cls64, little=little, shdrs=True, strtab_in_load=False)
    assert elf.elf_needed(data) == tuple(needed)
    assert elf.elf_needed(_elf([], cls64=cls64, little=little)) == ()


def test_elf_needed_garbage(tmp_path):
    good = _elf(["libx.so"])
    for bad in (b"", b"not an elf file at all" * 4, good[:70], b"\x7fELF" + bytes([3, 1]) + bytes(60)):
        with pytest.raises(elf.ElfError):
            elf.elf_needed(bad)
    # A LOAD that misses the string table and no section headers: nowhere to read names.
    with pytest.raises(elf.ElfError, match="DT_STRTAB"):
        elf.elf_needed(_elf(["libx.so"], strtab_in_load=False))
    # A static executable: no dynamic section.
    static = bytearray(_elf(["libx.so"]))
    struct.pack_into("<I", static, 64 + 56, 4)  # PT_DYNAMIC -> PT_NOTE
    with pytest.raises(elf.ElfError, match="no dynamic section"):
        elf.elf_needed(bytes(static))
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    with pytest.raises(elf.ElfError):
        elf.read_elf_needed(empty)
    with pytest.raises(elf.ElfError):
        elf.read_elf_needed(tmp_path / "missing.so")


# --------------------------------------------------------------------------- ISA (pure)


def test_isa_status_rules():
    zen4 = frozenset("sse2 lm avx2 avx512f avx512_vnni avx512_bf16".split())
    s = doctor.isa_status("x86_64", zen4)
    assert (s.present, s.bf16_fast, s.int8_fast) == (("avx2", "avx512f", "avx512_vnni", "avx512_bf16"), True, True)
    assert s.meaning == ("AVX-512 kernels; bf16 inference can be faster than fp32 (hardware bf16 dot products); "
                         "int8 fast (VNNI/AMX)")
    zen3 = frozenset("sse2 lm avx2 fma".split())
    s = doctor.isa_status("x86_64", zen3)
    assert (s.present, s.bf16_fast, s.int8_fast) == (("avx2",), False, False)
    assert s.meaning == "AVX2 kernels; bf16 brings no oneDNN speed-up on this CPU"
    spr = frozenset("avx2 avx512f avx512_bf16 amx_tile amx_bf16 amx_int8".split())
    assert doctor.isa_status("x86_64", spr).meaning.startswith("AMX kernels; bf16 inference can be faster")
    graviton3 = frozenset("fp asimd asimddp sve bf16 i8mm".split())
    s = doctor.isa_status("aarch64", graviton3)
    assert (s.present, s.bf16_fast, s.int8_fast) == (("asimd", "sve"), True, True)
    kunpeng = frozenset("fp asimd asimddp".split())
    assert doctor.isa_status("aarch64", kunpeng).bf16_fast is False
    s = doctor.isa_status("ppc64", frozenset())
    assert (s.bf16_fast, s.int8_fast) == (None, None)


def test_isa_flags_are_the_one_table():
    """doctor lists the flags of view.ISA_FLAGS (what --show-topology shows), in its order:
    one table, not a second copy (issue 20)."""
    from cpulaunch import view

    assert doctor.ISA_FLAGS is view.ISA_FLAGS
    every = frozenset(view.ISA_FLAGS) | {"sse2", "lm", "avx_vnni", "fpu"}
    assert doctor.isa_status("x86_64", every).present == view.ISA_FLAGS
    assert doctor.isa_status("aarch64", frozenset(SHOWN_ISA)).present == SHOWN_ISA == view.ISA_FLAGS


# --------------------------------------------------------------------------- fixture dumps


# Read from the dumps by hand (cat), not by cpulaunch.
DUMPS = {
    "hw-128arm-2pa2n8cluster4co": dict(sockets=2, nodes=[0, 1, 2, 3], cores=128, tpc=1, online="0-127",
                                       allowed="0-127", limits=[], governors={}, smt=(False, "notimplemented"),
                                       arch="aarch64"),
    "hw-20em64t-hybrid-1p6c2t+2ca4co1t": dict(sockets=1, nodes=[0], cores=14, tpc=2, online="0-19",
                                              allowed="0-19", limits=[], governors={"powersave": 20},
                                              smt=(True, "on"), arch="x86_64"),
    "hw-256ppc-8n8s4t": dict(sockets=8, nodes=[0, 1, 4, 5, 8, 9, 12, 13], cores=64, tpc=4, online="0-255",
                             allowed="0-255", limits=[], governors={}, smt=(None, None), arch="ppc64"),
    "hw-32amd64-4s2n4c-cgroup2": dict(sockets=4, nodes=list(range(8)), cores=32, tpc=1, online="0-31",
                                      allowed="0-5", limits=["cgroup cpuset"], governors={"ondemand": 6},
                                      smt=(None, None), arch="x86_64"),
    "hw-32intel64-2p8co2t+8ve": dict(sockets=2, nodes=[0, 1], cores=16, tpc=2, online="0-31", allowed="0-31",
                                     limits=[], governors={}, smt=(True, "on"), arch="x86_64"),
    "hw-fakeheteromemtiers": dict(sockets=1, nodes=[0, 1, 2], cores=6, tpc=1, online="0-5", allowed="0-5",
                                  limits=[], governors={}, smt=(False, "notsupported"), arch="x86_64"),
    "hw-memorysidecaches": dict(sockets=2, nodes=[0, 1, 2, 3], cores=40, tpc=2, online="0-79", allowed="0-79",
                                limits=[], governors={}, smt=(True, "on"), arch="x86_64"),
    "hw-nvidiagpunumanodes": dict(sockets=2, nodes=[0, 8], cores=8, tpc=4, online="0-15,88-103",
                                  allowed="0-15", limits=["cgroup cpuset"], governors={}, smt=(None, None),
                                  arch="ppc64"),
}


def test_every_dump_is_described():
    assert sorted(DUMPS) == MACHINES


@pytest.mark.parametrize("machine", MACHINES)
def test_dump(sysroots, machine):
    root = sysroots[machine]
    want = DUMPS[machine]
    report = doctor.diagnose(root, {"PATH": os.environ.get("PATH", "")}, live=False)
    doc = doctor.to_json(report)
    assert json.loads(json.dumps(doc)) == doc
    assert _failed(report) == []
    assert doc["live"] is False and doc["root"] == str(root)
    t = doc["topology"]
    got = dict(sockets=t["sockets"], nodes=t["nodes"], cores=t["cores"], tpc=t["threads_per_core"],
               online=t["online"], allowed=t["allowed"], limits=t["limits"],
               governors=doc["settings"]["governors"],
               smt=(doc["settings"]["smt_active"], doc["settings"]["smt_control"]), arch=doc["isa"]["arch"])
    assert got == want
    # numactl is never run for another machine.
    assert doc["numactl"]["checked"] is False and doc["numactl"]["usable"] is None
    assert doc["numactl"]["reason"] == "not checked: another machine"
    assert _by_id(report)["numactl"].summary == "numactl not checked: another machine (--sysroot)"
    present, bf16 = _expected_isa(want["arch"], _cpuinfo_flags(root))
    assert doc["isa"]["present"] == list(present)
    assert doc["isa"]["bf16_fast"] is bf16
    # Knobs the dumps do not hold are absent (null), not guessed.
    assert doc["settings"]["numa_balancing"] is None and doc["settings"]["thp_enabled"] is None
    gov = _by_id(report)["cpufreq-governor"]
    if want["governors"]:
        assert gov.severity == "warn"
        assert gov.summary == "CPU frequency governor is not performance: " + ", ".join(
            f"{g} on {n} CPU(s)" for g, n in want["governors"].items())
    else:
        assert (gov.severity, gov.summary) == ("info", "no cpufreq governor in the dump")
    assert ("hybrid" in _by_id(report)) is (machine == "hw-20em64t-hybrid-1p6c2t+2ca4co1t")
    doctor.render_text(report)


def test_dump_hybrid_ecores(sysroots):
    report = doctor.diagnose(sysroots["hw-20em64t-hybrid-1p6c2t+2ca4co1t"], {}, live=False)
    assert _by_id(report)["hybrid"].summary == "hybrid CPU: E-cores 12-19"


# --------------------------------------------------------------------------- generated trees


def _write(root: Path, rel: str, text) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)


def make_root(root: Path, garbage: bool = False) -> Path:
    """A 4-CPU, 2-node machine: CPU 3 offline, cgroup v2 cpuset 0-2 with a 1.5-CPU quota,
    NUMA balancing on, THP always, SMT off, governors performance (CPU 0) and schedutil (1-2)."""
    cpu = "sys/devices/system/cpu"
    _write(root, f"{cpu}/online", "0-2\n")
    _write(root, f"{cpu}/present", "0-3\n")
    for n in range(3):
        _write(root, f"{cpu}/cpu{n}/topology/thread_siblings_list", f"{n}\n")
        _write(root, f"{cpu}/cpu{n}/topology/physical_package_id", "0\n")
        _write(root, f"{cpu}/cpu{n}/topology/core_id", f"{n}\n")
    _write(root, f"{cpu}/cpu3/online", "0\n")
    _write(root, "sys/devices/system/node/node0/cpulist", "0-1\n")
    _write(root, "sys/devices/system/node/node1/cpulist", "2-3\n")
    _write(root, "sys/devices/system/node/has_memory", "0-1\n")
    _write(root, "proc/self/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n")
    _write(root, "proc/self/cgroup", "0::/job\n")
    _write(root, "sys/fs/cgroup/job/cpuset.cpus.effective", "0-2\n")
    _write(root, f"{cpu}/cpu0/cpufreq/scaling_governor", "performance\n")
    _write(root, f"{cpu}/cpufreq/policy1/related_cpus", "1 2\n")
    if garbage:
        _write(root, "proc/cpuinfo", b"\xff\xfe\x00garbage\x00:::\n")
        _write(root, "proc/sys/kernel/numa_balancing", "yes please\n")
        _write(root, "sys/kernel/mm/transparent_hugepage/enabled", "")
        _write(root, f"{cpu}/smt/active", "x\n")
        _write(root, f"{cpu}/cpufreq/policy1/scaling_governor", "schedutil\n")
        _write(root, f"{cpu}/cpufreq/policy2/related_cpus", "a b\n")
        _write(root, f"{cpu}/cpufreq/policy2/scaling_governor", "powersave\n")
    else:
        _write(root, "proc/cpuinfo", "processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu sse2 lm avx2 "
                                     "avx512f avx512_vnni avx512_bf16 amx_tile amx_bf16 amx_int8\n")
        _write(root, "sys/fs/cgroup/job/cpu.max", "150000 100000\n")
        _write(root, "proc/sys/kernel/numa_balancing", "1\n")
        _write(root, "sys/kernel/mm/transparent_hugepage/enabled", "[always] madvise never\n")
        _write(root, "sys/kernel/mm/transparent_hugepage/defrag", "always defer [madvise] never\n")
        _write(root, f"{cpu}/smt/active", "0\n")
        _write(root, f"{cpu}/smt/control", "off\n")
        _write(root, f"{cpu}/cpufreq/policy1/scaling_governor", "schedutil\n")
    return root


def test_generated_machine_knobs(tmp_path):
    root = make_root(tmp_path / "m")
    report = doctor.diagnose(root, {}, live=False)
    doc = doctor.to_json(report)
    assert _failed(report) == []
    t = doc["topology"]
    assert (t["online"], t["offline"], t["allowed"], t["cpuset"], t["quota_cpus"]) == ("0-2", "3", "0-2", "0-2", 1.5)
    assert t["quota_source"] == "/sys/fs/cgroup/job"
    assert t["limits"] == ["cpu quota"]
    assert doc["settings"] == {
        "numa_balancing": 1, "cpufreq": True, "governors": {"performance": 1, "schedutil": 2},
        "thp_enabled": "always", "thp_defrag": "madvise", "smt_active": False, "smt_control": "off",
    }
    assert doc["isa"] == {
        "arch": "x86_64", "present": ["avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16",
                                      "amx_int8"],
        "bf16_fast": True, "int8_fast": True,
        "meaning": "AMX kernels; bf16 inference can be faster than fp32 (hardware bf16 dot products); "
                   "int8 fast (VNNI/AMX)",
    }
    f = _by_id(report)
    got = {k: (f[k].severity, f[k].summary) for k in
           ("offline-cpus", "cpu-quota", "numa-balancing", "cpufreq-governor", "thp", "smt")}
    assert got == {
        "offline-cpus": ("warn", "CPUs 3 are offline"),
        "cpu-quota": ("warn", "a CPU quota of 1.5 CPUs is smaller than the 3 allowed CPUs"),
        "numa-balancing": ("warn", "automatic NUMA balancing is on (kernel.numa_balancing=1)"),
        "cpufreq-governor": ("warn", "CPU frequency governor is not performance: schedutil on 2 CPU(s)"),
        "thp": ("info", "transparent hugepages: always (defrag madvise)"),
        "smt": ("info", "SMT (hyper-threading) is off (control: off)"),
    }
    assert "allowed-cpus" not in f  # the cpuset is every online CPU
    text = doctor.render_text(report)
    assert "WARN  cpu-quota: a CPU quota of 1.5 CPUs is smaller than the 3 allowed CPUs\n" in text
    assert f"        fix: {f['numa-balancing'].fix}\n" in text
    assert text.index("WARN ") < text.index("info ") < text.index("ok ")


def test_generated_machine_garbage_files(tmp_path):
    """Garbled knobs give no traceback and no invented values."""
    root = make_root(tmp_path / "g", garbage=True)
    report = doctor.diagnose(root, {}, live=False)
    doc = doctor.to_json(report)
    assert _failed(report) == []
    assert doc["topology"]["quota_cpus"] is None
    assert doc["settings"]["numa_balancing"] is None
    assert doc["settings"]["thp_enabled"] is None
    assert doc["settings"]["smt_active"] is None
    # policy2's related_cpus is garbage: its CPUs are unknown, so only CPU 0 and policy1's count.
    assert doc["settings"]["governors"] == {"performance": 1, "schedutil": 2}
    assert doc["isa"]["arch"] == "unknown" and doc["isa"]["bf16_fast"] is None
    ids = {f.id for f in report.findings}
    assert not ids & {"numa-balancing", "thp"}


def test_empty_root_is_a_finding(tmp_path):
    report = doctor.diagnose(tmp_path, {}, live=False)
    f = _by_id(report)["topology"]
    assert f.severity == "error" and f.summary.startswith(f"cannot read the machine under {tmp_path}: ")
    assert report.topology is None and report.numactl is None and report.worst == "error"
    doc = doctor.to_json(report)
    assert doc["topology"] is None and doc["settings"] is None
    doctor.render_text(report)


def test_environment_variables_that_fight_the_plan(tmp_path):
    root = make_root(tmp_path / "m")
    env = {"KMP_AFFINITY": "granularity=fine,compact,1,0", "OMP_NUM_THREADS": "8", "GOMP_CPU_AFFINITY": "0-3",
           "OMP_PROC_BIND": "close", "OMP_PLACES": "cores",
           "LD_PRELOAD": "/usr/lib/libjemalloc.so.2 /usr/lib/libtcmalloc.so.4:libfoo.so"}
    report = doctor.diagnose(root, env, live=False)
    got = {f.id: f.severity for f in report.findings if f.id.startswith("env-")}
    assert got == {"env-KMP_AFFINITY": "warn", "env-OMP_NUM_THREADS": "warn", "env-GOMP_CPU_AFFINITY": "warn",
                   "env-OMP_PROC_BIND": "warn", "env-OMP_PLACES": "warn", "env-LD_PRELOAD": "error"}
    f = _by_id(report)
    assert f["env-LD_PRELOAD"].summary == (
        "LD_PRELOAD holds two allocators: /usr/lib/libjemalloc.so.2 /usr/lib/libtcmalloc.so.4")
    assert "accelerate#3911" in f["env-KMP_AFFINITY"].detail
    assert f["env-KMP_AFFINITY"].fix.startswith("unset KMP_AFFINITY")
    doc = doctor.to_json(report)["environment"]
    assert doc["preload"] == ["/usr/lib/libjemalloc.so.2", "/usr/lib/libtcmalloc.so.4", "libfoo.so"]
    assert doc["preload_allocators"] == ["jemalloc", "tcmalloc"]
    assert doc["vars"]["OMP_NUM_THREADS"] == "8"

    two_omp = doctor.diagnose(root, {"LD_PRELOAD": "libiomp5.so:/usr/lib/libgomp.so.1"}, live=False)
    f = _by_id(two_omp)["env-LD_PRELOAD"]
    assert (f.severity, f.summary) == ("warn", "LD_PRELOAD holds two OpenMP runtimes: libiomp5.so /usr/lib/libgomp.so.1")
    assert doctor.to_json(two_omp)["environment"]["preload_openmp"] == ["intel", "gnu"]

    quiet = doctor.diagnose(root, {}, live=False)
    assert not [f for f in quiet.findings if f.id.startswith("env-")]


def _fake_numactl(folder: Path, stderr: str, rc: int) -> Path:
    """A numactl that refuses the way a container without CAP_SYS_NICE does."""
    folder.mkdir()
    exe = folder / "numactl"
    exe.write_text(f"#!/bin/sh\necho '{stderr}' >&2\nexit {rc}\n")
    exe.chmod(0o755)
    return exe


def test_numactl_refused_without_cap_sys_nice(tmp_path):
    exe = _fake_numactl(tmp_path / "bin", "set_mempolicy: Operation not permitted", 1)
    report = doctor.diagnose("/", {"PATH": str(exe.parent)}, live=True)
    n = doctor.to_json(report)["numactl"]
    allowed = cpulist.format(os.sched_getaffinity(0))
    assert (n["path"], n["checked"], n["usable"]) == (str(exe), True, False)
    assert n["argv"][:3] == [str(exe), "-C", allowed] and n["argv"][-1] == "true"
    assert n["reason"] == f"`{' '.join(n['argv'][:-1])}` failed: set_mempolicy: Operation not permitted"
    f = _by_id(report)["numactl"]
    assert f.severity == "error" and f.summary == f"numactl cannot bind here: {n['reason']}"
    assert "CAP_SYS_NICE" in f.detail
    assert f.fix == "docker run --cap-add SYS_NICE ... (or pass --bind affinity: CPU binding only)"


def test_numactl_missing(tmp_path):
    (tmp_path / "empty").mkdir()
    report = doctor.diagnose("/", {"PATH": str(tmp_path / "empty")}, live=True)
    assert doctor.to_json(report)["numactl"] == {"path": None, "checked": False, "usable": False,
                                                 "reason": "not installed", "argv": None}
    f = _by_id(report)["numactl"]
    assert (f.severity, f.summary, f.fix) == ("warn", "numactl is not installed", "apt-get install numactl (dnf install numactl)")


# --------------------------------------------------------------------------- one rule, one place


def _logging_numactl(folder: Path) -> tuple:
    """A numactl that appends each command line it gets to a log (one line, NUL-separated
    words) and succeeds; returns (its path, the log)."""
    folder.mkdir()
    log = folder / "calls"
    exe = folder / "numactl"
    exe.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$0\" \"$@\" >> '{log}'\necho >> '{log}'\nexit 0\n")
    exe.chmod(0o755)
    return exe, log


def _calls(log: Path) -> list:
    return [line.rstrip("\0").split("\0") for line in log.read_text().splitlines() if line]


@pytest.mark.parametrize("policy", ["bind", "preferred", "interleave", "local", "none"])
def test_numactl_verdict_is_the_launchers_check(tmp_path, policy):
    """doctor runs exactly the `numactl ... true` that `cpulaunch --bind numactl --mem-policy P`
    runs as its check before a launch (before: doctor always built `-m NODES`, whatever the
    policy, so it could pass a command the launcher never runs)."""
    exe, log = _logging_numactl(tmp_path / "bin")
    env = dict(os.environ, PATH=f"{exe.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("LD_PRELOAD", None)
    repo = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-m", "cpulaunch", "--bind", "numactl", "--mem-policy", policy, "true"],
                   env=env, cwd=repo, timeout=60, check=True, capture_output=True)
    launcher_check = _calls(log)[0]  # then the launch itself: numactl PREFIX true
    log.unlink()
    out = subprocess.run([sys.executable, "-m", "cpulaunch", "doctor", "--mem-policy", policy, "--format", "json"],
                         env=env, cwd=repo, timeout=60, capture_output=True, text=True)
    assert out.returncode in (0, 1), out.stderr
    assert _calls(log) == [launcher_check]
    doc = json.loads(out.stdout)["numactl"]
    assert (doc["argv"], doc["usable"]) == (launcher_check, True)
    flag = {"bind": "-m", "preferred": "-p", "interleave": "-i", "local": "-l", "none": "-C"}[policy]
    assert launcher_check[0] == str(exe) and flag in launcher_check and launcher_check[-1] == "true"


@pytest.mark.parametrize("machine", MACHINES)
@pytest.mark.parametrize("policy", ["bind", "preferred", "interleave", "local"])
def test_numactl_argv_on_every_dump(sysroots, tmp_path, machine, policy):
    """On each dumped machine, doctor's numactl command is numactl.check_argv's for the
    same topology and policy (doctor run as if live, with a numactl that only logs)."""
    from cpulaunch.machine import numactl, probe
    from cpulaunch.machine.numactl import MemPolicy

    exe, log = _logging_numactl(tmp_path / "bin")
    report = doctor.diagnose(sysroots[machine], {"PATH": str(exe.parent)}, live=True,
                             mem_policy=MemPolicy(policy))
    want = numactl.check_argv(str(exe), probe.probe(sysroots[machine]), MemPolicy(policy))
    assert list(report.numactl.argv) == want == _calls(log)[0]


def test_ld_preload_is_split_like_glibc(tmp_path):
    """glibc's ld.so splits LD_PRELOAD on spaces and colons only (ld.so(8)): "a.so<TAB>b.so"
    is one entry that it cannot load. Checked here with the real loader, then doctor must
    agree (before: doctor split on any whitespace and saw two allocators)."""
    jemalloc = libfinder.find(libraries.REGISTRY["jemalloc"], os.environ)
    tcmalloc = libfinder.find(libraries.REGISTRY["tcmalloc"], os.environ)
    if jemalloc is None or tcmalloc is None:
        pytest.skip("jemalloc and tcmalloc are both needed for the real-loader check")
    cat = shutil.which("cat")

    def mapped(value: str) -> tuple:
        res = subprocess.run([cat, "/proc/self/maps"], env={"LD_PRELOAD": value}, capture_output=True,
                             text=True, timeout=30, check=True)
        names = {os.path.basename(line.split()[-1]) for line in res.stdout.splitlines() if "/" in line}
        return (any(n.startswith("libjemalloc") for n in names),
                any(n.startswith("libtcmalloc") for n in names), res.stderr)

    for sep in ("\t", "\n"):
        value = f"{jemalloc}{sep}{tcmalloc}"
        je, tc, err = mapped(value)
        assert (je, tc) == (False, False) and "cannot be preloaded" in err  # glibc: one entry
        report = doctor.diagnose(tmp_path, {"LD_PRELOAD": value}, live=False)
        assert report.environment.preload == (value,)
        assert report.environment.preload_allocators == (libraries.identify(value),)
        f = _by_id(report)["env-LD_PRELOAD"]
        assert (f.severity, f.summary) == ("info", f"LD_PRELOAD is set: {value}")
    for sep in (" ", ":", " : "):
        value = f"{jemalloc}{sep}{tcmalloc}"
        assert mapped(value)[:2] == (True, True)  # glibc: two entries, both loaded
        report = doctor.diagnose(tmp_path, {"LD_PRELOAD": value}, live=False)
        assert report.environment.preload == (str(jemalloc), str(tcmalloc))
        assert _by_id(report)["env-LD_PRELOAD"].severity == "error"
