"""The launcher: side effects only, after planning and rendering are done.

:mod:`.spawn` (one process: its spec, its set-up between fork and exec, exec in place),
:mod:`.group` (several processes, their output relayed, a watchdog), :mod:`.supervise`
(signals, the root cause, the grace period), :mod:`.rundir` (the ``--log-dir`` folder and
its JSON files, never written through a planted link) and :mod:`.elastic` (the elastic
``--ddp`` run under torchrun). Importing this package imports none of them: the common
exec path loads :mod:`.spawn` only.
"""
