"""cpulist: the one parser/formatter of kernel list format and sysfs hex masks.

Exact examples come from what real sysfs files hold (the fixture dumps: node cpulists,
NUL-terminated arm64 files, node cpumap words); properties are checked with hypothesis.
(Every real node cpumap against its cpulist: tests/test_topology.py, which unpacks the dumps.)
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpulaunch import cpulist
from cpulaunch.cpulist import CpulistError

ids = st.frozensets(st.integers(min_value=0, max_value=5000), max_size=200)


# --------------------------------------------------------------------------- parse


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0", {0}),
        ("0-3", {0, 1, 2, 3}),
        ("0-2,4", {0, 1, 2, 4}),
        ("0-7,16-23", set(range(8)) | set(range(16, 24))),  # Xeon 4108 node0/cpulist
        ("0-15,88-103\n", set(range(16)) | set(range(88, 104))),  # POWER9 cpu/online
        ("250-255", set(range(250, 256))),  # memory-only GPU nodes (node/has_memory ids)
        ("0-2,4,6,8-9", {0, 1, 2, 4, 6, 8, 9}),  # fakeheteromemtiers node/has_memory
        ("5,1,3", {1, 3, 5}),  # unordered items are fine
        ("1-1", {1}),
        ("0-3,2-5", set(range(6))),  # overlapping ranges merge
        ("0-1 \n", {0, 1}),  # blanks at the end, as a shell may leave them
        ("", set()),
        ("\n", set()),
        ("\x00", set()),
    ],
)
def test_parse_examples(text, expected):
    assert cpulist.parse(text) == frozenset(expected)


def test_parse_ignores_trailing_newline_and_nul_bytes():
    # The Kunpeng 920 dump's topology lists end in "\n\x00" (256 such files).
    assert cpulist.parse("64-127\n\x00") == frozenset(range(64, 128))
    assert cpulist.parse("3\n\x00\x00") == {3}
    assert cpulist.parse("\x000-1\x00") == {0, 1}


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0-7:2/4", {0, 1, 4, 5}),  # kernel-parameters.rst: first 2 of each group of 4
        ("0-31:1/8", {0, 8, 16, 24}),
        ("2-9:1/2", {2, 4, 6, 8}),  # groups start at the range's first id, not at 0
        ("0-3:4/4", {0, 1, 2, 3}),  # used == group: every id
        ("0-5:8/4", set(range(6))),  # used > group: every id too
        ("0-3:1/2,10", {0, 2, 10}),
    ],
)
def test_parse_strides(text, expected):
    assert cpulist.parse(text) == frozenset(expected)


@pytest.mark.parametrize(
    "text",
    [
        "-1",  # negative id (a package id of -1 is not a CPU)
        "3-1",  # reversed range
        "a",
        "0,,1",  # empty item
        "0,",
        ",0",
        "0-",
        "-",
        "1-2-3",
        "0-7:0/4",  # zero used
        "0-7:2/0",  # zero group
        "0-7:2",  # stride without group
        "0-7:-1/4",
        "0x1f",  # a mask is not a list
        "0 1",
        # strict: only ASCII digits, no blanks before or inside the list
        "+1",
        " 1",
        "0- 1",
        "0-1 , 3",
        "1,,2",
        "1_0",  # int() would read 10
        "\u0661",  # ARABIC-INDIC DIGIT ONE: int() would read 1
        "\uff11-\uff13",  # fullwidth digits
        "5:1/2",  # a stride follows a range only (lib/bitmap.c)
        "0-7:+1/4",
        "\t3",
        "3\n4",
        "\ufffd",  # what a non-UTF-8 byte decodes to
    ],
)
def test_parse_rejects(text):
    with pytest.raises(CpulistError) as info:
        cpulist.parse(text)
    assert repr(text) in str(info.value)  # the message quotes what was given


def test_rejected_items_are_quoted_on_one_line():
    with pytest.raises(CpulistError) as info:
        cpulist.parse("1,,2\n")
    assert str(info.value) == (
        "bad item '' in cpulist '1,,2': expected N, N-M or N-M:used/group in ASCII digits"
    )
    # a huge file is quoted by an excerpt, and the message stays one line
    with pytest.raises(CpulistError) as info:
        cpulist.parse("0," * 50000 + "x\n")
    msg = str(info.value)
    assert "\n" not in msg and len(msg) < 250 and "(100001 chars)" in msg


# --------------------------------------------------------------------------- bounds


def test_default_limit_is_max_ids():
    assert cpulist.MAX_IDS == 65536 and cpulist.MAX_NODE_IDS == 4096
    assert cpulist.parse(f"{cpulist.MAX_IDS - 1}") == {65535}
    with pytest.raises(CpulistError) as info:
        cpulist.parse(f"{cpulist.MAX_IDS}")
    assert str(info.value) == "id 65536 in cpulist '65536' is too large (ids must be below 65536)"


@pytest.mark.parametrize(
    "text, limit, bad_id",
    [
        ("0-4294967295", cpulist.MAX_IDS, "4294967295"),  # issue 8: exhausted memory
        ("0-99999999", 8192, "99999999"),
        ("8", 8, "8"),  # limit is exclusive, like nr_cpu_ids
        ("0-3,8-9", 8, "8"),
        ("0,512", 512, "512"),  # the one-line fast path checks it too
        ("0-8:1/2", 8, "8"),  # a stride's range end counts, even if the stride skips it
        ("0-" + "9" * 40, cpulist.MAX_IDS, "9" * 20 + "... (40 digits)"),  # more digits than int() may read
    ],
)
def test_limit_refuses_ids_before_allocating(text, limit, bad_id):
    start = time.perf_counter()
    with pytest.raises(CpulistError) as info:
        cpulist.parse(text, limit=limit)
    assert time.perf_counter() - start < 0.1
    assert f"id {bad_id}" in str(info.value)
    assert f"(ids must be below {limit})" in str(info.value)


@pytest.mark.parametrize(
    "text, limit, expected",
    [
        ("0-7", 8, set(range(8))),
        ("7", 8, {7}),
        ("0-7:2/4", 8, {0, 1, 4, 5}),
        ("250-255", cpulist.MAX_NODE_IDS, set(range(250, 256))),
        ("", 1, set()),
        ("0000000000000000000000007", 8, {7}),  # leading zeros are not a large id
    ],
)
def test_ids_below_the_limit_are_accepted(text, limit, expected):
    assert cpulist.parse(text, limit=limit) == frozenset(expected)


def test_mask_limit():
    assert cpulist.parse_mask("000000ff", limit=8) == set(range(8))
    # leading zero words beyond the limit are what the kernel prints (nr_cpu_ids bits)
    assert cpulist.parse_mask("00000000," * 300 + "00000003", limit=8) == {0, 1}
    with pytest.raises(CpulistError) as info:
        cpulist.parse_mask("00000100", limit=8)
    assert "bit 8 is set (ids must be below 8)" in str(info.value)
    with pytest.raises(CpulistError):
        cpulist.parse_mask("80000000," + "00000000," * 3000 + "00000000")  # bit 96031
    # linear: a 1 MiB mask of set bits is refused at once, not after 8 million bits
    start = time.perf_counter()
    with pytest.raises(CpulistError):
        cpulist.parse_mask(",".join(["ffffffff"] * 116000))
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("word", ["+f", "f_f", "0x1f", " f", "123456789", "\uff10", ""])
def test_parse_mask_is_strict(word):
    with pytest.raises(CpulistError):
        cpulist.parse_mask(f"{word},00000001")


def test_cpulist_error_is_a_value_error():
    # cli.py catches ValueError from the parser to print a one-line usage error.
    assert issubclass(CpulistError, ValueError)


# --------------------------------------------------------------------------- format


@pytest.mark.parametrize(
    "ids_, text",
    [
        ({0, 1, 2, 4}, "0-2,4"),
        (set(), ""),
        ({7}, "7"),
        ({0, 1}, "0-1"),  # two adjacent ids are a range, as the kernel prints them
        ({1, 3, 5}, "1,3,5"),
        (set(range(16)) | set(range(88, 104)), "0-15,88-103"),
        ({0, 4, 8, 12}, "0,4,8,12"),
        ([3, 1, 2, 2], "1-3"),  # any iterable, duplicates ignored
        (range(250, 256), "250-255"),
    ],
)
def test_format_examples(ids_, text):
    assert cpulist.format(ids_) == text


def test_format_accepts_a_generator_and_a_dict():
    assert cpulist.format(c for c in (5, 4, 9)) == "4-5,9"
    assert cpulist.format({0: "a", 1: "b", 3: "c"}) == "0-1,3"


# --------------------------------------------------------------------------- masks


@pytest.mark.parametrize(
    "text, expected",
    [
        ("f", {0, 1, 2, 3}),
        ("00000000,0000000f", {0, 1, 2, 3}),
        ("ff,00000001", {0} | set(range(32, 40))),
        ("00000003\n", {0, 1}),  # fakeheteromemtiers node0/cpumap
        ("0000000c", {2, 3}),
        ("00000030", {4, 5}),
        ("000ff000", set(range(12, 20))),  # hwloc's E-core cpuset on the i7-1370P
        ("00000000,00000000,00000000,00000000", set()),
        ("ffffffff,ffffffff,ffffffff,ffffffff", set(range(128))),  # Kunpeng: all 128
        ("ffffffff,00000000,00000000,00000000", set(range(96, 128))),  # Kunpeng node3
        ("0000ffff,00000000,00000000,0000ffff", set(range(16)) | set(range(96, 112))),
        ("80000000,00000000", {63}),
        ("0\n\x00", set()),
        ("", set()),
    ],
)
def test_parse_mask_examples(text, expected):
    assert cpulist.parse_mask(text) == frozenset(expected)


@pytest.mark.parametrize("text", ["xyz", "ff,zz", "ff,,00", "0-3", "f f"])
def test_parse_mask_rejects(text):
    with pytest.raises(CpulistError):
        cpulist.parse_mask(text)


# --------------------------------------------------------------------------- properties


def _to_mask(s: frozenset) -> str:
    """Format ids as the kernel does for cpumap: 32-bit hex words, most significant first."""
    value = sum(1 << i for i in s)
    words = []
    while True:
        words.append(f"{value & 0xFFFFFFFF:08x}")
        value >>= 32
        if not value:
            break
    return ",".join(reversed(words))


@settings(max_examples=300, deadline=None)
@given(ids)
def test_parse_inverts_format(s):
    assert cpulist.parse(cpulist.format(s)) == s


@settings(max_examples=300, deadline=None)
@given(ids)
def test_format_is_canonical(s):
    text = cpulist.format(s)
    # idempotent: formatting what was parsed gives the same text back
    assert cpulist.format(cpulist.parse(text)) == text
    # canonical: ascending, disjoint, non-adjacent items; ranges have lo < hi
    items = [tuple(map(int, part.split("-"))) for part in text.split(",")] if text else []
    bounds = [(it[0], it[-1]) for it in items]
    for (lo1, hi1), (lo2, hi2) in zip(bounds, bounds[1:]):
        assert hi1 + 1 < lo2  # a gap between items, else they would have merged
    for it in items:
        assert len(it) in (1, 2) and (len(it) == 1 or it[0] < it[1])
    assert " " not in text and "\n" not in text


@settings(max_examples=200, deadline=None)
@given(ids, st.sampled_from(["", "\n", "\n\x00", "\x00"]))
def test_parse_ignores_sysfs_trailers(s, trailer):
    assert cpulist.parse(cpulist.format(s) + trailer) == s


@settings(max_examples=300, deadline=None)
@given(ids)
def test_parse_mask_of_a_formatted_mask(s):
    assert cpulist.parse_mask(_to_mask(s)) == s
    assert cpulist.parse_mask(_to_mask(s) + "\n\x00") == s


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=0, max_value=300),
    st.integers(min_value=0, max_value=300),
    st.integers(min_value=1, max_value=9),
    st.integers(min_value=1, max_value=9),
)
def test_stride_matches_its_definition(lo, width, used, group):
    hi = lo + width
    got = cpulist.parse(f"{lo}-{hi}:{used}/{group}")
    assert got == {i for i in range(lo, hi + 1) if (i - lo) % group < used}
