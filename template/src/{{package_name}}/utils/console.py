"""What a command prints besides its summary: ``--verbose``, or ``<PACKAGE>_VERBOSE=1``, brings back
Lightning's information lines, its model summary and metrics tables, and wandb's lines."""

import os

# Set by --verbose, and seen by the processes a command starts (DDP's, wandb's) too.
VERBOSE_VARIABLE = f"{__package__.split('.')[0].upper()}_VERBOSE"


def is_verbose() -> bool:
    return os.environ.get(VERBOSE_VARIABLE, "") not in ("", "0")
