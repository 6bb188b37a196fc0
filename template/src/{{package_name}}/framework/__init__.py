"""The template's code, which ``copier update`` keeps up to date: extend it from your own files in
``models/`` and ``data/`` (subclass its modules, add callbacks in a config) rather than edit it
(GUIDE.md, "Your files and the template's").

- ``cli.py``: the command line (LightningCLI), ``preparation.py``: how a run starts, step by
  step, ``settings.py``: the options and checks a run takes besides LightningCLI's,
  ``errors.py``: the one-line errors;
- ``models/``: SupervisedModule, the Classifier, the Regressor and the timm backbone, and the
  parts they are built from (``parts.py``: optimizer, schedule, metrics, non-finite check);
- ``data/``: what a data module gives the model, the split, arrays in memory, files, image
  folders and LitData shards;
- ``runs/``: the life cycle of one run; ``sweeps/``: sweeps on Optuna and cross-validation;
  ``utils/``: the callbacks and loggers a run's Trainer gets;
- ``serving.py``, ``report.py``, ``export.py``: ``serve``, ``scripts/report.py``, ``scripts/export.py``;
- ``testing.py``: LightningModuleChecks, the checks of your own module for your tests;
- ``moved.py``: the module paths before v0.17.0, which old checkpoints name.
"""
