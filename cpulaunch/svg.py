"""The machine and the plan as a picture: ``--show-topology --format svg`` and ``--dry-run
--format svg``. Pure: (Topology, instances) -> SVG text, the same bytes for the same input.

The drawing follows hwloc's ``lstopo``, which people know: boxes nested as the hardware
is (socket/package -> NUMA node -> L3 domain -> L2 or cluster -> core -> logical CPU, the
nesting of :func:`cpulaunch.render.topology_boxes`, so the text view and the picture
agree), in lstopo's greys. On top of it, the plan: each instance's (or DDP rank's)
compute CPUs filled in its own colour and its cores outlined in it; CPUs it is bound to
for helpers (oneCCL, DataLoader workers, reserved cores) in a light tint of it; each NUMA
node its memory policy names carries a chip of its colour and number in the node's bar;
CPUs this process may not use (affinity mask, cgroup cpuset) hatched grey. A legend under
the machine names each instance with its CPUs and memory.

Plain SVG 1.1 (rectangles, text, one pattern; no script, no CSS, no fonts to fetch), so
a browser, a README on GitHub or an editor shows it. Text widths are estimated from the
character count (no font is read), generously, for DejaVu Sans, the widest of the fonts
named. Boxes of a level are laid out in the grid of columns whose shape comes closest to
a wide rectangle, so 2 to 256 CPUs give a picture of a sensible size. Elements carry
``class`` and ``data-*`` attributes (``pu``/``data-cpu``, ``core``, ``numa``,
``mem``/``data-node``, ``data-instance``, ``data-state``) that tests and tools read.
"""

import math
from typing import Any, Optional, Sequence

from cpulaunch import cpulist
from cpulaunch.forms import one_line
from cpulaunch.view import CacheBox, cache_size_text, gib_text, topology_boxes
from cpulaunch.records import Record

__all__ = [
    "plan_svg",
    "instance_colour",
    "STATES",
]

FONT = "DejaVu Sans, Verdana, Arial, Helvetica, sans-serif"

#: Each instance's colour, by index (Tableau 10 without its grey, which means "not
#: allowed" here); past them, hues around the circle by the golden angle.
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948",
           "#9c755f", "#ff9da7")

#: What ``data-state`` of a logical CPU's rectangle says.
STATES = {
    "compute": "an instance's compute CPU (its OpenMP threads run there)",
    "helper": "bound to an instance for its helpers (oneCCL, DataLoader workers, reserved cores)",
    "idle": "usable, in no instance",
    "free": "usable (no plan drawn)",
    "not-allowed": "this process may not use it (affinity mask, cgroup cpuset)",
}

# Fills after lstopo's: grey packages, white caches and logical CPUs, darker grey cores;
# NUMA nodes in a light rose with a darker bar for their label and memory chips.
_FILL = {"machine": "#ffffff", "socket": "#dedede", "numa": "#f2e7e5", "L3": "#ffffff", "L2": "#f7f7f7",
         "cluster": "#f7f7f7", "core": "#cfcfcf", "memonly": "#f2e7e5"}
_NODE_BAR = "#e4cfcb"
_TEXT = "#1a1a1a"
_MUTED = "#8c8c8c"
_HATCH = "notallowed"


def instance_colour(index: int) -> str:
    """The colour of instance (or rank) ``index`` (0-based), as ``#rrggbb``: the first
    nine from a palette made to be told apart, then hues 137.5 degrees apart at two
    lightnesses. ``0`` -> ``"#4e79a7"``."""
    if index < len(PALETTE):
        return PALETTE[index]
    k = index - len(PALETTE)
    hue = (k * 137.508 + 20.0) % 360.0
    light = 0.50 if k % 2 == 0 else 0.38
    return _hsl(hue, 0.55, light)


def _hsl(h: float, s: float, lum: float) -> str:
    c = (1 - abs(2 * lum - 1)) * s
    x = c * (1 - abs((h / 60.0) % 2 - 1))
    m = lum - c / 2
    r, g, b = [(c, x, 0), (x, c, 0), (0, c, x), (0, x, c), (x, 0, c), (c, 0, x)][int(h // 60) % 6]
    return "#" + "".join(f"{round((v + m) * 255):02x}" for v in (r, g, b))


def _rgb(colour: str) -> tuple:
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


def _tint(colour: str, amount: float) -> str:
    """``colour`` mixed with white: 0 -> white, 1 -> the colour."""
    return "#" + "".join(f"{round(255 - (255 - v) * amount):02x}" for v in _rgb(colour))


def _ink(colour: str) -> str:
    """Black or white text, whichever reads better on ``colour`` (WCAG luminance)."""
    def lin(v: int) -> float:
        c = v / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (lin(v) for v in _rgb(colour))
    lum = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "#ffffff" if (1.05 / (lum + 0.05)) >= ((lum + 0.05) / 0.05) else _TEXT


def _text_width(text: str, size: float, bold: bool = False) -> int:
    """Estimated width in px (DejaVu Sans averages about 0.6 em per character)."""
    return math.ceil(len(text) * size * (0.66 if bold else 0.61))


def _xml(text: str) -> str:
    """``text`` fit for XML 1.0 character data and attribute values: control characters
    as backslash escapes (:func:`cpulaunch.render.one_line`), characters XML cannot hold
    (surrogates, U+FFFE, U+FFFF) replaced, markup escaped."""
    text = "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF or ch in "\ufffe\uffff" else ch for ch in one_line(text))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


# --------------------------------------------------------------------------- the plan's marks


class _Marks(Record):
    """Who holds what: {cpu: (instance index, "compute"|"helper")}, {node id: [(instance
    index, policy)]}, {instance index: its label}, and the instances' legend rows."""

    cpus: dict
    mems: dict
    names: dict
    rows: tuple


def _marks(instances: Sequence[Any]) -> _Marks:
    cpus: dict = {}
    mems: dict = {}
    names: dict = {}
    rows = []
    for inst in sorted(instances, key=lambda i: i.index):
        compute = tuple(inst.cpus)
        bound = tuple(getattr(inst, "bound_cpus", compute))
        helpers = sorted(set(bound) - set(compute))
        for c in compute:
            cpus.setdefault(c, (inst.index, "compute"))
        for c in helpers:
            cpus.setdefault(c, (inst.index, "helper"))
        policy = getattr(inst, "mem_policy", "")
        policy = str(getattr(policy, "value", policy) or "")
        for n in inst.mem_nodes:
            mems.setdefault(n, []).append((inst.index, policy))
        label = names[inst.index] = getattr(inst, "label", "") or f"instance {inst.index}"
        text = f"{label}: CPUs {cpulist.format(compute)}"
        if helpers:
            text += f" (+ helpers {cpulist.format(helpers)})"
        text += (f"; memory {policy} on node {cpulist.format(inst.mem_nodes)}" if inst.mem_nodes
                 else "; memory not bound (first touch)")
        rows.append((inst.index, text))
    return _Marks(cpus, mems, names, tuple(rows))


# --------------------------------------------------------------------------- boxes


class _Box:
    """One box of the drawing (mutable while it is laid out; never leaves this module).

    ``head``: its label lines, (text, font size, bold); ``kids``: boxes inside it, in a
    grid of ``cols`` columns (None: chosen by :func:`_choose_cols` for ``ratio``);
    ``fill``/``stroke``: None draws no rectangle (a container); ``attrs``: the rectangle's
    class and data-* attributes; ``chips``: (instance index, policy) marks in the bar.
    """

    def __init__(self, kind: str, head=(), kids=(), *, fill: Optional[str] = None, stroke: Optional[str] = "#707070",
                 stroke_width: float = 1.0, pad: int = 6, gap: int = 6, cols: Optional[int] = None,
                 ratio: float = 2.0, attrs=None, title: str = "", ink: str = _TEXT, size=None,
                 bar: Optional[str] = None, chips=(), radius: int = 3, col_gap: Optional[int] = None,
                 min_w: int = 0) -> None:
        self.kind, self.head, self.kids = kind, list(head), list(kids)
        self.fill, self.stroke, self.stroke_width = fill, stroke, stroke_width
        self.pad, self.gap, self.cols, self.ratio = pad, gap, cols, ratio
        self.col_gap = gap if col_gap is None else col_gap
        self.attrs, self.title, self.ink = dict(attrs or {}), title, ink
        self.fixed = size  # (w, h) of a leaf
        self.bar, self.chips, self.radius = bar, list(chips), radius
        self.min_w = min_w
        self.w = self.h = self.x = self.y = self.cw = 0
        self.col_w: list = []
        self.row_h: list = []

    # sizes --------------------------------------------------------------------------

    def head_height(self) -> int:
        if not self.head:
            return 0
        return sum(math.ceil(size * 1.3) for _, size, _ in self.head) + 2

    def head_width(self) -> int:
        widths = [_text_width(t, s, b) for t, s, b in self.head] or [0]
        if self.chips:
            shown, more = _chips(self.chips)
            widths[0] += 8 + sum(_chip_width(str(i)) + 3 for i, _ in shown) + (_chip_width(more) if more else 0)
        return max(widths)

    def measure(self) -> None:
        """Sizes, bottom-up: ``w``/``h``, and ``cw``, the width without labels (what a
        parent's choice of columns looks at, so that boxes alike are laid out alike
        whatever their labels and chips)."""
        if self.fixed is not None:
            self.w, self.h = self.fixed
            self.cw = self.w
            return
        for k in self.kids:
            k.measure()
        if self.cols is None:
            self.cols = _choose_cols(self)
        self.cols = max(1, min(self.cols, len(self.kids)))
        self.col_w, self.row_h, self.w, self.h = _grid(self, self.cols, content=False)
        self.cw = _grid(self, self.cols, content=True)[2]

    def place(self, x: int, y: int) -> None:
        """Positions, top-down."""
        self.x, self.y = x, y
        if not self.kids:
            return
        top = y + self.pad + self.head_height() + (2 if self.head else 0)
        for i, k in enumerate(self.kids):
            r, c = divmod(i, self.cols)
            kx = x + self.pad + sum(self.col_w[:c]) + self.col_gap * c
            ky = top + sum(self.row_h[:r]) + self.gap * r
            k.place(kx, ky)


def _grid(box: _Box, cols: int, content: bool) -> tuple:
    """(column widths, row heights, width, height) of ``box`` with its children in
    ``cols`` columns; ``content``: from the children's ``cw``, labels left out."""
    kids, n = box.kids, len(box.kids)
    rows = math.ceil(n / cols) if n else 0
    col_w = [max((kids[i].cw if content else kids[i].w) for i in range(c, n, cols)) for c in range(cols)] if n else []
    row_h = [max(k.h for k in kids[r * cols:(r + 1) * cols]) for r in range(rows)]
    grid_w = sum(col_w) + box.col_gap * (len(col_w) - 1) if n else 0
    grid_h = sum(row_h) + box.gap * (rows - 1) if n else 0
    head_h = box.head_height()
    w = max(grid_w, box.min_w, 0 if content else box.head_width()) + 2 * box.pad
    h = head_h + grid_h + 2 * box.pad + (2 if n and head_h else 0)
    return col_w, row_h, w, h


def _choose_cols(box: _Box) -> int:
    """The column count whose grid comes closest to ``box.ratio`` (width / height), a
    ragged last row counting against it (a count that divides evenly wins unless its
    shape is far off); ties go to more columns."""
    n = len(box.kids)
    if n <= 1:
        return 1
    best, pick = None, n
    for cols in range(n, 0, -1):
        _, _, w, h = _grid(box, cols, content=True)
        cost = abs(math.log((w / h) / box.ratio)) + (0.8 if n % cols else 0.0)
        if best is None or cost < best - 1e-9:
            best, pick = cost, cols
    return pick


def _fit(box: _Box, width: int) -> _Box:
    """``box`` with as many columns as fit ``width`` (px), at least one."""
    for kid in box.kids:
        kid.measure()
    box.cols = next((c for c in range(len(box.kids), 1, -1) if _grid(box, c, content=False)[2] <= width), 1)
    return box


#: Chips drawn in one NUMA node's bar; more instances bound there are counted ("+9").
MAX_CHIPS = 8


def _chips(chips: list) -> tuple:
    """(chips drawn, the count text of those left out or "")."""
    if len(chips) <= MAX_CHIPS:
        return chips, ""
    return chips[:MAX_CHIPS - 1], f"+{len(chips) - MAX_CHIPS + 1}"


def _chip_width(text: str) -> int:
    return _text_width(text, 9, True) + 8


# --------------------------------------------------------------------------- the machine as boxes


def _pu_box(topo, cpu: int, marks: _Marks, size: tuple, core_label: str) -> _Box:
    held = marks.cpus.get(cpu)
    attrs = {"class": "pu", "data-cpu": str(cpu)}
    node = topo.node_of(cpu)
    where = f"CPU {cpu}, {core_label}" + (f", NUMA node {node}" if node is not None else "")
    if cpu not in topo.allowed:
        attrs["data-state"] = "not-allowed"
        return _Box("pu", [(str(cpu), 11, False)], fill=f"url(#{_HATCH})", stroke="#9a9a9a", attrs=attrs,
                    title=f"{where}: not allowed for this process", ink=_MUTED, size=size, radius=2)
    if held is None:
        attrs["data-state"] = "idle" if marks.rows else "free"
        return _Box("pu", [(str(cpu), 11, False)], fill="#ffffff", stroke="#7a7a7a", attrs=attrs,
                    title=where + (": idle" if marks.rows else ""), size=size, radius=2)
    index, state = held
    colour = instance_colour(index)
    attrs.update({"data-state": state, "data-instance": str(index)})
    fill = colour if state == "compute" else _tint(colour, 0.35)
    return _Box("pu", [(str(cpu), 11, state == "compute")], fill=fill, stroke=colour, stroke_width=1.2,
                attrs=attrs, title=f"{where}: {marks.names[index]} ({state})", ink=_ink(fill),
                size=size, radius=2)


class _Sizes(Record):
    """Sizes shared by the whole drawing, so that boxes alike are drawn alike: a logical
    CPU's (w, h), and a core's least width and whether cores show a label (not where every
    core has one CPU on a machine without E-cores: the CPU's number says it all)."""

    pu: tuple
    core_w: int
    core_labels: bool


def _core_label(core) -> str:
    return f"core {core.id}" + (" E" if core.efficiency else "")


def _core_box(topo, core, marks: _Marks, sizes: _Sizes) -> _Box:
    label = _core_label(core)
    pus = [_pu_box(topo, c, marks, sizes.pu, label) for c in core.cpus]
    holders = {marks.cpus[c][0] for c in core.cpus if c in marks.cpus}
    attrs = {"class": "core", "data-core": str(core.id), "data-cpus": cpulist.format(core.cpus)}
    fill, stroke, width = _FILL["core"], "#8a8a8a", 1.0
    if core.efficiency:
        fill = "#e6e6e6"
    if len(holders) == 1:
        (index,) = holders
        attrs["data-instance"] = str(index)
        colour = instance_colour(index)
        fill, stroke, width = _tint(colour, 0.28), colour, 2.0
    head = [(label, 9, False)] if sizes.core_labels else []
    return _Box("core", head, pus, fill=fill, stroke=stroke, stroke_width=width, pad=3 if head else 2, gap=3,
                cols=min(len(pus), 4), attrs=attrs, min_w=sizes.core_w if head else 0,
                title=label + (" (efficiency core)" if core.efficiency else "") + f": CPUs {cpulist.format(core.cpus)}")


def _item_boxes(topo, items, marks: _Marks, sizes: _Sizes) -> list:
    """Boxes of a node's or a cache's items; where cores stand beside cache boxes (a
    hybrid CPU's P-cores beside its E-core clusters), each run of cores in a grid of its
    own, so that the grid of the whole does not mix their sizes."""
    boxes = [_item_box(topo, i, marks, sizes) for i in items]
    if all(isinstance(i, CacheBox) for i in items) or not any(isinstance(i, CacheBox) for i in items):
        return boxes
    out: list = []
    for item, box in zip(items, boxes):
        if isinstance(item, CacheBox):
            out.append(box)
        elif out and out[-1].kind == "run":
            out[-1].kids.append(box)
        else:
            out.append(_Box("run", kids=[box], fill=None, stroke=None, pad=0, gap=5, ratio=2.2))
    return out


def _item_box(topo, item, marks: _Marks, sizes: _Sizes) -> _Box:
    if not isinstance(item, CacheBox):
        return _core_box(topo, item, marks, sizes)
    d = item.domain
    kids = _item_boxes(topo, item.items, marks, sizes)
    label = f"{d.kind}{cache_size_text(d.size_kb)}"
    if item.shared_with:
        label += f" (shared with node {cpulist.format(item.shared_with)})"
    kind = d.kind if d.kind in _FILL else "L2"
    cols = len(kids) if d.kind != "L3" and len(kids) <= 8 else None
    return _Box(kind, [(label, 10, False)], kids, fill=_FILL[kind], stroke="#9a9a9a", pad=5, gap=5, cols=cols,
                ratio=2.2, attrs={"class": "cache", "data-kind": d.kind, "data-cpus": cpulist.format(d.cpus)},
                title=f"{label}: CPUs {cpulist.format(d.cpus)}")


def _node_label(node_id, node) -> str:
    if node is None:
        return "no NUMA node"
    mem = gib_text(node.mem_total_kb) if node.has_memory else "no memory"
    return f"NUMA node {node_id} \u00b7 {mem}"


def _node_attrs(node_id, marks: _Marks) -> dict:
    attrs = {"class": "numa", "data-node": "" if node_id is None else str(node_id)}
    held = marks.mems.get(node_id, []) if node_id is not None else []
    if held:
        attrs["data-memory-of"] = cpulist.format(i for i, _ in held)
    return attrs


def _node_box(topo, part, marks: _Marks, sizes: _Sizes) -> _Box:
    kids = _item_boxes(topo, part.items, marks, sizes)
    chips = marks.mems.get(part.node_id, []) if part.node_id is not None else []
    attrs = _node_attrs(part.node_id, marks)
    return _Box("numa", [(_node_label(part.node_id, part.node), 11, True)], kids, fill=_FILL["numa"],
                stroke="#a08480", pad=6, gap=6, ratio=2.2, attrs=attrs, bar=_NODE_BAR, chips=chips,
                title=_node_label(part.node_id, part.node))


def _socket_box(topo, box, marks: _Marks, sizes: _Sizes) -> _Box:
    sock = box.socket
    label = f"Socket {sock.index}"
    if sock.package_id is None:
        label += " (no package id)"
    elif sock.package_id != sock.index:
        label += f" (package {sock.package_id})"
    kids = [_node_box(topo, part, marks, sizes) for part in box.nodes]
    return _Box("socket", [(label, 12, True)], kids, fill=_FILL["socket"], stroke="#5a5a5a", stroke_width=1.2,
                pad=7, gap=7, ratio=1.8, attrs={"class": "socket", "data-socket": str(sock.index)},
                title=f"{label}: CPUs {cpulist.format(sock.cpus)}")


def _memonly_box(node, marks: _Marks) -> _Box:
    label = f"node {node.id} \u00b7 {gib_text(node.mem_total_kb) if node.has_memory else 'no memory'}"
    return _Box("numa", [(label, 11, True)], fill=_FILL["memonly"], stroke="#a08480", pad=6,
                attrs=_node_attrs(node.id, marks), bar=_NODE_BAR, chips=marks.mems.get(node.id, []),
                title=f"NUMA node {node.id} (no CPUs): {label.split(' ', 2)[2]}")


def _caption(topo) -> list:
    nodes = len([n for n in topo.nodes.values() if n.cpus])
    line2 = (f"{len(topo.sockets)} socket(s) \u00b7 {nodes} NUMA node(s) with CPUs \u00b7 {len(topo.cores)} cores "
             f"\u00b7 {len(topo.online)} logical CPUs")
    line3 = f"allowed CPUs {cpulist.format(topo.allowed)} ({topo.allowed_source})"
    if topo.quota_cpus:
        line3 += f" \u00b7 CPU quota {topo.quota_cpus:g}"
    if topo.offline:
        line3 += f" \u00b7 offline CPUs {cpulist.format(topo.offline)}"
    return [(topo.model or "CPU", 15, True), (line2, 11, False), (line3, 11, False)]


def _machine(topo, marks: _Marks) -> _Box:
    digits = max((len(str(c)) for c in topo.online), default=1)
    sizes = _Sizes(pu=(max(24, _text_width("8" * digits, 11, True) + 10), 20),
                   core_w=max((_text_width(_core_label(c), 9) for c in topo.cores), default=0),
                   core_labels=topo.hybrid or any(len(c.cpus) > 1 for c in topo.cores))
    sockets = [_socket_box(topo, b, marks, sizes) for b in topology_boxes(topo)]
    kids = [_Box("grid", kids=sockets, fill=None, stroke=None, pad=0, gap=10, ratio=2.0)]
    kids[0].measure()
    mem_only = sorted((n for n in topo.nodes.values() if not n.cpus), key=lambda n: n.id)
    if mem_only:
        row = [_memonly_box(n, marks) for n in mem_only]
        kids.append(_fit(_Box("grid", [("memory-only NUMA nodes", 11, True)], row, fill=None, stroke=None, pad=0,
                              gap=6), kids[0].w))
    return _Box("machine", _caption(topo), kids, fill=_FILL["machine"], stroke="#3a3a3a", stroke_width=1.5,
                pad=10, gap=10, cols=1, attrs={"class": "machine"})


# --------------------------------------------------------------------------- the legend


def _legend(marks: _Marks, topo, width: int) -> Optional[_Box]:
    """The instances (a swatch of its colour and a line each), then the keys, each part
    in as many columns as fit ``width`` (px); None when there is nothing to explain."""
    keys = []
    states = {state for _, state in marks.cpus.values()}
    if marks.rows and any(c not in marks.cpus for c in topo.allowed & topo.online):
        keys.append(("idle", "#ffffff", "usable CPU in no instance"))
    if "helper" in states:
        keys.append(("helper", _tint(PALETTE[0], 0.35), "light tint: bound to the instance for helpers"))
    if marks.mems:
        keys.append(("mem", _NODE_BAR, "number in a NUMA node's bar: that instance's memory is bound there"))
    if any(c not in topo.allowed for c in topo.online):
        keys.append(("not-allowed", f"url(#{_HATCH})", "not allowed for this process (affinity mask / cgroup)"))
    if not marks.rows and not keys:
        return None
    parts = []
    if marks.rows:
        rows = [_legend_row(text, instance_colour(i), {"class": "legend", "data-instance": str(i)}, str(i))
                for i, text in marks.rows]
        parts.append(_fit(_Box("part", kids=rows, fill=None, stroke=None, pad=0, gap=4, col_gap=18), width - 20))
    if keys:
        rows = [_legend_row(text, fill, {"class": "legend-key", "data-key": key}, "") for key, fill, text in keys]
        parts.append(_fit(_Box("part", kids=rows, fill=None, stroke=None, pad=0, gap=4, col_gap=18), width - 20))
    head = [(f"plan: {len(marks.rows)} instance(s)" if marks.rows else "key", 12, True)]
    return _Box("legend", head, parts, fill="#ffffff", stroke="#b0b0b0", pad=8, gap=8, cols=1,
                attrs={"class": "legend-box"})


def _legend_row(text: str, fill: str, attrs: dict, number: str) -> _Box:
    swatch = _Box("swatch", [(number, 10, True)] if number else [], fill=fill, stroke="#6a6a6a",
                  size=(22, 16), attrs=attrs, ink=_ink(fill) if fill.startswith("#") else _TEXT, radius=2)
    label = _Box("label", [(text, 11, False)], fill=None, stroke=None, pad=0,
                 size=(_text_width(text, 11) + 4, 16))
    return _Box("row", kids=[swatch, label], fill=None, stroke=None, pad=0, gap=6, cols=2)


# --------------------------------------------------------------------------- drawing


def _draw(box: _Box, out: list) -> None:
    """``box`` and what it holds: a ``<g>`` with its attributes and tooltip around its
    rectangle, label and children."""
    group = bool(box.attrs or box.title)
    if group:
        out.append("<g" + "".join(f' {k}="{_xml(v)}"' for k, v in box.attrs.items()) + ">")
        if box.title:
            out.append(f"<title>{_xml(box.title)}</title>")
    if box.fill is not None or box.stroke is not None:
        out.append(f'<rect x="{box.x}" y="{box.y}" width="{box.w}" height="{box.h}" rx="{box.radius}" '
                   f'fill="{box.fill or "none"}" stroke="{box.stroke or "none"}" '
                   f'stroke-width="{box.stroke_width:g}"/>')
    if box.bar is not None:
        h = box.head_height() + box.pad - 1
        out.append(f'<rect x="{box.x + 1}" y="{box.y + 1}" width="{box.w - 2}" height="{h}" rx="{box.radius}" '
                   f'fill="{box.bar}"/>')
    _draw_head(box, out)
    for kid in box.kids:
        _draw(kid, out)
    if group:
        out.append("</g>")


def _draw_head(box: _Box, out: list) -> None:
    if not box.head:
        return
    if box.fixed is not None:  # a leaf: its one label centred (a legend's text: from the left)
        text, size, bold = box.head[0]
        centre = box.kind != "label"
        cx, cy = (box.x + box.w / 2 if centre else box.x), box.y + box.h / 2 + size * 0.36
        out.append(f'<text x="{cx:g}" y="{cy:g}" font-size="{size}"' + (' text-anchor="middle"' if centre else "")
                   + f' fill="{box.ink}"'
                   + (' font-weight="bold"' if bold else "") + f">{_xml(text)}</text>")
        return
    y = box.y + box.pad
    for n, (text, size, bold) in enumerate(box.head):
        y += math.ceil(size * 1.3)
        out.append(f'<text x="{box.x + box.pad}" y="{y - math.ceil(size * 0.3)}" font-size="{size}" fill="{box.ink}"'
                   + (' font-weight="bold"' if bold else "") + f">{_xml(text)}</text>")
        if n == 0 and box.chips:
            _draw_chips(box, y, size, out)


def _draw_chips(box: _Box, line_bottom: int, size: int, out: list) -> None:
    """The memory chips in a NUMA node's bar, right of its label: each instance bound
    there, its number on its colour (the first :data:`MAX_CHIPS` - 1 of more, then +N)."""
    x = box.x + box.pad + _text_width(box.head[0][0], size, box.head[0][2]) + 8
    top = line_bottom - math.ceil(size * 1.3) + 1
    height = math.ceil(size * 1.3) - 1
    node = box.attrs.get("data-node", "")
    shown, more = _chips(box.chips)
    for index, policy in shown:
        colour, w = instance_colour(index), _chip_width(str(index))
        out.append(f'<g class="mem" data-node="{node}" data-instance="{index}" data-policy="{_xml(policy)}">'
                   f"<title>memory of instance {index}: {_xml(policy)} on NUMA node {node}</title>"
                   f'<rect x="{x}" y="{top}" width="{w}" height="{height}" rx="6" fill="{colour}" '
                   f'stroke="#ffffff" stroke-width="1"/>'
                   f'<text x="{x + w / 2:g}" y="{top + size - 1}" font-size="9" font-weight="bold" '
                   f'text-anchor="middle" fill="{_ink(colour)}">{index}</text></g>')
        x += w + 3
    if more:
        out.append(f'<text x="{x + 2}" y="{top + size - 1}" font-size="9" font-weight="bold" fill="{_TEXT}">'
                   f"{more}</text>")


def plan_svg(topo, instances: Sequence[Any] = ()) -> str:
    """The machine, and the plan's instances on it, as an SVG document (text). Pure and
    deterministic: the same arguments give the same bytes.

    Args:
        topo: the machine (:class:`cpulaunch.machine.topology.Topology`); its logical CPU
            ids, cores, NUMA nodes, sockets, caches (where read) and ``allowed`` CPUs are
            drawn.
        instances: what runs, in any order: :class:`cpulaunch.render.RenderedInstance`
            (what ``--dry-run`` prints) or :class:`cpulaunch.plan.Instance`; each needs
            ``index`` (0-based, its colour), ``cpus`` (compute logical CPU ids) and
            ``mem_nodes`` (NUMA node ids), and may have ``bound_cpus`` (every CPU it is
            bound to: the rest are helpers), ``label`` ("rank 1") and ``mem_policy``.
            Empty: the machine alone (``--show-topology``).

    Returns:
        ``<?xml ...?><svg ...>...</svg>`` and a newline; its size in px is in ``width``
        and ``height``.
    """
    marks = _marks(instances)
    machine = _machine(topo, marks)
    machine.measure()
    legend = _legend(marks, topo, machine.w)
    page = _Box("page", kids=[machine] + ([legend] if legend else []), fill=None, stroke=None, pad=12, gap=12,
                cols=1)
    page.measure()
    page.place(0, 0)
    what = f"{len(marks.rows)} instance(s) planned on " if marks.rows else ""
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{page.w}" height="{page.h}" '
        f'viewBox="0 0 {page.w} {page.h}" font-family="{FONT}">',
        f"<title>{_xml(what + (topo.model or 'CPU'))}</title>",
        f'<defs><pattern id="{_HATCH}" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#e6e6e6"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#b5b5b5" stroke-width="3"/></pattern></defs>',
        f'<rect width="{page.w}" height="{page.h}" fill="#ffffff"/>',
    ]
    _draw(page, out)
    out.append("</svg>")
    return "\n".join(x for x in out if x) + "\n"
