"""Out-of-memory triage: where a run ran out, how much it used, what to change, and a last save."""

import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn

GIB = 2**30


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA's ``OutOfMemoryError``, or the ``RuntimeError`` that the CPU and MPS allocators raise."""
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError)
        and any(text in str(error) for text in ("can't allocate", "out of memory"))
    )


class OutOfMemoryReport(Callback):
    """When a run runs out of memory, prints (and writes to ``out-of-memory.txt`` in the run
    directory, ``out-of-memory-rank<N>.txt`` under DDP) the stage and batch that failed, the peak
    memory, the allocator's summary on a GPU, and what to change, with this run's values. During
    ``fit`` on one process it also saves the weights as they were to ``out-of-memory.ckpt``, for
    a new run to start from with ``--weights``; ``last.ckpt`` stays the state to resume exactly.
    The CLI then exits with status 1.
    """

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if not is_out_of_memory(exception):
            return
        directory = Path(trainer.default_root_dir)
        lines = [f"Out of memory: {_where(trainer)} on {trainer.strategy.root_device}.", _peak(trainer)]
        if trainer.strategy.root_device.type == "cuda":
            lines.append(torch.cuda.memory_summary(trainer.strategy.root_device, abbreviated=True))
        lines += ["What to try, in this order:", *(f"- {advice}" for advice in _advice(trainer))]
        if trainer.state.fn == TrainerFn.FITTING and trainer.world_size == 1:
            saved = directory / "out-of-memory.ckpt"
            trainer.save_checkpoint(saved, weights_only=True)
            lines.append(
                f"Saved {saved}: the weights when memory ran out; start a new run from them with "
                f"--weights {saved}. {directory / 'last.ckpt'} stays the state to resume exactly."
            )
        # Under DDP, each process that runs out reports for itself.
        path = directory / (
            "out-of-memory.txt" if trainer.world_size == 1 else f"out-of-memory-rank{trainer.global_rank}.txt"
        )
        directory.mkdir(parents=True, exist_ok=True)
        lines.append(f"This report: {path}")
        report = "\n".join(lines)
        path.write_text(report + "\n")
        print(report, file=sys.stderr)


def _where(trainer: Trainer) -> str:
    stage = trainer.state.stage.value if trainer.state.stage else trainer.state.fn.value
    if trainer.training:
        batch = trainer.fit_loop.epoch_loop.batch_idx
        return f"{stage}, epoch {trainer.current_epoch}, batch {batch}, step {trainer.global_step}"
    return f"{stage}, epoch {trainer.current_epoch}"


def _peak(trainer: Trainer) -> str:
    device = trainer.strategy.root_device
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return (
            f"Peak memory: {torch.cuda.max_memory_allocated(device) / GIB:.2f} GiB allocated by tensors, "
            f"{torch.cuda.max_memory_reserved(device) / GIB:.2f} GiB reserved by the allocator, "
            f"of {total / GIB:.2f} GiB on the device."
        )
    if sys.platform == "win32":
        return "Peak memory: not measured on Windows."
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return f"Peak memory: {peak / (GIB if sys.platform == 'darwin' else 2**20):.2f} GiB resident (process)."


def _advice(trainer: Trainer) -> list[str]:
    batch_size = getattr(trainer.datamodule, "batch_size", None)
    accumulate = trainer.accumulate_grad_batches
    on_gpu = trainer.strategy.root_device.type == "cuda"
    fitting = trainer.state.fn == TrainerFn.FITTING
    advice = []
    if batch_size and batch_size > 1 and fitting:
        advice.append(
            f"a smaller batch: --data.init_args.batch_size={batch_size // 2} (now {batch_size}), with "
            f"--trainer.accumulate_grad_batches={accumulate * 2} to keep the effective batch size;"
        )
    elif batch_size and batch_size > 1:
        advice.append(
            f"a smaller batch (now {batch_size}): evaluation takes the data settings from the "
            "checkpoint, so pass the run's config and the checkpoint as weights: --config "
            "checkpoints/<run>/config.yaml --weights <checkpoint> "
            f"--data.init_args.batch_size={batch_size // 2};"
        )
    if on_gpu and "32" in str(trainer.precision):
        mixed = "bf16-mixed" if torch.cuda.is_bf16_supported(including_emulation=False) else "16-mixed"
        advice.append(
            f"mixed precision: --trainer.precision={mixed} (now {trainer.precision}) keeps activations "
            "in half the memory;"
        )
    if fitting:
        advice.append(
            "activation checkpointing: wrap the network's blocks in torch.utils.checkpoint.checkpoint "
            "in its forward, so backward recomputes their activations instead of keeping them;"
        )
    advice.append(
        "tensors kept alive between steps: outputs or losses gathered in a list keep their memory "
        "(call .item() or .detach().cpu() first); torch.cuda.empty_cache() frees none of it."
    )
    return advice
