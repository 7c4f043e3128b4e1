"""The platform as data (issue 33): the CPU's vendor and family read from /proc/cpuinfo and
sysfs (fixture dumps, generated trees, this machine), and each platform's environment
recipe as ``--dry-run``, ``--print-env``, ``--show-topology`` and doctor show it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bigtree import make_tree
from conftest import REPO
from cpulaunch.machine import platform as plat
from cpulaunch.machine import probe, recipes
from cpulaunch.machine.platform import CpuId, Platform, parse_cpuid, parse_midr, platform_of

#: What each hwloc dump's /proc/cpuinfo names (FACTS.json says what the machines are).
FIXTURE_PLATFORMS = {
    "hw-128arm-2pa2n8cluster4co": Platform("HiSilicon", "TaiShan v110 (Kunpeng 920)",
                                           "implementer 0x48 part 0xd01", "other"),
    "hw-20em64t-hybrid-1p6c2t+2ca4co1t": Platform("Intel", "Raptor Lake-P", "family 0x6 model 0xba", "intel"),
    "hw-256ppc-8n8s4t": Platform("IBM", "POWER7", "", "other"),
    "hw-32amd64-4s2n4c-cgroup2": Platform("AMD", "K10", "family 0x10 model 0x9", "other"),
    "hw-32intel64-2p8co2t+8ve": Platform("Intel", "Skylake-SP / Cascade Lake / Cooper Lake",
                                         "family 0x6 model 0x55", "intel"),
    "hw-fakeheteromemtiers": Platform("Intel", "", "family 0xf model 0x6b", "intel"),  # QEMU's default CPU
    "hw-memorysidecaches": Platform("Intel", "Skylake-SP / Cascade Lake / Cooper Lake",
                                    "family 0x6 model 0x55", "intel"),
    "hw-nvidiagpunumanodes": Platform("IBM", "POWER9", "", "other"),
}


def cpuinfo_x86(vendor: str, family: int, model: int, flags: str = "fpu sse2 avx2") -> str:
    return (f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
            f"model name\t: test CPU\nflags\t\t: {flags}\n\nprocessor\t: 1\nvendor_id\t: {vendor}\n"
            f"cpu family\t: 99\nmodel\t\t: 99\n\n")


def cpulaunch(*args: str, env=None) -> subprocess.CompletedProcess:
    e = dict(os.environ if env is None else env)
    return subprocess.run([sys.executable, "-m", "cpulaunch", *args], capture_output=True, text=True,
                          cwd=REPO, env=e, timeout=120)


@pytest.mark.parametrize("machine", sorted(FIXTURE_PLATFORMS))
def test_each_dump_names_its_cpu(sysroots, machine):
    topo = probe.probe(sysroots[machine])
    assert topo.platform == FIXTURE_PLATFORMS[machine]
    assert recipes.recipe_for(topo.platform.kind).name == "generic"  # no Zen, no Neoverse among them


def test_every_dump_is_named():
    from conftest import MACHINES

    assert set(FIXTURE_PLATFORMS) == set(MACHINES)


@pytest.mark.parametrize("family, model, gen", [
    (0x17, 0x01, "Zen 1"), (0x17, 0x08, "Zen 1"), (0x17, 0x31, "Zen 2"), (0x17, 0x71, "Zen 2"),
    (0x19, 0x01, "Zen 3"), (0x19, 0x21, "Zen 3"), (0x19, 0x11, "Zen 4"), (0x19, 0xA0, "Zen 4"),
    (0x1A, 0x02, "Zen 5"), (0x1A, 0x11, "Zen 5"), (0x1A, 0x50, "Zen 6"),
])
def test_zen_generations_by_family_and_model(family, model, gen):
    """EPYC 7001/7002 (Naples 0x17/0x01, Rome 0x17/0x31), 7003 Milan (0x19/0x01), 9004 Genoa
    (0x19/0x11), 9005 Turin (0x1a/0x02, dense 0x1a/0x11): cpuinfo prints them in decimal."""
    p = platform_of(parse_cpuid(cpuinfo_x86("AuthenticAMD", family, model)))
    assert p == Platform("AMD", gen, f"family {family:#x} model {model:#x}", "amd-zen")
    assert p.text == f"AMD {gen} (family {family:#x} model {model:#x})"
    assert recipes.recipe_for(p.kind).name == "amd-zen"


def test_other_x86_cpus():
    assert platform_of(parse_cpuid(cpuinfo_x86("GenuineIntel", 6, 0x8F))) == Platform(
        "Intel", "Sapphire Rapids", "family 0x6 model 0x8f", "intel")
    assert platform_of(parse_cpuid(cpuinfo_x86("AuthenticAMD", 0x19, 0xF0))).family.startswith("Zen (")
    assert platform_of(parse_cpuid(cpuinfo_x86("AuthenticAMD", 0x1B, 0x00))).kind == "amd-zen"
    assert platform_of(parse_cpuid(cpuinfo_x86("AuthenticAMD", 0x15, 0x02))) == Platform(
        "AMD", "Bulldozer family", "family 0x15 model 0x2", "other")
    assert platform_of(parse_cpuid(cpuinfo_x86("HygonGenuine", 0x18, 0x01))).kind == "other"
    assert platform_of(None) == Platform() and Platform().text == "unknown CPU"
    assert parse_cpuid("") == CpuId() and parse_cpuid("garbage\n\x00:::\n") == CpuId()


@pytest.mark.parametrize("implementer, part, core", [
    (0x41, 0xD0C, "Neoverse N1"), (0x41, 0xD40, "Neoverse V1"), (0x41, 0xD4F, "Neoverse V2"),
    (0x41, 0xD8E, "Neoverse N3"), (0x6D, 0xD49, "Cobalt 100 (Neoverse N2)"),
])
def test_arm_neoverse_cores(implementer, part, core):
    """Graviton 2/3/4 (N1, V1, V2), Grace (V2), Cobalt 100 (N2 under Microsoft's implementer)."""
    text = f"processor\t: 0\nFeatures\t: fp asimd bf16\nCPU implementer\t: {implementer:#x}\nCPU part\t: {part:#x}\n"
    p = platform_of(parse_cpuid(text))
    assert (p.family, p.kind) == (core, "arm-neoverse")
    assert p.ids == f"implementer {implementer:#x} part {part:#x}"


def test_midr_from_sysfs_when_cpuinfo_has_no_ids(tmp_path):
    """A kernel that prints only ``Features`` (no CPU implementer): the probe reads arm64's
    MIDR_EL1 from sysfs, through the same bounded reader, and names a Graviton 4 (V2)."""
    assert parse_midr("0x00000000410fd4f1\n") == (0x41, 0xD4F)
    assert parse_midr("nonsense") == (None, None)
    root = tmp_path / "arm"
    make_tree(root, sockets=1, nodes_per_socket=1, cores_per_node=4, threads_per_core=1, extra={
        "proc/cpuinfo": "processor\t: 0\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd sve bf16\n\n",
        plat.MIDR_FILE: "0x00000000410fd4f1\n"})
    topo = probe.probe(root)
    assert topo.platform == Platform("Arm", "Neoverse V2", "implementer 0x41 part 0xd4f", "arm-neoverse")


def test_this_machine(tmp_path):
    """This machine's real /proc/cpuinfo, checked against what its ISA says it must be: an
    AMD CPU with AVX-512 is a Zen 4 or later (Zen 1-3 have none), one with AVX2 and no
    AVX-512 a Zen 1-3; an arm64 CPU with bf16 is not a Neoverse N1."""
    text = Path("/proc/cpuinfo").read_text()
    flags, _ = probe.parse_cpuinfo(text)
    p = probe.probe("/").platform
    cpu = parse_cpuid(text)
    if cpu.vendor_id == "AuthenticAMD" and (cpu.family or 0) >= 0x17:
        assert p.kind == "amd-zen"
        gen = p.family.split()[-1] if p.family.startswith("Zen ") else ""
        if "avx512f" in flags:
            assert gen in ("4", "5", "6"), p
        elif "avx2" in flags:
            assert gen in ("1", "2", "3"), p
        assert recipes.recipe_for(p.kind).name == "amd-zen"
    elif cpu.vendor_id == "GenuineIntel":
        assert p.kind == "intel" and recipes.recipe_for(p.kind).name == "generic"
    elif cpu.arch == "arm64" and "bf16" in flags:
        assert p.family != "Neoverse N1"
    else:
        assert p == platform_of(cpu)


# --------------------------------------------------------------------------- recipes as data


def test_every_recipe_setting_says_why_and_where_from():
    for recipe in recipes.RECIPES.values():
        names = [s.name for s in recipe.settings]
        assert len(names) == len(set(names)), recipe.name
        for s in recipe.settings:
            assert s.why and s.source and s.value, (recipe.name, s.name)
    assert recipes.RECIPE_CHOICES == ("auto", "generic", "amd-zen", "arm-neoverse")
    assert set(recipes.BY_KIND.values()) <= set(recipes.RECIPES)


def test_recipe_env_applies_each_setting_where_it_takes_effect():
    amd, arm = recipes.RECIPES["amd-zen"], recipes.RECIPES["arm-neoverse"]
    assert recipes.recipe_env(amd, openmp_pin_style="omp", allocator="tcmalloc") == {"OMP_DYNAMIC": "FALSE"}
    with_kmp = recipes.recipe_env(amd, openmp_pin_style="kmp", allocator="jemalloc")
    assert with_kmp == {
        "OMP_DYNAMIC": "FALSE", "KMP_TPAUSE": "0", "KMP_FORKJOIN_BARRIER_PATTERN": "dist,dist",
        "KMP_PLAIN_BARRIER_PATTERN": "dist,dist", "KMP_REDUCTION_BARRIER_PATTERN": "dist,dist",
        "MALLOC_CONF": "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:-1,"
                       "muzzy_decay_ms:-1"}
    assert recipes.recipe_env(amd, openmp_pin_style="omp", allocator=None, wait_policy="active",
                              matmul_algo=5) == {"OMP_DYNAMIC": "FALSE", "OMP_WAIT_POLICY": "ACTIVE",
                                                 "ZENDNNL_MATMUL_ALGO": "5"}
    assert recipes.recipe_env(arm, openmp_pin_style="omp", allocator=None, flags=frozenset({"asimd"})) == {
        "LRU_CACHE_CAPACITY": "1024", "THP_MEM_ALLOC_ENABLE": "1", "OMP_PROC_BIND": "false", "OMP_PLACES": "cores"}
    assert recipes.recipe_env(arm, openmp_pin_style="omp", allocator=None,
                              flags=frozenset({"asimd", "bf16"}))["DNNL_DEFAULT_FPMATH_MODE"] == "BF16"
    assert recipes.recipe_env(recipes.GENERIC, openmp_pin_style="kmp", allocator="jemalloc") == {}


# --------------------------------------------------------------------------- what the user sees


ZEN4 = cpuinfo_x86("AuthenticAMD", 25, 17, "fpu sse2 avx2 avx512f avx512bw avx512vl avx512dq avx512_bf16")


@pytest.fixture(scope="module")
def zen4_root(tmp_path_factory):
    """A 1-socket, 4-core tree whose /proc/cpuinfo is an EPYC 9004's (Zen 4)."""
    root = tmp_path_factory.mktemp("zen4") / "root"
    make_tree(root, sockets=1, nodes_per_socket=1, cores_per_node=4, threads_per_core=1, extra={"proc/cpuinfo": ZEN4})
    return root


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("CPULAUNCH_", "OMP_", "KMP_", "MALLOC_CONF", "ZENDNNL_", "LD_PRELOAD"))}


def dry_json(root, *args, env=None) -> dict:
    r = cpulaunch("--sysroot", str(root), "--dry-run", "--format", "json", *args, "true", env=env or clean_env())
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_dry_run_shows_the_recipe_on_zen(zen4_root):
    doc = dry_json(zen4_root, "--allocator", "jemalloc")
    env = doc["instances"][0]["env"]
    assert env["CPULAUNCH_PLANNED_RECIPE"] == "amd-zen"
    assert env["OMP_DYNAMIC"] == "FALSE"
    assert env["MALLOC_CONF"].endswith("dirty_decay_ms:-1,muzzy_decay_ms:-1")  # AMD's, not the guide's
    assert doc["recipe"]["name"] == "amd-zen" and doc["recipe"]["chosen"] == "auto"
    assert doc["recipe"]["platform"] == "AMD Zen 4 (family 0x19 model 0x11)"
    assert doc["recipe"]["env"] == {"OMP_DYNAMIC": "FALSE", "MALLOC_CONF": env["MALLOC_CONF"]}
    assert doc["topology"]["platform"] == {"vendor": "AMD", "family": "Zen 4", "ids": "family 0x19 model 0x11",
                                           "kind": "amd-zen"}
    text = cpulaunch("--sysroot", str(zen4_root), "--dry-run", "python", "x.py", env=clean_env()).stdout
    assert "# recipe amd-zen (auto: AMD Zen 4 (family 0x19 model 0x11)) sets OMP_DYNAMIC" in text


def test_generic_recipe_and_the_recipe_option(zen4_root, sysroots):
    """Unknown and Intel platforms keep the planned variables alone; --recipe generic on a
    Zen does the same; --recipe amd-zen elsewhere applies AMD's."""
    intel = sysroots["hw-32intel64-2p8co2t+8ve"]
    doc = dry_json(intel, "--instances-per-socket")
    assert {i["env"]["CPULAUNCH_PLANNED_RECIPE"] for i in doc["instances"]} == {"generic"}
    assert not any(k.startswith(("OMP_DYNAMIC", "KMP_", "MALLOC_CONF")) for i in doc["instances"] for k in i["env"])
    assert doc["recipe"] == {"name": "generic", "platform": "Intel Skylake-SP / Cascade Lake / Cooper Lake "
                             "(family 0x6 model 0x55)", "chosen": "auto", "env": {}, "settings": []}
    plain = dry_json(zen4_root, "--recipe", "generic")["instances"][0]["env"]
    assert "OMP_DYNAMIC" not in plain and plain["CPULAUNCH_PLANNED_RECIPE"] == "generic"
    forced = dry_json(intel, "--recipe", "amd-zen", "--ninstances", "1")
    assert forced["recipe"]["chosen"] == "--recipe" and forced["instances"][0]["env"]["OMP_DYNAMIC"] == "FALSE"


def test_options_and_the_users_environment_win_over_the_recipe(zen4_root):
    env = dry_json(zen4_root, "--omp-runtime", "intel", "--kmp-blocktime", "7", "--omp-wait-policy", "passive",
                   "--zendnn-matmul-algo", "5")["instances"][0]["env"]
    assert (env["KMP_BLOCKTIME"], env["KMP_TPAUSE"], env["OMP_WAIT_POLICY"], env["ZENDNNL_MATMUL_ALGO"]) == (
        "7", "0", "PASSIVE", "5")
    user = {**clean_env(), "OMP_DYNAMIC": "TRUE"}
    r = cpulaunch("--sysroot", str(zen4_root), "--dry-run", "--format", "json", "true", env=user)
    doc = json.loads(r.stdout)
    assert "OMP_DYNAMIC" not in doc["instances"][0]["env"]
    assert "OMP_DYNAMIC=TRUE from your environment kept (cpulaunch planned FALSE); pass --override-env to use " \
           "cpulaunch's value" in doc["notes"]


def test_cpulaunchs_pinning_wins_over_the_arm_recipe(tmp_path):
    """arm-neoverse sets OMP_PLACES=cores and OMP_PROC_BIND=false; --omp-places pins each
    thread to one CPU instead, and that is what the instance gets."""
    root = tmp_path / "v2"
    make_tree(root, sockets=1, nodes_per_socket=1, cores_per_node=4, threads_per_core=1, extra={
        "proc/cpuinfo": "processor\t: 0\nFeatures\t: fp asimd bf16\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n\n"})
    env = dry_json(root)["instances"][0]["env"]
    assert (env["OMP_PLACES"], env["OMP_PROC_BIND"], env["DNNL_DEFAULT_FPMATH_MODE"]) == ("cores", "false", "BF16")
    pinned = dry_json(root, "--omp-places")["instances"][0]["env"]
    assert (pinned["OMP_PLACES"], pinned["OMP_PROC_BIND"]) == ("{0},{1},{2},{3}", "close")


def test_print_env_and_show_topology_name_it(zen4_root):
    r = cpulaunch("--sysroot", str(zen4_root), "--print-env", env=clean_env())
    assert r.returncode == 0, r.stderr
    assert "export CPULAUNCH_PLANNED_RECIPE=amd-zen\n" in r.stdout and "export OMP_DYNAMIC=FALSE\n" in r.stdout
    r = cpulaunch("--sysroot", str(zen4_root), "--show-topology", env=clean_env())
    assert "platform: AMD Zen 4 (family 0x19 model 0x11); recipe amd-zen\n" in r.stdout


def test_doctor_names_the_platform_and_recipe(zen4_root):
    from cpulaunch.tools import doctor

    report = doctor.diagnose(zen4_root, {}, live=False)
    assert report.topology.platform.text == "AMD Zen 4 (family 0x19 model 0x11)"
    assert report.topology.recipe == "amd-zen"
    found = {f.id: f for f in report.findings}
    assert found["platform"].summary == "AMD Zen 4 (family 0x19 model 0x11); environment recipe amd-zen"
    assert "  platform: AMD Zen 4 (family 0x19 model 0x11); recipe amd-zen\n" in doctor.render_text(report)
    topo = doctor.to_json(report)["topology"]
    assert (topo["vendor"], topo["family"], topo["recipe"]) == ("AMD", "Zen 4", "amd-zen")
