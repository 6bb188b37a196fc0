"""The whole flow on a tiny subset: fit, validate, checkpoint, resume, test, predict."""

import csv
import json
from pathlib import Path

import pytest
import torch


def test_fit_validate_resume_test_predict(run, tmp_path):
    fit = run("fit", "--run_name=smoke")
    run_dir = tmp_path / "checkpoints" / "smoke"
    best = Path(fit.trainer.checkpoint_callback.best_model_path)
    assert best.parent == run_dir and best.name.startswith("best-epoch=")
    assert "max_epochs: 2" in (run_dir / "config.yaml").read_text()

    validate = run("validate", f"--ckpt_path={best}")
    assert 0.0 <= validate.trainer.callback_metrics["val/acc"] <= 1.0

    steps_per_epoch = fit.trainer.global_step // 2
    last = run_dir / "last.ckpt"
    resumed = run("fit", "--run_name=smoke-resumed", f"--ckpt_path={last}", "--trainer.max_epochs=3")
    assert resumed.trainer.current_epoch == 3
    assert resumed.trainer.global_step == 3 * steps_per_epoch

    test = run("test", f"--ckpt_path={best}")
    assert 0.0 <= test.trainer.callback_metrics["test/acc"] <= 1.0

    run("predict", f"--ckpt_path={best}")
    [predictions] = run_dir.glob("predict-*/predictions.csv")
    rows = list(csv.DictReader(predictions.open()))
    assert len(rows) == len(test.datamodule.splits["test"])
    probabilities = torch.tensor([[float(row[f"prob_{c}"]) for c in range(10)] for row in rows])
    torch.testing.assert_close(probabilities.sum(dim=1), torch.ones(len(rows)), atol=1e-4, rtol=0)


def test_evaluation_loss_is_the_mean_over_samples(run, tmp_path):
    run("fit", "--run_name=mean", "--data.init_args.batch_size=24")
    validate = run("validate", f"--ckpt_path={tmp_path / 'checkpoints' / 'mean' / 'last.ckpt'}")
    # 64 samples in batches of 24, 24 and 16, so the mean of the batches' means would differ.
    assert validate.datamodule.batch_size == 24
    features, labels = validate.datamodule.splits["val"].tensors
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(validate.model.eval()(features), labels)
    assert float(validate.trainer.callback_metrics["val/loss"]) == pytest.approx(float(expected), rel=1e-6)


def test_experiment_record(run, tmp_path):
    fit = run("fit", "--run_name=recorded")
    run("test", f"--ckpt_path={fit.trainer.checkpoint_callback.best_model_path}")
    lines = (tmp_path / "experiments.jsonl").read_text().splitlines()
    fit_line, test_line = (json.loads(line) for line in lines)

    assert fit_line["stage"] == "fit" and fit_line["run_name"] == "recorded"
    assert (fit_line["model"], fit_line["dataset"], fit_line["seed"]) == ("MLP", "DigitsDataModule", 42)
    assert fit_line["hparams"]["batch_size"] == 16 and fit_line["hparams"]["max_epochs"] == 2
    assert fit_line["monitor"] == "val/acc"
    assert fit_line["best_value"] == round(float(fit.trainer.checkpoint_callback.best_model_score), 6)
    assert fit_line["best_epoch"] in (0, 1)
    assert f"best-epoch={fit_line['best_epoch']:03d}" in fit_line["best_checkpoint"]
    assert Path(fit_line["last_checkpoint"]).is_file()
    assert fit_line["wall_time_s"] > 0
    assert fit_line["effective_batch_size"] == 16

    assert test_line["stage"] == "test" and test_line["run_name"] == "recorded"
    assert set(test_line["test"]) >= {"test/acc", "test/f1", "test/loss"}


def test_a_run_name_in_use_is_refused_and_its_files_kept(run, capsys, tmp_path):
    run("fit", "--run_name=taken")
    run_dir = tmp_path / "checkpoints" / "taken"
    before = {path.name: path.stat().st_mtime_ns for path in run_dir.iterdir()}
    with pytest.raises(SystemExit):
        run("fit", "--run_name=taken")
    assert "checkpoints/taken already holds a run: resume it with --ckpt_path" in capsys.readouterr().err
    assert {path.name: path.stat().st_mtime_ns for path in run_dir.iterdir()} == before


def test_a_run_that_failed_before_its_first_checkpoint_is_not_offered_for_resuming(run, capsys, tmp_path):
    run_dir = tmp_path / "checkpoints" / "failed"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("seed_everything: 42\n")
    with pytest.raises(SystemExit):
        run("fit", "--run_name=failed")
    error = capsys.readouterr().err
    assert "checkpoints/failed already holds a run that saved no checkpoint; choose another" in error
    assert "--ckpt_path" not in error


def test_last_checkpoint_is_the_end_of_the_latest_epoch(run, tmp_path):
    # Monitoring for the lowest epoch number makes the first epoch the best; last.ckpt must not follow it.
    first_is_best = ["--checkpoint.monitor=epoch", "--checkpoint.mode=min"]
    fit = run("fit", "--run_name=latest", *first_is_best, "--trainer.max_epochs=3")
    last = torch.load(
        tmp_path / "checkpoints" / "latest" / "last.ckpt", map_location="cpu", weights_only=True
    )
    assert (last["epoch"], last["global_step"]) == (2, fit.trainer.global_step)
    best = torch.load(fit.trainer.checkpoint_callback.best_model_path, map_location="cpu", weights_only=True)
    assert best["global_step"] < last["global_step"]


@pytest.mark.parametrize("subcommand", ["validate", "test", "predict"])
def test_evaluation_needs_an_existing_checkpoint(run, capsys, tmp_path, subcommand):
    with pytest.raises(SystemExit):
        run(subcommand)
    assert "needs --ckpt_path" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run(subcommand, "--ckpt_path=checkpoints/absent/last.ckpt")
    assert "no such checkpoint checkpoints/absent/last.ckpt" in capsys.readouterr().err
    assert not (tmp_path / "checkpoints").exists()
