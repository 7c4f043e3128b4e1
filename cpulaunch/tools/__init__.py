"""The offline tools: ``cpulaunch doctor`` (:mod:`.doctor`), ``cpulaunch verify``
(:mod:`.verify`) and ``cpulaunch tune`` (:mod:`.tune`). Slower, may import more; each
module has a ``main(args) -> int`` that :mod:`cpulaunch.cli` imports only when its word is
given, so the launch path never pays for them and every error they raise goes through the
CLI's one exception-to-exit-code map.
"""

#: click settings every tool's command shares.
CLICK_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
