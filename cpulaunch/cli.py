"""The ``cpulaunch`` command: parse -> probe -> plan -> render -> print or launch.

This is the only module that maps errors to exit codes (2 for anything the user can fix,
one line, no traceback) and configures logging. It must not import torch.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path

import click

from cpulaunch import __version__, cpulist
from cpulaunch.inference import INFERENCE_PATH_ENV, PATHS as INFERENCE_PATHS  # no torch import

log = logging.getLogger("cpulaunch")

#: Options that take an optional count: a bare flag means 1 (``--instances-per-socket
#: python x.py``), which click's optional values cannot do without swallowing "python".
OPTIONAL_COUNT_OPTIONS = ("--instances-per-socket", "--instances-per-node")


class UsageError(Exception):
    """A mistake the user can fix; printed as one line, exit code 2."""


def _names(name: str) -> list:
    """``--foo-bar`` and torchrun's ``--foo_bar`` spelling."""
    return [name] + (["--" + name[2:].replace("-", "_")] if "-" in name[2:] else [])


def _expand_optional_counts(args: list, value_opts: set) -> list:
    """Rewrite a bare ``--instances-per-socket`` (no number after it) to ``...=1``.

    Walks cpulaunch's own options only: it stops at ``--`` or at the first word that is
    not one of ours (the program), so the program's arguments are never touched.
    """
    out = list(args)
    i = 0
    while i < len(out):
        tok = out[i]
        if tok == "--" or not tok.startswith("-"):
            break
        name = tok.split("=", 1)[0]
        canonical = name.replace("_", "-")
        if canonical in OPTIONAL_COUNT_OPTIONS and "=" not in tok:
            nxt = out[i + 1] if i + 1 < len(out) else None
            if nxt is None or not nxt.isdigit():
                out[i] = f"{name}=1"
                i += 1
            else:
                i += 2
            continue
        if name in value_opts and "=" not in tok:
            i += 2
        elif name.startswith("--") or name in value_opts or name in ("-v", "-h"):
            i += 1
        else:
            break  # an option that is not ours (e.g. -m): the program starts here
    return out


class _Command(click.Command):
    def parse_args(self, ctx, args):
        value_opts = set()
        for p in self.params:
            if isinstance(p, click.Option) and not p.is_flag and not p.count:
                value_opts.update(p.opts)
        return super().parse_args(ctx, _expand_optional_counts(list(args), value_opts))


def _choice(*values):
    return click.Choice(list(values), case_sensitive=False)


CONTEXT = {
    "ignore_unknown_options": True,
    "allow_interspersed_args": False,
    "auto_envvar_prefix": "CPULAUNCH",
    "help_option_names": ["-h", "--help"],
    "max_content_width": 100,
}


def _opt(name, *decls, **kw):
    ident = decls[0] if decls else name[2:].replace("-", "_")
    return click.option(ident, *_names(name), show_envvar=False, **kw)


@click.command(cls=_Command, context_settings=CONTEXT)
@click.version_option(__version__, "--version")
@_opt("--sysroot", type=click.Path(file_okay=False), default="/", show_default=True,
      help="Read the machine from this root (like lscpu --sysroot); for dumps of other machines.")
@_opt("--show-topology", is_flag=True, help="Draw sockets, nodes, cores and SMT siblings, then exit.")
@_opt("--print-env", is_flag=True, help="Print one instance's environment as `export` lines (see --format).")
@_opt("--dry-run", is_flag=True, help="Show each instance's command, env changes and notes; run nothing.")
@_opt("--format", "fmt", type=_choice("text", "shell", "json", "dotenv"), default=None,
      help="Output of --print-env (shell|json|dotenv) and --dry-run (text|json).")
@_opt("--ninstances", type=int, default=None, help="Number of instances.")
@_opt("--instances-per-socket", type=int, default=None, help="Instances per socket; bare flag = 1.")
@_opt("--instances-per-node", type=int, default=None, help="Instances per NUMA node; bare flag = 1.")
@_opt("--ncores-per-instance", type=int, default=None, help="Physical cores per instance.")
@_opt("--latency-mode", is_flag=True, help="4 cores per instance, as many instances as fit.")
@_opt("--throughput-mode", is_flag=True, help="One instance per NUMA node.")
@_opt("--use-logical-cores", is_flag=True, help="Give instances every SMT sibling of their cores.")
@_opt("--use-e-cores", is_flag=True, help="Also use the E-cores of hybrid CPUs.")
@_opt("--core-list", default=None, help="Use only these logical CPUs, e.g. 0-31,64-95.")
@_opt("--node-list", default=None, help="Use only the CPUs of these NUMA nodes, e.g. 0,2.")
@_opt("--instance-idx", default=None, help="Run only these instances (e.g. 0,2); --print-env: which one.")
@_opt("--mem-policy", type=_choice("bind", "preferred", "interleave", "local", "none"), default="bind",
      show_default=True, help="NUMA memory policy on the nodes of each instance's CPUs.")
@_opt("--omp-runtime", type=_choice("auto", "intel", "gnu"), default="auto", show_default=True,
      help="OpenMP runtime: intel preloads libiomp5; gnu keeps torch's libgomp.")
@_opt("--allocator", type=_choice("auto", "jemalloc", "tcmalloc", "default"), default="auto",
      show_default=True, help="Memory allocator to preload (auto: tcmalloc if installed).")
@_opt("--bind", type=_choice("numactl", "affinity", "none"), default="numactl", show_default=True,
      help="How to bind: numactl (CPUs and memory), affinity (CPUs only), none.")
@_opt("--override-env", is_flag=True, help="cpulaunch's values win over ones already in your environment.")
@_opt("--no-python", is_flag=True, help="Run the program as it is, even if it ends in .py.")
@_opt("--log-dir", type=click.Path(file_okay=False), default=None,
      help="Write each instance's output to its own file in this folder.")
@_opt("--keep-going", is_flag=True, help="When an instance fails, let the others finish.")
@_opt("--grace-period", type=float, default=10.0, show_default=True,
      help="Seconds between SIGTERM and SIGKILL when stopping instances.")
@_opt("--inference-path", type=click.Choice(list(INFERENCE_PATHS)), default=None,
      help="Tell the program which inference path to use (CPULAUNCH_INFERENCE_PATH).")
@_opt("--ddp", is_flag=True, help="Distributed training: one rank per socket (see --nproc-per-node).")
@_opt("--nproc-per-node", default=None, help="--ddp ranks on this node: a number, 'socket' or 'node'.")
@_opt("--nnodes", default="1", show_default=True, help="--ddp: number of machines (MIN:MAX with --rdzv-endpoint).")
@_opt("--node-rank", type=int, default=0, show_default=True, help="--ddp: this machine's rank.")
@_opt("--master-addr", default=None, help="--ddp: address of rank 0's machine (default 127.0.0.1).")
@_opt("--master-port", type=int, default=None, help="--ddp: port of the rendezvous (default 29500).")
@_opt("--rdzv-endpoint", default=None, help="--ddp: elastic c10d rendezvous HOST:PORT.")
@_opt("--rdzv-id", default=None, help="--ddp: rendezvous job id (elastic).")
@_opt("--backend", type=_choice("auto", "gloo", "ccl"), default="auto", show_default=True,
      help="--ddp: process-group backend (auto: ccl when oneccl_bindings_for_pytorch is usable).")
@_opt("--ccl-worker-count", type=int, default=1, show_default=True,
      help="--ddp with ccl: cores per rank reserved for oneCCL workers.")
@_opt("--iface", default=None, help="--ddp: network interface (GLOO_SOCKET_IFNAME, CCL_KVS_IFACE, FI_TCP_IFACE).")
@_opt("--rank-entry", is_flag=True, hidden=True, help="Internal: per-rank entry under torchrun.")
@click.option("-v", "--verbose", count=True, help="More diagnostics on stderr.")
@click.argument("program", nargs=-1, type=click.UNPROCESSED)
def command(**kw):
    """Run PROGRAM on the right CPUs, memory, threads and libraries.

    \b
    Examples:
      cpulaunch --instances-per-socket python infer.py
      cpulaunch --ninstances 4 --log-dir logs infer.py --batch-size 8
      cpulaunch --dry-run --format json --sysroot DUMP true
      eval "$(cpulaunch --print-env)"; $CPULAUNCH_PREFIX python infer.py
      cpulaunch --ddp python train.py
    """
    level = logging.WARNING - 10 * kw.pop("verbose")
    logging.basicConfig(level=level, format="cpulaunch: %(message)s", stream=sys.stderr)
    try:
        code = run(**kw)
    except UsageError as exc:
        click.echo(f"cpulaunch: error: {exc}", err=True)
        code = 2
    sys.exit(code)


def main(argv=None):
    """Console-script entry point."""
    command.main(args=argv, prog_name="cpulaunch")


# --------------------------------------------------------------------------- the run


def run(**kw) -> int:
    """Carry out one cpulaunch invocation; returns the exit code. Raises UsageError."""
    # Imports here keep `cpulaunch --help` quick; none of them imports torch.
    from cpulaunch import probe as probe_mod
    from cpulaunch.plan import MemPolicy, PlanError, Request, parse_index_list, plan
    from cpulaunch.render import ProgramError, resolve_program
    from cpulaunch.topology import TopologyError

    def parse_list(opt, text):
        if text is None:
            return None
        try:
            return cpulist.parse(text)
        except ValueError as exc:
            raise UsageError(f"--{opt} {text!r}: {exc}; expected e.g. 0-3,8") from None

    sysroot = kw["sysroot"]
    if not os.path.isdir(sysroot):
        raise UsageError(f"--sysroot {sysroot}: no such folder")
    try:
        topo = probe_mod.probe(sysroot)
    except TopologyError as exc:
        raise UsageError(str(exc)) from None

    if kw["show_topology"]:
        click.echo(draw_topology(topo), nl=False)
        return 0

    instance_idx = None
    if kw["instance_idx"] is not None:
        try:
            instance_idx = parse_index_list(kw["instance_idx"])
        except ValueError as exc:
            raise UsageError(f"--instance-idx {kw['instance_idx']!r}: {exc}") from None

    req = Request(
        ninstances=kw["ninstances"],
        instances_per_socket=kw["instances_per_socket"],
        instances_per_node=kw["instances_per_node"],
        ncores_per_instance=kw["ncores_per_instance"],
        latency_mode=kw["latency_mode"],
        throughput_mode=kw["throughput_mode"],
        use_logical_cores=kw["use_logical_cores"],
        use_e_cores=kw["use_e_cores"],
        core_list=parse_list("core-list", kw["core_list"]),
        node_list=parse_list("node-list", kw["node_list"]),
        instance_idx=instance_idx,
        mem_policy=MemPolicy(kw["mem_policy"].lower()),
    )
    try:
        program = resolve_program(kw["program"], no_python=kw["no_python"])
    except ProgramError as exc:
        if kw["dry_run"] or kw["print_env"]:
            program = ()
        else:
            raise UsageError(str(exc)) from None

    if kw["ddp"] or kw["rank_entry"]:
        return run_ddp(topo, req, program, kw)

    try:
        the_plan = plan(topo, req)
    except PlanError as exc:
        raise UsageError(str(exc)) from None
    rendered, settings = render_for_host(the_plan, program, kw, topo, environ=os.environ)
    return emit_or_launch(rendered, settings, topo, program, kw)


def resolve_settings(kw: dict, environ, live: bool, extra_env=None, instance_env=None):
    """Resolve --omp-runtime/--allocator/--bind against this host -> (Settings, notes).

    Touches the host (library search, which numactl). Raises UsageError when a library
    asked for by name is missing.
    """
    from cpulaunch import libraries
    from cpulaunch.render import Settings

    notes = []
    omp = kw["omp_runtime"].lower()
    iomp5 = None
    if omp in ("intel",):
        iomp5 = libraries.find(libraries.REGISTRY["iomp5"], environ)
        if iomp5 is None:
            raise UsageError(
                "--omp-runtime intel: libiomp5.so not found (searched sys.prefix/lib, "
                "$CONDA_PREFIX/lib, $VIRTUAL_ENV/lib, $LD_LIBRARY_PATH, ldconfig); "
                f"{libraries.REGISTRY['iomp5'].install}, or use --omp-runtime gnu"
            )
    elif omp == "auto":
        # Measured here: libiomp5 within noise of torch's libgomp (docs/performance.md),
        # so auto keeps the runtime torch was built with.
        omp = "gnu"
    alloc = kw["allocator"].lower()
    alloc_path = None
    if alloc in ("jemalloc", "tcmalloc"):
        alloc_path = libraries.find(libraries.REGISTRY[alloc], environ)
        if alloc_path is None:
            raise UsageError(
                f"--allocator {alloc}: {'/'.join(libraries.REGISTRY[alloc].filenames[:2])} not "
                f"found; {libraries.REGISTRY[alloc].install}, or use --allocator default"
            )
    elif alloc == "auto":
        # tcmalloc measured 1.0-1.4x plain malloc here, jemalloc 0.68-0.91x.
        alloc_path = libraries.find(libraries.REGISTRY["tcmalloc"], environ)
        if alloc_path is None:
            alloc = None
            notes.append(
                "tcmalloc not found: using the C library's malloc "
                f"({libraries.REGISTRY['tcmalloc'].install} to get it)"
            )
        else:
            alloc = "tcmalloc"
    else:
        alloc = None
    bind = kw["bind"].lower()
    numactl = None
    if bind == "numactl":
        numactl = shutil.which("numactl")
        if numactl is None:
            bind = "affinity"
            notes.append(
                "numactl not found: CPUs bound with sched_setaffinity instead and memory "
                "binding dropped (apt-get install numactl)"
            )
    settings = Settings(
        omp_runtime=omp,
        iomp5=iomp5,
        allocator=alloc,
        allocator_path=alloc_path,
        bind=bind,
        numactl=numactl or "numactl",
        override_env=kw["override_env"],
        environ=dict(environ),
        extra_env=dict(extra_env or {}),
        instance_env=dict(instance_env or {}),
    )
    return settings, notes


def render_for_host(the_plan, program, kw, topo, environ, extra_env=None, instance_env=None):
    """Resolve settings, render, and check numactl on the planned CPUs/nodes (live host)."""
    from dataclasses import replace

    from cpulaunch import probe as probe_mod
    from cpulaunch.render import render

    extra = dict(extra_env or {})
    if kw.get("inference_path"):
        extra[INFERENCE_PATH_ENV] = kw["inference_path"]
    live = os.path.realpath(kw["sysroot"]) == "/"
    settings, notes = resolve_settings(kw, environ, live, extra, instance_env)
    rendered = render(the_plan, program, settings)
    if settings.bind == "numactl":
        if live:
            reason = probe_mod.check_numactl(settings.numactl, [i.prefix for i in rendered.instances])
            if reason:
                settings = replace(settings, bind="affinity")
                rendered = render(the_plan, program, settings)
                notes.append(
                    f"{reason}: CPUs bound with sched_setaffinity instead; memory binding dropped"
                )
        else:
            notes.append("numactl not checked: --sysroot describes another machine")
    rendered = replace(rendered, notes=rendered.notes + tuple(notes))
    return rendered, settings


def _require_program(argv) -> str:
    """The program's name; raises UsageError when it is neither a file nor on PATH."""
    if shutil.which(argv[0]) is None:
        raise UsageError(f"program {argv[0]!r} not found (not a file, not on PATH)")
    return argv[0]


def emit_or_launch(rendered, settings, topo, program, kw, extra_json=None) -> int:
    """--print-env / --dry-run output, or the launch itself."""
    from cpulaunch import launch
    from cpulaunch.render import (
        binding_prefix, dotenv_lines, dry_run_text, instance_dict, plan_json, shell_exports,
    )

    fmt = (kw["fmt"] or "").lower()
    if kw["print_env"]:
        inst = rendered.instances[0]
        taskset = shutil.which("taskset") or "taskset"
        if fmt in ("", "shell"):
            click.echo(shell_exports(inst, taskset), nl=False)
        elif fmt == "dotenv":
            click.echo(dotenv_lines(inst, taskset), nl=False)
        elif fmt == "json":
            doc = instance_dict(inst)
            doc["prefix"] = list(binding_prefix(inst, taskset))
            doc["notes"] = list(rendered.notes)
            click.echo(json.dumps(doc, indent=2))
        else:
            raise UsageError(f"--print-env --format {fmt}: use shell, json or dotenv")
        for note in rendered.notes:
            log.info("note: %s", note)
        return 0
    if kw["dry_run"]:
        if fmt == "json":
            click.echo(plan_json(rendered, topo.to_dict(), extra_json))
        elif fmt in ("", "text"):
            click.echo(dry_run_text(rendered), nl=False)
        else:
            raise UsageError(f"--dry-run --format {fmt}: use text or json")
        return 0

    exe = _require_program(program)
    for note in rendered.notes:
        log.warning("note: %s", note)
    log_dir = Path(kw["log_dir"]) if kw["log_dir"] else None
    if len(rendered.instances) == 1 and log_dir is None:
        try:
            launch.exec_instance(rendered.instances[0], os.environ)
        except OSError as exc:
            raise UsageError(f"cannot run {exe!r}: {exc.strerror or exc}") from None
    try:
        outcome = launch.supervise(
            rendered.instances,
            os.environ,
            log_dir=log_dir,
            keep_going=kw["keep_going"],
            grace_period=kw["grace_period"],
        )
    except OSError as exc:
        raise UsageError(f"cannot run {exe!r}: {exc.strerror or exc}") from None
    if outcome.root_cause is not None:
        log.warning(
            "instance %d failed first (exit code %d)%s",
            outcome.root_cause,
            outcome.exit_code,
            "" if kw["keep_going"] else "; the others were stopped",
        )
    return outcome.exit_code


# --------------------------------------------------------------------------- DDP

#: Set by cpulaunch for the torchrun it starts: where each rank entry records its exit code.
STATUS_DIR_ENV = "CPULAUNCH_DDP_STATUS_DIR"
#: Set by cpulaunch for the torchrun it starts when the user had OMP_NUM_THREADS set
#: (torchrun sets it to 1 otherwise, and that must not count as the user's value).
USER_OMP_ENV = "CPULAUNCH_USER_OMP_NUM_THREADS"


def run_ddp(topo, req, program, kw) -> int:
    """``--ddp``: under an engine (torchrun, mpirun, srun) bind and run this one rank;
    otherwise start torchrun with cpulaunch itself as every rank's entry."""
    from dataclasses import replace

    from cpulaunch import distributed as dist
    from cpulaunch.plan import Plan, PlanError, plan

    environ = dict(os.environ)
    try:
        ctx = dist.detect_engine(environ)
        backend, backend_note = dist.select_backend(kw["backend"].lower())
    except dist.DistributedError as exc:
        raise UsageError(str(exc)) from None
    if kw["ccl_worker_count"] < 0:
        raise UsageError("--ccl-worker-count must be 0 or more")
    reserve = kw["ccl_worker_count"] if backend == "ccl" else 0
    if ctx is None:
        if kw["rank_entry"]:
            raise UsageError("--rank-entry is internal: it runs under torchrun started by cpulaunch --ddp")
        return _ddp_start_torchrun(topo, req, program, kw, backend, backend_note, reserve)

    notes = [backend_note, *ctx.notes]
    # torchrun sets OMP_NUM_THREADS=1 for its workers when unset: not the user's choice.
    if ctx.engine == "torchrun" and environ.get("OMP_NUM_THREADS") == "1" and not environ.get(USER_OMP_ENV):
        environ.pop("OMP_NUM_THREADS")
        if not kw["rank_entry"]:
            notes.append("OMP_NUM_THREADS=1 taken as torchrun's default and replaced by this rank's core count")
    engine_bound = (
        ctx.engine != "torchrun" and topo.cpuset is not None and topo.allowed < topo.cpuset
    )
    try:
        if engine_bound:
            # Slurm task/affinity, mpirun -bind-to, taskset: use exactly what we were given.
            rank_plan = plan(topo, replace(req, reserve_cores=reserve))
            if len(rank_plan.instances) != 1:
                raise UsageError("internal: engine-bound rank planned as several instances")
            inst = replace(rank_plan.instances[0], index=ctx.local_rank)
            reserved_all = None
            notes.append(f"{ctx.engine} bound this rank to CPUs {cpulist.format(topo.allowed)}: "
                         "cpulaunch uses exactly those (never wider)")
        else:
            node_plan = plan(topo, replace(dist.rank_request(req, kw["nproc_per_node"], topo,
                                                             ctx.local_world_size), reserve_cores=reserve))
            if len(node_plan.instances) != ctx.local_world_size:
                raise UsageError(
                    f"{ctx.engine} started {ctx.local_world_size} rank(s) on this machine, but "
                    f"--nproc-per-node {kw['nproc_per_node'] or 'socket'} plans "
                    f"{len(node_plan.instances)}; make them agree"
                )
            inst = node_plan.instances[ctx.local_rank]
            reserved_all = [i.reserved_cpus for i in node_plan.instances]
            notes.extend(node_plan.notes)
    except (PlanError, dist.DistributedError) as exc:
        raise UsageError(str(exc)) from None

    addr = kw["master_addr"] or ctx.master_addr
    if not addr:
        if ctx.local_world_size == ctx.world_size:
            addr = "127.0.0.1"
        else:
            raise UsageError(
                f"{ctx.engine}: cannot tell rank 0's host; pass --master-addr HOST or export "
                "MASTER_ADDR (e.g. mpirun -genv MASTER_ADDR HOST)"
            )
    port = kw["master_port"] or ctx.master_port
    if port is None:
        port = dist.DEFAULT_MASTER_PORT
        notes.append(f"MASTER_PORT={port} (default): jobs sharing a machine need their own "
                     "--master-port or MASTER_PORT")
    env = dist.rank_env(ctx, addr, port, backend)
    env.update(dist.iface_env(kw["iface"]))
    if backend == "ccl":
        if reserved_all is not None:
            env.update(dist.ccl_env(ctx, reserved_all))
        else:
            env.update(dist.ccl_env(ctx, [inst.reserved_cpus] * ctx.local_world_size))
            env["CCL_WORKER_AFFINITY"] = "auto"
            notes.append("CCL_WORKER_AFFINITY=auto: the engine bound each rank, so this rank "
                         "cannot know its neighbours' worker cores")
    rank_plan = Plan(instances=(inst,), num_instances=ctx.local_world_size, notes=tuple(notes))
    rendered, settings = render_for_host(rank_plan, program, kw, topo, environ,
                                         instance_env={inst.index: env})
    status_dir = environ.get(STATUS_DIR_ENV)
    if kw["rank_entry"] and status_dir and not (kw["dry_run"] or kw["print_env"]):
        return _rank_entry_supervised(rendered, environ, status_dir, ctx, kw)
    return emit_or_launch(rendered, settings, topo, program, kw,
                          extra_json={"ddp": {"engine": ctx.engine, "rank": ctx.rank,
                                              "world_size": ctx.world_size, "backend": backend}})


def _rank_entry_supervised(rendered, environ, status_dir, ctx, kw) -> int:
    """Run the rank as a child and record its exit code for the cpulaunch that started
    torchrun (torchrun itself reports every failure as exit code 1)."""
    import time

    from cpulaunch import launch

    # The program was checked by the cpulaunch that started torchrun.
    outcome = launch.supervise(rendered.instances, environ, prefix_output=False,
                               grace_period=kw["grace_period"])
    record = {"rank": ctx.rank, "exit_code": outcome.exit_code, "time": time.time()}
    try:
        Path(status_dir, f"rank{ctx.rank}.json").write_text(json.dumps(record))
    except OSError:
        pass
    return outcome.exit_code


def _ddp_start_torchrun(topo, req, program, kw, backend, backend_note, reserve) -> int:
    """Plan this machine's ranks and start torchrun with cpulaunch as each rank's entry."""
    import tempfile
    from dataclasses import replace

    from cpulaunch import distributed as dist
    from cpulaunch import launch
    from cpulaunch.plan import PlanError, plan
    from cpulaunch.render import RenderedInstance

    try:
        node_plan = plan(topo, replace(dist.rank_request(req, kw["nproc_per_node"], topo),
                                       reserve_cores=reserve))
    except (PlanError, dist.DistributedError) as exc:
        raise UsageError(str(exc)) from None
    nproc = len(node_plan.instances)
    nnodes = str(kw["nnodes"])
    elastic = bool(kw["rdzv_endpoint"])
    if not elastic and not nnodes.isdigit():
        raise UsageError(f"--nnodes {nnodes}: a MIN:MAX range needs --rdzv-endpoint HOST:PORT (elastic)")
    if not elastic and int(nnodes) > 1 and not kw["master_addr"]:
        raise UsageError("--nnodes > 1 needs --master-addr HOST (rank 0's machine) or --rdzv-endpoint HOST:PORT")
    if not elastic and not 0 <= kw["node_rank"] < int(nnodes):
        raise UsageError(f"--node-rank {kw['node_rank']} must be between 0 and --nnodes - 1")
    addr = kw["master_addr"] or "127.0.0.1"
    port = kw["master_port"] or dist.DEFAULT_MASTER_PORT
    # One machine and no address given: torchrun --standalone picks a free port itself.
    standalone = not elastic and nnodes == "1" and not kw["master_addr"] and not kw["master_port"]

    # Each rank's variables as torchrun will set them (static rendezvous), for display.
    notes = [backend_note]
    instance_env = {}
    reserved_all = [i.reserved_cpus for i in node_plan.instances]
    for inst in node_plan.instances:
        if elastic:
            ctx = dist.RankContext("torchrun", -1, -1, inst.index, nproc)
            env = {"LOCAL_RANK": str(inst.index), "LOCAL_WORLD_SIZE": str(nproc),
                   dist.BACKEND_ENV: backend}
        else:
            ctx = dist.RankContext("torchrun", kw["node_rank"] * nproc + inst.index,
                                   int(nnodes) * nproc, inst.index, nproc)
            env = dist.rank_env(ctx, addr, port, backend)
            if standalone:
                del env["MASTER_ADDR"], env["MASTER_PORT"]
        env.update(dist.iface_env(kw["iface"]))
        if backend == "ccl":
            env.update(dist.ccl_env(ctx, reserved_all))
        instance_env[inst.index] = env
    if standalone:
        notes.append("one machine: torchrun --standalone chooses MASTER_ADDR and a free MASTER_PORT")
    if elastic:
        notes.append("elastic rendezvous: RANK and WORLD_SIZE are known only after it")
    rendered, settings = render_for_host(replace(node_plan, notes=node_plan.notes + tuple(notes)),
                                         program, kw, topo, os.environ, instance_env=instance_env)

    entry = [sys.executable, "-m", "cpulaunch", "--rank-entry", "--ddp",
             "--nproc-per-node", str(kw["nproc_per_node"] or "socket"),
             "--backend", backend, "--ccl-worker-count", str(kw["ccl_worker_count"]),
             "--mem-policy", kw["mem_policy"], "--omp-runtime", kw["omp_runtime"],
             "--allocator", kw["allocator"], "--bind", kw["bind"],
             "--grace-period", str(kw["grace_period"])]
    for flag in ("use_logical_cores", "use_e_cores", "override_env"):
        if kw[flag]:
            entry.append("--" + flag.replace("_", "-"))
    for opt in ("core_list", "node_list", "iface", "inference_path"):
        if kw[opt]:
            entry += ["--" + opt.replace("_", "-"), str(kw[opt])]
    entry += ["--no-python", "--", *program]
    if standalone:
        trun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(nproc), "--no-python", *entry]
    else:
        trun = dist.torchrun_argv(sys.executable, nproc, nnodes, kw["node_rank"], addr, port,
                                  kw["rdzv_endpoint"], kw["rdzv_id"], entry)
    if kw["dry_run"] or kw["print_env"]:
        return emit_or_launch(rendered, settings, topo, program, kw,
                              extra_json={"ddp": {"engine": "torchrun", "backend": backend,
                                                  "nproc_per_node": nproc, "nnodes": nnodes,
                                                  "launcher_argv": trun}})
    _require_program(program)
    for note in rendered.notes:
        log.warning("note: %s", note)
    with tempfile.TemporaryDirectory(prefix="cpulaunch-ddp-") as status_dir:
        env = {STATUS_DIR_ENV: status_dir}
        if "OMP_NUM_THREADS" in os.environ:
            env[USER_OMP_ENV] = "1"
        runner = RenderedInstance(index=0, cpus=(), bound_cpus=(), mem_nodes=(), mem_policy="none",
                                  env=env, argv=tuple(trun), prefix=())
        outcome = launch.supervise([runner], os.environ, prefix_output=False,
                                   grace_period=kw["grace_period"] + 5)
        if outcome.exit_code == 0:
            return 0
        records = []
        for f in Path(status_dir).glob("rank*.json"):
            try:
                records.append(json.loads(f.read_text()))
            except (OSError, ValueError):
                pass
        failed = sorted((r for r in records if r.get("exit_code")), key=lambda r: r["time"])
        if failed:
            log.warning("rank %d failed first (exit code %d)", failed[0]["rank"], failed[0]["exit_code"])
            return int(failed[0]["exit_code"])
        return outcome.exit_code


# --------------------------------------------------------------------------- topology view

#: /proc/cpuinfo flags that decide oneDNN's kernels: AVX2/AVX-512 for fp32, VNNI for int8,
#: AVX512_BF16 and AMX for bf16 (Intel's optimization guide for PyTorch on CPU).
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
             "amx_bf16", "amx_int8", "asimd", "sve")


def draw_topology(topo) -> str:
    """A person's view: sockets -> NUMA nodes -> cores with SMT siblings.

    Marks: ``E`` an E-core, ``!`` a CPU this process may not use; offline CPUs and
    memory-only nodes are listed at the end.
    """
    def gib(kb):
        return f"{kb / 2**20:.1f} GiB" if kb else "? GiB"

    lines = [
        f"{topo.model or 'CPU'} ({topo.source}): {len(topo.sockets)} socket(s), "
        f"{len([n for n in topo.nodes.values() if n.cpus])} NUMA node(s) with CPUs, "
        f"{len(topo.cores)} cores, {len(topo.online)} logical CPUs online",
        f"allowed CPUs: {cpulist.format(topo.allowed)} ({topo.allowed_source})"
        + (f"; CPU quota {topo.quota_cpus:g}" if topo.quota_cpus else ""),
    ]
    if topo.flags:
        # The instruction sets PyTorch's CPU kernels (oneDNN) choose between.
        have = [f for f in ISA_FLAGS if f in topo.flags]
        lines.append("ISA for PyTorch: " + (" ".join(have) if have else "none of " + " ".join(ISA_FLAGS)))
    for sock in topo.sockets:
        pkg = f"package {sock.package_id}" if sock.package_id is not None else "no package id"
        lines.append(f"socket {sock.index} ({pkg}): CPUs {cpulist.format(sock.cpus)}")
        node_ids = list(sock.nodes) or [None]
        for nid in node_ids:
            node = topo.nodes.get(nid) if nid is not None else None
            if node is not None:
                mem = gib(node.mem_total_kb) if node.has_memory else "no memory"
                lines.append(f"  node {nid} ({mem})")
            else:
                lines.append("  (no NUMA node)")
            for core in topo.cores:
                if core.socket != sock.index or core.node != nid:
                    continue
                cpus = " ".join(f"{c}{'' if c in topo.allowed else '!'}" for c in core.cpus)
                tag = " E" if core.efficiency else ""
                lines.append(f"    core {core.id}{tag}: {cpus}")
    mem_only = [n for n in topo.nodes.values() if not n.cpus]
    if mem_only:
        lines.append(
            "memory-only nodes: "
            + ", ".join(f"{n.id} ({gib(n.mem_total_kb)})" for n in sorted(mem_only, key=lambda n: n.id))
        )
    if topo.offline:
        lines.append(f"offline CPUs: {cpulist.format(topo.offline)}")
    if any(c not in topo.allowed for c in topo.online):
        lines.append("! = not allowed for this process (affinity mask / cgroup cpuset)")
    for note in topo.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"
