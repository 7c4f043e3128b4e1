"""Which CPU this is: its vendor and family (AMD Zen generation, Intel, Arm Neoverse), from
the identifiers of /proc/cpuinfo and, on arm64, the MIDR register sysfs shows. Pure: the
probe reads the files (:func:`cpulaunch.machine.probe.read_facts`, through the bounded
reader) and hands their text to :func:`parse_cpuid`; :func:`platform_of` names the result.

The platform decides which environment recipe ``--recipe auto`` applies
(:mod:`cpulaunch.machine.recipes`); the names are shown by ``--show-topology`` and
``cpulaunch doctor``.

Where the tables come from:

- AMD Zen generations by (family, model): Linux ``arch/x86/kernel/cpu/amd.c``
  (``bsp_init_amd``, the ``X86_FEATURE_ZEN1``..``ZEN6`` switch). /proc/cpuinfo prints
  family and model in decimal: ``cpu family : 25``, ``model : 17`` is family 0x19 model
  0x11, a Zen 4 (EPYC 9004 "Genoa" and this machine).
- Arm cores by (implementer, part): Linux ``arch/arm64/include/asm/cputype.h``
  (``ARM_CPU_PART_NEOVERSE_*``); /proc/cpuinfo prints them in hex (``CPU implementer :
  0x41``, ``CPU part : 0xd4f``), sysfs as the whole MIDR_EL1
  (``cpu0/regs/identification/midr_el1``: ``0x00000000410fd4f1``).
- Intel server cores by model (family 6): Linux ``arch/x86/include/asm/intel-family.h``.
"""

from __future__ import annotations

from cpulaunch.records import TYPE_CHECKING, Record

if TYPE_CHECKING:
    from typing import Optional

__all__ = ["CpuId", "Platform", "parse_cpuid", "parse_midr", "platform_of", "MIDR_FILE",
           "AMD_ZEN", "ARM_CORES", "INTEL_MODELS"]

#: arm64's MIDR_EL1 of the first CPU, below the root (read only when /proc/cpuinfo names
#: no implementer: some kernels and containers leave the ids out).
MIDR_FILE = "sys/devices/system/cpu/cpu0/regs/identification/midr_el1"


class CpuId(Record):
    """The identifiers of the first processor, as /proc/cpuinfo (and sysfs) give them.

    Attributes:
        arch: "x86" (a ``vendor_id`` line), "arm64" (``CPU implementer`` or ASIMD in
            ``Features``), "power" (``cpu : POWERn``), or "" (not known).
        vendor_id: x86's vendor string: "AuthenticAMD", "GenuineIntel", "HygonGenuine".
        family, model: x86's ``cpu family`` and ``model`` (numbers, read as decimal).
        implementer, part: arm64's ``CPU implementer`` and ``CPU part`` (0x41, 0xd4f).
        model_name: x86's ``model name``, POWER's ``cpu`` ("" on arm64, which has none).
    """

    arch: str = ""
    vendor_id: str = ""
    family: Optional[int] = None
    model: Optional[int] = None
    implementer: Optional[int] = None
    part: Optional[int] = None
    model_name: str = ""


class Platform(Record):
    """A CPU named for people and for the recipe table.

    Attributes:
        vendor: "AMD", "Intel", "Arm", "HiSilicon", "Ampere", "IBM", "Hygon", or "" (unknown).
        family: the generation or core: "Zen 4", "Neoverse V2", "Sapphire Rapids",
            "POWER9"; "" when the table does not know it.
        ids: the identifiers it was named from: "family 0x19 model 0x11",
            "implementer 0x41 part 0xd4f"; "" when there were none.
        kind: what the recipe table keys on: "amd-zen" (an AMD Zen CPU, any generation),
            "arm-neoverse" (an Arm Neoverse core, in Graviton, Grace, Cobalt, Altra...),
            "intel", or "other" (everything else, unknown included).
    """

    vendor: str = ""
    family: str = ""
    ids: str = ""
    kind: str = "other"

    @property
    def text(self) -> str:
        """``"AMD Zen 4 (family 0x19 model 0x11)"``, ``"unknown CPU"``."""
        name = " ".join(p for p in (self.vendor, self.family) if p) or "unknown CPU"
        return f"{name} ({self.ids})" if self.ids else name

    def to_dict(self) -> dict:
        """JSON-ready: ``{"vendor", "family", "ids", "kind"}`` ("" becomes null)."""
        return {"vendor": self.vendor or None, "family": self.family or None,
                "ids": self.ids or None, "kind": self.kind}


#: AMD Zen generations: family -> ((first model, last model, generation), ...).
AMD_ZEN: dict[int, tuple[tuple[int, int, str], ...]] = {
    0x17: ((0x00, 0x2F, "Zen 1"), (0x50, 0x5F, "Zen 1"), (0x30, 0x4F, "Zen 2"), (0x60, 0x7F, "Zen 2"),
           (0x90, 0x91, "Zen 2"), (0xA0, 0xAF, "Zen 2")),
    0x19: ((0x00, 0x0F, "Zen 3"), (0x20, 0x5F, "Zen 3"), (0x10, 0x1F, "Zen 4"), (0x60, 0xAF, "Zen 4")),
    0x1A: ((0x00, 0x2F, "Zen 5"), (0x40, 0x4F, "Zen 5"), (0x60, 0x7F, "Zen 5"), (0x50, 0x5F, "Zen 6"),
           (0x80, 0xFF, "Zen 6")),
}
#: AMD families before Zen with a name (K8 0xf, K10 0x10, Bulldozer and kin 0x15...).
AMD_OLDER = {0x0F: "K8", 0x10: "K10", 0x11: "K8 (Turion)", 0x12: "K10 (Llano)", 0x14: "Bobcat",
             0x15: "Bulldozer family", 0x16: "Jaguar family"}
#: Arm cores: (implementer, part) -> (vendor, core). 0x41 is Arm Ltd.; Neoverse cores are
#: what AWS Graviton 2/3/4 (N1, V1, V2), NVIDIA Grace (V2), Ampere Altra (N1) and
#: Microsoft Cobalt 100 (N2) are built on.
ARM_CORES: dict[tuple[int, int], tuple[str, str]] = {
    (0x41, 0xD0C): ("Arm", "Neoverse N1"),
    (0x41, 0xD40): ("Arm", "Neoverse V1"),
    (0x41, 0xD49): ("Arm", "Neoverse N2"),
    (0x41, 0xD4F): ("Arm", "Neoverse V2"),
    (0x41, 0xD84): ("Arm", "Neoverse V3"),
    (0x41, 0xD8E): ("Arm", "Neoverse N3"),
    (0x6D, 0xD49): ("Microsoft", "Cobalt 100 (Neoverse N2)"),
    (0x48, 0xD01): ("HiSilicon", "TaiShan v110 (Kunpeng 920)"),
    (0xC0, 0xAC3): ("Ampere", "AmpereOne"),
}
#: Arm implementer codes -> vendor, for parts the table does not name.
ARM_IMPLEMENTERS = {0x41: "Arm", 0x42: "Broadcom", 0x43: "Cavium", 0x46: "Fujitsu", 0x48: "HiSilicon",
                    0x4E: "NVIDIA", 0x50: "APM", 0x51: "Qualcomm", 0x61: "Apple", 0x6D: "Microsoft",
                    0xC0: "Ampere"}
#: Intel family-6 server and recent client models -> name (intel-family.h).
INTEL_MODELS: dict[int, str] = {
    0x55: "Skylake-SP / Cascade Lake / Cooper Lake", 0x6A: "Ice Lake-SP", 0x6C: "Ice Lake-D",
    0x8F: "Sapphire Rapids", 0xCF: "Emerald Rapids", 0xAD: "Granite Rapids", 0xAE: "Granite Rapids-D",
    0xAF: "Sierra Forest", 0x4F: "Broadwell-X", 0x56: "Broadwell-D", 0x3F: "Haswell-X",
    0x97: "Alder Lake", 0x9A: "Alder Lake-L", 0xB7: "Raptor Lake", 0xBA: "Raptor Lake-P",
    0xBF: "Raptor Lake-S", 0xAA: "Meteor Lake", 0xC6: "Arrow Lake", 0xBD: "Lunar Lake",
}
_NEOVERSE = frozenset(k for k, (_, core) in ARM_CORES.items() if "Neoverse" in core)


def _number(text: str, base: int) -> Optional[int]:
    try:
        return int(text.strip(), base)
    except ValueError:
        return None


def parse_cpuid(cpuinfo: Optional[str], midr: Optional[str] = None) -> CpuId:
    """The first processor's identifiers from the text of /proc/cpuinfo (pure).

    ``midr``: the text of :data:`MIDR_FILE`, used only on arm64 when cpuinfo names no
    implementer (:func:`parse_midr`).

    Examples: ``"vendor_id : AuthenticAMD\\ncpu family : 25\\nmodel : 17"`` ->
    ``CpuId("x86", "AuthenticAMD", 25, 17)``; ``"Features : fp asimd\\nCPU implementer :
    0x41\\nCPU part : 0xd4f"`` -> ``CpuId("arm64", implementer=0x41, part=0xd4f)``;
    ``None`` or ``""`` -> ``CpuId()``.
    """
    fields: dict[str, str] = {}
    for line in (cpuinfo or "").splitlines():
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if not sep:
            if not key and fields:  # a blank line ends the first processor
                break
            continue
        fields.setdefault(key, value.strip())
    if "vendor_id" in fields:
        return CpuId("x86", fields["vendor_id"], _number(fields.get("cpu family", ""), 10),
                     _number(fields.get("model", ""), 10), model_name=fields.get("model name", ""))
    implementer = _number(fields.get("cpu implementer", ""), 16)
    part = _number(fields.get("cpu part", ""), 16)
    is_arm = implementer is not None or "asimd" in fields.get("features", "").split()
    if is_arm and implementer is None and midr:
        implementer, part = parse_midr(midr)
    if is_arm:
        return CpuId("arm64", implementer=implementer, part=part)
    cpu = fields.get("cpu", "")
    if cpu.upper().startswith("POWER"):
        return CpuId("power", model_name=cpu)
    return CpuId()


def parse_midr(text: str) -> tuple[Optional[int], Optional[int]]:
    """(implementer, part) of an arm64 MIDR_EL1 value: bits 31-24 and 15-4.
    ``"0x00000000410fd4f1"`` -> ``(0x41, 0xd4f)``; anything else -> ``(None, None)``."""
    value = _number(text or "", 16)
    if value is None:
        return None, None
    return (value >> 24) & 0xFF, (value >> 4) & 0xFFF


def _amd(cpu: CpuId, ids: str) -> Platform:
    family = cpu.family or 0
    for first, last, gen in AMD_ZEN.get(family, ()):
        if first <= (cpu.model or 0) <= last:
            return Platform("AMD", gen, ids, "amd-zen")
    if family > max(AMD_ZEN):
        return Platform("AMD", "Zen (a family newer than this table)", ids, "amd-zen")
    if family in AMD_ZEN:
        return Platform("AMD", "Zen (a model this table does not name)", ids, "amd-zen")
    return Platform("AMD", AMD_OLDER.get(family, ""), ids, "other")


def platform_of(cpu: Optional[CpuId]) -> Platform:
    """Name the CPU of ``cpu`` (pure; the tables and their sources: module doc).

    Examples: AuthenticAMD family 25 model 17 -> ``Platform("AMD", "Zen 4", "family 0x19
    model 0x11", "amd-zen")``; GenuineIntel 6/0x8f -> ``("Intel", "Sapphire Rapids", ...,
    "intel")``; arm64 0x41/0xd4f -> ``("Arm", "Neoverse V2", "implementer 0x41 part
    0xd4f", "arm-neoverse")``; arm64 0x48/0xd01 -> ``("HiSilicon", "TaiShan v110 (Kunpeng
    920)", ..., "other")``; ``None`` or an empty CpuId -> ``Platform()`` (unknown CPU).
    Hygon's Dhyana (HygonGenuine, family 0x18) is a Zen 1 licensee: kind "other" (ZenDNN
    names AMD EPYC only).
    """
    if cpu is None:
        return Platform()
    if cpu.arch == "x86":
        ids = (f"family {cpu.family:#x} model {cpu.model:#x}"
               if cpu.family is not None and cpu.model is not None else "")
        if cpu.vendor_id == "AuthenticAMD":
            return _amd(cpu, ids)
        if cpu.vendor_id == "GenuineIntel":
            name = INTEL_MODELS.get(cpu.model or -1, "") if cpu.family == 6 else ""
            return Platform("Intel", name, ids, "intel")
        if cpu.vendor_id == "HygonGenuine":
            return Platform("Hygon", "Dhyana (Zen 1 based)" if cpu.family == 0x18 else "", ids, "other")
        import re  # an unknown vendor only (issue 40: re costs every run milliseconds)

        return Platform(re.sub(r"[^\w .-]", "", cpu.vendor_id)[:40], "", ids, "other")
    if cpu.arch == "arm64":
        if cpu.implementer is None:
            return Platform("", "arm64", "", "other")
        ids = f"implementer {cpu.implementer:#x}" + (f" part {cpu.part:#x}" if cpu.part is not None else "")
        key = (cpu.implementer, cpu.part if cpu.part is not None else -1)
        vendor, core = ARM_CORES.get(key, (ARM_IMPLEMENTERS.get(cpu.implementer, ""), ""))
        return Platform(vendor, core, ids, "arm-neoverse" if key in _NEOVERSE or "Neoverse" in core else "other")
    if cpu.arch == "power":
        import re  # POWER only (issue 40)

        m = re.match(r"(POWER\w*)", cpu.model_name.upper())
        return Platform("IBM", m.group(1) if m else "POWER", "", "other")
    return Platform()
