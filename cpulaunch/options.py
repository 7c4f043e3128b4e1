"""One typed, frozen value for everything the user asked for, built once from the options.

The shape of torchrun's ``config_from_args`` -> ``LaunchConfig``, without its
``os.environ`` changes: :func:`from_values` turns the parsed option values into
:class:`Options`, checks every rule of the option table (:mod:`cpulaunch.option_table`)
and raises :class:`OptionsError` (one line, exit code 2) for anything that would
otherwise be ignored or misread. Every message names the options as the user gave them
(:class:`Words`: ``--nproc_per_node 4``, ``CPULAUNCH_NINSTANCES=x``, ``ninstances = "x" in
--config best.toml``, ``ninstances=5`` of :func:`cpulaunch.plan_instances`). Nothing here
reads the host; the core (``core.py``) takes an :class:`Options` and does the rest.
"""

from __future__ import annotations

import os
from types import MappingProxyType

from cpulaunch import cpulist
from cpulaunch import option_table as table
from cpulaunch.errors import CpulaunchError
from cpulaunch.machine import libraries
from cpulaunch.machine.numactl import MemPolicy
from cpulaunch.option_table import BindMode, Format, Kind, Output
from cpulaunch.plan import Request
from cpulaunch.spelling import Spelling, Spellings
from cpulaunch.records import TYPE_CHECKING, Record

if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any, Mapping, Optional, Union

__all__ = [
    "OptionsError",
    "BindMode",
    "Output",
    "Format",
    "DdpOptions",
    "LaunchOptions",
    "Options",
    "Spelling",
    "Words",
    "from_values",
    "Kind",
    "typed_value",
    "config_defaults",
    "CONFIG_MAX_BYTES",
]


class OptionsError(CpulaunchError):
    """Options that cannot be used together, or a value out of range."""


def _default(dest: str):
    """The default of an option, from its row of the option table (its one source)."""
    return table.BY_DEST[dest].default


class DdpOptions(Record):
    """``--ddp``: distributed training, one rank per socket by default.

    Attributes:
        nproc_per_node: ranks on this machine: "socket", "node" or a count (as text);
            None = "socket", or what the engine that started us says.
        nnodes: machines, "N" or "MIN:MAX" (elastic only).
        node_rank: this machine's rank (static rendezvous).
        master_addr: host of rank 0; None = this machine (one-machine runs).
        master_port: TCP port of rank 0's store; None = a free port (one machine) or
            :data:`~cpulaunch.machine.engines.DEFAULT_MASTER_PORT`.
        rdzv_endpoint: HOST:PORT of an elastic c10d rendezvous (torchrun starts the ranks).
        rdzv_id: elastic job id.
        backend: "auto", "gloo" or "ccl".
        ccl_worker_count: cores per rank set aside for oneCCL's workers (ccl only); None:
            not given (1 when it fits, else none: cpulaunch.distributed._with_ccl_workers).
        iface: network interface for gloo, oneCCL and libfabric.
        standalone: torchrun's --standalone was given (one machine; checked).
        max_restarts: torchrun's ``--max-restarts``: how many times its agent restarts
            every local rank after one fails (elastic runs only; None: torchrun's 0).
        exit_hook: a Python rank ends its default process group at exit when the program
            did not (``--no-exit-hook`` / CPULAUNCH_NO_EXIT_HOOK=1 turn it off).
        failure_record: a Python rank records its first failure for the launcher
            (``--no-failure-record`` turns it off; :mod:`cpulaunch.runtime.failrec`).
        pass_local_rank: each rank's program also gets ``--local_rank=N`` (N its local
            rank) after its script, as ``torch.distributed.launch`` without ``--use-env``
            passed it (``--pass-local-rank``; :func:`cpulaunch.distributed.with_local_rank`).
        rdzv_backend: torchrun's ``--rdzv-backend`` as given (c10d, the only one cpulaunch's
            elastic runs use), None: not given.
        words: how the user gave the ranks (``--nproc-per-node 4``), for messages
            (:class:`cpulaunch.spelling.Spellings`).
    """

    nproc_per_node: Optional[str] = None
    nnodes: str = _default("nnodes")
    node_rank: int = _default("node_rank")
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    rdzv_endpoint: Optional[str] = None
    rdzv_id: Optional[str] = None
    backend: str = _default("backend")
    ccl_worker_count: Optional[int] = None
    iface: Optional[str] = None
    standalone: bool = False
    max_restarts: Optional[int] = None
    exit_hook: bool = True
    failure_record: bool = True
    pass_local_rank: bool = False
    rdzv_backend: Optional[str] = None
    words: Spellings = Spellings()

    @property
    def elastic(self) -> bool:
        """True with an elastic rendezvous (torchrun's c10d agent starts the ranks)."""
        return bool(self.rdzv_endpoint)

    def said(self, dest: str) -> str:
        """An option of this value as the user gave it (``"--nproc_per_node 4"``)."""
        spelling = self.words.get(dest)
        return spelling.said if spelling else f"{table.name_of(dest)} {getattr(self, dest)}"


class Streams(Record):
    """Which streams (bits: 1 stdout, 2 stderr) each instance shows on the console and
    writes to its log: torchrun's ``--tee``/``--redirects`` mapped onto ``--log-dir``'s
    files, and ``--local-ranks-filter``.

    Attributes:
        console, log: per instance index, its streams on the console / in its log, where
            ``--tee``/``--redirects`` name the instance (``0:1,1:2``).
        default_console, default_log: the other instances' (3: both streams).
        console_filter: the only instance indices shown on the console (None: all).
    """

    console: Mapping[int, int] = MappingProxyType({})
    log: Mapping[int, int] = MappingProxyType({})
    default_console: int = 3
    default_log: int = 3
    console_filter: Optional[frozenset] = None

    def of(self, index: int) -> tuple[int, int]:
        """(shown on the console, written to the log) of instance ``index``."""
        console = self.console.get(index, self.default_console)
        if self.console_filter is not None and index not in self.console_filter:
            console = 0
        return console, self.log.get(index, self.default_log)

    def torchrun_args(self, count: int, log_dir: Optional[str]) -> list[str]:
        """The same choice for ``count`` local ranks in torchrun's own options, for an
        elastic run whose ranks torchrun starts: ``--tee`` (both), ``--redirects`` (log
        only), per local rank, with torchrun's ``--log-dir``; ``--local-ranks-filter``.
        [] when nothing differs from the default."""
        out: list[str] = []
        if (self.console, self.log, self.default_console, self.default_log) != ({}, {}, 3, 3):
            # console c, log l (before the filter) -> tee c & l (both), redirect l & ~c (log only)
            pairs = [(i, self.console.get(i, self.default_console), self.log.get(i, self.default_log))
                     for i in range(count)]
            tee = ",".join(f"{i}:{c & l}" for i, c, l in pairs)
            red = ",".join(f"{i}:{l & ~c & 3}" for i, c, l in pairs)
            out += ["--log-dir", str(log_dir), "--tee", tee, "--redirects", red]
        if self.console_filter is not None:
            out += ["--local-ranks-filter", ",".join(str(i) for i in sorted(self.console_filter))]
        return out


class LaunchOptions(Record):
    """How instances are started and watched.

    Attributes:
        log_dir: torchrun's layout under it: ``<run-id>/<i>/stdout.log`` etc.
        keep_going: on a failure let the others finish instead of stopping them.
        grace_period: seconds (finite, >= 0) between SIGTERM and SIGKILL.
        prefix_output: prefix console lines with ``[i] `` when several instances run.
        stdin_instance: index of the instance that reads the launcher's stdin; None =
            the only instance when there is one, else none (all read /dev/null).
        verify_after: seconds after start at which to inspect the processes (--verify).
        exec_single: a run of one instance replaces cpulaunch (exec) when nothing needs
            it to stay (the command line); False: cpulaunch always starts and watches the
            instances and returns their exit code (:func:`cpulaunch.run`, in-process).
        follow_cpuset: while the instances run, follow changes of the CPUs the job may
            use: plan again and re-pin each instance (``--follow-cpuset``,
            :mod:`cpulaunch.launch.follow`).
        failure_record: supervised instances get a pipe for their failure records
            (``--no-failure-record`` turns it off).
        keep_orphans: processes the instances leave behind (daemons) run on after the run
            (``--keep-orphans``); by default the launcher is their subreaper and stops them.
        stream_plan: which streams each instance shows on the console and writes to its log
            (``--tee``, ``--redirects``, ``--local-ranks-filter``; :class:`Streams`); see
            :meth:`streams`.
    """

    log_dir: Optional[Path] = None
    keep_going: bool = False
    grace_period: float = _default("grace_period")
    prefix_output: bool = True
    stdin_instance: Optional[int] = None
    verify_after: Optional[float] = None
    exec_single: bool = True
    follow_cpuset: bool = False
    failure_record: bool = True
    keep_orphans: bool = False
    stream_plan: Streams = Streams()

    def streams(self, index: int) -> tuple[int, int]:
        """(shown on the console, written to the log) of instance ``index``: bits 1 stdout,
        2 stderr (``--tee``, ``--redirects``, ``--local-ranks-filter``)."""
        return self.stream_plan.of(index)


class Options(Record):
    """Everything one invocation asked for (typed; ``None`` = not given, never -1).

    Attributes:
        output: what to produce (run, dry-run, print-env, show-topology).
        fmt: text form of the output (checked against ``output``).
        sysroot: root to read the machine from ("/" = this machine).
        request: the placement request for the planner.
        omp_runtime: "auto" or a choice from the library registry ("gnu", "intel").
        allocator: "auto", "default" or an allocator of the registry.
        bind: how to bind.
        override_env: cpulaunch's values win over the user's environment.
        program: the program's argv as the user gave it (resolved later); may be empty
            for --dry-run/--print-env.
        no_python: run ``program`` as it is even if it ends in .py.
        launch: start/supervision options.
        inference_path: the inference path planned for the program, or None.
        ddp: distributed options, None without --ddp.
        omp_places: set OMP_PLACES/OMP_PROC_BIND for GNU OpenMP.
        kmp_blocktime: KMP_BLOCKTIME in ms for Intel OpenMP (None: the registry's 1 ms).
        recipe: ``--recipe``: "auto" (the platform's) or a recipe of
            :data:`cpulaunch.machine.recipes.RECIPES`.
        omp_wait_policy: ``--omp-wait-policy``: "auto" (the recipe's), "active" or "passive".
        zendnn_matmul_algo: ``--zendnn-matmul-algo`` (ZENDNNL_MATMUL_ALGO), None: not set.
        verbose: -v count.
        quiet: ``-q``: errors only (cpulaunch.notes).
        aliases: the other launchers' spellings the user typed (``"--use-logical-core"``),
            for notes where they plan differently (:data:`cpulaunch.option_table.ALIASES`).
        share_host: ``--share-host``: None (off), "fail" (plan on the cores no other
            cpulaunch job holds, fail naming the holder when they are too few) or "wait"
            (wait for them instead).
        lease_dir: the folder of the host-wide leases (``--lease-dir``), None: chosen by
            ``cpulaunch.machine.lease.lease_folder``.
        notes: what the options themselves say: an option given in a variable or a
            config file that has no effect with the others (never silent).
    """

    output: Output = Output.RUN
    fmt: Optional[Format] = None
    sysroot: str = _default("sysroot")
    request: Request = Request()
    omp_runtime: str = _default("omp_runtime")
    allocator: str = _default("allocator")
    bind: BindMode = BindMode(_default("bind"))
    override_env: bool = False
    program: tuple[str, ...] = ()
    no_python: bool = False
    launch: LaunchOptions = LaunchOptions()
    inference_path: Optional[str] = None
    ddp: Optional[DdpOptions] = None
    omp_places: bool = False
    kmp_blocktime: Optional[int] = None
    recipe: str = _default("recipe")
    omp_wait_policy: str = _default("omp_wait_policy")
    zendnn_matmul_algo: Optional[int] = None
    verbose: int = _default("verbose")
    quiet: bool = False
    aliases: tuple[str, ...] = ()
    share_host: Optional[str] = None
    lease_dir: Optional[str] = None
    notes: tuple[str, ...] = ()


# --------------------------------------------------------------------------- the user's words


class Words(Spellings):
    """The option surface's :class:`cpulaunch.spelling.Spellings` (python name ->
    :class:`Spelling`): an option not in it is named by its row's long name (``--ninstances
    4``, :func:`cpulaunch.option_table.name_of`), as a default would be."""

    __slots__ = ()

    def long_name(self, dest: str) -> str:
        return table.name_of(dest)

    def alias(self, target: str, dest: str, name: str) -> "Words":
        """These words with ``target`` named as its alias ``dest`` was given (``name``:
        the alias's long name, for one given by default)."""
        return self.given_as(target, self.get(dest) or Spelling("flag", name, name))


def command_line_words(words: Mapping[str, tuple[str, Optional[str]]]) -> dict[str, Spelling]:
    """Spellings of options typed on the command line: {python name: (spelling typed,
    value text or None)} -> {python name: :class:`Spelling`} (``("--nproc_per_node",
    "4")`` -> said ``--nproc_per_node 4``)."""
    return {dest: Spelling("flag", typed, typed if text is None else f"{typed} {text}")
            for dest, (typed, text) in words.items()}


def env_spelling(variable: str, raw: str) -> Spelling:
    """The spelling of an option set by its variable: ``CPULAUNCH_NINSTANCES=x``."""
    from cpulaunch.errors import printable

    return Spelling("env", variable, f"{variable}={printable(raw)}")


def config_spelling(key: str, value: Any, where: str) -> Spelling:
    """The spelling of an option set in a config file: ``ninstances = "x" in --config f``."""
    return Spelling("config", f"{key} in {where}", f"{key} = {_toml_text(value)} in {where}")


def api_spelling(keyword: str, value: Any) -> Spelling:
    """The spelling of a keyword of :func:`cpulaunch.plan_instances`: ``ninstances=5``."""
    return Spelling("api", keyword, f"{keyword}={shown(value)}")


def _toml_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + shown(value)[1:-1] + '"'
    return shown(value)


# --------------------------------------------------------------------------- building


class _Check:
    """The values being built into :class:`Options`, with the user's words, so that each
    message names what was given. ``notes`` collects rules that only note."""

    def __init__(self, values: Mapping[str, Any], given: frozenset, words: Words) -> None:
        self.v = dict(values)
        self.given = set(given)
        self.words = words
        self.notes: list = []

    def has(self, dest: str) -> bool:
        """The user gave ``dest`` (explicitly, with a value that is not off)."""
        value = self.v.get(dest)
        return dest in self.given and value is not None and value is not False

    def said(self, dest: str) -> str:
        return self.words.said(dest, self.v.get(dest))

    def plain(self, dest: str):
        """The value of option ``dest`` as given, else its row's default (the one default:
        :attr:`cpulaunch.option_table.Option.default`); a flag as a bool, a count as an int."""
        o = table.BY_DEST[dest]
        value = self.v.get(dest)
        if value is None:
            value = o.default
        if o.kind.name == "flag":
            return bool(value)
        if o.kind.name == "count":
            return int(value or 0)
        return value

    def typed(self, *dests: str) -> bool:
        """Every one of ``dests`` was typed on the command line or passed to the API (then
        a rule that only says "no effect" is an error; in a variable or a config file, a
        note: a default for runs where it applies)."""
        return all(self.words.source(d) in (None, "flag", "api") for d in dests)

    def no_effect(self, dests: tuple, message: str) -> None:
        if self.typed(*dests):
            raise OptionsError(message)
        self.notes.append(message)

    def error(self, dest: str, problem: str, fix: str = "") -> OptionsError:
        return OptionsError(f"{self.said(dest)}: {problem}" + (f"; {fix}" if fix else ""))


def _parse_list(c: _Check, dest: str) -> Optional[frozenset]:
    text = c.v.get(dest)
    if text is None:
        return None
    try:
        ids = cpulist.parse(str(text))
    except CpulaunchError as exc:
        raise c.error(dest, str(exc), "expected e.g. 0-3,8") from None
    if not ids:
        raise c.error(dest, "names nothing", "expected e.g. 0-3,8")
    return ids


def _pod_defaults(c: _Check, environ: Optional[Mapping[str, str]]) -> None:
    """Under ``--ddp``, the options a Kubernetes pod's environment gives
    (:func:`cpulaunch.machine.engines.pod_defaults`: torchrun's ``PET_<NAME>`` for the
    options marked ``torchrun`` in the option table, else a PyTorchJob's RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT), each below the command line and CPULAUNCH_* and above a
    config file; messages then name the variable (``PET_NNODES=two``). Without ``--ddp``,
    PET_* variables are not read (one note says so)."""
    if environ is None:
        return
    from cpulaunch.machine.engines import pod_defaults

    found = pod_defaults(environ, [o.dest for o in table.OPTIONS if o.torchrun])
    if not found:
        return
    if not (c.v.get("ddp") or c.v.get("standalone")):
        pet = [d.variable for d in found if not d.why]
        if pet:
            c.notes.append(f"{', '.join(pet)} (torchrun's options, as Kubeflow sets them in a pod) "
                           "are read with --ddp only")
        return
    whys: list = []
    for d in found:
        if d.dest in c.given and c.words.source(d.dest) != "config":
            continue  # the command line and CPULAUNCH_* win
        spelling = env_spelling(d.variable, d.value)
        c.v[d.dest] = _pod_value(table.BY_DEST[d.dest].kind, spelling, d.value)
        c.given.add(d.dest)
        c.words = c.words.given_as(d.dest, spelling)
        if d.why and d.why not in whys:
            whys.append(d.why)
    c.notes.extend(f"{why}: --nnodes and --node-rank taken from them" for why in whys)


def _pod_value(kind: Kind, spelling: Spelling, text: str):
    """A pod variable's text as its option's value, torchrun's way: an integer's digits,
    a flag ``bool(int(text))`` (torchrun's ``check_env``), a choice in any case.

    Raises:
        OptionsError: ``PET_NODE_RANK=x: expected a whole number; fix or unset it``.
    """
    word = text.strip()
    if kind.name in ("integer", "flag"):
        if not (word.isascii() and word.isdigit() and len(word) <= 9):
            what = "a whole number" if kind.name == "integer" else "0 or 1 (torchrun reads it as int(value) != 0)"
            raise OptionsError(f"{spelling.said}: expected {what}; fix or unset it")
        return int(word) if kind.name == "integer" else int(word) != 0
    if kind.name == "choice":
        lowered = {ch.lower(): ch for ch in kind.choices}
        if word.lower() not in lowered:
            raise OptionsError(f"{spelling.said}: expected one of {', '.join(kind.choices)}; fix or unset it")
        return lowered[word.lower()]
    return word


def _isfinite(value: float) -> bool:
    """``math.isfinite(value)`` for an int or float (inf - inf and nan - nan are nan, a
    finite x - x is 0), without loading the math module on every run: a number option
    always has a value, its default (issue 40; tests/test_options_faults.py gives inf and
    nan)."""
    return value - value == 0


def _check_ranges(c: _Check) -> None:
    """Every number inside its option's range (:attr:`Kind.minimum`/``maximum``)."""
    for o in table.OPTIONS:
        value, k = c.v.get(o.dest), o.kind
        if value is None or isinstance(value, bool) or k.name not in ("integer", "number"):
            continue
        if k.name == "number" and not _isfinite(value):
            raise c.error(o.dest, "give a finite number of seconds >= 0")
        if k.minimum is not None and value < k.minimum or k.maximum is not None and value > k.maximum:
            if k.maximum is not None:
                raise c.error(o.dest, f"must be {k.minimum:g}-{k.maximum:g}")
            raise c.error(o.dest, f"must be {k.minimum:g} or more")


def _fold_aliases(c: _Check) -> None:
    """Fold the other launchers' spellings into ours (:data:`~cpulaunch.option_table.ALIASES`);
    an alias that contradicts the option it stands for, or is given with it, is an error,
    never a silent pick. Messages about the option then name the alias as typed."""
    for a in table.ALIASES:
        if a.dest in (a.target, "disable_taskset") or not c.has(a.dest):
            continue  # --disable-taskset folds with --disable-numactl, which it needs (a rule)
        value = c.v[a.dest] if a.value is None else a.value
        if a.dest == "disable_numactl" and c.v.get("disable_taskset"):
            value = "none"
        if c.has(a.target) and (a.value is None or c.v.get(a.target) != value):
            if a.value is None:
                raise OptionsError(f"{c.said(a.dest)} and {c.said(a.target)} cannot be combined; "
                                   f"give {table.name_of(a.target)}")
            raise OptionsError(f"{c.said(a.dest)} ({a.origin}: {a.meaning}) contradicts {c.said(a.target)}; "
                               "drop one of them")
        c.v[a.target] = str(value) if a.target == "node_list" else value
        c.given.add(a.target)
        c.words = c.words.alias(a.target, a.dest, a.name)


def _check_rules(c: _Check) -> None:
    """The option table's rules (:data:`~cpulaunch.option_table.RULES`), each message
    naming what was given, as it was given."""
    for rule in table.RULES:
        first, rest = rule.dests[0], rule.dests[1:]
        if rule.kind == "exclusive":
            given = [d for d in rule.dests if c.has(d)]
            if len(given) > 1:
                raise OptionsError(f"{c.said(given[0])} and {c.said(given[1])} cannot be combined; {rule.why}")
        elif rule.kind == "conflicts" and c.has(first):
            other = next((d for d in rest if c.has(d)), None)
            if other is not None:
                raise OptionsError(f"{c.said(other)} cannot be combined with {c.said(first)}: {rule.why}"
                                   if first == "ddp" else
                                   f"{c.said(first)} cannot be combined with {c.said(other)}: {rule.why}")
        elif rule.kind == "needs" and c.has(first) and not any(c.has(d) for d in rest):
            c.no_effect((first,), f"{c.said(first)} needs {' or '.join(table.name_of(d) for d in rest)}: {rule.why}")
    if not c.has("ddp") and not c.has("standalone"):
        ddp_only = [o.dest for o in table.OPTIONS if o.requires_ddp]
        ddp_only += [a.dest for a in table.ALIASES if a.target in ddp_only]
        for dest in ddp_only:
            if c.has(dest):
                c.no_effect((dest,), f"{c.said(dest)} applies to --ddp only; add --ddp or drop it")


def _output(c: _Check) -> Output:
    for output, dest in ((Output.SHOW_TOPOLOGY, "show_topology"), (Output.PRINT_ENV, "print_env"),
                         (Output.DRY_RUN, "dry_run")):
        if c.v.get(dest):
            return output
    return Output.RUN


def _format(c: _Check, output: Output) -> Optional[Format]:
    text = c.v.get("fmt")
    if text is None:
        return table.DEFAULT_FORMAT.get(output)
    fmt = Format(text.lower())
    if output is Output.RUN:
        raise OptionsError(f"{c.said('fmt')} applies to --dry-run, --print-env or --show-topology; "
                           "add one of them or drop it")
    allowed = table.FORMATS_FOR[output]
    if fmt not in allowed:
        raise OptionsError(f"{c.said('fmt')} does not apply to --{output.value}: use "
                           + ", ".join(f.value for f in allowed))
    return fmt


def _check_effects(c: _Check, output: Output) -> None:
    """Options that change nothing with the others given: an error when typed, a note
    when they come from a variable or a config file (then they are defaults for the runs
    where they apply); never silent."""
    if output is Output.SHOW_TOPOLOGY:
        for o in table.OPTIONS:
            if c.has(o.dest) and o.dest not in table.TOPOLOGY_OPTIONS:
                c.no_effect((o.dest,), f"{c.said(o.dest)} has no effect with --show-topology, which draws the "
                                       "machine only; drop it or use --dry-run")
        return
    run_only = [o.dest for o in table.OPTIONS if o.run_only and c.has(o.dest)]
    if run_only and output is Output.PRINT_ENV:
        c.no_effect((run_only[0],), f"{c.said(run_only[0])} has no effect with --print-env, which runs "
                                    "nothing; drop it")
    elif run_only and output is Output.DRY_RUN:
        c.notes.append(", ".join(c.said(d) for d in run_only) + (" acts" if len(run_only) == 1 else " act")
                       + " only when the program runs; --dry-run shows the commands such a run starts")
    omp = libraries.resolve_choice("openmp", c.plain("omp_runtime"))
    bind = c.plain("bind")
    if c.has("kmp_blocktime") and "KMP_BLOCKTIME" not in libraries.by_choice("openmp", omp).idle_env:
        c.no_effect(("kmp_blocktime",), f"{c.said('kmp_blocktime')} has no effect with the {omp} OpenMP runtime "
                    "(only Intel's reads KMP_BLOCKTIME); add --omp-runtime intel or drop it")
    if c.has("omp_places") and (libraries.by_choice("openmp", omp).pin_style != "omp" or bind == "none"):
        why = "--bind none binds nothing" if bind == "none" else f"the {omp} OpenMP runtime pins with KMP_AFFINITY"
        c.no_effect(("omp_places",), f"{c.said('omp_places')} has no effect: {why}; drop it")
    if c.has("ccl_worker_count") and c.plain("backend") == "gloo" and c.has("backend"):
        c.no_effect(("ccl_worker_count",), f"{c.said('ccl_worker_count')} has no effect with "
                    f"{c.said('backend')}; drop one")
    if c.has("equal_sizes") and (c.has("ncores_per_instance") or c.has("latency_mode")):
        fixed = "ncores_per_instance" if c.has("ncores_per_instance") else "latency_mode"
        c.no_effect(("equal_sizes",), f"{c.said('equal_sizes')} has no effect with {c.said(fixed)}, which fixes "
                    "the sizes; drop one")


def _core_counts(c: _Check) -> "Optional[Union[int, tuple[int, ...]]]":
    """``--ncores-per-instance``: one count (``"8"`` -> 8) or one per instance, run_cpu's
    habit for uneven sub-NUMA clusters (``"43,43,42"`` -> (43, 43, 42)); None when not given.

    Raises:
        OptionsError: anything else (``"8,x"``, ``"0"``, ``"4,,4"``).
    """
    value = c.v.get("ncores_per_instance")
    if value is None:
        return None
    words = str(value).strip().split(",")
    if not all(w.strip().isascii() and w.strip().isdigit() and len(w.strip()) <= 9 for w in words):
        raise c.error("ncores_per_instance", "expected a number of cores (8) or one per instance, separated by "
                      "commas (43,43,42)")
    counts = tuple(int(w) for w in words)
    if min(counts) < 1:
        raise c.error("ncores_per_instance", "each count must be 1 or more")
    return counts[0] if len(counts) == 1 else counts


def _share_host(c: _Check) -> Optional[str]:
    """``--share-host`` / CPULAUNCH_SHARE_HOST: "fail" (also a bare flag and the words read
    as true, :data:`~cpulaunch.option_table.TRUE_WORDS`: 1, true, yes, y...), "wait", or
    None (off: the words read as false, :data:`~cpulaunch.option_table.FALSE_WORDS`, or unset)."""
    raw = c.v.get("share_host")
    if raw is None:
        return None
    word = str(raw).strip().lower()
    if word == "" or word in table.FALSE_WORDS:
        return None
    if word == "fail" or word in table.TRUE_WORDS:
        return "fail"
    if word == "wait":
        return "wait"
    raise c.error("share_host", "use fail (the default: say who holds the cores) or wait")


def _check_ddp(c: _Check) -> None:
    """The ``--ddp`` options that cannot go together: a MIN:MAX or several machines without
    the rendezvous they need, a node rank outside --nnodes."""
    if not (c.v.get("ddp") or c.v.get("standalone")):
        return
    nnodes = str(c.plain("nnodes"))
    if c.has("standalone") and nnodes != "1":
        raise c.error("nnodes", "--standalone is one machine", "drop one")
    import re  # --ddp only (issue 40: re costs every run milliseconds)

    ranged = re.fullmatch(r"([1-9][0-9]{0,8}):([1-9][0-9]{0,8})", nnodes)
    if not (nnodes.isascii() and nnodes.isdigit() and len(nnodes) <= 9 and int(nnodes) >= 1) and not ranged:
        raise c.error("nnodes", "expected a number of machines (e.g. 2), or MIN:MAX with --rdzv-endpoint HOST:PORT")
    if ranged and int(ranged.group(1)) > int(ranged.group(2)):
        raise c.error("nnodes", "MIN is above MAX", "give MIN:MAX, e.g. 1:4")
    if not c.v.get("rdzv_endpoint"):
        if ranged:
            raise c.error("nnodes", "a MIN:MAX range needs --rdzv-endpoint HOST:PORT (elastic)")
        if int(nnodes) > 1 and not c.v.get("master_addr"):
            raise c.error("nnodes", "several machines need --master-addr HOST (rank 0's machine) or "
                          "--rdzv-endpoint HOST:PORT")
        if not 0 <= int(c.plain("node_rank")) < int(nnodes):
            raise c.error("node_rank", f"must be between 0 and {c.said('nnodes') if c.has('nnodes') else '--nnodes 1'}"
                          " - 1")
    elif c.has("node_rank"):
        raise c.error("node_rank", "applies to a static rendezvous; the elastic one assigns ranks", "drop it")


def _verify_after(c: _Check) -> Optional[float]:
    """``--verify`` / ``--verify-after S``: the seconds after start at which the processes
    are checked (``--verify`` alone: the row's default), None: no check."""
    if not (c.v.get("verify") or "verify_after" in c.given and c.v.get("verify_after") is not None):
        return None
    return float(c.plain("verify_after"))


def _instance_idx(c: _Check) -> Optional[tuple]:
    from cpulaunch.plan import parse_index_list

    if c.v.get("instance_idx") is None:
        return None
    try:
        instance_idx = parse_index_list(str(c.v["instance_idx"]))
    except CpulaunchError as exc:
        raise c.error("instance_idx", str(exc), "expected e.g. 0,2") from None
    if not instance_idx:
        raise c.error("instance_idx", "names no instance", "expected e.g. 0,2")
    return instance_idx


#: How a field is made from the values of the rows that land in it (the option table's
#: ``lands``), where it is not the one row's value as given or its default
#: (:meth:`_Check.plain`): a type the planner takes (an enum, a parsed cpulist, a Path), an
#: option that turns a default off (``--no-prefix``), or several rows filling one field.
_CONVERT = {
    "options.output": lambda c: _output(c),
    "options.fmt": lambda c: _format(c, _output(c)),
    "options.ddp": lambda c: bool(c.v.get("ddp") or c.v.get("standalone")),
    "options.bind": lambda c: BindMode(c.plain("bind")),
    "options.share_host": lambda c: _share_host(c),
    "options.sysroot": lambda c: str(c.plain("sysroot")),
    "request.ncores_per_instance": lambda c: _core_counts(c),
    "request.core_list": lambda c: _parse_list(c, "core_list"),
    "request.node_list": lambda c: _parse_list(c, "node_list"),
    "request.instance_idx": lambda c: _instance_idx(c),
    "request.mem_policy": lambda c: MemPolicy(c.plain("mem_policy")),
    "ddp.nproc_per_node": lambda c: None if c.v.get("nproc_per_node") is None else str(c.v["nproc_per_node"]),
    "ddp.nnodes": lambda c: str(c.plain("nnodes")),
    "ddp.node_rank": lambda c: int(c.plain("node_rank")),
    "ddp.exit_hook": lambda c: not c.plain("no_exit_hook"),
    "launch.log_dir": lambda c: _log_dir(c.v.get("log_dir")),
    "launch.grace_period": lambda c: float(c.plain("grace_period")),
    "launch.prefix_output": lambda c: not c.plain("no_prefix"),
    "launch.verify_after": _verify_after,
    "launch.failure_record": lambda c: not c.plain("no_failure_record"),
    "launch.stream_plan": lambda c: _std_streams(c),
}
#: The typed options' groups: ``GROUP`` of a row's ``lands`` -> its type.
GROUPS = {"options": Options, "request": Request, "ddp": DdpOptions, "launch": LaunchOptions}
#: Fields no row of the option table fills, and what does (tests/test_option_table.py:
#: every other field is some row's ``lands``).
FILLED_ELSEWHERE = {
    "options.request": "the group of the request.* rows",
    "options.launch": "the group of the launch.* rows",
    "options.program": "the program's words after cpulaunch's options",
    "options.aliases": "the other launchers' spellings typed (ALIASES), for notes",
    "options.notes": "what the options themselves say",
    "request.words": "how the user gave the request's options",
    "request.ccl_workers": "the core, from --ccl-worker-count once the backend is known",
    "ddp.words": "how the user gave the ranks' options",
    "launch.exec_single": "cpulaunch.run, which never execs",
    "ddp.failure_record": "--no-failure-record's row, through launch.failure_record: one switch for supervised "
                          "instances and ranks",
}
#: Fields whose value follows another field (not a row of their own): the format's default
#: is the output's (--dry-run: text, --print-env: shell).
FOLLOWS = {"options.fmt": "options.output"}


def _log_dir(value) -> Optional[Path]:
    """--log-dir's folder as a Path (pathlib is imported only when one is given: issue 40)."""
    if not value:
        return None
    from pathlib import Path

    return Path(value)


def _field_value(c: _Check, field: str):
    """The value of one field of the typed options, from the rows that land in it."""
    convert = _CONVERT.get(field)
    if convert is not None:
        return convert(c)
    (dest,) = table.LANDINGS[field]  # several rows in one field need a converter
    return c.plain(dest)


def _assemble(c: _Check) -> Options:
    """:class:`Options` made from the option table: each field from the rows that land in
    it (:data:`cpulaunch.option_table.LANDINGS`), in the table's order."""
    groups: dict = {name: {} for name in GROUPS}
    for field in table.LANDINGS:
        group, name = field.split(".", 1)
        if group in groups:
            groups[group][name] = _field_value(c, field)
    fields = set(Request._fields)
    request = Request(**groups["request"], words=c.words.only(d for d in table.BY_DEST if d in fields))
    ddp = None
    if groups["options"].pop("ddp"):
        ddp = DdpOptions(**groups["ddp"], failure_record=groups["launch"]["failure_record"],
                         words=c.words.only(("nproc_per_node", "ccl_worker_count", "nnodes", "node_rank")))
    return Options(**groups["options"], request=request, ddp=ddp, launch=LaunchOptions(**groups["launch"]),
                   program=tuple(c.v.get("program") or ()),
                   aliases=tuple(a.name for a in table.ALIASES if c.v.get(a.dest) not in (None, False)),
                   notes=tuple(c.notes))


def _std_spec(c: _Check, dest: str) -> Optional[tuple[int, dict]]:
    """torchrun's ``Std`` spelling: ``"3"`` -> (3, {}); ``"0:1,1:2"`` -> (0, {0: 1, 1: 2})."""
    text = c.v.get(dest)
    if text is None:
        return None
    import re  # --tee and --redirects only (issue 40)

    text = str(text).strip()
    if re.fullmatch(r"[0-3]", text):
        return int(text), {}
    pairs = {}
    for part in text.split(","):
        m = re.fullmatch(r"\s*([0-9]{1,6})\s*:\s*([0-3])\s*", part)
        if not m or int(m.group(1)) in pairs:
            raise c.error(dest, "expected 0, 1, 2 or 3 (none, stdout, stderr, both), or per instance as 0:1,1:2")
        pairs[int(m.group(1))] = int(m.group(2))
    return 0, pairs


def _std_streams(c: _Check) -> Streams:
    """LaunchOptions' :class:`Streams` from --tee, --redirects and --local-ranks-filter: a
    stream redirected goes to the log only, one tee'd to both, another to the console only
    (torchrun's semantics); without either option, both streams go to both (the log only
    with --log-dir)."""
    tee, red = _std_spec(c, "tee"), _std_spec(c, "redirects")
    out: dict = {}
    if tee is not None or red is not None:
        if not c.v.get("log_dir"):
            raise c.error("tee" if tee is not None else "redirects", "needs --log-dir DIR (where the logs go)")
        tee, red = tee or (0, {}), red or (0, {})
        indices = set(tee[1]) | set(red[1])
        t_of = lambda i: tee[1].get(i, tee[0])  # noqa: E731
        r_of = lambda i: red[1].get(i, red[0])  # noqa: E731
        out.update(default_console=(~red[0] | tee[0]) & 3, default_log=red[0] | tee[0],
                   console={i: (~r_of(i) | t_of(i)) & 3 for i in indices},
                   log={i: r_of(i) | t_of(i) for i in indices})
    if c.v.get("local_ranks_filter") is not None:
        chosen = _parse_list(c, "local_ranks_filter")
        out["console_filter"] = frozenset(chosen or ())
    return Streams(**out)


def from_values(values: Mapping[str, Any], given: frozenset = frozenset(),
                words: Optional[Words] = None, environ: Optional[Mapping[str, str]] = None) -> Options:
    """Build :class:`Options` from parsed option values (pure).

    Args:
        values: option name (python identifier, e.g. "ninstances") -> parsed value, as
            click gives them; ``program`` is the tuple of words after cpulaunch's options.
        given: names the user set explicitly (command line, CPULAUNCH_* variable, config
            file or API keyword), so that a rule applies and an alias contradicting an
            option is caught; a value not in it is a default.
        words: how the user gave each option, for messages (default: the long names).
        environ: the environment whose torchrun and PyTorchJob variables are defaults of
            the ``--ddp`` options (:func:`_pod_defaults`); None: not read (the API).

    Raises:
        OptionsError: a combination that would be ignored or misread, or a bad value;
            one line naming the options as the user gave them.
        cpulaunch.errors.DistributedError: a PyTorchJob variable malformed (``RANK=x``).
    """
    c = _Check(values, given, words or Words())
    _pod_defaults(c, environ)
    _check_ranges(c)
    _fold_aliases(c)
    _check_rules(c)
    output = _output(c)
    fmt = _format(c, output)
    _check_effects(c, output)
    _check_ddp(c)
    if output is Output.PRINT_ENV and fmt in (Format.SHELL, Format.DOTENV, Format.JSON):
        idx = c.v.get("instance_idx")
        if idx is not None and ("," in str(idx) or "-" in str(idx)):
            raise c.error("instance_idx", "--print-env prints one instance; give one index, or use --dry-run "
                          "for several")
    share_host = _share_host(c)
    if share_host and c.plain("bind") == BindMode.NONE.value:
        raise OptionsError(f"{c.said('share_host')} claims the CPUs a job is bound to, and {c.said('bind')} binds it "
                           "to none (it would run on every CPU); drop one of them")
    if share_host and c.has("sysroot") and c.v.get("sysroot") not in (None, "/"):
        raise OptionsError(f"{c.said('share_host')} coordinates the jobs of this machine; drop {c.said('sysroot')}")
    return _assemble(c)


#: Largest config file read (tune's best.toml is under 1 KiB; a pyproject.toml rarely
#: reaches 20 KiB). A bigger one is refused, never cut short.
CONFIG_MAX_BYTES = 1 << 20


_EXPECTED = {"flag": "true or false (a bool)", "count": "a whole number >= 0", "integer": "an integer (e.g. 4)",
             "number": "a number of seconds (e.g. 2.5)", "string": "a string", "path": "a path (a string)"}
_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array",
               dict: "a table", tuple: "a tuple", bytes: "bytes", type(None): "None"}


def shown(value) -> str:
    """``repr(value)`` cut to one short printable line, whatever the value (a huge
    string, a deep table, an object whose repr fails): for error messages."""
    import reprlib

    from cpulaunch.errors import printable

    r = reprlib.Repr()
    r.maxstring, r.maxother, r.maxlong, r.maxlevel = 60, 60, 40, 3
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = r.maxfrozenset = 6
    try:
        return printable(r.repr(value))
    except Exception:  # noqa: BLE001 - any object's own repr may fail
        return f"<{type(value).__name__}>"


def _typed(kind: Kind, value):
    """(the value as cpulaunch uses it, None) or (None, what is wrong with it)."""
    whole = isinstance(value, int) and not isinstance(value, bool)
    if kind.name == "flag":
        return (value, None) if isinstance(value, bool) else (None, "")
    if kind.name in ("integer", "count"):
        return (value, None) if whole and (kind.name == "integer" or value >= 0) else (None, "")
    if kind.name == "number":
        if not (whole or isinstance(value, float)):
            return None, ""
        try:
            return float(value), None
        except OverflowError:
            return None, " too large"
    if kind.name == "choice":
        lowered = {c.lower(): c for c in kind.choices}
        ok = isinstance(value, str) and value.lower() in lowered
        return (lowered[value.lower()], None) if ok else (None, "")
    if kind.name == "string" and whole:
        return str(value), None
    if kind.name == "path" and not isinstance(value, (str, bytes)) and hasattr(value, "__fspath__"):
        try:
            value = os.fspath(value)
        except Exception:  # noqa: BLE001 - a user's __fspath__
            return None, ""
    if not isinstance(value, str):
        return None, ""
    return (None, " holds a NUL byte") if "\x00" in value else (value, None)


def typed_value(kind: Kind, value, where: str):
    """``value`` if it has the option's type exactly, as cpulaunch uses it (a choice in
    its canonical case, an int given for a string as its digits, a number as a float);
    the one type rule of config files and :func:`cpulaunch.plan_instances`.

    ``(Kind("integer"), 4, "...")`` -> 4; ``(Kind("integer"), 2.5, ...)`` raises (never 2);
    ``(Kind("flag"), "no", ...)`` raises (never True).

    Args:
        kind: the option's :class:`Kind`.
        value: what was given (a TOML value, a keyword argument).
        where: the option as the message names it, e.g. ``"--config best.toml: ninstances"``.

    Raises:
        OptionsError: ``"<where> = <value> is a float; expected an integer (e.g. 4)"``.
    """
    out, problem = _typed(kind, value)
    if problem is None:
        return out
    expected = ("one of " + ", ".join(kind.choices)) if kind.name == "choice" else _EXPECTED[kind.name]
    what = problem or " is " + _TYPE_NAMES.get(type(value), f"a {type(value).__name__}")
    raise OptionsError(f"{where} = {shown(value)}{what}; expected {expected}"
                       + (" without NUL bytes" if problem == " holds a NUL byte" else ""))


def _toml(data: bytes, where: str) -> dict:
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the tomli dependency
        import tomli as tomllib
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise OptionsError(f"{where}: not UTF-8 text, so not a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise OptionsError(f"{where}: not a TOML file ({exc})") from None
    except RecursionError:
        raise OptionsError(f"{where}: nested too deeply to be a cpulaunch config") from None


def _settings_table(doc: dict, path: str, where: str) -> dict:
    """The table holding the settings: ``[tool.cpulaunch]`` of a pyproject.toml, else
    ``[cpulaunch]`` if there is one, else the top level."""
    if os.path.basename(os.fspath(path)) == "pyproject.toml":
        tool = doc.get("tool", {})
        table = tool.get("cpulaunch", {}) if isinstance(tool, dict) else None
        if not isinstance(table, dict):
            raise OptionsError(f"{where}: [tool.cpulaunch] must be a table of settings, not "
                               + _TYPE_NAMES.get(type(table if isinstance(tool, dict) else tool), "a value"))
        return table
    return doc["cpulaunch"] if isinstance(doc.get("cpulaunch"), dict) else doc


def config_settings(data: bytes, path: str, label: str = "--config") -> dict[str, tuple[Any, Spelling]]:
    """Defaults from a TOML config file (pure over its bytes): {python name: (value,
    :class:`Spelling`)}.

    Keys are cpulaunch's option names (``ninstances``, ``allocator``, ``omp-runtime`` or
    ``omp_runtime``; the keys :func:`cpulaunch.option_table.config_keys` lists); a
    ``pyproject.toml`` is read from its ``[tool.cpulaunch]`` table, any other file from its
    top level (``[cpulaunch]`` too, as tune's best.toml writes). Other tables (tune's
    ``[measured]``) are information and skipped. Each value must have its option's type
    exactly (:func:`typed_value`): ``ninstances = 2.5`` is an error, never 2.

    Args:
        data: the file's bytes (at most :data:`CONFIG_MAX_BYTES`, read by the caller).
        path: the file's name, for messages and to recognise a pyproject.toml.
        label: how the file was given: "--config" or "CPULAUNCH_CONFIG".

    Raises:
        OptionsError: not UTF-8 TOML, an unknown key, a key that is not a setting, a key
            given twice (``omp-runtime`` and ``omp_runtime``), a value of the wrong type.
    """
    from cpulaunch.errors import printable

    where = f"{label} {printable(path)}"
    keys = set(table.config_keys())
    out: dict = {}
    for key, value in _settings_table(_toml(data, where), path, where).items():
        name = key.replace("-", "_")
        if name not in keys:
            if isinstance(value, dict):
                continue  # other tables (tune's [measured]) are information
            from cpulaunch.slips import did_you_mean

            hint = did_you_mean(key, [k.replace("_", "-") if "-" in key else k for k in keys])
            raise OptionsError(f"{where}: {shown(key)} is not a cpulaunch setting; "
                               + (f"did you mean {hint}?" if hint else "see cpulaunch --help"))
        if name in out:
            raise OptionsError(f"{where}: {key} is given twice (as - and _ spellings); keep one")
        out[name] = (typed_value(table.kind_of(name), value, f"{where}: {key}"),
                     config_spelling(printable(key), value, where))
    return out


def config_defaults(data: bytes, path: str, label: str = "--config") -> dict[str, Any]:
    """{python name: value} of :func:`config_settings`."""
    return {name: value for name, (value, _) in config_settings(data, path, label).items()}
