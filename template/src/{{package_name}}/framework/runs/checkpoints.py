"""Checkpoints that resume exactly, are never left half-written, and load with clear errors.

- ``LastCheckpoint`` writes ``last.ckpt`` at the end of every epoch, every N steps if asked,
  and when the run receives SIGTERM or Ctrl-C, with the random number generators' states in it.
- ``AtomicCheckpointIO`` writes every checkpoint to a temporary file, syncs it and renames it
  over the old one, so a kill during a save leaves the previous file intact.
- ``load_weights`` puts the weights of a checkpoint or a plain ``state_dict`` file into a model.
"""

import contextlib
import errno
import importlib
import importlib.util
import os
import random
import re
import shutil
import signal
import struct
import sys
import time
import zipfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jsonargparse.typing import NonNegativeInt, PositiveFloat
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import nn

from .interrupts import StopOnSignals, received_signal

# How a file that torch.save wrote starts: a zip archive's first record, or (its older format) a
# pickle of protocol 2 or later.
ZIP_START, PICKLE_START = b"PK\x03\x04", b"\x80"


def _is_disk_full(error: BaseException | None) -> bool:
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        error = error.__cause__ or error.__context__
    return False


def _finite(value: Any) -> bool:
    return (
        not isinstance(value, torch.Tensor) or not value.is_floating_point() or bool(value.isfinite().all())
    )


class AtomicCheckpointIO(TorchCheckpointIO):
    """Saves through a temporary file in the same directory: write, fsync, rename. Refuses to save
    weights or buffers (BatchNorm statistics too) that are not finite."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        path = Path(path)
        state = checkpoint.get("state_dict", {})
        broken = [name for name, value in state.items() if not _finite(value)]
        if broken:
            kept = "keeps its last good state" if path.is_file() else "was not saved"
            raise FloatingPointError(
                f"{', '.join(broken[:3])} {'is' if len(broken) == 1 else 'are'} not finite at step "
                f"{checkpoint.get('global_step')}: {path} {kept}. Lower model.init_args.lr, or set "
                "trainer.detect_anomaly=true to find the operation at fault"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.partial")
        try:
            with temporary.open("wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except (OSError, RuntimeError) as error:
            # torch reports a full disk as "unexpected pos" from its zip writer, with the OSError
            # only in the exception's context.
            if not _is_disk_full(error):
                raise
            temporary.unlink(missing_ok=True)
            free = shutil.disk_usage(path.parent).free
            raise OSError(
                errno.ENOSPC,
                f"no space left to save {path} ({free / 2**20:.1f} MiB free on its filesystem); the "
                "checkpoints saved before are intact",
            ) from None
        finally:
            temporary.unlink(missing_ok=True)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def rng_states() -> dict[str, Any]:
    """The states of every random number generator a training step draws from."""
    kind, keys, position, has_gauss, cached_gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached_gauss),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_states(states: dict[str, Any]) -> None:
    kind, keys, position, has_gauss, cached_gauss = states["numpy"]
    random.setstate(states["python"])
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached_gauss))
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


# How often DDP processes agree on whether a signal asked one of them to stop (LastCheckpoint).
AGREE_EVERY_S = 0.25
MAX_STEPS_BETWEEN_AGREEMENTS = 1000


class LastCheckpoint(Checkpoint):
    """Keeps ``<dirpath>/last.ckpt``, the state to resume from, exactly where training stands.

    It is saved after every training epoch (after validation), every ``every_n_train_steps``
    optimizer steps if that is above 0, and when SIGTERM or Ctrl-C stops the run: at the end of
    the optimizer step under way, or of the epoch if the signal comes during its last step or its
    validation (see ``framework/runs/interrupts.py``). Then one line says what was saved and how to resume.
    Every checkpoint of the run also carries the random number generators' states and the
    loggers' run ids, so that a resumed run draws the same dropout masks and continues the same
    logger runs. Weights that are no longer finite are never saved.
    (``ModelCheckpoint(save_last=True)`` would rewrite ``last.ckpt`` only when it also saves a
    best checkpoint.)

    Being a ``Checkpoint``, it runs after early stopping and the best-checkpoint callback, so the
    state it saves includes their decisions for the epoch.

    Args:
        dirpath: the run directory; the CLI sets it.
        every_n_train_steps: also save mid-epoch every this many optimizer steps (0: only at
            the end of each epoch and on SIGTERM or Ctrl-C).
        stop_within_s: after SIGTERM or Ctrl-C the run must reach the end of its step within this
            many seconds, or the process ends without saving: a step stuck in a collective
            operation would never end. Raise it for steps that take longer.
    """

    def __init__(
        self,
        dirpath: str | None = None,
        every_n_train_steps: NonNegativeInt = 0,
        stop_within_s: PositiveFloat = 60,
    ) -> None:
        self.dirpath = dirpath
        self.every_n_train_steps = every_n_train_steps
        self.stop_within_s = stop_within_s
        self.resume_command: str | None = None  # printed when a signal stops the run; the CLI sets it
        self.ddp_timeout: timedelta | None = None  # the longest the processes wait to agree (--ddp_timeout_s)
        self._saved: tuple[int, int] | None = None  # (step, epoch) of the last save of this process
        # From on_train_start on: ddp_spawn pickles the callbacks before, which these would defeat.
        self._signals: StopOnSignals | None = None
        self._flags_group: Any = None
        self._next_agreement = 0  # the step at which the DDP processes next agree on a signal
        self._last_agreement = (0, 0.0)  # the step and time of their last agreement

    @property
    def path(self) -> Path:
        return Path(self.dirpath or ".") / "last.ckpt"

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Lightning's own SIGTERM handling stops each DDP process where it sees the flag, and
        # processes signalled a moment apart then stop at different steps and wait for each
        # other forever. Here a signal is only noted, and the processes agree on it (below).
        def end_other_processes() -> None:
            if trainer.strategy.launcher is not None:
                trainer.strategy.launcher.kill(signal.SIGKILL)

        self._signals = StopOnSignals(end_other_processes, trainer.is_global_zero, self.stop_within_s)
        self._signals.start()
        # The processes agree on stopping in a group of their own, through the CPU (gloo): no step
        # waits for a GPU, and no collective of the run's own can pair up with this one.
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            self._flags_group = torch.distributed.new_group(backend="gloo", timeout=self.ddp_timeout)
        self._next_agreement = trainer.global_step
        self._last_agreement = (trainer.global_step, time.monotonic())
        if trainer.ckpt_path and trainer.is_global_zero:
            self._remove_later_best(trainer)

    def _remove_later_best(self, trainer: Trainer) -> None:
        """Remove the best checkpoints saved after the state this run resumes from.

        A run killed between saving a best checkpoint and ``last.ckpt`` resumes from a state
        that does not know that checkpoint; the resumed run decides again which epochs are
        best, and would otherwise leave the earlier decision's file beside its own.
        """
        for best in trainer.checkpoint_callbacks:
            if not isinstance(best, ModelCheckpoint) or best.dirpath is None:
                continue
            known = {Path(path).resolve() for path in best.best_k_models}
            prefix = (best.filename or "").split("{", 1)[0]
            for path in Path(best.dirpath).glob(f"{prefix}*{best.FILE_EXTENSION}"):
                if path.resolve() in known or path.resolve() == self.path.resolve():
                    continue
                with contextlib.suppress(ValueError):  # an unreadable file is left for the user
                    if read_checkpoint(path).get("global_step", 0) > trainer.global_step:
                        path.unlink()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stop_handling_signals()

    def _stop_handling_signals(self) -> None:
        if self._signals is not None:
            self._signals.stop()
            self._signals = None

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # A state saved inside a gradient-accumulation window would lose the gradients gathered
        # so far, so saves happen only right after an optimizer step; so do stops, and an epoch's
        # last step leaves the stop to the epoch's end, after validation and its own save.
        if self._signals is not None:
            self._signals.alive()
        after_step = (batch_idx + 1) % trainer.accumulate_grad_batches == 0
        if not after_step or trainer.fit_loop.epoch_loop.done:
            return
        if self._stop_requested(trainer, epoch_end=False):
            raise SIGTERMException
        steps = self.every_n_train_steps
        if steps and trainer.global_step % steps == 0:
            self._save(trainer, pl_module)

    def on_validation_batch_end(self, *args: Any) -> None:
        if self._signals is not None:
            self._signals.alive()

    def _stop_requested(self, trainer: Trainer, epoch_end: bool) -> bool:
        """Whether a signal asked this process, or under DDP any process, to stop.

        DDP processes agree on it in a collective operation, which waits for the slowest of them:
        after every step, that cost more than the step itself on 2 busy CPU cores. They agree at
        each epoch's end and at steps about ``AGREE_EVERY_S`` apart, the next one chosen at the
        last agreement from the slowest process's pace; at the other steps this is False.
        """
        requested = self._signals is not None and self._signals.requested
        if trainer.world_size == 1:
            return requested
        step = trainer.global_step
        if step < self._next_agreement and not epoch_end:
            return False
        last_step, last_time = self._last_agreement
        pace = max(step - last_step, 1) / max(time.monotonic() - last_time, 1e-6)  # steps a second
        steps_until_next = min(max(int(AGREE_EVERY_S * pace), 1), MAX_STEPS_BETWEEN_AGREEMENTS)
        # One operation for both: any process's request, and the fewest steps any proposes.
        flags = torch.tensor([int(requested), -steps_until_next])
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX, group=self._flags_group)
        self._next_agreement = step - int(flags[1])
        self._last_agreement = (step, time.monotonic())
        return bool(flags[0])

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._save(trainer, pl_module)
        if self._stop_requested(trainer, epoch_end=True):
            raise SIGTERMException

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException):
            self._stop_on_signal(trainer, pl_module)
        self._stop_handling_signals()

    def _stop_on_signal(self, trainer: Trainer, pl_module: LightningModule) -> None:
        name = getattr(received_signal(), "name", "SIGTERM")
        if self._signals is None:  # Lightning's own handler, before training started
            message = f"interrupted by {name} before training started; nothing was saved"
        else:
            self._signals.acknowledge()  # stopping now; the save may take its time
            if self._saved != (trainer.global_step, trainer.current_epoch):
                self._save(trainer, pl_module)
            where = f"at step {trainer.global_step} (epoch {trainer.current_epoch})"
            message = f"interrupted by {name} {where}: saved {self.path}"
            if self.resume_command:
                message += f"; resume with: {self.resume_command}"
        if trainer.is_global_zero:
            print(message, file=sys.stderr, flush=True)

    def _save(self, trainer: Trainer, pl_module: LightningModule) -> None:
        trainer.save_checkpoint(self.path, weights_only=False)
        self._saved = (trainer.global_step, trainer.current_epoch)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        checkpoint["rng_states"] = rng_states()
        checkpoint["logger_versions"] = {type(logger).__name__: logger.version for logger in trainer.loggers}

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        self._saved = (checkpoint["global_step"], checkpoint["epoch"])
        if "rng_states" in checkpoint:
            set_rng_states(checkpoint["rng_states"])


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint or weights file on the CPU, tensors only (no code runs), with errors naming
    the file: ``torch.save``'s format, or safetensors' for a file named ``*.safetensors``."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder, not a file")
    if not path.is_file():
        raise FileNotFoundError(f"no such checkpoint {path}")
    if path.stat().st_size == 0:
        raise ValueError(f"{path} is empty")
    if path.suffix == ".safetensors":
        return _read_safetensors(path)
    archive = zipfile.is_zipfile(path)  # torch.save's format; older files are read whole
    with path.open("rb") as file:
        start = file.read(len(ZIP_START))
    try:
        if archive:
            _check_archive(path)
        elif ZIP_START.startswith(start) or start.startswith(ZIP_START):
            raise ValueError(
                "it is truncated: it ends before the directory of its records, which a zip ends with"
            )
        elif not start.startswith(PICKLE_START):
            raise ValueError("it is not a file that torch.save or safetensors wrote")
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=archive)
        if archive:
            _check_record_sizes(path, checkpoint)
    except Exception as error:
        raise ValueError(
            f"{path} is not a readable checkpoint (corrupt, truncated, or a pickled object, which "
            f"weights-only loading refuses to run): {_first_line(error)}"
        ) from None
    if not isinstance(checkpoint, dict):
        raise ValueError(f"{path} holds a {type(checkpoint).__name__}, not a checkpoint or state_dict")
    return checkpoint


def _first_line(error: Exception) -> str:
    """An error's first line, without terminal colour codes (torch's messages can span many lines
    and have them); an error without a message, as the ``EOFError`` of a file cut short, by its type."""
    if isinstance(error, EOFError | IndexError | struct.error):  # torch.save's older format, cut short
        return "it is truncated"
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    # torch's advice here is to load without weights_only, which would run the file's code.
    if refused := re.search(r"Unsupported global: GLOBAL (\S+)", text):
        return f"it names {refused[1]}, code that weights-only loading does not run"
    lines = text.strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _read_safetensors(path: Path) -> dict[str, Any]:
    """A safetensors file's tensors: a format of tensors alone, which holds no code to refuse."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise ValueError(
            f"{path} is a safetensors file; reading it needs safetensors: pip install safetensors"
        ) from None
    try:
        return load_file(path)
    except Exception as error:
        raise ValueError(
            f"{path} is not a readable safetensors file (corrupt or truncated): {_first_line(error)}"
        ) from None


def _check_archive(path: Path) -> None:
    """Check every record of a zip-format checkpoint against its checksum, after refusing one cut
    short and one that would inflate to more than it holds (torch.save stores records uncompressed)."""
    size = path.stat().st_size
    with zipfile.ZipFile(path) as archive:
        records = archive.infolist()
        # A file cut short at its start, or in its middle, keeps the directory at its end, which
        # then places records before the file's start; reading them fails with "Invalid argument".
        outside = [
            record for record in records if not 0 <= record.header_offset <= size - record.compress_size
        ]
        if outside:
            raise ValueError(
                f"it is truncated: {len(outside)} of its {len(records)} records lie outside the file"
            )
        inflated = sum(record.file_size for record in records)
        if inflated > size + 2**20:
            raise ValueError(f"its records would inflate to {inflated} bytes; torch.save compresses none")
        broken = archive.testzip()
    if broken is not None:
        raise ValueError(f"its record {broken} does not match its checksum")


def _check_record_sizes(path: Path, checkpoint: Any) -> None:
    """Check that the tensor records of a zip-format checkpoint hold the bytes its tensors need.

    A memory-mapped load takes each tensor's bytes from where its record starts, without checking
    the record's length: a record cut short, its checksum rewritten, would load the bytes of the
    records after it, and only the Trainer's own load, later, would fail.
    """
    storages: dict[int, int] = {}

    def collect(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, list | tuple | set):
            for item in value:
                collect(item)

    collect(checkpoint)
    with zipfile.ZipFile(path) as archive:
        records = archive.infolist()
    held = [record.file_size for record in records if re.search(r"/data/\d+$", record.filename)]
    needed = [size for size in storages.values() if size]
    if sorted(needed) != sorted(size for size in held if size):
        raise ValueError(
            f"its tensor records hold {sum(held)} bytes, but its tensors need {sum(needed)}: a record "
            "was cut short or padded"
        )


def check_made_here(checkpoint: dict[str, Any], path: str | Path) -> None:
    """Refuse a Lightning checkpoint of another project: one whose model or data class is in a
    package not installed here. Found without importing anything: the command line would fail to
    import the class, over many lines, and Lightning's loader refuses a class not imported."""
    package = __name__.partition(".")[0]
    for key, kind in (("hyper_parameters", "model"), ("datamodule_hyper_parameters", "data")):
        hyper_parameters = checkpoint.get(key)
        class_path = hyper_parameters.get("_class_path") if isinstance(hyper_parameters, dict) else None
        if not isinstance(class_path, str) or not class_path:
            continue
        top = class_path.partition(".")[0]
        if top != package and (not top.isidentifier() or importlib.util.find_spec(top) is None):
            raise ValueError(
                f"{path} was made by another project, {top} (its {kind} is {class_path}), which is not "
                "installed here: use it in that project"
            )


def load_weights(model: LightningModule, path: str | Path) -> None:
    """Load weights into ``model`` from a Lightning checkpoint, or from a plain ``state_dict`` file
    of the model or of its network (as saved by a hand-written loop), with or without the
    ``module.`` prefix that DataParallel and DDP wrappers add.
    """
    checkpoint = read_checkpoint(path)
    state = checkpoint.get("state_dict", checkpoint)
    state = {key.removeprefix("module."): value for key, value in state.items()}
    network = getattr(model, "network", None)
    candidates: list[nn.Module] = [model, *([network] if isinstance(network, nn.Module) else [])]
    # Weights saved before the model carried its preprocessing: the model keeps its own.
    preprocessing = {key: value for key, value in model.state_dict().items() if key.startswith("preprocess.")}
    if any(key.startswith("preprocess.") for key in state):
        preprocessing = {}
    for target in candidates:
        expected = target.state_dict()
        given = state | preprocessing if target is model else state
        if given.keys() == expected.keys():
            wrong = [
                f"{key}: {tuple(value.shape)} in the file, {tuple(expected[key].shape)} in the model"
                for key, value in given.items()
                if not key.startswith("preprocess.") and value.shape != expected[key].shape
            ]
            if wrong:
                raise ValueError(f"{path} does not fit this model; shapes differ: " + "; ".join(wrong[:5]))
            target.load_state_dict(given)
            return
    missing = sorted(model.state_dict().keys() - state.keys())[:5]
    unexpected = sorted(state.keys() - model.state_dict().keys())[:5]
    raise ValueError(
        f"{path} holds no weights for this model: it lacks {missing} and has {unexpected} "
        "(the first few names of each)"
    )
