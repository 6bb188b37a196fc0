"""The sweep file (configs/sweep/): its keys and their defaults, and the checks on them, each
refusal one line."""

import difflib
import math
from pathlib import Path
from typing import Any

import optuna
import yaml

from ..runs.directory import NAME

# The sweep file's keys and their defaults (None: required).
KEYS = {
    "name": None,
    "metric": None,
    "direction": None,
    "parameters": None,
    "trials": 8,
    "sampler": "tpe",
    "startup_trials": 4,
    "pruner": "median",
    "warmup_epochs": 3,
    "seed": 0,
    "heartbeat_interval": 60,
    "grace_period": 180,
}
CHOICES = {
    "direction": ("maximize", "minimize"),
    "sampler": ("tpe", "random", "grid"),
    "pruner": ("median", "none"),
}
WANDB_KEYS = {"method", "run_cap", "program", "command", "early_terminate"}


class SweepError(ValueError):
    """A sweep file, study or storage that cannot be used; the message is one line."""


def read_sweep(path: Path) -> dict[str, Any]:
    """The sweep file's settings, defaults filled in, or a SweepError naming what is wrong."""
    if not path.is_file():
        raise SweepError(f"{path}: no such sweep file")
    sweep = yaml.safe_load(path.read_text())
    if not isinstance(sweep, dict):
        raise SweepError(f"{path} holds no settings")
    if WANDB_KEYS & sweep.keys() or isinstance(sweep.get("metric"), dict):
        raise SweepError(
            f"{path} is in the W&B sweep format, which scripts/sweep.py no longer reads: write metric: "
            "<name> and direction: maximize or minimize, trials: <count> for run_cap, sampler: tpe, random "
            "or grid for method, and each parameter as {low: ..., high: ..., log: true} or {choices: [...]} "
            "(configs/sweep/lr_dropout.yaml shows them all)"
        )
    for key in sweep.keys() - KEYS.keys():
        close = difflib.get_close_matches(key, KEYS, n=1)
        raise SweepError(f"{path}: unknown key {key!r}" + (f"; did you mean {close[0]}?" if close else ""))
    sweep = {**KEYS, **sweep}
    missing = [key for key, value in sweep.items() if value is None]
    if missing:
        raise SweepError(f"{path} needs {', '.join(missing)}")
    check_name(sweep["name"], f"{path}: name")
    for key, allowed in CHOICES.items():
        if sweep[key] not in allowed:
            raise SweepError(f"{path}: {key}: {sweep[key]!r} is not one of {', '.join(allowed)}")
    for key in ("trials", "startup_trials", "warmup_epochs", "heartbeat_interval", "grace_period"):
        least = int(key in ("trials", "heartbeat_interval", "grace_period"))
        if isinstance(sweep[key], bool) or not isinstance(sweep[key], int) or sweep[key] < least:
            raise SweepError(f"{path}: {key} must be a whole number, at least {least}")
    if sweep["grace_period"] <= sweep["heartbeat_interval"]:
        raise SweepError(
            f"{path}: grace_period ({sweep['grace_period']} s) must be longer than heartbeat_interval "
            f"({sweep['heartbeat_interval']} s), or trials whose workers live are tried again"
        )
    if not isinstance(sweep["parameters"], dict) or not sweep["parameters"]:
        raise SweepError(f"{path}: parameters must map config keys to a range or choices")
    for name, spec in sweep["parameters"].items():
        distribution(name, spec)
        if sweep["sampler"] == "grid" and "choices" not in spec:
            raise SweepError(f"{path}: a grid needs choices for every parameter; {name} has a range")
    return sweep


def check_name(name: Any, where: str) -> None:
    """A study's name names its storage (sweeps/<name>.db) and its trials' runs (<name>-<number>):
    one file name, by the rule of run names, so that nothing is written elsewhere."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise SweepError(
            f"{where} {name!r} is not a file name: use letters, digits and . _ - = + @, "
            "starting with a letter, digit or _ (no / or ..)"
        )


def distribution(name: str, spec: Any) -> optuna.distributions.BaseDistribution:
    """A parameter's distribution: ``{choices: [...]}``, or ``{low, high}`` with ``log`` or ``step``."""
    keys = set(spec) if isinstance(spec, dict) else set()
    if keys == {"choices"} and isinstance(spec["choices"], list) and spec["choices"]:
        return optuna.distributions.CategoricalDistribution(spec["choices"])
    if {"low", "high"} <= keys <= {"low", "high", "log", "step"}:
        low, high, log, step = spec["low"], spec["high"], spec.get("log", False), spec.get("step")
        given = {"low": low, "high": high, **({"step": step} if step is not None else {})}
        for key, value in given.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise SweepError(f"parameter {name}: {key} {value!r} is not a finite number")
        if step is not None and low <= high < low + step:  # every trial would draw low
            raise SweepError(f"parameter {name}: step {step} is larger than its range, {low} to {high}")
        try:
            if all(isinstance(value, int) for value in given.values()):
                return optuna.distributions.IntDistribution(low, high, log=log, step=step or 1)
            return optuna.distributions.FloatDistribution(low, high, log=log, step=step)
        except ValueError as error:
            raise SweepError(f"parameter {name}: {error}") from None
    raise SweepError(f"parameter {name} needs choices: [...], or low and high (with log or step)")


def suggest(trial: optuna.Trial, name: str, spec: dict[str, Any]) -> Any:
    """The trial's value of a parameter: drawn by the sampler, or the value of a trial tried again."""
    found = distribution(name, spec)
    if isinstance(found, optuna.distributions.CategoricalDistribution):
        return trial.suggest_categorical(name, found.choices)
    suggest_number = (
        trial.suggest_int if isinstance(found, optuna.distributions.IntDistribution) else trial.suggest_float
    )
    return suggest_number(name, found.low, found.high, log=found.log, step=found.step)


def budget_of(sweep: dict[str, Any]) -> int:
    """How many finished or pruned trials the study is to hold; a grid has at most its size."""
    if sweep["sampler"] == "grid":
        return min(sweep["trials"], math.prod(len(spec["choices"]) for spec in sweep["parameters"].values()))
    return sweep["trials"]
