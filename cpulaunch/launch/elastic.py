"""Per-rank entry under the torchrun that ``cpulaunch --ddp --rdzv-endpoint`` starts.

torchrun's elastic agent runs ``python -m cpulaunch.rank_entry`` once per local rank with
LOCAL_RANK set; the parent cpulaunch put every local rank's rendered command (argv, env,
affinity) as JSON in ``CPULAUNCH_RANK_SPECS``. This entry runs its own entry as it is:
ranks never probe, plan or render again, so what ``--dry-run`` showed is what each rank
runs. It records the rank's exit code (torchrun reports every failure as 1) in
``CPULAUNCH_DDP_STATUS_DIR`` for the parent. Plumbing, not configuration: neither
variable reaches the program.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    """Run this local rank's command; returns its exit code."""
    from cpulaunch import launch
    from cpulaunch.distributed import RANK_SPECS_ENV, STATUS_DIR_ENV

    environ = dict(os.environ)
    try:
        specs = json.loads(environ.pop(RANK_SPECS_ENV))
        status_dir = environ.pop(STATUS_DIR_ENV, None)
        local = int(environ["LOCAL_RANK"])
        entry = specs[local]
    except (KeyError, ValueError, IndexError, TypeError):
        print("cpulaunch.rank_entry: internal: run by cpulaunch --ddp under torchrun only", file=sys.stderr)
        return 70
    spec = launch.ProcessSpec(index=entry["index"], label=entry["label"], argv=tuple(entry["argv"]),
                              env=entry["env"], affinity=tuple(entry["affinity"]) if entry["affinity"] else None,
                              cpus=tuple(entry["cpus"]))
    if not status_dir:
        launch.exec_spec(spec, environ)
    outcome = launch.run_group([spec], environ, prefix_output=False, stdin_for=None)
    record = {"rank": int(environ.get("RANK", local)), "exit_code": outcome.exit_code, "time": time.time(),
              "how": launch.describe_failure(outcome, [spec]) if outcome.exit_code else ""}
    try:  # never through a link planted at the name (issue 19)
        launch.write_file(Path(status_dir), f"rank{record['rank']}.json", json.dumps(record))
    except OSError:
        pass
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
