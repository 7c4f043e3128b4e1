#!/usr/bin/env python3
"""Boot a live multi-socket machine (a real kernel under QEMU) and run commands in it.

    python scripts/live_machine.py --list
    python scripts/live_machine.py 2s2c -- numactl -H
    python scripts/live_machine.py 2s2c2t -c 'lscpu -e' -c 'python3 -m cpulaunch --show-topology'
    python scripts/live_machine.py --layout 2,2,1 --node 1024:0-1 --node 1024:2-3 --node 512 \\
        --distance 0,1=21 --distance 0,2=30 --distance 1,2=30 -- python3 -m cpulaunch --dry-run true
    python scripts/live_machine.py 2s4c-snc2 --job [--save-fixture]

Commands run in the guest as root with this checkout first on PYTHONPATH, the host's
python3 first on PATH, and the host's root file system read-only (the folder --keep
names, or a temporary one, is shared read-write). The exit code is the last command's
(or 1 when the guest did not finish). ``--job`` runs the machine's placement job (what
``pytest -m live`` checks) and prints each step's exit code and time; ``--save-fixture``
then writes its dumps and the plans recorded in the guest to tests/fixtures/live-*/.
Needs qemu-system-x86, a Debian linux-image-amd64, busybox-static and virtme-ng
(docs/dev/live-machines.md); the guest is software-emulated, 20-50x slower than the host.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # this checkout's cpulaunch and the harness

import benchkit  # noqa: E402  (scripts/, this script's folder)
import liveguest as lg  # after the sys.path line above

FIXTURES = REPO / "tests" / "fixtures"
#: Dump name in the guest -> (fixture folder suffix, tag of its steps).
STATES = {"base": ("", ""), "offline": ("-offline", "@offline"), "cgroup": ("-cgroup", "@cgroup")}


def parse_args(argv: list) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("machine", nargs="?", help="a machine of --list")
    p.add_argument("--list", action="store_true", help="list the machines")
    p.add_argument("--layout", help="SOCKETS,CORES,THREADS of a custom machine")
    p.add_argument("--node", action="append", default=[],
                   help="a node of a custom machine: MiB[:CPULIST] (no CPUs: memory-only)")
    p.add_argument("--distance", action="append", default=[], help="A,B=DISTANCE")
    p.add_argument("-c", dest="commands", action="append", default=[], help="a command (repeatable)")
    p.add_argument("--job", action="store_true", help="run the machine's placement job")
    p.add_argument("--scenario", action="append", choices=sorted(lg.SCENARIOS),
                   help="run this scenario (repeatable); with --job: instead of the machine's own")
    p.add_argument("--save-fixture", action="store_true",
                   help="with --job: write tests/fixtures/live-<machine>*/")
    p.add_argument("--timeout", type=float, default=lg.DEFAULT_TIMEOUT, help="seconds (default %(default)s)")
    p.add_argument("--boot-timeout", type=float, default=lg.BOOT_TIMEOUT,
                   help="seconds until the job must have begun (default %(default)s)")
    p.add_argument("--keep", type=Path, help="keep the shared folder (job, results, dumps, logs) here")
    p.add_argument("--resave", type=Path, metavar="DIR",
                   help="no guest: write the fixtures of MACHINE from a folder kept by --job --keep DIR")
    cut = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:cut])
    args.rest = argv[cut + 1:]
    return args


def custom_machine(args: argparse.Namespace) -> lg.Machine:
    """A Machine from --layout/--node/--distance."""
    try:
        sockets, cores, threads = (int(x) for x in args.layout.split(","))
        nodes = tuple(lg.Node(int(n.split(":")[0]), n.split(":", 1)[1] if ":" in n else None)
                      for n in args.node)
        dist = tuple((int(a), int(b.split("=")[0]), int(b.split("=")[1]))
                     for a, b in (d.split(",", 1) for d in args.distance))
    except ValueError as exc:
        raise SystemExit(f"live_machine: bad --layout/--node/--distance: {exc}")
    if not nodes:
        raise SystemExit("live_machine: a custom machine needs at least one --node MiB[:CPUS]")
    return lg.Machine("custom", "custom", sockets, cores, threads, nodes, dist)


def command_steps(args: argparse.Namespace) -> list:
    commands = [shlex.split(c) for c in args.commands] + ([args.rest] if args.rest else [])
    if not commands:
        raise SystemExit("live_machine: nothing to run (give -c CMD, -- CMD or --job)")
    return [{"id": f"cmd{i}", "argv": argv, "timeout": args.timeout} for i, argv in enumerate(commands)]


def report(run: lg.GuestRun, verbose: bool) -> int:
    """Print each step (its output when ``verbose``) and the times; the exit code."""
    rc = 0
    for sid, rec in run.steps.items():
        if verbose:
            sys.stdout.write(rec["stdout"])
            sys.stderr.write(rec["stderr"])
        else:
            print(f"{sid:28} rc={rec['rc']:<4} {rec['seconds']:7.1f} s"
                  + (" TIMED OUT" if rec["timed_out"] else ""))
        rc = rec["rc"]
    for n, fault in enumerate(run.faults, 1):
        where = run.workdir / (f"attempt-{n}" if n < run.attempts else "") / "console.log"
        print(f"live_machine: {run.machine.name}: boot {n} of {run.attempts} hit an emulator fault: "
              f"{fault} (see {where})", file=sys.stderr)
    print(f"live_machine: {run.machine.name}: boot {run.boot_seconds} s, boot+run {run.seconds} s"
          + ("" if run.done else f"; the job did not finish (timed out: {run.timed_out}, before "
             f"it began: {run.boot_timed_out}, emulator fault: {run.fault or 'none'}); "
             f"console: {run.workdir / 'console.log'}"),
          file=sys.stderr)
    return rc if run.done else 1


def plan_summary(stdout: str) -> dict:
    """The parts of a --dry-run --format json plan a dump must reproduce."""
    plan = json.loads(stdout)
    return {"num_instances": plan["num_instances"], "notes": plan["notes"],
            "instances": [{"cpulist": i["cpulist"], "bound": lg.cpulist.format(i["bound_cpus"]),
                           "mem_nodes": i["mem_nodes"], "mem_policy": i["mem_policy"],
                           "omp": i["env"].get("OMP_NUM_THREADS")} for i in plan["instances"]]}


def recorded(run: lg.GuestRun, tag: str) -> dict:
    """{request name: {"args", "rc", "plan" or "stderr"}} of the steps plan/NAME{tag}."""
    modes = lg.plan_modes(run.machine)
    out = {}
    for sid, rec in run.steps.items():
        if not (sid.startswith("plan/") and sid.endswith(tag)) or (not tag and "@" in sid):
            continue
        name = sid[len("plan/"):len(sid) - len(tag)]
        entry = {"args": list(modes[name]), "rc": rec["rc"]}
        entry.update({"plan": plan_summary(rec["stdout"])} if rec["rc"] == 0
                     else {"stderr": rec["stderr"].strip()})
        out[name] = entry
    return out


def save_fixtures(run: lg.GuestRun) -> None:
    """tests/fixtures/live-<machine><state>/: the dump as a tarball, and a JSON record of
    the guest (layout, kernel, lscpu -e, numactl -H, the plans computed live)."""
    qemu = subprocess.run([lg.QEMU, "--version"], capture_output=True, text=True, check=False).stdout
    for name, (suffix, tag) in STATES.items():
        dump = run.workdir / "dumps" / f"{name}.json"
        if not dump.exists():
            continue
        top = f"live-{run.machine.name}{suffix}"
        folder = FIXTURES / top
        lg.pack_dump(json.loads(dump.read_text()), folder / f"{top}.tar.bz2", top)
        meta = {"machine": run.machine.name, "summary": run.machine.summary, "state": name,
                "vng": run.machine.vng_args(), "kernel": run.step("uname").get("stdout", "").strip(),
                "qemu": qemu.splitlines()[0] if qemu else "",
                "lscpu": run.step(f"lscpu{tag}")["stdout"] if f"lscpu{tag}" in run.steps else None,
                "numactl": run.step(f"numactl{tag}")["stdout"] if f"numactl{tag}" in run.steps else None,
                "numactl_show": (run.step(f"numactl-show{tag}")["stdout"]
                                 if f"numactl-show{tag}" in run.steps else None),
                "topology": (json.loads(run.steps[f"show/json{tag}"]["stdout"])
                             if run.steps.get(f"show/json{tag}", {}).get("rc") == 0 else None),
                "plans": recorded(run, tag)}
        (folder / f"{top}.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        print(f"live_machine: wrote {folder.relative_to(REPO)}/", file=sys.stderr)


def main(argv: list) -> int:
    benchkit.exit_on_sigterm()  # SIGTERM kills the guest and removes its folder too
    args = parse_args(argv)
    if args.list:
        for m in lg.MACHINES.values():
            print(f"{m.name:14} {'CI ' if m.ci else '   '}{m.summary}\n{'':17}vng {' '.join(m.vng_args())}")
        return 0
    reason = lg.missing()
    if reason:
        print(f"live_machine: {reason}", file=sys.stderr)
        return 2
    if args.resave:
        save_fixtures(lg.collect(lg.MACHINES[args.machine], args.resave.resolve()))
        return 0
    if args.layout:
        machine = custom_machine(args)
    elif args.machine in lg.MACHINES:
        machine = lg.MACHINES[args.machine]
    else:
        raise SystemExit(f"live_machine: name a machine of --list or give --layout (got {args.machine!r})")
    work = args.keep or Path(tempfile.mkdtemp(prefix="live-machine-"))
    if args.job or args.scenario:
        steps = lg.job(machine, work, tuple(args.scenario or ()) or None, placement=args.job)
    else:
        steps = command_steps(args)
    run = lg.boot(machine, steps, work, timeout=args.timeout, boot_timeout=args.boot_timeout)
    rc = report(run, verbose=not (args.job or args.scenario))
    if args.job and args.save_fixture and run.done:
        save_fixtures(run)
    if args.keep is None and run.done:
        shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
