"""The elastic ``--ddp`` run: torchrun's c10d agent, which cpulaunch starts, runs each local
rank as ``python -m cpulaunch.rank_entry`` (this module's :func:`main`).

The parent put every local rank's rendered command (argv, env, affinity: a
:class:`~cpulaunch.launch.spawn.ProcessSpec` as JSON) in ``CPULAUNCH_RANK_SPECS``. The rank
entry runs its own as it is: ranks never probe, plan or render again, so what ``--dry-run``
showed is what each rank runs. It records the rank's exit code (torchrun reports every
failure as 1) in ``CPULAUNCH_DDP_STATUS_DIR`` for the parent, which reports the rank that
failed first. Plumbing, not configuration: neither variable reaches the program.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

from cpulaunch import envvars
from cpulaunch import log as _log
from cpulaunch.distributed import elastic_rank_env
from cpulaunch.launch.spawn import ProcessSpec

__all__ = ["run_elastic", "main"]

log = _log.get(__name__)


def run_elastic(torchrun_argv: Sequence[str], ranks: Sequence[ProcessSpec], environ: Mapping[str, str], *,
                log_dir: Optional[Path], run_info: Optional[str], grace_period: float) -> int:
    """Start torchrun with cpulaunch's rank entry and every local rank's spec; returns the
    exit code of the rank that failed first (its own code, not torchrun's 1), else torchrun's.

    Args:
        torchrun_argv: the torchrun command (``distributed.torchrun_argv``).
        ranks: each local rank's command, indexed by local rank.
        environ: the user's environment (never modified).
        log_dir, run_info: ``--log-dir`` and the plan.json text, as for any run.
        grace_period: seconds between SIGTERM and SIGKILL for the ranks (torchrun gets 5 more).

    Raises:
        LaunchError: torchrun cannot be started, the log folder cannot be used.
    """
    from cpulaunch.launch.supervise import describe_failure, run_group
    from cpulaunch.machine.files import FileReader

    with tempfile.TemporaryDirectory(prefix="cpulaunch-ddp-") as status_dir:
        env = {envvars.RANK_SPECS: json.dumps([r.to_json() for r in ranks]), envvars.DDP_STATUS_DIR: status_dir}
        if "OMP_NUM_THREADS" not in environ:
            env["OMP_NUM_THREADS"] = "1"  # keeps torchrun's banner away; each rank sets its own
        runner = ProcessSpec(index=0, label="torchrun", argv=tuple(torchrun_argv), env=env, affinity=None, cpus=())
        outcome = run_group([runner], environ, log_dir=log_dir, run_info=run_info,
                            grace_period=grace_period + 5, prefix_output=False, stdin_for=None)
        if outcome.exit_code == 0:
            return 0
        reader, records = FileReader(status_dir), []
        for name in sorted(n for n in reader.listdir("") if n.startswith("rank") and n.endswith(".json")):
            text = reader.read(name, strict=False)
            try:
                records.append(json.loads(text or ""))
            except ValueError:
                pass
    # the earliest failure that is not a lost peer's (a consequence), else the earliest
    failed = sorted((r for r in records if r.get("exit_code")), key=lambda r: (bool(r.get("peer_lost")), r["time"]))
    if failed and failed[0].get("peer_lost"):
        log.warning("rank %d exited %d (peer closed: no rank here failed before it; a peer on another machine was "
                    "lost, most likely)", failed[0]["rank"], failed[0]["exit_code"])
        return int(failed[0]["exit_code"])
    if failed:
        log.warning("rank %d failed first (%s)", failed[0]["rank"],
                    failed[0].get("how", f"exit code {failed[0]['exit_code']}"))
        return int(failed[0]["exit_code"])
    log.warning("%s", describe_failure(outcome, [runner]))
    return outcome.exit_code


def main() -> int:
    """``python -m cpulaunch.rank_entry``: run this local rank's command; returns its exit code."""
    from cpulaunch.launch.spawn import exec_spec
    from cpulaunch.launch.supervise import describe_failure, run_group
    from cpulaunch.machine.files import write_file

    environ = dict(os.environ)
    try:
        specs = json.loads(environ.pop(envvars.RANK_SPECS))
        status_dir = environ.pop(envvars.DDP_STATUS_DIR, None)
        local = int(environ["LOCAL_RANK"])
        spec = ProcessSpec.from_json(specs[local])
    except (KeyError, ValueError, IndexError, TypeError):
        print("cpulaunch.rank_entry: internal: run by cpulaunch --ddp under torchrun only", file=sys.stderr)
        return 70
    environ.update(elastic_rank_env(environ))  # NODE_RANK, known only after the rendezvous
    if not status_dir:
        exec_spec(spec, environ)
    # [local rank] before each console line, as in a static run (torchrun relays it as it is)
    outcome = run_group([spec], environ, prefix_output=True, stdin_for=None)
    verdict = outcome.verdict
    failed_at = verdict.failed.get(spec.index) if verdict is not None else None
    record = {"rank": int(environ.get("RANK", local)), "exit_code": outcome.exit_code,
              # CLOCK_MONOTONIC, the clock every rank of this machine shares: its failure record's
              # time when it wrote one (issue 38), else now (its exit was just seen)
              "time": failed_at if failed_at is not None else time.monotonic(),
              "peer_lost": bool(verdict is not None and spec.index in verdict.lost_peer),
              "how": describe_failure(outcome, [spec]) if outcome.exit_code else ""}
    try:  # never through a link planted at the name (issue 19)
        write_file(Path(status_dir, f"rank{record['rank']}.json"), json.dumps(record))
    except OSError:
        pass
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
