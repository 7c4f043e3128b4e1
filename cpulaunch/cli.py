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

import os
import sys

import click

from cpulaunch import __version__
from cpulaunch.errors import INTERNAL_EXIT, USAGE_EXIT, CpulaunchError
from cpulaunch.machine.libraries import ALLOCATOR_CHOICES, OPENMP_CHOICES, REGISTRY
from cpulaunch.options import ALIASES, Format, Kind, OptionsError

#: Options whose count is optional: a bare flag means 1 (``--instances-per-socket
#: python x.py``).
OPTIONAL_COUNT_OPTIONS = ("--instances-per-socket", "--instances-per-node", "--instances-per-l3")
#: Options whose value is optional, with the words they take: bare, the first word is
#: meant (``--share-host python x.py`` is ``--share-host=fail``).
OPTIONAL_WORD_OPTIONS = {"--share-host": ("fail", "wait")}
#: Subcommands, dispatched on the first word to ``cpulaunch.tools.<word>.main`` (a program of
#: that name: ``cpulaunch -- doctor``).
SUBCOMMANDS = ("doctor", "verify", "tune")
#: Python's own short options that start a Python program (``-m mod``, ``-c code``).
PYTHON_PROGRAM_OPTIONS = ("-m", "-c", "--module")
#: Parameters that are not settings: they act (print and exit) or name the settings' file.
#: They have no CPULAUNCH_* variable and no config key.
NOT_SETTINGS = ("help", "version", "config")
#: Variables that look like options' but are not read, each an error saying why: --help
#: and --version come from the command line only (a leftover CPULAUNCH_VERSION=1 would
#: turn every run into a version print that runs nothing and exits 0), and --format's
#: variable is CPULAUNCH_FORMAT (click derived CPULAUNCH_FMT from the parameter name
#: before issue 19; it is refused rather than kept as a second name).
#: Other launchers' options that cpulaunch spells differently, so that "did you mean" names
#: the right one rather than the nearest spelling (click's hint for ``--rank`` would be
#: ``--node-rank``, a --ddp option): run_cpu's ``--rank I`` (TorchServe passes it) runs
#: instance I of ``--ninstances N``, which is ``--instance-idx I`` here.
FOREIGN_OPTIONS = {"--rank": "--instance-idx"}
NOT_VARIABLES = {
    "CPULAUNCH_VERSION": "--version is read from the command line only",
    "CPULAUNCH_HELP": "--help is read from the command line only",
    "CPULAUNCH_FMT": "the variable of --format is CPULAUNCH_FORMAT",
}


def option_variable(long_name: str) -> str:
    """The environment variable of an option, from its long name (docs/cli.md's table):
    ``--format`` -> ``CPULAUNCH_FORMAT``, ``--log-dir`` -> ``CPULAUNCH_LOG_DIR``."""
    return "CPULAUNCH_" + long_name.lstrip("-").upper().replace("-", "_")


def split_argv(args: list[str], value_opts: set[str]) -> tuple[list[str], list[str]]:
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
        words = OPTIONAL_WORD_OPTIONS.get(name.replace("_", "-"))
        if words and "=" not in tok:
            nxt = args[i + 1] if i + 1 < len(args) else ""
            ours.append(f"{name}={nxt if nxt in words else words[0]}")
            i += 2 if nxt in words else 1
            continue
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
        for var, why in NOT_VARIABLES.items():
            if os.environ.get(var):  # empty counts as unset, as for every CPULAUNCH_* variable
                raise OptionsError(f"{var} is set in the environment, but {why}; unset {var}")
        value_opts = set()
        for p in self.get_params(ctx):
            if isinstance(p, click.Option) and not (p.is_flag or p.count):
                value_opts.update(p.opts + p.secondary_opts)
        ours, program = split_argv(list(args), value_opts)
        try:
            return super().parse_args(ctx, ours + (["--", *program] if program else []))
        except click.NoSuchOption as exc:
            if exc.option_name in FOREIGN_OPTIONS:
                exc.possibilities = [FOREIGN_OPTIONS[exc.option_name]]
            raise


class _ConfigOption(click.Option):
    """--config: remembers where its value came from, for messages naming --config or
    CPULAUNCH_CONFIG (click sets the parameter's source only after its callback ran)."""

    def consume_value(self, ctx, opts):
        value, source = super().consume_value(ctx, opts)
        ctx.meta["cpulaunch.config_source"] = source
        return value, source


def _names(name: str, *aliases: str) -> list:
    """``--foo-bar``, torchrun's ``--foo_bar``, and the given aliases (with theirs)."""
    out = []
    for n in (name, *aliases):
        out.append(n)
        if "-" in n[2:]:
            out.append("--" + n[2:].replace("-", "_"))
    return out


def _opt(name, *aliases, dest=None, **kw):
    """An option named ``name`` (and torchrun's underscore spelling, and ``aliases``) whose
    variable is :func:`option_variable` of ``name``, whatever its python name (``dest``)."""
    return click.option(dest or name[2:].replace("-", "_"), *_names(name, *aliases),
                        envvar=option_variable(name), **kw)


def _choice(values):
    return click.Choice(list(values), case_sensitive=False)


def _lib_help(kind: str) -> str:
    return "; ".join(f"{lib.choice}: {lib.help}" for lib in REGISTRY.values() if lib.kind == kind)


ALIAS_HELP = "\n".join(f"  {alias:<24} = {meaning}" for alias, meaning in ALIASES.items())
EPILOG = ("\b\nAliases (other launchers' spellings, same meaning; every option also takes "
          "--name_with_underscores):\n" + ALIAS_HELP + "\n\nEvery option but --help and --version also "
          "reads CPULAUNCH_<OPTION> from the environment (--log-dir: CPULAUNCH_LOG_DIR, --format: "
          "CPULAUNCH_FORMAT).")
# No auto_envvar_prefix: click would derive each variable from the python name (fmt ->
# CPULAUNCH_FMT) and give --help and --version one too; _opt names each explicitly.
CONTEXT = {"allow_interspersed_args": False, "help_option_names": ["-h", "--help"], "max_content_width": 100}


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
@_opt("--instances-per-l3", type=int, default=None,
      help="Instances per L3 cache domain (AMD CCX, Intel socket/SNC); bare flag = 1.")
@_opt("--ncores-per-instance", default=None,
      help="Physical cores per instance, or one count per instance: 43,43,42.")
@_opt("--equal-sizes", is_flag=True,
      help="Instances within one core of each other, even where nodes or L3 domains are uneven.")
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
@_opt("--config", cls=_ConfigOption, type=click.Path(dir_okay=False), default=None, expose_value=False,
      is_eager=True,
      callback=lambda ctx, param, value: _load_config(ctx, param, value),
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
@_opt("--max-restarts", type=int, default=None,
      help="--ddp with --rdzv-endpoint: times torchrun's agent restarts the ranks after a failure (0).")
@_opt("--backend", type=_choice(["auto", "gloo", "ccl"]), default=None,
      help="--ddp: process-group backend (auto: ccl when oneccl_bindings_for_pytorch loads with this torch "
      "and oneCCL's libfabric is found).")
@_opt("--ccl-worker-count", type=int, default=None,
      help="--ddp with ccl: cores per rank set aside for oneCCL's workers (default 1 when each rank has a core "
      "to spare; 0: none, the worker shares the rank's first CPU and yields).")
@_opt("--no-exit-hook", is_flag=True,
      help="--ddp: do not end a Python rank's process group at exit when the program did not "
           "(the hook is a sitecustomize first on PYTHONPATH; docs/training.md).")
@_opt("--pass-local-rank", is_flag=True,
      help="--ddp: also pass --local_rank=N to each rank's program after its script, as "
           "torch.distributed.launch did (LOCAL_RANK is always set).")
@_opt("--use-env", is_flag=True, hidden=True)
@_opt("--iface", default=None, help="--ddp: network interface (GLOO_SOCKET_IFNAME, CCL_KVS_IFACE, FI_TCP_IFACE).")
@_opt("--share-host", default=None,
      help="Claim the planned cores host-wide, so other cpulaunch jobs plan on the rest; "
           "fail (bare flag: name who holds them) or wait.")
@_opt("--lease-dir", type=click.Path(file_okay=False), default=None,
      help="Folder of --share-host's leases: a lease space of its own (default: the host's, "
           "/run/cpulaunch and /tmp/cpulaunch).")
@click.option("-v", "--verbose", count=True, envvar=option_variable("--verbose"), help="More diagnostics on stderr (-v: commands, notes, logs).")
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
    return core.run(opts, verifier=_verify_run if opts.launch.verify_after is not None else None)


def _verify_run(*args) -> None:
    """``--verify``'s check (:func:`cpulaunch.tools.verify.check_run`), the tool imported only
    when a run asks for it."""
    from cpulaunch.tools import verify

    verify.check_run(*args)


def _load_config(ctx, param, path) -> None:
    """``--config FILE`` (or CPULAUNCH_CONFIG): its values become click's default_map, which
    click consults after the command line and CPULAUNCH_* variables and before built-in
    defaults. Read with the project's bounded reader (a FIFO or device is refused at once,
    a file over :data:`~cpulaunch.options.CONFIG_MAX_BYTES` is refused, never cut short).

    Raises:
        OptionsError: the file cannot be read or used (one line naming it and how it was given).
    """
    if not path:
        return
    from cpulaunch.options import CONFIG_MAX_BYTES, config_defaults
    from cpulaunch.errors import printable
    from cpulaunch.machine.files import UnusableFileError, read_regular

    from_env = ctx.meta.get("cpulaunch.config_source") is click.core.ParameterSource.ENVIRONMENT
    label = "CPULAUNCH_CONFIG" if from_env else "--config"
    try:
        data = read_regular(path, CONFIG_MAX_BYTES)
    except UnusableFileError as exc:
        raise OptionsError(f"{label} {printable(path)}: {exc}; give a regular TOML file") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the name
        raise OptionsError(f"{label} {printable(path)}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    ctx.default_map = {**(ctx.default_map or {}), **config_defaults(data, path, option_kinds(), label)}


def option_kinds() -> dict[str, Kind]:
    """{python name: :class:`cpulaunch.options.Kind`} of every option of the command but
    :data:`NOT_SETTINGS` (hidden aliases included), from its click declaration: what a
    config file's values and :func:`cpulaunch.plan_instances`' keywords are checked against."""
    out = {}
    for p in command.get_params(click.Context(command)):
        if not isinstance(p, click.Option) or p.name in NOT_SETTINGS:
            continue
        t = p.type
        if p.count:
            kind = Kind("count")
        elif p.is_flag:
            kind = Kind("flag")
        elif isinstance(t, click.Choice):
            kind = Kind("choice", tuple(t.choices))
        elif isinstance(t, click.types.IntParamType):
            kind = Kind("integer")
        elif isinstance(t, click.types.FloatParamType):
            kind = Kind("number")
        else:
            kind = Kind("path" if isinstance(t, click.Path) else "string")
        out[p.name] = kind
    return out


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
            import importlib

            _configure_logging(1 if verbose else 0, now=True)
            code = importlib.import_module(f"cpulaunch.tools.{args[0]}").main(args[1:])
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
