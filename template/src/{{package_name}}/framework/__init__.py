"""The template's code: the command line, runs, sweeps, serving, and the bases your models and data
modules extend. ``copier update`` keeps it up to date; extend it from ``models/`` and ``data/``
rather than editing it (GUIDE.md, "Which files are yours")."""
