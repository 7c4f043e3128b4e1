"""Every read of the host: sysfs, procfs and cgroups through one bounded reader, parsed into
typed facts (:mod:`.probe`); the topology built from them (:mod:`.topology`); the other host
facts a run needs (:mod:`.host`); the preloadable libraries (:mod:`.libraries`).

Nothing here runs at import, and nothing here plans or launches: planning and rendering
take these values and stay pure.
"""
