"""Issue 21: oneCCL under ``cpulaunch --ddp``: the backend choice, oneCCL's environment from
the plan, the worker cores, libfabric's lookup, the cached verdict of the bindings, and
what doctor and verify say about it.

Where the bindings are not installed (CI), everything here runs but the real-binding tests
at the end: the bindings are stand-ins on PYTHONPATH (one that imports with any version
string, one that aborts the interpreter at import, one that raises ImportError) and
libfabric is a stand-in too (a copy of a real ELF shared object of this machine, laid out
as the impi-rt wheel lays libfabric out). The real-binding tests skip with one reason when
oneccl_bindings_for_pytorch does not load with this torch; they run where it does
(docs/guide/ddp.md: ``PATH=<venv>/bin:$PATH python -m pytest tests/test_ccl.py``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, json_records, make_stand_in, plant_fabric, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from cpulaunch import envvars
from cpulaunch.distributed import (
    DistributedError,
    RankContext,
    ccl_changed,
    ccl_env,
    ccl_expected_warning,
    ccl_precedence,
    plan_ranks,
    select_backend,
)
from cpulaunch.machine import host, libfinder, probe
from cpulaunch.machine import proc as procfs
from cpulaunch.machine.host import CclBinding
from cpulaunch.machine.libfinder import Fabric
from cpulaunch.options import DdpOptions
from cpulaunch.plan import PlanError, Request
from cpulaunch.tools import verify

XEON = "hw-32intel64-2p8co2t+8ve"  # 2 sockets x 8 cores x 2 threads: cores 0-15, siblings 16-31
TORCH = "2.13.0+cpu"
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="the bindings' import check imports torch")


# --------------------------------------------------------------------------- the backend choice (pure)

SITE = "/site/oneccl_bindings_for_pytorch"
WORKS = CclBinding("/py", SITE, "2.8.0+xpu", TORCH, True)
ABORTS = CclBinding("/py", SITE, TORCH, TORCH, False, "aborts the interpreter at import (SIGABRT)")
MISSING = CclBinding("/py", None)
LIB = Path("/p/lib/libfabric/libfabric.so.1")
FABRIC = Fabric(LIB, LIB.parent / "prov", (LIB.parent,))
NO_FABRIC = Fabric(None, None, (LIB.parent, Path("/q")))
NO_PROV = Fabric(LIB, None, (LIB.parent,))
USER_PATHS = {"CCL_OFI_LIBRARY_PATH": "/mine/libfabric.so.1", "FI_PROVIDER_PATH": "/mine/prov"}
LOADS = "oneccl_bindings_for_pytorch 2.8.0+xpu loads with torch 2.13.0+cpu"
NOT_LOADING = (f"oneccl_bindings_for_pytorch 2.13.0+cpu ({SITE}) does not load with torch 2.13.0+cpu: "
               "aborts the interpreter at import (SIGABRT) (checked in a child process)")
CACHED = "cached verdict: /c/ccl-binding-1.json; cpulaunch doctor --clear-cache removes it"
NOT_FOUND = "oneCCL's libfabric (libfabric.so.1 with its prov/ folder) was not found (searched /p/lib/libfabric, /q)"
NO_PROVIDER = ("libfabric /p/lib/libfabric/libfabric.so.1 has no provider folder beside it (prov/lib*-fi.so), "
               "so oneCCL finds no provider")


@pytest.mark.parametrize("requested, binding, fabric, environ, chosen", [
    ("auto", WORKS, FABRIC, {}, ("ccl", f"backend ccl: {LOADS} (checked in a child process)")),
    ("ccl", WORKS._replace(cached=True, cache_file="/c/ccl-binding-1.json"), FABRIC, {},
     ("ccl", f"backend ccl (asked for): {LOADS} ({CACHED})")),
    ("auto", WORKS._replace(cache_file="/c/ccl-binding-1.json"), FABRIC, {},
     ("ccl", f"backend ccl: {LOADS} (checked in a child process; verdict kept in /c/ccl-binding-1.json)")),
    ("auto", ABORTS._replace(cached=True, cache_file="/c/ccl-binding-1.json"), FABRIC, {},
     ("gloo", f"backend gloo: {NOT_LOADING.replace('checked in a child process', CACHED)}, so oneCCL is not used")),
    ("auto", ABORTS, FABRIC, {}, ("gloo", f"backend gloo: {NOT_LOADING}, so oneCCL is not used")),
    ("auto", MISSING, None, {}, ("gloo", ("backend gloo: oneccl_bindings_for_pytorch is not installed for /py, "
                                         "so oneCCL is not used"))),
    ("auto", WORKS, NO_FABRIC, {}, ("gloo", f"backend gloo: {NOT_FOUND}, so oneCCL is not used")),
    ("auto", WORKS, NO_FABRIC, USER_PATHS, ("ccl", f"backend ccl: {LOADS} (checked in a child process)")),
    ("auto", WORKS, NO_PROV, {}, ("gloo", f"backend gloo: {NO_PROVIDER}, so oneCCL is not used")),
    ("auto", WORKS, NO_PROV, {"FI_PROVIDER_PATH": "/mine"}, ("ccl", f"backend ccl: {LOADS} (checked in a child process)")),
    ("gloo", ABORTS, None, {}, ("gloo", "backend gloo (asked for)")),
], ids=["works-any-version", "asked-cached", "kept", "fails-cached", "aborts", "missing", "no-libfabric", "user-paths", "no-provider",
        "user-provider", "gloo-asked"])
def test_backend_choice(requested, binding, fabric, environ, chosen):
    """The version string decides nothing: a working binding that calls itself 2.8.0+xpu is
    picked, one whose metadata matches torch but aborts at import is not."""
    assert select_backend(requested, binding, fabric, environ) == chosen


GLOO = "or use --backend gloo"


@pytest.mark.parametrize("binding, fabric, message", [
    (MISSING, None, ("--backend ccl: oneccl_bindings_for_pytorch is not installed for /py; install "
                    "oneccl_bindings_for_pytorch built for this torch (Intel's own wheels stop at torch 2.8: build "
                    f"intel/torch-ccl against the installed torch), {GLOO}")),
    (ABORTS, FABRIC, f"--backend ccl: {NOT_LOADING}; rebuild it against the installed torch, {GLOO}"),
    (WORKS, NO_FABRIC, (f"--backend ccl: {NOT_FOUND}; pip install impi-rt==2021.14.2, or set CCL_OFI_LIBRARY_PATH "
                       f"and FI_PROVIDER_PATH; {GLOO}")),
    (WORKS, NO_PROV, (f"--backend ccl: {NO_PROVIDER}; set FI_PROVIDER_PATH to its providers' folder or pip install "
                     f"impi-rt==2021.14.2; {GLOO}")),
], ids=["missing", "aborts", "no-libfabric", "no-provider"])
def test_ccl_that_cannot_work_is_an_error_naming_cause_and_fix(binding, fabric, message):
    with pytest.raises(DistributedError) as err:
        select_backend("ccl", binding, fabric, {})
    assert str(err.value) == message


# --------------------------------------------------------------------------- oneCCL's variables (pure)

RUNTIME = {"CCL_OFI_LIBRARY_PATH": str(LIB), "FI_PROVIDER_PATH": str(LIB.parent / "prov")}


def test_two_ranks_without_spare_cores_share_their_first_cpu_and_yield():
    envs = [ccl_env(RankContext("cpulaunch", r, 2, r, 2), [(0,), (1,)], dedicated=False, runtime=RUNTIME)
            for r in (0, 1)]
    assert envs[1] == {
        "CCL_WORKER_COUNT": "1", "CCL_WORKER_AFFINITY": "0,1", "CCL_YIELD": "sched_yield", "CCL_ATL_SHM": "1",
        "CCL_LOCAL_RANK": "1", "CCL_LOCAL_SIZE": "2", "CCL_PROCESS_LAUNCHER": "none", "CCL_ATL_TRANSPORT": "ofi",
        envvars.CCL_WORKER_CPUS: "1", **RUNTIME}
    assert envs[0]["CCL_WORKER_AFFINITY"] == "0,1" and envs[0][envvars.CCL_WORKER_CPUS] == "0"


def test_dedicated_workers_do_not_yield_and_mpich_uses_ofi():
    env = ccl_env(RankContext("mpich", 0, 4, 0, 2), [(6, 7), (14, 15)], dedicated=True)
    assert env == {"CCL_WORKER_COUNT": "2", "CCL_WORKER_AFFINITY": "6,7,14,15", "CCL_ATL_SHM": "1",
                   "CCL_LOCAL_RANK": "0", "CCL_LOCAL_SIZE": "2", "CCL_PROCESS_LAUNCHER": "hydra",
                   "CCL_ATL_TRANSPORT": "ofi", envvars.CCL_WORKER_CPUS: "6,7"}


def test_one_rank_per_host_has_no_shm_and_open_mpi_uses_pmix():
    env = ccl_env(RankContext("openmpi", 3, 4, 0, 1), [(5,)], dedicated=False)
    assert "CCL_ATL_SHM" not in env and env["CCL_PROCESS_LAUNCHER"] == "pmix" and env["CCL_ATL_TRANSPORT"] == "ofi"


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_worker_list_always_one_oneccl_accepts(data):
    """Whatever the plan: CCL_WORKER_COUNT >= 1 and exactly LOCAL_SIZE x count entries,
    local rank i's slice being its own first CPUs (oneCCL's rule, docs/guide/ddp.md)."""
    size = data.draw(st.integers(1, 8))
    workers = [sorted(data.draw(st.sets(st.integers(0, 255), min_size=1, max_size=4))) for _ in range(size)]
    local = data.draw(st.integers(0, size - 1))
    env = ccl_env(RankContext("cpulaunch", local, size, local, size), workers, dedicated=data.draw(st.booleans()))
    count = int(env["CCL_WORKER_COUNT"])
    entries = [int(c) for c in env["CCL_WORKER_AFFINITY"].split(",")]
    assert count == min(len(w) for w in workers) >= 1
    assert len(entries) == size * count
    assert [entries[i * count:(i + 1) * count] for i in range(size)] == [w[:count] for w in workers]
    assert env[envvars.CCL_WORKER_CPUS] == ",".join(map(str, workers[local][:count]))


KEPT = "from your environment kept (cpulaunch planned {}); pass --override-env to use cpulaunch's value"


def test_users_ccl_values_win_with_a_note():
    planned = ccl_env(RankContext("cpulaunch", 0, 2, 0, 2), [(0,), (1,)], dedicated=False, runtime=RUNTIME)
    user = {"CCL_YIELD": "pause", "FI_PROVIDER_PATH": "/mine", "CCL_LOCAL_RANK": "5", "CCL_ATL_SHM": "1"}
    env, notes = ccl_precedence(planned, user, False)
    assert env == {k: v for k, v in planned.items() if k not in ("CCL_YIELD", "FI_PROVIDER_PATH")}
    assert notes == [f"CCL_YIELD=pause {KEPT.format('sched_yield')}",
                     f"FI_PROVIDER_PATH=/mine {KEPT.format(RUNTIME['FI_PROVIDER_PATH'])}"]
    assert ccl_precedence(planned, user, True) == (planned, [])


def test_users_worker_affinity_keeps_the_count_out_too():
    """Count and affinity must agree (oneCCL refuses a list of another length): the user's
    value for one keeps cpulaunch's value of both out, and verify's worker CPUs with them."""
    planned = ccl_env(RankContext("cpulaunch", 0, 2, 0, 2), [(0,), (1,)], dedicated=False)
    env, notes = ccl_precedence(planned, {"CCL_WORKER_AFFINITY": "auto"}, False)
    assert not {"CCL_WORKER_COUNT", "CCL_WORKER_AFFINITY", envvars.CCL_WORKER_CPUS} & set(env)
    assert env["CCL_YIELD"] == "sched_yield"
    assert notes == [f"CCL_WORKER_AFFINITY=auto {KEPT.format('0,1')}",
                     "CCL_WORKER_COUNT not set (cpulaunch planned 1): it must agree with your CCL_WORKER_AFFINITY"]


# --------------------------------------------------------------------------- worker cores from the plan


@pytest.fixture(scope="module")
def xeon(sysroots):
    return probe.probe(sysroots[XEON], core_ids=False)


def ranks(topo, *, backend="ccl", asked="auto", count=None, nproc="socket", engine=None, environ=None, **ddp):
    opts = DdpOptions(nproc_per_node=nproc, backend=asked, ccl_worker_count=count, master_port=29500, **ddp)
    return plan_ranks(topo, Request(), opts, environ or {}, engine=engine, backend=backend, backend_note="b",
                      free_port=None, fabric=FABRIC)


def test_default_sets_one_core_aside_on_each_ranks_node(xeon):
    rp = ranks(xeon)
    assert [(i.cpus, i.ccl_cpus) for i in rp.plan.instances] == [(tuple(range(7)), (7,)), (tuple(range(8, 15)), (15,))]
    env = rp.instance_env[1]
    assert {k: v for k, v in env.items() if k.startswith(("CCL_", "FI_", envvars.CCL_WORKER_CPUS))} == {
        "CCL_WORKER_COUNT": "1", "CCL_WORKER_AFFINITY": "7,15", "CCL_ATL_SHM": "1", "CCL_LOCAL_RANK": "1",
        "CCL_LOCAL_SIZE": "2", "CCL_PROCESS_LAUNCHER": "none", "CCL_ATL_TRANSPORT": "ofi",
        envvars.CCL_WORKER_CPUS: "15", **RUNTIME}
    assert rp.notes == ("b", "oneCCL's rank 0 logs '|CCL_WARN| value of ... changed to be ...' once for each of "
                        "CCL_ATL_SHM, CCL_ATL_TRANSPORT, CCL_LOCAL_RANK, CCL_LOCAL_SIZE, CCL_OFI_LIBRARY_PATH, "
                        "CCL_PROCESS_LAUNCHER (set away from oneCCL's defaults by this plan or by the bindings): "
                        "expected; a relayed console leaves out those naming the planned value (the ranks' logs "
                        "keep them)")


SHARED = "each rank's oneCCL worker runs on the rank's first CPU and yields (CCL_YIELD=sched_yield)"


@pytest.mark.parametrize("asked, count, note", [
    ("auto", None, (f"a core for oneCCL's worker (the default) would leave a rank no core for its OpenMP threads, "
                   f"so no core is set aside; {SHARED}")),
    ("ccl", None, (f"a core for oneCCL's worker (the default) would leave a rank no core for its OpenMP threads, "
                  f"so no core is set aside; {SHARED}")),
    ("auto", 1, (f"--ccl-worker-count 1 (--backend auto) would leave a rank no core for its OpenMP threads, so no "
                f"core is set aside; {SHARED}")),
    ("ccl", 0, f"--ccl-worker-count 0: no core set aside; {SHARED}"),
])
def test_one_core_ranks_run_with_the_worker_on_their_own_cpu(xeon, asked, count, note):
    """16 ranks of one core each: no core to set aside; never CCL_WORKER_COUNT=0."""
    rp = ranks(xeon, asked=asked, count=count, nproc="16")
    assert [i.ccl_cpus for i in rp.plan.instances] == [()] * 16
    env = rp.instance_env[3]
    assert (env["CCL_WORKER_COUNT"], env["CCL_WORKER_AFFINITY"], env["CCL_YIELD"], env[envvars.CCL_WORKER_CPUS]) == (
        "1", ",".join(map(str, range(16))), "sched_yield", "3")
    assert note in rp.notes


def test_explicit_worker_cores_that_do_not_fit_fail_under_backend_ccl(xeon):
    with pytest.raises(PlanError, match=r"^--ccl-worker-count 1 takes 1 core\(s\) from each instance, but instance 0 "
                                        r"has only 1 \(CPUs 0\)"):
        ranks(xeon, asked="ccl", count=1, nproc="16")


def test_gloo_sets_nothing_aside(xeon):
    rp = ranks(xeon, backend="gloo", count=2)
    assert [i.ccl_cpus for i in rp.plan.instances] == [(), ()]
    assert not any(k.startswith("CCL_") for env in rp.instance_env.values() for k in env)


def test_rank_bound_by_its_engine_lists_its_own_worker_per_local_rank(xeon):
    """mpirun bound rank 1 to socket 1: it cannot know rank 0's CPUs, so it lists its own
    worker once per local rank (each rank reads its own slice), never ``auto``."""
    topo = xeon._replace(allowed=frozenset(range(8, 16)), cpuset=xeon.online)
    rp = ranks(topo, engine=RankContext("mpich", 1, 2, 1, 2), nproc=None)
    (inst,) = rp.plan.instances
    assert (inst.cpus, inst.ccl_cpus) == (tuple(range(8, 15)), (15,))
    env = rp.instance_env[1]
    assert (env["CCL_WORKER_AFFINITY"], env["CCL_WORKER_COUNT"], env["CCL_PROCESS_LAUNCHER"],
            env["CCL_ATL_TRANSPORT"]) == ("15,15", "1", "hydra", "ofi")
    assert ("CCL_WORKER_AFFINITY: mpich bound each rank itself, so each rank lists its own worker CPU(s) once per "
            "local rank (oneCCL takes its local rank's slice)") in rp.notes


def test_elastic_and_multi_node_ranks_get_oneccl_variables(xeon):
    elastic = ranks(xeon, rdzv_endpoint="h:1", nnodes="1:2")
    assert [e["CCL_WORKER_AFFINITY"] for e in elastic.instance_env.values()] == ["7,15", "7,15"]
    two = ranks(xeon, nnodes="2", node_rank=1, master_addr="10.0.0.1")
    assert [(e["RANK"], e["CCL_LOCAL_RANK"], e["CCL_LOCAL_SIZE"]) for e in two.instance_env.values()] == [
        ("2", "0", "2"), ("3", "1", "2")]


def test_users_yield_kept_once_with_a_note(xeon):
    rp = ranks(xeon, environ={"CCL_YIELD": "pause"}, nproc="16")
    assert not any("CCL_YIELD" in env for env in rp.instance_env.values())
    assert [n for n in rp.notes if n.startswith("CCL_YIELD")] == [f"CCL_YIELD=pause {KEPT.format('sched_yield')}"]


# --------------------------------------------------------------------------- libfabric's lookup


def test_libfabric_found_as_impi_rt_lays_it_out(tmp_path):
    prefix, conda, other = tmp_path / "prefix", tmp_path / "conda", tmp_path / "other"
    folder = plant_fabric(conda)
    plant_fabric(other)
    env = {"CONDA_PREFIX": str(conda), "LD_LIBRARY_PATH": f"{other / 'lib' / 'libfabric'}:"}
    assert libfinder.find_libfabric(env, str(prefix)) == Fabric(
        folder / "libfabric.so.1", folder / "prov",
        (prefix / "lib" / "libfabric", folder, other / "lib" / "libfabric"))


def test_libfabric_and_providers_are_elf_checked(tmp_path):
    plant_fabric(tmp_path / "a", library=b"not a library")
    b = plant_fabric(tmp_path / "b", provider=b"\x7fELF but short")
    os.mkfifo(b / "prov" / "libshm-fi.so")  # a FIFO in place of a provider is passed over, never opened
    found = libfinder.find_libfabric({"I_MPI_ROOT": str(tmp_path / "a"), "CCL_ROOT": str(tmp_path / "b")},
                                     str(tmp_path / "none"))
    assert (found.library, found.providers, found.usable) == (b / "libfabric.so.1", None, False)


# --------------------------------------------------------------------------- stand-in bindings, end to end

STAND_INS = {
    # name: (__init__.py, metadata version; None: torch's own)
    "works": ("", "2.8.0+xpu"),
    "works-match": ("", None),
    "aborts": ("import os\nos.abort()\n", None),
    "import-error": ("raise ImportError('undefined symbol: _ZN3c104Type')\n", None),
    # Registers "ccl" as the real bindings do at import, with gloo underneath: the ranks'
    # own path (init_process_group imports the bindings, then uses "ccl") runs in CI.
    "registers": (("import torch.distributed as dist\n"
                  "dist.Backend.register_backend('ccl', lambda store, rank, size, timeout: "
                  "dist.ProcessGroupGloo(store, rank, size, timeout), devices=['cpu'])\n"), "2.8.0+xpu"),
}


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    """{name: environment} for each stand-in, sharing one cache folder (each verdict is
    checked once for the module) and one stand-in libfabric (found through I_MPI_ROOT)."""
    base = tmp_path_factory.mktemp("ccl")
    torch_version = host.dist_version("torch") or TORCH
    plant_fabric(base / "impi")
    out = {}
    for name, (body, version) in STAND_INS.items():
        make_stand_in(base / name, body, version or torch_version)
        out[name] = {"PYTHONPATH": str(base / name), "XDG_CACHE_HOME": str(base / "cache"),
                     "I_MPI_ROOT": str(base / "impi")}
    out["missing"] = {"PYTHONPATH": "", "XDG_CACHE_HOME": str(base / "cache"), "I_MPI_ROOT": str(base / "impi")}
    out["no-fabric"] = {**out["works"], "I_MPI_ROOT": str(base / "nowhere")}
    return out


def plan_doc(env, *args, sysroot=None, rc=0):
    where = ("--sysroot", str(sysroot)) if sysroot else ()
    proc = run_cli(*where, "--ddp", "--dry-run", "--format", "json", "--allocator", "default",
                   "--master-port", "29500", *args, "x.py", env=env, timeout=180, check_rc=rc)
    return json.loads(proc.stdout) if rc == 0 else proc


def backend_note(doc) -> str:
    return next(n for n in doc["notes"] if n.startswith("backend "))


@needs_torch
def test_auto_picks_a_working_binding_whatever_its_version(stand_ins, sysroots):
    """Fails before issue 21: "oneccl_bind_pt 2.8.0+xpu does not match torch" -> gloo."""
    doc = plan_doc(stand_ins["works"], sysroot=sysroots[XEON])
    torch_version = host.dist_version("torch")
    assert doc["ddp"]["backend"] == "ccl"
    assert re.fullmatch(re.escape(f"backend ccl: oneccl_bindings_for_pytorch 2.8.0+xpu loads with torch {torch_version} (")
                        + r"(checked in a child process; verdict kept in|cached verdict:) \S+/ccl-binding-\w+\.json"
                        r"(; cpulaunch doctor --clear-cache removes it)?\)", backend_note(doc)), backend_note(doc)
    env = doc["instances"][0]["env"]
    fabric = libfinder.find_libfabric({"I_MPI_ROOT": stand_ins["works"]["I_MPI_ROOT"]})
    assert (env["CCL_OFI_LIBRARY_PATH"], env["FI_PROVIDER_PATH"]) == (str(fabric.library), str(fabric.providers))
    assert (env["CCL_WORKER_AFFINITY"], env["CCL_ATL_SHM"], env["CPULAUNCH_DIST_BACKEND"]) == ("7,15", "1", "ccl")


@needs_torch
def test_auto_never_picks_a_binding_that_aborts_at_import(stand_ins, sysroots):
    """Its metadata matches torch; fails before issue 21 (picked: the ranks abort)."""
    doc = plan_doc(stand_ins["aborts"], sysroot=sysroots[XEON])
    assert doc["ddp"]["backend"] == "gloo"
    assert "does not load with torch" in backend_note(doc)
    assert re.search(r": aborts the interpreter at import \(SIGABRT\) \((checked in a child process; verdict kept in"
                     r"|cached verdict:) \S+\.json(; cpulaunch doctor --clear-cache removes it)?\), so oneCCL is not used$",
                     backend_note(doc)), backend_note(doc)
    assert not any(k.startswith("CCL_") for k in doc["instances"][0]["env"])


@needs_torch
@pytest.mark.parametrize("name, cause", [
    ("aborts", "aborts the interpreter at import (SIGABRT)"),
    ("import-error", "ImportError: undefined symbol: _ZN3c104Type"),
])
def test_backend_ccl_that_does_not_load_is_one_line(stand_ins, sysroots, name, cause):
    """Fails before issue 21 (the version matches: ccl was planned and the ranks died)."""
    proc = plan_doc(stand_ins[name], "--backend", "ccl", sysroot=sysroots[XEON], rc=2)
    (line,) = proc.stderr.splitlines()
    assert line.startswith("cpulaunch: error: --backend ccl: oneccl_bindings_for_pytorch ")
    assert f"does not load with torch {host.dist_version('torch')}: {cause} (" in line
    assert line.endswith("); rebuild it against the installed torch, or use --backend gloo")


def test_missing_binding(stand_ins, sysroots):
    if importlib.util.find_spec("oneccl_bindings_for_pytorch") is not None:
        pytest.skip("oneccl_bindings_for_pytorch is installed in this environment: it cannot be missing")
    doc = plan_doc(stand_ins["missing"], sysroot=sysroots[XEON])
    assert backend_note(doc) == (f"backend gloo: oneccl_bindings_for_pytorch is not installed for {sys.executable}, "
                                 "so oneCCL is not used")
    proc = plan_doc(stand_ins["missing"], "--backend", "ccl", sysroot=sysroots[XEON], rc=2)
    assert proc.stderr.startswith("cpulaunch: error: --backend ccl: oneccl_bindings_for_pytorch is not installed")
    assert len(proc.stderr.splitlines()) == 1


@needs_torch
def test_missing_libfabric(stand_ins, sysroots):
    """Fails before issue 21 (ccl chosen; the first collective fails: "could not open the library")."""
    if libfinder.find_libfabric({}).library is not None:
        pytest.skip(f"a libfabric lies under sys.prefix ({sys.prefix}): it cannot be missing")
    doc = plan_doc(stand_ins["no-fabric"], sysroot=sysroots[XEON])
    assert doc["ddp"]["backend"] == "gloo" and "libfabric" in backend_note(doc)
    proc = plan_doc(stand_ins["no-fabric"], "--backend", "ccl", sysroot=sysroots[XEON], rc=2)
    (line,) = proc.stderr.splitlines()
    assert "pip install impi-rt==2021.14.2, or set CCL_OFI_LIBRARY_PATH and FI_PROVIDER_PATH" in line


@needs_torch
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_auto_runs_two_ranks_on_this_machine(stand_ins):
    """``--ddp --nproc-per-node N --backend auto`` with one core per rank (as on the 2-CPU
    machine of issue 21) picks ccl and plans it. Fails before issue 21 with a binding
    whose version matches: "--ccl-worker-count 1 take 1 core(s) from each instance"."""
    cores = len({frozenset(c.cpus) for c in probe.probe("/", core_ids=False).cores
                 if set(c.cpus) & os.sched_getaffinity(0)})
    doc = plan_doc(stand_ins["works-match"], "--nproc-per-node", str(cores), "--backend", "auto")
    assert doc["ddp"]["backend"] == "ccl"
    envs = [i["env"] for i in doc["instances"]]
    assert [e["CCL_WORKER_COUNT"] for e in envs] == ["1"] * cores
    assert {e["CCL_YIELD"] for e in envs} == {"sched_yield"}
    assert [e["CCL_WORKER_AFFINITY"].split(",")[i] for i, e in enumerate(envs)] == [
        str(inst["cpus"][0]) for inst in doc["instances"]]


RANK_SUM = """
import os, torch, torch.distributed as dist
from cpulaunch.distributed import init_process_group
chosen = init_process_group()
t = torch.full((4,), float(dist.get_rank() + 1))
dist.all_reduce(t)
print("rank", dist.get_rank(), chosen, dist.get_backend(), int(t[0]), os.environ["CCL_YIELD"],
      os.environ["CCL_WORKER_AFFINITY"], flush=True)
dist.destroy_process_group()
"""


@needs_torch
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_ranks_run_ccl_through_a_stand_in_that_registers_it(stand_ins, tmp_path):
    """Without the real bindings (CI): ``--backend auto`` picks a binding that imports, and
    each rank's ``init_process_group`` imports it, which registers "ccl"; the ranks run a
    real all_reduce on "ccl" with the launcher's oneCCL variables."""
    prog = tmp_path / "rank.py"
    prog.write_text(RANK_SUM)
    env = {**stand_ins["registers"], "PYTHONPATH": f"{stand_ins['registers']['PYTHONPATH']}:{REPO}"}
    proc = run_cli("--ddp", "--nproc-per-node", "2", "--backend", "auto", "--core-list",
                   ",".join(map(str, sorted(os.sched_getaffinity(0))[:2])), sys.executable, str(prog),
                   env=env, timeout=300)
    cpus = sorted(os.sched_getaffinity(0))[:2]
    lines = sorted(ln.split("rank ", 1)[1] for ln in proc.stdout.splitlines() if "rank " in ln)
    assert lines == [f"{r} ccl ccl 3 sched_yield {cpus[0]},{cpus[1]}" for r in (0, 1)]


#: A stand-in that logs on rank 0 what oneCCL 2021.14 logged there in a real 2-rank run
#: under cpulaunch (docs/dev/oneccl.md, "Threads of a ccl rank"), in its order and format,
#: plus a change to a value nobody planned and another warning: those two stay on the console.
WARNS = """
import os
if os.environ.get("RANK") == "0":
    for k, d in (("CCL_ATL_TRANSPORT", "mpi"), ("CCL_ATL_SHM", "0"), ("CCL_YIELD", "pause"), ("CCL_LOCAL_RANK", "-1"),
                 ("CCL_LOCAL_SIZE", "-1"), ("CCL_PROCESS_LAUNCHER", "hydra"), ("CCL_OFI_LIBRARY_PATH", "")):
        print(f"2026:11:27-21:15:17:( {os.getpid()}) |CCL_WARN| value of {k} changed to be {os.environ[k]} "
              f"(default:{d})", flush=True)
    print("|CCL_WARN| value of CCL_WORKER_COUNT changed to be 3 (default:1)", flush=True)
    print("|CCL_WARN| another warning", flush=True)
"""


@needs_torch
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_oneccls_warnings_about_planned_values_fold_into_one_note(tmp_path):
    """Rank 0 logs seven '|CCL_WARN| value of CCL_... changed' lines (one per variable the
    plan or the bindings set away from oneCCL's defaults): the plan names the seven in one
    note; the relayed console leaves them out; a change to another value and any other
    warning stay; rank 0's log keeps every line."""
    _, env = own_stand_in(tmp_path, WARNS)
    seven = ["CCL_ATL_SHM", "CCL_ATL_TRANSPORT", "CCL_LOCAL_RANK", "CCL_LOCAL_SIZE", "CCL_OFI_LIBRARY_PATH",
             "CCL_PROCESS_LAUNCHER", "CCL_YIELD"]
    note = (f"oneCCL's rank 0 logs '|CCL_WARN| value of ... changed to be ...' once for each of {', '.join(seven)} "
            "(set away from oneCCL's defaults by this plan or by the bindings): expected; a relayed console leaves "
            "out those naming the planned value (the ranks' logs keep them)")
    args = ("--ddp", "--nproc-per-node", "2", "--backend", "ccl", "--allocator", "default", "--core-list",
            ",".join(map(str, sorted(os.sched_getaffinity(0))[:2])))
    plan = json.loads(run_cli(*args, "--dry-run", "--format", "json", "x.py", env=env, timeout=180).stdout)
    assert plan["notes"].count(note) == 1
    proc = run_cli(*args, "-v", "--log-dir", str(tmp_path / "logs"), sys.executable, "-c",
                   "import oneccl_bindings_for_pytorch", env=env, timeout=300)  # -v: the note explains, issue 40
    assert [ln for ln in proc.stdout.splitlines() if "CCL_WARN" in ln] == [
        "[0] |CCL_WARN| value of CCL_WORKER_COUNT changed to be 3 (default:1)", "[0] |CCL_WARN| another warning"]
    assert f"cpulaunch: note: {note}" in proc.stderr
    (log,) = (tmp_path / "logs").glob("*/0/stdout.log")
    assert sum("changed to be" in ln for ln in log.read_text().splitlines()) == 8


def test_expected_warning_names_the_planned_value_only():
    expected = ccl_expected_warning({"CCL_YIELD": "sched_yield", "CCL_OFI_LIBRARY_PATH": "/v/lib/libfabric.so.1"})
    assert expected(b"|CCL_WARN| value of CCL_YIELD changed to be sched_yield (default:pause)")
    # as oneCCL 2021.14 wrote it in a real run: time, "( pid)", an empty default
    assert expected(b"2026:11:27-21:15:17:( 5790) |CCL_WARN| value of CCL_OFI_LIBRARY_PATH changed to be "
                    b"/v/lib/libfabric.so.1 (default:)")
    assert not expected(b"|CCL_WARN| value of CCL_YIELD changed to be pause (default:sched_yield)")
    assert not expected(b"|CCL_WARN| value of CCL_ATL_SHM changed to be 1 (default:0)")  # not planned here
    assert not expected(b"|CCL_WARN| did not find MPI-launcher specific variables")
    assert ccl_changed({"CCL_WORKER_COUNT": "1", "CCL_YIELD": "sched_yield", "CCL_ATL_TRANSPORT": "ofi"}) == [
        "CCL_ATL_TRANSPORT", "CCL_YIELD"]
    # measured: oneCCL never logs CCL_WORKER_AFFINITY; it logs CCL_OFI_LIBRARY_PATH (default empty)
    assert ccl_changed({"CCL_WORKER_AFFINITY": "0,1", "CCL_OFI_LIBRARY_PATH": "/p/libfabric.so.1"}) == [
        "CCL_OFI_LIBRARY_PATH"]


@needs_torch
def test_doctor_runs_the_collective_of_a_binding_that_registers_ccl(stand_ins):
    code, ccl, found = doctor(stand_ins["registers"])
    assert (code, ccl["loads"], ccl["collective"], ccl["collective_error"]) == (0, True, True, None)
    assert found["ccl-collective"]["severity"] == "ok"


@needs_torch
def test_dry_run_shows_the_users_values_kept(stand_ins, sysroots):
    env = {**stand_ins["works"], "CCL_YIELD": "pause", "CCL_WORKER_AFFINITY": "auto"}
    doc = plan_doc(env, "--nproc-per-node", "16", sysroot=sysroots[XEON])
    assert not {"CCL_YIELD", "CCL_WORKER_AFFINITY", "CCL_WORKER_COUNT"} & set(doc["instances"][0]["env"])
    assert f"CCL_YIELD=pause {KEPT.format('sched_yield')}" in doc["notes"]
    forced = plan_doc(env, "--nproc-per-node", "16", "--override-env", sysroot=sysroots[XEON])
    assert forced["instances"][0]["env"]["CCL_YIELD"] == "sched_yield"


@needs_torch
def test_the_ranks_interpreter_is_the_one_checked(stand_ins, sysroots, tmp_path):
    """``cpulaunch ... python3 train.py``: the ranks run ``python3`` from PATH; a python
    that does not see the bindings is no ccl run, whatever the launcher's own python sees."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    other = bin_dir / "python3"
    # The interpreter's own file, not a venv's link to it: the base environment, without
    # the stand-in (PYTHONPATH) or a venv's real bindings.
    other.write_text(f"#!/bin/sh\nunset PYTHONPATH\nexec {os.path.realpath(sys.executable)} \"$@\"\n")
    other.chmod(0o755)
    env = {**stand_ins["works"], "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    proc = run_cli("--sysroot", str(sysroots[XEON]), "--ddp", "--dry-run", "--format", "json", "python3", "t.py",
                   env=env, timeout=180)
    assert backend_note(json.loads(proc.stdout)).startswith(
        f"backend gloo: oneccl_bindings_for_pytorch is not installed for {other}")
    assert host.rank_python(["python3", "t.py"], env) == str(other)
    assert host.rank_python(["t.py"], env) == host.rank_python(["-m", "pkg"], env) == sys.executable


# --------------------------------------------------------------------------- the cached verdict


def own_stand_in(tmp_path: Path, body: str = "") -> tuple:
    """(its package folder, the environment): a working stand-in, its own cache folder
    and a stand-in libfabric."""
    plant_fabric(tmp_path / "impi")
    pkg = make_stand_in(tmp_path / "site", body, "2.8.0+xpu")
    return pkg, {"PYTHONPATH": str(tmp_path / "site"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
                 "I_MPI_ROOT": str(tmp_path / "impi")}


@needs_torch
def test_verdict_checked_once_per_build(tmp_path, sysroots):
    """The import runs in a child once; a rebuilt binding (another size or mtime) is checked again."""
    counter = tmp_path / "imports"
    pkg, env = own_stand_in(tmp_path, f"open({str(counter)!r}, 'a').write('x')\n")
    for _ in range(2):
        plan_doc(env, sysroot=sysroots[XEON])
    assert counter.read_text() == "x"
    (cached,) = (tmp_path / "cache" / "cpulaunch").glob("ccl-binding-*.json")
    assert json.loads(cached.read_text())["loads"] is True
    (pkg / "__init__.py").write_text((pkg / "__init__.py").read_text() + "# rebuilt\n")
    plan_doc(env, sysroot=sysroots[XEON])
    assert counter.read_text() == "xx"


@needs_torch
def test_cache_is_never_written_through_a_planted_link(tmp_path, sysroots):
    _, env = own_stand_in(tmp_path)
    plan_doc(env, sysroot=sysroots[XEON])
    (entry,) = (tmp_path / "cache" / "cpulaunch").glob("ccl-binding-*.json")
    victim = tmp_path / "victim"
    victim.write_text('{"key": {}, "loads": true, "why": ""}')  # a verdict for another key: not taken
    entry.unlink()
    entry.symlink_to(victim)
    doc = plan_doc(env, sysroot=sysroots[XEON])
    assert backend_note(doc).endswith(f"(checked in a child process; verdict kept in {entry})")
    assert victim.read_text() == '{"key": {}, "loads": true, "why": ""}'
    assert entry.is_file() and not entry.is_symlink()


@needs_torch
def test_an_unusable_cache_folder_costs_only_the_check(tmp_path, sysroots):
    _, env = own_stand_in(tmp_path)
    (tmp_path / "file").write_text("")
    env["XDG_CACHE_HOME"] = str(tmp_path / "file")
    doc = plan_doc(env, sysroot=sysroots[XEON])
    assert doc["ddp"]["backend"] == "ccl" and (tmp_path / "file").read_text() == ""


#: A stand-in whose import fails unless LD_LIBRARY_PATH holds a folder named "fixed" (as a
#: real binding fails without oneCCL's library folder on the loader's path).
NEEDS_FIXED = ("import os\n"
               "if 'fixed' not in [os.path.basename(p) for p in os.environ.get('LD_LIBRARY_PATH', '').split(':')]:\n"
               "    raise ImportError('libccl.so.1: cannot open shared object file: No such file or directory')\n")


@needs_torch
def test_a_fixed_environment_changes_the_verdict(tmp_path, sysroots):
    """The same binding fails under one LD_LIBRARY_PATH and loads under another: the failure
    is cached under its own environment only (before issue 34 the second run was refused with
    the stale reason); the note and the error name the cache file, and doctor --clear-cache
    removes it."""
    _, env = own_stand_in(tmp_path, NEEDS_FIXED)
    broken = {**env, "LD_LIBRARY_PATH": str(tmp_path / "broken")}
    note = backend_note(plan_doc(broken, sysroot=sysroots[XEON]))
    (kept,) = (tmp_path / "cache" / "cpulaunch").glob("ccl-binding-*.json")
    assert note.startswith("backend gloo: oneccl_bindings_for_pytorch 2.8.0+xpu (") and "libccl.so.1: cannot open" in note
    assert note.endswith(f"(checked in a child process; verdict kept in {kept}), so oneCCL is not used")
    assert stat_mode(kept) == 0o600 and stat_mode(kept.parent) == 0o700
    proc = plan_doc(broken, "--backend", "ccl", sysroot=sysroots[XEON], rc=2)
    assert f"(cached verdict: {kept}; cpulaunch doctor --clear-cache removes it); rebuild it" in proc.stderr
    fixed = {**env, "LD_LIBRARY_PATH": str(tmp_path / "fixed")}
    doc = plan_doc(fixed, sysroot=sysroots[XEON])
    assert doc["ddp"]["backend"] == "ccl" and "checked in a child process" in backend_note(doc)
    assert len(list(kept.parent.glob("ccl-binding-*.json"))) == 2
    out = run_cli("doctor", "--clear-cache", env=fixed).stdout
    assert out == f"removed 2 cached oneCCL verdict(s) from {kept.parent}\n"
    assert list(kept.parent.iterdir()) == []


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def planted(folder: Path, env: dict, loads: bool) -> Path:
    """A verdict for the exact key a run with ``env`` computes, planted in ``folder``."""
    full = {**os.environ, **env}
    pkg = Path(env["PYTHONPATH"]) / "oneccl_bindings_for_pytorch"
    key = host.verdict_key(sys.executable, host.dist_version("torch"), pkg, full)
    path = folder / host.verdict_name(key)
    path.write_text(json.dumps({"key": key, "loads": loads, "why": "planted"}))
    return path


@needs_torch
@pytest.mark.parametrize("how", ["another-users-folder", "group-writable-folder", "world-writable-file"])
def test_a_planted_verdict_is_ignored(tmp_path, sysroots, how):
    """A failing binding and a verdict saying it loads, for its exact key: in a folder of
    another user's (root with a user's HOME, as under sudo -E), in a folder of ours that
    others may write, or in a file of ours that others may write. The run checks for itself
    and keeps to gloo; it writes its own verdict only in a folder of its own alone."""
    _, env = own_stand_in(tmp_path, NEEDS_FIXED)
    folder = tmp_path / "cache" / "cpulaunch"
    folder.mkdir(parents=True, mode=0o700)
    path = planted(folder, env, loads=True)
    if how == "another-users-folder":
        if os.geteuid() != 0:
            pytest.skip("plants as another user: needs root")
        os.chown(folder, 65534, 65534)
        os.chown(path, 65534, 65534)
    elif how == "group-writable-folder":
        folder.chmod(0o770)
    else:
        path.chmod(0o666)
    before = path.read_text()
    note = backend_note(plan_doc(env, sysroot=sysroots[XEON]))
    assert note.startswith("backend gloo: ") and "libccl.so.1: cannot open" in note, note
    if how == "world-writable-file":  # our own folder: the file is replaced by our own verdict (0600)
        assert note.endswith(f"(checked in a child process; verdict kept in {path}), so oneCCL is not used")
        assert stat_mode(path) == 0o600 and json.loads(path.read_text())["loads"] is False
    else:  # not ours alone: neither read nor written
        assert note.endswith("(checked in a child process), so oneCCL is not used")
        assert path.read_text() == before


@needs_torch
def test_a_link_planted_at_the_cache_folder_is_never_written_through(tmp_path, sysroots):
    """~/.cache/cpulaunch is a link to a folder of someone else's choosing: nothing is read
    from it or written into it, and doctor --clear-cache removes nothing there."""
    _, env = own_stand_in(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "cpulaunch").symlink_to(elsewhere)
    keep = planted(elsewhere, env, loads=False)
    doc = plan_doc(env, sysroot=sysroots[XEON])
    assert doc["ddp"]["backend"] == "ccl" and backend_note(doc).endswith("(checked in a child process)")
    assert list(elsewhere.iterdir()) == [keep]
    assert run_cli("doctor", "--clear-cache", env=env).stdout.startswith("removed 0 cached oneCCL verdict(s)")
    assert keep.exists()


def test_cache_folder_follows_xdg():
    assert host.cache_dir({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == Path("/c/cpulaunch")
    assert host.cache_dir({"XDG_CACHE_HOME": "rel", "HOME": "/h"}) == Path("/h/.cache/cpulaunch")
    assert host.cache_dir({}) is None


# --------------------------------------------------------------------------- doctor and verify


def doctor(env) -> tuple:
    proc = run_cli("doctor", "--format", "json", env=env, timeout=300, check_rc=None)
    doc = json.loads(proc.stdout)
    return proc.returncode, doc["ccl"], {f["id"]: f for f in doc["findings"] if f["id"].startswith("ccl-")}


@needs_torch
def test_doctor_reports_a_binding_that_does_not_load(stand_ins):
    code, ccl, found = doctor(stand_ins["aborts"])
    assert (code, ccl["loads"], ccl["why"], ccl["collective"]) == (0, False, "aborts the interpreter at import (SIGABRT)",
                                                                   None)
    assert found["ccl-binding"]["severity"] == "warn" and set(found) == {"ccl-binding"}


@needs_torch
def test_doctor_tries_a_collective_and_says_why_it_failed(stand_ins):
    """The stand-in imports but registers no "ccl" backend: the one-rank all_reduce fails,
    an error (``--backend auto`` would choose ccl)."""
    code, ccl, found = doctor(stand_ins["works"])
    assert (code, ccl["loads"], ccl["collective"]) == (1, True, False)
    assert found["ccl-collective"]["severity"] == "error"
    assert "ccl" in found["ccl-collective"]["summary"] and ccl["collective_error"]
    assert ccl["env"]["CCL_YIELD"] == "sched_yield" and ccl["env"]["CCL_WORKER_COUNT"] == "1"


def _thread(tid, cpus, seconds=1.0):
    return procfs.ThreadView(tid=tid, name="python", state="S", cpus=frozenset(cpus), cpu_seconds=seconds)


def _view(cpus, threads):
    return procfs.ProcessView(pid=10, ppid=1, name="python", cmdline=(), cpus=frozenset(cpus), threads=tuple(threads),
                              libraries=(), numa=None, environ={})


def test_verify_names_the_workers_and_does_not_count_a_planned_shared_cpu_twice():
    exp = verify.Expected.from_environ({envvars.CPUS: "0-1", envvars.CCL_WORKER_CPUS: "0"})
    assert exp.ccl_workers == (0,)
    # Intel OpenMP pins the main thread to CPU 0, where the plan put the worker too.
    view = _view({0, 1}, [_thread(10, {0}), _thread(11, {1}), _thread(12, {0})])
    assert verify.ccl_worker_threads(exp, view) == (10, 12)
    assert verify.compare(exp, view) == []
    extra = _view({0, 1}, [_thread(10, {0}), _thread(11, {0}), _thread(12, {0})])
    assert verify.compare(exp, extra) == [
        "pid 10: 2 busy threads pinned to CPU 0 alone (threads 10, 11): they take turns on one CPU"]
    crowded = _view({0, 1}, [_thread(t, {0, 1}) for t in (10, 11, 12, 13)])
    assert verify.compare(exp, crowded) == [
        ("pid 10: 4 busy threads (of 4 threads in 1 process(es)) on 2 CPU(s) 0-1 and the oneCCL worker sharing "
        "CPU 0: oversubscribed (set OMP_NUM_THREADS / torch.set_num_threads and DataLoader num_workers to fit)")]
    assert verify.ccl_worker_threads(exp, _view({0}, [_thread(10, {0})])) is None  # one CPU: cannot tell
    assert verify.ccl_worker_threads(verify.Expected(), view) is None


def _rank_env(cpus: str, workers: str, backend: str = "ccl") -> dict:
    """A ccl rank's CPULAUNCH_* variables as the launcher writes them (docs/guide/ddp.md)."""
    return {envvars.CPUS: cpus, envvars.BOUND_CPUS: cpus, envvars.CCL_WORKER_CPUS: workers,
            envvars.DIST_BACKEND: backend}


def _real_rank(cpu: int, *, progress: tuple) -> list:
    """The threads of a real ccl rank on one CPU, as read from /proc/PID/task/*/stat and
    status during an all_reduce loop (oneCCL 2021.14.1, 2 ranks x 1 core; docs/dev/oneccl.md,
    "Threads of a ccl rank"): every one is named "python" and may run on the rank's CPU
    only. CPU seconds and ages after 37 s; libfabric's progress thread had 0.008 s then,
    ``progress`` = (its CPU seconds, its age) as another run may find it (0.2 s after 12-16
    minutes)."""
    return [procfs.ThreadView(407, "python", "S", frozenset({cpu}), 10.83, 37.0),  # the program's main thread
            procfs.ThreadView(426, "python", "R", frozenset({cpu}), 3.66, 35.0),   # the bindings' completion thread
            procfs.ThreadView(433, "python", "S", frozenset({cpu}), 0.0001, 34.3),  # oneCCL's key-value-store server
            procfs.ThreadView(441, "python", "S", frozenset({cpu}), *progress),  # libfabric's (psm3) progress thread
            procfs.ThreadView(442, "python", "R", frozenset({cpu}), 15.10, 33.5)]  # oneCCL's worker


def _rank_view(cpus, threads):
    return procfs.ProcessView(pid=407, ppid=1, name="python", cmdline=(), cpus=frozenset(cpus),
                              threads=tuple(threads), libraries=(), numa=None, environ={})


COMPLETION, PROGRESS = "the bindings' completion thread", "libfabric's progress thread"
OVER = ": oversubscribed (set OMP_NUM_THREADS / torch.set_num_threads and DataLoader num_workers to fit)"


def test_a_ccl_rank_on_one_cpu_is_what_the_plan_accounts_for():
    """The measured rank: its main thread, oneCCL's worker sharing its one CPU and the
    bindings' completion thread busy (3 on 1 CPU), later libfabric's progress thread too,
    at 0.03% of a CPU. The old rule allowed 2 ("3 busy threads ... oversubscribed"); all
    are planned. A busy thread of the program's own is still one too many, and so is a
    quiet busy thread whose age is unknown."""
    exp = verify.Expected.from_environ(_rank_env("1", "1"))
    assert verify.planned_threads(exp) == verify.Planned(workers=(1,), shared=(1,), yielding=(COMPLETION,),
                                                         idle=(PROGRESS,))
    for progress in ((0.008, 34.0), (0.25, 960.0)):
        view = _rank_view({1}, _real_rank(1, progress=progress))
        assert verify.compare(exp, view) == []
        assert verify.planned_threads(exp).idle_threads(view) == (frozenset({441}) if progress[0] > 0.2 else frozenset())
    own = procfs.ThreadView(450, "python", "R", frozenset({1}), 2.0, 10.0)
    assert verify.compare(exp, _rank_view({1}, _real_rank(1, progress=(0.25, 960.0)) + [own])) == [
        "pid 407: 4 busy threads (of 6 threads in 1 process(es)) on 1 CPU(s) 1 and the oneCCL worker sharing CPU 1 "
        f"and the bindings' completion thread{OVER}"]
    assert verify.compare(exp, _rank_view({1}, _real_rank(1, progress=(0.25, None)))) == [
        "pid 407: 4 busy threads (of 5 threads in 1 process(es)) on 1 CPU(s) 1 and the oneCCL worker sharing CPU 1 "
        f"and the bindings' completion thread{OVER}"]


@needs_torch
def test_the_same_expectation_from_the_plan_and_from_the_ranks_variables(stand_ins, sysroots, monkeypatch):
    """--verify (the rendered plan) and ``cpulaunch verify PID`` (the rank's variables)
    expect the same of a ccl rank: its worker CPUs and its backend, hence the same
    planned threads."""
    import cpulaunch

    monkeypatch.syspath_prepend(stand_ins["works"]["PYTHONPATH"])  # installed for this interpreter
    rendered = cpulaunch.plan_instances(("x.py",), environ={**os.environ, **stand_ins["works"]}, ddp=True,
                                        nproc_per_node=2, backend="ccl", ccl_worker_count=0, allocator="default",
                                        master_port=29500, sysroot=str(sysroots[XEON]))
    for inst in rendered.instances:
        from_plan = verify.Expected.from_rendered(inst, allocator=None, omp_runtime=None)
        from_env = verify.Expected.from_environ(inst.env)
        assert (from_plan.backend, from_plan.ccl_workers) == (from_env.backend, from_env.ccl_workers) == (
            "ccl", (min(inst.cpus),))
        assert verify.planned_threads(from_plan) == verify.planned_threads(from_env)
        assert verify.planned_threads(from_env).helpers == ("the bindings' completion thread",
                                                           "libfabric's progress thread")


def test_helpers_pinned_where_the_main_thread_was_are_not_stacked():
    """A rank on CPUs 0-1 whose main thread OpenMP pinned to CPU 0, where its worker is
    planned too: the worker and the helpers started after that inherit CPU 0; the planned
    ones are not "busy threads pinned to CPU 0 alone"; a program thread more is."""
    exp = verify.Expected.from_environ(_rank_env("0-1", "0"))
    progress = procfs.ThreadView(14, "python", "S", frozenset({0}), 0.25, 1000.0)
    threads = [_thread(10, {0}), _thread(11, {1}), _thread(12, {0}), _thread(13, {0}), progress]
    assert verify.compare(exp, _view({0}, threads)) == []
    assert verify.compare(exp, _view({0}, threads + [_thread(15, {0})])) == [
        "pid 10: 2 busy threads pinned to CPU 0 alone (threads 10, 12): they take turns on one CPU",
        "pid 10: 5 busy threads (of 6 threads in 1 process(es)) on 2 CPU(s) 0-1 and the oneCCL worker sharing CPU 0 "
        f"and the bindings' completion thread{OVER}"]


def test_a_completion_thread_that_spins_is_not_planned():
    """Workers on cores of their own: the plan leaves oneCCL's wait at its default (pause),
    so the bindings' completion thread spins on the compute CPU through every collective
    (measured: 3.9 s of CPU in 8 s, as much as the main thread). Only libfabric's progress
    thread is planned beside the CPUs, and it is told apart by its share of a CPU: the
    spinning thread is reported from the start, and still once the progress thread is busy."""
    exp = verify.Expected.from_environ(_rank_env("0-1", "1") | {envvars.CPUS: "0"})
    assert verify.planned_threads(exp) == verify.Planned(workers=(1,), idle=(PROGRESS,))
    main, worker = procfs.ThreadView(10, "python", "S", frozenset({0}), 4.2, 8.5), _thread(12, {1})
    completion = procfs.ThreadView(11, "python", "R", frozenset({0}), 3.9, 8.0)
    assert verify.compare(exp, _view({0}, [main, worker])) == []
    stacked = "pid 10: 2 busy threads pinned to CPU 0 alone (threads 10, 11): they take turns on one CPU"
    assert verify.compare(exp, _view({0}, [main, completion, worker])) == [
        stacked, f"pid 10: 3 busy threads (of 3 threads in 1 process(es)) on 2 CPU(s) 0-1{OVER}"]
    progress = procfs.ThreadView(13, "python", "S", frozenset({0}), 0.25, 1000.0)
    assert verify.compare(exp, _view({0}, [main, completion, worker, progress])) == [
        stacked, f"pid 10: 3 busy threads (of 4 threads in 1 process(es)) on 2 CPU(s) 0-1{OVER}"]


def test_no_ccl_helpers_without_the_ccl_backend():
    for env in (_rank_env("0", "0", backend="gloo"), {envvars.CPUS: "0", envvars.CCL_WORKER_CPUS: "0"}):
        exp = verify.Expected.from_environ(env)
        assert verify.planned_threads(exp).helpers == ()
        assert verify.compare(exp, _view({0}, [_thread(10, {0}), _thread(11, {0})])) == []  # the worker
        assert len(verify.compare(exp, _view({0}, [_thread(t, {0}) for t in (10, 11, 12)]))) == 1


#: A stand-in for the bindings whose ``start()`` starts what a real ccl rank runs by its first
#: collective, with the CPU pattern read from /proc in real runs (docs/dev/oneccl.md,
#: "Threads of a ccl rank"): the bindings' completion thread and oneCCL's worker (pinned to this
#: rank's entry of CCL_WORKER_AFFINITY) yield until each has used 0.3 s of CPU, as they do
#: within seconds of an all_reduce loop; libfabric's progress thread wakes every 110 ms and
#: stays far below 200 ms (it takes 12-16 minutes to get there); oneCCL's key-value-store
#: server stays idle. Threads Python 3.11 starts carry the program's name, as oneCCL's do.
THREADS = """
import os, threading, time

def _spin(done, cpu=None):
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})  # this thread only, as oneCCL pins its worker
    while time.thread_time() < 0.3:
        os.sched_yield()
    done.set()
    threading.Event().wait()

def _poll():  # wakes every 110 ms and does nothing, as psm3's does
    while True:
        time.sleep(0.11)

def start():
    count, local = int(os.environ["CCL_WORKER_COUNT"]), int(os.environ["CCL_LOCAL_RANK"])
    mine = [int(c) for c in os.environ["CCL_WORKER_AFFINITY"].split(",")][local * count:(local + 1) * count]
    done = [threading.Event() for _ in range(1 + len(mine))]
    threading.Thread(target=_spin, args=(done[0],), daemon=True).start()  # the bindings' completion thread
    threading.Thread(target=threading.Event().wait, daemon=True).start()  # oneCCL's key-value-store server
    threading.Thread(target=_poll, daemon=True).start()  # libfabric's progress thread
    for cpu, d in zip(mine, done[1:]):
        threading.Thread(target=_spin, args=(d, cpu), daemon=True).start()  # oneCCL's workers
    for d in done:
        d.wait()
"""

#: A rank that starts the stand-in's threads, says so, and waits until the test opens and
#: closes its FIFO (argv[1] + RANK).
HELD_RANK = """
import os, sys
import oneccl_bindings_for_pytorch
oneccl_bindings_for_pytorch.start()
print("ready", os.getpid(), flush=True)
with open(sys.argv[1] + os.environ["RANK"]) as hold:
    hold.read()
"""


def _ready_ranks(proc, n: int, seconds: float) -> dict:
    """{rank: pid} from the relayed ``[r] ready PID`` lines of ``n`` ranks, waited for at most ``seconds``."""
    deadline, pids = time.monotonic() + seconds, {}
    while len(pids) < n:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"ranks {sorted(set(range(n)) - set(pids))} not ready in {seconds:g} s"
        line = proc.stdout.readline()
        assert line, f"the launcher ended ({proc.wait()}) before every rank was ready: {proc.stderr.read()[-2000:]}"
        m = re.fullmatch(r"\[(\d+)\] ready (\d+)\n", line)
        if m:
            pids[int(m.group(1))] = int(m.group(2))
    return pids


def _release(fifo: Path, seconds: float = 60) -> None:
    """Open ``fifo`` for writing once its rank has it open for reading, and close it (EOF)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            return
        except OSError as exc:  # ENXIO: no reader yet
            assert time.monotonic() < deadline, f"nobody opened {fifo} in {seconds:g} s ({exc})"
            time.sleep(0.05)


def _wait_file(pattern: str, base: Path, proc, seconds: float) -> Path:
    """The first file matching ``pattern`` below ``base`` once it exists (the launcher writes it)."""
    deadline = time.monotonic() + seconds
    while True:
        found = sorted(base.glob(pattern))
        if found:
            return found[0]
        assert proc.poll() is None and time.monotonic() < deadline, f"no {pattern} in {base} after {seconds:g} s"
        time.sleep(0.1)


HELPERS = {"planned": ["the bindings' completion thread", "libfabric's progress thread"], "idle_threads": []}


@needs_torch
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_verify_counts_a_ccl_ranks_own_threads_as_planned(tmp_path):
    """Issue 34 part 5 without the real bindings: 2 ranks x 1 CPU on ccl (each rank's
    oneCCL worker shares its CPU), each running the threads a real rank runs. ``cpulaunch
    verify PID PID`` exits 0 (it said "3 busy threads ... oversubscribed" and exited 1), and
    the run's own --verify, taken once the ranks are ready, says ok of the same threads."""
    _, env = own_stand_in(tmp_path, THREADS)
    prog, hold = tmp_path / "rank.py", tmp_path / "hold"
    prog.write_text(HELD_RANK)
    for r in (0, 1):
        os.mkfifo(f"{hold}{r}")
    cpus = sorted(os.sched_getaffinity(0))[:2]
    proc = subprocess.Popen([sys.executable, "-m", "cpulaunch", "--ddp", "--nproc-per-node", "2", "--backend", "ccl",
                             "--core-list", f"{cpus[0]},{cpus[1]}", "--verify", "--verify-after", "10",
                             "--log-dir", str(tmp_path / "logs"), sys.executable, str(prog), str(hold)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, **env})
    try:
        pids = _ready_ranks(proc, 2, 180)
        text = run_cli("verify", str(pids[0]), str(pids[1]), check_rc=None)
        assert text.returncode == 0, text.stdout
        doc = json.loads(run_cli("verify", "--format", "json", str(pids[0]), str(pids[1])).stdout)
        run_verify = json.loads(_wait_file("*/verify.json", tmp_path / "logs", proc, 120).read_text())
        for r in (0, 1):
            _release(Path(f"{hold}{r}"))
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    for seen in (doc, run_verify):
        assert seen["ok"] is True, seen["warnings"]
        assert [(i["pid"], i["status"], i["process"]["thread_count"], i["process"]["busy_threads"],
                 i["ccl_workers"], i["ccl_helpers"]) for i in seen["instances"]] == [
            (pids[r], "ok", 5, 3, {"planned": str(cpus[r]), "threads": None}, HELPERS) for r in (0, 1)]
    assert ("  also planned in a ccl rank: the bindings' completion thread (one busy thread more allowed) and "
            "libfabric's progress thread (no busy thread under 1% of a CPU since it started, not counted)"
            in text.stdout.splitlines())


# --------------------------------------------------------------------------- the real binding


@pytest.fixture(scope="module")
def real_binding():
    """The installed bindings when they load with this torch and libfabric is found; else
    the module's real-binding tests skip with the reason."""
    binding = host.ccl_binding(sys.executable, dict(os.environ), host.cache_dir(os.environ))
    if binding.path is None:
        pytest.skip(f"oneccl_bindings_for_pytorch is not installed for {sys.executable} (docs/guide/ddp.md)")
    if not binding.loads:
        pytest.skip(f"oneccl_bindings_for_pytorch does not load with this torch: {binding.why}")
    if not libfinder.find_libfabric().usable:
        pytest.skip("oneCCL's libfabric and its providers are not found (pip install impi-rt==2021.14.2)")
    return binding


TRAIN = [sys.executable, str(REPO / "examples" / "train_ddp.py"), "--model", "cnn", "--size", "small", "--steps", "3",
         "--global-batch-size", "8", "--json"]
two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")


def train_records(proc) -> dict:
    return {r["rank"]: r for r in json_records(proc.stdout) if "param_sha256" in r}


@pytest.mark.slow
@two_cpus
def test_real_ccl_training_ends_where_gloo_does(real_binding):
    runs = {b: run_cli("--ddp", "--nproc-per-node", "2", "--backend", b, *TRAIN, timeout=600)
            for b in ("ccl", "gloo", "auto")}
    recs = {b: train_records(p) for b, p in runs.items()}
    assert {b: sorted((r["rank"], r["backend"]) for r in rs.values()) for b, rs in recs.items()} == {
        "ccl": [(0, "ccl"), (1, "ccl")], "gloo": [(0, "gloo"), (1, "gloo")], "auto": [(0, "ccl"), (1, "ccl")]}
    shas = {r["param_sha256"] for rs in recs.values() for r in rs.values()}
    assert len(shas) == 1  # bitwise equal to gloo's


@pytest.mark.slow
@two_cpus
def test_real_two_nodes_on_loopback(real_binding):
    port = host.free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "cpulaunch", "--ddp", "--nnodes", "2", "--node-rank", str(n),
                               "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
                               "--core-list", str(sorted(os.sched_getaffinity(0))[n]), "--backend", "ccl", *TRAIN],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in (0, 1)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    recs = [r for out, _ in outs for r in json_records(out) if "param_sha256" in r]
    assert sorted((r["rank"], r["world_size"], r["backend"]) for r in recs) == [(0, 2, "ccl"), (1, 2, "ccl")]
    assert len({r["param_sha256"] for r in recs}) == 1


@pytest.mark.slow
def test_real_doctor_starts_a_collective(real_binding):
    _code, ccl, found = doctor({})
    assert (ccl["loads"], ccl["collective"]) == (True, True), ccl
    assert found["ccl-collective"]["severity"] == "ok"


RANK_PROGRAM = """
import os, sys, torch, torch.distributed as dist
from cpulaunch.distributed import init_process_group
init_process_group()
x = torch.ones(1 << 14)
dist.all_reduce(x)
print("ready", os.getpid(), flush=True)
while not sys.stdin.readline() == "":  # until the test closes stdin
    pass
dist.destroy_process_group()
"""


def _ready_pid(proc, seconds: float) -> int:
    """The pid on the rank's ``ready PID`` line (oneCCL writes its CCL_WARN lines to stdout
    too), waited for at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"the rank did not finish its first collective in {seconds:g} s"
        line = proc.stdout.readline()
        assert line, f"the rank exited ({proc.wait()}) before its first collective"
        if line.startswith("ready "):
            return int(line.split()[1])


@pytest.mark.slow
@two_cpus
def test_real_verify_sees_the_worker_on_its_own_core(real_binding, tmp_path):
    """One rank, one core set aside for oneCCL's worker: after the first collective, verify
    sees a thread pinned to exactly that core."""
    prog = tmp_path / "rank.py"
    prog.write_text(RANK_PROGRAM)
    proc = subprocess.Popen([sys.executable, "-m", "cpulaunch", "--ddp", "--nproc-per-node", "1",
                             "--ccl-worker-count", "1", "--backend", "ccl", "--core-list",
                             ",".join(map(str, sorted(os.sched_getaffinity(0))[:2])), sys.executable, str(prog)],
                            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, start_new_session=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        pid = _ready_pid(proc, 300)
        out = run_cli("verify", "--format", "json", str(pid), check_rc=None)
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    (inst,) = json.loads(out.stdout)["instances"]
    worker = sorted(os.sched_getaffinity(0))[1]
    assert inst["ccl_workers"]["planned"] == str(worker)
    pinned = {t["tid"] for t in inst["process"]["threads"] if t["cpus"] == str(worker)}
    assert inst["ccl_workers"]["threads"] and set(inst["ccl_workers"]["threads"]) == pinned
    assert proc.returncode == 0


#: A rank that runs all_reduce in a loop until the test makes the file argv[1] (rank 0 looks
#: every 64 calls and every rank learns it from an all_reduce, so all stop together) and
#: says "ready PID" once three of its threads have used 0.25 s of CPU each (its own, oneCCL's
#: worker and the bindings' completion thread: docs/dev/oneccl.md, "Threads of a ccl rank").
LOOP_RANK = """
import os, sys, torch, torch.distributed as dist
from cpulaunch.distributed import init_process_group

def busy_threads():
    tick, n = os.sysconf("SC_CLK_TCK"), 0
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/stat") as f:
            after = f.read().rsplit(")", 1)[1].split()  # state is field 3: utime 14, stime 15
        n += (int(after[11]) + int(after[12])) / tick >= 0.25
    return n

init_process_group()
t, stop, calls, ready = torch.ones(1 << 16), torch.zeros(1), 0, False
while True:
    dist.all_reduce(t)
    calls += 1
    if calls % 64 == 0:
        if not ready and busy_threads() >= 3:
            print("ready", os.getpid(), flush=True)
            ready = True
        stop.fill_(float(dist.get_rank() == 0 and os.path.exists(sys.argv[1])))
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
dist.destroy_process_group()
"""


@pytest.mark.slow
@two_cpus
def test_real_verify_counts_the_ccl_ranks_own_threads(real_binding, tmp_path):
    """Issue 34 part 5 on the real bindings: 2 ranks x 1 CPU, each rank's oneCCL worker on
    its own CPU, all_reduce in a loop. Once three threads of each rank are busy (the main
    thread, oneCCL's worker, the bindings' completion thread), ``cpulaunch verify PID PID``
    exits 0 and so does the run's own --verify; the console shows none of oneCCL's
    'value of ... changed' lines, and the note names exactly those rank 0's log has."""
    prog, stop = tmp_path / "rank.py", tmp_path / "stop"
    prog.write_text(LOOP_RANK)
    cpus = sorted(os.sched_getaffinity(0))[:2]
    proc = subprocess.Popen([sys.executable, "-m", "cpulaunch", "--ddp", "--nproc-per-node", "2", "--backend", "ccl",
                             "--core-list", f"{cpus[0]},{cpus[1]}", "--verify", "--verify-after", "40",
                             "--log-dir", str(tmp_path / "logs"), sys.executable, str(prog), str(stop)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        pids = _ready_ranks(proc, 2, 300)
        text = run_cli("verify", str(pids[0]), str(pids[1]), check_rc=None)
        doc = json.loads(run_cli("verify", "--format", "json", str(pids[0]), str(pids[1]), check_rc=None).stdout)
        run_verify = json.loads(_wait_file("*/verify.json", tmp_path / "logs", proc, 120).read_text())
        stop.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert (text.returncode, proc.returncode) == (0, 0), (text.stdout, err[-3000:])
    for seen in (doc, run_verify):
        assert seen["ok"] is True, seen["warnings"]
        assert [(i["status"], i["ccl_workers"], i["ccl_helpers"]) for i in seen["instances"]] == [
            ("ok", {"planned": str(cpus[r]), "threads": None}, HELPERS) for r in (0, 1)]
        assert all(i["process"]["busy_threads"] >= 3 for i in seen["instances"]), seen
    assert not [ln for ln in out.splitlines() if "CCL_WARN" in ln]
    (log,) = (tmp_path / "logs").glob("*/0/stdout.log")
    logged = sorted(m.group(1) for m in re.finditer(r"\|CCL_WARN\| value of (CCL_\w+) changed", log.read_text()))
    (note,) = [ln for ln in err.splitlines() if "|CCL_WARN| value of ... changed" in ln]
    assert logged and note.split("once for each of ", 1)[1].startswith(", ".join(logged) + " (set away")
