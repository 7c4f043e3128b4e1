"""Write every user-visible output of cpulaunch on every fixture machine to a folder, so that
two checkouts (before and after a restructuring) can be compared byte for byte.

    python scripts/snapshot_outputs.py OUT            # this checkout's cpulaunch
    git worktree add /tmp/old REV                      # the checkout to compare with
    python scripts/snapshot_outputs.py --repo /tmp/old /tmp/before
    python scripts/snapshot_outputs.py /tmp/after && diff -r /tmp/before /tmp/after

Each case runs ``python -m cpulaunch ARGS`` from the checkout holding this script (or the
one ``--repo`` names), as a real process, and writes ``OUT/<machine>/<case>.out`` holding the exit code, stdout and
stderr. Machines: the hwloc dumps in tests/fixtures (unpacked once into ``OUT/../roots``
unless ``--roots DIR``), the generated trees of tests/bigtree.py, and this machine (``/``).
The unpacked root's path is replaced by ``<ROOT>``, the checkout's by ``<REPO>`` so that two runs compare equal, and on
this machine the NUMA node's memory size (which a VM's memory hot-plug changes) by ``N``.

Cases: --show-topology (text, json, svg); --dry-run (text, json, svg) under each placement, memory,
binding, library, budget and DDP option; --print-env in every format; doctor (text, json);
and user errors whose one line and exit code must not change. ``--master-port`` is fixed
for DDP (a free port would differ between runs).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

PLACEMENT = [
    [],
    ["--instances-per-socket"],
    ["--instances-per-socket", "2"],
    ["--instances-per-node"],
    ["--ninstances", "3"],
    ["--ncores-per-instance", "2"],
    ["--latency-mode"],
    ["--throughput-mode"],
    ["--use-logical-cores"],
    ["--use-e-cores"],
    ["--node-list", "0"],
    ["--instance-idx", "0"],
    ["--ninstances", "2", "--ncores-per-instance", "1"],
    ["--dataloader-workers", "1"],
    ["--reserve-cores", "1", "--instances-per-socket"],
    ["--mem-policy", "interleave"],
    ["--mem-policy", "preferred", "--instances-per-node"],
    ["--mem-policy", "local"],
    ["--mem-policy", "none"],
    ["--bind", "affinity"],
    ["--bind", "none"],
    ["--omp-places"],
    ["--override-env"],
    ["--inference-path", "onednn-graph"],
    ["--allocator", "jemalloc"],
    ["--allocator", "default"],
    ["--omp-runtime", "intel", "--kmp-blocktime", "5"],
    ["--ddp", "--master-port", "29500"],
    ["--ddp", "--nproc-per-node", "node", "--master-port", "29500"],
    ["--ddp", "--backend", "gloo", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
     "--master-port", "29500"],
    ["--ddp", "--backend", "ccl", "--master-port", "29500"],
    ["--ddp", "--nnodes", "1:2", "--rdzv-endpoint", "10.0.0.1:29400", "--rdzv-id", "job"],
    # issue 33: the platform's recipe forced, and off, with the options it yields to
    ["--recipe", "amd-zen", "--allocator", "jemalloc", "--omp-runtime", "intel"],
    ["--recipe", "generic", "--omp-wait-policy", "active", "--zendnn-matmul-algo", "5"],
]
#: Generated trees: name -> (sockets, nodes per socket, cores per node, threads, offline CPUs).
GENERATED = {
    "gen-2s-snc2-smt2": (2, 2, 4, 2, ()),
    "gen-4s-1n-8c-offline": (4, 1, 8, 1, (5, 17)),
}
PRINT_ENV = ["shell", "dotenv", "json", "omp-bind", "vllm", "sglang"]
ERRORS = [
    ["--ninstances", "100000", "--dry-run", "true"],
    ["--core-list", "0-999999", "--dry-run", "true"],
    ["--node-list", "77", "--dry-run", "true"],
    ["--ninstances", "0", "--dry-run", "true"],
    ["--format", "vllm", "--dry-run", "true"],
    ["--bogus-option", "true"],
    # where options meet: lists of sizes, --ddp with modes, values from variables
    ["--ncores-per-instance", "1,1", "--dry-run", "true"],
    ["--ddp", "--instances-per-l3", "--dry-run", "python", "x.py"],
    ["--ddp", "--nproc-per-node", "400", "--dry-run", "python", "x.py"],
    ["--ninstances", "2", "--instances-per-socket", "--dry-run", "true"],
    ["--print-env", "--log-dir", "logs"],
    ["--dry-run", "--kmp-blocktime", "5", "true"],
]


def cases() -> list:
    """(case name, argv after ``cpulaunch --sysroot ROOT``) for one machine."""
    out = [("topology", ["--show-topology"]), ("topology-json", ["--show-topology", "--format", "json"]),
           ("topology-svg", ["--show-topology", "--format", "svg"])]
    for i, extra in enumerate(PLACEMENT):
        out.append((f"dry{i:02d}", ["--dry-run", *extra, "python", "x.py", "--arg"]))
        out.append((f"dry{i:02d}-json", ["--dry-run", "--format", "json", *extra, "true"]))
        out.append((f"dry{i:02d}-svg", ["--dry-run", "--format", "svg", *extra, "true"]))
    for fmt in PRINT_ENV:
        out.append((f"env-{fmt}", ["--print-env", "--format", fmt, "--ninstances", "2"]))
        out.append((f"env-{fmt}-idx1", ["--print-env", "--format", fmt, "--ninstances", "2",
                                        "--instance-idx", "1"]))
    for i, args in enumerate(ERRORS):
        out.append((f"error{i}", args))
    return out


def unpack(roots: Path) -> dict:
    """{machine: root} for every dump in tests/fixtures, unpacked below ``roots`` once."""
    machines = {}
    for folder in sorted((REPO / "tests" / "fixtures").glob("hw-*")):
        (tarball,) = folder.glob("*.tar.bz2")
        dest = roots / folder.name
        if not dest.is_dir():
            dest.mkdir(parents=True)
            subprocess.run(["tar", "-xjf", str(tarball), "-C", str(dest), "--no-same-owner"], check=True)
        (top,) = list(dest.iterdir())
        machines[folder.name] = top
    import bigtree

    for name, (s, n, c, t, offline) in GENERATED.items():
        dest = roots / name
        if not dest.is_dir():
            bigtree.make_tree(dest, sockets=s, nodes_per_socket=n, cores_per_node=c,
                              threads_per_core=t, offline=offline)
        machines[name] = dest
    return machines


def run_case(repo: Path, root: Path, argv: list, subcommand: bool = False) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPULAUNCH_", "OMP_", "KMP_"))
           and k not in ("LD_PRELOAD", "MALLOC_CONF")}
    full = argv if subcommand else (["--sysroot", str(root)] + argv if str(root) != "/" else argv)
    env["PYTHONPATH"] = str(repo)
    proc = subprocess.run([sys.executable, "-m", "cpulaunch", *full], capture_output=True, cwd=repo,
                          env=env, timeout=120)
    text = (f"exit {proc.returncode}\n--- stdout\n" + proc.stdout.decode("utf-8", "replace")
            + "--- stderr\n" + proc.stderr.decode("utf-8", "replace")).replace(sys.prefix, "<VENV>").replace(str(repo), "<REPO>")
    if str(root) != "/":
        return text.replace(str(root), "<ROOT>")
    # this machine's NUMA node memory changes as the VM's memory is plugged in and out
    text = re.sub(r'"mem_total_kb": [0-9]+', '"mem_total_kb": N', text)
    return re.sub(r"[0-9]+\.[0-9] GiB", "N GiB", text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--roots", type=Path, default=None, help="where the dumps are unpacked")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repo", type=Path, default=REPO, help="the checkout whose cpulaunch runs")
    args = ap.parse_args(argv)
    roots = args.roots or args.out.resolve().parent / "snapshot-roots"
    machines = unpack(roots)
    machines["live"] = Path("/")
    if args.out.exists():
        shutil.rmtree(args.out)
    jobs = []
    for name, root in machines.items():
        (args.out / name).mkdir(parents=True)
        for case, case_argv in cases():
            jobs.append((args.out / name / f"{case}.out", root, case_argv, False))
        sysroot = [] if name == "live" else ["--sysroot", str(root)]
        for fmt in ("text", "json"):
            jobs.append((args.out / name / f"doctor-{fmt}.out", root,
                         ["doctor", *sysroot, "--format", fmt], True))
    with ThreadPoolExecutor(args.jobs) as pool:
        texts = pool.map(lambda j: run_case(args.repo.resolve(), j[1], j[2], j[3]), jobs)
        for (path, *_), text in zip(jobs, texts):
            path.write_text(text)
    print(f"{len(jobs)} outputs of {len(machines)} machines in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
