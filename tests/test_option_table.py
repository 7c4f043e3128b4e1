"""The option table is the one source (issue 31): click's parameters, --help, config keys,
plan_instances' keywords and the docs' reference come from it; its rules name what the
user gave, from every source; and the variables cpulaunch writes into instances are never
options, so a cpulaunch started inside an instance plans as a plain one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest

import cpulaunch
from conftest import REPO, run_cli
from cpulaunch import cli, cpulist, envvars, option_table as table
from cpulaunch.errors import CpulaunchError

XEON = "hw-32intel64-2p8co2t+8ve"  # 2x Xeon Silver 4108, SMT siblings 0,16


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPULAUNCH_", "OMP_", "KMP_"))
           and k not in ("LD_PRELOAD", "MALLOC_CONF")}
    env.update(extra)
    return env


# --------------------------------------------------------------------------- one source


def test_click_parameters_are_the_tables():
    params = {p.name: p for p in cli.command.params if isinstance(p, click.Option)}
    assert set(params) == {o.dest for o in table.OPTIONS} | {a.dest for a in table.ALIASES} | {"version"}
    for o in table.OPTIONS:
        p = params[o.dest]
        assert set(p.opts) == set(table.spellings(o.name)) | ({o.short} if o.short else set()), o.name
        assert p.envvar == (o.variable if "env" in o.sources else None), o.name


def test_plan_instances_takes_exactly_the_tables_keywords(sysroots):
    root = str(sysroots[XEON])
    for keyword in table.api_keywords():
        if keyword != "sysroot":
            cpulaunch.plan_instances(sysroot=root, **{keyword: None})  # None: not given
    for keyword in ("dry_run", "print_env", "show_topology", "fmt", "config", "verbose", "ninstance", "program2"):
        with pytest.raises(CpulaunchError, match=f"unknown option '{keyword}'"):
            cpulaunch.plan_instances(sysroot=root, **{keyword: 1})
    assert set(table.api_keywords()) == ({o.dest for o in table.OPTIONS if "api" in o.sources}
                                         | {a.dest for a in table.ALIASES})


def test_a_misspelled_keyword_is_named_with_the_nearest():
    with pytest.raises(CpulaunchError) as info:
        cpulaunch.plan_instances(ninstance=2)
    assert str(info.value) == "plan_instances: unknown option 'ninstance' (did you mean ninstances=?)"


def test_help_lists_each_option_once_in_sections():
    text = run_cli("--help").stdout
    sections = [s.value for s in table.Section]
    assert [line.rstrip(":") for line in text.splitlines() if line.rstrip(":") in sections] == sections
    for o in table.OPTIONS:
        starts = [line for line in text.splitlines() if line.lstrip().startswith((o.name + " ", o.name + ","))
                  or line.strip() == o.name or line.lstrip().startswith(f"{o.short}, {o.name}" if o.short else "\0")]
        assert len(starts) == 1, (o.name, starts)
    for o in table.OPTIONS:
        assert table.spellings(o.name)[-1] not in text or "_" not in o.name[2:] and "-" not in o.name[2:], o.name
    assert "cpulaunch [-v] {doctor,verify,tune,completion}" in text and "-m MODULE / -c CODE" in text


@pytest.mark.parametrize("args", [["-v", "doctor", "--format", "json"], ["doctor", "-v", "--format", "json"]])
def test_verbose_before_or_after_a_subcommand(args):
    proc = run_cli(*args, check_rc=None)
    assert proc.returncode in (0, 1), proc.stderr  # doctor's own verdict, never a usage error
    assert json.loads(proc.stdout)["findings"]


# --------------------------------------------------------------------------- rules in the user's words

RULE_CASES = [
    # (argv, environment, config text, the message's start)
    (["--ninstances", "2", "--instances-per-socket"], {}, "",
     "--ninstances 2 and --instances-per-socket cannot be combined; choose one"),
    (["--instances-per-socket"], {"CPULAUNCH_NINSTANCES": "2"}, "",
     "CPULAUNCH_NINSTANCES=2 and --instances-per-socket cannot be combined; choose one"),
    (["--throughput-mode"], {}, "ninstances = 2\n",
     "ninstances = 2 in --config CFG and --throughput-mode cannot be combined; choose one"),
    (["--ddp", "--instances-per-l3"], {}, "",
     "--instances-per-l3 cannot be combined with --ddp: --ddp places one rank per socket"),
    (["--ddp", "--nproc_per_node", "400"], {}, "", "--nproc_per_node 400 needs 400 physical cores"),
    (["--ddp"], {"CPULAUNCH_NPROC_PER_NODE": "400"}, "", "CPULAUNCH_NPROC_PER_NODE=400 needs 400 physical cores"),
    ([], {"CPULAUNCH_NINSTANCES": "x"}, "", "CPULAUNCH_NINSTANCES=x: 'x' is not a valid integer"),
    ([], {}, 'ninstances = "x"\n', "--config CFG: ninstances = 'x' is a string; expected an integer"),
    (["--kmp-blocktime", "5"], {}, "", "--kmp-blocktime 5 has no effect with the gnu OpenMP runtime"),
    (["--multi-instance", "--ddp"], {}, "", "--multi-instance cannot be combined with --ddp"),
    (["--enable-tcmalloc", "--allocator", "jemalloc"], {}, "",
     "--enable-tcmalloc (run_cpu: --allocator tcmalloc) contradicts --allocator jemalloc"),
    (["--node-id", "0", "--node-list", "1"], {}, "", "--node-id 0 and --node-list 1 cannot be combined"),
    (["--max-restarts", "2", "--ddp"], {}, "", "--max-restarts 2 needs --rdzv-endpoint"),
]


@pytest.mark.parametrize("argv, env, config, message", RULE_CASES)
def test_rules_name_what_was_given_as_given(argv, env, config, message, sysroots, tmp_path):
    args = ["--sysroot", str(sysroots[XEON]), "--dry-run", *argv]
    if config:
        (tmp_path / "c.toml").write_text(config)
        args += ["--config", str(tmp_path / "c.toml")]
        message = message.replace("CFG", str(tmp_path / "c.toml"))
    proc = run_cli(*args, "true", env=clean_env(**env), check_rc=2)
    assert proc.stderr.startswith("cpulaunch: error: " + message) and proc.stderr.count("\n") == 1, proc.stderr


def test_an_option_with_no_effect_from_a_variable_is_a_note(sysroots):
    proc = run_cli("--sysroot", str(sysroots[XEON]), "--dry-run", "--format", "json", "true",
                   env=clean_env(CPULAUNCH_KMP_BLOCKTIME="5"))
    notes = json.loads(proc.stdout)["notes"]
    assert notes[0].startswith("CPULAUNCH_KMP_BLOCKTIME=5 has no effect with the gnu OpenMP runtime"), notes


def test_dry_run_notes_the_options_that_act_only_when_it_runs():
    proc = run_cli("--dry-run", "--verify", "--keep-going", "true", env=clean_env())
    assert "# note: --keep-going, --verify act only when the program runs; --dry-run shows the commands such a " \
           "run starts" in proc.stdout


def test_a_list_of_sizes_plans_everywhere(sysroots):
    """Before: internal error (TypeError in run_cpu's comparison note), exit 70."""
    here = json.loads(run_cli("--ncores-per-instance", "1,1", "--dry-run", "--format", "json", "true",
                              env=clean_env()).stdout)
    assert [len(i["cpus"]) for i in here["instances"]] == [1, 1]
    xeon = json.loads(run_cli("--sysroot", str(sysroots[XEON]), "--ncores-per-instance", "3,2", "--dry-run",
                              "--format", "json", "true", env=clean_env()).stdout)
    assert [i["cpulist"] for i in xeon["instances"]] == ["0-2", "8-9"]
    api = cpulaunch.plan_instances(sysroot=str(sysroots[XEON]), ncores_per_instance="3,2")
    assert [cpulist.format(i.cpus) for i in api.instances] == ["0-2", "8-9"]


# --------------------------------------------------------------------------- inputs and outputs


def written_variables() -> set:
    return {v for k, v in vars(envvars).items() if k.isupper() and isinstance(v, str) and v.startswith("CPULAUNCH_")}


def test_no_variable_cpulaunch_writes_is_an_option():
    assert written_variables() & set(table.env_variables()) == set()


@pytest.mark.parametrize("args", [
    ["--dataloader-workers", "1", "--reserve-cores", "1", "--instances-per-socket", "--inference-path", "eager"],
    ["--ddp", "--master-port", "29500", "--backend", "gloo"],
    ["--ddp", "--nnodes", "1:2", "--rdzv-endpoint", "127.0.0.1:29400"],
])
def test_every_variable_written_is_declared_and_no_option(args, sysroots):
    doc = json.loads(run_cli("--sysroot", str(sysroots[XEON]), "--dry-run", "--format", "json", *args, "true",
                             env=clean_env()).stdout)
    written = {k for i in doc["instances"] for k in i["env"] if k.startswith("CPULAUNCH_")}
    assert written and written <= written_variables(), written - written_variables()
    assert not written & set(table.env_variables())


def test_a_cpulaunch_inside_an_instance_plans_as_a_plain_one(tmp_path):
    """A real launch: the instance (bound to the machine's CPUs, given --dataloader-workers
    and --inference-path) starts ``cpulaunch --dry-run``; its plan is the plain one's.
    Before: the inner cpulaunch read CPULAUNCH_DATALOADER_WORKERS and
    CPULAUNCH_INFERENCE_PATH, which the outer wrote, as its own options."""
    inner = [sys.executable, "-m", "cpulaunch", "--dry-run", "--format", "json", "--allocator", "default", "true"]
    out = tmp_path / "inner.json"
    code = ("import subprocess, sys; open(sys.argv[1], 'w').write(subprocess.run(sys.argv[2:], "
            "capture_output=True, text=True, check=True).stdout)")
    run_cli("--dataloader-workers", "1", "--inference-path", "eager", "--allocator", "default", "--bind", "affinity",
            "--no-python", sys.executable, "-c", code, str(out), *inner, env=clean_env())
    nested = json.loads(out.read_text())
    plain = json.loads(run_cli("--dry-run", "--format", "json", "--allocator", "default", "true",
                               env=clean_env()).stdout)
    keep = ("cpus", "bound_cpus", "mem_nodes", "mem_policy")
    assert [{k: i[k] for k in keep} for i in nested["instances"]] == [{k: i[k] for k in keep}
                                                                      for i in plain["instances"]]
    for i in nested["instances"]:
        assert "CPULAUNCH_DATALOADER_CPUS" not in i["env"] and "CPULAUNCH_PLANNED_INFERENCE_PATH" not in i["env"]
def test_the_docs_reference_is_the_tables():
    proc = subprocess.run([sys.executable, "scripts/options_doc.py", "--check"], cwd=REPO)
    assert proc.returncode == 0, "docs/reference/options.md differs: run python scripts/options_doc.py"


