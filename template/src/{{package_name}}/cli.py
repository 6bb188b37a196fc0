"""The command line: ``python -m <package> {fit,validate,test,predict}``, built on LightningCLI.

Every run writes into one directory, ``checkpoints/<run_name>/``: checkpoints, logger files and
the resolved config. Runs that evaluate a checkpoint (validate, test, predict) write into
``<subcommand>-<time>/`` inside the directory of the run that made it.
"""

import os
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from jsonargparse import Namespace
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, RichProgressBar
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_only

from .utils import ExperimentRecord, PredictionWriter, StageTimer

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = PROJECT_ROOT / "configs" / "default.yaml"
RUNS_DIR = Path("checkpoints")
RECORD_FILE = Path("experiments.jsonl")
RUN_NAME_VARIABLE = f"{__package__.upper()}_RUN_NAME"

# The run's config.yaml is saved into its directory before the first checkpoint, which is expected.
warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")


def default_precision() -> str:
    """bf16 mixed precision where the GPU supports it, fp16 mixed on older GPUs, fp32 on CPU."""
    if not torch.cuda.is_available():
        return "32-true"
    return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"


def _timestamp() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S")


def _loggers(logger: Any) -> list[Namespace]:
    if isinstance(logger, Namespace):
        return [logger]
    return [entry for entry in logger or [] if isinstance(entry, Namespace)]


class CLI(LightningCLI):
    """LightningCLI with a checkpoint group, one directory per run and an experiment record."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--run_name",
            type=str | None,
            default=None,
            help="Name of this run's directory under checkpoints/ (default: the start time).",
        )
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.link_arguments("model.init_args.num_classes", "model.init_args.network.init_args.num_classes")

    def _config(self) -> Namespace:
        return self.config[self.subcommand] if self.subcommand else self.config

    def before_instantiate_classes(self) -> None:
        config = self._config()
        run_dir = self._resolve_run_dir(config)
        config.trainer.default_root_dir = str(run_dir)
        config.checkpoint.dirpath = str(RUNS_DIR / config.run_name) if config.run_name else str(run_dir)
        for logger in _loggers(config.trainer.logger):
            logger.init_args.save_dir = str(run_dir)
            if logger.init_args.get("name") is None:
                logger.init_args.name = config.run_name
        if config.trainer.precision is None:
            config.trainer.precision = default_precision()
        self.save_config_kwargs = {"config_filename": "config.yaml", "overwrite": self.subcommand != "fit"}

    def _resolve_run_dir(self, config: Namespace) -> Path:
        """Set ``run_name`` where it is missing and return the directory this run writes into."""
        if self.subcommand in ("fit", None):
            launched = rank_zero_only.rank > 0
            if config.run_name is None:
                # DDP processes started by Lightning re-run this command: they take rank 0's name.
                config.run_name = (launched and os.environ.get(RUN_NAME_VARIABLE)) or _timestamp()
            os.environ[RUN_NAME_VARIABLE] = config.run_name
            run_dir = RUNS_DIR / config.run_name
            if self.subcommand and not launched and run_dir.exists() and any(run_dir.iterdir()):
                raise ValueError(
                    f"{run_dir} already holds a run: choose another --run_name, or leave it out "
                    "to name the run by its start time"
                )
            return run_dir
        checkpoint = Path(config.ckpt_path).resolve() if config.ckpt_path else None
        if config.run_name is None and checkpoint and checkpoint.parent.parent == RUNS_DIR.resolve():
            config.run_name = checkpoint.parent.name
        parent = RUNS_DIR / config.run_name if config.run_name else RUNS_DIR
        return parent / f"{self.subcommand}-{_timestamp()}"

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        config = self._config()
        callbacks = [StageTimer(), ExperimentRecord(RECORD_FILE, self._summary(config)), PredictionWriter()]
        if config.trainer.enable_progress_bar is not False:
            callbacks.append(RichProgressBar())
        if _loggers(config.trainer.logger):
            callbacks.append(LearningRateMonitor(logging_interval="step"))
        trainer_config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        extra = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        return self._instantiate_trainer(trainer_config, extra + callbacks)

    def _summary(self, config: Namespace) -> dict[str, Any]:
        """What the experiment record says about the run besides its results."""
        model, data = config.model.init_args.as_dict(), config.data.init_args.as_dict()
        trainer = config.trainer
        network = model.pop("network", None)
        return {
            "run_name": config.run_name,
            "model": (network or config.model)["class_path"].rsplit(".", 1)[-1],
            "dataset": config.data.class_path.rsplit(".", 1)[-1],
            "seed": config.seed_everything,
            "hparams": {
                **model,
                **data,
                "network": network["init_args"] if network else None,
                "max_epochs": trainer.max_epochs,
                "precision": trainer.precision,
                "accumulate_grad_batches": trainer.accumulate_grad_batches,
                "gradient_clip_val": trainer.gradient_clip_val,
                "devices": trainer.devices,
            },
        }


def main(args: ArgsType = None, run: bool = True) -> CLI:
    """Parse ``args`` (default: the command line), build model, data and trainer, and run.

    ``configs/default.yaml`` is read first; every ``--config`` and ``--key=value`` applies on top.
    Returns the CLI so that tests and notebooks can reach ``cli.trainer`` and ``cli.model``.
    """
    defaults = {"default_config_files": [str(DEFAULT_CONFIG)]} if DEFAULT_CONFIG.is_file() else {}
    subcommand_kwargs = {name: defaults for name in ("fit", "validate", "test", "predict")}
    return CLI(
        args=args,
        run=run,
        parser_kwargs=subcommand_kwargs if run else defaults,
        save_config_kwargs={"overwrite": False},
    )
