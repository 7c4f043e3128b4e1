"""The folder ``cpulaunch --ddp`` puts first on each rank's PYTHONPATH: it holds only
:mod:`sitecustomize` (see there). A package only so that it is installed with cpulaunch;
nothing imports it by this name."""
