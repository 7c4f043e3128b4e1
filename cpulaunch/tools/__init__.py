"""The offline tools: ``cpulaunch doctor`` (:mod:`.doctor`), ``cpulaunch verify``
(:mod:`.verify`) and ``cpulaunch tune`` (:mod:`.tune`). Slower, may import more; each
module has a ``main(args) -> int`` that :mod:`cpulaunch.cli` imports only when its word is
given, so the launch path never pays for them and every error they raise goes through the
CLI's one exception-to-exit-code map.
"""

from cpulaunch.option_table import HELP_CONTEXT

#: click settings every tool's command shares: the command line's
#: (:data:`cpulaunch.option_table.HELP_CONTEXT`).
CLICK_CONTEXT = HELP_CONTEXT
