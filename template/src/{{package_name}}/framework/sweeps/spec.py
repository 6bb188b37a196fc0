"""The sweep file (configs/sweep/): its keys and their defaults, and the checks on them, each
refusal one line."""

import difflib
import math
from collections.abc import Iterator
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
    "start": "warm",
}
CHOICES = {
    "direction": ("maximize", "minimize"),
    "sampler": ("tpe", "random", "grid"),
    "pruner": ("median", "none"),
    "start": ("warm", "cold"),
}
WANDB_KEYS = {"method", "run_cap", "program", "command", "early_terminate"}
# What a setting takes, by the type of its value in fit's config: a text setting takes a number too
# (precision: 16, devices: 2), and a class a class name.
TAKES = {
    "a number": ("a number",),
    "true or false": ("true or false",),
    "text": ("text", "a number"),
    "a list": ("a list",),
    "a mapping": ("a mapping", "text"),
}


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


def check_parameters(path: Path, sweep: dict[str, Any], settings: dict[str, Any]) -> None:
    """Refuse, before any trial, a parameter that is not a setting of fit (``settings``: the
    config fit prints), and choices of mixed types or of another type than the setting's."""
    keys = dict(_flat(settings))
    short = {_short(key): key for key in keys}
    for name, spec in sweep["parameters"].items():
        key = short.get(_short(name))
        if key is None and not _in_mapping(name, keys):
            close = difflib.get_close_matches(name, keys, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SweepError(f"{path}: parameter {name!r} is not a setting of fit{hint}")
        values = spec["choices"] if "choices" in spec else [spec["low"]]
        kinds = list(dict.fromkeys(_kind(value) for value in values if value is not None))
        if len(kinds) > 1:
            mixed = " and ".join(kinds)
            raise SweepError(f"{path}: parameter {name!r} mixes {mixed}: give choices of one type")
        current = keys.get(key)
        taken = TAKES.get(_kind(current), ()) if current is not None else ()
        for value in values:
            if taken and value is not None and _kind(value) not in taken:
                raise SweepError(
                    f"{path}: parameter {name!r}: {value!r} is {_kind(value)}, "
                    f"but the setting is {_kind(current)} ({current!r})"
                )


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float):
        return "a number"
    return {str: "text", list: "a list", dict: "a mapping"}.get(type(value), type(value).__name__)


def _flat(settings: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in settings.items():
        yield f"{prefix}{key}", value
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")


def _short(key: str) -> str:
    """A key as the command line also takes it: ``model.lr`` for ``model.init_args.lr``."""
    return ".".join(part for part in key.split(".") if part != "init_args")


def _in_mapping(name: str, keys: dict[str, Any]) -> bool:
    """Whether ``name`` is a key within a class's mapping argument (``optimizer_args.momentum``),
    which takes any key."""
    parts = name.split(".")
    for end in range(len(parts) - 1, 1, -1):
        prefix = ".".join(parts[:end])
        value = keys.get(prefix)
        if isinstance(value, dict) and "init_args" in parts[: end - 1] and "class_path" not in value:
            return parts[end - 1] != "init_args"
    return False


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
