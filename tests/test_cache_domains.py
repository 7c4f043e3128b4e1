"""Issue 22: cache domains in the topology and placement that follows them.

- reading: which CPUs share each L3 and each L2 or cluster, on generated trees (Genoa NPS1
  and NPS4, 2x Xeon 6 E-core, Grace; tests/bigtree.py) and on the hwloc dumps; once per
  domain, only when asked; malformed files are notes;
- placement: exact cpulists on the generated trees for every mode, the rule's invariants
  on random machines (hypothesis), issue 23's 7 + 5 ruling through the real command;
- the JSON and the drawing.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bigtree
from conftest import plan_json, run_cli
from cpulaunch import cpulist
from cpulaunch.machine import probe
from cpulaunch.machine.topology import CacheFacts, CpuFacts, HostFacts, NodeFacts, build
from cpulaunch.plan import PlanError, Request, plan
from test_topology import _read_syscalls

CPU = "sys/devices/system/cpu"


@pytest.fixture(scope="module")
def trees():
    """{name: root} of the generated machines of bigtree.CACHE_TREES, plus "plain" (the
    Genoa NPS1 layout without cache folders) and "seven-five" (one socket, two 7-core
    nodes, no caches); removed afterwards."""
    base = Path(bigtree.scratch_dir("cpulaunch-cache-"))
    roots = {name: bigtree.make_cache_tree(base / name, name) for name in bigtree.CACHE_TREES}
    roots["plain"] = bigtree.make_tree(base / "plain", sockets=1, nodes_per_socket=1, cores_per_node=96,
                                       threads_per_core=2)
    roots["seven-five"] = bigtree.make_tree(base / "seven-five", sockets=1, nodes_per_socket=2,
                                            cores_per_node=7, threads_per_core=1)
    yield roots
    shutil.rmtree(base, ignore_errors=True)


def lists(p) -> list:
    return [i.cpulist for i in p.instances]


def domains(level) -> list:
    return [(cpulist.format(d.cpus), d.size_kb) for d in level]


# --------------------------------------------------------------------------- reading


def test_generated_trees_cache_domains(trees):
    genoa = probe.probe(trees["genoa-nps1"], caches=True)
    assert domains(genoa.caches.l3) == [(f"{8 * k}-{8 * k + 7},{96 + 8 * k}-{96 + 8 * k + 7}", 32768)
                                        for k in range(12)]
    assert len(genoa.caches.l2) == 96 and {d.kind for d in genoa.caches.l2} == {"cluster"}
    assert genoa.caches.l2[5].cpus == {5, 101} and genoa.notes == ()
    xeon = probe.probe(trees["xeon6-e"], caches=True)
    assert domains(xeon.caches.l3) == [("0-143", 110592), ("144-287", 110592)]
    assert [cpulist.format(d.cpus) for d in xeon.caches.l2[:2]] == ["0-3", "4-7"] and len(xeon.caches.l2) == 72
    grace = probe.probe(trees["grace"], caches=True)
    assert domains(grace.caches.l3) == [("0-71", 116736)]
    assert [cpulist.format(d.cpus) for d in grace.caches.l2] == [f"{4 * k}-{4 * k + 3}" for k in range(18)]
    assert probe.probe(trees["genoa-nps1"]).caches is None  # not asked: not read
    assert probe.probe(trees["plain"], caches=True).caches.l3 == ()  # read: none there


def test_hwloc_dumps_cache_domains(sysroots):
    kunpeng = probe.probe(sysroots["hw-128arm-2pa2n8cluster4co"], caches=True)
    assert domains(kunpeng.caches.l3) == [(f"{32 * k}-{32 * k + 31}", 32768) for k in range(4)]
    assert kunpeng.caches.l2[1].kind == "cluster" and kunpeng.caches.l2[1].cpus == {4, 5, 6, 7}  # NULs read
    power9 = probe.probe(sysroots["hw-nvidiagpunumanodes"], caches=True)  # shared_cpu_map only
    assert domains(power9.caches.l3) == [("0-7", 10240), ("8-15", 10240), ("88-95", 10240), ("96-103", 10240)]
    assert [d.kind for d in power9.caches.l2] == ["L2"] * 4
    gold = probe.probe(sysroots["hw-memorysidecaches"], caches=True)  # one L3 over two SNC nodes
    assert [cpulist.format(d.cpus) for d in gold.caches.l3] == [cpulist.format(range(0, 80, 2)),
                                                                cpulist.format(range(1, 80, 2))]
    hybrid = probe.probe(sysroots["hw-20em64t-hybrid-1p6c2t+2ca4co1t"], caches=True)
    assert [cpulist.format(d.cpus) for d in hybrid.caches.l2][-2:] == ["12-15", "16-19"]


def test_cache_reads_once_per_domain_and_never_unasked(trees):
    """Per L3 domain its level, list and size (the first CPU's folder scanned once: four
    levels and one type); one cluster_cpus_list per cluster; nothing without caches=True.
    The launch path (--instances-per-socket, one per socket) reads no more than before."""
    try:
        _read_syscalls()
    except (OSError, AttributeError):
        pytest.skip("no /proc/self/io (kernel without task I/O accounting)")

    def reads(root, caches):
        before = _read_syscalls()
        probe.probe(root, caches=caches)
        return _read_syscalls() - before

    base = reads(trees["plain"], False)
    assert reads(trees["genoa-nps1"], False) == base
    # 4 levels + 1 type, list + size of the first L3, 3 for each of the 11 others; 96 clusters
    assert reads(trees["genoa-nps1"], True) - base == 4 + 1 + 2 + 3 * 11 + 96
    plain_xeon = bigtree.make_tree(Path(trees["plain"]).parent / "plain-xeon", sockets=2, nodes_per_socket=1,
                                   cores_per_node=144, threads_per_core=1)
    assert reads(trees["xeon6-e"], True) - reads(plain_xeon, False) == 4 + 1 + 2 + 3 + 72


def _tree_with(trees, name, tmp_path, files: dict) -> Path:
    """A copy of a generated tree (hard links would share files) with ``files`` replaced."""
    root = tmp_path / name
    shutil.copytree(trees[name], root, symlinks=True)
    for rel, data in files.items():
        if data is None:
            shutil.rmtree(root / rel)
        elif data == "fifo":
            os.unlink(root / rel)
            os.mkfifo(root / rel)
        else:
            bigtree.replace_file(root / rel, data)
    return root


@pytest.mark.parametrize("files, note", [
    ({f"{CPU}/cpu8/cache/index3/shared_cpu_list": "8-15,,104\n"},
     f"/{CPU}/cpu8/cache/index3/shared_cpu_list: bad item"),
    ({f"{CPU}/cpu8/cache/index3/shared_cpu_list": "fifo"},
     f"/{CPU}/cpu8/cache/index3/shared_cpu_list: not a regular file (a FIFO): ignored"),
    ({f"{CPU}/cpu8/cache/index3/shared_cpu_list": "4-15,100-111\n"},
     "do not form a domain with the lists read before: L3 domains not used"),
    ({f"{CPU}/cpu16/cache": None}, f"{CPU.join('/' * 2)}cpu16: no L3 list, unlike CPU 0"),
])
def test_malformed_cache_files_are_notes(trees, tmp_path, files, note):
    """Caches refine placement: a malformed, unusable, inconsistent or missing list drops
    the level with a note (never an error), and the plan is cut as without caches."""
    root = _tree_with(trees, "genoa-nps1", tmp_path, files)
    topo = probe.probe(root, caches=True)
    assert topo.caches.l3 == () and any(note.lstrip("/") in n for n in topo.notes), topo.notes
    assert len(topo.caches.l2) == 96  # the clusters are read all the same
    assert lists(plan(topo, Request(instances_per_socket=5))) == ["0-19", "20-38", "39-57", "58-76", "77-95"]


def test_malformed_size_and_cluster_lists(trees, tmp_path):
    root = _tree_with(trees, "genoa-nps1", tmp_path, {
        f"{CPU}/cpu0/cache/index3/size": "lots\n",
        f"{CPU}/cpu3/topology/cluster_cpus_list": "x\n",
    })
    topo = probe.probe(root, caches=True)
    assert topo.caches.l3[0].size_kb is None and topo.caches.l3[1].size_kb == 32768
    assert f"/{CPU}/cpu0/cache/index3/size: not a size ('lots'): ignored" in topo.notes
    # the clusters dropped, the L2 lists of the cache folders stand in for them
    assert {d.kind for d in topo.caches.l2} == {"L2"} and len(topo.caches.l2) == 96


# --------------------------------------------------------------------------- placement

EXACT = {
    # 12 CCDs of 8: 4 instances -> 3 CCDs each; 5 -> 3,3,2,2,2 CCDs (no CCD shared)
    ("genoa-nps1", "instances_per_socket=4"): ["0-23", "24-47", "48-71", "72-95"],
    ("genoa-nps1", "instances_per_socket=5"): ["0-23", "24-47", "48-63", "64-79", "80-95"],
    ("genoa-nps1", "ninstances=5"): ["0-23", "24-47", "48-63", "64-79", "80-95"],
    ("genoa-nps1", "ninstances=5,equal_sizes=True"): ["0-19", "20-38", "39-57", "58-76", "77-95"],
    ("genoa-nps1", "instances_per_l3=1"): [f"{8 * k}-{8 * k + 7}" for k in range(12)],
    ("genoa-nps1", "instances_per_l3=2"): [f"{4 * k}-{4 * k + 3}" for k in range(24)],
    # fixed sizes: each in a CCD of its own while there are CCDs left
    ("genoa-nps1", "ninstances=4,ncores_per_instance=6"): ["0-5", "8-13", "16-21", "24-29"],
    ("genoa-nps1", "ncores_per_instance=(10, 10, 4)"): ["0-9", "16-25", "32-35"],
    ("genoa-nps1", "latency_mode=True"): [f"{4 * k}-{4 * k + 3}" for k in range(24)],
    # 13 > 12 CCDs: balanced, the 8-core instances on whole CCDs
    ("genoa-nps1", "ninstances=13"): ["0-7", "8-15", "16-23", "24-31", "32-39", "40-46", "47-53",
                                      "54-60", "61-67", "68-74", "75-81", "82-88", "89-95"],
    # NPS4: nodes of 3 CCDs
    ("genoa-nps4", "instances_per_node=2"): ["0-15", "16-23", "24-39", "40-47", "48-63", "64-71", "72-87", "88-95"],
    ("genoa-nps4", "ninstances=4"): ["0-23", "24-47", "48-71", "72-95"],
    ("genoa-nps4", "instances_per_socket=3"): ["0-31", "32-63", "64-95"],
    ("genoa-nps4", "instances_per_node=2,equal_sizes=True"): ["0-11", "12-23", "24-35", "36-47", "48-59",
                                                              "60-71", "72-83", "84-95"],
    # Xeon 6 E-cores: 36 modules of 4 per socket
    ("xeon6-e", "instances_per_socket=5"): ["0-31", "32-59", "60-87", "88-115", "116-143",
                                            "144-175", "176-203", "204-231", "232-259", "260-287"],
    ("xeon6-e", "instances_per_socket=5,equal_sizes=True"): ["0-28", "29-57", "58-86", "87-115", "116-143",
                                                             "144-172", "173-201", "202-230", "231-259", "260-287"],
    # one per node first (as before), each on two whole modules
    ("xeon6-e", "ncores_per_instance=6,ninstances=2"): ["0-5", "144-149"],
    ("xeon6-e", "ncores_per_instance=6,ninstances=4"): ["0-5", "8-13", "144-149", "152-157"],
    # Grace: 18 clusters of 4
    ("grace", "ninstances=4"): ["0-19", "20-39", "40-55", "56-71"],
    ("grace", "ninstances=4,equal_sizes=True"): ["0-17", "18-35", "36-53", "54-71"],
    ("grace", "ncores_per_instance=(5, 5)"): ["0-4", "8-12"],
}


def _request(text: str) -> Request:
    return eval(f"Request({text})", {"Request": Request})  # noqa: S307 - the table above


@pytest.mark.parametrize("machine, request_text", sorted(EXACT))
def test_exact_plans_on_cache_trees(machine, request_text, trees):
    p = plan(probe.probe(trees[machine], caches=True), _request(request_text))
    assert lists(p) == EXACT[(machine, request_text)]


def test_notes_say_why_sizes_differ_and_when_an_l3_is_shared(trees):
    genoa = probe.probe(trees["genoa-nps1"], caches=True)
    assert plan(genoa, Request(instances_per_socket=5)).notes == (
        "instance sizes (2 x 24, 3 x 16 cores) follow the L3 domains, so that no two instances "
        "share an L3; --equal-sizes makes them differ by one core at most",)
    assert plan(genoa, Request(ninstances=13)).notes == (
        "13 instances on 12 L3 domains: instances 5-12 share an L3 with another instance",)
    assert plan(genoa, Request(ninstances=5, equal_sizes=True)).notes == (
        "5 instances on 12 L3 domains: instances 0-4 share an L3 with another instance",)
    # an Intel socket is one L3: instances that share a socket share it, which needs no note
    assert plan(probe.probe(trees["xeon6-e"], caches=True), Request(instances_per_socket=4)).notes == ()
    assert plan(probe.probe(trees["grace"], caches=True), Request(ninstances=4)).notes == (
        "instance sizes (2 x 20, 2 x 16 cores) follow the clusters, so that no two instances "
        "share a cluster; --equal-sizes makes them differ by one core at most",)


def test_without_caches_the_plans_are_the_balanced_ones(trees):
    """The same machine without cache folders (or not read): cut as before issue 22."""
    for root, caches in ((trees["plain"], True), (trees["genoa-nps1"], False)):
        p = plan(probe.probe(root, caches=caches), Request(instances_per_socket=5))
        assert lists(p) == ["0-19", "20-38", "39-57", "58-76", "77-95"] and p.notes == ()
    with pytest.raises(PlanError, match=r"^--instances-per-l3 1: no L3 cache domains are known"):
        plan(probe.probe(trees["plain"], caches=True), Request(instances_per_l3=1))


def test_issue_23_seven_and_five_follow_the_nodes(trees):
    """Issue 23, item 6: --instances-per-socket 2 on a socket whose nodes have 7 and 5
    usable cores gave 6 + 5 and an idle core; now 7 + 5, one per node; --equal-sizes
    keeps the balanced 6 + 5."""
    p = plan_json(trees["seven-five"], "--instances-per-socket", "2", "--core-list", "0-11")
    assert [i["cpulist"] for i in p["instances"]] == ["0-6", "7-11"]
    assert [i["mem_nodes"] for i in p["instances"]] == [[0], [1]]
    assert p["notes"][0] == ("instance sizes (1 x 7, 1 x 5 cores) follow the NUMA nodes, so that no core is "
                             "left idle; --equal-sizes makes them differ by one core at most")
    p = plan_json(trees["seven-five"], "--instances-per-socket", "2", "--core-list", "0-11", "--equal-sizes")
    assert [i["cpulist"] for i in p["instances"]] == ["0-5", "7-11"]
    assert p["notes"][0] == "1 usable core(s) left idle (CPUs 6)" and "follow" not in str(p["notes"])
    # three instances: 4 + 3 on the 7-core node, 5 on the other (was 4, 3 and 4 with one idle)
    p = plan_json(trees["seven-five"], "--instances-per-socket", "3", "--core-list", "0-11")
    assert [i["cpulist"] for i in p["instances"]] == ["0-3", "4-6", "7-11"]


@pytest.mark.parametrize("machine, args, before, now", [
    # each node is one 32-core L3: the balanced 43+43+42 shared two of them
    ("hw-128arm-2pa2n8cluster4co", ["--ninstances", "3"], ["0-42", "43-85", "86-127"],
     ["0-63", "64-95", "96-127"]),
    # a Slurm job on CPUs 0-3 of node 0 and 4-5 of node 1 (each node one L3)
    ("hw-32amd64-4s2n4c-cgroup2", ["--instances-per-socket", "2"], ["0-2", "4-5"], ["0-3", "4-5"]),
    ("hw-32amd64-4s2n4c-cgroup2", ["--ninstances", "2"], ["0-2", "3-5"], ["0-3", "4-5"]),
    # POWER9: CPUs 0-7 (two SMT4 cores) share an L3; CPU 8 has its own
    ("hw-nvidiagpunumanodes", ["--ninstances", "2", "--ncores-per-instance", "1"], ["0", "4"], ["0", "8"]),
])
def test_the_hwloc_plans_the_rule_changes(sysroots, machine, args, before, now):
    """docs/guide/placement.md's table: the plans of the dumps that issue 22 changes (through the
    command, which reads the caches), and the plans before: the same machine without its
    caches, and --equal-sizes."""
    p = plan_json(sysroots[machine], *args)
    assert [i["cpulist"] for i in p["instances"]] == now
    counts = {a.lstrip("-").replace("-", "_"): int(v) for a, v in zip(args[::2], args[1::2])}
    assert lists(plan(probe.probe(sysroots[machine]), Request(**counts, equal_sizes=True))) == before


def test_ddp_ranks_follow_the_l3_domains(trees):
    p = plan_json(trees["genoa-nps1"], "--ddp", "--nproc-per-node", "5", "--master-port", "29500")
    assert [i["cpulist"] for i in p["instances"]] == ["0-23", "24-47", "48-63", "64-79", "80-95"]
    assert [i["env"]["RANK"] for i in p["instances"]] == ["0", "1", "2", "3", "4"]


@pytest.mark.parametrize("args, message", [
    (["--ncores-per-instance", "4,x"], "--ncores-per-instance 4,x: expected a number of cores (8) or "
                                       "one per instance, separated by commas (43,43,42)"),
    (["--ncores-per-instance", "4,0"], "--ncores-per-instance 4,0: each count must be 1 or more"),
    (["--ninstances", "2", "--ncores-per-instance", "4,4,4"],
     "--ninstances 2 and --ncores-per-instance 4,4,4 (3 sizes) disagree; give one size per instance, or one size"),
    (["--ncores-per-instance", "60,60"], "--ncores-per-instance 60,60 needs 120 physical cores, but only 96"),
    (["--instances-per-l3", "--ninstances", "2"], "--ninstances 2 and --instances-per-l3 cannot be combined; choose one"),
])
def test_option_errors_are_one_line(trees, args, message):
    proc = run_cli("--sysroot", str(trees["genoa-nps1"]), "--dry-run", *args, "true", check_rc=2)
    assert proc.stderr.startswith("cpulaunch: error: " + message) and proc.stderr.count("\n") == 1, proc.stderr


def test_one_count_still_works_from_every_source(trees, tmp_path):
    config = tmp_path / "best.toml"
    config.write_text("ncores-per-instance = 8\n")
    for args, env in ((["--ncores-per-instance", "8"], {}), ([], {"CPULAUNCH_NCORES_PER_INSTANCE": "8"}),
                      (["--config", str(config)], {})):
        proc = run_cli("--sysroot", str(trees["genoa-nps1"]), "--dry-run", "--format", "json", *args, "true", env=env)
        assert [i["cpulist"] for i in json.loads(proc.stdout)["instances"]] == [f"{8 * k}-{8 * k + 7}"
                                                                              for k in range(12)]


# --------------------------------------------------------------------------- the rule, on random machines


@st.composite
def cache_machines(draw):
    """Random machines (built from facts): sockets x nodes x cores, SMT 1-2, L3 domains
    of a random number of consecutive cores per node, some cores not allowed."""
    sockets, nodes, per_node = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(2, 12))
    smt, l3_size = draw(st.integers(1, 2)), draw(st.integers(2, 6))
    total = sockets * nodes * per_node
    cpus, node_cpus, l3 = {}, {}, {}
    for k in range(total):
        sib = frozenset(k + t * total for t in range(smt))
        node = k // per_node
        for c in sib:
            cpus[c] = CpuFacts(has_topology=True, package_id=node // nodes, siblings=sib)
        node_cpus.setdefault(node, set()).update(sib)
        l3.setdefault((node, (k % per_node) // l3_size), set()).update(sib)
    allowed = frozenset(c for c in cpus if draw(st.integers(0, 9)) or c == 0)
    facts = HostFacts(online=frozenset(cpus), cpus=cpus, allowed=allowed, allowed_source="test",
                      nodes={n: NodeFacts(cpus=frozenset(v)) for n, v in node_cpus.items()},
                      caches=CacheFacts(l3=tuple((frozenset(v), None) for v in l3.values())))
    return build(facts)


@settings(max_examples=150, deadline=None)
@given(topo=cache_machines(), data=st.data())
def test_no_l3_shared_while_the_count_allows(topo, data):
    """--ninstances N: every usable core is used; where N is at most the usable L3 domains
    (of two cores or more: the level counts), no L3 holds two instances."""
    usable_cores = [c for c in topo.cores if set(c.cpus) & topo.allowed]
    n = data.draw(st.integers(1, len(usable_cores)))
    p = plan(topo, Request(ninstances=n))
    used = sorted(c for i in p.instances for c in i.cores)
    assert used == sorted(c.id for c in usable_cores)
    by_l3: dict = {}
    for i in p.instances:
        for core in i.cores:
            by_l3.setdefault(topo.cache_of(core, "l3"), set()).add(i.index)
    counts = {}
    for core in usable_cores:
        counts[topo.cache_of(core.id, "l3")] = counts.get(topo.cache_of(core.id, "l3"), 0) + 1
    if len(counts) >= max(n, 2) and max(counts.values()) > 1:
        assert all(len(who) == 1 for who in by_l3.values()), (n, by_l3)


# --------------------------------------------------------------------------- JSON and drawing


def test_json_says_whether_caches_were_read(trees):
    one = plan_json(trees["genoa-nps1"], "--instances-per-socket")  # one per socket: not read
    assert one["topology"]["caches"] is None
    two = plan_json(trees["genoa-nps1"], "--ninstances", "2")
    assert two["topology"]["caches"]["l3"][:2] == [{"cpus": "0-7,96-103", "size_kb": 32768},
                                                   {"cpus": "8-15,104-111", "size_kb": 32768}]
    assert two["topology"]["caches"]["l2"] == []  # private L2s: only shared ones are listed
    shown = json.loads(run_cli("--sysroot", str(trees["xeon6-e"]), "--show-topology", "--format", "json").stdout)
    assert shown["caches"]["l2"][0] == {"kind": "cluster", "cpus": "0-3", "size_kb": None}
    assert len(shown["caches"]["l2"]) == 72


def test_show_topology_draws_l3_domains_and_modules(trees):
    def drawing(name):  # the lines from the first socket on (the header above it: other tests)
        lines = run_cli("--sysroot", str(trees[name]), "--show-topology").stdout.splitlines()
        return lines[next(i for i, line in enumerate(lines) if line.startswith("socket 0 ")):]

    lines = drawing("genoa-nps1")
    assert lines[1:5] == ["  node 0 (64.0 GiB)", "    L3 32 MiB: CPUs 0-7,96-103", "      core 0: 0 96",
                          "      core 1: 1 97"]
    assert sum(line.startswith("    L3 32 MiB: CPUs ") for line in lines) == 12
    lines = drawing("xeon6-e")
    assert lines[2:5] == ["    L3 108 MiB: CPUs 0-143", "      cluster: CPUs 0-3", "        core 0: 0"]
