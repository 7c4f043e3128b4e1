"""Runs inside a live guest (tests/liveguest.py): the steps of one job, and sysfs dumps.

Standard library only, started as ``python3 -S live_agent.py ...`` (no site: every
import is paid 20-50x under emulation).

``live_agent.py run JOB RESULTS``: JOB is a JSON file ``{"env": {...}, "cwd": DIR,
"steps": [STEP, ...]}``; each STEP is one of

- ``{"id": ID, "argv": [...], "env": {...}, "timeout": S, "cgroup": DIR, "group": G}``:
  run argv (no shell) with the job's env plus the step's, stdin from /dev/null, in the
  cgroup v2 folder DIR when given (the child moves itself there before exec), killed
  with its process group after S seconds. Consecutive steps with the same ``group`` run
  at the same time.
- ``{"id": ID, "write": PATH, "text": TEXT}``: write TEXT to PATH (a sysfs or cgroup file).
- ``{"id": ID, "mkdir": PATH}``: create the folder PATH (a cgroup).

RESULTS is written when the job begins (the host's sign that the guest has booted) and
rewritten after every step (so a guest that times out still tells what it did): ``{"steps": {ID: {"rc", "stdout", "stderr", "seconds", "timed_out"}}, "done": bool,
"uptime": S}`` (S: the guest's uptime when the job started, i.e. its boot time).
``rc`` is the exit code, ``-N`` for signal N, or an errno for write/mkdir steps.

``live_agent.py when-ready DIR N CMD...``: see :func:`when_ready` (inspect held instances).

``live_agent.py dump FILE``: what cpulaunch's probe reads of this machine (sysfs CPU
and node folders, this process's cgroup folders, /proc/self/status|cgroup|mounts,
/proc/cpuinfo, /proc/meminfo) as one JSON object {path below /: text} in FILE (one write:
each file written over the shared folder costs a round trip); liveguest.pack_dump lays
it out like the hwloc dumps in tests/fixtures. Only regular files are copied, no
symlinks; a file the kernel refuses to read is left out. /proc/self/mounts keeps its cgroup lines only
(the others name host folders shared into the guest).
"""

import json
import os
import signal
import subprocess
import sys
import time

CPU = "/sys/devices/system/cpu"
NODE = "/sys/devices/system/node"
CGROUP = "/sys/fs/cgroup"
#: Per-CPU folders copied from cpuN/ (the rest is power management and hotplug state).
CPU_PARTS = ("topology", "cache", "cpufreq")
CPU_FILES = ("online",)
NODE_FILES = ("cpulist", "cpumap", "distance", "meminfo", "numastat")
CGROUP_FILES = ("cgroup.controllers", "cgroup.subtree_control", "cpuset.cpus",
                "cpuset.cpus.effective", "cpuset.mems", "cpuset.mems.effective", "cpu.max")
PROC_FILES = ("/proc/self/status", "/proc/self/cgroup", "/proc/cpuinfo", "/proc/meminfo")
MAX_OUTPUT = 4 << 20


def read_text(path):
    """The file's text, or None when it is missing or the kernel refuses the read."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_OUTPUT).decode("utf-8", "replace")
    except OSError:
        return None


def copy_file(src, files, text=None):
    """Add the regular file ``src`` (or ``text`` as its content) to ``files``."""
    if text is None:
        if os.path.islink(src) or not os.path.isfile(src):
            return
        text = read_text(src)
        if text is None:
            return
    files[src.lstrip("/")] = text


def copy_tree(src, files):
    """Add every regular file below ``src`` (symlinks are not followed)."""
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        for name in filenames:
            copy_file(os.path.join(dirpath, name), files)


def numbered(folder, prefix):
    return sorted(n for n in os.listdir(folder) if n.startswith(prefix) and n[len(prefix):].isdigit())


def dump():
    """{path below /: text} of this machine's topology files (see the module docstring)."""
    files = {}
    for name in os.listdir(CPU):
        copy_file(f"{CPU}/{name}", files)
    for cpu in numbered(CPU, "cpu"):
        for part in CPU_PARTS:
            copy_tree(f"{CPU}/{cpu}/{part}", files)
        for name in CPU_FILES:
            copy_file(f"{CPU}/{cpu}/{name}", files)
    for name in os.listdir(NODE):
        copy_file(f"{NODE}/{name}", files)
    for node in numbered(NODE, "node"):
        for name in NODE_FILES:
            copy_file(f"{NODE}/{node}/{name}", files)
    own = (read_text("/proc/self/cgroup") or "0::/").strip().split("::", 1)[-1]
    parts = [p for p in own.split("/") if p]
    for depth in range(len(parts) + 1):
        folder = "/".join([CGROUP] + parts[:depth])
        for name in CGROUP_FILES:
            copy_file(f"{folder}/{name}", files)
    for path in PROC_FILES:
        copy_file(path, files)
    mounts = read_text("/proc/self/mounts") or ""
    kept = [line for line in mounts.splitlines() if line.split(" ")[2:3] in (["cgroup"], ["cgroup2"])]
    copy_file("/proc/self/mounts", files, "".join(line + "\n" for line in kept))
    return files


def enter_cgroup(folder):
    """A preexec function: move the child into the cgroup v2 ``folder`` before exec."""
    def move():
        with open(os.path.join(folder, "cgroup.procs"), "w") as f:
            f.write("0")
    return move


def start(step, job_env, cwd):
    """Popen of a run step; stdout/stderr go to memfds read back by :func:`finish`."""
    env = dict(job_env)
    env.update(step.get("env") or {})
    out, err = os.memfd_create("out"), os.memfd_create("err")
    cg = step.get("cgroup")
    proc = subprocess.Popen(
        step["argv"], env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
        start_new_session=True,
        preexec_fn=enter_cgroup(cg) if cg else None)  # noqa: PLW1509 (the agent has no threads)
    return proc, out, err, time.monotonic()


def read_fd(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    data = os.read(fd, MAX_OUTPUT)
    os.close(fd)
    return data.decode("utf-8", "replace")


def finish(started, deadline):
    """Wait for a started step until ``deadline`` (monotonic), kill its group after."""
    proc, out, err, t0 = started
    timed_out = False
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return {"rc": proc.returncode, "stdout": read_fd(out), "stderr": read_fd(err),
            "seconds": round(time.monotonic() - t0, 2), "timed_out": timed_out}


def run_group(steps, job_env, cwd):
    """Run the run steps ``steps`` at the same time; {id: record}. A program that cannot
    be started gets rc 127 and the reason on stderr."""
    records, started = {}, []
    for s in steps:
        try:
            started.append((s, start(s, job_env, cwd)))
        except (OSError, subprocess.SubprocessError) as exc:
            records[s["id"]] = {"rc": 127, "stdout": "", "stderr": str(exc), "seconds": 0.0,
                                "timed_out": False}
    for s, p in started:
        records[s["id"]] = finish(p, p[3] + float(s.get("timeout", 600)))
    return records


def run_file_step(step):
    """A write or mkdir step: {"rc": 0 or errno, "error": text}."""
    t0 = time.monotonic()
    try:
        if "mkdir" in step:
            os.makedirs(step["mkdir"], exist_ok=True)
        else:
            with open(step["write"], "w") as f:
                f.write(step["text"])
        rc, error = 0, ""
    except OSError as exc:
        rc, error = exc.errno or 1, str(exc)
    return {"rc": rc, "stdout": "", "stderr": error, "seconds": round(time.monotonic() - t0, 2),
            "timed_out": False}


def batches(steps):
    """Consecutive run steps sharing a "group" together; every other step alone."""
    out = []
    for step in steps:
        g = step.get("group")
        if g is not None and out and out[-1][0].get("group") == g:
            out[-1].append(step)
        else:
            out.append([step])
    return out


def save(path, results):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f)
    os.replace(tmp, path)


def run(job_path, results_path):
    with open(job_path) as f:
        job = json.load(f)
    uptime = float((read_text("/proc/uptime") or "0").split()[0])
    results = {"steps": {}, "done": False, "uptime": uptime}
    save(results_path, results)  # the host's sign that the guest booted and the job began
    env = job.get("env") or dict(os.environ)
    for batch in batches(job["steps"]):
        if "argv" in batch[0]:
            results["steps"].update(run_group(batch, env, job.get("cwd")))
        else:
            results["steps"][batch[0]["id"]] = run_file_step(batch[0])
        save(results_path, results)
    results["done"] = True
    save(results_path, results)
    return 0


def when_ready(folder, count, argv):
    """Wait (at most 600 s) until ``count`` holders (tests/live_probe.py --hold) announced
    themselves in ``folder``, run ``argv`` with the word "{pids}" replaced by their PIDs,
    pass its output on and return its exit code; the holders are always released."""
    deadline = time.monotonic() + 600
    try:
        while True:
            pids = sorted(int(n[6:]) for n in os.listdir(folder) if n.startswith("ready-"))
            if len(pids) >= count:
                break
            if time.monotonic() > deadline:
                sys.stderr.write(f"live_agent: {len(pids)} of {count} holders ready after 600 s\n")
                return 124
            time.sleep(0.05)
        args = []
        for word in argv:
            args += [str(p) for p in pids] if word == "{pids}" else [word]
        proc = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=600, check=False)
        sys.stdout.write(proc.stdout)
        sys.stderr.write(proc.stderr)
        return proc.returncode
    finally:
        open(os.path.join(folder, "release"), "w").close()


def main(argv):
    if argv[1:2] == ["dump"] and len(argv) == 3:
        save(argv[2], dump())
        return 0
    if argv[1:2] == ["run"] and len(argv) == 4:
        return run(argv[2], argv[3])
    if argv[1:2] == ["when-ready"] and len(argv) > 4:
        return when_ready(argv[2], int(argv[3]), argv[4:])
    sys.stderr.write("usage: live_agent.py run JOB RESULTS | dump FILE | when-ready DIR N CMD...\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
