"""cpulaunch tune: the pure parts (space, budget, planner, metrics, noise rule, resume) on
fixture machines and synthetic records, then real runs: best.toml through cpulaunch's own
--config, a trial's timeout, one end-to-end tune of a tiny program, and Ctrl-C + resume.

Whole file: about 30 s on a busy 2-CPU machine (the real tunes run ~20 trials of a
program that works for 30 ms).
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpulaunch.machine import probe
from cpulaunch.tools.tune import (
    main,
)
from cpulaunch.tools.tune.load import (
    LoadReading,
    LoadWindow,
    load_meter,
    parse_proc_stat,
)
from cpulaunch.tools.tune.report import (
    BUSY_EXIT,
    best_toml,
    finish,
    report_png,
)
from cpulaunch.tools.tune.search import (
    Decision,
    Stage,
    _dropped,
    _scored,
    _slot_records,
    _stage_done,
    coarse_configs,
    compare_summaries,
    decide,
    fine_configs,
    grid_configs,
    next_stage,
    score,
    summarize,
)
from cpulaunch.tools.tune.space import (
    AXES,
    Space,
    TuneError,
    available_libraries,
    build_space,
    config_flags,
    config_key,
    config_toml,
    instance_choices,
    parse_axes,
    parse_duration,
)
from cpulaunch.tools.tune.trials import (
    RunResult,
    TRIALS_BYTES,
    _failure_text,
    attribute_metrics,
    combine_metric,
    parse_metrics,
    read_records,
    run_command,
)
from cpulaunch.tools.tune.tuner import (
    DEFAULT_OUT,
    TuneSettings,
    Tuner,
    default_out,
)

from conftest import REPO, default_signals, run_cli
from test_launch_faults import tiny_tmpfs  # noqa: F401 - the 64 KiB tmpfs fixture, shared

AMD = "hw-32amd64-4s2n4c-cgroup2"  # 4 sockets, cgroup allows CPUs 0-5 (nodes 0: 0-3, 1: 4-5)
ARM = "hw-128arm-2pa2n8cluster4co"  # 2 packages x 2 nodes x 32 cores, no SMT
XEON = "hw-32intel64-2p8co2t+8ve"  # 2 sockets x 8 cores x 2 threads
SNC = "hw-memorysidecaches"  # 2 sockets, SNC2: 4 nodes, SMT2
ALL_LIBS = {"tcmalloc", "jemalloc", "iomp5"}
TUNE = [sys.executable, "-m", "cpulaunch", "tune"]


@pytest.fixture(scope="module")
def topos(sysroots) -> dict:
    return {m: probe.probe(str(sysroots[m])) for m in (AMD, ARM, XEON, SNC)}


# --------------------------------------------------------------------------- budget, axes


@pytest.mark.parametrize("text,seconds", [("10m", 600.0), ("90s", 90.0), ("1h", 3600.0), ("1h30m", 5400.0),
                                          ("1.5h", 5400.0), ("2m30s", 150.0), (" 45S ", 45.0), (".5m", 30.0)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["10", "", "10x", "m", "0s", "10m-", "1h 2", "-5m"])
def test_parse_duration_refuses(text):
    with pytest.raises(TuneError, match="--budget"):
        parse_duration(text)


def test_parse_axes():
    assert parse_axes(None) == AXES
    assert parse_axes("all") == AXES
    assert parse_axes("omp_runtime, allocator") == ("allocator", "omp-runtime")
    with pytest.raises(TuneError, match="unknown axis threads; choose from instances, allocator"):
        parse_axes("allocator,threads")


# --------------------------------------------------------------------------- the space


def test_instance_choices_cgroup_machine(topos):
    # 6 usable cores (CPUs 0-5 allowed by the cgroup): node 0 holds 0-3, node 1 holds 4-5.
    got = [(c.label, c.flags, c.cpulists) for c in instance_choices(topos[AMD])]
    assert got == [
        ("1", ("--ninstances", "1"), ("0-5",)),
        ("per-node", ("--instances-per-node", "1"), ("0-3", "4-5")),
        ("2", ("--ninstances", "2"), ("0-2", "3-5")),
        ("4", ("--ninstances", "4"), ("0-1", "2-3", "4", "5")),
        ("latency", ("--latency-mode",), ("0-3",)),
    ]


def test_instance_choices_dedupe_by_plan(topos):
    # Kunpeng: 2 sockets of 2 nodes; --ninstances 2 = per socket and 4 = per node (dropped).
    got = [(c.label, len(c.cpulists)) for c in instance_choices(topos[ARM])]
    assert got == [("1", 1), ("per-socket", 2), ("per-node", 4), ("8", 8), ("16", 16), ("32", 32),
                   ("64", 64), ("128", 128)]
    arm = {c.label: c for c in instance_choices(topos[ARM])}
    assert arm["per-socket"].cpulists == ("0-63", "64-127")
    # SNC2 Xeon: 4 instances give the same 4 CPU sets as one per node, in another order.
    snc = [c.label for c in instance_choices(topos[SNC])]
    assert snc == ["1", "per-socket", "per-node", "8", "16", "32", "latency"]


def test_space_on_smt_machine(topos):
    space = build_space(topos[XEON], AXES, ALL_LIBS)
    assert space.axes == AXES[:6]  # the platform axes are AMD Zen's
    assert space.notes == ("axes recipe, omp-wait-policy, zendnn-matmul-algo dropped: they are searched on AMD "
                           "Zen CPUs only (this one: Intel Skylake-SP / Cascade Lake / Cooper Lake (family 0x6 "
                           "model 0x55), recipe generic)",)
    assert space.values["instances"] == ("1", "per-socket", "4", "8", "16")
    assert space.values["allocator"] == ("tcmalloc", "default", "jemalloc")
    assert space.values["omp-runtime"] == ("gnu", "intel")
    assert space.values["kmp-blocktime"] == (1, 0, 5, 200)
    assert space.values["omp-places"] == (False, True)
    assert space.values["smt"] == (False, True)
    assert space.default == {"instances": "1", "allocator": "tcmalloc", "omp-runtime": "gnu",
                             "omp-places": False, "smt": False}
    grid = grid_configs(space)
    # runtimes: gnu x places off/on + intel x 4 block times = 6 per (instances, allocator, smt)
    assert len(grid) == 5 * 3 * 6 * 2
    assert len({config_key(c) for c in grid}) == len(grid)
    assert grid[0] == space.default
    assert all(("kmp-blocktime" in c) == (c["omp-runtime"] == "intel") for c in grid)
    assert all(("omp-places" in c) == (c["omp-runtime"] == "gnu") for c in grid)


def test_space_drops_what_this_machine_lacks(topos):
    space = build_space(topos[AMD], AXES, {"jemalloc"})
    assert space.axes == ("instances", "allocator", "omp-places")
    assert space.values["allocator"] == ("default", "jemalloc")  # no tcmalloc: cpulaunch's default is malloc
    assert space.notes == (
        "axes recipe, omp-wait-policy, zendnn-matmul-algo dropped: they are searched on AMD Zen CPUs only (this "
        "one: AMD K10 (family 0x10 model 0x9), recipe generic)",
        "axis omp-runtime dropped: libiomp5 not found here (pip install intel-openmp)",
        "axis kmp-blocktime dropped: it applies to Intel OpenMP, and libiomp5 is not found here "
        "(pip install intel-openmp)",
        "axis smt dropped: this machine has no SMT siblings among its usable CPUs",
    )
    with pytest.raises(TuneError, match="nothing to compare: axis smt dropped"):
        build_space(topos[AMD], ("smt",), ALL_LIBS)


def test_space_on_amd_zen_tries_its_recipe(tmp_path):
    """On an AMD Zen CPU (a tree whose cpuinfo is an EPYC 9004's) tune searches the recipe
    against generic, OMP_WAIT_POLICY and ZENDNNL_MATMUL_ALGO, each as cpulaunch's flags
    and best.toml keys (issue 33)."""
    from bigtree import make_tree

    root = tmp_path / "zen4"
    make_tree(root, sockets=1, nodes_per_socket=1, cores_per_node=4, threads_per_core=1, extra={
        "proc/cpuinfo": "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                        "flags\t\t: fpu sse2 avx2 avx512f\n\n"})
    space = build_space(probe.probe(str(root)), ("recipe", "omp-wait-policy", "zendnn-matmul-algo"), ALL_LIBS)
    assert space.axes == ("recipe", "omp-wait-policy", "zendnn-matmul-algo") and space.notes == ()
    assert space.values == {"recipe": ("amd-zen", "generic"), "omp-wait-policy": ("auto", "active", "passive"),
                            "zendnn-matmul-algo": (1, 5)}
    assert space.default == {"recipe": "amd-zen", "omp-wait-policy": "auto", "zendnn-matmul-algo": 1}
    c = {"recipe": "generic", "omp-wait-policy": "active", "zendnn-matmul-algo": 5}
    assert config_key(c) == "recipe=generic,omp-wait-policy=active,zendnn-matmul-algo=5"
    assert config_flags(space, c) == ["--recipe", "generic", "--omp-wait-policy", "active",
                                      "--zendnn-matmul-algo", "5"]
    assert config_toml(space, c) == {"recipe": "generic", "omp-wait-policy": "active", "zendnn-matmul-algo": 5}
    assert len(grid_configs(space)) == 2 * 3 * 2


def test_kmp_blocktime_alone_fixes_intel(topos):
    space = build_space(topos[AMD], ("kmp-blocktime", "omp-places"), ALL_LIBS)
    assert space.axes == ("kmp-blocktime",)
    assert space.fixed == {"omp-runtime": "intel"}
    assert [config_key(c) for c in grid_configs(space)] == [
        "omp-runtime=intel,kmp-blocktime=1", "omp-runtime=intel,kmp-blocktime=0",
        "omp-runtime=intel,kmp-blocktime=5", "omp-runtime=intel,kmp-blocktime=200"]


def test_flags_and_toml(topos):
    space = build_space(topos[XEON], AXES, ALL_LIBS)
    c = {"instances": "per-socket", "allocator": "jemalloc", "omp-runtime": "gnu", "omp-places": True, "smt": True}
    assert config_key(c) == "instances=per-socket,allocator=jemalloc,omp-runtime=gnu,omp-places=on,smt=on"
    assert config_flags(space, c) == ["--instances-per-socket", "1", "--allocator", "jemalloc", "--omp-runtime",
                                      "gnu", "--omp-places", "--use-logical-cores"]
    assert config_toml(space, c) == {"instances-per-socket": 1, "allocator": "jemalloc", "omp-runtime": "gnu",
                                     "omp-places": True, "use-logical-cores": True}
    d = {"instances": "4", "allocator": "default", "omp-runtime": "intel", "kmp-blocktime": 0, "smt": False}
    assert config_flags(space, d) == ["--ninstances", "4", "--allocator", "default", "--omp-runtime", "intel",
                                      "--kmp-blocktime", "0"]
    assert config_toml(space, d) == {"ninstances": 4, "allocator": "default", "omp-runtime": "intel",
                                     "kmp-blocktime": 0, "use-logical-cores": False}
    assert config_toml(space, {"instances": "4", "smt": False}) == {"ninstances": 4, "use-logical-cores": False}


# --------------------------------------------------------------------------- the planner

SMALL = Space(axes=("allocator", "omp-places"),
              values={"allocator": ("tcmalloc", "default", "jemalloc"), "omp-places": (False, True)},
              default={"allocator": "tcmalloc", "omp-places": False})
K_DEF = "allocator=tcmalloc,omp-places=off"
K_MALLOC = "allocator=default,omp-places=off"
K_JE = "allocator=jemalloc,omp-places=off"
K_ON = "allocator=tcmalloc,omp-places=on"
K_JE_ON = "allocator=jemalloc,omp-places=on"


def test_coarse_one_axis_at_a_time_breadth_first():
    assert [config_key(c) for c in coarse_configs(SMALL)] == [K_DEF, K_MALLOC, K_ON, K_JE]


def _rec(key, stage, rnd, value, cost=1.0, status="ok", busy=False, attempt=1):
    config = dict(p.split("=") for p in key.split(","))
    config = {k: (v == "on" if v in ("on", "off") else v) for k, v in config.items()}
    return {"key": key, "config": config, "stage": stage, "round": rnd, "attempt": attempt, "status": status,
            "value": value if status == "ok" else None, "cost_s": cost, "wall_s": cost, "busy": busy,
            "metric": "m", "error": None if status == "ok" else "exit code 1"}


COARSE_VALUES = {K_DEF: [100, 102, 104], K_MALLOC: [90, 91, 92], K_JE: [99, 101, 103], K_ON: [110, 111, 112]}


def _coarse_records(cost=0.5):
    recs = [_rec(K_DEF, "warmup", 0, 95, cost=1.0)]
    for r in range(3):
        recs += [_rec(k, "coarse", r + 1, v[r], cost=cost) for k, v in COARSE_VALUES.items()]
    return recs


def test_fine_configs_keep_only_undecided_values():
    scores = score(_coarse_records())
    combined, new = fine_configs(SMALL, scores, lower_is_better=False)
    # allocator: jemalloc (101) is within tcmalloc's noise (102, spread 4), malloc (91) is not;
    # omp-places: on (111) beats off (102) by more than both spreads: decided.
    assert combined == {"allocator": "tcmalloc", "omp-places": True}
    assert [config_key(c) for c in new] == [K_JE_ON]
    # Lower is better flips every ranking: malloc wins the allocator axis, places off wins.
    combined, new = fine_configs(SMALL, scores, lower_is_better=True)
    assert combined == {"allocator": "default", "omp-places": False}
    assert new == []


def test_next_stage_grid_when_it_fits():
    recs = [_rec(K_DEF, "warmup", 0, 95, cost=1.0)]
    stage = next_stage(SMALL, recs, budget_s=100, rounds=3, lower_is_better=False)
    assert stage.name == "grid"
    assert len(stage.configs) == 6 and set(stage.rounds.values()) == {(1, 2, 3)}


def test_next_stage_adaptive_cut_and_too_small():
    recs = [_rec(K_DEF, "warmup", 0, 95, cost=1.0)]
    # 6 x 3 x 1 s x 1.15 = 20.7 s > 10 - 1 left: adaptive; 9 // 3.45 = 2 configurations fit.
    stage = next_stage(SMALL, recs, budget_s=10, rounds=3, lower_is_better=False)
    assert stage.name == "coarse"
    assert [config_key(c) for c in stage.configs] == [K_DEF, K_MALLOC]
    assert "coarse stage cut to 2 of 4 configurations by the budget" in stage.notes[1]
    with pytest.raises(TuneError, match=r"cannot fit 2 configurations x 3 trials .* --budget 1m or more"):
        next_stage(SMALL, recs, budget_s=5, rounds=3, lower_is_better=False)


def test_next_stage_fine_after_coarse():
    recs = _coarse_records(cost=0.5)
    # left for coarse: 18 - 1 = 17 s: grid (20.7) no, 17 // 3.45 = 4 configurations: all of coarse.
    fine = next_stage(SMALL, recs, budget_s=18, rounds=3, lower_is_better=False)
    assert fine.name == "fine"
    # refs (coarse winner, the default) measured again in rounds 4-6, next to the new one.
    assert [config_key(c) for c in fine.configs] == [K_ON, K_DEF, K_JE_ON]
    assert fine.rounds == {K_ON: (4, 5, 6), K_DEF: (4, 5, 6), K_JE_ON: (1, 2, 3)}
    order = fine.order(seed=0)
    assert order == fine.order(seed=0)
    for j in range(3):  # stage round j runs each configuration once
        assert sorted(config_key(c) for c, _ in order[3 * j:3 * j + 3]) == sorted([K_ON, K_DEF, K_JE_ON])
    # once the fine slots are recorded, the search is over
    done = recs + [_rec(config_key(c), "fine", r, 100) for c, r in order]
    assert next_stage(SMALL, done, budget_s=18, rounds=3, lower_is_better=False) is None
    # a budget that leaves no room for a new configuration next to the two references: no fine stage
    assert next_stage(SMALL, _coarse_records(cost=1.0), budget_s=18, rounds=3, lower_is_better=False) is None


def test_failed_configuration_dropped_after_two_failures():
    recs = [_rec(K_DEF, "warmup", 0, 95, cost=1.0)]
    for r in (1, 2, 3):
        recs += [_rec(K_DEF, "grid", r, 100), _rec(K_ON, "grid", r, 110)]
    recs += [_rec(K_JE, "grid", 1, None, status="failed"), _rec(K_JE, "grid", 2, None, status="timeout")]
    stage = Stage("grid", (SMALL.default, {"allocator": "tcmalloc", "omp-places": True},
                           {"allocator": "jemalloc", "omp-places": False}),
                  {K_DEF: (1, 2, 3), K_ON: (1, 2, 3), K_JE: (1, 2, 3)})
    assert _stage_done(stage, _slot_records(recs), _dropped(recs))
    scores = score(recs)
    assert scores[K_JE].n == 0 and scores[K_JE].failed == 2
    assert scores[K_ON].median == 110


# --------------------------------------------------------------------------- metrics and noise


def test_parse_metrics_prefixes_and_instances():
    text = "\n".join([
        "[0] warming up",
        "[0] CPULAUNCH_METRIC samples_per_s=10.5",
        "[1] CPULAUNCH_METRIC samples_per_s=11.5 latency_ms=3",
        "CPULAUNCH_METRIC samples_per_s=99",  # unprefixed: one instance's line
        "[1] CPULAUNCH_METRIC samples_per_s=12.0",  # a later figure replaces the earlier
        "  CPULAUNCH_METRIC   depth=2  ",
        "[0] the CPULAUNCH_METRIC x=1 in a sentence is not a metric line",
        "[2] CPULAUNCH_METRIC samples_per_s=nan",
        "CPULAUNCH_METRICS a=1",
    ])
    got = parse_metrics(text)
    assert set(got) == {0, 1, 2, None}
    assert got[0] == {"samples_per_s": 10.5}
    assert got[1] == {"samples_per_s": 12.0, "latency_ms": 3.0}
    assert got[None] == {"samples_per_s": 99.0, "depth": 2.0}
    assert math.isnan(got[2]["samples_per_s"])


def test_combine_metric_sums_throughput_and_averages_latency():
    per = {0: {"s": 10.0, "ms": 4.0}, 1: {"s": 12.0, "ms": 6.0}}
    assert combine_metric(per, "s", 2, lower_is_better=False) == (22.0, [10.0, 12.0], None)
    assert combine_metric(per, "ms", 2, lower_is_better=True) == (5.0, [4.0, 6.0], None)
    assert combine_metric({None: {"s": 7.0}}, "s", 1, False) == (7.0, [7.0], None)
    assert combine_metric({0: {"s": 7.0}}, "s", 3, False) == (
        None, [], "instance 1,2 printed no 'CPULAUNCH_METRIC s=...' line")
    assert combine_metric({}, "s", 1, False)[2] == "the program printed no 'CPULAUNCH_METRIC s=...' line"
    assert combine_metric({None: {"s": float("nan")}}, "s", 1, False)[2] == \
        "'CPULAUNCH_METRIC s=...' is not a finite number (at most 1e+300 in size)"
    # a sum that would leave the finite numbers is refused too (the record must be readable again)
    assert combine_metric({0: {"s": 1e300}, 1: {"s": 1e300}}, "s", 2, False)[2].endswith("is not a finite number "
                                                                                      "(at most 1e+300 in size)")


def test_better_only_beyond_the_spread():
    a, b = summarize([100, 104, 108]), summarize([90, 94, 95])
    assert (a.median, a.spread, b.median, b.spread) == (104, 8, 94, 5)
    assert compare_summaries(a, b, lower_is_better=False) == "better"  # 10 > max(8, 5)
    assert compare_summaries(b, a, lower_is_better=False) == "worse"
    assert compare_summaries(a, b, lower_is_better=True) == "worse"
    c = summarize([92, 100, 103])  # median 100, spread 11 > 104 - 100
    assert compare_summaries(a, c, lower_is_better=False) == "within noise"
    assert compare_summaries(a, summarize([90, 90, 90]), False) == "better"  # 14 > 8
    assert compare_summaries(a, summarize([96, 96, 96]), False) == "within noise"  # 8 is not more than 8
    assert compare_summaries(a, summarize([50]), False) == "too few trials"


def test_decide_keeps_the_default_within_noise():
    recs = [_rec(K_DEF, "grid", r + 1, v) for r, v in enumerate([100, 104, 108])]
    recs += [_rec(K_JE, "grid", r + 1, v) for r, v in enumerate([101, 106, 109])]
    out = decide(SMALL, recs, 3, lower_is_better=False)
    assert [k for k, _, _ in out.rows] == [K_JE, K_DEF]
    assert out.recommended == K_DEF
    assert out.verdict.startswith(f"the best median ({K_JE}, 1.02x) is within noise")
    recs += [_rec(K_ON, "grid", r + 1, v) for r, v in enumerate([120, 121, 125])]
    out = decide(SMALL, recs, 3, lower_is_better=False)
    assert out.recommended == K_ON
    assert out.verdict == f"better than cpulaunch's default ({K_DEF}) beyond the measured spread: 1.16x"


# --------------------------------------------------------------------------- the tuner with fakes


class FakeMeter:
    """Foreign load: the values given for the successive pre-trial samples, then 0."""

    name = "fake"

    def __init__(self, before=()):
        self.before = list(before)

    def sample(self, seconds):
        return LoadReading(self.before.pop(0) if self.before else 0.0)

    def window(self):
        return lambda: LoadReading(0.0)


class FakeRunner:
    """A program whose metric is given per allocator (+ the call number / 1000)."""

    VALUES = {"tcmalloc": 10.0, "default": 8.0, "jemalloc": 9.0}

    def __init__(self):
        self.calls = []

    def __call__(self, argv, timeout):
        alloc = argv[argv.index("--allocator") + 1]
        self.calls.append(alloc)
        value = self.VALUES[alloc] + len(self.calls) / 1000
        return RunResult("ok", 0, 0.01, f"hello\nCPULAUNCH_METRIC ops={value}\n", "")


ALLOC = Space(axes=("allocator",), values={"allocator": ("tcmalloc", "default", "jemalloc")},
              default={"allocator": "tcmalloc"})


def _tuner(out, runner, meter=None, **kw):
    kw.setdefault("load_sample", 0.0)
    settings = TuneSettings(program=("prog",), out=out, budget_s=60, axes=("allocator",), **kw)
    return Tuner(settings, ALLOC, runner=runner, meter=meter or FakeMeter(), progress=False)


def _slots(path):
    return [(r["stage"], r["key"], r["round"], r["attempt"]) for r in read_records(path)[0]]


def test_resume_runs_exactly_the_missing_trials(tmp_path):
    full = tmp_path / "full"
    assert _tuner(full, FakeRunner()).run() == 0
    order = _slots(full / "trials.jsonl")
    assert len(order) == 1 + 3 * 3 and order[0] == ("warmup", "allocator=tcmalloc", 0, 1)
    # cut the file after 4 trials, with half a line from an interrupted write
    part = tmp_path / "part"
    part.mkdir()
    lines = (full / "trials.jsonl").read_text().splitlines(keepends=True)
    (part / "trials.jsonl").write_text("".join(lines[:4]) + lines[4][:40])
    (part / "tune.json").write_text((full / "tune.json").read_text())
    runner = FakeRunner()
    tuner = _tuner(part, runner)
    assert tuner.run() == 0
    assert _slots(part / "trials.jsonl") == order  # the same trials, in the same order
    assert len(runner.calls) == 6  # only the missing ones ran (no second warm-up)
    assert tuner.notes[0] == f"1 unreadable line(s) of {part / 'trials.jsonl'} skipped (an interrupted write)"
    assert tuner.notes[1].startswith("resumed: 4 recorded trial(s)")
    outcome = decide(ALLOC, tuner.records, 3, lower_is_better=False)
    assert outcome.recommended == "allocator=tcmalloc"
    assert outcome.verdict == "cpulaunch's default has the best median"


def test_resume_refuses_another_program(tmp_path):
    assert _tuner(tmp_path, FakeRunner()).run() == 0
    settings = TuneSettings(program=("other",), out=tmp_path, budget_s=60, axes=("allocator",), load_sample=0.0)
    with pytest.raises(TuneError, match=r"holds a tune with another program \(\['prog'\], now \['other'\]\)"):
        Tuner(settings, ALLOC, runner=FakeRunner(), meter=FakeMeter(), progress=False).run()


def test_busy_trial_repeated_once_then_flagged(tmp_path):
    # pre-trial loads: warm-up quiet; first timed trial busy, its repeat quiet; the next
    # trial busy twice (flagged); then quiet.
    tuner = _tuner(tmp_path, FakeRunner(), FakeMeter([0, 50, 0, 60, 70]), busy_threshold=10.0,
                   load_sample=0.001)
    assert tuner.run() == 0
    recs = tuner.records
    assert [(r["round"], r["attempt"], r["busy"]) for r in recs[1:6]] == [
        (1, 1, True), (1, 2, False), (1, 1, True), (1, 2, True), (1, 1, False)]
    assert recs[1]["key"] == recs[2]["key"] and recs[3]["key"] == recs[4]["key"]
    assert recs[1]["load"]["before_pct"] == 50.0 and recs[1]["load"]["meter"] == "fake"
    scores = score(recs)
    assert scores[recs[2]["key"]].busy == 0 and scores[recs[4]["key"]].busy == 1
    # the repeat's value is scored, the busy attempt's is not (the fake's values all differ)
    scored = [_scored(a)["value"] for a in _slot_records(recs).values()]
    assert recs[2]["value"] in scored and recs[1]["value"] not in scored
    assert recs[4]["value"] in scored and recs[3]["value"] not in scored
    assert len(recs) == 1 + 9 + 2


def test_busy_machine_flags_instead_of_repeating(tmp_path):
    # busy for long: the first busy trial is repeated; then, the trial before being busy
    # too, busy trials are only flagged (no doubling of the tune's time).
    tuner = _tuner(tmp_path, FakeRunner(), FakeMeter([0, 50, 60, 70, 80, 0]), busy_threshold=10.0,
                   load_sample=0.001)
    assert tuner.run() == 0
    recs = tuner.records
    assert [(r["round"], r["attempt"], r["busy"], r["repeat"]) for r in recs[1:6]] == [
        (1, 1, True, True), (1, 2, True, False), (1, 1, True, False), (1, 1, True, False), (2, 1, False, False)]
    assert len(recs) == 1 + 9 + 1
    assert sum(s.busy for s in score(recs).values()) == 3


def test_wall_time_when_the_program_prints_no_metric(tmp_path):
    runner = FakeRunner()

    def timed(argv, timeout):  # seconds: tcmalloc 10, malloc 8, jemalloc 9 (+ call / 1000)
        res = runner(argv, timeout)
        return RunResult("ok", 0, FakeRunner.VALUES[runner.calls[-1]] + len(runner.calls) / 1000,
                         "no metric here\n", "")

    tuner = _tuner(tmp_path, timed)
    assert tuner.run() == 0
    assert {r["metric"] for r in tuner.records} == {"wall_s"}
    assert all(r["value"] == r["wall_s"] for r in tuner.records)
    assert any(n.startswith("the program printed no CPULAUNCH_METRIC line: tune times the whole run")
               for n in tuner.notes)
    assert tuner._lower is True
    outcome = decide(ALLOC, tuner.records, 3, lower_is_better=tuner._lower)
    assert [k for k, _, _ in outcome.rows] == ["allocator=default", "allocator=jemalloc", "allocator=tcmalloc"]
    assert outcome.recommended == "allocator=default"


def test_metric_option_picks_a_name(tmp_path):
    def runner(argv, timeout):
        alloc = argv[argv.index("--allocator") + 1]
        ms = {"tcmalloc": 5.0, "default": 4.0, "jemalloc": 6.0}[alloc]
        return RunResult("ok", 0, 0.01, f"CPULAUNCH_METRIC samples_per_s=100 latency_ms={ms}\n", "")

    tuner = _tuner(tmp_path, runner, metric="latency_ms", lower_is_better=True)
    assert tuner.run() == 0
    assert {(r["metric"], r["key"], r["value"]) for r in tuner.records} == {
        ("latency_ms", "allocator=tcmalloc", 5.0), ("latency_ms", "allocator=default", 4.0),
        ("latency_ms", "allocator=jemalloc", 6.0)}
    outcome = decide(ALLOC, tuner.records, 3, lower_is_better=True)
    assert outcome.recommended == "allocator=default"  # 4 ms beats 5 ms, spreads 0
    assert outcome.verdict == "better than cpulaunch's default (allocator=tcmalloc) beyond the measured spread: 1.25x"


def test_report_png_skipped_without_matplotlib(tmp_path, monkeypatch):
    tuner = _tuner(tmp_path, FakeRunner())
    assert tuner.run() == 0
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    outcome = decide(ALLOC, tuner.records, 3, lower_is_better=False)
    assert report_png(tuner, outcome, tmp_path / "r.png") == \
        "report.png skipped: matplotlib is not installed (pip install matplotlib)"
    assert not (tmp_path / "r.png").exists()


def test_warmup_failure_is_a_user_error(tmp_path):
    def runner(argv, timeout):
        return RunResult("failed", 2, 0.1, "", "Traceback...\nModuleNotFoundError: No module named 'x'\n")

    with pytest.raises(TuneError, match=r"warm-up run .* failed \(exit code 2: ModuleNotFoundError: No module"):
        _tuner(tmp_path, runner).run()


def test_proc_stat_reader():
    text = "cpu  100 0 50 900 0 5 5 20 0 0\ncpu0 50 0 25 450 0 2 3 10 0 0\nintr 1\n"
    assert parse_proc_stat(text, 100.0) == (1.6, 0.2)
    assert load_meter().name == "psutil"
    reading = load_meter().sample(0.05)
    assert 0.0 <= reading.foreign_pct


def test_options_refused():
    with pytest.raises(TuneError, match="--trials-per-config 2: at least 3"):
        main(["--trials-per-config", "2", "--", "true"])
    with pytest.raises(TuneError, match="--budget '10': give a duration with a unit"):
        main(["--budget", "10", "--", "true"])
    with pytest.raises(TuneError, match="no program given"):
        main(["--budget", "1m"])
    with pytest.raises(TuneError, match="use it with --dry-run only"):
        main(["--sysroot", str(REPO), "--", "true"])


def test_user_errors_are_one_line_exit_2():
    proc = run_cli("tune", "--trials-per-config", "2", "--", "true", check_rc=2)
    assert proc.stderr == "cpulaunch: error: --trials-per-config 2: at least 3 (a median and a spread need them)\n"
    assert proc.stdout == ""


def test_dry_run_on_a_fixture(sysroots, capsys):
    assert main(["--dry-run", "--sysroot", str(sysroots[AMD]), "--space", "instances"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "axes: instances (1, per-node, 2, 4, latency)"
    assert out[1] == "instances=1: --ninstances 1 -> CPUs 0-5"
    assert out[2] == "instances=per-node: --instances-per-node 1 -> CPUs 0-3 | 4-5"
    assert "grid: 5 configurations x 3 trials; default: instances=1" in out


# --------------------------------------------------------------------------- real runs


def _host_libs():
    return available_libraries()


ROUND_TRIPS = [
    ("/", {"instances": "2", "allocator": "jemalloc", "omp-runtime": "gnu", "omp-places": True}, {"jemalloc"}),
    ("/", {"instances": "1", "allocator": "default", "omp-runtime": "intel", "kmp-blocktime": 5}, {"iomp5"}),
    (XEON, {"instances": "per-socket", "allocator": "tcmalloc", "smt": True}, {"tcmalloc"}),
    (SNC, {"instances": "latency", "allocator": "default", "omp-places": False}, set()),
]


@pytest.mark.parametrize("where,config,needs", ROUND_TRIPS, ids=["host-2", "host-intel", "xeon-smt", "snc-latency"])
def test_best_toml_round_trip(where, config, needs, sysroots, tmp_path):
    missing = needs - _host_libs()
    if missing:
        pytest.skip(f"{', '.join(sorted(missing))} not installed here")
    if where == "/" and len(os.sched_getaffinity(0)) < 2 and config["instances"] == "2":
        pytest.skip("needs 2 usable CPUs")
    root = "/" if where == "/" else str(sysroots[where])
    space = build_space(probe.probe(root), AXES, ALL_LIBS)
    key = config_key(config)
    settings = TuneSettings(program=("python", "x y.py"), out=tmp_path, budget_s=60)
    tuner = Tuner(settings, space, runner=FakeRunner(), meter=FakeMeter(), progress=False)
    tuner.metric = "samples_per_s"
    outcome = Decision(((key, config, summarize([1.0, 2.0, 3.0])),), key, "measured", key)
    path = tmp_path / "best.toml"
    path.write_text(best_toml(tuner, outcome))
    doc = tomllib.loads(path.read_text())
    assert doc["cpulaunch"] == config_toml(space, config)
    assert doc["measured"]["program"] == ["python", "x y.py"] and doc["measured"]["median"] == 2.0
    sysroot = [] if root == "/" else ["--sysroot", root]
    via_config = json.loads(run_cli("--config", str(path), *sysroot, "--dry-run", "--format", "json", "true").stdout)
    via_flags = json.loads(run_cli(*config_flags(space, config), *sysroot, "--dry-run", "--format", "json",
                                   "true").stdout)
    assert via_config == via_flags
    insts = via_config["instances"]
    if config.get("smt"):
        assert [i["cpulist"] for i in insts] == ["0-7,16-23", "8-15,24-31"]  # each socket's cores with siblings
    else:
        assert [i["cpulist"] for i in insts] == list(space.instances[config["instances"]].cpulists)
    env = insts[0]["env"]
    preload = env.get("LD_PRELOAD", "")
    if config["allocator"] == "default":
        assert "tcmalloc" not in preload and "jemalloc" not in preload
    else:
        assert config["allocator"] in preload
    assert ("OMP_PLACES" in env) == bool(config.get("omp-places"))
    if config.get("omp-runtime") == "intel":
        assert env["KMP_BLOCKTIME"] == "5" and "libiomp5" in env["LD_PRELOAD"]


def test_trial_timeout_kills_the_program(tmp_path):
    pidfile = tmp_path / "pid"
    code = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    t0 = time.monotonic()
    res = run_command([sys.executable, "-c", code], timeout=1.5)
    assert res.status == "timeout" and res.returncode == -signal.SIGTERM
    assert time.monotonic() - t0 < 10
    with pytest.raises(ProcessLookupError):
        os.kill(int(pidfile.read_text()), 0)
    assert _failure_text(res).startswith("timed out after 1.")


TINY = """\
import os, sys, time
with open(os.environ["TINY_PIDS"], "a") as f:
    f.write(f"{os.getpid()}\\n")
time.sleep(float(os.environ.get("TINY_SLEEP", "0")))
t0, n = time.perf_counter(), 0
while time.perf_counter() - t0 < 0.03:
    n += 1
print("working")
print(f"CPULAUNCH_METRIC samples_per_s={n / (time.perf_counter() - t0):.1f}")
if "jemalloc" in os.environ.get("LD_PRELOAD", ""):
    print("no jemalloc for me", file=sys.stderr)
    sys.exit(3)
"""


def _tiny(tmp_path, sleep=0.0):
    prog = tmp_path / "tiny.py"
    prog.write_text(TINY)
    return prog, _env(TINY_PIDS=str(tmp_path / "pids"), TINY_SLEEP=str(sleep))


def _env(**extra) -> dict:
    """This environment with this checkout's cpulaunch first on PYTHONPATH: tune runs from
    a temporary folder, and so do its trials (``python -m cpulaunch``)."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **extra)


def test_end_to_end_tune(tmp_path):
    libs = _host_libs()
    if not {"tcmalloc", "jemalloc"} <= libs:
        pytest.skip("needs tcmalloc and jemalloc installed (apt-get install libtcmalloc-minimal4 libjemalloc2)")
    prog, env = _tiny(tmp_path)
    out = tmp_path / "out"
    proc = subprocess.run([*TUNE, "--budget", "2m", "--out", str(out), "--space", "allocator",
                           "--busy-threshold", "100", "--load-sample", "0.05", "--", "python", str(prog)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    recs, skipped = read_records(out / "trials.jsonl")
    assert skipped == 0
    by = {(r["stage"], r["key"], r["round"]): r for r in recs}
    assert [(r["stage"], r["round"]) for r in recs[:1]] == [("warmup", 0)]
    ok = [r for r in recs[1:] if r["status"] == "ok"]
    bad = [r for r in recs[1:] if r["status"] != "ok"]
    # tcmalloc and malloc: 3 scored trials each; jemalloc failed twice, then was dropped
    assert sorted((r["key"], r["round"]) for r in ok) == [
        ("allocator=default", 1), ("allocator=default", 2), ("allocator=default", 3),
        ("allocator=tcmalloc", 1), ("allocator=tcmalloc", 2), ("allocator=tcmalloc", 3)]
    assert [(r["key"], r["exit_code"], r["error"]) for r in bad] == [("allocator=jemalloc", 3, "exit code 3: no jemalloc for me")] * 2
    assert len(by) == len(recs)
    for r in ok:
        assert r["metric"] == "samples_per_s" and r["value"] > 0 and r["per_instance"] == [r["value"]]
        assert r["load"]["meter"] == "psutil" and r["busy"] is False
        assert r["flags"] == ["--allocator", r["config"]["allocator"]]
        assert r["argv"][:3] == [sys.executable, "-m", "cpulaunch"] and r["argv"][-2:] == ["python", str(prog)]
    rounds = [r["round"] for r in recs[1:]]
    assert rounds == sorted(rounds)  # round-robin: round 2 starts after every round-1 trial
    report = (out / "report.txt").read_text()
    assert report == proc.stdout
    assert "allocator=jemalloc" in report and "failed  2 trial(s): exit code 3: no jemalloc for me" in report
    best = tomllib.loads((out / "best.toml").read_text())
    assert best["cpulaunch"]["allocator"] in ("tcmalloc", "default")
    assert f"cpulaunch --allocator {best['cpulaunch']['allocator']} -- python {prog}" in report
    assert (out / "report.png").exists() == (importlib_available("matplotlib"))
    assert json.loads((out / "tune.json").read_text())["program"] == ["python", str(prog)]


TRIAL = """\
import os, subprocess, sys, time
here = os.environ["TRIAL_DIR"]
bg = subprocess.Popen(["sleep", "300"])  # a child left running in the background
with open(os.path.join(here, "pids"), "a") as f:
    f.write(f"{os.getpid()} {bg.pid}\\n")
with open(os.path.join(here, "pids")) as f:
    started = len(f.read().splitlines())
if started == int(os.environ.get("TRIAL_BLOCK_AT", "0")):
    deadline = time.monotonic() + 90  # blocks until the test ends it (bounded)
    while time.monotonic() < deadline:
        time.sleep(0.05)
t0, n = time.perf_counter(), 0
while time.perf_counter() - t0 < 0.03:
    n += 1
print("[1] CPULAUNCH_METRIC samples_per_s=1000000000")  # the program's own text, no instance's line
print(f"CPULAUNCH_METRIC samples_per_s={n / (time.perf_counter() - t0):.1f}")
"""


def _trial_prog(tmp_path, block_at=0):
    """A trial program that leaves a ``sleep 300`` running, records both pids in
    ``tmp_path/pids`` and, when it is the ``block_at``-th to start, blocks."""
    prog = tmp_path / "trial.py"
    prog.write_text(TRIAL)
    return prog, _env(TRIAL_DIR=str(tmp_path), TRIAL_BLOCK_AT=str(block_at))


def _trial_pids(tmp_path) -> list:
    path = tmp_path / "pids"
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (one reparented to init may wait a while
    to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _clean_up(tmp_path, proc=None) -> None:
    """After a test: end tune if it still runs, and SIGKILL the trial processes left
    (none when the test passed), recognized by their command line (a pid may be reused)."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.communicate()
    for pid in _trial_pids(tmp_path):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmdline == b"sleep\x00300\x00" or str(tmp_path / "trial.py").encode() in cmdline:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _wait_gone(pids, timeout=15.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and [p for p in pids if _alive(p)]:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def importlib_available(name):
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _wait_lines(path, n, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{path} never reached {n} lines")


def test_ctrl_c_stops_cleanly_and_a_rerun_resumes(tmp_path):
    # The 4th trial's program blocks until told (it never is): SIGINT reaches tune while
    # that trial runs, whatever the machine's speed (no sleep racing the trials).
    prog, env = _trial_prog(tmp_path, block_at=4)
    out = tmp_path / "out"
    argv = [*TUNE, "--budget", "3m", "--out", str(out), "--space", "omp-places", "--busy-threshold", "100",
            "--load-sample", "0.05", "--", "python", str(prog)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            preexec_fn=default_signals)
    trials = out / "trials.jsonl"
    try:
        _wait_lines(tmp_path / "pids", 4, proc)  # the 4th trial's program has started and blocks
        assert len(trials.read_text().splitlines()) == 3
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
        pids = _trial_pids(tmp_path)
        assert proc.returncode == 130, stderr
    finally:
        _clean_up(tmp_path, proc)
    assert "interrupted: 3 trial(s) kept" in stderr and "run the same command again to resume" in stderr
    assert pids and not [pid for pid in pids if _alive(pid)]  # the interrupted trial was killed, children too
    kept = trials.read_text().splitlines()
    assert len(kept) == 3 and not (out / "report.txt").exists()
    again = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert again.returncode == 0, again.stderr
    lines = trials.read_text().splitlines()
    assert lines[:len(kept)] == kept  # nothing rewritten
    recs = [json.loads(x) for x in lines]
    slots = [(r["key"], r["round"]) for r in recs]
    assert len(set(slots)) == len(slots) == 1 + 2 * 3  # each trial once: the warm-up, 2 configurations x 3
    assert sum(r["stage"] == "warmup" for r in recs) == 1
    assert "note: resumed: 3 recorded trial(s)" in again.stdout
    assert tomllib.loads((out / "best.toml").read_text())["cpulaunch"]["omp-places"] in (True, False)
    assert not [pid for pid in _trial_pids(tmp_path) if _alive(pid)]


# --------------------------------------------------------------------------- the default --out (issue 32)


def _settings(program, **kw):
    return TuneSettings(program=tuple(program), out=DEFAULT_OUT, budget_s=60, **kw)


def test_default_out_is_one_folder_per_program_and_options():
    infer = default_out(_settings(["python", "examples/infer.py", "--batch-size", "32"]))
    assert infer.parent == Path("cpulaunch-tune") and re.fullmatch(r"infer-[0-9a-f]{8}", infer.name)
    assert default_out(_settings(["python", "examples/infer.py", "--batch-size", "32"])) == infer
    # the budget and the load settings are not the tune's identity: a rerun may change them
    assert default_out(_settings(["python", "examples/infer.py", "--batch-size", "32"], busy_threshold=50.0,
                                 trial_timeout=9.0)) == infer
    others = {default_out(_settings(["python", "examples/infer.py", "--batch-size", "64"])),
              default_out(_settings(["python", "examples/infer.py", "--batch-size", "32"], seed=1)),
              default_out(_settings(["python", "examples/infer.py", "--batch-size", "32"], axes=("allocator",))),
              default_out(_settings(["python", "examples/infer.py", "--batch-size", "32"], lower_is_better=True))}
    assert len(others) == 4 and infer not in others
    names = [default_out(_settings(p)).name.rsplit("-", 1)[0] for p in (
        ["python", "-m", "pkg.serve", "--port", "1"], ["./bench", "x.txt"], ["/usr/bin/true"],
        ["python", "-c", "print(1)"], ["..."], ["python", "a b/../my run.py"])]
    assert names == ["pkg.serve", "bench", "true", "python", "program", "my-run"]


def test_a_kept_tune_of_another_program_does_not_block_the_default_out(tmp_path):
    # Program A's tune stops on its budget check (exit 2) and keeps its folder so that a rerun
    # resumes; a tune of program B with the default --out then runs in a folder of its own,
    # and the same command as A's, with a larger budget, resumes A's tune.
    _, env = _tiny(tmp_path)
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(TINY)
    common = ["--space", "omp-places", "--busy-threshold", "100", "--load-sample", "0.05"]

    def tune(budget, prog):
        return subprocess.run([*TUNE, "--budget", budget, *common, "--", "python", prog], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=120)

    first = tune("1s", "a.py")
    assert first.returncode == 2, first.stderr
    assert "cannot fit 2 configurations x 3 trials" in first.stderr
    (a_dir,) = (tmp_path / "cpulaunch-tune").iterdir()
    assert re.fullmatch(r"a-[0-9a-f]{8}", a_dir.name)
    assert f"cpulaunch tune: results go to cpulaunch-tune/{a_dir.name} (" in first.stderr
    a_trials = (a_dir / "trials.jsonl").read_text()
    assert [json.loads(x)["stage"] for x in a_trials.splitlines()] == ["warmup"]

    other = tune("2m", "b.py")
    assert other.returncode == 0, other.stderr
    b_dir = tmp_path / "cpulaunch-tune" / next(p.name for p in (tmp_path / "cpulaunch-tune").iterdir()
                                               if p != a_dir)
    assert b_dir.name.startswith("b-") and len(read_records(b_dir / "trials.jsonl")[0]) == 1 + 2 * 3
    assert f"cpulaunch --config cpulaunch-tune/{b_dir.name}/best.toml -- python b.py" in other.stdout
    assert (a_dir / "trials.jsonl").read_text() == a_trials and not (a_dir / "best.toml").exists()

    again = tune("2m", "a.py")
    assert again.returncode == 0, again.stderr
    assert "note: resumed: 1 recorded trial(s)" in again.stdout
    recs = read_records(a_dir / "trials.jsonl")[0]
    assert [r["stage"] for r in recs].count("warmup") == 1 and len(recs) == 1 + 2 * 3
    assert sorted(p.name for p in (tmp_path / "cpulaunch-tune").iterdir()) == sorted([a_dir.name, b_dir.name])


# --------------------------------------------------------------------------- nothing left behind (issue 19)


def test_run_command_kills_what_the_program_left_in_its_group(tmp_path):
    # A program whose background child outlives it, then one stopped by the timeout.
    bg, bg2 = tmp_path / "bg", tmp_path / "bg2"
    res = run_command(["sh", "-c", f"sleep 300 & echo $! > {bg}; echo CPULAUNCH_METRIC x=1; echo oops >&2"], 30)
    try:
        assert (res.status, res.returncode, res.stdout, res.stderr_tail) == ("ok", 0, "CPULAUNCH_METRIC x=1\n", "oops\n")
        assert _wait_gone([int(bg.read_text())], timeout=0.5) == []  # gone when run_command returns
        res = run_command(["sh", "-c", f"sleep 300 & echo $! > {bg2}; sleep 300"], 1.0)
        assert (res.status, res.returncode) == ("timeout", -signal.SIGTERM)
        assert _wait_gone([int(bg2.read_text())], timeout=0.5) == []
    finally:
        _kill_sleep(bg)
        _kill_sleep(bg2)


def _kill_sleep(pidfile) -> None:
    try:
        pid = int(pidfile.read_text())
        if Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x00300\x00":
            os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass


def test_a_tune_leaves_no_process_behind(tmp_path):
    # Real trials of one and of two instances, each program leaving a `sleep 300` behind;
    # its lying metric line ("[1] CPULAUNCH_METRIC ...", printed by a one-instance run)
    # is not an instance's; -v shows each trial's command.
    prog, env = _trial_prog(tmp_path)
    out = tmp_path / "out"
    try:
        proc = subprocess.run([*TUNE, "-v", "--budget", "3m", "--out", str(out), "--space", "instances",
                               "--busy-threshold", "100", "--load-sample", "0", "--", "python", str(prog)],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=170)
        pids = _trial_pids(tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert len(pids) == 2 * (1 + 3 + 3 * 2)  # warm-up, 3 x 1 instance, 3 x 2 instances: 2 pids each
        assert [p for p in pids if _alive(p)] == []
    finally:
        _clean_up(tmp_path)
    recs, skipped = read_records(out / "trials.jsonl")
    assert skipped == 0 and [r["status"] for r in recs] == ["ok"] * 7
    for r in recs:
        n = 2 if r["config"]["instances"] == "2" else 1
        assert len(r["per_instance"]) == n and all(0 < v < 1e9 for v in r["per_instance"])
    assert "cpulaunch tune: warm-up: one untimed run of cpulaunch's default configuration (instances=1)" in proc.stderr
    assert f"cpulaunch: trial 1 (warmup, round 0): {sys.executable} -m cpulaunch --ninstances 1 --grace-period 2 " \
           f"-- python {prog} (timeout " in proc.stderr


def _read_until(proc, text: str, timeout: float = 60.0) -> str:
    """tune's stderr until ``text`` appears (bounded); tune must still be running."""
    import select

    seen, deadline = b"", time.monotonic() + timeout
    while text.encode() not in seen:
        assert time.monotonic() < deadline, f"{text!r} not printed within {timeout}s: {seen!r}"
        ready, _, _ = select.select([proc.stderr], [], [], 0.2)
        if ready:
            chunk = os.read(proc.stderr.fileno(), 65536)
            assert chunk, f"tune ended: {seen!r}"
            seen += chunk
    return seen.decode()


def test_sigkill_of_tune_during_the_warm_up_leaves_nothing(tmp_path):
    # The warm-up's program blocks; tune says what it is doing before that trial ends,
    # then is SIGKILLed: its watchdog takes the trial's whole group with it.
    prog, env = _trial_prog(tmp_path, block_at=1)
    proc = subprocess.Popen([*TUNE, "--budget", "3m", "--out", str(tmp_path / "out"), "--space", "omp-places",
                             "--busy-threshold", "100", "--load-sample", "0", "--", "python", str(prog)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    try:
        said = _read_until(proc, "to learn the trial time and the metric")
        assert said.startswith("cpulaunch tune: warm-up: one untimed run of cpulaunch's default configuration")
        _wait_lines(tmp_path / "pids", 1, proc)
        pids = _trial_pids(tmp_path)
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        proc.kill()
        proc.wait(timeout=10)
        assert _wait_gone(pids) == []
    finally:
        _clean_up(tmp_path, proc)


# --------------------------------------------------------------------------- --out read-only or full (issue 19)


def _fill(mnt, pages_left: int) -> None:
    """Fill the tmpfs at ``mnt`` but ``pages_left`` pages."""
    st = os.statvfs(mnt)
    with open(mnt / "filler", "wb") as f:
        f.write(b"\0" * (st.f_bavail - pages_left) * st.f_frsize)
    assert os.statvfs(mnt).f_bavail == pages_left


def test_read_only_out_is_one_line(tiny_tmpfs, tmp_path):
    prog, env = _trial_prog(tmp_path)
    out = tiny_tmpfs / "out"
    out.mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_tmpfs)], check=True)
    proc = subprocess.run([*TUNE, "--budget", "1m", "--out", str(out), "--space", "omp-places", "--", "python",
                           str(prog)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"cpulaunch: error: --out {out}: cannot write tune.json: Read-only file system; give "
                           "--out a writable folder with free space\n")
    assert not (tmp_path / "pids").exists()  # no trial ran


def test_full_disk_mid_run_keeps_the_trials_recorded(tiny_tmpfs, tmp_path):
    # 2 pages free: tune.json takes one, trials.jsonl fills the other (2-3 records), then
    # a record does not fit: tune stops with one line, the file keeps whole records only.
    prog, env = _trial_prog(tmp_path)
    out = tiny_tmpfs / "out"
    _fill(tiny_tmpfs, 2)
    try:
        proc = subprocess.run([*TUNE, "--budget", "3m", "--out", str(out), "--space", "omp-places",
                               "--busy-threshold", "100", "--load-sample", "0", "--", "python", str(prog)],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=170)
        assert [p for p in _trial_pids(tmp_path) if _alive(p)] == []
    finally:
        _clean_up(tmp_path)
    text = (out / "trials.jsonl").read_text()
    recs = [json.loads(line) for line in text.splitlines()]
    assert text.endswith("\n") and 1 <= len(recs) < 7 and len(text) <= 4096
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if not ln.startswith("cpulaunch tune: ")] == [
        f"cpulaunch: error: --out {out}: cannot write trials.jsonl: No space left on device; "
        f"the {len(recs)} trial(s) recorded before are kept in {out / 'trials.jsonl'}: free some "
        "space or make the folder writable, then run the same command again to resume"]
    assert sorted(p.name for p in out.iterdir()) == ["trials.jsonl", "tune.json"]  # nothing half-written


def test_full_disk_at_the_report_leaves_no_half_file(tiny_tmpfs):
    out = tiny_tmpfs / "out"
    tuner = _tuner(out, FakeRunner())
    assert tuner.run() == 0
    _fill(tiny_tmpfs, 0)
    printed = io.StringIO()
    with pytest.raises(TuneError, match=rf"^--out {out}: cannot write report\.png: No space left on device; the 10 "
                                        r"trial\(s\) recorded before are kept in "):
        finish(tuner, printed)
    assert "recommended: allocator=tcmalloc" in printed.getvalue()  # the report is printed all the same
    assert sorted(p.name for p in out.iterdir()) == ["trials.jsonl", "tune.json"]


# --------------------------------------------------------------------------- what trials.jsonl may hold (issue 19)


def _resume_dir(tmp_path, lines) -> Path:
    """A --out folder of the ALLOC tune (tune.json as _tuner writes it) whose trials.jsonl
    holds ``lines``."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    ref = tmp_path / "ref"
    if not ref.exists():
        assert _tuner(ref, FakeRunner()).run() == 0
    (out / "tune.json").write_text((ref / "tune.json").read_text())
    (out / "trials.jsonl").write_text("".join(line + "\n" for line in lines))
    return out


def test_records_of_the_wrong_shape_are_skipped_with_a_note(tmp_path):
    good = json.dumps(dict(_rec("allocator=tcmalloc", "warmup", 0, 95.0), metric="ops"))
    bad = [
        dict(_rec("allocator=default", "grid", 1, 8.0), round="1"),
        dict(_rec("allocator=default", "grid", 1, 8.0), key=["allocator=default"]),
        dict(_rec("allocator=default", "grid", 1, 8.0), value="8"),
        dict(_rec("allocator=default", "grid", 1, 8.0), cost_s=-1),
        dict(_rec("allocator=default", "grid", 1, 8.0), config=None),
        dict(_rec("allocator=default", "grid", 1, 8.0), busy="no"),
        dict(_rec("allocator=default", "grid", 1, 8.0), stage=7),
    ]
    lines = [good] + [json.dumps(b) for b in bad] + ["[" * 100_000 + "]" * 100_000, "[1, 2]", "Infinity",
                                                     '{"key": "k", "status": "ok"}']
    out = _resume_dir(tmp_path, lines)
    tuner = _tuner(out, FakeRunner())
    assert tuner.run() == 0
    assert tuner.notes[0] == (
        f"11 line(s) of {out / 'trials.jsonl'} skipped: not trial records (line 2: 'round' is not an integer >= 0; "
        "line 3: 'key' is not a string; line 4: 'value' is not a finite number (at most 1e+300 in size); ...)")
    assert [r["stage"] for r in tuner.records].count("warmup") == 1 and len(tuner.records) == 10
    assert all(r["status"] == "ok" for r in tuner.records)
    reasons = []
    assert read_records(out / "trials.jsonl", reasons)[1] == 11
    assert reasons[6:9] == [(8, "'stage' is not one of warmup/grid/coarse/fine"), (9, "nested too deep"),
                            (10, "a JSON list, not an object")]


def _refused(tmp_path, what: str, make) -> str:
    """tune's stderr with trials.jsonl made by ``make(path)``: one line, exit 2, no hang."""
    out = tmp_path / what
    out.mkdir()
    make(out / "trials.jsonl")
    proc = subprocess.run([*TUNE, "--budget", "1m", "--out", str(out), "--space", "omp-places", "--", "true"],
                          capture_output=True, text=True, env=_env(), timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr.count("\n")) == (2, "", 1), proc.stderr
    return proc.stderr


def test_a_trials_file_that_is_no_file_is_refused_in_one_line(tmp_path):
    err = _refused(tmp_path, "fifo", os.mkfifo)
    assert err == (f"cpulaunch: error: {tmp_path / 'fifo/trials.jsonl'}: not a regular file (a FIFO); tune writes a "
                   "regular file there: remove it or use another --out\n")
    err = _refused(tmp_path, "link", lambda p: p.symlink_to("/dev/zero"))
    assert err == (f"cpulaunch: error: {tmp_path / 'link/trials.jsonl'} is a symbolic link; tune reads and writes "
                   "only its own files in --out: remove it or use another --out\n")
    err = _refused(tmp_path, "big", lambda p: os.truncate(os.open(p, os.O_CREAT | os.O_WRONLY), TRIALS_BYTES + 1))
    assert err.endswith(f"trials.jsonl: larger than {TRIALS_BYTES} bytes; tune writes a regular file there: "
                        "remove it or use another --out\n")
    if os.geteuid() == 0:  # a character device in its place (mknod needs root)
        err = _refused(tmp_path, "dev", lambda p: os.mknod(p, 0o600 | __import__("stat").S_IFCHR, os.makedev(1, 5)))
        assert "trials.jsonl: not a regular file (a character device);" in err
    fifo = tmp_path / "meta"
    fifo.mkdir()
    os.mkfifo(fifo / "tune.json")
    proc = subprocess.run([*TUNE, "--budget", "1m", "--out", str(fifo), "--", "true"], capture_output=True,
                          text=True, env=_env(), timeout=60)
    assert proc.returncode == 2 and "tune.json: not a regular file (a FIFO);" in proc.stderr


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)
RECORD_FIELDS = ("key", "status", "stage", "round", "attempt", "config", "cost_s", "wall_s", "metric", "value",
                 "busy", "repeat", "load", "error")


@st.composite
def trial_lines(draw):
    """A line of trials.jsonl: a real record with some fields replaced by anything, or
    any JSON, or any text."""
    kind = draw(st.sampled_from(["record", "json", "text"]))
    if kind == "text":
        return draw(st.text(max_size=60)).replace("\n", " ")
    if kind == "json":
        return json.dumps(draw(JSON_VALUES))
    key = draw(st.sampled_from(["allocator=tcmalloc", "allocator=default", "allocator=jemalloc", "x=1"]))
    rec = _rec(key, draw(st.sampled_from(["warmup", "grid", "coarse", "fine"])), draw(st.integers(0, 4)),
               draw(st.floats(-1e6, 1e6)), cost=draw(st.floats(0, 30)),
               status=draw(st.sampled_from(["ok", "failed", "timeout"])))
    for name in draw(st.lists(st.sampled_from(RECORD_FIELDS), max_size=3)):
        rec[name] = draw(JSON_VALUES)
    return json.dumps(rec)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(trial_lines(), max_size=12))
def test_any_trials_file_is_resumed_or_refused_by_the_users_rule(tmp_path_factory, lines):
    base = tmp_path_factory.mktemp("any")
    out = _resume_dir(base, lines)
    tuner = _tuner(out, FakeRunner())
    try:
        code = tuner.run()
    except TuneError as exc:  # a user's mistake: one line
        assert "\n" not in str(exc)
        return
    assert code == 0
    printed = io.StringIO()
    outcome = finish(tuner, printed)
    assert printed.getvalue() == (out / "report.txt").read_text()
    if outcome.recommended is not None:
        tomllib.loads((out / "best.toml").read_text())


# --------------------------------------------------------------------------- metric lines, -v (issue 19)


def test_metric_lines_count_only_for_the_instances_started():
    got = parse_metrics("[1] CPULAUNCH_METRIC s=5\nCPULAUNCH_METRIC s=7\n[0] CPULAUNCH_METRIC s=1\n[2] CPULAUNCH_METRIC s=9\n")
    assert attribute_metrics(got, 1) == {None: {"s": 7.0}}  # one instance: cpulaunch prefixes nothing
    assert attribute_metrics(got, 2) == {0: {"s": 1.0}, 1: {"s": 5.0}}  # two: [0] and [1] only
    assert attribute_metrics({1: {"s": 5.0}}, 1) == {}


@pytest.mark.parametrize("printed,metric,value", [
    ("[1] CPULAUNCH_METRIC ops=1000\nCPULAUNCH_METRIC ops=10\n", "ops", 10.0),
    ("[1] CPULAUNCH_METRIC ops=1000\n", "wall_s", 0.01),  # nothing an instance printed: wall time
])
def test_a_lying_metric_line_does_not_fail_the_tune(tmp_path, printed, metric, value):
    def runner(argv, timeout):
        return RunResult("ok", 0, 0.01, printed, "")

    tuner = _tuner(tmp_path, runner)
    assert tuner.run() == 0
    assert {(r["status"], r["metric"], r["value"]) for r in tuner.records} == {("ok", metric, value)}


def test_tune_takes_verbose_like_every_command(sysroots):
    plain = run_cli("tune", "--dry-run", "--sysroot", str(sysroots[AMD]), "--space", "instances")
    verbose = run_cli("tune", "-v", "--dry-run", "--sysroot", str(sysroots[AMD]), "--space", "instances")
    assert verbose.stdout == plain.stdout and verbose.stdout.startswith("axes: instances (1, per-node, 2, 4, latency)")
    assert "-v, --verbose" in run_cli("tune", "--help").stdout


# --------------------------------------------------------------------------- the load meter in the package (issue 20)


def test_the_meter_works_from_an_installed_package(tmp_path):
    # Only the package is importable (as from a wheel): no checkout, no scripts/.
    import shutil

    site = tmp_path / "site"
    shutil.copytree(REPO / "cpulaunch", site / "cpulaunch", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sys, json; from cpulaunch.tools.tune import load; m = load.load_meter(); r = m.sample(0.2); "
            "w = m.window(); d = w(); "
            "print(json.dumps([load.__file__, m.name, r.foreign_pct >= 0, d.foreign_pct >= 0, "
            "[p for p in sys.path if p.endswith('scripts')], 'benchkit' in sys.modules]))")
    proc = subprocess.run([sys.executable, "-s", "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(site)), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [str(site / "cpulaunch" / "tools" / "tune" / "load.py"), "psutil", True,
                                       True, [], False]


def test_benchkit_measures_with_the_packages_meter():
    proc = subprocess.run([sys.executable, "-c", "import benchkit; from cpulaunch.tools.tune import load; "
                           "print(benchkit.LoadWindow is load.LoadWindow, benchkit.sample is load.sample_load, "
                           "benchkit.Load is load.Load, load.__file__)"],
                          capture_output=True, text=True, cwd=REPO / "scripts", timeout=60)
    assert proc.stdout.split() == ["True", "True", "True", str(REPO / "cpulaunch" / "tools" / "tune" / "load.py")], \
        proc.stderr


def test_the_meter_without_psutil(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil -> ImportError
    meter = load_meter()
    assert meter.name == "proc-stat"
    reading = meter.sample(0.05)
    assert reading.foreign_pct >= 0 and reading.busiest == ()
    load = LoadWindow().load()
    assert load.ncpu == os.cpu_count() and load.others >= 0 and load.steal >= 0


# --------------------------------------------------------------------------- an honest tune (issue 24)


class BusyMeter(FakeMeter):
    """Every reading above any threshold: the machine is busy throughout."""

    def sample(self, seconds):
        return LoadReading(99.0)

    def window(self):
        return lambda: LoadReading(101.0)


def test_a_recommendation_from_busy_trials_says_so_everywhere(tmp_path):
    tuner = _tuner(tmp_path, FakeRunner(), BusyMeter(), busy_threshold=10.0, load_sample=0.001)
    assert tuner.run() == 0
    printed = io.StringIO()
    outcome = finish(tuner, printed)
    assert (outcome.recommended, outcome.busy, outcome.behind, outcome.from_busy) == ("allocator=tcmalloc", 3, 3, True)
    warning = ("3 of the 3 trials behind this recommendation ran while the machine was busy (foreign CPU load above "
               "10%): its figures are not to be quoted; run tune again with another --out on a quiet machine")
    report = printed.getvalue()
    assert f"recommended: allocator=tcmalloc: cpulaunch's default has the best median\n  BUSY: {warning}\n" in report
    assert report == (tmp_path / "report.txt").read_text()
    text = (tmp_path / "best.toml").read_text()
    assert f"\n# BUSY: {warning}\n" in text
    measured = tomllib.loads(text)["measured"]
    assert (measured["busy"], measured["busy_trials"], measured["busy_threshold_pct"]) == (True, 3, 10.0)
    # the chart is marked: the same results without the busy flags draw another picture
    if importlib_available("matplotlib"):
        quiet = Tuner(tuner.s, ALLOC, runner=FakeRunner(), meter=FakeMeter(), progress=False)
        quiet.records, quiet.metric = [dict(r, busy=False) for r in tuner.records], tuner.metric
        report_png(quiet, decide(ALLOC, quiet.records, 3, False), tmp_path / "quiet.png")
        assert (tmp_path / "quiet.png").read_bytes() != (tmp_path / "report.png").read_bytes()
        assert not decide(ALLOC, quiet.records, 3, False).from_busy


def test_a_quiet_tune_says_it_was_quiet(tmp_path):
    tuner = _tuner(tmp_path, FakeRunner())
    assert tuner.run() == 0
    outcome = finish(tuner, io.StringIO())
    assert (outcome.busy, outcome.behind, outcome.from_busy) == (0, 3, False)
    text = (tmp_path / "best.toml").read_text()
    assert "BUSY" not in text and "BUSY" not in (tmp_path / "report.txt").read_text()
    assert tomllib.loads(text)["measured"]["busy"] is False


def test_busy_trials_under_a_real_foreign_load_exit_3(tmp_path):
    # A busy loop of the test's own on every CPU the trials use: every trial is busy, the
    # recommendation is flagged in the report and best.toml, and tune exits 3.
    prog, env = _trial_prog(tmp_path)
    loops = [subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
             for cpu in sorted(os.sched_getaffinity(0))]
    out = tmp_path / "out"
    try:
        proc = subprocess.run([*TUNE, "--budget", "3m", "--out", str(out), "--space", "omp-places",
                               "--busy-threshold", "10", "--load-sample", "0.2", "--", "python", str(prog)],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=170)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
        _clean_up(tmp_path)
    assert proc.returncode == BUSY_EXIT, proc.stderr
    recs, _ = read_records(out / "trials.jsonl")
    assert all(r["busy"] for r in recs)
    busy = re.search(r"\n  BUSY: (\d+) of the (\d+) trials behind this recommendation ran while the machine was busy "
                     r"\(foreign CPU load above 10%\)", proc.stdout)
    assert busy and busy.group(1) == busy.group(2) in ("3", "6"), proc.stdout
    assert tomllib.loads((out / "best.toml").read_text())["measured"]["busy"] is True
    assert "[busy: foreign load " in proc.stderr  # the progress lines say it as it happens
