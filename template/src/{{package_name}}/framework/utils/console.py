"""What a command prints besides its summary. By default: the progress bar, warnings and errors;
``--verbose``, or ``<PACKAGE>_VERBOSE=1``, brings back Lightning's information lines, its model
summary and metrics tables, and wandb's lines."""

import logging
import os
import re
import sys
import warnings
from typing import Any

# Set by --verbose, and seen by the processes a command starts (DDP's, wandb's) too.
VERBOSE_VARIABLE = f"{__name__.partition('.')[0].upper()}_VERBOSE"
# Lightning's information lines that nothing follows from: what hardware it found, the seed, the
# checkpoint it restored, how DDP started; the command's summary says what matters of them.
ROUTINE_LINES = re.compile(
    r"(GPU|TPU|HPU) available|Seed set to|`Trainer\.\w+` stopped|Restoring states from|Restored all states"
    r"|Loaded model weights from|LOCAL_RANK: |Initializing distributed|-+\ndistributed_backend="
)


def take_verbose(args: Any) -> tuple[Any, list[str]]:
    """The command's arguments (``args``, or the command line for None) without ``--verbose``,
    which sets the verbose variable instead, and their words."""
    words = list(sys.argv[1:] if args is None else args) if isinstance(args, list | None) else []
    if "--verbose" in words:
        words.remove("--verbose")
        os.environ[VERBOSE_VARIABLE] = "1"
        if args is None:
            sys.argv = [sys.argv[0], *words]
        else:
            args = words
    return args, words


def is_verbose() -> bool:
    return os.environ.get(VERBOSE_VARIABLE, "") not in ("", "0")


def quiet() -> None:
    """Leave out the lines and warnings that nothing follows from, unless verbose."""
    # wandb's copy of the console (the run's Logs tab) holds little but the progress bar, redrawn
    # four times a second, and each copied write costs the run time; WANDB_CONSOLE=wrap brings it back.
    os.environ.setdefault("WANDB_CONSOLE", "off")
    # The run's config.yaml is saved into its directory before any checkpoint or log, which is expected.
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty")
    # Deprecated calls made inside Lightning and torchdata, and Lightning's advertisement for its
    # cloud logger: nothing a user of this project can act on.
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    # Lightning's advice to raise num_workers, on a machine of many CPUs: in-memory arrays are
    # served fastest by the main process (framework/data/base.py), and image folders take one worker per CPU
    # but one by default.
    warnings.filterwarnings("ignore", message=r".*does not have many workers which may be a bottleneck")
    # Lightning's hint to use srun on any machine where Slurm is installed: scripts/slurm/train.sbatch
    # runs training under srun, and a command run outside it is meant to run there.
    warnings.filterwarnings(
        "ignore", message="The `srun` command is available on your system but is not used"
    )
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: "litlogger" not in record.getMessage()
    )

    def shown(record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or is_verbose() or not ROUTINE_LINES.search(record.getMessage())

    for name in ("rank_zero", "seed", "distributed"):
        for package in ("lightning.pytorch", "lightning.fabric"):
            logging.getLogger(f"{package}.utilities.{name}").addFilter(shown)
    logging.getLogger("lightning.pytorch.accelerators.cuda").addFilter(shown)


def quiet_evaluation() -> None:
    """Leave out, for a test, validate or predict, Lightning's warning that the checkpoint holds the
    state of callbacks this run lacks (a best checkpoint kept by another metric than this run's
    checkpoint.monitor): those commands restore no callback's state, so nothing is lost."""
    warnings.filterwarnings("ignore", message=r"Be aware that when using `ckpt_path`, callbacks used to")
