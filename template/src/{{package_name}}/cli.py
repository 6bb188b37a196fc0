"""The command line: ``python -m <package> {fit,validate,test,predict}``, built on LightningCLI.

Every run writes into one directory, ``checkpoints/<run_name>/``: checkpoints, logger files and
the resolved config. Runs that evaluate a checkpoint (validate, test, predict) rebuild its model
and data settings from the checkpoint, and write into ``<subcommand>-<time>/`` inside the
directory of the run that made it.
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

from .utils import ExperimentRecord, LastCheckpoint, PredictionWriter, StageTimer

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = PROJECT_ROOT / "configs" / "default.yaml"
RUNS_DIR = Path("checkpoints")
RECORD_FILE = Path("experiments.jsonl")
# Processes that Lightning starts for DDP re-run the command line; they read rank 0's start time here.
START_TIME_VARIABLE = f"{__package__.upper()}_START_TIME"

# The run's config.yaml is saved into its directory before any checkpoint or log, which is expected.
warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty")


def default_precision() -> str:
    """bf16 mixed precision where the GPU supports it, fp16 mixed on older GPUs, fp32 on CPU."""
    if not torch.cuda.is_available():
        return "32-true"
    return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"


def _start_time() -> str:
    if rank_zero_only.rank > 0 and START_TIME_VARIABLE in os.environ:
        return os.environ[START_TIME_VARIABLE]
    os.environ[START_TIME_VARIABLE] = datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.environ[START_TIME_VARIABLE]


def _loggers(logger: Any) -> list[Namespace]:
    """The logger entries of a parsed config: one, a list, or none (``false``; ``true`` is Lightning's)."""
    entries = logger if isinstance(logger, list) else [logger]
    return [entry for entry in entries if isinstance(entry, Namespace)]


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
        if self.subcommand in ("validate", "test", "predict"):
            self._use_checkpoint(config)
        run_dir = self._run_dir(config)
        config.trainer.default_root_dir = str(run_dir)
        config.checkpoint.dirpath = str(RUNS_DIR / config.run_name) if config.run_name else str(run_dir)
        for logger in _loggers(config.trainer.logger):
            logger.init_args.save_dir = str(run_dir)
            if logger.init_args.get("name") is None:
                logger.init_args.name = config.run_name
        if config.trainer.precision is None:
            config.trainer.precision = default_precision()
        self.save_config_kwargs = {"config_filename": "config.yaml", "overwrite": self.subcommand != "fit"}

    def _use_checkpoint(self, config: Namespace) -> None:
        """Check the checkpoint to evaluate, and evaluate on the data settings it was trained with.

        LightningCLI already rebuilds the model from the checkpoint's hyper-parameters.
        """
        if not config.ckpt_path:
            self.parser.error(f"{self.subcommand} needs --ckpt_path, the checkpoint of a trained run")
        checkpoint = Path(config.ckpt_path)
        if not checkpoint.is_file():
            self.parser.error(f"--ckpt_path: no such checkpoint {checkpoint}")
        saved = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
        data = dict(saved.get("datamodule_hyper_parameters") or {})
        if "_class_path" in data:
            data.pop("_instantiator", None)
            config.data = Namespace(class_path=data.pop("_class_path"), init_args=Namespace(**data))
        if config.run_name is None and checkpoint.resolve().parent.parent == RUNS_DIR.resolve():
            config.run_name = checkpoint.resolve().parent.name

    def _run_dir(self, config: Namespace) -> Path:
        """The directory this run writes into; a fit must not reuse one that holds files."""
        if self.subcommand not in ("fit", None):
            parent = RUNS_DIR / config.run_name if config.run_name else RUNS_DIR
            return parent / f"{self.subcommand}-{_start_time()}"
        config.run_name = config.run_name or _start_time()
        run_dir = RUNS_DIR / config.run_name
        if self.subcommand and rank_zero_only.rank == 0 and run_dir.is_dir() and any(run_dir.iterdir()):
            self.parser.error(
                f"{run_dir} already holds a run: choose another --run_name, leave it out to name the "
                "run by its start time, or delete that directory"
            )
        if config.get("ckpt_path") and not Path(config.ckpt_path).is_file():
            self.parser.error(f"--ckpt_path: no such checkpoint {config.ckpt_path}")
        return run_dir

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        config, trainer = self._config(), self._config_init()["trainer"]
        configured = trainer.get("callbacks") or []
        callbacks = [
            *(configured if isinstance(configured, list) else [configured]),
            LastCheckpoint(config.checkpoint.dirpath),
            StageTimer(),
            ExperimentRecord(RECORD_FILE, self._summary(config)),
            PredictionWriter(),
        ]
        if trainer.get("enable_progress_bar") is not False:
            callbacks.append(RichProgressBar())
        if trainer.get("logger"):
            callbacks.append(LearningRateMonitor(logging_interval="step"))
        return super().instantiate_trainer(**{"callbacks": callbacks, **kwargs})

    def _config_init(self) -> Namespace:
        return self.config_init[self.subcommand] if self.subcommand else self.config_init

    def _summary(self, config: Namespace) -> dict[str, Any]:
        """What the experiment record says about the run besides its results."""
        model, data = config.model.init_args.as_dict(), config.data.init_args.as_dict()
        network = model.pop("network", None)
        trainer = config.trainer
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
    parser_kwargs = {"prog": f"python -m {__package__}"}
    if run:
        parser_kwargs |= {name: defaults for name in ("fit", "validate", "test", "predict")}
    else:
        parser_kwargs |= defaults
    return CLI(args=args, run=run, parser_kwargs=parser_kwargs, save_config_kwargs={"overwrite": False})
