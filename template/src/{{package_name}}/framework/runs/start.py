"""How a command starts its run: the checkpoint it continues or evaluates, read and checked once;
the directory it writes into (``directory.py`` has the rules); where its loggers write; and the
command that resumes it."""

import os
import shlex
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.utilities import rank_zero_only

from ..errors import UsageError
from ..utils.monitor import best_of, kept_by
from . import directory
from .checkpoints import check_made_here, read_checkpoint

PACKAGE = __name__.partition(".")[0]
TRACKING_LOGGER = f"{PACKAGE}.framework.utils.tracking.WandbLogger"
# Processes that Lightning starts for DDP re-run the command line; they read rank 0's start time here.
START_TIME_VARIABLE = f"{PACKAGE.upper()}_START_TIME"
# Data settings of how to load, not of what is loaded: an evaluation may change them from the
# checkpoint's (more workers for a folder of new images, skipping unreadable ones).
LOADING_SETTINGS = ("num_workers", "pin_memory", "skip_unreadable")


def start_time() -> str:
    """When the command started, as run and output directories are named by default."""
    if rank_zero_only.rank > 0 and START_TIME_VARIABLE in os.environ:
        return os.environ[START_TIME_VARIABLE]
    os.environ[START_TIME_VARIABLE] = datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.environ[START_TIME_VARIABLE]


def without_options(words: list[str], options: tuple[str, ...]) -> list[str]:
    """A command's ``words`` less ``options`` (and their keys: ``--model`` takes ``--model.lr``),
    each with its value, given as ``--option=value`` or as the next word."""
    kept, skip = [], False
    for word in words:
        if skip and not word.startswith("--"):  # the value of a left-out option
            skip = False
            continue
        option, joined, _ = word.partition("=")
        skip = option.split(".")[0] in options
        if skip:
            skip = not joined
        else:
            kept.append(word)
    return kept


def resume_command(words: list[str], run_name: str) -> str:
    """The command that resumes a run: the same words, naming the run and ``--ckpt_path last``."""
    kept = without_options(words, ("--ckpt_path", "--run_name"))
    return shlex.join(["python", "-m", PACKAGE, *kept, "--run_name", run_name, "--ckpt_path", "last"])


def check_checkpoint(config: Namespace, subcommand: str) -> dict[str, Any]:
    """Resolve ``--ckpt_path last`` and ``best``, read the checkpoint (memory-mapped) once for the
    other checks, and refuse one that cannot serve this run. The checkpoint read, or an empty dict
    for none."""
    if config.ckpt_path is None:
        if subcommand != "fit" and not config.weights:
            raise UsageError(f"{subcommand} needs --ckpt_path, the checkpoint of a trained run")
        return {}
    if config.ckpt_path == "best" and subcommand == "fit":
        raise UsageError("fit --ckpt_path best: a run continues from its latest state, --ckpt_path last")
    if config.ckpt_path in ("last", "best"):
        last = directory.latest_checkpoint(Path(config.runs_dir), config.run_name, config.ckpt_path)
        config.ckpt_path = str(last if config.ckpt_path == "last" else best_checkpoint(last))
    try:
        checkpoint = read_checkpoint(config.ckpt_path)
        check_made_here(checkpoint, config.ckpt_path)  # before LightningCLI imports its classes
    except (FileNotFoundError, ValueError) as error:
        raise UsageError(f"--ckpt_path: {error}") from error
    if "pytorch-lightning_version" not in checkpoint:
        raise UsageError(
            f"--ckpt_path: {config.ckpt_path} is not a Lightning checkpoint; "
            "to start from the weights in it, pass it as --weights"
        )
    if subcommand == "fit":
        _check_same_model(config, checkpoint)
        _keep_the_runs_monitor(config, checkpoint)
    return checkpoint


def weights_preprocessing(path: str) -> dict[str, Any]:
    """The preprocessing that the weights of ``--weights path`` were trained with: the
    checkpoint's ``Preprocessing.describe()``, or an empty dict for a plain ``state_dict``."""
    try:
        return read_checkpoint(path).get("preprocessing") or {}
    except (FileNotFoundError, ValueError) as error:
        raise UsageError(f"--weights: {error}") from error


def best_checkpoint(last: Path) -> Path:
    """The checkpoint that the run of ``last`` kept by its monitored metric, in the run's directory."""
    try:
        best = best_of(read_checkpoint(last))
    except ValueError as error:
        raise UsageError(f"--ckpt_path best: {error}") from error
    if best is None:
        raise UsageError(
            f"--ckpt_path best: the run of {last} kept no best checkpoint (no checkpoint.monitor, or "
            "no validation yet); evaluate its latest state with --ckpt_path last"
        )
    found = last.parent / Path(best).name  # where the run is now, if it has moved
    if not found.is_file():
        raise UsageError(f"--ckpt_path best: no {found}, the best checkpoint {last} names")
    return found


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dictionaries as one, with dotted keys."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    return {
        k: v for key, value in tree.items() for k, v in _flatten(value, f"{prefix}.{key}".lstrip(".")).items()
    }


def _check_same_model(config: Namespace, checkpoint: dict[str, Any]) -> None:
    """Resuming rebuilds the checkpoint's model, so a different model config is a mistake."""
    saved = _flatten(checkpoint.get("hyper_parameters", {}))
    # Sizes left unset are taken from the data later.
    given = _flatten(config.model.init_args.as_dict())
    given = {key: value for key, value in given.items() if value is not None}
    # The checkpoint holds every weight and saves the network's starting weights as null
    # (SupervisedModule.on_save_checkpoint): the file or download to start from is no change.
    given.pop("network.init_args.weights", None)
    differing = sorted(key for key in saved.keys() & given.keys() if saved[key] != given[key])
    if differing:
        raise UsageError(
            f"the model config differs from the one {config.ckpt_path} was trained with, in "
            f"{', '.join(differing)}; resume without changing the model, or start a new run "
            "from its weights with --weights"
        )


def _keep_the_runs_monitor(config: Namespace, checkpoint: dict[str, Any]) -> None:
    """A resumed run keeps its best checkpoint by the metric it started with (a run of v0.2.0
    kept val/acc): Lightning would track another from scratch, forgetting the best epoch so far
    and leaving its file beside the new one's."""
    run = directory.run_of(Path(config.ckpt_path), Path(config.runs_dir))
    kept = kept_by(checkpoint)
    if run is None or config.run_name not in (None, run) or kept is None or not config.checkpoint.monitor:
        return  # a new run from the checkpoint's state keeps its own best checkpoint
    monitor, mode = kept[0], kept[1] or config.checkpoint.mode
    if (monitor, mode) != (config.checkpoint.monitor, config.checkpoint.mode):
        print(
            f"note: run {run} keeps its best checkpoint by {monitor} ({mode}), as it has since it "
            f"started, not by {config.checkpoint.monitor} ({config.checkpoint.mode}); a new run "
            "from its weights (--weights) would keep the other",
            file=sys.stderr,
        )
        config.checkpoint.monitor, config.checkpoint.mode = monitor, mode


def use_checkpoint_data(
    config: Namespace, checkpoint: dict[str, Any], subcommand: str, words: list[str]
) -> None:
    """Evaluate on the data settings the checkpoint was trained with, in its run, apart from the
    ``LOADING_SETTINGS`` given on the command line.

    LightningCLI already rebuilds the model from the checkpoint's hyper-parameters.
    """
    data = dict(checkpoint.get("datamodule_hyper_parameters") or {})
    if "_class_path" in data:
        data.pop("_instantiator", None)
        given = list(dict.fromkeys(word.split("=")[0] for word in words if word.startswith("--data")))
        loading = {
            name: config.data.init_args[name]
            for name in LOADING_SETTINGS
            if {f"--data.{name}", f"--data.init_args.{name}"} & set(given) and name in data
        }
        data = {name: value for name, value in data.items() if name not in loading}
        config.data = Namespace(class_path=data.pop("_class_path"), init_args=Namespace(**data, **loading))
        ignored = [
            option
            for option in given
            if option.removeprefix("--data.").removeprefix("init_args.") not in loading
        ]
        if ignored:
            instead = "to train on other data, start a run from its weights (fit --weights)"
            if subcommand == "predict":
                instead = "give new samples with --inputs"
            print(
                f"warning: {', '.join(ignored)} ignored: {subcommand} uses the data "
                f"{config.ckpt_path} was trained with; {instead}",
                file=sys.stderr,
            )
    config.run_name = config.run_name or directory.run_of(Path(config.ckpt_path), Path(config.runs_dir))


def run_dir(config: Namespace, subcommand: str | None) -> tuple[Path, bool]:
    """The directory this run writes into, and whether it continues a run there; a training run's
    directory is claimed for this process."""
    runs_dir = Path(config.runs_dir)
    if subcommand not in ("fit", None):
        # Beside the checkpoint when it is in a run's directory, wherever that is.
        checkpoint_dir = Path(config.ckpt_path).parent if config.get("ckpt_path") else runs_dir
        parent = runs_dir / config.run_name if config.run_name else runs_dir
        if (checkpoint_dir / "config.yaml").is_file():
            parent = checkpoint_dir
        output_dir = parent / f"{subcommand}-{start_time()}"
        directory.expect_new(output_dir)
        return output_dir, False
    checkpoint_run = directory.run_of(Path(config.ckpt_path), runs_dir) if config.get("ckpt_path") else None
    resumed = checkpoint_run is not None and config.run_name in (None, checkpoint_run)
    config.run_name = config.run_name or checkpoint_run or start_time()
    path = runs_dir / config.run_name
    if subcommand and rank_zero_only.rank == 0:
        directory.claim(path, resumed)
    return path, resumed


def point_outputs(
    config: Namespace, output_dir: Path, resumed: bool, checkpoint: dict[str, Any], subcommand: str | None
) -> None:
    """The run writes into ``output_dir`` and its checkpoints into its run's directory. Each logger
    writes into ``output_dir`` under the run's name; a resumed run, or an evaluation in its run,
    continues the run's own wandb run."""
    config.trainer.default_root_dir = str(output_dir)
    config.checkpoint.dirpath = config.last_checkpoint.dirpath = str(
        Path(config.runs_dir) / config.run_name if config.run_name else output_dir
    )
    # Evaluating a checkpoint in its run's directory adds to that run's wandb run.
    evaluated = subcommand != "fit" and (output_dir.parent / "config.yaml").is_file()
    versions = checkpoint.get("logger_versions", {}) if resumed or evaluated else {}
    entries = config.trainer.logger if isinstance(config.trainer.logger, list) else [config.trainer.logger]
    # One logger, a list, or none (``false``; ``true`` is Lightning's default logger).
    for logger in (entry for entry in entries if isinstance(entry, Namespace)):
        logger.init_args.save_dir = str(output_dir)
        if logger.init_args.get("name") is None:
            logger.init_args.name = config.run_name
        kind = logger.class_path.rsplit(".", 1)[-1]
        continues = resumed or logger.class_path == TRACKING_LOGGER
        if kind == "WandbLogger" and versions.get(kind) and continues:
            logger.init_args.id = versions[kind]  # continue the same wandb run, in its directory
            logger.init_args.save_dir = str(output_dir if resumed else output_dir.parent)
        elif kind == "CSVLogger" and resumed:
            logger.init_args.version = f"resumed-{start_time()}"  # keep the first metrics.csv
