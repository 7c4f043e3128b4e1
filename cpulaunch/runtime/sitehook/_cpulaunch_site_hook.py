"""The mark of a cpulaunch hook folder: a folder on sys.path holding this file is one,
whatever its name, link or install (sitecustomize.py and cpulaunch.distributed look for the
file, never import it). Nothing is in it."""
