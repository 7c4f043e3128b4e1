"""Topology from sysfs: every fixture machine's probed Topology against independent truth.

Truth comes from outside cpulaunch: ``tests/fixtures/FACTS.json`` (facts read from each
dump) and hwloc's own description of the same dump (``*.console`` / ``*.xml``: core
sibling sets, CPU kinds, allowed cpuset). Hand-made roots in ``tmp_path`` cover what no
dump shows (offline CPUs, a cgroup CPU quota, missing files); ``lscpu -p`` text pasted
from ``lscpu --sysroot`` covers the lscpu fallback.
"""

from __future__ import annotations

import gc
import os
import re
import shutil
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bigtree
from conftest import FACTS, FIXTURES, MACHINES, plan_json, run_cli
from cpulaunch import cpulist
from cpulaunch.machine import probe
from cpulaunch.machine.files import MAX_FILE_BYTES
from cpulaunch.machine.probe import parse_cpuinfo, parse_lscpu
from cpulaunch.machine.topology import (
    CpuFacts,
    HostFacts,
    NodeFacts,
    TopologyError,
    build,
)

# --------------------------------------------------------------------------- truth


def facts(machine: str) -> dict:
    return FACTS[machine]["facts"]


def fact_online(machine: str) -> frozenset:
    f = facts(machine)
    text = f["cpu/online"] if f["cpu/online"] is not None else f["cpu dirs"]
    return cpulist.parse(text)


def hwloc_cores(machine: str) -> set:
    """SMT sibling sets as hwloc printed them (Core objects and their PU os indexes)."""
    folder = FIXTURES / machine
    consoles = sorted(p for p in folder.glob("*.console") if "-kept" not in p.name)
    cores: list = []
    if consoles:
        for line in consoles[0].read_text().splitlines():
            m = re.match(r"\s*(Core|PU) L#\d+ \(P#(\d+)", line)
            if not m:
                continue
            if m.group(1) == "Core":
                cores.append(set())
            else:
                cores[-1].add(int(m.group(2)))
    else:
        (xml,) = folder.glob("*.xml")
        for obj in ET.parse(xml).iter("object"):
            if obj.get("type") == "Core":
                cores.append({int(pu.get("os_index")) for pu in obj.iter("object") if pu.get("type") == "PU"})
    return {frozenset(c) for c in cores}


def hwloc_mask(text: str) -> frozenset:
    """hwloc's "0x0000003f,0xffffffff" cpuset text as ids (words: most significant first)."""
    return cpulist.parse_mask(",".join(w[2:] if w.startswith("0x") else w for w in text.split(",")))


#: Where each dump's allowed CPUs come from (a path inside the dump, or None: no cpuset).
ALLOWED_FROM = {
    "hw-128arm-2pa2n8cluster4co": "sys/fs/cgroup/cpuset/cpuset.effective_cpus",
    "hw-20em64t-hybrid-1p6c2t+2ca4co1t": None,
    "hw-256ppc-8n8s4t": None,
    "hw-32amd64-4s2n4c-cgroup2": "cgroup/unified/uid_2008/job_15389/step_0/cpuset.cpus.effective",
    "hw-32intel64-2p8co2t+8ve": "sys/fs/cgroup/cpuset/cpuset.effective_cpus",
    "hw-fakeheteromemtiers": "sys/fs/cgroup/cpuset.cpus.effective",
    "hw-memorysidecaches": "sys/fs/cgroup/cpuset/cpuset.effective_cpus",
    "hw-nvidiagpunumanodes": "sys/fs/cgroup/cpuset/jjh/cpuset.effective_cpus",
}

#: The allowed CPUs by hand, as read from those files and intersected with the online CPUs.
ALLOWED = {
    "hw-128arm-2pa2n8cluster4co": "0-127",
    "hw-20em64t-hybrid-1p6c2t+2ca4co1t": "0-19",
    "hw-256ppc-8n8s4t": "0-255",
    "hw-32amd64-4s2n4c-cgroup2": "0-5",  # a Slurm job step (cgroup v2)
    "hw-32intel64-2p8co2t+8ve": "0-31",
    "hw-fakeheteromemtiers": "0-5",
    "hw-memorysidecaches": "0-79",
    "hw-nvidiagpunumanodes": "0-15",  # the cpuset says 0-87; 88-103 are online but not in it
}


def test_every_machine_is_covered():
    assert set(MACHINES) == set(FACTS) == set(ALLOWED) == set(ALLOWED_FROM)


@pytest.fixture(scope="module")
def topos(sysroots) -> dict:
    return {m: probe.probe(root) for m, root in sysroots.items()}


# --------------------------------------------------------------------------- per machine


@pytest.mark.parametrize("machine", MACHINES)
def test_online_and_offline(machine, topos):
    topo, f = topos[machine], facts(machine)
    assert topo.online == fact_online(machine)
    # cpulaunch's "offline" is a CPU with a cpuN folder (or in cpu/present) that is not
    # online. No dump has one; the kernel's cpu/offline (possible but absent CPUs: 32-111
    # on the Xeon 4108, 32-47 on the AMD) is not offline in that sense.
    assert topo.offline == frozenset()
    assert f["present-but-offline cpus"] == ""
    kernel_offline = cpulist.parse(f["cpu/offline"] or "")
    assert not kernel_offline & topo.offline
    assert topo.to_dict()["offline"] == ""


@pytest.mark.parametrize("machine", MACHINES)
def test_sockets(machine, topos):
    topo, f = topos[machine], facts(machine)
    packages = f["packages (physical_package_id: online cpus)"]
    if "-1" in packages:
        # POWER7 LPAR: no package ids, so sockets are the NUMA nodes with CPUs.
        node_cpus = {int(n): cpulist.parse(d["cpus"]) for n, d in f["numa nodes"].items()}
        assert [(s.package_id, s.cpus, s.nodes) for s in topo.sockets] == [
            (None, cpus, (nid,)) for nid, cpus in sorted(node_cpus.items()) if cpus
        ]
        assert any("physical_package_id (-1)" in n for n in topo.notes)
    else:
        assert {s.package_id: cpulist.format(s.cpus) for s in topo.sockets} == {
            int(k): v for k, v in packages.items()
        }
        assert not any("physical_package_id" in n for n in topo.notes)
    # sockets are indexed by their lowest CPU, and name the nodes holding their CPUs
    assert [s.index for s in topo.sockets] == list(range(len(topo.sockets)))
    assert [min(s.cpus) for s in topo.sockets] == sorted(min(s.cpus) for s in topo.sockets)
    for s in topo.sockets:
        assert s.nodes == tuple(sorted(n.id for n in topo.nodes.values() if n.cpus & s.cpus))
    assert frozenset().union(*(s.cpus for s in topo.sockets)) == topo.online


@pytest.mark.parametrize("machine", MACHINES)
def test_numa_nodes(machine, topos):
    topo, f = topos[machine], facts(machine)
    fnodes = f["numa nodes"]
    assert sorted(topo.nodes) == sorted(int(n) for n in fnodes)
    has_memory = f.get("node/has_memory")
    for nid, d in fnodes.items():
        node = topo.nodes[int(nid)]
        # node cpulists naming CPUs that are not online (POWER9: 0-87) are cut to online
        assert node.cpus == cpulist.parse(d["cpus"]) & topo.online, nid
        assert node.mem_total_kb // 1024 == d["MemTotal_MiB"]
        expected_mem = int(nid) in cpulist.parse(has_memory) if has_memory is not None else d["MemTotal_MiB"] > 0
        assert node.has_memory is expected_mem
    memory_only = sorted(n.id for n in topo.nodes.values() if not n.cpus)
    assert memory_only == sorted(int(n) for n, d in fnodes.items() if not cpulist.parse(d["cpus"]) & topo.online)
    assert topo.memory_nodes == frozenset(n.id for n in topo.nodes.values() if n.has_memory)


def test_memory_only_and_sparse_nodes(topos):
    power9 = topos["hw-nvidiagpunumanodes"]
    assert sorted(power9.nodes) == [0, 8, 250, 251, 252, 253, 254, 255]
    assert cpulist.format(power9.nodes[0].cpus) == "0-15"  # node0/cpulist says 0-87
    assert cpulist.format(power9.nodes[8].cpus) == "88-103"
    assert all(not power9.nodes[n].cpus and power9.nodes[n].has_memory for n in range(250, 256))
    tiers = topos["hw-fakeheteromemtiers"]
    assert {n.id: cpulist.format(n.cpus) for n in tiers.nodes.values()} == {
        0: "0-1", 1: "2-3", 2: "4-5", 4: "", 6: "", 8: "", 9: ""
    }
    assert tiers.memory_nodes == {0, 1, 2, 4, 6, 8, 9}
    power7 = topos["hw-256ppc-8n8s4t"]
    assert sorted(power7.nodes) == [0, 1, 4, 5, 8, 9, 12, 13]


@pytest.mark.parametrize("machine", MACHINES)
def test_cores_are_smt_sibling_sets(machine, topos):
    topo, f = topos[machine], facts(machine)
    assert len(topo.cores) == f["physical cores (unique thread-sibling sets among online cpus)"]
    assert Counter(len(c.cpus) for c in topo.cores) == {
        int(k): v for k, v in f["threads per core histogram"].items()
    }
    assert [cpulist.format(c.cpus) for c in topo.cores[:6]] == f["first sibling sets"]
    # hwloc agrees on every core (its AMD XML shows only the allowed cores)
    ours = {frozenset(c.cpus) for c in topo.cores}
    theirs = hwloc_cores(machine)
    if machine == "hw-32amd64-4s2n4c-cgroup2":
        ours = {c for c in ours if c & topo.allowed}
    assert ours == theirs
    # a core's id is its lowest CPU; cores are disjoint and cover the online CPUs
    for c in topo.cores:
        assert c.id == min(c.cpus) and list(c.cpus) == sorted(c.cpus)
        assert set(c.cpus) <= topo.sockets[c.socket].cpus
        assert c.node is None or set(c.cpus) <= topo.nodes[c.node].cpus
    assert [c.id for c in topo.cores] == sorted(c.id for c in topo.cores)
    assert sum(len(c.cpus) for c in topo.cores) == len(topo.online)
    assert frozenset(x for c in topo.cores for x in c.cpus) == topo.online
    for c in topo.cores:
        assert topo.core_of(c.cpus[-1]) == c


def test_smt_sibling_examples(topos):
    xeon = topos["hw-32intel64-2p8co2t+8ve"]
    assert xeon.core_of(0).cpus == (0, 16) and xeon.core_of(31).cpus == (15, 31)
    gold = topos["hw-memorysidecaches"]
    assert gold.core_of(40).cpus == (0, 40) and gold.core_of(0).node == 0
    power9 = topos["hw-nvidiagpunumanodes"]
    assert [c.cpus for c in power9.cores][-1] == (100, 101, 102, 103)


@pytest.mark.parametrize("machine", MACHINES)
def test_launch_probe_without_core_ids_is_the_same_machine(machine, sysroots, topos):
    """core_ids=False (what a launch reads, issue 12) gives the same topology with
    Core.core_id left None where a sibling list grouped the core; and reads fewer files."""
    lean = probe.probe(sysroots[machine], core_ids=False)
    full = topos[machine]
    grouped_by_core_id = any("cores grouped by core_id" in n for n in full.notes)
    expected = full if grouped_by_core_id else full._replace(
        cores=tuple(c._replace(core_id=None) for c in full.cores))
    assert lean == expected
    if not grouped_by_core_id and full.source == "sysfs":
        assert all(c.core_id is None for c in lean.cores)


def test_amd_core_id_repeats_but_cores_stay_distinct(topos):
    """Magny-Cours: core_id is 0-3 in each package, though a package has 8 cores."""
    amd = topos["hw-32amd64-4s2n4c-cgroup2"]
    assert facts("hw-32amd64-4s2n4c-cgroup2")["core_id duplicated within (package,die) across distinct cores"] == 16
    assert len(amd.cores) == 32
    assert {c.core_id for c in amd.cores} == {0, 1, 2, 3}
    package0 = [c for c in amd.cores if c.socket == 0]
    assert len(package0) == 8 and len({c.core_id for c in package0}) == 4


@pytest.mark.parametrize("machine", MACHINES)
def test_allowed_cpus_and_their_source(machine, topos, sysroots):
    topo = topos[machine]
    assert cpulist.format(topo.allowed) == ALLOWED[machine]
    rel = ALLOWED_FROM[machine]
    if rel is None:
        assert topo.allowed == topo.online and topo.cpuset is None
        assert topo.allowed_source == "all online CPUs (no cpuset in the dump)"
    else:
        assert topo.allowed_source == f"cgroup cpuset /{rel}"
        from_file = cpulist.parse((sysroots[machine] / rel).read_text())
        assert topo.allowed == from_file & topo.online == topo.cpuset
        assert topo.allowed <= from_file  # never widened


def test_allowed_cpus_agree_with_hwloc_on_the_amd_job():
    (xml,) = (FIXTURES / "hw-32amd64-4s2n4c-cgroup2").glob("*.xml")
    machine = next(ET.parse(xml).iter("object"))
    assert cpulist.format(hwloc_mask(machine.get("allowed_cpuset"))) == ALLOWED["hw-32amd64-4s2n4c-cgroup2"]


@pytest.mark.parametrize("machine", MACHINES)
def test_e_cores(machine, topos):
    topo = topos[machine]
    e_cpus = frozenset(x for c in topo.cores if c.efficiency for x in c.cpus)
    if machine != "hw-20em64t-hybrid-1p6c2t+2ca4co1t":
        assert not topo.hybrid and not e_cpus
        return
    # hwloc: "CPU kind #0 efficiency 0 cpuset 0x000ff000" (the least efficient kind)
    console = next((FIXTURES / machine).glob("*.console")).read_text()
    kinds = dict(re.findall(r"CPU kind #\d+ efficiency (\d+) cpuset (\S+)", console))
    assert topo.hybrid
    assert e_cpus == hwloc_mask(kinds["0"]) == cpulist.parse("12-19")
    assert all(len(c.cpus) == 1 for c in topo.cores if c.efficiency)  # E-cores have no SMT
    assert "hybrid CPU: E-cores 12-19 (from cpuinfo_max_freq)" in topo.notes


@pytest.mark.parametrize("machine", MACHINES)
def test_to_dict_is_consistent(machine, topos):
    topo = topos[machine]
    d = topo.to_dict()
    assert d["online"] == cpulist.format(topo.online)
    assert d["allowed"] == ALLOWED[machine]
    assert [n["id"] for n in d["nodes"]] == sorted(topo.nodes)
    assert [s["cpus"] for s in d["sockets"]] == [cpulist.format(s.cpus) for s in topo.sockets]
    assert len(d["cores"]) == len(topo.cores)
    assert d["source"] == "sysfs"


def test_model_and_flags_from_cpuinfo(topos):
    assert topos["hw-32intel64-2p8co2t+8ve"].model == "Intel(R) Xeon(R) Silver 4108 CPU @ 1.80GHz"
    assert "avx512f" in topos["hw-32intel64-2p8co2t+8ve"].flags
    assert topos["hw-nvidiagpunumanodes"].model == "POWER9, altivec supported"
    assert "asimd" in topos["hw-128arm-2pa2n8cluster4co"].flags  # arm64 "Features"


def test_kunpeng_nul_bytes_and_large_package_ids(topos, sysroots):
    root = sysroots["hw-128arm-2pa2n8cluster4co"]
    raw = (root / "sys/devices/system/cpu/cpu64/topology/thread_siblings_list").read_bytes()
    assert raw == b"64\n\x00"  # what makes the dump hard
    assert topos["hw-128arm-2pa2n8cluster4co"].core_of(64).cpus == (64,)
    topo = topos["hw-128arm-2pa2n8cluster4co"]
    assert [(s.package_id, cpulist.format(s.cpus), s.nodes) for s in topo.sockets] == [
        (36, "0-63", (0, 1)),
        (8442, "64-127", (2, 3)),
    ]


def test_power7_per_cpu_online_files(topos):
    """No cpu/online in the POWER7 dump: online comes from cpuN folders (no cpu0/online)."""
    topo = topos["hw-256ppc-8n8s4t"]
    assert topo.online == frozenset(range(256))
    assert "no /sys/devices/system/cpu/online: online CPUs taken from per-CPU folders" in topo.notes


def test_node_cpumap_matches_cpulist_in_every_dump(sysroots):
    """Every node's cpumap names the same online CPUs as its cpulist (the POWER9 dump's
    node0/cpulist says 0-87 where its cpumap says 0-15, the CPUs that exist)."""
    checked = 0
    for machine, root in sysroots.items():
        online = fact_online(machine)
        for node in sorted((root / "sys/devices/system/node").glob("node[0-9]*")):
            if (node / "cpumap").exists() and (node / "cpulist").exists():
                from_mask = cpulist.parse_mask((node / "cpumap").read_text())
                from_list = cpulist.parse((node / "cpulist").read_text())
                assert from_mask & online == from_list & online, node
                assert from_mask <= from_list, node
                checked += 1
    assert checked >= 20


# --------------------------------------------------------------------------- --show-topology


def test_show_topology_amd_cgroup_job(sysroots):
    out = run_cli("--sysroot", str(sysroots["hw-32amd64-4s2n4c-cgroup2"]), "--show-topology").stdout
    lines = out.splitlines()
    assert lines[0] == (
        "AMD Opteron(tm) Processor 6134 (sysfs): 4 socket(s), 8 NUMA node(s) with CPUs, "
        "32 cores, 32 logical CPUs online"
    )
    assert lines[1] == (
        "allowed CPUs: 0-5 (cgroup cpuset /cgroup/unified/uid_2008/job_15389/step_0/cpuset.cpus.effective)"
    )
    assert lines[3] == "platform: AMD K10 (family 0x10 model 0x9); recipe generic"  # issue 33: pre-Zen
    # issue 22: cores drawn inside their L3 domain (one per node on this Opteron)
    assert lines[5:8] == ["  node 0 (16.0 GiB)", "    L3 5118 KiB: CPUs 0-3", "      core 0: 0"]
    assert "      core 5: 5" in lines and "      core 6: 6!" in lines and "      core 31: 31!" in lines
    assert sum(line.endswith("!") for line in lines if line.startswith("      core")) == 26
    assert "socket 3 (package 3): CPUs 24-31" in lines
    assert "! = not allowed for this process (affinity mask / cgroup cpuset)" in lines


def test_show_topology_hybrid(sysroots):
    out = run_cli("--sysroot", str(sysroots["hw-20em64t-hybrid-1p6c2t+2ca4co1t"]), "--show-topology").stdout
    lines = out.splitlines()
    assert "    L3 24 MiB: CPUs 0-19" in lines  # issue 22: the L3, and the E-cores' 4-core clusters
    assert "      core 0: 0 1" in lines and "      core 10: 10 11" in lines
    assert [line for line in lines if line.endswith(tuple(f" E: {c}" for c in range(20)))] == [
        f"        core {c} E: {c}" for c in range(12, 20)
    ]
    assert lines.index("      cluster: CPUs 12-15") + 1 == lines.index("        core 12 E: 12")
    assert lines.index("      cluster: CPUs 16-19") + 1 == lines.index("        core 16 E: 16")
    assert "note: hybrid CPU: E-cores 12-19 (from cpuinfo_max_freq)" in lines
    assert not any("!" in line for line in lines)


def test_show_topology_memory_only_nodes(sysroots):
    out = run_cli("--sysroot", str(sysroots["hw-nvidiagpunumanodes"]), "--show-topology").stdout
    lines = out.splitlines()
    assert lines[1] == "allowed CPUs: 0-15 (cgroup cpuset /sys/fs/cgroup/cpuset/jjh/cpuset.effective_cpus)"
    assert "socket 1 (package 8): CPUs 88-103" in lines
    assert "  node 8 (127.7 GiB)" in lines
    # issue 22: POWER9 pairs of SMT4 cores share an L2 and an L3 (shared_cpu_map only)
    assert "    L3 10 MiB: CPUs 8-15" in lines and "    L3 10 MiB: CPUs 88-95" in lines
    assert "      core 12: 12 13 14 15" in lines and "      core 88: 88! 89! 90! 91!" in lines
    assert lines[-2] == "memory-only nodes: " + ", ".join(f"{n} (15.0 GiB)" for n in range(250, 256))
    assert lines[-1] == "! = not allowed for this process (affinity mask / cgroup cpuset)"


# --------------------------------------------------------------------------- lscpu fallback

#: `lscpu -p=CPU,CORE,SOCKET,NODE --sysroot <POWER9 dump>` (util-linux 2.38.1), pasted.
#: Sparse CPU ids, SMT4, node 8; lscpu numbers sockets 0,1 where the kernel says 0,8.
LSCPU_POWER9 = """\
# The following is the parsable format, which can be fed to other
# programs. Each different item in every column has an unique ID
# starting usually from zero.
# CPU,Core,Socket,Node
0,0,0,0
1,0,0,0
2,0,0,0
3,0,0,0
4,1,0,0
5,1,0,0
6,1,0,0
7,1,0,0
8,2,0,0
9,2,0,0
10,2,0,0
11,2,0,0
12,3,0,0
13,3,0,0
14,3,0,0
15,3,0,0
88,4,1,8
89,4,1,8
90,4,1,8
91,4,1,8
92,5,1,8
93,5,1,8
94,5,1,8
95,5,1,8
96,6,1,8
97,6,1,8
98,6,1,8
99,6,1,8
100,7,1,8
101,7,1,8
102,7,1,8
103,7,1,8
"""


def test_parse_lscpu():
    rows = parse_lscpu(LSCPU_POWER9)
    assert len(rows) == 32
    assert rows[0] == (0, 0, 0, 0) and rows[16] == (88, 4, 1, 8) and rows[-1] == (103, 7, 1, 8)
    # no NUMA: an empty NODE field is None; blank and comment lines are skipped
    assert parse_lscpu("# CPU,Core,Socket,Node\n\n0,0,0,\n1,1,0,\n") == ((0, 0, 0, None), (1, 1, 0, None))
    assert parse_lscpu("") == ()


def test_build_from_lscpu_power9():
    topo = build(HostFacts(lscpu=parse_lscpu(LSCPU_POWER9), allowed=frozenset(range(16)), allowed_source="test"))
    assert topo.source == "lscpu"
    assert "sysfs has no CPU topology: read from lscpu -p" in topo.notes
    assert cpulist.format(topo.online) == "0-15,88-103"
    assert [cpulist.format(c.cpus) for c in topo.cores] == [
        "0-3", "4-7", "8-11", "12-15", "88-91", "92-95", "96-99", "100-103"
    ]
    assert [(s.package_id, cpulist.format(s.cpus), s.nodes) for s in topo.sockets] == [
        (0, "0-15", (0,)),
        (1, "88-103", (8,)),  # lscpu's socket number, not the kernel's package id 8
    ]
    assert {n.id: cpulist.format(n.cpus) for n in topo.nodes.values()} == {0: "0-15", 8: "88-103"}
    assert all(n.has_memory for n in topo.nodes.values())  # nothing says otherwise
    assert cpulist.format(topo.allowed) == "0-15" and topo.allowed_source == "test"


def test_lscpu_fallback_agrees_with_sysfs(topos):
    sysfs = topos["hw-nvidiagpunumanodes"]
    fallback = build(HostFacts(lscpu=parse_lscpu(LSCPU_POWER9)))
    assert {c.cpus for c in fallback.cores} == {c.cpus for c in sysfs.cores}
    assert {n.id: n.cpus for n in fallback.nodes.values()} == {
        n.id: n.cpus for n in sysfs.nodes.values() if n.cpus
    }
    assert [s.cpus for s in fallback.sockets] == [s.cpus for s in sysfs.sockets]


def test_build_from_lscpu_without_numa():
    topo = build(HostFacts(lscpu=parse_lscpu("# CPU,Core,Socket,Node\n0,0,0,\n1,0,0,\n2,1,0,\n3,1,0,\n")))
    assert [c.cpus for c in topo.cores] == [(0, 1), (2, 3)]
    assert list(topo.nodes) == [0] and topo.nodes[0].cpus == frozenset(range(4))


def test_build_from_empty_lscpu_is_an_error():
    with pytest.raises(TopologyError):
        build(HostFacts(lscpu=parse_lscpu("# CPU,Core,Socket,Node\n")))
    with pytest.raises(TopologyError):
        build(HostFacts())


@pytest.mark.skipif(shutil.which("lscpu") is None, reason="lscpu (util-linux) not installed")
def test_run_lscpu_on_the_dump_gives_the_pasted_text(sysroots):
    text = probe.run_lscpu(str(sysroots["hw-nvidiagpunumanodes"]))
    assert parse_lscpu(text) == parse_lscpu(LSCPU_POWER9)


# --------------------------------------------------------------------------- cgroup parsers


def test_parse_proc_cgroup():
    v1 = facts("hw-32intel64-2p8co2t+8ve")["cgroup/cpuset"]["proc/self/cgroup"]
    got = probe.parse_proc_cgroup(v1)
    assert got["cpuset"] == "/"
    assert got["cpu"] == got["cpuacct"] == "/system.slice/sshd.service"
    assert got["net_prio"] == got["net_cls"] == "/"
    assert got["name=systemd"] == "/system.slice/sshd.service"
    assert "" not in got
    v2 = facts("hw-fakeheteromemtiers")["cgroup/cpuset"]["proc/self/cgroup"]
    assert probe.parse_proc_cgroup(v2) == {"": "/user.slice/user-0.slice/session-1.scope"}
    # hybrid host: both; a path may hold ':'; junk lines are skipped
    assert probe.parse_proc_cgroup("0::/a:b\n4:cpuset:/job\nbroken\n") == {"": "/a:b", "cpuset": "/job"}
    assert probe.parse_proc_cgroup("") == {}


def test_parse_mounts():
    text = "\n".join(facts("hw-memorysidecaches")["cgroup/cpuset"]["cgroup/cpuset mounts"]) + "\nproc /proc proc rw 0 0\n"
    got = probe.parse_mounts(text)
    assert [(p, t) for p, t, _ in got] == [
        ("/sys/fs/cgroup/unified", "cgroup2"),
        ("/sys/fs/cgroup/systemd", "cgroup"),
        ("/sys/fs/cgroup/memory", "cgroup"),
        ("/sys/fs/cgroup/blkio", "cgroup"),
        ("/sys/fs/cgroup/cpuset", "cgroup"),
    ]
    assert "cpuset" in got[-1][2] and "rw" in got[-1][2]
    assert probe.parse_mounts("none /cgroup/unified cgroup2 rw 0 0") == [("/cgroup/unified", "cgroup2", {"rw"})]
    assert probe.parse_mounts("short line\n") == []


@pytest.mark.parametrize(
    "text, cpus",
    [
        ("200000 100000\n", 2.0),
        ("150000 100000", 1.5),
        ("50000 100000", 0.5),
        ("max 100000\n", None),
        ("max", None),
        ("300000", 3.0),  # period defaults to 100000
        ("", None),
    ],
)
def test_parse_cpu_max(text, cpus):
    assert probe.parse_cpu_max(text) == cpus


# --------------------------------------------------------------------------- hand-made roots


def make_root(base: Path, files: dict) -> Path:
    """Write ``{relative path: text}`` under ``base`` (a text of None makes a folder)."""
    for rel, text in files.items():
        path = base / rel
        if text is None:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return base


def small_machine(cpus=4, extra=None) -> dict:
    """One package, no SMT, one node 0 with memory: the files sysfs would hold."""
    files = {
        "sys/devices/system/cpu/online": f"0-{cpus - 1}\n",
        "sys/devices/system/cpu/present": f"0-{cpus - 1}\n",
        "sys/devices/system/node/node0/cpulist": f"0-{cpus - 1}\n",
        "sys/devices/system/node/has_memory": "0\n",
        "proc/cpuinfo": "processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu avx2\n",
    }
    for c in range(cpus):
        t = f"sys/devices/system/cpu/cpu{c}/topology"
        files[f"{t}/physical_package_id"] = "0\n"
        files[f"{t}/core_id"] = f"{c}\n"
        files[f"{t}/thread_siblings_list"] = f"{c}\n"
    files.update(extra or {})
    return files


def test_cgroup_v2_cpu_quota_caps_omp_threads(tmp_path):
    root = make_root(tmp_path, small_machine(4, {
        "proc/self/cgroup": "0::/job/step\n",
        "proc/self/mounts": "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n",
        "sys/fs/cgroup/cpu.max": "max 100000\n",
        "sys/fs/cgroup/job/cpu.max": "200000 100000\n",  # 2 CPUs for the job
        "sys/fs/cgroup/job/step/cpu.max": "300000 100000\n",  # looser below: the job wins
        "sys/fs/cgroup/job/step/cpuset.cpus.effective": "0-3\n",
    }))
    raw = probe.read_facts(root)
    assert raw.quota_cpus == 2.0 and raw.quota_source == "/sys/fs/cgroup/job"
    topo = build(raw)
    assert topo.quota_cpus == 2.0
    assert topo.allowed_source == "cgroup cpuset /sys/fs/cgroup/job/step/cpuset.cpus.effective"
    doc = plan_json(root)
    (inst,) = doc["instances"]
    assert inst["cpulist"] == "0-3"
    assert inst["env"]["OMP_NUM_THREADS"] == "2"
    assert "a CPU quota of 2 CPUs applies (cgroup cpu.max): OpenMP threads lowered to fit it" in doc["notes"]
    assert doc["topology"]["quota_cpus"] == 2.0


def test_cgroup_v1_cfs_quota(tmp_path):
    root = make_root(tmp_path, small_machine(4, {
        "proc/self/cgroup": "4:cpu,cpuacct:/slurm/job1\n3:cpuset:/slurm/job1\n",
        "proc/mounts": (
            "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n"
            "cgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0\n"
        ),
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        "sys/fs/cgroup/cpu,cpuacct/slurm/job1/cpu.cfs_quota_us": "150000\n",
        "sys/fs/cgroup/cpu,cpuacct/slurm/job1/cpu.cfs_period_us": "100000\n",
        "sys/fs/cgroup/cpuset/cpuset.cpus": "0-3\n",
        "sys/fs/cgroup/cpuset/slurm/job1/cpuset.cpus": "1-2\n",
    }))
    topo = probe.probe(root)
    assert topo.quota_cpus == 1.5
    assert cpulist.format(topo.allowed) == "1-2"
    assert topo.allowed_source == "cgroup cpuset /sys/fs/cgroup/cpuset/slurm/job1/cpuset.cpus"


def test_no_quota_and_status_fallback(tmp_path):
    root = make_root(tmp_path, small_machine(4, {
        "proc/self/status": "Name:\tx\nCpus_allowed_list:\t0,2\n",
    }))
    topo = probe.probe(root)
    assert topo.quota_cpus is None and topo.cpuset is None
    assert cpulist.format(topo.allowed) == "0,2"
    assert topo.allowed_source == "Cpus_allowed_list of proc/self/status"
    assert topo.model == "Test CPU" and topo.flags == {"fpu", "avx2"}


def test_per_cpu_online_files_and_offline_cpus(tmp_path):
    """No cpu/online: cpu0 without an online file is online (it cannot be unplugged), an
    online file of "0" is offline, a cpu folder without topology and online file is not
    online; "offline" is every known CPU that is not online."""
    files = small_machine(5)
    del files["sys/devices/system/cpu/online"]
    files["sys/devices/system/cpu/present"] = "0-5\n"
    files["sys/devices/system/cpu/cpu1/online"] = "1\n"
    files["sys/devices/system/cpu/cpu2/online"] = "0\n"
    files["sys/devices/system/cpu/cpu3/online"] = "1\n\x00"
    for f in list(files):
        if f.startswith("sys/devices/system/cpu/cpu4/"):
            del files[f]
    files["sys/devices/system/cpu/cpu4"] = None  # folder only
    topo = probe.probe(make_root(tmp_path, files))
    assert cpulist.format(topo.online) == "0-1,3"
    assert cpulist.format(topo.offline) == "2,4-5"  # 5: in cpu/present, no folder
    assert cpulist.format(topo.nodes[0].cpus) == "0-1,3"
    assert [c.cpus for c in topo.cores] == [(0,), (1,), (3,)]
    assert any("per-CPU folders" in n for n in topo.notes)


def test_nodes_from_cpumap_links_and_meminfo(tmp_path):
    """node0 has only a cpumap, node2 only cpuN/node2 links; has_memory from meminfo."""
    files = small_machine(4)
    del files["sys/devices/system/node/node0/cpulist"]
    del files["sys/devices/system/node/has_memory"]
    files["sys/devices/system/node/node0/cpumap"] = "00000003\n"
    files["sys/devices/system/node/node0/meminfo"] = "Node 0 MemTotal:       16775084 kB\n"
    files["sys/devices/system/node/node2/meminfo"] = "Node 2 MemTotal:       0 kB\n"
    files["sys/devices/system/cpu/cpu2/node2"] = None
    files["sys/devices/system/cpu/cpu3/node2"] = None
    topo = probe.probe(make_root(tmp_path, files))
    assert {n.id: (cpulist.format(n.cpus), n.has_memory, n.mem_total_kb) for n in topo.nodes.values()} == {
        0: ("0-1", True, 16775084),
        2: ("2-3", False, 0),
    }
    assert [c.node for c in topo.cores] == [0, 0, 2, 2]


def test_sysroot_without_cpus_is_a_usage_error(tmp_path):
    proc = run_cli("--sysroot", str(tmp_path), "--show-topology", check_rc=2)
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- pure builder


def _raw(cpus: dict, nodes: dict, **kw) -> HostFacts:
    """Facts of a machine as the probe would give them: ``cpus`` {cpu: CpuFacts fields},
    ``nodes`` {node id: its CPUs}."""
    return HostFacts(
        online=frozenset(cpus),
        cpus={c: CpuFacts(has_topology=True, **v) for c, v in cpus.items()},
        nodes={n: NodeFacts(cpus=frozenset(v)) for n, v in nodes.items()},
        **kw,
    )


def test_siblings_from_mask_then_core_id():
    topo = build(_raw(
        {
            0: dict(package_id=0, core_id=0, siblings=cpulist.parse_mask("00000005\n")),
            2: dict(package_id=0, core_id=0, siblings=cpulist.parse_mask("00000005\n")),
            1: dict(package_id=0, core_id=1),  # no sibling files: grouped by core_id
            3: dict(package_id=0, core_id=1),
        },
        {0: {0, 1, 2, 3}},
    ))
    assert [c.cpus for c in topo.cores] == [(0, 2), (1, 3)]
    assert any("grouped by core_id" in n for n in topo.notes)


def test_package_minus_one_groups_by_node_and_cpus_without_node():
    topo = build(_raw(
        {c: dict(package_id=-1, core_id=c, siblings=frozenset({c})) for c in range(6)},
        {4: {0, 1}, 10: {2, 3}},
    ))
    assert [(s.package_id, cpulist.format(s.cpus), s.nodes) for s in topo.sockets] == [
        (None, "0-1", (4,)),
        (None, "2-3", (10,)),
        (None, "4-5", ()),
    ]
    assert [c.node for c in topo.cores] == [4, 4, 10, 10, None, None]
    assert "CPUs 4-5 belong to no NUMA node in sysfs" in topo.notes


def test_no_node_folders_means_one_node():
    topo = build(_raw({c: dict(package_id=0, siblings=frozenset({c})) for c in range(2)}, {}))
    assert list(topo.nodes) == [0] and topo.nodes[0].cpus == {0, 1} and topo.nodes[0].has_memory


def test_parse_cpuinfo():
    assert parse_cpuinfo("processor : 0\nFeatures : fp asimd\nCPU part : 0xd01\n") == (frozenset({"fp", "asimd"}), "")
    assert parse_cpuinfo("cpu : POWER9, altivec supported\n")[1] == "POWER9, altivec supported"
    assert parse_cpuinfo(None) == (frozenset(), "")


def test_inconsistent_sibling_lists_still_give_disjoint_cores():
    # cpu3 claims 2-3 while cpu1 claims 1,3 and cpu0/cpu2 claim 0,2: one core of all four
    sibs = {0: "0,2", 2: "0,2", 1: "1,3", 3: "2-3"}
    topo = build(_raw({c: dict(package_id=0, siblings=cpulist.parse(v)) for c, v in sibs.items()}, {0: {0, 1, 2, 3}}))
    assert [c.cpus for c in topo.cores] == [(0, 1, 2, 3)]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(0, 15), st.frozensets(st.integers(0, 15), max_size=4), min_size=1))
def test_cores_partition_the_online_cpus_whatever_the_sibling_lists(sibs):
    topo = build(_raw(
        {c: dict(package_id=0, siblings=s) for c, s in sibs.items()},
        {0: set(sibs)},
    ))
    cpus = [x for c in topo.cores for x in c.cpus]
    assert sorted(cpus) == sorted(sibs)  # disjoint, and every online CPU in one core
    for c in topo.cores:  # a core holds every sibling its CPUs name (among online CPUs)
        for x in c.cpus:
            assert (sibs[x] & set(sibs)) <= set(c.cpus)


@pytest.mark.parametrize("machine, isa", [
    ("hw-32intel64-2p8co2t+8ve", "ISA for PyTorch: avx2 avx512f"),  # Skylake-SP: no VNNI, no bf16
    ("hw-128arm-2pa2n8cluster4co", "ISA for PyTorch: asimd"),
])
def test_show_topology_names_the_isa_from_proc_cpuinfo(sysroots, machine, isa):
    out = run_cli("--sysroot", str(sysroots[machine]), "--show-topology").stdout
    assert out.splitlines()[2] == isa


# --------------------------------------------------------------------------- cgroup memory nodes

#: (allowed memory nodes, the file they come from) per dump; None: no cpuset mems in the dump.
ALLOWED_MEMS = {
    "hw-128arm-2pa2n8cluster4co": ("0-3", "sys/fs/cgroup/cpuset/cpuset.effective_mems"),
    "hw-20em64t-hybrid-1p6c2t+2ca4co1t": None,
    "hw-256ppc-8n8s4t": None,
    "hw-32amd64-4s2n4c-cgroup2": ("0-5", "cgroup/unified/uid_2008/job_15389/step_0/cpuset.mems.effective"),
    "hw-32intel64-2p8co2t+8ve": ("0-1", "sys/fs/cgroup/cpuset/cpuset.effective_mems"),
    "hw-fakeheteromemtiers": ("0-2,4,6,8-9", "sys/fs/cgroup/cpuset.mems.effective"),
    "hw-memorysidecaches": ("0-3", "sys/fs/cgroup/cpuset/cpuset.effective_mems"),
    # the job's cgroup (jjh) may allocate on node 0 only, though its parent has 0,8,250-255
    "hw-nvidiagpunumanodes": ("0", "sys/fs/cgroup/cpuset/jjh/cpuset.effective_mems"),
}


@pytest.mark.parametrize("machine", MACHINES)
def test_allowed_mems_from_the_cgroup(machine, topos, sysroots):
    topo = topos[machine]
    if ALLOWED_MEMS[machine] is None:
        assert topo.allowed_mems is None and topo.allowed_mems_source == ""
        assert topo.to_dict()["allowed_mems"] is None
        return
    text, rel = ALLOWED_MEMS[machine]
    assert cpulist.format(topo.allowed_mems) == text
    assert topo.allowed_mems == cpulist.parse((sysroots[machine] / rel).read_text())
    assert topo.allowed_mems_source == f"cgroup cpuset /{rel}"
    assert topo.to_dict()["allowed_mems"] == text


def test_allowed_mems_cgroup_v1_fallbacks_and_status(tmp_path):
    v1 = {
        "proc/self/cgroup": "3:cpuset:/job\n",
        "proc/mounts": "cgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0\n",
        "sys/fs/cgroup/cpuset/cpuset.mems": "0-1\n",
        "sys/fs/cgroup/cpuset/job/cpuset.mems": "1\n",  # no effective_mems: cpuset.mems
        "proc/self/status": "Mems_allowed_list:\t0\n",  # the cgroup file wins
    }
    topo = probe.probe(make_root(tmp_path / "v1", small_machine(4, v1)))
    assert topo.allowed_mems == {1}
    assert topo.allowed_mems_source == "cgroup cpuset /sys/fs/cgroup/cpuset/job/cpuset.mems"
    topo = probe.probe(make_root(tmp_path / "status", small_machine(4, {
        "proc/self/status": "Name:\tx\nCpus_allowed_list:\t0-3\nMems_allowed_list:\t0,2\n",
    })))
    assert topo.allowed_mems == {0, 2}
    assert topo.allowed_mems_source == "Mems_allowed_list of proc/self/status"
    assert probe.probe(make_root(tmp_path / "none", small_machine(4))).allowed_mems is None


def test_allowed_mems_of_this_process():
    """Under root "/" the real cgroup is read; the kernel's Mems_allowed_list of this
    process is the same cpuset seen from the inside."""
    status = Path("/proc/self/status").read_text()
    m = re.search(r"^Mems_allowed_list:\s*(\S+)", status, re.M)
    topo = probe.probe("/")
    if m is None:
        pytest.skip("no Mems_allowed_list in /proc/self/status (kernel without cpusets)")
    assert topo.allowed_mems == cpulist.parse(m.group(1))
    assert topo.allowed_mems_source.startswith(("cgroup cpuset /", "Mems_allowed_list"))


# --------------------------------------------------------------------------- corrupt files


def corrupt_message(root: Path, path: str, what: str) -> str:
    return f"{path}: {what}; the tree under --sysroot {root} is corrupt or not a Linux dump"


CG2 = {
    "proc/self/cgroup": "0::/job\n",
    "proc/self/mounts": "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n",
}
CG1 = {
    "proc/self/cgroup": "4:cpu,cpuacct:/job\n",
    "proc/mounts": "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu,cpuacct 0 0\n",
}
BAD_ITEM = "expected N, N-M or N-M:used/group in ASCII digits"

#: (files changed in the 4-CPU small machine, file named, what the message says)
CORRUPT = {
    "online-empty-item": ({"sys/devices/system/cpu/online": "1,,2\n"},
                          "/sys/devices/system/cpu/online", f"bad item '' in cpulist '1,,2': {BAD_ITEM}"),
    "online-huge-range": ({"sys/devices/system/cpu/online": "0-4294967295\n"},
                          "/sys/devices/system/cpu/online",
                          "id 4294967295 in cpulist '0-4294967295' is too large (ids must be below 65536)"),
    "online-beyond-kernel-max": ({"sys/devices/system/cpu/kernel_max": "3\n",
                                  "sys/devices/system/cpu/online": "0-4\n"},
                                 "/sys/devices/system/cpu/online",
                                 "id 4 in cpulist '0-4' is too large (ids must be below 4)"),
    "folder-beyond-possible": ({"sys/devices/system/cpu/possible": "0-1\n"},  # no kernel_max
                               "/sys/devices/system/cpu/cpu3",
                               "CPU id beyond the kernel's limit (ids must be below 2)"),
    "online-plus": ({"sys/devices/system/cpu/online": "+1\n"},
                    "/sys/devices/system/cpu/online", f"bad item '+1' in cpulist '+1': {BAD_ITEM}"),
    "present-reversed": ({"sys/devices/system/cpu/present": "3-1\n"},
                         "/sys/devices/system/cpu/present", "reversed range '3-1' in cpulist '3-1'"),
    "folder-beyond-kernel-max": ({"sys/devices/system/cpu/kernel_max": "3\n",
                                  "sys/devices/system/cpu/cpu9": None},
                                 "/sys/devices/system/cpu/cpu9",
                                 "CPU id beyond the kernel's limit (ids must be below 4)"),
    "node-cpulist": ({"sys/devices/system/node/node0/cpulist": "0-3x\n"},
                     "/sys/devices/system/node/node0/cpulist",
                     f"bad item '0-3x' in cpulist '0-3x': {BAD_ITEM}"),
    "node-cpumap": ({"sys/devices/system/node/node0/cpulist": "", "sys/devices/system/node/node1/cpumap": "zz\n"},
                    "/sys/devices/system/node/node1/cpumap", "bad cpumask 'zz': 'zz' is not a 32-bit hex word"),
    "node-folder-id": ({"sys/devices/system/node/node5000": None},
                       "/sys/devices/system/node/node5000", "node id beyond 4095"),
    "has-memory": ({"sys/devices/system/node/has_memory": "0-5000\n"},
                   "/sys/devices/system/node/has_memory",
                   "id 5000 in cpulist '0-5000' is too large (ids must be below 4096)"),
    "siblings-list": ({"sys/devices/system/cpu/cpu1/topology/thread_siblings_list": "1,\x00"},
                      "/sys/devices/system/cpu/cpu1/topology/thread_siblings_list",
                      f"bad item '' in cpulist '1,': {BAD_ITEM}"),
    "siblings-mask": ({"sys/devices/system/cpu/cpu1/topology/thread_siblings_list": "\n",
                       "sys/devices/system/cpu/cpu1/topology/thread_siblings": "0x3\n"},
                      "/sys/devices/system/cpu/cpu1/topology/thread_siblings",
                      "bad cpumask '0x3': '0x3' is not a 32-bit hex word"),
    "package-id": ({"sys/devices/system/cpu/cpu0/topology/physical_package_id": "zero\n"},
                   "/sys/devices/system/cpu/cpu0/topology/physical_package_id",
                   "expected an integer, found 'zero'"),
    "core-id": ({"sys/devices/system/cpu/cpu2/topology/core_id": "1.5\n"},
                "/sys/devices/system/cpu/cpu2/topology/core_id", "expected an integer, found '1.5'"),
    "cpuset-cpus": ({**CG2, "sys/fs/cgroup/job/cpuset.cpus.effective": "0-3,\n"},
                    "/sys/fs/cgroup/job/cpuset.cpus.effective", f"bad item '' in cpulist '0-3,': {BAD_ITEM}"),
    "cpuset-mems": ({**CG2, "sys/fs/cgroup/job/cpuset.mems.effective": "a\n"},
                    "/sys/fs/cgroup/job/cpuset.mems.effective", f"bad item 'a' in cpulist 'a': {BAD_ITEM}"),
    "cpus-allowed-list": ({"proc/self/status": "Cpus_allowed_list:\t0--3\n"},
                          "/proc/self/status", f"Cpus_allowed_list: bad item '0--3' in cpulist '0--3': {BAD_ITEM}"),
    "mems-allowed-list": ({"proc/self/status": "Mems_allowed_list:\t\u0663\n"},
                          "/proc/self/status", f"Mems_allowed_list: bad item '\u0663' in cpulist '\u0663': {BAD_ITEM}"),
    "cpu-max": ({**CG2, "sys/fs/cgroup/job/cpu.max": "lots 100000\n"},
                "/sys/fs/cgroup/job/cpu.max",
                "expected '$MAX $PERIOD' (max or a positive number of microseconds, then a positive "
                "period), found 'lots 100000'"),
    "cfs-quota": ({**CG1, "sys/fs/cgroup/cpu/job/cpu.cfs_quota_us": "1e5\n",
                   "sys/fs/cgroup/cpu/job/cpu.cfs_period_us": "100000\n"},
                  "/sys/fs/cgroup/cpu/job/cpu.cfs_quota_us",
                  "expected -1 or a positive number of microseconds, found '1e5'"),
    "cfs-period": ({**CG1, "sys/fs/cgroup/cpu/job/cpu.cfs_quota_us": "100000\n",
                    "sys/fs/cgroup/cpu/job/cpu.cfs_period_us": "0\n"},
                   "/sys/fs/cgroup/cpu/job/cpu.cfs_period_us",
                   "expected a positive number of microseconds, found '0'"),
    "per-cpu-online": ({"sys/devices/system/cpu/online": "", "sys/devices/system/cpu/cpu2/online": "2\n"},
                       "/sys/devices/system/cpu/cpu2/online", "expected 0 or 1, found 2"),
    "atom-cpus": ({"sys/devices/cpu_core/cpus": "0-1\n", "sys/devices/cpu_atom/cpus": "2-3;\n"},
                  "/sys/devices/cpu_atom/cpus", f"bad item '2-3;' in cpulist '2-3;': {BAD_ITEM}"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_file_is_one_line_naming_it(case, tmp_path):
    files, path, what = CORRUPT[case]
    root = make_root(tmp_path, small_machine(4, files))
    with pytest.raises(TopologyError) as info:
        probe.probe(root)
    assert str(info.value) == corrupt_message(root, path, what)


# --------------------------------------------------------------------------- unusable files


def _fifo(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("rel, make, kind", [
    ("sys/devices/system/cpu/online", _fifo, "a FIFO"),
    ("sys/devices/system/node/node0/cpulist", lambda p: p.mkdir(parents=True), "a folder"),
    ("sys/devices/system/cpu/cpu1/topology/thread_siblings_list",
     lambda p: (p.parent.mkdir(parents=True, exist_ok=True), p.symlink_to("/dev/zero")),
     "a character device"),  # endless if read
])
def test_non_regular_file_is_refused_without_blocking(rel, make, kind, tmp_path):
    files = small_machine(4)
    files.pop(rel, None)
    root = make_root(tmp_path, files)
    make(root / rel)
    start = time.monotonic()
    with pytest.raises(TopologyError) as info:
        probe.probe(root)
    assert time.monotonic() - start < 5
    assert str(info.value) == corrupt_message(root, f"/{rel}", f"not a regular file ({kind})")


def test_file_over_the_size_bound_is_refused(tmp_path):
    root = make_root(tmp_path, small_machine(4, {
        "sys/devices/system/node/has_memory": "0" + ",0" * (1 << 19) + "\n",
    }))
    with pytest.raises(TopologyError) as info:
        probe.probe(root)
    assert str(info.value) == corrupt_message(
        root, "/sys/devices/system/node/has_memory", f"larger than {MAX_FILE_BYTES} bytes")
    assert MAX_FILE_BYTES == 1 << 20


def test_optional_files_that_are_unusable_become_notes(tmp_path):
    files = small_machine(4, {
        "sys/devices/system/cpu/kernel_max": "lots\n",
        "sys/devices/system/node/node0/meminfo": "Node 0 MemTotal: many kB\n",
        "sys/devices/system/cpu/cpu0/cpu_capacity": "fast\n",
    })
    del files["proc/cpuinfo"]
    root = make_root(tmp_path, files)
    _fifo(root / "proc/cpuinfo")
    topo = probe.probe(root)
    assert topo.notes == (  # in the order the files are read
        "/sys/devices/system/cpu/kernel_max is not a CPU index ('lots'): ignored",
        "/sys/devices/system/node/node0/meminfo: no 'MemTotal: N kB' line; memory size of node 0 unknown",
        "/sys/devices/system/cpu/cpu0/cpu_capacity: not a number ('fast'): ignored",
        "/proc/cpuinfo: not a regular file (a FIFO): ignored",
    )
    assert topo.cpu_limit == cpulist.MAX_IDS  # no possible file either
    assert topo.nodes[0].mem_total_kb is None and topo.nodes[0].has_memory  # has_memory says so
    assert topo.model == "" and not topo.hybrid
    assert [c.cpus for c in topo.cores] == [(0,), (1,), (2,), (3,)]


def test_what_kernels_write_is_tolerated(tmp_path):
    """NUL bytes and newlines, an empty cpu/online (per-CPU folders decide), an empty
    node cpulist (memory-only node), an empty sibling list (grouped by core_id), an empty
    package id (as if absent: sockets from nodes)."""
    files = small_machine(4, {
        "sys/devices/system/cpu/online": "\x00",
        "sys/devices/system/cpu/present": "0-3\n\x00",
        "sys/devices/system/cpu/cpu1/online": "1\n\x00",
        "sys/devices/system/cpu/cpu2/online": "1",
        "sys/devices/system/cpu/cpu3/online": "0\n",
        "sys/devices/system/node/node1/cpulist": "\n",
        "sys/devices/system/node/has_memory": "0-1\n\x00",
        "sys/devices/system/cpu/cpu1/topology/thread_siblings_list": "",
        "sys/devices/system/cpu/cpu2/topology/physical_package_id": "\n",
        "sys/devices/system/cpu/kernel_max": "7\n\x00",
    })
    topo = probe.probe(make_root(tmp_path, files))
    assert cpulist.format(topo.online) == "0-2" and topo.offline == {3}
    assert [c.cpus for c in topo.cores] == [(0,), (1,), (2,)]
    assert {n.id: (cpulist.format(n.cpus), n.has_memory) for n in topo.nodes.values()} == {
        0: ("0-2", True), 1: ("", True)}
    assert [(s.package_id, cpulist.format(s.cpus)) for s in topo.sockets] == [(None, "0-2")]
    assert topo.cpu_limit == 8
    assert topo.notes == (
        "no /sys/devices/system/cpu/online: online CPUs taken from per-CPU folders",
        "no thread_siblings_list for some CPUs: cores grouped by core_id",
        "the kernel gives no physical_package_id (-1): sockets are taken to be NUMA nodes",
    )


def test_cpu_limit_rules():
    from cpulaunch.machine.probe import cpu_limit

    assert cpu_limit("8191\n", "0-19\n") == 8192  # kernel_max wins (NR_CPUS)
    assert cpu_limit(None, "0-111\n") == 112
    assert cpu_limit(None, None) == cpulist.MAX_IDS
    notes: list = []
    assert cpu_limit("x", "0-3", notes) == 4 and notes == [
        "/sys/devices/system/cpu/kernel_max is not a CPU index ('x'): ignored"]
    notes = []
    assert cpu_limit("99999999", None, notes) == cpulist.MAX_IDS
    assert notes == ["/sys/devices/system/cpu/kernel_max says 99999999: CPU ids bounded at 65536 instead"]
    notes = []
    assert cpu_limit(None, "0-1,,3", notes) == cpulist.MAX_IDS and notes[0].startswith(
        "/sys/devices/system/cpu/possible ignored: bad item ''")


@pytest.mark.parametrize("machine, limit", [
    ("hw-32intel64-2p8co2t+8ve", 5120),  # kernel_max 5119
    ("hw-32amd64-4s2n4c-cgroup2", 256),
    ("hw-nvidiagpunumanodes", 2048),
    ("hw-256ppc-8n8s4t", cpulist.MAX_IDS),  # no kernel_max nor possible in the dump
])
def test_cpu_limit_of_the_dumps(machine, limit, topos):
    assert topos[machine].cpu_limit == limit


@pytest.mark.parametrize("text, error", [
    ("abc", "expected '$MAX $PERIOD'"),
    ("-1 100000", "found '-1 100000'"),
    ("100 0", "found '100 0'"),
    ("100 100000 7", "found '100 100000 7'"),
    ("max x", "found 'max x'"),
    ("\uff11 100000", "expected"),
])
def test_parse_cpu_max_rejects(text, error):
    with pytest.raises(ValueError) as info:
        probe.parse_cpu_max(text)
    assert error in str(info.value)


def test_cli_corrupt_tree_exit_2_one_line(tmp_path):
    root = make_root(tmp_path, small_machine(4, {"sys/devices/system/cpu/online": "1,,2\n"}))
    proc = run_cli("--sysroot", str(root), "--dry-run", "true", check_rc=2)
    assert proc.stdout == ""
    assert proc.stderr == "cpulaunch: error: " + corrupt_message(
        root, "/sys/devices/system/cpu/online", f"bad item '' in cpulist '1,,2': {BAD_ITEM}") + "\n"


# --------------------------------------------------------------------------- big machines


@pytest.fixture(scope="module")
def big_trees():
    """{name: root} of generated trees, on tmpfs where there is one; removed afterwards."""
    base = Path(bigtree.scratch_dir("cpulaunch-test-"))
    trees = {
        "1k": bigtree.make_tree(base / "1k", sockets=8, nodes_per_socket=1, cores_per_node=64,
                                threads_per_core=2),
        "2k": bigtree.make_tree(base / "2k", sockets=8, nodes_per_socket=2, cores_per_node=64,
                                threads_per_core=2),
    }
    yield trees
    shutil.rmtree(base, ignore_errors=True)


def test_big_tree_topology(big_trees):
    topo = probe.probe(big_trees["1k"])
    assert topo.online == frozenset(range(1024)) and topo.offline == frozenset()
    assert len(topo.cores) == 512 and all(len(c.cpus) == 2 for c in topo.cores)
    assert [c.cpus for c in topo.cores[:2]] == [(0, 512), (1, 513)]
    assert topo.cores[-1].cpus == (511, 1023)
    assert [(s.package_id, cpulist.format(s.cpus), s.nodes) for s in topo.sockets] == [
        (s, f"{64 * s}-{64 * s + 63},{512 + 64 * s}-{512 + 64 * s + 63}", (s,)) for s in range(8)
    ]
    assert sorted(topo.nodes) == list(range(8))
    assert all(n.mem_total_kb == 64 << 20 and n.has_memory for n in topo.nodes.values())
    assert {c.core_id for c in topo.cores if c.socket == 3} == set(range(64))
    assert topo.core_of(600).cpus == (88, 600) and topo.node_of(600) == 1
    assert topo.cpu_limit == 8192 and topo.model == "Synthetic Xeon @ 2.00GHz"
    assert topo.notes == ()
    two = probe.probe(big_trees["2k"])
    assert len(two.online) == 2048 and len(two.cores) == 1024 and len(two.sockets) == 8
    assert [s.nodes for s in two.sockets][:2] == [(0, 1), (2, 3)]
    assert cpulist.format(two.nodes[1].cpus) == "64-127,1088-1151"


def test_big_tree_offline_cpus(tmp_path):
    root = bigtree.make_tree(tmp_path, sockets=2, nodes_per_socket=1, cores_per_node=4,
                             threads_per_core=2, offline=(9, 3, 11))
    topo = probe.probe(root)
    assert cpulist.format(topo.online) == "0-2,4-8,10,12-15"
    assert topo.offline == {3, 9, 11}
    # core 3 lost both threads, cores 1 and 3 one thread each
    assert [c.cpus for c in topo.cores] == [(0, 8), (1,), (2, 10), (4, 12), (5, 13), (6, 14), (7, 15)]
    assert cpulist.format(topo.nodes[0].cpus) == "0-2,8,10"


def _read_syscalls() -> int:
    """read(2) calls of this process so far (/proc/self/io, task I/O accounting)."""
    with open("/proc/self/io") as f:
        return int(re.search(r"^syscr:\s*(\d+)", f.read(), re.M).group(1))


def test_probe_reads_each_shared_fact_once(big_trees):
    """Issue 12: one sibling list and one core_id per core, one package list per package;
    so twice the CPUs take twice the reads, and a 1,024-CPU SMT2 tree about 1,050."""
    try:
        _read_syscalls()
    except (OSError, AttributeError):
        pytest.skip("no /proc/self/io (kernel without task I/O accounting)")
    base = _read_syscalls() - _read_syscalls()  # what reading /proc/self/io itself costs
    counts = {}
    for name in ("1k", "2k"):
        before = _read_syscalls()
        probe.probe(big_trees[name])
        counts[name] = _read_syscalls() - before + base
    assert 1024 <= counts["1k"] <= 1100, counts  # 512 cores x (list + core_id) + fixed files
    # 512 more cores (2 reads each), 8 more nodes (cpulist and meminfo)
    assert counts["2k"] - counts["1k"] == 512 * 2 + 8 * 2, counts


def _cpu_seconds(fn):
    """(this process's CPU seconds for ``fn()``, its result), the cyclic collector paused: in
    a long pytest session a full collection walks every test's objects, which made a 0.1 s
    probe of 20,000 CPUs take 1.02 s in CI."""
    gc.collect()
    gc.disable()
    try:
        start = time.process_time()
        result = fn()
        return time.process_time() - start, result
    finally:
        gc.enable()


def test_twenty_thousand_online_cpus_are_linear(tmp_path):
    """Growth, not speed (benchmarks time speed): 8x the CPUs costs under 24x the CPU time
    (about 5x here; the quadratic probe this guards against was 64x: 15 s at 20,000)."""
    small = make_root(tmp_path / "small", {"sys/devices/system/cpu/online": "0-2499\n"})
    root = make_root(tmp_path / "big", {"sys/devices/system/cpu/online": "0-19999\n"})
    small_seconds, _ = _cpu_seconds(lambda: probe.probe(small))
    seconds, topo = _cpu_seconds(lambda: probe.probe(root))
    assert seconds < 24 * max(small_seconds, 0.01), (small_seconds, seconds)
    assert len(topo.online) == 20000 and len(topo.cores) == 20000
    assert topo.cores[-1].cpus == (19999,) and list(topo.nodes) == [0]
    lookups, right = _cpu_seconds(lambda: all(topo.core_of(c).id == c and topo.node_of(c) == 0 for c in range(20000)))
    assert right
    assert lookups < 0.5  # O(1) lookups (about 0.01 s): a scan each would take minutes


def test_overlapping_sibling_sets_merge_in_linear_time():
    """Every CPU naming every CPU (a corrupt dump, whose list the probe parsed once) is one
    core, built in linear time."""
    n = 8192
    every = frozenset(range(n))
    raw = _raw({c: dict(package_id=0, siblings=every) for c in range(n)}, {0: set(range(n))})
    seconds, topo = _cpu_seconds(lambda: build(raw))
    assert seconds < 2.0, seconds
    assert len(topo.cores) == 1 and topo.cores[0].cpus == tuple(range(n))
    # a chain 0-1, 1-2, 2-3, ... merges into one core too (union-find, not pairwise scans)
    chain = _raw({c: dict(package_id=0, siblings=frozenset({c, c + 1} if c + 1 < n else {c}))
                  for c in range(n)}, {0: set(range(n))})
    seconds, topo = _cpu_seconds(lambda: build(chain))
    assert seconds < 2.0, seconds
    assert [len(c.cpus) for c in topo.cores] == [n]
