"""What runs inside the user's program (may import torch, lazily): the inference paths
(:mod:`.inference`), the DDP wrapper and ``init_process_group`` (:mod:`.ddp`), the
synchronized BatchNorm for CPU process groups (:mod:`.syncbn`), mixed precision on CPU
(:mod:`.amp`) and the DataLoader helpers (:mod:`.dataloader`).

Nothing outside this package imports it, but for the documented import paths kept as thin
aliases (``cpulaunch.inference``, ``cpulaunch.ddp_wrap``, ``cpulaunch.torch_utils``,
``cpulaunch.distributed.init_process_group``, ``wrap_ddp`` and
``convert_sync_batchnorm``): ``tests/test_layers.py`` holds that rule.
"""
