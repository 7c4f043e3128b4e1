"""What one launched instance really got, inside a live guest: one JSON line.

``python3 -S live_probe.py MB [--hold DIR] [--plant INDEX:NODE]``: maps MB MiB of anonymous memory, writes one
byte per page (first touch: each page is allocated now, under this process's memory
policy and on the CPU it runs on), then prints

- ``index``, ``omp``: CPULAUNCH_INSTANCE_INDEX and OMP_NUM_THREADS as given;
- ``env``: every CPULAUNCH_* variable;
- ``affinity``: os.sched_getaffinity(0), sorted logical CPU ids;
- ``cpus_allowed``, ``mems_allowed``: Cpus_allowed_list and Mems_allowed_list of
  /proc/self/status (the second is what the cgroup cpuset and numactl leave);
- ``policy``: the policy column of /proc/self/numa_maps for the touched region
  (``bind:0``, ``interleave:0-1``, ``prefer:1``, ``default``);
- ``pages``: {node id: pages of the region on that node} from its ``N<node>=`` fields;
- ``numa_maps``: that line of /proc/self/numa_maps as the kernel wrote it;
- ``pid``, ``cpu`` (the CPU it last ran on, /proc/self/stat field 39).

``--hold DIR``: after printing, create DIR/ready-PID and wait (at most 600 s) until
DIR/release exists, so that another process can inspect this one while it lives.
``--plant INDEX:NODE``: the instance whose CPULAUNCH_INSTANCE_INDEX is INDEX first binds
its own memory to NODE (set_mempolicy(MPOL_BIND)): pages on the wrong node on purpose,
for ``cpulaunch verify`` to find.
Standard library only; no torch (an import costs about a minute under emulation).
"""

import ctypes
import json
import mmap
import os
import sys
import time

PAGE = mmap.PAGESIZE
SYS_SET_MEMPOLICY = 238  # x86_64
MPOL_BIND = 2


def status_field(text, key):
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    return None


def region_numa(addr):
    """(policy, {node: pages}, the numa_maps line) of the mapping holding ``addr``."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split(" ", 1)[0].split("-"))
            if lo <= addr < hi:
                start = lo
                break
        else:
            raise SystemExit(f"live_probe: address {addr:#x} not in /proc/self/maps")
    with open("/proc/self/numa_maps") as f:
        for line in f:
            fields = line.split()
            if int(fields[0], 16) == start:
                pages = {int(k[1:]): int(v) for k, v in (x.split("=", 1) for x in fields[2:] if "=" in x)
                         if k[:1] == "N" and k[1:].isdigit()}
                return fields[1], pages, line.strip()
    raise SystemExit(f"live_probe: mapping at {start:#x} not in /proc/self/numa_maps")


def plant(node):
    """Bind this process's future allocations to ``node`` (set_mempolicy, MPOL_BIND)."""
    libc = ctypes.CDLL(None, use_errno=True)
    mask = ctypes.c_ulong(1 << node)
    if libc.syscall(SYS_SET_MEMPOLICY, MPOL_BIND, ctypes.byref(mask), 64) != 0:
        raise SystemExit(f"live_probe: set_mempolicy(MPOL_BIND, {node}): {os.strerror(ctypes.get_errno())}")


def main(argv):
    opts = dict(zip(argv[2::2], argv[3::2]))
    env = os.environ
    if "--plant" in opts:
        index, node = opts["--plant"].split(":")
        if env.get("CPULAUNCH_INSTANCE_INDEX") == index:
            plant(int(node))
    size = int(argv[1]) << 20
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for off in range(0, size, PAGE):
        region[off] = 1
    addr = ctypes.addressof(ctypes.c_char.from_buffer(region))
    policy, pages, line = region_numa(addr)
    with open("/proc/self/status") as f:
        status = f.read()
    with open("/proc/self/stat") as f:
        cpu = int(f.read().rsplit(")", 1)[1].split()[36])
    print(json.dumps({
        "index": env.get("CPULAUNCH_INSTANCE_INDEX"), "omp": env.get("OMP_NUM_THREADS"),
        "env": {k: v for k, v in sorted(env.items()) if k.startswith("CPULAUNCH_")},
        "affinity": sorted(os.sched_getaffinity(0)),
        "cpus_allowed": status_field(status, "Cpus_allowed_list"),
        "mems_allowed": status_field(status, "Mems_allowed_list"),
        "policy": policy, "pages": pages, "numa_maps": line, "mb": int(argv[1]),
        "pid": os.getpid(), "cpu": cpu,
    }), flush=True)
    if "--hold" in opts:
        hold(opts["--hold"])
    return 0


def hold(folder):
    """Announce readiness, then wait for the release file (bounded)."""
    open(os.path.join(folder, f"ready-{os.getpid()}"), "w").close()
    deadline = time.monotonic() + 600
    while not os.path.exists(os.path.join(folder, "release")):
        if time.monotonic() > deadline:
            raise SystemExit("live_probe: not released within 600 s")
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
