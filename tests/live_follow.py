"""Run inside a live guest (cgroup v2, 8 CPUs): ``--follow-cpuset`` when a cpuset of 8 CPUs
shrinks to 4 under two instances, beside the same job without it (the kernel's own doing).

``python3 -S live_follow.py OUT.json``: two cgroup v2 children of the root, each with CPUs
0-7 and every memory node; in each a ``cpulaunch --ninstances 2`` job (one with
``--follow-cpuset``) whose instances run 4 threads each until a stop file appears. Once
every instance runs its threads, both cpusets are written ``0-3`` at once; then it polls
(every 10 ms) until the followed job's instances are on two halves of 0-3, records how long
that took from the write, every instance's thread CPUs in both jobs, ``cpulaunch verify``
of the followed job, both jobs' stderr and the followed job's result.json, and stops them.
Not collected by pytest; tests/test_live_follow.py boots the guest and reads OUT.json.
"""

import json
import os
import subprocess
import sys
import time

CGROUP = "/sys/fs/cgroup"
PY = sys.executable
PROGRAM = ("import os, sys, threading, time\n"
           "event = threading.Event()\n"
           "for _ in range(3): threading.Thread(target=event.wait, daemon=True).start()\n"
           "while not os.path.exists(sys.argv[1]): time.sleep(0.1)\n")


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def thread_cpus(pid):
    """{tid: Cpus_allowed_list} of process ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("Cpus_allowed_list:"):
                        out[tid] = line.split(":", 1)[1].strip()
        except OSError:
            pass
    return out


def instances(launcher):
    """{instance index: pid} of the launcher's children carrying CPULAUNCH_INSTANCE_INDEX
    that run 4 threads."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            if stat[stat.rfind(")") + 2:].split()[1] != str(launcher):
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        index = [e.split(b"=", 1)[1] for e in env if e.startswith(b"CPULAUNCH_INSTANCE_INDEX=")]
        if index and len(thread_cpus(int(entry))) == 4:
            found[int(index[0])] = int(entry)
    return found


def start(name, follow, work):
    folder = f"{CGROUP}/cpulaunch-{name}"
    os.makedirs(folder, exist_ok=True)
    write(f"{folder}/cpuset.cpus", "0-7")
    write(f"{folder}/cpuset.mems", "0-3")
    stop = os.path.join(work, f"stop-{name}")
    err = open(os.path.join(work, f"stderr-{name}.txt"), "w")

    def enter():
        write(f"{folder}/cgroup.procs", str(os.getpid()))

    argv = [PY, "-S", "-m", "cpulaunch", *(["--follow-cpuset"] if follow else []), "--ninstances", "2",
            "--allocator", "default", "--omp-runtime", "gnu", "--log-dir", os.path.join(work, f"logs-{name}"),
            PY, "-S", "-c", PROGRAM, stop]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=enter)
    err.close()
    return {"name": name, "folder": folder, "proc": proc, "stop": stop}


def main(out_path):
    work = os.path.dirname(os.path.abspath(out_path))
    write(f"{CGROUP}/cgroup.subtree_control", "+cpuset")
    jobs = [start("follow", True, work), start("nofollow", False, work)]
    result = {}
    try:
        deadline = time.monotonic() + 600
        for job in jobs:
            while len(instances(job["proc"].pid)) < 2:
                assert time.monotonic() < deadline, f"{job['name']}: instances did not start"
                assert job["proc"].poll() is None, f"{job['name']}: launcher exited {job['proc'].returncode}"
                time.sleep(0.2)
            job["pids"] = instances(job["proc"].pid)
            result[f"{job['name']}_before"] = {i: sorted(set(thread_cpus(p).values())) for i, p in job["pids"].items()}
        t0 = time.monotonic()
        for job in jobs:
            write(f"{job['folder']}/cpuset.cpus", "0-3")
        wrote = time.monotonic() - t0
        follow, nofollow = jobs
        want = {0: ["0-1"], 1: ["2-3"]}
        seen = None
        while time.monotonic() - t0 < 120:
            now = {i: sorted(set(thread_cpus(p).values())) for i, p in follow["pids"].items()}
            if now == want:
                seen = time.monotonic() - t0
                break
            time.sleep(0.01)
        result["repinned_after_s"] = seen
        result["writes_took_s"] = wrote
        result["follow_after"] = {i: sorted(set(thread_cpus(p).values())) for i, p in follow["pids"].items()}
        result["nofollow_after"] = {i: sorted(set(thread_cpus(p).values())) for i, p in nofollow["pids"].items()}
        verify = subprocess.run([PY, "-S", "-m", "cpulaunch", "verify", "--format", "json",
                                 *map(str, follow["pids"].values())], capture_output=True, text=True, timeout=600)
        result["verify_rc"] = verify.returncode
        result["verify"] = json.loads(verify.stdout) if verify.stdout.strip() else verify.stderr
    finally:
        for job in jobs:
            open(job["stop"], "w").close()
        for job in jobs:
            try:
                job["proc"].wait(timeout=300)
            except subprocess.TimeoutExpired:
                job["proc"].kill()
                job["proc"].wait()
            result[f"{job['name']}_rc"] = job["proc"].returncode
            with open(os.path.join(work, f"stderr-{job['name']}.txt")) as f:
                result[f"{job['name']}_stderr"] = f.read()
        for name in ("follow",):
            folder = os.path.join(work, f"logs-{name}")
            runs = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
            if runs:
                with open(os.path.join(folder, runs[-1], "result.json")) as f:
                    result[f"{name}_result"] = json.load(f)
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)
        for job in jobs:
            try:
                os.rmdir(job["folder"])
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
