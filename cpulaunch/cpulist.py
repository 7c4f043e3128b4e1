"""Linux cpulist / hex cpumask text <-> sets of ids: the one parser and formatter.

The "list format" is the kernel's (Documentation/admin-guide/cgroup-v1/cpusets.rst,
"List format"): comma-separated decimal ids and inclusive ranges, optionally with a
``:used/group`` stride as in ``0-31:2/4`` (Documentation/admin-guide/kernel-parameters.rst,
"cpu lists"). The same format names NUMA nodes (``node/has_memory``) and is what
``numactl -C`` / ``--membind`` accept.

The "mask format" is what ``/sys/devices/system/node/nodeN/cpumap`` holds: comma-separated
32-bit hex words, most significant first (``"00000000,0000000f"`` -> ``{0, 1, 2, 3}``).
"""

from __future__ import annotations

from typing import Iterable

from cpulaunch.errors import CpulaunchError

__all__ = ["parse", "format", "parse_mask", "CpulistError"]


class CpulistError(CpulaunchError, ValueError):
    """Text that is neither a valid cpulist nor a valid cpumask."""


def _clean(text: str) -> str:
    # sysfs files end in "\n" and, on some arm64 kernels, a NUL byte as well.
    return text.replace("\x00", "").strip()


def parse(text: str) -> frozenset[int]:
    """Parse kernel list format into a set of non-negative ids.

    Examples: ``"0-2,4"`` -> ``{0, 1, 2, 4}``; ``""`` -> ``set()``; ``"0-7:2/4"`` ->
    ``{0, 1, 4, 5}`` (in each group of 4 starting at 0, use the first 2);
    ``"3\\n\\x00"`` -> ``{3}`` (trailing newline and NUL bytes are ignored).

    Args:
        text: the list, e.g. the contents of ``/sys/devices/system/cpu/online``.

    Returns:
        frozenset of ids (logical CPU ids or NUMA node ids, whichever the text names).

    Raises:
        CpulistError: on anything else (negative ids, reversed ranges, junk).
    """
    body = _clean(text)
    if not body:
        return frozenset()
    out: set[int] = set()
    for part in body.split(","):
        part = part.strip()
        if not part:
            raise CpulistError(f"empty item in cpulist {text!r}")
        try:
            stride_used, stride_group = None, None
            if ":" in part:
                part, stride = part.split(":", 1)
                used, group = stride.split("/", 1)
                stride_used, stride_group = int(used), int(group)
                if stride_used <= 0 or stride_group <= 0:
                    raise ValueError
            if "-" in part:
                lo_s, hi_s = part.split("-", 1)
                lo, hi = int(lo_s), int(hi_s)
            else:
                lo = hi = int(part)
        except ValueError:
            raise CpulistError(
                f"bad item {part!r} in cpulist {text!r}: expected N, N-M or N-M:used/group"
            ) from None
        if lo < 0 or hi < lo:
            raise CpulistError(f"bad range {part!r} in cpulist {text!r}")
        if stride_group is None:
            out.update(range(lo, hi + 1))
        else:
            out.update(i for i in range(lo, hi + 1) if (i - lo) % stride_group < stride_used)
    return frozenset(out)


def format(ids: Iterable[int]) -> str:  # noqa: A001 - mirrors the kernel's name for it
    """Format ids as kernel list format, ranges merged: ``{0, 1, 2, 4}`` -> ``"0-2,4"``.

    ``parse(format(s)) == s`` for every set of non-negative ints; the empty set gives ``""``.
    """
    ordered = sorted(set(ids))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_mask(text: str) -> frozenset[int]:
    """Parse a sysfs hex cpumask (``"ff,00000001"`` -> ``{0, 32..39}``).

    Words are 32-bit, comma separated, most significant first, as in
    ``/sys/devices/system/node/nodeN/cpumap`` and ``topology/thread_siblings``.

    Raises:
        CpulistError: if a word is not hexadecimal.
    """
    body = _clean(text)
    if not body:
        return frozenset()
    value = 0
    for word in body.split(","):
        try:
            value = (value << 32) | int(word, 16)
        except ValueError:
            raise CpulistError(f"bad cpumask {text!r}: {word!r} is not hexadecimal") from None
    out = set()
    bit = 0
    while value:
        if value & 1:
            out.add(bit)
        value >>= 1
        bit += 1
    return frozenset(out)
