"""``--format svg``: the picture of the machine and the plan (cpulaunch.svg, issue 32).

Structural checks read the SVG with xml.etree: which logical CPU is drawn in which
instance's colour, which NUMA node carries which instance's memory, which CPUs are greyed.
Then headless Chromium renders one, and the screenshot's pixels are counted (the PNG is
decoded here with zlib): it skips with one line where Chromium is missing (scripts/test.sh
installs it as root, so CI runs it).
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from xml.etree import ElementTree

import pytest

from cpulaunch.machine import probe
from cpulaunch.plan import Request, plan
from cpulaunch.svg import STATES, instance_colour, plan_svg

from conftest import MACHINES, REPO, run_cli

XEON = "hw-32intel64-2p8co2t+8ve"  # 2 sockets x 8 cores x 2 threads, nodes 0 and 1
AMD = "hw-32amd64-4s2n4c-cgroup2"  # 4 sockets, 8 nodes; the cgroup allows CPUs 0-5
ARM = "hw-128arm-2pa2n8cluster4co"
PPC = "hw-256ppc-8n8s4t"
NVIDIA = "hw-nvidiagpunumanodes"  # CPUs 88-103 outside the cgroup; memory-only nodes 250-255
SVG = "{http://www.w3.org/2000/svg}"


def _svg(sysroots, machine, *args) -> str:
    return run_cli("--sysroot", str(sysroots[machine]), *args, "--format", "svg",
                   *(["true"] if "--dry-run" in args else [])).stdout


def _tree(text: str) -> ElementTree.Element:
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<svg ') and text.endswith("</svg>\n")
    root = ElementTree.fromstring(text)
    assert root.tag == SVG + "svg"
    return root


def _groups(root, cls: str) -> list:
    return [g for g in root.iter(SVG + "g") if g.get("class") == cls]


def _rect(g) -> ElementTree.Element:
    return g.find(SVG + "rect")


def _cpus(root) -> dict:
    """{logical CPU: (data-state, data-instance or None, fill of its rectangle)}."""
    out = {}
    for g in _groups(root, "pu"):
        cpu = int(g.get("data-cpu"))
        assert cpu not in out, f"CPU {cpu} drawn twice"
        out[cpu] = (g.get("data-state"), g.get("data-instance"), _rect(g).get("fill"))
    return out


def _held(cpus: dict, state: str) -> dict:
    """{instance: CPUs in ``state``}."""
    out: dict = {}
    for cpu, (s, inst, _) in cpus.items():
        if s == state:
            out.setdefault(int(inst), set()).add(cpu)
    return out


# --------------------------------------------------------------------------- the plan on the Xeon


def test_two_instances_per_socket_on_the_xeon(sysroots):
    root = _tree(_svg(sysroots, XEON, "--instances-per-socket", "--dry-run"))
    cpus = _cpus(root)
    assert sorted(cpus) == list(range(32))
    # each instance's compute CPUs, in its own colour; the SMT siblings left idle
    assert _held(cpus, "compute") == {0: set(range(0, 8)), 1: set(range(8, 16))}
    assert {c for c, (s, _, _) in cpus.items() if s == "idle"} == set(range(16, 32))
    colours = {int(i): fill for s, i, fill in cpus.values() if s == "compute"}
    assert colours == {0: instance_colour(0), 1: instance_colour(1)} and colours[0] != colours[1]
    assert {fill for s, _, fill in cpus.values() if s == "idle"} == {"#ffffff"}
    # each core outlined in its instance's colour: cores 0-7 and 8-15
    cores = {int(g.get("data-core")): g.get("data-instance") for g in _groups(root, "core")}
    assert cores == {**{c: "0" for c in range(8)}, **{c: "1" for c in range(8, 16)}}
    assert {_rect(g).get("stroke") for g in _groups(root, "core") if g.get("data-instance") == "1"} == {
        instance_colour(1)}
    # memory: node 0 carries instance 0's chip, node 1 instance 1's
    chips = {(g.get("data-node"), g.get("data-instance"), g.get("data-policy")) for g in _groups(root, "mem")}
    assert chips == {("0", "0", "bind"), ("1", "1", "bind")}
    assert {g.get("data-node"): g.get("data-memory-of") for g in _groups(root, "numa")} == {"0": "0", "1": "1"}
    # lstopo's nesting: 2 sockets, each one NUMA node, one L3 of 8 cores of 2 CPUs
    sockets = _groups(root, "socket")
    assert [s.get("data-socket") for s in sockets] == ["0", "1"]
    for sock, node in zip(sockets, ("0", "1")):
        (numa,) = [g for g in sock.iter(SVG + "g") if g.get("class") == "numa"]
        assert numa.get("data-node") == node
        (l3,) = [g for g in numa.iter(SVG + "g") if g.get("class") == "cache"]
        assert l3.get("data-kind") == "L3"
        assert [len([p for p in c.iter(SVG + "g") if p.get("class") == "pu"])
                for c in l3.iter(SVG + "g") if c.get("class") == "core"] == [2] * 8
    # the legend names both instances in their colours
    legend = {g.get("data-instance"): (_rect(g).get("fill"), g) for g in _groups(root, "legend")}
    assert {k: v[0] for k, v in legend.items()} == {"0": instance_colour(0), "1": instance_colour(1)}
    texts = [t.text for t in root.iter(SVG + "text")]
    assert "instance 0: CPUs 0-7; memory bind on node 0" in texts
    assert "instance 1: CPUs 8-15; memory bind on node 1" in texts
    assert "Intel(R) Xeon(R) Silver 4108 CPU @ 1.80GHz" in texts and "L3 11 MiB" in texts


def test_ddp_ranks_and_helper_cpus(sysroots):
    root = _tree(run_cli("--sysroot", str(sysroots[XEON]), "--ddp", "--dry-run", "--format", "svg",
                         "python", "train.py").stdout)
    texts = [t.text for t in root.iter(SVG + "text")]
    assert "rank 0: CPUs 0-7; memory bind on node 0" in texts and "rank 1: CPUs 8-15; memory bind on node 1" in texts
    root = _tree(_svg(sysroots, XEON, "--instances-per-socket", "--dataloader-workers", "1", "--dry-run"))
    cpus = _cpus(root)
    assert _held(cpus, "compute") == {0: set(range(0, 7)), 1: set(range(8, 15))}
    assert _held(cpus, "helper") == {0: {7}, 1: {15}}
    assert cpus[7][2] != instance_colour(0) and cpus[7][2].startswith("#")  # a tint of it
    assert "instance 0: CPUs 0-6 (+ helpers 7); memory bind on node 0" in [t.text for t in root.iter(SVG + "text")]


def test_the_docs_picture_is_what_cpulaunch_draws(sysroots):
    # docs/reference/cli.md shows it (and README may): it must not drift from the code
    shown = (REPO / "docs" / "images" / "plan-xeon-per-socket.svg").read_text()
    assert shown == _svg(sysroots, XEON, "--instances-per-socket", "--dry-run"), (
        "redraw it: cpulaunch --sysroot DUMP --instances-per-socket --dry-run --format svg true "
        "> docs/images/plan-xeon-per-socket.svg (DUMP: the Xeon dump unpacked, docs/reference/cli.md)")


def test_svg_applies_to_dry_run_and_show_topology_only(sysroots):
    proc = run_cli("--sysroot", str(sysroots[XEON]), "--print-env", "--format", "svg", "true", check_rc=2)
    assert proc.stderr == ("cpulaunch: error: --format svg does not apply to --print-env: use shell, dotenv, json, "
                           "omp-bind, vllm, sglang\n")
    assert proc.stdout == "false\n"  # --print-env's failure: eval of it fails


# --------------------------------------------------------------------------- greyed CPUs


def test_cpus_outside_the_cgroup_are_greyed(sysroots):
    root = _tree(_svg(sysroots, AMD, "--show-topology"))
    cpus = _cpus(root)
    assert {c for c, (s, _, _) in cpus.items() if s == "not-allowed"} == set(range(6, 32))
    assert {c for c, (s, _, _) in cpus.items() if s == "free"} == set(range(0, 6))
    assert {fill for s, _, fill in cpus.values() if s == "not-allowed"} == {"url(#notallowed)"}
    assert root.find(f"{SVG}defs/{SVG}pattern[@id='notallowed']") is not None
    assert not _groups(root, "mem") and not _groups(root, "legend")
    assert [g.get("data-key") for g in _groups(root, "legend-key")] == ["not-allowed"]
    # the plan takes the allowed CPUs only, and the greyed ones stay grey
    cpus = _cpus(_tree(_svg(sysroots, AMD, "--dry-run")))
    assert _held(cpus, "compute") == {0: set(range(6))}
    assert {c for c, (s, _, _) in cpus.items() if s == "not-allowed"} == set(range(6, 32))


def test_memory_only_nodes_and_a_second_socket_outside_the_cgroup(sysroots):
    root = _tree(_svg(sysroots, NVIDIA, "--show-topology"))
    cpus = _cpus(root)
    assert {c for c, (s, _, _) in cpus.items() if s == "not-allowed"} == set(range(88, 104))
    nodes = [g.get("data-node") for g in _groups(root, "numa")]
    assert nodes == ["0", "8", "250", "251", "252", "253", "254", "255"]


def test_core_list_leaves_the_other_cpus_usable_not_greyed(sysroots):
    # --core-list chooses CPUs for the plan; the others stay usable by this process, so
    # they are drawn idle (white), not greyed like the CPUs the cgroup forbids.
    cpus = _cpus(_tree(_svg(sysroots, XEON, "--core-list", "0-3,8-11", "--instances-per-socket", "--dry-run")))
    assert _held(cpus, "compute") == {0: {0, 1, 2, 3}, 1: {8, 9, 10, 11}}
    assert {c for c, (s, _, _) in cpus.items() if s == "idle"} == set(range(32)) - {0, 1, 2, 3, 8, 9, 10, 11}


# --------------------------------------------------------------------------- every machine


@pytest.mark.parametrize("machine", MACHINES)
def test_every_machine_draws_each_cpu_once_at_a_sensible_size(sysroots, machine):
    topo = probe.probe(str(sysroots[machine]), caches=True)
    result = plan(topo, Request(instances_per_node=1))
    text = plan_svg(topo, result.instances)
    assert plan_svg(topo, result.instances) == text  # deterministic
    root = _tree(text)
    cpus = _cpus(root)
    assert set(cpus) == set(topo.online)
    assert {state for state, _, _ in cpus.values()} <= set(STATES)
    assert sorted(int(g.get("data-core")) for g in _groups(root, "core")) == [c.id for c in topo.cores]
    for inst in result.instances:  # plan.Instance works as well as the rendered one
        assert _held(cpus, "compute")[inst.index] == set(inst.cpus)
        assert {g.get("data-node") for g in _groups(root, "mem") if g.get("data-instance") == str(inst.index)} \
            == {str(n) for n in inst.mem_nodes}
    width, height = int(root.get("width")), int(root.get("height"))
    assert root.get("viewBox") == f"0 0 {width} {height}"
    assert 300 <= width <= 1600 and 150 <= height <= 1300, (width, height)
    for rect in root.iter(SVG + "rect"):  # every box inside the page
        x, y = int(rect.get("x", 0)), int(rect.get("y", 0))
        assert 0 <= x and x + int(rect.get("width")) <= width and 0 <= y and y + int(rect.get("height")) <= height


def test_boxes_nest_inside_their_parents(sysroots):
    root = _tree(_svg(sysroots, ARM, "--latency-mode", "--dry-run"))

    def box(g):
        r = _rect(g)
        return int(r.get("x")), int(r.get("y")), int(r.get("x")) + int(r.get("width")), \
            int(r.get("y")) + int(r.get("height"))

    def check(g, outer):
        inner = box(g) if _rect(g) is not None else outer
        assert outer[0] <= inner[0] and outer[1] <= inner[1] and inner[2] <= outer[2] and inner[3] <= outer[3]
        for kid in g.findall(SVG + "g"):
            check(kid, inner)

    (machine,) = _groups(root, "machine")
    check(machine, box(machine))
    assert len(_groups(root, "legend")) == 32
    chips = _groups(root, "mem")
    assert len(chips) == 32 and {g.get("data-node") for g in chips} == {"0", "1", "2", "3"}


def test_many_instances_on_one_node_are_counted_in_its_bar(sysroots):
    topo = probe.probe(str(sysroots[PPC]), caches=True)
    result = plan(topo, Request(ncores_per_instance=1, node_list=frozenset({0})))
    assert len(result.instances) == 8
    root = _tree(plan_svg(topo, [i._replace(index=n) for n, i in enumerate(result.instances)]
                          + [i._replace(index=n + 8) for n, i in enumerate(result.instances)]))
    (node0,) = [g for g in _groups(root, "numa") if g.get("data-node") == "0"]
    assert node0.get("data-memory-of") == "0-15"
    assert len([g for g in _groups(root, "mem") if g.get("data-node") == "0"]) == 7
    assert "+9" in [t.text for t in node0.iter(SVG + "text")]


def test_text_from_the_machine_is_escaped(sysroots):
    topo = probe.probe(str(sysroots[XEON]))
    root = _tree(plan_svg(topo._replace(model='<b>"x" & y</b>\x01\udcff')))
    assert '<b>"x" & y</b>\\x01\ufffd' in [t.text for t in root.iter(SVG + "text")]


# --------------------------------------------------------------------------- rendered by a browser


def _png_pixels(data: bytes) -> tuple:
    """(width, height, rows of (r, g, b) tuples) of an 8-bit RGB or RGBA, non-interlaced PNG
    (what Chromium's --screenshot writes), decoded with zlib and the PNG filters."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, head = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = head
    assert depth == 8 and colour in (2, 6) and interlace == 0, head
    bpp = 3 if colour == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x:x + 3]) for x in range(0, stride, bpp)])
        prev = line
    return width, height, rows


def test_the_decoder_reads_every_filter():
    def png(width, rows_with_filters, colour=2):
        raw = b"".join(bytes([f]) + bytes(r) for f, r in rows_with_filters)
        chunk = lambda k, b: struct.pack(">I", len(b)) + k + b + struct.pack(">I", zlib.crc32(k + b))  # noqa: E731
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, len(rows_with_filters), 8,
                                                                  colour, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))

    # two pixels per row: (10,20,30) (40,50,60), then each filter's encoding of the row above + 1
    rows = [(0, [10, 20, 30, 40, 50, 60]), (1, [11, 21, 31, 30, 30, 30]), (2, [1, 1, 1, 1, 1, 1]),
            (3, [7, 12, 17, 16, 16, 16]), (4, [1, 1, 1, 1, 1, 1])]
    w, h, pixels = _png_pixels(png(2, rows))
    assert (w, h) == (2, 5)
    assert pixels == [[(10, 20, 30), (40, 50, 60)], [(11, 21, 31), (41, 51, 61)], [(12, 22, 32), (42, 52, 62)],
                      [(13, 23, 33), (43, 53, 63)], [(14, 24, 34), (44, 54, 64)]]
    # RGBA: the alpha byte is skipped, and counts as a byte for the filters
    assert _png_pixels(png(2, [(1, [1, 2, 3, 255, 1, 1, 1, 0])], colour=6))[2] == [[(1, 2, 3), (2, 3, 4)]]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_chromium_draws_the_xeon_plan(sysroots, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium not installed (apt-get install chromium)")
    text = _svg(sysroots, XEON, "--instances-per-socket", "--dry-run")
    page = tmp_path / "plan.svg"
    page.write_text(text)
    width, height = (int(v) for v in re.search(r'width="(\d+)" height="(\d+)"', text).groups())
    shot = tmp_path / "plan.png"
    profile = tmp_path / "profile"
    profile.mkdir()
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                           f"--user-data-dir={profile}", f"--screenshot={shot}", f"--window-size={width},{height}",
                           page.as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    w, h, rows = _png_pixels(shot.read_bytes())
    assert (w, h) == (width, height)
    pixels = [p for row in rows for p in row]
    counts: dict = {}
    for p in pixels:
        counts[p] = counts.get(p, 0) + 1
    white = counts.get((255, 255, 255), 0)
    assert 0.05 < 1 - white / len(pixels) < 0.95  # drawn, and not a black or grey page
    assert len(counts) > 50  # boxes, text, anti-aliased edges
    # both instances' colours fill their CPUs' boxes on screen: 8 boxes of about 20x26 px each
    for index in (0, 1):
        colour = tuple(int(instance_colour(index)[i:i + 2], 16) for i in (1, 3, 5))
        assert counts.get(colour, 0) > 8 * 200, (index, counts.get(colour, 0))
