"""Linux cpulist / hex cpumask text <-> sets of ids: the one parser and formatter.

The "list format" is the kernel's (Documentation/admin-guide/cgroup-v1/cpusets.rst,
"List format"): comma-separated decimal ids and inclusive ranges, optionally with a
``:used/group`` stride as in ``0-31:2/4`` (Documentation/admin-guide/kernel-parameters.rst,
"cpu lists"). The same format names NUMA nodes (``node/has_memory``) and is what
``numactl -C`` / ``--membind`` accept.

The "mask format" is what ``/sys/devices/system/node/nodeN/cpumap`` holds: comma-separated
32-bit hex words, most significant first (``"00000000,0000000f"`` -> ``{0, 1, 2, 3}``).

Both parsers are strict (only ASCII digits / hex digits, no signs, no blanks inside an
item, no empty items) and bounded: every id must be below ``limit`` (exclusive, like
``range``'s stop and the kernel's ``nr_cpu_ids``), and a too-large id is refused before
any set is allocated, so ``"0-4294967295"`` costs nothing. :data:`MAX_IDS` (CPU ids) and
:data:`MAX_NODE_IDS` (NUMA node ids) are the generous defaults callers bound user input by
when they know no tighter limit (``topology.Topology.id_limit`` is the probed machine's).
"""

from __future__ import annotations

from cpulaunch.errors import CpulaunchError
from cpulaunch.records import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Iterable, Optional

__all__ = ["parse", "format", "parse_mask", "is_digits", "DIGITS", "CpulistError", "MAX_IDS", "MAX_NODE_IDS"]

#: Default bound (exclusive) on logical CPU ids: 65,536. Linux's largest NR_CPUS is 8,192
#: (x86 CONFIG_MAXSMP, powerpc); this leaves room for any kernel while keeping a bogus
#: ``0-4294967295`` from allocating 4 billion ints.
MAX_IDS = 1 << 16

#: Default bound (exclusive) on NUMA node ids: 4,096. Linux's largest MAX_NUMNODES is
#: 1 << 10 (x86/arm64 NODES_SHIFT <= 10); node ids are sparse (POWER9 GPUs: 250-255).
MAX_NODE_IDS = 1 << 12

#: Longer numbers than this are refused before int() (Python caps int() at 4,300 digits).
_MAX_DIGITS = 19
#: The ASCII decimal digits: the set the run path's digit tests ``strip`` (:func:`is_digits`).
DIGITS = "0123456789"
_DIGITS_COMMA = DIGITS + ","
_HEX_DIGITS = "0123456789abcdefABCDEF"


def is_digits(text: str, most: int = 0) -> bool:
    """True when ``text`` is one or more ASCII decimal digits (at most ``most`` of them when
    ``most`` > 0): ``"0712"`` yes; ``""``, ``"+1"``, ``" 1"``, ``"1_0"``, ``"١"`` (a non-ASCII
    digit, which ``int()`` and ``str.isdigit`` take) no. The digit test of the run path's
    parsers, without :mod:`re` (issue 40: its import costs every run milliseconds); the
    loops that meet one file per CPU (this module's plain lists, the probe's numbered
    folders and id files) write the same ``strip`` inline, a call less per item on 8,192
    CPUs. ``tests/test_regex_twins.py`` holds each to the expression it replaced."""
    return text != "" and not text.strip(DIGITS) and (most <= 0 or len(text) <= most)


class CpulistError(CpulaunchError, ValueError):
    """Text that is neither a valid cpulist nor a valid cpumask (or names an id at or
    above the limit). The message quotes (an excerpt of) the text and says what is wrong,
    on one line."""


def excerpt(text: str, width: int = 60) -> str:
    """``repr`` of ``text``, cut to about ``width`` characters (``'0,1,2,...' (5000 chars)``):
    a message must stay one short line whatever a file holds."""
    if len(text) <= width:
        return repr(text)
    return f"{text[:width]!r}... ({len(text)} chars)"


def _strip_sysfs_end(text: str) -> str:
    # sysfs files end in "\n" and, on some arm64 kernels, a NUL byte as well; nothing
    # else is forgiven (a blank before or inside the list is refused).
    return text.replace("\x00", "").rstrip(" \t\n")


def _item_id(digits: str, text: str, limit: int) -> int:
    """``digits`` (ASCII, already matched) as an int below ``limit``, else CpulistError."""
    if len(digits) > _MAX_DIGITS and len(digits.lstrip("0")) > _MAX_DIGITS:
        raise CpulistError(f"id {digits[:20]}... ({len(digits)} digits) in cpulist "
                           f"{excerpt(text)} is too large (ids must be below {limit})")
    value = int(digits)
    if value >= limit:
        raise CpulistError(f"id {value} in cpulist {excerpt(text)} is too large "
                           f"(ids must be below {limit})")
    return value


def _small(digits: str) -> int:
    """A stride count; anything longer than 19 digits is as good as 10**19."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= _MAX_DIGITS else 10**_MAX_DIGITS


def _item_parts(item: str) -> Optional[tuple[str, Optional[str], Optional[str], Optional[str]]]:
    """One list item's digit strings: ``N``, ``N-M`` or ``N-M:used/group`` (lib/bitmap.c
    ``bitmap_parse_region``: a stride only follows a range) -> (N, M or None, used or None,
    group or None); None for anything else. ASCII digits only: ``int()`` would also take
    "+1", " 1", "1_0" and non-ASCII digits such as "١"."""
    lo, dash, rest = item.partition("-")
    if not is_digits(lo):
        return None
    if not dash:
        return lo, None, None, None
    hi, colon, stride = rest.partition(":")
    if not is_digits(hi):
        return None
    if not colon:
        return lo, hi, None, None
    used, slash, group = stride.partition("/")
    if not (slash and is_digits(used) and is_digits(group)):
        return None
    return lo, hi, used, group


def parse(text: str, limit: int = MAX_IDS) -> frozenset[int]:
    """Parse kernel list format into a set of non-negative ids, each below ``limit``.

    Examples: ``"0-2,4"`` -> ``{0, 1, 2, 4}``; ``""`` -> ``set()``; ``"0-7:2/4"`` ->
    ``{0, 1, 4, 5}`` (in each group of 4 starting at 0, use the first 2);
    ``"3\\n\\x00"`` -> ``{3}`` (NUL bytes anywhere, and blanks/newlines at the end, are
    ignored: sysfs writes them). Refused: ``"1,,2"`` (empty item), ``"+1"``, ``" 1"`` and
    ``"0, 1"`` (blanks before or inside the list), ``"١"`` (non-ASCII digit), ``"1_0"``,
    ``"3-1"`` (reversed), ``"5:1/2"`` (stride without range), ``"0-4294967295"`` with the
    default limit.

    Args:
        text: the list, e.g. the contents of ``/sys/devices/system/cpu/online``.
        limit: exclusive bound on ids (default :data:`MAX_IDS`; use :data:`MAX_NODE_IDS`
            for node ids, or the machine's ``kernel_max + 1``). Checked per item before
            the item's ids are generated.

    Returns:
        frozenset of ids (logical CPU ids or NUMA node ids, whichever the text names).

    Raises:
        CpulistError: on anything else (negative ids, reversed ranges, junk, ids >= limit).
    """
    body = _strip_sysfs_end(text)
    if not body:
        return frozenset()
    items = body.split(",")
    if not body.strip(_DIGITS_COMMA) and "" not in items and max(map(len, items)) <= _MAX_DIGITS:
        ids = frozenset(map(int, items))  # "5", "0,512": most sibling lists, in C-level steps
        top = max(ids)
        if top >= limit:
            raise CpulistError(f"id {top} in cpulist {excerpt(body)} is too large "
                               f"(ids must be below {limit})")
        return ids
    out: set[int] = set()
    for item in items:
        parts = _item_parts(item)
        if parts is None:
            raise CpulistError(
                f"bad item {excerpt(item, 24)} in cpulist {excerpt(body)}: expected N, N-M or "
                f"N-M:used/group in ASCII digits"
            )
        lo_s, hi_s, used_s, group_s = parts
        lo = _item_id(lo_s, body, limit)
        hi = lo if hi_s is None else _item_id(hi_s, body, limit)
        if hi < lo:
            raise CpulistError(f"reversed range {item!r} in cpulist {excerpt(body)}")
        if used_s is None:
            out.update(range(lo, hi + 1))
            continue
        used, group = _small(used_s), _small(group_s)
        if used <= 0 or group <= 0:
            raise CpulistError(
                f"bad stride {item!r} in cpulist {excerpt(body)}: used and group must be >= 1"
            )
        if used >= group:
            out.update(range(lo, hi + 1))
        else:
            for start in range(lo, hi + 1, group):
                out.update(range(start, min(start + used, hi + 1)))
    return frozenset(out)


def format(ids: Iterable[int]) -> str:  # noqa: A001 - mirrors the kernel's name for it
    """Format ids as kernel list format, ranges merged: ``{0, 1, 2, 4}`` -> ``"0-2,4"``.

    ``parse(format(s)) == s`` for every set of non-negative ints below :data:`MAX_IDS`;
    the empty set gives ``""``.
    """
    ordered = sorted(set(ids))
    parts: list[str] = []
    i = 0
    n = len(ordered)
    while i < n:
        j = i
        while j + 1 < n and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_mask(text: str, limit: int = MAX_IDS) -> frozenset[int]:
    """Parse a sysfs hex cpumask (``"ff,00000001"`` -> ``{0, 32..39}``).

    Words are 32-bit (1 to 8 hex digits), comma separated, most significant first, as in
    ``/sys/devices/system/node/nodeN/cpumap`` and ``topology/thread_siblings``. Leading
    all-zero words beyond ``limit`` are fine (the kernel prints ``nr_cpu_ids`` bits); a set
    bit at or above ``limit`` is refused. Work is linear in the text's length.

    Raises:
        CpulistError: if a word is not 1-8 hex digits, or a bit at or above ``limit`` is set.
    """
    body = _strip_sysfs_end(text)
    if not body:
        return frozenset()
    words = body.split(",")
    out: list[int] = []
    for i, word in enumerate(reversed(words)):  # least significant word first
        if not (word and len(word) <= 8 and not word.strip(_HEX_DIGITS)):
            raise CpulistError(
                f"bad cpumask {excerpt(body)}: {excerpt(word, 24)} is not a 32-bit hex word"
            )
        value = int(word, 16)
        if not value:
            continue
        base = 32 * i
        bits = bin(value)[:1:-1]  # least significant bit first
        top = base + len(bits) - 1
        if top >= limit:
            raise CpulistError(
                f"bad cpumask {excerpt(body)}: bit {top} is set (ids must be below {limit})"
            )
        out.extend(base + k for k, b in enumerate(bits) if b == "1")
    return frozenset(out)
