"""Core budgets (issue 11): oneCCL workers, DataLoader workers and the program's own
reserved cores, taken as whole cores from the end of each instance's cores.

- exact cpulists of every role on the fixture dumps (probed in-process) and on
  hand-built machines, composed with quotas, --use-logical-cores and spanning instances;
- impossible budgets: one-line PlanErrors naming the options to lower;
- the real command: the env a program gets (``CPULAUNCH_DATALOADER_CPUS``, ...);
- hypothesis: on random machines and requests, a budgeted plan binds each instance to
  exactly the cores of the same request without budgets, the budgets being its last
  cores (ccl last, DataLoader before, reserved before that), and is refused exactly when
  an instance would keep no compute core.
"""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import plan_json
from cpulaunch import cpulist
from cpulaunch.machine import probe
from cpulaunch.errors import InternalError
from cpulaunch.plan import PlanError, Request, plan, validate
from cpulaunch.spelling import Spelling, Spellings
from test_plan_fixtures import (
    AMD, GOLD, HYBRID, KUNPENG, POWER7, XEON, _clean_env, check_plan, machines, must_fail,
    ordered_cores, requests, synthetic,
)


@pytest.fixture(scope="module")
def topos(sysroots) -> dict:
    return {m: probe.probe(root) for m, root in sysroots.items()}


def roles(p) -> list:
    """[(compute, ccl, dataloader, reserved cpulists, threads)] of a plan's instances."""
    return [
        (i.cpulist, cpulist.format(i.ccl_cpus), cpulist.format(i.dataloader_cpus),
         cpulist.format(i.reserved_cpus), i.threads)
        for i in p.instances
    ]


# --------------------------------------------------------------------------- exact plans

EXACT = [
    # 2x Xeon Silver 4108, 8 cores per socket/node, siblings k and k+16
    (XEON, Request(instances_per_socket=1, dataloader_workers=2),
     [("0-5", "", "6-7", "", 6), ("8-13", "", "14-15", "", 6)]),
    (XEON, Request(instances_per_socket=1, reserve_cores=1, dataloader_workers=2),
     [("0-4", "", "6-7", "5", 5), ("8-12", "", "14-15", "13", 5)]),
    # every role with --use-logical-cores: a budget core brings its sibling
    (XEON, Request(instances_per_socket=1, use_logical_cores=True, ccl_workers=1,
                   dataloader_workers=1, reserve_cores=1),
     [("0-4,16-20", "7,23", "6,22", "5,21", 10), ("8-12,24-28", "15,31", "14,30", "13,29", 10)]),
    # the spanning instance of --ninstances 3 takes its budget from its last node
    (XEON, Request(ninstances=3, dataloader_workers=1),
     [("0-4", "", "5", "", 5), ("6-9", "", "10", "", 4), ("11-14", "", "15", "", 4)]),
    # Gold 6230 SNC2: node n holds CPUs n, n+4, ...; oneCCL workers on the rank's node
    (GOLD, Request(instances_per_node=1, ccl_workers=2),
     [(",".join(str(n + 4 * k) for k in range(8)), f"{n + 32},{n + 36}", "", "", 8) for n in range(4)]),
    # Kunpeng 920: socket 0 is nodes 0-1; the budget comes from node 1's end
    (KUNPENG, Request(instances_per_socket=1, dataloader_workers=4, reserve_cores=2),
     [("0-57", "", "60-63", "58-59", 58), ("64-121", "", "124-127", "122-123", 58)]),
    # POWER7, SMT4: a budget core is 4 CPUs with --use-logical-cores
    (POWER7, Request(instances_per_socket=1, use_logical_cores=True, instance_idx=(0, 7),
                     dataloader_workers=1),
     [("0-27", "", "28-31", "", 28), ("224-251", "", "252-255", "", 28)]),
    # i7-1370P: P-cores 0,2,...,10 (siblings +1), E-cores 12-19 last in the order
    (HYBRID, Request(dataloader_workers=2), [("0,2,4,6", "", "8,10", "", 4)]),
    (HYBRID, Request(dataloader_workers=2, use_e_cores=True), [("0,2,4,6,8,10,12-17", "", "18-19", "", 12)]),
    # Slurm job on CPUs 0-5: node 0 holds 0-3, node 1 holds 4-5
    (AMD, Request(reserve_cores=1, dataloader_workers=1), [("0-3", "", "5", "4", 4)]),
]


@pytest.mark.parametrize("machine, req, expected", EXACT, ids=[f"{e[0]}-{i}" for i, e in enumerate(EXACT)])
def test_exact_budgets_on_fixture_machines(machine, req, expected, topos):
    p = plan(topos[machine], req)
    assert roles(p) == expected
    check_plan(topos[machine], req, p)
    check_budgets(topos[machine], req, p)


def test_budget_nodes_and_memory(topos):
    """An instance's nodes and memory are those of every CPU it is bound to: on the Slurm
    job the budget cores sit on node 1 while the compute cores are on node 0."""
    (inst,) = plan(topos[AMD], Request(reserve_cores=1, dataloader_workers=1)).instances
    assert (inst.cores, inst.nodes, inst.mem_nodes, inst.socket) == ((0, 1, 2, 3), (0, 1), (0, 1), 0)
    assert inst.bound_cpus == (0, 1, 2, 3, 4, 5)
    (inst,) = plan(topos[AMD], Request(reserve_cores=1, node_list=frozenset({0}))).instances
    assert (inst.cpus, inst.reserved_cpus, inst.nodes) == ((0, 1, 2), (3,), (0,))


def test_budgets_compose_with_a_quota():
    """The quota is split over instances and counts compute CPUs only."""
    topo = synthetic(1, 2, 4, smt=2)._replace(quota_cpus=5.0)
    p = plan(topo, Request(instances_per_node=1, dataloader_workers=1))
    assert roles(p) == [("0-2", "", "3", "", 2), ("4-6", "", "7", "", 2)]
    p = plan(topo, Request(instances_per_node=1, dataloader_workers=1, use_logical_cores=True))
    assert roles(p) == [("0-2,8-10", "", "3,11", "", 2), ("4-6,12-14", "", "7,15", "", 2)]
    assert p.notes == ("a CPU quota of 5 CPUs applies (cgroup cpu.max): OpenMP threads lowered to fit it",)
    p = plan(topo._replace(quota_cpus=64.0), Request(instances_per_node=1, reserve_cores=3))
    assert roles(p) == [("0", "", "", "1-3", 1), ("4", "", "", "5-7", 1)] and p.notes == ()


def test_budgets_with_core_list_take_listed_cores_only():
    """Budgets come out of the usable cores: a --core-list narrows them too."""
    topo = synthetic(2, 1, 4)
    p = plan(topo, Request(core_list=frozenset({0, 1, 2, 4, 5, 6}), instances_per_socket=1, ccl_workers=1))
    assert roles(p) == [("0-1", "2", "", "", 2), ("4-5", "6", "", "", 2)]


# --------------------------------------------------------------------------- errors

def ccl_said(n: int) -> Spellings:
    """A request's ``ccl_workers`` as ``--ccl-worker-count N`` gave it (the DDP planner's words:
    the field is not spelled like its option)."""
    return Spellings({"ccl_workers": Spelling("flag", "--ccl-worker-count", f"--ccl-worker-count {n}")})


ERRORS = [
    (XEON, Request(instances_per_socket=1, dataloader_workers=8),
     "--dataloader-workers 8 takes 8 core(s) from each instance, but instance 0 has only 8 "
     "(CPUs 0-7), leaving no core for its OpenMP threads; lower --dataloader-workers, or plan "
     "fewer instances (ranks)"),
    (XEON, Request(ninstances=3, dataloader_workers=3, reserve_cores=2),
     "--dataloader-workers 3 and --reserve-cores 2 take 5 core(s) from each instance, but "
     "instance 1 has only 5 (CPUs 6-10), leaving no core for its OpenMP threads; lower "
     "--dataloader-workers or --reserve-cores, or plan fewer instances (ranks)"),
    (AMD, Request(instances_per_node=1, ccl_workers=2, words=ccl_said(2)),
     "--ccl-worker-count 2 takes 2 core(s) from each instance, but instance 1 has only 2 "
     "(CPUs 4-5), leaving no core for its OpenMP threads; lower --ccl-worker-count, or plan "
     "fewer instances (ranks)"),
    (XEON, Request(reserve_cores=-1), "--reserve-cores -1: must be 0 or more"),
    (XEON, Request(dataloader_workers=-2), "--dataloader-workers -2: must be 0 or more"),
    (XEON, Request(ccl_workers=-1, words=ccl_said(-1)), "--ccl-worker-count -1: must be 0 or more"),
]


@pytest.mark.parametrize("machine, req, message", ERRORS, ids=[e[2][:30] for e in ERRORS])
def test_impossible_budgets_are_one_line_errors(machine, req, message, topos):
    with pytest.raises(PlanError) as info:
        plan(topos[machine], req)
    assert str(info.value) == message


def test_logical_cores_do_not_make_budgets_possible(topos):
    """Budgets count physical cores: SMT siblings never make room for more."""
    with pytest.raises(PlanError, match="instance 0 has only 8"):
        plan(topos[XEON], Request(instances_per_socket=1, use_logical_cores=True, dataloader_workers=8))
    p = plan(topos[XEON], Request(instances_per_socket=1, use_logical_cores=True, dataloader_workers=7))
    assert roles(p)[0] == ("0,16", "", "1-7,17-23", "", 2)


def test_validate_checks_budget_roles(topos):
    """Budgets overlapping compute CPUs or another instance, or outside the allowed set,
    are our bug: InternalError."""
    good = plan(topos[XEON], Request(instances_per_socket=1, dataloader_workers=1))
    a, b = good.instances
    for bad, message in (
        ((a._replace(reserved_cpus=(0,)), b), "CPU 0 in (0, 'cpus') and (0, 'reserved_cpus')"),
        ((a, b._replace(ccl_cpus=(7,))), "CPU 7 in (0, 'dataloader_cpus') and (1, 'ccl_cpus')"),
        ((a._replace(reserved_cpus=(23,)), b), "core of CPU 23 split"),
    ):
        with pytest.raises(InternalError) as info:
            validate(good._replace(instances=bad), topos[XEON])
        assert str(info.value).startswith("internal: ") and message in str(info.value)
    narrow = topos[XEON]._replace(allowed=frozenset(range(7)))
    with pytest.raises(InternalError, match="CPU 7 of instance 0 is not allowed"):
        validate(good._replace(instances=(a,)), narrow)


# --------------------------------------------------------------------------- the real command


def test_cli_budget_env(sysroots, monkeypatch):
    """What the program gets: compute CPUs in OMP_NUM_THREADS/CPULAUNCH_CPUS, the budgets
    in their own variables, the binding over all of them."""
    _clean_env(monkeypatch)
    doc = plan_json(sysroots[XEON], "--instances-per-socket", "--dataloader-workers", "2", "--reserve-cores", "1")
    got = [(i["cpus"], i["bound_cpus"], i["env"]["OMP_NUM_THREADS"], i["env"]["CPULAUNCH_CPUS"],
            i["env"]["CPULAUNCH_DATALOADER_CPUS"], i["env"]["CPULAUNCH_RESERVED_CPUS"]) for i in doc["instances"]]
    assert got == [
        ([0, 1, 2, 3, 4], list(range(8)), "5", "0-4", "6-7", "5"),
        ([8, 9, 10, 11, 12], list(range(8, 16)), "5", "8-12", "14-15", "13"),
    ]


# --------------------------------------------------------------------------- random machines


def check_budgets(topo, req, p) -> None:
    """Each instance is bound to exactly the cores of the same request without budgets;
    its budgets are the last cores in (socket, node, core) order: ccl last, then
    DataLoader, then reserved; the rest are its compute cores."""
    base = plan(topo, req._replace(ccl_workers=0, dataloader_workers=0, reserve_cores=0))
    assert [i.index for i in p.instances] == [i.index for i in base.instances]
    for inst, whole in zip(p.instances, base.instances):
        assert inst.bound_cpus == whole.cpus
        cores = ordered_cores(topo, [topo.core_of(c) for c in whole.cores])
        end = len(cores)
        for role, k in (("ccl_cpus", req.ccl_workers), ("dataloader_cpus", req.dataloader_workers),
                        ("reserved_cpus", req.reserve_cores)):
            mine = {topo.core_of(c).id for c in getattr(inst, role)}
            assert mine == {c.id for c in cores[end - k : end]}, role
            end -= k
        assert set(inst.cores) == {c.id for c in cores[:end]}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_budgets(data):
    topo = data.draw(machines())
    req = data.draw(requests(topo))
    ks = data.draw(st.tuples(*[st.integers(0, 3)] * 3))
    budgeted = req._replace(ccl_workers=ks[0], dataloader_workers=ks[1], reserve_cores=ks[2])
    if must_fail(topo, req):
        with pytest.raises(PlanError):
            plan(topo, budgeted)
        return
    smallest = min(len(i.cores) for i in plan(topo, req._replace(instance_idx=None)).instances)
    if sum(ks) and smallest <= sum(ks):
        with pytest.raises(PlanError) as info:
            plan(topo, budgeted)
        assert "leaving no core for its OpenMP threads" in str(info.value)
        assert "\n" not in str(info.value)
        return
    p = plan(topo, budgeted)
    check_plan(topo, budgeted, p)
    check_budgets(topo, budgeted, p)
