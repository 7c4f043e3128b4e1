"""The usual slips, each answered in one line with its fix (issue 40; pure).

A person who runs cpulaunch many times a day types ``docter``, ``help``, run_cpu's
``--ncores-per-instance 1 1``, a script that is not executable, a real run after a
``--sysroot`` dry run, an interface that is not there. Each gets one line saying what was
wrong and what to type instead (exit 2 through :mod:`cpulaunch.cli`), never the low-level
failure it would lead to (numactl's usage text, a traceback in every rank).

The facts (is the word a file, which interfaces exist) are read by the caller (the core
and the host reader); here only the wording and the rules.
"""

from __future__ import annotations

import difflib
import re
from typing import Iterable, Optional, Sequence

__all__ = ["SUBCOMMANDS", "did_you_mean", "SYSROOT_RUN", "missing_program", "iface_problem", "master_addr_problem"]

#: cpulaunch's subcommands (cpulaunch.cli dispatches them), for "did you mean".
SUBCOMMANDS = ("doctor", "verify", "tune", "completion")

#: A real run with --sysroot: the plan describes the dumped machine, not this one.
SYSROOT_RUN = "--sysroot describes another machine: add --dry-run, --print-env or --show-topology"


def did_you_mean(word: str, candidates: Iterable[str]) -> Optional[str]:
    """The candidate closest to ``word`` when it is close enough to be a typo (difflib's
    ratio >= 0.75: ``"docter"`` -> ``"doctor"``, ``"ninstance"`` -> ``"ninstances"``),
    else None."""
    found = difflib.get_close_matches(word, sorted(set(candidates)), n=1, cutoff=0.75)
    return found[0] if found else None


def missing_program(word: str, *, kind: str, sizes: Optional[tuple[str, str]] = None) -> str:
    """The one line for a program that cannot be started, with its likely fix.

    Args:
        word: the program's first word as given (``"docter"``, ``"1"``, ``"./README.md"``).
        kind: what ``word`` names here: "file" (a file without execute permission),
            "folder", or "none" (neither a file nor on PATH).
        sizes: (the option as the user gave it, its value) when an option that takes a
            comma-separated list of numbers was given (``("--ncores-per-instance",
            "1")``): a number in the program's place is then its next size, run_cpu's
            habit of separating sizes by spaces.

    ``missing_program("1", kind="none", sizes=("--ncores-per-instance", "1"))`` ->
    ``"program '1' not found: --ncores-per-instance takes its sizes joined by commas
    (--ncores-per-instance 1,1)"``.
    """
    if kind == "file":
        path = word if "/" in word else f"./{word}"
        return (f"program {word!r} is a file but not an executable one on PATH: chmod +x {word} and run "
                f"cpulaunch {path}, or name its interpreter (cpulaunch sh {word}, cpulaunch python {word})")
    if kind == "folder":
        return f"program {word!r} is a folder, not a program; give the program to run after cpulaunch's options"
    if word in ("help", "-help"):
        return f"{word!r} is not a program here; did you mean `cpulaunch --help`?"
    sub = did_you_mean(word, SUBCOMMANDS)
    if sub is not None:
        return f"program {word!r} not found; did you mean `cpulaunch {sub}`?"
    if sizes is not None and re.fullmatch(r"\d+", word):
        option, value = sizes
        return (f"program {word!r} not found: {option} takes its sizes joined by commas "
                f"({option} {value},{word})")
    return f"program {word!r} not found (not a file, not on PATH)"


def iface_problem(iface: str, present: Optional[Sequence[str]], said: str) -> Optional[str]:
    """The one line for ``--iface`` naming an interface this machine does not have, or None.

    Args:
        iface: the interface asked for ("eth9").
        present: the interfaces this machine has (/sys/class/net), None when not known
            (another machine's plan, or the list could not be read).
        said: the option as the user gave it ("--iface eth9").
    """
    if present is None or iface in present:
        return None
    near = did_you_mean(iface, present)
    listed = ", ".join(sorted(present)) or "none"
    return (f"{said}: no such network interface on this machine (it has {listed}); "
            + (f"did you mean {near}?" if near else "name one of them"))


#: A host name (RFC 1123 labels, as MASTER_ADDR takes it) or an IPv4/IPv6 address.
_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?|\[?[0-9A-Fa-f:.]+\]?")


def master_addr_problem(addr: str, said: str) -> Optional[str]:
    """The one line for a ``--master-addr`` that cannot be a host, or None: a port glued
    to it (``10.0.0.1:29500``: the port is --master-port's), a URL, spaces.

    ``master_addr_problem("node0:29500", "--master-addr node0:29500")`` -> ``"--master-addr
    node0:29500: a host name or address only; give the port to --master-port
    (--master-addr node0 --master-port 29500)"``.
    """
    text = addr.strip()
    m = re.fullmatch(r"([^:/\s]+):(\d+)", text)
    if m:
        return (f"{said}: a host name or address only; give the port to --master-port "
                f"(--master-addr {m.group(1)} --master-port {m.group(2)})")
    if "://" in text:
        return f"{said}: a host name or address, not a URL (e.g. --master-addr node0)"
    if not text or not _HOST.fullmatch(text):
        return f"{said}: not a host name or address (e.g. --master-addr node0 or --master-addr 10.0.0.1)"
    return None
