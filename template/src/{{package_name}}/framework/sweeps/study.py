"""A sweep's Optuna study: where it is stored, how its sampler draws, and opening it (created, or
continued only with the same settings)."""

import contextlib
import functools
import itertools
import os
import random
import re
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, unquote_plus

import optuna
import sqlalchemy.exc
from optuna.distributions import BaseDistribution as Distribution
from optuna.trial import FrozenTrial, TrialState

from .spec import SweepError, check_name, read_sweep

SWEEPS_DIR = Path("sweeps")
# What must stay the same for a study to be continued: its trials are comparable only then.
KEPT = ("metric", "direction", "parameters", "fit_args")
# How a trial's fit is told the storage: not on its command line, saved in its config.yaml, since
# a database URL may hold a password.
STORAGE_VARIABLE = "SWEEP_STORAGE"
CREATE_TRIES = 5  # to open a database that other workers are setting up at the same moment
# What a database that stopped answering raises: Optuna wraps SQLAlchemy's errors, but not all.
LOST = (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError)
# The query parameters of a database URL whose value is a secret, by a word in their name
# (libpq's password and sslpassword, ODBC's PWD, a driver's token or key): never printed, as the password.
SECRET_WORDS = ("pass", "pwd", "secret", "token", "key", "credential")
MASK = "***"


def storage_of(name: str, storage: str | None) -> str:
    """The storage of study ``name``: the one given, or ``sweeps/<name>.db``; in a Slurm job
    array, whose tasks may run on several nodes, the journal file ``sweeps/<name>.journal``."""
    if storage:
        return storage
    SWEEPS_DIR.mkdir(exist_ok=True)
    if "SLURM_ARRAY_TASK_ID" in os.environ:
        return str(SWEEPS_DIR / f"{name}.journal")
    return f"sqlite:///{SWEEPS_DIR / name}.db"


def open_storage(storage: str, sweep: dict[str, Any] | None = None) -> optuna.storages.BaseStorage:
    """What Optuna opens: a database URL, or a journal file (``.journal``); or a SweepError that
    names the storage and what is wrong with it, before anything is written there. For a worker
    of ``sweep``, a database also keeps the heartbeat of each running trial (see ``Beating``)."""
    if storage.startswith("sqlite:///") or storage.endswith(".journal"):
        _check_file(Path(storage.removeprefix("sqlite:///")), storage)
    try:
        if storage.endswith(".journal"):
            return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(storage))
        if sweep is None:
            return optuna.storages.RDBStorage(storage)
        return _beating(storage, sweep)
    except ImportError as error:
        # Optuna's message leaves out which module is missing.
        driver = masked(str(error.__cause__ or error), storage)
        raise SweepError(f"{printable(storage)}: its database driver is not installed ({driver})") from None
    except (OSError, ValueError, sqlalchemy.exc.SQLAlchemyError) as error:
        raise SweepError(f"{printable(storage)}: {reason_of(error, storage)}") from None


def _beating(storage: str, sweep: dict[str, Any]) -> "Beating":
    opened = functools.partial(
        Beating,
        storage,
        heartbeat_interval=sweep["heartbeat_interval"],
        grace_period=sweep["grace_period"],
        heartbeat_stale_trial_callback=functools.partial(retry_stale, grace=sweep["grace_period"]),
    )
    with _quiet_experimental():
        for _ in range(CREATE_TRIES - 1):
            try:
                return opened()
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
                # Workers that start together on a new database each create Optuna's tables;
                # those that lose the race find them made when they try again.
                time.sleep(1 + random.random())
        return opened()


def printable(storage: str) -> str:
    """The storage as printed: a database URL without its password or any secret it holds."""
    return masked(storage, storage)


def masked(text: str, storage: str) -> str:
    """``text`` with every secret of ``storage`` in it replaced by ***: what is printed about a
    storage passes here, since a driver's message may quote a part of the URL. A secret within a
    word is left (a password ``a`` is not masked in ``database``): in a URL and in what a driver
    quotes of it, a secret stands between delimiters (: @ = & / ' ")."""
    secrets = secrets_of(storage)
    if not secrets:
        return text
    alone = f"(?<![A-Za-z0-9])(?:{'|'.join(map(re.escape, secrets))})(?![A-Za-z0-9])"
    return re.sub(alone, MASK, text)


def secrets_of(storage: str) -> list[str]:
    """What of a database URL is never printed, longest first: its user's password and the value of
    each secret query parameter, as written and decoded. A password written with an unescaped @
    (or a value with an unescaped &) is taken at every split the URL allows, and in pieces, since
    the driver may then print one as part of the host's or an option's name."""
    if "://" not in storage:
        return []  # a journal file
    rest = storage.partition("://")[2]
    found = set()
    with contextlib.suppress(sqlalchemy.exc.ArgumentError, ValueError):
        url = sqlalchemy.engine.make_url(storage)  # the password as the driver gets it
        found.add(url.password or "")
        for key, value in url.query.items():
            if _secret(key):
                found.update([value] if isinstance(value, str) else value)
    user = re.match(r"[^:/@?]*:", rest)  # user:password@...; not host:port/...
    if user:
        found.update(_at_splits(rest[user.end() :]))
    parts = rest.partition("?")[2].split("&")
    for index, part in enumerate(parts):
        key, _, value = part.partition("=")
        if _secret(key):
            # The value, and the parts after it that are no key=value: of the value, unescaped.
            more = itertools.takewhile(lambda part: "=" not in part, parts[index + 1 :])
            for piece in itertools.accumulate([value, *more], lambda joined, part: f"{joined}&{part}"):
                found.update([piece, *piece.split("&"), *piece.split("@")])
    found |= {unquote(secret) for secret in found} | {unquote_plus(secret) for secret in found}
    return sorted(found - {"", MASK}, key=len, reverse=True)


def _secret(key: str) -> bool:
    return any(word in key.lower() for word in SECRET_WORDS)


def _at_splits(after_user: str) -> set[str]:
    """The passwords ``user:`` may be followed by: up to each @ of the URL's authority, and their
    pieces between the @s."""
    found, password = set(), ""
    for piece in after_user.split("@")[:-1]:
        if "/" in piece or "?" in piece:  # past the host: the path or the query
            break
        password = f"{password}@{piece}" if password else piece
        found |= {password, piece}
    return found


def reason_of(error: BaseException, storage: str) -> str:
    """The first line of what the database said about ``storage``, without its secrets:
    SQLAlchemy's message spans lines, and Optuna wraps it in its own."""
    cause = error.__cause__ if isinstance(error, optuna.exceptions.StorageInternalError) else error
    reason = getattr(cause, "orig", None) or cause or error
    return masked(str(reason).strip().splitlines()[0], storage)


class Beating(optuna.storages.RDBStorage):
    """A database storage in which a worker's running trial has a heartbeat, written every
    ``heartbeat_interval`` seconds by a thread of the worker. A trial whose heartbeat is older
    than ``grace_period`` seconds has lost its worker, on whichever machine it ran: the next worker
    to look fails it and tries it again (``retry_stale``).

    A heartbeat the database does not take is let go: the worker hears of the database's loss
    from its trial's fit, and says it in one line, not as a thread's traceback."""

    def record_heartbeat(self, trial_id: int) -> None:
        with contextlib.suppress(LOST):
            super().record_heartbeat(trial_id)


def retry(study: optuna.Study, number: int, params: dict[str, Any], run_name: str) -> None:
    """Queue trial ``number`` again, with its values and run (resumed from its last checkpoint)."""
    study.enqueue_trial(params, user_attrs={"run_name": run_name, "retry_of": number})


def retry_stale(study: optuna.Study, trial: FrozenTrial, grace: int) -> None:
    """Try again a trial whose worker gave no heartbeat for ``grace`` seconds: the worker was
    killed, or its machine was lost."""
    worker = trial.user_attrs.get("worker", {})
    print(
        f"trial {trial.number}'s worker on {worker.get('host', '?')} (pid {worker.get('pid', '?')}) "
        f"gave no heartbeat for {grace} s: trying it again",
        flush=True,
    )
    retry(study, trial.number, trial.params, trial.user_attrs.get("run_name", ""))


def fail_stale(study: optuna.Study) -> None:
    """Fail and try again the running trials whose workers gave no heartbeat for the grace period."""
    with _quiet_experimental():
        optuna.storages.fail_stale_trials(study)


@contextlib.contextmanager
def _quiet_experimental() -> Iterator[None]:
    """Without Optuna's warning that the heartbeat is experimental: it has been so since 2.9."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def _check_file(path: Path, storage: str) -> None:
    if path.suffix != ".journal" and path.is_file() and path.stat().st_size == 0:
        # SQLite would take it for an empty database; more likely the wrong file was given.
        raise SweepError(
            f"{storage}: {path} is an empty file, not a study's database: give another, or delete it"
        )
    if not path.exists() and not path.parent.is_dir():
        raise SweepError(f"{storage}: no directory {path.parent}")
    if not path.exists() and not os.access(path.parent, os.W_OK):
        raise SweepError(f"{storage}: directory {path.parent} is read-only")


def sampler_of(sweep: dict[str, Any], seed: int) -> optuna.samplers.BaseSampler:
    """The sweep's sampler, seeded with ``seed``."""
    if sweep["sampler"] == "grid":
        space = {name: spec["choices"] for name, spec in sweep["parameters"].items()}
        return optuna.samplers.GridSampler(space, seed=seed)
    if sweep["sampler"] == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # constant_liar: a trial still running counts as a poor result, so that workers spread out.
    return optuna.samplers.TPESampler(n_startup_trials=sweep["startup_trials"], seed=seed, constant_liar=True)


class SeededByTrial(optuna.samplers.BaseSampler):
    """The sweep's sampler, seeded anew for each trial from the sweep's seed and the trial's number.

    Workers that ask for trials at the same moment see the same trials, so samplers seeded alike
    (or by worker, which two Slurm tasks or two terminals share) would draw alike; the storage gives
    every trial a number of its own. A study run by one worker draws the same values every time.
    """

    def __init__(self, sweep: dict[str, Any]) -> None:
        self._sweep = sweep
        self._sampler = sampler_of(sweep, sweep["seed"])

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        # A grid is shuffled by its seed, and trial N takes its N-th point: one seed for all trials,
        # or some points come twice and others never.
        if self._sweep["sampler"] != "grid":
            self._sampler = sampler_of(self._sweep, self._sweep["seed"] * 1_000_003 + trial.number)
        self._sampler.before_trial(study, trial)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Distribution]:
        return self._sampler.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, Distribution]
    ) -> dict[str, Any]:
        return self._sampler.sample_relative(study, trial, search_space)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: Distribution
    ) -> Any:
        return self._sampler.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: list[float] | None
    ) -> None:
        self._sampler.after_trial(study, trial, state, values)


def open_study(sweep: dict[str, Any], storage: str, fit_args: list[str], runs_dir: Path) -> optuna.Study:
    """Create the study, or load it if it exists, refusing one whose trials were made otherwise."""
    settings = {"metric": sweep["metric"], "direction": sweep["direction"]}
    settings |= {"parameters": sweep["parameters"], "fit_args": fit_args}
    opened = open_storage(storage, sweep)
    if sweep["name"] not in optuna.get_all_study_names(opened):
        # Its trials' run names would be those of an earlier study's runs, which fit refuses.
        prefix = f"{sweep['name']}-"
        earlier = sorted(path for path in runs_dir.glob(f"{prefix}*") if path.name[len(prefix) :].isdigit())
        if earlier:
            raise SweepError(
                f"{earlier[0]} holds a run of an earlier study {sweep['name']}, not in {printable(storage)}: "
                "give this sweep another name, or move those runs away"
            )
    study = optuna.create_study(
        storage=opened,
        study_name=sweep["name"],
        direction=sweep["direction"],
        load_if_exists=True,
    )
    kept = study.user_attrs.get("settings")
    if kept is None:
        study.set_user_attr("settings", settings)
    elif kept != settings:
        changed = ", ".join(key for key in KEPT if kept[key] != settings[key])
        raise SweepError(
            f"study {sweep['name']} in {printable(storage)} was run with another {changed}: run it with the "
            "same, or give this sweep another name"
        )
    study.sampler = SeededByTrial(sweep)
    return study


def study_name(name_or_file: str) -> str:
    """The study a sweep file names, or the name given."""
    path = Path(name_or_file)
    if path.suffix in (".yaml", ".yml"):
        return read_sweep(path)["name"]
    check_name(name_or_file, "study")
    return name_or_file


def existing_storage(name: str, storage: str | None) -> str:
    """The storage of an existing study: the one given, or the one in sweeps/."""
    if storage:
        return storage
    for path in (SWEEPS_DIR / f"{name}.db", SWEEPS_DIR / f"{name}.journal"):
        if path.is_file():
            return f"sqlite:///{path}" if path.suffix == ".db" else str(path)
    raise SweepError(f"no study {name} in {SWEEPS_DIR}/: run its sweep first, or give --storage")
