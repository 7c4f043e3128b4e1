"""Each platform's environment recipe, as data: what is set, when, why, and where it comes
from. Pure; the one place these rules live (render applies what :func:`recipe_env`
returns; docs/dev/measurements.md shows the table and what was measured here).

A recipe adds variables to the ones cpulaunch plans on every machine (OMP_NUM_THREADS,
pinning, the library registry's variables: :mod:`cpulaunch.render`). ``--recipe auto``
(the default) takes the recipe of the platform the probe named
(:func:`cpulaunch.machine.platform.platform_of`): ``amd-zen`` on AMD Zen, ``arm-neoverse``
on Arm Neoverse cores, ``generic`` everywhere else (Intel and unknown CPUs: the recipe
cpulaunch applied on every CPU before, built from Intel's and PyTorch's tuning guides, which
adds nothing here). Its values are tunables: a value already in the user's environment
wins, with a note, unless ``--override-env``; cpulaunch's own options win over a recipe's
value (``--kmp-blocktime``, ``--omp-wait-policy``, ``--zendnn-matmul-algo``, and the
pinning of ``--omp-places`` or of helper CPUs).

Each setting applies only where it takes effect (:class:`When`): ``KMP_*`` only under an
OpenMP runtime that reads them (Intel's libiomp5 or LLVM's libomp, ``--omp-runtime
intel``; torch's own libgomp ignores them), jemalloc's ``MALLOC_CONF`` only with
``--allocator jemalloc``, ``DNNL_DEFAULT_FPMATH_MODE`` only on a CPU with bf16.

What a recipe does not set by default, ``cpulaunch tune`` tries on that platform
(:data:`Recipe.tune`): on AMD the OpenMP wait policy, ZenDNN's matmul algorithm and the
recipe itself against ``generic`` (so jemalloc with AMD's MALLOC_CONF meets jemalloc with
the tuning guide's).
"""

from __future__ import annotations

from cpulaunch.enums import Enum
from cpulaunch.records import TYPE_CHECKING, Record

if TYPE_CHECKING:
    from typing import Mapping, Optional

__all__ = ["When", "Setting", "Recipe", "Applied", "RECIPES", "RECIPE_CHOICES", "GENERIC", "BY_KIND", "recipe_for",
           "resolve_recipe", "recipe_env", "WAIT_POLICIES", "ZENDNN_SOURCE", "GRAVITON_SOURCE"]


class When(str, Enum):
    """Where a setting takes effect; elsewhere it is left out."""

    ALWAYS = "always"
    """Every launch on the platform."""
    KMP_RUNTIME = "kmp-runtime"
    """The OpenMP runtime reads ``KMP_*`` (the registry's ``pin_style`` "kmp": Intel's
    libiomp5, LLVM's libomp); torch's libgomp ignores them."""
    GNU_RUNTIME = "gnu-runtime"
    """The OpenMP runtime is torch's GNU libgomp (the registry's ``pin_style`` "omp")."""
    JEMALLOC = "jemalloc"
    """jemalloc is preloaded (the value replaces the registry's MALLOC_CONF)."""
    BF16 = "bf16"
    """The CPU has bf16 instructions (/proc/cpuinfo: arm64 ``bf16``, x86 ``avx512_bf16``
    or ``amx_bf16``)."""


class Setting(Record):
    """One variable of a recipe.

    Attributes:
        name: the variable ("OMP_WAIT_POLICY").
        value: its value, as the environment holds it ("ACTIVE").
        when: where it applies (:class:`When`).
        why: what it does, one sentence.
        source: where the value comes from (a document, and where in it).
    """

    name: str
    value: str
    when: When
    why: str
    source: str


class Recipe(Record):
    """A platform's environment recipe.

    Attributes:
        name: what ``--recipe`` takes ("amd-zen").
        title: one line for help and docs.
        settings: the variables it sets (:class:`Setting`), in order.
        tune: the ``cpulaunch tune`` axes tried on this platform in addition to the common
            ones (names of :data:`cpulaunch.tools.tune.space.AXES`).
        measured: what was measured here about it (docs/dev/measurements.md has the figures).
    """

    name: str
    title: str
    settings: tuple[Setting, ...] = ()
    tune: tuple[str, ...] = ()
    measured: str = ""


#: The ZenDNN user guide, AMD document 57300, revision 5.2.1 (2026-04-13).
ZENDNN_SOURCE = "AMD ZenDNN user guide (57300, rev. 5.2.1)"
#: AWS's Graviton guide for PyTorch (aws-graviton-getting-started, machinelearning/pytorch.md).
GRAVITON_SOURCE = "AWS Graviton getting-started guide, PyTorch page"

#: Values of ``--omp-wait-policy`` (OpenMP 5.2 section 6.7, OMP_WAIT_POLICY): "auto"
#: leaves the variable to the recipe (unset under every recipe today: the runtime's own
#: default, libgomp spins a while then sleeps).
WAIT_POLICIES = ("auto", "active", "passive")

_DIST = "dist,dist"
_KMP_WHY = ("LLVM/Intel OpenMP barrier algorithm for many cores; ZenDNN's recommended pattern "
            "(with KMP_TPAUSE=0: no TPAUSE waits)")

GENERIC = Recipe(
    name="generic",
    title="Intel and unknown CPUs: cpulaunch's planned variables only (PyTorch's and Intel's tuning guides)",
)

AMD_ZEN = Recipe(
    name="amd-zen",
    title="AMD EPYC (Zen): ZenDNN's OpenMP, barrier and jemalloc settings where they take effect",
    settings=(
        Setting("OMP_DYNAMIC", "FALSE", When.ALWAYS,
                "the OpenMP team keeps OMP_NUM_THREADS threads (no shrinking under load)",
                f"{ZENDNN_SOURCE}, Environment Variables"),
        Setting("KMP_TPAUSE", "0", When.KMP_RUNTIME, _KMP_WHY, f"{ZENDNN_SOURCE}, zentf/zentorch settings"),
        Setting("KMP_FORKJOIN_BARRIER_PATTERN", _DIST, When.KMP_RUNTIME, _KMP_WHY,
                f"{ZENDNN_SOURCE}, zentf/zentorch settings"),
        Setting("KMP_PLAIN_BARRIER_PATTERN", _DIST, When.KMP_RUNTIME, _KMP_WHY,
                f"{ZENDNN_SOURCE}, zentf/zentorch settings"),
        Setting("KMP_REDUCTION_BARRIER_PATTERN", _DIST, When.KMP_RUNTIME, _KMP_WHY,
                f"{ZENDNN_SOURCE}, zentf/zentorch settings"),
        Setting("MALLOC_CONF",
                "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:-1,"
                "muzzy_decay_ms:-1", When.JEMALLOC,
                "jemalloc never returns freed pages to the kernel (decay -1): no page faults when a "
                "model's buffers are allocated again",
                "zentorch's environment set-up script (zentorch_env_setup.sh)"),
    ),
    tune=("recipe", "omp-wait-policy", "zendnn-matmul-algo"),
    measured="tune's axes recipe, omp-wait-policy and zendnn-matmul-algo measure what each gains on your "
             "model (on a 2-vCPU Zen 4 VM: OMP_WAIT_POLICY=ACTIVE 1.02x, ZENDNNL_MATMUL_ALGO=5 no gain)",
)

ARM_NEOVERSE = Recipe(
    name="arm-neoverse",
    title="Arm Neoverse (Graviton, Grace, Cobalt, Altra): AWS's PyTorch settings",
    settings=(
        Setting("DNNL_DEFAULT_FPMATH_MODE", "BF16", When.BF16,
                "oneDNN computes fp32 matmuls and convolutions with bf16 kernels (faster, fewer "
                "mantissa bits: set DNNL_DEFAULT_FPMATH_MODE=STRICT in your environment to keep fp32)",
                f"{GRAVITON_SOURCE}, runtime configurations"),
        Setting("LRU_CACHE_CAPACITY", "1024", When.ALWAYS,
                "oneDNN keeps up to 1024 primitives (no re-creation per call; more memory)",
                f"{GRAVITON_SOURCE}, runtime configurations"),
        Setting("THP_MEM_ALLOC_ENABLE", "1", When.ALWAYS,
                "PyTorch's CPU allocator asks for transparent huge pages for large tensors",
                f"{GRAVITON_SOURCE}, runtime configurations"),
        Setting("OMP_PROC_BIND", "false", When.GNU_RUNTIME,
                "OpenMP threads are not moved by the runtime (the instance's binding holds them)",
                f"{GRAVITON_SOURCE}, runtime configurations"),
        Setting("OMP_PLACES", "cores", When.GNU_RUNTIME, "OpenMP places are whole cores",
                f"{GRAVITON_SOURCE}, runtime configurations"),
    ),
    measured="not measured here (no Arm machine): the guide's settings as AWS gives them",
)

#: Every recipe by name, ``--recipe``'s choices after "auto".
RECIPES: dict[str, Recipe] = {r.name: r for r in (GENERIC, AMD_ZEN, ARM_NEOVERSE)}
#: ``--recipe`` values: "auto" (the platform's, :func:`recipe_for`) and every recipe.
RECIPE_CHOICES = ("auto",) + tuple(RECIPES)
#: The recipe ``auto`` takes for each :attr:`cpulaunch.machine.platform.Platform.kind`.
BY_KIND = {"amd-zen": "amd-zen", "arm-neoverse": "arm-neoverse", "intel": "generic", "other": "generic"}


class Applied(Record):
    """The recipe one launch applies, and why.

    Attributes:
        recipe: the :class:`Recipe`.
        platform: the CPU it was chosen for, as people read it ("AMD Zen 4 (family 0x19
            model 0x11)", :attr:`cpulaunch.machine.platform.Platform.text`).
        chosen: "auto" (the platform's) or "--recipe" (named by the user).
        env: the variables it sets for this launch (:func:`recipe_env`), before the user's
            environment is weighed (render's precedence).
    """

    recipe: Recipe
    platform: str
    chosen: str
    env: Mapping[str, str]

    def to_dict(self) -> dict:
        """The ``recipe`` member of the plan JSON: name, platform, how it was chosen, the
        variables it set and, for each, why and where from."""
        by_name = {s.name: s for s in self.recipe.settings}
        return {
            "name": self.recipe.name, "platform": self.platform, "chosen": self.chosen,
            "env": dict(self.env),
            "settings": [{"name": k, "value": v, "why": by_name[k].why if k in by_name else "an option's value",
                          "source": by_name[k].source if k in by_name else "the command line"}
                         for k, v in self.env.items()],
        }

    @property
    def line(self) -> str:
        """One line for ``--dry-run``: ``recipe amd-zen (auto: AMD Zen 4 (family 0x19 model
        0x11)) sets OMP_DYNAMIC (docs/dev/measurements.md)``."""
        own = {s.name for s in self.recipe.settings}
        mine = [k for k in self.env if k in own]
        given = [k for k in self.env if k not in own]
        what = ("sets " + ", ".join(mine)) if mine else "sets nothing beyond cpulaunch's planned variables"
        if given:
            what += "; options set " + ", ".join(given)
        return f"recipe {self.recipe.name} ({self.chosen}: {self.platform}) {what}"


def recipe_for(kind: str) -> Recipe:
    """The recipe ``--recipe auto`` applies on a platform of this kind (``"amd-zen"`` ->
    the amd-zen recipe; an unknown kind -> generic)."""
    return RECIPES[BY_KIND.get(kind, "generic")]


def resolve_recipe(choice: Optional[str], kind: str) -> Recipe:
    """The recipe for ``--recipe choice`` on a platform of ``kind``: ``auto`` (or None) is
    :func:`recipe_for`; a name is that recipe. Raises KeyError for an unknown name."""
    if choice in (None, "auto"):
        return recipe_for(kind)
    return RECIPES[choice]


def _applies(when: When, openmp_pin_style: str, allocator: Optional[str], flags: frozenset) -> bool:
    if when is When.KMP_RUNTIME:
        return openmp_pin_style == "kmp"
    if when is When.GNU_RUNTIME:
        return openmp_pin_style == "omp"
    if when is When.JEMALLOC:
        return allocator == "jemalloc"
    if when is When.BF16:
        return bool(flags & {"bf16", "avx512_bf16", "amx_bf16"})
    return True


def recipe_env(recipe: Recipe, *, openmp_pin_style: str, allocator: Optional[str], flags: frozenset = frozenset(),
               wait_policy: Optional[str] = None, matmul_algo: Optional[int] = None) -> Mapping[str, str]:
    """The variables ``recipe`` sets for one launch (pure), then the options' own values.

    Args:
        recipe: the recipe applied.
        openmp_pin_style: the OpenMP runtime's registry ``pin_style`` ("kmp" or "omp").
        allocator: registry name of the preloaded allocator, or None.
        flags: the CPU's /proc/cpuinfo flags (for :attr:`When.BF16`).
        wait_policy: ``--omp-wait-policy`` ("active", "passive"; None or "auto": the recipe's).
        matmul_algo: ``--zendnn-matmul-algo`` (None: the recipe's; ZenDNN reads 1 when unset).

    Returns:
        ``{name: value}`` in the recipe's order, the options' variables last.

    Example: ``recipe_env(AMD_ZEN, openmp_pin_style="omp", allocator="tcmalloc")`` ->
    ``{"OMP_DYNAMIC": "FALSE"}``; with ``allocator="jemalloc"`` AMD's MALLOC_CONF is added.
    """
    env = {s.name: s.value for s in recipe.settings if _applies(s.when, openmp_pin_style, allocator, flags)}
    if wait_policy not in (None, "auto"):
        env["OMP_WAIT_POLICY"] = wait_policy.upper()
    if matmul_algo is not None:
        env["ZENDNNL_MATMUL_ALGO"] = str(matmul_algo)
    return env
