"""The PyTorch training article's DDP program on CPU (issue 25): examples/article_ddp.py, a
program that takes its rank from ``--local_rank``, run under ``cpulaunch --ddp
--pass-local-rank`` as a user runs it: 2 real gloo ranks, real child processes."""

from __future__ import annotations

import os
import re

import pytest

from conftest import REPO, json_records, run_cli

from cpulaunch.runtime.amp import EMULATED_SPEED, amp_refusal
from cpulaunch.runtime.inference import Bf16Support, host_bf16_support

ARTICLE = str(REPO / "examples" / "article_ddp.py")

pytestmark = [pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs for 2 ranks")]


def ranks_of(stdout: str) -> list:
    return sorted(json_records(stdout), key=lambda r: r["rank"])


@pytest.mark.slow
def test_article_program_trains_on_two_ranks_with_pass_local_rank():
    proc = run_cli("--ddp", "--nproc-per-node", "2", "--pass-local-rank", "python", ARTICLE, "--epochs", "2",
                   timeout=240)
    recs = ranks_of(proc.stdout)
    assert [(r["rank"], r["local_rank"], r["world_size"]) for r in recs] == [(0, 0, 2), (1, 1, 2)]
    assert recs[0]["params_sha256"] == recs[1]["params_sha256"]  # DDP kept the replicas equal
    # 64 samples, 2 ranks x 8 per step: 4 steps an epoch, each rank its own half of the data
    assert [len(r["losses"]) for r in recs] == [8, 8] and recs[0]["losses"] != recs[1]["losses"]
    assert all(r["autocast"] is None for r in recs)


@pytest.mark.slow
def test_without_pass_local_rank_both_ranks_ask_for_rank_0():
    """The control: the program reads --local_rank (default 0), so without the flag both ranks
    try to host rank 0's store; the second fails at once and cpulaunch stops the other."""
    proc = run_cli("--ddp", "--nproc-per-node", "2", "python", ARTICLE, "--epochs", "1",
                   timeout=240, check_rc=None)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "EADDRINUSE" in proc.stderr
    assert re.search(r"cpulaunch: rank [01] failed first: exit 1", proc.stderr)
    assert json_records(proc.stdout) == []


@pytest.mark.slow
def test_amp_is_bf16_autocast_where_the_cpu_has_bf16_else_refused():
    """--amp by this machine's /proc/cpuinfo: bf16 autocast on a CPU with avx512_bf16 or
    amx_bf16 (a Zen 4/5 here), a one-line refusal naming the measured slowdown elsewhere (a
    Zen 3, AVX2 only)."""
    native = host_bf16_support() is Bf16Support.NATIVE
    flags = open("/proc/cpuinfo").read()
    assert native == bool(re.search(r"^flags\s*:.*\b(avx512_bf16|amx_bf16)\b", flags, re.M))
    proc = run_cli("--ddp", "--nproc-per-node", "2", "--pass-local-rank", "python", ARTICLE, "--epochs", "1",
                   "--amp", timeout=240, check_rc=None)
    if native:
        assert proc.returncode == 0, proc.stderr[-2000:]
        recs = ranks_of(proc.stdout)
        assert [r["autocast"] for r in recs] == ["bfloat16", "bfloat16"]
        assert recs[0]["params_sha256"] == recs[1]["params_sha256"]
    else:
        assert proc.returncode == 2
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("[")]
        assert {ln.split("] ", 1)[1] for ln in lines} == {
            f"article_ddp.py: {amp_refusal(host_bf16_support())}"}


def test_amp_refusal_text_names_the_measured_slowdown():
    assert amp_refusal(Bf16Support.NATIVE) is None
    assert amp_refusal(Bf16Support.NONE) == (
        "--amp: this CPU has no bf16 instructions (neither avx512_bf16 nor amx_bf16 in /proc/cpuinfo), so bf16 "
        "autocast would be emulated: it trained at 0.09x fp32's speed on an AVX2-only CPU; "
        "drop --amp to train in fp32, or pass --bf16 to force bf16 autocast")
    assert amp_refusal(Bf16Support.EMULATED) == amp_refusal(Bf16Support.NONE)
    assert amp_refusal(Bf16Support.UNKNOWN).startswith(
        "--amp: cannot tell from /proc/cpuinfo whether this CPU computes in bf16, so")
    assert f"{EMULATED_SPEED:.2f}x" == "0.09x"
