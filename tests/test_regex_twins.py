"""The run path reads text without :mod:`re` (issue 40: importing it cost every run about 8 ms,
docs/dev/measurements.md). Each hand-written test here is held to the regular expression it
replaced, and shlex.quote's twin to shlex: the same answers on any text of the characters that
matter (hypothesis), plus the cases that went wrong while writing them."""

import re
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpulaunch import cpulist, forms
from cpulaunch.cpulist import CpulistError
from cpulaunch.machine import probe
from cpulaunch.machine.libraries import preload_entries
from cpulaunch.names import is_python_name


def _text(chars, most=14):
    return st.text(st.sampled_from(chars), max_size=most)


#: ASCII digits and their look-alikes (a non-ASCII digit, a superscript), signs, blanks and
#: the separators the formats use.
DIGITY = list("0123456789") + ["١", "²", "+", "-", "_", " ", "\t", "\n", "\x00"]

# The expressions as they stood before (git show 87d1705:cpulaunch/cpulist.py, probe.py, ...).
ITEM = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+)/([0-9]+))?)?")
PLAIN = re.compile(r"[0-9]{1,19}(?:,[0-9]{1,19})*")
HEX_WORD = re.compile(r"[0-9a-fA-F]{1,8}")
INT = re.compile(r"-?[0-9]{1,10}")
SIZE = re.compile(r"([0-9]{1,12})([KMG]?)")


def _outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except CpulistError as exc:
        return "error", str(exc)


def _regex_parse(text, limit):
    """cpulist.parse as it was, on its regular expressions (the oracle)."""
    body = text.replace("\x00", "").rstrip(" \t\n")
    if not body:
        return frozenset()
    if PLAIN.fullmatch(body):
        return frozenset(map(int, body.split(",")))
    out = set()
    for item in body.split(","):
        m = ITEM.fullmatch(item)
        if m is None:
            raise CpulistError("bad")
        lo, hi, used, group = m.groups()
        lo = int(lo)
        hi = lo if hi is None else int(hi)
        if hi < lo:
            raise CpulistError("reversed")
        if used is None or int(used) >= int(group):
            out.update(range(lo, hi + 1))
        elif int(used) <= 0:
            raise CpulistError("stride")
        else:
            for start in range(lo, hi + 1, int(group)):
                out.update(range(start, min(start + int(used), hi + 1)))
    return frozenset(out)


@settings(max_examples=800, deadline=None)
@given(_text(DIGITY + list(",-:/"), 16))
def test_cpulist_parse_accepts_what_its_expressions_accepted(text):
    ours = _outcome(cpulist.parse, text, 1 << 40)
    theirs = _outcome(_regex_parse, text, 1 << 40)
    assert ours[0] == theirs[0], (text, ours, theirs)
    if ours[0] == "ok":
        assert ours == theirs


@settings(max_examples=800, deadline=None)
@given(st.lists(_text(list("0123456789abcdefABCDEFgx ١-+"), 10), min_size=1, max_size=3))
def test_cpulist_mask_words_as_their_expression(words):
    text = ",".join(words)
    accepted = all(HEX_WORD.fullmatch(w) for w in text.replace("\x00", "").rstrip(" \t\n").split(","))
    assert (_outcome(cpulist.parse_mask, text, 1 << 40)[0] == "ok") == (accepted or not text.strip())


@settings(max_examples=800, deadline=None)
@given(_text(DIGITY, 13), st.integers(0, 20))
def test_is_digits_as_its_expression(text, most):
    expected = re.fullmatch(r"[0-9]+", text) is not None and (most == 0 or len(text) <= most)
    assert cpulist.is_digits(text, most) == expected


@settings(max_examples=800, deadline=None)
@given(_text(DIGITY + list("KMGk"), 15))
def test_probe_numbers_and_cache_sizes_as_their_expressions(text):
    assert probe._is_int(text) == (INT.fullmatch(text) is not None)
    m = SIZE.fullmatch(text.replace("\x00", "").strip(" \t\n"))
    expected = None if m is None else int(m.group(1)) << {"": 0, "K": 0, "M": 10, "G": 20}[m.group(2)]
    assert probe.parse_cache_size(text) == expected


@settings(max_examples=800, deadline=None)
@given(st.lists(st.sampled_from(["MemTotal:", "Node 0 ", " ", "\t", "kB", "KB", "12", "0", "9" * 19, "x", "\n",
                                 "١"]), max_size=10))
def test_meminfo_total_as_its_expression(parts):
    text = "".join(parts)
    m = re.search(r"MemTotal:[ \t]+([0-9]{1,18})[ \t]*kB", text)
    assert probe._meminfo_total_kb(text) == (int(m.group(1)) if m else None)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(["cpu", "node", "index", "0", "1", "01", "12", "9" * 11, "freq", "x", "١"]),
                max_size=4), st.sampled_from(["cpu", "node", "index"]))
def test_numbered_folders_as_their_expression(parts, prefix):
    names = ["".join(parts), "".join(reversed(parts)), prefix + "".join(parts)]
    pat = re.compile(r"(?:^|\x00)" + re.escape(prefix) + r"(0|[1-9][0-9]{0,9})(?=\x00|$)")
    assert probe._numbered(names, prefix) == sorted(map(int, pat.findall("\x00".join(names))))


@pytest.mark.parametrize("status", [
    "Name:\tx\nCpus_allowed_list:\t0-3\nMems_allowed_list:\t0\n",
    "Cpus_allowed_list:0-1", "xCpus_allowed_list:\t1\n", "Cpus_allowed_list:\n",
    "a\nCpus_allowed_list:  \t2,3\nCpus_allowed_list:\t5", "", "Cpus_allowed_list \t1",
])
def test_status_lists_as_their_expression(status):
    m = re.search(r"^Cpus_allowed_list:[ \t]*([^\n]*)$", status, re.M)
    expected = None if m is None else cpulist.parse(m.group(1), 64)
    assert probe._status_list(None, status, "Cpus_allowed_list", 64) == expected


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["", "/usr/bin/", "./", "venv/bin/"]), _text(list("python3.1-wi_ ") + ["١"], 12))
def test_python_names_as_their_expression(folder, name):
    assert is_python_name(folder + name) == (re.fullmatch(r"python[0-9.]*", name) is not None)


@settings(max_examples=500, deadline=None)
@given(_text(list("ab/.: \t\n"), 16))
def test_preload_entries_split_as_glibc_and_the_expression(value):
    assert preload_entries(value) == [e for e in re.split("[ :]", value) if e]


@settings(max_examples=800, deadline=None)
@given(st.text(max_size=10))
def test_quote_is_shlex_quote(word):
    assert forms.quote(word) == shlex.quote(word)


@pytest.mark.parametrize("word", ["", "a b", "it's", "$HOME", "x.py", "--opt=1,2:3", "é", "a\nb", "@%+=:,./-_"])
def test_quote_and_join_are_shlex_on_the_usual_words(word):
    assert forms.quote(word) == shlex.quote(word)
    assert forms.join([word, "x y", "z"]) == shlex.join([word, "x y", "z"])
