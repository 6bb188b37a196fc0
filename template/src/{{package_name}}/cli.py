"""The command line: ``python -m <package> {fit,validate,test,predict}``, built on LightningCLI.

Every run writes into one directory, ``<runs_dir>/<run_name>/`` (``checkpoints/<run_name>/`` by
default; the rules are in ``utils/runs.py``): checkpoints, logger files and the resolved config.
``fit --ckpt_path`` on a checkpoint of a run continues that run in its directory
(``--ckpt_path last`` finds the latest one). Runs that evaluate a checkpoint
(validate, test, predict) rebuild its model and data settings from it, and write into
``<subcommand>-<time>/`` inside the directory of the run that made it.
"""

import difflib
import errno
import importlib
import inspect
import logging
import os
import re
import shlex
import signal
import sys
import warnings
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import torch
from jsonargparse import Namespace
from jsonargparse.typing import PositiveInt
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import DeviceStatsMonitor, ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger
from lightning.pytorch.plugins import CheckpointIO
from lightning.pytorch.plugins.environments import ClusterEnvironment, SLURMEnvironment
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from .data import ArrayDataModule, ImageFolderDataModule
from .errors import ConfigError, message_of
from .models.base import check_task
from .utils import (
    AtomicCheckpointIO,
    ExperimentRecord,
    LastCheckpoint,
    MonitorCheck,
    OutOfMemoryReport,
    PredictionWriter,
    ProgressBar,
    StageTimer,
    TestReport,
    end_with_parent,
    is_out_of_memory,
    load_weights,
    read_checkpoint,
    received_signal,
    runs,
)
from .utils.monitor import kept_by
from .utils.summary import VERBOSE_VARIABLE, evaluation_summary, fit_summary, is_verbose, predict_summary
from .utils.tracking import finish_runs

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = PROJECT_ROOT / "configs" / "default.yaml"
RECORD_FILE = Path("experiments.jsonl")
TRACKING_LOGGER = f"{__package__}.utils.tracking.WandbLogger"
SUBCOMMANDS = ("fit", "validate", "test", "predict")
# Lightning's own descriptions are the first lines of its docstrings, which stop mid-sentence.
SUBCOMMAND_HELP = {
    "fit": "Train a model: a new run, or continue a run from its checkpoint with --ckpt_path.",
    "validate": "Evaluate a checkpoint (--ckpt_path) on the validation split.",
    "test": "Evaluate a checkpoint (--ckpt_path) on the test split, with a report of the results.",
    "predict": "Predict with a checkpoint (--ckpt_path): the test split, or the samples of --inputs.",
}
# Lightning's information lines that nothing follows from: what hardware it found, the seed, the
# checkpoint it restored, how DDP started; the command's summary says what matters of them.
ROUTINE_LINES = re.compile(
    r"(GPU|TPU|HPU) available|Seed set to|`Trainer\.\w+` stopped|Restoring states from|Restored all states"
    r"|Loaded model weights from|LOCAL_RANK: |Initializing distributed|-+\ndistributed_backend="
)
# Processes that Lightning starts for DDP re-run the command line; they read rank 0's start time here.
START_TIME_VARIABLE = f"{__package__.upper()}_START_TIME"
# LightningCLI's own optimizer options would bypass the model's warm-up and schedule.
REFUSED_OPTIONS = {
    "optimizer": "choose the optimizer with model.init_args.optimizer (a torch.optim class, e.g. "
    "--model.init_args.optimizer=SGD), its arguments with model.init_args.optimizer_args, and the "
    "learning rate with model.init_args.lr",
    "lr_scheduler": "choose the schedule with model.init_args.schedule (cosine, linear or constant) "
    "and its warm-up with model.init_args.warmup_steps",
}

# wandb's copy of the console (the run's Logs tab) holds little but the progress bar, redrawn four
# times a second, and each copied write costs the run time; WANDB_CONSOLE=wrap brings it back.
os.environ.setdefault("WANDB_CONSOLE", "off")
# The run's config.yaml is saved into its directory before any checkpoint or log, which is expected.
warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty")
# Deprecated calls made inside Lightning and torchdata, and Lightning's advertisement for its
# cloud logger: nothing a user of this project can act on.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
# Lightning's hint to use srun on any machine where Slurm is installed: scripts/slurm/train.sbatch
# runs training under srun, and a command run outside it is meant to run there.
warnings.filterwarnings("ignore", message="The `srun` command is available on your system but is not used")
logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
    lambda record: "litlogger" not in record.getMessage()
)


def _quiet_routine_lines() -> None:
    def shown(record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or is_verbose() or not ROUTINE_LINES.search(record.getMessage())

    for name in ("rank_zero", "seed", "distributed"):
        for package in ("lightning.pytorch", "lightning.fabric"):
            logging.getLogger(f"{package}.utilities.{name}").addFilter(shown)
    logging.getLogger("lightning.pytorch.accelerators.cuda").addFilter(shown)


_quiet_routine_lines()


def default_precision() -> str:
    """bf16 mixed precision where the GPU supports it, fp16 mixed on older GPUs, fp32 on CPU."""
    if not torch.cuda.is_available():
        return "32-true"
    return "bf16-mixed" if torch.cuda.is_bf16_supported(including_emulation=False) else "16-mixed"


def _start_time() -> str:
    if rank_zero_only.rank > 0 and START_TIME_VARIABLE in os.environ:
        return os.environ[START_TIME_VARIABLE]
    os.environ[START_TIME_VARIABLE] = datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.environ[START_TIME_VARIABLE]


def _loggers(logger: Any) -> list[Namespace]:
    """The logger entries of a parsed config: one, a list, or none (``false``; ``true`` is Lightning's)."""
    entries = logger if isinstance(logger, list) else [logger]
    return [entry for entry in entries if isinstance(entry, Namespace)]


def _resume_command(words: list[str], run_name: str) -> str:
    """The command that resumes a run: the same words, naming the run and ``--ckpt_path last``."""
    kept, skip = [], False
    for word in words:
        option, joined, _ = word.partition("=")
        if skip or option in ("--ckpt_path", "--run_name"):
            skip = not skip and not joined
            continue
        kept.append(word)
    return shlex.join(["python", "-m", __package__, *kept, "--run_name", run_name, "--ckpt_path", "last"])


def _end_tracking() -> None:
    """Finish the wandb runs a failed command left open (Lightning finishes the others) and stop
    wandb's service, so that the next command in this process (in a test or a notebook) starts
    afresh, not in the state this one left."""
    finish_runs()
    wandb = sys.modules.get("wandb")
    if wandb is not None:
        if wandb.run is not None:
            wandb.run.finish(exit_code=1)
        wandb.teardown()


def _has_settings(config_file: Path) -> bool:
    lines = (line.strip() for line in config_file.read_text().splitlines())
    return any(line and not line.startswith("#") for line in lines)


def _is_collective_timeout(error: RuntimeError) -> bool:
    """Whether a collective operation failed because a process waited too long, here or in another
    process (which then closes or resets the connections)."""
    text = str(error).lower()
    signs = ("timed out", "timeout", "connection reset by peer", "connection closed by peer")
    return isinstance(error, torch.distributed.DistError) or any(sign in text for sign in signs)


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dictionaries as one, with dotted keys."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    return {
        k: v for key, value in tree.items() for k, v in _flatten(value, f"{prefix}.{key}".lstrip(".")).items()
    }


def _class_at(class_path: str) -> Any:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name, None)


# What each size the CLI takes from the data counts, as its messages say.
SIZE_NAMES = {"in_features": "input features", "num_classes": "classes", "num_outputs": "regression target"}


def _set_size(settings: Namespace, key: str, size: int | None, what: str) -> None:
    name = key.rpartition(".")[2]
    if settings[name] is None:
        settings[name] = None if size is None else int(size)  # not PositiveInt, which only the model takes
    elif size is not None and settings[name] != size:
        raise ConfigError(
            f"The data has {size} {what} but {key} is {settings[name]}; "
            "leave it unset to take it from the data"
        )


def _mistyped_option(message: str) -> str:
    """jsonargparse's report of an option that a model's or data module's class does not take, as
    one line naming the key and the class's nearest options; any other message as it is."""
    option = re.search(r"Option '(\w+)' is not accepted", message)
    key = re.match(r'Parser key "([\w.]+)"', message)
    classes = re.findall(r"class_path '([\w.]+)'", message[: option.start()]) if option else []
    owner = _class_at(classes[-1]) if classes else None
    if not (option and key and isinstance(owner, type)):
        return message
    nested = re.search(r"NestedArg\(key='([\w.]+)'", message)
    full_key = f"{key[1]}.init_args.{nested[1] if nested else option[1]}"
    names = _options(owner)
    nearest = difflib.get_close_matches(option[1], names)
    hint = f"did you mean {' or '.join(nearest)}?" if nearest else f"it takes {', '.join(names)}"
    return f"{full_key}: {owner.__name__} takes no {option[1]!r}; {hint}"


def _options(owner: type) -> list[str]:
    """The arguments of a class, with those its base classes take through ``**kwargs``."""
    names: dict[str, None] = {}
    variable = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    for klass in owner.__mro__:
        if "__init__" in vars(klass) and not klass.__module__.startswith(("lightning", "torch", "builtins")):
            for parameter in inspect.signature(klass.__init__).parameters.values():
                if parameter.name != "self" and parameter.kind not in variable:
                    names[parameter.name] = None
    return list(names)


class Parser(LightningArgumentParser):
    """Short refusals: one line of usage (``--help`` lists the options) and a mistyped option of a
    class in one line."""

    def print_usage(self, file: Any = None) -> None:
        print(f"usage: {self.prog.replace(' [options]', '')} [options]", file=file)

    def error(self, message: str, ex: Exception | None = None) -> Any:
        # Only the parser that prints rewrites the message; the nested ones' are inside it.
        return super().error(_mistyped_option(message) if self.exit_on_error else message, ex)


class CLI(LightningCLI):
    """LightningCLI with one directory per run, exact resuming and an experiment record."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--run_name",
            type=str | None,
            default=None,
            help="Name of this run's directory under runs_dir (default: the start time).",
        )
        parser.add_argument(
            "--runs_dir",
            type=str,
            default="checkpoints",
            help="The directory that holds one directory per run, relative to where the command runs "
            "(a scratch or shared filesystem, for example).",
        )
        parser.add_argument(
            "--weights",
            type=str | None,
            default=None,
            help="Start from the weights in this file: a checkpoint, or a plain state_dict of the model "
            "or of its network.",
        )
        parser.add_argument(
            "--inputs",
            type=str | None,
            default=None,
            help="predict only: predict the samples in this .npy, .npz or .csv file instead of the "
            "checkpoint's test split (features as in the training data, preprocessed as in training; "
            "labels, if any, are kept).",
        )
        parser.add_argument(
            "--ddp_timeout_s",
            type=PositiveInt,
            default=600,
            help="Seconds a DDP process waits for the others in one collective operation before the run "
            "fails with an error (a process stuck or gone), instead of waiting forever.",
        )
        for option, instead in REFUSED_OPTIONS.items():
            parser.add_argument(f"--{option}", type=Any, default=None, help=f"Not used: {instead}.")
        parser.add_argument(
            "--device_stats",
            type=bool,
            default=False,
            help="Log device statistics (the GPU's memory; CPU and RAM use on CPU) with Lightning's "
            "DeviceStatsMonitor; configs/trainer/device_stats.yaml sets it.",
        )
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        if add_subcommands:
            for choice in self.parser._subcommands_action._choices_actions:
                choice.help = SUBCOMMAND_HELP.get(choice.dest, choice.help)

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        # Checked here, before LightningCLI reads the checkpoint's hyper-parameters.
        super().parse_arguments(parser, args)
        self.words = list(sys.argv[1:] if args is None else args) if isinstance(args, list | None) else []
        self.checkpoint: dict[str, Any] = {}  # the one given as --ckpt_path, read once
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        for option, instead in REFUSED_OPTIONS.items():
            if config.get(option) is not None:
                self.parser.error(f"--{option} is not used by this project: {instead}")
        if subcommand:
            try:
                if config.run_name is not None:
                    runs.check_name(config.run_name)
                self._check_checkpoint(config, subcommand)
            except runs.RunDirectoryError as error:
                self.parser.error(str(error))

    def _check_checkpoint(self, config: Namespace, subcommand: str) -> None:
        """Resolve ``--ckpt_path last``, read the checkpoint (memory-mapped) once for the other
        checks, and refuse one that cannot serve this run."""
        if config.ckpt_path is None:
            if subcommand != "fit" and not config.weights:
                self.parser.error(f"{subcommand} needs --ckpt_path, the checkpoint of a trained run")
            return
        if config.ckpt_path == "last":
            config.ckpt_path = str(runs.latest_checkpoint(Path(config.runs_dir), config.run_name))
        try:
            self.checkpoint = checkpoint = read_checkpoint(config.ckpt_path)
        except (FileNotFoundError, ValueError) as error:
            self.parser.error(f"--ckpt_path: {error}")
        if "pytorch-lightning_version" not in checkpoint:
            self.parser.error(
                f"--ckpt_path: {config.ckpt_path} is not a Lightning checkpoint; "
                "to start from the weights in it, pass it as --weights"
            )
        if subcommand == "fit":
            self._check_same_model(config, checkpoint)
            self._keep_the_runs_monitor(config, checkpoint)

    def _check_same_model(self, config: Namespace, checkpoint: dict[str, Any]) -> None:
        """Resuming rebuilds the checkpoint's model, so a different model config is a mistake."""
        saved = _flatten(checkpoint.get("hyper_parameters", {}))
        # Sizes left unset are taken from the data later.
        given = _flatten(config.model.init_args.as_dict())
        given = {key: value for key, value in given.items() if value is not None}
        differing = sorted(key for key in saved.keys() & given.keys() if saved[key] != given[key])
        if differing:
            self.parser.error(
                f"the model config differs from the one {config.ckpt_path} was trained with, in "
                f"{', '.join(differing)}; resume without changing the model, or start a new run "
                "from its weights with --weights"
            )

    def _keep_the_runs_monitor(self, config: Namespace, checkpoint: dict[str, Any]) -> None:
        """A resumed run keeps its best checkpoint by the metric it started with (a run of v0.2.0
        kept val/acc): Lightning would track another from scratch, forgetting the best epoch so
        far and leaving its file beside the new one's."""
        run = runs.run_of(Path(config.ckpt_path), Path(config.runs_dir))
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

    def _config(self, config: Namespace | None = None) -> Namespace:
        """This subcommand's part of a config: the parsed one, or ``config_init``'s objects."""
        config = self.config if config is None else config
        return config[self.subcommand] if self.subcommand else config

    def before_instantiate_classes(self) -> None:
        config = self._config()
        if self.subcommand in ("validate", "test", "predict") and config.ckpt_path:
            self._use_checkpoint_data(config)
        if config.get("inputs") is not None:
            if self.subcommand != "predict":
                self.parser.error(f"--inputs is for predict, not {self.subcommand}")
            if "predict_path" not in config.data.init_args:
                reader = config.data.class_path
                self.parser.error(f"--inputs: {reader} reads no files of samples (predict_path)")
            config.data.init_args.predict_path = config.inputs
        self._set_sizes(config)
        try:
            run_dir, resumed = self._run_dir(config)
        except runs.RunDirectoryError as error:
            self.parser.error(str(error))
        config.trainer.default_root_dir = str(run_dir)
        config.checkpoint.dirpath = config.last_checkpoint.dirpath = str(
            Path(config.runs_dir) / config.run_name if config.run_name else run_dir
        )
        # Evaluating a checkpoint in its run's directory adds to that run's wandb run.
        evaluated = self.subcommand != "fit" and (run_dir.parent / "config.yaml").is_file()
        versions = self.checkpoint.get("logger_versions", {}) if resumed or evaluated else {}
        for logger in _loggers(config.trainer.logger):
            logger.init_args.save_dir = str(run_dir)
            if logger.init_args.get("name") is None:
                logger.init_args.name = config.run_name
            kind = logger.class_path.rsplit(".", 1)[-1]
            continues = resumed or logger.class_path == TRACKING_LOGGER
            if kind == "WandbLogger" and versions.get(kind) and continues:
                logger.init_args.id = versions[kind]  # continue the same wandb run, in its directory
                logger.init_args.save_dir = str(run_dir if resumed else run_dir.parent)
            elif kind == "CSVLogger" and resumed:
                logger.init_args.version = f"resumed-{_start_time()}"  # keep the first metrics.csv
        if not is_verbose():
            # The fit's summary gives the number of parameters; test's gives the metrics.
            if config.trainer.enable_model_summary is None:
                config.trainer.enable_model_summary = False
            if "verbose" in config:
                config.verbose = False
        if config.trainer.precision is None:
            config.trainer.precision = default_precision()
        self._check_precision(config.trainer)
        self.save_config_kwargs = {
            "config_filename": f"config-resumed-{_start_time()}.yaml" if resumed else "config.yaml",
            "overwrite": self.subcommand != "fit",
        }

    def _set_sizes(self, config: Namespace) -> None:
        """Give the model and its network the data's sizes (classes, input features, outputs) where
        they are unset, and refuse one set by hand that differs from the data's."""
        data_class = _class_at(config.data.class_path)
        sized = (ArrayDataModule, ImageFolderDataModule)
        if not (isinstance(data_class, type) and issubclass(data_class, sized)):
            return  # a data module of another kind: the sizes are as configured
        try:
            data = data_class(**config.data.init_args.as_dict())
        except (KeyError, FileNotFoundError, ValueError) as error:
            self.parser.error(message_of(error))
        check_task(_class_at(config.model.class_path), data.task)
        sizes = {"num_classes": data.num_classes, "in_features": data.num_features}  # reads the data
        model = config.model.init_args
        if "num_classes" in model:
            _set_size(model, "model.init_args.num_classes", sizes["num_classes"], "classes")
            sizes["num_classes"] = model.num_classes
        # A network with num_outputs (a regression project's MLP) gives one per class on classes.
        sizes["num_outputs"] = 1 if data.task == "regression" else sizes["num_classes"]
        network = model.get("network")
        if isinstance(network, Namespace) and isinstance(network.get("init_args"), Namespace):
            # A size left at the network's own default counts as unset (an MLP written before the
            # sizes came from the data has 64 and 10).
            parameters = inspect.signature(_class_at(network.class_path)).parameters
            for key, value in sizes.items():
                if key in network.init_args and value is not None:
                    if key in parameters and network.init_args[key] == parameters[key].default:
                        network.init_args[key] = None
                    on_classes = key == "num_outputs" and data.task != "regression"
                    what = "classes" if on_classes else SIZE_NAMES[key]
                    _set_size(network.init_args, f"model.init_args.network.init_args.{key}", value, what)

    def _check_precision(self, trainer: Namespace) -> None:
        """Refuse a precision the device cannot run, which Lightning would silently replace."""
        on_gpu = torch.cuda.is_available() and trainer.accelerator in ("auto", "gpu", "cuda")
        precision = str(trainer.precision)
        if precision.startswith("16") and not on_gpu:
            self.parser.error(
                f"trainer.precision={precision} needs a CUDA GPU (float16 autocast does not run on CPU); "
                "use bf16-mixed or 32-true"
            )
        if (
            precision.startswith("bf16")
            and on_gpu
            and not torch.cuda.is_bf16_supported(including_emulation=False)
        ):
            self.parser.error(f"trainer.precision={precision}: this GPU has no bfloat16; use 16-mixed")

    def _use_checkpoint_data(self, config: Namespace) -> None:
        """Evaluate on the data settings the checkpoint was trained with.

        LightningCLI already rebuilds the model from the checkpoint's hyper-parameters.
        """
        data = dict(self.checkpoint.get("datamodule_hyper_parameters") or {})
        if "_class_path" in data:
            data.pop("_instantiator", None)
            config.data = Namespace(class_path=data.pop("_class_path"), init_args=Namespace(**data))
            ignored = dict.fromkeys(word.split("=")[0] for word in self.words if word.startswith("--data"))
            if ignored:
                instead = "to train on other data, start a run from its weights (fit --weights)"
                if self.subcommand == "predict":
                    instead = "give new samples with --inputs"
                print(
                    f"warning: {', '.join(ignored)} ignored: {self.subcommand} uses the data "
                    f"{config.ckpt_path} was trained with; {instead}",
                    file=sys.stderr,
                )
        config.run_name = config.run_name or runs.run_of(Path(config.ckpt_path), Path(config.runs_dir))

    def _run_dir(self, config: Namespace) -> tuple[Path, bool]:
        """The directory this run writes into, and whether it continues a run there; a training
        run's directory is claimed for this process (see ``utils/runs.py``)."""
        runs_dir = Path(config.runs_dir)
        if self.subcommand not in ("fit", None):
            # Beside the checkpoint when it is in a run's directory, wherever that is.
            checkpoint_dir = Path(config.ckpt_path).parent if config.get("ckpt_path") else runs_dir
            parent = runs_dir / config.run_name if config.run_name else runs_dir
            if (checkpoint_dir / "config.yaml").is_file():
                parent = checkpoint_dir
            output_dir = parent / f"{self.subcommand}-{_start_time()}"
            runs.expect_new(output_dir)
            return output_dir, False
        checkpoint_run = runs.run_of(Path(config.ckpt_path), runs_dir) if config.get("ckpt_path") else None
        resumed = checkpoint_run is not None and config.run_name in (None, checkpoint_run)
        config.run_name = config.run_name or checkpoint_run or _start_time()
        run_dir = runs_dir / config.run_name
        if self.subcommand and rank_zero_only.rank == 0:
            runs.claim(run_dir, resumed)
        return run_dir, resumed

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
        weights = self._config().get("weights")
        if weights:
            try:
                load_weights(self.model, weights)
            except (FileNotFoundError, ValueError) as error:
                self.parser.error(f"--weights: {error}")

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        config, trainer = self._config(), self._config(self.config_init)["trainer"]
        configured = trainer.get("callbacks") or []
        # Lightning calls every hook of every callback, so the ones that serve a single subcommand
        # join only that one (or all, when the caller picks what to run).
        single = {"predict": PredictionWriter, "test": TestReport, "fit": MonitorCheck}
        callbacks = [
            *(configured if isinstance(configured, list) else [configured]),
            StageTimer(),
            ExperimentRecord(RECORD_FILE, self._summary(config)),
            *(callback() for subcommand, callback in single.items() if self.subcommand in (subcommand, None)),
            OutOfMemoryReport(),
        ]
        if config.get("device_stats"):
            if not trainer.get("logger"):
                self.parser.error("device_stats needs a logger to write to; trainer.logger is off")
            callbacks.append(DeviceStatsMonitor())
        if trainer.get("enable_progress_bar") is not False:
            callbacks.append(ProgressBar())
        configured = trainer.get("plugins") or []
        plugins = configured if isinstance(configured, list) else [configured]
        if not any(isinstance(plugin, CheckpointIO) for plugin in plugins):
            plugins = [*plugins, AtomicCheckpointIO()]
        if SLURMEnvironment.detect() and not any(
            isinstance(plugin, ClusterEnvironment) for plugin in plugins
        ):
            # scripts/slurm/train.sbatch requeues the job and SIGTERM saves last.ckpt; Lightning's own
            # requeueing would also save a mid-step checkpoint that resuming does not use.
            plugins = [*plugins, SLURMEnvironment(auto_requeue=False)]
        try:
            built = super().instantiate_trainer(**{"callbacks": callbacks, "plugins": plugins, **kwargs})
        except MisconfigurationException as error:
            self.parser.error(f"trainer: {error}")
        if isinstance(built.strategy, DDPStrategy):
            # Lightning's default lets a collective wait 30 minutes for a process that is gone.
            built.strategy._timeout = timedelta(seconds=config.ddp_timeout_s)
        if self.subcommand == "fit" and self.words:
            for callback in built.callbacks:
                if isinstance(callback, LastCheckpoint):
                    callback.resume_command = _resume_command(self.words, config.run_name)
        return built

    def _end_run(self) -> bool:
        """Finish what the run left open, and tell whether this process prints its summary."""
        # Lightning's own wandb logger, if configured, leaves its run open for the caller; the next
        # run in this process would otherwise be logged into it.
        for logger in self.trainer.loggers:
            if isinstance(logger, LightningWandbLogger):
                logger.experiment.finish()
        runs.release(Path(self._config().trainer.default_root_dir))
        return self.trainer.is_global_zero

    def _callback(self, kind: type) -> Any:
        return next(callback for callback in self.trainer.callbacks if isinstance(callback, kind))

    def after_fit(self) -> None:
        if self._end_run():
            parameters = sum(parameter.numel() for parameter in self.model.parameters())
            print(fit_summary(self._callback(ExperimentRecord).last_line("fit"), __package__, parameters))

    def after_validate(self) -> None:
        self._print_evaluation("validate", "val/")

    def after_test(self) -> None:
        self._print_evaluation("test", "test/")

    def _print_evaluation(self, stage: str, prefix: str) -> None:
        if self._end_run():
            metrics = self.trainer.callback_metrics
            metrics = {name: value for name, value in metrics.items() if name.startswith(prefix)}
            output_dir = Path(self.trainer.default_root_dir)
            print(evaluation_summary(stage, self.trainer.ckpt_path, metrics, output_dir))

    def after_predict(self) -> None:
        if self._end_run():
            print(predict_summary(self.trainer.ckpt_path, self._callback(PredictionWriter).written))

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
    if run and "LOCAL_RANK" in os.environ:
        end_with_parent()  # a DDP process started by another: never outlive it
    words = list(sys.argv[1:] if args is None else args) if isinstance(args, list | None) else []
    if "--verbose" in words:
        words.remove("--verbose")
        os.environ[VERBOSE_VARIABLE] = "1"
        if args is None:
            sys.argv = [sys.argv[0], *words]
        else:
            args = words
    first = next((index for index, word in enumerate(words) if word in SUBCOMMANDS), len(words))
    if run and any(word in ("-c", "--config") or word.startswith("--config=") for word in words[:first]):
        sys.exit(f"error: put --config after the subcommand, e.g. python -m {__package__} fit --config ...")
    for option, value in zip(words, [*words[1:], ""], strict=True):
        path = Path(value if option in ("-c", "--config") else option.removeprefix("--config="))
        if option.startswith(("-c", "--config")) and path.is_file() and not _has_settings(path):
            sys.exit(f"error: --config {path} holds no settings (it is empty or all comments)")
    defaults = {"default_config_files": [str(DEFAULT_CONFIG)]} if DEFAULT_CONFIG.is_file() else {}
    parser_kwargs = {"prog": f"python -m {__package__}"}
    if run:
        parser_kwargs |= {name: {**defaults, "description": SUBCOMMAND_HELP[name]} for name in SUBCOMMANDS}
    else:
        parser_kwargs |= defaults
    failed = True  # then what the command made and holds no checkpoint goes, so that it can be run again
    try:
        cli = CLI(
            args=args,
            run=run,
            parser_kwargs=parser_kwargs,
            save_config_kwargs={"overwrite": False},
            auto_configure_optimizers=False,
            parser_class=Parser,
        )
        failed = False
        return cli
    except ConfigError as error:
        sys.exit(f"error: {error}")
    except (FloatingPointError, MisconfigurationException) as error:
        sys.exit(f"error: {error}")
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        sys.exit(f"error: {error.strerror}")
    except SIGTERMException:
        # Stopped by SIGTERM or Ctrl-C, with last.ckpt saved: exit as a process ended by that
        # signal does (143 or 130), not as a finished one.
        sys.exit(128 + (received_signal() or signal.SIGTERM))
    except SystemExit as exit:
        failed = exit.code not in (0, None)
        raise
    except RuntimeError as error:
        if run and is_out_of_memory(error):
            # OutOfMemoryReport has printed where and what to change, and saved what it could.
            sys.exit(f"error: out of memory ({str(error).splitlines()[0]})")
        if run and _is_collective_timeout(error):
            sys.exit(
                "error: a DDP process waited longer than --ddp_timeout_s for the others in a collective "
                f"operation; one is stuck or gone ({str(error).splitlines()[0]})"
            )
        raise
    finally:
        _end_tracking()
        runs.end_command(failed)
