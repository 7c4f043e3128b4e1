"""The ``cpulaunch`` command: parse the options into one typed value, call the core, map errors.

Nothing else lives here. This is the only module that configures logging and maps
exceptions to exit codes: :class:`~cpulaunch.errors.CpulaunchError` (and click's usage
errors) -> one line ``cpulaunch: error: ...``, exit code 2; anything else is ours ->
``cpulaunch: internal error: ...``, exit code 70, the traceback with ``-v``. It must not
import torch.

The command line is strict: before the program, every word must be one of cpulaunch's
options (an unknown one is an error with a "did you mean" hint). The program starts at
the first word that is not an option, after ``--``, or at Python's ``-m MODULE`` /
``-c CODE``; the program's own words are never read.
"""

from __future__ import annotations

import sys

import click

from cpulaunch import __version__
from cpulaunch.errors import INTERNAL_EXIT, USAGE_EXIT, CpulaunchError
from cpulaunch.machine.libraries import ALLOCATOR_CHOICES, OPENMP_CHOICES, REGISTRY
from cpulaunch.options import ALIASES, Format

#: Options whose count is optional: a bare flag means 1 (``--instances-per-socket
#: python x.py``).
OPTIONAL_COUNT_OPTIONS = ("--instances-per-socket", "--instances-per-node")
#: Subcommands, dispatched on the first word (a program of that name: ``cpulaunch -- doctor``).
SUBCOMMANDS = ("doctor", "verify", "tune")
#: Python's own short options that start a Python program (``-m mod``, ``-c code``).
PYTHON_PROGRAM_OPTIONS = ("-m", "-c", "--module")


def split_argv(args: list, value_opts: set) -> tuple:
    """Split the words after ``cpulaunch`` into (cpulaunch's words, the program's words).

    ``["--ninstances", "2", "python", "x.py", "--ninstances"]`` -> ``(["--ninstances",
    "2"], ["python", "x.py", "--ninstances"])``. A bare optional-count option becomes
    ``--opt=1``. Unknown options stay on our side so click names them (with a hint).
    """
    ours, i = [], 0
    while i < len(args):
        tok = args[i]
        if tok == "--":
            return ours, args[i + 1:]
        name = tok.split("=", 1)[0]
        if name in PYTHON_PROGRAM_OPTIONS or (tok[:2] in ("-m", "-c") and not tok.startswith("--")):
            return ours, args[i:]
        if not tok.startswith("-") or tok == "-":
            return ours, args[i:]
        if name.replace("_", "-") in OPTIONAL_COUNT_OPTIONS and "=" not in tok:
            nxt = args[i + 1] if i + 1 < len(args) else ""
            if nxt.isdigit():
                ours += [tok, nxt]
                i += 2
            else:
                ours.append(f"{name}=1")
                i += 1
            continue
        ours.append(tok)
        if name in value_opts and "=" not in tok and i + 1 < len(args):
            ours.append(args[i + 1])
            i += 1
        i += 1
    return ours, []


class _Command(click.Command):
    def parse_args(self, ctx, args):
        value_opts = set()
        for p in self.get_params(ctx):
            if isinstance(p, click.Option) and not (p.is_flag or p.count):
                value_opts.update(p.opts + p.secondary_opts)
        ours, program = split_argv(list(args), value_opts)
        return super().parse_args(ctx, ours + (["--", *program] if program else []))


def _names(name: str, *aliases: str) -> list:
    """``--foo-bar``, torchrun's ``--foo_bar``, and the given aliases (with theirs)."""
    out = []
    for n in (name, *aliases):
        out.append(n)
        if "-" in n[2:]:
            out.append("--" + n[2:].replace("-", "_"))
    return out


def _opt(name, *aliases, dest=None, **kw):
    return click.option(dest or name[2:].replace("-", "_"), *_names(name, *aliases), **kw)


def _choice(values):
    return click.Choice(list(values), case_sensitive=False)


def _lib_help(kind: str) -> str:
    return "; ".join(f"{lib.choice}: {lib.help}" for lib in REGISTRY.values() if lib.kind == kind)


ALIAS_HELP = "\n".join(f"  {alias:<24} = {meaning}" for alias, meaning in ALIASES.items())
EPILOG = ("\b\nAliases (other launchers' spellings, same meaning; every option also takes "
          "--name_with_underscores):\n" + ALIAS_HELP)
CONTEXT = {"allow_interspersed_args": False, "auto_envvar_prefix": "CPULAUNCH",
           "help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.command(cls=_Command, context_settings=CONTEXT, epilog=EPILOG)
@click.version_option(__version__, "--version")
@_opt("--sysroot", type=click.Path(file_okay=False), default="/", show_default=True,
      help="Read the machine from this root (like lscpu --sysroot); for dumps of other machines.")
@_opt("--show-topology", is_flag=True, help="Draw sockets, nodes, cores and SMT siblings (--format json too).")
@_opt("--print-env", is_flag=True, help="Print one instance's environment for a shell (see --format).")
@_opt("--dry-run", is_flag=True, help="Show each instance's command, env and notes; run nothing.")
@_opt("--format", dest="fmt", type=_choice(f.value for f in Format), default=None,
      help="--dry-run: text|json; --print-env: shell|dotenv|json|omp-bind|vllm|sglang; --show-topology: text|json.")
@_opt("--ninstances", type=int, default=None, help="Number of instances (every usable core is used).")
@_opt("--instances-per-socket", type=int, default=None, help="Instances per socket; bare flag = 1.")
@_opt("--instances-per-node", type=int, default=None, help="Instances per NUMA node; bare flag = 1.")
@_opt("--ncores-per-instance", type=int, default=None, help="Physical cores per instance.")
@_opt("--latency-mode", is_flag=True, help="4 cores per instance, as many instances as fit.")
@_opt("--throughput-mode", is_flag=True, help="One instance per NUMA node.")
@_opt("--use-logical-cores", is_flag=True, help="Give instances every SMT sibling of their cores.")
@_opt("--use-logical-core", is_flag=True, hidden=True)
@_opt("--use-e-cores", is_flag=True, help="Also use the E-cores of hybrid CPUs.")
@_opt("--core-list", default=None, help="Use only these logical CPUs, e.g. 0-31,64-95.")
@_opt("--node-list", default=None, help="Use only the CPUs of these NUMA nodes, e.g. 0,2.")
@_opt("--node-id", type=int, default=None, hidden=True)
@_opt("--instance-idx", default=None, help="Run only these instances (e.g. 0,2); --print-env: which one.")
@_opt("--dataloader-workers", type=int, default=None,
      help="Cores per instance set aside for DataLoader workers (CPULAUNCH_DATALOADER_CPUS).")
@_opt("--reserve-cores", type=int, default=None,
      help="Cores per instance set aside for the program's own threads (CPULAUNCH_RESERVED_CPUS).")
@_opt("--mem-policy", type=_choice(["bind", "preferred", "interleave", "local", "none"]), default="bind",
      show_default=True, help="NUMA memory policy on the nodes of each instance's CPUs.")
@_opt("--omp-runtime", type=_choice(OPENMP_CHOICES), default="auto", show_default=True,
      help="OpenMP runtime (auto: torch's own) - " + _lib_help("openmp") + ".")
@_opt("--allocator", type=_choice(ALLOCATOR_CHOICES), default="auto", show_default=True,
      help="Allocator to preload (auto: tcmalloc if installed; default: the C library's) - "
           + _lib_help("allocator") + ".")
@_opt("--bind", type=_choice(["numactl", "affinity", "none"]), default="numactl", show_default=True,
      help="How to bind: numactl (CPUs and memory), affinity (CPUs only), none.")
@_opt("--disable-numactl", is_flag=True, hidden=True)
@_opt("--disable-taskset", is_flag=True, hidden=True)
@_opt("--enable-tcmalloc", is_flag=True, hidden=True)
@_opt("--enable-jemalloc", is_flag=True, hidden=True)
@_opt("--use-default-allocator", is_flag=True, hidden=True)
@_opt("--disable-iomp", is_flag=True, hidden=True)
@_opt("--multi-instance", is_flag=True, hidden=True)
@_opt("--kmp-blocktime", type=int, default=None,
      help="KMP_BLOCKTIME in ms for --omp-runtime intel (default 1, the tuning guide's).")
@_opt("--config", type=click.Path(dir_okay=False), default=None, expose_value=False, is_eager=True,
      callback=lambda ctx, param, value: _load_config(ctx, value),
      help="Defaults from a TOML file (tune's best.toml, or [tool.cpulaunch] of a pyproject.toml); "
           "precedence: flags > CPULAUNCH_* variables > this file > built-in defaults.")
@_opt("--omp-places", is_flag=True, help="Pin GNU OpenMP threads with OMP_PLACES/OMP_PROC_BIND.")
@_opt("--override-env", is_flag=True, help="cpulaunch's values win over ones already in your environment.")
@_opt("--no-python", is_flag=True, help="Run the program as it is, even if it ends in .py.")
@_opt("--log-dir", type=click.Path(file_okay=False), default=None,
      help="Logs as DIR/<run-id>/<i>/stdout.log|stderr.log, plan.json, result.json.")
@_opt("--log-path", type=click.Path(file_okay=False), default=None, hidden=True)
@_opt("--no-prefix", is_flag=True, help="Do not prefix instances' console lines with [i].")
@_opt("--stdin-instance", type=int, default=None,
      help="Instance that reads cpulaunch's stdin (default: the only one; none when several).")
@_opt("--keep-going", is_flag=True, help="When an instance fails, let the others finish.")
@_opt("--grace-period", type=float, default=10.0, show_default=True,
      help="Seconds between SIGTERM and SIGKILL when stopping instances.")
@_opt("--verify", is_flag=True, help="After start-up, check what the processes really got (verify.json).")
@_opt("--verify-after", type=float, default=None, help="Seconds after start for --verify (default 5).")
@_opt("--inference-path", type=click.Choice(["auto", "eager", "onednn-graph", "inductor"]), default=None,
      help="Tell the program which inference path to use (CPULAUNCH_INFERENCE_PATH).")
@_opt("--ddp", is_flag=True, help="Distributed training: one rank per socket (see --nproc-per-node).")
@_opt("--standalone", is_flag=True, help="--ddp on this machine only (torchrun's flag).")
@_opt("--nproc-per-node", default=None, help="--ddp ranks on this node: a number, 'socket' or 'node'.")
@_opt("--nnodes", default=None, help="--ddp: number of machines (MIN:MAX with --rdzv-endpoint); default 1.")
@_opt("--node-rank", type=int, default=None, help="--ddp: this machine's rank (default 0).")
@_opt("--master-addr", default=None, help="--ddp: address of rank 0's machine (default 127.0.0.1).")
@_opt("--master-port", type=int, default=None, help="--ddp: port of rank 0's store (default: a free one).")
@_opt("--rdzv-endpoint", default=None, help="--ddp: elastic c10d rendezvous HOST:PORT (torchrun starts ranks).")
@_opt("--rdzv-id", default=None, help="--ddp: rendezvous job id (elastic).")
@_opt("--rdzv-backend", default=None, hidden=True)
@_opt("--backend", type=_choice(["auto", "gloo", "ccl"]), default=None,
      help="--ddp: process-group backend (auto: ccl when oneccl_bindings_for_pytorch is usable).")
@_opt("--ccl-worker-count", type=int, default=None, help="--ddp with ccl: cores per rank for oneCCL workers (1).")
@_opt("--iface", default=None, help="--ddp: network interface (GLOO_SOCKET_IFNAME, CCL_KVS_IFACE, FI_TCP_IFACE).")
@click.option("-v", "--verbose", count=True, help="More diagnostics on stderr (-v: commands, notes, logs).")
@click.argument("program", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def command(ctx, **values):
    """Run PROGRAM on the right CPUs, memory, threads and libraries.

    \b
    Examples:
      cpulaunch --instances-per-socket python infer.py
      cpulaunch --ninstances 4 --log-dir logs infer.py --batch-size 8
      cpulaunch --dry-run --format json --sysroot DUMP true
      eval "$(cpulaunch --print-env)"; $CPULAUNCH_PREFIX python infer.py
      cpulaunch --ddp python train.py
      cpulaunch doctor | cpulaunch verify PID | cpulaunch tune -- python infer.py
    """
    from cpulaunch import core, options

    given = frozenset(n for n in values
                      if ctx.get_parameter_source(n) not in (None, click.core.ParameterSource.DEFAULT))
    _configure_logging(values.get("verbose") or 0)
    opts = options.from_values(values, given)
    return core.run(opts)


def _load_config(ctx, path) -> None:
    """``--config FILE``: its values become click's default_map, which click consults
    after the command line and CPULAUNCH_* variables and before built-in defaults."""
    if not path:
        return
    from cpulaunch.options import config_defaults

    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror or exc}") from None
    known = {p.name for p in ctx.command.params}
    ctx.default_map = {**(ctx.default_map or {}), **config_defaults(data, path, known)}


def _configure_logging(verbose: int, now: bool = False) -> None:
    """The command line's logging: ``cpulaunch: MESSAGE`` on stderr at WARNING (INFO with
    -v, DEBUG with -vv); logging itself is imported at the first message (cpulaunch.log)."""
    from cpulaunch import log

    log.configure(verbose, _basic_config, now=now)


def _basic_config(level: int) -> None:
    import logging

    logging.basicConfig(level=level, format="cpulaunch: %(message)s", stream=sys.stderr)


def _one_line(text: str) -> str:
    from cpulaunch.render import one_line

    return one_line(" ".join(str(text).split("\n")).strip())


def _fail(message: str, code: int) -> int:
    try:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return code


def main(argv=None) -> int:
    """Console-script entry point: returns (and exits with) the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    verbose = any(a in ("-v", "--verbose") or (a.startswith("-v") and set(a[1:]) == {"v"})
                  for a in args[: (args.index("--") if "--" in args else len(args))])
    try:
        if args and args[0] in SUBCOMMANDS:
            from cpulaunch import subcommands

            _configure_logging(1 if verbose else 0, now=True)
            code = subcommands.main(args[0], args[1:])
        else:
            code = command.main(args=args, prog_name="cpulaunch", standalone_mode=False)
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.exceptions.Abort:
        code = 130
    except click.UsageError as exc:
        where = f"cpulaunch {args[0]}" if args and args[0] in SUBCOMMANDS else "cpulaunch"
        code = _fail(f"cpulaunch: error: {_one_line(exc.format_message())} (see {where} --help)", USAGE_EXIT)
    except CpulaunchError as exc:
        code = _fail(f"cpulaunch: error: {_one_line(exc)}", USAGE_EXIT)
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        code = 141  # our stdout's reader went away (e.g. `cpulaunch --dry-run | head -1`)
    except Exception as exc:  # noqa: BLE001 - ours, reported as ours
        if verbose:
            import traceback

            traceback.print_exc()
        code = _fail(f"cpulaunch: internal error: {type(exc).__name__}: {_one_line(exc)} (a bug in "
                     "cpulaunch; run with -v for the traceback and report it)", INTERNAL_EXIT)
    code = 0 if code is None else int(code)
    _quiet_exit(code)
    return code


def _quiet_exit(code: int) -> None:
    """Flush stdout, ignoring a reader that went away (no "Exception ignored" message)."""
    import os

    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
