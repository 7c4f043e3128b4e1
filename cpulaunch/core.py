"""The core of one invocation: Options -> probe -> host facts -> plan -> render -> print or launch.

Data flows one way. The host is read twice, both before planning: the topology
(:mod:`cpulaunch.machine.probe`) and the other facts (:mod:`cpulaunch.machine.host`: libraries, numactl,
engine, a free port). Planning and rendering are pure and happen once; ``--dry-run`` and
``--print-env`` print the very :class:`Prepared` value a run launches.
"""

from __future__ import annotations

import os
import sys
from types import MappingProxyType

from cpulaunch import cpulist, forms, placement
from cpulaunch import log as _log
from cpulaunch.errors import CpulaunchError
from cpulaunch.machine.exec import which
from cpulaunch.machine.topology import Topology
from cpulaunch.options import BindMode, Format, Options, Output
from cpulaunch.plan import Plan
from cpulaunch.spelling import Spellings
from cpulaunch.records import TYPE_CHECKING, Record

if TYPE_CHECKING:
    from typing import Callable, Mapping, Optional

    from cpulaunch.render import Rendered, Settings

    #: ``--verify``'s check, called once with (the rendered plan, the settings, {instance
    #: index: pid}, the run's folder or None) while the instances run.
    Verifier = Callable[[Rendered, Settings, Mapping[int, int], object], None]

__all__ = ["Prepared", "probe_topology", "host_query", "prepare", "execute", "output_text", "run", "write_out"]

log = _log.get("cpulaunch")



class Prepared(Record):
    """Everything a run needs, computed once (what --dry-run prints is this value).

    Attributes:
        opts: the options.
        topo: the machine.
        host: host facts (None for --show-topology).
        plan: the plan (ranks for --ddp).
        settings: library/binding choices resolved against the host.
        rendered: each instance's env and argv, and every note.
        program: the program's argv (empty when none was given to --dry-run/--print-env).
        ddp_info: the ``ddp`` member of the JSON plan, or None.
        elastic_argv: the torchrun command for an elastic --ddp run, else None.
        elastic_env: what that torchrun gets in its environment beyond the user's.
        lease: the cores this run claimed with ``--share-host``
            (:class:`cpulaunch.machine.lease.Lease`), held until the run ends; else None.
    """

    opts: Options
    topo: Topology
    host: object = None
    plan: Optional[Plan] = None
    settings: Optional[Settings] = None
    rendered: Optional[Rendered] = None
    program: tuple[str, ...] = ()
    ddp_info: Optional[Mapping[str, object]] = None
    elastic_argv: Optional[tuple[str, ...]] = None
    elastic_env: Mapping[str, str] = MappingProxyType({})
    lease: object = None


# --------------------------------------------------------------------------- steps


def probe_topology(opts: Options, caches: bool = False) -> Topology:
    """Read the machine at ``opts.sysroot``. Raises CpulaunchError for a missing folder
    or an unusable tree (one line naming the file). Each core's core_id (display only) is
    not read: half the per-core reads on a big machine (issue 12). ``caches``: read the
    cache domains too (:func:`cache_need`)."""
    from cpulaunch.machine import probe

    probe.check_sysroot(opts.sysroot)
    return probe.probe(opts.sysroot, core_ids=False, caches=caches)


def host_query(opts: Options):
    """What the host reader must find for ``opts`` (:class:`cpulaunch.machine.host.HostQuery`):
    the libraries the options name (``auto`` read once, :func:`libraries.resolve_choice`),
    numactl and its check when binding with it, a free port for a one-machine --ddp run
    without --master-port, oneCCL's bindings for --ddp unless --backend gloo, zentorch's
    import for --inference-path zentorch (a one-line note where it is refused)."""
    from cpulaunch.machine import libraries
    from cpulaunch.machine.host import HostQuery

    names = []
    if opts.allocator != "default":
        names.append(libraries.by_choice("allocator", libraries.resolve_choice("allocator", opts.allocator)).name)
    if opts.omp_runtime != "auto":
        names.append(libraries.by_choice("openmp", opts.omp_runtime).name)
    numactl = opts.bind is BindMode.NUMACTL
    ddp = opts.ddp
    return HostQuery(
        sysroot=opts.sysroot, libraries=tuple(names), numactl=numactl or opts.bind is BindMode.AFFINITY,
        numactl_policy=opts.request.mem_policy if numactl else None,
        free_port=ddp is not None and ddp.master_port is None and ddp.nnodes == "1" and not ddp.master_addr
        and not ddp.elastic,
        ccl_program=opts.program if ddp is not None and ddp.backend != "gloo" else None,
        zentorch_program=opts.program if opts.inference_path == "zentorch" else None,
        interfaces=ddp is not None and bool(ddp.iface))


def _resolve_program(opts: Options, python: str) -> tuple:
    from cpulaunch.render import ProgramError, resolve_program

    try:
        return resolve_program(opts.program, no_python=opts.no_python, python=python)
    except ProgramError:
        if opts.output in (Output.DRY_RUN, Output.PRINT_ENV) and not opts.program:
            return ()
        raise


def _backend(opts: Options, host, environ: Mapping[str, str]) -> tuple:
    from cpulaunch import distributed

    return distributed.select_backend(opts.ddp.backend, host.ccl, host.fabric, environ)


def _check_rendezvous(ddp, host) -> None:
    """``--iface`` names an interface this machine has (when it is this machine's plan) and
    ``--master-addr`` is a host, not ``host:port`` (:mod:`cpulaunch.slips`): else each rank
    would die in its backend with a traceback.

    Raises:
        CpulaunchError: one line with the fix.
    """
    from cpulaunch import slips

    problem = (slips.iface_problem(ddp.iface, host.interfaces, ddp.said("iface")) if ddp.iface else None) or \
        (slips.master_addr_problem(ddp.master_addr, ddp.said("master_addr")) if ddp.master_addr else None)
    if problem:
        raise CpulaunchError(problem)


def prepare(opts: Options, environ: Mapping[str, str]) -> Prepared:
    """Probe, gather host facts, plan and render: everything but the launch (and, with
    ``--share-host``, claim the planned cores before a run: :func:`_prepare_shared`).

    Raises:
        CpulaunchError: anything the user can fix (one line).
    """
    from cpulaunch.machine import host as host_mod

    topo = probe_topology(opts, caches=placement.cache_need(opts, environ))
    if opts.output is Output.SHOW_TOPOLOGY:
        return Prepared(opts=opts, topo=topo)
    gathering = host_mod.start_gather(host_query(opts), topo, environ)
    try:  # the planner's last modules (settings, render, forms) load while numactl's check runs (issue 40)
        import cpulaunch.settings  # noqa: F401
    finally:
        host = gathering.host()
    if opts.share_host is not None:
        return _prepare_shared(opts, topo, host, environ)
    return _prepare_plan(opts, topo, host, environ)


def _prepare_plan(opts: Options, topo: Topology, host, environ: Mapping[str, str]) -> Prepared:
    """Plan and render on ``topo`` (:func:`prepare` without the probe)."""
    from cpulaunch.render import render
    from cpulaunch.settings import resolve_settings, supervised

    program = _resolve_program(opts, host.python)
    ddp_info, label, instance_env, run_environ, programs = None, "instance", {}, environ, {}
    if opts.ddp is not None:
        from cpulaunch import distributed

        _check_rendezvous(opts.ddp, host)
        backend, note = _backend(opts, host, environ)
        ranks = distributed.plan_ranks(topo, opts.request, opts.ddp, environ, engine=host.engine,
                                       backend=backend, backend_note=note, free_port=host.free_port,
                                       fabric=host.fabric, override_env=opts.override_env,
                                       program=program, python=host.python)
        the_plan = ranks.plan._replace(notes=ranks.notes)
        ddp_info, label, instance_env, run_environ = dict(ranks.info), "rank", ranks.instance_env, ranks.environ
        programs = ranks.instance_program
    else:
        the_plan = placement.plan_here(opts, topo, host.engine)
    elastic = opts.ddp is not None and opts.ddp.elastic and host.engine is None
    relayed = opts.output is not Output.PRINT_ENV and supervised(opts, len(the_plan.instances), elastic)
    settings, notes = resolve_settings(opts, topo, host, run_environ, label, instance_env, relayed, programs)
    if relayed and opts.ddp is None and opts.launch.failure_record:
        notes += [n for n in [_failure_record_note(program, host.python)] if n]
    rendered = render(the_plan, program, settings)
    rendered = rendered._replace(notes=opts.notes + rendered.notes + tuple(notes))
    prepared = Prepared(opts=opts, topo=topo, host=host, plan=the_plan, settings=settings,
                        rendered=rendered, program=program, ddp_info=ddp_info)
    if elastic:
        from cpulaunch import distributed

        argv = distributed.torchrun_argv(host.python, len(rendered.instances), opts.ddp.nnodes, 0, None, None,
                                         opts.ddp.rdzv_endpoint, opts.ddp.rdzv_id,
                                         [host.python, "-m", "cpulaunch.rank_entry"],
                                         max_restarts=opts.ddp.max_restarts,
                                         streams=opts.launch.stream_plan.torchrun_args(
                                             len(rendered.instances), opts.launch.log_dir))
        agent_env = distributed.elastic_agent_env(opts.ddp.nnodes, environ)
        prepared = prepared._replace(elastic_argv=tuple(argv), elastic_env=agent_env,
                                     ddp_info={**ddp_info, "launcher_argv": list(argv),
                                               "launcher_env": dict(agent_env)})
    return prepared


#: How often a --share-host run reads, plans and claims again after another job took one
#: of its cores between its read and its claim.
_CLAIM_TRIES = 100


def _prepare_shared(opts: Options, topo: Topology, host, environ: Mapping[str, str]) -> Prepared:
    """``--share-host``: read the leases, plan on the cores no other job holds, and (a
    run only) claim every CPU of the planned cores; a lost race reads and plans again.
    Where the request does not fit on the free cores: wait until more of the job's
    allowed CPUs are free (``wait``), or fail naming the holders (``fail``). The protocol
    is :mod:`cpulaunch.machine.lease`'s.

    Raises:
        CpulaunchError: several local tasks under an engine, the request does not fit in
            the job's own allowed CPUs (at once, whoever holds
            what), the lease folder unusable, or the free cores too few (naming who holds
            the others).
    """
    from cpulaunch.machine import lease
    from cpulaunch.plan import PlanError

    if host.engine is not None and host.engine.local_world_size > 1:
        raise CpulaunchError(f"--share-host does not apply under {host.engine.engine} with several tasks "
                             "on this machine (each would plan alone); start one cpulaunch per machine")
    run = opts.output is Output.RUN
    whole = _prepare_plan(opts, topo, host, environ)  # a request that cannot fit at all fails here, at once
    with lease.Claimant(lease.space(opts.lease_dir, create=run), topo.online, topo.allowed,
                        tries=_CLAIM_TRIES, wait=opts.share_host == "wait") as claimant:
        leases = claimant.read()
        while True:
            try:
                p = _prepare_plan(opts, lease.without_held(topo, leases), host, environ) if leases.held else whole
            except PlanError as exc:
                leases = claimant.blocked(leases, str(exc), wait=opts.share_host == "wait", say=log.warning)
                continue
            p = p._replace(rendered=p.rendered._replace(notes=p.rendered.notes + lease.notes(leases, run)))
            if not run:
                return p
            got = claimant.claim({c for i in p.rendered.instances for cpu in i.bound_cpus
                                  for c in topo.core_of(cpu).cpus})
            if got is not None:
                return p._replace(lease=got)
            leases = claimant.read()  # a race lost: read all again


# --------------------------------------------------------------------------- output


def output_text(p: Prepared) -> str:
    """The text --dry-run, --print-env or --show-topology prints (pure over ``p``)."""
    from cpulaunch import forms as r

    fmt = p.opts.fmt
    if p.opts.output is Output.SHOW_TOPOLOGY:
        if fmt is Format.JSON:
            return _json_text(p.topo.to_dict())
        if fmt is Format.SVG:
            from cpulaunch.svg import plan_svg

            return plan_svg(p.topo)
        from cpulaunch.view import topology_text

        return topology_text(p.topo)
    rendered = p.rendered
    if p.opts.output is Output.DRY_RUN:
        if fmt is Format.SVG:
            from cpulaunch.svg import plan_svg

            return plan_svg(p.topo, rendered.instances)
        if fmt is Format.JSON:
            return r.plan_json(rendered, p.topo.to_dict(), {"ddp": p.ddp_info} if p.ddp_info else None) + "\n"
        text = r.dry_run_text(rendered)
        if p.elastic_argv:
            text += ("# then torchrun starts each rank's command above:\n"
                     + r.command_text(dict(p.elastic_env), p.elastic_argv) + "\n")
        return text
    if not rendered.instances:
        raise CpulaunchError("--print-env: no instance planned")
    if fmt in (Format.OMP_BIND, Format.VLLM, Format.SGLANG):
        if fmt is Format.OMP_BIND:
            return r.omp_bind_string(rendered) + "\n"
        return r.bind_lines(rendered, fmt.value)
    inst = rendered.instances[0]
    taskset = p.host.taskset or "taskset"
    if fmt is Format.DOTENV:
        return r.dotenv_lines(inst, taskset)
    if fmt is Format.JSON:
        doc = r.instance_dict(inst)
        doc["prefix"] = list(r.binding_prefix(inst, taskset))
        doc["notes"] = list(rendered.notes)
        return _json_text(doc)
    return r.shell_exports(inst, taskset)


def _json_text(doc) -> str:
    from cpulaunch.forms import json_text

    return json_text(doc) + "\n"


# --------------------------------------------------------------------------- launch


def _require_program(program: tuple, sizes: Optional[tuple[str, str]] = None) -> None:
    """The program can be started; else one line with the likely fix
    (:func:`cpulaunch.slips.missing_program`; ``sizes``: see there)."""
    if not program:
        from cpulaunch.render import ProgramError

        raise ProgramError("no program given; put it after cpulaunch's options, e.g. "
                           "`cpulaunch --instances-per-socket python infer.py`")
    if which(program[0]) is None:
        from cpulaunch import slips

        word = program[0]
        kind = "folder" if os.path.isdir(word) else "file" if os.path.exists(word) else "none"
        raise CpulaunchError(slips.missing_program(word, kind=kind, sizes=sizes))


def _sizes_given(opts: Options) -> Optional[tuple[str, str]]:
    """(--ncores-per-instance as the user spelled it, its value) when it was given."""
    req = opts.request
    if req.ncores_per_instance is None:
        return None
    said = req.said("ncores_per_instance")
    name = said.split(" ")[0].split("=")[0] if said.startswith("-") else "--ncores-per-instance"
    return name, str(req.ncores_per_instance).replace(" ", "")


def _specs(rendered: Rendered) -> list:
    from cpulaunch.launch.spawn import ProcessSpec

    return [ProcessSpec(index=i.index, label=i.label or f"instance {i.index}", argv=tuple(i.argv),
                        env=dict(i.env), affinity=i.affinity, cpus=tuple(i.cpus))
            for i in rendered.instances]


# --------------------------------------------------------------------------- --follow-cpuset (issue 35)


def _follower(p: Prepared, environ: Mapping[str, str]):
    """``--follow-cpuset``'s watcher (:class:`cpulaunch.launch.follow.Follower`): it plans
    again through :func:`_prepare_plan`, the run's own planning, on the topology of the CPUs
    the job may use now; with a count, as that many instances (:func:`_with_count`)."""
    from cpulaunch.launch.follow import Follower

    def replan(topo: Topology, count: Optional[int]) -> Rendered:
        opts = p.opts if count is None else _with_count(p.opts, count)
        return _prepare_plan(opts, topo, p.host, environ).rendered

    return Follower(p.topo, p.rendered, p.plan.num_instances, replan)


def _failure_record_note(program: tuple[str, ...], python: str):
    """The plan's note for what a supervised Python instance gets at start beyond its
    planned environment (issue 38: :func:`cpulaunch.distributed.record_hook_env` and the
    pipe, given by the launcher), or None for another program. Level EXPLAIN: ``-v`` in a
    run; the dry run and JSON keep it."""
    from cpulaunch.notes import explain
    from cpulaunch.render import runs_python

    if not runs_python(program, python):
        return None
    return explain("at start, each Python instance also gets cpulaunch's site hook first on PYTHONPATH "
                   "(CPULAUNCH_SITE_HOOKS=record) and a pipe, to record its first failure (--no-failure-record: off)")


def _with_count(opts: Options, count: int) -> Options:
    """``opts`` planning ``count`` instances (``--ninstances count``; ``--nproc-per-node
    count`` under --ddp), the other placement modes dropped."""
    if opts.ddp is not None:
        return opts._replace(ddp=opts.ddp._replace(nproc_per_node=str(count), words=Spellings()))
    req = opts.request._replace(ninstances=count, instances_per_socket=None, instances_per_node=None,
                                instances_per_l3=None, latency_mode=False, throughput_mode=False,
                                ncores_per_instance=None, words=Spellings())
    return opts._replace(request=req)


def _run_info(p: Prepared) -> str:
    from cpulaunch import forms as r

    return r.plan_json(p.rendered, p.topo.to_dict(), {"ddp": p.ddp_info} if p.ddp_info else None)


def _exec_single(p: Prepared, spec, environ: Mapping[str, str]) -> None:
    """Replace cpulaunch by the one instance (no supervisor needed, issue 12): the program
    keeps the --share-host lease across exec; ``-v`` says the command as the supervised path
    does. Returns only if exec fails (it raises then)."""
    from cpulaunch.launch.spawn import exec_spec

    if p.lease is not None:  # the program holds the --share-host lease while it runs
        p.lease.keep_across_exec()
    if log.isEnabledFor(_log.INFO):
        log.info("%s: %s (exec'd)", spec.label, forms.join(spec.argv))
    exec_spec(spec, environ)


def execute(p: Prepared, environ: Mapping[str, str], verifier: Optional[Verifier] = None) -> int:
    """Launch a prepared run; returns the exit code (the root cause's, 128+N for signal N).

    One instance without a log folder is exec'd (its signals and exit code are its own);
    several are supervised (launch.supervise.run_group); an elastic --ddp run starts torchrun with
    cpulaunch's rank entry. ``verifier``: what ``--verify`` calls once the instances run
    (``cli`` hands in ``cpulaunch.tools.verify.check_run``; the core imports no tool).

    Raises:
        CpulaunchError: the program cannot be started, the log folder cannot be made.
    """
    _require_program(p.program, _sizes_given(p.opts))
    from cpulaunch import notes as _notes
    from cpulaunch.settings import supervised

    _notes.say(p.rendered.notes, log)
    lopts = p.opts.launch
    if p.elastic_argv:
        return _execute_elastic(p, environ)
    specs = _specs(p.rendered)
    if lopts.stdin_instance is not None and lopts.stdin_instance not in {s.index for s in specs}:
        raise CpulaunchError(f"--stdin-instance {lopts.stdin_instance}: no such instance runs "
                             f"(instances {cpulist.format(s.index for s in specs)})")
    if not supervised(p.opts, len(specs)):
        _exec_single(p, specs[0], environ)
    from cpulaunch.launch.supervise import describe_failure, error_tail, run_group

    stdin_for = lopts.stdin_instance
    if stdin_for is None and len(specs) == 1:
        stdin_for = specs[0].index
    verified: list = []

    def check(pids: Mapping[int, int], run) -> None:
        verified.append(pids)
        verifier(follower.rendered if follower is not None else p.rendered, p.settings, pids, run)

    after = (lopts.verify_after, check) if lopts.verify_after is not None and verifier else None
    follower = _follower(p, environ) if lopts.follow_cpuset else None  # run_group closes it
    if follower is not None:
        specs = [s._replace(env={**s.env, **follower.env()}) for s in specs]
    if lopts.failure_record and p.opts.ddp is None:  # issue 38: a Python instance records its failure
        from cpulaunch.distributed import record_hook_env

        hook = record_hook_env(p.program, p.host.python, environ)  # given at start with the pipe
        specs = [s._replace(env={**s.env, **hook}) for s in specs]  # (the plan's note says so)
    outcome = run_group(
        specs, environ, log_dir=lopts.log_dir, run_info=_run_info(p), keep_going=lopts.keep_going,
        grace_period=lopts.grace_period, prefix_output=lopts.prefix_output and len(specs) > 1,
        stdin_for=stdin_for, after=after, watch=follower, records=lopts.failure_record,
        reap_orphans=not lopts.keep_orphans,
        streams={s.index: lopts.streams(s.index) for s in specs},
    )
    if outcome.orphans:
        log.warning("stopped %d process%s the instances left behind (--keep-orphans lets them run on)",
                    outcome.orphans, "es" if outcome.orphans > 1 else "")
    if after is not None and not verified:  # the check never ran: say why, in one line
        starts = [r.start for r in outcome.results if r.start is not None]
        ends = [r.end for r in outcome.results]
        done = bool(starts) and None not in ends and max(ends) - min(starts) < lopts.verify_after
        log.warning("verify: nothing to check: %s %g s (--verify-after)", "every instance had exited "
                    "before" if done else "the run was being stopped at", lopts.verify_after)
    if outcome.exit_code != 0 or outcome.signalled:
        log.error("%s", describe_failure(outcome, specs, keep_going=lopts.keep_going))  # an error: -q says it
        for line in error_tail(outcome):  # -v: the root cause's last error lines
            log.info("%s", line)
    return outcome.exit_code


def _execute_elastic(p: Prepared, environ: Mapping[str, str]) -> int:
    """Elastic --ddp: torchrun's c10d agent starts each rank as ``python -m
    cpulaunch.rank_entry``, which runs that local rank's rendered command
    (:mod:`cpulaunch.launch.elastic`)."""
    from cpulaunch.launch.elastic import run_elastic

    return run_elastic(p.elastic_argv, _specs(p.rendered), {**environ, **p.elastic_env}, log_dir=p.opts.launch.log_dir,
                       run_info=_run_info(p), grace_period=p.opts.launch.grace_period)


def run(opts: Options, environ: Optional[Mapping[str, str]] = None, out=None, *,
        verifier: Optional[Verifier] = None) -> int:
    """Carry out one invocation: prepare, then print (--dry-run, --print-env,
    --show-topology) or launch (``verifier``: see :func:`execute`). Returns the exit code."""
    environ = dict(os.environ if environ is None else environ)
    if opts.output is Output.RUN and opts.sysroot not in ("/", ""):
        from cpulaunch.machine.probe import is_live
        from cpulaunch.slips import SYSROOT_RUN

        if not is_live(opts.sysroot):
            raise CpulaunchError(SYSROOT_RUN)
    p = prepare(opts, environ)
    text = output_text(p) if opts.output is not Output.RUN else None
    if text is not None:
        write_out(text, out)
        if p.rendered is not None:
            # --print-env's shell, dotenv and bind-string forms have no room for notes (a
            # comment in an eval'd text is never seen), so they go to stderr, where a
            # `eval "$(cpulaunch --print-env)"` shows them; the other outputs hold them.
            if opts.output is Output.PRINT_ENV and opts.fmt is not Format.JSON:
                from cpulaunch import notes as _notes

                _notes.say(p.rendered.notes, log)
            else:
                for note in p.rendered.notes:
                    log.info("note: %s", note)
        return 0
    return execute(p, environ, verifier)


def write_out(text: str, out=None) -> None:
    """Write ``text`` to stdout as bytes, so values holding non-UTF-8 bytes (carried as
    surrogate escapes, as os.environ does) come out exactly as they came in."""
    stream = out or sys.stdout.buffer
    stream.write(text.encode("utf-8", "surrogateescape"))
    stream.flush()
