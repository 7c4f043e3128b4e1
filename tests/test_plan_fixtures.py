"""Placement on real machines (the fixture dumps) and on random synthetic ones.

- every fixture machine x every mode through the pure planner: the plan's invariants,
  checked here independently of ``plan.validate``;
- exact cpulists, memory nodes, argv and env per machine for the main modes, a
  representative part through the real command (``cpulaunch --sysroot ... --dry-run``);
- impossible requests: exit code 2, one line on stderr, no traceback;
- hypothesis: random machines (sockets, sparse nodes, SMT, memory-only nodes, E-cores,
  package ids -1, allowed subsets, quotas) and random requests: an accepted request
  always gives a plan with the invariants, and a request is refused (PlanError) exactly
  when it cannot be met.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import MACHINES, plan_json, run_cli
from cpulaunch import cpulist
from cpulaunch.machine import probe
from cpulaunch import plan as plan_module
from cpulaunch.errors import InternalError
from cpulaunch.machine.numactl import MemPolicy
from cpulaunch.plan import LATENCY_CORES, PlanError, Request, plan, validate
from cpulaunch.machine.topology import CpuFacts, HostFacts, NodeFacts, Topology, build

XEON = "hw-32intel64-2p8co2t+8ve"  # 2x Xeon Silver 4108, SMT siblings 0,16
GOLD = "hw-memorysidecaches"  # 2x Xeon Gold 6230, SNC2: 4 nodes, CPUs interleaved
HYBRID = "hw-20em64t-hybrid-1p6c2t+2ca4co1t"  # i7-1370P, E-cores 12-19
KUNPENG = "hw-128arm-2pa2n8cluster4co"  # package ids 36 and 8442, NUL-terminated files
POWER9 = "hw-nvidiagpunumanodes"  # cpuset 0-87 of online 0-15,88-103; GPU memory nodes
POWER7 = "hw-256ppc-8n8s4t"  # package -1, nodes 0,1,4,5,8,9,12,13
AMD = "hw-32amd64-4s2n4c-cgroup2"  # Slurm cgroup v2 job: CPUs 0-5 of 0-31
TIERS = "hw-fakeheteromemtiers"  # memory-only nodes 4,6,8,9


@pytest.fixture(scope="module")
def topos(sysroots) -> dict:
    return {m: probe.probe(root) for m, root in sysroots.items()}


# --------------------------------------------------------------------------- invariants


def usable_cpus(topo: Topology, req: Request) -> frozenset:
    u = topo.online & topo.allowed
    if req.core_list is not None:
        u &= req.core_list
    if req.node_list is not None:
        u &= frozenset().union(*(topo.nodes[n].cpus for n in req.node_list))
    return u


def selected_cores(topo: Topology, req: Request) -> list:
    """The cores a plan may use: any usable CPU; E-cores only if asked or if nothing else."""
    u = usable_cpus(topo, req)
    cores = [c for c in topo.cores if set(c.cpus) & u]
    if not req.use_e_cores and any(not c.efficiency for c in cores):
        cores = [c for c in cores if not c.efficiency]
    return cores


def _per_node(cores: list) -> dict:
    out: dict = {}
    for c in cores:
        out[c.node] = out.get(c.node, 0) + 1
    return out


def fixed_size(req: Request, ncores: int):
    if req.latency_mode:
        return LATENCY_CORES if ncores >= LATENCY_CORES else ncores
    return req.ncores_per_instance


ROLES = ("cpus", "ccl_cpus", "dataloader_cpus", "reserved_cpus")


def ordered_cores(topo: Topology, cores: list) -> list:
    """Cores in the planner's documented order: (socket, node id rank, core id)."""
    rank = {n: i for i, n in enumerate(sorted(topo.nodes))}
    return sorted(cores, key=lambda c: (c.socket, rank.get(c.node, len(rank)), c.id))


def check_plan(topo: Topology, req: Request, p) -> None:
    """Every promise of the planner, derived from the request and the machine only."""
    if req.instance_idx is not None:
        full = plan(topo, req._replace(instance_idx=None))
        assert p.num_instances == full.num_instances
        assert p.instances == tuple(full.instances[i] for i in sorted(set(req.instance_idx)))
        p = full
    u = usable_cpus(topo, req)
    by_id = {c.id: c for c in selected_cores(topo, req)}
    insts = p.instances
    assert insts and p.num_instances == len(insts)
    assert [i.index for i in insts] == list(range(len(insts)))
    owner: dict = {}
    for inst in insts:
        check_instance(topo, req, p, inst, u, by_id, owner)
    check_sizes(topo, req, p)
    check_threads(topo, p)
    validate(p, topo)


def check_instance(topo, req, p, inst, u, by_id, owner) -> None:
    """Whole cores of selectable cores, disjoint roles, nodes, socket and memory."""
    assert inst.cpus, "no compute CPU"
    bound: set = set()
    for role in ROLES:
        cpus = getattr(inst, role)
        assert list(cpus) == sorted(set(cpus)) and not bound & set(cpus), role
        bound |= set(cpus)
        for cid in {topo.core_of(c).id for c in cpus}:
            assert cid in by_id, "a core that is not selectable (E-core or unusable)"
            assert owner.setdefault(cid, (inst.index, role)) == (inst.index, role), "a core split"
            core_usable = [c for c in by_id[cid].cpus if c in u]
            # whole cores: every usable sibling with --use-logical-cores, else the lowest
            mine = sorted(set(cpus) & set(by_id[cid].cpus))
            assert mine == (core_usable if req.use_logical_cores else core_usable[:1])
    assert inst.bound_cpus == tuple(sorted(bound)) and bound <= u
    assert {topo.core_of(c).id for c in inst.cpus} == set(inst.cores)
    cores = [by_id[cid] for cid in {topo.core_of(c).id for c in bound}]
    nodes = sorted({c.node for c in cores if c.node is not None})
    assert list(inst.nodes) == nodes
    sockets = {c.socket for c in cores}
    assert inst.socket == (next(iter(sockets)) if len(sockets) == 1 else None)
    check_memory(topo, req, p, inst, nodes)


def check_memory(topo, req, p, inst, nodes) -> None:
    """The instance's nodes that have memory and that the cgroup allows, as the policy
    wants them; none: no binding, with a note."""
    allowed = getattr(topo, "allowed_mems", None)
    usable = [n for n in nodes if topo.nodes[n].has_memory and (allowed is None or n in allowed)]
    policy = MemPolicy(req.mem_policy)
    if policy in (MemPolicy.LOCAL, MemPolicy.NONE):
        assert (inst.mem_policy, inst.mem_nodes) == (policy, ())
    elif not usable:
        assert (inst.mem_policy, inst.mem_nodes) == (MemPolicy.NONE, ())
        assert any(n.startswith(f"instance {inst.index}: ") and n.endswith("memory is not bound "
                   "(kernel default placement)") for n in p.notes), p.notes
    elif policy is MemPolicy.PREFERRED:
        assert inst.mem_policy is policy and list(inst.mem_nodes) == usable[:1]
    else:
        assert inst.mem_policy is policy and list(inst.mem_nodes) == usable


def check_threads(topo: Topology, p) -> None:
    """One thread per compute CPU, or an even share of the CPU quota (issue 8)."""
    quota = topo.quota_cpus
    for inst in p.instances:
        share = len(inst.cpus) if quota is None else math.floor(quota / p.num_instances)
        assert inst.threads == max(1, min(len(inst.cpus), share))
    lowered = any(i.threads < len(i.cpus) for i in p.instances)
    assert any(n.startswith("a CPU quota of ") for n in p.notes) == lowered
    if lowered:
        assert f"a CPU quota of {quota:g} CPUs applies (cgroup cpu.max): OpenMP threads lowered to fit it" in p.notes


def check_sizes(topo: Topology, req: Request, p) -> None:
    """Counts, balance, idle cores, spanning instances per mode."""
    selected = selected_cores(topo, req)
    by_id = {c.id: c for c in selected}
    node_size = _per_node(selected)
    insts = p.instances
    groups = [sorted({topo.core_of(c).id for c in i.bound_cpus}) for i in insts]
    sizes = [len(g) for g in groups]
    per_domain = req.instances_per_socket or req.instances_per_node or req.throughput_mode
    fixed = fixed_size(req, len(selected))
    if per_domain:
        check_per_domain(req, insts, groups, selected, by_id)
    elif fixed:
        assert set(sizes) == {fixed}
        if req.ninstances:
            assert len(insts) == req.ninstances
        elif any(s >= fixed for s in node_size.values()):
            # as many as fit inside nodes, none straddles
            assert len(insts) == sum(s // fixed for s in node_size.values())
            assert all(len({by_id[c].node for c in g}) == 1 for g in groups)
        else:
            assert len(insts) == max(1, len(selected) // fixed)
    else:
        assert len(insts) == (req.ninstances or 1)
        assert max(sizes) - min(sizes) <= 1, sizes
        assert sum(sizes) == len(selected), "--ninstances leaves no usable core idle"
        check_fewest_spanning(topo, selected, groups)
    idle = len(selected) - sum(sizes)
    assert any(n.startswith(f"{idle} usable core(s) left idle") for n in p.notes) == bool(idle)
    # the note names exactly the instances that span nodes although one of them holds it
    spanning = [
        i for i, g in enumerate(groups)
        if len({by_id[c].node for c in g}) > 1 and len(g) <= max(node_size[by_id[c].node] for c in g)
    ]
    notes = [n for n in p.notes if "span NUMA nodes" in n or "spans NUMA nodes" in n]
    if spanning:
        who = f"instance {spanning[0]} spans" if len(spanning) == 1 else f"instances {cpulist.format(spanning)} span"
        assert len(notes) == 1 and notes[0].startswith(f"{who} NUMA nodes: "), (spanning, p.notes)
    else:
        assert notes == []


def check_per_domain(req, insts, groups, selected, by_id) -> None:
    if req.instances_per_socket:
        domains = {c.socket for c in selected}
        key = lambda g: by_id[g[0]].socket  # noqa: E731
        assert len(insts) == req.instances_per_socket * len(domains)
        assert all(i.socket is not None for i in insts)
    else:
        domains = {c.node for c in selected}
        key = lambda g: by_id[g[0]].node  # noqa: E731
        assert len(insts) == (req.instances_per_node or 1) * len(domains)
        assert all(len({by_id[c].node for c in g}) == 1 for g in groups), "straddles"
    for d in domains:
        dgroups = [g for g in groups if key(g) == d]
        ds = [len(g) for g in dgroups]
        if req.equal_sizes:  # balanced inside each domain (the rule before issue 22)
            assert max(ds) - min(ds) <= 1, (d, ds)
            continue
        check_follows_nodes(d, dgroups, [c for c in selected if key([c.id]) == d], by_id)


def check_follows_nodes(d, dgroups, dcores, by_id) -> None:
    """Issue 22/23: a per-socket or per-node domain uses every core; with at least as many
    instances as nodes, each instance stays in one node, sizes differ by one core at most
    inside a node, and the largest instance is as small as whole instances per node allow
    (7 + 5 cores, two instances: 7 and 5); with fewer, balanced runs."""
    ds = [len(g) for g in dgroups]
    assert sum(ds) == len(dcores), ("idle cores", d, ds)
    per_node = _per_node(dcores)
    if len(dgroups) < len(per_node):
        assert max(ds) - min(ds) <= 1, (d, ds)
        return
    assert all(len({by_id[c].node for c in g}) == 1 for g in dgroups), "straddles"
    for n in per_node:
        sizes = [len(g) for g in dgroups if by_id[g[0]].node == n]
        assert sizes and max(sizes) - min(sizes) <= 1, (d, n, sizes)
    best = next(s for s in range(1, max(per_node.values()) + 1)
                if sum(-(-c // s) for c in per_node.values()) <= len(dgroups))
    assert max(ds) == best, (d, ds, best)


def spanning_cost(cores: list, sizes: list) -> tuple:
    """(instances spanning sockets, instances spanning NUMA nodes) when ``sizes`` are cut
    in order from the ordered ``cores``."""
    pos, sockets, nodes = 0, 0, 0
    for s in sizes:
        run = cores[pos : pos + s]
        sockets += len({c.socket for c in run}) > 1
        nodes += len({(c.socket, c.node) for c in run}) > 1
        pos += s
    return sockets, nodes


def check_fewest_spanning(topo: Topology, selected: list, groups: list) -> None:
    """--ninstances: runs of the ordered cores, with the fewest instances spanning
    sockets, then nodes, over every order of the balanced sizes (brute force)."""
    ordered = ordered_cores(topo, selected)
    pos = 0
    for g in groups:
        assert g == sorted(c.id for c in ordered[pos : pos + len(g)]), "not a run"
        pos += len(g)
    n, (q, r) = len(groups), divmod(len(selected), len(groups))
    if math.comb(n, r) > 3000:
        return
    best = min(
        spanning_cost(ordered, [q + 1 if k in big else q for k in range(n)])
        for big in map(set, itertools.combinations(range(n), r))
    )
    assert spanning_cost(ordered, [len(g) for g in groups]) == best


def must_fail(topo: Topology, req: Request) -> bool:
    """Whether ``req`` cannot be met on ``topo`` (independent of the planner's code)."""
    if req.core_list is not None and not req.core_list <= topo.allowed & topo.online:
        return True
    if req.node_list is not None:
        if not req.node_list <= set(topo.nodes):
            return True
        if any(not topo.nodes[n].cpus for n in req.node_list):
            return True
        if not frozenset().union(*(topo.nodes[n].cpus for n in req.node_list)) & topo.allowed:
            return True
    cores = selected_cores(topo, req)
    if not cores:
        return True
    total = len(cores)
    if req.instances_per_socket:
        counts = {}
        for c in cores:
            counts[c.socket] = counts.get(c.socket, 0) + 1
        if min(counts.values()) < req.instances_per_socket:
            return True
    elif req.instances_per_node:
        if min(_per_node(cores).values()) < req.instances_per_node:
            return True
    elif req.ncores_per_instance:
        if (req.ninstances or 1) * req.ncores_per_instance > total:
            return True
    elif req.ninstances and req.ninstances > total:
        return True
    if req.instance_idx is not None:
        n = _planned_count(topo, req, cores)
        if any(i >= n for i in req.instance_idx):
            return True
    return False


def _planned_count(topo, req, cores) -> int:
    if req.instances_per_socket:
        return req.instances_per_socket * len({c.socket for c in cores})
    if req.instances_per_node or req.throughput_mode:
        return (req.instances_per_node or 1) * len({c.node for c in cores})
    return len(plan(topo, req._replace(instance_idx=None)).instances)


# --------------------------------------------------------------------------- the matrix

MODES = {
    "default": Request(),
    "per-socket": Request(instances_per_socket=1),
    "per-socket-2": Request(instances_per_socket=2),
    "per-node": Request(instances_per_node=1),
    "ninstances-2": Request(ninstances=2),
    "ninstances-3": Request(ninstances=3),
    "ncores-2": Request(ncores_per_instance=2),
    "ncores-3": Request(ncores_per_instance=3),
    "ninstances-2-ncores-2": Request(ninstances=2, ncores_per_instance=2),
    "latency": Request(latency_mode=True),
    "throughput": Request(throughput_mode=True),
    "logical": Request(use_logical_cores=True),
    "logical-per-socket": Request(instances_per_socket=1, use_logical_cores=True),
    "logical-ninstances-3": Request(ninstances=3, use_logical_cores=True),
    "e-cores": Request(use_e_cores=True),
    "e-cores-latency": Request(use_e_cores=True, latency_mode=True),
    **{f"mem-{p.value}": Request(instances_per_socket=1, mem_policy=p) for p in MemPolicy},
    "mem-interleave-default": Request(mem_policy=MemPolicy.INTERLEAVE),
}


def per_machine_requests(topo: Topology) -> dict:
    """Lists that depend on the machine: its first socket's allowed CPUs, its first node
    with allowed CPUs, the last instance of a per-socket plan."""
    first_socket = topo.sockets[0].cpus & topo.allowed
    node = min(n.id for n in topo.nodes.values() if n.cpus & topo.allowed)
    nsockets = len({c.socket for c in topo.cores if set(c.cpus) & topo.allowed})
    return {
        "core-list": Request(core_list=first_socket),
        "core-list-logical-2": Request(core_list=first_socket, ninstances=2, use_logical_cores=True),
        "node-list": Request(node_list=frozenset({node})),
        "node-list-latency": Request(node_list=frozenset({node}), latency_mode=True),
        "instance-idx": Request(instances_per_socket=1, instance_idx=(nsockets - 1,)),
        "instance-idx-0-2": Request(ninstances=3, instance_idx=(0, 2)),
    }


@pytest.mark.parametrize("machine", MACHINES)
def test_every_mode_keeps_the_invariants(machine, topos):
    topo = topos[machine]
    requests = {**MODES, **per_machine_requests(topo)}
    for name, req in requests.items():
        if must_fail(topo, req):
            with pytest.raises(PlanError):
                plan(topo, req)
            continue
        check_plan(topo, req, plan(topo, req))


# --------------------------------------------------------------------------- exact plans


def lists(p) -> list:
    """[(cpulist, memory nodes)] of a plan's instances."""
    return [(i.cpulist, cpulist.format(i.mem_nodes)) for i in p.instances]


def every(start: int, step: int, count: int) -> str:
    return ",".join(str(start + step * k) for k in range(count))


GOLD_NODE = {n: every(n, 4, 10) for n in range(4)}  # node n: CPUs n, n+4, ..., n+36

EXACT = {
    (XEON, "default"): [("0-15", "0-1")],
    (XEON, "per-socket"): [("0-7", "0"), ("8-15", "1")],
    (XEON, "logical-per-socket"): [("0-7,16-23", "0"), ("8-15,24-31", "1")],
    (XEON, "per-socket-2"): [("0-3", "0"), ("4-7", "0"), ("8-11", "1"), ("12-15", "1")],
    (XEON, "per-node"): [("0-7", "0"), ("8-15", "1")],
    (XEON, "throughput"): [("0-7", "0"), ("8-15", "1")],
    (XEON, "ninstances-2"): [("0-7", "0"), ("8-15", "1")],
    # 6+5+5 cores cannot fill two 8-core nodes: one instance spans them, none is idle
    (XEON, "ninstances-3"): [("0-5", "0"), ("6-10", "0-1"), ("11-15", "1")],
    (XEON, "logical-ninstances-3"): [("0-5,16-21", "0"), ("6-10,22-26", "0-1"), ("11-15,27-31", "1")],
    (XEON, "latency"): [("0-3", "0"), ("4-7", "0"), ("8-11", "1"), ("12-15", "1")],
    (XEON, "ninstances-2-ncores-2"): [("0-1", "0"), ("8-9", "1")],  # spread over nodes
    (GOLD, "per-node"): [(GOLD_NODE[n], str(n)) for n in range(4)],
    (GOLD, "throughput"): [(GOLD_NODE[n], str(n)) for n in range(4)],
    (GOLD, "per-socket"): [(every(0, 2, 20), "0,2"), (every(1, 2, 20), "1,3")],
    # socket 0 holds nodes 0 and 2, socket 1 nodes 1 and 3
    (GOLD, "per-socket-2"): [(GOLD_NODE[n], str(n)) for n in (0, 2, 1, 3)],
    # 10-core nodes hold two 4-core instances each; the other 8 cores stay idle
    (GOLD, "latency"): [
        (every(n, 4, 4), str(n)) if k == 0 else (every(n + 16, 4, 4), str(n))
        for n in (0, 2, 1, 3)
        for k in (0, 1)
    ],
    # 14+13+13 cores, nodes of 10: every instance spans nodes; only the second spans sockets
    (GOLD, "ninstances-3"): [
        ("0,2,4,6,8,10,12,14,16,20,24,28,32,36", "0,2"),
        ("1,5,9,13,17-18,21-22,25-26,30,34,38", "1-2"),
        ("3,7,11,15,19,23,27,29,31,33,35,37,39", "1,3"),
    ],
    (GOLD, "mem-preferred"): [(every(0, 2, 20), "0"), (every(1, 2, 20), "1")],
    (HYBRID, "default"): [("0,2,4,6,8,10", "0")],
    (HYBRID, "e-cores"): [("0,2,4,6,8,10,12-19", "0")],
    (HYBRID, "logical"): [("0-11", "0")],
    (HYBRID, "ninstances-2"): [("0,2,4", "0"), ("6,8,10", "0")],
    (HYBRID, "e-cores-latency"): [("0,2,4,6", "0"), ("8,10,12-13", "0"), ("14-17", "0")],
    (KUNPENG, "per-socket"): [("0-63", "0-1"), ("64-127", "2-3")],
    (KUNPENG, "per-node"): [("0-31", "0"), ("32-63", "1"), ("64-95", "2"), ("96-127", "3")],
    (KUNPENG, "ninstances-3"): [("0-42", "0-1"), ("43-85", "1-2"), ("86-127", "2-3")],
    (POWER9, "default"): [("0,4,8,12", "0")],
    (POWER9, "logical"): [("0-15", "0")],
    (POWER9, "per-socket"): [("0,4,8,12", "0")],
    (POWER9, "ninstances-3"): [("0,4", "0"), ("8", "0"), ("12", "0")],
    (POWER7, "per-socket"): [(every(32 * k, 4, 8), str(n)) for k, n in enumerate((0, 1, 4, 5, 8, 9, 12, 13))],
    (POWER7, "logical-per-socket"): [
        (f"{32 * k}-{32 * k + 31}", str(n)) for k, n in enumerate((0, 1, 4, 5, 8, 9, 12, 13))
    ],
    (POWER7, "default"): [(every(0, 4, 64), "0-1,4-5,8-9,12-13")],
    (AMD, "default"): [("0-5", "0-1")],
    (AMD, "per-socket"): [("0-5", "0-1")],
    (AMD, "per-node"): [("0-3", "0"), ("4-5", "1")],
    (AMD, "ninstances-3"): [("0-1", "0"), ("2-3", "0"), ("4-5", "1")],
    # nodes of 4 and 2 allowed cores: 3+3, the second spans both nodes
    (AMD, "ninstances-2"): [("0-2", "0"), ("3-5", "0-1")],
    (AMD, "latency"): [("0-3", "0")],
    (TIERS, "per-node"): [("0-1", "0"), ("2-3", "1"), ("4-5", "2")],
    (TIERS, "mem-interleave-default"): [("0-5", "0-2")],  # never the memory-only nodes
    (TIERS, "ninstances-2"): [("0-2", "0-1"), ("3-5", "1-2")],  # 3 cores > a 2-core node
}


@pytest.mark.parametrize("machine, mode", sorted(EXACT))
def test_exact_plans(machine, mode, topos):
    topo = topos[machine]
    req = {**MODES, **per_machine_requests(topo)}[mode]
    p = plan(topo, req)
    assert lists(p) == EXACT[(machine, mode)]
    check_plan(topo, req, p)


def test_exact_notes(topos):
    assert plan(topos[XEON], MODES["default"]).notes == ()  # 16 cores > an 8-core node
    assert plan(topos[GOLD], MODES["per-socket"]).notes == ()
    assert plan(topos[XEON], MODES["ninstances-3"]).notes == (
        "instance 1 spans NUMA nodes: balanced instances cannot all fit inside nodes here, "
        "and spanning beats leaving cores idle (memory policy over the nodes of their CPUs)",
    )
    assert plan(topos[GOLD], MODES["ninstances-3"]).notes == ()  # 13-14 cores > a 10-core node
    assert plan(topos[GOLD], MODES["latency"]).notes == ("8 usable core(s) left idle (CPUs 32-39)",)
    assert plan(topos[HYBRID], MODES["default"]).notes == (
        "hybrid CPU: E-cores (CPUs 12-19) left out; pass --use-e-cores to use them",
    )
    assert plan(topos[GOLD], MODES["mem-preferred"]).notes == (
        "instance 0: --mem-policy preferred takes one node; preferring node 0 of 0,2",
        "instance 1: --mem-policy preferred takes one node; preferring node 1 of 1,3",
    )


def test_lists_and_index_selection(topos):
    p = plan(topos[POWER9], Request(core_list=frozenset(range(4, 8)), use_logical_cores=True))
    assert lists(p) == [("4-7", "0")]
    p = plan(topos[AMD], Request(node_list=frozenset({1})))
    assert lists(p) == [("4-5", "1")]
    p = plan(topos[TIERS], Request(node_list=frozenset({1})))
    assert lists(p) == [("2-3", "1")]
    p = plan(topos[POWER7], Request(instances_per_socket=1, use_logical_cores=True, instance_idx=(7,)))
    assert lists(p) == [("224-255", "13")] and p.num_instances == 8 and p.instances[0].index == 7
    p = plan(topos[XEON], Request(core_list=frozenset(range(4, 12)), ninstances=2))
    assert lists(p) == [("4-7", "0"), ("8-11", "1")]


def synthetic(sockets: int, nodes_per_socket: int, cores_per_node: int, smt: int = 1, **raw) -> Topology:
    """A machine as sysfs would describe it (built by topology.build): sockets x nodes x
    cores, node ids 0.., SMT siblings numbered as on Intel (core k: CPUs k, k + cores,
    ...); ``raw``: more HostFacts fields (allowed, quota_cpus, allowed_mems, ...)."""
    total = sockets * nodes_per_socket * cores_per_node
    cpus, nodes = {}, {}
    for k in range(total):
        node = k // cores_per_node
        sib = [k + t * total for t in range(smt)]
        for c in sib:
            cpus[c] = CpuFacts(has_topology=True, package_id=node // nodes_per_socket,
                               core_id=k % cores_per_node, siblings=frozenset(sib))
        nodes.setdefault(node, []).extend(sib)
    return build(HostFacts(
        online=frozenset(cpus),
        cpus=cpus,
        nodes={n: NodeFacts(cpus=frozenset(v)) for n, v in nodes.items()},
        has_memory=frozenset(nodes),
        allowed_source="test",
        **raw,
    ))


def test_ninstances_uses_every_core_on_the_issue_machines():
    """Issue 8: --ninstances 3 left 13 cores idle on a 2 x 28-core Xeon and 1 on a 2 x 4-core
    box; now every core is used and only the instance that must spans the two nodes."""
    xeon = synthetic(2, 1, 28, smt=2)
    p = plan(xeon, Request(ninstances=3))
    assert lists(p) == [("0-18", "0"), ("19-37", "0-1"), ("38-55", "1")]
    assert [i.threads for i in p.instances] == [19, 19, 18]
    assert [i.socket for i in p.instances] == [0, None, 1]
    assert p.notes == (
        "instance 1 spans NUMA nodes: balanced instances cannot all fit inside nodes here, "
        "and spanning beats leaving cores idle (memory policy over the nodes of their CPUs)",
    )
    p = plan(xeon, Request(ninstances=3, use_logical_cores=True))
    assert lists(p) == [("0-18,56-74", "0"), ("19-37,75-93", "0-1"), ("38-55,94-111", "1")]
    box = synthetic(2, 1, 4)
    assert lists(plan(box, Request(ninstances=3))) == [("0-2", "0"), ("3-5", "0-1"), ("6-7", "1")]
    # sizes that fill the nodes exactly never span: 3+3+2 | 3+3+2 on two 8-core nodes
    assert lists(plan(synthetic(2, 1, 8), Request(ninstances=6))) == [
        ("0-2", "0"), ("3-5", "0"), ("6-7", "0"), ("8-10", "1"), ("11-13", "1"), ("14-15", "1")
    ]


def test_ninstances_spans_inside_a_socket_before_across():
    """Fewest instances spanning sockets first, then nodes. 2 sockets x 2 nodes x 3 cores,
    4 instances of 3: each node one instance; 5 instances (3,3,2,2,2): the spanning one
    stays inside a socket (nodes 2-3, never 1-2)."""
    topo = synthetic(2, 2, 3)
    assert lists(plan(topo, Request(ninstances=4))) == [("0-2", "0"), ("3-5", "1"), ("6-8", "2"), ("9-11", "3")]
    p = plan(topo, Request(ninstances=5))
    assert lists(p) == [("0-2", "0"), ("3-5", "1"), ("6-7", "2"), ("8-9", "2-3"), ("10-11", "3")]
    assert [i.socket for i in p.instances] == [0, 0, 1, 1, 1]
    # 2 x 2 nodes of 4, sizes 3,3,3,3,2,2: 3+3+2 per socket; two instances must span
    # nodes, none spans sockets (3,3,3,3,2,2 in that order would span sockets once)
    p = plan(synthetic(2, 2, 4), Request(ninstances=6))
    assert lists(p) == [("0-2", "0"), ("3-5", "0-1"), ("6-7", "1"), ("8-10", "2"), ("11-13", "2-3"), ("14-15", "3")]
    assert [i.socket for i in p.instances] == [0, 0, 0, 1, 1, 1]


def test_fixed_sizes_still_leave_cores_idle():
    """Latency mode and --ncores-per-instance: the user fixed the size, so idle cores
    (with a note) rather than spanning."""
    box = synthetic(2, 1, 6)
    p = plan(box, Request(latency_mode=True))
    assert lists(p) == [("0-3", "0"), ("6-9", "1")]
    assert p.notes == ("4 usable core(s) left idle (CPUs 4-5,10-11)",)
    p = plan(box, Request(ncores_per_instance=5))
    assert lists(p) == [("0-4", "0"), ("6-10", "1")]
    assert p.notes == ("2 usable core(s) left idle (CPUs 5,11)",)


def test_quota_is_split_evenly_over_instances():
    """Issue 8: a 4-CPU quota over a 16-CPU and an 8-CPU instance gave 2 + 1 threads."""
    topo = synthetic(2, 1, 8, smt=2)._replace(quota_cpus=4.0)
    p = plan(topo, Request(instances_per_socket=1, use_logical_cores=True,
                           core_list=frozenset([*range(0, 12), *range(16, 28)])))
    assert [len(i.cpus) for i in p.instances] == [16, 8]
    assert [i.threads for i in p.instances] == [2, 2]
    assert p.notes == ("a CPU quota of 4 CPUs applies (cgroup cpu.max): OpenMP threads lowered to fit it",)
    # never fewer than 1, never more than the instance's CPUs; no note when nothing is lowered
    p = plan(topo._replace(quota_cpus=1.5), Request(ninstances=3))
    assert [i.threads for i in p.instances] == [1, 1, 1]
    p = plan(topo._replace(quota_cpus=7.9), Request(ninstances=2, core_list=frozenset({0, 1, 2, 8, 9, 10})))
    assert [(len(i.cpus), i.threads) for i in p.instances] == [(3, 3), (3, 3)]
    assert p.notes == ()
    p = plan(topo._replace(quota_cpus=7.9), Request(ninstances=2))
    assert [i.threads for i in p.instances] == [3, 3]


def test_core_list_smt_siblings_are_named(topos):
    """Issue 9: --core-list 0-3,16-19 on the Xeon (16-19 are siblings of 0-3) plans 0-3
    and says why 16-19 are left out."""
    req = Request(core_list=frozenset([0, 1, 2, 3, 16, 17, 18, 19]))
    p = plan(topos[XEON], req)
    assert lists(p) == [("0-3", "0")]
    assert p.notes == (
        "--core-list: CPUs 16-19 are SMT siblings of cores already used and were left out "
        "(one OpenMP thread per physical core); pass --use-logical-cores to use them",
    )
    p = plan(topos[XEON], req._replace(use_logical_cores=True))
    assert lists(p) == [("0-3,16-19", "0")] and p.notes == ()
    # a sibling alone (its core's first CPU not listed) is that core's CPU: no note
    p = plan(topos[XEON], Request(core_list=frozenset([0, 1, 18, 19])))
    assert lists(p) == [("0-1,18-19", "0")] and p.notes == ()


def test_memory_nodes_the_cgroup_allows(topos):
    """Memory goes to the instance's nodes that the cgroup's cpuset.mems allows; none of
    them allowed: no binding (MemPolicy NONE) and a note."""
    topo = topos[XEON]._replace(allowed_mems=frozenset({1}), allowed_mems_source="test mems")
    p = plan(topo, Request(instances_per_socket=1))
    assert [(i.mem_policy, i.mem_nodes) for i in p.instances] == [(MemPolicy.NONE, ()), (MemPolicy.BIND, (1,))]
    assert p.notes == (
        "instance 0: memory may only be placed on NUMA nodes 1 (from test mems), none of them its "
        "own (0); memory is not bound (kernel default placement)",
    )
    p = plan(topo, Request(mem_policy=MemPolicy.INTERLEAVE))
    assert [(i.mem_policy, i.mem_nodes) for i in p.instances] == [(MemPolicy.INTERLEAVE, (1,))]
    assert p.notes == ("instance 0: memory limited to NUMA nodes 1 of its 0-1: test mems does not allow the others",)
    p = plan(topo, Request(instances_per_socket=1, mem_policy=MemPolicy.LOCAL))
    assert [(i.mem_policy, i.mem_nodes) for i in p.instances] == [(MemPolicy.LOCAL, ())] * 2
    assert p.notes == ()
    # the fixture dumps' own cpuset.mems: POWER9 allows node 0 only (not the GPU nodes)
    assert topos[POWER9].allowed_mems == frozenset({0})
    assert lists(plan(topos[POWER9], Request())) == [("0,4,8,12", "0")]


def test_validate_failures_are_ours(topos):
    """A plan that breaks an invariant is a bug of ours: InternalError, not PlanError."""
    good = plan(topos[XEON], Request(instances_per_socket=1))
    a, b = good.instances
    bad_plans = {
        "CPU 7 in": good._replace(instances=(a, b._replace(cpus=(7, *b.cpus)))),
        "core of CPU 16 split": good._replace(instances=(a._replace(ccl_cpus=(16,)), b)),
        "memory node 5": good._replace(instances=(a._replace(mem_nodes=(5,)), b)),
        "has no compute CPU": good._replace(instances=(a._replace(cpus=()), b)),
        "threads": good._replace(instances=(a._replace(threads=9), b)),
        "not allowed": good._replace(instances=(a, b._replace(reserved_cpus=(200,)))),
    }
    for message, bad in bad_plans.items():
        with pytest.raises(InternalError) as info:
            validate(bad, topos[XEON])
        assert str(info.value).startswith("internal: ") and message in str(info.value)
        assert not isinstance(info.value, PlanError)
    with pytest.raises(InternalError, match="memory node 1 of instance 1 not allowed"):
        validate(good, topos[XEON]._replace(allowed_mems=frozenset({0})))


def test_greedy_fallback_uses_every_core(topos, monkeypatch):
    """Beyond _EXACT_STATES the order comes from the linear greedy: still every core,
    balanced runs, and never more spanning instances than node boundaries."""
    monkeypatch.setattr(plan_module, "_EXACT_STATES", 0)
    for machine, topo in topos.items():
        cores = selected_cores(topo, Request())
        for n in range(1, min(len(cores), 13) + 1):
            p = plan(topo, Request(ninstances=n))
            groups = [sorted(i.cores) for i in p.instances]
            sizes = [len(g) for g in groups]
            assert sum(sizes) == len(cores) and max(sizes) - min(sizes) <= 1, (machine, n)
            ordered = ordered_cores(topo, cores)
            pos = 0
            for g in groups:
                assert g == sorted(c.id for c in ordered[pos : pos + len(g)])
                pos += len(g)
            spanning = sum(len(i.nodes) > 1 for i in p.instances)
            assert spanning <= len({(c.socket, c.node) for c in cores}) - 1
    # the issue's machines get the same plans from both
    assert lists(plan(synthetic(2, 1, 28), Request(ninstances=3))) == [("0-18", "0"), ("19-37", "0-1"), ("38-55", "1")]
    assert lists(plan(synthetic(2, 2, 3), Request(ninstances=5)))[3] == ("8-9", "2-3")


def test_many_instances_plan_fast():
    """A 4096-core machine cut into 2730 instances (far past the exact search) plans in
    well under a second: the greedy is linear."""
    topo = synthetic(4, 4, 256)
    start = time.monotonic()
    p = plan(topo, Request(ninstances=2730))
    assert time.monotonic() - start < 5
    assert sum(len(i.cpus) for i in p.instances) == 4096
    assert {len(i.cpus) for i in p.instances} == {1, 2}


# --------------------------------------------------------------------------- the real command


def _clean_env(monkeypatch):
    """The env the command plans must not depend on the test runner's own settings."""
    for name in list(os.environ):
        if name.startswith(("OMP_", "KMP_", "CPULAUNCH_", "GOMP_")) or name in ("LD_PRELOAD", "MALLOC_CONF"):
            monkeypatch.delenv(name)


@pytest.fixture
def numactl():
    path = shutil.which("numactl")
    if path is None:
        pytest.skip("numactl not installed: the plan binds with sched_setaffinity instead")
    return path


@pytest.mark.parametrize("args, policy", [((), "bind"), (("--mem-policy", "bind"), "bind"),
                                          (("--mem-policy", "interleave"), "interleave"),
                                          (("--mem-policy", "preferred"), "preferred")])
def test_bind_affinity_says_memory_is_not_bound(sysroots, monkeypatch, args, policy):
    """Issue 23: --bind affinity sets no memory policy; the plan says so in one note naming
    the --mem-policy that is not applied (given or by default) and where pages go instead,
    and every instance's memory policy and variables say none."""
    _clean_env(monkeypatch)
    doc = plan_json(sysroots[XEON], "--instances-per-socket", "--bind", "affinity", *args)
    assert doc["notes"] == [(
        "memory is not bound: CPUs are bound with sched_setaffinity (--bind affinity), which sets no "
        f"memory policy, so --mem-policy {policy} is not applied and pages follow the first touch (each "
        "lands on the node of the CPU that first writes it); use --bind numactl to bind memory")]
    assert [(i["mem_policy"], i["mem_nodes"], i["env"]["CPULAUNCH_PLANNED_MEM_POLICY"]) for i in doc["instances"]] \
        == [("none", [], "none")] * 2
    assert all("CPULAUNCH_MEM_NODES" not in i["env"] and i["argv"] == ["true"] for i in doc["instances"])
    assert not any(n.startswith("memory is not bound") for n in plan_json(sysroots[XEON], *args)["notes"])


def test_cli_per_socket_argv_and_env(sysroots, monkeypatch, numactl):
    _clean_env(monkeypatch)
    doc = plan_json(sysroots[XEON], "--instances-per-socket")
    assert doc["num_instances"] == 2
    a, b = doc["instances"]
    assert a["argv"] == [numactl, "-C", "0-7", "-m", "0", "true"]
    assert b["argv"] == [numactl, "-C", "8-15", "-m", "1", "true"]
    assert a["env"] == {
        "CPULAUNCH_BOUND_CPUS": "0-7",
        "CPULAUNCH_CPUS": "0-7",
        "CPULAUNCH_INSTANCE_INDEX": "0",
        "CPULAUNCH_MEM_NODES": "0",
        "CPULAUNCH_NUM_INSTANCES": "2",
        "CPULAUNCH_PLANNED_MEM_POLICY": "bind",
        "CPULAUNCH_PLANNED_RECIPE": "generic",  # issue 33: a Xeon keeps the generic recipe
        "OMP_NUM_THREADS": "8",
        "PYTHONUNBUFFERED": "1",  # two instances: their output is relayed (issue 24, live output)
    }
    assert b["env"]["CPULAUNCH_INSTANCE_INDEX"] == "1" and b["env"]["CPULAUNCH_CPUS"] == "8-15"
    assert (a["cpus"], a["bound_cpus"], a["mem_nodes"], a["mem_policy"]) == (
        list(range(8)), list(range(8)), [0], "bind"
    )
    # the plan adds no note; the host layer says numactl was not checked on the dump (and
    # whether it is usable here: its wording belongs to core.py's tests)
    assert len(doc["notes"]) == 1
    assert doc["notes"][0].startswith("numactl not checked: --sysroot describes another machine")
    assert doc["topology"]["allowed"] == "0-31"


def test_cli_logical_cores_and_interleave(sysroots, monkeypatch, numactl):
    _clean_env(monkeypatch)
    doc = plan_json(sysroots[XEON], "--instances-per-socket", "--use-logical-cores", "--mem-policy", "interleave")
    assert [i["argv"] for i in doc["instances"]] == [
        [numactl, "-C", "0-7,16-23", "-i", "0", "true"],
        [numactl, "-C", "8-15,24-31", "-i", "1", "true"],
    ]
    assert [i["env"]["OMP_NUM_THREADS"] for i in doc["instances"]] == ["16", "16"]


def test_cli_gold_per_node_and_preferred(sysroots, monkeypatch, numactl):
    _clean_env(monkeypatch)
    doc = plan_json(sysroots[GOLD], "--instances-per-node")
    assert [(i["cpulist"], i["mem_nodes"]) for i in doc["instances"]] == [(GOLD_NODE[n], [n]) for n in range(4)]
    assert doc["instances"][0]["argv"] == [numactl, "-C", GOLD_NODE[0], "-m", "0", "true"]
    doc = plan_json(sysroots[GOLD], "--instances-per-socket", "--mem-policy", "preferred")
    assert [i["argv"][3:5] for i in doc["instances"]] == [["-p", "0"], ["-p", "1"]]
    assert "instance 0: --mem-policy preferred takes one node; preferring node 0 of 0,2" in doc["notes"]


def test_cli_local_and_none(sysroots, monkeypatch, numactl):
    _clean_env(monkeypatch)
    doc = plan_json(sysroots[AMD], "--mem-policy", "local")
    assert [i["argv"] for i in doc["instances"]] == [[numactl, "-C", "0-5", "-l", "true"]]
    doc = plan_json(sysroots[AMD], "--throughput-mode", "--mem-policy", "none")
    assert [i["argv"] for i in doc["instances"]] == [
        [numactl, "-C", "0-3", "true"],
        [numactl, "-C", "4-5", "true"],
    ]
    assert [(i["mem_nodes"], i["mem_policy"]) for i in doc["instances"]] == [([], "none"), ([], "none")]


def test_cli_machines_with_odd_ids(sysroots, monkeypatch):
    _clean_env(monkeypatch)
    doc = plan_json(sysroots[KUNPENG], "--instances-per-socket")
    assert [(i["cpulist"], i["mem_nodes"]) for i in doc["instances"]] == [("0-63", [0, 1]), ("64-127", [2, 3])]
    assert [s["package_id"] for s in doc["topology"]["sockets"]] == [36, 8442]
    doc = plan_json(sysroots[POWER9])
    assert [(i["cpulist"], i["mem_nodes"]) for i in doc["instances"]] == [("0,4,8,12", [0])]
    assert doc["topology"]["allowed"] == "0-15"
    doc = plan_json(sysroots[POWER7], "--instances-per-socket", "--instance-idx", "2,5")
    assert [(i["index"], i["mem_nodes"]) for i in doc["instances"]] == [(2, [4]), (5, [9])]
    assert doc["num_instances"] == 8
    assert [i["env"]["CPULAUNCH_NUM_INSTANCES"] for i in doc["instances"]] == ["8", "8"]
    doc = plan_json(sysroots[HYBRID], "--use-e-cores")
    assert [i["cpulist"] for i in doc["instances"]] == ["0,2,4,6,8,10,12-19"]
    assert doc["instances"][0]["env"]["OMP_NUM_THREADS"] == "14"


@pytest.mark.parametrize(
    "args, count",
    [
        (["--instances-per-socket", "2"], 4),
        (["--instances-per-socket=2"], 4),
        (["--instances_per_socket", "2"], 4),
        (["--instances-per-node", "--ninstances", "2"], None),  # two modes: an error
    ],
)
def test_cli_count_spellings(sysroots, args, count):
    if count is None:
        proc = run_cli("--sysroot", str(sysroots[XEON]), "--dry-run", "--format", "json", *args, "true", check_rc=2)
        assert "cannot be combined" in proc.stderr
        return
    assert plan_json(sysroots[XEON], *args)["num_instances"] == count


def test_cli_bare_flag_then_the_program(sysroots, monkeypatch):
    """``--instances-per-socket python infer.py``: the bare flag means 1 and the program's
    words are left alone, its own flags included."""
    _clean_env(monkeypatch)
    proc = run_cli(
        "--sysroot", str(sysroots[XEON]), "--dry-run", "--format", "json", "--allocator", "default",
        "--omp-runtime", "gnu", "--bind", "none", "--instances-per-socket", "python", "infer.py",
        "--ninstances", "7",
    )
    doc = json.loads(proc.stdout)
    assert doc["num_instances"] == 2
    assert [i["argv"] for i in doc["instances"]] == [["python", "infer.py", "--ninstances", "7"]] * 2
    doc = json.loads(run_cli(
        "--sysroot", str(sysroots[XEON]), "--dry-run", "--format", "json", "--bind", "none",
        "--allocator", "default", "--instances-per-node", "infer.py",
    ).stdout)
    assert [i["argv"] for i in doc["instances"]] == [[sys.executable, "infer.py"]] * 2


# --------------------------------------------------------------------------- errors

ERRORS = [
    (AMD, ["--ninstances", "7"], "--ninstances 7 needs 7 physical cores, but only 6 are usable"),
    (XEON, ["--node-list", "3"], "--node-list 3 names NUMA nodes 3 that do not exist"),
    (POWER9, ["--node-list", "250"], "that have no CPUs (memory-only nodes)"),
    (POWER9, ["--core-list", "88-91"], "--core-list 88-91 names CPUs 88-91 that this process may not use"),
    (AMD, ["--node-list", "2"], "none of its CPUs (8-11) may be used by this process"),
    (XEON, ["--core-list", "200"], "--core-list 200 names CPUs 200 that are not present"),
    (XEON, ["--instances-per-socket", "9"], "--instances-per-socket 9 needs 9 physical cores in each socket, but socket 0 has only 8"),
    (XEON, ["--ninstances", "4", "--ncores-per-instance", "5"], "--ninstances 4 x --ncores-per-instance 5 needs 20 physical cores"),
    (XEON, ["--instances-per-socket", "--instance-idx", "2"], "--instance-idx 2: only 2 instance(s) are planned"),
    (XEON, ["--ninstances", "0"], "--ninstances 0: must be"),  # the CLI refuses it first
    (XEON, ["--core-list", "3-1"], "--core-list 3-1: reversed range"),
    (XEON, ["--latency-mode", "--ncores-per-instance", "2"], "cannot be combined"),
]


@pytest.mark.parametrize("machine, args, message", ERRORS, ids=[" ".join(e[1]) for e in ERRORS])
def test_cli_errors(machine, args, message, sysroots):
    proc = run_cli("--sysroot", str(sysroots[machine]), "--dry-run", "--format", "json", *args, "true", check_rc=2)
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("cpulaunch: error: ") and message in lines[0]
    assert "Traceback" not in proc.stderr


def test_error_messages_say_what_and_how(topos):
    with pytest.raises(PlanError) as info:
        plan(topos[AMD], Request(ninstances=7))
    msg = str(info.value)
    assert "allowed 0-5 by cgroup cpuset /cgroup/unified/uid_2008/job_15389/step_0/cpuset.cpus.effective" in msg
    assert msg.endswith("lower --ninstances")  # no SMT here: --use-logical-cores would not help
    # instances own whole cores: SMT siblings never make more instances possible
    for logical in (False, True):
        with pytest.raises(PlanError) as info:
            plan(topos[XEON], Request(ninstances=17, use_logical_cores=logical))
        assert str(info.value).startswith("--ninstances 17 needs 17 physical cores, but only 16 are usable")


# --------------------------------------------------------------------------- random machines


def _siblings(layout: list, smt: int, interleaved: bool) -> tuple:
    """({cpu: (socket, its siblings)}, {node: its CPUs}) for (socket, node, cores) triples."""
    total = sum(n for _, _, n in layout)
    cpus: dict = {}
    nodes: dict = {nid: set() for _, nid, _ in layout}
    k = 0
    for s, nid, ncores in layout:
        for _ in range(ncores):
            sib = [k + t * total for t in range(smt)] if interleaved else [k * smt + t for t in range(smt)]
            for c in sib:
                cpus[c] = (s, sib)
            nodes[nid].update(sib)
            k += 1
    return cpus, nodes


@st.composite
def machines(draw) -> Topology:
    """A random machine as sysfs would describe it, built by topology.build."""
    node_ids = draw(st.lists(st.integers(0, 300), min_size=1, max_size=7, unique=True))
    no_package = draw(st.integers(0, 5)) == 0  # package -1: sockets from nodes
    layout = []  # (socket, node, cores)
    it = iter(node_ids)
    for s in range(draw(st.integers(1, 3))):
        for _ in range(draw(st.integers(1, 3))):
            nid = next(it, None)
            if nid is not None:
                layout.append((s, nid, draw(st.integers(1, 6))))
    memory_only = node_ids[len(layout):]
    # siblings n, n+cores (Intel) or n*smt+t (POWER)
    cpus, nodes = _siblings(layout, draw(st.integers(1, 4)), draw(st.booleans()))
    firsts = sorted({min(sib) for _, sib in cpus.values()})
    e_cores = draw(st.sets(st.sampled_from(firsts))) if draw(st.booleans()) else set()
    raw_cpus = {
        c: CpuFacts(
            has_topology=True,
            package_id=-1 if no_package else 100 * s + 36,
            core_id=0,  # repeated on purpose: cores are sibling sets
            siblings=frozenset(sib),
            max_freq_khz=2000000 if min(sib) in e_cores else 4000000,
        )
        for c, (s, sib) in cpus.items()
    }
    raw_nodes = {nid: NodeFacts(cpus=frozenset(v)) for nid, v in nodes.items()}
    if len(raw_nodes) > 1 and draw(st.integers(0, 5)) == 0:
        del raw_nodes[layout[-1][1]]  # the last node's CPUs belong to no node
    raw_nodes.update({nid: NodeFacts(cpus=frozenset()) for nid in memory_only})
    has_memory = draw(st.sets(st.sampled_from(node_ids)))
    allowed = draw(st.one_of(st.none(), st.frozensets(st.sampled_from(sorted(cpus)), min_size=1)))
    quota = draw(st.one_of(st.none(), st.floats(0.5, 6), st.floats(0.5, 40)))  # small ones bite
    mems = draw(st.one_of(st.none(), st.frozensets(st.sampled_from(node_ids))))  # cpuset.mems
    return build(HostFacts(
        online=frozenset(cpus),
        cpus=raw_cpus,
        nodes=raw_nodes,
        has_memory=frozenset(has_memory),
        allowed=allowed,
        allowed_source="test",
        quota_cpus=quota,
        allowed_mems=mems,
    ))


@st.composite
def requests(draw, topo: Topology) -> Request:
    mode = draw(st.sampled_from(
        ["default", "ninstances", "per-socket", "per-node", "ncores", "ninstances-ncores", "latency", "throughput"]
    ))
    kw: dict = {}
    if mode in ("ninstances", "ninstances-ncores"):
        kw["ninstances"] = draw(st.integers(1, 12))
    if mode in ("ncores", "ninstances-ncores"):
        kw["ncores_per_instance"] = draw(st.integers(1, 8))
    if mode == "per-socket":
        kw["instances_per_socket"] = draw(st.integers(1, 4))
    if mode == "per-node":
        kw["instances_per_node"] = draw(st.integers(1, 4))
    kw["latency_mode"] = mode == "latency"
    kw["throughput_mode"] = mode == "throughput"
    kw["use_logical_cores"] = draw(st.booleans())
    kw["use_e_cores"] = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:
        kw["core_list"] = draw(st.frozensets(st.sampled_from(sorted(topo.online)), min_size=1))
    if draw(st.integers(0, 3)) == 0:
        kw["node_list"] = draw(st.frozensets(st.sampled_from(sorted(topo.nodes) + [999]), min_size=1))
    if draw(st.integers(0, 4)) == 0:
        kw["instance_idx"] = tuple(draw(st.lists(st.integers(0, 6), min_size=1, max_size=3)))
    kw["mem_policy"] = draw(st.sampled_from(list(MemPolicy)))
    return Request(**kw)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_machines_and_requests(data):
    topo = data.draw(machines())
    req = data.draw(requests(topo))
    if must_fail(topo, req):
        with pytest.raises(PlanError) as info:
            plan(topo, req)
        assert "\n" not in str(info.value) and not str(info.value).startswith("internal")
    else:
        check_plan(topo, req, plan(topo, req))
