"""Hyper-parameter sweeps on Optuna (the ``sweep`` extra): each trial is one fit of the command line."""
