"""How a run starts, in the order it happens. The command line (``cli.py``) calls each step from
the LightningCLI hook that comes at that point; the steps call the checks and rules in
``settings.py`` and ``runs/``.

1. ``check``, once the command line is parsed: the settings alone (plain values, refused
   options, the best checkpoint's mode, the run's name and folder) and the checkpoint given as
   ``--ckpt_path``, read once.
2. ``prepare``, before the model, data and trainer are built: an evaluation takes its
   checkpoint's model and data settings; the inputs to predict; the data module is built first,
   so that the model's sizes come from it; the run directory is taken, with its lock, and
   whether the run resumes is settled; the precision is checked; the loggers are pointed into
   the run directory, and the config saved there.
3. ``trainer_arguments``, ``with_ddp_timeout`` and ``finish_trainer``, as the trainer is built:
   the project's callbacks and plugins, DDP's timeout, what ``last.ckpt`` says to resume with.
4. ``load_weights``, once the model is built: ``--weights``.
5. ``before_fit``: the checks that need the built model and trainer; wandb's process starts.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch import LightningModule, Trainer

from . import settings
from .errors import UsageError
from .runs import directory, start, trainer
from .runs.checkpoints import load_weights as load_weights_file
from .utils.best_mode import best_mode
from .utils.console import is_verbose, quiet_evaluation
from .utils.tracking import WandbLogger

EVALUATIONS = ("validate", "test", "predict")


@dataclass
class RunStart:
    """What the steps of one command's start share: its words, its checkpoint, its network's input."""

    words: list[str]
    checkpoint: dict[str, Any] = field(default_factory=dict)  # the one given as --ckpt_path, read once
    network_input: dict[str, Any] = field(default_factory=dict)
    mode_unknown: bool = False  # checkpoint.monitor is a metric of the user's own, without its mode

    def check(self, config: Namespace, subcommand: str | None) -> None:
        settings.plain_values(config)
        settings.refuse_options(config)
        mode = best_mode(config.checkpoint.monitor, config.checkpoint.mode)
        # A metric of the user's own needs its mode: refused once it is seen logged (MonitorCheck),
        # so that a mistyped name is told first.
        self.mode_unknown = mode is None
        config.checkpoint.mode = mode or "min"
        if subcommand:
            if config.run_name is not None:
                directory.check_name(config.run_name)
            directory.check_runs_dir(Path(config.runs_dir))
            self.checkpoint = start.check_checkpoint(config, subcommand)

    def prepare(self, parser: Any, parsed: Namespace, subcommand: str | None) -> dict[str, Any]:
        """Settle the run's settings and directory; return how LightningCLI saves its config."""
        config = parsed[subcommand] if subcommand else parsed
        if subcommand in EVALUATIONS and config.ckpt_path:
            start.use_checkpoint_data(config, self.checkpoint, subcommand, self.words)
        settings.use_inputs(config, subcommand)
        if subcommand == "predict" and config.return_predictions is None:
            config.return_predictions = False  # written as they come (PredictionWriter), not kept
        if config.get("ckpt_path"):
            settings.start_from_checkpoint(config)
        self.network_input = settings.use_network_input(config)
        if (data := settings.build_data(parser, parsed, subcommand)) is not None:
            if self.checkpoint and config.ckpt_path:
                data.restore_fitted(self.checkpoint.get(type(data).__qualname__, {}))
            elif weights := config.get("weights"):
                data.use_weights_preprocessing(start.weights_preprocessing(weights), weights)
            settings.set_sizes(config, data)
        run_dir, resumed = start.run_dir(config, subcommand)
        settings.check_precision(config.trainer)
        start.point_outputs(config, run_dir, resumed, self.checkpoint, subcommand)
        if not is_verbose():
            settings.leave_out_tables(config)
            if subcommand in EVALUATIONS:
                quiet_evaluation()
        return {
            "config_filename": f"config-resumed-{start.start_time()}.yaml" if resumed else "config.yaml",
            "overwrite": subcommand != "fit",
        }

    def trainer_arguments(
        self, config: Namespace, objects: Namespace, subcommand: str | None
    ) -> dict[str, Any]:
        """The trainer's callbacks and plugins: the config's, and the project's own."""
        return {
            "callbacks": trainer.callbacks(config, objects, subcommand, self.mode_unknown),
            "plugins": trainer.plugins(objects),
        }

    @staticmethod
    def with_ddp_timeout(config: Namespace, built: Trainer) -> Any:
        """The DDP strategy the trainer chose, built again with ``--ddp_timeout_s``; None if no DDP."""
        return trainer.ddp_strategy(config, built.strategy)

    def finish_trainer(self, built: Trainer, config: Namespace, subcommand: str | None) -> None:
        trainer.finish(built, config, self.words, subcommand)

    @staticmethod
    def load_weights(model: LightningModule, config: Namespace) -> None:
        if weights := config.get("weights"):
            try:
                load_weights_file(model, weights)
            except (FileNotFoundError, ValueError) as error:
                raise UsageError(f"--weights: {error}") from error

    @staticmethod
    def before_fit(model: LightningModule, built: Trainer, config: Namespace) -> None:
        # Checked before DDP starts its other processes, each of which would print the line too.
        settings.check_unused_parameters(model, built, config.trainer.strategy)
        settings.clip_only_automatic(model, built)
        # wandb's start-up goes on beside the fit's own: under DDP, while the other processes start.
        for logger in built.loggers:
            if isinstance(logger, WandbLogger):
                logger.start()
