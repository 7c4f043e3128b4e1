"""ELF shared objects: which libraries one needs (``DT_NEEDED``), read from its dynamic section
(the System V ABI's ELF format; elf(5)), the way ``cpulaunch doctor`` tells which OpenMP
runtime torch links. Pure over bytes (:func:`elf_needed`) and a memory-mapped read
(:func:`read_elf_needed`).
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Optional

from cpulaunch.errors import CpulaunchError
from cpulaunch.records import Record

__all__ = ["ElfError", "elf_needed", "read_elf_needed"]


class ElfError(CpulaunchError, ValueError):
    """Bytes that are not a readable ELF file with a dynamic section."""


# Program header types and dynamic tags (elf.h).
_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_STRSZ = 0, 1, 5, 10
_SHT_DYNAMIC = 6


def elf_needed(data) -> tuple[str, ...]:
    """The DT_NEEDED entries of an ELF file, in file order (pure).

    Args:
        data: the file's bytes, or any buffer supporting slicing and ``struct.unpack_from``
            (an ``mmap`` of a 430 MB library reads only the pages touched).

    Returns:
        e.g. ``("libc10.so", "libgomp.so.1", "libc.so.6")``; ``()`` for a file with a
        dynamic section but no DT_NEEDED.

    How (System V ABI, "Dynamic Section"): the dynamic section is found through the
    PT_DYNAMIC program header (else the SHT_DYNAMIC section header); its DT_STRTAB value is
    a virtual address, turned into a file offset through the PT_LOAD segment holding it
    (else the section whose sh_addr it is); each DT_NEEDED value is an offset into that
    string table. 32/64-bit and both byte orders are handled.

    Raises:
        ElfError: not ELF, truncated, or no dynamic section / string table.
    """
    try:
        return _elf_needed(data)
    except (struct.error, IndexError, ValueError) as exc:
        if isinstance(exc, ElfError):
            raise
        raise ElfError(f"truncated or malformed ELF file ({exc})") from None


class _Layout(Record):
    """An ELF file's program headers ``(type, offset, vaddr, filesz)``, section headers
    ``(type, addr, offset, size, link)`` and the struct format of a dynamic entry."""

    segments: list
    sections: list
    dyn_fmt: str


def _headers(data) -> _Layout:
    """The program and section headers of ``data`` (ELF32 or ELF64, either byte order)."""
    if len(data) < 52 or bytes(data[:4]) != b"\x7fELF":
        raise ElfError("not an ELF file (no \\x7fELF magic)")
    cls, enc = data[4], data[5]
    if cls not in (1, 2) or enc not in (1, 2):
        raise ElfError(f"unknown ELF class {cls} or data encoding {enc}")
    e = "<" if enc == 1 else ">"
    is64 = cls == 2
    if is64:
        phoff, shoff = struct.unpack_from(e + "QQ", data, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(e + "HHHH", data, 54)
        ph_fmt, sh_fmt, dyn_fmt = e + "IIQQQQQQ", e + "IIQQQQIIQQ", e + "qQ"
    else:
        phoff, shoff = struct.unpack_from(e + "II", data, 28)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(e + "HHHH", data, 42)
        ph_fmt, sh_fmt, dyn_fmt = e + "IIIIIIII", e + "IIIIIIIIII", e + "iI"
    segments = []
    for i in range(phnum if phoff else 0):
        f = struct.unpack_from(ph_fmt, data, phoff + i * phentsize)
        if is64:
            p_type, _flags, p_off, p_vaddr, _paddr, p_filesz = f[:6]
        else:
            p_type, p_off, p_vaddr, _paddr, p_filesz = f[:5]
        segments.append((p_type, p_off, p_vaddr, p_filesz))
    sections = []
    for i in range(shnum if shoff else 0):
        f = struct.unpack_from(sh_fmt, data, shoff + i * shentsize)
        sections.append((f[1], f[3], f[4], f[5], f[6]))
    return _Layout(segments, sections, dyn_fmt)


def _dynamic(data, layout: _Layout) -> tuple:
    """(DT_NEEDED string offsets, DT_STRTAB address or None, DT_STRSZ or None, the link of
    the SHT_DYNAMIC section or None) from the dynamic section: PT_DYNAMIC, else SHT_DYNAMIC."""
    dyn = next(((off, size) for t, off, _v, size in layout.segments if t == _PT_DYNAMIC), None)
    dyn_link = None
    if dyn is None:
        sec = next((s for s in layout.sections if s[0] == _SHT_DYNAMIC), None)
        if sec is None:
            raise ElfError("no dynamic section (a static executable or an object file?)")
        dyn, dyn_link = (sec[2], sec[3]), sec[4]
    entsize = struct.calcsize(layout.dyn_fmt)
    needed_offsets, strtab_addr, strsz = [], None, None
    for i in range(dyn[1] // entsize):
        tag, val = struct.unpack_from(layout.dyn_fmt, data, dyn[0] + i * entsize)
        if tag == _DT_NULL:
            break
        if tag == _DT_NEEDED:
            needed_offsets.append(val)
        elif tag == _DT_STRTAB:
            strtab_addr = val
        elif tag == _DT_STRSZ:
            strsz = val
    return needed_offsets, strtab_addr, strsz, dyn_link


def _strtab(layout: _Layout, strtab_addr: Optional[int], strsz: Optional[int],
            dyn_link: Optional[int]) -> tuple:
    """(file offset, size or None) of the dynamic string table: DT_STRTAB's address mapped
    through the PT_LOAD segment holding it, else a section at that address, else the
    dynamic section's link."""
    strtab_off = None
    if strtab_addr is not None:
        for t, off, vaddr, size in layout.segments:
            if t == _PT_LOAD and vaddr <= strtab_addr < vaddr + size:
                strtab_off = strtab_addr - vaddr + off
                break
        if strtab_off is None:
            strtab_off = next((s[2] for s in layout.sections if s[1] == strtab_addr and s[1]), None)
    if strtab_off is None and dyn_link is not None and dyn_link < len(layout.sections):
        strtab_off, strsz = layout.sections[dyn_link][2], layout.sections[dyn_link][3]
    if strtab_off is None:
        raise ElfError("DT_STRTAB points outside every loadable segment")
    return strtab_off, strsz


def _elf_needed(data) -> tuple:
    layout = _headers(data)
    needed_offsets, strtab_addr, strsz, dyn_link = _dynamic(data, layout)
    strtab_off, strsz = _strtab(layout, strtab_addr, strsz, dyn_link)
    end = len(data) if strsz is None else min(len(data), strtab_off + strsz)
    out = []
    for rel in needed_offsets:
        start = strtab_off + rel
        stop = data.find(b"\x00", start, end)
        if start >= end or stop < 0:
            raise ElfError(f"DT_NEEDED offset {rel} outside the string table")
        out.append(bytes(data[start:stop]).decode("utf-8", "replace"))
    return tuple(out)


def read_elf_needed(path: os.PathLike) -> tuple[str, ...]:
    """:func:`elf_needed` of the file at ``path``, memory-mapped (reads only what it needs).

    Raises:
        ElfError: as :func:`elf_needed`, or when the file cannot be opened.
    """
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return elf_needed(m)
    except (OSError, ValueError) as exc:
        if isinstance(exc, ElfError):
            raise
        raise ElfError(f"cannot read {path}: {exc}") from None
