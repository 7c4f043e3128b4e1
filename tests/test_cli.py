"""The command line as a new user meets it, through the real ``python -m cpulaunch``.

Strict parsing (unknown options are errors with a hint, Python's -m/-c start the program),
run_cpu's and torchrun's spellings, combinations that would be ignored, hostile values
(newlines, backticks, non-UTF-8 bytes, tabs in LD_PRELOAD, a program named ``a=b``),
--config precedence, the DDP dry-run against what each rank really gets, and --log-dir's
layout after a failing run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, json_records, plan_json, run_cli

PY = sys.executable
XEON = "hw-32intel64-2p8co2t+8ve"
NCORES = len(os.sched_getaffinity(0))
need2 = pytest.mark.skipif(NCORES < 2, reason="needs 2 allowed CPUs")


def one_line_error(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpulaunch: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def dry_json(*args, env=None):
    return json.loads(run_cli("--dry-run", "--format", "json", *args, env=env).stdout)


# --------------------------------------------------------------------------- strict parsing


def test_unknown_option_before_program_is_an_error_with_a_hint():
    line = one_line_error(run_cli("--dry-run", "--ninstance", "2", "python", "x.py", check_rc=None),
                          "--ninstance")
    assert "Did you mean" in line and "--ninstances" in line


def test_program_options_are_never_read():
    doc = dry_json("--allocator", "default", "python", "x.py", "--ninstance", "--dry-run")
    assert doc["instances"][0]["argv"][-4:] == ["python", "x.py", "--ninstance", "--dry-run"]


@pytest.mark.parametrize("words, tail", [
    (["-mhttp.server"], ["-mhttp.server"]),
    (["-m", "http.server", "--bind", "x"], ["-m", "http.server", "--bind", "x"]),
    (["-mvenv", "x"], ["-mvenv", "x"]),
    (["-c", "print(1)"], ["-c", "print(1)"]),
    (["--module", "json.tool"], ["-m", "json.tool"]),
])
def test_python_module_and_code_start_the_program(words, tail):
    doc = dry_json("--allocator", "default", *words)
    argv = doc["instances"][0]["argv"]
    assert argv[-len(tail) - 1:] == [PY, *tail]


def test_double_dash_ends_our_options():
    doc = dry_json("--allocator", "default", "--", "--weird-program-name")
    assert doc["instances"][0]["argv"][-1] == "--weird-program-name"


def test_run_cpu_and_torchrun_spellings(sysroots):
    root = str(sysroots[XEON])
    a = plan_json(root, "--use_logical_core")
    b = plan_json(root, "--use-logical-cores")
    assert [i["cpus"] for i in a["instances"]] == [i["cpus"] for i in b["instances"]]
    assert len(a["instances"][0]["cpus"]) == 32  # SMT siblings included
    doc = plan_json(root, "--disable_numactl")
    assert all(i["argv"][0] == "true" and i["mem_policy"] == "none" for i in doc["instances"])
    doc = plan_json(root, "--node-id", "1")
    assert [i["cpulist"] for i in doc["instances"]] == ["8-15"]
    doc = plan_json(root, "--multi-instance")
    assert [i["cpulist"] for i in doc["instances"]] == ["0-7", "8-15"]
    doc = plan_json(root, "--standalone", "--nproc_per_node", "2")
    assert doc["ddp"]["nproc_per_node"] == 2 and doc["instances"][1]["env"]["RANK"] == "1"
    help_text = run_cli("--help").stdout
    for alias in ("--use-logical-core", "--disable-numactl", "--node-id", "--log-path", "--standalone",
                  "--enable-tcmalloc", "--multi-instance"):
        assert alias in help_text


def test_alias_contradicting_its_option_is_an_error():
    one_line_error(run_cli("--dry-run", "--disable-numactl", "--bind", "none", "true", check_rc=None),
                   "--disable-numactl")


@pytest.mark.parametrize("args, needle", [
    (["--dry-run", "--iface", "lo"], "--iface lo applies to --ddp only"),
    (["--dry-run", "--master-port", "1234"], "--master-port 1234 applies to --ddp only"),
    (["--dry-run", "--ddp", "--instance-idx", "1"], "--instance-idx 1 cannot be combined with --ddp"),
    (["--ddp", "--print-env"], "--print-env cannot be combined with --ddp"),
    (["--format", "json"], "--format json applies to"),
    (["--dry-run", "--print-env"], "cannot be combined"),
    (["--grace-period", "nan"], "--grace-period nan"),
    (["--grace-period", "inf"], "--grace-period inf"),
    (["--grace-period", "-1"], "--grace-period -1"),
    (["--dry-run", "--ninstances", "0"], "--ninstances 0"),
    (["--dry-run", "--core-list", "0-99999999"], "--core-list"),
    (["--dry-run", "--core-list", "1,,2"], "--core-list"),
    (["--dry-run", "--ddp", "--nnodes", "2"], "--master-addr"),
])
def test_combinations_that_would_be_ignored_are_errors(args, needle):
    one_line_error(run_cli(*args, "true", check_rc=None), needle)


def test_print_env_of_two_instances_is_an_error_but_bind_strings_take_all(sysroots):
    root = str(sysroots[XEON])
    one_line_error(run_cli("--sysroot", root, "--print-env", "--ninstances", "2", "--instance-idx", "0,1",
                           check_rc=None), "prints one instance")
    out = run_cli("--sysroot", root, "--print-env", "--format", "omp-bind", "--instances-per-socket", "2").stdout
    assert out == "0-3|4-7|8-11|12-15\n"
    out = run_cli("--sysroot", root, "--print-env", "--format", "vllm", "--instances-per-socket").stdout
    assert out == "VLLM_CPU_OMP_THREADS_BIND='0-7|8-15'\n"
    out = run_cli("--sysroot", root, "--print-env", "--format", "sglang", "--throughput-mode").stdout
    assert out == "SGLANG_CPU_OMP_THREADS_BIND='0-7|8-15'\n"


# --------------------------------------------------------------------------- hostile values


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_newline_in_a_value_cannot_inject_through_dry_run_text(tmp_path):
    marker = tmp_path / "injected"
    env = {"OMP_NUM_THREADS": f"1\ntouch {marker} #"}
    text = run_cli("--dry-run", "--allocator", "default", "true", env=env).stdout
    lines = text.splitlines()  # a comment, a command, or the command's continuation after " \\"
    assert all(line.startswith(("# ", "env ")) or (line.startswith("  ") and prev.endswith(" \\"))
               for prev, line in zip([""] + lines, lines))
    subprocess.run(["bash"], input=text, text=True, timeout=30, env={**os.environ, **env})
    assert not marker.exists()


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs sh")
def test_dotenv_and_shell_forms_keep_backticks_and_dollars(tmp_path):
    marker = tmp_path / "ran"
    value = f"/x/`touch {marker}`$HOME\\.so"
    env = {"LD_PRELOAD": value}
    for fmt, loader in (("dotenv", 'set -a; . "$1"; set +a'), ("shell", '. "$1"')):
        f = tmp_path / f"env.{fmt}"
        f.write_text(run_cli("--print-env", "--format", fmt, "--allocator", "tcmalloc", "true", env=env).stdout
                     if shutil.which("numactl") else "")
        if not f.read_text():
            pytest.skip("numactl missing")
        out = subprocess.run(["sh", "-c", loader + '; printf %s "$LD_PRELOAD"', "sh", str(f)],
                             capture_output=True, text=True, check=True).stdout
        assert out.endswith(" " + value) and not marker.exists()


def test_non_utf8_bytes_in_ld_preload_pass_through():
    env = dict(os.environb)
    env[b"LD_PRELOAD"] = b"/x/\xff.so"
    proc = subprocess.run([PY, "-m", "cpulaunch", "--print-env", "--allocator", "tcmalloc", "true"],
                          capture_output=True, env=env, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert b"/x/\xff.so'" in proc.stdout and b"Traceback" not in proc.stderr
    proc = subprocess.run([PY, "-m", "cpulaunch", "--dry-run", "--format", "json", "true"],
                          capture_output=True, env=env, cwd=REPO, timeout=60)
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr
    json.loads(proc.stdout)


@need2
def test_ld_preload_entry_with_a_tab_reaches_the_child_byte_for_byte(tmp_path):
    value = "/nonexistent/a\tb.so"
    out = run_cli("--allocator", "tcmalloc", "--bind", "none", PY, "-c",
                  "import os; print(repr(os.environ['LD_PRELOAD']))", env={"LD_PRELOAD": value})
    assert repr(value)[1:-1] in out.stdout and "a\\tb.so" in out.stdout


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs sh")
def test_program_named_like_an_assignment_runs_from_dry_run_text(tmp_path):
    prog = tmp_path / "a=b"
    prog.write_text("#!/bin/sh\necho ran-a=b \"$@\"\n")
    prog.chmod(0o755)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}"}
    text = run_cli("--dry-run", "--bind", "none", "--allocator", "default", "a=b", "x", env=env).stdout
    cmd = text[text.index("env "):].split("\n# ")[0]  # the command, with its continuation lines
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env={**os.environ, **env})
    assert out.stdout.strip() == "ran-a=b x"


# --------------------------------------------------------------------------- one path


def test_sysroot_plans_keep_memory_nodes_without_numactl_here(sysroots, tmp_path):
    """The plan describes the dumped machine whatever this one has installed."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("python3", "sh"):
        if shutil.which(tool):
            (bindir / tool).symlink_to(shutil.which(tool))
    env = {"PATH": str(bindir)}
    doc = json.loads(run_cli("--sysroot", str(sysroots[XEON]), "--dry-run", "--format", "json",
                             "--allocator", "default", "--instances-per-socket", "true", env=env).stdout)
    assert [i["mem_nodes"] for i in doc["instances"]] == [[0], [1]]
    assert all(i["argv"][:2] == ["numactl", "-C"] for i in doc["instances"])
    assert any("not installed on this machine" in n for n in doc["notes"])


def test_config_file_precedence(tmp_path, sysroots):
    cfg = tmp_path / "best.toml"
    cfg.write_text('[cpulaunch]\nninstances = 4\nallocator = "default"\n[measured]\nsamples_per_s = 1.0\n')
    root = str(sysroots[XEON])
    doc = json.loads(run_cli("--sysroot", root, "--config", str(cfg), "--dry-run", "--format", "json", "true").stdout)
    assert len(doc["instances"]) == 4
    doc = json.loads(run_cli("--sysroot", root, "--config", str(cfg), "--dry-run", "--format", "json", "true",
                             env={"CPULAUNCH_NINSTANCES": "2"}).stdout)
    assert len(doc["instances"]) == 2  # environment beats the file
    doc = json.loads(run_cli("--sysroot", root, "--config", str(cfg), "--ninstances", "1", "--dry-run",
                             "--format", "json", "true", env={"CPULAUNCH_NINSTANCES": "2"}).stdout)
    assert len(doc["instances"]) == 1  # flags beat both
    py = tmp_path / "pyproject.toml"
    py.write_text('[tool.cpulaunch]\ninstances-per-socket = 1\nallocator = "default"\n')
    doc = json.loads(run_cli("--sysroot", root, "--config", str(py), "--dry-run", "--format", "json", "true").stdout)
    assert [i["cpulist"] for i in doc["instances"]] == ["0-7", "8-15"]
    bad = tmp_path / "bad.toml"
    bad.write_text("nonsense = 1\n")
    one_line_error(run_cli("--config", str(bad), "--dry-run", "true", check_rc=None), "nonsense")


@need2
def test_verbose_prints_commands(tmp_path):
    proc = run_cli("-v", "--ninstances", "2", "--allocator", "default", "true")
    assert "cpulaunch: instance 0: " in proc.stderr and "cpulaunch: instance 1: " in proc.stderr
    quiet = run_cli("--ninstances", "2", "--allocator", "default", "true")
    assert quiet.stderr == ""  # INFO lines only with -v (cpulaunch.log's level from cli.py)


@need2
@pytest.mark.slow
def test_ddp_dry_run_is_what_each_rank_gets():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    args = ["--ddp", "--nproc-per-node", "2", "--master-port", port, "--allocator", "default"]
    probe = str(REPO / "tests" / "probe_rank.py")
    plan = json.loads(run_cli(*args, "--dry-run", "--format", "json", "python", probe).stdout)
    proc = run_cli(*args, "--no-prefix", "python", probe, timeout=120)
    got = sorted((r for r in json_records(proc.stdout) if r.get("tag") == "probe_rank"),
                 key=lambda r: r["env"]["RANK"])
    assert len(got) == 2
    for inst, rec in zip(plan["instances"], got):
        for name, value in rec["env"].items():
            if name in inst["env"]:
                assert inst["env"][name] == value, name
        assert set(inst["env"]) >= {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
        assert rec["affinity"] == inst["bound_cpus"]


@pytest.mark.slow
def test_ddp_program_arguments_reach_it_untouched():
    proc = run_cli("--ddp", "--nproc-per-node", "1", "--no-python", "echo", "A$$B ${local_rank}", timeout=60)
    assert proc.stdout.strip().endswith("A$$B ${local_rank}")
    assert "OMP_NUM_THREADS" not in proc.stderr  # no torchrun banner


@need2
def test_log_dir_layout_after_a_failing_instance(tmp_path):
    """Instance 1 fails only once instance 0's line is flushed (instance 0 then makes a
    file that instance 1 waits for, bounded): fail-fast may stop instance 0 at any
    moment after that, and the line must be in its stdout.log (issue 19: failing at
    once raced Python's own start-up in instance 0, not the launcher)."""
    logs, printed = tmp_path / "logs", tmp_path / "printed"
    code = ("import os, sys, time\n"
            "i, printed = int(os.environ['CPULAUNCH_INSTANCE_INDEX']), sys.argv[1]\n"
            "if i == 0:\n"
            "    print('hello', i, flush=True)\n"
            "    open(printed, 'w').close()\n"
            "    sys.exit(0)\n"
            "deadline = time.monotonic() + 30\n"
            "while not os.path.exists(printed) and time.monotonic() < deadline:\n"
            "    time.sleep(0.01)\n"
            "print('hello', i)\n"
            "sys.exit(3)\n")
    proc = run_cli("--ninstances", "2", "--allocator", "default", "--log-dir", str(logs), PY, "-c", code,
                   str(printed), check_rc=3)
    (run,) = list(logs.iterdir())
    plan = json.loads((run / "plan.json").read_text())
    assert [i["index"] for i in plan["instances"]] == [0, 1]
    result = json.loads((run / "result.json").read_text())
    assert (run / "0" / "stdout.log").read_text() == "hello 0\n"
    assert (run / "1" / "stdout.log").read_text() == "hello 1\n"
    assert (run / "1" / "stderr.log").exists()
    assert "instance 1" in proc.stderr and "3" in proc.stderr
    text = json.dumps(result)
    assert '"exit_code": 3' in text


@need2
def test_verify_during_a_run_names_the_instance_that_widened_its_affinity(tmp_path):
    """Instance 1 widens its affinity to both CPUs; --verify's check must name it. Each
    instance says when it is ready (after widening) and stays until verify.json exists; the
    check is made 10 s in and must come after both were ready (no race with start-up)."""
    logs, ready = tmp_path / "logs", tmp_path / "ready"
    ready.mkdir()
    code = ("import glob, os, sys, time\n"
            "i = os.environ['CPULAUNCH_INSTANCE_INDEX']\n"
            "if i == '1':\n"
            "    os.sched_setaffinity(0, {0, 1})\n"
            "open(os.path.join(sys.argv[1], i), 'w').close()\n"
            "deadline = time.monotonic() + 120\n"
            "while not glob.glob(os.path.join(sys.argv[2], '*', 'verify.json')) and time.monotonic() < deadline:\n"
            "    time.sleep(0.05)\n")
    proc = run_cli("--verify", "--verify-after", "10", "--ninstances", "2", "--allocator", "default",
                   "--log-dir", str(logs), PY, "-c", code, str(ready), str(logs), timeout=180)
    warnings = [l for l in proc.stderr.splitlines() if l.startswith("cpulaunch: verify: ")]
    assert len(warnings) == 1 and "instance 1" in warnings[0] and "0-1" in warnings[0], proc.stderr
    (run,) = list(logs.iterdir())
    checked = (run / "verify.json").stat().st_mtime
    assert max(p.stat().st_mtime for p in ready.iterdir()) <= checked and len(list(ready.iterdir())) == 2
    doc = json.loads((run / "verify.json").read_text())
    assert "instance 1" in json.dumps(doc) and "0-1" in json.dumps(doc)


@need2
def test_dataloader_budget_reaches_the_child():
    """One instance on this machine's 2 cores with one core set aside for DataLoader
    workers: OpenMP gets the other core, the child is bound to both, and the env says so."""
    code = ("import json,os; print(json.dumps({'aff': sorted(os.sched_getaffinity(0)), 'env': {k: v for k, v in "
            "os.environ.items() if k.startswith(('CPULAUNCH_', 'OMP_'))}}))")
    plan = dry_json("--dataloader-workers", "1", "--allocator", "default", PY, "-c", code)
    (inst,) = plan["instances"]
    rec = json_records(run_cli("--dataloader-workers", "1", "--allocator", "default", PY, "-c", code).stdout)[0]
    assert rec["aff"] == inst["bound_cpus"] == sorted(os.sched_getaffinity(0))[:2]
    assert rec["env"]["OMP_NUM_THREADS"] == "1" and rec["env"]["CPULAUNCH_DATALOADER_NUM_WORKERS"] == "1"
    dl = rec["env"]["CPULAUNCH_DATALOADER_CPUS"]
    assert dl == inst["env"]["CPULAUNCH_DATALOADER_CPUS"] and dl not in rec["env"]["CPULAUNCH_CPUS"]
    assert rec["env"]["OMP_PLACES"] == "{%s}" % rec["env"]["CPULAUNCH_CPUS"]  # OpenMP kept off the budget


def test_help_lists_each_subcommand_with_its_summary():
    """The subcommand registry (issue 41): ``--help`` names each subcommand with its one
    line, and each names a module whose ``main`` runs it."""
    import importlib

    from cpulaunch.cli import REGISTRY

    text = " ".join(run_cli("--help").stdout.split())
    for c in REGISTRY.values():
        assert f"{c.name} {c.summary}" in text, c.name
        assert callable(importlib.import_module(c.module).main), c.module
