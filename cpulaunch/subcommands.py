"""``cpulaunch doctor``, ``cpulaunch verify PID...`` and ``cpulaunch tune``: parse, call, print.

Each subcommand's work lives in its own module (:mod:`cpulaunch.doctor`,
:mod:`cpulaunch.verify`, :mod:`cpulaunch.tune`); none is imported on the launch path.
Errors propagate to :func:`cpulaunch.cli.main`, the one place that maps them to exit codes.
"""

from __future__ import annotations

import os

import click

from cpulaunch.errors import CpulaunchError
from cpulaunch.plan import MemPolicy
from cpulaunch.render import json_text

__all__ = ["main"]

_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.command("doctor", context_settings=_CONTEXT)
@click.option("--sysroot", type=click.Path(file_okay=False), default="/", show_default=True,
              help="Examine a dump of another machine (numactl is then not run).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--mem-policy", type=click.Choice([p.value for p in MemPolicy]),
              default="bind", show_default=True,
              help="The --mem-policy of the launch to check numactl for (the launcher's own check).")
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too, not only on errors.")
def doctor_command(sysroot, fmt, mem_policy, strict):
    """What to know before trusting a pinned run on this machine, each finding with its fix.

    Exit status: 0 when no finding is an error (with --strict: no error and no warning),
    1 when one is (the report is printed either way), 2 on a usage error."""
    from pathlib import Path

    from cpulaunch import core, doctor

    if not os.path.isdir(sysroot):
        raise CpulaunchError(f"--sysroot {sysroot}: no such folder")
    report = doctor.diagnose(sysroot, os.environ, live=Path(sysroot).resolve() == Path("/"),
                             mem_policy=MemPolicy(mem_policy))
    text = json_text(doctor.to_json(report)) + "\n" if fmt == "json" else doctor.render_text(report)
    core.write_text(text)
    return doctor.exit_code(report, strict=strict)


@click.command("verify", context_settings=_CONTEXT)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.argument("pids", nargs=-1, type=int, required=True)
def verify_command(fmt, pids):
    """What running processes really got: every thread's CPUs, thread count, allocator and
    OpenMP runtimes mapped, memory per NUMA node; compared with the CPULAUNCH_* variables
    cpulaunch gave them.

    Exit status: 0 every process matches; 1 a process differs from its plan; 3 none
    differs but one could not be checked (another user's process without root, a zombie,
    a kernel thread) or exited while being read; 2 a usage error (no process with a PID)."""
    from cpulaunch import core, verify

    report = verify.verify([(pid, None) for pid in pids])
    missing = [str(r.pid) for r in report.instances if r.missing]
    if missing:
        raise CpulaunchError(f"no process with PID {', '.join(missing)} (it does not exist or has already "
                             "exited); give the PID of a running process (ps -e lists them)")
    doc = verify.report_json(report)
    core.write_text(json_text(doc) + "\n" if fmt == "json" else verify.render_text(report))
    return report.exit_code


def main(name: str, args: list) -> int:
    """Run subcommand ``name`` with ``args``; returns its exit code (raises CpulaunchError
    and click usage errors for the CLI to map)."""
    if name == "tune":
        from cpulaunch import tune

        return tune.main(args)
    command = {"doctor": doctor_command, "verify": verify_command}[name]
    return command.main(args=args, prog_name=f"cpulaunch {name}", standalone_mode=False)
