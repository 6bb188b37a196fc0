"""The command line: ``python -m <package> {fit,validate,test,predict}``, built on LightningCLI,
and ``serve`` (``framework/serving.py``).

Every run writes into one directory, ``<runs_dir>/<run_name>/`` (``checkpoints/<run_name>/`` by
default; the rules are in ``framework/runs/directory.py``): checkpoints, logger files and the resolved config.
``fit --ckpt_path`` on a checkpoint of a run continues that run in its directory
(``--ckpt_path last`` finds the latest one). Runs that evaluate a checkpoint
(validate, test, predict) rebuild its model and data settings from it, and write into
``<subcommand>-<time>/`` inside the directory of the run that made it.

Here: the options and the subcommands, and the LightningCLI hooks, each of which calls the step
of a run's start that comes at its point (``preparation.py`` reads the steps top to bottom);
``settings.py`` holds the options a run takes and the checks on them, ``runs/`` the life cycle of
a run.
"""

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger
from lightning.pytorch.trainer.states import TrainerStatus
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from . import settings
from .errors import ConfigError, UsageError, message_of
from .preparation import RunStart
from .runs import directory
from .runs.checkpoints import LastCheckpoint
from .runs.interrupts import end_with_parent, received_signal
from .runs.record import ExperimentRecord, pruned
from .runs.start import without_options
from .runs.summary import evaluation_summary, failure_line, fit_summary, predict_summary
from .utils import PredictionWriter
from .utils.console import quiet, take_verbose
from .utils.tracking import end_tracking

PACKAGE = __name__.partition(".")[0]
PROJECT_ROOT = Path(__file__).resolve().parents[3]
# The template's defaults, then the project's own model and data (a file that copier update never
# changes; the variable names another in its place, as the tests do); every --config and
# --key=value applies on top.
DEFAULT_CONFIG = PROJECT_ROOT / "configs" / "default.yaml"
PROJECT_CONFIG = PROJECT_ROOT / "configs" / "project.yaml"
PROJECT_CONFIG_VARIABLE = f"{PACKAGE.upper()}_PROJECT_CONFIG"
SUBCOMMANDS = ("fit", "validate", "test", "predict")
# Each subcommand's description, which --help also lists (settings.Parser): Lightning's own are the
# first lines of its docstrings, which stop mid-sentence.
SUBCOMMAND_HELP = {
    "fit": "Train a model: a new run, or continue a run from its checkpoint with --ckpt_path.",
    "validate": "Evaluate a checkpoint (--ckpt_path) on the validation split.",
    "test": "Evaluate a checkpoint (--ckpt_path) on the test split, with a report of the results.",
    "predict": "Predict with a checkpoint (--ckpt_path): the test split, or the samples of --inputs.",
}
SERVE_HELP = "serve: serve a checkpoint's model over HTTP (serve --help; needs the [serve] extra)."
# The fit's options that its test (--test_after_fit) leaves out: those that choose the run and what
# it starts from, which the test names itself, and the model and data, which it takes from the checkpoint.
NOT_TESTED = ("--ckpt_path", "--run_name", "--weights", "--test_after_fit", "--model", "--data")
quiet()


class CLI(LightningCLI):
    """LightningCLI with one directory per run, exact resuming and an experiment record."""

    test_after: list[str] | None = None  # the words of the test that follows a fit (--test_after_fit)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for option, (kind, default, help) in settings.OPTIONS.items():
            parser.add_argument(f"--{option}", type=kind, default=default, help=help)
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        # Unset unless given: taken from the metric's name for the project's own (RunStart.check).
        parser.set_defaults({"checkpoint.mode": None})
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")

    @contextlib.contextmanager
    def _refusing(self) -> Iterator[None]:
        """Print a refused setting as the parser prints its own errors."""
        try:
            yield
        except (UsageError, directory.RunDirectoryError) as error:
            self.parser.error(str(error))

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        # Checked here, before LightningCLI reads the checkpoint's hyper-parameters.
        super().parse_arguments(parser, args)
        words = list(sys.argv[1:] if args is None else args) if isinstance(args, list | None) else []
        self.start = RunStart(words)
        with self._refusing():
            self.start.check(self._config(), self.config.get("subcommand"))

    def _config(self, config: Any = None) -> Any:
        """This subcommand's part of a config: the parsed one, or ``config_init``'s objects."""
        config = self.config if config is None else config
        subcommand = getattr(self, "subcommand", None) or config.get("subcommand")
        return config[subcommand] if subcommand else config

    def before_instantiate_classes(self) -> None:
        with self._refusing():
            self.save_config_kwargs = self.start.prepare(self.parser, self.config, self.subcommand)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as error:
            # jsonargparse reports a constructor's error inside a list of the types it tried;
            # show the constructor's own message, which names the key.
            cause = error.__cause__
            if not isinstance(cause, ValueError | KeyError | FileNotFoundError) or not cause.args:
                raise
            self.parser.error(message_of(cause))

    def after_instantiate_classes(self) -> None:
        with self._refusing():
            self.start.load_weights(self.model, self._config())

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        config = self._config()
        built = self._trainer(config, kwargs)
        # Built again with the DDP strategy it chose, given --ddp_timeout_s (Lightning takes the
        # timeout only as its strategy is built).
        if (strategy := self.start.with_ddp_timeout(config, built)) is not None:
            built = self._trainer(config, {**kwargs, "strategy": strategy})
        self.start.finish_trainer(built, config, self.subcommand)
        return built

    def _trainer(self, config: Any, kwargs: dict[str, Any]) -> Trainer:
        objects = self._config(self.config_init)["trainer"]
        with self._refusing():
            added = self.start.trainer_arguments(config, objects, self.subcommand)
        try:
            return super().instantiate_trainer(**{**added, **kwargs})
        except MisconfigurationException as error:
            self.parser.error(f"trainer: {error}")

    def _end_run(self) -> bool:
        """Finish what the run left open, and tell whether this process prints its summary."""
        # Lightning's own wandb logger, if configured, leaves its run open for the caller; the next
        # run in this process would otherwise be logged into it.
        for logger in self.trainer.loggers:
            if isinstance(logger, LightningWandbLogger):
                logger.experiment.finish()
        directory.release(Path(self._config().trainer.default_root_dir))
        return self.trainer.is_global_zero

    def _callback(self, kind: type) -> Any:
        return next(callback for callback in self.trainer.callbacks if isinstance(callback, kind))

    def before_fit(self) -> None:
        self.start.before_fit(self.model, self.trainer, self._config())

    def after_fit(self) -> None:
        self.test_after = self._test_after_fit()
        if self._end_run():
            parameters = sum(parameter.numel() for parameter in self.model.parameters())
            line = self._callback(ExperimentRecord).last_line("fit")
            tested = self.test_after is not None
            print(fit_summary(line, PACKAGE, parameters, self.start.network_input, tested))

    def _test_after_fit(self) -> list[str] | None:
        """The words of the test that ``--test_after_fit`` asks for, or None: not asked, or the fit
        was pruned (a fit stopped by a signal or an error never gets here). Read from the trainer
        and the config, which every DDP process has alike, so that all of them test, or none."""
        config = self._config()
        ended = self.trainer.state.status == TrainerStatus.FINISHED and not pruned(self.trainer)
        if not (config.test_after_fit and ended):
            return None
        # As --ckpt_path best would name it; a run that keeps no best checkpoint tests its last.
        return test_words(self.start.words, config.run_name, "best" if config.checkpoint.monitor else "last")

    def after_validate(self) -> None:
        self._print_evaluation("validate", "val/")

    def after_test(self) -> None:
        self._print_evaluation("test", "test/")

    def _print_evaluation(self, stage: str, prefix: str) -> None:
        if self._end_run():
            metrics = {
                name: value
                for name, value in self.trainer.callback_metrics.items()
                if name.startswith(prefix)
            }
            output_dir = Path(self.trainer.default_root_dir)
            print(evaluation_summary(stage, self.trainer.ckpt_path, metrics, output_dir))

    def after_predict(self) -> None:
        if self._end_run():
            writer = self._callback(PredictionWriter)
            print(predict_summary(self.trainer.ckpt_path, writer.written, writer.skipped))


def test_words(words: list[str], run_name: str, checkpoint: str) -> list[str]:
    """The command that tests a run (``checkpoint``: best or last) after the fit of ``words``: the
    same words less ``NOT_TESTED``, the subcommand test, the run's name and ``--ckpt_path``."""
    kept = without_options(words, NOT_TESTED)
    fit = kept.index("fit")
    return [*kept[:fit], "test", *kept[fit + 1 :], "--run_name", run_name, "--ckpt_path", checkpoint]


def _default_config_files() -> list[str]:
    """``configs/default.yaml``, then ``configs/project.yaml`` or the file that the variable
    ``PROJECT_CONFIG_VARIABLE`` names: those of them that exist."""
    project_config = Path(os.environ.get(PROJECT_CONFIG_VARIABLE) or PROJECT_CONFIG)
    if PROJECT_CONFIG_VARIABLE in os.environ and not project_config.is_file():
        print(f"error: {PROJECT_CONFIG_VARIABLE}={project_config}: no such file", file=sys.stderr)
        sys.exit(2)
    return [str(path) for path in (DEFAULT_CONFIG, project_config) if path.is_file()]


def serve(args: list[str]) -> None:
    """``python -m <package> serve``, with one line where LitServe is not installed."""
    try:
        from . import serving
    except ModuleNotFoundError as error:
        if error.name not in ("litserve", "fastapi", "starlette", "uvicorn"):
            raise
        sys.exit(f'error: serve needs LitServe ({error.name} is not installed): pip install -e ".[serve]"')
    serving.main(args)


def main(args: ArgsType = None, run: bool = True) -> CLI:
    """Parse ``args`` (default: the command line), build model, data and trainer, and run.

    ``configs/default.yaml`` is read first, then ``configs/project.yaml``; every ``--config`` and
    ``--key=value`` applies on top. A fit with ``--test_after_fit true`` that ends as it should is
    followed by a test command of its own, in this process (``CLI.test_after``).
    Returns the CLI so that tests and notebooks can reach ``cli.trainer`` and ``cli.model``
    (the fit's, where a test followed).
    """
    if run and "LOCAL_RANK" in os.environ:
        end_with_parent()  # a DDP process started by another: never outlive it
    if run and list(sys.argv[1:2] if args is None else args[:1]) == ["serve"]:
        serve(sys.argv[2:] if args is None else args[1:])
        sys.exit(0)
    args, words = take_verbose(args)
    cli = _command(args, words, run)
    if cli.test_after is not None:  # a command of its own, once the fit's has ended
        if args is None:  # its command line, as if it had been typed (LightningCLI reads sys.argv)
            sys.argv = [sys.argv[0], *cli.test_after]
        _command(None if args is None else cli.test_after, cli.test_after, run)
    return cli


def _command(args: ArgsType, words: list[str], run: bool) -> CLI:
    """Run one command (``words``: its words, without ``--verbose``), ending it as ``main`` says."""
    found = _default_config_files()
    defaults = {"default_config_files": found} if found else {}
    parser_kwargs = {"prog": f"python -m {PACKAGE}", "epilog": SERVE_HELP}
    if run:
        parser_kwargs |= {name: {**defaults, "description": SUBCOMMAND_HELP[name]} for name in SUBCOMMANDS}
    else:
        parser_kwargs |= defaults
    failed = True  # then what the command made and holds no checkpoint goes, so that it can be run again
    try:
        settings.check_config_words(words, PACKAGE, SUBCOMMANDS if run else ())
        cli = CLI(
            args=args,
            run=run,
            parser_kwargs=parser_kwargs,
            save_config_kwargs={"overwrite": False},
            auto_configure_optimizers=False,
            parser_class=settings.Parser,
        )
        failed = False
        return cli
    except SIGTERMException:
        # Stopped by SIGTERM or Ctrl-C, with last.ckpt saved: exit as a process ended by that
        # signal does (143 or 130), not as a finished one.
        sys.exit(128 + (received_signal() or signal.SIGTERM))
    except SystemExit as exit:
        failed = exit.code not in (0, None)
        raise
    except (ConfigError, FloatingPointError, MisconfigurationException, OSError, RuntimeError) as error:
        if (line := failure_line(error, run)) is None:
            raise
        sys.exit(line)
    finally:
        end_tracking()
        directory.end_command(failed)
