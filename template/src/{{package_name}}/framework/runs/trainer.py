"""What every run's Trainer gets besides what its config names: the project's callbacks, atomic
checkpoint writing, Slurm's environment without Lightning's own requeueing, and a time limit on
DDP's collective operations."""

from datetime import timedelta
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback, DeviceStatsMonitor
from lightning.pytorch.plugins import CheckpointIO
from lightning.pytorch.plugins.environments import ClusterEnvironment, SLURMEnvironment
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

from ..errors import UsageError
from ..utils import MonitorCheck, OutOfMemoryReport, PredictionWriter, ProgressBar, StageTimer, TestReport
from .checkpoints import AtomicCheckpointIO, LastCheckpoint
from .experiments import RECORD_FILE
from .record import ExperimentRecord
from .start import resume_command


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value] if value else []


def callbacks(
    config: Namespace, trainer: Namespace, subcommand: str | None, mode_unknown: bool
) -> list[Callback]:
    """The configured callbacks (``trainer``: the config's objects), then the project's own;
    ``mode_unknown``: checkpoint.monitor is a metric of the user's own, given without its mode."""
    # The bar before the out-of-memory report: on an error, it ends its line before the report prints.
    bar = [ProgressBar()] if trainer.get("enable_progress_bar") is not False else []
    # Lightning calls every hook of every callback, so one that serves a single subcommand joins only
    # that one (or every one, when the caller picks what to run: subcommand None).
    added = [
        StageTimer(),
        ExperimentRecord(RECORD_FILE, described(config)),
        *([PredictionWriter()] if subcommand in ("predict", None) else []),
        *([TestReport()] if subcommand in ("test", None) else []),
        *([MonitorCheck(mode_unknown)] if subcommand in ("fit", None) else []),
        *bar,
        OutOfMemoryReport(),
    ]
    if config.get("device_stats"):
        if not trainer.get("logger"):
            raise UsageError("device_stats needs a logger to write to; trainer.logger is off")
        added.append(DeviceStatsMonitor())
    return [*_as_list(trainer.get("callbacks")), *added]


def plugins(trainer: Namespace) -> list[Any]:
    """The configured plugins, with atomic checkpoint writing and, under Slurm, its environment."""
    chosen = [*_as_list(trainer.get("plugins"))]
    if not any(isinstance(plugin, CheckpointIO) for plugin in chosen):
        chosen.append(AtomicCheckpointIO())
    if SLURMEnvironment.detect() and not any(isinstance(plugin, ClusterEnvironment) for plugin in chosen):
        # scripts/slurm/train.sbatch requeues the job and SIGTERM saves last.ckpt; Lightning's own
        # requeueing would also save a mid-step checkpoint that resuming does not use.
        chosen.append(SLURMEnvironment(auto_requeue=False))
    return chosen


def ddp_strategy(config: Namespace, chosen: Any) -> DDPStrategy | None:
    """The DDP strategy ``chosen`` (as the config names it: a registered name such as ``ddp`` or
    ``ddp_spawn``, a class path, or ``auto`` once Lightning chose DDP for it) built again with
    ``--ddp_timeout_s`` as the longest a collective waits: Lightning's default lets one wait 30
    minutes for a process that is gone. None for any other strategy."""
    if not isinstance(chosen, DDPStrategy):
        return None
    timeout = timedelta(seconds=config.ddp_timeout_s)
    named = config.trainer.get("strategy")
    name = "ddp" if named == "auto" else named
    arguments = {**strategy_arguments(name), "timeout": timeout}
    if isinstance(named, Namespace):  # a class path and its arguments, as configs/trainer/ddp_cpu.yaml
        return type(chosen)(**arguments)
    if not (isinstance(name, str) and name in StrategyRegistry):
        return None
    return StrategyRegistry[name]["strategy"](**arguments)


def strategy_arguments(named: Any) -> dict[str, Any]:
    """The arguments of the strategy as the config names it: a class path's ``init_args``, or those
    a registered name stands for (``ddp_find_unused_parameters_true``'s); none for anything else."""
    if isinstance(named, Namespace):
        return named.init_args.as_dict() if named.get("init_args") else {}
    if isinstance(named, str) and named in StrategyRegistry:
        return StrategyRegistry[named]["init_params"]
    return {}


def finish(built: Trainer, config: Namespace, words: list[str], subcommand: str | None) -> None:
    """Tell ``last.ckpt`` how to resume this run and how long its DDP agreement may wait, and the
    prediction writer how many classes to rank."""
    for callback in built.callbacks:
        if isinstance(callback, LastCheckpoint):
            callback.ddp_timeout = timedelta(seconds=config.ddp_timeout_s)
        if subcommand == "fit" and words and isinstance(callback, LastCheckpoint):
            callback.resume_command = resume_command(words, config.run_name)
        if isinstance(callback, PredictionWriter):
            callback.top_k = config.top_k


def described(config: Namespace) -> dict[str, Any]:
    """What the experiment record says about the run besides its results."""
    model, data = config.model.init_args.as_dict(), config.data.init_args.as_dict()
    network = model.pop("network", None)
    trainer = config.trainer
    kind = (network or config.model)["class_path"].rsplit(".", 1)[-1]
    name = (network or {}).get("init_args", {}).get("name")  # a backbone's network, by timm's name
    return {
        "run_name": config.run_name,
        "model": f"{kind} {name}" if name else kind,
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
