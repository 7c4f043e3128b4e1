"""One typed, frozen value for everything the user asked for, built once from the options.

The shape of torchrun's ``config_from_args`` -> ``LaunchConfig``, without its
``os.environ`` changes: :func:`from_values` turns the parsed option values into
:class:`Options`, checks every combination, and raises :class:`OptionsError` (one line,
exit code 2) for anything that would otherwise be ignored or misread. Nothing here reads
the host; the core (``core.py``) takes an :class:`Options` and does the rest.
"""

import enum
import math
import os
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Optional, Union

from cpulaunch import cpulist
from cpulaunch.errors import CpulaunchError
from cpulaunch.machine.libraries import ALLOCATOR_CHOICES, OPENMP_CHOICES
from cpulaunch.machine.numactl import MemPolicy
from cpulaunch.plan import Request

__all__ = [
    "OptionsError",
    "BindMode",
    "Output",
    "Format",
    "DdpOptions",
    "LaunchOptions",
    "Options",
    "from_values",
    "ALIASES",
    "Kind",
    "typed_value",
    "config_defaults",
    "CONFIG_MAX_BYTES",
]


class OptionsError(CpulaunchError):
    """Options that cannot be used together, or a value out of range."""


class BindMode(str, enum.Enum):
    """How an instance is bound to its CPUs and memory."""

    NUMACTL = "numactl"  #: ``numactl -C CPUS -m NODES program`` (numactl(8)): CPUs and memory
    AFFINITY = "affinity"  #: sched_setaffinity(2) before exec: CPUs only, memory unbound
    NONE = "none"  #: no binding (OMP_NUM_THREADS and libraries still set)


class Output(str, enum.Enum):
    """What the invocation produces."""

    RUN = "run"  #: start the program (exec one instance, supervise several)
    DRY_RUN = "dry-run"  #: print each instance's env and command; run nothing
    PRINT_ENV = "print-env"  #: print one instance's environment for a shell script
    SHOW_TOPOLOGY = "show-topology"  #: draw the machine


class Format(str, enum.Enum):
    """Text forms of --dry-run, --print-env and --show-topology (which accepts which is
    checked in :func:`from_values`)."""

    TEXT = "text"  #: person-readable (--dry-run, --show-topology)
    SHELL = "shell"  #: ``export NAME='value'`` lines, safe to eval (--print-env)
    DOTENV = "dotenv"  #: ``NAME='value'`` lines for POSIX ``set -a; . FILE`` (--print-env)
    JSON = "json"  #: docs/plan-json.md (all three)
    OMP_BIND = "omp-bind"  #: instances' cpulists joined by ``|`` (vLLM/SGLang bind string)
    VLLM = "vllm"  #: ``VLLM_CPU_OMP_THREADS_BIND=...`` assignment lines
    SGLANG = "sglang"  #: ``SGLANG_CPU_OMP_THREADS_BIND=...`` assignment lines
    SVG = "svg"  #: a picture of the machine and the instances on it (cpulaunch.svg; --dry-run, --show-topology)


_FORMATS_FOR = {
    Output.DRY_RUN: (Format.TEXT, Format.JSON, Format.SVG),
    Output.PRINT_ENV: (Format.SHELL, Format.DOTENV, Format.JSON, Format.OMP_BIND, Format.VLLM, Format.SGLANG),
    Output.SHOW_TOPOLOGY: (Format.TEXT, Format.JSON, Format.SVG),
}
_DEFAULT_FORMAT = {Output.DRY_RUN: Format.TEXT, Output.PRINT_ENV: Format.SHELL, Output.SHOW_TOPOLOGY: Format.TEXT}

#: Spellings of other launchers accepted as aliases (same meaning), listed in --help and
#: README: run_cpu (torch.backends.xeon.run_cpu / ipexrun) and torchrun. Every option also
#: takes torchrun's ``--name_with_underscores`` form.
ALIASES: Mapping[str, str] = {
    "--use-logical-core": "--use-logical-cores (run_cpu)",
    "--node-id": "--node-list N (run_cpu: one node)",
    "--disable-numactl": "--bind affinity (run_cpu)",
    "--disable-taskset": "with --disable-numactl: --bind none (run_cpu)",
    "--log-path": "--log-dir (run_cpu)",
    "--enable-tcmalloc": "--allocator tcmalloc (run_cpu)",
    "--enable-jemalloc": "--allocator jemalloc (run_cpu)",
    "--use-default-allocator": "--allocator default (run_cpu)",
    "--disable-iomp": "--omp-runtime gnu (run_cpu)",
    "--multi-instance": "--throughput-mode (run_cpu: one instance per node)",
    "--module": "-m (run_cpu: the program is a Python module)",
    "--standalone": "--ddp on one machine (torchrun)",
    "--nproc-per-node": "(torchrun's spelling; also --nproc_per_node)",
    "--use-env": "--ddp's default: LOCAL_RANK in the environment, no --local_rank argument "
                 "(torch.distributed.launch; see --pass-local-rank)",
}


class DdpOptions(NamedTuple):
    """``--ddp``: distributed training, one rank per socket by default.

    Attributes:
        nproc_per_node: ranks on this machine: "socket", "node" or a count (as text);
            None = "socket", or what the engine that started us says.
        nnodes: machines, "N" or "MIN:MAX" (elastic only).
        node_rank: this machine's rank (static rendezvous).
        master_addr: host of rank 0; None = this machine (one-machine runs).
        master_port: TCP port of rank 0's store; None = a free port (one machine) or 29500.
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
            did not (``--no-exit-hook`` / CPULAUNCH_NO_EXIT_HOOK=1 turn it off; issue 24).
        pass_local_rank: each rank's program also gets ``--local_rank=N`` (N its local
            rank) after its script, as ``torch.distributed.launch`` without ``--use-env``
            passed it (``--pass-local-rank``; :func:`cpulaunch.distributed.with_local_rank`).
    """

    nproc_per_node: Optional[str] = None
    nnodes: str = "1"
    node_rank: int = 0
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    rdzv_endpoint: Optional[str] = None
    rdzv_id: Optional[str] = None
    backend: str = "auto"
    ccl_worker_count: Optional[int] = None
    iface: Optional[str] = None
    standalone: bool = False
    max_restarts: Optional[int] = None
    exit_hook: bool = True
    pass_local_rank: bool = False

    @property
    def elastic(self) -> bool:
        """True with an elastic rendezvous (torchrun's c10d agent starts the ranks)."""
        return bool(self.rdzv_endpoint)


class LaunchOptions(NamedTuple):
    """How instances are started and watched.

    Attributes:
        log_dir: torchrun's layout under it: ``<run-id>/<i>/stdout.log`` etc.
        keep_going: on a failure let the others finish instead of stopping them.
        grace_period: seconds (finite, >= 0) between SIGTERM and SIGKILL.
        prefix_output: prefix console lines with ``[i] `` when several instances run.
        stdin_instance: index of the instance that reads the launcher's stdin; None =
            the only instance when there is one, else none (all read /dev/null).
        verify_after: seconds after start at which to inspect the processes (--verify).
    """

    log_dir: Optional[Path] = None
    keep_going: bool = False
    grace_period: float = 10.0
    prefix_output: bool = True
    stdin_instance: Optional[int] = None
    verify_after: Optional[float] = None


class Options(NamedTuple):
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
        inference_path: value for CPULAUNCH_INFERENCE_PATH, or None.
        ddp: distributed options, None without --ddp.
        omp_places: set OMP_PLACES/OMP_PROC_BIND for GNU OpenMP.
        kmp_blocktime: KMP_BLOCKTIME in ms for Intel OpenMP (None: the registry's 1 ms).
        verbose: -v count.
        aliases: the other launchers' spellings the user typed (``"--use-logical-core"``),
            for notes where they plan differently (:data:`ALIASES`).
        share_host: ``--share-host``: None (off), "fail" (plan on the cores no other
            cpulaunch job holds, fail naming the holder when they are too few) or "wait"
            (wait for them instead); docs/placement.md.
        lease_dir: the folder of the host-wide leases (``--lease-dir``), None: chosen by
            ``cpulaunch.machine.lease.lease_folder``.
    """

    output: Output = Output.RUN
    fmt: Optional[Format] = None
    sysroot: str = "/"
    request: Request = Request()
    omp_runtime: str = "auto"
    allocator: str = "auto"
    bind: BindMode = BindMode.NUMACTL
    override_env: bool = False
    program: tuple[str, ...] = ()
    no_python: bool = False
    launch: LaunchOptions = LaunchOptions()
    inference_path: Optional[str] = None
    ddp: Optional[DdpOptions] = None
    omp_places: bool = False
    kmp_blocktime: Optional[int] = None
    verbose: int = 0
    aliases: tuple[str, ...] = ()
    share_host: Optional[str] = None
    lease_dir: Optional[str] = None


# --------------------------------------------------------------------------- building


def _parse_list(opt: str, text: Optional[str]) -> Optional[frozenset]:
    if text is None:
        return None
    try:
        ids = cpulist.parse(text, limit=cpulist.MAX_IDS) if hasattr(cpulist, "MAX_IDS") else cpulist.parse(text)
    except CpulaunchError as exc:
        raise OptionsError(f"--{opt} {text!r}: {exc}; expected e.g. 0-3,8") from None
    if not ids:
        raise OptionsError(f"--{opt} {text!r} names nothing; expected e.g. 0-3,8")
    return ids


def _positive(name: str, value: Optional[int], minimum: int = 1) -> Optional[int]:
    if value is not None and value < minimum:
        raise OptionsError(f"--{name} {value}: must be {minimum} or more")
    return value


def _output(values: Mapping) -> Output:
    chosen = [o for o, flag in ((Output.SHOW_TOPOLOGY, "show_topology"), (Output.PRINT_ENV, "print_env"),
                                (Output.DRY_RUN, "dry_run")) if values.get(flag)]
    if len(chosen) > 1:
        raise OptionsError(" and ".join("--" + o.value for o in chosen) + " cannot be combined; choose one")
    return chosen[0] if chosen else Output.RUN


def _format(values: Mapping, output: Output) -> Optional[Format]:
    text = values.get("fmt")
    if text is None:
        return _DEFAULT_FORMAT.get(output)
    fmt = Format(text.lower())
    if output is Output.RUN:
        raise OptionsError(f"--format {fmt.value} applies to --dry-run, --print-env or --show-topology")
    allowed = _FORMATS_FOR[output]
    if fmt not in allowed:
        raise OptionsError(f"--{output.value} --format {fmt.value}: use " + ", ".join(f.value for f in allowed))
    return fmt


def _aliases(values: Mapping, given: frozenset) -> dict:
    """Fold run_cpu's spellings into ours; an alias that contradicts the option it
    stands for is an error (never a silent pick)."""
    v = dict(values)

    def fold(alias: str, option: str, value, label: str):
        if not v.get(alias):
            return
        if option in given and v.get(option) != value:
            raise OptionsError(f"{label} contradicts --{option.replace('_', '-')} {v.get(option)}; give one")
        v[option] = value

    fold("use_logical_core", "use_logical_cores", True, "--use-logical-core")
    bind = "none" if v.get("disable_taskset") and v.get("disable_numactl") else "affinity"
    if v.get("disable_taskset") and not v.get("disable_numactl"):
        raise OptionsError("--disable-taskset goes with --disable-numactl (run_cpu); or use --bind none")
    fold("disable_numactl", "bind", bind, "--disable-numactl")
    for alias, alloc in (("enable_tcmalloc", "tcmalloc"), ("enable_jemalloc", "jemalloc"),
                         ("use_default_allocator", "default")):
        fold(alias, "allocator", alloc, "--" + alias.replace("_", "-"))
    fold("disable_iomp", "omp_runtime", "gnu", "--disable-iomp")
    fold("multi_instance", "throughput_mode", True, "--multi-instance")
    if v.get("node_id") is not None:
        if v.get("node_list") is not None:
            raise OptionsError("--node-id and --node-list cannot be combined; give --node-list")
        v["node_list"] = str(v["node_id"])
    if v.get("log_path") is not None:
        if v.get("log_dir") is not None:
            raise OptionsError("--log-path and --log-dir cannot be combined; give --log-dir")
        v["log_dir"] = v["log_path"]
    return v


def _request(v: Mapping) -> Request:
    from cpulaunch.plan import parse_index_list

    instance_idx = None
    if v.get("instance_idx") is not None:
        try:
            instance_idx = parse_index_list(v["instance_idx"])
        except CpulaunchError as exc:
            raise OptionsError(f"--instance-idx {v['instance_idx']!r}: {exc}") from None
        if not instance_idx:
            raise OptionsError(f"--instance-idx {v['instance_idx']!r} names no instance")
    count = lambda name: _positive(name.replace("_", "-"), v.get(name))  # noqa: E731
    return Request(
        ninstances=count("ninstances"),
        instances_per_socket=count("instances_per_socket"),
        instances_per_node=count("instances_per_node"),
        instances_per_l3=count("instances_per_l3"),
        equal_sizes=bool(v.get("equal_sizes")),
        ncores_per_instance=_core_counts(v.get("ncores_per_instance")),
        latency_mode=bool(v.get("latency_mode")),
        throughput_mode=bool(v.get("throughput_mode")),
        use_logical_cores=bool(v.get("use_logical_cores")),
        use_e_cores=bool(v.get("use_e_cores")),
        core_list=_parse_list("core-list", v.get("core_list")),
        node_list=_parse_list("node-list", v.get("node_list")),
        instance_idx=instance_idx,
        mem_policy=MemPolicy(str(v.get("mem_policy") or "bind").lower()),
        **_budgets(v),
    )


def _core_counts(value) -> "Optional[Union[int, tuple[int, ...]]]":
    """``--ncores-per-instance``: one count (``"8"`` -> 8) or one per instance, run_cpu's
    habit for uneven sub-NUMA clusters (``"43,43,42"`` -> (43, 43, 42)); None when not given.

    Raises:
        OptionsError: anything else (``"8,x"``, ``"0"``, ``"4,,4"``).
    """
    if value is None:
        return None
    text = str(value).strip()
    words = text.split(",")
    if not all(w.strip().isascii() and w.strip().isdigit() and len(w.strip()) <= 9 for w in words):
        raise OptionsError(f"--ncores-per-instance {text!r}: expected a number of cores (8) or "
                           "one per instance, separated by commas (43,43,42)")
    counts = tuple(int(w) for w in words)
    if min(counts) < 1:
        raise OptionsError(f"--ncores-per-instance {text!r}: each count must be 1 or more")
    return counts[0] if len(counts) == 1 else counts


def _share_host(v: Mapping) -> Optional[str]:
    """``--share-host`` / CPULAUNCH_SHARE_HOST: "fail" (also a bare flag, 1, true, yes,
    on), "wait", or None (off: 0, false, no, off, unset)."""
    raw = v.get("share_host")
    if raw is None:
        return None
    word = str(raw).strip().lower()
    if word in ("", "0", "false", "no", "off"):
        return None
    if word in ("fail", "1", "true", "yes", "on"):
        return "fail"
    if word == "wait":
        return "wait"
    raise OptionsError(f"--share-host {raw!r}: use fail (the default: say who holds the cores) or wait")


def _budgets(v: Mapping) -> dict:
    """The core budgets the planner knows about (issue 11), only those it has fields for."""
    known = set(Request._fields)
    out = {}
    for name in ("dataloader_workers", "reserve_cores"):
        value = v.get(name)
        if value is not None:
            _positive(name.replace("_", "-"), value, minimum=0)
            if name in known:
                out[name] = value
            elif value:
                raise OptionsError(f"--{name.replace('_', '-')} is not supported by this planner yet")
    return out


_DDP_ONLY = ("nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port", "rdzv_endpoint",
             "rdzv_id", "backend", "ccl_worker_count", "iface", "standalone", "rdzv_backend", "max_restarts",
             "no_exit_hook", "pass_local_rank", "use_env")


def _ddp(v: Mapping, given: frozenset) -> Optional[DdpOptions]:
    wants = v.get("ddp") or v.get("standalone")
    stray = [n for n in _DDP_ONLY if n in given and v.get(n) not in (None, False)]
    if not wants:
        if stray:
            raise OptionsError(f"--{stray[0].replace('_', '-')} applies to --ddp only; add --ddp or drop it")
        return None
    nnodes = str(v.get("nnodes") or "1")
    if v.get("rdzv_backend") not in (None, "c10d"):
        raise OptionsError(f"--rdzv-backend {v['rdzv_backend']}: only c10d is supported")
    opts = DdpOptions(
        nproc_per_node=v.get("nproc_per_node"),
        nnodes=nnodes,
        node_rank=int(v.get("node_rank") or 0),
        master_addr=v.get("master_addr"),
        master_port=v.get("master_port"),
        rdzv_endpoint=v.get("rdzv_endpoint"),
        rdzv_id=v.get("rdzv_id"),
        backend=str(v.get("backend") or "auto").lower(),
        ccl_worker_count=None if v.get("ccl_worker_count") is None
        else _positive("ccl-worker-count", v["ccl_worker_count"], minimum=0),
        iface=v.get("iface"),
        standalone=bool(v.get("standalone")),
        max_restarts=_positive("max-restarts", v.get("max_restarts"), minimum=0),
        exit_hook=not v.get("no_exit_hook"),
        pass_local_rank=bool(v.get("pass_local_rank")),
    )
    if opts.pass_local_rank and v.get("use_env"):
        raise OptionsError("--use-env (torch.distributed.launch: pass no --local_rank argument) contradicts "
                           "--pass-local-rank; drop one of them")
    if opts.master_port is not None and not 1 <= opts.master_port <= 65535:
        raise OptionsError(f"--master-port {opts.master_port}: use a TCP port 1-65535")
    if opts.standalone and (nnodes != "1" or opts.master_addr or opts.rdzv_endpoint):
        raise OptionsError("--standalone is one machine: drop --nnodes/--master-addr/--rdzv-endpoint")
    if not opts.elastic:
        if not nnodes.isdigit() or int(nnodes) < 1:
            raise OptionsError(f"--nnodes {nnodes}: a MIN:MAX range needs --rdzv-endpoint HOST:PORT (elastic)")
        if int(nnodes) > 1 and not opts.master_addr:
            raise OptionsError("--nnodes > 1 needs --master-addr HOST (rank 0's machine) or --rdzv-endpoint HOST:PORT")
        if not 0 <= opts.node_rank < int(nnodes):
            raise OptionsError(f"--node-rank {opts.node_rank} must be between 0 and --nnodes - 1")
    if opts.max_restarts is not None and not opts.elastic:
        raise OptionsError("--max-restarts applies to an elastic run (--rdzv-endpoint HOST:PORT), whose "
                           "ranks torchrun's agent restarts; cpulaunch does not restart a static rendezvous")
    if opts.elastic and "node_rank" in given and v.get("node_rank"):
        raise OptionsError("--node-rank applies to a static rendezvous; the elastic one assigns ranks")
    if v.get("instance_idx") is not None:
        raise OptionsError("--instance-idx does not apply to --ddp: every local rank runs (use --nproc-per-node)")
    return opts


def _launch(v: Mapping) -> LaunchOptions:
    grace = float(v.get("grace_period", 10.0))
    if not math.isfinite(grace) or grace < 0:
        raise OptionsError(f"--grace-period {v.get('grace_period')}: give a finite number of seconds >= 0")
    verify_after = v.get("verify_after")
    if verify_after is not None and (not math.isfinite(verify_after) or verify_after < 0):
        raise OptionsError(f"--verify-after {verify_after}: give a finite number of seconds >= 0")
    if v.get("verify") and verify_after is None:
        verify_after = 5.0
    log_dir = v.get("log_dir")
    return LaunchOptions(
        log_dir=Path(log_dir) if log_dir else None,
        keep_going=bool(v.get("keep_going")),
        grace_period=grace,
        prefix_output=not v.get("no_prefix"),
        stdin_instance=v.get("stdin_instance"),
        verify_after=verify_after,
    )


def from_values(values: Mapping[str, Any], given: frozenset[str] = frozenset()) -> Options:
    """Build :class:`Options` from parsed option values (pure).

    Args:
        values: option name (python identifier, e.g. "ninstances") -> parsed value, as
            click gives them; ``program`` is the tuple of words after cpulaunch's options.
        given: names the user set explicitly (command line or CPULAUNCH_* variable), so
            that an alias contradicting an option is caught.

    Raises:
        OptionsError: a combination that would be ignored or misread, or a bad value.
    """
    v = _aliases(values, given)
    output = _output(v)
    fmt = _format(v, output)
    ddp = _ddp(v, given)
    if output is Output.PRINT_ENV and fmt in (Format.SHELL, Format.DOTENV, Format.JSON):
        idx = v.get("instance_idx")
        if idx is not None and ("," in idx or "-" in idx):
            raise OptionsError(f"--print-env prints one instance; give one index (--instance-idx {idx}), "
                               "or use --dry-run for several")
    if ddp is not None and output is Output.PRINT_ENV:
        raise OptionsError("--print-env does not apply to --ddp (each rank's env needs its rendezvous); "
                           "use --ddp --dry-run --format json")
    omp = str(v.get("omp_runtime") or "auto").lower()
    if omp not in OPENMP_CHOICES:
        raise OptionsError(f"--omp-runtime {omp}: use one of {', '.join(OPENMP_CHOICES)}")
    alloc = str(v.get("allocator") or "auto").lower()
    if alloc not in ALLOCATOR_CHOICES:
        raise OptionsError(f"--allocator {alloc}: use one of {', '.join(ALLOCATOR_CHOICES)}")
    launch = _launch(v)
    return Options(
        output=output,
        fmt=fmt,
        sysroot=str(v.get("sysroot") or "/"),
        request=_request(v),
        omp_runtime=omp,
        allocator=alloc,
        bind=BindMode(str(v.get("bind") or "numactl").lower()),
        override_env=bool(v.get("override_env")),
        program=tuple(v.get("program") or ()),
        no_python=bool(v.get("no_python")),
        launch=launch,
        inference_path=v.get("inference_path"),
        ddp=ddp,
        omp_places=bool(v.get("omp_places")),
        kmp_blocktime=_positive("kmp-blocktime", v.get("kmp_blocktime"), minimum=0),
        verbose=int(v.get("verbose") or 0),
        aliases=tuple(a for a in ALIASES if values.get(a[2:].replace("-", "_")) not in (None, False)),
        share_host=_share_host(v),
        lease_dir=v.get("lease_dir"),
    )


#: Options a config file may not set (they choose what the invocation does, not how), and
#: the parameters that are not settings at all (they act, or name the file itself).
_NOT_CONFIGURABLE = {"program", "dry_run", "print_env", "show_topology", "fmt", "sysroot", "verbose",
                     "help", "version", "config"}
#: Largest config file read (tune's best.toml is under 1 KiB; a pyproject.toml rarely
#: reaches 20 KiB). A bigger one is refused, never cut short.
CONFIG_MAX_BYTES = 1 << 20


class Kind(NamedTuple):
    """The values one option takes, from its click declaration (``cli.option_kinds``).

    Attributes:
        name: "flag" (a bool), "count" (an int >= 0), "integer" (an int; never a bool or a
            float), "number" (an int or a float, never a bool; seconds), "choice" (one of
            ``choices``, any case, as on the command line), "string" (a str; an int is taken
            as its digits, so ``node-list = 1`` and ``nproc_per_node=2`` work), "path" (a str
            or os.PathLike naming a file or folder).
        choices: the allowed strings of a "choice".
    """

    name: str
    choices: tuple[str, ...] = ()


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
    if Path(path).name == "pyproject.toml":
        tool = doc.get("tool", {})
        table = tool.get("cpulaunch", {}) if isinstance(tool, dict) else None
        if not isinstance(table, dict):
            raise OptionsError(f"{where}: [tool.cpulaunch] must be a table of settings, not "
                               + _TYPE_NAMES.get(type(table if isinstance(tool, dict) else tool), "a value"))
        return table
    return doc["cpulaunch"] if isinstance(doc.get("cpulaunch"), dict) else doc


def config_defaults(data: bytes, path: str, kinds: Mapping[str, Kind],
                    label: str = "--config") -> dict[str, Any]:
    """Defaults from a TOML config file (pure over its bytes).

    Keys are cpulaunch's option names (``ninstances``, ``allocator``, ``omp-runtime`` or
    ``omp_runtime``); a ``pyproject.toml`` is read from its ``[tool.cpulaunch]`` table,
    any other file from its top level (``[cpulaunch]`` too, as tune's best.toml writes).
    Other tables (tune's ``[measured]``) are information and skipped. Each value must
    have its option's type exactly (:func:`typed_value`): ``ninstances = 2.5`` is an error,
    never 2.

    Args:
        data: the file's bytes (at most :data:`CONFIG_MAX_BYTES`, read by the caller).
        path: the file's name, for messages and to recognise a pyproject.toml.
        kinds: python option name -> :class:`Kind` of every option (``cli.option_kinds``).
        label: how the file was given: "--config" or "CPULAUNCH_CONFIG".

    Raises:
        OptionsError: not UTF-8 TOML, an unknown key, a key that is not a setting, a key
            given twice (``omp-runtime`` and ``omp_runtime``), a value of the wrong type.
    """
    from cpulaunch.errors import printable

    where = f"{label} {printable(path)}"
    out: dict = {}
    for key, value in _settings_table(_toml(data, where), path, where).items():
        name = key.replace("-", "_")
        kind = None if name in _NOT_CONFIGURABLE else kinds.get(name)
        if kind is None:
            if isinstance(value, dict):
                continue  # other tables (tune's [measured]) are information
            raise OptionsError(f"{where}: {shown(key)} is not a cpulaunch setting; see cpulaunch --help")
        if name in out:
            raise OptionsError(f"{where}: {key} is given twice (as - and _ spellings); keep one")
        out[name] = typed_value(kind, value, f"{where}: {key}")
    return out
