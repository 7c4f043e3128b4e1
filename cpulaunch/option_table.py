"""Every option of ``cpulaunch``, once, as data (the shape of pip's ``cli/cmdoptions.py``).

One row per option: its name and other spellings (torchrun's ``--name_with_underscores``
and the other launchers' words), the values it takes (its :class:`Kind`, choices from the
enums and the library registry), its default, its help section, the sources that may set
it (the command line, its ``CPULAUNCH_<OPTION>`` variable, a ``--config`` file, a keyword
of :func:`cpulaunch.plan_instances`) and its rules: the options it cannot be combined
with, the ones it needs, and where it has no effect. Everything else is made from here:
click's parameters and ``--help`` sections (:mod:`cpulaunch.cli`), the typing of config
files and API keywords (:mod:`cpulaunch.options`), the placement modes the planner
knows, and the options table of the reference docs (``tests/test_option_table.py`` holds
the docs to it).

Pure data and small pure helpers; importing this module reads nothing and imports no
third-party package.
"""

from __future__ import annotations

from cpulaunch.enums import Enum

from cpulaunch.machine.engines import LOCAL_MASTER_ADDR
from cpulaunch.machine.libraries import ALLOCATOR_CHOICES, OPENMP_CHOICES, REGISTRY
from cpulaunch.machine.numactl import MemPolicy
from cpulaunch.machine.recipes import RECIPE_CHOICES, RECIPES, WAIT_POLICIES
from cpulaunch.names import INFERENCE_PATHS, PLACEMENT_MODES, BindMode, Format, Output
from cpulaunch.records import TYPE_CHECKING, Record

if TYPE_CHECKING:
    from typing import Any, Optional

__all__ = [
    "BindMode", "Output", "Format", "Kind", "Section", "Alias", "Option", "Rule", "OPTIONS", "ALIASES",
    "RULES", "TOPOLOGY_OPTIONS", "HELP_CONTEXT", "TRUE_WORDS", "FALSE_WORDS", "NOT_FIELDS", "LANDINGS", "BY_DEST", "ALIAS_BY_DEST", "BY_SPELLING", "PLACEMENT_MODES", "FORMATS_FOR", "DEFAULT_FORMAT", "SOURCES",
    "option_variable", "spellings", "api_keywords", "config_keys", "env_variables", "kind_of", "name_of",
    "help_rows", "INFERENCE_PATHS", "PROGRAM_RULE", "SOURCES_RULE", "NOT_VARIABLES", "FOREIGN_OPTIONS", "VALUE_SPELLINGS",
]


#: The formats each output takes, the default first.
FORMATS_FOR = {
    Output.DRY_RUN: (Format.TEXT, Format.JSON, Format.SVG),
    Output.PRINT_ENV: (Format.SHELL, Format.DOTENV, Format.JSON, Format.OMP_BIND, Format.VLLM, Format.SGLANG),
    Output.SHOW_TOPOLOGY: (Format.TEXT, Format.JSON, Format.SVG),
}
DEFAULT_FORMAT = {output: formats[0] for output, formats in FORMATS_FOR.items()}


class Kind(Record):
    """The values one option takes.

    Attributes:
        name: "flag" (a bool), "count" (an int >= 0: ``-vv``), "integer" (an int; never a
            bool or a float), "number" (an int or a float, never a bool; seconds),
            "choice" (one of ``choices``, any case, as on the command line), "string" (a
            str; an int is taken as its digits, so ``node-list = 1`` and
            ``nproc_per_node=2`` work), "path" (a str or os.PathLike naming a file or
            folder).
        choices: the allowed strings of a "choice".
        minimum, maximum: the range of an "integer" or "number" (None: open).
    """

    name: str
    choices: tuple[str, ...] = ()
    minimum: Optional[float] = None
    maximum: Optional[float] = None


FLAG = Kind("flag")
STRING = Kind("string")
PATH = Kind("path")


def _choice(values) -> Kind:
    return Kind("choice", tuple(v.value if isinstance(v, Enum) else v for v in values))


def _integer(minimum=None, maximum=None) -> Kind:
    return Kind("integer", (), minimum, maximum)


def _seconds() -> Kind:
    return Kind("number", (), 0)


class Section(str, Enum):
    """The help sections, in the order ``--help`` prints them."""

    PLACEMENT = "Placement"
    RESTRICTIONS = "Restrictions"
    MEMORY = "Memory and libraries"
    DISTRIBUTED = "Distributed (--ddp)"
    OUTPUT = "Output and logs"
    COMPAT = "Compatibility aliases"


#: Where a value may come from: the command line, the option's CPULAUNCH_* variable, a
#: --config file, a keyword of cpulaunch.plan_instances.
SOURCES = ("flag", "env", "config", "api")
_ALL = frozenset(SOURCES)
#: The words read as "true" and as "false" (any case) in a flag's variable
#: (``CPULAUNCH_DRY_RUN=y``), in ``--share-host``'s (``CPULAUNCH_SHARE_HOST=y`` is "fail")
#: and wherever else a variable is read as a yes or a no: click's own words for a bool, so
#: that every variable reads alike (tests/test_option_table.py holds them to click's).
TRUE_WORDS = ("1", "true", "t", "yes", "y", "on")
FALSE_WORDS = ("0", "false", "f", "no", "n", "off")
#: Where a row may land besides a field of the typed options (:attr:`Option.lands`), and why.
NOT_FIELDS = {"cli.config": "read by the command line as a source of the other options' values (click's default map)"}
#: click's context settings every command shares, cpulaunch's and its subcommands' (the one
#: context set-up; cli.py and cpulaunch.tools add to it, never restate it).
HELP_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
#: Options that choose what the invocation does (not how): no config key, no API keyword
#: (plan_instances is a dry run by nature).
_ACTION = frozenset({"flag", "env"})


class Alias(Record):
    """Another launcher's spelling that stands for an option with a fixed value
    (``--enable-tcmalloc`` = ``--allocator tcmalloc``) or takes the option's own value
    under another name (``--log-path DIR`` = ``--log-dir DIR``: ``value`` None).

    Attributes:
        name: the spelling, e.g. "--enable-tcmalloc".
        dest: the python name of its own parameter ("enable_tcmalloc").
        target: the python name of the option it stands for ("allocator").
        value: the target's value when the alias is given; None: the alias's own value.
        origin: whose spelling it is ("run_cpu", "torchrun", "torch.distributed.launch").
        meaning: the help line, e.g. "--allocator tcmalloc".
        kind: the values the alias itself takes (a flag unless it carries a value).
    """

    name: str
    dest: str
    target: str
    value: Any
    origin: str
    meaning: str
    kind: Kind = FLAG


class Option(Record):
    """One option of ``cpulaunch``.

    Attributes:
        name: its long name, e.g. "--ninstances" (its variable: :func:`option_variable`).
        dest: its python name ("ninstances"), the key of config files and API keywords
            (config files also take the dashed spelling).
        kind: the values it takes.
        section: its help section.
        help: one short line for ``--help`` (and the reference).
        more: what the reference adds after ``help`` (defaults, sources, details); "" for none.
        default: the value when not given (None: not given; never -1).
        metavar: the value's name in help ("N", "CPULIST").
        bare: the value of the option given without one, for options whose value is
            optional (``--instances-per-socket`` = 1, ``--share-host`` = "fail"); None: a
            value is required (flags take none).
        words: for options with a ``bare`` value: the words taken as the value after a
            bare option (``--share-host wait``); "digits" for counts.
        short: a short spelling ("-v").
        sources: where it may be set (:data:`SOURCES`).
        requires_ddp: the option applies to ``--ddp`` only.
        run_only: the option acts while the program runs (supervision, logs): it changes
            nothing in ``--print-env`` or ``--show-topology``, and ``--dry-run`` notes it.
        torchrun: torchrun has this option with the same meaning, so under ``--ddp`` it
            is also read from torchrun's variable ``PET_<DEST>`` (``PET_NNODES``), below
            the command line and ``CPULAUNCH_*`` and above a config file: Kubeflow's
            controllers hand torchrun its options that way
            (:func:`cpulaunch.machine.engines.pod_defaults`).
        lands: the field of the typed options its value lands in, as ``GROUP.FIELD``:
            ``options.allocator`` (:class:`cpulaunch.options.Options`), ``request.ninstances``
            (:class:`cpulaunch.plan.Request`), ``ddp.nnodes``
            (:class:`cpulaunch.options.DdpOptions`), ``launch.grace_period``
            (:class:`cpulaunch.options.LaunchOptions`), or one of :data:`NOT_FIELDS`; None:
            ``options.<dest>`` (:attr:`field`). :func:`cpulaunch.options.from_values` fills
            each field from the rows that land in it (``tests/test_option_table.py`` fails
            for a row that lands nowhere, or in a field that is not there, and for a field
            no row fills).
        default_text: the default in words, for an option whose ``default`` is None
            because the value is decided later ("a free one", "socket"); shown in help
            (``{default}``) and the reference instead of ``default``.

    ``help`` and ``more`` may hold ``{choices}`` (the kind's choices: "a, b, c"),
    ``{or_choices}`` ("a, b or c") and ``{default}``; the text shown has them filled
    (:attr:`help_line`, :attr:`text`), so that no help lists choices or defaults by hand.
    """

    name: str
    dest: str
    kind: Kind
    section: Section
    help: str
    default: Any = None
    metavar: Optional[str] = None
    bare: Any = None
    words: tuple[str, ...] = ()
    short: Optional[str] = None
    sources: frozenset = _ALL
    requires_ddp: bool = False
    run_only: bool = False
    torchrun: bool = False
    more: str = ""
    lands: Optional[str] = None
    default_text: str = ""

    @property
    def field(self) -> str:
        """Where its value lands: ``GROUP.FIELD`` (see ``lands``)."""
        return self.lands or f"options.{self.dest}"

    @property
    def shown_default(self) -> str:
        """Its default as help and the reference show it: ``default_text``, else the
        default (``10`` for 10.0); "" for none (None, False)."""
        if self.default_text:
            return self.default_text
        if self.default is None or self.default is False:
            return ""
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)

    def _filled(self, text: str) -> str:
        if "{" not in text:
            return text
        choices = tuple(self.kind.choices) or tuple(w for w in self.words if w != "digits")
        listed = ", ".join(choices)
        or_listed = " or ".join((", ".join(choices[:-1]), choices[-1])) if len(choices) > 1 else listed
        return (text.replace("{choices}", listed).replace("{or_choices}", or_listed)
                .replace("{default}", self.shown_default))

    @property
    def help_line(self) -> str:
        """Its ``--help`` line, placeholders filled."""
        return self._filled(self.help)

    @property
    def text(self) -> str:
        """Its help and its ``more``: the reference's "what it does"."""
        return self._filled(f"{self.help} {self.more}" if self.more else self.help)

    @property
    def variable(self) -> str:
        """Its environment variable: ``CPULAUNCH_NINSTANCES``."""
        return option_variable(self.name)


def option_variable(long_name: str) -> str:
    """The environment variable of an option, from its long name: ``--format`` ->
    ``CPULAUNCH_FORMAT``, ``--log-dir`` -> ``CPULAUNCH_LOG_DIR``."""
    return "CPULAUNCH_" + long_name.lstrip("-").upper().replace("-", "_")


def _lib_help(kind: str) -> str:
    """The registry's choices of one kind for help: ``"intel (Intel OpenMP...), gnu (...)"``."""
    return ", ".join(f"{lib.choice} ({lib.summary})" for lib in REGISTRY.values() if lib.kind == kind and lib.selectable)



P, R, M, D, O = Section.PLACEMENT, Section.RESTRICTIONS, Section.MEMORY, Section.DISTRIBUTED, Section.OUTPUT
_COUNT_WORDS = ("digits",)

#: Every option, in --help's order within each section.
OPTIONS: tuple[Option, ...] = (
    # ---------------------------------------------------------------- placement
    Option("--ninstances", "ninstances", _integer(1), P, "Instances; together they use every core.", metavar="N",
           more="Every usable core: allowed, online, not set aside.", lands="request.ninstances"),
    Option("--instances-per-socket", "instances_per_socket", _integer(1), P,
           "Instances per socket (package); bare: 1.", metavar="[N]", bare=1, words=_COUNT_WORDS, lands="request.instances_per_socket"),
    Option("--instances-per-node", "instances_per_node", _integer(1), P, "Instances per NUMA node; bare: 1.",
           metavar="[N]", bare=1, words=_COUNT_WORDS, lands="request.instances_per_node"),
    Option("--instances-per-l3", "instances_per_l3", _integer(1), P,
           "Instances per L3 cache domain; bare: 1.", metavar="[N]", bare=1,
           words=_COUNT_WORDS, more="An L3 domain is an AMD CCX or CCD, an Intel socket or SNC cluster.", lands="request.instances_per_l3"),
    Option("--ncores-per-instance", "ncores_per_instance", STRING, P,
           "Physical cores per instance, or 43,43,42.", metavar="C[,C...]",
           more="One count for every instance, or one count per instance.", lands="request.ncores_per_instance"),
    Option("--latency-mode", "latency_mode", FLAG, P, "4 cores per instance, as many as fit.", lands="request.latency_mode"),
    Option("--throughput-mode", "throughput_mode", FLAG, P, "One instance per NUMA node.", lands="request.throughput_mode"),
    Option("--equal-sizes", "equal_sizes", FLAG, P,
           "Instances within one core of each other.",
           more="Even where NUMA nodes or L3 domains are uneven.", lands="request.equal_sizes"),
    Option("--use-logical-cores", "use_logical_cores", FLAG, P, "Give instances the SMT siblings too.",
           more="Every SMT sibling of their cores, one OpenMP thread per logical CPU (by default: one per "
           "physical core).", lands="request.use_logical_cores"),
    Option("--use-e-cores", "use_e_cores", FLAG, P, "Also use the E-cores of hybrid CPUs.", lands="request.use_e_cores"),
    Option("--dataloader-workers", "dataloader_workers", _integer(0), P,
           "Cores per instance for DataLoader workers.", default=0, metavar="N",
           more="Set aside from OpenMP's; cpulaunch.dataloader_kwargs() pins the workers there.", lands="request.dataloader_workers"),
    Option("--reserve-cores", "reserve_cores", _integer(0), P,
           "Cores per instance for non-OpenMP threads.", default=0, metavar="N",
           more="Set aside from OpenMP's for the program's own threads.", lands="request.reserve_cores"),
    Option("--share-host", "share_host", STRING, P,
           "Claim the cores host-wide: {or_choices}.", metavar="[fail|wait]", bare="fail",
           words=("fail", "wait"), more="Other cpulaunch jobs plan on the rest. When too few are free: fail "
           "(the bare flag; names who holds them) or wait."),
    Option("--lease-dir", "lease_dir", PATH, P, "A lease space of its own for --share-host.", metavar="DIR",
           more="Default: the host's, /run/cpulaunch-leases and /tmp/cpulaunch-leases."),
    Option("--follow-cpuset", "follow_cpuset", FLAG, P,
           "Re-pin threads when the cpuset changes.", run_only=True,
           more="While instances run, follow changes of the CPUs this job may use (cgroup cpuset, affinity): "
           "plan again with the same options and re-pin every thread of each instance.", lands="launch.follow_cpuset"),
    # ---------------------------------------------------------------- restrictions
    Option("--core-list", "core_list", STRING, R, "Use only these logical CPUs, e.g. 0-31,64-95.", metavar="CPULIST", lands="request.core_list"),
    Option("--node-list", "node_list", STRING, R, "Use only the CPUs of these NUMA nodes, e.g. 0,2.",
           metavar="NODES", lands="request.node_list"),
    Option("--instance-idx", "instance_idx", STRING, R,
           "Only these instances (0,2); --print-env: the one.", metavar="I[,I...]",
           more="Run only these instances of the plan; with --print-env, the instance printed.", lands="request.instance_idx"),
    # ---------------------------------------------------------------- memory and libraries
    Option("--mem-policy", "mem_policy", _choice(MemPolicy), M,
           "Memory: {choices}.", default="bind", metavar="POLICY",
           more="The NUMA memory policy, on the nodes of each instance's CPUs.", lands="request.mem_policy"),
    Option("--bind", "bind", _choice(BindMode), M,
           "Binding: {or_choices}.", default="numactl", metavar="HOW",
           more="numactl binds CPUs and memory; affinity sets only the CPU affinity."),
    Option("--omp-runtime", "omp_runtime", _choice(OPENMP_CHOICES), M,
           "OpenMP runtime: {or_choices}.", default="auto", metavar="NAME",
           more="auto: torch's own; " + _lib_help("openmp") + "."),
    Option("--allocator", "allocator", _choice(ALLOCATOR_CHOICES), M,
           "Allocator: {choices}.", default="auto", metavar="NAME",
           more="auto: tcmalloc if installed; default: the C library's; " + _lib_help("allocator") + "."),
    Option("--kmp-blocktime", "kmp_blocktime", _integer(0), M,
           "KMP_BLOCKTIME (ms) for Intel OpenMP (default {default}).", metavar="MS",
           more="With --omp-runtime intel; the default is the PyTorch tuning guide's value.",
           default_text=REGISTRY["iomp5"].idle_env["KMP_BLOCKTIME"]),
    Option("--omp-places", "omp_places", FLAG, M, "Pin GNU OpenMP threads to their CPUs.",
           more="Sets OMP_PLACES and OMP_PROC_BIND."),
    Option("--override-env", "override_env", FLAG, M,
           "cpulaunch's values win over your environment's.",
           more="By default a variable already set in your environment is kept, and said so."),
    Option("--inference-path", "inference_path", _choice(INFERENCE_PATHS), M,
           "The path of cpulaunch.optimize(): {choices}.", metavar="PATH",
           more="zentorch is AMD's torch.compile backend, where it imports with this torch."),
    Option("--recipe", "recipe", _choice(RECIPE_CHOICES), M,
           "Recipe: {choices}.", default="auto", metavar="NAME",
           more="auto: the platform's, named by --show-topology; "
           + "; ".join(f"{r.name}: {r.title}" for r in RECIPES.values()) + "."),
    Option("--omp-wait-policy", "omp_wait_policy", _choice(WAIT_POLICIES), M,
           "OMP_WAIT_POLICY: {or_choices}.", default="auto", metavar="POLICY",
           more="For OpenMP's idle threads: active spins, passive sleeps; auto: the recipe's (unset: the "
           "runtime's own)."),
    Option("--zendnn-matmul-algo", "zendnn_matmul_algo", _integer(0), M,
           "ZENDNNL_MATMUL_ALGO for zentorch (1 or 5).", metavar="N",
           more="ZenDNN's guide: 1 for latency, its default; 5 for NLP throughput."),
    # ---------------------------------------------------------------- distributed
    Option("--ddp", "ddp", FLAG, D, "Distributed training, one rank per socket.",
           more="Other counts: --nproc-per-node."),
    Option("--standalone", "standalone", FLAG, D, "--ddp on this machine only (implies --ddp).", more="torchrun's flag.",
           torchrun=True, lands="ddp.standalone"),
    Option("--nproc-per-node", "nproc_per_node", STRING, D,
           "Ranks on this machine (default: {default}).", metavar="N|socket|node|auto", default_text="socket",
           more="A number, one per socket or NUMA node, or auto: one per usable core, at most the CPU quota.", requires_ddp=True, torchrun=True, lands="ddp.nproc_per_node"),
    Option("--nnodes", "nnodes", STRING, D, "Number of machines (default {default}).", default="1", more="MIN:MAX with --rdzv-endpoint.",
           metavar="N", requires_ddp=True, torchrun=True, lands="ddp.nnodes"),
    Option("--node-rank", "node_rank", _integer(0), D, "This machine's rank (default {default}).", default=0, metavar="N",
           requires_ddp=True, torchrun=True, lands="ddp.node_rank"),
    Option("--master-addr", "master_addr", STRING, D, "Rank 0's machine (default {default}).", default_text=LOCAL_MASTER_ADDR,
           metavar="HOST", requires_ddp=True, torchrun=True, lands="ddp.master_addr"),
    Option("--master-port", "master_port", _integer(1, 65535), D, "Rank 0's store port (default: a free one).",
           metavar="PORT", requires_ddp=True, torchrun=True, lands="ddp.master_port"),
    Option("--rdzv-endpoint", "rdzv_endpoint", STRING, D,
           "Elastic c10d rendezvous (torchrun's agent).", metavar="HOST:PORT",
           more="torchrun's agent starts the ranks.",
           requires_ddp=True, torchrun=True, lands="ddp.rdzv_endpoint"),
    Option("--rdzv-id", "rdzv_id", STRING, D, "Rendezvous job id (elastic).", metavar="ID", requires_ddp=True,
           torchrun=True, lands="ddp.rdzv_id"),
    Option("--max-restarts", "max_restarts", _integer(0), D,
           "Rank restarts after a failure (elastic).", metavar="N",
           more="By torchrun's agent; default 0.",
           requires_ddp=True, torchrun=True, lands="ddp.max_restarts"),
    Option("--backend", "backend", _choice(("auto", "gloo", "ccl")), D,
           "Process-group backend: {or_choices}.", default="auto", metavar="NAME", requires_ddp=True,
           more="auto: ccl when oneccl_bindings_for_pytorch loads with this torch and oneCCL's libfabric is "
           "found, else gloo.", lands="ddp.backend"),
    Option("--ccl-worker-count", "ccl_worker_count", _integer(0), D,
           "Cores per rank for oneCCL's workers (ccl).", metavar="N", requires_ddp=True,
           more="Default 1 when each rank has a core to spare; 0: none.", lands="ddp.ccl_worker_count"),
    Option("--iface", "iface", STRING, D, "Network interface for gloo and oneCCL.", more="Sets GLOO_SOCKET_IFNAME, CCL_KVS_IFACE, FI_TCP_IFACE.",
           metavar="NAME", requires_ddp=True, lands="ddp.iface"),
    Option("--no-exit-hook", "no_exit_hook", FLAG, D,
           "Do not end a rank's process group at exit.", requires_ddp=True,
           more="By default a Python rank whose program did not end its process group has it ended at exit.", lands="ddp.exit_hook"),
    Option("--pass-local-rank", "pass_local_rank", FLAG, D,
           "Also pass --local_rank=N to each rank.", requires_ddp=True,
           more="As torch.distributed.launch did.", lands="ddp.pass_local_rank"),
    # ---------------------------------------------------------------- output and logs
    Option("--dry-run", "dry_run", FLAG, O, "Show what would run, with notes; run nothing.",
           more="Each instance's command and environment, and the plan's notes.",
           sources=_ACTION, lands="options.output"),
    Option("--print-env", "print_env", FLAG, O, "Print one instance's environment for a script.",
           more="As shell text by default; --format gives the others.",
           sources=_ACTION, lands="options.output"),
    Option("--show-topology", "show_topology", FLAG, O, "Draw sockets, NUMA nodes, cores and SMT siblings.",
           sources=_ACTION, lands="options.output"),
    Option("--format", "fmt", _choice(Format), O,
           "The output's form: {choices}.",
           metavar="FMT", sources=_ACTION,
           more="; ".join(f"--{out.value}: " + ", ".join(f.value for f in fmts) + f" (default {fmts[0].value})"
                          for out, fmts in FORMATS_FOR.items()) + "."),
    Option("--sysroot", "sysroot", PATH, O, "Read the machine from this root (like lscpu --sysroot).",
           default="/", metavar="DIR", sources=frozenset({"flag", "env", "api"})),
    Option("--config", "config", PATH, O,
           "Defaults from a TOML file (tune's best.toml).", metavar="FILE", sources=_ACTION,
           more="A pyproject.toml's [tool.cpulaunch]. Flags > CPULAUNCH_* variables > this file > built-in defaults.", lands="cli.config"),
    Option("--log-dir", "log_dir", PATH, O, "Logs, plan.json and result.json in DIR/<run-id>/.",
           more="Each instance's in DIR/<run-id>/<i>/stdout.log and stderr.log.",
           metavar="DIR", run_only=True, lands="launch.log_dir"),
    Option("--no-prefix", "no_prefix", FLAG, O, "Do not prefix instances' console lines with [i].", run_only=True, lands="launch.prefix_output"),
    Option("--tee", "tee", STRING, O, "Streams written to the logs and the console (torchrun's -t).",
           metavar="STD", run_only=True, torchrun=True, lands="launch.stream_plan",
           more="0 none, 1 stdout, 2 stderr, 3 both; per instance as 0:1,1:2. With --tee or --redirects, a "
           "stream named by neither reaches the console only, as under torchrun; without both, --log-dir "
           "keeps both streams and the console shows them. Needs --log-dir."),
    Option("--redirects", "redirects", STRING, O, "Streams written to the logs only (torchrun's -r).",
           metavar="STD", run_only=True, torchrun=True, lands="launch.stream_plan",
           more="0 none, 1 stdout, 2 stderr, 3 both; per instance as 0:1,1:2; --tee wins for a stream both name. "
           "Needs --log-dir."),
    Option("--local-ranks-filter", "local_ranks_filter", STRING, O,
           "Show only these instances' output on the console.", metavar="LIST", run_only=True, torchrun=True, lands="launch.stream_plan",
           more="A cpulist of instance indices (local ranks), e.g. 0 or 0,2; the logs (--log-dir) keep every "
           "instance's output."),
    Option("--stdin-instance", "stdin_instance", _integer(0), O,
           "Instance that reads stdin (default: the only one).", metavar="I",
           more="None when there are several.",
           run_only=True, lands="launch.stdin_instance"),
    Option("--keep-going", "keep_going", FLAG, O, "When an instance fails, let the others finish.", run_only=True, lands="launch.keep_going"),
    Option("--no-failure-record", "no_failure_record", FLAG, O,
           "Do not have Python instances record their first failure.", run_only=True,
           lands="launch.failure_record",
           more="By default each supervised Python instance (every rank under --ddp) writes the time, code and "
           "error of its first failure to a pipe only the launcher reads, which names the rank that failed first "
           "whatever the order in which they ended; without it, the exit order decides."),
    Option("--keep-orphans", "keep_orphans", FLAG, O,
           "Let processes the instances leave behind run on after the run.", run_only=True,
           lands="launch.keep_orphans",
           more="By default cpulaunch is a child subreaper while supervising: a daemon an instance starts (double "
           "fork, setsid) comes back to it when its parent ends, and is stopped at the end with the rest; one line "
           "says how many. A single instance exec'd in cpulaunch's place is the program itself: its daemons are its "
           "own (pass --log-dir, or run several, to have it supervised)."),
    Option("--grace-period", "grace_period", _seconds(), O, "Seconds between SIGTERM and SIGKILL when stopping.",
           default=10.0, metavar="S", run_only=True, lands="launch.grace_period"),
    Option("--verify", "verify", FLAG, O, "Check what the processes really got.",
           more="After start-up (--verify-after); written to verify.json.",
           run_only=True, lands="launch.verify_after"),
    Option("--verify-after", "verify_after", _seconds(), O, "Seconds after start for --verify (default {default}).",
           default=5.0, metavar="S", run_only=True, lands="launch.verify_after"),
    Option("--no-python", "no_python", FLAG, O, "Run the program as it is, even if it ends in .py.", torchrun=True),
    # ---------------------------------------------------------------- other launchers' options
    Option("--rdzv-backend", "rdzv_backend", Kind("choice", ("c10d",)), Section.COMPAT,
           "torchrun's rendezvous backend: {choices}, the only one.", metavar="c10d", more="With --rdzv-endpoint.",
           requires_ddp=True, torchrun=True, lands="ddp.rdzv_backend"),
    Option("--verbose", "verbose", Kind("count"), O, "More diagnostics on stderr (-v: commands, notes, logs).",
           short="-v", default=0, sources=_ACTION),
    Option("--quiet", "quiet", FLAG, O, "Print errors only: no notes (the dry run and JSON keep them).",
           short="-q", sources=_ACTION),
)

#: Other launchers' spellings (same meaning); each is also a variable (CPULAUNCH_ENABLE_TCMALLOC).
ALIASES: tuple[Alias, ...] = (
    Alias("--use-logical-core", "use_logical_core", "use_logical_cores", True, "run_cpu", "--use-logical-cores"),
    Alias("--node-id", "node_id", "node_list", None, "run_cpu", "--node-list N (one node)", _integer(0)),
    Alias("--disable-numactl", "disable_numactl", "bind", "affinity", "run_cpu", "--bind affinity"),
    Alias("--disable-taskset", "disable_taskset", "bind", "none", "run_cpu",
          "with --disable-numactl: --bind none"),
    Alias("--log-path", "log_path", "log_dir", None, "run_cpu", "--log-dir", PATH),
    Alias("--enable-tcmalloc", "enable_tcmalloc", "allocator", "tcmalloc", "run_cpu", "--allocator tcmalloc"),
    Alias("--enable-jemalloc", "enable_jemalloc", "allocator", "jemalloc", "run_cpu", "--allocator jemalloc"),
    Alias("--use-default-allocator", "use_default_allocator", "allocator", "default", "run_cpu",
          "--allocator default"),
    Alias("--disable-iomp", "disable_iomp", "omp_runtime", "gnu", "run_cpu", "--omp-runtime gnu"),
    Alias("--multi-instance", "multi_instance", "throughput_mode", True, "run_cpu",
          "--throughput-mode (one instance per node)"),
    Alias("--use-env", "use_env", "pass_local_rank", False, "torch.distributed.launch",
          "pass no --local_rank argument"),
)
#: Words that start the program without being options of ours, listed with the aliases:
#: run_cpu's ``--module`` and Python's ``-m``/``-c``.
PROGRAM_WORDS = ("-m", "-c", "--module")


class Rule(Record):
    """A rule between options, checked by :func:`cpulaunch.options.check_rules` with the
    user's own words in its message.

    Attributes:
        kind: "exclusive" (at most one of ``dests`` given), "needs" (``dests[0]`` needs
            one of ``dests[1:]``), "conflicts" (``dests[0]`` cannot go with any of
            ``dests[1:]``).
        dests: python names of the options.
        why: the end of the message: why, and what to type instead.
    """

    kind: str
    dests: tuple[str, ...]
    why: str = ""


#: The options whose values are placement (what --ddp decides itself).
_DDP_PLACES = PLACEMENT_MODES + ("ncores_per_instance",)

RULES: tuple[Rule, ...] = (
    Rule("exclusive", ("show_topology", "print_env", "dry_run"), "choose one"),
    Rule("exclusive", PLACEMENT_MODES, "choose one"),
    Rule("conflicts", ("ncores_per_instance", "instances_per_socket", "instances_per_node", "instances_per_l3",
                       "latency_mode", "throughput_mode"), "it sizes the instances of --ninstances or of the "
                       "whole machine"),
    Rule("conflicts", ("ddp", *_DDP_PLACES), "--ddp places one rank per socket (use --nproc-per-node socket|node|N)"),
    Rule("conflicts", ("ddp", "instance_idx"), "every local rank runs (use --nproc-per-node)"),
    Rule("conflicts", ("ddp", "print_env"), "each rank's environment needs its rendezvous; use --ddp --dry-run "
         "--format json"),
    Rule("conflicts", ("standalone", "master_addr", "rdzv_endpoint"), "--standalone is one machine"),
    Rule("conflicts", ("pass_local_rank", "use_env"), "--use-env passes no --local_rank argument; drop one"),
    Rule("needs", ("disable_taskset", "disable_numactl"), "run_cpu's pair; or use --bind none"),
    Rule("needs", ("max_restarts", "rdzv_endpoint"), "torchrun's agent restarts the ranks of an elastic run; "
         "cpulaunch does not restart a static rendezvous"),
    Rule("needs", ("rdzv_id", "rdzv_endpoint"), "the job id names an elastic rendezvous"),
    Rule("needs", ("lease_dir", "share_host"), "or drop it"),
    Rule("conflicts", ("follow_cpuset", "sysroot", "share_host", "rdzv_endpoint"),
         "--follow-cpuset re-pins the instances it started on this machine, on any CPU the job may use "
         "(torchrun's agent starts the ranks of an elastic run; --share-host's leases name the first plan's "
         "cores); drop one"),
)

#: The options --show-topology uses (it draws the machine; the others plan instances).
TOPOLOGY_OPTIONS = ("show_topology", "fmt", "sysroot", "config", "verbose", "quiet")

BY_DEST: dict[str, Option] = {o.dest: o for o in OPTIONS}


def _landings() -> dict:
    out: dict = {}
    for o in OPTIONS:
        out.setdefault(o.field, []).append(o.dest)
    return {field: tuple(dests) for field, dests in out.items()}


#: Where each option's value lands: {``GROUP.FIELD``: the python names of the rows that
#: fill it, in the table's order} (:attr:`Option.field`; ``options.output`` is filled by
#: --dry-run, --print-env and --show-topology).
LANDINGS: dict[str, tuple[str, ...]] = _landings()
ALIAS_BY_DEST: dict[str, Alias] = {a.dest: a for a in ALIASES}


def spellings(name: str) -> tuple[str, ...]:
    """``--foo-bar`` and torchrun's ``--foo_bar`` (``"--ninstances"`` -> itself only)."""
    return (name, "--" + name[2:].replace("-", "_")) if "-" in name[2:] else (name,)


def _by_spelling() -> dict:
    out = {}
    for o in OPTIONS:
        for s in spellings(o.name) + ((o.short,) if o.short else ()):
            out[s] = o.dest
    for a in ALIASES:
        for s in spellings(a.name):
            out[s] = a.dest
    return out


#: Every spelling on the command line -> the python name of its parameter.
BY_SPELLING: dict[str, str] = _by_spelling()


def api_keywords() -> tuple[str, ...]:
    """The keywords :func:`cpulaunch.plan_instances` takes: every option and alias with
    the "api" source."""
    return tuple(o.dest for o in OPTIONS if "api" in o.sources) + tuple(a.dest for a in ALIASES)


def config_keys() -> tuple[str, ...]:
    """The keys a ``--config`` file may set (python names; the dashed spelling too)."""
    return tuple(o.dest for o in OPTIONS if "config" in o.sources) + tuple(a.dest for a in ALIASES)


def kind_of(dest: str) -> Kind:
    """The :class:`Kind` of an option or alias by its python name. Raises KeyError."""
    if dest in BY_DEST:
        return BY_DEST[dest].kind
    return ALIAS_BY_DEST[dest].kind


def name_of(dest: str) -> str:
    """The long name of an option or alias by its python name (``"fmt"`` -> ``"--format"``)."""
    if dest in BY_DEST:
        return BY_DEST[dest].name
    if dest in ALIAS_BY_DEST:
        return ALIAS_BY_DEST[dest].name
    return "--" + dest.replace("_", "-")


def env_variables() -> dict[str, str]:
    """{variable: python name} of every option and alias cpulaunch reads from the
    environment (``CPULAUNCH_NINSTANCES`` -> "ninstances")."""
    out = {o.variable: o.dest for o in OPTIONS if "env" in o.sources}
    out.update({option_variable(a.name): a.dest for a in ALIASES})
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def reference_markdown() -> str:
    """The options reference of the docs, one table per help section, made from
    :data:`OPTIONS` and :data:`ALIASES` (``tests/test_option_table.py`` holds the docs to
    it; ``python scripts/options_doc.py`` writes it): each option's values, default,
    variable, whether a ``--config`` file and :func:`cpulaunch.plan_instances` take it,
    its help."""
    out = []
    for section in Section:
        rows = [o for o in OPTIONS if o.section is section]
        if section is Section.COMPAT:
            out.append(f"### {section.value}\n\n| option | means | variable |\n|---|---|---|")
            out += [f"| `{o.name}` | {_cell(o.text)} | `{o.variable}` |" for o in rows]
            out += [f"| `{a.name}`{' VALUE' if a.value is None else ''} | {_cell(a.meaning)} ({a.origin}) | "
                    f"`{option_variable(a.name)}` |" for a in ALIASES]
            out.append("")
            continue
        out.append(f"### {section.value}\n\n| option | values | default | variable | config | API | what it does |\n"
                   "|---|---|---|---|---|---|---|")
        for o in rows:
            values = "/".join(o.kind.choices) if o.kind.name == "choice" else (o.metavar or o.kind.name)
            if o.bare is not None:
                values += f" (bare: {o.bare})"
            default = f"`{o.shown_default}`" if o.shown_default else ""
            names = f"`{o.short}`, `{o.name}`" if o.short else f"`{o.name}`"
            out.append(f"| {names} | {_cell(values)} | {default} | "
                       + (f"`{o.variable}`" if "env" in o.sources else "none") + " | "
                       + ("yes" if "config" in o.sources else "no") + " | "
                       + ("yes" if "api" in o.sources else "no") + f" | {_cell(o.text)} |")
        out.append("")
    out.append("### Rules\n\nChecked before anything is planned; each message names the options as you gave them.\n\n"
               "| rule | options | why |\n|---|---|---|")
    words = {"exclusive": "at most one of", "conflicts": "cannot go with", "needs": "needs one of"}
    for rule in RULES:
        first, rest = rule.dests[0], rule.dests[1:]
        names = ", ".join(f"`{name_of(d)}`" for d in (rule.dests if rule.kind == "exclusive" else rest))
        what = f"{words[rule.kind]} {names}" if rule.kind == "exclusive" else f"`{name_of(first)}` {words[rule.kind]} {names}"
        out.append(f"| {rule.kind} | {what} | {_cell(rule.why)} |")
    out.append("| applies to --ddp only | " + ", ".join(f"`{o.name}`" for o in OPTIONS if o.requires_ddp)
               + " | without --ddp they would be ignored |")
    out.append("| acts when the program runs | " + ", ".join(f"`{o.name}`" for o in OPTIONS if o.run_only)
               + " | an error with --print-env or --show-topology, a note with --dry-run |")
    return "\n".join(out) + "\n"


#: How the program's start is found, for --help.
PROGRAM_RULE = ("The program starts at the first word that is not one of cpulaunch's options, after --, "
                "or at -m MODULE / -c CODE; a program ending in .py runs with this Python.")
#: Where else options come from, for --help.
SOURCES_RULE = ("Every option can also come from CPULAUNCH_<OPTION> (--log-dir: CPULAUNCH_LOG_DIR) or a "
                "--config file; torchrun's --name_with_underscores spellings are accepted, and under --ddp "
                "torchrun's PET_<OPTION> variables (PET_NNODES), as Kubeflow sets them in a pod.")


def help_rows(section: Section) -> list[tuple[str, str]]:
    """``--help``'s rows of one section: (``--ninstances N``, its help), each option
    once (underscore spellings accepted, not listed)."""
    rows = []
    for o in OPTIONS:
        if o.section is section:
            names = f"{o.short}, {o.name}" if o.short else o.name
            value = o.metavar or ("{" + ",".join(o.kind.choices) + "}" if o.kind.name == "choice" else "")
            rows.append((f"{names} {value}".strip(), o.help_line))
    if section is Section.OUTPUT:
        rows += [("--version", "Print the version and exit."), ("-h, --help", "Print this help and exit.")]
    if section is Section.COMPAT:
        rows += [(f"{a.name}" + (" VALUE" if a.value is None else ""), f"= {a.meaning} ({a.origin})")
                 for a in ALIASES]
        rows.append(("--module, -m, -c", "the program is a Python module or code (run_cpu, python)"))
    return rows


#: Variables that look like options' but are not read, each an error saying why: --help
#: and --version come from the command line only (a leftover CPULAUNCH_VERSION=1 would
#: turn every run into a version print that runs nothing and exits 0), and --format's
#: variable is CPULAUNCH_FORMAT, not CPULAUNCH_FMT (the parameter's python name).
NOT_VARIABLES = {
    "CPULAUNCH_VERSION": "--version is read from the command line only",
    "CPULAUNCH_HELP": "--help is read from the command line only",
    "CPULAUNCH_FMT": "the variable of --format is CPULAUNCH_FORMAT",
}
#: Other launchers' options that cpulaunch spells differently, so that "did you mean" names
#: the right one rather than the nearest spelling (click's hint for ``--rank`` would be
#: ``--node-rank``, a --ddp option): run_cpu's ``--rank I`` (TorchServe passes it) runs
#: instance I of ``--ninstances N``, which is ``--instance-idx I`` here.
FOREIGN_OPTIONS = {"--rank": "--instance-idx"}
#: The spellings that take a value in the next word (``--ninstances 2``).
VALUE_SPELLINGS = {s for o in OPTIONS if o.kind.name not in ("flag", "count") for s in spellings(o.name)} \
    | {s for a in ALIASES if a.value is None for s in spellings(a.name)}
