"""The options a run takes besides LightningCLI's, and the checks on its settings made before
the model is built: refused and mistyped options (``Parser``), the sizes taken from the data (its
data module is built first, once), the precision the device can run, and ``--config`` files."""

import ast
import difflib
import enum
import importlib
import importlib.metadata
import inspect
import itertools
import re
import sys
from pathlib import Path
from typing import Any

import torch
import yaml
from jsonargparse import Namespace
from jsonargparse.typing import PositiveInt
from lightning.pytorch.cli import LightningArgumentParser

from .data import SupervisedDataModule, gives_sizes
from .errors import ConfigError, UsageError, message_of
from .models.base import SupervisedModule, check_task
from .runs.directory import RUNS_DIR
from .runs.trainer import strategy_arguments

# LightningCLI's own optimizer options would bypass the model's warm-up and schedule.
REFUSED_OPTIONS = {
    "optimizer": "choose the optimizer with model.init_args.optimizer (a torch.optim class, e.g. "
    "--model.init_args.optimizer=SGD), its arguments with model.init_args.optimizer_args, and the "
    "learning rate with model.init_args.lr",
    "lr_scheduler": "choose the schedule with model.init_args.schedule (cosine, linear or constant) "
    "and its warm-up with model.init_args.warmup_steps",
}
# The options a run takes besides LightningCLI's: their type, default and help.
OPTIONS = {
    "run_name": (str | None, None, "Name of this run's directory under runs_dir (default: the start time)."),
    "runs_dir": (
        str,
        str(RUNS_DIR),
        "The directory that holds one directory per run, relative to where the command runs "
        "(a scratch or shared filesystem, for example).",
    ),
    "weights": (
        str | None,
        None,
        "Start from the weights in this file: a checkpoint, or a plain state_dict of the model "
        "or of its network.",
    ),
    "inputs": (
        str | None,
        None,
        "predict only: predict these samples instead of the checkpoint's test split. A table "
        "model takes a .npy, .npz or .csv file (features as in the training data, preprocessed as "
        "in training; labels, if any, are kept); an image model an image file, a folder of images "
        "at any depth, or a glob (quoted; ** for any depth).",
    ),
    "top_k": (
        PositiveInt,
        3,
        "predict only: write the k most probable classes of each sample with their probabilities "
        "(at most every class).",
    ),
    "ddp_timeout_s": (
        PositiveInt,
        600,
        "Seconds a DDP process waits for the others in one collective operation before the run fails "
        "with an error (a process stuck or gone), instead of waiting forever.",
    ),
    "test_after_fit": (
        bool,
        False,
        "fit only: once the fit has ended as it should (not interrupted, pruned or failed), test it in "
        "the same process, as test --ckpt_path best --run_name <run> would with the fit's other "
        "options (--ckpt_path last where checkpoint.monitor is null). Off by default: the test split "
        "is the held-out estimate, and a test after every fit (every trial of a sweep, every fold) "
        "invites choosing settings by the test score; choose them by the validation score.",
    ),
    **{option: (Any, None, f"Not used: {instead}.") for option, instead in REFUSED_OPTIONS.items()},
    "device_stats": (
        bool,
        False,
        "Log device statistics (the GPU's memory; CPU and RAM use on CPU) with Lightning's "
        "DeviceStatsMonitor; configs/trainer/device_stats.yaml sets it.",
    ),
}

# A dump of a config with the values left unset (the defaults, and None), as LightningCLI dumps
# one: skip_none=False before jsonargparse 4.49 named it skip_unset.
_JSONARGPARSE = tuple(int(part) for part in importlib.metadata.version("jsonargparse").split(".")[:2])
KEEP_UNSET = {"skip_unset" if _JSONARGPARSE >= (4, 49) else "skip_none": False}
# What each size taken from the data counts, as the messages say.
NETWORK_INPUT = ("image_size", "interpolation", "mean", "std")
SIZE_NAMES = {
    "in_features": "input features",
    "num_classes": "classes",
    "num_outputs": "regression target",
    "vocab_size": "tokens in its vocabulary",
    "max_length": "tokens per text at most",
}
# The sizes a text data module gives besides those every one gives (framework/data/text.py).
TOKEN_SIZES = ("vocab_size", "max_length")
OUTPUTS = {"classification": "num_classes", "regression": "num_outputs"}  # what a network's outputs are


class Parser(LightningArgumentParser):
    """Short refusals: one line of usage (``--help`` lists the options) and a mistyped option of a
    class in one line."""

    def print_usage(self, file: Any = None) -> None:
        print(f"usage: {self.prog.replace(' [options]', '')} [options]", file=file)

    def error(self, message: str, ex: Exception | None = None) -> Any:
        # Only the parser that prints rewrites the message; the nested ones' are inside it.
        return super().error(unlisted_choice(mistyped_option(message)) if self.exit_on_error else message, ex)

    def add_subcommands(self, *args: Any, **kwargs: Any) -> Any:
        return _DescribedSubcommands(super().add_subcommands(*args, **kwargs))


class _DescribedSubcommands:
    """The subcommands as added to a parser, each listed in ``--help`` by its own parser's
    description (``parser_kwargs``). LightningCLI lists the first line of the Trainer method's
    docstring instead, which stops mid-sentence."""

    def __init__(self, subcommands: Any) -> None:
        self.subcommands = subcommands

    def add_subcommand(self, name: str, parser: Any, **kwargs: Any) -> Any:
        return self.subcommands.add_subcommand(name, parser, **{**kwargs, "help": parser.description})

    def __getattr__(self, name: str) -> Any:
        return getattr(self.subcommands, name)


def plain_values(config: Namespace) -> None:
    """Make each value of a constrained type (a ``PositiveFloat`` and the like, which checked
    itself as it was read) a plain number or string. jsonargparse carries a model's arguments over
    to another class given by ``class_path`` alone (a module of one's own, after
    configs/project.yaml's model), and there such a value, under a plain ``float``, could not be
    written to the run's config.yaml."""
    for key, value in list(config.items()):
        if isinstance(value, list):
            config[key] = [_plain(item) for item in value]
        else:
            config[key] = _plain(value)


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):  # an IntEnum or a str Enum member is the member jsonargparse wants
        return value
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return value if type(value) is kind else kind(value)
    return value


def refuse_options(config: Namespace) -> None:
    for option, instead in REFUSED_OPTIONS.items():
        if config.get(option) is not None:
            raise UsageError(f"--{option} is not used by this project: {_advice(config, instead)}")


def _advice(config: Namespace, shipped: str) -> str:
    """What to do instead of LightningCLI's optimizer options: ``shipped`` for the project's models,
    which take their optimizer and schedule as arguments; for a module of one's own, its own way."""
    class_path = (config.get("model") or Namespace()).get("class_path")
    model = class_at(class_path) if isinstance(class_path, str) else None
    if not isinstance(model, type) or issubclass(model, SupervisedModule):  # the project's models
        return shipped
    name = model.__name__
    return (
        f"{name} builds its optimizer and schedule in its configure_optimizers; give their settings as "
        f"arguments of {name}, set with model.init_args"
    )


def check_config_words(words: list[str], package: str, subcommands: tuple[str, ...]) -> None:
    """Refuse a ``--config`` before the subcommand (when ``subcommands`` are taken), and a config
    file without settings."""
    first = next((index for index, word in enumerate(words) if word in subcommands), len(words))
    if subcommands and any(
        word in ("-c", "--config") or word.startswith("--config=") for word in words[:first]
    ):
        raise ConfigError(f"put --config after the subcommand, e.g. python -m {package} fit --config ...")
    for option, value in itertools.pairwise([*words, ""]):
        path = Path(value if option in ("-c", "--config") else option.removeprefix("--config="))
        if option.startswith(("-c", "--config")) and path.is_file() and not _has_settings(path):
            raise ConfigError(f"--config {path} holds no settings (it is empty or all comments)")


def _has_settings(config_file: Path) -> bool:
    lines = (line.strip() for line in config_file.read_text().splitlines())
    return any(line and not line.startswith("#") for line in lines)


def use_inputs(config: Namespace, subcommand: str | None) -> None:
    """Point the data module's ``predict_path`` at ``--inputs``, which only predict takes."""
    if config.get("inputs") is None:
        return
    if subcommand != "predict":
        raise UsageError(f"--inputs is for predict, not {subcommand}")
    if "predict_path" not in config.data.init_args:
        raise UsageError(f"--inputs: {config.data.class_path} reads no files of samples (predict_path)")
    config.data.init_args.predict_path = config.inputs


def leave_out_tables(config: Namespace) -> None:
    """No model summary or metrics table: the fit's summary gives the number of parameters, and
    test's its metrics."""
    if config.trainer.enable_model_summary is None:
        config.trainer.enable_model_summary = False
    if "verbose" in config:
        config.verbose = False


def default_precision() -> str:
    """bf16 mixed precision where the GPU supports it, fp16 mixed on older GPUs, fp32 on CPU."""
    if not torch.cuda.is_available():
        return "32-true"
    return "bf16-mixed" if torch.cuda.is_bf16_supported(including_emulation=False) else "16-mixed"


def check_precision(trainer: Namespace) -> None:
    """Set the default precision, and refuse one the device cannot run, which Lightning would
    silently replace."""
    if trainer.precision is None:
        trainer.precision = default_precision()
    on_gpu = torch.cuda.is_available() and trainer.accelerator in ("auto", "gpu", "cuda")
    precision = str(trainer.precision)
    if precision.startswith("16") and not on_gpu:
        raise UsageError(
            f"trainer.precision={precision} needs a CUDA GPU (float16 autocast does not run on CPU); "
            "use bf16-mixed or 32-true"
        )
    if (
        precision.startswith("bf16")
        and on_gpu
        and not torch.cuda.is_bf16_supported(including_emulation=False)
    ):
        raise UsageError(f"trainer.precision={precision}: this GPU has no bfloat16; use 16-mixed")


def build_data(
    parser: LightningArgumentParser, config: Namespace, subcommand: str | None
) -> SupervisedDataModule | None:
    """The run's data module, built before the model so that the model's sizes can be read from it
    (``set_sizes``), and handed to LightningCLI in place of a second one, so the data is read once.
    None for a data module that gives no sizes (``framework/data/contract.py``), which LightningCLI builds.

    It is built as LightningCLI builds one: its hyper-parameters are the config's, with its class
    path, so that test and predict rebuild it from a checkpoint.
    """
    given = config[subcommand].data if subcommand else config.data
    data_class = class_at(given.class_path)
    if not gives_sizes(data_class):
        return None
    dump = yaml.safe_load(parser.dump(config, skip_link_targets=False, **KEEP_UNSET))
    dumped = (dump[subcommand] if subcommand else dump)["data"]
    hparams = {"_class_path": dumped["class_path"], **dumped.get("init_args", {})}
    try:
        data = data_class(**given.init_args.as_dict())
    except (KeyError, FileNotFoundError, ValueError) as error:
        raise UsageError(message_of(error)) from error
    # What the checkpoint keeps is the config's, with the class path and how to build it; what the
    # module filled in its __init__ (an argument left None, one an old checkpoint lacks) stays.
    filled = dict(data.hparams)
    data.save_hyperparameters({**hparams, "_instantiator": "lightning.pytorch.cli.instantiate_module"})
    for name, value in filled.items():
        if data.hparams.get(name) is None:
            data.hparams[name] = value
    parser.add_instantiator(_Built(data), data_class, subclasses=False, prepend=True)
    return data


class _Built:
    """An instantiator for the parser that gives an object already built (one that pickles, since
    ``ddp_spawn`` sends the parser to its processes)."""

    def __init__(self, built: Any) -> None:
        self.built = built

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.built


def check_unused_parameters(model: Any, trainer: Any, strategy: Any) -> None:
    """Refuse ``freeze_epochs`` under DDP without ``find_unused_parameters`` (``strategy``: as the
    config names it): DDP waits for the gradient of every parameter, unless told to find those
    without one."""
    finds_unused = strategy_arguments(strategy).get("find_unused_parameters")
    processes = trainer.num_devices * trainer.num_nodes
    if getattr(model, "hparams", {}).get("freeze_epochs") and processes > 1 and not finds_unused:
        raise ConfigError(
            "model.init_args.freeze_epochs with DDP needs find_unused_parameters: set "
            "trainer.strategy.init_args.find_unused_parameters=true, or "
            "trainer.strategy=ddp_find_unused_parameters_true"
        )


def clip_only_automatic(model: Any, trainer: Any) -> None:
    """Leave gradient clipping to a module that optimizes by hand. Lightning clips for automatic
    optimization only, and refuses to start such a module with ``trainer.gradient_clip_val`` set,
    which configs/default.yaml sets for every run: the setting is dropped, and that said once."""
    if model.automatic_optimization or not trainer.gradient_clip_val:
        return
    if trainer.is_global_zero:
        name = type(model).__name__
        print(
            f"warning: {name} optimizes by hand (automatic_optimization = False), so "
            f"trainer.gradient_clip_val={trainer.gradient_clip_val} (configs/default.yaml) is not applied: "
            "clip in its training_step with self.clip_gradients, and set trainer.gradient_clip_val: null in "
            "its config to leave out this line",
            file=sys.stderr,
        )
    trainer.gradient_clip_val = None


def start_from_checkpoint(config: Namespace) -> None:
    """Build a network whose weights a checkpoint restores without its starting weights (a
    backbone's file, which may be gone, or a download)."""
    network = config.model.init_args.get("network") if config.model.get("init_args") else None
    if isinstance(network, Namespace) and network.get("init_args") and network.init_args.get("weights"):
        network.init_args.weights = None


def use_network_input(config: Namespace) -> dict[str, Any]:
    """Give the data module the input its network was trained on where the config leaves it unset
    (null): a pretrained backbone's image size, interpolation, mean and std. What was taken."""
    network = config.model.init_args.get("network") if config.model.get("init_args") else None
    data = config.data.get("init_args")
    if not (isinstance(network, Namespace) and isinstance(data, Namespace)):
        return {}
    own_input = getattr(class_at(network.class_path), "input_config", None)
    unset = [key for key in NETWORK_INPUT if key in data and data[key] is None]
    if own_input is None or not unset:
        return {}
    values = own_input(**network.get("init_args", Namespace()).as_dict())
    taken = {key: values[key] for key in unset}
    for key, value in taken.items():
        data[key] = value
    return taken


def set_sizes(config: Namespace, data: SupervisedDataModule) -> None:
    """Give the model and its network the sizes of ``data``, the run's data module (classes, input
    features, outputs, a text's tokens), where they are unset, and refuse one set by hand that
    differs from the data's."""
    check_task(class_at(config.model.class_path), data.task)
    sizes = {"num_classes": data.num_classes, "in_features": data.num_features}  # reads the data
    model = config.model.init_args
    if "num_classes" in model:
        _set_size(model, "model.init_args.num_classes", sizes["num_classes"], "classes")
        sizes["num_classes"] = model.num_classes
    # A network's outputs, num_classes or num_outputs by its own name: one per class, or one target.
    outputs = 1 if data.task == "regression" else sizes["num_classes"]
    sizes["num_classes"] = sizes["num_outputs"] = outputs
    sizes |= {key: getattr(data, key, None) for key in TOKEN_SIZES}
    network = model.get("network")
    if isinstance(network, Namespace) and isinstance(network.get("init_args"), Namespace):
        _set_network_sizes(network, sizes, data.task)


def _set_network_sizes(network: Namespace, sizes: dict[str, int | None], task: str) -> None:
    # A size left at the network's own default counts as unset (a network written before the sizes
    # came from the data has its own defaults there).
    parameters = inspect.signature(class_at(network.class_path)).parameters
    for key, value in sizes.items():
        if key in network.init_args and value is not None:
            if key in parameters and network.init_args[key] == parameters[key].default:
                network.init_args[key] = None
            what = SIZE_NAMES[OUTPUTS[task]] if key in OUTPUTS.values() else SIZE_NAMES[key]
            _set_size(network.init_args, f"model.init_args.network.init_args.{key}", value, what)


def _set_size(settings: Namespace, key: str, size: int | None, what: str) -> None:
    name = key.rpartition(".")[2]
    if settings[name] is None:
        settings[name] = None if size is None else int(size)  # not PositiveInt, which only the model takes
    elif size is not None and settings[name] != size:
        raise ConfigError(
            f"The data has {size} {what} but {key} is {settings[name]}; "
            "leave it unset to take it from the data"
        )


def class_at(class_path: str) -> Any:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name, None)


def mistyped_option(message: str) -> str:
    """jsonargparse's report of an option that a model's or data module's class does not take, as
    one line naming the key and the class's nearest options; any other message as it is."""
    option = re.search(r"Option '(\w+)' is not accepted", message)
    key = re.match(r'Parser key "([\w.]+)"', message)
    classes = re.findall(r"class_path '([\w.]+)'", message[: option.start()]) if option else []
    owner = class_at(classes[-1]) if classes else None
    if not (option and key and isinstance(owner, type)):
        return message
    nested = re.search(r"NestedArg\(key='([\w.]+)'", message)
    full_key = f"{key[1]}.init_args.{nested[1] if nested else option[1]}"
    names = _options(owner)
    nearest = difflib.get_close_matches(option[1], names)
    hint = f"did you mean {' or '.join(nearest)}?" if nearest else f"it takes {', '.join(names)}"
    return f"{full_key}: {owner.__name__} takes no {option[1]!r}; {hint}"


def unlisted_choice(message: str) -> str:
    """jsonargparse's report of a value that is not among the choices (a ``Literal``, perhaps or
    None) of an option of a model's or data module's class, as one line naming the key and the
    choices; any other message as it is."""
    outer = re.match(r'Parser key "(\w+)":', message)
    inner = re.findall(r'\n\s+Parser key "(\w+)":', message)
    if not (outer and len(inner) == 1):
        return message
    within = message[message.index(f'Parser key "{inner[0]}"') :]
    # The types the value was checked against, less the last: the class's own alternative, None.
    expected = re.findall(r"Expected a (.+?)(?:\. Got value: .*)?$", within, re.MULTILINE)[:-1]
    literals = [
        kind.removeprefix("typing.Literal[")[:-1] for kind in expected if kind.startswith("typing.Literal[")
    ]
    if not literals or len(literals) + expected.count("<class 'NoneType'>") < len(expected):
        return message
    try:
        choices = [str(choice) for literal in literals for choice in ast.literal_eval(f"[{literal}]")]
    except (ValueError, SyntaxError):  # choices that are not Python literals (an Enum's members)
        return message
    choices += ["null"] * ("<class 'NoneType'>" in expected)
    value = re.search(r"(?:Got|Given) value: (.*)$", within, re.MULTILINE)[1]
    return f"{outer[1]}.init_args.{inner[0]}: '{value}' is not one of {', '.join(choices)}"


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
