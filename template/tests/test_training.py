"""The training presets take effect: seeding, mixed precision, clipping and accumulation."""

import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.plugins.precision import MixedPrecision


def _weights(cli) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in cli.model.state_dict().items()}


def test_same_seed_gives_identical_weights(run):
    first = _weights(run("fit", "--run_name=a"))
    second = _weights(run("fit", "--run_name=b"))
    other_seed = _weights(run("fit", "--run_name=c", "--seed_everything=7"))
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert not all(torch.equal(first[name], other_seed[name]) for name in first)


def test_bf16_mixed_trains_on_cpu(run):
    cli = run("fit", "--trainer.precision=bf16-mixed")
    plugin = cli.trainer.precision_plugin
    assert isinstance(plugin, MixedPrecision) and plugin.precision == "bf16-mixed"
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss_epoch"])
    assert cli.trainer.callback_metrics["val/acc"] > 0.1


class GradientNorms(Callback):
    """Records the total gradient norm before clipping and after the optimizer step that used it."""

    def __init__(self) -> None:
        self.before_clipping: list[float] = []
        self.stepped_with: list[float] = []

    @staticmethod
    def _norm(module) -> float:
        return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in module.parameters()])).item()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.before_clipping.append(self._norm(pl_module))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # Gradients are zeroed only at the start of the next step, so these are the ones applied.
        self.stepped_with.append(self._norm(pl_module))


def test_gradient_clipping_bounds_the_norm(build):
    cli = build("--trainer.gradient_clip_val=0.05")
    norms = GradientNorms()
    cli.trainer.callbacks.append(norms)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert len(norms.stepped_with) == len(norms.before_clipping) == cli.trainer.global_step > 0
    assert max(norms.before_clipping) > 0.05
    assert max(norms.stepped_with) <= 0.05 * (1 + 1e-4)


def test_gradient_accumulation_steps_every_k_batches(run):
    plain = run("fit", "--run_name=plain")
    accumulated = run("fit", "--run_name=accumulated", "--trainer.accumulate_grad_batches=2")
    batches = plain.trainer.num_training_batches * 2
    assert plain.trainer.global_step == batches
    assert accumulated.trainer.global_step == batches // 2
    scheduler = accumulated.trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.last_epoch == accumulated.trainer.global_step


def test_linear_scaling_rule_follows_the_effective_batch_size(run):
    # smoke config: batch 16, accumulation 2, one process -> effective batch 32 = half of 64.
    cli = run(
        "fit",
        "--model.init_args.scale_lr=true",
        "--model.init_args.base_batch_size=64",
        "--model.init_args.lr=0.004",
        "--trainer.accumulate_grad_batches=2",
    )
    assert cli.model.effective_batch_size == 32
    assert cli.trainer.optimizers[0].param_groups[0]["initial_lr"] == pytest.approx(0.002)
