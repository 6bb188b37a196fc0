"""The recipes of docs/recipes/ work as their pages say: a project generated with the package
``my_project`` gets every file of every page (each fenced code block titled with its path), and
the pages' commands run in it through ``python``, as a user types them, with fewer epochs where
the page's numbers do not depend on them.

- autoencoder: fit, test and predict of the best checkpoint (one code per test sample), and a fit
  on two CPU processes;
- GAN (two optimizers, stepped by hand): fit, test, predict (one generated image per test
  sample), a run killed with SIGKILL mid-epoch that ``fit --ckpt_path last`` resumes to the
  weights of a run never stopped, bit for bit, and a fit on two CPU processes;
- sequence model: the page's fit in full, whose test RMSE beats both baselines that
  scripts/sequence_baselines.py computes on the same test years, predict, and a fit on two CPU
  processes.
"""

import csv
import json
import math
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, copy_template, run_python

pytestmark = pytest.mark.slow

RECIPES = ROOT / "docs" / "recipes"
PAGES = ("autoencoder", "gan", "sequence")
FILE_BLOCK = re.compile(r'^```\w+ title="(?P<path>[^"]+)"\n(?P<code>.*?)^```$', re.MULTILINE | re.DOTALL)
BASH_BLOCK = re.compile(r"^```bash\n(?P<lines>.*?)^```$", re.MULTILINE | re.DOTALL)
# A run takes 10-20 s here, the sequence model's full fit about a minute: past these it has hung.
LIMIT_S = 300
FULL_FIT_LIMIT_S = 900
SHORT = "--trainer.max_epochs=2"
TEST_SAMPLES = 270  # the digits' test split: 15 % of 1,797 samples, rounded up
TEST_YEARS = 44  # the sunspot windows' test split: the last 15 % of 289, rounded up
INTERRUPT = textwrap.dedent(
    """
    import os
    import signal

    from lightning.pytorch import Callback


    class Interrupt(Callback):
        def __init__(self, step: int) -> None:
            self.step = step

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if trainer.global_step == self.step:
                os.kill(os.getpid(), signal.SIGKILL)
    """
)


def page_files(page: str) -> dict[str, str]:
    """Each file the page holds, by its path in the project."""
    text = (RECIPES / f"{page}.md").read_text()
    return {match["path"]: match["code"] for match in FILE_BLOCK.finditer(text)}


def page_commands(page: str) -> list[list[str]]:
    """Each ``python ...`` command of the page's bash blocks, in order, as arguments of Python."""
    text = (RECIPES / f"{page}.md").read_text()
    lines = [line for block in BASH_BLOCK.finditer(text) for line in block["lines"].splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith("python ")]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A generated project with every recipe's files written in, and the test's interrupting callback."""
    project = copy_template(tmp_path_factory.mktemp("recipes") / "project", project_name="My Project")
    for page in PAGES:
        for path, code in page_files(page).items():
            (project / path).parent.mkdir(parents=True, exist_ok=True)
            (project / path).write_text(code)
    (project / "src" / "interrupt.py").write_text(INTERRUPT)
    return project


def run(project: Path, *args: str, limit_s: float = LIMIT_S) -> subprocess.CompletedProcess:
    result = run_python(project, *args, timeout=limit_s)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def summary_value(printed: str, metric: str) -> float:
    """A metric as a run's summary prints it: ``  test/rmse  15.6``, ``  best val/rmse  16.0 at epoch 44``."""
    (value,) = re.findall(rf"^  (?:best )?{re.escape(metric)} +(\S+)", printed, re.MULTILINE)
    return float(value)


def predictions(project: Path, run_name: str, name: str = "predictions.csv") -> Path:
    (path,) = (project / "checkpoints" / run_name).glob(f"predict-*/{name}")
    return path


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


def last_checkpoint(project: Path, run_name: str) -> dict:
    checkpoint = project / "checkpoints" / run_name / "last.ckpt"
    return torch.load(checkpoint, map_location="cpu", weights_only=False)


def test_the_pages_files_are_lint_clean(project):
    paths = [path for page in PAGES for path in page_files(page)]
    python = [path for path in paths if path.endswith(".py")]
    assert len(python) == 5  # two modules, a data module, a model and a script
    for command in (["check"], ["format", "--check"]):
        ruff = [sys.executable, "-m", "ruff", *command, "--no-cache", *python]
        result = subprocess.run(ruff, cwd=project, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_autoencoder_predicts_a_code_per_test_sample(project):
    fit, test, predict, ddp = page_commands("autoencoder")
    run(project, *fit, SHORT)
    assert math.isfinite(summary_value(run(project, *test).stdout, "test/loss"))
    run(project, *predict)
    rows = read_rows(predictions(project, "autoencoder"))
    assert [int(row["index"]) for row in rows] == list(range(TEST_SAMPLES))
    codes = [f"code{n}" for n in range(8)]
    assert list(rows[0])[-8:] == codes
    assert all(math.isfinite(float(row[code])) for row in rows for code in codes)

    assert "configs/trainer/ddp_cpu.yaml" in ddp
    assert math.isfinite(summary_value(run(project, *ddp, "--trainer.max_epochs=1").stdout, "val/loss"))


def test_the_gan_tests_predicts_and_resumes_to_the_same_weights(project):
    fit, test, predict, resume, ddp = page_commands("gan")
    run(project, *fit, SHORT)
    assert math.isfinite(summary_value(run(project, *test).stdout, "test/moment_gap"))
    run(project, *predict)
    samples = np.load(predictions(project, "gan", "predictions-sample.npy"))
    assert samples.shape == (TEST_SAMPLES, 8, 8) and ((samples >= 0) & (samples <= 1)).all()

    # 20 batches an epoch, two optimizer steps each: killed 8 batches into the second epoch, after
    # the save of last.ckpt at step 50 (5 batches in).
    saving = [SHORT, "--last_checkpoint.every_n_train_steps=10"]
    run(project, *fit, *saving, "--run_name=gan-uninterrupted")
    interrupt = {"class_path": "interrupt.Interrupt", "init_args": {"step": 56}}
    killing = f"--trainer.callbacks+={json.dumps(interrupt)}"
    killed = run_python(project, *fit, *saving, "--run_name=gan-killed", killing, timeout=LIMIT_S)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    saved = last_checkpoint(project, "gan-killed")
    assert (saved["global_step"], saved["epoch"]) == (50, 1)
    assert "--ckpt_path" in resume
    run(project, *resume, *saving, "--run_name=gan-killed")  # the page's command, for the killed run
    expected = last_checkpoint(project, "gan-uninterrupted")["state_dict"]
    actual = last_checkpoint(project, "gan-killed")["state_dict"]
    assert actual.keys() == expected.keys()
    assert [name for name in expected if not torch.equal(actual[name], expected[name])] == []

    assert "configs/trainer/ddp_cpu.yaml" in ddp
    gap = summary_value(run(project, *ddp, "--trainer.max_epochs=1").stdout, "val/moment_gap")
    assert math.isfinite(gap)


def test_the_sequence_model_beats_persistence_and_a_linear_autoregression(project):
    fit, test, predict, baselines, ddp = page_commands("sequence")
    run(project, *fit, limit_s=FULL_FIT_LIMIT_S)  # in full: the numbers are the point
    gru = summary_value(run(project, *test).stdout, "test/rmse")
    printed = run(project, *baselines).stdout
    assert re.search(rf"^test windows +{TEST_YEARS}$", printed, re.MULTILINE), printed
    persistence, autoregression = (
        float(re.search(rf"^{baseline} test/rmse +(\S+)$", printed, re.MULTILINE)[1])
        for baseline in ("persistence", "linear AR")
    )
    assert gru < autoregression and gru < persistence, (gru, autoregression, persistence)

    run(project, *predict)
    rows = read_rows(predictions(project, "sequence"))
    assert len(rows) == TEST_YEARS and list(rows[0])[-2:] == ["target", "output"]

    assert "configs/trainer/ddp_cpu.yaml" in ddp
    assert math.isfinite(summary_value(run(project, *ddp, "--trainer.max_epochs=1").stdout, "val/rmse"))
