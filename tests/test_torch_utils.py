"""cpulaunch.torch_utils: DataLoader workers pinned to the CPUs cpulaunch reserved, seen
from inside real DataLoader worker processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from cpulaunch import cpulist  # noqa: E402
from cpulaunch.torch_utils import (DATALOADER_CPUS_ENV, DATALOADER_WORKERS_ENV,  # noqa: E402
                                   DataloaderEnvError, dataloader_kwargs, reserved_cpus,
                                   worker_cpu, worker_init_fn)

ALLOWED = sorted(os.sched_getaffinity(0))


class WhereAmI(torch.utils.data.Dataset):
    """Each item reports, from the process that loads it: the worker id, its CPU affinity
    and torch's thread count."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        info = torch.utils.data.get_worker_info()
        return (info.id if info else None, sorted(os.sched_getaffinity(0)),
                torch.get_num_threads())


def seen_by_workers(**extra):
    """{worker id: (affinity, torch threads)} over one pass of a real DataLoader built with
    dataloader_kwargs() and batch_size=None (items as they are)."""
    kwargs = dataloader_kwargs()
    loader = torch.utils.data.DataLoader(WhereAmI(), batch_size=None, **kwargs, **extra)
    seen = {}
    for worker, affinity, threads in loader:
        assert seen.setdefault(worker, (affinity, threads)) == (affinity, threads)
    return seen


@pytest.fixture
def dataloader_env(monkeypatch):
    """Set the two variables as cpulaunch would; the parent's own affinity is unchanged."""
    def set_env(cpus: str, workers: int):
        monkeypatch.setenv(DATALOADER_CPUS_ENV, cpus)
        monkeypatch.setenv(DATALOADER_WORKERS_ENV, str(workers))
    return set_env


def test_each_worker_runs_on_its_own_reserved_cpu(dataloader_env):
    if len(ALLOWED) < 2:
        pytest.skip(f"needs 2 usable CPUs, this process has {cpulist.format(ALLOWED)}")
    cpus = ALLOWED[-2:]
    dataloader_env(cpulist.format(cpus), 2)
    parent_threads = torch.get_num_threads()
    seen = seen_by_workers()
    assert seen == {0: ([cpus[0]], 1), 1: ([cpus[1]], 1)}
    # the parent is left as it was
    assert sorted(os.sched_getaffinity(0)) == ALLOWED
    assert torch.get_num_threads() == parent_threads


def test_workers_share_a_single_reserved_cpu(dataloader_env):
    """Fewer CPUs than workers: worker i gets CPU i mod len (here both get the same one),
    a strict subset of what the parent may use when the machine has more than one CPU."""
    cpu = ALLOWED[-1]
    dataloader_env(str(cpu), 2)
    assert seen_by_workers() == {0: ([cpu], 1), 1: ([cpu], 1)}


def test_unset_means_no_workers_and_no_init_fn(monkeypatch):
    monkeypatch.delenv(DATALOADER_CPUS_ENV, raising=False)
    monkeypatch.delenv(DATALOADER_WORKERS_ENV, raising=False)
    assert dataloader_kwargs() == {"num_workers": 0, "persistent_workers": False}
    assert dataloader_kwargs({DATALOADER_WORKERS_ENV: " "}) == {"num_workers": 0,
                                                                "persistent_workers": False}
    assert dataloader_kwargs({DATALOADER_WORKERS_ENV: "0"}) == {"num_workers": 0,
                                                                "persistent_workers": False}
    # what DataLoader accepts: items loaded in this process
    assert seen_by_workers() == {None: (ALLOWED, torch.get_num_threads())}


def test_kwargs_from_the_environment():
    assert dataloader_kwargs({DATALOADER_WORKERS_ENV: "3", DATALOADER_CPUS_ENV: "6-8"}) == {
        "num_workers": 3, "worker_init_fn": worker_init_fn, "persistent_workers": True}


@pytest.mark.parametrize("value", ["two", "-1", "1.5", "²"])
def test_bad_worker_count_is_one_line(value):
    with pytest.raises(DataloaderEnvError) as info:
        dataloader_kwargs({DATALOADER_WORKERS_ENV: value})
    assert str(info.value) == (f"{DATALOADER_WORKERS_ENV} is {value!r}; expected a whole "
                               f"number >= 0 (cpulaunch --dataloader-workers sets it)")


@pytest.mark.parametrize("worker, cpus, expected", [
    (0, {6, 7}, 6), (1, {7, 6}, 7), (2, {6, 7}, 6), (3, {6, 7}, 7),
    (0, {5}, 5), (4, {5}, 5),
    (1, {2, 3, 10, 11}, 3),  # more CPUs than workers: the lowest ones, one each
])
def test_worker_cpu_rule(worker, cpus, expected):
    assert worker_cpu(worker, cpus) == expected


def test_worker_cpu_errors():
    with pytest.raises(DataloaderEnvError, match="no CPU reserved for DataLoader worker 0"):
        worker_cpu(0, set())
    with pytest.raises(DataloaderEnvError, match="worker id must be >= 0"):
        worker_cpu(-1, {0})


def test_reserved_cpus_parsing():
    assert reserved_cpus({DATALOADER_CPUS_ENV: "0-2,8\n"}) == {0, 1, 2, 8}
    assert reserved_cpus({}) == frozenset()
    with pytest.raises(DataloaderEnvError, match=r"^CPULAUNCH_DATALOADER_CPUS is '3-1', not a "
                                                 r"cpulist such as '6-7' \("):
        reserved_cpus({DATALOADER_CPUS_ENV: "3-1"})


def test_unusable_cpu_is_reported_from_the_worker(dataloader_env):
    """A reserved CPU outside what this process may use: the worker fails with one line
    naming the CPU, and DataLoader re-raises it in the parent."""
    bad = max(ALLOWED) + 4096  # above any CPU id the kernel accepts here
    dataloader_env(str(bad), 1)
    with pytest.raises(DataloaderEnvError) as info:
        seen_by_workers()
    expected = (f"DataLoader worker 0 cannot run on CPU {bad} ({DATALOADER_CPUS_ENV}={bad}): "
                f"Invalid argument; this process may use CPUs {cpulist.format(ALLOWED)}")
    assert expected in str(info.value)


def test_not_imported_by_the_launcher():
    code = ("import sys, cpulaunch, cpulaunch.cli, cpulaunch.inference; "
            "assert 'cpulaunch.torch_utils' not in sys.modules; assert 'torch' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
