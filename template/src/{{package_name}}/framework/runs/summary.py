"""What a command ends with: the block of lines that says what the run gave, and where it went;
or, when it fails on an error a user can act on, one line.

Paths are shown as a shell would take them from where the command ran: relative when they are
below that directory, absolute otherwise. By default a command prints the progress bar, its
summary and warnings (``framework/utils/console.py`` says what ``--verbose`` adds).
"""

import errno
import shlex
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from ..data.tables import describe_missing
from ..errors import ConfigError
from ..utils.memory import is_out_of_memory


def shown(path: str | Path) -> str:
    """``path`` relative to the working directory where it is below it."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _rows(rows: dict[str, Any]) -> list[str]:
    width = max(len(name) for name in rows)
    return [f"  {name:<{width}}  {value}" for name, value in rows.items() if value is not None]


def _value(value: float | None) -> str | None:
    return None if value is None else f"{value:.4f}"


def fit_summary(
    line: dict[str, Any],
    package: str,
    parameters: int,
    network_input: dict[str, Any] | None = None,
    tested: bool = False,
) -> str:
    """The end of a fit, from its line in the experiment record; with the data settings that were
    taken from the network (``settings.use_network_input``), and the command that tests it unless
    ``tested``, where its test follows (``--test_after_fit``)."""
    parts = len(line["parts"])
    time = f"{line['wall_time_s']:.1f} s" + (f" in {parts} parts" if parts > 1 else "")
    best = line["best_checkpoint"]
    taken = ", ".join(f"{key} {value}" for key, value in (network_input or {}).items())
    rows = {
        "model": f"{line['model']}, {parameters:,} parameters",
        "input": f"the network's own {taken}" if taken else None,
        "missing values": line["missing_values"] and describe_missing(**line["missing_values"]),
        f"best {line['monitor']}": best and f"{_value(line['best_value'])} at epoch {line['best_epoch']}",
        "best checkpoint": shown(best) if best else None,
        "last checkpoint": shown(line["last_checkpoint"]) if line["last_checkpoint"] else None,
        "time": f"{time}, {_counted(line['epochs'], 'epoch')}, {_counted(line['steps'], 'step')}",
    }
    ended = "pruned: stopped early by the sweep's pruner" if line["status"] == "pruned" else "finished"
    lines = [f"Run {line['run_name']} {ended}.", *_rows(rows)]
    if (best or line["last_checkpoint"]) and not tested:
        test = ["python", "-m", package, "test", "--ckpt_path", shown(best or line["last_checkpoint"])]
        lines += ["Test it:", f"  {shlex.join(test)}"]
    return "\n".join(lines)


def _counted(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def evaluation_summary(stage: str, checkpoint: str | None, metrics: dict[str, Any], output_dir: Path) -> str:
    """The end of a test or validate: the checkpoint, its metrics and the directory of the outputs."""
    of = f" of {shown(checkpoint)}" if checkpoint else ""
    values = {name: _value(float(value)) for name, value in sorted(metrics.items())}
    return "\n".join([f"{stage.capitalize()}{of}:", *_rows({**values, "outputs": f"{shown(output_dir)}/"})])


def predict_summary(checkpoint: str | None, files: list[tuple[Path, int]], skipped: int = 0) -> str:
    """The end of a predict: the checkpoint, each file written and its number of rows, and the
    unreadable inputs left out."""
    of = f" of {shown(checkpoint)}" if checkpoint else ""
    rows = {shown(path): f"{count:,} row{'' if count == 1 else 's'}" for path, count in files}
    if skipped:
        rows["skipped"] = f"{skipped:,} unreadable input{'s' if skipped > 1 else ''}"
    return "\n".join([f"Predictions{of}:", *_rows(rows)])


def failure_line(error: BaseException, run: bool) -> str | None:
    """The one line a command ends with on ``error``, or None for a traceback."""
    if isinstance(error, ConfigError | FloatingPointError | MisconfigurationException):
        return f"error: {error}"
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return f"error: {error.strerror}"
    if isinstance(error, RuntimeError) and run and is_out_of_memory(error):
        # OutOfMemoryReport has printed where and what to change, and saved what it could.
        return f"error: out of memory ({str(error).splitlines()[0]})"
    if isinstance(error, RuntimeError) and run and _is_collective_timeout(error):
        return (
            "error: a DDP process waited longer than --ddp_timeout_s for the others in a collective "
            f"operation; one is stuck or gone ({str(error).splitlines()[0]})"
        )
    return None


def _is_collective_timeout(error: RuntimeError) -> bool:
    """Whether a collective operation failed because a process waited too long, here or in another
    process (which then closes or resets the connections)."""
    text = str(error).lower()
    signs = ("timed out", "timeout", "connection reset by peer", "connection closed by peer")
    return isinstance(error, torch.distributed.DistError) or any(sign in text for sign in signs)
